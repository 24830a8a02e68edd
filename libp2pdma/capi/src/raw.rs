//! The raw pointers C hands in, turned into references and slices. Each
//! function checks for NULL and returns a [`Failure`] instead of touching it;
//! what cannot be checked (that a non-NULL pointer is valid) is the `# Safety`
//! contract, which the entry points pass on to their C callers.

use std::{
    ffi::{c_char, c_void, CStr},
    slice,
};

use crate::error::Failure;

/// Borrows the object behind a handle.
///
/// # Safety
///
/// `ptr` must be NULL or a handle of type `T` that this library returned and
/// that is not freed while the reference lives.
pub(crate) unsafe fn handle<'a, T>(ptr: *const T, arg: &str) -> Result<&'a T, Failure> {
    // SAFETY: The caller guarantees that a non-NULL `ptr` points to a live
    // `T` that outlives `'a`; the library only hands out shared references
    // to handles, so no `&mut` aliases it.
    unsafe { ptr.as_ref() }.ok_or_else(|| Failure::null(arg))
}

/// Moves a new object into a handle for C.
pub(crate) fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Takes back ownership of a handle, to drop it. NULL gives `None`.
///
/// # Safety
///
/// `ptr` must be NULL or a handle of type `T` from [`into_handle`] that has
/// not been freed, and that no other thread uses any more.
pub(crate) unsafe fn from_handle<T>(ptr: *mut T) -> Option<Box<T>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: The caller guarantees that `ptr` came from `Box::into_raw` in
    // `into_handle`, is not freed yet and is no longer in use.
    Some(unsafe { Box::from_raw(ptr) })
}

/// The place C asked a result to be stored at, cleared to NULL first so that
/// a failure leaves NULL there.
///
/// # Safety
///
/// `out` must be NULL or valid for reading and writing a pointer, and not
/// used by anyone else while the reference lives.
pub(crate) unsafe fn out_handle<'a, T>(
    out: *mut *mut T,
    arg: &str,
) -> Result<&'a mut *mut T, Failure> {
    // SAFETY: The caller guarantees that a non-NULL `out` is valid for
    // writing a pointer and not aliased while the reference lives.
    let out = unsafe { out.as_mut() }.ok_or_else(|| Failure::null(arg))?;
    *out = std::ptr::null_mut();
    Ok(out)
}

/// The struct C asked a result to be stored in.
///
/// # Safety
///
/// `out` must be NULL or valid for writing a `T`, and not used by anyone
/// else while the reference lives.
pub(crate) unsafe fn out_struct<'a, T>(out: *mut T, arg: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: The caller guarantees that a non-NULL `out` is valid and
    // unaliased; `T` is a `repr(C)` struct of plain integers, so any bytes
    // C left in it are a valid `T` to overwrite.
    unsafe { out.as_mut() }.ok_or_else(|| Failure::null(arg))
}

/// The report C asked for, reset to its default (zeroed) first so that a
/// failure leaves it zeroed; NULL, for no report, gives `None`.
///
/// # Safety
///
/// As for [`out_struct`].
pub(crate) unsafe fn out_report<'a, T: Default>(
    out: *mut T,
    arg: &str,
) -> Result<Option<&'a mut T>, Failure> {
    if out.is_null() {
        return Ok(None);
    }
    // SAFETY: Passed on from this function's contract.
    let out = unsafe { out_struct(out, arg) }?;
    *out = T::default();
    Ok(Some(out))
}

/// A C string, as raw bytes (paths need not be UTF-8).
///
/// # Safety
///
/// `ptr` must be NULL or point to a NUL-terminated string that stays
/// unchanged while the reference lives.
pub(crate) unsafe fn c_str<'a>(ptr: *const c_char, arg: &str) -> Result<&'a CStr, Failure> {
    if ptr.is_null() {
        return Err(Failure::null(arg));
    }
    // SAFETY: `ptr` is not NULL, and the caller guarantees it is a
    // NUL-terminated string that outlives `'a` unchanged.
    Ok(unsafe { CStr::from_ptr(ptr) })
}

fn check_len(len: usize, arg: &str) -> Result<(), Failure> {
    if len > isize::MAX as usize {
        return Err(Failure::invalid(format!(
            "`{arg}` length {len} is larger than any buffer"
        )));
    }
    Ok(())
}

/// Checks an array of `n` values of `T` that C passed in at `ptr`: false
/// when `n` is 0 (an empty slice, whatever `ptr` is), else true once `ptr`
/// is not NULL, aligned, and the array fits in an `isize`.
fn check_array<T>(ptr: *const T, n: usize, arg: &str) -> Result<bool, Failure> {
    if n == 0 {
        return Ok(false);
    }
    if ptr.is_null() {
        return Err(Failure::null(arg));
    }
    if !ptr.is_aligned() {
        return Err(Failure::invalid(format!("`{arg}` is not aligned")));
    }
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(bytes) => check_len(bytes, arg)?,
        None => check_len(usize::MAX, arg)?,
    }
    Ok(true)
}

/// `n` values of a `repr(C)` struct C passed in to be read; NULL is an
/// empty slice when `n` is 0.
///
/// # Safety
///
/// `ptr` must be NULL or valid for reading `n` values of `T` that nobody
/// writes while the slice lives; `T` must be a `repr(C)` struct of plain
/// integers.
pub(crate) unsafe fn structs<'a, T>(
    ptr: *const T,
    n: usize,
    arg: &str,
) -> Result<&'a [T], Failure> {
    if !check_array(ptr, n, arg)? {
        return Ok(&[]);
    }
    // SAFETY: `ptr` is not NULL and aligned, the `n` values' bytes fit in an
    // `isize`, and the caller guarantees `n` readable values of `T`, for
    // which any bytes are valid, that nobody writes while the slice lives.
    Ok(unsafe { slice::from_raw_parts(ptr, n) })
}

/// `n` values of a `repr(C)` struct C passed in to be written; NULL is an
/// empty slice when `n` is 0.
///
/// # Safety
///
/// `ptr` must be NULL or valid for writing `n` values of `T`, and not used
/// by anyone else while the slice lives; `T` must be a `repr(C)` struct of
/// plain integers.
pub(crate) unsafe fn structs_mut<'a, T>(
    ptr: *mut T,
    n: usize,
    arg: &str,
) -> Result<&'a mut [T], Failure> {
    if !check_array(ptr.cast_const(), n, arg)? {
        return Ok(&mut []);
    }
    // SAFETY: As in `structs`; the caller also guarantees the values are
    // writable and that nobody else uses them while the slice lives.
    Ok(unsafe { slice::from_raw_parts_mut(ptr, n) })
}

/// `n` pointer slots C passed in for results, each cleared to NULL first
/// so that a failure leaves NULL there; NULL is an empty slice when `n`
/// is 0.
///
/// # Safety
///
/// `ptr` must be NULL or valid for reading and writing `n` pointers, and
/// not used by anyone else while the slice lives.
pub(crate) unsafe fn out_handles<'a, T>(
    ptr: *mut *mut T,
    n: usize,
    arg: &str,
) -> Result<&'a mut [*mut T], Failure> {
    if !check_array(ptr.cast_const(), n, arg)? {
        return Ok(&mut []);
    }
    // SAFETY: `ptr` is not NULL and aligned, the `n` pointers' bytes fit in
    // an `isize`, and the caller guarantees `n` pointer slots nobody else
    // uses while the slice lives; any bytes C left in them are a valid raw
    // pointer, and each is overwritten before anything reads it.
    let slots = unsafe { slice::from_raw_parts_mut(ptr, n) };
    slots.iter_mut().for_each(|p| *p = std::ptr::null_mut());
    Ok(slots)
}

/// `len` bytes C passed in to be read.
///
/// # Safety
///
/// `ptr` must be NULL or valid for reading `len` bytes that nobody writes
/// while the slice lives.
pub(crate) unsafe fn bytes<'a>(
    ptr: *const c_void,
    len: usize,
    arg: &str,
) -> Result<&'a [u8], Failure> {
    if ptr.is_null() {
        return Err(Failure::null(arg));
    }
    check_len(len, arg)?;
    // SAFETY: `ptr` is not NULL, `u8` needs no alignment, `len` fits in an
    // `isize`, and the caller guarantees `len` readable bytes that nobody
    // writes while the slice lives.
    Ok(unsafe { slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// `len` bytes C passed in to be written.
///
/// # Safety
///
/// `ptr` must be NULL or valid for writing `len` bytes that nobody else
/// reads or writes while the slice lives.
pub(crate) unsafe fn bytes_mut<'a>(
    ptr: *mut c_void,
    len: usize,
    arg: &str,
) -> Result<&'a mut [u8], Failure> {
    if ptr.is_null() {
        return Err(Failure::null(arg));
    }
    check_len(len, arg)?;
    // SAFETY: `ptr` is not NULL, `u8` needs no alignment, `len` fits in an
    // `isize`, and the caller guarantees `len` writable bytes that nobody
    // else uses while the slice lives. Every byte pattern is a valid `u8`,
    // so exposing whatever the buffer held before is sound.
    Ok(unsafe { slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
}

/// Copies `text` into a C buffer of `len` bytes, truncated at a character
/// boundary and always NUL-terminated. A NULL buffer or a zero length
/// stores nothing.
///
/// # Safety
///
/// `buf` must be NULL or valid for writing `len` bytes.
pub(crate) unsafe fn copy_str(text: &str, buf: *mut c_char, len: usize) -> Result<(), Failure> {
    if buf.is_null() || len == 0 {
        return Ok(());
    }
    // SAFETY: Passed on from this function's contract.
    let dst = unsafe { bytes_mut(buf.cast(), len, "reason_buf") }?;
    let mut n = text.len().min(len - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    dst[..n].copy_from_slice(&text.as_bytes()[..n]);
    dst[n] = 0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nulls_are_refused() {
        // SAFETY: Every pointer is NULL, which the functions check first.
        unsafe {
            assert!(handle::<u32>(std::ptr::null(), "h").is_err());
            assert!(out_handle::<u32>(std::ptr::null_mut(), "o").is_err());
            assert!(c_str(std::ptr::null(), "s").is_err());
            assert!(bytes(std::ptr::null(), 0, "b").is_err());
            assert!(bytes_mut(std::ptr::null_mut(), 1, "b").is_err());
            assert!(copy_str("x", std::ptr::null_mut(), 8).is_ok());
            assert!(from_handle::<u32>(std::ptr::null_mut()).is_none());
        }
    }

    #[test]
    fn strings_are_truncated_at_characters_and_terminated() {
        let mut buf = [0x55u8; 6];
        // SAFETY: `buf` is valid for writing its length.
        unsafe { copy_str("héllo wörld", buf.as_mut_ptr().cast(), buf.len()) }.unwrap();
        assert_eq!(&buf, b"h\xc3\xa9ll\0");
        let mut buf = [0x55u8; 3];
        // SAFETY: As above.
        unsafe { copy_str("hé", buf.as_mut_ptr().cast(), buf.len()) }.unwrap();
        assert_eq!(&buf, b"h\0\x55");
        let mut buf = [0x55u8; 1];
        // SAFETY: As above.
        unsafe { copy_str("abc", buf.as_mut_ptr().cast(), 1) }.unwrap();
        assert_eq!(buf, [0]);
    }

    #[test]
    fn handles_round_trip() {
        let h = into_handle(7u32);
        // SAFETY: `h` is a live handle from `into_handle`.
        assert_eq!(*unsafe { handle(h, "h") }.unwrap(), 7);
        // SAFETY: `h` is live and used by nobody else; it is freed once.
        assert_eq!(unsafe { from_handle(h) }.map(|b| *b), Some(7));
    }
}
