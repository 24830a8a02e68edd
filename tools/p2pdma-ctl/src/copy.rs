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
    backend::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{Config, Engine, StorageFile},
    Module,
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
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(p) = &a.path {
        cfg.set("path", p).map_err(|e| e.to_string())?;
    }
    let engine = Engine::new(cfg, module);
    let staged = if to_file {
        Some(Staged::create(Path::new(&a.to))?)
    } else {
        None
    };
    let dst = match &staged {
        Some(s) => Some(StorageFile::open_rw(&s.path).map_err(|e| e.to_string())?),
        None => None,
    };
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
