//! Accelerator-direct NVMe: a controller that this process drives itself,
//! with its queues in accelerator memory.
//!
//! [`Controller::initialize`] takes an NVMe controller that no kernel driver
//! or filesystem uses (see [`claim`]) through VFIO, resets it and creates
//! its admin queue and I/O queue pairs in accelerator memory allocated from
//! the p2pdma module and DMA-mapped for the controller (`DMA_MAP`); the
//! doorbells are the controller's BAR0, mapped into this process. From
//! there no I/O enters the kernel: submitters write commands into the
//! submission queues, ring the doorbells and poll the completion queues
//! themselves, many threads at once (see [`qpair`] for the algorithm, the
//! one accelerator threads run). Data moves between the namespace and any
//! memory the controller can reach: accelerator memory (`DMA_MAP`) or host
//! memory pinned for it (`PIN_USER`), see [`Controller::map`].
//!
//! A command that completes with an error status is that command's error.
//! One that does not complete in time is aborted; if the abort does not end
//! it, the controller is disabled (ending all its DMA) and every request
//! gets an error. A process that dies leaves the controller to vfio-pci,
//! which resets it; the next `initialize` resets it again before use.
//!
//! Only VFIO's no-IOMMU mode is supported: behind an IOMMU, VFIO cannot map
//! the module's memory for the controller ([`IommuMode::describe`] says
//! why).

pub mod claim;
mod qpair;
pub mod spec;
pub mod vfio;

use std::{
    fmt,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

pub use claim::IommuMode;
pub use spec::{Command, Completion, DataPtr, IdCtrl, IdNs};

use crate::{
    backend::{DeviceMemory, MemoryKind, ModuleMemory},
    dma::{DmaMapping, MapType, PeerAccess},
    Error, Module, PciAddress, Peer, Result,
};
use qpair::{Health, Place, QueuePair, Ticket, WaitError};
use spec::{admin, io, PAGE};

/// Admin queue entries.
const ADMIN_ENTRIES: u16 = 16;
/// The largest data transfer of one command this library builds: one PRP
/// list page beyond the first page.
const MAX_COMMAND_BYTES: usize = 1 << 20;

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
    /// only poll (as accelerator threads do). Where the controller has no
    /// MSI-X vector to spare, the queues are polled whatever this says.
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

/// A namespace of the controller, from IDENTIFY NAMESPACE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace id.
    pub nsid: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Metadata bytes per block (namespaces with metadata are not served).
    pub metadata: u16,
}

impl NamespaceInfo {
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// An NVM command: what, where, and the data pointer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoCommand {
    /// [`io::READ`], [`io::WRITE`] or [`io::FLUSH`].
    pub opcode: u8,
    /// Namespace.
    pub nsid: u32,
    /// First logical block.
    pub slba: u64,
    /// Logical blocks (1 to 65536; ignored by FLUSH).
    pub blocks: u32,
    /// The data, for READ and WRITE.
    pub data: Option<DataPtr>,
}

impl IoCommand {
    /// A READ of `blocks` blocks at `slba` into `data`.
    pub fn read(nsid: u32, slba: u64, blocks: u32, data: DataPtr) -> Self {
        Self {
            opcode: io::READ,
            nsid,
            slba,
            blocks,
            data: Some(data),
        }
    }

    /// A WRITE of `blocks` blocks at `slba` from `data`.
    pub fn write(nsid: u32, slba: u64, blocks: u32, data: DataPtr) -> Self {
        Self {
            opcode: io::WRITE,
            ..Self::read(nsid, slba, blocks, data)
        }
    }

    /// A FLUSH of namespace `nsid`.
    pub fn flush(nsid: u32) -> Self {
        Self {
            opcode: io::FLUSH,
            nsid,
            slba: 0,
            blocks: 0,
            data: None,
        }
    }

    fn name(&self) -> &'static str {
        match self.opcode {
            io::READ => "READ",
            io::WRITE => "WRITE",
            io::FLUSH => "FLUSH",
            _ => "command",
        }
    }
}

/// Where the queues live in the accelerator allocation.
#[derive(Clone, Copy, Debug)]
struct Layout {
    entries: u16,
    queues: u16,
}

impl Layout {
    fn admin_sq() -> usize {
        0
    }
    fn admin_cq() -> usize {
        PAGE
    }
    fn admin_lists() -> usize {
        2 * PAGE
    }
    fn identify() -> usize {
        (2 + usize::from(ADMIN_ENTRIES) - 1) * PAGE
    }
    fn queue_bytes(&self) -> usize {
        let e = usize::from(self.entries);
        round_page(64 * e) + round_page(16 * e) + (e - 1) * PAGE
    }
    /// The submission queue, completion queue and list pages of I/O queue
    /// `i` (0-based).
    fn queue(&self, i: usize) -> (usize, usize, usize) {
        let e = usize::from(self.entries);
        let sq = Self::identify() + PAGE + i * self.queue_bytes();
        let cq = sq + round_page(64 * e);
        (sq, cq, cq + round_page(16 * e))
    }
    fn total(&self) -> usize {
        Self::identify() + PAGE + usize::from(self.queues) * self.queue_bytes()
    }
}

fn round_page(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

/// An NVMe controller driven by this process, its queues in accelerator
/// memory. Thread-safe: any number of threads submit and wait at once.
/// Dropping it shuts the controller down (it stays bound to vfio-pci; see
/// [`claim::give_back`]).
pub struct Controller {
    pci: PciAddress,
    bdf: String,
    module: Arc<Module>,
    mode: IommuMode,
    /// Queues, PRP lists and the IDENTIFY page, in accelerator memory.
    mem: ModuleMemory,
    map: DmaMapping,
    health: Arc<Health>,
    admin: QueuePair,
    io: Vec<QueuePair>,
    ident: IdCtrl,
    namespaces: Vec<NamespaceInfo>,
    max_transfer: usize,
    timeout: Duration,
    next: AtomicUsize,
    /// MSI-X vectors in use, or why the queues are polled only.
    interrupts: std::result::Result<usize, String>,
    // Last: closed after the controller is disabled and the memory freed.
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
    fn error(bdf: &str, reason: impl Into<String>, source: rustix::io::Errno) -> Error {
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
        let mode = claim::take(&bdf, opts.unbind).map_err(fail)?;
        let mut func = vfio::Function::open_noiommu(&bdf).map_err(fail)?;
        // Released before the module's file when this process dies, so
        // nothing the controller still holds writes freed memory.
        func.device
            .keep_above(std::os::fd::AsFd::as_fd(&*module))
            .map_err(fail)?;
        let bar = func.bar.clone();
        let io_err = |r: String| Self::error(&bdf, r, rustix::io::Errno::IO);
        let caps = spec::Caps::decode(bar.read64(spec::reg::CAP).map_err(io_err)?);
        // Stopped before any memory is handed to it: whatever a previous
        // owner left running ends here.
        spec::disable(&bar, caps.timeout).map_err(io_err)?;
        let entries = opts.entries.min(caps.mqes.min(4096) as u16);
        let layout = Layout {
            entries,
            queues: opts.queues,
        };
        let mem = ModuleMemory::alloc(module.clone(), accel, layout.total() as u64, 0)?;
        mem.write_at(0, &vec![0u8; layout.total()])?;
        let map = module.dma_map_access(
            mem.handle(),
            0,
            layout.total() as u64,
            Peer::Pci(pci),
            PeerAccess::ReadWrite,
        )?;
        let unmap = |e: Error| {
            let _ = module.unmap(map.map_handle);
            e
        };
        if map.map_type == MapType::NotSupported {
            return Err(unmap(Self::error(
                &bdf,
                format!("the kernel does not let it reach accelerator {accel}'s memory"),
                rustix::io::Errno::REMOTEIO,
            )));
        }
        let base = mem.mapping().as_ptr();
        let place = |off: usize, len: usize| -> Result<Place> {
            let at = |o: usize| spec::seg_addr(&map.segs, o as u64);
            match (at(off), at(off + len - 1)) {
                (Some(bus), Some(last)) if last == bus + len as u64 - 1 && bus % PAGE as u64 == 0 => {
                    Ok(Place {
                        // Used by the queue pairs only, which the mapping
                        // outlives.
                        cpu: base.wrapping_add(off),
                        bus,
                    })
                }
                _ => Err(Error::InvalidArgument(format!(
                    "bytes {off}..{} of the queue memory are not contiguous for the controller: {:x?}",
                    off + len,
                    map.segs
                ))),
            }
        };
        let health = Arc::new(Health::new(bar.clone(), caps.timeout));
        let admin = QueuePair::new(
            0,
            ADMIN_ENTRIES,
            (
                place(Layout::admin_sq(), PAGE).map_err(unmap)?,
                place(Layout::admin_cq(), PAGE).map_err(unmap)?,
                place(Layout::admin_lists(), PAGE).map_err(unmap)?,
            ),
            bar.clone(),
            caps.doorbell_stride,
            health.clone(),
            None,
        );
        let (asq, acq) = admin.bus();
        spec::enable(&bar, ADMIN_ENTRIES, asq, acq).map_err(|e| unmap(io_err(e)))?;
        let mut ctrl = Self {
            pci,
            bdf: bdf.clone(),
            module: module.clone(),
            mode,
            mem,
            map: map.clone(),
            health,
            admin,
            io: Vec::new(),
            ident: IdCtrl {
                serial: String::new(),
                model: String::new(),
                mdts: 0,
                nn: 0,
            },
            namespaces: Vec::new(),
            max_transfer: MAX_COMMAND_BYTES,
            timeout: opts.timeout,
            next: AtomicUsize::new(0),
            interrupts: Err("no I/O queue yet".into()),
            func,
        };
        // From here `ctrl`'s drop disables the controller and unmaps.
        let id_page = place(Layout::identify(), PAGE)?;
        let mut page = vec![0u8; PAGE];
        ctrl.identify(1, 0, id_page.bus, &mut page)?;
        ctrl.ident = IdCtrl::decode(&page).map_err(io_err)?;
        if ctrl.ident.mdts > 0 {
            let mdts = caps.mps_min.checked_shl(u32::from(ctrl.ident.mdts));
            ctrl.max_transfer = mdts.unwrap_or(usize::MAX).min(MAX_COMMAND_BYTES);
        }
        ctrl.identify(2, 0, id_page.bus, &mut page)?;
        let nsids: Vec<u32> = page
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .take_while(|&n| n != 0)
            .collect();
        for nsid in nsids {
            ctrl.identify(0, nsid, id_page.bus, &mut page)?;
            let ns = IdNs::decode(&page).map_err(io_err)?;
            ctrl.namespaces.push(NamespaceInfo {
                nsid,
                blocks: ns.nsze,
                block_size: ns.block_size,
                metadata: ns.metadata,
            });
        }
        // Number of Queues: 0-based counts asked for and granted.
        let want = u32::from(opts.queues - 1);
        let granted = ctrl.admin_command(&Command {
            opcode: admin::SET_FEATURES,
            cdw: [admin::FEATURE_NUM_QUEUES, want << 16 | want, 0, 0, 0, 0],
            ..Default::default()
        })?;
        let n = (granted.result & 0xffff)
            .min(granted.result >> 16)
            .min(want)
            + 1;
        let vectors = if opts.interrupts {
            ctrl.enable_msix(n as usize)
        } else {
            Err("interrupts were not asked for".into())
        };
        let fds = vectors.as_deref().unwrap_or_default();
        for i in 0..n as usize {
            let vector = Self::vector_of(i as u16 + 1, fds.len());
            let (sq, cq, lists) = layout.queue(i);
            let qp = QueuePair::new(
                i as u16 + 1,
                entries,
                (
                    place(sq, 64 * usize::from(entries))?,
                    place(cq, 16 * usize::from(entries))?,
                    place(lists, PAGE)?,
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
        Ok(Arc::new(ctrl))
    }

    /// The MSI-X vector of I/O queue `qid` among `vectors` (vector 0 is
    /// the admin queue's): its own, or a shared one when there are fewer.
    fn vector_of(qid: u16, vectors: usize) -> Option<usize> {
        (vectors > 1).then(|| 1 + (usize::from(qid) - 1) % (vectors - 1))
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
                    rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
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

    fn failed(&self, why: String) -> Error {
        Self::error(&self.bdf, why, rustix::io::Errno::IO)
    }

    /// Runs an admin command and checks its status.
    fn admin_command(&self, cmd: &Command) -> Result<Completion> {
        let what = format!("admin command {:#04x}", cmd.opcode);
        let deadline = Instant::now() + self.timeout;
        let t = self
            .admin
            .submit(cmd, None, Some(deadline), true)
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

    fn wait_error(&self, e: WaitError, what: &str) -> Error {
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

    fn identify(&self, cns: u8, nsid: u32, bus: u64, out: &mut [u8]) -> Result<()> {
        self.admin_command(&Command {
            opcode: admin::IDENTIFY,
            nsid,
            prp1: bus,
            cdw: [u32::from(cns), 0, 0, 0, 0, 0],
            ..Default::default()
        })?;
        self.mem.read_at(Layout::identify(), out)
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

    /// Its PCI address.
    pub fn pci(&self) -> PciAddress {
        self.pci
    }

    /// IDENTIFY CONTROLLER's serial, model, MDTS and namespace count.
    pub fn identity(&self) -> &IdCtrl {
        &self.ident
    }

    /// Its active namespaces.
    pub fn namespaces(&self) -> &[NamespaceInfo] {
        &self.namespaces
    }

    /// Namespace `nsid`, if active.
    pub fn namespace_info(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }

    /// I/O queue pairs.
    pub fn queue_count(&self) -> usize {
        self.io.len()
    }

    /// Commands each I/O queue holds at once.
    pub fn queue_depth(&self) -> usize {
        self.io.first().map_or(0, QueuePair::depth)
    }

    /// The largest transfer of one command, in bytes.
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

    /// Why the controller failed, if it did (it is then disabled: a new
    /// [`Controller::initialize`] resets it).
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

    /// Makes `len` bytes at `offset` of `mem` reachable by the controller:
    /// accelerator memory through `DMA_MAP`, host memory through `PIN_USER`.
    /// The range is widened to whole pages; [`Mapped::data`] counts from
    /// `offset`. Unmapped when the result is dropped.
    pub fn map<'m>(
        &self,
        mem: &'m dyn DeviceMemory,
        offset: usize,
        len: usize,
        access: PeerAccess,
    ) -> Result<Mapped<'m>> {
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
        let dma = match (mem.module_allocation(), mem.kind()) {
            (Some((module, handle)), MemoryKind::ModuleBar { .. }) => {
                let m = module.dma_map_access(
                    handle,
                    start as u64,
                    (end - start) as u64,
                    Peer::Pci(self.pci),
                    access,
                )?;
                (module.clone(), m)
            }
            (_, MemoryKind::Host) => {
                let target = mem.dma_target().ok_or_else(|| Error::PathUnavailable {
                    path: "queues",
                    reason: "the host memory has no mapping to pin".into(),
                })?;
                let va = target.ptr as u64 + start as u64;
                let m = self.module.pin_user_access(
                    va,
                    (end - start) as u64,
                    Peer::Pci(self.pci),
                    access,
                )?;
                (self.module.clone(), m)
            }
            (None, kind) => {
                return Err(Error::PathUnavailable {
                    path: "queues",
                    reason: format!("{kind} was not allocated from the module"),
                })
            }
        };
        let (module, map) = dma;
        if map.map_type == MapType::NotSupported {
            let _ = module.unmap(map.map_handle);
            return Err(Error::PathUnavailable {
                path: "queues",
                reason: format!("the controller {} cannot reach {}", self.bdf, mem.kind()),
            });
        }
        Ok(Mapped {
            module,
            map,
            skip: offset - start,
            len,
            _mem: std::marker::PhantomData,
        })
    }

    /// Submits `cmd` on I/O queue `queue` (taken modulo the queue count),
    /// waiting for room while the queue is full. A thread that already has
    /// commands in flight uses [`Controller::try_submit`] instead, or it
    /// may wait for room that only its own commands hold.
    pub fn submit(&self, queue: usize, cmd: &IoCommand) -> Result<Pending<'_>> {
        self.submit_with(queue, cmd, Some(Instant::now() + self.timeout), true)
    }

    /// Submits `cmd` on I/O queue `queue` if it has room now; `Ok(None)`
    /// when it is full (wait for one of this thread's commands, then try
    /// again).
    pub fn try_submit(&self, queue: usize, cmd: &IoCommand) -> Result<Option<Pending<'_>>> {
        self.try_submit_with(queue, cmd, true)
    }

    /// Commands for I/O queue `queue` whose doorbell is rung once for all:
    /// see [`Batch`].
    pub fn batch(&self, queue: usize) -> Batch<'_> {
        Batch {
            ctrl: self,
            queue,
            unrung: 0,
        }
    }

    fn try_submit_with(
        &self,
        queue: usize,
        cmd: &IoCommand,
        ring: bool,
    ) -> Result<Option<Pending<'_>>> {
        match self.submit_with(queue, cmd, None, ring) {
            Ok(p) => Ok(Some(p)),
            Err(Error::Controller { source, .. }) if source == rustix::io::Errno::AGAIN => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn submit_with(
        &self,
        queue: usize,
        cmd: &IoCommand,
        deadline: Option<Instant>,
        ring: bool,
    ) -> Result<Pending<'_>> {
        if self.io.is_empty() {
            return Err(self.failed("no I/O queue".into()));
        }
        let q = &self.io[queue % self.io.len()];
        let cdw = match cmd.opcode {
            io::READ | io::WRITE => {
                if cmd.blocks == 0 || cmd.blocks > 0x1_0000 || cmd.data.is_none() {
                    return Err(Error::InvalidArgument(format!(
                        "{} of {} blocks{}",
                        cmd.name(),
                        cmd.blocks,
                        if cmd.data.is_none() {
                            " without data"
                        } else {
                            ""
                        }
                    )));
                }
                [
                    cmd.slba as u32,
                    (cmd.slba >> 32) as u32,
                    cmd.blocks - 1,
                    0,
                    0,
                    0,
                ]
            }
            io::FLUSH => [0; 6],
            op => {
                return Err(Error::InvalidArgument(format!(
                    "opcode {op:#04x} is not READ, WRITE or FLUSH"
                )))
            }
        };
        let raw = Command {
            opcode: cmd.opcode,
            nsid: cmd.nsid,
            cdw,
            ..Default::default()
        };
        let t = q
            .submit(&raw, cmd.data.as_ref(), deadline, ring)
            .map_err(|e| self.wait_error(e, &format!("{} on queue {}", cmd.name(), q.qid())))?;
        let bs = self
            .namespace_info(cmd.nsid)
            .map_or(1, |n| u64::from(n.block_size));
        Ok(Pending {
            ctrl: self,
            q,
            ticket: Some(t),
            what: cmd.name(),
            offset: cmd.slba.saturating_mul(bs),
            len: u64::from(cmd.blocks) * bs,
        })
    }

    /// A queue index for the calling thread's next command: queues are
    /// handed out in turn.
    pub fn next_queue(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs an admin command that this library does not build itself (a
    /// log page, a feature, a vendor command), with `data` (memory mapped
    /// by [`Controller::map`]) if it moves any, and waits up to `timeout`
    /// (the controller's own when `None`). One that takes longer is aborted
    /// as I/O commands are: its error says whether the controller aborted
    /// it, and when the abort does not end it, the controller is disabled.
    /// The commands that manage the queues this controller was set up with
    /// (create, delete, abort) are refused. An error status is an error.
    pub fn admin(
        &self,
        cmd: &Command,
        data: Option<&DataPtr>,
        timeout: Option<Duration>,
    ) -> Result<Completion> {
        if matches!(
            cmd.opcode,
            admin::DELETE_IO_SQ
                | admin::CREATE_IO_SQ
                | admin::DELETE_IO_CQ
                | admin::CREATE_IO_CQ
                | admin::ABORT
        ) {
            return Err(Error::InvalidArgument(format!(
                "admin opcode {:#04x} manages the queues this library set up on {}",
                cmd.opcode, self.bdf
            )));
        }
        let what = format!("admin command {:#04x}", cmd.opcode);
        let timeout = timeout.unwrap_or(self.timeout);
        let t = self
            .admin
            .submit(cmd, data, Some(Instant::now() + timeout), true)
            .map_err(|e| self.wait_error(e, &what))?;
        let c = self.finish(&self.admin, t, &what, timeout)?;
        c.check(&what)
            .map(|()| c)
            .map_err(|e| Self::error(&self.bdf, e, rustix::io::Errno::IO))
    }

    /// Waits up to `timeout` for `t` on `q`; aborts it when it takes too
    /// long, and fails the controller when the abort does not end it.
    fn finish(
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
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Stopped before its memory goes back to the module: no command it
        // held writes there afterwards.
        let bar = &self.func.bar;
        let timeout = spec::Caps::decode(bar.read64(spec::reg::CAP).unwrap_or(0)).timeout;
        if spec::shutdown(bar, timeout).is_err() {
            let _ = spec::disable(bar, timeout);
        }
        let _ = self.module.unmap(self.map.map_handle);
    }
}

/// A command in flight; [`Pending::wait`] for it. Dropping it waits too
/// (a command's data must not be freed while the controller may move it).
pub struct Pending<'c> {
    ctrl: &'c Controller,
    q: &'c QueuePair,
    ticket: Option<Ticket>,
    what: &'static str,
    /// The command's range in bytes (in blocks when the namespace is not
    /// active).
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
        let c = self.ctrl.finish(self.q, t, self.what, self.ctrl.timeout)?;
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
pub struct Batch<'c> {
    ctrl: &'c Controller,
    queue: usize,
    unrung: usize,
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("queue", &self.queue)
            .field("unrung", &self.unrung)
            .finish()
    }
}

impl<'c> Batch<'c> {
    /// Writes `cmd` into the queue if it has room now; `Ok(None)` when it
    /// is full (as [`Controller::try_submit`]).
    pub fn try_push(&mut self, cmd: &IoCommand) -> Result<Option<Pending<'c>>> {
        let p = self.ctrl.try_submit_with(self.queue, cmd, false)?;
        self.unrung += usize::from(p.is_some());
        Ok(p)
    }

    /// Rings the doorbell for everything written so far.
    pub fn ring(&mut self) {
        if self.unrung > 0 && !self.ctrl.io.is_empty() {
            self.ctrl.io[self.queue % self.ctrl.io.len()].ring();
        }
        self.unrung = 0;
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.ring();
    }
}

/// Memory mapped for the controller by [`Controller::map`]; unmapped on
/// drop. Borrows the memory, which therefore outlives the mapping.
#[derive(Debug)]
pub struct Mapped<'m> {
    module: Arc<Module>,
    map: DmaMapping,
    /// Bytes between the first mapped page and the range asked for.
    skip: usize,
    len: usize,
    _mem: std::marker::PhantomData<&'m dyn DeviceMemory>,
}

impl Mapped<'_> {
    /// The controller's address of byte `offset` of the range.
    pub fn addr(&self, offset: usize) -> Option<u64> {
        (offset < self.len)
            .then(|| spec::seg_addr(&self.map.segs, (self.skip + offset) as u64))
            .flatten()
    }

    /// The data pointer of `len` bytes at `offset` of the range (PRP1 and
    /// the page addresses after it).
    pub fn data(&self, offset: usize, len: usize) -> Result<DataPtr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(Error::OutOfBounds {
                    offset: offset as u64,
                    len: len as u64,
                    size: self.len as u64,
                })
            }
        }
        spec::data_ptr(|o| self.addr(o), offset, len).map_err(Error::InvalidArgument)
    }

    /// What the module returned.
    pub fn mapping(&self) -> &DmaMapping {
        &self.map
    }
}

impl Drop for Mapped<'_> {
    fn drop(&mut self) {
        let _ = self.module.unmap(self.map.map_handle);
    }
}
