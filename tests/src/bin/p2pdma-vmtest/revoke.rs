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

/// The whole BAR of accelerator `pci`, read through its sysfs resource file.
fn bar_bytes(pci: &str, bar: u8) -> Result<Vec<u8>, String> {
    let path = format!("/sys/bus/pci/devices/{pci}/resource{bar}");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{path}: {e}"))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len() as usize;
    // SAFETY: A fresh shared mapping of the BAR, read by copies only and
    // unmapped below; no reference into it outlives this function.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::SHARED,
            f.as_fd(),
            0,
        )
    }
    .map_err(|e| format!("mmap of {path}: {e}"))?;
    let mut v = vec![0u8; len];
    for (i, b) in v.iter_mut().enumerate() {
        // SAFETY: Inside the mapping.
        *b = unsafe { std::ptr::read_volatile(p.cast::<u8>().add(i)) };
    }
    // SAFETY: The mapping made above, unused from here.
    let _ = unsafe { rustix::mm::munmap(p, len) };
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
    if !errors.iter().all(|e| e.contains("revoked")) {
        return Err(format!("a reader ended with another error: {errors:?}"));
    }
    match ctrl.failure() {
        Some(f) if f.contains("revoked") => println!("the controller: {f}"),
        f => {
            return Err(format!(
                "after the unbind the controller's failure is {f:?}"
            ))
        }
    }
    drop((ma, mh));
    Ok(())
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
