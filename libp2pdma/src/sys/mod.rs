//! The raw layer: one function per system call or ioctl the library
//! makes, and the raw memory the safe layers build on.
//!
//! Every function here is safe to call, except those whose arguments name
//! memory by a raw number (an allocation or mapping handle, an `mmap`
//! offset) or give a process a device's DMA (`vfio`): those are `unsafe`,
//! and say what the caller vouches for. The `unsafe` of the crate lives in
//! this layer, in the queues driver (doorbells and queue entries written in
//! place) and in the transfer engine's copy helpers (a landed chunk's bytes
//! lent to helper threads until the copy returns).
//!
//! - [`p2pdma`]: the ioctls of `/dev/p2pdma` and `UDMABUF_CREATE`;
//! - [`mapping`]: device memory mapped from a file, host buffers, and the
//!   raw [`DmaTarget`] a transfer lends to the kernel;
//! - [`wc`]: copies to and from write-combined memory;
//! - `uring`: io_uring rings for file I/O and NVMe passthrough;
//! - [`file`](mod@file): a file's extents and page-cache state;
//! - [`vfio`]: the VFIO ioctls that drive a PCI function from user space;
//! - [`cuda`]: the CUDA driver, loaded at run time.

pub mod cuda;
pub mod file;
pub mod mapping;
pub mod p2pdma;
pub(crate) mod uring;
pub mod vfio;
pub mod wc;

pub use mapping::{Caching, DmaTarget, HostBuffer, RawMapping, Sharing};
pub use p2pdma::*;
