//! Where an md array's bytes lie on its members, as far as the transfer
//! path needs it: to name the member an I/O error on the array came from.
//!
//! md reports a member's failure to the caller as the array's: `EIO` or
//! `ENODATA` on `/dev/md0`, nothing more. The library maps the failed range
//! through the array's layout (raid0, raid1, raid10 with near copies) to the
//! members that hold it, then asks them: a member whose controller is not
//! live, or whose own read of its piece fails, is the one named, with what
//! it said.

use std::{
    fs::{self, File},
    os::unix::fs::FileExt,
    path::Path,
};

use crate::discovery::MdArray;

/// An md array's layout: how its bytes map to its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ArrayLayout {
    /// The array's disk (`md0`).
    name: String,
    stripe: Stripe,
    /// The members by slot; `None` for a slot without one (a degraded
    /// array).
    legs: Vec<Option<Leg>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stripe {
    /// Every member holds every byte, at the same offset.
    Mirrored,
    /// Chunks go round the members, each kept `copies` times on
    /// consecutive members (raid0: once; raid10's near layouts: more).
    Striped { chunk: u64, copies: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Leg {
    /// The member's block device name (`nvme3n1`).
    name: String,
    /// Where the array's data starts on it, in bytes.
    data_offset: u64,
}

/// One run of the array's bytes on one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    slot: usize,
    /// Byte offset on the member (its data offset included).
    at: u64,
    len: u64,
}

/// One run of a striped layout's bytes on one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    /// Offset in the striped space.
    pub(crate) from: u64,
    /// The member's slot.
    pub(crate) slot: usize,
    /// Byte offset on the member, from where its striped data starts.
    pub(crate) at: u64,
    pub(crate) len: u64,
}

/// The runs of the `len` bytes at `offset` of a striped layout over `n`
/// members: chunk `i` of `chunk` bytes (a power of two), copy `c` of
/// `copies`, lies at position `p = i * copies + c`, on slot `p % n`, row
/// `p / n` (md's raid0 with equal members, and raid10's near layouts).
/// Each copy of each run, in order of offset.
pub(crate) fn stripe_runs(
    offset: u64,
    len: u64,
    chunk: u64,
    copies: u64,
    n: u64,
) -> impl Iterator<Item = Run> {
    let end = offset.saturating_add(len);
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let (index, within) = (at / chunk, at % chunk);
        let run = (chunk - within).min(end - at);
        let from = at;
        at += run;
        Some((0..copies).map(move |copy| {
            let position = index * copies + copy;
            Run {
                from,
                slot: (position % n) as usize,
                at: position / n * chunk + within,
                len: run,
            }
        }))
    })
    .flatten()
}

/// Most bytes of one member read again to find which member fails.
const PROBE_MAX: u64 = 4 << 20;

impl ArrayLayout {
    /// The layout of the array `name` (its disk's name) from discovery;
    /// `None` for levels and layouts it does not model (raid5, far and
    /// offset raid10 layouts) or facts it lacks.
    pub(crate) fn of(name: &str, md: &MdArray) -> Option<Self> {
        let n = md.raid_disks? as usize;
        let chunk = md.chunk_bytes;
        let stripe = match md.level.as_str() {
            "raid1" => Stripe::Mirrored,
            "raid0" => Stripe::Striped { chunk, copies: 1 },
            "raid10" => {
                let layout = md.layout?;
                let (near, far) = (u64::from(layout & 0xff), (layout >> 8) & 0xff);
                if far != 1 || layout >> 16 != 0 || near == 0 || near > n as u64 {
                    return None;
                }
                Stripe::Striped {
                    chunk,
                    copies: near,
                }
            }
            _ => return None,
        };
        if let Stripe::Striped { chunk, .. } = stripe {
            if !chunk.is_power_of_two() {
                return None;
            }
        }
        let mut legs = vec![None; n];
        for m in &md.members {
            let Some(slot) = m.slot.map(|s| s as usize).filter(|&s| s < n) else {
                continue;
            };
            legs[slot] = Some(Leg {
                name: m.name.clone(),
                data_offset: m.data_offset?,
            });
        }
        (n > 0).then(|| Self {
            name: name.to_string(),
            stripe,
            legs,
        })
    }

    /// Every place the `len` bytes at `offset` of the array lie: each copy
    /// of each run, in order of array offset.
    fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let n = self.legs.len() as u64;
        let data = |slot: u64| {
            self.legs[slot as usize]
                .as_ref()
                .map_or(0, |l| l.data_offset)
        };
        match self.stripe {
            Stripe::Mirrored => (0..n)
                .map(|slot| Piece {
                    slot: slot as usize,
                    at: data(slot) + offset,
                    len,
                })
                .collect(),
            Stripe::Striped { chunk, copies } => stripe_runs(offset, len, chunk, copies, n)
                .map(|r| Piece {
                    slot: r.slot,
                    at: data(r.slot as u64) + r.at,
                    len: r.len,
                })
                .collect(),
        }
    }

    /// Which member an I/O error on the `len` bytes at `offset` of the
    /// array came from, in words: a member whose device is gone or whose
    /// controller is not live; for a read, a member whose own read of its
    /// piece fails (at most [`PROBE_MAX`] bytes of each); else the members
    /// that hold the range.
    pub(crate) fn blame(&self, offset: u64, len: u64, read: bool) -> String {
        let pieces = self.pieces(offset, len);
        let mut slots: Vec<usize> = pieces.iter().map(|p| p.slot).collect();
        slots.sort_unstable();
        slots.dedup();
        let legs = || {
            slots
                .iter()
                .filter_map(|&s| Some((s, self.legs[s].as_ref()?)))
        };
        for (slot, leg) in legs() {
            if let Some(state) = gone_or_not_live(&leg.name) {
                return format!(
                    "member {} (slot {slot}) of md array {}: {state}",
                    leg.name, self.name
                );
            }
        }
        if read {
            for p in &pieces {
                let Some(leg) = &self.legs[p.slot] else {
                    continue;
                };
                let len = p.len.min(PROBE_MAX);
                if let Some(e) = probe(&leg.name, p.at, len) {
                    return format!(
                        "member {} (slot {}) of md array {} fails to read its bytes {}..{}: {e}",
                        leg.name,
                        p.slot,
                        self.name,
                        p.at,
                        p.at + len
                    );
                }
            }
        }
        let names: Vec<String> = legs()
            .map(|(s, l)| format!("{} (slot {s})", l.name))
            .collect();
        format!(
            "on md array {}, whose member{} {} hold{} that range",
            self.name,
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            if names.len() == 1 { "s" } else { "" }
        )
    }
}

/// Why the member `name` cannot answer: its device gone, or its NVMe
/// controller not live (`resetting`, `dead`, `deleting`, ...); `None` when
/// it can, or nothing says otherwise.
fn gone_or_not_live(name: &str) -> Option<String> {
    let dir = Path::new("/sys/class/block").join(name);
    if !dir.exists() {
        return Some("its device is gone".into());
    }
    // A namespace's controller, or for a partition its disk's.
    let state = fs::read_to_string(dir.join("device/state"))
        .or_else(|_| fs::read_to_string(dir.join("../device/state")))
        .ok()?;
    let state = state.trim();
    (state != "live").then(|| format!("its controller is {state}"))
}

/// Reads `len` bytes at `at` of the member `name` again, past its page
/// cache, to see whether the member itself fails them: its error, or
/// `None` when it reads them, or when it cannot be asked (a caller without
/// access to the member's device node).
fn probe(name: &str, at: u64, len: u64) -> Option<std::io::Error> {
    let f = File::open(Path::new("/dev").join(name)).ok()?;
    // Cached pages would answer without the device.
    let _ = rustix::fs::fadvise(
        &f,
        at,
        std::num::NonZeroU64::new(len),
        rustix::fs::Advice::DontNeed,
    );
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, at).err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::MdMember;

    fn md(level: &str, layout: Option<u32>, n: u32, chunk: u64) -> MdArray {
        MdArray {
            level: level.into(),
            chunk_bytes: chunk,
            raid_disks: Some(n),
            layout,
            degraded: Some(0),
            state: Some("clean".into()),
            members: (0..n)
                .map(|i| MdMember {
                    name: format!("nvme{i}n1"),
                    slot: Some(i),
                    state: vec!["in_sync".into()],
                    data_offset: Some((i as u64 + 1) << 20),
                    target: None,
                })
                .collect(),
        }
    }

    fn piece(slot: usize, at: u64, len: u64) -> Piece {
        Piece { slot, at, len }
    }

    #[test]
    fn pieces_follow_md_layouts() {
        const K: u64 = 1024;
        const M: u64 = 1 << 20;
        // raid0 of 2, 64 KiB chunks: 100 bytes before the second chunk's
        // end run into the third, which is on the first member again.
        let r0 = ArrayLayout::of("md0", &md("raid0", Some(0), 2, 64 * K)).unwrap();
        assert_eq!(
            r0.pieces(128 * K - 100, 200),
            [
                piece(1, 2 * M + 64 * K - 100, 100),
                piece(0, M + 64 * K, 100)
            ]
        );
        // raid1: every leg, at its own data offset.
        let r1 = ArrayLayout::of("md1", &md("raid1", None, 2, 0)).unwrap();
        assert_eq!(
            r1.pieces(5, 10),
            [piece(0, M + 5, 10), piece(1, 2 * M + 5, 10)]
        );
        // raid10 near 2 over 3: chunk 1's copies are on members 2 and 0
        // (row 1 of member 0).
        let r10 = ArrayLayout::of("md2", &md("raid10", Some(0x102), 3, 64 * K)).unwrap();
        assert_eq!(
            r10.pieces(64 * K, 10),
            [piece(2, 3 * M, 10), piece(0, M + 64 * K, 10)]
        );
        // What it does not model.
        assert_eq!(
            ArrayLayout::of("md3", &md("raid10", Some(0x201), 4, 64 * K)),
            None
        );
        assert_eq!(
            ArrayLayout::of("md4", &md("raid5", Some(2), 3, 64 * K)),
            None
        );
        assert_eq!(ArrayLayout::of("md5", &md("raid0", Some(0), 2, 1000)), None);
    }

    #[test]
    fn blame_names_a_member_whose_device_is_gone() {
        let mut a = md("raid0", Some(0), 2, 65536);
        a.members[1].name = "p2pdma-test-no-such-disk".into();
        let l = ArrayLayout::of("md9", &a).unwrap();
        // Bytes 64 KiB.. are the second member's.
        assert_eq!(
            l.blame(65536, 4096, true),
            "member p2pdma-test-no-such-disk (slot 1) of md array md9: its device is gone"
        );
    }
}
