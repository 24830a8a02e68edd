// SPDX-License-Identifier: GPL-2.0

//! User mappings of the module's file: `vm_pgoff`, `VM_MAYSHARE`, `vm_ops`
//! and write-combining, which upstream's `VmaNew` cannot reach, and the
//! page cache mapping through which user mappings are zapped; and the page
//! frames of pages and of scatter-gather tables (upstream's `Page` has no
//! `page_to_pfn`, and `SGTable` walks only the DMA side of a table).

use core::{
    marker::PhantomData,
    mem::ManuallyDrop,
    ptr::NonNull, //
};

use kernel::{
    bindings,
    fs::File,
    mm::virt::{
        VmaMixedMap,
        VmaNew, //
    },
    prelude::*,
    sync::Arc, //
};

mod raw {
    use kernel::bindings;

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: `pgprot_writecombine` is a macro on most architectures;
        // `page_to_pfn`, `sg_page` and `sg_next` are macros or static inlines.
        pub(super) fn p2pdma_helper_vma_writecombine(vma: *mut bindings::vm_area_struct);
        pub(super) fn p2pdma_helper_page_to_pfn(page: *mut bindings::page) -> usize;
        pub(super) fn p2pdma_helper_sg_page(sg: *mut bindings::scatterlist) -> *mut bindings::page;
        pub(super) fn p2pdma_helper_sg_next(
            sg: *mut bindings::scatterlist,
        ) -> *mut bindings::scatterlist;
    }
}

/// Bytes in a page.
pub(crate) const PAGE_SIZE: u64 = kernel::page::PAGE_SIZE as u64;

/// Runs of consecutive page frames, each `(first, end)`, in the order of the
/// pages they were made from (a page may come more than once).
pub(crate) struct PfnRuns(KVVec<(u64, u64)>);

impl PfnRuns {
    /// No frames.
    pub(crate) fn new() -> Self {
        Self(KVVec::new())
    }

    /// Adds `n` frames from `pfn`, to the last run if they continue it.
    fn push(&mut self, pfn: u64, n: u64) -> Result {
        let end = pfn.checked_add(n).ok_or(EINVAL)?;
        match self.0.last_mut() {
            Some(last) if last.1 == pfn => last.1 = end,
            _ => self.0.push((pfn, end), GFP_KERNEL)?,
        }
        Ok(())
    }

    /// The frames of `pages`.
    ///
    /// # Safety
    ///
    /// Every pointer in `pages` is a valid page.
    pub(crate) unsafe fn of_pages(pages: &[*mut bindings::page]) -> Result<Self> {
        let mut runs = Self::new();
        for &page in pages {
            // SAFETY: The caller guarantees that the page is valid.
            let pfn = unsafe { raw::p2pdma_helper_page_to_pfn(page) };
            runs.push(pfn as u64, 1)?;
        }
        Ok(runs)
    }

    /// The frames of the pages of the CPU side of `sgt`, and whether some
    /// entry has no page (device memory without `struct page`, or a table
    /// an exporter stripped for its importers).
    ///
    /// # Safety
    ///
    /// `sgt` is a valid table that does not change during the call.
    pub(crate) unsafe fn of_table(sgt: *const bindings::sg_table) -> Result<(Self, bool)> {
        let mut runs = Self::new();
        let mut pageless = false;
        // SAFETY: The caller guarantees that the table is valid.
        let (mut sg, n) = unsafe { ((*sgt).sgl, (*sgt).orig_nents) };
        for _ in 0..n {
            if sg.is_null() {
                break;
            }
            // SAFETY: `sg` is one of the table's `orig_nents` entries.
            let (page, offset, length) = unsafe {
                (
                    raw::p2pdma_helper_sg_page(sg),
                    u64::from((*sg).offset),
                    u64::from((*sg).length),
                )
            };
            if page.is_null() {
                pageless = true;
            } else if length > 0 {
                // SAFETY: A table's page is valid while the table is.
                let pfn = unsafe { raw::p2pdma_helper_page_to_pfn(page) } as u64;
                let first = pfn + offset / PAGE_SIZE;
                let n = (offset % PAGE_SIZE + length).div_ceil(PAGE_SIZE);
                runs.push(first, n)?;
            }
            // SAFETY: As above; NULL after the last entry.
            sg = unsafe { raw::p2pdma_helper_sg_next(sg) };
        }
        Ok((runs, pageless))
    }

    /// The runs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().copied()
    }
}

/// The `vm_pgoff` and whether it is a shared mapping (`VmaNew` has no
/// `vm_pgoff` accessor).
pub(crate) fn vma_pgoff_shared(vma: &VmaNew) -> (u64, bool) {
    // SAFETY: `vma` is a valid VMA under construction; nothing else writes
    // its offset meanwhile.
    let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff } as u64;
    (pgoff, vma.flags() & bindings::VM_MAYSHARE != 0)
}

/// What a user mapping (VMA) of an object does when the kernel copies it,
/// removes it or faults in it. Each VMA owns one `Arc` reference on the
/// object, as its `vm_private_data`.
pub(crate) trait VmaOps: Send + Sync + Sized + 'static {
    /// A VMA was copied (split, moved); the copy already holds a reference
    /// of its own on `this`.
    fn open(this: &Arc<Self>);

    /// A VMA went away, giving back its reference.
    fn close(this: Arc<Self>);

    /// Maps the pages `vma` covers, whose file offset starts at page
    /// `pgoff`. `ENOMEM` becomes `VM_FAULT_OOM`, any other error `SIGBUS`.
    fn fault(this: &Self, vma: &VmaMixedMap, pgoff: u64) -> Result;
}

/// Makes `vma` write-combined and populated on fault by `T`'s [`VmaOps`],
/// handing it the reference `this` (`vm_ops`, `vm_private_data` and
/// `vm_page_prot`, which `VmaNew` cannot set).
pub(crate) fn vma_setup<T: VmaOps>(vma: &VmaNew, this: Arc<T>) {
    let ptr = vma.as_ptr();
    // SAFETY: `vma` is a valid VMA under construction, not yet visible to
    // anyone else. INVARIANT: its private data is a reference from
    // `Arc::into_raw` of a `T`, owned by the VMA, and its operations are
    // `T`'s, which expect exactly that.
    unsafe {
        raw::p2pdma_helper_vma_writecombine(ptr);
        (*ptr).vm_private_data = Arc::into_raw(this).cast_mut().cast();
        (*ptr).vm_ops = VmOps::<T>::build();
    }
}

/// The `vm_operations_struct` of VMAs set up by [`vma_setup`] for `T`.
struct VmOps<T>(PhantomData<T>);

impl<T: VmaOps> VmOps<T> {
    const OPS: bindings::vm_operations_struct = bindings::vm_operations_struct {
        open: Some(Self::open),
        close: Some(Self::close),
        fault: Some(Self::fault),
        ..pin_init::zeroed()
    };

    const fn build() -> &'static bindings::vm_operations_struct {
        &Self::OPS
    }

    /// Borrows the object a VMA holds.
    ///
    /// # Safety
    ///
    /// `vma` is a live VMA set up by [`vma_setup`] for `T`, and stays so for
    /// `'a`.
    unsafe fn object<'a>(vma: *mut bindings::vm_area_struct) -> &'a T {
        // SAFETY: The private data came from `Arc::into_raw` of a `T` and the
        // VMA keeps that reference alive.
        unsafe { &*(*vma).vm_private_data.cast_const().cast::<T>() }
    }

    /// `vm_ops->open`: a VMA was copied; the copy gets its own reference,
    /// under the same pointer.
    ///
    /// # Safety
    ///
    /// Called by the kernel with a VMA copied from one set up by
    /// [`vma_setup`] for `T`, whose reference it still shares.
    unsafe extern "C" fn open(vma: *mut bindings::vm_area_struct) {
        // SAFETY: The private data is a reference from `Arc::into_raw`,
        // alive while the VMA it was copied from is; it stays that VMA's.
        let old = ManuallyDrop::new(unsafe {
            Arc::from_raw((*vma).vm_private_data.cast_const().cast::<T>())
        });
        // The new VMA's own reference, under the same pointer.
        let _ = Arc::into_raw(Arc::clone(&old));
        T::open(&old);
    }

    /// `vm_ops->close`: a VMA went away with its reference.
    ///
    /// # Safety
    ///
    /// Called by the kernel once per VMA set up by [`vma_setup`] for `T`
    /// (or copied from one).
    unsafe extern "C" fn close(vma: *mut bindings::vm_area_struct) {
        // SAFETY: As for `open`; the VMA's reference is given back.
        let this = unsafe { Arc::from_raw((*vma).vm_private_data.cast_const().cast::<T>()) };
        T::close(this);
    }

    /// `vm_ops->fault`.
    ///
    /// # Safety
    ///
    /// Called by the kernel for a fault in a VMA set up by [`vma_setup`]
    /// for `T`, with the mmap (or VMA) read lock held.
    unsafe extern "C" fn fault(vmf: *mut bindings::vm_fault) -> bindings::vm_fault_t {
        // SAFETY: `vmf` is the kernel's description of this fault.
        let vma = unsafe { (*vmf).__bindgen_anon_1.vma };
        // SAFETY: The lock is held, and the VMA is `VM_MIXEDMAP` (its owner
        // sets that before `vma_setup`; `vm_insert_page` checks it anyway).
        let mixed = unsafe { VmaMixedMap::from_raw(vma) };
        // SAFETY: Reads the VMA's offset under the lock held by the caller.
        let pgoff = unsafe { (*vma).vm_pgoff } as u64;
        // SAFETY: The VMA is live during its fault.
        let this = unsafe { Self::object(vma) };
        match T::fault(this, mixed, pgoff) {
            Ok(()) => bindings::vm_fault_reason_VM_FAULT_NOPAGE,
            Err(e) if e == ENOMEM => bindings::vm_fault_reason_VM_FAULT_OOM,
            Err(_) => bindings::vm_fault_reason_VM_FAULT_SIGBUS,
        }
    }
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
        unsafe {
            bindings::unmap_mapping_range(self.mapping.as_ptr(), offset as i64, len as i64, 1)
        }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `of`.
        unsafe { bindings::iput(self.inode.as_ptr()) }
    }
}
