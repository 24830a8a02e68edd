//! Accelerator-direct NVMe: a controller that this process drives itself,
//! with its queues in accelerator memory.
//!
//! [`Controller::initialize`] takes an NVMe controller that no kernel driver
//! or filesystem uses (see [`claim`]) through VFIO, resets it and creates
//! its admin queue and I/O queue pairs in accelerator memory allocated from
//! the p2pdma module and DMA-mapped for the controller (`DMA_MAP`); the
//! doorbells are the controller's BAR0, mapped into this process. From
//! there no I/O enters the kernel: submitters write commands into the
//! submission queues, ring the doorbells and poll the completion queues
//! themselves, many threads at once (see the `qpair` module for the algorithm, the
//! one accelerator threads run). Data moves between the namespace and any
//! memory the controller can reach: accelerator memory (`DMA_MAP`) or host
//! memory pinned for it (`PIN_USER`), see [`Controller::map`].
//!
//! **No DMA outside what the caller owns.** Commands are submitted inside
//! a [`Controller::scope`], which does not return before every command
//! submitted in it has completed (whether or not its [`Pending`] was
//! waited for, dropped or forgotten), so memory borrowed for the scope
//! outlives every transfer into it. A command's data is a [`Payload`]: a
//! range of a [`Mapped`] memory, whose mapping the scope's borrow keeps
//! alive. The library builds every PRP entry and PRP list from it, and
//! refuses a command whose blocks are not exactly the payload's bytes, that
//! is larger than the controller's largest transfer (MDTS), for a namespace
//! that is not active or carries metadata, past the namespace's end, or
//! whose direction the mapping does not allow. Raw bus addresses are taken
//! only by `unsafe` functions ([`Controller::admin_raw`]).
//!
//! A command that completes with an error status is that command's error.
//! One that does not complete in time is aborted; if the abort does not end
//! it, the controller is stopped (disabled; where that fails, bus mastering
//! off and a reset) and every request gets an error. Memory a failed
//! controller may still write is never released while it runs: a
//! controller that no way stops keeps its queue memory for good, and a
//! scope that would hand memory back to its owner ends the process
//! instead (then vfio-pci resets the device before the module frees it).
//! A process that dies leaves the controller to vfio-pci, which resets it;
//! the next `initialize` resets it again before use.
//!
//! Only VFIO's no-IOMMU mode is supported: behind an IOMMU, VFIO cannot map
//! the module's memory for the controller ([`IommuMode::describe`] says
//! why).

pub mod claim;
mod command;
mod controller;
mod facts;
mod layout;
mod mapped;
mod namespace;
mod qpair;
pub mod registers;
mod revoke;
mod scope;
#[cfg(test)]
mod tests;

pub use crate::nvme::{Command, Completion, IdCtrl, IdNs};
pub use claim::IommuMode;
pub use command::{AdminCommand, IoCommand};
pub use controller::{Controller, InitOptions, NamespaceInfo};
pub use mapped::{Mapped, Payload};
pub(crate) use namespace::{run_together, Plan};
pub use namespace::{Issued, Namespace};
pub use scope::{Batch, CommandId, Pending, Scope};
