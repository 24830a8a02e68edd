//! The controller: bring-up through VFIO, queue pairs in accelerator
//! memory, namespaces and their events, revocation, shutdown. Commands,
//! scopes and mappings have modules of their own.
#![allow(unsafe_code)]

use std::{
    fmt,
    marker::PhantomData,
    mem::ManuallyDrop,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

pub use super::facts::NamespaceInfo;
use super::{
    claim::{self, IommuMode},
    command::{admin_data_len, AdminCommand},
    facts::{Facts, RescanError, Snapshot},
    layout::{round_page, vector_plan, Layout, ADMIN_ENTRIES},
    mapped::{Instance, Mapped},
    qpair::{Health, Place, QueuePair, Stopper, Ticket, WaitError, LIST_ENTRIES},
    registers,
    revoke::{Made, Revoker, Watch},
};
use crate::{
    memory::{
        peer::{DmaMapping, MapType, PeerAccess},
        DeviceMemory, MemoryKind, ModuleMemory,
    },
    nvme::{self, admin, Command, Completion, DataPtr, IdCtrl, Segments, PAGE},
    sys::vfio,
    Error, Module, PciAddress, Peer, Result,
};

/// The largest data transfer of one command this library builds: one PRP
/// list page beyond the first page.
const MAX_COMMAND_BYTES: usize = 1 << 20;
/// How long deleting the I/O queues may take at shutdown, each.
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a new scope looks for an asynchronous event at most.
const EVENT_CHECK: Duration = Duration::from_millis(100);

/// How to take and set up a controller.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Take the controller from the kernel driver that has it (after
    /// checking that nothing uses its namespaces).
    pub unbind: bool,
    /// The accelerator whose memory holds the queues; `None`: the first one
    /// the controller can reach by P2P.
    pub accelerator: Option<u32>,
    /// I/O queue pairs wanted (the controller may grant fewer).
    pub queues: u16,
    /// Entries of each I/O queue (at most what the controller supports).
    pub entries: u16,
    /// How long a command may take before it is aborted.
    pub timeout: Duration,
    /// Completion queues raise MSI-X interrupts, and waiting threads sleep
    /// on them after polling a little (host threads); without, waiters
    /// only poll (as accelerator threads do). Each I/O queue gets a vector
    /// of its own: where the controller has fewer vectors than queues,
    /// fewer queues are created; where it has none to spare, the queues are
    /// polled whatever this says.
    pub interrupts: bool,
}

impl Default for InitOptions {
    fn default() -> Self {
        Self {
            unbind: false,
            accelerator: None,
            queues: 4,
            entries: 128,
            timeout: Duration::from_secs(30),
            interrupts: true,
        }
    }
}
/// Controller objects set up so far, numbering them from 1.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// An NVMe controller driven by this process, its queues in accelerator
/// memory. Thread-safe: any number of threads submit and wait at once.
/// Dropping it deletes its I/O queues and shuts it down (it stays bound
/// to vfio-pci; see [`claim::give_back`]).
pub struct Controller {
    pci: PciAddress,
    /// Which controller object this is (see [`Instance`]).
    id: u64,
    pub(super) bdf: String,
    /// The controller's own file of the module: its queue memory, and the
    /// mappings, pins and imports made for it.
    module: Arc<Module>,
    mode: IommuMode,
    /// Queues, PRP lists and the IDENTIFY page, in accelerator memory;
    /// kept for good when the controller cannot be stopped.
    mem: ManuallyDrop<Arc<ModuleMemory>>,
    map: DmaMapping,
    pub(super) health: Arc<Health>,
    admin: QueuePair,
    pub(super) io: Vec<QueuePair>,
    ident: IdCtrl,
    pub(super) facts: Facts,
    pub(super) max_transfer: usize,
    pub(super) timeout: Duration,
    next: AtomicUsize,
    /// MSI-X vectors in use, or why the queues are polled only.
    interrupts: std::result::Result<usize, String>,
    /// The Asynchronous Event Request kept outstanding (none while one
    /// could not be submitted).
    aer: std::sync::Mutex<Option<Ticket>>,
    /// When it was set up, and when (in nanoseconds since) the next look
    /// for an event is due.
    born: Instant,
    next_event_check: AtomicU64,
    /// The mappings made for it that stand.
    made: Arc<Made>,
    /// The thread that stops it when what it was given is revoked.
    watch: Option<Watch>,
    // Last: closed after the controller is stopped and the memory freed.
    func: vfio::Function,
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("pci", &self.bdf)
            .field("queues", &self.io.len())
            .finish()
    }
}

impl Controller {
    pub(super) fn error(bdf: &str, reason: impl Into<String>, source: rustix::io::Errno) -> Error {
        Error::Controller {
            pci: bdf.to_string(),
            reason: reason.into(),
            source,
        }
    }

    /// Takes the NVMe controller at `pci` (see [`claim::take`]), resets it
    /// and sets up its admin queue and I/O queue pairs in accelerator
    /// memory, as `opts` says. The memory is zeroed first, so nothing a
    /// previous owner left in it reaches the controller or this process.
    ///
    /// The queue memory, its DMA mapping and the controller's pins and
    /// imports live in a file of the module's of their own, opened on
    /// `module`'s device node ([`Module::reopen`]): no handle or `mmap`
    /// offset of `module`, or of any other file, names them.
    pub fn initialize(
        module: Arc<Module>,
        pci: PciAddress,
        opts: &InitOptions,
    ) -> Result<Arc<Self>> {
        let bdf = pci.to_string();
        let fail = |r: String| Self::error(&bdf, r, rustix::io::Errno::BUSY);
        if opts.queues == 0 || opts.entries < 2 {
            return Err(Error::InvalidArgument(format!(
                "{} queues of {} entries",
                opts.queues, opts.entries
            )));
        }
        let accel = Self::pick_accelerator(&module, pci, opts.accelerator)
            .map_err(|r| Self::error(&bdf, r, rustix::io::Errno::REMOTEIO))?;
        let shared = module;
        let module = Arc::new(shared.reopen()?);
        let mode = claim::take(&bdf, opts.unbind).map_err(fail)?;
        // SAFETY: The controller's DMA goes only to memory mapped for it
        // here (its queues) or by `map` (memory a `Mapped` keeps alive), and
        // it is stopped before that memory is released.
        let mut func = unsafe { vfio::Function::open_noiommu(&bdf) }.map_err(fail)?;
        // Released before the module's files when this process dies, so
        // nothing the controller still holds writes freed memory.
        for file in [&shared, &module] {
            func.keep_above(std::os::fd::AsFd::as_fd(&**file))
                .map_err(fail)?;
        }
        let bar = func.bar.clone();
        let io_err = |r: String| Self::error(&bdf, r, rustix::io::Errno::IO);
        let caps = nvme::Caps::decode(bar.read64(nvme::reg::CAP).map_err(io_err)?);
        // Stopped before any memory is handed to it: whatever a previous
        // owner left running ends here.
        registers::disable(&bar, caps.timeout).map_err(io_err)?;
        let entries = opts.entries.min(caps.mqes.min(4096) as u16);
        let layout = Layout {
            entries,
            queues: opts.queues,
        };
        let mem = Arc::new(ModuleMemory::alloc(
            module.clone(),
            accel,
            layout.total() as u64,
            0,
        )?);
        mem.write_at(0, &vec![0u8; layout.total()])?;
        let map = module.dma_map_access(
            mem.handle(),
            0,
            layout.total() as u64,
            Peer::Pci(pci),
            PeerAccess::ReadWrite,
        )?;
        let (handle, seg_list) = (map.map_handle(), map.segs.clone());
        let unmap_queues = || {
            // SAFETY: The queue memory's mapping, on a failure before the
            // controller runs (it was disabled above), or once it is stopped.
            let _ = unsafe { module.unmap_raw(handle) };
        };
        let unmap = |e: Error| {
            unmap_queues();
            e
        };
        if map.map_type == MapType::NotSupported {
            return Err(unmap(Self::error(
                &bdf,
                format!("the kernel does not let it reach accelerator {accel}'s memory"),
                rustix::io::Errno::REMOTEIO,
            )));
        }
        let segs = Segments::new(&map.segs).ok_or_else(|| {
            unmap(Error::InvalidArgument(format!(
                "the queue memory's segments overflow: {:x?}",
                map.segs
            )))
        })?;
        let base = mem.mapping().as_ptr();
        // Every byte of a queue region is contiguous for the controller,
        // which addresses it from its first byte's bus address.
        let place = |off: usize, len: usize| -> Result<Place> {
            match segs.contiguous(off as u64, len as u64) {
                Some(bus) if bus % PAGE as u64 == 0 => Ok(Place {
                    // Used by the queue pairs only, which the mapping
                    // outlives.
                    cpu: base.wrapping_add(off),
                    bus,
                }),
                _ => Err(Error::InvalidArgument(format!(
                    "bytes {off}..{} of the queue memory are not contiguous and page aligned for the controller: {:x?}",
                    off + len,
                    seg_list
                ))),
            }
        };
        let health = Arc::new(Health::new(Stopper {
            bar: bar.clone(),
            ready_timeout: caps.timeout,
            device: Some(func.device.clone()),
        }));
        let list_bytes = |e: u16| (usize::from(e) - 1) * PAGE;
        let admin = QueuePair::new(
            0,
            ADMIN_ENTRIES,
            (
                place(Layout::admin_sq(), PAGE).map_err(unmap)?,
                place(Layout::admin_cq(), PAGE).map_err(unmap)?,
                place(Layout::admin_lists(), list_bytes(ADMIN_ENTRIES)).map_err(unmap)?,
            ),
            bar.clone(),
            caps.doorbell_stride,
            health.clone(),
            None,
        );
        let (asq, acq) = admin.bus();
        if let Err(e) = registers::enable(&bar, ADMIN_ENTRIES, asq, acq) {
            // It may have started fetching from its admin queue: the queue
            // memory goes back only once it is stopped, and stays with this
            // process (its module file kept open) if nothing stops it.
            let given = (mem, module.clone());
            let released = health.release_when_stopped(given, |given| {
                unmap_queues();
                drop(given);
            });
            if released {
                return Err(io_err(e));
            }
            return Err(io_err(format!(
                "{e}; the controller could not be stopped, so its queue memory stays allocated until the process ends"
            )));
        }
        let mut ctrl = Self {
            pci,
            id: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            bdf: bdf.clone(),
            module: module.clone(),
            mode,
            mem: ManuallyDrop::new(mem),
            made: Arc::default(),
            watch: None,
            born: Instant::now(),
            next_event_check: AtomicU64::new(0),
            map,
            health,
            admin,
            io: Vec::new(),
            ident: IdCtrl::default(),
            facts: Facts::default(),
            max_transfer: MAX_COMMAND_BYTES,
            timeout: opts.timeout,
            next: AtomicUsize::new(0),
            interrupts: Err("no I/O queue yet".into()),
            aer: std::sync::Mutex::new(None),
            func,
        };
        // From here `ctrl`'s drop stops the controller and unmaps; a
        // revocation stops it sooner.
        ctrl.watch = Some(
            Watch::start(Revoker {
                bdf: bdf.clone(),
                health: ctrl.health.clone(),
                bar: bar.clone(),
                device: ctrl.func.device.clone(),
                module: module.clone(),
                queue_map: handle,
                queues: (*ctrl.mem).clone(),
                made: ctrl.made.clone(),
            })
            .map_err(|r| Self::error(&bdf, r, rustix::io::Errno::NOTSUP))?,
        );
        let mut page = vec![0u8; PAGE];
        ctrl.identify(1, 0, &mut page)?;
        ctrl.ident = IdCtrl::decode(&page).map_err(io_err)?;
        if ctrl.ident.multi_controller() && !ctrl.ident.namespace_notices() {
            return Err(Self::error(
                &bdf,
                "its subsystem may hold other controllers, through which its namespaces can change, and it announces no namespace changes (OAES bit 8 clear): commands could be checked against a namespace's old format",
                rustix::io::Errno::NOTSUP,
            ));
        }
        if ctrl.ident.mdts > 0 {
            let mdts = caps.mps_min.checked_shl(u32::from(ctrl.ident.mdts));
            ctrl.max_transfer = mdts.unwrap_or(usize::MAX).min(MAX_COMMAND_BYTES);
        }
        ctrl.rescan()?;
        // Number of Queues: 0-based counts asked for and granted.
        let want = u32::from(opts.queues - 1);
        let granted = ctrl.admin_command(&Command {
            opcode: admin::SET_FEATURES,
            cdw: [admin::FEATURE_NUM_QUEUES, want << 16 | want, 0, 0, 0, 0],
            ..Default::default()
        })?;
        let n = ((granted.result & 0xffff)
            .min(granted.result >> 16)
            .min(want)
            + 1) as usize;
        let vectors = if opts.interrupts {
            ctrl.enable_msix(n)
        } else {
            Err("interrupts were not asked for".into())
        };
        let fds = vectors.as_deref().unwrap_or_default();
        for (i, vector) in vector_plan(n, fds.len()).into_iter().enumerate() {
            let (sq, cq, lists) = layout.queue(i);
            let qp = QueuePair::new(
                i as u16 + 1,
                entries,
                (
                    place(sq, 64 * usize::from(entries))?,
                    place(cq, 16 * usize::from(entries))?,
                    place(lists, list_bytes(entries))?,
                ),
                bar.clone(),
                caps.doorbell_stride,
                ctrl.health.clone(),
                vector.map(|k| fds[k].clone()),
            );
            ctrl.create_queue(&qp, vector)?;
            ctrl.io.push(qp);
        }
        ctrl.interrupts = vectors.map(|v| v.len());
        // Namespace Attribute Notices on, and an Asynchronous Event Request
        // outstanding to bring them. Without them, namespaces change only
        // through this controller's own admin commands, which
        // `Controller::admin` refuses.
        if ctrl.ident.namespace_notices() {
            ctrl.admin_command(&Command {
                opcode: admin::SET_FEATURES,
                cdw: [admin::FEATURE_ASYNC_EVENT_CONFIG, 1 << 8, 0, 0, 0, 0],
                ..Default::default()
            })
            .map_err(|e| {
                Self::error(
                    &bdf,
                    format!("turning Namespace Attribute Notices on: {e}"),
                    rustix::io::Errno::NOTSUP,
                )
            })?;
        }
        let aer = ctrl.arm_event()?;
        *ctrl.aer.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(aer);
        Ok(Arc::new(ctrl))
    }

    /// Enables MSI-X with an eventfd per vector, one for the admin queue
    /// and one per I/O queue as far as the controller has vectors; why not
    /// when it cannot.
    fn enable_msix(
        &self,
        queues: usize,
    ) -> std::result::Result<Vec<Arc<std::os::fd::OwnedFd>>, String> {
        let info = self.func.device.irq(vfio::VFIO_PCI_MSIX_IRQ_INDEX)?;
        let n = (info.count as usize).min(queues + 1);
        if n < 2 {
            return Err(format!("the controller has {} MSI-X vectors", info.count));
        }
        let fds = (0..n)
            .map(|_| {
                rustix::event::eventfd(
                    0,
                    // Blocking: a poller sleeps in one read of it.
                    rustix::event::EventfdFlags::CLOEXEC,
                )
                .map(Arc::new)
                .map_err(|e| format!("eventfd: {e}"))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let borrowed: Vec<_> = fds.iter().map(|f| std::os::fd::AsFd::as_fd(&**f)).collect();
        self.func.device.set_msix(&borrowed)?;
        Ok(fds)
    }

    /// The accelerator to hold the queues: `want`, or the first the
    /// controller reaches by P2P, with the kernel's answers when none does.
    fn pick_accelerator(
        module: &Module,
        pci: PciAddress,
        want: Option<u32>,
    ) -> std::result::Result<u32, String> {
        let accels = module.accelerators().map_err(|e| e.to_string())?;
        let mut why = Vec::new();
        for a in accels.iter().filter(|a| want.is_none_or(|w| w == a.index)) {
            match module.p2p_query(a.index, Peer::Pci(pci)) {
                Ok(q) if q.map_type != MapType::NotSupported => return Ok(a.index),
                Ok(q) => why.push(format!(
                    "accelerator {} ({}): {} ({})",
                    a.index, a.pci, q.map_type, q.reason
                )),
                Err(e) => why.push(format!("accelerator {} ({}): {e}", a.index, a.pci)),
            }
        }
        Err(match (want, why.is_empty()) {
            (Some(w), true) => format!("the module has no accelerator {w}"),
            (None, true) => "the module has no accelerator to hold the queues".into(),
            _ => format!(
                "no accelerator's memory is reachable by P2P for the queues: {}",
                why.join("; ")
            ),
        })
    }

    pub(super) fn failed(&self, why: String) -> Error {
        Self::error(&self.bdf, why, rustix::io::Errno::IO)
    }

    /// Runs an admin command this library built (its PRPs name the
    /// controller's own memory) and checks its status.
    fn admin_command(&self, cmd: &Command) -> Result<Completion> {
        let what = format!("admin command {:#04x}", cmd.opcode);
        let deadline = Instant::now() + self.timeout;
        let t = self
            .admin
            .submit(cmd, None, (Some(deadline), 0), true)
            .map_err(|e| self.wait_error(e, &what))?;
        match self.admin.wait(&t, deadline) {
            Ok(c) => c.check(&what).map(|()| c).map_err(|e| self.failed(e)),
            Err(WaitError::Timeout) => {
                // The admin queue itself is stuck: only a reset ends that.
                self.health
                    .fail(format!("{what} did not complete within {:?}", self.timeout));
                self.admin.forget(t);
                Err(self.wait_error(WaitError::Timeout, &what))
            }
            Err(e) => Err(self.wait_error(e, &what)),
        }
    }

    pub(super) fn wait_error(&self, e: WaitError, what: &str) -> Error {
        match e {
            WaitError::Timeout => Self::error(
                &self.bdf,
                format!("{what}: no completion within {:?}", self.timeout),
                rustix::io::Errno::TIMEDOUT,
            ),
            WaitError::Failed(why) => self.failed(format!("{what} not completed: {why}")),
            WaitError::Full => Self::error(
                &self.bdf,
                format!("{what}: the queue is full"),
                rustix::io::Errno::AGAIN,
            ),
        }
    }

    /// The bus address of the controller's own IDENTIFY page.
    fn identify_page(&self) -> Result<u64> {
        Segments::new(&self.map.segs)
            .and_then(|s| s.contiguous(Layout::identify() as u64, PAGE as u64))
            .ok_or_else(|| self.failed("the IDENTIFY page is not contiguous".into()))
    }

    /// IDENTIFY with `cns` for `nsid` into the controller's own IDENTIFY
    /// page, copied to `out` before any other command uses the page.
    fn identify(&self, cns: u8, nsid: u32, out: &mut [u8]) -> Result<()> {
        let bus = self.identify_page()?;
        self.facts.with_page(|| {
            self.admin_command(&Command {
                opcode: admin::IDENTIFY,
                nsid,
                prp1: bus,
                cdw: [u32::from(cns), 0, 0, 0, 0, 0],
                ..Default::default()
            })?;
            self.mem.read_at(Layout::identify(), out)
        })
    }

    /// Submits the Asynchronous Event Request kept outstanding.
    fn arm_event(&self) -> Result<Ticket> {
        self.admin
            .submit(
                &Command {
                    opcode: admin::ASYNC_EVENT_REQUEST,
                    ..Default::default()
                },
                None,
                (Some(Instant::now() + self.timeout), 0),
                true,
            )
            .map_err(|e| self.wait_error(e, "Asynchronous Event Request"))
    }

    /// Handles the asynchronous event the controller reported, if it
    /// reported one (looking at most every [`EVENT_CHECK`], when a scope
    /// opens and when a command is submitted): its log page is read (which
    /// lets the controller report the next event of its kind), a Namespace
    /// Attribute Changed notice marks the namespaces stale, and the request
    /// is submitted anew. Stale namespaces are read again, here and on
    /// every later look until that succeeds; a request the controller
    /// ended without an event, or one that could not be submitted, is
    /// submitted again.
    pub(super) fn check_events(&self) {
        // Most submissions come sooner than that: one atomic load, and no
        // lock that every submitter would take in turn.
        let now = self.born.elapsed().as_nanos() as u64;
        if now < self.next_event_check.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut aer) = self.aer.try_lock() else {
            return;
        };
        self.next_event_check
            .store(now + EVENT_CHECK.as_nanos() as u64, Ordering::Relaxed);
        if self.health.failure().is_some() {
            return;
        }
        let mut event = None;
        match aer.take() {
            Some(t) if !self.admin.done(&t) => *aer = Some(t),
            Some(t) => match self.admin.wait(&t, Instant::now()) {
                Ok(c) if c.sct() == 0 && c.sc() == 0 => event = Some(c),
                _ => {}
            },
            None => {}
        }
        if let Some(c) = event {
            let (kind, info, log) = (
                c.result & 7,
                (c.result >> 8) & 0xff,
                (c.result >> 16) & 0xff,
            );
            if kind == 2 && info == 0 {
                self.facts.announce();
            }
            // The log page of the event, read whole up to a page.
            let bytes = match log {
                0x01 => 64,
                0x02 | 0x03 => 512,
                _ => PAGE,
            };
            let _ = self.read_log(log as u8, bytes);
        }
        if self.facts.stale() {
            let _ = self.rescan_stale();
        }
        if aer.is_none() {
            *aer = self.arm_event().ok();
        }
    }

    /// Get Log Page `lid`, `bytes` of it, into the controller's own page.
    fn read_log(&self, lid: u8, bytes: usize) -> Result<()> {
        let bus = self.identify_page()?;
        let numd = (bytes / 4 - 1) as u32;
        self.facts.with_page(|| {
            self.admin_command(&Command {
                opcode: admin::GET_LOG_PAGE,
                nsid: u32::MAX,
                prp1: bus,
                cdw: [
                    (numd & 0xffff) << 16 | u32::from(lid),
                    numd >> 16,
                    0,
                    0,
                    0,
                    0,
                ],
                ..Default::default()
            })
            .map(|_| ())
        })
    }

    /// Namespace Attribute Changed notices that the namespaces published
    /// so far reflect: each was followed by reading the namespaces again.
    pub fn namespace_changes(&self) -> u64 {
        self.facts.current().changes
    }

    /// Reads the active namespaces and their formats again (IDENTIFY):
    /// scopes opened afterwards check their commands against what this
    /// finds. A Namespace Attribute Changed notice from the controller does
    /// this by itself, noticed when a scope opens or a command is
    /// submitted.
    pub fn rescan(&self) -> Result<()> {
        let r = self
            .facts
            .rescan(|cns, nsid, out| self.identify(cns, nsid, out));
        self.rescanned(r).map(|_| ())
    }

    /// [`Controller::rescan`] where the controller announced a change that
    /// the published namespaces do not reflect.
    pub(super) fn rescan_stale(&self) -> Result<Snapshot> {
        let r = self
            .facts
            .rescan_stale(|cns, nsid, out| self.identify(cns, nsid, out));
        self.rescanned(r)
    }

    fn rescanned(&self, r: std::result::Result<Snapshot, RescanError<Error>>) -> Result<Snapshot> {
        r.map_err(|e| match e {
            RescanError::Identify(e) => e,
            RescanError::Decode { nsid, why } => {
                self.failed(format!("IDENTIFY NAMESPACE of namespace {nsid}: {why}"))
            }
        })
    }

    fn create_queue(&self, qp: &QueuePair, vector: Option<usize>) -> Result<()> {
        let size_qid = u32::from(qp.entries() - 1) << 16 | u32::from(qp.qid());
        let (sq, cq) = qp.bus();
        // PC = 1; with a vector, IEN = 1 and IV = the vector.
        let flags = match vector {
            Some(v) => 1 | 1 << 1 | (v as u32) << 16,
            None => 1,
        };
        self.admin_command(&Command {
            opcode: admin::CREATE_IO_CQ,
            prp1: cq,
            cdw: [size_qid, flags, 0, 0, 0, 0],
            ..Default::default()
        })?;
        self.admin_command(&Command {
            opcode: admin::CREATE_IO_SQ,
            prp1: sq,
            cdw: [size_qid, u32::from(qp.qid()) << 16 | 1, 0, 0, 0, 0],
            ..Default::default()
        })?;
        Ok(())
    }

    pub(super) fn instance(&self) -> Instance {
        Instance {
            pci: self.pci,
            id: self.id,
        }
    }

    /// Its PCI address.
    pub fn pci(&self) -> PciAddress {
        self.pci
    }

    /// IDENTIFY CONTROLLER's serial, model, MDTS, namespace count and
    /// shutdown latency.
    pub fn identity(&self) -> &IdCtrl {
        &self.ident
    }

    /// Its active namespaces, as last identified.
    pub fn namespaces(&self) -> Arc<[NamespaceInfo]> {
        self.facts.current().namespaces
    }

    /// Namespace `nsid`, if active.
    pub fn namespace_info(&self, nsid: u32) -> Option<NamespaceInfo> {
        self.facts.current().get(nsid).cloned()
    }

    /// I/O queue pairs.
    pub fn queue_count(&self) -> usize {
        self.io.len()
    }

    /// Commands each I/O queue holds at once.
    pub fn queue_depth(&self) -> usize {
        self.io.first().map_or(0, QueuePair::depth)
    }

    /// The largest transfer of one command, in bytes (MDTS, at most
    /// 1 MiB).
    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// How its DMA is translated.
    pub fn iommu(&self) -> &IommuMode {
        &self.mode
    }

    /// The accelerator memory holding the queues.
    pub fn queue_memory(&self) -> MemoryKind {
        self.mem.kind()
    }

    /// Why the controller failed, if it did (it is then stopped, if any way
    /// of stopping it worked: a new [`Controller::initialize`] resets it).
    pub fn failure(&self) -> Option<String> {
        self.health.failure()
    }

    /// The MSI-X vectors the I/O queues raise, or why they are polled only.
    pub fn interrupts(&self) -> std::result::Result<usize, &str> {
        self.interrupts.as_ref().map(|n| *n).map_err(String::as_str)
    }

    /// Times a waiting thread slept on a completion interrupt, over all I/O
    /// queues.
    pub fn interrupt_sleeps(&self) -> u64 {
        self.io
            .iter()
            .map(|q| q.sleeps.load(Ordering::Relaxed))
            .sum()
    }

    /// Submission doorbell writes and commands submitted so far, over all
    /// I/O queues: their ratio is how much doorbell batching saved.
    pub fn doorbell_counts(&self) -> (u64, u64) {
        self.io.iter().fold((0, 0), |(d, s), q| {
            (
                d + q.doorbells.load(Ordering::Relaxed),
                s + q.submitted.load(Ordering::Relaxed),
            )
        })
    }

    /// Makes `len` bytes at `offset` of `mem` reachable by the controller
    /// for `access`: accelerator memory through `DMA_MAP`, host memory
    /// through `PIN_USER`, memory its driver exports as a dma-buf (a GPU's)
    /// through `DMABUF_IMPORT` of the whole dma-buf. The range is widened to
    /// whole pages for the kernel; payloads ([`Mapped::payload`]) count from `offset` and stay
    /// inside `len`. Unmapped when the result is dropped, which the borrow
    /// of any scope using it prevents while its commands run.
    pub fn map<'m>(
        &self,
        mem: &'m dyn DeviceMemory,
        offset: usize,
        len: usize,
        access: PeerAccess,
    ) -> Result<Mapped<'m>> {
        self.map_in(mem, offset, len, access, None)
    }

    /// [`Controller::map`] of the whole of memory this mapping keeps alive
    /// itself (a staging buffer that lives as long as its mapping).
    pub fn map_owned(
        &self,
        mem: Arc<dyn DeviceMemory>,
        access: PeerAccess,
    ) -> Result<Mapped<'static>> {
        let len = mem.len();
        self.map_in(&*mem, 0, len, access, Some(mem.clone()))
    }

    /// Maps `mem` (see [`Controller::map`]) for a lifetime its callers
    /// choose: `mem` borrowed for it, or owned through `owner`.
    fn map_in<'m>(
        &self,
        mem: &dyn DeviceMemory,
        offset: usize,
        len: usize,
        access: PeerAccess,
        owner: Option<Arc<dyn DeviceMemory>>,
    ) -> Result<Mapped<'m>> {
        // Every answer below is the `DmaMemory`'s, whose contract vouches
        // for them, its length included.
        let Some(mem) = mem.dma() else {
            return Err(Error::PathUnavailable {
                path: "queues",
                reason: format!("{} cannot be reached by DMA", mem.kind()),
            });
        };
        match offset.checked_add(len) {
            Some(end) if end <= mem.len() && len > 0 => {}
            _ => {
                return Err(Error::OutOfBounds {
                    offset: offset as u64,
                    len: len as u64,
                    size: mem.len() as u64,
                })
            }
        }
        let start = offset / PAGE * PAGE;
        let end = round_page(offset + len).min(round_page(mem.len()));
        // Where the mapping's first byte lies in `mem`'s terms: the range's
        // first page, or (a dma-buf, imported whole) the dma-buf's start.
        let mut skip = offset - start;
        let map = match (mem.module_allocation(), mem.kind()) {
            (Some((module, handle)), MemoryKind::ModuleBar { .. }) => module.dma_map_access(
                handle,
                start as u64,
                (end - start) as u64,
                Peer::Pci(self.pci),
                access,
            )?,
            (_, MemoryKind::Host) => {
                let target = mem
                    .dma_target()
                    .filter(|t| t.len >= mem.len())
                    .ok_or_else(|| Error::PathUnavailable {
                        path: "queues",
                        reason: "the host memory has no mapping to pin".into(),
                    })?;
                let va = target.ptr as u64 + start as u64;
                self.module.pin_user_access(
                    va,
                    (end - start) as u64,
                    Peer::Pci(self.pci),
                    access,
                )?
            }
            (_, kind) => match mem.dmabuf() {
                Some((fd, at)) => {
                    skip = at as usize + offset;
                    self.module.dmabuf_import(fd, Peer::Pci(self.pci))?
                }
                None => {
                    return Err(Error::PathUnavailable {
                        path: "queues",
                        reason: format!(
                            "{kind} was not allocated from the module and exports no dma-buf"
                        ),
                    })
                }
            },
        };
        let module = match mem.module_allocation() {
            Some((m, _)) if matches!(mem.kind(), MemoryKind::ModuleBar { .. }) => m.clone(),
            _ => self.module.clone(),
        };
        let handle = map.map_handle();
        let unmap = |e: Error| {
            // SAFETY: Made just now and given to no device.
            let _ = unsafe { module.unmap_raw(handle) };
            e
        };
        if map.map_type == MapType::NotSupported {
            return Err(unmap(Error::PathUnavailable {
                path: "queues",
                reason: format!("the controller {} cannot reach {}", self.bdf, mem.kind()),
            }));
        }
        let segs = match Segments::new(&map.segs) {
            Some(s) if s.len() >= (skip + len) as u64 => s,
            _ => {
                return Err(unmap(Error::InvalidArgument(format!(
                    "the module mapped {:x?} for {} bytes",
                    map.segs,
                    skip + len
                ))))
            }
        };
        self.made.add(&module, map.map_handle());
        Ok(Mapped {
            module: Some((module, self.made.clone())),
            map,
            segs,
            ctrl: self.instance(),
            access,
            skip,
            len,
            _owner: owner,
            _mem: PhantomData,
        })
    }

    /// A queue index for the calling thread's next command: queues are
    /// handed out in turn.
    pub fn next_queue(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs an admin command that this library does not build itself, with
    /// the PRPs of its payload, and waits up to `timeout` (the controller's
    /// own when `None`). One that takes longer is aborted as I/O commands
    /// are: its error says whether the controller aborted it, and when the
    /// abort does not end it, the controller is stopped. An error status is
    /// an error.
    ///
    /// Taken: the commands whose data size this library knows from the
    /// command itself: IDENTIFY, Get Log Page (the Changed Namespace List
    /// only with Retain Asynchronous Event), Get and Set Features of the
    /// features it knows, Firmware Image Download and Commit, Device
    /// Self-test, Keep Alive, Security Send and Receive. Refused among
    /// them: Set Features of the Number of Queues, the Host Memory Buffer
    /// (memory the controller keeps) and the Asynchronous Event
    /// Configuration (it can turn off the notices that announce namespace
    /// changes). Every other opcode is refused: those that manage the
    /// queues this controller was set up with, give it memory beyond one
    /// command's life, change namespaces under the queues (Format NVM,
    /// Sanitize, Namespace Management and Attachment), take the events the
    /// library waits for (Asynchronous Event Request), and vendor
    /// commands; [`Controller::admin_raw`] runs them. A payload must hold
    /// exactly the bytes the command moves, in the direction its opcode
    /// says.
    pub fn admin(&self, cmd: &AdminCommand<'_>, timeout: Option<Duration>) -> Result<Completion> {
        let refuse = |why: &str| {
            Err(Error::InvalidArgument(format!(
                "admin opcode {:#04x} on {}: {why}",
                cmd.opcode, self.bdf
            )))
        };
        let expect = match admin_data_len(cmd) {
            Ok(n) => n,
            Err(why) => return refuse(&why),
        };
        let prps = match (expect, cmd.data) {
            (None, None) => None,
            (None, Some(_)) => return refuse("its opcode says it moves no data"),
            (Some(n), None) => return refuse(&format!("it moves {n} bytes and has no payload")),
            (Some(n), Some(p)) => {
                if p.len != n {
                    return refuse(&format!("it moves {n} bytes, the payload holds {}", p.len));
                }
                if let Some(why) = self.instance().refuses(&p.map.ctrl) {
                    return refuse(&why);
                }
                let needs = match cmd.opcode & 3 {
                    1 => PeerAccess::ReadOnly,
                    2 => PeerAccess::WriteOnly,
                    _ => PeerAccess::ReadWrite,
                };
                if p.map.access != PeerAccess::ReadWrite && p.map.access != needs {
                    return refuse(&format!(
                        "the payload is mapped {:?}, the command needs {needs:?}",
                        p.map.access
                    ));
                }
                let d = p.prps().map_err(Error::InvalidArgument)?;
                if d.pages.len() > LIST_ENTRIES {
                    return refuse("the payload needs more than one PRP list page");
                }
                Some(d)
            }
        };
        let raw = Command {
            opcode: cmd.opcode,
            nsid: cmd.nsid,
            cdw: cmd.cdw,
            ..Default::default()
        };
        let r = self.admin_with(&raw, prps.as_ref(), timeout);
        if prps.is_some() {
            // The payload goes back to its owner now.
            self.health.release_or_abort("an admin command's payload");
        }
        r
    }

    /// Runs `cmd` exactly as given on the admin queue: PRP1 and PRP2 are
    /// the caller's. Otherwise as [`Controller::admin`], without its
    /// refusals.
    ///
    /// # Safety
    ///
    /// The command must move data only to and from memory the caller owns,
    /// mapped for this controller (PRPs, and any PRP list they point at,
    /// built for exactly the bytes the command moves), which stays mapped
    /// and is not otherwise used until this returns; it must give the
    /// controller no memory to use after its completion; it must not
    /// change the queues this controller was set up with; it must not keep
    /// from this library the events that announce namespace changes (an
    /// Asynchronous Event Request, a read of the Changed Namespace List
    /// that does not retain the event, an Asynchronous Event Configuration
    /// without Namespace Attribute Notices); and a command that changes a
    /// namespace's size or format must have no command for that namespace
    /// in flight on any queue, and be followed by [`Controller::rescan`]
    /// before the next.
    pub unsafe fn admin_raw(&self, cmd: &Command, timeout: Option<Duration>) -> Result<Completion> {
        let r = self.admin_with(cmd, None, timeout);
        self.health.release_or_abort("an admin command's memory");
        r
    }

    fn admin_with(
        &self,
        cmd: &Command,
        data: Option<&DataPtr>,
        timeout: Option<Duration>,
    ) -> Result<Completion> {
        let what = format!("admin command {:#04x}", cmd.opcode);
        let timeout = timeout.unwrap_or(self.timeout);
        let t = self
            .admin
            .submit(cmd, data, (Some(Instant::now() + timeout), 0), true)
            .map_err(|e| self.wait_error(e, &what))?;
        let c = self.finish(&self.admin, t, &what, timeout)?;
        c.check(&what)
            .map(|()| c)
            .map_err(|e| Self::error(&self.bdf, e, rustix::io::Errno::IO))
    }

    /// Waits up to `timeout` for `t` on `q`; aborts it when it takes too
    /// long, and fails the controller when the abort does not end it.
    pub(super) fn finish(
        &self,
        q: &QueuePair,
        t: Ticket,
        what: &str,
        timeout: Duration,
    ) -> Result<Completion> {
        match q.wait(&t, Instant::now() + timeout) {
            Ok(c) => Ok(c),
            Err(WaitError::Timeout) => {
                let cid = t.cid;
                let abort = self.admin_command(&Command {
                    opcode: admin::ABORT,
                    cdw: [u32::from(q.qid()) | u32::from(cid) << 16, 0, 0, 0, 0, 0],
                    ..Default::default()
                });
                let said = match &abort {
                    Ok(c) if c.result & 1 == 0 => "the controller aborted it".to_string(),
                    Ok(_) => "the controller did not abort it".to_string(),
                    Err(e) => format!("the abort failed: {e}"),
                };
                let grace = timeout.min(Duration::from_secs(5));
                match q.wait(&t, Instant::now() + grace) {
                    Ok(c) if c.sct() == 0 && c.sc() == 0 => Ok(c),
                    Ok(c) => Err(Self::error(
                        &self.bdf,
                        format!(
                            "{what} (command id {cid} on queue {}) took longer than {:?} and was aborted ({said}; status SCT {:#x} SC {:#x})",
                            q.qid(),
                            timeout,
                            c.sct(),
                            c.sc()
                        ),
                        rustix::io::Errno::TIMEDOUT,
                    )),
                    Err(WaitError::Timeout) => {
                        let why = format!(
                            "{what} (command id {cid} on queue {}) did not complete within {:?}, and {said}",
                            q.qid(),
                            timeout
                        );
                        self.health.fail(why.clone());
                        q.forget(t);
                        Err(Self::error(&self.bdf, why, rustix::io::Errno::TIMEDOUT))
                    }
                    Err(e) => Err(self.wait_error(e, what)),
                }
            }
            Err(e) => Err(self.wait_error(e, what)),
        }
    }

    /// Deletes the I/O queues (submission queues first), shuts the
    /// controller down within the time it reports (RTD3E), and disables
    /// it; whether it is stopped.
    fn shut_down(&self) -> bool {
        let bar = &self.func.bar;
        if self.health.failure().is_none() {
            let mut deleted = true;
            for q in self.io.iter().rev() {
                for opcode in [admin::DELETE_IO_SQ, admin::DELETE_IO_CQ] {
                    deleted &= self
                        .admin_with(
                            &Command {
                                opcode,
                                cdw: [u32::from(q.qid()), 0, 0, 0, 0, 0],
                                ..Default::default()
                            },
                            None,
                            Some(DELETE_TIMEOUT),
                        )
                        .is_ok();
                }
            }
            let caps = nvme::Caps::decode(bar.read64(nvme::reg::CAP).unwrap_or(0));
            let shutdown_time = match self.ident.rtd3e {
                0 => caps.timeout,
                us => Duration::from_micros(u64::from(us)).max(Duration::from_millis(500)),
            };
            if deleted && registers::shutdown(bar, shutdown_time, caps.timeout).is_ok() {
                return true;
            }
        }
        self.health.stop()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // No revocation runs from here on.
        drop(self.watch.take());
        // Stopped before its memory goes back to the module: no command it
        // held writes there afterwards. A controller that nothing stops
        // keeps the memory.
        if self.shut_down() {
            // SAFETY: The queue memory's mapping, unused by the stopped
            // controller.
            let _ = unsafe { self.module.unmap_raw(self.map.map_handle()) };
            // SAFETY: Dropped once, here; nothing uses it afterwards.
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        } else {
            // Said as far as standard error takes it: a panic here would
            // unwind out of the drop.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "p2pdma: the NVMe controller {} could not be stopped ({}); its queue memory stays allocated until the process ends",
                self.bdf,
                self.health.failure().unwrap_or_default()
            );
        }
    }
}
