//! The doctor's examination of the machine: every check in turn, and the
//! data path the library would take.

use std::{
    fs::File,
    io::Read,
    os::fd::AsFd,
    path::{Path as FsPath, PathBuf},
};

use flate2::read::GzDecoder;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use crate::{
    discovery::DEVICE_NODE,
    discovery::{
        acs_bits, acs_control, acs_path, common_upstream, pci::PCI_ACS_REDIRECT, NvmePath,
        PciFunction, StorageTarget, TargetKind, Topology, Transport,
    },
    discovery::{gpus, CudaDevice},
    memory::MemoryKind,
    queues::claim::{IommuMode, NVME_CLASS},
    Accelerator, Error, MapType, Module, P2pQuery, PciAddress, Peer,
};

use super::{
    checks::{
        gpu_choice, gpu_memory_check, kernel_config_check, nvme_passthrough_check,
        p2p_memory_check, page_cache_check, storage_check,
    },
    kconfig::{KernelConfig, BOOT_ROOT, MAX_KCONFIG},
    report::{bytes, Check, Report, Status},
};
use crate::transfer::plan::{
    allowed, decide, query_paths, ArrayFacts, Facts, MemoryFacts, P2pSubmit, PathChoice, PathPref,
    StorageFacts, TransferPath, EVERY_MEMBER, EVERY_PATH,
};

/// Which accelerator the doctor looks at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccelSelect {
    /// The first one bound to the module.
    #[default]
    Auto,
    /// The one at this index of the module.
    Index(u32),
    /// The one at this PCI address.
    Pci(PciAddress),
}

/// The doctor, with the places it reads from.
#[derive(Clone, Debug)]
pub struct Doctor {
    topology: Topology,
    node: PathBuf,
    boot: PathBuf,
}

impl Default for Doctor {
    fn default() -> Self {
        Self::new()
    }
}

impl Doctor {
    /// A doctor for the running system.
    pub fn new() -> Self {
        Self {
            topology: Topology::new(),
            node: PathBuf::from(DEVICE_NODE),
            boot: PathBuf::from(BOOT_ROOT),
        }
    }

    /// Reads sysfs, `/dev` and procfs through `topology`.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Opens the module at `node` instead of [`DEVICE_NODE`].
    pub fn node(mut self, node: impl Into<PathBuf>) -> Self {
        self.node = node.into();
        self
    }

    /// Looks for `config-<release>` in `boot` instead of [`BOOT_ROOT`].
    pub fn boot_root(mut self, boot: impl Into<PathBuf>) -> Self {
        self.boot = boot.into();
        self
    }

    /// The kernel's config: `/proc/config.gz` if the kernel has it, else
    /// `/boot/config-<release>`. The error says where it looked.
    pub fn kernel_config(&self) -> Result<KernelConfig, String> {
        let gz = self.topology.proc_root().join("config.gz");
        if gz.exists() {
            let mut text = String::new();
            return File::open(&gz)
                .and_then(|f| {
                    GzDecoder::new(f)
                        .take(MAX_KCONFIG)
                        .read_to_string(&mut text)
                })
                .map(|_| KernelConfig::parse(&gz, &text))
                .map_err(|e| format!("cannot read {}: {e}", gz.display()));
        }
        let release_path = self.topology.proc_root().join("sys/kernel/osrelease");
        let release = std::fs::read_to_string(&release_path)
            .map(|r| r.trim().to_string())
            .map_err(|e| {
                format!(
                    "no {} and cannot read {}: {e}",
                    gz.display(),
                    release_path.display()
                )
            })?;
        let boot = self.boot.join(format!("config-{release}"));
        let mut text = String::new();
        match File::open(&boot).and_then(|f| f.take(MAX_KCONFIG).read_to_string(&mut text)) {
            Ok(_) => Ok(KernelConfig::parse(&boot, &text)),
            Err(e) => Err(format!(
                "no {} (CONFIG_IKCONFIG_PROC) and no {}: {e}",
                gz.display(),
                boot.display()
            )),
        }
    }

    /// Examines the path from `storage` (a file, a block device or an NVMe
    /// generic device; `None` to look at the machine only) to the
    /// accelerator chosen by `accel`. It never fails: what cannot be found
    /// or read is a check that says so.
    pub fn run(&self, storage: Option<&FsPath>, accel: AccelSelect) -> Report {
        let mut checks = Vec::new();

        let kconfig = self.kernel_config();
        checks.push(kernel_config_check(&kconfig));
        let io_uring = kconfig.as_ref().ok().map(|c| c.enabled("CONFIG_IO_URING"));

        let loaded = self.topology.sys_root().join("module/p2pdma").exists();
        let module = Module::open_path(&self.node);
        checks.push(self.module_check(loaded, &module));
        checks.push(self.node_check(loaded, &module));
        let module = module.ok();

        let (accelerator, accel_check) = self.accelerator(module.as_ref(), accel);
        checks.push(accel_check);
        checks.push(p2p_memory_check(accelerator.as_ref()));
        let accel_pci = accelerator.as_ref().map(|a| a.pci).or(match accel {
            AccelSelect::Pci(p) => Some(p),
            _ => None,
        });

        let target = storage.map(|p| self.topology.resolve(p));
        checks.push(storage_check(storage, &target));
        let target = target.and_then(Result::ok);
        let storage_nvme = target.as_ref().is_some_and(|t| t.is_nvme);

        let (p2p, p2p_paths, p2p_check) = self.p2p(
            module.as_ref(),
            accelerator.as_ref(),
            target.as_ref().filter(|t| t.is_nvme),
        );
        checks.push(p2p_check);

        let accel_fn = accel_pci.and_then(|a| self.topology.pci_function(a).ok());
        let storage_fn = target
            .as_ref()
            .and_then(|t| t.pci)
            .and_then(|a| self.topology.pci_function(a).ok());
        checks.push(self.iommu_check(accel_fn.as_ref(), storage_fn.as_ref(), p2p.as_ref()));
        checks.push(self.acs_check(accel_fn.as_ref(), storage_fn.as_ref()));

        let (nvme_cmd, passthrough) = nvme_passthrough_check(target.as_ref(), io_uring);
        checks.push(passthrough);
        checks.push(self.queues_check());

        // AUTO's choice for memory allocated from the accelerator's BAR.
        let facts = Facts {
            pref: PathPref::Auto,
            submit: P2pSubmit::Auto,
            module: module.is_some(),
            accelerator: accelerator.is_some(),
            memory: MemoryFacts {
                kind: MemoryKind::ModuleBar {
                    index: accelerator.as_ref().map_or(0, |a| a.index),
                    // No accelerator: the rule stops at that, before the address.
                    pci: accel_pci.unwrap_or(PciAddress {
                        domain: 0,
                        bus: 0,
                        device: 0,
                        function: 0,
                    }),
                },
                cpu_mapping: true,
                module_allocation: true,
                block_io: module.as_ref().is_some_and(Module::has_block_io),
                dmabuf: false,
            },
            storage: StorageFacts {
                path: storage.map(FsPath::to_path_buf).unwrap_or_default(),
                is_file: target
                    .as_ref()
                    .is_some_and(|t| matches!(t.kind, TargetKind::File { .. })),
                nvme: storage_nvme,
                array: target.as_ref().and_then(|t| {
                    Some(ArrayFacts {
                        name: t.disk.clone(),
                        level: t.md.as_ref()?.level.clone(),
                    })
                }),
                fabric: target.as_ref().and_then(StorageTarget::fabric_path),
                ..StorageFacts::default()
            },
            p2p: p2p.clone(),
            paths: p2p_paths.clone(),
        };
        let cuda = gpus::cuda(&self.topology);
        let auto = |d: &CudaDevice| gpu_choice(&facts, d);
        checks.push(gpu_memory_check(
            &cuda,
            module.is_some(),
            kconfig.as_ref().ok(),
            storage
                .is_some()
                .then_some(&auto as &dyn Fn(&CudaDevice) -> PathChoice),
        ));
        checks.push(page_cache_check(storage));
        let path = decide(&facts).unwrap_or_else(|e| PathChoice {
            path: TransferPath::Bounce,
            reason: e.to_string(),
        });
        Report {
            checks,
            path,
            nvme_cmd,
            storage: target,
            accelerator,
            p2p,
            p2p_paths,
        }
    }

    /// Whether the library could drive an NVMe controller itself (the
    /// queues path): each controller, its driver and how its DMA would be
    /// translated. Never a failure: the path is taken only for a
    /// controller the caller hands to the library.
    fn queues_check(&self) -> Check {
        const NAME: &str = "nvme queues";
        let dir = self.topology.sys_root().join("bus/pci/devices");
        let mut ctrls: Vec<(PciFunction, IommuMode)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<PciAddress>().ok())
            .filter_map(|a| self.topology.pci_function(a).ok())
            .filter(|f| f.class == Some(NVME_CLASS))
            .map(|f| {
                let mode = IommuMode::of_in(
                    self.topology.sys_root(),
                    self.topology.dev_root(),
                    &f.address.to_string(),
                );
                (f, mode)
            })
            .collect();
        ctrls.sort_by_key(|(f, _)| f.address.to_string());
        if ctrls.is_empty() {
            return Check::new(NAME, Status::Skip, "no NVMe controller");
        }
        let list = ctrls
            .iter()
            .map(|(f, m)| {
                format!(
                    "{} ({}, {})",
                    f.address,
                    f.driver.as_deref().unwrap_or("no driver"),
                    m.short()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let usable = |d: &str| {
            ctrls
                .iter()
                .filter(|(f, m)| *m == IommuMode::NoIommu && f.driver.as_deref() == Some(d))
                .map(|(f, _)| f.address.to_string())
                .collect::<Vec<_>>()
        };
        let (vfio, nvme) = (usable("vfio-pci"), usable("nvme"));
        if !vfio.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                format!(
                    "{list}: the library can drive {} itself, queues in accelerator memory (queues::Controller::initialize, then StorageFile::namespace)",
                    vfio.join(", ")
                ),
            );
        }
        if !nvme.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                format!(
                    "{list}: the library can take {} from the nvme driver when asked to (InitOptions::unbind), once no filesystem uses its namespaces, and drive it itself",
                    nvme.join(", ")
                ),
            );
        }
        // None can be driven: why, for the first one.
        let why = ctrls
            .iter()
            .find(|(_, m)| *m != IommuMode::NoIommu)
            .map(|(_, m)| m.describe())
            .unwrap_or_else(|| "no controller is bound to nvme or vfio-pci".into());
        Check::new(
            NAME,
            Status::Skip,
            format!("{list}: the queues path cannot drive them: {why}"),
        )
    }

    fn module_check(&self, loaded: bool, module: &Result<Module, Error>) -> Check {
        const NAME: &str = "kernel module";
        let sys = self.topology.sys_root().join("module/p2pdma");
        if loaded {
            return Check::new(
                NAME,
                Status::Ok,
                format!("p2pdma is loaded ({})", sys.display()),
            );
        }
        if module.is_ok() {
            return Check::new(
                NAME,
                Status::Ok,
                format!(
                    "p2pdma answers on {} (no {} to show it loaded)",
                    self.node.display(),
                    sys.display()
                ),
            );
        }
        Check::new(
            NAME,
            Status::Fail,
            format!(
                "the p2pdma kernel module is not loaded (no {}): load it with `modprobe p2pdma` or `insmod p2pdma.ko`",
                sys.display()
            ),
        )
    }

    pub(super) fn node_check(&self, loaded: bool, module: &Result<Module, Error>) -> Check {
        const NAME: &str = "device node";
        let node = self.node.display();
        let e = match module {
            Ok(m) => {
                let v = m.version();
                return Check::new(
                    NAME,
                    Status::Ok,
                    format!(
                        "{node} is open: module ABI {} (serves >= {}), library ABI {}, {} device(s)",
                        v.abi_version,
                        v.abi_min_compat,
                        p2pdma_abi::P2PDMA_ABI_VERSION,
                        v.num_devices
                    ),
                );
            }
            Err(e) => e,
        };
        let detail = match (e, e.errno()) {
            (Error::AbiMismatch { .. }, _) => {
                format!("ABI mismatch: {e}; load the p2pdma module built with this library")
            }
            (_, Some(Errno::NOENT)) if loaded => format!(
                "{node} does not exist although the module is loaded: is devtmpfs mounted on /dev, or did udev remove the node?"
            ),
            (_, Some(Errno::NOENT)) => {
                format!("{node} does not exist: the p2pdma module is not loaded")
            }
            (_, Some(Errno::ACCESS | Errno::PERM)) => format!(
                "{node}: permission denied; add the user to the p2pdma group (`groupadd --system p2pdma`; udev/60-p2pdma.rules gives the node to that group, mode 0660) and log in again, or run as root"
            ),
            _ => e.to_string(),
        };
        Check::new(NAME, Status::Fail, detail)
    }

    fn accelerator(
        &self,
        module: Option<&Module>,
        select: AccelSelect,
    ) -> (Option<Accelerator>, Check) {
        const NAME: &str = "accelerator";
        let Some(module) = module else {
            let detail = match select {
                AccelSelect::Pci(p) => {
                    format!("needs the module's device node; {p} is used for the PCI checks below")
                }
                _ => "needs the module's device node".to_string(),
            };
            return (None, Check::new(NAME, Status::Skip, detail));
        };
        let found = match select {
            AccelSelect::Auto => module.accelerators().map(|v| v.into_iter().next()),
            AccelSelect::Index(i) => match module.accelerator(i) {
                Ok(a) => Ok(Some(a)),
                Err(e) if e.errno() == Some(Errno::NODEV) => Ok(None),
                Err(e) => Err(e),
            },
            AccelSelect::Pci(p) => module.find_accelerator(p),
        };
        match found {
            Ok(Some(a)) => {
                let how = match select {
                    AccelSelect::Auto => ", the first one bound",
                    _ => "",
                };
                let detail = format!(
                    "{} at {} [{:04x}:{:04x}]{how}, BAR {} of {}",
                    a.index,
                    a.pci,
                    a.vendor,
                    a.device,
                    a.bar,
                    bytes(a.bar_size)
                );
                (Some(a), Check::new(NAME, Status::Ok, detail))
            }
            Ok(None) => {
                let bound = module
                    .accelerators()
                    .map(|v| {
                        if v.is_empty() {
                            "none is bound".to_string()
                        } else {
                            let l: Vec<String> = v
                                .iter()
                                .map(|a| format!("{} ({})", a.index, a.pci))
                                .collect();
                            format!("bound: {}", l.join(", "))
                        }
                    })
                    .unwrap_or_else(|e| format!("listing them failed: {e}"));
                let detail = match select {
                    AccelSelect::Auto => "no accelerator is bound to the p2pdma module: give the module its vendor:device with ids=, or bind it through /sys/bus/pci/drivers/p2pdma/bind (see udev/61-p2pdma-bind.rules)".to_string(),
                    AccelSelect::Index(i) => format!("no accelerator at index {i} of the p2pdma module; {bound}"),
                    AccelSelect::Pci(p) => {
                        let driver = self
                            .topology
                            .pci_function(p)
                            .map(|f| match f.driver {
                                Some(d) => format!(" (it is bound to driver {d})"),
                                None => " (it is bound to no driver)".to_string(),
                            })
                            .unwrap_or_else(|_| " (no such PCI device)".to_string());
                        format!("{p} is not bound to the p2pdma module{driver}; {bound}")
                    }
                };
                (None, Check::new(NAME, Status::Fail, detail))
            }
            Err(e) => (None, Check::new(NAME, Status::Fail, e.to_string())),
        }
    }

    /// Asks the kernel whether the storage's controller (for a multipath
    /// namespace, each path's) can reach the accelerator's memory.
    #[allow(clippy::type_complexity)]
    fn p2p(
        &self,
        module: Option<&Module>,
        accel: Option<&Accelerator>,
        nvme: Option<&StorageTarget>,
    ) -> (Option<P2pQuery>, Vec<(NvmePath, Option<P2pQuery>)>, Check) {
        const NAME: &str = "p2p";
        let (Some(module), Some(accel), Some(t)) = (module, accel, nvme) else {
            return (
                None,
                Vec::new(),
                Check::new(
                    NAME,
                    Status::Skip,
                    "needs the module, an accelerator and NVMe storage",
                ),
            );
        };
        if t.is_multipath() || t.md.is_some() {
            let paths = query_paths(module, accel.index, &t.io_paths());
            let mut ok = true;
            let each: Vec<String> = paths
                .iter()
                .map(|(p, q)| match q {
                    Some(q) => {
                        ok &= allowed(q).is_ok();
                        let distance = q.distance.map_or("-".to_string(), |d| d.to_string());
                        format!(
                            "path {p}: kernel: {} ({}, distance {distance})",
                            q.reason, q.map_type
                        )
                    }
                    None => {
                        ok = false;
                        match p.transport.as_deref().and_then(Transport::p2p_refusal) {
                            Some(why) => format!("path {p}: {why}"),
                            None => format!("path {p}: no answer from the kernel"),
                        }
                    }
                })
                .collect();
            let status = if ok && !paths.is_empty() {
                Status::Ok
            } else {
                Status::Fail
            };
            let detail = match &t.md {
                Some(md) => format!(
                    "{} is an md array ({}) with {} member path(s) in its layout, all asked ({EVERY_MEMBER}): {}",
                    t.disk,
                    md.level,
                    paths.len(),
                    each.join("; ")
                ),
                None => format!(
                    "{} is a multipath namespace with {} paths, all asked ({EVERY_PATH}): {}",
                    t.disk,
                    paths.len(),
                    each.join("; ")
                ),
            };
            return (None, paths, Check::new(NAME, status, detail));
        }
        if let (None, Some(why)) = (t.pci, t.transport.as_ref().and_then(Transport::p2p_refusal)) {
            let path = t.io_paths().into_iter().next();
            let name = path.map_or_else(|| t.disk.clone(), |p| p.to_string());
            return (
                None,
                Vec::new(),
                Check::new(NAME, Status::Fail, format!("{name}: {why}")),
            );
        }
        let answer = match t.pci {
            Some(pci) => module.p2p_query(accel.index, Peer::Pci(pci)),
            None => match open(&t.disk_path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
                Ok(fd) => module.p2p_query(accel.index, Peer::Fd(fd.as_fd())),
                Err(e) => {
                    return (
                        None,
                        Vec::new(),
                        Check::new(
                            NAME,
                            Status::Fail,
                            format!(
                                "{} has no PCI function in sysfs, and opening {} to ask through it failed: {e}",
                                t.disk,
                                t.disk_path.display()
                            ),
                        ),
                    )
                }
            },
        };
        match answer {
            Ok(q) => {
                let distance = q.distance.map_or("-".to_string(), |d| d.to_string());
                let status = match q.map_type {
                    MapType::BusAddr | MapType::ThruHostBridge => Status::Ok,
                    MapType::NotSupported | MapType::Unknown(_) => Status::Fail,
                };
                let detail = format!("kernel: {} ({}, distance {distance})", q.reason, q.map_type);
                (Some(q), Vec::new(), Check::new(NAME, status, detail))
            }
            Err(e) => (
                None,
                Vec::new(),
                Check::new(NAME, Status::Fail, e.to_string()),
            ),
        }
    }

    fn iommu_check(
        &self,
        accel: Option<&PciFunction>,
        storage: Option<&PciFunction>,
        p2p: Option<&P2pQuery>,
    ) -> Check {
        const NAME: &str = "iommu";
        let groups = match self.topology.iommu_groups() {
            Ok(g) => g,
            Err(e) => return Check::new(NAME, Status::Skip, e.to_string()),
        };
        if groups.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                "no IOMMU groups: the IOMMU is off or absent, and DMA addresses are not translated",
            );
        }
        let group = |f: Option<&PciFunction>, what: &str| -> Option<String> {
            let f = f?;
            Some(match f.iommu_group {
                Some(g) => {
                    let ty = self
                        .topology
                        .iommu_group_type(g)
                        .map_or(String::new(), |t| format!(", {t}"));
                    format!("{what} {} in group {g}{ty}", f.address)
                }
                None => format!("{what} {} in no group", f.address),
            })
        };
        let mut detail = format!("IOMMU on ({} groups)", groups.len());
        let parts: Vec<String> = [group(accel, "accelerator"), group(storage, "NVMe")]
            .into_iter()
            .flatten()
            .collect();
        if !parts.is_empty() {
            detail.push_str("; ");
            detail.push_str(&parts.join(", "));
        }
        let mut status = Status::Ok;
        if let (Some(a), Some(s)) = (accel, storage) {
            if a.iommu_group.is_some() && a.iommu_group == s.iommu_group {
                detail.push_str(": one group, so nothing isolates them from each other");
            }
            if common_upstream(a, s).is_none() {
                let allowed = p2p.is_some_and(|q| q.map_type == MapType::ThruHostBridge);
                if allowed {
                    detail.push_str(
                        "; they meet only at a host bridge, which the kernel allows for P2P",
                    );
                } else {
                    status = Status::Warn;
                    detail.push_str(
                        "; they meet only at a host bridge, so P2P needs that bridge on the kernel's allowlist (some Intel Xeon root complexes, AMD Zen and later), or the two under one PCIe switch",
                    );
                }
            }
        }
        Check::new(NAME, status, detail)
    }

    fn acs_check(&self, accel: Option<&PciFunction>, storage: Option<&PciFunction>) -> Check {
        const NAME: &str = "acs";
        let (Some(a), Some(s)) = (accel, storage) else {
            return Check::new(
                NAME,
                Status::Skip,
                "needs the PCI functions of both the accelerator and the NVMe controller",
            );
        };
        let common = common_upstream(a, s);
        let path = acs_path(a, s);
        let mut seen = Vec::new();
        let mut redirecting = Vec::new();
        for f in &path {
            let config = match self.topology.pci_config(*f) {
                Ok(c) => c,
                Err(e) => return Check::new(NAME, Status::Skip, e.to_string()),
            };
            match acs_control(&config) {
                Err(_) => {
                    return Check::new(
                        NAME,
                        Status::Skip,
                        format!(
                            "cannot read the extended config space of {f} ({} bytes readable): reading it needs root",
                            config.len()
                        ),
                    )
                }
                Ok(None) => seen.push(format!("{f} no ACS")),
                Ok(Some(ctrl)) => {
                    seen.push(format!("{f} ACS {}", acs_bits(ctrl)));
                    if ctrl & PCI_ACS_REDIRECT != 0 {
                        redirecting.push((*f, ctrl));
                    }
                }
            }
        }
        let list = seen.join(", ");
        if common.is_none() {
            return Check::new(
                NAME,
                Status::Ok,
                format!("the devices share no upstream bridge, so their P2P goes through a host bridge whatever ACS says ({list})"),
            );
        }
        if redirecting.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                format!("no ACS redirect between them ({list})"),
            );
        }
        let names: Vec<String> = redirecting.iter().map(|(f, _)| f.to_string()).collect();
        let bits: Vec<String> = redirecting
            .iter()
            .map(|(f, c)| format!("{f} {}", acs_bits(c & PCI_ACS_REDIRECT)))
            .collect();
        Check::new(
            NAME,
            Status::Warn,
            format!(
                "ACS redirects P2P requests to the root complex ({}), so the kernel treats the path as through a host bridge; to turn it off, boot with pci=disable_acs_redir={}",
                bits.join(", "),
                names.join(";")
            ),
        )
    }
}
