//! What the machine is made of, read once for everyone: the storage behind
//! a path (block devices, NVMe namespaces, controllers, multipath,
//! partitions), PCI functions (config space, ACS, IOMMU groups), mounts,
//! the P2P memory providers, the accelerators the p2pdma module bound, and
//! the GPUs the CUDA driver sees.
//!
//! Every sysfs, `/dev` and procfs lookup goes through a [`Topology`], whose
//! roots are parameters, so the parsers run against a fake tree in tests.
//! The transfer engine, the queues path's claim, the doctor and the tools
//! all read the machine here.

pub mod accelerators;
pub mod controllers;
pub mod devnum;
pub mod error;
#[cfg(test)]
pub(crate) mod fake;
pub mod gpus;
pub mod mounts;
mod parse;
pub mod pci;
pub mod storage;
mod sysfs;
pub mod topology;

pub use accelerators::{Accelerator, Module, DEVICE_NODE};
pub use controllers::{controller_users, nvme_by_serial};
pub use devnum::DevNum;
pub use error::TopologyError;
pub use gpus::{CudaDevice, CudaFacts};
pub use mounts::{parse_mountinfo_line, MountInfo};
pub use pci::{
    acs_bits, acs_control, acs_path, common_upstream, find_ext_capability, ConfigSpaceError,
    P2pmemProvider, PciAddress, PciFunction,
};
pub use storage::{
    paths_down, DiskFacts, MdArray, MdMember, NvmeCmdRefusal, NvmePath, Partition, StorageTarget,
    TargetKind, Transport,
};
pub use topology::{list_nvme_namespaces, list_p2pmem_providers, parse_sysfs_pci, Topology};
