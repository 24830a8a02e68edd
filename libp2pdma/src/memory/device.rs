//! Accelerator memory backends behind one trait.
//!
//! The transfer engines see accelerator memory only through
//! [`DeviceMemory`]: its size, copies in and out (the bounce path's device
//! stage), and, for memory devices may reach, its [`DmaMemory`]: where the
//! CPU can map it, a [`DmaTarget`] that storage can DMA into directly (the
//! P2P path). `DmaMemory` is an `unsafe` trait: its answers become DMA
//! targets, so safe code cannot give them. Two backends exist:
//!
//! - [`ModuleMemory`](super::ModuleMemory): BAR memory allocated from the p2pdma kernel module,
//!   the real P2P target;
//! - [`HostMemory`]: the host-memory device, ordinary page-aligned host
//!   memory standing in for an accelerator on machines without one, so that
//!   every API and the bounce pipeline run anywhere.
//!
//! GPU memory fits the same trait ([`CudaMemory`](super::CudaMemory)):
//! copies through the GPU's copy engine out of host memory page-locked for
//! it ([`Stager`]), and a dma-buf peers import ([`DmaMemory::dmabuf`]).

use std::{fmt, os::fd::BorrowedFd, sync::Arc};

use crate::{
    error::check_range,
    sys::{DmaTarget, HostBuffer},
    Error, Module, PciAddress, Result,
};

/// What kind of memory a backend holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// BAR memory of accelerator `index` (PCI address `pci`), from the module.
    ModuleBar {
        /// The accelerator's index in the module.
        index: u32,
        /// Its PCI address.
        pci: crate::PciAddress,
    },
    /// Device memory of CUDA device `ordinal`.
    Cuda {
        /// The device's ordinal.
        ordinal: i32,
        /// Its PCI address, when the driver gives one.
        pci: Option<PciAddress>,
    },
    /// Memory another driver exported as a dma-buf, reached through it.
    Dmabuf,
    /// Host memory standing in for an accelerator.
    Host,
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::ModuleBar { index, pci } => {
                write!(f, "accelerator {index} ({pci}) BAR memory")
            }
            MemoryKind::Cuda { ordinal, pci } => match pci {
                Some(pci) => write!(f, "CUDA device {ordinal} ({pci}) memory"),
                None => write!(f, "CUDA device {ordinal} memory"),
            },
            MemoryKind::Dmabuf => f.write_str("dma-buf memory"),
            MemoryKind::Host => f.write_str("host-memory device"),
        }
    }
}

/// Accelerator memory as the transfer engines use it.
///
/// Implementations never hand out references into the memory: everything
/// goes through explicit copies, or, for memory devices reach, the answers
/// of its [`DmaMemory`], which only `unsafe` code can give.
///
/// # Concurrent use
///
/// One memory object may be used by many threads and transfers at once, and
/// storage may DMA into it while they run: it behaves like a device's memory,
/// not like a Rust buffer. Copies and transfers on disjoint ranges never
/// disturb each other. On overlapping ranges nothing is ordered: a copy out
/// of a range being written may see old bytes, new bytes or a mix, and after
/// two overlapping writes each byte holds one of them. Ordering overlapping
/// use is the caller's, as with two `O_DIRECT` I/Os on one buffer. No Rust
/// reference into the memory is ever made, so the `&[u8]`/`&mut [u8]` a
/// copy takes are always the caller's own host memory.
pub trait DeviceMemory: Send + Sync + fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> usize;

    /// Whether the memory is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the memory is.
    fn kind(&self) -> MemoryKind;

    /// Copies `src` into the memory at `offset` (host to device).
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()>;

    /// Copies memory at `offset` into `dst` (device to host).
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()>;

    /// What page-locks the host memory the bounce path stages this
    /// memory's copies through, for memory whose copies a device's DMA
    /// engine makes (a GPU's); `None` where the CPU copies.
    fn stager(&self) -> Option<&'static dyn Stager> {
        None
    }

    /// How storage and peers reach the memory by DMA, for memory they can
    /// reach: the memory itself, or memory it holds (see [`DmaMemory`]).
    /// `None` (the default) leaves every transfer to the copies.
    fn dma(&self) -> Option<&dyn DmaMemory> {
        None
    }
}

/// Memory that storage and peers may reach by DMA: the answers of this
/// trait become DMA targets (`O_DIRECT` I/O into a CPU mapping, the
/// module's block I/O on an allocation, a controller's commands into a
/// mapping of an allocation, pinned host pages or an imported dma-buf).
///
/// A [`DeviceMemory`] hands its [`DmaMemory`] out through
/// [`DeviceMemory::dma`]. The transfer paths use only the answers of the
/// value they got there, its [`len`](DeviceMemory::len) included.
///
/// # Safety
///
/// Devices write what these answers describe at any time while a transfer
/// runs, outside anything the compiler can check. An implementation
/// promises, for as long as the value lives:
///
/// - the memory described is this value's: it holds it alive (allocated,
///   mapped, pinned where the answer needs it) and nothing else frees,
///   unmaps or reuses it while the value lives;
/// - no Rust reference into the memory exists or is handed to safe code:
///   it is reached only through raw pointers and explicit copies, as every
///   [`DeviceMemory`] is, so a device writing it cannot change memory safe
///   code reads through `&[u8]`;
/// - nothing trusts its contents for memory safety: it is no device's
///   queue, command or descriptor memory (a controller's submission queue
///   or PRP lists);
/// - [`dma_target`](Self::dma_target): `ptr..ptr + len` is such memory,
///   mapped in this process and valid for reads and writes, with
///   `len >= self.len()`; `p2p` is true only for PCI P2P memory;
/// - [`module_allocation`](Self::module_allocation): the handle names an
///   allocation of that module file which this value owns, of at least
///   `self.len()` bytes, holding this memory from its byte 0;
/// - [`dmabuf`](Self::dmabuf): the dma-buf's memory, from the offset given,
///   is this memory (at least `self.len()` bytes), and the dma-buf lives as
///   long as the value;
/// - the answers and [`len`](DeviceMemory::len) do not change while the
///   value lives.
#[allow(unsafe_code)]
pub unsafe trait DmaMemory: DeviceMemory {
    /// The CPU mapping storage can DMA into directly, if there is one.
    fn dma_target(&self) -> Option<DmaTarget> {
        None
    }

    /// For memory allocated from the module: the module and the
    /// allocation's handle, through which the module can do block I/O on
    /// the memory itself ([`Module::block_io`](crate::Module::block_io)).
    fn module_allocation(&self) -> Option<(&Arc<Module>, u64)> {
        None
    }

    /// The memory as a dma-buf its driver exported, for a peer to import
    /// ([`Module::dmabuf_import`]), and where byte 0 of the memory lies in
    /// it.
    fn dmabuf(&self) -> Option<(BorrowedFd<'_>, u64)> {
        None
    }
}

/// Page-locks host memory for a device's copy engine.
pub trait Stager: Send + Sync + fmt::Debug {
    /// The copy engine's name: host memory pinned once for it serves every
    /// memory with the same stager.
    fn name(&self) -> &'static str;

    /// Page-locks `buf` until the pin is dropped (the pin keeps it alive).
    fn pin(&self, buf: Arc<HostBuffer>) -> Result<StagingPin>;
}

/// Host memory page-locked for a copy engine; unpinned when dropped.
pub struct StagingPin {
    name: &'static str,
    _guard: Box<dyn Send + Sync>,
}

impl fmt::Debug for StagingPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingPin")
            .field("for", &self.name)
            .finish()
    }
}

impl StagingPin {
    /// A pin for the stager `name`, undone by dropping `guard`.
    pub fn new(name: &'static str, guard: Box<dyn Send + Sync>) -> Self {
        Self {
            name,
            _guard: guard,
        }
    }

    /// The stager's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// Copies `len` bytes of `src` at `src_offset` to `dst` at `dst_offset` by
/// the CPU, through a host buffer of at most 4 MiB: a memory's `read_at`
/// into it, the other's `write_at` out of it. Both ranges are checked
/// before the first byte moves.
pub fn copy_through_host(
    src: &dyn DeviceMemory,
    src_offset: usize,
    dst: &dyn DeviceMemory,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check_range(src_offset, len, src.len())?;
    check_range(dst_offset, len, dst.len())?;
    let mut staged = vec![0u8; len.min(4 << 20)];
    let mut done = 0;
    while done < len {
        let n = staged.len().min(len - done);
        src.read_at(src_offset + done, &mut staged[..n])?;
        dst.write_at(dst_offset + done, &staged[..n])?;
        done += n;
    }
    Ok(())
}

/// The host-memory device: page-aligned host memory that stands in for an
/// accelerator where there is none. It is a valid `O_DIRECT` target, but
/// never P2P.
pub struct HostMemory {
    buf: HostBuffer,
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory")
            .field("len", &self.buf.len())
            .finish()
    }
}

impl HostMemory {
    /// `len` bytes (> 0) of zeroed, page-aligned host memory.
    pub fn new(len: usize) -> Result<Self> {
        let buf = HostBuffer::new(len).map_err(Error::sys("allocate host-memory device"))?;
        Ok(Self { buf })
    }

    /// Faults every page in (writing zeros), so that the first copy or
    /// I/O into the memory does not.
    pub(crate) fn prefault(&self) {
        self.buf.fill(0);
    }

    /// `len` bytes at `offset`, borrowed.
    ///
    /// # Safety
    /// Nothing may write the range (no copy, no DMA) while the borrow
    /// lives.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn bytes(&self, offset: usize, len: usize) -> Result<&[u8]> {
        check_range(offset, len, self.len())?;
        // SAFETY: In bounds (checked); the caller guarantees no writer.
        Ok(unsafe { std::slice::from_raw_parts(self.buf.as_raw().add(offset), len) })
    }

    /// `len` bytes at `offset`, borrowed for writing.
    ///
    /// # Safety
    /// Nothing else may read or write the range while the borrow lives.
    #[allow(clippy::mut_from_ref, unsafe_code)]
    pub(crate) unsafe fn bytes_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        check_range(offset, len, self.len())?;
        // SAFETY: In bounds (checked); the caller guarantees exclusive use.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.buf.as_raw().add(offset), len) })
    }
}

impl DeviceMemory for HostMemory {
    fn len(&self) -> usize {
        self.buf.len()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len())?;
        self.buf
            .write_raw(offset, src)
            .map_err(Error::sys("copy into host-memory device"))
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len())?;
        self.buf
            .read_raw(offset, dst)
            .map_err(Error::sys("copy from host-memory device"))
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

// SAFETY: The buffer is this value's own anonymous memory, unmapped only
// when it drops; no reference into it reaches safe code (`bytes` and
// `bytes_mut` are unsafe and crate-private), and it holds nothing but data.
#[allow(unsafe_code)]
unsafe impl DmaMemory for HostMemory {
    fn dma_target(&self) -> Option<DmaTarget> {
        Some(DmaTarget {
            ptr: self.buf.as_raw(),
            len: self.buf.len(),
            p2p: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_through_host_in_pieces_and_check_both_ranges_first() {
        let len = (9 << 20) + 5;
        let src = HostMemory::new(len + 3).unwrap();
        let dst = HostMemory::new(len + 7).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4099) as u8).collect();
        src.write_at(3, &data).unwrap();
        copy_through_host(&src, 3, &dst, 7, len).unwrap();
        let mut out = vec![0u8; len];
        dst.read_at(7, &mut out).unwrap();
        assert!(out == data, "the copy differs");
        // A destination too small: refused before a byte moves.
        let small = HostMemory::new(5 << 20).unwrap();
        small.write_at(0, &vec![9u8; 5 << 20]).unwrap();
        assert!(matches!(
            copy_through_host(&src, 3, &small, 0, 6 << 20),
            Err(Error::OutOfBounds { .. })
        ));
        let mut kept = vec![0u8; 5 << 20];
        small.read_at(0, &mut kept).unwrap();
        assert!(kept.iter().all(|&b| b == 9), "a refused copy wrote");
        assert!(matches!(
            copy_through_host(&src, len, &dst, 0, 4),
            Err(Error::OutOfBounds { .. })
        ));
    }

    #[test]
    fn host_memory_copies_and_checks_bounds() {
        let m = HostMemory::new(8192).unwrap();
        assert_eq!(m.kind(), MemoryKind::Host);
        m.write_at(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        m.read_at(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(matches!(
            m.write_at(8190, b"abc"),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.read_at(usize::MAX, &mut out),
            Err(Error::OutOfBounds { .. })
        ));
        let t = m.dma().and_then(|d| d.dma_target()).unwrap();
        assert_eq!(t.ptr as usize % 4096, 0);
        assert!(!t.p2p);
    }
}
