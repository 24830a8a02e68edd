// SPDX-License-Identifier: GPL-2.0

//! Kernel interfaces that the kernel's Rust abstractions do not cover yet.
//!
//! Every raw declaration lives in the private `raw` module below; the rest of
//! the module only calls the safe wrappers here. Each wrapper names the
//! upstream abstraction it stands in for.

use core::ptr::NonNull;

use kernel::{
    bindings,
    device,
    error::to_result,
    ffi::{
        c_char,
        c_int,
        c_void, //
    },
    fs::File,
    mm::virt::VmaNew,
    pci,
    prelude::*,
    sync::aref::ARef,
};

mod raw {
    use kernel::{
        bindings,
        ffi::{
            c_char,
            c_int,
            c_uint,
            c_ulong,
            c_void, //
        },
    };

    #[expect(
        improper_ctypes,
        reason = "struct pci_dev is only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // include/linux/pci-p2pdma.h, which the kernel's bindings do not include.
        pub(super) fn pci_p2pdma_add_resource(
            pdev: *mut bindings::pci_dev,
            bar: c_int,
            size: usize,
            offset: u64,
        ) -> c_int;
        pub(super) fn pci_p2pmem_publish(pdev: *mut bindings::pci_dev, publish: bool);

        // include/linux/pci.h; exported, not in the Rust bindings.
        pub(super) fn pcim_enable_device(pdev: *mut bindings::pci_dev) -> c_int;

        // helpers.c: static inline functions, macros and module parameters.
        pub(super) fn p2pdma_helper_param_bar() -> c_int;
        pub(super) fn p2pdma_helper_add_param_ids(drv_name: *const c_char) -> c_int;
        pub(super) fn p2pdma_helper_bar_kind(pdev: *mut bindings::pci_dev, bar: c_int) -> u32;
        pub(super) fn p2pdma_helper_bar_len(pdev: *mut bindings::pci_dev, bar: c_int) -> u64;
        pub(super) fn p2pdma_helper_bar_bus_addr(pdev: *mut bindings::pci_dev, bar: c_int)
            -> u64;
        pub(super) fn p2pdma_helper_location(
            pdev: *mut bindings::pci_dev,
            domain: *mut u32,
            bus: *mut u8,
            devfn: *mut u8,
        );
        pub(super) fn p2pdma_helper_numa_node(pdev: *mut bindings::pci_dev) -> c_int;
        pub(super) fn p2pdma_helper_capable_rawio() -> bool;
        pub(super) fn p2pdma_helper_current_tgid_get() -> *mut bindings::pid;
        pub(super) fn p2pdma_helper_is_current_tgid(pid: *mut bindings::pid) -> bool;
        pub(super) fn p2pdma_helper_put_pid(pid: *mut bindings::pid);

        // P2P memory pages and their user mappings.
        pub(super) fn p2pdma_helper_alloc(pdev: *mut bindings::pci_dev, size: usize) -> *mut c_void;
        pub(super) fn p2pdma_helper_put_pages(kaddr: *mut c_void, size: usize);
        pub(super) fn pci_p2pmem_virt_to_bus(pdev: *mut bindings::pci_dev, kaddr: *mut c_void)
            -> u64;
        pub(super) fn p2pdma_helper_virt_to_phys(kaddr: *mut c_void) -> u64;
        pub(super) fn p2pdma_helper_vma_pgoff(vma: *mut bindings::vm_area_struct) -> c_ulong;
        pub(super) fn p2pdma_helper_vma_shared(vma: *mut bindings::vm_area_struct) -> bool;
        pub(super) fn p2pdma_helper_insert_pages(
            vma: *mut bindings::vm_area_struct,
            kaddr: *mut c_void,
            npages: c_ulong,
        ) -> c_int;
        pub(super) fn p2pdma_helper_file_mapping(file: *mut bindings::file)
            -> *mut bindings::address_space;
        pub(super) fn p2pdma_helper_zap(mapping: *mut bindings::address_space, offset: u64, len: u64);

        // Peers.
        pub(super) fn p2pdma_helper_peer_from_fd(fd: c_int, err: *mut c_int)
            -> *mut bindings::pci_dev;
        pub(super) fn p2pdma_helper_peer_from_address(domain: u32, bus: u8, devfn: u8)
            -> *mut bindings::pci_dev;
        pub(super) fn p2pdma_helper_common_upstream(
            a: *mut bindings::pci_dev,
            b: *mut bindings::pci_dev,
        ) -> *mut bindings::pci_dev;
        pub(super) fn p2pdma_helper_distance(
            provider: *mut bindings::pci_dev,
            client: *mut bindings::pci_dev,
        ) -> c_int;

        // DMA mappings for peers.
        pub(super) fn p2pdma_helper_map_resource(
            peer: *mut bindings::pci_dev,
            phys: u64,
            len: u64,
            err: *mut c_int,
        ) -> u64;
        pub(super) fn p2pdma_helper_unmap_resource(peer: *mut bindings::pci_dev, addr: u64, len: u64);
        pub(super) fn p2pdma_helper_pin_user(
            peer: *mut bindings::pci_dev,
            va: u64,
            len: u64,
            err: *mut c_int,
        ) -> *mut SgMapRaw;
        pub(super) fn p2pdma_helper_dmabuf_import(
            peer: *mut bindings::pci_dev,
            fd: c_int,
            err: *mut c_int,
        ) -> *mut SgMapRaw;
        pub(super) fn p2pdma_helper_sgmap_len(m: *mut SgMapRaw) -> u64;
        pub(super) fn p2pdma_helper_sgmap_segs(
            m: *mut SgMapRaw,
            addrs: *mut u64,
            lens: *mut u64,
            max: c_uint,
        ) -> c_uint;
        pub(super) fn p2pdma_helper_sgmap_release(m: *mut SgMapRaw);
    }

    /// `struct p2pdma_sgmap` of helpers.c, only handled by pointer.
    #[repr(C)]
    pub(crate) struct SgMapRaw {
        _opaque: [u8; 0],
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
fn raw_pdev<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>) -> *mut bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// Registers `bar` of `pdev` as P2PDMA memory (`pci_p2pdma_add_resource`).
///
/// The pages are device-managed: they go away when the driver unbinds.
pub(crate) fn p2pdma_add_resource(pdev: &pci::Device<device::Core<'_>>, bar: u32) -> Result {
    let bar = c_int::try_from(bar)?;
    // SAFETY: `pdev` is a bound device (Core context), as the devres-managed
    // registration requires; size 0 means the whole BAR.
    to_result(unsafe { raw::pci_p2pdma_add_resource(raw_pdev(pdev), bar, 0, 0) })
}

/// Publishes (or withdraws) `pdev`'s P2P memory for other kernel users
/// (`pci_p2pmem_publish`).
pub(crate) fn p2pmem_publish(pdev: &pci::Device<device::Core<'_>>, publish: bool) {
    // SAFETY: `pdev` is a valid, bound PCI device.
    unsafe { raw::pci_p2pmem_publish(raw_pdev(pdev), publish) }
}

/// Enables the device's memory decoding and bus mastering for as long as the
/// driver stays bound (`pcim_enable_device`; upstream's `enable_device_mem`
/// has no disable counterpart).
pub(crate) fn pcim_enable_device(pdev: &pci::Device<device::Core<'_>>) -> Result {
    // SAFETY: `pdev` is a bound device, as the managed variant requires.
    to_result(unsafe { raw::pcim_enable_device(raw_pdev(pdev)) })
}

/// The `bar=` module parameter, `None` when not set.
pub(crate) fn param_bar() -> Option<u32> {
    // SAFETY: Reads a module parameter that is only written at load time.
    let bar = unsafe { raw::p2pdma_helper_param_bar() };
    u32::try_from(bar).ok()
}

/// Adds the IDs of the `ids=` module parameter to the PCI driver `name`.
pub(crate) fn add_param_ids(name: &CStr) -> Result {
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    to_result(unsafe { raw::p2pdma_helper_add_param_ids(name.as_char_ptr().cast::<c_char>()) })
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
pub(crate) fn bar_info<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>, bar: u32) -> BarInfo {
    let pdev = raw_pdev(pdev);
    let bar = bar.min(NUM_BARS - 1) as c_int;
    // SAFETY: `pdev` is valid and `bar` is a standard BAR index.
    unsafe {
        BarInfo {
            kind: raw::p2pdma_helper_bar_kind(pdev, bar),
            len: raw::p2pdma_helper_bar_len(pdev, bar),
            bus_addr: raw::p2pdma_helper_bar_bus_addr(pdev, bar),
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

/// Whether the caller has `CAP_SYS_RAWIO` (no upstream wrapper for `capable`).
pub(crate) fn capable_rawio() -> bool {
    // SAFETY: `capable` only inspects the current task's credentials.
    unsafe { raw::p2pdma_helper_capable_rawio() }
}

/// A thread group (process), identified by its `struct pid`, which is
/// reference-counted and never reused while referenced, unlike a pid number.
/// (`Task::tgid` has no such guarantee, and read garbage on this kernel.)
///
/// # Invariants
///
/// Holds a reference on the `struct pid`.
pub(crate) struct ThreadGroup(NonNull<bindings::pid>);

// SAFETY: A `struct pid` reference may be dropped from any thread.
unsafe impl Send for ThreadGroup {}
// SAFETY: Comparing pointers is thread-safe.
unsafe impl Sync for ThreadGroup {}

impl ThreadGroup {
    /// The calling process.
    pub(crate) fn current() -> Result<Self> {
        // SAFETY: Takes a reference on the current task's thread-group pid.
        NonNull::new(unsafe { raw::p2pdma_helper_current_tgid_get() })
            .map(Self)
            .ok_or(ESRCH)
    }

    /// Whether the calling thread belongs to this process.
    pub(crate) fn is_current(&self) -> bool {
        // SAFETY: By the type invariant the pid is alive.
        unsafe { raw::p2pdma_helper_is_current_tgid(self.0.as_ptr()) }
    }
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `current`.
        unsafe { raw::p2pdma_helper_put_pid(self.0.as_ptr()) }
    }
}

/// Bytes in a page.
pub(crate) const PAGE_SIZE: u64 = kernel::page::PAGE_SIZE as u64;

/// A range of P2P memory allocated from an accelerator's BAR, holding one
/// reference on each of its pages (see helpers.c). Dropping it drops those
/// references; each page returns to the device's pool once no mapping or pin
/// holds it either. Upstream has no P2PDMA abstraction.
///
/// # Invariants
///
/// `kaddr` is the kernel address of `size` bytes (a page multiple) of P2P
/// memory of `pdev`, on each page of which this object holds one reference.
pub(crate) struct P2pPages {
    pdev: ARef<pci::Device>,
    kaddr: NonNull<c_void>,
    size: usize,
}

// SAFETY: The pages are device memory with no thread affinity; the page
// references may be dropped from any thread.
unsafe impl Send for P2pPages {}
// SAFETY: Shared access only reads the fields.
unsafe impl Sync for P2pPages {}

impl P2pPages {
    /// Allocates `size` bytes (a page multiple) of `pdev`'s P2P memory.
    pub(crate) fn alloc(pdev: &ARef<pci::Device>, size: usize) -> Result<Self> {
        // SAFETY: `pdev` is a valid PCI device with registered P2P memory
        // (or none, in which case the call fails).
        let kaddr = unsafe { raw::p2pdma_helper_alloc(raw_pdev(pdev), size) };
        let kaddr = NonNull::new(kaddr).ok_or(ENOMEM)?;
        // INVARIANT: The helper allocated `size` bytes and took one reference
        // per page.
        Ok(Self {
            pdev: pdev.clone(),
            kaddr,
            size,
        })
    }

    /// Splits off the pages outside `[offset, offset + len)`, dropping them.
    pub(crate) fn trim(self, offset: usize, len: usize) -> Self {
        let this = core::mem::ManuallyDrop::new(self);
        let base = this.kaddr.as_ptr().cast::<u8>();
        // SAFETY: `offset` and `len` are page multiples within the allocation,
        // so both trimmed ends are whole pages this object references.
        unsafe {
            if offset > 0 {
                raw::p2pdma_helper_put_pages(base.cast(), offset);
            }
            let tail = offset + len;
            if tail < this.size {
                raw::p2pdma_helper_put_pages(base.add(tail).cast(), this.size - tail);
            }
        }
        // SAFETY: `this` is not used again; its `pdev` reference moves out.
        let pdev = unsafe { core::ptr::read(&this.pdev) };
        Self {
            pdev,
            // SAFETY: `offset` is within the allocation.
            kaddr: unsafe { NonNull::new_unchecked(base.add(offset).cast()) },
            size: len,
        }
    }

    /// Bytes held.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// PCI bus address of byte `offset`.
    pub(crate) fn bus_addr(&self, offset: usize) -> u64 {
        // SAFETY: `kaddr + offset` lies in P2P memory of `pdev` (callers pass
        // offsets within the allocation).
        unsafe {
            raw::pci_p2pmem_virt_to_bus(
                raw_pdev(&self.pdev),
                self.kaddr.as_ptr().cast::<u8>().add(offset).cast(),
            )
        }
    }

    /// CPU physical address of byte `offset`.
    pub(crate) fn phys_addr(&self, offset: usize) -> u64 {
        // SAFETY: As for `bus_addr`.
        unsafe {
            raw::p2pdma_helper_virt_to_phys(self.kaddr.as_ptr().cast::<u8>().add(offset).cast())
        }
    }

    /// The accelerator the memory belongs to.
    pub(crate) fn pdev(&self) -> &ARef<pci::Device> {
        &self.pdev
    }

    /// Maps `npages` pages from `first_page` into `vma`, write-combined.
    pub(crate) fn insert_into(&self, vma: &VmaNew, first_page: usize, npages: usize) -> Result {
        if (first_page + npages) as u64 * PAGE_SIZE > self.size as u64 {
            return Err(EINVAL);
        }
        // SAFETY: `vma` is being set up by this file's mmap; the pages are
        // within the allocation, which stays referenced during the call.
        to_result(unsafe {
            raw::p2pdma_helper_insert_pages(
                vma.as_ptr(),
                self.kaddr
                    .as_ptr()
                    .cast::<u8>()
                    .add(first_page * PAGE_SIZE as usize)
                    .cast(),
                npages as _,
            )
        })
    }
}

impl Drop for P2pPages {
    fn drop(&mut self) {
        // SAFETY: By the type invariant this object holds one reference on
        // each page; it gives them up exactly once, here.
        unsafe { raw::p2pdma_helper_put_pages(self.kaddr.as_ptr(), self.size) };
    }
}

/// The `vm_pgoff` and whether it is a shared mapping (`VmaNew` has neither).
pub(crate) fn vma_pgoff_shared(vma: &VmaNew) -> (u64, bool) {
    // SAFETY: `vma` is a valid VMA under construction.
    unsafe {
        (
            raw::p2pdma_helper_vma_pgoff(vma.as_ptr()) as u64,
            raw::p2pdma_helper_vma_shared(vma.as_ptr()),
        )
    }
}

/// The page cache mapping (`f_mapping`) of an open file; user mappings of the
/// file are reached through it.
///
/// # Invariants
///
/// Points to the `address_space` of an open file of this module; every user
/// of it runs while that file is open.
#[derive(Clone, Copy)]
pub(crate) struct FileMapping(NonNull<bindings::address_space>);

// SAFETY: An `address_space` may be used from any thread.
unsafe impl Send for FileMapping {}
// SAFETY: See above.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// The mapping of `file`.
    pub(crate) fn of(file: &File) -> Result<Self> {
        // SAFETY: `file` is a valid open file.
        let m = unsafe { raw::p2pdma_helper_file_mapping(file.as_ptr()) };
        NonNull::new(m).map(Self).ok_or(EINVAL)
    }

    /// Removes every user mapping of file bytes `[offset, offset + len)`, so
    /// later accesses fault (with SIGBUS: the VMAs have no fault handler).
    pub(crate) fn zap(&self, offset: u64, len: u64) {
        // SAFETY: By the type invariant the mapping is valid.
        unsafe { raw::p2pdma_helper_zap(self.0.as_ptr(), offset, len) }
    }
}

/// The error a helper reported in `err`, or `default` if it set none.
fn errno_or(err: c_int, default: Error) -> Error {
    to_result(err).err().unwrap_or(default)
}

/// A PCI function some accelerator memory is mapped for.
pub(crate) struct Peer(ARef<pci::Device>);

impl Peer {
    /// The PCI function behind an open block device.
    pub(crate) fn from_fd(fd: i32) -> Result<Self> {
        let mut err: c_int = 0;
        // SAFETY: The helper validates `fd` itself.
        let p = unsafe { raw::p2pdma_helper_peer_from_fd(fd, &mut err) };
        Self::from_raw(p).ok_or_else(|| errno_or(err, ENXIO))
    }

    /// The PCI function at an address.
    pub(crate) fn from_address(domain: u32, bus: u8, devfn: u8) -> Result<Self> {
        // SAFETY: Looks up a device; returns it referenced or NULL.
        let p = unsafe { raw::p2pdma_helper_peer_from_address(domain, bus, devfn) };
        Self::from_raw(p).ok_or(ENODEV)
    }

    fn from_raw(p: *mut bindings::pci_dev) -> Option<Self> {
        let p = NonNull::new(p.cast::<pci::Device>())?;
        // SAFETY: The helpers return a PCI device with a reference we now own;
        // `pci::Device` is transparent over `struct pci_dev`.
        Some(Self(unsafe { ARef::from_raw(p) }))
    }

    /// The peer's PCI location.
    pub(crate) fn location(&self) -> (u32, u8, u8) {
        location(&*self.0)
    }

    /// The kernel's P2P distance from `provider` to this peer, `None` when
    /// the kernel refuses P2P between them.
    pub(crate) fn distance(&self, provider: &pci::Device) -> Option<u32> {
        // SAFETY: Both are valid PCI devices.
        let d = unsafe { raw::p2pdma_helper_distance(raw_pdev(provider), raw_pdev(&*self.0)) };
        u32::try_from(d).ok()
    }

    /// The lowest bridge upstream of both this peer and `other`.
    pub(crate) fn common_upstream(&self, other: &pci::Device) -> Option<(u32, u8, u8)> {
        // SAFETY: Both are valid PCI devices; the result is borrowed from
        // their parent chain, which they keep alive.
        let b = unsafe { raw::p2pdma_helper_common_upstream(raw_pdev(&*self.0), raw_pdev(other)) };
        // SAFETY: A non-NULL result is a valid `struct pci_dev`, borrowed.
        NonNull::new(b.cast::<pci::Device>()).map(|b| location(unsafe { b.as_ref() }))
    }

    /// Maps `len` bytes of MMIO at CPU physical address `phys` for DMA by
    /// this peer (`dma_map_resource`, which has no upstream wrapper).
    pub(crate) fn map_resource(&self, phys: u64, len: u64) -> Result<ResourceMap> {
        let mut err: c_int = 0;
        // SAFETY: `phys..phys + len` is P2P memory the caller keeps allocated
        // while the mapping exists.
        let addr = unsafe { raw::p2pdma_helper_map_resource(raw_pdev(&*self.0), phys, len, &mut err) };
        to_result(err)?;
        Ok(ResourceMap {
            peer: self.0.clone(),
            addr,
            len,
        })
    }

    /// Pins `[va, va + len)` of the caller's memory and maps it for this peer.
    pub(crate) fn pin_user(&self, va: u64, len: u64) -> Result<SgMap> {
        let mut err: c_int = 0;
        // SAFETY: The helper pins with `pin_user_pages_fast`, which validates
        // the user range.
        let m = unsafe { raw::p2pdma_helper_pin_user(raw_pdev(&*self.0), va, len, &mut err) };
        NonNull::new(m).map(SgMap).ok_or_else(|| errno_or(err, ENOMEM))
    }

    /// Attaches and maps the dma-buf `fd` for this peer.
    pub(crate) fn dmabuf_import(&self, fd: i32) -> Result<SgMap> {
        let mut err: c_int = 0;
        // SAFETY: The helper validates `fd` with `dma_buf_get`.
        let m = unsafe { raw::p2pdma_helper_dmabuf_import(raw_pdev(&*self.0), fd, &mut err) };
        NonNull::new(m).map(SgMap).ok_or_else(|| errno_or(err, ENOMEM))
    }
}

/// A `dma_map_resource` mapping, unmapped on drop.
pub(crate) struct ResourceMap {
    peer: ARef<pci::Device>,
    /// The peer's DMA address.
    pub(crate) addr: u64,
    len: u64,
}

impl Drop for ResourceMap {
    fn drop(&mut self) {
        // SAFETY: Unmaps exactly what `map_resource` mapped, once.
        unsafe { raw::p2pdma_helper_unmap_resource(raw_pdev(&*self.peer), self.addr, self.len) }
    }
}

/// A scatter-gather mapping for a peer (pinned user pages or an attached
/// dma-buf), released on drop.
///
/// # Invariants
///
/// Points to a live `struct p2pdma_sgmap` owned by this object.
pub(crate) struct SgMap(NonNull<raw::SgMapRaw>);

// SAFETY: The mapping has no thread affinity.
unsafe impl Send for SgMap {}
// SAFETY: Shared access only reads the table.
unsafe impl Sync for SgMap {}

impl SgMap {
    /// Total bytes mapped.
    pub(crate) fn len(&self) -> u64 {
        // SAFETY: By the type invariant.
        unsafe { raw::p2pdma_helper_sgmap_len(self.0.as_ptr()) }
    }

    /// Fills `addrs`/`lens` with up to their length of merged segments and
    /// returns how many segments there are in all.
    pub(crate) fn segments(&self, addrs: &mut [u64], lens: &mut [u64]) -> usize {
        let max = addrs.len().min(lens.len()).min(u32::MAX as usize) as u32;
        // SAFETY: Both arrays have at least `max` elements.
        unsafe {
            raw::p2pdma_helper_sgmap_segs(self.0.as_ptr(), addrs.as_mut_ptr(), lens.as_mut_ptr(), max)
                as usize
        }
    }
}

impl Drop for SgMap {
    fn drop(&mut self) {
        // SAFETY: By the type invariant; released exactly once.
        unsafe { raw::p2pdma_helper_sgmap_release(self.0.as_ptr()) }
    }
}
