//! Taking an NVMe controller from the kernel, or refusing to, with the
//! reason: what uses it (a mounted filesystem, swap, a device-mapper or md
//! holder, another exclusive opener), which driver has it, and whether its
//! DMA would be translated by an IOMMU.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{discovery::controllers::controller_users, sys::vfio};

/// The PCI class of an NVMe controller (mass storage, NVM, NVMe).
pub const NVME_CLASS: u32 = 0x01_08_02;

fn pci_dev(bdf: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(bdf)
}

/// How the controller's DMA addresses would be translated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IommuMode {
    /// No IOMMU: VFIO's no-IOMMU mode, DMA addresses are bus addresses.
    NoIommu,
    /// No IOMMU, and VFIO's no-IOMMU mode is not enabled.
    NoIommuDisabled,
    /// An IOMMU translates the controller's DMA (group `group`).
    Translated {
        /// The IOMMU group.
        group: String,
    },
}

impl IommuMode {
    /// The mode for PCI function `bdf`, from sysfs.
    pub fn of(bdf: &str) -> Self {
        Self::of_in(Path::new("/sys"), Path::new("/dev"), bdf)
    }

    /// The same, with sysfs at `sys` and device nodes at `dev`.
    pub fn of_in(sys: &Path, dev: &Path, bdf: &str) -> Self {
        let iommus = fs::read_dir(sys.join("class/iommu")).map_or(0, |d| d.count());
        let group = fs::read_link(sys.join("bus/pci/devices").join(bdf).join("iommu_group"))
            .ok()
            .and_then(|g| g.file_name().map(|n| n.to_string_lossy().into_owned()));
        match group {
            // A group without an IOMMU driver is VFIO's own no-IOMMU group.
            Some(g) if iommus > 0 && !dev.join(format!("vfio/noiommu-{g}")).exists() => {
                Self::Translated { group: g }
            }
            _ if noiommu_enabled_in(sys) => Self::NoIommu,
            _ => Self::NoIommuDisabled,
        }
    }

    /// In a few words.
    pub fn short(&self) -> String {
        match self {
            Self::NoIommu => "no IOMMU, VFIO no-IOMMU mode on".into(),
            Self::NoIommuDisabled => "no IOMMU, VFIO no-IOMMU mode off".into(),
            Self::Translated { group } => format!("behind an IOMMU (group {group})"),
        }
    }

    /// In words, for the doctor and for refusals.
    pub fn describe(&self) -> String {
        match self {
            Self::NoIommu => {
                "no IOMMU; VFIO's no-IOMMU mode is enabled, so queues and data are reached by bus address".into()
            }
            Self::NoIommuDisabled => "no IOMMU, and VFIO's no-IOMMU mode is off (load vfio with enable_unsafe_noiommu_mode=1, or boot with vfio.enable_unsafe_noiommu_mode=1)".into(),
            Self::Translated { group } => format!(
                "an IOMMU translates its DMA (IOMMU group {group}); VFIO's type1 backend cannot map the module's accelerator memory: it pins pages with FOLL_LONGTERM but not FOLL_PCI_P2PDMA, so P2P pages are refused (EREMOTEIO), and the module's mapping is not VM_PFNMAP, so type1's PFN fallback is not tried. Queues in accelerator memory behind an IOMMU need the module to export its memory as a dma-buf that iommufd maps (IOMMU_IOAS_MAP_FILE) or as a VM_PFNMAP mapping"
            ),
        }
    }
}

/// Whether VFIO's no-IOMMU mode is enabled.
pub fn noiommu_enabled() -> bool {
    noiommu_enabled_in(Path::new("/sys"))
}

/// The same, with sysfs at `sys`.
pub fn noiommu_enabled_in(sys: &Path) -> bool {
    fs::read_to_string(sys.join("module/vfio/parameters/enable_unsafe_noiommu_mode"))
        .is_ok_and(|s| matches!(s.trim(), "Y" | "1"))
}

/// The driver bound to PCI function `bdf`, if any.
pub use vfio::driver_of;

/// Checks that PCI function `bdf` is an NVMe controller this process may
/// take, and moves it to `vfio-pci` when `unbind` allows taking it from
/// its driver. Refuses, touching nothing, a controller whose namespaces
/// are in use (even with `unbind`), one a driver other than `vfio-pci`
/// has (without `unbind`), and one whose DMA an IOMMU translates.
pub fn take(bdf: &str, unbind: bool) -> Result<IommuMode, String> {
    let dev = pci_dev(bdf);
    let class =
        fs::read_to_string(dev.join("class")).map_err(|e| format!("no PCI function {bdf}: {e}"))?;
    let class = u32::from_str_radix(class.trim().trim_start_matches("0x"), 16).unwrap_or(0);
    if class != NVME_CLASS {
        return Err(format!(
            "{bdf} is not an NVMe controller (PCI class {class:#08x})"
        ));
    }
    let mode = IommuMode::of(bdf);
    if mode != IommuMode::NoIommu {
        return Err(format!(
            "cannot be driven from user space here: {}",
            mode.describe()
        ));
    }
    match driver_of(bdf).as_deref() {
        Some("vfio-pci") => return Ok(mode),
        Some(driver) => {
            let used = controller_users(bdf);
            if !used.is_empty() {
                return Err(format!(
                    "in use, not taken from the {driver} driver: {}",
                    used.join("; ")
                ));
            }
            if !unbind {
                return Err(format!(
                    "the kernel's {driver} driver has it; ask for it to be unbound (InitOptions::unbind) to give it to this process"
                ));
            }
        }
        None => {}
    }
    vfio::bind_to(bdf, "vfio-pci")?;
    Ok(IommuMode::of(bdf))
}

/// Gives PCI function `bdf` back to its default driver (the kernel's nvme
/// driver), for after the library is done with it.
pub fn give_back(bdf: &str) -> Result<String, String> {
    vfio::bind_default(bdf)
}
