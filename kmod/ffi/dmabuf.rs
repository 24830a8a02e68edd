// SPDX-License-Identifier: GPL-2.0

//! Imported dma-bufs (upstream's Rust has dma-buf fences but no importer
//! side).
//!
//! An import is a dynamic attachment that allows peer-to-peer and is pinned
//! while imported, like RDMA's pinned revocable dma-buf memory. If the
//! exporter invalidates it anyway (e.g. its device is reset or unbound), the
//! mapping is torn down under the reservation lock and the owner told.
//!
//! The exporter may reuse the memory once `invalidate_mappings` returns
//! (and vfio-pci turns its memory decoding off then): the peer must not
//! write it afterwards. A kernel driver's peer is stopped by the module's
//! own teardown; a peer that a process drives (through vfio-pci) stops only
//! when that process stops it. So for such a peer the invalidation first
//! tells the owner and waits, under the reservation lock, until the owner
//! lets the import go (`UNMAP`, or its file's release) or the peer loses
//! its driver; an owner that has not done so within [`OWNER_STOPS`] gets
//! the peer's bus mastering turned off instead, which stops its DMA.

use core::{
    cell::UnsafeCell,
    ptr::NonNull,
    sync::atomic::{
        AtomicBool,
        Ordering, //
    },
};

use kernel::{
    bindings,
    dma::DataDirection,
    ffi::c_ulong,
    prelude::*,
    scatterlist::SGTable,
    sync::{
        aref::ARef,
        Arc, //
    },
    task::MAX_SCHEDULE_TIMEOUT,
    time::{
        delay::fsleep,
        Delta, //
    }, //
};

use super::{
    eventfd::Notifier,
    mm::PfnRuns,
    pci::{
        raw_dev,
        raw_pdev,
        Peer, //
    },
};

mod raw {
    use kernel::bindings;

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: `dma_resv_assert_held` is a lockdep macro.
        pub(super) fn p2pdma_helper_resv_assert_held(resv: *mut bindings::dma_resv);
    }
}

/// How long an invalidation waits for the owner of an import for a peer that
/// a process drives to stop the peer and let the import go.
const OWNER_STOPS: Delta = Delta::from_secs(10);

/// How often that wait looks.
const OWNER_POLL: Delta = Delta::from_millis(10);

/// A dma-buf, referenced (`dma_buf_get`/`dma_buf_put`).
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

    /// The buffer's reservation object, whose lock guards its mappings.
    fn resv(&self) -> *mut bindings::dma_resv {
        // SAFETY: By the type invariant the dma-buf is alive; `resv` is set
        // at export and never changes.
        unsafe { (*self.0.as_ptr()).resv }
    }

    /// Takes the reservation lock, uninterruptibly.
    fn lock(&self) {
        // SAFETY: The reservation object lives as long as the buffer; no
        // acquire context, so the lock cannot fail.
        unsafe { bindings::dma_resv_lock(self.resv(), core::ptr::null_mut()) };
    }

    /// Releases the reservation lock taken by [`DmaBuf::lock`].
    fn unlock(&self) {
        // SAFETY: The caller holds the lock (see `lock`).
        unsafe { bindings::dma_resv_unlock(self.resv()) };
    }
}

impl Clone for DmaBuf {
    /// Another reference (`get_dma_buf`).
    fn clone(&self) -> Self {
        // SAFETY: The buffer is alive (type invariant); a dma-buf is
        // referenced through its file. INVARIANT: the new reference is the
        // clone's.
        unsafe { bindings::get_file((*self.0.as_ptr()).file) };
        Self(self.0)
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: Drops the reference this object holds.
        unsafe { bindings::dma_buf_put(self.0.as_ptr()) }
    }
}

/// What a dma-buf import tells when its exporter revokes it: the flags, then
/// the owner's notifier, once. Shared by the import's mappings (one per
/// peer).
pub(crate) struct ExporterNotice {
    notifier: Arc<Notifier>,
    /// The exporter waits for the owner to stop a peer it drives.
    revoking: AtomicBool,
    revoked: AtomicBool,
    /// The owner let the import go: its mappings are being dropped. Set
    /// before the first of them takes the reservation lock, so that an
    /// invalidation waiting under that lock for any of them sees it.
    released: AtomicBool,
}

impl ExporterNotice {
    /// A notice that tells `notifier`.
    pub(crate) fn new(notifier: Arc<Notifier>) -> Result<Arc<Self>> {
        Ok(Arc::new(
            Self {
                notifier,
                revoking: AtomicBool::new(false),
                revoked: AtomicBool::new(false),
                released: AtomicBool::new(false),
            },
            GFP_KERNEL,
        )?)
    }

    /// Whether the exporter revoked the import.
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Whether the exporter waits for the owner to stop the peer and let
    /// the import go.
    pub(crate) fn revoking(&self) -> bool {
        self.revoking.load(Ordering::Acquire)
    }

    /// The exporter waits for the owner: it is told.
    fn warn(&self) {
        if !self.revoking.swap(true, Ordering::AcqRel) {
            self.notifier.signal();
        }
    }

    /// The owner lets the import go.
    fn release(&self) {
        self.released.store(true, Ordering::Release);
    }

    /// Whether the owner let the import go.
    fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// The exporter revoked the import; the owner is told unless it was
    /// when the exporter started to wait.
    fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
        if !self.revoking.load(Ordering::Acquire) {
            self.notifier.signal();
        }
    }
}

/// What the reservation lock guards in a [`DmaBufMap`].
struct Locked {
    /// The attachment; NULL until attached.
    attach: *mut bindings::dma_buf_attachment,
    /// The mapped table; NULL before mapping and once revoked.
    sgt: *mut bindings::sg_table,
    /// The attachment is pinned.
    pinned: bool,
    /// The exporter revoked the mapping.
    revoked: bool,
}

/// A dma-buf attached, pinned and mapped for a peer.
///
/// # Invariants
///
/// `locked` is only accessed under the buffer's reservation lock, or with
/// the only reference to the object. Once `locked.attach` is set, the
/// attachment's `importer_priv` is this object, which stays at its address
/// (it is pinned) until `drop` detaches it.
#[pin_data(PinnedDrop)]
pub(crate) struct DmaBufMap {
    buf: DmaBuf,
    peer: ARef<kernel::pci::Device>,
    dir: DataDirection,
    notice: Arc<ExporterNotice>,
    locked: UnsafeCell<Locked>,
}

// SAFETY: The fields are references that may be used from any thread; the
// raw pointers in `locked` are used under the reservation lock only.
unsafe impl Send for DmaBufMap {}
// SAFETY: See above.
unsafe impl Sync for DmaBufMap {}

/// The importer's callbacks: peer-to-peer allowed, and what a revocation
/// does.
static IMPORTER_OPS: bindings::dma_buf_attach_ops = bindings::dma_buf_attach_ops {
    allow_peer2peer: true,
    invalidate_mappings: Some(DmaBufMap::invalidate_mappings),
};

impl DmaBufMap {
    /// Attaches (dynamically, peer-to-peer allowed), pins and maps `buf`
    /// for `peer`. If the exporter revokes it, the mapping is torn down and
    /// `notice` told.
    pub(super) fn import(
        peer: &Peer,
        buf: &DmaBuf,
        dir: DataDirection,
        notice: &Arc<ExporterNotice>,
    ) -> Result<Pin<KBox<Self>>> {
        let this = KBox::pin_init(
            pin_init!(Self {
                buf: buf.clone(),
                peer: peer.0.clone(),
                dir,
                notice: notice.clone(),
                locked: UnsafeCell::new(Locked {
                    attach: core::ptr::null_mut(),
                    sgt: core::ptr::null_mut(),
                    pinned: false,
                    revoked: false,
                }),
            }),
            GFP_KERNEL,
        )?;
        let priv_: *const Self = &*this;
        // SAFETY: The buffer and the peer are referenced; `this` is pinned,
        // so the importer's private pointer stays valid until `drop`
        // detaches.
        let attach = kernel::error::from_err_ptr(unsafe {
            bindings::dma_buf_dynamic_attach(
                this.buf.0.as_ptr(),
                raw_dev(&*this.peer),
                &IMPORTER_OPS,
                priv_.cast_mut().cast(),
            )
        })?;
        this.buf.lock();
        // SAFETY: Under the reservation lock (type invariant).
        let locked = unsafe { &mut *this.locked.get() };
        locked.attach = attach;
        let r = this.pin_and_map(locked);
        if r.is_err() {
            this.revoke_locked(locked);
        }
        this.buf.unlock();
        // On failure, dropping `this` detaches and drops the references.
        r.map(|()| this)
    }

    /// Pins the attachment, maps it, and waits for the exporter's pending
    /// moves before anyone sees the addresses.
    fn pin_and_map(&self, locked: &mut Locked) -> Result {
        // SAFETY: The attachment is live and the reservation lock held.
        kernel::error::to_result(unsafe { bindings::dma_buf_pin(locked.attach) })?;
        locked.pinned = true;
        // SAFETY: As above.
        let sgt = kernel::error::from_err_ptr(unsafe {
            bindings::dma_buf_map_attachment(locked.attach, self.dir.into())
        })?;
        locked.sgt = sgt;
        // SAFETY: The reservation object lives as long as the buffer.
        let wait = unsafe {
            bindings::dma_resv_wait_timeout(
                self.buf.resv(),
                bindings::dma_resv_usage_DMA_RESV_USAGE_KERNEL,
                false,
                MAX_SCHEDULE_TIMEOUT as c_ulong,
            )
        };
        if wait < 0 {
            return Err(Error::from_errno(wait as i32));
        }
        Ok(())
    }

    /// Unmaps and unpins what is mapped and pinned.
    fn revoke_locked(&self, locked: &mut Locked) {
        // SAFETY: The reservation object lives as long as the buffer.
        unsafe { raw::p2pdma_helper_resv_assert_held(self.buf.resv()) };
        if !locked.sgt.is_null() {
            // SAFETY: `sgt` was mapped through the live attachment with
            // `dir`, under the lock the caller holds.
            unsafe {
                bindings::dma_buf_unmap_attachment(locked.attach, locked.sgt, self.dir.into())
            };
            locked.sgt = core::ptr::null_mut();
        }
        if locked.pinned {
            // SAFETY: Pinned through the live attachment, under the lock.
            unsafe { bindings::dma_buf_unpin(locked.attach) };
            locked.pinned = false;
        }
    }

    /// Calls `f` with the mapped table, or `None` once the exporter revoked
    /// it, under the reservation lock, which keeps the table from being
    /// revoked meanwhile.
    pub(super) fn with_table<R>(&self, f: impl FnOnce(Option<&SGTable>) -> R) -> R {
        self.buf.lock();
        // SAFETY: Under the reservation lock (type invariant).
        let sgt = unsafe { (*self.locked.get()).sgt };
        // SAFETY: A non-NULL table is mapped and stays so until unlocked
        // below.
        let r = f((!sgt.is_null()).then(|| unsafe { SGTable::from_raw(sgt) }));
        self.buf.unlock();
        r
    }

    /// The page frames of the mapped table, under the reservation lock,
    /// and whether some entry has no page. A table the exporter revoked
    /// meanwhile gives nothing, and counts as one without pages.
    pub(super) fn page_runs(&self) -> Result<(PfnRuns, bool)> {
        self.buf.lock();
        // SAFETY: Under the reservation lock (type invariant).
        let sgt = unsafe { (*self.locked.get()).sgt };
        let r = if sgt.is_null() {
            Ok((PfnRuns::new(), true))
        } else {
            // SAFETY: The table is mapped and stays so until unlocked below.
            unsafe { PfnRuns::of_table(sgt) }
        };
        self.buf.unlock();
        r
    }

    /// `invalidate_mappings`: the exporter revokes the mapping.
    ///
    /// Only a mapped table can be revoked: an invalidation between attach
    /// and map (the import maps afterwards, under the same lock) leaves
    /// nothing to tear down, and must not keep the real one from running.
    ///
    /// # Safety
    ///
    /// Called by the dma-buf core with the reservation lock held, for an
    /// attachment made by [`DmaBufMap::import`].
    unsafe extern "C" fn invalidate_mappings(attach: *mut bindings::dma_buf_attachment) {
        // SAFETY: The attachment's private pointer is its `DmaBufMap`,
        // alive until it detaches (type invariant), which cannot run while
        // the caller holds the lock.
        let this = unsafe { &*(*attach).importer_priv.cast_const().cast::<Self>() };
        // SAFETY: Under the reservation lock (type invariant).
        let locked = unsafe { &mut *this.locked.get() };
        if locked.revoked || locked.sgt.is_null() {
            return;
        }
        this.await_owner();
        this.revoke_locked(locked);
        locked.revoked = true;
        this.notice.revoke();
    }

    /// For a peer that a process drives: tells the owner, and waits until
    /// it lets the import go (it stopped the peer first) or the peer has no
    /// such driver any more; after [`OWNER_STOPS`], turns the peer's bus
    /// mastering off. Nothing to wait for with a kernel driver's peer.
    fn await_owner(&self) {
        let peer = Peer(self.peer.clone());
        if !peer.driven_from_user_space() {
            return;
        }
        self.notice.warn();
        let rounds = OWNER_STOPS.as_millis() / OWNER_POLL.as_millis();
        for _ in 0..rounds {
            if self.notice.released() || !peer.driven_from_user_space() {
                return;
            }
            fsleep(OWNER_POLL);
        }
        if self.notice.released() || !peer.driven_from_user_space() {
            return;
        }
        dev_warn!(
            self.peer.as_ref(),
            "its user did not stop it within {} s of a dma-buf exporter's revocation of memory mapped for it; bus mastering turned off\n",
            OWNER_STOPS.as_millis() / 1000
        );
        // SAFETY: The peer is referenced; clearing bus mastering takes the
        // PCI config lock only.
        unsafe { bindings::pci_clear_master(raw_pdev(&*self.peer)) };
    }
}

#[pinned_drop]
impl PinnedDrop for DmaBufMap {
    fn drop(self: Pin<&mut Self>) {
        // An invalidation waiting for the owner under the lock goes on.
        self.notice.release();
        self.buf.lock();
        // SAFETY: Under the reservation lock (type invariant).
        let locked = unsafe { &mut *self.locked.get() };
        let attach = locked.attach;
        self.revoke_locked(locked);
        self.buf.unlock();
        if !attach.is_null() {
            // SAFETY: The attachment is live; after this no callback runs.
            unsafe { bindings::dma_buf_detach(self.buf.0.as_ptr(), attach) };
        }
    }
}
