// SPDX-License-Identifier: GPL-2.0

//! User mappings of the module's file: `vm_pgoff`, `VM_MAYSHARE`, `vm_ops`
//! and write-combining, which upstream's `VmaNew` cannot reach, and the
//! page cache mapping through which user mappings are zapped.

use core::ptr::NonNull;

use kernel::{
    bindings,
    ffi::{
        c_uint,
        c_void, //
    },
    fs::File,
    mm::virt::{
        VmaMixedMap,
        VmaNew, //
    },
    prelude::*,
    sync::Arc, //
};

mod raw {
    use kernel::{
        bindings,
        ffi::{
            c_ulong,
            c_void, //
        },
    };

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: static inline functions, macros, module parameters and
        // operation tables.
        pub(super) fn p2pdma_helper_vma_pgoff(vma: *mut bindings::vm_area_struct) -> c_ulong;
        pub(super) fn p2pdma_helper_vma_shared(vma: *mut bindings::vm_area_struct) -> bool;
        pub(super) fn p2pdma_helper_vma_setup(
            vma: *mut bindings::vm_area_struct,
            private: *mut c_void,
        );
        pub(super) fn p2pdma_helper_zap(
            mapping: *mut bindings::address_space,
            offset: u64,
            len: u64,
        );
    }
}

/// Bytes in a page.
pub(crate) const PAGE_SIZE: u64 = kernel::page::PAGE_SIZE as u64;

/// The `vm_pgoff` and whether it is a shared mapping (`VmaNew` has neither).
pub(crate) fn vma_pgoff_shared(vma: &VmaNew) -> (u64, bool) {
    // SAFETY: `vma` is a valid VMA under construction.
    unsafe {
        (
            raw::p2pdma_helper_vma_pgoff(vma.as_ptr()) as u64,
            raw::p2pdma_helper_vma_shared(vma.as_ptr()),
        )
    }
}

/// Makes `vma` write-combined and populated on fault by this module, with
/// `private` as its data (`vm_ops`, which `VmaNew` cannot set).
///
/// # Safety
///
/// `private` must be a reference the VMA owns from now on, as the vm_ops
/// callbacks in memory.rs expect.
pub(crate) unsafe fn vma_setup(vma: &VmaNew, private: *const c_void) {
    // SAFETY: `vma` is a valid VMA under construction, not yet visible.
    unsafe { raw::p2pdma_helper_vma_setup(vma.as_ptr(), private.cast_mut()) }
}

/// The page cache mapping (`f_mapping`) of an open file; user mappings of the
/// file are reached through it.
///
/// # Invariants
///
/// Points to the `address_space` of `inode`, on which this object holds a
/// reference, so it stays valid however long the object lives (past the
/// file's release, too).
pub(crate) struct FileMapping {
    mapping: NonNull<bindings::address_space>,
    inode: NonNull<bindings::inode>,
}

// SAFETY: An `address_space` may be used, and an inode reference dropped,
// from any thread.
unsafe impl Send for FileMapping {}
// SAFETY: See above.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// The mapping of `file`.
    pub(crate) fn of(file: &File) -> Result<Self> {
        // SAFETY: `file` is a valid open file: its mapping and that
        // mapping's host inode are valid while it is open.
        let (mapping, inode) = unsafe {
            let mapping = (*file.as_ptr()).f_mapping;
            let inode = if mapping.is_null() {
                core::ptr::null_mut()
            } else {
                (*mapping).host
            };
            (mapping, inode)
        };
        let mapping = NonNull::new(mapping).ok_or(EINVAL)?;
        let inode = NonNull::new(inode).ok_or(EINVAL)?;
        // SAFETY: The inode is alive (the file holds it); take our own
        // reference. INVARIANT: `mapping` is the inode's.
        unsafe { bindings::ihold(inode.as_ptr()) };
        Ok(Self { mapping, inode })
    }

    /// Removes every user mapping of file bytes `[offset, offset + len)`;
    /// later accesses fault, and the fault handler decides.
    pub(crate) fn zap(&self, offset: u64, len: u64) {
        // SAFETY: By the type invariant the mapping is valid.
        unsafe { raw::p2pdma_helper_zap(self.mapping.as_ptr(), offset, len) }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `of`.
        unsafe { bindings::iput(self.inode.as_ptr()) }
    }
}

// Callbacks from helpers.c.

/// `vm_ops->open`: a VMA was copied (split, moved); it holds its own
/// allocation reference.
#[no_mangle]
extern "C" fn p2pdma_vma_open(alloc: *mut c_void) {
    // SAFETY: `vm_private_data` of our VMAs is a reference from
    // `Arc::into_raw` (see `Alloc::mmap`), alive while the VMA is; it stays
    // the old VMA's.
    let old = core::mem::ManuallyDrop::new(unsafe {
        Arc::from_raw(alloc.cast_const().cast::<crate::memory::Alloc>())
    });
    // The new VMA's own reference, under the same pointer.
    let _ = Arc::into_raw(Arc::clone(&old));
    crate::memory::vma_open(&old);
}

/// `vm_ops->close`: a VMA went away with its allocation reference.
#[no_mangle]
extern "C" fn p2pdma_vma_close(alloc: *mut c_void) {
    // SAFETY: As for `p2pdma_vma_open`; the VMA's reference is given back.
    let alloc = unsafe { Arc::from_raw(alloc.cast_const().cast::<crate::memory::Alloc>()) };
    crate::memory::vma_close(alloc);
}

/// `vm_ops->fault`.
#[no_mangle]
extern "C" fn p2pdma_vma_fault(alloc: *mut c_void, vma: *mut bindings::vm_area_struct) -> c_uint {
    // SAFETY: The fault handler runs with the mmap (or VMA) read lock held,
    // and our VMAs are `VM_MIXEDMAP` (set in `Alloc::mmap`).
    let vma = unsafe { VmaMixedMap::from_raw(vma) };
    // SAFETY: As for `p2pdma_vma_open`.
    let alloc = unsafe { borrow_alloc(alloc) };
    // SAFETY: Reads the VMA's offset under the lock held by the caller.
    let pgoff = unsafe { raw::p2pdma_helper_vma_pgoff(vma.as_ptr()) } as u64;
    match crate::memory::vma_fault(alloc, vma, pgoff) {
        Ok(()) => bindings::vm_fault_reason_VM_FAULT_NOPAGE,
        Err(e) if e == ENOMEM => bindings::vm_fault_reason_VM_FAULT_OOM,
        Err(_) => bindings::vm_fault_reason_VM_FAULT_SIGBUS,
    }
}

/// Borrows the allocation a VMA holds.
///
/// # Safety
///
/// `p` is a VMA's `vm_private_data` set by `Alloc::mmap`, alive for `'a`.
unsafe fn borrow_alloc<'a>(p: *mut c_void) -> &'a crate::memory::Alloc {
    // SAFETY: `p` came from `Arc::into_raw` and the VMA keeps it alive.
    unsafe { &*p.cast_const().cast::<crate::memory::Alloc>() }
}
