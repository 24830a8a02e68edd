//! A strided transfer's shape (runs laid out by up to three strides), its
//! layout in memory, the mode and what a transfer reports.

use std::fmt;

use crate::{
    memory::MemRange,
    transfer::{
        plan::TransferPath,
        xfer::{round_down, round_up},
    },
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
    pub(crate) base: u64,
    pub(crate) run: u64,
    pub(crate) dims: Vec<Dim>,
    /// Bytes from `base` to the end of the last run.
    pub(crate) extent: u64,
    pub(crate) runs: u64,
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
    pub(crate) fn run_at(&self, mut k: u64) -> u64 {
        let mut off = self.base;
        for d in &self.dims {
            off += (k % d.count) * d.stride;
            k /= d.count;
        }
        off
    }

    /// The first run that ends after file offset `f`.
    pub(crate) fn first_ending_after(&self, f: u64) -> u64 {
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
    /// Back to back from the start of the memory range, in file order.
    Packed,
    /// Each run at the start of the memory range plus its distance from
    /// the bounding range's start: the memory mirrors the bounding range.
    /// The memory between runs is the transfer's to use: RC fills it with
    /// the file's bytes there, SC and TaT leave it as it was.
    Strided,
}

impl Layout {
    /// Where run `r` of a shape whose first byte is at `base` of the file
    /// lies in this layout, from its start.
    pub(crate) fn place(self, base: u64, r: &Run) -> usize {
        match self {
            Layout::Packed => r.packed_offset as usize,
            Layout::Strided => (r.file_offset - base) as usize,
        }
    }
}

/// How a strided read moves its runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StridedMode {
    /// Chosen by [`plan`](super::plan).
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

/// Checks that `range` holds what `layout` puts there from its start, and
/// returns the run length as a `usize`. The error names the place in the
/// memory: the range's start, the bytes the layout needs and the range's
/// end.
pub(crate) fn check_room(shape: &Shape, range: MemRange<'_>, layout: Layout) -> Result<usize> {
    let room = match layout {
        Layout::Packed => shape.bytes(),
        Layout::Strided => shape.bounding_len(),
    };
    if !usize::try_from(room).is_ok_and(|r| r <= range.len()) {
        return Err(Error::OutOfBounds {
            offset: range.offset() as u64,
            len: room,
            size: (range.offset() + range.len()) as u64,
        });
    }
    // The run is at most `room`, which fits in a usize.
    Ok(shape.run as usize)
}

/// The block-aligned span around `[f, f + n)`.
pub(crate) fn aligned_span(f: u64, n: u64, bs: u64) -> u64 {
    round_up(f + n, bs) - round_down(f, bs)
}
