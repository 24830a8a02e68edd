//! Where the runs of a strided transfer lie: the library's `Shape`.

use pyo3::prelude::*;

use crate::errors;

/// Runs of `run` bytes, the first at `base`, the others found by stepping
/// through `dims`: `(stride, count)` pairs, innermost first, at most three.
/// A column range of a row-major table is `Shape(table_offset + first
/// column byte, width, [(row_pitch, rows)])`.
#[pyclass(frozen, module = "p2pdma")]
pub struct Shape {
    pub inner: p2pdma::Shape,
}

#[pymethods]
impl Shape {
    #[new]
    #[pyo3(signature = (base, run, dims = Vec::new()))]
    fn new(py: Python<'_>, base: u64, run: u64, dims: Vec<(u64, u64)>) -> PyResult<Self> {
        p2pdma::Shape::new(base, run, &dims)
            .map(|inner| Self { inner })
            .map_err(|e| errors::to_py(py, &e, None, None))
    }

    /// The first run's file offset.
    #[getter]
    fn base(&self) -> u64 {
        self.inner.base()
    }

    /// Bytes per run.
    #[getter]
    fn run(&self) -> u64 {
        self.inner.run_len()
    }

    /// The dimensions, `(stride, count)`, innermost first.
    #[getter]
    fn dims(&self) -> Vec<(u64, u64)> {
        self.inner
            .dims()
            .iter()
            .map(|d| (d.stride, d.count))
            .collect()
    }

    /// Number of runs.
    #[getter]
    fn runs(&self) -> u64 {
        self.inner.runs()
    }

    /// Bytes of interest (runs times run length): what a packed layout needs.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.bytes()
    }

    /// Bytes from the first run's start to the last run's end: what a
    /// strided layout needs.
    #[getter]
    fn bounding_len(&self) -> u64 {
        self.inner.bounding_len()
    }

    /// Each run's `(file_offset, length)`, in file order.
    fn runs_list(&self) -> Vec<(u64, u64)> {
        {
            let run = self.inner.run_len();
            self.inner.iter().map(|r| (r.file_offset, run)).collect()
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Shape(base={}, run={}, dims={:?})",
            self.inner.base(),
            self.inner.run_len(),
            self.dims()
        )
    }
}
