// SPDX-License-Identifier: GPL-2.0

//! Block devices and the bios the module submits to them (upstream's
//! `kernel::block` serves block drivers, it submits no bios), and the PCI
//! functions behind a block device.

use core::ptr::NonNull;

use kernel::{bindings, error::to_result, ffi::c_int, fs::file::LocalFile, prelude::*};

use super::{
    p2pmem::P2pPages,
    pci::Peer, //
};

mod raw {
    use kernel::{
        bindings,
        ffi::{
            c_int,
            c_void, //
        },
    };

    #[expect(
        improper_ctypes,
        reason = "C structs are only passed by pointer, never by value"
    )]
    unsafe extern "C" {
        // helpers.c: static inline functions, macros, module parameters and
        // operation tables.
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
    }

    /// `struct p2pdma_io` of helpers.c, only handled by pointer.
    #[repr(C)]
    pub(crate) struct IoRaw {
        _opaque: [u8; 0],
    }
}

/// Most PCI functions one block device resolves to (paths of a multipath
/// device).
pub(crate) const MAX_PATHS: usize = 8;
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
