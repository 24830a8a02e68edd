//! The page cache of a store, in accelerator memory (or host memory): a
//! page table from object pages to frames of that memory, present only
//! while a page is cached; CLOCK replacement; dirty bits and write-back
//! (write-through on request).
//!
//! A miss takes a frame (evicting the first one the clock hand finds
//! unreferenced, writing it back first when it is dirty), reads the page
//! into it and maps it; a second thread missing the same page meanwhile
//! waits for that read instead of issuing its own. A hit copies between the
//! frame and the caller's memory with no system call. Frames in use by a
//! copy are pinned and never evicted.

use std::{
    collections::HashMap,
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use super::{
    backing::Backing,
    layout::BLOCK,
    map::{no_object, Map},
};
use crate::{memory::DeviceMemory, Error, Result};

/// An object page: the object's id and the page's index in it.
type Key = (u64, u64);

/// One frame of the cache's memory.
#[derive(Clone, Copy, Debug, Default)]
struct Frame {
    /// The page it holds.
    key: Option<Key>,
    /// Whether its bytes were read (or fully written) yet.
    valid: bool,
    /// Written since it was read or written back.
    dirty: bool,
    /// Copies and I/O using it now.
    pins: u32,
    /// CLOCK's reference bit.
    referenced: bool,
}

struct Inner {
    frames: Vec<Frame>,
    table: HashMap<Key, usize>,
    hand: usize,
    hits: u64,
    misses: u64,
}

/// Counters of a cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Page accesses served from a frame.
    pub hits: u64,
    /// Page accesses that read the page first.
    pub misses: u64,
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

/// A page cache in `mem`: `mem.len() / page` frames of `page` bytes.
pub struct PageCache {
    mem: Arc<dyn DeviceMemory>,
    page: u64,
    policy: WritePolicy,
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl std::fmt::Debug for PageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageCache")
            .field("page", &self.page)
            .field("stats", &self.stats())
            .finish()
    }
}

impl PageCache {
    /// A cache of `page`-byte pages (a power of two from 4 KiB to 2 MiB) in
    /// `mem`, which must hold at least two frames.
    pub fn new(mem: Arc<dyn DeviceMemory>, page: usize, policy: WritePolicy) -> Result<Self> {
        if !page.is_power_of_two() || !(BLOCK as usize..=2 << 20).contains(&page) {
            return Err(Error::InvalidArgument(format!(
                "a cache page of {page} bytes (a power of two from 4 KiB to 2 MiB)"
            )));
        }
        let n = mem.len() / page;
        if n < 2 {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of memory hold fewer than two {page}-byte pages",
                mem.len()
            )));
        }
        Ok(Self {
            mem,
            page: page as u64,
            policy,
            inner: Mutex::new(Inner {
                frames: vec![Frame::default(); n],
                table: HashMap::new(),
                hand: 0,
                hits: 0,
                misses: 0,
            }),
            changed: Condvar::new(),
        })
    }

    /// The page size.
    pub fn page_size(&self) -> usize {
        self.page as usize
    }

    /// Its counters.
    pub fn stats(&self) -> CacheStats {
        let g = self.lock();
        CacheStats {
            hits: g.hits,
            misses: g.misses,
            frames: g.frames.len(),
            cached: g.table.len(),
            dirty: g
                .frames
                .iter()
                .filter(|f| f.key.is_some() && f.dirty)
                .count(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        self.changed.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    /// The device offset and valid bytes of page `key`, from `map`.
    fn span(&self, map: &Map, key: Key) -> Result<(u64, usize)> {
        let e = map.get(key.0).ok_or_else(|| no_object(key.0))?;
        let start = key.1 * self.page;
        let valid = e.size.saturating_sub(start).min(self.page) as usize;
        Ok((e.start * BLOCK + start, valid))
    }

    /// Writes frame `f` (holding `key`) back to storage.
    fn write_back(&self, backing: &dyn Backing, map: &Map, f: usize, key: Key) -> Result<()> {
        let (at, valid) = self.span(map, key)?;
        if valid > 0 {
            backing.write(at, self.mem.as_ref(), f * self.page as usize, valid)?;
        }
        Ok(())
    }

    /// A frame holding page `key`, pinned; read from storage unless `whole`
    /// (the caller overwrites every valid byte of the page).
    fn get(&self, backing: &dyn Backing, map: &Map, key: Key, whole: bool) -> Result<usize> {
        let mut g = self.lock();
        loop {
            if let Some(&f) = g.table.get(&key) {
                let fr = &mut g.frames[f];
                if fr.valid && fr.key == Some(key) {
                    fr.pins += 1;
                    fr.referenced = true;
                    g.hits += 1;
                    return Ok(f);
                }
                // Being read, or being written back before the frame takes
                // another page: wait for that.
                g = self.wait(g);
                continue;
            }
            let Some(f) = Self::victim(&mut g) else {
                g = self.wait(g);
                continue;
            };
            g.misses += 1;
            let old = g.frames[f];
            g.frames[f] = Frame {
                key: Some(key),
                valid: false,
                dirty: false,
                pins: 1,
                referenced: true,
            };
            g.table.insert(key, f);
            // A dirty victim keeps its page mapped (and waited on) until
            // its bytes are back on storage; a clean one goes at once.
            let evicting = old.key.filter(|_| old.dirty);
            if let Some(k) = old.key.filter(|_| !old.dirty) {
                g.table.remove(&k);
            }
            drop(g);
            let written = match evicting {
                Some(k) => self.write_back(backing, map, f, k),
                None => Ok(()),
            };
            let filled = match written {
                Ok(()) => self.fill(backing, map, f, key, whole),
                Err(_) => Ok(()),
            };
            let mut g = self.lock();
            if let Some(k) = evicting {
                g.table.remove(&k);
            }
            let r = match (written, filled) {
                (Err(e), _) => {
                    // The victim's bytes are not on storage: it stays.
                    g.table.remove(&key);
                    g.frames[f] = old;
                    if let Some(k) = old.key {
                        g.table.insert(k, f);
                    }
                    Err(e)
                }
                (Ok(()), Err(e)) => {
                    g.table.remove(&key);
                    g.frames[f] = Frame::default();
                    Err(e)
                }
                (Ok(()), Ok(())) => {
                    g.frames[f].valid = true;
                    Ok(f)
                }
            };
            drop(g);
            self.changed.notify_all();
            return r;
        }
    }

    /// Reads `key` into frame `f`, zeroing what lies past the object's end
    /// (all of it when `whole`: the caller writes every valid byte).
    fn fill(
        &self,
        backing: &dyn Backing,
        map: &Map,
        f: usize,
        key: Key,
        whole: bool,
    ) -> Result<()> {
        let (at, valid) = self.span(map, key)?;
        let base = f * self.page as usize;
        let from = if whole { 0 } else { valid };
        if !whole && valid > 0 {
            backing.read(at, self.mem.as_ref(), base, valid)?;
        }
        if from < self.page as usize {
            let zeros = vec![0u8; self.page as usize - from];
            self.mem.write_at(base + from, &zeros)?;
        }
        Ok(())
    }

    /// The frame the clock hand stops at: unpinned, and unreferenced since
    /// the hand last passed (a free frame at once).
    fn victim(g: &mut Inner) -> Option<usize> {
        let n = g.frames.len();
        for _ in 0..2 * n + 1 {
            let f = g.hand;
            g.hand = (g.hand + 1) % n;
            let fr = &mut g.frames[f];
            if fr.pins > 0 {
                continue;
            }
            if fr.key.is_none() || !fr.referenced {
                return Some(f);
            }
            fr.referenced = false;
        }
        None
    }

    fn unpin(&self, f: usize, dirty: bool) {
        let mut g = self.lock();
        let fr = &mut g.frames[f];
        fr.pins -= 1;
        fr.dirty |= dirty;
        drop(g);
        self.changed.notify_all();
    }

    /// Copies `n` bytes at `offset` of object `id` (checked by the caller)
    /// into `mem` at `mem_offset`, page by page through the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        backing: &dyn Backing,
        map: &Map,
        id: u64,
        offset: u64,
        n: usize,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
    ) -> Result<()> {
        let mut done = 0usize;
        let mut buf = Vec::new();
        while done < n {
            let at = offset + done as u64;
            let (page, in_page) = (at / self.page, (at % self.page) as usize);
            let len = (self.page as usize - in_page).min(n - done);
            let f = self.get(backing, map, (id, page), false)?;
            buf.resize(len, 0);
            let r = self
                .mem
                .read_at(f * self.page as usize + in_page, &mut buf)
                .and_then(|()| mem.write_at(mem_offset + done, &buf));
            self.unpin(f, false);
            r?;
            done += len;
        }
        Ok(())
    }

    /// Copies `n` bytes of `mem` at `mem_offset` to `offset` of object `id`
    /// (checked by the caller), page by page: into the cache, dirty, and to
    /// storage as well under write-through.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        backing: &dyn Backing,
        map: &Map,
        id: u64,
        offset: u64,
        n: usize,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
    ) -> Result<()> {
        let size = map.get(id).ok_or_else(|| no_object(id))?.size;
        let mut done = 0usize;
        let mut buf = Vec::new();
        while done < n {
            let at = offset + done as u64;
            let (page, in_page) = (at / self.page, (at % self.page) as usize);
            let len = (self.page as usize - in_page).min(n - done);
            let page_end = ((page + 1) * self.page).min(size);
            let whole = in_page == 0 && at + len as u64 >= page_end;
            let f = self.get(backing, map, (id, page), whole)?;
            buf.resize(len, 0);
            let mut r = mem
                .read_at(mem_offset + done, &mut buf)
                .and_then(|()| self.mem.write_at(f * self.page as usize + in_page, &buf));
            let through = self.policy == WritePolicy::WriteThrough;
            if r.is_ok() && through {
                r = self.write_back(backing, map, f, (id, page));
            }
            self.unpin(f, r.is_ok() && !through);
            r?;
            done += len;
        }
        Ok(())
    }

    /// Writes back every dirty page of `id` (every object's when `None`).
    pub fn write_back_dirty(
        &self,
        backing: &dyn Backing,
        map: &Map,
        id: Option<u64>,
    ) -> Result<()> {
        // The dirty pages as of now, each pinned and marked clean while it
        // is written (a write meanwhile marks it dirty again).
        let pages: Vec<(usize, Key)> = {
            let mut g = self.lock();
            let pages: Vec<(usize, Key)> = g
                .frames
                .iter()
                .enumerate()
                .filter(|(_, fr)| fr.dirty && fr.valid)
                .filter_map(|(f, fr)| Some((f, fr.key?)))
                .filter(|(_, k)| id.is_none_or(|i| i == k.0))
                .collect();
            for &(f, _) in &pages {
                g.frames[f].pins += 1;
                g.frames[f].dirty = false;
            }
            pages
        };
        let mut first_err = None;
        for &(f, key) in &pages {
            let r = self.write_back(backing, map, f, key);
            let mut g = self.lock();
            g.frames[f].pins -= 1;
            if let Err(e) = r {
                g.frames[f].dirty = true;
                first_err.get_or_insert(e);
            }
            drop(g);
            self.changed.notify_all();
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Drops every cached page of `id` from page `first_page` on, without
    /// writing it back (the object was deleted or shrunk); waits for copies
    /// using them.
    pub fn invalidate(&self, id: u64, first_page: u64) {
        let mut g = self.lock();
        loop {
            let keys: Vec<(Key, usize)> = g
                .table
                .iter()
                .filter(|(k, _)| k.0 == id && k.1 >= first_page)
                .map(|(k, f)| (*k, *f))
                .collect();
            if keys.iter().any(|(_, f)| g.frames[*f].pins > 0) {
                g = self.wait(g);
                continue;
            }
            for (k, f) in keys {
                g.table.remove(&k);
                g.frames[f] = Frame::default();
            }
            return;
        }
    }
}
