// SPDX-License-Identifier: GPL-2.0

//! DMA mappings handed to user space: allocation memory, pinned user pages
//! and imported dma-bufs, each mapped for one peer (or each path of a
//! multipath device) by the kernel's DMA API.
//!
//! Every mapping is listed in its file and in [`MAPPINGS`], so that when a
//! device it depends on goes away (the accelerator whose memory it maps, or
//! the peer it is mapped for, losing its driver) it is torn down before the
//! device is, and its owner is told.

use core::sync::atomic::{
    AtomicBool,
    AtomicU8,
    Ordering, //
};

use kernel::{
    bindings, new_mutex, pci,
    prelude::*,
    sync::{
        Arc,
        Mutex, //
    },
};

use crate::{
    ffi::{
        dmabuf::ExporterNotice,
        eventfd::Notifier,
        p2pmem::P2pPages,
        pci::{
            Peer, //
            PeerEvents,
        },
    },
    memory::Alloc,
    overlap::Counted,
};

/// What a mapping maps.
pub(crate) enum Source {
    /// Allocation memory (`DMA_MAP`).
    Alloc(Arc<Alloc>),
    /// Pinned user memory (`PIN_USER`).
    User,
    /// An imported dma-buf (`DMABUF_IMPORT`).
    DmaBuf,
}

/// The DMA mappings of a [`DmaMapping`] that stands, and what they map;
/// both are only held, until the mapping is revoked or released.
#[expect(dead_code, reason = "the fields are held for their drop")]
pub(crate) struct Live {
    /// One mapping per peer, each with its count. Declared first: unmapped
    /// before the pages go.
    maps: KVec<Counted>,
    /// The allocation's pages, for `DMA_MAP`: held while mapped, so that
    /// the memory never returns to the device under a mapping.
    pages: Option<Arc<P2pPages>>,
}

impl Live {
    /// The mappings `maps`, of `pages` if they map allocation memory.
    pub(crate) fn new(maps: KVec<Counted>, pages: Option<Arc<P2pPages>>) -> Self {
        Self { maps, pages }
    }
}

/// Where a mapping stands.
enum State {
    /// Listed for revocation, being made.
    Pending,
    /// Made.
    Live(Live),
    /// Torn down by a revocation (or never made, if it came first).
    Revoked,
}

/// One mapping made by `DMA_MAP`, `PIN_USER` or `DMABUF_IMPORT`.
///
/// It is listed in [`MAPPINGS`] before the DMA API maps anything, made
/// under its own lock, which revocation takes too, and torn down under
/// that lock before it leaves the list: a revocation either finds it
/// pending (then waits for it to be made and tears it down, or stops it
/// from being made), or live or being torn down (then it returns once the
/// DMA API's mappings are gone), or comes before it is listed, while the
/// device it depends on is marked as going (then listing it fails).
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
    /// A dma-buf import's notice of its exporter's revocation.
    notice: Option<Arc<ExporterNotice>>,
    /// [`State`] as a number ([`PENDING`], [`LIVE`], [`REVOKED`]), written
    /// under `state`'s lock and read without it: `is_live` runs under the
    /// file's lock, which is taken with the mmap lock held, and the mapping
    /// is made under `state`'s lock, pinning user pages under the mmap lock.
    status: AtomicU8,
    /// A device it depends on is going, and its owner was told to stop
    /// the peer and unmap it; it stands until then (see [`peer_going`]).
    revoking: AtomicBool,
    #[pin]
    state: Mutex<State>,
}

const PENDING: u8 = 0;
const LIVE: u8 = 1;
const REVOKED: u8 = 2;

impl DmaMapping {
    /// A mapping of `source` for `peers`, not made yet.
    pub(crate) fn new(
        handle: u64,
        source: Source,
        peers: KVec<Peer>,
        notifier: Arc<Notifier>,
        notice: Option<Arc<ExporterNotice>>,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                handle,
                source,
                peers,
                notifier,
                notice,
                status: AtomicU8::new(PENDING),
                revoking: AtomicBool::new(false),
                state <- new_mutex!(State::Pending),
            }),
            GFP_KERNEL,
        )
    }

    /// The PCI functions it is mapped for.
    pub(crate) fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// A dma-buf import's notice of revocation by its exporter.
    pub(crate) fn notice(&self) -> Option<&Arc<ExporterNotice>> {
        self.notice.as_ref()
    }

    /// Makes the mapping with `make`, under the lock revocation takes;
    /// `ENODEV` if it was revoked since it was listed.
    pub(crate) fn make(&self, make: impl FnOnce() -> Result<Live>) -> Result {
        let mut st = self.state.lock();
        if !matches!(*st, State::Pending) {
            return Err(ENODEV);
        }
        *st = State::Live(make()?);
        self.status.store(LIVE, Ordering::Release);
        Ok(())
    }

    /// Whether this maps `alloc`'s memory.
    pub(crate) fn maps_alloc(&self, alloc: &Arc<Alloc>) -> bool {
        matches!(&self.source, Source::Alloc(a) if Arc::ptr_eq(a, alloc))
    }

    /// Whether the mapping still stands (not revoked by an unbind, nor by
    /// the dma-buf's exporter).
    pub(crate) fn is_live(&self) -> bool {
        self.status.load(Ordering::Acquire) == LIVE
            && !self.notice.as_ref().is_some_and(|n| n.revoked())
    }

    /// Whether it stands while a device it depends on is going: its owner
    /// was told to stop the peer and unmap it.
    pub(crate) fn is_revoking(&self) -> bool {
        (self.revoking.load(Ordering::Acquire) || self.notice.as_ref().is_some_and(|n| n.revoking()))
            && self.is_live()
    }

    /// Whether it maps `pdev`'s memory.
    fn maps_memory_of(&self, pdev: *const bindings::pci_dev) -> bool {
        matches!(&self.source, Source::Alloc(a)
            if core::ptr::from_ref::<kernel::pci::Device>(&a.pdev).cast::<bindings::pci_dev>() == pdev)
    }

    /// Whether a process drives one of its peers (see
    /// [`Peer::driven_from_user_space`]): only that process can stop the
    /// peer's DMA to it.
    fn for_user_driven_peer(&self) -> bool {
        self.peers.iter().any(Peer::driven_from_user_space)
    }

    /// Whether it is mapped for a peer `other` is mapped for too.
    fn shares_a_peer_with(&self, other: &DmaMapping) -> bool {
        self.peers
            .iter()
            .any(|p| other.peers.iter().any(|q| p.same_as(q)))
    }

    /// Tells the owner that a device it depends on is going: it stops the
    /// peer, then unmaps.
    fn warn(&self) {
        if !self.revoking.swap(true, Ordering::AcqRel) {
            self.notifier.signal();
        }
    }

    /// Whether `pdev` is something this mapping depends on.
    fn depends_on(&self, pdev: *const bindings::pci_dev) -> bool {
        self.devices().any(|d| d == pdev)
    }

    /// The devices this mapping depends on: the accelerator whose memory
    /// it maps, if any, and its peers.
    fn devices(&self) -> impl Iterator<Item = *const bindings::pci_dev> + '_ {
        let provider = match &self.source {
            Source::Alloc(a) => Some(&*a.pdev),
            _ => None,
        };
        Iterator::chain(provider.into_iter(), self.peers.iter().map(|p| &*p.0))
            .map(|d| core::ptr::from_ref::<kernel::pci::Device>(d).cast::<bindings::pci_dev>())
    }

    /// Tears the mapping down now (waiting for it if it is being made, and
    /// keeping it from being made if not yet); the owner is told.
    fn revoke(&self) {
        if self.tear_down() {
            self.notifier.signal();
        }
    }

    /// Tears the mapping down (waiting for it if it is being made, and
    /// keeping it from being made if not yet); whether it stood until now.
    /// The DMA API's mappings go under the lock: whoever comes second, a
    /// revocation or the owner's release, returns only once they are gone.
    fn tear_down(&self) -> bool {
        let mut st = self.state.lock();
        let stood = match core::mem::replace(&mut *st, State::Revoked) {
            State::Live(live) => {
                drop(live);
                true
            }
            State::Pending | State::Revoked => false,
        };
        // Live until its last DMA API mapping is gone: an unbind waiting
        // for the owner's unmap (`await_user_peers`) waits for that.
        self.status.store(REVOKED, Ordering::Release);
        drop(st);
        stood
    }
}

/// Every mapping, and every PCI device on the bus with whether it is going
/// away now.
pub(crate) struct Registry {
    maps: KVec<Arc<DmaMapping>>,
    /// Each PCI device, by address, noted when it was added to the bus (or
    /// when the module started), with how many of its driver's unbinds or
    /// its removals are under way: marking a device as going needs no
    /// memory, so it cannot fail.
    devices: KVec<(usize, u32)>,
}

impl Registry {
    const fn new() -> Self {
        Self {
            maps: KVec::new(),
            devices: KVec::new(),
        }
    }

    /// Whether `m` may be listed: every device it depends on is known and
    /// not going away. A device the module could not note when it was
    /// added (out of memory) is never marked as going, so no mapping may
    /// depend on it.
    fn admits(&self, m: &DmaMapping) -> bool {
        m.devices().all(|d| {
            self.devices
                .iter()
                .any(|&(p, going)| p == d as usize && going == 0)
        })
    }
}

kernel::sync::global_lock! {
    // SAFETY: Initialized by the module initializer before the PCI driver or
    // the misc device are registered, so before any use.
    pub(crate) unsafe(uninit) static MAPPINGS: Mutex<Registry> = Registry::new();
}

/// Frees the registry's storage when the module goes (a static is never
/// dropped); by then every file, and so every mapping, is gone.
pub(crate) struct RegistryCleanup;

impl Drop for RegistryCleanup {
    fn drop(&mut self) {
        let mut r = MAPPINGS.lock();
        drop(core::mem::take(&mut r.maps));
        drop(core::mem::take(&mut r.devices));
    }
}

/// Lists `m` for revocation, before it is made; `ENODEV` while a device it
/// depends on is going away (or is unknown to the module).
pub(crate) fn register(m: &Arc<DmaMapping>) -> Result {
    let mut r = MAPPINGS.lock();
    if !r.admits(m) {
        return Err(ENODEV);
    }
    r.maps.push(m.clone(), GFP_KERNEL)?;
    Ok(())
}

/// Tears `m` down and takes it off the list (`UNMAP`, close, a failed
/// ioctl), in that order: while any of its DMA API mappings stands, an
/// unbind of a device it depends on finds it, and returns only once they
/// are gone (the device's driver may be released right after).
pub(crate) fn release(m: &Arc<DmaMapping>) {
    m.tear_down();
    MAPPINGS.lock().maps.retain(|x| !Arc::ptr_eq(x, m));
}

/// Revokes every mapping of the memory of `pdev` or for `pdev`: it is an
/// accelerator being unbound, or a peer losing its driver (or going away).
pub(crate) fn revoke_peer(pdev: *const bindings::pci_dev) {
    let r = MAPPINGS.lock();
    for m in r.maps.iter().filter(|m| m.depends_on(pdev)) {
        m.revoke();
    }
}

/// The registry of mappings, as told of PCI devices coming and going.
pub(crate) struct Mappings;

impl PeerEvents for Mappings {
    /// Notes `pdev` (once), so that marking it as going later needs no
    /// memory.
    fn peer_added(pdev: &pci::Device) -> Result {
        let key = core::ptr::from_ref(pdev) as usize;
        let mut r = MAPPINGS.lock();
        if !r.devices.iter().any(|&(p, _)| p == key) {
            r.devices.push((key, 0), GFP_KERNEL)?;
        }
        Ok(())
    }

    /// `pdev` starts losing its driver or going away (`going`), or gets a
    /// driver again: see [`peer_going`].
    fn peer_going(pdev: &pci::Device, going: bool) {
        peer_going(core::ptr::from_ref(pdev).cast(), going);
    }

    /// Revokes what depends on `pdev`, whose driver is done with it.
    fn peer_unbound(pdev: &pci::Device) {
        peer_unbound(core::ptr::from_ref(pdev).cast());
    }

    /// Forgets `pdev`: no mapping depends on it any more (its removal
    /// revoked them and kept new ones from being listed).
    fn peer_removed(pdev: &pci::Device) {
        let key = core::ptr::from_ref(pdev) as usize;
        MAPPINGS.lock().devices.retain(|d| d.0 != key);
    }
}

/// `pdev` starts losing its driver or going away (`going`), or gets a
/// driver again. From the start until a driver binds it again, no mapping
/// that depends on it can be listed.
///
/// At the start, a mapping of its memory (an accelerator being unbound) for
/// peers that only kernel drivers drive is revoked at once: nothing but the
/// process holds its addresses. Every other mapping that depends on it
/// stands, and its owner is told (as are the owners of every other mapping
/// for the same peers): a peer's driver is not done with the device yet,
/// and a peer that a process drives stops only when that process stops it.
/// They are revoked when the driver is done ([`peer_unbound`]).
fn peer_going(pdev: *const bindings::pci_dev, going: bool) {
    let mut r = MAPPINGS.lock();
    let key = pdev as usize;
    // The device's entry exists since it was added (a device the module
    // could not note has no mapping that depends on it): nothing here
    // allocates, so nothing here can fail.
    if let Some(d) = r.devices.iter_mut().find(|(p, _)| *p == key) {
        d.1 = if going { d.1.saturating_add(1) } else { 0 };
    }
    if !going {
        return;
    }
    for m in r.maps.iter().filter(|m| m.depends_on(pdev)) {
        if m.maps_memory_of(pdev) && !m.for_user_driven_peer() {
            m.revoke();
            continue;
        }
        m.warn();
        if m.for_user_driven_peer() {
            // The process driving the peer may hold other mappings for it,
            // through other files: whichever it watches is told.
            for other in r
                .maps
                .iter()
                .filter(|o| !Arc::ptr_eq(o, m) && o.shares_a_peer_with(m))
            {
                other.notifier.signal();
            }
        }
    }
}

/// `pdev`'s driver is done with it (its remove returned: it quiesced the
/// device, and vfio-pci's waits until its user released the device), or
/// it is gone: every mapping that depends on it is revoked. It stays going
/// until a driver binds it again.
fn peer_unbound(pdev: *const bindings::pci_dev) {
    let r = MAPPINGS.lock();
    for m in r.maps.iter().filter(|m| m.depends_on(pdev)) {
        m.revoke();
    }
}

/// Waits until no mapping of accelerator `pdev`'s memory stands for a peer
/// that a process drives: its owner, told when the unbind started, stops
/// the peer and unmaps it (or closes the file, or the peer loses its
/// driver). The owners are told again every 10 s meanwhile, as vfio-pci
/// asks its user for a device it unbinds.
pub(crate) fn await_user_peers(pdev: &pci::Device) {
    let raw = core::ptr::from_ref(pdev).cast::<bindings::pci_dev>();
    let mut rounds = 0u32;
    loop {
        let waiting = {
            let r = MAPPINGS.lock();
            let mut n = 0usize;
            for m in r
                .maps
                .iter()
                .filter(|m| m.maps_memory_of(raw) && m.is_live() && m.for_user_driven_peer())
            {
                n += 1;
                if rounds > 0 && rounds % 500 == 0 {
                    m.notifier.signal();
                }
            }
            n
        };
        if waiting == 0 {
            return;
        }
        if rounds % 500 == 0 {
            dev_info!(
                pdev.as_ref(),
                "waiting for the owners of {} mapping(s) of its memory for devices that processes drive to stop them and unmap\n",
                waiting
            );
        }
        rounds = rounds.wrapping_add(1);
        kernel::time::delay::fsleep(kernel::time::Delta::from_millis(20));
    }
}
