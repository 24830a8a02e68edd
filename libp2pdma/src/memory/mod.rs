//! Accelerator memory and how peers reach it.
//!
//! - [`device`]: the [`DeviceMemory`] trait the transfer engine sees memory
//!   through, the `unsafe` [`DmaMemory`] trait of memory devices reach by
//!   DMA, and the host-memory device;
//! - [`copy`](mod@copy): copies between two memories, in as few passes
//!   over the bytes as their mappings allow;
//! - [`module`]: allocations from the p2pdma module, their mappings into
//!   this process, and [`ModuleMemory`];
//! - [`range`]: a range of a memory, the memory side of a transfer;
//! - [`peer`]: whether a peer can reach the memory, and the DMA addresses it
//!   must use;
//! - [`udmabuf`]: host memory made into a dma-buf to import;
//! - [`borrowed`]: host memory a caller lends for the length of a transfer;
//! - [`dmabuf`]: memory another driver exported as a dma-buf, mapped for
//!   the CPU (gdrcopy-style) and imported for peers;
//! - [`cuda`]: GPU memory through the CUDA driver, its copy engine and its
//!   dma-bufs.

pub mod borrowed;
pub mod copy;
pub mod cuda;
pub mod device;
pub mod dmabuf;
pub mod module;
pub mod peer;
pub mod range;
pub mod udmabuf;

pub use crate::sys::DmaTarget;
pub use borrowed::BorrowedHost;
pub use copy::copy;
pub use cuda::{CpuMapping, CudaMemory, CudaStager};
pub use device::{DeviceMemory, DmaMemory, HostMemory, MemoryKind, Stager, StagingPin};
pub use dmabuf::{DmabufMapping, DmabufMemory};
pub use module::{Allocation, DeviceMapping, ModuleMemory};
pub use peer::{DmaMapping, HandleState, MapType, P2pQuery, Peer, PeerAccess};
pub use range::MemRange;
pub use udmabuf::Udmabuf;
