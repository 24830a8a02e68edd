//! cuFile's configuration parameters (`cuFileSetParameter*`,
//! `cuFileGetParameter*`, the slab arrays) and the values the driver calls
//! set at run time.
//!
//! A parameter is staged until the driver opens, which for this library is
//! when the engine starts (`cuFileDriverOpen` or the first call that needs
//! it): the start reads the staged values, and from then on setting one is
//! `CU_FILE_DRIVER_ALREADY_OPEN`, as NVIDIA documents. Reading gives the
//! staged value before the start and the value in force after it.
//!
//! The parameters the engine has a setting for change it:
//! `PROPERTIES_MAX_DIRECT_IO_SIZE_KB` is the engine's chunk (the size of
//! each direct I/O), `EXECUTION_MAX_IO_QUEUE_DEPTH` its depth (chunks in
//! flight), `EXECUTION_MAX_IO_THREADS` its copy threads,
//! `FORCE_COMPAT_MODE` the bounce path for every transfer and
//! `PROPERTIES_ALLOW_COMPAT_MODE` (false) P2P or nothing; those left unset
//! leave the engine's own choices (`P2PDMA_*`, `/etc/p2pdma.conf`), and
//! read as cuFile's defaults. `PROFILE_STATS` is the statistics level,
//! `PROPERTIES_IO_BATCHSIZE` the largest batch, the logging strings where
//! the library logs to ([`log`]). The others are kept and read back.

use std::{
    ffi::{c_char, c_int, CStr},
    fs::OpenOptions,
    io::Write as _,
    sync::{Mutex, MutexGuard},
};

use libc::size_t;
use p2pdma::{Config, PathPref};

use crate::{
    abi::{op, CUfileError},
    errors::{guard, Fail, Res},
    stats,
};

/// `CUFileSizeTConfigParameter_t` values.
pub mod size {
    /// `CUFILE_PARAM_PROFILE_STATS`.
    pub const PROFILE_STATS: usize = 0;
    /// `CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH`.
    pub const MAX_IO_QUEUE_DEPTH: usize = 1;
    /// `CUFILE_PARAM_EXECUTION_MAX_IO_THREADS`.
    pub const MAX_IO_THREADS: usize = 2;
    /// `CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB`.
    pub const MIN_IO_THRESHOLD_SIZE_KB: usize = 3;
    /// `CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM`.
    pub const MAX_REQUEST_PARALLELISM: usize = 4;
    /// `CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB`.
    pub const MAX_DIRECT_IO_SIZE_KB: usize = 5;
    /// `CUFILE_PARAM_PROPERTIES_MAX_DEVICE_CACHE_SIZE_KB`.
    pub const MAX_DEVICE_CACHE_SIZE_KB: usize = 6;
    /// `CUFILE_PARAM_PROPERTIES_PER_BUFFER_CACHE_SIZE_KB`.
    pub const PER_BUFFER_CACHE_SIZE_KB: usize = 7;
    /// `CUFILE_PARAM_PROPERTIES_MAX_DEVICE_PINNED_MEM_SIZE_KB`.
    pub const MAX_DEVICE_PINNED_MEM_SIZE_KB: usize = 8;
    /// `CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE`.
    pub const IO_BATCHSIZE: usize = 9;
    /// `CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB`.
    pub const POLLTHRESHOLD_SIZE_KB: usize = 10;
    /// `CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS`.
    pub const BATCH_IO_TIMEOUT_MS: usize = 11;
    /// How many there are.
    pub const COUNT: usize = 12;
}

/// `CUFileBoolConfigParameter_t` values.
pub mod flag {
    /// `CUFILE_PARAM_PROPERTIES_USE_POLL_MODE`.
    pub const USE_POLL_MODE: usize = 0;
    /// `CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE`.
    pub const ALLOW_COMPAT_MODE: usize = 1;
    /// `CUFILE_PARAM_FORCE_COMPAT_MODE`.
    pub const FORCE_COMPAT_MODE: usize = 2;
    /// `CUFILE_PARAM_USE_PCIP2PDMA`.
    pub const USE_PCIP2PDMA: usize = 7;
    /// How many there are.
    pub const COUNT: usize = 12;
}

/// `CUFileStringConfigParameter_t` values.
pub mod string {
    /// `CUFILE_PARAM_LOGGING_LEVEL`.
    pub const LOGGING_LEVEL: usize = 0;
    /// `CUFILE_PARAM_ENV_LOGFILE_PATH`.
    pub const ENV_LOGFILE_PATH: usize = 1;
    /// `CUFILE_PARAM_LOG_DIR`.
    pub const LOG_DIR: usize = 2;
    /// How many there are.
    pub const COUNT: usize = 3;
}

/// cuFile's defaults (its `cufile.json`), and the range a setter takes.
/// Sizes in KB that the properties report in 32 bits stop there.
const SIZES: [(usize, (usize, usize)); size::COUNT] = [
    (0, (0, 3)),
    (128, (1, 1024)),
    (4, (1, 64)),
    (8192, (4, 1 << 30)),
    (4, (1, 64)),
    (16384, (4, 1 << 20)),
    (128 << 10, (4, u32::MAX as usize)),
    (1024, (4, u32::MAX as usize)),
    (32 << 20, (4, u32::MAX as usize)),
    (128, (1, 1024)),
    (4, (1, 1 << 30)),
    (5, (1, 1 << 30)),
];

/// The sizes that must be multiples of 4 KB.
const KB_ALIGNED: [usize; 4] = [
    size::MAX_DIRECT_IO_SIZE_KB,
    size::MAX_DEVICE_CACHE_SIZE_KB,
    size::PER_BUFFER_CACHE_SIZE_KB,
    size::MAX_DEVICE_PINNED_MEM_SIZE_KB,
];

/// Defaults of the flags: polling off, compatibility mode allowed and not
/// forced, parallel I/O, host memory, PCI P2PDMA and io_uring on.
const FLAGS: [bool; flag::COUNT] = [
    false, true, false, false, true, false, true, true, true, false, false, false,
];

/// Logging levels, least verbose first.
const LEVELS: [&str; 6] = ["ERROR", "WARN", "NOTICE", "INFO", "DEBUG", "TRACE"];

/// cuFile's default POSIX pool: 128 slabs of 4 KB, 64 of 1 MB, 64 of 16 MB.
const POSIX_SLABS: [(usize, usize); 3] = [(4, 128), (1024, 64), (16384, 64)];
/// The default GPU bounce buffers: 64 of 1 MB (`per_buffer_cache_size_kb`).
const GPU_SLABS: [(usize, usize); 1] = [(1024, 64)];
/// Most slabs of one array.
const MAX_SLABS: usize = 16;

/// Every parameter: staged, or in force once `open`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Whether the driver has opened (the engine started).
    pub open: bool,
    /// The `size_t` parameters.
    pub sizes: [usize; size::COUNT],
    /// Which of them a caller set.
    pub sizes_set: [bool; size::COUNT],
    /// The `bool` parameters.
    pub flags: [bool; flag::COUNT],
    /// Which of them a caller set.
    pub flags_set: [bool; flag::COUNT],
    /// The strings.
    pub strings: [String; string::COUNT],
    /// The POSIX pool's slabs, (KB, count).
    pub posix_slabs: Vec<(usize, usize)>,
    /// The GPU bounce buffer slabs, (KB, count).
    pub gpu_slabs: Vec<(usize, usize)>,
    /// The P2P flags of each filesystem or device type.
    pub p2p: [u32; crate::abi::dstatus::MAX_TARGET_TYPES as usize],
}

impl Default for Params {
    fn default() -> Self {
        Self {
            open: false,
            sizes: SIZES.map(|(d, _)| d),
            sizes_set: [false; size::COUNT],
            flags: FLAGS,
            flags_set: [false; flag::COUNT],
            strings: ["ERROR".into(), String::new(), String::new()],
            posix_slabs: POSIX_SLABS.to_vec(),
            gpu_slabs: GPU_SLABS.to_vec(),
            p2p: [0; crate::abi::dstatus::MAX_TARGET_TYPES as usize],
        }
    }
}

static PARAMS: Mutex<Option<Params>> = Mutex::new(None);

/// The parameters, locked.
pub fn lock() -> ParamsGuard {
    let mut g = PARAMS.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(Params::default);
    ParamsGuard(g)
}

/// [`lock`]'s guard.
pub struct ParamsGuard(MutexGuard<'static, Option<Params>>);

impl std::ops::Deref for ParamsGuard {
    type Target = Params;
    fn deref(&self) -> &Params {
        self.0.as_ref().expect("set by lock")
    }
}

impl std::ops::DerefMut for ParamsGuard {
    fn deref_mut(&mut self) -> &mut Params {
        self.0.as_mut().expect("set by lock")
    }
}

impl Params {
    /// Applies the parameters a caller set to the engine's configuration,
    /// over what the environment said.
    pub fn configure(&self, config: &mut Config) {
        if self.sizes_set[size::MAX_DIRECT_IO_SIZE_KB] {
            config.chunk = Some(self.sizes[size::MAX_DIRECT_IO_SIZE_KB] << 10);
        }
        if self.sizes_set[size::MAX_IO_QUEUE_DEPTH] {
            config.depth = Some(self.sizes[size::MAX_IO_QUEUE_DEPTH]);
        }
        if self.sizes_set[size::MAX_IO_THREADS] {
            config.copy_threads = Some(self.sizes[size::MAX_IO_THREADS]);
        }
        if self.flags[flag::FORCE_COMPAT_MODE] {
            config.path = PathPref::Bounce;
        } else if !self.flags[flag::ALLOW_COMPAT_MODE] {
            config.path = PathPref::P2p;
        }
    }

    /// Marks the driver open: the P2P flags start from the parameters.
    pub fn open(&mut self) {
        self.open = true;
        if self.flags[flag::USE_PCIP2PDMA] && !self.flags[flag::FORCE_COMPAT_MODE] {
            let bit = 1 << crate::abi::p2p::P2PDMA;
            self.p2p[crate::abi::dstatus::NVME as usize] = bit;
            self.p2p[crate::abi::dstatus::NVMEOF as usize] = bit;
        }
        if self.sizes_set[size::PROFILE_STATS] {
            stats::set_level(self.sizes[size::PROFILE_STATS] as i32);
        }
    }

    /// The logging level's rank in [`LEVELS`].
    fn level(&self) -> usize {
        LEVELS
            .iter()
            .position(|l| *l == self.strings[string::LOGGING_LEVEL])
            .unwrap_or(0)
    }

    /// Where log lines go: `ENV_LOGFILE_PATH`, else `cufile.log` in
    /// `LOG_DIR`, else nowhere.
    fn log_path(&self) -> Option<String> {
        if !self.strings[string::ENV_LOGFILE_PATH].is_empty() {
            return Some(self.strings[string::ENV_LOGFILE_PATH].clone());
        }
        let dir = &self.strings[string::LOG_DIR];
        (!dir.is_empty()).then(|| format!("{dir}/cufile.log"))
    }
}

/// Appends a line at `level` (a name of [`LEVELS`]) to the log, when the
/// logging level lets it through and a log file is set. Failing to write
/// is not an error of the caller's.
pub fn log(p: &Params, level: &str, line: &str) {
    let Some(rank) = LEVELS.iter().position(|l| *l == level) else {
        return;
    };
    if rank > p.level() {
        return;
    }
    if let Some(path) = p.log_path() {
        if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(
                f,
                "{level} libcufile (p2pdma) {}: {line}",
                std::process::id()
            );
        }
    }
}

/// A staged parameter's index, checked: `CU_FILE_INVALID_VALUE` past the
/// enumeration.
fn index(param: c_int, count: usize) -> Res<usize> {
    usize::try_from(param)
        .ok()
        .filter(|&i| i < count)
        .ok_or(Fail::INVALID)
}

/// A setter's check: the driver must not be open.
fn staged(p: &Params) -> Res<()> {
    if p.open {
        return Err(Fail::cu(op::DRIVER_ALREADY_OPEN));
    }
    Ok(())
}

/// Checks a size parameter's value against its range.
pub fn check_size(i: usize, value: usize) -> Res<usize> {
    let (min, max) = SIZES[i].1;
    if value < min || value > max || (KB_ALIGNED.contains(&i) && !value.is_multiple_of(4)) {
        return Err(Fail::INVALID);
    }
    Ok(value)
}

/// Reads a `size_t` parameter.
///
/// # Safety
/// `value` is NULL or writable for a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterSizeT(param: c_int, value: *mut size_t) -> CUfileError {
    guard(|| {
        let i = index(param, size::COUNT)?;
        if value.is_null() {
            return Err(Fail::INVALID);
        }
        let v = if i == size::PROFILE_STATS && lock().open {
            stats::level() as usize
        } else {
            lock().sizes[i]
        };
        // SAFETY: Non-null, writable by the caller's contract.
        unsafe { value.write_unaligned(v) };
        Ok(())
    })
}

/// Reads a `bool` parameter.
///
/// # Safety
/// `value` is NULL or writable for a `bool`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterBool(param: c_int, value: *mut bool) -> CUfileError {
    guard(|| {
        let i = index(param, flag::COUNT)?;
        if value.is_null() {
            return Err(Fail::INVALID);
        }
        let v = lock().flags[i];
        // SAFETY: Non-null, writable by the caller's contract.
        unsafe { value.write_unaligned(v) };
        Ok(())
    })
}

/// Copies a string parameter with its NUL into `desc_str`, which holds
/// `len` bytes: `CU_FILE_INVALID_VALUE` when they are too few.
///
/// # Safety
/// `desc_str` is NULL or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterString(
    param: c_int,
    desc_str: *mut c_char,
    len: c_int,
) -> CUfileError {
    guard(|| {
        let i = index(param, string::COUNT)?;
        if desc_str.is_null() || len <= 0 {
            return Err(Fail::INVALID);
        }
        let v = lock().strings[i].clone();
        if v.len() >= len as usize {
            return Err(Fail::INVALID);
        }
        // SAFETY: `v.len() + 1 <= len` bytes, writable by the caller's
        // contract; `v` is ours, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), desc_str.cast::<u8>(), v.len());
            desc_str.add(v.len()).write(0);
        }
        Ok(())
    })
}

/// The range a `size_t` parameter's setter takes.
///
/// # Safety
/// `min_value` and `max_value` are NULL or writable for a `size_t` each.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterMinMaxValue(
    param: c_int,
    min_value: *mut size_t,
    max_value: *mut size_t,
) -> CUfileError {
    guard(|| {
        let i = index(param, size::COUNT)?;
        if min_value.is_null() || max_value.is_null() {
            return Err(Fail::INVALID);
        }
        let (min, max) = SIZES[i].1;
        // SAFETY: Non-null, writable by the caller's contract.
        unsafe {
            min_value.write_unaligned(min);
            max_value.write_unaligned(max);
        }
        Ok(())
    })
}

/// Stages a `size_t` parameter: `CU_FILE_INVALID_VALUE` outside its range
/// ([`cuFileGetParameterMinMaxValue`]; sizes of memory in multiples of 4
/// KB), `CU_FILE_DRIVER_ALREADY_OPEN` once the driver is open.
#[no_mangle]
pub extern "C" fn cuFileSetParameterSizeT(param: c_int, value: size_t) -> CUfileError {
    guard(|| {
        let i = index(param, size::COUNT)?;
        let mut p = lock();
        staged(&p)?;
        p.sizes[i] = check_size(i, value)?;
        p.sizes_set[i] = true;
        Ok(())
    })
}

/// Stages a `bool` parameter.
#[no_mangle]
pub extern "C" fn cuFileSetParameterBool(param: c_int, value: bool) -> CUfileError {
    guard(|| {
        let i = index(param, flag::COUNT)?;
        let mut p = lock();
        staged(&p)?;
        p.flags[i] = value;
        p.flags_set[i] = true;
        Ok(())
    })
}

/// Stages a string parameter: a logging level of [`LEVELS`] (any case), or
/// a path (empty for none).
///
/// # Safety
/// `desc_str` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterString(
    param: c_int,
    desc_str: *const c_char,
) -> CUfileError {
    guard(|| {
        let i = index(param, string::COUNT)?;
        if desc_str.is_null() {
            return Err(Fail::INVALID);
        }
        // SAFETY: NUL-terminated by the caller's contract.
        let s = unsafe { CStr::from_ptr(desc_str) }
            .to_str()
            .map_err(|_| Fail::INVALID)?;
        let value = if i == string::LOGGING_LEVEL {
            let up = s.to_ascii_uppercase();
            if !LEVELS.contains(&up.as_str()) {
                return Err(Fail::INVALID);
            }
            up
        } else {
            if s.len() >= libc::PATH_MAX as usize {
                return Err(Fail::INVALID);
            }
            s.to_owned()
        };
        let mut p = lock();
        staged(&p)?;
        p.strings[i] = value;
        Ok(())
    })
}

/// The slabs C passes, checked: 1 to [`MAX_SLABS`] of them, sizes in
/// multiples of 4 KB in ascending order, counts not 0.
///
/// # Safety
/// Both arrays are NULL or readable for `len` values.
unsafe fn slabs_in(
    sizes: *const size_t,
    counts: *const size_t,
    len: c_int,
) -> Res<Vec<(usize, usize)>> {
    let n = usize::try_from(len).map_err(|_| Fail::INVALID)?;
    if sizes.is_null() || counts.is_null() || n == 0 || n > MAX_SLABS {
        return Err(Fail::INVALID);
    }
    // SAFETY: Readable for `n` values by the caller's contract.
    let (s, c) = unsafe {
        (
            std::slice::from_raw_parts(sizes, n).to_vec(),
            std::slice::from_raw_parts(counts, n).to_vec(),
        )
    };
    let ascending = s.windows(2).all(|w| w[0] < w[1]);
    if !ascending || s.iter().any(|&kb| kb == 0 || !kb.is_multiple_of(4)) || c.contains(&0) {
        return Err(Fail::INVALID);
    }
    Ok(s.into_iter().zip(c).collect())
}

/// Copies slabs out to C: `len` must be their number.
///
/// # Safety
/// Both arrays are NULL or writable for `len` values.
unsafe fn slabs_out(
    slabs: &[(usize, usize)],
    sizes: *mut size_t,
    counts: *mut size_t,
    len: c_int,
) -> Res<()> {
    if sizes.is_null() || counts.is_null() || usize::try_from(len).ok() != Some(slabs.len()) {
        return Err(Fail::INVALID);
    }
    for (i, &(kb, n)) in slabs.iter().enumerate() {
        // SAFETY: `i < len`, writable by the caller's contract.
        unsafe {
            sizes.add(i).write_unaligned(kb);
            counts.add(i).write_unaligned(n);
        }
    }
    Ok(())
}

/// Stages the POSIX pool's slabs (sizes in KB and counts, in pairs).
///
/// # Safety
/// Both arrays are NULL or readable for `len` values.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterPosixPoolSlabArray(
    size_values: *const size_t,
    count_values: *const size_t,
    len: c_int,
) -> CUfileError {
    guard(|| {
        // SAFETY: The caller's.
        let slabs = unsafe { slabs_in(size_values, count_values, len) }?;
        let mut p = lock();
        staged(&p)?;
        p.posix_slabs = slabs;
        Ok(())
    })
}

/// The POSIX pool's slabs; `len` must be their number.
///
/// # Safety
/// Both arrays are NULL or writable for `len` values.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterPosixPoolSlabArray(
    size_values: *mut size_t,
    count_values: *mut size_t,
    len: c_int,
) -> CUfileError {
    // SAFETY: The caller's.
    guard(|| unsafe { slabs_out(&lock().posix_slabs, size_values, count_values, len) })
}

/// Stages the GPU bounce buffer slabs.
///
/// # Safety
/// Both arrays are NULL or readable for `len` values.
#[no_mangle]
pub unsafe extern "C" fn cuFileSetParameterGpuBounceBufferSlabArray(
    size_values: *const size_t,
    count_values: *const size_t,
    len: c_int,
) -> CUfileError {
    guard(|| {
        // SAFETY: The caller's.
        let slabs = unsafe { slabs_in(size_values, count_values, len) }?;
        let mut p = lock();
        staged(&p)?;
        p.gpu_slabs = slabs;
        Ok(())
    })
}

/// The GPU bounce buffer slabs; `len` must be their number.
///
/// # Safety
/// Both arrays are NULL or writable for `len` values.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetParameterGpuBounceBufferSlabArray(
    size_values: *mut size_t,
    count_values: *mut size_t,
    len: c_int,
) -> CUfileError {
    // SAFETY: The caller's.
    guard(|| unsafe { slabs_out(&lock().gpu_slabs, size_values, count_values, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_parameters_configure_the_engine() {
        let mut p = Params::default();
        let mut c = Config::default();
        p.configure(&mut c);
        assert_eq!(c, Config::default(), "nothing set changes nothing");
        p.sizes[size::MAX_DIRECT_IO_SIZE_KB] = 256;
        p.sizes_set[size::MAX_DIRECT_IO_SIZE_KB] = true;
        p.sizes[size::MAX_IO_QUEUE_DEPTH] = 3;
        p.sizes_set[size::MAX_IO_QUEUE_DEPTH] = true;
        p.sizes[size::MAX_IO_THREADS] = 2;
        p.sizes_set[size::MAX_IO_THREADS] = true;
        p.flags[flag::FORCE_COMPAT_MODE] = true;
        p.configure(&mut c);
        assert_eq!(
            (c.chunk, c.depth, c.copy_threads, c.path),
            (Some(256 << 10), Some(3), Some(2), PathPref::Bounce)
        );
        let mut c = Config::default();
        p.flags[flag::FORCE_COMPAT_MODE] = false;
        p.flags[flag::ALLOW_COMPAT_MODE] = false;
        p.configure(&mut c);
        assert_eq!(c.path, PathPref::P2p);
    }

    #[test]
    fn sizes_are_checked_against_their_ranges() {
        assert_eq!(check_size(size::PROFILE_STATS, 3), Ok(3));
        assert_eq!(check_size(size::PROFILE_STATS, 4), Err(Fail::INVALID));
        assert_eq!(
            check_size(size::MAX_DIRECT_IO_SIZE_KB, 6),
            Err(Fail::INVALID)
        );
        assert_eq!(check_size(size::MAX_DIRECT_IO_SIZE_KB, 8), Ok(8));
        assert_eq!(check_size(size::MAX_IO_THREADS, 0), Err(Fail::INVALID));
        for (i, (d, (min, max))) in SIZES.iter().enumerate() {
            assert!(min <= d && d <= max, "parameter {i}'s default is in range");
        }
    }

    #[test]
    fn slabs_must_ascend_in_4k_steps() {
        let ok = |s: &[usize], c: &[usize]| {
            // SAFETY: Both arrays hold `s.len()` values.
            unsafe { slabs_in(s.as_ptr(), c.as_ptr(), s.len() as c_int) }
        };
        assert_eq!(ok(&[4, 8], &[1, 2]), Ok(vec![(4, 1), (8, 2)]));
        assert_eq!(ok(&[8, 4], &[1, 2]), Err(Fail::INVALID));
        assert_eq!(ok(&[6], &[1]), Err(Fail::INVALID));
        assert_eq!(ok(&[4], &[0]), Err(Fail::INVALID));
        assert_eq!(ok(&[], &[]), Err(Fail::INVALID));
    }
}
