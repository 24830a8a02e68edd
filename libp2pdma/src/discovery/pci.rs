//! PCI functions as sysfs shows them: addresses, upstream bridges, the ACS
//! capability in config space, and the functions that provide P2P memory.

use std::{fmt, str::FromStr};

use serde_json::json;

use crate::{Error, Result};

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
pub(super) const EXT_CONFIG_END: usize = 0x1000;

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

#[cfg(test)]
mod tests {
    use p2pdma_abi as abi;

    use super::*;
    use crate::discovery::Accelerator;

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
}
