//! Copies between two memories, in one place.
//!
//! [`copy`] moves a range of one [`DeviceMemory`] to another, whatever the
//! two are, with as few passes over the bytes as the memories allow:
//!
//! - **Both sides mapped for the CPU** (a [`DmaTarget`] from
//!   [`dma_target`](crate::memory::DmaMemory::dma_target): the host-memory
//!   device, host memory lent by a caller, BAR memory from the module): one
//!   copy from mapping to mapping, with the write-combined routines
//!   ([`crate::sys::wc`]) on the side that is PCI memory, and no method of
//!   either memory in between, as when storage DMAs into a mapping.
//! - **One side mapped**: the other memory copies between its own memory
//!   and the mapping, through its raw-pointer copies
//!   ([`DeviceMemory::read_at_raw`], [`DeviceMemory::write_at_raw`]): one
//!   copy for memory that makes them itself (a dma-buf's mapping, a loan of
//!   host memory, CUDA memory, whose driver copies straight from or into
//!   the mapping), two through a host buffer for memory that keeps the
//!   defaults. A mapping of PCI memory is only ever written
//!   this way, never read: a CPU read of it wants the streaming loads of
//!   its own copies, so a copy out of it to memory without a mapping is
//!   staged as below.
//! - **Both sides GPU memory** ([`DeviceMemory::gpu`]): the GPUs copy,
//!   within one device or between two (peer to peer where they reach each
//!   other), and the host moves no byte.
//! - **Otherwise**: through a host buffer of at most 4 MiB, the source's
//!   [`read_at`](DeviceMemory::read_at) into it and the destination's
//!   [`write_at`](DeviceMemory::write_at) out of it.
//!
//! Both ranges are checked before the first byte moves. A copy within one
//! memory whose ranges overlap goes through the host buffer, in the order
//! that reads every byte before it is overwritten.

use std::ptr;

use crate::{
    error::check_range,
    memory::device::{staged, DeviceMemory},
    sys::{cuda as gpu, wc, DmaTarget},
    Result,
};

/// Copies `len` bytes of `src` at `src_offset` to `dst` at `dst_offset`.
///
/// Both ranges are checked first: out of range, nothing moves and the
/// error is [`Error::OutOfBounds`](crate::Error::OutOfBounds). The bytes
/// move once where both memories are mapped for the CPU, or one is and the
/// other copies raw ranges itself; else through a host buffer (see the
/// module's documentation). As for every copy
/// ([`DeviceMemory`]'s concurrent use), a copy racing a write of either
/// range sees old bytes, new bytes or a mix.
#[allow(unsafe_code)]
pub fn copy(
    src: &dyn DeviceMemory,
    src_offset: usize,
    dst: &dyn DeviceMemory,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check_range(src_offset, len, src.len())?;
    check_range(dst_offset, len, dst.len())?;
    if len == 0 {
        return Ok(());
    }
    if let (Some(s), Some(d)) = (src.gpu(), dst.gpu()) {
        let (s_at, d_at) = (s.ptr + src_offset as u64, d.ptr + dst_offset as u64);
        let same_device = s.ctx.ordinal() == d.ctx.ordinal();
        if !same_device || !overlaps(s_at as usize, d_at as usize, len) {
            // SAFETY: Each range is memory a `CudaMemory` holds while it is
            // borrowed; `dst` is written only as any copy into it would be
            // (`DeviceMemory`'s concurrent use).
            return unsafe { gpu::copy_between(d, dst_offset, s, src_offset, len) };
        }
    }
    let from = mapped(src, src_offset, len);
    let to = mapped(dst, dst_offset, len);
    let same = ptr::addr_eq(src, dst);
    let overlap = match (from, to) {
        (Some((s, _)), Some((d, _))) => overlaps(s as usize, d as usize, len),
        _ => same && overlaps(src_offset, dst_offset, len),
    };
    if overlap {
        let backward = match (from, to) {
            (Some((s, _)), Some((d, _))) => d as usize > s as usize,
            _ => dst_offset > src_offset,
        };
        return through_host(src, src_offset, dst, dst_offset, len, backward);
    }
    match (from, to) {
        (Some((s, s_p2p)), Some((d, d_p2p))) => {
            // SAFETY: Both ranges lie in CPU mappings that their memories'
            // `DmaMemory` answers vouch for: mapped in this process, valid
            // for reads and writes for as long as the memories live (they
            // are borrowed for this call), reached by no Rust reference.
            // They do not overlap (checked above).
            unsafe {
                if s_p2p {
                    wc::copy_from_wc(d, s, len);
                } else if d_p2p {
                    wc::copy_to_wc(d, s, len);
                } else {
                    ptr::copy_nonoverlapping(s, d, len);
                }
            }
            if d_p2p {
                wc::store_fence();
            }
            Ok(())
        }
        (_, Some((d, _))) => {
            // SAFETY: `d..d + len` lies in `dst`'s CPU mapping (`mapped`),
            // valid for writes while `dst` is borrowed and reached by no
            // Rust reference (its `DmaMemory` contract). Overlap with
            // `src`'s own bytes is allowed by `read_at_raw`.
            unsafe { src.read_at_raw(src_offset, d, len) }?;
            // Whatever stores the source's copy made, the destination's
            // device and peers see them before this returns.
            wc::store_fence();
            Ok(())
        }
        (Some((s, false)), None) => {
            // SAFETY: `s..s + len` lies in `src`'s CPU mapping, valid for
            // reads while `src` is borrowed and reached by no Rust
            // reference.
            unsafe { dst.write_at_raw(dst_offset, s, len) }
        }
        _ => through_host(src, src_offset, dst, dst_offset, len, false),
    }
}

/// Where `[offset, offset + len)` of `mem` lies in its CPU mapping, and
/// whether that is PCI memory (write-combined or uncached), when the
/// memory has a mapping that holds the whole range.
fn mapped(mem: &dyn DeviceMemory, offset: usize, len: usize) -> Option<(*mut u8, bool)> {
    let dma = mem.dma()?;
    let DmaTarget {
        ptr,
        len: mapped,
        p2p,
    } = dma.dma_target()?;
    // The transfer paths trust the answers of the `DmaMemory` alone: its
    // length bounds what its mapping may be used for.
    check_range(offset, len, mapped.min(dma.len())).ok()?;
    Some((ptr.wrapping_add(offset), p2p))
}

/// Whether `[a, a + len)` and `[b, b + len)` share a byte.
pub(crate) fn overlaps(a: usize, b: usize, len: usize) -> bool {
    a.abs_diff(b) < len
}

/// Copies through a host buffer: `src`'s `read_at` into it, `dst`'s
/// `write_at` out of it, the last piece first when `backward`.
fn through_host(
    src: &dyn DeviceMemory,
    src_offset: usize,
    dst: &dyn DeviceMemory,
    dst_offset: usize,
    len: usize,
    backward: bool,
) -> Result<()> {
    staged(len, backward, |at, buf| {
        src.read_at(src_offset + at, buf)?;
        dst.write_at(dst_offset + at, buf)
    })
}

#[cfg(test)]
pub(crate) mod tests;
