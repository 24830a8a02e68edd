//! Memory mapped for the controller, unmapped on drop, the controller
//! object it was mapped for, and payloads: ranges of it that commands
//! move.
#![allow(unsafe_code)]

use std::{fmt, marker::PhantomData, sync::Arc};

use super::revoke::Made;
use crate::{
    memory::{
        peer::{DmaMapping, PeerAccess},
        DeviceMemory,
    },
    nvme::{DataPtr, Segments},
    Error, Module, PciAddress, Result,
};

/// One controller object: the PCI function, and which of the controllers
/// this process set up on it. Mappings are made for one and are refused by
/// any other, a later one on the same function included (its memory may
/// have been revoked and the function reset in between).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Instance {
    pub(crate) pci: PciAddress,
    pub(crate) id: u64,
}

impl Instance {
    /// Why a payload mapped for `other` may not be used by this one.
    pub(crate) fn refuses(&self, other: &Instance) -> Option<String> {
        if other.pci != self.pci {
            return Some(format!(
                "the payload is mapped for {}, not for this controller ({})",
                other.pci, self.pci
            ));
        }
        (other.id != self.id).then(|| {
            format!(
                "the payload is mapped for an earlier controller object on {} (map it again for this one)",
                self.pci
            )
        })
    }
}

/// A range of memory mapped for the controller: what a command moves, and
/// nothing else.
#[derive(Clone, Copy)]
pub struct Payload<'a> {
    pub(super) map: &'a Mapped<'a>,
    pub(super) offset: usize,
    pub(super) len: usize,
}

impl fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Payload<'_> {
    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte (never: payloads are not empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where it starts in its mapping's range.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The PRP entries of the payload (the first byte, then every memory
    /// page after its page).
    pub(super) fn prps(&self) -> std::result::Result<DataPtr, String> {
        self.map
            .segs
            .data_ptr(self.map.skip + self.offset, self.len)
    }
}

/// Memory mapped for the controller by [`Controller::map`](super::Controller::map); unmapped on
/// drop. Borrows the memory (or, from [`Controller::map_owned`](super::Controller::map_owned), owns
/// it), which therefore outlives the mapping.
pub struct Mapped<'m> {
    /// The module that made the mapping, and the controller's list of
    /// standing mappings (none for the tests' memory).
    pub(super) module: Option<(Arc<Module>, Arc<Made>)>,
    pub(super) map: DmaMapping,
    pub(super) segs: Segments,
    /// The controller it is mapped for, and what that may do.
    pub(super) ctrl: Instance,
    pub(super) access: PeerAccess,
    /// Bytes between the first mapped page and the range asked for.
    pub(super) skip: usize,
    pub(super) len: usize,
    pub(super) _owner: Option<Arc<dyn DeviceMemory>>,
    pub(super) _mem: PhantomData<&'m dyn DeviceMemory>,
}

impl fmt::Debug for Mapped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapped")
            .field("pci", &self.ctrl.pci)
            .field("access", &self.access)
            .field("len", &self.len)
            .finish()
    }
}

impl<'m> Mapped<'m> {
    /// Bytes of the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty (never: mappings are not empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What the controller may do with it.
    pub fn access(&self) -> PeerAccess {
        self.access
    }

    /// The `len` bytes at `offset` of the range, as a command's data.
    pub fn payload(&self, offset: usize, len: usize) -> Result<Payload<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len && len > 0 => Ok(Payload {
                map: self,
                offset,
                len,
            }),
            _ => Err(Error::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// The controller's address of byte `offset` of the range.
    pub fn addr(&self, offset: usize) -> Option<u64> {
        (offset < self.len)
            .then(|| self.segs.run((self.skip + offset) as u64).map(|r| r.0))
            .flatten()
    }

    /// What the module returned.
    pub fn mapping(&self) -> &DmaMapping {
        &self.map
    }

    /// A mapping of `len` bytes at bus addresses `segs` for `pci`, made by
    /// no module: the tests' memory.
    #[cfg(test)]
    pub(crate) fn for_test(
        ctrl: Instance,
        segs: &[(u64, u64)],
        skip: usize,
        len: usize,
        access: PeerAccess,
    ) -> Self {
        Self {
            module: None,
            map: DmaMapping {
                map_handle: 0,
                map_type: crate::memory::peer::MapType::BusAddr,
                length: segs.iter().map(|s| s.1).sum(),
                segs: segs.to_vec(),
            },
            segs: Segments::new(segs).unwrap_or_default(),
            ctrl,
            access,
            skip,
            len,
            _owner: None,
            _mem: PhantomData,
        }
    }
}

impl Drop for Mapped<'_> {
    fn drop(&mut self) {
        if let Some((m, made)) = &self.module {
            // Unless a revocation, having stopped the controller, unmapped
            // it already.
            if made.remove(self.map.map_handle()) {
                // SAFETY: The mapping is this value's, and its last use: the
                // borrow of any scope whose commands use it has ended.
                let _ = unsafe { m.unmap_raw(self.map.map_handle()) };
            }
        }
    }
}
