//! `ioctl-fuzz`: the module's ioctls called at random, with good and bad
//! arguments, by several threads in several processes over several open
//! files of `/dev/p2pdma`, on memory that all of them share.
//!
//! The processes are forked from one that first opens a module file, makes
//! a few sealed memfds and maps them shared: every process pins the same
//! pages (`PIN_USER`), and imports udmabufs that each process makes from
//! the same memfds (`DMABUF_IMPORT`), so the same pages reach a peer through
//! many files and many dma-bufs at once. Each process also allocates,
//! `DMA_MAP`s the same allocations again and again, unmaps, frees, closes
//! and reopens its files, and uses the file it inherited (whose opener it is
//! not). A forked child's own files are its own.
//!
//! What must hold: every refusal is an errno the ioctl documents for it;
//! a mapping that succeeds returns segments that add up to what was mapped,
//! is live, and unmaps cleanly; at the end every process releases all it
//! holds without an error, and the accelerator's P2P memory is all back.
//! The kernel log (the debug kernel's DMA-API checks among others) is
//! checked by the rig.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use p2pdma::sys;
use p2pdma_abi as abi;
use rustix::{
    fs::{fcntl_add_seals, ftruncate, memfd_create, open, MemfdFlags, Mode, OFlags, SealFlags},
    io::Errno,
    mm::{mmap, MapFlags, ProtFlags},
};

/// `UNMAP` of any handle, right or wrong: the fuzzer gives no device the
/// address of anything it maps, so a mapping released early frees nothing
/// a device uses.
fn unmap(fd: impl AsFd, arg: abi::P2pdmaUnmap) -> Result<(), Errno> {
    // SAFETY: As said above.
    unsafe { sys::unmap(fd, arg) }
}

/// `FREE` of any handle, right or wrong: as for [`unmap`], no device was
/// given the memory, and the fuzzer maps no allocation into its own
/// address space.
fn free(fd: impl AsFd, handle: u64) -> Result<(), Errno> {
    let arg = abi::P2pdmaFree {
        handle,
        ..Default::default()
    };
    // SAFETY: As said above.
    unsafe { sys::free(fd, arg) }
}

/// [`unmap`] of `handle`, the argument otherwise right.
fn unmap_handle(fd: impl AsFd, handle: u64) -> Result<(), Errno> {
    unmap(
        fd,
        abi::P2pdmaUnmap {
            map_handle: handle,
            ..Default::default()
        },
    )
}

const PAGE: u64 = 4096;
/// Pages in each shared memfd: few, so that mappings overlap a lot.
const MEMFD_PAGES: u64 = 8;
const MEMFDS: usize = 3;
/// Most mappings a file keeps before the fuzzer unmaps one of them.
const MAPS_PER_FILE: usize = 24;
/// Most allocations a file keeps.
const ALLOCS_PER_FILE: usize = 6;
/// Most udmabufs a process keeps open.
const BUFS: usize = 12;

#[derive(clap::Args)]
pub(crate) struct FuzzArgs {
    /// An NVMe namespace: its controller is one of the peers (named by the
    /// descriptor of the open namespace).
    #[arg(long, default_value = "/dev/nvme0n1")]
    nvme: String,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Stop after this many ioctl calls in all (divided among the
    /// processes).
    #[arg(long, default_value_t = 200_000)]
    calls: u64,
    /// Forked child processes (besides the first one).
    #[arg(long, default_value_t = 3)]
    procs: u32,
    /// Threads in each process.
    #[arg(long, default_value_t = 4)]
    threads: u32,
    /// Module files each process keeps open.
    #[arg(long, default_value_t = 3)]
    files: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A module file slot: the open file (shared by the threads that use it;
/// closed when the last of them drops it) and what it holds.
struct Slot {
    fd: Arc<OwnedFd>,
    /// Bumped each time the slot gets a new file.
    gen: u64,
    /// Allocations: handle and size.
    allocs: Vec<(u64, u64)>,
    /// Mapping handles.
    maps: Vec<u64>,
}

/// One of the memfds all processes share, mapped in this process.
struct Memfd {
    fd: OwnedFd,
    addr: u64,
}

/// The peers a mapping may be asked for.
struct Peers {
    nvme: Option<OwnedFd>,
    /// The accelerator, by address.
    accel: (u32, u8, u8),
    /// The bridge above it (a bridge masters no DMA: `EOPNOTSUPP`).
    bridge: Option<(u32, u8, u8)>,
}

/// Per-process state, shared by its threads.
struct Proc<'a> {
    id: u32,
    slots: Mutex<Vec<Slot>>,
    /// The file the first process opened before forking; a child is not its
    /// opener.
    inherited: BorrowedFd<'a>,
    owns_inherited: bool,
    memfds: &'a [Memfd],
    bufs: Mutex<Vec<(Arc<OwnedFd>, u64)>>,
    udmabuf_dev: Option<OwnedFd>,
    peers: &'a Peers,
    calls: AtomicU64,
    budget: u64,
    deadline: Instant,
    tally: Mutex<BTreeMap<String, u64>>,
    unexpected: Mutex<Vec<String>>,
}

fn ename(e: Errno) -> String {
    let name = match e {
        Errno::INVAL => "EINVAL",
        Errno::NOENT => "ENOENT",
        Errno::NODEV => "ENODEV",
        Errno::BADF => "EBADF",
        Errno::FAULT => "EFAULT",
        Errno::PERM => "EPERM",
        Errno::TOOMANYREFS => "ETOOMANYREFS",
        Errno::NOSPC => "ENOSPC",
        Errno::NOMEM => "ENOMEM",
        Errno::MSGSIZE => "EMSGSIZE",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::REMOTEIO => "EREMOTEIO",
        Errno::XDEV => "EXDEV",
        Errno::DQUOT => "EDQUOT",
        Errno::BUSY => "EBUSY",
        Errno::NOTBLK => "ENOTBLK",
        Errno::NXIO => "ENXIO",
        Errno::NOTTY => "ENOTTY",
        Errno::IO => "EIO",
        _ => return format!("errno {}", e.raw_os_error()),
    };
    name.into()
}

/// What a mapping ioctl may refuse with (`kmod/uapi.rs`): the peer's
/// errors as for `P2P_QUERY`, and the mapping's own.
const MAP_ERRNOS: &[Errno] = &[
    Errno::PERM,
    Errno::INVAL,
    Errno::NOENT,
    Errno::NODEV,
    Errno::BADF,
    Errno::NOTBLK,
    Errno::NXIO,
    Errno::FAULT,
    Errno::NOMEM,
    Errno::TOOMANYREFS,
    Errno::NOSPC,
    Errno::MSGSIZE,
    Errno::OPNOTSUPP,
    Errno::REMOTEIO,
    Errno::XDEV,
];

/// Which ioctl a mapping call makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MapKind {
    DmaMap,
    Pin,
    Import,
}

impl MapKind {
    fn name(self) -> &'static str {
        match self {
            MapKind::DmaMap => "DMA_MAP",
            MapKind::Pin => "PIN_USER",
            MapKind::Import => "DMABUF_IMPORT",
        }
    }
}

impl Proc<'_> {
    fn note(&self, what: String) {
        if let Ok(mut t) = self.tally.lock() {
            *t.entry(what).or_default() += 1;
        }
    }

    fn unexpected(&self, what: String) {
        if let Ok(mut u) = self.unexpected.lock() {
            if u.len() < 20 {
                u.push(what);
            } else if u.len() == 20 {
                u.push("(more left out)".into());
            }
        }
    }

    /// Counts the outcome of `op`: a refusal must be one of `allowed`.
    fn outcome<T>(&self, op: &str, r: &Result<T, Errno>, allowed: &[Errno]) {
        match r {
            Ok(_) => self.note(format!("{op} ok")),
            Err(e) if allowed.contains(e) => self.note(format!("{op} {}", ename(*e))),
            Err(e) => self.unexpected(format!("{op} gave {}", ename(*e))),
        }
    }

    fn go_on(&self) -> bool {
        self.calls.fetch_add(1, Relaxed) < self.budget && Instant::now() < self.deadline
    }

    /// A file slot at random: its file (kept open while the caller holds
    /// it), its index and generation.
    fn pick_slot(&self, rng: &mut fastrand::Rng) -> Option<(Arc<OwnedFd>, usize, u64)> {
        let slots = self.slots.lock().ok()?;
        let i = rng.usize(0..slots.len());
        Some((slots[i].fd.clone(), i, slots[i].gen))
    }

    /// Runs `f` on slot `i` if it still has generation `gen`.
    fn with_slot(&self, i: usize, gen: u64, f: impl FnOnce(&mut Slot)) {
        if let Ok(mut slots) = self.slots.lock() {
            if slots[i].gen == gen {
                f(&mut slots[i]);
            }
        }
    }

    fn peer(&self, rng: &mut fastrand::Rng) -> (u32, abi::P2pdmaPeer) {
        let by_addr = |(domain, bus, devfn): (u32, u8, u8)| {
            (
                0,
                abi::P2pdmaPeer {
                    fd: -1,
                    domain,
                    bus,
                    devfn,
                    pad0: 0,
                },
            )
        };
        let by_fd = |fd: i32| {
            (
                abi::P2PDMA_PEER_FD,
                abi::P2pdmaPeer {
                    fd,
                    ..Default::default()
                },
            )
        };
        match rng.u32(0..20) {
            0 => self
                .peers
                .bridge
                .map_or_else(|| by_addr((0, 0xfe, 0xf8)), by_addr),
            // No such function.
            1 => by_addr((0, 0xfe, 0xf8)),
            // Not a block device, not a descriptor.
            2 => by_fd(self.memfds[0].fd.as_raw_fd()),
            3 => by_fd(-7),
            4..=10 => match &self.peers.nvme {
                Some(fd) => by_fd(fd.as_raw_fd()),
                None => by_addr(self.peers.accel),
            },
            _ => by_addr(self.peers.accel),
        }
    }

    /// Direction flags, now and then with unknown bits.
    fn map_flags(rng: &mut fastrand::Rng) -> u32 {
        let dir = [
            0,
            abi::P2PDMA_MAP_PEER_READS,
            abi::P2PDMA_MAP_PEER_WRITES,
            abi::P2PDMA_MAP_PEER_READS | abi::P2PDMA_MAP_PEER_WRITES,
        ][rng.usize(0..4)];
        if rng.u32(0..40) == 0 {
            dir | 1 << rng.u32(3..32)
        } else {
            dir
        }
    }

    /// Spoils a field the ioctl must find zero; whether it did.
    fn spoil(rng: &mut fastrand::Rng, m: &mut abi::P2pdmaDmaMap) -> bool {
        if rng.u32(0..16) != 0 {
            return false;
        }
        let v = rng.u64(1..u64::MAX);
        match rng.u32(0..7) {
            0 => m.pad0 = v as u32,
            1 => m.pad1 = v as u32,
            2 => m.reserved[rng.usize(0..4)] = v,
            3 => m.map_handle = v,
            4 => m.map_type = v as u32,
            5 => m.peer.pad0 = v as u16,
            _ => m.num_segs = v as u32,
        }
        true
    }

    /// One mapping call of `kind` on a file at random (or the inherited
    /// one), checked; a mapping made is kept in its file's list.
    fn map(&self, rng: &mut fastrand::Rng, kind: MapKind) {
        let foreign = rng.u32(0..16) == 0;
        let Some((fd, slot, gen)) = self.pick_slot(rng) else {
            return;
        };
        let (flags, peer) = self.peer(rng);
        let mut m = abi::P2pdmaDmaMap {
            flags: flags | Self::map_flags(rng),
            peer,
            ..Default::default()
        };
        // What a success must have mapped, when known.
        let mut want_len = None;
        let mut buf = None;
        match kind {
            MapKind::DmaMap => {
                let alloc = self
                    .slots
                    .lock()
                    .ok()
                    .and_then(|s| (!s[slot].allocs.is_empty()).then(|| s[slot].allocs.clone()));
                let (handle, size) = match alloc {
                    Some(a) if rng.u32(0..20) != 0 => a[rng.usize(0..a.len())],
                    _ => (rng.u64(1..1 << 20), PAGE),
                };
                let pages = size / PAGE;
                let first = rng.u64(0..pages);
                let n = rng.u64(1..=pages - first);
                m.handle = handle;
                m.offset = first * PAGE;
                m.length = n * PAGE;
                match rng.u32(0..24) {
                    0 => m.offset += 1,
                    1 => m.length = size + PAGE,
                    2 => m.length = 0,
                    _ => {}
                }
                want_len = Some(m.length);
            }
            MapKind::Pin => {
                let mf = &self.memfds[rng.usize(0..self.memfds.len())];
                let first = rng.u64(0..MEMFD_PAGES);
                let n = rng.u64(1..=MEMFD_PAGES - first);
                m.user_va = mf.addr + first * PAGE;
                m.length = n * PAGE;
                match rng.u32(0..24) {
                    0 => m.user_va += 8,
                    1 => m.length = 0,
                    // Nothing is mapped at the first page.
                    2 => m.user_va = PAGE,
                    _ => {}
                }
                want_len = Some(m.length);
            }
            MapKind::Import => {
                let picked = self.bufs.lock().ok().and_then(|b| {
                    (!b.is_empty()).then(|| {
                        let (f, size) = &b[rng.usize(0..b.len())];
                        (f.clone(), *size)
                    })
                });
                match (picked, rng.u32(0..24)) {
                    (_, 0) => m.dmabuf_fd = self.memfds[0].fd.as_raw_fd(),
                    (_, 1) => m.dmabuf_fd = -1,
                    (Some((f, size)), _) => {
                        m.dmabuf_fd = f.as_raw_fd();
                        want_len = Some(size);
                        buf = Some(f);
                    }
                    (None, _) => return,
                }
            }
        }
        let spoiled = Self::spoil(rng, &mut m);
        let mut segs = vec![abi::P2pdmaDmaSeg::default(); rng.usize(0..=80)];
        let file = if foreign { self.inherited } else { fd.as_fd() };
        let r = match kind {
            MapKind::DmaMap => sys::dma_map(file, &mut m, &mut segs),
            MapKind::Pin => sys::pin_user(file, &mut m, &mut segs),
            MapKind::Import => sys::dmabuf_import(file, &mut m, &mut segs),
        };
        drop(buf);
        let op = kind.name();
        let allowed: &[Errno] = if spoiled {
            &[Errno::INVAL, Errno::PERM]
        } else if foreign && !self.owns_inherited {
            &[Errno::PERM]
        } else {
            MAP_ERRNOS
        };
        self.outcome(op, &r, allowed);
        if r.is_err() {
            return;
        }
        if foreign && !self.owns_inherited {
            return;
        }
        // A mapping: its segments add up to it, it is live, and it goes
        // into the file's list (unless the file was replaced meanwhile:
        // then it went with it).
        let n = m.num_segs as usize;
        let total: u64 = segs.iter().take(n).map(|s| s.len).sum();
        if n == 0 || n > segs.len() || total != m.length || want_len.is_some_and(|w| w != m.length)
        {
            self.unexpected(format!(
                "{op}: {n} segments of {total} bytes for a mapping of {} (asked {want_len:?}, room for {})",
                m.length,
                segs.len()
            ));
        }
        let mut st = abi::P2pdmaHandleState {
            handle: m.map_handle,
            ..Default::default()
        };
        match sys::handle_state(file, &mut st) {
            Ok(()) if st.state == abi::P2PDMA_STATE_LIVE => {}
            Ok(()) => self.unexpected(format!("{op}: mapping {} not live", m.map_handle)),
            Err(e) => self.unexpected(format!(
                "{op}: HANDLE_STATE of {}: {}",
                m.map_handle,
                ename(e)
            )),
        }
        if foreign {
            // The first process's own inherited file: released at its end.
            let _ = unmap_handle(file, m.map_handle);
            return;
        }
        let mut extra = None;
        self.with_slot(slot, gen, |s| {
            s.maps.push(m.map_handle);
            if s.maps.len() > MAPS_PER_FILE {
                extra = Some(s.maps.remove(rng.usize(0..s.maps.len())));
            }
        });
        if let Some(h) = extra {
            self.unmap_known(&fd, h);
        }
    }

    /// `UNMAP` of a mapping this file holds: it must go.
    fn unmap_known(&self, fd: &OwnedFd, h: u64) {
        let r = unmap_handle(fd, h);
        match r {
            Ok(()) => self.note("UNMAP ok".into()),
            Err(e) => self.unexpected(format!("UNMAP of live mapping {h}: {}", ename(e))),
        }
    }

    fn unmap(&self, rng: &mut fastrand::Rng) {
        let Some((fd, slot, gen)) = self.pick_slot(rng) else {
            return;
        };
        if rng.u32(0..8) == 0 {
            // A handle the file does not have, or a bad argument.
            let mut u = abi::P2pdmaUnmap {
                map_handle: rng.u64(1 << 40..1 << 41),
                ..Default::default()
            };
            let want: &[Errno] = if rng.bool() {
                u.flags = 1;
                &[Errno::INVAL]
            } else {
                &[Errno::NOENT]
            };
            let r = unmap(&*fd, u);
            self.outcome("UNMAP (bad)", &r, want);
            if r.is_ok() {
                self.unexpected("UNMAP of a handle never given succeeded".into());
            }
            return;
        }
        let mut h = None;
        self.with_slot(slot, gen, |s| {
            if !s.maps.is_empty() {
                h = Some(s.maps.swap_remove(rng.usize(0..s.maps.len())));
            }
        });
        if let Some(h) = h {
            self.unmap_known(&fd, h);
        }
    }

    fn alloc(&self, rng: &mut fastrand::Rng) {
        let foreign = rng.u32(0..16) == 0;
        let Some((fd, slot, gen)) = self.pick_slot(rng) else {
            return;
        };
        let mut a = abi::P2pdmaAlloc {
            size: rng.u64(1..=4) * PAGE - rng.u64(0..2) * 100,
            align: [0, 0, 0, PAGE, 8 * PAGE, 3 * PAGE][rng.usize(0..6)],
            ..Default::default()
        };
        let mut want: &[Errno] = &[
            Errno::INVAL,
            Errno::NODEV,
            Errno::NOMEM,
            Errno::DQUOT,
            Errno::PERM,
        ];
        match rng.u32(0..24) {
            0 => a.size = 0,
            1 => a.dev_index = 63,
            2 => a.reserved[1] = 5,
            _ => {}
        }
        if foreign && !self.owns_inherited {
            want = &[Errno::PERM];
        }
        let file = if foreign { self.inherited } else { fd.as_fd() };
        let r = sys::alloc(file, &mut a);
        self.outcome("ALLOC", &r, want);
        if r.is_err() || foreign {
            if r.is_ok() {
                let _ = free(file, a.handle);
            }
            return;
        }
        let mut extra = None;
        self.with_slot(slot, gen, |s| {
            s.allocs.push((a.handle, a.size));
            if s.allocs.len() > ALLOCS_PER_FILE {
                extra = Some(s.allocs.remove(0));
            }
        });
        if let Some((h, _)) = extra {
            let r = free(&*fd, h);
            self.outcome("FREE", &r, &[Errno::BUSY]);
        }
    }

    fn free(&self, rng: &mut fastrand::Rng) {
        let Some((fd, slot, gen)) = self.pick_slot(rng) else {
            return;
        };
        let mut picked = None;
        self.with_slot(slot, gen, |s| {
            if !s.allocs.is_empty() {
                picked = Some(s.allocs.swap_remove(rng.usize(0..s.allocs.len())));
            }
        });
        let Some((h, size)) = picked else {
            return;
        };
        let r = free(&*fd, h);
        // Mapped by `DMA_MAP`: it stays.
        self.outcome("FREE", &r, &[Errno::BUSY]);
        if r.is_err() {
            self.with_slot(slot, gen, |s| s.allocs.push((h, size)));
        }
    }

    fn udmabuf(&self, rng: &mut fastrand::Rng) {
        let Some(dev) = &self.udmabuf_dev else {
            return;
        };
        if rng.u32(0..3) == 0 {
            // Close one.
            if let Ok(mut b) = self.bufs.lock() {
                if !b.is_empty() {
                    let i = rng.usize(0..b.len());
                    b.swap_remove(i);
                }
            }
            return;
        }
        let mf = &self.memfds[rng.usize(0..self.memfds.len())];
        let first = rng.u64(0..MEMFD_PAGES);
        let n = rng.u64(1..=MEMFD_PAGES - first);
        match sys::udmabuf_create(dev, &mf.fd, first * PAGE, n * PAGE) {
            Ok(f) => {
                if let Ok(mut b) = self.bufs.lock() {
                    b.push((Arc::new(f), n * PAGE));
                    if b.len() > BUFS {
                        b.remove(0);
                    }
                }
                self.note("UDMABUF_CREATE ok".into());
            }
            Err(e) => self.note(format!("UDMABUF_CREATE {}", ename(e))),
        }
    }

    fn query(&self, rng: &mut fastrand::Rng) {
        let (flags, peer) = self.peer(rng);
        let mut q = abi::P2pdmaP2pQuery {
            dev_index: if rng.u32(0..16) == 0 { 40 } else { 0 },
            flags,
            peer,
            ..Default::default()
        };
        if rng.u32(0..16) == 0 {
            q.reserved[0] = 1;
        }
        let fd = self.inherited;
        let r = sys::p2p_query(fd, &mut q);
        self.outcome(
            "P2P_QUERY",
            &r,
            &[
                Errno::INVAL,
                Errno::NODEV,
                Errno::BADF,
                Errno::NOTBLK,
                Errno::NXIO,
            ],
        );
    }

    fn handle_state(&self, rng: &mut fastrand::Rng) {
        let Some((fd, slot, gen)) = self.pick_slot(rng) else {
            return;
        };
        let mut known = None;
        self.with_slot(slot, gen, |s| {
            if !s.maps.is_empty() {
                known = Some(s.maps[rng.usize(0..s.maps.len())]);
            }
        });
        let mut st = abi::P2pdmaHandleState {
            handle: known.unwrap_or(1 << 41),
            ..Default::default()
        };
        let r = sys::handle_state(&*fd, &mut st);
        // A mapping this thread saw listed may be unmapped by another one
        // meanwhile.
        self.outcome("HANDLE_STATE", &r, &[Errno::NOENT]);
        if r.is_ok() && st.state != abi::P2PDMA_STATE_LIVE {
            self.unexpected(format!("HANDLE_STATE: {} is not live", st.handle));
        }
    }

    /// Closes a file (it goes once no thread uses it any more, with all its
    /// allocations and mappings) and opens a new one in its place.
    fn reopen(&self, rng: &mut fastrand::Rng) {
        let new = match open_module() {
            Ok(f) => f,
            Err(e) => {
                self.unexpected(format!("open /dev/p2pdma: {}", ename(e)));
                return;
            }
        };
        if let Ok(mut slots) = self.slots.lock() {
            let i = rng.usize(0..slots.len());
            let s = &mut slots[i];
            s.fd = Arc::new(new);
            s.gen += 1;
            s.allocs.clear();
            s.maps.clear();
        }
        self.note("reopen".into());
    }

    fn worker(&self, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        while self.go_on() {
            match rng.u32(0..100) {
                0..=9 => self.udmabuf(&mut rng),
                10..=29 => self.map(&mut rng, MapKind::Import),
                30..=47 => self.map(&mut rng, MapKind::Pin),
                48..=55 => self.alloc(&mut rng),
                56..=69 => self.map(&mut rng, MapKind::DmaMap),
                70..=84 => self.unmap(&mut rng),
                85..=88 => self.free(&mut rng),
                89..=92 => self.handle_state(&mut rng),
                93..=97 => self.query(&mut rng),
                _ => self.reopen(&mut rng),
            }
        }
    }

    /// Releases everything the files hold, each call checked, then closes
    /// them.
    fn finish(&self) {
        let slots = match self.slots.lock() {
            Ok(mut s) => std::mem::take(&mut *s),
            Err(_) => return,
        };
        for s in slots {
            for h in s.maps {
                self.unmap_known(&s.fd, h);
            }
            for (h, _) in s.allocs {
                let r = free(&*s.fd, h);
                if let Err(e) = r {
                    self.unexpected(format!("FREE of allocation {h} at the end: {}", ename(e)));
                }
            }
        }
    }

    /// Runs the threads, releases everything, and prints what happened;
    /// whether nothing unexpected did.
    fn run(&self, threads: u32, seed: u64) -> bool {
        let start = Instant::now();
        thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || self.worker(seed ^ (u64::from(self.id) << 32 | u64::from(t))));
            }
        });
        self.finish();
        let tally = self.tally.lock().map(|t| t.clone()).unwrap_or_default();
        let unexpected = self
            .unexpected
            .lock()
            .map(|u| u.clone())
            .unwrap_or_default();
        let calls: u64 = tally.values().sum();
        println!(
            "ioctl-fuzz process {}: {calls} calls in {:.1} s, {} unexpected",
            self.id,
            start.elapsed().as_secs_f64(),
            unexpected.len()
        );
        println!(
            "ioctl-fuzz process {}: {}",
            self.id,
            tally
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for u in &unexpected {
            println!("ioctl-fuzz process {}: UNEXPECTED {u}", self.id);
        }
        unexpected.is_empty()
    }
}

fn open_module() -> Result<OwnedFd, Errno> {
    open("/dev/p2pdma", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
}

/// A sealed memfd of [`MEMFD_PAGES`] pages (as udmabuf wants it), mapped
/// shared.
fn shared_memfd(i: usize) -> Result<Memfd, String> {
    let fd = memfd_create(format!("p2pdma-fuzz-{i}"), MemfdFlags::ALLOW_SEALING)
        .map_err(|e| format!("memfd_create: {}", ename(e)))?;
    ftruncate(&fd, MEMFD_PAGES * PAGE).map_err(|e| format!("ftruncate: {}", ename(e)))?;
    fcntl_add_seals(&fd, SealFlags::SHRINK).map_err(|e| format!("F_ADD_SEALS: {}", ename(e)))?;
    // SAFETY: A new shared mapping at an address the kernel picks: it
    // overlaps nothing Rust uses; it stays for the life of the process and
    // is only read and written by the kernel and the peers (no Rust
    // reference to it is formed).
    let addr = unsafe {
        mmap(
            std::ptr::null_mut(),
            (MEMFD_PAGES * PAGE) as usize,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            &fd,
            0,
        )
    }
    .map_err(|e| format!("mmap of the memfd: {}", ename(e)))?;
    Ok(Memfd {
        fd,
        addr: addr as u64,
    })
}

/// The PCI address `dddd:bb:dd.f` as (domain, bus, devfn).
fn parse_pci(s: &str) -> Option<(u32, u8, u8)> {
    let mut it = s.split([':', '.']);
    let domain = u32::from_str_radix(it.next()?, 16).ok()?;
    let bus = u8::from_str_radix(it.next()?, 16).ok()?;
    let dev = u8::from_str_radix(it.next()?, 16).ok()?;
    let func = u8::from_str_radix(it.next()?, 16).ok()?;
    (it.next().is_none() && dev < 32 && func < 8).then_some((domain, bus, dev << 3 | func))
}

fn pci_name((domain, bus, devfn): (u32, u8, u8)) -> String {
    format!("{domain:04x}:{bus:02x}:{:02x}.{}", devfn >> 3, devfn & 7)
}

fn p2pmem_available(accel: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/bus/pci/devices/{accel}/p2pmem/available"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub(crate) fn run(x: &FuzzArgs) -> Result<(), String> {
    if x.files == 0 || x.threads == 0 {
        return Err("--files and --threads must be at least 1".into());
    }
    let inherited = open_module().map_err(|e| format!("open /dev/p2pdma: {}", ename(e)))?;
    let info =
        sys::device_info(&inherited, 0).map_err(|e| format!("DEVICE_INFO 0: {}", ename(e)))?;
    let accel = (info.domain, info.bus, info.devfn);
    let accel_name = pci_name(accel);
    // The accelerator's path in sysfs names the bridge above it.
    let bridge = std::fs::canonicalize(format!("/sys/bus/pci/devices/{accel_name}"))
        .ok()
        .and_then(|p| {
            p.parent()
                .and_then(|b| b.file_name())
                .and_then(|n| n.to_str())
                .and_then(parse_pci)
        });
    let peers = Peers {
        nvme: open(
            x.nvme.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok(),
        accel,
        bridge,
    };
    let baseline = p2pmem_available(&accel_name);
    let memfds = (0..MEMFDS)
        .map(shared_memfd)
        .collect::<Result<Vec<_>, _>>()?;
    let procs = x.procs + 1;
    let budget = x.calls / u64::from(procs);
    let deadline = Instant::now() + Duration::from_secs(x.seconds);
    println!(
        "ioctl-fuzz: seed {}, {procs} processes x {} threads, {} files each, up to {} calls or {} s; accelerator {accel_name}, bridge {}, NVMe peer {}",
        x.seed,
        x.threads,
        x.files,
        budget * u64::from(procs),
        x.seconds,
        bridge.map_or("none".into(), pci_name),
        if peers.nvme.is_some() { x.nvme.as_str() } else { "none" },
    );

    // Fork first, while this process has one thread.
    let mut children = Vec::new();
    let mut id = 0;
    for i in 1..procs {
        // SAFETY: The process has a single thread here (no thread was
        // started yet), so the child may run any code.
        match unsafe { libc::fork() } {
            -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
            0 => {
                id = i;
                children.clear();
                break;
            }
            pid => children.push(pid),
        }
    }
    let p = Proc {
        id,
        slots: Mutex::new(Vec::new()),
        inherited: inherited.as_fd(),
        owns_inherited: id == 0,
        memfds: &memfds,
        bufs: Mutex::new(Vec::new()),
        udmabuf_dev: open(
            "/dev/udmabuf",
            OFlags::RDWR | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok(),
        peers: &peers,
        calls: AtomicU64::new(0),
        budget,
        deadline,
        tally: Mutex::new(BTreeMap::new()),
        unexpected: Mutex::new(Vec::new()),
    };
    let mut setup = Ok(());
    for _ in 0..x.files {
        match open_module() {
            Ok(fd) => p.slots.lock().map_err(|_| "poisoned")?.push(Slot {
                fd: Arc::new(fd),
                gen: 0,
                allocs: Vec::new(),
                maps: Vec::new(),
            }),
            Err(e) => setup = Err(format!("open /dev/p2pdma: {}", ename(e))),
        }
    }
    let clean = setup.is_ok() && p.run(x.threads, x.seed);
    if let Err(e) = &setup {
        println!("ioctl-fuzz process {id}: {e}");
    }
    if id != 0 {
        // A forked child ends here, without unwinding into the parent's
        // code.
        std::process::exit(if clean { 0 } else { 1 });
    }

    let mut failed = Vec::new();
    if !clean {
        failed.push("process 0".to_string());
    }
    for (i, pid) in children.iter().enumerate() {
        let mut status = 0;
        // SAFETY: Waits for a child of this process; `status` is a live
        // local.
        let r = unsafe { libc::waitpid(*pid, &mut status, 0) };
        if r != *pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            failed.push(format!("process {} (status {status:#x})", i + 1));
        }
    }
    drop(p);
    drop(inherited);
    // Everything was released or closed: the memory is all back.
    if let Some(before) = baseline {
        let stop = Instant::now() + Duration::from_secs(5);
        loop {
            let now = p2pmem_available(&accel_name);
            if now == Some(before) {
                break;
            }
            if Instant::now() > stop {
                failed.push(format!(
                    "p2pmem/available is {now:?}, was {before} before the run"
                ));
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
    if failed.is_empty() {
        println!("ioctl-fuzz: every refusal was a documented errno, every mapping made unmapped cleanly, the memory is back");
        Ok(())
    } else {
        Err(format!("ioctl-fuzz failed: {}", failed.join(", ")))
    }
}
