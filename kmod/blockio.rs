// SPDX-License-Identifier: GPL-2.0

//! `BLOCK_IO`: reads and writes between an allocation and a block device,
//! as bios the module builds on the allocation's own P2P pages.
//!
//! `O_DIRECT` on a user mapping of the memory pins every page of every I/O
//! (`FOLL_PCI_P2PDMA`), builds a bio segment per page and unpins at
//! completion; here the pages are already held by the allocation, so each
//! segment is one bio with one multi-page vector, and the block layer and
//! the NVMe driver map it as they map any P2P memory (a bio of P2P pages is
//! marked `REQ_NOMERGE`, never merged with I/O on other memory). The
//! caller must be allowed the I/O itself: the block device is one it opened
//! for reading or writing, and the checks `read(2)`/`write(2)` make of each
//! range (`rw_verify_area`: security modules, fanotify) pass.

use kernel::{
    dma::DataDirection,
    fs::file::LocalFile,
    prelude::*,
    sync::{
        Arc,
        Mutex, //
    },
    uaccess::{
        UserPtr,
        UserSlice, //
    },
};

use crate::{
    accel::DEVICES,
    ffi::{
        block::{
            BlockDev,
            BlockIo, //
        },
        mm::PAGE_SIZE,
        pci::Peer,
        task, //
    },
    memory::Alloc,
    uapi, //
};

/// Pairs of an accelerator (its probe page) and a block device (its device
/// number) found reachable, so that small I/Os do not pay for the trial
/// mapping each time. The kernel caches the same answer per pair for good
/// (`pci_p2pdma_map_type`), and the driver applies the P2PDMA rules to
/// every bio anyway: this only decides which errno a refusal gets.
pub(crate) type Reachable = KVec<(usize, u32)>;

/// Most pairs remembered per file.
const REACHABLE_MAX: usize = 16;

/// Runs `BLOCK_IO` on `alloc` (an allocation of the caller's file) with
/// the argument `arg`, already read; sets `arg.bytes`. `reach` is the
/// file's memory of reachable pairs.
pub(crate) fn run(
    alloc: &Alloc,
    arg: &mut uapi::P2pdmaBlockIo,
    reach: &Mutex<Reachable>,
) -> Result {
    if arg.flags & !uapi::P2PDMA_IO_WRITE != 0
        || arg.bytes != 0
        || arg.reserved != [0; 4]
        || arg.num_segs == 0
        || arg.num_segs > uapi::P2PDMA_IO_MAX_SEGS
        || arg.depth > uapi::P2PDMA_IO_MAX_DEPTH
    {
        return Err(EINVAL);
    }
    let write = arg.flags & uapi::P2PDMA_IO_WRITE != 0;
    let depth = match arg.depth {
        0 => uapi::P2PDMA_IO_DEFAULT_DEPTH,
        d => d,
    };
    let fd = u32::try_from(arg.fd).map_err(|_| EBADF)?;
    let file = LocalFile::fget(fd)?;
    let bdev = BlockDev::of(&file)?;
    let facts = *bdev.facts();
    if (write && !facts.writable) || (!write && !facts.readable) {
        return Err(EBADF);
    }
    // What `write(2)` on the device checks first (blkdev_write_iter): a
    // read-only device, an active swap device.
    if write && facts.read_only {
        return Err(EPERM);
    }
    if write && facts.swap {
        return Err(ETXTBSY);
    }
    if !facts.p2pdma {
        return Err(EOPNOTSUPP);
    }
    let segs = read_segs(arg.segs_ptr, arg.num_segs)?;
    let block = u64::from(facts.logical_block_size.max(1));
    let dma_mask = u64::from(facts.dma_alignment);
    let mut total = 0u64;
    for s in &segs {
        let dev_end = s.dev_offset.checked_add(s.len).ok_or(EINVAL)?;
        let mem_end = s.mem_offset.checked_add(s.len).ok_or(EINVAL)?;
        if s.len == 0
            || s.len > uapi::P2PDMA_IO_MAX_SEG_LEN
            || s.dev_offset % block != 0
            || s.len % block != 0
            || s.mem_offset & dma_mask != 0
            || dev_end > facts.size
            || mem_end > alloc.size
        {
            return Err(EINVAL);
        }
        total += s.len;
    }
    reachable(alloc, bdev.file(), facts.dev, reach)?;
    let pages = alloc.pages()?;
    for s in &segs {
        bdev.verify(write, s.dev_offset, s.len)?;
    }
    for s in &segs {
        bdev.sync_cache(s.dev_offset, s.len, write)?;
    }
    let moved = BlockIo::run(&bdev, &pages, |io| {
        io.plug(true);
        let mut stopped = Ok(());
        for s in &segs {
            if io.error().is_some() {
                break;
            }
            if task::fatal_signal_pending() {
                stopped = Err(EINTR);
                break;
            }
            io.wait_below(depth);
            if let Err(e) = io.submit(write, s.dev_offset, s.mem_offset, s.len) {
                stopped = Err(e);
                break;
            }
        }
        io.plug(false);
        io.wait_below(1);
        match io.error() {
            Some(e) => Err(e),
            None => stopped,
        }
    })
    .and_then(|r| r);
    if write {
        // Pages read into the cache while the write ran are stale now; a
        // page that cannot be dropped (mapped by a process) stays, as it
        // does after the kernel's own direct writes.
        for s in &segs {
            let _ = bdev.sync_cache(s.dev_offset, s.len, true);
        }
    }
    moved?;
    // A descriptor opened with O_DSYNC or O_SYNC: the data is durable when
    // the call returns, as after `write(2)` on it (generic_write_sync).
    if write && facts.sync {
        bdev.flush()?;
    }
    bdev.notify(write);
    arg.bytes = total;
    Ok(())
}

/// Reads the caller's `n` segments at `ptr`.
fn read_segs(ptr: u64, n: u32) -> Result<KVVec<uapi::P2pdmaIoSeg>> {
    let size = core::mem::size_of::<uapi::P2pdmaIoSeg>();
    let mut reader = UserSlice::new(UserPtr::from_addr(ptr as usize), n as usize * size).reader();
    let mut segs = KVVec::with_capacity(n as usize, GFP_KERNEL)?;
    for _ in 0..n {
        segs.push(reader.read()?, GFP_KERNEL)?;
    }
    Ok(segs)
}

/// `EREMOTEIO` unless the kernel lets every controller behind `file` (the
/// block device `dev`) reach the allocation's memory: one page of the
/// accelerator's is mapped for each, as the driver will map the bios.
fn reachable(alloc: &Alloc, file: &LocalFile, dev: u32, reach: &Mutex<Reachable>) -> Result {
    let probe = DEVICES
        .lock()
        .get(alloc.dev_index)
        .map(|d| d.probe.clone())
        .ok_or(ENODEV)?;
    // The probe page lives as long as its device's registry entry: a new
    // binding has a new one.
    let key = (Arc::as_ptr(&probe) as usize, dev);
    if reach.lock().contains(&key) {
        return Ok(());
    }
    // Mapped for the peer to read only, as `P2P_QUERY` does: the same
    // decision, and not counted by the DMA API among overlapping mappings.
    for peer in &Peer::from_file(file)? {
        probe.map_for(peer, 0, PAGE_SIZE, DataDirection::ToDevice)?;
    }
    let mut known = reach.lock();
    if known.len() >= REACHABLE_MAX {
        known.remove(0)?;
    }
    known.push(key, GFP_KERNEL)?;
    Ok(())
}
