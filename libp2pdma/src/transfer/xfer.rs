//! One transfer as every path sees it: the direction, the file and memory
//! ranges, the path's counters and the read's copy stage.

use std::{
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use super::{
    exec::copypool::CopyPool, plan::TransferPath, stats::PathStats, storage::StorageFile,
    tuning::config::P2pSubmit,
};
use crate::{
    memory::{DeviceMemory, DmaTarget, MemRange},
    Error, Result,
};

/// Above this busy fraction of one copy thread, the copy stage gets helpers;
/// below [`COPY_LOAD_OFF`] it goes back to one thread.
const COPY_LOAD_ON: f64 = 0.5;
const COPY_LOAD_OFF: f64 = 0.3;

/// Which way the data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Storage to accelerator memory.
    Read,
    /// Accelerator memory to storage.
    Write,
}

/// `x` rounded down to a multiple of `a`.
pub(crate) fn round_down(x: u64, a: u64) -> u64 {
    x - x % a
}

/// `x` rounded up to a multiple of `a`.
pub(crate) fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// One transfer's parameters.
pub(crate) struct Xfer<'a> {
    pub(crate) file: &'a StorageFile,
    pub(crate) file_offset: u64,
    pub(crate) range: MemRange<'a>,
    pub(crate) stats: &'a PathStats,
    /// The path it runs on (the P2P and direct paths share their I/O).
    pub(crate) path: TransferPath,
    /// How the P2P path submits its I/O.
    pub(crate) submit: P2pSubmit,
    /// When the transfer started: a lone I/O's storage time runs from here,
    /// saving a clock read on the small transfers where it shows.
    pub(crate) start: Instant,
    /// How landed chunks are copied into device memory.
    pub(crate) copy: CopyStage<'a>,
}

/// The copy stage of a read: how many threads copy each landed chunk, and,
/// when that is automatic, what it is adjusted from.
pub(crate) struct CopyStage<'a> {
    pub(crate) pool: &'a CopyPool,
    /// Threads copying each chunk now (the calling thread included).
    pub(crate) threads: &'a AtomicUsize,
    /// With automatic sizing, the most threads; `None` when fixed.
    pub(crate) auto_most: Option<usize>,
    /// One thread's copy time so far, in nanoseconds: each copy's time
    /// times the threads that shared it.
    pub(crate) busy: AtomicU64,
}

impl CopyStage<'_> {
    /// Copies `b` into `mem` at `at` with the current thread count.
    pub(crate) fn write(&self, mem: &dyn DeviceMemory, at: usize, b: &[u8]) -> Result<()> {
        match self.threads.load(Ordering::Relaxed) {
            1 => mem.write_at(at, b),
            n => self.pool.write(mem, at, b, n),
        }
    }

    /// Counts a copy that took `d` with the current thread count.
    pub(crate) fn note(&self, d: Duration) {
        let n = d.as_nanos() * self.threads.load(Ordering::Relaxed) as u128;
        self.busy
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// With automatic sizing, sets the thread count from how busy one
    /// thread would have been with the copies so far, over `elapsed` of a
    /// pipelined read: helpers above [`COPY_LOAD_ON`] of the time, one
    /// thread again below [`COPY_LOAD_OFF`].
    pub(crate) fn adapt(&self, elapsed: Duration) {
        let Some(most) = self.auto_most else { return };
        let busy = self.busy.load(Ordering::Relaxed) as f64 / 1e9;
        let load = busy / elapsed.as_secs_f64().max(1e-9);
        if load > COPY_LOAD_ON {
            self.threads.store(most, Ordering::Relaxed);
        } else if load < COPY_LOAD_OFF {
            self.threads.store(1, Ordering::Relaxed);
        }
    }
}

impl<'a> Xfer<'a> {
    /// The memory.
    pub(crate) fn mem(&self) -> &'a dyn DeviceMemory {
        self.range.mem()
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.range.len()
    }

    pub(crate) fn end(&self) -> u64 {
        self.file_offset + self.len() as u64
    }

    /// Offset in device memory of file byte `f` (inside the transfer).
    pub(crate) fn mem_at(&self, f: u64) -> usize {
        self.range.offset() + (f - self.file_offset) as usize
    }

    /// For the paths that DMA straight into the memory: its mapping, after
    /// checking that the file offset and the memory's address can be block
    /// aligned together (direct I/O needs both).
    pub(crate) fn dma_target(&self) -> Result<DmaTarget> {
        let unavailable = |reason: String| Error::PathUnavailable {
            path: self.path.as_str(),
            reason,
        };
        let mem = self.mem();
        let target = mem.dma().and_then(|d| d.dma_target()).ok_or_else(|| {
            unavailable(format!(
                "{} has no CPU mapping storage could DMA into",
                mem.kind()
            ))
        })?;
        if !self.aligned_with(&target) {
            return Err(unavailable(format!(
                "file offset {} and memory offset {} differ modulo the {}-byte block",
                self.file_offset,
                self.range.offset(),
                self.file.block
            )));
        }
        Ok(target)
    }

    /// Whether the memory has a CPU mapping whose address at the transfer's
    /// start aligns to the block together with the file offset.
    pub(crate) fn mapped_aligned(&self) -> bool {
        self.mem()
            .dma()
            .and_then(|d| d.dma_target())
            .is_some_and(|t| self.aligned_with(&t))
    }

    fn aligned_with(&self, target: &DmaTarget) -> bool {
        let bs = self.file.block as u64;
        (target.ptr as u64).wrapping_add(self.range.offset() as u64) % bs == self.file_offset % bs
    }
}
