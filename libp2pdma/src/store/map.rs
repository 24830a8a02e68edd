//! The object map: every object's id, extent and size, and the allocator
//! that hands out extents. The free space is what no object holds, so the
//! map alone is persisted and space freed by a commit is reused after it.

use std::collections::BTreeMap;

use super::layout::{checksum, BLOCK};
use crate::{Error, Result};

/// Bytes of the map's header: the next id and the object count.
const HEADER: usize = 16;
/// Bytes of one object's entry: id, first block, blocks, size.
const ENTRY: usize = 32;

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
        (blocks * BLOCK).saturating_sub(HEADER as u64) / ENTRY as u64
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

    /// The first free run of `blocks` blocks (first fit), skipping the
    /// extent of `except`.
    fn find(&self, blocks: u64, except: Option<u64>) -> Option<u64> {
        let mut taken: Vec<(u64, u64)> = self
            .objects
            .iter()
            .filter(|(id, _)| Some(**id) != except)
            .map(|(_, e)| (e.start, e.end()))
            .collect();
        taken.sort_unstable();
        let mut at = self.data_start;
        for (s, e) in taken {
            if s >= at + blocks {
                return Some(at);
            }
            at = at.max(e);
        }
        (self.end >= at + blocks).then_some(at)
    }

    /// Adds an object of `size` bytes at the first free run that holds it;
    /// its id and extent.
    pub fn create(&mut self, size: u64) -> Result<(u64, Extent)> {
        let blocks = blocks_for(size);
        let start = self.find(blocks, None).ok_or_else(|| self.no_room(size))?;
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
    pub fn resize(&mut self, id: u64, size: u64) -> Result<(Extent, Extent)> {
        let old = self.get(id).ok_or_else(|| no_object(id))?;
        let blocks = blocks_for(size);
        let grows_in_place = blocks <= old.blocks
            || self
                .objects
                .iter()
                .filter(|(other, _)| **other != id)
                .all(|(_, e)| e.end() <= old.start || e.start >= old.start + blocks)
                && old.start + blocks <= self.end;
        let start = if grows_in_place {
            old.start
        } else {
            self.find(blocks, Some(id))
                .ok_or_else(|| self.no_room(size))?
        };
        let new = Extent {
            start,
            blocks,
            size,
        };
        self.objects.insert(id, new);
        Ok((old, new))
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
        let (a, ea) = m.create(3 * BLOCK).unwrap();
        let (b, eb) = m.create(1).unwrap();
        let (_, ec) = m.create(2 * BLOCK + 1).unwrap();
        assert_eq!((ea.start, eb.start, ec.start), (10, 13, 14));
        m.delete(a).unwrap();
        let (_, ed) = m.create(2 * BLOCK).unwrap();
        assert_eq!(ed.start, 10);
        assert!(m.delete(a).is_err());
        let (old, new) = m.resize(b, 3 * BLOCK).unwrap();
        assert_eq!((old.start, new.start, new.blocks), (13, 17, 3));
        assert!(m.create(200 * BLOCK).is_err());
        assert_eq!(m.free_blocks(), 90 - 2 - 3 - 3);
    }

    #[test]
    fn maps_round_trip_and_refuse_unsound_ones() {
        let mut m = Map::new(10, 100);
        for s in [5, BLOCK, 3 * BLOCK + 7] {
            m.create(s).unwrap();
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
