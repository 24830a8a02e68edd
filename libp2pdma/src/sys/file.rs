//! The file system calls the transfer paths make beyond read and write:
//! `FS_IOC_FIEMAP` (a file's extents), `FS_IOC_FSGETXATTR`,
//! `sync_file_range`, `cachestat` and `mincore` (what of a range is in the
//! page cache), reads into raw memory (`preadv2`, with `RWF_NOWAIT` for
//! only what the page cache holds) and open-file-description locks.
#![allow(unsafe_code)]

use std::os::fd::BorrowedFd;

use rustix::{
    io::Errno,
    ioctl::{ioctl, opcode, Getter, Opcode, Updater},
};

/// Extents per FIEMAP call.
pub const EXTENTS_PER_CALL: usize = 128;

/// `struct fiemap`, without its flexible array.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Fiemap {
    pub fm_start: u64,
    pub fm_length: u64,
    pub fm_flags: u32,
    pub fm_mapped_extents: u32,
    pub fm_extent_count: u32,
    pub fm_reserved: u32,
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct FiemapExtent {
    pub fe_logical: u64,
    pub fe_physical: u64,
    pub fe_length: u64,
    pub fe_reserved64: [u64; 2],
    pub fe_flags: u32,
    pub fe_reserved: [u32; 3],
}

/// `struct fiemap` with room for [`EXTENTS_PER_CALL`] extents.
#[repr(C)]
pub struct FiemapBuf {
    pub head: Fiemap,
    pub extents: [FiemapExtent; EXTENTS_PER_CALL],
}

impl Default for FiemapBuf {
    fn default() -> Self {
        Self {
            head: Fiemap::default(),
            extents: [FiemapExtent::default(); EXTENTS_PER_CALL],
        }
    }
}

const _: () = assert!(std::mem::size_of::<Fiemap>() == 32);
const _: () = assert!(std::mem::size_of::<FiemapExtent>() == 56);
const _: () = assert!(std::mem::offset_of!(FiemapBuf, extents) == 32);

/// `_IOWR('f', 11, struct fiemap)`.
const FS_IOC_FIEMAP: Opcode = opcode::read_write::<Fiemap>(b'f', 11);
const _: () = assert!(FS_IOC_FIEMAP == 0xC020_660B as Opcode);

/// `struct fsxattr`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FsXattr {
    fsx_xflags: u32,
    fsx_extsize: u32,
    fsx_nextents: u32,
    fsx_projid: u32,
    fsx_cowextsize: u32,
    fsx_pad: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<FsXattr>() == 28);

/// `_IOR('X', 31, struct fsxattr)`.
const FS_IOC_FSGETXATTR: Opcode = opcode::read::<FsXattr>(b'X', 31);
const _: () = assert!(FS_IOC_FSGETXATTR == 0x801C_581F as Opcode);

/// `sync_file_range(fd, offset, len, WAIT_BEFORE | WRITE | WAIT_AFTER)`:
/// writes the range's dirty page-cache pages back and waits for them.
pub fn write_back(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let (offset, len) = (
        i64::try_from(offset).map_err(|_| Errno::INVAL)?,
        i64::try_from(len).map_err(|_| Errno::INVAL)?,
    );
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: Plain integers and a borrowed, open descriptor; the kernel
    // reads no memory of ours.
    match unsafe { libc::sync_file_range(fd.as_raw_fd(), offset, len, flags) } {
        0 => Ok(()),
        _ => Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO)),
    }
}

/// Takes (`lock`) or drops a write lock on bytes `[offset, offset + len)`
/// of `fd`'s file, without waiting (`F_OFD_SETLK`): `EAGAIN` when another
/// open file description holds a lock over them. The lock belongs to the
/// open file description, not to a process: it lasts until dropped or
/// until the description's last reference goes, and an I/O still in
/// flight holds one (an io_uring request keeps its file until it
/// completes, also after the process that submitted it died).
pub fn ofd_lock(fd: BorrowedFd<'_>, offset: u64, len: u64, lock: bool) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` is plain integers, for which zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = i64::try_from(offset).map_err(|_| Errno::INVAL)?;
    fl.l_len = i64::try_from(len).map_err(|_| Errno::INVAL)?;
    // SAFETY: A borrowed, open descriptor and a `flock` that lives across
    // the call; the kernel reads it and, for this command, writes nothing.
    match unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) } {
        0 => Ok(()),
        _ => Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO)),
    }
}

/// Pages of `[offset, offset + len)` of `fd` in the page cache
/// (`mincore` on a shared read-only mapping of the range, made and
/// dropped here; mapping a file does not populate anything).
pub fn resident_pages(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<usize, Errno> {
    Ok(mincore_map(fd, offset, len)?
        .iter()
        .filter(|&&b| b & 1 != 0)
        .count())
}

/// `mincore`'s vector for `[offset, offset + len)` of `fd`, from the page
/// holding `offset`.
fn mincore_map(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<Vec<u8>, Errno> {
    use std::os::fd::AsRawFd;
    const PAGE: u64 = 4096;
    let start = offset - offset % PAGE;
    let end = offset.checked_add(len).ok_or(Errno::INVAL)?.div_ceil(PAGE) * PAGE;
    let bytes = usize::try_from(end - start).map_err(|_| Errno::INVAL)?;
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let off = libc::off_t::try_from(start).map_err(|_| Errno::INVAL)?;
    let last = || Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO);
    // SAFETY: A new shared read-only mapping at an address the kernel
    // picks, so it overlaps nothing Rust uses; it is never read here.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(last());
    }
    let mut vec = vec![0u8; bytes / PAGE as usize];
    // SAFETY: `addr..addr + bytes` is the mapping just made; `vec` has a
    // byte for each of its pages.
    let r = unsafe { libc::mincore(addr, bytes, vec.as_mut_ptr()) };
    let err = (r != 0).then(last);
    // SAFETY: The mapping made above, referred to by nothing else.
    unsafe { libc::munmap(addr, bytes) };
    match err {
        Some(e) => Err(e),
        None => Ok(vec),
    }
}

/// `cachestat(2)`'s system call number: one number on every architecture
/// since Linux 6.5 (the unified table).
const SYS_CACHESTAT: libc::c_long = 451;

/// What `cachestat(2)` says of a range: pages, not bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cachestat {
    /// Pages in the page cache.
    pub nr_cache: u64,
    /// Of those, dirty.
    pub nr_dirty: u64,
    /// Of those, being written back.
    pub nr_writeback: u64,
    /// Pages evicted.
    pub nr_evicted: u64,
    /// Pages evicted recently enough to count as refaults.
    pub nr_recently_evicted: u64,
}

/// `struct cachestat_range`.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// The page-cache state of `[offset, offset + len)` of `fd` (`len > 0`):
/// one system call, which walks only the cached part of the range.
/// `ENOSYS` on kernels before 6.5; `EBADF` for files it does not cover
/// (hugetlbfs).
pub fn cachestat(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<Cachestat, Errno> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        // 0 would mean "to the end of the file".
        return Err(Errno::INVAL);
    }
    let range = CachestatRange { off: offset, len };
    let mut out = Cachestat::default();
    // SAFETY: `range` and `out` are live `#[repr(C)]` structs of the
    // kernel's layout; the kernel reads the first and writes the second.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &range as *const CachestatRange,
            &mut out as *mut Cachestat,
            0 as libc::c_uint,
        )
    };
    match r {
        0 => Ok(out),
        _ => Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO)),
    }
}

/// Which pages of `[offset, offset + len)` of `fd` are in the page cache,
/// one flag per page from the page holding `offset` (`mincore` on a
/// mapping of the range, made and dropped here).
pub fn resident_map(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<Vec<bool>, Errno> {
    Ok(mincore_map(fd, offset, len)?
        .into_iter()
        .map(|b| b & 1 != 0)
        .collect())
}

/// Reads up to `len` bytes at `offset` of `fd` into `ptr` (`preadv2`);
/// with `nowait`, only what the page cache holds (`RWF_NOWAIT`: `EAGAIN`
/// when the first page is not cached, a short count where the cached part
/// ends). Returns the bytes read, 0 at the end of the file.
///
/// # Safety
/// `ptr..ptr + len` must be valid for writes, and nothing may rely on its
/// contents while the call runs.
pub unsafe fn pread_raw(
    fd: BorrowedFd<'_>,
    ptr: *mut u8,
    len: usize,
    offset: u64,
    nowait: bool,
) -> Result<usize, Errno> {
    use std::os::fd::AsRawFd;
    let iov = libc::iovec {
        iov_base: ptr.cast(),
        iov_len: len,
    };
    let off = libc::off_t::try_from(offset).map_err(|_| Errno::INVAL)?;
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    // SAFETY: One iovec describing memory the caller vouches for; the
    // kernel writes at most `len` bytes into it.
    let r = unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, off, flags) };
    usize::try_from(r)
        .map_err(|_| Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO))
}

/// Maps `buf.head.fm_start..+fm_length` with `buf.head.fm_flags`; the
/// kernel fills `buf.extents` and `fm_mapped_extents`.
#[doc(alias = "FS_IOC_FIEMAP")]
pub fn fiemap(fd: BorrowedFd<'_>, buf: &mut FiemapBuf) -> Result<(), Errno> {
    // The kernel writes at most this many extents after the header.
    buf.head.fm_extent_count = EXTENTS_PER_CALL as u32;
    // SAFETY: The request code is an `_IOWR` of `struct fiemap`, whose
    // flexible array the kernel writes up to `fm_extent_count` entries
    // of; `FiemapBuf` is that header followed by exactly that many
    // entries (offsets asserted above), all plain integers.
    unsafe { ioctl(fd, Updater::<FS_IOC_FIEMAP, FiemapBuf>::new(buf)) }
}

/// The file's `fsx_xflags` (`FS_XFLAG_*`).
#[doc(alias = "FS_IOC_FSGETXATTR")]
pub fn fsgetxattr_xflags(fd: BorrowedFd<'_>) -> Result<u32, Errno> {
    // SAFETY: The request code is an `_IOR` of exactly `struct fsxattr`,
    // plain integers, which the kernel writes in full.
    unsafe { ioctl(fd, Getter::<FS_IOC_FSGETXATTR, FsXattr>::new()) }.map(|x| x.fsx_xflags)
}
