// SPDX-License-Identifier: GPL-2.0

//! `/dev/p2pdma`: the misc device, its ioctls and `mmap`.
//!
//! Every resource (allocation, DMA mapping) belongs to the open file and is
//! released when the file is. The file is bound to the process that opened
//! it: only that process may map memory or use the ioctls that create or
//! release resources.

use core::fmt::Write;

use kernel::{
    fs::File,
    ioctl::{
        _IOC_SIZE,
        _IOR,
        _IOW,
        _IOWR, //
    },
    miscdevice::{
        MiscDevice,
        MiscDeviceRegistration, //
    },
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{
        Arc,
        Mutex, //
    },
    transmute::{
        AsBytes,
        FromBytes, //
    },
    uaccess::{
        UserPtr,
        UserSlice,
        UserSliceWriter, //
    },
};

use crate::{
    accel::DEVICES,
    ffi::{
        self,
        FileMapping,
        P2pPages,
        Peer,
        ResourceMap,
        SgMap,
        ThreadGroup,
        PAGE_SIZE, //
    },
    memory::Alloc,
    uapi, //
};

macro_rules! abi_struct {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: `repr(C)` structs of integers and integer arrays with
            // explicit padding (layout pinned in uapi.rs): every bit pattern
            // is valid and there are no padding bytes.
            unsafe impl FromBytes for $t {}
            // SAFETY: See above.
            unsafe impl AsBytes for $t {}
        )*
    };
}

abi_struct!(
    uapi::P2pdmaVersion,
    uapi::P2pdmaDeviceInfo,
    uapi::P2pdmaAlloc,
    uapi::P2pdmaFree,
    uapi::P2pdmaP2pQuery,
    uapi::P2pdmaDmaSeg,
    uapi::P2pdmaDmaMap,
    uapi::P2pdmaUnmap,
);

// The shared ABI computes request codes itself; they must equal the kernel's.
const _: () = {
    use uapi::*;
    assert!(P2PDMA_IOC_GET_VERSION == _IOR::<P2pdmaVersion>(P2PDMA_IOCTL_MAGIC, 0x00));
    assert!(P2PDMA_IOC_DEVICE_INFO == _IOWR::<P2pdmaDeviceInfo>(P2PDMA_IOCTL_MAGIC, 0x01));
    assert!(P2PDMA_IOC_ALLOC == _IOWR::<P2pdmaAlloc>(P2PDMA_IOCTL_MAGIC, 0x02));
    assert!(P2PDMA_IOC_FREE == _IOW::<P2pdmaFree>(P2PDMA_IOCTL_MAGIC, 0x03));
    assert!(P2PDMA_IOC_P2P_QUERY == _IOWR::<P2pdmaP2pQuery>(P2PDMA_IOCTL_MAGIC, 0x04));
    assert!(P2PDMA_IOC_DMA_MAP == _IOWR::<P2pdmaDmaMap>(P2PDMA_IOCTL_MAGIC, 0x05));
    assert!(P2PDMA_IOC_PIN_USER == _IOWR::<P2pdmaDmaMap>(P2PDMA_IOCTL_MAGIC, 0x06));
    assert!(P2PDMA_IOC_UNMAP == _IOW::<P2pdmaUnmap>(P2PDMA_IOCTL_MAGIC, 0x07));
    assert!(P2PDMA_IOC_DMABUF_IMPORT == _IOWR::<P2pdmaDmaMap>(P2PDMA_IOCTL_MAGIC, 0x08));
};

/// Largest `PIN_USER` length.
const MAX_PIN_LEN: u64 = 1 << 30;

/// Most segments returned by one mapping (a 1 GiB pin of 4 KiB pages).
const MAX_SEGS: usize = (MAX_PIN_LEN / PAGE_SIZE) as usize;

/// What a DMA mapping holds.
enum MapKind {
    /// Allocation memory reached by bus address: nothing to unmap, but the
    /// allocation may not be freed while the peer may use it.
    Bus(Arc<Alloc>),
    /// Allocation memory mapped through the host bridge.
    Resource {
        alloc: Arc<Alloc>,
        _map: ResourceMap,
    },
    /// Pinned user pages or an imported dma-buf.
    Sg(SgMap),
}

struct DmaMapping {
    handle: u64,
    kind: MapKind,
}

impl DmaMapping {
    fn uses(&self, alloc: &Arc<Alloc>) -> bool {
        match &self.kind {
            MapKind::Bus(a) | MapKind::Resource { alloc: a, .. } => Arc::ptr_eq(a, alloc),
            MapKind::Sg(_) => false,
        }
    }
}

#[derive(Default)]
struct FileState {
    /// Live allocations, by handle.
    allocs: KVec<Arc<Alloc>>,
    /// Freed allocations: their user mappings may remain (holding this file
    /// open), so an unbind must still be able to revoke them.
    freed: KVec<Arc<Alloc>>,
    maps: KVec<DmaMapping>,
}

/// State of one open `/dev/p2pdma` file.
#[pin_data]
pub(crate) struct P2pdmaFile {
    /// Thread group that opened the file.
    owner: ThreadGroup,
    #[pin]
    state: Mutex<FileState>,
}

#[vtable]
impl MiscDevice for P2pdmaFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        KBox::try_pin_init(
            try_pin_init!(P2pdmaFile {
                owner: ThreadGroup::current()?,
                state <- new_mutex!(FileState::default()),
            }),
            GFP_KERNEL,
        )
    }

    fn release(me: Pin<KBox<Self>>, _file: &File) {
        let state = core::mem::take(&mut *me.state.lock());
        // DMA mappings first: they may refer to allocations.
        drop(state.maps);
        let mut devices = DEVICES.lock();
        for alloc in Iterator::chain(state.allocs.iter(), state.freed.iter()) {
            devices.forget(alloc);
        }
        drop(devices);
        for alloc in &state.allocs {
            alloc.release();
        }
    }

    fn mmap(me: Pin<&P2pdmaFile>, _file: &File, vma: &VmaNew) -> Result {
        me.check_owner()?;
        let (pgoff, shared) = ffi::vma_pgoff_shared(vma);
        if !shared {
            return Err(EINVAL);
        }
        let npages = ((vma.end() - vma.start()) as u64).div_ceil(PAGE_SIZE);
        let alloc = me
            .state
            .lock()
            .allocs
            .iter()
            .find(|a| a.contains_pages(pgoff, npages))
            .cloned()
            .ok_or(EINVAL)?;
        alloc.mmap(vma, pgoff, npages)
    }

    fn ioctl(me: Pin<&P2pdmaFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        match cmd {
            uapi::P2PDMA_IOC_GET_VERSION => get_version(user),
            uapi::P2PDMA_IOC_DEVICE_INFO => device_info(user),
            uapi::P2PDMA_IOC_P2P_QUERY => p2p_query(user),
            uapi::P2PDMA_IOC_ALLOC => me.check_owner().and_then(|()| me.alloc(file, user)),
            uapi::P2PDMA_IOC_FREE => me.check_owner().and_then(|()| me.free(user)),
            uapi::P2PDMA_IOC_DMA_MAP
            | uapi::P2PDMA_IOC_PIN_USER
            | uapi::P2PDMA_IOC_DMABUF_IMPORT => {
                me.check_owner()?;
                if !ffi::capable_rawio() {
                    return Err(EPERM);
                }
                me.dma_map(cmd, user)
            }
            uapi::P2PDMA_IOC_UNMAP => me.check_owner().and_then(|()| me.unmap(user)),
            _ => Err(ENOTTY),
        }?;
        Ok(0)
    }
}

fn get_version(user: UserSlice) -> Result {
    let out = uapi::P2pdmaVersion {
        abi_version: uapi::P2PDMA_ABI_VERSION,
        abi_min_compat: uapi::P2PDMA_ABI_MIN_COMPAT,
        capabilities: uapi::P2PDMA_CAP_BAR_P2PMEM
            | uapi::P2PDMA_CAP_ALLOC
            | uapi::P2PDMA_CAP_P2P_QUERY
            | uapi::P2PDMA_CAP_DMA_MAP
            | uapi::P2PDMA_CAP_DMABUF,
        num_devices: DEVICES.lock().count() as u32,
        ..Default::default()
    };
    user.writer().write(&out)
}

fn device_info(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let arg: uapi::P2pdmaDeviceInfo = reader.read()?;
    if arg.flags != 0 || arg.reserved != [0; 4] || arg.index >= uapi::P2PDMA_MAX_DEVICES {
        return Err(EINVAL);
    }
    let out = {
        let devices = DEVICES.lock();
        let dev = devices.get(arg.index as usize).ok_or(ENODEV)?;
        uapi::P2pdmaDeviceInfo {
            p2p_available: dev.info.p2p_size.saturating_sub(dev.allocated()),
            ..dev.info
        }
    };
    writer.write(&out)
}

/// Resolves the peer named by an ioctl argument.
fn resolve_peer(flags: u32, p: &uapi::P2pdmaPeer) -> Result<Peer> {
    if p.pad0 != 0 {
        return Err(EINVAL);
    }
    if flags & uapi::P2PDMA_PEER_FD != 0 {
        if p.domain != 0 || p.bus != 0 || p.devfn != 0 {
            return Err(EINVAL);
        }
        Peer::from_fd(p.fd)
    } else {
        if p.fd != 0 && p.fd != -1 {
            return Err(EINVAL);
        }
        Peer::from_address(p.domain, p.bus, p.devfn)
    }
}

/// Formats into a fixed, NUL-terminated buffer, truncating.
struct ReasonBuf {
    buf: [u8; uapi::P2PDMA_REASON_LEN],
    len: usize,
}

impl Write for ReasonBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let room = self.buf.len() - 1 - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

struct PciName((u32, u8, u8));

impl core::fmt::Display for PciName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (domain, bus, devfn) = self.0;
        write!(f, "{:04x}:{:02x}:{:02x}.{}", domain, bus, devfn >> 3, devfn & 7)
    }
}

/// How `peer` reaches `provider`'s memory: the map type, the kernel's
/// distance and the reason in words.
///
/// The kernel's P2PDMA core decides whether P2P is allowed (its distance);
/// the type follows its rules: devices below a common bridge talk by bus
/// address, others through the host bridge.
fn classify(
    provider: &kernel::pci::Device,
    peer: &Peer,
) -> (u32, i32, [u8; uapi::P2PDMA_REASON_LEN]) {
    let mut r = ReasonBuf {
        buf: [0; uapi::P2PDMA_REASON_LEN],
        len: 0,
    };
    let a = PciName(peer.location());
    let b = PciName(ffi::location(provider));
    let common = peer.common_upstream(provider).map(PciName);
    let (map_type, distance) = match (peer.distance(provider), common) {
        (Some(d), Some(bridge)) => {
            let _ = write!(r, "{a} and {b} share upstream bridge {bridge}: P2P by bus address");
            (uapi::P2PDMA_MAP_BUS_ADDR, d as i32)
        }
        (Some(d), None) => {
            let _ = write!(r, "{a} and {b} meet at a host bridge the kernel allows for P2P");
            (uapi::P2PDMA_MAP_THRU_HOST_BRIDGE, d as i32)
        }
        (None, None) => {
            let _ = write!(
                r,
                "{a} and {b} do not share an upstream bridge or whitelisted host bridge"
            );
            (uapi::P2PDMA_MAP_NOT_SUPPORTED, -1)
        }
        (None, Some(bridge)) => {
            let _ = write!(
                r,
                "{a} and {b}: ACS below bridge {bridge} redirects P2P to a host bridge the kernel does not allow"
            );
            (uapi::P2PDMA_MAP_NOT_SUPPORTED, -1)
        }
    };
    (map_type, distance, r.buf)
}

fn p2p_query(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let mut q: uapi::P2pdmaP2pQuery = reader.read()?;
    if q.flags & !uapi::P2PDMA_PEER_FD != 0
        || q.pad1 != 0
        || q.reserved != [0; 4]
        || q.dev_index >= uapi::P2PDMA_MAX_DEVICES
    {
        return Err(EINVAL);
    }
    let provider = DEVICES
        .lock()
        .get(q.dev_index as usize)
        .ok_or(ENODEV)?
        .pdev
        .clone();
    let peer = resolve_peer(q.flags, &q.peer)?;
    let (map_type, distance, reason) = classify(&provider, &peer);
    let (domain, bus, devfn) = peer.location();
    q.peer.domain = domain;
    q.peer.bus = bus;
    q.peer.devfn = devfn;
    q.map_type = map_type;
    q.distance = distance;
    q.reason = reason;
    writer.write(&q)
}

/// Writes `segs` to the user array at `ptr`.
fn write_segs(ptr: u64, segs: &[(u64, u64)]) -> Result {
    let len = segs.len() * core::mem::size_of::<uapi::P2pdmaDmaSeg>();
    let mut w: UserSliceWriter = UserSlice::new(UserPtr::from_addr(ptr as usize), len).writer();
    for &(addr, len) in segs {
        w.write(&uapi::P2pdmaDmaSeg { addr, len })?;
    }
    Ok(())
}

impl P2pdmaFile {
    fn check_owner(&self) -> Result {
        if self.owner.is_current() {
            Ok(())
        } else {
            Err(EPERM)
        }
    }

    fn find_alloc(&self, handle: u64) -> Result<Arc<Alloc>> {
        self.state
            .lock()
            .allocs
            .iter()
            .find(|a| a.handle == handle)
            .cloned()
            .ok_or(ENOENT)
    }

    fn alloc(&self, file: &File, user: UserSlice) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut a: uapi::P2pdmaAlloc = reader.read()?;
        if a.flags != 0 || a.reserved != [0; 4] || a.dev_index >= uapi::P2PDMA_MAX_DEVICES {
            return Err(EINVAL);
        }
        let size = match a.size.checked_add(PAGE_SIZE - 1) {
            Some(s) if a.size != 0 => s & !(PAGE_SIZE - 1),
            _ => return Err(EINVAL),
        };
        let align = match a.align {
            0 => PAGE_SIZE,
            x if x.is_power_of_two() && x <= uapi::P2PDMA_MAX_ALIGN => x.max(PAGE_SIZE),
            _ => return Err(EINVAL),
        };
        let mapping = FileMapping::of(file)?;
        let index = a.dev_index as usize;
        // Room in the file's list first, so nothing fails after allocating.
        self.state.lock().allocs.reserve(1, GFP_KERNEL)?;

        let alloc = {
            let mut devices = DEVICES.lock();
            let dev = devices.get(index).ok_or(ENODEV)?;
            if size > dev.info.p2p_size {
                return Err(EINVAL);
            }
            let pdev = dev.pdev.clone();
            // Over-allocate by the alignment slack and give back the ends.
            let total = size.checked_add(align - PAGE_SIZE).ok_or(ENOMEM)?;
            let pages = P2pPages::alloc(&pdev, total as usize)?;
            let head = (align - pages.bus_addr(0) % align) % align;
            let pages = pages.trim(head as usize, size as usize);
            let handle = devices.new_handle();
            let pgoff = devices.new_pgoff(size / PAGE_SIZE)?;
            let alloc = Alloc::new(handle, index, pgoff, mapping, pages)?;
            let dev = devices.get_mut(index).ok_or(ENODEV)?;
            dev.allocs.push(alloc.clone(), GFP_KERNEL)?;
            alloc
        };
        a.size = size;
        a.handle = alloc.handle;
        a.mmap_offset = alloc.pgoff * PAGE_SIZE;
        let pushed = self.state.lock().allocs.push(alloc.clone(), GFP_KERNEL);
        if let Err(e) = pushed.map_err(Error::from).and_then(|()| writer.write(&a)) {
            // The caller never learns the handle: undo, losing nothing.
            self.forget_alloc(&alloc);
            return Err(e);
        }
        Ok(())
    }

    /// Removes `alloc` from this file and its device and frees it.
    fn forget_alloc(&self, alloc: &Arc<Alloc>) {
        self.state.lock().allocs.retain(|a| !Arc::ptr_eq(a, alloc));
        DEVICES.lock().forget(alloc);
        alloc.release();
    }

    fn free(&self, user: UserSlice) -> Result {
        let f: uapi::P2pdmaFree = user.reader().read()?;
        if f.flags != 0 || f.reserved0 != 0 || f.reserved != [0; 2] {
            return Err(EINVAL);
        }
        let mut state = self.state.lock();
        let i = state
            .allocs
            .iter()
            .position(|a| a.handle == f.handle)
            .ok_or(ENOENT)?;
        // A peer may still DMA to it: its mappings must go first.
        if state.maps.iter().any(|m| m.uses(&state.allocs[i])) {
            return Err(EBUSY);
        }
        state.freed.reserve(1, GFP_KERNEL)?;
        let alloc = state.allocs.remove(i).map_err(|_| ENOENT)?;
        alloc.release();
        // Cannot fail: room was reserved above.
        let _ = state.freed.push_within_capacity(alloc);
        Ok(())
    }

    fn dma_map(&self, cmd: u32, user: UserSlice) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut m: uapi::P2pdmaDmaMap = reader.read()?;
        if m.flags & !uapi::P2PDMA_PEER_FD != 0
            || m.pad0 != 0
            || m.pad1 != 0
            || m.reserved != [0; 4]
            || m.num_segs != 0
            || m.map_handle != 0
            || m.map_type != 0
        {
            return Err(EINVAL);
        }
        let used_fields_ok = match cmd {
            uapi::P2PDMA_IOC_DMA_MAP => m.dmabuf_fd == 0 && m.user_va == 0,
            uapi::P2PDMA_IOC_PIN_USER => m.dmabuf_fd == 0 && m.handle == 0 && m.offset == 0,
            _ => m.handle == 0 && m.user_va == 0 && m.offset == 0 && m.length == 0,
        };
        if !used_fields_ok {
            return Err(EINVAL);
        }
        let peer = resolve_peer(m.flags, &m.peer)?;
        let max = (m.max_segs as usize).min(MAX_SEGS);

        let mut segs = KVVec::new();
        let (kind, map_type) = match cmd {
            uapi::P2PDMA_IOC_DMA_MAP => {
                let alloc = self.find_alloc(m.handle)?;
                let end = m.offset.checked_add(m.length).ok_or(EINVAL)?;
                if m.length == 0 || m.offset % PAGE_SIZE != 0 || m.length % PAGE_SIZE != 0 || end > alloc.size {
                    return Err(EINVAL);
                }
                let provider = alloc.with_pages(|p| Ok(p.pdev().clone()))?;
                let (map_type, _, _) = classify(&provider, &peer);
                let kind = match map_type {
                    uapi::P2PDMA_MAP_BUS_ADDR => {
                        let addr = alloc.with_pages(|p| Ok(p.bus_addr(m.offset as usize)))?;
                        segs.push((addr, m.length), GFP_KERNEL)?;
                        MapKind::Bus(alloc)
                    }
                    uapi::P2PDMA_MAP_THRU_HOST_BRIDGE => {
                        let map = alloc.with_pages(|p| {
                            peer.map_resource(p.phys_addr(m.offset as usize), m.length)
                        })?;
                        segs.push((map.addr, m.length), GFP_KERNEL)?;
                        MapKind::Resource { alloc, _map: map }
                    }
                    _ => return Err(EREMOTEIO),
                };
                (kind, map_type)
            }
            uapi::P2PDMA_IOC_PIN_USER => {
                let end = m.user_va.checked_add(m.length).ok_or(EINVAL)?;
                if m.length == 0
                    || m.length > MAX_PIN_LEN
                    || m.user_va % PAGE_SIZE != 0
                    || m.length % PAGE_SIZE != 0
                    || end > isize::MAX as u64
                {
                    return Err(EINVAL);
                }
                (MapKind::Sg(peer.pin_user(m.user_va, m.length)?), 0)
            }
            _ => (MapKind::Sg(peer.dmabuf_import(m.dmabuf_fd)?), 0),
        };
        if let MapKind::Sg(sg) = &kind {
            let mut addrs = KVVec::from_elem(0u64, max, GFP_KERNEL)?;
            let mut lens = KVVec::from_elem(0u64, max, GFP_KERNEL)?;
            let n = sg.segments(&mut addrs, &mut lens);
            if n > max {
                m.num_segs = n as u32;
                writer.write(&m)?;
                return Err(ENOSPC);
            }
            for i in 0..n {
                segs.push((addrs[i], lens[i]), GFP_KERNEL)?;
            }
            m.length = sg.len();
        }
        m.num_segs = segs.len() as u32;
        if segs.len() > max {
            writer.write(&m)?;
            return Err(ENOSPC);
        }
        write_segs(m.segs_ptr, &segs)?;
        m.map_type = map_type;
        m.map_handle = DEVICES.lock().new_handle();
        let handle = m.map_handle;
        self.state
            .lock()
            .maps
            .push(DmaMapping { handle, kind }, GFP_KERNEL)?;
        if let Err(e) = writer.write(&m) {
            // The caller never learns the handle: undo.
            self.state.lock().maps.retain(|x| x.handle != handle);
            return Err(e);
        }
        Ok(())
    }

    fn unmap(&self, user: UserSlice) -> Result {
        let u: uapi::P2pdmaUnmap = user.reader().read()?;
        if u.flags != 0 || u.reserved0 != 0 || u.reserved != [0; 2] {
            return Err(EINVAL);
        }
        let mapping = {
            let mut state = self.state.lock();
            let i = state
                .maps
                .iter()
                .position(|m| m.handle == u.map_handle)
                .ok_or(ENOENT)?;
            state.maps.remove(i).map_err(|_| ENOENT)?
        };
        drop(mapping);
        Ok(())
    }
}
