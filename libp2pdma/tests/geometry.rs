//! AUTO's chunk size and depth (learned once per device, kept in a cache
//! file) and the copy stage's helper threads, checked on real files byte
//! for byte.

use std::{
    io::Write,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    time::Duration,
};

mod common;

use common::{mem_bytes, pattern};
use p2pdma::{
    memory::{DeviceMemory, HostMemory, MemoryKind},
    transfer::{geometry, Config, Engine, PageCache, PathPref, StorageFile, TransferPath},
    MemRange,
};
use proptest::prelude::*;

/// A fresh directory in the target directory (a filesystem with
/// `O_DIRECT`, unlike tmpfs), removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    common::scratch_dir(&format!("geometry-{name}"))
}

fn write_file(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn bounce(chunk: Option<usize>, depth: Option<usize>, threads: Option<usize>) -> Engine {
    Engine::new(
        Config {
            path: PathPref::Bounce,
            // The device path's geometry: nothing from the page cache.
            page_cache: PageCache::Direct,
            chunk,
            depth,
            copy_threads: threads,
            ..Config::default()
        },
        None,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Bounce reads land exactly whatever the chunk, depth and number of
    /// copy threads (chunks split into pieces among helpers), offsets and
    /// length, and nothing around the range changes.
    #[test]
    fn reads_with_copy_helpers_land_exactly(
        chunk_kib in prop::sample::select(vec![256usize, 512, 1024, 2048]),
        depth in 1usize..5,
        threads in 1usize..5,
        foff in 0u64..(1 << 20),
        moff in 0usize..9000,
        len in 1usize..(5 << 20),
    ) {
        let dir = scratch("prop");
        let size = (6 << 20) + 4096;
        let data = pattern(9, 0, size);
        write_file(&dir.path().join("f"), &data);
        let file = StorageFile::open(dir.path().join("f")).unwrap();
        let e = bounce(Some(chunk_kib << 10), Some(depth), Some(threads));
        let mem = HostMemory::new(moff + len + 4096).unwrap();
        mem.write_at(0, &vec![0xEE; mem.len()]).unwrap();
        let r = e.read(&file, foff, MemRange::new(&mem, moff, len).unwrap()).unwrap();
        prop_assert_eq!(r.bytes, len as u64);
        prop_assert_eq!(r.copy_threads, threads);
        let want = &data[foff as usize..foff as usize + len];
        prop_assert!(mem_bytes(&mem, moff, len) == want);
        prop_assert!(mem_bytes(&mem, 0, moff).iter().all(|&b| b == 0xEE));
        let after = mem.len() - moff - len;
        prop_assert!(mem_bytes(&mem, moff + len, after).iter().all(|&b| b == 0xEE));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Host memory whose copies in take 4 ms per MiB: a copy stage far slower
/// than the page-cached storage it reads.
#[derive(Debug)]
struct SlowMemory(HostMemory);

impl DeviceMemory for SlowMemory {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> p2pdma::Result<()> {
        std::thread::sleep(Duration::from_micros((4000 * src.len() as u64) >> 20));
        self.0.write_at(offset, src)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> p2pdma::Result<()> {
        self.0.read_at(offset, dst)
    }
}

#[test]
fn a_slow_copy_stage_gets_helpers_when_there_are_cores() {
    let dir = scratch("slow");
    let data = pattern(10, 0, 32 << 20);
    write_file(&dir.path().join("f"), &data);
    let file = StorageFile::open(dir.path().join("f")).unwrap();
    let mem = SlowMemory(HostMemory::new(32 << 20).unwrap());
    let e = bounce(Some(1 << 20), Some(4), None);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let r = e
        .read(&file, 0, MemRange::new(&mem, 0, 32 << 20).unwrap())
        .unwrap();
    assert_eq!(r.path, TransferPath::Bounce);
    let mut got = vec![0u8; 32 << 20];
    mem.read_at(0, &mut got).unwrap();
    assert!(got == data);
    // The copies take most of the time: with more than one core, the copy
    // stage splits chunks among min(cores, 4) threads; with one, it cannot.
    assert_eq!(r.copy_threads, cores.min(4));
    // Small chunks are never split.
    let e = bounce(Some(256 << 10), Some(4), None);
    let r = e
        .read(&file, 0, MemRange::new(&mem, 0, 8 << 20).unwrap())
        .unwrap();
    assert_eq!(r.copy_threads, 1);
    mem.read_at(0, &mut got).unwrap();
    assert!(got == data);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sparse file of `size` bytes with the pattern in its first and last
/// MiB and at 100 MiB: large enough to calibrate on, cheap to make.
fn sparse(dir: &Path, size: u64) -> (PathBuf, Vec<(u64, Vec<u8>)>) {
    let path = dir.join("big");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size).unwrap();
    let marks: Vec<(u64, Vec<u8>)> = [0, 100 << 20, size - (1 << 20)]
        .into_iter()
        .map(|at| (at, pattern(at, at, 1 << 20)))
        .collect();
    for (at, bytes) in &marks {
        f.write_all_at(bytes, *at).unwrap();
    }
    f.sync_all().unwrap();
    (path, marks)
}

/// Checks that `mem` holds the sparse file's bytes `[0, len)`.
fn check_sparse(mem: &HostMemory, len: u64, marks: &[(u64, Vec<u8>)]) {
    let mut got = vec![0u8; 1 << 20];
    for at in (0..len).step_by(1 << 20) {
        mem.read_at(at as usize, &mut got).unwrap();
        match marks.iter().find(|(m, _)| *m == at) {
            Some((_, want)) => assert!(got == *want, "mark at {at}"),
            None => assert!(got.iter().all(|&b| b == 0), "hole at {at}"),
        }
    }
}

#[test]
fn auto_learns_the_geometry_once_and_keeps_it_in_the_cache() {
    let dir = scratch("learn");
    let size = (geometry::CALIBRATE_MIN + (16 << 20)) as u64;
    let (path, marks) = sparse(dir.path(), size);
    let file = StorageFile::open(&path).unwrap();
    let facts = file.disk_facts().clone();
    let cache_dir = dir.path().join("cache");
    let auto = |cache: Option<PathBuf>| {
        Engine::new(
            Config {
                path: PathPref::Bounce,
                // The device path's geometry: nothing from the page cache.
                page_cache: PageCache::Direct,
                cache_dir: cache,
                ..Config::default()
            },
            None,
        )
    };
    let mem = HostMemory::new(size as usize).unwrap();

    // Before: the facts' choice, and no cache file.
    let e = auto(Some(cache_dir.clone()));
    let before = e.geometry(&file, size as usize);
    assert_eq!(before.geometry, geometry::from_facts(&facts));
    assert!(before.reason.contains("facts"), "{}", before.reason);
    // A small read does not calibrate.
    e.read(&file, 0, MemRange::new(&mem, 0, 64 << 20).unwrap())
        .unwrap();
    assert!(!cache_dir.join("geometry").exists());
    // A large one does, when the disk can be recognised.
    e.read(&file, 0, MemRange::new(&mem, 0, size as usize).unwrap())
        .unwrap();
    check_sparse(&mem, size, &marks);
    let Some(key) = geometry::DeviceKey::of(&facts) else {
        // Storage without a device number (a container's overlay, say):
        // nothing to key a cache by, and nothing is written.
        assert!(!cache_dir.exists());
        return;
    };
    let cache = geometry::Cache::in_dir(&cache_dir);
    let learned = cache.lookup(&key).expect("calibration was stored");
    assert!(geometry::candidates(&facts).contains(&learned.geometry));
    assert!(learned.bytes_per_s > 0.0);
    let after = e.geometry(&file, size as usize);
    assert_eq!(after.geometry, learned.geometry);
    assert!(after.reason.contains("learned"), "{}", after.reason);

    // Another engine (another process, as far as the cache is concerned)
    // starts from what was learned, and reads land.
    let e2 = auto(Some(cache_dir.clone()));
    assert_eq!(e2.geometry(&file, size as usize).geometry, learned.geometry);
    mem.write_at(0, &vec![0xEE; 1 << 20]).unwrap();
    e2.read(&file, 0, MemRange::new(&mem, 0, size as usize).unwrap())
        .unwrap();
    check_sparse(&mem, size, &marks);

    // Without a cache directory nothing is read or learned: the facts'.
    let e3 = auto(None);
    e3.read(&file, 0, MemRange::new(&mem, 0, size as usize).unwrap())
        .unwrap();
    assert_eq!(
        e3.geometry(&file, size as usize).geometry,
        geometry::from_facts(&facts)
    );

    // Set chunk and depth win over what was learned.
    let e4 = Engine::new(
        Config {
            path: PathPref::Bounce,
            // The device path's geometry: nothing from the page cache.
            page_cache: PageCache::Direct,
            chunk: Some(128 << 10),
            depth: Some(3),
            cache_dir: Some(cache_dir.clone()),
            ..Config::default()
        },
        None,
    );
    let g = e4.geometry(&file, size as usize);
    assert_eq!((g.geometry.chunk, g.geometry.depth), (128 << 10, 3));

    // A corrupt cache is ignored (the facts' choice), and an unwritable one
    // only means nothing is kept: reads land either way.
    std::fs::write(cache_dir.join("geometry"), b"\x00\xffjunk\n1:2\tx").unwrap();
    let e5 = auto(Some(cache_dir.clone()));
    assert_eq!(
        e5.geometry(&file, size as usize).geometry,
        geometry::from_facts(&facts)
    );
    let blocked = dir.path().join("not-a-dir");
    std::fs::write(&blocked, b"").unwrap();
    let e6 = auto(Some(blocked.join("cache")));
    mem.write_at(0, &vec![0xEE; 1 << 20]).unwrap();
    e6.read(&file, 0, MemRange::new(&mem, 0, size as usize).unwrap())
        .unwrap();
    check_sparse(&mem, size, &marks);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prepare_sets_up_the_geometry_a_read_uses() {
    let dir = scratch("prepare");
    let data = pattern(11, 0, 8 << 20);
    write_file(&dir.path().join("f"), &data);
    let file = StorageFile::open(dir.path().join("f")).unwrap();
    let e = bounce(None, None, None);
    e.prepare(&file, 0, 8 << 20).unwrap();
    let mem = HostMemory::new(8 << 20).unwrap();
    e.read(&file, 0, MemRange::new(&mem, 0, 8 << 20).unwrap())
        .unwrap();
    assert!(mem_bytes(&mem, 0, 8 << 20) == data);
    // Past the end: prepare has nothing to refuse (the read will).
    e.prepare(&file, 1 << 40, 1 << 20).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
