//! Transfers between real files and the host-memory device, on the bounce
//! and direct paths, checked byte for byte.

use std::io::Write;

mod common;

use common::{engine, mem_bytes, pattern};
use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    transfer::{Engine, PathPref, StorageFile, TransferPath},
    Error, MemRange,
};

/// A file of `data` in the target directory (a filesystem with `O_DIRECT`),
/// removed when the returned path is dropped.
fn temp_file(name: &str, data: &[u8]) -> tempfile::TempPath {
    std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut f = tempfile::Builder::new()
        .prefix(&format!("transfer-{name}-"))
        .tempfile_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    f.write_all(data).unwrap();
    f.as_file().sync_all().unwrap();
    f.into_temp_path()
}

/// (file offset, memory offset, length): aligned, unaligned heads and
/// tails, inside one block, spanning many chunks.
const CASES: &[(u64, usize, usize)] = &[
    (0, 0, 1 << 20),
    (4096, 8192, 3 << 20),
    (1, 1, 1),
    (4095, 4095, 2),
    (100, 100, 4000),
    (123_457, 123_457, 2_500_001),
    (5000, 77, 300_000),
    (0, 0, 8 << 20),
    (7 << 20, 0, 1 << 20),
];

#[test]
fn reads_land_exactly_on_every_path() {
    let size = 8 << 20;
    let data = pattern(1, 0, size);
    let file = StorageFile::open(temp_file("read.bin", &data)).unwrap();
    for pref in [PathPref::Bounce, PathPref::P2p, PathPref::Auto] {
        for &(chunk, depth) in &[
            (None, None),
            (Some(64 << 10), Some(2)),
            (Some(4096), Some(1)),
        ] {
            let e = engine(pref, chunk, depth);
            for &(foff, moff, len) in CASES {
                let mem = HostMemory::new(moff + len + 4096).unwrap();
                mem.write_at(0, &vec![0xEE; mem.len()]).unwrap();
                let r = e
                    .read(&file, foff, MemRange::new(&mem, moff, len).unwrap())
                    .unwrap();
                assert_eq!(r.bytes, len as u64);
                let want = &data[foff as usize..foff as usize + len];
                assert!(
                    mem_bytes(&mem, moff, len) == want,
                    "{pref:?} {chunk:?}/{depth:?} read {foff}+{len} -> {moff}"
                );
                assert!(
                    mem_bytes(&mem, 0, moff).iter().all(|&b| b == 0xEE),
                    "wrote before the range"
                );
                let after = mem.len() - moff - len;
                assert!(
                    mem_bytes(&mem, moff + len, after)
                        .iter()
                        .all(|&b| b == 0xEE),
                    "wrote past the range"
                );
            }
        }
    }
}

#[test]
fn auto_on_host_memory_goes_direct_and_says_why() {
    let data = pattern(2, 0, 1 << 20);
    let path = temp_file("auto.bin", &data);
    let file = StorageFile::open_rw(&path).unwrap();
    let mem = HostMemory::new(2 << 20).unwrap();
    let e = engine(PathPref::Auto, None, None);
    let h = e.handle(&file, &mem).unwrap();
    assert_eq!(h.path(), TransferPath::Direct);
    assert!(
        h.reason().contains("straight into it by O_DIRECT"),
        "{}",
        h.reason()
    );

    // Aligned, and with partial blocks at both ends whose file and memory
    // offsets align together: the direct path, no staging copy.
    for (off, moff, len) in [(0u64, 0usize, 65536usize), (4196, 100, 300_001)] {
        let before = e.stats().direct.snapshot();
        let r = h.read(off, moff, len).unwrap();
        assert_eq!((r.path, r.retried), (TransferPath::Direct, false));
        assert_eq!(
            mem_bytes(&mem, moff, len),
            &data[off as usize..off as usize + len]
        );
        let s = e.stats().direct.snapshot();
        assert_eq!(
            (s.bytes - before.bytes, s.transfers - before.transfers),
            (len as u64, 1)
        );
    }
    assert_eq!(e.stats().bounce.snapshot().transfers, 0);

    // Offsets that cannot align together: the bounce pipeline at once, not
    // a failed try first.
    let r = h.read(4096, 1, 512 << 10).unwrap();
    assert_eq!((r.path, r.retried), (TransferPath::Bounce, false));
    assert_eq!(
        mem_bytes(&mem, 1, 512 << 10),
        &data[4096..4096 + (512 << 10)]
    );
    assert_eq!(e.stats().direct.snapshot().retries, 0);
    assert_eq!(e.stats().bounce.snapshot().transfers, 1);

    // Writes go direct too, with pwrite semantics around them.
    let src = pattern(5, 0, 200_000);
    mem.write_at(7, &src).unwrap();
    let r = h.write(8199, 7, src.len()).unwrap();
    assert_eq!(r.path, TransferPath::Direct);
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk.len(), data.len());
    assert!(on_disk[..8199] == data[..8199]);
    assert!(on_disk[8199..8199 + src.len()] == src[..]);
    assert!(on_disk[8199 + src.len()..] == data[8199 + src.len()..]);
}

#[test]
fn p2p_with_misaligned_offsets_is_retried_on_the_bounce_path_and_counted() {
    let data = pattern(3, 0, 1 << 20);
    let file = StorageFile::open(temp_file("retry.bin", &data)).unwrap();
    let mem = HostMemory::new(2 << 20).unwrap();
    let e = engine(PathPref::P2p, None, None);
    // File offset 4096 and memory offset 1 cannot both be block aligned.
    let r = e
        .read(&file, 4096, MemRange::new(&mem, 1, 512 << 10).unwrap())
        .unwrap();
    assert!(r.retried);
    assert_eq!(r.path, TransferPath::Bounce);
    assert_eq!(
        mem_bytes(&mem, 1, 512 << 10),
        &data[4096..4096 + (512 << 10)]
    );
    assert_eq!(e.stats().p2p.snapshot().retries, 1);
    assert_eq!(e.stats().bounce.snapshot().transfers, 1);
}

#[test]
fn writes_land_exactly_and_keep_the_rest_of_the_file() {
    let size = 6 << 20;
    let orig = pattern(4, 0, size);
    for pref in [PathPref::Bounce, PathPref::P2p] {
        for &(chunk, depth) in &[(None, None), (Some(8192), Some(2))] {
            let path = temp_file(&format!("write-{pref:?}-{chunk:?}.bin"), &orig);
            let file = StorageFile::open_rw(&path).unwrap();
            let e = engine(pref, chunk, depth);
            let mut expect = orig.clone();
            for (i, &(foff, moff, len)) in CASES.iter().enumerate() {
                if foff as usize + len > size {
                    continue;
                }
                let mem = HostMemory::new(moff + len).unwrap();
                let src = pattern(100 + i as u64, 0, moff + len);
                mem.write_at(0, &src).unwrap();
                e.write(&file, foff, MemRange::new(&mem, moff, len).unwrap())
                    .unwrap();
                expect[foff as usize..foff as usize + len].copy_from_slice(&src[moff..moff + len]);
            }
            drop(file);
            let got = std::fs::read(&path).unwrap();
            assert_eq!(got.len(), size, "{pref:?}: file size changed");
            assert!(got == expect, "{pref:?} {chunk:?}: file content differs");
        }
    }
}

#[test]
fn a_write_past_the_end_extends_the_file_by_exactly_the_data() {
    let path = temp_file("extend.bin", &pattern(5, 0, 10_000));
    let file = StorageFile::open_rw(&path).unwrap();
    let mem = HostMemory::new(8192).unwrap();
    mem.write_at(0, &pattern(6, 0, 8192)).unwrap();
    let e = engine(PathPref::Bounce, None, None);
    e.write(&file, 9_000, MemRange::new(&mem, 0, 5_000).unwrap())
        .unwrap();
    drop(file);
    let got = std::fs::read(&path).unwrap();
    assert_eq!(got.len(), 14_000);
    assert_eq!(&got[..9_000], &pattern(5, 0, 9_000)[..]);
    assert_eq!(&got[9_000..], &pattern(6, 0, 5_000)[..]);
}

#[test]
fn a_read_past_the_end_is_an_end_of_file_error_not_success() {
    let path = temp_file("short.bin", &pattern(7, 0, 10_000));
    let file = StorageFile::open(&path).unwrap();
    let mem = HostMemory::new(65536).unwrap();
    let e = engine(PathPref::Bounce, None, None);
    match e.read(&file, 8_000, MemRange::new(&mem, 0, 4_000).unwrap()) {
        Err(Error::EndOfFile {
            offset, len, size, ..
        }) => assert_eq!((offset, len, size), (8_000, 4_000, 10_000)),
        other => panic!("expected an end-of-file error, got {other:?}"),
    }
    // Bytes appended after the file was opened are there to read.
    let more = pattern(7, 10_000, 3_000);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(&more))
        .unwrap();
    e.read(&file, 8_000, MemRange::new(&mem, 0, 4_000).unwrap())
        .unwrap();
    assert_eq!(
        mem_bytes(&mem, 0, 4_000),
        pattern(7, 0, 13_000)[8_000..12_000]
    );
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let file = StorageFile::open(temp_file("bad.bin", &pattern(8, 0, 4096))).unwrap();
    let mem = HostMemory::new(4096).unwrap();
    let e = engine(PathPref::Auto, None, None);
    // A range outside the memory is refused as it is made.
    assert!(matches!(
        MemRange::new(&mem, 1, 4096),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        MemRange::new(&mem, usize::MAX, 2),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        e.read(&file, u64::MAX, MemRange::new(&mem, 0, 2).unwrap()),
        Err(Error::InvalidArgument(_))
    ));
    let w = engine(PathPref::NvmeCmd, None, None);
    assert!(matches!(
        w.read(&file, 0, MemRange::new(&mem, 0, 10).unwrap()),
        Err(Error::PathUnavailable { .. })
    ));
    // The queues path reaches only a namespace this process drives.
    let q = engine(PathPref::Queues, None, None);
    match q.read(&file, 0, MemRange::new(&mem, 0, 10).unwrap()) {
        Err(Error::PathUnavailable {
            path: "queues",
            reason,
        }) => {
            assert!(reason.contains("StorageFile::namespace"), "{reason}")
        }
        r => panic!("the queues path on a kernel file gave {r:?}"),
    }
    assert!(matches!(
        StorageFile::open("/nonexistent/file"),
        Err(Error::Io { .. })
    ));
    // A zero-length transfer moves nothing and succeeds.
    assert_eq!(
        e.read(&file, 0, MemRange::new(&mem, 0, 0).unwrap())
            .unwrap()
            .bytes,
        0
    );
}

#[test]
fn transfers_from_many_threads_share_one_engine() {
    let data = pattern(9, 0, 4 << 20);
    let file = StorageFile::open(temp_file("threads.bin", &data)).unwrap();
    let e = engine(PathPref::Bounce, Some(64 << 10), Some(4));
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (e, file, data) = (&e, &file, &data);
            s.spawn(move || {
                for i in 0..8usize {
                    let off = ((t * 8 + i) * 100_003) % (3 << 20);
                    let len = 500_000;
                    let mem = HostMemory::new(len).unwrap();
                    e.read(file, off as u64, MemRange::new(&mem, 0, len).unwrap())
                        .unwrap();
                    assert!(mem_bytes(&mem, 0, len) == data[off..off + len]);
                }
            });
        }
    });
    assert_eq!(e.stats().bounce.snapshot().transfers, 32);
}

mod asynchronous {
    use super::*;
    use p2pdma::transfer::{Direction, Request};
    use std::{
        future::Future,
        sync::Arc,
        task::{Context, Poll, Wake, Waker},
        thread::Thread,
    };

    struct ThreadWaker(Thread);

    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    /// Memory that records which threads wrote it, by id and name.
    #[derive(Debug)]
    struct Writers(
        HostMemory,
        std::sync::Mutex<Vec<(std::thread::ThreadId, String)>>,
    );

    impl p2pdma::memory::DeviceMemory for Writers {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn kind(&self) -> p2pdma::memory::MemoryKind {
            self.0.kind()
        }
        fn write_at(&self, offset: usize, src: &[u8]) -> p2pdma::Result<()> {
            let t = std::thread::current();
            let name = t.name().unwrap_or("").to_string();
            self.1.lock().unwrap().push((t.id(), name));
            self.0.write_at(offset, src)
        }
        fn read_at(&self, offset: usize, dst: &mut [u8]) -> p2pdma::Result<()> {
            self.0.read_at(offset, dst)
        }
    }

    #[test]
    fn a_deferred_read_runs_on_its_waiter_or_on_a_worker_once_polled() {
        let data = pattern(21, 0, 1 << 20);
        let file = Arc::new(StorageFile::open(temp_file("deferred.bin", &data)).unwrap());
        let e = engine(PathPref::Bounce, Some(64 << 10), Some(2));
        let mem = Arc::new(Writers(
            HostMemory::new(1 << 20).unwrap(),
            Default::default(),
        ));
        let req = |off: u64, len: usize| Request {
            dir: Direction::Read,
            file: file.clone(),
            file_offset: off,
            mem: mem.clone(),
            mem_offset: 0,
            len,
        };
        // Waited for: it ran on this thread, no worker touched it (the
        // bounce path's own copy threads may have).
        let worker = |w: &(std::thread::ThreadId, String)| w.1.starts_with("p2pdma-io");
        let t = e.submit_deferred(req(4099, 300_000));
        assert_eq!(t.wait().unwrap().bytes, 300_000);
        let me = std::thread::current().id();
        assert!(!mem.1.lock().unwrap().iter().any(worker));
        assert!(mem_bytes(&mem.0, 0, 300_000) == data[4099..4099 + 300_000]);
        // Polled: a worker runs it.
        mem.1.lock().unwrap().clear();
        let t = e.submit_deferred(req(77, 200_000));
        assert!(t.poll().is_none() || t.is_done());
        assert!(t.wait_done(None));
        assert_eq!(t.poll().unwrap().unwrap().bytes, 200_000);
        assert!(mem.1.lock().unwrap().iter().all(|w| w.0 != me));
        assert!(mem_bytes(&mem.0, 0, 200_000) == data[77..77 + 200_000]);
        // Dropped before either: it never runs.
        mem.1.lock().unwrap().clear();
        drop(e.submit_deferred(req(0, 100_000)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(mem.1.lock().unwrap().is_empty());
    }

    /// A minimal executor: polls the future, parking between wake-ups.
    fn block_on<F: Future>(f: F) -> F::Output {
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    #[test]
    fn a_batch_of_reads_lands_every_piece() {
        let data = pattern(20, 0, 7 << 20);
        let file = Arc::new(StorageFile::open(temp_file("batch.bin", &data)).unwrap());
        let mem: Arc<dyn DeviceMemory> = Arc::new(HostMemory::new(7 << 20).unwrap());
        let e = Arc::new(engine(PathPref::Auto, Some(256 << 10), Some(4)));
        // 48 pieces of 128 KiB + 1 byte, disjoint, submitted out of order.
        let piece = (128 << 10) + 1;
        let reqs: Vec<Request> = (0..48usize)
            .map(|i| (i * 29) % 48)
            .map(|i| Request {
                dir: Direction::Read,
                file: file.clone(),
                file_offset: (i * piece) as u64,
                mem: mem.clone(),
                mem_offset: i * piece,
                len: piece,
            })
            .collect();
        let tickets = e.submit_batch(reqs);
        for r in Engine::wait_all(&tickets) {
            assert_eq!(r.unwrap().bytes, piece as u64);
        }
        let mut got = vec![0u8; 48 * piece];
        mem.read_at(0, &mut got).unwrap();
        assert!(got == data[..48 * piece]);
        assert!(tickets.iter().all(|t| t.is_done()));
        // A result is handed out once.
        assert!(tickets[0].poll().unwrap().is_err());
    }

    #[test]
    fn submit_then_poll_or_await() {
        let data = pattern(21, 0, 2 << 20);
        let file = Arc::new(StorageFile::open(temp_file("await.bin", &data)).unwrap());
        let mem: Arc<dyn DeviceMemory> = Arc::new(HostMemory::new(2 << 20).unwrap());
        let e = Arc::new(engine(PathPref::Bounce, None, None));
        let req = |off: usize, len: usize| Request {
            dir: Direction::Read,
            file: file.clone(),
            file_offset: off as u64,
            mem: mem.clone(),
            mem_offset: off,
            len,
        };
        let t = e.submit(req(0, 1 << 20));
        let r = loop {
            if let Some(r) = t.poll() {
                break r;
            }
            std::thread::yield_now();
        };
        assert_eq!(r.unwrap().path, TransferPath::Bounce);
        let r = block_on(e.submit(req(1 << 20, 1 << 20))).unwrap();
        assert_eq!(r.bytes, 1 << 20);
        let mut got = vec![0u8; 2 << 20];
        mem.read_at(0, &mut got).unwrap();
        assert!(got == data);
        // A bad request fails in its ticket, without panicking anything.
        let bad = e.submit(req(2 << 20, 1));
        assert!(matches!(bad.wait(), Err(Error::OutOfBounds { .. })));
    }

    #[test]
    fn async_writes_reach_the_file() {
        let path = temp_file("asyncwrite.bin", &vec![0u8; 1 << 20]);
        let file = Arc::new(StorageFile::open_rw(&path).unwrap());
        let src = pattern(22, 0, 1 << 20);
        let m = HostMemory::new(1 << 20).unwrap();
        m.write_at(0, &src).unwrap();
        let mem: Arc<dyn DeviceMemory> = Arc::new(m);
        let e = Arc::new(engine(PathPref::Auto, Some(64 << 10), Some(2)));
        let tickets = e.submit_batch((0..16usize).map(|i| Request {
            dir: Direction::Write,
            file: file.clone(),
            file_offset: (i << 16) as u64,
            mem: mem.clone(),
            mem_offset: i << 16,
            len: 1 << 16,
        }));
        for r in Engine::wait_all(&tickets) {
            r.unwrap();
        }
        assert!(std::fs::read(&path).unwrap() == src);
    }
}

/// Memory whose copies panic: a broken `DeviceMemory` implementation.
#[derive(Debug)]
struct PanickingMemory;

impl DeviceMemory for PanickingMemory {
    fn len(&self) -> usize {
        1 << 20
    }
    fn kind(&self) -> p2pdma::memory::MemoryKind {
        p2pdma::memory::MemoryKind::Host
    }
    fn write_at(&self, _: usize, _: &[u8]) -> p2pdma::Result<()> {
        panic!("copy into memory failed badly")
    }
    fn read_at(&self, _: usize, _: &mut [u8]) -> p2pdma::Result<()> {
        panic!("copy out of memory failed badly")
    }
}

#[test]
fn a_panicking_transfer_completes_its_ticket_with_an_error() {
    use std::sync::Arc;

    use p2pdma::transfer::{Direction, Request};

    let file = Arc::new(StorageFile::open(temp_file("panic.bin", &pattern(9, 0, 65536))).unwrap());
    let e = Arc::new(engine(PathPref::Bounce, None, None));
    let bad: Arc<dyn DeviceMemory> = Arc::new(PanickingMemory);
    let good: Arc<dyn DeviceMemory> = Arc::new(HostMemory::new(65536).unwrap());
    let req = |mem: &Arc<dyn DeviceMemory>| Request {
        dir: Direction::Read,
        file: file.clone(),
        file_offset: 0,
        mem: mem.clone(),
        mem_offset: 0,
        len: 65536,
    };
    // A ticket left incomplete would hang `wait`: poll, with a deadline.
    let finish = |t: &p2pdma::transfer::Ticket| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(r) = t.poll() {
                return r;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the ticket never completed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    };
    // More panics than workers: none may take a worker down with it.
    let tickets = e.submit_batch((0..8).map(|_| req(&bad)));
    for t in &tickets {
        match finish(t) {
            Err(Error::Panicked(what)) => assert!(what.contains("failed badly"), "{what}"),
            other => panic!("expected a panic reported as an error, got {other:?}"),
        }
    }
    let t = e.submit(req(&good));
    assert_eq!(finish(&t).unwrap().bytes, 65536);
    let mut got = vec![0u8; 65536];
    good.read_at(0, &mut got).unwrap();
    assert_eq!(got, pattern(9, 0, 65536));
}

#[test]
fn writes_update_the_files_mtime_and_ctime_on_every_path() {
    use std::os::unix::fs::MetadataExt;

    for pref in [PathPref::Bounce, PathPref::P2p] {
        let path = temp_file(&format!("mtime-{pref}.bin"), &pattern(10, 0, 65536));
        let old = std::fs::metadata(&path).unwrap();
        // Timestamps have the kernel's tick as granularity: set them back.
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(past)
            .unwrap();
        let before = std::fs::metadata(&path).unwrap();
        assert!(before.mtime() < old.mtime());
        let file = StorageFile::open_rw(&path).unwrap();
        let mem = HostMemory::new(65536).unwrap();
        mem.write_at(0, &pattern(11, 0, 65536)).unwrap();
        let e = engine(pref, None, None);
        // An aligned middle and unaligned edges.
        e.write(&file, 100, MemRange::new(&mem, 100, 20_000).unwrap())
            .unwrap();
        let after = std::fs::metadata(&path).unwrap();
        assert!(after.mtime() > before.mtime(), "{pref}: mtime not updated");
        assert!(
            (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
            "{pref}: ctime not updated"
        );
    }
}

#[test]
fn a_malformed_volume_path_is_refused_before_anything_is_taken() {
    for (path, says) in [
        ("volume:12Q:/dev/nvme0n1", "sizes '12Q'"),
        ("volume:64K", "no members"),
        ("volume:64K:nvme0n1", "member 'nvme0n1'"),
    ] {
        match StorageFile::open(path) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(says), "{path}: {m}"),
            other => panic!("{path}: {other:?}"),
        }
    }
}
