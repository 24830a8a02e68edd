//! The NVMe-command path: read and write commands built by the library and
//! sent with io_uring passthrough (`IORING_OP_URING_CMD`) to the namespace's
//! generic character device, their data pointers in accelerator memory. The
//! kernel maps the buffer for the controller (P2P pages by bus address), so
//! the SSD DMAs into the accelerator without the block layer's file
//! semantics. Commands are split to the controller's transfer limit and
//! never cross a run of contiguous blocks; partial blocks at the ends go
//! through the bounce slots on the storage's own descriptor (`O_DIRECT`).
//!
//! # Where the blocks are
//!
//! - A raw namespace: file offset = namespace offset.
//! - A partition of one: file offset + the partition's start (sysfs).
//! - A regular file on ext4 or XFS on either, for reads: the block-aligned
//!   middle of the transfer is mapped with `FS_IOC_FIEMAP`
//!   ([`crate::transfer::exec::extents`]) before anything moves. `FIEMAP_FLAG_SYNC` writes
//!   dirty page-cache data back first (resolving delayed allocation), so a
//!   read sees data written with buffered writes that were never fsynced.
//!   Holes and unwritten extents read as zeros, written into device memory
//!   by the CPU. Nothing holds the file's layout while the commands run, so
//!   after them the file is mapped again: if the map changed (a truncate,
//!   hole punch, defragmentation or reflink meanwhile), the blocks read may
//!   have been another file's by then, and the read is refused and redone
//!   on the bounce path.
//! - Regular files are never written by NVMe commands: a write could not be
//!   taken back once the layout changed under it, and would land in blocks
//!   another file may own by then. Such writes are refused before anything
//!   moves and go by the bounce path.
//! - A block device (namespace or partition): its own page cache, which
//!   buffered I/O through the device node fills, is written back over the
//!   range before the commands and dropped after a write, the same
//!   coherence `O_DIRECT` keeps. Before a write, the range's cached pages
//!   are dropped and counted: pages that cannot be dropped (mapped by a
//!   process) would be stale afterwards, so the write is refused.
//!
//! A refusal is `Error::PathUnavailable`, which the engine retries on the
//! bounce path and counts; nothing has been written when it comes.
//!
//! # Limits
//!
//! - As with `O_DIRECT`, concurrent writers and `mmap` users of the same
//!   range of a block device are the caller's to order.
//! - `FIEMAP_FLAG_SYNC` writes back the whole file's dirty pages on every
//!   transfer.
//! - The caller needs permission to open `/dev/ngXnY` (read, and write for
//!   writes); without it the transfer is retried on the bounce path.

use std::{num::NonZeroU64, os::fd::AsFd, time::Instant};

use crate::transfer::{
    exec::extents::{self, Segment},
    storage::{NvmeNamespace, StorageFile},
    xfer::{round_down, round_up, Direction, Xfer},
};
use crate::{
    memory::DmaTarget,
    sys::uring::{Context, NvmeResult, NvmeSession, Session},
    Error, Result,
};

/// Why NVMe commands never write a regular file.
const FILE_WRITES_REFUSED: &str = "NVMe commands do not write files: nothing holds the file's block layout during a write, so a truncate, hole punch, defragmentation or reflink in between would make the commands overwrite blocks another file may own by then (writes to files go by P2P or the bounce path)";

/// Zeros for holes, copied into device memory a piece at a time.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Runs `x` in direction `dir` (`x.len() > 0`).
pub(crate) fn run(ctx: &mut Context, dir: Direction, x: &Xfer<'_>) -> Result<()> {
    let (file, file_offset, len) = (x.file, x.file_offset, x.len());
    let write = dir == Direction::Write;
    let unavailable = |reason: String| Error::PathUnavailable {
        path: "nvme-cmd",
        reason,
    };
    let ns = file.nvme_namespace().ok_or_else(|| {
        unavailable(format!(
            "{} is not on an NVMe namespace",
            file.path().display()
        ))
    })?;
    if write && file.is_file() {
        return Err(unavailable(format!(
            "{}: {FILE_WRITES_REFUSED}",
            file.path().display()
        )));
    }
    let target = x.dma_target()?;
    let bs = file.block_size() as u64;
    let end = file_offset + len as u64;
    let (m0, m1) = (round_up(file_offset, bs), round_down(end, bs));
    // Where the middle lies on the namespace, found before anything moves:
    // a refusal costs nothing written.
    let segments = if m0 < m1 {
        layout(file, ns, write, m0, m1)
            .map_err(|r| unavailable(format!("{}: {r}", file.path().display())))?
    } else {
        Vec::new()
    };
    // A block device's own page cache may hold data the device does not have
    // yet (buffered writes through its node): written back first, as
    // FIEMAP_FLAG_SYNC does for files, so reads see it and writeback cannot
    // later put it over what the commands write.
    if !file.is_file() && m0 < m1 {
        extents::write_back(file.fd()?, m0, m1 - m0)
            .map_err(|e| file.io_error("write back the page cache of the range", m0, m1 - m0, e))?;
        if write {
            // Cached pages of the range would be stale once the commands
            // land. Dropping them fails silently for pages in use (mapped by
            // a process, locked): if any stay, the commands must not run.
            drop_cache(file, m0, m1)?;
            let left = extents::resident_pages(file.fd()?, m0, m1 - m0).map_err(|e| {
                file.io_error("look up the page cache of the range", m0, m1 - m0, e)
            })?;
            if left > 0 {
                return Err(unavailable(format!(
                    "{left} cached pages of bytes [{m0}, {m1}) of {} cannot be dropped (mapped by a process?), and would be stale after the write",
                    file.path().display()
                )));
            }
        }
    }
    let generic = if segments.iter().any(|s| matches!(s, Segment::Mapped { .. })) {
        Some(file.generic_device(ns, write)?)
    } else {
        None
    };
    {
        // The partial blocks at the ends, through the bounce slots.
        let mut s = Session::new(ctx, file.fd()?, file.block_size(), None::<(DmaTarget, &())>);
        let middle_left = match dir {
            Direction::Read => x.read_edges(&mut s, m0, m1)?,
            Direction::Write => {
                x.write_edges(&mut s, m0, m1)?;
                m0 < m1
            }
        };
        if !middle_left {
            return Ok(());
        }
    }
    for seg in &segments {
        if let Segment::Zero {
            file_offset: z,
            len: zlen,
        } = *seg
        {
            if write {
                // `layout` refuses holes under a write; were one here, the
                // commands would skip it and leave the file unwritten there.
                return Err(unavailable(format!("bytes [{z}, {}) are a hole", z + zlen)));
            }
            zero_fill(x, z, zlen)?;
        }
    }
    if let Some(generic) = &generic {
        let (chunk, depth) = (ctx.chunk(), ctx.depth());
        let ring = ctx.nvme_ring()?;
        let mut s = NvmeSession::new(
            ring,
            generic.as_fd(),
            ns.nsid,
            ns.lba_shift,
            target,
            x.mem(),
        );
        commands(&mut s, chunk, depth, x, ns, write, &segments)?;
    }
    if file.is_file() && m0 < m1 {
        // The blocks read must still be the file's.
        let lba = 1u64 << ns.lba_shift;
        extents::still_mapped(file.fd()?, m0, m1, file.partition_offset(), lba, &segments)
            .map_err(|r| unavailable(format!("{}: {r}", file.path().display())))?;
    }
    if write {
        // Buffered readers must not keep seeing what was there before.
        drop_cache(file, m0, m1)?;
    }
    Ok(())
}

/// Drops the page cache of `[m0, m1)` (`POSIX_FADV_DONTNEED`; pages in use
/// stay). No length would mean "to the end of the file": the range has one.
fn drop_cache(file: &StorageFile, m0: u64, m1: u64) -> Result<()> {
    if let Some(n) = NonZeroU64::new(m1 - m0) {
        rustix::fs::fadvise(file.fd()?, m0, Some(n), rustix::fs::Advice::DontNeed)
            .map_err(|e| file.io_error("drop the page cache of the range", m0, m1 - m0, e))?;
    }
    Ok(())
}

/// Where the block-aligned `[m0, m1)` of `file` lies on `ns`, or why NVMe
/// commands cannot move it.
fn layout(
    file: &StorageFile,
    ns: &NvmeNamespace,
    write: bool,
    m0: u64,
    m1: u64,
) -> std::result::Result<Vec<Segment>, String> {
    let lba = 1u64 << ns.lba_shift;
    if !file.is_file() {
        // A write past the end of a partition would land in the next one.
        if m1 > file.size() {
            return Err(format!(
                "bytes [{m0}, {m1}) run past the end of the device ({} bytes)",
                file.size()
            ));
        }
        return extents::device_range(m0, m1, file.partition_offset(), lba);
    }
    match &file.fs {
        Some(Ok(fs)) => extents::map(
            file.fd().map_err(|e| e.to_string())?,
            *fs,
            m0,
            m1,
            file.partition_offset(),
            lba,
            write,
        ),
        Some(Err(reason)) => Err(reason.clone()),
        None => Err("its filesystem was not checked".into()),
    }
}

/// Writes `len` zeros into device memory where file bytes `[z, z + len)`
/// of the transfer go.
fn zero_fill(x: &Xfer<'_>, z: u64, len: u64) -> Result<()> {
    let t = Instant::now();
    let mut at = z;
    while at < z + len {
        let n = (ZEROS.len() as u64).min(z + len - at) as usize;
        x.mem().write_at(x.mem_at(at), &ZEROS[..n])?;
        at += n as u64;
    }
    x.stats.record_copy(t.elapsed());
    Ok(())
}

/// One command's worth of a mapped run.
#[derive(Clone, Copy)]
struct Piece {
    file_offset: u64,
    dev_offset: u64,
    len: u64,
}

/// Issues the mapped segments as commands of at most the chunk (and the
/// controller's limit), `depth` in flight.
fn commands(
    s: &mut NvmeSession<'_>,
    chunk: usize,
    depth: usize,
    x: &Xfer<'_>,
    ns: &NvmeNamespace,
    write: bool,
    segments: &[Segment],
) -> Result<()> {
    let bs = x.file.block_size() as u64;
    let chunk = ((chunk as u64).min(ns.max_transfer as u64) / bs * bs).max(bs);
    let mut pieces = Vec::new();
    for seg in segments {
        if let Segment::Mapped {
            file_offset,
            dev_offset,
            len,
        } = *seg
        {
            let mut done = 0;
            while done < len {
                let n = chunk.min(len - done);
                pieces.push(Piece {
                    file_offset: file_offset + done,
                    dev_offset: dev_offset + done,
                    len: n,
                });
                done += n;
            }
        }
    }
    let op = if write {
        "NVMe write command"
    } else {
        "NVMe read command"
    };
    let mut next = 0usize;
    loop {
        while next < pieces.len() && s.inflight() < depth {
            let p = pieces[next];
            let at = x.mem_at(p.file_offset);
            s.push(write, p.dev_offset, at, p.len as usize, next as u64)?;
            x.stats.record_ios(1);
            next += 1;
        }
        if s.inflight() == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let done = s.wait(1)?;
        x.stats.record_storage(t.elapsed());
        for (tag, r) in done {
            let p = pieces.get(tag as usize).copied().ok_or_else(|| {
                Error::InvalidArgument(format!("NVMe completion with unknown tag {tag}"))
            })?;
            match r {
                NvmeResult::Ok => {}
                NvmeResult::Errno(e) => return Err(x.file.io_error(op, p.file_offset, p.len, e)),
                NvmeResult::Status(status) => {
                    return Err(Error::NvmeStatus {
                        op,
                        offset: p.dev_offset,
                        len: p.len,
                        status,
                    })
                }
            }
        }
    }
}
