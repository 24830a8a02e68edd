// SPDX-License-Identifier: GPL-2.0

//! The accelerator PCI driver: binds devices, registers one memory BAR of
//! each as kernel P2PDMA memory, and keeps a registry of bound devices with
//! stable indices.

use kernel::{
    device::Core,
    pci,
    prelude::*, //
};

use crate::{
    ffi,
    uapi, //
};

/// Largest number of devices tracked at once.
const MAX_DEVICES: usize = uapi::P2PDMA_MAX_DEVICES as usize;

/// A bound accelerator.
pub(crate) struct AccelDev {
    /// What `DEVICE_INFO` reports, without the per-call fields.
    pub(crate) info: uapi::P2pdmaDeviceInfo,
}

/// Bound devices, indexed by their stable index.
pub(crate) struct Registry {
    slots: [Option<AccelDev>; MAX_DEVICES],
}

impl Registry {
    const fn new() -> Self {
        Self {
            slots: [const { None }; MAX_DEVICES],
        }
    }

    /// The device at `index`, if one is bound there.
    pub(crate) fn get(&self, index: usize) -> Option<&AccelDev> {
        self.slots.get(index)?.as_ref()
    }

    /// Number of bound devices.
    pub(crate) fn count(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Puts `dev` in the lowest free slot and returns its index.
    fn insert(&mut self, mut dev: AccelDev) -> Result<usize> {
        let index = self.slots.iter().position(Option::is_none).ok_or(ENOSPC)?;
        dev.info.index = index as u32;
        self.slots[index] = Some(dev);
        Ok(index)
    }

    fn remove(&mut self, index: usize) -> Option<AccelDev> {
        self.slots.get_mut(index)?.take()
    }
}

kernel::sync::global_lock! {
    // SAFETY: Initialized by the module initializer before the PCI driver or
    // the misc device are registered, so before any use.
    pub(crate) unsafe(uninit) static DEVICES: Mutex<Registry> = Registry::new();
}

/// Picks the BAR to register: the `bar=` parameter if set, otherwise the
/// largest 64-bit prefetchable memory BAR (the one GPUs expose their memory
/// through), otherwise the largest memory BAR.
fn choose_bar(pdev: &pci::Device<Core<'_>>) -> Result<u32> {
    if let Some(bar) = ffi::param_bar() {
        let info = ffi::bar_info(pdev, bar.min(ffi::NUM_BARS - 1));
        if bar >= ffi::NUM_BARS || info.kind & ffi::BAR_MEM == 0 || info.len == 0 {
            dev_err!(pdev, "bar={} is not a memory BAR of this device\n", bar);
            return Err(EINVAL);
        }
        return Ok(bar);
    }
    let score = |bar: u32| {
        let info = ffi::bar_info(pdev, bar);
        let wanted = ffi::BAR_MEM | ffi::BAR_MEM_64 | ffi::BAR_PREFETCH;
        if info.kind & ffi::BAR_MEM == 0 || info.len == 0 {
            None
        } else {
            Some((info.kind & wanted == wanted, info.len))
        }
    };
    (0..ffi::NUM_BARS)
        .filter_map(|bar| score(bar).map(|s| (s, bar)))
        .max_by_key(|&(s, _)| s)
        .map(|(_, bar)| bar)
        .ok_or(ENODEV)
}

/// Driver data of a bound accelerator.
pub(crate) struct AccelData {
    index: usize,
}

/// The accelerator PCI driver.
pub(crate) struct AccelDriver;

kernel::pci_device_table!(
    PCI_TABLE,
    <AccelDriver as pci::Driver>::IdInfo,
    [
        // QEMU's ivshmem-plain: shared host memory behind BAR 2, the rig's
        // stand-in for accelerator memory.
        (pci::DeviceId::from_id(pci::Vendor::REDHAT_QUMRANET, 0x1110), ()),
    ]
);

impl pci::Driver for AccelDriver {
    type IdInfo = ();
    type Data<'bound> = AccelData;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        let bar = choose_bar(pdev)?;
        let bar_info = ffi::bar_info(pdev, bar);
        ffi::pcim_enable_device(pdev)?;
        ffi::p2pdma_add_resource(pdev, bar).inspect_err(|e| {
            dev_err!(pdev, "cannot register BAR {} as P2P memory: {:?}\n", bar, e);
        })?;
        ffi::p2pmem_publish(pdev, true);

        let (domain, bus, devfn) = ffi::location(pdev);
        let info = uapi::P2pdmaDeviceInfo {
            domain,
            bus,
            devfn,
            bar: bar as u8,
            vendor: pdev.vendor_id().as_raw(),
            device: pdev.device_id(),
            numa_node: ffi::numa_node(pdev),
            bar_size: bar_info.len,
            bar_bus_addr: bar_info.bus_addr,
            p2p_size: bar_info.len,
            ..Default::default()
        };
        let index = DEVICES.lock().insert(AccelDev { info })?;
        dev_info!(
            pdev,
            "p2pdma device {}: BAR {} ({} MiB at bus address {:#x}) registered as P2P memory\n",
            index,
            bar,
            bar_info.len >> 20,
            bar_info.bus_addr
        );
        Ok(AccelData { index })
    }

    fn unbind<'bound>(pdev: &'bound pci::Device<Core<'_>>, this: Pin<&Self::Data<'bound>>) {
        ffi::p2pmem_publish(pdev, false);
        DEVICES.lock().remove(this.index);
        dev_info!(pdev, "p2pdma device {} unbound\n", this.index);
    }
}
