//! The queues path in the VM: the spare controller (serial p2pdma-vfio)
//! driven by this process, its queues in accelerator memory, data checked
//! against the rig content of its image (vfio.img: the rig content from
//! `image_pattern_offset` on).

use std::{
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use clap::{Args, ValueEnum};
use p2pdma::{
    memory::{DeviceMemory, DmabufMemory, HostMemory, ModuleMemory},
    nvme::admin,
    queues::{claim, AdminCommand, Command, Controller, InitOptions, IoCommand},
    transfer::{
        Config, Direction, End, Engine, Layout, Namespace, PathPref, Request, RouteOptions, Shape,
        StorageFile, StridedMode, TransferPath, Via,
    },
    Error, MapType, MemRange, Module, PciAddress, PeerAccess, Udmabuf,
};
use p2pdma_tests::fill_image;

const M: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Step {
    /// The controller is the nvme driver's: taking it without `unbind`
    /// must be refused, with the reason, and leave it bound.
    Refuse,
    /// Take it, submit reads from many threads and die with them in flight.
    Die,
    /// Take it again after a process died holding it: reads must be right;
    /// then give it back to the nvme driver.
    AfterDeath,
    /// A command that never completes (an Asynchronous Event Request with
    /// no event to report) with a short timeout: aborted, and when the
    /// abort does not end it, the controller is disabled and says why to
    /// every later request; the next `initialize` works again.
    Abort,
    /// Reads and writes, aligned and not, from many threads, into
    /// accelerator and host memory; errors; a read reported for the host.
    Data,
    /// The transfer engine on the namespace: AUTO chooses the queues path;
    /// handles, asynchronous requests, strided reads in every mode and a
    /// route move the right bytes; other paths are refused with the reason.
    Engine,
    /// Random sequences of commands (through the driver, and through the
    /// engine's reads and writes at any offset) into accelerator and host
    /// memory filled with canary bytes: each read lands the image's bytes
    /// and changes nothing around them; commands whose blocks differ from
    /// their payload are refused and change nothing; writes read back
    /// right and (with `--keep-writes`) are reported for the host to check
    /// in the image. The second half runs with the accelerator memory
    /// registered (mapped once for every transfer). Then a queue's worth of
    /// reads whose `Pending`s are forgotten: the scope waits for them and
    /// frees their ids.
    Canary,
    /// The namespace of a controller in a subsystem of its own is detached
    /// and attached again (Namespace Attachment, sent raw): the controller
    /// announces each change (Namespace Attribute Changed), after which the
    /// driver refuses commands for the namespace while it is gone and
    /// serves them again once it is back. The safe `admin` refuses the
    /// command itself.
    Events,
    /// vfio-pci unbound from the controller while reads run: the unbind
    /// waits for the library to stop the controller, and nothing it was
    /// given changes after the unbind returned.
    RevokePeer,
    /// The accelerator holding the controller's queues and data unbound
    /// while reads run, the same checks (its BAR read through sysfs).
    RevokeAccel,
    /// An accelerator's BAR exported by vfio-pci as a dma-buf, imported
    /// for the controller and revoked by its exporter (memory decoding
    /// off) while reads land in it: the revocation waits for the library
    /// to stop the controller, and nothing changes after it returned.
    RevokeDmabuf,
    /// The module alone: the owner of hundreds of mappings for the
    /// controller, which it holds through vfio-pci, lets them go (`UNMAP`,
    /// and the close of a module file) in the moment it releases the
    /// device, so that vfio-pci's unbind ends while they are torn down.
    /// None may outlive the unbind: the debug kernel's DMA-API checks
    /// count one that does.
    UnmapRace,
}

#[derive(Args)]
pub struct QueuesArgs {
    #[arg(long, value_enum)]
    step: Step,
    #[arg(long, default_value = "p2pdma-vfio")]
    serial: String,
    #[arg(long, default_value_t = 7)]
    nsid: u32,
    /// Where the image's content starts in the rig content stream.
    #[arg(long, default_value_t = 128 << 20)]
    image_pattern_offset: u64,
    /// After the data step, keep the memory (and the controller) held.
    #[arg(long)]
    hold: bool,
    /// The namespace's image file, as the host names it in results.
    #[arg(long, default_value = "vfio.img")]
    image: String,
    /// The canary step's writes stay, reported for the host to check in
    /// the image; otherwise each is undone (the image's bytes written
    /// back) for the steps after it.
    #[arg(long)]
    keep_writes: bool,
}

/// The image's bytes at `offset..offset + len`.
fn image(base: u64, offset: u64, len: usize) -> Vec<u8> {
    let start = (base + offset) / 8 * 8;
    let skip = (base + offset - start) as usize;
    let mut v = vec![0u8; len + skip + 8];
    fill_image(start, &mut v);
    v[skip..skip + len].to_vec()
}

fn first_diff(want: &[u8], got: &[u8]) -> Option<usize> {
    want.iter().zip(got).position(|(a, b)| a != b)
}

fn take(x: &QueuesArgs, module: &Arc<Module>, unbind: bool) -> Result<Arc<Controller>, String> {
    take_controller(&x.serial, module, unbind)
}

/// The controller of serial `serial`, driven by this process (taken from
/// the nvme driver when `unbind`).
pub fn take_controller(
    serial: &str,
    module: &Arc<Module>,
    unbind: bool,
) -> Result<Arc<Controller>, String> {
    let bdf = controller_bdf(serial)?;
    let pci: PciAddress = bdf.parse().map_err(|e: Error| e.to_string())?;
    let opts = InitOptions {
        unbind,
        queues: 4,
        entries: 64,
        timeout: Duration::from_secs(30),
        ..Default::default()
    };
    Controller::initialize(module.clone(), pci, &opts).map_err(|e| e.to_string())
}

/// The PCI address of the controller of serial `serial`, with the nvme
/// driver or already with vfio-pci.
pub fn controller_bdf(serial: &str) -> Result<String, String> {
    p2pdma::discovery::nvme_by_serial(serial).or_else(|e| {
        // Already given to vfio-pci by an earlier step: found by scanning
        // vfio-pci's functions for an NVMe controller (class 0x010802).
        std::fs::read_dir("/sys/bus/pci/drivers/vfio-pci")
            .ok()
            .and_then(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(':') && n.contains('.'))
                    .find(|n| {
                        std::fs::read_to_string(format!("/sys/bus/pci/devices/{n}/class"))
                            .is_ok_and(|c| c.trim() == "0x010802")
                    })
            })
            .ok_or(e)
    })
}

pub fn run(x: &QueuesArgs) -> Result<(), String> {
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    match x.step {
        Step::Refuse => {
            let bdf = p2pdma::discovery::nvme_by_serial(&x.serial)?;
            match take(x, &module, false) {
                Ok(_) => {
                    return Err("a controller the nvme driver has was taken without unbind".into())
                }
                Err(e) if e.contains("nvme driver has it") => println!("refused: {e}"),
                Err(e) => return Err(format!("refused for another reason: {e}")),
            }
            match claim::driver_of(&bdf).as_deref() {
                Some("nvme") => Ok(()),
                d => Err(format!(
                    "after the refusal {bdf} is bound to {d:?}, not nvme"
                )),
            }
        }
        Step::Die => {
            // The module opened above descriptors that are then freed: the
            // VFIO device, opened next, would take a lower number, and be
            // released after the module's file when this process dies.
            let spare = (0..8)
                .map(|_| std::fs::File::open("/dev/null"))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
            drop(spare);
            let ctrl = take(x, &module, true)?;
            release_order(&module)?;
            let mem =
                ModuleMemory::alloc(module.clone(), 0, 8 * M, 0).map_err(|e| e.to_string())?;
            let mapped = ctrl
                .map(&mem, 0, (8 * M) as usize, PeerAccess::WriteOnly)
                .map_err(|e| e.to_string())?;
            ctrl.scope(|s| {
                let mut n = 0;
                for i in 0..ctrl.queue_count() * (ctrl.queue_depth() - 1) {
                    let off = (i as u64 * 64 * 1024) % (8 * M);
                    let data = mapped
                        .payload(off as usize, 64 * 1024)
                        .map_err(|e| e.to_string())?;
                    let cmd = IoCommand::read(x.nsid, (i as u64 * 977) % 100_000, 128, data);
                    match s.try_submit(i, &cmd).map_err(|e| e.to_string())? {
                        Some(p) => {
                            std::mem::forget(p);
                            n += 1;
                        }
                        None => break,
                    }
                }
                println!("{n} reads in flight; dying");
                std::process::abort()
            })
        }
        Step::AfterDeath => {
            let ctrl = take(x, &module, true)?;
            let ns =
                Namespace::new(ctrl.clone(), module.clone(), x.nsid).map_err(|e| e.to_string())?;
            let mem =
                ModuleMemory::alloc(module.clone(), 0, 4 * M, 0).map_err(|e| e.to_string())?;
            read_check(&ns, x, &mem, 3 * M + 13, (2 * M + 99) as usize, 7)?;
            println!("reads after the death of the last owner are right");
            let bdf = ctrl.pci().to_string();
            drop(ns);
            drop(ctrl);
            let driver = claim::give_back(&bdf)?;
            if driver != "nvme" {
                return Err(format!("{bdf} went back to {driver}, not nvme"));
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while p2pdma::discovery::nvme_by_serial(&x.serial).is_err() {
                if Instant::now() > deadline {
                    return Err("the nvme driver did not bring the controller back".into());
                }
                thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        }
        Step::Abort => abort(x, &module),
        Step::Data => data(x, &module),
        Step::Engine => engine(x, &module),
        Step::Canary => canary(x, &module),
        Step::Events => events(x, &module),
        Step::RevokePeer => crate::revoke::peer(take(x, &module, true)?, &module, x.nsid),
        Step::RevokeAccel => crate::revoke::accelerator(take(x, &module, true)?, &module, x.nsid),
        Step::UnmapRace => crate::revoke::unmap_race(&module, &controller_bdf(&x.serial)?),
        Step::RevokeDmabuf => crate::revoke::dmabuf(
            take(x, &module, true)?,
            &module,
            x.nsid,
            x.image_pattern_offset,
        ),
    }
}

fn abort(x: &QueuesArgs, module: &Arc<Module>) -> Result<(), String> {
    let ctrl = take(x, module, true)?;
    let ns = Namespace::new(ctrl.clone(), module.clone(), x.nsid).map_err(|e| e.to_string())?;
    let mem = ModuleMemory::alloc(module.clone(), 0, 2 * M, 0).map_err(|e| e.to_string())?;
    read_check(&ns, x, &mem, 4 * M + 1, 100_000, 3)?;
    match ctrl.admin(
        &AdminCommand {
            opcode: admin::CREATE_IO_SQ,
            ..Default::default()
        },
        None,
    ) {
        Err(Error::InvalidArgument(e)) => println!("refused: {e}"),
        r => return Err(format!("CREATE I/O SQ through admin() gave {r:?}")),
    }
    // The safe filter is an allow list: an Asynchronous Event Request, a
    // Set Features that can turn namespace notices off and a vendor
    // command go only through admin_raw.
    for (opcode, cdw0, what) in [
        (
            admin::ASYNC_EVENT_REQUEST,
            0,
            "an Asynchronous Event Request",
        ),
        (
            admin::SET_FEATURES,
            0x0b,
            "the Asynchronous Event Configuration",
        ),
        (0xc0, 0, "a vendor command"),
    ] {
        let cmd = AdminCommand {
            opcode,
            cdw: [cdw0, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        match ctrl.admin(&cmd, None) {
            Err(Error::InvalidArgument(e)) if e.contains("admin_raw") => {
                println!("{what} through admin() refused: {e}")
            }
            r => return Err(format!("{what} through admin() gave {r:?}")),
        }
    }
    // An event may be waiting from the reset: an AER that completes at
    // once reports it, and the next one waits.
    let aer = Command {
        opcode: admin::ASYNC_EVENT_REQUEST,
        ..Default::default()
    };
    let timeout = Duration::from_secs(2);
    let mut stuck = None;
    for _ in 0..4 {
        let t0 = Instant::now();
        // SAFETY: The request moves no data and gives the controller no
        // memory; no namespace of this controller changes in this test, so
        // no event it may take is one the library waits for.
        match unsafe { ctrl.admin_raw(&aer, Some(timeout)) } {
            Ok(c) => println!("an event was waiting: {:#x}", c.result),
            Err(e) => {
                stuck = Some((e, t0.elapsed()));
                break;
            }
        }
    }
    let Some((e, took)) = stuck else {
        return Err("every Asynchronous Event Request completed".into());
    };
    println!("after {took:?}: {e}");
    if took < timeout {
        return Err(format!(
            "the request failed after {took:?}, before its timeout"
        ));
    }
    let text = e.to_string();
    if !text.contains("admin command 0x0c") {
        return Err(format!("the error does not name the command: {text}"));
    }
    if text.contains("and was aborted (the controller aborted it") {
        // A controller that honours ABORT: the request ends with its error
        // and the controller goes on.
        if let Some(f) = ctrl.failure() {
            return Err(format!("aborted, yet the controller failed: {f}"));
        }
        read_check(&ns, x, &mem, 9 * M + 7, 300_000, 1)?;
        println!("the controller aborted the stuck command and goes on serving reads");
        return Ok(());
    }
    if !text.contains("did not complete within")
        || !text.contains("the controller did not abort it")
    {
        return Err(format!("the error does not say what the abort did: {text}"));
    }
    let failure = ctrl
        .failure()
        .ok_or("the abort did not end the command, yet the controller was not failed")?;
    if !failure.contains("the controller was disabled") {
        return Err(format!(
            "the failure does not say the controller was disabled: {failure}"
        ));
    }
    // The controller is off: every later request is an error that says why.
    match MemRange::new(&mem, 0, 4096).and_then(|range| ns.read(M, range)) {
        Err(e) if e.to_string().contains("did not complete within") => {
            println!("a read after the failure: {e}");
        }
        r => return Err(format!("a read on the disabled controller gave {r:?}")),
    }
    drop(ns);
    drop(ctrl);
    let ctrl = take(x, module, true)?;
    let ns = Namespace::new(ctrl, module.clone(), x.nsid).map_err(|e| e.to_string())?;
    read_check(&ns, x, &mem, 9 * M + 7, 300_000, 1)?;
    println!("the controller did not abort the stuck command, was disabled, and serves reads again after initialize");
    Ok(())
}

/// Checks that every VFIO device descriptor is numbered above the module's:
/// at exit the kernel releases files in descending order of their last
/// descriptor, so the device is stopped before the memory is freed.
fn release_order(module: &Module) -> Result<(), String> {
    use std::os::fd::{AsFd, AsRawFd};
    let m = module.as_fd().as_raw_fd();
    let mut devices = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        let link = std::fs::read_link(e.path()).unwrap_or_default();
        if link.to_string_lossy().contains("vfio-device") {
            devices.push(e.file_name().to_string_lossy().parse::<i32>().unwrap_or(-1));
        }
    }
    match devices.iter().min() {
        Some(&d) if d > m => {
            println!("descriptors: module {m}, VFIO device {devices:?}");
            Ok(())
        }
        Some(_) => Err(format!(
            "the VFIO device's descriptors {devices:?} are not all above the module's {m}: the memory would be freed before the controller stops"
        )),
        None => Err("no VFIO device descriptor in /proc/self/fd".into()),
    }
}

fn read_check(
    ns: &Namespace,
    x: &QueuesArgs,
    mem: &dyn DeviceMemory,
    offset: u64,
    len: usize,
    mem_offset: usize,
) -> Result<(), String> {
    MemRange::new(mem, mem_offset, len)
        .and_then(|range| ns.read(offset, range))
        .map_err(|e| format!("read of {len} bytes at {offset}: {e}"))?;
    let what = format!(
        "read of {len} bytes at {offset} into {} at {mem_offset}",
        mem.kind()
    );
    compare(x, &what, mem, mem_offset, offset, len)
}

fn data(x: &QueuesArgs, module: &Arc<Module>) -> Result<(), String> {
    let ctrl = take(x, module, true)?;
    let id = ctrl.identity();
    if id.serial != x.serial {
        return Err(format!(
            "IDENTIFY says serial {:?}, not {:?}",
            id.serial, x.serial
        ));
    }
    let ns = Namespace::new(ctrl.clone(), module.clone(), x.nsid).map_err(|e| e.to_string())?;
    println!(
        "{}: {} {}, {} I/O queues of {} commands in {}, largest command {} bytes, namespace {} of {} blocks of {} bytes; {}",
        ctrl.pci(),
        id.model,
        id.serial,
        ctrl.queue_count(),
        ctrl.queue_depth(),
        ctrl.queue_memory(),
        ctrl.max_transfer(),
        x.nsid,
        ns.info().blocks,
        ns.info().block_size,
        ctrl.iommu().describe()
    );
    let mem = ModuleMemory::alloc(module.clone(), 0, 8 * M, 0).map_err(|e| e.to_string())?;
    // Aligned, unaligned at both ends, inside one block, across one block
    // boundary, larger than the largest command, and at a memory address
    // that is not dword aligned (all through staging).
    for (off, len, moff) in [
        (0, M as usize, 0),
        (4097, (3 * M + 511) as usize, 3),
        (100, 37, 1),
        (511, 2, 4096),
        (5 * M, (3 * M) as usize, (4 * M + 8) as usize),
        (6 * M + 512, 8192, 2),
    ] {
        read_check(&ns, x, &mem, off, len, moff)?;
    }
    println!("reads into accelerator memory (DMA_MAP) match the image");
    // Host memory: pinned for the controller with PIN_USER.
    let host = HostMemory::new((2 * M) as usize).map_err(|e| e.to_string())?;
    read_check(&ns, x, &host, 12345, (2 * M - 100) as usize, 50)?;
    read_check(&ns, x, &host, 7 * M, M as usize, 4096)?;
    println!("reads into host memory (PIN_USER) match the image");

    // Many threads at once, each into its own 1 MiB of the memory.
    let t0 = Instant::now();
    thread::scope(|s| -> Result<(), String> {
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let (ns, mem) = (&ns, &mem);
                s.spawn(move || -> Result<(), String> {
                    let mut r = t * 0x9e37_79b9 + 1;
                    for _ in 0..24 {
                        r ^= r << 13;
                        r ^= r >> 7;
                        r ^= r << 17;
                        let len = 1 + (r % (256 * 1024)) as usize;
                        let off = (r >> 20) % (48 * M);
                        let moff = (t * M) as usize + ((r >> 40) % 4096) as usize;
                        read_check(ns, x, mem, off, len.min((M - 4096) as usize), moff)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| "a reader panicked".to_string())??;
        }
        Ok(())
    })?;
    let (doorbells, submitted) = ctrl.doorbell_counts();
    println!(
        "8 threads x 24 reads in {:?}: right; {submitted} commands, {doorbells} submission doorbells",
        t0.elapsed()
    );

    // Writes: an unaligned range from accelerator memory, then eight
    // threads writing neighbouring 100-byte pieces of the same blocks
    // (each a read-modify-write of a shared block).
    let wpat = 5 * M + 8;
    let (w_off, w_len) = (40 * M + 3, (M + 1000) as usize);
    let src = image(0, wpat, w_len);
    mem.write_at(5, &src).map_err(|e| e.to_string())?;
    MemRange::new(&mem, 5, w_len)
        .and_then(|range| ns.write(w_off, range))
        .map_err(|e| e.to_string())?;
    let rpat = 9 * M + 16;
    let piece = image(0, rpat, 800);
    mem.write_at(7 * M as usize, &piece)
        .map_err(|e| e.to_string())?;
    thread::scope(|s| {
        for t in 0..8usize {
            let (ns, mem) = (&ns, &mem);
            s.spawn(move || {
                MemRange::new(mem, 7 * M as usize + 100 * t, 100)
                    .and_then(|range| ns.write(42 * M + 100 * t as u64, range))
            });
        }
    });
    ns.flush().map_err(|e| e.to_string())?;
    for (off, pat, len) in [(w_off, wpat, w_len), (42 * M, rpat, 800)] {
        MemRange::new(&host, 0, len)
            .and_then(|range| ns.read(off, range))
            .map_err(|e| e.to_string())?;
        let mut got = vec![0u8; len];
        host.read_at(0, &mut got).map_err(|e| e.to_string())?;
        if let Some(i) = first_diff(&image(0, pat, len), &got) {
            return Err(format!(
                "written {len} bytes at {off} read back wrong at byte {i}"
            ));
        }
        println!(
            "@@RESULT nvme-write image=vfio.img nvme_offset={off} pattern_offset={pat} len={len}"
        );
    }
    println!("writes (unaligned, and 8 threads sharing blocks) read back right");

    // Errors: past the end (refused before any command, by the engine),
    // and, refused by the driver before any command, a READ past the
    // namespace's last block, one for a namespace that is not active, and
    // one whose blocks are more than its payload.
    match MemRange::new(&mem, 0, 100).and_then(|range| ns.read(ns.size() - 10, range)) {
        Err(Error::EndOfFile { .. }) => {}
        r => return Err(format!("a read past the end gave {r:?}")),
    }
    let mapped = ctrl
        .map(&mem, 0, 4096, PeerAccess::WriteOnly)
        .map_err(|e| e.to_string())?;
    let data = mapped.payload(0, 4096).map_err(|e| e.to_string())?;
    let bpp = 4096 / ns.info().block_size;
    for (nsid, slba, blocks, want) in [
        (x.nsid, ns.info().blocks, bpp, "past the end"),
        (99, 0, bpp, "not active"),
        (x.nsid, 0, bpp + 1, "the payload holds 4096"),
    ] {
        let r = ctrl.scope(|s| {
            s.submit(0, &IoCommand::read(nsid, slba, blocks, data))
                .and_then(|p| p.wait())
        });
        match r {
            Err(Error::InvalidArgument(e)) if e.contains(want) => {
                println!("READ of namespace {nsid} blocks {slba}..+{blocks}: refused: {e}");
            }
            r => {
                return Err(format!(
                    "READ of namespace {nsid} blocks {slba}..+{blocks} gave {r:?}, want a refusal ({want})"
                ))
            }
        }
    }
    drop(mapped);
    // The controller still works after the errors.
    read_check(&ns, x, &mem, 11 * M + 1, 4000, 0)?;
    if let Some(f) = ctrl.failure() {
        return Err(format!("the controller failed: {f}"));
    }

    // One read left in the memory for the host to compare with vfio.img.
    let (off, len, moff) = (2 * M + 777, (3 * M + 5) as usize, (4 * M + 1) as usize);
    read_check(&ns, x, &mem, off, len, moff)?;
    let target = mem.mapping().as_ptr();
    let accel = module.accelerator(0).map_err(|e| e.to_string())?;
    let pci = accel.pci.to_string();
    let bar_offset =
        super::phys_of(target as u64)? - super::bar_start(&pci, accel.bar)? + moff as u64;
    println!(
        "@@RESULT p2pmem-read pci={pci} bar={} nvme_offset={off} bar_offset={bar_offset} len={len} image=vfio.img",
        accel.bar
    );
    if x.hold {
        super::hold_forever();
    }
    Ok(())
}

/// `len` bytes of `mem` at `mem_offset` against the image at `offset`.
fn compare(
    x: &QueuesArgs,
    what: &str,
    mem: &dyn DeviceMemory,
    mem_offset: usize,
    offset: u64,
    len: usize,
) -> Result<(), String> {
    let mut got = vec![0u8; len];
    mem.read_at(mem_offset, &mut got)
        .map_err(|e| e.to_string())?;
    match first_diff(&image(x.image_pattern_offset, offset, len), &got) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: byte {i} of {len} differs from the image")),
    }
}

fn engine(x: &QueuesArgs, module: &Arc<Module>) -> Result<(), String> {
    let err = |e: Error| e.to_string();
    let ctrl = take(x, module, true)?;
    let ns = Arc::new(Namespace::new(ctrl.clone(), module.clone(), x.nsid).map_err(err)?);
    let file = Arc::new(StorageFile::namespace(ns.clone()));
    let engine = Arc::new(Engine::new(Config::default(), Some(module.clone())));
    let mem: Arc<dyn DeviceMemory> =
        Arc::new(ModuleMemory::alloc(module.clone(), 0, 8 * M, 0).map_err(err)?);
    let host: Arc<dyn DeviceMemory> = Arc::new(HostMemory::new((4 * M) as usize).map_err(err)?);

    // AUTO: the queues path, saying how each memory is reached.
    for m in [&mem, &host] {
        let h = engine.handle(&file, m.as_ref()).map_err(err)?;
        if h.path() != TransferPath::Queues {
            return Err(format!(
                "AUTO chose {} for {}: {}",
                h.path(),
                m.kind(),
                h.reason()
            ));
        }
        println!("{}: {}: {}", m.kind(), h.path(), h.reason());
    }
    let h = engine.handle(&file, mem.as_ref()).map_err(err)?;
    if !h.reason().contains("DMA_MAP") {
        return Err(format!(
            "the reason does not say the memory is mapped: {}",
            h.reason()
        ));
    }

    // Handles: unaligned reads into both memories, and a write read back.
    for (off, len, moff) in [(1, (2 * M) as usize, 3), (3 * M + 4095, 10_000, 4096)] {
        let r = h.read(off, moff, len).map_err(err)?;
        if r.path != TransferPath::Queues || r.bytes != len as u64 {
            return Err(format!("a handle read reported {r:?}"));
        }
        compare(
            x,
            "handle read into accelerator memory",
            mem.as_ref(),
            moff,
            off,
            len,
        )?;
    }
    let hh = engine.handle(&file, host.as_ref()).map_err(err)?;
    hh.read(77, 5, M as usize).map_err(err)?;
    compare(
        x,
        "handle read into host memory",
        host.as_ref(),
        5,
        77,
        M as usize,
    )?;
    let (w_off, w_len, w_pat) = (52 * M + 1001, (M + 333) as usize, 21 * M + 8);
    mem.write_at(11, &image(0, w_pat, w_len)).map_err(err)?;
    h.write(w_off, 11, w_len).map_err(err)?;
    ns.flush().map_err(err)?;
    hh.read(w_off, 0, w_len).map_err(err)?;
    let mut got = vec![0u8; w_len];
    host.read_at(0, &mut got).map_err(err)?;
    if let Some(i) = first_diff(&image(0, w_pat, w_len), &got) {
        return Err(format!("a handle write read back wrong at byte {i}"));
    }
    println!(
        "@@RESULT nvme-write image=vfio.img nvme_offset={w_off} pattern_offset={w_pat} len={w_len}"
    );
    println!("handle reads and an unaligned write are right");

    dmabuf_memory(x, &engine, &file, &ns)?;

    // Asynchronous requests from the engine's workers, all at once, each
    // into its own megabyte.
    let disjoint: Vec<Request> = (0..8u64)
        .map(|i| Request {
            dir: Direction::Read,
            file: file.clone(),
            file_offset: i * 3_000_017 % (40 * M),
            mem: mem.clone(),
            mem_offset: (i * M) as usize + 7,
            len: 500_000 + i as usize,
        })
        .collect();
    for t in engine.submit_batch(disjoint.clone()) {
        t.wait().map_err(err)?;
    }
    for r in &disjoint {
        compare(
            x,
            "an asynchronous read",
            mem.as_ref(),
            r.mem_offset,
            r.file_offset,
            r.len,
        )?;
    }
    println!("asynchronous reads are right");

    // Strided reads in every mode: 300-byte runs every 4100 bytes, in
    // rows of 16 every 100000 bytes.
    let shape = Shape::new(12_345, 300, &[(4100, 16), (100_000, 6)]).map_err(err)?;
    for (mode, layout) in [
        (StridedMode::Auto, Layout::Packed),
        (StridedMode::Sc, Layout::Packed),
        (StridedMode::Tat, Layout::Packed),
        (StridedMode::Rc, Layout::Strided),
        (StridedMode::Sc, Layout::Strided),
    ] {
        mem.write_at(0, &vec![0u8; shape.bounding_len() as usize])
            .map_err(err)?;
        let rep = engine
            .strided()
            .read(&file, &shape, MemRange::whole(mem.as_ref()), layout, mode)
            .map_err(err)?;
        if rep.paths != [TransferPath::Queues] {
            return Err(format!("strided {mode} went by {:?}", rep.paths));
        }
        let (b0, _) = shape.bounds();
        for run in shape.iter() {
            let at = match layout {
                Layout::Packed => run.packed_offset as usize,
                Layout::Strided => (run.file_offset - b0) as usize,
            };
            compare(
                x,
                &format!("strided {mode} ({layout:?}) run at {}", run.file_offset),
                mem.as_ref(),
                at,
                run.file_offset,
                300,
            )?;
        }
        println!("strided {mode} ({layout:?}, ran as {}): right", rep.mode);
    }

    // A route from the namespace through host memory into accelerator
    // memory.
    let len = (3 * M + 5) as usize;
    let route = engine
        .routes()
        .plan_through(
            End::Storage {
                file: &file,
                offset: 5 * M + 3,
            },
            &[Via::Host],
            End::Memory {
                mem: mem.as_ref(),
                offset: 9,
            },
        )
        .map_err(err)?;
    let rep = engine
        .routes()
        .copy(&route, len, &RouteOptions::default())
        .map_err(err)?;
    compare(x, "a route", mem.as_ref(), 9, 5 * M + 3, len)?;
    println!(
        "route {}: right",
        rep.hops
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // Other paths cannot reach the namespace: refused, with the reason.
    for pref in [PathPref::Bounce, PathPref::P2p, PathPref::NvmeCmd] {
        let e = Engine::new(
            Config {
                path: pref,
                ..Config::default()
            },
            Some(module.clone()),
        );
        match MemRange::new(mem.as_ref(), 0, 4096).and_then(|range| e.read(&file, 0, range)) {
            Err(Error::PathUnavailable { reason, .. }) => println!("{pref}: refused: {reason}"),
            r => return Err(format!("{pref} on the namespace gave {r:?}")),
        }
    }
    // Past the end: refused before any command, for reads and writes.
    for dir in [Direction::Read, Direction::Write] {
        let r = match dir {
            Direction::Read => h.read(ns.size() - 100, 0, 4096),
            Direction::Write => h.write(ns.size() - 100, 0, 4096),
        };
        match r {
            Err(Error::EndOfFile { .. }) => {}
            r => return Err(format!("a {dir:?} past the end gave {r:?}")),
        }
    }
    let st = engine.stats().queues.snapshot();
    println!(
        "queues path: {} transfers, {} bytes, {} commands",
        st.transfers, st.bytes, st.ios
    );
    if st.ios < st.transfers || st.transfers == 0 {
        return Err(format!("the queues counters are off: {st:?}"));
    }
    if let Some(f) = ctrl.failure() {
        return Err(format!("the controller failed: {f}"));
    }
    Ok(())
}

/// A number in `0..n` (0 when `n` is 0).
/// Memory a driver exported as a dma-buf (a GPU's, on a real machine; a
/// udmabuf here): AUTO chooses the queues path and says the dma-buf is
/// imported; the controller's mapping of it is `DMABUF_IMPORT`'s; reads land
/// the image's bytes, checked through the memfd behind the udmabuf (not the
/// memory's own copies) and through the dma-buf's CPU mapping; a write from
/// it reads back right; registered, it is mapped once.
fn dmabuf_memory(
    x: &QueuesArgs,
    engine: &Engine,
    file: &StorageFile,
    ns: &Namespace,
) -> Result<(), String> {
    let err = |e: Error| e.to_string();
    let len = (4 * M) as usize;
    let u = Udmabuf::create(len as u64).map_err(err)?;
    let memfd = u.memfd().try_clone_to_owned().map_err(|e| e.to_string())?;
    let mem: Arc<dyn DeviceMemory> = Arc::new(DmabufMemory::from_udmabuf(u).map_err(err)?);
    let h = engine.handle(file, mem.as_ref()).map_err(err)?;
    if h.path() != TransferPath::Queues || !h.reason().contains("DMABUF_IMPORT") {
        return Err(format!(
            "AUTO for dma-buf memory: {}: {}",
            h.path(),
            h.reason()
        ));
    }
    println!("{}: {}: {}", mem.kind(), h.path(), h.reason());
    let mapped = ns
        .controller()
        .map(mem.as_ref(), 4096, 8192, PeerAccess::WriteOnly)
        .map_err(err)?;
    if mapped.mapping().map_type == MapType::NotSupported {
        return Err("the controller's dma-buf mapping says not-supported".into());
    }
    println!(
        "dma-buf mapped for the controller: {} ({} segments)",
        mapped.mapping().map_type,
        mapped.mapping().segs.len()
    );
    drop(mapped);
    let by_memfd = |at: usize, n: usize| -> Result<Vec<u8>, String> {
        let mut got = vec![0u8; n];
        rustix::io::pread(&memfd, &mut got, at as u64).map_err(|e| e.to_string())?;
        Ok(got)
    };
    for (off, n, moff) in [
        (0, len, 0),
        (5 * M + 17, 1_000_001, 4095),
        (9 * M, 4096, 8192),
    ] {
        let r = h.read(off, moff, n).map_err(err)?;
        if r.path != TransferPath::Queues {
            return Err(format!("a read into dma-buf memory went by {}", r.path));
        }
        if let Some(i) = first_diff(&image(x.image_pattern_offset, off, n), &by_memfd(moff, n)?) {
            return Err(format!(
                "a read into dma-buf memory: byte {i} of {n} differs (memfd)"
            ));
        }
        compare(
            x,
            "a read into dma-buf memory (its mapping)",
            mem.as_ref(),
            moff,
            off,
            n,
        )?;
    }
    // A write from it, read back into host memory.
    let (w_off, w_len, w_pat) = (61 * M + 512, (M + 4099) as usize, 33 * M + 5);
    mem.write_at(100, &image(0, w_pat, w_len)).map_err(err)?;
    if first_diff(&image(0, w_pat, w_len), &by_memfd(100, w_len)?).is_some() {
        return Err("a CPU write through the dma-buf mapping did not reach the memfd".into());
    }
    h.write(w_off, 100, w_len).map_err(err)?;
    ns.flush().map_err(err)?;
    let host = HostMemory::new(w_len).map_err(err)?;
    MemRange::new(&host, 0, w_len)
        .and_then(|range| engine.read(file, w_off, range))
        .map_err(err)?;
    let mut got = vec![0u8; w_len];
    host.read_at(0, &mut got).map_err(err)?;
    if let Some(i) = first_diff(&image(0, w_pat, w_len), &got) {
        return Err(format!(
            "a write from dma-buf memory read back wrong at byte {i}"
        ));
    }
    println!(
        "@@RESULT nvme-write image=vfio.img nvme_offset={w_off} pattern_offset={w_pat} len={w_len}"
    );
    // Registered: mapped once, reads still right.
    ns.register(mem.clone()).map_err(err)?;
    let (off, n) = (17 * M + 3, 777_777);
    h.read(off, 9, n).map_err(err)?;
    if first_diff(&image(x.image_pattern_offset, off, n), &by_memfd(9, n)?).is_some() {
        return Err("a read into registered dma-buf memory differs".into());
    }
    if !ns.unregister(mem.as_ref()) {
        return Err("the dma-buf memory was not registered".into());
    }
    println!("dma-buf memory: reads, a write and a registered read are right");
    Ok(())
}

fn below(rng: &mut fastrand::Rng, n: u64) -> u64 {
    rng.u64(0..n.max(1))
}

/// What memory outside every payload holds in the canary step.
const CANARY: u8 = 0xc5;

/// Whether `mem` holds `CANARY` everywhere but `keep` (a byte range), as
/// it did before: the first byte that changed, if any.
fn canary_broken(
    mem: &dyn DeviceMemory,
    keep: std::ops::Range<usize>,
) -> Result<Option<usize>, String> {
    let mut all = vec![0u8; mem.len()];
    mem.read_at(0, &mut all).map_err(|e| e.to_string())?;
    Ok(all
        .iter()
        .enumerate()
        .position(|(i, &b)| !keep.contains(&i) && b != CANARY))
}

fn canary(x: &QueuesArgs, module: &Arc<Module>) -> Result<(), String> {
    let err = |e: Error| e.to_string();
    let ctrl = take(x, module, true)?;
    let info = ctrl
        .namespace_info(x.nsid)
        .ok_or_else(|| format!("namespace {} is not active", x.nsid))?;
    let bs = u64::from(info.block_size);
    let max = ctrl.max_transfer();
    println!(
        "{}: namespace {} of {} blocks of {bs} bytes, largest command {max} bytes",
        ctrl.pci(),
        x.nsid,
        info.blocks
    );
    let ns = Namespace::new(ctrl.clone(), module.clone(), x.nsid).map_err(err)?;
    let accel = Arc::new(ModuleMemory::alloc(module.clone(), 0, 4 * M, 0).map_err(err)?);
    let host = HostMemory::new((2 * M) as usize).map_err(err)?;
    let mems: [&dyn DeviceMemory; 2] = [&*accel, &host];
    let maps = [
        ctrl.map(&*accel, 0, accel.len(), PeerAccess::ReadWrite)
            .map_err(err)?,
        ctrl.map(&host, 0, host.len(), PeerAccess::ReadWrite)
            .map_err(err)?,
    ];
    // Writes go to the last quarter of the namespace, each to a range of
    // its own, so that the host can check every one of them at the end.
    let scratch = info.size() / 4 * 3;
    let mut next_write = scratch;
    let mut rng = fastrand::Rng::with_seed(0x5eed ^ u64::from(x.nsid));
    let (mut reads, mut refused, mut writes) = (0, 0, 0);
    for op in 0..48 {
        if op == 24 {
            // From here the engine's transfers into the accelerator memory
            // use its registered mapping.
            ns.register(accel.clone()).map_err(err)?;
        }
        let m = (below(&mut rng, 3) == 0) as usize;
        let mem = mems[m];
        mem.write_at(0, &vec![CANARY; mem.len()]).map_err(err)?;
        match op % 4 {
            // A READ through the driver: whole blocks, up to the largest
            // command, into a dword-aligned payload anywhere.
            0 | 1 => {
                let blocks = 1 + below(&mut rng, (max as u64 / bs).min(mem.len() as u64 / bs / 2));
                let len = (blocks * bs) as usize;
                let at = (below(&mut rng, (mem.len() - len) as u64 / 4) * 4) as usize;
                let slba = below(&mut rng, scratch / bs - blocks);
                let payload = maps[m].payload(at, len).map_err(err)?;
                let refuse = op % 4 == 1;
                let blocks = if refuse { blocks + 1 } else { blocks };
                let r = ctrl.scope(|s| {
                    s.submit(op, &IoCommand::read(x.nsid, slba, blocks as u32, payload))
                        .and_then(|p| p.wait())
                });
                match (refuse, r) {
                    (false, Ok(_)) => {
                        let what = format!("READ of {blocks} blocks at {slba} into {} at {at}", mem.kind());
                        compare(x, &what, mem, at, slba * bs, len)?;
                        if let Some(i) = canary_broken(mem, at..at + len)? {
                            return Err(format!("{what}: byte {i} outside the payload changed"));
                        }
                        reads += 1;
                    }
                    (true, Err(Error::InvalidArgument(e))) if e.contains("payload holds") => {
                        if let Some(i) = canary_broken(mem, 0..0)? {
                            return Err(format!("a refused READ changed byte {i}"));
                        }
                        refused += 1;
                    }
                    (refuse, r) => {
                        return Err(format!(
                            "READ of {blocks} blocks at {slba} for a {len}-byte payload (refuse: {refuse}) gave {r:?}"
                        ))
                    }
                }
            }
            // A read through the engine at any offset and length: partial
            // blocks staged, the middle split by the largest command.
            2 => {
                let len = 1 + below(&mut rng, (mem.len() / 2) as u64) as usize;
                let at = below(&mut rng, (mem.len() - len) as u64) as usize;
                let off = below(&mut rng, scratch - len as u64);
                MemRange::new(mem, at, len)
                    .and_then(|range| ns.read(off, range))
                    .map_err(err)?;
                let what = format!(
                    "engine read of {len} bytes at {off} into {} at {at}",
                    mem.kind()
                );
                compare(x, &what, mem, at, off, len)?;
                if let Some(i) = canary_broken(mem, at..at + len)? {
                    return Err(format!("{what}: byte {i} outside the range changed"));
                }
                reads += 1;
            }
            // A write through the engine from any offset of the memory to
            // any offset of the scratch range, read back.
            _ => {
                let len = 1 + below(&mut rng, 600_000) as usize;
                let at = below(&mut rng, (mem.len() - len) as u64) as usize;
                let off = next_write + below(&mut rng, bs);
                if off + len as u64 > info.size() {
                    continue;
                }
                next_write = off + len as u64;
                let pat = (1 << 30) + below(&mut rng, 1 << 20) * 8;
                let mut data = vec![0u8; len];
                p2pdma_tests::fill_image(pat, &mut data);
                mem.write_at(at, &data).map_err(err)?;
                MemRange::new(mem, at, len)
                    .and_then(|range| ns.write(off, range))
                    .map_err(err)?;
                mem.write_at(0, &vec![CANARY; mem.len()]).map_err(err)?;
                MemRange::new(mem, at, len)
                    .and_then(|range| ns.read(off, range))
                    .map_err(err)?;
                let mut got = vec![0u8; len];
                mem.read_at(at, &mut got).map_err(err)?;
                if let Some(i) = first_diff(&data, &got) {
                    return Err(format!(
                        "write of {len} bytes at {off}: byte {i} reads back wrong"
                    ));
                }
                if let Some(i) = canary_broken(mem, at..at + len)? {
                    return Err(format!(
                        "reading back the write at {off}: byte {i} outside changed"
                    ));
                }
                if x.keep_writes {
                    println!(
                        "@@RESULT nvme-write image={} nvme_offset={off} pattern_offset={pat} len={len}",
                        x.image
                    );
                } else {
                    // The image's own bytes again, for the steps after.
                    let orig = image(x.image_pattern_offset, off, len);
                    mem.write_at(at, &orig).map_err(err)?;
                    MemRange::new(mem, at, len)
                        .and_then(|range| ns.write(off, range))
                        .map_err(err)?;
                }
                writes += 1;
            }
        }
    }
    // Pendings forgotten inside a scope: the scope still waits for their
    // commands (the bytes are there when it returns) and frees their ids
    // (the queue takes as many commands at once again).
    let depth = ctrl.queue_depth();
    let per = (4096 / bs) as u32;
    let read_at = |i: usize| -> Result<IoCommand<'_>, String> {
        let payload = maps[0].payload(i * 4096, 4096).map_err(err)?;
        Ok(IoCommand::read(
            x.nsid,
            i as u64 * u64::from(per),
            per,
            payload,
        ))
    };
    accel.write_at(0, &vec![CANARY; accel.len()]).map_err(err)?;
    ctrl.scope(|s| -> Result<(), String> {
        for i in 0..depth {
            std::mem::forget(s.submit(0, &read_at(i)?).map_err(err)?);
        }
        Ok(())
    })?;
    compare(
        x,
        "reads whose Pendings were forgotten",
        &*accel,
        0,
        0,
        depth * 4096,
    )?;
    ctrl.scope(|s| -> Result<(), String> {
        let mut flight = Vec::new();
        for i in 0..depth {
            match s.try_submit(0, &read_at(i)?).map_err(err)? {
                Some(p) => flight.push(p),
                None => {
                    return Err(format!(
                        "after a scope whose Pendings were forgotten, only {i} of {depth} commands found a free id"
                    ))
                }
            }
        }
        flight
            .into_iter()
            .try_for_each(|p| p.wait().map(|_| ()).map_err(err))
    })?;
    println!("{depth} reads whose Pendings were forgotten landed, and their ids were free again");
    ns.flush().map_err(err)?;
    if !ns.unregister(&*accel) {
        return Err("the accelerator memory was not registered".into());
    }
    if let Some(f) = ctrl.failure() {
        return Err(format!("the controller failed: {f}"));
    }
    println!("{reads} reads right, {refused} refused, {writes} writes read back right; no byte outside a payload changed");
    Ok(())
}

/// Waits up to 5 s for the controller to announce one more namespace
/// change than `before` (each scope that opens looks for it).
fn await_change(ctrl: &Controller, before: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while ctrl.namespace_changes() <= before {
        if Instant::now() > deadline {
            return Err(format!(
                "no Namespace Attribute Changed event handled in 5 s (namespaces now {:?})",
                ctrl.namespaces().iter().map(|n| n.nsid).collect::<Vec<_>>()
            ));
        }
        ctrl.scope(|_| ());
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn events(x: &QueuesArgs, module: &Arc<Module>) -> Result<(), String> {
    let err = |e: Error| e.to_string();
    let ctrl = take(x, module, true)?;
    let bdf = ctrl.pci().to_string();
    let info = ctrl
        .namespace_info(x.nsid)
        .ok_or_else(|| format!("namespace {} is not active", x.nsid))?;
    let cntlid = ctrl.identity().cntlid;
    let accel = ModuleMemory::alloc(module.clone(), 0, M, 0).map_err(err)?;
    let data = ctrl
        .map(&accel, 0, 4096, PeerAccess::ReadWrite)
        .map_err(err)?;
    let blocks = 4096 / info.block_size;
    let read = |what: &str| {
        let payload = data.payload(0, 4096).map_err(err)?;
        ctrl.scope(|s| {
            s.submit(0, &IoCommand::read(x.nsid, 8, blocks, payload))
                .and_then(|p| p.wait())
        })
        .map_err(|e| format!("{what}: {e}"))
    };
    read("a read before the detach")?;
    compare(
        x,
        "the read before the detach",
        &accel,
        0,
        8 * u64::from(info.block_size),
        4096,
    )?;

    // The controller list (a count, then controller ids), in host memory
    // the controller reads.
    let list = HostMemory::new(4096).map_err(err)?;
    let mut ids = vec![0u8; 4096];
    ids[0..2].copy_from_slice(&1u16.to_le_bytes());
    ids[2..4].copy_from_slice(&cntlid.to_le_bytes());
    list.write_at(0, &ids).map_err(err)?;
    let mapped = ctrl
        .map(&list, 0, 4096, PeerAccess::ReadOnly)
        .map_err(err)?;
    let prp1 = mapped.addr(0).ok_or("the list has no bus address")?;
    match ctrl.admin(
        &AdminCommand {
            opcode: admin::NAMESPACE_ATTACHMENT,
            nsid: x.nsid,
            cdw: [1, 0, 0, 0, 0, 0],
            data: Some(mapped.payload(0, 4096).map_err(err)?),
        },
        None,
    ) {
        Err(Error::InvalidArgument(e)) if e.contains("changes namespaces") => {
            println!("admin() refused it: {e}");
        }
        r => return Err(format!("Namespace Attachment through admin() gave {r:?}")),
    }
    // Namespace Attachment of the namespace to this controller (`sel` 0)
    // or its detachment (1), sent raw.
    let attach = |sel: u32, what: &str| -> Result<(), String> {
        let cmd = Command {
            opcode: admin::NAMESPACE_ATTACHMENT,
            nsid: x.nsid,
            prp1,
            cdw: [sel, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        // SAFETY: PRP1 is the page of `list` mapped for this controller,
        // which the command reads (4096 bytes, one page) and which stays
        // mapped until the call returns; the command gives the controller
        // no memory to keep and leaves the queues alone; no command for the
        // namespace is in flight, and a detached namespace moves no data
        // for any command.
        unsafe { ctrl.admin_raw(&cmd, None) }
            .map(|_| ())
            .map_err(|e| format!("Namespace Attachment ({what}): {e}"))
    };
    for (sel, what) in [(1u32, "detach"), (0, "attach")] {
        let before = ctrl.namespace_changes();
        attach(sel, what)?;
        await_change(&ctrl, before)?;
        let listed = ctrl.namespace_info(x.nsid).is_some();
        println!(
            "after the {what}: namespace {} {}; {} change(s) handled",
            x.nsid,
            if listed { "listed" } else { "not listed" },
            ctrl.namespace_changes()
        );
        match (sel, listed) {
            (1, false) => match read("a read of the detached namespace") {
                Err(e) if e.contains("not active") => println!("refused: {e}"),
                r => return Err(format!("a read of the detached namespace gave {r:?}")),
            },
            (0, true) => {
                accel.write_at(0, &[0u8; 4096]).map_err(err)?;
                read("a read after the attach")?;
                compare(
                    x,
                    "the read after the attach",
                    &accel,
                    0,
                    8 * u64::from(info.block_size),
                    4096,
                )?;
            }
            _ => {
                return Err(format!(
                    "after the {what} the namespace is listed: {listed}"
                ))
            }
        }
    }
    // A scope open across a change: its commands are checked against the
    // namespaces published when it opened; the change, looked for on
    // submission, refuses them from then on.
    let before = ctrl.namespace_changes();
    let seen = ctrl.scope(|s| -> Result<String, String> {
        let payload = || data.payload(0, 4096).map_err(err);
        s.submit(0, &IoCommand::read(x.nsid, 8, blocks, payload()?))
            .and_then(|p| p.wait())
            .map_err(|e| format!("a read in the scope before the detach: {e}"))?;
        attach(1, "detach in a scope")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match s.submit(0, &IoCommand::read(x.nsid, 8, blocks, payload()?)) {
                Err(e) if e.to_string().contains("changed while this scope was open") => {
                    return Ok(e.to_string())
                }
                Err(e) => return Err(format!("a read in the scope after the detach: {e}")),
                Ok(p) => {
                    let r = p.wait();
                    if Instant::now() > deadline {
                        return Err(format!(
                            "5 s after the detach, reads in the scope that opened before it still went to the controller (the last: {r:?})"
                        ));
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
        }
    })?;
    println!("a scope open across the detach refused its next read: {seen}");
    if ctrl.namespace_changes() <= before {
        return Err("the detach seen on submission was not counted as handled".into());
    }
    let before = ctrl.namespace_changes();
    attach(0, "attach after the scope")?;
    await_change(&ctrl, before)?;
    read("a read after the scope's detach and the attach")?;
    drop((mapped, data));
    drop(ctrl);
    let driver = claim::give_back(&bdf)?;
    println!("{bdf} back to {driver}");
    Ok(())
}
