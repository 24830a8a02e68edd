//! Accelerator memory: allocations from a device's P2P memory, and mappings
//! of them into this process.
//!
//! An allocation belongs to the open `/dev/p2pdma` file and to the process
//! that opened it: only that process may map it or allocate, and the kernel
//! frees whatever is left when the file is closed and unmapped. A mapping is
//! device memory, so it is reached only through raw pointers and explicit
//! copies, never through `&[u8]`.

use std::{fmt, os::fd::AsFd, sync::Arc};

use p2pdma_abi as abi;

use super::device::{DeviceMemory, DmaMemory, MemoryKind};
use crate::{
    error::check_range,
    sys::{self, DmaTarget, RawMapping, Sharing},
    Error, Module, Result,
};

impl Module {
    /// Whether the module can move data between block devices and
    /// allocations itself ([`Module::block_io`]).
    pub fn has_block_io(&self) -> bool {
        self.version().capabilities & abi::P2PDMA_CAP_BLOCK_IO != 0
    }

    /// Reads the block device `dev` into allocation `handle` (or, with
    /// `write`, writes it from the allocation), segment by segment: the
    /// module builds the block I/O on the allocation's own pages, so no page
    /// is pinned per I/O, and keeps up to `depth` segments in flight (0: the
    /// module's default). `dev` must be open for reading (or writing);
    /// offsets and lengths must be multiples of its logical block (memory
    /// offsets, of its DMA alignment). Returns the bytes moved: all of them,
    /// or an error.
    ///
    /// [`Allocation::block_io`] and [`ModuleMemory::block_io`] do this on
    /// memory the caller owns, safely.
    ///
    /// # Safety
    ///
    /// Storage writes the allocation `handle` names (when `write` is
    /// false): the caller owns it, or has its owner's leave to write it, and
    /// nothing trusts its contents for memory safety (no device reads its
    /// queues or descriptors from it). A handle that names no allocation of
    /// this file is refused by the module.
    #[doc(alias = "P2PDMA_IOC_BLOCK_IO")]
    #[allow(unsafe_code)]
    pub unsafe fn block_io(
        &self,
        handle: u64,
        dev: impl AsFd,
        write: bool,
        segs: &[abi::P2pdmaIoSeg],
        depth: u32,
    ) -> Result<u64> {
        let mut arg = abi::P2pdmaBlockIo {
            handle,
            fd: std::os::fd::AsRawFd::as_raw_fd(&dev.as_fd()),
            flags: if write { abi::P2PDMA_IO_WRITE } else { 0 },
            depth,
            ..Default::default()
        };
        // SAFETY: The caller vouches for the allocation (see above).
        unsafe { sys::block_io(self, &mut arg, segs) }
            .map_err(Error::ioctl("P2PDMA_IOC_BLOCK_IO"))?;
        Ok(arg.bytes)
    }

    /// Allocates `size` bytes (rounded up to pages by the kernel) of P2P
    /// memory from the accelerator at `dev_index`, with the bus address
    /// aligned to `align` (0 for a page, else a power of two up to
    /// [`abi::P2PDMA_MAX_ALIGN`]).
    ///
    /// The allocation is freed when the returned value is dropped.
    #[doc(alias = "P2PDMA_IOC_ALLOC")]
    pub fn alloc(&self, dev_index: u32, size: u64, align: u64) -> Result<Allocation<'_>> {
        let mut arg = abi::P2pdmaAlloc {
            dev_index,
            size,
            align,
            ..Default::default()
        };
        sys::alloc(self, &mut arg).map_err(Error::ioctl("P2PDMA_IOC_ALLOC"))?;
        Ok(Allocation {
            module: self,
            dev_index,
            handle: arg.handle,
            size: arg.size,
            mmap_offset: arg.mmap_offset,
            owned: true,
        })
    }

    /// Frees the allocation `handle` of this file. Mappings of it stay valid
    /// until they are unmapped. [`Allocation::free`] frees an allocation
    /// the caller owns, safely.
    ///
    /// # Safety
    ///
    /// The caller owns the allocation (its [`Allocation`] was given up with
    /// [`Allocation::into_handle`]), or has its owner's leave: no
    /// [`ModuleMemory`] or other owner uses the handle afterwards.
    #[doc(alias = "P2PDMA_IOC_FREE")]
    #[allow(unsafe_code)]
    pub unsafe fn free(&self, handle: u64) -> Result<()> {
        let arg = abi::P2pdmaFree {
            handle,
            ..Default::default()
        };
        // SAFETY: The caller owns the allocation (see above).
        unsafe { sys::free(self, arg) }.map_err(Error::ioctl("P2PDMA_IOC_FREE"))
    }

    /// Maps `len` bytes of allocation memory at `mmap_offset` (an
    /// allocation's [`Allocation::mmap_offset`]) shared and read-write.
    /// [`Allocation::map`] maps an allocation the caller owns, safely.
    ///
    /// # Safety
    ///
    /// Copies into the mapping change the memory the offset names: the
    /// caller owns it, or has its owner's leave to write it, and nothing
    /// trusts its contents for memory safety (no device reads its queues or
    /// descriptors from it).
    #[allow(unsafe_code)]
    pub unsafe fn map(&self, mmap_offset: u64, len: u64) -> Result<DeviceMapping> {
        // SAFETY: The caller vouches for the memory (see above).
        unsafe { DeviceMapping::new(self, mmap_offset, len) }
    }
}

/// Memory allocated from an accelerator's BAR, freed on drop.
#[derive(Debug)]
pub struct Allocation<'m> {
    module: &'m Module,
    dev_index: u32,
    handle: u64,
    size: u64,
    mmap_offset: u64,
    owned: bool,
}

impl<'m> Allocation<'m> {
    /// The accelerator it came from.
    pub fn dev_index(&self) -> u32 {
        self.dev_index
    }

    /// The kernel's handle, unique for the life of the module.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// Size in bytes, a whole number of pages.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The `mmap(2)` offset that maps it.
    pub fn mmap_offset(&self) -> u64 {
        self.mmap_offset
    }

    /// The module file it belongs to.
    pub fn module(&self) -> &'m Module {
        self.module
    }

    /// Maps the whole allocation into this process.
    #[allow(unsafe_code)]
    pub fn map(&self) -> Result<DeviceMapping> {
        // SAFETY: This value owns the allocation, which holds nothing but
        // data.
        unsafe { DeviceMapping::new(self.module, self.mmap_offset, self.size) }
    }

    /// [`Module::block_io`] on this allocation: reads the block device
    /// `dev` into it (or, with `write`, writes it from it).
    #[doc(alias = "P2PDMA_IOC_BLOCK_IO")]
    #[allow(unsafe_code)]
    pub fn block_io(
        &self,
        dev: impl AsFd,
        write: bool,
        segs: &[abi::P2pdmaIoSeg],
        depth: u32,
    ) -> Result<u64> {
        // SAFETY: This value owns the allocation, which holds nothing but
        // data.
        unsafe { self.module.block_io(self.handle, dev, write, segs, depth) }
    }

    /// Frees the allocation now, reporting the kernel's answer.
    #[doc(alias = "P2PDMA_IOC_FREE")]
    #[allow(unsafe_code)]
    pub fn free(mut self) -> Result<()> {
        self.owned = false;
        // SAFETY: This value owned the allocation, and is consumed.
        unsafe { self.module.free(self.handle) }
    }

    /// Gives up ownership without freeing: the handle stays allocated until
    /// [`Module::free`] or until the module file is closed.
    pub fn into_handle(mut self) -> u64 {
        self.owned = false;
        self.handle
    }
}

impl Drop for Allocation<'_> {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: This value owns the allocation, and is going away.
            let _ = unsafe { self.module.free(self.handle) };
        }
    }
}

/// A shared, read-write mapping of accelerator memory, unmapped on drop.
///
/// It stays valid after its allocation is freed and after the module file is
/// closed: the memory returns to the device once both happened. If the
/// device is unbound while mapped, touching the mapping raises `SIGBUS`. A
/// forked child does not inherit the mapping.
#[derive(Debug)]
pub struct DeviceMapping {
    raw: RawMapping,
    mmap_offset: u64,
}

impl DeviceMapping {
    /// # Safety
    ///
    /// As for [`Module::map`].
    #[allow(unsafe_code)]
    unsafe fn new(module: &Module, mmap_offset: u64, len: u64) -> Result<Self> {
        let mmap_err = |source| Error::Mmap {
            offset: mmap_offset,
            len,
            source,
        };
        let ulen = usize::try_from(len).map_err(|_| {
            Error::InvalidArgument(format!("{len} bytes do not fit this address space"))
        })?;
        // SAFETY: The caller vouches for the memory the offset names.
        let raw = unsafe { RawMapping::map(module, ulen, mmap_offset, Sharing::Shared) }
            .map_err(mmap_err)?;
        Ok(Self { raw, mmap_offset })
    }

    /// Stops reaching the device memory (see [`RawMapping::let_go`]): the
    /// bytes read afterwards are zeros, and writes reach nothing.
    pub fn let_go(&self) -> Result<()> {
        self.raw
            .let_go()
            .map_err(Error::sys("mmap over a device mapping"))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether the mapping is empty (never: empty mappings cannot be made).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The `mmap` offset it was made from.
    pub fn mmap_offset(&self) -> u64 {
        self.mmap_offset
    }

    /// Address of the first byte. Access through it is the caller's affair:
    /// the memory can change under any reference made from it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.raw.as_ptr()
    }

    /// Copies `src` to `offset` of the mapping.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len())?;
        self.raw
            .write_at(offset, src)
            .map_err(Error::sys("copy into device memory"))
    }

    /// Copies `dst.len()` bytes at `offset` of the mapping into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len())?;
        self.raw
            .read_at(offset, dst)
            .map_err(Error::sys("copy out of device memory"))
    }

    /// Reads `len` bytes at `file_offset` of `file` straight into the
    /// mapping at `offset` (`pread(2)`). With an `O_DIRECT` NVMe namespace
    /// the SSD DMAs into the accelerator, by P2P where the topology allows.
    /// Returns the bytes read.
    pub fn read_from_file(
        &self,
        file: impl AsFd,
        file_offset: u64,
        offset: usize,
        len: usize,
    ) -> Result<usize> {
        check_range(offset, len, self.len())?;
        self.raw
            .pread_from(file, file_offset, offset, len)
            .map_err(Error::sys("pread into device memory"))
    }

    /// Writes `len` bytes at `offset` of the mapping to `file_offset` of
    /// `file` (`pwrite(2)`). Returns the bytes written.
    pub fn write_to_file(
        &self,
        file: impl AsFd,
        file_offset: u64,
        offset: usize,
        len: usize,
    ) -> Result<usize> {
        check_range(offset, len, self.len())?;
        self.raw
            .pwrite_to(file, file_offset, offset, len)
            .map_err(Error::sys("pwrite from device memory"))
    }
}

/// Accelerator BAR memory allocated from the p2pdma module and mapped
/// write-combined into this process. Freed (and unmapped) on drop.
pub struct ModuleMemory {
    module: Arc<Module>,
    handle: u64,
    kind: MemoryKind,
    map: DeviceMapping,
}

impl fmt::Debug for ModuleMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModuleMemory")
            .field("kind", &self.kind)
            .field("handle", &self.handle)
            .field("len", &self.map.len())
            .finish()
    }
}

impl ModuleMemory {
    /// Allocates `size` bytes of accelerator `index`'s memory (bus address
    /// aligned to `align`, 0 for a page) and maps it.
    pub fn alloc(module: Arc<Module>, index: u32, size: u64, align: u64) -> Result<Self> {
        let accel = module
            .accelerators()?
            .into_iter()
            .find(|a| a.index == index)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("no accelerator {index} in the module"))
            })?;
        let alloc = module.alloc(index, size, align)?;
        let map = alloc.map()?;
        let handle = alloc.into_handle();
        Ok(Self {
            module,
            handle,
            kind: MemoryKind::ModuleBar {
                index,
                pci: accel.pci,
            },
            map,
        })
    }

    /// The allocation's handle in the module.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// The module it came from.
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }

    /// Its mapping in this process.
    pub fn mapping(&self) -> &DeviceMapping {
        &self.map
    }

    /// [`Module::block_io`] on this memory: reads the block device `dev`
    /// into it (or, with `write`, writes it from it).
    #[doc(alias = "P2PDMA_IOC_BLOCK_IO")]
    #[allow(unsafe_code)]
    pub fn block_io(
        &self,
        dev: impl AsFd,
        write: bool,
        segs: &[abi::P2pdmaIoSeg],
        depth: u32,
    ) -> Result<u64> {
        // SAFETY: This value owns the allocation, which holds nothing but
        // data.
        unsafe { self.module.block_io(self.handle, dev, write, segs, depth) }
    }
}

impl Drop for ModuleMemory {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // The mapping keeps the memory until it is unmapped after this.
        // SAFETY: This value owns the allocation, and is going away.
        let _ = unsafe { self.module.free(self.handle) };
    }
}

impl DeviceMemory for ModuleMemory {
    fn len(&self) -> usize {
        self.map.len()
    }

    fn kind(&self) -> MemoryKind {
        self.kind.clone()
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.map.write_at(offset, src)
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.map.read_at(offset, dst)
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

// SAFETY: The allocation is this value's (freed when it drops, its mapping
// unmapped after), of at least `len()` bytes from byte 0; its mapping hands
// out no references, and it holds nothing but data.
#[allow(unsafe_code)]
unsafe impl DmaMemory for ModuleMemory {
    fn dma_target(&self) -> Option<DmaTarget> {
        Some(DmaTarget {
            ptr: self.map.as_ptr(),
            len: self.map.len(),
            p2p: true,
        })
    }

    fn module_allocation(&self) -> Option<(&Arc<Module>, u64)> {
        Some((&self.module, self.handle))
    }
}
