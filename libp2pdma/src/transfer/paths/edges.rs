//! The partial blocks at the ends of a direct transfer, for the paths that
//! move whole blocks (P2P by `O_DIRECT`, NVMe commands) and the bounce
//! pipeline's writes: reads go through a bounce slot and land the
//! transfer's part of each block; writes go through the page cache. The
//! paths import this module; no path calls into another.

use std::time::Instant;

use crate::transfer::xfer::{round_down, round_up, Xfer};
use crate::{
    sys::uring::{Buf, Session},
    Error, Result,
};

impl Xfer<'_> {
    /// Copies the transfer's part of `[c0, c0 + n)` (just read into slot
    /// `slot`) into device memory; `want` is where the chunk should end, and
    /// `t` the copy's start time.
    pub(super) fn land_from(
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
                expected: self.len() as u64,
                done: (c0 + n as u64).saturating_sub(self.file_offset),
            });
        }
        let (mem, at) = (self.mem(), self.mem_at(need0));
        s.with_slot(slot, (need0 - c0) as usize, (need1 - need0) as usize, |b| {
            self.copy.write(mem, at, b)
        })??;
        let d = t.elapsed();
        self.stats.record_copy(d);
        self.copy.note(d);
        Ok(())
    }

    /// Reads the partial blocks at the ends of a direct read through the
    /// slots: all of it when no whole block `[m0, m1)` lies inside. Returns
    /// whether the middle is left to read.
    pub(crate) fn read_edges(&self, s: &mut Session<'_>, m0: u64, m1: u64) -> Result<bool> {
        let bs = self.file.block as u64;
        let end = self.end();
        if m0 >= m1 {
            self.read_blocks(s, round_down(self.file_offset, bs), round_up(end, bs))?;
            return Ok(false);
        }
        if self.file_offset < m0 {
            self.read_blocks(s, m0 - bs, m0)?;
        }
        if m1 < end {
            self.read_blocks(s, m1, m1 + bs)?;
        }
        Ok(true)
    }

    /// Reads the block-aligned `[a0, a1)` (a block or two) through a slot,
    /// one I/O of at most a slot at a time, and lands the transfer's part.
    fn read_blocks(&self, s: &mut Session<'_>, a0: u64, a1: u64) -> Result<()> {
        let mut at = a0;
        while at < a1 {
            let len = (s.chunk() as u64).min(a1 - at);
            let slot = s
                .free_slot()
                .ok_or_else(|| Error::InvalidArgument("no free bounce slot".into()))?;
            let n = s
                .io_now(false, Buf::Slot(slot), at, len as usize)?
                .map_err(|e| self.file.io_error("read", at, len, e))?;
            let t = Instant::now();
            self.stats.record_storage(t - self.start);
            self.stats.record_ios(1);
            self.land_from(s, slot, at, n, at + len, t)?;
            at += len;
        }
        Ok(())
    }

    /// Writes the partial blocks at the ends of a write: exactly the bytes
    /// the transfer covers there, through the page cache (a buffered
    /// `pwrite`), whose kernel merges them into their blocks under its own
    /// locks. So the bytes around them are kept whoever wrote them (another
    /// transfer sharing the block, another process appending), and a write
    /// that ends past the end of a file makes it exactly that long. The
    /// block-aligned middle `[m0, m1)` is the caller's, by direct I/O.
    pub(crate) fn write_edges(&self, s: &mut Session<'_>, m0: u64, m1: u64) -> Result<()> {
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
                let (mem, moff, file) = (self.mem(), self.mem_at(at), self.file);
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
}
