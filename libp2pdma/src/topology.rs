//! Storage topology, read from sysfs: which block device, NVMe namespace,
//! controller and PCI function hold a file or a device node; the NVMe
//! namespaces of the machine; the PCI devices that provide P2P memory; and
//! the PCI facts the doctor needs (upstream bridges, IOMMU groups, config
//! space).
//!
//! Every lookup goes through a [`Topology`], whose sysfs, `/dev` and procfs
//! roots are parameters, so the parsers can be run against a fake tree.

use std::{
    cmp::Ordering,
    collections::BTreeSet,
    fmt, fs, io,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
};

use rustix::fs::{major, minor};
use serde_json::json;

use crate::device::PciAddress;

/// Default sysfs root.
pub const SYSFS_ROOT: &str = "/sys";
/// Default root of the device nodes.
pub const DEV_ROOT: &str = "/dev";
/// Default procfs root.
pub const PROC_ROOT: &str = "/proc";

/// Sectors in sysfs (`start`, `size`) are always 512 bytes.
const SECTOR: u64 = 512;
/// Largest sysfs attribute read; real ones are a few bytes.
const MAX_ATTR: u64 = 64 * 1024;

/// What can go wrong while reading the topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The path cannot be looked at.
    #[error("cannot stat {path}: {source}")]
    Stat {
        /// The path given.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The path is of a kind that holds no storage this library can use.
    #[error("{path} is {what}")]
    Unsupported {
        /// The path given.
        path: PathBuf,
        /// What it is, in words.
        what: String,
    },
    /// The filesystem holding a file has no block device behind it.
    #[error("{path} is on {fs} (device {dev}), which has no block device behind it; give a file on a disk-backed filesystem or the device node itself")]
    NoBlockDevice {
        /// The path given.
        path: PathBuf,
        /// The filesystem's device number.
        dev: DevNum,
        /// The filesystem, in words (its type and source when known).
        fs: String,
    },
    /// A sysfs (or procfs) file or directory cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A sysfs file holds something other than what it should.
    #[error("{path}: {value:?} is not {expected}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it holds.
        value: String,
        /// What it should hold, in words.
        expected: &'static str,
    },
}

/// Result with [`TopologyError`].
pub type Result<T, E = TopologyError> = std::result::Result<T, E>;

/// A device number, printed `major:minor` as sysfs names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl DevNum {
    /// Splits a raw `dev_t` (`st_dev`, `st_rdev`).
    pub fn from_raw(dev: u64) -> Self {
        Self {
            major: major(dev),
            minor: minor(dev),
        }
    }

    /// Parses `major:minor` (sysfs `dev` files, `/proc/self/mountinfo`).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, b) = s.trim().split_once(':')?;
        Some(Self {
            major: parse_dec(a)?,
            minor: parse_dec(b)?,
        })
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

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
    /// Whether the disk is an NVMe namespace.
    pub is_nvme: bool,
    /// The block devices this one is built on (device-mapper, md), if any.
    pub slaves: Vec<String>,
    /// For a native-multipath namespace head (a namespace shared by the
    /// controllers of one NVMe subsystem): its paths, in natural order. I/O
    /// to the head may take any of them. Empty for other disks.
    pub multipath: Vec<NvmePath>,
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

impl DiskFacts {
    /// The facts of the disk whose sysfs directory is `dir`; what is
    /// missing or unreadable stays `None`.
    fn read(dir: &Path) -> Self {
        let text = |rel: &str| {
            read_small(&dir.join(rel))
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        let num = |rel: &str| text(rel).and_then(|s| parse_dec::<u64>(&s));
        Self {
            dev: text("dev").and_then(|s| DevNum::parse(&s)),
            model: text("device/model").or_else(|| text("model")),
            serial: ["device/serial", "serial", "wwid", "device/wwid"]
                .into_iter()
                .find_map(text),
            max_request_bytes: num("queue/max_sectors_kb").map(|kb| kb.saturating_mul(1024)),
            queue_requests: num("queue/nr_requests").and_then(|n| u32::try_from(n).ok()),
            rotational: num("queue/rotational").map(|r| r != 0),
        }
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
}

impl fmt::Display for NvmePath {
    /// `nvme0c1n1 (nvme1 at 0000:04:00.0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        match (&self.controller, self.pci) {
            (Some(c), Some(p)) => write!(f, " ({c} at {p})"),
            (Some(c), None) => write!(f, " ({c}, no PCI function)"),
            (None, Some(p)) => write!(f, " (at {p})"),
            (None, None) => write!(f, " (no controller found)"),
        }
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

impl StorageTarget {
    /// Resolves `path` (a file or directory, a block device node, or an NVMe
    /// generic character device) against the running system.
    pub fn resolve(path: impl AsRef<Path>) -> Result<Self> {
        Topology::new().resolve(path)
    }

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
    /// none for other disks.
    pub fn io_paths(&self) -> Vec<NvmePath> {
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
        }]
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
            "is_nvme": self.is_nvme,
            "slaves": self.slaves,
            "multipath": self.multipath.iter().map(|p| json!({
                "name": p.name,
                "controller": p.controller,
                "pci": p.pci.map(|a| a.to_string()),
            })).collect::<Vec<_>>(),
            "metadata_bytes": self.metadata_bytes,
            "integrity": self.integrity,
            "nvme_cmd_refusal": self.nvme_cmd_refusal().map(|r| r.to_string()),
        })
    }
}

/// A PCI device whose memory the kernel's P2PDMA core manages (it has
/// `p2pmem/` in sysfs): an NVMe controller's CMB, or an accelerator bound to
/// the p2pdma module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pmemProvider {
    /// Its PCI function.
    pub pci: PciAddress,
    /// Bytes registered as P2P memory.
    pub size: u64,
    /// Bytes still free.
    pub available: u64,
    /// Whether it offers the memory to other drivers.
    pub published: bool,
    /// The driver bound to it, if any.
    pub driver: Option<String>,
}

impl P2pmemProvider {
    /// The provider as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "pci": self.pci.to_string(),
            "size": self.size,
            "available": self.available,
            "published": self.published,
            "driver": self.driver,
        })
    }
}

/// A PCI function as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Its address.
    pub address: PciAddress,
    /// The PCI functions above it, nearest first (its upstream bridge, that
    /// bridge's upstream bridge, ..., the root port).
    pub upstream: Vec<PciAddress>,
    /// The host bridge it sits below, as sysfs names it (`pci0000:00`).
    pub host_bridge: Option<String>,
    /// PCI vendor ID.
    pub vendor: Option<u16>,
    /// PCI device ID.
    pub device: Option<u16>,
    /// PCI class code (`0x060400` for a PCI bridge).
    pub class: Option<u32>,
    /// The driver bound to it.
    pub driver: Option<String>,
    /// Its IOMMU group.
    pub iommu_group: Option<u32>,
}

impl PciFunction {
    /// Whether it is a PCI-to-PCI bridge (a root port or a switch port).
    pub fn is_bridge(&self) -> bool {
        self.class.is_some_and(|c| c >> 8 == 0x0604)
    }

    /// The function itself, then everything above it.
    pub fn chain(&self) -> impl Iterator<Item = PciAddress> + '_ {
        std::iter::once(self.address).chain(self.upstream.iter().copied())
    }
}

/// The nearest PCI function that is `a` or above it and also `b` or above
/// it: where the two devices' traffic can turn around without reaching a
/// host bridge. `None` when they meet only at a host bridge.
pub fn common_upstream(a: &PciFunction, b: &PciFunction) -> Option<PciAddress> {
    a.chain().find(|x| b.chain().any(|y| y == *x))
}

/// The PCI functions whose ACS settings decide whether P2P between
/// `provider` and `client` is redirected, in the order the kernel's P2PDMA
/// core checks them: the provider and everything above it up to the common
/// upstream bridge (all of them when there is none), then the client and
/// everything above it below that bridge.
pub fn acs_path(provider: &PciFunction, client: &PciFunction) -> Vec<PciAddress> {
    let common = common_upstream(provider, client);
    let mut path = Vec::new();
    for a in provider.chain() {
        path.push(a);
        if Some(a) == common {
            break;
        }
    }
    if common.is_some() {
        path.extend(client.chain().take_while(|b| Some(*b) != common));
    }
    path
}

/// The ACS extended capability's ID.
pub const PCI_EXT_CAP_ID_ACS: u16 = 0x000d;
/// Offset of the ACS control register in the capability.
pub const PCI_ACS_CTRL: usize = 6;
/// ACS Source Validation.
pub const PCI_ACS_SV: u16 = 0x01;
/// ACS Translation Blocking.
pub const PCI_ACS_TB: u16 = 0x02;
/// ACS P2P Request Redirect.
pub const PCI_ACS_RR: u16 = 0x04;
/// ACS P2P Completion Redirect.
pub const PCI_ACS_CR: u16 = 0x08;
/// ACS Upstream Forwarding.
pub const PCI_ACS_UF: u16 = 0x10;
/// ACS P2P Egress Control.
pub const PCI_ACS_EC: u16 = 0x20;
/// ACS Direct Translated P2P.
pub const PCI_ACS_DT: u16 = 0x40;
/// The control bits the kernel's P2PDMA core treats as redirecting P2P to
/// the root complex (`pci_bridge_has_acs_redir`).
pub const PCI_ACS_REDIRECT: u16 = PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC;

/// Where the extended capabilities start in config space.
const EXT_CAP_START: usize = 0x100;
/// Size of the extended config space.
const EXT_CONFIG_END: usize = 0x1000;

/// Why an extended capability could not be looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigSpaceError {
    /// Fewer bytes than the 256-byte header space were readable (sysfs
    /// gives unprivileged readers only the first 64 bytes).
    Short(usize),
}

/// The offset of extended capability `id` in a function's config space,
/// walking the list from 0x100. `Ok(None)` when the function does not have
/// it, or has no extended config space at all (256 bytes: conventional PCI);
/// an error when less than the 256-byte header space was readable.
pub fn find_ext_capability(config: &[u8], id: u16) -> Result<Option<usize>, ConfigSpaceError> {
    if config.len() < EXT_CAP_START {
        return Err(ConfigSpaceError::Short(config.len()));
    }
    if config.len() < EXT_CAP_START + 4 {
        return Ok(None);
    }
    let mut pos = EXT_CAP_START;
    // Each capability takes at least 4 bytes, which bounds a looping list.
    for _ in 0..(EXT_CONFIG_END - EXT_CAP_START) / 4 {
        let Some(header) = read_u32(config, pos) else {
            return Ok(None);
        };
        if header == 0 || header == u32::MAX {
            return Ok(None);
        }
        if header & 0xffff == u32::from(id) {
            return Ok(Some(pos));
        }
        let next = ((header >> 20) & 0xffc) as usize;
        if next < EXT_CAP_START {
            return Ok(None);
        }
        pos = next;
    }
    Ok(None)
}

/// The ACS control register of a function, `Ok(None)` when it has no ACS
/// capability.
pub fn acs_control(config: &[u8]) -> Result<Option<u16>, ConfigSpaceError> {
    let Some(cap) = find_ext_capability(config, PCI_EXT_CAP_ID_ACS)? else {
        return Ok(None);
    };
    match config.get(cap + PCI_ACS_CTRL..cap + PCI_ACS_CTRL + 2) {
        Some(b) => Ok(Some(u16::from_le_bytes([b[0], b[1]]))),
        None => Err(ConfigSpaceError::Short(config.len())),
    }
}

/// The names of the bits set in an ACS control register (`SV RR CR`).
pub fn acs_bits(ctrl: u16) -> String {
    let names = [
        (PCI_ACS_SV, "SV"),
        (PCI_ACS_TB, "TB"),
        (PCI_ACS_RR, "RR"),
        (PCI_ACS_CR, "CR"),
        (PCI_ACS_UF, "UF"),
        (PCI_ACS_EC, "EC"),
        (PCI_ACS_DT, "DT"),
    ];
    let set: Vec<&str> = names
        .iter()
        .filter(|(bit, _)| ctrl & bit != 0)
        .map(|&(_, n)| n)
        .collect();
    if set.is_empty() {
        "none".to_string()
    } else {
        set.join(" ")
    }
}

fn read_u32(b: &[u8], pos: usize) -> Option<u32> {
    let s = b.get(pos..pos.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// One line of `/proc/self/mountinfo`, the fields the topology needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// The filesystem's device number.
    pub dev: DevNum,
    /// Where it is mounted.
    pub mount_point: String,
    /// Its type.
    pub fstype: String,
    /// Its source (a device node, or a name like `tmpfs`).
    pub source: String,
}

/// Parses one line of `/proc/self/mountinfo`; `None` for a malformed one.
pub fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let _id = l.next()?;
    let _parent = l.next()?;
    let dev = DevNum::parse(l.next()?)?;
    let _root = l.next()?;
    let mount_point = unescape_mount(l.next()?);
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape_mount(r.next()?);
    Some(MountInfo {
        dev,
        mount_point,
        fstype,
        source,
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The places to read the system's topology from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    sys: PathBuf,
    dev: PathBuf,
    proc: PathBuf,
}

impl Default for Topology {
    fn default() -> Self {
        Self::new()
    }
}

impl Topology {
    /// The running system: `/sys`, `/dev` and `/proc`.
    pub fn new() -> Self {
        Self::with_roots(SYSFS_ROOT, DEV_ROOT, PROC_ROOT)
    }

    /// A system whose sysfs, device nodes and procfs are under the given
    /// directories (a fake tree, in tests).
    pub fn with_roots(
        sys: impl Into<PathBuf>,
        dev: impl Into<PathBuf>,
        proc: impl Into<PathBuf>,
    ) -> Self {
        Self {
            sys: sys.into(),
            dev: dev.into(),
            proc: proc.into(),
        }
    }

    /// The sysfs root.
    pub fn sys_root(&self) -> &Path {
        &self.sys
    }

    /// The root of the device nodes.
    pub fn dev_root(&self) -> &Path {
        &self.dev
    }

    /// The procfs root.
    pub fn proc_root(&self) -> &Path {
        &self.proc
    }

    /// Resolves `path`: a regular file or directory (the block device of
    /// its filesystem), a block device node (a whole disk or a partition),
    /// or an NVMe generic character device.
    pub fn resolve(&self, path: impl AsRef<Path>) -> Result<StorageTarget> {
        let path = path.as_ref();
        let md = fs::metadata(path).map_err(|source| TopologyError::Stat {
            path: path.to_path_buf(),
            source,
        })?;
        self.resolve_opened(path, &md)
    }

    /// Resolves `path`, already opened, from its metadata (`fstat` of the
    /// open file: what is resolved is what was opened, whatever happened to
    /// the name since).
    pub fn resolve_opened(&self, path: &Path, md: &fs::Metadata) -> Result<StorageTarget> {
        let ft = md.file_type();
        if ft.is_file() || ft.is_dir() {
            self.resolve_file(path, DevNum::from_raw(md.dev()))
        } else if ft.is_block_device() {
            self.resolve_block(path, DevNum::from_raw(md.rdev()), TargetKind::BlockDevice)
        } else if ft.is_char_device() {
            self.resolve_char(path, DevNum::from_raw(md.rdev()))
        } else {
            let what = if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_socket() {
                "a socket"
            } else {
                "neither a file nor a device"
            };
            Err(TopologyError::Unsupported {
                path: path.to_path_buf(),
                what: what.to_string(),
            })
        }
    }

    /// A file on the filesystem with device number `dev`.
    fn resolve_file(&self, path: &Path, dev: DevNum) -> Result<StorageTarget> {
        let link = self.sys.join("dev/block").join(dev.to_string());
        let dir = match fs::canonicalize(&link) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return self.resolve_file_by_mount(path, dev);
            }
            Err(source) => return Err(TopologyError::Read { path: link, source }),
        };
        let mut t = self.target_from_block_dir(path, &dir)?;
        t.kind = TargetKind::File {
            fs_device: dir_name(&dir),
            fs_dev: dev,
        };
        Ok(t)
    }

    /// A file whose filesystem's device number is not a block device
    /// (btrfs, overlayfs, tmpfs, NFS): its mount's source, when that is a
    /// block device, is the storage.
    fn resolve_file_by_mount(&self, path: &Path, dev: DevNum) -> Result<StorageTarget> {
        let mountinfo = self.proc.join("self/mountinfo");
        let mount = read_small(&mountinfo).ok().and_then(|text| {
            text.lines()
                .filter_map(parse_mountinfo_line)
                .find(|m| m.dev == dev)
        });
        let no_block = |fs: String| TopologyError::NoBlockDevice {
            path: path.to_path_buf(),
            dev,
            fs,
        };
        let Some(m) = mount else {
            return Err(no_block("a filesystem without a block device".to_string()));
        };
        let fs = format!("a {} filesystem from {:?}", m.fstype, m.source);
        if !m.source.starts_with('/') {
            return Err(no_block(fs));
        }
        let source = Path::new(&m.source);
        let Ok(md) = fs::metadata(source) else {
            return Err(no_block(fs));
        };
        if !md.file_type().is_block_device() {
            return Err(no_block(fs));
        }
        let fs_dev = DevNum::from_raw(md.rdev());
        let mut t = self.resolve_block(path, fs_dev, TargetKind::BlockDevice)?;
        let fs_device = t
            .partition
            .as_ref()
            .map_or_else(|| t.disk.clone(), |p| p.name.clone());
        t.kind = TargetKind::File { fs_device, fs_dev };
        Ok(t)
    }

    /// A block device with number `dev`.
    fn resolve_block(&self, path: &Path, dev: DevNum, kind: TargetKind) -> Result<StorageTarget> {
        let link = self.sys.join("dev/block").join(dev.to_string());
        let dir =
            fs::canonicalize(&link).map_err(|source| TopologyError::Read { path: link, source })?;
        let mut t = self.target_from_block_dir(path, &dir)?;
        t.kind = kind;
        Ok(t)
    }

    /// A character device with number `dev`: only NVMe generic devices hold
    /// storage.
    fn resolve_char(&self, path: &Path, dev: DevNum) -> Result<StorageTarget> {
        let unsupported = |what: String| TopologyError::Unsupported {
            path: path.to_path_buf(),
            what,
        };
        let link = self.sys.join("dev/char").join(dev.to_string());
        let dir = match fs::canonicalize(&link) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(unsupported(format!(
                    "a character device ({dev}) unknown to sysfs, not an NVMe generic device"
                )));
            }
            Err(source) => return Err(TopologyError::Read { path: link, source }),
        };
        let name = dir_name(&dir);
        let subsystem = fs::read_link(dir.join("subsystem"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let generic = match subsystem.as_deref() {
            Some("nvme-generic") => true,
            Some(_) => false,
            None => name.starts_with("ng"),
        };
        if !generic {
            if subsystem.as_deref() == Some("nvme") || is_nvme_controller_name(&name) {
                return Err(unsupported(format!(
                    "the character device of NVMe controller {name}, not of a namespace; give a namespace such as /dev/{name}n1 or /dev/ng{}n1",
                    name.trim_start_matches("nvme")
                )));
            }
            return Err(unsupported(format!(
                "a character device ({}), not an NVMe generic device",
                subsystem.as_deref().unwrap_or(&name)
            )));
        }
        let disk = match name.strip_prefix("ng") {
            Some(rest) => format!("nvme{rest}"),
            None => {
                return Err(unsupported(format!(
                    "an NVMe generic device with an unexpected name {name:?}"
                )))
            }
        };
        let block = self.sys.join("block").join(&disk);
        let disk_dir = fs::canonicalize(&block).map_err(|source| TopologyError::Read {
            path: block,
            source,
        })?;
        let mut t = self.target_from_block_dir(path, &disk_dir)?;
        t.kind = TargetKind::NvmeGeneric;
        Ok(t)
    }

    /// Every fact about the block device whose canonical sysfs directory is
    /// `dir` (a whole disk or a partition). The kind is set by the caller.
    fn target_from_block_dir(&self, path: &Path, dir: &Path) -> Result<StorageTarget> {
        let (disk_dir, partition) = if dir.join("partition").exists() {
            let number = read_parsed(&dir.join("partition"), "a partition number")?;
            let start: u64 = read_parsed(&dir.join("start"), "a sector number")?;
            let size: u64 = read_parsed(&dir.join("size"), "a sector count").unwrap_or(0);
            let parent = dir.parent().ok_or_else(|| TopologyError::Parse {
                path: dir.to_path_buf(),
                value: String::new(),
                expected: "a partition directory inside its disk's directory",
            })?;
            let part = Partition {
                name: dev_name(dir),
                number,
                start: start.saturating_mul(SECTOR),
                size: size.saturating_mul(SECTOR),
            };
            (parent.to_path_buf(), Some(part))
        } else {
            (dir.to_path_buf(), None)
        };
        let disk = dev_name(&disk_dir);
        let logical_block_size = read_parsed(
            &disk_dir.join("queue/logical_block_size"),
            "a block size in bytes",
        )?;
        let max_kb: u64 = read_parsed(&disk_dir.join("queue/max_hw_sectors_kb"), "a size in KiB")?;
        let nsid = read_optional(&disk_dir.join("nsid"), "a namespace ID")?;
        let multipath = self.multipath_of(&disk_dir);
        let (controller, pci) = match controller_above(&disk_dir) {
            (None, None) => multipath
                .iter()
                .find(|p| p.controller.is_some())
                .map_or((None, None), |p| (p.controller.clone(), p.pci)),
            found => found,
        };
        let is_nvme = controller.is_some() || is_nvme_namespace_name(&disk);
        let metadata_bytes =
            read_optional(&disk_dir.join("metadata_bytes"), "a byte count")?.unwrap_or(0);
        let integrity = read_small(&disk_dir.join("integrity/format"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|f| !f.is_empty() && f != "none");
        let generic_path = if is_nvme {
            self.generic_device_of(&disk)
        } else {
            None
        };
        let mut slaves: Vec<String> = match fs::read_dir(disk_dir.join("slaves")) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        slaves.sort_by(|a, b| natural_cmp(a, b));
        Ok(StorageTarget {
            path: path.to_path_buf(),
            kind: TargetKind::BlockDevice,
            disk_path: self.dev.join(&disk),
            disk,
            partition,
            generic_path,
            nsid,
            logical_block_size,
            max_transfer_bytes: max_kb.saturating_mul(1024),
            controller,
            pci,
            is_nvme,
            slaves,
            multipath,
            metadata_bytes,
            integrity,
            disk_facts: DiskFacts::read(&disk_dir),
        })
    }

    /// The paths of a native-multipath namespace head (its `multipath/`
    /// entries, each under its controller), in natural order; empty for
    /// other disks. The head itself sits under a virtual NVMe subsystem.
    fn multipath_of(&self, disk_dir: &Path) -> Vec<NvmePath> {
        let Ok(rd) = fs::read_dir(disk_dir.join("multipath")) else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        paths.sort_by(|a, b| natural_cmp(&dir_name(a), &dir_name(b)));
        paths
            .iter()
            .map(|p| {
                let (controller, pci) = fs::canonicalize(p)
                    .map(|real| controller_above(&real))
                    .unwrap_or((None, None));
                NvmePath {
                    name: dir_name(p),
                    controller,
                    pci,
                }
            })
            .collect()
    }

    /// The NVMe generic character device of namespace `disk`, from the
    /// `nvme-generic` class or, without it, by its name in `/dev`.
    fn generic_device_of(&self, disk: &str) -> Option<PathBuf> {
        let name = format!("ng{}", disk.strip_prefix("nvme")?);
        let class = self.sys.join("class/nvme-generic").join(&name);
        if class.exists() {
            return Some(self.dev.join(dev_name_in(&class, &name)));
        }
        let node = self.dev.join(&name);
        node.exists().then_some(node)
    }

    /// Every NVMe namespace in sysfs (`/sys/block/nvme*n*`), in natural
    /// order; the hidden per-path devices of native multipath are left out.
    pub fn list_nvme_namespaces(&self) -> Result<Vec<StorageTarget>> {
        let block = self.sys.join("block");
        let rd = match fs::read_dir(&block) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(TopologyError::Read {
                    path: block,
                    source,
                })
            }
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| is_nvme_namespace_name(n))
            .collect();
        names.sort_by(|a, b| natural_cmp(a, b));
        names
            .iter()
            .map(|name| {
                let link = block.join(name);
                let dir = fs::canonicalize(&link)
                    .map_err(|source| TopologyError::Read { path: link, source })?;
                self.target_from_block_dir(&self.dev.join(name), &dir)
            })
            .collect()
    }

    /// Every PCI device with P2P memory (`/sys/bus/pci/devices/*/p2pmem`),
    /// in address order.
    pub fn list_p2pmem_providers(&self) -> Result<Vec<P2pmemProvider>> {
        let devices = self.sys.join("bus/pci/devices");
        let rd = match fs::read_dir(&devices) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(TopologyError::Read {
                    path: devices,
                    source,
                })
            }
        };
        let mut found = Vec::new();
        for entry in rd.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pci) = parse_sysfs_pci(&name) else {
                continue;
            };
            let dir = entry.path();
            let p2p = dir.join("p2pmem");
            if !p2p.join("size").exists() {
                continue;
            }
            let published: u32 = read_optional(&p2p.join("published"), "0 or 1")?.unwrap_or(0);
            found.push(P2pmemProvider {
                pci,
                size: read_parsed(&p2p.join("size"), "a size in bytes")?,
                available: read_parsed(&p2p.join("available"), "a size in bytes")?,
                published: published != 0,
                driver: link_name(&dir.join("driver")),
            });
        }
        found.sort_by_key(|p| p.pci);
        Ok(found)
    }

    /// The PCI function at `address`, as sysfs shows it.
    pub fn pci_function(&self, address: PciAddress) -> Result<PciFunction> {
        let link = self.sys.join("bus/pci/devices").join(address.to_string());
        let dir =
            fs::canonicalize(&link).map_err(|source| TopologyError::Read { path: link, source })?;
        let mut upstream = Vec::new();
        let mut host_bridge = None;
        for anc in dir.ancestors().skip(1) {
            let name = dir_name(anc);
            if let Some(a) = parse_sysfs_pci(&name) {
                upstream.push(a);
            } else if name.starts_with("pci") && name.contains(':') {
                host_bridge = Some(name);
                break;
            } else {
                break;
            }
        }
        let hex = |file: &str, expected: &'static str| -> Result<Option<u32>> {
            let p = dir.join(file);
            match read_small(&p) {
                Ok(s) => parse_hex(&s).map(Some).ok_or(TopologyError::Parse {
                    path: p,
                    value: s.trim().to_string(),
                    expected,
                }),
                Err(TopologyError::Read { source, .. })
                    if source.kind() == io::ErrorKind::NotFound =>
                {
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        };
        let vendor = hex("vendor", "a hexadecimal vendor ID")?.and_then(|v| u16::try_from(v).ok());
        let device = hex("device", "a hexadecimal device ID")?.and_then(|v| u16::try_from(v).ok());
        let class = hex("class", "a hexadecimal class code")?;
        let iommu_group = link_name(&dir.join("iommu_group")).and_then(|g| parse_dec(&g));
        Ok(PciFunction {
            address,
            upstream,
            host_bridge,
            vendor,
            device,
            class,
            driver: link_name(&dir.join("driver")),
            iommu_group,
        })
    }

    /// The config space of the PCI function at `address`, as much of it as
    /// this process may read (sysfs gives unprivileged readers 64 bytes).
    pub fn pci_config(&self, address: PciAddress) -> Result<Vec<u8>> {
        let path = self
            .sys
            .join("bus/pci/devices")
            .join(address.to_string())
            .join("config");
        let mut out = Vec::new();
        let file = fs::File::open(&path).map_err(|source| TopologyError::Read {
            path: path.clone(),
            source,
        })?;
        io::Read::read_to_end(&mut io::Read::take(file, EXT_CONFIG_END as u64), &mut out)
            .map_err(|source| TopologyError::Read { path, source })?;
        Ok(out)
    }

    /// The IOMMU groups the kernel made (0 when there is no IOMMU, or it is
    /// off).
    pub fn iommu_groups(&self) -> Result<BTreeSet<u32>> {
        let dir = self.sys.join("kernel/iommu_groups");
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(source) => return Err(TopologyError::Read { path: dir, source }),
        };
        Ok(rd
            .filter_map(|e| e.ok())
            .filter_map(|e| parse_dec(&e.file_name().to_string_lossy()))
            .collect())
    }

    /// The translation type of an IOMMU group (`DMA`, `DMA-FQ`, `identity`
    /// for passthrough), if the kernel says.
    pub fn iommu_group_type(&self, group: u32) -> Option<String> {
        let path = self
            .sys
            .join("kernel/iommu_groups")
            .join(group.to_string())
            .join("type");
        read_small(&path).ok().map(|s| s.trim().to_string())
    }
}

/// Every NVMe namespace of the running system (see
/// [`Topology::list_nvme_namespaces`]).
pub fn list_nvme_namespaces() -> Result<Vec<StorageTarget>> {
    Topology::new().list_nvme_namespaces()
}

/// Every P2P memory provider of the running system (see
/// [`Topology::list_p2pmem_providers`]).
pub fn list_p2pmem_providers() -> Result<Vec<P2pmemProvider>> {
    Topology::new().list_p2pmem_providers()
}

/// The NVMe controller (`.../nvme/nvmeN/<disk>`) and the first PCI function
/// above a sysfs directory.
fn controller_above(dir: &Path) -> (Option<String>, Option<PciAddress>) {
    let mut controller = None;
    for anc in dir.ancestors().skip(1) {
        let name = dir_name(anc);
        if controller.is_none()
            && is_nvme_controller_name(&name)
            && anc.parent().is_some_and(|p| dir_name(p) == "nvme")
        {
            controller = Some(name.clone());
        }
        if let Some(pci) = parse_sysfs_pci(&name) {
            return (controller, Some(pci));
        }
    }
    (controller, None)
}

/// A PCI address as sysfs names directories: `dddd:bb:dd.f`, all four
/// parts.
pub fn parse_sysfs_pci(name: &str) -> Option<PciAddress> {
    if name.matches(':').count() != 2 || !name.contains('.') {
        return None;
    }
    name.parse().ok()
}

/// `nvme<N>`.
fn is_nvme_controller_name(name: &str) -> bool {
    name.strip_prefix("nvme")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `nvme<N>n<M>`, not a partition (`p<K>`) nor a multipath path
/// (`nvme<N>c<C>n<M>`).
fn is_nvme_namespace_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let Some((ctrl, ns)) = rest.split_once('n') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(ctrl) && digits(ns)
}

/// Orders names with their digit runs compared as numbers (`nvme2n1` before
/// `nvme10n1`).
fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ra, rb) = (runs(a), runs(b));
    for (x, y) in ra.iter().zip(rb.iter()) {
        let o = match (x, y) {
            ((true, p), (true, q)) => {
                let (p, q) = (p.trim_start_matches('0'), q.trim_start_matches('0'));
                p.len().cmp(&q.len()).then_with(|| p.cmp(q))
            }
            ((_, p), (_, q)) => p.cmp(q),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ra.len().cmp(&rb.len()).then_with(|| a.cmp(b))
}

fn dir_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The device name of a sysfs device directory: `DEVNAME` from its
/// `uevent`, else the directory's name.
fn dev_name(dir: &Path) -> String {
    let fallback = dir_name(dir);
    dev_name_in(dir, &fallback)
}

fn dev_name_in(dir: &Path, fallback: &str) -> String {
    read_small(&dir.join("uevent"))
        .ok()
        .and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVNAME="))
                .map(|n| n.trim().to_string())
        })
        .filter(|n| !n.is_empty() && !n.contains(".."))
        .unwrap_or_else(|| fallback.to_string())
}

/// The last component of a symlink's target (`driver`, `iommu_group`).
fn link_name(link: &Path) -> Option<String> {
    let target = fs::read_link(link).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

fn read_small(path: &Path) -> Result<String> {
    let file = fs::File::open(path).map_err(|source| TopologyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut s = String::new();
    io::Read::read_to_string(&mut io::Read::take(file, MAX_ATTR), &mut s).map_err(|source| {
        TopologyError::Read {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(s)
}

fn parse_dec<T: std::str::FromStr>(s: &str) -> Option<T> {
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

fn parse_hex(s: &str) -> Option<u32> {
    let t = s.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if t.is_empty() || t.len() > 8 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(t, 16).ok()
}

/// A decimal sysfs attribute that must be there.
fn read_parsed<T: std::str::FromStr>(path: &Path, expected: &'static str) -> Result<T> {
    let s = read_small(path)?;
    parse_dec(&s).ok_or_else(|| TopologyError::Parse {
        path: path.to_path_buf(),
        value: s.trim().to_string(),
        expected,
    })
}

/// A decimal sysfs attribute that may be missing.
fn read_optional<T: std::str::FromStr>(path: &Path, expected: &'static str) -> Result<Option<T>> {
    match read_parsed(path, expected) {
        Ok(v) => Ok(Some(v)),
        Err(TopologyError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// A fake system in a temporary directory: sysfs, `/dev` and procfs trees
/// shaped like the kernel's, for the tests of the topology and the doctor.
#[cfg(test)]
pub(crate) mod fake {
    use std::{
        fs,
        os::unix::fs::symlink,
        path::{Path, PathBuf},
        sync::atomic::{AtomicU32, Ordering},
    };

    use super::Topology;

    static NEXT: AtomicU32 = AtomicU32::new(0);

    /// A temporary directory, removed on drop.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!(
                "p2pdma-test-{tag}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Self(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// Where the fake PCI devices sit: a switch (upstream port 01:00.0,
    /// downstream ports 02:00.0 and 02:01.0) below root port 00:01.0, with
    /// the NVMe controller at 03:00.0 and the accelerator at 04:00.0;
    /// a SATA controller at 05:00.0 below root port 00:02.0, and a second
    /// accelerator at 06:00.0 below root port 00:03.0.
    pub const RP1: &str = "devices/pci0000:00/0000:00:01.0";
    pub const USP: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    pub const DSP0: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
    pub const DSP1: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0";
    pub const NVME: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0";
    pub const ACCEL: &str =
        "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0";
    pub const RP2: &str = "devices/pci0000:00/0000:00:02.0";
    pub const SATA: &str = "devices/pci0000:00/0000:00:02.0/0000:05:00.0";
    pub const RP3: &str = "devices/pci0000:00/0000:00:03.0";
    pub const ACCEL2: &str = "devices/pci0000:00/0000:00:03.0/0000:06:00.0";
    pub const NS: &str =
        "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/nvme/nvme0/nvme0n1";

    /// A fake machine.
    pub struct FakeSys {
        pub tmp: TempDir,
    }

    impl FakeSys {
        /// An empty tree.
        pub fn empty() -> Self {
            let tmp = TempDir::new("sys");
            for d in ["sys", "dev", "proc/self", "proc/sys/kernel", "boot"] {
                fs::create_dir_all(tmp.path().join(d)).unwrap();
            }
            Self { tmp }
        }

        /// The machine described at [`RP1`], with NVMe namespace
        /// `nvme0n1` (partition `nvme0n1p1` at sector 2048), its generic
        /// device `ng0n1`, `sda` with `sda1`, `nvme2n1` and `nvme10n1`
        /// without PCI parents, and IOMMU groups 0 to 5.
        pub fn machine() -> Self {
            let f = Self::empty();
            f.pci(RP1, 0x8086, 0x29c4, 0x060400, Some(1));
            f.pci(USP, 0x10b5, 0x8747, 0x060400, Some(2));
            f.pci(DSP0, 0x10b5, 0x8747, 0x060400, Some(2));
            f.pci(DSP1, 0x10b5, 0x8747, 0x060400, Some(2));
            f.pci(NVME, 0x1b36, 0x0010, 0x010802, Some(2));
            f.pci(ACCEL, 0x1af4, 0x1110, 0x050000, Some(2));
            f.pci(RP2, 0x8086, 0x29c4, 0x060400, Some(3));
            f.pci(SATA, 0x8086, 0x2922, 0x010601, Some(4));
            f.pci(RP3, 0x8086, 0x29c4, 0x060400, Some(5));
            f.pci(ACCEL2, 0x1af4, 0x1110, 0x050000, Some(5));
            f.file("devices/pci0000:00/0000:00:00.0/vendor", "0x8086\n");
            for g in 0..6 {
                f.dir(&format!("kernel/iommu_groups/{g}/devices"));
                f.file(&format!("kernel/iommu_groups/{g}/type"), "DMA\n");
            }
            f.link(&format!("{ACCEL}/driver"), "bus/pci/drivers/p2pdma");
            f.link(&format!("{NVME}/driver"), "bus/pci/drivers/nvme");
            f.file(&format!("{ACCEL}/p2pmem/size"), "67108864\n");
            f.file(&format!("{ACCEL}/p2pmem/available"), "62914560\n");
            f.file(&format!("{ACCEL}/p2pmem/published"), "1\n");
            f.file(&format!("{ACCEL2}/p2pmem/size"), "1048576\n");
            f.file(&format!("{ACCEL2}/p2pmem/available"), "1048576\n");

            // The NVMe controller, its namespace, a partition and the
            // generic device.
            f.dir("class/nvme");
            f.dir("class/nvme-generic");
            f.dir("class/block");
            f.dir("class/mem");
            let ctrl = format!("{NVME}/nvme/nvme0");
            f.file(&format!("{ctrl}/dev"), "242:0\n");
            f.link(&format!("{ctrl}/subsystem"), "class/nvme");
            f.link("dev/char/242:0", &ctrl);
            f.disk(NS, "nvme0n1", "259:0", 512, 128, Some(1));
            let part = format!("{NS}/nvme0n1p1");
            f.file(&format!("{part}/partition"), "1\n");
            f.file(&format!("{part}/start"), "2048\n");
            f.file(&format!("{part}/size"), "204800\n");
            f.file(
                &format!("{part}/uevent"),
                "MAJOR=259\nMINOR=1\nDEVNAME=nvme0n1p1\n",
            );
            f.link("dev/block/259:1", &part);
            let ng = format!("{ctrl}/ng0n1");
            f.file(&format!("{ng}/dev"), "241:0\n");
            f.file(
                &format!("{ng}/uevent"),
                "MAJOR=241\nMINOR=0\nDEVNAME=ng0n1\n",
            );
            f.link(&format!("{ng}/subsystem"), "class/nvme-generic");
            f.link("class/nvme-generic/ng0n1", &ng);
            f.link("dev/char/241:0", &ng);

            // A SATA disk.
            let sda = format!("{SATA}/ata1/host0/target0:0:0/0:0:0:0/block/sda");
            f.disk(&sda, "sda", "8:0", 4096, 32767, None);
            let sda1 = format!("{sda}/sda1");
            f.file(&format!("{sda1}/partition"), "1\n");
            f.file(&format!("{sda1}/start"), "8\n");
            f.file(&format!("{sda1}/size"), "100\n");
            f.link("dev/block/8:1", &sda1);

            // Namespaces without PCI parents (fabrics), for the listing's
            // order, and a hidden multipath path device.
            f.disk(
                "devices/virtual/nvme-fabrics/ctl/nvme10/nvme10n1",
                "nvme10n1",
                "259:10",
                512,
                256,
                Some(1),
            );
            f.disk(
                "devices/virtual/nvme-fabrics/ctl/nvme2/nvme2n1",
                "nvme2n1",
                "259:2",
                512,
                256,
                Some(1),
            );
            f.disk(
                &format!("{ctrl}/nvme0c0n2"),
                "nvme0c0n2",
                "259:7",
                512,
                128,
                Some(2),
            );

            // /dev/null, a character device of another class.
            f.link("devices/virtual/mem/null/subsystem", "class/mem");
            f.link("dev/char/1:3", "devices/virtual/mem/null");

            f.root_file("proc/sys/kernel/osrelease", "7.3.0-test\n");
            f
        }

        pub fn root(&self) -> &Path {
            self.tmp.path()
        }

        pub fn sys(&self) -> PathBuf {
            self.root().join("sys")
        }

        pub fn topology(&self) -> Topology {
            Topology::with_roots(
                self.sys(),
                self.root().join("dev"),
                self.root().join("proc"),
            )
        }

        /// Creates directory `rel` of sysfs.
        pub fn dir(&self, rel: &str) {
            fs::create_dir_all(self.sys().join(rel)).unwrap();
        }

        /// Writes file `rel` of sysfs.
        pub fn file(&self, rel: &str, content: &str) {
            self.bytes(rel, content.as_bytes());
        }

        /// Writes file `rel` of sysfs.
        pub fn bytes(&self, rel: &str, content: &[u8]) {
            let p = self.sys().join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }

        /// Writes file `rel` of the fake root (`dev/...`, `proc/...`).
        pub fn root_file(&self, rel: &str, content: &str) {
            let p = self.root().join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }

        /// Makes sysfs symlink `rel` point at sysfs path `target`.
        pub fn link(&self, rel: &str, target: &str) {
            let l = self.sys().join(rel);
            fs::create_dir_all(l.parent().unwrap()).unwrap();
            let t = self.sys().join(target);
            fs::create_dir_all(&t).unwrap();
            let _ = fs::remove_file(&l);
            symlink(t, l).unwrap();
        }

        /// A PCI function at sysfs path `rel` (its last component is its
        /// address).
        pub fn pci(&self, rel: &str, vendor: u16, device: u16, class: u32, group: Option<u32>) {
            self.file(&format!("{rel}/vendor"), &format!("0x{vendor:04x}\n"));
            self.file(&format!("{rel}/device"), &format!("0x{device:04x}\n"));
            self.file(&format!("{rel}/class"), &format!("0x{class:06x}\n"));
            let name = rel.rsplit('/').next().unwrap();
            self.link(&format!("bus/pci/devices/{name}"), rel);
            if let Some(g) = group {
                self.link(
                    &format!("{rel}/iommu_group"),
                    &format!("kernel/iommu_groups/{g}"),
                );
            }
        }

        /// A whole disk at sysfs path `rel`, in `/sys/block` and
        /// `/sys/dev/block`.
        pub fn disk(
            &self,
            rel: &str,
            name: &str,
            dev: &str,
            lbs: u32,
            max_kb: u32,
            nsid: Option<u32>,
        ) {
            self.file(&format!("{rel}/dev"), &format!("{dev}\n"));
            let (maj, min) = dev.split_once(':').unwrap();
            self.file(
                &format!("{rel}/uevent"),
                &format!("MAJOR={maj}\nMINOR={min}\nDEVNAME={name}\nDEVTYPE=disk\n"),
            );
            self.file(
                &format!("{rel}/queue/logical_block_size"),
                &format!("{lbs}\n"),
            );
            self.file(
                &format!("{rel}/queue/max_hw_sectors_kb"),
                &format!("{max_kb}\n"),
            );
            if let Some(n) = nsid {
                self.file(&format!("{rel}/nsid"), &format!("{n}\n"));
            }
            self.link(&format!("{rel}/subsystem"), "class/block");
            self.link(&format!("block/{name}"), rel);
            self.link(&format!("dev/block/{dev}"), rel);
        }
    }

    /// An extended config space whose capability list is AER at 0x100,
    /// then (when `acs` is given) ACS at 0x148 with that control register.
    pub fn config_space(acs: Option<u16>) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        let next = if acs.is_some() { 0x148u32 } else { 0 };
        let aer = 0x0001 | (1 << 16) | (next << 20);
        c[0x100..0x104].copy_from_slice(&aer.to_le_bytes());
        if let Some(ctrl) = acs {
            let hdr = 0x000du32 | (1 << 16);
            c[0x148..0x14c].copy_from_slice(&hdr.to_le_bytes());
            c[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
            c[0x14e..0x150].copy_from_slice(&ctrl.to_le_bytes());
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::{fake::*, *};

    fn pci(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    #[test]
    fn whole_nvme_namespace_resolves_to_controller_and_pci_function() {
        let f = FakeSys::machine();
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme0n1"),
                DevNum {
                    major: 259,
                    minor: 0,
                },
                TargetKind::BlockDevice,
            )
            .unwrap();
        assert_eq!(t.kind, TargetKind::BlockDevice);
        assert_eq!(t.disk, "nvme0n1");
        assert_eq!(t.disk_path, f.root().join("dev/nvme0n1"));
        assert_eq!(t.partition, None);
        assert_eq!(t.partition_offset(), 0);
        assert_eq!(t.generic_path, Some(f.root().join("dev/ng0n1")));
        assert_eq!(t.nsid, Some(1));
        assert_eq!(t.logical_block_size, 512);
        assert_eq!(t.max_transfer_bytes, 128 * 1024);
        assert_eq!(t.controller.as_deref(), Some("nvme0"));
        assert_eq!(t.pci, Some(pci("0000:03:00.0")));
        assert!(t.is_nvme);
        assert!(t.slaves.is_empty());
        let j = t.to_json();
        assert_eq!(j["pci"], "0000:03:00.0");
        assert_eq!(j["kind"], "block");
    }

    #[test]
    fn disk_facts_come_from_the_disk_and_its_controller() {
        let f = FakeSys::machine();
        let ctrl = format!("{NVME}/nvme/nvme0");
        f.file(&format!("{ctrl}/model"), "QEMU NVMe Ctrl   \n");
        f.file(&format!("{ctrl}/serial"), "deadbeef\n");
        f.link(&format!("{NS}/device"), &ctrl);
        f.file(&format!("{NS}/queue/max_sectors_kb"), "1280\n");
        f.file(&format!("{NS}/queue/nr_requests"), "1023\n");
        f.file(&format!("{NS}/queue/rotational"), "0\n");
        // A file on the partition: the whole disk's facts.
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme0n1p1"),
                DevNum {
                    major: 259,
                    minor: 1,
                },
                TargetKind::BlockDevice,
            )
            .unwrap();
        let d = &t.disk_facts;
        assert_eq!(
            d.dev,
            Some(DevNum {
                major: 259,
                minor: 0
            })
        );
        assert_eq!(d.model.as_deref(), Some("QEMU NVMe Ctrl"));
        assert_eq!(d.serial.as_deref(), Some("deadbeef"));
        assert_eq!(d.max_request_bytes, Some(1280 * 1024));
        assert_eq!(d.queue_requests, Some(1023));
        assert_eq!(d.rotational, Some(false));
        // A disk that says little: a virtio disk's serial is its own.
        let sda = format!("{SATA}/ata1/host0/target0:0:0/0:0:0:0/block/sda");
        f.file(&format!("{sda}/serial"), "overlayblk\n");
        f.file(&format!("{sda}/queue/nr_requests"), "lots\n");
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/sda"),
                DevNum { major: 8, minor: 0 },
                TargetKind::BlockDevice,
            )
            .unwrap();
        assert_eq!(
            t.disk_facts,
            DiskFacts {
                dev: Some(DevNum { major: 8, minor: 0 }),
                serial: Some("overlayblk".into()),
                ..Default::default()
            }
        );
    }

    #[test]
    fn partitions_lead_to_their_disk_and_carry_their_offset() {
        let f = FakeSys::machine();
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme0n1p1"),
                DevNum {
                    major: 259,
                    minor: 1,
                },
                TargetKind::BlockDevice,
            )
            .unwrap();
        assert_eq!(t.disk, "nvme0n1");
        let p = t.partition.clone().unwrap();
        assert_eq!(
            (p.name.as_str(), p.number, p.start, p.size),
            ("nvme0n1p1", 1, 2048 * 512, 204800 * 512)
        );
        assert_eq!(t.partition_offset(), 1048576);
        assert_eq!(t.pci, Some(pci("0000:03:00.0")));
    }

    #[test]
    fn generic_char_devices_resolve_to_their_namespace() {
        let f = FakeSys::machine();
        let t = f
            .topology()
            .resolve_char(
                Path::new("/dev/ng0n1"),
                DevNum {
                    major: 241,
                    minor: 0,
                },
            )
            .unwrap();
        assert_eq!(t.kind, TargetKind::NvmeGeneric);
        assert_eq!(t.disk, "nvme0n1");
        assert_eq!(t.nsid, Some(1));
        assert_eq!(t.controller.as_deref(), Some("nvme0"));
    }

    #[test]
    fn other_char_devices_are_refused_with_what_they_are() {
        let f = FakeSys::machine();
        let topo = f.topology();
        let e = topo
            .resolve_char(Path::new("/dev/null"), DevNum { major: 1, minor: 3 })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not an NVMe generic device") && e.contains("mem"),
            "{e}"
        );
        let e = topo
            .resolve_char(
                Path::new("/dev/nvme0"),
                DevNum {
                    major: 242,
                    minor: 0,
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("controller nvme0") && e.contains("/dev/nvme0n1"),
            "{e}"
        );
        let e = topo
            .resolve_char(Path::new("/dev/x"), DevNum { major: 9, minor: 9 })
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown to sysfs"), "{e}");
    }

    #[test]
    fn sata_disks_are_not_nvme_but_have_a_pci_function() {
        let f = FakeSys::machine();
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/sda1"),
                DevNum { major: 8, minor: 1 },
                TargetKind::BlockDevice,
            )
            .unwrap();
        assert_eq!(t.disk, "sda");
        assert!(!t.is_nvme);
        assert_eq!(t.controller, None);
        assert_eq!(t.generic_path, None);
        assert_eq!(t.nsid, None);
        assert_eq!(t.logical_block_size, 4096);
        assert_eq!(t.partition_offset(), 8 * 512);
        assert_eq!(t.pci, Some(pci("0000:05:00.0")));
    }

    #[test]
    fn files_resolve_through_their_filesystem_device() {
        let f = FakeSys::machine();
        let file = f.root().join("data.bin");
        fs::write(&file, b"x").unwrap();
        let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
        f.link(&format!("dev/block/{dev}"), &format!("{NS}/nvme0n1p1"));
        let t = f.topology().resolve(&file).unwrap();
        assert_eq!(
            t.kind,
            TargetKind::File {
                fs_device: "nvme0n1p1".into(),
                fs_dev: dev
            }
        );
        assert_eq!(t.disk, "nvme0n1");
        assert_eq!(t.partition_offset(), 1048576);
        assert!(t.is_nvme);
        assert_eq!(t.to_json()["fs_device"]["name"], "nvme0n1p1");
    }

    #[test]
    fn files_on_filesystems_without_a_block_device_say_which() {
        let f = FakeSys::machine();
        let file = f.root().join("data.bin");
        fs::write(&file, b"x").unwrap();
        let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
        f.root_file(
            "proc/self/mountinfo",
            &format!("22 1 {dev} / /mnt\\040x rw,relatime shared:1 - tmpfs tmpfs rw\n"),
        );
        let e = f.topology().resolve(&file).unwrap_err();
        assert!(matches!(e, TopologyError::NoBlockDevice { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("a tmpfs filesystem") && e.contains(&dev.to_string()),
            "{e}"
        );
        // Without a mount table it still says what is missing.
        fs::remove_file(f.root().join("proc/self/mountinfo")).unwrap();
        let e = f.topology().resolve(&file).unwrap_err().to_string();
        assert!(e.contains("without a block device"), "{e}");
    }

    #[test]
    fn sockets_and_missing_paths_are_clear_errors() {
        let f = FakeSys::machine();
        let sock = f.root().join("sock");
        let _l = UnixListener::bind(&sock).unwrap();
        let e = f.topology().resolve(&sock).unwrap_err().to_string();
        assert!(e.ends_with("is a socket"), "{e}");
        let e = f
            .topology()
            .resolve(f.root().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot stat"), "{e}");
    }

    #[test]
    fn garbage_in_sysfs_is_a_parse_error_naming_the_file() {
        let f = FakeSys::machine();
        f.file(&format!("{NS}/queue/logical_block_size"), "lots\n");
        let e = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme0n1"),
                DevNum {
                    major: 259,
                    minor: 0,
                },
                TargetKind::BlockDevice,
            )
            .unwrap_err();
        let TopologyError::Parse { path, value, .. } = &e else {
            panic!("{e}");
        };
        assert!(path.ends_with("queue/logical_block_size"));
        assert_eq!(value, "lots");
        fs::remove_file(f.sys().join(NS).join("queue/logical_block_size")).unwrap();
        let e = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme0n1"),
                DevNum {
                    major: 259,
                    minor: 0,
                },
                TargetKind::BlockDevice,
            )
            .unwrap_err();
        assert!(matches!(e, TopologyError::Read { .. }), "{e}");
    }

    #[test]
    fn multipath_namespaces_find_a_controller_through_their_paths() {
        let f = FakeSys::machine();
        let head = "devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n3";
        f.disk(head, "nvme0n3", "259:20", 512, 128, Some(3));
        let path = format!("{NVME}/nvme/nvme0/nvme0c0n3");
        f.dir(&path);
        f.link(&format!("{head}/multipath/nvme0c0n3"), &path);
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme0n3"),
                DevNum {
                    major: 259,
                    minor: 20,
                },
                TargetKind::BlockDevice,
            )
            .unwrap();
        assert_eq!(t.controller.as_deref(), Some("nvme0"));
        assert_eq!(t.pci, Some(pci("0000:03:00.0")));
        assert_eq!(t.nsid, Some(3));
        // Its generic device is found by name when there is no class entry.
        assert_eq!(t.generic_path, None);
        f.root_file("dev/ng0n3", "");
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme0n3"),
                DevNum {
                    major: 259,
                    minor: 20,
                },
                TargetKind::BlockDevice,
            )
            .unwrap();
        assert_eq!(t.generic_path, Some(f.root().join("dev/ng0n3")));
    }

    #[test]
    fn multipath_heads_list_every_path_with_its_controller() {
        let f = FakeSys::machine();
        let nvme1 = "devices/pci0000:00/0000:00:04.0/0000:07:00.0";
        f.pci(
            "devices/pci0000:00/0000:00:04.0",
            0x8086,
            0x29c4,
            0x060400,
            Some(6),
        );
        f.pci(nvme1, 0x1b36, 0x0010, 0x010802, Some(6));
        let head = "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1";
        f.disk(head, "nvme1n1", "259:30", 512, 128, Some(3));
        // Listed out of order, and a third path whose controller is gone.
        for (name, dir) in [
            (
                "nvme1c10n1",
                "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1c10n1".to_string(),
            ),
            ("nvme1c2n1", format!("{nvme1}/nvme/nvme2/nvme1c2n1")),
            ("nvme1c1n1", format!("{NVME}/nvme/nvme1/nvme1c1n1")),
        ] {
            f.dir(&dir);
            f.link(&format!("{head}/multipath/{name}"), &dir);
        }
        let t = f
            .topology()
            .resolve_block(
                Path::new("/dev/nvme1n1"),
                DevNum {
                    major: 259,
                    minor: 30,
                },
                TargetKind::BlockDevice,
            )
            .unwrap();
        let path = |name: &str, c: Option<&str>, p: Option<&str>| NvmePath {
            name: name.into(),
            controller: c.map(Into::into),
            pci: p.map(pci),
        };
        let want = vec![
            path("nvme1c1n1", Some("nvme1"), Some("0000:03:00.0")),
            path("nvme1c2n1", Some("nvme2"), Some("0000:07:00.0")),
            path("nvme1c10n1", None, None),
        ];
        assert!(t.is_multipath() && t.is_nvme);
        assert_eq!(t.multipath, want);
        assert_eq!(t.io_paths(), want);
        assert_eq!(t.controller.as_deref(), Some("nvme1"));
        assert_eq!(
            want.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            [
                "nvme1c1n1 (nvme1 at 0000:03:00.0)",
                "nvme1c2n1 (nvme2 at 0000:07:00.0)",
                "nvme1c10n1 (no controller found)"
            ]
        );
        assert_eq!(
            t.to_json()["multipath"][1],
            serde_json::json!({"name": "nvme1c2n1", "controller": "nvme2", "pci": "0000:07:00.0"})
        );

        // A namespace of one controller has one path, its own; other disks
        // none.
        let topo = f.topology();
        let ns = topo
            .resolve_char(
                Path::new("/dev/ng0n1"),
                DevNum {
                    major: 241,
                    minor: 0,
                },
            )
            .unwrap();
        assert!(!ns.is_multipath());
        assert_eq!(
            ns.io_paths(),
            vec![path("nvme0n1", Some("nvme0"), Some("0000:03:00.0"))]
        );
        let sda = topo
            .resolve_block(
                Path::new("/dev/sda"),
                DevNum { major: 8, minor: 0 },
                TargetKind::BlockDevice,
            )
            .unwrap();
        assert_eq!(sda.io_paths(), vec![]);
    }

    #[test]
    fn namespaces_with_metadata_refuse_nvme_commands_with_the_reason() {
        let f = FakeSys::machine();
        let resolve = |f: &FakeSys| {
            f.topology()
                .resolve_block(
                    Path::new("/dev/nvme0n1p1"),
                    DevNum {
                        major: 259,
                        minor: 1,
                    },
                    TargetKind::BlockDevice,
                )
                .unwrap()
        };
        // No metadata: no refusal, whether the files say 0 and none or are
        // missing.
        assert_eq!(resolve(&f).nvme_cmd_refusal(), None);
        f.file(&format!("{NS}/metadata_bytes"), "0\n");
        f.file(&format!("{NS}/integrity/format"), "none\n");
        let t = resolve(&f);
        assert_eq!((t.metadata_bytes, t.integrity.as_deref()), (0, None));
        assert_eq!(t.nvme_cmd_refusal(), None);
        // A partition's namespace is its disk's.
        f.file(&format!("{NS}/metadata_bytes"), "8\n");
        let t = resolve(&f);
        assert_eq!(t.metadata_bytes, 8);
        assert_eq!(
            t.nvme_cmd_refusal().unwrap().to_string(),
            "nvme0n1 is formatted with 8 bytes of metadata per block: the library's NVMe commands carry no metadata buffer (P2P and bounce I/O go through the block layer, which handles the metadata)"
        );
        f.file(&format!("{NS}/integrity/format"), "T10-DIF-TYPE1-CRC\n");
        let r = resolve(&f).nvme_cmd_refusal().unwrap();
        assert_eq!(
            r,
            NvmeCmdRefusal::Metadata {
                disk: "nvme0n1".into(),
                bytes: 8,
                integrity: Some("T10-DIF-TYPE1-CRC".into())
            }
        );
        assert!(r
            .to_string()
            .starts_with("nvme0n1 is formatted with 8 bytes of metadata per block (integrity format T10-DIF-TYPE1-CRC): "));
        assert_eq!(
            resolve(&f).to_json()["nvme_cmd_refusal"],
            serde_json::json!(r.to_string())
        );
        f.file(&format!("{NS}/metadata_bytes"), "eight\n");
        let err = f
            .topology()
            .resolve_char(
                Path::new("/dev/ng0n1"),
                DevNum {
                    major: 241,
                    minor: 0,
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metadata_bytes: \"eight\" is not a byte count"),
            "{err}"
        );
    }

    #[test]
    fn namespaces_are_listed_in_natural_order_without_path_devices() {
        let f = FakeSys::machine();
        let list = f.topology().list_nvme_namespaces().unwrap();
        let names: Vec<&str> = list.iter().map(|t| t.disk.as_str()).collect();
        assert_eq!(names, ["nvme0n1", "nvme2n1", "nvme10n1"]);
        assert_eq!(list[0].path, f.root().join("dev/nvme0n1"));
        assert_eq!(list[1].pci, None);
        assert!(list.iter().all(|t| t.is_nvme));
        let none = FakeSys::empty().topology().list_nvme_namespaces().unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn p2pmem_providers_are_listed_with_their_sizes() {
        let f = FakeSys::machine();
        let list = f.topology().list_p2pmem_providers().unwrap();
        assert_eq!(
            list,
            [
                P2pmemProvider {
                    pci: pci("0000:04:00.0"),
                    size: 64 << 20,
                    available: 60 << 20,
                    published: true,
                    driver: Some("p2pdma".into()),
                },
                P2pmemProvider {
                    pci: pci("0000:06:00.0"),
                    size: 1 << 20,
                    available: 1 << 20,
                    published: false,
                    driver: None,
                },
            ]
        );
        assert_eq!(list[0].to_json()["available"], 60 << 20);
        f.file(&format!("{ACCEL}/p2pmem/available"), "-1\n");
        let e = f
            .topology()
            .list_p2pmem_providers()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("p2pmem/available") && e.contains("\"-1\""),
            "{e}"
        );
    }

    #[test]
    fn pci_functions_know_what_is_above_them() {
        let f = FakeSys::machine();
        let topo = f.topology();
        let nvme = topo.pci_function(pci("0000:03:00.0")).unwrap();
        assert_eq!(
            nvme.upstream,
            [
                pci("0000:02:00.0"),
                pci("0000:01:00.0"),
                pci("0000:00:01.0")
            ]
        );
        assert_eq!(nvme.host_bridge.as_deref(), Some("pci0000:00"));
        assert_eq!(
            (nvme.vendor, nvme.device, nvme.class),
            (Some(0x1b36), Some(0x10), Some(0x010802))
        );
        assert_eq!(nvme.driver.as_deref(), Some("nvme"));
        assert_eq!(nvme.iommu_group, Some(2));
        assert!(!nvme.is_bridge());
        assert!(topo.pci_function(pci("0000:02:00.0")).unwrap().is_bridge());
        let accel = topo.pci_function(pci("0000:04:00.0")).unwrap();
        assert_eq!(common_upstream(&accel, &nvme), Some(pci("0000:01:00.0")));
        assert_eq!(
            acs_path(&accel, &nvme),
            [
                pci("0000:04:00.0"),
                pci("0000:02:01.0"),
                pci("0000:01:00.0"),
                pci("0000:03:00.0"),
                pci("0000:02:00.0"),
            ]
        );
        let far = topo.pci_function(pci("0000:06:00.0")).unwrap();
        assert_eq!(common_upstream(&far, &nvme), None);
        assert_eq!(
            acs_path(&far, &nvme),
            [pci("0000:06:00.0"), pci("0000:00:03.0")]
        );
        assert_eq!(common_upstream(&nvme, &nvme), Some(pci("0000:03:00.0")));
        assert_eq!(acs_path(&nvme, &nvme), [pci("0000:03:00.0")]);
        assert!(topo.pci_function(pci("0000:09:00.0")).is_err());
        assert_eq!(topo.iommu_groups().unwrap().len(), 6);
        assert_eq!(topo.iommu_group_type(2).as_deref(), Some("DMA"));
        assert!(FakeSys::empty()
            .topology()
            .iommu_groups()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn acs_control_is_found_by_walking_the_extended_capabilities() {
        let c = config_space(Some(PCI_ACS_SV | PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_UF));
        assert_eq!(find_ext_capability(&c, PCI_EXT_CAP_ID_ACS), Ok(Some(0x148)));
        assert_eq!(find_ext_capability(&c, 0x0001), Ok(Some(0x100)));
        assert_eq!(acs_control(&c), Ok(Some(0x1d)));
        assert_eq!(acs_bits(0x1d), "SV RR CR UF");
        assert_eq!(acs_bits(0), "none");
        assert_eq!(acs_control(&config_space(None)), Ok(None));
        // Only the header is readable without privileges.
        assert_eq!(acs_control(&c[..64]), Err(ConfigSpaceError::Short(64)));
        // Conventional PCI functions have no extended space, so no ACS.
        assert_eq!(acs_control(&c[..256]), Ok(None));
        // A capability list that loops ends.
        let mut l = vec![0u8; 4096];
        l[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
        assert_eq!(acs_control(&l), Ok(None));
        // One that points past the end ends too.
        let mut l = vec![0u8; 0x104];
        l[0x100..0x104].copy_from_slice(&(0x0001u32 | (0xffc << 20)).to_le_bytes());
        assert_eq!(acs_control(&l), Ok(None));
        // All ones (a device that is gone) has no capabilities.
        assert_eq!(acs_control(&[0xff; 4096]), Ok(None));
        // A capability cut off before its control register.
        let c = config_space(Some(PCI_ACS_RR));
        assert!(acs_control(&c[..0x14d]).is_err());
    }

    #[test]
    fn pci_config_reads_what_sysfs_gives() {
        let f = FakeSys::machine();
        f.bytes(&format!("{DSP1}/config"), &config_space(Some(PCI_ACS_RR)));
        let c = f.topology().pci_config(pci("0000:02:01.0")).unwrap();
        assert_eq!(acs_control(&c), Ok(Some(PCI_ACS_RR)));
        assert!(f.topology().pci_config(pci("0000:02:00.0")).is_err());
    }

    #[test]
    fn mountinfo_lines_parse() {
        let m = parse_mountinfo_line(
            "36 35 98:0 /mnt1 /mnt\\0402 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
        )
        .unwrap();
        assert_eq!(
            m.dev,
            DevNum {
                major: 98,
                minor: 0
            }
        );
        assert_eq!(m.mount_point, "/mnt 2");
        assert_eq!(m.fstype, "ext3");
        assert_eq!(m.source, "/dev/root");
        assert_eq!(parse_mountinfo_line("garbage"), None);
        assert_eq!(
            parse_mountinfo_line("1 2 x:y / / rw - ext4 /dev/a rw"),
            None
        );
        assert_eq!(unescape_mount("a\\"), "a\\");
        assert_eq!(unescape_mount("a\\99"), "a\\99");
        assert_eq!(unescape_mount("\\777"), "\\777");
    }

    #[test]
    fn names_and_numbers_parse_strictly() {
        assert_eq!(
            DevNum::parse("259:1\n"),
            Some(DevNum {
                major: 259,
                minor: 1
            })
        );
        assert_eq!(DevNum::parse("259"), None);
        assert_eq!(DevNum::parse("-1:2"), None);
        assert_eq!(
            DevNum::from_raw(0x10300),
            DevNum {
                major: 259,
                minor: 0
            }
        );
        assert_eq!(parse_sysfs_pci("0000:03:00.0"), Some(pci("0000:03:00.0")));
        assert_eq!(parse_sysfs_pci("03:00.0"), None);
        assert_eq!(parse_sysfs_pci("pci0000:00"), None);
        assert!(is_nvme_namespace_name("nvme12n3"));
        assert!(!is_nvme_namespace_name("nvme0n1p1"));
        assert!(!is_nvme_namespace_name("nvme0c1n1"));
        assert!(!is_nvme_namespace_name("nvme0"));
        assert!(is_nvme_controller_name("nvme7"));
        assert!(!is_nvme_controller_name("nvme"));
        assert!(!is_nvme_controller_name("nvme-subsys0"));
        let mut v = vec!["nvme10n1", "nvme2n10", "nvme2n2", "nvme1n1", "sda"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["nvme1n1", "nvme2n2", "nvme2n10", "nvme10n1", "sda"]);
        assert_eq!(parse_hex("0x060400\n"), Some(0x060400));
        assert_eq!(parse_hex("0x"), None);
        assert_eq!(parse_dec::<u32>(" 12\n"), Some(12));
        assert_eq!(parse_dec::<u32>("+12"), None);
        assert_eq!(parse_dec::<u32>("99999999999"), None);
    }
}
