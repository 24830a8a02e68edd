//! `bench arrays` and `bench volume`: many SSDs as one.
//!
//! - `arrays`: each target (a lone member, md RAID0 arrays over 2 and 4
//!   members) read sequentially into accelerator memory by P2P, against
//!   fio's best on the same device (its sweep first, then fio at the best
//!   settings interleaved with P2P), with the scaling of both.
//! - `volume`: the members read in parallel by fio (one job per member, at
//!   the best settings of a sweep on the first), 1, 2 and 4 of them; then
//!   the controllers taken from the kernel and the library's striped
//!   volume over the same members read by the queues path, each member's
//!   part on its own controller; then the controllers given back. The two
//!   cannot run interleaved: fio needs the kernel's driver, the volume
//!   the controllers.
//!
//! Every read's bytes are checked against a buffered read of the same
//! range (arrays) or the members' own bytes read by the kernel before the
//! controllers were taken (volume).

use std::{
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use p2pdma::{
    memory::{DeviceMemory, ModuleMemory},
    queues::{claim, Controller, InitOptions},
    transfer::{
        Config, Engine, Namespace, PathPref, StorageFile, TransferPath, Volume, VolumeMember,
    },
    MemRange, Module, PciAddress,
};
use serde_json::{json, Value};

use super::{
    common::{device_size, first_accelerator, gib_s, median, BenchArgs, Res},
    fio::{fio, fio_limit, fio_parallel},
};

/// The accelerator buffer the reads land in, reused through the range.
const BUFFER: u64 = 16 << 20;

/// `len` bytes at `offset` of `path`, read by the kernel with its page cache.
fn buffered(path: &Path, offset: u64, len: usize) -> Res<Vec<u8>> {
    let mut v = vec![0u8; len];
    std::fs::File::open(path)
        .and_then(|f| f.read_exact_at(&mut v, offset))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(v)
}

/// Reads `total` bytes from the start of `file` through `mem` (a buffer at
/// a time) with `engine`, which must take `path`; GiB/s.
fn sequential(
    engine: &Engine,
    file: &StorageFile,
    mem: &dyn DeviceMemory,
    total: u64,
    path: TransferPath,
) -> Res<f64> {
    let buf = (mem.len() as u64).min(total);
    let start = Instant::now();
    let mut at = 0;
    while at < total {
        let n = buf.min(total - at) as usize;
        let r = MemRange::new(mem, 0, n).map_err(|e| e.to_string())?;
        let report = engine.read(file, at, r).map_err(|e| e.to_string())?;
        if report.path != path {
            return Err(format!("the read took {}, not {path}", report.path));
        }
        at += n as u64;
    }
    Ok(gib_s(total, start.elapsed()))
}

/// Where the last read of `sequential` over `total` bytes through a buffer
/// of `buf` bytes starts, and its length (what the buffer holds after).
fn last_read(total: u64, buf: u64) -> (u64, u64) {
    let buf = buf.min(total).max(1);
    let at = total.saturating_sub(1) / buf * buf;
    (at, total - at)
}

/// The bytes the buffer holds after `sequential` must be `want`.
fn check_tail(mem: &dyn DeviceMemory, want: &[u8], what: &str) -> Res<()> {
    let mut got = vec![0u8; want.len()];
    mem.read_at(0, &mut got).map_err(|e| e.to_string())?;
    match want.iter().zip(&got).position(|(a, b)| a != b) {
        Some(i) => Err(format!("{what}: byte {i} of the last buffer read differs")),
        None => Ok(()),
    }
}

/// `--targets LABEL=PATH,...`, or the lone `--file`.
fn targets(a: &BenchArgs) -> Res<Vec<(String, PathBuf)>> {
    if a.targets.is_empty() {
        return Err(
            "bench arrays needs --targets LABEL=PATH,... (a member, then md arrays)".into(),
        );
    }
    a.targets
        .iter()
        .map(|t| {
            let (l, p) = t
                .split_once('=')
                .ok_or_else(|| format!("--targets {t}: LABEL=PATH"))?;
            Ok((l.to_string(), PathBuf::from(p)))
        })
        .collect()
}

pub(super) fn arrays(a: &BenchArgs, out: &mut Value) -> Res<()> {
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let accel = first_accelerator(&module)?;
    let mem =
        ModuleMemory::alloc(module.clone(), accel.index, BUFFER, 0).map_err(|e| e.to_string())?;
    let engine = Engine::new(
        Config {
            path: PathPref::P2p,
            chunk: Some(a.bs as usize),
            depth: Some(a.depth),
            ..Config::default()
        },
        Some(module.clone()),
    );
    println!(
        "arrays: sequential reads into accelerator {}'s memory by P2P against fio's best on the same device (TCG: the emulated drives run on the host's cores, so the rig's own limit is fio's curve)",
        accel.index
    );
    let mut rows = Vec::new();
    for (label, path) in targets(a)? {
        let size = a.size.min(device_size(&path)?) / (1 << 20) * (1 << 20);
        let (best, sweep) = fio_limit(&path, size)?;
        let file = StorageFile::open(&path).map_err(|e| e.to_string())?;
        let (tail, n) = last_read(size, BUFFER);
        let want = buffered(&path, tail, n as usize)?;
        let (mut f, mut p) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            f.push(fio(&path, size, best)?);
            p.push(sequential(&engine, &file, &mem, size, TransferPath::P2p)?);
            check_tail(&mem, &want, &label)?;
        }
        let (fm, pm) = (median(f), median(p));
        println!(
            "  {label:>8} ({}): fio {fm:6.3} GiB/s ({best}, best of {}), P2P {pm:6.3} GiB/s = {:.2}x fio",
            path.display(),
            sweep.len(),
            pm / fm
        );
        rows.push(
            json!({"target": label, "path": path, "bytes": size, "fio_gib_s": fm,
            "fio_settings": best.to_string(), "p2p_gib_s": pm, "ratio": pm / fm}),
        );
    }
    out["arrays"] = json!(rows);
    Ok(())
}

/// A member given by its block device: its controller and namespace id.
struct Member {
    dev: PathBuf,
    pci: PciAddress,
    nsid: u32,
}

fn member(dev: &Path) -> Res<Member> {
    let (pci, nsid) = VolumeMember::Device(dev.to_path_buf())
        .locate()
        .map_err(|e| e.to_string())?;
    Ok(Member {
        dev: dev.to_path_buf(),
        pci,
        nsid,
    })
}

pub(super) fn volume(a: &BenchArgs, out: &mut Value) -> Res<()> {
    if a.members.is_empty() {
        return Err("bench volume needs --members /dev/nvmeXnY,... (the nvme driver's)".into());
    }
    let members = a
        .members
        .iter()
        .map(|d| member(d))
        .collect::<Res<Vec<_>>>()?;
    let counts: Vec<usize> = [1, 2, 4, 8]
        .into_iter()
        .filter(|&k| k <= members.len())
        .collect();
    let chunk = a.bs.max(4096).next_power_of_two();
    let smallest = members
        .iter()
        .map(|m| device_size(&m.dev))
        .collect::<Res<Vec<_>>>()?
        .into_iter()
        .min()
        .unwrap_or(0);
    let per = a.size.min(smallest) / chunk * chunk;
    println!(
        "volume: members read in parallel by fio (a job each) against the library's striped volume ({} KiB chunks) over them on the queues path, {} MiB from each member (TCG: the emulated drives run on the host's cores)",
        chunk >> 10,
        per >> 20
    );
    // fio first, while the kernel drives the members; and the bytes the
    // volume's last buffer must hold, as the kernel reads them.
    let (best, _) = fio_limit(&members[0].dev, per)?;
    let mut fio_rates = Vec::new();
    for &k in &counts {
        let devs: Vec<&Path> = members[..k].iter().map(|m| m.dev.as_path()).collect();
        let r: Vec<f64> = (0..a.reps)
            .map(|_| fio_parallel(&devs, per, best))
            .collect::<Res<_>>()?;
        fio_rates.push(median(r));
    }
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let accel = first_accelerator(&module)?;
    let mem: Arc<dyn DeviceMemory> = Arc::new(
        ModuleMemory::alloc(module.clone(), accel.index, BUFFER, 0).map_err(|e| e.to_string())?,
    );
    let mut wants = Vec::new();
    for &k in &counts {
        let total = per * k as u64;
        let (tail, n) = last_read(total, BUFFER);
        let mut want = vec![0u8; n as usize];
        for (at, slot, moff, len) in striped_layout(tail, n, chunk, k as u64) {
            let b = buffered(&members[slot].dev, moff, len as usize)?;
            want[(at - tail) as usize..][..len as usize].copy_from_slice(&b);
        }
        wants.push(want);
    }
    let taken: Res<Vec<(f64, f64)>> = (|| {
        let mut ns = Vec::new();
        for m in &members {
            let opts = InitOptions {
                unbind: true,
                ..InitOptions::default()
            };
            let ctrl =
                Controller::initialize(module.clone(), m.pci, &opts).map_err(|e| e.to_string())?;
            ns.push(Arc::new(
                Namespace::new(ctrl, module.clone(), m.nsid).map_err(|e| e.to_string())?,
            ));
        }
        let engine = Engine::new(Config::default(), Some(module.clone()));
        let mut rates = Vec::new();
        for (i, &k) in counts.iter().enumerate() {
            let v =
                Arc::new(Volume::striped(ns[..k].to_vec(), chunk, 0).map_err(|e| e.to_string())?);
            v.register(mem.clone()).map_err(|e| e.to_string())?;
            let file = StorageFile::volume(v.clone());
            let total = per * k as u64;
            if k > 1 {
                let c = engine
                    .choose(&file, mem.as_ref())
                    .map_err(|e| e.to_string())?;
                println!("  volume of {k}: {}", c.reason);
            }
            let ios = || engine.stats().queues.snapshot().ios;
            let before = ios();
            let r: Vec<f64> = (0..a.reps)
                .map(|_| sequential(&engine, &file, mem.as_ref(), total, TransferPath::Queues))
                .collect::<Res<_>>()?;
            let volume_ios = ios() - before;
            check_tail(mem.as_ref(), &wants[i], &format!("volume of {k}"))?;
            // The same members each read on its own, all at once: what
            // the volume's split and its threads add or cost.
            let files: Vec<StorageFile> = ns[..k]
                .iter()
                .map(|n| StorageFile::namespace(n.clone()))
                .collect();
            let before = ios();
            let alone: Vec<f64> = (0..a.reps)
                .map(|_| at_once(&engine, &files, mem.as_ref(), per))
                .collect::<Res<_>>()?;
            let mib = (total * a.reps as u64) as f64 / (1u64 << 20) as f64;
            println!(
                "  {k} member(s): NVMe commands per MiB: volume {:.2}, members on their own {:.2}",
                volume_ios as f64 / mib,
                (ios() - before) as f64 / mib
            );
            v.unregister(mem.as_ref());
            rates.push((median(r), median(alone)));
        }
        Ok(rates)
    })();
    // Back to the kernel whatever happened.
    let mut back = Ok(());
    for m in &members {
        if let Err(e) = claim::give_back(&m.pci.to_string()) {
            back = Err(e);
        }
    }
    let rates = taken?;
    back?;
    let mut rows = Vec::new();
    for ((&k, f), &(v, alone)) in counts.iter().zip(&fio_rates).zip(&rates) {
        println!(
            "  {k} member{}: fio in parallel {f:6.3} GiB/s, volume {v:6.3} GiB/s = {:.2}x fio, each member on its own at once {alone:6.3} GiB/s; scaling from 1 member: fio {:.2}x, volume {:.2}x",
            if k == 1 { " " } else { "s" },
            v / f,
            f / fio_rates[0],
            v / rates[0].0
        );
        rows.push(
            json!({"members": k, "fio_gib_s": f, "volume_gib_s": v, "ratio": v / f,
            "members_alone_at_once_gib_s": alone}),
        );
    }
    println!("  fio's settings: {best} (the best of its sweep on the first member)");
    out["volume"] = json!({"chunk": chunk, "bytes_per_member": per, "fio_settings": best.to_string(), "rows": rows});
    Ok(())
}

/// Each of `files` read from its start, `per` bytes, all at once (a thread
/// each, through its own part of `mem`); GiB/s of them all together.
fn at_once(engine: &Engine, files: &[StorageFile], mem: &dyn DeviceMemory, per: u64) -> Res<f64> {
    let part = (mem.len() / files.len()) / 4096 * 4096;
    let start = Instant::now();
    std::thread::scope(|s| {
        let readers: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(j, f)| {
                s.spawn(move || -> Res<()> {
                    let mut at = 0;
                    while at < per {
                        let n = (part as u64).min(per - at) as usize;
                        let r = MemRange::new(mem, j * part, n).map_err(|e| e.to_string())?;
                        engine.read(f, at, r).map_err(|e| e.to_string())?;
                        at += n as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        readers
            .into_iter()
            .try_for_each(|h| h.join().map_err(|_| "a reader panicked".to_string())?)
    })?;
    Ok(gib_s(per * files.len() as u64, start.elapsed()))
}

/// md's raid0 layout over `n` equal members from their first byte: each
/// run's offset, member and offset on the member, and length (the model
/// the volume follows, written out again for the check).
fn striped_layout(offset: u64, len: u64, chunk: u64, n: u64) -> Vec<(u64, usize, u64, u64)> {
    let mut out = Vec::new();
    let (mut at, end) = (offset, offset + len);
    while at < end {
        let (index, within) = (at / chunk, at % chunk);
        let run = (chunk - within).min(end - at);
        out.push((at, (index % n) as usize, index / n * chunk + within, run));
        at += run;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_read_is_where_sequential_leaves_the_buffer() {
        assert_eq!(last_read(24 << 20, 16 << 20), (16 << 20, 8 << 20));
        assert_eq!(last_read(32 << 20, 16 << 20), (16 << 20, 16 << 20));
        assert_eq!(last_read(4096, 16 << 20), (0, 4096));
    }

    #[test]
    fn the_layout_goes_round_the_members() {
        let l = striped_layout(4096 * 3 - 10, 8192 + 20, 4096, 2);
        assert_eq!(
            l,
            vec![
                (4096 * 3 - 10, 0, 4096 + 4086, 10),
                (4096 * 3, 1, 4096, 4096),
                (4096 * 4, 0, 8192, 4096),
                (4096 * 5, 1, 8192, 10),
            ]
        );
    }
}
