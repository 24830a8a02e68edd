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
        copy::overlaps,
        device::{DeviceMemory, DmaMemory, MemoryKind},
        Udmabuf,
    },
    sys::{self, wc, Caching, DmabufAccess, RawMapping, Sharing},
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
    #[allow(unsafe_code)]
    fn write(&self, sync: Option<BorrowedFd<'_>>, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is the caller's own memory, readable for its length;
        // the copy only reads it.
        unsafe { self.copy(sync, offset, src.as_ptr().cast_mut(), src.len(), Way::In) }
    }

    /// [`DmabufMapping::read_at`], synced on `sync` when there is one.
    #[allow(unsafe_code)]
    fn read(&self, sync: Option<BorrowedFd<'_>>, offset: usize, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `dst` is the caller's own memory, borrowed for writing.
        unsafe { self.copy(sync, offset, dst.as_mut_ptr(), dst.len(), Way::Out) }
    }

    /// Copies `len` bytes between the mapping at `offset` and `other`,
    /// `way` into the mapping or out of it, synced on `sync` when there is
    /// one: with the write-combined routines, or by `memmove` where `other`
    /// lies in the mapping itself (a loan of it).
    ///
    /// # Safety
    ///
    /// `other..other + len` must be valid for reads (into the mapping) or
    /// writes (out of it) for the length of the call; where it is another
    /// memory's, no Rust reference may reach it, as for
    /// [`DeviceMemory::write_at_raw`] and [`DeviceMemory::read_at_raw`].
    #[allow(unsafe_code)]
    unsafe fn copy(
        &self,
        sync: Option<BorrowedFd<'_>>,
        offset: usize,
        other: *mut u8,
        len: usize,
        way: Way,
    ) -> Result<()> {
        check_range(offset, len, self.len())?;
        let at = self.map.as_ptr().wrapping_add(offset);
        let (dst, src) = match way {
            Way::In => (at, other.cast_const()),
            Way::Out => (other, at.cast_const()),
        };
        bracket(sync, || {
            // SAFETY: `at..at + len` lies in the mapping (checked), which
            // lives as long as `self`, and `other..other + len` is the
            // caller's promise; neither is reached through a reference
            // here, and the write-combined routines get them only apart.
            unsafe {
                if overlaps(src as usize, dst as usize, len) {
                    std::ptr::copy(src, dst, len);
                    wc::store_fence();
                } else if way == Way::In {
                    wc::copy_to_wc(dst, src, len);
                } else {
                    wc::copy_from_wc(dst, src, len);
                }
            }
            Ok(())
        })
    }
}

/// Which way [`DmabufMapping::copy`] copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Into the mapping.
    In,
    /// Out of the mapping.
    Out,
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

    /// One copy from `src` into the mapping.
    #[allow(unsafe_code)]
    unsafe fn write_at_raw(&self, offset: usize, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: The caller's promise, passed on.
        unsafe {
            let sync = self.sync.then(|| self.fd.as_fd());
            self.map.copy(sync, offset, src.cast_mut(), len, Way::In)
        }
    }

    /// One copy out of the mapping into `dst`.
    #[allow(unsafe_code)]
    unsafe fn read_at_raw(&self, offset: usize, dst: *mut u8, len: usize) -> Result<()> {
        // SAFETY: The caller's promise, passed on.
        unsafe {
            let sync = self.sync.then(|| self.fd.as_fd());
            self.map.copy(sync, offset, dst, len, Way::Out)
        }
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
    use crate::memory::{copy, BorrowedHost, HostMemory};

    /// A memfd's pages as dma-buf memory whose copies skip the sync (a
    /// memfd is no dma-buf), as a udmabuf's do on x86-64.
    fn unsynced(len: usize) -> DmabufMemory {
        let fd = rustix::fs::memfd_create("dmabuf-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, len as u64).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: A memfd of this test's own; nothing imports it.
        let map = unsafe { DmabufMapping::map(fd.as_fd(), len) }.unwrap();
        DmabufMemory {
            fd,
            map,
            sync: false,
            _keep: Box::new(()),
        }
    }

    #[test]
    fn copies_with_a_mapping_are_one_copy_each_way_even_over_itself() {
        let len = 64 << 10;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let host = HostMemory::new(len).unwrap();
        host.write_at(0, &data).unwrap();
        let m = unsynced(len);
        // Host memory has the only mapping: the dma-buf copies out of it
        // and into it with its own routines.
        copy(&host, 0, &m, 3, len - 3).unwrap();
        copy(&m, 3, &host, 0, len - 3).unwrap();
        let mut back = vec![0u8; len];
        host.read_at(0, &mut back).unwrap();
        assert!(back[..len - 3] == data[..len - 3]);
        // A loan of its own mapping, overlapping the range copied into.
        let ptr = m.map.map.as_ptr();
        #[allow(unsafe_code)]
        // SAFETY: The mapping outlives the loan, which this test alone uses.
        let loan = unsafe { BorrowedHost::new(ptr, len, true, Box::new(())) };
        copy(&loan, 0, &m, 100, len - 100).unwrap();
        copy(&m, 200, &loan, 50, len - 200).unwrap();
        let mut want = vec![0u8; len];
        m.read_at(0, &mut want).unwrap();
        let mut expected: Vec<u8> = [&[0u8; 3][..], &data[..len - 3]].concat();
        expected.copy_within(0..len - 100, 100);
        expected.copy_within(200..len, 50);
        assert!(want == expected);
    }

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
