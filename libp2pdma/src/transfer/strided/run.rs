//! Strided transfers on the engine: RC, SC and TaT, and the placement
//! measurement the cost model's constants come from.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
};

use super::{
    cost::{plan, tat_plan, PlanFacts, ReadCost, SC_THREADS},
    shape::{aligned_span, check_room, Layout, Run, Shape, StridedMode, StridedReport},
};
use crate::{
    memory::{DeviceMemory, DmaTarget, MemoryKind},
    transfer::{
        engine::{Engine, Handle, Report},
        plan::{PathChoice, TransferPath},
        storage::StorageFile,
        xfer::Direction,
    },
    Error, Result,
};

impl Engine {
    /// Reads the runs of `shape` from `file` into `mem` from `mem_offset`,
    /// laid out as `layout`, moved as `mode` says ([`StridedMode::Auto`]:
    /// as [`plan`] estimates best).
    ///
    /// Everything is checked before any I/O: the memory must hold the
    /// packed bytes ([`Layout::Packed`]) or the bounding range
    /// ([`Layout::Strided`]); RC needs the strided layout. Every run is moved
    /// or an error returned, never part of them as success.
    pub fn read_strided(
        &self,
        file: &StorageFile,
        shape: &Shape,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        let run = check_room(shape, mem, mem_offset, layout)?;
        let bs = file.block as u64;
        let (b0, b1) = shape.bounds();
        let bounding = usize::try_from(b1 - b0).map_err(|_| {
            Error::InvalidArgument("strided read: the bounding range is longer than memory".into())
        })?;
        let handle = self.handle(file, mem)?;
        let direct = handle.path() != TransferPath::Bounce;
        let within = |m: usize, f: u64| m as u64 % bs == f % bs;
        // AUTO and TaT need the constants (TaT for where to split its
        // reads); SC and RC as asked for need none.
        let resolved = matches!(mode, StridedMode::Auto | StridedMode::Tat)
            .then(|| self.strided_constants(Some(file), mem, handle.path()));
        let k = resolved.map(|r| r.constants).unwrap_or_default();
        // A gap that takes longer to read than a call costs splits TaT's
        // read.
        let groups = match mode {
            StridedMode::Auto | StridedMode::Tat => {
                tat_plan(shape, &ReadCost::of_constants(&k), bs)
            }
            _ => Vec::new(),
        };
        let tat_storage = groups
            .iter()
            .map(|g| aligned_span(g.start, g.end - g.start, bs))
            .sum();
        let constants_said = resolved.map_or(String::new(), |r| format!("; {}", r.describe()));
        let (mode, reason) = match mode {
            StridedMode::Auto => {
                let (m, why) = plan(&PlanFacts {
                    bounding: shape.bounding_len(),
                    interest: shape.bytes(),
                    runs: shape.runs(),
                    sc_storage: shape
                        .iter()
                        .map(|r| aligned_span(r.file_offset, shape.run, bs))
                        .sum(),
                    tat_storage,
                    tat_calls: groups.len() as u64,
                    rc_fits: layout == Layout::Strided,
                    direct,
                    sc_aligned: shape.iter().all(|r| {
                        let m = match layout {
                            Layout::Packed => r.packed_offset,
                            Layout::Strided => r.file_offset - b0,
                        };
                        within(mem_offset + m as usize, r.file_offset)
                    }),
                    rc_aligned: within(mem_offset, b0),
                    call_s: k.call_s,
                    call_mib_s: k.call_mib_s,
                    storage_bps: k.storage_bps,
                    copy_bps: k.copy_bps,
                    pack_bps: k.pack_bps,
                    copy_call_s: k.copy_call_s,
                });
                (m, why + &constants_said)
            }
            StridedMode::Rc if layout == Layout::Packed => {
                return Err(Error::InvalidArgument(format!(
                    "strided read: RC reads the whole {bounding}-byte bounding range into place, which needs Layout::Strided; the packed layout holds only the {} bytes of interest",
                    shape.bytes()
                )))
            }
            m => (m, format!("{m} asked for{constants_said}")),
        };
        let dest = |r: &Run| {
            mem_offset
                + match layout {
                    Layout::Packed => r.packed_offset as usize,
                    Layout::Strided => (r.file_offset - b0) as usize,
                }
        };
        let mut paths = Vec::new();
        let mut retried = false;
        let mut note = |rep: Report| {
            if !paths.contains(&rep.path) {
                paths.push(rep.path);
            }
            retried |= rep.retried;
        };
        let (storage_bytes, calls) = match mode {
            StridedMode::Rc => {
                note(handle.read(b0, mem_offset, bounding)?);
                (aligned_span(b0, b1 - b0, bs), 1)
            }
            StridedMode::Sc => {
                for rep in selective(&handle, Direction::Read, shape, &dest, run)? {
                    note(rep);
                }
                let read = shape
                    .iter()
                    .map(|r| aligned_span(r.file_offset, shape.run, bs))
                    .sum();
                (read, shape.runs)
            }
            StridedMode::Tat | StridedMode::Auto => {
                let choice = match handle.path() {
                    TransferPath::Queues => PathChoice {
                        path: TransferPath::Queues,
                        reason: "strided TaT: packed from host staging".into(),
                    },
                    _ => PathChoice {
                        path: TransferPath::Bounce,
                        reason: "strided TaT: packed in the bounce slots".into(),
                    },
                };
                // The groups share the threads as SC's runs do.
                let reps = shared(groups.len() as u64, &|i| {
                    let g = groups[i as usize];
                    let packer = Packer {
                        shape,
                        origin: g.start,
                        len: (g.end - g.start) as usize,
                        mem,
                        mem_offset,
                        layout,
                        scratch: Mutex::new(Vec::new()),
                    };
                    self.run(
                        Direction::Read,
                        &choice,
                        file,
                        g.start,
                        &packer,
                        0,
                        packer.len,
                    )
                })?;
                for rep in reps {
                    note(rep);
                }
                (tat_storage, groups.len() as u64)
            }
        };
        Ok(StridedReport {
            mode,
            reason,
            bytes: shape.bytes(),
            storage_bytes,
            calls,
            paths,
            retried,
        })
    }

    /// Writes the runs of `shape` to `file` from `mem` at `mem_offset`, laid
    /// out as `layout`: the mirror of [`Engine::read_strided`].
    ///
    /// Writes are SC only, whatever `mode` says for AUTO: a write changes
    /// exactly the bytes it covers, so RC (which would write the gaps) and
    /// TaT (whose transform makes one contiguous transfer on the memory
    /// side, while a write's scattered side is the file) are refused with
    /// [`Error::InvalidArgument`]. Bounds are checked before any I/O; every
    /// run is written or an error returned (runs already written stay
    /// written, as with a failed `pwrite` loop).
    pub fn write_strided(
        &self,
        file: &StorageFile,
        shape: &Shape,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        let run = check_room(shape, mem, mem_offset, layout)?;
        let reason = match mode {
            StridedMode::Sc => "sc asked for".to_string(),
            StridedMode::Auto => "sc: writes go one per run, so that they change exactly the runs' bytes".into(),
            m @ (StridedMode::Rc | StridedMode::Tat) => {
                return Err(Error::InvalidArgument(format!(
                    "strided write: only SC writes; {m} would write the gaps between the runs or needs a contiguous file side"
                )))
            }
        };
        let handle = self.handle(file, mem)?;
        let b0 = shape.base;
        let dest = |r: &Run| {
            mem_offset
                + match layout {
                    Layout::Packed => r.packed_offset as usize,
                    Layout::Strided => (r.file_offset - b0) as usize,
                }
        };
        let mut paths = Vec::new();
        let mut retried = false;
        for rep in selective(&handle, Direction::Write, shape, &dest, run)? {
            if !paths.contains(&rep.path) {
                paths.push(rep.path);
            }
            retried |= rep.retried;
        }
        Ok(StridedReport {
            mode: StridedMode::Sc,
            reason,
            bytes: shape.bytes(),
            storage_bytes: shape.bytes(),
            calls: shape.runs,
            paths,
            retried,
        })
    }
}

/// SC: one engine read (or write) per run at its place (`dest`), on
/// [`shared`] threads.
fn selective(
    handle: &Handle<'_>,
    dir: Direction,
    shape: &Shape,
    dest: &(dyn Fn(&Run) -> usize + Sync),
    run: usize,
) -> Result<Vec<Report>> {
    shared(shape.runs, &|k| {
        let r = Run {
            file_offset: shape.run_at(k),
            packed_offset: k * shape.run,
        };
        match dir {
            Direction::Read => handle.read(r.file_offset, dest(&r), run),
            Direction::Write => handle.write(r.file_offset, dest(&r), run),
        }
    })
}

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
        mem,
        mem_offset: 0,
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
struct Packer<'a> {
    shape: &'a Shape,
    /// The file offset of the range's first byte.
    origin: u64,
    /// The range's length.
    len: usize,
    mem: &'a dyn DeviceMemory,
    mem_offset: usize,
    layout: Layout,
    /// Packing buffers, reused; the copy stage may call from several
    /// threads at once.
    scratch: Mutex<Vec<Vec<u8>>>,
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
        self.mem.kind()
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
        match self.layout {
            Layout::Strided => {
                for &(at, n, _, _) in &pieces {
                    self.mem.write_at(
                        self.mem_offset + (f0 - sh.base) as usize + at,
                        &src[at..at + n],
                    )?;
                }
                Ok(())
            }
            Layout::Packed => {
                // Consecutive pieces are consecutive in the packed layout.
                let dst = self.mem_offset + (k0 * sh.run + in0) as usize;
                if let [(at, n, _, _)] = pieces[..] {
                    return self.mem.write_at(dst, &src[at..at + n]);
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
                let r = self.mem.write_at(dst, &buf);
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

    fn dma_target(&self) -> Option<DmaTarget> {
        None
    }
}
