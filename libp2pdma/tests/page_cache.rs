//! Reads take what the page cache already holds from it: how many bytes
//! came from where, the caller's preference either way, memory with and
//! without a CPU mapping, and no stale bytes after writes.

use std::{fs::File, num::NonZeroU64, os::unix::fs::FileExt, sync::Mutex};

mod common;

use common::{pattern, scratch_dir};
use p2pdma::{
    memory::{DeviceMemory, HostMemory, MemoryKind},
    transfer::{Config, Engine, PageCache, StorageFile},
    Error, MemRange, Result,
};

const MIB: usize = 1 << 20;

fn engine(page_cache: PageCache) -> Engine {
    Engine::new(
        Config {
            page_cache,
            ..Config::default()
        },
        None,
    )
}

/// Drops the file's pages from the page cache (written back first: dirty
/// pages stay), and waits until none of the range is resident: a page still
/// in another CPU's batch of new pages survives `POSIX_FADV_DONTNEED`,
/// which drains only its own CPU's, so the advice is given again until
/// the range is gone (at most 10 s).
fn forget(f: &File, off: u64, len: u64) {
    use std::os::fd::AsFd;
    f.sync_data().unwrap();
    for _ in 0..1000 {
        rustix::fs::fadvise(f, off, NonZeroU64::new(len), rustix::fs::Advice::DontNeed).unwrap();
        if p2pdma::sys::file::resident_pages(f.as_fd(), off, len).unwrap() == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("pages of [{off}, {}) stay in the page cache", off + len);
}

/// Memory reached only through its copies (a GPU's, say): no CPU mapping.
#[derive(Debug)]
struct CopiesOnly(Mutex<Vec<u8>>);

impl DeviceMemory for CopiesOnly {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Dmabuf
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        let mut v = self.0.lock().unwrap();
        let end = offset
            .checked_add(src.len())
            .filter(|&e| e <= v.len())
            .ok_or_else(|| Error::InvalidArgument("out of range".into()))?;
        v[offset..end].copy_from_slice(src);
        Ok(())
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let v = self.0.lock().unwrap();
        let end = offset
            .checked_add(dst.len())
            .filter(|&e| e <= v.len())
            .ok_or_else(|| Error::InvalidArgument("out of range".into()))?;
        dst.copy_from_slice(&v[offset..end]);
        Ok(())
    }
}

fn bytes(m: &dyn DeviceMemory, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    m.read_at(off, &mut v).unwrap();
    v
}

struct Case {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    other: File,
    data: Vec<u8>,
}

fn case(name: &str, len: usize) -> Case {
    let dir = scratch_dir(name);
    let path = dir.path().join("data.bin");
    let data = pattern(7, 0, len);
    std::fs::write(&path, &data).unwrap();
    let other = File::options().read(true).write(true).open(&path).unwrap();
    Case {
        _dir: dir,
        path,
        other,
        data,
    }
}

#[test]
fn cached_bytes_come_from_the_page_cache_and_the_rest_from_the_device() {
    let c = case("page-cache-split", 8 * MIB);
    let f = StorageFile::open(&c.path).unwrap();
    let mems: [Box<dyn DeviceMemory>; 2] = [
        Box::new(HostMemory::new(8 * MIB).unwrap()),
        Box::new(CopiesOnly(Mutex::new(vec![0; 8 * MIB]))),
    ];
    for mem in &mems {
        let e = engine(PageCache::Auto);
        // All of it cached (read by another reader).
        let mut all = vec![0u8; 8 * MIB];
        c.other.read_exact_at(&mut all, 0).unwrap();
        let r = e
            .read(&f, 0, MemRange::new(mem.as_ref(), 0, 8 * MIB).unwrap())
            .unwrap();
        assert_eq!(r.page_cache, 8 * MIB as u64, "{:?}", mem.kind());
        assert!(bytes(mem.as_ref(), 0, 8 * MIB) == c.data);
        assert_eq!(e.stats().page_cache.snapshot().bytes, 8 * MIB as u64);

        // None of it.
        forget(&c.other, 0, 8 * MIB as u64);
        mem.write_at(0, &vec![0xA5; 8 * MIB]).unwrap();
        let r = e
            .read(
                &f,
                100,
                MemRange::new(mem.as_ref(), 100, 8 * MIB - 200).unwrap(),
            )
            .unwrap();
        assert_eq!(r.page_cache, 0);
        assert!(bytes(mem.as_ref(), 100, 8 * MIB - 200) == c.data[100..8 * MIB - 100]);

        // Two MiB in the middle, warmed by another reader.
        forget(&c.other, 0, 8 * MIB as u64);
        let mut warm = vec![0u8; 2 * MIB];
        c.other.read_exact_at(&mut warm, 3 * MIB as u64).unwrap();
        let warm_pages = {
            let r = e
                .read(
                    &f,
                    3 * MIB as u64,
                    MemRange::new(mem.as_ref(), 0, 2 * MIB).unwrap(),
                )
                .unwrap();
            r.page_cache
        };
        assert_eq!(warm_pages, 2 * MIB as u64);
        forget(&c.other, 0, 3 * MIB as u64);
        forget(&c.other, 5 * MIB as u64, 3 * MIB as u64);
        mem.write_at(0, &vec![0xA5; 8 * MIB]).unwrap();
        let r = e
            .read(&f, 1, MemRange::new(mem.as_ref(), 1, 8 * MIB - 1).unwrap())
            .unwrap();
        assert!(
            r.page_cache >= 2 * MIB as u64 && r.page_cache < 8 * MIB as u64 - 1,
            "{} bytes from the page cache",
            r.page_cache
        );
        assert!(bytes(mem.as_ref(), 1, 8 * MIB - 1) == c.data[1..]);
    }
}

#[test]
fn the_caller_forces_either_way() {
    let c = case("page-cache-prefs", 2 * MIB);
    let f = StorageFile::open(&c.path).unwrap();
    let mem = HostMemory::new(2 * MIB).unwrap();
    // Cached, but the device asked for.
    let r = engine(PageCache::Direct)
        .read(&f, 0, MemRange::new(&mem, 0, 2 * MIB).unwrap())
        .unwrap();
    assert_eq!(r.page_cache, 0);
    assert!(bytes(&mem, 0, 2 * MIB) == c.data);
    // Not cached, but the page cache asked for.
    forget(&c.other, 0, 2 * MIB as u64);
    mem.write_at(0, &vec![0; 2 * MIB]).unwrap();
    let r = engine(PageCache::Buffered)
        .read(&f, 5, MemRange::new(&mem, 5, 2 * MIB - 5).unwrap())
        .unwrap();
    assert_eq!(r.page_cache, 2 * MIB as u64 - 5);
    assert!(bytes(&mem, 5, 2 * MIB - 5) == c.data[5..]);
    // Per call: a handle of an engine that uses the page cache, told not
    // to, and the other way round.
    let mut all = vec![0u8; 2 * MIB];
    c.other.read_exact_at(&mut all, 0).unwrap();
    let auto = engine(PageCache::Auto);
    let h = auto.handle(&f, &mem).unwrap();
    assert_eq!(h.read(0, 0, MIB).unwrap().page_cache, MIB as u64);
    let h = h.with_page_cache(PageCache::Direct);
    assert_eq!(h.read(0, 0, MIB).unwrap().page_cache, 0);
    forget(&c.other, 0, 2 * MIB as u64);
    let direct = engine(PageCache::Direct);
    let h = direct
        .handle(&f, &mem)
        .unwrap()
        .with_page_cache(PageCache::Buffered);
    assert_eq!(h.read(7, 7, MIB).unwrap().page_cache, MIB as u64);
    assert!(bytes(&mem, 7, MIB) == c.data[7..MIB + 7]);
    assert_eq!("direct".parse::<PageCache>().unwrap(), PageCache::Direct);
    assert!("sometimes".parse::<PageCache>().is_err());
}

#[test]
fn a_read_after_a_write_sees_the_write_whatever_was_cached() {
    let c = case("page-cache-write", 4 * MIB);
    let f = StorageFile::open_rw(&c.path).unwrap();
    let mem = HostMemory::new(4 * MIB).unwrap();
    let e = engine(PageCache::Auto);
    let r = e
        .read(&f, 0, MemRange::new(&mem, 0, 4 * MIB).unwrap())
        .unwrap();
    assert_eq!(r.page_cache, 4 * MIB as u64);
    // Overwrite an unaligned range through the engine (O_DIRECT middle,
    // page-cache edges).
    let new = pattern(99, 12345, MIB + 777);
    mem.write_at(0, &new).unwrap();
    e.write(&f, 12345, MemRange::new(&mem, 0, new.len()).unwrap())
        .unwrap();
    let mut want = c.data.clone();
    want[12345..12345 + new.len()].copy_from_slice(&new);
    // The engine (warm) and a buffered reader see the new bytes.
    mem.write_at(0, &vec![0; 4 * MIB]).unwrap();
    e.read(&f, 0, MemRange::new(&mem, 0, 4 * MIB).unwrap())
        .unwrap();
    assert!(bytes(&mem, 0, 4 * MIB) == want);
    let mut other = vec![0u8; 4 * MIB];
    c.other.read_exact_at(&mut other, 0).unwrap();
    assert!(other == want);
    // Another writer through the page cache, then a warm read.
    c.other.write_all_at(&[0xEE; 5000], 3 * MIB as u64).unwrap();
    want[3 * MIB..3 * MIB + 5000].fill(0xEE);
    e.read(&f, 0, MemRange::new(&mem, 0, 4 * MIB).unwrap())
        .unwrap();
    assert!(bytes(&mem, 0, 4 * MIB) == want);
}

#[test]
fn a_cached_read_past_the_end_is_an_error_not_a_short_success() {
    let c = case("page-cache-eof", MIB + 100);
    let f = StorageFile::open(&c.path).unwrap();
    let mem = HostMemory::new(2 * MIB).unwrap();
    for pref in [PageCache::Auto, PageCache::Buffered, PageCache::Direct] {
        let e = engine(pref);
        // Twice: the second read starts from a warm file.
        for _ in 0..2 {
            match e.read(&f, MIB as u64, MemRange::new(&mem, 0, 200).unwrap()) {
                Err(Error::EndOfFile { size, .. }) => assert_eq!(size, MIB as u64 + 100),
                other => panic!("{pref}: {other:?}"),
            }
            let r = e
                .read(&f, MIB as u64, MemRange::new(&mem, 0, 100).unwrap())
                .unwrap();
            assert_eq!(bytes(&mem, 0, 100), c.data[MIB..]);
            assert_eq!(r.bytes, 100);
        }
    }
}

#[test]
fn small_reads_of_a_warm_file_are_served_at_once() {
    use p2pdma::transfer::{Direction, Request};
    let c = case("page-cache-now", 4 * MIB);
    let f = std::sync::Arc::new(StorageFile::open(&c.path).unwrap());
    let mem = std::sync::Arc::new(HostMemory::new(MIB).unwrap());
    let e = engine(PageCache::Auto);
    let mut all = vec![0u8; 4 * MIB];
    c.other.read_exact_at(&mut all, 0).unwrap();
    // A cold engine asks what is cached first; after a few reads found
    // everything cached, small reads go to the page cache at once.
    assert!(e
        .read_if_cached(&f, 0, MemRange::new(mem.as_ref(), 0, 4096).unwrap())
        .is_none());
    for i in 0..8u64 {
        e.read(&f, i * 8192, MemRange::new(mem.as_ref(), 0, 4096).unwrap())
            .unwrap();
    }
    let r = e
        .read_if_cached(&f, 12345, MemRange::new(mem.as_ref(), 100, 70000).unwrap())
        .unwrap();
    assert_eq!((r.bytes, r.page_cache), (70000, 70000));
    assert!(bytes(mem.as_ref(), 100, 70000) == c.data[12345..12345 + 70000]);
    // A background read of cached data is done when submitted.
    let t = e.submit(Request {
        dir: Direction::Read,
        file: f.clone(),
        file_offset: 3 * MIB as u64 + 1,
        mem: mem.clone(),
        mem_offset: 0,
        len: 5000,
    });
    let r = t.poll().expect("done at once").unwrap();
    assert_eq!(r.page_cache, 5000);
    assert!(bytes(mem.as_ref(), 0, 5000) == c.data[3 * MIB + 1..3 * MIB + 5001]);
    // Out of the page cache: not served now, and the next read finds out.
    forget(&c.other, 0, 4 * MIB as u64);
    assert!(e
        .read_if_cached(
            &f,
            2 * MIB as u64,
            MemRange::new(mem.as_ref(), 0, 4096).unwrap()
        )
        .is_none());
    let r = e
        .read(
            &f,
            2 * MIB as u64 + 8192,
            MemRange::new(mem.as_ref(), 0, 4096).unwrap(),
        )
        .unwrap();
    assert_eq!(r.page_cache, 0);
    assert!(bytes(mem.as_ref(), 0, 4096) == c.data[2 * MIB + 8192..2 * MIB + 12288]);
    // Bad arguments are not served now, and the read itself says why: a
    // range outside the memory is refused as it is made, and a file
    // offset whose end overflows by the read.
    assert!(matches!(
        MemRange::new(mem.as_ref(), MIB - 10, 4096),
        Err(p2pdma::Error::OutOfBounds { .. })
    ));
    let range = MemRange::new(mem.as_ref(), 0, 4096).unwrap();
    assert!(e.read_if_cached(&f, u64::MAX, range).is_none());
    assert!(e.read(&f, u64::MAX, range).is_err());
}
