//! `p2pdma-ctl bench route`: routes of k = 2, 3 and 4 hops, each copied
//! whole with n = 1 chunk (store-and-forward: every hop moves everything,
//! one after the other) and pipelined with n = 2 to 64 chunks, against the
//! ideal pipeline computed from the hops' own times.
//!
//! With `--accel` (the p2pdma module loaded, one accelerator the namespace
//! reaches by P2P and one it does not): the namespace into the far
//! accelerator through host memory (k = 2); through staging in the near
//! accelerator's memory, then host memory (k = 3); and on through staging
//! in the far accelerator into the host-memory device (k = 4). Without it:
//! a file through one, two or three host-memory rings into the host-memory
//! device.
//!
//! The ideal for n chunks, from each hop's whole time `T_i` (its busy time
//! in the store-and-forward run): `sum(T) / n + (n - 1) / n * max(T)`, the
//! time of a pipeline whose stages never wait but for each other. Every
//! run's destination is compared with the source.

use std::{path::PathBuf, sync::Arc};

use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{Config, End, Engine, Route, RouteOptions, StorageFile, Via},
    MemRange, Module, Peer,
};
use serde_json::{json, Value};

use super::common::{ensure_file, median, BenchArgs, Res};

/// Chunk counts tried; 1 is store-and-forward.
const NS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

fn ms(d: f64) -> String {
    format!("{:.1} ms", d * 1e3)
}

/// The ideal pipeline's time for `n` chunks, from the hops' whole times.
pub fn ideal(hops: &[f64], n: usize) -> f64 {
    let sum: f64 = hops.iter().sum();
    let max = hops.iter().copied().fold(0.0, f64::max);
    let n = n as f64;
    sum / n + (n - 1.0) / n * max
}

/// The memories a route's ends and staging need, kept alive for the runs.
struct Places {
    storage: StorageFile,
    dst: Vec<Box<dyn DeviceMemory>>,
    staging: Vec<Box<dyn DeviceMemory>>,
    /// What each k's route is, in words.
    names: Vec<String>,
}

/// Builds the places: the accelerators when `--accel`, host memory
/// otherwise. `size` bytes are copied.
fn places(a: &BenchArgs, size: usize) -> Res<(Places, Option<Arc<Module>>)> {
    // Staging for one whole chunk at n = 1, and for two or three chunks
    // above.
    let staging = size + size / 2 + (16 << 10);
    if !a.accel {
        let path: PathBuf = a
            .file
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/tmp/p2pdma-bench.dat"));
        ensure_file(&path, size as u64)?;
        let storage = StorageFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let dst = HostMemory::new(size).map_err(|e| e.to_string())?;
        return Ok((
            Places {
                storage,
                dst: vec![Box::new(dst)],
                staging: Vec::new(),
                names: vec![
                    format!("{} -> host -> host-memory device", path.display()),
                    format!("{} -> host -> host -> host-memory device", path.display()),
                    format!(
                        "{} -> host -> host -> host -> host-memory device",
                        path.display()
                    ),
                ],
            },
            None,
        ));
    }
    let module = Arc::new(
        Module::open().map_err(|e| format!("--accel: {e} (the p2pdma module must be loaded)"))?,
    );
    let nvme = std::fs::File::open(&a.nvme).map_err(|e| format!("{}: {e}", a.nvme.display()))?;
    let (mut near, mut far) = (None, None);
    for acc in module.accelerators().map_err(|e| e.to_string())? {
        let q = module
            .p2p_query(acc.index, Peer::Fd(std::os::fd::AsFd::as_fd(&nvme)))
            .map_err(|e| e.to_string())?;
        match q.distance {
            Some(_) => near = near.or(Some(acc)),
            None => far = far.or(Some(acc)),
        }
    }
    let (Some(near), Some(far)) = (near, far) else {
        return Err(format!(
            "--accel: needs one accelerator {} reaches by P2P and one it does not",
            a.nvme.display()
        ));
    };
    let alloc = |index, len: usize| -> Res<Box<dyn DeviceMemory>> {
        let m = ModuleMemory::alloc(module.clone(), index, len.next_multiple_of(4096) as u64, 0)
            .map_err(|e| format!("{len} bytes of accelerator {index}: {e}"))?;
        Ok(Box::new(m))
    };
    let storage = StorageFile::open(&a.nvme).map_err(|e| format!("{}: {e}", a.nvme.display()))?;
    let dst_far = alloc(far.index, size)?;
    let dst_host: Box<dyn DeviceMemory> =
        Box::new(HostMemory::new(size).map_err(|e| e.to_string())?);
    let st_near = alloc(near.index, staging)?;
    let st_far = alloc(far.index, staging)?;
    let n = a.nvme.display();
    let (i, j) = (near.index, far.index);
    Ok((
        Places {
            storage,
            dst: vec![dst_far, dst_host],
            staging: vec![st_near, st_far],
            names: vec![
                format!("{n} -> host -> accelerator {j} (the planner's route)"),
                format!("{n} -> accelerator {i} (staging, P2P) -> host -> accelerator {j}"),
                format!(
                    "{n} -> accelerator {i} (staging, P2P) -> host -> accelerator {j} (staging) -> host-memory device"
                ),
            ],
        },
        Some(module),
    ))
}

/// The route of `k` hops over `p`.
fn route<'a>(engine: &Engine, p: &'a Places, k: usize, accel: bool) -> Res<Route<'a>> {
    let src = End::Storage {
        file: &p.storage,
        offset: 0,
    };
    let dst = |i: usize| End::Memory {
        mem: p.dst[i].as_ref(),
        offset: 0,
    };
    let stage = |i: usize| Via::Memory(MemRange::whole(p.staging[i].as_ref()));
    let r = match (accel, k) {
        (false, k) => engine
            .routes()
            .plan_through(src, &vec![Via::Host; k - 1], dst(0)),
        (true, 2) => engine.routes().plan(src, dst(0)),
        (true, 3) => engine
            .routes()
            .plan_through(src, &[stage(0), Via::Host], dst(0)),
        (true, _) => engine
            .routes()
            .plan_through(src, &[stage(0), Via::Host, stage(1)], dst(1)),
    }
    .map_err(|e| format!("k = {k}: {e}"))?;
    if r.len() != k {
        return Err(format!(
            "k = {k}: the route has {} hops: {:?}",
            r.len(),
            r.hops()
        ));
    }
    Ok(r)
}

/// `bench route`.
pub(super) fn bench(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let size = usize::try_from(a.size).map_err(|_| "--size too large".to_string())?;
    if size < 64 * 4096 {
        return Err("--size: at least 256 KiB (64 chunks of 4 KiB)".into());
    }
    let (p, module) = places(a, size)?;
    let engine = Engine::new(Config::default(), module);
    // The source's bytes, for checking every run.
    let mut want = vec![0u8; size];
    {
        let host = HostMemory::new(size).map_err(|e| e.to_string())?;
        MemRange::new(&host, 0, size)
            .and_then(|range| engine.read(&p.storage, 0, range))
            .map_err(|e| format!("reading the source for the check: {e}"))?;
        host.read_at(0, &mut want).map_err(|e| e.to_string())?;
    }
    let mut rows = Vec::new();
    println!(
        "bench route: {} MiB per copy, {} reps interleaved, medians; the ideal is sum(T)/n + (n-1)/n*max(T) from each hop's time T in the n = 1 run",
        size >> 20,
        a.reps
    );
    for k in 2..=4 {
        let r = route(&engine, &p, k, a.accel)?;
        let dst = if a.accel && k == 4 {
            &p.dst[1]
        } else {
            &p.dst[0]
        };
        println!("\nk = {k}: {}", p.names[k - 2]);
        for h in r.hops() {
            println!("  hop: {h}");
        }
        println!("  why: {}", r.reason());
        // times[n index] = (elapsed per rep, busy per hop per rep).
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); NS.len()];
        let mut busy: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); k]; NS.len()];
        for _ in 0..a.reps.max(1) {
            for (ni, &n) in NS.iter().enumerate() {
                let opts = RouteOptions {
                    chunk: Some(size.div_ceil(n).next_multiple_of(4096)),
                    slots: Some(3),
                    lanes: Some(1),
                };
                dst.write_at(0, &vec![0x5A; size])
                    .map_err(|e| e.to_string())?;
                let rep = engine
                    .routes()
                    .copy(&r, size, &opts)
                    .map_err(|e| format!("k = {k}, n = {n}: {e}"))?;
                let mut have = vec![0u8; size];
                dst.read_at(0, &mut have).map_err(|e| e.to_string())?;
                if let Some(i) = (0..size).find(|&i| have[i] != want[i]) {
                    return Err(format!(
                        "k = {k}, n = {n}: byte {i} of the destination is {:#x}, the source's is {:#x}",
                        have[i], want[i]
                    ));
                }
                times[ni].push(rep.elapsed.as_secs_f64());
                for (h, d) in rep.busy.iter().enumerate() {
                    busy[ni][h].push(d.as_secs_f64());
                }
            }
        }
        let t: Vec<f64> = times.into_iter().map(median).collect();
        let hop_t: Vec<f64> = busy[0].iter().cloned().map(median).collect();
        let sf = t[0];
        let sum: f64 = hop_t.iter().sum();
        let max = hop_t.iter().copied().fold(0.0, f64::max);
        println!(
            "  hops' whole times: {} (sum {}, slowest {}: a pipeline can gain at most {:.2}x)",
            hop_t.iter().map(|&x| ms(x)).collect::<Vec<_>>().join(", "),
            ms(sum),
            ms(max),
            sum / max
        );
        println!(
            "  {:>3} {:>10} {:>10} {:>10} {:>11} {:>9}",
            "n", "chunk", "time", "ideal", "time/ideal", "SF/time"
        );
        let mut best = 0;
        for (ni, &n) in NS.iter().enumerate() {
            let id = ideal(&hop_t, n);
            println!(
                "  {:>3} {:>7} KiB {:>10} {:>10} {:>10.2}x {:>8.2}x",
                n,
                size.div_ceil(n).next_multiple_of(4096) >> 10,
                ms(t[ni]),
                ms(id),
                t[ni] / id,
                sf / t[ni]
            );
            if t[ni] < t[best] {
                best = ni;
            }
            rows.push(json!({
                "k": k, "n": n, "bytes": size,
                "seconds": t[ni], "ideal_seconds": id,
                "store_and_forward_seconds": sf,
                "hop_seconds": hop_t,
            }));
        }
        println!(
            "  best: n = {}: {:.2}x the ideal, {:.2}x faster than store-and-forward ({:.2} GiB/s)",
            NS[best],
            t[best] / ideal(&hop_t, NS[best]),
            sf / t[best],
            size as f64 / t[best] / (1u64 << 30) as f64
        );
    }
    json_out["route"] = json!(rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ideal_is_the_sum_once_and_the_slowest_after() {
        assert!((ideal(&[1.0, 1.0, 1.0], 1) - 3.0).abs() < 1e-12);
        // Balanced: t + (k - 1) t / n.
        assert!((ideal(&[1.0, 1.0, 1.0], 4) - 1.5).abs() < 1e-12);
        // Unbalanced: the slowest hop bounds it.
        assert!((ideal(&[2.0, 1.0], 2) - 2.5).abs() < 1e-12);
    }
}
