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
    storage::{
        DiskFacts, MdArray, MdMember, NvmePath, Partition, StorageTarget, TargetKind, Transport,
    },
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
    pub(crate) fn resolve_block(
        &self,
        path: &Path,
        dev: DevNum,
        kind: TargetKind,
    ) -> Result<StorageTarget> {
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
        let transport = controller.as_deref().and_then(|c| self.transport_of(c));
        let md = self.md_of(&disk_dir);
        let is_nvme = match &md {
            // An array is NVMe storage when every member it does I/O to is.
            Some(md) => {
                let mut active = md.members.iter().filter(|m| m.active()).peekable();
                active.peek().is_some()
                    && active.all(|m| m.target.as_ref().is_some_and(|t| t.is_nvme))
            }
            None => controller.is_some() || is_nvme_namespace_name(&disk),
        };
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
            transport,
            is_nvme,
            slaves,
            multipath,
            md,
            metadata_bytes,
            integrity,
            disk_facts: DiskFacts::read(&disk_dir),
        })
    }

    /// The md array whose disk directory is `disk_dir` (its `md/`), with
    /// each member resolved as a block device of its own; `None` for other
    /// disks. A member whose link or attributes cannot be read is listed
    /// without them rather than failing the array.
    fn md_of(&self, disk_dir: &Path) -> Option<MdArray> {
        let md = disk_dir.join("md");
        let level = read_small(&md.join("level")).ok()?.trim().to_string();
        let number =
            |name: &str| -> Option<u32> { read_small(&md.join(name)).ok()?.trim().parse().ok() };
        // "524288", or "524288 (1048576)" while a reshape changes it.
        let chunk_bytes = read_small(&md.join("chunk_size"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let mut members: Vec<MdMember> = fs::read_dir(&md)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let entry = e.file_name().to_string_lossy().into_owned();
                        let name = entry.strip_prefix("dev-")?.to_string();
                        Some(self.md_member(&e.path(), name))
                    })
                    .collect()
            })
            .unwrap_or_default();
        members.sort_by(|a, b| match (a.slot, b.slot) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => natural_cmp(&a.name, &b.name),
        });
        Some(MdArray {
            level,
            chunk_bytes,
            raid_disks: number("raid_disks"),
            layout: number("layout"),
            degraded: number("degraded"),
            state: read_small(&md.join("array_state"))
                .ok()
                .map(|s| s.trim().to_string()),
            members,
        })
    }

    /// A member of an md array, from its `md/dev-NAME` directory `dir`.
    fn md_member(&self, dir: &Path, name: String) -> MdMember {
        let slot = read_small(&dir.join("slot"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let state = read_small(&dir.join("state"))
            .map(|s| {
                s.trim()
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let data_offset = read_small(&dir.join("offset"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .and_then(|sectors| sectors.checked_mul(512));
        let target = fs::canonicalize(dir.join("block"))
            .ok()
            .and_then(|block| {
                self.target_from_block_dir(&self.dev.join(&name), &block)
                    .ok()
            })
            .map(Box::new);
        MdMember {
            name,
            slot,
            state,
            data_offset,
            target,
        }
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
                let transport = controller
                    .as_deref()
                    .and_then(|c| self.transport_of(c))
                    .map(Box::new);
                NvmePath {
                    name: dir_name(p),
                    controller,
                    pci,
                    transport,
                }
            })
            .collect()
    }

    /// How NVMe controller `ctrl` (e.g. `nvme4`) reaches its subsystem, from
    /// `/sys/class/nvme/CTRL`; `None` when sysfs does not say.
    fn transport_of(&self, ctrl: &str) -> Option<Transport> {
        let dir = self.sys.join("class/nvme").join(ctrl);
        let attr = |name: &str| {
            read_small(&dir.join(name))
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        Some(Transport {
            kind: attr("transport")?,
            address: attr("address"),
            subsysnqn: attr("subsysnqn"),
            state: attr("state"),
        })
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

    /// NVMe controller `ctrl`'s state now (`live`, `connecting`,
    /// `resetting`, `deleting`, `dead`), if sysfs says.
    pub fn controller_state(&self, ctrl: &str) -> Option<String> {
        read_small(&self.sys.join("class/nvme").join(ctrl).join("state"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
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
        // A PCIe controller sits in its function's `nvme/`, a fabrics one
        // in `/sys/devices/virtual/nvme-fabrics/ctl/`.
        let parent = anc.parent().map(dir_name);
        let fabrics = parent.as_deref() == Some("ctl")
            && anc
                .parent()
                .and_then(Path::parent)
                .is_some_and(|g| dir_name(g) == "nvme-fabrics");
        if controller.is_none()
            && is_nvme_controller_name(&name)
            && (parent.as_deref() == Some("nvme") || fabrics)
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
mod tests;
