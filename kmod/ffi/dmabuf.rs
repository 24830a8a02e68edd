// SPDX-License-Identifier: GPL-2.0

//! Imported dma-bufs (upstream's Rust has dma-buf fences but no importer
//! side).

use core::{
    ptr::NonNull,
    sync::atomic::{
        AtomicBool,
        Ordering, //
    },
};

use kernel::{
    bindings,
    dma::DataDirection,
    ffi::{
        c_int,
        c_void, //
    },
    prelude::*,
    sync::Arc, //
};

use super::{
    dma::{
        errno_or,
        SgMap, //
    },
    eventfd::Notifier,
    pci::{
        raw_pdev,
        Peer, //
    },
};

mod raw {
    use super::super::dma::raw::SgMapRaw;
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
        pub(super) fn p2pdma_helper_dmabuf_import(
            peer: *mut bindings::pci_dev,
            buf: *mut bindings::dma_buf,
            dir: c_int,
            notify: *mut c_void,
            err: *mut c_int,
        ) -> *mut SgMapRaw;
    }
}

/// A dma-buf, referenced (`dma_buf_get`/`dma_buf_put`; upstream's Rust
/// has dma-buf fences but no importer side).
///
/// # Invariants
///
/// Holds a reference on the `struct dma_buf`.
pub(crate) struct DmaBuf(NonNull<bindings::dma_buf>);

// SAFETY: A dma-buf reference may be used and dropped from any thread.
unsafe impl Send for DmaBuf {}
// SAFETY: Shared access only reads fields that never change.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// The dma-buf behind the caller's descriptor `fd`; `EBADF` when it is
    /// not one.
    pub(crate) fn get(fd: i32) -> Result<Self> {
        // SAFETY: `dma_buf_get` validates `fd`; it returns a referenced
        // dma-buf or an error pointer.
        let p = kernel::error::from_err_ptr(unsafe { bindings::dma_buf_get(fd) }).map_err(|e| {
            if e == EINVAL {
                EBADF
            } else {
                e
            }
        })?;
        // INVARIANT: `p` is a dma-buf `dma_buf_get` referenced for us.
        Ok(Self(NonNull::new(p).ok_or(EBADF)?))
    }

    /// Bytes in the buffer.
    pub(crate) fn size(&self) -> u64 {
        // SAFETY: By the type invariant the dma-buf is alive; its size is
        // set by the exporter before export and never changes.
        unsafe { (*self.0.as_ptr()).size as u64 }
    }

    /// A number naming this buffer while any reference on it is held.
    pub(crate) fn id(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `get`.
        unsafe { bindings::dma_buf_put(self.0.as_ptr()) }
    }
}

impl Peer {
    /// Attaches (dynamically, peer-to-peer allowed), pins and maps the
    /// dma-buf `fd` for this peer. If the exporter revokes it, the mapping is
    /// torn down and `notify` is signalled.
    pub(crate) fn dmabuf_import(
        &self,
        buf: &DmaBuf,
        dir: DataDirection,
        notify: &Arc<ExporterNotice>,
    ) -> Result<SgMap> {
        let mut err: c_int = 0;
        let notify_raw = Arc::into_raw(notify.clone());
        // SAFETY: `buf` is a referenced dma-buf (the helper takes a reference
        // of its own); the helper keeps the `notify` reference until the
        // mapping is released (see `SgMap::drop`) and passes it to
        // `p2pdma_dmabuf_revoked` only.
        let m = unsafe {
            raw::p2pdma_helper_dmabuf_import(
                raw_pdev(&*self.0),
                buf.0.as_ptr(),
                dir as u32 as c_int,
                notify_raw.cast_mut().cast(),
                &mut err,
            )
        };
        match NonNull::new(m) {
            Some(m) => Ok(SgMap(m)),
            None => {
                // SAFETY: The helper failed and kept nothing: the reference is
                // still ours.
                drop(unsafe { Arc::from_raw(notify_raw) });
                Err(errno_or(err, ENOMEM))
            }
        }
    }
}

/// What a dma-buf import tells when its exporter revokes it: the flag, then
/// the owner's notifier. Shared by the import's mappings (one per peer).
pub(crate) struct ExporterNotice {
    notifier: Arc<Notifier>,
    revoked: AtomicBool,
}

impl ExporterNotice {
    /// A notice that tells `notifier`.
    pub(crate) fn new(notifier: Arc<Notifier>) -> Result<Arc<Self>> {
        Ok(Arc::new(
            Self {
                notifier,
                revoked: AtomicBool::new(false),
            },
            GFP_KERNEL,
        )?)
    }

    /// Whether the exporter revoked the import.
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

/// A dma-buf exporter revoked an imported buffer.
#[no_mangle]
extern "C" fn p2pdma_dmabuf_revoked(notify: *mut c_void) {
    // SAFETY: The reference given at import is alive until the mapping is
    // released, which cannot run concurrently with this callback (both hold
    // the reservation lock).
    let n = unsafe { &*notify.cast_const().cast::<ExporterNotice>() };
    n.revoked.store(true, Ordering::Release);
    n.notifier.signal();
}
