//! Buffers: what a pointer is, and the memory object the engine moves data
//! through for it.
//!
//! The CUDA driver, when there is one, classifies the pointer: device
//! memory becomes a [`CudaMemory`] lent by the caller, page-locked host
//! memory and memory the driver does not know (ordinary host memory, which
//! cuFile accepts since 12.2) a [`BorrowedHost`]. Without a CUDA driver
//! every pointer is host memory.
//!
//! Registered buffers are kept in a table by base address, the memory
//! object made once; a transfer whose pointer lies in one uses it, at the
//! pointer's offset in it. Other pointers get a memory object for the
//! length of the transfer only.

use std::{
    collections::BTreeMap,
    ffi::{c_int, c_void},
    sync::{Arc, RwLock},
};

use p2pdma::{
    memory::{BorrowedHost, CudaMemory},
    sys::cuda::{self, Pointer},
    DeviceMemory, Error,
};

use crate::{
    abi::{op, CUfileError, RDMA_REGISTER, RDMA_RELAXED_ORDERING},
    driver,
    errors::{guard, Fail, Res},
    stats,
};

/// Where a pointer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Host memory, page-locked or not.
    Host,
    /// Device memory of CUDA device `ordinal`.
    Device {
        /// The device.
        ordinal: i32,
    },
}

/// What `ptr` is, by the CUDA driver when there is one. The driver's
/// answers need no current context: the threads that call cuFile (a C
/// program's own, this library's stream workers) may have none.
pub fn classify(ptr: usize) -> Res<Place> {
    if !driver::cuda() {
        return Ok(Place::Host);
    }
    match cuda::pointer(ptr as u64) {
        Ok(Pointer::Device { ordinal, .. }) => Ok(Place::Device { ordinal }),
        // Page-locked host memory, or memory the driver does not know:
        // ordinary host memory.
        Ok(Pointer::Host | Pointer::Unknown) => Ok(Place::Host),
        Err(Error::CudaUnavailable(_)) => Ok(Place::Host),
        // Managed memory and the other kinds the engine cannot address.
        Err(Error::InvalidArgument(_)) => Err(Fail::cu(op::CUDA_MEMORY_TYPE_INVALID)),
        Err(e) => Err(e.into()),
    }
}

/// A memory object for `len` bytes at `ptr`, which the caller keeps valid
/// for as long as the object lives. `writable` host memory may be read
/// into; device memory always may.
///
/// # Safety
/// `[ptr, ptr + len)` is memory of the caller's that stays valid (and
/// writable when `writable`) while the returned object lives.
unsafe fn wrap(ptr: usize, len: usize, writable: bool) -> Res<Arc<dyn DeviceMemory>> {
    match classify(ptr)? {
        // SAFETY: The caller's: device memory of its own, valid while the
        // object lives, which cuFile's contract gives transfers to write.
        Place::Device { .. } => match unsafe { CudaMemory::lend(ptr as u64, len, ()) } {
            Ok(m) => Ok(Arc::new(m)),
            Err(Error::OutOfBounds { .. }) => Err(Fail::cu(op::CUDA_POINTER_RANGE_ERROR)),
            Err(e) => Err(e.into()),
        },
        // SAFETY: The caller's.
        Place::Host => Ok(Arc::new(unsafe {
            BorrowedHost::new(ptr as *mut u8, len, writable, Box::new(()))
        })),
    }
}

/// A registered buffer.
#[derive(Debug)]
struct Region {
    len: usize,
    mem: Arc<dyn DeviceMemory>,
}

static BUFFERS: RwLock<BTreeMap<usize, Region>> = RwLock::new(BTreeMap::new());

/// The registered region holding `ptr`: its base, length and memory.
fn registered(ptr: usize) -> Option<(usize, usize, Arc<dyn DeviceMemory>)> {
    let b = BUFFERS.read().unwrap_or_else(|p| p.into_inner());
    let (&base, r) = b.range(..=ptr).next_back()?;
    (ptr - base < r.len).then(|| (base, r.len, r.mem.clone()))
}

/// The memory and offset in it for `len` bytes at `base + offset`: a
/// registered buffer's, or one made for this transfer.
///
/// # Safety
/// Outside registered buffers, `[base + offset, + len)` is valid memory of
/// the caller's (writable when `writable`) while the returned object lives.
pub unsafe fn resolve(
    base: *const c_void,
    offset: i64,
    len: usize,
    writable: bool,
) -> Res<(Arc<dyn DeviceMemory>, usize)> {
    if base.is_null() || offset < 0 {
        return Err(Fail::INVALID);
    }
    let base = base as usize;
    let start = base
        .checked_add(offset as usize)
        .filter(|s| s.checked_add(len).is_some())
        .ok_or(Fail::INVALID)?;
    if let Some((rbase, rlen, mem)) = registered(base) {
        let at = base - rbase + offset as usize;
        if at.checked_add(len).is_none_or(|end| end > rlen) {
            // The transfer leaves the registered buffer.
            return Err(Fail::INVALID);
        }
        return Ok((mem, at));
    }
    // SAFETY: The caller's.
    Ok((unsafe { wrap(start, len, writable) }?, 0))
}

/// Registers `[base, base + length)`. `flags` is 0 or the RDMA flags
/// (accepted, with no effect).
///
/// # Safety
/// The memory stays valid until it is deregistered.
unsafe fn register(base: *const c_void, length: usize, flags: c_int) -> Res<()> {
    if base.is_null() || length == 0 || flags & !(RDMA_REGISTER | RDMA_RELAXED_ORDERING) != 0 {
        return Err(Fail::INVALID);
    }
    let start = base as usize;
    let end = start.checked_add(length).ok_or(Fail::INVALID)?;
    driver::engine()?;
    // The region starting last before `end` is the only one that can
    // reach into `[start, end)`.
    let overlaps = |b: &BTreeMap<usize, Region>| {
        b.range(..end)
            .next_back()
            .is_some_and(|(&s, r)| s + r.len > start)
    };
    if overlaps(&BUFFERS.read().unwrap_or_else(|p| p.into_inner())) {
        return Err(Fail::cu(op::MEMORY_ALREADY_REGISTERED));
    }
    // SAFETY: The caller's.
    let mem = unsafe { wrap(start, length, true) }?;
    let mut b = BUFFERS.write().unwrap_or_else(|p| p.into_inner());
    if overlaps(&b) {
        return Err(Fail::cu(op::MEMORY_ALREADY_REGISTERED));
    }
    b.insert(start, Region { len: length, mem });
    Ok(())
}

/// Registers a buffer of device or host memory for transfers, which then
/// pass `bufPtr_base` unchanged and an offset in it.
///
/// Errors: `CU_FILE_INVALID_VALUE` for NULL, a length of 0 or unknown
/// flags; `CU_FILE_MEMORY_ALREADY_REGISTERED` when the range overlaps a
/// registered buffer; `CU_FILE_CUDA_POINTER_RANGE_ERROR` for device memory
/// that leaves its allocation; `CU_FILE_CUDA_DRIVER_ERROR` when the CUDA
/// driver fails.
///
/// # Safety
/// The memory stays valid (and for host memory, writable) until
/// `cuFileBufDeregister`.
#[no_mangle]
pub unsafe extern "C" fn cuFileBufRegister(
    bufPtr_base: *const c_void,
    length: usize,
    flags: c_int,
) -> CUfileError {
    // SAFETY: The caller's.
    let status = guard(|| unsafe { register(bufPtr_base, length, flags) });
    let ok = status.err == op::SUCCESS;
    stats::call(stats::Call::BufRegister, ok);
    // A failed registration's memory is not known to be a GPU's.
    let gpu = registered(bufPtr_base as usize)
        .filter(|_| ok)
        .and_then(|(_, _, m)| stats::gpu_of(m.kind()));
    stats::gpu_buffer(gpu, true, ok, length);
    status
}

/// Forgets a registered buffer. Transfers running with it keep their
/// memory object until they end. `CU_FILE_MEMORY_NOT_REGISTERED` for a
/// pointer that is not a registered base, `CU_FILE_INVALID_VALUE` for NULL.
#[no_mangle]
pub extern "C" fn cuFileBufDeregister(bufPtr_base: *const c_void) -> CUfileError {
    guard(|| {
        if bufPtr_base.is_null() {
            return Err(Fail::INVALID);
        }
        let mut b = BUFFERS.write().unwrap_or_else(|p| p.into_inner());
        let gone = b.remove(&(bufPtr_base as usize));
        drop(b);
        stats::call(stats::Call::BufDeregister, gone.is_some());
        // The memory object is dropped outside the lock: a CUDA one talks
        // to the driver on the way out.
        gone.map(|r| stats::gpu_buffer(stats::gpu_of(r.mem.kind()), false, true, 0))
            .ok_or(Fail::cu(op::MEMORY_NOT_REGISTERED))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_do_not_overlap_and_lookups_find_the_region() {
        let mut buf = vec![0u8; 3 * 4096];
        let p = buf.as_mut_ptr();
        let at = |o: usize| p.wrapping_add(o).cast::<c_void>().cast_const();
        // SAFETY: `buf` outlives every registration (deregistered below).
        unsafe {
            assert_eq!(register(at(4096), 4096, 0), Ok(()));
            for (o, len) in [(4096, 1), (0, 4097), (8191, 10), (4100, 4)] {
                assert_eq!(
                    register(at(o), len, 0),
                    Err(Fail::cu(op::MEMORY_ALREADY_REGISTERED)),
                    "{o}+{len}"
                );
            }
            assert_eq!(register(at(0), 4096, 0), Ok(()));
            assert_eq!(register(at(8192), 4096, RDMA_REGISTER), Ok(()));
            assert_eq!(register(at(0), 0, 0), Err(Fail::INVALID));
            assert_eq!(register(std::ptr::null(), 1, 0), Err(Fail::INVALID));
            assert_eq!(register(at(0), 1, 0x100), Err(Fail::INVALID));

            let (mem, off) = resolve(at(4096), 100, 3996, true).unwrap();
            assert_eq!((mem.len(), off), (4096, 100));
            // Inside a region, not at its base: the region, at that offset.
            let (_, off) = resolve(at(4196), 4, 16, true).unwrap();
            assert_eq!(off, 104);
            assert_eq!(
                resolve(at(4096), 100, 3997, true).unwrap_err(),
                Fail::INVALID
            );
            assert_eq!(resolve(at(4096), -1, 1, true).unwrap_err(), Fail::INVALID);
            assert_eq!(
                resolve(std::ptr::null(), 0, 1, true).unwrap_err(),
                Fail::INVALID
            );
        }
        for o in [0, 4096, 8192] {
            assert_eq!(cuFileBufDeregister(at(o)), CUfileError::SUCCESS);
        }
        assert_eq!(
            cuFileBufDeregister(at(0)),
            CUfileError::of(op::MEMORY_NOT_REGISTERED)
        );
        assert_eq!(
            cuFileBufDeregister(std::ptr::null()),
            CUfileError::of(op::INVALID_VALUE)
        );
        // Unregistered: a loan of exactly the transfer's bytes.
        // SAFETY: `buf` outlives the loan.
        let (mem, off) = unsafe { resolve(at(0), 10, 20, false) }.unwrap();
        assert_eq!((mem.len(), off), (20, 0));
        drop(buf);
    }
}
