//! `p2pdma._p2pdma`: the Python binding of libp2pdma.
//!
//! The Python package (`python/p2pdma/`) re-exports these classes and adds
//! what is plain Python (safetensors, the progress bar). The data flows:
//!
//! - `buffers`: a Python object (buffer protocol, DLPack, CUDA array
//!   interface, or a `Memory`) becomes the engine's memory, kept alive
//!   while a transfer uses it; `cuda`: CUDA device memory lent by an
//!   object, and the producer's stream waited for; `memory`: `Memory`'s
//!   Python face (allocation, copies, DLPack);
//! - `file`: a file or namespace and its transfers, KvikIO's `CuFile`
//!   shape; `future`: transfers in flight;
//! - `engine`: the engine, its counters and the doctor; `routes`: plans
//!   and copies from one end to another; `store`: the object store;
//! - `errors`: the library's errors as `OSError` subclasses.
#![deny(unsafe_op_in_unsafe_fn)]

mod bench;
mod buffers;
mod cuda;
mod engine;
mod errors;
mod file;
mod future;
mod memory;
mod routes;
mod shape;
mod store;

use pyo3::prelude::*;

#[pymodule]
fn _p2pdma(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    engine::watch_forks();
    m.add_class::<engine::Engine>()?;
    m.add_class::<file::File>()?;
    m.add_class::<future::Future>()?;
    m.add_class::<future::BatchFuture>()?;
    m.add_class::<future::StreamFuture>()?;
    m.add_class::<memory::Memory>()?;
    m.add_class::<memory::MemoryView>()?;
    m.add_class::<shape::Shape>()?;
    m.add_class::<store::Store>()?;
    m.add_function(wrap_pyfunction!(engine::default_engine, m)?)?;
    m.add_function(wrap_pyfunction!(engine::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(file::submit_batch, m)?)?;
    m.add_function(wrap_pyfunction!(routes::route, m)?)?;
    m.add_function(wrap_pyfunction!(routes::copy, m)?)?;
    m.add_function(wrap_pyfunction!(bench::rust_read_loop, m)?)?;
    Ok(())
}
