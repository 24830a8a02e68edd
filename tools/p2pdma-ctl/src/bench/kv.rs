//! `bench kv`: a KV-cache offload workload on the object store, as an LLM
//! server's cache layer (LMCache, NIXL) drives it: fixed-size chunks of
//! attention keys and values saved and loaded by several consumer threads,
//! each into a buffer of its own in the accelerator's memory.
//!
//! The store's page cache holds a hot set of chunks; the hit-ratio knob is
//! the share of loads that ask for a hot chunk (the rest ask for a cold one,
//! which the cache does not hold), and the hit ratio the cache measured is
//! printed beside it. One load in ten is a save instead (the chunk written
//! back, as a server saves a prefill's KV; with the same bytes, so that
//! every load can be checked). For each knob setting, per chunk: p50 and
//! p99 latency, and throughput; then, side by side in the same run:
//!
//! - the same workload through a store without a cache (every load from
//!   storage by the engine's path);
//! - with `--accel` or `--cuda`, the same workload with the cache in host
//!   memory (a hit is then a copy from host memory into the accelerator);
//! - the storage limit: fio's random reads of one chunk at a time per
//!   consumer on the same file (`O_DIRECT`, io_uring), the ratio every row
//!   with no hits is measured against.
//!
//! Every eighth load is checked against the chunk's pattern (one word in
//! 64, each a mix of its index and the chunk's); throughput
//! counts the checks' time too.

use std::{
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use p2pdma::{
    memory::CudaMemory,
    store::{EngineBacking, PageCache, Store, WritePolicy},
    transfer::{Config, Engine, StorageFile},
    DeviceMemory, HostMemory, MemRange, Module, ModuleMemory,
};
use serde_json::{json, Value};

use super::{
    common::{median, BenchArgs, Res},
    fio,
};

/// Cache page size: chunks are whole pages.
const PAGE: usize = 64 << 10;
/// One operation in this many is a save.
const SAVE_EVERY: u64 = 10;
/// One load in this many is checked.
const CHECK_EVERY: u64 = 8;

/// Chunk `k`'s bytes into `buf` (a whole number of 8-byte words): word `j`
/// is a mix of `j` and `k`, cheap enough that a save costs about a copy.
fn fill(k: usize, buf: &mut [u8]) {
    let key = (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for (j, w) in buf.chunks_exact_mut(8).enumerate() {
        let v = (j as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ key;
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Whether `got` is chunk `k`, by every 64th word.
fn is_chunk(k: usize, got: &[u8]) -> Option<usize> {
    let key = (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..got.len() / 8).step_by(64).find_map(|j| {
        let v = (j as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ key;
        (got[j * 8..j * 8 + 8] != v.to_le_bytes()).then_some(j * 8)
    })
}

/// Where the consumers' buffers and the cache live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mem {
    Host,
    Accel,
    Cuda,
}

impl Mem {
    fn name(self) -> &'static str {
        match self {
            Mem::Host => "host memory",
            Mem::Accel => "accelerator memory (p2pdma module)",
            Mem::Cuda => "GPU memory (CUDA device 0)",
        }
    }

    fn alloc(self, module: Option<&Arc<Module>>, len: usize) -> Res<Arc<dyn DeviceMemory>> {
        Ok(match (self, module) {
            (Mem::Accel, Some(m)) => {
                let accels = m.accelerators().map_err(|e| e.to_string())?;
                let a = accels.first().ok_or("no accelerator bound to the module")?;
                Arc::new(
                    ModuleMemory::alloc(m.clone(), a.index, len as u64, 0)
                        .map_err(|e| e.to_string())?,
                )
            }
            (Mem::Cuda, _) => Arc::new(CudaMemory::alloc(0, len).map_err(|e| e.to_string())?),
            _ => Arc::new(HostMemory::new(len).map_err(|e| e.to_string())?),
        })
    }
}

/// One cell's results.
struct Cell {
    loads: u64,
    saves: u64,
    bytes: u64,
    secs: f64,
    p50_us: f64,
    p99_us: f64,
    /// Hits / page accesses, as the cache counted them (`None`: no cache).
    hit_ratio: Option<f64>,
}

impl Cell {
    fn gib_s(&self) -> f64 {
        self.bytes as f64 / self.secs / (1u64 << 30) as f64
    }

    fn json(&self) -> Value {
        json!({
            "loads": self.loads, "saves": self.saves, "gib_s": self.gib_s(),
            "p50_us": self.p50_us, "p99_us": self.p99_us, "hit_ratio": self.hit_ratio,
        })
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The workload for `secs` on `store`: `threads` consumers, each with a
/// chunk buffer in `mem`, `knob` of the loads asking for one of the
/// `hot` first chunks, the rest for one of the others.
#[allow(clippy::too_many_arguments)]
fn run(
    store: &Store,
    ids: &[u64],
    hot: usize,
    chunk: usize,
    knob: f64,
    threads: usize,
    secs: f64,
    mem: Mem,
    module: Option<&Arc<Module>>,
) -> Res<Cell> {
    let before = store.cache_stats();
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let results = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || -> Res<(Vec<f64>, u64)> {
                    let buf = mem.alloc(module, chunk)?;
                    let mut rng = fastrand::Rng::with_seed(7 + t as u64);
                    let mut lat = Vec::new();
                    let mut got = vec![0u8; chunk];
                    let mut saves = 0u64;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let k = if rng.f64() < knob || hot == ids.len() {
                            rng.usize(..hot)
                        } else {
                            rng.usize(hot..ids.len())
                        };
                        let range =
                            MemRange::new(buf.as_ref(), 0, chunk).map_err(|e| e.to_string())?;
                        if n.is_multiple_of(SAVE_EVERY) {
                            fill(k, &mut got);
                            buf.write_at(0, &got).map_err(|e| e.to_string())?;
                            store
                                .pwrite(ids[k], 0, range)
                                .map_err(|e| format!("save of chunk {k}: {e}"))?;
                            saves += 1;
                            continue;
                        }
                        let t0 = Instant::now();
                        store
                            .pread(ids[k], 0, range)
                            .map_err(|e| format!("load of chunk {k}: {e}"))?;
                        lat.push(t0.elapsed().as_secs_f64() * 1e6);
                        if n.is_multiple_of(CHECK_EVERY) {
                            buf.read_at(0, &mut got).map_err(|e| e.to_string())?;
                            if let Some(i) = is_chunk(k, &got) {
                                return Err(format!("chunk {k} byte {i} loaded wrong"));
                            }
                        }
                    }
                    Ok((lat, saves))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("a consumer panicked".into()))
            })
            .collect::<Vec<_>>()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    let mut saves = 0;
    for r in results {
        let (l, s) = r?;
        lat.extend(l);
        saves += s;
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let hit_ratio = match (before, store.cache_stats()) {
        (Some(b), Some(a)) => {
            let (h, m) = (a.hits - b.hits, a.misses - b.misses);
            Some(h as f64 / (h + m).max(1) as f64)
        }
        _ => None,
    };
    Ok(Cell {
        loads: lat.len() as u64,
        saves,
        bytes: (lat.len() as u64 + saves) * chunk as u64,
        secs: elapsed,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        hit_ratio,
    })
}

/// Hits against the memory's own copy: for pages of 4 KiB and 64 KiB, the
/// latency of a one-page hit into a buffer (median of many) against one
/// copy of the same bytes between two buffers of that memory
/// (`memory::copy`: the GPU's `cuMemcpyDtoDAsync` for GPU memory, a CPU
/// copy for host memory); and at 64 KiB pages, the bandwidth of a 16 MiB
/// read of cached pages against one 16 MiB copy. Every hit's bytes are
/// checked once after its timed runs.
fn hits_vs_copy(
    backing: &Arc<EngineBacking>,
    mem: Mem,
    module: Option<&Arc<Module>>,
    out: &mut Vec<Value>,
) -> Res<()> {
    const BIG: usize = 16 << 20;
    let reps = 200;
    let e = |e: p2pdma::Error| e.to_string();
    println!("  hits against the memory's own copy ({}):", mem.name());
    println!(
        "    {:34} {:>12} {:>12} {:>8}",
        "", "hit", "copy", "copy/hit"
    );
    for page in [4096usize, PAGE] {
        let frames = mem.alloc(module, 4 * page.max(PAGE))?;
        let store = Store::initialize(backing.clone())
            .map_err(e)?
            .with_cache(PageCache::new(frames, page, WritePolicy::WriteBack).map_err(e)?);
        let id = store.pcreate(BIG as u64).map_err(e)?;
        let mut bytes = vec![0u8; page];
        fill(id as usize, &mut bytes);
        let (buf, other) = (mem.alloc(module, page)?, mem.alloc(module, page)?);
        buf.write_at(0, &bytes).map_err(e)?;
        store
            .pwrite(id, 0, MemRange::whole(buf.as_ref()))
            .map_err(e)?;
        let (mut hit, mut copy) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            store
                .pread(id, 0, MemRange::whole(buf.as_ref()))
                .map_err(e)?;
            hit.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            p2pdma::memory::copy(buf.as_ref(), 0, other.as_ref(), 0, page).map_err(e)?;
            copy.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let mut got = vec![0u8; page];
        buf.read_at(0, &mut got).map_err(e)?;
        if got != bytes {
            return Err(format!("a {page}-byte hit read wrong bytes"));
        }
        let (h, c) = (median(hit), median(copy));
        println!(
            "    {:34} {h:10.1}us {c:10.1}us {:8.3}",
            format!("one {} KiB page, latency", page >> 10),
            c / h
        );
        out.push(json!({"page": page, "hit_us": h, "copy_us": c}));
        store.delete(id).map_err(e)?;
    }
    // Bandwidth: 16 MiB of cached 64 KiB pages into one buffer.
    let frames = mem.alloc(module, BIG + 4 * PAGE)?;
    let store = Store::initialize(backing.clone())
        .map_err(e)?
        .with_cache(PageCache::new(frames, PAGE, WritePolicy::WriteBack).map_err(e)?);
    let id = store.pcreate(BIG as u64).map_err(e)?;
    let mut bytes = vec![0u8; BIG];
    fill(id as usize, &mut bytes);
    let (buf, other) = (mem.alloc(module, BIG)?, mem.alloc(module, BIG)?);
    buf.write_at(0, &bytes).map_err(e)?;
    store
        .pwrite(id, 0, MemRange::whole(buf.as_ref()))
        .map_err(e)?;
    let (mut hit, mut copy) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let t = Instant::now();
        store
            .pread(id, 0, MemRange::whole(buf.as_ref()))
            .map_err(e)?;
        hit.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        p2pdma::memory::copy(buf.as_ref(), 0, other.as_ref(), 0, BIG).map_err(e)?;
        copy.push(t.elapsed().as_secs_f64());
    }
    let mut got = vec![0u8; BIG];
    buf.read_at(0, &mut got).map_err(e)?;
    if got != bytes {
        return Err("a 16 MiB read of cached pages read wrong bytes".into());
    }
    let gib = |s: f64| BIG as f64 / s / (1u64 << 30) as f64;
    let (h, c) = (gib(median(hit)), gib(median(copy)));
    println!(
        "    {:34} {h:8.2}GiB/s {c:8.2}GiB/s {:8.3}",
        "16 MiB of 64 KiB pages, bandwidth",
        h / c
    );
    println!("    (the last column: hit bandwidth / copy bandwidth; latency: copy / hit)");
    out.push(json!({"bytes": BIG, "hit_gib_s": h, "copy_gib_s": c}));
    store.delete(id).map_err(e)?;
    store.flush().map_err(e)?;
    Ok(())
}

/// fio's random reads of `chunk` bytes, `threads` jobs one read each in
/// flight, for `secs` on the first `size` bytes of `path`: GiB/s.
fn fio_random(path: &Path, size: u64, chunk: usize, threads: usize, secs: f64) -> Res<f64> {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=kv",
        "--rw=randread",
        "--direct=1",
        "--ioengine=io_uring",
        "--iodepth=1",
        "--group_reporting",
        "--time_based",
        "--output-format=json",
    ])
    .arg(format!("--filename={}", path.display()))
    .arg(format!("--size={size}"))
    .arg(format!("--bs={chunk}"))
    .arg(format!("--numjobs={threads}"))
    .arg(format!("--runtime={}ms", (secs * 1000.0) as u64));
    fio::bandwidth(&fio::run(&mut cmd)?)
}

pub(super) fn bench(a: &BenchArgs, out: &mut Value) -> Res<()> {
    let path = a
        .file
        .clone()
        .ok_or("bench kv needs --file (the store's file or device, created)")?;
    let chunk = a.bs as usize;
    if chunk == 0 || !chunk.is_multiple_of(PAGE) {
        return Err(format!(
            "--bs {chunk}: a chunk is a whole number of 64 KiB pages"
        ));
    }
    let n = (a.size as usize / chunk).max(8);
    let hot = (n / 4).max(1);
    let threads = a.threads.max(1);
    let mem = match (a.accel, a.cuda) {
        (true, true) => return Err("--accel or --cuda, not both".into()),
        (true, false) => Mem::Accel,
        (false, true) => Mem::Cuda,
        (false, false) => Mem::Host,
    };
    let module = match mem {
        Mem::Accel => Some(Arc::new(Module::open().map_err(|e| e.to_string())?)),
        _ => None,
    };
    let data = n * chunk;
    std::fs::File::create(&path)
        .and_then(|f| f.set_len((data + data / 8 + (48 << 20)) as u64))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let engine = Arc::new(Engine::new(Config::default(), module.clone()));
    let file = Arc::new(StorageFile::open_rw(&path).map_err(|e| e.to_string())?);
    let backing = Arc::new(EngineBacking::new(engine, file));
    let ids = {
        let store = Store::format(backing.clone(), n as u64 + 16).map_err(|e| e.to_string())?;
        let host = HostMemory::new(chunk).map_err(|e| e.to_string())?;
        let mut ids = Vec::with_capacity(n);
        let mut bytes = vec![0u8; chunk];
        for k in 0..n {
            let id = store.pcreate(chunk as u64).map_err(|e| e.to_string())?;
            fill(k, &mut bytes);
            host.write_at(0, &bytes).map_err(|e| e.to_string())?;
            store
                .pwrite(id, 0, MemRange::whole(&host))
                .map_err(|e| e.to_string())?;
            ids.push(id);
        }
        store.flush().map_err(|e| e.to_string())?;
        ids
    };
    let secs = a.secs;
    println!(
        "kv: {n} chunks of {} KiB ({} MiB), {threads} consumers, buffers in {}, {secs} s per cell; a cache of {} chunks (the hot set plus an eighth) in 64 KiB pages; one operation in {SAVE_EVERY} a save",
        chunk >> 10,
        data >> 20,
        mem.name(),
        hot + (hot / 8).max(1)
    );
    let mut hits = Vec::new();
    hits_vs_copy(&backing, mem, module.as_ref(), &mut hits)?;
    let cache_mems: Vec<Mem> = match mem {
        Mem::Host => vec![Mem::Host],
        m => vec![m, Mem::Host],
    };
    let frames = (hot + (hot / 8).max(1)) * chunk;
    let limit = if fio::have_fio() {
        Some(fio_random(&path, data as u64, chunk, threads, secs)?)
    } else {
        None
    };
    let knobs = [0.0, 0.5, 0.9, 1.0];
    let mut rows = Vec::new();
    // Without a cache: every load from storage.
    let plain = Store::initialize(backing.clone()).map_err(|e| e.to_string())?;
    let none = run(
        &plain,
        &ids,
        hot,
        chunk,
        0.0,
        threads,
        secs,
        mem,
        module.as_ref(),
    )?;
    drop(plain);
    rows.push(("no cache".to_string(), None, none));
    for &cm in &cache_mems {
        for &knob in &knobs {
            let frames_mem = cm.alloc(module.as_ref(), frames)?;
            let cache = PageCache::new(frames_mem, PAGE, WritePolicy::WriteBack)
                .map_err(|e| e.to_string())?;
            let store = Store::initialize(backing.clone())
                .map_err(|e| e.to_string())?
                .with_cache(cache);
            // Warm the hot set, then measure.
            let warm = mem.alloc(module.as_ref(), chunk)?;
            for &id in &ids[..hot] {
                store
                    .pread(id, 0, MemRange::whole(warm.as_ref()))
                    .map_err(|e| e.to_string())?;
            }
            let cell = run(
                &store,
                &ids,
                hot,
                chunk,
                knob,
                threads,
                secs,
                mem,
                module.as_ref(),
            )?;
            store.flush().map_err(|e| e.to_string())?;
            rows.push((format!("cache in {}", cm.name()), Some(knob), cell));
        }
    }
    if let Some(l) = limit {
        println!("  the storage limit: fio, random reads of one chunk, {threads} jobs at depth 1: {l:.3} GiB/s");
    }
    println!(
        "  {:42} {:>5} {:>6} {:>9} {:>10} {:>10} {:>8}",
        "", "knob", "hits", "GiB/s", "p50 us", "p99 us", "/ fio"
    );
    let mut js = Vec::new();
    for (name, knob, c) in &rows {
        let vs = limit.map(|l| c.gib_s() / l);
        println!(
            "  {name:42} {:>5} {:>6} {:9.3} {:10.1} {:10.1} {:>8}",
            knob.map_or("-".into(), |k| format!("{:.0}%", k * 100.0)),
            c.hit_ratio
                .map_or("-".into(), |h| format!("{:.0}%", h * 100.0)),
            c.gib_s(),
            c.p50_us,
            c.p99_us,
            vs.map_or("-".into(), |v| format!("{v:.3}")),
        );
        let mut j = c.json();
        j["contender"] = json!(name);
        j["knob"] = json!(knob);
        j["vs_fio"] = json!(vs);
        js.push(j);
    }
    println!("  every eighth load's bytes were checked against the chunk's pattern");
    out["kv"] = json!({
        "chunk": chunk, "chunks": n, "hot": hot, "consumers": threads,
        "memory": mem.name(), "fio_gib_s": limit, "rows": js, "hits_vs_copy": hits,
    });
    Ok(())
}
