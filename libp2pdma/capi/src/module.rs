//! The kernel module: opening it, and its accelerators.

use std::{ffi::c_int, sync::Arc};

use p2pdma::Module;

use crate::{
    error::{status, void, Failure},
    p2pdma_module, raw,
};

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
