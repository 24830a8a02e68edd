//! Per-path counters.

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

/// Counters of one path.
#[derive(Debug, Default)]
pub struct PathStats {
    bytes: AtomicU64,
    transfers: AtomicU64,
    ios: AtomicU64,
    module_ios: AtomicU64,
    retries: AtomicU64,
    storage_ns: AtomicU64,
    copy_ns: AtomicU64,
    total_ns: AtomicU64,
}

/// A copy of a path's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathSnapshot {
    /// Bytes moved by completed transfers.
    pub bytes: u64,
    /// Completed transfers.
    pub transfers: u64,
    /// Storage I/Os issued.
    pub ios: u64,
    /// Of those, the ones the module submitted on its own pages (P2P path,
    /// `BLOCK_IO`: nothing pinned per I/O).
    pub module_ios: u64,
    /// Transfers that failed on this path and were redone on the bounce path.
    pub retries: u64,
    /// Time spent waiting for storage.
    pub storage: Duration,
    /// Time spent copying between host and device memory.
    pub copy: Duration,
    /// Wall time of completed transfers.
    pub total: Duration,
}

impl PathStats {
    pub(crate) fn record_transfer(&self, bytes: u64, took: Duration) {
        self.bytes.fetch_add(bytes, Relaxed);
        self.transfers.fetch_add(1, Relaxed);
        self.total_ns.fetch_add(took.as_nanos() as u64, Relaxed);
    }

    pub(crate) fn record_ios(&self, n: u64) {
        self.ios.fetch_add(n, Relaxed);
    }

    pub(crate) fn record_module_ios(&self, n: u64) {
        self.ios.fetch_add(n, Relaxed);
        self.module_ios.fetch_add(n, Relaxed);
    }

    pub(crate) fn record_retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    pub(crate) fn record_storage(&self, d: Duration) {
        self.storage_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    pub(crate) fn record_copy(&self, d: Duration) {
        self.copy_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> PathSnapshot {
        PathSnapshot {
            bytes: self.bytes.load(Relaxed),
            transfers: self.transfers.load(Relaxed),
            ios: self.ios.load(Relaxed),
            module_ios: self.module_ios.load(Relaxed),
            retries: self.retries.load(Relaxed),
            storage: Duration::from_nanos(self.storage_ns.load(Relaxed)),
            copy: Duration::from_nanos(self.copy_ns.load(Relaxed)),
            total: Duration::from_nanos(self.total_ns.load(Relaxed)),
        }
    }
}

/// Counters of every path.
#[derive(Debug, Default)]
pub struct Stats {
    /// The P2P path.
    pub p2p: PathStats,
    /// The NVMe-command path.
    pub nvme_cmd: PathStats,
    /// The bounce path.
    pub bounce: PathStats,
    /// The queues path.
    pub queues: PathStats,
    /// The direct path into host memory.
    pub direct: PathStats,
    /// Bytes of reads copied out of the page cache, whatever the path
    /// chosen (see [`PageCache`](super::plan::PageCache)).
    pub page_cache: PathStats,
}

impl Stats {
    /// The counters of `path`.
    pub fn of(&self, path: super::TransferPath) -> &PathStats {
        match path {
            super::TransferPath::P2p => &self.p2p,
            super::TransferPath::NvmeCmd => &self.nvme_cmd,
            super::TransferPath::Bounce => &self.bounce,
            super::TransferPath::Queues => &self.queues,
            super::TransferPath::Direct => &self.direct,
        }
    }
}
