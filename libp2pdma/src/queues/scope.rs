//! Scoped submission: a [`Scope`] checks its commands against the
//! namespaces published when it opened, and does not end before every
//! command it submitted has completed.

use std::{
    fmt,
    marker::PhantomData,
    panic::{catch_unwind, resume_unwind, AssertUnwindSafe},
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
    time::Instant,
};

use super::{
    command::{build_io, IoCommand},
    controller::Controller,
    facts::{NamespaceInfo, Snapshot},
    qpair::{AbortOnUnwind, QueuePair, Ticket},
};
use crate::{nvme::Completion, Error, Result};

/// Scope ids: 0 is none.
static NEXT_SCOPE: AtomicU64 = AtomicU64::new(1);

impl Controller {
    /// Runs `f` with a [`Scope`] to submit commands in, and returns once
    /// every command submitted in it has completed (or the controller has
    /// failed and been stopped), whatever became of their [`Pending`]s:
    /// memory borrowed for the scope is never released while the
    /// controller may move data to or from it. Scopes may be shared by
    /// threads (`std::thread::scope` inside) and nested.
    pub fn scope<'env, T>(&'env self, f: impl for<'s> FnOnce(&'s Scope<'s, 'env>) -> T) -> T {
        self.check_events();
        let scope = Scope {
            ctrl: self,
            facts: self.facts.current(),
            id: NEXT_SCOPE.fetch_add(1, Ordering::Relaxed),
            outstanding: AtomicUsize::new(0),
            _scope: PhantomData,
            _env: PhantomData,
        };
        let r = catch_unwind(AssertUnwindSafe(|| f(&scope)));
        scope.end();
        match r {
            Ok(t) => t,
            Err(p) => resume_unwind(p),
        }
    }
}

/// Runs `f` with a scope of each of `ctrls` open (nested, in order), for
/// a thread that drives several controllers at once: it returns once every
/// command submitted in any of them has completed, as each scope does.
pub(super) fn scopes<'env, T>(
    ctrls: &[&'env Controller],
    f: impl FnOnce(&[&dyn Submitter<'env>]) -> T,
) -> T {
    fn nest<'env>(
        ctrls: &[&'env Controller],
        open: &[&dyn Submitter<'env>],
        f: &mut dyn FnMut(&[&dyn Submitter<'env>]),
    ) {
        match ctrls.split_first() {
            None => f(open),
            Some((ctrl, rest)) => ctrl.scope(|s| {
                let mut all: Vec<&dyn Submitter<'env>> = open.to_vec();
                all.push(&s);
                nest(rest, &all, f);
            }),
        }
    }
    let mut f = Some(f);
    let mut out = None;
    nest(ctrls, &[], &mut |open| out = f.take().map(|f| f(open)));
    out.expect("the innermost scope runs once")
}

/// A scope as [`scopes`] hands it out: one of several open at once.
pub(super) trait Submitter<'env> {
    /// Writes `cmd` into I/O queue `queue` if it has room now, without
    /// ringing its doorbell ([`Batch::try_push`]).
    fn push(&self, queue: usize, cmd: &IoCommand<'env>) -> Result<Option<Pending<'_>>>;
    /// Submits `cmd`, waiting for room ([`Scope::submit`]).
    fn submit(&self, queue: usize, cmd: &IoCommand<'env>) -> Result<Pending<'_>>;
    /// Rings I/O queue `queue`'s doorbell for what was pushed.
    fn ring(&self, queue: usize);
}

impl<'s, 'env> Submitter<'env> for &'s Scope<'s, 'env> {
    fn push(&self, queue: usize, cmd: &IoCommand<'env>) -> Result<Option<Pending<'_>>> {
        Scope::try_submit_with(self, queue, cmd, false)
    }

    fn submit(&self, queue: usize, cmd: &IoCommand<'env>) -> Result<Pending<'_>> {
        Scope::submit(self, queue, cmd)
    }

    fn ring(&self, queue: usize) {
        let io = &self.ctrl.io;
        if !io.is_empty() {
            io[queue % io.len()].ring();
        }
    }
}

/// Where commands are submitted: see [`Controller::scope`].
pub struct Scope<'s, 'env: 's> {
    pub(super) ctrl: &'env Controller,
    /// The namespaces its commands are checked against: those published
    /// when it opened.
    pub(super) facts: Snapshot,
    pub(super) id: u64,
    /// Commands submitted and not yet consumed through their `Pending`.
    pub(super) outstanding: AtomicUsize,
    pub(super) _scope: PhantomData<&'s mut &'s ()>,
    pub(super) _env: PhantomData<&'env mut &'env ()>,
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("controller", &self.ctrl.bdf)
            .field("outstanding", &self.outstanding.load(Ordering::Relaxed))
            .finish()
    }
}

impl<'s, 'env> Scope<'s, 'env> {
    /// The controller.
    pub fn controller(&self) -> &'env Controller {
        self.ctrl
    }

    /// Submits `cmd` on I/O queue `queue` (taken modulo the queue count),
    /// waiting for room while the queue is full. A thread that already has
    /// commands in flight uses [`Scope::try_submit`] instead, or it may
    /// wait for room that only its own commands hold.
    pub fn submit(&'s self, queue: usize, cmd: &IoCommand<'env>) -> Result<Pending<'s>> {
        self.submit_with(queue, cmd, Some(Instant::now() + self.ctrl.timeout), true)
    }

    /// Submits `cmd` on I/O queue `queue` if it has room now; `Ok(None)`
    /// when it is full (wait for one of this thread's commands, then try
    /// again).
    pub fn try_submit(
        &'s self,
        queue: usize,
        cmd: &IoCommand<'env>,
    ) -> Result<Option<Pending<'s>>> {
        self.try_submit_with(queue, cmd, true)
    }

    /// Commands for I/O queue `queue` whose doorbell is rung once for all:
    /// see [`Batch`].
    pub fn batch(&'s self, queue: usize) -> Batch<'s, 'env> {
        Batch {
            scope: self,
            queue,
            unrung: 0,
        }
    }

    fn try_submit_with(
        &'s self,
        queue: usize,
        cmd: &IoCommand<'env>,
        ring: bool,
    ) -> Result<Option<Pending<'s>>> {
        match self.submit_with(queue, cmd, None, ring) {
            Ok(p) => Ok(Some(p)),
            Err(Error::Controller { source, .. }) if source == rustix::io::Errno::AGAIN => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn submit_with(
        &'s self,
        queue: usize,
        cmd: &IoCommand<'env>,
        deadline: Option<Instant>,
        ring: bool,
    ) -> Result<Pending<'s>> {
        let ctrl = self.ctrl;
        if ctrl.io.is_empty() {
            return Err(ctrl.failed("no I/O queue".into()));
        }
        let ns = self.namespace(cmd.nsid)?;
        let (raw, prps) = build_io(cmd, ns, ctrl.max_transfer, ctrl.instance())?;
        let q = &ctrl.io[queue % ctrl.io.len()];
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        let t = match q.submit(&raw, prps.as_ref(), (deadline, self.id), ring) {
            Ok(t) => t,
            Err(e) => {
                self.outstanding.fetch_sub(1, Ordering::Relaxed);
                return Err(ctrl.wait_error(e, &format!("{} on queue {}", cmd.name(), q.qid())));
            }
        };
        let bs = ns.map_or(1, |n| u64::from(n.block_size));
        Ok(Pending {
            ctrl,
            outstanding: &self.outstanding,
            q,
            ticket: Some(t),
            what: cmd.name(),
            offset: cmd.slba.saturating_mul(bs),
            len: u64::from(cmd.blocks) * bs,
        })
    }

    /// Namespace `nsid` as the scope knows it (`None`: not active), after
    /// looking for the controller's events. Stale namespaces are read again
    /// first, and a command is refused while that fails; one for a
    /// namespace that changed since the scope opened is refused.
    fn namespace(&self, nsid: u32) -> Result<Option<&NamespaceInfo>> {
        let ctrl = self.ctrl;
        ctrl.check_events();
        let mine = self.facts.get(nsid);
        if ctrl.facts.stale() {
            ctrl.rescan_stale().map_err(|e| {
                Controller::error(
                    &ctrl.bdf,
                    format!("the controller announced a namespace change, and reading the namespaces again failed: {e}"),
                    rustix::io::Errno::STALE,
                )
            })?;
        }
        if ctrl.facts.generation() != self.facts.generation {
            let now = ctrl.facts.current();
            if now.get(nsid) != mine {
                return Err(Controller::error(
                    &ctrl.bdf,
                    format!(
                        "namespace {nsid} changed while this scope was open (then {mine:?}, now {:?}): commands in a new scope use what it is now",
                        now.get(nsid)
                    ),
                    rustix::io::Errno::STALE,
                ));
            }
        }
        Ok(mine)
    }

    /// Waits for every command of the scope that nobody consumed; ends the
    /// process when a failed controller that could not be stopped may still
    /// move the scope's memory.
    pub(super) fn end(&self) {
        // The scope's memory goes back when this returns: a panic on the
        // way must not return there early.
        let _guard = AbortOnUnwind("the end of a submission scope");
        if self.outstanding.load(Ordering::Acquire) > 0 {
            for q in &self.ctrl.io {
                for t in q.unconsumed(self.id) {
                    let _ =
                        self.ctrl
                            .finish(q, t, "a command nobody waited for", self.ctrl.timeout);
                }
            }
        }
        self.ctrl
            .health
            .release_or_abort("the end of a submission scope");
    }
}

/// Where a command went: its I/O queue and its command identifier there,
/// as its completion entry names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CommandId {
    /// The I/O queue's id.
    pub queue: u16,
    /// The command identifier (CID).
    pub cid: u16,
}

/// A command in flight; [`Pending::wait`] for it. Dropping it waits too;
/// forgetting it leaves the wait to the end of its scope.
pub struct Pending<'s> {
    ctrl: &'s Controller,
    /// The scope's count of commands not consumed.
    outstanding: &'s AtomicUsize,
    q: &'s QueuePair,
    ticket: Option<Ticket>,
    what: &'static str,
    /// The command's range in bytes.
    offset: u64,
    len: u64,
}

impl fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("what", &self.what)
            .field("queue", &self.q.qid())
            .finish()
    }
}

impl Pending<'_> {
    /// The command's queue and identifier.
    pub fn id(&self) -> CommandId {
        CommandId {
            queue: self.q.qid(),
            cid: self.ticket.as_ref().map_or(0, |t| t.cid),
        }
    }

    /// Whether the command has completed (or the controller failed), after
    /// looking at the completion queue once: [`Pending::wait`] then returns
    /// without waiting.
    pub fn is_done(&self) -> bool {
        self.ticket.as_ref().is_none_or(|t| self.q.done(t))
    }

    /// Waits for the command; an error status, a timeout (after an abort)
    /// or a failed controller is an error.
    pub fn wait(mut self) -> Result<Completion> {
        self.wait_ref()
    }

    fn wait_ref(&mut self) -> Result<Completion> {
        let Some(t) = self.ticket.take() else {
            return Err(Error::InvalidArgument("waited for twice".into()));
        };
        let r = self.ctrl.finish(self.q, t, self.what, self.ctrl.timeout);
        self.outstanding.fetch_sub(1, Ordering::Release);
        let c = r?;
        if c.sct() == 0 && c.sc() == 0 {
            return Ok(c);
        }
        Err(Error::NvmeStatus {
            op: match self.what {
                "READ" => "NVMe READ (queues path)",
                "WRITE" => "NVMe WRITE (queues path)",
                _ => "NVMe FLUSH (queues path)",
            },
            offset: self.offset,
            len: self.len,
            status: u32::from(c.status),
        })
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.ticket.is_some() {
            let _ = self.wait_ref();
        }
    }
}

/// Commands written into one I/O queue whose doorbell is rung once for all
/// of them ([`Batch::ring`], or on drop): fewer doorbell writes, each a
/// posted write to the controller. Waiting for one of them rings first, so
/// nothing written waits for a doorbell that never comes.
pub struct Batch<'s, 'env> {
    scope: &'s Scope<'s, 'env>,
    queue: usize,
    unrung: usize,
}

impl fmt::Debug for Batch<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("queue", &self.queue)
            .field("unrung", &self.unrung)
            .finish()
    }
}

impl<'s, 'env> Batch<'s, 'env> {
    /// Writes `cmd` into the queue if it has room now; `Ok(None)` when it
    /// is full (as [`Scope::try_submit`]).
    pub fn try_push(&mut self, cmd: &IoCommand<'env>) -> Result<Option<Pending<'s>>> {
        let p = self.scope.try_submit_with(self.queue, cmd, false)?;
        self.unrung += usize::from(p.is_some());
        Ok(p)
    }

    /// Rings the doorbell for everything written so far.
    pub fn ring(&mut self) {
        let io = &self.scope.ctrl.io;
        if self.unrung > 0 && !io.is_empty() {
            io[self.queue % io.len()].ring();
        }
        self.unrung = 0;
    }
}

impl Drop for Batch<'_, '_> {
    fn drop(&mut self) {
        self.ring();
    }
}
