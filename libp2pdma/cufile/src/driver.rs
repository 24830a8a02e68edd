//! The "driver": one transfer engine for the process, started on first
//! use, the open count `cuFileDriverOpen` and `cuFileDriverClose_v2` keep,
//! and the settings `cuFileDriverGetProperties` reports.
//!
//! cuFile starts implicitly on the first `cuFileHandleRegister`,
//! `cuFileBufRegister`, `cuFileRead` or `cuFileWrite`, and KvikIO relies on
//! that: it never opens the driver. So the engine starts on first use,
//! whichever call it is, and stays for the life of the process. The open
//! count is bookkeeping for callers that pair opens with closes: closing
//! to zero tears nothing down, because another user in the same process
//! (KvikIO beside DALI, say) may still hold handles and buffers.

use std::{
    ffi::{c_int, c_long},
    sync::{Arc, Mutex, OnceLock},
};

use libc::size_t;
use p2pdma::{sys::cuda, Config, Engine, Module};

use crate::{
    abi::{dcontrol, dstatus, feature, op, CUfileDrvProps, CUfileError, NvfsProps},
    errors::{guard, guard_value, Fail, Res},
    params::{self, flag, size, Params},
};

/// `cuFileGetVersion`: the API of cuFile 1.20 (CUDA 13), every call of
/// whose header this library has. KvikIO wants 1060 for batches and 1070
/// for streams.
pub const VERSION: c_int = 1200;

/// The version `cuFileDriverGetProperties` gives as the nvfs interface's:
/// libp2pdma's interface, 1.0. KvikIO takes 0.0 as "no GPUDirect Storage".
const NVFS_VERSION: (u32, u32) = (1, 0);

/// Most entries of one batch (`max_batch_io_size`): the
/// `CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE` parameter, 128 by default as
/// NVIDIA's `io_batchsize`.
pub fn max_batch() -> u32 {
    params::lock().sizes[size::IO_BATCHSIZE] as u32
}

static OPENS: Mutex<c_long> = Mutex::new(0);
static ENGINE: OnceLock<std::result::Result<Engine, String>> = OnceLock::new();
static CUDA: OnceLock<bool> = OnceLock::new();

/// The process's engine, started on first use: the configuration from the
/// environment (`P2PDMA_*`, `/etc/p2pdma.conf`) with the cuFile
/// parameters set before it over it, and the p2pdma module where it is
/// loaded. Starting is the driver's open for the parameters: they are
/// fixed from then on.
pub fn engine() -> Res<&'static Engine> {
    let e = ENGINE.get_or_init(|| {
        let mut p = params::lock();
        let mut config = Config::from_env().map_err(|e| e.to_string())?;
        p.configure(&mut config);
        p.open();
        let module = Module::open().ok().map(Arc::new);
        params::log(
            &p,
            "INFO",
            &format!(
                "driver open: path {} chunk {} depth {} copy threads {} module {}",
                config.path.as_str(),
                opt(config.chunk),
                opt(config.depth),
                opt(config.copy_threads),
                if module.is_some() { "loaded" } else { "absent" },
            ),
        );
        Ok(Engine::new(config, module))
    });
    e.as_ref().map_err(|why| {
        static SAID: OnceLock<()> = OnceLock::new();
        SAID.get_or_init(|| eprintln!("libcufile (p2pdma): cannot start the engine: {why}"));
        Fail::cu(op::DRIVER_NOT_INITIALIZED)
    })
}

/// A setting for the log: its value, or "auto".
fn opt(v: Option<usize>) -> String {
    v.map_or_else(|| "auto".into(), |v| v.to_string())
}

/// Whether a CUDA driver is loaded and initialized in this process (asked
/// once: without one, every pointer is host memory).
pub fn cuda() -> bool {
    *CUDA.get_or_init(|| cuda::library_present() && cuda::driver().is_ok())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The properties for the current parameters.
fn properties(p: &Params) -> CUfileDrvProps {
    let bit = |b: u32| 1u32 << b;
    let kb32 = |i: usize| p.sizes[i].min(u32::MAX as usize) as u32;
    let direct = !p.flags[flag::FORCE_COMPAT_MODE];
    CUfileDrvProps {
        nvfs: NvfsProps {
            major_version: NVFS_VERSION.0,
            minor_version: NVFS_VERSION.1,
            poll_thresh_size: p.sizes[size::POLLTHRESHOLD_SIZE_KB],
            max_direct_io_size: p.sizes[size::MAX_DIRECT_IO_SIZE_KB],
            dstatusflags: bit(dstatus::NVME),
            // Transfers the P2P path cannot serve go through host memory,
            // which is what cuFile calls compatibility mode.
            dcontrolflags: if p.flags[flag::ALLOW_COMPAT_MODE] {
                bit(dcontrol::ALLOW_COMPAT_MODE)
            } else {
                0
            } | if p.flags[flag::USE_POLL_MODE] {
                bit(dcontrol::USE_POLL_MODE)
            } else {
                0
            },
        },
        fflags: bit(feature::BATCH_IO)
            | bit(feature::STREAMS)
            | if direct && p.flags[flag::USE_PCIP2PDMA] {
                bit(feature::P2P)
            } else {
                0
            },
        max_device_cache_size: kb32(size::MAX_DEVICE_CACHE_SIZE_KB),
        per_buffer_cache_size: kb32(size::PER_BUFFER_CACHE_SIZE_KB),
        max_device_pinned_mem_size: kb32(size::MAX_DEVICE_PINNED_MEM_SIZE_KB),
        max_batch_io_size: p.sizes[size::IO_BATCHSIZE] as u32,
        max_batch_io_timeout_msecs: kb32(size::BATCH_IO_TIMEOUT_MS),
    }
}

/// A size in KB a setter accepts: not zero, a multiple of 4 KB, and
/// within `max`.
fn size_kb(kb: usize, max: usize) -> Res<usize> {
    if kb == 0 || !kb.is_multiple_of(4) || kb > max {
        return Err(Fail::cu(op::DRIVER_UNSUPPORTED_LIMIT));
    }
    Ok(kb)
}

/// Opens the driver (starting the engine if it has not started), and
/// counts the open. Opening an open driver succeeds.
#[no_mangle]
pub extern "C" fn cuFileDriverOpen() -> CUfileError {
    guard(|| {
        engine()?;
        *lock(&OPENS) += 1;
        Ok(())
    })
}

/// Ends one `cuFileDriverOpen` (what `cuFileDriverClose` means in the
/// header). `CU_FILE_DRIVER_NOT_INITIALIZED` when it is not open.
#[no_mangle]
pub extern "C" fn cuFileDriverClose_v2() -> CUfileError {
    guard(|| {
        let mut n = lock(&OPENS);
        if *n == 0 {
            return Err(Fail::cu(op::DRIVER_NOT_INITIALIZED));
        }
        *n -= 1;
        Ok(())
    })
}

/// The legacy close, for callers that look the plain name up: it ends
/// every open at once, as NVIDIA's does. Registrations stay valid.
#[no_mangle]
pub extern "C" fn cuFileDriverClose() -> CUfileError {
    guard(|| {
        let mut n = lock(&OPENS);
        if *n == 0 {
            return Err(Fail::cu(op::DRIVER_NOT_INITIALIZED));
        }
        *n = 0;
        Ok(())
    })
}

/// How many opens are not closed yet.
#[no_mangle]
pub extern "C" fn cuFileUseCount() -> c_long {
    guard_value(0, || *lock(&OPENS))
}

/// The driver's properties.
///
/// # Safety
/// `props` is NULL or points to writable memory for a `CUfileDrvProps_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetProperties(props: *mut CUfileDrvProps) -> CUfileError {
    guard(|| {
        if props.is_null() {
            return Err(Fail::INVALID);
        }
        engine()?;
        let p = properties(&params::lock());
        // SAFETY: Non-null, and writable for the struct by the caller's
        // contract; `write_unaligned` asks nothing of its alignment.
        unsafe { props.write_unaligned(p) };
        Ok(())
    })
}

/// Sets poll mode and its threshold (KB). The engine always completes
/// I/O its own way; the values are reported back by the properties.
#[no_mangle]
pub extern "C" fn cuFileDriverSetPollMode(poll: bool, poll_threshold_size: size_t) -> CUfileError {
    guard(|| {
        engine()?;
        let mut p = params::lock();
        p.flags[flag::USE_POLL_MODE] = poll;
        p.sizes[size::POLLTHRESHOLD_SIZE_KB] = poll_threshold_size;
        Ok(())
    })
}

/// Sets the largest direct I/O (KB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxDirectIOSize(max_direct_io_size: size_t) -> CUfileError {
    guard(|| {
        engine()?;
        params::lock().sizes[size::MAX_DIRECT_IO_SIZE_KB] =
            size_kb(max_direct_io_size, usize::MAX / 1024)?;
        Ok(())
    })
}

/// Sets the device cache size (KB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxCacheSize(max_cache_size: size_t) -> CUfileError {
    guard(|| {
        engine()?;
        params::lock().sizes[size::MAX_DEVICE_CACHE_SIZE_KB] =
            size_kb(max_cache_size, u32::MAX as usize)?;
        Ok(())
    })
}

/// Sets the largest pinned device memory (KB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxPinnedMemSize(max_pinned_size: size_t) -> CUfileError {
    guard(|| {
        engine()?;
        params::lock().sizes[size::MAX_DEVICE_PINNED_MEM_SIZE_KB] =
            size_kb(max_pinned_size, u32::MAX as usize)?;
        Ok(())
    })
}

/// The cuFile API version this library implements: [`VERSION`].
///
/// # Safety
/// `version` is NULL or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetVersion(version: *mut c_int) -> CUfileError {
    guard(|| {
        if version.is_null() {
            return Err(Fail::INVALID);
        }
        // SAFETY: Non-null and writable by the caller's contract.
        unsafe { version.write_unaligned(VERSION) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_say_what_kvikio_looks_for() {
        let mut params = Params::default();
        let p = properties(&params);
        assert!(p.nvfs.major_version != 0 || p.nvfs.minor_version != 0);
        assert_ne!(p.fflags & (1 << feature::BATCH_IO), 0);
        assert_ne!(p.fflags & (1 << feature::STREAMS), 0);
        assert_ne!(p.nvfs.dcontrolflags & (1 << dcontrol::ALLOW_COMPAT_MODE), 0);
        assert_eq!(p.nvfs.dcontrolflags & (1 << dcontrol::USE_POLL_MODE), 0);
        assert_eq!(p.max_batch_io_size, 128);
        assert!(p.nvfs.max_direct_io_size >= 4 && p.per_buffer_cache_size > 0);
        params.flags[flag::USE_POLL_MODE] = true;
        params.flags[flag::ALLOW_COMPAT_MODE] = false;
        let polled = properties(&params);
        assert_ne!(polled.nvfs.dcontrolflags & 1, 0);
        assert_eq!(
            polled.nvfs.dcontrolflags & (1 << dcontrol::ALLOW_COMPAT_MODE),
            0
        );
        const { assert!(VERSION >= 1070) };
    }

    #[test]
    fn sizes_in_kb_are_checked() {
        assert_eq!(size_kb(4, 100), Ok(4));
        assert_eq!(size_kb(16384, usize::MAX), Ok(16384));
        for bad in [0, 3, 4097, 104] {
            assert_eq!(
                size_kb(bad, 100),
                Err(Fail::cu(op::DRIVER_UNSUPPORTED_LIMIT)),
                "{bad}"
            );
        }
    }
}
