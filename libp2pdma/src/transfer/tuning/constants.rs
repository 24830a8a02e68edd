//! The constants of the strided cost model ([`crate::transfer::strided::plan`]):
//! measured on the machine, kept, and overridable.
//!
//! | Constant | What | Measured by |
//! |---|---|---|
//! | call (k) | seconds one engine read costs a thread beyond its bytes | small reads on the pair's path, on SC's threads |
//! | storage (s) | storage bytes per second of a large read | pipelined reads into host slots, no copies |
//! | copy (c) | bytes per second copied from host memory into the memory | large copies into memory of the same kind |
//! | pack (p) | bytes per second gathered from runs into a packed host buffer | packing 4 KiB runs on the host |
//! | copy call (q) | seconds putting one run into the memory costs beyond its bytes | TaT's placer on 512-byte runs in the memory |
//! | call MiB (k1) | seconds one 1 MiB engine read costs a thread | 1 MiB reads on the pair's path, on SC's threads |
//!
//! Each constant comes from, in order: the configuration (`strided_call`
//! and the others, [`super::config::Config`]), the cache (`strided.json` in the
//! cache directory, one entry per storage device, memory and path, written
//! by `p2pdma-ctl calibrate` or by the quick measurement), a quick
//! measurement the first time a strided transfer needs the constants
//! (well under a second, stored), else the defaults. The reason AUTO gives
//! says which, for each.
//!
//! Measurements never touch the caller's memory: they copy into scratch
//! memory of the same kind (host memory, or an allocation on the same
//! accelerator). Nothing here makes a transfer fail: a missing, corrupt or
//! unwritable cache, or a measurement that fails, only means the defaults.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::Instant,
};

use serde_json::{json, Value};

use super::{cache, cache::DeviceKey, config::StridedConstants};
use crate::{
    memory::{DeviceMemory, MemoryKind},
    transfer::plan::TransferPath,
    Error, Result,
};

/// Default per-call cost: a small read's round trip, between NVMe hardware
/// (tens of microseconds) and the development VM (about 215 µs).
pub const DEFAULT_CALL_S: f64 = 100e-6;
/// Default storage throughput.
pub const DEFAULT_STORAGE_BPS: f64 = 2.0 * GIB;
/// Default copy throughput into device memory.
pub const DEFAULT_COPY_BPS: f64 = 4.0 * GIB;
/// Default packing throughput on the host.
pub const DEFAULT_PACK_BPS: f64 = 8.0 * GIB;
/// Default per-copy cost into device memory.
pub const DEFAULT_COPY_CALL_S: f64 = 1e-6;
/// Default cost of a 1 MiB read to a thread: a small read's, plus the
/// thread's share of the storage's default rate with [`SC_THREADS`]
/// reading at once.
///
pub const DEFAULT_CALL_MIB_S: f64 =
    DEFAULT_CALL_S + (SC_THREADS * MIB) as f64 / DEFAULT_STORAGE_BPS;

/// Threads SC issues its reads from (and TaT its groups' reads), each a
/// share of the runs in file order, one engine read after another (as many
/// as the engine's asynchronous workers).
pub const SC_THREADS: usize = 4;

const GIB: f64 = (1u64 << 30) as f64;
pub(crate) const MIB: usize = 1 << 20;

/// The cost model's constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constants {
    /// Seconds one engine read costs a thread beyond its bytes (k).
    pub call_s: f64,
    /// Storage bytes per second (s).
    pub storage_bps: f64,
    /// Bytes per second copied from host memory into the memory (c).
    pub copy_bps: f64,
    /// Bytes per second gathered from runs into a packed host buffer (p).
    pub pack_bps: f64,
    /// Seconds putting one run into the memory costs beyond its bytes
    /// (TaT's placing of each run; a copy per run between host memory and
    /// the memory) (q).
    pub copy_call_s: f64,
    /// Seconds one 1 MiB engine read costs a thread while SC's threads
    /// read at once (k1): with the small read's, how a read's cost grows
    /// with its length before it streams at the storage's rate.
    pub call_mib_s: f64,
}

impl Default for Constants {
    fn default() -> Self {
        Self {
            call_s: DEFAULT_CALL_S,
            storage_bps: DEFAULT_STORAGE_BPS,
            copy_bps: DEFAULT_COPY_BPS,
            pack_bps: DEFAULT_PACK_BPS,
            copy_call_s: DEFAULT_COPY_CALL_S,
            call_mib_s: DEFAULT_CALL_MIB_S,
        }
    }
}

/// Where a constant's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The configuration (a setting or its environment variable).
    Config,
    /// The cache, from an earlier calibration or quick measurement.
    Stored,
    /// Measured by this process.
    Measured,
    /// Nothing better was known.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Config => "config",
            Source::Stored => "stored",
            Source::Measured => "measured now",
            Source::Default => "default",
        })
    }
}

/// Constants that may be known or not, one by one: what a measurement or a
/// cache entry holds, and what the configuration sets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Partial {
    /// See [`Constants::call_s`].
    pub call_s: Option<f64>,
    /// See [`Constants::storage_bps`].
    pub storage_bps: Option<f64>,
    /// See [`Constants::copy_bps`].
    pub copy_bps: Option<f64>,
    /// See [`Constants::pack_bps`].
    pub pack_bps: Option<f64>,
    /// See [`Constants::copy_call_s`].
    pub copy_call_s: Option<f64>,
    /// See [`Constants::call_mib_s`].
    pub call_mib_s: Option<f64>,
}

/// The names the constants go by, in the cache and in reasons, in the
/// order of [`Partial::fields`].
const NAMES: [&str; 6] = [
    "call_s",
    "storage_bps",
    "copy_bps",
    "pack_bps",
    "copy_call_s",
    "call_mib_s",
];

impl Partial {
    fn fields(&self) -> [Option<f64>; 6] {
        [
            self.call_s,
            self.storage_bps,
            self.copy_bps,
            self.pack_bps,
            self.copy_call_s,
            self.call_mib_s,
        ]
    }

    fn fields_mut(&mut self) -> [&mut Option<f64>; 6] {
        [
            &mut self.call_s,
            &mut self.storage_bps,
            &mut self.copy_bps,
            &mut self.pack_bps,
            &mut self.copy_call_s,
            &mut self.call_mib_s,
        ]
    }

    /// What the configuration sets.
    pub fn from_config(c: &StridedConstants) -> Self {
        Self {
            call_s: c.call.map(|d| d.as_secs_f64()),
            storage_bps: c.storage_rate.map(|r| r as f64),
            copy_bps: c.copy_rate.map(|r| r as f64),
            pack_bps: c.pack_rate.map(|r| r as f64),
            copy_call_s: c.copy_call.map(|d| d.as_secs_f64()),
            call_mib_s: c.call_mib.map(|d| d.as_secs_f64()),
        }
    }

    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(Option::is_none)
    }

    /// `self`, with what it does not know taken from `other`.
    pub fn or(mut self, other: &Partial) -> Partial {
        for (mine, theirs) in self.fields_mut().into_iter().zip(other.fields()) {
            if mine.is_none() {
                *mine = theirs;
            }
        }
        self
    }
}

/// The constants a strided transfer uses, and where each came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    /// The values.
    pub constants: Constants,
    /// Their sources, in the order call, storage, copy, pack, copy call,
    /// call MiB.
    pub sources: [Source; 6],
}

impl Resolved {
    /// Each constant from the first of `layers` that knows it, else the
    /// default.
    pub fn from_layers(layers: &[(Source, Partial)]) -> Self {
        let d = Constants::default();
        let defaults = [
            d.call_s,
            d.storage_bps,
            d.copy_bps,
            d.pack_bps,
            d.copy_call_s,
            d.call_mib_s,
        ];
        let mut values = defaults;
        let mut sources = [Source::Default; 6];
        for i in 0..6 {
            if let Some((src, v)) = layers
                .iter()
                .find_map(|(s, p)| p.fields()[i].map(|v| (*s, v)))
            {
                values[i] = v;
                sources[i] = src;
            }
        }
        Self {
            constants: Constants {
                call_s: values[0],
                storage_bps: values[1],
                copy_bps: values[2],
                pack_bps: values[3],
                copy_call_s: values[4],
                call_mib_s: values[5],
            },
            sources,
        }
    }

    /// The constants in words, each with its source, for a reason:
    /// `call 85 µs (stored), call MiB 2100 µs (stored), storage 1.90 GiB/s
    /// (stored), ...`.
    pub fn describe(&self) -> String {
        let c = &self.constants;
        let s = &self.sources;
        format!(
            "call {:.1} µs ({}), call MiB {:.0} µs ({}), storage {:.2} GiB/s ({}), {}",
            c.call_s * 1e6,
            s[0],
            c.call_mib_s * 1e6,
            s[5],
            c.storage_bps / GIB,
            s[1],
            self.describe_copies()
        )
    }
}

impl Resolved {
    /// The constants of copies between host memory and the memory, each
    /// with its source: `copy 10.23 GiB/s (stored), ...`.
    pub fn describe_copies(&self) -> String {
        let c = &self.constants;
        let s = &self.sources;
        format!(
            "copy {:.2} GiB/s ({}), pack {:.2} GiB/s ({}), copy call {:.3} µs ({})",
            c.copy_bps / GIB,
            s[2],
            c.pack_bps / GIB,
            s[3],
            c.copy_call_s * 1e6,
            s[4]
        )
    }
}

/// What a cache entry is for: a storage device, memory and path (all the
/// constants), or memory alone (the copy and pack constants, for strided
/// copies between host memory and the memory).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The storage device and the path, for storage entries.
    pub storage: Option<(DeviceKey, TransferPath)>,
    /// The memory, as [`memory_name`] names it.
    pub memory: String,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.storage {
            Some((dev, path)) => write!(f, "{dev} into {} on the {path} path", self.memory),
            None => write!(f, "host memory into {}", self.memory),
        }
    }
}

/// The name of a kind of memory in the cache: `host`, `accel PCI` or
/// `cuda PCI` (device memory is recognised by its device's PCI address).
pub fn memory_name(kind: &MemoryKind) -> String {
    match kind {
        MemoryKind::Host => "host".into(),
        MemoryKind::Dmabuf => "dmabuf".into(),
        MemoryKind::ModuleBar { pci, .. } => format!("accel {pci}"),
        MemoryKind::Cuda { pci: Some(pci), .. } => format!("cuda {pci}"),
        MemoryKind::Cuda { ordinal, pci: None } => format!("cuda {ordinal}"),
    }
}

/// The file that keeps measured constants: `DIR/strided.json`, an object
/// whose `constants` array holds one entry per [`Key`]. Entries it cannot
/// read, and values that are not positive finite numbers, are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    file: PathBuf,
}

/// Name of the file in the cache directory.
const STORE_FILE: &str = "strided.json";

impl Store {
    /// The store in directory `dir`.
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        Self {
            file: dir.as_ref().join(STORE_FILE),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.file
    }

    fn entries(&self) -> Vec<(Key, Partial, Value)> {
        let Ok(text) = std::fs::read_to_string(&self.file) else {
            return Vec::new();
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            return Vec::new();
        };
        v.get("constants")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|e| parse_entry(e).map(|(k, p)| (k, p, e.clone())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What is stored for `key`; empty when nothing is.
    pub fn lookup(&self, key: &Key) -> Partial {
        self.entries()
            .into_iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, p, _)| p)
            .next_back()
            .unwrap_or_default()
    }

    /// Records `values` for `key`, replacing its entry; `how` says how they
    /// were measured. Other entries are kept as they were.
    pub fn store(&self, key: &Key, values: &Partial, how: &str) -> std::io::Result<()> {
        let mut list: Vec<Value> = self
            .entries()
            .into_iter()
            .filter(|(k, _, _)| k != key)
            .map(|(_, _, e)| e)
            .collect();
        list.push(entry_json(key, values, how));
        let doc = json!({
            "about": "p2pdma: the strided cost model's constants, per storage device, memory and path (p2pdma-ctl calibrate refreshes them; delete to measure again)",
            "constants": list,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n";
        cache::replace_file(&self.file, &text)
    }

    /// Removes the entry of `key`; whether there was one.
    pub fn forget(&self, key: &Key) -> std::io::Result<bool> {
        let entries = self.entries();
        if !entries.iter().any(|(k, _, _)| k == key) {
            return Ok(false);
        }
        let list: Vec<Value> = entries
            .into_iter()
            .filter(|(k, _, _)| k != key)
            .map(|(_, _, e)| e)
            .collect();
        let doc = json!({ "constants": list });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n";
        cache::replace_file(&self.file, &text).map(|()| true)
    }
}

fn entry_json(key: &Key, values: &Partial, how: &str) -> Value {
    let mut e = serde_json::Map::new();
    if let Some((dev, path)) = &key.storage {
        e.insert("storage".into(), json!(dev.dev.to_string()));
        e.insert("model".into(), json!(dev.model));
        e.insert("serial".into(), json!(dev.serial));
        e.insert("path".into(), json!(path.as_str()));
    }
    e.insert("memory".into(), json!(key.memory));
    for (name, v) in NAMES.iter().zip(values.fields()) {
        if let Some(v) = v {
            e.insert((*name).into(), json!(v));
        }
    }
    e.insert("how".into(), json!(how));
    Value::Object(e)
}

fn parse_entry(e: &Value) -> Option<(Key, Partial)> {
    let s = |k: &str| e.get(k).and_then(Value::as_str);
    let storage = match s("storage") {
        None => None,
        Some(dev) => {
            let key = DeviceKey::from_parts(dev, s("model")?, s("serial")?)?;
            let path = match s("path")? {
                "p2p" => TransferPath::P2p,
                "bounce" => TransferPath::Bounce,
                "nvme-cmd" => TransferPath::NvmeCmd,
                "direct" => TransferPath::Direct,
                _ => return None,
            };
            Some((key, path))
        }
    };
    let key = Key {
        storage,
        memory: s("memory")?.to_string(),
    };
    let mut p = Partial::default();
    for (name, slot) in NAMES.iter().zip(p.fields_mut()) {
        *slot = e
            .get(*name)
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite() && *v > 0.0);
    }
    Some((key, p))
}

/// How much a measurement reads and copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effort {
    /// The first strided transfer's: well under a second.
    Quick,
    /// `p2pdma-ctl calibrate`'s: larger samples, best of more rounds.
    Full,
}

impl Effort {
    /// Storage bytes per sample and rounds, small calls, bytes copied (and
    /// packed) per sample and rounds. The copies are larger than a CPU's
    /// caches, as a transfer's are: the bytes come fresh from storage.
    pub(crate) fn sizes(self) -> (usize, usize, u64, usize, usize) {
        match self {
            Effort::Quick => (32 * MIB, 1, 64, 32 * MIB, 2),
            Effort::Full => (256 * MIB, 2, 1024, 64 * MIB, 4),
        }
    }
}

/// The best of `rounds` runs of `f` (each a rate or a time per unit, as
/// `better` compares them); the first error if no round worked.
pub(crate) fn best_of(
    rounds: usize,
    mut f: impl FnMut() -> Result<f64>,
    lower: bool,
) -> Result<f64> {
    let mut best: Option<f64> = None;
    let mut err = None;
    for _ in 0..rounds.max(1) {
        match f() {
            Ok(v) => {
                best = Some(match best {
                    Some(b) if (lower && b <= v) || (!lower && b >= v) => b,
                    _ => v,
                })
            }
            Err(e) => err = Some(e),
        }
    }
    best.ok_or_else(|| err.unwrap_or_else(|| Error::InvalidArgument("nothing measured".into())))
}

/// Packing throughput on the host: runs of 4 KiB, 4 KiB apart, gathered
/// into one buffer.
pub fn measure_pack(effort: Effort) -> f64 {
    let (_, _, _, bytes, rounds) = effort.sizes();
    let run = 4096;
    let src = vec![0x5Au8; bytes];
    let mut dst = Vec::with_capacity(bytes / 2);
    let mut best = 0.0f64;
    // The first round only touches the destination's pages.
    for _ in 0..=rounds {
        dst.clear();
        let t = Instant::now();
        for r in src.chunks(2 * run) {
            dst.extend_from_slice(&r[..run.min(r.len())]);
        }
        let took = t.elapsed().as_secs_f64().max(1e-9);
        std::hint::black_box(&dst);
        best = best.max(dst.len() as f64 / took);
    }
    best
}

/// Copy throughput from host memory into `mem`: copies of its whole
/// length, the best of a few (a first one not counted: it touches the
/// pages).
pub fn measure_copies(mem: &dyn DeviceMemory, effort: Effort) -> Result<f64> {
    let (_, _, _, _, rounds) = effort.sizes();
    let len = mem.len();
    let src = vec![0xA5u8; len];
    mem.write_at(0, &src)?;
    best_of(
        rounds,
        || {
            let t = Instant::now();
            mem.write_at(0, &src)?;
            Ok(len as f64 / t.elapsed().as_secs_f64().max(1e-9))
        },
        false,
    )
}

/// A measurement's result: what could be measured, and why the rest could
/// not.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// The values measured.
    pub values: Partial,
    /// What failed, in words (empty when everything was measured).
    pub failures: Vec<String>,
}

/// What an engine knows of one key's constants.
#[derive(Clone, Copy, Debug)]
pub enum KnownConstants {
    /// Read from the store or measured.
    Have(Partial, Source),
    /// Nothing yet: the next strided transfer measures.
    Unknown,
    /// A measurement is running.
    Measuring,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::{
        discovery::fake::TempDir,
        transfer::tuning::config::{parse_duration, parse_rate},
    };

    fn dev(minor: u32) -> DeviceKey {
        DeviceKey::from_parts(&format!("259:{minor}"), "Model X", "S1").unwrap()
    }

    fn key(minor: u32, path: TransferPath, memory: &str) -> Key {
        Key {
            storage: Some((dev(minor), path)),
            memory: memory.into(),
        }
    }

    #[test]
    fn the_store_keeps_one_entry_per_key_and_ignores_junk() {
        let dir = TempDir::new("strided-store");
        let store = Store::in_dir(dir.path().join("sub"));
        let a = key(0, TransferPath::Bounce, "host");
        let b = key(0, TransferPath::P2p, "accel 0000:04:00.0");
        let mem_only = Key {
            storage: None,
            memory: "host".into(),
        };
        assert!(store.lookup(&a).is_empty());
        let va = Partial {
            call_s: Some(85e-6),
            storage_bps: Some(2e9),
            copy_bps: Some(5e9),
            pack_bps: Some(9e9),
            copy_call_s: Some(1e-7),
            call_mib_s: Some(3e-3),
        };
        let vb = Partial {
            call_s: Some(20e-6),
            ..Partial::default()
        };
        store.store(&a, &va, "test").unwrap();
        store.store(&b, &vb, "test").unwrap();
        store.store(&mem_only, &vb, "test").unwrap();
        assert_eq!(store.lookup(&a), va);
        assert_eq!(store.lookup(&b), vb);
        assert_eq!(store.lookup(&mem_only), vb);
        // Other devices, paths and memories are other keys.
        assert!(store
            .lookup(&key(1, TransferPath::Bounce, "host"))
            .is_empty());
        assert!(store
            .lookup(&key(0, TransferPath::NvmeCmd, "host"))
            .is_empty());
        // Replaced, not duplicated.
        let va2 = Partial {
            storage_bps: Some(1e9),
            ..va
        };
        store.store(&a, &va2, "again").unwrap();
        assert_eq!(store.lookup(&a), va2);
        let text = std::fs::read_to_string(store.path()).unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["constants"].as_array().unwrap().len(), 3);
        // Junk entries and bad values are skipped, the rest still read.
        let mut doc = doc;
        let list = doc["constants"].as_array_mut().unwrap();
        list.push(json!("garbage"));
        list.push(json!({"memory": 5}));
        list.push(
            json!({"storage": "x:y", "model": "m", "serial": "s", "path": "p2p", "memory": "host"}),
        );
        list.push(json!({"storage": "259:9", "model": "m", "serial": "s", "path": "sideways", "memory": "host"}));
        list.push(
            json!({"storage": "259:0", "model": "Model X", "serial": "S1", "path": "p2p",
            "memory": "host", "call_s": -1.0, "storage_bps": "fast", "copy_bps": 3e9}),
        );
        std::fs::write(store.path(), serde_json::to_string(&doc).unwrap()).unwrap();
        assert_eq!(store.lookup(&a), va2);
        assert_eq!(
            store.lookup(&key(0, TransferPath::P2p, "host")),
            Partial {
                copy_bps: Some(3e9),
                ..Partial::default()
            }
        );
        // A file that is not JSON is as good as none.
        std::fs::write(store.path(), "{ not json").unwrap();
        assert!(store.lookup(&a).is_empty());
        store.store(&a, &va, "over junk").unwrap();
        assert_eq!(store.lookup(&a), va);
        // Forgetting removes one entry.
        store.store(&b, &vb, "test").unwrap();
        assert!(store.forget(&a).unwrap());
        assert!(!store.forget(&a).unwrap());
        assert!(store.lookup(&a).is_empty());
        assert_eq!(store.lookup(&b), vb);
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [STORE_FILE]);
        // A store that cannot be written is an error for the caller to
        // ignore, not a panic.
        let blocked = Store::in_dir(store.path().join("not-a-dir"));
        assert!(blocked.store(&a, &va, "x").is_err());
        assert!(blocked.lookup(&a).is_empty());
    }

    #[test]
    fn each_constant_comes_from_the_first_layer_that_knows_it() {
        let config = Partial {
            call_s: Some(5e-6),
            ..Partial::default()
        };
        let stored = Partial {
            call_s: Some(80e-6),
            storage_bps: Some(3e9),
            pack_bps: Some(1e10),
            call_mib_s: Some(2e-3),
            ..Partial::default()
        };
        let r = Resolved::from_layers(&[(Source::Config, config), (Source::Stored, stored)]);
        assert_eq!(
            r.constants,
            Constants {
                call_s: 5e-6,
                storage_bps: 3e9,
                copy_bps: DEFAULT_COPY_BPS,
                pack_bps: 1e10,
                copy_call_s: DEFAULT_COPY_CALL_S,
                call_mib_s: 2e-3,
            }
        );
        assert_eq!(
            r.sources,
            [
                Source::Config,
                Source::Stored,
                Source::Default,
                Source::Stored,
                Source::Default,
                Source::Stored
            ]
        );
        let said = r.describe();
        assert!(
            said.starts_with(
                "call 5.0 µs (config), call MiB 2000 µs (stored), storage 2.79 GiB/s (stored), copy 4.00 GiB/s (default)"
            ),
            "{said}"
        );
        assert_eq!(Resolved::from_layers(&[]).constants, Constants::default());
        assert_eq!(config.or(&stored).storage_bps, Some(3e9));
        assert_eq!(config.or(&stored).call_s, Some(5e-6));
    }

    #[test]
    fn durations_and_rates_parse_and_bad_ones_are_errors() {
        assert_eq!(parse_duration("85us").unwrap(), Duration::from_micros(85));
        assert_eq!(
            parse_duration(" 0.2ms ").unwrap(),
            Duration::from_micros(200)
        );
        assert_eq!(parse_duration("1µs").unwrap(), Duration::from_micros(1));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        for bad in ["85", "us", "-1us", "0ms", "NaNs", "1e9s", "fast"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_rate("2G").unwrap(), 2 << 30);
        assert_eq!(parse_rate("800M/s").unwrap(), 800 << 20);
        for bad in ["0", "x", "/s", "-1G"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn memory_names() {
        assert_eq!(memory_name(&MemoryKind::Host), "host");
        let pci = "0000:04:00.0".parse().unwrap();
        assert_eq!(
            memory_name(&MemoryKind::ModuleBar { index: 0, pci }),
            "accel 0000:04:00.0"
        );
    }
}
