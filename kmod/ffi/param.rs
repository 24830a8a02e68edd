// SPDX-License-Identifier: GPL-2.0

//! The module parameters, which `module_param_array` (a C macro) declares
//! in helpers.c; upstream's `module!` has no array parameters.

use kernel::{
    error::to_result,
    ffi::c_char,
    prelude::*, //
};

mod raw {
    use kernel::ffi::{
        c_char,
        c_int,
        c_uint, //
    };

    unsafe extern "C" {
        // helpers.c: static inline functions, macros, module parameters and
        // operation tables.
        pub(super) fn p2pdma_helper_param_bar() -> c_int;
        pub(super) fn p2pdma_helper_param_user_share() -> c_uint;
        pub(super) fn p2pdma_helper_add_param_ids(drv_name: *const c_char) -> c_int;
    }
}

/// The `bar=` module parameter, `None` when not set.
pub(crate) fn bar() -> Option<u32> {
    // SAFETY: Reads a module parameter that is only written at load time.
    let bar = unsafe { raw::p2pdma_helper_param_bar() };
    u32::try_from(bar).ok()
}

/// The `user_share=` module parameter: percent of a device's P2P memory one
/// user without `CAP_SYS_ADMIN` may hold.
pub(crate) fn user_share() -> u64 {
    // SAFETY: Reads a module parameter.
    u64::from(unsafe { raw::p2pdma_helper_param_user_share() })
}

/// Adds the IDs of the `ids=` module parameter to the PCI driver `name`.
pub(crate) fn add_ids(name: &CStr) -> Result {
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    to_result(unsafe { raw::p2pdma_helper_add_param_ids(name.as_char_ptr().cast::<c_char>()) })
}
