//! Chunk size and depth for a storage device, when the configuration does
//! not set them (AUTO).
//!
//! 1. **From the device's facts** ([`from_facts`]): chunks as large as the
//!    largest request the block layer sends unsplit (`max_sectors_kb`),
//!    between 1 and 4 MiB, and enough of them in flight for 16 MiB.
//! 2. **Calibrated once**: the first AUTO read of at least
//!    [`CALIBRATE_MIN`] bytes from a device with nothing learned times
//!    storage reads (no copies) at a few candidates around the facts'
//!    choice, best of two rounds each, and keeps the fastest, unless it beats
//!    the facts' choice by less than [`MARGIN`].
//!    A namespace reached over a network ([`Reach::Network`]: NVMe/TCP,
//!    NVMe/RDMA, NVMe/FC) is calibrated from [`CALIBRATE_MIN_NETWORK`] on,
//!    on samples as large as the read, with windows up to four times the
//!    facts' (the round trip, not the device, sets what must be in flight,
//!    and the facts say nothing of it) and a longer budget, and keeps the
//!    deepest window within [`MARGIN`] of the fastest ([`pick_deepest`]):
//!    there a window too short costs far more than one too long.
//! 3. **Kept** ([`Cache`]): one line per device in a small text file, keyed
//!    by the disk's device number, model and serial, so that the next
//!    process starts from what was learned.
//!
//! Nothing here makes a transfer fail: a missing, unreadable or corrupt
//! cache, or a calibration that fails, only means the facts' choice.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use super::cache;
pub use super::cache::{parse_cache_dir, DeviceKey};
use crate::discovery::DiskFacts;

/// The largest chunk.
pub const MAX_CHUNK: usize = 64 << 20;
/// The most chunks in flight.
pub const MAX_DEPTH: usize = 256;

/// Bytes per chunk and chunks in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Bytes per chunk (per storage I/O and per bounce slot).
    pub chunk: usize,
    /// Chunks in flight.
    pub depth: usize,
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} KiB x {}", self.chunk >> 10, self.depth)
    }
}

const MIB: usize = 1 << 20;
/// The chunk when the device says nothing, and the smallest AUTO chunk for
/// large transfers: below it, per-chunk costs (a completion, a copy call)
/// show.
pub(crate) const BASE_CHUNK: usize = MIB;
/// The largest AUTO chunk: larger requests are split by the block layer on
/// most devices anyway, and each chunk is a bounce slot.
const MAX_AUTO_CHUNK: usize = 4 * MIB;
/// Bytes in flight the facts' choice aims at: on the development host 16
/// and 32 MiB were within noise of each other and of fio's best, and each
/// byte in flight is a byte of bounce slots.
const WINDOW: usize = 16 * MIB;
/// Depth bounds for AUTO.
const MIN_AUTO_DEPTH: usize = 2;
const MAX_AUTO_DEPTH: usize = 64;

/// The smallest read that calibrates a device.
pub const CALIBRATE_MIN: usize = 256 * MIB;
/// Bytes read per calibration sample.
pub(crate) const SAMPLE: usize = 64 * MIB;
/// Calibration stops sampling after this long (a slow disk).
pub(crate) const BUDGET: Duration = Duration::from_secs(2);
/// How much faster than the facts' choice a candidate must be to replace it.
pub const MARGIN: f64 = 0.05;
/// The smallest read that calibrates a namespace reached over a network.
pub const CALIBRATE_MIN_NETWORK: usize = 32 * MIB;
/// Calibration of a namespace reached over a network stops sampling after
/// this long: its samples are larger than the facts' window by design, and
/// a slow network takes long to fill.
pub(crate) const NETWORK_BUDGET: Duration = Duration::from_secs(10);

/// How a device's data reaches this machine, for calibration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// A device on this machine (PCIe, virtio, a file's filesystem, the
    /// NVMe loop target).
    Local,
    /// A namespace reached over a network: some path is NVMe/TCP, RDMA or
    /// FC.
    Network,
}

/// How a device is calibrated: from which read size, on samples of how
/// many bytes, within how long, trying what (the facts' choice first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// How the device's data reaches this machine: what the winner is
    /// chosen by ([`Plan::pick`]).
    pub reach: Reach,
    /// Bytes per sample.
    pub sample: usize,
    /// Sampling stops after this long.
    pub budget: Duration,
    /// The geometries tried, the facts' choice first.
    pub candidates: Vec<Geometry>,
}

/// The calibration of a device with facts `f` reached by `reach`, on a
/// block-aligned read of `range` bytes; `None` when the read is too small
/// to calibrate it.
///
/// - Local: reads of [`CALIBRATE_MIN`] or more, 64 MiB samples,
///   [`candidates`], 2 s.
/// - Over a network: reads of [`CALIBRATE_MIN_NETWORK`] or more, samples
///   of the read's size up to 64 MiB, [`network_candidates`],
///   10 s.
pub fn plan(f: &DiskFacts, reach: Reach, range: usize) -> Option<Plan> {
    if range < reach.min_read() {
        return None;
    }
    Some(match reach {
        Reach::Local => Plan {
            reach,
            sample: SAMPLE,
            budget: BUDGET,
            candidates: candidates(f),
        },
        Reach::Network => {
            let sample = range.min(SAMPLE);
            Plan {
                reach,
                sample,
                budget: NETWORK_BUDGET,
                candidates: network_candidates(f, sample),
            }
        }
    })
}

impl Reach {
    /// The smallest block-aligned read that calibrates a device reached
    /// this way: [`CALIBRATE_MIN`] or [`CALIBRATE_MIN_NETWORK`].
    pub fn min_read(self) -> usize {
        match self {
            Reach::Local => CALIBRATE_MIN,
            Reach::Network => CALIBRATE_MIN_NETWORK,
        }
    }
}

impl Plan {
    /// The winner of `samples` (this plan's candidates, in order): on a
    /// local device, [`pick`]; over a network, [`pick_deepest`].
    pub fn pick(&self, samples: &[Sample]) -> Option<Learned> {
        match self.reach {
            Reach::Local => pick(samples),
            Reach::Network => pick_deepest(samples),
        }
    }
}

/// What calibration tries over a network, the facts' choice first: its
/// chunks with one, two and four times its window in flight, and 1 MiB
/// chunks with one and two times, no window larger than a `sample` (the whole sample in flight
/// at once is the deepest that sample can tell apart). A network's round
/// trip is long next to a local device's, so deeper windows than the
/// facts' are the ones worth measuring.
pub fn network_candidates(f: &DiskFacts, sample: usize) -> Vec<Geometry> {
    let base = from_facts(f);
    let q = f.queue_requests;
    let mut v = vec![base];
    let windows: [(usize, &[usize]); 2] = [
        (base.chunk, &[WINDOW, 2 * WINDOW, 4 * WINDOW]),
        (BASE_CHUNK, &[WINDOW, 2 * WINDOW]),
    ];
    for (chunk, windows) in windows {
        for &window in windows {
            let depth = depth_for(chunk, window.min(sample.max(chunk)), q);
            let g = Geometry { chunk, depth };
            if !v.contains(&g) {
                v.push(g);
            }
        }
    }
    v
}

/// Depth that keeps `window` bytes in flight in chunks of `chunk`, within
/// AUTO's bounds and the queue's size.
fn depth_for(chunk: usize, window: usize, queue: Option<u32>) -> usize {
    let queue = queue.map_or(MAX_AUTO_DEPTH, |q| (q as usize).max(MIN_AUTO_DEPTH));
    (window / chunk.max(1))
        .clamp(MIN_AUTO_DEPTH, MAX_AUTO_DEPTH)
        .min(queue)
}

/// The facts' choice: chunks of the largest unsplit request (a power of two
/// between 1 and 4 MiB; 1 MiB when unknown), 16 MiB in flight.
pub fn from_facts(f: &DiskFacts) -> Geometry {
    let chunk = match f.max_request_bytes {
        Some(b) if b >= 4096 => {
            let b = usize::try_from(b).unwrap_or(usize::MAX);
            (1usize << (usize::BITS - 1 - b.leading_zeros())).clamp(BASE_CHUNK, MAX_AUTO_CHUNK)
        }
        _ => BASE_CHUNK,
    };
    Geometry {
        chunk,
        depth: depth_for(chunk, WINDOW, f.queue_requests),
    }
}

/// What calibration tries, the facts' choice first: its chunks and 1 MiB
/// chunks, each with 16 and 32 MiB in flight (at most half a sample,
/// so that a sample is mostly steady streaming rather than one burst).
/// Twice the facts' window only wins by being 5% faster (see [`pick`]).
pub fn candidates(f: &DiskFacts) -> Vec<Geometry> {
    let base = from_facts(f);
    let mut v = vec![base];
    let q = f.queue_requests;
    for g in [
        Geometry {
            chunk: base.chunk,
            depth: depth_for(base.chunk, 2 * WINDOW, q),
        },
        Geometry {
            chunk: BASE_CHUNK,
            depth: depth_for(BASE_CHUNK, WINDOW, q),
        },
        Geometry {
            chunk: BASE_CHUNK,
            depth: depth_for(BASE_CHUNK, 2 * WINDOW, q),
        },
    ] {
        if !v.contains(&g) {
            v.push(g);
        }
    }
    v
}

/// A geometry learned for a device, and the storage throughput it reached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Learned {
    /// The geometry.
    pub geometry: Geometry,
    /// Its storage throughput in calibration, bytes per second.
    pub bytes_per_s: f64,
}

/// The file that keeps learned geometry: `DIR/geometry`, one tab-separated
/// line per device (`major:minor`, model, serial, chunk bytes, depth,
/// bytes per second), `#` comments. Lines it cannot read are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cache {
    file: PathBuf,
}

/// Name of the cache file in its directory.
const CACHE_FILE: &str = "geometry";

impl Cache {
    /// The cache in directory `dir`.
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        Self {
            file: dir.as_ref().join(CACHE_FILE),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.file
    }

    /// What was learned for `key`, if anything.
    pub fn lookup(&self, key: &DeviceKey) -> Option<Learned> {
        let text = std::fs::read_to_string(&self.file).ok()?;
        text.lines()
            .filter_map(parse_line)
            .filter(|(k, _)| k == key)
            .map(|(_, l)| l)
            .next_back()
    }

    /// Records `learned` for `key`, replacing what was there for it: the
    /// file is written under a temporary name and renamed over the old one,
    /// so readers see the old file or the new one, never half of one.
    pub fn store(&self, key: &DeviceKey, learned: &Learned) -> std::io::Result<()> {
        let old = std::fs::read_to_string(&self.file).unwrap_or_default();
        let mut text = String::from(
            "# p2pdma: chunk size and depth learned per storage device (delete to relearn)\n",
        );
        for line in old.lines() {
            if parse_line(line).is_some_and(|(k, _)| k != *key) {
                text.push_str(line);
                text.push('\n');
            }
        }
        text.push_str(&format_line(key, learned));
        cache::replace_file(&self.file, &text)
    }
}

fn format_line(k: &DeviceKey, l: &Learned) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{:.0}\n",
        k.dev, k.model, k.serial, l.geometry.chunk, l.geometry.depth, l.bytes_per_s
    )
}

/// One line of the cache file; `None` for comments and anything malformed
/// or outside the bounds a configuration accepts.
fn parse_line(line: &str) -> Option<(DeviceKey, Learned)> {
    if line.starts_with('#') {
        return None;
    }
    let f: Vec<&str> = line.split('\t').collect();
    let [dev, model, serial, chunk, depth, rate] = f[..] else {
        return None;
    };
    let chunk: usize = chunk.parse().ok()?;
    let depth: usize = depth.parse().ok()?;
    let rate: f64 = rate.parse().ok()?;
    let ok = (4096..=MAX_CHUNK).contains(&chunk)
        && chunk.is_multiple_of(4096)
        && (1..=MAX_DEPTH).contains(&depth)
        && rate.is_finite()
        && rate >= 0.0;
    if !ok {
        return None;
    }
    let key = DeviceKey::from_parts(dev, model, serial)?;
    let learned = Learned {
        geometry: Geometry { chunk, depth },
        bytes_per_s: rate,
    };
    Some((key, learned))
}

/// One candidate's calibration result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// The geometry tried.
    pub geometry: Geometry,
    /// Its best storage throughput, bytes per second.
    pub bytes_per_s: f64,
}

/// The fastest sample, unless it is less than [`MARGIN`] faster than the
/// first (the facts' choice), which then stays: calibration moves away
/// from the facts only when it clearly pays. `None` when nothing was
/// measured.
pub fn pick(samples: &[Sample]) -> Option<Learned> {
    let base = samples.first().filter(|s| s.bytes_per_s > 0.0)?;
    let fastest = samples
        .iter()
        .max_by(|a, b| a.bytes_per_s.total_cmp(&b.bytes_per_s))?;
    let s = if fastest.bytes_per_s > base.bytes_per_s * (1.0 + MARGIN) {
        fastest
    } else {
        base
    };
    Some(Learned {
        geometry: s.geometry,
        bytes_per_s: s.bytes_per_s,
    })
}

/// Over a network: of the samples within [`MARGIN`] of the fastest, the
/// one with the most bytes in flight (the larger chunk between equals).
/// A window short of the round trip costs throughput on every transfer; a
/// longer one costs only bounce memory. So between candidates a noisy
/// measurement cannot tell apart, the deeper is the one to keep. `None`
/// when nothing was measured.
pub fn pick_deepest(samples: &[Sample]) -> Option<Learned> {
    let fastest = samples.iter().map(|s| s.bytes_per_s).fold(0.0f64, f64::max);
    if fastest <= 0.0 {
        return None;
    }
    let s = samples
        .iter()
        .filter(|s| s.bytes_per_s >= fastest * (1.0 - MARGIN))
        .max_by_key(|s| (s.geometry.chunk * s.geometry.depth, s.geometry.chunk))?;
    Some(Learned {
        geometry: s.geometry,
        bytes_per_s: s.bytes_per_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{fake::TempDir, DevNum};

    fn facts(max_kb: Option<u64>, queue: Option<u32>) -> DiskFacts {
        DiskFacts {
            dev: Some(DevNum {
                major: 259,
                minor: 0,
            }),
            model: Some("Model\tX".into()),
            serial: None,
            max_request_bytes: max_kb.map(|k| k * 1024),
            queue_requests: queue,
            rotational: Some(false),
        }
    }

    fn g(chunk: usize, depth: usize) -> Geometry {
        Geometry { chunk, depth }
    }

    #[test]
    fn facts_choose_the_unsplit_request_and_16_mib_in_flight() {
        // A virtio disk: 4 MiB requests.
        assert_eq!(from_facts(&facts(Some(4096), Some(256))), g(4 * MIB, 4));
        // NVMe with 128 KiB or 1280 KiB requests: 1 MiB chunks.
        assert_eq!(from_facts(&facts(Some(128), Some(1023))), g(MIB, 16));
        assert_eq!(from_facts(&facts(Some(1280), None)), g(MIB, 16));
        // Huge limits are capped; a small queue caps the depth.
        assert_eq!(from_facts(&facts(Some(1 << 30), Some(3))), g(4 * MIB, 3));
        assert_eq!(from_facts(&facts(Some(2048), Some(0))), g(2 * MIB, 2));
        // Nothing known.
        assert_eq!(from_facts(&DiskFacts::default()), g(MIB, 16));
    }

    #[test]
    fn candidates_start_with_the_facts_and_never_repeat() {
        let c = candidates(&facts(Some(4096), Some(256)));
        assert_eq!(c, [g(4 * MIB, 4), g(4 * MIB, 8), g(MIB, 16), g(MIB, 32)]);
        // 1 MiB chunks already: two candidates.
        let c = candidates(&facts(Some(128), None));
        assert_eq!(c, [g(MIB, 16), g(MIB, 32)]);
        // A queue of 2: everything is 2 deep.
        let c = candidates(&facts(Some(4096), Some(2)));
        assert_eq!(c, [g(4 * MIB, 2), g(MIB, 2)]);
        // Every window fits twice in a sample.
        for f in [facts(Some(4096), None), facts(Some(64), Some(8))] {
            assert!(candidates(&f)
                .iter()
                .all(|g| 2 * g.chunk * g.depth <= SAMPLE));
        }
    }

    #[test]
    fn a_network_namespace_calibrates_smaller_reads_with_deeper_windows() {
        // The rig's multipath head: 4 MiB requests, no queue size.
        let head = facts(Some(4096), None);
        // A local device: 256 MiB reads and more, as before.
        assert_eq!(plan(&head, Reach::Local, CALIBRATE_MIN - 4096), None);
        let local = plan(&head, Reach::Local, CALIBRATE_MIN).unwrap();
        assert_eq!(
            (
                Reach::Local.min_read(),
                local.sample,
                local.budget,
                local.candidates
            ),
            (CALIBRATE_MIN, SAMPLE, BUDGET, candidates(&head))
        );
        // Over a network: from 32 MiB, samples the read's size up to
        // 64 MiB, windows up to four times the facts' but never more than
        // a sample.
        assert_eq!(
            plan(&head, Reach::Network, CALIBRATE_MIN_NETWORK - 4096),
            None
        );
        let p = plan(&head, Reach::Network, CALIBRATE_MIN_NETWORK).unwrap();
        assert_eq!(
            (Reach::Network.min_read(), p.sample, p.budget),
            (32 * MIB, 32 * MIB, NETWORK_BUDGET)
        );
        assert_eq!(
            p.candidates,
            [g(4 * MIB, 4), g(4 * MIB, 8), g(MIB, 16), g(MIB, 32)]
        );
        let p = plan(&head, Reach::Network, 1 << 30).unwrap();
        assert_eq!(p.sample, SAMPLE);
        assert_eq!(
            p.candidates,
            [
                g(4 * MIB, 4),
                g(4 * MIB, 8),
                g(4 * MIB, 16),
                g(MIB, 16),
                g(MIB, 32)
            ]
        );
        // NVMe/TCP paths with 128 KiB requests and a queue of 127.
        let tcp = facts(Some(128), Some(127));
        assert_eq!(
            network_candidates(&tcp, SAMPLE),
            [g(MIB, 16), g(MIB, 32), g(MIB, 64)]
        );
        // Whatever the facts and the sample: the facts' choice first, no
        // repeats, within the bounds, no window over the sample (or one
        // chunk).
        for f in [head, tcp, facts(Some(1024), Some(2)), DiskFacts::default()] {
            for sample in [CALIBRATE_MIN_NETWORK, 48 * MIB, SAMPLE] {
                let c = network_candidates(&f, sample);
                assert_eq!(c[0], from_facts(&f));
                for (i, x) in c.iter().enumerate() {
                    assert!(!c[..i].contains(x));
                    assert!((1..=MAX_AUTO_DEPTH).contains(&x.depth));
                    assert!(
                        x.chunk * x.depth
                            <= sample.max(from_facts(&f).chunk * from_facts(&f).depth)
                    );
                }
            }
        }
    }

    #[test]
    fn over_a_network_the_deepest_window_within_noise_of_the_fastest_wins() {
        let s = |geometry, bytes_per_s| Sample {
            geometry,
            bytes_per_s,
        };
        // 4 MiB x 8 is 3% slower than 4 x 4: within noise, and deeper.
        let v = [
            s(g(4 * MIB, 4), 100.0),
            s(g(4 * MIB, 8), 97.0),
            s(g(MIB, 16), 80.0),
            s(g(MIB, 32), 96.0),
        ];
        assert_eq!(pick_deepest(&v).unwrap().geometry, g(4 * MIB, 8));
        assert_eq!(pick(&v).unwrap().geometry, g(4 * MIB, 4));
        // Clearly slower deeper windows do not win.
        let v = [s(g(4 * MIB, 4), 100.0), s(g(4 * MIB, 8), 90.0)];
        assert_eq!(pick_deepest(&v).unwrap().geometry, g(4 * MIB, 4));
        // Equal windows: the larger chunk. Unmeasured ones (0) never win.
        let v = [
            s(g(MIB, 32), 100.0),
            s(g(4 * MIB, 8), 99.0),
            s(g(4 * MIB, 16), 0.0),
        ];
        assert_eq!(pick_deepest(&v).unwrap().geometry, g(4 * MIB, 8));
        assert_eq!(pick_deepest(&[s(g(MIB, 2), 0.0)]), None);
        assert_eq!(pick_deepest(&[]), None);
        // Each plan picks its way.
        let f = facts(Some(4096), None);
        let v = [s(g(4 * MIB, 4), 100.0), s(g(4 * MIB, 8), 98.0)];
        let local = plan(&f, Reach::Local, CALIBRATE_MIN).unwrap();
        let net = plan(&f, Reach::Network, CALIBRATE_MIN).unwrap();
        assert_eq!(local.pick(&v).unwrap().geometry, g(4 * MIB, 4));
        assert_eq!(net.pick(&v).unwrap().geometry, g(4 * MIB, 8));
    }

    #[test]
    fn the_facts_choice_stays_unless_another_is_clearly_faster() {
        let s = |geometry, bytes_per_s| Sample {
            geometry,
            bytes_per_s,
        };
        let base = g(4 * MIB, 8);
        let other = g(MIB, 16);
        let close = [s(base, 100.0), s(other, 104.0)];
        assert_eq!(pick(&close).unwrap().geometry, base);
        let clear = [s(base, 100.0), s(other, 106.0)];
        assert_eq!(
            pick(&clear).unwrap(),
            Learned {
                geometry: other,
                bytes_per_s: 106.0
            }
        );
        assert_eq!(pick(&[s(base, 0.0), s(other, 50.0)]), None);
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn the_cache_keeps_one_line_per_device_and_ignores_junk() {
        let dir = TempDir::new("geometry-cache");
        let cache = Cache::in_dir(dir.path().join("sub"));
        let a = DeviceKey::of(&facts(None, None)).unwrap();
        assert_eq!((a.model.as_str(), a.serial.as_str()), ("Model X", "-"));
        let mut other = facts(None, None);
        other.serial = Some("S1".into());
        let b = DeviceKey::of(&other).unwrap();
        assert_eq!(cache.lookup(&a), None);
        let la = Learned {
            geometry: g(4 * MIB, 8),
            bytes_per_s: 2e9,
        };
        let lb = Learned {
            geometry: g(MIB, 16),
            bytes_per_s: 3e9,
        };
        cache.store(&a, &la).unwrap();
        cache.store(&b, &lb).unwrap();
        assert_eq!(cache.lookup(&a), Some(la));
        assert_eq!(cache.lookup(&b), Some(lb));
        // Replaced, not duplicated.
        let la2 = Learned {
            geometry: g(2 * MIB, 4),
            bytes_per_s: 1e9,
        };
        cache.store(&a, &la2).unwrap();
        assert_eq!(cache.lookup(&a), Some(la2));
        let text = std::fs::read_to_string(cache.path()).unwrap();
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 2);
        // Junk and out-of-range lines are skipped, the rest still read.
        let mut junk = text.clone();
        junk.push_str("garbage\n259:0\tModel X\t-\t1\t8\t5\n259:0\tModel X\t-\t4096\t0\t5\n");
        std::fs::write(cache.path(), &junk).unwrap();
        assert_eq!(cache.lookup(&a), Some(la2));
        assert_eq!(cache.lookup(&b), Some(lb));
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [CACHE_FILE]);
        // A cache that cannot be written is an error for the caller to
        // ignore, not a panic.
        let blocked = Cache::in_dir(cache.path().join("not-a-dir"));
        assert!(blocked.store(&a, &la).is_err());
        assert_eq!(blocked.lookup(&a), None);
    }
}
