// SPDX-License-Identifier: GPL-2.0 OR MIT

//! The `/dev/p2pdma` ioctl ABI.
//!
//! This file is the single source of truth for the ABI. The kernel module
//! includes it as a module, the userspace crate `p2pdma-abi` includes the same
//! file, and `uapi.h` next to it spells it for C; a test builds that header and
//! fails if any size, offset or request code differs from what is here.
//!
//! Rules: every struct is `#[repr(C)]` with fixed-width fields only, pointers
//! travel as `u64`, padding is explicit, `flags` and `reserved` fields must be
//! zero on input (`EINVAL` otherwise) and are zeroed on output. A struct never
//! changes once released: new features get new ioctls.
//!
//! This file uses nothing but `core` so it builds in both worlds.

use core::mem::{offset_of, size_of};

/// The ioctl "type" byte of every p2pdma request.
pub const P2PDMA_IOCTL_MAGIC: u32 = 0xBC;

/// ABI version implemented by this file. Bumped when ioctls are added.
pub const P2PDMA_ABI_VERSION: u32 = 3;

/// Oldest ABI version a caller may have been built against and still work.
pub const P2PDMA_ABI_MIN_COMPAT: u32 = 1;

/// Capability bit: accelerator BARs are registered as kernel P2PDMA memory.
pub const P2PDMA_CAP_BAR_P2PMEM: u64 = 1 << 0;
/// Capability bit: `ALLOC`/`FREE` and `mmap` of allocations.
pub const P2PDMA_CAP_ALLOC: u64 = 1 << 1;
/// Capability bit: `P2P_QUERY`.
pub const P2PDMA_CAP_P2P_QUERY: u64 = 1 << 2;
/// Capability bit: `DMA_MAP`, `PIN_USER` and `UNMAP`.
pub const P2PDMA_CAP_DMA_MAP: u64 = 1 << 3;
/// Capability bit: `DMABUF_IMPORT`.
pub const P2PDMA_CAP_DMABUF: u64 = 1 << 4;
/// Capability bit (ABI 2): `SET_EVENTFD` and `HANDLE_STATE`: resources are
/// revoked when a device they depend on goes away, and the owner is told.
pub const P2PDMA_CAP_REVOKE: u64 = 1 << 5;
/// Capability bit (ABI 2): [`P2PDMA_MAP_PEER_READS`] and
/// [`P2PDMA_MAP_PEER_WRITES`].
pub const P2PDMA_CAP_MAP_DIRECTION: u64 = 1 << 6;
/// Capability bit (ABI 3): `BLOCK_IO`: the module reads and writes block
/// devices to and from allocations itself, with no page pinning.
pub const P2PDMA_CAP_BLOCK_IO: u64 = 1 << 7;

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    (dir << IOC_DIRSHIFT)
        | (P2PDMA_IOCTL_MAGIC << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
}

/// Output of [`P2PDMA_IOC_GET_VERSION`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaVersion {
    /// ABI version of the running module ([`P2PDMA_ABI_VERSION`]).
    pub abi_version: u32,
    /// Oldest ABI version the module still serves.
    pub abi_min_compat: u32,
    /// `P2PDMA_CAP_*` bits.
    pub capabilities: u64,
    /// Number of accelerator devices bound right now.
    pub num_devices: u32,
    /// Zero.
    pub reserved0: u32,
    /// Zero.
    pub reserved: [u64; 4],
}

/// In/out argument of [`P2PDMA_IOC_DEVICE_INFO`].
///
/// In: `index` (a device's stable index, `0..P2PDMA_MAX_DEVICES`), `flags` = 0.
/// Out: everything else. An index with no device bound gives `ENODEV`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaDeviceInfo {
    /// In: stable device index.
    pub index: u32,
    /// In: must be zero.
    pub flags: u32,
    /// PCI domain (segment).
    pub domain: u32,
    /// PCI bus number.
    pub bus: u8,
    /// PCI device and function, `(dev << 3) | fn`.
    pub devfn: u8,
    /// Index of the BAR registered as P2P memory.
    pub bar: u8,
    /// Zero.
    pub pad0: u8,
    /// PCI vendor ID.
    pub vendor: u16,
    /// PCI device ID.
    pub device: u16,
    /// NUMA node of the device, -1 when unknown.
    pub numa_node: i32,
    /// Size of the BAR in bytes.
    pub bar_size: u64,
    /// PCI bus address of the start of the BAR.
    pub bar_bus_addr: u64,
    /// Bytes of the BAR registered as P2P memory.
    pub p2p_size: u64,
    /// Bytes of P2P memory not yet allocated through this module.
    pub p2p_available: u64,
    /// Zero.
    pub reserved: [u64; 4],
}

/// Largest number of accelerator devices the module tracks at once.
pub const P2PDMA_MAX_DEVICES: u32 = 64;

/// Peer selection flag: the peer is the device behind `peer_fd` (an open
/// block device, e.g. `/dev/nvme0n1`), not the PCI address fields.
pub const P2PDMA_PEER_FD: u32 = 1 << 0;

/// Mapping flag (`DMA_MAP`, `PIN_USER`, `DMABUF_IMPORT`): the peer only
/// reads the memory (`DMA_TO_DEVICE`). `PIN_USER` then pins without write
/// access, so read-only buffers can be pinned.
pub const P2PDMA_MAP_PEER_READS: u32 = 1 << 1;
/// Mapping flag: the peer only writes the memory (`DMA_FROM_DEVICE`).
/// Neither or both of the two flags: the peer reads and writes.
pub const P2PDMA_MAP_PEER_WRITES: u32 = 1 << 2;

/// Most live mappings made by the module (`DMA_MAP`, `PIN_USER`,
/// `DMABUF_IMPORT`, one per peer) that a peer may write and that cover the
/// same page, over all files, processes and dma-bufs; one more gets
/// `ETOOMANYREFS`. The DMA API bounds how many mappings of one cacheline
/// may be live at once (1 + 7 with its debugging on), whichever device
/// they are for; the kernel's own I/O on the pages keeps the rest. Mappings
/// the peer only reads ([`P2PDMA_MAP_PEER_READS`]) are not counted, as the
/// DMA API does not count them.
pub const P2PDMA_MAX_PIN_OVERLAP: u32 = 4;

/// `map_type`: the peer reaches the memory by PCI bus address through a
/// common switch.
pub const P2PDMA_MAP_BUS_ADDR: u32 = 1;
/// `map_type`: the peer reaches the memory through an allowed host bridge.
pub const P2PDMA_MAP_THRU_HOST_BRIDGE: u32 = 2;
/// `map_type`: the kernel does not allow P2P DMA between the two.
pub const P2PDMA_MAP_NOT_SUPPORTED: u32 = 3;

/// Length of [`P2pdmaP2pQuery::reason`], including the terminating NUL.
pub const P2PDMA_REASON_LEN: usize = 128;

/// Largest allocation alignment [`P2PDMA_IOC_ALLOC`] accepts.
pub const P2PDMA_MAX_ALIGN: u64 = 1 << 30;

/// In/out argument of [`P2PDMA_IOC_ALLOC`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaAlloc {
    /// In: index of the accelerator to allocate from.
    pub dev_index: u32,
    /// In: must be zero.
    pub flags: u32,
    /// In: bytes wanted (> 0); out: bytes allocated (rounded up to pages).
    pub size: u64,
    /// In: alignment of the allocation's bus address: 0 (a page), or a power
    /// of two up to [`P2PDMA_MAX_ALIGN`].
    pub align: u64,
    /// Out: the allocation's handle, unique for the life of the module.
    pub handle: u64,
    /// Out: the `offset` argument of `mmap(2)` that maps the allocation.
    pub mmap_offset: u64,
    /// In: zero.
    pub reserved: [u64; 4],
}

/// Argument of [`P2PDMA_IOC_FREE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaFree {
    /// The allocation's handle.
    pub handle: u64,
    /// Must be zero.
    pub flags: u32,
    /// Zero.
    pub reserved0: u32,
    /// Zero.
    pub reserved: [u64; 2],
}

/// A peer device: an open block device, or a PCI function by address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaPeer {
    /// File descriptor of an open block device, used with
    /// [`P2PDMA_PEER_FD`]; otherwise must be -1 or 0.
    pub fd: i32,
    /// PCI domain of the peer (without [`P2PDMA_PEER_FD`]).
    pub domain: u32,
    /// PCI bus of the peer.
    pub bus: u8,
    /// PCI devfn of the peer.
    pub devfn: u8,
    /// Zero.
    pub pad0: u16,
}

/// In/out argument of [`P2PDMA_IOC_P2P_QUERY`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pdmaP2pQuery {
    /// In: accelerator index.
    pub dev_index: u32,
    /// In: [`P2PDMA_PEER_FD`] or 0.
    pub flags: u32,
    /// In: the peer. Out: `domain`, `bus` and `devfn` of the PCI function
    /// the peer resolved to.
    pub peer: P2pdmaPeer,
    /// Out: `P2PDMA_MAP_*`.
    pub map_type: u32,
    /// Out: the kernel's P2P distance, -1 when P2P is not supported.
    pub distance: i32,
    /// Zero.
    pub pad1: u32,
    /// Out: why, in words; NUL-terminated.
    pub reason: [u8; P2PDMA_REASON_LEN],
    /// In: zero.
    pub reserved: [u64; 4],
}

impl Default for P2pdmaP2pQuery {
    fn default() -> Self {
        Self {
            dev_index: 0,
            flags: 0,
            peer: P2pdmaPeer::default(),
            map_type: 0,
            distance: 0,
            pad1: 0,
            reason: [0; P2PDMA_REASON_LEN],
            reserved: [0; 4],
        }
    }
}

/// One contiguous DMA segment, as seen by the peer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaDmaSeg {
    /// DMA (bus or IOVA) address the peer must use.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// In/out argument of [`P2PDMA_IOC_DMA_MAP`], [`P2PDMA_IOC_PIN_USER`] and
/// [`P2PDMA_IOC_DMABUF_IMPORT`].
///
/// The source is, by ioctl: an allocation `handle` with `offset`/`length`
/// (page aligned, within the allocation); a user buffer `user_va`/`length`
/// (page aligned); a dma-buf file descriptor `dmabuf_fd` (whole buffer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaDmaMap {
    /// In: [`P2PDMA_PEER_FD`] or 0.
    pub flags: u32,
    /// In: the dma-buf to import (`DMABUF_IMPORT` only, else 0).
    pub dmabuf_fd: i32,
    /// In: the peer device the addresses are for.
    pub peer: P2pdmaPeer,
    /// Zero.
    pub pad0: u32,
    /// In: allocation handle (`DMA_MAP` only, else 0).
    pub handle: u64,
    /// In: user virtual address (`PIN_USER` only, else 0).
    pub user_va: u64,
    /// In: byte offset into the allocation (`DMA_MAP` only, else 0).
    pub offset: u64,
    /// In: bytes to map (`DMA_MAP`, `PIN_USER`); out: bytes mapped.
    pub length: u64,
    /// In: user pointer to an array of `max_segs` [`P2pdmaDmaSeg`].
    pub segs_ptr: u64,
    /// In: capacity of that array.
    pub max_segs: u32,
    /// Out: segments written (or needed, with `ENOSPC`).
    pub num_segs: u32,
    /// Out: handle of the mapping, for [`P2PDMA_IOC_UNMAP`].
    pub map_handle: u64,
    /// Out: `P2PDMA_MAP_*` used for the mapping; 0 for host memory
    /// (`PIN_USER`) and dma-bufs, which the exporter maps.
    pub map_type: u32,
    /// Zero.
    pub pad1: u32,
    /// In: zero.
    pub reserved: [u64; 4],
}

/// Argument of [`P2PDMA_IOC_UNMAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaUnmap {
    /// A mapping handle from `DMA_MAP`, `PIN_USER` or `DMABUF_IMPORT`.
    pub map_handle: u64,
    /// Must be zero.
    pub flags: u32,
    /// Zero.
    pub reserved0: u32,
    /// Zero.
    pub reserved: [u64; 2],
}

/// Argument of [`P2PDMA_IOC_SET_EVENTFD`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaEventfd {
    /// An eventfd, or -1 to stop notifications.
    pub fd: i32,
    /// Must be zero.
    pub flags: u32,
    /// Zero.
    pub reserved: [u64; 2],
}

/// [`P2pdmaHandleState::state`]: the resource is usable.
pub const P2PDMA_STATE_LIVE: u32 = 1;
/// [`P2pdmaHandleState::state`]: the resource was revoked (its device, or
/// its peer, was unbound; or the dma-buf's exporter withdrew it). Its DMA
/// addresses are no longer valid; `FREE` or `UNMAP` releases the handle.
pub const P2PDMA_STATE_REVOKED: u32 = 2;
/// [`P2pdmaHandleState::state`]: a mapping that still stands while a device
/// it depends on is going (an accelerator being unbound, or its peer losing
/// its driver): stop the peer's use of its addresses, then `UNMAP` it. The
/// module revokes it when the peer's driver is done with the device; an
/// accelerator's unbind waits for mappings of its memory for peers that
/// processes drive (vfio-pci).
pub const P2PDMA_STATE_REVOKING: u32 = 3;

/// In/out argument of [`P2PDMA_IOC_HANDLE_STATE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaHandleState {
    /// In: an allocation handle or a mapping handle of this file.
    pub handle: u64,
    /// In: must be zero.
    pub flags: u32,
    /// Out: `P2PDMA_STATE_*`.
    pub state: u32,
    /// In: zero.
    pub reserved: [u64; 2],
}

/// [`P2pdmaBlockIo::flags`]: move data from the allocation to the device
/// (otherwise from the device to the allocation).
pub const P2PDMA_IO_WRITE: u32 = 1 << 0;
/// Most segments in one `BLOCK_IO`.
pub const P2PDMA_IO_MAX_SEGS: u32 = 4096;
/// Largest segment, in bytes.
pub const P2PDMA_IO_MAX_SEG_LEN: u64 = 1 << 30;
/// Most segments in flight at once.
pub const P2PDMA_IO_MAX_DEPTH: u32 = 256;
/// Segments in flight when [`P2pdmaBlockIo::depth`] is 0.
pub const P2PDMA_IO_DEFAULT_DEPTH: u32 = 32;

/// One segment of a [`P2PDMA_IOC_BLOCK_IO`]: `len` bytes between
/// `mem_offset` in the allocation and `dev_offset` on the block device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaIoSeg {
    /// Byte offset in the allocation; a multiple of the device's DMA
    /// alignment.
    pub mem_offset: u64,
    /// Byte offset on the block device; a multiple of its logical block.
    pub dev_offset: u64,
    /// Bytes; a multiple of the logical block, at most
    /// [`P2PDMA_IO_MAX_SEG_LEN`].
    pub len: u64,
}

/// In/out argument of [`P2PDMA_IOC_BLOCK_IO`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaBlockIo {
    /// In: the allocation.
    pub handle: u64,
    /// In: an open block device (a namespace, a partition); opened for
    /// reading to read it, for writing to write it.
    pub fd: i32,
    /// In: [`P2PDMA_IO_WRITE`] or 0.
    pub flags: u32,
    /// In: user pointer to `num_segs` [`P2pdmaIoSeg`].
    pub segs_ptr: u64,
    /// In: segments, 1 to [`P2PDMA_IO_MAX_SEGS`].
    pub num_segs: u32,
    /// In: most segments in flight (0: [`P2PDMA_IO_DEFAULT_DEPTH`]).
    pub depth: u32,
    /// In: zero; out: bytes moved (all segments').
    pub bytes: u64,
    /// In: zero.
    pub reserved: [u64; 4],
}

/// Query the ABI version and capabilities. Never fails.
pub const P2PDMA_IOC_GET_VERSION: u32 = ioc(IOC_READ, 0x00, size_of::<P2pdmaVersion>());

/// Describe one accelerator device.
///
/// Errors: `EINVAL` (non-zero flags, or index >= `P2PDMA_MAX_DEVICES`),
/// `ENODEV` (no device at that index), `EFAULT`.
pub const P2PDMA_IOC_DEVICE_INFO: u32 =
    ioc(IOC_READ | IOC_WRITE, 0x01, size_of::<P2pdmaDeviceInfo>());

/// Allocate accelerator memory, owned by the open file.
///
/// The memory reads as zeros: no opener sees what a previous user left.
///
/// Errors: `EINVAL` (flags/reserved non-zero, size 0 or too large, bad
/// alignment), `ENODEV` (no such device, or it was unbound), `ENOMEM` (no
/// P2P memory left), `EDQUOT` (a caller without `CAP_SYS_ADMIN` would hold
/// more than the module's `user_share` percent of the device's memory,
/// counted over all files of its user), `EFAULT`.
pub const P2PDMA_IOC_ALLOC: u32 = ioc(IOC_READ | IOC_WRITE, 0x02, size_of::<P2pdmaAlloc>());

/// Free an allocation. Existing user mappings of it stay valid until
/// unmapped; the memory returns to the device when the last one goes.
/// Freeing a revoked allocation only releases its handle.
///
/// Errors: `EINVAL` (flags/reserved non-zero), `ENOENT` (no such handle in
/// this file), `EBUSY` (a `DMA_MAP` mapping of it still exists), `EFAULT`.
pub const P2PDMA_IOC_FREE: u32 = ioc(IOC_WRITE, 0x03, size_of::<P2pdmaFree>());

/// Whether, and how, a peer can reach an accelerator's memory by P2P DMA.
///
/// Errors: `EINVAL` (flags/reserved/pad non-zero), `ENODEV` (no such
/// accelerator or peer PCI function), `EBADF` (bad peer fd), `ENOTBLK`
/// (peer fd is not a block device), `ENXIO` (peer has no PCI function),
/// `EOPNOTSUPP` (an md array whose members are on more PCI functions than
/// the module resolves), `EFAULT`. An md array's answer is its worst
/// member's.
pub const P2PDMA_IOC_P2P_QUERY: u32 = ioc(IOC_READ | IOC_WRITE, 0x04, size_of::<P2pdmaP2pQuery>());

/// DMA-map a range of an allocation for a peer; returns the peer's
/// addresses. Requires `CAP_SYS_RAWIO`. The kernel's DMA API maps the
/// allocation's pages (`dma_map_sgtable`), so the P2PDMA rules, ACS and the
/// IOMMU decide the addresses and `map_type`. A multipath block device is
/// mapped for every controller under it, and succeeds only when they all
/// get the same addresses.
///
/// Errors: `EPERM`, `EINVAL` (unknown flags, reserved/pad non-zero, range
/// not page aligned or outside the allocation, length 0), `ENOENT` (no such
/// allocation), `EREMOTEIO` (the kernel does not allow P2P between them),
/// `EXDEV` (the paths of a multipath device need different addresses: map
/// for one controller), `ENOSPC` (`max_segs` too small; `num_segs` says how
/// many are needed), peer errors as for `P2P_QUERY`, `EOPNOTSUPP` (the
/// peer is a bridge, which masters no DMA), `ENODEV` (the allocation was
/// revoked, or a device the mapping depends on is being unbound),
/// `ETOOMANYREFS` (a page of the range already carries
/// [`P2PDMA_MAX_PIN_OVERLAP`] mappings), `ENOMEM`, `EFAULT`.
pub const P2PDMA_IOC_DMA_MAP: u32 = ioc(IOC_READ | IOC_WRITE, 0x05, size_of::<P2pdmaDmaMap>());

/// Pin a host user buffer and DMA-map it for a peer. Requires
/// `CAP_SYS_RAWIO`.
///
/// The pinned pages count against `RLIMIT_MEMLOCK` (as the process's
/// `pinned_vm`) unless the caller has `CAP_IPC_LOCK`.
///
/// Errors: `EPERM`, `EINVAL` (address or length not page aligned, length 0
/// or over 1 GiB, non-zero fields), `EFAULT` (buffer not mapped, or not
/// writable without [`P2PDMA_MAP_PEER_READS`]), `ENOMEM` (over
/// `RLIMIT_MEMLOCK`, or out of memory), `ETOOMANYREFS` (a page already
/// carries [`P2PDMA_MAX_PIN_OVERLAP`] mappings), `ENOSPC`, peer
/// errors as for `P2P_QUERY`, `EOPNOTSUPP` and `ENODEV` as for `DMA_MAP`.
pub const P2PDMA_IOC_PIN_USER: u32 = ioc(IOC_READ | IOC_WRITE, 0x06, size_of::<P2pdmaDmaMap>());

/// Release a mapping made by `DMA_MAP`, `PIN_USER` or `DMABUF_IMPORT`
/// (revoked ones too).
///
/// Errors: `EINVAL` (non-zero fields), `ENOENT` (no such mapping in this
/// file), `EFAULT`.
pub const P2PDMA_IOC_UNMAP: u32 = ioc(IOC_WRITE, 0x07, size_of::<P2pdmaUnmap>());

/// Import a dma-buf (e.g. GPU memory exported by its driver) for a peer:
/// attach, map, and return the peer's addresses. Requires `CAP_SYS_RAWIO`.
///
/// The attachment is dynamic and allows peer-to-peer, and the buffer is
/// pinned while imported; if the exporter still moves or withdraws it
/// (`move_notify`), the mapping is revoked.
///
/// Errors: `EPERM`, `EINVAL`, `EBADF` (not a dma-buf), `EMSGSIZE` (the
/// buffer is larger than the peer's longest DMA segment: the exporter's
/// segments might not fit), `ETOOMANYREFS` (a page of the buffer
/// already carries [`P2PDMA_MAX_PIN_OVERLAP`] mappings, or the buffer that
/// many imports where its exporter gives no pages), `ENOSPC`,
/// `ENOMEM`, peer errors as for `P2P_QUERY`, `EOPNOTSUPP` and `ENODEV` as
/// for `DMA_MAP`, errors of the exporter.
pub const P2PDMA_IOC_DMABUF_IMPORT: u32 =
    ioc(IOC_READ | IOC_WRITE, 0x08, size_of::<P2pdmaDmaMap>());

/// Have the eventfd `fd` signalled each time a resource of this file (an
/// allocation or a mapping) is revoked; `fd = -1` stops it. Resources are
/// revoked when their accelerator is unbound, when the peer of a mapping is
/// unbound from its driver, or when a dma-buf's exporter withdraws it; then
/// [`P2PDMA_IOC_HANDLE_STATE`] says which. The opening process only.
///
/// Errors: `EPERM`, `EINVAL` (non-zero fields), `EBADF` (not an eventfd),
/// `EFAULT`.
pub const P2PDMA_IOC_SET_EVENTFD: u32 = ioc(IOC_WRITE, 0x09, size_of::<P2pdmaEventfd>());

/// Whether an allocation or mapping handle of this file is live or was
/// revoked.
///
/// Errors: `EINVAL` (non-zero fields), `ENOENT` (no such handle in this
/// file), `EFAULT`.
pub const P2PDMA_IOC_HANDLE_STATE: u32 =
    ioc(IOC_READ | IOC_WRITE, 0x0a, size_of::<P2pdmaHandleState>());

/// Reads (or, with [`P2PDMA_IO_WRITE`], writes) a block device to (from)
/// an allocation of this file: the module builds the bios on the
/// allocation's own pages, so nothing is pinned per I/O, and keeps up to
/// `depth` segments in flight. Returns when every segment has ended. Like
/// `O_DIRECT`, the page cache of the ranges is written back first (and, for
/// writes, dropped before and after). A fatal signal stops submitting;
/// what was submitted is waited for. The opening process only.
///
/// Errors: `EINVAL` (fields, alignment, a range past the allocation or the
/// device), `ENOENT` (no such allocation), `ENODEV` (it was revoked),
/// `EBADF` (not open, or not open for that direction), `ENOTBLK` (not a
/// block device), `EPERM` (writing a read-only device), `ETXTBSY` (writing
/// an active swap device), what a security
/// module refuses (`EACCES`, `EPERM`), `EOPNOTSUPP` (the
/// device's driver cannot DMA to P2P memory), `EREMOTEIO` (the kernel does
/// not allow P2P between the accelerator and the device's controller),
/// `EBUSY` (the page cache of a written range could not be dropped),
/// `EINTR` (fatal signal), and the device's I/O errors (`EIO`, ...): the
/// data of the segments is then undefined.
pub const P2PDMA_IOC_BLOCK_IO: u32 = ioc(IOC_READ | IOC_WRITE, 0x0b, size_of::<P2pdmaBlockIo>());

// The layout is frozen: these fail to compile if it moves.
const _: () = {
    assert!(size_of::<P2pdmaVersion>() == 56);
    assert!(offset_of!(P2pdmaVersion, capabilities) == 8);
    assert!(offset_of!(P2pdmaVersion, num_devices) == 16);
    assert!(offset_of!(P2pdmaVersion, reserved) == 24);

    assert!(size_of::<P2pdmaDeviceInfo>() == 88);
    assert!(offset_of!(P2pdmaDeviceInfo, domain) == 8);
    assert!(offset_of!(P2pdmaDeviceInfo, bus) == 12);
    assert!(offset_of!(P2pdmaDeviceInfo, devfn) == 13);
    assert!(offset_of!(P2pdmaDeviceInfo, bar) == 14);
    assert!(offset_of!(P2pdmaDeviceInfo, vendor) == 16);
    assert!(offset_of!(P2pdmaDeviceInfo, device) == 18);
    assert!(offset_of!(P2pdmaDeviceInfo, numa_node) == 20);
    assert!(offset_of!(P2pdmaDeviceInfo, bar_size) == 24);
    assert!(offset_of!(P2pdmaDeviceInfo, bar_bus_addr) == 32);
    assert!(offset_of!(P2pdmaDeviceInfo, p2p_size) == 40);
    assert!(offset_of!(P2pdmaDeviceInfo, p2p_available) == 48);
    assert!(offset_of!(P2pdmaDeviceInfo, reserved) == 56);

    assert!(size_of::<P2pdmaAlloc>() == 72);
    assert!(offset_of!(P2pdmaAlloc, size) == 8);
    assert!(offset_of!(P2pdmaAlloc, align) == 16);
    assert!(offset_of!(P2pdmaAlloc, handle) == 24);
    assert!(offset_of!(P2pdmaAlloc, mmap_offset) == 32);
    assert!(offset_of!(P2pdmaAlloc, reserved) == 40);

    assert!(size_of::<P2pdmaFree>() == 32);
    assert!(offset_of!(P2pdmaFree, flags) == 8);
    assert!(offset_of!(P2pdmaFree, reserved) == 16);

    assert!(size_of::<P2pdmaPeer>() == 12);
    assert!(offset_of!(P2pdmaPeer, domain) == 4);
    assert!(offset_of!(P2pdmaPeer, bus) == 8);
    assert!(offset_of!(P2pdmaPeer, devfn) == 9);
    assert!(offset_of!(P2pdmaPeer, pad0) == 10);

    assert!(size_of::<P2pdmaP2pQuery>() == 192);
    assert!(offset_of!(P2pdmaP2pQuery, peer) == 8);
    assert!(offset_of!(P2pdmaP2pQuery, map_type) == 20);
    assert!(offset_of!(P2pdmaP2pQuery, distance) == 24);
    assert!(offset_of!(P2pdmaP2pQuery, pad1) == 28);
    assert!(offset_of!(P2pdmaP2pQuery, reason) == 32);
    assert!(offset_of!(P2pdmaP2pQuery, reserved) == 160);

    assert!(size_of::<P2pdmaDmaSeg>() == 16);

    assert!(size_of::<P2pdmaDmaMap>() == 120);
    assert!(offset_of!(P2pdmaDmaMap, dmabuf_fd) == 4);
    assert!(offset_of!(P2pdmaDmaMap, peer) == 8);
    assert!(offset_of!(P2pdmaDmaMap, pad0) == 20);
    assert!(offset_of!(P2pdmaDmaMap, handle) == 24);
    assert!(offset_of!(P2pdmaDmaMap, user_va) == 32);
    assert!(offset_of!(P2pdmaDmaMap, offset) == 40);
    assert!(offset_of!(P2pdmaDmaMap, length) == 48);
    assert!(offset_of!(P2pdmaDmaMap, segs_ptr) == 56);
    assert!(offset_of!(P2pdmaDmaMap, max_segs) == 64);
    assert!(offset_of!(P2pdmaDmaMap, num_segs) == 68);
    assert!(offset_of!(P2pdmaDmaMap, map_handle) == 72);
    assert!(offset_of!(P2pdmaDmaMap, map_type) == 80);
    assert!(offset_of!(P2pdmaDmaMap, pad1) == 84);
    assert!(offset_of!(P2pdmaDmaMap, reserved) == 88);

    assert!(size_of::<P2pdmaUnmap>() == 32);

    assert!(size_of::<P2pdmaEventfd>() == 24);
    assert!(offset_of!(P2pdmaEventfd, flags) == 4);
    assert!(offset_of!(P2pdmaEventfd, reserved) == 8);

    assert!(size_of::<P2pdmaHandleState>() == 32);
    assert!(offset_of!(P2pdmaHandleState, flags) == 8);
    assert!(offset_of!(P2pdmaHandleState, state) == 12);
    assert!(offset_of!(P2pdmaHandleState, reserved) == 16);

    assert!(size_of::<P2pdmaIoSeg>() == 24);
    assert!(offset_of!(P2pdmaIoSeg, dev_offset) == 8);
    assert!(offset_of!(P2pdmaIoSeg, len) == 16);

    assert!(size_of::<P2pdmaBlockIo>() == 72);
    assert!(offset_of!(P2pdmaBlockIo, fd) == 8);
    assert!(offset_of!(P2pdmaBlockIo, flags) == 12);
    assert!(offset_of!(P2pdmaBlockIo, segs_ptr) == 16);
    assert!(offset_of!(P2pdmaBlockIo, num_segs) == 24);
    assert!(offset_of!(P2pdmaBlockIo, depth) == 28);
    assert!(offset_of!(P2pdmaBlockIo, bytes) == 32);
    assert!(offset_of!(P2pdmaBlockIo, reserved) == 40);

    assert!(P2PDMA_IOC_GET_VERSION == 0x8038_BC00);
    assert!(P2PDMA_IOC_DEVICE_INFO == 0xC058_BC01);
    assert!(P2PDMA_IOC_ALLOC == 0xC048_BC02);
    assert!(P2PDMA_IOC_FREE == 0x4020_BC03);
    assert!(P2PDMA_IOC_P2P_QUERY == 0xC0C0_BC04);
    assert!(P2PDMA_IOC_DMA_MAP == 0xC078_BC05);
    assert!(P2PDMA_IOC_PIN_USER == 0xC078_BC06);
    assert!(P2PDMA_IOC_UNMAP == 0x4020_BC07);
    assert!(P2PDMA_IOC_DMABUF_IMPORT == 0xC078_BC08);
    assert!(P2PDMA_IOC_SET_EVENTFD == 0x4018_BC09);
    assert!(P2PDMA_IOC_HANDLE_STATE == 0xC020_BC0A);
    assert!(P2PDMA_IOC_BLOCK_IO == 0xC048_BC0B);
};
