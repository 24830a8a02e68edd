//! Routes: a transfer between any two places (storage, host memory, the
//! memory of one accelerator or another) as a chain of hops, planned from
//! what the kernel allows and run as one pipeline.
//!
//! A hop is one mover's work: a storage read or write (on the path the
//! engine picks for that storage and memory: P2P, NVMe commands, or
//! `O_DIRECT` into host memory), or a CPU copy between memories. Between
//! hops the chunks wait in staging rings: pinned host memory the route
//! allocates, or a region of an accelerator's memory the caller lends.
//! An engine's [`Routes`] view ([`Engine::routes`](crate::transfer::Engine::routes)) holds the calls:
//! [`Routes::plan`] picks the hops (storage straight into an accelerator by
//! P2P where the kernel allows it, through host memory otherwise; one
//! accelerator to another through host memory) and says why;
//! [`Routes::plan_through`] takes the places in between from the caller.
//! [`Routes::copy`] runs a route: every hop is a stage of the pipeline
//! executor ([`pipeline`]), all hops busy at once on different chunks.

use std::{fmt, time::Duration};

use super::{
    core::{Core, Job},
    exec::{
        pipeline::{self, Chunk, Driver, Lanes, Stage},
        rings::RingPool,
    },
    plan::{PathChoice, TransferPath},
    storage::StorageFile,
    xfer::Direction,
};
use crate::{
    memory::{self, DeviceMemory, HostMemory, MemRange, MemoryKind},
    Error, Peer, Result,
};

/// Chunk boundaries fall on multiples of this in storage offsets (so that
/// no two chunks share a storage block), and a staged chunk sits at its
/// storage offset's place within it (so that direct I/O stays aligned).
const ALIGN: usize = 4096;

/// One end of a route.
#[derive(Clone, Copy)]
pub enum End<'a> {
    /// A file or block device, from byte `offset` on.
    Storage {
        /// The storage.
        file: &'a StorageFile,
        /// Where the route's bytes start.
        offset: u64,
    },
    /// Memory: an accelerator's, or the host-memory device, from byte
    /// `offset` on.
    Memory {
        /// The memory.
        mem: &'a dyn DeviceMemory,
        /// Where the route's bytes start.
        offset: usize,
    },
}

impl fmt::Debug for End<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Storage { file, offset } => write!(f, "{} at {offset}", file.path().display()),
            End::Memory { mem, offset } => write!(f, "{} at {offset}", mem.kind()),
        }
    }
}

/// A place a route stages chunks in between its ends.
#[derive(Clone, Copy)]
pub enum Via<'a> {
    /// Pinned host memory, allocated for each copy.
    Host,
    /// A range of memory: staging in an accelerator's memory (at least one
    /// chunk plus 4 KiB).
    Memory(MemRange<'a>),
}

impl fmt::Debug for Via<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Via::Host => f.write_str("host memory"),
            Via::Memory(r) => {
                write!(f, "{} [{}, +{})", r.mem().kind(), r.offset(), r.len())
            }
        }
    }
}

/// What a hop does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HopKind {
    /// Storage to memory, on this path ([`TransferPath::Direct`] into host
    /// memory).
    Read(TransferPath),
    /// Memory to storage, on this path.
    Write(TransferPath),
    /// Memory to memory, by the CPU.
    Copy,
    /// GPU memory to GPU memory, by the GPUs' copy engines: within one
    /// GPU, or between two (peer to peer where they reach each other).
    GpuCopy,
}

/// One hop of a route, for reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hop {
    /// What it does.
    pub kind: HopKind,
    /// Where it takes the chunks from, and where it puts them, in words.
    pub from: String,
    /// See `from`.
    pub to: String,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.kind {
            HopKind::Read(TransferPath::Direct) | HopKind::Write(TransferPath::Direct) => {
                "direct I/O"
            }
            HopKind::Read(TransferPath::P2p) | HopKind::Write(TransferPath::P2p) => "P2P",
            HopKind::Read(TransferPath::NvmeCmd) | HopKind::Write(TransferPath::NvmeCmd) => {
                "NVMe commands"
            }
            HopKind::Read(TransferPath::Queues) | HopKind::Write(TransferPath::Queues) => "queues",
            HopKind::Read(TransferPath::Bounce) | HopKind::Write(TransferPath::Bounce) => {
                "bounce pipeline"
            }
            HopKind::Copy => "CPU copy",
            HopKind::GpuCopy => "GPU copy",
        };
        write!(f, "{} -> {} ({how})", self.from, self.to)
    }
}

/// A place on a route.
#[derive(Clone, Copy)]
enum Place<'a> {
    End(End<'a>),
    Via(Via<'a>),
}

impl Place<'_> {
    fn storage(&self) -> Option<(&StorageFile, u64)> {
        match *self {
            Place::End(End::Storage { file, offset }) => Some((file, offset)),
            _ => None,
        }
    }

    /// The memory of a memory place, with the kind of memory it is.
    fn memory_kind(&self) -> Option<MemoryKind> {
        match *self {
            Place::End(End::Memory { mem, .. }) => Some(mem.kind()),
            Place::Via(Via::Memory(r)) => Some(r.mem().kind()),
            Place::Via(Via::Host) => Some(MemoryKind::Host),
            Place::End(End::Storage { .. }) => None,
        }
    }

    fn name(&self) -> String {
        match *self {
            Place::End(End::Storage { file, .. }) => file.path().display().to_string(),
            Place::End(End::Memory { mem, .. }) => mem.kind().to_string(),
            Place::Via(Via::Host) => "host memory".into(),
            Place::Via(Via::Memory(r)) => format!("{} (staging)", r.mem().kind()),
        }
    }
}

/// Whether memory of this kind is host memory (no accelerator behind it).
fn is_host(kind: &MemoryKind) -> bool {
    matches!(kind, MemoryKind::Host)
}

/// A planned route: its places, the hops between them, and why.
pub struct Route<'a> {
    places: Vec<Place<'a>>,
    hops: Vec<HopKind>,
    reason: String,
}

impl fmt::Debug for Route<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("hops", &self.hops())
            .field("reason", &self.reason)
            .finish()
    }
}

impl Route<'_> {
    /// The hops, in order.
    pub fn hops(&self) -> Vec<Hop> {
        self.hops
            .iter()
            .enumerate()
            .map(|(i, &kind)| Hop {
                kind,
                from: self.places[i].name(),
                to: self.places[i + 1].name(),
            })
            .collect()
    }

    /// How many hops (k).
    pub fn len(&self) -> usize {
        self.hops.len()
    }

    /// Whether the route has no hop (never: a route has at least one).
    pub fn is_empty(&self) -> bool {
        self.hops.is_empty()
    }

    /// Why these hops, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// How a route is run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteOptions {
    /// Bytes per chunk (rounded up to 4 KiB); `None`: a sixteenth of the
    /// transfer, between 256 KiB and 8 MiB.
    pub chunk: Option<usize>,
    /// Slots in each staging ring (at least 1); `None`: 3.
    pub slots: Option<usize>,
    /// Chunks each hop works on at once; `None`: 1.
    pub lanes: Option<usize>,
}

/// What a copy along a route did.
#[derive(Clone, Debug)]
pub struct RouteReport {
    /// Bytes moved (always the length asked for).
    pub bytes: u64,
    /// The hops.
    pub hops: Vec<Hop>,
    /// Each hop's time moving chunks, summed over its lanes.
    pub busy: Vec<Duration>,
    /// The chunk size used, and the number of chunks.
    pub chunk: usize,
    /// See `chunk`.
    pub chunks: usize,
    /// The whole copy's time.
    pub elapsed: Duration,
}

/// An engine's routes: planned ([`Routes::plan`], [`Routes::plan_through`])
/// and run ([`Routes::copy`]) on its [`Core`], staging in its host rings.
#[derive(Clone, Copy)]
pub struct Routes<'e> {
    core: &'e Core,
    rings: &'e RingPool,
}

impl fmt::Debug for Routes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Routes").finish_non_exhaustive()
    }
}

impl<'e> Routes<'e> {
    /// The routes of `core`, staging in host memory from `rings`.
    pub(crate) fn new(core: &'e Core, rings: &'e RingPool) -> Self {
        Self { core, rings }
    }

    /// Plans a route from `src` to `dst`: the engine's path choice between
    /// storage and memory (P2P or NVMe commands in one hop where allowed,
    /// through host memory otherwise), one accelerator's memory to
    /// another's through host memory, storage to storage through host
    /// memory. The reason says why.
    pub fn plan<'a>(&self, src: End<'a>, dst: End<'a>) -> Result<Route<'a>> {
        let mut p = Planner::new(self.core, src);
        p.join(Place::End(src), Place::End(dst))?;
        Ok(p.done(None))
    }

    /// A route from `src` to `dst` through the places `via`, in order. A
    /// storage hop whose memory the storage cannot reach directly goes
    /// through host memory as well (the reason says so); a copy between
    /// two accelerators' memories must go through host memory.
    pub fn plan_through<'a>(
        &self,
        src: End<'a>,
        via: &[Via<'a>],
        dst: End<'a>,
    ) -> Result<Route<'a>> {
        let mut p = Planner::new(self.core, src);
        let mut at = Place::End(src);
        for next in via.iter().map(|&v| Place::Via(v)).chain([Place::End(dst)]) {
            p.hop(at, next)?;
            at = next;
        }
        Ok(p.done(Some("route given by the caller")))
    }

    /// Copies `len` bytes along `route`, every hop a stage of one
    /// pipeline. Moves every byte or returns an error.
    pub fn copy(&self, route: &Route<'_>, len: usize, opts: &RouteOptions) -> Result<RouteReport> {
        let (core, pool) = (self.core, self.rings);
        for p in [route.places[0], route.places[route.places.len() - 1]] {
            if let Place::End(End::Memory { mem, offset }) = p {
                if offset.checked_add(len).is_none_or(|end| end > mem.len()) {
                    return Err(Error::OutOfBounds {
                        offset: offset as u64,
                        len: len as u64,
                        size: mem.len() as u64,
                    });
                }
            }
            if let Place::End(End::Storage { offset, .. }) = p {
                if offset.checked_add(len as u64).is_none() {
                    return Err(Error::InvalidArgument(
                        "storage offset + length overflows".into(),
                    ));
                }
            }
        }
        let chunk = match opts.chunk {
            Some(0) => return Err(Error::InvalidArgument("a chunk of 0 bytes".into())),
            Some(c) => c.div_ceil(ALIGN).saturating_mul(ALIGN),
            None => (len / 16).clamp(256 << 10, 8 << 20).next_multiple_of(ALIGN),
        };
        let slots = opts.slots.unwrap_or(3);
        let lanes = opts.lanes.unwrap_or(1);
        if slots == 0 || lanes == 0 {
            return Err(Error::InvalidArgument(
                "a route needs at least one slot per ring and one lane per hop".into(),
            ));
        }
        // Chunk boundaries aligned in the storage being written, else the
        // storage being read: no two chunks share a block of it.
        let last = route.places.len() - 1;
        let anchor = route.places[last]
            .storage()
            .or_else(|| route.places[0].storage())
            .map_or(0, |(_, o)| (o % ALIGN as u64) as usize);
        let chunks = pipeline::chunks(len, chunk, anchor);
        let slot_size = chunk.min(len.next_multiple_of(ALIGN)) + ALIGN;
        let rings = route.places[1..last]
            .iter()
            .map(|p| Ring::new(*p, slot_size, slots, pool))
            .collect::<Result<Vec<_>>>()?;
        let at = |i: usize| match route.places[i] {
            Place::End(e) => Spot::End(e),
            Place::Via(_) => Spot::Ring(&rings[i - 1]),
        };
        let stages: Vec<HopStage> = route
            .hops
            .iter()
            .enumerate()
            .map(|(i, &kind)| HopStage {
                core,
                kind,
                from: at(i),
                to: at(i + 1),
                anchor,
            })
            .collect();
        let drivers: Vec<Driver> = stages
            .iter()
            .map(|s| Driver::Lanes(Lanes { stage: s, lanes }))
            .collect();
        let ring_slots: Vec<usize> = rings.iter().map(|r| r.slots).collect();
        let out = pipeline::execute(&chunks, drivers, &ring_slots)?;
        Ok(RouteReport {
            bytes: len as u64,
            hops: route.hops(),
            busy: out.busy,
            chunk,
            chunks: chunks.len(),
            elapsed: out.elapsed,
        })
    }
}

/// Why two accelerators' memories are joined through host memory.
pub(crate) fn between_accelerators(core: &Core, x: &MemoryKind, y: &MemoryKind) -> String {
    let (MemoryKind::ModuleBar { index: i, pci: pa }, MemoryKind::ModuleBar { index: j, pci: pb }) =
        (x, y)
    else {
        return format!("{x} to {y}: through host memory");
    };
    if i == j {
        return format!(
            "accelerator {i} to itself: through host memory (no copy engine the library drives)"
        );
    }
    let kernel = match &core.module {
        Some(m) => match m.p2p_query(*j, Peer::Pci(*pa)) {
            Ok(q) if q.distance.is_some() => format!(
                "the kernel would allow P2P between {pa} and {pb} ({}), but neither has a copy engine the library drives",
                q.reason
            ),
            Ok(q) => format!("no P2P between {pa} and {pb}: {}", q.reason),
            Err(e) => format!("P2P between {pa} and {pb} unknown ({e})"),
        },
        None => "the module is not open to ask about P2P".into(),
    };
    format!("accelerator {i} to accelerator {j} through host memory: {kernel}")
}

/// A route being planned: its places so far, the hops between them, and
/// why.
struct Planner<'e, 'a> {
    core: &'e Core,
    places: Vec<Place<'a>>,
    hops: Vec<HopKind>,
    why: Vec<String>,
}

impl<'e, 'a> Planner<'e, 'a> {
    fn new(core: &'e Core, src: End<'a>) -> Self {
        Self {
            core,
            places: vec![Place::End(src)],
            hops: Vec::new(),
            why: Vec::new(),
        }
    }

    /// The route, its reason led by `given` when there is one.
    fn done(self, given: Option<&str>) -> Route<'a> {
        let reason = given
            .into_iter()
            .map(str::to_string)
            .chain(self.why)
            .collect::<Vec<_>>()
            .join("; ");
        let reason = match reason.is_empty() {
            true => "one CPU copy, host memory on one side: nothing to choose".into(),
            false => reason,
        };
        Route {
            places: self.places,
            hops: self.hops,
            reason,
        }
    }

    /// Appends hop `kind` to place `to`.
    fn push(&mut self, kind: HopKind, to: Place<'a>) {
        self.hops.push(kind);
        self.places.push(to);
    }

    /// Appends the hops from `a` to `b` chosen automatically.
    fn join(&mut self, a: Place<'a>, b: Place<'a>) -> Result<()> {
        if let (
            Some(MemoryKind::Cuda { ordinal: i, .. }),
            Some(MemoryKind::Cuda { ordinal: j, .. }),
        ) = (a.memory_kind(), b.memory_kind())
        {
            self.why.push(match i == j {
                true => format!("GPU {i} to itself: by its copy engines, not through the host"),
                false => format!(
                    "GPU {i} to GPU {j}: by their copy engines, peer to peer where they reach each other (else staged by the driver)"
                ),
            });
            self.push(HopKind::GpuCopy, b);
            return Ok(());
        }
        let through_host = match (a.memory_kind(), b.memory_kind()) {
            (None, None) => Some("storage to storage: through host memory".to_string()),
            (Some(x), Some(y)) if !is_host(&x) && !is_host(&y) => {
                Some(between_accelerators(self.core, &x, &y))
            }
            _ => None,
        };
        match through_host {
            Some(why) => {
                self.why.push(why);
                let h = Place::Via(Via::Host);
                self.hop(a, h)?;
                self.hop(h, b)
            }
            None => self.hop(a, b),
        }
    }

    /// Appends the hop (or, for storage and memory it cannot reach, the two
    /// hops through host memory) from `a` to `b`.
    fn hop(&mut self, a: Place<'a>, b: Place<'a>) -> Result<()> {
        let (sa, sb) = (a.storage(), b.storage());
        let file = match (sa, sb) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(
                    "a hop from storage to storage: route through memory".into(),
                ))
            }
            (Some((file, _)), None) | (None, Some((file, _))) => file,
            (None, None) => {
                let hosted = |k: Option<MemoryKind>| k.as_ref().is_some_and(is_host);
                if !hosted(a.memory_kind()) && !hosted(b.memory_kind()) {
                    return Err(Error::InvalidArgument(format!(
                        "a hop from {} to {}: no copy engine the library drives joins two accelerators' memories; route through host memory",
                        a.name(),
                        b.name()
                    )));
                }
                self.push(HopKind::Copy, b);
                return Ok(());
            }
        };
        let read = sa.is_some();
        let kind = |p| match read {
            true => HopKind::Read(p),
            false => HopKind::Write(p),
        };
        let (into, mem_place) = if read { ("into", b) } else { ("from", a) };
        if file.queues_volume().is_some() {
            // Only this process's queues reach the namespace, and they
            // reach host and accelerator memory alike.
            self.why.push(format!(
                "{} {into} {}: the queues path, the only one that reaches it",
                file.path().display(),
                mem_place.name()
            ));
            self.push(kind(TransferPath::Queues), b);
            return Ok(());
        }
        let mem = match mem_place {
            Place::End(End::Memory { mem, .. }) => mem,
            Place::Via(Via::Memory(r)) => r.mem(),
            Place::Via(Via::Host) | Place::End(End::Storage { .. }) => {
                self.push(kind(TransferPath::Direct), b);
                return Ok(());
            }
        };
        let path = file.path().display();
        if is_host(&mem.kind()) {
            self.why.push(format!(
                "{path} {into} {}: direct I/O, host memory needs no P2P",
                mem.kind()
            ));
            self.push(kind(TransferPath::Direct), b);
            return Ok(());
        }
        let choice = self.core.choose(file, mem)?;
        if choice.path != TransferPath::Bounce {
            self.why
                .push(format!("{path} {into} {}: {}", mem.kind(), choice.reason));
            self.push(kind(choice.path), b);
            return Ok(());
        }
        self.why.push(format!(
            "{path} and {} through host memory: {}",
            mem.kind(),
            choice.reason
        ));
        let h = Place::Via(Via::Host);
        if read {
            self.push(kind(TransferPath::Direct), h);
            self.push(HopKind::Copy, b);
        } else {
            self.push(HopKind::Copy, h);
            self.push(kind(TransferPath::Direct), b);
        }
        Ok(())
    }
}

/// A staging ring: `slots` slots of `slot` bytes, in host memory from the
/// engine's pool or in a region of device memory.
struct Ring<'a> {
    mem: RingMem<'a>,
    slot: usize,
    slots: usize,
}

enum RingMem<'a> {
    Host {
        mem: Option<HostMemory>,
        pool: &'a RingPool,
    },
    Device {
        mem: &'a dyn DeviceMemory,
        offset: usize,
    },
}

impl Drop for RingMem<'_> {
    fn drop(&mut self) {
        if let RingMem::Host { mem, pool } = self {
            if let Some(m) = mem.take() {
                pool.give(m);
            }
        }
    }
}

impl<'a> Ring<'a> {
    fn new(place: Place<'a>, slot: usize, slots: usize, pool: &'a RingPool) -> Result<Self> {
        match place {
            Place::Via(Via::Host) => {
                let total = slot
                    .checked_mul(slots)
                    .ok_or_else(|| Error::InvalidArgument("staging ring size overflows".into()))?;
                Ok(Self {
                    mem: RingMem::Host {
                        mem: Some(pool.take(total)?),
                        pool,
                    },
                    slot,
                    slots,
                })
            }
            Place::Via(Via::Memory(r)) => {
                let (mem, offset, len) = (r.mem(), r.offset(), r.len());
                // Slots start 4 KiB-aligned within the memory.
                let skip = offset.next_multiple_of(ALIGN) - offset;
                let fit = len.saturating_sub(skip) / slot;
                if fit == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "staging in {} holds {len} bytes at {offset}: not one chunk slot of {slot} bytes (chunk + 4 KiB)",
                        mem.kind()
                    )));
                }
                Ok(Self {
                    mem: RingMem::Device {
                        mem,
                        offset: offset + skip,
                    },
                    slot,
                    slots: slots.min(fit),
                })
            }
            Place::End(_) => Err(Error::InvalidArgument(
                "a route's end is not a staging place".into(),
            )),
        }
    }

    fn memory(&self) -> &dyn DeviceMemory {
        match &self.mem {
            RingMem::Host { mem, .. } => match mem {
                Some(m) => m,
                None => unreachable!("a ring's memory lives as long as the ring"),
            },
            RingMem::Device { mem, .. } => *mem,
        }
    }

    /// The ring's own host memory, when it is in host memory.
    fn host(&self) -> Option<&HostMemory> {
        match &self.mem {
            RingMem::Host { mem, .. } => mem.as_ref(),
            RingMem::Device { .. } => None,
        }
    }

    /// Offset in [`Ring::memory`] of slot `s`.
    fn base(&self, s: usize) -> usize {
        let start = match &self.mem {
            RingMem::Host { .. } => 0,
            RingMem::Device { offset, .. } => *offset,
        };
        start + s * self.slot
    }
}

/// Where a hop finds or puts a chunk.
#[derive(Clone, Copy)]
enum Spot<'r, 'a> {
    End(End<'a>),
    Ring(&'r Ring<'a>),
}

/// A hop as a pipeline stage.
struct HopStage<'r, 'a> {
    core: &'r Core,
    kind: HopKind,
    from: Spot<'r, 'a>,
    to: Spot<'r, 'a>,
    /// The misalignment of the storage offset chunks are aligned to.
    anchor: usize,
}

/// A chunk's place in memory: the memory and the offset.
struct MemAt<'m> {
    mem: &'m dyn DeviceMemory,
    offset: usize,
    /// The ring's own host memory, when it is one.
    host: Option<&'m HostMemory>,
}

impl HopStage<'_, '_> {
    /// Where chunk `c` is in `spot` (slot `slot` of a ring).
    fn mem_at<'m>(
        &'m self,
        spot: &'m Spot<'_, '_>,
        c: &Chunk,
        slot: Option<usize>,
    ) -> Option<MemAt<'m>> {
        match spot {
            Spot::End(End::Memory { mem, offset }) => Some(MemAt {
                mem: *mem,
                offset: offset + c.offset,
                host: None,
            }),
            Spot::End(End::Storage { .. }) => None,
            Spot::Ring(r) => {
                let s = slot?;
                // Within its slot, a chunk sits at its storage offset's
                // place in a 4 KiB page, so direct I/O into it is aligned.
                let skew = (self.anchor + c.offset) % ALIGN;
                Some(MemAt {
                    mem: r.memory(),
                    offset: r.base(s) + skew,
                    host: r.host(),
                })
            }
        }
    }

    fn storage<'s>(spot: &Spot<'_, 's>, c: &Chunk) -> Option<(&'s StorageFile, u64)> {
        match spot {
            Spot::End(End::Storage { file, offset }) => Some((file, offset + c.offset as u64)),
            _ => None,
        }
    }
}

impl Stage for HopStage<'_, '_> {
    #[allow(unsafe_code)]
    fn run(&self, c: &Chunk, from: Option<usize>, to: Option<usize>) -> Result<()> {
        let missing = || Error::InvalidArgument("a hop's chunk has no place".into());
        match self.kind {
            HopKind::Read(path) | HopKind::Write(path) => {
                let read = matches!(self.kind, HopKind::Read(_));
                let (store, mem, slot) = match read {
                    true => (&self.from, &self.to, to),
                    false => (&self.to, &self.from, from),
                };
                let (file, file_offset) = Self::storage(store, c).ok_or_else(missing)?;
                let m = self.mem_at(mem, c, slot).ok_or_else(missing)?;
                let choice = PathChoice {
                    path,
                    reason: "a hop of a route".into(),
                };
                let dir = if read {
                    Direction::Read
                } else {
                    Direction::Write
                };
                let range = MemRange::new(m.mem, m.offset, c.len)?;
                self.core.run(Job {
                    dir,
                    choice: &choice,
                    file,
                    file_offset,
                    range,
                })?;
                Ok(())
            }
            HopKind::Copy => {
                let a = self.mem_at(&self.from, c, from).ok_or_else(missing)?;
                let b = self.mem_at(&self.to, c, to).ok_or_else(missing)?;
                // A slot of a host ring is no memory others share while
                // this stage holds it, so the other memory copies straight
                // out of it or into it with its own copies: one copy, even
                // for memory without raw-pointer copies (CUDA memory),
                // which `memory::copy` would stage.
                if let Some(h) = a.host {
                    // SAFETY: The slot is this stage's alone until it
                    // hands it back (the executor's queues), and the stage
                    // before finished writing it before handing it on.
                    let src = unsafe { h.bytes(a.offset, c.len) }?;
                    return b.mem.write_at(b.offset, src);
                }
                if let Some(h) = b.host {
                    // SAFETY: As above: the slot is this stage's alone.
                    let dst = unsafe { h.bytes_mut(b.offset, c.len) }?;
                    return a.mem.read_at(a.offset, dst);
                }
                // Neither side is a ring of this route: one pass over the
                // bytes where the two memories allow it (`memory::copy`).
                memory::copy(a.mem, a.offset, b.mem, b.offset, c.len)
            }
            HopKind::GpuCopy => {
                let a = self.mem_at(&self.from, c, from).ok_or_else(missing)?;
                let b = self.mem_at(&self.to, c, to).ok_or_else(missing)?;
                memory::copy(a.mem, a.offset, b.mem, b.offset, c.len)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        memory::copy::tests::Counted,
        transfer::{Config, Engine},
    };

    #[test]
    fn a_copy_hop_between_two_mappings_is_one_pass() {
        let n = 4 << 20;
        let (a, b) = (Counted::host(n), Counted::host(n));
        let data: Vec<u8> = (0..n).map(|i| (i * 11 + i / 4093) as u8).collect();
        a.inner.write_at(0, &data).unwrap();
        let engine = Engine::new(Config::default(), None);
        let from = End::Memory { mem: &a, offset: 5 };
        let to = End::Memory { mem: &b, offset: 9 };
        let routes = engine.routes();
        let r = routes.plan(from, to).unwrap();
        assert_eq!(r.hops().len(), 1);
        let opts = RouteOptions {
            chunk: Some(1 << 20),
            ..RouteOptions::default()
        };
        routes.copy(&r, n - 9, &opts).unwrap();
        // Mapping to mapping, chunk by chunk: neither memory was asked to
        // copy through a buffer.
        assert_eq!((a.calls.get(), b.calls.get()), ([0; 4], [0; 4]));
        let mut got = vec![0u8; n - 9];
        b.inner.read_at(9, &mut got).unwrap();
        assert!(got[..] == data[5..n - 4]);
    }
}
