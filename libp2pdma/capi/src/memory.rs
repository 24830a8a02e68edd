//! Memory: the host-memory device, accelerator memory from the module, and
//! the explicit copies into and out of it.

use std::{
    ffi::{c_int, c_void},
    sync::Arc,
};

use p2pdma::memory::{HostMemory, ModuleMemory};

use crate::{
    error::{call, status, void, Failure},
    p2pdma_mem, p2pdma_module, raw,
};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
