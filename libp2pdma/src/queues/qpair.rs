//! One submission and completion queue pair in accelerator memory, shared
//! by many submitting threads.
//!
//! The algorithm is the one accelerator threads run in BaM and in the
//! accelerator-direct design, written so that it needs nothing a GPU thread
//! lacks (atomics, loads and stores, a fence):
//!
//! - **Command ids are the credits.** A submitter first claims a free
//!   command id by compare-and-swap. There are `entries - 1` of them, so at
//!   most `entries - 1` commands are ever claimed and not yet consumed: the
//!   submission queue never looks empty when full, and the completion queue
//!   cannot overflow. An id is freed by the thread that consumes its
//!   completion, never earlier, so a completion always finds its request.
//! - **Atomic slot claim.** With an id, the submitter takes the next queue
//!   position with `fetch_add` and writes its 64-byte entry into slot
//!   `position % entries`. That slot's previous command has been fetched by
//!   the controller: at most `entries - 2` of the `entries` positions before
//!   this one hold ids, a released one was completed, and the controller
//!   fetches in order.
//! - **Doorbell batching.** The writer marks its slot ready (the position,
//!   plus one) and tries to become the ringer: the ringer advances over every
//!   consecutive ready slot and writes the tail doorbell once for all of
//!   them. A writer that finds a ringer at work leaves its entry to it; the
//!   ringer looks again after letting go, so no entry is stranded (the
//!   marks, the ringer flag and the second look are sequentially
//!   consistent).
//! - **Completion polling by whoever waits.** A waiting thread checks its
//!   id's state; if the completion has not been seen, it tries to become the
//!   queue's poller, reads every new entry whose phase tag matches, files
//!   each under its command id, advances the head (flipping the expected
//!   phase at the wrap) and writes the head doorbell once.
//! - **Sleeping on the interrupt (host threads).** Where the completion
//!   queue raises an MSI-X vector (VFIO signals an eventfd), the poller
//!   spins a little, then sleeps in one blocking read of the eventfd, which
//!   returns at once for an interrupt that came since the last read and
//!   clears it: one system call per sleep. A watchdog thread (one for the
//!   process) writes the eventfd of a poller whose deadline or longest
//!   sleep has come. The other waiters sleep until the poller files
//!   completions. An accelerator thread keeps polling instead.
//!
//! A completion for an id that is not in flight, or a controller that stops
//! answering, fails the whole controller (see [`Health`]): it is disabled,
//! which ends its DMA, and every waiter gets an error.
#![allow(unsafe_code)]

use std::{
    fmt,
    os::fd::OwnedFd,
    ptr,
    sync::{
        atomic::{fence, AtomicBool, AtomicIsize, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
    time::{Duration, Instant},
};

use super::registers;
use crate::{
    nvme::{self, Command, Completion, PAGE},
    sys::vfio::{Bar, Device},
};

/// Command id states.
const FREE: u32 = 0;
const IN_FLIGHT: u32 = 1;
const DONE: u32 = 2;

/// Polls of an empty completion queue before its poller sleeps on the
/// interrupt.
const SPIN_POLLS: u32 = 32;
/// The longest sleep before a waiter looks again without being woken (a
/// controller failed by another queue raises no interrupt here).
const SLEEP_MAX: Duration = Duration::from_millis(20);
/// How often the watchdog looks for sleepers whose time has come.
const WATCH_TICK: Duration = Duration::from_millis(5);

/// A queue's poller asleep in a blocking read of the queue's eventfd, and
/// when the watchdog is to wake it.
pub(crate) struct Sleeper {
    fd: Arc<OwnedFd>,
    /// Nanoseconds after [`EPOCH`] when to write the eventfd; 0: awake.
    wake_at: AtomicU64,
}

/// The sleepers the watchdog thread looks after.
static WATCHED: Mutex<Vec<std::sync::Weak<Sleeper>>> = Mutex::new(Vec::new());
/// Whether the watchdog thread runs.
static WATCHDOG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Looks after `s` from now on, starting the watchdog thread if it does
/// not run yet; `false` when it cannot be started (then pollers sleep with
/// a time limit instead).
fn watch(s: &Arc<Sleeper>) -> bool {
    let running = *WATCHDOG.get_or_init(|| {
        thread::Builder::new()
            .name("p2pdma-watchdog".into())
            .spawn(|| loop {
                thread::sleep(WATCH_TICK);
                let now = now_ns();
                let mut list = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
                list.retain(|w| w.strong_count() > 0);
                for s in list.iter().filter_map(std::sync::Weak::upgrade) {
                    let at = s.wake_at.load(Ordering::Acquire);
                    if at != 0
                        && now >= at
                        && s.wake_at
                            .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                    {
                        let _ = rustix::io::write(&*s.fd, &1u64.to_ne_bytes());
                    }
                }
            })
            .is_ok()
    });
    if running {
        WATCHED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(s));
    }
    running
}

/// PRP entries in one list page.
pub(crate) const LIST_ENTRIES: usize = PAGE / 8;

/// How a failed controller is stopped: `CC.EN = 0` (waiting for
/// `CSTS.RDY = 0`); where that fails, bus mastering off, then a reset
/// through VFIO.
pub(crate) struct Stopper {
    pub(crate) bar: Arc<Bar>,
    pub(crate) ready_timeout: Duration,
    pub(crate) device: Option<Arc<Device>>,
}

impl Stopper {
    /// Stops the controller's DMA; what was done, and whether it stopped.
    pub(crate) fn stop(&self) -> (String, bool) {
        let disabled = match registers::disable(&self.bar, self.ready_timeout) {
            Ok(()) => return ("the controller was disabled".into(), true),
            Err(e) => e,
        };
        let Some(dev) = &self.device else {
            return (
                format!("disabling the controller failed ({disabled}), and there is no other way to stop it"),
                false,
            );
        };
        let master = dev.stop_bus_master();
        let reset = dev.reset();
        let said = format!(
            "disabling the controller failed ({disabled}); bus mastering off: {}; reset: {}",
            master.as_ref().map_or_else(|e| e.as_str(), |()| "done"),
            reset.as_ref().map_or_else(|e| e.as_str(), |()| "done"),
        );
        (said, master.is_ok() || reset.is_ok())
    }
}

/// The controller's health, shared by its queues: once failed, it stays
/// failed, with the first reason, and stopped if any way of stopping it
/// worked. Memory a failed controller may still write is released only
/// once it is stopped.
pub(crate) struct Health {
    stopper: Stopper,
    failed: AtomicBool,
    stopped: AtomicBool,
    reason: Mutex<Option<String>>,
    /// Why new commands are refused while the controller is drained
    /// before it is stopped (a revocation), if they are.
    closing: Mutex<Option<String>>,
    /// Commands on I/O queues that the controller has not completed.
    at_controller: AtomicIsize,
}

impl Health {
    pub(crate) fn new(stopper: Stopper) -> Self {
        Self {
            stopper,
            failed: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            reason: Mutex::new(None),
            closing: Mutex::new(None),
            at_controller: AtomicIsize::new(0),
        }
    }

    /// Refuses new commands for `why` from now on, and waits up to `limit`
    /// for the commands the controller has on its I/O queues to complete
    /// (their waiters take the completions): a controller stopped
    /// afterwards aborts nothing. Whether they all completed.
    pub(crate) fn drain(&self, why: &str, limit: Duration) -> bool {
        self.closing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| why.to_string());
        let deadline = Instant::now() + limit;
        loop {
            if self.at_controller.load(Ordering::SeqCst) <= 0 {
                return true;
            }
            if Instant::now() >= deadline || self.failure().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Why new commands are refused: the failure, or a drain under way.
    fn refusal(&self) -> Option<String> {
        self.failure().or_else(|| {
            self.closing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
    }

    /// Why the controller failed, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the controller, failed, was stopped: none of its commands
    /// moves data any more.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Fails the controller: stops it first (see [`Stopper::stop`]), then
    /// records `reason` unless an earlier failure did.
    pub(crate) fn fail(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            let (said, stopped) = self.stopper.stop();
            self.stopped.store(stopped, Ordering::Release);
            *r = Some(format!("{reason}; {said}"));
        }
        self.failed.store(true, Ordering::Release);
    }

    /// Stops the controller (at the end of its life) unless a failure did:
    /// whether it is stopped.
    pub(crate) fn stop(&self) -> bool {
        let _r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if self.failed.load(Ordering::Acquire) {
            return self.stopped();
        }
        let (_, stopped) = self.stopper.stop();
        self.stopped.store(stopped, Ordering::Release);
        stopped
    }

    /// Hands `given` (memory the controller was pointed at) back with
    /// `release` once the controller is stopped; keeps it until the process
    /// ends if nothing stops it. Whether it was released.
    pub(crate) fn release_when_stopped<T>(&self, given: T, release: impl FnOnce(T)) -> bool {
        if self.stop() {
            release(given);
            true
        } else {
            std::mem::forget(given);
            false
        }
    }

    /// Ends the process when the controller failed and could not be
    /// stopped: memory its commands may still write is about to go back to
    /// its owner, and only the process's death (vfio-pci resets the device
    /// before the module frees the memory) keeps the DMA inside it.
    pub(crate) fn release_or_abort(&self, what: &str) {
        if self.failed.load(Ordering::Acquire) && !self.stopped() {
            abort(format_args!(
                "p2pdma: {what}: a failed NVMe controller could not be stopped ({}); ending the process so that it writes no released memory",
                self.failure().unwrap_or_default()
            ));
        }
    }
}

/// Says why on standard error, as far as it can, and ends the process. It
/// cannot unwind: a write error (standard error closed, a dead pipe) is
/// ignored, where `eprintln!` would panic, and unwinding back to the caller
/// would let it release memory a controller may still write.
pub(crate) fn abort(why: std::fmt::Arguments<'_>) -> ! {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{why}");
    std::process::abort()
}

/// Ends the process if it is dropped while the thread unwinds: held where
/// code must finish before memory a controller was given goes back (the
/// end of a submission scope).
pub(crate) struct AbortOnUnwind(pub(crate) &'static str);

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            abort(format_args!(
                "p2pdma: a panic in {}: commands may still move the memory it guards; ending the process",
                self.0
            ));
        }
    }
}

/// Where a queue pair lives: CPU pointers into the accelerator memory's
/// write-combined mapping and the controller's bus addresses of the same
/// bytes, each region page aligned and contiguous for the controller.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    pub(crate) cpu: *mut u8,
    pub(crate) bus: u64,
}

/// A command id's record.
struct Slot {
    state: AtomicU32,
    /// The scope its command was submitted in (0: none).
    scope: AtomicU64,
    /// Dword 0 of the completion.
    result: AtomicU32,
    /// The completion's status field.
    status: AtomicU32,
}

/// A queue pair shared by many submitters.
pub(crate) struct QueuePair {
    qid: u16,
    entries: u32,
    sq: Place,
    cq: Place,
    /// One PRP list page per command id.
    lists: Place,
    bar: Arc<Bar>,
    sq_doorbell: usize,
    cq_doorbell: usize,
    slots: Box<[Slot]>,
    /// Where the next id search starts.
    hint: AtomicUsize,
    /// The next queue position to claim.
    tail: AtomicU64,
    /// Per submission slot: the position written there, plus one.
    ready: Box<[AtomicU64]>,
    /// Whether a thread is ringing the doorbell.
    ringing: AtomicBool,
    /// Positions the doorbell has been rung for (changed by the ringer only).
    rung: AtomicU64,
    /// The completion queue's head and expected phase; held by the poller.
    cq_state: Mutex<(u32, bool)>,
    /// The eventfd the completion queue's interrupt signals, if it has one.
    irq: Option<Arc<OwnedFd>>,
    /// The poller's blocking sleep on it, where the watchdog runs.
    sleeper: Option<Arc<Sleeper>>,
    /// Whether the poller is asleep on the interrupt.
    poller_asleep: AtomicBool,
    /// The longest sleep without a wake-up.
    sleep_max: Duration,
    /// Waiters asleep until the poller files completions, and what wakes
    /// them: a count bumped after each filing.
    sleepers: AtomicUsize,
    filed: Mutex<u64>,
    filed_cv: Condvar,
    health: Arc<Health>,
    /// Doorbell writes of the submission queue, and commands submitted.
    pub(crate) doorbells: AtomicU64,
    pub(crate) submitted: AtomicU64,
    /// Sleeps on the interrupt, and sleeps (on it or until the poller
    /// filed completions) that ended without a wake-up.
    pub(crate) sleeps: AtomicU64,
    pub(crate) sleeps_unwoken: AtomicU64,
}

// SAFETY: The raw pointers name the accelerator memory's mapping, which the
// controller keeps alive for the queue pair's whole life, and every access
// through them is a volatile access to a region that only one thread writes
// at a time (a submission slot by the thread that claimed its position, a
// PRP list page by its command id's holder) or that only the CPU reads
// (completion entries, under the poller lock).
unsafe impl Send for QueuePair {}
// SAFETY: As for `Send`.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qid", &self.qid)
            .field("entries", &self.entries)
            .finish()
    }
}

/// A submitted command: wait for it with [`QueuePair::wait`].
#[derive(Debug)]
#[must_use = "a submitted command's id is only freed when it is waited for"]
pub(crate) struct Ticket {
    pub(crate) cid: u16,
}

/// Why a wait ended without a completion.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// The deadline passed; the command is still in flight, its id held.
    Timeout,
    /// No command id was free (a submission that was not to wait).
    Full,
    /// The controller failed; the command's id was freed.
    Failed(String),
}

impl QueuePair {
    /// Queue pair `qid` of `entries` entries (2 to 4096) at `sq`, `cq` and
    /// `lists` (`entries - 1` PRP list pages), whose memory the caller keeps
    /// mapped and zeroed completion entries in. `stride` is the doorbell
    /// stride.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qid: u16,
        entries: u16,
        (sq, cq, lists): (Place, Place, Place),
        bar: Arc<Bar>,
        stride: usize,
        health: Arc<Health>,
        irq: Option<Arc<OwnedFd>>,
    ) -> Self {
        let entries = u32::from(entries.max(2));
        let sleeper = irq.as_ref().and_then(|fd| {
            let s = Arc::new(Sleeper {
                fd: fd.clone(),
                wake_at: AtomicU64::new(0),
            });
            watch(&s).then_some(s)
        });
        Self {
            qid,
            entries,
            sq,
            cq,
            lists,
            bar,
            sq_doorbell: nvme::doorbell(qid, false, stride),
            cq_doorbell: nvme::doorbell(qid, true, stride),
            slots: (0..entries - 1)
                .map(|_| Slot {
                    state: AtomicU32::new(FREE),
                    scope: AtomicU64::new(0),
                    result: AtomicU32::new(0),
                    status: AtomicU32::new(0),
                })
                .collect(),
            hint: AtomicUsize::new(0),
            tail: AtomicU64::new(0),
            ready: (0..entries).map(|_| AtomicU64::new(0)).collect(),
            ringing: AtomicBool::new(false),
            rung: AtomicU64::new(0),
            cq_state: Mutex::new((0, true)),
            irq,
            sleeper,
            poller_asleep: AtomicBool::new(false),
            sleep_max: SLEEP_MAX,
            sleepers: AtomicUsize::new(0),
            filed: Mutex::new(0),
            filed_cv: Condvar::new(),
            health,
            doorbells: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
            sleeps_unwoken: AtomicU64::new(0),
        }
    }

    /// The queue id.
    pub(crate) fn qid(&self) -> u16 {
        self.qid
    }

    /// Entries of each queue.
    pub(crate) fn entries(&self) -> u16 {
        self.entries as u16
    }

    /// The bus addresses of the submission and completion queues.
    pub(crate) fn bus(&self) -> (u64, u64) {
        (self.sq.bus, self.cq.bus)
    }

    /// Commands that can be in flight at once.
    pub(crate) fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Submits `cmd` with data pointer `data` (PRP1 and the following page
    /// addresses; a list is written to the command id's list page when more
    /// than one follows). Waits for a free command id, reaping completions
    /// meanwhile, up to `deadline`; without one, returns
    /// [`WaitError::Full`] at once when every id is taken. Rings the
    /// doorbell when `ring`; otherwise a later [`QueuePair::ring`] (or any
    /// other submitter's, or a wait) rings for it.
    ///
    /// A thread that holds tickets must not wait here for an id: the ids
    /// may all be held by completed commands that threads waiting here
    /// would consume. It submits without a deadline and, when the queue is
    /// full, waits for its own oldest command first.
    pub(crate) fn submit(
        &self,
        cmd: &Command,
        data: Option<&nvme::DataPtr>,
        (deadline, scope): (Option<Instant>, u64),
        ring: bool,
    ) -> Result<Ticket, WaitError> {
        if data.is_some_and(|d| d.pages.len() > LIST_ENTRIES) {
            return Err(WaitError::Failed(format!(
                "{} PRP entries do not fit one list page",
                data.map_or(0, |d| d.pages.len())
            )));
        }
        let cid = self.claim(deadline)?;
        self.slots[usize::from(cid)]
            .scope
            .store(scope, Ordering::Relaxed);
        let mut cmd = *cmd;
        if let Some(d) = data {
            cmd.prp1 = d.prp1;
            cmd.prp2 = match d.pages.len() {
                0 => 0,
                1 => d.pages[0],
                _ => {
                    let page = self.list_page(cid);
                    for (i, a) in d.pages.iter().enumerate() {
                        // SAFETY: The id's own list page, `LIST_ENTRIES`
                        // u64s (checked above), written only by its holder.
                        unsafe { ptr::write_volatile(page.cpu.cast::<u64>().add(i), a.to_le()) };
                    }
                    page.bus
                }
            };
        }
        let pos = self.tail.fetch_add(1, Ordering::Relaxed);
        let slot = (pos % u64::from(self.entries)) as usize;
        let entry = cmd.encode(cid);
        // SAFETY: Slot `slot` of the submission queue (64 bytes inside its
        // `entries * 64`), which the position claimed gives this thread
        // alone (see the module's comment).
        unsafe {
            let dst = self.sq.cpu.add(64 * slot).cast::<u64>();
            for (i, w) in entry.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes(w.try_into().unwrap_or_default());
                ptr::write_volatile(dst.add(i), v.to_le());
            }
        }
        // The entry's write-combined stores (and the PRP list's) are
        // visible to the controller before the entry is marked ready: the
        // thread that rings the doorbell for it may run on another core.
        crate::sys::wc::store_fence();
        self.ready[slot].store(pos + 1, Ordering::SeqCst);
        self.submitted.fetch_add(1, Ordering::Relaxed);
        if ring {
            self.ring();
        }
        Ok(Ticket { cid })
    }

    fn list_page(&self, cid: u16) -> Place {
        let off = usize::from(cid) * PAGE;
        Place {
            // SAFETY: `entries - 1` list pages follow `lists`; `cid` is
            // below that.
            cpu: unsafe { self.lists.cpu.add(off) },
            bus: self.lists.bus + off as u64,
        }
    }

    /// Claims a free command id, reaping completions while none is free.
    fn claim(&self, deadline: Option<Instant>) -> Result<u16, WaitError> {
        let n = self.slots.len();
        let mut spins = 0u32;
        loop {
            if let Some(why) = self.health.refusal() {
                return Err(WaitError::Failed(why));
            }
            let start = self.hint.load(Ordering::Relaxed);
            for k in 0..n {
                let i = (start + k) % n;
                if self.slots[i]
                    .state
                    .compare_exchange(FREE, IN_FLIGHT, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    self.hint.store((i + 1) % n, Ordering::Relaxed);
                    if self.qid != 0 {
                        // Counted before the refusal is looked at again: a
                        // drain either sees this command or refuses it.
                        self.health.at_controller.fetch_add(1, Ordering::SeqCst);
                        if let Some(why) = self.health.refusal() {
                            self.health.at_controller.fetch_sub(1, Ordering::SeqCst);
                            Self::free(&self.slots[i]);
                            return Err(WaitError::Failed(why));
                        }
                    }
                    return Ok(i as u16);
                }
            }
            if self.poll() > 0 {
                continue;
            }
            match deadline {
                None if spins > 0 => return Err(WaitError::Full),
                Some(d) if Instant::now() >= d => return Err(WaitError::Timeout),
                _ => {}
            }
            backoff(&mut spins);
        }
    }

    /// Writes the tail doorbell for every consecutive ready entry, unless
    /// another thread is doing it (which then sees this thread's entry).
    pub(crate) fn ring(&self) {
        let entries = u64::from(self.entries);
        loop {
            if self.ringing.swap(true, Ordering::SeqCst) {
                return;
            }
            let rung = self.rung.load(Ordering::Relaxed);
            let mut n = rung;
            while self.ready[(n % entries) as usize].load(Ordering::SeqCst) == n + 1 {
                n += 1;
            }
            if n != rung {
                // Every entry's bytes, written through the write-combining
                // mapping and fenced by their writers, reach memory before
                // the doorbell.
                fence(Ordering::SeqCst);
                crate::sys::wc::store_fence();
                let _ = self.bar.write32(self.sq_doorbell, (n % entries) as u32);
                self.rung.store(n, Ordering::Relaxed);
                self.doorbells.fetch_add(1, Ordering::Relaxed);
            }
            self.ringing.store(false, Ordering::SeqCst);
            // An entry marked ready while this thread was ringing, by a
            // thread that found the flag set, is rung now.
            if self.ready[(n % entries) as usize].load(Ordering::SeqCst) != n + 1 {
                return;
            }
        }
    }

    /// Rings for entries written without a doorbell, if there are any
    /// (one load when there are none).
    fn ring_unrung(&self) {
        let rung = self.rung.load(Ordering::Relaxed);
        let next = &self.ready[(rung % u64::from(self.entries)) as usize];
        if next.load(Ordering::SeqCst) == rung + 1 {
            self.ring();
        }
    }

    /// Reaps new completions if no other thread is doing it. Returns how
    /// many it filed.
    pub(crate) fn poll(&self) -> usize {
        let Ok(mut st) = self.cq_state.try_lock() else {
            return 0;
        };
        let n = self.reap(&mut st);
        drop(st);
        self.filed(n);
        n
    }

    /// Wakes the waiters asleep until completions are filed, if `n` were
    /// or the controller failed.
    fn filed(&self, n: usize) {
        if n > 0 || self.health.failure().is_some() {
            self.wake_sleepers();
        }
    }

    /// Wakes the waiters asleep until completions are filed, if any.
    fn wake_sleepers(&self) {
        // Against a sleeper's count-then-look (see `sleep_until_filed`).
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let mut f = self.filed.lock().unwrap_or_else(|p| p.into_inner());
            *f = f.wrapping_add(1);
            drop(f);
            self.filed_cv.notify_all();
        }
    }

    /// Reads every new completion entry under the poller lock `st`, files
    /// it under its command id, and writes the head doorbell once.
    fn reap(&self, st: &mut MutexGuard<'_, (u32, bool)>) -> usize {
        let (mut head, mut phase) = **st;
        let mut reaped = 0;
        loop {
            // SAFETY: Entry `head` (16 bytes inside `entries * 16`) of the
            // completion queue, read under the poller lock; dword 3 first.
            let dw3 = unsafe {
                ptr::read_volatile(self.cq.cpu.add(16 * head as usize + 12).cast::<u32>())
            };
            if (u32::from_le(dw3) >> 16 & 1 == 1) != phase {
                break;
            }
            // The rest of the entry was written no later than its phase tag.
            fence(Ordering::SeqCst);
            let mut raw = [0u8; 16];
            for (i, w) in raw.chunks_exact_mut(4).enumerate() {
                // SAFETY: As above, dword `i` of the entry.
                let v = unsafe {
                    ptr::read_volatile(self.cq.cpu.add(16 * head as usize + 4 * i).cast::<u32>())
                };
                w.copy_from_slice(&u32::from_le(v).to_le_bytes());
            }
            let c = Completion::decode(&raw);
            let slot = self.slots.get(usize::from(c.cid));
            match slot {
                Some(s) if c.sqid == self.qid && s.state.load(Ordering::Acquire) == IN_FLIGHT => {
                    s.result.store(c.result, Ordering::Relaxed);
                    s.status.store(u32::from(c.status), Ordering::Relaxed);
                    s.state.store(DONE, Ordering::Release);
                    if self.qid != 0 {
                        self.health.at_controller.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                _ => {
                    **st = (head, phase);
                    self.health.fail(format!(
                        "queue {} got a completion for command id {} of queue {}, which is not in flight",
                        self.qid, c.cid, c.sqid
                    ));
                    return reaped;
                }
            }
            head += 1;
            if head == self.entries {
                head = 0;
                phase = !phase;
            }
            reaped += 1;
        }
        if reaped > 0 {
            let _ = self.bar.write32(self.cq_doorbell, head);
        }
        **st = (head, phase);
        reaped
    }

    /// Waits until `deadline` for `t`'s completion and frees its id.
    /// [`WaitError::Timeout`] keeps the id: the command may still complete,
    /// and may be waited for again.
    pub(crate) fn wait(&self, t: &Ticket, deadline: Instant) -> Result<Completion, WaitError> {
        // Entries written without a doorbell (a batch) are rung first.
        self.ring_unrung();
        let s = &self.slots[usize::from(t.cid)];
        let mut spins = 0u32;
        loop {
            if s.state.load(Ordering::Acquire) == DONE {
                let c = Completion {
                    result: s.result.load(Ordering::Relaxed),
                    status: s.status.load(Ordering::Relaxed) as u16,
                    cid: t.cid,
                    sqid: self.qid,
                    ..Default::default()
                };
                Self::free(s);
                return Ok(c);
            }
            if let Some(why) = self.health.failure() {
                // Stopped, nothing completes or writes memory any more, and
                // the id is free; otherwise the id stays taken for good.
                if self.health.stopped() {
                    Self::free(s);
                }
                return Err(WaitError::Failed(why));
            }
            if Instant::now() >= deadline {
                // Another waiter may have counted on this one to poll.
                self.wake_sleepers();
                return Err(WaitError::Timeout);
            }
            let Some(irq) = &self.irq else {
                if self.poll() == 0 {
                    backoff(&mut spins);
                }
                continue;
            };
            let Ok(mut st) = self.cq_state.try_lock() else {
                if self.poller_asleep.load(Ordering::Acquire) {
                    self.sleep_until_filed(s, deadline);
                } else {
                    backoff(&mut spins);
                }
                continue;
            };
            let mut n = self.reap(&mut st);
            if n == 0 && spins >= SPIN_POLLS {
                self.poller_asleep.store(true, Ordering::Release);
                self.sleeps.fetch_add(1, Ordering::Relaxed);
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .min(self.sleep_max);
                let woken = match &self.sleeper {
                    Some(sl) => {
                        // An interrupt since the last read (for entries the
                        // look above may have missed) returns it at once.
                        let at = now_ns().saturating_add(left.as_nanos() as u64).max(1);
                        sl.wake_at.store(at, Ordering::Release);
                        let mut count = [0u8; 8];
                        let read = rustix::io::read(&*sl.fd, &mut count);
                        // Zero: the watchdog took the time and woke it.
                        let poked = sl.wake_at.swap(0, Ordering::AcqRel) == 0;
                        read.is_ok() && !poked
                    }
                    None => sleep_on(irq, left),
                };
                if !woken {
                    self.sleeps_unwoken.fetch_add(1, Ordering::Relaxed);
                }
                self.poller_asleep.store(false, Ordering::Release);
                n = self.reap(&mut st);
            }
            drop(st);
            self.filed(n);
            if n == 0 {
                spins += 1;
                std::hint::spin_loop();
            }
        }
    }

    /// Whether `t` has completed (polling once); [`QueuePair::wait`] still
    /// frees its id.
    pub(crate) fn done(&self, t: &Ticket) -> bool {
        let s = &self.slots[usize::from(t.cid)];
        if s.state.load(Ordering::Acquire) != DONE {
            self.ring_unrung();
            self.poll();
        }
        s.state.load(Ordering::Acquire) == DONE || self.health.failure().is_some()
    }

    /// Sleeps until the poller files completions (or a while passes), unless
    /// `s` is done already.
    fn sleep_until_filed(&self, s: &Slot, deadline: Instant) {
        let f = self.filed.lock().unwrap_or_else(|p| p.into_inner());
        let seen = *f;
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Against the poller's file-then-count (see `filed`).
        fence(Ordering::SeqCst);
        if s.state.load(Ordering::Acquire) != DONE && self.health.failure().is_none() {
            let most = deadline
                .saturating_duration_since(Instant::now())
                .min(self.sleep_max);
            let t0 = Instant::now();
            let (f, _) = self
                .filed_cv
                .wait_timeout_while(f, most, |f| *f == seen)
                .unwrap_or_else(|p| p.into_inner());
            drop(f);
            // Slept the whole time: no notification woke it, whatever the
            // count says by then.
            if t0.elapsed() >= most {
                self.sleeps_unwoken.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Frees `t`'s id without a completion: only once the controller is
    /// failed and stopped, when nothing can complete it any more.
    pub(crate) fn forget(&self, t: Ticket) {
        if self.health.failure().is_some() && self.health.stopped() {
            Self::free(&self.slots[usize::from(t.cid)]);
        }
    }

    /// Frees an id whose command has ended.
    fn free(s: &Slot) {
        // The scope tag goes first: a scope looking for its own ids never
        // takes one claimed again by another.
        s.scope.store(0, Ordering::Relaxed);
        s.state.store(FREE, Ordering::Release);
    }

    /// The ids of commands submitted in scope `scope` whose completions
    /// nobody consumed.
    pub(crate) fn unconsumed(&self, scope: u64) -> Vec<Ticket> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.scope.load(Ordering::Acquire) == scope && s.state.load(Ordering::Acquire) != FREE
            })
            .map(|(i, _)| Ticket { cid: i as u16 })
            .collect()
    }
}

/// Without the watchdog: sleeps until the eventfd `irq` is signalled or
/// `left` passes, and clears it if it was signalled; whether it was.
fn sleep_on(irq: &OwnedFd, left: Duration) -> bool {
    let ts = rustix::event::Timespec {
        tv_sec: left.as_secs() as _,
        tv_nsec: left.subsec_nanos() as _,
    };
    let mut fds = [rustix::event::PollFd::new(
        irq,
        rustix::event::PollFlags::IN,
    )];
    let signalled = rustix::event::poll(&mut fds, Some(&ts)).is_ok_and(|n| n > 0);
    if signalled {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(irq, &mut count);
    }
    signalled
}

/// Spins a little, then yields: a waiter shares the CPU with the
/// submitters it waits for.
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else if *spins < 256 {
        thread::yield_now();
    } else {
        thread::sleep(Duration::from_micros(20));
    }
}

#[cfg(test)]
mod tests;
