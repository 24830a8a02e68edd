// SPDX-License-Identifier: GPL-2.0

//! eventfds, through which a file's owner is told of revocations (no
//! upstream wrapper).

use core::ptr::NonNull;

use kernel::{
    ffi::{
        c_int,
        c_void, //
    },
    prelude::*,
    sync::Arc, //
};

use super::dma::errno_or;

mod raw {
    use kernel::ffi::{
        c_int,
        c_void, //
    };

    unsafe extern "C" {
        // helpers.c: static inline functions, macros, module parameters and
        // operation tables.
        pub(super) fn p2pdma_helper_eventfd_get(fd: c_int, err: *mut c_int) -> *mut c_void;
        pub(super) fn p2pdma_helper_eventfd_signal(ctx: *mut c_void);
        pub(super) fn p2pdma_helper_eventfd_put(ctx: *mut c_void);
    }
}

/// An eventfd a file's owner registered for revocation notices.
///
/// # Invariants
///
/// Holds a reference on the `struct eventfd_ctx`.
pub(crate) struct EventFd(NonNull<c_void>);

// SAFETY: eventfd contexts may be signalled and dropped from any thread.
unsafe impl Send for EventFd {}
// SAFETY: See above.
unsafe impl Sync for EventFd {}

impl EventFd {
    /// The eventfd behind the caller's descriptor `fd`.
    pub(crate) fn get(fd: i32) -> Result<Self> {
        let mut err: c_int = 0;
        // SAFETY: The helper validates `fd`.
        let ctx = unsafe { raw::p2pdma_helper_eventfd_get(fd, &mut err) };
        NonNull::new(ctx)
            .map(Self)
            .ok_or_else(|| errno_or(err, EBADF))
    }

    /// Adds one to its counter.
    pub(crate) fn signal(&self) {
        // SAFETY: By the type invariant.
        unsafe { raw::p2pdma_helper_eventfd_signal(self.0.as_ptr()) }
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `get`.
        unsafe { raw::p2pdma_helper_eventfd_put(self.0.as_ptr()) }
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
