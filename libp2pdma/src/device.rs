//! Discovery of the accelerators bound to the p2pdma kernel module.

use std::{
    fmt,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    str::FromStr,
};

use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use crate::{sys, Error, Result};

/// Default path of the module's device node.
pub const DEVICE_NODE: &str = "/dev/p2pdma";

/// An open handle on the p2pdma kernel module.
#[derive(Debug)]
pub struct Module {
    fd: OwnedFd,
    version: abi::P2pdmaVersion,
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
        Ok(Self { fd, version })
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

/// A PCI function's address, printed as `dddd:bb:dd.f`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// Domain (segment).
    pub domain: u32,
    /// Bus.
    pub bus: u8,
    /// Device (slot).
    pub device: u8,
    /// Function.
    pub function: u8,
}

impl PciAddress {
    /// `(device << 3) | function`, as the ABI carries it.
    pub fn devfn(&self) -> u8 {
        (self.device << 3) | (self.function & 7)
    }

    /// The address from the ABI's domain, bus and devfn fields.
    pub fn from_devfn(domain: u32, bus: u8, devfn: u8) -> Self {
        Self {
            domain,
            bus,
            device: devfn >> 3,
            function: devfn & 7,
        }
    }
}

impl FromStr for PciAddress {
    type Err = Error;

    /// Parses `dddd:bb:dd.f`, or `bb:dd.f` in domain 0 (hexadecimal, as
    /// sysfs and `lspci` print them).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidArgument(format!("{s:?} is not a PCI address (dddd:bb:dd.f)"));
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let mut parts = rest.rsplitn(3, ':');
        let device = parts.next().ok_or_else(bad)?;
        let bus = parts.next().ok_or_else(bad)?;
        let domain = parts.next().unwrap_or("0");
        let hex = |t: &str, max: u32| -> Result<u32> {
            if t.is_empty() || t.len() > 8 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            let v = u32::from_str_radix(t, 16).map_err(|_| bad())?;
            if v > max {
                return Err(bad());
            }
            Ok(v)
        };
        Ok(Self {
            domain: hex(domain, u32::MAX)?,
            bus: hex(bus, 0xff)? as u8,
            device: hex(device, 0x1f)? as u8,
            function: hex(function, 7)? as u8,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_address_formats_like_sysfs() {
        let a = Accelerator::from(abi::P2pdmaDeviceInfo {
            domain: 0,
            bus: 3,
            devfn: (0x1f << 3) | 5,
            numa_node: -1,
            ..Default::default()
        });
        assert_eq!(a.pci.to_string(), "0000:03:1f.5");
        assert_eq!(a.numa_node, None);
    }

    #[test]
    fn pci_addresses_parse_and_round_trip() {
        let a: PciAddress = "0000:03:1f.5".parse().unwrap();
        assert_eq!(a.to_string(), "0000:03:1f.5");
        assert_eq!(a.devfn(), (0x1f << 3) | 5);
        assert_eq!(PciAddress::from_devfn(0, 3, a.devfn()), a);
        let b: PciAddress = "3:00.1".parse().unwrap();
        assert_eq!(b.to_string(), "0000:03:00.1");
        let c: PciAddress = "10000:ff:00.0".parse().unwrap();
        assert_eq!(c.domain, 0x10000);
        for bad in [
            "",
            "0000:03:20.0",
            "0000:03:1f.8",
            "0000:100:00.0",
            "03:1f",
            "x:03:1f.0",
            "0000:03:1f.",
            "+3:00.0",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn missing_node_is_a_clear_error() {
        let e = Module::open_path("/nonexistent/p2pdma").unwrap_err();
        assert_eq!(e.errno(), Some(Errno::NOENT));
        assert!(e.to_string().contains("/nonexistent/p2pdma"), "{e}");
    }
}
