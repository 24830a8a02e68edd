//! Transfer configuration: from the API, a config file or the environment.

use std::{path::PathBuf, time::Duration};

use super::{
    cache,
    geometry::{Geometry, MAX_CHUNK, MAX_DEPTH},
};
use crate::{Error, Result};

pub use crate::transfer::plan::{P2pSubmit, PageCache, PathPref};

/// Engine settings. Chunk size, depth and copy threads are chosen
/// automatically unless set.
///
/// [`Config::from_env`] is the usual start: it reads the configuration
/// file and the environment, and lets AUTO keep what it learns about each
/// storage device in the user's cache. [`Config::default`] is the same
/// without the file, the environment or the cache: AUTO's geometry then
/// comes from the device's facts alone, the same in every process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Path preference.
    pub path: PathPref,
    /// Bytes per pipeline chunk (and per direct I/O); rounded up to the
    /// storage block size.
    pub chunk: Option<usize>,
    /// Chunks in flight (bounce slots and ring entries).
    pub depth: Option<usize>,
    /// How the P2P path submits its I/O.
    pub p2p_submit: P2pSubmit,
    /// Whether reads take what the page cache holds from it.
    pub page_cache: PageCache,
    /// Threads that copy each landed bounce chunk into device memory (the
    /// calling thread and helpers); automatic when unset: see
    /// `docs/transfer.md`.
    pub copy_threads: Option<usize>,
    /// Directory where AUTO keeps the chunk size and depth it learns per
    /// storage device (by a short calibration on the first large read);
    /// `None` learns nothing.
    pub cache_dir: Option<PathBuf>,
    /// Constants of the strided cost model set by hand, over what was
    /// measured.
    pub strided: StridedConstants,
}

/// The strided cost model's constants as the configuration sets them
/// (`None`: measured, or the default); see `transfer/constants.rs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StridedConstants {
    /// `strided_call`: what one engine read costs a thread beyond its
    /// bytes.
    pub call: Option<Duration>,
    /// `strided_storage_rate`: storage bytes per second.
    pub storage_rate: Option<u64>,
    /// `strided_copy_rate`: bytes per second copied into device memory.
    pub copy_rate: Option<u64>,
    /// `strided_pack_rate`: bytes per second packed on the host.
    pub pack_rate: Option<u64>,
    /// `strided_copy_call`: what putting one run into device memory costs
    /// beyond its bytes.
    pub copy_call: Option<Duration>,
    /// `strided_call_mib`: what one 1 MiB engine read costs a thread.
    pub call_mib: Option<Duration>,
}

/// The smallest chunk.
const MIN_CHUNK: usize = 64 << 10;
const MAX_COPY_THREADS: usize = 64;

impl Config {
    /// Defaults (with the cache of learned geometry in
    /// `$XDG_CACHE_HOME/p2pdma`, or `~/.cache/p2pdma`), then `$P2PDMA_CONFIG`
    /// (or `/etc/p2pdma.conf` if it exists), then the environment
    /// (`P2PDMA_PATH`, `P2PDMA_PAGE_CACHE`, `P2PDMA_CHUNK`, `P2PDMA_DEPTH`,
    /// `P2PDMA_COPY_THREADS`, `P2PDMA_CACHE_DIR`, `P2PDMA_P2P_SUBMIT`,
    /// and the strided constants `P2PDMA_STRIDED_CALL`,
    /// `P2PDMA_STRIDED_STORAGE_RATE`, `P2PDMA_STRIDED_COPY_RATE`,
    /// `P2PDMA_STRIDED_PACK_RATE`, `P2PDMA_STRIDED_COPY_CALL`,
    /// `P2PDMA_STRIDED_CALL_MIB`).
    pub fn from_env() -> Result<Self> {
        let mut c = Self {
            cache_dir: cache::parse_cache_dir("default"),
            ..Self::default()
        };
        let file = std::env::var_os("P2PDMA_CONFIG")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                Some("/etc/p2pdma.conf".into()).filter(|p: &std::path::PathBuf| p.exists())
            });
        if let Some(f) = file {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| Error::InvalidArgument(format!("{}: {e}", f.display())))?;
            c.apply_file(&text)
                .map_err(|e| Error::InvalidArgument(format!("{}: {e}", f.display())))?;
        }
        for (key, var) in [
            ("path", "P2PDMA_PATH"),
            ("chunk", "P2PDMA_CHUNK"),
            ("depth", "P2PDMA_DEPTH"),
            ("p2p_submit", "P2PDMA_P2P_SUBMIT"),
            ("page_cache", "P2PDMA_PAGE_CACHE"),
            ("copy_threads", "P2PDMA_COPY_THREADS"),
            ("cache_dir", "P2PDMA_CACHE_DIR"),
            ("strided_call", "P2PDMA_STRIDED_CALL"),
            ("strided_storage_rate", "P2PDMA_STRIDED_STORAGE_RATE"),
            ("strided_copy_rate", "P2PDMA_STRIDED_COPY_RATE"),
            ("strided_pack_rate", "P2PDMA_STRIDED_PACK_RATE"),
            ("strided_copy_call", "P2PDMA_STRIDED_COPY_CALL"),
            ("strided_call_mib", "P2PDMA_STRIDED_CALL_MIB"),
        ] {
            if let Ok(v) = std::env::var(var) {
                c.set(key, &v)
                    .map_err(|e| Error::InvalidArgument(format!("{var}: {e}")))?;
            }
        }
        Ok(c)
    }

    /// Applies `key = value` lines (`#` starts a comment).
    pub fn apply_file(&mut self, text: &str) -> Result<()> {
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| {
                Error::InvalidArgument(format!("line {}: expected key = value", n + 1))
            })?;
            self.set(k.trim(), v.trim())
                .map_err(|e| Error::InvalidArgument(format!("line {}: {e}", n + 1)))?;
        }
        Ok(())
    }

    /// Sets one setting by name.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "path" => self.path = value.parse()?,
            "chunk" => {
                let v = parse_size(value)?;
                if !(4096..=MAX_CHUNK).contains(&v) {
                    return Err(Error::InvalidArgument(format!(
                        "chunk {v} outside 4 KiB..=64 MiB"
                    )));
                }
                self.chunk = Some(v);
            }
            "depth" => {
                let v: usize = value.parse().map_err(|_| {
                    Error::InvalidArgument(format!("depth '{value}' is not a number"))
                })?;
                if !(1..=MAX_DEPTH).contains(&v) {
                    return Err(Error::InvalidArgument(format!("depth {v} outside 1..=256")));
                }
                self.depth = Some(v);
            }
            "p2p_submit" => self.p2p_submit = value.parse()?,
            "page_cache" => self.page_cache = value.parse()?,
            "copy_threads" => {
                self.copy_threads = match value.trim() {
                    "auto" => None,
                    v => {
                        let n: usize = v.parse().map_err(|_| {
                            Error::InvalidArgument(format!(
                                "copy_threads '{value}' is not a number or auto"
                            ))
                        })?;
                        if !(1..=MAX_COPY_THREADS).contains(&n) {
                            return Err(Error::InvalidArgument(format!(
                                "copy_threads {n} outside 1..={MAX_COPY_THREADS}"
                            )));
                        }
                        Some(n)
                    }
                }
            }
            "cache_dir" => self.cache_dir = cache::parse_cache_dir(value),
            "strided_call" => self.strided.call = auto_or(value, parse_duration)?,
            "strided_storage_rate" => self.strided.storage_rate = auto_or(value, parse_rate)?,
            "strided_copy_rate" => self.strided.copy_rate = auto_or(value, parse_rate)?,
            "strided_pack_rate" => self.strided.pack_rate = auto_or(value, parse_rate)?,
            "strided_copy_call" => self.strided.copy_call = auto_or(value, parse_duration)?,
            "strided_call_mib" => self.strided.call_mib = auto_or(value, parse_duration)?,
            other => return Err(Error::InvalidArgument(format!("unknown setting '{other}'"))),
        }
        Ok(())
    }

    /// Chunk size and depth for a transfer of `len` bytes on storage with
    /// `block`-byte alignment, where AUTO chose `device` for the storage
    /// device: what is set wins; an unset chunk is `device.chunk`, smaller
    /// for small transfers (a quarter of the length, at least 64 KiB) so
    /// that they still pipeline; an unset depth is `device.depth`.
    pub fn geometry(&self, len: usize, block: usize, device: Geometry) -> (usize, usize) {
        let depth = self.depth.unwrap_or(device.depth).clamp(1, MAX_DEPTH);
        let top = device.chunk.clamp(MIN_CHUNK, MAX_CHUNK);
        let auto = (len / 4).next_power_of_two().clamp(MIN_CHUNK, top);
        let chunk = self.chunk.unwrap_or(auto).max(block);
        let chunk = chunk.div_ceil(block) * block;
        (chunk.div_ceil(4096) * 4096, depth)
    }
}

/// `None` for `auto` (measured), else the value `parse` makes of it.
fn auto_or<T>(value: &str, parse: impl Fn(&str) -> Result<T>) -> Result<Option<T>> {
    match value.trim() {
        "auto" => Ok(None),
        v => parse(v).map(Some),
    }
}

/// Parses `4096`, `64K`, `1M`, `2G` (binary units).
pub fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_lowercase() {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                _ => return Err(Error::InvalidArgument(format!("bad size '{s}'"))),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| Error::InvalidArgument(format!("bad size '{s}'")))
}

/// Parses a duration setting: a number with a unit, `ns`, `us` (or `µs`),
/// `ms` or `s`: `85us`, `0.2ms`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = || {
        Error::InvalidArgument(format!(
            "bad duration '{s}' (a number and a unit: ns, us, ms, s; e.g. 85us)"
        ))
    };
    let (num, scale) = [
        ("ns", 1e-9),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
    ]
    .iter()
    .find_map(|&(u, f)| t.strip_suffix(u).map(|n| (n, f)))
    .ok_or_else(bad)?;
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let secs = v * scale;
    if !(secs.is_finite() && secs > 0.0 && secs < 3600.0) {
        return Err(Error::InvalidArgument(format!(
            "duration '{s}' outside (0, 1 hour)"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a rate setting: bytes per second as a size (`2G`, `800M`,
/// binary units), optionally followed by `/s`.
pub fn parse_rate(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let v = parse_size(t).map_err(|_| {
        Error::InvalidArgument(format!(
            "bad rate '{s}' (bytes per second: e.g. 2G or 800M/s)"
        ))
    })?;
    if v == 0 {
        return Err(Error::InvalidArgument(format!("rate '{s}' is 0")));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_and_values() {
        let mut c = Config::default();
        c.apply_file(
            "# comment\npath = bounce\nchunk=2M # two\n\ndepth = 16\np2p_submit = odirect\n",
        )
        .unwrap();
        assert_eq!(c.p2p_submit, P2pSubmit::Odirect);
        assert!(c.apply_file("p2p_submit = sideways").is_err());
        assert_eq!(c.path, PathPref::Bounce);
        assert_eq!(c.chunk, Some(2 << 20));
        assert_eq!(c.depth, Some(16));
        assert!(c.apply_file("path = sideways").is_err());
        assert!(c.apply_file("chunk = 1").is_err());
        assert!(c.apply_file("depth = 0").is_err());
        assert!(c.apply_file("color = blue").is_err());
        assert!(c.apply_file("no equals sign").is_err());
        assert_eq!("NVME-CMD".parse::<PathPref>().unwrap(), PathPref::NvmeCmd);
    }

    #[test]
    fn sizes_parse_and_overflow_is_an_error() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn geometry_is_block_aligned() {
        let dev = Geometry {
            chunk: 4 << 20,
            depth: 8,
        };
        let c = Config::default();
        assert_eq!(c.geometry(256 << 20, 4096, dev), (4 << 20, 8));
        assert_eq!(c.geometry(4 << 20, 4096, dev), (1 << 20, 8));
        assert_eq!(c.geometry(4096, 4096, dev), (64 << 10, 8));
        let c = Config {
            chunk: Some(5000),
            depth: Some(3),
            ..Default::default()
        };
        assert_eq!(c.geometry(1 << 30, 4096, dev), (8192, 3));
        // Only the depth set: the device's chunk.
        let c = Config {
            depth: Some(2),
            ..Default::default()
        };
        assert_eq!(c.geometry(1 << 30, 512, dev), (4 << 20, 2));
    }

    #[test]
    fn copy_threads_and_cache_dir_settings() {
        let mut c = Config::default();
        c.apply_file("copy_threads = 3\ncache_dir = /tmp/x\n")
            .unwrap();
        assert_eq!(c.copy_threads, Some(3));
        assert_eq!(c.cache_dir, Some(PathBuf::from("/tmp/x")));
        c.apply_file("copy_threads = auto\ncache_dir = off")
            .unwrap();
        assert_eq!((c.copy_threads, c.cache_dir.clone()), (None, None));
        assert!(c.set("copy_threads", "0").is_err());
        assert!(c.set("copy_threads", "65").is_err());
        assert!(c.set("copy_threads", "many").is_err());
    }

    #[test]
    fn strided_constants_settings() {
        let mut c = Config::default();
        c.apply_file(
            "strided_call = 85us\nstrided_storage_rate = 2G\nstrided_copy_rate = 800M/s\n\
             strided_pack_rate = 10G\nstrided_copy_call = 0.5us\nstrided_call_mib = 3ms\n",
        )
        .unwrap();
        assert_eq!(
            c.strided,
            StridedConstants {
                call: Some(Duration::from_micros(85)),
                storage_rate: Some(2 << 30),
                copy_rate: Some(800 << 20),
                pack_rate: Some(10 << 30),
                copy_call: Some(Duration::from_nanos(500)),
                call_mib: Some(Duration::from_millis(3)),
            }
        );
        c.set("strided_call", "auto").unwrap();
        assert_eq!(c.strided.call, None);
        for (k, v) in [
            ("strided_call", "85"),
            ("strided_call", "-1us"),
            ("strided_storage_rate", "0"),
            ("strided_copy_rate", "fast"),
            ("strided_copy_call", "1 lightyear"),
        ] {
            assert!(c.set(k, v).is_err(), "{k} = {v}");
        }
    }
}
