//! Reads served from the page cache: what the kernel already holds in
//! memory is copied from there (a buffered read straight into the memory's
//! CPU mapping where it has one; otherwise into the engine's host slots,
//! page-locked for the memory's copy engine where it has one, then by the
//! memory's copies), instead of moving it from the device again. What of a
//! range is cached comes from `cachestat(2)` (one call, which walks only
//! the cached part), and, where that finds part of it cached or the kernel
//! has no `cachestat`, page by page from `mincore`.

use std::{ops::Range, sync::Arc};

use rustix::io::Errno;

use crate::{
    memory::MemRange,
    sys::{
        file::{cachestat, pread_raw, resident_map},
        DmaTarget, HostBuffer,
    },
    transfer::{plan::Residency, storage::StorageFile},
    Error, Result,
};

/// Bytes per page, as the page cache counts them.
const PAGE: u64 = 4096;

/// Bytes staged at a time for memory without a CPU mapping.
const STAGE: usize = 4 << 20;

/// What of `range` (not empty) of `file` is in the page cache.
pub(crate) fn residency(file: &StorageFile, range: &Range<u64>) -> Residency {
    let Ok(fd) = file.buffered_fd() else {
        return Residency::Unknown;
    };
    let first = range.start - range.start % PAGE;
    let pages = (range.end.div_ceil(PAGE) * PAGE - first) / PAGE;
    match cachestat(fd, first, pages * PAGE) {
        Ok(c) if c.nr_cache == 0 => return Residency::None,
        Ok(c) if c.nr_cache >= pages => return Residency::All,
        _ => {}
    }
    match resident_map(fd, range.start, range.end - range.start) {
        Ok(map) if map.iter().all(|&c| c) => Residency::All,
        Ok(map) if !map.iter().any(|&c| c) => Residency::None,
        Ok(map) => Residency::Pages { page: PAGE, map },
        Err(_) => Residency::Unknown,
    }
}

/// Reads `range.len()` bytes at `file_offset` of `file` through the page
/// cache into `range`, staging in `slots` (which nothing else uses
/// meanwhile) when the memory has no CPU mapping and they are given, in a
/// buffer of its own otherwise: with `nowait`, only as far as the page
/// cache holds them (`RWF_NOWAIT`), and the bytes read are returned, 0
/// where the first page is not cached; otherwise all of them, reading what
/// is not cached, and the end of the file is [`Error::EndOfFile`].
pub(crate) fn read(
    file: &StorageFile,
    file_offset: u64,
    range: MemRange<'_>,
    nowait: bool,
    slots: Option<&Arc<HostBuffer>>,
) -> Result<usize> {
    let (mem, mem_offset, len) = (range.mem(), range.offset(), range.len());
    /// Where the page cache's bytes go.
    enum Into<'a> {
        /// The memory's CPU mapping.
        Mapping(DmaTarget),
        /// A host buffer, then the memory's copies.
        Staged(&'a HostBuffer),
    }
    let fd = file.buffered_fd()?;
    let own;
    let into = match (mem.dma().and_then(|d| d.dma_target()), slots) {
        (Some(t), _) => Into::Mapping(t),
        (None, Some(s)) => Into::Staged(s),
        (None, None) => {
            own = HostBuffer::new(len.min(STAGE)).map_err(|e| {
                file.io_error("allocate a staging buffer", file_offset, len as u64, e)
            })?;
            Into::Staged(&own)
        }
    };
    let mut done = 0usize;
    while done < len {
        let at = file_offset + done as u64;
        let (want, r) = match &into {
            Into::Mapping(t) => {
                let want = len - done;
                debug_assert!(mem_offset + len <= t.len);
                // SAFETY: `t` is the memory's CPU mapping, which its
                // `DmaMemory` keeps valid for writes while `mem` lives and
                // which nothing reads through a Rust reference; the range
                // is inside it (the caller checked it against `mem.len()`,
                // and the mapping is at least that long).
                #[allow(unsafe_code)]
                let r = unsafe { pread_raw(fd, t.ptr.add(mem_offset + done), want, at, nowait) };
                (want, r)
            }
            Into::Staged(b) => {
                let want = (len - done).min(b.len());
                // SAFETY: `b` is this read's own buffer, or slots nothing
                // else uses while it runs, at least `want` bytes long.
                #[allow(unsafe_code)]
                let r = unsafe { pread_raw(fd, b.as_raw(), want, at, nowait) };
                if let Ok(n) = r {
                    // SAFETY: As above: nothing else writes the buffer while
                    // the memory copies out of it.
                    #[allow(unsafe_code)]
                    let bytes = unsafe { &b.as_slice()[..n] };
                    mem.write_at(mem_offset + done, bytes)?;
                }
                (want, r)
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
