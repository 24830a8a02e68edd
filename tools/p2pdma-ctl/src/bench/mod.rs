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
//!   emulated devices' DMA runs outside the guest);
//! - `route`: routes of 2, 3 and 4 hops, store-and-forward and pipelined,
//!   against the ideal pipeline;
//! - `queues`: one NVMe namespace read several ways into accelerator
//!   memory (`O_DIRECT` P2P, passthrough, the queues path), IOPS and CPU
//!   time per I/O;
//! - `store`: the object store's page cache (Zipf reads, hit ratio, with
//!   against without) and prefetch against plain reads on a scan;
//! - `kv`: a KV-cache offload workload on the store (chunks saved and
//!   loaded by several consumers, a hit-ratio knob), the cache in the
//!   accelerator's memory against host memory and no cache, against fio's
//!   random reads on the same file;
//! - `arrays`: a lone member and md RAID0 arrays read by P2P into
//!   accelerator memory against fio's best on the same device;
//! - `volume`: the library's striped volume on the queues path against
//!   its members read in parallel by fio, 1, 2 and 4 members.
//!
//! This module is the dispatcher; each bench has its own file, the fio
//! driver is in `fio`, and what they share (the arguments, medians, the
//! CPU clocks) is in `common`, which imports no bench.

mod arrays;
mod common;
mod copy;
mod cpu;
mod fio;
mod kv;
mod queues;
mod route;
mod small;
mod storage;
mod store;
mod strided;

use serde_json::{json, Value};

pub use self::common::BenchArgs;
use self::common::Res;

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
        "copy_routine": format!("{:?}", p2pdma::sys::wc::CopyIsa::detect()),
    })
}

/// Runs the benchmarks; prints text, or JSON with `json`.
pub fn run(a: &BenchArgs, json: bool) -> Res<()> {
    let mut out = json!({ "machine": machine() });
    println!("machine: {}", out["machine"]);
    match a.what.as_str() {
        "storage" => storage::storage(a, &mut out)?,
        "copy" => copy::copy(&mut out)?,
        "cpu" => cpu::cpu(a, &mut out)?,
        "small" => small::small(a, &mut out)?,
        "strided" => strided::strided(a, &mut out)?,
        "route" => route::bench(a, &mut out)?,
        "queues" => queues::bench(a, &mut out)?,
        "store" => store::bench(a, &mut out)?,
        "kv" => kv::bench(a, &mut out)?,
        "arrays" => arrays::arrays(a, &mut out)?,
        "volume" => arrays::volume(a, &mut out)?,
        "all" => {
            storage::storage(a, &mut out)?;
            copy::copy(&mut out)?;
            small::small(a, &mut out)?;
        }
        other => {
            return Err(format!(
            "unknown benchmark '{other}' (storage, copy, small, strided, route, cpu, queues, store, kv, arrays, volume, all)"
        ))
        }
    }
    if json {
        println!("{out}");
    }
    Ok(())
}
