// SPDX-License-Identifier: GPL-2.0

//! Allocations of accelerator memory and their user mappings.

use kernel::{
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{
        Arc,
        Mutex, //
    },
};

use crate::ffi::{
    FileMapping,
    P2pPages,
    PAGE_SIZE, //
};

/// One allocation made through `ALLOC`, owned by an open file and listed in
/// its device's registry entry (so that an unbind can revoke it).
#[pin_data]
pub(crate) struct Alloc {
    /// Handle returned to user space.
    pub(crate) handle: u64,
    /// Index of the accelerator it came from.
    pub(crate) dev_index: usize,
    /// First page of the allocation in the file's mmap offset space; offsets
    /// are never reused, so zapping them touches only this allocation.
    pub(crate) pgoff: u64,
    /// Bytes allocated.
    pub(crate) size: u64,
    /// The owning file's mapping, through which user mappings are zapped.
    mapping: FileMapping,
    /// The memory; `None` once freed or revoked by an unbind.
    #[pin]
    pages: Mutex<Option<P2pPages>>,
}

impl Alloc {
    /// Wraps freshly allocated pages.
    pub(crate) fn new(
        handle: u64,
        dev_index: usize,
        pgoff: u64,
        mapping: FileMapping,
        pages: P2pPages,
    ) -> Result<Arc<Self>> {
        let size = pages.size() as u64;
        Arc::pin_init(
            pin_init!(Self {
                handle,
                dev_index,
                pgoff,
                size,
                mapping,
                pages <- new_mutex!(Some(pages)),
            }),
            GFP_KERNEL,
        )
    }

    /// Whether `[pgoff, pgoff + npages)` lies inside this allocation.
    pub(crate) fn contains_pages(&self, pgoff: u64, npages: u64) -> bool {
        let npages_total = self.size / PAGE_SIZE;
        pgoff >= self.pgoff
            && npages <= npages_total
            && pgoff - self.pgoff <= npages_total - npages
    }

    /// Maps the allocation's pages from `pgoff` into `vma`.
    pub(crate) fn mmap(&self, vma: &VmaNew, pgoff: u64, npages: u64) -> Result {
        let pages = self.pages.lock();
        let pages = pages.as_ref().ok_or(ENODEV)?;
        // Not inherited across fork, and never grown by mremap.
        vma.set_dontcopy();
        vma.set_dontexpand();
        pages.insert_into(vma, (pgoff - self.pgoff) as usize, npages as usize)
    }

    /// Runs `f` on the memory if it is still there.
    pub(crate) fn with_pages<R>(&self, f: impl FnOnce(&P2pPages) -> Result<R>) -> Result<R> {
        let pages = self.pages.lock();
        f(pages.as_ref().ok_or(ENODEV)?)
    }

    /// Whether the memory is still held (not freed, not revoked).
    pub(crate) fn is_live(&self) -> bool {
        self.pages.lock().is_some()
    }

    /// Frees the allocation: user mappings stay until unmapped.
    pub(crate) fn release(&self) {
        let pages = self.pages.lock().take();
        drop(pages);
    }

    /// Revokes the allocation because its device is going away: every user
    /// mapping is removed (later accesses get SIGBUS) and the memory goes
    /// back to the device's pool.
    pub(crate) fn revoke(&self) {
        // Freed allocations may still be mapped: zap in every case.
        let mut pages = self.pages.lock();
        self.mapping.zap(self.pgoff * PAGE_SIZE, self.size);
        drop(pages.take());
    }
}
