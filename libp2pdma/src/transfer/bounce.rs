//! The bounce pipeline: storage <-> pinned host slots <-> accelerator memory.
//!
//! Reads keep up to `depth` chunk reads in flight; as each lands, its slot is
//! copied into device memory while the other reads proceed, and the slot is
//! refilled with the next chunk. The total is close to the slower stage plus
//! one chunk, not the sum of the stages. Writes run the other way: the copy
//! of chunk i+1 out of device memory overlaps the storage write of chunk i.

use std::{
    cell::Cell,
    time::{Duration, Instant},
};

use super::{copypool::CopyPool, Direction, P2pSubmit, PathStats, StorageFile};
use crate::{
    backend::{DeviceMemory, DmaTarget},
    uring::{Buf, Context, Session},
    Error, Result,
};

pub(super) fn round_down(x: u64, a: u64) -> u64 {
    x - x % a
}

pub(super) fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Runs `x` in direction `dir` (`x.len > 0`).
pub(super) fn run(ctx: &mut Context, dir: Direction, x: &Xfer<'_>) -> Result<()> {
    let (file, file_offset, len) = (x.file, x.file_offset, x.len);
    let mut s = Session::new(ctx, file.fd(), file.block, None::<(DmaTarget, &())>);
    match dir {
        Direction::Read => x.read(&mut s),
        Direction::Write => {
            let m0 = round_up(file_offset, file.block as u64);
            let m1 = round_down(file_offset + len as u64, file.block as u64);
            x.write_edges(&mut s, m0, m1)?;
            if m0 < m1 {
                x.write_middle(&mut s, m0, m1)?;
            }
            Ok(())
        }
    }
}

/// One transfer's parameters.
pub(super) struct Xfer<'a> {
    pub(super) file: &'a StorageFile,
    pub(super) file_offset: u64,
    pub(super) mem: &'a dyn DeviceMemory,
    pub(super) mem_offset: usize,
    pub(super) len: usize,
    pub(super) stats: &'a PathStats,
    /// How the P2P path submits its I/O.
    pub(super) submit: P2pSubmit,
    /// When the transfer started: a lone I/O's storage time runs from here,
    /// saving a clock read on the small transfers where it shows.
    pub(super) start: Instant,
    /// How landed chunks are copied into device memory.
    pub(super) copy: CopyStage<'a>,
}

/// The copy stage of a read: how many threads copy each landed chunk, and,
/// when that is automatic, what it is adjusted from.
pub(super) struct CopyStage<'a> {
    pub(super) pool: &'a CopyPool,
    /// Threads copying each chunk now (the calling thread included).
    pub(super) threads: &'a Cell<usize>,
    /// With automatic sizing, the most threads; `None` when fixed.
    pub(super) auto_most: Option<usize>,
    /// One thread's copy time so far: each copy's time times the threads
    /// that shared it.
    pub(super) busy: Cell<Duration>,
}

impl CopyStage<'_> {
    /// Copies `b` into `mem` at `at` with the current thread count.
    fn write(&self, mem: &dyn DeviceMemory, at: usize, b: &[u8]) -> Result<()> {
        match self.threads.get() {
            1 => mem.write_at(at, b),
            n => self.pool.write(mem, at, b, n),
        }
    }

    /// Counts a copy that took `d` with the current thread count.
    fn note(&self, d: Duration) {
        self.busy
            .set(self.busy.get() + d * self.threads.get() as u32);
    }

    /// With automatic sizing, sets the thread count from how busy one
    /// thread would have been with the copies so far, over `elapsed` of a
    /// pipelined read: helpers above [`super::COPY_LOAD_ON`] of the time, one
    /// thread again below [`super::COPY_LOAD_OFF`].
    fn adapt(&self, elapsed: Duration) {
        let Some(most) = self.auto_most else { return };
        let load = self.busy.get().as_secs_f64() / elapsed.as_secs_f64().max(1e-9);
        if load > super::COPY_LOAD_ON {
            self.threads.set(most);
        } else if load < super::COPY_LOAD_OFF {
            self.threads.set(1);
        }
    }
}

impl Xfer<'_> {
    fn end(&self) -> u64 {
        self.file_offset + self.len as u64
    }

    /// Offset in device memory of file byte `f` (inside the transfer).
    pub(super) fn mem_at(&self, f: u64) -> usize {
        self.mem_offset + (f - self.file_offset) as usize
    }

    /// Copies the transfer's part of `[c0, c0 + n)` (just read into slot
    /// `slot`) into device memory; `want` is where the chunk should end.
    fn land(&self, s: &mut Session<'_>, slot: usize, c0: u64, n: usize, want: u64) -> Result<()> {
        self.land_from(s, slot, c0, n, want, Instant::now())
    }

    /// [`Xfer::land`], with the copy's start time `t` already read.
    fn land_from(
        &self,
        s: &mut Session<'_>,
        slot: usize,
        c0: u64,
        n: usize,
        want: u64,
        t: Instant,
    ) -> Result<()> {
        let need0 = c0.max(self.file_offset);
        let need1 = want.min(self.end());
        if c0 + (n as u64) < need1 {
            return Err(Error::Short {
                what: "read from storage",
                expected: self.len as u64,
                done: (c0 + n as u64).saturating_sub(self.file_offset),
            });
        }
        let (mem, at) = (self.mem, self.mem_at(need0));
        s.with_slot(slot, (need0 - c0) as usize, (need1 - need0) as usize, |b| {
            self.copy.write(mem, at, b)
        })??;
        let d = t.elapsed();
        self.stats.record_copy(d);
        self.copy.note(d);
        Ok(())
    }

    /// The whole read, through the slots.
    fn read(&self, s: &mut Session<'_>) -> Result<()> {
        let bs = self.file.block as u64;
        self.read_range(
            s,
            round_down(self.file_offset, bs),
            round_up(self.end(), bs),
        )
    }

    /// Reads the block-aligned range `[a0, a1)` through the slots and lands
    /// the transfer's part of it. Up to `depth` reads stay in flight while
    /// landed slots are copied out, one at a time, between refills.
    pub(super) fn read_range(&self, s: &mut Session<'_>, a0: u64, a1: u64) -> Result<()> {
        let chunk = s.chunk() as u64;
        let nchunks = (a1 - a0).div_ceil(chunk);
        if nchunks == 1 && s.inflight() == 0 {
            // One I/O: nothing to overlap it with.
            let slot = s
                .free_slot()
                .ok_or_else(|| Error::InvalidArgument("no free bounce slot".into()))?;
            let n = s
                .io_now(false, Buf::Slot(slot), a0, (a1 - a0) as usize)?
                .map_err(|e| self.file.io_error("read", a0, a1 - a0, e))?;
            let t = Instant::now();
            self.stats.record_storage(t - self.start);
            self.stats.record_ios(1);
            return self.land_from(s, slot, a0, n, a1, t);
        }
        let (mut next, mut done) = (0u64, 0u64);
        // Landed chunks awaiting their copy: (slot, chunk index, bytes).
        let mut landed: Vec<(usize, u64, usize)> = Vec::new();
        while done < nchunks {
            let held: Vec<usize> = landed.iter().map(|l| l.0).collect();
            while next < nchunks && s.inflight() < s.depth() {
                let Some(slot) = s.free_slot_except(&held) else {
                    break;
                };
                let c0 = a0 + next * chunk;
                let clen = chunk.min(a1 - c0) as usize;
                s.read(Buf::Slot(slot), c0, clen, next)?;
                self.stats.record_ios(1);
                next += 1;
            }
            // Block only when there is nothing to copy meanwhile.
            let t = Instant::now();
            let comps = s.wait(if landed.is_empty() { 1 } else { 0 })?;
            self.stats.record_storage(t.elapsed());
            for c in comps {
                let c0 = a0 + c.tag * chunk;
                let want = (c0 + chunk).min(a1);
                let n = c
                    .res
                    .map_err(|e| self.file.io_error("read", c0, want - c0, e))?;
                let Buf::Slot(slot) = c.buf else {
                    unreachable!("bounce reads use slots")
                };
                landed.push((slot, c.tag, n));
            }
            if let Some((slot, tag, n)) = landed.pop() {
                let c0 = a0 + tag * chunk;
                self.land(s, slot, c0, n, (c0 + chunk).min(a1))?;
                done += 1;
                // Past the first two windows, whose chunks land in bursts
                // that keep any copy stage busy for a moment.
                if done >= 2 * s.depth() as u64 {
                    self.copy.adapt(self.start.elapsed());
                }
            }
        }
        Ok(())
    }

    /// For the paths that DMA straight into the memory: its mapping, after
    /// checking that the file offset and the memory offset can be block
    /// aligned together (direct I/O needs both; the mapping starts on a page).
    pub(super) fn dma_target(&self, path: &'static str) -> Result<DmaTarget> {
        let unavailable = |reason: String| Error::PathUnavailable { path, reason };
        let target = self.mem.dma_target().ok_or_else(|| {
            unavailable(format!(
                "{} has no CPU mapping storage could DMA into",
                self.mem.kind()
            ))
        })?;
        let bs = self.file.block as u64;
        if (self.mem_offset as u64) % bs != self.file_offset % bs {
            return Err(unavailable(format!(
                "file offset {} and memory offset {} differ modulo the {bs}-byte block",
                self.file_offset, self.mem_offset
            )));
        }
        Ok(target)
    }

    /// Reads the partial blocks at the ends of a direct read through the
    /// slots: all of it when no whole block `[m0, m1)` lies inside. Returns
    /// whether the middle is left to read.
    pub(super) fn read_edges(&self, s: &mut Session<'_>, m0: u64, m1: u64) -> Result<bool> {
        let bs = self.file.block as u64;
        let end = self.end();
        if m0 >= m1 {
            self.read_range(s, round_down(self.file_offset, bs), round_up(end, bs))?;
            return Ok(false);
        }
        if self.file_offset < m0 {
            self.read_range(s, m0 - bs, m0)?;
        }
        if m1 < end {
            self.read_range(s, m1, m1 + bs)?;
        }
        Ok(true)
    }

    /// Writes the partial blocks at the ends of a write: exactly the bytes
    /// the transfer covers there, through the page cache (a buffered
    /// `pwrite`), whose kernel merges them into their blocks under its own
    /// locks. So the bytes around them are kept whoever wrote them (another
    /// transfer sharing the block, another process appending), and a write
    /// that ends past the end of a file makes it exactly that long. The
    /// block-aligned middle `[m0, m1)` is the caller's, by direct I/O.
    pub(super) fn write_edges(&self, s: &mut Session<'_>, m0: u64, m1: u64) -> Result<()> {
        let (start, end) = (self.file_offset, self.end());
        let mut edges = Vec::new();
        if m0 >= m1 {
            // No whole block inside: it is all edge.
            edges.push((start, end));
        } else {
            if start < m0 {
                edges.push((start, m0));
            }
            if m1 < end {
                edges.push((m1, end));
            }
        }
        let slot = s
            .free_slot()
            .ok_or_else(|| Error::InvalidArgument("no free bounce slot".into()))?;
        for (e0, e1) in edges {
            let mut at = e0;
            while at < e1 {
                let n = (s.chunk() as u64).min(e1 - at) as usize;
                let (mem, moff, file) = (self.mem, self.mem_at(at), self.file);
                s.with_slot(slot, 0, n, |b| {
                    let t = Instant::now();
                    mem.read_at(moff, b)?;
                    self.stats.record_copy(t.elapsed());
                    file.pwrite_all(b, at)
                })??;
                self.stats.record_ios(1);
                at += n as u64;
            }
        }
        Ok(())
    }

    /// The block-aligned middle `[m0, m1)` of a write, pipelined.
    fn write_middle(&self, s: &mut Session<'_>, m0: u64, m1: u64) -> Result<()> {
        let chunk = s.chunk() as u64;
        let nchunks = (m1 - m0).div_ceil(chunk);
        let mut next = 0u64;
        loop {
            // Fill every free slot from device memory and write it out.
            while next < nchunks {
                let Some(slot) = s.free_slot() else { break };
                let c0 = m0 + next * chunk;
                let clen = chunk.min(m1 - c0) as usize;
                let (mem, at) = (self.mem, self.mem_at(c0));
                let t = Instant::now();
                s.with_slot(slot, 0, clen, |b| mem.read_at(at, b))??;
                self.stats.record_copy(t.elapsed());
                s.write(Buf::Slot(slot), c0, clen, next)?;
                self.stats.record_ios(1);
                next += 1;
            }
            if s.inflight() == 0 {
                return Ok(());
            }
            let t = Instant::now();
            let comps = s.wait(1)?;
            self.stats.record_storage(t.elapsed());
            for c in comps {
                let c0 = m0 + c.tag * chunk;
                let clen = chunk.min(m1 - c0) as usize;
                let n = c
                    .res
                    .map_err(|e| self.file.io_error("write", c0, clen as u64, e))?;
                if n < clen {
                    return Err(Error::Short {
                        what: "write to storage",
                        expected: clen as u64,
                        done: n as u64,
                    });
                }
            }
        }
    }
}
