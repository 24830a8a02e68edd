//! The bounce pipeline: storage <-> pinned host slots <-> accelerator memory,
//! a two-stage use of the pipeline executor ([`pipeline`]).
//!
//! Reads: the storage stage keeps up to `depth` chunk reads in flight into
//! the session's registered slots on the calling thread; the copy stage, on
//! its own thread, copies each landed slot into device memory (split among
//! the copy threads when one is not enough) and frees it for the next read.
//! The total is close to the slower stage plus one chunk, not the sum of
//! the stages. Writes run the other way: the copy stage fills free slots out
//! of device memory while the storage stage keeps `depth` writes in flight.
//! A transfer of one chunk skips the pipeline: one I/O, then one copy.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Instant,
};

use crate::transfer::{
    exec::pipeline::{self, Chunk, Driver, Flow, Lanes, Stage},
    xfer::{round_down, round_up, Direction, Xfer},
};
use crate::{
    memory::DmaTarget,
    sys::uring::{Buf, Context, Session, Slots},
    Error, Result,
};

/// Runs `x` in direction `dir` (`x.len() > 0`).
pub(crate) fn run(ctx: &mut Context, dir: Direction, x: &Xfer<'_>) -> Result<()> {
    let (file, file_offset, len) = (x.file, x.file_offset, x.len());
    let mut s = Session::new(ctx, file.fd()?, file.block, None::<(DmaTarget, &())>);
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

impl Xfer<'_> {
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
    pub(crate) fn read_range(&self, s: &mut Session<'_>, a0: u64, a1: u64) -> Result<()> {
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
        if s.inflight() != 0 {
            return Err(Error::InvalidArgument(
                "a pipelined read on a session with I/Os in flight".into(),
            ));
        }
        // The pipeline: the storage stage keeps `depth` reads in flight
        // into the slots on this thread, the copy stage empties landed
        // slots into device memory on its own.
        let chunks = pipeline::chunks((a1 - a0) as usize, chunk as usize, 0);
        let landed: Vec<AtomicUsize> = chunks.iter().map(|_| AtomicUsize::new(0)).collect();
        let slots = s.slots();
        let mut storage = IoFlow {
            x: self,
            s,
            base: a0,
            chunks: &chunks,
            dir: Direction::Read,
            landed: &landed,
        };
        let copy = Land {
            x: self,
            slots,
            a0,
            a1,
            landed: &landed,
            done: AtomicUsize::new(0),
            warm: 2 * storage.s.depth(),
        };
        let stages = vec![
            Driver::Flow(&mut storage),
            Driver::Lanes(Lanes {
                stage: &copy,
                lanes: 1,
            }),
        ];
        pipeline::execute(&chunks, stages, &[slots.count()])?;
        Ok(())
    }

    /// The block-aligned middle `[m0, m1)` of a write, pipelined: the copy
    /// stage fills free slots out of device memory on its own thread while
    /// this thread keeps `depth` storage writes of filled slots in flight.
    fn write_middle(&self, s: &mut Session<'_>, m0: u64, m1: u64) -> Result<()> {
        if s.inflight() != 0 {
            return Err(Error::InvalidArgument(
                "a pipelined write on a session with I/Os in flight".into(),
            ));
        }
        let chunks = pipeline::chunks((m1 - m0) as usize, s.chunk(), 0);
        let slots = s.slots();
        let copy = Fill { x: self, slots, m0 };
        let mut storage = IoFlow {
            x: self,
            s,
            base: m0,
            chunks: &chunks,
            dir: Direction::Write,
            landed: &[],
        };
        let stages = vec![
            Driver::Lanes(Lanes {
                stage: &copy,
                lanes: 1,
            }),
            Driver::Flow(&mut storage),
        ];
        pipeline::execute(&chunks, stages, &[slots.count()])?;
        Ok(())
    }
}

/// The storage stage of a read or a write: I/Os of whole chunks between the
/// storage and the session's slots, `depth` in flight.
struct IoFlow<'x, 's, 'a> {
    x: &'x Xfer<'x>,
    s: &'x mut Session<'s>,
    /// Where chunk offsets start in the storage.
    base: u64,
    chunks: &'a [Chunk],
    dir: Direction,
    /// For reads: the bytes each chunk's read returned, for the copy stage
    /// (a short read is the copy stage's to judge: only the transfer's
    /// part of the chunk must be there).
    landed: &'a [AtomicUsize],
}

impl Flow for IoFlow<'_, '_, '_> {
    fn room(&self) -> usize {
        self.s.depth()
    }

    fn start(&mut self, c: &Chunk, from: Option<usize>, to: Option<usize>) -> Result<()> {
        let at = self.base + c.offset as u64;
        let (slot, tag) = (
            if self.dir == Direction::Read {
                to
            } else {
                from
            },
            c.index as u64,
        );
        let slot = slot.ok_or_else(|| Error::InvalidArgument("an I/O without a slot".into()))?;
        match self.dir {
            Direction::Read => self.s.read(Buf::Slot(slot), at, c.len, tag)?,
            Direction::Write => self.s.write(Buf::Slot(slot), at, c.len, tag)?,
        }
        self.x.stats.record_ios(1);
        Ok(())
    }

    fn finish(&mut self) -> Result<Vec<usize>> {
        let t = Instant::now();
        let comps = self.s.wait(1)?;
        self.x.stats.record_storage(t.elapsed());
        let mut done = Vec::with_capacity(comps.len());
        for c in comps {
            let ch = &self.chunks[c.tag as usize];
            let at = self.base + ch.offset as u64;
            let what = if self.dir == Direction::Read {
                "read"
            } else {
                "write"
            };
            let n = c
                .res
                .map_err(|e| self.x.file.io_error(what, at, ch.len as u64, e))?;
            match self.dir {
                Direction::Read => self.landed[ch.index].store(n, Ordering::Release),
                Direction::Write if n < ch.len => {
                    return Err(Error::Short {
                        what: "write to storage",
                        expected: ch.len as u64,
                        done: n as u64,
                    })
                }
                Direction::Write => {}
            }
            done.push(ch.index);
        }
        Ok(done)
    }
}

/// A read's copy stage: the transfer's part of each landed chunk into
/// device memory.
struct Land<'x, 'a> {
    x: &'x Xfer<'x>,
    slots: Slots,
    a0: u64,
    a1: u64,
    landed: &'a [AtomicUsize],
    /// Chunks copied so far.
    done: AtomicUsize,
    /// Chunks after which the copy threads adapt: past the first two
    /// windows, whose chunks land in bursts that keep any copy stage busy
    /// for a moment.
    warm: usize,
}

impl Stage for Land<'_, '_> {
    #[allow(unsafe_code)]
    fn run(&self, c: &Chunk, from: Option<usize>, _: Option<usize>) -> Result<()> {
        let slot = from.ok_or_else(|| Error::InvalidArgument("a copy without a slot".into()))?;
        let t = Instant::now();
        let x = self.x;
        let c0 = self.a0 + c.offset as u64;
        let n = self.landed[c.index].load(Ordering::Acquire);
        let need0 = c0.max(x.file_offset);
        let need1 = (c0 + c.len as u64).min(self.a1).min(x.end());
        if c0 + (n as u64) < need1 {
            return Err(Error::Short {
                what: "read from storage",
                expected: x.len() as u64,
                done: (c0 + n as u64).saturating_sub(x.file_offset),
            });
        }
        // SAFETY: The slot's read completed (the storage stage handed it
        // over) and the pipeline gives it to this stage alone until it is
        // freed; the session lives until the pipeline ends.
        let b = unsafe {
            self.slots
                .bytes(slot, (need0 - c0) as usize, (need1 - need0) as usize)
        }?;
        x.copy.write(x.mem(), x.mem_at(need0), b)?;
        let d = t.elapsed();
        x.stats.record_copy(d);
        x.copy.note(d);
        if self.done.fetch_add(1, Ordering::Relaxed) + 1 >= self.warm {
            x.copy.adapt(x.start.elapsed());
        }
        Ok(())
    }
}

/// A write's copy stage: each chunk out of device memory into a slot.
struct Fill<'x> {
    x: &'x Xfer<'x>,
    slots: Slots,
    m0: u64,
}

impl Stage for Fill<'_> {
    #[allow(unsafe_code)]
    fn run(&self, c: &Chunk, _: Option<usize>, to: Option<usize>) -> Result<()> {
        let slot = to.ok_or_else(|| Error::InvalidArgument("a copy without a slot".into()))?;
        let t = Instant::now();
        // SAFETY: The slot is free (no write in flight on it) and the
        // pipeline gives it to this stage alone until the storage stage
        // takes it; the session lives until the pipeline ends.
        let b = unsafe { self.slots.bytes_mut(slot, 0, c.len) }?;
        self.x
            .mem()
            .read_at(self.x.mem_at(self.m0 + c.offset as u64), b)?;
        self.x.stats.record_copy(t.elapsed());
        Ok(())
    }
}
