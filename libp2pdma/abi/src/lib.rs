//! The `/dev/p2pdma` ioctl ABI.
//!
//! The definitions live in `kmod/uapi.rs`, which the kernel module compiles
//! too; this crate only re-exports them, so userspace and the module cannot
//! disagree. `kmod/uapi.h` is the same ABI for C, checked by this crate's
//! tests.
#![no_std]
#![forbid(unsafe_code)]

#[path = "../../../kmod/uapi.rs"]
mod uapi;

pub use uapi::*;

/// Path of the C header describing the same ABI.
pub const C_HEADER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kmod/uapi.h");
