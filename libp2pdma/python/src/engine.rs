//! The transfer engine, its counters, and the doctor.
//!
//! One default engine serves every `File` opened without one (KvikIO's
//! global thread pool); it reads its settings from the environment
//! (`P2PDMA_PATH`, `P2PDMA_CHUNK`, ... and `P2PDMA_CONFIG`) when first
//! used. The p2pdma module is opened once, where it is loaded.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, RwLock,
    },
};

use p2pdma::{transfer::TransferPath, AccelSelect, Config, Doctor, Module};
use pyo3::{prelude::*, types::PyDict};

use crate::errors;

/// The module, opened on first use; `None` where it is not loaded.
static MODULE: Mutex<Option<Arc<Module>>> = Mutex::new(None);

/// The p2pdma module, opening it on first use.
pub fn module(py: Python<'_>) -> PyResult<Arc<Module>> {
    let mut m = MODULE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = &*m {
        return Ok(m.clone());
    }
    let opened = Arc::new(Module::open().map_err(|e| errors::to_py(py, &e, None, None))?);
    *m = Some(opened.clone());
    Ok(opened)
}

/// Forks this process has gone through since the module was loaded (as
/// seen by the child): an engine's worker threads stay in the process that
/// made it.
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Counts forks from now on (the module's initialization calls it).
pub fn watch_forks() {
    // SAFETY: The handler only increments an atomic, which is
    // async-signal-safe; registering has no other precondition.
    unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
}

/// The transfer engine: picks the path for each file and memory, moves the
/// bytes, counts what each path did.
#[pyclass(frozen, module = "p2pdma")]
pub struct Engine {
    inner: Arc<p2pdma::Engine>,
    /// `FORKS` when it was made: its worker threads do not survive `fork`.
    generation: u64,
}

/// The default engine, with the fork generation it belongs to.
struct Default {
    generation: u64,
    inner: Arc<p2pdma::Engine>,
    object: Py<Engine>,
}

static DEFAULT: RwLock<Option<Default>> = RwLock::new(None);

/// The engine `File`s use when given none, made from the environment on
/// first use, and made again in a child process after `fork` (the
/// parent's worker threads are not there).
#[pyfunction]
pub fn default_engine(py: Python<'_>) -> PyResult<Py<Engine>> {
    current_default(py).map(|d| d.1)
}

/// The default engine's library engine, cheaply: what every transfer of a
/// `File` opened without an engine asks for.
pub fn default_inner(py: Python<'_>) -> PyResult<Arc<p2pdma::Engine>> {
    {
        let d = DEFAULT.read().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = &*d {
            if d.generation == FORKS.load(Ordering::Relaxed) {
                return Ok(d.inner.clone());
            }
        }
    }
    current_default(py).map(|d| d.0)
}

fn current_default(py: Python<'_>) -> PyResult<(Arc<p2pdma::Engine>, Py<Engine>)> {
    let generation = FORKS.load(Ordering::Relaxed);
    let mut d = DEFAULT.write().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = &*d {
        if d.generation == generation {
            return Ok((d.inner.clone(), d.object.clone_ref(py)));
        }
    }
    let config = Config::from_env().map_err(|e| errors::to_py(py, &e, None, None))?;
    let engine = Engine::with(config, module(py).ok());
    let inner = engine.inner.clone();
    let object = Py::new(py, engine)?;
    let made = Default {
        generation,
        inner: inner.clone(),
        object: object.clone_ref(py),
    };
    if let Some(parents) = d.replace(made) {
        // The parent's engine would join worker threads this process does
        // not have: it is never dropped here.
        std::mem::forget(parents);
    }
    Ok((inner, object))
}

impl Engine {
    fn with(config: Config, module: Option<Arc<Module>>) -> Self {
        Self {
            inner: Arc::new(p2pdma::Engine::new(config, module)),
            generation: FORKS.load(Ordering::Relaxed),
        }
    }

    /// The library's engine, if it belongs to this process.
    pub fn here(&self, py: Python<'_>) -> PyResult<Arc<p2pdma::Engine>> {
        if self.generation != FORKS.load(Ordering::Relaxed) {
            return Err(errors::invalid(
                py,
                "this engine was made before the process forked, and its worker threads stayed in the parent: make a p2pdma.Engine in this process, or use the default engine, which is made again after fork",
            ));
        }
        Ok(self.inner.clone())
    }
}

fn snapshot(
    py: Python<'_>,
    s: p2pdma::transfer::stats::PathSnapshot,
) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", s.bytes)?;
    d.set_item("transfers", s.transfers)?;
    d.set_item("ios", s.ios)?;
    d.set_item("module_ios", s.module_ios)?;
    d.set_item("retries", s.retries)?;
    d.set_item("storage_seconds", s.storage.as_secs_f64())?;
    d.set_item("copy_seconds", s.copy.as_secs_f64())?;
    d.set_item("total_seconds", s.total.as_secs_f64())?;
    Ok(d)
}

#[pymethods]
impl Engine {
    /// An engine with these settings over the environment's (`path`:
    /// auto, p2p, nvme-cmd, bounce or queues; `page_cache`: auto, direct or
    /// buffered; `chunk`: bytes per I/O; `depth`: I/Os in flight;
    /// `copy_threads`; and the other keys of `P2PDMA_CONFIG` files).
    #[new]
    #[pyo3(signature = (**settings))]
    fn new(py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut config = Config::from_env().map_err(|e| errors::to_py(py, &e, None, None))?;
        for (k, v) in settings.into_iter().flat_map(|d| d.iter()) {
            let key: String = k.extract()?;
            if v.is_none() {
                // None leaves the setting as the environment has it.
                continue;
            }
            let value = v.str()?.to_string();
            config
                .set(&key, &value)
                .map_err(|e| errors::to_py(py, &e, None, None))?;
        }
        Ok(Self::with(config, module(py).ok()))
    }

    /// The path setting: auto, p2p, nvme-cmd, bounce or queues.
    #[getter]
    fn path(&self) -> &'static str {
        self.inner.config().path.as_str()
    }

    /// Whether reads take what the page cache holds from it: auto, direct
    /// or buffered.
    #[getter]
    fn page_cache(&self) -> &'static str {
        self.inner.config().page_cache.as_str()
    }

    /// Whether the p2pdma module is open (accelerator memory and P2P need it).
    #[getter]
    fn has_module(&self) -> bool {
        MODULE.lock().map(|m| m.is_some()).unwrap_or(false)
    }

    /// What each path has moved since the engine was made: a dict of
    /// `p2p`, `nvme-cmd`, `bounce`, `queues`, `direct`, each with `bytes`,
    /// `transfers`, `ios`, `module_ios`, `retries` and seconds spent; and
    /// `page-cache`, the bytes reads copied out of the page cache.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for p in [
            TransferPath::P2p,
            TransferPath::NvmeCmd,
            TransferPath::Bounce,
            TransferPath::Queues,
            TransferPath::Direct,
        ] {
            d.set_item(
                p.as_str(),
                snapshot(py, self.inner.stats().of(p).snapshot())?,
            )?;
        }
        d.set_item(
            "page-cache",
            snapshot(py, self.inner.stats().page_cache.snapshot())?,
        )?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("<p2pdma.Engine path={}>", self.inner.config().path.as_str())
    }
}

/// The doctor's report on this machine, for `storage` (a file or block
/// device, optional) and accelerator `accel` (an index or a PCI address;
/// the first when omitted), as a dict: every check with its status and
/// detail, the path AUTO would take and why.
#[pyfunction]
#[pyo3(signature = (storage = None, accel = None))]
pub fn doctor<'py>(
    py: Python<'py>,
    storage: Option<PathBuf>,
    accel: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let select = match accel {
        None => AccelSelect::Auto,
        Some(a) => match a.extract::<u32>() {
            Ok(i) => AccelSelect::Index(i),
            Err(_) => {
                let s: String = a.extract()?;
                AccelSelect::Pci(
                    s.parse()
                        .map_err(|e: p2pdma::Error| errors::to_py(py, &e, None, None))?,
                )
            }
        },
    };
    let report = py.detach(|| Doctor::new().run(storage.as_deref(), select));
    let json = report.to_json().to_string();
    py.import("json")?.call_method1("loads", (json,))
}
