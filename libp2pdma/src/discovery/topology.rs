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
    fs, io,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
};

use super::{
    devnum::DevNum,
    error::{Result, TopologyError},
    mounts::parse_mountinfo_line,
    parse::{parse_dec, parse_hex},
    pci::{P2pmemProvider, PciAddress, PciFunction, EXT_CONFIG_END},
    storage::{DiskFacts, NvmePath, Partition, StorageTarget, TargetKind},
    sysfs::{read_optional, read_parsed, read_small},
};

/// Default sysfs root.
pub const SYSFS_ROOT: &str = "/sys";
/// Default root of the device nodes.
pub const DEV_ROOT: &str = "/dev";
/// Default procfs root.
pub const PROC_ROOT: &str = "/proc";

/// Sectors in sysfs (`start`, `size`) are always 512 bytes.
const SECTOR: u64 = 512;

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

    /// Every PCI function of the machine that sysfs shows whole, by
    /// address (one whose attributes cannot be read is left out).
    pub fn pci_functions(&self) -> Result<Vec<PciFunction>> {
        let dir = self.sys.join("bus/pci/devices");
        let entries = fs::read_dir(&dir).map_err(|source| TopologyError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut out: Vec<PciFunction> = entries
            .flatten()
            .filter_map(|e| parse_sysfs_pci(&e.file_name().to_string_lossy()))
            .filter_map(|a| self.pci_function(a).ok())
            .collect();
        out.sort_by_key(|f| f.address);
        Ok(out)
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

impl StorageTarget {
    /// Resolves `path` (a file or directory, a block device node, or an NVMe
    /// generic character device) against the running system.
    pub fn resolve(path: impl AsRef<Path>) -> Result<Self> {
        Topology::new().resolve(path)
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

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;
    use crate::discovery::{fake::*, mounts::unescape_mount, pci::*, storage::NvmeCmdRefusal};

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
    fn every_pci_function_is_listed_in_order() {
        let f = FakeSys::machine();
        let all = f.topology().pci_functions().unwrap();
        let names: Vec<String> = all.iter().map(|p| p.address.to_string()).collect();
        let mut want: Vec<String> = [RP1, USP, DSP0, DSP1, NVME, ACCEL, RP2, SATA, RP3, ACCEL2]
            .iter()
            .map(|p| p.rsplit('/').next().unwrap().to_string())
            .collect();
        want.sort();
        assert_eq!(names, want);
        let accel = all
            .iter()
            .find(|p| p.address == pci("0000:04:00.0"))
            .unwrap();
        assert_eq!(accel.upstream[0], pci("0000:02:01.0"));
        assert!(all.iter().filter(|p| p.is_bridge()).count() >= 6);
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
