//! In-VM test programs. Each prints `@@RESULT <name> key=value...` lines that
//! the host-side suite parses and checks against the emulated devices.

use std::{
    fs::{self, OpenOptions},
    os::unix::fs::OpenOptionsExt,
    process::ExitCode,
    ptr::NonNull,
};

mod fuzz;
mod lanes;
mod outage;
mod queues;
mod revoke;
mod store;
mod store_crash;
mod volume;

use clap::{Parser, Subcommand};
use p2pdma::{MemRange, Module};
use rustix::{
    io::pread,
    mm::{mmap, munmap, MapFlags, ProtFlags},
};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Read from storage into module memory with the library's transfer
    /// engine, check the path it chose, and report where the bytes landed.
    EngineRead {
        #[command(flatten)]
        x: EngineArgs,
    },
    /// Fill module memory with the rig image's bytes from `pattern_offset`,
    /// write them to storage with the engine, and report it for the host.
    EngineWrite {
        #[command(flatten)]
        x: EngineArgs,
        #[arg(long)]
        pattern_offset: u64,
    },
    /// Copy along a route between the NVMe namespace and the two
    /// accelerators (the one P2P reaches from the namespace, and the one it
    /// does not), check the hops the planner chose, and report where the
    /// bytes landed for the host.
    Route {
        #[command(flatten)]
        x: RouteArgs,
    },
    /// Background reads on a slow device and a fast one: the fast one's
    /// read must not wait behind the slow one's queue.
    EngineLanes {
        #[command(flatten)]
        x: lanes::LanesArgs,
    },
    /// A remote namespace's storage machine lost and back under one
    /// process: reads fail with an error while it is gone, and work again
    /// through the same open file once it is back.
    Outage {
        #[command(flatten)]
        x: outage::OutageArgs,
    },
    /// The queues path: the spare NVMe controller driven by this process
    /// through VFIO, its queues in accelerator memory.
    Queues {
        #[command(flatten)]
        x: queues::QueuesArgs,
    },
    /// Striped volumes over namespaces of controllers this process drives.
    Volume {
        #[command(flatten)]
        x: volume::VolumeArgs,
    },
    /// Strided reads of storage into module memory with the engine, in
    /// several modes side by side (each into its own region of one
    /// allocation), or a strided write from it: each checked in the guest
    /// (runs against a buffered read, everything else still poisoned), and
    /// every run reported for the host to check against the image.
    EngineStrided {
        #[command(flatten)]
        x: StridedArgs,
    },
    /// The object store on an NVMe-backed file or device, its buffers and
    /// page cache in accelerator memory, against a model.
    Store {
        #[command(flatten)]
        x: store::StoreArgs,
    },
    /// The store's cache shared by several accelerators, under many
    /// threads: every read returns what the last write on any accelerator
    /// left.
    StoreCoherence {
        #[command(flatten)]
        x: store::CoherenceArgs,
    },
    /// The store's process killed mid-update at random points, the store
    /// reopened and checked against what had returned.
    StoreCrash {
        #[command(flatten)]
        x: store_crash::CrashArgs,
    },
    /// The module's ioctls at random, good and bad arguments, from many
    /// threads in forked processes over several open files, on memfd pages
    /// they all share (pinned, and imported through udmabufs); every
    /// refusal must be a documented errno and every mapping made must
    /// unmap cleanly.
    IoctlFuzz {
        #[command(flatten)]
        x: fuzz::FuzzArgs,
    },
    /// Like `p2pmem-read`, but into memory allocated with the module's
    /// `ALLOC` ioctl and mapped with `mmap` of `/dev/p2pdma`.
    ModuleRead {
        #[arg(long, default_value = "/dev/nvme0n1")]
        nvme: String,
        #[arg(long)]
        offset: u64,
        #[arg(long)]
        len: usize,
        #[arg(long)]
        hold: bool,
    },
    /// Read `len` bytes at `offset` of an NVMe namespace with O_DIRECT into
    /// P2P memory allocated from the first accelerator's BAR, and report
    /// where in the BAR they landed.
    P2pmemRead {
        #[arg(long, default_value = "/dev/nvme0n1")]
        nvme: String,
        #[arg(long)]
        offset: u64,
        #[arg(long)]
        len: usize,
        /// Allocate and fill, but do not read: the host check must then fail.
        #[arg(long)]
        skip_read: bool,
        /// After reporting, keep the memory allocated (print `@@HELD` and
        /// sleep until killed) so that later tests cannot reuse it before the
        /// host has checked it.
        #[arg(long)]
        hold: bool,
    },
}

#[derive(clap::Args)]
struct EngineArgs {
    /// The storage: a block device or a file on a mounted filesystem.
    #[arg(long, default_value = "/dev/nvme0n1")]
    nvme: String,
    /// When the storage is a file of the rig's filesystem image: its path
    /// inside the filesystem, for the host to find it in the image.
    #[arg(long)]
    fs_name: Option<String>,
    /// After the transfer, read the range back through the page cache
    /// (buffered `pread`) and require it to equal the device memory.
    #[arg(long)]
    verify_buffered: bool,
    /// auto, p2p, nvme-cmd, bounce.
    #[arg(long, default_value = "auto")]
    path: String,
    /// Whether reads take what the page cache holds from it (auto, direct,
    /// buffered): direct unless asked, so that a check of a path moves
    /// every byte on it.
    #[arg(long, default_value = "direct")]
    page_cache: String,
    /// More engine settings, `KEY=VALUE` as in a configuration file
    /// (`chunk=64K`, `depth=1`, ...).
    #[arg(long)]
    setting: Vec<String>,
    /// How much of a read must come from the page cache: all, none or
    /// some (neither).
    #[arg(long)]
    expect_page_cache: Option<String>,
    #[arg(long)]
    offset: u64,
    #[arg(long)]
    len: usize,
    #[arg(long, default_value_t = 0)]
    mem_offset: usize,
    /// The path the engine must report having used (p2p or bounce).
    #[arg(long)]
    expect_path: String,
    /// Whether the transfer must have been retried on the bounce path.
    #[arg(long)]
    expect_retry: bool,
    /// Text the handle's reason for its path must contain (each, when
    /// given more than once).
    #[arg(long)]
    expect_reason: Vec<String>,
    /// Whether the module must have submitted the P2P I/O itself
    /// (`BLOCK_IO`, counted in `module_ios`): yes or no.
    #[arg(long)]
    module_io: Option<String>,
    /// The host's image of the block device read, when it is not the rig's
    /// first namespace (`nvme.img`).
    #[arg(long)]
    image: Option<String>,
    /// When the block device is an md array: its layout for the host's
    /// check in the members' images (`LEVEL,CHUNK,IMAGE:DATA_OFFSET,...`).
    #[arg(long)]
    array_layout: Option<String>,
    /// The transfer must fail with this errno (ENODATA or EIO), on the path
    /// chosen, and must not be redone on the bounce path.
    #[arg(long)]
    expect_errno: Option<String>,
    /// With `--expect-errno`: text the error must contain (each).
    #[arg(long)]
    expect_error: Vec<String>,
    /// With `--expect-errno`: the NVMe status the error must keep, as
    /// `(SCT << 8) | SC` (0x281: Unrecovered Read Error).
    #[arg(long, value_parser = parse_hex)]
    expect_nvme_status: Option<u32>,
    #[arg(long)]
    hold: bool,
}

#[derive(clap::Args)]
struct RouteArgs {
    #[arg(long, default_value = "/dev/nvme0n1")]
    nvme: String,
    /// `nvme-a1` (the planner's route into the unreachable accelerator),
    /// `nvme-a0-a1` (through staging in the reachable one's memory, then
    /// host memory), `a0-a1` (the namespace into the first by P2P, then
    /// the planner's route to the second) or `a1-nvme` (a write from the
    /// unreachable accelerator's memory, from the rig pattern).
    #[arg(long)]
    kind: String,
    /// Namespace offset.
    #[arg(long)]
    offset: u64,
    #[arg(long)]
    len: usize,
    /// Offset in each end's memory.
    #[arg(long, default_value_t = 0)]
    mem_offset: usize,
    /// With `a1-nvme`: where in the rig pattern the written bytes come from.
    #[arg(long, default_value_t = 0)]
    pattern_offset: u64,
    /// Bytes per chunk.
    #[arg(long, default_value_t = 256 << 10)]
    chunk: usize,
    /// The hops the route must have, as `read-direct,copy,...`.
    #[arg(long)]
    expect_hops: String,
    /// Text the route's reason must contain.
    #[arg(long)]
    expect_reason: Vec<String>,
    #[arg(long)]
    hold: bool,
}

#[derive(clap::Args)]
struct StridedArgs {
    /// The storage: a block device (the host checks against its image).
    #[arg(long, default_value = "/dev/nvme0n1")]
    nvme: String,
    /// auto, p2p, nvme-cmd, bounce.
    #[arg(long, default_value = "auto")]
    path: String,
    /// The first run's offset.
    #[arg(long)]
    base: u64,
    /// Bytes per run.
    #[arg(long)]
    run: u64,
    /// A dimension, STRIDExCOUNT, innermost first (up to three).
    #[arg(long = "dim")]
    dims: Vec<String>,
    /// The modes, each MODE or MODE:LAYOUT (sc, tat, rc, auto; packed, the
    /// default, or strided), one after another.
    #[arg(long, value_delimiter = ',', default_value = "sc,tat,rc:strided,auto")]
    modes: Vec<String>,
    /// The path SC and RC must report (TaT goes through the bounce slots
    /// on every pair).
    #[arg(long)]
    expect_path: String,
    /// Reads may have been redone on the bounce path (unaligned runs on a
    /// forced path).
    #[arg(long)]
    allow_retry: bool,
    /// Write instead of reading (the first mode only): the memory filled
    /// with the rig image's bytes from this offset, the runs written, and
    /// the runs and the gaps around them reported for the host.
    #[arg(long)]
    write_pattern: Option<u64>,
    /// Let the engine learn (measure the strided constants at first use)
    /// with its cache in this directory.
    #[arg(long)]
    learn: Option<String>,
    /// Text every report's reason must contain.
    #[arg(long)]
    expect_reason: Option<String>,
    #[arg(long)]
    hold: bool,
}

fn parse_hex(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| format!("{s}: {e}"))
}

/// Checks a transfer that had to fail: with errno `want` (and the NVMe
/// status, when asked), on the path the handle chose, and not redone on
/// the bounce path (which would read the bad range a second time).
fn expect_failure(
    x: &EngineArgs,
    want: &str,
    engine: &p2pdma::transfer::Engine,
    path: p2pdma::transfer::TransferPath,
    result: p2pdma::Result<p2pdma::transfer::Report>,
) -> Result<(), String> {
    let want_errno = match want {
        "ENODATA" => rustix::io::Errno::NODATA,
        "EIO" => rustix::io::Errno::IO,
        other => return Err(format!("unknown errno name {other}")),
    };
    let e = match result {
        Ok(r) => {
            return Err(format!(
                "the transfer succeeded ({} bytes on the {} path, retried: {}); it had to fail with {want}",
                r.bytes, r.path, r.retried
            ))
        }
        Err(e) => e,
    };
    if e.errno() != Some(want_errno) {
        return Err(format!("expected {want}, the transfer failed with: {e}"));
    }
    if let Some(text) = x.expect_error.iter().find(|t| !e.to_string().contains(*t)) {
        return Err(format!("the error does not say {text:?}: {e}"));
    }
    if let Some(status) = x.expect_nvme_status {
        match e.nvme_status() {
            Some(s) if (u32::from(s.sct()) << 8 | u32::from(s.sc())) == status => {}
            other => {
                return Err(format!(
                    "expected NVMe status {status:#x}, the error keeps {other:?}: {e}"
                ))
            }
        }
    }
    let stats = engine.stats();
    let retries = stats.p2p.snapshot().retries + stats.nvme_cmd.snapshot().retries;
    let bounce_ios = stats.bounce.snapshot().ios;
    if retries != 0 || (path != p2pdma::transfer::TransferPath::Bounce && bounce_ios != 0) {
        return Err(format!(
            "the failure was redone on the bounce path ({retries} retries, {bounce_ios} bounce I/Os): {e}"
        ));
    }
    println!("The read failed on the {path} path, as it had to, and was not redone: {e}");
    Ok(())
}

/// Physical address of the page mapped at `va`, from /proc/self/pagemap.
fn phys_of(va: u64) -> Result<u64, String> {
    let f = fs::File::open("/proc/self/pagemap").map_err(|e| format!("pagemap: {e}"))?;
    let mut entry = [0u8; 8];
    rustix::io::pread(&f, &mut entry, (va / 4096) * 8).map_err(|e| format!("pagemap: {e}"))?;
    let entry = u64::from_le_bytes(entry);
    if entry & (1 << 63) == 0 {
        return Err("page not present in pagemap".into());
    }
    Ok((entry & ((1 << 55) - 1)) * 4096 + va % 4096)
}

fn engine_run(x: &EngineArgs, write_pattern: Option<u64>) -> Result<(), String> {
    use p2pdma::{
        memory::{DeviceMemory, ModuleMemory},
        transfer::{Config, Engine, StorageFile},
    };
    use std::sync::Arc;

    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let accel = module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("no accelerator bound to p2pdma")?;
    let size = (x.mem_offset + x.len).div_ceil(4096) * 4096;
    let mem = ModuleMemory::alloc(module.clone(), accel.index, size as u64, 0)
        .map_err(|e| e.to_string())?;
    let mut cfg = Config::default();
    cfg.set("path", &x.path).map_err(|e| e.to_string())?;
    cfg.set("page_cache", &x.page_cache)
        .map_err(|e| e.to_string())?;
    for kv in &x.setting {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--setting {kv}: KEY=VALUE"))?;
        cfg.set(k, v).map_err(|e| e.to_string())?;
    }
    let engine = Engine::new(cfg, Some(module.clone()));
    let file = if write_pattern.is_some() {
        p2pdma::transfer::StorageFile::open_rw(&x.nvme)
    } else {
        StorageFile::open(&x.nvme)
    }
    .map_err(|e| e.to_string())?;
    let handle = engine.handle(&file, &mem).map_err(|e| e.to_string())?;
    println!(
        "The engine chose the {} path for {} and accelerator {}. Why: {}",
        handle.path(),
        x.nvme,
        accel.index,
        handle.reason()
    );
    for want in &x.expect_reason {
        if !handle.reason().contains(want.as_str()) {
            return Err(format!(
                "the reason does not contain {want:?}: {}",
                handle.reason()
            ));
        }
    }
    let report = match write_pattern {
        None => {
            // Poison the memory so that nothing stale can pass the host check.
            mem.write_at(0, &vec![0xC3; size])
                .map_err(|e| e.to_string())?;
            handle.read(x.offset, x.mem_offset, x.len)
        }
        Some(p) => {
            let mut buf = vec![0u8; x.len + (p % 8) as usize];
            p2pdma_tests::fill_image(p - p % 8, &mut buf);
            mem.write_at(x.mem_offset, &buf[(p % 8) as usize..])
                .map_err(|e| e.to_string())?;
            handle.write(x.offset, x.mem_offset, x.len)
        }
    };
    if let Some(want) = &x.expect_errno {
        return expect_failure(x, want, &engine, handle.path(), report);
    }
    let report = report.map_err(|e| format!("transfer on handle ({}): {e}", handle.reason()))?;
    println!("{}", transfer_sentence(x, write_pattern.is_some(), &report));
    if report.path.as_str() != x.expect_path || report.retried != x.expect_retry {
        return Err(format!(
            "expected path {} (retried: {}), the engine reported {} (retried: {})",
            x.expect_path, x.expect_retry, report.path, report.retried
        ));
    }
    if let Some(want) = &x.expect_page_cache {
        let (n, len) = (report.page_cache, x.len as u64);
        match (want.as_str(), n) {
            ("all", n) if n == len => {}
            ("none", 0) => {}
            ("some", n) if n > 0 && n < len => {}
            ("all" | "none" | "some", _) => {
                return Err(format!(
                    "--expect-page-cache {want}: {n} of the {len} bytes came from the page cache"
                ))
            }
            (other, _) => {
                return Err(format!(
                    "--expect-page-cache takes all, none or some, not {other}"
                ))
            }
        }
    }
    if let Some(want) = &x.module_io {
        let n = engine.stats().p2p.snapshot().module_ios;
        match (want.as_str(), n) {
            ("yes", 1..) | ("no", 0) => {}
            ("yes" | "no", _) => {
                return Err(format!(
                    "--module-io {want}: the module submitted {n} of the P2P I/Os"
                ))
            }
            (other, _) => return Err(format!("--module-io takes yes or no, not {other}")),
        }
    }
    if x.verify_buffered {
        verify_buffered(&x.nvme, x.offset, &mem, x.mem_offset, x.len)?;
    }
    // Only the memory stays held: the storage is closed, so that a
    // filesystem it lives on can be unmounted while the host check waits.
    let block_device = file.path().starts_with("/dev/");
    drop(handle);
    drop(file);
    drop(engine);
    let target = mem.mapping().as_ptr();
    let pci = accel.pci.to_string();
    let bar_offset = phys_of(target as u64)? - bar_start(&pci, accel.bar)? + x.mem_offset as u64;
    // The host's image of the device, when it is not the first namespace's.
    let image = x
        .image
        .as_ref()
        .map(|i| format!(" image={i}"))
        .unwrap_or_default();
    match (write_pattern, &x.fs_name) {
        (None, None) if x.array_layout.is_some() => println!(
            "@@RESULT array-read layout={} array_offset={} bar_offset={bar_offset} len={}",
            x.array_layout.as_deref().unwrap_or_default(),
            x.offset,
            x.len
        ),
        (Some(p), None) if x.array_layout.is_some() => println!(
            "@@RESULT array-write layout={} array_offset={} pattern_offset={p} len={}",
            x.array_layout.as_deref().unwrap_or_default(),
            x.offset,
            x.len
        ),
        // A file the host has no copy of: the buffered read-back is the check.
        (_, None) if !block_device => {
            if !x.verify_buffered {
                return Err("a file outside the rig image needs --verify-buffered".into());
            }
        }
        (None, None) => println!(
            "@@RESULT p2pmem-read pci={pci} bar={} nvme_offset={} bar_offset={bar_offset} len={}{image}",
            accel.bar, x.offset, x.len
        ),
        (Some(p), None) => println!(
            "@@RESULT nvme-write nvme_offset={} pattern_offset={p} len={}{image}",
            x.offset, x.len
        ),
        (None, Some(name)) => println!(
            "@@RESULT file-read fsfile={name} file_offset={} bar_offset={bar_offset} len={}",
            x.offset, x.len
        ),
        (Some(p), Some(name)) => {
            let size = fs::metadata(&x.nvme)
                .map_err(|e| format!("{}: {e}", x.nvme))?
                .len();
            println!(
                "@@RESULT file-write fsfile={name} file_offset={} pattern_offset={p} len={} size={size}",
                x.offset, x.len
            )
        }
    }
    if x.hold {
        hold_forever();
    }
    Ok(())
}

fn route_run(x: &RouteArgs) -> Result<(), String> {
    use p2pdma::{
        memory::{DeviceMemory, ModuleMemory},
        transfer::{Config, End, Engine, HopKind, RouteOptions, StorageFile, Via},
        Peer,
    };
    use std::{os::fd::AsFd, sync::Arc};

    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let write = x.kind == "a1-nvme";
    let file = if write {
        StorageFile::open_rw(&x.nvme)
    } else {
        StorageFile::open(&x.nvme)
    }
    .map_err(|e| e.to_string())?;
    // The accelerator the namespace reaches by P2P, and the one it does not.
    let nvme_fd = fs::File::open(&x.nvme).map_err(|e| format!("{}: {e}", x.nvme))?;
    let (mut near, mut far) = (None, None);
    for a in module.accelerators().map_err(|e| e.to_string())? {
        let q = module
            .p2p_query(a.index, Peer::Fd(nvme_fd.as_fd()))
            .map_err(|e| e.to_string())?;
        match q.distance {
            Some(_) => near = near.or(Some(a)),
            None => far = far.or(Some(a)),
        }
    }
    let (a0, a1) =
        match (near, far) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(
                "the rig needs one accelerator P2P reaches from the namespace and one it does not"
                    .into(),
            ),
        };
    println!(
        "accelerator {} ({}) is reachable from {}, accelerator {} ({}) is not",
        a0.index, a0.pci, x.nvme, a1.index, a1.pci
    );
    let size = (x.mem_offset + x.len).div_ceil(4096) * 4096;
    let alloc = |index, size: usize| {
        ModuleMemory::alloc(module.clone(), index, size as u64, 0).map_err(|e| e.to_string())
    };
    let m0 = alloc(a0.index, size)?;
    let m1 = alloc(a1.index, size)?;
    let staging_len = 3 * (x.chunk + 4096);
    let staging = alloc(a0.index, staging_len)?;
    for m in [&m0, &m1, &staging] {
        m.write_at(0, &vec![0xC3; m.len()])
            .map_err(|e| e.to_string())?;
    }
    let engine = Engine::new(Config::default(), Some(module.clone()));
    let nvme_end = End::Storage {
        file: &file,
        offset: x.offset,
    };
    let e0 = End::Memory {
        mem: &m0,
        offset: x.mem_offset,
    };
    let e1 = End::Memory {
        mem: &m1,
        offset: x.mem_offset,
    };
    let staged = MemRange::new(&staging, 0, staging_len).map_err(|e| e.to_string())?;
    let route = match x.kind.as_str() {
        "nvme-a1" => engine.routes().plan(nvme_end, e1),
        "nvme-a0-a1" => {
            engine
                .routes()
                .plan_through(nvme_end, &[Via::Memory(staged), Via::Host], e1)
        }
        "a0-a1" => {
            let r = MemRange::new(&m0, x.mem_offset, x.len)
                .and_then(|range| engine.read(&file, x.offset, range))
                .map_err(|e| e.to_string())?;
            println!(
                "{} bytes read into accelerator {} on the {} path",
                r.bytes, a0.index, r.path
            );
            engine.routes().plan(e0, e1)
        }
        "a1-nvme" => {
            let p = x.pattern_offset;
            let mut buf = vec![0u8; x.len + (p % 8) as usize];
            p2pdma_tests::fill_image(p - p % 8, &mut buf);
            m1.write_at(x.mem_offset, &buf[(p % 8) as usize..])
                .map_err(|e| e.to_string())?;
            engine.routes().plan(e1, nvme_end)
        }
        k => return Err(format!("unknown route kind {k}")),
    }
    .map_err(|e| format!("planning the route: {e}"))?;
    let names: Vec<String> = route
        .hops()
        .iter()
        .map(|h| match h.kind {
            HopKind::Read(p) => format!("read-{p}"),
            HopKind::Write(p) => format!("write-{p}"),
            HopKind::Copy => "copy".into(),
            HopKind::GpuCopy => "gpu-copy".into(),
        })
        .collect();
    for h in route.hops() {
        println!("hop: {h}");
    }
    println!("Why: {}", route.reason());
    if names.join(",") != x.expect_hops {
        return Err(format!(
            "hops {}, expected {}",
            names.join(","),
            x.expect_hops
        ));
    }
    for want in &x.expect_reason {
        if !route.reason().contains(want.as_str()) {
            return Err(format!(
                "the reason does not contain {want:?}: {}",
                route.reason()
            ));
        }
    }
    let opts = RouteOptions {
        chunk: Some(x.chunk),
        ..RouteOptions::default()
    };
    let rep = engine
        .routes()
        .copy(&route, x.len, &opts)
        .map_err(|e| format!("copy along the route: {e}"))?;
    println!(
        "{} bytes in {} chunks of {} in {:?}; hop busy times {:?}",
        rep.bytes, rep.chunks, rep.chunk, rep.elapsed, rep.busy
    );
    drop(route);
    drop(file);
    let landed = |m: &ModuleMemory, a: &p2pdma::Accelerator| -> Result<u64, String> {
        let t = m.mapping().as_ptr();
        let pci = a.pci.to_string();
        Ok(phys_of(t as u64)? - bar_start(&pci, a.bar)? + x.mem_offset as u64)
    };
    if write {
        println!(
            "@@RESULT nvme-write nvme_offset={} pattern_offset={} len={}",
            x.offset, x.pattern_offset, x.len
        );
    } else {
        if x.kind == "a0-a1" {
            println!(
                "@@RESULT p2pmem-read pci={} bar={} nvme_offset={} bar_offset={} len={}",
                a0.pci,
                a0.bar,
                x.offset,
                landed(&m0, &a0)?,
                x.len
            );
        }
        println!(
            "@@RESULT p2pmem-read pci={} bar={} nvme_offset={} bar_offset={} len={} mem=accel1.bin",
            a1.pci,
            a1.bar,
            x.offset,
            landed(&m1, &a1)?,
            x.len
        );
    }
    if x.hold {
        hold_forever();
    }
    Ok(())
}

/// What a transfer did, in a sentence.
fn transfer_sentence(x: &EngineArgs, write: bool, r: &p2pdma::transfer::Report) -> String {
    let storage = format!("{} at offset {}", x.nvme, x.offset);
    let memory = format!("accelerator memory at offset {}", x.mem_offset);
    let (from, to) = if write {
        (memory, storage)
    } else {
        (storage, memory)
    };
    let mut s = format!(
        "Moved {} bytes ({}) from {from} to {to} on the {} path",
        r.bytes,
        human_bytes(r.bytes),
        r.path
    );
    if r.page_cache > 0 {
        s.push_str(&format!(
            " ({} of them copied out of the page cache)",
            human_bytes(r.page_cache)
        ));
    }
    if r.retried {
        s.push_str(&format!(
            ", after the first path failed ({}) and the bounce path redid the transfer",
            r.retry_reason.as_deref().unwrap_or("no reason kept")
        ));
    }
    if r.path.as_str() == "bounce" {
        s.push_str(if r.ring_pinned {
            " (bounce buffers registered with the ring, pinned once)"
        } else {
            " (bounce buffers pinned per I/O: no memlock allowance to register them)"
        });
    }
    s.push('.');
    s
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 20 => format!("{:.2} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Reads `len` bytes at `offset` of `path` through the page cache and
/// compares them with the device memory at `mem_offset`.
fn verify_buffered(
    path: &str,
    offset: u64,
    mem: &dyn p2pdma::memory::DeviceMemory,
    mem_offset: usize,
    len: usize,
) -> Result<(), String> {
    let f = fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let (mut cached, mut landed) = (vec![0u8; len], vec![0u8; len]);
    let mut done = 0;
    while done < len {
        let n = pread(&f, &mut cached[done..], offset + done as u64)
            .map_err(|e| format!("buffered pread {path}: {e}"))?;
        if n == 0 {
            return Err(format!(
                "buffered read of {path}: short, {done} of {len} bytes"
            ));
        }
        done += n;
    }
    mem.read_at(mem_offset, &mut landed)
        .map_err(|e| e.to_string())?;
    match cached.iter().zip(&landed).position(|(a, b)| a != b) {
        None => {
            println!("buffered read of {path} matches the device memory ({len} bytes)");
            Ok(())
        }
        Some(i) => Err(format!(
            "{path} through the page cache differs from the device memory at byte {i} of {len} \
             (file offset {}): page cache {:#04x}, memory {:#04x}",
            offset + i as u64,
            cached[i],
            landed[i]
        )),
    }
}

/// A mapping of P2P memory from `/sys/bus/pci/devices/<dev>/p2pmem/allocate`.
struct P2pmem {
    ptr: NonNull<u8>,
    len: usize,
}

impl P2pmem {
    fn allocate(pci: &str, len: usize) -> Result<Self, String> {
        let path = format!("/sys/bus/pci/devices/{pci}/p2pmem/allocate");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: A fresh shared mapping of `len` bytes; nothing else refers to it.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &f,
                0,
            )
        }
        .map_err(|e| format!("mmap {path}: {e}"))?;
        Ok(Self {
            ptr: NonNull::new(ptr.cast()).ok_or("mmap returned NULL")?,
            len,
        })
    }

    fn fill(&self, byte: u8) {
        // SAFETY: The mapping is `len` bytes, writable, and only this process uses it.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) }
    }

    fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // SAFETY: The mapping is `len` readable bytes; `v` is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), v.as_mut_ptr(), self.len) };
        v
    }

    /// Physical address of the mapping's first byte, from /proc/self/pagemap.
    fn phys_addr(&self) -> Result<u64, String> {
        phys_of(self.ptr.as_ptr() as u64)
    }

    /// Fills the whole mapping with an `O_DIRECT` read of `nvme` at `offset`;
    /// `what` names the memory in errors.
    fn read_direct(&self, nvme: &str, offset: u64, what: &str) -> Result<(), String> {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(nvme)
            .map_err(|e| format!("{nvme}: {e}"))?;
        // SAFETY: The mapping is `len` writable bytes that nothing else
        // accesses while the read runs.
        let buf = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        let mut done = 0;
        while done < self.len {
            let n = pread(&f, &mut buf[done..], offset + done as u64)
                .map_err(|e| format!("O_DIRECT pread {nvme} into {what}: {e}"))?;
            if n == 0 {
                return Err(format!("short read: {done} of {} bytes", self.len));
            }
            done += n;
        }
        Ok(())
    }
}

impl Drop for P2pmem {
    fn drop(&mut self) {
        // SAFETY: Unmaps exactly the mapping made in `allocate`.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Start of `bar` of PCI device `pci` in CPU physical address space.
fn bar_start(pci: &str, bar: u8) -> Result<u64, String> {
    let path = format!("/sys/bus/pci/devices/{pci}/resource");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let line = text.lines().nth(bar.into()).ok_or("no such BAR")?;
    let start = line.split_whitespace().next().ok_or("bad resource line")?;
    u64::from_str_radix(start.trim_start_matches("0x"), 16).map_err(|e| e.to_string())
}

fn p2pmem_read(
    nvme: &str,
    offset: u64,
    len: usize,
    skip_read: bool,
    hold: bool,
) -> Result<(), String> {
    let module = Module::open().map_err(|e| e.to_string())?;
    let accel = module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("no accelerator bound to p2pdma")?;
    let pci = accel.pci.to_string();
    let mem = P2pmem::allocate(&pci, len)?;
    mem.fill(0xA5);
    let bar_offset = mem.phys_addr()? - bar_start(&pci, accel.bar)?;

    if !skip_read {
        mem.read_direct(nvme, offset, "P2P memory")?;
    }
    let landed = mem.to_vec();
    println!(
        "@@RESULT {} pci={pci} bar={} nvme_offset={offset} bar_offset={bar_offset} len={len} fnv1a={:016x}",
        if skip_read { "p2pmem-read-skipped" } else { "p2pmem-read" },
        accel.bar,
        p2pdma_tests::fnv1a(&landed)
    );
    if hold {
        hold_forever();
    }
    Ok(())
}

/// Reports `@@HELD` and sleeps until the suite kills the process, keeping
/// every allocation of the process alive.
fn hold_forever() -> ! {
    use std::io::Write;
    println!("@@HELD");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// Allocates `len` bytes with `P2PDMA_IOC_ALLOC` on the first accelerator,
/// maps them, reads the NVMe into them with O_DIRECT and reports where they
/// landed in the BAR (from the allocation's physical address).
fn module_read(nvme: &str, offset: u64, len: usize, hold: bool) -> Result<(), String> {
    use p2pdma_abi as abi;
    use rustix::ioctl::{ioctl, Opcode, Updater};

    let module = Module::open().map_err(|e| e.to_string())?;
    let accel = module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("no accelerator bound to p2pdma")?;
    let node = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p2pdma::discovery::DEVICE_NODE)
        .map_err(|e| e.to_string())?;
    let mut a = abi::P2pdmaAlloc {
        dev_index: accel.index,
        size: len as u64,
        ..Default::default()
    };
    // SAFETY: `_IOWR` of exactly `P2pdmaAlloc`, plain integers.
    unsafe {
        ioctl(
            &node,
            Updater::<{ abi::P2PDMA_IOC_ALLOC as Opcode }, abi::P2pdmaAlloc>::new(&mut a),
        )
    }
    .map_err(|e| format!("P2PDMA_IOC_ALLOC: {e}"))?;
    // SAFETY: A fresh shared mapping of the allocation; nothing else refers to it.
    let ptr = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            &node,
            a.mmap_offset,
        )
    }
    .map_err(|e| format!("mmap of the allocation: {e}"))?;
    let mem = P2pmem {
        ptr: NonNull::new(ptr.cast()).ok_or("mmap returned NULL")?,
        len,
    };
    mem.fill(0x5A);
    let pci = accel.pci.to_string();
    let bar_offset = mem.phys_addr()? - bar_start(&pci, accel.bar)?;
    mem.read_direct(nvme, offset, "module memory")?;
    println!(
        "@@RESULT p2pmem-read pci={pci} bar={} nvme_offset={offset} bar_offset={bar_offset} len={len} fnv1a={:016x}",
        accel.bar,
        p2pdma_tests::fnv1a(&mem.to_vec())
    );
    if hold {
        hold_forever();
    }
    Ok(())
}

/* Strided transfers (engine-strided). */

/// The shape of `x`.
fn strided_shape(x: &StridedArgs) -> Result<p2pdma::transfer::Shape, String> {
    let dims = x
        .dims
        .iter()
        .map(|d| {
            let (s, c) = d
                .split_once('x')
                .ok_or_else(|| format!("--dim {d}: not STRIDExCOUNT"))?;
            Ok((
                s.parse::<u64>().map_err(|e| format!("--dim {d}: {e}"))?,
                c.parse::<u64>().map_err(|e| format!("--dim {d}: {e}"))?,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    p2pdma::transfer::Shape::new(x.base, x.run, &dims).map_err(|e| e.to_string())
}

/// A `MODE[:LAYOUT]` argument.
fn strided_mode(
    m: &str,
) -> Result<(p2pdma::transfer::StridedMode, p2pdma::transfer::Layout), String> {
    use p2pdma::transfer::{Layout, StridedMode};
    let (mode, layout) = m.split_once(':').unwrap_or((m, "packed"));
    let mode = match mode {
        "auto" => StridedMode::Auto,
        "rc" => StridedMode::Rc,
        "sc" => StridedMode::Sc,
        "tat" => StridedMode::Tat,
        other => return Err(format!("unknown mode {other}")),
    };
    let layout = match layout {
        "packed" => Layout::Packed,
        "strided" => Layout::Strided,
        other => return Err(format!("unknown layout {other}")),
    };
    Ok((mode, layout))
}

/// Ranges `(file offset, memory offset, length)` covering the runs of
/// `shape` laid out as `layout` from `mem_offset` (the bounding range for
/// RC), neighbouring runs merged where both sides are contiguous.
fn strided_ranges(
    shape: &p2pdma::transfer::Shape,
    layout: p2pdma::transfer::Layout,
    rc: bool,
    mem_offset: u64,
) -> Vec<(u64, u64, u64)> {
    let (b0, b1) = shape.bounds();
    if rc {
        return vec![(b0, mem_offset, b1 - b0)];
    }
    let mut v: Vec<(u64, u64, u64)> = Vec::new();
    for r in shape.iter() {
        let m = mem_offset
            + match layout {
                p2pdma::transfer::Layout::Packed => r.packed_offset,
                p2pdma::transfer::Layout::Strided => r.file_offset - b0,
            };
        match v.last_mut() {
            Some((f, mo, n)) if *f + *n == r.file_offset && *mo + *n == m => *n += shape.run_len(),
            _ => v.push((r.file_offset, m, shape.run_len())),
        }
    }
    v
}

/// The ranges `(offset, length)` between the runs of `shape`, and `margin`
/// bytes either side of its bounding range (from 0 at the least).
fn strided_gaps(shape: &p2pdma::transfer::Shape, margin: u64) -> Vec<(u64, u64)> {
    let (b0, b1) = shape.bounds();
    let mut gaps = Vec::new();
    let mut at = b0.saturating_sub(margin);
    for (f, _, n) in strided_ranges(shape, p2pdma::transfer::Layout::Packed, false, 0)
        .into_iter()
        .chain(std::iter::once((b1 + margin, 0, 0)))
    {
        if f > at {
            gaps.push((at, f - at));
        }
        at = f + n;
    }
    gaps
}

/// Whether a report's paths are what the pair and the mode allow.
fn strided_paths_ok(x: &StridedArgs, r: &p2pdma::transfer::StridedReport) -> Result<(), String> {
    use p2pdma::transfer::StridedMode;
    let paths: Vec<&str> = r.paths.iter().map(|p| p.as_str()).collect();
    let ok = match r.mode {
        StridedMode::Tat => paths == ["bounce"] && !r.retried,
        _ if x.allow_retry => paths.iter().all(|p| *p == x.expect_path || *p == "bounce"),
        _ => paths == [x.expect_path.as_str()] && !r.retried,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} took the paths {paths:?} (retried: {}); expected {}{}",
            r.mode,
            r.retried,
            x.expect_path,
            if x.allow_retry { " or bounce" } else { "" }
        ))
    }
}

fn engine_strided(x: &StridedArgs) -> Result<(), String> {
    use p2pdma::{
        memory::{DeviceMemory, ModuleMemory},
        transfer::{Config, Engine, Layout, StorageFile, StridedMode},
    };
    use std::sync::Arc;

    let shape = strided_shape(x)?;
    let modes = x
        .modes
        .iter()
        .map(|m| strided_mode(m))
        .collect::<Result<Vec<_>, String>>()?;
    if x.write_pattern.is_some() && modes.len() != 1 {
        return Err("a strided write takes one mode".into());
    }
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let accel = module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("no accelerator bound to p2pdma")?;
    // One region per mode, page-aligned, each as large as its layout.
    let room = |l: Layout| match l {
        Layout::Packed => shape.bytes(),
        Layout::Strided => shape.bounding_len(),
    };
    let mut regions = Vec::new();
    let mut size = 0u64;
    for &(_, layout) in &modes {
        regions.push(size);
        size += room(layout).div_ceil(4096) * 4096;
    }
    let mem =
        ModuleMemory::alloc(module.clone(), accel.index, size, 0).map_err(|e| e.to_string())?;
    let mut cfg = Config::default();
    cfg.set("path", &x.path).map_err(|e| e.to_string())?;
    if let Some(dir) = &x.learn {
        cfg.set("cache_dir", dir).map_err(|e| e.to_string())?;
    }
    let engine = Engine::new(cfg, Some(module.clone()));
    let (b0, b1) = shape.bounds();
    let reason_ok = |r: &p2pdma::transfer::StridedReport| match &x.expect_reason {
        Some(want) if !r.reason.contains(want.as_str()) => Err(format!(
            "the reason does not contain {want:?}: {}",
            r.reason
        )),
        _ => Ok(()),
    };
    let mut results = Vec::new();
    if let Some(p) = x.write_pattern {
        let (mode, layout) = modes[0];
        let file = StorageFile::open_rw(&x.nvme).map_err(|e| e.to_string())?;
        let len = room(layout) as usize;
        let mut buf = vec![0u8; len + (p % 8) as usize];
        p2pdma_tests::fill_image(p - p % 8, &mut buf);
        mem.write_at(0, &buf[(p % 8) as usize..])
            .map_err(|e| e.to_string())?;
        let r = engine
            .strided()
            .write(&file, &shape, MemRange::whole(&mem), layout, mode)
            .map_err(|e| format!("strided write ({mode}): {e}"))?;
        println!(
            "Wrote {} runs ({} bytes) of {} from accelerator memory, {:?} layout, mode {} on the {:?} path(s): {}",
            shape.runs(),
            r.bytes,
            x.nvme,
            layout,
            r.mode,
            r.paths,
            r.reason
        );
        strided_paths_ok(x, &r)?;
        reason_ok(&r)?;
        if r.mode != StridedMode::Sc || r.calls != shape.runs() {
            return Err(format!("the write went as {} in {} calls", r.mode, r.calls));
        }
        // The runs hold the pattern from where the memory puts them; the
        // gaps between them, and 4 KiB either side, the image's own bytes.
        for (f, m, n) in strided_ranges(&shape, layout, false, 0) {
            println!(
                "@@RESULT nvme-write nvme_offset={f} pattern_offset={} len={n}",
                p + m
            );
        }
        for (at, n) in strided_gaps(&shape, 4096) {
            println!("@@RESULT nvme-write nvme_offset={at} pattern_offset={at} len={n}");
        }
        if x.hold {
            hold_forever();
        }
        return Ok(());
    }
    const POISON: u8 = 0xC3;
    mem.write_at(0, &vec![POISON; size as usize])
        .map_err(|e| e.to_string())?;
    let file = StorageFile::open(&x.nvme).map_err(|e| e.to_string())?;
    let plain = fs::File::open(&x.nvme).map_err(|e| format!("{}: {e}", x.nvme))?;
    let mut device = vec![0u8; (b1 - b0) as usize];
    let mut done = 0;
    while done < device.len() {
        let n = pread(&plain, &mut device[done..], b0 + done as u64)
            .map_err(|e| format!("buffered pread {}: {e}", x.nvme))?;
        if n == 0 {
            return Err(format!("{} ends inside the shape", x.nvme));
        }
        done += n;
    }
    for (&(mode, layout), &region) in modes.iter().zip(&regions) {
        let r = MemRange::from_offset(&mem, region as usize)
            .and_then(|range| engine.strided().read(&file, &shape, range, layout, mode))
            .map_err(|e| format!("strided read ({mode}, {layout:?}): {e}"))?;
        println!(
            "Read {} runs ({} bytes) of {} into accelerator memory at offset {region}, {:?} layout, asked {mode}, moved by {} on the {:?} path(s), {} storage bytes in {} calls: {}",
            shape.runs(),
            r.bytes,
            x.nvme,
            layout,
            r.mode,
            r.paths,
            r.storage_bytes,
            r.calls,
            r.reason
        );
        if (mode != StridedMode::Auto && r.mode != mode) || r.bytes != shape.bytes() {
            return Err(format!(
                "asked {mode}, the read went as {} ({} bytes)",
                r.mode, r.bytes
            ));
        }
        strided_paths_ok(x, &r)?;
        reason_ok(&r)?;
        // In the guest: the runs (and RC's gaps) equal a buffered read of
        // the device, every other byte of the region is still poison.
        let len = room(layout) as usize;
        let mut got = vec![0u8; len];
        mem.read_at(region as usize, &mut got)
            .map_err(|e| e.to_string())?;
        let mut want = vec![POISON; len];
        for (f, m, n) in strided_ranges(&shape, layout, r.mode == StridedMode::Rc, 0) {
            let (f, m, n) = ((f - b0) as usize, m as usize, n as usize);
            want[m..m + n].copy_from_slice(&device[f..f + n]);
        }
        if let Some(i) = (0..len).find(|&i| got[i] != want[i]) {
            return Err(format!(
                "{} ({layout:?}): memory byte {i} of the region is {:#04x}, want {:#04x}",
                r.mode, got[i], want[i]
            ));
        }
        results.push((r.mode, layout, region));
    }
    println!(
        "Every run matches a buffered read of {} and every other byte is untouched.",
        x.nvme
    );
    drop(file);
    drop(engine);
    let target = mem.mapping().as_ptr();
    let pci = accel.pci.to_string();
    let bar0 = phys_of(target as u64)? - bar_start(&pci, accel.bar)?;
    for (mode, layout, region) in results {
        for (f, m, n) in strided_ranges(&shape, layout, mode == StridedMode::Rc, region) {
            println!(
                "@@RESULT p2pmem-read pci={pci} bar={} nvme_offset={f} bar_offset={} len={n}",
                accel.bar,
                bar0 + m
            );
        }
    }
    if x.hold {
        hold_forever();
    }
    Ok(())
}

fn main() -> ExitCode {
    let r = match Cli::parse().cmd {
        Cmd::EngineRead { x } => engine_run(&x, None),
        Cmd::Route { x } => route_run(&x),
        Cmd::Queues { x } => queues::run(&x),
        Cmd::Volume { x } => volume::run(&x),
        Cmd::EngineLanes { x } => lanes::run(&x),
        Cmd::Outage { x } => outage::run(&x),
        Cmd::Store { x } => store::run(&x),
        Cmd::StoreCoherence { x } => store::coherence(&x),
        Cmd::StoreCrash { x } => store_crash::run(&x),
        Cmd::IoctlFuzz { x } => fuzz::run(&x),
        Cmd::EngineWrite { x, pattern_offset } => engine_run(&x, Some(pattern_offset)),
        Cmd::EngineStrided { x } => engine_strided(&x),
        Cmd::ModuleRead {
            nvme,
            offset,
            len,
            hold,
        } => module_read(&nvme, offset, len, hold),
        Cmd::P2pmemRead {
            nvme,
            offset,
            len,
            skip_read,
            hold,
        } => p2pmem_read(&nvme, offset, len, skip_read, hold),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("p2pdma-vmtest: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use p2pdma::transfer::{Layout, Shape};

    use super::*;

    #[test]
    fn strided_ranges_cover_the_runs_and_merge_contiguous_ones() {
        // Rows of 3 touching runs of 10, rows 100 apart, from 1000.
        let s = Shape::new(1000, 10, &[(10, 3), (100, 2)]).unwrap();
        assert_eq!(
            strided_ranges(&s, Layout::Packed, false, 7),
            [(1000, 7, 30), (1100, 37, 30)]
        );
        assert_eq!(
            strided_ranges(&s, Layout::Strided, false, 7),
            [(1000, 7, 30), (1100, 107, 30)]
        );
        assert_eq!(
            strided_ranges(&s, Layout::Strided, true, 7),
            [(1000, 7, 130)]
        );
        assert_eq!(strided_gaps(&s, 5), [(995, 5), (1030, 70), (1130, 5)]);
        // Apart: one range each; the margin stops at 0.
        let s = Shape::new(0, 4, &[(8, 3)]).unwrap();
        assert_eq!(
            strided_ranges(&s, Layout::Packed, false, 0),
            [(0, 0, 4), (8, 4, 4), (16, 8, 4)]
        );
        assert_eq!(strided_gaps(&s, 2), [(4, 4), (12, 4), (20, 2)]);
    }

    #[test]
    fn strided_arguments_parse() {
        assert!(strided_mode("rc:strided").is_ok());
        assert!(strided_mode("sc:diagonal").is_err());
        assert!(strided_mode("fast").is_err());
    }
}
