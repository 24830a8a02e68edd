// SPDX-License-Identifier: GPL-2.0

//! Kernel interfaces that the kernel's Rust abstractions do not cover yet.
//!
//! Every raw declaration lives in the private `raw` module below; the rest of
//! the module only calls the safe wrappers here. Each wrapper names the
//! upstream abstraction it stands in for.

use kernel::{
    device,
    error::to_result,
    ffi::{
        c_char,
        c_int, //
    },
    pci,
    prelude::*,
};

mod raw {
    use kernel::{
        bindings,
        ffi::{
            c_char,
            c_int, //
        },
    };

    #[expect(
        improper_ctypes,
        reason = "struct pci_dev is only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // include/linux/pci-p2pdma.h, which the kernel's bindings do not include.
        pub(super) fn pci_p2pdma_add_resource(
            pdev: *mut bindings::pci_dev,
            bar: c_int,
            size: usize,
            offset: u64,
        ) -> c_int;
        pub(super) fn pci_p2pmem_publish(pdev: *mut bindings::pci_dev, publish: bool);

        // include/linux/pci.h; exported, not in the Rust bindings.
        pub(super) fn pcim_enable_device(pdev: *mut bindings::pci_dev) -> c_int;

        // helpers.c: static inline functions, macros and module parameters.
        pub(super) fn p2pdma_helper_param_bar() -> c_int;
        pub(super) fn p2pdma_helper_add_param_ids(drv_name: *const c_char) -> c_int;
        pub(super) fn p2pdma_helper_bar_kind(pdev: *mut bindings::pci_dev, bar: c_int) -> u32;
        pub(super) fn p2pdma_helper_bar_len(pdev: *mut bindings::pci_dev, bar: c_int) -> u64;
        pub(super) fn p2pdma_helper_bar_bus_addr(pdev: *mut bindings::pci_dev, bar: c_int)
            -> u64;
        pub(super) fn p2pdma_helper_location(
            pdev: *mut bindings::pci_dev,
            domain: *mut u32,
            bus: *mut u8,
            devfn: *mut u8,
        );
        pub(super) fn p2pdma_helper_numa_node(pdev: *mut bindings::pci_dev) -> c_int;
    }
}

/// The BAR decodes memory (not I/O ports).
pub(crate) const BAR_MEM: u32 = 1;
/// The BAR is 64-bit.
pub(crate) const BAR_MEM_64: u32 = 2;
/// The BAR is prefetchable.
pub(crate) const BAR_PREFETCH: u32 = 4;

/// Number of standard BARs of a PCI function.
pub(crate) const NUM_BARS: u32 = 6;

/// Returns the `struct pci_dev` behind `pdev`.
///
/// `pci::Device::as_raw` is private upstream; `pci::Device` is
/// `#[repr(transparent)]` over `Opaque<bindings::pci_dev>`, so the cast is the
/// same pointer.
fn raw_pdev<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>) -> *mut kernel::bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// Registers `bar` of `pdev` as P2PDMA memory (`pci_p2pdma_add_resource`).
///
/// The pages are device-managed: they go away when the driver unbinds.
pub(crate) fn p2pdma_add_resource(pdev: &pci::Device<device::Core<'_>>, bar: u32) -> Result {
    let bar = c_int::try_from(bar)?;
    // SAFETY: `pdev` is a bound device (Core context), as the devres-managed
    // registration requires; size 0 means the whole BAR.
    to_result(unsafe { raw::pci_p2pdma_add_resource(raw_pdev(pdev), bar, 0, 0) })
}

/// Publishes (or withdraws) `pdev`'s P2P memory for other kernel users
/// (`pci_p2pmem_publish`).
pub(crate) fn p2pmem_publish(pdev: &pci::Device<device::Core<'_>>, publish: bool) {
    // SAFETY: `pdev` is a valid, bound PCI device.
    unsafe { raw::pci_p2pmem_publish(raw_pdev(pdev), publish) }
}

/// Enables the device's memory decoding and bus mastering for as long as the
/// driver stays bound (`pcim_enable_device`; upstream's `enable_device_mem`
/// has no disable counterpart).
pub(crate) fn pcim_enable_device(pdev: &pci::Device<device::Core<'_>>) -> Result {
    // SAFETY: `pdev` is a bound device, as the managed variant requires.
    to_result(unsafe { raw::pcim_enable_device(raw_pdev(pdev)) })
}

/// The `bar=` module parameter, `None` when not set.
pub(crate) fn param_bar() -> Option<u32> {
    // SAFETY: Reads a module parameter that is only written at load time.
    let bar = unsafe { raw::p2pdma_helper_param_bar() };
    u32::try_from(bar).ok()
}

/// Adds the IDs of the `ids=` module parameter to the PCI driver `name`.
pub(crate) fn add_param_ids(name: &CStr) -> Result {
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    to_result(unsafe { raw::p2pdma_helper_add_param_ids(name.as_char_ptr().cast::<c_char>()) })
}

/// Facts about one BAR of a PCI device.
pub(crate) struct BarInfo {
    /// `BAR_*` bits.
    pub(crate) kind: u32,
    /// Size in bytes, 0 when the BAR is not implemented.
    pub(crate) len: u64,
    /// PCI bus address of the BAR's start.
    pub(crate) bus_addr: u64,
}

/// Describes BAR `bar` (< [`NUM_BARS`]) of `pdev`.
pub(crate) fn bar_info<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>, bar: u32) -> BarInfo {
    let pdev = raw_pdev(pdev);
    let bar = bar.min(NUM_BARS - 1) as c_int;
    // SAFETY: `pdev` is valid and `bar` is a standard BAR index.
    unsafe {
        BarInfo {
            kind: raw::p2pdma_helper_bar_kind(pdev, bar),
            len: raw::p2pdma_helper_bar_len(pdev, bar),
            bus_addr: raw::p2pdma_helper_bar_bus_addr(pdev, bar),
        }
    }
}

/// PCI domain, bus and devfn of `pdev`.
pub(crate) fn location<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>) -> (u32, u8, u8) {
    let (mut domain, mut bus, mut devfn) = (0u32, 0u8, 0u8);
    // SAFETY: `pdev` is valid and the out pointers point to live locals.
    unsafe { raw::p2pdma_helper_location(raw_pdev(pdev), &mut domain, &mut bus, &mut devfn) };
    (domain, bus, devfn)
}

/// NUMA node of `pdev`, -1 when none.
pub(crate) fn numa_node<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>) -> i32 {
    // SAFETY: `pdev` is valid.
    unsafe { raw::p2pdma_helper_numa_node(raw_pdev(pdev)) }
}
