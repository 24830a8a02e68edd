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
//! This file is the harness: the arguments, the context the cases share,
//! the tally, the helpers that judge a result, and the list of cases in the
//! order they run. The cases live in submodules by subject: `ioctl`
//! (`GET_VERSION`, `DEVICE_INFO`, ioctl codes and pointers), `alloc`
//! (allocations and their data, `FREE`, `ALLOC` arguments, zeroed memory,
//! the per-user share), `mmap` (user mappings and their bounds), `process`
//! (forks, closed and passed fds, unprivileged and killed processes),
//! `load` (exhaustion, threads), `race` (`FREE` against `DMA_MAP`,
//! shared-handle stress), `query` (`P2P_QUERY`), `dma` (`DMA_MAP` and
//! `UNMAP`), `peer` (multipath heads, `DMA_MAP` agreeing with `P2P_QUERY`),
//! `pin` (`PIN_USER`: overlapping, read-only, huge-page and
//! `RLIMIT_MEMLOCK` pins), `dmabuf` (`DMABUF_IMPORT`: bridges, segment
//! limits and overlap bounds), `overlap` (the bound on mappings of one
//! page over files, udmabufs of one memfd and repeated `DMA_MAP`s),
//! `blockio` (`BLOCK_IO`, swap devices, sync
//! writes and long waits included), `unbind` (unbinding while mapped, and
//! binding again), `revoke` (what an unbind revokes, and mappings made
//! while it runs, probed by the kernel's own copies so that a revoked
//! mapping gives `EFAULT` instead of `SIGBUS`) and `revoke_race`
//! (`DMA_MAP`, `PIN_USER` and `DMABUF_IMPORT` looping across unbind and
//! bind cycles).

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    os::fd::{AsFd, OwnedFd},
    panic::{catch_unwind, AssertUnwindSafe},
    process::{Child, Command, ExitCode, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use clap::{Args, ValueEnum};
use p2pdma::{
    sys::{self, InvalidPointer},
    Accelerator, DeviceMapping, MapType, Module, P2pQuery, PciAddress, Peer, Udmabuf,
};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, unlink, Mode, OFlags},
    io::Errno,
};
use serde_json::json;

use crate::{
    child::{self, parse_kv},
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
mod dma;
mod dmabuf;
mod ioctl;
mod load;
mod mmap;
mod overlap;
mod peer;
mod pin;
mod process;
mod query;
mod race;
mod revoke;
mod revoke_race;
mod unbind;

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

/// The outcome a helper process printed as `key=errno` (0 for success, -1
/// for an error without an errno) among `kv`, parsed from its output `out`.
fn child_outcome(
    kv: &HashMap<String, String>,
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

/// Runs every check and fails with all the messages of those that failed.
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

/// A scratch file for probes, already unlinked.
fn scratch_file(tag: &str) -> Result<OwnedFd, String> {
    let path = format!("/tmp/p2pdma-sanity-{}-{tag}", std::process::id());
    let fd = open(
        path.as_str(),
        OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| format!("create {path}: {}", ename(e)))?;
    let _ = unlink(path.as_str());
    Ok(fd)
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

    /// The arguments of helper subcommand `name`: the device, and the NVMe
    /// namespace when there is one.
    fn helper_args(&self, name: &str) -> Vec<String> {
        let mut args = vec![name.to_string(), "--dev".into(), self.dev.to_string()];
        if self.nvme.is_some() {
            args.extend(["--nvme".to_string(), self.nvme_path.clone()]);
        }
        args
    }

    /// Runs a helper (`args`, with nothing on its stdin) for up to
    /// `timeout` and checks that it exited with 0: its output parsed as
    /// `key=value` pairs, and the output itself.
    fn run_helper(
        &self,
        args: &[String],
        timeout: Duration,
    ) -> Result<(HashMap<String, String>, String), Why> {
        let child = self.spawn_child(args, Stdio::null())?;
        let (ended, out) = self.finish_child(child, timeout);
        ensure!(
            ended == Ended::Exited(0),
            "the helper {ended}: {}",
            out.trim()
        );
        Ok((parse_kv(&out), out))
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
        let _ = self.free_raw(arg.handle);
        Ok(arg)
    }

    /// The first device index with nothing bound, if any.
    fn free_slot(&self) -> Option<u32> {
        (0..abi::P2PDMA_MAX_DEVICES)
            .find(|&i| sys::device_info(&self.module, i) == Err(Errno::NODEV))
    }

    /// Checks a mapping's segments: they add up to `length`, are non-empty,
    /// and (for a bus-address mapping of accelerator memory) lie in the BAR.
    fn check_segs(&self, m: &p2pdma::DmaMapping, length: u64, in_bar: bool) -> R {
        self.check_seg_list(m.length, &m.segs, length, in_bar)
    }

    /// [`check_segs`](Self::check_segs) of a mapping of `mapped` bytes at
    /// `segs`.
    fn check_seg_list(&self, mapped: u64, segs: &[(u64, u64)], length: u64, in_bar: bool) -> R {
        ensure!(!segs.is_empty(), "no segments");
        ensure!(mapped == length, "length {mapped} mapped, {length} asked");
        let total = segs.iter().fold(0u64, |t, &(_, l)| t.saturating_add(l));
        ensure!(
            total == length,
            "segments add up to {total}, expected {length}: {segs:x?}"
        );
        ensure!(
            segs.iter().all(|&(_, l)| l > 0),
            "an empty segment: {segs:x?}"
        );
        if in_bar {
            let (lo, hi) = (
                self.accel.bar_bus_addr,
                self.accel.bar_bus_addr + self.accel.bar_size,
            );
            for &(addr, len) in segs {
                ensure!(
                    addr >= lo && addr.saturating_add(len) <= hi,
                    "segment {addr:#x}+{len:#x} outside the BAR [{lo:#x}, {hi:#x})"
                );
            }
        }
        Ok(())
    }

    /// Checks a `DMA_MAP` or `PIN_USER` (`arg`, which gave `r`) that had no
    /// room for segments: `ENOSPC`, with `num_segs` saying how many it
    /// needs. What it mapped by mistake is unmapped again.
    fn want_enospc(&self, what: &str, r: Result<(), Errno>, arg: &abi::P2pdmaDmaMap) -> R {
        if r.is_ok() {
            let _ = self.unmap_raw(arg.map_handle);
        }
        want_errno(what, r, Errno::NOSPC)?;
        ensure!(arg.num_segs >= 1, "ENOSPC with num_segs {}", arg.num_segs);
        Ok(())
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

    /// The peer for host-memory cases: the NVMe if there is one, else the
    /// accelerator itself.
    fn host_peer(&self) -> Peer<'_> {
        match &self.nvme {
            Some(fd) => Peer::Fd(fd.as_fd()),
            None => self.self_peer(),
        }
    }

    fn udmabuf(&self, size: u64) -> Result<Udmabuf, Why> {
        match Udmabuf::create(size) {
            Ok(b) => Ok(b),
            Err(e) if e.errno() == Some(Errno::NOENT) => Err(Why::Skip(format!("{e}"))),
            Err(e) => Err(e.into()),
        }
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
    s.case("overlap-shared-memfd", || c.overlap_shared_memfd());
    s.case("overlap-pin-files", || c.overlap_pin_files());
    s.case("overlap-dma-map", || c.overlap_dma_map());
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
