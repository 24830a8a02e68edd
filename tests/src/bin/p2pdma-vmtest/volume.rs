//! Striped volumes over namespaces this process drives (the queues path):
//! member controllers under the switch taken from the nvme driver, a
//! volume over them with a chunk size, its data from a window of its own on
//! each member. Every read is checked in the guest against the members'
//! rig content where the tests' own model of md's raid0 layout puts it
//! (`mdlayout`); reads into accelerator memory and writes are reported for
//! the host, which checks them in the BAR's backing file and in every
//! member's image. Then random reads and writes from several threads
//! against a shadow of the volume, the store on the volume (its pages on
//! every member), and a member with a bad block, whose error names it.

use std::{
    os::unix::fs::FileExt,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use clap::{Args, ValueEnum};
use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    queues::{claim, Controller, InitOptions},
    store::{EngineBacking, Store},
    sys::vfio,
    transfer::{Config, Engine, Namespace, StorageFile, TransferPath, Volume},
    MemRange, Module,
};
use p2pdma_tests::{fill_image, mdlayout::Layout};

const M: u64 = 1 << 20;
/// How long a command may take in the stall step before it is aborted.
const STALL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Step {
    /// Reads and writes on every alignment into accelerator and host
    /// memory, many threads against a shadow, the store on the volume;
    /// then the controllers go back to the nvme driver and (with `--hold`)
    /// the accelerator memory the host checks stays allocated.
    Data,
    /// A read over the run that lies on a member's bad block fails with
    /// `ENODATA`, naming that member; the other members' runs still read.
    BadMember,
    /// A member that stops answering under running reads: its bus
    /// mastering turned off, the emulated controller fetches no command
    /// and reports a fatal status. The read in flight fails within the
    /// command timeout and its abort, naming that member, and so do the
    /// reads after it; every read that succeeded before has the right
    /// bytes.
    Stall,
}

#[derive(Args)]
pub struct VolumeArgs {
    #[arg(long, value_enum)]
    step: Step,
    /// The members' serials, in stripe order.
    #[arg(long, value_delimiter = ',', required = true)]
    serials: Vec<String>,
    /// Each member's namespace id.
    #[arg(long, value_delimiter = ',', required = true)]
    nsids: Vec<u32>,
    /// Each member's image, as the host names it.
    #[arg(long, value_delimiter = ',', required = true)]
    images: Vec<String>,
    /// Where each image's content starts in the rig content stream.
    #[arg(long, value_delimiter = ',', required = true)]
    pattern_offsets: Vec<u64>,
    #[arg(long)]
    chunk: u64,
    /// Where the volume's data starts on each member.
    #[arg(long)]
    data_offset: u64,
    /// Bytes of the volume, from its start, the step may use.
    #[arg(long)]
    window: u64,
    /// The rig content offset the writes take their bytes from.
    #[arg(long, default_value_t = 900 << 20)]
    write_pattern: u64,
    /// For the bad member: the volume offset of a run on its bad block.
    #[arg(long, default_value_t = 0)]
    bad_offset: u64,
    /// After the data step, keep the accelerator memory held.
    #[arg(long)]
    hold: bool,
}

struct Rig {
    module: Arc<Module>,
    volume: Arc<Volume>,
    layout: Layout,
    spec: String,
    pats: Vec<u64>,
}

/// The rig content at `offset`, `len` bytes.
fn content(offset: u64, len: usize) -> Vec<u8> {
    let start = offset / 8 * 8;
    let skip = (offset - start) as usize;
    let mut v = vec![0u8; len + skip + 8];
    fill_image(start, &mut v);
    v[skip..skip + len].to_vec()
}

impl Rig {
    fn open(x: &VolumeArgs) -> Result<Self, String> {
        let n = x.serials.len();
        if x.nsids.len() != n || x.images.len() != n || x.pattern_offsets.len() != n {
            return Err(
                "--serials, --nsids, --images and --pattern-offsets differ in length".into(),
            );
        }
        let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
        let mut members = Vec::new();
        for (serial, &nsid) in x.serials.iter().zip(&x.nsids) {
            let ctrl = match x.step {
                // A short timeout, for the member that stops answering.
                Step::Stall => {
                    let pci = crate::queues::controller_bdf(serial)?
                        .parse()
                        .map_err(|e: p2pdma::Error| e.to_string())?;
                    let opts = InitOptions {
                        unbind: true,
                        queues: 4,
                        entries: 64,
                        timeout: STALL_TIMEOUT,
                        ..Default::default()
                    };
                    Controller::initialize(module.clone(), pci, &opts).map_err(|e| e.to_string())?
                }
                _ => crate::queues::take_controller(serial, &module, true)?,
            };
            members.push(Arc::new(
                Namespace::new(ctrl, module.clone(), nsid).map_err(|e| e.to_string())?,
            ));
        }
        let smallest = members.iter().map(|m| m.size()).min().unwrap_or(0);
        let volume = Volume::striped(members, x.chunk, x.data_offset).map_err(|e| e.to_string())?;
        let want = (smallest - x.data_offset) / x.chunk * x.chunk * n as u64;
        if volume.size() != want {
            return Err(format!(
                "the volume has {} bytes, not {want}",
                volume.size()
            ));
        }
        let spec = format!(
            "raid0,{},{}",
            x.chunk,
            x.images
                .iter()
                .map(|i| format!("{i}:{}", x.data_offset))
                .collect::<Vec<_>>()
                .join(",")
        );
        Ok(Self {
            module,
            volume: Arc::new(volume),
            layout: Layout::parse(&spec)?,
            spec,
            pats: x.pattern_offsets.clone(),
        })
    }

    /// The volume's bytes at `offset`, from the members' rig content.
    fn expected(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        for p in self.layout.pieces(offset, len as u64) {
            let at = (p.array_offset - offset) as usize;
            v[at..at + p.len as usize].copy_from_slice(&content(
                self.pats[p.member] + p.member_offset,
                p.len as usize,
            ));
        }
        v
    }

    /// Runs `f` with the volume, then gives the controllers back to the
    /// nvme driver whatever `f` returned, and waits for them.
    fn with(x: &VolumeArgs, f: impl FnOnce(&Rig) -> Result<(), String>) -> Result<(), String> {
        let rig = Self::open(x)?;
        let r = f(&rig);
        let back = rig.give_back(x);
        r.and(back)
    }

    fn give_back(self, x: &VolumeArgs) -> Result<(), String> {
        let bdfs: Vec<String> = self
            .volume
            .members()
            .iter()
            .map(|m| m.controller().pci().to_string())
            .collect();
        drop(self.volume);
        let mut failed = Vec::new();
        for bdf in &bdfs {
            match claim::give_back(bdf) {
                Ok(driver) if driver == "nvme" => {}
                Ok(driver) => failed.push(format!("{bdf} went back to {driver}, not nvme")),
                Err(e) => failed.push(e),
            }
        }
        if !failed.is_empty() {
            return Err(failed.join("; "));
        }
        for serial in &x.serials {
            let mut waited = 0;
            while p2pdma::discovery::nvme_by_serial(serial).is_err() {
                if waited > 200 {
                    return Err(format!("the nvme driver did not bring {serial} back"));
                }
                thread::sleep(Duration::from_millis(100));
                waited += 1;
            }
        }
        Ok(())
    }
}

fn first_diff(want: &[u8], got: &[u8]) -> Option<usize> {
    want.iter().zip(got).position(|(a, b)| a != b)
}

pub fn run(x: &VolumeArgs) -> Result<(), String> {
    let mut held = None;
    Rig::with(x, |rig| match x.step {
        Step::Data => data(rig, x).map(|bar| held = Some(bar)),
        Step::BadMember => bad_member(rig, x),
        Step::Stall => stall(rig),
    })?;
    println!("the controllers are the nvme driver's again");
    if x.hold {
        // The accelerator memory the host checks stays allocated.
        let _bar = held;
        crate::hold_forever();
    }
    Ok(())
}

/// Reads `len` bytes at `offset` into `mem` at `at` with the engine and
/// checks them against the model.
fn read_check(
    rig: &Rig,
    engine: &Engine,
    file: &StorageFile,
    mem: &dyn DeviceMemory,
    offset: u64,
    len: usize,
    at: usize,
) -> Result<(), String> {
    let report = engine
        .read(
            file,
            offset,
            MemRange::new(mem, at, len).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("read of {len} bytes at {offset}: {e}"))?;
    if report.path != TransferPath::Queues {
        return Err(format!("the read took the {} path", report.path));
    }
    let mut got = vec![0u8; len];
    mem.read_at(at, &mut got).map_err(|e| e.to_string())?;
    if let Some(i) = first_diff(&rig.expected(offset, len), &got) {
        return Err(format!(
            "read of {len} bytes at volume offset {offset}: byte {i} differs from the members' content"
        ));
    }
    Ok(())
}

/// The data step; the accelerator memory the host is told to check.
fn data(rig: &Rig, x: &VolumeArgs) -> Result<ModuleMemory, String> {
    let n = rig.volume.members().len();
    let engine = Arc::new(Engine::new(Config::default(), Some(rig.module.clone())));
    let file = Arc::new(StorageFile::volume(rig.volume.clone()));
    let accel = rig.module.accelerator(0).map_err(|e| e.to_string())?;
    let bar = ModuleMemory::alloc(rig.module.clone(), accel.index, 11 * M, 0)
        .map_err(|e| e.to_string())?;
    let choice = engine.choose(&file, &bar).map_err(|e| e.to_string())?;
    let want = format!(
        "data on each of its {n} members, accelerator {}'s memory mapped for the controller (DMA_MAP)",
        accel.index
    );
    if choice.path != TransferPath::Queues || !choice.reason.contains(&want) {
        return Err(format!("AUTO chose {}: {}", choice.path, choice.reason));
    }
    println!("AUTO: {}", choice.reason);

    // Into accelerator memory: the window's first stripes whole, then
    // ends off every boundary, and memory not dword aligned (staged).
    let half = x.window / 2;
    let cases = [
        (0, 3 * M as usize, 0),
        (x.chunk * 3 + 1000, (M + 777) as usize, (3 * M) as usize + 4),
        (
            x.chunk * 5 - 512,
            (x.chunk + 1024) as usize,
            (5 * M) as usize + 1,
        ),
        (half - 4096, 4096, (7 * M) as usize),
    ];
    for (off, len, at) in cases {
        read_check(rig, &engine, &file, &bar, off, len, at)?;
    }
    // The CPU has read the memory: its pages are in the page tables.
    let target = bar.mapping().as_ptr();
    let bar_base =
        crate::phys_of(target as u64)? - crate::bar_start(&accel.pci.to_string(), accel.bar)?;
    for (off, len, at) in cases {
        println!(
            "@@RESULT array-read layout={} array_offset={off} bar_offset={} len={len}",
            rig.spec,
            bar_base + at as u64
        );
    }
    // Into host memory (pinned for the controllers).
    let host = HostMemory::new((2 * M) as usize).map_err(|e| e.to_string())?;
    read_check(
        rig,
        &engine,
        &file,
        &host,
        x.chunk - 100,
        (M + 200) as usize,
        12,
    )?;
    println!("reads into accelerator and host memory match the members' content");

    // Threads at once: random reads of the first half, random writes of
    // the second, each thread its own part, against a shadow of the part.
    let threads = 4u64;
    let part = half / threads / 4096 * 4096;
    let errors: Vec<String> = thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (engine, file) = (&engine, &file);
                s.spawn(move || -> Result<(), String> {
                    let mut rng = fastrand::Rng::with_seed(0x5eed + t);
                    let mem = HostMemory::new((M + 8192) as usize).map_err(|e| e.to_string())?;
                    for _ in 0..24 {
                        let len = rng.usize(1..=M as usize);
                        let off = rng.u64(0..half - len as u64);
                        read_check(rig, engine, file, &mem, off, len, rng.usize(0..8192))?;
                    }
                    let base = half + t * part;
                    let mut shadow = rig.expected(base, part as usize);
                    for _ in 0..24 {
                        let len = rng.usize(1..=(part as usize).min(256 << 10));
                        let off = rng.usize(0..=part as usize - len);
                        let at = rng.usize(0..8192);
                        let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                        mem.write_at(at, &bytes).map_err(|e| e.to_string())?;
                        let r = MemRange::new(&mem, at, len).map_err(|e| e.to_string())?;
                        engine
                            .write(file, base + off as u64, r)
                            .map_err(|e| format!("write of {len} bytes at {}: {e}", base + off as u64))?;
                        shadow[off..off + len].copy_from_slice(&bytes);
                    }
                    let back = HostMemory::new(part as usize).map_err(|e| e.to_string())?;
                    let r = MemRange::new(&back, 0, part as usize).map_err(|e| e.to_string())?;
                    engine.read(file, base, r).map_err(|e| e.to_string())?;
                    let mut got = vec![0u8; part as usize];
                    back.read_at(0, &mut got).map_err(|e| e.to_string())?;
                    match first_diff(&shadow, &got) {
                        Some(i) => Err(format!(
                            "thread {t}: byte {} of the volume differs from the shadow after 24 writes",
                            base + i as u64
                        )),
                        None => Ok(()),
                    }
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some("a thread panicked".into()),
            })
            .collect()
    });
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    println!("{threads} threads' random reads match the model, their random writes their shadows");

    // A write of accelerator memory filled with rig content, for the host
    // to find in every member's image; read back into host memory.
    let (w_off, w_len) = (half + 4096 + 123, (2 * M + 4321) as usize);
    // Past the reads the host checks.
    let w_at = (8 * M + 20) as usize;
    bar.write_at(w_at, &content(x.write_pattern, w_len))
        .map_err(|e| e.to_string())?;
    engine
        .write(
            &file,
            w_off,
            MemRange::new(&bar, w_at, w_len).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
    file.sync().map_err(|e| e.to_string())?;
    let back = HostMemory::new(w_len).map_err(|e| e.to_string())?;
    engine
        .read(
            &file,
            w_off,
            MemRange::new(&back, 0, w_len).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
    let mut got = vec![0u8; w_len];
    back.read_at(0, &mut got).map_err(|e| e.to_string())?;
    if let Some(i) = first_diff(&content(x.write_pattern, w_len), &got) {
        return Err(format!("the write read back differs at byte {i}"));
    }
    println!(
        "@@RESULT array-write layout={} array_offset={w_off} pattern_offset={} len={w_len}",
        rig.spec, x.write_pattern
    );

    // The store on the volume: objects written and read back, their pages
    // on every member.
    store_on(rig, &engine, &file, x)?;
    Ok(bar)
}

/// The object store on the last quarter of the window.
fn store_on(
    rig: &Rig,
    engine: &Arc<Engine>,
    file: &Arc<StorageFile>,
    x: &VolumeArgs,
) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let region = x.window / 4 / x.chunk * x.chunk;
    let start = x.window - region;
    let backing =
        Arc::new(EngineBacking::region(engine.clone(), file.clone(), start, region).map_err(err)?);
    let store = Store::format(backing.clone(), 64).map_err(err)?;
    let sizes = [3 * x.chunk + 4097, x.chunk / 2, 5 * x.chunk];
    let mem = HostMemory::new((6 * x.chunk) as usize).map_err(err)?;
    let mut ids = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let id = store.pcreate(size).map_err(err)?;
        let bytes = content(x.write_pattern + (i as u64) * 7 * M, size as usize);
        mem.write_at(0, &bytes).map_err(err)?;
        store
            .pwrite(id, 0, MemRange::new(&mem, 0, size as usize).map_err(err)?)
            .map_err(err)?;
        ids.push((id, bytes));
    }
    store.flush().map_err(err)?;
    drop(store);
    let store = Store::initialize(backing).map_err(err)?;
    for (id, bytes) in &ids {
        let n = bytes.len();
        store
            .pread(*id, 0, MemRange::new(&mem, 0, n).map_err(err)?)
            .map_err(err)?;
        let mut got = vec![0u8; n];
        mem.read_at(0, &mut got).map_err(err)?;
        if let Some(i) = first_diff(bytes, &got) {
            return Err(format!(
                "store object {id}: byte {i} differs after reopening"
            ));
        }
    }
    // Every member holds some of the region.
    let slots: std::collections::BTreeSet<usize> = rig
        .volume
        .layout(start, region)
        .iter()
        .map(|r| r.1)
        .collect();
    if slots.len() != rig.volume.members().len() {
        return Err(format!("the store's region lies on members {slots:?} only"));
    }
    println!(
        "the store on the volume: {} objects written, reopened and read back; its region spans all {} members",
        ids.len(),
        slots.len()
    );
    Ok(())
}

/// A volume with a member whose image has a bad block.
fn bad_member(rig: &Rig, x: &VolumeArgs) -> Result<(), String> {
    let engine = Engine::new(Config::default(), Some(rig.module.clone()));
    let file = StorageFile::volume(rig.volume.clone());
    let mem = HostMemory::new((4 * x.chunk) as usize).map_err(|e| e.to_string())?;
    let (off, len) = (x.bad_offset / x.chunk * x.chunk, (2 * x.chunk) as usize);
    let runs = rig.volume.layout(off, len as u64);
    let bad = runs
        .iter()
        .find(|r| r.0 <= x.bad_offset && x.bad_offset < r.0 + r.3)
        .ok_or("no run holds --bad-offset")?;
    let member = rig.volume.members()[bad.1].name();
    let r = MemRange::new(&mem, 0, len).map_err(|e| e.to_string())?;
    match engine.read(&file, off, r) {
        Ok(_) => return Err(format!("a read over {member}'s bad block succeeded")),
        Err(e) => {
            let text = e.to_string();
            let named = format!("member {member} (slot {})", bad.1);
            if e.errno() != Some(rustix::io::Errno::NODATA) || !text.contains(&named) {
                return Err(format!(
                    "the read failed with {text}, not ENODATA naming {named}"
                ));
            }
            println!("the read over the bad block fails: {text}");
        }
    }
    // The runs on the other members still read, and are right.
    for r in runs.iter().filter(|r| r.1 != bad.1) {
        read_check(rig, &engine, &file, &mem, r.0, r.3 as usize, 0)?;
    }
    println!("the other members' runs read right");
    Ok(())
}

/// Turns bus mastering of PCI function `bdf` on or off (its command
/// register, through sysfs).
fn bus_master(bdf: &str, on: bool) -> Result<(), String> {
    let path = format!("/sys/bus/pci/devices/{bdf}/config");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{path}: {e}"))?;
    let mut cmd = [0u8; 2];
    f.read_exact_at(&mut cmd, vfio::PCI_COMMAND)
        .map_err(|e| format!("{path}: {e}"))?;
    let v = u16::from_le_bytes(cmd);
    let v = match on {
        true => v | vfio::PCI_COMMAND_MASTER,
        false => v & !vfio::PCI_COMMAND_MASTER,
    };
    f.write_all_at(&v.to_le_bytes(), vfio::PCI_COMMAND)
        .map_err(|e| format!("{path}: {e}"))
}

fn stall(rig: &Rig) -> Result<(), String> {
    let engine = Engine::new(Config::default(), Some(rig.module.clone()));
    let file = StorageFile::volume(rig.volume.clone());
    let len = (2 * M) as usize;
    let slot = rig.volume.members().len() - 1;
    let victim = &rig.volume.members()[slot];
    let bdf = victim.controller().pci().to_string();
    let named = format!("member {} (slot {slot})", victim.name());
    let mem = HostMemory::new(len).map_err(|e| e.to_string())?;
    read_check(rig, &engine, &file, &mem, 0, len, 0)?;
    let (ok, failed) = thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut ok = 0;
            for i in 0..400u64 {
                let off = (i % 8) * len as u64;
                match read_check(rig, &engine, &file, &mem, off, len, 0) {
                    Ok(()) => ok += 1,
                    Err(e) => return (ok, Some((e, Instant::now()))),
                }
            }
            (ok, None)
        });
        thread::sleep(Duration::from_millis(50));
        let stopped = Instant::now();
        let r = bus_master(&bdf, false);
        let (ok, failed) = reader.join().unwrap_or((0, None));
        (ok, failed.map(|(e, at)| (e, r.map(|()| at - stopped))))
    });
    let Some((e, took)) = failed else {
        return Err(format!(
            "{ok} reads went on and succeeded after {bdf} stopped answering"
        ));
    };
    let took = took?;
    if !e.contains(&named) || !e.contains(&bdf) {
        return Err(format!("the read failed without naming {named}: {e}"));
    }
    if took > STALL_TIMEOUT * 10 {
        return Err(format!("the read took {took:?} to fail: {e}"));
    }
    println!("{ok} reads right before the stall; the one in flight failed {took:?} after it: {e}");
    // The member stays failed: the next read fails at once, naming it.
    let t0 = Instant::now();
    match read_check(rig, &engine, &file, &mem, 0, len, 0) {
        Ok(()) => return Err("a read after the stall succeeded".into()),
        Err(e) if e.contains(&named) => {
            println!("the next read fails in {:?}: {e}", t0.elapsed())
        }
        Err(e) => return Err(format!("the next read failed without naming {named}: {e}")),
    }
    bus_master(&bdf, true)
}
