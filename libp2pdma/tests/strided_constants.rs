//! The strided cost model's constants on a real file: measured quickly at
//! the first strided read and stored, read back by the next engine,
//! overridden by the configuration, the defaults without a cache, and a
//! full calibration stored for the next engine to use. Every read's bytes
//! are checked against the file.

use std::{os::unix::fs::FileExt, path::PathBuf, time::Instant};

mod common;

use common::{mem_bytes, model_dir, pattern};
use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    transfer::{
        constants::{memory_name, Key, Partial, Store},
        geometry::DeviceKey,
        Config, Engine, Layout, PathPref, Shape, StorageFile, StridedMode, StridedReport,
        TransferPath,
    },
    MemRange,
};

const SEED: u64 = 0xC0_57A7;
const LEN: usize = 8 << 20;

fn engine(cache_dir: Option<PathBuf>, extra: &[(&str, &str)]) -> Engine {
    let mut c = Config {
        path: PathPref::Bounce,
        cache_dir,
        ..Config::default()
    };
    for (k, v) in extra {
        c.set(k, v).unwrap();
    }
    Engine::new(c, None)
}

/// 64 runs of 4 KiB, 64 KiB apart from byte 100, read by AUTO into poisoned
/// packed memory and checked against the file's bytes.
fn auto_read(e: &Engine, file: &StorageFile, data: &[u8]) -> StridedReport {
    let shape = Shape::new(100, 4096, &[(65536, 64)]).unwrap();
    let mem = HostMemory::new(1 << 20).unwrap();
    mem.write_at(0, &vec![0xA5; 1 << 20]).unwrap();
    let r = e
        .strided()
        .read(
            file,
            &shape,
            MemRange::whole(&mem),
            Layout::Packed,
            StridedMode::Auto,
        )
        .unwrap();
    let got = mem_bytes(&mem, 0, 1 << 20);
    for run in shape.iter() {
        let (f, p) = (run.file_offset as usize, run.packed_offset as usize);
        assert_eq!(got[p..p + 4096], data[f..f + 4096], "run at {f}");
    }
    assert!(got[64 * 4096..].iter().all(|&b| b == 0xA5));
    r
}

/// Whether two sets of constants are equal but for the last bits that a
/// trip through JSON's decimal numbers may change.
fn same(a: &Partial, b: &Partial) -> bool {
    let f = |p: &Partial| {
        [
            p.call_s,
            p.storage_bps,
            p.copy_bps,
            p.pack_bps,
            p.copy_call_s,
        ]
    };
    f(a).iter().zip(f(b)).all(|(x, y)| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
        (x, y) => x.is_none() && y.is_none(),
    })
}

/// Whether `reason` gives every constant the source `what`.
fn all_from(reason: &str, what: &str) -> bool {
    ["call", "call MiB", "storage", "copy", "pack", "copy call"]
        .iter()
        .all(|c| {
            reason.split(", ").chain(reason.split("; ")).any(|part| {
                part.starts_with(&format!("{c} ")) && part.ends_with(&format!("({what})"))
            })
        })
}

#[test]
fn constants_come_from_config_then_the_store_then_a_measurement_then_defaults() {
    let dir = model_dir("strided-constants");
    let path = dir.path().join("table");
    let data = pattern(SEED, 0, LEN);
    std::fs::File::create(&path)
        .unwrap()
        .write_all_at(&data, 0)
        .unwrap();
    let file = StorageFile::open(&path).unwrap();
    let cache = dir.path().join("cache");
    let Some(dev) = DeviceKey::of(file.disk_facts()) else {
        // Storage without a device number: nothing to key the constants
        // by; AUTO uses the defaults and stores nothing.
        let r = auto_read(&engine(Some(cache.clone()), &[]), &file, &data);
        assert!(all_from(&r.reason, "default"), "{}", r.reason);
        assert!(!cache.exists());
        eprintln!("not checked: {} has no device number", path.display());
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let key = Key {
        storage: Some((dev, TransferPath::Bounce)),
        memory: memory_name(&HostMemory::new(4096).unwrap().kind()),
    };
    let store = Store::in_dir(&cache);

    // Without a cache directory: the defaults, and nothing measured.
    let r = auto_read(&engine(None, &[]), &file, &data);
    assert!(all_from(&r.reason, "default"), "{}", r.reason);
    assert!(!cache.exists());

    // The first strided read measures, quickly, and stores.
    let e = engine(Some(cache.clone()), &[]);
    let t = Instant::now();
    let r = auto_read(&e, &file, &data);
    let took = t.elapsed();
    assert!(all_from(&r.reason, "measured now"), "{}", r.reason);
    assert!(took.as_secs_f64() < 1.0, "the first read took {took:?}");
    let stored = store.lookup(&key);
    for v in [
        stored.call_s,
        stored.storage_bps,
        stored.copy_bps,
        stored.pack_bps,
        stored.copy_call_s,
        stored.call_mib_s,
    ] {
        assert!(v.is_some_and(|v| v > 0.0), "{stored:?}");
    }
    // The same engine does not measure again.
    let r = auto_read(&e, &file, &data);
    assert!(all_from(&r.reason, "measured now"), "{}", r.reason);

    // The next engine reads the store.
    let r = auto_read(&engine(Some(cache.clone()), &[]), &file, &data);
    assert!(all_from(&r.reason, "stored"), "{}", r.reason);

    // Stored values are what AUTO decides by: a call of half a second makes
    // SC's 64 calls hopeless, and TaT reads the range in one.
    store
        .store(
            &key,
            &Partial {
                call_s: Some(0.5),
                ..stored
            },
            "by hand",
        )
        .unwrap();
    let r = auto_read(&engine(Some(cache.clone()), &[]), &file, &data);
    assert_eq!((r.mode, r.calls), (StridedMode::Tat, 1), "{}", r.reason);
    assert!(
        r.reason.contains("call 500000.0 µs (stored)"),
        "{}",
        r.reason
    );
    // Packing at 1 MiB/s: SC, which packs nothing.
    store
        .store(
            &key,
            &Partial {
                pack_bps: Some(1048576.0),
                ..stored
            },
            "by hand",
        )
        .unwrap();
    let r = auto_read(&engine(Some(cache.clone()), &[]), &file, &data);
    assert_eq!(r.mode, StridedMode::Sc, "{}", r.reason);
    assert!(
        r.reason.contains("pack 0.00 GiB/s (stored)"),
        "{}",
        r.reason
    );

    // The configuration wins over the store, constant by constant.
    let e = engine(
        Some(cache.clone()),
        &[("strided_call", "0.5s"), ("strided_pack_rate", "3G")],
    );
    let r = auto_read(&e, &file, &data);
    assert_eq!(r.mode, StridedMode::Tat, "{}", r.reason);
    for part in [
        "call 500000.0 µs (config)",
        "pack 3.00 GiB/s (config)",
        "(stored)",
        "copy call",
    ] {
        assert!(r.reason.contains(part), "{part}: {}", r.reason);
    }

    // A full calibration replaces the entry, and the next engine uses it.
    let mem = HostMemory::new(1 << 20).unwrap();
    let e = engine(Some(cache.clone()), &[]);
    let (k, m, written) = e.strided().calibrate(Some(&file), &mem).unwrap();
    assert_eq!(k, key);
    assert_eq!(written.as_deref(), Some(store.path()));
    assert!(m.failures.is_empty(), "{:?}", m.failures);
    assert!(same(&store.lookup(&key), &m.values));
    let r = auto_read(&engine(Some(cache.clone()), &[]), &file, &data);
    assert!(all_from(&r.reason, "stored"), "{}", r.reason);
    // The memory passed in is never written by a measurement.
    mem.write_at(0, &[0x77; 4096]).unwrap();
    let (_, again, _) = e.strided().calibrate(Some(&file), &mem).unwrap();
    assert_eq!(mem_bytes(&mem, 0, 4096), vec![0x77; 4096]);
    assert!(same(&store.lookup(&key), &again.values));

    // Host memory alone: the copy and pack constants.
    let (k, m, _) = e.strided().calibrate(None, &mem).unwrap();
    assert_eq!(k.storage, None);
    assert!(m.values.call_s.is_none() && m.values.storage_bps.is_none());
    assert!(m.values.copy_bps.is_some() && m.values.pack_bps.is_some());
    assert!(same(&store.lookup(&k), &m.values));
    // The storage entry stays beside the memory's.
    assert!(same(&store.lookup(&key), &again.values));
    let _ = std::fs::remove_dir_all(&dir);
}
