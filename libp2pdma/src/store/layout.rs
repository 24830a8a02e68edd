//! The store's layout on the device, and its superblock.
//!
//! Blocks of [`BLOCK`] bytes, from the start of the device:
//!
//! | blocks | what |
//! | --- | --- |
//! | 0, 1 | two superblock slots |
//! | `2 .. 2 + m` | map region 0 |
//! | `2 + m .. 2 + 2m` | map region 1 |
//! | `2 + 2m ..` | object data |
//!
//! A superblock names its generation and the map region holding that
//! generation's map, with the map's length and checksum; generation `g`
//! lives in slot `g % 2` and its map in region `g % 2`. Committing
//! generation `g + 1` writes the map to the region no valid superblock of
//! generation `g` points to, flushes, then writes the superblock slot and
//! flushes again. A torn or lost superblock or map write therefore leaves
//! generation `g` whole; [`pick`] takes the newest generation whose
//! superblock and map both check.

use crate::{Error, Result};

/// Bytes per block of the layout.
pub const BLOCK: u64 = 4096;
/// What a superblock starts with.
pub const MAGIC: [u8; 8] = *b"P2PSTORE";
/// The layout's version.
pub const VERSION: u32 = 1;
/// Bytes of a superblock that carry data (the rest of its block is zero).
const SUPER_LEN: usize = 64;

/// One superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Which commit it records; higher is newer.
    pub generation: u64,
    /// Blocks of the whole store.
    pub total_blocks: u64,
    /// Blocks of each map region.
    pub map_blocks: u64,
    /// Bytes of the map in its region.
    pub map_len: u32,
    /// CRC-32 of those bytes.
    pub map_crc: u32,
}

impl Superblock {
    /// The map region of this generation (0 or 1).
    pub fn region(&self) -> u64 {
        self.generation % 2
    }

    /// The slot this generation is written to (0 or 1).
    pub fn slot(&self) -> u64 {
        self.generation % 2
    }

    /// The first block of map region `r`.
    pub fn region_start(&self, r: u64) -> u64 {
        2 + r * self.map_blocks
    }

    /// The first data block.
    pub fn data_start(&self) -> u64 {
        2 + 2 * self.map_blocks
    }

    /// The superblock as it is written: one block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(BLOCK as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..32].copy_from_slice(&self.total_blocks.to_le_bytes());
        b[32..40].copy_from_slice(&self.map_blocks.to_le_bytes());
        b[40..44].copy_from_slice(&self.map_len.to_le_bytes());
        b[44..48].copy_from_slice(&self.map_crc.to_le_bytes());
        let crc = checksum(&b[..SUPER_LEN - 4]);
        b[SUPER_LEN - 4..SUPER_LEN].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The superblock in `b` (a block), if it is one of this version whose
    /// checksum holds.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b = b.get(..SUPER_LEN)?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if b[0..8] != MAGIC
            || u32_at(8) != VERSION
            || u64::from(u32_at(12)) != BLOCK
            || u32_at(SUPER_LEN - 4) != checksum(&b[..SUPER_LEN - 4])
        {
            return None;
        }
        Some(Self {
            generation: u64_at(16),
            total_blocks: u64_at(24),
            map_blocks: u64_at(32),
            map_len: u32_at(40),
            map_crc: u32_at(44),
        })
    }

    /// Whether its numbers describe a layout that fits `device_blocks`.
    pub fn fits(&self, device_blocks: u64) -> Result<()> {
        let data = self
            .map_blocks
            .checked_mul(2)
            .and_then(|m| m.checked_add(2));
        match data {
            Some(d) if self.map_blocks > 0 && d < self.total_blocks && self.total_blocks <= device_blocks => {
                if u64::from(self.map_len) <= self.map_blocks * BLOCK {
                    Ok(())
                } else {
                    Err(Error::InvalidArgument("store superblock: the map is longer than its region".into()))
                }
            }
            _ => Err(Error::InvalidArgument(format!(
                "store superblock: {} map blocks and {} blocks do not fit a device of {device_blocks} blocks",
                self.map_blocks, self.total_blocks
            ))),
        }
    }
}

/// The CRC-32 the store checksums its superblocks and maps with.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The newest generation among the two slots whose superblock checks and
/// whose map `map_ok` accepts.
pub fn pick(
    slots: [Option<Superblock>; 2],
    mut map_ok: impl FnMut(&Superblock) -> bool,
) -> Option<Superblock> {
    let mut valid: Vec<Superblock> = slots.into_iter().flatten().collect();
    valid.sort_by_key(|s| std::cmp::Reverse(s.generation));
    valid.into_iter().find(|s| map_ok(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(generation: u64) -> Superblock {
        Superblock {
            generation,
            total_blocks: 1000,
            map_blocks: 4,
            map_len: 40,
            map_crc: 7,
        }
    }

    #[test]
    fn superblocks_round_trip_and_reject_any_flipped_byte() {
        let s = sb(5);
        let b = s.encode();
        assert_eq!(Superblock::decode(&b), Some(s));
        for i in 0..SUPER_LEN {
            let mut t = b.clone();
            t[i] ^= 0x40;
            assert_eq!(Superblock::decode(&t), None, "byte {i}");
        }
        assert_eq!(Superblock::decode(&vec![0u8; BLOCK as usize]), None);
    }

    #[test]
    fn the_newest_generation_whose_map_checks_wins() {
        assert_eq!(pick([Some(sb(4)), Some(sb(5))], |_| true), Some(sb(5)));
        assert_eq!(
            pick([Some(sb(4)), Some(sb(5))], |s| s.generation != 5),
            Some(sb(4))
        );
        assert_eq!(pick([None, Some(sb(3))], |_| true), Some(sb(3)));
        assert_eq!(pick([None, None], |_| true), None);
        assert_eq!((sb(6).slot(), sb(7).region()), (0, 1));
    }
}
