//! Routes: the engine's plan from one end to another (a `File`, a
//! `Memory` or a buffer at either end), and copies along it, stages
//! overlapped.

use std::{path::PathBuf, sync::Arc};

use p2pdma::transfer::route::{End, RouteOptions};
use pyo3::{
    prelude::*,
    types::{PyDict, PyList},
};

use crate::{
    buffers::{self, Access, Target},
    engine::{default_inner, Engine},
    errors,
    file::File,
};

/// One end of a route, as the Python caller gave it.
enum Side {
    Storage(Arc<p2pdma::StorageFile>, PathBuf),
    Memory(Target),
}

fn side(py: Python<'_>, obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Side> {
    if let Ok(f) = obj.cast::<File>() {
        let f = f.get();
        return Ok(Side::Storage(f.storage(py)?, f.path.clone()));
    }
    Ok(Side::Memory(buffers::target(py, obj, access)?))
}

fn end(s: &Side, offset: usize) -> End<'_> {
    match s {
        Side::Storage(f, _) => End::Storage {
            file: f,
            offset: offset as u64,
        },
        Side::Memory(t) => End::Memory {
            mem: &*t.mem,
            offset: t.offset + offset,
        },
    }
}

fn file_of<'a>(a: &'a Side, b: &'a Side) -> Option<&'a std::path::Path> {
    [a, b].into_iter().find_map(|s| match s {
        Side::Storage(_, p) => Some(p.as_path()),
        Side::Memory(_) => None,
    })
}

/// The engine to use: `engine`, or the default one.
fn engine_of(py: Python<'_>, engine: Option<&Bound<'_, Engine>>) -> PyResult<Arc<p2pdma::Engine>> {
    match engine {
        Some(e) => e.get().here(py),
        None => default_inner(py),
    }
}

/// The route from `src` to `dst` (each a `File`, a `Memory` or a buffer)
/// that `engine` (the default engine when omitted) would take:
/// `{"hops": [...], "reason": ...}`.
#[pyfunction]
#[pyo3(signature = (src, dst, src_offset = 0, dst_offset = 0, engine = None))]
pub fn route<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    dst: &Bound<'py, PyAny>,
    src_offset: usize,
    dst_offset: usize,
    engine: Option<&Bound<'py, Engine>>,
) -> PyResult<Bound<'py, PyDict>> {
    let (a, b) = (side(py, src, Access::Read)?, side(py, dst, Access::Write)?);
    let r = engine_of(py, engine)?
        .routes()
        .plan(end(&a, src_offset), end(&b, dst_offset))
        .map_err(|e| errors::to_py(py, &e, file_of(&a, &b), None))?;
    let d = PyDict::new(py);
    let hops = PyList::empty(py);
    for h in r.hops() {
        hops.append(h.to_string())?;
    }
    d.set_item("hops", hops)?;
    d.set_item("reason", r.reason())?;
    Ok(d)
}

/// Copies `size` bytes from `src` to `dst` along the route (storage to
/// memory, memory to storage, memory to memory, storage to storage),
/// stages overlapped, with `engine` (the default engine when omitted).
/// Returns what it did.
#[pyfunction]
#[pyo3(signature = (src, dst, size, src_offset = 0, dst_offset = 0, chunk = None, engine = None))]
#[allow(clippy::too_many_arguments)]
pub fn copy<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    dst: &Bound<'py, PyAny>,
    size: usize,
    src_offset: usize,
    dst_offset: usize,
    chunk: Option<usize>,
    engine: Option<&Bound<'py, Engine>>,
) -> PyResult<Bound<'py, PyDict>> {
    let (a, b) = (side(py, src, Access::Read)?, side(py, dst, Access::Write)?);
    let engine = engine_of(py, engine)?;
    let opts = RouteOptions {
        chunk,
        ..RouteOptions::default()
    };
    let r = py
        .detach(|| {
            let routes = engine.routes();
            let route = routes.plan(end(&a, src_offset), end(&b, dst_offset))?;
            routes.copy(&route, size, &opts)
        })
        .map_err(|e| errors::to_py(py, &e, file_of(&a, &b), None))?;
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item(
        "hops",
        r.hops.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
    )?;
    d.set_item("chunk", r.chunk)?;
    d.set_item("chunks", r.chunks)?;
    d.set_item("seconds", r.elapsed.as_secs_f64())?;
    Ok(d)
}
