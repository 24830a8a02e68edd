//! The P2P path: `O_DIRECT` I/O whose buffer is the accelerator memory's CPU
//! mapping, so the SSD's DMA engine reads or writes the accelerator's BAR
//! directly. Partial blocks at the ends go through a bounce slot (reads) or
//! the page cache (writes, exactly the bytes asked for), the block-aligned
//! middle goes direct, with up to `depth` I/Os in flight.

use std::time::Instant;

use super::{
    bounce::{round_down, round_up, Xfer},
    Direction,
};
use crate::{
    uring::{Buf, Context, Session},
    Error, Result,
};

/// Runs `x` in direction `dir` (`x.len > 0`).
pub(super) fn run(ctx: &mut Context, dir: Direction, x: &Xfer<'_>) -> Result<()> {
    let (file, file_offset, mem, len) = (x.file, x.file_offset, x.mem, x.len);
    let target = x.dma_target("p2p")?;
    let bs = file.block_size() as u64;
    let mut s = Session::new(ctx, file.fd(), file.block_size(), Some((target, mem)));
    let end = file_offset + len as u64;
    let (m0, m1) = (round_up(file_offset, bs), round_down(end, bs));
    match dir {
        Direction::Read => {
            if x.read_edges(&mut s, m0, m1)? {
                middle(&mut s, x, false, m0, m1)?;
            }
            Ok(())
        }
        Direction::Write => {
            x.write_edges(&mut s, m0, m1)?;
            if m0 < m1 {
                middle(&mut s, x, true, m0, m1)?;
            }
            Ok(())
        }
    }
}

/// Direct I/O of the block-aligned `[m0, m1)` straight to or from device
/// memory.
fn middle(s: &mut Session<'_>, x: &Xfer<'_>, write: bool, m0: u64, m1: u64) -> Result<()> {
    let chunk = s.chunk() as u64;
    let n = (m1 - m0).div_ceil(chunk);
    let mut next = 0u64;
    let op = if write { "P2P write" } else { "P2P read" };
    let short = |done: usize, clen: usize| Error::Short {
        what: if write {
            "P2P write to storage"
        } else {
            "P2P read from storage"
        },
        expected: clen as u64,
        done: done as u64,
    };
    if n == 1 && s.inflight() == 0 {
        // One I/O: nothing to overlap it with.
        let clen = (m1 - m0) as usize;
        let buf = Buf::Target(x.mem_offset + (m0 - x.file_offset) as usize);
        let got = s
            .io_now(write, buf, m0, clen)?
            .map_err(|e| x.file.io_error(op, m0, clen as u64, e))?;
        x.stats.record_storage(x.start.elapsed());
        x.stats.record_ios(1);
        return if got < clen {
            Err(short(got, clen))
        } else {
            Ok(())
        };
    }
    loop {
        while next < n && s.inflight() < s.depth() {
            let c0 = m0 + next * chunk;
            let clen = chunk.min(m1 - c0) as usize;
            let buf = Buf::Target(x.mem_offset + (c0 - x.file_offset) as usize);
            if write {
                s.write(buf, c0, clen, next)?;
            } else {
                s.read(buf, c0, clen, next)?;
            }
            x.stats.record_ios(1);
            next += 1;
        }
        if s.inflight() == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let comps = s.wait(1)?;
        x.stats.record_storage(t.elapsed());
        for c in comps {
            let c0 = m0 + c.tag * chunk;
            let clen = chunk.min(m1 - c0) as usize;
            let got = c.res.map_err(|e| x.file.io_error(op, c0, clen as u64, e))?;
            if got < clen {
                return Err(short(got, clen));
            }
        }
    }
}
