//! Asynchronous transfers: submit now, then poll, wait or `.await`; batches
//! of many transfers at once. Plain transfers ([`Request`]) and strided ones
//! ([`StridedRequest`]) alike.
//!
//! Requests own their file and memory (`Arc`s), so they can outlive the
//! caller's stack frame. A small pool of worker threads per engine runs them,
//! each worker with its own pooled io_uring ring, so a batch's transfers
//! proceed in parallel.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Condvar, Mutex},
    task::{Context as TaskContext, Poll, Waker},
};

use super::{
    engine::{Engine, Report},
    exec::workers::Job,
    storage::StorageFile,
    strided::{Layout, Shape, StridedMode, StridedReport},
    xfer::Direction,
};
use crate::{memory::DeviceMemory, Error, Result};

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

/// One strided transfer to run asynchronously: [`Engine::read_strided`]
/// or [`Engine::write_strided`] with owned arguments.
#[derive(Clone, Debug)]
pub struct StridedRequest {
    /// Which way.
    pub dir: Direction,
    /// The storage side.
    pub file: Arc<StorageFile>,
    /// Where the runs lie in the file.
    pub shape: Shape,
    /// The memory side.
    pub mem: Arc<dyn DeviceMemory>,
    /// Offset in the memory where the layout starts.
    pub mem_offset: usize,
    /// Where the runs lie in the memory.
    pub layout: Layout,
    /// How the runs move.
    pub mode: StridedMode,
}

struct Slot<T> {
    result: Option<Result<T>>,
    taken: bool,
    waker: Option<Waker>,
}

/// A submitted transfer: poll it, wait for it, or await it. Its result is
/// a [`Report`] for plain transfers, a [`StridedReport`] for strided ones.
pub struct Ticket<T = Report> {
    shared: Arc<(Mutex<Slot<T>>, Condvar)>,
}

impl<T> Clone for Ticket<T> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Ticket<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("done", &self.is_done())
            .finish()
    }
}

impl<T> Ticket<T> {
    fn new() -> Self {
        let slot = Slot {
            result: None,
            taken: false,
            waker: None,
        };
        Self {
            shared: Arc::new((Mutex::new(slot), Condvar::new())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<T>> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn complete(&self, r: Result<T>) {
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
    pub fn poll(&self) -> Option<Result<T>> {
        let mut s = self.lock();
        take(&mut s)
    }

    /// Blocks until the transfer finishes and returns its result.
    pub fn wait(&self) -> Result<T> {
        let mut s = self.lock();
        loop {
            if let Some(r) = take(&mut s) {
                return r;
            }
            s = self.shared.1.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn take<T>(s: &mut Slot<T>) -> Option<Result<T>> {
    if s.taken {
        return Some(Err(Error::InvalidArgument(
            "the transfer's result was already taken".into(),
        )));
    }
    let r = s.result.take()?;
    s.taken = true;
    Some(r)
}

impl<T> Future for Ticket<T> {
    type Output = Result<T>;

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

/// A job that runs `work` and completes `ticket` with its result, whatever
/// happens: a panic in the transfer (a `DeviceMemory` implementation's,
/// say) completes it with an error and leaves the worker running, and a
/// dropped engine completes it with an error, so no `wait` is left
/// hanging.
fn job<T: Send + 'static>(
    ticket: Ticket<T>,
    work: impl FnOnce(&Engine) -> Result<T> + Send + 'static,
) -> Job<Engine> {
    Box::new(move |engine: Option<&Engine>| {
        let Some(engine) = engine else {
            ticket.complete(Err(Error::InvalidArgument("the engine was dropped".into())));
            return;
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(engine)));
        ticket.complete(r.unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Panicked(what))
        }));
    })
}

impl Engine {
    /// Submits a transfer to run in the background; returns at once.
    pub fn submit(self: &Arc<Self>, req: Request) -> Ticket {
        let ticket = Ticket::new();
        self.workers.queue(
            self,
            job(ticket.clone(), move |engine| {
                engine
                    .handle(&req.file, req.mem.as_ref())
                    .and_then(|h| match req.dir {
                        Direction::Read => h.read(req.file_offset, req.mem_offset, req.len),
                        Direction::Write => h.write(req.file_offset, req.mem_offset, req.len),
                    })
            }),
        );
        ticket
    }

    /// Submits many transfers at once; they run in parallel on the pool.
    pub fn submit_batch(self: &Arc<Self>, reqs: impl IntoIterator<Item = Request>) -> Vec<Ticket> {
        reqs.into_iter().map(|r| self.submit(r)).collect()
    }

    /// Submits a strided read or write to run in the background; returns
    /// at once. Its ticket gives what [`Engine::read_strided`] or
    /// [`Engine::write_strided`] would have returned.
    pub fn submit_strided(self: &Arc<Self>, req: StridedRequest) -> Ticket<StridedReport> {
        let ticket = Ticket::new();
        self.workers.queue(
            self,
            job(ticket.clone(), move |engine| {
                let StridedRequest {
                    dir,
                    file,
                    shape,
                    mem,
                    mem_offset,
                    layout,
                    mode,
                } = req;
                match dir {
                    Direction::Read => {
                        engine.read_strided(&file, &shape, mem.as_ref(), mem_offset, layout, mode)
                    }
                    Direction::Write => {
                        engine.write_strided(&file, &shape, mem.as_ref(), mem_offset, layout, mode)
                    }
                }
            }),
        );
        ticket
    }

    /// Submits many strided transfers at once; they run in parallel on the
    /// pool (each also spreading its own runs as it would alone).
    pub fn submit_strided_batch(
        self: &Arc<Self>,
        reqs: impl IntoIterator<Item = StridedRequest>,
    ) -> Vec<Ticket<StridedReport>> {
        reqs.into_iter().map(|r| self.submit_strided(r)).collect()
    }

    /// Waits for every ticket and returns the results in order.
    pub fn wait_all<T>(tickets: &[Ticket<T>]) -> Vec<Result<T>> {
        tickets.iter().map(Ticket::wait).collect()
    }
}
