//! A namespace of a controller this process drives ([`Controller`]), for
//! transfers between it and memory with no system call per I/O: the
//! transfer engine's queues path.
//!
//! The block-aligned middle of a transfer moves by DMA straight between the
//! namespace and the memory: accelerator memory mapped for the controller
//! with `DMA_MAP`, host memory with `PIN_USER`, once per transfer. It is
//! cut into commands of at most the controller's largest transfer, spread
//! over the I/O queues in turn, many in flight. What cannot be addressed
//! that way goes through host staging buffers pinned once for the
//! controller (`PIN_USER`): partial blocks at either end (a write reads the
//! block, changes its bytes and writes it back, under a lock for that
//! block, so that two writes to different bytes of one block both land),
//! and a middle whose memory address is not dword aligned (PRP1 must be).
//!
//! A transfer moves every byte or returns an error: every command's status
//! is checked, and an error is returned only after every command of the
//! transfer has completed or the controller has been disabled, so no DMA
//! into the memory outlives the call.

use std::{
    collections::VecDeque,
    fmt,
    sync::{Arc, Mutex},
};

use super::{
    command::IoCommand,
    controller::{Controller, NamespaceInfo},
    mapped::Mapped,
    scope::{CommandId, Pending},
};
use crate::{
    memory::{copy, peer::PeerAccess, DeviceMemory, DmaMemory, HostMemory, MemRange},
    Error, Result,
};

fn round_down(x: u64, a: u64) -> u64 {
    x - x % a
}

/// Bytes of each pinned staging buffer.
const STAGING: usize = 256 << 10;
/// Staging buffers kept per namespace.
const STAGING_KEPT: usize = 4;
/// Commands of one transfer in flight at once.
const WINDOW: usize = 64;
/// Locks that partial-block writes take, by block number.
const EDGE_LOCKS: usize = 64;

/// Host memory pinned and DMA-mapped for a controller, for as long as the
/// mapping lives.
struct Staging {
    host: Arc<HostMemory>,
    mapped: Mapped<'static>,
}

/// Cuts `len` bytes of whole `bs`-byte blocks into commands of at most
/// `max` bytes (whole blocks, at least one): each command's offset in the
/// range and its bytes.
pub(crate) fn cut(len: usize, bs: u64, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = round_down(max as u64, bs).max(bs) as usize;
    (0..len.div_ceil(chunk)).map(move |i| (i * chunk, chunk.min(len - i * chunk)))
}

/// The commands a transfer submitted, in order, as it submits them: see
/// [`Namespace::read_issuing`].
#[derive(Debug, Default)]
pub struct Issued(Mutex<Vec<CommandId>>);

impl Issued {
    fn push(&self, id: CommandId) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(id);
    }

    /// The commands submitted so far.
    pub fn ids(&self) -> Vec<CommandId> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A namespace of a controller this process drives, for transfers on the
/// queues path.
pub struct Namespace {
    ctrl: Arc<Controller>,
    module: Arc<crate::Module>,
    info: NamespaceInfo,
    staging: Mutex<Vec<Staging>>,
    edges: Vec<Mutex<()>>,
    /// Memory registered for transfers: mapped for the controller once,
    /// kept until unregistered.
    registered: Mutex<Vec<Registered>>,
}

/// Memory mapped for the controller for as long as it is registered; the
/// mapping owns the memory, so its address is not reused meanwhile.
struct Registered {
    /// The memory's CPU address and length, which name it (for memory the
    /// CPU does not map, a dma-buf's: the memory object's own address).
    key: (usize, usize),
    mapped: Arc<Mapped<'static>>,
}

fn key_of(mem: &dyn DeviceMemory) -> Option<(usize, usize)> {
    let dma = mem.dma()?;
    match dma.dma_target() {
        Some(t) => Some((t.ptr as usize, t.len)),
        None => dma
            .dmabuf()
            .map(|_| (dma as *const dyn DmaMemory as *const () as usize, dma.len())),
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Namespace")
            .field("controller", &self.ctrl.pci())
            .field("nsid", &self.info.nsid)
            .finish()
    }
}

impl Namespace {
    /// Namespace `nsid` of `ctrl`; `module` pins the staging buffers.
    pub fn new(ctrl: Arc<Controller>, module: Arc<crate::Module>, nsid: u32) -> Result<Self> {
        let info = ctrl.namespace_info(nsid).ok_or_else(|| {
            Error::InvalidArgument(format!("no active namespace {nsid} on {}", ctrl.pci()))
        })?;
        if info.metadata != 0 {
            return Err(Error::PathUnavailable {
                path: "queues",
                reason: format!(
                    "namespace {nsid} has {} bytes of metadata per block, which the queues path does not transfer",
                    info.metadata
                ),
            });
        }
        if !info.block_size.is_power_of_two() || info.block_size as usize > STAGING {
            return Err(Error::InvalidArgument(format!(
                "namespace {nsid}: {}-byte blocks",
                info.block_size
            )));
        }
        Ok(Self {
            ctrl,
            module,
            info,
            staging: Mutex::new(Vec::new()),
            edges: (0..EDGE_LOCKS).map(|_| Mutex::new(())).collect(),
            registered: Mutex::new(Vec::new()),
        })
    }

    /// Registers `mem` for transfers, as `cuFileBufRegister` does: it is
    /// mapped for the controller once (accelerator memory by `DMA_MAP`,
    /// host memory by `PIN_USER`) and later transfers to and from it use
    /// that mapping instead of mapping it each time. Kept (with the memory)
    /// until [`Namespace::unregister`] or the namespace's end.
    pub fn register(&self, mem: Arc<dyn DeviceMemory>) -> Result<()> {
        let key = key_of(mem.as_ref()).ok_or_else(|| Error::PathUnavailable {
            path: "queues",
            reason: format!("{} has no mapping to register", mem.kind()),
        })?;
        let mapped = Arc::new(self.ctrl.map_owned(mem, PeerAccess::ReadWrite)?);
        let mut r = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|x| x.key != key);
        r.push(Registered { key, mapped });
        Ok(())
    }

    /// Ends `mem`'s registration (its mapping goes once no transfer uses
    /// it); whether it was registered.
    pub fn unregister(&self, mem: &dyn DeviceMemory) -> bool {
        let Some(key) = key_of(mem) else {
            return false;
        };
        let mut r = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        let before = r.len();
        r.retain(|x| x.key != key);
        r.len() != before
    }

    fn registration(&self, mem: &dyn DeviceMemory) -> Option<Arc<Mapped<'static>>> {
        let key = key_of(mem)?;
        let r = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().find(|x| x.key == key).map(|x| x.mapped.clone())
    }

    /// The controller.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }

    /// The module that maps memory for the controller.
    pub fn module(&self) -> &Arc<crate::Module> {
        &self.module
    }

    /// What IDENTIFY NAMESPACE said.
    pub fn info(&self) -> &NamespaceInfo {
        &self.info
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.info.size()
    }

    /// How errors name it: the controller and the namespace id.
    pub fn name(&self) -> String {
        format!("{} namespace {}", self.ctrl.pci(), self.info.nsid)
    }

    fn bs(&self) -> u64 {
        u64::from(self.info.block_size)
    }

    /// Refuses `len` bytes at `offset` outside the namespace.
    pub(crate) fn check(&self, offset: u64, len: usize) -> Result<()> {
        crate::error::check_within(&self.name(), offset, len as u64, self.size())
    }

    /// Reads the bytes at byte `offset` of the namespace into `range`.
    pub fn read(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        self.check(offset, range.len())?;
        self.transfer(false, offset, range, None).map(|_| ())
    }

    /// Writes the bytes of `range` to byte `offset` of the namespace.
    /// Durable once [`Namespace::flush`] returns.
    pub fn write(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        self.check(offset, range.len())?;
        self.transfer(true, offset, range, None).map(|_| ())
    }

    /// [`read`](Namespace::read), each command's queue and id recorded in
    /// `issued` as it is submitted (for a caller following its commands,
    /// as a prefetch does).
    pub fn read_issuing(&self, offset: u64, range: MemRange<'_>, issued: &Issued) -> Result<()> {
        self.check(offset, range.len())?;
        self.transfer(false, offset, range, Some(issued))
            .map(|_| ())
    }

    /// FLUSH: the controller's volatile write cache to the medium.
    pub fn flush(&self) -> Result<()> {
        let cmd = IoCommand::flush(self.info.nsid);
        self.ctrl
            .scope(|s| s.submit(self.ctrl.next_queue(), &cmd)?.wait().map(|_| ()))
    }

    /// Moves the bytes of `range` (checked by the caller); the commands it
    /// took.
    pub(crate) fn transfer(
        &self,
        write: bool,
        offset: u64,
        range: MemRange<'_>,
        issued: Option<&Issued>,
    ) -> Result<u64> {
        let len = range.len();
        if len == 0 {
            return Ok(0);
        }
        let bs = self.bs();
        let end = offset + len as u64;
        let (a0, a1) = (u64::next_multiple_of(offset, bs), round_down(end, bs));
        if a0 >= a1 {
            // Inside one block, or across one boundary with no whole block.
            return self.staged(write, offset, range, issued);
        }
        // The part of `range` for file bytes `[o0, o1)`.
        let part = |o0: u64, o1: u64| range.sub((o0 - offset) as usize, (o1 - o0) as usize);
        let mut n = 0;
        if a0 > offset {
            n += self.staged(write, offset, part(offset, a0)?, issued)?;
        }
        let middle = part(a0, a1)?;
        n += match range
            .mem()
            .dma()
            .and_then(|d| d.dma_target())
            .map(|t| (t.ptr as usize + middle.offset()) % 4)
        {
            Some(0) => self.direct_one(write, a0, middle, issued)?,
            _ => self.staged(write, a0, middle, issued)?,
        };
        if end > a1 {
            n += self.staged(write, a1, part(a1, end)?, issued)?;
        }
        Ok(n)
    }

    /// Several runs between the namespace and one memory range, as one
    /// transfer: each of `runs` is a byte offset on the namespace, an
    /// offset in `range` and a length. Runs of whole blocks whose memory is
    /// dword aligned move by DMA with the memory itself, mapped for the
    /// controller once for them all, their commands in flight together;
    /// the others (at most the two ends of a striped transfer) as
    /// [`Namespace::transfer`] moves them. The commands it took; an error
    /// only after every command it submitted has ended.
    pub(crate) fn transfer_runs(
        &self,
        write: bool,
        range: MemRange<'_>,
        runs: &[(u64, usize, usize)],
        issued: Option<&Issued>,
    ) -> Result<u64> {
        let plan = self.prepare(write, range, runs)?;
        let cmds = plan.commands(write)?;
        if !cmds.is_empty() {
            self.run(&cmds, issued)?;
        }
        Ok(cmds.len() as u64 + plan.rest(write, range, issued)?)
    }

    /// `runs` of `range` (as [`Namespace::transfer_runs`] takes them)
    /// split into those that move by DMA with the memory itself, whole
    /// blocks in dword-aligned memory, with the memory mapped for the
    /// controller once for them all, and the rest. Everything goes through
    /// staging when the module will not map the memory for the controller
    /// (memory it cannot reach by P2P, say), found out before any command.
    pub(crate) fn prepare<'r>(
        &'r self,
        write: bool,
        range: MemRange<'r>,
        runs: &[(u64, usize, usize)],
    ) -> Result<Plan<'r>> {
        let bs = self.bs();
        let ptr = range
            .mem()
            .dma()
            .and_then(|d| d.dma_target())
            .map(|t| t.ptr as usize + range.offset());
        let (whole, rest): (Vec<(u64, usize, usize)>, Vec<_>) =
            runs.iter().partition(|&&(at, off, n)| {
                at.is_multiple_of(bs)
                    && (n as u64).is_multiple_of(bs)
                    && n > 0
                    && ptr.is_some_and(|p| (p + off).is_multiple_of(4))
            });
        let (Some(lo), Some(hi)) = (
            whole.iter().map(|r| r.1).min(),
            whole.iter().map(|r| r.1 + r.2).max(),
        ) else {
            return Ok(Plan {
                ns: self,
                direct: None,
                rest,
                staged: false,
            });
        };
        let span = range.sub(lo, hi - lo)?;
        let access = if write {
            PeerAccess::ReadOnly
        } else {
            PeerAccess::WriteOnly
        };
        let mem = span.mem();
        // Registered memory's mapping covers it all; other memory is mapped
        // for this transfer.
        let (held, base) = match self.registration(mem) {
            Some(k) => (Held::Kept(k), span.offset()),
            None => match self.ctrl.map(mem, span.offset(), span.len(), access) {
                Ok(m) => (Held::Fresh(m), 0),
                Err(e) if e.bounce_can_fix() => {
                    return Ok(Plan {
                        ns: self,
                        direct: None,
                        rest: runs.to_vec(),
                        staged: true,
                    })
                }
                Err(e) => return Err(e),
            },
        };
        let runs = whole
            .iter()
            .map(|&(at, off, n)| (at, base + off - lo, n))
            .collect();
        Ok(Plan {
            ns: self,
            direct: Some(Direct { held, runs }),
            rest,
            staged: false,
        })
    }

    /// The block-aligned bytes at `offset`, by DMA between the namespace
    /// and the memory of `range` itself.
    fn direct_one(
        &self,
        write: bool,
        offset: u64,
        range: MemRange<'_>,
        issued: Option<&Issued>,
    ) -> Result<u64> {
        self.transfer_runs(write, range, &[(offset, 0, range.len())], issued)
    }

    /// Runs `cmds` on the next queue in turn (see [`run_together`]); the
    /// first error, after all have ended.
    fn run(&self, cmds: &[IoCommand<'_>], issued: Option<&Issued>) -> Result<()> {
        run_together(&[(self, cmds)], issued)
            .pop()
            .unwrap_or(Ok(()))
    }

    fn take_staging(&self) -> Result<Staging> {
        if let Some(s) = self.staging.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(s);
        }
        let host = Arc::new(HostMemory::new(STAGING)?);
        let mapped = self.ctrl.map_owned(host.clone(), PeerAccess::ReadWrite)?;
        Ok(Staging { host, mapped })
    }

    fn give_staging(&self, s: Staging) {
        let mut pool = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < STAGING_KEPT {
            pool.push(s);
        }
    }

    /// The bytes of `range` at `offset` through a pinned host staging
    /// buffer, a buffer's worth of whole blocks at a time. Partial blocks
    /// of a write are read, changed and written back under their blocks'
    /// locks.
    fn staged(
        &self,
        write: bool,
        offset: u64,
        range: MemRange<'_>,
        issued: Option<&Issued>,
    ) -> Result<u64> {
        let s = self.take_staging()?;
        let r = self.staged_with(&s, write, offset, range, issued);
        self.give_staging(s);
        r
    }

    fn staged_with(
        &self,
        s: &Staging,
        write: bool,
        offset: u64,
        range: MemRange<'_>,
        issued: Option<&Issued>,
    ) -> Result<u64> {
        let (mem, mem_at, len) = (range.mem(), range.offset(), range.len());
        let bs = self.bs();
        // A command's span, whole blocks: at most the staging buffer and
        // the controller's largest transfer.
        let chunk = round_down(STAGING.min(self.ctrl.max_transfer()) as u64, bs).max(bs) as usize;
        let mut done = 0usize;
        let mut cmds = 0;
        while done < len {
            let at = offset + done as u64;
            let b0 = round_down(at, bs);
            let skip = (at - b0) as usize;
            let n = (chunk - skip).min(len - done);
            let b1 = u64::next_multiple_of(at + n as u64, bs);
            let span = (b1 - b0) as usize;
            let cmd = |write: bool| -> Result<IoCommand<'_>> {
                let data = s.mapped.payload(0, span)?;
                let blocks = (span as u64 / bs) as u32;
                Ok(IoCommand::data(
                    write,
                    self.info.nsid,
                    b0 / bs,
                    blocks,
                    data,
                ))
            };
            if !write {
                cmds += 1;
                self.run(&[cmd(false)?], issued)?;
                copy(s.host.as_ref(), skip, mem, mem_at + done, n)?;
            } else {
                let partial = skip != 0 || !(at + n as u64).is_multiple_of(bs);
                let locks = if partial {
                    Some(self.lock_blocks(b0 / bs, b1 / bs))
                } else {
                    None
                };
                if partial {
                    cmds += 1;
                    self.run(&[cmd(false)?], issued)?;
                }
                cmds += 1;
                copy(mem, mem_at + done, s.host.as_ref(), skip, n)?;
                self.run(&[cmd(true)?], issued)?;
                drop(locks);
            }
            done += n;
        }
        Ok(cmds)
    }

    /// The locks of blocks `first..last`, taken in index order.
    fn lock_blocks(&self, first: u64, last: u64) -> Vec<std::sync::MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = (first..last)
            .take(EDGE_LOCKS)
            .map(|b| (b % EDGE_LOCKS as u64) as usize)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| self.edges[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }
}

/// How a namespace moves a transfer's runs ([`Namespace::prepare`]).
pub(crate) struct Plan<'r> {
    ns: &'r Namespace,
    /// The runs that move by DMA with the memory itself.
    direct: Option<Direct<'r>>,
    /// The others.
    rest: Vec<(u64, usize, usize)>,
    /// Whether the others go through staging whatever they are (the
    /// memory could not be mapped for the controller).
    staged: bool,
}

impl Plan<'_> {
    /// The commands that move the runs of whole blocks by DMA with the
    /// memory itself, each at most the controller's largest transfer (none
    /// when there are no such runs).
    pub(crate) fn commands(&self, write: bool) -> Result<Vec<IoCommand<'_>>> {
        let Some(d) = &self.direct else {
            return Ok(Vec::new());
        };
        let mapped: &Mapped<'_> = match &d.held {
            Held::Kept(k) => k,
            Held::Fresh(m) => m,
        };
        let (ns, bs) = (self.ns, self.ns.bs());
        let mut cmds = Vec::new();
        for &(offset, at, len) in &d.runs {
            for (done, n) in cut(len, bs, ns.ctrl.max_transfer()) {
                let data = mapped.payload(at + done, n)?;
                let slba = (offset + done as u64) / bs;
                let blocks = (n as u64 / bs) as u32;
                cmds.push(IoCommand::data(write, ns.info.nsid, slba, blocks, data));
            }
        }
        Ok(cmds)
    }

    /// Moves the runs that do not move by DMA with the memory itself, one
    /// by one; the commands they took.
    pub(crate) fn rest(
        &self,
        write: bool,
        range: MemRange<'_>,
        issued: Option<&Issued>,
    ) -> Result<u64> {
        let mut n = 0;
        for &(at, off, len) in &self.rest {
            let part = range.sub(off, len)?;
            n += if self.staged {
                self.ns.staged(write, at, part, issued)?
            } else {
                self.ns.transfer(write, at, part, issued)?
            };
        }
        Ok(n)
    }

    /// Whether there is anything besides the direct runs.
    pub(crate) fn has_rest(&self) -> bool {
        !self.rest.is_empty()
    }
}

/// Memory mapped for a transfer's controller: kept by a registration, or
/// made for this transfer.
enum Held<'r> {
    Kept(Arc<Mapped<'static>>),
    Fresh(Mapped<'r>),
}

/// A plan's runs of whole blocks with their memory mapped for the
/// controller ([`Namespace::prepare`]): ready to become commands.
struct Direct<'r> {
    held: Held<'r>,
    /// Each run's byte offset on the namespace, offset in the mapping and
    /// length.
    runs: Vec<(u64, usize, usize)>,
}

/// Sweeps over every queue without a completion before the thread waits
/// for its oldest command instead.
const SPINS: u32 = 256;

/// Runs each namespace's commands, all from the calling thread: up to
/// [`WINDOW`] of each namespace in flight on its controller's next queue,
/// each refill one doorbell, every controller's completions taken as they
/// come, so that one thread keeps several controllers busy with no thread
/// of its own per controller and nothing to hand over between threads.
/// Each namespace's first error (its later commands not submitted), after
/// every command submitted has ended.
pub(crate) fn run_together(
    jobs: &[(&Namespace, &[IoCommand<'_>])],
    issued: Option<&Issued>,
) -> Vec<Result<()>> {
    struct Lane<'p> {
        queue: usize,
        next: usize,
        flight: VecDeque<Pending<'p>>,
        first: Option<Error>,
    }
    let note = |first: &mut Option<Error>, r: Result<()>| {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    };
    let record = |p: &Pending<'_>| {
        if let Some(i) = issued {
            i.push(p.id());
        }
    };
    let ctrls: Vec<&Controller> = jobs.iter().map(|(ns, _)| &*ns.ctrl).collect();
    super::scope::scopes(&ctrls, |subs| {
        let mut lanes: Vec<Lane<'_>> = jobs
            .iter()
            .map(|(ns, _)| Lane {
                queue: ns.ctrl.next_queue(),
                next: 0,
                flight: VecDeque::new(),
                first: None,
            })
            .collect();
        let mut idle = 0u32;
        loop {
            let (mut moved, mut open) = (false, false);
            for ((lane, sub), (_, cmds)) in lanes.iter_mut().zip(subs).zip(jobs) {
                // In submission order: a queue's commands mostly complete
                // in it, and one look per lane keeps a sweep short.
                while lane.flight.front().is_some_and(Pending::is_done) {
                    if let Some(p) = lane.flight.pop_front() {
                        note(&mut lane.first, p.wait().map(|_| ()));
                    }
                    moved = true;
                }
                let mut pushed = false;
                while lane.first.is_none() && lane.next < cmds.len() && lane.flight.len() < WINDOW {
                    match sub.push(lane.queue, &cmds[lane.next]) {
                        Ok(Some(p)) => {
                            record(&p);
                            lane.flight.push_back(p);
                            lane.next += 1;
                            pushed = true;
                        }
                        Ok(None) => break,
                        Err(e) => note(&mut lane.first, Err(e)),
                    }
                }
                if pushed {
                    sub.ring(lane.queue);
                    moved = true;
                }
                // The queue full with none of this lane's commands in
                // flight: room comes as other threads consume theirs.
                if lane.first.is_none() && lane.next < cmds.len() && lane.flight.is_empty() {
                    match sub.submit(lane.queue, &cmds[lane.next]) {
                        Ok(p) => {
                            record(&p);
                            lane.flight.push_back(p);
                            lane.next += 1;
                            moved = true;
                        }
                        Err(e) => note(&mut lane.first, Err(e)),
                    }
                }
                open |= !lane.flight.is_empty();
            }
            if !open {
                break;
            }
            if moved {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle < SPINS {
                std::hint::spin_loop();
                continue;
            }
            // Nothing for a while: wait for a command (sleeping on the
            // controller's interrupts where it has them).
            if let Some(lane) = lanes.iter_mut().find(|l| !l.flight.is_empty()) {
                if let Some(p) = lane.flight.pop_front() {
                    note(&mut lane.first, p.wait().map(|_| ()));
                }
            }
            idle = 0;
        }
        lanes
            .into_iter()
            .map(|l| l.first.map_or(Ok(()), Err))
            .collect()
    })
}
