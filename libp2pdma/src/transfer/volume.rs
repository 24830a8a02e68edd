//! A volume striped over namespaces of controllers this process drives (the
//! queues path), which md cannot stack on, having no block device for them.
//!
//! A [`Volume`] lays its bytes over its members as md's raid0 does with
//! equal members: chunk `i` on member `i % n`, at row `i / n` of that
//! member's data, which starts at the volume's data offset. A transfer is
//! split into each member's runs; each member's runs go to its own
//! controller's queues, its memory mapped for the controller once for all
//! its runs, and the caller's thread drives every member at once: it keeps
//! each member's queue filled and takes every controller's completions as
//! they come, with no thread per member and nothing handed between threads
//! (only the unaligned ends, through staging, take a thread per member).
//! The caller gets one result, after
//! every member's commands have ended: every byte moved, or the error of
//! the first member (in volume order) that failed, naming it, with the
//! volume offset of its run.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    thread,
};

use super::array::{stripe_runs, Run};
use crate::{
    discovery::{StorageTarget, Topology},
    memory::{DeviceMemory, MemRange},
    queues::{run_together, Controller, InitOptions, IoCommand, Issued, Namespace, Plan},
    Error, Module, PciAddress, Result,
};

/// Keeps in `first` whichever of it and `e` starts first in the volume.
fn keep_first(first: &mut Option<MemberError>, e: MemberError) {
    if first.as_ref().is_none_or(|f| e.from < f.from) {
        *first = Some(e);
    }
}

/// Most members of one volume.
pub const MAX_MEMBERS: usize = 64;

/// A volume striped over namespaces this process drives.
pub struct Volume {
    name: String,
    /// Bytes of each chunk, a power of two; the whole member for a volume
    /// of one.
    chunk: u64,
    /// Where the volume's data starts on each member, in bytes.
    data_offset: u64,
    members: Vec<Arc<Namespace>>,
    size: u64,
    block: u32,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume")
            .field("name", &self.name)
            .field("chunk", &self.chunk)
            .field("data_offset", &self.data_offset)
            .field("members", &self.members)
            .finish()
    }
}

/// What one member failed with, for the error that names it.
struct MemberError {
    slot: usize,
    /// The volume offset and length of the first of the member's runs.
    from: u64,
    len: u64,
    error: Error,
}

impl Volume {
    /// One namespace, as it is: the queues path's storage of one member.
    pub fn single(ns: Arc<Namespace>) -> Self {
        Self {
            name: ns.name(),
            chunk: 0,
            data_offset: 0,
            size: ns.size(),
            block: ns.info().block_size,
            members: vec![ns],
        }
    }

    /// A volume striped over `members` in this order, `chunk` bytes per
    /// member in turn, from byte `data_offset` of each (which stays the
    /// caller's: a label, say). `chunk` is a power of two of at least 4 KiB
    /// and of the largest block size; `data_offset` a multiple of 4 KiB and
    /// of every block size. Its size is `n` times the smallest member's
    /// whole chunks after the data offset. Refused: no members, more than
    /// [`MAX_MEMBERS`], a namespace twice.
    pub fn striped(members: Vec<Arc<Namespace>>, chunk: u64, data_offset: u64) -> Result<Self> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("striped volume: {why}")));
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return bad(format!(
                "{} members (1 to {MAX_MEMBERS} are allowed)",
                members.len()
            ));
        }
        for (i, a) in members.iter().enumerate() {
            if let Some(b) = members[..i].iter().find(|b| b.name() == a.name()) {
                return bad(format!("{} is given twice", b.name()));
            }
        }
        let block = members
            .iter()
            .map(|m| m.info().block_size)
            .max()
            .unwrap_or(512);
        if !chunk.is_power_of_two() || chunk < 4096 || chunk < u64::from(block) {
            return bad(format!(
                "a chunk of {chunk} bytes (a power of two of at least 4096 and of the members' {block}-byte blocks)"
            ));
        }
        if !data_offset.is_multiple_of(4096) || !data_offset.is_multiple_of(u64::from(block)) {
            return bad(format!(
                "a data offset of {data_offset} bytes (a multiple of 4096 and of the members' {block}-byte blocks)"
            ));
        }
        let smallest = members.iter().map(|m| m.size()).min().unwrap_or(0);
        let rows = smallest.saturating_sub(data_offset) / chunk;
        if rows == 0 {
            return bad(format!(
                "the smallest member has {smallest} bytes, not one chunk after the data offset {data_offset}"
            ));
        }
        let names: Vec<String> = members.iter().map(|m| m.name()).collect();
        Ok(Self {
            name: format!(
                "striped volume ({} KiB chunks) over {}",
                chunk >> 10,
                names.join(", ")
            ),
            chunk,
            data_offset,
            size: rows * chunk * members.len() as u64,
            block,
            members,
        })
    }

    /// How errors and reasons name it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The members, in stripe order.
    pub fn members(&self) -> &[Arc<Namespace>] {
        &self.members
    }

    /// Bytes of each chunk; `None` for a volume of one namespace.
    pub fn chunk(&self) -> Option<u64> {
        (self.members.len() > 1).then_some(self.chunk)
    }

    /// Where the volume's data starts on each member.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The largest of the members' block sizes.
    pub fn block_size(&self) -> u32 {
        self.block
    }

    /// Where the `len` bytes at `offset` lie: each run's volume offset,
    /// member and byte offset on the member (its data offset included), in
    /// order of volume offset.
    pub fn layout(&self, offset: u64, len: u64) -> Vec<(u64, usize, u64, u64)> {
        self.runs(offset, len)
            .map(|r| (r.from, r.slot, r.at, r.len))
            .collect()
    }

    fn runs(&self, offset: u64, len: u64) -> Box<dyn Iterator<Item = Run>> {
        if self.members.len() == 1 {
            return Box::new(
                (len > 0)
                    .then_some(Run {
                        from: offset,
                        slot: 0,
                        at: offset,
                        len,
                    })
                    .into_iter(),
            );
        }
        let data = self.data_offset;
        Box::new(
            stripe_runs(offset, len, self.chunk, 1, self.members.len() as u64).map(move |r| Run {
                at: r.at + data,
                ..r
            }),
        )
    }

    /// Refuses `len` bytes at `offset` outside the volume.
    pub(crate) fn check(&self, offset: u64, len: usize) -> Result<()> {
        crate::error::check_within(&self.name, offset, len as u64, self.size)
    }

    /// Reads the bytes at `offset` of the volume into `range`.
    pub fn read(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        self.check(offset, range.len())?;
        self.transfer(false, offset, range, None).map(|_| ())
    }

    /// Writes the bytes of `range` to `offset` of the volume; durable once
    /// [`Volume::flush`] returns.
    pub fn write(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        self.check(offset, range.len())?;
        self.transfer(true, offset, range, None).map(|_| ())
    }

    /// [`read`](Volume::read), each command recorded in `issued` as it is
    /// submitted.
    pub fn read_issuing(&self, offset: u64, range: MemRange<'_>, issued: &Issued) -> Result<()> {
        self.check(offset, range.len())?;
        self.transfer(false, offset, range, Some(issued))
            .map(|_| ())
    }

    /// FLUSH on every member, all at once; the first member's error.
    pub fn flush(&self) -> Result<()> {
        let work: Vec<usize> = (0..self.members.len()).collect();
        self.each(&work, |slot| {
            self.members[slot]
                .flush()
                .map(|()| 0)
                .map_err(|error| MemberError {
                    slot,
                    from: 0,
                    len: 0,
                    error,
                })
        })
        .map(|_| ())
        .map_err(|e| self.member_error(true, e))
    }

    /// Registers `mem` with every member ([`Namespace::register`]).
    pub fn register(&self, mem: Arc<dyn DeviceMemory>) -> Result<()> {
        for m in &self.members {
            m.register(mem.clone())?;
        }
        Ok(())
    }

    /// Ends `mem`'s registration with every member; whether any had it.
    pub fn unregister(&self, mem: &dyn DeviceMemory) -> bool {
        self.members
            .iter()
            .fold(false, |any, m| m.unregister(mem) | any)
    }

    /// Moves the bytes of `range` (checked by the caller): each member's
    /// runs on its own controller, all members at once. The commands it
    /// took.
    pub(crate) fn transfer(
        &self,
        write: bool,
        offset: u64,
        range: MemRange<'_>,
        issued: Option<&Issued>,
    ) -> Result<u64> {
        if self.members.len() == 1 {
            return self.members[0]
                .transfer(write, offset, range, issued)
                .map_err(|error| {
                    self.member_error(
                        write,
                        MemberError {
                            slot: 0,
                            from: offset,
                            len: range.len() as u64,
                            error,
                        },
                    )
                });
        }
        let mut per: Vec<Vec<(u64, usize, usize)>> = vec![Vec::new(); self.members.len()];
        for r in self.runs(offset, range.len() as u64) {
            per[r.slot].push((r.at, (r.from - offset) as usize, r.len as usize));
        }
        // A member's error, with its first run in volume offsets.
        let failed = |slot: usize, error: Error| {
            let (from, len) = per[slot]
                .first()
                .map_or((offset, 0), |&(_, off, n)| (offset + off as u64, n as u64));
            MemberError {
                slot,
                from,
                len,
                error,
            }
        };
        let work: Vec<usize> = (0..per.len()).filter(|&s| !per[s].is_empty()).collect();
        // Every member's memory mapped for its controller before any
        // command: a member that cannot map it fails the transfer with
        // nothing in flight.
        let mut plans: Vec<Option<Plan<'_>>> = (0..per.len()).map(|_| None).collect();
        for &slot in &work {
            let plan = self.members[slot]
                .prepare(write, range, &per[slot])
                .map_err(|e| self.member_error(write, failed(slot, e)))?;
            plans[slot] = Some(plan);
        }
        let mut cmds = Vec::with_capacity(work.len());
        for &slot in &work {
            cmds.push(match &plans[slot] {
                Some(p) => p
                    .commands(write)
                    .map_err(|e| self.member_error(write, failed(slot, e)))?,
                None => Vec::new(),
            });
        }
        // Every member's commands driven from this thread at once.
        let jobs: Vec<(&Namespace, &[IoCommand<'_>])> = work
            .iter()
            .zip(&cmds)
            .map(|(&slot, c)| (&*self.members[slot], c.as_slice()))
            .collect();
        let mut first: Option<MemberError> = None;
        for (&slot, r) in work.iter().zip(run_together(&jobs, issued)) {
            if let Err(e) = r {
                keep_first(&mut first, failed(slot, e));
            }
        }
        if let Some(e) = first {
            return Err(self.member_error(write, e));
        }
        // The rest (the transfer's unaligned ends; everything, in memory a
        // member could not map), each member's on a thread of its own.
        let rest: Vec<usize> = work
            .iter()
            .copied()
            .filter(|&s| plans[s].as_ref().is_some_and(Plan::has_rest))
            .collect();
        let staged = self
            .each(&rest, |slot| {
                plans[slot]
                    .as_ref()
                    .map_or(Ok(0), |p| p.rest(write, range, issued))
                    .map_err(|e| failed(slot, e))
            })
            .map_err(|e| self.member_error(write, e))?;
        Ok(cmds.iter().map(|c| c.len() as u64).sum::<u64>() + staged)
    }

    /// Runs `f` for every slot in `work`, each on a thread of its own but
    /// the first, which runs on the caller's; once all have returned, the
    /// sum of what they returned, or the error of the first slot (in
    /// `work`'s order) that failed.
    fn each<F>(&self, work: &[usize], f: F) -> std::result::Result<u64, MemberError>
    where
        F: Fn(usize) -> std::result::Result<u64, MemberError> + Sync,
    {
        let Some((&head, tail)) = work.split_first() else {
            return Ok(0);
        };
        let results: Vec<std::result::Result<u64, MemberError>> = thread::scope(|s| {
            let f = &f;
            let spawned: Vec<_> = tail
                .iter()
                .map(|&slot| {
                    (
                        slot,
                        thread::Builder::new()
                            .name("p2pdma-volume".into())
                            .spawn_scoped(s, move || f(slot)),
                    )
                })
                .collect();
            let mut out = vec![f(head)];
            for (slot, h) in spawned {
                out.push(match h {
                    // No thread: this member's runs on the caller's.
                    Err(_) => f(slot),
                    Ok(h) => h.join().unwrap_or_else(|p| {
                        Err(MemberError {
                            slot,
                            from: 0,
                            len: 0,
                            error: Error::Panicked(
                                crate::error::panic_message(p.as_ref())
                                    .unwrap_or_else(|| "a volume member's thread panicked".into()),
                            ),
                        })
                    }),
                });
            }
            out
        });
        let mut sum = 0;
        let mut failed: Option<MemberError> = None;
        for r in results {
            match r {
                Ok(n) => sum += n,
                Err(e) => keep_first(&mut failed, e),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(sum),
        }
    }

    /// A member's error as the volume's: an I/O error on the volume that
    /// names the member, its run and what it said; errors of the caller's
    /// own making (arguments, paths) as they are.
    fn member_error(&self, write: bool, e: MemberError) -> Error {
        let member = &self.members[e.slot];
        match e.error {
            err @ (Error::InvalidArgument(_)
            | Error::PathUnavailable { .. }
            | Error::OutOfBounds { .. }
            | Error::Panicked(_)) => err,
            err if self.members.len() == 1 => err,
            err => Error::Io {
                op: if write { "write" } else { "read" },
                path: self.name.clone().into(),
                offset: e.from,
                len: e.len,
                source: err.errno().unwrap_or(rustix::io::Errno::IO),
                member: Some(format!(
                    "member {} (slot {}) of the striped volume: {err}",
                    member.name(),
                    e.slot
                )),
            },
        }
    }
}

/// A volume named by a path: `volume:CHUNK[@DATA_OFFSET]:MEMBER,MEMBER,...`,
/// sizes in bytes or with K, M or G; each member a namespace's block
/// device (`/dev/nvme3n1`: its controller is taken from the nvme driver,
/// which must not be in use) or `PCI/NSID` (`0000:0c:00.0/1`: a controller
/// already with vfio-pci, taken by an earlier process).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    /// Bytes of each chunk.
    pub chunk: u64,
    /// Where the volume's data starts on each member.
    pub data_offset: u64,
    /// The members, in stripe order.
    pub members: Vec<VolumeMember>,
}

/// A member of a [`VolumeSpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeMember {
    /// A namespace's block device, whose controller the nvme driver has.
    Device(PathBuf),
    /// A controller already with vfio-pci, and the namespace id.
    Driven(PciAddress, u32),
}

/// What starts a path that names a volume.
pub const VOLUME_PREFIX: &str = "volume:";

fn size_of(s: &str) -> Option<u64> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

impl VolumeSpec {
    /// Parses `volume:CHUNK[@DATA_OFFSET]:MEMBER,...`; `None` for a path
    /// that does not start with `volume:`.
    pub fn parse(path: &str) -> Option<Result<Self>> {
        let rest = path.strip_prefix(VOLUME_PREFIX)?;
        let bad = |why: String| {
            Err(Error::InvalidArgument(format!(
                "{path}: {why} (volume:CHUNK[@DATA_OFFSET]:MEMBER,..., each member /dev/nvmeXnY or PCI/NSID)"
            )))
        };
        let Some((sizes, members)) = rest.split_once(':') else {
            return Some(bad("no members".into()));
        };
        let (chunk, data) = sizes.split_once('@').unwrap_or((sizes, "0"));
        let (Some(chunk), Some(data_offset)) = (size_of(chunk), size_of(data)) else {
            return Some(bad(format!("sizes '{sizes}'")));
        };
        let mut out = Vec::new();
        for m in members.split(',') {
            if m.starts_with('/') {
                out.push(VolumeMember::Device(PathBuf::from(m)));
                continue;
            }
            let parsed = m.rsplit_once('/').and_then(|(pci, nsid)| {
                Some(VolumeMember::Driven(pci.parse().ok()?, nsid.parse().ok()?))
            });
            match parsed {
                Some(x) => out.push(x),
                None => return Some(bad(format!("member '{m}'"))),
            }
        }
        Some(Ok(Self {
            chunk,
            data_offset,
            members: out,
        }))
    }
}

impl VolumeMember {
    /// The member's controller and namespace id: for a block device, as
    /// sysfs says while the nvme driver has it.
    pub fn locate(&self) -> Result<(PciAddress, u32)> {
        match self {
            VolumeMember::Device(dev) => device_member(dev),
            VolumeMember::Driven(pci, nsid) => Ok((*pci, *nsid)),
        }
    }
}

/// The controller and namespace of member `dev`, a namespace's block
/// device, as discovery resolves it.
fn device_member(dev: &Path) -> Result<(PciAddress, u32)> {
    let t = Topology::default()
        .resolve(dev)
        .map_err(|e| Error::InvalidArgument(format!("{}: {e}", dev.display())))?;
    member_of(&t).map_err(|why| Error::InvalidArgument(format!("{}: {why}", dev.display())))
}

/// What a volume's member must be: a whole namespace of a PCIe controller
/// of this machine, which this process can take and drive.
fn member_of(t: &StorageTarget) -> std::result::Result<(PciAddress, u32), String> {
    if let Some(p) = t.fabric_path() {
        return Err(format!(
            "{p} is a remote namespace: a volume's members are this machine's PCIe controllers, which the process drives through VFIO (an md array takes remote namespaces as members)"
        ));
    }
    if t.md.is_some() || !t.is_nvme {
        return Err(format!("{} is not an NVMe namespace", t.disk));
    }
    if let Some(p) = &t.partition {
        return Err(format!(
            "{} is a partition of {}: a member is a whole namespace",
            p.name, t.disk
        ));
    }
    if t.is_multipath() {
        return Err(format!(
            "{} is a multipath namespace ({} paths): give the namespace of one controller",
            t.disk,
            t.multipath.len()
        ));
    }
    let nsid = t
        .nsid
        .ok_or_else(|| format!("{} has no namespace id in sysfs", t.disk))?;
    let pci = t
        .pci
        .ok_or_else(|| format!("{} has no PCI function in sysfs", t.disk))?;
    Ok((pci, nsid))
}

impl Volume {
    /// The volume `spec` names, its controllers taken for this process
    /// (from the nvme driver for members given by block device).
    pub fn open(spec: &VolumeSpec, module: Arc<Module>) -> Result<Self> {
        let mut members = Vec::new();
        for m in &spec.members {
            let (pci, nsid) = m.locate()?;
            let unbind = matches!(m, VolumeMember::Device(_));
            let opts = InitOptions {
                unbind,
                ..InitOptions::default()
            };
            let ctrl = Controller::initialize(module.clone(), pci, &opts)?;
            members.push(Arc::new(Namespace::new(ctrl, module.clone(), nsid)?));
        }
        Self::striped(members, spec.chunk, spec.data_offset)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Where byte `x` of a striped volume lies, byte by byte: the member
    /// and the byte on it.
    fn place(x: u64, chunk: u64, n: u64, data: u64) -> (usize, u64) {
        let index = x / chunk;
        ((index % n) as usize, data + (index / n) * chunk + x % chunk)
    }

    #[test]
    fn a_member_is_a_whole_local_namespace_and_a_remote_one_is_refused_with_why() {
        use crate::discovery::{fake::*, DevNum, TargetKind};
        let f = FakeSys::machine();
        let topo = f.topology();
        let dev = |minor| DevNum { major: 259, minor };
        let ns = topo
            .resolve_block(Path::new("/dev/nvme0n1"), dev(0), TargetKind::BlockDevice)
            .unwrap();
        let (pci, nsid) = member_of(&ns).unwrap();
        assert_eq!(
            (pci.to_string().as_str(), nsid),
            ("0000:03:00.0", ns.nsid.unwrap())
        );
        let part = topo
            .resolve_block(Path::new("/dev/nvme0n1p1"), dev(1), TargetKind::BlockDevice)
            .unwrap();
        assert_eq!(
            member_of(&part).unwrap_err(),
            "nvme0n1p1 is a partition of nvme0n1: a member is a whole namespace"
        );
        let ctl = "devices/virtual/nvme-fabrics/ctl/nvme4";
        f.file(&format!("{ctl}/transport"), "tcp\n");
        f.file(&format!("{ctl}/address"), "traddr=10.0.2.2,trsvcid=4420\n");
        f.link("class/nvme/nvme4", ctl);
        f.disk(
            &format!("{ctl}/nvme4n1"),
            "nvme4n1",
            "259:40",
            512,
            128,
            Some(1),
        );
        let remote = topo
            .resolve_block(Path::new("/dev/nvme4n1"), dev(40), TargetKind::BlockDevice)
            .unwrap();
        assert!(
            member_of(&remote).unwrap_err().starts_with(
                "nvme4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420) is a remote namespace"
            ),
            "{:?}",
            member_of(&remote)
        );
    }

    #[test]
    fn a_volume_path_parses() {
        let s = VolumeSpec::parse("volume:128K@64M:/dev/nvme3n1,0000:0c:00.0/2")
            .unwrap()
            .unwrap();
        assert_eq!((s.chunk, s.data_offset), (128 << 10, 64 << 20));
        assert_eq!(
            s.members,
            vec![
                VolumeMember::Device("/dev/nvme3n1".into()),
                VolumeMember::Driven("0000:0c:00.0".parse().unwrap(), 2)
            ]
        );
        assert_eq!(
            VolumeSpec::parse("volume:4096:/dev/nvme0n1")
                .unwrap()
                .unwrap()
                .data_offset,
            0
        );
        assert!(VolumeSpec::parse("/dev/nvme0n1").is_none());
        for bad in [
            "volume:",
            "volume:128K",
            "volume:12Q:/dev/nvme0n1",
            "volume:4096:nvme0n1",
            "volume:4096:0000:0c:00.0/x",
            "volume:99999999999999999999G:/dev/x",
        ] {
            let e = VolumeSpec::parse(bad).unwrap().unwrap_err().to_string();
            assert!(e.contains("volume:CHUNK[@DATA_OFFSET]"), "{bad}: {e}");
        }
    }

    proptest! {
        /// Every byte of a range lies where the byte-by-byte model puts
        /// it, once, with runs in order and none crossing a chunk.
        #[test]
        fn runs_put_every_byte_where_the_model_does(
            n in 1u64..9,
            chunk_log in 12u32..18,
            data_chunks in 0u64..4,
            offset in 0u64..(1 << 22),
            len in 0u64..(1 << 20),
        ) {
            let chunk = 1u64 << chunk_log;
            let data = data_chunks * 4096;
            let mut next = offset;
            for r in stripe_runs(offset, len, chunk, 1, n) {
                prop_assert_eq!(r.from, next);
                prop_assert!(r.len > 0 && r.len <= chunk);
                prop_assert_eq!(r.from / chunk, (r.from + r.len - 1) / chunk);
                for x in [r.from, r.from + r.len / 2, r.from + r.len - 1] {
                    let (slot, at) = place(x, chunk, n, data);
                    prop_assert_eq!(slot, r.slot);
                    prop_assert_eq!(at, data + r.at + (x - r.from));
                }
                next += r.len;
            }
            prop_assert_eq!(next, offset + len);
        }
    }
}
