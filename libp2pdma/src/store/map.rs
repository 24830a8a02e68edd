//! The object map: every object's id, extent and size, and the allocator
//! that hands out extents. The free space is what no object holds, so the
//! map alone is persisted and space freed by a commit is reused after it.
//!
//! The allocator never hands out, and a resize never writes, a byte that
//! the map gives to a live object or that a caller says is held (bytes
//! reads without the map's lock are still reading): so a crash before the
//! next commit finds every committed object's bytes where they were, and a
//! read in flight finds the bytes it started on.

use std::collections::BTreeMap;

use super::layout::{checksum, BLOCK};
use crate::{Error, Result};

/// Bytes of the map's header: the next id and the object count.
const HEADER: usize = 16;
/// Bytes of one object's entry: id, first block, blocks, size.
const ENTRY: usize = 32;

/// Byte ranges `[start, end)` of the device that must not be written or
/// handed out: what reads in flight without the map's lock are reading.
pub type Held = [(u64, u64)];

/// Where an object lives and how large it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Its first block on the device.
    pub start: u64,
    /// Blocks reserved for it.
    pub blocks: u64,
    /// Its size in bytes (at most `blocks` blocks).
    pub size: u64,
}

impl Extent {
    /// One past its last block.
    pub fn end(&self) -> u64 {
        self.start + self.blocks
    }
}

/// One object as [`Map::objects`] lists it: what the document's
/// `get_object_map` hands to accelerator kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's id.
    pub id: u64,
    /// Its first block on the device, in [`BLOCK`]-byte blocks.
    pub start_block: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// The objects of a store, and the data blocks `[data_start, end)` they are
/// allocated from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Map {
    next_id: u64,
    objects: BTreeMap<u64, Extent>,
    data_start: u64,
    end: u64,
}

/// Blocks an object of `size` bytes takes (one at least, so that every
/// object has a place).
pub fn blocks_for(size: u64) -> u64 {
    size.div_ceil(BLOCK).max(1)
}

impl Map {
    /// An empty map over data blocks `[data_start, end)`.
    pub fn new(data_start: u64, end: u64) -> Self {
        Self {
            next_id: 1,
            objects: BTreeMap::new(),
            data_start,
            end,
        }
    }

    /// The most objects a map region of `blocks` blocks holds.
    pub fn capacity(blocks: u64) -> u64 {
        blocks.saturating_mul(BLOCK).saturating_sub(HEADER as u64) / ENTRY as u64
    }

    /// Blocks of a map region with room for `max_objects` objects, if that
    /// is a number of bytes at all.
    pub fn region_blocks(max_objects: u64) -> Option<u64> {
        max_objects
            .max(1)
            .checked_mul(ENTRY as u64)?
            .checked_add(HEADER as u64)
            .map(|b| b.div_ceil(BLOCK))
    }

    /// Object `id`'s extent.
    pub fn get(&self, id: u64) -> Option<Extent> {
        self.objects.get(&id).copied()
    }

    /// Every object, by id.
    pub fn objects(&self) -> Vec<ObjectInfo> {
        self.objects
            .iter()
            .map(|(&id, e)| ObjectInfo {
                id,
                start_block: e.start,
                size: e.size,
            })
            .collect()
    }

    /// Objects in the map.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether it holds no object.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Blocks no object holds.
    pub fn free_blocks(&self) -> u64 {
        let used: u64 = self.objects.values().map(|e| e.blocks).sum();
        self.end - self.data_start - used
    }

    /// The first run of `blocks` blocks (first fit) that no object holds
    /// and no byte of `held` lies in.
    fn find(&self, blocks: u64, held: &Held) -> Option<u64> {
        let mut taken: Vec<(u64, u64)> = self
            .objects
            .values()
            .map(|e| (e.start, e.end()))
            .chain(held.iter().map(|&(s, e)| (s / BLOCK, e.div_ceil(BLOCK))))
            .collect();
        taken.sort_unstable();
        let mut at = self.data_start;
        for (s, e) in taken {
            if s >= at.checked_add(blocks)? {
                break;
            }
            at = at.max(e);
        }
        (self.end >= at.checked_add(blocks)?).then_some(at)
    }

    /// Adds an object of `size` bytes at the first free run that holds it
    /// and no byte of `held`; its id and extent.
    pub fn create(&mut self, size: u64, held: &Held) -> Result<(u64, Extent)> {
        let blocks = blocks_for(size);
        let start = self.find(blocks, held).ok_or_else(|| self.no_room(size))?;
        let id = self.next_id;
        self.next_id += 1;
        let e = Extent {
            start,
            blocks,
            size,
        };
        self.objects.insert(id, e);
        Ok((id, e))
    }

    /// Removes object `id`; its extent.
    pub fn delete(&mut self, id: u64) -> Result<Extent> {
        self.objects.remove(&id).ok_or_else(|| no_object(id))
    }

    /// Object `id` at `size` bytes: in place when its own blocks or the free
    /// blocks after them hold it, else at a new extent (whose bytes the
    /// caller copies before committing). The old extent and the new one.
    ///
    /// What the caller writes before the commit (a new extent; in place,
    /// the bytes from the old size to the new one) is free in this map, past
    /// the object's committed size, and outside `held`: the old extent stays
    /// whole until the commit, whatever happens before it.
    pub fn resize(&mut self, id: u64, size: u64, held: &Held) -> Result<(Extent, Extent)> {
        let old = self.get(id).ok_or_else(|| no_object(id))?;
        let blocks = blocks_for(size);
        let start = if self.fits_in_place(id, &old, size, held) {
            old.start
        } else {
            // The object's own extent counts as taken: it is what a crash
            // before the commit keeps.
            self.find(blocks, held).ok_or_else(|| self.no_room(size))?
        };
        let new = Extent {
            start,
            blocks,
            size,
        };
        self.objects.insert(id, new);
        Ok((old, new))
    }

    /// Whether `old` can become `size` bytes where it is: its own blocks
    /// hold it, or the blocks after them are free, and the bytes a grow
    /// zeros (from its size on) are not held.
    fn fits_in_place(&self, id: u64, old: &Extent, size: u64, held: &Held) -> bool {
        if size <= old.size {
            return true;
        }
        let blocks = blocks_for(size);
        let Some(new_end) = old.start.checked_add(blocks) else {
            return false;
        };
        let room = blocks <= old.blocks
            || new_end <= self.end
                && self
                    .objects
                    .iter()
                    .filter(|(other, _)| **other != id)
                    .all(|(_, e)| e.end() <= old.start || e.start >= new_end);
        // The bytes a grow writes: zeros from the old size to the new one
        // in the old blocks, and the new blocks whole.
        let written = if blocks <= old.blocks {
            (old.start * BLOCK + old.size, old.start * BLOCK + size)
        } else {
            (old.start * BLOCK + old.size, new_end * BLOCK)
        };
        room && held.iter().all(|&(s, e)| e <= written.0 || s >= written.1)
    }

    fn no_room(&self, size: u64) -> Error {
        Error::InvalidArgument(format!(
            "the store has no free run of {} blocks for {size} bytes ({} blocks free in all)",
            blocks_for(size),
            self.free_blocks()
        ))
    }

    /// The map as it is written, and its checksum.
    pub fn encode(&self) -> (Vec<u8>, u32) {
        let mut b = Vec::with_capacity(HEADER + ENTRY * self.objects.len());
        b.extend_from_slice(&self.next_id.to_le_bytes());
        b.extend_from_slice(&(self.objects.len() as u64).to_le_bytes());
        for (&id, e) in &self.objects {
            for v in [id, e.start, e.blocks, e.size] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        let crc = checksum(&b);
        (b, crc)
    }

    /// The map in `b`, over data blocks `[data_start, end)`, if it is whole
    /// and sound: no extent outside the data blocks, none overlapping
    /// another, no size beyond its blocks.
    pub fn decode(b: &[u8], data_start: u64, end: u64) -> Option<Self> {
        let u64_at = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
        };
        let next_id = u64_at(0)?;
        let count = usize::try_from(u64_at(8)?).ok()?;
        if b.len() != HEADER.checked_add(count.checked_mul(ENTRY)?)? {
            return None;
        }
        let mut map = Self {
            next_id,
            objects: BTreeMap::new(),
            data_start,
            end,
        };
        let mut spans = Vec::with_capacity(count);
        for k in 0..count {
            let at = HEADER + k * ENTRY;
            let (id, start, blocks, size) = (
                u64_at(at)?,
                u64_at(at + 8)?,
                u64_at(at + 16)?,
                u64_at(at + 24)?,
            );
            let fits = blocks > 0
                && start >= data_start
                && start.checked_add(blocks)? <= end
                && size <= blocks.checked_mul(BLOCK)?
                && id > 0
                && id < next_id;
            if !fits
                || map
                    .objects
                    .insert(
                        id,
                        Extent {
                            start,
                            blocks,
                            size,
                        },
                    )
                    .is_some()
            {
                return None;
            }
            spans.push((start, start + blocks));
        }
        spans.sort_unstable();
        spans.windows(2).all(|w| w[0].1 <= w[1].0).then_some(map)
    }
}

/// The error for an id the map does not hold.
pub fn no_object(id: u64) -> Error {
    Error::InvalidArgument(format!("no object {id} in the store"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_space_is_reused_first_fit() {
        let mut m = Map::new(10, 100);
        let (a, ea) = m.create(3 * BLOCK, &[]).unwrap();
        let (b, eb) = m.create(1, &[]).unwrap();
        let (_, ec) = m.create(2 * BLOCK + 1, &[]).unwrap();
        assert_eq!((ea.start, eb.start, ec.start), (10, 13, 14));
        m.delete(a).unwrap();
        let (_, ed) = m.create(2 * BLOCK, &[]).unwrap();
        assert_eq!(ed.start, 10);
        assert!(m.delete(a).is_err());
        let (old, new) = m.resize(b, 3 * BLOCK, &[]).unwrap();
        assert_eq!((old.start, new.start, new.blocks), (13, 17, 3));
        assert!(m.create(200 * BLOCK, &[]).is_err());
        assert_eq!(m.free_blocks(), 90 - 2 - 3 - 3);
    }

    /// What a resize of `id` from `before` to `after` writes before its
    /// commit: the new extent when it moved, else the bytes a grow zeros.
    fn written(before: &Map, after: &Map, id: u64) -> Option<(u64, u64)> {
        let (old, new) = (before.get(id)?, after.get(id)?);
        if new.start != old.start {
            Some((new.start * BLOCK, new.end() * BLOCK))
        } else if new.size > old.size {
            let end = if new.blocks <= old.blocks {
                old.start * BLOCK + new.size
            } else {
                new.end() * BLOCK
            };
            Some((old.start * BLOCK + old.size, end))
        } else {
            None
        }
    }

    #[test]
    fn a_grow_that_moves_never_lands_on_its_own_blocks() {
        // P, X (two blocks each) and Y; P deleted: first fit over P's hole
        // and X's own blocks would overwrite X before the commit.
        let mut m = Map::new(10, 100);
        let (p, _) = m.create(2 * BLOCK, &[]).unwrap();
        let (x, ex) = m.create(2 * BLOCK, &[]).unwrap();
        m.create(BLOCK, &[]).unwrap();
        m.delete(p).unwrap();
        let before = m.clone();
        let (_, new) = m.resize(x, 4 * BLOCK, &[]).unwrap();
        assert!(
            new.start >= ex.end() || new.end() <= ex.start,
            "{new:?} over {ex:?}"
        );
        assert_eq!(new.start, 15);
        assert!(written(&before, &m, x).is_some());
    }

    #[test]
    fn held_bytes_are_neither_handed_out_nor_written() {
        let mut m = Map::new(10, 100);
        let (a, ea) = m.create(3 * BLOCK, &[]).unwrap();
        let (b, eb) = m.create(BLOCK / 2, &[]).unwrap();
        m.delete(a).unwrap();
        // A read of A's middle block is in flight.
        let held = [((ea.start + 1) * BLOCK + 10, (ea.start + 1) * BLOCK + 20)];
        let (_, ec) = m.create(BLOCK, &held).unwrap();
        assert_eq!(ec.start, ea.start);
        let (_, ed) = m.create(2 * BLOCK, &held).unwrap();
        assert!(ed.start >= ea.start + 2, "{ed:?}");
        // B shrank while a read of its second half was in flight: growing
        // it again would zero what that read reads, so it moves.
        m.resize(b, 100, &[]).unwrap();
        let held = [(eb.start * BLOCK + 200, eb.start * BLOCK + 300)];
        let before = m.clone();
        let (_, nb) = m.resize(b, 1000, &held).unwrap();
        assert_ne!(nb.start, eb.start);
        let w = written(&before, &m, b).unwrap();
        assert!(w.1 <= held[0].0 || w.0 >= held[0].1);
        // Unheld, it grows where it is.
        let mut m = before;
        assert_eq!(m.resize(b, 1000, &[]).unwrap().1.start, eb.start);
    }

    #[test]
    fn region_sizes_that_overflow_are_refused() {
        assert_eq!(Map::region_blocks(1), Some(1));
        assert_eq!(Map::region_blocks(127), Some(1));
        assert_eq!(Map::region_blocks(128), Some(2));
        for n in [1u64 << 59, (1 << 59) + 1, 3 << 59, u64::MAX] {
            assert_eq!(Map::region_blocks(n), None, "{n}");
        }
        assert!(Map::region_blocks(u64::MAX / 64).is_some());
    }

    proptest::proptest! {
        /// Random creates, deletes and resizes with random bytes held: no
        /// resize or create writes, before its commit, a byte that the map
        /// before it gives to a live object or that is held, and the map
        /// stays sound.
        #[test]
        fn nothing_committed_or_held_is_written_before_a_commit(
            ops in proptest::collection::vec((0u8..3, 0usize..64, 1u64..12 * BLOCK, proptest::option::of((0u64..60 * BLOCK, 1u64..3 * BLOCK))), 1..80)
        ) {
            let mut m = Map::new(10, 60);
            for (kind, k, size, hold) in ops {
                let held: Vec<(u64, u64)> = hold.map(|(s, n)| (10 * BLOCK + s, 10 * BLOCK + s + n)).into_iter().collect();
                let ids: Vec<u64> = m.objects.keys().copied().collect();
                let before = m.clone();
                let w = match kind {
                    0 => match m.create(size, &held) {
                        Ok((_, e)) => Some((e.start * BLOCK, e.end() * BLOCK)),
                        Err(_) => None,
                    },
                    1 if !ids.is_empty() => {
                        m.delete(ids[k % ids.len()]).unwrap();
                        None
                    }
                    _ if !ids.is_empty() => {
                        let id = ids[k % ids.len()];
                        match m.resize(id, size, &held) {
                            Ok(_) => written(&before, &m, id),
                            Err(_) => None,
                        }
                    }
                    _ => None,
                };
                if let Some((ws, we)) = w {
                    for (id, e) in &before.objects {
                        let (s, end) = (e.start * BLOCK, e.start * BLOCK + e.size);
                        proptest::prop_assert!(we <= s || ws >= end, "wrote {ws}..{we} over object {id} {e:?}");
                    }
                    for &(s, e) in &held {
                        proptest::prop_assert!(we <= s || ws >= e, "wrote {ws}..{we} over held {s}..{e}");
                    }
                }
                let (b, _) = m.encode();
                proptest::prop_assert_eq!(Map::decode(&b, 10, 60), Some(m.clone()));
            }
        }
    }

    #[test]
    fn maps_round_trip_and_refuse_unsound_ones() {
        let mut m = Map::new(10, 100);
        for s in [5, BLOCK, 3 * BLOCK + 7] {
            m.create(s, &[]).unwrap();
        }
        let (b, crc) = m.encode();
        assert_eq!(crc, checksum(&b));
        assert_eq!(Map::decode(&b, 10, 100), Some(m.clone()));
        assert_eq!(Map::decode(&b[..b.len() - 1], 10, 100), None);
        assert_eq!(Map::decode(&b, 12, 100), None);
        let mut overlap = b.clone();
        overlap[HEADER + ENTRY + 8..HEADER + ENTRY + 16].copy_from_slice(&10u64.to_le_bytes());
        assert_eq!(Map::decode(&overlap, 10, 100), None);
        assert!(Map::capacity(1) >= 127);
    }
}
