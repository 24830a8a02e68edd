//! `bench store`: the object store's page cache and prefetch, measured side
//! by side in one run.
//!
//! - Random reads of 4 KiB and 64 KiB with Zipf(0.99) keys over a data set
//!   four times the cache: the hit ratio, and throughput with the cache
//!   against without it, in alternating rounds on the same key sequence.
//! - A sequential scan with a compute step per block about as long as the
//!   block's read: `pread_prefetch` of the next block while this one is
//!   computed, against `pread` then compute; the share of the I/O time the
//!   prefetch hides.
//! - Two accelerators against one: two threads, each with its buffer in
//!   its own accelerator's memory, reading 4 KiB Zipf keys; through one
//!   accelerator's cache, against a cache shared by the two (each the same
//!   size), where a miss on one is filled from the other's copy when it
//!   has the page.
//!
//! Every read's bytes are checked against the pattern the objects were
//! filled with.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use p2pdma::{
    store::{EngineBacking, PageCache, Store, WritePolicy},
    transfer::{Config, Engine, StorageFile},
    DeviceMemory, HostMemory, MemRange, Module, ModuleMemory,
};
use serde_json::{json, Value};

use super::common::{median, BenchArgs, Res};

/// Bytes of each object of the data set.
const OBJECT: usize = 1 << 20;
/// The Zipf exponent.
const THETA: f64 = 0.99;

/// The byte at `at` of object `k` of the data set.
fn byte(k: usize, at: usize) -> u8 {
    ((at as u64).wrapping_mul(0x9E37_79B9) ^ (k as u64 * 0x5851_F42D)) as u8 ^ (at >> 12) as u8
}

/// Keys drawn by Zipf(`THETA`) over `n` keys, hottest first in a shuffled
/// order so that hot keys spread over the data set.
struct Zipf {
    cdf: Vec<f64>,
    order: Vec<usize>,
}

impl Zipf {
    fn new(n: usize, rng: &mut fastrand::Rng) -> Self {
        let mut acc = 0.0;
        let cdf = (0..n)
            .map(|k| {
                acc += 1.0 / ((k + 1) as f64).powf(THETA);
                acc
            })
            .collect::<Vec<_>>();
        let total = acc;
        let mut order: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut order);
        Self {
            cdf: cdf.into_iter().map(|c| c / total).collect(),
            order,
        }
    }

    fn draw(&self, rng: &mut fastrand::Rng) -> usize {
        let u = rng.f64();
        let i = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1);
        self.order[i]
    }
}

/// Memory of `len` bytes: accelerator 0's with `accel`, host memory else.
fn memory(module: Option<&Arc<Module>>, len: usize) -> Res<Arc<dyn DeviceMemory>> {
    memory_on(module, 0, len)
}

/// Memory of `len` bytes: the `i`-th bound accelerator's with `accel`,
/// host memory else.
fn memory_on(module: Option<&Arc<Module>>, i: usize, len: usize) -> Res<Arc<dyn DeviceMemory>> {
    Ok(match module {
        Some(m) => {
            let accels = m.accelerators().map_err(|e| e.to_string())?;
            let a = accels
                .get(i)
                .ok_or_else(|| format!("accelerator {i}: {} bound", accels.len()))?;
            Arc::new(
                ModuleMemory::alloc(m.clone(), a.index, len as u64, 0)
                    .map_err(|e| e.to_string())?,
            )
        }
        None => Arc::new(HostMemory::new(len).map_err(|e| e.to_string())?),
    })
}

/// Reads of `io` bytes at the Zipf keys `keys` (each a page of the data
/// set), every one checked; their time.
fn random_reads(
    store: &Store,
    ids: &[u64],
    keys: &[usize],
    io: usize,
    buf: &dyn DeviceMemory,
) -> Res<Duration> {
    random_reads_on(store, None, ids, keys, io, buf)
}

/// [`random_reads`] through accelerator `on`'s copies of the cache (the
/// buffer's accelerator when `None`).
fn random_reads_on(
    store: &Store,
    on: Option<usize>,
    ids: &[u64],
    keys: &[usize],
    io: usize,
    buf: &dyn DeviceMemory,
) -> Res<Duration> {
    let per_obj = OBJECT / io;
    let mut got = vec![0u8; io];
    let t = Instant::now();
    for &k in keys {
        let (obj, at) = (k / per_obj, (k % per_obj) * io);
        MemRange::new(buf, 0, io)
            .and_then(|range| match on {
                Some(a) => store.pread_on(a, ids[obj], at as u64, range),
                None => store.pread(ids[obj], at as u64, range),
            })
            .map_err(|e| e.to_string())?;
        buf.read_at(0, &mut got).map_err(|e| e.to_string())?;
        if let Some(i) = (0..io).step_by(61).find(|&i| got[i] != byte(obj, at + i)) {
            return Err(format!("object {obj} byte {} read wrong", at + i));
        }
    }
    Ok(t.elapsed())
}

/// Busy for `d`: the compute step.
fn compute(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

pub(super) fn bench(a: &BenchArgs, out: &mut Value) -> Res<()> {
    let path = a
        .file
        .clone()
        .ok_or("bench store needs --file (its device, created)")?;
    let data = (a.size as usize / OBJECT).max(8) * OBJECT;
    let module = if a.accel {
        Some(Arc::new(Module::open().map_err(|e| e.to_string())?))
    } else {
        None
    };
    std::fs::File::create(&path)
        .and_then(|f| f.set_len((data + data / 4 + (8 << 20)) as u64))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let engine = Arc::new(Engine::new(Config::default(), module.clone()));
    let file = Arc::new(StorageFile::open_rw(&path).map_err(|e| e.to_string())?);
    let backing = Arc::new(EngineBacking::new(engine, file));
    let store =
        Store::format(backing.clone(), (data / OBJECT) as u64 + 16).map_err(|e| e.to_string())?;
    let fill = HostMemory::new(OBJECT).map_err(|e| e.to_string())?;
    let filled = MemRange::whole(&fill);
    let mut ids = Vec::new();
    for k in 0..data / OBJECT {
        let id = store.pcreate(OBJECT as u64).map_err(|e| e.to_string())?;
        let bytes: Vec<u8> = (0..OBJECT).map(|i| byte(k, i)).collect();
        fill.write_at(0, &bytes).map_err(|e| e.to_string())?;
        store.pwrite(id, 0, filled).map_err(|e| e.to_string())?;
        ids.push(id);
    }
    store.flush().map_err(|e| e.to_string())?;
    drop(store);
    let where_ = if a.accel {
        "accelerator memory"
    } else {
        "host memory"
    };
    println!(
        "store: {} MiB in {} objects of 1 MiB, cache of a quarter of it in {where_}",
        data >> 20,
        ids.len()
    );

    let mut rng = fastrand::Rng::with_seed(1);
    let mut cells = Vec::new();
    for io in [4096usize, 64 << 10] {
        let zipf = Zipf::new(data / io, &mut rng);
        let n = if io == 4096 { 20_000 } else { 4_000 };
        let warm: Vec<usize> = (0..n).map(|_| zipf.draw(&mut rng)).collect();
        let keys: Vec<usize> = (0..n).map(|_| zipf.draw(&mut rng)).collect();
        let buf = memory(module.as_ref(), io)?;
        let (mut with, mut without, mut hits) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.reps.max(1) {
            let plain = Store::initialize(backing.clone()).map_err(|e| e.to_string())?;
            without.push(random_reads(&plain, &ids, &keys, io, buf.as_ref())?.as_secs_f64());
            drop(plain);
            let cache = PageCache::new(
                memory(module.as_ref(), data / 4)?,
                io,
                WritePolicy::WriteBack,
            )
            .map_err(|e| e.to_string())?;
            let cached = Store::initialize(backing.clone())
                .map_err(|e| e.to_string())?
                .with_cache(cache);
            random_reads(&cached, &ids, &warm, io, buf.as_ref())?;
            let before = cached.cache_stats().unwrap_or_default();
            with.push(random_reads(&cached, &ids, &keys, io, buf.as_ref())?.as_secs_f64());
            let after = cached.cache_stats().unwrap_or_default();
            let (h, m) = (after.hits - before.hits, after.misses - before.misses);
            hits.push(h as f64 / (h + m).max(1) as f64);
        }
        let (tw, to, hit) = (median(with), median(without), median(hits));
        println!(
            "store zipf {:>5} KiB reads: hit ratio {:.2}, {:.0} reads/s cached vs {:.0} uncached: {:.2}x",
            io >> 10,
            hit,
            n as f64 / tw,
            n as f64 / to,
            to / tw
        );
        cells.push(json!({"io": io, "reads": n, "hit_ratio": hit, "cached_s": tw, "uncached_s": to, "speedup": to / tw}));
    }

    // Prefetch against plain reads on a sequential scan.
    let store = Store::initialize(backing.clone()).map_err(|e| e.to_string())?;
    let bufs = [
        memory(module.as_ref(), OBJECT)?,
        memory(module.as_ref(), OBJECT)?,
    ];
    let range = |i: usize| MemRange::new(bufs[i].as_ref(), 0, OBJECT).map_err(|e| e.to_string());
    let ranges = [range(0)?, range(1)?];
    let scan = ids.len().min(64);
    let t = Instant::now();
    for id in &ids[..scan] {
        store.pread(*id, 0, ranges[0]).map_err(|e| e.to_string())?;
    }
    let io_per_block = t.elapsed() / scan as u32;
    let step = io_per_block;
    let (mut plain, mut pre, mut into) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..a.reps.max(1) {
        let t = Instant::now();
        for id in &ids[..scan] {
            store.pread(*id, 0, ranges[0]).map_err(|e| e.to_string())?;
            compute(step);
        }
        plain.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut next = Some(
            store
                .pread_prefetch(ids[0], 0, OBJECT)
                .map_err(|e| e.to_string())?,
        );
        for k in 0..scan {
            let this = next.take().ok_or("no prefetch")?;
            if k + 1 < scan {
                next = Some(
                    store
                        .pread_prefetch(ids[k + 1], 0, OBJECT)
                        .map_err(|e| e.to_string())?,
                );
            }
            store
                .consume_prefetch_pread(this, ranges[k % 2])
                .map_err(|e| e.to_string())?;
            compute(step);
        }
        pre.push(t.elapsed().as_secs_f64());
        // Into the buffer the block is consumed from: nothing copied.
        let t = Instant::now();
        let start = |k: usize| {
            store
                .pread_prefetch_into(ids[k], 0, OBJECT, bufs[k % 2].clone(), 0)
                .map_err(|e| e.to_string())
        };
        let mut next = Some(start(0)?);
        for k in 0..scan {
            let this = next.take().ok_or("no prefetch")?;
            if k + 1 < scan {
                next = Some(start(k + 1)?);
            }
            store
                .consume_prefetch_pread(this, ranges[k % 2])
                .map_err(|e| e.to_string())?;
            compute(step);
        }
        into.push(t.elapsed().as_secs_f64());
    }
    let mut check = vec![0u8; OBJECT];
    bufs[(scan - 1) % 2]
        .read_at(0, &mut check)
        .map_err(|e| e.to_string())?;
    if (0..OBJECT)
        .step_by(97)
        .any(|i| check[i] != byte(scan - 1, i))
    {
        return Err("the prefetched scan's last block read wrong".into());
    }
    let (tp, tq, ti) = (median(plain), median(pre), median(into));
    let io_total = io_per_block.as_secs_f64() * scan as f64;
    let hidden = ((tp - tq) / io_total).clamp(0.0, 1.0);
    let hidden_into = ((tp - ti) / io_total).clamp(0.0, 1.0);
    println!(
        "store scan of {scan} MiB, compute {:.2} ms per block: plain {:.3} s, prefetch {:.3} s ({:.0}% of the I/O time hidden), prefetch into the buffer {:.3} s ({:.0}% hidden)",
        step.as_secs_f64() * 1e3,
        tp,
        tq,
        hidden * 100.0,
        ti,
        hidden_into * 100.0
    );
    let two = two_against_one(a, module.as_ref(), &backing, &ids, data)?;
    out["store"] = json!({
        "data_bytes": data,
        "memory": where_,
        "zipf": cells,
        "two_accelerators": two,
        "scan": {"blocks": scan, "compute_s": step.as_secs_f64(), "plain_s": tp, "prefetch_s": tq, "io_hidden": hidden, "prefetch_into_s": ti, "io_hidden_into": hidden_into},
    });
    Ok(())
}

/// Two threads on two accelerators reading 4 KiB Zipf keys: through one
/// accelerator's cache, against a cache shared by both, in alternating
/// rounds; the hit ratios, the share of misses filled from the other
/// accelerator, and the throughput ratio.
fn two_against_one(
    a: &BenchArgs,
    module: Option<&Arc<Module>>,
    backing: &Arc<EngineBacking>,
    ids: &[u64],
    data: usize,
) -> Res<Value> {
    let io = 4096;
    let n = 10_000;
    let mut rng = fastrand::Rng::with_seed(2);
    let zipf = Zipf::new(data / io, &mut rng);
    let draws =
        |rng: &mut fastrand::Rng| -> Vec<usize> { (0..n).map(|_| zipf.draw(rng)).collect() };
    let warm: [Vec<usize>; 2] = [draws(&mut rng), draws(&mut rng)];
    let keys: [Vec<usize>; 2] = [draws(&mut rng), draws(&mut rng)];
    let bufs = [memory_on(module, 0, io)?, memory_on(module, 1, io)?];
    // Runs both threads over `keys` (thread t on accelerator `on(t)`); the
    // slower one's time.
    let run = |store: &Store, keys: &[Vec<usize>; 2], on: &dyn Fn(usize) -> usize| -> Res<f64> {
        let times: Vec<Res<Duration>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let (keys, buf) = (&keys[t], &bufs[t]);
                    let a = on(t);
                    s.spawn(move || random_reads_on(store, Some(a), ids, keys, io, buf.as_ref()))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a reader panicked".into())))
                .collect()
        });
        let mut worst: f64 = 0.0;
        for t in times {
            worst = worst.max(t?.as_secs_f64());
        }
        Ok(worst)
    };
    let (mut one_t, mut two_t, mut one_hit, mut two_hit, mut remote) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..a.reps.max(1) {
        for shared in [false, true] {
            let mems = if shared {
                vec![
                    memory_on(module, 0, data / 4)?,
                    memory_on(module, 1, data / 4)?,
                ]
            } else {
                vec![memory_on(module, 0, data / 4)?]
            };
            let cache =
                PageCache::shared(mems, io, WritePolicy::WriteBack).map_err(|e| e.to_string())?;
            let store = Store::initialize(backing.clone())
                .map_err(|e| e.to_string())?
                .with_cache(cache);
            let on = |t: usize| if shared { t } else { 0 };
            run(&store, &warm, &on)?;
            let before = store.cache_stats().unwrap_or_default();
            let secs = run(&store, &keys, &on)?;
            let after = store.cache_stats().unwrap_or_default();
            let (h, m) = (after.hits - before.hits, after.misses - before.misses);
            let hit = h as f64 / (h + m).max(1) as f64;
            if shared {
                two_t.push(secs);
                two_hit.push(hit);
                remote.push((after.remote - before.remote) as f64 / m.max(1) as f64);
            } else {
                one_t.push(secs);
                one_hit.push(hit);
            }
        }
    }
    let (t1, t2) = (median(one_t), median(two_t));
    let (h1, h2, r) = (median(one_hit), median(two_hit), median(remote));
    println!(
        "store two accelerators vs one, 2 readers of {n} 4 KiB Zipf reads each: hit ratio {h2:.2} (of the misses {:.0}% from the other accelerator) vs {h1:.2}; {:.0} reads/s vs {:.0}: {:.2}x",
        r * 100.0,
        2.0 * n as f64 / t2,
        2.0 * n as f64 / t1,
        t1 / t2
    );
    Ok(
        json!({"readers": 2, "reads": n, "one_s": t1, "two_s": t2, "one_hit_ratio": h1, "two_hit_ratio": h2, "remote_share": r, "speedup": t1 / t2}),
    )
}
