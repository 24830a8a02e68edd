// SPDX-License-Identifier: GPL-2.0

//! Streaming DMA mappings for a peer: P2P pages of an allocation, pinned
//! user pages (charged to `RLIMIT_MEMLOCK`), or an imported dma-buf.
//!
//! Upstream's `SGTable` iterates a mapped table, and its owned tables map
//! only vmalloc memory, for a device bound to the caller (through
//! `Devres`); a peer is bound to another driver, and the pages here are P2P
//! or pinned user pages. `pin_user_pages` has no abstraction either.

use core::ptr::NonNull;

use kernel::{
    bindings,
    dma::DataDirection,
    error::to_result,
    ffi::{
        c_int,
        c_uint,
        c_ulong, //
    },
    pci,
    prelude::*,
    scatterlist::SGTable,
    sync::{
        aref::ARef,
        Arc, //
    },
    types::Opaque, //
};

use super::{
    dmabuf::{
        DmaBuf,
        DmaBufMap,
        ExporterNotice, //
    },
    mm::{
        PfnRuns,
        PAGE_SIZE, //
    },
    pci::{
        max_seg_size,
        raw_dev,
        Peer, //
    },
    task::{
        self,
        Cap, //
    },
};

mod raw {
    use kernel::bindings;

    unsafe extern "C" {
        // helpers.c: `sg_dma_is_bus_address` is a static inline.
        pub(super) fn p2pdma_helper_sg_is_bus_addr(sg: *mut bindings::scatterlist) -> bool;
    }
}

/// Pages charged to a process's `pinned_vm` against `RLIMIT_MEMLOCK`, as
/// RDMA charges pinned memory; uncharged on drop.
///
/// The mm is handled by address only (see [`task::current_mm`]).
///
/// # Invariants
///
/// `npages` were added to `mm`'s `pinned_vm`, and `mm` grabbed
/// (`mmgrab`); both are given back on drop.
struct Charge {
    mm: NonNull<bindings::mm_struct>,
    npages: i64,
}

// SAFETY: A grabbed mm may be uncharged and dropped from any thread.
unsafe impl Send for Charge {}
// SAFETY: Shared access touches nothing.
unsafe impl Sync for Charge {}

/// The `pinned_vm` counter of `mm`, by address only.
fn pinned_vm(mm: NonNull<bindings::mm_struct>) -> *mut bindings::atomic64_t {
    let offset = core::mem::offset_of!(bindings::mm_struct, __bindgen_anon_1.pinned_vm);
    // SAFETY: The counter is a field of the mm: the address stays inside it.
    unsafe { mm.as_ptr().byte_add(offset).cast() }
}

impl Charge {
    /// Charges `npages` to the caller's `pinned_vm`, unless that passes its
    /// `RLIMIT_MEMLOCK` and it lacks `CAP_IPC_LOCK` (`ENOMEM`).
    fn new(npages: usize) -> Result<Self> {
        let npages = i64::try_from(npages).map_err(|_| ENOMEM)?;
        // A kernel thread has no mm; ioctls come from processes.
        let mm = task::current_mm().ok_or(EFAULT)?;
        let limit = task::memlock_limit() >> bindings::PAGE_SHIFT;
        // SAFETY: `pinned_vm` is an atomic counter of the caller's mm, alive
        // during the call.
        let now = unsafe { bindings::atomic64_add_return(npages, pinned_vm(mm)) };
        if now as u64 > limit && !task::capable(Cap::IpcLock) {
            // SAFETY: As above; gives back what was just added.
            unsafe { bindings::atomic64_sub(npages, pinned_vm(mm)) };
            return Err(ENOMEM);
        }
        // SAFETY: The mm is alive (see above); the reference is ours.
        unsafe { bindings::mmgrab(mm.as_ptr()) };
        // INVARIANT: charged and grabbed.
        Ok(Self { mm, npages })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        // SAFETY: The mm is grabbed (type invariant), so its counter lives;
        // the charge and the reference are given back once, here.
        unsafe {
            bindings::atomic64_sub(self.npages, pinned_vm(self.mm));
            bindings::mmdrop(self.mm.as_ptr());
        }
    }
}

/// User pages pinned with `FOLL_LONGTERM`, unpinned on drop (marked dirty
/// when the peer may have written them, so that the data is kept), with
/// their charge.
///
/// # Invariants
///
/// Every pointer in `pages` is a page pinned for this object.
pub(crate) struct Pinned {
    pages: KVVec<*mut bindings::page>,
    dirty: bool,
    _charge: Charge,
}

impl Pinned {
    /// Pins `[va, va + len)` of the caller's memory (whole pages), charging
    /// the caller's `RLIMIT_MEMLOCK`; writable unless the peer only reads
    /// them (`ToDevice`); `EFAULT` unless all of them could be.
    pub(crate) fn new(va: u64, len: u64, dir: DataDirection) -> Result<Self> {
        let npages = usize::try_from(len / PAGE_SIZE).map_err(|_| EINVAL)?;
        let charge = Charge::new(npages)?;
        let mut pages = KVVec::from_elem(core::ptr::null_mut(), npages, GFP_KERNEL)?;
        let to_device = matches!(dir, DataDirection::ToDevice);
        let gup = bindings::FOLL_LONGTERM | if to_device { 0 } else { bindings::FOLL_WRITE };
        let n = c_int::try_from(npages).map_err(|_| EINVAL)?;
        // SAFETY: `pages` has room for `npages` pointers;
        // `pin_user_pages_fast` validates the user range.
        let pinned = unsafe {
            bindings::pin_user_pages_fast(va as c_ulong, n, gup as c_uint, pages.as_mut_ptr())
        };
        to_result(pinned.min(0))?;
        if pinned != n {
            // SAFETY: The first `pinned` pages were pinned, and only those.
            unsafe { bindings::unpin_user_pages(pages.as_mut_ptr(), pinned as c_ulong) };
            return Err(EFAULT);
        }
        // INVARIANT: every page is pinned.
        Ok(Self {
            pages,
            dirty: !to_device,
            _charge: charge,
        })
    }
}

impl Pinned {
    /// The page frames pinned.
    pub(crate) fn pfn_runs(&self) -> Result<PfnRuns> {
        // SAFETY: Every page is pinned, so valid (type invariant).
        unsafe { PfnRuns::of_pages(&self.pages) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: Every page is pinned for this object (type invariant).
        unsafe {
            bindings::unpin_user_pages_dirty_lock(
                self.pages.as_mut_ptr(),
                self.pages.len() as c_ulong,
                self.dirty,
            )
        };
    }
}

/// A table of pages the module holds, mapped for a peer by the DMA API.
///
/// # Invariants
///
/// `sgt` is a table of `peer`-sized segments over pages that stay valid
/// while this object lives (held by its owner, or by `pinned`), mapped for
/// `peer` with `dir`.
struct PageMap {
    // Fields drop in declaration order, after `drop` unmapped and freed the
    // table: its storage, then the pinned pages (with their charge), then
    // the peer.
    sgt: KBox<Opaque<bindings::sg_table>>,
    /// The pinned pages of a `PIN_USER` mapping.
    pinned: Option<Pinned>,
    peer: ARef<pci::Device>,
    dir: DataDirection,
}

// SAFETY: The table and the pages have no thread affinity.
unsafe impl Send for PageMap {}
// SAFETY: Shared access only reads the table.
unsafe impl Sync for PageMap {}

impl PageMap {
    /// Builds a table of `pages`, segments no longer than `peer` accepts,
    /// and maps it for the peer through the DMA API, which applies the
    /// P2PDMA rules to P2P pages (bus address, host bridge, or
    /// `EREMOTEIO`).
    ///
    /// # Safety
    ///
    /// Every pointer in `pages` is a valid page that stays so while the
    /// result lives (or, once it is given pinned pages, while they are).
    unsafe fn new(
        peer: &Peer,
        pages: &mut [*mut bindings::page],
        dir: DataDirection,
    ) -> Result<Self> {
        let n = c_uint::try_from(pages.len()).map_err(|_| EINVAL)?;
        if n == 0 {
            return Err(EINVAL);
        }
        let sgt = KBox::new(Opaque::<bindings::sg_table>::zeroed(), GFP_KERNEL)?;
        let max_seg = max_seg_size(&peer.0) as c_uint;
        // SAFETY: `sgt` is writable; the pages are valid (the caller
        // guarantees it) and there is at least one.
        to_result(unsafe {
            bindings::sg_alloc_table_from_pages_segment(
                sgt.get(),
                pages.as_mut_ptr(),
                n,
                0,
                (pages.len() as c_ulong) << bindings::PAGE_SHIFT,
                max_seg,
                bindings::GFP_KERNEL,
            )
        })?;
        // SAFETY: The peer is a live device; the table was just built.
        let mapped = to_result(unsafe {
            bindings::dma_map_sgtable(raw_dev(&*peer.0), sgt.get(), dir.into(), 0)
        });
        if let Err(e) = mapped {
            // SAFETY: Built above and not mapped.
            unsafe { bindings::sg_free_table(sgt.get()) };
            return Err(e);
        }
        // INVARIANT: built and mapped for `peer` with `dir`.
        Ok(Self {
            sgt,
            pinned: None,
            peer: peer.0.clone(),
            dir,
        })
    }

    fn table(&self) -> &SGTable {
        // SAFETY: The table is mapped while `self` lives and not changed.
        unsafe { SGTable::from_raw(self.sgt.get()) }
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        // SAFETY: Mapped for `peer` with `dir` (type invariant); unmapped
        // and freed once, here, before `pinned` unpins the pages.
        unsafe {
            bindings::dma_unmap_sgtable(raw_dev(&*self.peer), self.sgt.get(), self.dir.into(), 0);
            bindings::sg_free_table(self.sgt.get());
        }
    }
}

/// A scatter-gather mapping for a peer (P2P pages, pinned user pages or an
/// attached dma-buf), released on drop.
pub(crate) struct SgMap(Map);

/// What an [`SgMap`] maps.
enum Map {
    /// P2P pages or pinned user pages.
    Pages(PageMap),
    /// An imported dma-buf.
    DmaBuf(Pin<KBox<DmaBufMap>>),
}

impl SgMap {
    /// Maps `pages` (P2P pages of an allocation) for `peer`; also says
    /// whether the DMA API mapped them by PCI bus address (P2P through a
    /// switch).
    ///
    /// # Safety
    ///
    /// Every pointer in `pages` is a valid page that the caller keeps valid
    /// while the mapping lives.
    pub(super) unsafe fn map_pages(
        peer: &Peer,
        pages: &mut [*mut bindings::page],
        dir: DataDirection,
    ) -> Result<(Self, bool)> {
        // SAFETY: As the caller guarantees.
        let m = unsafe { PageMap::new(peer, pages, dir) }?;
        // SAFETY: The table is mapped; its first entry is read only when
        // there is one.
        let bus = unsafe {
            let sgt = m.sgt.get();
            (*sgt).nents != 0 && raw::p2pdma_helper_sg_is_bus_addr((*sgt).sgl)
        };
        Ok((Self(Map::Pages(m)), bus))
    }

    /// The page frames a dma-buf import maps, as its exporter's table gives
    /// them, and whether some of its memory has no page; `None` for pages
    /// the module mapped itself, whose frames the caller knew beforehand.
    pub(crate) fn imported_pages(&self) -> Option<Result<(PfnRuns, bool)>> {
        match &self.0 {
            Map::Pages(_) => None,
            Map::DmaBuf(m) => Some(m.page_runs()),
        }
    }

    /// Calls `f` with each DMA segment (address, length), merging adjacent
    /// ones up to `max_seg` bytes; `ENODEV` if the mapping was revoked.
    pub(crate) fn for_each_segment(
        &self,
        max_seg: u64,
        f: impl FnMut(u64, u64) -> Result,
    ) -> Result {
        match &self.0 {
            Map::Pages(m) => merge_segments(m.table(), max_seg, f),
            Map::DmaBuf(m) => m.with_table(|t| merge_segments(t.ok_or(ENODEV)?, max_seg, f)),
        }
    }
}

/// Calls `f` with each DMA segment of `table`, merging adjacent ones up to
/// `max_seg` bytes.
fn merge_segments(table: &SGTable, max_seg: u64, mut f: impl FnMut(u64, u64) -> Result) -> Result {
    let mut cur: Option<(u64, u64)> = None;
    for sg in table.iter() {
        let (a, l) = (sg.dma_address(), sg.dma_len());
        cur = match cur {
            Some((ca, cl)) if ca + cl == a && cl + l <= max_seg => Some((ca, cl + l)),
            Some(seg) => {
                f(seg.0, seg.1)?;
                Some((a, l))
            }
            None => Some((a, l)),
        };
    }
    match cur {
        Some((a, l)) => f(a, l),
        None => Ok(()),
    }
}

impl Peer {
    /// Maps `pinned` (pinned for `dir`) for this peer; the mapping keeps
    /// the pages pinned while it lives.
    pub(crate) fn map_pinned(&self, mut pinned: Pinned, dir: DataDirection) -> Result<SgMap> {
        // SAFETY: The pages stay pinned while `pinned` lives, which the
        // mapping keeps and drops after its table.
        match unsafe { PageMap::new(self, &mut pinned.pages, dir) } {
            Ok(mut m) => {
                m.pinned = Some(pinned);
                Ok(SgMap(Map::Pages(m)))
            }
            Err(e) => {
                // Never mapped: nothing wrote to the pages.
                pinned.dirty = false;
                Err(e)
            }
        }
    }

    /// Attaches (dynamically, peer-to-peer allowed), pins and maps the
    /// dma-buf `buf` for this peer. If the exporter revokes it, the mapping
    /// is torn down and `notice` told.
    pub(crate) fn dmabuf_import(
        &self,
        buf: &DmaBuf,
        dir: DataDirection,
        notice: &Arc<ExporterNotice>,
    ) -> Result<SgMap> {
        Ok(SgMap(Map::DmaBuf(DmaBufMap::import(
            self, buf, dir, notice,
        )?)))
    }
}
