//! The data paths, one module each, all run on an `Xfer` (one
//! transfer, [`xfer`](super::xfer)) or a queues [`Namespace`](crate::queues::Namespace): P2P by `O_DIRECT`
//! into the memory's mapping, NVMe commands through io_uring passthrough,
//! the bounce pipeline through host memory (which also moves the unaligned
//! edges of the other paths), and the queues this process drives.

pub mod bounce;
pub mod nvme_cmd;
pub mod p2p;
pub mod queues;
