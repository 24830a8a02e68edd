// SPDX-License-Identifier: GPL-2.0

//! Kernel interfaces that the kernel's Rust abstractions do not cover yet,
//! one module per kernel facility.
//!
//! Every raw declaration lives in the private `raw` module of its facility
//! (or comes from `kernel::bindings`); the rest of the driver only calls the
//! safe wrappers. Each wrapper names the upstream abstraction it stands in
//! for. Nothing here uses the driver's modules: the kernel's callbacks reach
//! the driver through traits it implements (`mm::VmaOps`,
//! `pci::PeerEvents`).
//!
//! The modules form layers too; each uses only the ones below it, bottom
//! up: `pci`, `param`, `task`, `mm`, `eventfd` (none of the others); then
//! `dmabuf` (dma-buf imports), `dma` (scatter-gather mappings), `p2pmem`
//! (P2P memory, mapped through `dma`), `block` (block devices and bios on
//! P2P memory).

pub(crate) mod block;
pub(crate) mod dma;
pub(crate) mod dmabuf;
pub(crate) mod eventfd;
pub(crate) mod mm;
pub(crate) mod p2pmem;
pub(crate) mod param;
pub(crate) mod pci;
pub(crate) mod task;
