//! Threads racing on the same handles: `FREE` against `DMA_MAP`, and a
//! mixed stress of every call on shared allocations.

use std::{
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::SeqCst},
        Barrier, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use p2pdma::sys::{self, RawMapping, Sharing};
use p2pdma_abi as abi;
use rustix::{
    fs::{fadvise, Advice as FileAdvice},
    io::Errno,
    mm::{madvise, mmap, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags},
};

use super::{ename, scratch_file, Ctx, Why, PAGE, R};

/// Busy-waits for `us` microseconds (a sleep would be far longer).
fn spin(us: u64) {
    let end = Instant::now() + Duration::from_micros(us);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// A result as a number: 0 for success, else the errno.
fn code<T>(r: &Result<T, Errno>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error(),
    }
}

fn code_name(c: i32) -> String {
    if c == 0 {
        "ok".into()
    } else {
        ename(Errno::from_raw_os_error(c))
    }
}

/// Where `DMA_MAP` writes its segments in the race: a page that is not in
/// memory when the call starts, so that the kernel's copy of the segments
/// waits for a page fault, a read from the NVMe when there is one. Any
/// window between the module's lookup of the allocation and its recording
/// of the mapping grows by that wait.
struct SlowPage {
    ptr: *mut std::ffi::c_void,
    /// The NVMe the page is a private mapping of, if any.
    disk: Option<OwnedFd>,
}

// SAFETY: The page is private memory owned by this value; the threads of
// the race hand it to the kernel one call at a time.
#[allow(unsafe_code)]
unsafe impl Sync for SlowPage {}

impl SlowPage {
    /// A private mapping of the first page of `disk` (no readahead), or of
    /// anonymous memory without one.
    #[allow(unsafe_code)]
    fn new(disk: Option<OwnedFd>) -> Result<Self, String> {
        let prot = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: A NULL hint lets the kernel choose an address, so the new
        // mapping overlaps nothing Rust uses.
        let ptr = unsafe {
            match &disk {
                Some(fd) => mmap(
                    std::ptr::null_mut(),
                    PAGE as usize,
                    prot,
                    MapFlags::PRIVATE,
                    fd,
                    0,
                ),
                None => {
                    mmap_anonymous(std::ptr::null_mut(), PAGE as usize, prot, MapFlags::PRIVATE)
                }
            }
        }
        .map_err(|e| format!("mmap of the segment page: {}", ename(e)))?;
        // SAFETY: Advice on the page just mapped; it changes no contents.
        let _ = unsafe { madvise(ptr, PAGE as usize, Advice::Random) };
        Ok(Self { ptr, disk })
    }

    /// Drops the page from this process and from the page cache, so the
    /// next write to it faults and reads it again.
    #[allow(unsafe_code)]
    fn evict(&self) {
        // SAFETY: The page is this value's private mapping and no
        // reference into it exists; it reads as the file (or zeros) again.
        let _ = unsafe { madvise(self.ptr, PAGE as usize, Advice::LinuxDontNeed) };
        if let Some(fd) = &self.disk {
            let _ = fadvise(fd, 0, std::num::NonZeroU64::new(PAGE), FileAdvice::DontNeed);
        }
    }

    /// `DMA_MAP` of the first page of `handle` for `ctx`'s accelerator,
    /// with the segments written to this page.
    #[allow(unsafe_code)]
    fn dma_map(&self, ctx: &Ctx, handle: u64) -> Result<u64, Errno> {
        let mut arg = ctx.page_map_arg(handle);
        // SAFETY: The page is PAGE writable bytes of private memory, room
        // for 4 segments, and only the kernel writes it (during this call,
        // made by one thread at a time).
        let segs =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<abi::P2pdmaDmaSeg>(), 4) };
        sys::dma_map(&ctx.module, &mut arg, segs)?;
        Ok(arg.map_handle)
    }
}

impl Drop for SlowPage {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `ptr` is the page `mmap` returned; nothing refers into it.
        let _ = unsafe { munmap(self.ptr, PAGE as usize) };
    }
}

/// An allocation as the stress threads share it.
#[derive(Clone, Copy)]
struct Shared {
    handle: u64,
    mmap_offset: u64,
    size: u64,
}

impl Ctx {
    /// The `DMA_MAP` argument for the first page of `handle`, for the
    /// accelerator itself.
    fn page_map_arg(&self, handle: u64) -> abi::P2pdmaDmaMap {
        let (flags, peer) = self.self_peer().to_abi();
        abi::P2pdmaDmaMap {
            flags,
            peer,
            handle,
            length: PAGE,
            ..Default::default()
        }
    }

    /// Sends a `DMA_MAP` of the first page of `handle` for the accelerator
    /// itself; the mapping handle on success.
    pub(super) fn dma_map_page(&self, handle: u64) -> Result<u64, Errno> {
        let mut arg = self.page_map_arg(handle);
        let mut segs = [abi::P2pdmaDmaSeg::default(); 4];
        sys::dma_map(&self.module, &mut arg, &mut segs)?;
        Ok(arg.map_handle)
    }

    /// `FREE` of `handle`, whatever it names.
    pub(super) fn free_raw(&self, handle: u64) -> Result<(), Errno> {
        self.free_arg(abi::P2pdmaFree {
            handle,
            ..Default::default()
        })
    }

    /// `UNMAP` of `map_handle`, whatever it names.
    pub(super) fn unmap_raw(&self, map_handle: u64) -> Result<(), Errno> {
        self.unmap_arg(abi::P2pdmaUnmap {
            map_handle,
            ..Default::default()
        })
    }

    /// `mmap` of `len` bytes of this file at `offset`, whatever it names.
    #[allow(unsafe_code)]
    pub(super) fn map_raw(
        &self,
        len: usize,
        offset: u64,
        sharing: Sharing,
    ) -> Result<RawMapping, Errno> {
        // SAFETY: The sanity cases' allocations hold test patterns, reached
        // through copies only, and no device is given their addresses:
        // writing any of them through a mapping is what the cases check.
        unsafe { RawMapping::map(&self.module, len, offset, sharing) }
    }

    /// `FREE` with the argument as built, whatever its handle names.
    #[allow(unsafe_code)]
    pub(super) fn free_arg(&self, arg: abi::P2pdmaFree) -> Result<(), Errno> {
        // SAFETY: The sanity cases give no device the addresses of what
        // they allocate or map (only the module's answers are checked), and
        // their allocations are reached through copies only: freeing any
        // number, stale or foreign, leaves nothing writing or trusting
        // released memory. The module checks the number, which is what
        // these cases test.
        unsafe { sys::free(&self.module, arg) }
    }

    /// `UNMAP` with the argument as built, whatever its handle names.
    #[allow(unsafe_code)]
    pub(super) fn unmap_arg(&self, arg: abi::P2pdmaUnmap) -> Result<(), Errno> {
        // SAFETY: As for `free_arg`: no device is given the addresses of a
        // mapping the sanity cases make.
        unsafe { sys::unmap(&self.module, arg) }
    }

    /// `BLOCK_IO` with the argument as built, whatever its handle names.
    #[allow(unsafe_code)]
    pub(super) fn block_io_arg(
        &self,
        arg: &mut abi::P2pdmaBlockIo,
        segs: &[abi::P2pdmaIoSeg],
    ) -> Result<(), Errno> {
        // SAFETY: As for `free_arg`: the sanity cases' allocations hold test
        // patterns, reached through copies; storage writing any of them is
        // what the block-I/O cases check.
        unsafe { sys::block_io(&self.module, arg, segs) }
    }

    /// [`block_io_arg`](Self::block_io_arg) with the segment pointer and
    /// count as built.
    #[allow(unsafe_code)]
    pub(super) fn block_io_raw_arg(&self, arg: &mut abi::P2pdmaBlockIo) -> Result<(), Errno> {
        // SAFETY: As for `block_io_arg`.
        unsafe { sys::block_io_raw(&self.module, arg) }
    }

    /// One thread `DMA_MAP`s an allocation (and keeps the mapping) while
    /// another `FREE`s it, released together by a barrier, with the one or
    /// the other delayed by a sweep of a few hundred microseconds, and
    /// `DMA_MAP`'s segments going to a page that faults (see [`SlowPage`]).
    /// Either the map
    /// wins (`FREE` gets `EBUSY`) or the free does (`DMA_MAP` gets `ENOENT`
    /// or `ENODEV`); both succeeding leaves the peer a mapping of freed
    /// memory.
    pub(super) fn free_vs_dma_map(&self) -> R {
        const ITERATIONS: u32 = 500;
        let start = Barrier::new(3);
        let end = Barrier::new(3);
        let handle = AtomicU64::new(0);
        let iteration = AtomicU32::new(0);
        let quit = AtomicBool::new(false);
        let map_res = AtomicI32::new(0);
        let map_handle = AtomicU64::new(0);
        let free_res = AtomicI32::new(0);
        // Delays: even iterations hold the FREE back, odd ones the DMA_MAP,
        // by 0 to 490 us.
        let delay = |i: u32, of_free: bool| -> u64 {
            let d = u64::from((i / 2) % 50) * 10;
            if i.is_multiple_of(2) == of_free {
                d
            } else {
                0
            }
        };
        let disk = self.nvme.as_ref().and_then(|fd| fd.try_clone().ok());
        let slow = SlowPage::new(disk)?;
        let mut both = Vec::new();
        let mut odd = Vec::new();
        let (mut map_won, mut free_won) = (0u32, 0u32);
        let mut setup_err = None;
        thread::scope(|s| {
            s.spawn(|| loop {
                start.wait();
                if quit.load(SeqCst) {
                    break;
                }
                spin(delay(iteration.load(SeqCst), false));
                let r = slow.dma_map(self, handle.load(SeqCst));
                map_res.store(code(&r), SeqCst);
                map_handle.store(r.unwrap_or(0), SeqCst);
                end.wait();
            });
            s.spawn(|| loop {
                start.wait();
                if quit.load(SeqCst) {
                    break;
                }
                spin(delay(iteration.load(SeqCst), true));
                free_res.store(code(&self.free_raw(handle.load(SeqCst))), SeqCst);
                end.wait();
            });
            for i in 0..ITERATIONS {
                let a = match self.module.alloc(self.dev, PAGE, 0) {
                    Ok(a) => a.into_handle(),
                    Err(e) => {
                        setup_err = Some(format!("iteration {i}: ALLOC: {e}"));
                        break;
                    }
                };
                handle.store(a, SeqCst);
                iteration.store(i, SeqCst);
                slow.evict();
                start.wait();
                end.wait();
                let (m, f, mh) = (
                    map_res.load(SeqCst),
                    free_res.load(SeqCst),
                    map_handle.load(SeqCst),
                );
                let busy = Errno::BUSY.raw_os_error();
                let gone = [Errno::NOENT.raw_os_error(), Errno::NODEV.raw_os_error()];
                match (m, f) {
                    (0, f) if f == busy => {
                        map_won += 1;
                        // Release in order; both must work now.
                        let u = self.unmap_raw(mh);
                        let fr = self.free_raw(a);
                        if u.is_err() || fr.is_err() {
                            odd.push(format!(
                                "iteration {i}: after DMA_MAP won, UNMAP {} and FREE {}",
                                code_name(code(&u)),
                                code_name(code(&fr))
                            ));
                        }
                    }
                    (m, 0) if gone.contains(&m) => free_won += 1,
                    (0, 0) => {
                        both.push(i);
                        let _ = self.unmap_raw(mh);
                    }
                    (m, f) => {
                        odd.push(format!(
                            "iteration {i}: DMA_MAP {} and FREE {}",
                            code_name(m),
                            code_name(f)
                        ));
                        if m == 0 {
                            let _ = self.unmap_raw(mh);
                        }
                        let _ = self.free_raw(a);
                    }
                }
            }
            quit.store(true, SeqCst);
            start.wait();
        });
        let tally = format!("DMA_MAP won {map_won} times, FREE {free_won} times");
        if let Some(e) = setup_err {
            fail!("{e} ({tally})");
        }
        ensure!(
            both.is_empty(),
            "DMA_MAP and FREE of the same allocation both succeeded in {} of {ITERATIONS} iterations (first: {:?}): the peer kept a mapping of freed memory ({tally})",
            both.len(),
            &both[..both.len().min(5)]
        );
        ensure!(
            odd.is_empty(),
            "{} ({tally})",
            odd[..odd.len().min(5)].join("; ")
        );
        self.leak_check()
    }

    /// Eight threads run `ALLOC`, `DMA_MAP`, `UNMAP`, `FREE`, `mmap` and
    /// `munmap` at random on allocations and mappings they all share. Only
    /// the errnos that losing a race explains are allowed; a mapping, while
    /// it exists, holds each thread's own bytes; afterwards everything
    /// releases and the pool is back where it was.
    pub(super) fn stress_shared(&self) -> R {
        const THREADS: u64 = 8;
        const ROUNDS: u64 = 60;
        let allocs: Mutex<Vec<Shared>> = Mutex::new(Vec::new());
        let maps: Mutex<Vec<u64>> = Mutex::new(Vec::new());
        let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
        let note = |m: String| {
            if let Ok(mut e) = errors.lock() {
                if e.len() < 8 {
                    e.push(m);
                }
            }
        };
        let scratch: Vec<OwnedFd> = (0..THREADS)
            .map(|t| scratch_file(&format!("stress{t}")))
            .collect::<Result<_, _>>()?;
        thread::scope(|s| {
            for (t, file) in scratch.iter().enumerate() {
                let (allocs, maps, note) = (&allocs, &maps, &note);
                s.spawn(move || {
                    let t = t as u64;
                    let mut rng = fastrand::Rng::with_seed(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0x1234_5678_9ABC));
                    let pick = |rng: &mut fastrand::Rng, v: &Mutex<Vec<Shared>>| -> Option<Shared> {
                        let v = v.lock().ok()?;
                        (!v.is_empty()).then(|| v[rng.u64(0..v.len() as u64) as usize])
                    };
                    for round in 0..ROUNDS {
                        let what = |op: &str, e: Errno| {
                            format!("thread {t} round {round}: {op} gave {}", ename(e))
                        };
                        match rng.u64(0..6) {
                            0 | 1 => {
                                let size = (1 + rng.u64(0..4)) * PAGE;
                                match self.module.alloc(self.dev, size, 0) {
                                    Ok(a) => {
                                        let sh = Shared {
                                            handle: a.handle(),
                                            mmap_offset: a.mmap_offset(),
                                            size: a.size(),
                                        };
                                        let _ = a.into_handle();
                                        if let Ok(mut v) = allocs.lock() {
                                            v.push(sh);
                                        }
                                    }
                                    Err(e) => note(format!("thread {t} round {round}: ALLOC: {e}")),
                                }
                            }
                            2 => {
                                let Some(a) = pick(&mut rng, allocs) else { continue };
                                match self.dma_map_page(a.handle) {
                                    Ok(m) => {
                                        if let Ok(mut v) = maps.lock() {
                                            v.push(m);
                                        }
                                    }
                                    // Freed by another thread, before or
                                    // during the call; or the page already
                                    // carries as many mappings as the
                                    // module allows.
                                    Err(Errno::NOENT | Errno::NODEV | Errno::TOOMANYREFS) => {}
                                    Err(e) => note(what("DMA_MAP", e)),
                                }
                            }
                            3 => {
                                let m = maps.lock().ok().and_then(|mut v| {
                                    (!v.is_empty()).then(|| {
                                        let i = rng.u64(0..v.len() as u64) as usize;
                                        v.swap_remove(i)
                                    })
                                });
                                let Some(m) = m else { continue };
                                if let Err(e) = self.unmap_raw(m) {
                                    note(what("UNMAP", e));
                                }
                            }
                            4 => {
                                let Some(a) = pick(&mut rng, allocs) else { continue };
                                match self.free_raw(a.handle) {
                                    Ok(()) => {
                                        if let Ok(mut v) = allocs.lock() {
                                            v.retain(|x| x.handle != a.handle);
                                        }
                                    }
                                    // Mapped by a thread, or freed by one.
                                    Err(Errno::BUSY | Errno::NOENT) => {}
                                    Err(e) => note(what("FREE", e)),
                                }
                            }
                            _ => {
                                let Some(a) = pick(&mut rng, allocs) else { continue };
                                let m = match self.map_raw(a.size as usize,
                                    a.mmap_offset,
                                    Sharing::Shared,
                                ) {
                                    Ok(m) => m,
                                    // Freed by another thread: no
                                    // allocation at that offset any more.
                                    Err(Errno::INVAL | Errno::NODEV | Errno::NOENT) => continue,
                                    Err(e) => {
                                        note(what("mmap", e));
                                        continue;
                                    }
                                };
                                // This thread's own 8 bytes: a mapping keeps
                                // the memory even if the allocation is freed
                                // meanwhile.
                                let word = (t << 32 | round).to_le_bytes();
                                let at = (t * 8) as usize;
                                let mut back = [0u8; 8];
                                let rw = m.write_at(at, &word).and_then(|()| m.read_at(at, &mut back));
                                match rw {
                                    Ok(()) if back == word => {}
                                    Ok(()) => note(format!(
                                        "thread {t} round {round}: wrote {word:x?} through a mapping, read {back:x?}"
                                    )),
                                    Err(e) => note(what("access to a mapping", e)),
                                }
                                match m.pwrite_to(file, 0, 0, PAGE as usize) {
                                    Ok(n) if n == PAGE as usize => {}
                                    Ok(n) => note(format!("thread {t} round {round}: probe copied {n} bytes")),
                                    Err(e) => note(what("probe of a live mapping", e)),
                                }
                            }
                        }
                    }
                });
            }
        });
        // Everything left must release, single-threaded now.
        let mut cleanup = Vec::new();
        for m in maps.into_inner().unwrap_or_default() {
            if let Err(e) = self.unmap_raw(m) {
                cleanup.push(format!("UNMAP of mapping {m} afterwards: {}", ename(e)));
            }
        }
        let left = allocs.into_inner().unwrap_or_default();
        for a in &left {
            if let Err(e) = self.free_raw(a.handle) {
                cleanup.push(format!(
                    "FREE of allocation {} afterwards: {}",
                    a.handle,
                    ename(e)
                ));
            }
        }
        let errors = errors.into_inner().unwrap_or_default();
        ensure!(errors.is_empty(), "{}", errors.join("; "));
        ensure!(
            cleanup.is_empty(),
            "{}",
            cleanup[..cleanup.len().min(5)].join("; ")
        );
        self.leak_check().map_err(|e| match e {
            Why::Fail(m) => Why::Fail(format!(
                "after the stress ({} allocations left to free): {m}",
                left.len()
            )),
            s => s,
        })
    }
}
