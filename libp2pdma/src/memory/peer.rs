//! Peers and DMA mappings: whether a device (an NVMe SSD) can reach an
//! accelerator's memory by P2P, and the addresses it must use for an
//! allocation, a pinned host buffer or an imported dma-buf.

use std::{
    fmt,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd},
};

use p2pdma_abi as abi;
use rustix::{
    event::{eventfd, EventfdFlags},
    io::Errno,
};

use crate::{discovery::PciAddress, sys, Error, Module, Result};

/// The device that will do the DMA.
#[derive(Clone, Copy, Debug)]
pub enum Peer<'a> {
    /// The PCI function behind an open block device (e.g. `/dev/nvme0n1`).
    Fd(BorrowedFd<'a>),
    /// A PCI function by address.
    Pci(PciAddress),
}

impl Peer<'_> {
    /// The ABI's `flags` and `peer` fields for this peer.
    pub fn to_abi(&self) -> (u32, abi::P2pdmaPeer) {
        match self {
            Peer::Fd(fd) => (
                abi::P2PDMA_PEER_FD,
                abi::P2pdmaPeer {
                    fd: fd.as_raw_fd(),
                    ..Default::default()
                },
            ),
            Peer::Pci(pci) => (
                0,
                abi::P2pdmaPeer {
                    fd: -1,
                    domain: pci.domain,
                    bus: pci.bus,
                    devfn: pci.devfn(),
                    pad0: 0,
                },
            ),
        }
    }
}

/// How a peer reaches memory (`P2PDMA_MAP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapType {
    /// By PCI bus address, through a common switch.
    BusAddr,
    /// Through a host bridge the kernel allows.
    ThruHostBridge,
    /// The kernel does not allow P2P between the two.
    NotSupported,
    /// A value this library does not know.
    Unknown(u32),
}

impl MapType {
    /// From the ABI's `map_type`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            abi::P2PDMA_MAP_BUS_ADDR => MapType::BusAddr,
            abi::P2PDMA_MAP_THRU_HOST_BRIDGE => MapType::ThruHostBridge,
            abi::P2PDMA_MAP_NOT_SUPPORTED => MapType::NotSupported,
            other => MapType::Unknown(other),
        }
    }

    /// The ABI's `map_type`.
    pub fn as_raw(self) -> u32 {
        match self {
            MapType::BusAddr => abi::P2PDMA_MAP_BUS_ADDR,
            MapType::ThruHostBridge => abi::P2PDMA_MAP_THRU_HOST_BRIDGE,
            MapType::NotSupported => abi::P2PDMA_MAP_NOT_SUPPORTED,
            MapType::Unknown(raw) => raw,
        }
    }
}

impl fmt::Display for MapType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapType::BusAddr => f.write_str("bus-addr"),
            MapType::ThruHostBridge => f.write_str("thru-host-bridge"),
            MapType::NotSupported => f.write_str("not-supported"),
            MapType::Unknown(raw) => write!(f, "unknown({raw})"),
        }
    }
}

/// The kernel's answer to "can this peer reach that accelerator by P2P?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pQuery {
    /// How the peer would reach the memory.
    pub map_type: MapType,
    /// The kernel's P2P distance; `None` when P2P is not supported.
    pub distance: Option<u32>,
    /// Why, in the kernel's words.
    pub reason: String,
    /// The PCI function the peer resolved to.
    pub peer: PciAddress,
}

impl From<&abi::P2pdmaP2pQuery> for P2pQuery {
    fn from(q: &abi::P2pdmaP2pQuery) -> Self {
        Self {
            map_type: MapType::from_raw(q.map_type),
            distance: u32::try_from(q.distance).ok(),
            reason: c_string(&q.reason),
            peer: PciAddress::from_devfn(q.peer.domain, q.peer.bus, q.peer.devfn),
        }
    }
}

/// The text of a NUL-terminated (or full) byte array, invalid UTF-8
/// replaced.
pub(crate) fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A DMA mapping for a peer: the addresses the peer must use. Released by
/// handing it to [`Module::unmap`], or when the module file is closed (a
/// mapping dropped without it stays until then).
///
/// Only the mapping calls make one, and it is not `Clone`: whoever holds it
/// owns the mapping, and a mapping someone else holds (a controller's
/// [`Mapped`](crate::queues::Mapped)) cannot be released under it.
#[derive(Debug, PartialEq, Eq)]
pub struct DmaMapping {
    /// The mapping's handle.
    pub(crate) map_handle: u64,
    /// How the peer reaches the memory.
    pub map_type: MapType,
    /// Bytes mapped.
    pub length: u64,
    /// `(address, length)` of each contiguous segment, in order.
    pub segs: Vec<(u64, u64)>,
}

impl DmaMapping {
    /// The mapping's handle in its module file (for
    /// [`Module::handle_state`], and to print).
    pub fn map_handle(&self) -> u64 {
        self.map_handle
    }

    /// Sum of the segments' lengths (saturating).
    pub fn total_len(&self) -> u64 {
        self.segs
            .iter()
            .fold(0u64, |t, &(_, l)| t.saturating_add(l))
    }
}

/// Segments asked for on the first try.
const INITIAL_SEGS: usize = 16;
/// Most segments this library accepts to allocate room for (1 GiB of 4 KiB
/// pages is 262144).
const MAX_SEGS: usize = 1 << 20;

/// Runs a mapping ioctl with room for [`INITIAL_SEGS`] segments and, on
/// `ENOSPC`, once more with room for the `num_segs` the kernel asked for.
pub(crate) fn map_with_retry(
    op: &'static str,
    template: abi::P2pdmaDmaMap,
    mut call: impl FnMut(&mut abi::P2pdmaDmaMap, &mut [abi::P2pdmaDmaSeg]) -> Result<(), Errno>,
) -> Result<DmaMapping> {
    let mut segs = vec![abi::P2pdmaDmaSeg::default(); INITIAL_SEGS];
    let mut arg = template;
    match call(&mut arg, &mut segs) {
        Ok(()) => {}
        Err(Errno::NOSPC) => {
            let needed = arg.num_segs as usize;
            if needed <= segs.len() || needed > MAX_SEGS {
                return Err(Error::ioctl(op)(Errno::NOSPC));
            }
            segs.resize(needed, abi::P2pdmaDmaSeg::default());
            arg = template;
            call(&mut arg, &mut segs).map_err(Error::ioctl(op))?;
        }
        Err(e) => return Err(Error::ioctl(op)(e)),
    }
    let n = (arg.num_segs as usize).min(segs.len());
    Ok(DmaMapping {
        map_handle: arg.map_handle,
        map_type: MapType::from_raw(arg.map_type),
        length: arg.length,
        segs: segs[..n].iter().map(|s| (s.addr, s.len)).collect(),
    })
}

/// What a peer does with memory mapped for it: the DMA direction. Memory
/// the peer only reads can be pinned read-only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerAccess {
    /// The peer reads and writes it.
    #[default]
    ReadWrite,
    /// The peer only reads it (a storage write from this memory).
    ReadOnly,
    /// The peer only writes it (a storage read into this memory).
    WriteOnly,
}

impl PeerAccess {
    fn flags(self) -> u32 {
        match self {
            Self::ReadWrite => 0,
            Self::ReadOnly => abi::P2PDMA_MAP_PEER_READS,
            Self::WriteOnly => abi::P2PDMA_MAP_PEER_WRITES,
        }
    }
}

/// Whether a resource is still usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleState {
    /// Usable.
    Live,
    /// Revoked: its accelerator or its peer was unbound, or a dma-buf's
    /// exporter withdrew it. Its addresses are no longer valid; free or
    /// unmap it to release the handle.
    Revoked,
    /// A mapping that still stands while a device it depends on is going:
    /// the peer must stop using its addresses, then it is unmapped (an
    /// accelerator's unbind waits for that where a process drives the
    /// peer).
    Revoking,
}

fn template(peer: &Peer<'_>, access: PeerAccess) -> abi::P2pdmaDmaMap {
    let (flags, peer) = peer.to_abi();
    abi::P2pdmaDmaMap {
        flags: flags | access.flags(),
        peer,
        ..Default::default()
    }
}

impl Module {
    /// Whether, and how, `peer` can reach the memory of the accelerator at
    /// `dev_index` by P2P DMA.
    #[doc(alias = "P2PDMA_IOC_P2P_QUERY")]
    pub fn p2p_query(&self, dev_index: u32, peer: Peer<'_>) -> Result<P2pQuery> {
        let (flags, p) = peer.to_abi();
        let mut arg = abi::P2pdmaP2pQuery {
            dev_index,
            flags,
            peer: p,
            ..Default::default()
        };
        sys::p2p_query(self, &mut arg).map_err(Error::ioctl("P2PDMA_IOC_P2P_QUERY"))?;
        Ok(P2pQuery::from(&arg))
    }

    /// DMA-maps `length` bytes at `offset` of the allocation `handle` (both
    /// page aligned) for `peer`. Needs `CAP_SYS_RAWIO`.
    #[doc(alias = "P2PDMA_IOC_DMA_MAP")]
    pub fn dma_map(
        &self,
        handle: u64,
        offset: u64,
        length: u64,
        peer: Peer<'_>,
    ) -> Result<DmaMapping> {
        self.dma_map_access(handle, offset, length, peer, PeerAccess::ReadWrite)
    }

    /// [`dma_map`](Self::dma_map) for a peer that only reads or only
    /// writes the memory.
    #[doc(alias = "P2PDMA_IOC_DMA_MAP")]
    pub fn dma_map_access(
        &self,
        handle: u64,
        offset: u64,
        length: u64,
        peer: Peer<'_>,
        access: PeerAccess,
    ) -> Result<DmaMapping> {
        let t = abi::P2pdmaDmaMap {
            handle,
            offset,
            length,
            ..template(&peer, access)
        };
        map_with_retry("P2PDMA_IOC_DMA_MAP", t, |a, s| sys::dma_map(self, a, s))
    }

    /// Pins `length` bytes of host memory at `user_va` (both page aligned)
    /// and DMA-maps them for `peer`. Needs `CAP_SYS_RAWIO`; counts against
    /// `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`. This makes the memory
    /// reachable by the peer; it starts no transfer.
    #[doc(alias = "P2PDMA_IOC_PIN_USER")]
    pub fn pin_user(&self, user_va: u64, length: u64, peer: Peer<'_>) -> Result<DmaMapping> {
        self.pin_user_access(user_va, length, peer, PeerAccess::ReadWrite)
    }

    /// [`pin_user`](Self::pin_user) for a peer that only reads or only
    /// writes the memory; [`PeerAccess::ReadOnly`] pins read-only memory.
    #[doc(alias = "P2PDMA_IOC_PIN_USER")]
    pub fn pin_user_access(
        &self,
        user_va: u64,
        length: u64,
        peer: Peer<'_>,
        access: PeerAccess,
    ) -> Result<DmaMapping> {
        let t = abi::P2pdmaDmaMap {
            user_va,
            length,
            ..template(&peer, access)
        };
        map_with_retry("P2PDMA_IOC_PIN_USER", t, |a, s| sys::pin_user(self, a, s))
    }

    /// Imports the whole dma-buf `dmabuf` for `peer`. Needs
    /// `CAP_SYS_RAWIO`.
    #[doc(alias = "P2PDMA_IOC_DMABUF_IMPORT")]
    pub fn dmabuf_import(&self, dmabuf: BorrowedFd<'_>, peer: Peer<'_>) -> Result<DmaMapping> {
        let t = abi::P2pdmaDmaMap {
            dmabuf_fd: dmabuf.as_raw_fd(),
            ..template(&peer, PeerAccess::ReadWrite)
        };
        map_with_retry("P2PDMA_IOC_DMABUF_IMPORT", t, |a, s| {
            sys::dmabuf_import(self, a, s)
        })
    }

    /// Releases a mapping made by [`dma_map`](Self::dma_map),
    /// [`pin_user`](Self::pin_user) or [`dmabuf_import`](Self::dmabuf_import)
    /// of this module file. The caller hands the mapping over: whoever
    /// holds a [`DmaMapping`] owns it, and gives its addresses to a device
    /// only while holding it.
    #[doc(alias = "P2PDMA_IOC_UNMAP")]
    #[allow(unsafe_code)]
    pub fn unmap(&self, mapping: DmaMapping) -> Result<()> {
        // SAFETY: The caller gave the mapping up, and with it every use of
        // its addresses. Handles are unique across the module's files, so
        // one of another file names nothing here.
        unsafe { self.unmap_raw(mapping.map_handle) }
    }

    /// Releases the mapping `map_handle` of this file: [`Module::unmap`] by
    /// number.
    ///
    /// # Safety
    ///
    /// No device uses the mapping any more, and its owner (the holder of its
    /// [`DmaMapping`], such as a controller's
    /// [`Mapped`](crate::queues::Mapped)) does not hand its addresses to one
    /// afterwards: pages it pinned can be reused for anything once it is
    /// released.
    #[doc(alias = "P2PDMA_IOC_UNMAP")]
    #[allow(unsafe_code)]
    pub unsafe fn unmap_raw(&self, map_handle: u64) -> Result<()> {
        let arg = abi::P2pdmaUnmap {
            map_handle,
            ..Default::default()
        };
        // SAFETY: The caller vouches that nothing uses the mapping.
        unsafe { sys::unmap(self, arg) }.map_err(Error::ioctl("P2PDMA_IOC_UNMAP"))
    }

    /// An eventfd the module signals each time a resource of this module
    /// file is revoked (see [`HandleState::Revoked`]); then
    /// [`handle_state`](Self::handle_state) says which. Replaces any
    /// earlier one.
    #[doc(alias = "P2PDMA_IOC_SET_EVENTFD")]
    pub fn watch_revocations(&self) -> Result<OwnedFd> {
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(Error::sys("eventfd"))?;
        sys::set_eventfd(
            self,
            abi::P2pdmaEventfd {
                fd: efd.as_raw_fd(),
                ..Default::default()
            },
        )
        .map_err(Error::ioctl("P2PDMA_IOC_SET_EVENTFD"))?;
        Ok(efd)
    }

    /// Whether an allocation or mapping handle of this module file is live
    /// or was revoked.
    #[doc(alias = "P2PDMA_IOC_HANDLE_STATE")]
    pub fn handle_state(&self, handle: u64) -> Result<HandleState> {
        let mut arg = abi::P2pdmaHandleState {
            handle,
            ..Default::default()
        };
        sys::handle_state(self, &mut arg).map_err(Error::ioctl("P2PDMA_IOC_HANDLE_STATE"))?;
        Ok(match arg.state {
            abi::P2PDMA_STATE_LIVE => HandleState::Live,
            abi::P2PDMA_STATE_REVOKING => HandleState::Revoking,
            _ => HandleState::Revoked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(addr: u64, len: u64) -> abi::P2pdmaDmaSeg {
        abi::P2pdmaDmaSeg { addr, len }
    }

    #[test]
    fn reasons_stop_at_the_nul() {
        let mut r = [0u8; abi::P2PDMA_REASON_LEN];
        r[..5].copy_from_slice(b"hello");
        r[6] = b'x';
        assert_eq!(c_string(&r), "hello");
        assert_eq!(c_string(&[b'a'; 4]), "aaaa");
        assert_eq!(c_string(&[0xff, b'a', 0]), "\u{fffd}a");
    }

    #[test]
    fn map_types_round_trip() {
        for raw in 0..6 {
            assert_eq!(MapType::from_raw(raw).as_raw(), raw);
        }
        assert_eq!(
            MapType::from_raw(abi::P2PDMA_MAP_BUS_ADDR),
            MapType::BusAddr
        );
        assert_eq!(MapType::NotSupported.to_string(), "not-supported");
    }

    #[test]
    fn query_answers_are_decoded() {
        let mut q = abi::P2pdmaP2pQuery {
            map_type: abi::P2PDMA_MAP_NOT_SUPPORTED,
            distance: -1,
            peer: abi::P2pdmaPeer {
                domain: 0,
                bus: 2,
                devfn: 8 | 1,
                ..Default::default()
            },
            ..Default::default()
        };
        q.reason[..3].copy_from_slice(b"why");
        let a = P2pQuery::from(&q);
        assert_eq!(a.map_type, MapType::NotSupported);
        assert_eq!(a.distance, None);
        assert_eq!(a.reason, "why");
        assert_eq!(a.peer.to_string(), "0000:02:01.1");
        q.distance = 0x102;
        assert_eq!(P2pQuery::from(&q).distance, Some(0x102));
    }

    #[test]
    fn pci_peers_carry_their_address() {
        let pci: PciAddress = "0001:02:03.4".parse().unwrap();
        let (flags, p) = Peer::Pci(pci).to_abi();
        assert_eq!(flags, 0);
        assert_eq!((p.domain, p.bus, p.devfn, p.fd), (1, 2, (3 << 3) | 4, -1));
    }

    #[test]
    fn a_mapping_that_fits_is_read_once() {
        let mut calls = 0;
        let m = map_with_retry("X", abi::P2pdmaDmaMap::default(), |a, s| {
            calls += 1;
            assert_eq!(s.len(), INITIAL_SEGS);
            s[0] = seg(0x1000, 4096);
            s[1] = seg(0x3000, 8192);
            a.num_segs = 2;
            a.length = 12288;
            a.map_handle = 7;
            a.map_type = abi::P2PDMA_MAP_BUS_ADDR;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 1);
        assert_eq!(m.segs, vec![(0x1000, 4096), (0x3000, 8192)]);
        assert_eq!(m.total_len(), 12288);
        assert_eq!(
            (m.map_handle, m.map_type, m.length),
            (7, MapType::BusAddr, 12288)
        );
    }

    #[test]
    fn enospc_grows_the_buffer_and_retries_once() {
        let template = abi::P2pdmaDmaMap {
            handle: 9,
            length: 40 * 4096,
            ..Default::default()
        };
        let mut sizes = Vec::new();
        let m = map_with_retry("X", template, |a, s| {
            sizes.push(s.len());
            assert_eq!(a.handle, 9, "each try starts from the template");
            assert_eq!(a.num_segs, 0, "each try starts from the template");
            a.num_segs = 40;
            if s.len() < 40 {
                return Err(Errno::NOSPC);
            }
            for (i, x) in s.iter_mut().enumerate() {
                *x = seg(i as u64 * 8192, 4096);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(sizes, vec![INITIAL_SEGS, 40]);
        assert_eq!(m.segs.len(), 40);
        assert_eq!(m.total_len(), 40 * 4096);
    }

    #[test]
    fn a_second_enospc_or_a_bogus_count_is_an_error() {
        let mut calls = 0;
        let e = map_with_retry(
            "P2PDMA_IOC_DMA_MAP",
            abi::P2pdmaDmaMap::default(),
            |a, _| {
                calls += 1;
                a.num_segs = 100 * calls;
                Err(Errno::NOSPC)
            },
        )
        .unwrap_err();
        assert_eq!(calls, 2);
        assert_eq!(e.errno(), Some(Errno::NOSPC));
        assert!(e.to_string().contains("P2PDMA_IOC_DMA_MAP"), "{e}");

        for bogus in [0, INITIAL_SEGS as u32, u32::MAX] {
            let mut calls = 0;
            let e = map_with_retry("X", abi::P2pdmaDmaMap::default(), |a, _| {
                calls += 1;
                a.num_segs = bogus;
                Err(Errno::NOSPC)
            })
            .unwrap_err();
            assert_eq!((calls, e.errno()), (1, Some(Errno::NOSPC)));
        }
    }

    #[test]
    fn other_errors_are_not_retried() {
        let mut calls = 0;
        let e = map_with_retry(
            "P2PDMA_IOC_PIN_USER",
            abi::P2pdmaDmaMap::default(),
            |_, _| {
                calls += 1;
                Err(Errno::REMOTEIO)
            },
        )
        .unwrap_err();
        assert_eq!(calls, 1);
        assert_eq!(e.errno(), Some(Errno::REMOTEIO));
    }
}
