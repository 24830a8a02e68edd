//! The Rust side of the Python bench: the same reads the bench makes from
//! Python, made by a Rust loop over the engine, so the per-call cost of
//! the binding is measured against the library's own in one process.

use std::time::Instant;

use p2pdma::MemRange;
use pyo3::prelude::*;

use crate::{
    buffers::{self, Access},
    errors,
    file::File,
};

/// Reads `size` bytes into `buf` from each offset of `offsets` in turn,
/// with the engine of `file`, from a Rust loop; returns the seconds taken.
#[pyfunction]
pub fn rust_read_loop(
    py: Python<'_>,
    file: &Bound<'_, File>,
    buf: &Bound<'_, PyAny>,
    size: usize,
    offsets: Vec<u64>,
) -> PyResult<f64> {
    let f = file.get();
    let storage = f.storage(py)?;
    let engine = f.engine(py)?;
    let t = buffers::target(py, buf, Access::Write)?;
    let (mem_offset, len) = t.span(py, 0, Some(size))?;
    py.detach(|| -> p2pdma::Result<f64> {
        let range = MemRange::new(&*t.mem, mem_offset, len)?;
        let start = Instant::now();
        for &o in &offsets {
            engine.read(&storage, o, range)?;
        }
        Ok(start.elapsed().as_secs_f64())
    })
    .map_err(|e| errors::to_py(py, &e, Some(&f.path), None))
}
