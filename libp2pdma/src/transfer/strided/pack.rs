//! What RC, SC and TaT share below the planner: spreading reads over
//! threads, and packing runs out of a landed chunk (which is also how the
//! placement cost is measured).

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
};

use super::{
    cost::SC_THREADS,
    shape::{Layout, Shape},
};
use crate::{
    memory::{DeviceMemory, MemRange, MemoryKind},
    transfer::core::Report,
    Error, Result,
};

/// Runs `job(0)` to `job(n - 1)` on up to [`SC_THREADS`] threads (the
/// calling one included), each a share of the indices in order, one job
/// after another. The first error stops every thread before its next job
/// and is returned once all have stopped; otherwise a report of each path
/// (and retry) seen.
pub(crate) fn shared(n: u64, job: &(dyn Fn(u64) -> Result<Report> + Sync)) -> Result<Vec<Report>> {
    let threads = usize::try_from(n).unwrap_or(usize::MAX).min(SC_THREADS);
    if threads == 0 {
        return Ok(Vec::new());
    }
    let share = n.div_ceil(threads as u64);
    let failed = AtomicBool::new(false);
    // Each thread keeps one report of each kind it saw (path, retried).
    let part = |t: u64| -> Result<Vec<Report>> {
        let mut seen: Vec<Report> = Vec::new();
        for k in t * share..((t + 1) * share).min(n) {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            match job(k) {
                Ok(rep) => {
                    if !seen
                        .iter()
                        .any(|s| (s.path, s.retried) == (rep.path, rep.retried))
                    {
                        seen.push(rep);
                    }
                }
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(seen)
    };
    let results: Vec<_> = std::thread::scope(|s| {
        let others: Vec<_> = (1..threads as u64)
            .map(|t| {
                let part = &part;
                s.spawn(move || part(t))
            })
            .collect();
        let mine = part(0);
        std::iter::once(mine)
            .chain(
                others
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
            )
            .collect()
    });
    let mut reps = Vec::new();
    for r in results {
        reps.extend(r?);
    }
    Ok(reps)
}

/// q: the seconds TaT's placer spends on each run beyond its bytes (at
/// `copy_bps`), putting 512-byte runs 512 bytes apart into `mem` in the
/// strided layout, in 1 MiB pieces as the pipeline hands them over, from
/// a source as large as `mem` (larger than the CPU's caches, as the bounce
/// slots' bytes are when they land); the best of `rounds`. Overwrites
/// `mem`, which must hold 1 KiB.
pub(crate) fn measure_placement(
    mem: &dyn DeviceMemory,
    copy_bps: f64,
    rounds: usize,
) -> Result<f64> {
    let len = mem.len();
    let runs = (len / 1024) as u64;
    if runs == 0 {
        return Err(Error::InvalidArgument(
            "placement needs at least 1 KiB of memory".into(),
        ));
    }
    let shape = Shape::new(0, 512, &[(1024, runs)])?;
    let packer = Packer {
        shape: &shape,
        origin: 0,
        len: shape.bounding_len() as usize,
        dest: MemRange::whole(mem),
        layout: Layout::Strided,
        scratch: Mutex::new(Vec::new()),
    };
    let src = vec![0x5Au8; packer.len];
    let mut best = f64::INFINITY;
    for _ in 0..rounds.max(1) {
        let t = std::time::Instant::now();
        for at in (0..packer.len).step_by(1 << 20) {
            packer.write_at(at, &src[at..(at + (1 << 20)).min(packer.len)])?;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((best / runs as f64 - 512.0 / copy_bps.max(1.0)).max(1e-10))
}

/// TaT's copy stage: stands for one group's range as device memory for the
/// bounce pipeline, and as each landed piece of it is handed over, packs
/// the runs in it and copies them into the real memory: one copy for the
/// packed layout, one per run piece for the strided one.
pub(crate) struct Packer<'a> {
    pub(crate) shape: &'a Shape,
    /// The file offset of the range's first byte.
    pub(crate) origin: u64,
    /// The range's length.
    pub(crate) len: usize,
    /// Where the runs go, laid out as `layout` from its start.
    pub(crate) dest: MemRange<'a>,
    pub(crate) layout: Layout,
    /// Packing buffers, reused; the copy stage may call from several
    /// threads at once.
    pub(crate) scratch: Mutex<Vec<Vec<u8>>>,
}

impl fmt::Debug for Packer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packer")
            .field("shape", &self.shape)
            .field("layout", &self.layout)
            .finish()
    }
}

impl DeviceMemory for Packer<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        self.dest.mem().kind()
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        let sh = self.shape;
        let f0 = self.origin + offset as u64;
        let f1 = f0 + src.len() as u64;
        let mut k = sh.first_ending_after(f0);
        // The pieces of runs in [f0, f1): (offset in src, length, run index,
        // offset in the run).
        let mut pieces = Vec::new();
        while k < sh.runs {
            let r0 = sh.run_at(k);
            if r0 >= f1 {
                break;
            }
            let p0 = r0.max(f0);
            let p1 = (r0 + sh.run).min(f1);
            pieces.push(((p0 - f0) as usize, (p1 - p0) as usize, k, p0 - r0));
            k += 1;
        }
        let Some(&(_, _, k0, in0)) = pieces.first() else {
            return Ok(());
        };
        let (mem, start) = (self.dest.mem(), self.dest.offset());
        match self.layout {
            Layout::Strided => {
                for &(at, n, _, _) in &pieces {
                    mem.write_at(start + (f0 - sh.base) as usize + at, &src[at..at + n])?;
                }
                Ok(())
            }
            Layout::Packed => {
                // Consecutive pieces are consecutive in the packed layout.
                let dst = start + (k0 * sh.run + in0) as usize;
                if let [(at, n, _, _)] = pieces[..] {
                    return mem.write_at(dst, &src[at..at + n]);
                }
                let mut buf = self
                    .scratch
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pop()
                    .unwrap_or_default();
                buf.clear();
                for &(at, n, _, _) in &pieces {
                    buf.extend_from_slice(&src[at..at + n]);
                }
                let r = mem.write_at(dst, &buf);
                self.scratch
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(buf);
                r
            }
        }
    }

    fn read_at(&self, _offset: usize, _dst: &mut [u8]) -> Result<()> {
        Err(Error::InvalidArgument(
            "strided TaT staging is written, never read".into(),
        ))
    }
}
