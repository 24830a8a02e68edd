//! `PIN_USER` of a host buffer and the arguments it refuses, and the limits
//! of `PIN_USER` and `DMABUF_IMPORT`: overlapping pins, read-only buffers,
//! huge pages against the peer's segment size, and `RLIMIT_MEMLOCK`.

use std::{
    io::{Read, Seek, SeekFrom},
    os::fd::AsFd,
    time::Duration,
};

use p2pdma::{
    sys::{self, HostBuffer},
    Peer,
};
use p2pdma_abi as abi;
use rustix::{
    fs::{fcntl_add_seals, ftruncate, memfd_create, open, MemfdFlags, Mode, OFlags, SealFlags},
    io::Errno,
    mm::{mmap_anonymous, munmap, MapFlags, MprotectFlags, ProtFlags},
    process::getuid,
};

use super::{
    all, child_outcome, ename, skip, want_errno, want_lib_errno, want_ok, Ctx, Why, KIB, MIB, PAGE,
    R,
};
use crate::util::{first_difference, pattern};

/// The largest DMA segment a PCI function takes unless its driver says
/// otherwise (the kernel's default `max_seg_size`), which the accelerator
/// stand-in keeps.
const DEFAULT_MAX_SEG: u64 = 64 * KIB;

/// Size of the huge-page buffers.
const HUGE_LEN: u64 = 4 * MIB;

/// An anonymous `MAP_HUGETLB` mapping, unmapped on drop.
struct HugetlbMap {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

impl HugetlbMap {
    /// Maps `len` bytes of huge pages, reserving them now (so that touching
    /// them later cannot fail).
    #[allow(unsafe_code)]
    fn new(len: usize) -> Result<Self, Errno> {
        // SAFETY: A NULL hint lets the kernel choose an address, so the new
        // mapping overlaps nothing Rust uses.
        let ptr = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::HUGETLB,
            )
        }?;
        Ok(Self { ptr, len })
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Touches every page so the buffer is backed before it is pinned.
    #[allow(unsafe_code)]
    fn fill(&self, byte: u8) {
        // SAFETY: The mapping is `len` writable bytes this value owns, and
        // its huge pages were reserved by `mmap`.
        unsafe { std::ptr::write_bytes(self.ptr.cast::<u8>(), byte, self.len) }
    }
}

impl Drop for HugetlbMap {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are what `mmap` returned; nothing refers into
        // the mapping.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}

/// The `AnonHugePages` of the mapping of this process that contains `addr`,
/// in bytes, from `/proc/self/smaps`.
fn anon_huge_bytes(addr: u64) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                return kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .map(|k| k * KIB);
            }
        }
    }
    None
}

/// The longest run of physically contiguous pages in `[addr, addr + len)`,
/// in bytes, from `/proc/self/pagemap` (root sees the frame numbers).
fn longest_contiguous_run(addr: u64, len: u64) -> Result<u64, String> {
    let mut f = std::fs::File::open("/proc/self/pagemap")
        .map_err(|e| format!("open /proc/self/pagemap: {e}"))?;
    let pages = (len / PAGE) as usize;
    let mut raw = vec![0u8; pages * 8];
    f.seek(SeekFrom::Start(addr / PAGE * 8))
        .and_then(|_| f.read_exact(&mut raw))
        .map_err(|e| format!("read /proc/self/pagemap: {e}"))?;
    let pfns: Vec<Option<u64>> = raw
        .chunks_exact(8)
        .map(|c| {
            let v = u64::from_ne_bytes(c.try_into().unwrap_or_default());
            let pfn = v & ((1 << 55) - 1);
            (v >> 63 == 1 && pfn != 0).then_some(pfn)
        })
        .collect();
    let (mut best, mut run) = (0u64, 0u64);
    for i in 0..pfns.len() {
        run = match (i.checked_sub(1).and_then(|j| pfns[j]), pfns[i]) {
            (Some(prev), Some(cur)) if cur == prev + 1 => run + 1,
            (_, Some(_)) => 1,
            _ => 0,
        };
        best = best.max(run);
    }
    Ok(best * PAGE)
}

impl Ctx {
    pub(super) fn pin_user(&self) -> R {
        let len = MIB as usize;
        let buf = HostBuffer::new(len).map_err(|e| format!("host buffer: {e}"))?;
        let data = pattern(61, 0, len);
        buf.write_raw(0, &data)
            .map_err(|e| format!("host buffer: {e}"))?;
        let m = self.module.pin_user(buf.addr(), MIB, self.host_peer())?;
        let checks = (|| {
            self.check_segs(&m, MIB, false)?;
            for &(addr, l) in &m.segs {
                ensure!(
                    addr % PAGE == 0 && l % PAGE == 0,
                    "segment {addr:#x}+{l:#x} of page-aligned memory not page aligned"
                );
            }
            let mut now = vec![0u8; len];
            buf.read_raw(0, &mut now)
                .map_err(|e| format!("host buffer: {e}"))?;
            if let Some(d) = first_difference(&data, &now) {
                fail!("pinning changed the buffer: {d}");
            }
            Ok(())
        })();
        let u = self.module.unmap(m).map_err(Why::from);
        all(vec![checks, u])
    }

    pub(super) fn pin_user_bad(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let peer = self.host_peer();
        let pin = |va: u64, len: u64| {
            let r = self.module.pin_user(va, len, peer);
            if let Ok(m) = &r {
                let _ = self.unmap_raw(m.map_handle());
            }
            r
        };
        // Nothing may allocate between unmapping the buffer and the ioctl,
        // or the allocator could map something at the same address.
        let (flags, p) = peer.to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer: p,
            length: 2 * PAGE,
            ..Default::default()
        };
        let mut segs = [abi::P2pdmaDmaSeg::default(); 8];
        let b = HostBuffer::new(2 * PAGE as usize).map_err(|e| format!("host buffer: {e}"))?;
        arg.user_va = b.addr();
        drop(b);
        let unmapped = sys::pin_user(&self.module, &mut arg, &mut segs);
        if unmapped.is_ok() {
            let _ = self.unmap_raw(arg.map_handle);
        }
        all(vec![
            want_errno("PIN_USER of unmapped memory", unmapped, Errno::FAULT),
            want_lib_errno(
                "PIN_USER at an unaligned address",
                pin(buf.addr() + 1, PAGE),
                Errno::INVAL,
            ),
            want_lib_errno(
                "PIN_USER of 4097 bytes",
                pin(buf.addr(), PAGE + 1),
                Errno::INVAL,
            ),
            want_lib_errno("PIN_USER of 0 bytes", pin(buf.addr(), 0), Errno::INVAL),
            want_lib_errno(
                "PIN_USER of 1 GiB + 4 KiB",
                pin(buf.addr(), (1 << 30) + PAGE),
                Errno::INVAL,
            ),
        ])
    }

    pub(super) fn pin_user_enospc(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let (flags, peer) = self.host_peer().to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer,
            user_va: buf.addr(),
            length: 64 * KIB,
            ..Default::default()
        };
        let r = sys::pin_user(&self.module, &mut arg, &mut []);
        self.want_enospc("PIN_USER with max_segs 0", r, &arg)
    }

    /// `PIN_USER` with `flags` added to the peer's, with room for a segment
    /// per page.
    fn pin_flags(&self, va: u64, len: u64, peer: Peer<'_>, flags: u32) -> Result<RawPin, Errno> {
        let (pf, p) = peer.to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags: pf | flags,
            peer: p,
            user_va: va,
            length: len,
            ..Default::default()
        };
        let n = ((len / PAGE) as usize + 1).min(1 << 16);
        let mut segs = vec![abi::P2pdmaDmaSeg::default(); n];
        sys::pin_user(&self.module, &mut arg, &mut segs)?;
        segs.truncate(arg.num_segs as usize);
        Ok(RawPin {
            map_handle: arg.map_handle,
            length: arg.length,
            segs: segs.iter().map(|s| (s.addr, s.len)).collect(),
        })
    }

    /// The same 4 KiB page pinned again and again for one peer: up to
    /// `P2PDMA_MAX_PIN_OVERLAP` pins succeed, more get `ETOOMANYREFS`
    /// (tried until 10 pins, past the DMA API's own limit of 1 + 7
    /// mappings of a cacheline); after one UNMAP, one more succeeds.
    pub(super) fn pin_overlap(&self) -> R {
        const TRIES: u32 = 10;
        let max = abi::P2PDMA_MAX_PIN_OVERLAP;
        let buf = HostBuffer::new(PAGE as usize).map_err(|e| format!("host buffer: {e}"))?;
        buf.fill(0x5a);
        let peer = self.host_peer();
        let mut held = Vec::new();
        let mut checks = Vec::new();
        for i in 1..=TRIES {
            let r = self.pin_flags(buf.addr(), PAGE, peer, 0);
            if let Ok(m) = &r {
                held.push(m.map_handle);
            }
            checks.push(if i <= max {
                want_ok(&format!("pin {i} of the page"), r).map(|_| ())
            } else {
                want_errno(
                    &format!("pin {i} of the page (over {max})"),
                    r,
                    Errno::TOOMANYREFS,
                )
            });
        }
        if let Some(first) = held.first().copied() {
            checks.push(want_ok("UNMAP of the first pin", self.unmap_raw(first)));
            held.remove(0);
            let r = self.pin_flags(buf.addr(), PAGE, peer, 0);
            if let Ok(m) = &r {
                held.push(m.map_handle);
            }
            checks.push(want_ok("a pin after one UNMAP", r).map(|_| ()));
        }
        for h in held {
            checks.push(want_ok("UNMAP afterwards", self.unmap_raw(h)));
        }
        all(checks)
    }

    /// A read-only buffer pins with `P2PDMA_MAP_PEER_READS` (the peer only
    /// reads it), not for a peer that writes; unknown flag bits are refused.
    pub(super) fn pin_readonly(&self) -> R {
        let len = 64 * KIB;
        let buf = HostBuffer::new(len as usize).map_err(|e| format!("host buffer: {e}"))?;
        let data = pattern(91, 0, len as usize);
        buf.write_raw(0, &data)
            .map_err(|e| format!("host buffer: {e}"))?;
        protect(&buf, MprotectFlags::READ)?;
        let peer = self.host_peer();
        let pin = |flags: u32| {
            let r = self.pin_flags(buf.addr(), len, peer, flags);
            if let Ok(m) = &r {
                let _ = self.unmap_raw(m.map_handle);
            }
            r
        };
        let reads = pin(abi::P2PDMA_MAP_PEER_READS);
        let checks = all(vec![
            match &reads {
                Ok(m) => self.check_seg_list(m.length, &m.segs, len, false),
                Err(e) => fail!(
                    "PIN_USER of a read-only buffer with P2PDMA_MAP_PEER_READS gave {}",
                    ename(*e)
                ),
            },
            want_errno(
                "PIN_USER of a read-only buffer for a peer that reads and writes",
                pin(0),
                Errno::FAULT,
            ),
            want_errno(
                "PIN_USER of a read-only buffer with P2PDMA_MAP_PEER_WRITES",
                pin(abi::P2PDMA_MAP_PEER_WRITES),
                Errno::FAULT,
            ),
            want_errno("PIN_USER with unknown flag 0x80", pin(0x80), Errno::INVAL),
            want_errno(
                "PIN_USER with unknown flag 0x8000_0000",
                pin(0x8000_0000),
                Errno::INVAL,
            ),
        ]);
        protect(&buf, MprotectFlags::READ | MprotectFlags::WRITE)?;
        let mut now = vec![0u8; len as usize];
        buf.read_raw(0, &mut now)
            .map_err(|e| format!("host buffer: {e}"))?;
        if let Some(d) = first_difference(&data, &now) {
            fail!("the read-only buffer changed: {d}");
        }
        checks
    }

    /// 4 MiB of huge pages (or, in a kernel without them, physically
    /// contiguous 4 KiB pages) pinned for the accelerator itself, whose
    /// segments are at most 64 KiB: the pin must work and its segments
    /// cover the buffer exactly (the debug kernel's DMA-API checks catch a
    /// segment longer than the peer takes).
    pub(super) fn pin_huge_self(&self) -> R {
        if !getuid().is_root() {
            return skip("needs root (huge page pool, page frame numbers)");
        }
        let peer = self.self_peer();
        let pin_and_check = |addr: u64, how: &str| -> R {
            let m = self
                .module
                .pin_user(addr, HUGE_LEN, peer)
                .map_err(|e| format!("PIN_USER of {how} for the accelerator: {e}"))?;
            let r = self.check_segs(&m, HUGE_LEN, false);
            let u = self.module.unmap(m).map_err(Why::from);
            all(vec![r, u])
        };

        // Transparent huge pages: HostBuffer asks for them.
        let thp = HostBuffer::new(HUGE_LEN as usize).map_err(|e| format!("host buffer: {e}"))?;
        thp.fill(0xa7);
        let thp_bytes = anon_huge_bytes(thp.addr()).unwrap_or(0);
        if thp_bytes >= 2 * MIB {
            return pin_and_check(thp.addr(), "transparent huge pages");
        }

        // hugetlb pages, from a pool this case sizes.
        let pool = "/proc/sys/vm/nr_hugepages";
        let hugetlb = if std::path::Path::new(pool).exists() {
            let _ = std::fs::write(pool, "8");
            HugetlbMap::new(HUGE_LEN as usize).map_err(ename)
        } else {
            Err(format!("no {pool}"))
        };
        match hugetlb {
            Ok(h) => {
                h.fill(0xa8);
                pin_and_check(h.addr(), "MAP_HUGETLB pages")
            }
            Err(why_not) => {
                // Physically contiguous ordinary pages make the same long
                // segments.
                let run = longest_contiguous_run(thp.addr(), HUGE_LEN)?;
                if run > DEFAULT_MAX_SEG {
                    return pin_and_check(
                        thp.addr(),
                        &format!(
                            "4 KiB pages with a {} KiB physically contiguous run",
                            run / KIB
                        ),
                    );
                }
                skip(format!(
                    "no huge page: AnonHugePages {} KiB after MADV_HUGEPAGE, MAP_HUGETLB: {why_not}; and the longest physically contiguous run of a 4 MiB buffer is {} KiB",
                    thp_bytes / KIB,
                    run / KIB
                ))
            }
        }
    }

    /// A udmabuf over a `MFD_HUGETLB` memfd imported for the accelerator
    /// itself: the import works and its segments cover the buffer.
    pub(super) fn dmabuf_hugetlb_self(&self) -> R {
        if !getuid().is_root() {
            return skip("needs root (huge page pool)");
        }
        let pool = "/proc/sys/vm/nr_hugepages";
        if std::path::Path::new(pool).exists() {
            let _ = std::fs::write(pool, "8");
        }
        let memfd = match memfd_create(
            "p2pdma-sanity-huge",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB,
        ) {
            Ok(fd) => fd,
            Err(e) => return skip(format!("memfd_create with MFD_HUGETLB: {}", ename(e))),
        };
        if let Err(e) = ftruncate(&memfd, HUGE_LEN) {
            return skip(format!(
                "a {} MiB MFD_HUGETLB memfd: {}",
                HUGE_LEN / MIB,
                ename(e)
            ));
        }
        fcntl_add_seals(&memfd, SealFlags::SHRINK)
            .map_err(|e| format!("F_ADD_SEALS F_SEAL_SHRINK: {}", ename(e)))?;
        let dev = match open(
            p2pdma::memory::udmabuf::UDMABUF_NODE,
            OFlags::RDWR | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(d) => d,
            Err(e) => {
                return skip(format!(
                    "{}: {}",
                    p2pdma::memory::udmabuf::UDMABUF_NODE,
                    ename(e)
                ))
            }
        };
        let dmabuf = match sys::udmabuf_create(&dev, &memfd, 0, HUGE_LEN) {
            Ok(b) => b,
            Err(e) => return skip(format!("udmabuf refuses a hugetlb memfd: {}", ename(e))),
        };
        let m = self
            .module
            .dmabuf_import(dmabuf.as_fd(), self.self_peer())
            .map_err(|e| format!("DMABUF_IMPORT of a hugetlb udmabuf for the accelerator: {e}"))?;
        let r = self.check_segs(&m, HUGE_LEN, false);
        let u = self.module.unmap(m).map_err(Why::from);
        all(vec![r, u])
    }

    /// `RLIMIT_MEMLOCK` bounds what a process without `CAP_IPC_LOCK` pins:
    /// a helper keeps `CAP_SYS_RAWIO`, drops `CAP_IPC_LOCK`, sets the limit
    /// to 64 KiB and pins (see `__child memlock`).
    pub(super) fn pin_memlock(&self) -> R {
        if !getuid().is_root() {
            return skip("needs root, to drop one capability and keep another");
        }
        let (kv, out) = self.run_helper(&self.helper_args("memlock"), Duration::from_secs(60))?;
        let get = |k: &str| child_outcome(&kv, &out, k);
        ensure!(
            kv.get("caps").map(String::as_str) == Some("1"),
            "the helper could not drop CAP_IPC_LOCK and keep CAP_SYS_RAWIO: {}",
            out.trim()
        );
        all(vec![
            want_errno(
                "PIN_USER of 128 KiB under a 64 KiB RLIMIT_MEMLOCK",
                get("big")?,
                Errno::NOMEM,
            ),
            want_ok("the first PIN_USER of 32 KiB", get("first")?),
            want_ok(
                "the second PIN_USER of 32 KiB (64 KiB pinned)",
                get("second")?,
            ),
            want_errno(
                "a third PIN_USER of 32 KiB (96 KiB)",
                get("third")?,
                Errno::NOMEM,
            ),
            want_ok("UNMAP of the first", get("unmap")?),
            want_ok("PIN_USER of 32 KiB after that UNMAP", get("again")?),
        ])
    }
}

/// `mprotect` of a host buffer.
#[allow(unsafe_code)]
fn protect(buf: &HostBuffer, prot: MprotectFlags) -> R {
    // SAFETY: The range is the buffer's own pages; no reference into it
    // exists while it is read-only (the buffer is only accessed through
    // copies, and not during this case's read-only phase).
    unsafe { rustix::mm::mprotect(buf.as_raw().cast(), buf.len(), prot) }
        .map_err(|e| Why::Fail(format!("mprotect: {}", ename(e))))
}

/// What a `PIN_USER` sent by hand made: its handle, the length it mapped
/// and the segments.
struct RawPin {
    map_handle: u64,
    length: u64,
    segs: Vec<(u64, u64)>,
}
