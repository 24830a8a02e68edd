//! A host-memory stand-in for the CUDA driver, for testing the library's CUDA
//! backend on machines without a GPU.
//!
//! The build compiles `cuda_emu.c` into a `libcuda.so.1` ([`library`]) that
//! exports the driver API functions cudarc loads (`cuInit`, `cuMemAlloc_v2`,
//! `cuMemcpyHtoDAsync_v2`, ...) and those KvikIO looks up at start
//! (`cuCtxCreate_v2`, `cuCtxDestroy_v2`, `cuMemcpyBatchAsync`). Device
//! memory is host memory behind addresses the CPU cannot dereference,
//! streams are worker threads that run each operation after a delay, and
//! the emulator is strict where the driver is (a current context per
//! thread, ranges inside one allocation, asynchronous work that needs
//! synchronizing): the header of `cuda_emu.c` lists what it checks.
//!
//! A test points the code under test at [`library`] (or puts
//! [`library_dir`] first on `LD_LIBRARY_PATH`), configures the emulated
//! machine through the `CUEMU_*` environment variables, read by the first
//! `cuInit` of the process, and reads the emulator's counters with
//! [`StatsFns`] from the symbols [`GET_STATS`] and [`RESET_STATS`] of the
//! library it loaded. This crate loads nothing itself.

use std::{
    ffi::{c_int, CStr},
    fmt,
    path::Path,
};

/// The emulator library, `libcuda.so.1`, as built for this crate.
pub fn library() -> &'static Path {
    Path::new(concat!(env!("OUT_DIR"), "/libcuda.so.1"))
}

/// The directory of [`library`]; it also holds a `libcuda.so` link, the
/// first name cudarc asks the loader for.
pub fn library_dir() -> &'static Path {
    Path::new(env!("OUT_DIR"))
}

/// Number of devices, 0 to 8 (default 1; with 0, `cuInit` fails with
/// `CUDA_ERROR_NO_DEVICE`).
pub const ENV_DEVICES: &str = "CUEMU_DEVICES";
/// Memory per device in MiB (default 256).
pub const ENV_MEM_MIB: &str = "CUEMU_MEM_MIB";
/// Comma-separated PCI addresses `dddd:bb:dd.f`, one per device (default
/// `0000:e1:00.0`, `0000:e2:00.0`, ...).
pub const ENV_PCI: &str = "CUEMU_PCI";
/// Microseconds before each queued operation runs (default 200).
pub const ENV_DELAY_US: &str = "CUEMU_DELAY_US";
/// `0`: no device reaches another's memory (`cuDeviceCanAccessPeer` says
/// 0, `cuCtxEnablePeerAccess` fails); default `1`, every pair can.
pub const ENV_PEER: &str = "CUEMU_PEER";
/// The udmabuf device dma-buf export uses (default `/dev/udmabuf`); where
/// it cannot be opened, export is `CUDA_ERROR_NOT_SUPPORTED`.
pub const ENV_UDMABUF: &str = "CUEMU_UDMABUF";

/// The symbol of `int cuemuGetStats(struct cuemu_stats *out)`.
pub const GET_STATS: &CStr = c"cuemuGetStats";
/// The symbol of `void cuemuResetStats(void)`.
pub const RESET_STATS: &CStr = c"cuemuResetStats";

/// `cuemuGetStats`: fills `*out` and returns 0 (`CUDA_SUCCESS`) when
/// `out.size` is the library's size of the struct; else writes only
/// `out.size` (the library's) and returns 1 (`CUDA_ERROR_INVALID_VALUE`).
pub type GetStatsFn = unsafe extern "C" fn(out: *mut Stats) -> c_int;
/// `cuemuResetStats`: zeroes the counters, keeps the gauges.
pub type ResetStatsFn = unsafe extern "C" fn();

/// Copies in one direction (`struct cuemu_copy_stats`). Zero-byte copies
/// are not counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Synchronous calls (`cuMemcpyHtoD_v2`, `cuMemcpy`, ...).
    pub sync_calls: u64,
    /// Bytes of the synchronous calls.
    pub sync_bytes: u64,
    /// Async calls whose host side is page-locked, or device to device.
    pub async_calls: u64,
    /// Bytes of those.
    pub async_bytes: u64,
    /// Async calls whose host side is pageable: the driver made them
    /// synchronous.
    pub pageable_calls: u64,
    /// Bytes of those.
    pub pageable_bytes: u64,
}

/// The emulator's counters, `struct cuemu_stats` of `cuda_emu.c`: 64-bit
/// fields in this order, 264 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `sizeof(struct cuemu_stats)`, as the library was built.
    pub size: u64,
    /// Host to device copies.
    pub htod: CopyStats,
    /// Device to host copies.
    pub dtoh: CopyStats,
    /// Device to device copies.
    pub dtod: CopyStats,
    /// Successful `cuMemHostAlloc` and `cuMemAllocHost_v2` calls.
    pub host_alloc: u64,
    /// Successful `cuMemHostRegister_v2` calls.
    pub host_register: u64,
    /// Successful `cuMemHostUnregister` calls.
    pub host_unregister: u64,
    /// Device allocations alive now (a gauge, kept by a reset).
    pub live_device_allocs: u64,
    /// Registered host ranges alive now (a gauge, kept by a reset).
    pub live_registered: u64,
    /// Successful `cuMemGetHandleForAddressRange` calls.
    pub dmabuf_exports: u64,
    /// Calls refused because the calling thread had no current context
    /// (or a destroyed one).
    pub no_context: u64,
    /// Copies between two devices by `cuMemcpyPeer(Async)`; `pageable`
    /// counts those made while the destination's context had not enabled
    /// access to the source's device (the driver stages them).
    pub peer: CopyStats,
    /// Successful `cuCtxEnablePeerAccess` calls.
    pub peer_enables: u64,
}

const _: () = assert!(std::mem::size_of::<CopyStats>() == 48);
const _: () = assert!(std::mem::size_of::<Stats>() == 264);
const _: () = assert!(std::mem::offset_of!(Stats, htod) == 8);
const _: () = assert!(std::mem::offset_of!(Stats, host_alloc) == 152);
const _: () = assert!(std::mem::offset_of!(Stats, no_context) == 200);
const _: () = assert!(std::mem::offset_of!(Stats, peer_enables) == 256);

impl CopyStats {
    fn since(&self, earlier: &Self) -> Self {
        Self {
            sync_calls: self.sync_calls.wrapping_sub(earlier.sync_calls),
            sync_bytes: self.sync_bytes.wrapping_sub(earlier.sync_bytes),
            async_calls: self.async_calls.wrapping_sub(earlier.async_calls),
            async_bytes: self.async_bytes.wrapping_sub(earlier.async_bytes),
            pageable_calls: self.pageable_calls.wrapping_sub(earlier.pageable_calls),
            pageable_bytes: self.pageable_bytes.wrapping_sub(earlier.pageable_bytes),
        }
    }

    /// Calls of every kind.
    pub fn calls(&self) -> u64 {
        self.sync_calls + self.async_calls + self.pageable_calls
    }

    /// Bytes of every kind.
    pub fn bytes(&self) -> u64 {
        self.sync_bytes + self.async_bytes + self.pageable_bytes
    }
}

impl Stats {
    /// The counters' growth since `earlier`; the gauges as they are now.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            size: self.size,
            htod: self.htod.since(&earlier.htod),
            dtoh: self.dtoh.since(&earlier.dtoh),
            dtod: self.dtod.since(&earlier.dtod),
            host_alloc: self.host_alloc.wrapping_sub(earlier.host_alloc),
            host_register: self.host_register.wrapping_sub(earlier.host_register),
            host_unregister: self.host_unregister.wrapping_sub(earlier.host_unregister),
            live_device_allocs: self.live_device_allocs,
            live_registered: self.live_registered,
            dmabuf_exports: self.dmabuf_exports.wrapping_sub(earlier.dmabuf_exports),
            no_context: self.no_context.wrapping_sub(earlier.no_context),
            peer: self.peer.since(&earlier.peer),
            peer_enables: self.peer_enables.wrapping_sub(earlier.peer_enables),
        }
    }
}

/// Why the counters could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsError {
    /// `cuemuGetStats` returned this status.
    Status(c_int),
    /// The library's `struct cuemu_stats` has this size, not [`Stats`]'s:
    /// it was built from another `cuda_emu.c`.
    Layout(u64),
}

impl fmt::Display for StatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(s) => write!(f, "cuemuGetStats returned status {s}"),
            Self::Layout(n) => write!(
                f,
                "the emulator's statistics are {n} bytes, {} expected",
                std::mem::size_of::<Stats>()
            ),
        }
    }
}

impl std::error::Error for StatsError {}

/// The statistics functions of a loaded emulator library.
#[derive(Clone, Copy, Debug)]
pub struct StatsFns {
    get: GetStatsFn,
    reset: ResetStatsFn,
}

impl StatsFns {
    /// Wraps the functions the caller looked up.
    ///
    /// # Safety
    /// `get` and `reset` are the [`GET_STATS`] and [`RESET_STATS`] symbols
    /// of an emulator library that stays loaded while the value is used
    /// (the library is built with `-z nodelete`: once loaded, it stays).
    pub unsafe fn new(get: GetStatsFn, reset: ResetStatsFn) -> Self {
        Self { get, reset }
    }

    /// The counters now.
    pub fn read(&self) -> Result<Stats, StatsError> {
        let mine = std::mem::size_of::<Stats>() as u64;
        let mut out = Stats {
            size: mine,
            ..Stats::default()
        };
        // SAFETY: `get` is cuemuGetStats (`new`'s contract), which writes
        // one struct cuemu_stats when `size` is its size, else only `size`,
        // to a valid pointer.
        let status = unsafe { (self.get)(&mut out) };
        if out.size != mine {
            return Err(StatsError::Layout(out.size));
        }
        if status != 0 {
            return Err(StatsError::Status(status));
        }
        Ok(out)
    }

    /// Zeroes the counters (not the gauges).
    pub fn reset(&self) {
        // SAFETY: `reset` is cuemuResetStats (`new`'s contract): no arguments.
        unsafe { (self.reset)() }
    }
}
