//! What the benches share: their arguments, the result type, medians and
//! rates, the file they read, and the CPU clocks.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use p2pdma::{Accelerator, Module};

pub(super) type Res<T> = Result<T, String>;

/// Which benchmark, and its knobs.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// storage, copy, small, strided, route, cpu, queues, store, kv,
    /// arrays, volume or all (storage, copy and small).
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
    /// `kv`: the consumers' buffers and the cache in CUDA device 0's
    /// memory (the driver the loader finds, or `P2PDMA_CUDA_DRIVER`).
    #[arg(long)]
    pub cuda: bool,
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
    /// `queues`: submitter threads; `kv`: consumers.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// `queues`: the depths (reads in flight per thread), at most 255.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,128")]
    pub depths: Vec<usize>,
    /// `queues`, `kv`: seconds per cell.
    #[arg(long, default_value_t = 2.0)]
    pub secs: f64,
    /// `queues`: most reads per thread in a cell.
    #[arg(long, default_value_t = 200_000)]
    pub max_ios: usize,
    /// `arrays`: the devices, LABEL=PATH each (a lone member, then md
    /// arrays over more).
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
    /// `volume`: the member namespaces' block devices (the nvme driver's;
    /// their controllers are taken and given back), in stripe order.
    #[arg(long, value_delimiter = ',')]
    pub members: Vec<PathBuf>,
}

/// The median of `v`; NaN when it is empty.
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(super) fn gib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / (1u64 << 30) as f64
}

/// Drops `path`'s pages from the page cache (written back first), so that
/// reads of it are cold.
pub(super) fn drop_cached(path: &Path) -> Res<()> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    rustix::fs::fdatasync(&f).map_err(|e| format!("fdatasync {}: {e}", path.display()))?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)
        .map_err(|e| format!("fadvise {}: {e}", path.display()))
}

/// Size of the block device at `path`.
pub(super) fn device_size(path: &Path) -> Res<u64> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    rustix::fs::seek(&f, rustix::fs::SeekFrom::End(0))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Makes `path` a file of at least `size` bytes of the rig pattern, unless
/// it is one already; a block device is read as it is (never written), and
/// must hold `size` bytes.
pub(super) fn ensure_file(path: &Path, size: u64) -> Res<()> {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device()) {
        let len = device_size(path)?;
        return match len >= size {
            true => Ok(()),
            false => Err(format!(
                "{} holds {len} bytes, fewer than the {size} to read",
                path.display()
            )),
        };
    }
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

/// The first accelerator bound to the module.
pub(super) fn first_accelerator(module: &Module) -> Res<Accelerator> {
    Ok(module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or("no accelerator bound to the module")?)
}

/// User + system CPU time of this process so far (its io_uring workers
/// included: they are its threads).
pub(super) fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Idle time of the whole machine so far, all CPUs: the idle and iowait
/// columns of `/proc/stat`, which the kernel keeps from its precise idle
/// clocks (the busy columns are sampled at timer ticks, which under an
/// emulator land unevenly). Busy time is then elapsed time times the CPUs
/// less this; it counts interrupts and kernel threads too, where completion
/// work runs, outside any process.
pub(super) fn idle_time() -> Res<Duration> {
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
