//! The storage machine lost and back, under one process: a remote
//! namespace (NVMe over TCP) is read into accelerator memory, then the
//! host cuts the storage machine's power (asked for with `@@HOST
//! target-stop` on the console). A read then must fail, with an error,
//! within the time the connection's options allow; it must neither hang
//! nor report success, and its error must name every path and its
//! controller's state. Then the host starts the storage machine again
//! (`@@HOST target-start`); once the kernel has reconnected, reads through
//! the same open file and the same engine work again. Every read that
//! succeeds is checked against the rig content the namespace holds.

use std::{
    fs,
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use clap::Args;
use p2pdma::{
    memory::{DeviceMemory, ModuleMemory},
    transfer::{Config, Engine, PageCache, StorageFile},
    MemRange, Module,
};
use p2pdma_tests::{fill_image, first_accelerator};

#[derive(Args)]
pub struct OutageArgs {
    /// The remote namespace (its multipath head).
    #[arg(long)]
    nvme: String,
    /// The subsystem's NQN: its controllers' states are watched.
    #[arg(long)]
    nqn: String,
    /// Where the namespace's bytes lie in the rig content.
    #[arg(long)]
    pattern_offset: u64,
    /// How long a read may take to fail once the storage is gone.
    #[arg(long, default_value_t = 60)]
    fail_within: u64,
}

const LEN: usize = 1 << 20;

/// The states of the subsystem's controllers, e.g. `["live", "live"]`.
fn states(nqn: &str) -> Vec<String> {
    let Ok(rd) = fs::read_dir("/sys/class/nvme") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        if fs::read_to_string(p.join("subsysnqn")).is_ok_and(|s| s.trim() == nqn) {
            if let Ok(s) = fs::read_to_string(p.join("state")) {
                out.push(s.trim().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Waits until `ok` holds of the controllers' states, at most `secs`.
fn wait_states(nqn: &str, secs: u64, ok: impl Fn(&[String]) -> bool) -> Result<Duration, String> {
    let t0 = Instant::now();
    loop {
        let s = states(nqn);
        if ok(&s) {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            return Err(format!("controllers of {nqn} still {s:?} after {secs} s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A read of `LEN` bytes at `offset` on a thread of its own: its result,
/// or `None` when it did not end in `secs`.
fn read_within(
    engine: &Arc<Engine>,
    file: &Arc<StorageFile>,
    mem: &Arc<dyn DeviceMemory>,
    offset: u64,
    secs: u64,
) -> Option<Result<(), String>> {
    let (tx, rx) = mpsc::channel();
    let (engine, file, mem) = (engine.clone(), file.clone(), mem.clone());
    std::thread::spawn(move || {
        let r = MemRange::new(mem.as_ref(), 0, LEN)
            .and_then(|range| engine.read(&file, offset, range))
            .map(|_| ())
            .map_err(|e| e.to_string());
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// The memory holds the rig content of the namespace's bytes at `offset`.
fn check(mem: &dyn DeviceMemory, pattern: u64, offset: u64) -> Result<(), String> {
    let mut got = vec![0u8; LEN];
    mem.read_at(0, &mut got).map_err(|e| e.to_string())?;
    let mut want = vec![0u8; LEN];
    fill_image(pattern + offset, &mut want);
    match (0..LEN).find(|&i| got[i] != want[i]) {
        None => Ok(()),
        Some(i) => Err(format!(
            "byte {} of the namespace is {:#x}, the rig content {:#x}",
            offset + i as u64,
            got[i],
            want[i]
        )),
    }
}

pub fn run(x: &OutageArgs) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let module = Arc::new(Module::open().map_err(err)?);
    let accel = first_accelerator(&module)?;
    let mem: Arc<dyn DeviceMemory> =
        Arc::new(ModuleMemory::alloc(module.clone(), accel.index, LEN as u64, 0).map_err(err)?);
    let config = Config {
        page_cache: PageCache::Direct,
        ..Config::default()
    };
    let engine = Arc::new(Engine::new(config, Some(module)));
    let file = Arc::new(StorageFile::open(&x.nvme).map_err(err)?);
    let read = |offset: u64, secs: u64| read_within(&engine, &file, &mem, offset, secs);

    // Before: a read, checked.
    match read(4 << 20, 120) {
        Some(Ok(())) => check(mem.as_ref(), x.pattern_offset, 4 << 20)?,
        Some(Err(e)) => return Err(format!("the read before the outage failed: {e}")),
        None => return Err("the read before the outage did not end in 120 s".into()),
    }
    println!("read 1 MiB at 4 MiB of {} before the outage: right", x.nvme);

    // The storage machine's power cut; the kernel notices it.
    println!("@@HOST target-stop");
    let noticed = wait_states(&x.nqn, 120, |s| {
        !s.is_empty() && s.iter().all(|s| s != "live")
    })?;
    println!("the controllers left the live state {noticed:?} after the request");
    let t0 = Instant::now();
    match read(8 << 20, x.fail_within) {
        Some(Ok(())) => {
            return Err(format!(
                "a read of {} reported success with its storage machine off",
                x.nvme
            ))
        }
        // The error says why: every path's controller, and its state.
        Some(Err(e)) if e.contains("no path of the multipath namespace is live") => println!(
            "the read with the storage machine off failed after {:?}: {e}",
            t0.elapsed()
        ),
        Some(Err(e)) => {
            return Err(format!(
                "the read with the storage machine off failed without naming its paths: {e}"
            ))
        }
        None => {
            return Err(format!(
                "a read of {} with its storage machine off did not end in {} s",
                x.nvme, x.fail_within
            ))
        }
    }

    // Back: the kernel reconnects, and the same file and engine read again.
    println!("@@HOST target-start");
    // Every path reconnected (a read issued while the first comes back
    // may still fail: the kernel fails I/O fast on a controller whose
    // fail-fast time ran out until it is live again).
    let back = wait_states(&x.nqn, 180, |s| {
        !s.is_empty() && s.iter().all(|s| s == "live")
    })?;
    println!("every controller was live again {back:?} after the request");
    match read(12 << 20, 120) {
        Some(Ok(())) => check(mem.as_ref(), x.pattern_offset, 12 << 20)?,
        Some(Err(e)) => return Err(format!("the read after the storage came back failed: {e}")),
        None => return Err("the read after the storage came back did not end in 120 s".into()),
    }
    println!(
        "read 1 MiB at 12 MiB of {} through the same open file after the outage: right",
        x.nvme
    );
    Ok(())
}
