//! The raw layer: one safe function per ioctl of `/dev/p2pdma`.
//!
//! This is the only module of the crate allowed to use `unsafe`.
#![allow(unsafe_code)]

use std::os::fd::AsFd;

use p2pdma_abi as abi;
use rustix::{
    io::Errno,
    ioctl::{ioctl, Getter, Opcode, Updater},
};

/// Returns the module's ABI version and capabilities.
#[doc(alias = "P2PDMA_IOC_GET_VERSION")]
pub fn get_version(fd: impl AsFd) -> Result<abi::P2pdmaVersion, Errno> {
    // SAFETY: The request code is an `_IOR` of exactly `P2pdmaVersion`, which
    // is plain integers, so the kernel writes a valid value.
    unsafe {
        ioctl(
            fd,
            Getter::<{ abi::P2PDMA_IOC_GET_VERSION as Opcode }, abi::P2pdmaVersion>::new(),
        )
    }
}

/// Describes the accelerator at stable index `index`; `ENODEV` when none.
#[doc(alias = "P2PDMA_IOC_DEVICE_INFO")]
pub fn device_info(fd: impl AsFd, index: u32) -> Result<abi::P2pdmaDeviceInfo, Errno> {
    let mut info = abi::P2pdmaDeviceInfo {
        index,
        ..Default::default()
    };
    // SAFETY: The request code is an `_IOWR` of exactly `P2pdmaDeviceInfo`,
    // which the kernel reads and rewrites in place; all of it is integers.
    unsafe {
        ioctl(
            fd,
            Updater::<{ abi::P2PDMA_IOC_DEVICE_INFO as Opcode }, abi::P2pdmaDeviceInfo>::new(
                &mut info,
            ),
        )?;
    }
    Ok(info)
}
