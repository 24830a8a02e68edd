//! A file or NVMe namespace and its transfers, in the shape of KvikIO's
//! `CuFile`: `read`/`write` block and return the bytes moved; `pread`/
//! `pwrite` return a [`Future`]. Reads and writes have `pread`/`pwrite`
//! semantics: they move every byte asked for or raise, and a read past
//! the end of the file raises `EndOfFileError` instead of returning a
//! short count.

use std::{
    fs::OpenOptions,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::PathBuf,
    sync::{Arc, RwLock},
};

use p2pdma::{memory::MemoryKind, Direction, Layout, MemRange, Request, StorageFile, StridedMode};
use pyo3::{
    exceptions::PyTypeError,
    prelude::*,
    types::{PyDict, PyList, PyTuple},
};

use crate::{
    buffers::{self, Access, Target},
    cuda,
    engine::{default_inner, Engine},
    errors,
    future::{BatchFuture, Future, StreamFuture},
    shape::Shape,
};

/// The largest read a future defers until it is waited for.
const DEFER_MAX: usize = 1 << 20;

/// A file or block device (an NVMe namespace, a partition) opened for
/// transfers.
#[pyclass(frozen, module = "p2pdma")]
pub struct File {
    storage: RwLock<Option<Arc<StorageFile>>>,
    /// The engine given at open; `None`: the default engine.
    engine: Option<Py<Engine>>,
    pub path: PathBuf,
    flags: String,
}

/// What KvikIO's `open_fd_parse_flags` makes of `flags`, as `open(2)`
/// flags: `"r"` `O_RDONLY`, `"r+"` `O_RDWR`, `"w"` `O_WRONLY|O_CREAT|
/// O_TRUNC`, `"w+"` `O_RDWR|O_CREAT|O_TRUNC`; the first character is the
/// mode, a `+` second adds the other direction. KvikIO ignores what
/// follows; here only `b` and `t` may follow (as in `"rb"`, `"w+b"`), and
/// anything else is refused rather than ignored: `"rw"` or `"rb+"` would
/// open read-only there. `"a"` is refused, as KvikIO refuses it: a
/// positional write in append mode would land at the end of the file, not
/// where it was asked to. A file it creates gets KvikIO's permissions, 0644
/// less the umask.
fn open_options(py: Python<'_>, flags: &str) -> PyResult<OpenOptions> {
    let plus = flags.as_bytes().get(1) == Some(&b'+');
    let rest = flags.get(1 + usize::from(plus)..).unwrap_or("");
    let mut o = OpenOptions::new();
    match flags.as_bytes().first() {
        Some(b'r') => o.read(true).write(plus),
        Some(b'w') => o
            .read(plus)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644),
        Some(b'a') => {
            return Err(errors::invalid(
                py,
                format!(
                "flags '{flags}': open flag 'a' isn't supported (as in KvikIO): use 'r+' or 'w'"
            ),
            ))
        }
        _ => {
            return Err(errors::invalid(
                py,
                format!("flags '{flags}': unknown file open flag: expected r, r+, w or w+"),
            ))
        }
    };
    if !rest.chars().all(|c| c == 'b' || c == 't') {
        return Err(errors::invalid(
            py,
            format!(
                "flags '{flags}': expected r, r+, w or w+ (then b or t): KvikIO reads \
                 only the first character and a '+' second, and would ignore '{rest}'"
            ),
        ));
    }
    Ok(o)
}

impl File {
    /// The open file, or `ClosedFileError` once closed: a `ValueError`, as
    /// Python's files raise, and a `RuntimeError`, as KvikIO's do.
    pub fn storage(&self, py: Python<'_>) -> PyResult<Arc<StorageFile>> {
        let s = self.storage.read().unwrap_or_else(|p| p.into_inner());
        s.clone().ok_or_else(|| errors::closed(py))
    }

    /// The engine this file's transfers run on.
    pub fn engine(&self, py: Python<'_>) -> PyResult<Arc<p2pdma::Engine>> {
        match &self.engine {
            Some(e) => e.bind(py).get().here(py),
            None => default_inner(py),
        }
    }

    /// `e` raised about this file, with the path the engine would take
    /// for `mem` and why.
    fn fail(
        &self,
        py: Python<'_>,
        e: &p2pdma::Error,
        file: &StorageFile,
        mem: &dyn p2pdma::DeviceMemory,
    ) -> PyErr {
        let taken = self.engine(py).ok().and_then(|e| e.choose(file, mem).ok());
        errors::to_py(py, e, Some(&self.path), taken.as_ref())
    }

    /// The transfer a call describes: the open file, the memory, where in
    /// it and how many bytes.
    fn request(
        &self,
        py: Python<'_>,
        dir: Direction,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        buf_offset: usize,
    ) -> PyResult<Request> {
        let file = self.storage(py)?;
        let t: Target = buffers::target(py, buf, access_for(dir))?;
        let (mem_offset, len) = t.span(py, buf_offset, size)?;
        Ok(Request {
            dir,
            file,
            file_offset,
            mem: t.mem,
            mem_offset,
            len,
        })
    }

    /// A transfer the caller waits for: the memory is lent for the call
    /// only.
    fn now(
        &self,
        py: Python<'_>,
        dir: Direction,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        buf_offset: usize,
    ) -> PyResult<usize> {
        let file = self.storage(py)?;
        let engine = self.engine(py)?;
        buffers::with_lent(py, buf, access_for(dir), |t| {
            let (mem_offset, len) = t.span(py, buf_offset, size)?;
            if len == 0 {
                return Ok(0);
            }
            let range = MemRange::new(t.mem, mem_offset, len)
                .map_err(|e| self.fail(py, &e, &file, t.mem))?;
            // Data the page cache holds is copied without letting go of
            // the interpreter's lock: the copy never blocks.
            if dir == Direction::Read {
                if let Some(report) = engine.read_if_cached(&file, file_offset, range) {
                    return Ok(report.bytes as usize);
                }
            }
            let r = py.detach(|| match dir {
                Direction::Read => engine.read(&file, file_offset, range),
                Direction::Write => engine.write(&file, file_offset, range),
            });
            match r {
                Ok(report) => Ok(report.bytes as usize),
                Err(e) => Err(self.fail(py, &e, &file, t.mem)),
            }
        })
    }

    /// A transfer in the order of CUDA stream `stream` (KvikIO's
    /// `raw_read_async`/`raw_write_async`): the work queued on it so far
    /// is waited for, then the transfer runs to its end, so work queued
    /// on the stream after the call sees it done.
    #[expect(clippy::too_many_arguments)]
    fn in_stream_order(
        &self,
        py: Python<'_>,
        dir: Direction,
        buf: &Bound<'_, PyAny>,
        stream: usize,
        size: Option<usize>,
        file_offset: u64,
        buf_offset: usize,
    ) -> PyResult<StreamFuture> {
        let t = buffers::target(py, buf, access_for(dir))?;
        let ordinal = match t.mem.kind() {
            MemoryKind::Cuda { ordinal, .. } => ordinal,
            _ if t.len == 0 => return Ok(StreamFuture::done(0)),
            _ => return Err(errors::invalid(
                py,
                "raw_read_async and raw_write_async take CUDA device memory only (as in KvikIO): \
                     use read, write, pread or pwrite for other memory",
            )),
        };
        cuda::wait_for_stream(py, ordinal, stream)?;
        let n = self.now(py, dir, buf, size, file_offset, buf_offset)?;
        Ok(StreamFuture::done(n))
    }

    fn submit(&self, py: Python<'_>, req: Request) -> PyResult<Future> {
        let engine = self.engine(py)?;
        let context = (self.path.clone(), req.file.clone(), req.mem.clone());
        let len = req.len;
        // A small read runs when the future is first waited for, on the
        // waiting thread, or goes to the engine's workers when it is first
        // polled or awaited: `pread(...).get()` then costs what `read`
        // does. Writes always start at once: a future dropped unwaited
        // must not lose one.
        let ticket = match (len, req.dir) {
            (0, _) => None,
            (n, Direction::Read) if n <= DEFER_MAX => Some(engine.submit_deferred(req)),
            _ => Some(engine.submit(req)),
        };
        Ok(Future::new(ticket, len, engine, context))
    }

    fn strided(
        &self,
        py: Python<'_>,
        dir: Direction,
        buf: &Bound<'_, PyAny>,
        shape: &Shape,
        (layout, mode): (Layout, StridedMode),
        buf_offset: usize,
    ) -> PyResult<Py<PyDict>> {
        let file = self.storage(py)?;
        let t = buffers::target(py, buf, access_for(dir))?;
        let (mem_offset, _) = t.span(py, buf_offset, Some(0))?;
        let engine = self.engine(py)?;
        let s = shape.inner.clone();
        let r = py.detach(|| {
            let range = MemRange::from_offset(&*t.mem, mem_offset)?;
            let strided = engine.strided();
            match dir {
                Direction::Read => strided.read(&file, &s, range, layout, mode),
                Direction::Write => strided.write(&file, &s, range, layout, mode),
            }
        });
        let r = r.map_err(|e| self.fail(py, &e, &file, &*t.mem))?;
        let d = PyDict::new(py);
        d.set_item("mode", r.mode.to_string())?;
        d.set_item("reason", r.reason)?;
        d.set_item("bytes", r.bytes)?;
        d.set_item("storage_bytes", r.storage_bytes)?;
        d.set_item("calls", r.calls)?;
        d.set_item(
            "paths",
            r.paths.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
        )?;
        d.set_item("retried", r.retried)?;
        Ok(d.unbind())
    }
}

#[pymethods]
impl File {
    /// Opens `file` (a path to a file, or to a block device such as an
    /// NVMe namespace or a partition) as KvikIO's `CuFile(file, flags)`
    /// does: `flags` `"r"`, `"r+"`, `"w"` (create or truncate, write
    /// only) or `"w+"`. `engine`: the engine to use (the default engine
    /// when omitted).
    #[new]
    #[pyo3(signature = (file, flags = "r", *, engine = None))]
    fn open(
        py: Python<'_>,
        file: PathBuf,
        flags: &str,
        engine: Option<Py<Engine>>,
    ) -> PyResult<Self> {
        let options = open_options(py, flags)?;
        let p = file.clone();
        let storage = py.detach(move || StorageFile::open_options(&p, &options));
        let storage = storage.map_err(|e| errors::to_py(py, &e, Some(&file), None))?;
        Ok(Self {
            storage: RwLock::new(Some(Arc::new(storage))),
            engine,
            path: file,
            flags: flags.into(),
        })
    }

    /// Reads `size` bytes (the rest of `buf` when omitted) at `file_offset`
    /// into `buf` (at `buf_offset`); returns the bytes read, always `size`.
    /// `task_size` is accepted for KvikIO's programs: the engine cuts
    /// transfers itself (`Engine(chunk=...)`).
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None, *, buf_offset = 0))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        task_size: Option<usize>,
        buf_offset: usize,
    ) -> PyResult<usize> {
        let _ = task_size;
        self.now(py, Direction::Read, buf, size, file_offset, buf_offset)
    }

    /// Writes `size` bytes of `buf` (from `buf_offset`) at `file_offset`;
    /// returns the bytes written, always `size`.
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None, *, buf_offset = 0))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        task_size: Option<usize>,
        buf_offset: usize,
    ) -> PyResult<usize> {
        let _ = task_size;
        self.now(py, Direction::Write, buf, size, file_offset, buf_offset)
    }

    /// `read` in the background: returns a `Future` (`wait()`, `get()`,
    /// `done()`, or `await` it).
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None, *, buf_offset = 0))]
    fn pread(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        task_size: Option<usize>,
        buf_offset: usize,
    ) -> PyResult<Future> {
        let _ = task_size;
        let req = self.request(py, Direction::Read, buf, size, file_offset, buf_offset)?;
        self.submit(py, req)
    }

    /// `write` in the background: returns a `Future`.
    #[pyo3(signature = (buf, size = None, file_offset = 0, task_size = None, *, buf_offset = 0))]
    fn pwrite(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        task_size: Option<usize>,
        buf_offset: usize,
    ) -> PyResult<Future> {
        let _ = task_size;
        let req = self.request(py, Direction::Write, buf, size, file_offset, buf_offset)?;
        self.submit(py, req)
    }

    /// KvikIO's `raw_read`: `size` bytes at `file_offset` into `buf` at
    /// `dev_offset`, in one call; returns the bytes read. Takes any memory
    /// `read` takes.
    #[pyo3(signature = (buf, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        dev_offset: usize,
    ) -> PyResult<usize> {
        self.now(py, Direction::Read, buf, size, file_offset, dev_offset)
    }

    /// KvikIO's `raw_write`: `size` bytes of `buf` from `dev_offset` at
    /// `file_offset`; returns the bytes written.
    #[pyo3(signature = (buf, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<usize>,
        file_offset: u64,
        dev_offset: usize,
    ) -> PyResult<usize> {
        self.now(py, Direction::Write, buf, size, file_offset, dev_offset)
    }

    /// KvikIO's `raw_read_async`: the read in the order of `raw_stream` (a
    /// `CUstream` handle of `buf`'s device; 0 the legacy default stream).
    /// The work queued on the stream before the call is waited for, then
    /// the data is read; it has landed when the call returns, so work
    /// queued after it sees the data. Returns a `StreamFuture` whose
    /// `check_bytes_done()` gives the bytes read. CUDA memory only, as in
    /// KvikIO.
    #[pyo3(signature = (buf, raw_stream, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_read_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        raw_stream: usize,
        size: Option<usize>,
        file_offset: u64,
        dev_offset: usize,
    ) -> PyResult<StreamFuture> {
        let dir = Direction::Read;
        self.in_stream_order(py, dir, buf, raw_stream, size, file_offset, dev_offset)
    }

    /// KvikIO's `raw_write_async`: the write in the order of `raw_stream`,
    /// as `raw_read_async`.
    #[pyo3(signature = (buf, raw_stream, size = None, file_offset = 0, dev_offset = 0))]
    fn raw_write_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        raw_stream: usize,
        size: Option<usize>,
        file_offset: u64,
        dev_offset: usize,
    ) -> PyResult<StreamFuture> {
        let dir = Direction::Write;
        self.in_stream_order(py, dir, buf, raw_stream, size, file_offset, dev_offset)
    }

    /// Many reads at once: `entries` is a list of `(buf, file_offset)` or
    /// `(buf, file_offset, size)`; returns a `BatchFuture`. Every entry is
    /// checked before any is submitted.
    fn pread_batch(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        entries: &Bound<'_, PyAny>,
    ) -> PyResult<BatchFuture> {
        let mut batch = Vec::new();
        for (i, e) in entries.try_iter()?.enumerate() {
            let t = entry_items(i, &e?, "(buf, file_offset[, size])")?;
            if !(2..=3).contains(&t.len()) {
                return Err(errors::invalid(
                    py,
                    format!(
                        "batch entry {i} has {} items: expected (buf, file_offset[, size])",
                        t.len()
                    ),
                ));
            }
            let file_offset = offset_field(i, &t[1])?;
            let size = match t.get(2) {
                Some(s) => size_field(i, s)?,
                None => None,
            };
            let buf = t[0].clone();
            batch.push((slf.clone(), Direction::Read, buf, file_offset, size));
        }
        submit_entries(py, batch)
    }

    /// Reads the runs of `shape` (a `Shape`) into `buf` from `buf_offset`:
    /// back to back (`layout="packed"`) or mirroring the file
    /// (`"strided"`); `mode`: auto, rc, sc or tat. Returns what it did.
    #[pyo3(signature = (buf, shape, layout = "packed", mode = "auto", buf_offset = 0))]
    fn read_strided(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        shape: PyRef<'_, Shape>,
        layout: &str,
        mode: &str,
        buf_offset: usize,
    ) -> PyResult<Py<PyDict>> {
        let how = strided_how(py, layout, mode)?;
        self.strided(py, Direction::Read, buf, &shape, how, buf_offset)
    }

    /// Writes `buf`'s runs to the places `shape` names.
    #[pyo3(signature = (buf, shape, layout = "packed", mode = "auto", buf_offset = 0))]
    fn write_strided(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        shape: PyRef<'_, Shape>,
        layout: &str,
        mode: &str,
        buf_offset: usize,
    ) -> PyResult<Py<PyDict>> {
        let how = strided_how(py, layout, mode)?;
        self.strided(py, Direction::Write, buf, &shape, how, buf_offset)
    }

    /// The path the engine takes between this file and `buf`, and why:
    /// `(path, reason)`.
    fn path_for(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<(String, String)> {
        let file = self.storage(py)?;
        let t = buffers::target(py, buf, Access::Read)?;
        let c = self
            .engine(py)?
            .choose(&file, &*t.mem)
            .map_err(|e| errors::to_py(py, &e, Some(&self.path), None))?;
        Ok((c.path.as_str().into(), c.reason))
    }

    /// The file's size in bytes now.
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        let file = self.storage(py)?;
        file.current_size()
            .map_err(|e| errors::to_py(py, &e, Some(&self.path), None))
    }

    /// The file's descriptor, opened with the flags given and without
    /// `O_DIRECT`, as KvikIO's: `os.pread`, `os.fstat` and the like work
    /// on it. (The transfers use a second descriptor with `O_DIRECT`.)
    fn fileno(&self, py: Python<'_>) -> PyResult<i32> {
        let file = self.storage(py)?;
        let fd = file
            .buffered_fd()
            .map_err(|e| errors::to_py(py, &e, Some(&self.path), None))?;
        Ok(fd.as_raw_fd())
    }

    /// The flags of `fileno()`'s descriptor (`fcntl(F_GETFL)`, see
    /// `open(2)`), as KvikIO's `open_flags()`.
    fn open_flags(&self, py: Python<'_>) -> PyResult<i32> {
        let file = self.storage(py)?;
        let fd = file
            .buffered_fd()
            .map_err(|e| errors::to_py(py, &e, Some(&self.path), None))?;
        let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| {
            let e = p2pdma::Error::Io {
                op: "fcntl(F_GETFL)",
                path: self.path.clone(),
                offset: 0,
                len: 0,
                source: e,
                member: None,
            };
            errors::to_py(py, &e, Some(&self.path), None)
        })?;
        Ok(flags.bits() as i32)
    }

    /// Whether transfers with this file can use direct I/O: true for a
    /// kernel file (opened with `O_DIRECT` too), false for a namespace this
    /// process drives (which has no kernel file and needs none).
    fn is_direct_io_supported(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.storage(py)?.fd().is_ok())
    }

    /// Flushes written data to stable storage (`fdatasync`, or NVMe Flush).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let file = self.storage(py)?;
        py.detach(|| file.sync())
            .map_err(|e| errors::to_py(py, &e, Some(&self.path), None))
    }

    /// The path it was opened with.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The flags it was opened with.
    #[getter]
    fn flags(&self) -> String {
        self.flags.clone()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.storage.read().map(|s| s.is_none()).unwrap_or(true)
    }

    /// Closes the file. Transfers in flight keep it open until they end.
    fn close(&self) {
        *self.storage.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        exc_type: Option<&Bound<'_, PyAny>>,
        exc_val: Option<&Bound<'_, PyAny>>,
        exc_tb: Option<&Bound<'_, PyAny>>,
    ) {
        let _ = (exc_type, exc_val, exc_tb);
        self.close();
    }

    fn __repr__(&self) -> String {
        format!(
            "<p2pdma.File {} flags={}{}>",
            self.path.display(),
            self.flags,
            if self.closed() { " closed" } else { "" }
        )
    }
}

/// How a transfer in direction `dir` uses its memory.
fn access_for(dir: Direction) -> Access {
    match dir {
        Direction::Read => Access::Write,
        Direction::Write => Access::Read,
    }
}

/// A strided call's `layout` and `mode` arguments.
fn strided_how(py: Python<'_>, layout: &str, mode: &str) -> PyResult<(Layout, StridedMode)> {
    let layout = match layout {
        "packed" => Layout::Packed,
        "strided" => Layout::Strided,
        other => {
            return Err(errors::invalid(
                py,
                format!("layout '{other}': expected packed or strided"),
            ))
        }
    };
    let mode = match mode {
        "auto" => StridedMode::Auto,
        "rc" => StridedMode::Rc,
        "sc" => StridedMode::Sc,
        "tat" => StridedMode::Tat,
        other => {
            return Err(errors::invalid(
                py,
                format!("mode '{other}': expected auto, rc, sc or tat"),
            ))
        }
    };
    Ok((layout, mode))
}

type Entry<'py> = (
    Bound<'py, File>,
    Direction,
    Bound<'py, PyAny>,
    u64,
    Option<usize>,
);

fn submit_entries(py: Python<'_>, entries: Vec<Entry<'_>>) -> PyResult<BatchFuture> {
    let mut reqs = Vec::with_capacity(entries.len());
    for (f, dir, buf, file_offset, size) in &entries {
        reqs.push((
            f.clone(),
            f.get().request(py, *dir, buf, *size, *file_offset, 0)?,
        ));
    }
    let mut futures = Vec::with_capacity(reqs.len());
    for (f, req) in reqs {
        futures.push(Py::new(py, f.get().submit(py, req)?)?);
    }
    Ok(BatchFuture::new(futures))
}

/// The items of batch entry `i`, which must be a tuple or a list shaped
/// as `what`.
fn entry_items<'py>(
    i: usize,
    e: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(t) = e.cast::<PyTuple>() {
        return Ok(t.iter().collect());
    }
    if let Ok(l) = e.cast::<PyList>() {
        return Ok(l.iter().collect());
    }
    Err(PyTypeError::new_err(format!(
        "batch entry {i}: expected a tuple or list {what}, not a {}",
        e.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    )))
}

/// `e`, an error extracting item `name` of batch entry `i`, saying so.
fn in_entry(i: usize, name: &str, e: PyErr, py: Python<'_>) -> PyErr {
    PyErr::from_type(
        e.get_type(py),
        format!("batch entry {i}: {name}: {}", e.value(py)),
    )
}

/// The file offset of batch entry `i`.
fn offset_field(i: usize, v: &Bound<'_, PyAny>) -> PyResult<u64> {
    v.extract::<u64>()
        .map_err(|e| in_entry(i, "file_offset", e, v.py()))
}

/// The size of batch entry `i` (`None`: the rest of the buffer).
fn size_field(i: usize, v: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    v.extract::<Option<usize>>()
        .map_err(|e| in_entry(i, "size", e, v.py()))
}

/// Transfers across files at once: `entries` is a list of `(file, "r" or
/// "w", buf, file_offset[, size])`; returns a `BatchFuture`. Every entry is
/// checked before any is submitted.
#[pyfunction]
pub fn submit_batch(py: Python<'_>, entries: &Bound<'_, PyAny>) -> PyResult<BatchFuture> {
    let mut batch = Vec::new();
    for (i, e) in entries.try_iter()?.enumerate() {
        let t = entry_items(i, &e?, "(file, 'r' or 'w', buf, file_offset[, size])")?;
        if !(4..=5).contains(&t.len()) {
            return Err(errors::invalid(
                py,
                format!(
                    "batch entry {i} has {} items: expected (file, 'r' or 'w', buf, file_offset[, size])",
                    t.len()
                ),
            ));
        }
        let file = t[0]
            .cast::<File>()
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "batch entry {i}: the first item is not a p2pdma.File"
                ))
            })?
            .clone();
        let dir = match t[1].extract::<String>()?.as_str() {
            "r" => Direction::Read,
            "w" => Direction::Write,
            other => {
                return Err(errors::invalid(
                    py,
                    format!("batch entry {i}: direction '{other}': expected 'r' or 'w'"),
                ))
            }
        };
        let size = match t.get(4) {
            Some(s) => size_field(i, s)?,
            None => None,
        };
        let file_offset = offset_field(i, &t[3])?;
        batch.push((file, dir, t[2].clone(), file_offset, size));
    }
    submit_entries(py, batch)
}
