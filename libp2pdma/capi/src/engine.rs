//! Engines: creating one, its transfer paths, and the path it chooses for a
//! file and a memory.

use std::{
    ffi::{c_char, c_int},
    sync::Arc,
};

use p2pdma::transfer::{Config, Engine, PathPref, TransferPath};

use crate::{
    error::{status, void, Failure},
    p2pdma_engine, p2pdma_file, p2pdma_mem, p2pdma_module, raw, transfer_handles,
};

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
    /// Not a path: for p2pdma_stats() only, the bytes reads copied out of
    /// the page cache (whatever the path chosen) instead of moving them
    /// from the device again.
    P2PDMA_PATH_PAGE_CACHE = 5,
    /// The storage DMAs straight into (or out of) host memory by
    /// `O_DIRECT`, with no staging copy: how host memory is read and
    /// written.
    P2PDMA_PATH_DIRECT = 6,
}

impl From<TransferPath> for p2pdma_path {
    fn from(path: TransferPath) -> Self {
        match path {
            TransferPath::P2p => p2pdma_path::P2PDMA_PATH_P2P,
            TransferPath::Bounce => p2pdma_path::P2PDMA_PATH_BOUNCE,
            TransferPath::NvmeCmd => p2pdma_path::P2PDMA_PATH_NVME_CMD,
            TransferPath::Queues => p2pdma_path::P2PDMA_PATH_QUEUES,
            TransferPath::Direct => p2pdma_path::P2PDMA_PATH_DIRECT,
        }
    }
}

/// An engine handle for `config`, with `module` (NULL for none).
///
/// # Safety
///
/// `module` must be NULL or a live module handle.
unsafe fn new_engine(
    config: Config,
    module: *const p2pdma_module,
) -> Result<*mut p2pdma_engine, Failure> {
    let module = if module.is_null() {
        None
    } else {
        // SAFETY: The caller passes a live module handle (not NULL here).
        Some(Arc::clone(
            &unsafe { raw::handle(module, "module") }?.module,
        ))
    };
    Ok(raw::into_handle(p2pdma_engine {
        engine: Arc::new(Engine::new(config, module)),
    }))
}

/// Creates a transfer engine with `count` settings, `keys[i]` set to
/// `values[i]` over the defaults, as in a `P2PDMA_CONFIG` file (`path`,
/// `page_cache` (auto, direct or buffered), `chunk`, `depth`, `p2p_submit`,
/// `copy_threads`, `cache_dir`, the strided constants); stores the handle
/// in `*out`. Neither the configuration file nor the environment is read.
/// `module` may be NULL: AUTO then always chooses the bounce path.
///
/// Returns 0, or a negative errno: -EINVAL for a NULL `out`, NULL arrays
/// with `count` > 0, a NULL or non-UTF-8 string, an unknown key or a bad
/// value (p2pdma_last_error() says which). On failure `*out` is NULL.
///
/// # Safety
///
/// `keys` and `values` must be NULL or point to `count` pointers each, each
/// NULL or a NUL-terminated string; `module` must be NULL or a live module
/// handle; `out` must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_engine_new_with(
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
    module: *const p2pdma_module,
    out: *mut *mut p2pdma_engine,
) -> c_int {
    status("p2pdma_engine_new_with", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        let mut config = Config::default();
        if count > 0 && (keys.is_null() || values.is_null()) {
            return Err(Failure::invalid(format!(
                "`keys` and `values` must hold {count} strings each"
            )));
        }
        for i in 0..count {
            // SAFETY: The caller passes `count` pointers in each array (not
            // NULL here), each NULL or a NUL-terminated string.
            let (key, value) = unsafe {
                (
                    raw::c_str(*keys.add(i), "keys[i]")?,
                    raw::c_str(*values.add(i), "values[i]")?,
                )
            };
            let not_utf8 = |arg: &str| Failure::invalid(format!("`{arg}` is not UTF-8"));
            let key = key.to_str().map_err(|_| not_utf8("keys[i]"))?;
            let value = value.to_str().map_err(|_| not_utf8("values[i]"))?;
            config.set(key, value)?;
        }
        // SAFETY: The caller passes NULL or a live module handle.
        *out = unsafe { new_engine(config, module) }?;
        Ok(0)
    })
}

/// Creates a transfer engine; stores the handle in `*out`.
///
/// `path_pref` is "auto" (P2P where the module, the memory and the PCIe
/// topology allow it, the bounce path otherwise), "p2p", "bounce",
/// "nvme-cmd" or "queues"; NULL takes the configuration from `$P2PDMA_CONFIG` (or
/// `/etc/p2pdma.conf`) and the environment (`P2PDMA_PATH`,
/// `P2PDMA_PAGE_CACHE`, `P2PDMA_CHUNK`, `P2PDMA_DEPTH`,
/// `P2PDMA_COPY_THREADS`, `P2PDMA_CACHE_DIR`), and lets the
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
        // SAFETY: The caller passes NULL or a live module handle.
        *out = unsafe { new_engine(config, module) }?;
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
        let (e, f, m) = unsafe { transfer_handles(engine, file, mem) }?;
        let choice = e.engine.choose(&f.file, &*m.mem)?;
        // SAFETY: The caller passes NULL or `reason_len` writable bytes.
        unsafe { raw::copy_str(&choice.reason, reason_buf, reason_len) }?;
        Ok(p2pdma_path::from(choice.path) as c_int)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_have_their_c_values() {
        assert_eq!(p2pdma_path::from(TransferPath::P2p) as c_int, 1);
        assert_eq!(p2pdma_path::from(TransferPath::Bounce) as c_int, 2);
        assert_eq!(p2pdma_path::from(TransferPath::NvmeCmd) as c_int, 3);
        assert_eq!(p2pdma_path::from(TransferPath::Queues) as c_int, 4);
        assert_eq!(p2pdma_path::from(TransferPath::Direct) as c_int, 6);
    }
}
