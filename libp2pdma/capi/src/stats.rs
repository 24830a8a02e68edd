//! The counters an engine keeps per path.

use std::ffi::c_int;

use p2pdma::transfer::PathStats;

use crate::{
    engine::p2pdma_path,
    error::{status, Failure},
    p2pdma_engine, raw,
};

/// The counters of one path of an engine, since it was created.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_path_stats {
    /// Bytes moved by completed transfers.
    pub bytes: u64,
    /// Completed transfers.
    pub transfers: u64,
    /// Storage I/Os issued.
    pub ios: u64,
    /// Transfers that failed on this path and were redone on the bounce
    /// path.
    pub retries: u64,
    /// Nanoseconds spent waiting for storage.
    pub storage_ns: u64,
    /// Nanoseconds spent copying between host and device memory.
    pub copy_ns: u64,
    /// Wall-clock nanoseconds of completed transfers.
    pub total_ns: u64,
}

impl From<&PathStats> for p2pdma_path_stats {
    fn from(s: &PathStats) -> Self {
        let s = s.snapshot();
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self {
            bytes: s.bytes,
            transfers: s.transfers,
            ios: s.ios,
            retries: s.retries,
            storage_ns: ns(s.storage),
            copy_ns: ns(s.copy),
            total_ns: ns(s.total),
        }
    }
}

/// Copies the counters of `path` (a `P2PDMA_PATH_*` value) of `engine`
/// into `*out`.
///
/// Returns 0, or -EINVAL for NULL arguments or an unknown path.
///
/// # Safety
///
/// `engine` must be NULL or a live engine handle; `out` must be NULL or
/// point to a writable `struct p2pdma_path_stats`.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_stats(
    engine: *const p2pdma_engine,
    path: c_int,
    out: *mut p2pdma_path_stats,
) -> c_int {
    status("p2pdma_stats", || {
        // SAFETY: The caller passes NULL or a live engine handle.
        let e = unsafe { raw::handle(engine, "engine") }?;
        // SAFETY: The caller passes NULL or a writable stats struct.
        let out = unsafe { raw::out_struct(out, "out") }?;
        let stats = e.engine.stats();
        *out = match path {
            p if p == p2pdma_path::P2PDMA_PATH_P2P as c_int => p2pdma_path_stats::from(&stats.p2p),
            p if p == p2pdma_path::P2PDMA_PATH_BOUNCE as c_int => {
                p2pdma_path_stats::from(&stats.bounce)
            }
            p if p == p2pdma_path::P2PDMA_PATH_NVME_CMD as c_int => {
                p2pdma_path_stats::from(&stats.nvme_cmd)
            }
            p if p == p2pdma_path::P2PDMA_PATH_QUEUES as c_int => {
                p2pdma_path_stats::from(&stats.queues)
            }
            p if p == p2pdma_path::P2PDMA_PATH_PAGE_CACHE as c_int => {
                p2pdma_path_stats::from(&stats.page_cache)
            }
            p if p == p2pdma_path::P2PDMA_PATH_DIRECT as c_int => {
                p2pdma_path_stats::from(&stats.direct)
            }
            p => return Err(Failure::invalid(format!("unknown path {p}"))),
        };
        Ok(0)
    })
}
