//! The C API of libp2pdma, for storage engines written in C and C++.
//!
//! Every entry point is an `extern "C"` function over opaque handles; the
//! header `include/p2pdma.h` is generated from this file by cbindgen (see
//! `build.rs`), so the doc comments below are the C documentation. The
//! conventions, stated once in the header's preamble and here:
//!
//! - A function returns 0 (or a count, or a path) on success and a negative
//!   errno on failure, and never crashes on NULL or bad arguments: those are
//!   `-EINVAL`. [`p2pdma_last_error`] describes the calling thread's last
//!   failure.
//! - A panic inside the library never crosses into C: it becomes
//!   `P2PDMA_ERR_INTERNAL`.
//! - A transfer moves every byte or fails; nothing partial is reported as
//!   success. A read past the end of a file is `P2PDMA_ERR_EOF` (`-ERANGE`),
//!   distinct from a medium error (`-ENODATA`); when an NVMe controller
//!   failed a command, [`p2pdma_last_nvme_status`] gives its status.
//! - Handles are thread-safe: an engine, a memory and a file may be used by
//!   several threads at once. Freeing one while another thread still uses it
//!   is not allowed.
//!
//! `unsafe` is confined to the entry points' calls into [`raw`], which turns
//! the pointers C passes in into references, slices and strings.
#![expect(non_camel_case_types, reason = "the C API's types carry their C names")]
#![deny(unsafe_op_in_unsafe_fn)]

mod error;
mod raw;
mod route;

pub use route::{p2pdma_copy_route, p2pdma_place, p2pdma_place_kind, p2pdma_route_report};

use std::{
    ffi::{c_char, c_int, c_void, OsStr},
    os::unix::ffi::OsStrExt,
    sync::Arc,
};

use error::{call, status, void, Failure};
use p2pdma::{
    backend::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{
        strided::StridedReport, Config, Engine, Layout, PathPref, PathStats, Report, Shape,
        StorageFile, StridedMode, StridedRequest, Ticket, TransferPath,
    },
    Module,
};

/// The library's own return codes, beside negative errnos.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_error_code {
    /// A read reaches past the end of the file: the file is shorter than
    /// `file_offset + len` when the read runs (or became shorter while it
    /// ran). Equal to `-ERANGE`, which no storage I/O returns, so it is never
    /// confused with a medium error (`-ENODATA`) or another device error.
    /// Nothing partial is reported as success.
    P2PDMA_ERR_EOF = -34,
    /// The library hit an internal error (a bug) and caught it before it
    /// reached the caller; equal to `-ENOTRECOVERABLE`. The handles passed
    /// to that call remain valid, and p2pdma_last_error() says what
    /// happened.
    P2PDMA_ERR_INTERNAL = -131,
}

/// [`p2pdma_error_code::P2PDMA_ERR_EOF`] as a return value.
pub(crate) const ERR_EOF: c_int = p2pdma_error_code::P2PDMA_ERR_EOF as c_int;
const _: () = assert!(ERR_EOF == -libc::ERANGE);

/// [`p2pdma_error_code::P2PDMA_ERR_INTERNAL`] as a return value.
pub(crate) const ERR_INTERNAL: c_int = p2pdma_error_code::P2PDMA_ERR_INTERNAL as c_int;
const _: () = assert!(ERR_INTERNAL == -libc::ENOTRECOVERABLE);

/// A transfer path, as p2pdma_path_choice() returns it and as
/// `p2pdma_report.path` and p2pdma_stats() use it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_path {
    /// Storage DMAs straight into accelerator memory (PCI peer-to-peer),
    /// through the block layer (`O_DIRECT` on P2P pages).
    P2PDMA_PATH_P2P = 1,
    /// Staged through a pinned host bounce ring, pipelined.
    P2PDMA_PATH_BOUNCE = 2,
    /// NVMe commands built by the library and sent through the namespace's
    /// generic character device, with the accelerator's bus addresses.
    P2PDMA_PATH_NVME_CMD = 3,
    /// NVMe commands in queues in accelerator memory, on a controller this
    /// process drives through VFIO: no kernel in the I/O path.
    P2PDMA_PATH_QUEUES = 4,
}

impl From<TransferPath> for p2pdma_path {
    fn from(path: TransferPath) -> Self {
        match path {
            TransferPath::P2p => p2pdma_path::P2PDMA_PATH_P2P,
            TransferPath::Bounce => p2pdma_path::P2PDMA_PATH_BOUNCE,
            TransferPath::NvmeCmd => p2pdma_path::P2PDMA_PATH_NVME_CMD,
            TransferPath::Queues => p2pdma_path::P2PDMA_PATH_QUEUES,
        }
    }
}

/// An open handle on the p2pdma kernel module (`/dev/p2pdma`). It may be
/// closed before the memory allocated from it is freed: each allocation
/// keeps what it needs.
pub struct p2pdma_module {
    module: Arc<Module>,
}

/// Accelerator memory: BAR memory allocated from the module, or the
/// host-memory device standing in for an accelerator. It is only reached
/// through explicit copies (p2pdma_mem_write(), p2pdma_mem_read()) and
/// transfers.
pub struct p2pdma_mem {
    mem: Arc<dyn DeviceMemory>,
}

/// A file, or a raw block device such as an NVMe namespace, opened for
/// transfers (with `O_DIRECT`).
pub struct p2pdma_file {
    file: Arc<StorageFile>,
}

/// The transfer engine: configuration, pooled io_uring rings and bounce
/// buffers, and per-path counters.
pub struct p2pdma_engine {
    engine: Arc<Engine>,
}

// Every handle is used from several threads at once.
const _: () = {
    const fn thread_safe<T: Send + Sync>() {}
    thread_safe::<p2pdma_module>();
    thread_safe::<p2pdma_mem>();
    thread_safe::<p2pdma_file>();
    thread_safe::<p2pdma_engine>();
};

/// What one transfer did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_report {
    /// Bytes moved: always the length asked for.
    pub bytes: u64,
    /// The path that moved them (a `P2PDMA_PATH_*` value).
    pub path: c_int,
    /// 1 when the P2P or NVMe-command path failed and the bounce path redid
    /// the transfer, else 0.
    pub retried: c_int,
}

impl From<Report> for p2pdma_report {
    fn from(r: Report) -> Self {
        Self {
            bytes: r.bytes,
            path: p2pdma_path::from(r.path) as c_int,
            retried: c_int::from(r.retried),
        }
    }
}

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

/* Errors. */

/// The message of the calling thread's last failure, NUL-terminated; an
/// empty string before the first. Successful calls leave it unchanged. The
/// string belongs to the library and stays valid until the thread's next
/// failing call or its exit.
#[no_mangle]
pub extern "C" fn p2pdma_last_error() -> *const c_char {
    error::last_error()
}

/// The NVMe status of the calling thread's last failure, when an NVMe
/// controller failed a command of that call (the NVMe-command path); 0 when
/// the last failure was anything else, and before the first. Successful
/// calls leave it unchanged, as they leave p2pdma_last_error().
///
/// The call itself returned the errno the kernel's block layer gives the
/// same status, so a failure reads the same on every path: -ENODATA for a
/// medium error (Write Fault, Unrecovered Read Error, Deallocated or
/// Unwritten Logical Block...), -EILSEQ for end-to-end protection errors,
/// -EIO for most others. p2pdma_last_error() names the status in words,
/// e.g. "Unrecovered Read Error (SCT 0x2, SC 0x81)".
///
/// The value is the status field of the completion queue entry without its
/// phase tag, as the kernel passes it: Status Code `status & 0xff`, Status
/// Code Type `(status >> 8) & 0x7`, Command Retry Delay
/// `(status >> 11) & 0x3`, More `status & 0x2000`, Do Not Retry
/// `status & 0x4000`. An Unrecovered Read Error is `(status & 0x7ff) ==
/// 0x281`.
#[no_mangle]
pub extern "C" fn p2pdma_last_nvme_status() -> u32 {
    error::last_nvme_status()
}

/// The library's version, such as "0.1.0" (a static string).
#[no_mangle]
pub extern "C" fn p2pdma_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/* The kernel module. */

/// Opens the p2pdma kernel module (`/dev/p2pdma`) and checks that its ABI
/// is compatible; stores the handle in `*out`.
///
/// Returns 0, or a negative errno: -EINVAL when `out` is NULL, -ENOENT when
/// the module is not loaded, -EACCES without permission to its device node,
/// -EPROTO when its ABI is incompatible. On failure `*out` is NULL.
///
/// # Safety
///
/// `out` must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_module_open(out: *mut *mut p2pdma_module) -> c_int {
    status("p2pdma_module_open", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        let module = Arc::new(Module::open()?);
        *out = raw::into_handle(p2pdma_module { module });
        Ok(0)
    })
}

/// Closes a module handle. Memory allocated from it stays valid until it is
/// freed, and engines created with it keep working. NULL is ignored.
///
/// # Safety
///
/// `module` must be NULL or a handle from p2pdma_module_open() that is not
/// closed yet and that no other thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_module_close(module: *mut p2pdma_module) {
    // SAFETY: The caller passes NULL or a live handle nobody else uses.
    void("p2pdma_module_close", || {
        drop(unsafe { raw::from_handle(module) })
    });
}

/// The number of accelerators bound to the module, or a negative errno.
///
/// # Safety
///
/// `module` must be NULL or a live handle from p2pdma_module_open().
#[no_mangle]
pub unsafe extern "C" fn p2pdma_module_num_accelerators(module: *const p2pdma_module) -> c_int {
    status("p2pdma_module_num_accelerators", || {
        // SAFETY: The caller passes NULL or a live module handle.
        let m = unsafe { raw::handle(module, "module") }?;
        let n = m.module.accelerators()?.len();
        Ok(c_int::try_from(n).unwrap_or(c_int::MAX))
    })
}

/// Stores in `*index` the stable index of the `n`-th accelerator (counting
/// from 0, below p2pdma_module_num_accelerators()), the index that
/// p2pdma_mem_module_alloc() takes. Indices need not be contiguous.
///
/// Returns 0, or a negative errno: -EINVAL for NULL arguments, -ENODEV when
/// there is no `n`-th accelerator.
///
/// # Safety
///
/// `module` must be NULL or a live handle from p2pdma_module_open(); `index`
/// must be NULL or point to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_module_accelerator_index(
    module: *const p2pdma_module,
    n: usize,
    index: *mut u32,
) -> c_int {
    status("p2pdma_module_accelerator_index", || {
        // SAFETY: The caller passes NULL or a live module handle.
        let m = unsafe { raw::handle(module, "module") }?;
        // SAFETY: The caller passes NULL or a writable `uint32_t`.
        let index = unsafe { raw::out_struct(index, "index") }?;
        let accels = m.module.accelerators()?;
        let a = accels.get(n).ok_or_else(|| {
            Failure::new(
                libc::ENODEV,
                format!("no accelerator {n}: the module has {}", accels.len()),
            )
        })?;
        *index = a.index;
        Ok(0)
    })
}

/* Memory. */

/// Creates the host-memory device: `size` bytes (more than 0) of zeroed,
/// page-aligned host memory standing in for an accelerator, so that every
/// function works on machines without one. AUTO moves data to and from it
/// on the bounce path. Stores the handle in `*out`.
///
/// Returns 0, or a negative errno: -EINVAL when `out` is NULL or `size` is
/// 0, -ENOMEM. On failure `*out` is NULL.
///
/// # Safety
///
/// `out` must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_mem_host_new(size: usize, out: *mut *mut p2pdma_mem) -> c_int {
    status("p2pdma_mem_host_new", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        if size == 0 {
            return Err(Failure::invalid("`size` is 0"));
        }
        let mem = Arc::new(HostMemory::new(size)?);
        *out = raw::into_handle(p2pdma_mem { mem });
        Ok(0)
    })
}

/// Allocates `size` bytes of accelerator `accel_index`'s BAR memory, its bus
/// address aligned to `align` (0 for a page), and maps it; stores the
/// handle in `*out`. The memory keeps the module open: `module` may be
/// closed before it is freed.
///
/// Returns 0, or a negative errno: -EINVAL for NULL arguments, a bad size or
/// alignment, or an unknown accelerator, -ENOMEM when the BAR has no room.
/// On failure `*out` is NULL.
///
/// # Safety
///
/// `module` must be NULL or a live handle from p2pdma_module_open(); `out`
/// must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_mem_module_alloc(
    module: *const p2pdma_module,
    accel_index: u32,
    size: u64,
    align: u64,
    out: *mut *mut p2pdma_mem,
) -> c_int {
    status("p2pdma_mem_module_alloc", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or a live module handle.
        let m = unsafe { raw::handle(module, "module") }?;
        let mem = Arc::new(ModuleMemory::alloc(
            Arc::clone(&m.module),
            accel_index,
            size,
            align,
        )?);
        *out = raw::into_handle(p2pdma_mem { mem });
        Ok(0)
    })
}

/// Frees memory from p2pdma_mem_host_new() or p2pdma_mem_module_alloc().
/// NULL is ignored.
///
/// # Safety
///
/// `mem` must be NULL or a handle that is not freed yet and that no other
/// thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_mem_free(mem: *mut p2pdma_mem) {
    // SAFETY: The caller passes NULL or a live handle nobody else uses.
    void("p2pdma_mem_free", || drop(unsafe { raw::from_handle(mem) }));
}

/// The memory's size in bytes; 0 only when `mem` is NULL (memory is never
/// empty).
///
/// # Safety
///
/// `mem` must be NULL or a live memory handle.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_mem_size(mem: *const p2pdma_mem) -> usize {
    call(
        "p2pdma_mem_size",
        |_| 0,
        || {
            // SAFETY: The caller passes NULL or a live memory handle.
            let m = unsafe { raw::handle(mem, "mem") }?;
            Ok(m.mem.len())
        },
    )
}

/// Copies `len` bytes from `src` into the memory at `offset` (host to
/// device).
///
/// Returns 0, or a negative errno: -EINVAL for NULL arguments or a range
/// outside the memory (nothing is copied then).
///
/// # Safety
///
/// `mem` must be NULL or a live memory handle; `src` must be NULL or
/// readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_mem_write(
    mem: *const p2pdma_mem,
    offset: usize,
    src: *const c_void,
    len: usize,
) -> c_int {
    status("p2pdma_mem_write", || {
        // SAFETY: The caller passes NULL or a live memory handle.
        let m = unsafe { raw::handle(mem, "mem") }?;
        // SAFETY: The caller passes NULL or `len` readable bytes.
        let src = unsafe { raw::bytes(src, len, "src") }?;
        m.mem.write_at(offset, src)?;
        Ok(0)
    })
}

/// Copies `len` bytes of the memory at `offset` into `dst` (device to
/// host).
///
/// Returns 0, or a negative errno: -EINVAL for NULL arguments or a range
/// outside the memory (nothing is copied then).
///
/// # Safety
///
/// `mem` must be NULL or a live memory handle; `dst` must be NULL or
/// writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_mem_read(
    mem: *const p2pdma_mem,
    offset: usize,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    status("p2pdma_mem_read", || {
        // SAFETY: The caller passes NULL or a live memory handle.
        let m = unsafe { raw::handle(mem, "mem") }?;
        // SAFETY: The caller passes NULL or `len` writable bytes.
        let dst = unsafe { raw::bytes_mut(dst, len, "dst") }?;
        m.mem.read_at(offset, dst)?;
        Ok(0)
    })
}

/* Files. */

/// Opens a file or block device for transfers, read-only, or for reading
/// and writing when `writable` is not 0. The file must exist (create it
/// first to write a new one); it is opened with `O_DIRECT`, so it must be
/// on a filesystem that supports it (tmpfs does not). Stores the handle in
/// `*out`.
///
/// Returns 0, or a negative errno: -EINVAL for NULL arguments or a
/// filesystem without `O_DIRECT`, -ENOENT, -EACCES, and so on. On failure
/// `*out` is NULL.
///
/// # Safety
///
/// `path` must be NULL or a NUL-terminated string; `out` must be NULL or
/// point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_file_open(
    path: *const c_char,
    writable: c_int,
    out: *mut *mut p2pdma_file,
) -> c_int {
    status("p2pdma_file_open", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or a NUL-terminated string.
        let path = OsStr::from_bytes(unsafe { raw::c_str(path, "path") }?.to_bytes());
        let file = if writable != 0 {
            StorageFile::open_rw(path)
        } else {
            StorageFile::open(path)
        }?;
        *out = raw::into_handle(p2pdma_file {
            file: Arc::new(file),
        });
        Ok(0)
    })
}

/// Closes a file from p2pdma_file_open(). NULL is ignored.
///
/// # Safety
///
/// `file` must be NULL or a handle that is not closed yet and that no other
/// thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_file_close(file: *mut p2pdma_file) {
    // SAFETY: The caller passes NULL or a live handle nobody else uses.
    void("p2pdma_file_close", || {
        drop(unsafe { raw::from_handle(file) })
    });
}

/// The file's size in bytes when it was opened, or a negative errno
/// (-EINVAL when `file` is NULL).
///
/// # Safety
///
/// `file` must be NULL or a live file handle.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_file_size(file: *const p2pdma_file) -> i64 {
    call("p2pdma_file_size", i64::from, || {
        // SAFETY: The caller passes NULL or a live file handle.
        let f = unsafe { raw::handle(file, "file") }?;
        Ok(i64::try_from(f.file.size()).unwrap_or(i64::MAX))
    })
}

/* Engines. */

/// Creates a transfer engine; stores the handle in `*out`.
///
/// `path_pref` is "auto" (P2P where the module, the memory and the PCIe
/// topology allow it, the bounce path otherwise), "p2p", "bounce",
/// "nvme-cmd" or "queues"; NULL takes the configuration from `$P2PDMA_CONFIG` (or
/// `/etc/p2pdma.conf`) and the environment (`P2PDMA_PATH`, `P2PDMA_CHUNK`,
/// `P2PDMA_DEPTH`, `P2PDMA_COPY_THREADS`, `P2PDMA_CACHE_DIR`), and lets the
/// engine keep the chunk size and depth it learns per storage device in the
/// user's cache (`docs/transfer.md`); a named path learns nothing. `chunk`
/// (bytes per pipeline chunk, 4 KiB to 64 MiB) and `depth` (chunks in
/// flight, 1 to 256) override it when not 0; 0 chooses automatically. `module` may be NULL: AUTO then always chooses the bounce
/// path. The engine keeps the module open.
///
/// Returns 0, or a negative errno: -EINVAL for a NULL `out`, an unknown
/// path, or a chunk or depth out of range. On failure `*out` is NULL.
///
/// # Safety
///
/// `path_pref` must be NULL or a NUL-terminated string; `module` must be
/// NULL or a live module handle; `out` must be NULL or point to writable
/// storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_engine_new(
    path_pref: *const c_char,
    chunk: usize,
    depth: usize,
    module: *const p2pdma_module,
    out: *mut *mut p2pdma_engine,
) -> c_int {
    status("p2pdma_engine_new", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        let mut config = if path_pref.is_null() {
            Config::from_env()?
        } else {
            // SAFETY: The caller passes a NUL-terminated string (not NULL here).
            let pref = unsafe { raw::c_str(path_pref, "path_pref") }?;
            let pref = pref
                .to_str()
                .map_err(|_| Failure::invalid("`path_pref` is not UTF-8"))?
                .parse::<PathPref>()?;
            Config {
                path: pref,
                ..Config::default()
            }
        };
        if chunk != 0 {
            config.set("chunk", &chunk.to_string())?;
        }
        if depth != 0 {
            config.set("depth", &depth.to_string())?;
        }
        let module = if module.is_null() {
            None
        } else {
            // SAFETY: The caller passes a live module handle (not NULL here).
            Some(Arc::clone(
                &unsafe { raw::handle(module, "module") }?.module,
            ))
        };
        *out = raw::into_handle(p2pdma_engine {
            engine: Arc::new(Engine::new(config, module)),
        });
        Ok(0)
    })
}

/// Frees an engine. NULL is ignored.
///
/// # Safety
///
/// `engine` must be NULL or a handle that is not freed yet and that no other
/// thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_engine_free(engine: *mut p2pdma_engine) {
    // SAFETY: The caller passes NULL or a live handle nobody else uses.
    void("p2pdma_engine_free", || {
        drop(unsafe { raw::from_handle(engine) })
    });
}

/// The path transfers between `file` and `mem` take, and why: returns
/// a `P2PDMA_PATH_*` value, and
/// copies the reason into `reason_buf` (truncated to `reason_len` bytes and
/// always NUL-terminated; `reason_buf` may be NULL). Each transfer chooses
/// the same way, on its own call.
///
/// Returns the path, or a negative errno: -EINVAL for NULL handles,
/// -EOPNOTSUPP when the configured path cannot serve this pair (the
/// reason is then in p2pdma_last_error()).
///
/// # Safety
///
/// `engine`, `file` and `mem` must be NULL or live handles; `reason_buf`
/// must be NULL or writable for `reason_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_path_choice(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    mem: *const p2pdma_mem,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_path_choice", || {
        // SAFETY: The caller passes NULL or live handles.
        let (e, f, m) = unsafe {
            (
                raw::handle(engine, "engine")?,
                raw::handle(file, "file")?,
                raw::handle(mem, "mem")?,
            )
        };
        let choice = e.engine.choose(&f.file, &*m.mem)?;
        // SAFETY: The caller passes NULL or `reason_len` writable bytes.
        unsafe { raw::copy_str(&choice.reason, reason_buf, reason_len) }?;
        Ok(p2pdma_path::from(choice.path) as c_int)
    })
}

/// Which way a transfer moves data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// The body of p2pdma_read() and p2pdma_write().
///
/// # Safety
///
/// As for p2pdma_read().
#[expect(clippy::too_many_arguments, reason = "the C signature of p2pdma_read")]
unsafe fn transfer(
    dir: Direction,
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    file_offset: u64,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    len: usize,
    report: *mut p2pdma_report,
) -> Result<c_int, Failure> {
    let mut report = if report.is_null() {
        None
    } else {
        // SAFETY: The caller passes a writable report (not NULL here).
        Some(unsafe { raw::out_struct(report, "report") }?)
    };
    if let Some(out) = report.as_deref_mut() {
        *out = p2pdma_report::default();
    }
    // SAFETY: The caller passes NULL or live handles.
    let (e, f, m) = unsafe {
        (
            raw::handle(engine, "engine")?,
            raw::handle(file, "file")?,
            raw::handle(mem, "mem")?,
        )
    };
    let done = match dir {
        Direction::Read => e
            .engine
            .read(&f.file, file_offset, &*m.mem, mem_offset, len)
            .map_err(Failure::from_read)?,
        Direction::Write => e
            .engine
            .write(&f.file, file_offset, &*m.mem, mem_offset, len)
            .map_err(Failure::from)?,
    };
    if done.bytes != len as u64 {
        return Err(Failure::new(
            libc::EIO,
            format!("short transfer: moved {} of {len} bytes", done.bytes),
        ));
    }
    if let Some(out) = report {
        *out = p2pdma_report::from(done);
    }
    Ok(0)
}

/// Reads `len` bytes at `file_offset` of `file` into `mem` at `mem_offset`,
/// on the path p2pdma_path_choice() reports. Offsets and lengths need no
/// alignment. When `report` is not NULL, it receives what the transfer did.
///
/// Returns 0 once every byte has landed, or a negative errno, with `*report`
/// zeroed: -EINVAL for NULL handles or a range outside the memory,
/// `P2PDMA_ERR_EOF` when the range runs past the end of the file (nothing
/// partial is reported as success), -ENODATA for a medium error, -EIO and
/// others from storage. When an NVMe controller failed a command,
/// p2pdma_last_nvme_status() gives its status.
///
/// # Safety
///
/// `engine`, `file` and `mem` must be NULL or live handles; `report` must be
/// NULL or point to a writable `struct p2pdma_report`.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_read(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    file_offset: u64,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    len: usize,
    report: *mut p2pdma_report,
) -> c_int {
    status("p2pdma_read", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            transfer(
                Direction::Read,
                engine,
                file,
                file_offset,
                mem,
                mem_offset,
                len,
                report,
            )
        }
    })
}

/// Writes `len` bytes of `mem` at `mem_offset` to `file` at `file_offset`
/// (the file must be open for writing). Bytes outside the range are never
/// changed, and a regular file grows only to the end of the data written.
/// When `report` is not NULL, it receives what the transfer did.
///
/// Returns 0 once every byte is written, or a negative errno, with `*report`
/// zeroed: -EINVAL for NULL handles or a range outside the memory, -EBADF
/// when the file is read-only, -ENOSPC, -ENODATA for a medium error
/// (Write Fault), -EIO and others from storage. When an NVMe controller
/// failed a command, p2pdma_last_nvme_status() gives its status.
///
/// # Safety
///
/// `engine`, `file` and `mem` must be NULL or live handles; `report` must be
/// NULL or point to a writable `struct p2pdma_report`.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_write(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    file_offset: u64,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    len: usize,
    report: *mut p2pdma_report,
) -> c_int {
    status("p2pdma_write", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            transfer(
                Direction::Write,
                engine,
                file,
                file_offset,
                mem,
                mem_offset,
                len,
                report,
            )
        }
    })
}

/* Strided reads. */

/// One dimension of a strided shape: `count` steps of `stride` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_dim {
    /// Bytes between the starts of consecutive steps.
    pub stride: u64,
    /// Steps (at least 1).
    pub count: u64,
}

/// Where a strided read puts its runs in memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_layout {
    /// Back to back from the memory offset, in file order.
    P2PDMA_LAYOUT_PACKED = 0,
    /// Each run at the memory offset plus its distance from the first
    /// run's start: the memory mirrors the file's range.
    P2PDMA_LAYOUT_STRIDED = 1,
}

/// How a strided read moves its runs (see `docs/transfer.md`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_strided_mode {
    /// Chosen by the library's cost model; the reason says why.
    P2PDMA_STRIDED_AUTO = 0,
    /// One read of the whole range, gaps included (strided layout only).
    P2PDMA_STRIDED_RC = 1,
    /// One read per run.
    P2PDMA_STRIDED_SC = 2,
    /// The range through host memory, packed there, then copied.
    P2PDMA_STRIDED_TAT = 3,
}

/// What one strided read did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_strided_report {
    /// Bytes of interest moved: the runs' total.
    pub bytes: u64,
    /// Bytes read from storage, with each read's block rounding.
    pub storage_bytes: u64,
    /// Transfers issued.
    pub calls: u64,
    /// The mode that moved the runs (a `P2PDMA_STRIDED_*` value, never
    /// AUTO).
    pub mode: c_int,
    /// 1 when a transfer was redone on the bounce path, else 0.
    pub retried: c_int,
}

impl From<&StridedReport> for p2pdma_strided_report {
    fn from(r: &StridedReport) -> Self {
        let mode = match r.mode {
            StridedMode::Auto => p2pdma_strided_mode::P2PDMA_STRIDED_AUTO,
            StridedMode::Rc => p2pdma_strided_mode::P2PDMA_STRIDED_RC,
            StridedMode::Sc => p2pdma_strided_mode::P2PDMA_STRIDED_SC,
            StridedMode::Tat => p2pdma_strided_mode::P2PDMA_STRIDED_TAT,
        };
        Self {
            bytes: r.bytes,
            storage_bytes: r.storage_bytes,
            calls: r.calls,
            mode: mode as c_int,
            retried: c_int::from(r.retried),
        }
    }
}

/// The most dimensions a strided shape has.
pub const P2PDMA_MAX_DIMS: usize = 3;

/// Which way a strided transfer in a `struct p2pdma_strided_op` moves.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_direction {
    /// From the file into the memory.
    P2PDMA_DIR_READ = 0,
    /// From the memory into the file.
    P2PDMA_DIR_WRITE = 1,
}

/// One strided transfer, for p2pdma_submit_strided() and
/// p2pdma_submit_strided_batch(): the arguments of p2pdma_read_strided()
/// or p2pdma_write_strided() in a struct.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct p2pdma_strided_op {
    /// `P2PDMA_DIR_READ` or `P2PDMA_DIR_WRITE`.
    pub dir: c_int,
    /// The file (open for writing, to write).
    pub file: *const p2pdma_file,
    /// The first run's file offset.
    pub base: u64,
    /// Bytes per run.
    pub run: u64,
    /// The dimensions, innermost first; the first `ndims` are used.
    pub dims: [p2pdma_dim; P2PDMA_MAX_DIMS],
    /// How many dimensions (0 to `P2PDMA_MAX_DIMS`).
    pub ndims: usize,
    /// The memory.
    pub mem: *const p2pdma_mem,
    /// Offset in the memory where the layout starts.
    pub mem_offset: usize,
    /// A `P2PDMA_LAYOUT_*` value.
    pub layout: c_int,
    /// A `P2PDMA_STRIDED_*` value.
    pub mode: c_int,
}

/// A strided transfer running in the background, from
/// p2pdma_submit_strided(): ask whether it is done with
/// p2pdma_ticket_done(), wait for its result with p2pdma_ticket_wait(),
/// free it with p2pdma_ticket_free().
pub struct p2pdma_ticket {
    ticket: Ticket<StridedReport>,
    dir: Direction,
}

const _: () = {
    const fn thread_safe<T: Send + Sync>() {}
    thread_safe::<p2pdma_ticket>();
};

/// The shape, layout and mode of a strided call, checked.
fn strided_args(
    base: u64,
    run: u64,
    dims: &[p2pdma_dim],
    layout: c_int,
    mode: c_int,
) -> Result<(Shape, Layout, StridedMode), Failure> {
    let layout = match layout {
        l if l == p2pdma_layout::P2PDMA_LAYOUT_PACKED as c_int => Layout::Packed,
        l if l == p2pdma_layout::P2PDMA_LAYOUT_STRIDED as c_int => Layout::Strided,
        l => return Err(Failure::invalid(format!("unknown layout {l}"))),
    };
    let mode = match mode {
        0 => StridedMode::Auto,
        1 => StridedMode::Rc,
        2 => StridedMode::Sc,
        3 => StridedMode::Tat,
        m => return Err(Failure::invalid(format!("unknown strided mode {m}"))),
    };
    let dims: Vec<(u64, u64)> = dims.iter().map(|d| (d.stride, d.count)).collect();
    Ok((Shape::new(base, run, &dims)?, layout, mode))
}

/// Stores a strided transfer's outcome for C: the report and the reason
/// on success, the report zeroed on failure (reads' short transfers are
/// `P2PDMA_ERR_EOF`).
///
/// # Safety
///
/// `report` must be NULL or point to a writable `struct
/// p2pdma_strided_report`; `reason_buf` must be NULL or valid for writing
/// `reason_len` bytes.
unsafe fn strided_outcome(
    dir: Direction,
    done: p2pdma::Result<StridedReport>,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> Result<c_int, Failure> {
    let mut report = if report.is_null() {
        None
    } else {
        // SAFETY: The caller passes a writable report (not NULL here).
        Some(unsafe { raw::out_struct(report, "report") }?)
    };
    if let Some(out) = report.as_deref_mut() {
        *out = p2pdma_strided_report::default();
    }
    let done = done.map_err(|e| match dir {
        Direction::Read => Failure::from_read(e),
        Direction::Write => Failure::from(e),
    })?;
    // SAFETY: The caller passes NULL or `reason_len` writable bytes.
    unsafe { raw::copy_str(&done.reason, reason_buf, reason_len) }?;
    if let Some(out) = report {
        *out = p2pdma_strided_report::from(&done);
    }
    Ok(0)
}

/// The body of p2pdma_read_strided() and p2pdma_write_strided().
///
/// # Safety
///
/// As for p2pdma_read_strided().
#[expect(
    clippy::too_many_arguments,
    reason = "the C signature of p2pdma_read_strided"
)]
unsafe fn strided(
    dir: Direction,
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    base: u64,
    run: u64,
    dims: *const p2pdma_dim,
    ndims: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    layout: c_int,
    mode: c_int,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> Result<c_int, Failure> {
    if !report.is_null() {
        // SAFETY: The caller passes a writable report (not NULL here).
        *unsafe { raw::out_struct(report, "report") }? = p2pdma_strided_report::default();
    }
    // SAFETY: The caller passes NULL or live handles, and NULL or `ndims`
    // dimensions.
    let (e, f, m, dims) = unsafe {
        (
            raw::handle(engine, "engine")?,
            raw::handle(file, "file")?,
            raw::handle(mem, "mem")?,
            raw::structs(dims, ndims, "dims")?,
        )
    };
    let (shape, layout, mode) = strided_args(base, run, dims, layout, mode)?;
    let done = match dir {
        Direction::Read => e
            .engine
            .read_strided(&f.file, &shape, &*m.mem, mem_offset, layout, mode),
        Direction::Write => e
            .engine
            .write_strided(&f.file, &shape, &*m.mem, mem_offset, layout, mode),
    };
    // SAFETY: Passed on from this function's contract.
    unsafe { strided_outcome(dir, done, report, reason_buf, reason_len) }
}

/// Reads runs of `run` bytes of `file`, the first at `base`, the others
/// found by stepping through `ndims` (at most 3) dimensions `dims`,
/// innermost first, into `mem` from `mem_offset`, laid out as `layout` (a
/// `P2PDMA_LAYOUT_*` value), moved as `mode` (a `P2PDMA_STRIDED_*` value)
/// says. A column range of a row-major table is `base` = its first byte,
/// `run` = its width, and one dimension `{row pitch, rows}`. When `report`
/// is not NULL it receives what the read did; when `reason_buf` is not NULL,
/// up to `reason_len` bytes of why that mode (NUL-terminated).
///
/// Returns 0 once every run has landed, or a negative errno, with
/// `*report` zeroed: -EINVAL for NULL handles, a bad shape (a zero run or
/// count, more than 3 dimensions, a stride below what it steps over,
/// overflow), an unknown layout or mode, RC with the packed layout, or
/// memory that cannot hold the layout; `P2PDMA_ERR_EOF` when a run lies
/// past the end of the file; -ENODATA, -EIO and others from storage.
/// Nothing is read before the arguments are checked.
///
/// # Safety
///
/// `engine`, `file` and `mem` must be NULL or live handles; `dims` must be
/// NULL or point to `ndims` `struct p2pdma_dim`; `report` must be NULL or
/// point to a writable `struct p2pdma_strided_report`; `reason_buf` must be
/// NULL or valid for writing `reason_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_read_strided(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    base: u64,
    run: u64,
    dims: *const p2pdma_dim,
    ndims: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    layout: c_int,
    mode: c_int,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_read_strided", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            strided(
                Direction::Read,
                engine,
                file,
                base,
                run,
                dims,
                ndims,
                mem,
                mem_offset,
                layout,
                mode,
                report,
                reason_buf,
                reason_len,
            )
        }
    })
}

/// Writes the runs of the shape (`base`, `run`, `dims`, as for
/// p2pdma_read_strided()) from `mem`, laid out as `layout` from
/// `mem_offset`, to `file` (open for writing). Exactly the runs' bytes of
/// the file change: writes are one per run (`P2PDMA_STRIDED_SC`; AUTO
/// means SC), and RC and TaT, which would write the gaps or need a
/// contiguous file side, are refused. When `report` is not NULL it
/// receives what the write did; `reason_buf` as for p2pdma_read_strided().
///
/// Returns 0 once every run is written, or a negative errno, with
/// `*report` zeroed: -EINVAL for NULL handles, a bad shape, an unknown
/// layout or mode, RC or TaT, or memory that does not hold the layout;
/// -EBADF when the file is read-only, -ENOSPC, -EIO and others from
/// storage. Nothing is written before the arguments are checked; after a
/// storage error, runs already written stay written.
///
/// # Safety
///
/// As for p2pdma_read_strided().
#[no_mangle]
pub unsafe extern "C" fn p2pdma_write_strided(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    base: u64,
    run: u64,
    dims: *const p2pdma_dim,
    ndims: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    layout: c_int,
    mode: c_int,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_write_strided", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            strided(
                Direction::Write,
                engine,
                file,
                base,
                run,
                dims,
                ndims,
                mem,
                mem_offset,
                layout,
                mode,
                report,
                reason_buf,
                reason_len,
            )
        }
    })
}

/// `op` as a request for the engine, checked.
///
/// # Safety
///
/// `op.file` and `op.mem` must be NULL or live handles.
unsafe fn strided_request(op: &p2pdma_strided_op) -> Result<StridedRequest, Failure> {
    let dir = match op.dir {
        d if d == p2pdma_direction::P2PDMA_DIR_READ as c_int => Direction::Read,
        d if d == p2pdma_direction::P2PDMA_DIR_WRITE as c_int => Direction::Write,
        d => return Err(Failure::invalid(format!("unknown direction {d}"))),
    };
    if op.ndims > P2PDMA_MAX_DIMS {
        return Err(Failure::invalid(format!(
            "{} dimensions, at most {P2PDMA_MAX_DIMS}",
            op.ndims
        )));
    }
    // SAFETY: The caller passes NULL or live handles.
    let (f, m) = unsafe { (raw::handle(op.file, "file")?, raw::handle(op.mem, "mem")?) };
    let (shape, layout, mode) =
        strided_args(op.base, op.run, &op.dims[..op.ndims], op.layout, op.mode)?;
    Ok(StridedRequest {
        dir: match dir {
            Direction::Read => p2pdma::transfer::Direction::Read,
            Direction::Write => p2pdma::transfer::Direction::Write,
        },
        file: Arc::clone(&f.file),
        shape,
        mem: Arc::clone(&m.mem),
        mem_offset: op.mem_offset,
        layout,
        mode,
    })
}

fn direction_of(req: &StridedRequest) -> Direction {
    match req.dir {
        p2pdma::transfer::Direction::Read => Direction::Read,
        p2pdma::transfer::Direction::Write => Direction::Write,
    }
}

/// Starts the strided transfer `op` on the engine's worker threads and
/// returns at once, storing a ticket for it in `*out`. The transfer holds
/// its file and memory: they may be closed and freed while it runs, and
/// freeing the ticket does not stop it.
///
/// Returns 0, or a negative errno, with `*out` NULL and nothing started:
/// -EINVAL for NULL arguments, an unknown direction, layout or mode, or a
/// bad shape. What the transfer itself returns (everything
/// p2pdma_read_strided() and p2pdma_write_strided() return) comes from
/// p2pdma_ticket_wait().
///
/// # Safety
///
/// `engine` must be NULL or a live engine; `op` must be NULL or point to a
/// `struct p2pdma_strided_op` whose `file` and `mem` are NULL or live
/// handles; `out` must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_submit_strided(
    engine: *const p2pdma_engine,
    op: *const p2pdma_strided_op,
    out: *mut *mut p2pdma_ticket,
) -> c_int {
    status("p2pdma_submit_strided", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or a live engine and NULL or one
        // readable op.
        let (e, op) = unsafe { (raw::handle(engine, "engine")?, raw::handle(op, "op")?) };
        // SAFETY: The caller passes an op with NULL or live handles.
        let req = unsafe { strided_request(op) }?;
        let dir = direction_of(&req);
        *out = raw::into_handle(p2pdma_ticket {
            ticket: e.engine.submit_strided(req),
            dir,
        });
        Ok(0)
    })
}

/// Starts `n` strided transfers at once (they run in parallel on the
/// engine's worker threads) and stores a ticket for `ops[i]` in
/// `tickets[i]`. Every op is checked before any starts: one bad op fails
/// the call with nothing started.
///
/// Returns 0, or a negative errno, with every `tickets[i]` NULL: -EINVAL
/// for NULL arguments or a bad op (p2pdma_last_error() names it, as
/// `ops[i]`).
///
/// # Safety
///
/// `engine` must be NULL or a live engine; `ops` must be NULL or point to
/// `n` `struct p2pdma_strided_op` whose `file` and `mem` are NULL or live
/// handles; `tickets` must be NULL or point to `n` writable pointers.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_submit_strided_batch(
    engine: *const p2pdma_engine,
    ops: *const p2pdma_strided_op,
    n: usize,
    tickets: *mut *mut p2pdma_ticket,
) -> c_int {
    status("p2pdma_submit_strided_batch", || {
        // SAFETY: The caller passes NULL or `n` writable pointers.
        let out = unsafe { raw::out_handles(tickets, n, "tickets") }?;
        // SAFETY: The caller passes NULL or a live engine, and NULL or `n`
        // readable ops.
        let (e, ops) = unsafe { (raw::handle(engine, "engine")?, raw::structs(ops, n, "ops")?) };
        let reqs = ops
            .iter()
            .enumerate()
            // SAFETY: The caller passes ops with NULL or live handles.
            .map(|(i, op)| {
                unsafe { strided_request(op) }.map_err(|f| f.context(&format!("ops[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (slot, req) in out.iter_mut().zip(reqs) {
            let dir = direction_of(&req);
            *slot = raw::into_handle(p2pdma_ticket {
                ticket: e.engine.submit_strided(req),
                dir,
            });
        }
        Ok(0)
    })
}

/// Whether the ticket's transfer has finished: 1 when it has (its result
/// waits for p2pdma_ticket_wait(), which then returns at once), 0 while it
/// runs, -EINVAL when `ticket` is NULL.
///
/// # Safety
///
/// `ticket` must be NULL or a live ticket.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_ticket_done(ticket: *const p2pdma_ticket) -> c_int {
    status("p2pdma_ticket_done", || {
        // SAFETY: The caller passes NULL or a live ticket.
        let t = unsafe { raw::handle(ticket, "ticket") }?;
        Ok(c_int::from(t.ticket.is_done()))
    })
}

/// Waits until the ticket's transfer has finished and returns what
/// p2pdma_read_strided() or p2pdma_write_strided() would have returned,
/// storing the report and the reason the same way. The result is handed
/// out once: a second wait on the same ticket returns -EINVAL.
///
/// # Safety
///
/// `ticket` must be NULL or a live ticket; `report` must be NULL or point
/// to a writable `struct p2pdma_strided_report`; `reason_buf` must be NULL
/// or valid for writing `reason_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_ticket_wait(
    ticket: *const p2pdma_ticket,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_ticket_wait", || {
        if !report.is_null() {
            // SAFETY: The caller passes a writable report (not NULL here).
            *unsafe { raw::out_struct(report, "report") }? = p2pdma_strided_report::default();
        }
        // SAFETY: The caller passes NULL or a live ticket.
        let t = unsafe { raw::handle(ticket, "ticket") }?;
        let done = t.ticket.wait();
        // SAFETY: Passed on from this function's contract.
        unsafe { strided_outcome(t.dir, done, report, reason_buf, reason_len) }
    })
}

/// Frees a ticket. A transfer still running goes on to the end in the
/// background (with its result dropped). NULL is ignored.
///
/// # Safety
///
/// `ticket` must be NULL or a ticket that is not freed yet and that no
/// other thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_ticket_free(ticket: *mut p2pdma_ticket) {
    // SAFETY: The caller passes NULL or a live ticket nobody else uses.
    void("p2pdma_ticket_free", || {
        drop(unsafe { raw::from_handle(ticket) })
    });
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
            p => return Err(Failure::invalid(format!("unknown path {p}"))),
        };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: `p2pdma_version` returns a static NUL-terminated string.
        let v = unsafe { CStr::from_ptr(p2pdma_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn host_memory_round_trips_and_refuses_bad_ranges() {
        let mut mem = std::ptr::null_mut();
        // SAFETY: `mem` is a writable pointer slot.
        assert_eq!(unsafe { p2pdma_mem_host_new(8192, &mut mem) }, 0);
        // SAFETY: `mem` is live, the buffers are valid for their lengths, and
        // `mem` is freed once at the end.
        unsafe {
            assert_eq!(p2pdma_mem_size(mem), 8192);
            let src = *b"0123456789";
            assert_eq!(
                p2pdma_mem_write(mem, 4090, src.as_ptr().cast(), src.len()),
                0
            );
            let mut dst = [0u8; 10];
            assert_eq!(
                p2pdma_mem_read(mem, 4090, dst.as_mut_ptr().cast(), dst.len()),
                0
            );
            assert_eq!(dst, src);
            assert_eq!(
                p2pdma_mem_read(mem, 8190, dst.as_mut_ptr().cast(), dst.len()),
                -libc::EINVAL
            );
            assert_eq!(
                p2pdma_mem_write(mem, usize::MAX, src.as_ptr().cast(), 1),
                -libc::EINVAL
            );
            p2pdma_mem_free(mem);
        }
    }

    #[test]
    fn strided_reads_land_the_runs_and_refuse_bad_arguments() {
        // A file with O_DIRECT in the temporary directory; tmpfs has none.
        let dir = std::env::temp_dir().join(format!("capi-strided-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("table");
        let data: Vec<u8> = (0..64u32 << 10).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let cpath = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let (mut file, mut mem, mut engine) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: Every pointer is a live handle, a writable slot or NULL
        // as each function allows; the handles are freed once at the end.
        unsafe {
            if p2pdma_file_open(cpath.as_ptr(), 0, &mut file) != 0 {
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!("skipped: no O_DIRECT in {}", dir.display());
                return;
            }
            assert_eq!(p2pdma_mem_host_new(8192, &mut mem), 0);
            let bounce = c"bounce";
            assert_eq!(
                p2pdma_engine_new(bounce.as_ptr(), 0, 0, std::ptr::null(), &mut engine),
                0
            );
            // Columns 100..130 of 8 rows of 1000 bytes: 240 bytes packed.
            let dims = [p2pdma_dim {
                stride: 1000,
                count: 8,
            }];
            let mut rep = p2pdma_strided_report::default();
            let mut reason = [0 as c_char; 128];
            let (rbuf, rlen) = (reason.as_mut_ptr(), reason.len());
            let read = |dims: *const p2pdma_dim, n, layout, mode, rep, off| {
                p2pdma_read_strided(
                    engine, file, 100, 30, dims, n, mem, off, layout, mode, rep, rbuf, rlen,
                )
            };
            let packed = p2pdma_layout::P2PDMA_LAYOUT_PACKED as c_int;
            let auto = p2pdma_strided_mode::P2PDMA_STRIDED_AUTO as c_int;
            assert_eq!(read(dims.as_ptr(), 1, packed, auto, &mut rep, 10), 0);
            assert_eq!((rep.bytes, rep.retried), (240, 0));
            assert_ne!(rep.mode, auto);
            let mut got = [0u8; 240];
            assert_eq!(p2pdma_mem_read(mem, 10, got.as_mut_ptr().cast(), 240), 0);
            for k in 0..8 {
                let f = 100 + k * 1000;
                assert_eq!(got[k * 30..k * 30 + 30], data[f..f + 30], "row {k}");
            }
            let said = CStr::from_ptr(reason.as_ptr()).to_str().unwrap();
            assert!(said.contains("by estimate"), "{said}");
            // Refused: NULL dims with a count, an unknown layout or mode,
            // RC packed, a zero count, no room; the report zeroed.
            let rc = p2pdma_strided_mode::P2PDMA_STRIDED_RC as c_int;
            let zero = [p2pdma_dim {
                stride: 1000,
                count: 0,
            }];
            for (d, layout, mode, off) in [
                (std::ptr::null(), packed, auto, 0),
                (dims.as_ptr(), 7, auto, 0),
                (dims.as_ptr(), packed, 9, 0),
                (dims.as_ptr(), packed, rc, 0),
                (zero.as_ptr(), packed, auto, 0),
                (dims.as_ptr(), packed, auto, 8000),
            ] {
                rep.bytes = 1;
                assert_eq!(read(d, 1, layout, mode, &mut rep, off), -libc::EINVAL);
                assert_eq!(rep, p2pdma_strided_report::default());
            }
            // Past the end of the file.
            let far = [p2pdma_dim {
                stride: 1 << 20,
                count: 2,
            }];
            assert_eq!(read(far.as_ptr(), 1, packed, auto, &mut rep, 0), ERR_EOF);
            p2pdma_engine_free(engine);
            p2pdma_mem_free(mem);
            p2pdma_file_close(file);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn paths_have_their_c_values() {
        assert_eq!(p2pdma_path::from(TransferPath::P2p) as c_int, 1);
        assert_eq!(p2pdma_path::from(TransferPath::Bounce) as c_int, 2);
        assert_eq!(p2pdma_path::from(TransferPath::NvmeCmd) as c_int, 3);
        assert_eq!(p2pdma_path::from(TransferPath::Queues) as c_int, 4);
    }
}
