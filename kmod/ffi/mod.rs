// SPDX-License-Identifier: GPL-2.0

//! Kernel interfaces that the kernel's Rust abstractions do not cover yet,
//! one module per kernel facility.
//!
//! Every raw declaration lives in the private `raw` module of its facility
//! (or comes from `kernel::bindings`); the rest of the module only calls the
//! safe wrappers. Each wrapper names the upstream facility it stands in for.

pub(crate) mod block;
pub(crate) mod dma;
pub(crate) mod dmabuf;
pub(crate) mod eventfd;
pub(crate) mod mm;
pub(crate) mod p2pmem;
pub(crate) mod param;
pub(crate) mod pci;
pub(crate) mod task;
