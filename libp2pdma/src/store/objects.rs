//! The object store: objects on a device, created, resized, deleted, read
//! and written by many threads at once, their map kept through crashes.

use std::sync::{Arc, Mutex, RwLock};

use super::{
    backing::Backing,
    cache::{CacheStats, PageCache},
    layout::{checksum, pick, Superblock, BLOCK},
    map::{no_object, Extent, Map, ObjectInfo},
};
use crate::{
    memory::{copy, DeviceMemory, HostMemory, MemRange},
    queues::{CommandId, Issued},
    transfer::{Direction, Ticket},
    Error, Result,
};

/// Bytes zeroed per write when an object gets new blocks.
const ZERO_CHUNK: usize = 1 << 20;

/// Byte ranges of the device that reads in flight without the map's lock
/// (prefetches) are reading. Nothing the store writes before a commit, and
/// no extent it hands out, touches them: an object deleted, shrunk or moved
/// under a prefetch keeps the bytes that prefetch reads until it is
/// consumed or dropped (as an unlinked file keeps its blocks while it is
/// open), and no metadata call waits for a prefetch.
#[derive(Default)]
struct Holds(Mutex<Vec<(u64, u64)>>);

impl Holds {
    fn hold(&self, range: (u64, u64)) {
        self.lock().push(range);
    }

    fn release(&self, range: (u64, u64)) {
        let mut h = self.lock();
        if let Some(i) = h.iter().position(|r| *r == range) {
            h.swap_remove(i);
        }
    }

    /// What is held now.
    fn now(&self) -> Vec<(u64, u64)> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the store holds while it is open: the map of the last commit and
/// that commit's superblock.
struct State {
    map: Map,
    sb: Superblock,
}

/// An object store on a [`Backing`].
///
/// Metadata calls ([`pcreate`](Store::pcreate), [`delete`](Store::delete),
/// [`resize`](Store::resize)) commit before they return: once one returns,
/// a crash at any later point leaves its effect, and a crash before it
/// returns leaves either all of it or none. Data written with
/// [`pwrite`](Store::pwrite) is durable once [`flush`](Store::flush) (or a
/// later metadata call) returns. Reads and writes name an object and a range
/// inside its size: a range past the end or an id that is not there is an
/// error, and no call ever moves another object's bytes.
pub struct Store {
    backing: Arc<dyn Backing>,
    state: RwLock<State>,
    holds: Arc<Holds>,
    cache: Option<PageCache>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.read_state();
        f.debug_struct("Store")
            .field("generation", &s.sb.generation)
            .field("objects", &s.map.len())
            .finish()
    }
}

/// A read started by [`Store::pread_prefetch`], consumed with
/// [`Store::consume_prefetch_pread`]. Dropping it waits for its read.
pub struct Prefetch {
    id: u64,
    len: usize,
    /// Where the read lands: staging host memory, or the caller's memory
    /// (from an offset) for [`Store::pread_prefetch_into`].
    dest: Arc<dyn DeviceMemory>,
    dest_offset: usize,
    ticket: Option<Ticket>,
    commands: Option<Arc<Issued>>,
    /// The device bytes it reads, held until it is consumed or dropped.
    held: Option<(u64, u64)>,
    holds: Arc<Holds>,
}

impl std::fmt::Debug for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetch")
            .field("id", &self.id)
            .field("len", &self.len)
            .finish()
    }
}

impl Prefetch {
    /// The NVMe commands its read submitted so far (each one's queue and
    /// identifier, as its completion entry names it) where the store's
    /// device is a namespace the library drives; none on other paths.
    pub fn commands(&self) -> Vec<CommandId> {
        self.commands.as_ref().map_or_else(Vec::new, |i| i.ids())
    }

    /// Whether its read has completed.
    pub fn is_done(&self) -> bool {
        self.ticket.as_ref().is_none_or(Ticket::is_done)
    }
}

impl Drop for Store {
    /// Writes the cache's dirty pages back (not durably: that is `flush`'s),
    /// and gives the device's claim back.
    fn drop(&mut self) {
        if let Some(c) = &self.cache {
            let s = self.state.read().unwrap_or_else(|p| p.into_inner());
            let _ = c.write_back_dirty(self.backing.as_ref(), &s.map, None);
        }
        self.backing.unclaim();
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            let _ = t.wait();
        }
        if let Some(r) = self.held.take() {
            self.holds.release(r);
        }
    }
}

/// The map region bytes of a map of `len` bytes: whole blocks.
fn region_bytes(len: usize) -> usize {
    len.div_ceil(BLOCK as usize).max(1) * BLOCK as usize
}

impl Store {
    /// Makes an empty store on `backing` with room in its map for
    /// `max_objects` objects; what was on the device before is gone. The
    /// device is claimed first ([`Backing::claim`]): one open store at a
    /// time.
    pub fn format(backing: Arc<dyn Backing>, max_objects: u64) -> Result<Self> {
        let device_blocks = backing.len() / BLOCK;
        let too_many = || {
            Error::InvalidArgument(format!(
                "a store for {max_objects} objects needs more than {} bytes",
                backing.len()
            ))
        };
        let map_blocks = Map::region_blocks(max_objects).ok_or_else(too_many)?;
        let sb = Superblock {
            generation: 1,
            total_blocks: device_blocks,
            map_blocks,
            map_len: 0,
            map_crc: 0,
        };
        sb.fits(device_blocks).map_err(|_| too_many())?;
        backing.claim()?;
        let store = Self {
            backing,
            state: RwLock::new(State {
                map: Map::new(sb.data_start(), device_blocks),
                sb: Superblock {
                    generation: 0,
                    ..sb
                },
            }),
            holds: Arc::default(),
            cache: None,
        };
        // Generation 1 goes to slot 1; slot 0 is cleared so that no older
        // store's superblock outlives the format.
        let zero = HostMemory::new(BLOCK as usize)?;
        store.backing.write(0, MemRange::whole(&zero))?;
        {
            let mut s = store.write_state();
            let map = s.map.clone();
            store.commit(&mut s, map)?;
        }
        Ok(store)
    }

    /// Opens the store on `backing`: the newest commit whose superblock and
    /// map both check. The device is claimed first ([`Backing::claim`]):
    /// one open store at a time, and none before the writes of a holder
    /// that died have landed.
    pub fn initialize(backing: Arc<dyn Backing>) -> Result<Self> {
        backing.claim()?;
        let opened = Self::read_newest(backing.clone());
        if opened.is_err() {
            backing.unclaim();
        }
        opened
    }

    fn read_newest(backing: Arc<dyn Backing>) -> Result<Self> {
        let device_blocks = backing.len() / BLOCK;
        let head = HostMemory::new(2 * BLOCK as usize)?;
        backing.read(0, MemRange::whole(&head))?;
        let mut bytes = vec![0u8; 2 * BLOCK as usize];
        head.read_at(0, &mut bytes)?;
        let slots = [0, 1].map(|i| {
            Superblock::decode(&bytes[i * BLOCK as usize..(i + 1) * BLOCK as usize])
                .filter(|s| s.fits(device_blocks).is_ok() && s.slot() == i as u64)
        });
        let mut found = None;
        let sb = pick(slots, |s| {
            let len = s.map_len as usize;
            let Ok(buf) = HostMemory::new(region_bytes(len)) else {
                return false;
            };
            let at = s.region_start(s.region()) * BLOCK;
            if backing.read(at, MemRange::whole(&buf)).is_err() {
                return false;
            }
            let mut m = vec![0u8; len];
            if buf.read_at(0, &mut m).is_err() || checksum(&m) != s.map_crc {
                return false;
            }
            found = Map::decode(&m, s.data_start(), s.total_blocks);
            found.is_some()
        })
        .ok_or_else(|| {
            Error::InvalidArgument(
                "no store on this device (no superblock and map that check)".into(),
            )
        })?;
        let map = found
            .ok_or_else(|| Error::InvalidArgument("the store's map does not decode".into()))?;
        Ok(Self {
            backing,
            state: RwLock::new(State { map, sb }),
            holds: Arc::default(),
            cache: None,
        })
    }

    /// The store with `cache` in front of its objects' bytes: reads and
    /// writes go through it, and `flush` and every commit write its dirty
    /// pages back first.
    pub fn with_cache(mut self, cache: PageCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The cache, if it has one.
    pub fn cache(&self) -> Option<&PageCache> {
        self.cache.as_ref()
    }

    /// The cache's counters, if it has one.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.cache.as_ref().map(PageCache::stats)
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `map` as the next generation: the map into its region, a
    /// flush, the superblock into its slot, a flush. `s` holds it after.
    fn commit(&self, s: &mut State, map: Map) -> Result<()> {
        if let Some(c) = &self.cache {
            c.write_back_dirty(self.backing.as_ref(), &s.map, None)?;
        }
        let (bytes, crc) = map.encode();
        let next = Superblock {
            generation: s.sb.generation + 1,
            map_len: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            map_crc: crc,
            ..s.sb
        };
        if bytes.len() as u64 > next.map_blocks * BLOCK {
            return Err(Error::InvalidArgument(format!(
                "the store's map is full ({} objects)",
                map.len().saturating_sub(1)
            )));
        }
        let buf = HostMemory::new(region_bytes(bytes.len()))?;
        buf.write_at(0, &bytes)?;
        let at = next.region_start(next.region()) * BLOCK;
        self.backing.write(at, MemRange::whole(&buf))?;
        self.backing.flush()?;
        let block = HostMemory::new(BLOCK as usize)?;
        block.write_at(0, &next.encode())?;
        self.backing
            .write(next.slot() * BLOCK, MemRange::whole(&block))?;
        self.backing.flush()?;
        s.map = map;
        s.sb = next;
        Ok(())
    }

    /// Writes zeros over blocks `[start, end)`.
    fn zero(&self, start: u64, end: u64) -> Result<()> {
        let zero = HostMemory::new(ZERO_CHUNK)?;
        let (mut at, end) = (start * BLOCK, end * BLOCK);
        while at < end {
            let n = (end - at).min(ZERO_CHUNK as u64) as usize;
            self.backing.write(at, MemRange::new(&zero, 0, n)?)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Every object's id, first block and size, as accelerator kernels are
    /// given it (the document's `get_object_map`).
    pub fn get_object_map(&self) -> Vec<ObjectInfo> {
        self.read_state().map.objects()
    }

    /// Object `id`'s size in bytes.
    pub fn size(&self, id: u64) -> Result<u64> {
        self.read_state()
            .map
            .get(id)
            .map(|e| e.size)
            .ok_or_else(|| no_object(id))
    }

    /// Bytes of data space no object holds.
    pub fn free_bytes(&self) -> u64 {
        self.read_state().map.free_blocks() * BLOCK
    }

    /// The generation of the last commit.
    pub fn generation(&self) -> u64 {
        self.read_state().sb.generation
    }

    /// Creates an object of `n_bytes` zero bytes; its id. Committed when it
    /// returns.
    pub fn pcreate(&self, n_bytes: u64) -> Result<u64> {
        let mut s = self.write_state();
        let mut map = s.map.clone();
        let (id, e) = map.create(n_bytes, &self.holds.now())?;
        self.zero(e.start, e.end())?;
        self.commit(&mut s, map)?;
        Ok(id)
    }

    /// Deletes object `id`; its space is reused by later objects, but
    /// what prefetches in flight read of it only once they are consumed or
    /// dropped. Committed when it returns; it does not wait for them.
    pub fn delete(&self, id: u64) -> Result<()> {
        let mut s = self.write_state();
        let mut map = s.map.clone();
        map.delete(id)?;
        if let Some(c) = &self.cache {
            c.invalidate(id, 0);
        }
        self.commit(&mut s, map)
    }

    /// Resizes object `id` to `n_bytes`: bytes past the old size read as
    /// zeros, bytes past the new size are gone. Committed when it returns:
    /// until then, nothing the object held is written (a grow that moves it
    /// copies to blocks nothing else holds), and prefetches in flight keep
    /// reading the bytes they started on; it does not wait for them.
    pub fn resize(&self, id: u64, n_bytes: u64) -> Result<()> {
        let mut s = self.write_state();
        let mut map = s.map.clone();
        let (old, new) = map.resize(id, n_bytes, &self.holds.now())?;
        if let Some(c) = &self.cache {
            c.write_back_dirty(self.backing.as_ref(), &s.map, Some(id))?;
            c.invalidate(id, 0);
        }
        if new.start != old.start {
            // Copies what the object keeps and zeros the rest.
            self.copy_blocks(&old, &new)?;
        } else {
            if new.blocks > old.blocks {
                self.zero(old.end(), new.end())?;
            }
            self.zero_tail(&old, new.size)?;
        }
        self.commit(&mut s, map)
    }

    /// Copies the bytes an object keeps from `old` to `new`, and zeros the
    /// rest of `new`'s blocks.
    fn copy_blocks(&self, old: &Extent, new: &Extent) -> Result<()> {
        let keep = old.size.min(new.size);
        let buf = HostMemory::new(ZERO_CHUNK)?;
        let mut done = 0;
        while done < keep {
            let n = (keep - done).min(ZERO_CHUNK as u64) as usize;
            let part = MemRange::new(&buf, 0, n)?;
            self.backing.read(old.start * BLOCK + done, part)?;
            self.backing.write(new.start * BLOCK + done, part)?;
            done += n as u64;
        }
        let kept_blocks = keep.div_ceil(BLOCK);
        self.zero(new.start + kept_blocks, new.end())?;
        if !keep.is_multiple_of(BLOCK) {
            self.zero_bytes(new.start * BLOCK + keep, BLOCK - keep % BLOCK)?;
        }
        Ok(())
    }

    /// Zeros what the blocks of `old` hold past its size (bytes a write
    /// left before the object shrank, or none), up to `size`.
    fn zero_tail(&self, old: &Extent, size: u64) -> Result<()> {
        let end = (old.blocks * BLOCK).min(size);
        if end > old.size {
            self.zero_bytes(old.start * BLOCK + old.size, end - old.size)?;
        }
        Ok(())
    }

    fn zero_bytes(&self, at: u64, n: u64) -> Result<()> {
        let zero = HostMemory::new(n as usize)?;
        self.backing.write(at, MemRange::whole(&zero))
    }

    /// The device offset of `[offset, offset + n)` of object `id`, checked
    /// against its size.
    fn locate(map: &Map, id: u64, offset: u64, n: usize) -> Result<u64> {
        let e = map.get(id).ok_or_else(|| no_object(id))?;
        crate::error::check_within(&format!("object {id}"), offset, n as u64, e.size)?;
        Ok(e.start * BLOCK + offset)
    }

    /// Reads the bytes at `offset` of object `id` into `range`; how many
    /// (`range.len()`). With a cache over several accelerators, the read
    /// goes through the copies of the accelerator whose memory `range` is
    /// in (accelerator 0 for other memory).
    pub fn pread(&self, id: u64, offset: u64, range: MemRange<'_>) -> Result<usize> {
        let a = self.local(range.mem());
        self.io(Direction::Read, a, id, offset, range)
    }

    /// Writes the bytes of `range` to `offset` of object `id`; how many
    /// (`range.len()`). Durable after the next [`flush`](Store::flush).
    /// With a cache over several accelerators, the write lands in the copy
    /// of the accelerator whose memory `range` is in (accelerator 0 for
    /// other memory), and every other copy is dropped.
    pub fn pwrite(&self, id: u64, offset: u64, range: MemRange<'_>) -> Result<usize> {
        let a = self.local(range.mem());
        self.io(Direction::Write, a, id, offset, range)
    }

    /// [`pread`](Store::pread) through accelerator `accel`'s copies of the
    /// cache, whatever memory `range` is in.
    pub fn pread_on(
        &self,
        accel: usize,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
    ) -> Result<usize> {
        self.check_accel(accel)?;
        self.io(Direction::Read, accel, id, offset, range)
    }

    /// [`pwrite`](Store::pwrite) into accelerator `accel`'s copy of the
    /// cache, whatever memory `range` is in.
    pub fn pwrite_on(
        &self,
        accel: usize,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
    ) -> Result<usize> {
        self.check_accel(accel)?;
        self.io(Direction::Write, accel, id, offset, range)
    }

    /// The accelerators the store's cache spans (1 without a cache).
    pub fn accelerators(&self) -> usize {
        self.cache.as_ref().map_or(1, PageCache::accelerators)
    }

    fn check_accel(&self, accel: usize) -> Result<()> {
        match &self.cache {
            Some(c) => c.check(accel),
            None if accel == 0 => Ok(()),
            None => Err(Error::InvalidArgument(format!(
                "accelerator {accel} of a store without a cache"
            ))),
        }
    }

    /// The cache's accelerator a caller with `mem` works on.
    fn local(&self, mem: &dyn DeviceMemory) -> usize {
        self.cache.as_ref().map_or(0, |c| c.local(&mem.kind()))
    }

    /// A read or write of the bytes of `range` at `offset` of object `id`,
    /// checked, under the map's read lock, through accelerator `a`'s copies
    /// when there is a cache.
    fn io(
        &self,
        dir: Direction,
        a: usize,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
    ) -> Result<usize> {
        let n = range.len();
        let s = self.read_state();
        let at = Self::locate(&s.map, id, offset, n)?;
        let b = self.backing.as_ref();
        match (&self.cache, dir) {
            (Some(c), dir) => c.io(dir, b, &s.map, a, id, offset, range)?,
            (None, Direction::Read) => b.read(at, range)?,
            (None, Direction::Write) => b.write(at, range)?,
        }
        Ok(n)
    }

    /// [`pread`](Store::pread) for a GPU consumer: the copies out of the
    /// store's cache into `range` (GPU memory, as the cache must be) are
    /// queued on `stream`, the caller's `CUstream` of `range`'s device
    /// (null: the legacy default stream), and the call returns without
    /// waiting for them. A kernel the caller queues on that stream next
    /// reads the bytes; no host thread waits for the copy. Pages not in the
    /// cache are read into it first, before the call returns. The cache's
    /// frames stay pinned until the stream has copied out of them, so a
    /// write or delete of those pages waits for the stream.
    ///
    /// # Safety
    /// `stream` is a live stream of `range`'s device (or a default-stream
    /// handle); `range`'s memory stays allocated, and no one else writes
    /// it, until the stream has run the copies. Work queued on the stream
    /// before must not wait for this thread (for an event it records
    /// later): a write of the same pages by this thread would wait for the
    /// stream.
    #[allow(unsafe_code)]
    pub unsafe fn pread_on_stream(
        &self,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
        stream: *mut std::ffi::c_void,
    ) -> Result<usize> {
        // SAFETY: The caller's promises, passed on.
        unsafe { self.on_stream(Direction::Read, id, offset, range, stream) }
    }

    /// [`pwrite`](Store::pwrite) for a GPU producer: the copies from
    /// `range` (GPU memory, as the store's cache must be) into the cache
    /// are queued on `stream`, the caller's `CUstream` of `range`'s device,
    /// after the work queued on it before (the kernel that produces the
    /// bytes), and the call returns without waiting. Until the stream has
    /// copied a page, the write owns it: a read or write of it anywhere
    /// waits, then sees the new bytes. Durable after the next
    /// [`flush`](Store::flush), which waits for the stream. With a
    /// write-through cache, the stream is waited for first and the write
    /// made as `pwrite` makes it.
    ///
    /// # Safety
    /// As for [`pread_on_stream`](Store::pread_on_stream): `stream` is a
    /// live stream of `range`'s device, and `range` stays allocated, and
    /// unwritten by anyone but the work queued before, until the stream has
    /// run the copies.
    #[allow(unsafe_code)]
    pub unsafe fn pwrite_on_stream(
        &self,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
        stream: *mut std::ffi::c_void,
    ) -> Result<usize> {
        // SAFETY: The caller's promises, passed on.
        unsafe { self.on_stream(Direction::Write, id, offset, range, stream) }
    }

    /// A stream-ordered read or write through the cache, checked, under
    /// the map's read lock.
    ///
    /// # Safety
    /// As for [`pread_on_stream`](Store::pread_on_stream).
    #[allow(unsafe_code)]
    unsafe fn on_stream(
        &self,
        dir: Direction,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
        stream: *mut std::ffi::c_void,
    ) -> Result<usize> {
        let n = range.len();
        let a = self.local(range.mem());
        let s = self.read_state();
        Self::locate(&s.map, id, offset, n)?;
        let Some(c) = &self.cache else {
            return Err(Error::InvalidArgument(
                "a stream-ordered read or write goes through the store's cache: this store has none"
                    .into(),
            ));
        };
        let b = self.backing.as_ref();
        // SAFETY: The caller's promises, passed on.
        unsafe {
            match dir {
                Direction::Read => c.read_on_stream(b, &s.map, a, id, offset, range, stream),
                Direction::Write => c.write_on_stream(b, &s.map, a, id, offset, range, stream),
            }
        }?;
        Ok(n)
    }

    /// The cache's counters on accelerator `accel`, if it has a cache.
    pub fn cache_stats_on(&self, accel: usize) -> Option<Result<CacheStats>> {
        self.cache.as_ref().map(|c| c.stats_on(accel))
    }

    /// Starts reading `n` bytes at `offset` of object `id`; the read runs
    /// while the caller computes, and [`consume_prefetch_pread`] hands the
    /// bytes over: the object's bytes as they were when it started, even if
    /// the object is deleted, shrunk or moved meanwhile (their blocks are
    /// reused only once the read is consumed or dropped).
    ///
    /// [`consume_prefetch_pread`]: Store::consume_prefetch_pread
    pub fn pread_prefetch(&self, id: u64, offset: u64, n: usize) -> Result<Prefetch> {
        let s = self.read_state();
        let at = Self::locate(&s.map, id, offset, n)?;
        if let Some(c) = &self.cache {
            // The read goes to storage: what the cache holds dirty goes first.
            c.write_back_dirty(self.backing.as_ref(), &s.map, Some(id))?;
        }
        let staging: Arc<dyn DeviceMemory> = Arc::new(HostMemory::new(n.max(1))?);
        self.prefetch(s, id, at, n, staging, 0)
    }

    /// Like [`pread_prefetch`](Store::pread_prefetch), but the read lands
    /// in `mem` at `mem_offset` itself (by P2P where the engine can), so
    /// that consuming it into the same place copies nothing.
    pub fn pread_prefetch_into(
        &self,
        id: u64,
        offset: u64,
        n: usize,
        mem: Arc<dyn DeviceMemory>,
        mem_offset: usize,
    ) -> Result<Prefetch> {
        crate::error::check_range(mem_offset, n, mem.len())?;
        let s = self.read_state();
        let at = Self::locate(&s.map, id, offset, n)?;
        if let Some(c) = &self.cache {
            c.write_back_dirty(self.backing.as_ref(), &s.map, Some(id))?;
        }
        self.prefetch(s, id, at, n, mem, mem_offset)
    }

    /// Starts the read of a prefetch (its range checked under `s`), the
    /// bytes it reads held until it is consumed or dropped.
    fn prefetch(
        &self,
        s: std::sync::RwLockReadGuard<'_, State>,
        id: u64,
        at: u64,
        n: usize,
        dest: Arc<dyn DeviceMemory>,
        dest_offset: usize,
    ) -> Result<Prefetch> {
        let held = (n > 0).then_some((at, at + n as u64));
        if let Some(r) = held {
            self.holds.hold(r);
        }
        let mut p = Prefetch {
            id,
            len: n,
            dest: dest.clone(),
            dest_offset,
            ticket: None,
            commands: None,
            held,
            holds: self.holds.clone(),
        };
        drop(s);
        if n > 0 {
            let started = self.backing.read_async(at, dest, dest_offset, n)?;
            p.ticket = Some(started.ticket);
            p.commands = started.commands;
        }
        Ok(p)
    }

    /// Waits for `p`'s read and copies its first `range.len()` bytes into
    /// `range` (nothing to copy when `p` read into that very place); how
    /// many.
    pub fn consume_prefetch_pread(&self, mut p: Prefetch, range: MemRange<'_>) -> Result<usize> {
        let n = range.len();
        if n > p.len {
            return Err(Error::InvalidArgument(format!(
                "consume of {n} bytes from a prefetch of {}",
                p.len
            )));
        }
        if let Some(t) = p.ticket.take() {
            t.wait()?;
        }
        // Read into this very place: nothing to copy.
        let mem = range.mem();
        let same = std::ptr::addr_eq(Arc::as_ptr(&p.dest), mem as *const dyn DeviceMemory)
            && p.dest_offset == range.offset();
        if !same {
            copy(p.dest.as_ref(), p.dest_offset, mem, range.offset(), n)?;
        }
        Ok(n)
    }

    /// Makes every write that returned durable (the NVMe Flush where the
    /// library drives the controller).
    pub fn flush(&self) -> Result<()> {
        if let Some(c) = &self.cache {
            let s = self.read_state();
            c.write_back_dirty(self.backing.as_ref(), &s.map, None)?;
        }
        self.backing.flush()
    }
}
