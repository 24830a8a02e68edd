//! What an allocation starts with, and how much of the pool one user may
//! hold.

use std::{
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use rustix::{io::Errno, process::getuid};

use super::{all, child_outcome, skip, want_errno, want_ok, Ctx, Why, MIB, PAGE, R};
use crate::{
    child::{parse_kv, NOBODY},
    proc::Ended,
};

/// The module parameter that bounds an unprivileged user's share.
const USER_SHARE: &str = "/sys/module/p2pdma/parameters/user_share";

/// `user_share`'s documented default, in percent.
const USER_SHARE_DEFAULT: u64 = 50;

impl Ctx {
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
        let pct = match std::fs::read_to_string(USER_SHARE) {
            Ok(s) => s
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{USER_SHARE} holds {:?}", s.trim()))?,
            // An old module has no such parameter: hold it to the default.
            Err(_) => USER_SHARE_DEFAULT,
        };
        let size = self.accel.p2p_size;
        let share = (size * pct / 100) & !(PAGE - 1);
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
        let child = self.spawn_child(
            &[
                "pool-share".into(),
                "--dev".into(),
                self.dev.to_string(),
                "--share".into(),
                share.to_string(),
            ],
            Stdio::null(),
        )?;
        let (ended, out) = self.finish_child(child, Duration::from_secs(60));
        ensure!(
            ended == Ended::Exited(0),
            "the helper {ended}: {}",
            out.trim()
        );
        let kv = parse_kv(&out);
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
