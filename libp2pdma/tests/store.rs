//! The object store on a real file through the transfer engine: objects
//! written, flushed, and found again by a second open, byte for byte.

mod common;

use std::sync::Arc;

use p2pdma::{
    store::{EngineBacking, Store},
    transfer::{Config, Engine, StorageFile},
    DeviceMemory, Error, HostMemory, MemRange,
};

fn backing(path: &std::path::Path) -> Arc<EngineBacking> {
    let engine = Arc::new(Engine::new(Config::default(), None));
    let file = Arc::new(StorageFile::open_rw(path).unwrap());
    Arc::new(EngineBacking::new(engine, file))
}

#[test]
fn objects_on_a_file_survive_a_reopen() {
    let dir = std::env::temp_dir().join(format!("p2pdma-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let store = Store::format(backing(&path), 100).unwrap();
    let sizes = [1usize, 4095, 4096, 100_000, 1 << 20];
    let mut written = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let id = store.pcreate(n as u64).unwrap();
        let bytes = common::pattern(k as u64, 0, n);
        let mem = HostMemory::new(n).unwrap();
        mem.write_at(0, &bytes).unwrap();
        assert_eq!(
            store
                .pwrite(id, 0, MemRange::new(&mem, 0, n).unwrap())
                .unwrap(),
            n
        );
        written.push((id, bytes));
    }
    // A write inside an object, unaligned on both ends.
    let (id, bytes) = &mut written[3];
    let patch = common::pattern(99, 0, 5000);
    let mem = HostMemory::new(5000).unwrap();
    mem.write_at(0, &patch).unwrap();
    store
        .pwrite(*id, 777, MemRange::new(&mem, 0, 5000).unwrap())
        .unwrap();
    bytes[777..5777].copy_from_slice(&patch);
    store.flush().unwrap();
    let (gone, _) = written.remove(1);
    store.delete(gone).unwrap();
    let map = store.get_object_map();
    drop(store);

    let again = Store::initialize(backing(&path)).unwrap();
    assert_eq!(again.get_object_map(), map);
    for (id, bytes) in &written {
        let mem = HostMemory::new(bytes.len()).unwrap();
        again
            .pread(*id, 0, MemRange::new(&mem, 0, bytes.len()).unwrap())
            .unwrap();
        assert_eq!(
            &common::mem_bytes(&mem, 0, bytes.len()),
            bytes,
            "object {id}"
        );
        let p = again.pread_prefetch(*id, 0, bytes.len()).unwrap();
        let other = HostMemory::new(bytes.len()).unwrap();
        again
            .consume_prefetch_pread(p, MemRange::new(&other, 0, bytes.len()).unwrap())
            .unwrap();
        assert_eq!(
            &common::mem_bytes(&other, 0, bytes.len()),
            bytes,
            "prefetch of {id}"
        );
    }
    let mem = HostMemory::new(8).unwrap();
    assert!(matches!(
        again.pread(gone, 0, MemRange::new(&mem, 0, 1).unwrap()),
        Err(Error::InvalidArgument(_))
    ));
    let (id, bytes) = &written[0];
    assert!(matches!(
        again.pread(*id, bytes.len() as u64, MemRange::new(&mem, 0, 1).unwrap()),
        Err(Error::EndOfFile { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_store_on_a_region_never_touches_the_bytes_around_it() {
    let dir = std::env::temp_dir().join(format!("p2pdma-store-region-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("disk.img");
    let around = common::pattern(7, 0, 12 << 20);
    std::fs::write(&path, &around).unwrap();
    let engine = Arc::new(Engine::new(Config::default(), None));
    let file = Arc::new(StorageFile::open_rw(&path).unwrap());
    let region = |o, l| EngineBacking::region(engine.clone(), file.clone(), o, l);
    // Regions past the end or unaligned are refused.
    for (o, l) in [
        (8 << 20, 8 << 20),
        (4095, 4 << 20),
        (4 << 20, 100),
        (u64::MAX - 4095, 8192),
    ] {
        assert!(
            matches!(region(o, l), Err(Error::InvalidArgument(_))),
            "{o} {l}"
        );
    }
    let (base, len) = (4u64 << 20, 4u64 << 20);
    let store = Store::format(Arc::new(region(base, len).unwrap()), 16).unwrap();
    // Filled to the last byte it can hold: an object as large as fits.
    let n = store.free_bytes() as usize;
    let id = store.pcreate(n as u64).unwrap();
    let bytes = common::pattern(8, 0, n);
    let mem = HostMemory::new(n).unwrap();
    mem.write_at(0, &bytes).unwrap();
    store
        .pwrite(id, 0, MemRange::new(&mem, 0, n).unwrap())
        .unwrap();
    store.flush().unwrap();
    assert!(store.pcreate(1).is_err(), "the region is full");
    drop(store);
    let disk = std::fs::read(&path).unwrap();
    assert_eq!(disk[..base as usize], around[..base as usize]);
    assert_eq!(
        disk[(base + len) as usize..],
        around[(base + len) as usize..]
    );
    let again = Store::initialize(Arc::new(region(base, len).unwrap())).unwrap();
    let out = HostMemory::new(n).unwrap();
    again
        .pread(id, 0, MemRange::new(&out, 0, n).unwrap())
        .unwrap();
    let mut got = vec![0u8; n];
    out.read_at(0, &mut got).unwrap();
    assert_eq!(got, bytes);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether `r` is the refusal of a store another open holds.
fn busy<T>(r: p2pdma::Result<T>) -> bool {
    matches!(r, Err(e) if e.errno() == Some(rustix::io::Errno::BUSY))
}

#[test]
fn one_open_store_per_range_of_a_file_in_this_process_and_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let store = Store::format(backing(&path), 16).unwrap();
    let id = store.pcreate(10_000).unwrap();
    // A second open of the file, in this process: refused (after a wait),
    // for reopening and for formatting, and the store is left as it was.
    let start = std::time::Instant::now();
    assert!(busy(Store::initialize(backing(&path))));
    assert!(start.elapsed() >= p2pdma::store::CLAIM_WAIT);
    assert!(busy(Store::format(backing(&path), 16)));
    // The same open claiming the store twice: refused at once.
    let engine = Arc::new(Engine::new(Config::default(), None));
    let file = Arc::new(StorageFile::open_rw(&path).unwrap());
    let first = Store::initialize(Arc::new(EngineBacking::new(engine.clone(), file.clone())));
    assert!(busy(first));
    drop(store);
    let first =
        Store::initialize(Arc::new(EngineBacking::new(engine.clone(), file.clone()))).unwrap();
    let start = std::time::Instant::now();
    assert!(busy(Store::initialize(Arc::new(EngineBacking::new(
        engine.clone(),
        file.clone()
    )))));
    assert!(start.elapsed() < p2pdma::store::CLAIM_WAIT);
    assert_eq!(first.size(id).unwrap(), 10_000);
    // Closed, the next open takes it, in another process as well.
    drop(first);
    {
        // A child holding an OFD lock over the store's first byte stands
        // for another process with the store open: nothing opens it.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import fcntl,os,struct,sys,time\n\
                 fd=os.open(sys.argv[1],os.O_RDWR)\n\
                 fcntl.fcntl(fd,37,struct.pack('hhqqi4x',fcntl.F_WRLCK,0,0,1,0))\n\
                 print('locked',flush=True)\n\
                 time.sleep(60)",
            ])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "locked");
        assert!(busy(Store::initialize(backing(&path))));
        // Killed, its file is closed and its claim gone.
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let again = Store::initialize(backing(&path)).unwrap();
    assert_eq!(again.size(id).unwrap(), 10_000);
}

#[test]
fn stores_on_disjoint_regions_of_one_file_open_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let engine = Arc::new(Engine::new(Config::default(), None));
    let file = Arc::new(StorageFile::open_rw(&path).unwrap());
    let region =
        |o, l| Arc::new(EngineBacking::region(engine.clone(), file.clone(), o, l).unwrap());
    let a = Store::format(region(0, 4 << 20), 16).unwrap();
    let b = Store::format(region(4 << 20, 4 << 20), 16).unwrap();
    // Another open of the file: its regions are taken.
    let other = Arc::new(StorageFile::open_rw(&path).unwrap());
    let start = std::time::Instant::now();
    assert!(busy(Store::initialize(Arc::new(
        EngineBacking::region(engine.clone(), other.clone(), 4 << 20, 4 << 20).unwrap()
    ))));
    assert!(start.elapsed() >= p2pdma::store::CLAIM_WAIT);
    drop(b);
    let b = Store::initialize(Arc::new(
        EngineBacking::region(engine.clone(), other, 4 << 20, 4 << 20).unwrap(),
    ))
    .unwrap();
    assert_eq!((a.get_object_map().len(), b.get_object_map().len()), (0, 0));
}
