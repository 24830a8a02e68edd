// SPDX-License-Identifier: GPL-2.0

//! Allocations of accelerator memory and their user mappings.
//!
//! An allocation's pages are held while its file owns it (until `FREE` or
//! close) or any user mapping of it remains, and not after it is revoked
//! (its device unbound). User mappings are populated by the fault handler,
//! under the same lock revocation takes: a VMA is linked where revocation
//! finds it before its first fault, so no page is ever mapped that the
//! revocation's zap misses.

use kernel::{
    mm::virt::{
        VmaMixedMap,
        VmaNew, //
    },
    new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        Arc,
        Mutex, //
    },
};

use crate::ffi::{
    eventfd::Notifier,
    mm::{
        self,
        FileMapping,
        VmaOps,
        PAGE_SIZE, //
    },
    p2pmem::P2pPages,
};

/// Takes an allocation off the list of its device's allocations (the
/// accelerator registry's), once it holds no memory.
pub(crate) type Unlist = fn(&Arc<Alloc>);

struct State {
    /// The memory; `None` once released or revoked. Block I/O in flight
    /// holds it too, so it goes back to the device only after the I/O.
    pages: Option<Arc<P2pPages>>,
    /// The file still lists it (no `FREE`, no close yet).
    owned: bool,
    /// User mappings (VMAs) of it.
    vmas: usize,
    /// Its device was unbound.
    revoked: bool,
}

/// One allocation made through `ALLOC`, listed in its file (until freed)
/// and in its device's registry entry (while it holds pages), so that an
/// unbind can revoke it.
#[pin_data]
pub(crate) struct Alloc {
    /// Handle returned to user space.
    pub(crate) handle: u64,
    /// Index of the accelerator it came from.
    pub(crate) dev_index: usize,
    /// The accelerator it came from.
    pub(crate) pdev: ARef<pci::Device>,
    /// First page of the allocation in the file's mmap offset space; offsets
    /// are never reused, so zapping them touches only this allocation.
    pub(crate) pgoff: u64,
    /// Bytes allocated.
    pub(crate) size: u64,
    /// User it is charged to.
    pub(crate) uid: u32,
    /// The owning file's mapping, through which user mappings are zapped.
    mapping: FileMapping,
    /// Told when the allocation is revoked.
    notifier: Arc<Notifier>,
    /// Called when the memory goes.
    unlist: Unlist,
    #[pin]
    state: Mutex<State>,
}

impl Alloc {
    /// Wraps freshly allocated pages, owned by a file; `unlist` takes it
    /// off its device's list when the memory goes.
    #[expect(clippy::too_many_arguments, reason = "each is a field")]
    pub(crate) fn new(
        handle: u64,
        dev_index: usize,
        pgoff: u64,
        uid: u32,
        mapping: FileMapping,
        notifier: Arc<Notifier>,
        unlist: Unlist,
        pages: P2pPages,
    ) -> Result<Arc<Self>> {
        let size = pages.size() as u64;
        let pdev = pages.pdev().clone();
        let pages = Arc::new(pages, GFP_KERNEL)?;
        Arc::pin_init(
            pin_init!(Self {
                handle,
                dev_index,
                pdev,
                pgoff,
                size,
                uid,
                mapping,
                notifier,
                unlist,
                state <- new_mutex!(State {
                    pages: Some(pages),
                    owned: true,
                    vmas: 0,
                    revoked: false,
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// Clears the memory before anyone but the kernel sees it; `ENODEV` if
    /// it was revoked meanwhile.
    pub(crate) fn zero(&self) -> Result {
        self.state.lock().pages.as_ref().ok_or(ENODEV)?.zero();
        Ok(())
    }

    /// Whether `[pgoff, pgoff + npages)` lies inside this allocation.
    pub(crate) fn contains_pages(&self, pgoff: u64, npages: u64) -> bool {
        let npages_total = self.size / PAGE_SIZE;
        pgoff >= self.pgoff && npages <= npages_total && pgoff - self.pgoff <= npages_total - npages
    }

    /// Sets `vma` up to map this allocation; the pages come on first
    /// access. The VMA holds a reference on the allocation.
    pub(crate) fn mmap(self: &Arc<Self>, vma: &VmaNew) -> Result {
        let mut st = self.state.lock();
        if st.pages.is_none() {
            return Err(ENODEV);
        }
        // Not inherited across fork, never grown by mremap; pages, not PFNs,
        // so that O_DIRECT can pin them for P2P.
        vma.set_dontcopy();
        vma.set_dontexpand();
        vma.set_mixedmap();
        st.vmas += 1;
        // The VMA's reference, given back by `VmaOps::close`.
        mm::vma_setup(vma, self.clone());
        Ok(())
    }

    /// The memory, held for block I/O or a DMA mapping: `ENODEV` once it
    /// was revoked or released.
    pub(crate) fn pages(&self) -> Result<Arc<P2pPages>> {
        self.state.lock().pages.clone().ok_or(ENODEV)
    }

    /// Whether it holds device memory now.
    pub(crate) fn holds_pages(&self) -> bool {
        self.state.lock().pages.is_some()
    }

    /// Whether its device was unbound.
    pub(crate) fn is_revoked(&self) -> bool {
        self.state.lock().revoked
    }

    /// The file gives it up (`FREE`, close): the memory goes once no user
    /// mapping remains. Forgets it in the registry when nothing holds it.
    pub(crate) fn disown(self: &Arc<Self>) {
        let done = {
            let mut st = self.state.lock();
            st.owned = false;
            st.vmas == 0
        };
        if done {
            self.release();
        }
    }

    /// Drops the memory and the registry's reference.
    fn release(self: &Arc<Self>) {
        let pages = self.state.lock().pages.take();
        drop(pages);
        (self.unlist)(self);
    }

    /// Revokes the allocation because its device is going away: every user
    /// mapping is removed (later accesses get `SIGBUS`), the memory goes back
    /// to the device's pool, and the owner is told.
    pub(crate) fn revoke(&self) {
        let pages = {
            let mut st = self.state.lock();
            st.revoked = true;
            // Under the lock, so that no fault maps a page after the zap.
            self.mapping.zap(self.pgoff * PAGE_SIZE, self.size);
            st.pages.take()
        };
        drop(pages);
        self.notifier.signal();
    }
}

impl VmaOps for Alloc {
    /// A VMA of the allocation was copied (split or moved): it holds one
    /// more reference, taken by the caller.
    fn open(this: &Arc<Self>) {
        this.state.lock().vmas += 1;
    }

    /// A VMA of the allocation went away, giving back its reference.
    fn close(this: Arc<Self>) {
        let done = {
            let mut st = this.state.lock();
            st.vmas -= 1;
            st.vmas == 0 && !st.owned && st.pages.is_some()
        };
        if done {
            this.release();
        }
    }

    /// Maps the pages of the allocation that `vma` covers (its file offset
    /// starts at page `pgoff`); an error (revoked, released) becomes
    /// `SIGBUS`.
    fn fault(this: &Self, vma: &VmaMixedMap, pgoff: u64) -> Result {
        let npages = ((vma.end() - vma.start()) as u64) / PAGE_SIZE;
        if !this.contains_pages(pgoff, npages) {
            return Err(EFAULT);
        }
        let st = this.state.lock();
        let pages = st.pages.as_ref().ok_or(EFAULT)?;
        pages.insert_into(vma, (pgoff - this.pgoff) as usize, npages as usize)
    }
}
