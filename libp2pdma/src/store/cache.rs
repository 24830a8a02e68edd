//! The page cache of a store, in the memory of one accelerator or several
//! (or host memory): on each accelerator a page table from object pages to
//! frames of its memory, present only while a page is cached; CLOCK
//! replacement; dirty bits and write-back (write-through on request).
//!
//! # One accelerator
//! A miss takes a frame (evicting the first one the clock hand finds
//! unreferenced, writing it back first when it is dirty), reads the page
//! into it and maps it; a second thread missing the same page meanwhile
//! waits for that read instead of issuing its own. A hit copies between the
//! frame and the caller's memory with no system call, by one [`copy()`]:
//! one pass over the bytes where the two memories allow it (host and BAR
//! memory do). Frames in use by a copy are pinned and never evicted.
//!
//! # Several accelerators: the home-based cache
//! Every object page has a home accelerator, chosen by a hash of the page.
//! The home keeps the page's record: which accelerators hold a copy, and
//! whether an operation owns the page now (a miss filling a copy, a write,
//! a write-back). A read that hits its own accelerator's copy involves no
//! one else. A read that misses asks the home and copies the page from an
//! accelerator that holds it (along the engine's route between the two
//! memories), or reads it from storage when none does. A write goes through
//! the home, which invalidates every other copy before the write lands
//! (waiting for reads copying out of them), so the writer's copy is the only
//! one and the next read anywhere fetches it. At most one copy of a page is
//! ever dirty, and every valid copy holds the same bytes.
//!
//! The records of every home and the frame tables of every accelerator sit
//! under one lock in the host process; the lock is held only to look up and
//! change them, never across a copy or I/O.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use super::{
    backing::Backing,
    layout::BLOCK,
    map::{no_object, Map},
};
use crate::{
    memory::{copy, DeviceMemory, MemRange, MemoryKind},
    sys::cuda as gpu,
    transfer::Direction,
    Error, Result,
};

/// Most accelerators one cache spans.
pub const MAX_ACCELERATORS: usize = 64;

/// An object page: the object's id and the page's index in it.
type Key = (u64, u64);

/// One frame of an accelerator's cache memory.
#[derive(Clone, Copy, Debug, Default)]
struct Frame {
    /// The page it holds.
    key: Option<Key>,
    /// Whether its bytes are the page's (read, copied or fully written).
    valid: bool,
    /// Written since it was read or written back.
    dirty: bool,
    /// Copies and I/O using it now.
    pins: u32,
    /// CLOCK's reference bit.
    referenced: bool,
}

/// One accelerator's frames and page table.
#[derive(Default)]
struct Pool {
    frames: Vec<Frame>,
    table: HashMap<Key, usize>,
    hand: usize,
    hits: u64,
    misses: u64,
    remote: u64,
}

impl Pool {
    /// The frame holding `key`, pinned, if it holds it valid.
    fn hit(&mut self, key: Key) -> Option<usize> {
        let f = *self.table.get(&key)?;
        let fr = &mut self.frames[f];
        if !fr.valid || fr.key != Some(key) {
            return None;
        }
        fr.pins += 1;
        fr.referenced = true;
        self.hits += 1;
        Some(f)
    }
}

/// A page's record at its home.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    /// The accelerators holding a valid copy, one bit each.
    holders: u64,
    /// An operation owns the page: others wait.
    busy: bool,
}

struct Inner {
    pools: Vec<Pool>,
    /// Each home's records of its pages.
    homes: Vec<HashMap<Key, Entry>>,
    /// Pages whose dirty bytes an eviction is writing back now.
    evicting: HashSet<Key>,
    invalidations: u64,
    /// Stream-ordered reads and writes whose copies a caller's stream has
    /// not run yet: their frames stay pinned, and the cache is not freed,
    /// until it has.
    on_streams: usize,
    /// Of those, the writes: a flush waits for them.
    stream_writes: usize,
}

impl Inner {
    fn entry(&self, home: usize, key: Key) -> Entry {
        self.homes[home].get(&key).copied().unwrap_or_default()
    }

    fn entry_mut(&mut self, home: usize, key: Key) -> &mut Entry {
        self.homes[home].entry(key).or_default()
    }

    /// Drops `key`'s record when it says nothing.
    fn tidy(&mut self, home: usize, key: Key) {
        if let Some(e) = self.homes[home].get(&key) {
            if e.holders == 0 && !e.busy {
                self.homes[home].remove(&key);
            }
        }
    }

    fn release(&mut self, home: usize, key: Key) {
        self.entry_mut(home, key).busy = false;
        self.tidy(home, key);
    }
}

/// Counters of a cache (of one accelerator, or summed over all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Page accesses served from a frame of the accessing accelerator.
    pub hits: u64,
    /// Page accesses that fetched the page first.
    pub misses: u64,
    /// Of the misses, those filled from another accelerator's copy
    /// instead of storage.
    pub remote: u64,
    /// Copies dropped because another accelerator wrote their page.
    pub invalidations: u64,
    /// Frames.
    pub frames: usize,
    /// Frames holding a page now.
    pub cached: usize,
    /// Of those, written since they were last written back.
    pub dirty: usize,
}

/// How a cache writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WritePolicy {
    /// Written pages stay dirty in the cache until evicted or flushed.
    #[default]
    WriteBack,
    /// Every write also goes to storage before it returns.
    WriteThrough,
}

/// What a caller wants a frame for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    /// To copy out of it.
    Read,
    /// To write into it; `whole`: every valid byte of the page.
    Write { whole: bool },
}

/// A page cache over the memory of one accelerator or several, each
/// holding `mem.len() / page` frames of `page` bytes.
pub struct PageCache {
    mems: Vec<Arc<dyn DeviceMemory>>,
    page: u64,
    policy: WritePolicy,
    /// The records and frame tables, and the signal that they changed:
    /// shared with stream-ordered reads' completions, which unpin frames
    /// after the caller's stream has copied out of them.
    shared: Arc<Shared>,
}

struct Shared {
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl std::fmt::Debug for PageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageCache")
            .field("page", &self.page)
            .field("accelerators", &self.mems.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// How a write into a frame ended, for [`PageCache::done`].
#[derive(Clone, Copy, Debug)]
struct Written {
    /// The page.
    key: Key,
    /// Whether the frame now holds bytes storage does not.
    dirty: bool,
    /// Whether the write's bytes reached the frame.
    landed: bool,
}

/// The frames of a stream-ordered read, unpinned once the caller's stream
/// has copied out of them.
struct Unpin {
    shared: Arc<Shared>,
    a: usize,
    /// Each frame, and for a write the page's home and key, whose record
    /// is released with the frame marked dirty.
    frames: Vec<(usize, Option<(usize, Key)>)>,
}

/// Runs on the stream's driver thread: unpins the frames of the `Unpin`
/// at `data` and frees it. Calls no CUDA (the driver forbids it here).
#[allow(unsafe_code)]
unsafe extern "C" fn unpin(data: *mut std::ffi::c_void) {
    // SAFETY: A box `read_on_stream` made, handed over once.
    let job = unsafe { Box::from_raw(data.cast::<Unpin>()) };
    let mut g = job.shared.inner.lock().unwrap_or_else(|p| p.into_inner());
    for &(f, write) in &job.frames {
        let fr = &mut g.pools[job.a].frames[f];
        fr.pins -= 1;
        if let Some((home, key)) = write {
            fr.dirty = true;
            fr.valid = true;
            g.release(home, key);
        }
    }
    g.on_streams -= 1;
    if job.frames.iter().any(|(_, w)| w.is_some()) {
        g.stream_writes -= 1;
    }
    drop(g);
    job.shared.changed.notify_all();
}

impl Drop for PageCache {
    /// Waits for the callers' streams to run the copies of stream-ordered
    /// reads, whose frames are this cache's memory.
    fn drop(&mut self) {
        let mut g = self.lock();
        while g.on_streams > 0 {
            g = self.wait(g);
        }
    }
}

impl PageCache {
    /// A cache of `page`-byte pages (a power of two from 4 KiB to 2 MiB) in
    /// `mem`, which must hold at least two frames.
    pub fn new(mem: Arc<dyn DeviceMemory>, page: usize, policy: WritePolicy) -> Result<Self> {
        Self::shared(vec![mem], page, policy)
    }

    /// A cache shared by several accelerators, frames in each one's memory
    /// (`mems[i]` is accelerator `i`'s, at least two frames each), every
    /// page homed on one of them.
    pub fn shared(
        mems: Vec<Arc<dyn DeviceMemory>>,
        page: usize,
        policy: WritePolicy,
    ) -> Result<Self> {
        if !page.is_power_of_two() || !(BLOCK as usize..=2 << 20).contains(&page) {
            return Err(Error::InvalidArgument(format!(
                "a cache page of {page} bytes (a power of two from 4 KiB to 2 MiB)"
            )));
        }
        if mems.is_empty() || mems.len() > MAX_ACCELERATORS {
            return Err(Error::InvalidArgument(format!(
                "a cache over {} accelerators (1 to {MAX_ACCELERATORS})",
                mems.len()
            )));
        }
        let mut pools = Vec::with_capacity(mems.len());
        for m in &mems {
            let n = m.len() / page;
            if n < 2 {
                return Err(Error::InvalidArgument(format!(
                    "{} bytes of {} hold fewer than two {page}-byte pages",
                    m.len(),
                    m.kind()
                )));
            }
            pools.push(Pool {
                frames: vec![Frame::default(); n],
                ..Pool::default()
            });
        }
        Ok(Self {
            page: page as u64,
            policy,
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    pools,
                    homes: vec![HashMap::new(); mems.len()],
                    evicting: HashSet::new(),
                    invalidations: 0,
                    on_streams: 0,
                    stream_writes: 0,
                }),
                changed: Condvar::new(),
            }),
            mems,
        })
    }

    /// The page size.
    pub fn page_size(&self) -> usize {
        self.page as usize
    }

    /// How many accelerators the cache spans.
    pub fn accelerators(&self) -> usize {
        self.mems.len()
    }

    /// The accelerator whose memory is of `kind` (the first, if several
    /// are), else accelerator 0: where a caller with memory of that kind
    /// reads and writes.
    pub fn local(&self, kind: &MemoryKind) -> usize {
        self.mems
            .iter()
            .position(|m| &m.kind() == kind)
            .unwrap_or(0)
    }

    /// The home accelerator of page `page` of object `id`.
    pub fn home(&self, id: u64, page: u64) -> usize {
        let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ page.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        ((h ^ (h >> 29)) % self.mems.len() as u64) as usize
    }

    /// The accelerators holding a copy of page `page` of object `id`, as
    /// its home records them.
    pub fn holders(&self, id: u64, page: u64) -> Vec<usize> {
        let g = self.lock();
        let h = g.entry(self.home(id, page), (id, page)).holders;
        (0..self.mems.len()).filter(|a| h & (1 << a) != 0).collect()
    }

    /// The counters summed over every accelerator.
    pub fn stats(&self) -> CacheStats {
        let g = self.lock();
        let mut s = (0..g.pools.len()).fold(CacheStats::default(), |mut s, a| {
            let p = Self::pool_stats(&g, a);
            s.hits += p.hits;
            s.misses += p.misses;
            s.remote += p.remote;
            s.frames += p.frames;
            s.cached += p.cached;
            s.dirty += p.dirty;
            s
        });
        s.invalidations = g.invalidations;
        s
    }

    /// Accelerator `a`'s counters (`invalidations` counts the whole
    /// cache's).
    pub fn stats_on(&self, a: usize) -> Result<CacheStats> {
        self.check(a)?;
        let g = self.lock();
        Ok(CacheStats {
            invalidations: g.invalidations,
            ..Self::pool_stats(&g, a)
        })
    }

    fn pool_stats(g: &Inner, a: usize) -> CacheStats {
        let p = &g.pools[a];
        CacheStats {
            hits: p.hits,
            misses: p.misses,
            remote: p.remote,
            invalidations: 0,
            frames: p.frames.len(),
            cached: p.table.len(),
            dirty: p
                .frames
                .iter()
                .filter(|f| f.key.is_some() && f.dirty)
                .count(),
        }
    }

    /// Checks that accelerator `a` is one of the cache's.
    pub fn check(&self, a: usize) -> Result<()> {
        if a < self.mems.len() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "accelerator {a} of a cache over {}",
                self.mems.len()
            )))
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        self.shared
            .changed
            .wait(g)
            .unwrap_or_else(|p| p.into_inner())
    }

    fn home_of(&self, key: Key) -> usize {
        self.home(key.0, key.1)
    }

    /// The device offset and valid bytes of page `key`, from `map`.
    fn span(&self, map: &Map, key: Key) -> Result<(u64, usize)> {
        let e = map.get(key.0).ok_or_else(|| no_object(key.0))?;
        let start = key.1 * self.page;
        let valid = e.size.saturating_sub(start).min(self.page) as usize;
        Ok((e.start * BLOCK + start, valid))
    }

    /// Moves page `key`'s valid bytes (those before its object's end)
    /// between storage and frame `f` of accelerator `a`: a read fills the
    /// frame, a write writes it back. The number of valid bytes.
    fn page_io(
        &self,
        dir: Direction,
        backing: &dyn Backing,
        map: &Map,
        a: usize,
        f: usize,
        key: Key,
    ) -> Result<usize> {
        let (at, valid) = self.span(map, key)?;
        if valid > 0 {
            let frame = MemRange::new(self.mems[a].as_ref(), f * self.page as usize, valid)?;
            match dir {
                Direction::Read => backing.read(at, frame)?,
                Direction::Write => backing.write(at, frame)?,
            }
        }
        Ok(valid)
    }

    /// A frame of accelerator `a` holding page `key`, pinned. For a write,
    /// the page's record is owned too (released by [`PageCache::done`]),
    /// and no other accelerator holds a copy.
    fn acquire(
        &self,
        backing: &dyn Backing,
        map: &Map,
        a: usize,
        key: Key,
        want: Want,
    ) -> Result<usize> {
        let h = self.home_of(key);
        let mut g = self.lock();
        loop {
            // A read hit involves no home.
            if want == Want::Read {
                if let Some(f) = g.pools[a].hit(key) {
                    return Ok(f);
                }
            }
            if g.entry(h, key).busy {
                g = self.wait(g);
                continue;
            }
            g.entry_mut(h, key).busy = true;
            if want != Want::Read {
                if let Some(f) = g.pools[a].hit(key) {
                    return self.sole_copy(g, a, key, f);
                }
            }
            let Some(f) = self.victim(&mut g, a) else {
                g.release(h, key);
                self.shared.changed.notify_all();
                g = self.wait(g);
                continue;
            };
            return self.miss(g, backing, map, a, key, want, f);
        }
    }

    /// Fills frame `f` of accelerator `a` with page `key` (whose record the
    /// caller owns), evicting what the frame held.
    #[allow(clippy::too_many_arguments)]
    fn miss(
        &self,
        mut g: MutexGuard<'_, Inner>,
        backing: &dyn Backing,
        map: &Map,
        a: usize,
        key: Key,
        want: Want,
        f: usize,
    ) -> Result<usize> {
        let h = self.home_of(key);
        let pool = &mut g.pools[a];
        pool.misses += 1;
        let old = pool.frames[f];
        pool.frames[f] = Frame {
            key: Some(key),
            valid: false,
            dirty: false,
            pins: 1,
            referenced: true,
        };
        if let Some(k) = old.key {
            pool.table.remove(&k);
        }
        pool.table.insert(key, f);
        // The victim leaves its home's record; a dirty one keeps its page
        // owned (readers wait) until its bytes are on storage.
        let evicting = old.key.filter(|_| old.dirty);
        if let Some(k) = old.key {
            let hk = self.home_of(k);
            let e = g.entry_mut(hk, k);
            e.holders &= !(1 << a);
            if old.dirty {
                e.busy = true;
                g.evicting.insert(k);
            }
            g.tidy(hk, k);
        }
        // Another accelerator's copy, if one holds it (pinned).
        let source = match want {
            Want::Write { whole: true } => None,
            _ => {
                let others = g.entry(h, key).holders & !(1 << a);
                (0..self.mems.len())
                    .filter(|b| others & (1 << b) != 0)
                    .find_map(|b| {
                        let fb = *g.pools[b].table.get(&key)?;
                        let fr = &mut g.pools[b].frames[fb];
                        fr.valid.then(|| {
                            fr.pins += 1;
                            (b, fb)
                        })
                    })
            }
        };
        drop(g);
        let written = match evicting {
            Some(k) => self
                .page_io(Direction::Write, backing, map, a, f, k)
                .map(|_| ()),
            None => Ok(()),
        };
        let filled = match (&written, source) {
            (Err(_), _) => Ok(()),
            (Ok(()), Some((b, fb))) => {
                let p = self.page as usize;
                backing.copy(
                    self.mems[b].as_ref(),
                    fb * p,
                    self.mems[a].as_ref(),
                    f * p,
                    p,
                )
            }
            (Ok(()), None) => {
                // The page from storage (none of it when the caller writes
                // every valid byte), zeros past the object's end.
                let read = match want {
                    Want::Write { whole: true } => Ok(0),
                    _ => self.page_io(Direction::Read, backing, map, a, f, key),
                };
                let page = self.page as usize;
                read.and_then(|valid| match valid < page {
                    true => self.mems[a].write_at(f * page + valid, &vec![0u8; page - valid]),
                    false => Ok(()),
                })
            }
        };
        let mut g = self.lock();
        if let Some((b, fb)) = source {
            g.pools[b].frames[fb].pins -= 1;
        }
        if let Some(k) = evicting {
            g.evicting.remove(&k);
            g.release(self.home_of(k), k);
        }
        let r = match (written, filled) {
            (Err(e), _) => {
                // The victim's bytes are not on storage: it stays.
                let pool = &mut g.pools[a];
                pool.table.remove(&key);
                pool.frames[f] = old;
                if let Some(k) = old.key {
                    pool.table.insert(k, f);
                    g.entry_mut(self.home_of(k), k).holders |= 1 << a;
                }
                g.release(h, key);
                Err(e)
            }
            (Ok(()), Err(e)) => {
                g.pools[a].table.remove(&key);
                g.pools[a].frames[f] = Frame::default();
                g.release(h, key);
                Err(e)
            }
            (Ok(()), Ok(())) => {
                let pool = &mut g.pools[a];
                // A whole-page write filled the frame with nothing: it is
                // valid once the write's bytes have landed (`done`), and
                // until then a read hit here must not copy out of it.
                pool.frames[f].valid = !matches!(want, Want::Write { whole: true });
                if source.is_some() {
                    pool.remote += 1;
                }
                g.entry_mut(h, key).holders |= 1 << a;
                if want == Want::Read {
                    g.release(h, key);
                    Ok(f)
                } else {
                    return self.sole_copy(g, a, key, f);
                }
            }
        };
        drop(g);
        self.shared.changed.notify_all();
        r
    }

    /// Invalidates every copy of `key` but accelerator `a`'s (frame `f`,
    /// pinned, the record owned), waiting for reads copying out of them.
    /// Their dirt needs no keeping: `f` holds the same bytes, and the write
    /// that follows leaves it dirty or writes the whole page through.
    fn sole_copy(
        &self,
        mut g: MutexGuard<'_, Inner>,
        a: usize,
        key: Key,
        f: usize,
    ) -> Result<usize> {
        let h = self.home_of(key);
        loop {
            let others = g.entry(h, key).holders & !(1 << a);
            if others == 0 {
                break;
            }
            let mut pinned = false;
            for b in (0..self.mems.len()).filter(|b| others & (1 << b) != 0) {
                let Some(&fb) = g.pools[b].table.get(&key) else {
                    g.entry_mut(h, key).holders &= !(1 << b);
                    continue;
                };
                let fr = &mut g.pools[b].frames[fb];
                // No new read pins it; the ones copying out finish first.
                fr.valid = false;
                if fr.pins > 0 {
                    pinned = true;
                    continue;
                }
                g.pools[b].frames[fb] = Frame::default();
                g.pools[b].table.remove(&key);
                g.entry_mut(h, key).holders &= !(1 << b);
                g.invalidations += 1;
            }
            if pinned {
                g = self.wait(g);
            }
        }
        drop(g);
        self.shared.changed.notify_all();
        Ok(f)
    }

    /// The frame of accelerator `a` the clock hand stops at: unpinned, its
    /// page not owned by an operation, and unreferenced since the hand last
    /// passed (a free frame at once).
    fn victim(&self, g: &mut Inner, a: usize) -> Option<usize> {
        let n = g.pools[a].frames.len();
        for _ in 0..2 * n + 1 {
            let f = g.pools[a].hand;
            g.pools[a].hand = (f + 1) % n;
            let fr = g.pools[a].frames[f];
            if fr.pins > 0 {
                continue;
            }
            if let Some(k) = fr.key {
                if g.entry(self.home_of(k), k).busy {
                    continue;
                }
            }
            if fr.key.is_none() || !fr.referenced {
                return Some(f);
            }
            g.pools[a].frames[f].referenced = false;
        }
        None
    }

    /// Unpins frame `f` of accelerator `a`; after a write, sets its dirty
    /// bit, marks it valid where the write's bytes landed, and releases
    /// the page's record. A frame a whole-page write filled with nothing
    /// and whose bytes did not land is dropped: it holds no page.
    fn done(&self, a: usize, f: usize, write: Option<Written>) {
        let mut g = self.lock();
        let fr = &mut g.pools[a].frames[f];
        fr.pins -= 1;
        if let Some(Written { key, dirty, landed }) = write {
            if landed {
                fr.valid = true;
                fr.dirty = dirty;
            } else if fr.valid {
                fr.dirty = dirty;
            } else {
                let h = self.home_of(key);
                let pool = &mut g.pools[a];
                pool.table.remove(&key);
                pool.frames[f] = Frame::default();
                g.entry_mut(h, key).holders &= !(1 << a);
            }
            g.release(self.home_of(key), key);
        }
        drop(g);
        self.shared.changed.notify_all();
    }

    /// Copies the bytes of `range` to or from `offset` of object `id`
    /// (checked by the caller), page by page, each page by one [`copy()`]
    /// between accelerator `a`'s copy of it and the memory (a read of
    /// several pages from GPU frames into GPU memory queues its copies on
    /// one stream and waits once). A read copies
    /// out of the copy; a write copies into it, the only copy once the
    /// write lands, dirty (and to storage as well under write-through).
    #[allow(clippy::too_many_arguments)]
    pub fn io(
        &self,
        dir: Direction,
        backing: &dyn Backing,
        map: &Map,
        a: usize,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
    ) -> Result<()> {
        let (mem, mem_at, n) = (range.mem(), range.offset(), range.len());
        self.check(a)?;
        if dir == Direction::Read && n > self.page as usize {
            if let (Some(dst), Some(_)) = (mem.gpu(), self.mems[a].gpu()) {
                // Several pages from GPU frames into GPU memory: the copies
                // queued on one stream of the buffer's device, waited for
                // once, not page by page.
                return dst.ctx.with_stream(|s| {
                    // SAFETY: This call's own stream of `range`'s device,
                    // waited for before `range`'s borrow ends.
                    #[allow(unsafe_code)]
                    let r = unsafe {
                        self.read_on_stream(backing, map, a, id, offset, range, s.as_raw())
                    };
                    let waited = s.synchronize();
                    r.and(waited)
                });
            }
        }
        let size = map.get(id).ok_or_else(|| no_object(id))?.size;
        let mut done = 0usize;
        while done < n {
            let (page, in_page, len) = self.piece(offset, done, n);
            let key = (id, page);
            let want = match dir {
                Direction::Read => Want::Read,
                Direction::Write => Want::Write {
                    whole: self.covers(page, in_page, len, size),
                },
            };
            let f = self.acquire(backing, map, a, key, want)?;
            let frame = f * self.page as usize + in_page;
            let cached = self.mems[a].as_ref();
            let r = match dir {
                Direction::Read => {
                    let r = copy(cached, frame, mem, mem_at + done, len);
                    self.done(a, f, None);
                    r
                }
                Direction::Write => {
                    let copied = copy(mem, mem_at + done, cached, frame, len);
                    // Dirty unless written through; a failed write-through
                    // leaves the new bytes dirty for the next write-back.
                    let landed = copied.is_ok();
                    let (r, dirty) = match copied {
                        Ok(()) if self.policy == WritePolicy::WriteThrough => {
                            match self.page_io(Direction::Write, backing, map, a, f, key) {
                                Ok(_) => (Ok(()), false),
                                Err(e) => (Err(e), true),
                            }
                        }
                        Ok(()) => (Ok(()), true),
                        Err(e) => (Err(e), true),
                    };
                    self.done(a, f, Some(Written { key, dirty, landed }));
                    r
                }
            };
            r?;
            done += len;
        }
        Ok(())
    }

    /// [`PageCache::io`]'s read, its copies out of accelerator `a`'s frames
    /// queued on `stream` (a caller's `CUstream` of the device `range` is
    /// in; null: the legacy default stream) rather than made before it
    /// returns: a kernel the caller queues on the stream afterwards sees
    /// the bytes, and no host thread waits for them. Misses are filled
    /// first, as for any read. The frames stay pinned (never evicted or
    /// rewritten) until the stream has run the copies, and the cache is not
    /// freed before. Both the cache's memory and `range`'s must be GPU
    /// memory.
    ///
    /// On an error, the copies already queued still land.
    ///
    /// # Safety
    /// `stream` is a live stream of `range`'s device (or a default-stream
    /// handle), and `range`'s memory stays allocated, and unused by any
    /// other writer, until the stream has run the copies.
    #[allow(clippy::too_many_arguments, unsafe_code)]
    pub unsafe fn read_on_stream(
        &self,
        backing: &dyn Backing,
        map: &Map,
        a: usize,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
        stream: *mut std::ffi::c_void,
    ) -> Result<()> {
        let (mem_at, n) = (range.offset(), range.len());
        let (dst, frames, _) = self.on_gpus(map, a, id, offset, &range)?;
        let batch = self.stream_batch(a);
        let mut done = 0usize;
        while done < n {
            let mut pinned = Vec::new();
            // (destination offset, frame offset, length), adjacent ones
            // merged into one copy.
            let mut runs: Vec<(usize, usize, usize)> = Vec::new();
            let mut result = Ok(());
            while done < n && pinned.len() < batch {
                let (page, in_page, len) = self.piece(offset, done, n);
                let f = match self.acquire(backing, map, a, (id, page), Want::Read) {
                    Ok(f) => f,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                };
                pinned.push((f, None));
                let frame = f * self.page as usize + in_page;
                match runs.last_mut() {
                    Some(r) if r.0 + r.2 == mem_at + done && r.1 + r.2 == frame => r.2 += len,
                    _ => runs.push((mem_at + done, frame, len)),
                }
                done += len;
            }
            if result.is_ok() {
                // SAFETY: The frames are pinned until the stream has run
                // the copies (below); the caller vouches for the stream and
                // `range`.
                result = unsafe { gpu::copy_runs_on(dst, frames, &runs, stream) };
            }
            // SAFETY: The caller vouches for the stream, of `dst`'s device.
            unsafe { self.after_stream(dst, stream, a, pinned, result) }?;
        }
        Ok(())
    }

    /// [`PageCache::io`]'s write, its copies from `range` into accelerator
    /// `a`'s frames queued on `stream` (a caller's `CUstream` of the device
    /// `range` is in) after the work queued on it before (the kernel that
    /// produced the bytes), and the call returns without waiting. Each page
    /// is owned by the write until the stream has copied it: a read or
    /// write of it anywhere waits, then sees the new bytes; the pages are
    /// dirty, written back by the next flush. With write-through, the
    /// stream is waited for first and the write made as [`PageCache::io`]
    /// makes it. Both memories must be GPU memory.
    ///
    /// # Safety
    /// As for [`PageCache::read_on_stream`]; `range` holds the bytes once
    /// the work queued on the stream before has run, and no one writes it
    /// until the stream has run the copies.
    #[allow(clippy::too_many_arguments, unsafe_code)]
    pub unsafe fn write_on_stream(
        &self,
        backing: &dyn Backing,
        map: &Map,
        a: usize,
        id: u64,
        offset: u64,
        range: MemRange<'_>,
        stream: *mut std::ffi::c_void,
    ) -> Result<()> {
        let (mem_at, n) = (range.offset(), range.len());
        let (src, frames, size) = self.on_gpus(map, a, id, offset, &range)?;
        if self.policy == WritePolicy::WriteThrough {
            // SAFETY: The caller vouches for the stream.
            src.ctx
                .enter()
                .and_then(|e| unsafe { gpu::stream_synchronize(&e, stream) })?;
            return self.io(Direction::Write, backing, map, a, id, offset, range);
        }
        let batch = self.stream_batch(a);
        let mut owned = Vec::new();
        let mut result = Ok(());
        let mut done = 0usize;
        while done < n {
            let (page, in_page, len) = self.piece(offset, done, n);
            let key = (id, page);
            let whole = self.covers(page, in_page, len, size);
            let f = match self.acquire(backing, map, a, key, Want::Write { whole }) {
                Ok(f) => f,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            // Not valid until the stream has copied: a read hit on this
            // accelerator then waits for the page's record, as anyone
            // else does.
            let before = {
                let mut g = self.lock();
                let fr = &mut g.pools[a].frames[f];
                let before = (fr.valid, fr.dirty);
                fr.valid = false;
                before
            };
            let frame = f * self.page as usize + in_page;
            // SAFETY: The page is this write's until the stream has run
            // the copy (below); the caller vouches for the stream and
            // `range`.
            let queued =
                unsafe { gpu::copy_between_on(frames, frame, src, mem_at + done, len, stream) };
            if let Err(e) = queued {
                // Nothing will land in this frame: as it was (or dropped,
                // if the write had mapped it empty).
                self.lock().pools[a].frames[f].valid = before.0;
                let written = Written {
                    key,
                    dirty: before.1,
                    landed: false,
                };
                self.done(a, f, Some(written));
                result = Err(e);
                break;
            }
            owned.push((f, Some((self.home_of(key), key))));
            done += len;
            if owned.len() >= batch && done < n {
                // Half the frames owned: let the stream run these first,
                // so that the next pages find victims.
                // SAFETY: As above.
                unsafe { self.after_stream(src, stream, a, std::mem::take(&mut owned), Ok(())) }?;
            }
        }
        // SAFETY: As above.
        unsafe { self.after_stream(src, stream, a, owned, result) }
    }

    /// Where byte `done` of an access of `n` bytes at `offset` of an object
    /// falls: its page, its offset in the page, and how many of the
    /// access's bytes that page holds from there.
    fn piece(&self, offset: u64, done: usize, n: usize) -> (u64, usize, usize) {
        let at = offset + done as u64;
        let (page, in_page) = (at / self.page, (at % self.page) as usize);
        (page, in_page, (self.page as usize - in_page).min(n - done))
    }

    /// Whether `len` bytes at `in_page` of `page` cover every byte of the
    /// page an object of `size` bytes holds: a write of them need not read
    /// the page first.
    fn covers(&self, page: u64, in_page: usize, len: usize, size: u64) -> bool {
        let at = page * self.page + in_page as u64;
        in_page == 0 && at + len as u64 >= ((page + 1) * self.page).min(size)
    }

    /// The most frames one stream-ordered call keeps pinned at a time, half
    /// of accelerator `a`'s: the next ones' misses find victims once the
    /// stream has run the copies of the last.
    fn stream_batch(&self, a: usize) -> usize {
        (self.mems[a].len() / self.page as usize / 2).max(1)
    }

    /// For a stream-ordered call on accelerator `a` of `range` at `offset`
    /// of object `id`: `range`'s memory and the accelerator's frames as the
    /// GPUs address them, and the object's size. Refused unless both are
    /// GPU memory and the range lies in the object.
    fn on_gpus<'m>(
        &'m self,
        map: &Map,
        a: usize,
        id: u64,
        offset: u64,
        range: &MemRange<'m>,
    ) -> Result<(gpu::DeviceRange<'m>, gpu::DeviceRange<'m>, u64)> {
        self.check(a)?;
        let mem = range.mem();
        let (Some(buf), Some(frames)) = (mem.gpu(), self.mems[a].gpu()) else {
            return Err(Error::InvalidArgument(format!(
                "a stream-ordered read or write needs the cache and the buffer in GPU memory ({} and {})",
                self.mems[a].kind(),
                mem.kind()
            )));
        };
        let size = map.get(id).ok_or_else(|| no_object(id))?.size;
        crate::error::check_within(&format!("object {id}"), offset, range.len() as u64, size)?;
        Ok((buf, frames, size))
    }

    /// Hands `frames` (pinned, and for writes their pages owned) to a host
    /// function on `stream` that lets them go once the copies queued before
    /// it have run; where it cannot be queued, waits for the stream here
    /// and lets them go. Returns `result`, or the error of queueing it.
    ///
    /// # Safety
    /// `stream` is a live stream of `on`'s device, or a default-stream
    /// handle.
    #[allow(unsafe_code)]
    unsafe fn after_stream(
        &self,
        on: gpu::DeviceRange<'_>,
        stream: *mut std::ffi::c_void,
        a: usize,
        frames: Vec<(usize, Option<(usize, Key)>)>,
        result: Result<()>,
    ) -> Result<()> {
        if frames.is_empty() {
            return result;
        }
        {
            let mut g = self.lock();
            g.on_streams += 1;
            if frames.iter().any(|(_, w)| w.is_some()) {
                g.stream_writes += 1;
            }
        }
        let job = Box::new(Unpin {
            shared: self.shared.clone(),
            a,
            frames,
        });
        let data = Box::into_raw(job).cast::<std::ffi::c_void>();
        // SAFETY: `unpin` takes back the box, once, on the stream's driver
        // thread, and calls no CUDA.
        let launched = on
            .ctx
            .enter()
            .and_then(|e| unsafe { gpu::launch_host_func(&e, stream, unpin, data) });
        if let Err(e) = launched {
            // Nothing will run `unpin`: wait for the copies here, then let
            // the frames go.
            // SAFETY: As the caller vouches for the stream.
            let _ = on
                .ctx
                .enter()
                .and_then(|e| unsafe { gpu::stream_synchronize(&e, stream) });
            // SAFETY: Not handed to the driver: ours to take back.
            unsafe { unpin(data) };
            return result.and(Err(e));
        }
        result
    }

    /// Writes back every dirty page of `id` (every object's when `None`),
    /// and waits for evictions writing dirty pages back: when it returns,
    /// every write that returned before it was called is on storage.
    pub fn write_back_dirty(
        &self,
        backing: &dyn Backing,
        map: &Map,
        id: Option<u64>,
    ) -> Result<()> {
        let mine = |k: &Key| id.is_none_or(|i| i == k.0);
        // The dirty pages as of now, each owned, pinned and marked clean
        // while it is written.
        let pages: Vec<(usize, usize, Key)> = {
            let mut g = self.lock();
            loop {
                let pages: Vec<(usize, usize, Key)> = (0..g.pools.len())
                    .flat_map(|a| {
                        g.pools[a]
                            .frames
                            .iter()
                            .enumerate()
                            .filter(|(_, fr)| fr.dirty)
                            .filter_map(move |(f, fr)| Some((a, f, fr.key?)))
                    })
                    .filter(|(_, _, k)| mine(k))
                    .collect();
                // Writes a caller's stream has yet to copy count as
                // written: wait for them.
                let busy = pages
                    .iter()
                    .any(|&(_, _, k)| g.entry(self.home_of(k), k).busy)
                    || g.evicting.iter().any(mine)
                    || g.stream_writes > 0;
                if busy {
                    g = self.wait(g);
                    continue;
                }
                for &(a, f, k) in &pages {
                    g.pools[a].frames[f].pins += 1;
                    g.pools[a].frames[f].dirty = false;
                    g.entry_mut(self.home_of(k), k).busy = true;
                }
                break pages;
            }
        };
        let mut first_err = None;
        for &(a, f, key) in &pages {
            let r = self.page_io(Direction::Write, backing, map, a, f, key);
            let mut g = self.lock();
            g.pools[a].frames[f].pins -= 1;
            if let Err(e) = r {
                g.pools[a].frames[f].dirty = true;
                first_err.get_or_insert(e);
            }
            g.release(self.home_of(key), key);
            drop(g);
            self.shared.changed.notify_all();
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Drops every cached copy of `id`'s pages from page `first_page` on,
    /// on every accelerator, without writing them back (the object was
    /// deleted or shrunk); waits for operations using them.
    pub fn invalidate(&self, id: u64, first_page: u64) {
        let gone = |k: &Key| k.0 == id && k.1 >= first_page;
        let mut g = self.lock();
        loop {
            let owned = g
                .homes
                .iter()
                .any(|h| h.iter().any(|(k, e)| gone(k) && e.busy));
            let pinned = g.pools.iter().any(|p| {
                p.table
                    .iter()
                    .any(|(k, &f)| gone(k) && p.frames[f].pins > 0)
            });
            if owned || pinned {
                g = self.wait(g);
                continue;
            }
            for p in &mut g.pools {
                let keys: Vec<(Key, usize)> = p
                    .table
                    .iter()
                    .filter(|(k, _)| gone(k))
                    .map(|(k, f)| (*k, *f))
                    .collect();
                for (k, f) in keys {
                    p.table.remove(&k);
                    p.frames[f] = Frame::default();
                }
            }
            for h in &mut g.homes {
                h.retain(|k, _| !gone(k));
            }
            return;
        }
    }
}
