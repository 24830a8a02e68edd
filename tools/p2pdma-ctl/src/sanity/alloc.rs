//! Allocations: their sizes, alignment and data, `FREE`, the `ALLOC`
//! arguments the module refuses, what an allocation starts with, and how
//! much of the pool one user may hold.

use std::{
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use p2pdma_abi as abi;
use rustix::{io::Errno, process::getuid};

use super::{
    all, child_outcome, round_up, skip, verify, want_errno, want_ok, write_verify, Ctx, Why, KIB,
    MIB, PAGE, R,
};
use crate::{
    child::NOBODY,
    proc::Ended,
    util::{first_difference, pattern},
};

/// The module parameter that bounds an unprivileged user's share.
const USER_SHARE: &str = "/sys/module/p2pdma/parameters/user_share";

/// `user_share`'s documented default, in percent.
const USER_SHARE_DEFAULT: u64 = 50;

impl Ctx {
    pub(super) fn alloc_verify(&self, size: u64, align: u64, seed: u64) -> R {
        let before = self.available()?;
        let a = self.module.alloc(self.dev, size, align)?;
        let want = round_up(size, PAGE);
        ensure!(
            a.size() == want,
            "ALLOC of {size} bytes returned size {}, expected {want}",
            a.size()
        );
        ensure!(
            a.mmap_offset() % PAGE == 0,
            "mmap offset {:#x} not page aligned",
            a.mmap_offset()
        );
        let during = self.available()?;
        ensure!(
            before.saturating_sub(during) >= want,
            "p2pmem/available fell by {} bytes for a {want}-byte allocation",
            before as i128 - during as i128
        );
        if align > 0 {
            self.check_bus_alignment(&a, align)?;
        }
        let map = a.map()?;
        ensure!(map.len() as u64 == want, "mapping of {} bytes", map.len());
        write_verify(&map, seed)?;
        // Overwrite the second half: the first must keep its bytes.
        let half = map.len() / 2 + 3;
        map.write_at(half, &pattern(seed + 1, half as u64, map.len() - half))?;
        let mut expect = pattern(seed, 0, half);
        expect.extend(pattern(seed + 1, half as u64, map.len() - half));
        let mut back = vec![0u8; map.len()];
        map.read_at(0, &mut back)?;
        if let Some(d) = first_difference(&expect, &back) {
            fail!("after overwriting from byte {half:#x}: {d}");
        }
        drop(map);
        a.free()?;
        self.leak_check()
    }

    /// Checks, by a `DMA_MAP` with the accelerator itself as the peer (its
    /// own bus addresses), that the allocation starts at a bus address
    /// aligned to `align` and lies in the BAR.
    fn check_bus_alignment(&self, a: &p2pdma::Allocation<'_>, align: u64) -> R {
        let m = self
            .module
            .dma_map(a.handle(), 0, a.size(), self.self_peer())?;
        let r = (|| {
            self.check_segs(&m, a.size(), true)?;
            let bus = m.segs[0].0;
            ensure!(
                bus % align == 0,
                "allocation aligned to {align:#x} starts at bus address {bus:#x} (offset {:#x} into the BAR)",
                bus - self.accel.bar_bus_addr
            );
            Ok(())
        })();
        let u = self.module.unmap(m).map_err(Why::from);
        all(vec![r, u])
    }

    pub(super) fn alloc_distinct(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let b = self.module.alloc(self.dev, 64 * KIB, 0)?;
        ensure!(
            a.handle() != b.handle(),
            "two allocations share handle {}",
            a.handle()
        );
        let (ao, bo) = (a.mmap_offset(), b.mmap_offset());
        ensure!(
            ao + a.size() <= bo || bo + b.size() <= ao,
            "mmap offsets overlap: {ao:#x}+{:#x} and {bo:#x}+{:#x}",
            a.size(),
            b.size()
        );
        let (ma, mb) = (a.map()?, b.map()?);
        ma.write_at(0, &pattern(11, 0, ma.len()))?;
        mb.write_at(0, &pattern(12, 0, mb.len()))?;
        verify(&ma, 11, "first allocation")?;
        verify(&mb, 12, "second allocation")
    }

    pub(super) fn free_double(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let h = a.handle();
        a.free()?;
        want_errno("second FREE", self.free_raw(h), Errno::NOENT)
    }

    pub(super) fn free_never_issued(&self) -> R {
        want_errno(
            "FREE of handle u64::MAX",
            self.free_raw(u64::MAX),
            Errno::NOENT,
        )
    }

    pub(super) fn free_bad_args(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let good = abi::P2pdmaFree {
            handle: a.handle(),
            ..Default::default()
        };
        all(vec![
            want_errno(
                "FREE with flags 1",
                self.free_arg(abi::P2pdmaFree { flags: 1, ..good }),
                Errno::INVAL,
            ),
            want_errno(
                "FREE with reserved0 1",
                self.free_arg(abi::P2pdmaFree {
                    reserved0: 1,
                    ..good
                }),
                Errno::INVAL,
            ),
            want_errno(
                "FREE with reserved[1] 1",
                self.free_arg(abi::P2pdmaFree {
                    reserved: [0, 1],
                    ..good
                }),
                Errno::INVAL,
            ),
            a.free()
                .map_err(|e| Why::Fail(format!("FREE after the refused ones: {e}"))),
        ])
    }

    pub(super) fn alloc_bad(
        &self,
        what: &str,
        want: Errno,
        f: impl FnOnce(&mut abi::P2pdmaAlloc),
    ) -> R {
        want_errno(what, self.raw_alloc(f), want)
    }

    pub(super) fn alloc_free_slot(&self) -> R {
        let Some(slot) = self.free_slot() else {
            return skip("all 64 device slots are in use");
        };
        self.alloc_bad(&format!("ALLOC on empty slot {slot}"), Errno::NODEV, |a| {
            a.dev_index = slot
        })
    }

    /// The `user_share` parameter in percent, and the share of this
    /// device's P2P memory it gives one user, in whole pages.
    fn user_share(&self) -> Result<(u64, u64), Why> {
        let pct = match std::fs::read_to_string(USER_SHARE) {
            Ok(s) => s
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{USER_SHARE} holds {:?}", s.trim()))?,
            // An old module has no such parameter: hold it to the default.
            Err(_) => USER_SHARE_DEFAULT,
        };
        Ok((pct, (self.accel.p2p_size * pct / 100) & !(PAGE - 1)))
    }

    /// Waits up to 5 s for `p2pmem/available` to reach `want` again.
    fn wait_available(&self, want: u64, what: &str) -> R {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let now = self.available()?;
            if now >= want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                fail!("{what}: p2pmem/available is {now} after 5 s, expected {want}");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A helper allocates most of the free P2P memory, fills it with 0xA5
    /// and exits without freeing; the same amount allocated next must read
    /// as zeros, every byte of it.
    pub(super) fn alloc_zeroed(&self) -> R {
        const FILL: u8 = 0xa5;
        let avail = self.available()?;
        let size = (avail / MIB).saturating_sub(1) * MIB;
        ensure!(size >= MIB, "only {avail} bytes of P2P memory are free");
        let child = self.spawn_child(
            &[
                "fill-exit".into(),
                "--dev".into(),
                self.dev.to_string(),
                "--size".into(),
                size.to_string(),
                "--byte".into(),
                FILL.to_string(),
            ],
            Stdio::null(),
        )?;
        let (ended, out) = self.finish_child(child, Duration::from_secs(120));
        ensure!(
            ended == Ended::Exited(0) && out.starts_with("filled"),
            "the helper that fills {size} bytes {ended}: {}",
            out.trim()
        );
        self.wait_available(avail, "after the filling helper exited")?;

        let a = self.module.alloc(self.dev, size, 0)?;
        let map = a.map()?;
        let mut buf = vec![0u8; MIB as usize];
        let (mut nonzero, mut stale) = (0u64, 0u64);
        let mut first = None;
        let mut off = 0usize;
        while off < map.len() {
            let n = buf.len().min(map.len() - off);
            map.read_at(off, &mut buf[..n])?;
            if buf[..n].iter().any(|&b| b != 0) {
                for (i, &b) in buf[..n].iter().enumerate() {
                    if b != 0 {
                        nonzero += 1;
                        stale += u64::from(b == FILL);
                        first.get_or_insert((off + i, b));
                    }
                }
            }
            off += n;
        }
        drop(map);
        a.free()?;
        if let Some((at, b)) = first {
            fail!(
                "{nonzero} of the {size} bytes of a new allocation are not zero, {stale} of them the 0x{FILL:02x} the previous owner left (first at offset {at:#x}: {b:#04x})"
            );
        }
        self.leak_check()
    }

    /// A helper running as uid 65534 (no `CAP_SYS_ADMIN`) holds at most
    /// `user_share` percent of the device: one page more gets `EDQUOT`, the
    /// whole share works, and two files of that user together are bounded
    /// the same way.
    pub(super) fn pool_share(&self) -> R {
        if !getuid().is_root() {
            return skip("needs root, to drop privileges");
        }
        let (pct, share) = self.user_share()?;
        let size = self.accel.p2p_size;
        if share + PAGE > size {
            return skip(format!("user_share is {pct}%: no allocation can exceed it"));
        }
        ensure!(
            share >= 2 * PAGE,
            "a share of {share} bytes ({pct}% of {size}) is too small to split"
        );
        let avail = self.available()?;
        ensure!(
            avail >= share + PAGE,
            "only {avail} bytes free, {} needed to tell EDQUOT from ENOMEM",
            share + PAGE
        );
        let (kv, out) = self.run_helper(
            &[
                "pool-share".into(),
                "--dev".into(),
                self.dev.to_string(),
                "--share".into(),
                share.to_string(),
            ],
            Duration::from_secs(60),
        )?;
        ensure!(
            kv.get("uid").map(String::as_str) == Some(NOBODY.to_string().as_str()),
            "the helper did not drop to uid {NOBODY}: {}",
            out.trim()
        );
        let get = |k: &str| child_outcome(&kv, &out, k);
        let mib = |b: u64| b as f64 / MIB as f64;
        let r = all(vec![
            want_errno(
                &format!(
                    "ALLOC of {:.2} MiB, one page over the {pct}% share",
                    mib(share + PAGE)
                ),
                get("over")?,
                Errno::DQUOT,
            ),
            want_ok(
                &format!("ALLOC of the whole share, {:.2} MiB", mib(share)),
                get("whole")?,
            ),
            want_ok("ALLOC of half the share on one file", get("split_a")?),
            want_ok("ALLOC of the other half on a second file", get("split_b")?),
            want_errno(
                "one page more on the first file, with the share held over two",
                get("beyond_a")?,
                Errno::DQUOT,
            ),
            want_errno(
                "one page more on the second file, with the share held over two",
                get("beyond_b")?,
                Errno::DQUOT,
            ),
        ]);
        all(vec![r, self.leak_check()])
    }
}

/// `unshare(CLONE_NEWUSER)`: a user namespace of the caller's own.
#[allow(unsafe_code)]
fn unshare_user_ns() -> Result<(), Errno> {
    use nix::libc;
    // SAFETY: `unshare` takes no pointers; it changes only this process's
    // namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ))
    }
}

/// `prctl(PR_SET_DUMPABLE, 1)`.
#[allow(unsafe_code)]
fn set_dumpable() -> Result<(), Errno> {
    use nix::libc;
    // SAFETY: `PR_SET_DUMPABLE` takes an integer and no pointers.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ))
    }
}

/// The uid a user namespace maps `nobody` to in [`Ctx::pool_share_userns`].
const NS_UID: u32 = 1000;

impl Ctx {
    /// The share is the kernel's user's, whatever uid a user namespace
    /// shows: a forked child drops to uid 65534 (no `CAP_SYS_ADMIN`), takes
    /// its whole share, then enters a user namespace of its own where it
    /// is uid 1000, and one page more, on a second file, gets `EDQUOT`.
    pub(super) fn pool_share_userns(&self) -> R {
        if !getuid().is_root() {
            return skip("needs root, to drop privileges");
        }
        let (pct, share) = self.user_share()?;
        let size = self.accel.p2p_size;
        let avail = self.available()?;
        if share + PAGE > size {
            return skip(format!("user_share is {pct}%: no allocation can exceed it"));
        }
        ensure!(
            avail >= share + PAGE,
            "only {avail} bytes free, {} needed to tell EDQUOT from ENOMEM",
            share + PAGE
        );
        let (node, dev) = (self.node.clone(), self.dev);
        // Exit codes of the child's steps that fail before the last one.
        const NO_MODULE: i32 = 200;
        const NO_NOBODY: i32 = 201;
        const NO_SHARE: i32 = 202;
        const NO_NS: i32 = 203;
        const NO_MAP: i32 = 204;
        const WRONG_UID: i32 = 205;
        let pid = crate::proc::fork_run(move || {
            use rustix::{
                process::{Gid, Uid},
                thread::{set_thread_gid, set_thread_groups, set_thread_uid},
            };
            let (Ok(one), Ok(two)) = (
                p2pdma::Module::open_path(&node),
                p2pdma::Module::open_path(&node),
            ) else {
                return NO_MODULE;
            };
            if set_thread_groups(&[]).is_err()
                || set_thread_gid(Gid::from_raw(NOBODY)).is_err()
                || set_thread_uid(Uid::from_raw(NOBODY)).is_err()
            {
                return NO_NOBODY;
            }
            let Ok(whole) = one.alloc(dev, share, 0) else {
                return NO_SHARE;
            };
            // Dropping root made the process undumpable, which leaves its
            // /proc files root's: it could not write its own uid_map.
            if set_dumpable().is_err() {
                return NO_MAP;
            }
            if unshare_user_ns().is_err() {
                return NO_NS;
            }
            if std::fs::write("/proc/self/uid_map", format!("{NS_UID} {NOBODY} 1\n")).is_err() {
                return NO_MAP;
            }
            if getuid().as_raw() != NS_UID {
                return WRONG_UID;
            }
            let more = two.alloc(dev, PAGE, 0);
            let code = match &more {
                Ok(_) => 0,
                Err(e) => e.errno().map_or(-1, |e| e.raw_os_error()),
            };
            drop(more);
            drop(whole);
            code
        })?;
        let got = match crate::proc::wait_pid(pid, Duration::from_secs(60)) {
            Ended::Exited(NO_MODULE) => fail!("the child could not open the module"),
            Ended::Exited(NO_NOBODY) => fail!("the child could not drop to uid {NOBODY}"),
            Ended::Exited(NO_SHARE) => fail!("the child's ALLOC of its whole share failed"),
            Ended::Exited(NO_NS) => {
                fail!("unshare(CLONE_NEWUSER) as uid {NOBODY} failed (CONFIG_USER_NS?)")
            }
            Ended::Exited(NO_MAP) => fail!("the child could not write its uid_map"),
            Ended::Exited(WRONG_UID) => fail!("the child is not uid {NS_UID} in its namespace"),
            Ended::Exited(0) => Ok(()),
            Ended::Exited(c) => Err(Errno::from_raw_os_error(c)),
            other => fail!("the child {other}"),
        };
        all(vec![
            want_errno(
                &format!(
                    "ALLOC of one page more than the {pct}% share, as uid {NOBODY} seen as uid {NS_UID} in a user namespace"
                ),
                got,
                Errno::DQUOT,
            ),
            self.wait_available(avail, "after the child exited"),
            self.leak_check(),
        ])
    }
}
