//! Files and block devices opened for transfers.

use std::{
    ffi::{c_char, c_int, OsStr},
    os::unix::ffi::OsStrExt,
    sync::Arc,
};

use p2pdma::transfer::StorageFile;

use crate::{
    error::{call, status, void},
    p2pdma_file, raw,
};

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
