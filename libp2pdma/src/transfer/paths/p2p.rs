//! The P2P path: the SSD's DMA engine reads or writes the accelerator's BAR
//! directly. Partial blocks at the ends go through a bounce slot (reads) or
//! the page cache (writes, exactly the bytes asked for); the block-aligned
//! middle goes direct, with up to `depth` I/Os in flight, submitted one of
//! two ways:
//!
//! - by the module (`BLOCK_IO`), for a block device and memory allocated
//!   from the module: it builds the block I/O on the allocation's own
//!   pages, so nothing is pinned per I/O;
//! - otherwise by `O_DIRECT` through io_uring with the memory's CPU mapping
//!   as the buffer: the kernel pins the mapping's pages for every I/O.
//!
//! The direct path into host memory runs here too, always by `O_DIRECT`.

use std::time::Instant;

use p2pdma_abi as abi;
use rustix::io::Errno;

use crate::transfer::{
    plan::{self, TransferPath},
    storage::StorageFile,
    tuning::config::P2pSubmit,
    xfer::{round_down, round_up, Direction, Xfer},
};
use crate::{
    memory::DeviceMemory,
    sys::uring::{Buf, Context, Session},
    Error, Module, Result,
};

/// Runs `x` in direction `dir` (`x.len() > 0`).
pub(crate) fn run(ctx: &mut Context, dir: Direction, x: &Xfer<'_>) -> Result<()> {
    let (file, file_offset, mem, len) = (x.file, x.file_offset, x.mem(), x.len());
    let target = x.dma_target()?;
    let bs = file.block_size() as u64;
    let mut s = Session::new(ctx, file.fd()?, file.block_size(), Some((target, mem)));
    let end = file_offset + len as u64;
    let (m0, m1) = (round_up(file_offset, bs), round_down(end, bs));
    match dir {
        Direction::Read => {
            if x.read_edges(&mut s, m0, m1)? {
                middle(&mut s, x, false, m0, m1)?;
            }
            Ok(())
        }
        Direction::Write => {
            x.write_edges(&mut s, m0, m1)?;
            if m0 < m1 {
                middle(&mut s, x, true, m0, m1)?;
            }
            Ok(())
        }
    }
}

/// The block-aligned `[m0, m1)` straight to or from device memory: by the
/// module where it can, else (or when the module refuses the shape or the
/// pair) by `O_DIRECT`.
fn middle(s: &mut Session<'_>, x: &Xfer<'_>, write: bool, m0: u64, m1: u64) -> Result<()> {
    if let Some((module, handle)) = module_io(x) {
        match by_module(s, x, module, handle, write, m0, m1) {
            Err(Error::Ioctl { source, .. }) if module_refused(source) => {}
            r => return r,
        }
    }
    by_odirect(s, x, write, m0, m1)
}

/// The module and allocation that can do `x`'s I/O (`BLOCK_IO`), if any.
fn module_io<'a>(x: &Xfer<'a>) -> Option<(&'a Module, u64)> {
    module_for(x.submit, x.file, x.mem())
}

/// The module and allocation that can move data between `file` and `mem`
/// by block I/O of its own: storage that is a block device, memory from a
/// module that has it, unless `submit` says otherwise.
fn module_for<'a>(
    submit: P2pSubmit,
    file: &StorageFile,
    mem: &'a dyn DeviceMemory,
) -> Option<(&'a Module, u64)> {
    let (module, handle) = mem.dma()?.module_allocation()?;
    plan::by_module(submit, file.is_file(), module.has_block_io()).then_some((&**module, handle))
}

/// Whether the module's refusal leaves `O_DIRECT` worth trying: it does not
/// do this device, shape or pair (`ENXIO`: it finds no PCI function behind
/// the device, as for an md array), or the page cache is in use; an I/O
/// error is the device's and is returned.
fn module_refused(e: Errno) -> bool {
    matches!(
        e,
        Errno::NXIO
            | Errno::OPNOTSUPP
            | Errno::REMOTEIO
            | Errno::INVAL
            | Errno::NOTBLK
            | Errno::BUSY
            | Errno::NOTTY
            | Errno::PERM
    )
}

/// The middle by the module's block I/O: one segment per chunk, `depth` in
/// flight, as many calls as the module's segment limit needs.
#[allow(clippy::too_many_arguments)]
fn by_module(
    s: &Session<'_>,
    x: &Xfer<'_>,
    module: &Module,
    handle: u64,
    write: bool,
    m0: u64,
    m1: u64,
) -> Result<()> {
    let chunk = (s.chunk() as u64).min(abi::P2PDMA_IO_MAX_SEG_LEN);
    let segs: Vec<abi::P2pdmaIoSeg> = (m0..m1)
        .step_by(chunk as usize)
        .map(|c0| abi::P2pdmaIoSeg {
            mem_offset: x.mem_at(c0) as u64,
            dev_offset: c0,
            len: chunk.min(m1 - c0),
        })
        .collect();
    let depth = u32::try_from(s.depth())
        .unwrap_or(abi::P2PDMA_IO_MAX_DEPTH)
        .min(abi::P2PDMA_IO_MAX_DEPTH);
    let t = Instant::now();
    for batch in segs.chunks(abi::P2PDMA_IO_MAX_SEGS as usize) {
        let c0 = batch[0].dev_offset;
        let len: u64 = batch.iter().map(|g| g.len).sum();
        // SAFETY: `module_for` took the handle from the memory's
        // `DmaMemory`, whose contract makes it an allocation of that
        // memory's own, holding data only.
        #[allow(unsafe_code)]
        let moved = unsafe { module.block_io(handle, x.file.fd()?, write, batch, depth) };
        match moved {
            Ok(n) if n == len => {}
            Ok(n) => {
                return Err(Error::Short {
                    what: if write {
                        "P2P write to storage"
                    } else {
                        "P2P read from storage"
                    },
                    expected: len,
                    done: n,
                })
            }
            Err(Error::Ioctl { source, .. }) if !module_refused(source) => {
                let what = if write { "P2P write" } else { "P2P read" };
                return Err(x.file.io_error(what, c0, len, source));
            }
            Err(e) => return Err(e),
        }
        x.stats.record_module_ios(batch.len() as u64);
    }
    x.stats.record_storage(t.elapsed());
    Ok(())
}

/// The middle by `O_DIRECT` through the ring, the memory's CPU mapping as
/// the buffer.
fn by_odirect(s: &mut Session<'_>, x: &Xfer<'_>, write: bool, m0: u64, m1: u64) -> Result<()> {
    let chunk = s.chunk() as u64;
    let n = (m1 - m0).div_ceil(chunk);
    let mut next = 0u64;
    let (op, what) = match (x.path, write) {
        (TransferPath::Direct, true) => ("direct write", "direct write to storage"),
        (TransferPath::Direct, false) => ("direct read", "direct read from storage"),
        (_, true) => ("P2P write", "P2P write to storage"),
        (_, false) => ("P2P read", "P2P read from storage"),
    };
    let short = |done: usize, clen: usize| Error::Short {
        what,
        expected: clen as u64,
        done: done as u64,
    };
    if n == 1 && s.inflight() == 0 {
        // One I/O: nothing to overlap it with.
        let clen = (m1 - m0) as usize;
        let buf = Buf::Target(x.mem_at(m0));
        let got = s
            .io_now(write, buf, m0, clen)?
            .map_err(|e| x.file.io_error(op, m0, clen as u64, e))?;
        x.stats.record_storage(x.start.elapsed());
        x.stats.record_ios(1);
        return if got < clen {
            Err(short(got, clen))
        } else {
            Ok(())
        };
    }
    loop {
        while next < n && s.inflight() < s.depth() {
            let c0 = m0 + next * chunk;
            let clen = chunk.min(m1 - c0) as usize;
            let buf = Buf::Target(x.mem_at(c0));
            if write {
                s.write(buf, c0, clen, next)?;
            } else {
                s.read(buf, c0, clen, next)?;
            }
            x.stats.record_ios(1);
            next += 1;
        }
        if s.inflight() == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let comps = s.wait(1)?;
        x.stats.record_storage(t.elapsed());
        for c in comps {
            let c0 = m0 + c.tag * chunk;
            let clen = chunk.min(m1 - c0) as usize;
            let got = c.res.map_err(|e| x.file.io_error(op, c0, clen as u64, e))?;
            if got < clen {
                return Err(short(got, clen));
            }
        }
    }
}
