//! The accelerators bound to the p2pdma kernel module, through its device
//! node.

use std::{
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use super::pci::PciAddress;
use crate::{sys, Error, Result};

/// Default path of the module's device node.
pub const DEVICE_NODE: &str = "/dev/p2pdma";

/// An open handle on the p2pdma kernel module.
///
/// Allocations and mappings belong to the open file: another [`Module`]
/// (another open, [`Module::reopen`]) can neither name nor reach them.
#[derive(Debug)]
pub struct Module {
    fd: OwnedFd,
    version: abi::P2pdmaVersion,
    path: PathBuf,
}

impl Module {
    /// Opens [`DEVICE_NODE`] and checks that the module's ABI is compatible.
    pub fn open() -> Result<Self> {
        Self::open_path(DEVICE_NODE)
    }

    /// Opens the module's device node at `path`.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let fd = open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).map_err(|source| {
            Error::Open {
                path: PathBuf::from(path),
                source,
            }
        })?;
        let version = sys::get_version(&fd).map_err(Error::ioctl("P2PDMA_IOC_GET_VERSION"))?;
        if version.abi_version < abi::P2PDMA_ABI_MIN_COMPAT
            || version.abi_min_compat > abi::P2PDMA_ABI_VERSION
        {
            return Err(Error::AbiMismatch {
                module: version.abi_version,
                library: abi::P2PDMA_ABI_VERSION,
                library_min: abi::P2PDMA_ABI_MIN_COMPAT,
            });
        }
        Ok(Self {
            fd,
            version,
            path: PathBuf::from(path),
        })
    }

    /// Opens the device node this module was opened by once more: a file of
    /// its own, whose allocations and mappings no handle or `mmap` offset of
    /// another file names.
    pub fn reopen(&self) -> Result<Self> {
        Self::open_path(&self.path)
    }

    /// The device node it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The module's version answer.
    pub fn version(&self) -> &abi::P2pdmaVersion {
        &self.version
    }

    /// Every accelerator bound to the module, by index.
    pub fn accelerators(&self) -> Result<Vec<Accelerator>> {
        let mut found = Vec::new();
        for index in 0..abi::P2PDMA_MAX_DEVICES {
            match sys::device_info(&self.fd, index) {
                Ok(info) => found.push(Accelerator::from(info)),
                Err(Errno::NODEV) => {}
                Err(source) => return Err(Error::ioctl("P2PDMA_IOC_DEVICE_INFO")(source)),
            }
        }
        Ok(found)
    }

    /// The accelerator at stable index `index` (`ENODEV` when none).
    pub fn accelerator(&self, index: u32) -> Result<Accelerator> {
        sys::device_info(&self.fd, index)
            .map(Accelerator::from)
            .map_err(Error::ioctl("P2PDMA_IOC_DEVICE_INFO"))
    }

    /// The accelerator at PCI address `pci`, if the module has it bound.
    pub fn find_accelerator(&self, pci: PciAddress) -> Result<Option<Accelerator>> {
        Ok(self.accelerators()?.into_iter().find(|a| a.pci == pci))
    }
}

impl AsFd for Module {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// An accelerator whose memory BAR the module registered as P2P memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accelerator {
    /// Stable index in the module.
    pub index: u32,
    /// PCI address.
    pub pci: PciAddress,
    /// PCI vendor ID.
    pub vendor: u16,
    /// PCI device ID.
    pub device: u16,
    /// The BAR registered as P2P memory.
    pub bar: u8,
    /// Its size in bytes.
    pub bar_size: u64,
    /// Its PCI bus address.
    pub bar_bus_addr: u64,
    /// Bytes registered as P2P memory.
    pub p2p_size: u64,
    /// Bytes still free.
    pub p2p_available: u64,
    /// NUMA node, if known.
    pub numa_node: Option<u32>,
}

impl Accelerator {
    /// The accelerator as JSON, the one shape the doctor and the tools
    /// print.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "index": self.index,
            "pci": self.pci.to_string(),
            "vendor": format!("{:04x}", self.vendor),
            "device": format!("{:04x}", self.device),
            "bar": self.bar,
            "bar_size": self.bar_size,
            "bar_bus_addr": self.bar_bus_addr,
            "p2p_size": self.p2p_size,
            "p2p_available": self.p2p_available,
            "numa_node": self.numa_node,
        })
    }
}

impl From<abi::P2pdmaDeviceInfo> for Accelerator {
    fn from(i: abi::P2pdmaDeviceInfo) -> Self {
        Self {
            index: i.index,
            pci: PciAddress::from_devfn(i.domain, i.bus, i.devfn),
            vendor: i.vendor,
            device: i.device,
            bar: i.bar,
            bar_size: i.bar_size,
            bar_bus_addr: i.bar_bus_addr,
            p2p_size: i.p2p_size,
            p2p_available: i.p2p_available,
            numa_node: u32::try_from(i.numa_node).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_node_is_a_clear_error() {
        let e = Module::open_path("/nonexistent/p2pdma").unwrap_err();
        assert_eq!(e.errno(), Some(Errno::NOENT));
        assert!(e.to_string().contains("/nonexistent/p2pdma"), "{e}");
    }

    #[test]
    fn an_accelerator_prints_as_one_json_shape() {
        let a = Accelerator::from(abi::P2pdmaDeviceInfo {
            domain: 0,
            bus: 4,
            devfn: 0,
            vendor: 0x1b36,
            device: 0x0010,
            bar: 2,
            bar_size: 1 << 30,
            numa_node: -1,
            ..Default::default()
        });
        let j = a.to_json();
        assert_eq!(j["pci"], "0000:04:00.0");
        assert_eq!(
            (j["vendor"].as_str(), j["device"].as_str()),
            (Some("1b36"), Some("0010"))
        );
        assert_eq!(
            (j["bar"].as_u64(), j["bar_size"].as_u64()),
            (Some(2), Some(1 << 30))
        );
        assert!(j["numa_node"].is_null());
        let keys: Vec<&String> = j.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 10, "{keys:?}");
    }
}
