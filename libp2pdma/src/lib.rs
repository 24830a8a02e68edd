//! libp2pdma: peer-to-peer DMA between NVMe SSDs and accelerator memory.
//!
//! A storage engine or a data loader reads a file into accelerator memory
//! with an [`Engine`]: it opens the file ([`StorageFile`]), takes memory
//! ([`ModuleMemory`] from the p2pdma kernel module, or [`HostMemory`] where
//! there is no accelerator), and asks for a transfer. The engine picks the
//! path (P2P DMA where the kernel allows it, a pipelined copy through host
//! memory otherwise), says why ([`Handle::reason`]), and either moves every
//! byte or returns an [`Error`].
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use p2pdma::{Config, Engine, MemRange, Module, ModuleMemory, StorageFile};
//!
//! # fn main() -> p2pdma::Result<()> {
//! let module = Arc::new(Module::open()?);
//! let mem = ModuleMemory::alloc(module.clone(), 0, 64 << 20, 4096)?;
//! let engine = Engine::new(Config::from_env()?, Some(module));
//! let file = StorageFile::open("/data/shard-0")?;
//! let report = engine.read(&file, 0, MemRange::whole(&mem))?;
//! println!("{} bytes by {}", report.bytes, report.path);
//! # Ok(())
//! # }
//! ```
//!
//! The memory side of every transfer is a [`MemRange`]: a memory, and the
//! bytes of it the transfer covers. Strided reads ([`Engine::strided`]),
//! background transfers ([`Engine::submit`]) and multi-hop routes
//! ([`Engine::routes`]) build on the same engine;
//! `libp2pdma/examples/` has a short program for each.
//!
//! # Layers
//!
//! Every module imports only from the layers below it (the `layers` test
//! checks it), from the bottom:
//!
//! - [`error`]: the error type every layer returns;
//! - [`nvme`]: the NVMe specification, once (opcodes, entries, PRPs);
//! - [`sys`]: one safe function per system call and ioctl, raw mappings
//!   and the copies to write-combined memory;
//! - [`discovery`]: what the machine is made of (storage, PCI, mounts,
//!   accelerators), read once for the engine, the doctor and the tools;
//! - [`memory`]: accelerator memory behind one trait, and the DMA
//!   addresses peers use to reach it;
//! - [`queues`]: an NVMe controller this process drives through VFIO, its
//!   queues in accelerator memory;
//! - [`transfer`]: the path rule, the data paths and the engine;
//! - [`store`]: objects on NVMe, over the engine;
//! - [`doctor`]: whether P2P works on this machine, and why not.
#![deny(unsafe_code)]

pub mod discovery;
pub mod doctor;
pub mod error;
pub mod memory;
pub mod nvme;
pub mod queues;
pub mod store;
pub mod sys;
pub mod transfer;

pub use discovery::{Accelerator, Module, PciAddress, StorageTarget, Topology};
pub use doctor::{AccelSelect, Doctor, Report};
pub use error::{Error, Result};
pub use memory::{
    Allocation, BorrowedHost, DeviceMapping, DeviceMemory, DmaMapping, DmaMemory, HandleState,
    HostMemory, MapType, MemRange, ModuleMemory, P2pQuery, Peer, PeerAccess, Udmabuf,
};
pub use sys::HostBuffer;
pub use transfer::{
    plan::{decide, Facts, PathChoice, TransferPath},
    Config, Direction, Engine, Handle, Layout, PathPref, Request, Shape, StorageFile, StridedMode,
    Ticket,
};
