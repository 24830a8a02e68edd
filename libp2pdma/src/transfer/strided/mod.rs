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
//!
//! The calls are an engine's [`Strided`] view
//! ([`Engine::strided`](crate::transfer::Engine::strided)).

pub mod constants;
pub mod cost;
pub mod host;
mod pack;
pub mod run;
pub mod shape;
#[cfg(test)]
mod tests;
pub mod view;

pub use crate::transfer::tuning::constants::{
    DEFAULT_CALL_MIB_S, DEFAULT_CALL_S, DEFAULT_COPY_BPS, DEFAULT_COPY_CALL_S, DEFAULT_PACK_BPS,
    DEFAULT_STORAGE_BPS,
};
pub use cost::{plan, PlanFacts, SC_THREADS};
pub use host::{plan_copy, CopyFacts, STAGE};
pub use shape::{Dim, Layout, Run, Runs, Shape, StridedMode, StridedReport, MAX_DIMS};
pub use view::Strided;
