//! Host memory the caller owns, lent to the engine for the length of its
//! use: a buffer of a language binding (a Python array, a tensor), a
//! storage engine's own cache page.
//!
//! The engine treats it like the host-memory device: copies in and out, and
//! a [`DmaTarget`] that `O_DIRECT` may use where it is aligned. What keeps
//! the memory alive travels with it (`keep`), so a transfer that outlives
//! the caller's frame still writes into live memory.

use std::{any::Any, fmt};

use super::{DeviceMemory, DmaMemory, MemoryKind};
use crate::{error::check_range, sys::DmaTarget, Result};

/// Host memory lent by its owner (see the module's documentation).
pub struct BorrowedHost {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    _keep: Box<dyn Any + Send + Sync>,
}

// SAFETY: The memory is plain host memory that `keep` holds alive; the
// engine never makes references into it (see `DeviceMemory`), and the
// creator promised it may be written and read from any thread.
#[allow(unsafe_code)]
unsafe impl Send for BorrowedHost {}
// SAFETY: As for `Send`: every access is an explicit copy or I/O on a range.
#[allow(unsafe_code)]
unsafe impl Sync for BorrowedHost {}

impl fmt::Debug for BorrowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowedHost")
            .field("len", &self.len)
            .field("writable", &self.writable)
            .finish()
    }
}

impl BorrowedHost {
    /// Lends `len` bytes at `ptr`, kept alive by `keep` until the last
    /// transfer using them has ended. A read-only loan (`writable` false)
    /// refuses every copy and transfer into it.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads of `len` bytes (and for writes, when
    /// `writable`) for as long as `keep` lives, from any thread; nothing
    /// else may move or free the memory meanwhile. Concurrent use of
    /// overlapping ranges is unordered, as for [`DeviceMemory`]. A writable
    /// loan is a DMA target ([`DmaMemory`]): storage writes it, so no Rust
    /// reference into it may be used while the loan lives, and nothing may
    /// trust its contents for memory safety.
    #[allow(unsafe_code)]
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        writable: bool,
        keep: Box<dyn Any + Send + Sync>,
    ) -> Self {
        Self {
            ptr,
            len,
            writable,
            _keep: keep,
        }
    }

    /// Whether transfers may write into the memory.
    pub fn writable(&self) -> bool {
        self.writable
    }

    fn check_writable(&self) -> Result<()> {
        match self.writable {
            true => Ok(()),
            false => Err(crate::Error::InvalidArgument(
                "the buffer is read-only: nothing can be read into it".into(),
            )),
        }
    }
}

impl DeviceMemory for BorrowedHost {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    #[allow(unsafe_code)]
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_writable()?;
        check_range(offset, src.len(), self.len)?;
        // SAFETY: In bounds (checked) of memory the creator lent for
        // writing; `src` is the caller's own and cannot overlap a range no
        // reference is ever made to.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) };
        Ok(())
    }

    #[allow(unsafe_code)]
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: In bounds (checked) of memory the creator lent for
        // reading.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// One copy from `src` into the loan, a `memmove`: `src` may be a
    /// mapping the loan itself lies in.
    #[allow(unsafe_code)]
    unsafe fn write_at_raw(&self, offset: usize, src: *const u8, len: usize) -> Result<()> {
        self.check_writable()?;
        check_range(offset, len, self.len)?;
        // SAFETY: In bounds (checked) of memory the creator lent for
        // writing; `src..src + len` is readable (the caller's promise).
        // Both are reached through raw pointers alone, and `copy` allows
        // them to overlap.
        unsafe { std::ptr::copy(src, self.ptr.add(offset), len) };
        Ok(())
    }

    /// One copy out of the loan into `dst`, a `memmove` (see
    /// [`write_at_raw`](Self::write_at_raw)); a read-only loan too.
    #[allow(unsafe_code)]
    unsafe fn read_at_raw(&self, offset: usize, dst: *mut u8, len: usize) -> Result<()> {
        check_range(offset, len, self.len)?;
        // SAFETY: In bounds (checked) of memory the creator lent for
        // reading; `dst..dst + len` is writable (the caller's promise).
        // Both are reached through raw pointers alone, and `copy` allows
        // them to overlap.
        unsafe { std::ptr::copy(self.ptr.add(offset), dst, len) };
        Ok(())
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

// SAFETY: `new`'s contract: the memory is valid for `len` bytes as long as
// `keep`, which this value holds, and nothing else moves or frees it; the
// loan makes no reference into it. A read-only loan gives no target.
#[allow(unsafe_code)]
unsafe impl DmaMemory for BorrowedHost {
    fn dma_target(&self) -> Option<DmaTarget> {
        // Storage writes into a DMA target on reads: a read-only loan has
        // none, so every path goes through `write_at`, which refuses.
        self.writable.then_some(DmaTarget {
            ptr: self.ptr,
            len: self.len,
            p2p: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Error;

    #[test]
    fn copies_check_bounds_and_keep_the_owner_alive() {
        let owner = Arc::new(std::sync::Mutex::new(vec![0u8; 64]));
        let ptr = owner.lock().unwrap().as_mut_ptr();
        #[allow(unsafe_code)]
        // SAFETY: `owner` is kept by the loan and never resized.
        let m = unsafe { BorrowedHost::new(ptr, 64, true, Box::new(owner.clone())) };
        assert_eq!(Arc::strong_count(&owner), 2);
        m.write_at(60, b"abcd").unwrap();
        let mut out = [0u8; 4];
        m.read_at(60, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        assert_eq!(&owner.lock().unwrap()[60..], b"abcd");
        assert!(matches!(
            m.write_at(61, b"abcd"),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.read_at(usize::MAX, &mut out),
            Err(Error::OutOfBounds { .. })
        ));
        drop(m);
        assert_eq!(Arc::strong_count(&owner), 1);
    }

    #[test]
    fn a_read_only_loan_takes_no_writes() {
        let data = Box::new([7u8; 16]);
        let ptr = data.as_ptr().cast_mut();
        #[allow(unsafe_code)]
        // SAFETY: `data` is kept by the loan; nothing writes through it.
        let m = unsafe { BorrowedHost::new(ptr, 16, false, Box::new(data)) };
        assert!(m.dma().and_then(|d| d.dma_target()).is_none());
        assert!(matches!(
            m.write_at(0, b"x"),
            Err(Error::InvalidArgument(_))
        ));
        let mut out = [0u8; 16];
        m.read_at(0, &mut out).unwrap();
        assert_eq!(out, [7u8; 16]);
    }
}
