//! `p2pdma-ctl sanity`: the kernel module's sanity suite, in the spirit of
//! gdrcopy's sanity tests.
//!
//! Every case asserts on data or on an exact errno and prints one line,
//! `ok <case>`, `FAIL <case>: <why>` or `skip <case>: <why>`; the last line
//! is `sanity: N passed, N failed, N skipped`. Cases that are expected to
//! die by a signal run in a child process (forked, or `/proc/self/exe`
//! re-executed with the hidden `__child` subcommand), and the parent checks
//! how it ended. The leak check compares the kernel's own count of free P2P
//! memory (`/sys/bus/pci/devices/<pci>/p2pmem/available`) with the count at
//! the start. A case whose check could not run reports `skip`, never `ok`.
//!
//! The cases of ABI 2 and of the module's known failure modes live in
//! submodules: `alloc` (zeroed memory, the per-user share), `race`
//! (`FREE` against `DMA_MAP`, shared-handle stress), `pin` (overlapping,
//! read-only, huge-page and `RLIMIT_MEMLOCK` pins), `peer` (multipath
//! heads, `DMA_MAP` agreeing with `P2P_QUERY`), `revoke` (what an unbind
//! revokes, and mappings made while it runs, probed by the kernel's own
//! copies so that a revoked mapping gives `EFAULT` instead of `SIGBUS`),
//! `revoke_race` (`DMA_MAP`, `PIN_USER` and `DMABUF_IMPORT` looping across
//! unbind and bind cycles), `dmabuf` (bridges, segment limits and overlap
//! bounds of imports) and `blockio` (`BLOCK_IO`, swap devices, sync writes
//! and long waits included).

use std::{
    collections::HashSet,
    io::{BufRead, BufReader, IoSlice, Read, Write},
    os::fd::{AsFd, AsRawFd, OwnedFd},
    panic::{catch_unwind, AssertUnwindSafe},
    path::Path,
    process::{Child, Command, ExitCode, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use clap::{Args, ValueEnum};
use p2pdma::{
    sys::{self, HostBuffer, InvalidPointer, RawMapping, Sharing},
    Accelerator, DeviceMapping, MapType, Module, P2pQuery, PciAddress, Peer, Udmabuf,
};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
    ioctl::opcode,
    net::{
        sendmsg, socketpair, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
        SocketFlags, SocketType,
    },
    process::{getuid, kill_process, Pid, Signal},
};
use serde_json::json;

use crate::{
    child::{self, parse_kv, NOBODY},
    proc::{self, Ended},
    util::{errno_name, first_difference, pattern},
};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// Signal numbers the cases expect.
const SIGBUS: i32 = 7;
const SIGKILL: i32 = 9;
const SIGSEGV: i32 = 11;

/// The text the kernel gives when two devices cannot do P2P.
const NO_P2P_REASON: &str = "do not share an upstream bridge or whitelisted host bridge";

/// What the topology allows, when the caller knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExpectP2p {
    /// The NVMe can reach the accelerator's memory by P2P.
    Supported,
    /// The kernel refuses P2P between them.
    Unsupported,
}

#[derive(Args)]
pub struct SanityArgs {
    /// Accelerator index (default: the first one bound).
    #[arg(long)]
    dev: Option<u32>,
    /// NVMe namespace to use as the P2P peer; cases that need one are
    /// skipped when it does not exist.
    #[arg(long, default_value = "/dev/nvme0n1")]
    nvme: String,
    /// Whether P2P between the NVMe and the accelerator must work; without
    /// it, the DMA cases follow what P2P_QUERY answers.
    #[arg(long, value_enum)]
    expect_p2p: Option<ExpectP2p>,
    /// Leave out the cases that unbind and rebind the device.
    #[arg(long)]
    no_unbind: bool,
    /// A native-multipath NVMe namespace head (one namespace reached
    /// through several controllers); the multipath cases are skipped
    /// without it.
    #[arg(long)]
    nvme_multipath: Option<String>,
    /// An NVMe namespace the suite may turn into swap for a while (its
    /// first page is restored); the swap case is skipped without it.
    #[arg(long)]
    nvme_swap: Option<String>,
    /// A slow (throttled) NVMe namespace that reads as zeros; the cases
    /// of long waits and sync writes are skipped without it.
    #[arg(long)]
    nvme_slow: Option<String>,
}

/// Why a case did not pass.
#[derive(Debug)]
enum Why {
    Fail(String),
    Skip(String),
}

type R = Result<(), Why>;

impl From<p2pdma::Error> for Why {
    fn from(e: p2pdma::Error) -> Self {
        Why::Fail(e.to_string())
    }
}

impl From<String> for Why {
    fn from(s: String) -> Self {
        Why::Fail(s)
    }
}

impl From<&str> for Why {
    fn from(s: &str) -> Self {
        Why::Fail(s.to_string())
    }
}

macro_rules! fail {
    ($($arg:tt)*) => { return Err(Why::Fail(format!($($arg)*))) };
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            fail!($($arg)*);
        }
    };
}

fn skip(why: impl Into<String>) -> R {
    Err(Why::Skip(why.into()))
}

// The cases by subject; they use the macros above.
mod alloc;
mod blockio;
mod dmabuf;
mod peer;
mod pin;
mod race;
mod revoke;
mod revoke_race;

/// The symbolic name of an errno, including the ones of ABI 2 that
/// [`errno_name`] does not know.
fn ename(e: Errno) -> String {
    match e {
        Errno::DQUOT => "EDQUOT".into(),
        Errno::TOOMANYREFS => "ETOOMANYREFS".into(),
        Errno::XDEV => "EXDEV".into(),
        Errno::MSGSIZE => "EMSGSIZE".into(),
        Errno::TXTBSY => "ETXTBSY".into(),
        Errno::OPNOTSUPP => "EOPNOTSUPP".into(),
        e => errno_name(e),
    }
}

/// Checks that a raw call failed with exactly `want`.
fn want_errno<T>(what: &str, r: Result<T, Errno>, want: Errno) -> R {
    match r {
        Ok(_) => fail!("{what} succeeded, expected {}", ename(want)),
        Err(e) if e == want => Ok(()),
        Err(e) => fail!("{what} gave {}, expected {}", ename(e), ename(want)),
    }
}

/// Checks that a library call failed with exactly `want`.
fn want_lib_errno<T>(what: &str, r: p2pdma::Result<T>, want: Errno) -> R {
    match r {
        Ok(_) => fail!("{what} succeeded, expected {}", ename(want)),
        Err(e) if e.errno() == Some(want) => Ok(()),
        Err(e) => fail!("{what}: {e}; expected {}", ename(want)),
    }
}

/// Checks that a raw call succeeded.
fn want_ok<T>(what: &str, r: Result<T, Errno>) -> Result<T, Why> {
    r.map_err(|e| Why::Fail(format!("{what} gave {}, expected success", ename(e))))
}

/// Runs every check and fails with all the messages of those that failed.
/// The outcome a helper process printed as `key=errno` (0 for success, -1
/// for an error without an errno) among `kv`, parsed from its output `out`.
fn child_outcome(
    kv: &std::collections::HashMap<String, String>,
    out: &str,
    key: &str,
) -> Result<Result<(), Errno>, Why> {
    let v = kv
        .get(key)
        .ok_or_else(|| Why::Fail(format!("no {key}= in {:?}", out.trim())))?;
    let e: i32 = v.parse().map_err(|_| Why::Fail(format!("bad {key}={v}")))?;
    Ok(match e {
        0 => Ok(()),
        -1 => Err(Errno::IO),
        e => Err(Errno::from_raw_os_error(e)),
    })
}

fn all(checks: Vec<R>) -> R {
    let msgs: Vec<String> = checks
        .into_iter()
        .filter_map(|r| match r {
            Ok(()) => None,
            Err(Why::Fail(m)) => Some(m),
            Err(Why::Skip(m)) => Some(format!("skipped: {m}")),
        })
        .collect();
    if msgs.is_empty() {
        Ok(())
    } else {
        Err(Why::Fail(msgs.join("; ")))
    }
}

/// Runs every check: fails with the messages of those that failed; if none
/// failed but some were skipped, the whole is skipped (a check that did not
/// run never counts as passed).
fn all_or_skip(checks: Vec<R>) -> R {
    let mut fails = Vec::new();
    let mut skips = Vec::new();
    for r in checks {
        match r {
            Ok(()) => {}
            Err(Why::Fail(m)) => fails.push(m),
            Err(Why::Skip(m)) => skips.push(m),
        }
    }
    if !fails.is_empty() {
        Err(Why::Fail(fails.join("; ")))
    } else if !skips.is_empty() {
        Err(Why::Skip(skips.join("; ")))
    } else {
        Ok(())
    }
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Writes a pattern over the whole mapping and checks that it reads back.
fn write_verify(map: &DeviceMapping, seed: u64) -> R {
    let data = pattern(seed, 0, map.len());
    map.write_at(0, &data)?;
    verify(map, seed, "read back")
}

/// Checks that the whole mapping holds the pattern of `seed`.
fn verify(map: &DeviceMapping, seed: u64, what: &str) -> R {
    let data = pattern(seed, 0, map.len());
    let mut back = vec![0u8; map.len()];
    map.read_at(0, &mut back)?;
    match first_difference(&data, &back) {
        None => Ok(()),
        Some(d) => fail!("{what}: {d}"),
    }
}

/// Tallies and prints the results.
struct Suite {
    json: bool,
    passed: u32,
    failed: u32,
    skipped: u32,
}

impl Suite {
    fn report(&mut self, name: &str, r: R) {
        let (verdict, why) = match r {
            Ok(()) => {
                self.passed += 1;
                ("ok", None)
            }
            Err(Why::Fail(w)) => {
                self.failed += 1;
                ("FAIL", Some(w))
            }
            Err(Why::Skip(w)) => {
                self.skipped += 1;
                ("skip", Some(w))
            }
        };
        let why = why.map(|w| w.replace(['\n', '\r'], "; "));
        if self.json {
            println!(
                "{}",
                json!({ "case": name, "result": verdict.to_lowercase(), "why": why })
            );
        } else {
            match why {
                None => println!("{verdict} {name}"),
                Some(w) => println!("{verdict} {name}: {w}"),
            }
        }
        let _ = std::io::stdout().flush();
    }

    fn case(&mut self, name: &str, f: impl FnOnce() -> R) {
        let r = match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(Why::Fail(format!("panicked: {msg}")))
            }
        };
        self.report(name, r);
    }

    fn finish(&self) -> ExitCode {
        if self.json {
            println!(
                "{}",
                json!({ "passed": self.passed, "failed": self.failed, "skipped": self.skipped })
            );
        } else {
            println!(
                "sanity: {} passed, {} failed, {} skipped",
                self.passed, self.failed, self.skipped
            );
        }
        if self.failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// Everything the cases share.
struct Ctx {
    node: String,
    module: Module,
    dev: u32,
    accel: Accelerator,
    nvme_path: String,
    nvme: Option<OwnedFd>,
    nvme_pci: Option<PciAddress>,
    nvme_query: Option<P2pQuery>,
    expect: Option<ExpectP2p>,
    /// `--nvme-multipath`.
    nvme_multipath: Option<String>,
    /// `--nvme-swap`.
    nvme_swap: Option<String>,
    /// `--nvme-slow`.
    nvme_slow: Option<String>,
    /// `p2pmem/available` before any case ran.
    baseline: Option<u64>,
}

fn p2pmem_path(pci: PciAddress, file: &str) -> String {
    format!("/sys/bus/pci/devices/{pci}/p2pmem/{file}")
}

fn read_sysfs_u64(path: &str) -> Result<u64, String> {
    let s = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    s.trim()
        .parse()
        .map_err(|_| format!("{path} holds {:?}, not a number", s.trim()))
}

/// Reads lines of a child's stdout on a thread, so the parent can wait for
/// them with a deadline.
fn line_reader(out: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Ctx {
    fn available(&self) -> Result<u64, Why> {
        Ok(read_sysfs_u64(&p2pmem_path(self.accel.pci, "available"))?)
    }

    /// Passes once the kernel's free P2P memory is back to what it was
    /// before the suite ran, polling for up to 2 s for asynchronous release.
    fn leak_check(&self) -> R {
        let Some(baseline) = self.baseline else {
            fail!(
                "no baseline: {} was unreadable at the start",
                p2pmem_path(self.accel.pci, "available")
            );
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let now = self.available()?;
            if now == baseline {
                return Ok(());
            }
            if Instant::now() >= deadline {
                fail!(
                    "p2pmem/available is {now}, was {baseline} at the start: {} bytes not returned",
                    baseline as i128 - now as i128
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn nvme(&self) -> Result<&OwnedFd, Why> {
        self.nvme
            .as_ref()
            .ok_or_else(|| Why::Skip(format!("no NVMe namespace at {}", self.nvme_path)))
    }

    fn self_peer(&self) -> Peer<'static> {
        Peer::Pci(self.accel.pci)
    }

    fn spawn_child(&self, args: &[String], stdin: Stdio) -> Result<Child, Why> {
        Command::new("/proc/self/exe")
            .arg("--node")
            .arg(&self.node)
            .arg("__child")
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Why::Fail(format!("cannot start a helper process: {e}")))
    }

    /// Waits for a spawned helper and returns how it ended and its output.
    fn finish_child(&self, mut child: Child, timeout: Duration) -> (Ended, String) {
        let ended = proc::wait_child(&mut child, timeout);
        let mut out = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        (ended, out)
    }

    /// An `ALLOC` argument that the module accepts, for the cases to break.
    fn good_alloc(&self) -> abi::P2pdmaAlloc {
        abi::P2pdmaAlloc {
            dev_index: self.dev,
            size: PAGE,
            ..Default::default()
        }
    }

    /// Sends an `ALLOC` built from [`good_alloc`](Self::good_alloc) and
    /// changed by `f`; what it allocates by mistake is freed again.
    fn raw_alloc(&self, f: impl FnOnce(&mut abi::P2pdmaAlloc)) -> Result<abi::P2pdmaAlloc, Errno> {
        let mut arg = self.good_alloc();
        f(&mut arg);
        sys::alloc(&self.module, &mut arg)?;
        let _ = self.module.free(arg.handle);
        Ok(arg)
    }

    /// The first device index with nothing bound, if any.
    fn free_slot(&self) -> Option<u32> {
        (0..abi::P2PDMA_MAX_DEVICES)
            .find(|&i| sys::device_info(&self.module, i) == Err(Errno::NODEV))
    }

    // The cases.

    fn version(&self) -> R {
        let v = sys::get_version(&self.module)
            .map_err(|e| format!("GET_VERSION: {}", errno_name(e)))?;
        let caps = abi::P2PDMA_CAP_BAR_P2PMEM
            | abi::P2PDMA_CAP_ALLOC
            | abi::P2PDMA_CAP_P2P_QUERY
            | abi::P2PDMA_CAP_DMA_MAP
            | abi::P2PDMA_CAP_DMABUF
            | abi::P2PDMA_CAP_REVOKE
            | abi::P2PDMA_CAP_MAP_DIRECTION;
        let n = self.module.accelerators()?.len();
        ensure!(
            v.abi_version == abi::P2PDMA_ABI_VERSION,
            "ABI version {}, expected {}",
            v.abi_version,
            abi::P2PDMA_ABI_VERSION
        );
        ensure!(
            v.abi_min_compat <= v.abi_version,
            "abi_min_compat {} > abi_version {}",
            v.abi_min_compat,
            v.abi_version
        );
        ensure!(
            v.capabilities & caps == caps,
            "capabilities {:#x} lack {:#x}",
            v.capabilities,
            caps & !v.capabilities
        );
        ensure!(
            v.num_devices as usize == n,
            "num_devices {} but DEVICE_INFO finds {n}",
            v.num_devices
        );
        ensure!(
            v.reserved0 == 0 && v.reserved == [0; 4],
            "reserved fields not zeroed: {v:?}"
        );
        Ok(())
    }

    fn device_info(&self) -> R {
        let i = sys::device_info(&self.module, self.dev)
            .map_err(|e| format!("DEVICE_INFO: {}", errno_name(e)))?;
        ensure!(
            i.index == self.dev,
            "index {} for device {}",
            i.index,
            self.dev
        );
        ensure!(
            i.flags == 0 && i.pad0 == 0 && i.reserved == [0; 4],
            "flags/pad/reserved not zeroed: {i:?}"
        );
        ensure!(
            i.p2p_size > 0 && i.p2p_size <= i.bar_size,
            "p2p_size {:#x} for a {:#x}-byte BAR",
            i.p2p_size,
            i.bar_size
        );
        ensure!(
            i.bar_bus_addr % PAGE == 0,
            "BAR bus address {:#x} not page aligned",
            i.bar_bus_addr
        );
        let size = read_sysfs_u64(&p2pmem_path(self.accel.pci, "size"))?;
        ensure!(
            size == i.p2p_size,
            "p2p_size {:#x}, but p2pmem/size is {size:#x}",
            i.p2p_size
        );
        ensure!(
            i.p2p_available <= i.p2p_size,
            "p2p_available {:#x} > p2p_size {:#x}",
            i.p2p_available,
            i.p2p_size
        );
        Ok(())
    }

    fn device_info_bad_args(&self) -> R {
        let with = |f: &dyn Fn(&mut abi::P2pdmaDeviceInfo)| {
            let mut i = abi::P2pdmaDeviceInfo {
                index: self.dev,
                ..Default::default()
            };
            f(&mut i);
            sys::device_info_raw(&self.module, &mut i)
        };
        all(vec![
            want_errno(
                "DEVICE_INFO with flags 1",
                with(&|i| i.flags = 1),
                Errno::INVAL,
            ),
            want_errno(
                "DEVICE_INFO with reserved[0] 1",
                with(&|i| i.reserved[0] = 1),
                Errno::INVAL,
            ),
            want_errno(
                "DEVICE_INFO of index 64",
                sys::device_info(&self.module, 64),
                Errno::INVAL,
            ),
            want_errno(
                "DEVICE_INFO of index u32::MAX",
                sys::device_info(&self.module, u32::MAX),
                Errno::INVAL,
            ),
        ])
    }

    fn alloc_verify(&self, size: u64, align: u64, seed: u64) -> R {
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
        let u = self.module.unmap(m.map_handle).map_err(Why::from);
        all(vec![r, u])
    }

    fn alloc_distinct(&self) -> R {
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

    fn alloc_map_twice(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let m1 = a.map()?;
        let m2 = a.map()?;
        ensure!(m1.as_ptr() != m2.as_ptr(), "two mappings at one address");
        m1.write_at(0, &pattern(21, 0, m1.len()))?;
        verify(&m2, 21, "second mapping after writing through the first")?;
        m2.write_at(0, &pattern(22, 0, m2.len()))?;
        verify(&m1, 22, "first mapping after writing through the second")
    }

    fn mapping_bounds(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let m = a.map()?;
        let n = m.len();
        let oob = |r: p2pdma::Result<()>, what: &str| match r {
            Err(p2pdma::Error::OutOfBounds { .. }) => Ok(()),
            other => fail!("{what}: {other:?}, expected an out-of-bounds error"),
        };
        all(vec![
            oob(m.write_at(n, &[1]), "write one byte past the end"),
            oob(m.read_at(n - 1, &mut [0; 2]), "read across the end"),
            oob(m.read_at(usize::MAX, &mut [0; 1]), "read at usize::MAX"),
            m.write_at(n - 1, &[0x5a]).map_err(Why::from),
        ])?;
        let mut last = [0u8];
        m.read_at(n - 1, &mut last)?;
        ensure!(
            last[0] == 0x5a,
            "last byte reads {:#x} after writing 0x5a",
            last[0]
        );
        Ok(())
    }

    fn fork_child_segv(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 31)?;
        let pid = proc::fork_run(|| {
            let mut b = [0u8; 8];
            let _ = map.read_at(0, &mut b);
            0
        })?;
        match proc::wait_pid(pid, Duration::from_secs(30)) {
            Ended::Signaled(SIGSEGV) => {}
            other => fail!("a forked child touching the parent's mapping {other}; expected SIGSEGV (VM_DONTCOPY)"),
        }
        verify(&map, 31, "parent's data after the child died")
    }

    /// Forks a child that runs `f` (returning an errno as [`child::code`]
    /// does) and checks that it reported `want`.
    fn fork_expect(&self, what: &str, want: Errno, f: impl FnOnce() -> i32) -> R {
        let pid = proc::fork_run(f)?;
        match proc::wait_pid(pid, Duration::from_secs(30)) {
            Ended::Exited(c) if c == want.raw_os_error() => Ok(()),
            Ended::Exited(0) => fail!(
                "{what} succeeded in a forked child, expected {}",
                errno_name(want)
            ),
            Ended::Exited(c) => fail!(
                "{what} in a forked child gave {}, expected {}",
                errno_name(Errno::from_raw_os_error(c)),
                errno_name(want)
            ),
            other => fail!("the forked child {other}"),
        }
    }

    fn fork_child_mmap(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 32)?;
        let (len, off) = (a.size() as usize, a.mmap_offset());
        self.fork_expect("mmap of the inherited fd", Errno::PERM, || {
            child::code(&RawMapping::map(&self.module, len, off, Sharing::Shared))
        })?;
        verify(&map, 32, "parent's data after the child's mmap")
    }

    fn fork_child_alloc(&self) -> R {
        self.fork_expect("ALLOC on the inherited fd", Errno::PERM, || {
            let mut arg = self.good_alloc();
            child::code(&sys::alloc(&self.module, &mut arg))
        })
    }

    fn fork_child_free(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let handle = a.handle();
        self.fork_expect(
            "FREE of the parent's handle on the inherited fd",
            Errno::PERM,
            || {
                child::code(&sys::free(
                    &self.module,
                    abi::P2pdmaFree {
                        handle,
                        ..Default::default()
                    },
                ))
            },
        )?;
        a.free()
            .map_err(|e| Why::Fail(format!("the parent's FREE after the child's attempt: {e}")))
    }

    fn fork_child_unmap(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let m = self
            .module
            .pin_user(buf.addr(), 64 * KIB, self.host_peer())?;
        let map_handle = m.map_handle;
        let in_child = self.fork_expect(
            "UNMAP of the parent's mapping on the inherited fd",
            Errno::PERM,
            || {
                child::code(&sys::unmap(
                    &self.module,
                    abi::P2pdmaUnmap {
                        map_handle,
                        ..Default::default()
                    },
                ))
            },
        );
        let parent = self
            .module
            .unmap(map_handle)
            .map_err(|e| Why::Fail(format!("the parent's UNMAP after the child's attempt: {e}")));
        all(vec![in_child, parent])
    }

    fn close_before_munmap(&self) -> R {
        let before = self.available()?;
        let m2 = Module::open_path(&self.node)?;
        let a = m2.alloc(self.dev, MIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 41)?;
        let _ = a.into_handle();
        drop(m2);
        verify(&map, 41, "after closing the fd")?;
        write_verify(&map, 42)?;
        let during = self.available()?;
        ensure!(
            before.saturating_sub(during) >= MIB,
            "with the fd closed but the memory mapped, p2pmem/available is {during} (was {before}): the memory went back while mapped"
        );
        drop(map);
        self.leak_check()
    }

    fn scm_rights(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 51)?;
        let (mine, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| format!("socketpair: {e}"))?;
        let child = self.spawn_child(
            &[
                "recv-fd".into(),
                "--dev".into(),
                self.dev.to_string(),
                "--size".into(),
                a.size().to_string(),
                "--offset".into(),
                a.mmap_offset().to_string(),
            ],
            Stdio::from(theirs),
        )?;
        let fds = [self.module.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let sent = sendmsg(
            &mine,
            &[IoSlice::new(b"f")],
            &mut control,
            SendFlags::empty(),
        );
        let (ended, out) = self.finish_child(child, Duration::from_secs(30));
        sent.map_err(|e| format!("sendmsg with SCM_RIGHTS: {e}"))?;
        ensure!(
            ended == Ended::Exited(0),
            "the receiving process {ended}: {}",
            out.trim()
        );
        let kv = parse_kv(&out);
        let errno = |k: &str| -> Result<Errno, Why> {
            let v = kv
                .get(k)
                .ok_or_else(|| Why::Fail(format!("no {k}= in {:?}", out.trim())))?;
            v.parse::<i32>()
                .map(Errno::from_raw_os_error)
                .map_err(|_| Why::Fail(format!("bad {k}={v}")))
        };
        let res = |e: Errno| {
            if e.raw_os_error() == 0 {
                Ok(())
            } else {
                Err(e)
            }
        };
        all(vec![
            want_errno("mmap of a received fd", res(errno("mmap")?), Errno::PERM),
            want_errno("ALLOC on a received fd", res(errno("alloc")?), Errno::PERM),
            verify(&map, 51, "sender's data afterwards"),
        ])
    }

    fn free_double(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let h = a.handle();
        a.free()?;
        want_lib_errno("second FREE", self.module.free(h), Errno::NOENT)
    }

    fn free_never_issued(&self) -> R {
        want_lib_errno(
            "FREE of handle u64::MAX",
            self.module.free(u64::MAX),
            Errno::NOENT,
        )
    }

    fn free_while_dma_mapped(&self) -> R {
        let a = self.module.alloc(self.dev, 16 * KIB, 0)?;
        let m = self
            .module
            .dma_map(a.handle(), 0, a.size(), self.self_peer())?;
        let busy = want_lib_errno(
            "FREE of a DMA-mapped allocation",
            self.module.free(a.handle()),
            Errno::BUSY,
        );
        let unmap = self.module.unmap(m.map_handle).map_err(Why::from);
        let free = a
            .free()
            .map_err(|e| Why::Fail(format!("FREE after UNMAP: {e}")));
        all(vec![busy, unmap, free])
    }

    fn free_bad_args(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let good = abi::P2pdmaFree {
            handle: a.handle(),
            ..Default::default()
        };
        all(vec![
            want_errno(
                "FREE with flags 1",
                sys::free(&self.module, abi::P2pdmaFree { flags: 1, ..good }),
                Errno::INVAL,
            ),
            want_errno(
                "FREE with reserved0 1",
                sys::free(
                    &self.module,
                    abi::P2pdmaFree {
                        reserved0: 1,
                        ..good
                    },
                ),
                Errno::INVAL,
            ),
            want_errno(
                "FREE with reserved[1] 1",
                sys::free(
                    &self.module,
                    abi::P2pdmaFree {
                        reserved: [0, 1],
                        ..good
                    },
                ),
                Errno::INVAL,
            ),
            a.free()
                .map_err(|e| Why::Fail(format!("FREE after the refused ones: {e}"))),
        ])
    }

    fn alloc_bad(&self, what: &str, want: Errno, f: impl FnOnce(&mut abi::P2pdmaAlloc)) -> R {
        want_errno(what, self.raw_alloc(f), want)
    }

    fn alloc_free_slot(&self) -> R {
        let Some(slot) = self.free_slot() else {
            return skip("all 64 device slots are in use");
        };
        self.alloc_bad(&format!("ALLOC on empty slot {slot}"), Errno::NODEV, |a| {
            a.dev_index = slot
        })
    }

    fn mmap_bad(&self) -> [(&'static str, R); 3] {
        let a = match self.module.alloc(self.dev, 64 * KIB, 0) {
            Ok(a) => a,
            Err(e) => {
                let m = format!("ALLOC: {e}");
                return [
                    ("mmap-wrong-offset", Err(Why::Fail(m.clone()))),
                    ("mmap-private", Err(Why::Fail(m.clone()))),
                    ("mmap-too-long", Err(Why::Fail(m))),
                ];
            }
        };
        let len = a.size() as usize;
        let wrong = round_up(a.mmap_offset() + a.size() + (1 << 30), PAGE);
        [
            (
                "mmap-wrong-offset",
                want_errno(
                    &format!("mmap at offset {wrong:#x}, which no allocation has"),
                    RawMapping::map(&self.module, len, wrong, Sharing::Shared),
                    Errno::INVAL,
                ),
            ),
            (
                "mmap-private",
                want_errno(
                    "mmap with MAP_PRIVATE",
                    RawMapping::map(&self.module, len, a.mmap_offset(), Sharing::Private),
                    Errno::INVAL,
                ),
            ),
            (
                "mmap-too-long",
                want_errno(
                    "mmap one page longer than the allocation",
                    RawMapping::map(
                        &self.module,
                        len + PAGE as usize,
                        a.mmap_offset(),
                        Sharing::Shared,
                    ),
                    Errno::INVAL,
                ),
            ),
        ]
    }

    fn ioctl_unknown(&self) -> R {
        let codes = [
            (
                "_IOWR(0xBC, 0x7f, P2pdmaAlloc)",
                opcode::read_write::<abi::P2pdmaAlloc>(0xBC, 0x7f),
            ),
            ("_IO(0xBC, 0x09)", opcode::none(0xBC, 0x09)),
            ("UDMABUF_CREATE", opcode::write::<[u64; 3]>(b'u', 0x42)),
        ];
        all(codes
            .iter()
            .map(|&(name, code)| {
                want_errno(
                    name,
                    sys::ioctl_invalid_pointer(&self.module, code, InvalidPointer::Null),
                    Errno::NOTTY,
                )
            })
            .collect())
    }

    fn ioctl_wrong_size(&self) -> R {
        let codes = [
            (
                "ALLOC with a 64-byte argument",
                opcode::read_write::<[u8; 64]>(0xBC, 0x02),
            ),
            (
                "DEVICE_INFO with a 96-byte argument",
                opcode::read_write::<[u8; 96]>(0xBC, 0x01),
            ),
            (
                "FREE as _IOWR",
                opcode::read_write::<abi::P2pdmaFree>(0xBC, 0x03),
            ),
        ];
        all(codes
            .iter()
            .map(|&(name, code)| {
                want_errno(
                    name,
                    sys::ioctl_invalid_pointer(&self.module, code, InvalidPointer::Null),
                    Errno::NOTTY,
                )
            })
            .collect())
    }

    fn ioctl_bad_pointer(&self, pointer: InvalidPointer) -> R {
        let codes = [
            ("GET_VERSION", abi::P2PDMA_IOC_GET_VERSION),
            ("DEVICE_INFO", abi::P2PDMA_IOC_DEVICE_INFO),
            ("ALLOC", abi::P2PDMA_IOC_ALLOC),
            ("FREE", abi::P2PDMA_IOC_FREE),
            ("P2P_QUERY", abi::P2PDMA_IOC_P2P_QUERY),
            ("DMA_MAP", abi::P2PDMA_IOC_DMA_MAP),
            ("PIN_USER", abi::P2PDMA_IOC_PIN_USER),
            ("UNMAP", abi::P2PDMA_IOC_UNMAP),
            ("DMABUF_IMPORT", abi::P2PDMA_IOC_DMABUF_IMPORT),
        ];
        all(codes
            .iter()
            .map(|&(name, code)| {
                want_errno(
                    &format!("{name} with a {pointer:?} argument"),
                    sys::ioctl_invalid_pointer(&self.module, code, pointer),
                    Errno::FAULT,
                )
            })
            .collect())
    }

    fn exhaustion(&self) -> R {
        let start = self.available()?;
        let limit = self.accel.p2p_size / MIB + 2;
        let round = |n: u32| -> Result<u64, Why> {
            let mut held = Vec::new();
            let err = loop {
                match self.module.alloc(self.dev, MIB, 0) {
                    Ok(a) => held.push(a),
                    Err(e) => break e,
                }
                if held.len() as u64 > limit {
                    fail!(
                        "round {n}: {} 1 MiB allocations from a {}-byte device and still no ENOMEM",
                        held.len(),
                        self.accel.p2p_size
                    );
                }
            };
            ensure!(
                err.errno() == Some(Errno::NOMEM),
                "round {n}: ALLOC ended with {err}, expected ENOMEM"
            );
            let left = self.available()?;
            ensure!(
                left < MIB,
                "round {n}: ENOMEM after {} allocations with {left} bytes still free",
                held.len()
            );
            ensure!(
                start.checked_sub(left) == Some(held.len() as u64 * MIB),
                "round {n}: {} allocations of 1 MiB took {} bytes",
                held.len(),
                start as i128 - left as i128
            );
            Ok(held.len() as u64)
        };
        let first = round(1)?;
        self.leak_check()?;
        let second = round(2)?;
        ensure!(
            first == second,
            "{first} allocations before ENOMEM, {second} after freeing them all"
        );
        ensure!(first >= 1, "not even one 1 MiB allocation");
        self.leak_check()
    }

    fn threads(&self) -> R {
        const THREADS: u64 = 8;
        const ROUNDS: u64 = 50;
        let results: Vec<Result<Vec<u64>, String>> = thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    s.spawn(move || -> Result<Vec<u64>, String> {
                        let mut handles = Vec::new();
                        for i in 0..ROUNDS {
                            let size = (t + 1) * 4 * KIB + (i % 3) * PAGE;
                            let seed = (t << 32) | i;
                            let a = self
                                .module
                                .alloc(self.dev, size, 0)
                                .map_err(|e| format!("thread {t} round {i}: {e}"))?;
                            handles.push(a.handle());
                            let map = a.map().map_err(|e| format!("thread {t} round {i}: {e}"))?;
                            let data = pattern(seed, 0, map.len());
                            map.write_at(0, &data).map_err(|e| e.to_string())?;
                            let mut back = vec![0u8; map.len()];
                            map.read_at(0, &mut back).map_err(|e| e.to_string())?;
                            if let Some(d) = first_difference(&data, &back) {
                                return Err(format!("thread {t} round {i}: {d}"));
                            }
                            drop(map);
                            a.free().map_err(|e| format!("thread {t} round {i}: {e}"))?;
                        }
                        Ok(handles)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                .collect()
        });
        let mut seen = HashSet::new();
        for r in results {
            for h in r? {
                ensure!(seen.insert(h), "handle {h} was issued twice");
            }
        }
        ensure!(
            seen.len() as u64 == THREADS * ROUNDS,
            "{} handles",
            seen.len()
        );
        self.leak_check()
    }

    fn unprivileged(&self) -> R {
        if !getuid().is_root() {
            return skip("needs root, to drop privileges");
        }
        let mut args = vec![
            "unprivileged".to_string(),
            "--dev".into(),
            self.dev.to_string(),
        ];
        if self.nvme.is_some() {
            args.extend(["--nvme".to_string(), self.nvme_path.clone()]);
        }
        let child = self.spawn_child(&args, Stdio::null())?;
        let (ended, out) = self.finish_child(child, Duration::from_secs(30));
        ensure!(
            ended == Ended::Exited(0),
            "the helper {ended}: {}",
            out.trim()
        );
        let kv = parse_kv(&out);
        let get = |k: &str| {
            kv.get(k)
                .cloned()
                .ok_or_else(|| Why::Fail(format!("no {k}= in {:?}", out.trim())))
        };
        ensure!(
            get("uid")? == NOBODY.to_string() && get("euid")? == NOBODY.to_string(),
            "the helper did not drop to uid {NOBODY}: {}",
            out.trim()
        );
        let check = |k: &str| -> R {
            let v = get(k)?;
            if v == "skip" {
                return skip(format!(
                    "{k} was not tried: the helper had nothing to try it on"
                ));
            }
            let e: i32 = v.parse().map_err(|_| Why::Fail(format!("bad {k}={v}")))?;
            let r = if e == 0 {
                Ok(())
            } else {
                Err(Errno::from_raw_os_error(e))
            };
            want_errno(&format!("{k} as uid {NOBODY}"), r, Errno::PERM)
        };
        all_or_skip(vec![
            check("dma_map"),
            check("pin_user"),
            check("dmabuf_import"),
        ])
    }

    fn p2p_query_nvme(&mut self) -> R {
        let nvme = self.nvme()?;
        let mut raw = abi::P2pdmaP2pQuery {
            dev_index: self.dev,
            flags: abi::P2PDMA_PEER_FD,
            peer: abi::P2pdmaPeer {
                fd: nvme.as_raw_fd(),
                ..Default::default()
            },
            ..Default::default()
        };
        sys::p2p_query(&self.module, &mut raw)
            .map_err(|e| format!("P2P_QUERY: {}", errno_name(e)))?;
        let q = P2pQuery::from(&raw);
        self.nvme_query = Some(q.clone());
        let Some(pci) = self.nvme_pci else {
            fail!(
                "cannot find the PCI function of {} in sysfs",
                self.nvme_path
            );
        };
        ensure!(
            q.peer == pci,
            "the peer resolved to {}, but {} is {pci}",
            q.peer,
            self.nvme_path
        );
        ensure!(
            raw.pad1 == 0 && raw.reserved == [0; 4],
            "pad/reserved not zeroed: {raw:?}"
        );
        match q.map_type {
            MapType::BusAddr | MapType::ThruHostBridge => {
                ensure!(
                    raw.distance >= 0,
                    "{} with distance {}",
                    q.map_type,
                    raw.distance
                )
            }
            MapType::NotSupported => {
                ensure!(
                    raw.distance == -1,
                    "not-supported with distance {}",
                    raw.distance
                )
            }
            MapType::Unknown(t) => fail!("unknown map_type {t}"),
        }
        match self.expect {
            Some(ExpectP2p::Supported) => ensure!(
                q.map_type == MapType::BusAddr && raw.distance >= 0,
                "expected bus-addr with a distance, got {} distance {} ({})",
                q.map_type,
                raw.distance,
                q.reason
            ),
            Some(ExpectP2p::Unsupported) => ensure!(
                q.map_type == MapType::NotSupported && raw.distance == -1 && q.reason.contains(NO_P2P_REASON),
                "expected not-supported, distance -1 and a reason containing {NO_P2P_REASON:?}; got {} distance {} reason {:?}",
                q.map_type,
                raw.distance,
                q.reason
            ),
            None => {}
        }
        Ok(())
    }

    fn p2p_query_pci(&self) -> R {
        self.nvme()?;
        let (Some(pci), Some(by_fd)) = (self.nvme_pci, &self.nvme_query) else {
            fail!(
                "no PCI address or fd answer for {} to compare with",
                self.nvme_path
            );
        };
        let q = self.module.p2p_query(self.dev, Peer::Pci(pci))?;
        ensure!(q.peer == pci, "peer {pci} echoed as {}", q.peer);
        ensure!(
            q.map_type == by_fd.map_type && q.distance == by_fd.distance,
            "by PCI address: {} distance {:?}; by fd: {} distance {:?}",
            q.map_type,
            q.distance,
            by_fd.map_type,
            by_fd.distance
        );
        Ok(())
    }

    fn p2p_query_self(&self) -> R {
        let q = self.module.p2p_query(self.dev, self.self_peer())?;
        ensure!(
            q.map_type == MapType::BusAddr && q.distance.is_some(),
            "the accelerator as its own peer: {} distance {:?} ({})",
            q.map_type,
            q.distance,
            q.reason
        );
        ensure!(
            q.peer == self.accel.pci,
            "peer {} echoed as {}",
            self.accel.pci,
            q.peer
        );
        Ok(())
    }

    fn raw_query(&self, f: impl FnOnce(&mut abi::P2pdmaP2pQuery)) -> Result<(), Errno> {
        let (flags, peer) = self.self_peer().to_abi();
        let mut q = abi::P2pdmaP2pQuery {
            dev_index: self.dev,
            flags,
            peer,
            ..Default::default()
        };
        f(&mut q);
        sys::p2p_query(&self.module, &mut q)
    }

    fn p2p_query_bad_peers(&self) -> R {
        let null = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("open /dev/null: {e}"))?;
        let closed = {
            let fd = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| format!("open /dev/null: {e}"))?;
            fd.as_raw_fd()
        };
        let by_fd = |fd: i32| {
            self.raw_query(|q| {
                q.flags = abi::P2PDMA_PEER_FD;
                q.peer = abi::P2pdmaPeer {
                    fd,
                    ..Default::default()
                };
            })
        };
        let nowhere: PciAddress = "0000:fe:1f.7".parse()?;
        all(vec![
            want_errno(
                "P2P_QUERY with /dev/null as the peer",
                by_fd(null.as_raw_fd()),
                Errno::NOTBLK,
            ),
            want_errno(
                "P2P_QUERY with a closed fd as the peer",
                by_fd(closed),
                Errno::BADF,
            ),
            want_lib_errno(
                "P2P_QUERY with peer 0000:fe:1f.7",
                self.module.p2p_query(self.dev, Peer::Pci(nowhere)),
                Errno::NODEV,
            ),
        ])
    }

    fn p2p_query_bad_args(&self) -> R {
        let mut checks = vec![
            want_errno(
                "P2P_QUERY with flags 0x80",
                self.raw_query(|q| q.flags = 0x80),
                Errno::INVAL,
            ),
            want_errno(
                "P2P_QUERY with reserved[2] 1",
                self.raw_query(|q| q.reserved[2] = 1),
                Errno::INVAL,
            ),
            want_errno(
                "P2P_QUERY with peer.pad0 1",
                self.raw_query(|q| q.peer.pad0 = 1),
                Errno::INVAL,
            ),
        ];
        if let Some(slot) = self.free_slot() {
            checks.push(want_errno(
                &format!("P2P_QUERY of empty slot {slot}"),
                self.raw_query(|q| q.dev_index = slot),
                Errno::NODEV,
            ));
        }
        all(checks)
    }

    /// Checks a mapping's segments: they add up to `length`, are non-empty,
    /// and (for a bus-address mapping of accelerator memory) lie in the BAR.
    fn check_segs(&self, m: &p2pdma::DmaMapping, length: u64, in_bar: bool) -> R {
        ensure!(!m.segs.is_empty(), "no segments");
        ensure!(
            m.length == length,
            "length {} mapped, {length} asked",
            m.length
        );
        ensure!(
            m.total_len() == length,
            "segments add up to {}, expected {length}: {:x?}",
            m.total_len(),
            m.segs
        );
        ensure!(
            m.segs.iter().all(|&(_, l)| l > 0),
            "an empty segment: {:x?}",
            m.segs
        );
        if in_bar {
            let (lo, hi) = (
                self.accel.bar_bus_addr,
                self.accel.bar_bus_addr + self.accel.bar_size,
            );
            for &(addr, len) in &m.segs {
                ensure!(
                    addr >= lo && addr.saturating_add(len) <= hi,
                    "segment {addr:#x}+{len:#x} outside the BAR [{lo:#x}, {hi:#x})"
                );
            }
        }
        Ok(())
    }

    fn dma_map_self(&self) -> R {
        let a = self.module.alloc(self.dev, 2 * MIB, 2 * MIB)?;
        let m = self
            .module
            .dma_map(a.handle(), 0, a.size(), self.self_peer())?;
        let r = (|| {
            self.check_segs(&m, a.size(), true)?;
            ensure!(m.map_type == MapType::BusAddr, "map type {}", m.map_type);
            ensure!(
                m.segs[0].0 % (2 * MIB) == 0,
                "a 2 MiB-aligned allocation starts at bus address {:#x}",
                m.segs[0].0
            );
            Ok(())
        })();
        let u = self.module.unmap(m.map_handle).map_err(Why::from);
        all(vec![r, u])
    }

    fn dma_map_partial(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let full = self
            .module
            .dma_map(a.handle(), 0, a.size(), self.self_peer())?;
        self.module.unmap(full.map_handle)?;
        let part = self
            .module
            .dma_map(a.handle(), 2 * PAGE, 4 * PAGE, self.self_peer())?;
        let r = (|| {
            self.check_segs(&part, 4 * PAGE, true)?;
            // Where offset 2 pages lies in the full mapping, however many
            // segments it has.
            let mut at = 2 * PAGE;
            let mut want = None;
            for &(addr, len) in &full.segs {
                if at < len {
                    want = Some(addr + at);
                    break;
                }
                at -= len;
            }
            let Some(want) = want else {
                fail!(
                    "the full mapping's segments {:x?} do not reach offset {:#x}",
                    full.segs,
                    2 * PAGE
                );
            };
            ensure!(
                part.segs[0].0 == want,
                "offset {:#x} maps at {:#x}, but the full mapping {:x?} has it at {want:#x}",
                2 * PAGE,
                part.segs[0].0,
                full.segs
            );
            Ok(())
        })();
        let u = self.module.unmap(part.map_handle).map_err(Why::from);
        all(vec![r, u])
    }

    fn raw_dma_map(
        &self,
        handle: u64,
        f: impl FnOnce(&mut abi::P2pdmaDmaMap),
    ) -> (Result<(), Errno>, abi::P2pdmaDmaMap) {
        let (flags, peer) = self.self_peer().to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer,
            handle,
            length: 16 * KIB,
            ..Default::default()
        };
        f(&mut arg);
        let mut segs = [abi::P2pdmaDmaSeg::default(); 8];
        let r = sys::dma_map(&self.module, &mut arg, &mut segs);
        if r.is_ok() {
            let _ = self.module.unmap(arg.map_handle);
        }
        (r, arg)
    }

    fn dma_map_enospc(&self) -> R {
        let a = self.module.alloc(self.dev, 16 * KIB, 0)?;
        let (flags, peer) = self.self_peer().to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer,
            handle: a.handle(),
            length: a.size(),
            ..Default::default()
        };
        let r = sys::dma_map(&self.module, &mut arg, &mut []);
        if r.is_ok() {
            let _ = self.module.unmap(arg.map_handle);
        }
        want_errno("DMA_MAP with max_segs 0", r, Errno::NOSPC)?;
        ensure!(arg.num_segs >= 1, "ENOSPC with num_segs {}", arg.num_segs);
        Ok(())
    }

    fn dma_map_bad_range(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let h = a.handle();
        let size = a.size();
        let case = |what: &str, offset: u64, length: u64| {
            want_errno(
                what,
                self.raw_dma_map(h, |m| {
                    m.offset = offset;
                    m.length = length;
                })
                .0,
                Errno::INVAL,
            )
        };
        all(vec![
            case("DMA_MAP at offset 1", 1, PAGE),
            case("DMA_MAP of 4097 bytes", 0, PAGE + 1),
            case("DMA_MAP of 0 bytes", 0, 0),
            case("DMA_MAP at the end", size, PAGE),
            case("DMA_MAP one page past the end", 0, size + PAGE),
            case(
                "DMA_MAP with offset+length overflowing",
                !(PAGE - 1),
                2 * PAGE,
            ),
        ])
    }

    fn dma_map_bad_fields(&self) -> R {
        let a = self.module.alloc(self.dev, 16 * KIB, 0)?;
        let h = a.handle();
        all(vec![
            want_errno(
                "DMA_MAP with flags 0x80",
                self.raw_dma_map(h, |m| m.flags |= 0x80).0,
                Errno::INVAL,
            ),
            want_errno(
                "DMA_MAP with reserved[3] 1",
                self.raw_dma_map(h, |m| m.reserved[3] = 1).0,
                Errno::INVAL,
            ),
            want_errno(
                "DMA_MAP with pad0 1",
                self.raw_dma_map(h, |m| m.pad0 = 1).0,
                Errno::INVAL,
            ),
        ])
    }

    fn dma_map_no_such_handle(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let freed = a.handle();
        a.free()?;
        all(vec![
            want_errno(
                "DMA_MAP of handle u64::MAX",
                self.raw_dma_map(u64::MAX, |m| m.length = PAGE).0,
                Errno::NOENT,
            ),
            want_errno(
                "DMA_MAP of a freed handle",
                self.raw_dma_map(freed, |m| m.length = PAGE).0,
                Errno::NOENT,
            ),
        ])
    }

    /// Whether the NVMe must reach the accelerator: `--expect-p2p`, else
    /// what P2P_QUERY answered.
    fn nvme_p2p(&self) -> Result<bool, Why> {
        match (self.expect, &self.nvme_query) {
            (Some(e), _) => Ok(e == ExpectP2p::Supported),
            (None, Some(q)) => Ok(q.map_type != MapType::NotSupported),
            (None, None) => Err(Why::Fail("P2P_QUERY for the NVMe did not answer".into())),
        }
    }

    fn dma_map_nvme(&self) -> R {
        let nvme = self.nvme()?;
        let p2p = self.nvme_p2p()?;
        let a = self.module.alloc(self.dev, MIB, 0)?;
        let r = self
            .module
            .dma_map(a.handle(), 0, a.size(), Peer::Fd(nvme.as_fd()));
        if !p2p {
            return want_lib_errno(
                "DMA_MAP for an NVMe that cannot reach the accelerator",
                r,
                Errno::REMOTEIO,
            );
        }
        let m = r?;
        let checks = (|| {
            self.check_segs(&m, a.size(), true)?;
            ensure!(m.map_type == MapType::BusAddr, "map type {}", m.map_type);
            let (lo, hi) = (
                self.accel.bar_bus_addr,
                self.accel.bar_bus_addr + self.accel.bar_size,
            );
            ensure!(
                (lo..hi).contains(&m.segs[0].0),
                "first segment at {:#x}, outside the BAR [{lo:#x}, {hi:#x})",
                m.segs[0].0
            );
            Ok(())
        })();
        let u = self.module.unmap(m.map_handle).map_err(Why::from);
        all(vec![checks, u])
    }

    /// The peer for host-memory cases: the NVMe if there is one, else the
    /// accelerator itself.
    fn host_peer(&self) -> Peer<'_> {
        match &self.nvme {
            Some(fd) => Peer::Fd(fd.as_fd()),
            None => self.self_peer(),
        }
    }

    fn unmap_double(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let m = self
            .module
            .pin_user(buf.addr(), 64 * KIB, self.host_peer())?;
        self.module.unmap(m.map_handle)?;
        want_lib_errno(
            "second UNMAP",
            self.module.unmap(m.map_handle),
            Errno::NOENT,
        )
    }

    fn unmap_never_issued(&self) -> R {
        want_lib_errno(
            "UNMAP of handle u64::MAX",
            self.module.unmap(u64::MAX),
            Errno::NOENT,
        )
    }

    fn unmap_bad_args(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let m = self
            .module
            .pin_user(buf.addr(), 64 * KIB, self.host_peer())?;
        let good = abi::P2pdmaUnmap {
            map_handle: m.map_handle,
            ..Default::default()
        };
        all(vec![
            want_errno(
                "UNMAP with flags 1",
                sys::unmap(&self.module, abi::P2pdmaUnmap { flags: 1, ..good }),
                Errno::INVAL,
            ),
            want_errno(
                "UNMAP with reserved0 1",
                sys::unmap(
                    &self.module,
                    abi::P2pdmaUnmap {
                        reserved0: 1,
                        ..good
                    },
                ),
                Errno::INVAL,
            ),
            want_errno(
                "UNMAP with reserved[0] 1",
                sys::unmap(
                    &self.module,
                    abi::P2pdmaUnmap {
                        reserved: [1, 0],
                        ..good
                    },
                ),
                Errno::INVAL,
            ),
            self.module
                .unmap(m.map_handle)
                .map_err(|e| Why::Fail(format!("UNMAP after the refused ones: {e}"))),
        ])
    }

    fn pin_user(&self) -> R {
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
        let u = self.module.unmap(m.map_handle).map_err(Why::from);
        all(vec![checks, u])
    }

    fn pin_user_bad(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let peer = self.host_peer();
        let pin = |va: u64, len: u64| {
            let r = self.module.pin_user(va, len, peer);
            if let Ok(m) = &r {
                let _ = self.module.unmap(m.map_handle);
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
            let _ = self.module.unmap(arg.map_handle);
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

    fn pin_user_enospc(&self) -> R {
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
        if r.is_ok() {
            let _ = self.module.unmap(arg.map_handle);
        }
        want_errno("PIN_USER with max_segs 0", r, Errno::NOSPC)?;
        ensure!(arg.num_segs >= 1, "ENOSPC with num_segs {}", arg.num_segs);
        Ok(())
    }

    fn udmabuf(&self, size: u64) -> Result<Udmabuf, Why> {
        match Udmabuf::create(size) {
            Ok(b) => Ok(b),
            Err(e) if e.errno() == Some(Errno::NOENT) => Err(Why::Skip(format!("{e}"))),
            Err(e) => Err(e.into()),
        }
    }

    fn dmabuf_import(&self) -> R {
        let buf = self.udmabuf(MIB)?;
        let m = self.module.dmabuf_import(buf.dmabuf(), self.host_peer())?;
        let checks = self.check_segs(&m, MIB, false);
        let u = self.module.unmap(m.map_handle).map_err(Why::from);
        let again = want_lib_errno(
            "second UNMAP of the import",
            self.module.unmap(m.map_handle),
            Errno::NOENT,
        );
        all(vec![checks, u, again])
    }

    fn dmabuf_import_not_dmabuf(&self) -> R {
        let buf = self.udmabuf(64 * KIB)?;
        let null = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("open /dev/null: {e}"))?;
        let import = |fd| {
            let r = self.module.dmabuf_import(fd, self.host_peer());
            if let Ok(m) = &r {
                let _ = self.module.unmap(m.map_handle);
            }
            r
        };
        all(vec![
            want_lib_errno(
                "DMABUF_IMPORT of the memfd",
                import(buf.memfd()),
                Errno::BADF,
            ),
            want_lib_errno(
                "DMABUF_IMPORT of /dev/null",
                import(null.as_fd()),
                Errno::BADF,
            ),
        ])
    }

    fn killed_mid_io(&self) -> R {
        self.nvme()?;
        let mut child = self.spawn_child(
            &[
                "io-loop".into(),
                "--dev".into(),
                self.dev.to_string(),
                "--nvme".into(),
                self.nvme_path.clone(),
            ],
            Stdio::null(),
        )?;
        let lines = line_reader(child.stdout.take().ok_or("no stdout pipe")?);
        let first = match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(e) => {
                let ended = proc::wait_child(&mut child, Duration::ZERO);
                fail!("the I/O loop reported nothing ({e}); it {ended}");
            }
        };
        thread::sleep(Duration::from_millis(300));
        let pid = Pid::from_child(&child);
        let still = matches!(child.try_wait(), Ok(None));
        let _ = kill_process(pid, Signal::KILL);
        let ended = proc::wait_child(&mut child, Duration::from_secs(30));
        let kv = parse_kv(&first);
        if let Some(e) = kv.get("error") {
            fail!("the I/O loop failed: {e}");
        }
        ensure!(
            still,
            "the I/O loop ended by itself ({ended}) after {first:?}"
        );
        ensure!(
            ended == Ended::Signaled(SIGKILL),
            "the I/O loop {ended}, expected SIGKILL"
        );
        let read_ok = kv.get("first").map(String::as_str) == Some("ok");
        let matched = kv.get("match").map(String::as_str) == Some("1");
        match self.expect {
            Some(ExpectP2p::Supported) => {
                ensure!(read_ok && matched, "O_DIRECT read into P2P memory: {first}")
            }
            Some(ExpectP2p::Unsupported) => ensure!(
                !read_ok,
                "O_DIRECT read into P2P memory worked although P2P is unsupported: {first}"
            ),
            None => ensure!(
                !read_ok || matched,
                "the P2P read's data differs from a host read: {first}"
            ),
        }
        self.leak_check()
    }

    fn unbind_rebind(&mut self, suite: &mut Suite) {
        const CASE: &str = "unbind-while-mapped";
        let drv = Path::new("/sys/bus/pci/drivers/p2pdma");
        if !getuid().is_root() {
            return suite.report(CASE, skip("needs root"));
        }
        if !drv.join("unbind").exists() {
            let why = format!("no {}", drv.join("unbind").display());
            return suite.report(CASE, Err(Why::Fail(why)));
        }
        let pci = self.accel.pci;
        let old_dev = self.dev;
        let old_size = self.accel.p2p_size;
        let unbound = {
            let (a, map) = match self.map_filled(old_dev, 71) {
                Ok(x) => x,
                Err(e) => return suite.report(CASE, Err(e)),
            };
            match self.unbind_while_mapped(suite, drv, pci, old_dev, a, map) {
                Ok(()) => true,
                Err(Why::Fail(e)) => {
                    suite.report(CASE, Err(Why::Fail(e)));
                    // Bind again only if the device did go away.
                    sys::device_info(&self.module, old_dev) == Err(Errno::NODEV)
                }
                Err(Why::Skip(e)) => {
                    suite.report(CASE, Err(Why::Skip(e)));
                    false
                }
            }
        };
        if unbound {
            self.rebind(suite, drv, pci, old_size);
        }
    }

    /// Allocates 1 MiB on `dev`, maps it and fills it with the pattern of
    /// `seed`.
    fn map_filled(
        &self,
        dev: u32,
        seed: u64,
    ) -> Result<(p2pdma::Allocation<'_>, DeviceMapping), Why> {
        let a = self.module.alloc(dev, MIB, 0)?;
        let map = a.map()?;
        write_verify(&map, seed)?;
        Ok((a, map))
    }

    /// Unbinds the device while this process and a helper have its memory
    /// mapped, then checks what each side sees. `Err` is a failure of the
    /// unbind itself; the checks after it report on their own.
    fn unbind_while_mapped(
        &self,
        suite: &mut Suite,
        drv: &Path,
        pci: PciAddress,
        old_dev: u32,
        a: p2pdma::Allocation<'_>,
        map: DeviceMapping,
    ) -> R {
        // A helper with a mapping of its own, to touch after the unbind.
        let mut child = self.spawn_child(
            &["touch-later".into(), "--dev".into(), old_dev.to_string()],
            Stdio::piped(),
        )?;
        let lines = line_reader(child.stdout.take().ok_or("no stdout pipe")?);
        match lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.starts_with("ready") => {}
            other => {
                let ended = proc::wait_child(&mut child, Duration::ZERO);
                fail!("the helper did not get ready ({other:?}); it {ended}");
            }
        }

        let (tx, rx) = mpsc::channel();
        let (unbind, name) = (drv.join("unbind"), pci.to_string());
        thread::spawn(move || {
            let _ = tx.send(std::fs::write(unbind, name));
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => suite.report("unbind-while-mapped", Ok(())),
            Ok(Err(e)) => {
                let _ = child.kill();
                let _ = child.wait();
                fail!("writing {pci} to unbind: {e}");
            }
            Err(_) => {
                // Release everything; the unbind may then finish.
                let _ = child.kill();
                let _ = child.wait();
                drop(map);
                drop(a);
                let late = rx.recv_timeout(Duration::from_secs(30)).is_ok();
                fail!(
                    "unbind did not return within 60 s while the memory was mapped ({})",
                    if late {
                        "it did once the memory was released"
                    } else {
                        "nor after the memory was released"
                    }
                );
            }
        }

        // The helper touches its mapping of the vanished device.
        let signalled = child
            .stdin
            .as_mut()
            .map(|s| writeln!(s, "go").and_then(|_| s.flush()).is_ok())
            .unwrap_or(false);
        let ended = proc::wait_child(&mut child, Duration::from_secs(30));
        let said: Vec<String> = lines.try_iter().collect();
        suite.report(
            "unbind-child-sigbus",
            if !signalled {
                Err(Why::Fail(format!("could not signal the helper; it {ended}")))
            } else if ended == Ended::Signaled(SIGBUS) {
                Ok(())
            } else {
                Err(Why::Fail(format!(
                    "touching a mapping of an unbound device: the helper {ended} ({}), expected SIGBUS",
                    said.join(" ")
                )))
            },
        );
        suite.report(
            "unbind-alloc-enodev",
            all(vec![
                want_errno(
                    "ALLOC on the unbound index",
                    self.raw_alloc(|_| {}),
                    Errno::NODEV,
                ),
                want_errno(
                    "DEVICE_INFO of the unbound index",
                    sys::device_info(&self.module, old_dev),
                    Errno::NODEV,
                ),
            ]),
        );
        let (flags, peer) = self.self_peer().to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer,
            handle: a.handle(),
            length: PAGE,
            ..Default::default()
        };
        let r = sys::dma_map(
            &self.module,
            &mut arg,
            &mut [abi::P2pdmaDmaSeg::default(); 4],
        );
        if r.is_ok() {
            let _ = self.module.unmap(arg.map_handle);
        }
        suite.report(
            "unbind-dma-map-enodev",
            want_errno("DMA_MAP of the old handle", r, Errno::NODEV),
        );
        suite.report(
            "unbind-free-old-handle",
            a.free()
                .map_err(|e| Why::Fail(format!("FREE of the old handle: {e}"))),
        );
        drop(map);
        Ok(())
    }

    /// Binds `pci` to the driver again and waits up to 10 s for it to be
    /// back in DEVICE_INFO; from then on the cases use its (possibly new)
    /// index. Fails if it comes back with another amount of P2P memory.
    fn bind_again(&mut self, drv: &Path, pci: PciAddress, old_size: u64) -> R {
        std::fs::write(drv.join("bind"), pci.to_string())
            .map_err(|e| format!("writing {pci} to bind: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let accel = loop {
            match self.module.find_accelerator(pci)? {
                Some(a) => break a,
                None if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                None => fail!("{pci} not back in DEVICE_INFO after 10 s"),
            }
        };
        self.dev = accel.index;
        self.accel = accel;
        ensure!(
            self.accel.p2p_size == old_size,
            "p2p_size {:#x} after rebinding, {old_size:#x} before",
            self.accel.p2p_size
        );
        Ok(())
    }

    fn rebind(&mut self, suite: &mut Suite, drv: &Path, pci: PciAddress, old_size: u64) {
        let r = self.bind_again(drv, pci, old_size);
        let back = matches!(self.module.find_accelerator(pci), Ok(Some(_)));
        suite.report("unbind-rebind", r);
        if !back {
            return;
        }
        suite.case("unbind-alloc-after-rebind", || self.alloc_after_rebind(72));
    }

    /// A fresh allocation on the rebound device works, holds data, and
    /// everything goes back.
    fn alloc_after_rebind(&self, seed: u64) -> R {
        let a = self.module.alloc(self.dev, 2 * MIB, 0)?;
        let map = a.map()?;
        write_verify(&map, seed)?;
        drop(map);
        a.free()?;
        self.leak_check()
    }
}

/// Opens what the suite needs; `Err` is a setup failure.
fn setup(node: &str, args: &SanityArgs) -> Result<Ctx, String> {
    let module = Module::open_path(node).map_err(|e| e.to_string())?;
    let accel = match args.dev {
        Some(d) => module
            .accelerator(d)
            .map_err(|e| format!("device {d}: {e}"))?,
        None => module
            .accelerators()
            .map_err(|e| e.to_string())?
            .into_iter()
            .next()
            .ok_or("no accelerator is bound to the p2pdma module")?,
    };
    let nvme = open(
        args.nvme.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok();
    let baseline = read_sysfs_u64(&p2pmem_path(accel.pci, "available")).ok();
    Ok(Ctx {
        node: node.to_string(),
        dev: accel.index,
        module,
        nvme_pci: nvme
            .as_ref()
            .and_then(|_| child::block_device_pci(&args.nvme)),
        accel,
        nvme_path: args.nvme.clone(),
        nvme,
        nvme_query: None,
        expect: args.expect_p2p,
        nvme_multipath: args.nvme_multipath.clone(),
        nvme_swap: args.nvme_swap.clone(),
        nvme_slow: args.nvme_slow.clone(),
        baseline,
    })
}

pub fn run(node: &str, json: bool, args: &SanityArgs) -> ExitCode {
    let mut suite = Suite {
        json,
        passed: 0,
        failed: 0,
        skipped: 0,
    };
    let mut ctx = match setup(node, args) {
        Ok(c) => c,
        Err(e) => {
            suite.report("setup", Err(Why::Fail(e)));
            return suite.finish();
        }
    };
    let c = &mut ctx;
    let s = &mut suite;

    s.case("leak-baseline", || match c.baseline {
        Some(b) if b == c.accel.p2p_available => Ok(()),
        Some(b) => fail!(
            "p2pmem/available is {b} but DEVICE_INFO says {} are free",
            c.accel.p2p_available
        ),
        None => fail!("cannot read {}", p2pmem_path(c.accel.pci, "available")),
    });
    s.case("version", || c.version());
    s.case("device-info", || c.device_info());
    s.case("device-info-bad-args", || c.device_info_bad_args());

    // Allocation, mapping and data.
    s.case("alloc-verify-4k", || c.alloc_verify(4 * KIB, 0, 1));
    s.case("alloc-verify-odd-size", || c.alloc_verify(5000, 0, 2));
    s.case("alloc-verify-64k", || c.alloc_verify(64 * KIB, 0, 3));
    s.case("alloc-verify-2m", || c.alloc_verify(2 * MIB, 0, 4));
    s.case("alloc-verify-2m-align-2m", || {
        c.alloc_verify(2 * MIB, 2 * MIB, 5)
    });
    s.case("alloc-verify-12k-align-64k", || {
        c.alloc_verify(12 * KIB, 64 * KIB, 6)
    });
    s.case("alloc-distinct", || c.alloc_distinct());
    s.case("alloc-map-twice", || c.alloc_map_twice());
    s.case("mapping-bounds", || c.mapping_bounds());
    s.case("alloc-zeroed-after-exit", || c.alloc_zeroed());
    s.case("leak-after-alloc", || c.leak_check());

    // Ownership: fork, close, fd passing. The forks come first, while this
    // process still has a single thread.
    s.case("fork-child-segv", || c.fork_child_segv());
    s.case("fork-child-mmap-eperm", || c.fork_child_mmap());
    s.case("fork-child-alloc-eperm", || c.fork_child_alloc());
    s.case("fork-child-free-eperm", || c.fork_child_free());
    s.case("fork-child-unmap-eperm", || c.fork_child_unmap());
    s.case("close-before-munmap", || c.close_before_munmap());
    s.case("scm-rights-eperm", || c.scm_rights());
    s.case("leak-after-ownership", || c.leak_check());

    // Argument checking.
    s.case("free-double", || c.free_double());
    s.case("free-never-issued", || c.free_never_issued());
    s.case("free-bad-args", || c.free_bad_args());
    s.case("alloc-zero-size", || {
        c.alloc_bad("ALLOC of 0 bytes", Errno::INVAL, |a| a.size = 0)
    });
    s.case("alloc-size-max", || {
        c.alloc_bad("ALLOC of u64::MAX bytes", Errno::INVAL, |a| {
            a.size = u64::MAX
        })
    });
    let p2p_size = c.accel.p2p_size;
    s.case("alloc-size-over-device", || {
        c.alloc_bad(
            "ALLOC of one page more than the device has",
            Errno::INVAL,
            |a| a.size = p2p_size + PAGE,
        )
    });
    s.case("alloc-align-not-pow2", || {
        c.alloc_bad("ALLOC aligned to 12 KiB", Errno::INVAL, |a| {
            a.align = 3 * PAGE
        })
    });
    s.case("alloc-align-too-big", || {
        c.alloc_bad("ALLOC aligned to 2 * P2PDMA_MAX_ALIGN", Errno::INVAL, |a| {
            a.align = 2 * abi::P2PDMA_MAX_ALIGN
        })
    });
    s.case("alloc-bad-flags", || {
        c.alloc_bad("ALLOC with flags 1", Errno::INVAL, |a| a.flags = 1)
    });
    s.case("alloc-bad-reserved", || {
        c.alloc_bad("ALLOC with reserved[3] 1", Errno::INVAL, |a| {
            a.reserved[3] = 1
        })
    });
    s.case("alloc-dev-out-of-range", || {
        all(vec![
            c.alloc_bad("ALLOC on device 64", Errno::INVAL, |a| a.dev_index = 64),
            c.alloc_bad("ALLOC on device u32::MAX", Errno::INVAL, |a| {
                a.dev_index = u32::MAX
            }),
        ])
    });
    s.case("alloc-dev-free-slot", || c.alloc_free_slot());
    for (name, r) in c.mmap_bad() {
        s.report(name, r);
    }
    s.case("ioctl-unknown", || c.ioctl_unknown());
    s.case("ioctl-wrong-size", || c.ioctl_wrong_size());
    s.case("ioctl-null-arg", || {
        c.ioctl_bad_pointer(InvalidPointer::Null)
    });
    s.case("ioctl-kernel-pointer", || {
        c.ioctl_bad_pointer(InvalidPointer::KernelHalf)
    });
    s.case("leak-after-errors", || c.leak_check());

    // Load.
    s.case("exhaustion", || c.exhaustion());
    s.case("threads", || c.threads());
    s.case("free-vs-dma-map-race", || c.free_vs_dma_map());
    s.case("threads-shared-handles", || c.stress_shared());
    s.case("alloc-user-share", || c.pool_share());
    // Forks: this process has a single thread again here.
    s.case("alloc-user-share-userns", || c.pool_share_userns());

    // P2P queries and DMA mappings.
    s.case("p2p-query-nvme", || c.p2p_query_nvme());
    s.case("p2p-query-pci", || c.p2p_query_pci());
    s.case("p2p-query-self", || c.p2p_query_self());
    s.case("p2p-query-bad-peers", || c.p2p_query_bad_peers());
    s.case("p2p-query-bad-args", || c.p2p_query_bad_args());
    s.case("dma-map-self-aligned", || c.dma_map_self());
    s.case("dma-map-partial", || c.dma_map_partial());
    s.case("dma-map-enospc", || c.dma_map_enospc());
    s.case("dma-map-bad-range", || c.dma_map_bad_range());
    s.case("dma-map-bad-fields", || c.dma_map_bad_fields());
    s.case("dma-map-no-such-handle", || c.dma_map_no_such_handle());
    s.case("dma-map-nvme", || c.dma_map_nvme());
    s.case("p2p-query-multipath", || c.p2p_query_multipath());
    s.case("dma-map-multipath", || c.dma_map_multipath());
    s.case("dma-map-agrees-with-query", || {
        c.dma_map_agrees_with_query()
    });
    s.case("free-while-dma-mapped", || c.free_while_dma_mapped());
    s.case("unmap-double", || c.unmap_double());
    s.case("unmap-never-issued", || c.unmap_never_issued());
    s.case("unmap-bad-args", || c.unmap_bad_args());
    s.case("pin-user", || c.pin_user());
    s.case("pin-user-bad-args", || c.pin_user_bad());
    s.case("pin-user-enospc", || c.pin_user_enospc());
    s.case("pin-user-overlap", || c.pin_overlap());
    s.case("pin-user-readonly", || c.pin_readonly());
    s.case("pin-user-memlock", || c.pin_memlock());
    s.case("pin-user-huge-self", || c.pin_huge_self());
    s.case("dmabuf-import", || c.dmabuf_import());
    s.case("dmabuf-import-not-dmabuf", || c.dmabuf_import_not_dmabuf());
    s.case("dmabuf-import-hugetlb-self", || c.dmabuf_hugetlb_self());
    s.case("dmabuf-import-bridge-peer", || c.dmabuf_bridge_peer());
    s.case("dmabuf-import-seg-limit", || c.dmabuf_seg_limit());
    s.case("dmabuf-import-overlap", || c.dmabuf_overlap());
    s.case("block-io-read", || c.block_io_read());
    s.case("block-io-write", || c.block_io_write());
    s.case("block-io-bad-args", || c.block_io_bad_args());
    s.case("block-io-swap-etxtbsy", || c.block_io_swap());
    s.case("block-io-dsync-flush", || c.block_io_dsync());
    s.case("block-io-slow-no-hung-task", || c.block_io_slow());
    s.case("leak-after-dma", || c.leak_check());

    // Processes that lose privileges or die, and the device going away.
    s.case("unprivileged-eperm", || c.unprivileged());
    s.case("killed-mid-io", || c.killed_mid_io());
    if args.no_unbind {
        for case in [
            "unbind-while-mapped",
            "revoke-unbind",
            "unbind-mmap-race",
            "unbind-during-block-io",
            "unbind-map-race",
        ] {
            s.report(case, skip("--no-unbind"));
        }
    } else {
        c.unbind_rebind(s);
        c.unbind_revokes(s);
        c.unbind_mmap_race(s);
        c.unbind_during_block_io(s);
        c.unbind_map_race(s);
    }
    s.case("leak-final", || c.leak_check());

    suite.finish()
}
