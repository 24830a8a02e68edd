//! The cost model that chooses RC, SC or TaT: a pure function of the
//! shape's numbers and the machine's.

use super::shape::{aligned_span, Shape, StridedMode};
use crate::transfer::tuning::constants::Constants;
pub use crate::transfer::tuning::constants::SC_THREADS;

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

pub(crate) const MIB_F: f64 = (1u64 << 20) as f64;

/// The read-cost constants of the model: k, k1 and s.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadCost {
    pub(crate) call_s: f64,
    pub(crate) call_mib_s: f64,
    pub(crate) storage_bps: f64,
}

impl ReadCost {
    pub(crate) fn of(f: &PlanFacts) -> Self {
        Self {
            call_s: f.call_s,
            call_mib_s: f.call_mib_s,
            storage_bps: f.storage_bps,
        }
    }

    pub(crate) fn of_constants(k: &Constants) -> Self {
        Self {
            call_s: k.call_s,
            call_mib_s: k.call_mib_s,
            storage_bps: k.storage_bps,
        }
    }

    /// The aggregate storage rate with `active` threads reading at once:
    /// s for one; for all of SC's threads, what their 1 MiB reads showed
    /// (k1 - k for each MiB at a thread's share); in proportion between.
    pub(crate) fn rate(&self, active: u64) -> f64 {
        let s = self.storage_bps.max(1.0);
        let all = (SC_THREADS as f64 * MIB_F / (self.call_mib_s - self.call_s).max(1e-9)).min(s);
        let a = active.clamp(1, SC_THREADS as u64) as f64;
        s + (all - s) * (a - 1.0) / (SC_THREADS as f64 - 1.0)
    }

    /// Seconds a thread spends on one engine read of `len` bytes while
    /// `active` threads read at once: the call, and the bytes at the
    /// thread's share of the aggregate rate.
    pub(crate) fn time(&self, len: f64, active: u64) -> f64 {
        self.call_s + len * active.max(1) as f64 / self.rate(active)
    }

    /// Seconds TaT's storage reads take as `groups`, on SC's threads.
    pub(crate) fn groups_time(&self, groups: &[Group], bs: u64) -> f64 {
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
pub(crate) fn tat_plan(shape: &Shape, k: &ReadCost, bs: u64) -> Vec<Group> {
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
pub(crate) fn costs(f: &PlanFacts) -> (Option<f64>, f64, f64) {
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

/// A range of the file TaT reads in one engine read: runs with no gap
/// wider than the threshold between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    /// The first run's file offset.
    pub(crate) start: u64,
    /// One past the last run's last byte.
    pub(crate) end: u64,
}

/// TaT's reads: the runs split where the gap between two is wider than
/// `max_gap` bytes (reading it would cost more than another call).
pub(crate) fn tat_groups(shape: &Shape, max_gap: u64) -> Vec<Group> {
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
