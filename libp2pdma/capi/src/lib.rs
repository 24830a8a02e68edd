//! The C API of libp2pdma, for storage engines written in C and C++.
//!
//! Every entry point is an `extern "C"` function over opaque handles; the
//! header `include/p2pdma.h` is generated from this crate's source by
//! cbindgen (see `build.rs`), so the entry points' doc comments are the C
//! documentation. The entry points live in one module per concept; this
//! file holds the handles they share and p2pdma_version(). The
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

// The entry points by concept. cbindgen lists each module's functions in
// turn, in the order of these declarations, so this is also the header's
// order.

// Return codes, and the calling thread's last failure.
mod error;
// The kernel module and its accelerators.
mod module;
// Memory and the copies into and out of it.
mod memory;
// Files and block devices.
mod files;
// Engines and their paths.
mod engine;
// Reads and writes of a range.
mod transfers;
// Strided transfers and their tickets.
mod strided;
// Per-path counters.
mod stats;
// Copies along routes of staging places.
mod route;
// The object store.
mod store;

// The pointers C passes in, turned into references, slices and strings.
mod raw;

pub use engine::{p2pdma_engine_free, p2pdma_engine_new, p2pdma_path, p2pdma_path_choice};
pub use error::{p2pdma_error_code, p2pdma_last_error, p2pdma_last_nvme_status};
pub use files::{p2pdma_file_close, p2pdma_file_open, p2pdma_file_size};
pub use memory::{
    p2pdma_mem_free, p2pdma_mem_host_new, p2pdma_mem_module_alloc, p2pdma_mem_read,
    p2pdma_mem_size, p2pdma_mem_write,
};
pub use module::{
    p2pdma_module_accelerator_index, p2pdma_module_close, p2pdma_module_num_accelerators,
    p2pdma_module_open,
};
pub use route::{p2pdma_copy_route, p2pdma_place, p2pdma_place_kind, p2pdma_route_report};
pub use stats::{p2pdma_path_stats, p2pdma_stats};
pub use store::{
    p2pdma_object, p2pdma_prefetch, p2pdma_store, p2pdma_store_close, p2pdma_store_consume,
    p2pdma_store_create, p2pdma_store_delete, p2pdma_store_flush, p2pdma_store_object_map,
    p2pdma_store_open, p2pdma_store_prefetch, p2pdma_store_read, p2pdma_store_resize,
    p2pdma_store_size, p2pdma_store_write,
};
pub use strided::{
    p2pdma_dim, p2pdma_direction, p2pdma_layout, p2pdma_read_strided, p2pdma_strided_mode,
    p2pdma_strided_op, p2pdma_strided_report, p2pdma_submit_strided, p2pdma_submit_strided_batch,
    p2pdma_ticket, p2pdma_ticket_done, p2pdma_ticket_free, p2pdma_ticket_wait,
    p2pdma_write_strided, P2PDMA_MAX_DIMS,
};
pub use transfers::{p2pdma_read, p2pdma_report, p2pdma_write};

use std::{ffi::c_char, sync::Arc};

use p2pdma::{
    memory::DeviceMemory,
    transfer::{Engine, StorageFile},
    Module,
};

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

/// The engine, file and memory handles of a transfer, checked in that
/// order.
///
/// # Safety
///
/// Each pointer must be NULL or a live handle of its type.
unsafe fn transfer_handles<'a>(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    mem: *const p2pdma_mem,
) -> Result<(&'a p2pdma_engine, &'a p2pdma_file, &'a p2pdma_mem), error::Failure> {
    // SAFETY: Passed on from this function's contract.
    unsafe {
        Ok((
            raw::handle(engine, "engine")?,
            raw::handle(file, "file")?,
            raw::handle(mem, "mem")?,
        ))
    }
}

// Every handle is used from several threads at once.
const _: () = {
    const fn thread_safe<T: Send + Sync>() {}
    thread_safe::<p2pdma_module>();
    thread_safe::<p2pdma_mem>();
    thread_safe::<p2pdma_file>();
    thread_safe::<p2pdma_engine>();
};

/// The library's version, such as "0.1.0" (a static string).
#[no_mangle]
pub extern "C" fn p2pdma_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
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
}
