//! A file or block device opened for transfers, with what the topology says
//! of the storage behind it.

use std::{
    fs::File,
    os::{
        fd::AsFd,
        unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::{atomic::AtomicU32, Arc, Mutex},
};

use super::{
    array::ArrayLayout,
    exec::extents,
    plan::{
        ArrayFacts, MemoryFacts, NamespaceFacts, P2pSubmit, PathChoice, PathPref, StorageFacts,
    },
    tuning::{cache::DeviceKey, geometry::Reach},
};
use crate::{
    discovery::{paths_down, DiskFacts, NvmeCmdRefusal, NvmePath, StorageTarget, Topology},
    queues::Namespace,
    transfer::{Volume, VolumeSpec},
    Error, Result,
};

/// Where [`StorageFile::claim`] locks the file description without
/// `O_DIRECT`: this far past the range claimed.
pub const CLAIM_SHADOW: u64 = 1 << 62;

/// A file or block device opened for transfers.
#[derive(Debug)]
pub struct StorageFile {
    pub(crate) path: PathBuf,
    /// Opened with `O_DIRECT`; `None` for a namespace this process drives.
    pub(crate) direct: Option<File>,
    /// The same file without `O_DIRECT`: partial blocks of writes go through
    /// the page cache.
    pub(crate) buffered: Option<File>,
    /// A namespace of a controller this process drives, or a volume
    /// striped over several: the queues path, and no kernel file.
    pub(crate) queues: Option<Arc<Volume>>,
    pub(crate) size: u64,
    pub(crate) block: usize,
    pub(crate) pci: Option<crate::PciAddress>,
    pub(crate) nvme: bool,
    pub(crate) ns: Option<NvmeNamespace>,
    /// The paths of a multipath namespace head (empty otherwise).
    pub(crate) multipath: Vec<NvmePath>,
    /// A namespace of one controller reached over a fabric: that
    /// controller, as its one path.
    pub(crate) fabric: Option<NvmePath>,
    /// The md array it is on, if any, and the paths of the members in its
    /// layout (every path of a multipath member).
    pub(crate) array: Option<(ArrayFacts, Vec<NvmePath>)>,
    /// An md array opened as a block device: its layout, to name the
    /// member an I/O error came from.
    pub(crate) layout: Option<ArrayLayout>,
    /// Why NVMe commands cannot address the namespace, if they cannot.
    pub(crate) nvme_cmd_refusal: Option<NvmeCmdRefusal>,
    /// Byte offset of the block device (the partition) on its disk.
    pub(crate) dev_start: u64,
    /// The disk's identity and request queue, for AUTO's geometry.
    pub(crate) disk: DiskFacts,
    /// What the disk is recognised by in the cache of learned geometry.
    pub(crate) key: Option<DeviceKey>,
    pub(crate) is_file: bool,
    /// For a regular file on an NVMe namespace: its filesystem, if the
    /// NVMe-command path can address files on it, or why not.
    pub(crate) fs: Option<std::result::Result<extents::Filesystem, String>>,
    /// Paths chosen for transfers with this file, by what else they depend
    /// on: chosen once, not per transfer.
    pub(crate) choices: Mutex<Vec<(ChoiceKey, Arc<PathChoice>)>>,
    /// The namespace's generic device, opened read-only (0) and read-write
    /// (1) by the first NVMe-command transfer that needs it.
    pub(crate) generic: Mutex<[Option<Arc<File>>; 2]>,
    /// The ranges claimed through this open ([`StorageFile::claim`]).
    claims: Mutex<Vec<(u64, u64)>>,
    /// Reads in a row that found all their pages cached: small reads of a
    /// file this warm ask the page cache first
    /// ([`ask_first`](super::plan::ask_first)).
    pub(crate) cached_streak: AtomicU32,
}

/// What a path choice depends on besides the file: the engine's
/// preferences, whether it has the module (for P2P queries), and the
/// memory's facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChoiceKey {
    pub(crate) pref: PathPref,
    pub(crate) submit: P2pSubmit,
    pub(crate) module: bool,
    pub(crate) mem: MemoryFacts,
}

/// An NVMe namespace, as the NVMe-command path needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmeNamespace {
    /// The generic character device, e.g. `/dev/ng0n1`.
    pub generic: PathBuf,
    /// Namespace id.
    pub nsid: u32,
    /// log2 of the logical block size.
    pub lba_shift: u32,
    /// Largest transfer of one command, in bytes.
    pub max_transfer: usize,
}

impl StorageFile {
    /// Opens `path` read-only.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, false)
    }

    /// Opens `path` for reading and writing.
    pub fn open_rw(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, true)
    }

    pub(crate) fn open_with(path: impl AsRef<Path>, write: bool) -> Result<Self> {
        Self::open_options(path, std::fs::OpenOptions::new().read(true).write(write))
    }

    /// Opens `path` as `options` say (access mode, creation, truncation,
    /// permissions of a new file), twice, as KvikIO's `FileHandle` does:
    /// once as it is, for partial blocks of writes and
    /// [`StorageFile::buffered_fd`], then with `O_DIRECT` added, for the
    /// transfers. A file opened only for writing (`O_WRONLY`) takes writes
    /// only. A directory is refused with `EISDIR`, as Python's `open`
    /// refuses it. `options` must set no custom flags: `O_DIRECT` is the
    /// one this adds.
    ///
    /// A path `volume:CHUNK[@DATA_OFFSET]:MEMBER,...` opens a striped
    /// volume over namespaces whose controllers this process takes for the
    /// queues path ([`VolumeSpec`], [`Volume::open`]), for reading and
    /// writing whatever `options` say; the controllers stay with vfio-pci
    /// when it is closed, for the next open to name them by `PCI/NSID`.
    pub fn open_options(path: impl AsRef<Path>, options: &std::fs::OpenOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(spec) = path.to_str().and_then(VolumeSpec::parse) {
            let spec = spec?;
            let module = Arc::new(crate::Module::open()?);
            return Ok(Self::volume(Arc::new(Volume::open(&spec, module)?)));
        }
        let io = |op, e: std::io::Error| Error::Io {
            op,
            path: path.clone(),
            offset: 0,
            len: 0,
            source: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
            member: None,
        };
        let buffered = options.open(&path).map_err(|e| io("open", e))?;
        let same = buffered.metadata().map_err(|e| io("stat", e))?;
        if same.is_dir() {
            return Err(Error::Io {
                op: "open",
                path: path.clone(),
                offset: 0,
                len: 0,
                source: rustix::io::Errno::ISDIR,
                member: None,
            });
        }
        let direct = options
            .clone()
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&path)
            .map_err(|e| io("open with O_DIRECT", e))?;
        let meta = direct.metadata().map_err(|e| io("stat", e))?;
        if (same.dev(), same.ino()) != (meta.dev(), meta.ino()) {
            return Err(Error::InvalidArgument(format!(
                "{} was replaced while it was being opened",
                path.display()
            )));
        }
        let size = if meta.file_type().is_block_device() {
            rustix::fs::seek(&direct, rustix::fs::SeekFrom::End(0))
                .map_err(Error::sys("find the size of a block device"))?
        } else {
            meta.len()
        };
        // The storage behind the file, from the topology the doctor reads
        // too; storage it cannot place (a file on tmpfs, say) is plain
        // storage with 4 KiB alignment.
        let t = Topology::new().resolve_opened(&path, &meta).ok();
        let lbs = logical_block_size(t.as_ref());
        let is_file = meta.file_type().is_file();
        // NVMe commands address the namespace: a block device on one
        // qualifies, and so does a regular file on one, through its extents,
        // when its filesystem says where they are.
        let ns = t
            .as_ref()
            .and_then(|t| nvme_namespace(t, lbs))
            .filter(|_| is_file || meta.file_type().is_block_device());
        let fs = (is_file && ns.is_some()).then(|| extents::Filesystem::of(direct.as_fd()));
        let disk = t.as_ref().map(|t| t.disk_facts.clone()).unwrap_or_default();
        Ok(Self {
            path,
            direct: Some(direct),
            buffered: Some(buffered),
            queues: None,
            size,
            // Filesystems and O_DIRECT on them want at least the page for
            // buffers on some configurations; 4 KiB is safe everywhere and
            // costs nothing.
            block: (lbs as usize).max(4096),
            pci: t.as_ref().and_then(|t| t.pci),
            nvme: t.as_ref().is_some_and(|t| t.is_nvme),
            ns,
            multipath: t.as_ref().map(|t| t.multipath.clone()).unwrap_or_default(),
            fabric: t.as_ref().and_then(StorageTarget::fabric_path),
            array: t.as_ref().and_then(|t| {
                let md = t.md.as_ref()?;
                let facts = ArrayFacts {
                    name: t.disk.clone(),
                    level: md.level.clone(),
                };
                Some((facts, t.io_paths()))
            }),
            layout: t
                .as_ref()
                .filter(|_| !is_file)
                .and_then(|t| ArrayLayout::of(&t.disk, t.md.as_ref()?)),
            nvme_cmd_refusal: t.as_ref().and_then(StorageTarget::nvme_cmd_refusal),
            dev_start: t.as_ref().map_or(0, StorageTarget::partition_offset),
            key: DeviceKey::of(&disk),
            disk,
            is_file,
            fs,
            choices: Mutex::new(Vec::new()),
            generic: Mutex::new([None, None]),
            claims: Mutex::new(Vec::new()),
            cached_streak: AtomicU32::new(0),
        })
    }

    /// Namespace `ns` of a controller this process drives
    /// ([`crate::queues::Controller`]): transfers with it take the queues
    /// path, with no kernel in the I/O path. Its path names the controller
    /// and the namespace.
    pub fn namespace(ns: Arc<Namespace>) -> Self {
        Self::volume(Arc::new(Volume::single(ns)))
    }

    /// A volume striped over namespaces of controllers this process drives
    /// ([`Volume::striped`]): transfers with it take the queues path, each
    /// member's part on its own controller at once. Its path is the
    /// volume's name; its controller the first member's.
    pub fn volume(v: Arc<Volume>) -> Self {
        Self {
            path: PathBuf::from(v.name()),
            direct: None,
            buffered: None,
            size: v.size(),
            block: v.block_size() as usize,
            pci: v.members().first().map(|m| m.controller().pci()),
            nvme: true,
            ns: None,
            multipath: Vec::new(),
            fabric: None,
            array: None,
            layout: None,
            nvme_cmd_refusal: None,
            dev_start: 0,
            disk: DiskFacts::default(),
            key: None,
            is_file: false,
            fs: None,
            choices: Mutex::new(Vec::new()),
            generic: Mutex::new([None, None]),
            claims: Mutex::new(Vec::new()),
            cached_streak: AtomicU32::new(0),
            queues: Some(v),
        }
    }

    /// The namespace, when this is one of a controller this process drives.
    pub fn queues_namespace(&self) -> Option<&Arc<Namespace>> {
        match self.queues.as_deref()?.members() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// The namespace or the striped volume this process drives, when this
    /// is one: what the queues path moves data with.
    pub fn queues_volume(&self) -> Option<&Arc<Volume>> {
        self.queues.as_ref()
    }

    /// Makes every write that returned durable: `fdatasync` on a kernel
    /// file or block device (the block layer flushes the device's write
    /// cache), the NVMe Flush command on a namespace this process drives.
    pub fn sync(&self) -> Result<()> {
        if let Some(v) = &self.queues {
            return v.flush();
        }
        rustix::fs::fdatasync(self.fd()?).map_err(Error::sys("fdatasync"))
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes when it was opened; see [`StorageFile::current_size`].
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Size in bytes now: a regular file may have grown or shrunk since it
    /// was opened (another handle or process wrote or truncated it).
    pub fn current_size(&self) -> Result<u64> {
        if !self.is_file {
            return Ok(self.size);
        }
        rustix::fs::fstat(self.fd()?)
            .map(|st| st.st_size as u64)
            .map_err(|e| self.io_error("fstat", 0, 0, e))
    }

    /// Alignment `O_DIRECT` needs for offsets, lengths and buffers.
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// PCI address of the storage controller, when it has one.
    pub fn controller(&self) -> Option<crate::PciAddress> {
        self.pci
    }

    /// Whether the storage is an NVMe namespace.
    pub fn is_nvme(&self) -> bool {
        self.nvme
    }

    /// For a native-multipath namespace head (or a partition or file on
    /// one): its paths, each with its controller; I/O may take any of them.
    /// Empty for other storage.
    pub fn multipath(&self) -> &[NvmePath] {
        &self.multipath
    }

    /// The NVMe namespace NVMe commands can address for this storage: the
    /// namespace itself, a partition of it, or a regular file on either
    /// (whose blocks the NVMe-command path finds with `FIEMAP`; see
    /// [`crate::transfer::Engine::choose`] for which filesystems qualify).
    pub fn nvme_namespace(&self) -> Option<&NvmeNamespace> {
        self.ns.as_ref()
    }

    /// Whether this is a regular file (rather than a block device).
    pub fn is_file(&self) -> bool {
        self.is_file
    }

    /// The disk's identity and request queue (empty for storage that is not
    /// on a block device, a file on tmpfs say).
    pub fn disk_facts(&self) -> &DiskFacts {
        &self.disk
    }

    /// Byte offset on its disk (for NVMe, the namespace) of the block device
    /// that is or holds the storage: a partition's start, 0 for a whole
    /// disk.
    pub fn partition_offset(&self) -> u64 {
        self.dev_start
    }

    /// The kernel's file, which a namespace this process drives has not.
    pub fn fd(&self) -> Result<std::os::fd::BorrowedFd<'_>> {
        self.direct
            .as_ref()
            .map(|f| f.as_fd())
            .ok_or_else(|| self.no_kernel_file())
    }

    /// Claims bytes `[offset, offset + len)` of the file for this opener
    /// alone: a write lock on them on each of its kernel files (the
    /// `O_DIRECT` one on the range itself, the other on the same range past
    /// [`CLAIM_SHADOW`], so that the two do not conflict), without waiting.
    /// `EAGAIN` while another open of the file holds a claim over them:
    /// another process, or one that died and whose I/O is still in flight
    /// (its requests keep the file, and the lock with it, until they
    /// complete); `EBUSY` for a range this open has claimed already. A
    /// namespace this process drives takes claims only against itself: the
    /// controller is this process's alone.
    pub fn claim(&self, offset: u64, len: u64) -> Result<()> {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        let end = offset.saturating_add(len);
        if claims.iter().any(|&(s, e)| s < end && offset < e) {
            return Err(Error::Io {
                op: "claiming (this open of the file has claimed the range already)",
                path: self.path.clone(),
                offset,
                len,
                source: rustix::io::Errno::BUSY,
                member: None,
            });
        }
        self.lock_range(offset, len, true)?;
        claims.push((offset, end));
        Ok(())
    }

    /// Gives back the claim [`StorageFile::claim`] took on `[offset,
    /// offset + len)`.
    pub fn unclaim(&self, offset: u64, len: u64) -> Result<()> {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        self.lock_range(offset, len, false)?;
        let range = (offset, offset.saturating_add(len));
        if let Some(i) = claims.iter().position(|&r| r == range) {
            claims.swap_remove(i);
        }
        Ok(())
    }

    fn lock_range(&self, offset: u64, len: u64, claim: bool) -> Result<()> {
        let err = |source| Error::Io {
            op: if claim { "claiming" } else { "giving back" },
            path: self.path.clone(),
            offset,
            len,
            source,
            member: None,
        };
        let shadow = offset
            .checked_add(CLAIM_SHADOW)
            .ok_or_else(|| err(rustix::io::Errno::INVAL))?;
        if let Some(f) = &self.direct {
            crate::sys::file::ofd_lock(f.as_fd(), offset, len, claim).map_err(err)?;
        }
        if let Some(f) = &self.buffered {
            if let Err(e) = crate::sys::file::ofd_lock(f.as_fd(), shadow, len, claim) {
                if claim {
                    if let Some(d) = &self.direct {
                        let _ = crate::sys::file::ofd_lock(d.as_fd(), offset, len, false);
                    }
                }
                return Err(err(e));
            }
        }
        Ok(())
    }

    /// The kernel's file opened without `O_DIRECT` (as KvikIO's
    /// `FileHandle::fd` is): ordinary `pread`/`pwrite` at any offset and
    /// length work on it.
    pub fn buffered_fd(&self) -> Result<std::os::fd::BorrowedFd<'_>> {
        self.buffered
            .as_ref()
            .map(|f| f.as_fd())
            .ok_or_else(|| self.no_kernel_file())
    }

    pub(crate) fn no_kernel_file(&self) -> Error {
        Error::PathUnavailable {
            path: "kernel I/O",
            reason: format!(
                "{} is driven by this process (queues path): no kernel driver reaches it until the controller is given back",
                self.path.display()
            ),
        }
    }

    /// The namespace's generic device (`/dev/ngXnY`), opened for writing too
    /// when `write`; opened once and kept.
    pub(crate) fn generic_device(&self, ns: &NvmeNamespace, write: bool) -> Result<Arc<File>> {
        let mut g = self.generic.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = &g[usize::from(write)] {
            return Ok(f.clone());
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(&ns.generic)
            .map_err(|e| Error::Io {
                op: "open the NVMe generic device",
                path: ns.generic.clone(),
                offset: 0,
                len: 0,
                source: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
                member: None,
            })?;
        let f = Arc::new(f);
        g[usize::from(write)] = Some(f.clone());
        Ok(f)
    }

    /// What the path rule needs of the storage (see [`StorageFacts`]); a
    /// namespace this process drives is the caller's to add.
    /// Which of the engine's worker pools its background transfers run
    /// on: one per device (the whole disk, for a partition or a file on
    /// it; the array, for an md array; the namespace, for one this process
    /// drives), so that a busy device holds up only its own transfers.
    pub fn lane(&self) -> u64 {
        if let Some(d) = self.disk.dev {
            return (u64::from(d.major) << 32) | u64::from(d.minor);
        }
        if let Some(ns) = self.queues.as_ref().and_then(|v| v.members().first()) {
            // No device number: the (first member's) controller's address
            // and the namespace, above every device number's range.
            let pci = ns.controller().pci();
            return (1 << 63)
                | (u64::from(pci.domain) << 40)
                | (u64::from(pci.bus) << 32)
                | (u64::from(pci.device) << 24)
                | (u64::from(pci.function) << 16)
                | u64::from(ns.info().nsid & 0xffff);
        }
        0
    }

    pub(crate) fn facts(&self) -> StorageFacts {
        let other_filesystem = match (self.is_file, &self.ns) {
            // Why a file's filesystem would not do either (btrfs files are
            // on no block device of their own, for one).
            (true, None) => self
                .fd()
                .ok()
                .and_then(|fd| extents::Filesystem::of(fd).err()),
            _ => None,
        };
        StorageFacts {
            path: self.path.clone(),
            driven: None,
            is_file: self.is_file,
            nvme: self.nvme,
            namespace: self.ns.as_ref().map(|ns| NamespaceFacts {
                generic: ns.generic.clone(),
                nsid: ns.nsid,
            }),
            nvme_cmd_refusal: self.nvme_cmd_refusal.as_ref().map(|r| r.to_string()),
            dev_start: self.dev_start,
            filesystem: self
                .fs
                .as_ref()
                .map(|r| r.as_ref().map(|fs| fs.to_string()).map_err(Clone::clone)),
            other_filesystem,
            array: self.array.as_ref().map(|(a, _)| a.clone()),
            fabric: self.fabric.clone(),
        }
    }

    pub(crate) fn cached_choice(&self, key: &ChoiceKey) -> Option<Arc<PathChoice>> {
        let c = self.choices.lock().unwrap_or_else(|p| p.into_inner());
        c.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    pub(crate) fn cache_choice(&self, key: ChoiceKey, choice: Arc<PathChoice>) {
        let mut c = self.choices.lock().unwrap_or_else(|p| p.into_inner());
        if !c.iter().any(|(k, _)| *k == key) {
            c.push((key, choice));
        }
    }

    /// Forgets the paths chosen: a fast path failed, so the next transfer
    /// asks again (the module may have been unbound, say).
    pub(crate) fn forget_choices(&self) {
        self.choices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Writes all of `buf` at `offset` through the page cache, as many
    /// `pwrite` calls as it takes.
    pub(crate) fn pwrite_all(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let buffered = self
                .buffered
                .as_ref()
                .ok_or_else(|| self.no_kernel_file())?;
            match rustix::io::pwrite(buffered, &buf[done..], at) {
                Ok(0) => {
                    return Err(Error::Short {
                        what: "write to storage (partial block)",
                        expected: buf.len() as u64,
                        done: done as u64,
                    })
                }
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(self.io_error(
                        "write (partial block)",
                        at,
                        (buf.len() - done) as u64,
                        e,
                    ))
                }
            }
        }
        Ok(())
    }

    pub(crate) fn io_error(
        &self,
        op: &'static str,
        offset: u64,
        len: u64,
        e: rustix::io::Errno,
    ) -> Error {
        Error::Io {
            op,
            path: self.path.clone(),
            offset,
            len,
            source: e,
            member: self
                .layout
                .as_ref()
                .map(|l| l.blame(offset, len, op.contains("read")))
                .or_else(|| self.paths_down()),
        }
    }

    /// Whether some path to the data crosses a network (a fabrics
    /// namespace, a path of a multipath head, a member of an array), for
    /// how AUTO calibrates the device.
    pub(crate) fn reach(&self) -> Reach {
        let members = self.array.iter().flat_map(|(_, paths)| paths);
        let network = self
            .fabric
            .iter()
            .chain(&self.multipath)
            .chain(members)
            .any(|p| p.transport.as_ref().is_some_and(|t| t.is_network()));
        if network {
            Reach::Network
        } else {
            Reach::Local
        }
    }

    /// For a multipath or fabrics namespace whose every path's controller
    /// is down now: which, and in what state.
    fn paths_down(&self) -> Option<String> {
        let paths: Vec<NvmePath> = if self.multipath.is_empty() {
            self.fabric.iter().cloned().collect()
        } else {
            self.multipath.clone()
        };
        let topo = Topology::default();
        paths_down(&paths, |c| topo.controller_state(c))
    }
}

/// The logical block size of the storage `t` resolves to (512 where it is
/// unknown or not a power of two).
fn logical_block_size(t: Option<&StorageTarget>) -> u32 {
    t.map(|t| t.logical_block_size)
        .filter(|b| b.is_power_of_two())
        .unwrap_or(512)
        .max(512)
}

/// The namespace the NVMe-command path addresses for `t`, with `lbs`-byte
/// logical blocks.
fn nvme_namespace(t: &StorageTarget, lbs: u32) -> Option<NvmeNamespace> {
    if !t.is_nvme {
        return None;
    }
    Some(NvmeNamespace {
        generic: t.generic_path.clone().or_else(|| {
            let n = t.disk.strip_prefix("nvme")?;
            Some(PathBuf::from(format!("/dev/ng{n}")))
        })?,
        nsid: t.nsid?,
        lba_shift: lbs.trailing_zeros(),
        max_transfer: usize::try_from(t.max_transfer_bytes)
            .unwrap_or(usize::MAX)
            .max(4096),
    })
}
