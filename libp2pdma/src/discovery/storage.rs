//! The storage behind a path: disks, partitions, NVMe namespaces, their
//! controllers and multipath paths, and what a disk's queue takes.

use std::{fmt, path::PathBuf};

use serde_json::json;

use super::{devnum::DevNum, pci::PciAddress};

/// What kind of path a [`StorageTarget`] was resolved from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// A regular file or a directory, on the filesystem of block device
    /// `fs_device` (a partition or a whole disk).
    File {
        /// The filesystem's block device (e.g. `nvme0n1p2`).
        fs_device: String,
        /// Its device number.
        fs_dev: DevNum,
    },
    /// A block device node (a whole disk or a partition).
    BlockDevice,
    /// An NVMe generic character device (`/dev/ngXnY`).
    NvmeGeneric,
}

impl TargetKind {
    /// A short name: `file`, `block`, `nvme-generic`.
    pub fn name(&self) -> &'static str {
        match self {
            TargetKind::File { .. } => "file",
            TargetKind::BlockDevice => "block",
            TargetKind::NvmeGeneric => "nvme-generic",
        }
    }
}

/// A partition of a disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Its block device name (e.g. `nvme0n1p2`).
    pub name: String,
    /// Its number on the disk.
    pub number: u32,
    /// Where it starts on the disk, in bytes.
    pub start: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// The storage behind a path: the whole disk, and, for NVMe, the namespace,
/// its controller and that controller's PCI function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageTarget {
    /// The path it was resolved from.
    pub path: PathBuf,
    /// What kind of path that is.
    pub kind: TargetKind,
    /// The whole disk's block device name (e.g. `nvme0n1`).
    pub disk: String,
    /// The whole disk's device node (e.g. `/dev/nvme0n1`).
    pub disk_path: PathBuf,
    /// The partition that holds the path (the device itself, or the file's
    /// filesystem) when that is a partition rather than the whole disk.
    pub partition: Option<Partition>,
    /// The NVMe generic character device of the namespace, if there is one.
    pub generic_path: Option<PathBuf>,
    /// The NVMe namespace ID.
    pub nsid: Option<u32>,
    /// The disk's logical block size in bytes.
    pub logical_block_size: u32,
    /// The largest transfer the device takes in one command, in bytes.
    pub max_transfer_bytes: u64,
    /// The NVMe controller (e.g. `nvme0`).
    pub controller: Option<String>,
    /// The PCI function of the controller (or, for other disks, the first
    /// PCI function above the disk).
    pub pci: Option<PciAddress>,
    /// How the controller reaches its subsystem (PCIe, or a fabric and
    /// where), when sysfs says.
    pub transport: Option<Transport>,
    /// Whether the disk is an NVMe namespace.
    pub is_nvme: bool,
    /// The block devices this one is built on (device-mapper, md), if any.
    pub slaves: Vec<String>,
    /// For a native-multipath namespace head (a namespace shared by the
    /// controllers of one NVMe subsystem): its paths, in natural order. I/O
    /// to the head may take any of them. Empty for other disks.
    pub multipath: Vec<NvmePath>,
    /// For an md (software RAID) array: its level, chunk and members.
    pub md: Option<MdArray>,
    /// Metadata bytes per logical block the namespace is formatted with
    /// (sysfs `metadata_bytes`; 0 when none or not said).
    pub metadata_bytes: u32,
    /// The block layer's integrity format (`integrity/format`), when there
    /// is one other than `none`.
    pub integrity: Option<String>,
    /// The whole disk's identity and request queue.
    pub disk_facts: DiskFacts,
}

/// A disk's identity and what its request queue takes: what the transfer
/// engine chooses its I/O sizes from, and recognises the disk by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskFacts {
    /// The whole disk's device number (sysfs `dev`).
    pub dev: Option<DevNum>,
    /// Its model: the device's, or for an NVMe namespace its controller's.
    pub model: Option<String>,
    /// Its serial number (the device's or controller's `serial`), or else
    /// its `wwid`.
    pub serial: Option<String>,
    /// The largest request the block layer sends without splitting it
    /// (`queue/max_sectors_kb`), in bytes.
    pub max_request_bytes: Option<u64>,
    /// Requests the queue holds (`queue/nr_requests`).
    pub queue_requests: Option<u32>,
    /// Whether the disk says it is rotational (`queue/rotational`; virtual
    /// disks often say so whatever backs them).
    pub rotational: Option<bool>,
}

/// An md array (`/sys/block/mdN/md`): what the kernel says of its layout
/// and of each member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MdArray {
    /// Its RAID level as md names it (`raid0`, `raid1`, `raid10`,
    /// `linear`, ...); empty while the array is not assembled.
    pub level: String,
    /// The chunk size in bytes, for levels that stripe (`md/chunk_size`; 0
    /// for a mirror).
    pub chunk_bytes: u64,
    /// How many members the layout has (`md/raid_disks`).
    pub raid_disks: Option<u32>,
    /// The level's layout number (`md/layout`): for raid10, near copies in
    /// bits 0-7, far copies in bits 8-15, bit 16 for the offset layout.
    pub layout: Option<u32>,
    /// How many of those are missing (`md/degraded`), for levels with
    /// redundancy.
    pub degraded: Option<u32>,
    /// The array's state (`md/array_state`: `clean`, `active`,
    /// `read-auto`, `inactive`, ...).
    pub state: Option<String>,
    /// Its members (`md/dev-*`), by slot, spares last.
    pub members: Vec<MdMember>,
}

/// A member of an md array: its block device as the array sees it, and
/// that device's own storage facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MdMember {
    /// The member's block device name (a disk or a partition, e.g.
    /// `nvme1n1`).
    pub name: String,
    /// Its place in the layout (`slot`); `None` for a spare, a journal or
    /// a member not in the layout yet.
    pub slot: Option<u32>,
    /// Its state flags (`state`: `in_sync`, `faulty`, `spare`,
    /// `write_mostly`, ...).
    pub state: Vec<String>,
    /// Where the array's data starts on it, in bytes (`offset`).
    pub data_offset: Option<u64>,
    /// The member device itself, resolved as any block device is; `None`
    /// when it could not be (its link gone, a device being removed).
    pub target: Option<Box<StorageTarget>>,
}

impl MdMember {
    /// Whether the array does I/O to it: in the layout, and not failed.
    pub fn active(&self) -> bool {
        self.slot.is_some() && !self.state.iter().any(|s| s == "faulty")
    }
}

/// One path of a native-multipath NVMe namespace: the hidden
/// per-controller device (`nvmeXcYnZ`, in `multipath/` of the head) and the
/// controller and PCI function it goes through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmePath {
    /// The path's device name (e.g. `nvme0c1n1`).
    pub name: String,
    /// The NVMe controller (e.g. `nvme1`).
    pub controller: Option<String>,
    /// The controller's PCI function.
    pub pci: Option<PciAddress>,
    /// How the controller reaches the subsystem, when sysfs says.
    pub transport: Option<Box<Transport>>,
}

impl fmt::Display for NvmePath {
    /// `nvme0c1n1 (nvme1 at 0000:04:00.0)`, or over a fabric `nvme4c4n1
    /// (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        let fabric = self.transport.as_ref().filter(|t| t.is_fabric());
        match (&self.controller, self.pci, fabric) {
            (Some(c), _, Some(t)) => write!(f, " ({c} {})", t.route()),
            (Some(c), Some(p), None) => write!(f, " ({c} at {p})"),
            (Some(c), None, None) => write!(f, " ({c}, no PCI function)"),
            (None, Some(p), _) => write!(f, " (at {p})"),
            (None, None, _) => write!(f, " (no controller found)"),
        }
    }
}

/// How an NVMe controller reaches its subsystem: the transport and, over
/// a fabric, the target's address and the subsystem's NQN (the
/// controller's sysfs `transport`, `address`, `subsysnqn` and `state`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transport {
    /// `pcie`, `tcp`, `rdma`, `fc` or `loop`, as the kernel names it.
    pub kind: String,
    /// Over a fabric, where the target is, as the kernel prints it
    /// (`traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15`).
    pub address: Option<String>,
    /// The NVMe subsystem's NQN.
    pub subsysnqn: Option<String>,
    /// The controller's state (`live`, `connecting`, `resetting`,
    /// `deleting`, `dead`).
    pub state: Option<String>,
}

impl Transport {
    /// Whether the controller is reached over a fabric (not PCIe).
    pub fn is_fabric(&self) -> bool {
        self.kind != "pcie"
    }

    /// Whether the controller is reached over a network (TCP, RDMA, FC):
    /// a fabric, and not the loop target inside this machine's kernel.
    pub fn is_network(&self) -> bool {
        self.is_fabric() && self.kind != "loop"
    }

    /// The transport's name: `NVMe/TCP`, `NVMe/RDMA`, `PCIe`, ...
    pub fn name(&self) -> String {
        match self.kind.as_str() {
            "pcie" => "PCIe".to_string(),
            "tcp" => "NVMe/TCP".to_string(),
            "rdma" => "NVMe/RDMA".to_string(),
            "fc" => "NVMe/FC".to_string(),
            "loop" => "the NVMe loop target".to_string(),
            k => format!("NVMe over {k}"),
        }
    }

    /// `over NVMe/TCP to traddr=...,trsvcid=...`: how and where.
    pub fn route(&self) -> String {
        match &self.address {
            Some(a) if !a.is_empty() => format!("over {} to {a}", self.name()),
            _ => format!("over {}", self.name()),
        }
    }

    /// Why the kernel's driver for this transport moves no data by P2P
    /// into accelerator memory; `None` over PCIe, where the kernel is
    /// asked about the two PCI functions.
    pub fn p2p_refusal(&self) -> Option<String> {
        let why = match self.kind.as_str() {
            "pcie" => return None,
            "tcp" => "NVMe/TCP carries the data through the network stack, which copies it between socket buffers and the request's pages, so no device DMAs to or from accelerator memory (the kernel's nvme-tcp takes no P2P pages); nvme-rdma does, since Linux 7.1, where the RDMA NIC reaches the accelerator".to_string(),
            "rdma" => "nvme-rdma takes P2P pages (Linux 7.1 and later) only where the RDMA device DMAs for itself and reaches the accelerator, never over soft RDMA (rxe, siw, which copy with the CPU), and sysfs does not say which RDMA device a controller uses".to_string(),
            "loop" => "the NVMe loop target passes the data to the target's own block device in host memory; it takes no P2P pages".to_string(),
            k => format!("the kernel's NVMe over {k} takes no P2P pages"),
        };
        Some(why)
    }

    /// The transport as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "kind": self.kind,
            "address": self.address,
            "subsysnqn": self.subsysnqn,
            "state": self.state,
        })
    }
}

/// Why NVMe commands built by this library cannot address a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvmeCmdRefusal {
    /// The namespace is formatted with metadata (protection information or
    /// other) per block: its commands need a metadata buffer, which the
    /// library's commands do not carry.
    Metadata {
        /// The namespace's block device name.
        disk: String,
        /// Metadata bytes per block (0 when only the integrity format says).
        bytes: u32,
        /// The block layer's integrity format, if any.
        integrity: Option<String>,
    },
}

impl fmt::Display for NvmeCmdRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvmeCmdRefusal::Metadata {
                disk,
                bytes,
                integrity,
            } => {
                match bytes {
                    0 => write!(f, "{disk} carries block-layer integrity metadata")?,
                    n => write!(
                        f,
                        "{disk} is formatted with {n} bytes of metadata per block"
                    )?,
                }
                if let Some(i) = integrity {
                    write!(f, " (integrity format {i})")?;
                }
                write!(
                    f,
                    ": the library's NVMe commands carry no metadata buffer (P2P and bounce I/O go through the block layer, which handles the metadata)"
                )
            }
        }
    }
}

/// Why I/O to the storage fails now, as far as its NVMe paths tell:
/// `Some` when none of them has a live controller (a multipath head's
/// every path, or a fabrics namespace's one controller), naming each
/// with its state as `state` reads it; `None` otherwise.
pub fn paths_down(paths: &[NvmePath], state: impl Fn(&str) -> Option<String>) -> Option<String> {
    let states: Vec<(&NvmePath, String)> = paths
        .iter()
        .map(|p| {
            let s = p.controller.as_deref().and_then(&state);
            (p, s.unwrap_or_else(|| "gone".into()))
        })
        .collect();
    if states.is_empty() || states.iter().any(|(_, s)| s == "live") {
        return None;
    }
    let each: Vec<String> = states.iter().map(|(p, s)| format!("{p} is {s}")).collect();
    Some(match each.as_slice() {
        [one] => format!("its controller is not live: {one}"),
        _ => format!(
            "no path of the multipath namespace is live: {}",
            each.join(", ")
        ),
    })
}

impl StorageTarget {
    /// The byte offset of the partition on the disk (0 for a whole disk).
    pub fn partition_offset(&self) -> u64 {
        self.partition.as_ref().map_or(0, |p| p.start)
    }

    /// Whether the disk is a native-multipath namespace head.
    pub fn is_multipath(&self) -> bool {
        !self.multipath.is_empty()
    }

    /// The NVMe paths I/O to the storage may take: every path of a
    /// multipath namespace head; the one controller of another namespace;
    /// for an md array, the paths of each member it does I/O to; none for
    /// other disks.
    pub fn io_paths(&self) -> Vec<NvmePath> {
        if let Some(md) = &self.md {
            return md
                .members
                .iter()
                .filter(|m| m.active())
                .filter_map(|m| m.target.as_ref())
                .flat_map(|t| t.io_paths())
                .collect();
        }
        if self.is_multipath() {
            return self.multipath.clone();
        }
        if !self.is_nvme {
            return Vec::new();
        }
        vec![NvmePath {
            name: self.disk.clone(),
            controller: self.controller.clone(),
            pci: self.pci,
            transport: self.transport.clone().map(Box::new),
        }]
    }

    /// For a namespace of one controller reached over a fabric (not a
    /// multipath head, not an array): that controller, as its one path.
    pub fn fabric_path(&self) -> Option<NvmePath> {
        if self.md.is_some() || self.is_multipath() {
            return None;
        }
        self.io_paths()
            .into_iter()
            .find(|p| p.transport.as_deref().is_some_and(Transport::is_fabric))
    }

    /// Why NVMe commands built by this library cannot address the
    /// namespace, if they cannot.
    pub fn nvme_cmd_refusal(&self) -> Option<NvmeCmdRefusal> {
        (self.is_nvme && (self.metadata_bytes > 0 || self.integrity.is_some())).then(|| {
            NvmeCmdRefusal::Metadata {
                disk: self.disk.clone(),
                bytes: self.metadata_bytes,
                integrity: self.integrity.clone(),
            }
        })
    }

    /// The target as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let fs_device = match &self.kind {
            TargetKind::File { fs_device, fs_dev } => {
                json!({ "name": fs_device, "dev": fs_dev.to_string() })
            }
            _ => serde_json::Value::Null,
        };
        json!({
            "given": self.path.display().to_string(),
            "kind": self.kind.name(),
            "fs_device": fs_device,
            "disk": self.disk,
            "disk_path": self.disk_path.display().to_string(),
            "partition": self.partition.as_ref().map(|p| json!({
                "name": p.name,
                "number": p.number,
                "start": p.start,
                "size": p.size,
            })),
            "generic_path": self.generic_path.as_ref().map(|p| p.display().to_string()),
            "nsid": self.nsid,
            "logical_block_size": self.logical_block_size,
            "max_transfer_bytes": self.max_transfer_bytes,
            "controller": self.controller,
            "pci": self.pci.map(|p| p.to_string()),
            "transport": self.transport.as_ref().map(Transport::to_json),
            "is_nvme": self.is_nvme,
            "slaves": self.slaves,
            "multipath": self.multipath.iter().map(|p| json!({
                "name": p.name,
                "controller": p.controller,
                "pci": p.pci.map(|a| a.to_string()),
                "transport": p.transport.as_deref().map(Transport::to_json),
            })).collect::<Vec<_>>(),
            "md": self.md.as_ref().map(|md| json!({
                "level": md.level,
                "chunk_bytes": md.chunk_bytes,
                "raid_disks": md.raid_disks,
                "layout": md.layout,
                "degraded": md.degraded,
                "state": md.state,
                "members": md.members.iter().map(|m| json!({
                    "name": m.name,
                    "slot": m.slot,
                    "state": m.state,
                    "data_offset": m.data_offset,
                    "controller": m.target.as_ref().and_then(|t| t.controller.clone()),
                    "pci": m.target.as_ref().and_then(|t| t.pci).map(|a| a.to_string()),
                    "is_nvme": m.target.as_ref().is_some_and(|t| t.is_nvme),
                })).collect::<Vec<_>>(),
            })),
            "metadata_bytes": self.metadata_bytes,
            "integrity": self.integrity,
            "nvme_cmd_refusal": self.nvme_cmd_refusal().map(|r| r.to_string()),
        })
    }
}
