//! Reads served from the page cache: what the kernel already holds in
//! memory is copied from there (a buffered read straight into the memory's
//! CPU mapping where it has one, through a host buffer into its copies
//! otherwise), instead of moving it from the device again. What of a range
//! is cached comes from `cachestat(2)` (one call, which walks only the
//! cached part), and, where that finds part of it cached or the kernel has
//! no `cachestat`, page by page from `mincore`.

use std::ops::Range;

use rustix::io::Errno;

use crate::{
    memory::DeviceMemory,
    sys::file::{cachestat, pread_raw, resident_map},
    transfer::storage::StorageFile,
    Error, Result,
};

/// Bytes per page, as the page cache counts them.
pub(crate) const PAGE: u64 = 4096;

/// Bytes staged at a time for memory without a CPU mapping.
const STAGE: usize = 4 << 20;

/// What the kernel says of the pages of `range` of `file`.
pub(crate) enum Cached {
    /// Every page.
    All,
    /// None.
    None,
    /// A flag per page, from the page holding `range.start`.
    Pages(Vec<bool>),
    /// Not known.
    Unknown,
}

/// What of `range` (not empty) of `file` is in the page cache.
pub(crate) fn residency(file: &StorageFile, range: &Range<u64>) -> Cached {
    let Ok(fd) = file.buffered_fd() else {
        return Cached::Unknown;
    };
    let first = range.start - range.start % PAGE;
    let pages = (range.end.div_ceil(PAGE) * PAGE - first) / PAGE;
    match cachestat(fd, first, pages * PAGE) {
        Ok(c) if c.nr_cache == 0 => return Cached::None,
        Ok(c) if c.nr_cache >= pages => return Cached::All,
        _ => {}
    }
    match resident_map(fd, range.start, range.end - range.start) {
        Ok(map) if map.iter().all(|&c| c) => Cached::All,
        Ok(map) if !map.iter().any(|&c| c) => Cached::None,
        Ok(map) => Cached::Pages(map),
        Err(_) => Cached::Unknown,
    }
}

/// Reads `len` bytes at `file_offset` of `file` through the page cache
/// into `mem` at `mem_offset` (checked by the caller): with `nowait`, only
/// as far as the page cache holds them (`RWF_NOWAIT`), and the bytes read
/// are returned, 0 where the first page is not cached; otherwise all of
/// them, reading what is not cached, and the end of the file is
/// [`Error::EndOfFile`].
pub(crate) fn read(
    file: &StorageFile,
    file_offset: u64,
    mem: &dyn DeviceMemory,
    mem_offset: usize,
    len: usize,
    nowait: bool,
) -> Result<usize> {
    let fd = file.buffered_fd()?;
    let target = mem.dma().and_then(|d| d.dma_target());
    let mut staged = Vec::new();
    let mut done = 0usize;
    while done < len {
        let at = file_offset + done as u64;
        let want = match target {
            Some(_) => len - done,
            None => (len - done).min(STAGE),
        };
        let r = match target {
            Some(t) => {
                debug_assert!(mem_offset + len <= t.len);
                // SAFETY: `t` is the memory's CPU mapping, which its
                // `DmaMemory` keeps valid for writes while `mem` lives and
                // which nothing reads through a Rust reference; the range
                // is inside it (the caller checked it against `mem.len()`,
                // and the mapping is at least that long).
                #[allow(unsafe_code)]
                let r = unsafe { pread_raw(fd, t.ptr.add(mem_offset + done), want, at, nowait) };
                r
            }
            None => {
                staged.resize(want, 0);
                // SAFETY: `staged` is this function's own buffer, `want`
                // bytes long.
                #[allow(unsafe_code)]
                let r = unsafe { pread_raw(fd, staged.as_mut_ptr(), want, at, nowait) };
                if let Ok(n) = r {
                    mem.write_at(mem_offset + done, &staged[..n])?;
                }
                r
            }
        };
        match r {
            Ok(0) if nowait => break,
            Ok(0) => {
                return Err(Error::EndOfFile {
                    path: file.path().to_path_buf(),
                    offset: file_offset,
                    len: len as u64,
                    size: file.current_size()?,
                })
            }
            // A short count without waiting: the cached part (or the
            // file) ended there.
            Ok(n) if nowait && n < want => return Ok(done + n),
            Ok(n) => done += n,
            Err(Errno::AGAIN) if nowait => break,
            Err(Errno::INTR) => {}
            Err(e) => {
                return Err(file.io_error(
                    "read through the page cache",
                    at,
                    (len - done) as u64,
                    e,
                ))
            }
        }
    }
    Ok(done)
}
