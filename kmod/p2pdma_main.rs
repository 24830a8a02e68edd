// SPDX-License-Identifier: GPL-2.0

//! p2pdma: accelerator memory for peer-to-peer DMA with NVMe and other peers.
//!
//! Binds accelerator PCI devices, registers their memory BAR as kernel P2PDMA
//! memory and serves `/dev/p2pdma`, whose ioctl ABI is defined in `uapi.rs`.
//!
//! The modules form layers; each uses only the ones below it (and the
//! kernel crate), top down:
//!
//! - `p2pdma_main`: the module, owning the registrations.
//! - `file`: `/dev/p2pdma`, its ioctls and `mmap`.
//! - `blockio`: `BLOCK_IO`.
//! - `accel`: the PCI driver and the registry of bound accelerators.
//! - `dma`: DMA mappings handed to user space, and their revocation
//!   (`dma::Mappings` implements `ffi::pci::PeerEvents`).
//! - `overlap`: how many of those mappings cover each page, bounded.
//! - `memory`: allocations and their user mappings (`Alloc` implements
//!   `ffi::mm::VmaOps`, and is taken off its device's list through the
//!   function it is made with, `accel::unlist`).
//! - `ffi`: safe wrappers of the kernel facilities upstream's Rust does not
//!   cover, one module per facility, layered among themselves (see
//!   `ffi/mod.rs`), over the C glue in `helpers.c`.
//! - `uapi`: the ioctl ABI.

use kernel::{
    driver::Registration,
    miscdevice::{
        MiscDeviceOptions,
        MiscDeviceRegistration, //
    },
    pci,
    prelude::*,
    InPlaceModule, //
};

mod accel;
mod blockio;
mod dma;
mod ffi;
mod file;
mod memory;
mod overlap;
#[allow(
    dead_code,
    unreachable_pub,
    reason = "the ABI is shared with userspace, which uses all of it"
)]
mod uapi;

const MODULE_NAME: &CStr = <LocalModule as kernel::ModuleMetadata>::NAME;

#[pin_data]
struct P2pdmaModule {
    // Fields drop in declaration order: the device node goes first, then the
    // PCI driver (unbinding every device), then the watch on peers, then
    // the storage of the mapping registry and of the page counts.
    #[pin]
    _misc: MiscDeviceRegistration<file::P2pdmaFile>,
    #[pin]
    _driver: Registration<pci::Adapter<accel::AccelDriver>>,
    #[pin]
    _peers: ffi::pci::PeerWatch<dma::Mappings>,
    _mappings: dma::RegistryCleanup,
    _counts: overlap::CountsCleanup,
}

impl InPlaceModule for P2pdmaModule {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: Called once, before the driver and the device node that use
        // the registries exist.
        unsafe {
            accel::DEVICES.init();
            dma::MAPPINGS.init();
            overlap::COUNTS.init();
            overlap::IMPORTS.init();
        }

        try_pin_init!(Self {
            _mappings: dma::RegistryCleanup,
            _counts: overlap::CountsCleanup,
            _peers <- ffi::pci::PeerWatch::new(),
            _driver <- Registration::new(MODULE_NAME, module),
            _misc <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"p2pdma" }),
        })
        .pin_chain(|_| ffi::param::add_ids(MODULE_NAME))
    }
}

module! {
    type: P2pdmaModule,
    name: "p2pdma",
    authors: ["The p2pdma authors"],
    description: "Accelerator memory for peer-to-peer DMA",
    license: "GPL v2",
}
