//! What transfers run on: the staged pipeline, the copy stage's helper
//! threads, a file's extents, the engine's worker threads and the host
//! staging rings of routes.

pub mod copypool;
pub mod extents;
pub mod pipeline;
pub mod rings;
pub mod workers;
