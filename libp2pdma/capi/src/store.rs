//! The object store: a store on a file or device through an engine, its
//! objects created, read, written, resized and deleted, and prefetches.

use std::{ffi::c_int, sync::Arc};

use p2pdma::store::{EngineBacking, Prefetch, Store};

use crate::{
    error::{call, status, void, Failure},
    p2pdma_engine, p2pdma_file, p2pdma_mem, raw,
};

/// An object store: objects on a file or device, their map kept through
/// crashes.
pub struct p2pdma_store {
    store: Arc<Store>,
}

/// A read started by p2pdma_store_prefetch(), consumed by
/// p2pdma_store_consume().
pub struct p2pdma_prefetch {
    prefetch: Prefetch,
}

/// One object of the store's map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_object {
    /// The object's id.
    pub id: u64,
    /// Its first 4 KiB block on the device.
    pub start_block: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// The store of `file` (opened writable) moved by `engine`: a new, empty
/// one with room for `max_objects` objects when `format` is not 0 (what was
/// on the file is gone), else the one on it. Stores the handle in `*out`.
///
/// Returns 0, or a negative errno: -EINVAL for NULL arguments, a file with
/// no store on it, or one too small. On failure `*out` is NULL.
///
/// # Safety
///
/// `engine` and `file` must be NULL or live handles; `out` must be NULL or
/// point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_open(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    format: c_int,
    max_objects: u64,
    out: *mut *mut p2pdma_store,
) -> c_int {
    status("p2pdma_store_open", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or live handles.
        let (e, f) = unsafe { (raw::handle(engine, "engine")?, raw::handle(file, "file")?) };
        let backing = Arc::new(EngineBacking::new(e.engine.clone(), f.file.clone()));
        let store = if format != 0 {
            Store::format(backing, max_objects)
        } else {
            Store::initialize(backing)
        }?;
        *out = raw::into_handle(p2pdma_store {
            store: Arc::new(store),
        });
        Ok(0)
    })
}

/// Closes a store (its cached writes go back to the device, not durably:
/// call p2pdma_store_flush() first). NULL is ignored.
///
/// # Safety
///
/// `store` must be NULL or a handle that is not closed yet and that no
/// other thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_close(store: *mut p2pdma_store) {
    // SAFETY: The caller passes NULL or a live handle nobody else uses.
    void("p2pdma_store_close", || {
        drop(unsafe { raw::from_handle(store) })
    });
}

/// Creates an object of `n_bytes` zero bytes and stores its id in `*id`;
/// committed when it returns. Returns 0 or a negative errno (-EINVAL when
/// the store has no room).
///
/// # Safety
///
/// `store` must be NULL or a live handle; `id` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_create(
    store: *const p2pdma_store,
    n_bytes: u64,
    id: *mut u64,
) -> c_int {
    status("p2pdma_store_create", || {
        // SAFETY: The caller passes NULL or a live handle and a writable slot.
        let (s, id) = unsafe { (raw::handle(store, "store")?, raw::out_struct(id, "id")?) };
        *id = s.store.pcreate(n_bytes)?;
        Ok(0)
    })
}

/// Deletes object `id`; committed when it returns. Returns 0 or a negative
/// errno (-EINVAL for an id the store does not hold).
///
/// # Safety
///
/// `store` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_delete(store: *const p2pdma_store, id: u64) -> c_int {
    status("p2pdma_store_delete", || {
        // SAFETY: The caller passes NULL or a live handle.
        unsafe { raw::handle(store, "store") }?.store.delete(id)?;
        Ok(0)
    })
}

/// Resizes object `id` to `n_bytes` (new bytes read as zeros); committed
/// when it returns. Returns 0 or a negative errno.
///
/// # Safety
///
/// `store` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_resize(
    store: *const p2pdma_store,
    id: u64,
    n_bytes: u64,
) -> c_int {
    status("p2pdma_store_resize", || {
        // SAFETY: The caller passes NULL or a live handle.
        unsafe { raw::handle(store, "store") }?
            .store
            .resize(id, n_bytes)?;
        Ok(0)
    })
}

/// Object `id`'s size in bytes, or a negative errno.
///
/// # Safety
///
/// `store` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_size(store: *const p2pdma_store, id: u64) -> i64 {
    call("p2pdma_store_size", i64::from, || {
        // SAFETY: The caller passes NULL or a live handle.
        let size = unsafe { raw::handle(store, "store") }?.store.size(id)?;
        Ok(i64::try_from(size).unwrap_or(i64::MAX))
    })
}

/// Stores up to `cap` objects of the map in `out`, by id; returns how many
/// the map holds (more than `cap` when `out` was too short), or a negative
/// errno.
///
/// # Safety
///
/// `store` must be NULL or a live handle; `out` NULL (with `cap` 0) or
/// writable for `cap` objects.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_object_map(
    store: *const p2pdma_store,
    out: *mut p2pdma_object,
    cap: usize,
) -> i64 {
    call("p2pdma_store_object_map", i64::from, || {
        // SAFETY: The caller passes NULL or a live handle and `cap` writable
        // objects.
        let (s, out) = unsafe {
            (
                raw::handle(store, "store")?,
                raw::structs_mut(out, cap, "out")?,
            )
        };
        let map = s.store.get_object_map();
        for (o, m) in out.iter_mut().zip(&map) {
            *o = p2pdma_object {
                id: m.id,
                start_block: m.start_block,
                size: m.size,
            };
        }
        Ok(map.len() as i64)
    })
}

/// The bytes of a read or write: object `id` from `offset`, `n` bytes,
/// from or to `mem` at `mem_offset`.
///
/// # Safety
///
/// Each pointer must be NULL or a live handle.
unsafe fn io<'a>(
    store: *const p2pdma_store,
    mem: *const p2pdma_mem,
) -> Result<(&'a p2pdma_store, &'a p2pdma_mem), Failure> {
    // SAFETY: Passed on from this function's contract.
    unsafe { Ok((raw::handle(store, "store")?, raw::handle(mem, "mem")?)) }
}

/// Reads `n` bytes at `offset` of object `id` into `mem` at `mem_offset`;
/// returns `n`, or a negative errno (-EINVAL for an unknown id, -ERANGE
/// past the object's end; nothing is read then).
///
/// # Safety
///
/// `store` and `mem` must be NULL or live handles.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_read(
    store: *const p2pdma_store,
    id: u64,
    offset: u64,
    n: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
) -> i64 {
    call("p2pdma_store_read", i64::from, || {
        // SAFETY: The caller passes NULL or live handles.
        let (s, m) = unsafe { io(store, mem) }?;
        Ok(s.store.pread(id, offset, n, m.mem.as_ref(), mem_offset)? as i64)
    })
}

/// Writes `n` bytes of `mem` at `mem_offset` to `offset` of object `id`;
/// returns `n`, or a negative errno. Durable after p2pdma_store_flush().
///
/// # Safety
///
/// `store` and `mem` must be NULL or live handles.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_write(
    store: *const p2pdma_store,
    id: u64,
    offset: u64,
    n: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
) -> i64 {
    call("p2pdma_store_write", i64::from, || {
        // SAFETY: The caller passes NULL or live handles.
        let (s, m) = unsafe { io(store, mem) }?;
        Ok(s.store.pwrite(id, offset, n, m.mem.as_ref(), mem_offset)? as i64)
    })
}

/// Starts reading `n` bytes at `offset` of object `id`; stores the
/// prefetch in `*out`, for p2pdma_store_consume(). Returns 0 or a negative
/// errno.
///
/// # Safety
///
/// `store` must be NULL or a live handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_prefetch(
    store: *const p2pdma_store,
    id: u64,
    offset: u64,
    n: usize,
    out: *mut *mut p2pdma_prefetch,
) -> c_int {
    status("p2pdma_store_prefetch", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or a live handle.
        let s = unsafe { raw::handle(store, "store") }?;
        let prefetch = s.store.pread_prefetch(id, offset, n)?;
        *out = raw::into_handle(p2pdma_prefetch { prefetch });
        Ok(0)
    })
}

/// Waits for `prefetch` and copies its first `n` bytes into `mem` at
/// `mem_offset`; frees the prefetch either way. Returns `n` or a negative
/// errno.
///
/// # Safety
///
/// `store` and `mem` must be NULL or live handles; `prefetch` NULL or a
/// prefetch of that store not consumed or freed yet, used by no other
/// thread.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_consume(
    store: *const p2pdma_store,
    prefetch: *mut p2pdma_prefetch,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    n: usize,
) -> i64 {
    call("p2pdma_store_consume", i64::from, || {
        // SAFETY: The caller passes NULL or a live prefetch nobody else uses.
        let p = unsafe { raw::from_handle(prefetch) }.ok_or_else(|| Failure::null("prefetch"))?;
        // SAFETY: The caller passes NULL or live handles.
        let (s, m) = unsafe { io(store, mem) }?;
        Ok(s.store
            .consume_prefetch_pread(p.prefetch, m.mem.as_ref(), mem_offset, n)? as i64)
    })
}

/// Makes every write to the store durable. Returns 0 or a negative errno.
///
/// # Safety
///
/// `store` must be NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_flush(store: *const p2pdma_store) -> c_int {
    status("p2pdma_store_flush", || {
        // SAFETY: The caller passes NULL or a live handle.
        unsafe { raw::handle(store, "store") }?.store.flush()?;
        Ok(0)
    })
}

// Every handle is used from several threads at once.
const _: () = {
    const fn thread_safe<T: Send + Sync>() {}
    thread_safe::<p2pdma_store>();
};
