// SPDX-License-Identifier: GPL-2.0

//! `/dev/p2pdma`: the misc device, its ioctls and `mmap`.
//!
//! Every resource (allocation, DMA mapping) belongs to the open file and is
//! released when the file is. The file is bound to the process that opened
//! it: only that process may map memory or use the ioctls that create or
//! release resources. Resources a device takes away (an unbind) stay listed,
//! revoked, until released; the owner's eventfd is signalled.

use core::fmt::Write;

use kernel::{
    dma::DataDirection,
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
    accel::{
        self,
        DEVICES, //
    },
    blockio,
    dma::{
        self,
        DmaMapping,
        Source, //
    },
    ffi::{
        self,
        dma::{
            Pinned,
            SgMap, //
        },
        dmabuf::{
            DmaBuf,
            ExporterNotice, //
        },
        eventfd::{
            EventFd,
            Notifier, //
        },
        mm::{
            FileMapping,
            PAGE_SIZE, //
        },
        p2pmem::P2pPages,
        pci::Peer,
        task::{
            Cap,
            ThreadGroup, //
        },
    },
    memory::Alloc,
    overlap::{
        Counted,
        Ticket, //
    },
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
    uapi::P2pdmaEventfd,
    uapi::P2pdmaHandleState,
    uapi::P2pdmaIoSeg,
    uapi::P2pdmaBlockIo,
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
    assert!(P2PDMA_IOC_SET_EVENTFD == _IOW::<P2pdmaEventfd>(P2PDMA_IOCTL_MAGIC, 0x09));
    assert!(P2PDMA_IOC_HANDLE_STATE == _IOWR::<P2pdmaHandleState>(P2PDMA_IOCTL_MAGIC, 0x0a));
    assert!(P2PDMA_IOC_BLOCK_IO == _IOWR::<P2pdmaBlockIo>(P2PDMA_IOCTL_MAGIC, 0x0b));
};

/// Largest `PIN_USER` length.
const MAX_PIN_LEN: u64 = 1 << 30;

/// Most segments returned by one mapping (a 1 GiB pin of 4 KiB pages).
const MAX_SEGS: usize = (MAX_PIN_LEN / PAGE_SIZE) as usize;

#[derive(Default)]
struct FileState {
    /// Allocations, by handle, until `FREE` (revoked ones included).
    allocs: KVec<Arc<Alloc>>,
    /// DMA mappings, by handle, until `UNMAP` (revoked ones included).
    maps: KVec<Arc<DmaMapping>>,
}

/// State of one open `/dev/p2pdma` file.
#[pin_data]
pub(crate) struct P2pdmaFile {
    /// Thread group that opened the file.
    owner: ThreadGroup,
    /// Where revocation notices go.
    notifier: Arc<Notifier>,
    #[pin]
    state: Mutex<FileState>,
    /// Accelerator and block device pairs `BLOCK_IO` found reachable.
    #[pin]
    reachable: Mutex<blockio::Reachable>,
}

#[vtable]
impl MiscDevice for P2pdmaFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        KBox::try_pin_init(
            try_pin_init!(P2pdmaFile {
                owner: ThreadGroup::current()?,
                notifier: Notifier::new()?,
                state <- new_mutex!(FileState::default()),
                reachable <- new_mutex!(KVec::new()),
            }),
            GFP_KERNEL,
        )
    }

    fn release(me: Pin<KBox<Self>>, _file: &File) {
        let state = core::mem::take(&mut *me.state.lock());
        // DMA mappings first: they may map allocations.
        for m in &state.maps {
            dma::release(m);
        }
        drop(state.maps);
        // No user mapping is left (each holds the file open): the memory
        // goes now.
        for alloc in &state.allocs {
            alloc.disown();
        }
    }

    fn mmap(me: Pin<&P2pdmaFile>, _file: &File, vma: &VmaNew) -> Result {
        me.check_owner()?;
        let (pgoff, shared) = ffi::mm::vma_pgoff_shared(vma);
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
        alloc.mmap(vma)
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
                if !ffi::task::capable(Cap::SysRawio) {
                    return Err(EPERM);
                }
                me.dma_map(cmd, user)
            }
            uapi::P2PDMA_IOC_UNMAP => me.check_owner().and_then(|()| me.unmap(user)),
            uapi::P2PDMA_IOC_SET_EVENTFD => me.check_owner().and_then(|()| me.set_eventfd(user)),
            uapi::P2PDMA_IOC_HANDLE_STATE => me.handle_state(user),
            uapi::P2PDMA_IOC_BLOCK_IO => me.check_owner().and_then(|()| me.block_io(user)),
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
            | uapi::P2PDMA_CAP_DMABUF
            | uapi::P2PDMA_CAP_REVOKE
            | uapi::P2PDMA_CAP_MAP_DIRECTION
            | uapi::P2PDMA_CAP_BLOCK_IO,
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

/// Resolves the peer named by an ioctl argument: one PCI function, or each
/// controller with a path to a multipath block device.
fn resolve_peers(flags: u32, p: &uapi::P2pdmaPeer) -> Result<KVec<Peer>> {
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
        let mut v = KVec::new();
        v.push(Peer::from_address(p.domain, p.bus, p.devfn)?, GFP_KERNEL)?;
        Ok(v)
    }
}

/// The peers of a mapping ioctl: as [`resolve_peers`], and each a DMA
/// master (`EOPNOTSUPP` for a bridge, which masters no DMA of its own and
/// keeps the PCI core's default segment limit).
fn mapping_peers(flags: u32, p: &uapi::P2pdmaPeer) -> Result<KVec<Peer>> {
    let peers = resolve_peers(flags, p)?;
    if peers.iter().any(Peer::is_bridge) {
        return Err(EOPNOTSUPP);
    }
    Ok(peers)
}

/// The DMA direction asked for by `P2PDMA_MAP_PEER_*` flags.
fn direction(flags: u32) -> DataDirection {
    let reads = flags & uapi::P2PDMA_MAP_PEER_READS != 0;
    let writes = flags & uapi::P2PDMA_MAP_PEER_WRITES != 0;
    match (reads, writes) {
        (true, false) => DataDirection::ToDevice,
        (false, true) => DataDirection::FromDevice,
        _ => DataDirection::Bidirectional,
    }
}

/// Formats into a fixed, NUL-terminated buffer, truncating.
struct ReasonBuf {
    buf: [u8; uapi::P2PDMA_REASON_LEN],
    len: usize,
}

impl ReasonBuf {
    fn new() -> Self {
        Self {
            buf: [0; uapi::P2PDMA_REASON_LEN],
            len: 0,
        }
    }
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
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{}",
            domain,
            bus,
            devfn >> 3,
            devfn & 7
        )
    }
}

/// What the kernel decides for one peer of `provider`'s memory.
struct Verdict {
    map_type: u32,
    distance: i32,
    reason: ReasonBuf,
}

/// How `peer` reaches `provider`'s memory, as the kernel decides it: one
/// page of the memory (`probe`) is mapped for the peer by the DMA API, which
/// applies the P2PDMA rules (ACS redirect, host bridge allowlist, IOMMU);
/// the distance is the P2PDMA core's.
fn classify(provider: &kernel::pci::Device, probe: &P2pPages, peer: &Peer) -> Verdict {
    let mut reason = ReasonBuf::new();
    let a = PciName(peer.location());
    let b = PciName(ffi::pci::location(provider));
    let common = peer.common_upstream(provider).map(PciName);
    let distance = peer.distance(provider).map_or(-1, |d| d as i32);
    // Mapped for the peer to read only: the decision does not depend on
    // the direction, and the DMA API does not count such mappings among
    // the overlapping ones (see `overlap`), however many queries run.
    let trial = probe.map_for(peer, 0, PAGE_SIZE, DataDirection::ToDevice);
    let map_type = match (&trial, &common) {
        (Ok((_, true)), Some(bridge)) => {
            let _ = write!(
                reason,
                "{a} and {b} share bridge {bridge}: the kernel maps by bus address"
            );
            uapi::P2PDMA_MAP_BUS_ADDR
        }
        (Ok((_, true)), None) => {
            let _ = write!(reason, "{a} and {b}: the kernel maps by bus address");
            uapi::P2PDMA_MAP_BUS_ADDR
        }
        (Ok((_, false)), _) => {
            let _ = write!(
                reason,
                "{a} and {b} meet at a host bridge the kernel allows: mapped through it (DMA API)"
            );
            uapi::P2PDMA_MAP_THRU_HOST_BRIDGE
        }
        (Err(e), Some(bridge)) if *e == EREMOTEIO => {
            let _ = write!(
                reason,
                "{a} and {b}: ACS below bridge {bridge} redirects P2P to a host bridge the kernel does not allow"
            );
            uapi::P2PDMA_MAP_NOT_SUPPORTED
        }
        (Err(e), None) if *e == EREMOTEIO => {
            let _ = write!(
                reason,
                "{a} and {b} do not share an upstream bridge or whitelisted host bridge"
            );
            uapi::P2PDMA_MAP_NOT_SUPPORTED
        }
        (Err(e), _) => {
            let _ = write!(reason, "{a} and {b}: the DMA API failed to map ({e:?})");
            uapi::P2PDMA_MAP_NOT_SUPPORTED
        }
    };
    drop(trial);
    let distance = if map_type == uapi::P2PDMA_MAP_NOT_SUPPORTED {
        -1
    } else {
        distance
    };
    Verdict {
        map_type,
        distance,
        reason,
    }
}

/// Rank of a map type, worst last.
fn badness(map_type: u32) -> u32 {
    match map_type {
        uapi::P2PDMA_MAP_BUS_ADDR => 0,
        uapi::P2PDMA_MAP_THRU_HOST_BRIDGE => 1,
        _ => 2,
    }
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
    let (provider, probe) = {
        let devices = DEVICES.lock();
        let dev = devices.get(q.dev_index as usize).ok_or(ENODEV)?;
        (dev.pdev.clone(), dev.probe.clone())
    };
    let peers = resolve_peers(q.flags, &q.peer)?;
    // A multipath device is as good as its worst path.
    let mut worst: Option<Verdict> = None;
    for peer in &peers {
        let v = classify(&provider, &probe, peer);
        worst = match worst {
            Some(w)
                if badness(w.map_type) > badness(v.map_type)
                    || (badness(w.map_type) == badness(v.map_type) && w.distance >= v.distance) =>
            {
                Some(w)
            }
            _ => Some(v),
        };
    }
    let v = worst.ok_or(ENXIO)?;
    let (domain, bus, devfn) = peers[0].location();
    q.peer.domain = domain;
    q.peer.bus = bus;
    q.peer.devfn = devfn;
    q.map_type = v.map_type;
    q.distance = v.distance;
    q.reason = v.reason.buf;
    writer.write(&q)
}

/// The segments of `sg`, merged up to `max_seg` bytes.
fn segments(sg: &SgMap, max_seg: u64) -> Result<KVVec<(u64, u64)>> {
    let mut segs = KVVec::new();
    sg.for_each_segment(max_seg, |a, l| {
        if segs.len() >= MAX_SEGS {
            return Err(E2BIG);
        }
        segs.push((a, l), GFP_KERNEL)?;
        Ok(())
    })?;
    Ok(segs)
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
        let uid = ffi::task::current_uid();
        let capped = !ffi::task::capable(Cap::SysAdmin);
        // Room in the file's list first, so nothing fails after allocating.
        self.state.lock().allocs.reserve(1, GFP_KERNEL)?;

        // Whether the request fits: checked again when the allocation is
        // recorded, since the lock is not held while the pages are taken
        // and initialised.
        let fits = |dev: &accel::AccelDev| -> Result {
            if size > dev.info.p2p_size {
                return Err(EINVAL);
            }
            if capped {
                let (total, share) = (dev.info.p2p_size, ffi::param::user_share());
                let cap = total / 100 * share + total % 100 * share / 100;
                if dev.held_by(uid).saturating_add(size) > cap {
                    return Err(EDQUOT);
                }
            }
            Ok(())
        };
        // The binding is named by its probe page, which each bind makes anew.
        let (pdev, binding) = {
            let devices = DEVICES.lock();
            let dev = devices.get(index).ok_or(ENODEV)?;
            fits(dev)?;
            (dev.pdev.clone(), Arc::as_ptr(&dev.probe))
        };
        // Over-allocate by the alignment slack and give back the ends. The
        // pages are initialised one by one: not under the registry's lock,
        // which every ioctl takes.
        let total = size.checked_add(align - PAGE_SIZE).ok_or(ENOMEM)?;
        let pages = P2pPages::alloc(&pdev, total as usize)?;
        let head = pages
            .bus_addr(0)
            .map(|bus| (align - bus % align) % align)
            .ok_or(EINVAL)?;
        let pages = pages.trim(head as usize, size as usize)?;

        let alloc = {
            let mut devices = DEVICES.lock();
            // The same binding of the device (an unbind and a bind may have
            // run meanwhile), and still room for this user.
            let dev = devices.get(index).ok_or(ENODEV)?;
            if Arc::as_ptr(&dev.probe) != binding {
                return Err(ENODEV);
            }
            fits(dev)?;
            let handle = devices.new_handle();
            let pgoff = devices.new_pgoff(size / PAGE_SIZE)?;
            let alloc = Alloc::new(
                handle,
                index,
                pgoff,
                uid,
                mapping,
                self.notifier.clone(),
                accel::unlist,
                pages,
            )?;
            let dev = devices.get_mut(index).ok_or(ENODEV)?;
            dev.allocs.push(alloc.clone(), GFP_KERNEL)?;
            alloc
        };
        // Nobody else can reach it yet: clear what the previous user left,
        // outside the registry lock.
        let zeroed = alloc.zero();
        a.size = size;
        a.handle = alloc.handle;
        a.mmap_offset = alloc.pgoff * PAGE_SIZE;
        let done = zeroed.and_then(|()| {
            self.state
                .lock()
                .allocs
                .push(alloc.clone(), GFP_KERNEL)
                .map_err(Error::from)
        });
        if let Err(e) = done.and_then(|()| writer.write(&a)) {
            // The caller never learns the handle: undo, losing nothing.
            self.state.lock().allocs.retain(|x| !Arc::ptr_eq(x, &alloc));
            alloc.disown();
            return Err(e);
        }
        Ok(())
    }

    fn free(&self, user: UserSlice) -> Result {
        let f: uapi::P2pdmaFree = user.reader().read()?;
        if f.flags != 0 || f.reserved0 != 0 || f.reserved != [0; 2] {
            return Err(EINVAL);
        }
        let alloc = {
            let mut state = self.state.lock();
            let i = state
                .allocs
                .iter()
                .position(|a| a.handle == f.handle)
                .ok_or(ENOENT)?;
            // A peer may still DMA to it: its mappings must go first.
            let alloc = &state.allocs[i];
            if state
                .maps
                .iter()
                .any(|m| m.maps_alloc(alloc) && m.is_live())
            {
                return Err(EBUSY);
            }
            state.allocs.remove(i).map_err(|_| ENOENT)?
        };
        alloc.disown();
        Ok(())
    }

    fn dma_map(&self, cmd: u32, user: UserSlice) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut m: uapi::P2pdmaDmaMap = reader.read()?;
        let known =
            uapi::P2PDMA_PEER_FD | uapi::P2PDMA_MAP_PEER_READS | uapi::P2PDMA_MAP_PEER_WRITES;
        if m.flags & !known != 0
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
        if cmd == uapi::P2PDMA_IOC_PIN_USER {
            let end = m.user_va.checked_add(m.length).ok_or(EINVAL)?;
            if m.length == 0
                || m.length > MAX_PIN_LEN
                || m.user_va % PAGE_SIZE != 0
                || m.length % PAGE_SIZE != 0
                || end > isize::MAX as u64
            {
                return Err(EINVAL);
            }
        }
        let peers = mapping_peers(m.flags, &m.peer)?;
        let dir = direction(m.flags);
        let max = (m.max_segs as usize).min(MAX_SEGS);
        // Segments no longer than every peer takes.
        let max_seg = peers
            .iter()
            .map(Peer::max_seg_size)
            .min()
            .unwrap_or(0)
            .max(PAGE_SIZE);

        // What is mapped, looked up before anything is mapped.
        let mut dmabuf = None;
        let mut alloc = None;
        let source = match cmd {
            uapi::P2PDMA_IOC_DMA_MAP => {
                let a = self
                    .state
                    .lock()
                    .allocs
                    .iter()
                    .find(|a| a.handle == m.handle)
                    .cloned()
                    .ok_or(ENOENT)?;
                let end = m.offset.checked_add(m.length).ok_or(EINVAL)?;
                if m.length == 0
                    || m.offset % PAGE_SIZE != 0
                    || m.length % PAGE_SIZE != 0
                    || end > a.size
                {
                    return Err(EINVAL);
                }
                alloc = Some(a.clone());
                Source::Alloc(a)
            }
            uapi::P2PDMA_IOC_PIN_USER => Source::User,
            _ => {
                let buf = DmaBuf::get(m.dmabuf_fd)?;
                // The exporter builds the segments (merging what is
                // contiguous): only a peer that takes a segment as long as
                // the whole buffer is sure to take them.
                if buf.size() > max_seg {
                    return Err(EMSGSIZE);
                }
                dmabuf = Some(buf);
                Source::DmaBuf
            }
        };

        // Listed for revocation first, then made under its own lock (see
        // `DmaMapping`): an unbind of a device it depends on either finds
        // it or keeps it from being listed. The file's lock is never held
        // while pinning or copying to user memory (both take the mmap lock,
        // which `mmap` holds when it takes the file's lock).
        let notice = match &dmabuf {
            Some(_) => Some(ExporterNotice::new(self.notifier.clone())?),
            None => None,
        };
        let handle = DEVICES.lock().new_handle();
        let mapping = DmaMapping::new(handle, source, peers, self.notifier.clone(), notice)?;
        dma::register(&mapping)?;
        let made = self.make_mapping(&mapping, alloc.as_ref(), dmabuf.as_ref(), &m, dir, max_seg);
        let (segs, map_type) = match made {
            Ok(x) => x,
            Err(e) => {
                dma::release(&mapping);
                return Err(e);
            }
        };
        m.length = segs.iter().map(|&(_, l)| l).sum();
        m.num_segs = segs.len() as u32;
        if segs.len() > max {
            dma::release(&mapping);
            writer.write(&m)?;
            return Err(ENOSPC);
        }
        m.map_type = map_type;
        m.map_handle = handle;
        let recorded = {
            let mut state = self.state.lock();
            // `FREE` of the allocation may have run meanwhile: it checks for
            // mappings under this lock, so either it saw none and the
            // allocation is gone now, or this one is recorded first.
            match &mapping.source {
                Source::Alloc(a) if !state.allocs.iter().any(|x| Arc::ptr_eq(x, a)) => Err(ENOENT),
                _ => state
                    .maps
                    .push(mapping.clone(), GFP_KERNEL)
                    .map_err(Error::from),
            }
        };
        if let Err(e) = recorded
            .and_then(|()| write_segs(m.segs_ptr, &segs))
            .and_then(|()| writer.write(&m))
        {
            // The caller never learns the handle: undo.
            self.state.lock().maps.retain(|x| !Arc::ptr_eq(x, &mapping));
            dma::release(&mapping);
            return Err(e);
        }
        Ok(())
    }

    /// Makes `mapping` (listed for revocation already): maps the memory for
    /// each of its peers and returns the segments the peers see and the
    /// map type (`DMA_MAP` only).
    fn make_mapping(
        &self,
        mapping: &DmaMapping,
        alloc: Option<&Arc<Alloc>>,
        dmabuf: Option<&DmaBuf>,
        m: &uapi::P2pdmaDmaMap,
        dir: DataDirection,
        max_seg: u64,
    ) -> Result<(KVVec<(u64, u64)>, u32)> {
        let mut out = None;
        mapping.make(|| {
            let mut maps = KVec::new();
            let mut map_type = 0;
            let mut pages = None;
            if let Some(alloc) = alloc {
                // The pages, held by the mapping from now on: `ENODEV` once
                // the allocation was revoked.
                let p = alloc.pages()?;
                let offset = usize::try_from(m.offset).map_err(|_| EINVAL)?;
                for peer in mapping.peers() {
                    let ticket = Ticket::take(p.pfn_runs(offset, m.length)?, None, dir)?;
                    let (sg, bus) = p.map_for(peer, offset, m.length, dir)?;
                    let t = if bus {
                        uapi::P2PDMA_MAP_BUS_ADDR
                    } else {
                        uapi::P2PDMA_MAP_THRU_HOST_BRIDGE
                    };
                    if map_type != 0 && map_type != t {
                        return Err(EXDEV);
                    }
                    map_type = t;
                    maps.push(Counted::new(sg, ticket), GFP_KERNEL)?;
                }
                pages = Some(p);
            } else if let Some(buf) = dmabuf {
                let notice = mapping.notice().ok_or(EINVAL)?;
                for peer in mapping.peers() {
                    let import = || peer.dmabuf_import(buf, dir, notice);
                    maps.push(Counted::import(buf.id(), dir, import)?, GFP_KERNEL)?;
                }
            } else {
                for peer in mapping.peers() {
                    let pinned = Pinned::new(m.user_va, m.length, dir)?;
                    let ticket = Ticket::take(pinned.pfn_runs()?, None, dir)?;
                    let sg = peer.map_pinned(pinned, dir)?;
                    maps.push(Counted::new(sg, ticket), GFP_KERNEL)?;
                }
            }
            // Every path of a multipath device must see the same addresses.
            let first = maps.first().ok_or(ENXIO)?;
            let segs = segments(first.map(), max_seg)?;
            for c in maps.iter().skip(1) {
                if *segments(c.map(), max_seg)? != *segs {
                    return Err(EXDEV);
                }
            }
            out = Some((segs, map_type));
            Ok(dma::Live::new(maps, pages))
        })?;
        out.ok_or(ENODEV)
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
        dma::release(&mapping);
        drop(mapping);
        Ok(())
    }

    fn set_eventfd(&self, user: UserSlice) -> Result {
        let e: uapi::P2pdmaEventfd = user.reader().read()?;
        if e.flags != 0 || e.reserved != [0; 2] {
            return Err(EINVAL);
        }
        let eventfd = match e.fd {
            -1 => None,
            fd => Some(EventFd::get(fd)?),
        };
        self.notifier.set(eventfd);
        Ok(())
    }

    fn block_io(&self, user: UserSlice) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut arg: uapi::P2pdmaBlockIo = reader.read()?;
        let alloc = self
            .state
            .lock()
            .allocs
            .iter()
            .find(|a| a.handle == arg.handle)
            .cloned()
            .ok_or(ENOENT)?;
        blockio::run(&alloc, &mut arg, &self.reachable)?;
        writer.write(&arg)
    }

    fn handle_state(&self, user: UserSlice) -> Result {
        let (mut reader, mut writer) = user.reader_writer();
        let mut h: uapi::P2pdmaHandleState = reader.read()?;
        if h.flags != 0 || h.state != 0 || h.reserved != [0; 2] {
            return Err(EINVAL);
        }
        h.state = {
            let state = self.state.lock();
            if let Some(a) = state.allocs.iter().find(|a| a.handle == h.handle) {
                if a.is_revoked() {
                    uapi::P2PDMA_STATE_REVOKED
                } else {
                    uapi::P2PDMA_STATE_LIVE
                }
            } else {
                let m = state
                    .maps
                    .iter()
                    .find(|m| m.handle == h.handle)
                    .ok_or(ENOENT)?;
                if m.is_revoking() {
                    uapi::P2PDMA_STATE_REVOKING
                } else if m.is_live() {
                    uapi::P2PDMA_STATE_LIVE
                } else {
                    uapi::P2PDMA_STATE_REVOKED
                }
            }
        };
        writer.write(&h)
    }
}
