// SPDX-License-Identifier: GPL-2.0

//! The calling task: capabilities, credentials, its thread group and
//! pending signals (static inlines and macros with no upstream wrapper).

use core::ptr::NonNull;

use kernel::{
    bindings,
    ffi::c_int,
    prelude::*, //
};

mod raw {
    use kernel::{
        bindings,
        ffi::c_ulong, //
    };

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: `current`, `current_uid`, `task_tgid`, `get_pid`,
        // `rlimit` and `fatal_signal_pending` are macros or static inlines.
        pub(super) fn p2pdma_helper_current_uid() -> u32;
        pub(super) fn p2pdma_helper_current_tgid_get() -> *mut bindings::pid;
        pub(super) fn p2pdma_helper_is_current_tgid(pid: *mut bindings::pid) -> bool;
        pub(super) fn p2pdma_helper_memlock_limit() -> c_ulong;
        pub(super) fn p2pdma_helper_current_mm() -> *mut bindings::mm_struct;
        pub(super) fn p2pdma_helper_fatal_signal_pending() -> bool;
    }
}

/// A capability of the calling task (`capable`, no upstream wrapper).
#[derive(Clone, Copy)]
pub(crate) enum Cap {
    /// `CAP_SYS_RAWIO`: DMA addresses.
    SysRawio = bindings::CAP_SYS_RAWIO as isize,
    /// `CAP_SYS_ADMIN`: no share limit on device memory.
    SysAdmin = bindings::CAP_SYS_ADMIN as isize,
    /// `CAP_IPC_LOCK`: pinned memory past `RLIMIT_MEMLOCK`.
    IpcLock = bindings::CAP_IPC_LOCK as isize,
}

/// Whether the caller has `cap`.
pub(crate) fn capable(cap: Cap) -> bool {
    // SAFETY: `capable` only inspects the current task's credentials.
    unsafe { bindings::capable(cap as c_int) }
}

/// The caller's kernel uid (`kuid_t`): the same user whatever user
/// namespace it runs in, so that a namespace cannot mint fresh uids.
pub(crate) fn current_uid() -> u32 {
    // SAFETY: Reads the current task's credentials.
    unsafe { raw::p2pdma_helper_current_uid() }
}

/// A thread group (process), identified by its `struct pid`, which is
/// reference-counted and never reused while referenced, unlike a pid number.
/// (`Task::tgid` has no such guarantee, and read garbage on this kernel.)
///
/// # Invariants
///
/// Holds a reference on the `struct pid`.
pub(crate) struct ThreadGroup(NonNull<bindings::pid>);

// SAFETY: A `struct pid` reference may be dropped from any thread.
unsafe impl Send for ThreadGroup {}
// SAFETY: Comparing pointers is thread-safe.
unsafe impl Sync for ThreadGroup {}

impl ThreadGroup {
    /// The calling process.
    pub(crate) fn current() -> Result<Self> {
        // SAFETY: Takes a reference on the current task's thread-group pid.
        NonNull::new(unsafe { raw::p2pdma_helper_current_tgid_get() })
            .map(Self)
            .ok_or(ESRCH)
    }

    /// Whether the calling thread belongs to this process.
    pub(crate) fn is_current(&self) -> bool {
        // SAFETY: By the type invariant the pid is alive.
        unsafe { raw::p2pdma_helper_is_current_tgid(self.0.as_ptr()) }
    }
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `current`.
        unsafe { bindings::put_pid(self.0.as_ptr()) }
    }
}

/// Whether the current task was sent a fatal signal (`fatal_signal_pending`,
/// a static inline).
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: Reads the current task's signal state.
    unsafe { raw::p2pdma_helper_fatal_signal_pending() }
}

/// The caller's `RLIMIT_MEMLOCK`, in bytes.
pub(crate) fn memlock_limit() -> u64 {
    // SAFETY: Reads the current task's resource limit.
    (unsafe { raw::p2pdma_helper_memlock_limit() }) as u64
}

/// The caller's mm (`current->mm`), `None` in a kernel thread.
///
/// Read in C and handed out by address only: bindgen lays `task_struct` out
/// differently from the compiler on this kernel (its `mm` is 48 bytes off
/// in the base configuration), and `mm_struct` is declared cache-line
/// aligned, which debug kernels' slabs do not always keep, so upstream's
/// `CurrentTask::mm` (a reference to an `MmWithUser`) cannot be used.
pub(crate) fn current_mm() -> Option<NonNull<bindings::mm_struct>> {
    // SAFETY: Reads the current task's `mm`, which only the task changes.
    NonNull::new(unsafe { raw::p2pdma_helper_current_mm() })
}
