//! Revocation while a controller driven from user space has commands in
//! flight: its driver (vfio-pci) unbound, or the accelerator whose memory
//! holds its queues and data unbound. The unbind waits until the library
//! has stopped the controller; once it returns, nothing the controller was
//! given changes any more: canary bytes written then into the host and
//! accelerator memory stay, and the BAR (read through sysfs, as the host's
//! backing file holds it) does not change.

use std::{
    os::fd::AsFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use p2pdma_tests::first_accelerator;

use p2pdma::memory::DmaMemory;

use p2pdma::{
    memory::{DeviceMemory, HandleState, HostMemory, ModuleMemory},
    queues::{claim, Controller, IoCommand, Mapped},
    sys::vfio,
    Module, PciAddress, Peer, PeerAccess,
};

const M: usize = 1 << 20;
/// Bytes of each memory the reads land in.
const SPAN: usize = 4 * M;
/// Each read.
const READ: usize = 64 << 10;
const CANARY: u8 = 0x5a;

/// Reads from `threads` threads into both mappings, each in a scope of its
/// own, until a read fails; returns the reads that landed and the first
/// error of each thread.
fn read_until_failure(
    ctrl: &Controller,
    nsid: u32,
    (block, blocks): (u32, u64),
    maps: [&Mapped<'_>; 2],
    started: &AtomicU64,
) -> Vec<String> {
    thread::scope(|s| {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn(move || -> String {
                    let mut n = t;
                    loop {
                        n = n
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let map = maps[(n >> 40) as usize % 2];
                        let at = (n >> 20) as usize % (SPAN / READ) * READ;
                        let per = u64::from(READ as u32 / block);
                        let slba = (n >> 8) % (blocks / per) * per;
                        let r = ctrl.scope(|sc| {
                            let payload = map.payload(at, READ)?;
                            let cmd = IoCommand::read(nsid, slba, READ as u32 / block, payload);
                            let q = ctrl.next_queue();
                            sc.submit(q, &cmd).and_then(|p| p.wait())
                        });
                        match r {
                            Ok(_) => {
                                started.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => return e.to_string(),
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| "a reader panicked".into()))
            .collect()
    })
}

/// Writes `CANARY` over `mem`, waits, and checks that it stayed.
fn canaries_stay(what: &str, mem: &dyn DeviceMemory) -> Result<(), String> {
    mem.write_at(0, &vec![CANARY; SPAN])
        .map_err(|e| format!("{what}: {e}"))?;
    thread::sleep(Duration::from_secs(1));
    let mut got = vec![0u8; SPAN];
    mem.read_at(0, &mut got)
        .map_err(|e| format!("{what}: {e}"))?;
    match got.iter().position(|&b| b != CANARY) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: byte {i} changed to {:#04x} after the unbind returned",
            got[i]
        )),
    }
}

/// A BAR of a PCI function mapped through its sysfs resource file (as the
/// host's backing file holds it), reached only by volatile copies.
#[derive(Debug)]
struct BarWindow {
    base: *mut u8,
    len: usize,
}

// SAFETY: The mapping is reached only by volatile copies, from any thread.
unsafe impl Send for BarWindow {}
// SAFETY: As above.
unsafe impl Sync for BarWindow {}

impl BarWindow {
    /// The first `len` bytes (the whole BAR when `None`) of BAR `bar` of
    /// `pci`.
    fn open(pci: &str, bar: u8, len: Option<usize>) -> Result<Self, String> {
        let path = format!("/sys/bus/pci/devices/{pci}/resource{bar}");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("{path}: {e}"))?;
        let len = match len {
            Some(n) => n,
            None => f.metadata().map_err(|e| e.to_string())?.len() as usize,
        };
        // SAFETY: A fresh shared mapping of the BAR, reached only through
        // volatile copies and unmapped on drop.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                f.as_fd(),
                0,
            )
        }
        .map_err(|e| format!("mmap of {path}: {e}"))?;
        Ok(Self {
            base: base.cast(),
            len,
        })
    }

    fn check(&self, offset: usize, len: usize) -> p2pdma::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(p2pdma::Error::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> p2pdma::Result<()> {
        self.check(offset, src.len())?;
        for (i, &b) in src.iter().enumerate() {
            // SAFETY: Inside the mapping (checked above).
            unsafe { std::ptr::write_volatile(self.base.add(offset + i), b) };
        }
        Ok(())
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> p2pdma::Result<()> {
        self.check(offset, dst.len())?;
        for (i, b) in dst.iter_mut().enumerate() {
            // SAFETY: Inside the mapping (checked above).
            *b = unsafe { std::ptr::read_volatile(self.base.add(offset + i)) };
        }
        Ok(())
    }
}

impl Drop for BarWindow {
    fn drop(&mut self) {
        // SAFETY: The mapping made in `open`, unused from here.
        let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.len) };
    }
}

/// The whole BAR of accelerator `pci`, read through its sysfs resource file.
fn bar_bytes(pci: &str, bar: u8) -> Result<Vec<u8>, String> {
    let w = BarWindow::open(pci, bar, None)?;
    let mut v = vec![0u8; w.len];
    w.read_at(0, &mut v).map_err(|e| e.to_string())?;
    Ok(v)
}

fn unbind(driver: &str, pci: &str) -> Result<Duration, String> {
    let t0 = Instant::now();
    std::fs::write(format!("/sys/bus/pci/drivers/{driver}/unbind"), pci)
        .map_err(|e| format!("unbinding {pci} from {driver}: {e}"))?;
    Ok(t0.elapsed())
}

/// Unbinds `driver` from `pci` (from another thread) while reads run, and
/// checks what the issue asks: the reads end with the revocation, and the
/// memory does not change after the unbind returned.
fn under_reads(
    ctrl: &Controller,
    nsid: u32,
    memories: (&ModuleMemory, &HostMemory),
    driver: &str,
    pci: &str,
    accel_bar: Option<(String, u8)>,
) -> Result<(), String> {
    let ns = ctrl
        .namespace_info(nsid)
        .ok_or_else(|| format!("namespace {nsid} is not active"))?;
    let err = |e: p2pdma::Error| e.to_string();
    let ma = ctrl
        .map(memories.0, 0, SPAN, PeerAccess::WriteOnly)
        .map_err(err)?;
    let mh = ctrl
        .map(memories.1, 0, SPAN, PeerAccess::WriteOnly)
        .map_err(err)?;
    let started = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let (errors, took, after) = thread::scope(|s| -> Result<_, String> {
        let readers = s.spawn(|| {
            read_until_failure(ctrl, nsid, (ns.block_size, ns.blocks), [&ma, &mh], &started)
        });
        while started.load(Ordering::Relaxed) < 16 {
            if readers.is_finished() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let took = unbind(driver, pci);
        done.store(true, Ordering::Release);
        // The host memory is this process's whatever happened; the
        // accelerator's is gone with the unbind, read through sysfs.
        let after = match &accel_bar {
            Some((apci, bar)) => Some(bar_bytes(apci, *bar)?),
            None => None,
        };
        let host = canaries_stay("host memory", memories.1);
        let errors = readers.join().map_err(|_| "the readers panicked")?;
        host?;
        Ok((errors, took?, after))
    })?;
    let landed = started.load(Ordering::Relaxed);
    println!("{landed} reads landed before the unbind, which took {took:?}; the readers ended with: {errors:?}");
    if landed < 16 {
        return Err(format!(
            "only {landed} reads landed before the unbind (the readers ended with {errors:?})"
        ));
    }
    if let (Some((apci, bar)), Some(before)) = (&accel_bar, after) {
        thread::sleep(Duration::from_secs(1));
        let now = bar_bytes(apci, *bar)?;
        if let Some(i) = before.iter().zip(&now).position(|(a, b)| a != b) {
            return Err(format!(
                "byte {i:#x} of the accelerator's BAR changed after its unbind returned"
            ));
        }
        println!(
            "the accelerator's BAR ({} bytes) did not change after the unbind",
            now.len()
        );
    }
    ended_by_revocation(ctrl, &errors, "the unbind")?;
    drop((ma, mh));
    Ok(())
}

/// Checks that every reader ended with the revocation's error, and the
/// controller with it, after `what`.
fn ended_by_revocation(ctrl: &Controller, errors: &[String], what: &str) -> Result<(), String> {
    if !errors.iter().all(|e| e.contains("revoked")) {
        return Err(format!("a reader ended with another error: {errors:?}"));
    }
    match ctrl.failure() {
        Some(f) if f.contains("revoked") => {
            println!("the controller: {f}");
            Ok(())
        }
        f => Err(format!("after {what} the controller's failure is {f:?}")),
    }
}

/// Waits up to `limit` for `fd` (an eventfd) to be signalled.
fn signalled(fd: &std::os::fd::OwnedFd, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 8];
    while Instant::now() < deadline {
        if matches!(rustix::io::read(fd, &mut buf), Ok(8)) {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The state of mapping `handle`, in words.
fn state(module: &Module, handle: u64) -> Result<HandleState, String> {
    module.handle_state(handle).map_err(|e| e.to_string())
}

/// The module alone, no controller running: host memory pinned for the
/// controller, which this process holds open through vfio-pci. vfio-pci's
/// unbind waits for the device's release; until then the pages stay
/// mapped (the owner is told, and the mapping is not torn down under a
/// device that may still use it); once the device is released the unbind
/// ends and the mapping is revoked.
fn peer_order(module: &Arc<Module>, bdf: &str) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let pci: PciAddress = bdf.parse().map_err(err)?;
    claim::take(bdf, true)?;
    // SAFETY: The function is given no address: nothing is written to its
    // registers, and it is released below.
    let func = unsafe { vfio::Function::open_noiommu(bdf) }?;
    let events = module.watch_revocations().map_err(err)?;
    let host = HostMemory::new(2 * 4096).map_err(err)?;
    let va = host
        .dma()
        .and_then(|d| d.dma_target())
        .ok_or("host memory without an address")?
        .ptr as u64;
    let map = module
        .pin_user_access(va, 4096, Peer::Pci(pci), PeerAccess::ReadWrite)
        .map_err(err)?;
    let handle = map.map_handle();
    let (unbound, held) = thread::scope(|s| -> Result<_, String> {
        let unbinding = s.spawn(|| unbind("vfio-pci", bdf));
        if !signalled(&events, Duration::from_secs(10)) {
            return Err("no revocation was signalled within 10 s of the unbind".into());
        }
        thread::sleep(Duration::from_millis(500));
        let held = state(module, handle)?;
        let blocked = !unbinding.is_finished();
        drop(func);
        let unbound = unbinding.join().map_err(|_| "the unbind panicked")??;
        if !blocked {
            return Err("vfio-pci's unbind returned while this process held the device".into());
        }
        Ok((unbound, held))
    })?;
    println!("while the device was held: {held:?}; the unbind returned {unbound:?} after it started, once the device was released");
    if held == HandleState::Revoked {
        return Err(
            "the pages were unmapped for the controller while vfio-pci still had it (its driver not done with it)".into(),
        );
    }
    match state(module, handle)? {
        HandleState::Revoked => println!("after the unbind the mapping is revoked"),
        s => return Err(format!("after the unbind the mapping is {s:?}")),
    }
    module.unmap(map).map_err(err)?;
    Ok(())
}

/// Rounds of [`unmap_race`], each with a different delay between the
/// device's release and the mappings' release.
const UNMAP_RACE_ROUNDS: u64 = 8;
/// Pages of host memory pinned one by one for the controller, in each of
/// two module files.
const UNMAP_RACE_PAGES: usize = 256;

/// Errors counted by the kernel's DMA-API debugging so far; `None` where
/// the kernel has none.
fn dma_api_errors() -> Option<u64> {
    std::fs::read_to_string("/sys/kernel/debug/dma-api/error_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// See [`Step::UnmapRace`](crate::queues): the controller at `bdf` is
/// taken from its driver, held through vfio-pci, and its host memory is
/// pinned for it page by page through this module file and another; then
/// its vfio-pci unbind starts, and once the owner is told, the device is
/// released while one thread unmaps this file's mappings and another
/// closes the other file. vfio-pci's unbind ends with the release, and the
/// DMA API's debugging (the debug kernel) checks for mappings left for the
/// device when it does: every one must be gone by then, whether its owner
/// or the module tore it down. Each round shifts the releases against each
/// other by a millisecond more. The controller goes back to its driver.
pub fn unmap_race(module: &Arc<Module>, bdf: &str) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let pci: PciAddress = bdf.parse().map_err(err)?;
    let before = dma_api_errors();
    let mut r = Ok(());
    for round in 0..UNMAP_RACE_ROUNDS {
        r = unmap_race_round(module, bdf, pci, Duration::from_millis(round))
            .map_err(|e| format!("round {round}: {e}"));
        if r.is_err() {
            break;
        }
        if let (Some(b), Some(a)) = (before, dma_api_errors()) {
            if a > b {
                r = Err(format!(
                    "round {round}: the DMA API's debugging counted {} error(s) (see the kernel log): a mapping for {bdf} outlived its driver",
                    a - b
                ));
                break;
            }
        }
    }
    let _ = claim::take(bdf, true);
    let driver = claim::give_back(bdf)?;
    r?;
    println!(
        "{UNMAP_RACE_ROUNDS} rounds of {} mappings let go as vfio-pci's unbind ended; {}; {bdf} back to {driver}",
        2 * UNMAP_RACE_PAGES,
        match before {
            Some(_) => "no DMA-API error",
            None => "no DMA-API debugging in this kernel",
        }
    );
    Ok(())
}

/// One round of [`unmap_race`], the close of the other module file
/// `stagger` after the device's release.
fn unmap_race_round(
    module: &Arc<Module>,
    bdf: &str,
    pci: PciAddress,
    stagger: Duration,
) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    claim::take(bdf, true)?;
    // SAFETY: The function is given no address: nothing is written to its
    // registers, and it is released below.
    let func = unsafe { vfio::Function::open_noiommu(bdf) }?;
    let events = module.watch_revocations().map_err(err)?;
    let host = HostMemory::new(UNMAP_RACE_PAGES * 4096).map_err(err)?;
    let va = host
        .dma()
        .and_then(|d| d.dma_target())
        .ok_or("host memory without an address")?
        .ptr as u64;
    let other = Module::open().map_err(err)?;
    let mut maps = Vec::with_capacity(UNMAP_RACE_PAGES);
    for p in 0..UNMAP_RACE_PAGES as u64 {
        let at = va + p * 4096;
        for m in [module.as_ref(), &other] {
            let map = m
                .pin_user_access(at, 4096, Peer::Pci(pci), PeerAccess::ReadWrite)
                .map_err(err)?;
            if std::ptr::eq(m, module.as_ref()) {
                maps.push(map);
            }
        }
    }
    let go = &std::sync::Barrier::new(3);
    thread::scope(|s| -> Result<(), String> {
        let unbinding = s.spawn(|| unbind("vfio-pci", bdf));
        if !signalled(&events, Duration::from_secs(10)) {
            // The unbind waits for the device's release.
            drop(func);
            return Err("no revocation was signalled within 10 s of the unbind".into());
        }
        let unmapper = s.spawn(move || -> Result<(), String> {
            go.wait();
            for m in maps {
                module.unmap(m).map_err(err)?;
            }
            Ok(())
        });
        let closer = s.spawn(move || {
            go.wait();
            thread::sleep(stagger);
            drop(other);
        });
        go.wait();
        let blocked = !unbinding.is_finished();
        drop(func);
        let unbound = unbinding.join().map_err(|_| "the unbind panicked")?;
        let unmapped = unmapper
            .join()
            .map_err(|_| "the unmapping thread panicked")?;
        closer.join().map_err(|_| "the closing thread panicked")?;
        if !blocked {
            return Err("vfio-pci's unbind returned while this process held the device".into());
        }
        unbound?;
        unmapped
    })
}

/// The module alone: accelerator memory mapped for the controller, which
/// this process holds open through vfio-pci. The accelerator's unbind waits
/// until the owner has unmapped it (told by its eventfd); then it ends.
fn accel_order(module: &Arc<Module>, bdf: &str) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let pci: PciAddress = bdf.parse().map_err(err)?;
    let acc = first_accelerator(module)?;
    let apci = acc.pci.to_string();
    claim::take(bdf, true)?;
    // SAFETY: As in `peer_order`.
    let func = unsafe { vfio::Function::open_noiommu(bdf) }?;
    let events = module.watch_revocations().map_err(err)?;
    let mem = ModuleMemory::alloc(module.clone(), acc.index, 1 << 16, 0).map_err(err)?;
    let map = module
        .dma_map_access(
            mem.handle(),
            0,
            1 << 16,
            Peer::Pci(pci),
            PeerAccess::ReadWrite,
        )
        .map_err(err)?;
    let r = thread::scope(|s| -> Result<_, String> {
        let unbinding = s.spawn(|| unbind("p2pdma", &apci));
        if !signalled(&events, Duration::from_secs(10)) {
            return Err(
                "no revocation was signalled within 10 s of the accelerator's unbind".into(),
            );
        }
        thread::sleep(Duration::from_millis(500));
        let blocked = !unbinding.is_finished();
        let held = state(module, map.map_handle())?;
        module.unmap(map).map_err(err)?;
        let unbound = unbinding.join().map_err(|_| "the unbind panicked")??;
        Ok((blocked, held, unbound))
    });
    drop(mem);
    drop(func);
    let bound = std::fs::write("/sys/bus/pci/drivers/p2pdma/bind", &apci)
        .map_err(|e| format!("binding {apci} again: {e}"));
    let (blocked, held, unbound) = r?;
    bound?;
    println!("while mapped for the controller: {held:?}; the unbind took {unbound:?}, ending once the mapping was unmapped");
    if !blocked || held == HandleState::Revoked {
        return Err(format!(
            "the accelerator's unbind revoked memory mapped for a controller that vfio-pci's user still held (it went on: {}, the mapping: {held:?})",
            !blocked
        ));
    }
    Ok(())
}

/// vfio-pci unbound from the controller while reads run.
pub fn peer(ctrl: Arc<Controller>, module: &Arc<Module>, nsid: u32) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let bdf = ctrl.pci().to_string();
    let accel = ModuleMemory::alloc(module.clone(), 0, SPAN as u64, 0).map_err(err)?;
    let host = HostMemory::new(SPAN).map_err(err)?;
    under_reads(&ctrl, nsid, (&accel, &host), "vfio-pci", &bdf, None)?;
    canaries_stay("accelerator memory", &accel)?;
    drop(ctrl);
    let order = peer_order(module, &bdf);
    // Back to the nvme driver whatever happened (the unbind left it with
    // none), for the steps after.
    let _ = claim::take(&bdf, true);
    let driver = claim::give_back(&bdf)?;
    order?;
    println!("{bdf} back to {driver}");
    Ok(())
}

/// The accelerator holding the controller's queues and data unbound while
/// reads run; bound again afterwards.
pub fn accelerator(ctrl: Arc<Controller>, module: &Arc<Module>, nsid: u32) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let bdf = ctrl.pci().to_string();
    let acc = first_accelerator(module)?;
    let apci = acc.pci.to_string();
    let accel = ModuleMemory::alloc(module.clone(), acc.index, SPAN as u64, 0).map_err(err)?;
    let host = HostMemory::new(SPAN).map_err(err)?;
    let r = under_reads(
        &ctrl,
        nsid,
        (&accel, &host),
        "p2pdma",
        &apci,
        Some((apci.clone(), acc.bar)),
    );
    drop(accel);
    drop(ctrl);
    let bound = std::fs::write("/sys/bus/pci/drivers/p2pdma/bind", &apci)
        .map_err(|e| format!("binding {apci} again: {e}"));
    r?;
    bound?;
    let module = Arc::new(Module::open().map_err(err)?);
    accel_order(&module, &bdf)?;
    let back = claim::give_back(&bdf)?;
    println!("{apci} bound again; {bdf} back to {back}");
    Ok(())
}

/// An accelerator's BAR that vfio-pci exported as a dma-buf: imported by
/// the controller through the dma-buf, read and written here through the
/// BAR's sysfs resource file (as the host's backing file holds it).
#[derive(Debug)]
struct ExportedBar {
    dmabuf: std::os::fd::OwnedFd,
    window: BarWindow,
}

impl ExportedBar {
    /// The first `len` bytes of BAR `bar` of `pci`, exported as `dmabuf`.
    fn new(dmabuf: std::os::fd::OwnedFd, pci: &str, bar: u8, len: usize) -> Result<Self, String> {
        Ok(Self {
            dmabuf,
            window: BarWindow::open(pci, bar, Some(len))?,
        })
    }
}

impl DeviceMemory for ExportedBar {
    fn len(&self) -> usize {
        self.window.len
    }

    fn kind(&self) -> p2pdma::memory::MemoryKind {
        p2pdma::memory::MemoryKind::Dmabuf
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> p2pdma::Result<()> {
        self.window.write_at(offset, src)
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> p2pdma::Result<()> {
        self.window.read_at(offset, dst)
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

// SAFETY: The dma-buf is the BAR's first `len` bytes, this value's for as
// long as it lives (the test gives the accelerator to nothing else), with
// no Rust reference into it; nothing trusts its contents.
unsafe impl DmaMemory for ExportedBar {
    fn dmabuf(&self) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        Some((self.dmabuf.as_fd(), 0))
    }
}

/// The accelerator that holds none of the controller's memory and that it
/// reaches by P2P: the rig's third one, under the switch (dma suite only).
fn spare_accelerator(module: &Module, ctrl: &Controller) -> Result<p2pdma::Accelerator, String> {
    let first = first_accelerator(module)?;
    module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|a| a.index != first.index)
        .find(|a| {
            module
                .p2p_query(a.index, Peer::Pci(ctrl.pci()))
                .is_ok_and(|q| q.map_type == p2pdma::MapType::BusAddr)
        })
        .ok_or_else(|| "no second accelerator the controller reaches by P2P".into())
}

/// The bytes written over the dma-buf once its revocation returned: the
/// controller image's content from an offset no read lands at (not block
/// aligned), so a late read shows.
const CANARY_IMAGE_OFFSET: u64 = (8 << 20) + 8;

/// An imported dma-buf invalidated by its exporter while reads land in it:
/// the spare accelerator moves to vfio-pci, which exports its BAR as a
/// dma-buf; the controller imports it and reads into it from 4 threads;
/// turning the accelerator's memory decoding off (vfio-pci revokes its
/// dma-bufs first) waits until the library has stopped the controller.
/// Memory decoding on again, the bytes written then stay, here and in the
/// host's backing file.
pub fn dmabuf(
    ctrl: Arc<Controller>,
    module: &Arc<Module>,
    nsid: u32,
    base: u64,
) -> Result<(), String> {
    let acc = spare_accelerator(module, &ctrl)?;
    let apci = acc.pci.to_string();
    vfio::bind_to(&apci, "vfio-pci")?;
    // It stays with vfio-pci: nothing else writes the memory the host
    // checks.
    exported_under_reads(&ctrl, module, nsid, base, &acc)
}

fn exported_under_reads(
    ctrl: &Controller,
    module: &Module,
    nsid: u32,
    base: u64,
    acc: &p2pdma::Accelerator,
) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let apci = acc.pci.to_string();
    let container = vfio::Container::open()?;
    if !container.check_extension(vfio::VFIO_NOIOMMU_IOMMU)? {
        return Err("the VFIO container has no no-IOMMU backend".into());
    }
    let group = vfio::Group::open(vfio::group_node(&apci)?)?;
    group.set_container(&container)?;
    container.set_iommu(vfio::VFIO_NOIOMMU_IOMMU)?;
    let device = group.device(&apci)?;
    let cmd = device.config_read16(vfio::PCI_COMMAND)? | vfio::PCI_COMMAND_MEMORY;
    device.config_write16(vfio::PCI_COMMAND, cmd)?;
    let fd = device.export_dma_buf(u32::from(acc.bar), &[(0, SPAN as u64)])?;
    let mem = ExportedBar::new(fd, &apci, acc.bar, SPAN)?;
    let map = ctrl
        .map(&mem, 0, SPAN, PeerAccess::WriteOnly)
        .map_err(err)?;
    let ns = ctrl
        .namespace_info(nsid)
        .ok_or_else(|| format!("namespace {nsid} is not active"))?;
    // One read checked first: the controller reaches the exported BAR.
    let blocks = READ as u32 / ns.block_size;
    ctrl.scope(|sc| {
        let cmd = IoCommand::read(nsid, 0, blocks, map.payload(0, READ)?);
        sc.submit(ctrl.next_queue(), &cmd).and_then(|p| p.wait())
    })
    .map_err(err)?;
    let mut got = vec![0u8; READ];
    mem.read_at(0, &mut got).map_err(err)?;
    let mut want = vec![0u8; READ];
    p2pdma_tests::fill_image(base, &mut want);
    if got != want {
        return Err("the read into the exported BAR did not land the namespace's bytes".into());
    }
    let started = AtomicU64::new(0);
    let (errors, took) = thread::scope(|s| -> Result<_, String> {
        let readers = s.spawn(|| {
            read_until_failure(
                ctrl,
                nsid,
                (ns.block_size, ns.blocks),
                [&map, &map],
                &started,
            )
        });
        while started.load(Ordering::Relaxed) < 16 {
            if readers.is_finished() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let t0 = Instant::now();
        let off = device.config_write16(vfio::PCI_COMMAND, cmd & !vfio::PCI_COMMAND_MEMORY);
        let took = t0.elapsed();
        // The controller was stopped before the revocation returned.
        let at_return = ctrl.failure();
        let on = device.config_write16(vfio::PCI_COMMAND, cmd);
        // Written at once, while a controller that still ran would write
        // over them.
        let mut canary = vec![0u8; SPAN];
        p2pdma_tests::fill_image(base + CANARY_IMAGE_OFFSET, &mut canary);
        let wrote = mem.write_at(0, &canary).map_err(err);
        let errors = readers.join().map_err(|_| "the readers panicked")?;
        off?;
        on?;
        wrote?;
        if !at_return.as_ref().is_some_and(|f| f.contains("revoked")) {
            return Err(format!(
                "the revocation returned after {took:?} with the controller still running (its failure: {at_return:?})"
            ));
        }
        thread::sleep(Duration::from_secs(1));
        let mut now = vec![0u8; SPAN];
        mem.read_at(0, &mut now).map_err(err)?;
        if let Some(i) = now.iter().zip(&canary).position(|(a, b)| a != b) {
            return Err(format!(
                "byte {i:#x} of the exported BAR changed after the revocation returned"
            ));
        }
        Ok((errors, took))
    })?;
    let landed = started.load(Ordering::Relaxed);
    println!("{landed} reads landed in the exported BAR before its revocation, which took {took:?}; the readers ended with: {errors:?}");
    if landed < 16 {
        return Err(format!(
            "only {landed} reads landed before the revocation (the readers ended with {errors:?})"
        ));
    }
    ended_by_revocation(ctrl, &errors, "the revocation")?;
    owner_left_alone(ctrl, module, &device, (acc.bar, cmd))?;
    // The host finds the canaries in the BAR's backing file.
    println!(
        "@@RESULT mem-pattern mem=accel2.bin bar_offset=0 pattern_offset={} len={SPAN} pci={apci}",
        base + CANARY_IMAGE_OFFSET
    );
    drop(map);
    Ok(())
}

/// An import for the (stopped) controller whose owner never lets it go:
/// revoking it (memory decoding off again, `cmd` without it) waits 10 s,
/// then the module turns the controller's bus mastering off, which stays
/// off, and revokes the import.
fn owner_left_alone(
    ctrl: &Controller,
    module: &Module,
    device: &vfio::Device,
    (bar, cmd): (u8, u16),
) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let bdf = ctrl.pci().to_string();
    let fd = device.export_dma_buf(u32::from(bar), &[(0, 4096)])?;
    let m = module
        .dmabuf_import(fd.as_fd(), Peer::Pci(ctrl.pci()))
        .map_err(err)?;
    let t0 = Instant::now();
    let off = device.config_write16(vfio::PCI_COMMAND, cmd & !vfio::PCI_COMMAND_MEMORY);
    let took = t0.elapsed();
    let state = module.handle_state(m.map_handle()).map_err(err);
    let unmapped = module.unmap(m).map_err(err);
    let on = device.config_write16(vfio::PCI_COMMAND, cmd);
    off?;
    println!("an import left alone by its owner: its revocation returned after {took:?}");
    if took < Duration::from_millis(9_500) {
        return Err(format!(
            "the revocation returned after {took:?}, before the owner's 10 s"
        ));
    }
    // The controller's own register, not vfio-pci's view of it.
    let path = format!("/sys/bus/pci/devices/{bdf}/config");
    let b = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    let now = u16::from_le_bytes([b[4], b[5]]);
    if now & vfio::PCI_COMMAND_MASTER != 0 {
        return Err(format!(
            "the controller's PCI_COMMAND is {now:#06x} after the wait: bus mastering on"
        ));
    }
    match state? {
        HandleState::Revoked => {}
        s => {
            return Err(format!(
                "the import left alone is {s:?} after its revocation"
            ))
        }
    }
    unmapped?;
    on?;
    Ok(())
}
