//! Worker threads for background transfers.

use std::sync::{mpsc, Arc, Mutex};

/// Work for a worker: given the pool's owner (or `None` when it was
/// dropped), it runs and completes its ticket.
pub type Job<T> = Box<dyn FnOnce(Option<&T>) + Send>;

/// A pool of worker threads, started on first use, whose jobs are given
/// their owner while it lives.
pub struct Workers<T> {
    tx: Mutex<Option<mpsc::Sender<Job<T>>>>,
}

impl<T: Send + Sync + 'static> Workers<T> {
    /// A pool whose threads start with its first job.
    pub fn new() -> Self {
        Self {
            tx: Mutex::new(None),
        }
    }

    /// Hands `job` to the worker pool, starting it on first use; runs it
    /// on the calling thread when no worker can be started.
    pub fn queue(&self, owner: &Arc<T>, job: Job<T>) {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if tx.is_none() {
            let (t, rx) = mpsc::channel::<Job<T>>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..WORKERS {
                let (rx, weak) = (rx.clone(), Arc::downgrade(owner));
                let spawned = std::thread::Builder::new()
                    .name(format!("p2pdma-io-{i}"))
                    .spawn(move || loop {
                        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                            Ok(j) => j,
                            Err(_) => return,
                        };
                        job(weak.upgrade().as_deref());
                    });
                if spawned.is_err() && i == 0 {
                    // No thread at all: run the job here rather than lose it.
                    drop(tx);
                    job(Some(owner));
                    return;
                }
            }
            *tx = Some(t);
        }
        let sent = tx.as_ref().map(|t| t.send(job));
        if let Some(Err(mpsc::SendError(job))) = sent {
            drop(tx);
            job(Some(owner));
        }
    }
}

/// Worker threads per pool.
const WORKERS: usize = 4;

impl<T: Send + Sync + 'static> Default for Workers<T> {
    fn default() -> Self {
        Self::new()
    }
}
