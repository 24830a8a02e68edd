// SPDX-License-Identifier: GPL-2.0

//! Kernel interfaces that the kernel's Rust abstractions do not cover yet.
//!
//! Every raw declaration lives in the private `raw` module below (or comes
//! from `kernel::bindings`); the rest of the module only calls the safe
//! wrappers here. Each wrapper names the upstream facility it stands in for.

use core::{
    ptr::NonNull,
    sync::atomic::{
        AtomicBool,
        Ordering, //
    },
};

use kernel::{
    bindings, device,
    dma::DataDirection,
    error::to_result,
    ffi::{
        c_char,
        c_int,
        c_uint,
        c_void, //
    },
    fs::{
        file::LocalFile,
        File, //
    },
    mm::virt::{
        VmaMixedMap,
        VmaNew, //
    },
    page::BorrowedPage,
    pci,
    prelude::*,
    scatterlist::SGTable,
    sync::{
        aref::ARef,
        Arc, //
    },
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
        reason = "C structs are only passed by pointer, never by value"
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
        pub(super) fn pci_p2pmem_virt_to_bus(
            pdev: *mut bindings::pci_dev,
            kaddr: *mut c_void,
        ) -> u64;

        // include/linux/pci.h; exported, not in the Rust bindings.
        pub(super) fn pcim_enable_device(pdev: *mut bindings::pci_dev) -> c_int;

        // helpers.c: static inline functions, macros, module parameters and
        // operation tables.
        pub(super) fn p2pdma_helper_param_bar() -> c_int;
        pub(super) fn p2pdma_helper_param_user_share() -> c_uint;
        pub(super) fn p2pdma_helper_add_param_ids(drv_name: *const c_char) -> c_int;
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
        pub(super) fn p2pdma_helper_capable(cap: c_int) -> bool;
        pub(super) fn p2pdma_helper_current_uid() -> u32;
        pub(super) fn p2pdma_helper_current_tgid_get() -> *mut bindings::pid;
        pub(super) fn p2pdma_helper_is_current_tgid(pid: *mut bindings::pid) -> bool;
        pub(super) fn p2pdma_helper_put_pid(pid: *mut bindings::pid);

        pub(super) fn p2pdma_helper_alloc(pdev: *mut bindings::pci_dev, size: usize)
            -> *mut c_void;
        pub(super) fn p2pdma_helper_put_pages(kaddr: *mut c_void, size: usize);
        pub(super) fn p2pdma_helper_virt_to_page(kaddr: *mut c_void) -> *mut bindings::page;
        pub(super) fn p2pdma_helper_vma_pgoff(vma: *mut bindings::vm_area_struct) -> c_ulong;
        pub(super) fn p2pdma_helper_vma_shared(vma: *mut bindings::vm_area_struct) -> bool;
        pub(super) fn p2pdma_helper_vma_setup(
            vma: *mut bindings::vm_area_struct,
            private: *mut c_void,
        );
        pub(super) fn p2pdma_helper_zap(
            mapping: *mut bindings::address_space,
            offset: u64,
            len: u64,
        );

        pub(super) fn p2pdma_helper_peers_from_file(
            file: *mut bindings::file,
            out: *mut *mut bindings::pci_dev,
            max: c_int,
        ) -> c_int;
        pub(super) fn p2pdma_helper_io_bdev(
            file: *mut bindings::file,
            facts: *mut super::BdevFacts,
        ) -> *mut bindings::block_device;
        pub(super) fn p2pdma_helper_io_verify(
            file: *mut bindings::file,
            write: bool,
            pos: u64,
            len: u64,
        ) -> c_int;
        pub(super) fn p2pdma_helper_io_notify(file: *mut bindings::file, write: bool);
        pub(super) fn p2pdma_helper_io_sync_cache(
            bdev: *mut bindings::block_device,
            pos: u64,
            len: u64,
            write: bool,
        ) -> c_int;
        pub(super) fn p2pdma_helper_io_new() -> *mut IoRaw;
        pub(super) fn p2pdma_helper_io_plug(io: *mut IoRaw, on: bool);
        pub(super) fn p2pdma_helper_io_submit(
            io: *mut IoRaw,
            bdev: *mut bindings::block_device,
            write: bool,
            pos: u64,
            kaddr: *mut c_void,
            len: u32,
        );
        pub(super) fn p2pdma_helper_io_wait(io: *mut IoRaw, below: c_int);
        pub(super) fn p2pdma_helper_io_error(io: *mut IoRaw) -> c_int;
        pub(super) fn p2pdma_helper_io_free(io: *mut IoRaw);
        pub(super) fn p2pdma_helper_fatal_signal_pending() -> bool;
        pub(super) fn p2pdma_helper_common_upstream(
            a: *mut bindings::pci_dev,
            b: *mut bindings::pci_dev,
        ) -> *mut bindings::pci_dev;

        pub(super) fn p2pdma_helper_map_p2p(
            peer: *mut bindings::pci_dev,
            kaddr: *mut c_void,
            len: u64,
            dir: c_int,
            err: *mut c_int,
        ) -> *mut SgMapRaw;
        pub(super) fn p2pdma_helper_sgmap_is_bus_addr(m: *mut SgMapRaw) -> bool;
        pub(super) fn p2pdma_helper_pin_user(
            peer: *mut bindings::pci_dev,
            va: u64,
            len: u64,
            dir: c_int,
            err: *mut c_int,
        ) -> *mut SgMapRaw;
        pub(super) fn p2pdma_helper_dmabuf_import(
            peer: *mut bindings::pci_dev,
            buf: *mut bindings::dma_buf,
            dir: c_int,
            notify: *mut c_void,
            err: *mut c_int,
        ) -> *mut SgMapRaw;
        pub(super) fn p2pdma_helper_sgmap_table(m: *mut SgMapRaw) -> *mut bindings::sg_table;
        pub(super) fn p2pdma_helper_sgmap_lock(m: *mut SgMapRaw);
        pub(super) fn p2pdma_helper_sgmap_unlock(m: *mut SgMapRaw);
        pub(super) fn p2pdma_helper_sgmap_release(m: *mut SgMapRaw);
        pub(super) fn p2pdma_helper_sgmap_notify(m: *mut SgMapRaw) -> *mut c_void;

        pub(super) fn p2pdma_helper_eventfd_get(fd: c_int, err: *mut c_int) -> *mut c_void;
        pub(super) fn p2pdma_helper_eventfd_signal(ctx: *mut c_void);
        pub(super) fn p2pdma_helper_eventfd_put(ctx: *mut c_void);

        pub(super) fn p2pdma_helper_watch_peers() -> c_int;
        pub(super) fn p2pdma_helper_unwatch_peers();
    }

    /// `struct p2pdma_sgmap` of helpers.c, only handled by pointer.
    #[repr(C)]
    pub(crate) struct SgMapRaw {
        _opaque: [u8; 0],
    }

    /// `struct p2pdma_io` of helpers.c, only handled by pointer.
    #[repr(C)]
    pub(crate) struct IoRaw {
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

/// The `struct device` embedded in `pdev`.
fn raw_dev<Ctx: device::DeviceContext>(pdev: &pci::Device<Ctx>) -> *mut bindings::device {
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
    to_result(unsafe { raw::pci_p2pdma_add_resource(raw_pdev(pdev), bar, 0, 0) })
}

/// Publishes (or withdraws) `pdev`'s P2P memory for other kernel users
/// (`pci_p2pmem_publish`).
pub(crate) fn p2pmem_publish(pdev: &pci::Device<device::Core<'_>>, publish: bool) {
    // SAFETY: `pdev` is a valid, bound PCI device.
    unsafe { raw::pci_p2pmem_publish(raw_pdev(pdev), publish) }
}

/// Enables the device (its memory and I/O decoding; not bus mastering,
/// which the accelerator's own DMA engine would need and this driver does
/// not use) for as long as the driver stays bound (`pcim_enable_device`;
/// upstream's `enable_device_mem` has no managed counterpart).
pub(crate) fn pcim_enable_device(pdev: &pci::Device<device::Core<'_>>) -> Result {
    // SAFETY: `pdev` is a bound device, as the managed variant requires.
    to_result(unsafe { raw::pcim_enable_device(raw_pdev(pdev)) })
}

/// Declares that the accelerator takes DMA segments of any length
/// (`dma_set_max_seg_size`): the PCI core's default of 64 KiB is a guess for
/// devices whose driver says nothing.
pub(crate) fn set_max_seg_size(pdev: &pci::Device<device::Core<'_>>) {
    // SAFETY: Called from probe, before any DMA mapping for the device is
    // made through this driver; `dma_parms` of a PCI device always exist.
    unsafe { bindings::dma_set_max_seg_size(raw_dev(pdev), u32::MAX) }
}

/// The `bar=` module parameter, `None` when not set.
pub(crate) fn param_bar() -> Option<u32> {
    // SAFETY: Reads a module parameter that is only written at load time.
    let bar = unsafe { raw::p2pdma_helper_param_bar() };
    u32::try_from(bar).ok()
}

/// The `user_share=` module parameter: percent of a device's P2P memory one
/// user without `CAP_SYS_ADMIN` may hold.
pub(crate) fn param_user_share() -> u64 {
    // SAFETY: Reads a module parameter.
    u64::from(unsafe { raw::p2pdma_helper_param_user_share() })
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

/// A capability of the calling task (`capable`, no upstream wrapper).
#[derive(Clone, Copy)]
pub(crate) enum Cap {
    /// `CAP_SYS_RAWIO`: DMA addresses.
    SysRawio = bindings::CAP_SYS_RAWIO as isize,
    /// `CAP_SYS_ADMIN`: no share limit on device memory.
    SysAdmin = bindings::CAP_SYS_ADMIN as isize,
}

/// Whether the caller has `cap`.
pub(crate) fn capable(cap: Cap) -> bool {
    // SAFETY: `capable` only inspects the current task's credentials.
    unsafe { raw::p2pdma_helper_capable(cap as c_int) }
}

/// The caller's kernel uid (`kuid_t`): the same user whatever user
/// namespace it runs in, so that a namespace cannot mint fresh uids.
pub(crate) fn current_uid() -> u32 {
    // SAFETY: Reads the current task's credentials.
    unsafe { raw::p2pdma_helper_current_uid() }
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
// SAFETY: Shared access reads the fields, hands the memory's addresses to
// DMA, or writes device memory through raw pointers (`zero`); none forms a
// Rust reference to the memory.
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

    /// Splits off the pages outside `[offset, offset + len)`, dropping them;
    /// `EINVAL` (and every page dropped) unless the range is a non-empty run
    /// of whole pages inside this one.
    pub(crate) fn trim(self, offset: usize, len: usize) -> Result<Self> {
        let page = PAGE_SIZE as usize;
        match offset.checked_add(len) {
            Some(end) if len > 0 && offset % page == 0 && len % page == 0 && end <= self.size => {}
            _ => return Err(EINVAL),
        }
        let this = core::mem::ManuallyDrop::new(self);
        let base = this.kaddr.as_ptr().cast::<u8>();
        // SAFETY: `offset` and `len` are page multiples within the allocation
        // (checked above), so both trimmed ends are whole pages this object
        // references.
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
        // INVARIANT: the pages kept are `[offset, offset + len)` of the old
        // range, whose references this object still holds.
        Ok(Self {
            pdev,
            // SAFETY: `offset` is within the allocation (checked above), so
            // the result is a non-null address inside it.
            kaddr: unsafe { NonNull::new_unchecked(base.add(offset).cast()) },
            size: len,
        })
    }

    /// Writes zeros over the whole range. Meant for fresh allocations,
    /// before anyone else can reach the memory.
    pub(crate) fn zero(&self) {
        // SAFETY: By the type invariant `kaddr` is `size` bytes of memory this
        // object holds, mapped in the kernel's address space; the write goes
        // through a raw pointer, so it races with no Rust reference.
        unsafe { core::ptr::write_bytes(self.kaddr.as_ptr().cast::<u8>(), 0, self.size) };
    }

    /// Bytes held.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The kernel address of byte `offset`, `None` past the last byte.
    fn kaddr_at(&self, offset: usize) -> Option<*mut c_void> {
        if offset >= self.size {
            return None;
        }
        // SAFETY: `offset` is inside the `size` bytes at `kaddr` (checked
        // above), so the result stays in the same allocation.
        Some(unsafe { self.kaddr.as_ptr().cast::<u8>().add(offset).cast() })
    }

    /// PCI bus address of byte `offset`, `None` past the last byte.
    pub(crate) fn bus_addr(&self, offset: usize) -> Option<u64> {
        let kaddr = self.kaddr_at(offset)?;
        // SAFETY: `kaddr` lies in P2P memory of `pdev` (type invariant).
        Some(unsafe { raw::pci_p2pmem_virt_to_bus(raw_pdev(&self.pdev), kaddr) })
    }

    /// The accelerator the memory belongs to.
    pub(crate) fn pdev(&self) -> &ARef<pci::Device> {
        &self.pdev
    }

    /// Maps pages `[first_page, first_page + npages)` into `vma` from its
    /// start (pages already there are kept).
    pub(crate) fn insert_into(
        &self,
        vma: &VmaMixedMap,
        first_page: usize,
        npages: usize,
    ) -> Result {
        let end = first_page.checked_add(npages).ok_or(EINVAL)?;
        if end as u64 > self.size as u64 / PAGE_SIZE {
            return Err(EINVAL);
        }
        for i in 0..npages {
            let kaddr = self
                .kaddr_at((first_page + i) * PAGE_SIZE as usize)
                .ok_or(EINVAL)?;
            // SAFETY: `kaddr` is a page of this allocation.
            let page = unsafe { raw::p2pdma_helper_virt_to_page(kaddr) };
            // SAFETY: The page is valid and referenced by `self` for the
            // duration of the borrow.
            let page = unsafe { BorrowedPage::from_raw(NonNull::new_unchecked(page)) };
            match vma.vm_insert_page(vma.start() + i * PAGE_SIZE as usize, &page) {
                Ok(()) => {}
                Err(e) if e == EBUSY => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// DMA-maps `[offset, offset + len)` for `peer` by the DMA API, which
    /// applies the P2PDMA rules (`dma_map_sgtable`); `EREMOTEIO` when the
    /// kernel does not allow it, `EINVAL` unless the range is a non-empty
    /// run of whole pages of this memory. Also says whether it mapped by
    /// bus address.
    ///
    /// The mapping does not hold the pages: whoever keeps it keeps them
    /// too, and drops it first.
    pub(crate) fn map_for(
        &self,
        peer: &Peer,
        offset: usize,
        len: u64,
        dir: DataDirection,
    ) -> Result<(SgMap, bool)> {
        let len_bytes = usize::try_from(len).map_err(|_| EINVAL)?;
        let end = offset.checked_add(len_bytes).ok_or(EINVAL)?;
        let page = PAGE_SIZE as usize;
        if len_bytes == 0 || offset % page != 0 || len_bytes % page != 0 || end > self.size {
            return Err(EINVAL);
        }
        let kaddr = self.kaddr_at(offset).ok_or(EINVAL)?;
        let mut err: c_int = 0;
        // SAFETY: The range lies in the allocation (checked above), whose
        // pages `self` keeps referenced while the caller holds it.
        let m = unsafe {
            raw::p2pdma_helper_map_p2p(raw_pdev(&peer.0), kaddr, len, dir as u32 as c_int, &mut err)
        };
        let m = NonNull::new(m)
            .map(SgMap)
            .ok_or_else(|| errno_or(err, ENOMEM))?;
        // SAFETY: `m` is a live mapping.
        let bus = unsafe { raw::p2pdma_helper_sgmap_is_bus_addr(m.0.as_ptr()) };
        Ok((m, bus))
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

/// Makes `vma` write-combined and populated on fault by this module, with
/// `private` as its data (`vm_ops`, which `VmaNew` cannot set).
///
/// # Safety
///
/// `private` must be a reference the VMA owns from now on, as the vm_ops
/// callbacks in memory.rs expect.
pub(crate) unsafe fn vma_setup(vma: &VmaNew, private: *const c_void) {
    // SAFETY: `vma` is a valid VMA under construction, not yet visible.
    unsafe { raw::p2pdma_helper_vma_setup(vma.as_ptr(), private.cast_mut()) }
}

/// The page cache mapping (`f_mapping`) of an open file; user mappings of the
/// file are reached through it.
///
/// # Invariants
///
/// Points to the `address_space` of `inode`, on which this object holds a
/// reference, so it stays valid however long the object lives (past the
/// file's release, too).
pub(crate) struct FileMapping {
    mapping: NonNull<bindings::address_space>,
    inode: NonNull<bindings::inode>,
}

// SAFETY: An `address_space` may be used, and an inode reference dropped,
// from any thread.
unsafe impl Send for FileMapping {}
// SAFETY: See above.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// The mapping of `file`.
    pub(crate) fn of(file: &File) -> Result<Self> {
        // SAFETY: `file` is a valid open file: its mapping and that
        // mapping's host inode are valid while it is open.
        let (mapping, inode) = unsafe {
            let mapping = (*file.as_ptr()).f_mapping;
            let inode = if mapping.is_null() {
                core::ptr::null_mut()
            } else {
                (*mapping).host
            };
            (mapping, inode)
        };
        let mapping = NonNull::new(mapping).ok_or(EINVAL)?;
        let inode = NonNull::new(inode).ok_or(EINVAL)?;
        // SAFETY: The inode is alive (the file holds it); take our own
        // reference. INVARIANT: `mapping` is the inode's.
        unsafe { bindings::ihold(inode.as_ptr()) };
        Ok(Self { mapping, inode })
    }

    /// Removes every user mapping of file bytes `[offset, offset + len)`;
    /// later accesses fault, and the fault handler decides.
    pub(crate) fn zap(&self, offset: u64, len: u64) {
        // SAFETY: By the type invariant the mapping is valid.
        unsafe { raw::p2pdma_helper_zap(self.mapping.as_ptr(), offset, len) }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `of`.
        unsafe { bindings::iput(self.inode.as_ptr()) }
    }
}

/// The error a helper reported in `err`, or `default` if it set none.
fn errno_or(err: c_int, default: Error) -> Error {
    to_result(err).err().unwrap_or(default)
}

/// Most PCI functions one block device resolves to (paths of a multipath
/// device).
pub(crate) const MAX_PATHS: usize = 8;

/// A PCI function some memory is mapped for.
#[derive(Clone)]
pub(crate) struct Peer(pub(crate) ARef<pci::Device>);

impl Peer {
    /// The PCI functions behind an open block device: its controller, or
    /// every controller with a path to a multipath device.
    pub(crate) fn from_fd(fd: i32) -> Result<KVec<Self>> {
        let fd = u32::try_from(fd).map_err(|_| EBADF)?;
        Self::from_file(&*LocalFile::fget(fd)?)
    }

    /// [`Peer::from_fd`] for a file already held.
    pub(crate) fn from_file(file: &LocalFile) -> Result<KVec<Self>> {
        let mut raw_peers = [core::ptr::null_mut::<bindings::pci_dev>(); MAX_PATHS];
        // SAFETY: `file` is a valid, referenced file; the helper writes at
        // most `MAX_PATHS` referenced devices.
        let n = unsafe {
            raw::p2pdma_helper_peers_from_file(
                file.as_ptr(),
                raw_peers.as_mut_ptr(),
                MAX_PATHS as c_int,
            )
        };
        to_result(n.min(0))?;
        let n = (n as usize).min(MAX_PATHS);
        // Each of the first `n` pointers carries a reference: adopt every
        // one before anything can fail, so that an error drops them all.
        let adopted: [Option<Self>; MAX_PATHS] = core::array::from_fn(|i| {
            if i < n {
                Self::from_raw(raw_peers[i])
            } else {
                None
            }
        });
        let mut peers = KVec::with_capacity(n, GFP_KERNEL)?;
        for peer in adopted.into_iter().flatten() {
            peers.push(peer, GFP_KERNEL)?;
        }
        if peers.is_empty() {
            return Err(ENXIO);
        }
        Ok(peers)
    }

    /// The PCI function at an address.
    pub(crate) fn from_address(domain: u32, bus: u8, devfn: u8) -> Result<Self> {
        // SAFETY: Looks up a device; returns it referenced or NULL.
        let p = unsafe {
            bindings::pci_get_domain_bus_and_slot(domain as c_int, bus.into(), devfn.into())
        };
        Self::from_raw(p).ok_or(ENODEV)
    }

    fn from_raw(p: *mut bindings::pci_dev) -> Option<Self> {
        let p = NonNull::new(p.cast::<pci::Device>())?;
        // SAFETY: The callers pass a PCI device with a reference we now own;
        // `pci::Device` is transparent over `struct pci_dev`.
        Some(Self(unsafe { ARef::from_raw(p) }))
    }

    /// Whether this is `pdev`.
    pub(crate) fn is(&self, pdev: *const bindings::pci_dev) -> bool {
        raw_pdev(&*self.0).cast_const() == pdev
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
        // SAFETY: Both are valid PCI devices; the result is borrowed from
        // their parent chain, which they keep alive.
        let b = unsafe { raw::p2pdma_helper_common_upstream(raw_pdev(&*self.0), raw_pdev(other)) };
        // SAFETY: A non-NULL result is a valid `struct pci_dev`, borrowed.
        NonNull::new(b.cast::<pci::Device>()).map(|b| location(unsafe { b.as_ref() }))
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

    /// Pins `[va, va + len)` of the caller's memory and maps it for this
    /// peer, charging the caller's `RLIMIT_MEMLOCK`. With `ToDevice` the
    /// pages are pinned read-only.
    pub(crate) fn pin_user(&self, va: u64, len: u64, dir: DataDirection) -> Result<SgMap> {
        let mut err: c_int = 0;
        // SAFETY: The helper pins with `pin_user_pages_fast`, which validates
        // the user range.
        let m = unsafe {
            raw::p2pdma_helper_pin_user(raw_pdev(&*self.0), va, len, dir as u32 as c_int, &mut err)
        };
        NonNull::new(m)
            .map(SgMap)
            .ok_or_else(|| errno_or(err, ENOMEM))
    }

    /// Attaches (dynamically, peer-to-peer allowed), pins and maps the
    /// dma-buf `fd` for this peer. If the exporter revokes it, the mapping is
    /// torn down and `notify` is signalled.
    pub(crate) fn dmabuf_import(
        &self,
        buf: &DmaBuf,
        dir: DataDirection,
        notify: &Arc<ExporterNotice>,
    ) -> Result<SgMap> {
        let mut err: c_int = 0;
        let notify_raw = Arc::into_raw(notify.clone());
        // SAFETY: `buf` is a referenced dma-buf (the helper takes a reference
        // of its own); the helper keeps the `notify` reference until the
        // mapping is released (see `SgMap::drop`) and passes it to
        // `p2pdma_dmabuf_revoked` only.
        let m = unsafe {
            raw::p2pdma_helper_dmabuf_import(
                raw_pdev(&*self.0),
                buf.0.as_ptr(),
                dir as u32 as c_int,
                notify_raw.cast_mut().cast(),
                &mut err,
            )
        };
        match NonNull::new(m) {
            Some(m) => Ok(SgMap(m)),
            None => {
                // SAFETY: The helper failed and kept nothing: the reference is
                // still ours.
                drop(unsafe { Arc::from_raw(notify_raw) });
                Err(errno_or(err, ENOMEM))
            }
        }
    }
}

/// A scatter-gather mapping for a peer (P2P pages, pinned user pages or an
/// attached dma-buf), released on drop.
///
/// # Invariants
///
/// Points to a live `struct p2pdma_sgmap` owned by this object; a dma-buf
/// mapping owns one reference on the `ExporterNotice` given at import.
pub(crate) struct SgMap(NonNull<raw::SgMapRaw>);

// SAFETY: The mapping has no thread affinity.
unsafe impl Send for SgMap {}
// SAFETY: Shared access only reads the table, under the dma-buf's lock.
unsafe impl Sync for SgMap {}

impl SgMap {
    /// Calls `f` with each DMA segment (address, length), merging adjacent
    /// ones up to `max_seg` bytes; `ENODEV` if the mapping was revoked.
    pub(crate) fn for_each_segment(
        &self,
        max_seg: u64,
        mut f: impl FnMut(u64, u64) -> Result,
    ) -> Result {
        let m = self.0.as_ptr();
        // SAFETY: By the type invariant; the lock keeps a dma-buf's table
        // from being revoked while it is read.
        unsafe { raw::p2pdma_helper_sgmap_lock(m) };
        // SAFETY: As above.
        let table = unsafe { raw::p2pdma_helper_sgmap_table(m) };
        let r = if table.is_null() {
            Err(ENODEV)
        } else {
            // SAFETY: The table is mapped and stays so until unlocked below.
            let table = unsafe { SGTable::from_raw(table) };
            let mut cur: Option<(u64, u64)> = None;
            let mut r = Ok(());
            for sg in table.iter() {
                let (a, l) = (sg.dma_address(), sg.dma_len());
                cur = match cur {
                    Some((ca, cl)) if ca + cl == a && cl + l <= max_seg => Some((ca, cl + l)),
                    Some(seg) => {
                        r = f(seg.0, seg.1);
                        if r.is_err() {
                            break;
                        }
                        Some((a, l))
                    }
                    None => Some((a, l)),
                };
            }
            match (r, cur) {
                (Ok(()), Some((a, l))) => f(a, l),
                (r, _) => r,
            }
        };
        // SAFETY: Pairs with the lock above.
        unsafe { raw::p2pdma_helper_sgmap_unlock(m) };
        r
    }
}

impl Drop for SgMap {
    fn drop(&mut self) {
        // SAFETY: By the type invariant. The helper detaches a dma-buf
        // before returning, so no revocation callback runs afterwards and
        // the notifier reference given at import can be dropped then.
        let notify = unsafe { sgmap_notify(self.0.as_ptr()) };
        // SAFETY: As above.
        unsafe { raw::p2pdma_helper_sgmap_release(self.0.as_ptr()) };
        if let Some(n) = notify {
            // SAFETY: The reference given at import, now unused.
            drop(unsafe { Arc::from_raw(n) });
        }
    }
}

/// The notifier a dma-buf mapping was given, if any.
///
/// # Safety
///
/// `m` is a live `struct p2pdma_sgmap`.
unsafe fn sgmap_notify(m: *mut raw::SgMapRaw) -> Option<*const ExporterNotice> {
    // SAFETY: The caller guarantees `m` is live.
    let n = unsafe { raw::p2pdma_helper_sgmap_notify(m) };
    (!n.is_null()).then_some(n.cast_const().cast())
}

/// A dma-buf, referenced (`dma_buf_get`/`dma_buf_put`; upstream's Rust
/// has dma-buf fences but no importer side).
///
/// # Invariants
///
/// Holds a reference on the `struct dma_buf`.
pub(crate) struct DmaBuf(NonNull<bindings::dma_buf>);

// SAFETY: A dma-buf reference may be used and dropped from any thread.
unsafe impl Send for DmaBuf {}
// SAFETY: Shared access only reads fields that never change.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// The dma-buf behind the caller's descriptor `fd`; `EBADF` when it is
    /// not one.
    pub(crate) fn get(fd: i32) -> Result<Self> {
        // SAFETY: `dma_buf_get` validates `fd`; it returns a referenced
        // dma-buf or an error pointer.
        let p = kernel::error::from_err_ptr(unsafe { bindings::dma_buf_get(fd) }).map_err(|e| {
            if e == EINVAL {
                EBADF
            } else {
                e
            }
        })?;
        // INVARIANT: `p` is a dma-buf `dma_buf_get` referenced for us.
        Ok(Self(NonNull::new(p).ok_or(EBADF)?))
    }

    /// Bytes in the buffer.
    pub(crate) fn size(&self) -> u64 {
        // SAFETY: By the type invariant the dma-buf is alive; its size is
        // set by the exporter before export and never changes.
        unsafe { (*self.0.as_ptr()).size as u64 }
    }

    /// A number naming this buffer while any reference on it is held.
    pub(crate) fn id(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `get`.
        unsafe { bindings::dma_buf_put(self.0.as_ptr()) }
    }
}

/// An eventfd a file's owner registered for revocation notices.
///
/// # Invariants
///
/// Holds a reference on the `struct eventfd_ctx`.
pub(crate) struct EventFd(NonNull<c_void>);

// SAFETY: eventfd contexts may be signalled and dropped from any thread.
unsafe impl Send for EventFd {}
// SAFETY: See above.
unsafe impl Sync for EventFd {}

impl EventFd {
    /// The eventfd behind the caller's descriptor `fd`.
    pub(crate) fn get(fd: i32) -> Result<Self> {
        let mut err: c_int = 0;
        // SAFETY: The helper validates `fd`.
        let ctx = unsafe { raw::p2pdma_helper_eventfd_get(fd, &mut err) };
        NonNull::new(ctx)
            .map(Self)
            .ok_or_else(|| errno_or(err, EBADF))
    }

    /// Adds one to its counter.
    pub(crate) fn signal(&self) {
        // SAFETY: By the type invariant.
        unsafe { raw::p2pdma_helper_eventfd_signal(self.0.as_ptr()) }
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: Drops the reference taken in `get`.
        unsafe { raw::p2pdma_helper_eventfd_put(self.0.as_ptr()) }
    }
}

/// Where an open file's revocation notices go.
#[pin_data]
pub(crate) struct Notifier {
    #[pin]
    eventfd: kernel::sync::Mutex<Option<EventFd>>,
}

impl Notifier {
    /// A notifier with no eventfd yet.
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                eventfd <- kernel::new_mutex!(None),
            }),
            GFP_KERNEL,
        )
    }

    /// Replaces the eventfd.
    pub(crate) fn set(&self, eventfd: Option<EventFd>) {
        let old = core::mem::replace(&mut *self.eventfd.lock(), eventfd);
        drop(old);
    }

    /// Tells the owner that something was revoked.
    pub(crate) fn signal(&self) {
        if let Some(e) = self.eventfd.lock().as_ref() {
            e.signal();
        }
    }
}

/// What a dma-buf import tells when its exporter revokes it: the flag, then
/// the owner's notifier. Shared by the import's mappings (one per peer).
pub(crate) struct ExporterNotice {
    notifier: Arc<Notifier>,
    revoked: AtomicBool,
}

impl ExporterNotice {
    /// A notice that tells `notifier`.
    pub(crate) fn new(notifier: Arc<Notifier>) -> Result<Arc<Self>> {
        Ok(Arc::new(
            Self {
                notifier,
                revoked: AtomicBool::new(false),
            },
            GFP_KERNEL,
        )?)
    }

    /// Whether the exporter revoked the import.
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

/// Keeps the module told about PCI devices losing their driver (a bus
/// notifier) while it lives.
pub(crate) struct PeerWatch(());

impl PeerWatch {
    /// Starts watching.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: Registers a static notifier block once; `Drop` removes it.
        to_result(unsafe { raw::p2pdma_helper_watch_peers() })?;
        Ok(Self(()))
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        // SAFETY: Registered in `new`.
        unsafe { raw::p2pdma_helper_unwatch_peers() }
    }
}

// Callbacks from helpers.c.

/// `vm_ops->open`: a VMA was copied (split, moved); it holds its own
/// allocation reference.
#[no_mangle]
extern "C" fn p2pdma_vma_open(alloc: *mut c_void) {
    // SAFETY: `vm_private_data` of our VMAs is a reference from
    // `Arc::into_raw` (see `Alloc::mmap`), alive while the VMA is; it stays
    // the old VMA's.
    let old = core::mem::ManuallyDrop::new(unsafe {
        Arc::from_raw(alloc.cast_const().cast::<crate::memory::Alloc>())
    });
    // The new VMA's own reference, under the same pointer.
    let _ = Arc::into_raw(Arc::clone(&old));
    crate::memory::vma_open(&old);
}

/// `vm_ops->close`: a VMA went away with its allocation reference.
#[no_mangle]
extern "C" fn p2pdma_vma_close(alloc: *mut c_void) {
    // SAFETY: As for `p2pdma_vma_open`; the VMA's reference is given back.
    let alloc = unsafe { Arc::from_raw(alloc.cast_const().cast::<crate::memory::Alloc>()) };
    crate::memory::vma_close(alloc);
}

/// `vm_ops->fault`.
#[no_mangle]
extern "C" fn p2pdma_vma_fault(alloc: *mut c_void, vma: *mut bindings::vm_area_struct) -> c_uint {
    // SAFETY: The fault handler runs with the mmap (or VMA) read lock held,
    // and our VMAs are `VM_MIXEDMAP` (set in `Alloc::mmap`).
    let vma = unsafe { VmaMixedMap::from_raw(vma) };
    // SAFETY: As for `p2pdma_vma_open`.
    let alloc = unsafe { borrow_alloc(alloc) };
    // SAFETY: Reads the VMA's offset under the lock held by the caller.
    let pgoff = unsafe { raw::p2pdma_helper_vma_pgoff(vma.as_ptr()) } as u64;
    match crate::memory::vma_fault(alloc, vma, pgoff) {
        Ok(()) => bindings::vm_fault_reason_VM_FAULT_NOPAGE,
        Err(e) if e == ENOMEM => bindings::vm_fault_reason_VM_FAULT_OOM,
        Err(_) => bindings::vm_fault_reason_VM_FAULT_SIGBUS,
    }
}

/// Borrows the allocation a VMA holds.
///
/// # Safety
///
/// `p` is a VMA's `vm_private_data` set by `Alloc::mmap`, alive for `'a`.
unsafe fn borrow_alloc<'a>(p: *mut c_void) -> &'a crate::memory::Alloc {
    // SAFETY: `p` came from `Arc::into_raw` and the VMA keeps it alive.
    unsafe { &*p.cast_const().cast::<crate::memory::Alloc>() }
}

/// A dma-buf exporter revoked an imported buffer.
#[no_mangle]
extern "C" fn p2pdma_dmabuf_revoked(notify: *mut c_void) {
    // SAFETY: The reference given at import is alive until the mapping is
    // released, which cannot run concurrently with this callback (both hold
    // the reservation lock).
    let n = unsafe { &*notify.cast_const().cast::<ExporterNotice>() };
    n.revoked.store(true, Ordering::Release);
    n.notifier.signal();
}

/// A PCI device starts losing its driver or going away (`going`), or is
/// done with it.
#[no_mangle]
extern "C" fn p2pdma_peer_going(pdev: *mut bindings::pci_dev, going: bool) {
    crate::dma::peer_going(pdev, going);
}

/// What block I/O on a block device must respect (`struct
/// p2pdma_bdev_facts` of helpers.c).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct BdevFacts {
    /// The file was opened for reading.
    pub(crate) readable: bool,
    /// The file was opened for writing.
    pub(crate) writable: bool,
    /// The device is read-only.
    pub(crate) read_only: bool,
    /// Its driver maps P2P memory (`BLK_FEAT_PCI_P2PDMA`).
    pub(crate) p2pdma: bool,
    /// It is an active swap device (`IS_SWAPFILE`), which only swap may
    /// write.
    pub(crate) swap: bool,
    /// Writes through the file must be durable when they return
    /// (`O_DSYNC`, `O_SYNC`, or a sync inode).
    pub(crate) sync: bool,
    /// Bytes per logical block.
    pub(crate) logical_block_size: u32,
    /// Mask of the memory alignment its DMA needs.
    pub(crate) dma_alignment: u32,
    /// Bytes.
    pub(crate) size: u64,
    /// Its device number.
    pub(crate) dev: u32,
}

/// The block device an open file is, for block I/O the module submits.
/// Upstream has block-driver abstractions (`kernel::block::mq`) but none
/// for submitting bios.
///
/// # Invariants
///
/// `bdev` is the block device of `file`, which holds it open for `'a`.
pub(crate) struct BlockDev<'a> {
    file: &'a LocalFile,
    bdev: NonNull<bindings::block_device>,
    facts: BdevFacts,
}

impl<'a> BlockDev<'a> {
    /// The block device `file` is; `ENOTBLK` if it is not one.
    pub(crate) fn of(file: &'a LocalFile) -> Result<Self> {
        let mut facts = BdevFacts::default();
        // SAFETY: `file` is a valid, referenced file; `facts` is writable.
        let bdev = unsafe { raw::p2pdma_helper_io_bdev(file.as_ptr(), &mut facts) };
        let bdev = NonNull::new(bdev).ok_or(ENOTBLK)?;
        // INVARIANT: the helper returned `file`'s block device.
        Ok(Self { file, bdev, facts })
    }

    /// Its facts, as they were when it was looked up.
    pub(crate) fn facts(&self) -> &BdevFacts {
        &self.facts
    }

    /// The file it was opened by.
    pub(crate) fn file(&self) -> &LocalFile {
        self.file
    }

    /// The checks `read(2)` (or, for a `write`, `write(2)`) makes of `len`
    /// bytes at `pos` (`rw_verify_area`): the range, the security modules'
    /// permission, fanotify permission events.
    pub(crate) fn verify(&self, write: bool, pos: u64, len: u64) -> Result {
        // SAFETY: `file` is a valid, referenced file.
        to_result(unsafe { raw::p2pdma_helper_io_verify(self.file.as_ptr(), write, pos, len) })
    }

    /// Tells inotify and fanotify that the device was read (or written).
    pub(crate) fn notify(&self, write: bool) {
        // SAFETY: `file` is a valid, referenced file.
        unsafe { raw::p2pdma_helper_io_notify(self.file.as_ptr(), write) }
    }

    /// Flushes the device's volatile write cache (`blkdev_issue_flush`), as
    /// `fsync` on the device does.
    pub(crate) fn flush(&self) -> Result {
        // SAFETY: By the type invariant `bdev` is open.
        to_result(unsafe { bindings::blkdev_issue_flush(self.bdev.as_ptr()) })
    }

    /// Writes back the page cache's dirty pages over `[pos, pos + len)`
    /// and, before a `write`, drops them, as direct I/O does (`EBUSY` when
    /// a page cannot be dropped).
    pub(crate) fn sync_cache(&self, pos: u64, len: u64, write: bool) -> Result {
        // SAFETY: By the type invariant `bdev` is open; `len > 0` (callers
        // validate segments first).
        to_result(unsafe {
            raw::p2pdma_helper_io_sync_cache(self.bdev.as_ptr(), pos, len.max(1), write)
        })
    }
}

/// Bios in flight between P2P pages and a block device, for one call.
///
/// Only [`BlockIo::run`] makes one, and it waits for every bio before it
/// returns, so no bio outlives the pages or the device it moves data
/// between, whatever the closure does (`mem::forget` of a reference does
/// nothing).
///
/// # Invariants
///
/// `io` is a live `struct p2pdma_io`; every bio submitted through it moves
/// data between `pages` and `bdev`, both borrowed for `'a`, and `run` waits
/// for all of them before `'a` ends.
pub(crate) struct BlockIo<'a> {
    io: NonNull<raw::IoRaw>,
    bdev: &'a BlockDev<'a>,
    pages: &'a P2pPages,
}

impl<'a> BlockIo<'a> {
    /// Calls `f` with a call moving data between `pages` and `bdev`, then
    /// waits for every bio `f` submitted.
    pub(crate) fn run<R>(
        bdev: &'a BlockDev<'a>,
        pages: &'a P2pPages,
        f: impl FnOnce(&BlockIo<'a>) -> R,
    ) -> Result<R> {
        // SAFETY: Allocates; no requirements.
        let io = NonNull::new(unsafe { raw::p2pdma_helper_io_new() }).ok_or(ENOMEM)?;
        let this = Self { io, bdev, pages };
        let r = f(&this);
        // SAFETY: `io` is live; the helper waits for every bio, then frees
        // it. `this` is not used again.
        unsafe { raw::p2pdma_helper_io_free(this.io.as_ptr()) };
        Ok(r)
    }

    /// Batches the following submissions into one plug (`on`), or flushes
    /// them (`!on`), as `blk_start_plug`/`blk_finish_plug` do.
    pub(crate) fn plug(&self, on: bool) {
        // SAFETY: `io` is live (type invariant).
        unsafe { raw::p2pdma_helper_io_plug(self.io.as_ptr(), on) }
    }

    /// Submits one bio moving `len` bytes between byte `mem_offset` of the
    /// pages and byte `pos` of the device (from the device when `!write`).
    pub(crate) fn submit(&self, write: bool, pos: u64, mem_offset: u64, len: u64) -> Result {
        let end = mem_offset.checked_add(len).ok_or(EINVAL)?;
        let len32 = u32::try_from(len).map_err(|_| EINVAL)?;
        if len == 0 || end > self.pages.size() as u64 {
            return Err(EINVAL);
        }
        let kaddr = usize::try_from(mem_offset)
            .ok()
            .and_then(|o| self.pages.kaddr_at(o))
            .ok_or(EINVAL)?;
        // SAFETY: The range lies in `pages` (checked above), which outlive
        // every bio, as does the open `bdev`: `run` waits for the bios
        // before its borrows end (type invariant).
        unsafe {
            raw::p2pdma_helper_io_submit(
                self.io.as_ptr(),
                self.bdev.bdev.as_ptr(),
                write,
                pos,
                kaddr,
                len32,
            )
        };
        Ok(())
    }

    /// Waits until fewer than `below` bios are in flight, as the block
    /// layer waits for I/O (`io_schedule`, waking now and then so that a
    /// long wait on slow storage is no hung task).
    pub(crate) fn wait_below(&self, below: u32) {
        let below = c_int::try_from(below).unwrap_or(c_int::MAX);
        // SAFETY: `io` is live (type invariant).
        unsafe { raw::p2pdma_helper_io_wait(self.io.as_ptr(), below) }
    }

    /// The first error of the bios that ended so far.
    pub(crate) fn error(&self) -> Option<Error> {
        // SAFETY: `io` is live (type invariant).
        let e = unsafe { raw::p2pdma_helper_io_error(self.io.as_ptr()) };
        (e < 0).then(|| Error::from_errno(e))
    }
}

/// Whether the current task was sent a fatal signal (`fatal_signal_pending`,
/// a static inline).
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: Reads the current task's signal state.
    unsafe { raw::p2pdma_helper_fatal_signal_pending() }
}
