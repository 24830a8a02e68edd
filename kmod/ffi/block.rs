// SPDX-License-Identifier: GPL-2.0

//! Block devices and the bios the module submits to them (upstream's
//! `kernel::block` serves block drivers, it submits no bios), and the PCI
//! functions behind a block device.

use core::{
    cell::Cell,
    ptr::NonNull, //
};

use kernel::{
    bindings,
    error::to_result,
    ffi::{
        c_char,
        c_int,
        c_long,
        c_void, //
    },
    fs::file::LocalFile,
    prelude::*,
    sync::atomic::{
        Acquire,
        Atomic,
        Full,
        Relaxed, //
    },
    time::msecs_to_jiffies,
    types::Opaque, //
};

use super::{
    p2pmem::P2pPages,
    pci::Peer, //
};

mod raw {
    use kernel::bindings;

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: `file_bdev` only for block device files (`S_ISBLK`,
        // `file_inode`: macros and static inlines).
        pub(super) fn p2pdma_helper_file_bdev(
            file: *mut bindings::file,
        ) -> *mut bindings::block_device;
        // helpers.c: the block device's limits and the file's modes, read
        // through static inlines and macros.
        pub(super) fn p2pdma_helper_io_bdev(
            file: *mut bindings::file,
            facts: *mut super::BdevFacts,
        ) -> *mut bindings::block_device;
        // helpers.c: `fsnotify_access` and `fsnotify_modify` are static
        // inlines.
        pub(super) fn p2pdma_helper_io_notify(file: *mut bindings::file, write: bool);
    }
}

/// Most PCI functions one block device resolves to (paths of a multipath
/// device, members of an md array).
pub(crate) const MAX_PATHS: usize = 16;

impl Peer {
    /// The PCI functions behind an open block device: its controller, or
    /// every controller with a path to a multipath device.
    pub(crate) fn from_fd(fd: i32) -> Result<KVec<Self>> {
        let fd = u32::try_from(fd).map_err(|_| EBADF)?;
        Self::from_file(&*LocalFile::fget(fd)?)
    }

    /// [`Peer::from_fd`] for a file already held: the first PCI ancestor of
    /// the block device (for NVMe: namespace, controller, PCI function), or,
    /// for an NVMe multipath head (whose parent is the subsystem, not a
    /// controller), the PCI function of each controller with a path to it
    /// (at most [`MAX_PATHS`]). The path disks are named
    /// `nvme<subsys>c<ctrl>n<head>` and are children of their controller.
    /// For a device stacked on others (an md array), the PCI function of
    /// each of its members: see [`members`].
    pub(crate) fn from_file(file: &LocalFile) -> Result<KVec<Self>> {
        // SAFETY: `file` is a valid, referenced file.
        let bdev = unsafe { raw::p2pdma_helper_file_bdev(file.as_ptr()) };
        let bdev = NonNull::new(bdev).ok_or(ENOTBLK)?;
        let mut peers = KVec::with_capacity(MAX_PATHS, GFP_KERNEL)?;
        // SAFETY: The open file holds the block device, its `struct device`
        // and that device's ancestors.
        let mut dev = unsafe { &raw mut (*bdev.as_ptr()).bd_device };
        while !dev.is_null() {
            // SAFETY: `dev` is a live device (see above).
            if unsafe { bindings::dev_is_pci(dev) } {
                // SAFETY: A PCI device's `struct device` is the `dev` field
                // of its `struct pci_dev`, alive while the file holds it;
                // the reference taken is the peer's.
                let peer = unsafe {
                    let pdev = kernel::container_of!(dev, bindings::pci_dev, dev);
                    Self::from_raw(bindings::pci_dev_get(pdev))
                };
                peers.push(peer.ok_or(ENXIO)?, GFP_KERNEL)?;
                return Ok(peers);
            }
            // SAFETY: As above.
            dev = unsafe { (*dev).parent };
        }
        // SAFETY: The disk of an open block device is alive, and its name
        // a NUL-terminated string that does not change.
        let name = unsafe { CStr::from_char_ptr((*(*bdev.as_ptr()).bd_disk).disk_name.as_ptr()) };
        let Some((subsys, head)) = mpath_head(name.to_bytes()) else {
            // SAFETY: As above; the directory of holders' links lives as
            // long as the disk.
            return members(unsafe { (*(*bdev.as_ptr()).bd_disk).slave_dir }, peers);
        };
        let mut m = MpathMatch {
            subsys,
            head,
            peers,
        };
        each_pci_function(|pdev| {
            // SAFETY: `pdev` is referenced for the call; `m` outlives it,
            // which passes it to the callback only.
            unsafe {
                bindings::device_for_each_child(
                    &raw mut (*pdev).dev,
                    (&raw mut m).cast(),
                    Some(mpath_controller),
                )
            };
            m.peers.len() < MAX_PATHS
        });
        if m.peers.is_empty() {
            return Err(ENXIO);
        }
        Ok(m.peers)
    }
}

/// The PCI functions of the members of a stacked block device whose
/// `slaves` directory (`slave_dir`, where `bd_link_disk_holder` puts a link
/// named after each member) is `slaves`: a member is a disk of a child of a
/// PCI function (an NVMe namespace of its controller), or a partition of
/// one. `ENXIO` when no member is found (none of them on PCI), `EOPNOTSUPP`
/// when the members are on more than [`MAX_PATHS`] functions.
///
/// A member on no PCI function (a fabrics namespace, a loop device) is not
/// found. Such a device takes no P2P pages (`BLK_FEAT_PCI_P2PDMA`), nor
/// does an md array with it, which `BLOCK_IO` checks first.
fn members(slaves: *mut bindings::kobject, peers: KVec<Peer>) -> Result<KVec<Peer>> {
    if slaves.is_null() {
        return Err(ENXIO);
    }
    let mut m = MemberMatch {
        // SAFETY: `slaves` is a live kobject (see the caller); its sysfs
        // node with it.
        slaves: unsafe { (*slaves).sd },
        peers,
        found: false,
    };
    let mut overflow = false;
    each_pci_function(|pdev| {
        m.found = false;
        // SAFETY: `pdev` is referenced for the call; `m` outlives it,
        // which passes it to the callbacks only.
        unsafe {
            bindings::device_for_each_child(
                &raw mut (*pdev).dev,
                (&raw mut m).cast(),
                Some(member_controller),
            )
        };
        if !m.found {
            return true;
        }
        if m.peers.len() >= MAX_PATHS {
            overflow = true;
            return false;
        }
        // SAFETY: `pdev` is referenced; the reference taken is the peer's.
        if let Some(peer) = unsafe { Peer::from_raw(bindings::pci_dev_get(pdev)) } {
            // Within the capacity reserved for `MAX_PATHS`: no allocation.
            let _ = m.peers.push(peer, GFP_KERNEL);
        }
        true
    });
    if overflow {
        return Err(EOPNOTSUPP);
    }
    if m.peers.is_empty() {
        return Err(ENXIO);
    }
    Ok(m.peers)
}

/// Calls `f` with each PCI function of the machine, referenced for the
/// call, until it returns `false`.
fn each_pci_function(mut f: impl FnMut(*mut bindings::pci_dev) -> bool) {
    let mut pdev = core::ptr::null_mut();
    loop {
        // SAFETY: Drops the reference on the previous device (if any) and
        // returns the next one referenced, or NULL after the last.
        pdev = unsafe {
            bindings::pci_get_device(
                bindings::PCI_ANY_ID as u32,
                bindings::PCI_ANY_ID as u32,
                pdev,
            )
        };
        if pdev.is_null() {
            return;
        }
        if !f(pdev) {
            // SAFETY: Drops the reference `pci_get_device` took.
            unsafe { bindings::pci_dev_put(pdev) };
            return;
        }
    }
}

/// The stacked device's members being looked for, and the PCI functions
/// found so far.
struct MemberMatch {
    /// The stacked disk's `slaves` directory.
    slaves: *mut bindings::kernfs_node,
    peers: KVec<Peer>,
    /// The PCI function being walked has a member.
    found: bool,
}

/// `device_for_each_child` callback over a PCI function's children (an
/// NVMe controller): walks their disks.
///
/// # Safety
///
/// `ctrl` is a live device and `data` the [`MemberMatch`] passed to
/// `device_for_each_child`.
unsafe extern "C" fn member_controller(ctrl: *mut bindings::device, data: *mut c_void) -> c_int {
    // SAFETY: See the function's safety section.
    unsafe { bindings::device_for_each_child(ctrl, data, Some(member_disk)) }
}

/// `device_for_each_child` callback over a controller's children (its
/// disks): nonzero, and the match marked, for a member or a disk with a
/// partition that is one.
///
/// # Safety
///
/// `dev` is a live device and `data` the [`MemberMatch`] passed to
/// `device_for_each_child`, not otherwise borrowed.
unsafe extern "C" fn member_disk(dev: *mut bindings::device, data: *mut c_void) -> c_int {
    // SAFETY: See the function's safety section.
    if unsafe { named_member(dev, data) } != 0 {
        return 1;
    }
    // SAFETY: As above.
    unsafe { bindings::device_for_each_child(dev, data, Some(named_member)) }
}

/// `device_for_each_child` callback over a disk's children (its
/// partitions), and the check of a disk itself: nonzero, and the match
/// marked, when `dev` is named in the stacked disk's `slaves` directory.
///
/// # Safety
///
/// As for [`member_disk`].
unsafe extern "C" fn named_member(dev: *mut bindings::device, data: *mut c_void) -> c_int {
    // SAFETY: See the function's safety section.
    let m = unsafe { &mut *data.cast::<MemberMatch>() };
    // SAFETY: `dev` is live; its name is a NUL-terminated string, and the
    // `slaves` node lives as long as the stacked disk the caller holds.
    let kn = unsafe {
        bindings::kernfs_find_and_get_ns(m.slaves, bindings::dev_name(dev), core::ptr::null())
    };
    if kn.is_null() {
        return 0;
    }
    // SAFETY: Drops the reference the lookup took.
    unsafe { bindings::kernfs_put(kn) };
    m.found = true;
    1
}

/// Reads a decimal number at the start of `s`, as `sscanf`'s `%d` does
/// (spaces, then an optional minus sign, then digits); returns it and the
/// rest of `s`.
fn scan_int(s: &[u8]) -> Option<(i32, &[u8])> {
    let s = s.trim_ascii_start();
    let (neg, s) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let mut v: i32 = 0;
    for &c in &s[..digits] {
        v = v.checked_mul(10)?.checked_add(i32::from(c - b'0'))?;
    }
    Some((if neg { -v } else { v }, &s[digits..]))
}

/// The subsystem and head numbers of an NVMe multipath head's disk name,
/// `nvme<subsys>n<head>`.
fn mpath_head(name: &[u8]) -> Option<(i32, i32)> {
    let (subsys, rest) = scan_int(name.strip_prefix(b"nvme")?)?;
    let (head, rest) = scan_int(rest.strip_prefix(b"n")?)?;
    rest.is_empty().then_some((subsys, head))
}

/// The subsystem, controller and head numbers of an NVMe path disk's name,
/// `nvme<subsys>c<ctrl>n<head>`.
fn mpath_path(name: &[u8]) -> Option<(i32, i32, i32)> {
    let (subsys, rest) = scan_int(name.strip_prefix(b"nvme")?)?;
    let (ctrl, rest) = scan_int(rest.strip_prefix(b"c")?)?;
    let (head, rest) = scan_int(rest.strip_prefix(b"n")?)?;
    rest.is_empty().then_some((subsys, ctrl, head))
}

/// The multipath head being resolved, and the controllers found so far.
struct MpathMatch {
    subsys: i32,
    head: i32,
    peers: KVec<Peer>,
}

/// `device_for_each_child` callback over a PCI function's children: a child
/// with a path disk to the head is a controller of it; its PCI function is
/// a peer.
///
/// # Safety
///
/// `ctrl` is a live device and `data` the [`MpathMatch`] passed to
/// `device_for_each_child`, not otherwise borrowed.
unsafe extern "C" fn mpath_controller(ctrl: *mut bindings::device, data: *mut c_void) -> c_int {
    // SAFETY: See the function's safety section.
    let m = unsafe { &mut *data.cast::<MpathMatch>() };
    // SAFETY: `ctrl` is live, and its parent with it.
    let pci = unsafe { (*ctrl).parent };
    // SAFETY: As above.
    if pci.is_null() || !unsafe { bindings::dev_is_pci(pci) } || m.peers.len() >= MAX_PATHS {
        return 0;
    }
    // SAFETY: `ctrl` is live; `m` is passed to the callback only.
    let found = unsafe { bindings::device_for_each_child(ctrl, data, Some(mpath_path_disk)) };
    if found != 0 {
        // SAFETY: `pci` is the `dev` field of a live `struct pci_dev`; the
        // reference taken is the peer's.
        let peer = unsafe {
            let pdev = kernel::container_of!(pci, bindings::pci_dev, dev);
            Peer::from_raw(bindings::pci_dev_get(pdev))
        };
        if let Some(peer) = peer {
            // Within the capacity reserved for `MAX_PATHS`: no allocation.
            let _ = m.peers.push(peer, GFP_KERNEL);
        }
    }
    0
}

/// `device_for_each_child` callback over a controller's children: nonzero
/// for a path disk to the head.
///
/// # Safety
///
/// `dev` is a live device and `data` the [`MpathMatch`] passed to
/// `device_for_each_child`.
unsafe extern "C" fn mpath_path_disk(dev: *mut bindings::device, data: *mut c_void) -> c_int {
    // SAFETY: See the function's safety section; only read.
    let m = unsafe { &*data.cast::<MpathMatch>() };
    // SAFETY: `dev` is live; its name is a NUL-terminated string.
    let name = unsafe { CStr::from_char_ptr(bindings::dev_name(dev).cast::<c_char>()) };
    match mpath_path(name.to_bytes()) {
        Some((s, _, h)) if s == m.subsys && h == m.head => 1,
        _ => 0,
    }
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

/// Most bytes one `read(2)` or `write(2)` moves (`MAX_RW_COUNT`).
const MAX_RW_COUNT: u64 = (i32::MAX as u64) & !(kernel::page::PAGE_SIZE as u64 - 1);

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
        let at = i64::try_from(pos).map_err(|_| EINVAL)?;
        if len > MAX_RW_COUNT {
            return Err(EINVAL);
        }
        let op = if write {
            bindings::WRITE
        } else {
            bindings::READ
        };
        // SAFETY: `file` is a valid, referenced file; `at` is a live local.
        to_result(unsafe {
            bindings::rw_verify_area(op as c_int, self.file.as_ptr(), &at, len as usize)
        })
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
    /// and, before a `write`, drops them, as the block layer's own direct
    /// I/O does (`EBUSY` when a page cannot be dropped).
    pub(crate) fn sync_cache(&self, pos: u64, len: u64, write: bool) -> Result {
        // Callers validate segments first; an empty one syncs one byte.
        let last = pos.checked_add(len.max(1) - 1).ok_or(EINVAL)?;
        let (start, end) = (
            i64::try_from(pos).map_err(|_| EINVAL)?,
            i64::try_from(last).map_err(|_| EINVAL)?,
        );
        // SAFETY: By the type invariant `bdev` is open, and its page cache
        // mapping with it.
        let mapping = unsafe { (*self.bdev.as_ptr()).bd_mapping };
        // SAFETY: As above.
        to_result(unsafe { bindings::filemap_write_and_wait_range(mapping, start, end) })?;
        // SAFETY: As above; `nrpages` is read as the C code reads it,
        // without a lock.
        if !write || unsafe { (*mapping).nrpages } == 0 {
            return Ok(());
        }
        let shift = bindings::PAGE_SHIFT;
        // SAFETY: As above.
        to_result(unsafe {
            bindings::invalidate_inode_pages2_range(
                mapping,
                (pos >> shift) as c_ulong,
                (last >> shift) as c_ulong,
            )
        })
    }
}

/// The bios in flight for one [`BlockIo`], the first error, and the plug
/// batching them. Bios point to it (`bi_private`) until they end.
#[pin_data]
struct IoState {
    /// Bios submitted and not ended. Its address is also the key
    /// completions wake the waiter with (`wake_up_var`).
    inflight: Atomic<i32>,
    /// The first error of the bios that ended (0 if none), a negative errno.
    error: Atomic<i32>,
    #[pin]
    plug: Opaque<bindings::blk_plug>,
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
/// Every bio submitted through it moves data between `pages` and `bdev`,
/// both borrowed for `'a`, points to `io`, and has ended before `run`
/// returns.
pub(crate) struct BlockIo<'a> {
    io: Pin<KBox<IoState>>,
    /// The plug in `io` is the current task's.
    plugged: Cell<bool>,
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
        let io = KBox::pin_init(
            pin_init!(IoState {
                inflight: Atomic::new(0),
                error: Atomic::new(0),
                plug: Opaque::uninit(),
            }),
            GFP_KERNEL,
        )?;
        let this = Self {
            io,
            plugged: Cell::new(false),
            bdev,
            pages,
        };
        let r = f(&this);
        // The task's plug must not outlive `io`.
        if this.plugged.get() {
            this.plug(false);
        }
        // INVARIANT: no bio is in flight when `this` goes.
        this.wait_below(1);
        Ok(r)
    }

    /// Batches the following submissions into one plug (`on`), or flushes
    /// them (`!on`), as `blk_start_plug`/`blk_finish_plug` do.
    pub(crate) fn plug(&self, on: bool) {
        if on == self.plugged.get() {
            return;
        }
        // SAFETY: The plug is pinned in `io`, which outlives its use by the
        // current task: `run` ends it before `io` goes.
        unsafe {
            if on {
                bindings::blk_start_plug(self.io.plug.get())
            } else {
                bindings::blk_finish_plug(self.io.plug.get())
            }
        }
        self.plugged.set(on);
    }

    /// Submits one bio moving `len` bytes between byte `mem_offset` of the
    /// pages and byte `pos` of the device (from the device when `!write`).
    /// The pages go into one multi-page segment; `__bio_add_page` marks the
    /// bio `REQ_NOMERGE` since it holds P2P pages, so the block layer never
    /// merges it with I/O on other memory.
    pub(crate) fn submit(&self, write: bool, pos: u64, mem_offset: u64, len: u64) -> Result {
        let end = mem_offset.checked_add(len).ok_or(EINVAL)?;
        let len32 = u32::try_from(len).map_err(|_| EINVAL)?;
        if len == 0 || end > self.pages.size() as u64 {
            return Err(EINVAL);
        }
        let offset = usize::try_from(mem_offset).map_err(|_| EINVAL)?;
        let (page, in_page) = self.pages.page_at(offset).ok_or(EINVAL)?;
        let opf = if write {
            bindings::req_op_REQ_OP_WRITE
                | (1 << bindings::req_flag_bits___REQ_SYNC)
                | (1 << bindings::req_flag_bits___REQ_IDLE)
        } else {
            bindings::req_op_REQ_OP_READ
        };
        // SAFETY: The device is open (`BlockDev`'s invariant); `fs_bio_set`
        // is the kernel's bio pool for file systems (`bio_alloc`).
        let bio = unsafe {
            bindings::bio_alloc_bioset(
                self.bdev.bdev.as_ptr(),
                1,
                opf,
                bindings::GFP_KERNEL,
                &raw mut bindings::fs_bio_set,
            )
        };
        if bio.is_null() {
            return Err(ENOMEM);
        }
        let state: *const IoState = &*self.io;
        // SAFETY: `bio` is a fresh bio with room for one vector; the range
        // lies in `pages` (checked above), which outlive every bio, as does
        // the open device and `io`: `run` waits for the bios before its
        // borrows end (type invariant). `end_io` gets `io` back.
        unsafe {
            (*bio).bi_iter.bi_sector = pos >> bindings::SECTOR_SHIFT;
            bindings::__bio_add_page(bio, page.as_ptr(), len32, in_page);
            (*bio).bi_private = state.cast_mut().cast();
            (*bio).bi_end_io = Some(end_io);
            self.io.inflight.add(1, Relaxed);
            bindings::submit_bio(bio);
        }
        Ok(())
    }

    /// Waits until fewer than `below` bios are in flight, as
    /// `blk_wait_io()` waits for a bio: in `io_schedule()`, counted as I/O
    /// wait, and waking every half second so that a long wait on slow
    /// storage is not taken for a hung task (the hung-task timeout is not
    /// exported; half a second is below any setting it can usefully have).
    pub(crate) fn wait_below(&self, below: u32) {
        let below = i32::try_from(below).unwrap_or(i32::MAX);
        let var = self.io.inflight.as_ptr().cast::<c_void>();
        let entry = Opaque::<bindings::wait_bit_queue_entry>::uninit();
        // The loop of `___wait_var_event`, uninterruptible, with
        // `io_schedule_timeout` as its command.
        while self.io.inflight.load(Acquire) >= below {
            let mut left = msecs_to_jiffies(500) as c_long;
            // SAFETY: `var` is a live address, used as a key only;
            // `entry` is a local that does not move while it is queued,
            // from `prepare_to_wait_event` to `finish_wait`.
            unsafe {
                let head = bindings::__var_waitqueue(var);
                let wq_entry = &raw mut (*entry.get()).wq_entry;
                bindings::init_wait_var_entry(entry.get(), var, 0);
                loop {
                    bindings::prepare_to_wait_event(
                        head,
                        wq_entry,
                        bindings::TASK_UNINTERRUPTIBLE as c_int,
                    );
                    if self.io.inflight.load(Acquire) < below || left == 0 {
                        break;
                    }
                    left = bindings::io_schedule_timeout(left);
                }
                bindings::finish_wait(head, wq_entry);
            }
        }
    }

    /// The first error of the bios that ended so far.
    pub(crate) fn error(&self) -> Option<Error> {
        let e = self.io.error.load(Relaxed);
        (e < 0).then(|| Error::from_errno(e))
    }
}

/// A bio of a [`BlockIo`] ended: records its error, if it is the first, and
/// wakes the waiter.
///
/// # Safety
///
/// Called by the block layer once per bio submitted by [`BlockIo::submit`],
/// whose `bi_private` is the submitting call's live [`IoState`].
unsafe extern "C" fn end_io(bio: *mut bindings::bio) {
    // SAFETY: See the function's safety section; the state is alive until
    // `inflight` drops below what the waiter waits for.
    let (io, status) = unsafe { (&*(*bio).bi_private.cast::<IoState>(), (*bio).bi_status) };
    if status != 0 {
        // SAFETY: Converts a status; no requirements.
        let errno = unsafe { bindings::blk_status_to_errno(status) };
        let _ = io.error.cmpxchg(0, errno, Full);
    }
    // SAFETY: The block layer hands the bio's reference to its completion.
    unsafe { bindings::bio_put(bio) };
    // The key of the wake-up, computed while `io` is alive: the waiter may
    // free it as soon as the count drops.
    let var = io.inflight.as_ptr().cast::<c_void>();
    // Fully ordered, so the waiter sees the error.
    io.inflight.fetch_sub(1, Full);
    // SAFETY: `var` is only a key here, never dereferenced.
    unsafe { bindings::wake_up_var(var) };
}
