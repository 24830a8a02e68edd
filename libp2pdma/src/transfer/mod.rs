//! Transfers between storage and accelerator memory.
//!
//! An [`Engine`] moves bytes between a [`StorageFile`] (a file on a
//! filesystem, or a raw block device) and [`DeviceMemory`](crate::memory::DeviceMemory), on one of these
//! paths:
//!
//! - **P2P**: `O_DIRECT` reads and writes through io_uring whose buffer is the
//!   accelerator memory's CPU mapping: the SSD DMAs into the accelerator
//!   directly ([`paths::p2p`]);
//! - **bounce**: a staged pipeline through a pinned host ring allocated once,
//!   the storage stage of chunk i+1.. overlapping the device-copy stage of
//!   chunk i ([`paths::bounce`]);
//! - **NVMe commands** (only when asked for): read and write commands built
//!   by the library and sent through io_uring passthrough, on a raw NVMe
//!   namespace or partition, or on a file on ext4 or XFS whose extents are
//!   found with `FIEMAP` ([`paths::nvme_cmd`], [`exec::extents`]);
//! - **queues**: NVMe commands this process puts in queues in accelerator
//!   memory, on a controller it drives ([`paths::queues`]).
//!
//! Strided reads (many equal runs of a file, up to three strides) have
//! their own view of the engine, [`Engine::strided`] ([`strided`]); routes
//! between any two places theirs, [`Engine::routes`] ([`route`]).
//!
//! [`PathPref::Auto`] picks P2P where the module, the memory and the PCIe
//! topology allow it and says why not otherwise; each [`Handle`] keeps the
//! choice and its reason. A transfer the P2P or NVMe-command path cannot
//! serve ([`Error::bounce_can_fix`](crate::Error::bounce_can_fix)) is retried on the bounce path and
//! counted; a device error is returned as it is. Unaligned heads and tails are
//! handled, not refused. A transfer either moves every byte or returns an
//! error: short transfers are reported, never returned as success.
//!
//! The folders follow the data, from the bottom: [`plan`] is the path rule
//! (a pure function of facts, which the doctor reports too); [`tuning`]
//! holds the configuration, the chunk geometry and the strided cost model's
//! constants; [`exec`] the machinery a transfer runs on (the staged
//! pipeline, the copy threads, a file's extents, worker threads and ring
//! buffers); [`storage`] the opened file and [`xfer`] one transfer as every
//! path sees it; [`paths`] one module per data path, and [`calibrate`]
//! the geometry measured on a file; [`core`] holds what transfers share,
//! chooses a path and runs a transfer on it; [`strided`], [`route`] and
//! [`asyncio`] are built on the core and take it, not the engine;
//! [`engine`] is the face that owns them all.

pub(crate) mod array;
pub mod asyncio;
pub mod calibrate;
pub mod core;
pub mod engine;
pub mod exec;
pub mod paths;
pub mod plan;
pub mod route;
pub mod stats;
pub mod storage;
pub mod strided;
pub mod tuning;
pub mod volume;
pub mod xfer;

pub use crate::queues::Namespace;
pub use crate::sys::uring::nvme_io_sqe;
pub use asyncio::{Request, StridedRequest, Ticket};
pub use core::{Core, GeometryChoice, Handle, Report};
pub use engine::Engine;
pub use plan::{PathChoice, TransferPath};
pub use route::{End, Hop, HopKind, Route, RouteOptions, RouteReport, Routes, Via};
pub use stats::{PathStats, Stats};
pub use storage::{NvmeNamespace, StorageFile};
pub use strided::{Layout, Shape, Strided, StridedMode, StridedReport};
pub use tuning::{
    config::{Config, P2pSubmit, PageCache, PathPref, StridedConstants},
    constants,
    geometry::{self, Geometry},
};
pub use volume::{Volume, VolumeMember, VolumeSpec};
pub use xfer::Direction;
