//! What the path rule decides on: the memory, the storage, the kernel's
//! answers and the caller's preference, gathered by the engine (or the
//! doctor) and handed to [`decide`](super::decide) as plain values.

use std::path::PathBuf;

use super::path::{P2pSubmit, PathPref};
use crate::{
    discovery::NvmePath,
    memory::{peer::P2pQuery, DeviceMemory, MemoryKind},
    PciAddress,
};

/// The memory, as the rule sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryFacts {
    /// What it is.
    pub kind: MemoryKind,
    /// It has a CPU mapping storage can DMA into (`O_DIRECT` on it).
    pub cpu_mapping: bool,
    /// It is an allocation of the module's, which the module can map for a
    /// peer (`DMA_MAP`).
    pub module_allocation: bool,
    /// The module that allocated it does block I/O on its pages
    /// (`BLOCK_IO`).
    pub block_io: bool,
    /// Its driver exports it as a dma-buf a peer can import.
    pub dmabuf: bool,
}

impl MemoryFacts {
    /// What `mem` answers.
    pub fn of(mem: &dyn DeviceMemory) -> Self {
        let dma = mem.dma();
        let allocation = dma.and_then(|d| d.module_allocation());
        Self {
            kind: mem.kind(),
            cpu_mapping: dma.and_then(|d| d.dma_target()).is_some(),
            module_allocation: allocation.is_some(),
            block_io: allocation.is_some_and(|(m, _)| m.has_block_io()),
            dmabuf: dma.and_then(|d| d.dmabuf()).is_some(),
        }
    }
}

/// An NVMe namespace the library's own commands can address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceFacts {
    /// Its generic character device, e.g. `/dev/ng0n1`.
    pub generic: PathBuf,
    /// Its namespace id.
    pub nsid: u32,
}

/// A namespace of a controller this process drives, or a volume striped
/// over several (the queues path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrivenFacts {
    /// The namespace's name, e.g. `0000:03:00.0 n1`, or the volume's.
    pub name: String,
    /// How the controllers' DMA is translated, in words.
    pub iommu: String,
    /// The namespace, or the volume's members in stripe order.
    pub members: Vec<DrivenMember>,
}

/// A namespace this process drives, as the path rule needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrivenMember {
    /// The namespace's name.
    pub name: String,
    /// Its controller.
    pub controller: PciAddress,
    /// For memory allocated from the module: the module's answer whether
    /// the controller reaches it by P2P, or why it could not answer.
    pub reach: Option<Result<P2pQuery, String>>,
}

/// The storage, as the rule sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageFacts {
    /// The path it was opened by.
    pub path: PathBuf,
    /// A namespace this process drives: only the queues path reaches it.
    pub driven: Option<DrivenFacts>,
    /// A regular file (rather than a block device).
    pub is_file: bool,
    /// On an NVMe namespace (the namespace, a partition or a file on one).
    pub nvme: bool,
    /// The namespace the library's own commands would address.
    pub namespace: Option<NamespaceFacts>,
    /// Why the library's own commands cannot address it, if they cannot.
    pub nvme_cmd_refusal: Option<String>,
    /// Byte offset of the partition on its disk.
    pub dev_start: u64,
    /// For a file on an NVMe namespace: its filesystem, whose extents
    /// `FIEMAP` maps for the library's own commands, or why it cannot.
    pub filesystem: Option<Result<String, String>>,
    /// For a file on no NVMe namespace: why its filesystem would not do
    /// for the library's own commands either, if it would not.
    pub other_filesystem: Option<String>,
    /// For an md array (or a partition or file on one): which, and its
    /// level. [`Facts::paths`] then holds its members' paths.
    pub array: Option<ArrayFacts>,
    /// A namespace of one controller reached over a fabric (NVMe/TCP,
    /// RDMA, ...): that controller, as its one path, with its transport.
    pub fabric: Option<NvmePath>,
}

/// An md array the storage is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayFacts {
    /// Its block device name (e.g. `md0`).
    pub name: String,
    /// Its RAID level as md names it (`raid0`, `raid1`, `raid10`, ...).
    pub level: String,
}

impl ArrayFacts {
    /// Whether the kernel lets the array take P2P pages when every member
    /// does: Linux 7.2 and later advertise `BLK_FEAT_PCI_P2PDMA` for RAID0,
    /// RAID1 and RAID10 arrays only.
    pub fn level_takes_p2p(&self) -> bool {
        matches!(self.level.as_str(), "raid0" | "raid1" | "raid10")
    }
}

/// Everything [`decide`](super::decide) decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The caller's preference.
    pub pref: PathPref,
    /// How the caller wants P2P I/O submitted.
    pub submit: P2pSubmit,
    /// The p2pdma module's device node opened and speaks our ABI.
    pub module: bool,
    /// The memory's accelerator is bound to the module.
    pub accelerator: bool,
    /// The memory.
    pub memory: MemoryFacts,
    /// The storage.
    pub storage: StorageFacts,
    /// The kernel's answer to the P2P query between the accelerator and
    /// the storage's controller, if it was asked and answered.
    pub p2p: Option<P2pQuery>,
    /// For a native-multipath namespace head: each of its paths with the
    /// kernel's answer for that path's controller (`None`: not asked or no
    /// answer). I/O may take any path, so P2P needs every one of them;
    /// [`Facts::p2p`] is then not used. Empty for other storage.
    pub paths: Vec<(NvmePath, Option<P2pQuery>)>,
}
