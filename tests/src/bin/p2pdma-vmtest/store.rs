//! The object store in the guest: a store on a file of the NVMe-backed
//! filesystem (or a block device), its buffers and its page cache in
//! accelerator memory from the module (on one accelerator or shared by
//! several), driven by a seeded random sequence of operations checked
//! against a model; then reopened and checked whole. And the shared
//! cache's coherence under many threads on the rig's two accelerators.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, RwLock,
    },
};

use clap::Args;
use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    queues::Namespace,
    store::{EngineBacking, PageCache, Store, WritePolicy},
    transfer::{Config, Engine, PathPref, StorageFile},
    Error, MemRange, Module,
};

#[derive(Args)]
pub struct StoreArgs {
    /// The store's device: a file (created at `--size`) or a block device;
    /// with `--queues`, only its name in messages.
    #[arg(long)]
    path: String,
    /// Bytes of the store when `path` is a file it creates (or of its
    /// region with `--queues`).
    #[arg(long, default_value_t = 64 << 20)]
    size: u64,
    /// The store on a region of namespace `--nsid` of the controller of
    /// this serial, driven by this process (the queues path), from byte
    /// `--offset` on; what the region held is put back at the end.
    #[arg(long)]
    queues: Option<String>,
    /// See `--queues`.
    #[arg(long, default_value_t = 7)]
    nsid: u32,
    /// See `--queues`.
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// The engine's path preference.
    #[arg(long, default_value = "auto")]
    engine_path: PathPref,
    /// Cache frames (0: no cache).
    #[arg(long, default_value_t = 8)]
    frames: usize,
    /// The cache's page size.
    #[arg(long, default_value_t = 4096)]
    page: usize,
    /// Write through instead of back.
    #[arg(long)]
    write_through: bool,
    /// Operations to run.
    #[arg(long, default_value_t = 300)]
    ops: usize,
    /// The sequence's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Accelerators the cache spans (`--frames` on each); the operations
    /// run on each in turn, with buffers in its memory.
    #[arg(long, default_value_t = 1)]
    accelerators: usize,
}

/// Module memory of `len` bytes on the `i`-th accelerator bound.
pub fn accel_memory_on(module: &Arc<Module>, i: usize, len: usize) -> Result<ModuleMemory, String> {
    let accel = module.accelerators().map_err(|e| e.to_string())?;
    let a = accel.get(i).ok_or_else(|| {
        format!(
            "{} accelerators bound to the module, not {}",
            accel.len(),
            i + 1
        )
    })?;
    ModuleMemory::alloc(module.clone(), a.index, len as u64, 0).map_err(|e| e.to_string())
}

/// The store's device: the file at `x.path`, or a namespace of the
/// controller this process drives.
fn device(x: &StoreArgs, module: &Arc<Module>) -> Result<Arc<StorageFile>, String> {
    Ok(Arc::new(match &x.queues {
        Some(serial) => {
            let ctrl = crate::queues::take_controller(serial, module, true)?;
            let ns = Namespace::new(ctrl, module.clone(), x.nsid).map_err(|e| e.to_string())?;
            StorageFile::namespace(Arc::new(ns))
        }
        None => StorageFile::open_rw(&x.path).map_err(|e| e.to_string())?,
    }))
}

fn open(
    x: &StoreArgs,
    engine: &Arc<Engine>,
    file: &Arc<StorageFile>,
    module: &Arc<Module>,
    format: bool,
) -> Result<Store, String> {
    let backing = Arc::new(if x.queues.is_some() {
        EngineBacking::region(engine.clone(), file.clone(), x.offset, x.size)
            .map_err(|e| e.to_string())?
    } else {
        EngineBacking::new(engine.clone(), file.clone())
    });
    let store = if format {
        Store::format(backing, 512)
    } else {
        Store::initialize(backing)
    }
    .map_err(|e| e.to_string())?;
    if x.frames == 0 {
        return Ok(store);
    }
    let mems = (0..x.accelerators.max(1))
        .map(|i| {
            accel_memory_on(module, i, x.frames * x.page)
                .map(|m| Arc::new(m) as Arc<dyn DeviceMemory>)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let policy = if x.write_through {
        WritePolicy::WriteThrough
    } else {
        WritePolicy::WriteBack
    };
    let cache = PageCache::shared(mems, x.page, policy).map_err(|e| e.to_string())?;
    Ok(store.with_cache(cache))
}

/// The bytes `seed` writes: different for every write.
fn fill(seed: u64, n: usize) -> Vec<u8> {
    let mut r = fastrand::Rng::with_seed(seed);
    (0..n).map(|_| r.u8(..)).collect()
}

fn check_whole(
    store: &Store,
    model: &BTreeMap<u64, Vec<u8>>,
    buf: &ModuleMemory,
) -> Result<(), String> {
    let map: Vec<(u64, u64)> = store
        .get_object_map()
        .iter()
        .map(|o| (o.id, o.size))
        .collect();
    let want: Vec<(u64, u64)> = model.iter().map(|(id, d)| (*id, d.len() as u64)).collect();
    if map != want {
        return Err(format!("object map {map:?}, model {want:?}"));
    }
    for (id, d) in model {
        MemRange::new(buf, 0, d.len())
            .and_then(|range| store.pread(*id, 0, range))
            .map_err(|e| e.to_string())?;
        let mut got = vec![0u8; d.len()];
        buf.read_at(0, &mut got).map_err(|e| e.to_string())?;
        if let Some(i) = (0..d.len()).find(|&i| got[i] != d[i]) {
            return Err(format!(
                "object {id} byte {i} is {:#x}, model {:#x}",
                got[i], d[i]
            ));
        }
    }
    Ok(())
}

/// The module, and an engine with `path` preferred.
pub fn module_and_engine(path: PathPref) -> Result<(Arc<Module>, Arc<Engine>), String> {
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let engine = Arc::new(Engine::new(
        Config {
            path,
            ..Config::default()
        },
        Some(module.clone()),
    ));
    Ok((module, engine))
}

/// Creates the file at `path` with `size` bytes unless something is there.
pub fn create(path: &str, size: u64) -> Result<(), String> {
    if std::path::Path::new(path).exists() {
        return Ok(());
    }
    std::fs::File::create(path)
        .and_then(|f| f.set_len(size))
        .map_err(|e| format!("create {path}: {e}"))
}

pub fn run(x: &StoreArgs) -> Result<(), String> {
    if x.queues.is_none() {
        create(&x.path, x.size)?;
    }
    let (module, engine) = module_and_engine(x.engine_path)?;
    let file = device(x, &module)?;
    // On a namespace, what the region held, to put back.
    let saved = match x.queues {
        Some(_) => {
            let m = HostMemory::new(x.size as usize).map_err(|e| e.to_string())?;
            MemRange::new(&m, 0, x.size as usize)
                .and_then(|range| engine.read(&file, x.offset, range))
                .map_err(|e| e.to_string())?;
            Some(m)
        }
        None => None,
    };
    let store = open(x, &engine, &file, &module, true)?;
    let max = 128 << 10;
    // A buffer in each accelerator's memory: a call through one runs on
    // that accelerator's copies.
    let bufs = (0..x.accelerators.max(1))
        .map(|i| accel_memory_on(&module, i, max))
        .collect::<Result<Vec<_>, String>>()?;
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut rng = fastrand::Rng::with_seed(x.seed);
    let mut counts = [0usize; 6];
    let mut commands = 0;
    for i in 0..x.ops {
        let pick = |m: &BTreeMap<u64, Vec<u8>>, r: &mut fastrand::Rng| -> Option<u64> {
            (!m.is_empty()).then(|| *m.keys().nth(r.usize(..m.len())).unwrap())
        };
        let what = rng.u8(0..10);
        let buf = &bufs[i % bufs.len()];
        let r: Result<(), String> = match (what, pick(&model, &mut rng)) {
            (0..=1, _) | (_, None) => {
                let n = rng.usize(1..max);
                let id = store.pcreate(n as u64).map_err(|e| e.to_string())?;
                model.insert(id, vec![0; n]);
                counts[0] += 1;
                Ok(())
            }
            (2..=4, Some(id)) => {
                let size = model[&id].len();
                let off = rng.usize(0..size);
                let n = rng.usize(1..=size - off);
                let bytes = fill(x.seed * 1_000_003 + i as u64, n);
                buf.write_at(0, &bytes).map_err(|e| e.to_string())?;
                MemRange::new(buf, 0, n)
                    .and_then(|range| store.pwrite(id, off as u64, range))
                    .map_err(|e| e.to_string())?;
                model.get_mut(&id).unwrap()[off..off + n].copy_from_slice(&bytes);
                counts[1] += 1;
                Ok(())
            }
            (5..=6, Some(id)) => {
                let d = &model[&id];
                let off = rng.usize(0..d.len());
                let n = rng.usize(1..=d.len() - off);
                let got = if rng.bool() {
                    MemRange::new(buf, 0, n).and_then(|range| store.pread(id, off as u64, range))
                } else {
                    store.pread_prefetch(id, off as u64, n).and_then(|p| {
                        while !p.is_done() {
                            std::thread::yield_now();
                        }
                        // Its NVMe commands where the library drives the
                        // controller, none elsewhere.
                        let ids = p.commands();
                        commands += ids.len();
                        if x.queues.is_some() == ids.is_empty() || ids.iter().any(|c| c.queue == 0)
                        {
                            return Err(Error::InvalidArgument(format!(
                                "op {i}: a prefetch of {n} bytes names the commands {ids:?}"
                            )));
                        }
                        MemRange::new(buf, 0, n)
                            .and_then(|range| store.consume_prefetch_pread(p, range))
                    })
                };
                got.map_err(|e| e.to_string())?;
                let mut v = vec![0u8; n];
                buf.read_at(0, &mut v).map_err(|e| e.to_string())?;
                counts[2] += 1;
                if v != d[off..off + n] {
                    Err(format!(
                        "op {i}: object {id} bytes {off}..{} differ from the model",
                        off + n
                    ))
                } else {
                    // Past the end is an error, never bytes.
                    match MemRange::new(buf, 0, 1)
                        .and_then(|range| store.pread(id, d.len() as u64, range))
                    {
                        Err(Error::EndOfFile { .. }) => Ok(()),
                        other => Err(format!(
                            "op {i}: a read past the end of {id} gave {other:?}"
                        )),
                    }
                }
            }
            (7, Some(id)) => {
                store.delete(id).map_err(|e| e.to_string())?;
                model.remove(&id);
                counts[3] += 1;
                match MemRange::new(buf, 0, 1).and_then(|range| store.pread(id, 0, range)) {
                    Err(Error::InvalidArgument(_)) => Ok(()),
                    other => Err(format!("op {i}: a read of deleted {id} gave {other:?}")),
                }
            }
            (8, Some(id)) => {
                let n = rng.usize(1..max);
                store.resize(id, n as u64).map_err(|e| e.to_string())?;
                model.get_mut(&id).unwrap().resize(n, 0);
                counts[4] += 1;
                Ok(())
            }
            _ => {
                store.flush().map_err(|e| e.to_string())?;
                counts[5] += 1;
                Ok(())
            }
        };
        r?;
    }
    for buf in &bufs {
        check_whole(&store, &model, buf)?;
    }
    let stats = store.cache_stats();
    store.flush().map_err(|e| e.to_string())?;
    drop(store);
    let again = open(x, &engine, &file, &module, false)?;
    check_whole(&again, &model, &bufs[0])?;
    drop(again);
    if let Some(m) = &saved {
        MemRange::new(m, 0, x.size as usize)
            .and_then(|range| engine.write(&file, x.offset, range))
            .and_then(|_| file.sync())
            .map_err(|e| format!("putting the region back: {e}"))?;
    }
    println!(
        "{} operations on {} ({} creates, {} writes, {} reads, {} deletes, {} resizes, {} flushes), {} objects reopened whole; prefetches named {commands} NVMe commands; paths {:?}; cache {stats:?}",
        x.ops,
        x.path,
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        counts[4],
        counts[5],
        model.len(),
        engine.stats()
    );
    Ok(())
}

#[derive(Args)]
pub struct CoherenceArgs {
    /// The store's file (created at `--size`).
    #[arg(long)]
    path: String,
    /// Bytes of the store's file.
    #[arg(long, default_value_t = 16 << 20)]
    size: u64,
    /// The engine's path preference.
    #[arg(long, default_value = "auto")]
    engine_path: PathPref,
    /// Accelerators the cache spans.
    #[arg(long, default_value_t = 2)]
    accelerators: usize,
    /// Cache frames on each.
    #[arg(long, default_value_t = 16)]
    frames: usize,
    /// Pages of the one object the threads share.
    #[arg(long, default_value_t = 48)]
    pages: usize,
    /// Threads, bound to the accelerators in turn.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Operations per thread.
    #[arg(long, default_value_t = 300)]
    ops: usize,
}

/// What each half of a page was last written with.
type Stamps = RwLock<[u64; 2]>;

const PAGE: usize = 4096;
const HALF: usize = PAGE / 2;

/// Every word of `got` against the stamps of its half.
fn stamped(got: &[u8], st: &[u64; 2]) -> Result<(), String> {
    for (i, w) in got.chunks(8).enumerate() {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        let want = st[i * 8 / HALF];
        if v != want {
            return Err(format!("word {i} is {v}, last written {want}"));
        }
    }
    Ok(())
}

/// Threads on every accelerator write halves of pages and read whole ones
/// (a page's writes and reads ordered by a lock of the test's, nothing
/// else): every read must return what the last write left, whichever
/// accelerator wrote it. Then flushed, reopened without a cache and
/// checked on storage.
pub fn coherence(x: &CoherenceArgs) -> Result<(), String> {
    create(&x.path, x.size)?;
    let (module, engine) = module_and_engine(x.engine_path)?;
    let file = Arc::new(StorageFile::open_rw(&x.path).map_err(|e| e.to_string())?);
    let backing = Arc::new(EngineBacking::new(engine.clone(), file));
    let plain = Store::format(backing.clone(), 8).map_err(|e| e.to_string())?;
    let id = plain
        .pcreate((x.pages * PAGE) as u64)
        .map_err(|e| e.to_string())?;
    drop(plain);
    let mems = (0..x.accelerators)
        .map(|i| {
            accel_memory_on(&module, i, x.frames * PAGE)
                .map(|m| Arc::new(m) as Arc<dyn DeviceMemory>)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let cache = PageCache::shared(mems, PAGE, WritePolicy::WriteBack).map_err(|e| e.to_string())?;
    let store = Store::initialize(backing.clone())
        .map_err(|e| e.to_string())?
        .with_cache(cache);
    let stamps: Vec<Stamps> = (0..x.pages).map(|_| Default::default()).collect();
    let next = AtomicU64::new(1);
    let working = AtomicUsize::new(x.threads);
    let results: Vec<Result<(usize, usize), String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..x.threads)
            .map(|t| {
                let (store, stamps, next, working, module) =
                    (&store, &stamps, &next, &working, &module);
                s.spawn(move || {
                    let r = (|| {
                        let accel = t % x.accelerators;
                        // The thread's buffer is in its accelerator's
                        // memory: its calls run on that one's copies.
                        let buf = accel_memory_on(module, accel, PAGE)?;
                        let mut rng = fastrand::Rng::with_seed(t as u64 + 1);
                        let (mut writes, mut reads) = (0, 0);
                        for i in 0..x.ops {
                            let p = rng.usize(..x.pages);
                            let at = (p * PAGE) as u64;
                            if rng.u8(..3) == 0 {
                                let mut st = stamps[p].write().map_err(|e| e.to_string())?;
                                let v = next.fetch_add(1, Ordering::SeqCst);
                                let halves = match rng.u8(..3) {
                                    0 => 0..1,
                                    1 => 1..2,
                                    _ => 0..2,
                                };
                                let (from, n) = (halves.start * HALF, halves.len() * HALF);
                                let words: Vec<u8> =
                                    (0..n / 8).flat_map(|_| v.to_le_bytes()).collect();
                                buf.write_at(0, &words).map_err(|e| e.to_string())?;
                                MemRange::new(&buf, 0, n)
                                    .and_then(|range| store.pwrite(id, at + from as u64, range))
                                    .map_err(|e| format!("thread {t} op {i}: {e}"))?;
                                halves.for_each(|h| st[h] = v);
                                writes += 1;
                            } else {
                                let st = stamps[p].read().map_err(|e| e.to_string())?;
                                MemRange::new(&buf, 0, PAGE)
                                    .and_then(|range| store.pread(id, at, range))
                                    .map_err(|e| format!("thread {t} op {i}: {e}"))?;
                                let mut got = vec![0u8; PAGE];
                                buf.read_at(0, &mut got).map_err(|e| e.to_string())?;
                                stamped(&got, &st).map_err(|e| {
                                    format!(
                                        "thread {t} on accelerator {accel}, op {i}, page {p}: {e}"
                                    )
                                })?;
                                reads += 1;
                            }
                        }
                        Ok((writes, reads))
                    })();
                    working.fetch_sub(1, Ordering::SeqCst);
                    r
                })
            })
            .collect();
        // Flushes meanwhile write dirty pages back under the others.
        let (store, working) = (&store, &working);
        let flusher = s.spawn(move || -> Result<usize, String> {
            let mut n = 0;
            while working.load(Ordering::SeqCst) > 0 {
                store.flush().map_err(|e| format!("flush: {e}"))?;
                n += 1;
            }
            Ok(n)
        });
        let mut r: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect();
        r.push(
            flusher
                .join()
                .unwrap_or_else(|_| Err("the flusher panicked".into()))
                .map(|n| (n, 0)),
        );
        r
    });
    let mut counts = (0, 0);
    for r in &results[..x.threads] {
        let (w, rd) = r.clone()?;
        counts.0 += w;
        counts.1 += rd;
    }
    let flushes = results[x.threads].clone()?.0;
    let per: Vec<_> = (0..x.accelerators)
        .map(|a| store.cache().map(|c| c.stats_on(a)))
        .collect();
    let total = store.cache_stats().unwrap_or_default();
    if total.remote == 0 || total.invalidations == 0 {
        return Err(format!(
            "no page went from one accelerator to another ({total:?}): nothing was shared"
        ));
    }
    store.flush().map_err(|e| e.to_string())?;
    drop(store);
    let plain = Store::initialize(backing).map_err(|e| e.to_string())?;
    let buf = accel_memory_on(&module, 0, x.pages * PAGE)?;
    MemRange::new(&buf, 0, x.pages * PAGE)
        .and_then(|range| plain.pread(id, 0, range))
        .map_err(|e| e.to_string())?;
    let mut got = vec![0u8; x.pages * PAGE];
    buf.read_at(0, &mut got).map_err(|e| e.to_string())?;
    for (p, st) in stamps.iter().enumerate() {
        let st = st.read().map_err(|e| e.to_string())?;
        stamped(&got[p * PAGE..(p + 1) * PAGE], &st)
            .map_err(|e| format!("on storage, page {p}: {e}"))?;
    }
    println!(
        "{} threads on {} accelerators: {} writes and {} reads of {} pages coherent, {flushes} flushes meanwhile, all on storage after the last; cache {total:?}; per accelerator {per:?}; paths {:?}",
        x.threads,
        x.accelerators,
        counts.0,
        counts.1,
        x.pages,
        engine.stats()
    );
    Ok(())
}
