//! Strided copies between a host buffer and device memory: the shapes,
//! layouts and modes of strided reads, with a buffer in the file's place
//! (the shape's offsets index into it).
//!
//! Into the memory:
//!
//! - **RC** ([`Layout::Strided`] only): one copy of the bounding range,
//!   gaps included, which fills the memory's gaps with the buffer's bytes
//!   there.
//! - **SC**: one copy per run, straight to its place.
//! - **TaT** ([`Layout::Packed`] only): the runs gathered into a host
//!   staging buffer, copied in pieces of at most [`STAGE`] bytes.
//!
//! Out of the memory, the buffer's bytes between the runs are never
//! written:
//!
//! - **RC** ([`Layout::Strided`] only): the bounding range copied out in
//!   pieces of at most [`STAGE`] bytes, and the runs in each put in place.
//! - **SC**: one copy per run, straight into the buffer.
//! - **TaT** ([`Layout::Packed`] only): the packed runs copied out in
//!   pieces of at most [`STAGE`] bytes, and scattered into the buffer.
//!
//! AUTO chooses with [`plan_copy`], from the copy constants of the memory
//! ([`crate::transfer::tuning::constants`]).

use super::{
    shape::{check_room, Layout, Shape, StridedMode, StridedReport},
    view::Strided,
};
use crate::{
    memory::{DeviceMemory, MemRange},
    transfer::{plan::TransferPath, tuning::constants::Resolved},
    Error, Result,
};

/// Most bytes staged in host memory at once.
pub const STAGE: usize = 4 << 20;

/// What [`plan_copy`] decides from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyFacts {
    /// Bytes of the bounding range.
    pub bounding: u64,
    /// Bytes of interest.
    pub interest: u64,
    /// Runs.
    pub runs: u64,
    /// Where the runs lie in the memory (RC needs the strided layout, TaT
    /// the packed one).
    pub layout: Layout,
    /// Whether the copy goes into the memory (else out of it).
    pub to_memory: bool,
    /// Bytes per second between host memory and the memory.
    pub copy_bps: f64,
    /// Bytes per second of gathering or scattering runs in host memory.
    pub pack_bps: f64,
    /// Seconds one copy costs beyond its bytes.
    pub copy_call_s: f64,
}

/// The estimated seconds of RC (`None` with the packed layout), SC and TaT
/// (`None` with the strided layout).
fn copy_costs(f: &CopyFacts) -> (Option<f64>, f64, Option<f64>) {
    let (c, p, q) = (f.copy_bps.max(1.0), f.pack_bps.max(1.0), f.copy_call_s);
    let (v, i) = (f.bounding as f64, f.interest as f64);
    let pieces = |n: u64| n.div_ceil(STAGE as u64) as f64;
    let rc = (f.layout == Layout::Strided).then(|| {
        if f.to_memory {
            q + v / c
        } else {
            pieces(f.bounding) * q + v / c + i / p
        }
    });
    let sc = f.runs as f64 * q + i / c;
    let tat = (f.layout == Layout::Packed).then(|| pieces(f.interest) * q + i / c + i / p);
    (rc, sc, tat)
}

/// AUTO's choice for a strided copy between host memory and device memory,
/// and why: the smallest estimate, where
///
/// - RC = copy call + volume / copy (into the memory), or volume / [`STAGE`]
///   copy calls + volume / copy + interest / pack (out of it);
/// - SC = runs x copy call + interest / copy;
/// - TaT = interest / [`STAGE`] copy calls + interest / copy + interest /
///   pack.
///
/// RC is a candidate with the strided layout only, TaT with the packed one.
/// Ties go to SC (no staging), then TaT, then RC (the most bytes moved).
pub fn plan_copy(f: &CopyFacts) -> (StridedMode, String) {
    let (rc, sc, tat) = copy_costs(f);
    let mut best = (StridedMode::Sc, sc);
    for (m, t) in [(StridedMode::Tat, tat), (StridedMode::Rc, rc)] {
        if let Some(t) = t {
            if t < best.1 {
                best = (m, t);
            }
        }
    }
    let us = |t: Option<f64>, why: &str| match t {
        Some(t) => format!("{:.0} µs", t * 1e6),
        None => why.to_string(),
    };
    let reason = format!(
        "{} by estimate: {} runs, rho {:.3} of {} bounding bytes; RC {}, SC {}, TaT {} (host memory {} {})",
        best.0,
        f.runs,
        f.interest as f64 / f.bounding.max(1) as f64,
        f.bounding,
        us(rc, "needs the strided layout"),
        us(Some(sc), ""),
        us(tat, "needs the packed layout"),
        if f.to_memory { "into" } else { "out of" },
        "the memory",
    );
    (best.0, reason)
}

/// Checks that the buffer holds the shape's bounding range.
fn check_buffer(shape: &Shape, len: usize) -> Result<()> {
    let (b0, b1) = shape.bounds();
    if b1 > len as u64 {
        return Err(Error::OutOfBounds {
            offset: b0,
            len: b1 - b0,
            size: len as u64,
        });
    }
    Ok(())
}

impl Strided<'_> {
    /// The mode to use and why: as asked (RC needs the strided layout, TaT
    /// the packed one), or AUTO's.
    fn choose(
        &self,
        shape: &Shape,
        mem: &dyn DeviceMemory,
        layout: Layout,
        mode: StridedMode,
        to_memory: bool,
    ) -> Result<(StridedMode, String)> {
        let what = if to_memory {
            "strided copy into memory"
        } else {
            "strided copy out of memory"
        };
        match (mode, layout) {
        (StridedMode::Rc, Layout::Packed) => Err(Error::InvalidArgument(format!(
            "{what}: RC copies the whole {}-byte bounding range, which needs Layout::Strided; the packed layout holds only the {} bytes of interest",
            shape.bounding_len(),
            shape.bytes()
        ))),
        (StridedMode::Tat, Layout::Strided) => Err(Error::InvalidArgument(format!(
            "{what}: TaT packs the runs into contiguous copies, which needs Layout::Packed"
        ))),
        (StridedMode::Auto, _) => {
            let r: Resolved = self.constants(None, mem, TransferPath::Bounce);
            let k = r.constants;
            let (m, why) = plan_copy(&CopyFacts {
                bounding: shape.bounding_len(),
                interest: shape.bytes(),
                runs: shape.runs(),
                layout,
                to_memory,
                copy_bps: k.copy_bps,
                pack_bps: k.pack_bps,
                copy_call_s: k.copy_call_s,
            });
            Ok((m, format!("{why}; {}", r.describe_copies())))
        }
        (m, _) => Ok((m, format!("{m} asked for"))),
    }
    }

    /// Copies the runs of `shape` from the host buffer `src` (the shape's
    /// offsets index into it) into `range`, laid out as `layout` from its
    /// start, moved as `mode` says ([`StridedMode::Auto`]: as [`plan_copy`]
    /// estimates best). RC needs [`Layout::Strided`] and fills the memory's
    /// gaps with `src`'s bytes there; TaT needs [`Layout::Packed`]. Bounds
    /// are checked before anything is copied.
    pub fn copy_to_memory(
        &self,
        src: &[u8],
        shape: &Shape,
        range: MemRange<'_>,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        check_buffer(shape, src.len())?;
        let run = check_room(shape, range, layout)?;
        let (mem, start) = (range.mem(), range.offset());
        let (mode, reason) = self.choose(shape, mem, layout, mode, true)?;
        let (b0, b1) = shape.bounds();
        let (b0, b1) = (b0 as usize, b1 as usize);
        let calls = match mode {
            StridedMode::Rc => {
                mem.write_at(start, &src[b0..b1])?;
                1
            }
            StridedMode::Sc => {
                for r in shape.iter() {
                    let f = r.file_offset as usize;
                    mem.write_at(start + layout.place(b0 as u64, &r), &src[f..f + run])?;
                }
                shape.runs()
            }
            StridedMode::Tat | StridedMode::Auto => {
                let mut stage = Vec::with_capacity(STAGE.min(shape.bytes() as usize));
                let (mut at, mut calls) = (start, 0);
                for r in shape.iter() {
                    let f = r.file_offset as usize;
                    let mut piece = &src[f..f + run];
                    while !piece.is_empty() {
                        let take = (STAGE - stage.len()).min(piece.len());
                        stage.extend_from_slice(&piece[..take]);
                        piece = &piece[take..];
                        if stage.len() == STAGE {
                            mem.write_at(at, &stage)?;
                            (at, calls) = (at + STAGE, calls + 1);
                            stage.clear();
                        }
                    }
                }
                if !stage.is_empty() {
                    mem.write_at(at, &stage)?;
                    calls += 1;
                }
                calls
            }
        };
        Ok(copied(mode, reason, shape, calls))
    }

    /// Copies the runs of `shape` out of `range` (laid out as `layout` from
    /// its start) into the host buffer `dst` at the shape's offsets: the
    /// mirror of [`Strided::copy_to_memory`]. The bytes of `dst` between the
    /// runs are never written, whatever the mode. RC needs
    /// [`Layout::Strided`], TaT [`Layout::Packed`]. Bounds are checked
    /// before anything is copied.
    pub fn copy_from_memory(
        &self,
        dst: &mut [u8],
        shape: &Shape,
        range: MemRange<'_>,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        check_buffer(shape, dst.len())?;
        let run = check_room(shape, range, layout)?;
        let (mem, start) = (range.mem(), range.offset());
        let (mode, reason) = self.choose(shape, mem, layout, mode, false)?;
        let (b0, _) = shape.bounds();
        let calls = match mode {
            StridedMode::Sc => {
                for r in shape.iter() {
                    let f = r.file_offset as usize;
                    mem.read_at(start + layout.place(b0, &r), &mut dst[f..f + run])?;
                }
                shape.runs()
            }
            StridedMode::Rc => {
                // Windows of the bounding range; the run pieces in each go
                // to their places.
                let len = shape.bounding_len() as usize;
                let mut stage = vec![0u8; STAGE.min(len)];
                let mut calls = 0;
                for w0 in (0..len).step_by(STAGE) {
                    let w = &mut stage[..STAGE.min(len - w0)];
                    mem.read_at(start + w0, w)?;
                    calls += 1;
                    let (f0, f1) = (b0 + w0 as u64, b0 + (w0 + w.len()) as u64);
                    let mut k = shape.first_ending_after(f0);
                    while k < shape.runs() {
                        let r0 = shape.run_at(k);
                        if r0 >= f1 {
                            break;
                        }
                        let (p0, p1) = (r0.max(f0), (r0 + run as u64).min(f1));
                        dst[p0 as usize..p1 as usize]
                            .copy_from_slice(&w[(p0 - f0) as usize..(p1 - f0) as usize]);
                        k += 1;
                    }
                }
                calls
            }
            StridedMode::Tat | StridedMode::Auto => {
                // Windows of the packed runs, scattered: packed byte `p` is
                // byte `p % run` of run `p / run`.
                let len = shape.bytes() as usize;
                let mut stage = vec![0u8; STAGE.min(len)];
                let mut calls = 0;
                for w0 in (0..len).step_by(STAGE) {
                    let w = &mut stage[..STAGE.min(len - w0)];
                    mem.read_at(start + w0, w)?;
                    calls += 1;
                    let mut p = w0;
                    while p < w0 + w.len() {
                        let (k, inside) = (p / run, p % run);
                        let n = (run - inside).min(w0 + w.len() - p);
                        let f = shape.run_at(k as u64) as usize + inside;
                        dst[f..f + n].copy_from_slice(&w[p - w0..p - w0 + n]);
                        p += n;
                    }
                }
                calls
            }
        };
        Ok(copied(mode, reason, shape, calls))
    }
}

/// The report of a copy between a host buffer and memory: no storage
/// involved, `calls` copies.
fn copied(mode: StridedMode, reason: String, shape: &Shape, calls: u64) -> StridedReport {
    StridedReport {
        mode,
        reason,
        bytes: shape.bytes(),
        storage_bytes: 0,
        calls,
        paths: Vec::new(),
        retried: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_copy_table() {
        const MIB: u64 = 1 << 20;
        let base = CopyFacts {
            bounding: 64 * MIB,
            interest: 16 * MIB,
            runs: 4096,
            layout: Layout::Packed,
            to_memory: true,
            copy_bps: 10e9,
            pack_bps: 5e9,
            copy_call_s: 50e-9,
        };
        let cases: &[(&str, CopyFacts, StridedMode)] = &[
            (
                "host memory, cheap calls: SC copies each byte once",
                base,
                StridedMode::Sc,
            ),
            (
                "write-combined BAR with dear calls: TaT's few large copies",
                CopyFacts {
                    copy_call_s: 20e-6,
                    ..base
                },
                StridedMode::Tat,
            ),
            (
                "strided layout, dense runs, dear calls: RC's one copy",
                CopyFacts {
                    bounding: 20 * MIB,
                    layout: Layout::Strided,
                    copy_call_s: 20e-6,
                    ..base
                },
                StridedMode::Rc,
            ),
            (
                "strided layout, sparse runs: SC, RC would copy four times the bytes",
                CopyFacts {
                    layout: Layout::Strided,
                    ..base
                },
                StridedMode::Sc,
            ),
            (
                "one run: SC (no staging) on a tie",
                CopyFacts {
                    bounding: MIB,
                    interest: MIB,
                    runs: 1,
                    pack_bps: f64::INFINITY,
                    ..base
                },
                StridedMode::Sc,
            ),
        ];
        for (what, f, want) in cases {
            let (got, why) = plan_copy(f);
            assert_eq!(got, *want, "{what}: {why}");
            assert!(why.starts_with(&format!("{want} by estimate")), "{why}");
        }
        let (_, why) = plan_copy(&base);
        assert!(why.contains("RC needs the strided layout"), "{why}");
        let (_, why) = plan_copy(&CopyFacts {
            layout: Layout::Strided,
            ..base
        });
        assert!(why.contains("TaT needs the packed layout"), "{why}");
    }
}
