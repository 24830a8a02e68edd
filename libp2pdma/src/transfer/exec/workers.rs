//! Worker threads for background transfers: a pool per device.
//!
//! Transfers to different devices never wait in one queue behind each
//! other: each device (a lane, see [`StorageFile::lane`]) gets threads of
//! its own, started with its first job, so a slow or busy device holds up
//! only its own transfers (KvikIO's single pool serialised four drives
//! until it got one per block device, rapidsai/kvikio#850).
//!
//! [`StorageFile::lane`]: crate::transfer::StorageFile::lane

use std::sync::{mpsc, Arc, Mutex};

/// Work for a worker: given the pool's owner (or `None` when it was
/// dropped), it runs and completes its ticket.
pub type Job<T> = Box<dyn FnOnce(Option<&T>) + Send>;

/// Pools of worker threads, one per lane, each started with its lane's
/// first job; jobs are given their owner while it lives.
pub struct Workers<T> {
    lanes: Mutex<Vec<(u64, mpsc::Sender<Job<T>>)>>,
}

impl<T: Send + Sync + 'static> Workers<T> {
    /// Pools whose threads start with their first job.
    pub fn new() -> Self {
        Self {
            lanes: Mutex::new(Vec::new()),
        }
    }

    /// Hands `job` to lane `lane`'s pool, starting it on the lane's first
    /// job; runs it on the calling thread when no worker can be started.
    pub fn queue(&self, owner: &Arc<T>, lane: u64, job: Job<T>) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let tx = match lanes.iter().position(|(l, _)| *l == lane) {
            Some(i) => &lanes[i].1,
            None => match start(owner, lane) {
                Some(tx) => {
                    lanes.push((lane, tx));
                    &lanes[lanes.len() - 1].1
                }
                None => {
                    // No thread at all: run the job here rather than lose
                    // it.
                    drop(lanes);
                    job(Some(owner));
                    return;
                }
            },
        };
        if let Err(mpsc::SendError(job)) = tx.send(job) {
            drop(lanes);
            job(Some(owner));
        }
    }

    /// How many lanes have threads.
    pub fn lanes(&self) -> usize {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Starts lane `lane`'s threads; `None` when not even one could start.
fn start<T: Send + Sync + 'static>(owner: &Arc<T>, lane: u64) -> Option<mpsc::Sender<Job<T>>> {
    let (tx, rx) = mpsc::channel::<Job<T>>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..WORKERS {
        let (rx, weak) = (rx.clone(), Arc::downgrade(owner));
        let spawned = std::thread::Builder::new()
            .name(format!("p2pdma-io-{lane:x}-{i}"))
            .spawn(move || loop {
                let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                    Ok(j) => j,
                    Err(_) => return,
                };
                job(weak.upgrade().as_deref());
            });
        if spawned.is_err() && i == 0 {
            return None;
        }
    }
    Some(tx)
}

/// Worker threads per lane.
const WORKERS: usize = 4;

impl<T: Send + Sync + 'static> Default for Workers<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            atomic::{AtomicUsize, Ordering},
            mpsc::channel,
        },
        time::Duration,
    };

    use super::*;

    /// Jobs of one lane that never end (more of them than a lane has
    /// threads) hold up no other lane's jobs, and their own run in order
    /// as threads free up.
    #[test]
    fn a_lane_full_of_stuck_jobs_holds_up_no_other_lane() {
        let owner = Arc::new(());
        let workers = Workers::<()>::new();
        let (release, gate) = channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let stuck_started = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 * WORKERS {
            let (gate, started) = (gate.clone(), stuck_started.clone());
            workers.queue(
                &owner,
                1,
                Box::new(move |_| {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _ = gate.lock().unwrap().recv();
                }),
            );
        }
        // Lane 2's job runs while every thread of lane 1 is stuck.
        let (done, got) = channel();
        workers.queue(&owner, 2, Box::new(move |_| done.send(()).unwrap()));
        got.recv_timeout(Duration::from_secs(10))
            .expect("lane 2's job waited behind lane 1's");
        assert_eq!(workers.lanes(), 2);
        // Lane 1 runs as many as it has threads, and the rest once those
        // end.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stuck_started.load(Ordering::SeqCst) < WORKERS {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(stuck_started.load(Ordering::SeqCst), WORKERS);
        for _ in 0..2 * WORKERS {
            release.send(()).unwrap();
        }
        while stuck_started.load(Ordering::SeqCst) < 2 * WORKERS {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
