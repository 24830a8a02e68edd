//! Raw memory mappings: device memory mapped from a file, and host buffers,
//! reachable only through copies. They never hand out references into memory
//! that a device or another process may change.
#![allow(unsafe_code)]

use std::{
    mem::MaybeUninit,
    os::fd::AsFd,
    ptr::{self, NonNull},
    slice,
};

use rustix::{
    io::Errno,
    mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags},
};

/// How a mapping of a file is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// `MAP_SHARED`: writes reach the file (here, the device).
    Shared,
    /// `MAP_PRIVATE`: copy on write. The p2pdma module refuses it.
    Private,
}

/// The memory type of a mapping, which decides the copy routines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// Write-combined, uncached reads: accelerator BARs as the p2pdma module
    /// maps them. Copies use [`crate::sys::wc`]: streaming loads, and stores that
    /// end with a store fence.
    WriteCombined,
    /// Ordinary cached memory (a memfd, the host-memory device). Copies are
    /// `memcpy`: streaming stores would only evict lines from the cache.
    WriteBack,
}

/// A read-write mapping of a file (device memory, for the p2pdma module),
/// reachable only through raw pointers and copies.
///
/// The memory may be changed at any time by the device, a peer's DMA or
/// another mapping, so no reference into it is ever created; [`read_at`] and
/// [`write_at`] copy with the routines for its [`Caching`] (those of
/// [`crate::sys::wc`] for write-combined memory, where a write ends with a store
/// fence). Unmapped on drop.
///
/// Touching the mapping after the device went away raises `SIGBUS`, as for
/// any mapping whose backing store vanished.
///
/// [`read_at`]: RawMapping::read_at
/// [`write_at`]: RawMapping::write_at
#[derive(Debug)]
pub struct RawMapping {
    ptr: NonNull<u8>,
    len: usize,
    caching: Caching,
}

// SAFETY: The mapping is plain memory shared with the device; the type hands
// out no references into it, and its accesses are copies that are as valid
// from any thread as from the one that mapped it.
unsafe impl Send for RawMapping {}
// SAFETY: See above; concurrent copies may interleave, which is the nature of
// shared device memory and cannot break memory safety.
unsafe impl Sync for RawMapping {}

/// Replaces the mapping at `[ptr, ptr + len)` with zeroed private
/// anonymous memory in one step (`MAP_FIXED`): the address range stays
/// mapped, and whatever it mapped (device memory, a device's registers) is
/// no longer reached through it, nor held by it.
///
/// # Safety
///
/// `[ptr, ptr + len)` is exactly one mapping the caller owns, into which no
/// Rust reference exists.
pub(crate) unsafe fn replace_with_anonymous(ptr: *mut u8, len: usize) -> Result<(), Errno> {
    // SAFETY: The caller's promise: `MAP_FIXED` replaces only its mapping.
    unsafe {
        rustix::mm::mmap_anonymous(
            ptr.cast(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::FIXED,
        )
    }
    .map(|_| ())
}

impl RawMapping {
    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, sharing, fd, offset)` of
    /// device memory: copies treat it as write-combined.
    ///
    /// # Safety
    ///
    /// Copies into the mapping (and I/O into it) change what `fd` holds at
    /// `offset..offset + len`: the caller owns that memory, or has its
    /// owner's leave to write it; nothing trusts its contents for memory
    /// safety (no device reads its queues or descriptors from it), and no
    /// Rust reference into it exists (it is another mapping's only through
    /// raw pointers and copies).
    pub unsafe fn map(
        fd: impl AsFd,
        len: usize,
        offset: u64,
        sharing: Sharing,
    ) -> Result<Self, Errno> {
        // SAFETY: The caller's promise, passed on.
        unsafe { Self::map_with(fd, len, offset, sharing, Caching::WriteCombined) }
    }

    /// [`RawMapping::map`] of memory of the given type.
    ///
    /// # Safety
    ///
    /// As for [`RawMapping::map`].
    pub unsafe fn map_with(
        fd: impl AsFd,
        len: usize,
        offset: u64,
        sharing: Sharing,
        caching: Caching,
    ) -> Result<Self, Errno> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        let flags = match sharing {
            Sharing::Shared => MapFlags::SHARED,
            Sharing::Private => MapFlags::PRIVATE,
        };
        // SAFETY: A NULL hint lets the kernel choose an address, so the new
        // mapping cannot overlap memory that Rust already uses; the caller
        // vouches for the memory it maps.
        let ptr = unsafe {
            mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
                fd,
                offset,
            )
        }?;
        let ptr = NonNull::new(ptr.cast()).ok_or(Errno::NOMEM)?;
        Ok(Self { ptr, len, caching })
    }

    /// Replaces the mapping with anonymous memory at the same address: the
    /// device memory is no longer reached through it, and copies racing
    /// this (or coming later) read zeros and write memory nothing else sees,
    /// instead of raising `SIGBUS` once the device memory is revoked.
    pub fn let_go(&self) -> Result<(), Errno> {
        // SAFETY: Exactly this mapping, into which no reference exists (the
        // type hands out none).
        unsafe { replace_with_anonymous(self.ptr.as_ptr(), self.len) }
    }

    /// The memory type its copies assume.
    pub fn caching(&self) -> Caching {
        self.caching
    }

    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never true: empty mappings do not exist).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), Errno> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Errno::INVAL),
        }
    }

    /// Copies `src` into the mapping at `offset`; `EINVAL` if it does not fit.
    ///
    /// The copy uses streaming stores ([`crate::sys::wc`]), the fast way to fill
    /// write-combined device memory, and ends with a store fence so that the
    /// device, its peers and later reads see the data.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), Errno> {
        self.check(offset, src.len())?;
        // SAFETY: `offset..offset + src.len()` lies inside the mapping, which
        // lives as long as `self`, and cannot overlap `src`, which is
        // ordinary memory Rust owns.
        unsafe {
            let dst = self.ptr.as_ptr().add(offset);
            match self.caching {
                Caching::WriteCombined => crate::sys::wc::copy_to_wc(dst, src.as_ptr(), src.len()),
                Caching::WriteBack => ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()),
            }
        };
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` of the mapping into `dst`;
    /// `EINVAL` if they are not all inside it. Uses streaming loads, the
    /// fast way to read uncached or write-combined memory.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), Errno> {
        self.check(offset, dst.len())?;
        // SAFETY: As in `write_at`.
        unsafe {
            let src = self.ptr.as_ptr().add(offset);
            match self.caching {
                Caching::WriteCombined => {
                    crate::sys::wc::copy_from_wc(dst.as_mut_ptr(), src, dst.len())
                }
                Caching::WriteBack => ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()),
            }
        };
        Ok(())
    }

    /// `pread(file, mapping[offset..offset + len], file_offset)`: reads from
    /// a file straight into the mapping (with `O_DIRECT` on an NVMe
    /// namespace, the device DMAs into it). Returns the bytes read.
    pub fn pread_from(
        &self,
        file: impl AsFd,
        file_offset: u64,
        offset: usize,
        len: usize,
    ) -> Result<usize, Errno> {
        self.check(offset, len)?;
        // SAFETY: The range lies inside the mapping.
        unsafe { pread_raw(file, file_offset, self.ptr.as_ptr().add(offset), len) }
    }

    /// `pwrite(file, mapping[offset..offset + len], file_offset)`: writes
    /// from the mapping straight to a file. Returns the bytes written.
    pub fn pwrite_to(
        &self,
        file: impl AsFd,
        file_offset: u64,
        offset: usize,
        len: usize,
    ) -> Result<usize, Errno> {
        self.check(offset, len)?;
        // SAFETY: The range lies inside the mapping. The slice only carries
        // the range to the kernel for this one call; Rust never reads it.
        let buf = unsafe { slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) };
        rustix::io::pwrite(file, buf, file_offset)
    }
}

impl Drop for RawMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned, and no
        // reference into the mapping exists.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// `pread(file, ptr[..len], file_offset)`, handing the range to the kernel
/// without making a reference into it. Returns the bytes read.
///
/// # Safety
///
/// `ptr..ptr + len` must be memory this process may have the kernel write.
unsafe fn pread_raw(
    file: impl AsFd,
    file_offset: u64,
    ptr: *mut u8,
    len: usize,
) -> Result<usize, Errno> {
    // SAFETY: The caller vouches for the range. The slice only carries it to
    // the kernel for this one call; it is never read.
    let buf = unsafe { slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<u8>>(), len) };
    let (done, _) = rustix::io::pread(file, buf, file_offset)?;
    Ok(done.len())
}

/// The size (and alignment) of an x86-64 transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Page-aligned, zero-filled anonymous host memory, for `O_DIRECT` I/O and
/// for pinning with [`pin_user`](super::p2pdma::pin_user). Unmapped on drop.
///
/// Buffers of 2 MiB or more start on a 2 MiB boundary and ask for
/// transparent huge pages (`MADV_HUGEPAGE`): physically contiguous memory
/// makes each I/O one DMA segment instead of one per 4 KiB page, so large
/// requests are not split at the device's segment limit.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: The buffer is private memory owned by this value; access follows
// the usual borrow rules through `Deref`/`DerefMut`.
unsafe impl Send for HostBuffer {}
// SAFETY: See above.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Maps `len` bytes (> 0) of zeroed anonymous memory.
    pub fn new(len: usize) -> Result<Self, Errno> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        let extra = if len >= HUGE_PAGE { HUGE_PAGE } else { 0 };
        let total = len.checked_add(extra).ok_or(Errno::NOMEM)?;
        // SAFETY: A NULL hint lets the kernel choose an address, so the new
        // mapping cannot overlap memory that Rust already uses.
        let raw = unsafe {
            mmap_anonymous(
                ptr::null_mut(),
                total,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        let base = raw as usize;
        let start = base.next_multiple_of(extra.max(1));
        // The mapping covers whole pages: keep those holding `len` bytes.
        let end = (start + len).next_multiple_of(4096).min(base + total);
        // SAFETY: The head `[base, start)` and the tail `[end, base + total)`
        // are page-aligned parts of the mapping just made that nothing
        // refers to.
        unsafe {
            if start > base {
                munmap(raw, start - base)?;
            }
            if base + total > end {
                munmap(end as *mut _, base + total - end)?;
            }
        }
        let ptr = NonNull::new(start as *mut u8).ok_or(Errno::NOMEM)?;
        if extra > 0 {
            // SAFETY: Advice on memory this value owns; it changes how the
            // kernel backs it, not its contents. Without THP it is refused,
            // which changes nothing.
            let _ = unsafe {
                rustix::mm::madvise(ptr.as_ptr().cast(), len, rustix::mm::Advice::LinuxHugepage)
            };
        }
        Ok(Self { ptr, len })
    }

    /// The buffer's address, as the kernel's `user_va` fields want it.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The buffer's first byte, for DMA and for copies by other engines
    /// (which must not overlap a live Rust borrow of the buffer).
    pub fn as_raw(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `src` into the buffer at `offset` through its raw pointer (the
    /// buffer may be a DMA target, so no reference into it is made);
    /// `EINVAL` if it does not fit.
    pub fn write_raw(&self, offset: usize, src: &[u8]) -> Result<(), Errno> {
        match offset.checked_add(src.len()) {
            // SAFETY: In bounds; `src` cannot overlap memory this value owns
            // while `&self` is shared (it would have to come from `Deref`,
            // which the caller's borrow of `src` would then freeze).
            Some(end) if end <= self.len => unsafe {
                ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len());
                Ok(())
            },
            _ => Err(Errno::INVAL),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: `new` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets every byte to `byte`, through the raw pointer.
    pub fn fill(&self, byte: u8) {
        // SAFETY: `len` bytes of memory this value owns; no reference into
        // it exists (the type hands none out safely).
        unsafe { ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) }
    }

    /// The bytes as a slice, for a system call that reads or writes them.
    ///
    /// # Safety
    ///
    /// Nothing else may write the buffer while the slice lives: no DMA
    /// mapping or pin of it in use by a device, no I/O in flight into it,
    /// no other thread copying into it.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes of initialized (zero-filled), private memory
        // that lives as long as `self`; the caller rules out writers.
        unsafe { slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as a mutable slice, for a system call that fills them.
    ///
    /// # Safety
    ///
    /// Nothing else may read or write the buffer while the slice lives (see
    /// [`HostBuffer::as_slice`]).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: As for `as_slice`, and `&mut self` excludes other Rust
        // borrows.
        unsafe { slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// `pread(file, buffer[offset..offset + len], file_offset)`: the kernel
    /// (or, with `O_DIRECT`, the device) fills the range; no reference into
    /// the buffer is made. Returns the bytes read.
    pub fn pread_from(
        &self,
        file: impl AsFd,
        file_offset: u64,
        offset: usize,
        len: usize,
    ) -> Result<usize, Errno> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(Errno::INVAL),
        }
        // SAFETY: The range lies inside the buffer.
        unsafe { pread_raw(file, file_offset, self.ptr.as_ptr().add(offset), len) }
    }

    /// Copies `dst.len()` bytes at `offset` of the buffer into `dst` through
    /// its raw pointer; `EINVAL` if they are not all inside it.
    pub fn read_raw(&self, offset: usize, dst: &mut [u8]) -> Result<(), Errno> {
        match offset.checked_add(dst.len()) {
            // SAFETY: In bounds; `dst` is exclusively borrowed, so distinct.
            Some(end) if end <= self.len => unsafe {
                ptr::copy_nonoverlapping(
                    self.ptr.as_ptr().add(offset),
                    dst.as_mut_ptr(),
                    dst.len(),
                );
                Ok(())
            },
            _ => Err(Errno::INVAL),
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned, and no
        // reference into the buffer outlives `self`.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Memory that storage may DMA into or out of directly: a CPU mapping whose
/// pages the block layer accepts for `O_DIRECT`.
#[derive(Clone, Copy, Debug)]
pub struct DmaTarget {
    /// The mapping's first byte.
    pub ptr: *mut u8,
    /// Its length.
    pub len: usize,
    /// Whether the pages are PCI P2P memory (DMA goes device to device).
    pub p2p: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_at_every_alignment() {
        for caching in [Caching::WriteCombined, Caching::WriteBack] {
            copies_are_exact_with(caching);
        }
    }

    fn copies_are_exact_with(caching: Caching) {
        let memfd = rustix::fs::memfd_create("sys-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&memfd, 8192).unwrap();
        // SAFETY: A memfd of this test's own, which nothing else maps.
        let map =
            unsafe { RawMapping::map_with(&memfd, 8192, 0, Sharing::Shared, caching) }.unwrap();
        assert_eq!(map.caching(), caching);
        let data: Vec<u8> = (0..100u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in 0..17 {
            for len in [0, 1, 7, 8, 9, 23, 100] {
                map.write_at(0, &[0xAA; 128]).unwrap();
                map.write_at(offset, &data[..len]).unwrap();
                let mut back = vec![0u8; 128];
                map.read_at(0, &mut back).unwrap();
                assert!(back[..offset].iter().all(|&b| b == 0xAA));
                assert_eq!(&back[offset..offset + len], &data[..len]);
                assert!(back[offset + len..].iter().all(|&b| b == 0xAA));
            }
        }
    }

    #[test]
    fn out_of_range_copies_are_refused() {
        let memfd = rustix::fs::memfd_create("sys-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&memfd, 4096).unwrap();
        // SAFETY: A memfd of this test's own, which nothing else maps.
        let map = unsafe { RawMapping::map(&memfd, 4096, 0, Sharing::Shared) }.unwrap();
        assert_eq!(map.write_at(4096, &[1]), Err(Errno::INVAL));
        assert_eq!(map.write_at(4095, &[1, 2]), Err(Errno::INVAL));
        assert_eq!(map.read_at(usize::MAX, &mut [0]), Err(Errno::INVAL));
        assert_eq!(map.write_at(4096, &[]), Ok(()));
    }

    #[test]
    fn file_io_goes_through_the_mapping() {
        let memfd = rustix::fs::memfd_create("sys-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&memfd, 4096).unwrap();
        // SAFETY: A memfd of this test's own, which nothing else maps.
        let map = unsafe { RawMapping::map(&memfd, 4096, 0, Sharing::Shared) }.unwrap();
        let src = rustix::fs::memfd_create("src", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::pwrite(&src, b"hello, device", 0).unwrap();
        assert_eq!(map.pread_from(&src, 7, 100, 6), Ok(6));
        let mut back = [0u8; 6];
        map.read_at(100, &mut back).unwrap();
        assert_eq!(&back, b"device");
        let dst = rustix::fs::memfd_create("dst", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert_eq!(map.pwrite_to(&dst, 0, 100, 6), Ok(6));
        let mut out = [0u8; 6];
        rustix::io::pread(&dst, &mut out, 0).unwrap();
        assert_eq!(&out, b"device");
        assert_eq!(map.pread_from(&src, 0, 4000, 200), Err(Errno::INVAL));
    }

    #[test]
    fn large_host_buffers_start_on_a_huge_page_and_are_exact() {
        for len in [HUGE_PAGE, HUGE_PAGE + 4096, 3 * HUGE_PAGE + 12345] {
            let b = HostBuffer::new(len).unwrap();
            assert_eq!(b.as_raw() as usize % HUGE_PAGE, 0);
            assert_eq!(b.len(), len);
            let mut all = vec![1u8; len];
            b.read_raw(0, &mut all).unwrap();
            assert!(all.iter().all(|&x| x == 0));
            b.write_raw(len - 1, &[7]).unwrap();
            b.write_raw(0, &[9]).unwrap();
            let (mut first, mut last) = ([0u8], [0u8]);
            b.read_raw(0, &mut first).unwrap();
            b.read_raw(len - 1, &mut last).unwrap();
            assert_eq!((first, last), ([9], [7]));
            assert_eq!(b.write_raw(len, &[1]), Err(Errno::INVAL));
        }
    }

    #[test]
    fn host_buffers_are_page_aligned_and_zeroed() {
        let mut b = HostBuffer::new(10000).unwrap();
        assert_eq!(b.addr() % 4096, 0);
        // SAFETY: No device or other thread uses the buffer.
        assert!(unsafe { b.as_slice() }.iter().all(|&x| x == 0));
        b.fill(5);
        // SAFETY: As above.
        let bytes = unsafe { b.as_mut_slice() };
        assert!(bytes.iter().all(|&x| x == 5));
        bytes[9999] = 6;
        let mut last = [0u8];
        b.read_raw(9999, &mut last).unwrap();
        assert_eq!(last, [6]);
        assert_eq!(HostBuffer::new(0).unwrap_err(), Errno::INVAL);
    }
}
