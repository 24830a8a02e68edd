//! `Store`: the library's object store (`docs/store.md`) on a file or
//! block device, with its page cache in a `Memory` (host, accelerator or
//! GPU memory), for Python programs that keep fixed-size chunks (a KV
//! cache's, a dataset's) by id.

use std::{path::PathBuf, sync::Arc};

use p2pdma::{
    store::{EngineBacking, PageCache, WritePolicy},
    transfer::Direction,
    MemRange, StorageFile,
};
use pyo3::{prelude::*, types::PyDict};

use crate::{
    buffers::{self, Access, Memory},
    engine::{default_inner, Engine},
    errors,
};

/// Objects on a file or block device, read and written by id, with a page
/// cache in a `Memory` when one is given.
#[pyclass(frozen, module = "p2pdma")]
pub struct Store {
    inner: p2pdma::store::Store,
    path: PathBuf,
}

/// The engine, the storage and, with `cache`, the page cache a store runs
/// on.
fn parts(
    py: Python<'_>,
    path: &PathBuf,
    cache: Option<&Bound<'_, PyAny>>,
    page: usize,
    write_through: bool,
    engine: Option<&Bound<'_, Engine>>,
) -> PyResult<(Arc<EngineBacking>, Option<PageCache>)> {
    let engine = match engine {
        Some(e) => e.get().here(py)?,
        None => default_inner(py)?,
    };
    let file = py
        .detach(|| StorageFile::open_rw(path))
        .map_err(|e| errors::to_py(py, &e, Some(path), None))?;
    let backing = Arc::new(EngineBacking::new(engine, Arc::new(file)));
    let policy = match write_through {
        true => WritePolicy::WriteThrough,
        false => WritePolicy::WriteBack,
    };
    let cache = match cache {
        None => None,
        Some(c) => {
            let mems = cache_memories(py, c)?;
            Some(
                PageCache::shared(mems, page, policy)
                    .map_err(|e| errors::to_py(py, &e, None, None))?,
            )
        }
    };
    Ok((backing, cache))
}

/// The memories of a `cache` argument: one `Memory`, or a sequence of
/// them, one per accelerator the cache spans.
fn cache_memories(
    py: Python<'_>,
    c: &Bound<'_, PyAny>,
) -> PyResult<Vec<Arc<dyn p2pdma::DeviceMemory>>> {
    if let Ok(m) = c.cast::<Memory>() {
        return Ok(vec![m.get().mem.clone()]);
    }
    let mut mems = Vec::new();
    for item in c.try_iter().map_err(|_| {
        errors::invalid(
            py,
            "cache: a Memory, or a sequence of them (one per accelerator)",
        )
    })? {
        let item = item?;
        let m = item.cast::<Memory>().map_err(|_| {
            errors::invalid(py, "cache: every entry of the sequence must be a Memory")
        })?;
        mems.push(m.get().mem.clone());
    }
    Ok(mems)
}

#[pymethods]
impl Store {
    /// Formats `path` (a file or a block device) as an empty store for up
    /// to `max_objects` objects. With `size`, a file is created if missing
    /// and made at least `size` bytes long (a block device keeps its own).
    /// With `cache`, a `Memory` whose whole length
    /// holds the page cache's frames of `page` bytes (a power of two from
    /// 4 KiB to 2 MiB), written back on `flush` (or through, with
    /// `write_through`); or a sequence of `Memory`s, one per accelerator,
    /// for a cache they share (a read goes through the copies of the
    /// accelerator whose memory its buffer is; a miss there is filled
    /// from another's copy, GPU to GPU, where one holds the page).
    #[staticmethod]
    #[pyo3(signature = (path, max_objects = 1024, *, size = None, cache = None, page = 65536, write_through = false, engine = None))]
    #[allow(clippy::too_many_arguments)]
    fn format(
        py: Python<'_>,
        path: PathBuf,
        max_objects: u64,
        size: Option<u64>,
        cache: Option<&Bound<'_, PyAny>>,
        page: usize,
        write_through: bool,
        engine: Option<&Bound<'_, Engine>>,
    ) -> PyResult<Self> {
        if let Some(size) = size {
            grow(&path, size).map_err(|e| {
                errors::to_py(
                    py,
                    &p2pdma::Error::InvalidArgument(format!("{}: {e}", path.display())),
                    Some(&path),
                    None,
                )
            })?;
        }
        let (backing, cache) = parts(py, &path, cache, page, write_through, engine)?;
        let store = py
            .detach(|| p2pdma::store::Store::format(backing, max_objects))
            .map_err(|e| errors::to_py(py, &e, Some(&path), None))?;
        Ok(Self {
            inner: with(store, cache),
            path,
        })
    }

    /// Opens the store on `path` (see `format` for the cache).
    #[staticmethod]
    #[pyo3(signature = (path, *, cache = None, page = 65536, write_through = false, engine = None))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        cache: Option<&Bound<'_, PyAny>>,
        page: usize,
        write_through: bool,
        engine: Option<&Bound<'_, Engine>>,
    ) -> PyResult<Self> {
        let (backing, cache) = parts(py, &path, cache, page, write_through, engine)?;
        let store = py
            .detach(|| p2pdma::store::Store::initialize(backing))
            .map_err(|e| errors::to_py(py, &e, Some(&path), None))?;
        Ok(Self {
            inner: with(store, cache),
            path,
        })
    }

    /// A new object of `size` bytes (zeros); its id.
    fn create(&self, py: Python<'_>, size: u64) -> PyResult<u64> {
        py.detach(|| self.inner.pcreate(size))
            .map_err(|e| self.fail(py, &e))
    }

    /// Deletes object `id`.
    fn delete(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        py.detach(|| self.inner.delete(id))
            .map_err(|e| self.fail(py, &e))
    }

    /// Object `id`'s size in bytes.
    fn size(&self, py: Python<'_>, id: u64) -> PyResult<u64> {
        self.inner.size(id).map_err(|e| self.fail(py, &e))
    }

    /// Every object, as `(id, size)` pairs.
    fn objects(&self) -> Vec<(u64, u64)> {
        self.inner
            .get_object_map()
            .into_iter()
            .map(|o| (o.id, o.size))
            .collect()
    }

    /// Reads object `id` from `offset` into `buf` (any buffer, array or
    /// tensor the library takes, or a `Memory`), `size` bytes (default: the
    /// buffer's length from `buf_offset`); returns the bytes read. A range
    /// past the object's end is an error and reads nothing.
    #[pyo3(signature = (id, buf, offset = 0, size = None, *, buf_offset = 0))]
    fn read(
        &self,
        py: Python<'_>,
        id: u64,
        buf: &Bound<'_, PyAny>,
        offset: u64,
        size: Option<usize>,
        buf_offset: usize,
    ) -> PyResult<usize> {
        self.io(py, Direction::Read, id, buf, offset, size, buf_offset)
    }

    /// Writes `buf` (see `read`) to object `id` at `offset`; returns the
    /// bytes written. Durable after the next `flush`.
    #[pyo3(signature = (id, buf, offset = 0, size = None, *, buf_offset = 0))]
    fn write(
        &self,
        py: Python<'_>,
        id: u64,
        buf: &Bound<'_, PyAny>,
        offset: u64,
        size: Option<usize>,
        buf_offset: usize,
    ) -> PyResult<usize> {
        self.io(py, Direction::Write, id, buf, offset, size, buf_offset)
    }

    /// Makes every write that returned durable (the cache's dirty pages
    /// written back, then the map committed).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.flush())
            .map_err(|e| self.fail(py, &e))
    }

    /// The page cache's counters (`hits`, `misses`, `remote`,
    /// `invalidations`, `frames`, `cached`, `dirty`), or `None` without a
    /// cache.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(s) = self.inner.cache_stats() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("remote", s.remote)?;
        d.set_item("invalidations", s.invalidations)?;
        d.set_item("frames", s.frames)?;
        d.set_item("cached", s.cached)?;
        d.set_item("dirty", s.dirty)?;
        Ok(Some(d))
    }

    fn __repr__(&self) -> String {
        format!(
            "Store({:?}, objects={}, cache={})",
            self.path,
            self.inner.get_object_map().len(),
            self.inner.cache_stats().is_some()
        )
    }
}

/// Makes the file at `path` (created if missing) at least `size` bytes
/// long; a block device or other special file is left as it is.
fn grow(path: &std::path::Path, size: u64) -> std::io::Result<()> {
    if path.exists() && !path.metadata()?.is_file() {
        return Ok(());
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    if f.metadata()?.len() < size {
        f.set_len(size)?;
    }
    Ok(())
}

fn with(store: p2pdma::store::Store, cache: Option<PageCache>) -> p2pdma::store::Store {
    match cache {
        Some(c) => store.with_cache(c),
        None => store,
    }
}

impl Store {
    fn fail(&self, py: Python<'_>, e: &p2pdma::Error) -> PyErr {
        errors::to_py(py, e, Some(&self.path), None)
    }

    #[allow(clippy::too_many_arguments)]
    fn io(
        &self,
        py: Python<'_>,
        dir: Direction,
        id: u64,
        buf: &Bound<'_, PyAny>,
        offset: u64,
        size: Option<usize>,
        buf_offset: usize,
    ) -> PyResult<usize> {
        let access = match dir {
            Direction::Read => Access::Write,
            Direction::Write => Access::Read,
        };
        buffers::with_lent(py, buf, access, |t| {
            let (at, len) = t.span(py, buf_offset, size)?;
            let range = MemRange::new(t.mem, at, len).map_err(|e| self.fail(py, &e))?;
            py.detach(|| match dir {
                Direction::Read => self.inner.pread(id, offset, range),
                Direction::Write => self.inner.pwrite(id, offset, range),
            })
            .map_err(|e| self.fail(py, &e))
        })
    }
}
