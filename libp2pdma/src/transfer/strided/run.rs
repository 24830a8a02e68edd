//! Strided transfers on the engine: RC, SC and TaT, and the placement
//! measurement the cost model's constants come from.

use std::sync::Mutex;

use super::{
    cost::{plan, tat_plan, PlanFacts, ReadCost},
    pack::{shared, Packer},
    shape::{aligned_span, check_room, Layout, Run, Shape, StridedMode, StridedReport},
    view::Strided,
};
use crate::{
    memory::MemRange,
    transfer::{
        core::{Handle, Job, Report},
        plan::{PathChoice, TransferPath},
        storage::StorageFile,
        xfer::Direction,
    },
    Error, Result,
};

impl Strided<'_> {
    /// Reads the runs of `shape` from `file` into `range` from its start,
    /// laid out as `layout`, moved as `mode` says ([`StridedMode::Auto`]:
    /// as [`plan`] estimates best).
    ///
    /// Everything is checked before any I/O: the range must hold the
    /// packed bytes ([`Layout::Packed`]) or the bounding range
    /// ([`Layout::Strided`]); RC needs the strided layout. Every run is moved
    /// or an error returned, never part of them as success.
    pub fn read(
        &self,
        file: &StorageFile,
        shape: &Shape,
        range: MemRange<'_>,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        let run = check_room(shape, range, layout)?;
        let (core, mem, start) = (self.core, range.mem(), range.offset());
        let bs = file.block as u64;
        let (b0, b1) = shape.bounds();
        let bounding = usize::try_from(b1 - b0).map_err(|_| {
            Error::InvalidArgument("strided read: the bounding range is longer than memory".into())
        })?;
        let handle = core.handle(file, mem)?;
        let direct = handle.path() != TransferPath::Bounce;
        let within = |m: usize, f: u64| m as u64 % bs == f % bs;
        // AUTO and TaT need the constants (TaT for where to split its
        // reads); SC and RC as asked for need none.
        let resolved = matches!(mode, StridedMode::Auto | StridedMode::Tat)
            .then(|| self.constants(Some(file), mem, handle.path()));
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
                    within(start + m as usize, r.file_offset)
                }),
                rc_aligned: within(start, b0),
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
        let dest = |r: &Run| start + layout.place(b0, r);
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
                note(handle.read(b0, start, bounding)?);
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
                        dest: range,
                        layout,
                        scratch: Mutex::new(Vec::new()),
                    };
                    let range = MemRange::whole(&packer);
                    core.run(Job {
                        dir: Direction::Read,
                        choice: &choice,
                        file,
                        file_offset: g.start,
                        range,
                    })
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

    /// Writes the runs of `shape` to `file` from `range`, laid out as
    /// `layout` from its start: the mirror of [`Strided::read`].
    ///
    /// Writes are SC only, whatever `mode` says for AUTO: a write changes
    /// exactly the bytes it covers, so RC (which would write the gaps) and
    /// TaT (whose transform makes one contiguous transfer on the memory
    /// side, while a write's scattered side is the file) are refused with
    /// [`Error::InvalidArgument`]. Bounds are checked before any I/O; every
    /// run is written or an error returned (runs already written stay
    /// written, as with a failed `pwrite` loop).
    pub fn write(
        &self,
        file: &StorageFile,
        shape: &Shape,
        range: MemRange<'_>,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        let run = check_room(shape, range, layout)?;
        let reason = match mode {
        StridedMode::Sc => "sc asked for".to_string(),
        StridedMode::Auto => "sc: writes go one per run, so that they change exactly the runs' bytes".into(),
        m @ (StridedMode::Rc | StridedMode::Tat) => {
            return Err(Error::InvalidArgument(format!(
                "strided write: only SC writes; {m} would write the gaps between the runs or needs a contiguous file side"
            )))
        }
    };
        let handle = self.core.handle(file, range.mem())?;
        let (start, b0) = (range.offset(), shape.base);
        let dest = |r: &Run| start + layout.place(b0, r);
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
