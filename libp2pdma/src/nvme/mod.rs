//! The NVMe specification, once: what the queues path and the passthrough
//! path both build and read.

pub mod prp;
pub mod spec;

pub use prp::{data_ptr, seg_addr, seg_run, DataPtr, Segments};
pub use spec::{admin, doorbell, io, reg, Caps, Command, Completion, IdCtrl, IdNs, PAGE};
