//! Asynchronous transfers: submit now, then poll, wait or `.await`; batches
//! of many transfers at once. Plain transfers ([`Request`]) and strided ones
//! ([`StridedRequest`]) alike.
//!
//! Requests own their file and memory (`Arc`s), so they can outlive the
//! caller's stack frame. A small pool of worker threads per engine runs them,
//! each worker with its own pooled io_uring ring, so a batch's transfers
//! proceed in parallel. A thread that waits for a transfer no worker has
//! started yet runs it itself: a submit followed by a wait costs no
//! hand-off between threads.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Condvar, Mutex},
    task::{Context as TaskContext, Poll, Waker},
};

use super::{
    core::{Core, Report},
    exec::workers::{Job, Workers},
    storage::StorageFile,
    strided::{Layout, Shape, Strided, StridedMode, StridedReport},
    xfer::Direction,
};
use crate::{
    memory::{DeviceMemory, MemRange},
    Error, Result,
};

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

/// One strided transfer to run asynchronously: [`Strided::read`] or
/// [`Strided::write`] with owned arguments, the memory range from
/// `mem_offset` to the memory's end.
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

/// Work that runs once, on whichever thread takes it first; shared by the
/// clones that may take it.
#[derive(Clone)]
struct Once(Arc<Mutex<Option<Work>>>);

/// What a [`Once`] runs.
type Work = Box<dyn FnOnce() + Send>;

impl Once {
    fn new(f: impl FnOnce() + Send + 'static) -> Self {
        Self(Arc::new(Mutex::new(Some(Box::new(f)))))
    }

    /// Runs the work here if no one has taken it yet.
    fn run(&self) {
        let f = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = f {
            f();
        }
    }

    /// Takes the work away, unrun.
    fn cancel(&self) {
        drop(self.0.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// A submitted transfer: poll it, wait for it, or await it. Its result is
/// a [`Report`] for plain transfers, a [`StridedReport`] for strided ones.
pub struct Ticket<T = Report> {
    shared: Arc<(Mutex<Slot<T>>, Condvar)>,
    /// The transfer not started yet, which a worker or a waiter runs.
    claim: Option<Once>,
    /// For a deferred transfer: what hands `claim` to the workers.
    start: Option<Once>,
}

impl<T> Clone for Ticket<T> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            claim: self.claim.clone(),
            start: self.start.clone(),
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
    pub(crate) fn new() -> Self {
        let slot = Slot {
            result: None,
            taken: false,
            waker: None,
        };
        Self {
            shared: Arc::new((Mutex::new(slot), Condvar::new())),
            claim: None,
            start: None,
        }
    }

    /// The same ticket without the transfer to run: what completes it.
    fn completer(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            claim: None,
            start: None,
        }
    }

    /// Hands a deferred transfer to the workers, if it is still waiting.
    fn start_if_deferred(&self) {
        if let Some(s) = &self.start {
            s.run();
        }
    }

    /// Runs the transfer on this thread if no worker has started it (and
    /// returns when it has ended); does nothing otherwise.
    pub fn run_here(&self) {
        if let Some(s) = &self.start {
            // Run here: nothing is left for the workers.
            s.cancel();
        }
        if let Some(c) = &self.claim {
            c.run();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<T>> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn complete(&self, r: Result<T>) {
        let waker = {
            let mut s = self.lock();
            s.result = Some(r);
            self.shared.1.notify_all();
            s.waker.take()
        };
        // Woken outside the lock: a waker may take locks of its own (an
        // interpreter's), which a thread polling the ticket may hold.
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Whether the transfer has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.start_if_deferred();
        let s = self.lock();
        s.result.is_some() || s.taken
    }

    /// The result if the transfer has finished, without blocking. The
    /// result is handed out once; later calls give an error.
    pub fn poll(&self) -> Option<Result<T>> {
        self.start_if_deferred();
        let mut s = self.lock();
        take(&mut s)
    }

    /// Blocks until the transfer finishes, or `timeout` passes, without
    /// taking the result; says whether it finished.
    pub fn wait_done(&self, timeout: Option<std::time::Duration>) -> bool {
        self.run_here();
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut s = self.lock();
        loop {
            if s.result.is_some() || s.taken {
                return true;
            }
            s = match deadline {
                None => self.shared.1.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.shared
                        .1
                        .wait_timeout(s, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    /// Blocks until the transfer finishes and returns its result.
    pub fn wait(&self) -> Result<T> {
        self.run_here();
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
        self.start_if_deferred();
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

/// Runs `work` and completes `ticket` with its result, whatever happens: a
/// panic in the transfer (a `DeviceMemory` implementation's, say)
/// completes it with an error and leaves the thread running, and a dropped
/// engine (`core` gone) completes it with an error, so no `wait` is left
/// hanging.
fn run<T>(ticket: &Ticket<T>, core: Option<&Core>, work: impl FnOnce(&Core) -> Result<T>) {
    let Some(core) = core else {
        ticket.complete(Err(Error::InvalidArgument("the engine was dropped".into())));
        return;
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(core)));
    ticket.complete(r.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::Panicked(what))
    }));
}

/// Queues `work` on `workers` and returns its ticket: a worker runs it, or
/// the first thread to wait for the ticket before a worker starts it. With
/// `deferred`, nothing is queued until the ticket is first polled or asked
/// whether it is done.
fn dispatch<T: Send + 'static>(
    core: &Arc<Core>,
    workers: &Arc<Workers<Core>>,
    lane: u64,
    deferred: bool,
    work: impl FnOnce(&Core) -> Result<T> + Send + 'static,
) -> Ticket<T> {
    let mut ticket = Ticket::new();
    let (done, weak) = (ticket.completer(), Arc::downgrade(core));
    let claim = Once::new(move || run(&done, weak.upgrade().as_deref(), work));
    ticket.claim = Some(claim.clone());
    let job: Job<Core> = Box::new(move |_: Option<&Core>| claim.run());
    if deferred {
        let (core, workers) = (core.clone(), workers.clone());
        ticket.start = Some(Once::new(move || workers.queue(&core, lane, job)));
    } else {
        workers.queue(core, lane, job);
    }
    ticket
}

/// Runs `req` on `workers` with `core`; its ticket.
pub fn submit(core: &Arc<Core>, workers: &Arc<Workers<Core>>, req: Request) -> Ticket {
    submit_with(core, workers, req, false)
}

/// [`submit`], the transfer deferred until its ticket is waited for (run
/// by the waiter) or polled (handed to the workers).
pub fn submit_deferred(core: &Arc<Core>, workers: &Arc<Workers<Core>>, req: Request) -> Ticket {
    submit_with(core, workers, req, true)
}

fn submit_with(
    core: &Arc<Core>,
    workers: &Arc<Workers<Core>>,
    req: Request,
    deferred: bool,
) -> Ticket {
    // A read the page cache can serve at once ends here, without a hand-off
    // to a worker.
    if req.dir == Direction::Read {
        let now = MemRange::new(req.mem.as_ref(), req.mem_offset, req.len)
            .ok()
            .and_then(|range| core.read_if_cached(&req.file, req.file_offset, range));
        if let Some(report) = now {
            let ticket = Ticket::new();
            ticket.complete(Ok(report));
            return ticket;
        }
    }
    dispatch(core, workers, req.file.lane(), deferred, move |core| {
        core.handle(&req.file, req.mem.as_ref())
            .and_then(|h| match req.dir {
                Direction::Read => h.read(req.file_offset, req.mem_offset, req.len),
                Direction::Write => h.write(req.file_offset, req.mem_offset, req.len),
            })
    })
}

/// Runs the strided transfer `req` on `workers` with `core`; its ticket.
pub fn submit_strided(
    core: &Arc<Core>,
    workers: &Arc<Workers<Core>>,
    req: StridedRequest,
) -> Ticket<StridedReport> {
    dispatch(core, workers, req.file.lane(), false, move |core| {
        let StridedRequest {
            dir,
            file,
            shape,
            mem,
            mem_offset,
            layout,
            mode,
        } = req;
        let range = MemRange::from_offset(mem.as_ref(), mem_offset)?;
        match dir {
            Direction::Read => Strided::new(core).read(&file, &shape, range, layout, mode),
            Direction::Write => Strided::new(core).write(&file, &shape, range, layout, mode),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_waiter_runs_a_transfer_no_worker_has_started() {
        let mut t: Ticket<std::thread::ThreadId> = Ticket::new();
        let done = t.completer();
        let claim = Once::new(move || done.complete(Ok(std::thread::current().id())));
        t.claim = Some(claim.clone());
        assert_eq!(t.wait().unwrap(), std::thread::current().id());
        // Taken: a worker coming later finds nothing to run.
        assert!(claim.0.lock().unwrap().is_none());
        t.run_here();
        assert!(t.poll().unwrap().is_err());
    }

    #[test]
    fn wait_done_waits_without_taking_and_times_out() {
        let t: Ticket<u32> = Ticket::new();
        assert!(!t.wait_done(Some(Duration::from_millis(20))));
        let done = t.clone();
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            done.complete(Ok(7));
        });
        assert!(t.wait_done(None));
        th.join().unwrap();
        assert!(t.wait_done(Some(Duration::ZERO)));
        // Waiting took nothing: the result is still there, once.
        assert_eq!(t.poll().unwrap().unwrap(), 7);
        assert!(t.poll().unwrap().is_err());
        assert!(t.wait_done(None));
    }

    #[test]
    fn a_waker_runs_after_the_lock_is_released() {
        struct Probe(Ticket<u32>, std::sync::atomic::AtomicBool);
        impl std::task::Wake for Probe {
            fn wake(self: Arc<Self>) {
                // The ticket's lock must be free here, for whatever the
                // waker calls (an interpreter's poll of the ticket).
                let free = self.0.shared.0.try_lock().is_ok();
                self.1.store(free, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let t: Ticket<u32> = Ticket::new();
        let probe = Arc::new(Probe(t.clone(), false.into()));
        let waker = Waker::from(probe.clone());
        let mut polled = t.clone();
        assert!(Pin::new(&mut polled)
            .poll(&mut TaskContext::from_waker(&waker))
            .is_pending());
        t.complete(Ok(1));
        assert!(probe.1.load(std::sync::atomic::Ordering::SeqCst));
    }
}
