//! libp2pdma: peer-to-peer DMA between NVMe SSDs and accelerator memory.
//!
//! The layers, from the bottom: [`sys`] holds the `unsafe` that talks to the
//! module (one safe function per ioctl of `/dev/p2pdma`, and raw mappings);
//! the only other `unsafe` is in [`wc`] (copy routines on raw pointers), the
//! io_uring layer (buffers lent to the kernel), the `FIEMAP` ioctl of the
//! transfer engine and its copy stage's helper threads (a landed chunk's
//! bytes lent to them until the copy returns);
//! [`device`] discovers the accelerators the kernel module has bound;
//! [`memory`] allocates their memory and maps it into the process, reachable
//! only through explicit copies; [`dma`] asks whether a peer can reach that
//! memory and hands out the addresses it must use; [`udmabuf`] makes host
//! memory into a dma-buf to import; [`queues`] drives an NVMe controller
//! from this process through VFIO, its queues in accelerator memory (its
//! `unsafe`: the VFIO ioctls, the doorbell registers and the queue entries
//! written and read in place).
#![deny(unsafe_code)]

pub mod discovery;
pub mod doctor;
pub mod error;
pub mod memory;
pub mod nvme;
pub mod queues;
pub mod sys;
pub mod transfer;

pub use discovery::{Accelerator, Module, PciAddress, StorageTarget, Topology};
pub use doctor::{AccelSelect, Doctor, Report};
pub use error::{Error, Result};
pub use memory::{
    Allocation, DeviceMapping, DmaMapping, HandleState, MapType, P2pQuery, Peer, PeerAccess,
    Udmabuf,
};
pub use sys::HostBuffer;
pub use transfer::plan::{choose_path, PathChoice, PathFacts, TransferPath};
