//! `BLOCK_IO`: block I/O the module builds on an allocation's own pages,
//! checked byte for byte against what the kernel's own reads of the
//! namespace return, in both directions, with the page cache in play, and
//! refused with the documented errno for every bad argument.

use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use p2pdma::{sys::HostBuffer, DeviceMapping};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use super::{
    all, ename, scratch_file,
    unbind::{Unbinding, UNBIND_DEADLINE},
    want_errno, Ctx, Suite, Why, KIB, MIB, R,
};
use crate::util::{first_difference, pattern};

/// Bytes of the namespace the write cases use, at its end; restored after.
const SCRATCH: u64 = MIB;

impl Ctx {
    /// The namespace opened again, `flags` added (`O_RDWR`, `O_DIRECT`).
    fn nvme_with(&self, flags: OFlags) -> Result<OwnedFd, Why> {
        self.nvme()?;
        open(
            self.nvme_path.as_str(),
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Why::Fail(format!("open {}: {}", self.nvme_path, ename(e))))
    }

    /// `len` bytes of the namespace at `offset`, read with `O_DIRECT` by
    /// the kernel's own block-device path: the reference.
    fn nvme_bytes(&self, offset: u64, len: usize) -> Result<Vec<u8>, Why> {
        let fd = self.nvme_with(OFlags::RDONLY | OFlags::DIRECT)?;
        let buf = HostBuffer::new(len).map_err(|e| format!("host buffer: {}", ename(e)))?;
        let n = buf
            .pread_from(&fd, offset, 0, len)
            .map_err(|e| format!("O_DIRECT pread of the namespace: {}", ename(e)))?;
        if n != len {
            return Err(Why::Fail(format!("O_DIRECT pread gave {n} of {len} bytes")));
        }
        let mut out = vec![0u8; len];
        buf.read_raw(0, &mut out)
            .map_err(|e| format!("host buffer: {}", ename(e)))?;
        Ok(out)
    }

    /// Size of the namespace.
    fn nvme_size(&self) -> Result<u64, Why> {
        let fd = self.nvme()?;
        rustix::fs::seek(fd, rustix::fs::SeekFrom::End(0))
            .map_err(|e| Why::Fail(format!("size of {}: {}", self.nvme_path, ename(e))))
    }

    /// `BLOCK_IO` of `segs` on allocation `handle` through `fd`.
    fn block_io(
        &self,
        handle: u64,
        fd: &impl AsFd,
        write: bool,
        segs: &[abi::P2pdmaIoSeg],
        depth: u32,
    ) -> Result<u64, Errno> {
        let mut arg = abi::P2pdmaBlockIo {
            handle,
            fd: fd.as_fd().as_raw_fd(),
            flags: if write { abi::P2PDMA_IO_WRITE } else { 0 },
            depth,
            ..Default::default()
        };
        self.block_io_arg(&mut arg, segs)?;
        Ok(arg.bytes)
    }

    /// Reads three segments, out of order, one at a memory offset inside a
    /// page, into poisoned memory: each lands where it was asked to, with
    /// the namespace's bytes, and nothing else of the memory changes. Where
    /// the kernel refuses P2P between the two, `EREMOTEIO` and the memory is
    /// untouched.
    pub(super) fn block_io_read(&self) -> R {
        let nvme = self.nvme_with(OFlags::RDONLY)?;
        let p2p = self.nvme_p2p()?;
        let a = self.module.alloc(self.dev, 4 * MIB, 0)?;
        let map = a.map()?;
        let poison = vec![0xA5u8; map.len()];
        map.write_at(0, &poison)?;
        let segs = [
            seg(2 * MIB + 512, 3 * MIB, MIB),
            seg(64 * KIB, 128 * KIB, 512 * KIB),
            seg(3 * MIB + 512 * KIB, 7 * MIB, 4 * KIB),
        ];
        let r = self.block_io(a.handle(), &nvme, false, &segs, 2);
        let mut expect = poison.clone();
        if !p2p {
            let checks = vec![
                want_errno("BLOCK_IO where P2P is refused", r, Errno::REMOTEIO),
                same_memory(&map, &expect, "after the refused BLOCK_IO"),
            ];
            return all(checks);
        }
        let n = r.map_err(|e| format!("BLOCK_IO read: {}", ename(e)))?;
        let total: u64 = segs.iter().map(|s| s.len).sum();
        ensure_bytes(n, total)?;
        for s in &segs {
            let want = self.nvme_bytes(s.dev_offset, s.len as usize)?;
            let m = s.mem_offset as usize;
            expect[m..m + want.len()].copy_from_slice(&want);
        }
        same_memory(&map, &expect, "after BLOCK_IO read")
    }

    /// Writes memory to the last MiB of the namespace, which is restored
    /// afterwards: the kernel's `O_DIRECT` reads and its page cache (filled
    /// before the write) both show the new bytes. Then a buffered write left
    /// dirty in the page cache is what a `BLOCK_IO` read returns.
    pub(super) fn block_io_write(&self) -> R {
        let rw = self.nvme_with(OFlags::RDWR)?;
        let p2p = self.nvme_p2p()?;
        let at = (self.nvme_size()? - SCRATCH) / (4 * KIB) * (4 * KIB);
        let original = self.nvme_bytes(at, SCRATCH as usize)?;
        let r = self.block_io_write_checks(&rw, p2p, at, &original);
        // Put the namespace back as it was, through the page cache, synced.
        let restore = rustix::io::pwrite(&rw, &original, at)
            .and_then(|n| {
                rustix::fs::fsync(&rw)?;
                Ok(n)
            })
            .map_err(|e| Why::Fail(format!("restoring the namespace: {}", ename(e))))
            .and_then(|n| {
                if n == original.len() {
                    Ok(())
                } else {
                    Err(Why::Fail(format!(
                        "restored {n} of {} bytes",
                        original.len()
                    )))
                }
            });
        all(vec![r, restore])
    }

    fn block_io_write_checks(&self, rw: &OwnedFd, p2p: bool, at: u64, original: &[u8]) -> R {
        let len = SCRATCH as usize;
        let a = self.module.alloc(self.dev, 2 * MIB, 0)?;
        let map = a.map()?;
        let data = pattern(41, 0, len);
        map.write_at(4 * KIB as usize, &data)?;
        // Fill the page cache with the old bytes.
        let mut cached = vec![0u8; len];
        rustix::io::pread(rw, &mut cached, at)
            .map_err(|e| format!("buffered pread: {}", ename(e)))?;
        let segs = [
            seg(4 * KIB + SCRATCH / 2, at + SCRATCH / 2, SCRATCH / 2),
            seg(4 * KIB, at, SCRATCH / 2),
        ];
        let r = self.block_io(a.handle(), rw, true, &segs, 0);
        if !p2p {
            return all(vec![
                want_errno("BLOCK_IO write where P2P is refused", r, Errno::REMOTEIO),
                same(
                    original,
                    &self.nvme_bytes(at, len)?,
                    "the namespace after the refused write",
                ),
            ]);
        }
        let n = r.map_err(|e| format!("BLOCK_IO write: {}", ename(e)))?;
        ensure_bytes(n, SCRATCH)?;
        let mut checks = vec![same(
            &data,
            &self.nvme_bytes(at, len)?,
            "O_DIRECT read after BLOCK_IO write",
        )];
        let mut back = vec![0u8; len];
        checks.push(
            rustix::io::pread(rw, &mut back, at)
                .map_err(|e| Why::Fail(format!("buffered pread: {}", ename(e))))
                .and_then(|_| {
                    same(
                        &data,
                        &back,
                        "buffered read after BLOCK_IO write (stale page cache)",
                    )
                }),
        );
        // A dirty page the module must write back before reading.
        let dirty = pattern(42, 0, 8 * KIB as usize);
        let w = rustix::io::pwrite(rw, &dirty, at + 16 * KIB);
        checks.push(
            w.map(|_| ())
                .map_err(|e| Why::Fail(format!("buffered pwrite: {}", ename(e)))),
        );
        let poison = vec![0xA5u8; map.len()];
        map.write_at(0, &poison)?;
        let rd = [seg(0, at, 64 * KIB)];
        match self.block_io(a.handle(), rw, false, &rd, 0) {
            Ok(_) => {
                let mut expect = data[..64 * KIB as usize].to_vec();
                expect[16 * KIB as usize..24 * KIB as usize].copy_from_slice(&dirty);
                let mut got = vec![0u8; 64 * KIB as usize];
                map.read_at(0, &mut got)?;
                checks.push(same(
                    &expect,
                    &got,
                    "BLOCK_IO read of a range with dirty page cache",
                ));
            }
            Err(e) => checks.push(Err(Why::Fail(format!("BLOCK_IO read: {}", ename(e))))),
        }
        all(checks)
    }

    /// Every malformed request gets its errno, and none of them moves a
    /// byte: the memory and the namespace are as they were.
    pub(super) fn block_io_bad_args(&self) -> R {
        let ro = self.nvme_with(OFlags::RDONLY)?;
        let size = self.nvme_size()?;
        let a = self.module.alloc(self.dev, MIB, 0)?;
        let map = a.map()?;
        let poison = vec![0x5Au8; map.len()];
        map.write_at(0, &poison)?;
        let before = self.nvme_bytes(0, 64 * KIB as usize)?;
        let h = a.handle();
        let good = seg(0, 0, 64 * KIB);
        let raw = |f: &dyn Fn(&mut abi::P2pdmaBlockIo), segs: &[abi::P2pdmaIoSeg], fd: i32| {
            let mut arg = abi::P2pdmaBlockIo {
                handle: h,
                fd,
                ..Default::default()
            };
            f(&mut arg);
            self.block_io_arg(&mut arg, segs)
        };
        let fd = ro.as_raw_fd();
        let null = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("/dev/null: {}", ename(e)))?;
        let file = scratch_file("block-io")?;
        let many = vec![good; abi::P2PDMA_IO_MAX_SEGS as usize + 1];
        let mut checks = vec![
            want_errno("flags 2", raw(&|a| a.flags = 2, &[good], fd), Errno::INVAL),
            want_errno(
                "reserved[3] 1",
                raw(&|a| a.reserved[3] = 1, &[good], fd),
                Errno::INVAL,
            ),
            want_errno(
                "bytes 1 on input",
                raw(&|a| a.bytes = 1, &[good], fd),
                Errno::INVAL,
            ),
            want_errno("no segments", raw(&|_| {}, &[], fd), Errno::INVAL),
            want_errno(
                "P2PDMA_IO_MAX_SEGS + 1 segments",
                raw(&|_| {}, &many, fd),
                Errno::INVAL,
            ),
            want_errno(
                "depth P2PDMA_IO_MAX_DEPTH + 1",
                raw(&|a| a.depth = abi::P2PDMA_IO_MAX_DEPTH + 1, &[good], fd),
                Errno::INVAL,
            ),
            want_errno("length 0", raw(&|_| {}, &[seg(0, 0, 0)], fd), Errno::INVAL),
            want_errno(
                "length 100",
                raw(&|_| {}, &[seg(0, 0, 100)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "device offset 1",
                raw(&|_| {}, &[seg(0, 1, 4 * KIB)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "memory offset 1",
                raw(&|_| {}, &[seg(1, 0, 4 * KIB)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "past the device's end",
                raw(&|_| {}, &[seg(0, size - 4 * KIB, 8 * KIB)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "device offset overflowing",
                raw(&|_| {}, &[seg(0, u64::MAX - 4095, 8 * KIB)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "past the allocation's end",
                raw(&|_| {}, &[seg(MIB - 4 * KIB, 0, 8 * KIB)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "a good segment, then a bad one",
                raw(&|_| {}, &[good, seg(0, 0, 100)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "over P2PDMA_IO_MAX_SEG_LEN",
                raw(&|_| {}, &[seg(0, 0, abi::P2PDMA_IO_MAX_SEG_LEN + 4096)], fd),
                Errno::INVAL,
            ),
            want_errno(
                "no such handle",
                raw(&|a| a.handle = h + 1000, &[good], fd),
                Errno::NOENT,
            ),
            want_errno("fd -1", raw(&|_| {}, &[good], -1), Errno::BADF),
            want_errno(
                "fd of /dev/null",
                raw(&|_| {}, &[good], null.as_raw_fd()),
                Errno::NOTBLK,
            ),
            want_errno(
                "fd of a regular file",
                raw(&|_| {}, &[good], file.as_raw_fd()),
                Errno::NOTBLK,
            ),
            want_errno(
                "write through a read-only descriptor",
                raw(&|a| a.flags = abi::P2PDMA_IO_WRITE, &[good], fd),
                Errno::BADF,
            ),
            want_errno(
                "segments at address 0",
                self.block_io_raw_arg(&mut abi::P2pdmaBlockIo {
                    handle: h,
                    fd,
                    num_segs: 1,
                    ..Default::default()
                }),
                Errno::FAULT,
            ),
        ];
        checks.push(same_memory(
            &map,
            &poison,
            "the memory after the refused requests",
        ));
        checks.push(same(
            &before,
            &self.nvme_bytes(0, 64 * KIB as usize)?,
            "the namespace after the refused requests",
        ));
        let freed = a.handle();
        drop(map);
        drop(a);
        checks.push(want_errno(
            "a freed handle",
            raw(&|a| a.handle = freed, &[good], fd),
            Errno::NOENT,
        ));
        all(checks)
    }
}

impl Ctx {
    /// Threads keep `BLOCK_IO` reads in flight while the accelerator is
    /// unbound: the unbind returns (after the I/O it waits for), every
    /// call either moved all its bytes or failed with `ENODEV`, and after
    /// the unbind every call is `ENODEV`. Then the device is bound again.
    /// The debug kernel's KASAN and lockdep watch the memory's lifetime.
    pub(super) fn unbind_during_block_io(&mut self, suite: &mut Suite) {
        let r = (|| {
            if !self.nvme_p2p()? {
                return Err(Why::Skip(
                    "the kernel refuses P2P between the NVMe and the accelerator: no block I/O to race".into(),
                ));
            }
            let drv = self.unbind_ready()?;
            Ok(drv)
        })();
        let drv = match r {
            Ok(d) => d,
            Err(e) => return suite.report("unbind-during-block-io", Err(e)),
        };
        let (pci, old_size) = (self.accel.pci, self.accel.p2p_size);
        let (r, unbound) = self.block_io_unbind(&drv);
        suite.report("unbind-during-block-io", r);
        if unbound {
            let r = self.bind_again(&drv, pci, old_size);
            suite.report("unbind-during-block-io-rebind", r);
        }
    }

    /// The race of [`unbind_during_block_io`](Self::unbind_during_block_io):
    /// the verdict, and whether the device was unbound.
    fn block_io_unbind(&self, drv: &std::path::Path) -> (R, bool) {
        const THREADS: usize = 2;
        let mut allocs = Vec::new();
        for _ in 0..THREADS {
            match self.module.alloc(self.dev, 4 * MIB, 0) {
                Ok(a) => allocs.push(a),
                Err(e) => return (Err(e.into()), false),
            }
        }
        let nvme = match self.nvme_with(OFlags::RDONLY) {
            Ok(f) => f,
            Err(e) => return (Err(e), false),
        };
        let unbound = Arc::new(AtomicBool::new(false));
        let calls = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let segs: Vec<abi::P2pdmaIoSeg> = (0..8)
            .map(|i| seg(i * 512 * KIB, i * 512 * KIB, 512 * KIB))
            .collect();
        let (verdict, was_unbound) = thread::scope(|sc| {
            let workers: Vec<_> = allocs
                .iter()
                .map(|a| {
                    let (h, nvme, segs) = (a.handle(), &nvme, &segs);
                    let (unbound, calls, stop) = (&unbound, &calls, &stop);
                    sc.spawn(move || -> R {
                        let mut after = 0;
                        while !stop.load(SeqCst) && after < 3 {
                            let done_before = unbound.load(SeqCst);
                            match self.block_io(h, nvme, false, segs, 4) {
                                Ok(n) if n == 4 * MIB && !done_before => {}
                                Ok(n) if n == 4 * MIB => {
                                    return Err(Why::Fail(
                                        "BLOCK_IO worked after the unbind had returned".into(),
                                    ))
                                }
                                Ok(n) => {
                                    return Err(Why::Fail(format!(
                                        "BLOCK_IO moved {n} bytes of {}",
                                        4 * MIB
                                    )))
                                }
                                Err(Errno::NODEV) => {}
                                Err(e) => return Err(Why::Fail(format!("BLOCK_IO: {}", ename(e)))),
                            }
                            calls.fetch_add(1, SeqCst);
                            if done_before {
                                after += 1;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            let start = Instant::now();
            while calls.load(SeqCst) < 4 && start.elapsed() < Duration::from_secs(30) {
                thread::sleep(Duration::from_millis(5));
            }
            let unbinding = Unbinding::start(drv, self.accel.pci, unbound.clone());
            let res = unbinding.wait(UNBIND_DEADLINE);
            let mut verdict = Vec::new();
            let was_unbound = match res {
                Some(Ok(())) => true,
                Some(Err(e)) => {
                    verdict.push(Err(Why::Fail(format!("unbind: {e}"))));
                    false
                }
                None => {
                    stop.store(true, SeqCst);
                    let late = unbinding.wait(Duration::from_secs(30)).is_some();
                    verdict.push(Err(Why::Fail(format!(
                        "the unbind did not return within {} s with block I/O in flight{}",
                        UNBIND_DEADLINE.as_secs(),
                        if late {
                            " (it did once the I/O stopped)"
                        } else {
                            ""
                        }
                    ))));
                    late
                }
            };
            if !was_unbound {
                stop.store(true, SeqCst);
            }
            for w in workers {
                verdict.push(
                    w.join()
                        .unwrap_or_else(|_| Err(Why::Fail("a worker panicked".into()))),
                );
            }
            (all(verdict), was_unbound)
        });
        for a in allocs {
            let _ = a.into_handle();
        }
        (verdict, was_unbound)
    }
}

fn seg(mem_offset: u64, dev_offset: u64, len: u64) -> abi::P2pdmaIoSeg {
    abi::P2pdmaIoSeg {
        mem_offset,
        dev_offset,
        len,
    }
}

fn ensure_bytes(n: u64, want: u64) -> R {
    if n == want {
        Ok(())
    } else {
        Err(Why::Fail(format!(
            "BLOCK_IO says {n} bytes moved, {want} asked"
        )))
    }
}

fn same(want: &[u8], got: &[u8], what: &str) -> R {
    match first_difference(want, got) {
        None => Ok(()),
        Some(d) => Err(Why::Fail(format!("{what}: {d}"))),
    }
}

fn same_memory(map: &DeviceMapping, want: &[u8], what: &str) -> R {
    let mut got = vec![0u8; want.len()];
    map.read_at(0, &mut got)?;
    same(want, &got, what)
}

/// The kernel's hung-task detector: its timeout and how many hung tasks it
/// has reported.
const HUNG_TIMEOUT: &str = "/proc/sys/kernel/hung_task_timeout_secs";
const HUNG_COUNT: &str = "/proc/sys/kernel/hung_task_detect_count";

/// Where a swap header keeps its magic, and the magic.
const SWAP_MAGIC_AT: usize = 4096 - 10;
const SWAP_MAGIC: &[u8] = b"SWAPSPACE2";

/// Completed flush requests of the disk `name` (`/sys/block/<name>/stat`,
/// field 16).
fn disk_flushes(name: &str) -> Result<u64, Why> {
    let path = format!("/sys/block/{name}/stat");
    let s = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    s.split_whitespace()
        .nth(15)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| Why::Fail(format!("{path} has no flush count: {:?}", s.trim())))
}

/// A swap header (version 1) for a device of `size` bytes.
fn swap_header(size: u64) -> Vec<u8> {
    let mut h = vec![0u8; 4 * KIB as usize];
    h[1024..1028].copy_from_slice(&1u32.to_le_bytes());
    let last = (size / (4 * KIB))
        .saturating_sub(1)
        .min(u64::from(u32::MAX)) as u32;
    h[1028..1032].copy_from_slice(&last.to_le_bytes());
    h[SWAP_MAGIC_AT..].copy_from_slice(SWAP_MAGIC);
    h
}

/// `swapon(2)` (`on`) or `swapoff(2)` of the block device at `path`.
#[allow(unsafe_code)]
fn swap(path: &str, on: bool) -> Result<(), Errno> {
    use nix::libc;
    let c = std::ffi::CString::new(path).map_err(|_| Errno::INVAL)?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; neither
    // call keeps the pointer.
    let rc = unsafe {
        if on {
            libc::swapon(c.as_ptr(), 0)
        } else {
            libc::swapoff(c.as_ptr())
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ))
    }
}

impl Ctx {
    /// `--nvme-swap`, or a skip.
    fn swap_dev(&self) -> Result<String, Why> {
        self.nvme_swap
            .clone()
            .ok_or_else(|| Why::Skip("no --nvme-swap namespace given".into()))
    }

    /// `--nvme-slow`, or a skip.
    fn slow_dev(&self) -> Result<String, Why> {
        self.nvme_slow
            .clone()
            .ok_or_else(|| Why::Skip("no --nvme-slow namespace given".into()))
    }

    /// With a namespace in use as swap (a swap header written to it, then
    /// `swapon`), `pwrite` of its first page gets `ETXTBSY`, and so must a
    /// `BLOCK_IO` write of the same bytes. The namespace's first page is
    /// put back afterwards.
    pub(super) fn block_io_swap(&self) -> R {
        if !rustix::process::getuid().is_root() {
            return super::skip("needs root, for swapon");
        }
        let path = self.swap_dev()?;
        let rw = open(path.as_str(), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("open {path}: {}", ename(e)))?;
        let size = rustix::fs::seek(&rw, rustix::fs::SeekFrom::End(0))
            .map_err(|e| format!("size of {path}: {}", ename(e)))?;
        let mut original = vec![0u8; 4 * KIB as usize];
        rustix::io::pread(&rw, &mut original, 0)
            .map_err(|e| format!("pread of {path}: {}", ename(e)))?;
        let header = swap_header(size);
        rustix::io::pwrite(&rw, &header, 0)
            .and_then(|_| rustix::fs::fsync(&rw))
            .map_err(|e| format!("writing a swap header to {path}: {}", ename(e)))?;
        let r = match swap(&path, true) {
            Ok(()) => {
                let r = self.block_io_swap_checks(&rw, &header);
                let off = swap(&path, false)
                    .map_err(|e| Why::Fail(format!("swapoff {path}: {}", ename(e))));
                all(vec![r, off])
            }
            Err(e) => Err(Why::Fail(format!("swapon {path}: {}", ename(e)))),
        };
        let restore = rustix::io::pwrite(&rw, &original, 0)
            .and_then(|_| rustix::fs::fsync(&rw))
            .map(|_| ())
            .map_err(|e| Why::Fail(format!("restoring the first page of {path}: {}", ename(e))));
        all(vec![r, restore])
    }

    fn block_io_swap_checks(&self, rw: &OwnedFd, header: &[u8]) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let map = a.map()?;
        map.write_at(0, header)?;
        all(vec![
            want_errno(
                "pwrite of the first page of an active swap device (the reference)",
                rustix::io::pwrite(rw, header, 0),
                Errno::TXTBSY,
            ),
            want_errno(
                "BLOCK_IO write of the same bytes",
                self.block_io(a.handle(), rw, true, &[seg(0, 0, 4 * KIB)], 0),
                Errno::TXTBSY,
            ),
        ])
    }

    /// A `BLOCK_IO` write through a descriptor opened with `O_DSYNC` (or
    /// `O_SYNC`) is durable when the call returns, as `pwrite` on it would
    /// be: the disk sees a flush (its flush count in `/sys/block/*/stat`
    /// grows); the same write without either flag sends none.
    pub(super) fn block_io_dsync(&self) -> R {
        let path = self.slow_dev()?;
        if !self.nvme_p2p()? {
            return super::skip("P2P is refused here: BLOCK_IO moves nothing");
        }
        let name = path.trim_start_matches("/dev/").to_string();
        let wc = std::fs::read_to_string(format!("/sys/block/{name}/queue/write_cache"))
            .map_err(|e| format!("write_cache of {name}: {e}"))?;
        if wc.trim() != "write back" {
            fail!(
                "{name} has write cache {:?}: a flush would not reach it",
                wc.trim()
            );
        }
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let segs = [seg(0, 0, 64 * KIB)];
        let mut checks = Vec::new();
        for (what, flags, want_flush) in [
            ("no sync flag", OFlags::empty(), false),
            ("O_DSYNC", OFlags::DSYNC, true),
            ("O_SYNC", OFlags::SYNC, true),
        ] {
            let fd = open(
                path.as_str(),
                OFlags::RDWR | OFlags::CLOEXEC | flags,
                Mode::empty(),
            )
            .map_err(|e| format!("open {path} with {what}: {}", ename(e)))?;
            let before = disk_flushes(&name)?;
            let r = self.block_io(a.handle(), &fd, true, &segs, 0);
            let after = disk_flushes(&name)?;
            checks.push(match r {
                Err(e) => Err(Why::Fail(format!("BLOCK_IO write with {what}: {}", ename(e)))),
                Ok(_) if want_flush && after == before => Err(Why::Fail(format!(
                    "BLOCK_IO write with {what} returned and {name} saw no flush ({before} before and after)"
                ))),
                Ok(_) if !want_flush && after != before => Err(Why::Fail(format!(
                    "BLOCK_IO write with {what}: {name}'s flush count went from {before} to {after}"
                ))),
                Ok(_) => Ok(()),
            });
        }
        all(checks)
    }

    /// One long read from a slow (throttled) namespace, a single bio of
    /// 8 MiB that takes several seconds, with the hung-task detector's
    /// timeout at 2 s: the caller waits for I/O the way the block layer
    /// does, so the detector reports nothing (its count stays), and the
    /// memory holds what the namespace holds (zeros).
    pub(super) fn block_io_slow(&self) -> R {
        const LEN: u64 = 8 * MIB;
        if !rustix::process::getuid().is_root() {
            return super::skip("needs root, to set the hung-task timeout");
        }
        let path = self.slow_dev()?;
        if !self.nvme_p2p()? {
            return super::skip("P2P is refused here: BLOCK_IO moves nothing");
        }
        let old = std::fs::read_to_string(HUNG_TIMEOUT)
            .map_err(|e| format!("{HUNG_TIMEOUT}: {e} (no CONFIG_DETECT_HUNG_TASK?)"))?;
        let count = || -> Result<u64, Why> { Ok(super::read_sysfs_u64(HUNG_COUNT)?) };
        let fd = open(
            path.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("open {path}: {}", ename(e)))?;
        let a = self.module.alloc(self.dev, LEN, 0)?;
        let map = a.map()?;
        map.write_at(0, &vec![0xA5u8; LEN as usize])?;
        std::fs::write(HUNG_TIMEOUT, "2").map_err(|e| format!("{HUNG_TIMEOUT}: {e}"))?;
        let before = count();
        let started = Instant::now();
        let r = self.block_io(a.handle(), &fd, false, &[seg(0, 0, LEN)], 1);
        let took = started.elapsed();
        // One more detector period, for a report of the wait's last part.
        thread::sleep(Duration::from_secs(3));
        let after = count();
        let restore = std::fs::write(HUNG_TIMEOUT, old.trim())
            .map_err(|e| Why::Fail(format!("restoring {HUNG_TIMEOUT}: {e}")));
        let (before, after) = (before?, after?);
        let mut checks = vec![restore];
        match r {
            Ok(n) => {
                checks.push(ensure_bytes(n, LEN));
                checks.push(same_memory(
                    &map,
                    &vec![0u8; LEN as usize],
                    "after the slow read",
                ));
            }
            Err(e) => checks.push(Err(Why::Fail(format!(
                "BLOCK_IO read of {path}: {}",
                ename(e)
            )))),
        }
        if took < Duration::from_secs(4) {
            checks.push(Err(Why::Fail(format!(
                "the read took {:.1} s: {path} is not slow enough to test the wait",
                took.as_secs_f64()
            ))));
        }
        if after != before {
            checks.push(Err(Why::Fail(format!(
                "the hung-task detector reported {} task(s) during a {:.1} s BLOCK_IO",
                after - before,
                took.as_secs_f64()
            ))));
        }
        all(checks)
    }
}
