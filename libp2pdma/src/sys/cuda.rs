//! The CUDA driver, loaded at run time through `cudarc`: nothing of CUDA is
//! needed to build the library, and a machine without a GPU gets an error
//! saying so, never a crash.
//!
//! `cudarc`'s raw functions panic when the driver library or one of its
//! symbols is missing. [`driver`] looks for the library first, without
//! loading a symbol, and every call here runs under `catch_unwind`, so a
//! driver too old for a function is an [`Error::Cuda`] too.
//!
//! The driver is the one the dynamic loader finds (`libcuda.so`,
//! `libcuda.so.1`, ...), or the library [`use_library`] or the
//! `P2PDMA_CUDA_DRIVER` environment variable names, loaded first so that
//! `cudarc` finds it by its soname.
//!
//! Every call that needs a context runs inside [`Context::enter`], which
//! pushes the device's primary context on the calling thread and pops it
//! after, so the caller's own context (a framework's) is left as it was.
#![allow(unsafe_code)]

use std::{
    ffi::{c_char, c_int, c_void, CStr, CString},
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    panic::{catch_unwind, AssertUnwindSafe},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
};

use cudarc::driver::sys as cu;

use crate::{Error, Result};

pub use cu::{CUdeviceptr, CUresult};

/// The environment variable naming the driver library to load.
pub const DRIVER_ENV: &str = "P2PDMA_CUDA_DRIVER";

/// Oldest driver API this library uses: 11.7, the first with dma-buf
/// export (`cuMemGetHandleForAddressRange`).
pub const MIN_DRIVER_VERSION: i32 = 11070;

/// The loaded, initialized driver.
#[derive(Debug)]
pub struct Driver {
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor.
    pub version: i32,
    /// The library loaded ahead of the loader's search, if one was named.
    pub library: Option<PathBuf>,
    contexts: Mutex<Vec<Option<Arc<Context>>>>,
}

static CHOSEN: Mutex<Option<PathBuf>> = Mutex::new(None);
static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// Loads the driver from `path` instead of the loader's search. Must come
/// before the first use of CUDA in the process; afterwards it is refused.
///
/// The library is loaded first and `cudarc` then finds it by its soname,
/// unless the loader finds a `libcuda.so` first (a toolkit's link to
/// another driver): put `path`'s directory first on `LD_LIBRARY_PATH` there.
pub fn use_library(path: impl AsRef<Path>) -> Result<()> {
    if DRIVER.get().is_some() {
        return Err(Error::InvalidArgument(
            "the CUDA driver is already loaded in this process".into(),
        ));
    }
    *CHOSEN.lock().unwrap_or_else(|p| p.into_inner()) = Some(path.as_ref().to_path_buf());
    Ok(())
}

/// The driver, loaded and initialized on first use; why not, when it
/// cannot be (no library, no device, a driver too old).
pub fn driver() -> Result<&'static Driver> {
    DRIVER
        .get_or_init(load)
        .as_ref()
        .map_err(|why| Error::CudaUnavailable(why.clone()))
}

/// Whether a driver library can be found, without initializing it.
pub fn library_present() -> bool {
    if DRIVER.get().is_some_and(|d| d.is_ok()) {
        return true;
    }
    chosen().is_some_and(|p| p.exists())
        // SAFETY: Only opens and closes the candidate libraries.
        || unsafe { cu::is_culib_present() }
}

fn chosen() -> Option<PathBuf> {
    let named = CHOSEN.lock().unwrap_or_else(|p| p.into_inner()).clone();
    named.or_else(|| std::env::var_os(DRIVER_ENV).map(PathBuf::from))
}

fn load() -> std::result::Result<Driver, String> {
    let library = chosen();
    if let Some(path) = &library {
        preload(path)?;
    } else if !unsafe { cu::is_culib_present() } {
        // SAFETY (above): only opens and closes the candidate libraries.
        return Err("no CUDA driver library (libcuda.so.1) found".into());
    }
    let describe = |e: Error| e.to_string();
    // SAFETY: cuInit takes flags 0.
    call("cuInit", || unsafe { cu::cuInit(0) }).map_err(describe)?;
    let mut version: c_int = 0;
    // SAFETY: The pointer is to a live int.
    call("cuDriverGetVersion", || unsafe {
        cu::cuDriverGetVersion(&mut version)
    })
    .map_err(describe)?;
    if version < MIN_DRIVER_VERSION {
        return Err(format!(
            "the CUDA driver's API is {}, older than {} (dma-buf export)",
            version_string(version),
            version_string(MIN_DRIVER_VERSION)
        ));
    }
    Ok(Driver {
        version,
        library,
        contexts: Mutex::new(Vec::new()),
    })
}

/// Loads `path` with its symbols global, leaked: `cudarc`'s own `dlopen`
/// by name then finds this library by its soname.
fn preload(path: &Path) -> std::result::Result<(), String> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{} has a NUL byte", path.display()))?;
    // SAFETY: A NUL-terminated path; the handle is never closed.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a NUL-terminated string or null.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: Non-null, NUL-terminated, read before the next dl call.
            unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!(
            "cannot load the CUDA driver {}: {why}",
            path.display()
        ));
    }
    Ok(())
}

/// `12080` as `12.8`.
pub fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// Runs one driver call, turning a panic in `cudarc` (a missing symbol)
/// and an error status into [`Error::Cuda`].
pub fn call(op: &'static str, f: impl FnOnce() -> CUresult) -> Result<()> {
    check(op, status(op, f)?)
}

/// Runs one driver call and returns its status as it is (for the calls
/// whose statuses mean more than success or failure), a panic in `cudarc`
/// (a missing symbol) turned into [`Error::Cuda`].
fn status(op: &'static str, f: impl FnOnce() -> CUresult) -> Result<CUresult> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| Error::Cuda {
        op,
        code: u32::MAX,
        name: panic_text(&p),
    })
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    crate::error::panic_message(p).unwrap_or_else(|| "the driver call panicked".into())
}

/// [`Error::Cuda`] for an error status.
pub fn check(op: &'static str, r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::Cuda {
        op,
        code: r as u32,
        name: error_name(r),
    })
}

/// The status's name and text, as the driver gives them.
fn error_name(r: CUresult) -> String {
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    let got = |p: *const c_char| {
        // SAFETY: The driver returns static NUL-terminated strings.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: Out-pointers to live locals.
    let n = status("cuGetErrorName", || unsafe {
        cu::cuGetErrorName(r, &mut name)
    });
    // SAFETY: As above.
    let t = status("cuGetErrorString", || unsafe {
        cu::cuGetErrorString(r, &mut text)
    });
    match (n, t) {
        (Ok(CUresult::CUDA_SUCCESS), Ok(CUresult::CUDA_SUCCESS)) => match (got(name), got(text)) {
            (Some(n), Some(t)) => format!("{n}: {t}"),
            (Some(n), None) => n,
            _ => format!("CUresult {}", r as u32),
        },
        _ => format!("CUresult {}", r as u32),
    }
}

/// A device's primary context, retained once per process and kept (as
/// the CUDA runtime does).
#[derive(Debug)]
pub struct Context {
    ordinal: i32,
    device: cu::CUdevice,
    ctx: cu::CUcontext,
    /// Streams of this context no copy uses, for the next one.
    streams: Mutex<Vec<Stream>>,
    /// Devices whose memory this context was asked to reach, and whether
    /// it does (access enabled).
    peers: Mutex<Vec<(i32, bool)>>,
    /// The device's PCI address, asked once.
    pci: OnceLock<Option<String>>,
}

// SAFETY: A CUDA context handle is usable from any thread (each thread
// makes it current before use, through `enter`).
unsafe impl Send for Context {}
// SAFETY: As above; the handle itself is never mutated.
unsafe impl Sync for Context {}

/// A context made current on this thread; the previous one comes back when
/// it is dropped.
pub struct Entered<'a> {
    _ctx: &'a Context,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut old: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: Pops what `enter` pushed on this thread.
        let _ = call("cuCtxPopCurrent", || unsafe {
            cu::cuCtxPopCurrent_v2(&mut old)
        });
    }
}

impl Context {
    /// Device `ordinal`'s primary context.
    pub fn primary(ordinal: i32) -> Result<Arc<Context>> {
        let d = driver()?;
        let mut all = d.contexts.lock().unwrap_or_else(|p| p.into_inner());
        // A context already retained costs no driver call (this runs for
        // every buffer lent).
        if let Some(Some(c)) = usize::try_from(ordinal).ok().and_then(|i| all.get(i)) {
            return Ok(c.clone());
        }
        let count = device_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "no CUDA device {ordinal} ({count} present)"
            )));
        }
        if all.len() < count as usize {
            all.resize(count as usize, None);
        }
        let mut device: cu::CUdevice = 0;
        // SAFETY: Out-pointer to a live local.
        call("cuDeviceGet", || unsafe {
            cu::cuDeviceGet(&mut device, ordinal)
        })?;
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: As above.
        call("cuDevicePrimaryCtxRetain", || unsafe {
            cu::cuDevicePrimaryCtxRetain(&mut ctx, device)
        })?;
        let c = Arc::new(Context {
            ordinal,
            device,
            ctx,
            streams: Mutex::new(Vec::new()),
            peers: Mutex::new(Vec::new()),
            pci: OnceLock::new(),
        });
        all[ordinal as usize] = Some(c.clone());
        Ok(c)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes the context current on this thread until the guard drops.
    pub fn enter(&self) -> Result<Entered<'_>> {
        // SAFETY: A retained context.
        call("cuCtxPushCurrent", || unsafe {
            cu::cuCtxPushCurrent_v2(self.ctx)
        })?;
        Ok(Entered { _ctx: self })
    }

    /// Runs `f` with the context current and an idle stream of its own,
    /// which goes back to the context's pool after (streams are made once
    /// and reused: making one costs a driver call).
    pub fn with_stream<T>(&self, f: impl FnOnce(&Stream) -> Result<T>) -> Result<T> {
        let e = self.enter()?;
        let idle = self.streams.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let s = match idle {
            Some(s) => s,
            None => Stream::new(&e)?,
        };
        let r = f(&s);
        if r.is_ok() {
            // A stream whose work failed is dropped, not reused.
            self.streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(s);
        }
        drop(e);
        r
    }

    /// The device's PCI address (`dddd:bb:dd.f`), asked once.
    pub fn pci(&self) -> Option<&str> {
        self.pci
            .get_or_init(|| pci_bus_id(self.device).ok())
            .as_deref()
    }

    /// An integer attribute of the device.
    pub fn attribute(&self, attr: cu::CUdevice_attribute) -> Result<i32> {
        device_attribute(self.device, attr)
    }

    /// Whether this context reaches `peer`'s device memory directly (over
    /// NVLink or PCIe), access enabled the first time it is asked
    /// (`cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess`) and the answer
    /// kept. Where it does not, copies between the two still work: the
    /// driver stages them through host memory.
    pub fn reaches_peer(&self, peer: &Context) -> Result<bool> {
        if peer.ordinal == self.ordinal {
            return Ok(true);
        }
        let mut known = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(_, yes)) = known.iter().find(|(o, _)| *o == peer.ordinal) {
            return Ok(yes);
        }
        let mut can: c_int = 0;
        // SAFETY: Out-pointer to a live local; both devices exist.
        call("cuDeviceCanAccessPeer", || unsafe {
            cu::cuDeviceCanAccessPeer(&mut can, self.device, peer.device)
        })?;
        let yes = can != 0 && {
            let _e = self.enter()?;
            // SAFETY: Both contexts are retained primary contexts; flags 0.
            let r = status("cuCtxEnablePeerAccess", || unsafe {
                cu::cuCtxEnablePeerAccess(peer.ctx, 0)
            })?;
            // Enabled by someone else in this process (a framework): as
            // good as by us.
            r == CUresult::CUDA_SUCCESS || r == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        };
        known.push((peer.ordinal, yes));
        Ok(yes)
    }
}

fn device_attribute(dev: cu::CUdevice, attr: cu::CUdevice_attribute) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: Out-pointer to a live local.
    call("cuDeviceGetAttribute", || unsafe {
        cu::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// The device's PCI address, `dddd:bb:dd.f` in lower case.
fn pci_bus_id(dev: cu::CUdevice) -> Result<String> {
    let mut bus = [0 as c_char; 64];
    // SAFETY: The buffer holds 64 chars, and the length says so.
    call("cuDeviceGetPCIBusId", || unsafe {
        cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, dev)
    })?;
    // SAFETY: NUL-terminated by the driver within the zeroed buffer.
    let text = unsafe { CStr::from_ptr(bus.as_ptr()) };
    Ok(text.to_string_lossy().to_lowercase())
}

/// How many CUDA devices the driver sees.
pub fn device_count() -> Result<i32> {
    driver()?;
    let mut n: c_int = 0;
    // SAFETY: Out-pointer to a live local.
    call("cuDeviceGetCount", || unsafe {
        cu::cuDeviceGetCount(&mut n)
    })?;
    Ok(n)
}

/// What the driver says about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Its ordinal.
    pub ordinal: i32,
    /// Its name.
    pub name: String,
    /// Its memory, in bytes.
    pub total_memory: u64,
    /// Its PCI address, `dddd:bb:dd.f`.
    pub pci: String,
    /// Whether it exports its memory as dma-bufs.
    pub dma_buf: bool,
    /// Whether it supports GPUDirect RDMA (peers reaching its memory).
    pub rdma: bool,
}

/// Facts of device `ordinal`.
pub fn device_facts(ordinal: i32) -> Result<DeviceFacts> {
    driver()?;
    let mut dev: cu::CUdevice = 0;
    // SAFETY: Out-pointer to a live local.
    call("cuDeviceGet", || unsafe {
        cu::cuDeviceGet(&mut dev, ordinal)
    })?;
    let mut name = [0 as c_char; 256];
    // SAFETY: The buffer holds 256 chars, and the length says so.
    call("cuDeviceGetName", || unsafe {
        cu::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev)
    })?;
    let mut total: usize = 0;
    // SAFETY: Out-pointer to a live local.
    call("cuDeviceTotalMem", || unsafe {
        cu::cuDeviceTotalMem_v2(&mut total, dev)
    })?;
    use cu::CUdevice_attribute as A;
    let text = |b: &[c_char]| {
        // SAFETY: The driver NUL-terminates within the buffer; the last
        // byte is NUL from the zeroed buffer in any case.
        unsafe { CStr::from_ptr(b.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    Ok(DeviceFacts {
        ordinal,
        name: text(&name),
        total_memory: total as u64,
        pci: pci_bus_id(dev)?,
        dma_buf: device_attribute(dev, A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)? != 0,
        rdma: device_attribute(dev, A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)? != 0,
    })
}

/// Where a pointer lives, by the driver's unified addressing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pointer {
    /// Device memory of device `ordinal`: the allocation holding it is
    /// `[base, base + size)`.
    Device {
        /// The device.
        ordinal: i32,
        /// Start of the allocation.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// Page-locked host memory the driver knows (allocated or registered).
    Host,
    /// Memory the driver does not know (ordinary host memory).
    Unknown,
}

/// What the driver knows of `ptr`.
pub fn pointer(ptr: u64) -> Result<Pointer> {
    driver()?;
    use cu::CUpointer_attribute as P;
    // One call for all four: unlike cuPointerGetAttribute, it takes memory
    // the driver does not know as no error (type 0), and unlike
    // cuMemGetAddressRange it needs no current context.
    let mut ty: u32 = 0;
    let mut ordinal: c_int = 0;
    let mut base: u64 = 0;
    let mut size: usize = 0;
    let mut attrs = [
        P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        P::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 4] = [
        (&mut ty as *mut u32).cast(),
        (&mut ordinal as *mut c_int).cast(),
        (&mut base as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: Each data pointer is a live local of the attribute's type
    // (unsigned int, int, CUdeviceptr, size_t).
    call("cuPointerGetAttributes", || unsafe {
        cu::cuPointerGetAttributes(
            attrs.len() as u32,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr,
        )
    })?;
    match ty {
        0 => Ok(Pointer::Unknown),
        t if t == cu::CUmemorytype::CU_MEMORYTYPE_HOST as u32 => Ok(Pointer::Host),
        t if t == cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => Ok(Pointer::Device {
            ordinal,
            base,
            size: size as u64,
        }),
        t => Err(Error::InvalidArgument(format!(
            "{ptr:#x} is CUDA memory of type {t}, neither device nor host memory"
        ))),
    }
}

/// `len` bytes of device memory, in the context (which must be current).
pub fn mem_alloc(_in: &Entered<'_>, len: usize) -> Result<CUdeviceptr> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: Out-pointer to a live local; a context is current.
    call("cuMemAlloc", || unsafe { cu::cuMemAlloc_v2(&mut p, len) })?;
    Ok(p)
}

/// Frees what [`mem_alloc`] gave.
///
/// # Safety
/// `p` came from `mem_alloc` and nothing uses it any more.
pub unsafe fn mem_free(_in: &Entered<'_>, p: CUdeviceptr) -> Result<()> {
    // SAFETY: The caller's.
    call("cuMemFree", || unsafe { cu::cuMemFree_v2(p) })
}

/// Device memory as the GPUs' copy engines address it: `len` bytes at
/// `ptr` of the device of `ctx`. Only this library makes one, of memory a
/// [`CudaMemory`](crate::memory::CudaMemory) holds for the borrow's
/// lifetime, so a copy into one never writes outside it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRange<'a> {
    pub(crate) ctx: &'a Arc<Context>,
    pub(crate) ptr: CUdeviceptr,
    pub(crate) len: usize,
}

impl DeviceRange<'_> {
    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal
    }

    /// The device address of byte 0.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The device addresses a copy of `len` bytes from `src` at `src_offset`
/// to `dst` at `dst_offset` runs between, and whether the two are one
/// device; `None` for no bytes. Both ranges are checked, and ranges that
/// overlap in one device's memory refused.
fn copy_ends(
    dst: DeviceRange<'_>,
    dst_offset: usize,
    src: DeviceRange<'_>,
    src_offset: usize,
    len: usize,
) -> Result<Option<(CUdeviceptr, CUdeviceptr, bool)>> {
    crate::error::check_range(dst_offset, len, dst.len)?;
    crate::error::check_range(src_offset, len, src.len)?;
    if len == 0 {
        return Ok(None);
    }
    let (to, from) = (dst.ptr + dst_offset as u64, src.ptr + src_offset as u64);
    let same_device = dst.ctx.ordinal == src.ctx.ordinal;
    if same_device && to.abs_diff(from) < len as u64 {
        return Err(Error::InvalidArgument(format!(
            "a device-to-device copy of {len} bytes from {from:#x} to {to:#x}: the ranges overlap"
        )));
    }
    Ok(Some((to, from, same_device)))
}

/// Copies `len` bytes of `src` at `src_offset` into `dst` at `dst_offset`
/// by the GPUs, the host moving no byte: within one device by
/// `cuMemcpyDtoDAsync`, between two by `cuMemcpyPeerAsync` (directly where
/// the destination reaches the source's device, access enabled on first
/// use; else staged by the driver). Both ranges are checked first; ranges
/// that overlap in one device's memory are refused
/// ([`Error::InvalidArgument`]); nothing moves on any error.
///
/// # Safety
/// Nothing else uses `dst`'s range during the call (no kernel, no other
/// copy): the memory holding it is the caller's to write.
pub unsafe fn copy_between(
    dst: DeviceRange<'_>,
    dst_offset: usize,
    src: DeviceRange<'_>,
    src_offset: usize,
    len: usize,
) -> Result<()> {
    // The copy queued on a stream of the library's own, and waited for.
    dst.ctx.with_stream(|s| {
        // SAFETY: `DeviceRange`s are made only of memory held for the
        // borrow; the stream is the destination device's, waited for
        // before this returns.
        unsafe { copy_between_on(dst, dst_offset, src, src_offset, len, s.as_raw()) }?;
        s.synchronize()
    })
}

/// Queues, on `stream` (a caller's `CUstream` of `dst`'s device; null:
/// the legacy default stream), a copy of `len` bytes of `src` at
/// `src_offset` into `dst` at `dst_offset` by the GPUs, and returns
/// without waiting: the bytes land in the stream's order, before any work
/// the caller queues on it later. Checked as [`copy_between`] checks.
///
/// # Safety
/// `stream` is a live stream of `dst`'s device (or a default-stream
/// handle); both ranges stay allocated, and nothing else writes `dst`'s or
/// `src`'s, until the stream has run the copy.
pub unsafe fn copy_between_on(
    dst: DeviceRange<'_>,
    dst_offset: usize,
    src: DeviceRange<'_>,
    src_offset: usize,
    len: usize,
    stream: *mut c_void,
) -> Result<()> {
    let Some((to, from, same_device)) = copy_ends(dst, dst_offset, src, src_offset, len)? else {
        return Ok(());
    };
    if !same_device {
        let _ = dst.ctx.reaches_peer(src.ctx);
    }
    let _e = dst.ctx.enter()?;
    if same_device {
        // SAFETY: The caller's; in range (checked), not overlapping.
        return call("cuMemcpyDtoDAsync", || unsafe {
            cu::cuMemcpyDtoDAsync_v2(to, from, len, stream.cast())
        });
    }
    // SAFETY: As above, between the two named devices.
    call("cuMemcpyPeerAsync", || unsafe {
        cu::cuMemcpyPeerAsync(to, dst.ctx.ctx, from, src.ctx.ctx, len, stream.cast())
    })
}

/// Queues on `stream` (as for [`copy_between_on`]) the copies `runs`, each
/// `(dst_offset, src_offset, len)` from `src` into `dst`: on one device,
/// as one `cuMemcpyBatchAsync` where the driver has it (CUDA 12.8 and
/// later) and the stream is not a default-stream handle, which it refuses;
/// else, and between devices, one copy each. Every run is checked before
/// any is queued.
///
/// # Safety
/// As for [`copy_between_on`], for every run.
pub unsafe fn copy_runs_on(
    dst: DeviceRange<'_>,
    src: DeviceRange<'_>,
    runs: &[(usize, usize, usize)],
    stream: *mut c_void,
) -> Result<()> {
    let mut ends = Vec::with_capacity(runs.len());
    for &(d, s, len) in runs {
        if let Some((to, from, _)) = copy_ends(dst, d, src, s, len)? {
            ends.push((to, from, len));
        }
    }
    let default_stream = (stream as usize) < 3;
    if ends.len() > 1 && dst.ctx.ordinal == src.ctx.ordinal && !default_stream {
        let mut dsts: Vec<CUdeviceptr> = ends.iter().map(|e| e.0).collect();
        let mut srcs: Vec<CUdeviceptr> = ends.iter().map(|e| e.1).collect();
        let mut sizes: Vec<usize> = ends.iter().map(|e| e.2).collect();
        let here = cu::CUmemLocation {
            type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dst.ctx.ordinal,
        };
        let mut attrs = cu::CUmemcpyAttributes {
            srcAccessOrder: cu::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: here,
            dstLocHint: here,
            flags: 0,
        };
        let mut first = 0usize;
        let mut fail = 0usize;
        let _e = dst.ctx.enter()?;
        // SAFETY: Three arrays of `ends.len()` entries, live for the call,
        // one attribute for all from copy 0; the ranges checked above and
        // the caller's promises for the rest. On an error nothing is
        // queued (the driver checks every copy first), so the copies are
        // then queued one by one below.
        let batched = status("cuMemcpyBatchAsync", || unsafe {
            cu::cuMemcpyBatchAsync(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                ends.len(),
                &mut attrs,
                &mut first,
                1,
                &mut fail,
                stream.cast(),
            )
        });
        if matches!(batched, Ok(CUresult::CUDA_SUCCESS)) {
            return Ok(());
        }
    }
    for &(d, s, len) in runs {
        // SAFETY: The caller's, for every run.
        unsafe { copy_between_on(dst, d, src, s, len, stream) }?;
    }
    Ok(())
}

/// Waits for the work queued on `stream` (a caller's `CUstream`; null: the
/// legacy default stream).
///
/// # Safety
/// `stream` is a live stream of the current context's device, or a
/// default-stream handle.
pub unsafe fn stream_synchronize(_in: &Entered<'_>, stream: *mut c_void) -> Result<()> {
    // SAFETY: The caller's.
    call("cuStreamSynchronize", || unsafe {
        cu::cuStreamSynchronize(stream.cast())
    })
}

/// A stream of the current context, destroyed when dropped.
#[derive(Debug)]
pub struct Stream(cu::CUstream);

// SAFETY: Streams are usable from any thread with the context current.
unsafe impl Send for Stream {}

impl Stream {
    /// A non-blocking stream (no implicit ordering with the legacy default
    /// stream, which other users' work may be on).
    pub fn new(_in: &Entered<'_>) -> Result<Self> {
        let mut s: cu::CUstream = std::ptr::null_mut();
        // SAFETY: Out-pointer to a live local.
        call("cuStreamCreate", || unsafe {
            cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Self(s))
    }

    /// Copies `src` to device memory at `dst` on the stream and waits for
    /// it.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` is device memory nothing else writes.
    pub unsafe fn copy_to_device(&self, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
        // SAFETY: The caller's for the device side; `src` is live for the
        // call.
        unsafe { self.copy_to_device_raw(dst, src.as_ptr(), src.len()) }
    }

    /// Copies `len` bytes at host address `src` to device memory at `dst`
    /// on the stream and waits for it.
    ///
    /// # Safety
    /// `[dst, dst + len)` is device memory nothing else writes, and
    /// `[src, src + len)` host memory valid for reads until this returns.
    pub unsafe fn copy_to_device_raw(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: The caller's; the synchronize below ends the copy before
        // this returns.
        call("cuMemcpyHtoDAsync", || unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.0)
        })?;
        self.synchronize()
    }

    /// Copies device memory at `src` into `dst` on the stream and waits.
    ///
    /// # Safety
    /// `[src, src + dst.len())` is device memory.
    pub unsafe fn copy_from_device(&self, dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
        // SAFETY: The caller's for the device side; `dst` is live and ours
        // for the call.
        unsafe { self.copy_from_device_raw(dst.as_mut_ptr(), src, dst.len()) }
    }

    /// Copies `len` bytes of device memory at `src` to host address `dst`
    /// on the stream and waits.
    ///
    /// # Safety
    /// `[src, src + len)` is device memory, and `[dst, dst + len)` host
    /// memory valid for writes until this returns.
    pub unsafe fn copy_from_device_raw(
        &self,
        dst: *mut u8,
        src: CUdeviceptr,
        len: usize,
    ) -> Result<()> {
        // SAFETY: The caller's; the synchronize below ends the copy before
        // this returns.
        call("cuMemcpyDtoHAsync", || unsafe {
            cu::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, self.0)
        })?;
        self.synchronize()
    }

    /// Sets `len` bytes at `dst` to `value` on the stream and waits.
    ///
    /// # Safety
    /// `[dst, dst + len)` is device memory nothing else uses.
    pub unsafe fn memset(&self, dst: CUdeviceptr, value: u8, len: usize) -> Result<()> {
        // SAFETY: The caller's.
        call("cuMemsetD8Async", || unsafe {
            cu::cuMemsetD8Async(dst, value, len, self.0)
        })?;
        self.synchronize()
    }

    /// The `CUstream` handle, for calls that take a caller's stream.
    pub fn as_raw(&self) -> *mut c_void {
        self.0.cast()
    }

    /// Waits for the stream's work.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: A live stream.
        call("cuStreamSynchronize", || unsafe {
            cu::cuStreamSynchronize(self.0)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: The stream is ours and idle (every copy synchronizes).
        let _ = call("cuStreamDestroy", || unsafe {
            cu::cuStreamDestroy_v2(self.0)
        });
    }
}

/// Page-locks `[ptr, ptr + len)` for every context (`PORTABLE`), so that
/// copies between it and device memory run by DMA at full speed.
///
/// # Safety
/// The range stays mapped until [`host_unregister`].
pub unsafe fn host_register(_in: &Entered<'_>, ptr: *mut u8, len: usize) -> Result<()> {
    // SAFETY: The caller's.
    call("cuMemHostRegister", || unsafe {
        cu::cuMemHostRegister_v2(ptr.cast(), len, cu::CU_MEMHOSTREGISTER_PORTABLE)
    })
}

/// Ends [`host_register`].
///
/// # Safety
/// `ptr` was registered and no copy uses it.
pub unsafe fn host_unregister(_in: &Entered<'_>, ptr: *mut u8) -> Result<()> {
    // SAFETY: The caller's.
    call("cuMemHostUnregister", || unsafe {
        cu::cuMemHostUnregister(ptr.cast())
    })
}

/// `[ptr, ptr + len)` of device memory as a dma-buf (page-aligned, inside
/// one allocation).
pub fn export_dmabuf(_in: &Entered<'_>, ptr: CUdeviceptr, len: usize) -> Result<OwnedFd> {
    let mut fd: c_int = -1;
    // SAFETY: DMA_BUF_FD writes an int.
    call("cuMemGetHandleForAddressRange", || unsafe {
        cu::cuMemGetHandleForAddressRange(
            (&mut fd as *mut c_int).cast::<c_void>(),
            ptr,
            len,
            cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    if fd < 0 {
        return Err(Error::InvalidArgument(
            "cuMemGetHandleForAddressRange gave no file descriptor".into(),
        ));
    }
    // SAFETY: The driver handed us a new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether every operation queued on `stream` (a caller's `CUstream`; null:
/// the legacy default stream) has completed (`cuStreamQuery`).
///
/// # Safety
/// `stream` is a live stream of `ctx`'s device, or a default-stream handle.
pub unsafe fn stream_idle(_in: &Entered<'_>, stream: *mut c_void) -> Result<bool> {
    // SAFETY: The caller's.
    let r = status("cuStreamQuery", || unsafe {
        cu::cuStreamQuery(stream.cast())
    })?;
    if r == CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuStreamQuery", r)?;
    Ok(true)
}

/// A function the stream runs on a driver thread once the work queued on
/// it before has finished (`cuLaunchHostFunc`); later work waits for it.
/// `stream` is a `CUstream` from a caller (null: the legacy default
/// stream). The function must not call CUDA.
///
/// # Safety
/// `stream` is a live stream of `ctx`'s device, and `data` stays valid
/// until `f` has run.
pub unsafe fn launch_host_func(
    _in: &Entered<'_>,
    stream: *mut c_void,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> Result<()> {
    // SAFETY: The caller's.
    call("cuLaunchHostFunc", || unsafe {
        cu::cuLaunchHostFunc(stream.cast(), Some(f), data)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_major_minor() {
        assert_eq!(version_string(12080), "12.8");
        assert_eq!(version_string(11070), "11.7");
        assert_eq!(version_string(13000), "13.0");
    }
}
