//! Accelerator memory backends behind one trait.
//!
//! The transfer engines see accelerator memory only through
//! [`DeviceMemory`]: its size, copies in and out (the bounce path's device
//! stage), and, for memory devices may reach, its [`DmaMemory`]: where the
//! CPU can map it, a [`DmaTarget`] that storage can DMA into directly (the
//! P2P path). `DmaMemory` is an `unsafe` trait: its answers become DMA
//! targets, so safe code cannot give them. Two backends exist:
//!
//! - [`ModuleMemory`](super::ModuleMemory): BAR memory allocated from the p2pdma kernel module,
//!   the real P2P target;
//! - [`HostMemory`]: the host-memory device, ordinary page-aligned host
//!   memory standing in for an accelerator on machines without one, so that
//!   every API and the bounce pipeline run anywhere.
//!
//! GPU memory fits the same trait ([`CudaMemory`](super::CudaMemory)):
//! copies through the GPU's copy engine out of host memory page-locked for
//! it ([`Stager`]), and a dma-buf peers import ([`DmaMemory::dmabuf`]).

use std::{fmt, os::fd::BorrowedFd, ptr, sync::Arc};

use crate::{
    error::check_range,
    sys::{DmaTarget, HostBuffer},
    Error, Module, PciAddress, Result,
};

/// What kind of memory a backend holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// BAR memory of accelerator `index` (PCI address `pci`), from the module.
    ModuleBar {
        /// The accelerator's index in the module.
        index: u32,
        /// Its PCI address.
        pci: crate::PciAddress,
    },
    /// Device memory of CUDA device `ordinal`.
    Cuda {
        /// The device's ordinal.
        ordinal: i32,
        /// Its PCI address, when the driver gives one.
        pci: Option<PciAddress>,
    },
    /// Memory another driver exported as a dma-buf, reached through it.
    Dmabuf,
    /// Host memory standing in for an accelerator.
    Host,
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::ModuleBar { index, pci } => {
                write!(f, "accelerator {index} ({pci}) BAR memory")
            }
            MemoryKind::Cuda { ordinal, pci } => match pci {
                Some(pci) => write!(f, "CUDA device {ordinal} ({pci}) memory"),
                None => write!(f, "CUDA device {ordinal} memory"),
            },
            MemoryKind::Dmabuf => f.write_str("dma-buf memory"),
            MemoryKind::Host => f.write_str("host-memory device"),
        }
    }
}

/// Accelerator memory as the transfer engines use it.
///
/// Implementations never hand out references into the memory: everything
/// goes through explicit copies, or, for memory devices reach, the answers
/// of its [`DmaMemory`], which only `unsafe` code can give.
///
/// # Concurrent use
///
/// One memory object may be used by many threads and transfers at once, and
/// storage may DMA into it while they run: it behaves like a device's memory,
/// not like a Rust buffer. Copies and transfers on disjoint ranges never
/// disturb each other. On overlapping ranges nothing is ordered: a copy out
/// of a range being written may see old bytes, new bytes or a mix, and after
/// two overlapping writes each byte holds one of them. Ordering overlapping
/// use is the caller's, as with two `O_DIRECT` I/Os on one buffer. No Rust
/// reference into the memory is ever made, so the `&[u8]`/`&mut [u8]` a
/// copy takes are always the caller's own host memory; a copy from or to
/// another memory's mapping takes it as a raw pointer
/// ([`write_at_raw`](Self::write_at_raw), [`read_at_raw`](Self::read_at_raw)).
/// Copies between two memories go through [`copy`](crate::memory::copy()).
pub trait DeviceMemory: Send + Sync + fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> usize;

    /// Whether the memory is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the memory is.
    fn kind(&self) -> MemoryKind;

    /// Copies `src` into the memory at `offset` (host to device).
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()>;

    /// Copies memory at `offset` into `dst` (device to host).
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()>;

    /// Copies `len` bytes at `src` into the memory at `offset`: a range of
    /// another memory's CPU mapping, which [`copy`](crate::memory::copy())
    /// hands over so that the bytes move once.
    ///
    /// The default stages the bytes through a host buffer of its own and
    /// [`write_at`](Self::write_at), so it copies twice; memory whose own
    /// copies can take a raw source overrides it (a dma-buf's mapping, a
    /// loan of host memory, CUDA memory).
    ///
    /// # Safety
    ///
    /// `src..src + len` must be valid for reads for the length of the call,
    /// and no Rust reference into it may exist: it is memory others may
    /// write at any time (a device, a peer's DMA, another thread's copy),
    /// so an implementation reads it only through raw pointers, never
    /// through a `&[u8]` made from it. It may overlap this memory's own
    /// range (a loan of this memory's mapping): which bytes land there is
    /// then unspecified, as for overlapping copies in flight at once, but
    /// the call stays sound.
    #[allow(unsafe_code)]
    unsafe fn write_at_raw(&self, offset: usize, src: *const u8, len: usize) -> Result<()> {
        check_range(offset, len, self.len())?;
        staged(len, false, |at, buf| {
            // SAFETY: `src..src + len` is readable (the caller's promise)
            // and `at + buf.len() <= len`; `buf` is this call's own buffer,
            // so the two cannot overlap.
            unsafe { ptr::copy_nonoverlapping(src.add(at), buf.as_mut_ptr(), buf.len()) };
            self.write_at(offset + at, buf)
        })
    }

    /// Copies `len` bytes of the memory at `offset` to `dst`, another
    /// memory's CPU mapping (see [`write_at_raw`](Self::write_at_raw)).
    ///
    /// The default stages the bytes through [`read_at`](Self::read_at) and
    /// a host buffer of its own.
    ///
    /// # Safety
    ///
    /// `dst..dst + len` must be valid for writes for the length of the
    /// call, and no Rust reference into it may exist: an implementation
    /// writes it only through raw pointers. Overlap with this memory's own
    /// range is allowed, as for [`write_at_raw`](Self::write_at_raw).
    #[allow(unsafe_code)]
    unsafe fn read_at_raw(&self, offset: usize, dst: *mut u8, len: usize) -> Result<()> {
        check_range(offset, len, self.len())?;
        staged(len, false, |at, buf| {
            self.read_at(offset + at, buf)?;
            // SAFETY: `dst..dst + len` is writable (the caller's promise)
            // and `at + buf.len() <= len`; `buf` is this call's own buffer.
            unsafe { ptr::copy_nonoverlapping(buf.as_ptr(), dst.add(at), buf.len()) };
            Ok(())
        })
    }

    /// What page-locks the host memory the bounce path stages this
    /// memory's copies through, for memory whose copies a device's DMA
    /// engine makes (a GPU's); `None` where the CPU copies.
    fn stager(&self) -> Option<&'static dyn Stager> {
        None
    }

    /// How storage and peers reach the memory by DMA, for memory they can
    /// reach: the memory itself, or memory it holds (see [`DmaMemory`]).
    /// `None` (the default) leaves every transfer to the copies.
    fn dma(&self) -> Option<&dyn DmaMemory> {
        None
    }

    /// Where the memory lies in a GPU's memory, for copies the GPUs make
    /// between two such memories without the host
    /// ([`copy`](crate::memory::copy())): its device, the device address of
    /// byte 0 and its length. `None` (the default) for every other memory.
    ///
    /// Only a [`CudaMemory`](crate::memory::CudaMemory) makes the answer
    /// (a wrapper returns the one of the memory it holds): the GPUs copy
    /// within it, and within the lengths of both.
    fn gpu(&self) -> Option<crate::sys::cuda::DeviceRange<'_>> {
        None
    }
}

/// Memory that storage and peers may reach by DMA: the answers of this
/// trait become DMA targets (`O_DIRECT` I/O into a CPU mapping, the
/// module's block I/O on an allocation, a controller's commands into a
/// mapping of an allocation, pinned host pages or an imported dma-buf).
///
/// A [`DeviceMemory`] hands its [`DmaMemory`] out through
/// [`DeviceMemory::dma`]. The transfer paths use only the answers of the
/// value they got there, its [`len`](DeviceMemory::len) included.
///
/// # Safety
///
/// Devices write what these answers describe at any time while a transfer
/// runs, outside anything the compiler can check. An implementation
/// promises, for as long as the value lives:
///
/// - the memory described is this value's: it holds it alive (allocated,
///   mapped, pinned where the answer needs it) and nothing else frees,
///   unmaps or reuses it while the value lives;
/// - no Rust reference into the memory exists or is handed to safe code:
///   it is reached only through raw pointers and explicit copies, as every
///   [`DeviceMemory`] is, so a device writing it cannot change memory safe
///   code reads through `&[u8]`;
/// - nothing trusts its contents for memory safety: it is no device's
///   queue, command or descriptor memory (a controller's submission queue
///   or PRP lists);
/// - [`dma_target`](Self::dma_target): `ptr..ptr + len` is such memory,
///   mapped in this process and valid for reads and writes, with
///   `len >= self.len()`; `p2p` is true only for PCI P2P memory;
/// - [`module_allocation`](Self::module_allocation): the handle names an
///   allocation of that module file which this value owns, of at least
///   `self.len()` bytes, holding this memory from its byte 0;
/// - [`dmabuf`](Self::dmabuf): the dma-buf's memory, from the offset given,
///   is this memory (at least `self.len()` bytes), and the dma-buf lives as
///   long as the value;
/// - the answers and [`len`](DeviceMemory::len) do not change while the
///   value lives.
#[allow(unsafe_code)]
pub unsafe trait DmaMemory: DeviceMemory {
    /// The CPU mapping storage can DMA into directly, if there is one.
    fn dma_target(&self) -> Option<DmaTarget> {
        None
    }

    /// For memory allocated from the module: the module and the
    /// allocation's handle, through which the module can do block I/O on
    /// the memory itself ([`Module::block_io`](crate::Module::block_io)).
    fn module_allocation(&self) -> Option<(&Arc<Module>, u64)> {
        None
    }

    /// The memory as a dma-buf its driver exported, for a peer to import
    /// ([`Module::dmabuf_import`]), and where byte 0 of the memory lies in
    /// it.
    fn dmabuf(&self) -> Option<(BorrowedFd<'_>, u64)> {
        None
    }
}

/// Page-locks host memory for a device's copy engine.
pub trait Stager: Send + Sync + fmt::Debug {
    /// The copy engine's name: host memory pinned once for it serves every
    /// memory with the same stager.
    fn name(&self) -> &'static str;

    /// Page-locks `buf` until the pin is dropped (the pin keeps it alive).
    fn pin(&self, buf: Arc<HostBuffer>) -> Result<StagingPin>;
}

/// Host memory page-locked for a copy engine; unpinned when dropped.
pub struct StagingPin {
    name: &'static str,
    _guard: Box<dyn Send + Sync>,
}

impl fmt::Debug for StagingPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingPin")
            .field("for", &self.name)
            .finish()
    }
}

impl StagingPin {
    /// A pin for the stager `name`, undone by dropping `guard`.
    pub fn new(name: &'static str, guard: Box<dyn Send + Sync>) -> Self {
        Self {
            name,
            _guard: guard,
        }
    }

    /// The stager's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// The most bytes a copy stages through host memory at once.
const STAGE: usize = 4 << 20;

/// Moves `len` bytes through one host buffer of at most [`STAGE`] bytes,
/// a piece at a time: `step(at, buf)` moves the piece at `at` (of
/// `buf.len()` bytes) through `buf`. `backward` takes the pieces from the
/// last, so that a copy to a higher offset of the same bytes reads every
/// piece before it overwrites it.
pub(crate) fn staged(
    len: usize,
    backward: bool,
    mut step: impl FnMut(usize, &mut [u8]) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![0u8; len.min(STAGE)];
    let pieces = len.div_ceil(STAGE);
    for i in 0..pieces {
        let at = STAGE * if backward { pieces - 1 - i } else { i };
        let n = STAGE.min(len - at);
        step(at, &mut buf[..n])?;
    }
    Ok(())
}

/// The host-memory device: page-aligned host memory that stands in for an
/// accelerator where there is none. It is a valid `O_DIRECT` target, but
/// never P2P.
pub struct HostMemory {
    buf: HostBuffer,
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory")
            .field("len", &self.buf.len())
            .finish()
    }
}

impl HostMemory {
    /// `len` bytes (> 0) of zeroed, page-aligned host memory.
    pub fn new(len: usize) -> Result<Self> {
        let buf = HostBuffer::new(len).map_err(Error::sys("allocate host-memory device"))?;
        Ok(Self { buf })
    }

    /// Faults every page in (writing zeros), so that the first copy or
    /// I/O into the memory does not.
    pub(crate) fn prefault(&self) {
        self.buf.fill(0);
    }

    /// `len` bytes at `offset`, borrowed.
    ///
    /// # Safety
    /// Nothing may write the range (no copy, no DMA) while the borrow
    /// lives.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn bytes(&self, offset: usize, len: usize) -> Result<&[u8]> {
        check_range(offset, len, self.len())?;
        // SAFETY: In bounds (checked); the caller guarantees no writer.
        Ok(unsafe { std::slice::from_raw_parts(self.buf.as_raw().add(offset), len) })
    }

    /// `len` bytes at `offset`, borrowed for writing.
    ///
    /// # Safety
    /// Nothing else may read or write the range while the borrow lives.
    #[allow(clippy::mut_from_ref, unsafe_code)]
    pub(crate) unsafe fn bytes_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        check_range(offset, len, self.len())?;
        // SAFETY: In bounds (checked); the caller guarantees exclusive use.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.buf.as_raw().add(offset), len) })
    }
}

impl DeviceMemory for HostMemory {
    fn len(&self) -> usize {
        self.buf.len()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len())?;
        self.buf
            .write_raw(offset, src)
            .map_err(Error::sys("copy into host-memory device"))
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len())?;
        self.buf
            .read_raw(offset, dst)
            .map_err(Error::sys("copy from host-memory device"))
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

// SAFETY: The buffer is this value's own anonymous memory, unmapped only
// when it drops; no reference into it reaches safe code (`bytes` and
// `bytes_mut` are unsafe and crate-private), and it holds nothing but data.
#[allow(unsafe_code)]
unsafe impl DmaMemory for HostMemory {
    fn dma_target(&self) -> Option<DmaTarget> {
        Some(DmaTarget {
            ptr: self.buf.as_raw(),
            len: self.buf.len(),
            p2p: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_copies_and_checks_bounds() {
        let m = HostMemory::new(8192).unwrap();
        assert_eq!(m.kind(), MemoryKind::Host);
        m.write_at(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        m.read_at(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(matches!(
            m.write_at(8190, b"abc"),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.read_at(usize::MAX, &mut out),
            Err(Error::OutOfBounds { .. })
        ));
        let t = m.dma().and_then(|d| d.dma_target()).unwrap();
        assert_eq!(t.ptr as usize % 4096, 0);
        assert!(!t.p2p);
    }
}
