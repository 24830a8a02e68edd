//! One function per ioctl of `/dev/p2pdma` (and `UDMABUF_CREATE` of
//! `/dev/udmabuf`): each passes the kernel pointers to memory it owns for the
//! duration of the call. Those that act on an allocation or a mapping named
//! by a raw handle (`FREE`, `UNMAP`, `BLOCK_IO`) are `unsafe`: a number can
//! name memory another owner, or a device, is using.
#![allow(unsafe_code)]

use std::{
    ffi::c_void,
    os::fd::{AsFd, FromRawFd, OwnedFd},
    ptr,
};

use p2pdma_abi as abi;
use rustix::{
    io::Errno,
    ioctl::{ioctl, Getter, Ioctl, IoctlOutput, Opcode, Setter, Updater},
};

/// Returns the module's ABI version and capabilities.
#[doc(alias = "P2PDMA_IOC_GET_VERSION")]
pub fn get_version(fd: impl AsFd) -> Result<abi::P2pdmaVersion, Errno> {
    // SAFETY: The request code is an `_IOR` of exactly `P2pdmaVersion`, which
    // is plain integers, so the kernel writes a valid value.
    unsafe {
        ioctl(
            fd,
            Getter::<{ abi::P2PDMA_IOC_GET_VERSION as Opcode }, abi::P2pdmaVersion>::new(),
        )
    }
}

/// Describes the accelerator at stable index `index`; `ENODEV` when none.
#[doc(alias = "P2PDMA_IOC_DEVICE_INFO")]
pub fn device_info(fd: impl AsFd, index: u32) -> Result<abi::P2pdmaDeviceInfo, Errno> {
    let mut info = abi::P2pdmaDeviceInfo {
        index,
        ..Default::default()
    };
    device_info_raw(fd, &mut info)?;
    Ok(info)
}

/// `DEVICE_INFO` with a caller-built argument, updated in place (also on
/// error). For callers that need to send non-zero `flags` or `reserved`.
#[doc(alias = "P2PDMA_IOC_DEVICE_INFO")]
pub fn device_info_raw(fd: impl AsFd, info: &mut abi::P2pdmaDeviceInfo) -> Result<(), Errno> {
    // SAFETY: The request code is an `_IOWR` of exactly `P2pdmaDeviceInfo`,
    // which the kernel reads and rewrites in place; all of it is integers.
    unsafe {
        ioctl(
            fd,
            Updater::<{ abi::P2PDMA_IOC_DEVICE_INFO as Opcode }, abi::P2pdmaDeviceInfo>::new(info),
        )
    }
}

/// Allocates accelerator memory. `arg` carries the request in and the
/// allocation (handle, rounded size, mmap offset) out.
#[doc(alias = "P2PDMA_IOC_ALLOC")]
pub fn alloc(fd: impl AsFd, arg: &mut abi::P2pdmaAlloc) -> Result<(), Errno> {
    // SAFETY: The request code is an `_IOWR` of exactly `P2pdmaAlloc`, which
    // the kernel reads and rewrites in place; all of it is integers.
    unsafe {
        ioctl(
            fd,
            Updater::<{ abi::P2PDMA_IOC_ALLOC as Opcode }, abi::P2pdmaAlloc>::new(arg),
        )
    }
}

/// Frees the allocation named by `arg.handle`.
///
/// # Safety
///
/// The caller owns the allocation, or has its owner's leave to free it: no
/// one uses the handle afterwards.
#[doc(alias = "P2PDMA_IOC_FREE")]
pub unsafe fn free(fd: impl AsFd, arg: abi::P2pdmaFree) -> Result<(), Errno> {
    // SAFETY: The request code is an `_IOW` of exactly `P2pdmaFree`, which the
    // kernel only reads; the caller owns the allocation.
    unsafe {
        ioctl(
            fd,
            Setter::<{ abi::P2PDMA_IOC_FREE as Opcode }, abi::P2pdmaFree>::new(arg),
        )
    }
}

/// Asks whether, and how, a peer can reach an accelerator's memory. `arg` is
/// updated in place, also on error.
#[doc(alias = "P2PDMA_IOC_P2P_QUERY")]
pub fn p2p_query(fd: impl AsFd, arg: &mut abi::P2pdmaP2pQuery) -> Result<(), Errno> {
    // SAFETY: The request code is an `_IOWR` of exactly `P2pdmaP2pQuery`,
    // which the kernel reads and rewrites in place; all of it is integers and
    // byte arrays.
    unsafe {
        ioctl(
            fd,
            Updater::<{ abi::P2PDMA_IOC_P2P_QUERY as Opcode }, abi::P2pdmaP2pQuery>::new(arg),
        )
    }
}

/// The argument of the three mapping ioctls, with the segment array the
/// kernel fills in.
struct DmaMapArg<'a, const OPCODE: Opcode> {
    arg: &'a mut abi::P2pdmaDmaMap,
}

// SAFETY: `OPCODE` is one of `DMA_MAP`, `PIN_USER` and `DMABUF_IMPORT`, all
// `_IOWR` of exactly `P2pdmaDmaMap`, which the kernel reads and rewrites in
// place. The kernel also writes up to `max_segs` `P2pdmaDmaSeg`s at
// `segs_ptr`, which `dma_map_common` points at a live, exclusively borrowed
// slice of at least that many elements.
unsafe impl<const OPCODE: Opcode> Ioctl for DmaMapArg<'_, OPCODE> {
    type Output = ();

    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        OPCODE
    }

    fn as_ptr(&mut self) -> *mut c_void {
        ptr::from_mut(self.arg).cast()
    }

    unsafe fn output_from_ptr(_out: IoctlOutput, _ptr: *mut c_void) -> rustix::io::Result<()> {
        Ok(())
    }
}

fn dma_map_common<const OPCODE: Opcode>(
    fd: impl AsFd,
    arg: &mut abi::P2pdmaDmaMap,
    segs: &mut [abi::P2pdmaDmaSeg],
) -> Result<(), Errno> {
    arg.segs_ptr = segs.as_mut_ptr() as u64;
    arg.max_segs = u32::try_from(segs.len()).unwrap_or(u32::MAX);
    // SAFETY: See the `Ioctl` implementation: `segs_ptr`/`max_segs` describe
    // `segs`, which stays borrowed for the whole call.
    unsafe { ioctl(fd, DmaMapArg::<OPCODE> { arg }) }
}

/// DMA-maps a range of an allocation for a peer. `segs_ptr` and `max_segs`
/// are set from `segs`, which receives the peer's addresses; `arg` is
/// updated in place, also on error (`num_segs` with `ENOSPC`).
#[doc(alias = "P2PDMA_IOC_DMA_MAP")]
pub fn dma_map(
    fd: impl AsFd,
    arg: &mut abi::P2pdmaDmaMap,
    segs: &mut [abi::P2pdmaDmaSeg],
) -> Result<(), Errno> {
    dma_map_common::<{ abi::P2PDMA_IOC_DMA_MAP as Opcode }>(fd, arg, segs)
}

/// Pins a host user buffer and DMA-maps it for a peer; as [`dma_map`].
///
/// Pinning only makes the buffer reachable by the peer; nothing here starts a
/// transfer.
#[doc(alias = "P2PDMA_IOC_PIN_USER")]
pub fn pin_user(
    fd: impl AsFd,
    arg: &mut abi::P2pdmaDmaMap,
    segs: &mut [abi::P2pdmaDmaSeg],
) -> Result<(), Errno> {
    dma_map_common::<{ abi::P2PDMA_IOC_PIN_USER as Opcode }>(fd, arg, segs)
}

/// Imports a dma-buf (`arg.dmabuf_fd`) for a peer; as [`dma_map`].
#[doc(alias = "P2PDMA_IOC_DMABUF_IMPORT")]
pub fn dmabuf_import(
    fd: impl AsFd,
    arg: &mut abi::P2pdmaDmaMap,
    segs: &mut [abi::P2pdmaDmaSeg],
) -> Result<(), Errno> {
    dma_map_common::<{ abi::P2PDMA_IOC_DMABUF_IMPORT as Opcode }>(fd, arg, segs)
}

/// Releases a mapping made by [`dma_map`], [`pin_user`] or
/// [`dmabuf_import`].
///
/// # Safety
///
/// No device uses the mapping `arg.map_handle` names any more, and no one
/// will hand its addresses to one: a pinned page it releases can be reused
/// for anything while a device still writes it.
#[doc(alias = "P2PDMA_IOC_UNMAP")]
pub unsafe fn unmap(fd: impl AsFd, arg: abi::P2pdmaUnmap) -> Result<(), Errno> {
    // SAFETY: The request code is an `_IOW` of exactly `P2pdmaUnmap`, which
    // the kernel only reads; the caller vouches that the mapping is unused.
    unsafe {
        ioctl(
            fd,
            Setter::<{ abi::P2PDMA_IOC_UNMAP as Opcode }, abi::P2pdmaUnmap>::new(arg),
        )
    }
}

/// Has the eventfd in `arg` signalled when a resource of this file is
/// revoked (`fd = -1` stops it).
#[doc(alias = "P2PDMA_IOC_SET_EVENTFD")]
pub fn set_eventfd(fd: impl AsFd, arg: abi::P2pdmaEventfd) -> Result<(), Errno> {
    // SAFETY: The request code is an `_IOW` of exactly `P2pdmaEventfd`, which
    // the kernel only reads.
    unsafe {
        ioctl(
            fd,
            Setter::<{ abi::P2PDMA_IOC_SET_EVENTFD as Opcode }, abi::P2pdmaEventfd>::new(arg),
        )
    }
}

/// Whether an allocation or mapping handle is live or revoked; `arg.state`
/// is set in place.
#[doc(alias = "P2PDMA_IOC_HANDLE_STATE")]
pub fn handle_state(fd: impl AsFd, arg: &mut abi::P2pdmaHandleState) -> Result<(), Errno> {
    // SAFETY: The request code is an `_IOWR` of exactly `P2pdmaHandleState`,
    // which the kernel reads and rewrites in place; all of it is integers.
    unsafe {
        ioctl(
            fd,
            Updater::<{ abi::P2PDMA_IOC_HANDLE_STATE as Opcode }, abi::P2pdmaHandleState>::new(arg),
        )
    }
}

/// The argument of `BLOCK_IO`, with the segment array the kernel reads.
struct BlockIoArg<'a> {
    arg: &'a mut abi::P2pdmaBlockIo,
}

// SAFETY: `P2PDMA_IOC_BLOCK_IO` is an `_IOWR` of exactly `P2pdmaBlockIo`,
// which the kernel reads and rewrites in place. It only reads the
// `num_segs` `P2pdmaIoSeg`s at `segs_ptr` (copying them in, `EFAULT` where
// they are not mapped), so whatever the pointer, no memory of this process
// is written but the argument.
unsafe impl Ioctl for BlockIoArg<'_> {
    type Output = ();

    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        abi::P2PDMA_IOC_BLOCK_IO as Opcode
    }

    fn as_ptr(&mut self) -> *mut c_void {
        ptr::from_mut(self.arg).cast()
    }

    unsafe fn output_from_ptr(_out: IoctlOutput, _ptr: *mut c_void) -> rustix::io::Result<()> {
        Ok(())
    }
}

/// Moves data between a block device and an allocation by block I/O the
/// module submits. `segs_ptr` and `num_segs` are set from `segs`; `arg` is
/// updated in place (`bytes`).
///
/// # Safety
///
/// A read (no `P2PDMA_IO_WRITE` in `arg.flags`) has storage write the
/// allocation `arg.handle` names: the caller owns it, or has its owner's
/// leave to write it, and nothing trusts its contents for memory safety (no
/// device reads its queues or descriptors from it).
#[doc(alias = "P2PDMA_IOC_BLOCK_IO")]
pub unsafe fn block_io(
    fd: impl AsFd,
    arg: &mut abi::P2pdmaBlockIo,
    segs: &[abi::P2pdmaIoSeg],
) -> Result<(), Errno> {
    arg.segs_ptr = segs.as_ptr() as u64;
    arg.num_segs = u32::try_from(segs.len()).map_err(|_| Errno::INVAL)?;
    // SAFETY: The caller vouches for the allocation.
    unsafe { block_io_raw(fd, arg) }
}

/// [`block_io`] with `segs_ptr` and `num_segs` as the caller set them: the
/// kernel only reads the segments, so any pointer there is harmless (a bad
/// one gives `EFAULT`).
///
/// # Safety
///
/// As for [`block_io`].
#[doc(alias = "P2PDMA_IOC_BLOCK_IO")]
pub unsafe fn block_io_raw(fd: impl AsFd, arg: &mut abi::P2pdmaBlockIo) -> Result<(), Errno> {
    // SAFETY: See the `Ioctl` implementation; the caller vouches for the
    // allocation.
    unsafe { ioctl(fd, BlockIoArg { arg }) }
}

/// An argument address that can never point at memory of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidPointer {
    /// Address zero.
    Null,
    /// The last page of the address space, which belongs to the kernel.
    KernelHalf,
}

impl InvalidPointer {
    fn addr(self) -> usize {
        match self {
            InvalidPointer::Null => 0,
            InvalidPointer::KernelHalf => usize::MAX & !0xfff,
        }
    }
}

/// An ioctl whose argument is a bare address.
struct AddrArg {
    opcode: Opcode,
    addr: usize,
}

// SAFETY: The address is one of `InvalidPointer`'s, which no object of this
// process can live at, so whatever the kernel does with it cannot touch Rust
// memory; the call's output is only its return value.
unsafe impl Ioctl for AddrArg {
    type Output = IoctlOutput;

    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        self.opcode
    }

    fn as_ptr(&mut self) -> *mut c_void {
        ptr::without_provenance_mut(self.addr)
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _ptr: *mut c_void,
    ) -> rustix::io::Result<IoctlOutput> {
        Ok(out)
    }
}

/// Issues `request` on `fd` with an argument address that is not memory of
/// this process. A driver must answer `EFAULT` (or `ENOTTY` for a request it
/// does not know); this exists to test that it does.
pub fn ioctl_invalid_pointer(
    fd: impl AsFd,
    request: u32,
    pointer: InvalidPointer,
) -> Result<i32, Errno> {
    // SAFETY: See the `Ioctl` implementation of `AddrArg`.
    unsafe {
        ioctl(
            fd,
            AddrArg {
                opcode: request as Opcode,
                addr: pointer.addr(),
            },
        )
    }
}

/// `struct udmabuf_create` of `<linux/udmabuf.h>`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct UdmabufCreateArg {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// `UDMABUF_FLAGS_CLOEXEC`.
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;

/// `UDMABUF_CREATE`, `_IOW('u', 0x42, struct udmabuf_create)`.
const UDMABUF_CREATE: Opcode = rustix::ioctl::opcode::write::<UdmabufCreateArg>(b'u', 0x42);

struct UdmabufCreate(UdmabufCreateArg);

// SAFETY: `UDMABUF_CREATE` reads a `struct udmabuf_create` (plain integers,
// this exact layout) and returns a new file descriptor, which becomes owned
// by the caller.
unsafe impl Ioctl for UdmabufCreate {
    type Output = OwnedFd;

    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        UDMABUF_CREATE
    }

    fn as_ptr(&mut self) -> *mut c_void {
        ptr::from_mut(&mut self.0).cast()
    }

    unsafe fn output_from_ptr(out: IoctlOutput, _ptr: *mut c_void) -> rustix::io::Result<OwnedFd> {
        // SAFETY: A successful `UDMABUF_CREATE` returns a new descriptor that
        // nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(out) })
    }
}

/// Creates a dma-buf over `size` bytes at `offset` of a sealed memfd through
/// `/dev/udmabuf` (`udmabuf_dev`). The new descriptor is close-on-exec.
#[doc(alias = "UDMABUF_CREATE")]
pub fn udmabuf_create(
    udmabuf_dev: impl AsFd,
    memfd: impl AsFd,
    offset: u64,
    size: u64,
) -> Result<OwnedFd, Errno> {
    use std::os::fd::AsRawFd;
    let memfd = u32::try_from(memfd.as_fd().as_raw_fd()).map_err(|_| Errno::BADF)?;
    // SAFETY: See the `Ioctl` implementation of `UdmabufCreate`.
    unsafe {
        ioctl(
            udmabuf_dev,
            UdmabufCreate(UdmabufCreateArg {
                memfd,
                flags: UDMABUF_FLAGS_CLOEXEC,
                offset,
                size,
            }),
        )
    }
}

/// `struct dma_buf_sync`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DmaBufSyncArg {
    flags: u64,
}

/// `DMA_BUF_IOCTL_SYNC`, `_IOW('b', 0, struct dma_buf_sync)`.
const DMA_BUF_IOCTL_SYNC: Opcode = rustix::ioctl::opcode::write::<DmaBufSyncArg>(b'b', 0);

/// Which CPU access a [`dmabuf_sync`] brackets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmabufAccess {
    /// The CPU reads.
    Read,
    /// The CPU writes.
    Write,
    /// The CPU reads and writes.
    ReadWrite,
}

/// `DMA_BUF_IOCTL_SYNC`: the start (`end` false) or the end of CPU access
/// to a mapped dma-buf, which lets the exporter flush or invalidate caches.
#[doc(alias = "DMA_BUF_IOCTL_SYNC")]
pub fn dmabuf_sync(dmabuf: impl AsFd, access: DmabufAccess, end: bool) -> Result<(), Errno> {
    const READ: u64 = 1;
    const WRITE: u64 = 2;
    const END: u64 = 4;
    let flags = match access {
        DmabufAccess::Read => READ,
        DmabufAccess::Write => WRITE,
        DmabufAccess::ReadWrite => READ | WRITE,
    } | if end { END } else { 0 };
    // SAFETY: DMA_BUF_IOCTL_SYNC reads one u64 of flags, this layout.
    unsafe {
        ioctl(
            dmabuf,
            rustix::ioctl::Setter::<{ DMA_BUF_IOCTL_SYNC }, DmaBufSyncArg>::new(DmaBufSyncArg {
                flags,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udmabuf_create_matches_the_kernel_header() {
        // `_IOW('u', 0x42, struct udmabuf_create)` of <linux/udmabuf.h>.
        assert_eq!(std::mem::size_of::<UdmabufCreateArg>(), 24);
        assert_eq!(UDMABUF_CREATE, 0x4018_7542);
    }

    #[test]
    fn ioctls_on_a_foreign_fd_fail_cleanly() {
        let memfd = rustix::fs::memfd_create("sys-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert_eq!(get_version(&memfd).unwrap_err(), Errno::NOTTY);
        assert_eq!(
            ioctl_invalid_pointer(&memfd, abi::P2PDMA_IOC_ALLOC, InvalidPointer::Null),
            Err(Errno::NOTTY)
        );
        let mut arg = abi::P2pdmaDmaMap::default();
        assert_eq!(dma_map(&memfd, &mut arg, &mut []), Err(Errno::NOTTY));
        assert_eq!(arg.max_segs, 0);
    }
}
