//! `p2pdma-ctl bench queues`: one NVMe namespace read several ways into
//! accelerator memory, side by side, in rounds that each run every way once
//! (medians and ranges over the rounds).
//!
//! - 4 KiB random reads at each depth, by several submitter threads: IOPS
//!   and guest CPU time per I/O with `O_DIRECT` P2P through io_uring, with
//!   NVMe passthrough through io_uring on the nvme driver's interrupt
//!   queues, and on its polled queues (`IORING_SETUP_IOPOLL`, where the
//!   driver has `nvme.poll_queues`), then with the queues path (the
//!   controller taken from the kernel, driven by this process with as many
//!   queues as the kernel completes by interrupts, shared by the same
//!   threads, in accelerator memory, a batch of commands per doorbell),
//!   once with waiters that only poll, as accelerator threads do, and once
//!   with waiters that sleep on the completion queue's MSI-X interrupt
//!   after polling a little; reads of the namespace's own block size;
//! - 1 MiB sequential reads through the engine: guest CPU time per GiB on
//!   the bounce, P2P and queues paths (the memory registered for the
//!   queues path, mapped once).
//!
//! Every contender's reads are checked against what `pread` of the block
//! device returned for the same blocks before the controller changed hands.
//! Machine CPU time comes from `/proc/stat`'s idle clocks, so interrupts
//! and kernel threads count; process CPU time is this process's. The
//! controller goes back to the nvme driver after each round.

use std::{
    fs::File,
    os::{
        fd::AsRawFd,
        unix::fs::{FileExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use io_uring::{opcode, types, IoUring};
use p2pdma::{
    memory::{DeviceMemory, ModuleMemory},
    queues::{claim, Controller, InitOptions, IoCommand, Scope},
    transfer::{nvme_io_sqe, Config, Engine, Namespace, PathPref, StorageFile},
    MemRange, Module, PciAddress, PeerAccess,
};
use serde_json::{json, Value};

use super::common::{cpu_time, first_accelerator, idle_time, BenchArgs, Res};

/// Bytes of each random read.
const IO: usize = 4096;
/// Random reads checked per contender before it is timed.
const CHECKED: usize = 512;
/// Bytes of each sequential read, and of a sequential transfer.
const SEQ_IO: usize = 1 << 20;
const SEQ_LEN: usize = 16 << 20;
/// Sequential transfers per round and path: long enough for `/proc/stat`'s
/// clock ticks (10 ms) to be a small part of the time.
const SEQ_REPS: usize = 32;

/// The ways of doing random reads, in the order each round runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Odirect,
    Passthrough,
    PassthroughPolled,
    QueuesPolled,
    Queues,
}

impl Way {
    const ALL: [Way; 5] = [
        Way::Odirect,
        Way::Passthrough,
        Way::PassthroughPolled,
        Way::QueuesPolled,
        Way::Queues,
    ];

    fn name(self) -> &'static str {
        match self {
            Way::Odirect => "O_DIRECT P2P",
            Way::Passthrough => "passthrough",
            Way::PassthroughPolled => "passthrough, IOPOLL",
            Way::QueuesPolled => "queues, polled",
            Way::Queues => "queues, interrupts",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Way::Odirect => "odirect_p2p",
            Way::Passthrough => "passthrough",
            Way::PassthroughPolled => "passthrough_iopoll",
            Way::QueuesPolled => "queues_polled",
            Way::Queues => "queues",
        }
    }
}

/// The median, smallest and largest of `v` (NaN when empty).
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (med, v[0], v[n - 1])
}

/// What one cell measured.
#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    ios: u64,
    wall: Duration,
    /// Machine busy time (all CPUs).
    busy: f64,
    /// This process's CPU time.
    cpu: f64,
}

impl Cell {
    fn iops(&self) -> f64 {
        self.ios as f64 / self.wall.as_secs_f64()
    }
    fn busy_us(&self) -> f64 {
        self.busy * 1e6 / self.ios.max(1) as f64
    }
    fn cpu_us(&self) -> f64 {
        self.cpu * 1e6 / self.ios.max(1) as f64
    }
}

/// The namespace's block and generic devices while the nvme driver has
/// the controller.
fn kernel_devices(bdf: &str, nsid: u32) -> Res<(PathBuf, PathBuf)> {
    let dir = Path::new("/sys/bus/pci/devices").join(bdf).join("nvme");
    for c in std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
    {
        for n in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
            let name = n.file_name().to_string_lossy().into_owned();
            let id = std::fs::read_to_string(n.path().join("nsid")).unwrap_or_default();
            if name.starts_with("nvme") && id.trim() == nsid.to_string() {
                let generic = format!("/dev/ng{}", name.trim_start_matches("nvme"));
                return Ok((PathBuf::from("/dev").join(&name), PathBuf::from(generic)));
            }
        }
    }
    Err(format!("no block device for namespace {nsid} of {bdf}"))
}

/// The logical block size of block device `dev` (a `/dev` path), from
/// sysfs.
fn logical_block_size(dev: &Path) -> Res<u64> {
    let name = dev.file_name().map(|n| n.to_string_lossy().into_owned());
    let p = Path::new("/sys/class/block")
        .join(name.unwrap_or_default())
        .join("queue/logical_block_size");
    std::fs::read_to_string(&p)
        .map_err(|e| format!("{}: {e}", p.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// Block-aligned random offsets in `[0, span)`, the same for every way.
fn offsets(n: usize, span: u64, seed: u64) -> Vec<u64> {
    let mut r = seed | 1;
    (0..n)
        .map(|_| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r % (span / IO as u64) * IO as u64
        })
        .collect()
}

/// Runs `threads` submitters for `secs` (or until each did `max` reads),
/// each through `one(thread)`, which returns the reads it did; measures
/// wall, machine and process CPU time.
fn timed(threads: usize, one: impl Fn(usize) -> Res<u64> + Sync) -> Res<Cell> {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (c0, i0, t0) = (cpu_time(), idle_time()?, Instant::now());
    let ios = thread::scope(|s| -> Res<u64> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let one = &one;
                s.spawn(move || one(t))
            })
            .collect();
        let mut n = 0;
        for h in hs {
            n += h.join().map_err(|_| "a submitter panicked".to_string())??;
        }
        Ok(n)
    })?;
    let wall = t0.elapsed();
    let idle = idle_time()?.saturating_sub(i0);
    Ok(Cell {
        ios,
        wall,
        busy: (wall.as_secs_f64() * cpus - idle.as_secs_f64()).max(0.0),
        cpu: (cpu_time() - c0).as_secs_f64(),
    })
}

/// The slot of thread `t`'s `i`-th read in flight: each thread has `depth`
/// slots of its own.
fn slot(t: usize, depth: usize, i: usize) -> usize {
    (t * depth + i % depth) * IO
}

/// One submitter's share of a cell: thread `t` reads `offs` (until
/// `deadline`), `depth` in flight in its own slots; `check` sees each slot
/// once its read completed.
struct Job<'a> {
    t: usize,
    depth: usize,
    offs: &'a [u64],
    deadline: Instant,
    check: &'a dyn Fn(usize, u64) -> Res<()>,
}

impl<'a> Job<'a> {
    fn new(
        t: usize,
        depth: usize,
        offs: &'a [u64],
        secs: Duration,
        check: &'a dyn Fn(usize, u64) -> Res<()>,
    ) -> Self {
        Self {
            t,
            depth,
            offs,
            deadline: Instant::now() + secs,
            check,
        }
    }
}

/// 4 KiB reads of `offs` through io_uring on the kernel's devices, `depth`
/// in flight, into `base + slot`; `check` sees each slot once its read
/// completed.
#[allow(unsafe_code)]
fn uring_reads(
    way: Way,
    file: &File,
    (nsid, bs): (u32, u64),
    base: usize,
    j: &Job<'_>,
) -> Res<u64> {
    let Job {
        t,
        depth,
        offs,
        deadline,
        check,
    } = *j;
    let sys = |e: std::io::Error| format!("io_uring: {e}");
    let mut builder = IoUring::<io_uring::squeue::Entry128, io_uring::cqueue::Entry32>::builder();
    if way == Way::PassthroughPolled {
        // Completions reaped by polling the nvme driver's poll queues.
        builder.setup_iopoll();
    }
    let mut ring = builder
        .build(depth.next_power_of_two() as u32)
        .map_err(sys)?;
    let fd = file.as_raw_fd();
    let (mut next, mut inflight, mut done) = (0usize, 0usize, 0u64);
    loop {
        while inflight < depth && next < offs.len() && Instant::now() < deadline {
            let addr = (base + slot(t, depth, next)) as *mut u8;
            let sqe = match way {
                Way::Odirect => {
                    let e = opcode::Read::new(types::Fd(fd), addr, IO as u32)
                        .offset(offs[next])
                        .build();
                    io_uring::squeue::Entry128::from(e)
                }
                _ => nvme_io_sqe(
                    fd,
                    false,
                    nsid,
                    offs[next] / bs,
                    (IO as u64 / bs) as u32,
                    addr as u64,
                    IO as u32,
                ),
            }
            .user_data(next as u64);
            // SAFETY: The slot is inside the memory's mapping, which lives
            // for the whole bench, longer than any read in flight; no other
            // read uses the slot until this one completes.
            unsafe { ring.submission().push(&sqe) }.map_err(|_| "submission queue full")?;
            next += 1;
            inflight += 1;
        }
        if inflight == 0 {
            return Ok(done);
        }
        ring.submit_and_wait(1).map_err(sys)?;
        let cqes: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (i, res) in cqes {
            inflight -= 1;
            done += 1;
            let i = i as usize;
            let ok = match way {
                Way::Odirect => res == IO as i32,
                _ => res == 0,
            };
            if !ok {
                return Err(format!(
                    "{}: read at {} ended with {res}",
                    way.name(),
                    offs[i]
                ));
            }
            check(slot(t, depth, i), offs[i])?;
        }
    }
}

/// The same through the queues: thread `t` submits into queue `t`, as
/// many as `depth` in flight, each refill one batch (one doorbell); it
/// waits for its oldest read, then takes every later one already done.
fn queue_reads<'s, 'env>(
    scope: &'s Scope<'s, 'env>,
    mapped: &'env p2pdma::queues::Mapped<'env>,
    (nsid, bs): (u32, u64),
    j: &Job<'_>,
) -> Res<u64> {
    let Job {
        t,
        depth,
        offs,
        deadline,
        check,
    } = *j;
    let mut flight = std::collections::VecDeque::new();
    let mut done = 0u64;
    let finish = |(p, i): (p2pdma::queues::Pending<'_>, usize)| -> Res<()> {
        p.wait().map_err(|e| e.to_string())?;
        check(slot(t, depth, i), offs[i])
    };
    let mut next = 0;
    loop {
        let mut batch = scope.batch(t);
        while flight.len() < depth && next < offs.len() && Instant::now() < deadline {
            let data = mapped
                .payload(slot(t, depth, next), IO)
                .map_err(|e| e.to_string())?;
            let cmd = IoCommand::read(nsid, offs[next] / bs, (IO as u64 / bs) as u32, data);
            match batch.try_push(&cmd).map_err(|e| e.to_string())? {
                Some(p) => {
                    flight.push_back((p, next));
                    next += 1;
                }
                None => break,
            }
        }
        batch.ring();
        drop(batch);
        let Some(f) = flight.pop_front() else {
            return Ok(done);
        };
        finish(f)?;
        done += 1;
        while flight.front().is_some_and(|(p, _)| p.is_done()) {
            if let Some(f) = flight.pop_front() {
                finish(f)?;
                done += 1;
            }
        }
    }
}

/// Guest CPU s/GiB and GiB/s of 1 MiB sequential reads through `engine`.
fn sequential(
    engine: &Engine,
    file: &StorageFile,
    mem: &dyn DeviceMemory,
    mem_offset: usize,
    reps: usize,
) -> Res<(Cell, String)> {
    let range = MemRange::new(mem, mem_offset, SEQ_LEN).map_err(|e| e.to_string())?;
    let rep = engine.read(file, 0, range).map_err(|e| e.to_string())?;
    let cell = timed(1, |_| {
        for _ in 0..reps {
            engine.read(file, 0, range).map_err(|e| e.to_string())?;
        }
        Ok((reps * SEQ_LEN / SEQ_IO) as u64)
    })?;
    Ok((cell, rep.path.to_string()))
}

/// The nvme driver's I/O queues for block device `dev`: those completed
/// by interrupts and the polled ones (`nvme.poll_queues`).
fn kernel_queues(dev: &Path) -> (usize, usize) {
    let name = dev.file_name().map(|n| n.to_string_lossy().into_owned());
    let mq = Path::new("/sys/class/block")
        .join(name.unwrap_or_default())
        .join("mq");
    let all = std::fs::read_dir(mq).map_or(0, |d| d.count());
    let poll = std::fs::read_to_string("/sys/module/nvme/parameters/poll_queues")
        .ok()
        .and_then(|p| p.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(all.saturating_sub(1));
    (all - poll, poll)
}

/// The namespace's block and generic devices once the nvme driver has the
/// controller again (it probes it anew after it is given back).
fn await_kernel_devices(bdf: &str, nsid: u32) -> Res<(PathBuf, PathBuf)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match kernel_devices(bdf, nsid) {
            Ok((b, g)) if b.exists() && g.exists() => return Ok((b, g)),
            r if Instant::now() > deadline => {
                return Err(format!("the nvme driver did not bring {bdf} back: {r:?}"))
            }
            _ => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Each round of [`bench`](fn@bench): the kernel's ways while its nvme driver has the
/// controller, then the queues path with it taken (and given back), so
/// that every way runs once per round, interleaved with the others.
pub(super) fn bench(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let bdf = p2pdma::discovery::nvme_by_serial(&a.serial)?;
    let pci: PciAddress = bdf.parse().map_err(|e: p2pdma::Error| e.to_string())?;
    let (block, _) = kernel_devices(&bdf, a.nsid)?;
    let bs = logical_block_size(&block)?;
    if bs == 0 || !(IO as u64).is_multiple_of(bs) {
        return Err(format!(
            "{}: {bs}-byte blocks do not divide the {IO}-byte reads",
            block.display()
        ));
    }
    let (kq, kpoll) = kernel_queues(&block);
    // As many queues as the kernel completes by interrupts, shared by the
    // same submitter threads.
    let queues = kq.max(1);
    let threads = a.threads.max(1);
    let rounds = a.reps.max(1);
    let depths: Vec<usize> = a.depths.iter().map(|&d| d.clamp(1, 255)).collect();
    let most = depths.iter().copied().max().unwrap_or(1);
    let span = (a.size / IO as u64 * IO as u64).max(IO as u64 * 16);
    let secs = Duration::from_secs_f64(a.secs);
    let accel = first_accelerator(&module)?;
    let random_len = threads * most * IO;
    let shared: Arc<ModuleMemory> = Arc::new(
        ModuleMemory::alloc(
            module.clone(),
            accel.index,
            (random_len + SEQ_LEN) as u64,
            0,
        )
        .map_err(|e| e.to_string())?,
    );
    let mem: &ModuleMemory = &shared;
    let base = mem.mapping().as_ptr() as usize;
    // What the blocks hold, read by the kernel before anyone else: each
    // thread reads the same pseudo-random offsets at every depth.
    let offs: Vec<Vec<u64>> = (0..threads)
        .map(|t| offsets(a.max_ios, span, 0x9e37_79b9_7f4a_7c15 ^ t as u64))
        .collect();
    let dev = File::open(&block).map_err(|e| format!("{}: {e}", block.display()))?;
    let mut want = std::collections::HashMap::new();
    for o in offs.iter().flat_map(|v| v[..CHECKED.min(v.len())].iter()) {
        let mut b = vec![0u8; IO];
        dev.read_exact_at(&mut b, *o)
            .map_err(|e| format!("{}: {e}", block.display()))?;
        want.insert(*o, b);
    }
    let mut seq_want = vec![0u8; SEQ_LEN];
    dev.read_exact_at(&mut seq_want, 0)
        .map_err(|e| format!("{}: {e}", block.display()))?;
    drop(dev);
    let verify = |s: usize, off: u64| -> Res<()> {
        let Some(w) = want.get(&off) else {
            return Ok(());
        };
        let mut got = vec![0u8; IO];
        mem.read_at(s, &mut got).map_err(|e| e.to_string())?;
        match got == *w {
            true => Ok(()),
            false => Err(format!("the 4 KiB read at {off} landed wrong bytes")),
        }
    };
    let no_check = |_: usize, _: u64| -> Res<()> { Ok(()) };
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "queues: {bdf} namespace {} ({}, {bs}-byte blocks), 4 KiB random reads over {} MiB into accelerator {} memory, {threads} submitter threads, {:.1} s per cell, {rounds} rounds; {cpus} guest CPUs",
        a.nsid,
        block.display(),
        span >> 20,
        accel.pci,
        a.secs
    );
    println!(
        "  the kernel's nvme driver: {kq} I/O queue(s) completed by interrupts, {kpoll} polled; the queues path: {queues} queue(s), each with an MSI-X vector of its own, shared by the threads"
    );
    println!("  (guest CPU time per I/O compares the paths in one guest; under TCG the device is emulated outside the guest, and the times are the emulator's, not hardware's)");

    let seq_engine = |pref| {
        Engine::new(
            Config {
                path: pref,
                chunk: Some(SEQ_IO),
                depth: Some(8),
                ..Config::default()
            },
            Some(module.clone()),
        )
    };
    let check_seq = |name: &str| -> Res<()> {
        let mut got = vec![0u8; SEQ_LEN];
        mem.read_at(random_len, &mut got)
            .map_err(|e| e.to_string())?;
        match got == seq_want {
            true => Ok(()),
            false => Err(format!("{name}: the sequential read landed wrong bytes")),
        }
    };
    let mut cells: Vec<(Way, usize, Cell)> = Vec::new();
    let mut seq: Vec<(&str, String, Cell)> = Vec::new();
    let mut notes = Vec::new();
    for round in 0..rounds {
        // The kernel's paths, while its nvme driver has the controller.
        let (block, generic) = await_kernel_devices(&bdf, a.nsid)?;
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&block)
            .map_err(|e| format!("{}: {e}", block.display()))?;
        let ng = File::open(&generic).map_err(|e| format!("{}: {e}", generic.display()))?;
        for way in [Way::Odirect, Way::Passthrough, Way::PassthroughPolled] {
            if way == Way::PassthroughPolled && kpoll == 0 {
                continue;
            }
            let f = if way == Way::Odirect { &direct } else { &ng };
            if round == 0 {
                // Checked first, untimed: the bytes must be the namespace's.
                timed(threads, |t| {
                    let checked = &offs[t][..CHECKED.min(offs[t].len())];
                    let j = Job::new(t, most, checked, Duration::from_secs(3600), &verify);
                    uring_reads(way, f, (a.nsid, bs), base, &j)
                })?;
            }
            for &d in &depths {
                let c = timed(threads, |t| {
                    let j = Job::new(t, d, &offs[t], secs, &no_check);
                    uring_reads(way, f, (a.nsid, bs), base, &j)
                })?;
                cells.push((way, d, c));
            }
        }
        let kfile = StorageFile::open(&block).map_err(|e| e.to_string())?;
        for (name, pref) in [("bounce", PathPref::Bounce), ("p2p", PathPref::P2p)] {
            let (c, ran) = sequential(&seq_engine(pref), &kfile, mem, random_len, SEQ_REPS)?;
            check_seq(name)?;
            seq.push((name, ran, c));
        }
        drop((direct, ng, kfile));

        // The queues path: the controller taken from the kernel, its
        // waiters polling, then sleeping on interrupts.
        let r = (|| -> Res<()> {
            for (way, interrupts) in [(Way::QueuesPolled, false), (Way::Queues, true)] {
                let opts = InitOptions {
                    unbind: true,
                    queues: u16::try_from(queues).map_err(|_| "too many queues")?,
                    entries: (threads.div_ceil(queues) * most + 1)
                        .next_power_of_two()
                        .clamp(64, 4096) as u16,
                    interrupts,
                    ..InitOptions::default()
                };
                let ctrl = Controller::initialize(module.clone(), pci, &opts)
                    .map_err(|e| e.to_string())?;
                if interrupts {
                    if let Err(why) = ctrl.interrupts() {
                        return Err(format!("the queues have no interrupts: {why}"));
                    }
                }
                let mapped = ctrl
                    .map(mem, 0, random_len, PeerAccess::WriteOnly)
                    .map_err(|e| e.to_string())?;
                if round == 0 {
                    timed(threads, |t| {
                        let checked = &offs[t][..CHECKED.min(offs[t].len())];
                        let j = Job::new(t, most, checked, Duration::from_secs(3600), &verify);
                        ctrl.scope(|s| queue_reads(s, &mapped, (a.nsid, bs), &j))
                    })?;
                }
                let before = (ctrl.doorbell_counts(), ctrl.interrupt_sleeps());
                for &d in &depths {
                    let c = timed(threads, |t| {
                        let j = Job::new(t, d, &offs[t], secs, &no_check);
                        ctrl.scope(|s| queue_reads(s, &mapped, (a.nsid, bs), &j))
                    })?;
                    cells.push((way, d, c));
                }
                let after = (ctrl.doorbell_counts(), ctrl.interrupt_sleeps());
                if round == 0 {
                    notes.push(format!(
                        "  {}: {} commands, {} submission doorbells, {} sleeps on an interrupt ({}) in round 1",
                        way.name(),
                        after.0 .1 - before.0 .1,
                        after.0 .0 - before.0 .0,
                        after.1 - before.1,
                        match ctrl.interrupts() {
                            Ok(n) => format!("{n} MSI-X vectors"),
                            Err(why) => format!("polled: {why}"),
                        }
                    ));
                }
                drop(mapped);
                if !interrupts {
                    continue;
                }
                let ns = Arc::new(
                    Namespace::new(ctrl.clone(), module.clone(), a.nsid)
                        .map_err(|e| e.to_string())?,
                );
                // Registered once, as cuFileBufRegister does: the
                // sequential reads map nothing per transfer.
                ns.register(shared.clone()).map_err(|e| e.to_string())?;
                let qfile = StorageFile::namespace(ns);
                let (c, ran) = sequential(
                    &seq_engine(PathPref::Auto),
                    &qfile,
                    mem,
                    random_len,
                    SEQ_REPS,
                )?;
                check_seq("queues")?;
                seq.push(("queues", ran, c));
            }
            Ok(())
        })();
        // Back to the kernel whatever happened.
        let back = claim::give_back(&bdf);
        r?;
        back?;
    }
    for n in &notes {
        println!("{n}");
    }

    let of = |w: Way, d: usize, f: &dyn Fn(&Cell) -> f64| -> Vec<f64> {
        cells
            .iter()
            .filter(|(cw, cd, _)| *cw == w && *cd == d)
            .map(|c| f(&c.2))
            .collect()
    };
    let ways: Vec<Way> = Way::ALL
        .into_iter()
        .filter(|&w| cells.iter().any(|c| c.0 == w))
        .collect();
    let fmt = |(m, lo, hi): (f64, f64, f64), p: usize| format!("{m:.p$} ({lo:.p$}-{hi:.p$})");
    let mut rows = Vec::new();
    for (title, f, p) in [
        ("IOPS", &(|c: &Cell| c.iops()) as &dyn Fn(&Cell) -> f64, 0),
        ("machine CPU us per I/O", &|c: &Cell| c.busy_us(), 1),
        ("process CPU us per I/O", &|c: &Cell| c.cpu_us(), 1),
    ] {
        println!("  4 KiB random reads, {title}: median (smallest-largest) of {rounds} rounds");
        let head: Vec<String> = ways.iter().map(|w| format!("{:>26}", w.name())).collect();
        println!("  depth {}", head.join(" "));
        for &d in &depths {
            let v: Vec<String> = ways
                .iter()
                .map(|&w| format!("{:>26}", fmt(spread(&of(w, d, f)), p)))
                .collect();
            println!("  {d:5} {}", v.join(" "));
        }
    }
    let med = |w: Way, d: usize, f: &dyn Fn(&Cell) -> f64| spread(&of(w, d, f)).0;
    println!("  the queues path against passthrough (medians): IOPS and machine CPU per I/O");
    println!(
        "  depth {:>30} {:>30} {:>30}",
        "interrupts / passthrough",
        "interrupts / passthrough IOPOLL",
        "polled / passthrough IOPOLL"
    );
    for &d in &depths {
        let iops = |w: Way| med(w, d, &|c: &Cell| c.iops());
        let cpu = |w: Way| med(w, d, &|c: &Cell| c.busy_us());
        let pair = |a: Way, b: Way| format!("{:6.2}x {:6.2}x", iops(a) / iops(b), cpu(a) / cpu(b));
        println!(
            "  {d:5} {:>30} {:>30} {:>30}",
            pair(Way::Queues, Way::Passthrough),
            pair(Way::Queues, Way::PassthroughPolled),
            pair(Way::QueuesPolled, Way::PassthroughPolled)
        );
        let mut row = json!({"depth": d});
        for &w in &ways {
            let j = |f: &dyn Fn(&Cell) -> f64| {
                let (m, lo, hi) = spread(&of(w, d, f));
                json!({"median": m, "min": lo, "max": hi})
            };
            row[w.key()] = json!({"iops": j(&|c: &Cell| c.iops()),
                "machine_cpu_us_per_io": j(&|c: &Cell| c.busy_us()),
                "process_cpu_us_per_io": j(&|c: &Cell| c.cpu_us())});
        }
        row["queues_vs_passthrough"] = json!({"iops": iops(Way::Queues) / iops(Way::Passthrough),
            "machine_cpu_per_io": cpu(Way::Queues) / cpu(Way::Passthrough)});
        row["queues_vs_passthrough_iopoll"] = json!({"iops": iops(Way::Queues) / iops(Way::PassthroughPolled),
            "machine_cpu_per_io": cpu(Way::Queues) / cpu(Way::PassthroughPolled)});
        rows.push(row);
    }
    println!(
        "  1 MiB sequential reads ({} MiB x {SEQ_REPS} per round): guest CPU s/GiB (machine), median (smallest-largest) of {rounds} rounds, and GiB/s",
        SEQ_LEN >> 20
    );
    let gib = |c: &Cell| (c.ios as f64 * SEQ_IO as f64) / (1u64 << 30) as f64;
    let per = |name: &str, f: &dyn Fn(&Cell) -> f64| -> Vec<f64> {
        seq.iter()
            .filter(|s| s.0 == name)
            .map(|s| f(&s.2))
            .collect()
    };
    let bounce = spread(&per("bounce", &|c| c.busy / gib(c))).0;
    let mut seq_rows = Vec::new();
    for name in ["bounce", "p2p", "queues"] {
        let ran = seq
            .iter()
            .find(|s| s.0 == name)
            .map_or(String::new(), |s| s.1.clone());
        let m = spread(&per(name, &|c| c.busy / gib(c)));
        let rate = spread(&per(name, &|c| gib(c) / c.wall.as_secs_f64()));
        println!(
            "  {name:8} {:>28}  {:7.3} GiB/s  ran as {ran}; {:.3}x of bounce",
            fmt(m, 3),
            rate.0,
            m.0 / bounce
        );
        seq_rows.push(json!({"path": name, "ran_as": ran,
            "machine_cpu_s_per_gib": {"median": m.0, "min": m.1, "max": m.2},
            "gib_s": rate.0, "vs_bounce": m.0 / bounce}));
    }
    json_out["queues"] = json!({"controller": bdf, "nsid": a.nsid, "block_size": bs,
        "threads": threads, "queues": queues, "kernel_queues": kq, "kernel_poll_queues": kpoll,
        "rounds": rounds, "random_4k": rows, "sequential_1m": seq_rows});
    Ok(())
}
