//! libp2pdma: peer-to-peer DMA between NVMe SSDs and accelerator memory.
//!
//! The layers, from the bottom: [`sys`] is the only module with `unsafe`
//! (one safe function per ioctl of `/dev/p2pdma`); [`device`] discovers the
//! accelerators the kernel module has bound.
#![deny(unsafe_code)]

pub mod device;
pub mod error;
pub mod sys;

pub use device::{Accelerator, Module};
pub use error::{Error, Result};
