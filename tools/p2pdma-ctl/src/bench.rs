//! `p2pdma-ctl bench`: measurements taken side by side in one run and
//! printed as ratios, with the machine described. Never pass/fail.
//!
//! - `storage`: the storage limit first (fio, io_uring, `O_DIRECT`, swept
//!   over block size, depth, fixed buffers and huge pages on the same file)
//!   and the bounce pipeline's best chunk and depth (a smaller sweep); then,
//!   interleaved, fio at the limit's settings and at the bench's, the
//!   pipeline at the bench's, the limit's and its own best settings, the
//!   engine as AUTO configures it, and the serial approach (`O_DIRECT`
//!   reads of the whole range into one host buffer, then one copy), all
//!   reading sequentially into the host-memory device (or, with `--accel`,
//!   accelerator memory), as ratios to the limit; every contender's data
//!   is checked against the file;
//! - `copy`: small copies into a shared mapping with the library's copy
//!   routines (and into accelerator memory, with the module) vs one
//!   `pwrite(2)` per copy;
//! - `small`: 4 KiB random reads through `Engine::read` vs `pread` with
//!   `O_DIRECT` plus a copy into the same memory, same file and offsets;
//! - `strided`: a grid of strided reads, volumes (2 MiB, 64 MiB, 1 GiB) by
//!   rho (25 to 100 %) by run length (512 B to 1 MiB), each cell read by SC
//!   and TaT (packed), RC (strided layout) and AUTO in both layouts,
//!   interleaved, with each one's time and device space and AUTO's ratio
//!   to the best it could have chosen; every result checked against the
//!   file;
//! - `cpu`: CPU time per GiB moved from an NVMe namespace into accelerator
//!   memory, per path (needs the module; meant for the VM rig, where the
//!   emulated devices' DMA runs outside the guest).

use std::{
    fs::File,
    io::Write,
    os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt},
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use p2pdma::{
    backend::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{Config, Engine, Layout, P2pSubmit, PathPref, Shape, StorageFile, StridedMode},
    Module,
};
use serde_json::{json, Value};

pub(crate) type Res<T> = Result<T, String>;

/// Which benchmark, and its knobs.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// storage, copy, small, strided, route, cpu, queues or all (storage,
    /// copy and small).
    #[arg(default_value = "all")]
    pub what: String,
    /// File to read for `storage` (created if missing or short). It must be
    /// on a filesystem that supports O_DIRECT (not tmpfs).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Bytes to read (e.g. 256M, 1G).
    #[arg(long, default_value = "256M", value_parser = crate::util::parse_size)]
    pub size: u64,
    /// Block (chunk) size, for fio and the engine alike.
    #[arg(long, default_value = "1M", value_parser = crate::util::parse_size)]
    pub bs: u64,
    /// I/Os in flight, for fio and the engine alike.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
    /// Repetitions, interleaved; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// NVMe namespace for `cpu`.
    #[arg(long, default_value = "/dev/nvme0n1")]
    pub nvme: PathBuf,
    /// `storage`: read into accelerator 0's memory (from the p2pdma
    /// module) instead of the host-memory device.
    #[arg(long)]
    pub accel: bool,
    /// `strided`: the volumes (bounding ranges) of the grid.
    #[arg(long, value_delimiter = ',', default_value = "2M,64M,1G")]
    pub volumes: Vec<String>,
    /// `strided`: rho, the percentage of each volume that is read.
    #[arg(long, value_delimiter = ',', default_value = "25,50,75,100")]
    pub rhos: Vec<String>,
    /// `strided`: the run lengths.
    #[arg(long, value_delimiter = ',', default_value = "512,4K,64K,1M")]
    pub runs: Vec<String>,
    /// `strided`: repetitions for volumes of 256 MiB and more (`--reps`
    /// is for 64 MiB; smaller volumes get proportionally more, up to 50).
    #[arg(long, default_value_t = 1)]
    pub reps_large: usize,
    /// `strided`: calibrate the strided constants (`p2pdma-ctl calibrate`)
    /// before the grid.
    #[arg(long)]
    pub calibrate: bool,
    /// `queues`: the serial number of the NVMe controller to take from the
    /// kernel (given back at the end).
    #[arg(long, default_value = "p2pdma-vfio")]
    pub serial: String,
    /// `queues`: the namespace id.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// `queues`: submitter threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// `queues`: the depths (reads in flight per thread), at most 255.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,128")]
    pub depths: Vec<usize>,
    /// `queues`: seconds per cell.
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// `queues`: most reads per thread in a cell.
    #[arg(long, default_value_t = 200_000)]
    pub max_ios: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn gib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / (1u64 << 30) as f64
}

/// The machine, in a few words.
fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split(':').nth(1))
        })
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({
        "cpu": model,
        "cores": cores,
        "memory_gib": mem_kib / (1 << 20),
        "kernel": kernel.trim(),
        "copy_routine": format!("{:?}", p2pdma::wc::CopyIsa::detect()),
    })
}

pub fn ensure_file(path: &Path, size: u64) -> Res<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() >= size)
        .unwrap_or(false)
    {
        return Ok(());
    }
    let mut f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..size.div_ceil(1 << 20) {
        let n = buf.len();
        buf.copy_from_slice(&crate::util::pattern(i, 0, n));
        f.write_all(&buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    f.sync_all().map_err(|e| format!("{}: {e}", path.display()))
}

/// How fio reads: block size, depth, registered (fixed) buffers, and
/// whether its buffers are in huge pages.
#[derive(Clone, Copy, Debug, PartialEq)]
struct FioSettings {
    bs: u64,
    depth: usize,
    fixedbufs: bool,
    huge: bool,
}

impl std::fmt::Display for FioSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bs {} KiB, depth {}{}{}",
            self.bs >> 10,
            self.depth,
            if self.fixedbufs {
                ", fixed buffers"
            } else {
                ""
            },
            if self.huge {
                ", huge-page buffers"
            } else {
                ", 4 KiB-page buffers"
            }
        )
    }
}

/// The storage limit: fio swept over block sizes, depths, fixed buffers
/// and huge pages on the same file; the fastest settings and every result.
fn fio_limit(path: &Path, size: u64) -> Res<(FioSettings, Vec<(FioSettings, f64)>)> {
    let mut results = Vec::new();
    let mut last_err = None;
    for bs in [1 << 20, 4 << 20] {
        for depth in [8, 16, 32] {
            for fixedbufs in [false, true] {
                for huge in [false, true] {
                    let st = FioSettings {
                        bs,
                        depth,
                        fixedbufs,
                        huge,
                    };
                    match fio(path, size, st) {
                        Ok(x) => results.push((st, x)),
                        Err(e) => last_err = Some(e),
                    }
                }
            }
        }
    }
    let best = results
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|&(st, _)| st)
        .ok_or_else(|| last_err.unwrap_or_else(|| "fio gave no result".into()))?;
    Ok((best, results))
}

/// fio's sequential read throughput in GiB/s.
///
/// With `huge`, fio's buffers are in transparent huge pages (glibc's
/// `glibc.malloc.hugetlb=1` tunable makes its large `malloc`s ask for them),
/// as the engine's bounce slots are: physically contiguous buffers make each
/// request one DMA segment, which is worth a good part of the throughput on
/// devices with few segments per request.
fn fio(path: &Path, size: u64, s: FioSettings) -> Res<f64> {
    let mut cmd = Command::new("fio");
    if s.huge {
        cmd.env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1");
    }
    let out = cmd
        .args([
            "--name=p2pdma-bench",
            "--rw=read",
            "--ioengine=io_uring",
            "--direct=1",
            "--numjobs=1",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--bs={}", s.bs))
        .arg(format!("--iodepth={}", s.depth))
        .arg(format!("--size={size}"))
        // An io_uring engine option: after the engine is named.
        .args(s.fixedbufs.then_some("--fixedbufs=1"))
        .output()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("fio output: {e}"))?;
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .ok_or("fio output has no read bandwidth")?;
    Ok(bw / (1u64 << 30) as f64)
}

fn engine(path: PathPref, bs: u64, depth: usize, module: Option<Arc<Module>>) -> Engine {
    Engine::new(
        Config {
            path,
            chunk: Some(bs as usize),
            depth: Some(depth),
            ..Config::default()
        },
        module,
    )
}

/// Bytes a serial read asks for at a time: large enough that the kernel
/// keeps many requests in flight for it, as a plain program's big `pread`s
/// would.
const SERIAL_PIECE: usize = 16 << 20;

/// The serial approach, as a straightforward program would do it: the
/// whole range into one host buffer (`buf`, page aligned) by `O_DIRECT`
/// `pread`s of [`SERIAL_PIECE`] bytes, then one copy into device memory.
fn serial(direct: &File, buf: &mut [u8], dst: &dyn DeviceMemory) -> Res<()> {
    let mut pos = 0;
    while pos < buf.len() {
        let n = SERIAL_PIECE.min(buf.len() - pos);
        match direct.read_at(&mut buf[pos..pos + n], pos as u64) {
            Ok(0) => return Err(format!("serial read: end of file at {pos}")),
            Ok(got) => pos += got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("serial read at {pos}: {e}")),
        }
    }
    dst.write_at(0, buf).map_err(|e| e.to_string())
}

/// Fills device memory with a byte that the file does not hold in whole
/// MiBs, so that a contender that wrote nothing fails the check.
fn poison(dst: &dyn DeviceMemory) -> Res<()> {
    let junk = vec![0xA5u8; 1 << 20];
    for off in (0..dst.len()).step_by(junk.len()) {
        let n = junk.len().min(dst.len() - off);
        dst.write_at(off, &junk[..n]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Compares device memory with the file's bytes, read without the library.
fn verify(dst: &dyn DeviceMemory, want: &[u8], who: &str) -> Res<()> {
    let mut got = vec![0u8; 1 << 20];
    for off in (0..want.len()).step_by(got.len()) {
        let n = got.len().min(want.len() - off);
        dst.read_at(off, &mut got[..n]).map_err(|e| e.to_string())?;
        if got[..n] != want[off..off + n] {
            return Err(format!(
                "{who}: the data differs from the file at offset {off}"
            ));
        }
    }
    Ok(())
}

/// One contender of the storage bench.
enum Contender {
    /// fio at these settings.
    Fio(FioSettings),
    /// The engine.
    Engine(Box<Engine>),
    /// Read everything into a host buffer, then copy once.
    Serial,
}

fn storage(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let path = a
        .file
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("p2pdma-bench.dat"));
    ensure_file(&path, a.size)?;
    let file = StorageFile::open(&path)
        .map_err(|e| format!("{e} (the file must be on a filesystem with O_DIRECT)"))?;
    let len = a.size as usize;
    // The destination: the host-memory device, or accelerator 0's memory.
    let module = match a.accel {
        true => Some(Arc::new(Module::open().map_err(|e| {
            format!("--accel: {e} (the p2pdma module must be loaded)")
        })?)),
        false => None,
    };
    let dst: Box<dyn DeviceMemory> = match &module {
        Some(m) => {
            let index = m
                .accelerators()
                .map_err(|e| e.to_string())?
                .first()
                .ok_or("--accel: no accelerator bound to the module")?
                .index;
            Box::new(
                ModuleMemory::alloc(m.clone(), index, a.size, 0)
                    .map_err(|e| format!("--accel: {} bytes of accelerator memory: {e}", a.size))?,
            )
        }
        None => Box::new(HostMemory::new(len).map_err(|e| e.to_string())?),
    };
    let dst = dst.as_ref();
    // The file's bytes, read without the library, to check every contender.
    let mut want = vec![0u8; len];
    File::open(&path)
        .and_then(|f| f.read_exact_at(&mut want, 0))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut serial_buf = vec![0u8; len + 4096];
    let align = serial_buf.as_ptr().align_offset(4096);
    let serial_buf = &mut serial_buf[align..align + len];

    // The limit first: fio at its best on this file.
    let (limit, sweep) = fio_limit(&path, a.size)?;
    // The engine's own best: a sweep of the bounce pipeline, one read each.
    let mut engine_sweep = Vec::new();
    for chunk in [1u64 << 20, 2 << 20, 4 << 20] {
        for depth in [4, 8, 16] {
            let e = engine(PathPref::Bounce, chunk, depth, None);
            e.read(&file, 0, dst, 0, len).map_err(|e| e.to_string())?;
            let t = Instant::now();
            e.read(&file, 0, dst, 0, len).map_err(|e| e.to_string())?;
            engine_sweep.push(((chunk, depth), gib_s(a.size, t.elapsed())));
        }
    }
    engine_sweep.sort_by(|x, y| y.1.total_cmp(&x.1));
    let (best_bs, best_depth) = engine_sweep[0].0;
    // AUTO as `copy` runs it: the configuration, the environment and the
    // geometry learned for the device (calibrated on first use).
    let auto_cfg = Config::from_env().map_err(|e| e.to_string())?;
    let auto = Engine::new(auto_cfg, module.clone());
    auto.prepare(&file, 0, len).map_err(|e| e.to_string())?;
    let auto_geometry = auto.geometry(&file, len);
    let auto_path = auto.choose(&file, dst).map_err(|e| e.to_string())?;

    let same = FioSettings {
        bs: a.bs,
        depth: a.depth,
        fixedbufs: false,
        huge: true,
    };
    let contenders: Vec<(String, &str, Contender)> = vec![
        (
            "fio at the limit's settings".into(),
            "fio_limit",
            Contender::Fio(limit),
        ),
        (
            format!("fio at bs {} KiB, depth {}", a.bs >> 10, a.depth),
            "fio_same_settings",
            Contender::Fio(same),
        ),
        (
            format!("pipeline, bs {} KiB, depth {}", a.bs >> 10, a.depth),
            "pipeline",
            Contender::Engine(Box::new(engine(PathPref::Bounce, a.bs, a.depth, None))),
        ),
        (
            format!(
                "pipeline at the limit's {} KiB x {}",
                limit.bs >> 10,
                limit.depth
            ),
            "pipeline_at_limit",
            Contender::Engine(Box::new(engine(
                PathPref::Bounce,
                limit.bs,
                limit.depth,
                None,
            ))),
        ),
        (
            format!(
                "pipeline at its best {} KiB x {}",
                best_bs >> 10,
                best_depth
            ),
            "pipeline_best",
            Contender::Engine(Box::new(engine(
                PathPref::Bounce,
                best_bs,
                best_depth,
                None,
            ))),
        ),
        (
            format!(
                "engine AUTO, {} KiB x {} ({})",
                auto_geometry.geometry.chunk >> 10,
                auto_geometry.geometry.depth,
                auto_path.path
            ),
            "engine_auto",
            Contender::Engine(Box::new(auto)),
        ),
        (
            "serial (read all, then one copy)".into(),
            "serial",
            Contender::Serial,
        ),
    ];
    let run = |c: &Contender, serial_buf: &mut [u8]| -> Res<(f64, usize)> {
        let t = Instant::now();
        let threads = match c {
            Contender::Fio(st) => return Ok((fio(&path, a.size, *st)?, 0)),
            Contender::Engine(e) => {
                e.read(&file, 0, dst, 0, len)
                    .map_err(|e| e.to_string())?
                    .copy_threads
            }
            Contender::Serial => {
                serial(&direct, serial_buf, dst)?;
                1
            }
        };
        Ok((gib_s(a.size, t.elapsed()), threads))
    };
    // A first, untimed run of every contender that moves data into the
    // memory: it sets up rings and slots, faults the memory in, and its
    // result is checked against the file.
    for (name, _, c) in &contenders {
        if !matches!(c, Contender::Fio(_)) {
            poison(dst)?;
            run(c, serial_buf)?;
            verify(dst, &want, name)?;
        }
    }
    // Interleaved repetitions, each starting with the next contender, so
    // that no contender always runs right after the same other.
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    let mut threads = vec![0usize; contenders.len()];
    for rep in 0..a.reps.max(1) {
        for k in 0..contenders.len() {
            let i = (rep + k) % contenders.len();
            let (x, t) = run(&contenders[i].2, serial_buf)?;
            results[i].push(x);
            threads[i] = threads[i].max(t);
        }
    }
    // The engine's data once more, after the timed runs.
    for (name, _, c) in &contenders {
        if matches!(c, Contender::Engine(_)) {
            poison(dst)?;
            run(c, serial_buf)?;
            verify(dst, &want, name)?;
        }
    }
    println!(
        "storage: sequential read of {} MiB into {}, {} reps interleaved, file {}",
        a.size >> 20,
        dst.kind(),
        a.reps,
        path.display()
    );
    println!(
        "  the storage limit: fio (io_uring, O_DIRECT, same file) at its best of {} settings: {limit}",
        sweep.len()
    );
    let mut ranked = sweep.clone();
    ranked.sort_by(|x, y| y.1.total_cmp(&x.1));
    for (st, x) in ranked.iter().take(3) {
        println!("    fio sweep:      {x:8.3} GiB/s  {st}");
    }
    for ((bs, depth), x) in engine_sweep.iter().take(3) {
        println!(
            "    pipeline sweep: {x:8.3} GiB/s  chunk {} KiB, depth {depth}",
            bs >> 10
        );
    }
    println!(
        "  engine AUTO: {} KiB x {}, {}; path {}: {}",
        auto_geometry.geometry.chunk >> 10,
        auto_geometry.geometry.depth,
        auto_geometry.reason,
        auto_path.path,
        auto_path.reason
    );
    println!("  every engine run's data and the serial run's were checked against the file");
    println!(
        "  GiB/s                                          median     best    worst  copy threads"
    );
    for ((name, _, _), (v, t)) in contenders.iter().zip(results.iter().zip(&threads)) {
        let (lo, hi) = spread(v);
        let t = match t {
            0 => String::new(),
            t => t.to_string(),
        };
        println!(
            "  {name:45} {:8.3} {hi:8.3} {lo:8.3}  {t}",
            median(v.to_vec())
        );
    }
    let f = &results[0];
    let (fm, fb, fw) = (median(f.clone()), spread(f).1, spread(f).0);
    println!("  ratio to the limit                             median     best    worst");
    let mut r = json!({
        "bytes": a.size,
        "memory": dst.kind().to_string(),
        "limit": {
            "bs": limit.bs, "depth": limit.depth, "fixedbufs": limit.fixedbufs,
            "huge_pages": limit.huge, "gib_s": fm, "best_gib_s": fb, "worst_gib_s": fw,
        },
        "sweep": ranked.iter().map(|(st, x)| json!({
            "bs": st.bs, "depth": st.depth, "fixedbufs": st.fixedbufs,
            "huge_pages": st.huge, "gib_s": x,
        })).collect::<Vec<_>>(),
        "pipeline_sweep": engine_sweep.iter().map(|((bs, depth), x)| json!({
            "chunk": bs, "depth": depth, "gib_s": x,
        })).collect::<Vec<_>>(),
        "engine_auto_geometry": {
            "chunk": auto_geometry.geometry.chunk,
            "depth": auto_geometry.geometry.depth,
            "reason": auto_geometry.reason,
            "path": auto_path.path.to_string(),
        },
    });
    for (((name, key, _), v), t) in contenders.iter().zip(&results).zip(&threads).skip(1) {
        let (lo, hi) = spread(v);
        let (m, b, w) = (median(v.to_vec()) / fm, hi / fb, lo / fw);
        println!("  {name:45} {m:8.3} {b:8.3} {w:8.3}");
        r[*key] = json!({
            "label": name, "gib_s": median(v.to_vec()), "best_gib_s": hi, "worst_gib_s": lo,
            "vs_limit": m, "vs_limit_best": b, "vs_limit_worst": w, "runs": v,
        });
        if *t > 0 {
            r[*key]["copy_threads"] = json!(t);
        }
    }
    json_out["storage"] = r;
    Ok(())
}

/// The lowest and highest of `v` (not empty).
fn spread(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

fn copy(json_out: &mut Value) -> Res<()> {
    // A shared mapping of a memfd: write-back memory, copied into with the
    // library's routine for it (memcpy), and, for reference, with the
    // write-combining routine device memory gets; accelerator memory from
    // the module when there is one (its WC BAR mapping); vs one pwrite(2)
    // per copy into the memfd.
    use p2pdma::sys::{Caching, RawMapping, Sharing};
    let fd = rustix::fs::memfd_create("p2pdma-bench", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| e.to_string())?;
    let size = 1usize << 20;
    rustix::fs::ftruncate(&fd, size as u64).map_err(|e| e.to_string())?;
    let wb = RawMapping::map_with(&fd, size, 0, Sharing::Shared, Caching::WriteBack)
        .map_err(|e| e.to_string())?;
    let wc_on_wb = RawMapping::map_with(&fd, size, 0, Sharing::Shared, Caching::WriteCombined)
        .map_err(|e| e.to_string())?;
    let bar = Module::open().ok().and_then(|m| {
        let m = Arc::new(m);
        let index = m.accelerators().ok()?.first()?.index;
        ModuleMemory::alloc(m, index, size as u64, 0).ok()
    });
    let file = File::from(fd);
    println!("copy: latency per copy into a mapping vs one pwrite(2) per copy (median of 5 runs)");
    println!("  mapped: the library's routine for the memory (write-back: memcpy; write-combined: streaming stores)");
    let mut rows = Vec::new();
    for n in [64usize, 4096, 65536] {
        let src = vec![0x5Au8; n];
        let iters = (50_000_000 / n).clamp(1000, 200_000);
        let at = |i: usize| (i * n) % (size - n + 1) / 64 * 64;
        let time = |f: &dyn Fn(usize) -> Res<()>| -> Res<f64> {
            let t = Instant::now();
            for i in 0..iters {
                f(at(i))?;
            }
            Ok(t.elapsed().as_nanos() as f64 / iters as f64)
        };
        let (mut mapped, mut wc, mut sys, mut dev) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..5 {
            mapped.push(time(&|o| wb.write_at(o, &src).map_err(|e| e.to_string()))?);
            wc.push(time(&|o| {
                wc_on_wb.write_at(o, &src).map_err(|e| e.to_string())
            })?);
            sys.push(time(&|o| {
                file.write_at(&src, o as u64)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })?);
            if let Some(b) = &bar {
                dev.push(time(&|o| b.write_at(o, &src).map_err(|e| e.to_string()))?);
            }
        }
        let (mapped, wc, sys) = (median(mapped), median(wc), median(sys));
        print!(
            "  {n:6} B  mapped {mapped:9.1} ns  pwrite {sys:9.1} ns  pwrite/mapped {:6.2}  (WC routine on write-back memory {wc:9.1} ns)",
            sys / mapped
        );
        let mut row = json!({"bytes": n, "mapped_ns": mapped, "pwrite_ns": sys, "pwrite_vs_mapped": sys / mapped, "wc_routine_on_wb_ns": wc});
        if !dev.is_empty() {
            let dev = median(dev);
            print!(
                "  accelerator BAR (WC) {dev:9.1} ns  pwrite/BAR {:6.2}",
                sys / dev
            );
            row["accel_bar_ns"] = json!(dev);
            row["pwrite_vs_accel_bar"] = json!(sys / dev);
        }
        println!();
        rows.push(row);
    }
    json_out["copy"] = json!(rows);
    Ok(())
}

/// A 4 KiB block aligned for `O_DIRECT`.
#[repr(C, align(4096))]
struct Block([u8; 4096]);

/// Small random reads: 4 KiB at random aligned offsets of one file, through
/// `Engine::read` into device memory, vs what an application would do
/// without the library: `pread` with `O_DIRECT` into an aligned host buffer,
/// then a copy of it into the same device memory. The same offsets, both
/// direct, interleaved repetitions, medians.
fn small(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let path = a
        .file
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("p2pdma-bench.dat"));
    let size = a.size.max(16 << 20);
    if !path.exists() || !std::fs::metadata(&path).is_ok_and(|m| m.file_type().is_block_device()) {
        ensure_file(&path, size)?;
    }
    let file = StorageFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let size = file.size().min(size) / 4096 * 4096;
    let module = Module::open().ok().map(Arc::new);
    let accel = module.as_ref().and_then(|m| {
        let index = m.accelerators().ok()?.first()?.index;
        ModuleMemory::alloc(m.clone(), index, 1 << 20, 0).ok()
    });
    // With accelerator memory, a third way: pread with O_DIRECT straight
    // into its mapping, which is what the engine's P2P path does, without
    // the engine: the engine's own cost, apart from P2P's.
    let host = match accel {
        Some(_) => None,
        None => Some(HostMemory::new(1 << 20).map_err(|e| e.to_string())?),
    };
    let mem: &dyn DeviceMemory = match (&accel, &host) {
        (Some(m), _) => m,
        (None, Some(h)) => h,
        (None, None) => return Err("no memory".into()),
    };
    let e = Engine::new(Config::default(), module);
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let ops = 4000usize;
    // The same pseudo-random block offsets for both.
    let offsets: Vec<u64> = (0..ops as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % (size / 4096) * 4096)
        .collect();
    let mut block = Box::new(Block([0; 4096]));
    let choice = e.choose(&file, mem).map_err(|e| e.to_string())?;
    println!(
        "small: {ops} random 4 KiB reads of {} ({} MiB) into {}, x {} reps, medians per read",
        path.display(),
        size >> 20,
        mem.kind(),
        a.reps
    );
    println!(
        "  engine: Engine::read on the path AUTO picks: {} ({})",
        choice.path, choice.reason
    );
    println!("  pread:  pread(O_DIRECT) into a host buffer, then a copy into the same memory");
    // Each offset is read both ways, one right after the other, the order
    // alternating: disk and machine noise hit both alike. Per-read medians.
    let (mut eng, mut sys) = (Vec::new(), Vec::new());
    let by_engine = |i: usize, off: u64| -> Res<f64> {
        let t = Instant::now();
        e.read(&file, off, mem, (i % 256) * 4096, 4096)
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_nanos() as f64)
    };
    let mut by_pread = |i: usize, off: u64| -> Res<f64> {
        let t = Instant::now();
        let n = direct
            .read_at(&mut block.0, off)
            .map_err(|e| format!("pread: {e}"))?;
        if n != 4096 {
            return Err(format!("short pread at {off}: {n}"));
        }
        mem.write_at((i % 256) * 4096, &block.0)
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_nanos() as f64)
    };
    let mut raw = Vec::new();
    let by_mapping = |i: usize, off: u64| -> Res<f64> {
        let map = accel.as_ref().ok_or("no accelerator memory")?.mapping();
        let t = Instant::now();
        let n = map
            .read_from_file(&direct, off, (i % 256) * 4096, 4096)
            .map_err(|e| e.to_string())?;
        if n != 4096 {
            return Err(format!("short pread at {off}: {n}"));
        }
        Ok(t.elapsed().as_nanos() as f64)
    };
    // And the module's own block I/O (`BLOCK_IO`), one segment, without
    // the engine, where the storage is a block device.
    let module_io = accel
        .as_ref()
        .filter(|m| m.module().has_block_io() && !file.is_file());
    let mut blk = Vec::new();
    let by_block_io = |i: usize, off: u64| -> Res<f64> {
        let m = module_io.ok_or("no module block I/O")?;
        let seg = p2pdma_abi::P2pdmaIoSeg {
            mem_offset: ((i % 256) * 4096) as u64,
            dev_offset: off,
            len: 4096,
        };
        let t = Instant::now();
        m.module()
            .block_io(m.handle(), &direct, false, &[seg], 1)
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_nanos() as f64)
    };
    for rep in 0..a.reps.max(1) {
        for (i, &off) in offsets.iter().enumerate() {
            if (i + rep) % 2 == 0 {
                eng.push(by_engine(i, off)?);
                sys.push(by_pread(i, off)?);
            } else {
                sys.push(by_pread(i, off)?);
                eng.push(by_engine(i, off)?);
            }
            if accel.is_some() {
                raw.push(by_mapping(i, off)?);
            }
            if module_io.is_some() {
                blk.push(by_block_io(i, off)?);
            }
        }
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p) as usize]
    };
    let (e10, e90) = (pct(&mut eng, 0.1), pct(&mut eng, 0.9));
    let (s10, s90) = (pct(&mut sys, 0.1), pct(&mut sys, 0.9));
    let (eng, sys) = (median(eng), median(sys));
    println!(
        "  engine {:8.2} us/read (p10 {:.2}, p90 {:.2})   pread+copy {:8.2} us/read (p10 {:.2}, p90 {:.2})   engine/pread {:5.3}",
        eng / 1e3,
        e10 / 1e3,
        e90 / 1e3,
        sys / 1e3,
        s10 / 1e3,
        s90 / 1e3,
        eng / sys
    );
    json_out["small"] = json!({
        "reads": ops, "bytes": 4096, "path": choice.path.to_string(),
        "engine_ns": eng, "pread_copy_ns": sys, "engine_vs_pread": eng / sys,
    });
    if !raw.is_empty() {
        let raw = median(raw);
        println!(
            "  pread(O_DIRECT) straight into the mapping {:8.2} us/read   engine/that {:5.3}",
            raw / 1e3,
            eng / raw
        );
        json_out["small"]["pread_into_mapping_ns"] = json!(raw);
        json_out["small"]["engine_vs_pread_into_mapping"] = json!(eng / raw);
        if !blk.is_empty() {
            let blk = median(blk);
            println!(
                "  BLOCK_IO of one segment, no engine         {:8.2} us/read   that/pread into the mapping {:5.3}",
                blk / 1e3,
                blk / raw
            );
            json_out["small"]["block_io_ns"] = json!(blk);
        }
    }
    Ok(())
}

/// User + system CPU time of this process so far (its io_uring workers
/// included: they are its threads).
pub(crate) fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Idle time of the whole machine so far, all CPUs: the idle and iowait
/// columns of `/proc/stat`, which the kernel keeps from its precise idle
/// clocks (the busy columns are sampled at timer ticks, which under an
/// emulator land unevenly). Busy time is then elapsed time times the CPUs
/// less this; it counts interrupts and kernel threads too, where completion
/// work runs, outside any process.
pub(crate) fn idle_time() -> Res<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or("/proc/stat has no cpu line")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait ...
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Ok(Duration::from_nanos(idle * 1_000_000_000 / hz))
}

/// One way of moving the data, for `cpu`.
struct CpuCase {
    name: &'static str,
    pref: PathPref,
    submit: P2pSubmit,
}

fn cpu(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let accel = module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("no accelerator bound to the module")?;
    let file = StorageFile::open(&a.nvme).map_err(|e| e.to_string())?;
    let len =
        (a.size.min(file.size()) as usize).min(accel.p2p_available as usize / 2) / 4096 * 4096;
    let mem = ModuleMemory::alloc(module.clone(), accel.index, len as u64, 0)
        .map_err(|e| e.to_string())?;
    let reps = a.reps.max(1);
    println!(
        "cpu: CPU time per GiB read from {} into accelerator {} memory, {} MiB x {reps} transfers per path in 3 interleaved rounds, bs {} KiB, depth {}",
        a.nvme.display(),
        accel.pci,
        len >> 20,
        a.bs >> 10,
        a.depth
    );
    let cases = [
        CpuCase {
            name: "p2p, module block I/O",
            pref: PathPref::P2p,
            submit: P2pSubmit::Auto,
        },
        CpuCase {
            name: "p2p, O_DIRECT (pins per I/O)",
            pref: PathPref::P2p,
            submit: P2pSubmit::Odirect,
        },
        CpuCase {
            name: "nvme-cmd",
            pref: PathPref::NvmeCmd,
            submit: P2pSubmit::Auto,
        },
        CpuCase {
            name: "bounce",
            pref: PathPref::Bounce,
            submit: P2pSubmit::Auto,
        },
    ];
    let engines: Vec<Engine> = cases
        .iter()
        .map(|c| {
            Engine::new(
                Config {
                    path: c.pref,
                    chunk: Some(a.bs as usize),
                    depth: Some(a.depth),
                    p2p_submit: c.submit,
                    ..Config::default()
                },
                Some(module.clone()),
            )
        })
        .collect();
    // What every path must land: the memory is poisoned before each
    // path's first transfer and compared after it.
    let mut want = vec![0u8; len];
    File::open(&a.nvme)
        .and_then(|f| f.read_exact_at(&mut want, 0))
        .map_err(|e| format!("{}: {e}", a.nvme.display()))?;
    let gib = len as f64 / (1u64 << 30) as f64;
    // Each case runs a block of transfers in turn, several rounds: a block
    // is long enough for the idle clock's 10 ms units. Per case and round:
    // process CPU s/GiB, machine CPU s/GiB, GiB/s.
    const ROUNDS: usize = 3;
    let per_round = reps.div_ceil(ROUNDS);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut runs: Vec<[Vec<f64>; 3]> = cases.iter().map(|_| Default::default()).collect();
    let mut ran_as = vec![String::new(); cases.len()];
    for round in 0..ROUNDS {
        for (i, e) in engines.iter().enumerate() {
            if round == 0 {
                // The data each path lands must be the namespace's.
                let poison = vec![0xA5u8; 1 << 20];
                for off in (0..len).step_by(poison.len()) {
                    let n = poison.len().min(len - off);
                    mem.write_at(off, &poison[..n]).map_err(|e| e.to_string())?;
                }
                let report = e.read(&file, 0, &mem, 0, len).map_err(|e| e.to_string())?;
                let mut got = vec![0u8; len];
                mem.read_at(0, &mut got).map_err(|e| e.to_string())?;
                if let Some(at) = got.iter().zip(&want).position(|(g, w)| g != w) {
                    return Err(format!(
                        "{}: the memory differs from the namespace at byte {at}",
                        cases[i].name
                    ));
                }
                let st = e.stats().of(report.path).snapshot();
                ran_as[i] = format!(
                    "{}{}",
                    report.path,
                    if st.module_ios > 0 {
                        ", module I/O"
                    } else {
                        ""
                    }
                );
            }
            let (c0, i0, t0) = (cpu_time(), idle_time()?, Instant::now());
            for _ in 0..per_round {
                e.read(&file, 0, &mem, 0, len).map_err(|e| e.to_string())?;
            }
            let wall = t0.elapsed();
            let (idle, cpu) = (idle_time()?.saturating_sub(i0), cpu_time() - c0);
            let busy = (wall.as_secs_f64() * cpus - idle.as_secs_f64()).max(0.0);
            let moved = gib * per_round as f64;
            runs[i][0].push(cpu.as_secs_f64() / moved);
            runs[i][1].push(busy / moved);
            runs[i][2].push(moved / wall.as_secs_f64());
        }
    }
    println!(
        "  {ROUNDS} rounds of {per_round}          process CPU s/GiB  machine CPU s/GiB     GiB/s   ran as"
    );
    let mut rows = serde_json::Map::new();
    let med: Vec<[f64; 3]> = runs
        .iter()
        .map(|r| {
            [
                median(r[0].clone()),
                median(r[1].clone()),
                median(r[2].clone()),
            ]
        })
        .collect();
    for (i, c) in cases.iter().enumerate() {
        let [p, m, g] = med[i];
        println!("  {:30} {p:15.3} {m:18.3} {g:9.3}   {}", c.name, ran_as[i]);
        rows.insert(
            c.name.to_string(),
            json!({
                "process_cpu_s_per_gib": p, "machine_cpu_s_per_gib": m, "gib_s": g,
                "ran_as": ran_as[i], "rounds": runs[i],
            }),
        );
    }
    let bounce = med[cases.len() - 1];
    println!("  ratio to bounce (machine CPU, process CPU); the goal is <= 0.5");
    for (i, c) in cases.iter().enumerate().take(cases.len() - 1) {
        let r = |k: usize| {
            if bounce[k] > 0.0 {
                med[i][k] / bounce[k]
            } else {
                f64::NAN
            }
        };
        println!("  {:30} {:7.2} {:7.2}", c.name, r(1), r(0));
    }
    json_out["cpu"] = Value::Object(rows);
    Ok(())
}

/// One contender of a `strided` cell: a mode and the layout it reads into.
struct StridedContender {
    name: &'static str,
    mode: StridedMode,
    layout: Layout,
}

const STRIDED_CONTENDERS: [StridedContender; 5] = [
    StridedContender {
        name: "SC",
        mode: StridedMode::Sc,
        layout: Layout::Packed,
    },
    StridedContender {
        name: "TaT",
        mode: StridedMode::Tat,
        layout: Layout::Packed,
    },
    StridedContender {
        name: "RC",
        mode: StridedMode::Rc,
        layout: Layout::Strided,
    },
    StridedContender {
        name: "AUTO packed",
        mode: StridedMode::Auto,
        layout: Layout::Packed,
    },
    StridedContender {
        name: "AUTO strided",
        mode: StridedMode::Auto,
        layout: Layout::Strided,
    },
];

/// The shape of a `strided` cell: runs of `run` bytes, `run / rho` apart
/// (touching at rho 1), as many as fit in `volume` bytes from `base`;
/// `None` when fewer than two fit.
fn cell_shape(base: u64, volume: u64, run: u64, rho: f64) -> Option<Shape> {
    let stride = ((run as f64 / rho).round() as u64).max(run);
    let n = (volume.checked_sub(run)? / stride) + 1;
    if n < 2 {
        return None;
    }
    Shape::new(base, run, &[(stride, n)]).ok()
}

/// Checks the memory after a strided read of `shape` into `layout` from
/// offset 0 against the file's bytes `data`: every run where the layout
/// puts it, and for RC the gaps too.
fn check_strided(
    mem: &dyn DeviceMemory,
    shape: &Shape,
    layout: Layout,
    rc: bool,
    data: &[u8],
    got: &mut Vec<u8>,
) -> Res<()> {
    let (b0, b1) = shape.bounds();
    let len = match layout {
        Layout::Packed => shape.bytes(),
        Layout::Strided => b1 - b0,
    } as usize;
    got.resize(len, 0);
    mem.read_at(0, got).map_err(|e| e.to_string())?;
    if rc {
        return match got[..] == data[b0 as usize..b1 as usize] {
            true => Ok(()),
            false => Err("RC's range differs from the file".into()),
        };
    }
    let run = shape.run_len() as usize;
    for r in shape.iter() {
        let at = match layout {
            Layout::Packed => r.packed_offset,
            Layout::Strided => r.file_offset - b0,
        } as usize;
        let f = r.file_offset as usize;
        if got[at..at + run] != data[f..f + run] {
            return Err(format!("wrong data for the run at file offset {f}"));
        }
    }
    Ok(())
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n => format!("{n} B"),
    }
}

/// A time for the table: ms with three significant digits.
fn ms(t: f64) -> String {
    let m = t * 1e3;
    match m {
        m if m >= 100.0 => format!("{m:.0}"),
        m if m >= 10.0 => format!("{m:.1}"),
        m => format!("{m:.2}"),
    }
}

/// `strided`: the grid of volumes, rho and run lengths, each cell read by
/// SC and TaT (packed), RC (strided layout) and AUTO in both layouts,
/// `reps` rounds interleaved (`reps_large` for volumes of 256 MiB and
/// more), medians, every result checked against the file.
fn strided(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let path = a
        .file
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/tmp/p2pdma-strided.dat"));
    let volumes = a
        .volumes
        .iter()
        .map(|v| crate::util::parse_size(v))
        .collect::<Res<Vec<u64>>>()?;
    let runs = a
        .runs
        .iter()
        .map(|v| crate::util::parse_size(v))
        .collect::<Res<Vec<u64>>>()?;
    let rhos: Vec<f64> = a
        .rhos
        .iter()
        .map(|r| match r.parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(p / 100.0),
            _ => Err(format!("--rhos: {r:?} is not a percentage in (0, 100]")),
        })
        .collect::<Res<_>>()?;
    let base = 1u64 << 20;
    let top = volumes.iter().copied().max().ok_or("--volumes is empty")?;
    let size = base + top + (1 << 20);
    ensure_file(&path, size)?;
    let file = StorageFile::open(&path)
        .map_err(|e| format!("{e} (the file must be on a filesystem with O_DIRECT)"))?;
    let mut data = vec![0u8; size as usize];
    File::open(&path)
        .and_then(|f| f.read_exact_at(&mut data, 0))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mem = HostMemory::new(top as usize).map_err(|e| e.to_string())?;
    mem.write_at(0, &vec![0u8; top as usize])
        .map_err(|e| e.to_string())?;
    let engine = Engine::new(Config::from_env().map_err(|e| e.to_string())?, None);
    // Outside the timings: the device's geometry (calibrated on the first
    // large read), the strided constants, the rings and slots.
    engine
        .prepare(&file, base, top as usize)
        .map_err(|e| e.to_string())?;
    if a.calibrate {
        engine
            .calibrate_strided(Some(&file), &mem)
            .map_err(|e| e.to_string())?;
    }
    let handle_path = engine
        .handle(&file, &mem)
        .map_err(|e| e.to_string())?
        .path();
    let constants = engine.strided_constants(Some(&file), &mem, handle_path);
    println!(
        "strided: {} on the {handle_path} path into the host-memory device; {}",
        path.display(),
        constants.describe()
    );
    println!(
        "| Volume | Run | rho | Runs | SC (I) | TaT (I) | RC (V) | AUTO packed (I) | AUTO strided (V) | AUTO packed / best SC, TaT (its mode's) | AUTO strided / best (its mode's) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    let mut got = Vec::new();
    let abbrev = |m: StridedMode| match m {
        StridedMode::Sc => "SC",
        StridedMode::Tat => "TaT",
        StridedMode::Rc => "RC",
        StridedMode::Auto => "AUTO",
    };
    for &volume in &volumes {
        // Small volumes take milliseconds: more rounds, up to 50, so that
        // their medians are as steady as the larger ones'.
        let reps = if volume >= 256 << 20 {
            a.reps_large.max(1)
        } else {
            let scale = ((64u64 << 20) / volume.max(1)).max(1) as usize;
            (a.reps.max(1) * scale).min(50).max(a.reps.max(1))
        };
        for &run in &runs {
            for &rho in &rhos {
                let Some(shape) = cell_shape(base, volume, run, rho) else {
                    println!(
                        "| {} | {} | {:.0} % | - | fewer than two runs fit | | | | | | |",
                        human(volume),
                        human(run),
                        rho * 100.0
                    );
                    continue;
                };
                let mut times = vec![Vec::new(); STRIDED_CONTENDERS.len()];
                let mut chose = [None, None];
                // Each round starts with the next contender, so that none
                // always follows the same one.
                for rep in 0..reps {
                    let k = STRIDED_CONTENDERS.len();
                    for i in (0..k).map(|j| (j + rep) % k) {
                        let c = &STRIDED_CONTENDERS[i];
                        let t = Instant::now();
                        let r = engine
                            .read_strided(&file, &shape, &mem, 0, c.layout, c.mode)
                            .map_err(|e| {
                                format!(
                                    "{} {} rho {rho}, {}: {e}",
                                    human(volume),
                                    human(run),
                                    c.name
                                )
                            })?;
                        times[i].push(t.elapsed().as_secs_f64());
                        check_strided(
                            &mem,
                            &shape,
                            c.layout,
                            r.mode == StridedMode::Rc,
                            &data,
                            &mut got,
                        )
                        .map_err(|e| {
                            format!(
                                "{} {} rho {rho}, {}: {e}",
                                human(volume),
                                human(run),
                                c.name
                            )
                        })?;
                        if c.mode == StridedMode::Auto {
                            chose[i - 3] = Some(r);
                        }
                    }
                }
                let med: Vec<f64> = times.into_iter().map(median).collect();
                let best = med[..3].iter().copied().fold(f64::INFINITY, f64::min);
                let best_packed = med[0].min(med[1]);
                let [Some(ap), Some(as_)] = chose else {
                    return Err("no AUTO run".into());
                };
                // The median of the column of the mode AUTO chose: how good
                // the choice is, apart from how its own runs went.
                let column = |m: StridedMode| match m {
                    StridedMode::Sc => med[0],
                    StridedMode::Tat => med[1],
                    StridedMode::Rc | StridedMode::Auto => med[2],
                };
                println!(
                    "| {} | {} | {:.0} % | {} | {} | {} | {} | {} ({}) | {} ({}) | {:.2} ({:.2}) | {:.2} ({:.2}) |",
                    human(shape.bounding_len()),
                    human(run),
                    shape.rho() * 100.0,
                    shape.runs(),
                    ms(med[0]),
                    ms(med[1]),
                    ms(med[2]),
                    ms(med[3]),
                    abbrev(ap.mode),
                    ms(med[4]),
                    abbrev(as_.mode),
                    med[3] / best_packed,
                    column(ap.mode) / best_packed,
                    med[4] / best,
                    column(as_.mode) / best,
                );
                rows.push(json!({
                    "volume": shape.bounding_len(),
                    "run": run,
                    "rho": shape.rho(),
                    "runs": shape.runs(),
                    "interest": shape.bytes(),
                    "reps": reps,
                    "sc_s": med[0],
                    "tat_s": med[1],
                    "rc_s": med[2],
                    "auto_packed_s": med[3],
                    "auto_packed_mode": ap.mode.to_string(),
                    "auto_packed_reason": ap.reason,
                    "auto_strided_s": med[4],
                    "auto_strided_mode": as_.mode.to_string(),
                    "auto_strided_reason": as_.reason,
                    "space": {"sc": shape.bytes(), "tat": shape.bytes(), "rc": shape.bounding_len(),
                              "auto_packed": shape.bytes(), "auto_strided": shape.bounding_len()},
                }));
            }
        }
    }
    json_out["strided"] = json!({ "constants": constants.describe(), "cells": rows });
    Ok(())
}

/// Runs the benchmarks; prints text, or JSON with `json`.
pub fn run(a: &BenchArgs, json: bool) -> Res<()> {
    let mut out = json!({ "machine": machine() });
    println!("machine: {}", out["machine"]);
    match a.what.as_str() {
        "storage" => storage(a, &mut out)?,
        "copy" => copy(&mut out)?,
        "cpu" => cpu(a, &mut out)?,
        "small" => small(a, &mut out)?,
        "strided" => strided(a, &mut out)?,
        "route" => crate::route::bench(a, &mut out)?,
        "queues" => crate::iops::bench(a, &mut out)?,
        "all" => {
            storage(a, &mut out)?;
            copy(&mut out)?;
            small(a, &mut out)?;
        }
        other => {
            return Err(format!(
            "unknown benchmark '{other}' (storage, copy, small, strided, route, cpu, queues, all)"
        ))
        }
    }
    if json {
        println!("{out}");
    }
    Ok(())
}
