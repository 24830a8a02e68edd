//! The doctor: whether data between a storage path and an accelerator can
//! move by P2P DMA on this machine, and if not, why, in the manner of
//! `gdscheck -p`.
//!
//! [`Doctor::run`] makes a [`Report`]: one [`Check`] per fact (kernel
//! config, module, device node, accelerator, its P2P memory, the storage,
//! the kernel's P2P answer, IOMMU, ACS, NVMe passthrough) and the data path
//! the library would take, decided by the transfer engine's path rule
//! ([`crate::transfer::plan`]).

mod checks;
pub mod kconfig;
pub mod report;
mod run;
#[cfg(test)]
mod tests;

pub use kconfig::{KernelConfig, BOOT_ROOT};
pub use report::{Check, Report, Status};
pub use run::{AccelSelect, Doctor};
