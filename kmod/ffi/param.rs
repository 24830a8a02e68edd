// SPDX-License-Identifier: GPL-2.0

//! The module parameters, which `module_param_array` (a C macro) declares
//! in helpers.c; upstream's `module!` has no array parameters. The `ids=`
//! parameter is parsed here and its IDs added to the PCI driver
//! (`pci_add_dynid`, which upstream's `kernel::pci` does not wrap).

use kernel::{
    bindings,
    error::to_result,
    ffi::{
        c_char,
        c_int,
        c_uint, //
    },
    prelude::*, //
};

mod raw {
    use kernel::{
        bindings,
        ffi::{
            c_char,
            c_int,
            c_uint,
            c_ulong, //
        },
    };

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: the parameters, declared with `module_param` and
        // `module_param_array` (macros).
        pub(super) fn p2pdma_helper_param_bar() -> c_int;
        pub(super) fn p2pdma_helper_param_user_share() -> c_uint;
        pub(super) fn p2pdma_helper_param_id(i: c_uint) -> *const c_char;

        // include/linux/pci.h; exported, not in the Rust bindings.
        pub(super) fn pci_add_dynid(
            drv: *mut bindings::pci_driver,
            vendor: c_uint,
            device: c_uint,
            subvendor: c_uint,
            subdevice: c_uint,
            class: c_uint,
            class_mask: c_uint,
            driver_data: c_ulong,
        ) -> c_int;
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

/// Reads a hexadecimal number at the start of `s` as `sscanf`'s `%x` does
/// (spaces, an optional `0x` before a hex digit, then hex digits, kept to
/// the low 32 bits); returns it and the rest of `s`.
fn scan_hex(s: &[u8]) -> Option<(u32, &[u8])> {
    let s = s.trim_ascii_start();
    let s = match s {
        [b'0', b'x' | b'X', d, ..] if d.is_ascii_hexdigit() => &s[2..],
        _ => s,
    };
    let digits = s.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    if digits == 0 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in &s[..digits] {
        let d = (c as char).to_digit(16)?;
        v = v.wrapping_mul(16).wrapping_add(u64::from(d));
    }
    Some((v as u32, &s[digits..]))
}

/// A `vendor:device` ID in hex, nothing after it (`sscanf(s, "%x:%x%c")`
/// converting exactly two), each at most `0xffff`.
fn parse_id(s: &[u8]) -> Option<(u32, u32)> {
    let (vendor, rest) = scan_hex(s)?;
    let (device, rest) = scan_hex(rest.strip_prefix(b":")?)?;
    (rest.is_empty() && vendor <= 0xffff && device <= 0xffff).then_some((vendor, device))
}

/// Adds the IDs of the `ids=` module parameter (`vendor:device` in hex) to
/// the PCI driver `name`; `EINVAL` for an ID that is not one.
pub(crate) fn add_ids(name: &CStr) -> Result {
    // SAFETY: Reads the parameter array, written at load time only.
    if unsafe { raw::p2pdma_helper_param_id(0) }.is_null() {
        return Ok(());
    }
    // SAFETY: `name` is a NUL-terminated string; `driver_find` only looks
    // the driver up.
    let drv = unsafe {
        bindings::driver_find(name.as_char_ptr().cast::<c_char>(), &bindings::pci_bus_type)
    };
    if drv.is_null() {
        return Err(ENODEV);
    }
    // SAFETY: A driver on the PCI bus is the `driver` field of a
    // `struct pci_driver`, registered by this module and alive while it is.
    let pdrv = unsafe { kernel::container_of!(drv, bindings::pci_driver, driver) };
    for i in 0..c_uint::MAX {
        // SAFETY: As above; NULL past the last ID.
        let id = unsafe { raw::p2pdma_helper_param_id(i) };
        if id.is_null() {
            break;
        }
        // SAFETY: A set parameter is a NUL-terminated string.
        let id = unsafe { CStr::from_char_ptr(id) };
        let Some((vendor, device)) = parse_id(id.to_bytes()) else {
            pr_err!(
                "ids={}: expected vendor:device in hex\n",
                id.to_str().unwrap_or("?")
            );
            return Err(EINVAL);
        };
        let any = bindings::PCI_ANY_ID as c_uint;
        // SAFETY: `pdrv` is a registered PCI driver.
        let ret = unsafe { raw::pci_add_dynid(pdrv, vendor, device, any, any, 0, 0, 0) };
        if ret != -(bindings::EEXIST as c_int) {
            to_result(ret)?;
        }
    }
    Ok(())
}
