//! `p2pdma-ctl copy`: storage to accelerator memory, or one file to another
//! through accelerator memory, with a progress bar, the throughput and the
//! path each transfer took.

use std::{
    os::unix::fs::FileExt,
    path::PathBuf,
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
    /// with `--through`.
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
    let dst = if to_file {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&a.to)
            .map_err(|e| format!("{}: {e}", a.to))?;
        drop(f);
        Some(StorageFile::open_rw(&a.to).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let read = engine
        .handle(&src, mem.as_ref())
        .map_err(|e| e.to_string())?;
    eprintln!("read: {} path ({})", read.path(), read.reason());
    let write = match &dst {
        Some(d) => {
            let h = engine.handle(d, mem.as_ref()).map_err(|e| e.to_string())?;
            eprintln!("write: {} path ({})", h.path(), h.reason());
            Some(h)
        }
        None => None,
    };
    let pb = bar(len);
    let (start, mut retried) = (Instant::now(), 0);
    let (mut rpath, mut wpath) = (None, None);
    let mut done = 0u64;
    while done < len {
        let n = piece.min(len - done) as usize;
        let r = read
            .read(a.offset + done, 0, n)
            .map_err(|e| e.to_string())?;
        retried += r.retried as u32;
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
                   "write_path": wp, "retried": retried, "memory": mem.kind().to_string()})
        );
    } else {
        println!(
            "copied {len} bytes in {:.3} s ({gib_s:.3} GiB/s) through {}: read path {rp}, write path {wp}, {retried} retried",
            took.as_secs_f64(),
            mem.kind()
        );
    }
    Ok(())
}
