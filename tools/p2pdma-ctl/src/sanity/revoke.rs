//! The accelerator going away while its memory is in use: what an unbind
//! revokes and how the owner learns it (ABI 2's `SET_EVENTFD` and
//! `HANDLE_STATE`), and user mappings made while the unbind runs.
//!
//! Nothing here touches a mapping with a load or a store: a revoked mapping
//! would kill the suite with `SIGBUS`. A mapping is probed by having the
//! kernel copy from it (`pwrite` of its first page to a scratch file), which
//! returns 4096 from a live mapping and `EFAULT` from a revoked one.

use std::{
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use p2pdma::{
    sys::{self, RawMapping, Sharing},
    HostBuffer, PciAddress,
};
use p2pdma_abi as abi;
use rustix::io::Errno;

use super::{
    all, all_or_skip, ename, scratch_file, skip,
    unbind::{Unbinding, UNBIND_DEADLINE},
    want_errno, Ctx, Suite, Why, KIB, MIB, PAGE, R,
};

/// How many unbind/rebind cycles the mmap race runs.
const RACE_CYCLES: u32 = 3;

/// A non-blocking eventfd.
#[allow(unsafe_code)]
fn eventfd() -> Result<OwnedFd, String> {
    use nix::libc;
    // SAFETY: `eventfd` takes no pointers; it returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(format!(
            "eventfd: {}",
            ename(Errno::from_raw_os_error(
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
            ))
        ));
    }
    // SAFETY: `fd` is a descriptor `eventfd` just created, owned by nobody
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The eventfd's counter, consumed: `Ok(0)` if it was never signalled.
fn eventfd_count(fd: &OwnedFd) -> Result<u64, Errno> {
    let mut buf = [0u8; 8];
    match rustix::io::read(fd, &mut buf) {
        Ok(8) => Ok(u64::from_ne_bytes(buf)),
        Ok(_) => Err(Errno::IO),
        Err(Errno::AGAIN) => Ok(0),
        Err(e) => Err(e),
    }
}

fn state_name(s: u32) -> String {
    match s {
        abi::P2PDMA_STATE_LIVE => "LIVE".into(),
        abi::P2PDMA_STATE_REVOKED => "REVOKED".into(),
        n => format!("state {n}"),
    }
}

/// What a worker of the mmap race saw.
#[derive(Default)]
struct RaceLog {
    /// The unbind thread is about to write `unbind`.
    unbinding: AtomicBool,
    /// Stop, dropping every mapping.
    stop: AtomicBool,
    maps: AtomicU64,
    probes_ok: AtomicU64,
    revoked: AtomicU64,
    refused: AtomicU64,
    /// Mappings held right now.
    held: AtomicU64,
    /// Probes that worked after the unbind had returned.
    violations: Mutex<Vec<String>>,
    /// Errors nothing explains.
    errors: Mutex<Vec<String>>,
}

impl RaceLog {
    fn note(list: &Mutex<Vec<String>>, what: String) {
        if let Ok(mut l) = list.lock() {
            if l.len() < 5 {
                l.push(what);
            }
        }
    }
}

impl Ctx {
    /// `HANDLE_STATE` of `handle`.
    fn handle_state(&self, handle: u64) -> Result<u32, Errno> {
        let mut arg = abi::P2pdmaHandleState {
            handle,
            ..Default::default()
        };
        sys::handle_state(&self.module, &mut arg)?;
        Ok(arg.state)
    }

    /// Checks that every `(what, handle)` is in `state`.
    fn want_states(&self, handles: &[(&str, u64)], state: u32) -> R {
        all(handles
            .iter()
            .map(|&(what, h)| match self.handle_state(h) {
                Ok(s) if s == state => Ok(()),
                Ok(s) => fail!(
                    "HANDLE_STATE of the {what}: {}, expected {}",
                    state_name(s),
                    state_name(state)
                ),
                Err(e) => fail!("HANDLE_STATE of the {what}: {}", ename(e)),
            })
            .collect())
    }

    /// Unbinds the accelerator while this file holds an allocation, a
    /// `DMA_MAP` of it, a `PIN_USER` of host memory and a `DMABUF_IMPORT`,
    /// all with the accelerator itself as the peer, and an eventfd
    /// registered with `SET_EVENTFD`: the unbind must finish, revoke each
    /// handle and signal the eventfd; the revoked handles release with 0;
    /// after rebinding, allocating works again.
    pub(super) fn unbind_revokes(&mut self, suite: &mut Suite) {
        let drv = match self.unbind_ready() {
            Ok(d) => d,
            Err(e) => return suite.report("revoke-unbind", Err(e)),
        };
        let pci = self.accel.pci;
        let old_size = self.accel.p2p_size;
        let unbound = self.revoke_with_handles(suite, &drv, pci);
        if unbound {
            let r = self.bind_again(&drv, pci, old_size);
            let back = r.is_ok();
            suite.report("revoke-rebind", r);
            if back {
                suite.case("revoke-alloc-after-rebind", || self.alloc_after_rebind(81));
            }
        }
    }

    /// The part of [`unbind_revokes`](Self::unbind_revokes) with the
    /// handles; returns whether the device was unbound.
    fn revoke_with_handles(&self, suite: &mut Suite, drv: &Path, pci: PciAddress) -> bool {
        let peer = self.self_peer();
        let efd = eventfd();
        let set = match &efd {
            Ok(fd) => {
                use std::os::fd::AsRawFd;
                sys::set_eventfd(
                    &self.module,
                    abi::P2pdmaEventfd {
                        fd: fd.as_raw_fd(),
                        ..Default::default()
                    },
                )
                .map_err(|e| Why::Fail(format!("SET_EVENTFD: {}", ename(e))))
            }
            Err(e) => Err(Why::Fail(e.clone())),
        };
        suite.report("revoke-set-eventfd", set);

        // The resources, each of which the unbind must revoke.
        let mut setup = Vec::new();
        let mut handles: Vec<(&str, u64)> = Vec::new();
        let host = HostBuffer::new(64 * KIB as usize);
        let alloc = self.module.alloc(self.dev, MIB, 0);
        match &alloc {
            Ok(a) => {
                handles.push(("allocation", a.handle()));
                match self.module.dma_map(a.handle(), 0, a.size(), peer) {
                    Ok(m) => handles.push(("DMA_MAP mapping", m.map_handle())),
                    Err(e) => setup.push(Err(Why::Fail(format!("DMA_MAP: {e}")))),
                }
            }
            Err(e) => setup.push(Err(Why::Fail(format!("ALLOC: {e}")))),
        }
        match &host {
            Ok(b) => match self.module.pin_user(b.addr(), 64 * KIB, peer) {
                Ok(m) => handles.push(("PIN_USER mapping", m.map_handle())),
                Err(e) => setup.push(Err(Why::Fail(format!(
                    "PIN_USER with the accelerator as the peer: {e}"
                )))),
            },
            Err(e) => setup.push(Err(Why::Fail(format!("host buffer: {}", ename(*e))))),
        }
        let udmabuf = self.udmabuf(64 * KIB);
        match &udmabuf {
            Ok(b) => match self.module.dmabuf_import(b.dmabuf(), peer) {
                Ok(m) => handles.push(("DMABUF_IMPORT mapping", m.map_handle())),
                Err(e) => setup.push(Err(Why::Fail(format!(
                    "DMABUF_IMPORT with the accelerator as the peer: {e}"
                )))),
            },
            Err(Why::Skip(w)) => setup.push(skip(format!("no dma-buf to import: {w}"))),
            Err(Why::Fail(w)) => setup.push(Err(Why::Fail(w.clone()))),
        }
        let before_states = self.want_states(&handles, abi::P2PDMA_STATE_LIVE);
        let before_count = efd.as_ref().ok().map(eventfd_count);
        setup.push(match before_count {
            Some(Ok(0)) | None => Ok(()),
            Some(Ok(n)) => Err(Why::Fail(format!(
                "the eventfd counts {n} before anything was revoked"
            ))),
            Some(Err(e)) => Err(Why::Fail(format!("read of the eventfd: {}", ename(e)))),
        });
        setup.push(before_states);
        suite.report("revoke-setup", all_or_skip(setup));

        // The unbind.
        let unbinding = Unbinding::start(drv, pci, Arc::new(AtomicBool::new(false)));
        match unbinding.wait(UNBIND_DEADLINE) {
            Some(Ok(())) => suite.report("revoke-unbind", Ok(())),
            Some(Err(e)) => {
                suite.report(
                    "revoke-unbind",
                    Err(Why::Fail(format!("writing {pci} to unbind: {e}"))),
                );
                return sys::device_info(&self.module, self.dev) == Err(Errno::NODEV);
            }
            None => {
                // Release everything; the unbind may then finish.
                for &(what, h) in &handles {
                    if what != "allocation" {
                        let _ = self.unmap_raw(h);
                    }
                }
                drop(alloc);
                let late = unbinding.wait(Duration::from_secs(30)).is_some();
                suite.report(
                    "revoke-unbind",
                    Err(Why::Fail(format!(
                        "unbind did not return within {} s while the mappings existed ({})",
                        UNBIND_DEADLINE.as_secs(),
                        if late {
                            "it did once they were released"
                        } else {
                            "nor after they were released"
                        }
                    ))),
                );
                return late;
            }
        }

        suite.report(
            "revoke-handle-state",
            self.want_states(&handles, abi::P2PDMA_STATE_REVOKED),
        );
        // The memory is gone: the module's block I/O on it is refused.
        suite.report(
            "revoke-block-io",
            match (self.nvme(), &alloc) {
                (Ok(nvme), Ok(a)) => {
                    let seg = abi::P2pdmaIoSeg {
                        len: 4 * KIB,
                        ..Default::default()
                    };
                    let mut arg = abi::P2pdmaBlockIo {
                        handle: a.handle(),
                        fd: std::os::fd::AsRawFd::as_raw_fd(nvme),
                        ..Default::default()
                    };
                    want_errno(
                        "BLOCK_IO on a revoked allocation",
                        self.block_io_arg(&mut arg, &[seg]),
                        Errno::NODEV,
                    )
                }
                (Err(w), _) => Err(w),
                (_, Err(e)) => Err(Why::Fail(format!("ALLOC: {e}"))),
            },
        );
        suite.report(
            "revoke-eventfd-signalled",
            match &efd {
                Err(e) => Err(Why::Fail(e.clone())),
                Ok(fd) => match eventfd_count(fd) {
                    Ok(0) => Err(Why::Fail(
                        "the eventfd registered with SET_EVENTFD was never signalled".into(),
                    )),
                    Ok(_) => Ok(()),
                    Err(e) => Err(Why::Fail(format!("read of the eventfd: {}", ename(e)))),
                },
            },
        );
        // Release: the mappings with UNMAP, then the allocation with FREE;
        // then the handles are gone.
        let mut release = Vec::new();
        handles.sort_by_key(|&(what, _)| what == "allocation");
        for &(what, h) in &handles {
            let r = if what == "allocation" {
                self.free_arg(abi::P2pdmaFree {
                    handle: h,
                    ..Default::default()
                })
            } else {
                self.unmap_arg(abi::P2pdmaUnmap {
                    map_handle: h,
                    ..Default::default()
                })
            };
            release.push(
                r.map_err(|e| Why::Fail(format!("releasing the revoked {what}: {}", ename(e)))),
            );
            release.push(want_errno(
                &format!("HANDLE_STATE of the released {what}"),
                self.handle_state(h),
                Errno::NOENT,
            ));
        }
        if let Ok(a) = alloc {
            let _ = a.into_handle();
        }
        // Notifications off again: later unbinds need not signal it.
        release.push(
            sys::set_eventfd(
                &self.module,
                abi::P2pdmaEventfd {
                    fd: -1,
                    ..Default::default()
                },
            )
            .map_err(|e| Why::Fail(format!("SET_EVENTFD with fd -1: {}", ename(e)))),
        );
        suite.report("revoke-release-handles", all(release));
        drop(host);
        drop(udmabuf);
        true
    }

    /// Threads map, probe and unmap allocations in a loop while the
    /// accelerator is unbound, several times: no mapping of them may work
    /// once the unbind has returned, and the unbind must return within
    /// [`UNBIND_DEADLINE`] while mappings exist.
    pub(super) fn unbind_mmap_race(&mut self, suite: &mut Suite) {
        let results =
            self.unbind_cycles(RACE_CYCLES, |ctx, drv, pci| ctx.mmap_race_cycle(drv, pci));
        suite.report("unbind-mmap-race", all_or_skip(results));
        suite.case("unbind-mmap-race-leak", || self.leak_check());
    }

    /// One cycle of [`unbind_mmap_race`](Self::unbind_mmap_race): the
    /// verdict, and whether the device ended up unbound.
    fn mmap_race_cycle(&self, drv: &Path, pci: PciAddress) -> (R, bool) {
        const ALLOCS: usize = 16;
        const THREADS: usize = 4;
        const LEN: u64 = 64 * KIB;
        let mut allocs = Vec::new();
        for _ in 0..ALLOCS {
            match self.module.alloc(self.dev, LEN, 0) {
                Ok(a) => allocs.push(a),
                Err(e) => return (Err(e.into()), false),
            }
        }
        let targets: Vec<u64> = allocs.iter().map(|a| a.mmap_offset()).collect();
        let log = RaceLog::default();
        let mut scratch = Vec::new();
        for t in 0..THREADS {
            match scratch_file(&format!("probe{t}")) {
                Ok(f) => scratch.push(f),
                Err(e) => return (Err(Why::Fail(e)), false),
            }
        }

        let mut verdict = Vec::new();
        let mut gone = true;
        // Set by the unbind thread once its write has returned.
        let unbound = Arc::new(AtomicBool::new(false));
        thread::scope(|s| {
            for (t, file) in scratch.iter().enumerate() {
                let (log, targets, unbound) = (&log, &targets, &*unbound);
                s.spawn(move || self.race_worker(t, file, targets, log, unbound, LEN));
            }
            thread::sleep(Duration::from_millis(100));
            log.unbinding.store(true, SeqCst);
            let unbinding = Unbinding::start(drv, pci, unbound.clone());
            let started = Instant::now();
            match unbinding.wait(UNBIND_DEADLINE) {
                Some(Ok(())) => {
                    // Let the workers probe what they still hold.
                    thread::sleep(Duration::from_millis(300));
                }
                Some(Err(e)) => {
                    verdict.push(Err(Why::Fail(format!("writing {pci} to unbind: {e}"))));
                    gone = sys::device_info(&self.module, self.dev) == Err(Errno::NODEV);
                }
                None => {
                    let held = log.held.load(SeqCst);
                    log.stop.store(true, SeqCst);
                    let late = unbinding.wait(Duration::from_secs(30)).is_some();
                    verdict.push(Err(Why::Fail(format!(
                        "unbind did not return within {} s while {held} mapping(s) of its memory were held ({})",
                        UNBIND_DEADLINE.as_secs(),
                        if late {
                            format!(
                                "it returned {:.1} s after they were dropped: a mapping made during the unbind survived it",
                                started.elapsed().as_secs_f64() - UNBIND_DEADLINE.as_secs_f64()
                            )
                        } else {
                            "nor after they were dropped".into()
                        }
                    ))));
                    gone = late;
                }
            }
            log.stop.store(true, SeqCst);
        });

        let violations = log.violations.lock().map(|v| v.clone()).unwrap_or_default();
        let errors = log.errors.lock().map(|v| v.clone()).unwrap_or_default();
        let counts = format!(
            "{} mappings made, {} probes worked, {} saw the revocation, {} mmaps refused",
            log.maps.load(SeqCst),
            log.probes_ok.load(SeqCst),
            log.revoked.load(SeqCst),
            log.refused.load(SeqCst)
        );
        if !violations.is_empty() {
            verdict.push(Err(Why::Fail(format!(
                "mappings still worked after the unbind returned: {} ({counts})",
                violations.join("; ")
            ))));
        }
        if !errors.is_empty() {
            verdict.push(Err(Why::Fail(format!("{} ({counts})", errors.join("; ")))));
        }
        if log.maps.load(SeqCst) == 0 {
            verdict.push(Err(Why::Fail(format!(
                "no mapping was ever made ({counts})"
            ))));
        }
        // The allocations were revoked: FREE releases their handles.
        for a in allocs {
            let h = a.handle();
            if gone {
                verdict.push(
                    a.free()
                        .map_err(|e| Why::Fail(format!("FREE of revoked allocation {h}: {e}"))),
                );
            }
        }
        (all(verdict), gone)
    }

    /// A worker of the mmap race: maps the allocations at `targets` in
    /// turn and probes each mapping. Before the unbind starts it unmaps
    /// each at once; while the unbind runs it keeps what it maps until the
    /// probe says it was revoked; a probe that works after `unbound` is
    /// set is a violation.
    fn race_worker(
        &self,
        t: usize,
        file: &OwnedFd,
        targets: &[u64],
        log: &RaceLog,
        unbound: &AtomicBool,
        len: u64,
    ) {
        const MAX_HELD: usize = 128;
        let mut held: Vec<(usize, RawMapping)> = Vec::new();
        let mut k = t;
        // Probes one mapping; `false` once it is revoked (or broken).
        let probe = |i: usize, m: &RawMapping| -> bool {
            let after = unbound.load(SeqCst);
            match m.pwrite_to(file, 0, 0, PAGE as usize) {
                Ok(n) if n == PAGE as usize => {
                    log.probes_ok.fetch_add(1, SeqCst);
                    if after {
                        RaceLog::note(
                            &log.violations,
                            format!("thread {t}: a mapping of allocation {i} could be read after the unbind returned"),
                        );
                        return false;
                    }
                    true
                }
                // A short copy: the mapping went away during the copy.
                Ok(n) if after => {
                    RaceLog::note(
                        &log.violations,
                        format!("thread {t}: {n} bytes of a mapping of allocation {i} could be read after the unbind returned"),
                    );
                    false
                }
                Ok(_) if log.unbinding.load(SeqCst) => {
                    log.revoked.fetch_add(1, SeqCst);
                    false
                }
                Ok(n) => {
                    RaceLog::note(
                        &log.errors,
                        format!("thread {t}: probe copied {n} bytes before the unbind"),
                    );
                    false
                }
                Err(Errno::FAULT) => {
                    log.revoked.fetch_add(1, SeqCst);
                    false
                }
                Err(e) => {
                    RaceLog::note(&log.errors, format!("thread {t}: probe gave {}", ename(e)));
                    false
                }
            }
        };
        while !log.stop.load(SeqCst) {
            let unbinding = log.unbinding.load(SeqCst);
            let done = unbound.load(SeqCst);
            if held.len() < MAX_HELD && !done {
                let i = k % targets.len();
                k += 1;
                match self.map_raw(len as usize, targets[i], Sharing::Shared) {
                    Ok(m) => {
                        log.maps.fetch_add(1, SeqCst);
                        if probe(i, &m) && unbinding {
                            held.push((i, m));
                            log.held.fetch_add(1, SeqCst);
                        }
                    }
                    // Read again: the unbind may have started since.
                    Err(_) if log.unbinding.load(SeqCst) => {
                        // The allocation was revoked: the mmap is refused
                        // (with which errno, the ABI leaves open).
                        log.refused.fetch_add(1, SeqCst);
                        thread::yield_now();
                    }
                    Err(e) => {
                        RaceLog::note(
                            &log.errors,
                            format!(
                                "thread {t}: mmap of allocation {i} before the unbind: {}",
                                ename(e)
                            ),
                        );
                        thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            if unbinding && (k.is_multiple_of(8) || held.len() >= MAX_HELD || done) {
                let before = held.len();
                held.retain(|(i, m)| probe(*i, m));
                log.held.fetch_sub((before - held.len()) as u64, SeqCst);
                if done || held.len() >= MAX_HELD {
                    thread::sleep(Duration::from_millis(2));
                }
            }
        }
        // Last look, then drop everything.
        if unbound.load(SeqCst) {
            for (i, m) in &held {
                probe(*i, m);
            }
        }
        log.held.fetch_sub(held.len() as u64, SeqCst);
    }
}
