//! The checks that judge one fact each: the kernel config, the
//! accelerator's P2P memory, the storage and NVMe passthrough.

use std::{
    os::fd::AsFd,
    path::{Path as FsPath, PathBuf},
};

use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use super::{
    kconfig::KernelConfig,
    report::{bytes, Check, Status},
};
use crate::{
    discovery::{CudaDevice, CudaFacts, StorageTarget, TargetKind, Transport},
    memory::MemoryKind,
    sys::cuda::version_string,
    transfer::plan::{decide, Facts, MemoryFacts, PathChoice, TransferPath},
    Accelerator,
};

/// Below this much free P2P memory the doctor warns.
const LOW_P2P_MEMORY: u64 = 4 << 20;

pub(super) fn kernel_config_check(kconfig: &Result<KernelConfig, String>) -> Check {
    const NAME: &str = "kernel config";
    let c = match kconfig {
        Ok(c) => c,
        Err(why) => return Check::new(NAME, Status::Skip, format!("{why}; cannot tell")),
    };
    let opts = ["CONFIG_PCI_P2PDMA", "CONFIG_ZONE_DEVICE", "CONFIG_IO_URING"];
    let described: Vec<String> = opts.iter().map(|o| c.describe(o)).collect();
    let mut detail = format!("{} ({})", described.join(", "), c.source.display());
    let status = if !c.enabled("CONFIG_PCI_P2PDMA") || !c.enabled("CONFIG_ZONE_DEVICE") {
        detail.push_str(": this kernel cannot do P2P DMA (it needs CONFIG_PCI_P2PDMA=y, which needs CONFIG_ZONE_DEVICE)");
        Status::Fail
    } else if !c.enabled("CONFIG_IO_URING") {
        detail.push_str(": no io_uring, so no NVMe passthrough commands");
        Status::Warn
    } else {
        Status::Ok
    };
    Check::new(NAME, status, detail)
}

pub(super) fn p2p_memory_check(accel: Option<&Accelerator>) -> Check {
    const NAME: &str = "p2p memory";
    let Some(a) = accel else {
        return Check::new(NAME, Status::Skip, "needs an accelerator");
    };
    let of = format!(
        "{} of {} free (BAR {}, {}, bus address {:#x})",
        bytes(a.p2p_available),
        bytes(a.p2p_size),
        a.bar,
        bytes(a.bar_size),
        a.bar_bus_addr
    );
    if a.p2p_size == 0 {
        Check::new(
            NAME,
            Status::Fail,
            format!("nothing of BAR {} is registered as P2P memory", a.bar),
        )
    } else if a.p2p_available == 0 {
        Check::new(
            NAME,
            Status::Warn,
            format!("{of}: all in use, so allocations fail until some are freed"),
        )
    } else if a.p2p_available < LOW_P2P_MEMORY {
        Check::new(
            NAME,
            Status::Warn,
            format!("{of}: little left for transfer buffers"),
        )
    } else {
        Check::new(NAME, Status::Ok, of)
    }
}

pub(super) fn storage_check(
    given: Option<&FsPath>,
    target: &Option<Result<StorageTarget, crate::discovery::TopologyError>>,
) -> Check {
    const NAME: &str = "storage";
    let (Some(given), Some(target)) = (given, target) else {
        return Check::new(NAME, Status::Skip, "no storage path given");
    };
    let t = match target {
        Ok(t) => t,
        Err(e) => return Check::new(NAME, Status::Fail, e.to_string()),
    };
    let on = match (&t.kind, &t.partition) {
        (TargetKind::File { .. }, Some(p)) => {
            format!("lives on partition {} of disk {}", p.name, t.disk)
        }
        (TargetKind::File { .. }, None) => format!("lives on disk {}", t.disk),
        (TargetKind::BlockDevice, Some(p)) => format!("is partition {} of disk {}", p.name, t.disk),
        (TargetKind::BlockDevice, None) => format!("is disk {}", t.disk),
        (TargetKind::NvmeGeneric, _) => format!("is the generic device of disk {}", t.disk),
    };
    if !t.is_nvme {
        let under = if t.slaves.is_empty() {
            String::new()
        } else {
            format!(" (built on {})", t.slaves.join(", "))
        };
        return Check::new(
            NAME,
            Status::Fail,
            format!(
                "{} {on}{under}, not an NVMe namespace: P2P DMA needs NVMe",
                given.display()
            ),
        );
    }
    let mut detail = format!("{} {on}", given.display());
    if let Some(nsid) = t.nsid {
        detail.push_str(&format!(", namespace {nsid}"));
    }
    let pci = if t.is_multipath() {
        let paths: Vec<String> = t.multipath.iter().map(|p| p.to_string()).collect();
        detail.push_str(&format!(
            ", a multipath namespace with {} paths: {}",
            paths.len(),
            paths.join(", ")
        ));
        let all = t.multipath.iter().all(|p| p.pci.is_some());
        if !all
            && !t
                .multipath
                .iter()
                .any(|p| p.transport.as_deref().is_some_and(Transport::is_fabric))
        {
            detail.push_str("; a path without a PCI function, over no transport sysfs names");
        }
        all
    } else {
        if let Some(c) = &t.controller {
            detail.push_str(&format!(" of {c}"));
        }
        let fabric = t.transport.as_ref().filter(|tr| tr.is_fabric());
        match (t.pci, fabric) {
            (_, Some(tr)) => {
                detail.push_str(&format!(" {}", tr.route()));
                if let Some(nqn) = &tr.subsysnqn {
                    detail.push_str(&format!(", subsystem {nqn}"));
                }
                if let Some(state) = &tr.state {
                    detail.push_str(&format!(" ({state})"));
                }
            }
            (Some(p), None) => detail.push_str(&format!(" at {p}")),
            (None, None) => {
                detail.push_str(", with no PCI function in sysfs and no transport it names")
            }
        }
        t.pci.is_some()
    };
    detail.push_str(&format!(
        "; {}-byte blocks, at most {} a command",
        t.logical_block_size,
        bytes(t.max_transfer_bytes)
    ));
    if let Some(p) = &t.partition {
        detail.push_str(&format!("; the partition starts at byte {}", p.start));
    }
    let status = if pci { Status::Ok } else { Status::Warn };
    Check::new(NAME, status, detail)
}

/// Whether NVMe commands through the generic device would work: the device
/// exists and can be opened, and the kernel has io_uring.
pub(super) fn nvme_passthrough_check(
    target: Option<&StorageTarget>,
    io_uring: Option<bool>,
) -> (Option<PathBuf>, Check) {
    const NAME: &str = "nvme passthrough";
    let Some(t) = target.filter(|t| t.is_nvme) else {
        return (None, Check::new(NAME, Status::Skip, "needs NVMe storage"));
    };
    let Some(ng) = &t.generic_path else {
        return (
            None,
            Check::new(
                NAME,
                Status::Skip,
                format!(
                    "no NVMe generic character device for {} (kernels before 5.13 have none)",
                    t.disk
                ),
            ),
        );
    };
    if let Some(why) = t.nvme_cmd_refusal() {
        return (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!("NVMe commands through {} refused: {why}", ng.display()),
            ),
        );
    }
    match open(ng, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(_) if io_uring == Some(false) => (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!(
                    "{} opens, but the kernel has no io_uring, which NVMe passthrough needs",
                    ng.display()
                ),
            ),
        ),
        Ok(_) => {
            // For a file, the filesystem must be one whose extents NVMe
            // commands can address (the engine's own rule).
            let file = match t.kind {
                TargetKind::File { .. } => match std::fs::File::open(&t.path) {
                    Ok(f) => crate::transfer::exec::extents::Filesystem::of(f.as_fd()).map(|fs| {
                        format!("; for a file ({fs}), reads only (writes to files go by P2P or the bounce path): its extents are mapped to blocks with FIEMAP first")
                    }),
                    Err(_) => Ok("; for a file, reads only: its extents are mapped to blocks first".into()),
                },
                _ => Ok(String::new()),
            };
            match file {
                Ok(file) => (
                    Some(ng.clone()),
                    Check::new(
                        NAME,
                        Status::Ok,
                        format!(
                            "{} opens: NVMe commands through io_uring passthrough are possible, used only when asked for{file}",
                            ng.display()
                        ),
                    ),
                ),
                Err(why) => (
                    None,
                    Check::new(
                        NAME,
                        Status::Warn,
                        format!(
                            "{} opens, but NVMe commands cannot address {}: {why}",
                            ng.display(),
                            t.path.display()
                        ),
                    ),
                ),
            }
        }
        Err(e @ (Errno::ACCESS | Errno::PERM)) => (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!(
                    "{} exists but cannot be opened ({e}): NVMe passthrough needs read access to it (root, or a udev rule for the nvme-generic class)",
                    ng.display()
                ),
            ),
        ),
        Err(e) => (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!("cannot open {}: {e}", ng.display()),
            ),
        ),
    }
}

/// GPU memory through CUDA: the driver and its devices, and whether a peer
/// (an NVMe controller this process drives) can reach the memory by P2P
/// through the dma-buf the driver exports, which the module imports.
///
/// `auto`, given storage, is the path rule's choice for transfers between it
/// and each GPU's memory ([`gpu_choice`]).
pub(super) fn gpu_memory_check(
    cuda: &Result<CudaFacts, String>,
    module: bool,
    kconfig: Option<&KernelConfig>,
    auto: Option<&dyn Fn(&CudaDevice) -> PathChoice>,
) -> Check {
    const NAME: &str = "gpu memory";
    let facts = match cuda {
        Ok(f) => f,
        Err(why) => {
            return Check::new(
                NAME,
                Status::Skip,
                format!("{why}: no GPU memory through CUDA here"),
            )
        }
    };
    if facts.devices.is_empty() {
        return Check::new(NAME, Status::Skip, "the CUDA driver sees no device");
    }
    let devices: Vec<String> = facts
        .devices
        .iter()
        .map(|d| {
            let pci = d.pci.map(|p| format!(" ({p})")).unwrap_or_default();
            format!(
                "{} {}{pci}, {}, dma-buf export {}",
                d.ordinal,
                d.name,
                bytes(d.total_memory),
                if d.dma_buf { "yes" } else { "no" }
            )
        })
        .collect();
    let kernel = facts
        .kernel_driver
        .as_deref()
        .unwrap_or("no /proc/driver/nvidia/version");
    let mut detail = format!(
        "CUDA driver {} ({kernel}); GPU {}; copies by the GPU's copy engine through page-locked host slots",
        version_string(facts.driver_version),
        devices.join("; GPU ")
    );
    let p2pdma = kconfig.map(|c| c.enabled("CONFIG_PCI_P2PDMA"));
    let mut missing = Vec::new();
    if !facts.devices.iter().any(|d| d.dma_buf) {
        missing.push("a GPU that exports dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)");
    }
    if !facts.open_kernel_module() {
        missing.push(
            "NVIDIA's open kernel module (its dma-buf exporter gives peers the GPU's memory)",
        );
    }
    if !module {
        missing.push("the p2pdma module (DMABUF_IMPORT)");
    }
    match p2pdma {
        Some(false) => missing.push("a kernel with CONFIG_PCI_P2PDMA"),
        None => missing.push("a kernel config that can be read (CONFIG_PCI_P2PDMA)"),
        Some(true) => {}
    }
    if let Some(auto) = auto {
        for d in &facts.devices {
            let c = auto(d);
            detail.push_str(&format!(
                "; GPU {} with the storage given: {} ({})",
                d.ordinal, c.path, c.reason
            ));
        }
    }
    let status = if missing.is_empty() {
        detail.push_str("; P2P into GPU memory: the queues path (an NVMe controller this process drives through VFIO) imports its dma-buf for the controller, where the PCIe topology allows");
        Status::Ok
    } else {
        detail.push_str(&format!(
            "; no P2P into GPU memory, which needs {}: storage reaches it through the bounce path",
            missing.join(", ")
        ));
        Status::Warn
    };
    Check::new(NAME, status, detail)
}

/// The path rule's choice for transfers between the storage of `bar` (the
/// facts for the accelerator's BAR memory) and GPU `d`'s memory.
pub(super) fn gpu_choice(bar: &Facts, d: &CudaDevice) -> PathChoice {
    let facts = Facts {
        memory: MemoryFacts {
            kind: MemoryKind::Cuda {
                ordinal: d.ordinal,
                pci: d.pci,
            },
            cpu_mapping: false,
            module_allocation: false,
            block_io: false,
            dmabuf: d.dma_buf,
        },
        ..bar.clone()
    };
    decide(&facts).unwrap_or_else(|e| PathChoice {
        path: TransferPath::Bounce,
        reason: e.to_string(),
    })
}

/// Whether reads can ask the kernel what of a range the page cache holds
/// (`cachestat(2)`, Linux 6.5+), and what AUTO does with it, on `storage`
/// when given.
pub(super) fn page_cache_check(storage: Option<&FsPath>) -> Check {
    const NAME: &str = "page cache";
    let Some(path) = storage else {
        return Check::new(NAME, Status::Skip, "no storage given");
    };
    let fd = match open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => {
            return Check::new(
                NAME,
                Status::Skip,
                format!("cannot open {}: {e}", path.display()),
            )
        }
    };
    const SPAN: u64 = 64 << 20;
    let uses = "reads take cached pages from the page cache and the rest by the path chosen (P2PDMA_PAGE_CACHE=direct moves every byte by the path, buffered every byte through the page cache)";
    match crate::sys::file::cachestat(fd.as_fd(), 0, SPAN) {
        Ok(c) => Check::new(
            NAME,
            Status::Ok,
            format!(
                "cachestat answers ({} of the first {} pages of {} cached now); {uses}",
                c.nr_cache,
                SPAN / 4096,
                path.display()
            ),
        ),
        Err(Errno::NOSYS) => Check::new(
            NAME,
            Status::Warn,
            format!("the kernel has no cachestat (Linux 6.5+): reads find cached pages with mincore, three system calls each; {uses}"),
        ),
        Err(e) => Check::new(
            NAME,
            Status::Warn,
            format!("cachestat on {} fails ({e}): reads find cached pages with mincore; {uses}", path.display()),
        ),
    }
}
