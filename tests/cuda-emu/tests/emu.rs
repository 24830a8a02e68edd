//! Tests of the CUDA emulator itself, through the library the crate builds.
//!
//! Each test loads its own copy of the library: a copy under another path
//! is another library to the loader, so every test has its own devices,
//! tables and counters, and the tests run in parallel. The emulator reads
//! its configuration from the environment at `cuInit`; the tests that need
//! another configuration (or a crash) run one `child_*` test of this binary
//! in a child process.
//!
//! Timing is never what makes a test pass: stream work is held back with a
//! gate (a host function that waits), and a wait is only used to show that
//! something did *not* happen early.

use std::{
    ffi::{c_char, c_int, c_uint, c_void, CStr},
    os::unix::process::ExitStatusExt,
    process::{Command, Output},
    ptr::null_mut,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering::SeqCst},
        Condvar, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use cuda_emu::{CopyStats, Stats, StatsFns, GET_STATS, RESET_STATS};
use libloading::Library;
use tempfile::TempDir;

// Status codes (cudaError_enum).
const SUCCESS: u32 = 0;
const INVALID_VALUE: u32 = 1;
const OUT_OF_MEMORY: u32 = 2;
const NOT_INITIALIZED: u32 = 3;
const NO_DEVICE: u32 = 100;
const INVALID_DEVICE: u32 = 101;
const INVALID_CONTEXT: u32 = 201;
const PEER_ACCESS_UNSUPPORTED: u32 = 217;
const PEER_ACCESS_ALREADY_ENABLED: u32 = 704;
const OPERATING_SYSTEM: u32 = 304;
const INVALID_HANDLE: u32 = 400;
const NOT_FOUND: u32 = 500;
const NOT_READY: u32 = 600;
const CONTEXT_IS_DESTROYED: u32 = 709;
const ALREADY_REGISTERED: u32 = 712;
const NOT_REGISTERED: u32 = 713;
const NOT_PERMITTED: u32 = 800;
const NOT_SUPPORTED: u32 = 801;

// Flags and attributes (cuda.h).
const STREAM_NON_BLOCKING: c_uint = 1;
const HOSTALLOC_PORTABLE: c_uint = 1;
const HOSTALLOC_DEVICEMAP: c_uint = 2;
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
const DMA_BUF_FD: c_int = 1;
const PTR_CONTEXT: c_int = 1;
const PTR_MEMORY_TYPE: c_int = 2;
const PTR_DEVICE_POINTER: c_int = 3;
const PTR_HOST_POINTER: c_int = 4;
const PTR_P2P_TOKENS: c_int = 5;
const PTR_SYNC_MEMOPS: c_int = 6;
const PTR_BUFFER_ID: c_int = 7;
const PTR_IS_MANAGED: c_int = 8;
const PTR_DEVICE_ORDINAL: c_int = 9;
const PTR_RANGE_START_ADDR: c_int = 11;
const PTR_RANGE_SIZE: c_int = 12;
const PTR_IS_GPU_DIRECT_RDMA_CAPABLE: c_int = 15;
const DEV_CAN_MAP_HOST_MEMORY: c_int = 19;
const DEV_PCI_BUS_ID: c_int = 33;
const DEV_PCI_DEVICE_ID: c_int = 34;
const DEV_UNIFIED_ADDRESSING: c_int = 41;
const DEV_PCI_DOMAIN_ID: c_int = 50;
const DEV_MEMORY_POOLS_SUPPORTED: c_int = 115;
const DEV_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
const DEV_DMA_BUF_SUPPORTED: c_int = 124;

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

type Ptr = u64;

/// `CUmemcpyAttributes` (CUDA 12.8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct MemcpyAttributes {
    src_access_order: c_int,
    src_loc_hint: [c_int; 2],
    dst_loc_hint: [c_int; 2],
    flags: c_uint,
}

/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`.
const ORDER_STREAM: c_int = 1;
type Handle = *mut c_void;
type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// Declares the emulator's functions, typed as cuda.h declares them.
macro_rules! api {
    ($($name:ident($($arg:ty),*);)*) => {
        /// The emulator's functions, looked up once.
        #[expect(non_snake_case, reason = "the driver's names")]
        struct Api {
            $($name: unsafe extern "C" fn($($arg),*) -> u32,)*
        }

        impl Api {
            fn load(lib: &Library) -> Self {
                Self {
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: The emulator defines the function with
                        // this signature (cuda.h's).
                        let f = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> u32>(name.as_bytes())
                        };
                        *f.unwrap_or_else(|e| panic!("{name}: {e}"))
                    },)*
                }
            }
        }
    };
}

api! {
    cuInit(c_uint);
    cuDriverGetVersion(*mut c_int);
    cuGetErrorName(u32, *mut *const c_char);
    cuGetErrorString(u32, *mut *const c_char);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut c_int, c_int);
    cuDeviceGetName(*mut c_char, c_int, c_int);
    cuDeviceGetUuid_v2(*mut [u8; 16], c_int);
    cuDeviceTotalMem_v2(*mut usize, c_int);
    cuDeviceGetAttribute(*mut c_int, c_int, c_int);
    cuDeviceGetPCIBusId(*mut c_char, c_int, c_int);
    cuDevicePrimaryCtxRetain(*mut Handle, c_int);
    cuDevicePrimaryCtxRelease_v2(c_int);
    cuDevicePrimaryCtxGetState(c_int, *mut c_uint, *mut c_int);
    cuCtxSetCurrent(Handle);
    cuCtxGetCurrent(*mut Handle);
    cuCtxPushCurrent_v2(Handle);
    cuCtxPopCurrent_v2(*mut Handle);
    cuCtxGetDevice(*mut c_int);
    cuCtxCreate_v2(*mut Handle, c_uint, c_int);
    cuCtxDestroy_v2(Handle);
    cuMemcpyBatchAsync(*mut Ptr, *mut Ptr, *mut usize, usize, *mut MemcpyAttributes, *mut usize, usize, *mut usize, Handle);
    cuMemcpyBatchAsync_v2(*mut Ptr, *mut Ptr, *mut usize, usize, *mut MemcpyAttributes, *mut usize, usize, Handle);
    cuCtxSynchronize();
    cuMemAlloc_v2(*mut Ptr, usize);
    cuMemFree_v2(Ptr);
    cuMemGetAddressRange_v2(*mut Ptr, *mut usize, Ptr);
    cuMemGetInfo_v2(*mut usize, *mut usize);
    cuMemsetD8_v2(Ptr, u8, usize);
    cuMemsetD8Async(Ptr, u8, usize, Handle);
    cuMemHostAlloc(*mut *mut c_void, usize, c_uint);
    cuMemAllocHost_v2(*mut *mut c_void, usize);
    cuMemFreeHost(*mut c_void);
    cuMemHostRegister_v2(*mut c_void, usize, c_uint);
    cuMemHostUnregister(*mut c_void);
    cuMemHostGetDevicePointer_v2(*mut Ptr, *mut c_void, c_uint);
    cuMemcpyHtoD_v2(Ptr, *const c_void, usize);
    cuMemcpyDtoH_v2(*mut c_void, Ptr, usize);
    cuMemcpyDtoD_v2(Ptr, Ptr, usize);
    cuMemcpy(Ptr, Ptr, usize);
    cuMemcpyHtoDAsync_v2(Ptr, *const c_void, usize, Handle);
    cuMemcpyDtoHAsync_v2(*mut c_void, Ptr, usize, Handle);
    cuMemcpyDtoDAsync_v2(Ptr, Ptr, usize, Handle);
    cuMemcpyAsync(Ptr, Ptr, usize, Handle);
    cuMemcpyPeer(Ptr, Handle, Ptr, Handle, usize);
    cuMemcpyPeerAsync(Ptr, Handle, Ptr, Handle, usize, Handle);
    cuDeviceCanAccessPeer(*mut c_int, c_int, c_int);
    cuCtxEnablePeerAccess(Handle, c_uint);
    cuStreamCreate(*mut Handle, c_uint);
    cuStreamDestroy_v2(Handle);
    cuStreamSynchronize(Handle);
    cuStreamQuery(Handle);
    cuStreamGetFlags(Handle, *mut c_uint);
    cuStreamWaitEvent(Handle, Handle, c_uint);
    cuLaunchHostFunc(Handle, HostFn, *mut c_void);
    cuEventCreate(*mut Handle, c_uint);
    cuEventRecord(Handle, Handle);
    cuEventQuery(Handle);
    cuEventSynchronize(Handle);
    cuEventDestroy_v2(Handle);
    cuPointerGetAttribute(*mut c_void, c_int, Ptr);
    cuPointerGetAttributes(c_uint, *mut c_int, *mut *mut c_void, Ptr);
    cuPointerSetAttribute(*const c_void, c_int, Ptr);
    cuMemGetHandleForAddressRange(*mut c_void, Ptr, usize, c_int, u64);
}

/// Calls an emulator function. Every use is sound for the same reason: the
/// emulator checks each device address and handle against its own tables
/// and refuses what it does not know, and host pointers are to buffers the
/// test keeps alive (and unmoved) until the work on them is synchronized.
macro_rules! cu {
    ($emu:expr, $f:ident($($arg:expr),* $(,)?)) => {{
        let f = $emu.api.$f;
        // SAFETY: See the macro's documentation.
        unsafe { f($($arg),*) }
    }};
}

/// One instance of the emulator.
struct Emu {
    api: Api,
    stats: StatsFns,
    lib: Library,
    _dir: TempDir,
}

impl Emu {
    /// A fresh instance, in the default configuration.
    fn load() -> Self {
        let set: Vec<_> = std::env::vars()
            .filter(|(k, _)| k.starts_with("CUEMU_"))
            .collect();
        assert!(
            set.is_empty(),
            "the tests need the default configuration; unset {set:?}"
        );
        Self::load_configured()
    }

    /// A fresh instance, configured by this process's environment.
    fn load_configured() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("libcuda.so.1");
        std::fs::copy(cuda_emu::library(), &path).expect("copy the emulator");
        // SAFETY: The emulator has no initializers; it stays loaded.
        let lib = unsafe { Library::new(&path) }.expect("load the emulator");
        let api = Api::load(&lib);
        // SAFETY: The symbols' types are those the crate documents.
        let stats = unsafe {
            let get = lib
                .get(GET_STATS.to_bytes_with_nul())
                .expect("cuemuGetStats");
            let reset = lib
                .get(RESET_STATS.to_bytes_with_nul())
                .expect("cuemuResetStats");
            StatsFns::new(*get, *reset)
        };
        Self {
            api,
            stats,
            lib,
            _dir: dir,
        }
    }

    /// A fresh instance, initialized, device 0's context current here.
    fn started() -> (Self, Handle) {
        Self::start(Self::load())
    }

    fn start(emu: Self) -> (Self, Handle) {
        assert_eq!(cu!(emu, cuInit(0)), SUCCESS);
        let ctx = emu.retain(0);
        emu.bind(ctx);
        (emu, ctx)
    }

    fn retain(&self, dev: c_int) -> Handle {
        let mut ctx = null_mut();
        assert_eq!(cu!(self, cuDevicePrimaryCtxRetain(&mut ctx, dev)), SUCCESS);
        ctx
    }

    fn bind(&self, ctx: Handle) {
        assert_eq!(cu!(self, cuCtxSetCurrent(ctx)), SUCCESS);
    }

    fn alloc(&self, n: usize) -> Ptr {
        let mut p = 0;
        assert_eq!(
            cu!(self, cuMemAlloc_v2(&mut p, n)),
            SUCCESS,
            "cuMemAlloc({n})"
        );
        p
    }

    fn free(&self, p: Ptr) {
        assert_eq!(cu!(self, cuMemFree_v2(p)), SUCCESS);
    }

    fn htod(&self, dst: Ptr, src: &[u8]) {
        assert_eq!(
            cu!(self, cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())),
            SUCCESS
        );
    }

    fn dtoh(&self, src: Ptr, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        assert_eq!(
            cu!(self, cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), src, n)),
            SUCCESS
        );
        v
    }

    fn stream(&self, flags: c_uint) -> Handle {
        let mut s = null_mut();
        assert_eq!(cu!(self, cuStreamCreate(&mut s, flags)), SUCCESS);
        s
    }

    fn sync(&self, s: Handle) {
        assert_eq!(cu!(self, cuStreamSynchronize(s)), SUCCESS);
    }

    /// Queues `f(data)` on `s`; `data` must outlive the stream's work.
    fn host_fn<T>(&self, s: Handle, f: unsafe extern "C" fn(*mut c_void), data: &T) {
        let data = data as *const T as *mut c_void;
        assert_eq!(cu!(self, cuLaunchHostFunc(s, Some(f), data)), SUCCESS);
    }

    fn pinned(&self, len: usize) -> Pinned<'_> {
        let mut p = null_mut();
        assert_eq!(cu!(self, cuMemHostAlloc(&mut p, len, 0)), SUCCESS);
        Pinned {
            emu: self,
            ptr: p.cast(),
            len,
        }
    }

    fn attr(&self, attr: c_int, dev: c_int) -> (u32, c_int) {
        let mut v = -1;
        (cu!(self, cuDeviceGetAttribute(&mut v, attr, dev)), v)
    }

    fn bus_id(&self, dev: c_int) -> String {
        let mut buf = [0 as c_char; 32];
        assert_eq!(
            cu!(self, cuDeviceGetPCIBusId(buf.as_mut_ptr(), 32, dev)),
            SUCCESS
        );
        // SAFETY: The emulator wrote a NUL-terminated string into buf.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// `cuPointerGetAttribute` into a `T`.
    fn ptr_attr<T: Default>(&self, attr: c_int, p: Ptr) -> (u32, T) {
        let mut v = T::default();
        let rc = cu!(
            self,
            cuPointerGetAttribute((&mut v as *mut T).cast(), attr, p)
        );
        (rc, v)
    }

    fn stat(&self) -> Stats {
        self.stats.read().expect("the emulator's statistics")
    }

    fn error_name(&self, code: u32) -> Option<String> {
        let mut s = std::ptr::null();
        if cu!(self, cuGetErrorName(code, &mut s)) != SUCCESS {
            assert!(s.is_null());
            return None;
        }
        // SAFETY: The emulator returns static NUL-terminated strings.
        Some(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
    }
}

/// Page-locked host memory from `cuMemHostAlloc`.
struct Pinned<'a> {
    emu: &'a Emu,
    ptr: *mut u8,
    len: usize,
}

impl Pinned<'_> {
    fn addr(&self) -> *mut c_void {
        self.ptr.cast()
    }

    fn write(&self, data: &[u8]) {
        assert_eq!(data.len(), self.len);
        // SAFETY: len bytes at ptr are ours; no stream work on them is queued.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr, self.len) }
    }

    fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // SAFETY: As in write: no queued work is running on them.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, v.as_mut_ptr(), self.len) }
        v
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        let rc = cu!(self.emu, cuMemFreeHost(self.addr()));
        if !thread::panicking() {
            assert_eq!(rc, SUCCESS);
        }
    }
}

/// Holds a stream back: a host function waiting until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }
}

unsafe extern "C" fn gate_wait(data: *mut c_void) {
    // SAFETY: data is a Gate kept alive until the stream is synchronized.
    unsafe { &*(data as *const Gate) }.wait();
}

unsafe extern "C" fn set_flag(data: *mut c_void) {
    // SAFETY: data is an AtomicBool kept alive as above.
    unsafe { &*(data as *const AtomicBool) }.store(true, SeqCst);
}

/// A host function that tries a CUDA call from the stream's worker.
struct Reentry {
    synchronize: unsafe extern "C" fn() -> u32,
    got: AtomicU32,
}

unsafe extern "C" fn call_cuda(data: *mut c_void) {
    // SAFETY: data is a Reentry kept alive as above.
    let r = unsafe { &*(data as *const Reentry) };
    // SAFETY: cuCtxSynchronize takes no arguments.
    r.got.store(unsafe { (r.synchronize)() }, SeqCst);
}

/// A step of a host-function sequence: appends n to the log.
struct Step<'a> {
    log: &'a Mutex<Vec<u32>>,
    n: u32,
}

unsafe extern "C" fn record_step(data: *mut c_void) {
    // SAFETY: data is a Step kept alive as above.
    let step = unsafe { &*(data as *const Step<'_>) };
    step.log.lock().unwrap().push(step.n);
}

/// Reproducible bytes (xorshift).
fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn udmabuf_opens() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/udmabuf")
        .is_ok()
}

/// Long enough for queued work to have run, had it not been held back.
fn settle() {
    thread::sleep(Duration::from_millis(50));
}

// ---------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "CUEMU_TEST_CHILD";
const WANT_ENV: &str = "CUEMU_TEST_WANT";

fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == name)
}

/// Runs the test `name` of this binary alone in a child process with the
/// emulator configured by `env` (and nothing else of CUEMU_*).
fn run_child(name: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CUEMU_") {
            cmd.env_remove(key);
        }
    }
    cmd.env(CHILD_ENV, name).envs(env.iter().copied());
    cmd.output().expect("run the child test")
}

fn child_passes(name: &str, env: &[(&str, &str)]) {
    let out = run_child(name, env);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child {name} with {env:?}: {}\n{text}",
        out.status
    );
}

// ---------------------------------------------------------------------------
// Loading, initialization, devices
// ---------------------------------------------------------------------------

#[test]
fn exports_the_names_cudarc_loads() {
    let emu = Emu::load();
    let names = [
        "cuInit",
        "cuDriverGetVersion",
        "cuGetErrorName",
        "cuGetErrorString",
        "cuDeviceGetCount",
        "cuDeviceGet",
        "cuDeviceGetName",
        "cuDeviceTotalMem_v2",
        "cuDeviceGetAttribute",
        "cuDeviceGetPCIBusId",
        "cuDeviceGetUuid",
        "cuDeviceGetUuid_v2",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxRelease_v2",
        "cuDevicePrimaryCtxGetState",
        "cuCtxSetCurrent",
        "cuCtxGetCurrent",
        "cuCtxPushCurrent",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent",
        "cuCtxPopCurrent_v2",
        "cuCtxGetDevice",
        "cuCtxCreate_v2",
        "cuCtxDestroy_v2",
        "cuMemcpyBatchAsync",
        "cuMemcpyBatchAsync_v2",
        "cuCtxSynchronize",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemGetAddressRange_v2",
        "cuMemGetInfo_v2",
        "cuMemsetD8_v2",
        "cuMemsetD8Async",
        "cuPointerGetAttribute",
        "cuPointerGetAttributes",
        "cuPointerSetAttribute",
        "cuMemHostAlloc",
        "cuMemAllocHost_v2",
        "cuMemFreeHost",
        "cuMemHostRegister_v2",
        "cuMemHostUnregister",
        "cuMemHostGetDevicePointer_v2",
        "cuStreamCreate",
        "cuStreamDestroy",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamQuery",
        "cuStreamGetFlags",
        "cuStreamWaitEvent",
        "cuLaunchHostFunc",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventSynchronize",
        "cuEventQuery",
        "cuEventDestroy",
        "cuEventDestroy_v2",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyDtoDAsync_v2",
        "cuMemcpyAsync",
        "cuMemcpyPeer",
        "cuMemcpyPeerAsync",
        "cuDeviceCanAccessPeer",
        "cuCtxEnablePeerAccess",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemcpyDtoD_v2",
        "cuMemcpy",
        "cuMemGetHandleForAddressRange",
        "cuemuGetStats",
        "cuemuResetStats",
    ];
    let has = |name: &str| {
        // SAFETY: Only looks the symbol up.
        unsafe { emu.lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
    };
    for name in names {
        assert!(has(name), "{name} is not exported");
    }
    // The first versions of these take 32-bit sizes or pointers: a caller
    // resolving them must fail, not get the _v2 behaviour.
    for name in [
        "cuMemAlloc",
        "cuMemcpyHtoD",
        "cuMemHostRegister",
        "cuDeviceTotalMem",
    ] {
        assert!(!has(name), "{name} is exported");
    }
}

#[test]
fn library_path_and_the_path_tool() {
    let lib = cuda_emu::library();
    assert!(lib.is_file(), "{}", lib.display());
    assert_eq!(lib.parent(), Some(cuda_emu::library_dir()));
    let link = cuda_emu::library_dir().join("libcuda.so");
    assert_eq!(link.canonicalize().unwrap(), lib.canonicalize().unwrap());

    let tool = env!("CARGO_BIN_EXE_cuda-emu-path");
    let out = Command::new(tool).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        lib.to_str().unwrap()
    );
    let out = Command::new(tool).arg("--dir").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        cuda_emu::library_dir().to_str().unwrap()
    );
    let out = Command::new(tool).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn everything_waits_for_cu_init() {
    let emu = Emu::load();
    let mut v = 0;
    assert_eq!(cu!(emu, cuDriverGetVersion(&mut v)), SUCCESS);
    assert_eq!(v, 12080);
    assert_eq!(
        emu.error_name(NOT_INITIALIZED).as_deref(),
        Some("CUDA_ERROR_NOT_INITIALIZED")
    );

    let mut n = -1;
    let mut p = 0;
    let mut ctx = null_mut();
    assert_eq!(cu!(emu, cuDeviceGetCount(&mut n)), NOT_INITIALIZED);
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut p, 4096)), NOT_INITIALIZED);
    assert_eq!(cu!(emu, cuCtxGetCurrent(&mut ctx)), NOT_INITIALIZED);
    assert_eq!(
        cu!(emu, cuDevicePrimaryCtxRetain(&mut ctx, 0)),
        NOT_INITIALIZED
    );

    assert_eq!(cu!(emu, cuInit(1)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuInit(0)), SUCCESS);
    assert_eq!(cu!(emu, cuInit(0)), SUCCESS);
    assert_eq!(cu!(emu, cuDeviceGetCount(&mut n)), SUCCESS);
    assert_eq!(n, 1);
}

#[test]
fn devices_describe_themselves() {
    let emu = Emu::load();
    assert_eq!(cu!(emu, cuInit(0)), SUCCESS);
    let mut dev = -1;
    assert_eq!(cu!(emu, cuDeviceGet(&mut dev, 0)), SUCCESS);
    assert_eq!(dev, 0);
    assert_eq!(cu!(emu, cuDeviceGet(&mut dev, 1)), INVALID_DEVICE);
    assert_eq!(cu!(emu, cuDeviceGet(&mut dev, -1)), INVALID_DEVICE);

    let mut name = [0 as c_char; 64];
    assert_eq!(cu!(emu, cuDeviceGetName(name.as_mut_ptr(), 64, 0)), SUCCESS);
    // SAFETY: NUL-terminated by the emulator.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with("CUDA emulator"), "{name}");
    assert_eq!(cu!(emu, cuDeviceGetName(null_mut(), 64, 0)), INVALID_VALUE);
    assert_eq!(
        cu!(emu, cuDeviceGetName([0; 4].as_mut_ptr(), 0, 0)),
        INVALID_VALUE
    );

    let mut total = 0;
    assert_eq!(cu!(emu, cuDeviceTotalMem_v2(&mut total, 0)), SUCCESS);
    assert_eq!(total, 256 * MIB);
    assert_eq!(cu!(emu, cuDeviceTotalMem_v2(&mut total, 1)), INVALID_DEVICE);

    let mut uuid = [0u8; 16];
    assert_eq!(cu!(emu, cuDeviceGetUuid_v2(&mut uuid, 0)), SUCCESS);
    assert_ne!(uuid, [0u8; 16]);

    for (attr, want) in [
        (DEV_PCI_BUS_ID, 0xe1),
        (DEV_PCI_DEVICE_ID, 0),
        (DEV_PCI_DOMAIN_ID, 0),
        (DEV_GPU_DIRECT_RDMA_SUPPORTED, 1),
        (DEV_UNIFIED_ADDRESSING, 1),
        (DEV_CAN_MAP_HOST_MEMORY, 1),
        (DEV_MEMORY_POOLS_SUPPORTED, 0),
        (DEV_DMA_BUF_SUPPORTED, udmabuf_opens() as c_int),
    ] {
        assert_eq!(emu.attr(attr, 0), (SUCCESS, want), "attribute {attr}");
    }
    for unknown in [2, 9999, -1] {
        assert_eq!(emu.attr(unknown, 0).0, INVALID_VALUE, "attribute {unknown}");
    }
    assert_eq!(emu.attr(DEV_PCI_BUS_ID, 1).0, INVALID_DEVICE);

    // Upper case, as the driver writes it; truncated to the buffer.
    assert_eq!(emu.bus_id(0), "0000:E1:00.0");
    let mut short = [0x55 as c_char; 8];
    assert_eq!(
        cu!(emu, cuDeviceGetPCIBusId(short.as_mut_ptr(), 5, 0)),
        SUCCESS
    );
    // SAFETY: NUL-terminated within the 5 bytes.
    assert_eq!(
        unsafe { CStr::from_ptr(short.as_ptr()) }.to_bytes(),
        b"0000"
    );
    assert_eq!(short[5], 0x55);
}

#[test]
fn error_names_and_strings() {
    let emu = Emu::load();
    for (code, name) in [
        (SUCCESS, "CUDA_SUCCESS"),
        (INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"),
        (OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"),
        (INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"),
        (NOT_READY, "CUDA_ERROR_NOT_READY"),
        (
            ALREADY_REGISTERED,
            "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        ),
        (NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
        (NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"),
    ] {
        assert_eq!(emu.error_name(code).as_deref(), Some(name));
        let mut text = std::ptr::null();
        assert_eq!(cu!(emu, cuGetErrorString(code, &mut text)), SUCCESS);
        // SAFETY: A static NUL-terminated string.
        assert!(!unsafe { CStr::from_ptr(text) }.to_bytes().is_empty());
    }
    assert_eq!(emu.error_name(12345), None);
    assert_eq!(cu!(emu, cuGetErrorName(0, null_mut())), INVALID_VALUE);
}

#[test]
fn configuration_comes_from_the_environment() {
    child_passes(
        "child_config",
        &[
            ("CUEMU_DEVICES", "3"),
            ("CUEMU_MEM_MIB", "16"),
            ("CUEMU_PCI", "0000:3b:00.0,0001:AF:1f.7"),
            ("CUEMU_DELAY_US", "0"),
        ],
    );
    for (env, want) in [
        (("CUEMU_DEVICES", "0"), NO_DEVICE),
        (("CUEMU_DEVICES", "9"), INVALID_VALUE),
        (("CUEMU_DEVICES", "two"), INVALID_VALUE),
        (("CUEMU_MEM_MIB", "0"), INVALID_VALUE),
        (("CUEMU_DELAY_US", "-1"), INVALID_VALUE),
        (("CUEMU_PCI", "0000:e1:00"), INVALID_VALUE),
        (("CUEMU_PCI", "0000:e1:00.0,nonsense"), INVALID_VALUE),
        (("CUEMU_PCI", "0000:e1:20.0"), INVALID_VALUE),
    ] {
        child_passes("child_init_fails", &[env, (WANT_ENV, &want.to_string())]);
    }
}

#[test]
#[ignore = "run in a child process by configuration_comes_from_the_environment"]
fn child_config() {
    if !is_child("child_config") {
        return;
    }
    let (emu, _ctx) = Emu::start(Emu::load_configured());
    let mut n = 0;
    assert_eq!(cu!(emu, cuDeviceGetCount(&mut n)), SUCCESS);
    assert_eq!(n, 3);
    for dev in 0..3 {
        let mut total = 0;
        assert_eq!(cu!(emu, cuDeviceTotalMem_v2(&mut total, dev)), SUCCESS);
        assert_eq!(total, 16 * MIB);
    }
    assert_eq!(emu.bus_id(0), "0000:3B:00.0");
    assert_eq!(emu.bus_id(1), "0001:AF:1F.7");
    assert_eq!(emu.bus_id(2), "0000:E3:00.0");
    assert_eq!(emu.attr(DEV_PCI_DOMAIN_ID, 1), (SUCCESS, 1));
    assert_eq!(emu.attr(DEV_PCI_BUS_ID, 1), (SUCCESS, 0xaf));
    assert_eq!(emu.attr(DEV_PCI_DEVICE_ID, 1), (SUCCESS, 0x1f));
    let all = emu.alloc(16 * MIB);
    let mut p = 0;
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut p, 1)), OUT_OF_MEMORY);
    emu.free(all);
}

#[test]
#[ignore = "run in a child process by configuration_comes_from_the_environment"]
fn child_init_fails() {
    if !is_child("child_init_fails") {
        return;
    }
    let want: u32 = std::env::var(WANT_ENV).unwrap().parse().unwrap();
    let emu = Emu::load_configured();
    assert_eq!(cu!(emu, cuInit(0)), want);
    assert_eq!(cu!(emu, cuInit(0)), want, "the failure stays");
    let mut n = 0;
    assert_eq!(cu!(emu, cuDeviceGetCount(&mut n)), NOT_INITIALIZED);
}

#[test]
fn queued_work_waits_the_configured_delay() {
    child_passes("child_delay", &[("CUEMU_DELAY_US", "100000")]);
}

#[test]
#[ignore = "run in a child process by queued_work_waits_the_configured_delay"]
fn child_delay() {
    if !is_child("child_delay") {
        return;
    }
    let (emu, _ctx) = Emu::start(Emu::load_configured());
    let s = emu.stream(STREAM_NON_BLOCKING);
    let dev = emu.alloc(PAGE);
    let src = emu.pinned(PAGE);
    let start = Instant::now();
    for _ in 0..3 {
        assert_eq!(
            cu!(emu, cuMemcpyHtoDAsync_v2(dev, src.addr(), PAGE, s)),
            SUCCESS
        );
    }
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "queuing waited"
    );
    emu.sync(s);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------

#[test]
fn contexts_are_current_per_thread() {
    let emu = Emu::load();
    assert_eq!(cu!(emu, cuInit(0)), SUCCESS);
    let mut p = 0;
    let mut cur = null_mut();
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut p, 4096)), INVALID_CONTEXT);
    assert_eq!(emu.stat().no_context, 1);

    let ctx = emu.retain(0);
    assert_eq!(cu!(emu, cuCtxGetCurrent(&mut cur)), SUCCESS);
    assert!(cur.is_null());
    assert_eq!(cu!(emu, cuCtxPushCurrent_v2(ctx)), SUCCESS);
    assert_eq!(cu!(emu, cuCtxGetCurrent(&mut cur)), SUCCESS);
    assert_eq!(cur, ctx);
    let mut dev = -1;
    assert_eq!(cu!(emu, cuCtxGetDevice(&mut dev)), SUCCESS);
    assert_eq!(dev, 0);
    assert_eq!(cu!(emu, cuCtxPopCurrent_v2(&mut cur)), SUCCESS);
    assert_eq!(cur, ctx);
    assert_eq!(cu!(emu, cuCtxPopCurrent_v2(&mut cur)), INVALID_CONTEXT);
    assert_eq!(
        cu!(emu, cuCtxPushCurrent_v2(0xdead0 as Handle)),
        INVALID_CONTEXT
    );
    assert_eq!(
        cu!(emu, cuCtxSetCurrent(0xdead0 as Handle)),
        INVALID_CONTEXT
    );

    // SetCurrent replaces the top of the stack; NULL pops it.
    emu.bind(ctx);
    emu.bind(ctx);
    assert_eq!(cu!(emu, cuCtxPopCurrent_v2(&mut cur)), SUCCESS);
    assert_eq!(cu!(emu, cuCtxGetCurrent(&mut cur)), SUCCESS);
    assert!(cur.is_null());
    emu.bind(ctx);
    emu.free(emu.alloc(4096));

    // Another thread has no context until it binds one.
    let ctx_addr = ctx as usize;
    let before = emu.stat().no_context;
    thread::scope(|s| {
        s.spawn(|| {
            let mut p = 0;
            let mut st = null_mut();
            let buf = [0u8; 64];
            assert_eq!(cu!(emu, cuMemAlloc_v2(&mut p, 4096)), INVALID_CONTEXT);
            assert_eq!(cu!(emu, cuStreamCreate(&mut st, 0)), INVALID_CONTEXT);
            assert_eq!(cu!(emu, cuStreamSynchronize(null_mut())), INVALID_CONTEXT);
            assert_eq!(
                cu!(
                    emu,
                    cuMemHostRegister_v2(buf.as_ptr() as *mut c_void, 64, 0)
                ),
                INVALID_CONTEXT
            );
            assert_eq!(
                cu!(emu, cuMemcpyHtoD_v2(0x1000, buf.as_ptr().cast(), 64)),
                INVALID_CONTEXT
            );
            assert_eq!(cu!(emu, cuCtxSynchronize()), INVALID_CONTEXT);
            emu.bind(ctx_addr as Handle);
            emu.free(emu.alloc(4096));
        });
    });
    assert_eq!(emu.stat().no_context - before, 6);
}

#[test]
fn the_last_release_destroys_the_primary_context() {
    let (emu, ctx) = Emu::started();
    assert_eq!(emu.retain(0), ctx);
    let mut flags = 9;
    let mut active = 0;
    assert_eq!(
        cu!(emu, cuDevicePrimaryCtxGetState(0, &mut flags, &mut active)),
        SUCCESS
    );
    assert_eq!((flags, active), (0, 1));

    let p = emu.alloc(MIB);
    emu.htod(p, &[1, 2, 3]);
    let mut buf = vec![0u8; 2 * PAGE];
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(buf.as_mut_ptr().cast(), PAGE, 0)),
        SUCCESS
    );
    let s = emu.stream(0);
    assert_eq!(cu!(emu, cuDevicePrimaryCtxRelease_v2(0)), SUCCESS);
    assert_eq!(emu.dtoh(p, 3), [1, 2, 3], "one reference left");

    assert_eq!(cu!(emu, cuDevicePrimaryCtxRelease_v2(0)), SUCCESS);
    let st = emu.stat();
    assert_eq!((st.live_device_allocs, st.live_registered), (0, 0));
    let mut q = 0;
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut q, 4096)), CONTEXT_IS_DESTROYED);
    assert_eq!(cu!(emu, cuDevicePrimaryCtxRelease_v2(0)), INVALID_CONTEXT);
    assert_eq!(
        cu!(emu, cuDevicePrimaryCtxGetState(0, &mut flags, &mut active)),
        SUCCESS
    );
    assert_eq!(active, 0);

    // Retained again, it is a new context: nothing of the old one is left.
    assert_eq!(emu.retain(0), ctx);
    assert_eq!(cu!(emu, cuMemFree_v2(p)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuStreamQuery(s)), INVALID_HANDLE);
    assert_eq!(
        cu!(emu, cuMemHostUnregister(buf.as_mut_ptr().cast())),
        NOT_REGISTERED
    );
    emu.free(emu.alloc(4096));
}

#[test]
fn created_contexts_own_their_memory_and_streams() {
    let (emu, primary) = Emu::started();
    let kept = emu.alloc(MIB);
    emu.htod(kept, &[9, 8, 7]);

    let mut ctx: Handle = null_mut();
    assert_eq!(cu!(emu, cuCtxCreate_v2(&mut ctx, 0, 0)), SUCCESS);
    assert!(
        !ctx.is_null() && ctx != primary,
        "a new context, not the primary one"
    );
    let mut cur: Handle = null_mut();
    assert_eq!(cu!(emu, cuCtxGetCurrent(&mut cur)), SUCCESS);
    assert_eq!(cur, ctx, "current on the creating thread");
    let mut dev = -1;
    assert_eq!(cu!(emu, cuCtxGetDevice(&mut dev)), SUCCESS);
    assert_eq!(dev, 0);

    // Its memory works, and belongs to it.
    let mine = emu.alloc(MIB);
    let data = pattern(11, 5000);
    emu.htod(mine, &data);
    assert_eq!(emu.dtoh(mine, data.len()), data);
    let (rc, owner) = emu.ptr_attr::<usize>(PTR_CONTEXT, mine);
    assert_eq!((rc, owner), (SUCCESS, ctx as usize));
    let s = emu.stream(0);
    assert_eq!(emu.stat().live_device_allocs, 2);

    // Destroying it frees its memory and streams, pops it, and leaves the
    // primary context's alone.
    assert_eq!(cu!(emu, cuCtxDestroy_v2(ctx)), SUCCESS);
    assert_eq!(emu.stat().live_device_allocs, 1);
    assert_eq!(cu!(emu, cuCtxGetCurrent(&mut cur)), SUCCESS);
    assert_eq!(cur, primary, "the context below it is current again");
    assert_eq!(emu.dtoh(kept, 3), [9, 8, 7]);
    assert_eq!(cu!(emu, cuMemFree_v2(mine)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuStreamQuery(s)), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuCtxDestroy_v2(ctx)), CONTEXT_IS_DESTROYED);
    assert_eq!(cu!(emu, cuCtxSetCurrent(ctx)), SUCCESS, "a stale handle");
    let mut q = 0;
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut q, 4096)), CONTEXT_IS_DESTROYED);
    emu.bind(primary);

    // Bad arguments; the primary context is not cuCtxDestroy's.
    assert_eq!(cu!(emu, cuCtxCreate_v2(null_mut(), 0, 0)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuCtxCreate_v2(&mut ctx, 0, 7)), INVALID_DEVICE);
    assert_eq!(cu!(emu, cuCtxCreate_v2(&mut ctx, 1 << 8, 0)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuCtxDestroy_v2(primary)), INVALID_CONTEXT);
    assert_eq!(cu!(emu, cuCtxDestroy_v2(0x1234 as Handle)), INVALID_CONTEXT);
    emu.free(kept);
}

// ---------------------------------------------------------------------------
// Device memory
// ---------------------------------------------------------------------------

#[test]
fn batched_copies_run_in_stream_order() {
    let (emu, _ctx) = Emu::started();
    let s = emu.stream(STREAM_NON_BLOCKING);
    let n = 32 << 10;
    let dev = emu.alloc(4 * n);
    let (src, dst) = (emu.pinned(n), emu.pinned(2 * n));
    let data = pattern(21, n);
    src.write(&data);
    dst.write(&vec![0; 2 * n]);

    // Host to device, device to device, device to host: one batch, in order.
    let host = |p: *mut c_void| p as Ptr;
    let mut dsts = [
        dev,
        dev + 2 * n as u64,
        host(dst.addr()),
        host(dst.addr()) + n as u64,
    ];
    let mut srcs = [host(src.addr()), dev, dev + 2 * n as u64, dev + 100];
    let mut sizes = [n, n, n, 0];
    let mut attrs = [MemcpyAttributes {
        src_access_order: ORDER_STREAM,
        ..Default::default()
    }];
    let mut idx = [0usize];
    let mut fail = 0usize;
    let gate = Gate::default();
    emu.host_fn(s, gate_wait, &gate);
    assert_eq!(
        cu!(
            emu,
            cuMemcpyBatchAsync(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                4,
                attrs.as_mut_ptr(),
                idx.as_mut_ptr(),
                1,
                &mut fail,
                s
            )
        ),
        SUCCESS
    );
    assert_eq!(fail, usize::MAX);
    settle();
    assert_eq!(dst.read(), vec![0; 2 * n], "queued behind the gate");
    gate.open();
    emu.sync(s);
    let got = dst.read();
    assert_eq!(&got[..n], &data[..], "every byte through device memory");
    assert_eq!(&got[n..], &vec![0; n][..], "a zero-size copy moves nothing");
    let st = emu.stat();
    assert_eq!(
        (st.htod.async_bytes, st.dtoh.async_bytes),
        (n as u64, n as u64)
    );

    // Nothing is queued when one copy is bad: the failing index says which.
    sizes = [n, 4 * n + 1, n, 0];
    dst.write(&vec![0; 2 * n]);
    let call = |sizes: &mut [usize; 4],
                idx: &mut [usize],
                attrs: &mut [MemcpyAttributes],
                nattr,
                stream,
                fail: &mut usize| {
        let (mut d, mut s) = (dsts, srcs);
        cu!(
            emu,
            cuMemcpyBatchAsync(
                d.as_mut_ptr(),
                s.as_mut_ptr(),
                sizes.as_mut_ptr(),
                4,
                attrs.as_mut_ptr(),
                idx.as_mut_ptr(),
                nattr,
                fail,
                stream
            )
        )
    };
    assert_eq!(
        call(&mut sizes, &mut idx, &mut attrs, 1, s, &mut fail),
        INVALID_VALUE
    );
    assert_eq!(fail, 1);
    emu.sync(s);
    assert_eq!(
        dst.read(),
        vec![0; 2 * n],
        "the good copies were not queued"
    );

    // The call's own arguments: no failing copy.
    sizes = [n, n, n, 0];
    let legacy = 1usize as Handle;
    assert_eq!(
        call(&mut sizes, &mut idx, &mut attrs, 1, legacy, &mut fail),
        INVALID_VALUE
    );
    assert_eq!(fail, usize::MAX, "the legacy NULL stream is refused");
    assert_eq!(
        call(&mut sizes, &mut idx, &mut attrs, 0, s, &mut fail),
        INVALID_VALUE
    );
    let mut late = [1usize];
    assert_eq!(
        call(&mut sizes, &mut late, &mut attrs, 1, s, &mut fail),
        INVALID_VALUE
    );
    let mut bad = [MemcpyAttributes::default()];
    assert_eq!(
        call(&mut sizes, &mut idx, &mut bad, 1, s, &mut fail),
        INVALID_VALUE
    );

    // CUDA 13's form, without the failing index.
    dst.write(&vec![0; 2 * n]);
    assert_eq!(
        cu!(
            emu,
            cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                3,
                attrs.as_mut_ptr(),
                idx.as_mut_ptr(),
                1,
                s
            )
        ),
        SUCCESS
    );
    emu.sync(s);
    assert_eq!(&dst.read()[..n], &data[..]);
}

#[test]
fn allocations_are_aligned_and_not_zeroed() {
    let (emu, _ctx) = Emu::started();
    let mut p = 0;
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut p, 0)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuMemAlloc_v2(null_mut(), 4096)), INVALID_VALUE);

    let sizes = [1, 4096, 5000, 2 * MIB, 3 * MIB + 1];
    let ptrs: Vec<Ptr> = sizes.iter().map(|&n| emu.alloc(n)).collect();
    assert_eq!(emu.stat().live_device_allocs, sizes.len() as u64);
    for (&n, &p) in sizes.iter().zip(&ptrs) {
        let align = if n >= 2 * MIB { 2 * MIB } else { PAGE };
        assert_eq!(p % align as u64, 0, "{n} bytes at {p:#x}");
        assert!(
            emu.dtoh(p, n).iter().all(|&b| b == 0xA5),
            "{n} bytes are not 0xA5"
        );
        let (mut base, mut size) = (0, 0);
        assert_eq!(
            cu!(
                emu,
                cuMemGetAddressRange_v2(&mut base, &mut size, p + n as u64 - 1)
            ),
            SUCCESS
        );
        assert_eq!((base, size), (p, n));
        assert_eq!(
            cu!(emu, cuMemGetAddressRange_v2(null_mut(), null_mut(), p)),
            SUCCESS
        );
    }
    // The bytes past the asked size belong to no allocation.
    let (mut base, mut size) = (0, 0);
    assert_eq!(
        cu!(
            emu,
            cuMemGetAddressRange_v2(&mut base, &mut size, ptrs[0] + 1)
        ),
        NOT_FOUND
    );
    assert_eq!(
        cu!(emu, cuMemGetAddressRange_v2(&mut base, &mut size, 0x1000)),
        NOT_FOUND
    );

    assert_eq!(
        cu!(emu, cuMemFree_v2(ptrs[1] + 1)),
        INVALID_VALUE,
        "inside, not the start"
    );
    assert_eq!(cu!(emu, cuMemFree_v2(0x1000)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuMemFree_v2(0)), INVALID_VALUE);

    // Memory given back and taken again is poisoned again.
    emu.htod(ptrs[1], &[7; 4096]);
    emu.free(ptrs[1]);
    assert_eq!(
        cu!(emu, cuMemFree_v2(ptrs[1])),
        INVALID_VALUE,
        "freed twice"
    );
    let again = emu.alloc(4096);
    assert_eq!(again, ptrs[1], "first fit");
    assert!(emu.dtoh(again, 4096).iter().all(|&b| b == 0xA5));
}

#[test]
fn the_allocator_fills_up_and_coalesces() {
    let (emu, _ctx) = Emu::started();
    let quarter: Vec<Ptr> = (0..4).map(|_| emu.alloc(64 * MIB)).collect();
    let mut p = 0;
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut p, 1)), OUT_OF_MEMORY);
    let (mut free, mut total) = (1, 0);
    assert_eq!(cu!(emu, cuMemGetInfo_v2(&mut free, &mut total)), SUCCESS);
    assert_eq!((free, total), (0, 256 * MIB));

    // Two neighbours freed make room for one allocation of both.
    emu.free(quarter[1]);
    emu.free(quarter[2]);
    assert_eq!(
        cu!(emu, cuMemAlloc_v2(&mut p, 128 * MIB + 1)),
        OUT_OF_MEMORY
    );
    let half = emu.alloc(128 * MIB);
    assert_eq!(half, quarter[1]);
    emu.free(half);
    emu.free(quarter[0]);
    emu.free(quarter[3]);
    assert_eq!(cu!(emu, cuMemGetInfo_v2(&mut free, &mut total)), SUCCESS);
    assert_eq!(free, 256 * MIB);
    let all = emu.alloc(256 * MIB);
    assert_eq!(all, quarter[0]);
    emu.free(all);
    assert_eq!(
        cu!(emu, cuMemAlloc_v2(&mut p, 256 * MIB + 1)),
        OUT_OF_MEMORY
    );
    assert_eq!(cu!(emu, cuMemAlloc_v2(&mut p, usize::MAX)), OUT_OF_MEMORY);
}

#[test]
fn device_pointers_fault_on_the_cpu() {
    let out = run_child("child_read_device_pointer", &[]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
#[ignore = "run in a child process by device_pointers_fault_on_the_cpu"]
fn child_read_device_pointer() {
    if !is_child("child_read_device_pointer") {
        return;
    }
    let (emu, _ctx) = Emu::start(Emu::load_configured());
    let p = emu.alloc(PAGE);
    emu.htod(p, &[1; PAGE]);
    // SAFETY: None: the read must fault, as it would on a GPU's memory.
    let byte = unsafe { std::ptr::read_volatile(p as *const u8) };
    println!("read {byte} through a device pointer");
}

#[test]
fn synchronous_copies_land_and_stay_in_bounds() {
    let (emu, _ctx) = Emu::started();
    let n = MIB;
    let (a, b) = (emu.alloc(n), emu.alloc(n));
    let data = pattern(1, 64 << 10);
    emu.htod(a + 4096, &data);
    assert_eq!(emu.dtoh(a + 4096, data.len()), data);
    assert_eq!(
        emu.dtoh(a, 4096),
        vec![0xA5; 4096],
        "the bytes before are untouched"
    );

    assert_eq!(cu!(emu, cuMemcpyDtoD_v2(b, a + 4096, data.len())), SUCCESS);
    assert_eq!(emu.dtoh(b, data.len()), data);

    // cuMemcpy tells host from device by address.
    let other = pattern(2, 8192);
    let mut back = vec![0u8; 8192];
    let host = |v: &[u8]| v.as_ptr() as Ptr;
    assert_eq!(cu!(emu, cuMemcpy(a, host(&other), 8192)), SUCCESS);
    assert_eq!(cu!(emu, cuMemcpy(b + 100, a, 8192)), SUCCESS);
    assert_eq!(
        cu!(emu, cuMemcpy(back.as_mut_ptr() as Ptr, b + 100, 8192)),
        SUCCESS
    );
    assert_eq!(back, other);
    let mut copy = vec![0u8; 8192];
    assert_eq!(
        cu!(emu, cuMemcpy(copy.as_mut_ptr() as Ptr, host(&other), 8192)),
        SUCCESS
    );
    assert_eq!(copy, other);

    // Refused: past the end, a freed allocation, the gap after an
    // allocation's asked size, host ranges on device addresses, NULL.
    let small = emu.alloc(1000);
    let gone = emu.alloc(4096);
    emu.free(gone);
    let before_a = emu.dtoh(a, n);
    let before_b = emu.dtoh(b, n);
    let buf = vec![0x33u8; 2 * PAGE];
    let src = buf.as_ptr().cast();
    let mut sink = vec![0u8; 2 * PAGE];
    let dst = sink.as_mut_ptr().cast();
    for (what, rc) in [
        (
            "HtoD past the end",
            cu!(emu, cuMemcpyHtoD_v2(a + n as u64 - 10, src, 20)),
        ),
        (
            "HtoD into freed memory",
            cu!(emu, cuMemcpyHtoD_v2(gone, src, 16)),
        ),
        (
            "HtoD past the asked size",
            cu!(emu, cuMemcpyHtoD_v2(small + 990, src, 20)),
        ),
        (
            "HtoD into no allocation",
            cu!(emu, cuMemcpyHtoD_v2(0x1000, src, 16)),
        ),
        (
            "HtoD from a device address",
            cu!(emu, cuMemcpyHtoD_v2(a, b as *const c_void, 16)),
        ),
        (
            "HtoD from NULL",
            cu!(emu, cuMemcpyHtoD_v2(a, std::ptr::null(), 16)),
        ),
        (
            "DtoH past the end",
            cu!(emu, cuMemcpyDtoH_v2(dst, b + n as u64 - 4, 8)),
        ),
        (
            "DtoH into a device address",
            cu!(emu, cuMemcpyDtoH_v2(a as *mut c_void, b, 16)),
        ),
        (
            "DtoD across two allocations",
            cu!(emu, cuMemcpyDtoD_v2(a + n as u64 - 8, b, 16)),
        ),
        (
            "DtoD from freed memory",
            cu!(emu, cuMemcpyDtoD_v2(a, gone, 16)),
        ),
        (
            "cuMemcpy past the end",
            cu!(emu, cuMemcpy(a + n as u64 - 8, host(&buf), 16)),
        ),
        (
            "HtoD wrapping around",
            cu!(emu, cuMemcpyHtoD_v2(a, src, usize::MAX)),
        ),
    ] {
        assert_eq!(rc, INVALID_VALUE, "{what}");
    }
    assert_eq!(emu.dtoh(a, n), before_a);
    assert_eq!(emu.dtoh(b, n), before_b);
    assert_eq!(sink, vec![0; 2 * PAGE]);

    // Zero bytes: nothing to check, nothing done.
    assert_eq!(
        cu!(emu, cuMemcpyHtoD_v2(0x1000, std::ptr::null(), 0)),
        SUCCESS
    );
}

#[test]
fn memset_runs_on_the_null_stream() {
    let (emu, _ctx) = Emu::started();
    let n = 64 << 10;
    let p = emu.alloc(n);
    assert_eq!(cu!(emu, cuMemsetD8_v2(p, 0x11, n)), SUCCESS);
    assert_eq!(cu!(emu, cuMemsetD8_v2(p + 10, 0x22, 10)), SUCCESS);
    let mut want = vec![0x11u8; n];
    want[10..20].fill(0x22);
    assert_eq!(emu.dtoh(p, n), want, "a synchronous copy waits for it");
    assert_eq!(
        cu!(emu, cuMemsetD8_v2(p + n as u64 - 1, 0, 2)),
        INVALID_VALUE
    );
    assert_eq!(cu!(emu, cuMemsetD8_v2(0x1000, 0, 2)), INVALID_VALUE);

    // It returns before it is done: a non-blocking stream, which does not
    // wait for the NULL stream, still reads the old bytes.
    let gate = Gate::default();
    emu.host_fn(null_mut(), gate_wait, &gate);
    assert_eq!(cu!(emu, cuMemsetD8_v2(p, 0x77, n)), SUCCESS);
    let s = emu.stream(STREAM_NON_BLOCKING);
    let out = emu.pinned(n);
    assert_eq!(cu!(emu, cuMemcpyDtoHAsync_v2(out.addr(), p, n, s)), SUCCESS);
    emu.sync(s);
    assert_eq!(out.read(), want);
    gate.open();
    assert_eq!(emu.dtoh(p, n), vec![0x77; n]);
}

// ---------------------------------------------------------------------------
// Streams and asynchronous copies
// ---------------------------------------------------------------------------

#[test]
fn async_copies_run_later_in_order() {
    let (emu, _ctx) = Emu::started();
    let s = emu.stream(STREAM_NON_BLOCKING);
    let n = 64 << 10;
    let dev = emu.alloc(n);
    let (src, dst) = (emu.pinned(n), emu.pinned(n));
    let data = pattern(3, n);
    src.write(&data);
    dst.write(&vec![0; n]);

    let gate = Gate::default();
    emu.host_fn(s, gate_wait, &gate);
    assert_eq!(
        cu!(emu, cuMemcpyHtoDAsync_v2(dev, src.addr(), n, s)),
        SUCCESS
    );
    assert_eq!(
        cu!(emu, cuMemcpyDtoHAsync_v2(dst.addr(), dev, n, s)),
        SUCCESS
    );
    assert_eq!(cu!(emu, cuStreamQuery(s)), NOT_READY);
    settle();
    assert_eq!(dst.read(), vec![0; n], "read before synchronizing: stale");
    gate.open();
    emu.sync(s);
    assert_eq!(cu!(emu, cuStreamQuery(s)), SUCCESS);
    assert_eq!(dst.read(), data);

    // Overlapping operations land in the order they were queued.
    let (p1, p2) = (emu.pinned(n), emu.pinned(2000));
    let (d1, d2) = (pattern(4, n), pattern(5, 2000));
    p1.write(&d1);
    p2.write(&d2);
    let mut want = d1.clone();
    assert_eq!(
        cu!(emu, cuMemcpyHtoDAsync_v2(dev, p1.addr(), n, s)),
        SUCCESS
    );
    assert_eq!(cu!(emu, cuMemsetD8Async(dev + 100, 7, 1000, s)), SUCCESS);
    want[100..1100].fill(7);
    assert_eq!(
        cu!(emu, cuMemcpyHtoDAsync_v2(dev + 500, p2.addr(), 2000, s)),
        SUCCESS
    );
    want[500..2500].copy_from_slice(&d2);
    assert_eq!(
        cu!(emu, cuMemcpyDtoDAsync_v2(dev + 10000, dev, 3000, s)),
        SUCCESS
    );
    want.copy_within(0..3000, 10000);
    assert_eq!(
        cu!(emu, cuMemcpyAsync(dev + 20000, dev + 600, 100, s)),
        SUCCESS
    );
    want.copy_within(600..700, 20000);
    assert_eq!(
        cu!(emu, cuMemcpyDtoHAsync_v2(dst.addr(), dev, n, s)),
        SUCCESS
    );
    emu.sync(s);
    assert_eq!(dst.read(), want);

    // Bounds are checked when the work is queued.
    assert_eq!(
        cu!(emu, cuMemcpyHtoDAsync_v2(dev + n as u64, p1.addr(), 1, s)),
        INVALID_VALUE
    );
    assert_eq!(cu!(emu, cuMemsetD8Async(dev, 0, n + 1, s)), INVALID_VALUE);
    assert_eq!(
        cu!(emu, cuMemcpyDtoDAsync_v2(dev, 0x1000, 8, s)),
        INVALID_VALUE
    );
}

#[test]
fn async_copies_of_pageable_memory_are_synchronous() {
    let (emu, _ctx) = Emu::started();
    let s = emu.stream(STREAM_NON_BLOCKING);
    let n = 32 << 10;
    let dev = emu.alloc(n);
    let data = pattern(6, n);
    let gate = Gate::default();
    let opened = AtomicBool::new(false);
    emu.host_fn(s, gate_wait, &gate);
    thread::scope(|sc| {
        sc.spawn(|| {
            settle();
            opened.store(true, SeqCst);
            gate.open();
        });
        // Returns once the earlier work and the copy are done.
        assert_eq!(
            cu!(emu, cuMemcpyHtoDAsync_v2(dev, data.as_ptr().cast(), n, s)),
            SUCCESS
        );
        assert!(
            opened.load(SeqCst),
            "returned before the stream's earlier work"
        );
    });
    assert_eq!(cu!(emu, cuStreamQuery(s)), SUCCESS);
    let mut back = vec![0u8; n];
    assert_eq!(
        cu!(
            emu,
            cuMemcpyDtoHAsync_v2(back.as_mut_ptr().cast(), dev, n, s)
        ),
        SUCCESS
    );
    assert_eq!(back, data, "landed without synchronizing");

    let st = emu.stat();
    assert_eq!((st.htod.pageable_calls, st.htod.async_calls), (1, 0));
    assert_eq!(
        (st.dtoh.pageable_calls, st.dtoh.pageable_bytes),
        (1, n as u64)
    );
}

#[test]
fn the_null_stream_orders_with_blocking_streams_only() {
    let (emu, _ctx) = Emu::started();
    let blocking = emu.stream(0);
    let nonblocking = emu.stream(STREAM_NON_BLOCKING);
    let null = null_mut();
    let mut flags = 9;
    assert_eq!(cu!(emu, cuStreamGetFlags(blocking, &mut flags)), SUCCESS);
    assert_eq!(flags, 0);
    assert_eq!(cu!(emu, cuStreamGetFlags(nonblocking, &mut flags)), SUCCESS);
    assert_eq!(flags, STREAM_NON_BLOCKING);

    // The NULL stream waits for a blocking stream's earlier work...
    let (gate, ran) = (Gate::default(), AtomicBool::new(false));
    emu.host_fn(blocking, gate_wait, &gate);
    emu.host_fn(null, set_flag, &ran);
    settle();
    assert!(!ran.load(SeqCst));
    assert_eq!(cu!(emu, cuStreamQuery(null)), NOT_READY);
    gate.open();
    emu.sync(null);
    assert!(ran.load(SeqCst));

    // ...and a blocking stream for the NULL stream's...
    let (gate, ran) = (Gate::default(), AtomicBool::new(false));
    emu.host_fn(null, gate_wait, &gate);
    emu.host_fn(blocking, set_flag, &ran);
    settle();
    assert!(!ran.load(SeqCst));
    gate.open();
    emu.sync(blocking);
    assert!(ran.load(SeqCst));

    // ...a non-blocking stream for neither...
    let (gate, ran) = (Gate::default(), AtomicBool::new(false));
    emu.host_fn(null, gate_wait, &gate);
    emu.host_fn(nonblocking, set_flag, &ran);
    emu.sync(nonblocking);
    assert!(ran.load(SeqCst));
    gate.open();
    emu.sync(null);

    // ...and a synchronous copy for the NULL stream, so for blocking
    // streams too.
    let (gate, opened) = (Gate::default(), AtomicBool::new(false));
    let dev = emu.alloc(PAGE);
    emu.host_fn(blocking, gate_wait, &gate);
    thread::scope(|sc| {
        sc.spawn(|| {
            settle();
            opened.store(true, SeqCst);
            gate.open();
        });
        emu.htod(dev, &[1; 16]);
        assert!(opened.load(SeqCst), "the copy did not wait");
    });
    assert_eq!(cu!(emu, cuCtxSynchronize()), SUCCESS);
    for s in [blocking, nonblocking, null] {
        assert_eq!(cu!(emu, cuStreamQuery(s)), SUCCESS);
    }
}

#[test]
fn host_functions_run_in_order_and_may_not_call_cuda() {
    let (emu, _ctx) = Emu::started();
    let s = emu.stream(STREAM_NON_BLOCKING);
    let log = Mutex::new(Vec::new());
    let steps: Vec<Step<'_>> = (0..20).map(|n| Step { log: &log, n }).collect();
    for (i, step) in steps.iter().enumerate() {
        let stream = if i % 2 == 0 { s } else { null_mut() };
        emu.host_fn(stream, record_step, step);
        emu.sync(stream);
    }
    let gate = Gate::default();
    emu.host_fn(s, gate_wait, &gate);
    for step in &steps {
        emu.host_fn(s, record_step, step);
    }
    gate.open();
    emu.sync(s);
    let want: Vec<u32> = (0..20).chain(0..20).collect();
    assert_eq!(*log.lock().unwrap(), want);

    let reentry = Reentry {
        synchronize: emu.api.cuCtxSynchronize,
        got: AtomicU32::new(u32::MAX),
    };
    emu.host_fn(s, call_cuda, &reentry);
    emu.sync(s);
    assert_eq!(reentry.got.load(SeqCst), NOT_PERMITTED);
    assert_eq!(
        cu!(emu, cuLaunchHostFunc(s, None, null_mut())),
        INVALID_VALUE
    );
}

#[test]
fn streams_refuse_bad_handles() {
    let (emu, _ctx) = Emu::started();
    let mut h = null_mut();
    assert_eq!(cu!(emu, cuStreamCreate(&mut h, 2)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuStreamCreate(null_mut(), 0)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuStreamDestroy_v2(null_mut())), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuStreamDestroy_v2(1 as Handle)), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuStreamQuery(0xbad0 as Handle)), INVALID_HANDLE);

    // The legacy and per-thread handles are the NULL stream.
    for special in [1usize, 2] {
        assert_eq!(cu!(emu, cuStreamSynchronize(special as Handle)), SUCCESS);
    }

    // A destroyed stream still finishes its work, then is gone.
    let s = emu.stream(STREAM_NON_BLOCKING);
    let dev = emu.alloc(PAGE);
    let gate = Gate::default();
    emu.host_fn(s, gate_wait, &gate);
    assert_eq!(cu!(emu, cuMemsetD8Async(dev, 0x5a, PAGE, s)), SUCCESS);
    assert_eq!(cu!(emu, cuStreamDestroy_v2(s)), SUCCESS);
    assert_eq!(cu!(emu, cuStreamQuery(s)), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuMemsetD8Async(dev, 0, PAGE, s)), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuStreamDestroy_v2(s)), INVALID_HANDLE);
    gate.open();
    assert_eq!(cu!(emu, cuCtxSynchronize()), SUCCESS);
    assert_eq!(emu.dtoh(dev, PAGE), vec![0x5a; PAGE]);
}

#[test]
fn events_mark_and_order_stream_work() {
    let (emu, _ctx) = Emu::started();
    let (a, b) = (
        emu.stream(STREAM_NON_BLOCKING),
        emu.stream(STREAM_NON_BLOCKING),
    );
    let mut ev = null_mut();
    assert_eq!(cu!(emu, cuEventCreate(&mut ev, 8)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuEventCreate(&mut ev, 2)), SUCCESS);
    assert_eq!(cu!(emu, cuEventQuery(ev)), SUCCESS, "never recorded");

    let (gate, ran) = (Gate::default(), AtomicBool::new(false));
    emu.host_fn(a, gate_wait, &gate);
    assert_eq!(cu!(emu, cuEventRecord(ev, a)), SUCCESS);
    assert_eq!(cu!(emu, cuEventQuery(ev)), NOT_READY);
    assert_eq!(cu!(emu, cuStreamWaitEvent(b, ev, 1)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuStreamWaitEvent(b, ev, 0)), SUCCESS);
    emu.host_fn(b, set_flag, &ran);
    settle();
    assert!(!ran.load(SeqCst), "b ran past the event");
    assert_eq!(cu!(emu, cuStreamQuery(b)), NOT_READY);
    gate.open();
    assert_eq!(cu!(emu, cuEventSynchronize(ev)), SUCCESS);
    assert_eq!(cu!(emu, cuEventQuery(ev)), SUCCESS);
    emu.sync(b);
    assert!(ran.load(SeqCst));

    assert_eq!(cu!(emu, cuEventDestroy_v2(ev)), SUCCESS);
    assert_eq!(cu!(emu, cuEventDestroy_v2(ev)), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuEventQuery(0xbad0 as Handle)), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuEventRecord(0xbad0 as Handle, a)), INVALID_HANDLE);
}

// ---------------------------------------------------------------------------
// Host memory
// ---------------------------------------------------------------------------

#[test]
fn host_registration_is_exclusive_and_exact() {
    let (emu, _ctx) = Emu::started();
    let mut buf = vec![0u8; 64 << 10];
    let p = buf.as_mut_ptr();
    let at = |off: usize| p.wrapping_add(off).cast::<c_void>();
    assert_eq!(
        cu!(
            emu,
            cuMemHostRegister_v2(at(0), 16 << 10, HOSTALLOC_PORTABLE)
        ),
        SUCCESS
    );
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(at(8 << 10), 16 << 10, 0)),
        ALREADY_REGISTERED
    );
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(at(4096), 100, 0)),
        ALREADY_REGISTERED
    );
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(at(16 << 10), 4096, 0)),
        SUCCESS,
        "adjacent"
    );
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(at(32 << 10), 4096, 0x10)),
        INVALID_VALUE
    );
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(at(32 << 10), 0, 0)),
        INVALID_VALUE
    );
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(null_mut(), 4096, 0)),
        INVALID_VALUE
    );
    let dev = emu.alloc(PAGE);
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(dev as *mut c_void, 4096, 0)),
        INVALID_VALUE
    );
    assert_eq!(emu.stat().live_registered, 2);

    let mut dptr = 0;
    assert_eq!(
        cu!(emu, cuMemHostGetDevicePointer_v2(&mut dptr, at(100), 0)),
        SUCCESS
    );
    assert_eq!(dptr, at(100) as Ptr, "unified addressing: the same address");
    assert_eq!(
        cu!(emu, cuMemHostGetDevicePointer_v2(&mut dptr, at(100), 1)),
        INVALID_VALUE
    );
    assert_eq!(
        cu!(
            emu,
            cuMemHostGetDevicePointer_v2(&mut dptr, at(40 << 10), 0)
        ),
        INVALID_VALUE
    );

    // Registered memory is page-locked: its async copies are queued.
    let s = emu.stream(STREAM_NON_BLOCKING);
    assert_eq!(cu!(emu, cuMemcpyHtoDAsync_v2(dev, at(0), PAGE, s)), SUCCESS);
    emu.sync(s);
    assert_eq!(emu.stat().htod.async_calls, 1);

    assert_eq!(
        cu!(emu, cuMemHostUnregister(at(4096))),
        NOT_REGISTERED,
        "not the start"
    );
    assert_eq!(cu!(emu, cuMemHostUnregister(at(0))), SUCCESS);
    assert_eq!(cu!(emu, cuMemHostUnregister(at(0))), NOT_REGISTERED);
    assert_eq!(cu!(emu, cuMemHostUnregister(at(16 << 10))), SUCCESS);
    let st = emu.stat();
    assert_eq!(
        (st.host_register, st.host_unregister, st.live_registered),
        (2, 2, 0)
    );
}

#[test]
fn host_allocations() {
    let (emu, _ctx) = Emu::started();
    let mut h = null_mut();
    assert_eq!(cu!(emu, cuMemHostAlloc(&mut h, 10000, 8)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuMemHostAlloc(&mut h, 0, 0)), INVALID_VALUE);
    let flags = HOSTALLOC_PORTABLE | HOSTALLOC_DEVICEMAP;
    assert_eq!(cu!(emu, cuMemHostAlloc(&mut h, 10000, flags)), SUCCESS);
    assert_eq!(h as usize % PAGE, 0);
    assert_eq!(
        cu!(emu, cuMemHostRegister_v2(h, 4096, 0)),
        ALREADY_REGISTERED
    );
    let mut dptr = 0;
    assert_eq!(
        cu!(emu, cuMemHostGetDevicePointer_v2(&mut dptr, h, 0)),
        SUCCESS
    );
    assert_eq!(dptr, h as Ptr);
    // A mapped host address serves as a device address too.
    let dev = emu.alloc(PAGE);
    emu.htod(dev, &[9; 100]);
    assert_eq!(cu!(emu, cuMemcpyDtoD_v2(dptr, dev, 100)), SUCCESS);
    assert_eq!(cu!(emu, cuCtxSynchronize()), SUCCESS);
    // SAFETY: 100 bytes of the allocation, written by the finished copy.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(h.cast::<u8>(), 100) },
        [9; 100]
    );

    let mut buf = [0u8; 16];
    assert_eq!(
        cu!(emu, cuMemFreeHost(h.cast::<u8>().wrapping_add(1).cast())),
        INVALID_VALUE
    );
    assert_eq!(
        cu!(emu, cuMemFreeHost(buf.as_mut_ptr().cast())),
        INVALID_VALUE
    );
    assert_eq!(cu!(emu, cuMemFreeHost(h)), SUCCESS);
    assert_eq!(cu!(emu, cuMemFreeHost(h)), INVALID_VALUE);
    assert_eq!(cu!(emu, cuMemAllocHost_v2(&mut h, 100)), SUCCESS);
    assert_eq!(cu!(emu, cuMemFreeHost(h)), SUCCESS);
    assert_eq!(emu.stat().host_alloc, 2);
}

// ---------------------------------------------------------------------------
// Pointer attributes
// ---------------------------------------------------------------------------

#[test]
fn pointer_attributes() {
    let (emu, ctx) = Emu::started();
    let (a, b) = (emu.alloc(3 * MIB), emu.alloc(PAGE));
    let inside = a + 100;
    assert_eq!(
        emu.ptr_attr::<u32>(PTR_MEMORY_TYPE, inside),
        (SUCCESS, MEMORYTYPE_DEVICE)
    );
    assert_eq!(
        emu.ptr_attr::<usize>(PTR_CONTEXT, inside),
        (SUCCESS, ctx as usize)
    );
    assert_eq!(
        emu.ptr_attr::<c_int>(PTR_DEVICE_ORDINAL, inside),
        (SUCCESS, 0)
    );
    assert_eq!(
        emu.ptr_attr::<Ptr>(PTR_RANGE_START_ADDR, inside),
        (SUCCESS, a)
    );
    assert_eq!(
        emu.ptr_attr::<usize>(PTR_RANGE_SIZE, inside),
        (SUCCESS, 3 * MIB)
    );
    assert_eq!(
        emu.ptr_attr::<Ptr>(PTR_DEVICE_POINTER, inside),
        (SUCCESS, inside)
    );
    assert_eq!(emu.ptr_attr::<u32>(PTR_IS_MANAGED, inside), (SUCCESS, 0));
    assert_eq!(
        emu.ptr_attr::<u32>(PTR_IS_GPU_DIRECT_RDMA_CAPABLE, inside),
        (SUCCESS, 1)
    );
    assert_eq!(
        emu.ptr_attr::<usize>(PTR_HOST_POINTER, inside).0,
        INVALID_VALUE
    );
    assert_eq!(emu.ptr_attr::<u64>(PTR_P2P_TOKENS, inside).0, INVALID_VALUE);
    let (id_a, id_b) = (
        emu.ptr_attr::<u64>(PTR_BUFFER_ID, a),
        emu.ptr_attr::<u64>(PTR_BUFFER_ID, b),
    );
    assert_eq!((id_a.0, id_b.0), (SUCCESS, SUCCESS));
    assert_ne!(id_a.1, id_b.1);

    let one: u32 = 1;
    let one_ptr = (&one as *const u32).cast();
    assert_eq!(emu.ptr_attr::<u32>(PTR_SYNC_MEMOPS, a), (SUCCESS, 0));
    assert_eq!(
        cu!(emu, cuPointerSetAttribute(one_ptr, PTR_SYNC_MEMOPS, a)),
        SUCCESS
    );
    assert_eq!(emu.ptr_attr::<u32>(PTR_SYNC_MEMOPS, a), (SUCCESS, 1));
    assert_eq!(
        cu!(emu, cuPointerSetAttribute(one_ptr, PTR_IS_MANAGED, a)),
        INVALID_VALUE
    );

    // Page-locked host memory is host memory; other memory is unknown.
    let pinned = emu.pinned(PAGE);
    let h = pinned.addr() as Ptr;
    assert_eq!(
        emu.ptr_attr::<u32>(PTR_MEMORY_TYPE, h + 8),
        (SUCCESS, MEMORYTYPE_HOST)
    );
    assert_eq!(
        emu.ptr_attr::<usize>(PTR_HOST_POINTER, h + 8),
        (SUCCESS, h as usize + 8)
    );
    assert_eq!(
        emu.ptr_attr::<Ptr>(PTR_RANGE_START_ADDR, h + 8),
        (SUCCESS, h)
    );
    let plain = [0u8; 64];
    assert_eq!(
        emu.ptr_attr::<u32>(PTR_MEMORY_TYPE, plain.as_ptr() as Ptr)
            .0,
        INVALID_VALUE
    );
    emu.free(b);
    assert_eq!(
        emu.ptr_attr::<u32>(PTR_MEMORY_TYPE, b).0,
        INVALID_VALUE,
        "freed"
    );
    assert_eq!(
        cu!(emu, cuPointerGetAttribute(null_mut(), PTR_MEMORY_TYPE, a)),
        INVALID_VALUE
    );

    // Several at once; an unknown address gets the documented defaults.
    let mut attrs = [
        PTR_MEMORY_TYPE,
        PTR_CONTEXT,
        PTR_DEVICE_ORDINAL,
        PTR_RANGE_SIZE,
    ];
    let (mut ty, mut cx, mut ord, mut size) = (0u32, 0usize, 0 as c_int, 0usize);
    let mut data: [*mut c_void; 4] = [
        (&mut ty as *mut u32).cast(),
        (&mut cx as *mut usize).cast(),
        (&mut ord as *mut c_int).cast(),
        (&mut size as *mut usize).cast(),
    ];
    assert_eq!(
        cu!(
            emu,
            cuPointerGetAttributes(4, attrs.as_mut_ptr(), data.as_mut_ptr(), inside)
        ),
        SUCCESS
    );
    assert_eq!(
        (ty, cx, ord, size),
        (MEMORYTYPE_DEVICE, ctx as usize, 0, 3 * MIB)
    );
    let plain_ptr = plain.as_ptr() as Ptr;
    assert_eq!(
        cu!(
            emu,
            cuPointerGetAttributes(4, attrs.as_mut_ptr(), data.as_mut_ptr(), plain_ptr)
        ),
        SUCCESS
    );
    assert_eq!((ty, cx, ord, size), (0, 0, -2, 0));
    attrs[3] = PTR_P2P_TOKENS;
    assert_eq!(
        cu!(
            emu,
            cuPointerGetAttributes(4, attrs.as_mut_ptr(), data.as_mut_ptr(), inside)
        ),
        INVALID_VALUE
    );

    // No context is needed to ask.
    thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(
                emu.ptr_attr::<u32>(PTR_MEMORY_TYPE, inside),
                (SUCCESS, MEMORYTYPE_DEVICE)
            );
        });
    });
}

// ---------------------------------------------------------------------------
// dma-buf export
// ---------------------------------------------------------------------------

#[test]
fn dmabuf_export_checks_its_range() {
    let (emu, _ctx) = Emu::started();
    let p = emu.alloc(4 * PAGE);
    let small = emu.alloc(100);
    let mut fd: c_int = -1;
    let out: *mut c_void = (&mut fd as *mut c_int).cast();
    let export = |p: Ptr, n: usize, ty: c_int, flags: u64| {
        cu!(emu, cuMemGetHandleForAddressRange(out, p, n, ty, flags))
    };
    for (what, rc) in [
        ("handle type", export(p, PAGE, 2, 0)),
        ("flags", export(p, PAGE, DMA_BUF_FD, 2)),
        ("unaligned start", export(p + 100, PAGE, DMA_BUF_FD, 0)),
        ("unaligned size", export(p, 100, DMA_BUF_FD, 0)),
        ("empty", export(p, 0, DMA_BUF_FD, 0)),
        (
            "past the end",
            export(p + PAGE as u64, 4 * PAGE, DMA_BUF_FD, 0),
        ),
        ("no allocation", export(0x1000, PAGE, DMA_BUF_FD, 0)),
        (
            "NULL handle",
            cu!(
                emu,
                cuMemGetHandleForAddressRange(null_mut(), p, PAGE, DMA_BUF_FD, 0)
            ),
        ),
    ] {
        assert_eq!(rc, INVALID_VALUE, "{what}");
    }
    // A small allocation's page is its own: it can be exported whole.
    let want = if udmabuf_opens() {
        SUCCESS
    } else {
        NOT_SUPPORTED
    };
    assert_eq!(export(small, PAGE, DMA_BUF_FD, 0), want);
    assert_eq!(
        export(p + PAGE as u64, 2 * PAGE, DMA_BUF_FD, 1),
        want,
        "PCIe mapping flag"
    );
    if want == SUCCESS {
        // SAFETY: fd is the dma-buf just exported, ours to close.
        unsafe { libc::close(fd) };
    }
    assert_eq!(
        emu.stat().dmabuf_exports,
        if want == SUCCESS { 2 } else { 0 }
    );

    thread::scope(|s| {
        s.spawn(|| {
            let mut fd: c_int = -1;
            let out: *mut c_void = (&mut fd as *mut c_int).cast();
            let rc = cu!(
                emu,
                cuMemGetHandleForAddressRange(out, p, PAGE, DMA_BUF_FD, 0)
            );
            assert_eq!(rc, INVALID_CONTEXT);
        });
    });
}

#[test]
fn dmabuf_export_is_refused_without_udmabuf() {
    child_passes(
        "child_no_udmabuf",
        &[("CUEMU_UDMABUF", "/nonexistent/udmabuf")],
    );
}

#[test]
#[ignore = "run in a child process by dmabuf_export_is_refused_without_udmabuf"]
fn child_no_udmabuf() {
    if !is_child("child_no_udmabuf") {
        return;
    }
    let (emu, _ctx) = Emu::start(Emu::load_configured());
    assert_eq!(emu.attr(DEV_DMA_BUF_SUPPORTED, 0), (SUCCESS, 0));
    let p = emu.alloc(4 * PAGE);
    let mut fd: c_int = -1;
    let out: *mut c_void = (&mut fd as *mut c_int).cast();
    assert_eq!(
        cu!(
            emu,
            cuMemGetHandleForAddressRange(out, p, PAGE, DMA_BUF_FD, 0)
        ),
        NOT_SUPPORTED
    );
    assert_eq!(fd, -1);
    assert_eq!(emu.stat().dmabuf_exports, 0);
}

#[test]
fn dmabuf_export_reports_a_failed_udmabuf_call() {
    child_passes("child_udmabuf_fails", &[("CUEMU_UDMABUF", "/dev/null")]);
}

#[test]
#[ignore = "run in a child process by dmabuf_export_reports_a_failed_udmabuf_call"]
fn child_udmabuf_fails() {
    if !is_child("child_udmabuf_fails") {
        return;
    }
    // /dev/null opens, so export is attempted, and its ioctl fails.
    let (emu, _ctx) = Emu::start(Emu::load_configured());
    assert_eq!(emu.attr(DEV_DMA_BUF_SUPPORTED, 0), (SUCCESS, 1));
    let p = emu.alloc(4 * PAGE);
    let mut fd: c_int = -1;
    let out: *mut c_void = (&mut fd as *mut c_int).cast();
    let rc = cu!(
        emu,
        cuMemGetHandleForAddressRange(out, p, PAGE, DMA_BUF_FD, 0)
    );
    assert_eq!(rc, OPERATING_SYSTEM);
    assert_eq!(fd, -1);
    assert_eq!(emu.stat().dmabuf_exports, 0);
}

/// Where /dev/udmabuf opens: what the dma-buf's pages hold is what the
/// copies see, both ways.
#[test]
fn dmabuf_shares_pages_with_device_memory() {
    if !udmabuf_opens() {
        eprintln!("skipped: /dev/udmabuf does not open here");
        return;
    }
    let (emu, _ctx) = Emu::started();
    let p = emu.alloc(4 * PAGE);
    let (at, n) = (p + PAGE as u64, 2 * PAGE);
    let mut fd: c_int = -1;
    let out: *mut c_void = (&mut fd as *mut c_int).cast();
    assert_eq!(
        cu!(
            emu,
            cuMemGetHandleForAddressRange(out, at, n, DMA_BUF_FD, 0)
        ),
        SUCCESS
    );
    // SAFETY: fcntl on the fd just returned.
    assert_ne!(
        unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC,
        0
    );
    // SAFETY: Maps the dma-buf, n bytes, unmapped below.
    let map = unsafe {
        libc::mmap(
            null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let map = map.cast::<u8>();

    let data = pattern(7, n);
    // SAFETY: n bytes of the mapping.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), map, n) };
    assert_eq!(emu.dtoh(at, n), data);
    assert_eq!(
        emu.dtoh(p, PAGE),
        vec![0xA5; PAGE],
        "the page before is not the dma-buf's"
    );

    let other = pattern(8, n);
    emu.htod(at, &other);
    let mut seen = vec![0u8; n];
    // SAFETY: As above.
    unsafe { std::ptr::copy_nonoverlapping(map, seen.as_mut_ptr(), n) };
    assert_eq!(seen, other);
    // SAFETY: The mapping and the fd are ours.
    unsafe {
        libc::munmap(map.cast(), n);
        libc::close(fd);
    }
}

// ---------------------------------------------------------------------------
// Several devices, several threads
// ---------------------------------------------------------------------------

#[test]
fn two_devices() {
    child_passes("child_two_devices", &[("CUEMU_DEVICES", "2")]);
}

#[test]
#[ignore = "run in a child process by two_devices"]
fn child_two_devices() {
    if !is_child("child_two_devices") {
        return;
    }
    let (emu, ctx0) = Emu::start(Emu::load_configured());
    let ctx1 = emu.retain(1);
    assert_ne!(ctx0, ctx1);
    let n = 64 << 10;
    let a = emu.alloc(n);
    let s0 = emu.stream(STREAM_NON_BLOCKING);
    emu.bind(ctx1);
    let mut dev = -1;
    assert_eq!(cu!(emu, cuCtxGetDevice(&mut dev)), SUCCESS);
    assert_eq!(dev, 1);
    let b = emu.alloc(n);
    assert_eq!(emu.ptr_attr::<c_int>(PTR_DEVICE_ORDINAL, a), (SUCCESS, 0));
    assert_eq!(emu.ptr_attr::<c_int>(PTR_DEVICE_ORDINAL, b), (SUCCESS, 1));
    assert_eq!(
        emu.ptr_attr::<usize>(PTR_CONTEXT, b),
        (SUCCESS, ctx1 as usize)
    );

    // Peer copies through unified addressing.
    let data = pattern(9, n);
    emu.htod(a, &data);
    assert_eq!(cu!(emu, cuMemcpyDtoD_v2(b, a, n)), SUCCESS);
    assert_eq!(emu.dtoh(b, n), data);

    // Work for device 0's stream is refused while device 1's context is
    // current; asking about the stream is not.
    assert_eq!(cu!(emu, cuMemsetD8Async(a, 0, n, s0)), INVALID_HANDLE);
    assert_eq!(cu!(emu, cuStreamSynchronize(s0)), SUCCESS);
    emu.bind(ctx0);
    assert_eq!(cu!(emu, cuMemsetD8Async(a, 0, n, s0)), SUCCESS);
    emu.sync(s0);
}

#[test]
fn statistics_of_another_layout_are_refused_not_overrun() {
    let (emu, _ctx) = Emu::started();
    // SAFETY: The emulator's cuemuGetStats, typed as the crate documents.
    let get = unsafe {
        *emu.lib
            .get::<unsafe extern "C" fn(*mut u64) -> c_int>(GET_STATS.to_bytes_with_nul())
            .unwrap()
    };
    // A caller built when the struct was 208 bytes, its buffer followed by
    // a guard: only the size comes back, with the call's failure.
    let mut buf = [0xEEEE_EEEE_EEEE_EEEEu64; 40];
    buf[0] = 208;
    // SAFETY: 40 writable u64s; the emulator writes at most the first.
    let rc = unsafe { get(buf.as_mut_ptr()) };
    assert_eq!(rc as u32, INVALID_VALUE);
    assert_eq!(buf[0], std::mem::size_of::<Stats>() as u64);
    assert!(buf[1..].iter().all(|&w| w == 0xEEEE_EEEE_EEEE_EEEE));
    // The right size reads.
    buf[0] = std::mem::size_of::<Stats>() as u64;
    // SAFETY: As above; 264 bytes fit in 320.
    assert_eq!(unsafe { get(buf.as_mut_ptr()) }, 0);
    assert!(buf[33..].iter().all(|&w| w == 0xEEEE_EEEE_EEEE_EEEE));
    assert!(emu.stats.read().is_ok());
}

#[test]
fn peer_copies_between_devices() {
    child_passes("child_peer_copies", &[("CUEMU_DEVICES", "2")]);
    child_passes(
        "child_peer_copies",
        &[
            ("CUEMU_DEVICES", "2"),
            ("CUEMU_PEER", "0"),
            (WANT_ENV, "no-peer"),
        ],
    );
}

#[test]
#[ignore = "run in a child process by peer_copies_between_devices"]
fn child_peer_copies() {
    if !is_child("child_peer_copies") {
        return;
    }
    let peer = std::env::var(WANT_ENV).map_or(true, |v| v != "no-peer");
    let (emu, ctx0) = Emu::start(Emu::load_configured());
    let ctx1 = emu.retain(1);
    let n = 256 << 10;
    let a = emu.alloc(n);
    let s0 = emu.stream(STREAM_NON_BLOCKING);
    emu.bind(ctx1);
    let b = emu.alloc(n);
    emu.bind(ctx0);
    let data = pattern(31, n);
    emu.htod(a, &data);
    emu.stats.reset();

    // Whether a device reaches another's memory: never itself.
    let mut can = -1;
    assert_eq!(cu!(emu, cuDeviceCanAccessPeer(&mut can, 0, 1)), SUCCESS);
    assert_eq!(can, c_int::from(peer));
    assert_eq!(cu!(emu, cuDeviceCanAccessPeer(&mut can, 0, 0)), SUCCESS);
    assert_eq!(can, 0);
    assert_eq!(
        cu!(emu, cuDeviceCanAccessPeer(&mut can, 0, 2)),
        INVALID_DEVICE
    );

    // Before access is enabled, copies work, staged by the driver.
    assert_eq!(
        cu!(emu, cuMemcpyPeerAsync(b, ctx1, a, ctx0, n, s0)),
        SUCCESS
    );
    emu.sync(s0);
    emu.bind(ctx1);
    assert_eq!(emu.dtoh(b, n), data);
    emu.bind(ctx0);
    let st = emu.stats.read().unwrap();
    assert_eq!(
        (st.peer.pageable_calls, st.peer.pageable_bytes),
        (1, n as u64)
    );

    // Device 1's context enables access to device 0's memory (once).
    emu.bind(ctx1);
    let enabled = cu!(emu, cuCtxEnablePeerAccess(ctx0, 0));
    if peer {
        assert_eq!(enabled, SUCCESS);
        assert_eq!(
            cu!(emu, cuCtxEnablePeerAccess(ctx0, 0)),
            PEER_ACCESS_ALREADY_ENABLED
        );
    } else {
        assert_eq!(enabled, PEER_ACCESS_UNSUPPORTED);
    }
    assert_eq!(cu!(emu, cuCtxEnablePeerAccess(ctx1, 0)), INVALID_DEVICE);
    assert_eq!(cu!(emu, cuCtxEnablePeerAccess(ctx0, 1)), INVALID_VALUE);
    // A synchronous copy back, into device 0, half of it moved.
    let back = pattern(32, n / 2);
    emu.htod(b, &back);
    assert_eq!(
        cu!(emu, cuMemcpyPeer(a + 4096, ctx0, b, ctx1, n / 2)),
        SUCCESS
    );
    emu.bind(ctx0);
    let mut want = data.clone();
    want[4096..4096 + n / 2].copy_from_slice(&back);
    assert_eq!(emu.dtoh(a, n), want);
    emu.bind(ctx1);
    // Into device 1 now counts as direct where access was enabled.
    assert_eq!(cu!(emu, cuMemcpyPeer(b, ctx1, a, ctx0, n)), SUCCESS);
    assert_eq!(emu.dtoh(b, n), want);
    let st = emu.stats.read().unwrap();
    if peer {
        assert_eq!(st.peer.sync_calls, 1, "{st:?}");
        assert_eq!(st.peer.pageable_calls, 2, "{st:?}");
        assert_eq!(st.peer_enables, 1);
    } else {
        assert_eq!((st.peer.sync_calls, st.peer.pageable_calls), (0, 3));
        assert_eq!(st.peer_enables, 0);
    }

    // Refused, nothing moved: a pointer of the other device than its
    // context's, past the end, an unknown context.
    let before = emu.dtoh(b, n);
    for (what, rc) in [
        (
            "dst of the wrong device",
            cu!(emu, cuMemcpyPeer(a, ctx1, b, ctx1, 16)),
        ),
        (
            "src of the wrong device",
            cu!(emu, cuMemcpyPeer(b, ctx1, b, ctx0, 16)),
        ),
        (
            "past the end",
            cu!(emu, cuMemcpyPeer(b + n as u64 - 8, ctx1, a, ctx0, 16)),
        ),
    ] {
        assert_eq!(rc, INVALID_VALUE, "{what}");
    }
    assert_eq!(
        cu!(emu, cuMemcpyPeer(b, 0x1234 as Handle, a, ctx0, 16)),
        INVALID_CONTEXT
    );
    assert_eq!(emu.dtoh(b, n), before);
}

#[test]
fn many_threads_at_once() {
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 25;
    const LEN: usize = 256 << 10;
    let (emu, ctx) = Emu::started();
    emu.stats.reset();
    let ctx = ctx as usize;
    thread::scope(|sc| {
        for t in 0..THREADS {
            let emu = &emu;
            sc.spawn(move || {
                emu.bind(ctx as Handle);
                let s = emu.stream(STREAM_NON_BLOCKING);
                let (a, b) = (emu.alloc(LEN), emu.alloc(LEN));
                let (src, dst) = (emu.pinned(LEN), emu.pinned(LEN));
                for r in 0..ROUNDS {
                    let mut want = pattern(t * 1000 + r, LEN);
                    src.write(&want);
                    let at = (r as usize * 4099) % (LEN - PAGE);
                    assert_eq!(
                        cu!(emu, cuMemcpyHtoDAsync_v2(a, src.addr(), LEN, s)),
                        SUCCESS
                    );
                    assert_eq!(
                        cu!(emu, cuMemsetD8Async(a + at as u64, t as u8, PAGE, s)),
                        SUCCESS
                    );
                    assert_eq!(cu!(emu, cuMemcpyDtoDAsync_v2(b, a, LEN, s)), SUCCESS);
                    assert_eq!(
                        cu!(emu, cuMemcpyDtoHAsync_v2(dst.addr(), b, LEN, s)),
                        SUCCESS
                    );
                    emu.sync(s);
                    want[at..at + PAGE].fill(t as u8);
                    assert!(dst.read() == want, "thread {t} round {r}");
                }
                emu.free(a);
                emu.free(b);
                assert_eq!(cu!(emu, cuStreamDestroy_v2(s)), SUCCESS);
            });
        }
    });
    let st = emu.stat();
    let calls = THREADS * ROUNDS;
    for c in [st.htod, st.dtoh, st.dtod] {
        assert_eq!((c.async_calls, c.async_bytes), (calls, calls * LEN as u64));
        assert_eq!(c.calls(), c.async_calls);
    }
    assert_eq!(st.live_device_allocs, 0);
}

// ---------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------

#[test]
fn statistics_count_each_kind_of_copy() {
    let (emu, _ctx) = Emu::started();
    let n = 8192;
    let (a, b) = (emu.alloc(n), emu.alloc(n));
    let s = emu.stream(STREAM_NON_BLOCKING);
    let (pin_src, pin_dst) = (emu.pinned(n), emu.pinned(n));
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    emu.stats.reset();

    emu.htod(a, &src);
    assert_eq!(cu!(emu, cuMemcpy(a, src.as_ptr() as Ptr, n)), SUCCESS);
    emu.dtoh(a, n);
    assert_eq!(cu!(emu, cuMemcpyDtoD_v2(b, a, n)), SUCCESS);
    assert_eq!(
        cu!(emu, cuMemcpyHtoDAsync_v2(a, pin_src.addr(), n, s)),
        SUCCESS
    );
    assert_eq!(
        cu!(emu, cuMemcpyHtoDAsync_v2(a, src.as_ptr().cast(), n, s)),
        SUCCESS
    );
    assert_eq!(
        cu!(emu, cuMemcpyDtoHAsync_v2(pin_dst.addr(), a, n, s)),
        SUCCESS
    );
    assert_eq!(
        cu!(emu, cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), a, n, s)),
        SUCCESS
    );
    assert_eq!(cu!(emu, cuMemcpyDtoDAsync_v2(b, a, n, s)), SUCCESS);
    assert_eq!(cu!(emu, cuMemcpyAsync(b, a, n / 2, s)), SUCCESS);
    assert_eq!(
        cu!(emu, cuMemcpyHtoD_v2(a, src.as_ptr().cast(), 0)),
        SUCCESS
    );
    emu.sync(s);

    let n = n as u64;
    let copies = |sync: u64, asynchronous: u64, pageable: u64| CopyStats {
        sync_calls: sync,
        sync_bytes: sync * n,
        async_calls: asynchronous,
        async_bytes: asynchronous * n,
        pageable_calls: pageable,
        pageable_bytes: pageable * n,
    };
    let mut dtod = copies(1, 1, 0);
    dtod.async_calls += 1;
    dtod.async_bytes += n / 2;
    let want = Stats {
        size: std::mem::size_of::<Stats>() as u64,
        htod: copies(2, 1, 1),
        dtoh: copies(1, 1, 1),
        dtod,
        live_device_allocs: 2,
        ..Stats::default()
    };
    let got = emu.stat();
    assert_eq!(got, want);

    // A reset keeps the gauges; `since` subtracts counters only.
    emu.stats.reset();
    let zero = emu.stat();
    assert_eq!(
        zero,
        Stats {
            size: want.size,
            live_device_allocs: 2,
            ..Stats::default()
        }
    );
    emu.htod(a, &src);
    let delta = emu.stat().since(&zero);
    assert_eq!((delta.htod.sync_calls, delta.live_device_allocs), (1, 2));
    assert_eq!(delta.htod.bytes(), n);
}
