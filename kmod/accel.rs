// SPDX-License-Identifier: GPL-2.0

//! The accelerator PCI driver: binds devices, registers one memory BAR of
//! each as kernel P2PDMA memory, and keeps a registry of bound devices with
//! stable indices.

use kernel::{
    device::Core,
    pci,
    prelude::*,
    sync::{
        aref::ARef,
        Arc, //
    },
};

use crate::{
    dma,
    ffi::{
        self,
        mm::PAGE_SIZE,
        p2pmem::P2pPages,
        pci::{
            BAR_MEM,
            BAR_MEM_64,
            BAR_PREFETCH,
            NUM_BARS, //
        },
    },
    memory::Alloc,
    uapi, //
};

/// Largest number of devices tracked at once.
const MAX_DEVICES: usize = uapi::P2PDMA_MAX_DEVICES as usize;

/// A bound accelerator.
pub(crate) struct AccelDev {
    /// The PCI device.
    pub(crate) pdev: ARef<pci::Device>,
    /// What `DEVICE_INFO` reports, without the per-call fields.
    pub(crate) info: uapi::P2pdmaDeviceInfo,
    /// Allocations from this device that hold its memory (owned by a file,
    /// or freed but still mapped), revoked when it unbinds.
    pub(crate) allocs: KVec<Arc<Alloc>>,
    /// One page of the device's memory, mapped for a peer to learn what the
    /// kernel's DMA API decides for it (`P2P_QUERY`).
    pub(crate) probe: Arc<P2pPages>,
}

impl AccelDev {
    /// Bytes held by allocations, and by the probe page.
    pub(crate) fn allocated(&self) -> u64 {
        let held: u64 = self
            .allocs
            .iter()
            .filter(|a| a.holds_pages())
            .map(|a| a.size)
            .sum();
        held + self.probe.size() as u64
    }

    /// Bytes held by allocations charged to `uid`.
    pub(crate) fn held_by(&self, uid: u32) -> u64 {
        self.allocs
            .iter()
            .filter(|a| a.uid == uid && a.holds_pages())
            .map(|a| a.size)
            .sum()
    }
}

/// Bound devices, indexed by their stable index, and the counters that give
/// out handles and mmap offsets.
pub(crate) struct Registry {
    slots: [Option<AccelDev>; MAX_DEVICES],
    next_handle: u64,
    next_pgoff: u64,
}

impl Registry {
    const fn new() -> Self {
        Self {
            slots: [const { None }; MAX_DEVICES],
            next_handle: 1,
            next_pgoff: 0,
        }
    }

    /// The device at `index`, if one is bound there.
    pub(crate) fn get(&self, index: usize) -> Option<&AccelDev> {
        self.slots.get(index)?.as_ref()
    }

    /// The device at `index`, mutably.
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut AccelDev> {
        self.slots.get_mut(index)?.as_mut()
    }

    /// A handle never given out before.
    pub(crate) fn new_handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// `npages` of mmap offset space never given out before.
    pub(crate) fn new_pgoff(&mut self, npages: u64) -> Result<u64> {
        let p = self.next_pgoff;
        // mmap offsets are signed 64-bit byte offsets.
        let end = p.checked_add(npages).ok_or(ENOSPC)?;
        if end > (i64::MAX as u64) / PAGE_SIZE {
            return Err(ENOSPC);
        }
        self.next_pgoff = end;
        Ok(p)
    }

    /// Forgets `alloc` in its device's list, if the device is still there.
    pub(crate) fn forget(&mut self, alloc: &Arc<Alloc>) {
        if let Some(dev) = self.get_mut(alloc.dev_index) {
            if let Some(i) = dev.allocs.iter().position(|a| Arc::ptr_eq(a, alloc)) {
                let _ = dev.allocs.remove(i);
            }
        }
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

/// Forgets `alloc` in its device's list of allocations, once it holds no
/// memory (see [`Alloc::new`]).
pub(crate) fn unlist(alloc: &Arc<Alloc>) {
    DEVICES.lock().forget(alloc);
}

/// Picks the BAR to register: the `bar=` parameter if set, otherwise the
/// largest 64-bit prefetchable memory BAR (the one GPUs expose their memory
/// through), otherwise the largest memory BAR.
fn choose_bar(pdev: &pci::Device<Core<'_>>) -> Result<u32> {
    if let Some(bar) = ffi::param::bar() {
        let info = ffi::pci::bar_info(pdev, bar.min(NUM_BARS - 1));
        if bar >= NUM_BARS || info.kind & BAR_MEM == 0 || info.len == 0 {
            dev_err!(pdev, "bar={} is not a memory BAR of this device\n", bar);
            return Err(EINVAL);
        }
        return Ok(bar);
    }
    let score = |bar: u32| {
        let info = ffi::pci::bar_info(pdev, bar);
        let wanted = BAR_MEM | BAR_MEM_64 | BAR_PREFETCH;
        if info.kind & BAR_MEM == 0 || info.len == 0 {
            None
        } else {
            Some((info.kind & wanted == wanted, info.len))
        }
    };
    (0..NUM_BARS)
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
        (
            pci::DeviceId::from_id(pci::Vendor::REDHAT_QUMRANET, 0x1110),
            ()
        ),
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
        let bar_info = ffi::pci::bar_info(pdev, bar);
        ffi::pci::pcim_enable_device(pdev)?;
        ffi::pci::p2pdma_add_resource(pdev, bar).inspect_err(|e| {
            dev_err!(pdev, "cannot register BAR {} as P2P memory: {:?}\n", bar, e);
        })?;
        ffi::pci::set_max_seg_size(pdev);
        let pdev_ref: &pci::Device = pdev;
        let pdev_ref: ARef<pci::Device> = pdev_ref.into();
        let probe = Arc::new(P2pPages::alloc(&pdev_ref, PAGE_SIZE as usize)?, GFP_KERNEL)?;
        ffi::pci::p2pmem_publish(pdev, true);

        let (domain, bus, devfn) = ffi::pci::location(pdev);
        let info = uapi::P2pdmaDeviceInfo {
            domain,
            bus,
            devfn,
            bar: bar as u8,
            vendor: pdev.vendor_id().as_raw(),
            device: pdev.device_id(),
            numa_node: ffi::pci::numa_node(pdev),
            bar_size: bar_info.len,
            bar_bus_addr: bar_info.bus_addr,
            p2p_size: bar_info.len,
            ..Default::default()
        };
        let index = DEVICES.lock().insert(AccelDev {
            pdev: pdev_ref,
            info,
            allocs: KVec::new(),
            probe,
        })?;
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
        ffi::pci::p2pmem_publish(pdev, false);
        // Out of the registry first: new ioctls on it get ENODEV.
        let dev = DEVICES.lock().remove(this.index);
        // Every DMA mapping of its memory, or made for it as a peer, goes
        // (the bus notifier revoked those for peers only kernel drivers
        // drive already; it is idempotent); then every
        // allocation, user mappings included, before the P2PDMA core tears
        // the pages down (it waits for all page references). Pins held by
        // in-flight I/O drop when the I/O completes.
        let pdev_ref: &pci::Device = pdev;
        // A peer that a process drives may still be writing to its memory:
        // its owner stops it first (the bus notifier told it).
        dma::await_user_peers(pdev_ref);
        dma::revoke_peer(core::ptr::from_ref(pdev_ref).cast());
        let revoked = dev.as_ref().map_or(0, |d| d.allocs.len());
        if let Some(dev) = dev {
            for alloc in &dev.allocs {
                alloc.revoke();
            }
        }
        dev_info!(
            pdev,
            "p2pdma device {} unbound, {} allocation(s) revoked\n",
            this.index,
            revoked
        );
    }
}
