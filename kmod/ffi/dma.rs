// SPDX-License-Identifier: GPL-2.0

//! Streaming DMA mappings for a peer (`dma_map_sgtable` of pages the
//! module holds or pins), which upstream's `SGTable` cannot make: its owned
//! tables map only vmalloc memory, for a device bound to the caller.

use core::ptr::NonNull;

use kernel::{
    dma::DataDirection,
    error::to_result,
    ffi::c_int,
    prelude::*,
    scatterlist::SGTable,
    sync::Arc, //
};

use super::{
    dmabuf::ExporterNotice,
    pci::{
        raw_pdev,
        Peer, //
    },
};

pub(super) mod raw {
    use kernel::{
        bindings,
        ffi::{
            c_int,
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
        pub(super) fn p2pdma_helper_pin_user(
            peer: *mut bindings::pci_dev,
            va: u64,
            len: u64,
            dir: c_int,
            err: *mut c_int,
        ) -> *mut SgMapRaw;
        pub(super) fn p2pdma_helper_sgmap_table(m: *mut SgMapRaw) -> *mut bindings::sg_table;
        pub(super) fn p2pdma_helper_sgmap_lock(m: *mut SgMapRaw);
        pub(super) fn p2pdma_helper_sgmap_unlock(m: *mut SgMapRaw);
        pub(super) fn p2pdma_helper_sgmap_release(m: *mut SgMapRaw);
        pub(super) fn p2pdma_helper_sgmap_notify(m: *mut SgMapRaw) -> *mut c_void;
    }

    /// `struct p2pdma_sgmap` of helpers.c, only handled by pointer.
    #[repr(C)]
    pub(crate) struct SgMapRaw {
        _opaque: [u8; 0],
    }
}

/// The error a helper reported in `err`, or `default` if it set none.
pub(super) fn errno_or(err: c_int, default: Error) -> Error {
    to_result(err).err().unwrap_or(default)
}

impl Peer {
    /// Pins `[va, va + len)` of the caller's memory and maps it for this
    /// peer, charging the caller's `RLIMIT_MEMLOCK`. With `ToDevice` the
    /// pages are pinned read-only.
    pub(crate) fn pin_user(&self, va: u64, len: u64, dir: DataDirection) -> Result<SgMap> {
        let mut err: c_int = 0;
        // SAFETY: The helper pins with `pin_user_pages_fast`, which validates
        // the user range.
        let m = unsafe {
            raw::p2pdma_helper_pin_user(raw_pdev(&*self.0), va, len, dir as u32 as c_int, &mut err)
        };
        NonNull::new(m)
            .map(SgMap)
            .ok_or_else(|| errno_or(err, ENOMEM))
    }
}

/// A scatter-gather mapping for a peer (P2P pages, pinned user pages or an
/// attached dma-buf), released on drop.
///
/// # Invariants
///
/// Points to a live `struct p2pdma_sgmap` owned by this object; a dma-buf
/// mapping owns one reference on the `ExporterNotice` given at import.
pub(crate) struct SgMap(pub(super) NonNull<raw::SgMapRaw>);

// SAFETY: The mapping has no thread affinity.
unsafe impl Send for SgMap {}
// SAFETY: Shared access only reads the table, under the dma-buf's lock.
unsafe impl Sync for SgMap {}

impl SgMap {
    /// Calls `f` with each DMA segment (address, length), merging adjacent
    /// ones up to `max_seg` bytes; `ENODEV` if the mapping was revoked.
    pub(crate) fn for_each_segment(
        &self,
        max_seg: u64,
        mut f: impl FnMut(u64, u64) -> Result,
    ) -> Result {
        let m = self.0.as_ptr();
        // SAFETY: By the type invariant; the lock keeps a dma-buf's table
        // from being revoked while it is read.
        unsafe { raw::p2pdma_helper_sgmap_lock(m) };
        // SAFETY: As above.
        let table = unsafe { raw::p2pdma_helper_sgmap_table(m) };
        let r = if table.is_null() {
            Err(ENODEV)
        } else {
            // SAFETY: The table is mapped and stays so until unlocked below.
            let table = unsafe { SGTable::from_raw(table) };
            let mut cur: Option<(u64, u64)> = None;
            let mut r = Ok(());
            for sg in table.iter() {
                let (a, l) = (sg.dma_address(), sg.dma_len());
                cur = match cur {
                    Some((ca, cl)) if ca + cl == a && cl + l <= max_seg => Some((ca, cl + l)),
                    Some(seg) => {
                        r = f(seg.0, seg.1);
                        if r.is_err() {
                            break;
                        }
                        Some((a, l))
                    }
                    None => Some((a, l)),
                };
            }
            match (r, cur) {
                (Ok(()), Some((a, l))) => f(a, l),
                (r, _) => r,
            }
        };
        // SAFETY: Pairs with the lock above.
        unsafe { raw::p2pdma_helper_sgmap_unlock(m) };
        r
    }
}

impl Drop for SgMap {
    fn drop(&mut self) {
        // SAFETY: By the type invariant. The helper detaches a dma-buf
        // before returning, so no revocation callback runs afterwards and
        // the notifier reference given at import can be dropped then.
        let notify = unsafe { sgmap_notify(self.0.as_ptr()) };
        // SAFETY: As above.
        unsafe { raw::p2pdma_helper_sgmap_release(self.0.as_ptr()) };
        if let Some(n) = notify {
            // SAFETY: The reference given at import, now unused.
            drop(unsafe { Arc::from_raw(n) });
        }
    }
}

/// The notifier a dma-buf mapping was given, if any.
///
/// # Safety
///
/// `m` is a live `struct p2pdma_sgmap`.
unsafe fn sgmap_notify(m: *mut raw::SgMapRaw) -> Option<*const ExporterNotice> {
    // SAFETY: The caller guarantees `m` is live.
    let n = unsafe { raw::p2pdma_helper_sgmap_notify(m) };
    (!n.is_null()).then_some(n.cast_const().cast())
}
