//! The data paths, one module each, all run on an `Xfer` (one
//! transfer, [`xfer`](super::xfer)) or a queues [`Namespace`](crate::queues::Namespace): P2P by `O_DIRECT`
//! into the memory's mapping, NVMe commands through io_uring passthrough,
//! the bounce pipeline through host memory, and the queues this process
//! drives; the partial blocks at the ends of the direct paths in a module
//! of their own (`edges`); and reads of what the page cache already holds
//! (`cached`).

pub mod bounce;
pub mod cached;
mod edges;
pub mod nvme_cmd;
pub mod p2p;
pub mod queues;
