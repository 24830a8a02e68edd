//! Memory a driver exported as a dma-buf, reached by the CPU through the
//! dma-buf's own mapping, gdrcopy-style: `mmap` of the dma-buf, each CPU
//! access bracketed by `DMA_BUF_IOCTL_SYNC`, and the write-combined copy
//! routines ([`crate::sys::wc`]), since the exporter's memory is usually a
//! device BAR. Not every exporter allows the mapping: `mmap` then fails, and
//! [`DmabufMapping::map`] says so.
//!
//! [`DmabufMemory`] is such memory as a [`DeviceMemory`]: copies through the
//! mapping, and the dma-buf itself for peers (the queues path imports it for
//! its controller). A udmabuf (host memory) makes one on any machine; its
//! copies skip the sync on x86-64 ([`DmabufMemory::from_udmabuf`] says why).

use std::{
    fmt,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
};

use crate::{
    error::check_range,
    memory::{
        device::{DeviceMemory, DmaMemory, MemoryKind},
        Udmabuf,
    },
    sys::{self, Caching, DmabufAccess, RawMapping, Sharing},
    Error, Result,
};

/// A dma-buf mapped into this process.
pub struct DmabufMapping {
    map: RawMapping,
}

impl fmt::Debug for DmabufMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmabufMapping")
            .field("len", &self.map.len())
            .finish()
    }
}

impl DmabufMapping {
    /// Maps the first `len` bytes (> 0) of `dmabuf`, shared, write-combined.
    ///
    /// # Safety
    ///
    /// As for [`RawMapping::map`]: copies into the mapping change the
    /// dma-buf's memory, which the caller owns or may write.
    #[allow(unsafe_code)]
    pub unsafe fn map(dmabuf: BorrowedFd<'_>, len: usize) -> Result<Self> {
        // SAFETY: The caller's promise, passed on.
        let map = unsafe {
            RawMapping::map_with(dmabuf, len, 0, Sharing::Shared, Caching::WriteCombined)
        }
        .map_err(|source| Error::Mmap {
            offset: 0,
            len: len as u64,
            source,
        })?;
        Ok(Self { map })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is mapped (never: a mapping has bytes).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Copies `src` into the mapping at `offset`, inside a write sync.
    pub fn write_at(&self, dmabuf: BorrowedFd<'_>, offset: usize, src: &[u8]) -> Result<()> {
        self.write(Some(dmabuf), offset, src)
    }

    /// Copies the mapping at `offset` into `dst`, inside a read sync.
    pub fn read_at(&self, dmabuf: BorrowedFd<'_>, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.read(Some(dmabuf), offset, dst)
    }

    /// [`DmabufMapping::write_at`], synced on `sync` when there is one.
    fn write(&self, sync: Option<BorrowedFd<'_>>, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len())?;
        bracket(sync, || {
            self.map
                .write_at(offset, src)
                .map_err(Error::sys("copy into the dma-buf mapping"))
        })
    }

    /// [`DmabufMapping::read_at`], synced on `sync` when there is one.
    fn read(&self, sync: Option<BorrowedFd<'_>>, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len())?;
        bracket(sync, || {
            self.map
                .read_at(offset, dst)
                .map_err(Error::sys("copy from the dma-buf mapping"))
        })
    }
}

/// Runs `f` between the start and the end of CPU access, announced as
/// reading and writing whatever `f` does: an exporter may map its memory
/// for the CPU once, for the first access's direction, and sync every
/// later access against that mapping (udmabuf does), so a read after a
/// write would sync in a direction the mapping was not made for, which
/// the DMA API forbids. Both directions match every access. Without a
/// dma-buf to sync on, `f` alone.
fn bracket(dmabuf: Option<BorrowedFd<'_>>, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let Some(dmabuf) = dmabuf else {
        return f();
    };
    let access = DmabufAccess::ReadWrite;
    sys::dmabuf_sync(dmabuf, access, false).map_err(Error::ioctl("DMA_BUF_IOCTL_SYNC start"))?;
    let r = f();
    let end =
        sys::dmabuf_sync(dmabuf, access, true).map_err(Error::ioctl("DMA_BUF_IOCTL_SYNC end"));
    r.and(end)
}

/// A dma-buf as accelerator memory: CPU copies through its mapping, the
/// dma-buf for peers.
pub struct DmabufMemory {
    fd: OwnedFd,
    map: DmabufMapping,
    /// CPU copies are bracketed by `DMA_BUF_IOCTL_SYNC` (see
    /// [`DmabufMemory::from_udmabuf`] for where they are not).
    sync: bool,
    /// What else must live as long as the dma-buf (a udmabuf's memfd).
    _keep: Box<dyn Send + Sync>,
}

impl fmt::Debug for DmabufMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmabufMemory")
            .field("len", &self.map.len())
            .finish()
    }
}

impl DmabufMemory {
    /// The first `len` bytes of the dma-buf `fd`, mapped.
    ///
    /// # Safety
    ///
    /// Peers import `fd` and DMA into its memory ([`DmaMemory::dmabuf`]),
    /// and copies write it through the mapping: the memory behind it is the
    /// caller's to hand over, lives as long as the dma-buf, is reached by no
    /// Rust reference, and holds nothing whose contents anyone trusts for
    /// memory safety (it is no device's registers, queues or descriptors).
    #[allow(unsafe_code)]
    pub unsafe fn new(fd: OwnedFd, len: usize) -> Result<Self> {
        // SAFETY: The caller hands the dma-buf's memory over.
        let map = unsafe { DmabufMapping::map(fd.as_fd(), len) }?;
        Ok(Self {
            fd,
            map,
            sync: true,
            _keep: Box::new(()),
        })
    }

    /// A udmabuf's host memory, through its dma-buf.
    ///
    /// On x86-64 CPU copies go without `DMA_BUF_IOCTL_SYNC`: udmabuf's sync
    /// maps the whole buffer for its own misc device, which sets no segment
    /// limit (Linux 7.3), so a memfd with 128 KiB of physically contiguous
    /// pages makes DMA-API debugging report a segment longer than the
    /// device supports; and where the CPU and devices are cache-coherent,
    /// that mapping and its syncs do nothing else.
    pub fn from_udmabuf(u: Udmabuf) -> Result<Self> {
        let len = usize::try_from(u.size())
            .map_err(|_| Error::InvalidArgument("the udmabuf is too large".into()))?;
        let fd = u.dmabuf().try_clone_to_owned().map_err(|e| Error::Sys {
            op: "dup of the dma-buf",
            source: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::BADF),
        })?;
        #[allow(unsafe_code)]
        // SAFETY: The udmabuf is this value's from here on; its memfd's
        // memory is mapped nowhere else.
        let map = unsafe { DmabufMapping::map(fd.as_fd(), len) }?;
        Ok(Self {
            fd,
            map,
            sync: !cfg!(target_arch = "x86_64"),
            _keep: Box::new(u),
        })
    }
}

impl DeviceMemory for DmabufMemory {
    fn len(&self) -> usize {
        self.map.len()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Dmabuf
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.map
            .write(self.sync.then(|| self.fd.as_fd()), offset, src)
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.map
            .read(self.sync.then(|| self.fd.as_fd()), offset, dst)
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

// SAFETY: The dma-buf is this value's (`new`'s contract, or a udmabuf it
// owns, over a memfd no one maps), open as long as it lives; its mapping
// hands out no references.
#[allow(unsafe_code)]
unsafe impl DmaMemory for DmabufMemory {
    fn dmabuf(&self) -> Option<(BorrowedFd<'_>, u64)> {
        Some((self.fd.as_fd(), 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_no_dma_buf_maps_but_refuses_the_sync() {
        // A memfd maps like a dma-buf would, but is none: the sync ioctl
        // fails, and the copy says which step.
        let fd = rustix::fs::memfd_create("not-a-dmabuf", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: A memfd of this test's own; nothing imports it.
        let m = unsafe { DmabufMemory::new(fd, 8192) }.unwrap();
        let e = m.write_at(0, b"abc").unwrap_err();
        assert!(e.to_string().contains("DMA_BUF_IOCTL_SYNC"), "{e}");
        assert!(matches!(
            m.write_at(8190, b"abc"),
            Err(Error::OutOfBounds { .. })
        ));
        assert_eq!(m.dma().and_then(|d| d.dmabuf()).map(|(_, at)| at), Some(0));
    }
}
