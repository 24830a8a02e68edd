// SPDX-License-Identifier: GPL-2.0

//! PCI functions: the accelerator's BARs and P2PDMA registration, peers
//! named by address, and the bus notifier that tells the module when a PCI
//! device loses its driver.
//!
//! Upstream's `kernel::pci` has no P2PDMA calls, no bus address, location or
//! NUMA node accessors, no upstream-bridge walk and no bus notifier.

use core::{
    marker::PhantomData,
    ptr::NonNull, //
};

use kernel::{
    bindings,
    device,
    error::to_result,
    ffi::{
        c_int,
        c_ulong,
        c_void, //
    },
    pci,
    prelude::*,
    sync::aref::ARef,
    types::Opaque, //
};

mod raw {
    use kernel::{
        bindings,
        ffi::{
            c_int,
            c_uint, //
        },
    };

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: `pci_resource_flags`, `pci_bus_address`,
        // `pci_domain_nr`, `dev_to_node`, `dma_get_max_seg_size` and
        // `pci_upstream_bridge` are macros or static inlines.
        pub(super) fn p2pdma_helper_bar_kind(pdev: *mut bindings::pci_dev, bar: c_int) -> u32;
        pub(super) fn p2pdma_helper_bar_bus_addr(pdev: *mut bindings::pci_dev, bar: c_int) -> u64;
        pub(super) fn p2pdma_helper_location(
            pdev: *mut bindings::pci_dev,
            domain: *mut u32,
            bus: *mut u8,
            devfn: *mut u8,
        );
        pub(super) fn p2pdma_helper_numa_node(pdev: *mut bindings::pci_dev) -> c_int;
        pub(super) fn p2pdma_helper_max_seg_size(pdev: *mut bindings::pci_dev) -> c_uint;
        pub(super) fn p2pdma_helper_upstream_bridge(
            pdev: *mut bindings::pci_dev,
        ) -> *mut bindings::pci_dev;
    }
}

/// The BAR decodes memory (not I/O ports).
pub(crate) const BAR_MEM: u32 = 1;
/// The BAR is 64-bit.
pub(crate) const BAR_MEM_64: u32 = 2;
/// The BAR is prefetchable.
pub(crate) const BAR_PREFETCH: u32 = 4;

/// Number of standard BARs of a PCI function.
pub(crate) const NUM_BARS: u32 = 6;

/// Returns the `struct pci_dev` behind `pdev`.
///
/// `pci::Device::as_raw` is private upstream; `pci::Device` is
/// `#[repr(transparent)]` over `Opaque<bindings::pci_dev>`, so the cast is the
/// same pointer.
pub(super) fn raw_pdev<Ctx: device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
) -> *mut bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// The `struct device` embedded in `pdev`.
pub(super) fn raw_dev<Ctx: device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
) -> *mut bindings::device {
    // SAFETY: `pdev` is a valid `struct pci_dev`; this only computes the
    // address of its `dev` field.
    unsafe { &raw mut (*raw_pdev(pdev)).dev }
}

/// Registers `bar` of `pdev` as P2PDMA memory (`pci_p2pdma_add_resource`).
///
/// The pages are device-managed: they go away when the driver unbinds.
pub(crate) fn p2pdma_add_resource(pdev: &pci::Device<device::Core<'_>>, bar: u32) -> Result {
    let bar = c_int::try_from(bar)?;
    // SAFETY: `pdev` is a bound device (Core context), as the devres-managed
    // registration requires; size 0 means the whole BAR.
    to_result(unsafe { bindings::pci_p2pdma_add_resource(raw_pdev(pdev), bar, 0, 0) })
}

/// Publishes (or withdraws) `pdev`'s P2P memory for other kernel users
/// (`pci_p2pmem_publish`).
pub(crate) fn p2pmem_publish(pdev: &pci::Device<device::Core<'_>>, publish: bool) {
    // SAFETY: `pdev` is a valid, bound PCI device.
    unsafe { bindings::pci_p2pmem_publish(raw_pdev(pdev), publish) }
}

/// Enables the device (its memory and I/O decoding; not bus mastering,
/// which the accelerator's own DMA engine would need and this driver does
/// not use) for as long as the driver stays bound (`pcim_enable_device`;
/// upstream's `enable_device_mem` has no managed counterpart).
pub(crate) fn pcim_enable_device(pdev: &pci::Device<device::Core<'_>>) -> Result {
    // SAFETY: `pdev` is a bound device, as the managed variant requires.
    to_result(unsafe { bindings::pcim_enable_device(raw_pdev(pdev)) })
}

/// Declares that the accelerator takes DMA segments of any length
/// (`dma_set_max_seg_size`): the PCI core's default of 64 KiB is a guess for
/// devices whose driver says nothing.
pub(crate) fn set_max_seg_size(pdev: &pci::Device<device::Core<'_>>) {
    // SAFETY: Called from probe, before any DMA mapping for the device is
    // made through this driver; `dma_parms` of a PCI device always exist.
    unsafe { bindings::dma_set_max_seg_size(raw_dev(pdev), u32::MAX) }
}

/// Facts about one BAR of a PCI device.
pub(crate) struct BarInfo {
    /// `BAR_*` bits.
    pub(crate) kind: u32,
    /// Size in bytes, 0 when the BAR is not implemented.
    pub(crate) len: u64,
    /// PCI bus address of the BAR's start.
    pub(crate) bus_addr: u64,
}

/// Describes BAR `bar` (< [`NUM_BARS`]) of `pdev`.
pub(crate) fn bar_info(pdev: &pci::Device, bar: u32) -> BarInfo {
    let bar = bar.min(NUM_BARS - 1);
    let len = pdev.resource_len(bar).unwrap_or(0);
    let raw = raw_pdev(pdev);
    // SAFETY: `pdev` is valid and `bar` is a standard BAR index.
    unsafe {
        BarInfo {
            kind: raw::p2pdma_helper_bar_kind(raw, bar as c_int),
            len,
            bus_addr: raw::p2pdma_helper_bar_bus_addr(raw, bar as c_int),
        }
    }
}

/// PCI domain, bus and devfn of `pdev`.
pub(crate) fn location<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>) -> (u32, u8, u8) {
    let (mut domain, mut bus, mut devfn) = (0u32, 0u8, 0u8);
    // SAFETY: `pdev` is valid and the out pointers point to live locals.
    unsafe { raw::p2pdma_helper_location(raw_pdev(pdev), &mut domain, &mut bus, &mut devfn) };
    (domain, bus, devfn)
}

/// NUMA node of `pdev`, -1 when none.
pub(crate) fn numa_node<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>) -> i32 {
    // SAFETY: `pdev` is valid.
    unsafe { raw::p2pdma_helper_numa_node(raw_pdev(pdev)) }
}

/// Longest DMA segment `pdev` accepts (`dma_get_max_seg_size`).
pub(crate) fn max_seg_size(pdev: &pci::Device) -> u64 {
    // SAFETY: `pdev` is valid.
    u64::from(unsafe { raw::p2pdma_helper_max_seg_size(raw_pdev(pdev)) })
}

/// A PCI function some memory is mapped for.
#[derive(Clone)]
pub(crate) struct Peer(pub(crate) ARef<pci::Device>);

impl Peer {
    /// The PCI function at an address.
    pub(crate) fn from_address(domain: u32, bus: u8, devfn: u8) -> Result<Self> {
        // SAFETY: Looks up a device; returns it referenced or NULL.
        let p = unsafe {
            bindings::pci_get_domain_bus_and_slot(domain as c_int, bus.into(), devfn.into())
        };
        Self::from_raw(p).ok_or(ENODEV)
    }

    pub(super) fn from_raw(p: *mut bindings::pci_dev) -> Option<Self> {
        let p = NonNull::new(p.cast::<pci::Device>())?;
        // SAFETY: The callers pass a PCI device with a reference we now own;
        // `pci::Device` is transparent over `struct pci_dev`.
        Some(Self(unsafe { ARef::from_raw(p) }))
    }

    /// The peer's PCI location.
    pub(crate) fn location(&self) -> (u32, u8, u8) {
        location(&*self.0)
    }

    /// The kernel's P2P distance from `provider` to this peer
    /// (`pci_p2pdma_distance_many`), `None` when the kernel refuses P2P.
    pub(crate) fn distance(&self, provider: &pci::Device) -> Option<u32> {
        let mut dev = raw_dev(&*self.0);
        // SAFETY: Both are valid PCI devices; one client in the array.
        let d =
            unsafe { bindings::pci_p2pdma_distance_many(raw_pdev(provider), &mut dev, 1, false) };
        u32::try_from(d).ok()
    }

    /// The lowest bridge upstream of both this peer and `other`.
    pub(crate) fn common_upstream(&self, other: &pci::Device) -> Option<(u32, u8, u8)> {
        // SAFETY: `p` is a valid PCI device; its upstream bridges are kept
        // alive by it (a device holds its parent).
        let up = |p: *mut bindings::pci_dev| unsafe { raw::p2pdma_helper_upstream_bridge(p) };
        let mut x = up(raw_pdev(&*self.0));
        while !x.is_null() {
            let mut y = up(raw_pdev(other));
            while !y.is_null() {
                if x == y {
                    // SAFETY: A bridge upstream of both, alive while they
                    // are; `pci::Device` is transparent over `struct pci_dev`.
                    return Some(location(unsafe { &*x.cast::<pci::Device>() }));
                }
                y = up(y);
            }
            x = up(x);
        }
        None
    }

    /// Whether `other` is the same PCI function.
    pub(crate) fn same_as(&self, other: &Peer) -> bool {
        core::ptr::eq::<pci::Device>(&*self.0, &*other.0)
    }

    /// Whether a process drives this function (its driver is vfio-pci):
    /// its DMA stops only when that process stops it or releases it.
    pub(crate) fn driven_from_user_space(&self) -> bool {
        // SAFETY: `self.0` is a valid, referenced PCI device. Its driver
        // pointer changes only when a driver binds or unbinds, and is read
        // once; a bound driver's `struct device_driver` (with its name)
        // lives as long as its module, which cannot go while bound.
        unsafe {
            let drv = core::ptr::read_volatile(&(*raw_pdev(&*self.0)).dev.driver);
            !drv.is_null()
                && !(*drv).name.is_null()
                && CStr::from_char_ptr((*drv).name) == c"vfio-pci"
        }
    }

    /// Longest DMA segment this peer accepts.
    pub(crate) fn max_seg_size(&self) -> u64 {
        max_seg_size(&self.0)
    }

    /// Whether this is a bridge (PCI class 0x06: host, ISA, PCI-to-PCI
    /// bridges and the ports of switches), which masters no DMA of its own.
    pub(crate) fn is_bridge(&self) -> bool {
        // SAFETY: `self.0` is a valid, referenced PCI device; `class` is set
        // when the device is enumerated and never changes.
        let class = unsafe { (*raw_pdev(&*self.0)).class };
        class >> 16 == bindings::PCI_BASE_CLASS_BRIDGE
    }
}

/// What the module does when a PCI device appears, starts losing its
/// driver or going away, when that is over, and when it is gone.
pub(crate) trait PeerEvents: 'static {
    /// `pdev` is on the bus: added now, or already there when the watch
    /// started (an error then stops the watch from starting). It comes
    /// before any unbind or removal of the device.
    fn peer_added(pdev: &pci::Device) -> Result;

    /// `pdev` starts losing its driver or going away (`going`), or is
    /// getting a driver again (`!going`).
    fn peer_going(pdev: &pci::Device, going: bool);

    /// `pdev`'s driver is done with it (its remove returned), or `pdev` is
    /// gone; it stays going until a driver binds it again.
    fn peer_unbound(pdev: &pci::Device);

    /// `pdev` left the bus (after its last `peer_unbound`).
    fn peer_removed(pdev: &pci::Device);
}

/// Keeps `T` told about PCI devices losing their driver (a notifier on the
/// PCI bus) while it lives. Upstream has no bus notifier abstraction.
///
/// # Invariants
///
/// `nb` is registered on the PCI bus from initialisation until drop.
#[pin_data(PinnedDrop)]
pub(crate) struct PeerWatch<T: PeerEvents> {
    #[pin]
    nb: Opaque<bindings::notifier_block>,
    _events: PhantomData<T>,
}

// SAFETY: The notifier block is only touched by the kernel's notifier
// chain, under its own lock, and by `drop`.
unsafe impl<T: PeerEvents> Send for PeerWatch<T> {}
// SAFETY: See above; shared access touches nothing.
unsafe impl<T: PeerEvents> Sync for PeerWatch<T> {}

impl<T: PeerEvents> PeerWatch<T> {
    /// Starts watching: from the notifier's registration on, `T` is told of
    /// each device added; then of each device already there (a device
    /// added meanwhile may be told twice).
    pub(crate) fn new() -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            nb <- Opaque::try_ffi_init(|nb: *mut bindings::notifier_block| {
                // SAFETY: `nb` is valid for writes and pinned: it stays at
                // this address until `drop` unregisters it. INVARIANT: it is
                // registered here, or the initialisation fails (and it is
                // unregistered again).
                unsafe {
                    nb.write(bindings::notifier_block {
                        notifier_call: Some(Self::bus_event),
                        next: core::ptr::null_mut(),
                        // Ahead of the notifiers registered at boot with
                        // priority 0: at `UNBOUND_DRIVER` the mappings for
                        // the device are gone before DMA-API debugging
                        // looks for ones its driver left, and at
                        // `REMOVED_DEVICE` before the IOMMU layer releases
                        // the device.
                        priority: 1,
                    });
                    to_result(bindings::bus_register_notifier(&bindings::pci_bus_type, nb))?;
                    let each = to_result(bindings::bus_for_each_dev(
                        &bindings::pci_bus_type,
                        core::ptr::null_mut(),
                        core::ptr::null_mut(),
                        Some(Self::each_device),
                    ));
                    if each.is_err() {
                        bindings::bus_unregister_notifier(&bindings::pci_bus_type, nb);
                    }
                    each
                }
            }),
            _events: PhantomData,
        })
    }

    /// `bus_for_each_dev`'s callback: tells `T` of a device on the bus.
    ///
    /// # Safety
    ///
    /// Called by `bus_for_each_dev` on the PCI bus, with `dev` a device on
    /// that bus, referenced during the call.
    unsafe extern "C" fn each_device(dev: *mut bindings::device, _data: *mut c_void) -> c_int {
        // SAFETY: `dev` is the `dev` field of a `struct pci_dev`, alive
        // during the callback; `pci::Device` is transparent over it.
        let pdev =
            unsafe { &*kernel::container_of!(dev, bindings::pci_dev, dev).cast::<pci::Device>() };
        match T::peer_added(pdev) {
            Ok(()) => 0,
            Err(e) => e.to_errno(),
        }
    }

    /// The notifier's callback: a PCI device was added, is about to lose
    /// its driver, or to go away (its DMA mappings must go, and none may be
    /// made for it until that is over), that is over, or it is gone.
    ///
    /// # Safety
    ///
    /// Called by the PCI bus's notifier chain, with `data` a device on that
    /// bus.
    unsafe extern "C" fn bus_event(
        _nb: *mut bindings::notifier_block,
        action: c_ulong,
        data: *mut c_void,
    ) -> c_int {
        let dev = data.cast::<bindings::device>();
        // SAFETY: `dev` is the `dev` field of a `struct pci_dev` (every
        // device on the PCI bus is one), alive during the callback;
        // `pci::Device` is transparent over `struct pci_dev`.
        let pdev = || unsafe {
            &*kernel::container_of!(dev, bindings::pci_dev, dev).cast::<pci::Device>()
        };
        match u32::try_from(action) {
            // A device the module could not note stays unknown to it: no
            // mapping depends on it, and none can (see `PeerEvents`).
            Ok(bindings::bus_notifier_event_BUS_NOTIFY_ADD_DEVICE) => {
                let _ = T::peer_added(pdev());
            }
            Ok(
                bindings::bus_notifier_event_BUS_NOTIFY_UNBIND_DRIVER
                | bindings::bus_notifier_event_BUS_NOTIFY_DEL_DEVICE,
            ) => T::peer_going(pdev(), true),
            Ok(bindings::bus_notifier_event_BUS_NOTIFY_UNBOUND_DRIVER) => T::peer_unbound(pdev()),
            Ok(bindings::bus_notifier_event_BUS_NOTIFY_REMOVED_DEVICE) => {
                T::peer_unbound(pdev());
                T::peer_removed(pdev());
            }
            // Only now may mappings depend on it again: not between its
            // unbind's end and DMA-API debugging's look for mappings its
            // driver left, which runs after this notifier.
            Ok(bindings::bus_notifier_event_BUS_NOTIFY_BIND_DRIVER) => {
                T::peer_going(pdev(), false)
            }
            _ => {}
        }
        bindings::NOTIFY_DONE as c_int
    }
}

#[pinned_drop]
impl<T: PeerEvents> PinnedDrop for PeerWatch<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: Registered at initialisation (type invariant).
        unsafe { bindings::bus_unregister_notifier(&bindings::pci_bus_type, self.nb.get()) };
    }
}
