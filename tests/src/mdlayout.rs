//! Where the bytes of an md array lie on its members: the host's model of
//! md's raid0, raid1 and raid10 (near copies) layouts, used to check what a
//! guest read from or wrote to an array in each member's image.
//!
//! The guest describes an array as `LEVEL,CHUNK,IMAGE:DATA_OFFSET,...`
//! (members in slot order, the chunk and the data offsets in bytes, read
//! from the array's sysfs directory); `raid10` takes an optional `nN` after
//! the level (`raid10n2`, the default: two near copies).

/// An md array's layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub level: Level,
    /// Chunk size in bytes (raid0 and raid10).
    pub chunk: u64,
    /// Each member, in slot order: its image's file name and where the
    /// array's data starts on it, in bytes.
    pub members: Vec<(String, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Raid0,
    Raid1,
    /// Near layout with this many copies of each chunk.
    Raid10 {
        near: u64,
    },
}

/// A run of the array's bytes in one place of one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which copy this is (0 for raid0; 0.. for mirrors).
    pub copy: u64,
    /// Slot of the member.
    pub member: usize,
    /// Offset in the member's image (its data offset included).
    pub member_offset: u64,
    pub array_offset: u64,
    pub len: u64,
}

impl Layout {
    /// Parses the guest's description (see the module's documentation).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut parts = spec.split(',');
        let level = match parts.next().unwrap_or_default() {
            "raid0" => Level::Raid0,
            "raid1" => Level::Raid1,
            l if l.starts_with("raid10") => {
                let near = match &l[6..] {
                    "" => 2,
                    n => n
                        .strip_prefix('n')
                        .and_then(|n| n.parse().ok())
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| format!("{l}: only raid10's near layouts (raid10nN)"))?,
                };
                Level::Raid10 { near }
            }
            l => return Err(format!("level {l:?}: raid0, raid1 or raid10 only")),
        };
        let chunk = parts
            .next()
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| format!("{spec}: no chunk size after the level"))?;
        let members = parts
            .map(|m| {
                let (img, off) = m
                    .rsplit_once(':')
                    .ok_or_else(|| format!("member {m:?} is not IMAGE:DATA_OFFSET"))?;
                let off = off
                    .parse()
                    .map_err(|_| format!("member {m:?}: bad data offset"))?;
                Ok((img.to_string(), off))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let layout = Self {
            level,
            chunk,
            members,
        };
        layout.check()?;
        Ok(layout)
    }

    fn check(&self) -> Result<(), String> {
        let n = self.members.len() as u64;
        if n == 0 {
            return Err("an array without members".into());
        }
        let striped = self.level != Level::Raid1;
        if striped && (self.chunk == 0 || !self.chunk.is_power_of_two()) {
            return Err(format!("chunk {} is not a power of two", self.chunk));
        }
        if let Level::Raid10 { near } = self.level {
            if near > n {
                return Err(format!("{near} near copies on {n} members"));
            }
        }
        Ok(())
    }

    /// How many copies of each byte the array keeps.
    pub fn copies(&self) -> u64 {
        match self.level {
            Level::Raid0 => 1,
            Level::Raid1 => self.members.len() as u64,
            Level::Raid10 { near } => near,
        }
    }

    /// Every place the `len` bytes at `array_offset` lie, each copy of each
    /// run, in order of array offset, then copy.
    pub fn pieces(&self, array_offset: u64, len: u64) -> Vec<Piece> {
        let n = self.members.len() as u64;
        let data = |slot: u64, off: u64| self.members[slot as usize].1 + off;
        let mut out = Vec::new();
        if self.level == Level::Raid1 {
            for copy in 0..n {
                out.push(Piece {
                    copy,
                    member: copy as usize,
                    member_offset: data(copy, array_offset),
                    array_offset,
                    len,
                });
            }
            return out;
        }
        let (chunk, near) = match self.level {
            Level::Raid10 { near } => (self.chunk, near),
            _ => (self.chunk, 1),
        };
        let (mut at, end) = (array_offset, array_offset + len);
        while at < end {
            let index = at / chunk;
            let within = at % chunk;
            let run = (chunk - within).min(end - at);
            for copy in 0..near {
                let position = index * near + copy;
                let (slot, row) = (position % n, position / n);
                out.push(Piece {
                    copy,
                    member: slot as usize,
                    member_offset: data(slot, row * chunk + within),
                    array_offset: at,
                    len: run,
                });
            }
            at += run;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same layouts, written as md's code walks them one sector at a
    /// time: a different computation to check `pieces` against.
    fn places_of_sector(l: &Layout, sector: u64) -> Vec<(usize, u64)> {
        let n = l.members.len() as u64;
        let per_chunk = l.chunk / 512;
        match l.level {
            Level::Raid1 => (0..n)
                .map(|d| (d as usize, l.members[d as usize].1 / 512 + sector))
                .collect(),
            Level::Raid0 => {
                let chunk = sector / per_chunk;
                let dev = chunk % n;
                let dev_sector = (chunk / n) * per_chunk + sector % per_chunk;
                vec![(dev as usize, l.members[dev as usize].1 / 512 + dev_sector)]
            }
            Level::Raid10 { near } => {
                // raid10.c, __raid10_find_phys with one far copy.
                let chunk = sector / per_chunk * near;
                let mut dev = chunk % n;
                let mut s = (chunk / n) * per_chunk + sector % per_chunk;
                let mut out = Vec::new();
                for _ in 0..near {
                    out.push((dev as usize, l.members[dev as usize].1 / 512 + s));
                    dev += 1;
                    if dev >= n {
                        dev = 0;
                        s += per_chunk;
                    }
                }
                out
            }
        }
    }

    #[test]
    fn pieces_put_every_sector_where_md_does() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..400 {
            let n = rng.usize(1..=6);
            let level = match rng.u8(0..3) {
                0 => Level::Raid0,
                1 => Level::Raid1,
                _ => Level::Raid10 {
                    near: rng.u64(1..=n as u64),
                },
            };
            let layout = Layout {
                level,
                chunk: 512 << rng.u32(0..5),
                members: (0..n)
                    .map(|i| (format!("m{i}.img"), 512 * rng.u64(0..4096)))
                    .collect(),
            };
            let start = 512 * rng.u64(0..256);
            let len = 512 * rng.u64(1..256);
            let mut from_pieces = Vec::new();
            for p in layout.pieces(start, len) {
                assert_eq!(p.len % 512, 0);
                for s in 0..p.len / 512 {
                    from_pieces.push((
                        (p.array_offset / 512 + s, p.copy),
                        (p.member, p.member_offset / 512 + s),
                    ));
                }
            }
            from_pieces.sort();
            let mut walked = Vec::new();
            for sector in start / 512..(start + len) / 512 {
                for (copy, place) in places_of_sector(&layout, sector).into_iter().enumerate() {
                    walked.push(((sector, copy as u64), place));
                }
            }
            assert_eq!(from_pieces, walked, "{layout:?} at {start}+{len}");
        }
    }

    #[test]
    fn parses_what_the_guest_prints_and_refuses_the_rest() {
        let l = Layout::parse("raid10,65536,m0.img:1048576,m1.img:1048576,m2.img:2097152").unwrap();
        assert_eq!(l.level, Level::Raid10 { near: 2 });
        assert_eq!(l.chunk, 65536);
        assert_eq!(l.members[2], ("m2.img".into(), 2 << 20));
        assert_eq!(Layout::parse("raid1,0,a:0,b:0").unwrap().copies(), 2);
        for bad in [
            "raid5,65536,a:0",
            "raid0,65536",
            "raid0,1000,a:0",
            "raid0,x,a:0",
            "raid0,4096,a",
            "raid10n3,4096,a:0,b:0",
        ] {
            assert!(Layout::parse(bad).is_err(), "{bad} parsed");
        }
    }
}
