// SPDX-License-Identifier: GPL-2.0 OR MIT

//! The `/dev/p2pdma` ioctl ABI.
//!
//! This file is the single source of truth for the ABI. The kernel module
//! includes it as a module, the userspace crate `p2pdma-abi` includes the same
//! file, and `uapi.h` next to it spells it for C; a test builds that header and
//! fails if any size, offset or request code differs from what is here.
//!
//! Rules: every struct is `#[repr(C)]` with fixed-width fields only, pointers
//! travel as `u64`, padding is explicit, `flags` and `reserved` fields must be
//! zero on input (`EINVAL` otherwise) and are zeroed on output. A struct never
//! changes once released: new features get new ioctls.
//!
//! This file uses nothing but `core` so it builds in both worlds.

use core::mem::{offset_of, size_of};

/// The ioctl "type" byte of every p2pdma request.
pub const P2PDMA_IOCTL_MAGIC: u32 = 0xBC;

/// ABI version implemented by this file. Bumped when ioctls are added.
pub const P2PDMA_ABI_VERSION: u32 = 1;

/// Oldest ABI version a caller may have been built against and still work.
pub const P2PDMA_ABI_MIN_COMPAT: u32 = 1;

/// Capability bit: accelerator BARs are registered as kernel P2PDMA memory.
pub const P2PDMA_CAP_BAR_P2PMEM: u64 = 1 << 0;

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    (dir << IOC_DIRSHIFT)
        | (P2PDMA_IOCTL_MAGIC << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
}

/// Output of [`P2PDMA_IOC_GET_VERSION`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaVersion {
    /// ABI version of the running module ([`P2PDMA_ABI_VERSION`]).
    pub abi_version: u32,
    /// Oldest ABI version the module still serves.
    pub abi_min_compat: u32,
    /// `P2PDMA_CAP_*` bits.
    pub capabilities: u64,
    /// Number of accelerator devices bound right now.
    pub num_devices: u32,
    /// Zero.
    pub reserved0: u32,
    /// Zero.
    pub reserved: [u64; 4],
}

/// In/out argument of [`P2PDMA_IOC_DEVICE_INFO`].
///
/// In: `index` (a device's stable index, `0..P2PDMA_MAX_DEVICES`), `flags` = 0.
/// Out: everything else. An index with no device bound gives `ENODEV`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pdmaDeviceInfo {
    /// In: stable device index.
    pub index: u32,
    /// In: must be zero.
    pub flags: u32,
    /// PCI domain (segment).
    pub domain: u32,
    /// PCI bus number.
    pub bus: u8,
    /// PCI device and function, `(dev << 3) | fn`.
    pub devfn: u8,
    /// Index of the BAR registered as P2P memory.
    pub bar: u8,
    /// Zero.
    pub pad0: u8,
    /// PCI vendor ID.
    pub vendor: u16,
    /// PCI device ID.
    pub device: u16,
    /// NUMA node of the device, -1 when unknown.
    pub numa_node: i32,
    /// Size of the BAR in bytes.
    pub bar_size: u64,
    /// PCI bus address of the start of the BAR.
    pub bar_bus_addr: u64,
    /// Bytes of the BAR registered as P2P memory.
    pub p2p_size: u64,
    /// Bytes of P2P memory not yet allocated through this module.
    pub p2p_available: u64,
    /// Zero.
    pub reserved: [u64; 4],
}

/// Largest number of accelerator devices the module tracks at once.
pub const P2PDMA_MAX_DEVICES: u32 = 64;

/// Query the ABI version and capabilities. Never fails.
pub const P2PDMA_IOC_GET_VERSION: u32 = ioc(IOC_READ, 0x00, size_of::<P2pdmaVersion>());

/// Describe one accelerator device.
///
/// Errors: `EINVAL` (non-zero flags, or index >= `P2PDMA_MAX_DEVICES`),
/// `ENODEV` (no device at that index), `EFAULT`.
pub const P2PDMA_IOC_DEVICE_INFO: u32 =
    ioc(IOC_READ | IOC_WRITE, 0x01, size_of::<P2pdmaDeviceInfo>());

// The layout is frozen: these fail to compile if it moves.
const _: () = {
    assert!(size_of::<P2pdmaVersion>() == 56);
    assert!(offset_of!(P2pdmaVersion, capabilities) == 8);
    assert!(offset_of!(P2pdmaVersion, num_devices) == 16);
    assert!(offset_of!(P2pdmaVersion, reserved) == 24);

    assert!(size_of::<P2pdmaDeviceInfo>() == 88);
    assert!(offset_of!(P2pdmaDeviceInfo, domain) == 8);
    assert!(offset_of!(P2pdmaDeviceInfo, bus) == 12);
    assert!(offset_of!(P2pdmaDeviceInfo, devfn) == 13);
    assert!(offset_of!(P2pdmaDeviceInfo, bar) == 14);
    assert!(offset_of!(P2pdmaDeviceInfo, vendor) == 16);
    assert!(offset_of!(P2pdmaDeviceInfo, device) == 18);
    assert!(offset_of!(P2pdmaDeviceInfo, numa_node) == 20);
    assert!(offset_of!(P2pdmaDeviceInfo, bar_size) == 24);
    assert!(offset_of!(P2pdmaDeviceInfo, bar_bus_addr) == 32);
    assert!(offset_of!(P2pdmaDeviceInfo, p2p_size) == 40);
    assert!(offset_of!(P2pdmaDeviceInfo, p2p_available) == 48);
    assert!(offset_of!(P2pdmaDeviceInfo, reserved) == 56);

    assert!(P2PDMA_IOC_GET_VERSION == 0x8038_BC00);
    assert!(P2PDMA_IOC_DEVICE_INFO == 0xC058_BC01);
};
