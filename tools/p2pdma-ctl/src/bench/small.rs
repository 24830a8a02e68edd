//! `bench small`: 4 KiB random reads through `Engine::read` vs `pread`
//! with `O_DIRECT` plus a copy into the same memory, same file and offsets;
//! then the same reads of the file cached, vs `preadv` on a buffered
//! descriptor. Beside them, fio's 4 KiB random reads at depth 1 on the
//! same file, where fio is installed.

use std::{
    os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt},
    sync::Arc,
    time::Instant,
};

use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{Config, Engine, StorageFile, TransferPath},
    MemRange, Module,
};
use serde_json::{json, Value};

use super::{
    common::{drop_cached, ensure_file, median, BenchArgs, Res},
    fio::{fio_latency, have_fio},
};

/// A 4 KiB block aligned for `O_DIRECT`.
#[repr(C, align(4096))]
struct Block([u8; 4096]);

/// Small random reads: 4 KiB at random aligned offsets of one file, through
/// `Engine::read` into device memory, vs what an application would do
/// without the library: `pread` with `O_DIRECT` into an aligned host buffer,
/// then a copy of it into the same device memory. The same offsets, both
/// direct, interleaved repetitions, medians.
pub(super) fn small(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
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
    // With accelerator memory that P2P reaches, a third way: pread with
    // O_DIRECT straight into its mapping, which is what the engine's P2P
    // path does, without the engine: the engine's own cost, apart from
    // P2P's.
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
    // Straight into accelerator memory without the engine, only where P2P
    // reaches it (not over a fabric, say).
    let p2p = accel.is_some() && choice.path == TransferPath::P2p;
    // Cold: direct reads cache nothing, so the file stays out of the page
    // cache for the whole run.
    drop_cached(&path)?;
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
        MemRange::new(mem, (i % 256) * 4096, 4096)
            .and_then(|range| e.read(&file, off, range))
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
        .filter(|m| p2p && m.module().has_block_io() && !file.is_file());
    let mut blk = Vec::new();
    let by_block_io = |i: usize, off: u64| -> Res<f64> {
        let m = module_io.ok_or("no module block I/O")?;
        let seg = p2pdma_abi::P2pdmaIoSeg {
            mem_offset: ((i % 256) * 4096) as u64,
            dev_offset: off,
            len: 4096,
        };
        let t = Instant::now();
        m.block_io(&direct, false, &[seg], 1)
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
            if p2p {
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
    let (e10, e90, e99) = (pct(&mut eng, 0.1), pct(&mut eng, 0.9), pct(&mut eng, 0.99));
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
    // fio on the same file: what the storage gives a program that reads
    // 4 KiB at a time into host memory, with no copy after.
    if have_fio() {
        let f = fio_latency(&path, size, ops)?;
        println!(
            "  fio (psync, O_DIRECT, depth 1, into host memory) {:8.2} us/read (median {:.2}, p99 {:.2})   engine/fio: median {:5.3}, p99 {:5.3}",
            f.mean / 1e3,
            f.p50 / 1e3,
            f.p99 / 1e3,
            eng / f.p50,
            e99 / f.p99
        );
        json_out["small"]["fio"] = json!({
            "mean_ns": f.mean, "p50_ns": f.p50, "p99_ns": f.p99, "engine_vs_fio_p50": eng / f.p50,
            "engine_p99_ns": e99, "engine_vs_fio_p99": e99 / f.p99,
        });
    } else {
        println!("  fio: not installed, no comparison with it");
    }
    warm(&e, &file, &path, mem, &offsets, a.reps, json_out)?;
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

/// The same reads of the file cached: `Engine::read` (which copies them out
/// of the page cache) vs `preadv` on a buffered descriptor into a host
/// buffer as large as the engine's span of memory, at the same offsets in
/// it, interleaved, medians per read.
fn warm(
    e: &Engine,
    file: &StorageFile,
    path: &std::path::Path,
    mem: &dyn DeviceMemory,
    offsets: &[u64],
    reps: usize,
    json_out: &mut Value,
) -> Res<()> {
    let plain = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // Every offset read once through the page cache: all of them cached.
    let mut block = Box::new(Block([0; 4096]));
    for &off in offsets {
        plain
            .read_at(&mut block.0, off)
            .map_err(|e| format!("pread: {e}"))?;
    }
    let mut host = vec![0u8; 256 * 4096];
    let (mut eng, mut sys) = (Vec::new(), Vec::new());
    let mut cached = 0u64;
    for rep in 0..reps.max(1) {
        for (i, &off) in offsets.iter().enumerate() {
            let mut by_engine = || -> Res<f64> {
                let t = Instant::now();
                let r = MemRange::new(mem, (i % 256) * 4096, 4096)
                    .and_then(|range| e.read(file, off, range))
                    .map_err(|e| e.to_string())?;
                let took = t.elapsed().as_nanos() as f64;
                cached += r.page_cache;
                Ok(took)
            };
            let mut by_preadv = || -> Res<f64> {
                let t = Instant::now();
                let at = (i % 256) * 4096;
                let into = std::io::IoSliceMut::new(&mut host[at..at + 4096]);
                let n = rustix::io::preadv(&plain, &mut [into], off)
                    .map_err(|e| format!("preadv: {e}"))?;
                if n != 4096 {
                    return Err(format!("short preadv at {off}: {n}"));
                }
                Ok(t.elapsed().as_nanos() as f64)
            };
            if (i + rep) % 2 == 0 {
                eng.push(by_engine()?);
                sys.push(by_preadv()?);
            } else {
                sys.push(by_preadv()?);
                eng.push(by_engine()?);
            }
        }
    }
    let reads = eng.len() as u64;
    let (eng, sys) = (median(eng), median(sys));
    println!(
        "  cached: engine {:8.2} us/read   preadv (buffered) {:8.2} us/read   engine/preadv {:5.3}   ({:.0}% of the engine's bytes from the page cache)",
        eng / 1e3,
        sys / 1e3,
        eng / sys,
        100.0 * cached as f64 / (reads * 4096) as f64
    );
    json_out["small"]["cached"] = json!({
        "engine_ns": eng, "preadv_ns": sys, "engine_vs_preadv": eng / sys,
        "page_cache_bytes": cached,
    });
    Ok(())
}
