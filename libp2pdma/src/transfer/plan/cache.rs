//! The page-cache part of the rule: which bytes of a read come from the
//! page cache rather than the device, decided from what the kernel says is
//! cached and the caller's preference.

use std::{fmt, ops::Range, str::FromStr};

use crate::{Error, Result};

/// Whether reads use data the page cache already holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PageCache {
    /// Cached pages of the range are copied from the page cache (the CPU
    /// copies data already in memory, which is cheaper than the device
    /// moving it again); the rest goes by the path chosen.
    #[default]
    Auto,
    /// Every byte goes by the path chosen, cached or not (P2P users who
    /// keep the CPU out of the data path).
    Direct,
    /// Every read goes through the page cache (a buffered read), which also
    /// fills it for the next one.
    Buffered,
}

impl PageCache {
    /// `auto`, `direct`, `buffered`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Direct => "direct",
            Self::Buffered => "buffered",
        }
    }
}

impl FromStr for PageCache {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "direct" | "off" | "bypass" => Ok(Self::Direct),
            "buffered" | "on" => Ok(Self::Buffered),
            other => Err(Error::InvalidArgument(format!(
                "unknown page-cache use '{other}' (auto, direct, buffered)"
            ))),
        }
    }
}

impl fmt::Display for PageCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a part of a read comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Copied out of the page cache.
    PageCache,
    /// Moved by the path chosen.
    Device,
}

/// A run of pages no shorter than this is read from the page cache in the
/// middle of a read that is otherwise the device's: shorter runs would only
/// break the device's large I/Os into smaller ones.
pub const MIN_CACHED_RUN: u64 = 256 << 10;

/// Reads in a row a file must have found all cached before the next small
/// read asks the page cache itself first.
pub const WARM_STREAK: u32 = 4;

/// The largest read that asks the page cache first: above it, the system
/// call that asks what is cached costs nothing next to the copy.
pub const ASK_FIRST_MAX: usize = 1 << 20;

/// Whether a read of `len` bytes asks the page cache for them first
/// (`RWF_NOWAIT`, one system call where the data is there), rather than
/// asking what of them is cached: for small reads with
/// [`PageCache::Auto`] of a file whose last `streak` reads were all cached
/// (at least [`WARM_STREAK`]). A miss costs little: the kernel starts
/// reading the missing pages into the page cache before it says
/// `EAGAIN`, and the read then finds them there, as a buffered read would.
pub fn ask_first(pref: PageCache, len: usize, streak: u32) -> bool {
    pref == PageCache::Auto && len <= ASK_FIRST_MAX && streak >= WARM_STREAK
}

/// What the kernel says of the pages of a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Every page is cached.
    All,
    /// No page is cached.
    None,
    /// Page `i` (of `page` bytes, the first holding the read's first byte)
    /// is cached when `map[i]`.
    Pages {
        /// Bytes per page.
        page: u64,
        /// A flag per page.
        map: Vec<bool>,
    },
    /// Not known (no way to ask, or the kernel did not answer).
    Unknown,
}

/// Splits the read of `range` into parts, in order and covering it once,
/// each with where its bytes come from: with [`PageCache::Auto`], what is
/// cached from the page cache, except cached runs shorter than
/// [`MIN_CACHED_RUN`] between parts the device moves; with
/// [`PageCache::Buffered`] all of it from the page cache; with
/// [`PageCache::Direct`], or when what is cached is not known, all of it
/// from the device.
pub fn split(pref: PageCache, range: Range<u64>, cached: &Residency) -> Vec<(Range<u64>, Source)> {
    if range.is_empty() {
        return Vec::new();
    }
    let whole = |s| vec![(range.clone(), s)];
    let (page, map) = match (pref, cached) {
        (PageCache::Direct, _) | (PageCache::Auto, Residency::None | Residency::Unknown) => {
            return whole(Source::Device)
        }
        (PageCache::Buffered, _) | (PageCache::Auto, Residency::All) => {
            return whole(Source::PageCache)
        }
        (PageCache::Auto, Residency::Pages { page, map }) => (*page, map),
    };
    let first = range.start - range.start % page;
    // Runs of equal flags, clipped to the range.
    let mut runs: Vec<(Range<u64>, bool)> = Vec::new();
    for (i, &c) in map.iter().enumerate() {
        let p0 = (first + i as u64 * page).max(range.start);
        let p1 = (first + (i as u64 + 1) * page).min(range.end);
        if p0 >= p1 {
            continue;
        }
        match runs.last_mut() {
            Some((r, was)) if *was == c => r.end = p1,
            _ => runs.push((p0..p1, c)),
        }
    }
    // Pages past the map (it ended early): the device's.
    let covered = runs.last().map_or(range.start, |(r, _)| r.end);
    if covered < range.end {
        match runs.last_mut() {
            Some((r, false)) => r.end = range.end,
            _ => runs.push((covered..range.end, false)),
        }
    }
    // Short cached runs between device parts become the device's.
    let n = runs.len();
    let mut parts: Vec<(Range<u64>, Source)> = Vec::with_capacity(n);
    for (i, (r, cached)) in runs.into_iter().enumerate() {
        let inner = i > 0 && i + 1 < n;
        let source = if cached && !(inner && r.end - r.start < MIN_CACHED_RUN) {
            Source::PageCache
        } else {
            Source::Device
        };
        match parts.last_mut() {
            Some((p, s)) if *s == source => p.end = r.end,
            _ => parts.push((r, source)),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const PAGE: u64 = 4096;

    fn check(pref: PageCache, range: Range<u64>, map: &[bool]) -> Vec<(Range<u64>, Source)> {
        let parts = split(
            pref,
            range.clone(),
            &Residency::Pages {
                page: PAGE,
                map: map.to_vec(),
            },
        );
        // In order, touching, covering the range once, and no two
        // neighbours from the same source.
        let mut at = range.start;
        for (i, (r, s)) in parts.iter().enumerate() {
            assert_eq!(r.start, at, "{parts:?}");
            assert!(r.end > r.start, "{parts:?}");
            if i > 0 {
                assert_ne!(parts[i - 1].1, *s, "{parts:?}");
            }
            at = r.end;
        }
        assert_eq!(at, range.end, "{parts:?}");
        let first = range.start / PAGE;
        let cached = |b: u64| map.get(((b / PAGE) - first) as usize) == Some(&true);
        for (r, s) in &parts {
            if *s == Source::PageCache && pref == PageCache::Auto {
                // Only cached pages come from the page cache.
                assert!((r.start..r.end).step_by(512).all(cached), "{r:?} {map:?}");
                assert!((r.end - 1..r.end).all(cached));
            }
        }
        parts
    }

    #[test]
    fn only_small_reads_of_a_warm_file_ask_the_page_cache_first() {
        assert!(ask_first(PageCache::Auto, 4096, WARM_STREAK));
        assert!(ask_first(PageCache::Auto, ASK_FIRST_MAX, u32::MAX));
        assert!(!ask_first(PageCache::Auto, 4096, WARM_STREAK - 1));
        assert!(!ask_first(PageCache::Auto, ASK_FIRST_MAX + 1, WARM_STREAK));
        assert!(!ask_first(PageCache::Direct, 4096, WARM_STREAK));
        assert!(!ask_first(PageCache::Buffered, 4096, WARM_STREAK));
    }

    #[test]
    fn whole_reads_follow_the_preference_and_what_is_known() {
        let r = 100..9000;
        let all = |s| vec![(r.clone(), s)];
        assert_eq!(
            split(PageCache::Auto, r.clone(), &Residency::All),
            all(Source::PageCache)
        );
        assert_eq!(
            split(PageCache::Auto, r.clone(), &Residency::None),
            all(Source::Device)
        );
        assert_eq!(
            split(PageCache::Auto, r.clone(), &Residency::Unknown),
            all(Source::Device)
        );
        assert_eq!(
            split(PageCache::Direct, r.clone(), &Residency::All),
            all(Source::Device)
        );
        assert_eq!(
            split(PageCache::Buffered, r.clone(), &Residency::None),
            all(Source::PageCache)
        );
        assert!(split(PageCache::Auto, 5..5, &Residency::All).is_empty());
    }

    #[test]
    fn a_partly_cached_read_takes_long_cached_runs_and_the_ends_from_the_page_cache() {
        let run = (MIN_CACHED_RUN / PAGE) as usize;
        // Cached head, a short cached island, a long cached run, uncached
        // tail.
        let mut map = vec![true; 2];
        map.extend([false; 3]);
        map.push(true);
        map.extend([false; 3]);
        map.extend(vec![true; run]);
        map.extend([false; 2]);
        let end = map.len() as u64 * PAGE;
        let parts = check(PageCache::Auto, 10..end - 10, &map);
        let long = 9 * PAGE..(9 + run as u64) * PAGE;
        assert_eq!(
            parts,
            vec![
                (10..2 * PAGE, Source::PageCache),
                (2 * PAGE..long.start, Source::Device),
                (long.clone(), Source::PageCache),
                (long.end..end - 10, Source::Device),
            ]
        );
    }

    proptest! {
        #[test]
        fn parts_cover_the_read_once_and_only_cached_pages_come_from_the_cache(
            start in 0u64..3 * PAGE,
            len in 1u64..200 * PAGE,
            map in proptest::collection::vec(any::<bool>(), 0..210),
            short in any::<bool>(),
        ) {
            let range = start..start + len;
            let pages = ((range.end.div_ceil(PAGE)) - range.start / PAGE) as usize;
            // A map as long as the range's pages, or one that ended early.
            let mut map = map;
            map.resize(if short { pages.min(map.len()) } else { pages }, false);
            check(PageCache::Auto, range, &map);
        }
    }
}
