//! The object store in the guest: a store on a file of the NVMe-backed
//! filesystem (or a block device), its buffers and its page cache in
//! accelerator memory from the module, driven by a seeded random sequence
//! of operations checked against a model; then reopened and checked whole.

use std::{collections::BTreeMap, sync::Arc};

use clap::Args;
use p2pdma::{
    memory::{DeviceMemory, ModuleMemory},
    store::{EngineBacking, PageCache, Store, WritePolicy},
    transfer::{Config, Engine, PathPref, StorageFile},
    Error, Module,
};

#[derive(Args)]
pub struct StoreArgs {
    /// The store's device: a file (created at `--size`) or a block device.
    #[arg(long)]
    path: String,
    /// Bytes of the store when `path` is a file it creates.
    #[arg(long, default_value_t = 64 << 20)]
    size: u64,
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
}

/// Module memory of `len` bytes on the first accelerator.
fn accel_memory(module: &Arc<Module>, len: usize) -> Result<ModuleMemory, String> {
    let accel = module.accelerators().map_err(|e| e.to_string())?;
    let a = accel.first().ok_or("no accelerator bound to the module")?;
    ModuleMemory::alloc(module.clone(), a.index, len as u64, 0).map_err(|e| e.to_string())
}

fn open(
    x: &StoreArgs,
    engine: &Arc<Engine>,
    module: &Arc<Module>,
    format: bool,
) -> Result<Store, String> {
    let file = Arc::new(StorageFile::open_rw(&x.path).map_err(|e| e.to_string())?);
    let backing = Arc::new(EngineBacking::new(engine.clone(), file));
    let store = if format {
        Store::format(backing, 512)
    } else {
        Store::initialize(backing)
    }
    .map_err(|e| e.to_string())?;
    if x.frames == 0 {
        return Ok(store);
    }
    let mem: Arc<dyn DeviceMemory> = Arc::new(accel_memory(module, x.frames * x.page)?);
    let policy = if x.write_through {
        WritePolicy::WriteThrough
    } else {
        WritePolicy::WriteBack
    };
    let cache = PageCache::new(mem, x.page, policy).map_err(|e| e.to_string())?;
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
        store
            .pread(*id, 0, d.len(), buf, 0)
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

pub fn run(x: &StoreArgs) -> Result<(), String> {
    if !std::path::Path::new(&x.path).exists() {
        std::fs::File::create(&x.path)
            .and_then(|f| f.set_len(x.size))
            .map_err(|e| format!("create {}: {e}", x.path))?;
    }
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let engine = Arc::new(Engine::new(
        Config {
            path: x.engine_path,
            ..Config::default()
        },
        Some(module.clone()),
    ));
    let store = open(x, &engine, &module, true)?;
    let max = 128 << 10;
    let buf = accel_memory(&module, max)?;
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut rng = fastrand::Rng::with_seed(x.seed);
    let mut counts = [0usize; 6];
    for i in 0..x.ops {
        let pick = |m: &BTreeMap<u64, Vec<u8>>, r: &mut fastrand::Rng| -> Option<u64> {
            (!m.is_empty()).then(|| *m.keys().nth(r.usize(..m.len())).unwrap())
        };
        let what = rng.u8(0..10);
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
                store
                    .pwrite(id, off as u64, n, &buf, 0)
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
                    store.pread(id, off as u64, n, &buf, 0)
                } else {
                    store
                        .pread_prefetch(id, off as u64, n)
                        .and_then(|p| store.consume_prefetch_pread(p, &buf, 0, n))
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
                    match store.pread(id, d.len() as u64, 1, &buf, 0) {
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
                match store.pread(id, 0, 1, &buf, 0) {
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
    check_whole(&store, &model, &buf)?;
    let stats = store.cache_stats();
    store.flush().map_err(|e| e.to_string())?;
    drop(store);
    let again = open(x, &engine, &module, false)?;
    check_whole(&again, &model, &buf)?;
    println!(
        "{} operations on {} ({} creates, {} writes, {} reads, {} deletes, {} resizes, {} flushes), {} objects reopened whole; paths {:?}; cache {stats:?}",
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
