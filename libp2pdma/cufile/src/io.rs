//! Synchronous reads and writes, with `pread`/`pwrite` semantics: a read
//! that reaches past the end of the file moves the bytes up to it and says
//! how many, a read at or after the end moves nothing and returns 0; a
//! write moves every byte or fails, growing the file as `pwrite` does.
//!
//! Every call is independent: many threads may read and write through the
//! same handle at once (KvikIO splits a transfer over a thread pool).

use std::{ffi::c_void, time::Instant};

use libc::off_t;
use p2pdma::{DeviceMemory, Direction, Error, MemRange};

use crate::{
    abi::CUfileIOVec,
    buffers, driver,
    errors::{guard_ssize, Fail, Res},
    handles::{self, FileEntry},
    stats::{self, Moved},
};

/// How often a read is redone when the file shrinks under it.
const SHRINK_RETRIES: usize = 3;

/// Reads up to `len` bytes at `file_offset` into `mem` at `mem_offset`,
/// stopping at the end of the file; the bytes read.
pub fn read(
    entry: &FileEntry,
    file_offset: u64,
    mem: &dyn DeviceMemory,
    mem_offset: usize,
    len: usize,
) -> Res<Moved> {
    let engine = driver::engine()?;
    let gpu = stats::gpu_of(mem.kind());
    for _ in 0..SHRINK_RETRIES {
        let size = entry.file.current_size().map_err(Fail::from)?;
        let n = clamp(size, file_offset, len);
        if n == 0 {
            return Ok(Moved { gpu, ..Moved::NONE });
        }
        let range = MemRange::new(mem, mem_offset, n)?;
        match engine.read(&entry.file, file_offset, range) {
            Ok(r) => {
                return Ok(Moved {
                    bytes: n,
                    path: Some(r.path),
                    gpu,
                })
            }
            // The file shrank between its size and the read: again, with
            // the new size.
            Err(Error::EndOfFile { .. } | Error::Short { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Fail::Os(libc::EIO))
}

/// The bytes of a read of `len` at `offset` that lie before `size`.
pub fn clamp(size: u64, offset: u64, len: usize) -> usize {
    size.saturating_sub(offset).min(len as u64) as usize
}

/// Writes `len` bytes of `mem` at `mem_offset` to `file_offset`.
pub fn write(
    entry: &FileEntry,
    file_offset: u64,
    mem: &dyn DeviceMemory,
    mem_offset: usize,
    len: usize,
) -> Res<Moved> {
    let range = MemRange::new(mem, mem_offset, len)?;
    let r = driver::engine()?
        .write(&entry.file, file_offset, range)
        .map_err(Fail::from)?;
    Ok(Moved {
        bytes: len,
        path: Some(r.path),
        gpu: stats::gpu_of(mem.kind()),
    })
}

/// The checks every transfer makes on what C passes, in cuFile's order:
/// the handle, then the buffer and the numbers. The file, the file offset
/// as unsigned, and the size.
pub fn check(
    fh: *mut c_void,
    buf: *const c_void,
    size: usize,
    file_offset: off_t,
    buf_offset: off_t,
) -> Res<(std::sync::Arc<FileEntry>, u64)> {
    let entry = handles::lookup(fh)?;
    if buf.is_null() || file_offset < 0 || buf_offset < 0 || size > isize::MAX as usize {
        return Err(Fail::INVALID);
    }
    let file_offset = file_offset as u64;
    if file_offset.checked_add(size as u64).is_none() {
        return Err(Fail::INVALID);
    }
    Ok((entry, file_offset))
}

/// One synchronous transfer, from C's arguments to the bytes moved.
///
/// # Safety
/// As for `cuFileRead`/`cuFileWrite`: `[buf + buf_offset, + size)` is
/// memory of the caller's (writable for a read), valid during the call.
pub unsafe fn transfer(
    dir: Direction,
    fh: *mut c_void,
    buf: *const c_void,
    size: usize,
    file_offset: off_t,
    buf_offset: off_t,
) -> Res<Moved> {
    let (entry, file_offset) = check(fh, buf, size, file_offset, buf_offset)?;
    if size == 0 {
        return Ok(Moved::NONE);
    }
    let read = matches!(dir, Direction::Read);
    // SAFETY: The caller's; the memory object is dropped before return
    // (the transfer is synchronous).
    let (mem, at) = unsafe { buffers::resolve(buf, buf_offset, size, read) }?;
    let r = match dir {
        Direction::Read => self::read(&entry, file_offset, mem.as_ref(), at, size),
        Direction::Write => self::write(&entry, file_offset, mem.as_ref(), at, size),
    };
    if r.is_err() {
        stats::io_error_on(!read, stats::gpu_of(mem.kind()));
    }
    r
}

/// Runs one transfer of `size` bytes asked for, counting it in the
/// statistics.
pub fn counted(dir: Direction, size: usize, f: impl FnOnce() -> Res<Moved>) -> Res<usize> {
    let start = Instant::now();
    let r = f();
    stats::io(matches!(dir, Direction::Write), size, &r, start.elapsed());
    r.map(|m| m.bytes)
}

/// One vectored transfer: the buffers in order, from `file_offset` on. A
/// read stops at the end of the file; an error after some bytes moved
/// returns those bytes, as `preadv` does.
///
/// # Safety
/// `iov` is NULL or readable for `iovcnt` entries, each buffer valid for
/// its length (writable for a read).
pub unsafe fn vectored(
    dir: Direction,
    fh: *mut c_void,
    iov: *const CUfileIOVec,
    iovcnt: usize,
    file_offset: off_t,
    flags: u32,
) -> Res<Moved> {
    handles::lookup(fh)?;
    if flags != 0 || file_offset < 0 || (iov.is_null() && iovcnt > 0) {
        return Err(Fail::INVALID);
    }
    // SAFETY: Readable for `iovcnt` entries by the caller's contract.
    let v: Vec<CUfileIOVec> = (0..iovcnt)
        .map(|i| unsafe { iov.add(i).read_unaligned() })
        .collect();
    let total = v
        .iter()
        .try_fold(0usize, |t, e| t.checked_add(e.len))
        .filter(|&t| t <= isize::MAX as usize)
        .ok_or(Fail::INVALID)?;
    if v.iter().any(|e| e.base.is_null() && e.len > 0)
        || (file_offset as u64).checked_add(total as u64).is_none()
    {
        return Err(Fail::INVALID);
    }
    let mut moved = Moved::NONE;
    let mut at = file_offset;
    for e in v.iter().filter(|e| e.len > 0) {
        // SAFETY: The caller's, for this entry.
        match unsafe { transfer(dir, fh, e.base, e.len, at, 0) } {
            Ok(m) => {
                let short = m.bytes < e.len;
                at += m.bytes as off_t;
                moved.add(m);
                if short {
                    break;
                }
            }
            Err(f) if moved.bytes == 0 => return Err(f),
            Err(_) => break,
        }
    }
    Ok(moved)
}

/// Reads `size` bytes at `file_offset` of the file into the buffer at
/// `bufPtr_base + bufPtr_offset`; the bytes read: fewer at the end of the
/// file, 0 at or after it.
///
/// Errors: `-1` with `errno` set when the storage or the system fails the
/// read; `-CU_FILE_INVALID_VALUE` for NULL, negative offsets or a range
/// past a registered buffer; `-CU_FILE_HANDLE_NOT_REGISTERED` for an
/// unknown handle; `-CU_FILE_CUDA_DRIVER_ERROR` when the CUDA driver fails.
///
/// # Safety
/// The buffer holds `bufPtr_offset + size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuFileRead(
    fh: *mut c_void,
    bufPtr_base: *mut c_void,
    size: usize,
    file_offset: off_t,
    bufPtr_offset: off_t,
) -> isize {
    guard_ssize(|| {
        counted(Direction::Read, size, || {
            // SAFETY: The caller's.
            unsafe {
                transfer(
                    Direction::Read,
                    fh,
                    bufPtr_base,
                    size,
                    file_offset,
                    bufPtr_offset,
                )
            }
        })
    })
}

/// Writes `size` bytes of the buffer at `bufPtr_base + bufPtr_offset` to
/// `file_offset` of the file, as `pwrite` does; `size` on success, errors
/// as for [`cuFileRead`].
///
/// # Safety
/// The buffer holds `bufPtr_offset + size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuFileWrite(
    fh: *mut c_void,
    bufPtr_base: *const c_void,
    size: usize,
    file_offset: off_t,
    bufPtr_offset: off_t,
) -> isize {
    guard_ssize(|| {
        counted(Direction::Write, size, || {
            // SAFETY: The caller's.
            unsafe {
                transfer(
                    Direction::Write,
                    fh,
                    bufPtr_base,
                    size,
                    file_offset,
                    bufPtr_offset,
                )
            }
        })
    })
}

/// The total length of a vector C passes, for the statistics (0 when it
/// cannot be read).
///
/// # Safety
/// As for [`vectored`].
unsafe fn asked(iov: *const CUfileIOVec, iovcnt: usize) -> usize {
    if iov.is_null() || iovcnt > 1 << 20 {
        return 0;
    }
    // SAFETY: The caller's.
    (0..iovcnt)
        .map(|i| unsafe { iov.add(i).read_unaligned() }.len)
        .fold(0usize, usize::saturating_add)
}

/// Reads from `file_offset` into the `iovcnt` buffers of `iov` in order,
/// as `preadv` does: the bytes read, fewer at the end of the file. `flags`
/// must be 0. Errors as for [`cuFileRead`].
///
/// # Safety
/// `iov` is NULL or readable for `iovcnt` entries, each buffer writable
/// for its length.
#[no_mangle]
pub unsafe extern "C" fn cuFileReadv(
    fh: *mut c_void,
    iov: *const CUfileIOVec,
    iovcnt: usize,
    file_offset: off_t,
    flags: u32,
) -> isize {
    guard_ssize(|| {
        // SAFETY: The caller's.
        counted(Direction::Read, unsafe { asked(iov, iovcnt) }, || unsafe {
            vectored(Direction::Read, fh, iov, iovcnt, file_offset, flags)
        })
    })
}

/// Writes the `iovcnt` buffers of `iov` in order from `file_offset` on, as
/// `pwritev` does: the bytes written. `flags` must be 0. Errors as for
/// [`cuFileWrite`].
///
/// # Safety
/// `iov` is NULL or readable for `iovcnt` entries, each buffer readable
/// for its length.
#[no_mangle]
pub unsafe extern "C" fn cuFileWritev(
    fh: *mut c_void,
    iov: *const CUfileIOVec,
    iovcnt: usize,
    file_offset: off_t,
    flags: u32,
) -> isize {
    guard_ssize(|| {
        // SAFETY: The caller's.
        counted(Direction::Write, unsafe { asked(iov, iovcnt) }, || unsafe {
            vectored(Direction::Write, fh, iov, iovcnt, file_offset, flags)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_end_of_the_file() {
        assert_eq!(clamp(100, 0, 50), 50);
        assert_eq!(clamp(100, 90, 50), 10);
        assert_eq!(clamp(100, 100, 50), 0);
        assert_eq!(clamp(100, 1000, 50), 0);
        assert_eq!(clamp(u64::MAX, 0, usize::MAX), usize::MAX);
    }

    #[test]
    fn bad_arguments_are_refused_before_anything_moves() {
        let buf = [0u8; 8];
        let p = buf.as_ptr().cast::<c_void>();
        assert_eq!(
            check(std::ptr::null_mut(), p, 1, 0, 0).unwrap_err(),
            Fail::INVALID
        );
        assert_eq!(
            check(0x1234 as *mut c_void, p, 1, 0, 0).unwrap_err(),
            Fail::cu(crate::abi::op::HANDLE_NOT_REGISTERED)
        );
    }
}
