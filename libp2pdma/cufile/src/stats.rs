//! cuFile's statistics (`cuFileSetStatsLevel`, `cuFileStatsStart`,
//! `cuFileGetStatsL1`...): counters of the calls this library answered and
//! of the bytes its engine moved for them, with the path each transfer
//! took (P2P or through host memory) from the engine's own report.
//!
//! Level 0 (the default, as cuFile's `profile.cufile_stats`) counts
//! nothing; 1 counts calls and bytes, 2 adds the size histograms, 3 the
//! per-GPU counters. Counting runs while the level is above 0 and
//! `cuFileStatsStop` has not stopped it (`cuFileStatsStart` resumes).

use std::{
    sync::{
        atomic::{AtomicBool, AtomicI32, Ordering::Relaxed},
        Mutex,
    },
    time::{Duration, Instant},
};

use p2pdma::{memory::MemoryKind, TransferPath};

use crate::{
    abi::{
        CUfileError, CUfileOpCounter, CUfileStatsLevel1, CUfileStatsLevel2, CUfileStatsLevel3,
        HIST_BUCKETS, MAX_GPUS,
    },
    driver,
    errors::{guard, Fail, Res},
};

static LEVEL: AtomicI32 = AtomicI32::new(0);
static RUNNING: AtomicBool = AtomicBool::new(true);
static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The counters since the last reset.
struct State {
    since: Instant,
    l3: CUfileStatsLevel3,
}

impl State {
    fn new() -> Self {
        Self {
            since: Instant::now(),
            l3: CUfileStatsLevel3::default(),
        }
    }
}

/// The statistics level.
pub fn level() -> i32 {
    LEVEL.load(Relaxed)
}

/// Sets the level (0 to 3, checked by the caller).
pub fn set_level(level: i32) {
    LEVEL.store(level, Relaxed);
}

/// Whether calls are being counted now.
fn counting() -> bool {
    level() > 0 && RUNNING.load(Relaxed)
}

fn with(f: impl FnOnce(&mut State)) {
    if !counting() {
        return;
    }
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(State::new));
}

fn bump(c: &mut CUfileOpCounter, ok: bool) {
    if ok {
        c.ok += 1;
    } else {
        c.err += 1;
    }
}

/// The histogram bucket of a transfer of `bytes`: `[2^i, 2^(i+1))` KB.
pub fn bucket(bytes: usize) -> usize {
    let kb = (bytes >> 10).max(1);
    (kb.ilog2() as usize).min(HIST_BUCKETS - 1)
}

/// What a transfer moved and how: the engine's path and the GPU of the
/// memory, if it is a GPU's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    /// Bytes.
    pub bytes: usize,
    /// The engine's path; `None` when nothing moved.
    pub path: Option<TransferPath>,
    /// The CUDA device ordinal of the memory.
    pub gpu: Option<i32>,
}

impl Moved {
    /// Nothing moved.
    pub const NONE: Self = Self {
        bytes: 0,
        path: None,
        gpu: None,
    };

    /// Adds `other` to `self` (a vector's parts).
    pub fn add(&mut self, other: Moved) {
        self.bytes += other.bytes;
        self.path = other.path.or(self.path);
        self.gpu = other.gpu.or(self.gpu);
    }
}

/// The GPU of memory of `kind`.
pub fn gpu_of(kind: MemoryKind) -> Option<i32> {
    match kind {
        MemoryKind::Cuda { ordinal, .. } => Some(ordinal),
        _ => None,
    }
}

/// Counts one read (`write` false) or write of `asked` bytes that took
/// `took`.
pub fn io(write: bool, asked: usize, result: &Res<Moved>, took: Duration) {
    with(|s| {
        let us = took.as_micros() as u64;
        let l2 = &mut s.l3.detailed;
        let b = &mut l2.basic;
        let ok = result.is_ok();
        let bytes = result.as_ref().map_or(0, |m| m.bytes as u64);
        if write {
            bump(&mut b.write_ops, ok);
            b.write_bytes += bytes;
            b.write_lat_sum_us += us;
            l2.write_size_kb_hist[bucket(asked)] += 1;
        } else {
            bump(&mut b.read_ops, ok);
            b.read_bytes += bytes;
            b.read_lat_sum_us += us;
            l2.read_size_kb_hist[bucket(asked)] += 1;
        }
        let Ok(m) = result else { return };
        let Some(g) = m
            .gpu
            .and_then(|g| usize::try_from(g).ok())
            .filter(|&g| g < MAX_GPUS)
        else {
            return;
        };
        let p = &mut s.l3.per_gpu_stats[g];
        // Nothing moved (a read at the end of the file) took no path.
        let direct = matches!(
            m.path,
            Some(TransferPath::P2p | TransferPath::NvmeCmd | TransferPath::Queues)
        );
        let bounce = matches!(m.path, Some(TransferPath::Bounce | TransferPath::Direct));
        if write {
            p.writes_bytes += bytes;
            p.write_duration_us += us;
            p.n_total_writes += 1;
            p.n_p2p_writes += u64::from(direct);
            p.n_posix_writes += u64::from(bounce);
        } else {
            p.read_bytes += bytes;
            p.read_duration_us += us;
            p.n_total_reads += 1;
            p.n_p2p_reads += u64::from(direct);
            p.n_posix_reads += u64::from(bounce);
        }
    });
}

/// Counts a failed transfer on a GPU's memory.
pub fn io_error_on(write: bool, gpu: Option<i32>) {
    let Some(g) = gpu
        .and_then(|g| usize::try_from(g).ok())
        .filter(|&g| g < MAX_GPUS)
    else {
        return;
    };
    with(|s| {
        let p = &mut s.l3.per_gpu_stats[g];
        if write {
            p.n_writes_err += 1;
        } else {
            p.n_reads_err += 1;
        }
    });
}

/// Calls that are counted as successes and failures.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    /// `cuFileHandleRegister`.
    HandleRegister,
    /// `cuFileHandleDeregister`.
    HandleDeregister,
    /// `cuFileBufRegister`.
    BufRegister,
    /// `cuFileBufDeregister`.
    BufDeregister,
    /// `cuFileBatchIOSetUp`.
    BatchSetup,
    /// `cuFileBatchIOCancel`.
    BatchCancel,
    /// `cuFileBatchIODestroy`.
    BatchDestroy,
}

/// Counts one call.
pub fn call(c: Call, ok: bool) {
    with(|s| {
        let b = &mut s.l3.detailed.basic;
        let counter = match c {
            Call::HandleRegister => &mut b.hdl_register_ops,
            Call::HandleDeregister => &mut b.hdl_deregister_ops,
            Call::BufRegister => &mut b.buf_register_ops,
            Call::BufDeregister => &mut b.buf_deregister_ops,
            Call::BatchSetup => &mut b.batch_setup_ops,
            Call::BatchCancel => &mut b.batch_cancel_ops,
            Call::BatchDestroy => &mut b.batch_destroy_ops,
        };
        bump(counter, ok);
    });
}

/// Counts a registration of `len` bytes of a GPU's memory.
pub fn gpu_buffer(gpu: Option<i32>, register: bool, ok: bool, len: usize) {
    let Some(g) = gpu
        .and_then(|g| usize::try_from(g).ok())
        .filter(|&g| g < MAX_GPUS)
    else {
        return;
    };
    with(|s| {
        let p = &mut s.l3.per_gpu_stats[g];
        if !register {
            p.n_mmap_free += 1;
            return;
        }
        p.n_mmap += 1;
        if ok {
            p.n_mmap_ok += 1;
            p.reg_bytes += len as u64;
        } else {
            p.n_mmap_err += 1;
        }
    });
}

/// Counts a batch submission of `entries` entries (read and write bytes
/// asked for), or its failure.
pub fn batch_submit(ok: bool, entries: u64, read: u64, written: u64, took: Duration) {
    with(|s| {
        let b = &mut s.l3.detailed.basic;
        bump(&mut b.batch_submit_ops, ok);
        bump(&mut b.batch_total_submit_ops, ok);
        b.batch_submit_lat_sum_us += took.as_micros() as u64;
        if ok {
            b.batch_enqueued_ops.ok += entries;
            b.last_batch_read_bytes = read;
            b.last_batch_write_bytes = written;
        }
    });
}

/// Counts the end of one batch entry, `ok` with `bytes` moved or failed.
pub fn batch_entry(write: bool, ok: bool, bytes: u64, took: Duration) {
    with(|s| {
        let b = &mut s.l3.detailed.basic;
        bump(&mut b.batch_complete_ops, ok);
        bump(&mut b.batch_processed_ops, ok);
        b.batch_completion_lat_sum_us += took.as_micros() as u64;
        if write {
            b.batch_write_bytes += bytes;
        } else {
            b.batch_read_bytes += bytes;
        }
    });
}

/// The counters with the derived values (rates and averages) filled in.
fn snapshot() -> CUfileStatsLevel3 {
    let g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let Some(s) = g.as_ref() else {
        return CUfileStatsLevel3::default();
    };
    let mut l3 = s.l3;
    let secs = s.since.elapsed().as_secs_f64().max(1e-6);
    let per = |n: u64, us: u64| n.saturating_mul(1_000_000).checked_div(us).unwrap_or(0);
    let avg = |sum: u64, n: u64| sum.checked_div(n).unwrap_or(0);
    let b = &mut l3.detailed.basic;
    let (r, w) = (
        b.read_ops.ok + b.read_ops.err,
        b.write_ops.ok + b.write_ops.err,
    );
    b.read_bw_bytes_per_sec = per(b.read_bytes, b.read_lat_sum_us);
    b.write_bw_bytes_per_sec = per(b.write_bytes, b.write_lat_sum_us);
    b.read_lat_avg_us = avg(b.read_lat_sum_us, r);
    b.write_lat_avg_us = avg(b.write_lat_sum_us, w);
    b.read_ops_per_sec = (r as f64 / secs) as u64;
    b.write_ops_per_sec = (w as f64 / secs) as u64;
    let submits = b.batch_submit_ops.ok + b.batch_submit_ops.err;
    let completes = b.batch_complete_ops.ok + b.batch_complete_ops.err;
    b.batch_submit_lat_avg_us = avg(b.batch_submit_lat_sum_us, submits);
    b.batch_completion_lat_avg_us = avg(b.batch_completion_lat_sum_us, completes);
    b.batch_submit_ops_per_sec = (submits as f64 / secs) as u64;
    b.batch_complete_ops_per_sec = (completes as f64 / secs) as u64;
    b.batch_read_bw_bytes = per(b.batch_read_bytes, b.batch_completion_lat_sum_us);
    b.batch_write_bw_bytes = per(b.batch_write_bytes, b.batch_completion_lat_sum_us);
    let wall = (secs * 1e6) as u64;
    for p in l3.per_gpu_stats.iter_mut() {
        p.read_bw_bytes_per_sec = per(p.read_bytes, p.read_duration_us);
        p.write_bw_bytes_per_sec = per(p.writes_bytes, p.write_duration_us);
        p.read_utilization = (p.read_duration_us * 100)
            .checked_div(wall)
            .unwrap_or(0)
            .min(100);
        p.write_utilization = (p.write_duration_us * 100)
            .checked_div(wall)
            .unwrap_or(0)
            .min(100);
    }
    l3.num_gpus = gpus().min(MAX_GPUS) as u32;
    l3
}

/// How many GPUs the CUDA driver sees (0 without one).
fn gpus() -> usize {
    if !driver::cuda() {
        return 0;
    }
    p2pdma::sys::cuda::device_count().map_or(0, |n| n.max(0) as usize)
}

/// Writes `value` to `out` if the level is at least `need`.
///
/// # Safety
/// `out` is NULL or writable for a `T`.
unsafe fn get<T>(out: *mut T, need: i32, value: impl FnOnce(CUfileStatsLevel3) -> T) -> Res<()> {
    driver::engine()?;
    if out.is_null() || level() < need {
        return Err(Fail::INVALID);
    }
    let v = value(snapshot());
    // SAFETY: Non-null, writable by the caller's contract.
    unsafe { out.write_unaligned(v) };
    Ok(())
}

/// Sets the statistics level, 0 to 3 (`CU_FILE_INVALID_VALUE` otherwise).
#[no_mangle]
pub extern "C" fn cuFileSetStatsLevel(level: i32) -> CUfileError {
    guard(|| {
        if !(0..=3).contains(&level) {
            return Err(Fail::INVALID);
        }
        set_level(level);
        Ok(())
    })
}

/// The statistics level.
///
/// # Safety
/// `level` is NULL or writable for an `int`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsLevel(level: *mut i32) -> CUfileError {
    guard(|| {
        if level.is_null() {
            return Err(Fail::INVALID);
        }
        // SAFETY: Non-null, writable by the caller's contract.
        unsafe { level.write_unaligned(self::level()) };
        Ok(())
    })
}

/// Resumes counting (it runs from the start unless stopped).
#[no_mangle]
pub extern "C" fn cuFileStatsStart() -> CUfileError {
    guard(|| {
        driver::engine()?;
        RUNNING.store(true, Relaxed);
        Ok(())
    })
}

/// Stops counting; the counters keep their values.
#[no_mangle]
pub extern "C" fn cuFileStatsStop() -> CUfileError {
    guard(|| {
        driver::engine()?;
        RUNNING.store(false, Relaxed);
        Ok(())
    })
}

/// Sets every counter to 0, and the time the rates are over to now.
#[no_mangle]
pub extern "C" fn cuFileStatsReset() -> CUfileError {
    guard(|| {
        driver::engine()?;
        *STATE.lock().unwrap_or_else(|p| p.into_inner()) = Some(State::new());
        Ok(())
    })
}

/// The level 1 counters (level 1 or more).
///
/// # Safety
/// `stats` is NULL or writable for a `CUfileStatsLevel1_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsL1(stats: *mut CUfileStatsLevel1) -> CUfileError {
    // SAFETY: The caller's.
    guard(|| unsafe { get(stats, 1, |s| s.detailed.basic) })
}

/// The level 2 counters (level 2 or more).
///
/// # Safety
/// `stats` is NULL or writable for a `CUfileStatsLevel2_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsL2(stats: *mut CUfileStatsLevel2) -> CUfileError {
    // SAFETY: The caller's.
    guard(|| unsafe { get(stats, 2, |s| s.detailed) })
}

/// The level 3 counters (level 3).
///
/// # Safety
/// `stats` is NULL or writable for a `CUfileStatsLevel3_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetStatsL3(stats: *mut CUfileStatsLevel3) -> CUfileError {
    // SAFETY: The caller's.
    guard(|| unsafe { get(stats, 3, |s| s) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_in_power_of_two_kb_buckets() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2047), 0);
        assert_eq!(bucket(2048), 1);
        assert_eq!(bucket(4 << 20), 12);
        assert_eq!(bucket(usize::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn unused_per_gpu_fields_stay_zero() {
        let p = crate::abi::CUfilePerGpuStats::default();
        assert_eq!(p.n_nvfs_reads + p.n_dr_reads + p.n_sparse_regions, 0);
    }
}
