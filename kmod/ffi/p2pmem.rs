// SPDX-License-Identifier: GPL-2.0

//! P2P memory allocated from an accelerator's BAR (upstream has no P2PDMA
//! abstraction).

use core::ptr::NonNull;

use kernel::{
    bindings,
    dma::DataDirection,
    ffi::c_void,
    mm::virt::VmaMixedMap,
    page::BorrowedPage,
    pci,
    prelude::*,
    sync::aref::ARef, //
};

use super::{
    dma::SgMap,
    mm::{
        PfnRuns,
        PAGE_SIZE, //
    },
    pci::{
        raw_pdev,
        Peer, //
    },
};

mod raw {
    use kernel::{
        bindings,
        ffi::c_void, //
    };

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: the P2P page allocation (see there) and `virt_to_page`,
        // a macro.
        pub(super) fn p2pdma_helper_alloc(pdev: *mut bindings::pci_dev, size: usize)
            -> *mut c_void;
        pub(super) fn p2pdma_helper_put_pages(kaddr: *mut c_void, size: usize);
        pub(super) fn p2pdma_helper_virt_to_page(kaddr: *mut c_void) -> *mut bindings::page;
    }
}

/// A range of P2P memory allocated from an accelerator's BAR, holding one
/// reference on each of its pages (see helpers.c). Dropping it drops those
/// references; each page returns to the device's pool once no mapping or pin
/// holds it either. Upstream has no P2PDMA abstraction.
///
/// # Invariants
///
/// `kaddr` is the kernel address of `size` bytes (a page multiple) of P2P
/// memory of `pdev`, on each page of which this object holds one reference.
pub(crate) struct P2pPages {
    pdev: ARef<pci::Device>,
    kaddr: NonNull<c_void>,
    size: usize,
}

// SAFETY: The pages are device memory with no thread affinity; the page
// references may be dropped from any thread.
unsafe impl Send for P2pPages {}
// SAFETY: Shared access reads the fields, hands the memory's addresses to
// DMA, or writes device memory through raw pointers (`zero`); none forms a
// Rust reference to the memory.
unsafe impl Sync for P2pPages {}

impl P2pPages {
    /// Allocates `size` bytes (a page multiple) of `pdev`'s P2P memory.
    pub(crate) fn alloc(pdev: &ARef<pci::Device>, size: usize) -> Result<Self> {
        // SAFETY: `pdev` is a valid PCI device with registered P2P memory
        // (or none, in which case the call fails).
        let kaddr = unsafe { raw::p2pdma_helper_alloc(raw_pdev(pdev), size) };
        let kaddr = NonNull::new(kaddr).ok_or(ENOMEM)?;
        // INVARIANT: The helper allocated `size` bytes and took one reference
        // per page.
        Ok(Self {
            pdev: pdev.clone(),
            kaddr,
            size,
        })
    }

    /// Splits off the pages outside `[offset, offset + len)`, dropping them;
    /// `EINVAL` (and every page dropped) unless the range is a non-empty run
    /// of whole pages inside this one.
    pub(crate) fn trim(self, offset: usize, len: usize) -> Result<Self> {
        let page = PAGE_SIZE as usize;
        match offset.checked_add(len) {
            Some(end) if len > 0 && offset % page == 0 && len % page == 0 && end <= self.size => {}
            _ => return Err(EINVAL),
        }
        let this = core::mem::ManuallyDrop::new(self);
        let base = this.kaddr.as_ptr().cast::<u8>();
        // SAFETY: `offset` and `len` are page multiples within the allocation
        // (checked above), so both trimmed ends are whole pages this object
        // references.
        unsafe {
            if offset > 0 {
                raw::p2pdma_helper_put_pages(base.cast(), offset);
            }
            let tail = offset + len;
            if tail < this.size {
                raw::p2pdma_helper_put_pages(base.add(tail).cast(), this.size - tail);
            }
        }
        // SAFETY: `this` is not used again; its `pdev` reference moves out.
        let pdev = unsafe { core::ptr::read(&this.pdev) };
        // INVARIANT: the pages kept are `[offset, offset + len)` of the old
        // range, whose references this object still holds.
        Ok(Self {
            pdev,
            // SAFETY: `offset` is within the allocation (checked above), so
            // the result is a non-null address inside it.
            kaddr: unsafe { NonNull::new_unchecked(base.add(offset).cast()) },
            size: len,
        })
    }

    /// Writes zeros over the whole range. Meant for fresh allocations,
    /// before anyone else can reach the memory.
    pub(crate) fn zero(&self) {
        // SAFETY: By the type invariant `kaddr` is `size` bytes of memory this
        // object holds, mapped in the kernel's address space; the write goes
        // through a raw pointer, so it races with no Rust reference.
        unsafe { core::ptr::write_bytes(self.kaddr.as_ptr().cast::<u8>(), 0, self.size) };
    }

    /// Bytes held.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The kernel address of byte `offset`, `None` past the last byte.
    pub(super) fn kaddr_at(&self, offset: usize) -> Option<*mut c_void> {
        if offset >= self.size {
            return None;
        }
        // SAFETY: `offset` is inside the `size` bytes at `kaddr` (checked
        // above), so the result stays in the same allocation.
        Some(unsafe { self.kaddr.as_ptr().cast::<u8>().add(offset).cast() })
    }

    /// The page holding byte `offset`, and the byte's offset in it; `None`
    /// past the last byte.
    pub(super) fn page_at(&self, offset: usize) -> Option<(NonNull<bindings::page>, u32)> {
        let kaddr = self.kaddr_at(offset)?;
        // SAFETY: `kaddr` lies in memory this object holds (type invariant),
        // mapped in the kernel's linear map, so it has a `struct page`.
        let page = NonNull::new(unsafe { raw::p2pdma_helper_virt_to_page(kaddr) })?;
        Some((page, (kaddr as usize % PAGE_SIZE as usize) as u32))
    }

    /// PCI bus address of byte `offset`, `None` past the last byte.
    pub(crate) fn bus_addr(&self, offset: usize) -> Option<u64> {
        let kaddr = self.kaddr_at(offset)?;
        // SAFETY: `kaddr` lies in P2P memory of `pdev` (type invariant).
        Some(unsafe { bindings::pci_p2pmem_virt_to_bus(raw_pdev(&self.pdev), kaddr) })
    }

    /// The accelerator the memory belongs to.
    pub(crate) fn pdev(&self) -> &ARef<pci::Device> {
        &self.pdev
    }

    /// Maps pages `[first_page, first_page + npages)` into `vma` from its
    /// start (pages already there are kept).
    pub(crate) fn insert_into(
        &self,
        vma: &VmaMixedMap,
        first_page: usize,
        npages: usize,
    ) -> Result {
        let end = first_page.checked_add(npages).ok_or(EINVAL)?;
        if end as u64 > self.size as u64 / PAGE_SIZE {
            return Err(EINVAL);
        }
        for i in 0..npages {
            let (page, _) = self
                .page_at((first_page + i) * PAGE_SIZE as usize)
                .ok_or(EINVAL)?;
            // SAFETY: The page is valid and referenced by `self` for the
            // duration of the borrow.
            let page = unsafe { BorrowedPage::from_raw(page) };
            match vma.vm_insert_page(vma.start() + i * PAGE_SIZE as usize, &page) {
                Ok(()) => {}
                Err(e) if e == EBUSY => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// DMA-maps `[offset, offset + len)` for `peer` by the DMA API, which
    /// applies the P2PDMA rules (`dma_map_sgtable`); `EREMOTEIO` when the
    /// kernel does not allow it, `EINVAL` unless the range is a non-empty
    /// run of whole pages of this memory. Also says whether it mapped by
    /// bus address.
    ///
    /// The mapping does not hold the pages: whoever keeps it keeps them
    /// too, and drops it first.
    pub(crate) fn map_for(
        &self,
        peer: &Peer,
        offset: usize,
        len: u64,
        dir: DataDirection,
    ) -> Result<(SgMap, bool)> {
        let mut pages = self.pages(offset, len)?;
        // SAFETY: The pages lie in the allocation, which `self` keeps
        // referenced while the caller holds it.
        unsafe { SgMap::map_pages(peer, &mut pages, dir) }
    }

    /// The page frames of `[offset, offset + len)`; `EINVAL` as for
    /// [`P2pPages::map_for`].
    pub(crate) fn pfn_runs(&self, offset: usize, len: u64) -> Result<PfnRuns> {
        let pages = self.pages(offset, len)?;
        // SAFETY: The pages lie in the allocation, which `self` keeps
        // referenced during the call.
        unsafe { PfnRuns::of_pages(&pages) }
    }

    /// The pages of `[offset, offset + len)`; `EINVAL` unless the range is
    /// a non-empty run of whole pages of this memory.
    fn pages(&self, offset: usize, len: u64) -> Result<KVVec<*mut bindings::page>> {
        let len_bytes = usize::try_from(len).map_err(|_| EINVAL)?;
        let end = offset.checked_add(len_bytes).ok_or(EINVAL)?;
        let page = PAGE_SIZE as usize;
        if len_bytes == 0 || offset % page != 0 || len_bytes % page != 0 || end > self.size {
            return Err(EINVAL);
        }
        let mut pages = KVVec::with_capacity(len_bytes / page, GFP_KERNEL)?;
        for at in (offset..end).step_by(page) {
            pages.push(self.page_at(at).ok_or(EINVAL)?.0.as_ptr(), GFP_KERNEL)?;
        }
        Ok(pages)
    }
}

impl Drop for P2pPages {
    fn drop(&mut self) {
        // SAFETY: By the type invariant this object holds one reference on
        // each page; it gives them up exactly once, here.
        unsafe { raw::p2pdma_helper_put_pages(self.kaddr.as_ptr(), self.size) };
    }
}
