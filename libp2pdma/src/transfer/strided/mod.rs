//! Strided reads: many equal runs of a file, laid out by up to three
//! strides, read into device memory in one call.
//!
//! Three ways to move them (after Redundant Copy, Selective Copy and
//! Transfer after Transform, in the strided-transfer literature):
//!
//! - **RC**: one read of the bounding range, gaps included, straight to its
//!   place; needs [`Layout::Strided`] (room for the whole range), and fills
//!   the gaps between the runs with the file's bytes there.
//! - **SC**: one engine read per run, straight to its place.
//! - **TaT**: the bounding range through the bounce slots (split where a
//!   gap costs more to read than a call); as each chunk lands, the runs in
//!   it are packed on the host and copied into device memory, the storage
//!   read of the next chunks overlapping the packing of this one.
//!
//! [`StridedMode::Auto`] chooses with [`plan`], a pure function of the
//! shape's numbers and the machine's, and says why.

mod host;

pub use host::{plan_copy, CopyFacts, STAGE};

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
};

use super::{bounce, Direction, Engine, PathChoice, StorageFile, TransferPath};
use crate::{
    memory::{DeviceMemory, DmaTarget, MemoryKind},
    Error, Result,
};

/// The most dimensions a [`Shape`] has.
pub const MAX_DIMS: usize = 3;

/// One dimension of a [`Shape`]: `count` steps of `stride` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim {
    /// Bytes between the starts of consecutive steps.
    pub stride: u64,
    /// Steps (at least 1).
    pub count: u64,
}

/// Where the bytes of a strided read lie in the file: runs of `run` bytes,
/// the first at `base`, the others found by stepping through the
/// dimensions, innermost (fastest varying) first.
///
/// A column range of a row-major table is `base` = the table's offset plus
/// the range's first column byte, `run` = the range's width in bytes, and
/// one dimension `(row pitch, rows)`.
///
/// # Invariants
///
/// `run > 0`; every count is at least 1; each dimension with more than one
/// step has a stride at least the extent of everything inside it (the run
/// for the innermost), so runs never overlap and come in increasing file
/// order; the last byte of the last run, and the run count, fit in a `u64`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    base: u64,
    run: u64,
    dims: Vec<Dim>,
    /// Bytes from `base` to the end of the last run.
    extent: u64,
    runs: u64,
}

impl Shape {
    /// A shape of runs of `run` bytes from `base`, stepping through `dims`
    /// (`(stride, count)`, innermost first, at most [`MAX_DIMS`]).
    ///
    /// Refused with [`Error::InvalidArgument`]: a zero `run` or count, more
    /// than three dimensions, a dimension whose steps would overlap what is
    /// inside it (stride below the inner extent), and shapes whose last byte
    /// or run count overflows a `u64`.
    pub fn new(base: u64, run: u64, dims: &[(u64, u64)]) -> Result<Self> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("strided shape: {why}")));
        if run == 0 {
            return bad("the run length is 0".into());
        }
        if dims.len() > MAX_DIMS {
            return bad(format!(
                "{} dimensions, at most {MAX_DIMS} are supported",
                dims.len()
            ));
        }
        let mut extent = run;
        let mut runs = 1u64;
        for (i, &(stride, count)) in dims.iter().enumerate() {
            if count == 0 {
                return bad(format!("dimension {i} has a count of 0"));
            }
            if count > 1 && stride < extent {
                return bad(format!(
                    "dimension {i}'s stride {stride} is below the {extent} bytes inside it: runs would overlap"
                ));
            }
            let Some(e) = (count - 1)
                .checked_mul(stride)
                .and_then(|s| s.checked_add(extent))
            else {
                return bad(format!("dimension {i}'s extent overflows"));
            };
            extent = e;
            runs = match runs.checked_mul(count) {
                Some(r) => r,
                None => return bad("the run count overflows".into()),
            };
        }
        if base.checked_add(extent).is_none() {
            return bad(format!(
                "base {base} plus the {extent}-byte extent overflows a u64"
            ));
        }
        Ok(Self {
            base,
            run,
            dims: dims
                .iter()
                .map(|&(stride, count)| Dim { stride, count })
                .collect(),
            extent,
            runs,
        })
    }

    /// The first run's file offset.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes per run.
    pub fn run_len(&self) -> u64 {
        self.run
    }

    /// The dimensions, innermost first.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// How many runs.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Bytes of interest: the runs' total.
    pub fn bytes(&self) -> u64 {
        self.runs * self.run
    }

    /// The bounding range: the first run's first byte and one past the last
    /// run's last byte.
    pub fn bounds(&self) -> (u64, u64) {
        (self.base, self.base + self.extent)
    }

    /// Bytes of the bounding range.
    pub fn bounding_len(&self) -> u64 {
        self.extent
    }

    /// rho: bytes of interest over bytes of the bounding range (0 < rho <= 1).
    pub fn rho(&self) -> f64 {
        self.bytes() as f64 / self.extent as f64
    }

    /// File offset of run `k` (`k < runs`).
    fn run_at(&self, mut k: u64) -> u64 {
        let mut off = self.base;
        for d in &self.dims {
            off += (k % d.count) * d.stride;
            k /= d.count;
        }
        off
    }

    /// The first run that ends after file offset `f`.
    fn first_ending_after(&self, f: u64) -> u64 {
        // Runs come in increasing file order (the invariant), so their ends
        // do too.
        let (mut lo, mut hi) = (0, self.runs);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.run_at(mid) + self.run <= f {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The runs in file order.
    pub fn iter(&self) -> Runs<'_> {
        Runs {
            shape: self,
            next: 0,
        }
    }
}

/// One run of a [`Shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Its offset in the file.
    pub file_offset: u64,
    /// Its offset among the runs packed back to back.
    pub packed_offset: u64,
}

/// The runs of a [`Shape`], in file order.
#[derive(Clone, Debug)]
pub struct Runs<'a> {
    shape: &'a Shape,
    next: u64,
}

impl Iterator for Runs<'_> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        if self.next >= self.shape.runs {
            return None;
        }
        let k = self.next;
        self.next += 1;
        Some(Run {
            file_offset: self.shape.run_at(k),
            packed_offset: k * self.shape.run,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.shape.runs - self.next).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

/// Where the runs go in device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Back to back from the memory offset, in file order.
    Packed,
    /// Each run at the memory offset plus its distance from the bounding
    /// range's start: the memory mirrors the bounding range. The memory
    /// between runs is the transfer's to use: RC fills it with the file's
    /// bytes there, SC and TaT leave it as it was.
    Strided,
}

/// How a strided read moves its runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StridedMode {
    /// Chosen by [`plan`].
    Auto,
    /// Redundant copy: one read of the bounding range ([`Layout::Strided`]
    /// only).
    Rc,
    /// Selective copy: one read per run.
    Sc,
    /// Transfer after transform: the bounding range through host slots,
    /// packed there, then copied into device memory.
    Tat,
}

impl fmt::Display for StridedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StridedMode::Auto => "auto",
            StridedMode::Rc => "rc",
            StridedMode::Sc => "sc",
            StridedMode::Tat => "tat",
        })
    }
}

/// What [`plan`] decides from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanFacts {
    /// Bytes of the bounding range (the volume).
    pub bounding: u64,
    /// Bytes of interest.
    pub interest: u64,
    /// Runs.
    pub runs: u64,
    /// Bytes SC reads from storage: each run rounded out to whole blocks.
    pub sc_storage: u64,
    /// Bytes TaT reads from storage: its groups of runs, each rounded out
    /// to whole blocks (the bounding range when the gaps are all small).
    pub tat_storage: u64,
    /// TaT's engine reads: one per group of runs.
    pub tat_calls: u64,
    /// Whether the destination has room for the bounding range where RC
    /// puts it (the strided layout).
    pub rc_fits: bool,
    /// Whether the pair's path moves storage bytes into the memory without
    /// the CPU (P2P): then RC and SC copy nothing on the host.
    pub direct: bool,
    /// Whether SC's reads can take the direct path: each run's memory
    /// offset lies at the same place within a block as its file offset.
    /// Reads where they do not are redone through host memory, as on the
    /// bounce path.
    pub sc_aligned: bool,
    /// The same for RC's one read.
    pub rc_aligned: bool,
    /// Seconds a thread spends on one small engine read while SC's threads
    /// read at once (a round trip to the storage, the engine's setup).
    pub call_s: f64,
    /// Seconds a thread spends on one 1 MiB engine read while SC's threads
    /// read at once.
    pub call_mib_s: f64,
    /// Storage bytes per second.
    pub storage_bps: f64,
    /// Bytes per second copied from host memory into device memory.
    pub copy_bps: f64,
    /// Bytes per second gathered from runs into a packed host buffer.
    pub pack_bps: f64,
    /// Seconds one copy into device memory costs beyond its bytes.
    pub copy_call_s: f64,
}

pub use super::constants::{
    DEFAULT_CALL_MIB_S, DEFAULT_CALL_S, DEFAULT_COPY_BPS, DEFAULT_COPY_CALL_S, DEFAULT_PACK_BPS,
    DEFAULT_STORAGE_BPS,
};

/// Threads SC issues its reads from (and TaT its groups' reads), each a
/// share of the runs in file order, one engine read after another (as many
/// as the engine's asynchronous workers).
pub const SC_THREADS: usize = 4;

const MIB_F: f64 = (1u64 << 20) as f64;

/// The read-cost constants of the model: k, k1 and s.
#[derive(Clone, Copy, Debug)]
struct ReadCost {
    call_s: f64,
    call_mib_s: f64,
    storage_bps: f64,
}

impl ReadCost {
    fn of(f: &PlanFacts) -> Self {
        Self {
            call_s: f.call_s,
            call_mib_s: f.call_mib_s,
            storage_bps: f.storage_bps,
        }
    }

    fn of_constants(k: &super::constants::Constants) -> Self {
        Self {
            call_s: k.call_s,
            call_mib_s: k.call_mib_s,
            storage_bps: k.storage_bps,
        }
    }

    /// The aggregate storage rate with `active` threads reading at once:
    /// s for one; for all of SC's threads, what their 1 MiB reads showed
    /// (k1 - k for each MiB at a thread's share); in proportion between.
    fn rate(&self, active: u64) -> f64 {
        let s = self.storage_bps.max(1.0);
        let all = (SC_THREADS as f64 * MIB_F / (self.call_mib_s - self.call_s).max(1e-9)).min(s);
        let a = active.clamp(1, SC_THREADS as u64) as f64;
        s + (all - s) * (a - 1.0) / (SC_THREADS as f64 - 1.0)
    }

    /// Seconds a thread spends on one engine read of `len` bytes while
    /// `active` threads read at once: the call, and the bytes at the
    /// thread's share of the aggregate rate.
    fn time(&self, len: f64, active: u64) -> f64 {
        self.call_s + len * active.max(1) as f64 / self.rate(active)
    }

    /// Seconds TaT's storage reads take as `groups`, on SC's threads.
    fn groups_time(&self, groups: &[Group], bs: u64) -> f64 {
        let g = groups.len().max(1) as u64;
        let bytes: u64 = groups
            .iter()
            .map(|x| aligned_span(x.start, x.end - x.start, bs))
            .sum();
        g.div_ceil(SC_THREADS as u64) as f64
            * self.time(bytes as f64 / g as f64, g.min(SC_THREADS as u64))
    }
}

/// TaT's reads for `shape`: of the groupings that merge every gap up to
/// one of the shape's gap widths (or none but touching runs), the one
/// whose reads the model `k` estimates fastest. Merging a gap reads it;
/// splitting there costs another call and may share the storage among
/// more threads, each at a lower rate.
fn tat_plan(shape: &Shape, k: &ReadCost, bs: u64) -> Vec<Group> {
    let mut widths = vec![0u64];
    let mut inner = shape.run;
    for d in &shape.dims {
        if d.count > 1 {
            widths.push(d.stride - inner);
        }
        inner += (d.count - 1) * d.stride;
    }
    widths.sort_unstable();
    widths.dedup();
    widths
        .into_iter()
        .map(|w| tat_groups(shape, w))
        .min_by(|a, b| k.groups_time(a, bs).total_cmp(&k.groups_time(b, bs)))
        .unwrap_or_default()
}

/// The estimated seconds of each mode (`None` for RC when it does not fit).
fn costs(f: &PlanFacts) -> (Option<f64>, f64, f64) {
    let (c, p) = (f.copy_bps.max(1.0), f.pack_bps.max(1.0));
    let (v, i) = (f.bounding as f64, f.interest as f64);
    let threads = SC_THREADS as u64;
    // The bounce pipeline takes about its slower stage; P2P has no copy.
    let rc = f.rc_fits.then(|| {
        let t = ReadCost::of(f).time(v, 1);
        if f.direct && f.rc_aligned {
            t
        } else {
            t.max(v / c)
        }
    });
    // Off P2P each read's bytes are copied once they land; runs the direct
    // path cannot place are tried there first, then redone through host
    // memory.
    let n = f.runs.max(1);
    let per_thread = n.div_ceil(threads) as f64;
    let k = ReadCost::of(f);
    let sc = per_thread * k.time(f.sc_storage as f64 / n as f64, n.min(threads))
        + match (f.direct, f.sc_aligned) {
            (true, true) => 0.0,
            (true, false) => per_thread * f.call_s + i / c,
            (false, _) => i / c,
        };
    // TaT's host work: packing and one copy per chunk (packed layout), or
    // one copy per run (strided layout, where RC fits).
    let host = if f.rc_fits {
        i / c + f.runs as f64 * f.copy_call_s
    } else {
        i / p + i / c
    };
    let g = f.tat_calls.max(1);
    let tat = (g.div_ceil(threads) as f64
        * k.time(f.tat_storage as f64 / g as f64, g.min(threads)))
    .max(f.call_s + host);
    (rc, sc, tat)
}

/// Estimates this close (relative) count as a tie, settled by CPU work:
/// two modes bound by the same storage reads differ by their rounding.
const TIE: f64 = 0.02;

/// AUTO's choice for a strided read, and why: the mode with the smallest
/// estimated time, where
///
/// - RC = call + volume / storage (P2P), or the slower of volume / storage
///   and volume / copy (bounce pipeline); only when it fits;
/// - SC = runs / [`SC_THREADS`] x call + SC's storage bytes / storage
///   (+ interest / copy off P2P): its calls run on that many threads, each
///   one call after another;
/// - TaT = groups / [`SC_THREADS`] x call + the slower of TaT's storage
///   bytes / storage and its host work: interest / pack + interest / copy
///   (packed layout), or interest / copy + runs x copy call (strided
///   layout, one copy per run) (a gap wider than a call's worth of storage
///   bytes splits the runs into groups, read as SC's runs are).
///
/// Estimates within 2% tie; a tie goes to the mode with less CPU work
/// (copies into the memory off P2P, TaT's packing or placing of each run),
/// then on a P2P pair to RC, then SC, then TaT, through the bounce pipeline
/// to TaT, then RC, then SC.
pub fn plan(f: &PlanFacts) -> (StridedMode, String) {
    let (rc, sc, tat) = costs(f);
    let us = |t: f64| format!("{:.0} µs", t * 1e6);
    let (c, p) = (f.copy_bps.max(1.0), f.pack_bps.max(1.0));
    let (v, i) = (f.bounding as f64, f.interest as f64);
    // The CPU's share of each mode: copies into the memory off P2P, and
    // TaT's packing or placing of each run.
    let cpu = |m: StridedMode| match m {
        StridedMode::Rc if !(f.direct && f.rc_aligned) => v / c,
        StridedMode::Sc if !(f.direct && f.sc_aligned) => i / c,
        StridedMode::Tat if f.rc_fits => i / c + f.runs as f64 * f.copy_call_s,
        StridedMode::Tat => i / p + i / c,
        _ => 0.0,
    };
    let mut cands = Vec::new();
    if f.direct {
        cands.extend(rc.map(|t| (StridedMode::Rc, t)));
        cands.push((StridedMode::Sc, sc));
        cands.push((StridedMode::Tat, tat));
    } else {
        cands.push((StridedMode::Tat, tat));
        cands.extend(rc.map(|t| (StridedMode::Rc, t)));
        cands.push((StridedMode::Sc, sc));
    }
    let fastest = cands.iter().map(|&(_, t)| t).fold(f64::INFINITY, f64::min);
    // Within TIE of the fastest, the mode with the least CPU work; then the
    // order above.
    let best = cands
        .iter()
        .filter(|&&(_, t)| t <= fastest * (1.0 + TIE))
        .fold(None::<StridedMode>, |b, &(m, _)| match b {
            Some(bm) if cpu(bm) <= cpu(m) => b,
            _ => Some(m),
        })
        .unwrap_or(StridedMode::Tat);
    let rc_said = match rc {
        Some(t) => format!("RC {}", us(t)),
        None => "RC does not fit (the packed layout has no room for the bounding range)".into(),
    };
    let reason = format!(
        "{best} by estimate: {} runs, rho {:.3} of {} bounding bytes; {rc_said}, SC {}, TaT {} ({} path)",
        f.runs,
        f.interest as f64 / f.bounding.max(1) as f64,
        f.bounding,
        us(sc),
        us(tat),
        match (f.direct, f.sc_aligned, f.rc_aligned || !f.rc_fits) {
            (false, _, _) => "bounce",
            (true, true, true) => "P2P",
            (true, false, true) => "P2P; SC's runs off their blocks' alignment in memory, through host memory",
            (true, true, false) => "P2P; RC's range off its blocks' alignment in memory, through host memory",
            (true, false, false) => "P2P; SC's runs and RC's range off their blocks' alignment in memory, through host memory",
        },
    );
    (best, reason)
}

/// What a strided read did.
#[derive(Clone, Debug, PartialEq)]
pub struct StridedReport {
    /// The mode that moved the runs.
    pub mode: StridedMode,
    /// Why that mode (AUTO's estimate, or that it was asked for).
    pub reason: String,
    /// Bytes of interest moved.
    pub bytes: u64,
    /// Bytes read from storage, with the block rounding of each read; for
    /// writes, the bytes written.
    pub storage_bytes: u64,
    /// Engine transfers issued.
    pub calls: u64,
    /// The paths the transfers took, each once, in the order first seen.
    pub paths: Vec<TransferPath>,
    /// Whether a transfer was redone on the bounce path.
    pub retried: bool,
}

/// Checks that `mem` holds what `layout` puts there from `mem_offset`, and
/// returns the run length as a `usize`.
fn check_room(
    shape: &Shape,
    mem: &dyn DeviceMemory,
    mem_offset: usize,
    layout: Layout,
) -> Result<usize> {
    let room = match layout {
        Layout::Packed => shape.bytes(),
        Layout::Strided => shape.bounding_len(),
    };
    let fits = usize::try_from(room)
        .ok()
        .and_then(|r| mem_offset.checked_add(r))
        .is_some_and(|end| end <= mem.len());
    if !fits {
        return Err(Error::OutOfBounds {
            offset: mem_offset as u64,
            len: room,
            size: mem.len() as u64,
        });
    }
    // The run is at most `room`, which fits in a usize.
    Ok(shape.run as usize)
}

/// The block-aligned span around `[f, f + n)`.
fn aligned_span(f: u64, n: u64, bs: u64) -> u64 {
    bounce::round_up(f + n, bs) - bounce::round_down(f, bs)
}

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
        let mut note = |rep: super::Report| {
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

/// A range of the file TaT reads in one engine read: runs with no gap
/// wider than the threshold between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Group {
    /// The first run's file offset.
    start: u64,
    /// One past the last run's last byte.
    end: u64,
}

/// TaT's reads: the runs split where the gap between two is wider than
/// `max_gap` bytes (reading it would cost more than another call).
fn tat_groups(shape: &Shape, max_gap: u64) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for r in shape.iter() {
        let end = r.file_offset + shape.run;
        match groups.last_mut() {
            Some(g) if r.file_offset - g.end <= max_gap => g.end = end,
            _ => groups.push(Group {
                start: r.file_offset,
                end,
            }),
        }
    }
    groups
}

/// SC: one engine read (or write) per run at its place (`dest`), on
/// [`shared`] threads.
fn selective(
    handle: &super::Handle<'_>,
    dir: Direction,
    shape: &Shape,
    dest: &(dyn Fn(&Run) -> usize + Sync),
    run: usize,
) -> Result<Vec<super::Report>> {
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
pub(super) fn shared(
    n: u64,
    job: &(dyn Fn(u64) -> Result<super::Report> + Sync),
) -> Result<Vec<super::Report>> {
    let threads = usize::try_from(n).unwrap_or(usize::MAX).min(SC_THREADS);
    if threads == 0 {
        return Ok(Vec::new());
    }
    let share = n.div_ceil(threads as u64);
    let failed = AtomicBool::new(false);
    // Each thread keeps one report of each kind it saw (path, retried).
    let part = |t: u64| -> Result<Vec<super::Report>> {
        let mut seen: Vec<super::Report> = Vec::new();
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
pub(super) fn measure_placement(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_numbers_and_runs() {
        // Columns 10..14 of a 100-byte-wide table of 3 rows, at 1000.
        let s = Shape::new(1010, 4, &[(100, 3)]).unwrap();
        assert_eq!(s.runs(), 3);
        assert_eq!(s.bytes(), 12);
        assert_eq!(s.bounds(), (1010, 1214));
        assert!((s.rho() - 12.0 / 204.0).abs() < 1e-12);
        let runs: Vec<_> = s.iter().map(|r| (r.file_offset, r.packed_offset)).collect();
        assert_eq!(runs, vec![(1010, 0), (1110, 4), (1210, 8)]);
        // Three dimensions, innermost first.
        let s = Shape::new(0, 2, &[(3, 2), (10, 2), (100, 2)]).unwrap();
        let offs: Vec<_> = s.iter().map(|r| r.file_offset).collect();
        assert_eq!(offs, vec![0, 3, 10, 13, 100, 103, 110, 113]);
        assert_eq!(s.bounds(), (0, 115));
        for (k, &o) in offs.iter().enumerate() {
            assert_eq!(s.first_ending_after(o), k as u64);
            assert_eq!(s.first_ending_after(o + 1), k as u64);
            assert_eq!(s.first_ending_after(o + 2), k as u64 + 1);
        }
        // No dimensions: one run; touching runs are fine.
        assert_eq!(Shape::new(5, 7, &[]).unwrap().bounds(), (5, 12));
        assert_eq!(Shape::new(0, 4, &[(4, 3)]).unwrap().rho(), 1.0);
        // A count of 1 ignores its stride.
        assert_eq!(Shape::new(0, 4, &[(0, 1)]).unwrap().runs(), 1);
    }

    #[test]
    fn bad_shapes_are_errors() {
        type Bad = (u64, u64, &'static [(u64, u64)]);
        let bad: &[Bad] = &[
            (0, 0, &[]),
            (0, 4, &[(8, 0)]),
            (0, 4, &[(8, 2), (100, 0)]),
            (0, 1, &[(1, 1), (1, 1), (1, 1), (1, 1)]),
            // Overlapping runs, and overlapping rows of runs.
            (0, 8, &[(4, 2)]),
            (0, 4, &[(4, 3), (8, 2)]),
            (0, 4, &[(0, 2)]),
            // Overflows.
            (u64::MAX - 3, 4, &[]),
            (u64::MAX - 10, 4, &[(8, 2)]),
            (0, 1, &[(u64::MAX, 3)]),
            (0, 1, &[(1, u64::MAX), (u64::MAX, 2)]),
            (0, u64::MAX, &[(u64::MAX, 2)]),
        ];
        for &(base, run, dims) in bad {
            match Shape::new(base, run, dims) {
                Err(Error::InvalidArgument(why)) => assert!(why.starts_with("strided shape: ")),
                other => panic!("{base} {run} {dims:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn tat_groups_split_at_wide_gaps() {
        // Rows of 4 runs of 10 bytes, 20 apart; rows 1000 apart.
        let s = Shape::new(5, 10, &[(20, 4), (1000, 3)]).unwrap();
        let g = |start, end| Group { start, end };
        assert_eq!(tat_groups(&s, 9).len(), 12);
        assert_eq!(
            tat_groups(&s, 10),
            (0..3)
                .map(|r| g(5 + r * 1000, 75 + r * 1000))
                .collect::<Vec<_>>()
        );
        assert_eq!(tat_groups(&s, 930), vec![g(5, 2075)]);
        assert_eq!(tat_groups(&s, 929).len(), 3);
        assert_eq!(tat_groups(&s, 0).len(), 12);
        // Touching runs always go together.
        let s = Shape::new(0, 8, &[(8, 5)]).unwrap();
        assert_eq!(tat_groups(&s, 0), vec![g(0, 40)]);
    }

    #[test]
    fn tat_reads_gaps_where_that_beats_more_reads() {
        use super::super::constants::Constants;
        let d = ReadCost::of_constants(&Constants::default());
        // The development host: 1 MiB reads on four threads stream at
        // about half the rate of one large read.
        let host = ReadCost {
            call_s: 100e-6,
            call_mib_s: 4.1e-3,
            storage_bps: 2.5 * (1u64 << 30) as f64,
        };
        let groups = |s: &Shape, k: &ReadCost| tat_plan(s, k, 4096).len();
        // 48 runs of 1 MiB, 1.33 MiB apart: one read with the gaps on the
        // host; 48 reads on four threads with the defaults' full rate.
        let mib = Shape::new(0, 1 << 20, &[(1_398_101, 48)]).unwrap();
        assert_eq!(groups(&mib, &host), 1);
        assert_eq!(groups(&mib, &d), 48);
        // Clusters of 8 runs of 4 KiB, 16 MiB apart: the clusters apart
        // (their gaps would cost far more than a call), each one read.
        let clusters = Shape::new(0, 4096, &[(8192, 8), (16 << 20, 8)]).unwrap();
        assert_eq!(groups(&clusters, &host), 8);
        assert_eq!(groups(&clusters, &d), 8);
        // Touching runs are always one read.
        let dense = Shape::new(0, 512, &[(512, 1000)]).unwrap();
        assert_eq!(groups(&dense, &host), 1);
        // One thread streams at s; four at what 1 MiB reads showed.
        assert_eq!(host.rate(1), host.storage_bps);
        let all = 4.0 * MIB_F / (4.1e-3 - 100e-6);
        assert!((host.rate(4) - all).abs() < 1.0);
        assert!(host.rate(2) < host.rate(1) && host.rate(2) > host.rate(4));
    }

    #[test]
    fn plan_table() {
        const MIB: u64 = 1 << 20;
        let base = PlanFacts {
            bounding: 64 * MIB,
            interest: 32 * MIB,
            runs: 1024,
            sc_storage: 32 * MIB + 1024 * 4096,
            tat_storage: 64 * MIB,
            tat_calls: 1,
            rc_fits: true,
            direct: false,
            sc_aligned: true,
            rc_aligned: true,
            call_s: DEFAULT_CALL_S,
            call_mib_s: DEFAULT_CALL_MIB_S,
            storage_bps: DEFAULT_STORAGE_BPS,
            copy_bps: DEFAULT_COPY_BPS,
            pack_bps: DEFAULT_PACK_BPS,
            copy_call_s: DEFAULT_COPY_CALL_S,
        };
        let cases: &[(&str, PlanFacts, StridedMode)] = &[
            (
                "bounce, storage-bound: TaT ties RC and copies less",
                base,
                StridedMode::Tat,
            ),
            (
                "P2P, room for RC: one read, no CPU copy",
                PlanFacts {
                    direct: true,
                    ..base
                },
                StridedMode::Rc,
            ),
            (
                "P2P, packed layout: TaT's single call beats 1024 calls",
                PlanFacts {
                    direct: true,
                    rc_fits: false,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "bounce, slow copies: RC copies the whole volume, TaT only rho of it",
                PlanFacts {
                    copy_bps: DEFAULT_STORAGE_BPS / 4.0,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "bounce, tiny rho: TaT's groups are the 4 runs, read as SC's, copies overlapped",
                PlanFacts {
                    bounding: 1024 * MIB,
                    interest: 4 * 4096,
                    runs: 4,
                    sc_storage: 4 * 4096,
                    tat_storage: 4 * 4096,
                    tat_calls: 4,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "tiny rho, P2P, packed: SC ties TaT and reads straight into the memory",
                PlanFacts {
                    bounding: 1024 * MIB,
                    interest: 4 * 4096,
                    runs: 4,
                    sc_storage: 4 * 4096,
                    tat_storage: 4 * 4096,
                    tat_calls: 4,
                    direct: true,
                    rc_fits: false,
                    ..base
                },
                StridedMode::Sc,
            ),
            (
                "many small runs close together, packed: one bulk read, packed on the host",
                PlanFacts {
                    bounding: 8 * MIB,
                    interest: 4 * MIB,
                    runs: 65536,
                    sc_storage: 65536 * 4096,
                    tat_storage: 8 * MIB,
                    rc_fits: false,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "many small runs close together, strided layout: TaT's copy per run costs more than RC's gaps",
                PlanFacts {
                    bounding: 8 * MIB,
                    interest: 4 * MIB,
                    runs: 65536,
                    sc_storage: 65536 * 4096,
                    tat_storage: 8 * MIB,
                    ..base
                },
                StridedMode::Rc,
            ),
            (
                "bounce, packed, 4096 runs of 8 KiB: one read packed on the host",
                PlanFacts {
                    runs: 4096,
                    sc_storage: 32 * MIB,
                    rc_fits: false,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "the same with packing 16 times slower than storage: SC needs no packing",
                PlanFacts {
                    runs: 4096,
                    sc_storage: 32 * MIB,
                    rc_fits: false,
                    pack_bps: DEFAULT_STORAGE_BPS / 16.0,
                    ..base
                },
                StridedMode::Sc,
            ),
            (
                "48 runs of 1 MiB, 1 MiB reads streaming at half the rate of a large one: one read beats 12 a thread",
                PlanFacts {
                    bounding: 64 * MIB,
                    interest: 48 * MIB,
                    runs: 48,
                    sc_storage: 48 * MIB,
                    tat_storage: 64 * MIB,
                    tat_calls: 1,
                    rc_fits: false,
                    call_s: 150e-6,
                    call_mib_s: 4.5e-3,
                    storage_bps: 1.74 * (1u64 << 30) as f64,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "the same on P2P with room: RC, no copy",
                PlanFacts {
                    bounding: 64 * MIB,
                    interest: 48 * MIB,
                    runs: 48,
                    sc_storage: 48 * MIB,
                    tat_storage: 64 * MIB,
                    tat_calls: 1,
                    direct: true,
                    call_s: 150e-6,
                    call_mib_s: 4.5e-3,
                    storage_bps: 1.74 * (1u64 << 30) as f64,
                    ..base
                },
                StridedMode::Rc,
            ),
            (
                "bounce, strided layout, rho 1: RC and TaT read the same; RC copies in chunks, TaT run by run",
                PlanFacts {
                    interest: 64 * MIB,
                    runs: 131072,
                    sc_storage: 131072 * 4096,
                    copy_call_s: 50e-9,
                    ..base
                },
                StridedMode::Rc,
            ),
            (
                "bounce, 4 runs just under the split apart: SC reads 16 KiB, TaT 616 KiB",
                PlanFacts {
                    bounding: 616 << 10,
                    interest: 16 << 10,
                    runs: 4,
                    sc_storage: 16 << 10,
                    tat_storage: 616 << 10,
                    tat_calls: 1,
                    rc_fits: false,
                    ..base
                },
                StridedMode::Sc,
            ),
            (
                "the same with the runs off block alignment in memory: SC's reads go through host memory, TaT overlaps the copies",
                PlanFacts {
                    bounding: 1024 * MIB,
                    interest: 4 * 4096,
                    runs: 4,
                    sc_storage: 4 * 4096,
                    tat_storage: 4 * 4096,
                    tat_calls: 4,
                    direct: true,
                    rc_fits: false,
                    sc_aligned: false,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "clusters of runs far apart: TaT's 8 grouped reads (2 a thread) beat SC's 64 (16 a thread)",
                PlanFacts {
                    bounding: 1024 * MIB,
                    interest: 64 * 4096,
                    runs: 64,
                    sc_storage: 64 * 4096,
                    tat_storage: 8 * 8 * 4096,
                    tat_calls: 8,
                    rc_fits: false,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "one run, packed: TaT and SC read the same, TaT overlaps its copy",
                PlanFacts {
                    bounding: MIB,
                    interest: MIB,
                    runs: 1,
                    sc_storage: MIB,
                    tat_storage: MIB,
                    rc_fits: false,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "one run, strided layout: RC ties TaT with less CPU work (no copy per run)",
                PlanFacts {
                    bounding: MIB,
                    interest: MIB,
                    runs: 1,
                    sc_storage: MIB,
                    tat_storage: MIB,
                    ..base
                },
                StridedMode::Rc,
            ),
        ];
        for (what, facts, want) in cases {
            let (got, reason) = plan(facts);
            assert_eq!(got, *want, "{what}: {reason}");
            assert!(
                reason.starts_with(&format!("{want} by estimate")),
                "{reason}"
            );
            if !facts.rc_fits {
                assert!(reason.contains("RC does not fit"), "{reason}");
            }
        }
    }
}
