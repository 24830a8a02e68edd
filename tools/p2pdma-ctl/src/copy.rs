//! `p2pdma-ctl copy`: storage to accelerator memory, or one file to another
//! through accelerator memory, with a progress bar, the throughput and the
//! path each transfer took.
//!
//! A file-to-file copy never leaves a partial destination: it writes a new
//! file under a temporary name in DST's directory, created with `O_EXCL`
//! (`.NAME.p2pdma-PID-N.tmp`), syncs it, and renames it over DST only when
//! every byte is written; on any failure, mid-copy included, the temporary
//! is removed and DST is as it was (or still absent). The new DST holds
//! exactly the bytes copied, with the permission bits of the DST it replaces
//! (set-id and sticky bits dropped, the caller as owner), or `0666` less the
//! umask when there was none. A symbolic link DST has its target replaced. A
//! DST that is a block or character device is written in place, since a
//! rename would replace the device node itself. A process killed mid-copy
//! leaves its temporary behind, under that recognisable name.
//!
//! With `--shape`, only the runs of a strided shape of the source are
//! copied, in one strided read (`--layout`, `--mode`): into memory, or
//! through it into a file that receives the memory's layout (the runs back
//! to back, or the bounding range with the runs in place and zeros between
//! them, the source's bytes there for RC).

use std::{
    fs::{File, OpenOptions, Permissions},
    io::ErrorKind,
    os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressStyle};
use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{
        Config, End, Engine, Layout, RouteOptions, Shape, StorageFile, StridedMode, StridedReport,
        Via,
    },
    MemRange, Module,
};
use serde_json::json;

type Res<T> = Result<T, String>;

/// `copy` arguments.
#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Source file or block device (e.g. /dev/nvme0n1).
    pub from: PathBuf,
    /// Destination: `accel[:N]` (accelerator N's memory), `host` (the
    /// host-memory device), or a file to copy into through the memory given
    /// with `--through`. A file is written under a temporary name beside it
    /// and renamed over it only once the copy is complete and synced; a
    /// failed copy leaves it as it was.
    pub to: String,
    /// Memory to stage a file-to-file copy through: `accel[:N]` or `host`.
    #[arg(long, default_value = "accel")]
    pub through: String,
    /// Source offset in bytes.
    #[arg(long, default_value = "0", value_parser = crate::util::parse_size)]
    pub offset: u64,
    /// Bytes to copy (default: to the end of the source).
    #[arg(long, value_parser = crate::util::parse_size)]
    pub len: Option<u64>,
    /// Bytes moved per transfer (and memory used).
    #[arg(long, default_value = "64M", value_parser = crate::util::parse_size)]
    pub piece: u64,
    /// Path: auto, p2p, nvme-cmd or bounce (default: configuration/environment).
    #[arg(long)]
    pub path: Option<String>,
    /// After copying into memory, compare it with a plain read of the source.
    #[arg(long)]
    pub verify: bool,
    /// Copy only the runs of a strided shape of the source:
    /// `base=OFFSET,run=BYTES,dims=STRIDExCOUNT[,STRIDExCOUNT...]` (up to 3
    /// dimensions, innermost first; e.g. `base=4096,run=512,dims=8Kx64,1Mx4`).
    #[arg(long, conflicts_with_all = ["offset", "len", "piece"])]
    pub shape: Option<String>,
    /// With `--shape`: where the runs go in memory, `packed` (back to back,
    /// the default) or `strided` (the memory mirrors the bounding range).
    #[arg(long, requires = "shape")]
    pub layout: Option<String>,
    /// With `--shape`: `auto` (the default: the cost model's choice), `rc`,
    /// `sc` or `tat`.
    #[arg(long, requires = "shape")]
    pub mode: Option<String>,
    /// Copy into memory along a route through these staging places, in
    /// order, comma-separated: `host` (pinned host memory) or `accel:N`
    /// (staging allocated in accelerator N's memory). Every hop is a stage
    /// of one pipeline; `auto` alone takes the route the library plans.
    /// E.g. `copy /dev/nvme0n1 accel:1 --via accel:0,host`.
    #[arg(long, conflicts_with_all = ["shape", "piece"])]
    pub via: Option<String>,
}

/// Memory to copy into, and the module it came from (if any).
type Memory = (Box<dyn DeviceMemory>, Option<Arc<Module>>);

fn memory(spec: &str, size: u64) -> Res<Memory> {
    if spec == "host" {
        return Ok((
            Box::new(HostMemory::new(size as usize).map_err(|e| e.to_string())?),
            None,
        ));
    }
    let index = match spec.strip_prefix("accel") {
        Some("") => 0,
        Some(n) => n
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("bad memory '{spec}' (accel[:N] or host)"))?,
        None => return Err(format!("bad memory '{spec}' (accel[:N] or host)")),
    };
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let mem = ModuleMemory::alloc(module.clone(), index, size, 0).map_err(|e| e.to_string())?;
    Ok((Box::new(mem), Some(module)))
}

/// Where a file-to-file copy writes: a new file under a temporary name in
/// DST's directory, renamed over DST by [`Staged::commit`] and removed when
/// dropped uncommitted; or a device, in place.
struct Staged {
    /// The file being written: the temporary, or the device.
    path: PathBuf,
    /// The name it takes once complete (`None` for a device).
    dst: Option<PathBuf>,
    /// The file as created, kept open to sync it.
    file: File,
    done: bool,
}

impl Staged {
    fn create(to: &Path) -> Res<Self> {
        let err = |what: &str, e: std::io::Error| format!("{}: {what}: {e}", to.display());
        // The file DST names: a symbolic link's target is what gets replaced.
        let dst = match std::fs::symlink_metadata(to) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::canonicalize(to).map_err(|e| err("resolve the link", e))?
            }
            _ => to.to_path_buf(),
        };
        let mode = match std::fs::metadata(&dst) {
            Ok(m) if m.is_dir() => return Err(format!("{}: is a directory", to.display())),
            Ok(m) if !m.is_file() => {
                // A device: renaming over it would replace the node.
                let file = OpenOptions::new()
                    .write(true)
                    .open(&dst)
                    .map_err(|e| err("open", e))?;
                return Ok(Self {
                    path: dst,
                    dst: None,
                    file,
                    done: false,
                });
            }
            Ok(m) => Some(m.permissions().mode() & 0o777),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(err("stat", e)),
        };
        let name = dst
            .file_name()
            .ok_or_else(|| format!("{}: not a file name", to.display()))?
            .to_string_lossy()
            .into_owned();
        let dir = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        for n in 0..1000 {
            let path = dir.join(format!(".{name}.p2pdma-{}-{n}.tmp", std::process::id()));
            // The umask applies to a new DST's 0666; a replaced DST's bits are
            // set exactly once the file exists.
            let created = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if mode.is_some() { 0o600 } else { 0o666 })
                .open(&path);
            let file = match created {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("{}: create: {e}", path.display())),
            };
            let staged = Self {
                path,
                dst: Some(dst),
                file,
                done: false,
            };
            if let Some(mode) = mode {
                staged
                    .file
                    .set_permissions(Permissions::from_mode(mode))
                    .map_err(|e| format!("{}: chmod: {e}", staged.path.display()))?;
            }
            return Ok(staged);
        }
        Err(format!(
            "{}: no free temporary name beside it",
            to.display()
        ))
    }

    /// Syncs the copy and gives it DST's name.
    fn commit(mut self) -> Res<()> {
        self.file
            .sync_all()
            .map_err(|e| format!("{}: fsync: {e}", self.path.display()))?;
        let Some(dst) = &self.dst else {
            self.done = true;
            return Ok(());
        };
        std::fs::rename(&self.path, dst)
            .map_err(|e| format!("rename {} to {}: {e}", self.path.display(), dst.display()))?;
        self.done = true;
        // The rename is durable once the directory is synced.
        let dir = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("{}: fsync: {e}", dir.display()))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done && self.dst.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Touches every page of `mem` once (a zero byte at its start, before
/// anything is copied in), so that the kernel's page faults, and its
/// zeroing of fresh pages, happen here rather than in the timed copy.
fn prefault(mem: &dyn DeviceMemory) -> Res<()> {
    for off in (0..mem.len()).step_by(4096) {
        mem.write_at(off, &[0]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn bar(len: u64) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// Runs the copy.
pub fn run(a: &CopyArgs, json_out: bool) -> Res<()> {
    if let Some(spec) = &a.shape {
        return run_shape(a, spec, json_out);
    }
    if let Some(via) = &a.via {
        return run_route(a, via, json_out);
    }
    let src = StorageFile::open(&a.from).map_err(|e| e.to_string())?;
    let len = a.len.unwrap_or(src.size().saturating_sub(a.offset));
    if a.offset.checked_add(len).is_none_or(|end| end > src.size()) {
        return Err(format!(
            "{}+{} is past the end of {} ({} bytes)",
            a.offset,
            len,
            a.from.display(),
            src.size()
        ));
    }
    let to_file = !(a.to == "host" || a.to.starts_with("accel"));
    let piece = if to_file {
        a.piece.min(len.max(4096))
    } else {
        len.max(4096)
    };
    let (mem, module) = memory(if to_file { &a.through } else { &a.to }, piece)?;
    let engine = engine(a, module)?;
    let (staged, dst) = destination(a, to_file)?;
    let read = engine
        .handle(&src, mem.as_ref())
        .map_err(|e| e.to_string())?;
    eprintln!("read: {} path ({})", read.path(), read.reason());
    // Outside the timed copy: the memory's pages, and the ring and bounce
    // slots for the pieces' geometry (calibrating the device first if AUTO
    // has learned nothing about it yet).
    prefault(mem.as_ref())?;
    engine
        .prepare(&src, a.offset, piece as usize)
        .map_err(|e| e.to_string())?;
    let geometry = engine.geometry(&src, piece as usize);
    eprintln!(
        "geometry: {} KiB chunks, {} in flight ({})",
        geometry.geometry.chunk >> 10,
        geometry.geometry.depth,
        geometry.reason
    );
    let write = match &dst {
        Some(d) => {
            let h = engine.handle(d, mem.as_ref()).map_err(|e| e.to_string())?;
            eprintln!("write: {} path ({})", h.path(), h.reason());
            Some(h)
        }
        None => None,
    };
    let pb = bar(len);
    let (start, mut retried, mut threads) = (Instant::now(), 0, 0);
    let (mut rpath, mut wpath) = (None, None);
    let mut done = 0u64;
    while done < len {
        let n = piece.min(len - done) as usize;
        let r = read
            .read(a.offset + done, 0, n)
            .map_err(|e| e.to_string())?;
        retried += r.retried as u32;
        threads = threads.max(r.copy_threads);
        rpath = Some(r.path);
        if let Some(w) = &write {
            let r = w.write(done, 0, n).map_err(|e| e.to_string())?;
            retried += r.retried as u32;
            wpath = Some(r.path);
        }
        done += n as u64;
        pb.set_position(done);
    }
    pb.finish_and_clear();
    if let Some(s) = staged {
        s.commit()?;
    }
    let took = start.elapsed().max(Duration::from_nanos(1));
    if a.verify && !to_file {
        verify(a, mem.as_ref(), len)?;
    }
    let gib_s = len as f64 / took.as_secs_f64() / (1u64 << 30) as f64;
    let rp = rpath.map_or("-".into(), |p| p.to_string());
    let wp = wpath.map_or("-".into(), |p| p.to_string());
    if json_out {
        println!(
            "{}",
            json!({"bytes": len, "seconds": took.as_secs_f64(), "gib_s": gib_s, "read_path": rp,
                   "write_path": wp, "retried": retried, "memory": mem.kind().to_string(),
                   "chunk": geometry.geometry.chunk, "depth": geometry.geometry.depth,
                   "geometry_reason": geometry.reason, "copy_threads": threads})
        );
    } else {
        println!(
            "copied {len} bytes in {:.3} s ({gib_s:.3} GiB/s) through {}: read path {rp}, write path {wp}, {retried} retried, {threads} copy thread(s)",
            took.as_secs_f64(),
            mem.kind()
        );
    }
    Ok(())
}

/// The engine a copy uses: the environment's configuration, with `--path`.
fn engine(a: &CopyArgs, module: Option<Arc<Module>>) -> Res<Engine> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(p) = &a.path {
        cfg.set("path", p).map_err(|e| e.to_string())?;
    }
    Ok(Engine::new(cfg, module))
}

/// For a copy into a file: the staged destination and the storage to
/// write it through; for a copy into memory, neither.
fn destination(a: &CopyArgs, to_file: bool) -> Res<(Option<Staged>, Option<StorageFile>)> {
    if !to_file {
        return Ok((None, None));
    }
    let staged = Staged::create(Path::new(&a.to))?;
    let dst = StorageFile::open_rw(&staged.path).map_err(|e| e.to_string())?;
    Ok((Some(staged), Some(dst)))
}

/// Compares `len` bytes of `mem` with a plain read of the source.
fn verify(a: &CopyArgs, mem: &dyn DeviceMemory, len: u64) -> Res<()> {
    let plain = std::fs::File::open(&a.from).map_err(|e| e.to_string())?;
    let (mut want, mut got) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    for off in (0..len).step_by(1 << 20) {
        let n = (len - off).min(1 << 20) as usize;
        plain
            .read_exact_at(&mut want[..n], a.offset + off)
            .map_err(|e| e.to_string())?;
        mem.read_at(off as usize, &mut got[..n])
            .map_err(|e| e.to_string())?;
        if want[..n] != got[..n] {
            return Err(format!(
                "verify: memory differs from the source at offset {}",
                a.offset + off
            ));
        }
    }
    eprintln!("verify: {len} bytes match the source");
    Ok(())
}

/// `copy --via`: the source into memory along a route.
fn run_route(a: &CopyArgs, via: &str, json_out: bool) -> Res<()> {
    if !(a.to == "host" || a.to.starts_with("accel")) {
        return Err(format!(
            "--via: the destination must be memory (accel[:N] or host), not {}",
            a.to
        ));
    }
    let src = StorageFile::open(&a.from).map_err(|e| e.to_string())?;
    let len = a.len.unwrap_or(src.size().saturating_sub(a.offset));
    if len == 0 || a.offset.checked_add(len).is_none_or(|end| end > src.size()) {
        return Err(format!(
            "{}+{} is not inside {} ({} bytes)",
            a.offset,
            len,
            a.from.display(),
            src.size()
        ));
    }
    let size = usize::try_from(len).map_err(|_| "--len too large".to_string())?;
    let (mem, mut module) = memory(&a.to, len)?;
    // Staging for three chunks of the route's default size.
    let chunk = (size / 16).clamp(256 << 10, 8 << 20).next_multiple_of(4096);
    let staging_len = 3 * (chunk + 4096) + 4096;
    let mut staging: Vec<Box<dyn DeviceMemory>> = Vec::new();
    let mut host = Vec::new();
    let planned = via == "auto";
    if !planned {
        for (i, place) in via.split(',').enumerate() {
            match place.trim() {
                "host" => host.push(i),
                p if p.starts_with("accel") => {
                    let (m, md) = memory(p, staging_len as u64)?;
                    module = module.or(md);
                    staging.push(m);
                }
                p => return Err(format!("--via: bad place '{p}' (host or accel:N)")),
            }
        }
    }
    let engine = engine(a, module)?;
    let mut vias = Vec::new();
    let mut next = staging.iter();
    for i in 0..host.len() + staging.len() {
        vias.push(match host.contains(&i) {
            true => Via::Host,
            false => {
                let m = next.next().ok_or("--via: staging missing")?;
                Via::Memory(MemRange::whole(m.as_ref()))
            }
        });
    }
    let (s, d) = (
        End::Storage {
            file: &src,
            offset: a.offset,
        },
        End::Memory {
            mem: mem.as_ref(),
            offset: 0,
        },
    );
    let route = match planned {
        true => engine.routes().plan(s, d),
        false => engine.routes().plan_through(s, &vias, d),
    }
    .map_err(|e| format!("planning the route: {e}"))?;
    for h in route.hops() {
        eprintln!("hop: {h}");
    }
    eprintln!("why: {}", route.reason());
    prefault(mem.as_ref())?;
    let opts = RouteOptions {
        chunk: Some(chunk),
        ..RouteOptions::default()
    };
    let rep = engine
        .routes()
        .copy(&route, size, &opts)
        .map_err(|e| e.to_string())?;
    if a.verify {
        verify(a, mem.as_ref(), len)?;
    }
    let took = rep.elapsed.max(Duration::from_nanos(1));
    let gib_s = len as f64 / took.as_secs_f64() / (1u64 << 30) as f64;
    let busy: Vec<f64> = rep.busy.iter().map(|d| d.as_secs_f64()).collect();
    if json_out {
        println!(
            "{}",
            json!({"bytes": len, "seconds": took.as_secs_f64(), "gib_s": gib_s,
                   "hops": rep.hops.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
                   "reason": route.reason(), "chunk": rep.chunk, "chunks": rep.chunks,
                   "hop_busy_seconds": busy, "memory": mem.kind().to_string()})
        );
    } else {
        println!(
            "copied {len} bytes in {:.3} s ({gib_s:.3} GiB/s) along {} hops into {}, {} chunks of {} KiB; hop busy times {}",
            took.as_secs_f64(),
            rep.hops.len(),
            mem.kind(),
            rep.chunks,
            rep.chunk >> 10,
            busy.iter()
                .map(|b| format!("{:.1} ms", b * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Where run `r` of `shape` lies in memory under `layout`.
fn place(shape: &Shape, layout: Layout, r: &p2pdma::transfer::strided::Run) -> usize {
    match layout {
        Layout::Packed => r.packed_offset as usize,
        Layout::Strided => (r.file_offset - shape.base()) as usize,
    }
}

/// Compares the runs of `shape` in `got` (the memory's layout, from its
/// first byte) with a plain read of the source, run by run (for RC, the
/// whole bounding range, which it fills).
fn verify_runs(
    from: &Path,
    shape: &Shape,
    layout: Layout,
    report: &StridedReport,
    got: &dyn Fn(usize, &mut [u8]) -> Res<()>,
) -> Res<()> {
    let plain = File::open(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let run = shape.run_len() as usize;
    let (mut want, mut have) = (vec![0u8; run], vec![0u8; run]);
    for r in shape.iter() {
        plain
            .read_exact_at(&mut want, r.file_offset)
            .map_err(|e| format!("{}: {e}", from.display()))?;
        got(place(shape, layout, &r), &mut have)?;
        if want != have {
            return Err(format!(
                "verify: the run at offset {} of the source differs from its copy",
                r.file_offset
            ));
        }
    }
    if report.mode == StridedMode::Rc {
        let len = shape.bounding_len() as usize;
        let (mut want, mut have) = (vec![0u8; len], vec![0u8; len]);
        plain
            .read_exact_at(&mut want, shape.base())
            .map_err(|e| format!("{}: {e}", from.display()))?;
        got(0, &mut have)?;
        if want != have {
            return Err("verify: RC's bounding range differs from the source".into());
        }
    }
    Ok(())
}

/// `copy --shape`: the runs of the shape in one strided read into memory,
/// then, for a file destination, the memory's layout written to it.
fn run_shape(a: &CopyArgs, spec: &str, json_out: bool) -> Res<()> {
    let shape = crate::shape::parse_shape(spec)?;
    let layout = match &a.layout {
        Some(l) => crate::shape::parse_layout(l)?,
        None => Layout::Packed,
    };
    let mode = match &a.mode {
        Some(m) => crate::shape::parse_mode(m)?,
        None => StridedMode::Auto,
    };
    let src = StorageFile::open(&a.from).map_err(|e| e.to_string())?;
    let (_, end) = shape.bounds();
    if end > src.size() {
        return Err(format!(
            "the shape's last run ends at byte {end}, past the end of {} ({} bytes)",
            a.from.display(),
            src.size()
        ));
    }
    let room = match layout {
        Layout::Packed => shape.bytes(),
        Layout::Strided => shape.bounding_len(),
    };
    let room_len =
        usize::try_from(room).map_err(|_| format!("{room} bytes do not fit in memory"))?;
    let to_file = !(a.to == "host" || a.to.starts_with("accel"));
    let (mem, module) = memory(if to_file { &a.through } else { &a.to }, room)?;
    let engine = engine(a, module)?;
    let read = engine
        .handle(&src, mem.as_ref())
        .map_err(|e| e.to_string())?;
    eprintln!("read: {} path ({})", read.path(), read.reason());
    drop(read);
    prefault(mem.as_ref())?;
    if to_file && layout == Layout::Strided {
        // The file receives the whole bounding range: its gaps are zeros
        // unless RC fills them, whatever the memory held before.
        let zeros = vec![0u8; room_len.min(1 << 20)];
        for at in (0..room_len).step_by(zeros.len()) {
            let n = zeros.len().min(room_len - at);
            mem.write_at(at, &zeros[..n]).map_err(|e| e.to_string())?;
        }
    }
    let (staged, dst) = destination(a, to_file)?;
    let start = Instant::now();
    let r = engine
        .strided()
        .read(&src, &shape, MemRange::whole(mem.as_ref()), layout, mode)
        .map_err(|e| e.to_string())?;
    eprintln!("strided: {} ({})", r.mode, r.reason);
    let mut wpath = None;
    if let Some(d) = &dst {
        let w = MemRange::new(mem.as_ref(), 0, room_len)
            .and_then(|range| engine.write(d, 0, range))
            .map_err(|e| e.to_string())?;
        wpath = Some(w.path);
    }
    if let Some(s) = staged {
        s.commit()?;
    }
    let took = start.elapsed().max(Duration::from_nanos(1));
    if a.verify {
        verify_runs(&a.from, &shape, layout, &r, &|at, buf| {
            mem.read_at(at, buf).map_err(|e| e.to_string())
        })?;
        if to_file {
            let out = File::open(&a.to).map_err(|e| format!("{}: {e}", a.to))?;
            verify_runs(&a.from, &shape, layout, &r, &|at, buf| {
                out.read_exact_at(buf, at as u64)
                    .map_err(|e| format!("{}: {e}", a.to))
            })?;
        }
        eprintln!(
            "verify: {} runs ({} bytes) match the source",
            shape.runs(),
            shape.bytes()
        );
    }
    let gib_s = shape.bytes() as f64 / took.as_secs_f64() / (1u64 << 30) as f64;
    let paths: Vec<String> = r.paths.iter().map(|p| p.to_string()).collect();
    let wp = wpath.map_or("-".into(), |p| p.to_string());
    if json_out {
        println!(
            "{}",
            json!({"shape": crate::shape::format_shape(&shape), "runs": shape.runs(),
                   "bytes": shape.bytes(), "layout_bytes": room, "rho": shape.rho(),
                   "seconds": took.as_secs_f64(), "gib_s": gib_s, "mode": r.mode.to_string(),
                   "reason": r.reason, "storage_bytes": r.storage_bytes, "calls": r.calls,
                   "read_paths": paths, "write_path": wp, "retried": r.retried,
                   "memory": mem.kind().to_string()})
        );
    } else {
        println!(
            "copied {} runs, {} bytes ({} in memory, rho {:.3}) in {:.3} s ({gib_s:.3} GiB/s) through {}: mode {}, {} storage bytes in {} calls, read path {}, write path {wp}",
            shape.runs(),
            shape.bytes(),
            room,
            shape.rho(),
            took.as_secs_f64(),
            mem.kind(),
            r.mode,
            r.storage_bytes,
            r.calls,
            if paths.is_empty() { "-".into() } else { paths.join("+") },
        );
    }
    Ok(())
}
