//! Asynchronous transfers: submit now, then poll, wait or `.await`; batches
//! of many transfers at once.
//!
//! Requests own their file and memory (`Arc`s), so they can outlive the
//! caller's stack frame. A small pool of worker threads per engine runs them,
//! each worker with its own pooled io_uring ring, so a batch's transfers
//! proceed in parallel.

use std::{
    future::Future,
    pin::Pin,
    sync::{mpsc, Arc, Condvar, Mutex},
    task::{Context as TaskContext, Poll, Waker},
};

use super::{Direction, Engine, Report, StorageFile};
use crate::{backend::DeviceMemory, Error, Result};

/// One transfer to run asynchronously.
#[derive(Clone, Debug)]
pub struct Request {
    /// Which way.
    pub dir: Direction,
    /// The storage side.
    pub file: Arc<StorageFile>,
    /// Offset in the file.
    pub file_offset: u64,
    /// The memory side.
    pub mem: Arc<dyn DeviceMemory>,
    /// Offset in the memory.
    pub mem_offset: usize,
    /// Bytes.
    pub len: usize,
}

#[derive(Default)]
struct Slot {
    result: Option<Result<Report>>,
    taken: bool,
    waker: Option<Waker>,
}

/// A submitted transfer: poll it, wait for it, or await it.
#[derive(Clone)]
pub struct Ticket {
    shared: Arc<(Mutex<Slot>, Condvar)>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("done", &self.is_done())
            .finish()
    }
}

impl Ticket {
    fn new() -> Self {
        Self {
            shared: Arc::new((Mutex::new(Slot::default()), Condvar::new())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn complete(&self, r: Result<Report>) {
        let mut s = self.lock();
        s.result = Some(r);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        self.shared.1.notify_all();
    }

    /// Whether the transfer has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        let s = self.lock();
        s.result.is_some() || s.taken
    }

    /// The result if the transfer has finished, without blocking. The
    /// result is handed out once; later calls give an error.
    pub fn poll(&self) -> Option<Result<Report>> {
        let mut s = self.lock();
        take(&mut s)
    }

    /// Blocks until the transfer finishes and returns its result.
    pub fn wait(&self) -> Result<Report> {
        let mut s = self.lock();
        loop {
            if let Some(r) = take(&mut s) {
                return r;
            }
            s = self.shared.1.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn take(s: &mut Slot) -> Option<Result<Report>> {
    if s.taken {
        return Some(Err(Error::InvalidArgument(
            "the transfer's result was already taken".into(),
        )));
    }
    let r = s.result.take()?;
    s.taken = true;
    Some(r)
}

impl Future for Ticket {
    type Output = Result<Report>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut s = self.lock();
        match take(&mut s) {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

type Job = (Request, Ticket);

/// The worker pool of one engine.
pub(super) struct Workers {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
}

impl Workers {
    pub(super) fn new() -> Self {
        Self {
            tx: Mutex::new(None),
        }
    }
}

/// Worker threads per engine.
const WORKERS: usize = 4;

/// Runs one job and completes its ticket, whatever happens: a panic in the
/// transfer (a `DeviceMemory` implementation's, say) completes it with an
/// error and leaves the worker running, so no `wait` is left hanging.
fn run_job(engine: &Engine, (req, ticket): Job) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine
            .handle(&req.file, req.mem.as_ref())
            .and_then(|h| match req.dir {
                Direction::Read => h.read(req.file_offset, req.mem_offset, req.len),
                Direction::Write => h.write(req.file_offset, req.mem_offset, req.len),
            })
    }));
    ticket.complete(r.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::Panicked(what))
    }));
}

impl Engine {
    /// Submits a transfer to run in the background; returns at once.
    pub fn submit(self: &Arc<Self>, req: Request) -> Ticket {
        let ticket = Ticket::new();
        let job = (req, ticket.clone());
        let mut tx = self.workers.tx.lock().unwrap_or_else(|p| p.into_inner());
        if tx.is_none() {
            let (t, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..WORKERS {
                let (rx, engine) = (rx.clone(), Arc::downgrade(self));
                let spawned = std::thread::Builder::new()
                    .name(format!("p2pdma-io-{i}"))
                    .spawn(move || loop {
                        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                            Ok(j) => j,
                            Err(_) => return,
                        };
                        match engine.upgrade() {
                            Some(e) => run_job(&e, job),
                            None => job.1.complete(Err(Error::InvalidArgument(
                                "the engine was dropped".into(),
                            ))),
                        }
                    });
                if spawned.is_err() && i == 0 {
                    // No thread at all: run the job here rather than lose it.
                    drop(tx);
                    run_job(self, job);
                    return ticket;
                }
            }
            *tx = Some(t);
        }
        let sent = tx.as_ref().map(|t| t.send(job));
        if let Some(Err(mpsc::SendError(job))) = sent {
            drop(tx);
            run_job(self, job);
        }
        ticket
    }

    /// Submits many transfers at once; they run in parallel on the pool.
    pub fn submit_batch(self: &Arc<Self>, reqs: impl IntoIterator<Item = Request>) -> Vec<Ticket> {
        reqs.into_iter().map(|r| self.submit(r)).collect()
    }

    /// Waits for every ticket and returns the results in order.
    pub fn wait_all(tickets: &[Ticket]) -> Vec<Result<Report>> {
        tickets.iter().map(Ticket::wait).collect()
    }
}
