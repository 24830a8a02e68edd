//! The NVMe-command path: read and write commands built by the library and
//! sent with io_uring passthrough (`IORING_OP_URING_CMD`) to the namespace's
//! generic character device, their data pointers in accelerator memory. The
//! kernel maps the buffer for the controller (P2P pages by bus address), so
//! the SSD DMAs into the accelerator without the block layer's file
//! semantics. Commands are split to the controller's transfer limit; partial
//! blocks at the ends go through the bounce slots on the block device.

use std::{fs::OpenOptions, os::fd::AsFd, time::Instant};

use super::{
    bounce::{round_down, round_up, Xfer},
    Direction,
};
use crate::{
    backend::DmaTarget,
    uring::{Context, NvmeResult, NvmeSession, Session},
    Error, Result,
};

/// Runs `x` in direction `dir` (`x.len > 0`).
pub(super) fn run(ctx: &mut Context, dir: Direction, x: &Xfer<'_>) -> Result<()> {
    let (file, file_offset, mem_offset, len, stats) = (x.file, x.file_offset, x.mem_offset, x.len, x.stats);
    let unavailable = |reason: String| Error::PathUnavailable { path: "nvme-cmd", reason };
    let ns = file
        .nvme_namespace()
        .ok_or_else(|| unavailable(format!("{} is not a whole NVMe namespace", file.path().display())))?;
    let target = x.dma_target("nvme-cmd")?;
    let generic = OpenOptions::new()
        .read(true)
        .write(dir == Direction::Write)
        .open(&ns.generic)
        .map_err(|e| {
            file.io_error(
                "open the NVMe generic device",
                0,
                0,
                rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
            )
        })?;
    let bs = file.block_size() as u64;
    let end = file_offset + len as u64;
    let (m0, m1) = (round_up(file_offset, bs), round_down(end, bs));
    {
        // The partial blocks at the ends, through the bounce slots.
        let mut s = Session::new(ctx, file.fd(), None::<(DmaTarget, &())>);
        let middle_left = match dir {
            Direction::Read => x.read_edges(&mut s, m0, m1)?,
            Direction::Write => {
                x.write_edges(&mut s, m0, m1)?;
                m0 < m1
            }
        };
        if !middle_left {
            return if dir == Direction::Write { x.fix_size() } else { Ok(()) };
        }
    }
    {
        let chunk = (ctx.chunk() as u64).min(ns.max_transfer as u64) / bs * bs;
        let chunk = chunk.max(bs);
        let depth = ctx.depth();
        let mut s = NvmeSession::new(generic.as_fd(), ns.nsid, ns.lba_shift, depth, target, x.mem)?;
        let n = (m1 - m0).div_ceil(chunk);
        let mut next = 0u64;
        let write = dir == Direction::Write;
        loop {
            while next < n && s.inflight() < depth {
                let c0 = m0 + next * chunk;
                let clen = chunk.min(m1 - c0) as usize;
                s.push(write, c0, mem_offset + (c0 - file_offset) as usize, clen, next)?;
                stats.record_ios(1);
                next += 1;
            }
            if s.inflight() == 0 {
                break;
            }
            let t = Instant::now();
            let done = s.wait(1)?;
            stats.record_storage(t.elapsed());
            for (tag, r) in done {
                let c0 = m0 + tag * chunk;
                let clen = chunk.min(m1 - c0);
                let op = if write { "NVMe write command" } else { "NVMe read command" };
                match r {
                    NvmeResult::Ok => {}
                    NvmeResult::Errno(e) => return Err(file.io_error(op, c0, clen, e)),
                    NvmeResult::Status(status) => {
                        return Err(Error::NvmeStatus {
                            op,
                            offset: c0,
                            len: clen,
                            status,
                        })
                    }
                }
            }
        }
    }
    if dir == Direction::Write {
        x.fix_size()?;
    }
    Ok(())
}
