//! The object store: a store on a file or device through an engine, its
//! objects created, read, written, resized and deleted, and prefetches.

use std::{ffi::c_int, sync::Arc};

use p2pdma::{
    memory::{DeviceMemory, MemRange},
    store::{CacheStats, EngineBacking, PageCache, Prefetch, Store, WritePolicy},
};

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

/// Counters of a store's page cache, on one accelerator or summed over all.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_cache_stats {
    /// Page accesses served from a frame of the accessing accelerator.
    pub hits: u64,
    /// Page accesses that fetched the page first.
    pub misses: u64,
    /// Of the misses, those filled from another accelerator's copy.
    pub remote: u64,
    /// Copies dropped because another accelerator wrote their page.
    pub invalidations: u64,
    /// Frames.
    pub frames: u64,
    /// Frames holding a page now.
    pub cached: u64,
    /// Of those, written since they were last written back.
    pub dirty: u64,
}

impl From<CacheStats> for p2pdma_cache_stats {
    fn from(s: CacheStats) -> Self {
        Self {
            hits: s.hits,
            misses: s.misses,
            remote: s.remote,
            invalidations: s.invalidations,
            frames: s.frames as u64,
            cached: s.cached as u64,
            dirty: s.dirty as u64,
        }
    }
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

/// p2pdma_store_open() with a page cache of `page`-byte pages (a power of
/// two from 4096 to 2 MiB) over the memories `mems[0..n_mems]`, one per
/// accelerator, each holding at least two pages: accelerator `i`'s copies
/// live in `mems[i]`, every page is homed on one accelerator, and a write
/// on one accelerator drops the others' copies. Written pages stay in the
/// cache until evicted or flushed, or also go to the device at once when
/// `write_through` is not 0.
///
/// Returns 0, or a negative errno: -EINVAL for NULL arguments, no memory
/// (`n_mems` 0) or more than 64, a bad page size, or the errors of
/// p2pdma_store_open(). On failure `*out` is NULL.
///
/// # Safety
///
/// `engine` and `file` must be NULL or live handles; `mems` must be NULL or
/// point to `n_mems` pointers, each NULL or a live handle; `out` must be
/// NULL or point to writable storage for a pointer.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn p2pdma_store_open_cached(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    format: c_int,
    max_objects: u64,
    mems: *const *const p2pdma_mem,
    n_mems: usize,
    page: usize,
    write_through: c_int,
    out: *mut *mut p2pdma_store,
) -> c_int {
    status("p2pdma_store_open_cached", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or live handles, and NULL or an
        // array of `n_mems` handle pointers.
        let (e, f, ptrs) = unsafe {
            (
                raw::handle(engine, "engine")?,
                raw::handle(file, "file")?,
                raw::structs(mems, n_mems, "mems")?,
            )
        };
        let mems = ptrs
            .iter()
            // SAFETY: Each pointer is NULL or a live handle (the contract).
            .map(|&m| unsafe { raw::handle(m, "mems[i]") }.map(|m| m.mem.clone()))
            .collect::<Result<Vec<Arc<dyn DeviceMemory>>, Failure>>()?;
        let policy = if write_through != 0 {
            WritePolicy::WriteThrough
        } else {
            WritePolicy::WriteBack
        };
        let cache = PageCache::shared(mems, page, policy)?;
        let backing = Arc::new(EngineBacking::new(e.engine.clone(), f.file.clone()));
        let store = if format != 0 {
            Store::format(backing, max_objects)
        } else {
            Store::initialize(backing)
        }?;
        *out = raw::into_handle(p2pdma_store {
            store: Arc::new(store.with_cache(cache)),
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
        let range = MemRange::new(m.mem.as_ref(), mem_offset, n)?;
        Ok(s.store.pread(id, offset, range)? as i64)
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
        let range = MemRange::new(m.mem.as_ref(), mem_offset, n)?;
        Ok(s.store.pwrite(id, offset, range)? as i64)
    })
}

/// p2pdma_store_read() through accelerator `accel`'s copies of the cache
/// (p2pdma_store_read() picks the accelerator whose memory `mem` is).
/// Returns `n`, or a negative errno (-EINVAL also for an accelerator the
/// cache does not span).
///
/// # Safety
///
/// `store` and `mem` must be NULL or live handles.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_read_on(
    store: *const p2pdma_store,
    accel: u32,
    id: u64,
    offset: u64,
    n: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
) -> i64 {
    call("p2pdma_store_read_on", i64::from, || {
        // SAFETY: The caller passes NULL or live handles.
        let (s, m) = unsafe { io(store, mem) }?;
        let range = MemRange::new(m.mem.as_ref(), mem_offset, n)?;
        let a = accel as usize;
        Ok(s.store.pread_on(a, id, offset, range)? as i64)
    })
}

/// p2pdma_store_write() into accelerator `accel`'s copy of the cache; every
/// other accelerator's copy of the pages written is dropped. Returns `n`,
/// or a negative errno.
///
/// # Safety
///
/// `store` and `mem` must be NULL or live handles.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_write_on(
    store: *const p2pdma_store,
    accel: u32,
    id: u64,
    offset: u64,
    n: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
) -> i64 {
    call("p2pdma_store_write_on", i64::from, || {
        // SAFETY: The caller passes NULL or live handles.
        let (s, m) = unsafe { io(store, mem) }?;
        let range = MemRange::new(m.mem.as_ref(), mem_offset, n)?;
        let a = accel as usize;
        Ok(s.store.pwrite_on(a, id, offset, range)? as i64)
    })
}

/// The cache's counters on accelerator `accel` (summed over all when
/// `accel` is -1) into `*out`. Returns 0, or a negative errno: -EINVAL for
/// NULL arguments, a store without a cache, or an accelerator it does not
/// span.
///
/// # Safety
///
/// `store` must be NULL or a live handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_cache_stats(
    store: *const p2pdma_store,
    accel: i32,
    out: *mut p2pdma_cache_stats,
) -> c_int {
    status("p2pdma_store_cache_stats", || {
        // SAFETY: The caller passes NULL or a live handle and NULL or a
        // writable struct.
        let (s, out) = unsafe { (raw::handle(store, "store")?, raw::out_struct(out, "out")?) };
        let cache = s
            .store
            .cache()
            .ok_or_else(|| p2pdma::Error::InvalidArgument("the store has no cache".into()))?;
        let stats = match usize::try_from(accel) {
            Ok(a) => cache.stats_on(a)?,
            Err(_) if accel == -1 => cache.stats(),
            Err(_) => {
                return Err(p2pdma::Error::InvalidArgument(format!("accelerator {accel}")).into())
            }
        };
        *out = stats.into();
        Ok(0)
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

/// p2pdma_store_prefetch(), the read landing in `mem` at `mem_offset`
/// itself (by P2P where the engine can): p2pdma_store_consume() into the
/// same place then copies nothing. Returns 0 or a negative errno (-EINVAL
/// when the range does not fit in `mem`, -ERANGE past the object's end).
///
/// # Safety
///
/// `store` and `mem` must be NULL or live handles; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_store_prefetch_into(
    store: *const p2pdma_store,
    id: u64,
    offset: u64,
    n: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    out: *mut *mut p2pdma_prefetch,
) -> c_int {
    status("p2pdma_store_prefetch_into", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or live handles.
        let (s, m) = unsafe { io(store, mem) }?;
        let prefetch = s
            .store
            .pread_prefetch_into(id, offset, n, m.mem.clone(), mem_offset)?;
        *out = raw::into_handle(p2pdma_prefetch { prefetch });
        Ok(0)
    })
}

/// One NVMe command a prefetch submitted: its I/O queue and its command
/// identifier there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_command_id {
    /// The I/O queue's id.
    pub queue: u16,
    /// The command identifier (CID).
    pub cid: u16,
}

/// The NVMe commands `prefetch` has submitted so far, where the store's
/// device is a namespace the library drives (the queues path; none
/// elsewhere): up to `n` of them into `out`. Returns how many there are
/// (more than `n` when `out` is too short), or a negative errno.
///
/// # Safety
///
/// `prefetch` must be NULL or a live prefetch; `out` NULL (with `n` 0) or
/// writable for `n` entries.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_prefetch_commands(
    prefetch: *const p2pdma_prefetch,
    out: *mut p2pdma_command_id,
    n: usize,
) -> i64 {
    call("p2pdma_prefetch_commands", i64::from, || {
        // SAFETY: The caller passes NULL or a live prefetch, and NULL or
        // `n` writable entries.
        let (p, out) = unsafe {
            (
                raw::handle(prefetch, "prefetch")?,
                raw::structs_mut(out, n, "out")?,
            )
        };
        let ids = p.prefetch.commands();
        for (o, c) in out.iter_mut().zip(&ids) {
            *o = p2pdma_command_id {
                queue: c.queue,
                cid: c.cid,
            };
        }
        Ok(ids.len() as i64)
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
        let range = MemRange::new(m.mem.as_ref(), mem_offset, n)?;
        Ok(s.store.consume_prefetch_pread(p.prefetch, range)? as i64)
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
