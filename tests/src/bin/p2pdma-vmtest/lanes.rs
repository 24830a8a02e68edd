//! Background transfers on two devices: a slow one (the rig's throttled
//! namespace) and a fast one. The fast device's read must not wait behind
//! the slow one's queue: it completes before half of the slow reads do,
//! though they were submitted first and outnumber a pool's threads (one
//! queue for both would run it only after five of them). Its ticket is
//! polled, not waited for: a waiter would run the transfer itself. Every
//! byte is checked against a buffered read of the same range.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Args;
use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    transfer::{Config, Direction, Engine, PageCache, Request, StorageFile},
};

#[derive(Args)]
pub struct LanesArgs {
    /// The slow device (the rig's namespace throttled to 1 MiB/s).
    #[arg(long)]
    slow: String,
    /// The fast device.
    #[arg(long)]
    fast: String,
}

/// Slow reads submitted first: twice as many as one device's threads.
const SLOW_READS: usize = 8;
/// Each slow read: at 1 MiB/s, about a quarter of a second alone.
const SLOW_LEN: usize = 256 << 10;
const FAST_LEN: usize = 64 << 10;
const FAST_OFFSET: u64 = 3 << 20;

/// A buffered read of `len` bytes at `offset` of `path`: the reference.
fn buffered(path: &str, offset: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; len];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut v, offset))
        .map_err(|e| format!("{path}: {e}"))?;
    Ok(v)
}

pub fn run(x: &LanesArgs) -> Result<(), String> {
    let err = |e: p2pdma::Error| e.to_string();
    let config = Config {
        page_cache: PageCache::Direct,
        ..Config::default()
    };
    let engine = Engine::new(config, None);
    let slow = Arc::new(StorageFile::open(&x.slow).map_err(err)?);
    let fast = Arc::new(StorageFile::open(&x.fast).map_err(err)?);
    if slow.lane() == fast.lane() {
        return Err(format!("{} and {} share a lane", x.slow, x.fast));
    }
    let slow_mem: Arc<dyn DeviceMemory> =
        Arc::new(HostMemory::new(SLOW_READS * SLOW_LEN).map_err(err)?);
    let fast_mem: Arc<dyn DeviceMemory> = Arc::new(HostMemory::new(FAST_LEN).map_err(err)?);
    slow_mem
        .write_at(0, &vec![0xa5; SLOW_READS * SLOW_LEN])
        .map_err(err)?;
    let t0 = Instant::now();
    let slow_tickets: Vec<_> = (0..SLOW_READS)
        .map(|i| {
            engine.submit(Request {
                dir: Direction::Read,
                file: slow.clone(),
                file_offset: (i * SLOW_LEN) as u64,
                mem: slow_mem.clone(),
                mem_offset: i * SLOW_LEN,
                len: SLOW_LEN,
            })
        })
        .collect();
    let fast_ticket = engine.submit(Request {
        dir: Direction::Read,
        file: fast.clone(),
        file_offset: FAST_OFFSET,
        mem: fast_mem.clone(),
        mem_offset: 0,
        len: FAST_LEN,
    });
    // Polled: a thread waiting for the ticket would run a transfer no
    // worker has started itself, whatever the queue.
    while !fast_ticket.is_done() {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err(format!("the read of {} did not end in 60 s", x.fast));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let fast_done = t0.elapsed();
    let slow_done = slow_tickets.iter().filter(|t| t.is_done()).count();
    fast_ticket.wait().map_err(err)?;
    for t in &slow_tickets {
        t.wait().map_err(err)?;
    }
    let all_done = t0.elapsed();
    let mut got = vec![0u8; FAST_LEN];
    fast_mem.read_at(0, &mut got).map_err(err)?;
    if got != buffered(&x.fast, FAST_OFFSET, FAST_LEN)? {
        return Err(format!(
            "the read of {} differs from a buffered read",
            x.fast
        ));
    }
    let mut got = vec![0u8; SLOW_READS * SLOW_LEN];
    slow_mem.read_at(0, &mut got).map_err(err)?;
    if got != buffered(&x.slow, 0, SLOW_READS * SLOW_LEN)? {
        return Err(format!(
            "the reads of {} differ from a buffered read",
            x.slow
        ));
    }
    println!(
        "{} reads of {} KiB on {} and one of {} KiB on {} submitted after them: the fast one done after {:?}, with {slow_done} of the slow ones done; all done after {:?} (TCG timings)",
        SLOW_READS,
        SLOW_LEN >> 10,
        x.slow,
        FAST_LEN >> 10,
        x.fast,
        fast_done,
        all_done
    );
    // The throttle lets a burst through at once, so one or two slow reads
    // may end first.
    if slow_done >= SLOW_READS / 2 {
        return Err(format!(
            "the read of {} waited behind {slow_done} read(s) of {}: one queue for both devices",
            x.fast, x.slow
        ));
    }
    if all_done < Duration::from_millis(500) {
        return Err(format!(
            "{} was not slow ({all_done:?} for {} KiB): the check proves nothing",
            x.slow,
            (SLOW_READS * SLOW_LEN) >> 10
        ));
    }
    Ok(())
}
