//! GPU memory through the CUDA driver: `CudaMemory`'s copies and checks,
//! and the engine's bounce path into and out of it through host slots
//! page-locked for CUDA, every byte checked against the file.
//!
//! The tests run against the machine's driver where `P2PDMA_CUDA_REAL=1`
//! (a GPU machine), and otherwise against the host-memory driver of
//! `tests/cuda-emu`, whose counters then show how the bytes moved: by
//! asynchronous copies out of page-locked memory, registered once, never
//! from a thread without a context.

use std::{
    ffi::CString,
    io::Write,
    os::unix::ffi::OsStrExt,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
};

use cuda_emu::{Stats, StatsFns};
use p2pdma::{
    memory::{copy, CudaMemory, DeviceMemory, HostMemory, MemoryKind},
    store::{EngineBacking, PageCache, Store, WritePolicy},
    sys::cuda,
    transfer::{
        Config, Direction, End, Engine, HopKind, PathPref, Request, StorageFile, TransferPath,
    },
    Error, MemRange,
};

/// The emulator's counters, when the tests run on it.
static EMU: OnceLock<Option<StatsFns>> = OnceLock::new();
/// The tests that read the counters run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> (Option<StatsFns>, MutexGuard<'static, ()>) {
    let emu = *EMU.get_or_init(|| {
        if std::env::var_os("P2PDMA_CUDA_REAL").is_some() {
            return None;
        }
        let lib = cuda_emu::library();
        // Two emulated GPUs, for the copies between them.
        if std::env::var_os(cuda_emu::ENV_DEVICES).is_none() {
            std::env::set_var(cuda_emu::ENV_DEVICES, "2");
        }
        cuda::use_library(lib).unwrap();
        cuda::driver().unwrap();
        let c = CString::new(lib.as_os_str().as_bytes()).unwrap();
        // SAFETY: The driver loaded this library above; NOLOAD only finds it.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        assert!(!h.is_null(), "the emulator is not the loaded driver");
        // SAFETY: Symbols of the emulator, which is never unloaded.
        unsafe {
            let get = libc::dlsym(h, cuda_emu::GET_STATS.as_ptr());
            let reset = libc::dlsym(h, cuda_emu::RESET_STATS.as_ptr());
            assert!(!get.is_null() && !reset.is_null());
            Some(StatsFns::new(
                std::mem::transmute::<*mut libc::c_void, cuda_emu::GetStatsFn>(get),
                std::mem::transmute::<*mut libc::c_void, cuda_emu::ResetStatsFn>(reset),
            ))
        }
    });
    (emu, SERIAL.lock().unwrap_or_else(|p| p.into_inner()))
}

fn stats(emu: Option<StatsFns>) -> Option<Stats> {
    emu.map(|s| s.read().unwrap())
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn read_all(mem: &dyn DeviceMemory, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    mem.read_at(offset, &mut out).unwrap();
    out
}

#[test]
fn allocations_are_zeroed_copy_both_ways_and_check_ranges() {
    let (_emu, _g) = setup();
    let len = (3 << 20) + 5;
    let mem = CudaMemory::alloc(0, len).unwrap();
    assert!(matches!(mem.kind(), MemoryKind::Cuda { ordinal: 0, .. }));
    assert_eq!(mem.len(), len);
    assert!(read_all(&mem, 0, len).iter().all(|&b| b == 0), "not zeroed");
    let data = pattern(1, (1 << 20) + 3);
    mem.write_at(4097, &data).unwrap();
    assert!(read_all(&mem, 4097, data.len()) == data);
    assert!(read_all(&mem, 0, 4097).iter().all(|&b| b == 0));
    for (off, n) in [(len - 2, 3), (usize::MAX, 1), (len + 1, 0)] {
        assert!(
            matches!(
                mem.write_at(off, &vec![1; n]),
                Err(Error::OutOfBounds { .. })
            ),
            "{off}+{n}"
        );
    }
    assert!(read_all(&mem, len - 2, 2).iter().all(|&b| b == 0));
    assert!(CudaMemory::alloc(0, 0).is_err());
    let e = CudaMemory::alloc(99, 4096).unwrap_err();
    assert!(e.to_string().contains("no CUDA device 99"), "{e}");
}

#[test]
fn lent_memory_is_checked_with_the_driver() {
    let (_emu, _g) = setup();
    let owner = CudaMemory::alloc(0, 1 << 20).unwrap();
    let base = owner.device_ptr();
    // SAFETY: Pages of `owner`, which outlives the loan; nothing else uses
    // them.
    let lent = unsafe { CudaMemory::lend(base + 4096, 8192, ()) }.unwrap();
    let data = pattern(2, 8192);
    lent.write_at(0, &data).unwrap();
    assert!(
        read_all(&owner, 4096, 8192) == data,
        "the loan is not the owner's memory"
    );
    // SAFETY: Each of these is refused before anything is copied or
    // exported.
    unsafe {
        assert!(matches!(
            CudaMemory::lend(base + (1 << 20) - 4096, 8192, ()),
            Err(Error::OutOfBounds { .. })
        ));
        let host = vec![0u8; 4096];
        let e = CudaMemory::lend(host.as_ptr() as u64, 4096, ()).unwrap_err();
        assert!(e.to_string().contains("not CUDA device memory"), "{e}");
        assert!(CudaMemory::lend(base, 0, ()).is_err());
    }
}

fn file_with(data: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(data).unwrap();
    f.flush().unwrap();
    f
}

#[test]
fn the_engine_reads_and_writes_gpu_memory_through_page_locked_slots() {
    let (emu, _g) = setup();
    let data = pattern(3, (9 << 20) + 123);
    let f = file_with(&data);
    let file = StorageFile::open_rw(f.path()).unwrap();
    let engine = Engine::new(Config::default(), None);
    let mem = CudaMemory::alloc(0, 10 << 20).unwrap();
    let choice = engine.choose(&file, &mem).unwrap();
    assert_eq!(choice.path, TransferPath::Bounce);
    assert!(choice.reason.contains("page-locked"), "{}", choice.reason);

    let before = stats(emu);
    let cases = [
        (0u64, 0usize, data.len()),
        (4095, 3, (2 << 20) + 1),
        (7 << 20, 1 << 20, 12_345),
    ];
    for (off, moff, len) in cases {
        let r = engine
            .read(&file, off, MemRange::new(&mem, moff, len).unwrap())
            .unwrap();
        assert_eq!((r.path, r.bytes), (TransferPath::Bounce, len as u64));
        let got = read_all(&mem, moff, len);
        let want = &data[off as usize..off as usize + len];
        let i = got.iter().zip(want).position(|(a, b)| a != b);
        assert!(i.is_none(), "read {off}+{len} differs at byte {i:?}");
    }
    if let (Some(b), Some(a)) = (before, stats(emu)) {
        let d = a.since(&b);
        // Each chunk moved by an asynchronous copy out of page-locked
        // slots, registered once for the ring, never from a thread that
        // had no context.
        assert!(d.htod.async_calls > 0, "{d:?}");
        assert_eq!(
            d.htod.pageable_calls, 0,
            "a copy from pageable memory: {d:?}"
        );
        assert!(d.host_register >= 1, "{d:?}");
        assert_eq!(d.no_context, 0, "{d:?}");
    }
    // The same shape again: its ring's slots are already page-locked.
    let before = stats(emu);
    engine
        .read(
            &file,
            100,
            MemRange::new(&mem, 0, data.len() - 100).unwrap(),
        )
        .unwrap();
    if let (Some(b), Some(a)) = (before, stats(emu)) {
        let d = a.since(&b);
        assert_eq!(d.host_register, 0, "registered again: {d:?}");
        assert_eq!(d.htod.pageable_calls, 0, "{d:?}");
    }
    assert!(read_all(&mem, 0, data.len() - 100) == data[100..]);

    // Writes: from GPU memory to the file, pwrite semantics.
    let src = pattern(4, (5 << 20) + 77);
    mem.write_at(9, &src).unwrap();
    let before = stats(emu);
    engine
        .write(&file, 1001, MemRange::new(&mem, 9, src.len()).unwrap())
        .unwrap();
    if let (Some(b), Some(a)) = (before, stats(emu)) {
        let d = a.since(&b);
        assert!(d.dtoh.async_calls > 0, "{d:?}");
        assert_eq!(d.no_context, 0, "{d:?}");
    }
    let on_disk = std::fs::read(f.path()).unwrap();
    assert_eq!(on_disk.len(), data.len());
    assert!(on_disk[..1001] == data[..1001]);
    assert!(on_disk[1001..1001 + src.len()] == src[..]);
    assert!(on_disk[1001 + src.len()..] == data[1001 + src.len()..]);

    // Past the end: an error, nothing partial.
    let e = engine
        .read(
            &file,
            data.len() as u64 - 10,
            MemRange::new(&mem, 0, 20).unwrap(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::EndOfFile { .. }), "{e}");
}

#[test]
fn many_transfers_at_once_from_the_engines_workers() {
    let (emu, _g) = setup();
    let data = pattern(5, 16 << 20);
    let f = file_with(&data);
    let file = Arc::new(StorageFile::open(f.path()).unwrap());
    let config = Config {
        path: PathPref::Bounce,
        ..Config::default()
    };
    let engine = Engine::new(config, None);
    let mem: Arc<dyn DeviceMemory> = Arc::new(CudaMemory::alloc(0, 16 << 20).unwrap());
    let before = stats(emu);
    let reqs: Vec<Request> = (0..16u64)
        .map(|i| Request {
            dir: Direction::Read,
            file: file.clone(),
            file_offset: (i * 977_777) % (8 << 20),
            mem: mem.clone(),
            mem_offset: (i as usize) << 20,
            len: 700_000 + i as usize * 13,
        })
        .collect();
    for t in engine.submit_batch(reqs.clone()) {
        t.wait().unwrap();
    }
    for r in &reqs {
        let got = read_all(mem.as_ref(), r.mem_offset, r.len);
        let at = r.file_offset as usize;
        assert!(
            got == data[at..at + r.len],
            "request at {} differs",
            r.file_offset
        );
    }
    if let (Some(b), Some(a)) = (before, stats(emu)) {
        assert_eq!(a.since(&b).no_context, 0);
    }
}

#[test]
fn dma_buf_export_works_or_says_why() {
    let (_emu, _g) = setup();
    let mem = CudaMemory::alloc(0, 1 << 20).unwrap();
    match mem.export_dmabuf() {
        Ok((_, at)) => {
            assert_eq!(at, 0);
            assert!(mem.dma().and_then(|d| d.dmabuf()).is_some());
            // Where the exporter lets it be mapped: the CPU's copies land
            // where the driver's copies read.
            if let Ok(map) = mem.cpu_mapping() {
                let data = pattern(6, 10_000);
                map.write_at(333, &data).unwrap();
                assert!(read_all(&mem, 333, data.len()) == data);
                let mut back = vec![0u8; data.len()];
                map.read_at(333, &mut back).unwrap();
                assert!(back == data);
            }
        }
        Err(e) => {
            assert!(matches!(e, Error::PathUnavailable { .. }), "{e}");
            assert!(
                e.to_string().contains("cuMemGetHandleForAddressRange"),
                "{e}"
            );
            assert!(mem.dma().and_then(|d| d.dmabuf()).is_none());
            assert!(mem.cpu_mapping().is_err());
        }
    }
}

#[test]
#[allow(unsafe_code)]
fn copies_between_gpu_memory_and_a_cpu_mapping_are_one_driver_copy() {
    let (emu, _g) = setup();
    let len = (3 << 20) + 5;
    let host = HostMemory::new(2 * len + 8192).unwrap();
    let target = host.dma().and_then(|d| d.dma_target()).unwrap();
    let ctx = cuda::Context::primary(0).unwrap();
    let entered = ctx.enter().unwrap();
    // SAFETY: `host`'s mapping, unregistered below before it goes.
    unsafe { cuda::host_register(&entered, target.ptr, target.len) }.unwrap();
    let gpu = CudaMemory::alloc(0, len + 100).unwrap();
    let data = pattern(9, len);
    host.write_at(7, &data).unwrap();

    // Into GPU memory: the driver copies out of the mapping itself (the
    // mapping is page-locked here, so a staged copy would show as a copy
    // out of pageable memory).
    let before = stats(emu);
    p2pdma::memory::copy(&host, 7, &gpu, 11, len).unwrap();
    assert!(read_all(&gpu, 11, len) == data, "into GPU memory");
    if let (Some(b), Some(a)) = (before, stats(emu)) {
        let d = a.since(&b);
        assert_eq!(d.htod.pageable_calls, 0, "staged through a buffer: {d:?}");
        assert_eq!(d.htod.async_bytes, len as u64, "{d:?}");
    }

    // And out of it, into the mapping.
    let before = stats(emu);
    p2pdma::memory::copy(&gpu, 11, &host, len + 4099, len).unwrap();
    assert!(
        read_all(&host, len + 4099, len) == data,
        "out of GPU memory"
    );
    if let (Some(b), Some(a)) = (before, stats(emu)) {
        let d = a.since(&b);
        assert_eq!(d.dtoh.pageable_calls, 0, "staged through a buffer: {d:?}");
        assert_eq!(d.dtoh.async_bytes, len as u64, "{d:?}");
    }

    // Out of range on either side: an error, and nothing moves.
    let e = p2pdma::memory::copy(&host, 0, &gpu, 200, len).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    // SAFETY: Registered above; no copy uses it any more.
    unsafe { cuda::host_unregister(&entered, target.ptr) }.unwrap();
}

/// Bytes the host moved to or from GPU memory between two readings.
fn host_bytes(d: &Stats) -> u64 {
    d.htod.bytes() + d.dtoh.bytes()
}

#[test]
fn copies_between_gpu_memories_stay_on_the_gpus() {
    let (emu, _g) = setup();
    let len = (2 << 20) + 77;
    let a = CudaMemory::alloc(0, len + 8192).unwrap();
    let b = CudaMemory::alloc(0, len + 8192).unwrap();
    let data = pattern(21, len);
    a.write_at(5, &data).unwrap();

    // Within one GPU: one device-to-device copy, nothing through the host.
    let before = stats(emu);
    copy(&a, 5, &b, 4099, len).unwrap();
    if let (Some(x), Some(y)) = (before, stats(emu)) {
        let d = y.since(&x);
        assert_eq!(host_bytes(&d), 0, "{d:?}");
        assert_eq!((d.dtod.calls(), d.dtod.bytes()), (1, len as u64), "{d:?}");
    }
    assert!(read_all(&b, 4099, len) == data);
    assert!(read_all(&b, 0, 4099).iter().all(|&x| x == 0));

    // Overlapping ranges of one memory move as memmove would (through the
    // host: no device copy takes overlapping ranges), and the GPU copy
    // itself refuses them.
    let mut model = read_all(&a, 0, len + 8192);
    copy(&a, 5, &a, 1005, len).unwrap();
    model.copy_within(5..5 + len, 1005);
    assert!(read_all(&a, 0, len + 8192) == model);
    let e = a.copy_from(0, &a, 100, 4096).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Out of range: an error, and nothing moves.
    let e = copy(&a, 0, &b, 8192 + 1, len).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = b.copy_from(0, &a, len + 8192 - 10, 11).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    assert!(read_all(&b, 4099, len) == data);

    // Between two GPUs, where there are two: peer to peer (access enabled
    // on first use), both ways.
    if cuda::device_count().unwrap() < 2 {
        return;
    }
    let c = CudaMemory::alloc(1, len).unwrap();
    let before = stats(emu);
    copy(&b, 4099, &c, 0, len).unwrap();
    copy(&c, 0, &a, 3, len).unwrap();
    if let (Some(x), Some(y)) = (before, stats(emu)) {
        let d = y.since(&x);
        assert_eq!(host_bytes(&d), 0, "{d:?}");
        assert_eq!(d.peer.bytes(), 2 * len as u64, "{d:?}");
        assert_eq!(d.peer.pageable_calls, 0, "staged, not peer to peer: {d:?}");
    }
    assert!(read_all(&c, 0, len) == data);
    assert!(read_all(&a, 3, len) == data);

    // The engine's routes between GPU memories are one GPU copy.
    let engine = Engine::new(Config::default(), None);
    let route = engine
        .routes()
        .plan(
            End::Memory { mem: &c, offset: 0 },
            End::Memory { mem: &b, offset: 0 },
        )
        .unwrap();
    let kinds: Vec<_> = route.hops().iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HopKind::GpuCopy], "{route:?}");
}

/// A store on a 16 MiB file holding one object of `len` bytes of
/// `pattern(seed)`, written and flushed without a cache: its directory,
/// backing, the object's id and bytes.
fn stored_object(len: usize, seed: u64) -> (tempfile::TempDir, Arc<EngineBacking>, u64, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let engine = Arc::new(Engine::new(Config::default(), None));
    let file = Arc::new(StorageFile::open_rw(&path).unwrap());
    let backing = Arc::new(EngineBacking::new(engine, file));
    let data = pattern(seed, len);
    let store = Store::format(backing.clone(), 16).unwrap();
    let id = store.pcreate(len as u64).unwrap();
    let host = HostMemory::new(len).unwrap();
    host.write_at(0, &data).unwrap();
    store
        .pwrite(id, 0, MemRange::new(&host, 0, len).unwrap())
        .unwrap();
    store.flush().unwrap();
    (dir, backing, id, data)
}

#[test]
fn the_store_cache_in_gpu_memory_serves_hits_by_device_copies() {
    let (emu, _g) = setup();
    const PAGE: usize = 64 << 10;
    // The object written without a cache, so that every page is a miss
    // first.
    let len = 8 * PAGE + 4096;
    let (_dir, backing, id, data) = stored_object(len, 22);
    let two = cuda::device_count().unwrap() >= 2;
    let mut mems: Vec<Arc<dyn DeviceMemory>> =
        vec![Arc::new(CudaMemory::alloc(0, 16 * PAGE).unwrap())];
    if two {
        mems.push(Arc::new(CudaMemory::alloc(1, 16 * PAGE).unwrap()));
    }
    let cache = PageCache::shared(mems, PAGE, WritePolicy::WriteBack).unwrap();
    let store = Store::initialize(backing).unwrap().with_cache(cache);
    let buf = CudaMemory::alloc(0, len).unwrap();
    let (at, n) = (PAGE as u64 + 100, 5 * PAGE);
    let want = &data[at as usize..at as usize + n];

    // Misses: the pages come from storage into the frames (through host
    // slots: the GPU machine's bounce path), then by the GPU into the
    // caller's buffer.
    let before = stats(emu);
    store
        .pread(id, at, MemRange::new(&buf, 0, n).unwrap())
        .unwrap();
    let after = stats(emu);
    assert!(read_all(&buf, 0, n) == want, "after misses");
    if let (Some(x), Some(y)) = (before, after) {
        let d = y.since(&x);
        assert_eq!(d.dtoh.bytes(), 0, "{d:?}");
        assert!(d.htod.bytes() >= n as u64, "{d:?}");
        assert_eq!(d.dtod.bytes(), n as u64, "{d:?}");
    }
    // Hits: device-to-device copies alone.
    let hits = store.cache_stats().unwrap().hits;
    let before = stats(emu);
    store
        .pread(id, at, MemRange::new(&buf, 7, n).unwrap())
        .unwrap();
    let after = stats(emu);
    assert!(read_all(&buf, 7, n) == want, "after hits");
    if let (Some(x), Some(y)) = (before, after) {
        let d = y.since(&x);
        assert_eq!(host_bytes(&d), 0, "a hit crossed the host: {d:?}");
        assert_eq!(d.dtod.bytes(), n as u64, "{d:?}");
    }
    assert_eq!(store.cache_stats().unwrap().hits, hits + 6);

    // A write from GPU memory lands in a frame by the GPU, and reads back.
    let new = pattern(23, PAGE);
    let src = CudaMemory::alloc(0, PAGE).unwrap();
    src.write_at(0, &new).unwrap();
    let before = stats(emu);
    store
        .pwrite(id, 2 * PAGE as u64, MemRange::new(&src, 0, PAGE).unwrap())
        .unwrap();
    if let (Some(x), Some(y)) = (before, stats(emu)) {
        let d = y.since(&x);
        assert_eq!(host_bytes(&d), 0, "{d:?}");
    }
    let mut model = data.clone();
    model[2 * PAGE..3 * PAGE].copy_from_slice(&new);

    // The second GPU reads the pages the first holds from its frames, peer
    // to peer, not from storage.
    if two {
        let other = CudaMemory::alloc(1, len).unwrap();
        let before = stats(emu);
        store
            .pread(id, 0, MemRange::new(&other, 0, len).unwrap())
            .unwrap();
        let after = stats(emu);
        assert!(read_all(&other, 0, len) == model, "on the second GPU");
        if let (Some(x), Some(y)) = (before, after) {
            let d = y.since(&x);
            assert!(d.peer.bytes() >= 5 * PAGE as u64, "{d:?}");
            assert_eq!(d.peer.pageable_calls, 0, "{d:?}");
        }
        let remote = store.cache_stats_on(1).unwrap().unwrap().remote;
        assert!(remote >= 5, "{remote}");
    }
    store.flush().unwrap();
    let host = HostMemory::new(len).unwrap();
    store
        .pread(id, 0, MemRange::new(&host, 0, len).unwrap())
        .unwrap();
    assert!(
        read_all(&host, 0, len) == model,
        "read back into host memory"
    );
}

/// A stream of CUDA device 0's, as a caller's: its raw handle, a wait for
/// it, and a way to hold it up (a host function that sleeps first), so
/// that what the test does next runs before the stream's later work.
struct TestStream {
    ctx: Arc<cuda::Context>,
    stream: cuda::Stream,
}

impl TestStream {
    fn new() -> Self {
        let ctx = cuda::Context::primary(0).unwrap();
        let stream = {
            let e = ctx.enter().unwrap();
            cuda::Stream::new(&e).unwrap()
        };
        Self { ctx, stream }
    }

    fn raw(&self) -> *mut std::ffi::c_void {
        self.stream.as_raw()
    }

    fn sync(&self) {
        let _e = self.ctx.enter().unwrap();
        self.stream.synchronize().unwrap();
    }

    #[allow(unsafe_code)]
    fn hold(&self) {
        unsafe extern "C" fn sleep(_: *mut std::ffi::c_void) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let e = self.ctx.enter().unwrap();
        // SAFETY: `sleep` calls no CUDA and takes no data.
        unsafe { cuda::launch_host_func(&e, self.raw(), sleep, std::ptr::null_mut()) }.unwrap();
    }
}

/// A store on `backing` with a cache of `frames` 64 KiB frames in GPU
/// memory (device 0).
fn gpu_cached(backing: Arc<EngineBacking>, frames: usize) -> Store {
    let mem = Arc::new(CudaMemory::alloc(0, frames * (64 << 10)).unwrap());
    let cache = PageCache::new(mem, 64 << 10, WritePolicy::WriteBack).unwrap();
    Store::initialize(backing).unwrap().with_cache(cache)
}

#[test]
#[allow(unsafe_code)]
fn stream_ordered_store_reads_land_in_stream_order_and_pin_their_frames() {
    let (emu, _g) = setup();
    const PAGE: usize = 64 << 10;
    let len = 16 * PAGE;
    let (_dir, backing, id, data) = stored_object(len, 24);
    // Four frames: a read of three pages pins three.
    let open = || gpu_cached(backing.clone(), 4);
    let store = open();
    let stream = TestStream::new();
    let buf = CudaMemory::alloc(0, 3 * PAGE).unwrap();
    let (at, n) = (100u64, 3 * PAGE - 200);
    let want = &data[at as usize..at as usize + n];

    // Misses are filled before the call returns; the copies out of the
    // frames land in the stream's order, with no host bytes for them.
    // SAFETY: `stream` is device 0's and `buf` outlives its work.
    unsafe { store.pread_on_stream(id, at, MemRange::new(&buf, 0, n).unwrap(), stream.raw()) }
        .unwrap();
    stream.sync();
    assert!(read_all(&buf, 0, n) == want, "after misses");
    let before = stats(emu);
    // The stream is held up first, so that the other readers below run
    // before its copies do.
    stream.hold();
    // SAFETY: As above.
    unsafe { store.pread_on_stream(id, at, MemRange::new(&buf, 7, n).unwrap(), stream.raw()) }
        .unwrap();
    // Other readers need frames meanwhile: three are pinned until the
    // stream has copied out of them, so these evict only the fourth, and
    // the stream's copies still read the pages they asked for.
    let host = HostMemory::new(PAGE).unwrap();
    for p in 8..16 {
        store
            .pread(
                id,
                (p * PAGE) as u64,
                MemRange::new(&host, 0, PAGE).unwrap(),
            )
            .unwrap();
        assert!(read_all(&host, 0, PAGE) == data[p * PAGE..(p + 1) * PAGE]);
    }
    stream.sync();
    let after = stats(emu);
    assert!(
        read_all(&buf, 7, n) == want,
        "after hits, with evictions around"
    );
    if let (Some(x), Some(y)) = (before, after) {
        let d = y.since(&x);
        assert!(d.dtod.async_bytes >= n as u64, "{d:?}");
    }

    // Refused: a buffer in host memory, a range past the object's end, a
    // store without a cache.
    let host3 = HostMemory::new(PAGE).unwrap();
    // SAFETY: Refused before anything is queued.
    let e = unsafe {
        store.pread_on_stream(id, 0, MemRange::new(&host3, 0, PAGE).unwrap(), stream.raw())
    }
    .unwrap_err();
    assert!(e.to_string().contains("GPU memory"), "{e}");
    // SAFETY: As above.
    let e = unsafe {
        store.pread_on_stream(
            id,
            (len - 10) as u64,
            MemRange::new(&buf, 0, PAGE).unwrap(),
            stream.raw(),
        )
    }
    .unwrap_err();
    assert!(!matches!(e, Error::Cuda { .. }), "{e}");
    drop(store);

    // Dropping the store waits for the stream's copies out of its frames.
    let store2 = open();
    let buf2 = CudaMemory::alloc(0, 3 * PAGE).unwrap();
    // SAFETY: As above.
    unsafe { store2.pread_on_stream(id, at, MemRange::new(&buf2, 0, n).unwrap(), stream.raw()) }
        .unwrap();
    drop(store2);
    stream.sync();
    assert!(read_all(&buf2, 0, n) == want, "the store dropped early");

    let plain = Store::initialize(backing.clone()).unwrap();
    // SAFETY: As above.
    let e = unsafe {
        plain.pread_on_stream(id, 0, MemRange::new(&buf, 0, PAGE).unwrap(), stream.raw())
    }
    .unwrap_err();
    assert!(e.to_string().contains("has none"), "{e}");
}

#[test]
#[allow(unsafe_code)]
fn stream_ordered_store_writes_own_their_pages_until_the_stream_has_copied() {
    let (_emu, _g) = setup();
    const PAGE: usize = 64 << 10;
    let len = 16 * PAGE;
    let (_dir, backing, id, data) = stored_object(len, 25);
    let store = gpu_cached(backing.clone(), 8);
    let stream = TestStream::new();
    let buf = CudaMemory::alloc(0, 3 * PAGE).unwrap();
    let (at, n) = (PAGE as u64 + 100, 2 * PAGE + 300);

    // The producer: the stream held up, then a memset of the buffer, as a
    // kernel writing its output would; the store's write is queued behind
    // it.
    stream.hold();
    {
        let _e = stream.ctx.enter().unwrap();
        // SAFETY: The memset is in `buf`, which outlives the stream's work
        // (synchronized below).
        unsafe {
            let r = cudarc::driver::sys::cuMemsetD8Async(
                buf.device_ptr(),
                0x5A,
                3 * PAGE,
                stream.raw().cast(),
            );
            assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
        }
    }
    let t = std::time::Instant::now();
    // SAFETY: `stream` is device 0's; `buf` outlives its work.
    unsafe { store.pwrite_on_stream(id, at, MemRange::new(&buf, 0, n).unwrap(), stream.raw()) }
        .unwrap();
    // A read of the same bytes right away waits for the stream's copy and
    // sees the produced bytes, never the old ones.
    let host = HostMemory::new(n + 2 * PAGE).unwrap();
    store
        .pread(id, at - 50, MemRange::new(&host, 0, n + 100).unwrap())
        .unwrap();
    let mut model = data.clone();
    model[at as usize..at as usize + n].fill(0x5A);
    assert!(
        read_all(&host, 0, n + 100) == model[at as usize - 50..at as usize + n + 50],
        "read before the stream ran ({:?} after the write returned)",
        t.elapsed()
    );
    stream.sync();
    // Durable after a flush; the bytes on storage are the model's.
    store.flush().unwrap();
    drop(store);
    let plain = Store::initialize(backing).unwrap();
    let all = HostMemory::new(len).unwrap();
    plain
        .pread(id, 0, MemRange::new(&all, 0, len).unwrap())
        .unwrap();
    assert!(read_all(&all, 0, len) == model, "on storage");
    // Refused: memory that is not the GPU's, and a store without a cache.
    let e = unsafe {
        plain.pwrite_on_stream(id, 0, MemRange::new(&buf, 0, PAGE).unwrap(), stream.raw())
    }
    .unwrap_err();
    assert!(e.to_string().contains("has none"), "{e}");
}

#[test]
#[allow(unsafe_code)]
fn gpu_reads_and_writes_larger_than_the_cache_finish_with_the_right_bytes() {
    let (emu, _g) = setup();
    const PAGE: usize = 64 << 10;
    let len = 16 * PAGE;
    let (_dir, backing, id, data) = stored_object(len, 26);
    // Four frames for sixteen pages: a call pins at most half of them at
    // a time, the stream letting them go before the next ones are taken.
    let store = gpu_cached(backing, 4);
    let buf = CudaMemory::alloc(0, len).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // A thread of its own, not joined: a call that never returns fails
    // the test instead of hanging it.
    let worker = {
        std::thread::spawn(move || {
            let stream = TestStream::new();
            // A plain read into GPU memory, twice (misses, then the last
            // pages hit).
            for _ in 0..2 {
                store
                    .pread(id, 100, MemRange::new(&buf, 0, len - 100).unwrap())
                    .unwrap();
                assert!(read_all(&buf, 0, len - 100) == data[100..], "pread");
            }
            // Stream-ordered, the whole object.
            // SAFETY: `stream` is device 0's; `buf` outlives its work.
            unsafe {
                store.pread_on_stream(id, 0, MemRange::new(&buf, 0, len).unwrap(), stream.raw())
            }
            .unwrap();
            stream.sync();
            assert!(read_all(&buf, 0, len) == data, "pread_on_stream");
            let new = pattern(27, len);
            buf.write_at(0, &new).unwrap();
            // SAFETY: As above.
            unsafe {
                store.pwrite_on_stream(id, 0, MemRange::new(&buf, 0, len).unwrap(), stream.raw())
            }
            .unwrap();
            stream.sync();
            let host = HostMemory::new(len).unwrap();
            store
                .pread(id, 0, MemRange::new(&host, 0, len).unwrap())
                .unwrap();
            assert!(read_all(&host, 0, len) == new, "pwrite_on_stream");
            tx.send(()).unwrap();
        })
    };
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        // Done, or failed (its panic, passed on).
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = worker.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a read or write larger than the cache did not finish in a minute")
        }
    }
    let _ = emu;
}
