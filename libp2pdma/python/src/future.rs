//! Transfers in flight: KvikIO's `IOFuture` (`get()`, `done()`), plus
//! `wait(timeout)` and `await` from asyncio.
//!
//! A future keeps the memory and the file its transfer uses until the
//! transfer ends, even if Python lets go of them. Awaiting does not take a
//! thread: the engine's worker wakes the event loop
//! (`call_soon_threadsafe`) when the transfer ends.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    task::{Context, Poll, Wake, Waker},
    time::{Duration, Instant},
};

use p2pdma::{DeviceMemory, StorageFile, Ticket};
use pyo3::{prelude::*, sync::PyOnceLock, types::PyList};

use crate::errors;

/// How long a wait sleeps between looks for a signal.
const SLICE: Duration = Duration::from_millis(50);

/// What a finished transfer gave.
enum Outcome {
    Done(usize),
    Failed(PyErr),
}

struct State {
    outcome: Option<Outcome>,
    /// Asyncio futures waiting on the transfer, with their loops.
    awaiters: Vec<(Py<PyAny>, Py<PyAny>)>,
    waker_set: bool,
}

/// A transfer in flight.
#[pyclass(frozen, module = "p2pdma")]
pub struct Future {
    ticket: Option<Ticket>,
    len: usize,
    engine: Arc<p2pdma::Engine>,
    context: (PathBuf, Arc<StorageFile>, Arc<dyn DeviceMemory>),
    state: Mutex<State>,
}

impl Future {
    pub fn new(
        ticket: Option<Ticket>,
        len: usize,
        engine: Arc<p2pdma::Engine>,
        context: (PathBuf, Arc<StorageFile>, Arc<dyn DeviceMemory>),
    ) -> Self {
        let outcome = ticket.is_none().then_some(Outcome::Done(0));
        Self {
            ticket,
            len,
            engine,
            context,
            state: Mutex::new(State {
                outcome,
                awaiters: Vec::new(),
                waker_set: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn convert(
        &self,
        py: Python<'_>,
        r: p2pdma::Result<p2pdma::transfer::core::Report>,
    ) -> Outcome {
        match r {
            Ok(rep) => Outcome::Done(rep.bytes as usize),
            Err(e) => {
                let (path, file, mem) = &self.context;
                let taken = self.engine.choose(file, &**mem).ok();
                Outcome::Failed(errors::to_py(py, &e, Some(path), taken.as_ref()))
            }
        }
    }

    /// The outcome, taking it from the ticket if the transfer has ended.
    /// Never blocks.
    fn settle(&self, py: Python<'_>) -> Option<PyResult<usize>> {
        let mut s = self.state();
        if s.outcome.is_none() {
            let r = self.ticket.as_ref().and_then(|t| t.poll())?;
            s.outcome = Some(self.convert(py, r));
        }
        s.outcome.as_ref().map(|o| match o {
            Outcome::Done(n) => Ok(*n),
            Outcome::Failed(e) => Err(e.clone_ref(py)),
        })
    }
}

/// Wakes the asyncio loops waiting on a future.
struct LoopWaker {
    future: Py<Future>,
}

static COMPLETE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn complete_fn(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    COMPLETE
        .get_or_try_init(py, || {
            Ok(py.import("p2pdma._aio")?.getattr("complete")?.unbind())
        })
        .map(|f| f.bind(py))
}

impl Wake for LoopWaker {
    fn wake(self: Arc<Self>) {
        Python::attach(|py| {
            self.notify(py);
            // The waker's reference to the future goes while the GIL is
            // held: dropped without it, PyO3 would defer it to the next
            // call into the binding, and the future would keep its memory
            // (a lent tensor, which its producer wants back) until then.
            drop(self);
        });
    }
}

impl LoopWaker {
    /// Schedules the completion of every asyncio future awaiting ours.
    fn notify(&self, py: Python<'_>) {
        let f = self.future.bind(py);
        let awaiters = std::mem::take(&mut f.get().state().awaiters);
        let Ok(complete) = complete_fn(py) else {
            return;
        };
        for (event_loop, aio) in awaiters {
            // A closed loop refuses; its awaiter is gone with it.
            let _ = event_loop
                .bind(py)
                .call_method1("call_soon_threadsafe", (complete, aio.bind(py), f));
        }
    }
}

#[pymethods]
impl Future {
    /// Whether the transfer has ended.
    fn done(&self) -> bool {
        self.state().outcome.is_some() || self.ticket.as_ref().is_none_or(|t| t.is_done())
    }

    /// Waits for the transfer (at most `timeout` seconds) and returns the
    /// bytes moved, or raises its error; `TimeoutError` if it is still
    /// running at the deadline.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<usize> {
        // Without a deadline, a transfer no worker has started (a deferred
        // read) runs here; with one, it goes to the workers (`settle`).
        if let (Some(t), None) = (&self.ticket, timeout) {
            py.detach(|| t.run_here());
        }
        if let Some(r) = self.settle(py) {
            return r;
        }
        let timeout = match timeout {
            Some(t) if !(t >= 0.0 && t.is_finite()) => {
                return Err(errors::invalid(
                    py,
                    format!("timeout {t} is not a duration"),
                ))
            }
            t => t.map(Duration::from_secs_f64),
        };
        let ticket = self.ticket.clone().expect("a pending future has a ticket");
        let deadline = timeout.map(|t| Instant::now() + t);
        // Waits in slices, so that a signal (Ctrl-C) is handled meanwhile.
        loop {
            let slice = match deadline {
                None => SLICE,
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
            };
            if py.detach(|| ticket.wait_done(Some(slice))) {
                break;
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(pyo3::exceptions::PyTimeoutError::new_err(format!(
                    "the {}-byte transfer is still running",
                    self.len
                )));
            }
        }
        self.settle(py).expect("a finished transfer has an outcome")
    }

    /// KvikIO's name for `wait()`.
    fn get(&self, py: Python<'_>) -> PyResult<usize> {
        self.wait(py, None)
    }

    /// The bytes the transfer moves when it succeeds.
    #[getter]
    fn size(&self) -> usize {
        self.len
    }

    fn __await__(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let asyncio = py.import("asyncio")?;
        let event_loop = asyncio.call_method0("get_running_loop")?;
        let aio = event_loop.call_method0("create_future")?;
        let me = slf.get();
        let ready = me.settle(py);
        match ready {
            Some(Ok(n)) => {
                aio.call_method1("set_result", (n,))?;
            }
            Some(Err(e)) => {
                aio.call_method1("set_exception", (e.value(py),))?;
            }
            None => {
                let register = {
                    let mut s = me.state();
                    s.awaiters.push((event_loop.unbind(), aio.clone().unbind()));
                    !std::mem::replace(&mut s.waker_set, true)
                };
                if register {
                    let waker = Waker::from(Arc::new(LoopWaker {
                        future: slf.clone().unbind(),
                    }));
                    let mut ticket = me.ticket.clone().expect("a pending future has a ticket");
                    // Polling registers the waker; a transfer that ended
                    // meanwhile is ready at once and wakes the loop itself.
                    if let Poll::Ready(r) = std::future::Future::poll(
                        std::pin::Pin::new(&mut ticket),
                        &mut Context::from_waker(&waker),
                    ) {
                        let o = me.convert(py, r);
                        me.state().outcome = Some(o);
                        waker.wake();
                    }
                }
            }
        }
        Ok(aio.call_method0("__await__")?.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "<p2pdma.Future {} bytes{}>",
            self.len,
            if self.done() { " done" } else { "" }
        )
    }
}

/// Several transfers in flight.
#[pyclass(frozen, module = "p2pdma")]
pub struct BatchFuture {
    futures: Vec<Py<Future>>,
}

impl BatchFuture {
    pub fn new(futures: Vec<Py<Future>>) -> Self {
        Self { futures }
    }
}

#[pymethods]
impl BatchFuture {
    /// The futures, one per entry, in order.
    #[getter]
    fn futures<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.futures.iter().map(|f| f.clone_ref(py)))
    }

    /// Whether every transfer has ended.
    fn done(&self, py: Python<'_>) -> bool {
        self.futures.iter().all(|f| f.bind(py).get().done())
    }

    /// Waits for every transfer and returns their byte counts in order;
    /// raises the first entry's error (in entry order) after all have
    /// ended, so no buffer is still being written when it is raised.
    fn wait(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        let results: Vec<PyResult<usize>> = self
            .futures
            .iter()
            .map(|f| f.bind(py).get().wait(py, None))
            .collect();
        results.into_iter().collect()
    }

    /// KvikIO's name for `wait()`.
    fn get(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        self.wait(py)
    }

    fn __len__(&self) -> usize {
        self.futures.len()
    }

    fn __await__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let gather = py.import("p2pdma._aio")?.getattr("gather")?;
        let futures = PyList::new(py, self.futures.iter().map(|f| f.clone_ref(py)))?;
        Ok(gather
            .call1((futures,))?
            .call_method0("__await__")?
            .unbind())
    }
}

/// KvikIO's `IOFutureStream`: what `raw_read_async` and `raw_write_async`
/// return. The transfer has ended in the stream's order when the call
/// returns, so `check_bytes_done()` only gives the count.
#[pyclass(frozen, module = "p2pdma")]
pub struct StreamFuture {
    bytes: usize,
}

impl StreamFuture {
    /// A transfer of `bytes` that has ended.
    pub fn done(bytes: usize) -> Self {
        Self { bytes }
    }
}

#[pymethods]
impl StreamFuture {
    /// The bytes moved (the transfer has ended, in the stream's order).
    fn check_bytes_done(&self) -> usize {
        self.bytes
    }

    fn __repr__(&self) -> String {
        format!("<p2pdma.StreamFuture {} bytes done>", self.bytes)
    }
}
