// SPDX-License-Identifier: GPL-2.0

//! DMA mappings handed to user space: allocation memory, pinned user pages
//! and imported dma-bufs, each mapped for one peer (or each path of a
//! multipath device) by the kernel's DMA API.
//!
//! Every mapping is listed in its file and in [`MAPPINGS`], so that when a
//! device it depends on goes away (the accelerator whose memory it maps, or
//! the peer it is mapped for, losing its driver) it is torn down before the
//! device is, and its owner is told.

use kernel::{
    bindings, new_mutex,
    prelude::*,
    sync::{
        Arc,
        Mutex, //
    },
};

use crate::{
    ffi::{
        Notifier,
        Peer,
        SgMap, //
    },
    memory::Alloc,
};

/// What a mapping maps.
pub(crate) enum Source {
    /// Allocation memory (`DMA_MAP`).
    Alloc(Arc<Alloc>),
    /// Pinned user memory `[va, va + len)` (`PIN_USER`).
    User { va: u64, len: u64 },
    /// An imported dma-buf (`DMABUF_IMPORT`).
    DmaBuf,
}

/// One mapping made by `DMA_MAP`, `PIN_USER` or `DMABUF_IMPORT`.
#[pin_data]
pub(crate) struct DmaMapping {
    /// Handle returned to user space.
    pub(crate) handle: u64,
    /// What it maps.
    pub(crate) source: Source,
    /// The PCI functions it is mapped for.
    peers: KVec<Peer>,
    /// Told when the mapping is revoked.
    notifier: Arc<Notifier>,
    /// One mapping per peer; `None` once revoked.
    #[pin]
    maps: Mutex<Option<KVec<SgMap>>>,
}

impl DmaMapping {
    /// Wraps the mappings `maps` (one per peer in `peers`).
    pub(crate) fn new(
        handle: u64,
        source: Source,
        peers: KVec<Peer>,
        notifier: Arc<Notifier>,
        maps: KVec<SgMap>,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                handle,
                source,
                peers,
                notifier,
                maps <- new_mutex!(Some(maps)),
            }),
            GFP_KERNEL,
        )
    }

    /// Whether this maps `alloc`'s memory.
    pub(crate) fn maps_alloc(&self, alloc: &Arc<Alloc>) -> bool {
        matches!(&self.source, Source::Alloc(a) if Arc::ptr_eq(a, alloc))
    }

    /// Whether the mapping still stands (not revoked by an unbind, nor by
    /// the dma-buf's exporter).
    pub(crate) fn is_live(&self) -> bool {
        self.maps
            .lock()
            .as_ref()
            .is_some_and(|maps| !maps.iter().any(SgMap::revoked))
    }

    /// Whether `pdev` is something this mapping depends on.
    fn depends_on(&self, pdev: *const bindings::pci_dev) -> bool {
        let provider = match &self.source {
            Source::Alloc(a) => {
                core::ptr::from_ref::<kernel::pci::Device>(&*a.pdev).cast::<bindings::pci_dev>()
                    == pdev
            }
            _ => false,
        };
        provider || self.peers.iter().any(|p| p.is(pdev))
    }

    /// Tears the mapping down now; the owner is told.
    fn revoke(&self) {
        let maps = self.maps.lock().take();
        if maps.is_some() {
            drop(maps);
            self.notifier.signal();
        }
    }
}

kernel::sync::global_lock! {
    // SAFETY: Initialized by the module initializer before the PCI driver or
    // the misc device are registered, so before any use.
    pub(crate) unsafe(uninit) static MAPPINGS: Mutex<KVec<Arc<DmaMapping>>> = KVec::new();
}

/// Frees the registry's storage when the module goes (a static is never
/// dropped); by then every file, and so every mapping, is gone.
pub(crate) struct RegistryCleanup;

impl Drop for RegistryCleanup {
    fn drop(&mut self) {
        drop(core::mem::take(&mut *MAPPINGS.lock()));
    }
}

/// Lists `m` for revocation.
pub(crate) fn register(m: &Arc<DmaMapping>) -> Result {
    MAPPINGS.lock().push(m.clone(), GFP_KERNEL)?;
    Ok(())
}

/// Takes `m` off the list (`UNMAP`, close).
pub(crate) fn unregister(m: &Arc<DmaMapping>) {
    MAPPINGS.lock().retain(|x| !Arc::ptr_eq(x, m));
}

/// Revokes every mapping of the memory of `pdev` or for `pdev`: it is an
/// accelerator being unbound, or a peer losing its driver (or going away).
pub(crate) fn revoke_peer(pdev: *const bindings::pci_dev) {
    let maps = MAPPINGS.lock();
    for m in maps.iter().filter(|m| m.depends_on(pdev)) {
        m.revoke();
    }
}
