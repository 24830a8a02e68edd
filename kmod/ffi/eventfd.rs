// SPDX-License-Identifier: GPL-2.0

//! eventfds, through which a file's owner is told of revocations (no
//! upstream wrapper).

use core::ptr::NonNull;

use kernel::{
    bindings,
    prelude::*,
    sync::Arc, //
};

/// An eventfd a file's owner registered for revocation notices.
///
/// # Invariants
///
/// Holds a reference on the `struct eventfd_ctx`.
pub(crate) struct EventFd(NonNull<bindings::eventfd_ctx>);

// SAFETY: eventfd contexts may be signalled and dropped from any thread.
unsafe impl Send for EventFd {}
// SAFETY: See above.
unsafe impl Sync for EventFd {}

impl EventFd {
    /// The eventfd behind the caller's descriptor `fd`; `EBADF` when it is
    /// not one.
    pub(crate) fn get(fd: i32) -> Result<Self> {
        // SAFETY: `eventfd_ctx_fdget` validates `fd`; it returns a
        // referenced context or an error pointer.
        let ctx = kernel::error::from_err_ptr(unsafe { bindings::eventfd_ctx_fdget(fd) })
            .map_err(|e| if e == EINVAL { EBADF } else { e })?;
        // INVARIANT: the reference taken is ours.
        NonNull::new(ctx).map(Self).ok_or(EBADF)
    }

    /// Adds one to its counter (`eventfd_signal`, a static inline).
    pub(crate) fn signal(&self) {
        // SAFETY: By the type invariant the context is alive.
        unsafe { bindings::eventfd_signal_mask(self.0.as_ptr(), 0) }
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `get`.
        unsafe { bindings::eventfd_ctx_put(self.0.as_ptr()) }
    }
}

/// Where an open file's revocation notices go.
#[pin_data]
pub(crate) struct Notifier {
    #[pin]
    eventfd: kernel::sync::Mutex<Option<EventFd>>,
}

impl Notifier {
    /// A notifier with no eventfd yet.
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                eventfd <- kernel::new_mutex!(None),
            }),
            GFP_KERNEL,
        )
    }

    /// Replaces the eventfd.
    pub(crate) fn set(&self, eventfd: Option<EventFd>) {
        let old = core::mem::replace(&mut *self.eventfd.lock(), eventfd);
        drop(old);
    }

    /// Tells the owner that something was revoked.
    pub(crate) fn signal(&self) {
        if let Some(e) = self.eventfd.lock().as_ref() {
            e.signal();
        }
    }
}
