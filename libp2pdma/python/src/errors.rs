//! The library's errors as Python exceptions.
//!
//! The classes live in `p2pdma/errors.py` (an `OSError` hierarchy a reader
//! can see in Python); this file picks one for each [`p2pdma::Error`] and
//! fills in what it carries: `errno`, `strerror` (the library's message),
//! `filename` (the file or namespace), `transfer_path` and `reason` (the
//! path the engine took or would take for this pair, and why), for an
//! NVMe error `nvme_status`, and for a CUDA driver error `cuda_call` and
//! `cuda_code`.

use std::path::Path;

use p2pdma::{Error, PathChoice};
use pyo3::{
    prelude::*,
    sync::PyOnceLock,
    types::{PyModule, PyType},
};

static CLASSES: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    CLASSES
        .get_or_try_init(py, || Ok(py.import("p2pdma.errors")?.unbind()))
        .map(|m| m.bind(py))
}

/// The class for `e`, and the errno it carries.
fn class_of(e: &Error) -> (&'static str, i32) {
    const ERANGE: i32 = 34;
    const EINVAL: i32 = 22;
    const EOPNOTSUPP: i32 = 95;
    const EPROTO: i32 = 71;
    const EIO: i32 = 5;
    const ENOMEM: i32 = 12;
    const ENODEV: i32 = 19;
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    const CUDA_OUT_OF_MEMORY: u32 = 2;
    let errno = e.errno().map(|n| n.raw_os_error());
    match e {
        Error::EndOfFile { .. } | Error::Short { .. } => ("EndOfFileError", ERANGE),
        Error::InvalidArgument(_) | Error::OutOfBounds { .. } => ("InvalidArgumentError", EINVAL),
        Error::PathUnavailable { .. } => ("PathUnavailableError", EOPNOTSUPP),
        Error::NvmeStatus { .. } => ("NvmeError", errno.unwrap_or(EIO)),
        Error::Open { .. } => ("ModuleError", errno.unwrap_or(EIO)),
        Error::AbiMismatch { .. } => ("ModuleError", EPROTO),
        Error::Controller { .. } => ("ControllerError", errno.unwrap_or(EIO)),
        Error::CudaUnavailable(_) => ("CudaUnavailableError", ENODEV),
        Error::Cuda {
            code: CUDA_OUT_OF_MEMORY,
            ..
        } => ("CudaError", ENOMEM),
        Error::Cuda { .. } => ("CudaError", EIO),
        _ => ("Error", errno.unwrap_or(EIO)),
    }
}

/// `e` as a Python exception about `file`, with the path `taken`.
pub fn to_py(py: Python<'_>, e: &Error, file: Option<&Path>, taken: Option<&PathChoice>) -> PyErr {
    match build(py, e, file, taken) {
        Ok(err) => err,
        Err(err) => err,
    }
}

fn build(
    py: Python<'_>,
    e: &Error,
    file: Option<&Path>,
    taken: Option<&PathChoice>,
) -> PyResult<PyErr> {
    let (name, errno) = class_of(e);
    let class = classes(py)?.getattr(name)?;
    let filename = file.map(|p| p.to_string_lossy().into_owned());
    let exc = class.call1((errno, e.to_string(), filename))?;
    exc.setattr("transfer_path", taken.map(|t| t.path.as_str()))?;
    exc.setattr("reason", taken.map(|t| t.reason.as_str()))?;
    exc.setattr("nvme_status", e.nvme_status().map(|s| s.to_string()))?;
    if let Error::Cuda { op, code, .. } = e {
        exc.setattr("cuda_call", *op)?;
        // u32::MAX: the driver lacks the function; there is no status.
        exc.setattr("cuda_code", (*code != u32::MAX).then_some(*code))?;
    }
    Ok(PyErr::from_value(exc))
}

/// An error about an argument, before any library call.
pub fn invalid(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    to_py(py, &Error::InvalidArgument(msg.into()), None, None)
}

/// An operation on a closed file (`ClosedFileError`).
pub fn closed(py: Python<'_>) -> PyErr {
    let class = classes(py).and_then(|m| m.getattr("ClosedFileError"));
    match class.and_then(|c| Ok(c.cast_into::<PyType>()?)) {
        Ok(c) => PyErr::from_type(c, "I/O operation on closed file"),
        Err(e) => e,
    }
}
