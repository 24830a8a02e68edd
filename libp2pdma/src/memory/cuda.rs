//! GPU memory through CUDA: [`CudaMemory`] over an allocation of its own
//! (`cuMemAlloc`) or over device memory a caller lends (a torch or CuPy
//! tensor's), reached three ways:
//!
//! - by the GPU's copy engine, for the bounce path: `cuMemcpyHtoDAsync` and
//!   `cuMemcpyDtoHAsync` on a stream from the device's pool, out of and into
//!   host slots page-locked for CUDA once ([`CudaStager`]);
//! - by peers, as a dma-buf the driver exports
//!   (`cuMemGetHandleForAddressRange`) and the module imports for a
//!   controller (`DMABUF_IMPORT`): the queues path's commands then DMA into
//!   GPU memory directly;
//! - by the CPU, where the driver lets the dma-buf be mapped
//!   ([`CudaMemory::cpu_mapping`], over
//!   [`DmabufMapping`]).
//!
//! The driver is loaded at run time ([`crate::sys::cuda`]); without one,
//! every constructor returns [`Error::CudaUnavailable`].

#![allow(unsafe_code)]

use std::{
    fmt,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    sync::{Arc, OnceLock},
};

use crate::{
    discovery::PciAddress,
    error::check_range,
    memory::{
        device::{DeviceMemory, DmaMemory, MemoryKind, Stager, StagingPin},
        dmabuf::DmabufMapping,
    },
    sys::{
        cuda::{self, Context, Pointer, Stream},
        HostBuffer,
    },
    Error, Result,
};

const PAGE: usize = 4096;

/// Who frees the device memory.
enum Owner {
    /// Allocated here; freed when the memory drops.
    Allocated,
    /// Lent by the caller, who keeps it alive through this value.
    Lent(#[allow(dead_code)] Box<dyn Send + Sync>),
}

/// Device memory of one CUDA device.
pub struct CudaMemory {
    ctx: Arc<Context>,
    ptr: cuda::CUdeviceptr,
    len: usize,
    /// The page-aligned range `[lo, lo + span)` a dma-buf export covers
    /// (the allocation's pages that hold the memory).
    lo: cuda::CUdeviceptr,
    span: usize,
    owner: Owner,
    pci: Option<PciAddress>,
    dmabuf: OnceLock<std::result::Result<OwnedFd, String>>,
}

impl fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaMemory")
            .field("device", &self.ctx.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("lent", &matches!(self.owner, Owner::Lent(_)))
            .finish()
    }
}

impl CudaMemory {
    /// `len` bytes (> 0) of zeroed device memory on device `ordinal`.
    pub fn alloc(ordinal: i32, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a CUDA allocation of 0 bytes".into(),
            ));
        }
        let span = len
            .checked_next_multiple_of(PAGE)
            .ok_or_else(|| Error::InvalidArgument(format!("{len} bytes is too large")))?;
        let ctx = Context::primary(ordinal)?;
        let ptr = {
            let e = ctx.enter()?;
            cuda::mem_alloc(&e, span)?
        };
        let mem = Self::build(ctx, ptr, len, ptr, span, Owner::Allocated);
        // New memory holds whatever the device's last user left: zeroed,
        // as host memory from the kernel is, on a stream waited for (a
        // plain cuMemsetD8 runs on the legacy stream, which the memory's
        // own non-blocking streams do not wait for).
        // SAFETY: The whole allocation, just made; freed by `mem` on error.
        mem.with_stream(|s| unsafe { s.memset(ptr, 0, span) })?;
        Ok(mem)
    }

    /// The `len` bytes of device memory at `ptr`, which the caller owns
    /// (a tensor's `data_ptr`); `keep` is held as long as this value and
    /// must keep the memory alive (the tensor itself).
    ///
    /// The driver is asked what `ptr` is: it must be device memory, and
    /// `[ptr, ptr + len)` must lie inside one allocation. The memory's
    /// copies run on streams of its own: work the caller queued on its
    /// streams is not waited for, so the caller synchronizes first (as
    /// with cuFile).
    ///
    /// # Safety
    ///
    /// The copies write `[ptr, ptr + len)`, and peers DMA into it through
    /// its dma-buf ([`DmaMemory::dmabuf`]): the memory must be the caller's
    /// to lend, stay allocated as long as `keep` lives (this value holds
    /// it), and hold nothing whose contents anyone trusts for memory safety
    /// (another library's bookkeeping, a device's queues). No kernel on the
    /// GPU may use it while a transfer into it runs.
    pub unsafe fn lend(ptr: u64, len: usize, keep: impl Send + Sync + 'static) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument("lent CUDA memory of 0 bytes".into()));
        }
        let (ordinal, base, size) = match cuda::pointer(ptr)? {
            Pointer::Device {
                ordinal,
                base,
                size,
            } => (ordinal, base, size),
            Pointer::Host => {
                return Err(Error::InvalidArgument(format!(
                    "{ptr:#x} is page-locked host memory, not device memory"
                )))
            }
            Pointer::Unknown => {
                return Err(Error::InvalidArgument(format!(
                    "{ptr:#x} is not CUDA device memory"
                )))
            }
        };
        let end = ptr
            .checked_add(len as u64)
            .filter(|&e| e <= base + size)
            .ok_or_else(|| Error::OutOfBounds {
                offset: ptr - base,
                len: len as u64,
                size,
            })?;
        let lo = ptr / PAGE as u64 * PAGE as u64;
        let hi = end.next_multiple_of(PAGE as u64);
        let (lo, span) = if lo >= base && hi <= base + size {
            (lo, (hi - lo) as usize)
        } else {
            // Not page-aligned inside its allocation: no dma-buf can be
            // exported for it (copies still work).
            (0, 0)
        };
        let ctx = Context::primary(ordinal)?;
        Ok(Self::build(
            ctx,
            ptr,
            len,
            lo,
            span,
            Owner::Lent(Box::new(keep)),
        ))
    }

    fn build(ctx: Arc<Context>, ptr: u64, len: usize, lo: u64, span: usize, owner: Owner) -> Self {
        let pci = ctx.pci().and_then(|p| p.parse().ok());
        Self {
            ctx,
            ptr,
            len,
            lo,
            span,
            owner,
            pci,
            dmabuf: OnceLock::new(),
        }
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// The device address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The memory exported as a dma-buf, made on first use and kept: its
    /// file descriptor and where byte 0 of this memory lies in it.
    pub fn export_dmabuf(&self) -> Result<(BorrowedFd<'_>, u64)> {
        let made = self.dmabuf.get_or_init(|| {
            if self.span == 0 {
                return Err(format!(
                    "{:#x}+{:#x} does not cover whole pages of its allocation",
                    self.ptr, self.len
                ));
            }
            let e = self.ctx.enter().map_err(|e| e.to_string())?;
            cuda::export_dmabuf(&e, self.lo, self.span).map_err(|e| e.to_string())
        });
        match made {
            Ok(fd) => Ok((fd.as_fd(), self.ptr - self.lo)),
            Err(why) => Err(Error::PathUnavailable {
                path: "dma-buf",
                reason: why.clone(),
            }),
        }
    }

    /// The memory mapped for the CPU through its dma-buf, gdrcopy-style,
    /// where the driver allows the mapping: small copies then cost a CPU
    /// copy over PCIe, no driver call and no DMA set-up.
    pub fn cpu_mapping(&self) -> Result<CpuMapping<'_>> {
        let (fd, at) = self.export_dmabuf()?;
        // SAFETY: The dma-buf of this value's own memory, which it lends
        // for copies.
        let map = unsafe { DmabufMapping::map(fd, self.span) }?;
        Ok(CpuMapping {
            fd,
            map,
            at: at as usize,
            len: self.len,
        })
    }

    /// Copies `len` bytes of `src` at `src_offset` into this memory at
    /// `offset` by the GPUs, the host moving no byte (see
    /// [`cuda::copy_between`]): ranges that overlap in one device's memory
    /// are refused ([`Error::InvalidArgument`]); nothing moves on any
    /// error.
    pub fn copy_from(
        &self,
        offset: usize,
        src: &CudaMemory,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        // SAFETY: Device memory these values hold, for their lengths.
        unsafe { cuda::copy_between(self.range(), offset, src.range(), src_offset, len) }
    }

    /// The memory as the GPUs' copy engines address it.
    fn range(&self) -> cuda::DeviceRange<'_> {
        cuda::DeviceRange {
            ctx: &self.ctx,
            ptr: self.ptr,
            len: self.len,
        }
    }

    /// Runs `f` with a stream of the device's, the context current.
    fn with_stream<T>(&self, f: impl FnOnce(&Stream) -> Result<T>) -> Result<T> {
        self.ctx.with_stream(f)
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        // The dma-buf goes first: nothing can reach the memory through it
        // once it is freed.
        drop(self.dmabuf.take());
        let Ok(e) = self.ctx.enter() else {
            return;
        };
        if matches!(self.owner, Owner::Allocated) {
            // SAFETY: Allocated here; no copy runs (we are being dropped),
            // our dma-buf is closed, and no controller maps it (a mapping
            // borrows or owns the memory it maps).
            let _ = unsafe { cuda::mem_free(&e, self.ptr) };
        }
    }
}

impl DeviceMemory for CudaMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Cuda {
            ordinal: self.ordinal(),
            pci: self.pci,
        }
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len)?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: In range (checked) of device memory this value holds.
        self.with_stream(|s| unsafe { s.copy_to_device(self.ptr + offset as u64, src) })
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len)?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: In range (checked) of device memory this value holds.
        self.with_stream(|s| unsafe { s.copy_from_device(dst, self.ptr + offset as u64) })
    }

    /// One copy by the GPU's driver straight from `src` (see
    /// [`DeviceMemory::write_at_raw`]).
    #[allow(unsafe_code)]
    unsafe fn write_at_raw(&self, offset: usize, src: *const u8, len: usize) -> Result<()> {
        check_range(offset, len, self.len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: In range (checked) of device memory this value holds;
        // `src..src + len` is readable for the call (the caller's promise),
        // and the driver reads it only through the pointer.
        self.with_stream(|s| unsafe { s.copy_to_device_raw(self.ptr + offset as u64, src, len) })
    }

    /// One copy by the GPU's driver straight into `dst` (see
    /// [`DeviceMemory::read_at_raw`]).
    #[allow(unsafe_code)]
    unsafe fn read_at_raw(&self, offset: usize, dst: *mut u8, len: usize) -> Result<()> {
        check_range(offset, len, self.len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: In range (checked) of device memory this value holds;
        // `dst..dst + len` is writable for the call (the caller's promise),
        // and the driver writes it only through the pointer.
        self.with_stream(|s| unsafe { s.copy_from_device_raw(dst, self.ptr + offset as u64, len) })
    }

    fn stager(&self) -> Option<&'static dyn Stager> {
        Some(&CudaStager)
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }

    fn gpu(&self) -> Option<cuda::DeviceRange<'_>> {
        Some(self.range())
    }
}

// SAFETY: The device memory is this value's: allocated here and freed when
// it drops, or lent under `lend`'s contract for as long as `keep`, which it
// holds. The dma-buf covers the memory's own pages and is closed before the
// memory is freed; no reference into device memory exists.
unsafe impl DmaMemory for CudaMemory {
    fn dmabuf(&self) -> Option<(BorrowedFd<'_>, u64)> {
        self.export_dmabuf().ok()
    }
}

/// A [`CudaMemory`] mapped for the CPU ([`CudaMemory::cpu_mapping`]).
#[derive(Debug)]
pub struct CpuMapping<'a> {
    fd: BorrowedFd<'a>,
    map: DmabufMapping,
    at: usize,
    len: usize,
}

impl CpuMapping<'_> {
    /// Copies `src` into the memory at `offset`.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len)?;
        self.map.write_at(self.fd, self.at + offset, src)
    }

    /// Copies the memory at `offset` into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len)?;
        self.map.read_at(self.fd, self.at + offset, dst)
    }
}

/// Page-locks the bounce path's host slots for CUDA, once per slot ring
/// (`cuMemHostRegister`, `PORTABLE`: for every device), so that the copy
/// engine moves them by DMA at full speed instead of through the driver's
/// own staging.
#[derive(Debug)]
pub struct CudaStager;

struct Registered {
    ctx: Arc<Context>,
    buf: Arc<HostBuffer>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(e) = self.ctx.enter() {
            // SAFETY: Registered by `pin`; the slots are idle when a context
            // is dropped.
            let _ = unsafe { cuda::host_unregister(&e, self.buf.as_raw()) };
        }
    }
}

impl Stager for CudaStager {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn pin(&self, buf: Arc<HostBuffer>) -> Result<StagingPin> {
        let ctx = Context::primary(0)?;
        {
            let e = ctx.enter()?;
            // SAFETY: The buffer stays mapped while `Registered` holds it,
            // and is unregistered before it can be unmapped.
            unsafe { cuda::host_register(&e, buf.as_raw(), buf.len()) }?;
        }
        Ok(StagingPin::new(
            self.name(),
            Box::new(Registered { ctx, buf }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_every_constructor_says_so() {
        if cuda::library_present() {
            return;
        }
        for e in [
            CudaMemory::alloc(0, 4096).unwrap_err(),
            // SAFETY: Refused before anything is copied or exported.
            unsafe { CudaMemory::lend(0x1000, 4096, ()) }.unwrap_err(),
        ] {
            assert!(matches!(e, Error::CudaUnavailable(_)), "{e}");
            assert!(e.to_string().contains("CUDA"), "{e}");
        }
        assert!(CudaMemory::alloc(0, 0).is_err());
    }
}
