//! The store killed mid-update: a child process runs an update-heavy
//! sequence (creates, writes through a write-back cache in accelerator
//! memory, resizes, deletes, flushes, with prefetches held in flight
//! across them) and says on a pipe when each operation begins and returns;
//! the parent kills it with SIGKILL at a random point, reopens the store and
//! checks it against what had returned: the map of the last returned
//! operation (or of the one in flight, had it committed), and every byte
//! that was durable. The store is small and objects are deleted often, so
//! its free space is fragmented and grows move objects into holes beside
//! their own blocks. A child also checks each prefetch it consumes against
//! what the object held when the prefetch started, and stops with an error
//! when one differs.
//!
//! With `--memory host` it runs without the module: the cache and buffers
//! in host memory, the store's file read and written on the bounce path.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use clap::Args;
use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    store::{EngineBacking, PageCache, Prefetch, Store, WritePolicy},
    transfer::{Config, Engine, PathPref, StorageFile},
    MemRange, Module,
};

#[derive(Args)]
pub struct CrashArgs {
    /// The store's file (created at `--size`).
    #[arg(long)]
    path: String,
    /// Bytes of the store's file: small, so that its free space is
    /// fragmented.
    #[arg(long, default_value_t = 6 << 20)]
    size: u64,
    /// Where the cache and the buffers live: `accel` (the module's
    /// accelerator memory) or `host` (no module needed).
    #[arg(long, default_value = "accel")]
    memory: String,
    /// The engine's path preference.
    #[arg(long, default_value = "auto")]
    engine_path: PathPref,
    /// Processes to kill.
    #[arg(long, default_value_t = 20)]
    runs: u64,
    /// The first run's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run as the child: the sequence of `--seed`, forever, each line it
    /// prints prefixed with `--prefix`.
    #[arg(long)]
    child: bool,
    /// See `--child`.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Check the store on `--path` against the lines a child printed
    /// (those with `--prefix`) before it died with its machine.
    #[arg(long)]
    check_log: Option<String>,
}

/// Largest object.
const MAX: usize = 192 << 10;

/// An operation, as the child announces it.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    Create(u64),
    Write {
        id: u64,
        off: usize,
        n: usize,
        seed: u64,
    },
    Resize(u64, u64),
    Delete(u64),
    Flush,
}

impl Op {
    fn line(&self) -> String {
        match *self {
            Op::Create(n) => format!("C {n}"),
            Op::Write { id, off, n, seed } => format!("W {id} {off} {n} {seed}"),
            Op::Resize(id, n) => format!("Z {id} {n}"),
            Op::Delete(id) => format!("D {id}"),
            Op::Flush => "F".into(),
        }
    }

    fn parse(s: &str) -> Option<Self> {
        let v: Vec<u64> = s
            .split(' ')
            .skip(1)
            .map(|w| w.parse().ok())
            .collect::<Option<_>>()?;
        Some(match (s.split(' ').next()?, v.as_slice()) {
            ("C", [n]) => Op::Create(*n),
            ("W", [id, off, n, seed]) => Op::Write {
                id: *id,
                off: *off as usize,
                n: *n as usize,
                seed: *seed,
            },
            ("Z", [id, n]) => Op::Resize(*id, *n),
            ("D", [id]) => Op::Delete(*id),
            ("F", []) => Op::Flush,
            _ => return None,
        })
    }
}

/// The bytes a write with `seed` writes.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut r = fastrand::Rng::with_seed(seed);
    (0..n).map(|_| r.u8(..)).collect()
}

/// An object of the model: its bytes, the bytes as of the last point they
/// were durable, and which were written since.
#[derive(Clone, Debug)]
struct Obj {
    data: Vec<u8>,
    flushed: Vec<u8>,
    dirty: Vec<bool>,
}

type Model = BTreeMap<u64, Obj>;

fn durable(m: &mut Model) {
    for o in m.values_mut() {
        o.flushed = o.data.clone();
        o.dirty = vec![false; o.data.len()];
    }
}

/// `op` applied to the model, as when it returned (`id` for a create).
fn apply(m: &mut Model, op: &Op, id: Option<u64>) {
    match *op {
        Op::Create(n) => {
            let n = n as usize;
            m.insert(
                id.unwrap_or(u64::MAX),
                Obj {
                    data: vec![0; n],
                    flushed: vec![0; n],
                    dirty: vec![false; n],
                },
            );
            durable(m);
        }
        Op::Write { id, off, n, seed } => {
            if let Some(o) = m.get_mut(&id) {
                o.data[off..off + n].copy_from_slice(&bytes(seed, n));
                o.dirty[off..off + n].iter_mut().for_each(|d| *d = true);
            }
        }
        Op::Resize(id, n) => {
            if let Some(o) = m.get_mut(&id) {
                o.data.resize(n as usize, 0);
                o.dirty.resize(n as usize, false);
            }
            durable(m);
        }
        Op::Delete(id) => {
            m.remove(&id);
            durable(m);
        }
        Op::Flush => durable(m),
    }
}

/// The module, unless the run is in host memory.
fn module(x: &CrashArgs) -> Result<Option<Arc<Module>>, String> {
    match x.memory.as_str() {
        "host" => Ok(None),
        "accel" => Ok(Some(Arc::new(Module::open().map_err(|e| e.to_string())?))),
        m => Err(format!("--memory {m}: host or accel")),
    }
}

/// `len` bytes of accelerator memory, or of host memory without a module.
fn memory(module: &Option<Arc<Module>>, len: usize) -> Result<Arc<dyn DeviceMemory>, String> {
    Ok(match module {
        Some(m) => Arc::new(crate::store::accel_memory_on(m, 0, len)?),
        None => Arc::new(HostMemory::new(len).map_err(|e| e.to_string())?),
    })
}

fn engine(x: &CrashArgs, module: &Option<Arc<Module>>) -> Arc<Engine> {
    Arc::new(Engine::new(
        Config {
            path: x.engine_path,
            ..Config::default()
        },
        module.clone(),
    ))
}

fn backing(x: &CrashArgs, engine: &Arc<Engine>) -> Result<Arc<EngineBacking>, String> {
    let file = Arc::new(StorageFile::open_rw(&x.path).map_err(|e| e.to_string())?);
    Ok(Arc::new(EngineBacking::new(engine.clone(), file)))
}

/// A prefetch the child holds: the object's bytes when it started, and
/// which of them the child wrote since (not checked).
struct Held {
    p: Prefetch,
    id: u64,
    off: usize,
    want: Vec<u8>,
    raced: Vec<bool>,
}

/// Consumes `h` and checks its bytes.
fn consume(store: &Store, h: Held, buf: &dyn DeviceMemory) -> Result<(), String> {
    let n = h.want.len();
    MemRange::new(buf, 0, n)
        .and_then(|range| store.consume_prefetch_pread(h.p, range))
        .map_err(|e| format!("consuming a prefetch of object {}: {e}", h.id))?;
    let mut got = vec![0u8; n];
    buf.read_at(0, &mut got).map_err(|e| e.to_string())?;
    match (0..n).find(|&i| !h.raced[i] && got[i] != h.want[i]) {
        Some(i) => Err(format!(
            "a prefetch of object {} at {} read byte {i} as {:#x}, not {:#x}",
            h.id, h.off, got[i], h.want[i]
        )),
        None => Ok(()),
    }
}

/// The child: a fresh store, a write-back cache of six pages in
/// accelerator memory, and updates until it is killed; `B op` before each
/// operation and `E [id]` when it returns, on stdout. Up to three
/// prefetches are held across other operations.
fn child(x: &CrashArgs) -> Result<(), String> {
    let module = module(x)?;
    let engine = engine(x, &module);
    let cache = PageCache::new(memory(&module, 6 * 4096)?, 4096, WritePolicy::WriteBack)
        .map_err(|e| e.to_string())?;
    let store = Store::format(backing(x, &engine)?, 64)
        .map_err(|e| e.to_string())?
        .with_cache(cache);
    let buf = memory(&module, MAX)?;
    let mut rng = fastrand::Rng::with_seed(x.seed);
    let mut model = Model::new();
    let mut held: Vec<Held> = Vec::new();
    let out = std::io::stdout();
    let p = &x.prefix;
    {
        let mut o = out.lock();
        writeln!(o, "{p}READY")
            .and_then(|()| o.flush())
            .map_err(|e| e.to_string())?;
    }
    for i in 0u64.. {
        let ids: Vec<u64> = model.keys().copied().collect();
        let pick = |rng: &mut fastrand::Rng| ids[rng.usize(..ids.len())];
        let op = match rng.u8(..12) {
            _ if ids.is_empty() => Op::Create(rng.u64(1..MAX as u64)),
            0 if ids.len() < 40 => Op::Create(rng.u64(1..MAX as u64 / 4)),
            // Grows, most of them: into holes beside the object's blocks.
            1 | 2 => {
                let id = pick(&mut rng);
                let size = model[&id].data.len() as u64;
                let grow = (size + rng.u64(1..=size.max(4096))).min(MAX as u64);
                Op::Resize(
                    id,
                    if rng.u8(..4) == 0 {
                        rng.u64(1..MAX as u64)
                    } else {
                        grow
                    },
                )
            }
            3 if ids.len() > 3 => Op::Delete(pick(&mut rng)),
            4 => Op::Flush,
            5 if held.len() < 3 => {
                let id = pick(&mut rng);
                let size = model[&id].data.len();
                let n = rng.usize(1..=size);
                let off = rng.usize(..=size - n);
                let p = store
                    .pread_prefetch(id, off as u64, n)
                    .map_err(|e| format!("prefetch of object {id}: {e}"))?;
                held.push(Held {
                    p,
                    id,
                    off,
                    want: model[&id].data[off..off + n].to_vec(),
                    raced: vec![false; n],
                });
                continue;
            }
            6 if !held.is_empty() => {
                let h = held.swap_remove(rng.usize(..held.len()));
                consume(&store, h, buf.as_ref())?;
                continue;
            }
            _ => {
                let id = pick(&mut rng);
                let size = model[&id].data.len();
                let off = rng.usize(..size);
                let n = rng.usize(1..=size - off);
                Op::Write {
                    id,
                    off,
                    n,
                    seed: x.seed << 32 | i,
                }
            }
        };
        if let Op::Write { id, off, n, .. } = op {
            for h in held.iter_mut().filter(|h| h.id == id) {
                for j in off.max(h.off)..(off + n).min(h.off + h.want.len()) {
                    h.raced[j - h.off] = true;
                }
            }
        }
        {
            let mut o = out.lock();
            writeln!(o, "{p}B {}", op.line()).map_err(|e| e.to_string())?;
            o.flush().map_err(|e| e.to_string())?;
        }
        let err = |e: p2pdma::Error| format!("{}: {e}", op.line());
        // A full store refuses a create or a grow and changes nothing:
        // `None` then, else `Some` of the id a create made.
        let full = |e: &p2pdma::Error| e.to_string().contains("no free run");
        let id = match op {
            Op::Create(n) => match store.pcreate(n) {
                Err(e) if full(&e) => None,
                r => Some(Some(r.map_err(err)?)),
            },
            Op::Write { id, off, n, seed } => {
                buf.write_at(0, &bytes(seed, n))
                    .map_err(|e| e.to_string())?;
                MemRange::new(buf.as_ref(), 0, n)
                    .and_then(|range| store.pwrite(id, off as u64, range))
                    .map_err(err)?;
                Some(None)
            }
            Op::Resize(id, n) => match store.resize(id, n) {
                Err(e) if full(&e) => None,
                r => {
                    r.map_err(err)?;
                    Some(None)
                }
            },
            Op::Delete(id) => {
                store.delete(id).map_err(err)?;
                Some(None)
            }
            Op::Flush => {
                store.flush().map_err(err)?;
                Some(None)
            }
        };
        if let Some(id) = id {
            apply(&mut model, &op, id);
        }
        let mut o = out.lock();
        match id {
            Some(Some(id)) => writeln!(o, "{p}E {id}"),
            Some(None) => writeln!(o, "{p}E"),
            None => writeln!(o, "{p}E FULL"),
        }
        .and_then(|()| o.flush())
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Checks the store on `x.path` against `m`: the same objects, and every
/// byte not written since it was last durable as it was then.
fn same(store: &Store, m: &Model, buf: &dyn DeviceMemory) -> Result<(), String> {
    for (id, o) in m {
        let n = o.data.len();
        MemRange::new(buf, 0, n)
            .and_then(|range| store.pread(*id, 0, range))
            .map_err(|e| e.to_string())?;
        let mut got = vec![0u8; n];
        buf.read_at(0, &mut got).map_err(|e| e.to_string())?;
        if let Some(i) = (0..n).find(|&i| !o.dirty[i] && got[i] != o.flushed[i]) {
            return Err(format!(
                "object {id} byte {i} is {:#x}, durable {:#x}",
                got[i], o.flushed[i]
            ));
        }
    }
    Ok(())
}

fn sizes(m: &Model) -> BTreeMap<u64, u64> {
    m.iter().map(|(id, o)| (*id, o.data.len() as u64)).collect()
}

/// What a child's lines say: the model of every operation that returned,
/// and the one in flight.
#[derive(Default)]
struct Replay {
    model: Model,
    flight: Option<Op>,
    /// An operation whose announcement the log's last line holds, which a
    /// power cut may have stopped midway.
    cut: Option<Cut>,
}

/// The last line of a dead machine's log, when it announced an operation:
/// its kind if the line got that far, the fields that ended (a space
/// after them), and the digits of the last one so far.
#[derive(Clone, Debug, Default, PartialEq)]
struct Cut {
    kind: Option<char>,
    fields: Vec<u64>,
    last: String,
}

impl Cut {
    /// `rest`: what follows "B" on the line.
    fn of(rest: &str) -> Self {
        let mut words: Vec<&str> = rest.trim_start().split(' ').collect();
        let kind = words.first().and_then(|w| w.chars().next());
        if !words.is_empty() {
            words.remove(0);
        }
        let last = words.pop().unwrap_or("").to_string();
        Self {
            kind,
            fields: words.iter().filter_map(|w| w.parse().ok()).collect(),
            last,
        }
    }

    /// Whether field `i` may have been `v`.
    fn fits(&self, i: usize, v: u64) -> bool {
        match i.cmp(&self.fields.len()) {
            std::cmp::Ordering::Less => self.fields[i] == v,
            std::cmp::Ordering::Equal => v.to_string().starts_with(&self.last),
            std::cmp::Ordering::Greater => true,
        }
    }

    /// The models the operation may have left, with the store's map `got`
    /// to say which ids and sizes it may have had (a write's: its object's
    /// every byte in doubt).
    fn choices(&self, model: &Model, got: &BTreeMap<u64, u64>) -> Vec<Model> {
        let mut out = Vec::new();
        let kinds: Vec<char> = match self.kind {
            Some(k) => vec![k],
            None => vec!['C', 'W', 'Z', 'D', 'F'],
        };
        for k in kinds {
            for (&id, &size) in got {
                let mut m = model.clone();
                match k {
                    'C' if !model.contains_key(&id) && self.fits(0, size) => {
                        apply(&mut m, &Op::Create(size), Some(id));
                    }
                    'Z' if model.contains_key(&id) && self.fits(0, id) && self.fits(1, size) => {
                        apply(&mut m, &Op::Resize(id, size), None);
                    }
                    _ => continue,
                }
                out.push(m);
            }
            for &id in model.keys().filter(|&&id| self.fits(0, id)) {
                let mut m = model.clone();
                match k {
                    'W' => {
                        if let Some(o) = m.get_mut(&id) {
                            o.dirty.iter_mut().for_each(|d| *d = true);
                        }
                    }
                    'D' if !got.contains_key(&id) => apply(&mut m, &Op::Delete(id), None),
                    _ => continue,
                }
                out.push(m);
            }
            if k == 'F' {
                let mut m = model.clone();
                apply(&mut m, &Op::Flush, None);
                out.push(m);
            }
        }
        out
    }
}

impl Replay {
    /// Takes one line (without the prefix); whether it began an operation.
    fn line(&mut self, line: &str) -> Result<bool, String> {
        if let Some(op) = line.strip_prefix("B ") {
            let op = Op::parse(op).ok_or_else(|| format!("child said {line:?}"))?;
            // A write's bytes are not known durable from its start on.
            if let Op::Write { id, off, n, .. } = op {
                if let Some(o) = self.model.get_mut(&id) {
                    o.dirty[off..off + n].iter_mut().for_each(|d| *d = true);
                }
            }
            self.flight = Some(op);
            return Ok(true);
        }
        if let Some(rest) = line.strip_prefix('E') {
            let op = self.flight.take().ok_or("E without B")?;
            if rest.trim() != "FULL" {
                apply(&mut self.model, &op, rest.trim().parse().ok());
            }
        }
        Ok(false)
    }

    /// Takes the log's last line, which a power cut may have ended midway:
    /// an operation's announcement is a [`Cut`], and its end is not taken
    /// (the operation stays in flight: its id may be cut short, or its
    /// "FULL").
    fn last_line(&mut self, line: &str) -> Result<(), String> {
        if let Some(rest) = line.strip_prefix('B') {
            if rest.is_empty() || rest.starts_with(' ') {
                self.cut = Some(Cut::of(rest));
                return Ok(());
            }
        }
        if line.starts_with('E') {
            return Ok(());
        }
        self.line(line).map(|_| ())
    }

    /// Checks the store on `x.path`, reopened, against what had returned:
    /// the map as the last returned operation left it, or as the one in
    /// flight would have, and every durable byte.
    fn check(&self, x: &CrashArgs, module: &Option<Arc<Module>>) -> Result<(), String> {
        let (model, flight) = (&self.model, &self.flight);
        let engine = engine(x, module);
        let store =
            Store::initialize(backing(x, &engine)?).map_err(|e| format!("reopening: {e}"))?;
        let got: BTreeMap<u64, u64> = store
            .get_object_map()
            .iter()
            .map(|o| (o.id, o.size))
            .collect();
        let buf = memory(module, MAX)?;
        let mut choices = vec![model.clone()];
        if let Some(op) = flight {
            let mut after = model.clone();
            let id = match op {
                Op::Create(_) => got.keys().find(|k| !model.contains_key(k)).copied(),
                _ => None,
            };
            apply(&mut after, op, id);
            choices.push(after);
        }
        if let Some(c) = &self.cut {
            choices.extend(c.choices(model, &got));
        }
        let what = match &self.cut {
            Some(c) => format!("an operation whose line the power cut ended ({c:?})"),
            None => format!("{flight:?}"),
        };
        let fit: Vec<&Model> = choices.iter().filter(|m| sizes(m) == got).collect();
        if fit.is_empty() {
            return Err(format!(
                "died during {what}: map {got:?}, none of {:?}",
                choices.iter().map(sizes).collect::<Vec<_>>()
            ));
        }
        // Any model the map allows whose durable bytes all read back.
        let mut first = None;
        for m in fit {
            match same(&store, m, buf.as_ref()) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        Err(format!("died during {what}: {}", first.unwrap_or_default()))
    }

    /// When the child died, in words.
    fn during(&self) -> &'static str {
        match self.flight {
            Some(Op::Create(_)) => "in a create",
            Some(Op::Write { .. }) => "in a write",
            Some(Op::Resize(..)) => "in a resize",
            Some(Op::Delete(_)) => "in a delete",
            Some(Op::Flush) => "in a flush",
            None if self.cut.is_some() => "as it announced an operation",
            None => "between operations",
        }
    }
}

/// One run: the child killed at a random point; the recovered store
/// checked. What it was doing when it died.
fn run_once(
    x: &CrashArgs,
    seed: u64,
    module: &Option<Arc<Module>>,
) -> Result<&'static str, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["store-crash", "--child", "--path", &x.path])
        .args(["--size", &x.size.to_string(), "--seed", &seed.to_string()])
        .args(["--engine-path", &x.engine_path.to_string()])
        .args(["--memory", &x.memory])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xC4A5);
    let kill_at = rng.usize(3..200);
    let lines = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    // Lines come through a thread, so that a child that stops answering (a
    // store call waiting for something only it could release) is found.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut replay = Replay::default();
    let (mut begun, mut killed) = (0, false);
    loop {
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line.map_err(|e| e.to_string())?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the child said nothing for a minute after {begun} operations, in {:?}",
                    replay.flight
                ));
            }
        };
        if replay.line(&line)? {
            begun += 1;
            if begun == kill_at && !killed {
                // Somewhere inside the operation, or just after it.
                std::thread::sleep(Duration::from_micros(rng.u64(0..20_000)));
                child.kill().map_err(|e| e.to_string())?;
                killed = true;
            }
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !killed || status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!("the child ended by itself ({status}): {err}"));
    }
    replay.check(x, module)?;
    Ok(replay.during())
}

pub fn run(x: &CrashArgs) -> Result<(), String> {
    crate::store::create(&x.path, x.size)?;
    if x.child {
        return child(x);
    }
    let module = module(x)?;
    if let Some(log) = &x.check_log {
        let text = std::fs::read_to_string(log).map_err(|e| format!("{log}: {e}"))?;
        let mut replay = Replay::default();
        let mut ready = false;
        let lines: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix(x.prefix.as_str()))
            .collect();
        for (i, line) in lines.iter().enumerate() {
            ready |= *line == "READY";
            if i + 1 == lines.len() {
                replay.last_line(line)?;
            } else {
                replay.line(line)?;
            }
        }
        if !ready {
            return Err(format!("{log}: the child never got its store ready"));
        }
        replay.check(x, &module)?;
        println!(
            "the store after its machine died {} ({} objects), reopened and checked",
            replay.during(),
            replay.model.len()
        );
        return Ok(());
    }
    let mut during: BTreeMap<&str, usize> = BTreeMap::new();
    for r in 0..x.runs {
        let what = run_once(x, x.seed + r, &module).map_err(|e| format!("run {r}: {e}"))?;
        *during.entry(what).or_default() += 1;
    }
    println!(
        "{} processes killed mid-update, each store reopened and checked; they died {during:?}",
        x.runs
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(n: usize, fill: u8) -> Obj {
        Obj {
            data: vec![fill; n],
            flushed: vec![fill; n],
            dirty: vec![false; n],
        }
    }

    /// Objects 84 (100 bytes) and 87 (200), all durable.
    fn model() -> Model {
        [(84, obj(100, 1)), (87, obj(200, 2))].into_iter().collect()
    }

    #[test]
    fn a_line_cut_short_reads_as_what_it_got_to() {
        assert_eq!(
            Cut::of(" W 87 49"),
            Cut {
                kind: Some('W'),
                fields: vec![87],
                last: "49".into()
            }
        );
        assert_eq!(Cut::of(""), Cut::default());
        assert_eq!(
            Cut::of(" D "),
            Cut {
                kind: Some('D'),
                fields: vec![],
                last: String::new()
            }
        );
        let c = Cut::of(" Z 84 12");
        assert!(c.fits(0, 84) && !c.fits(0, 8) && c.fits(1, 123) && !c.fits(1, 21) && c.fits(2, 7));
    }

    #[test]
    fn an_operation_cut_short_may_have_done_what_its_line_allows() {
        let m = model();
        let got = sizes(&m);
        // A write to object 87 whose line stopped in its offset: any of
        // 87's bytes may have changed, none of 84's.
        let w = Cut::of(" W 87 49").choices(&m, &got);
        assert_eq!(w.len(), 1);
        assert!(w[0][&87].dirty.iter().all(|&d| d));
        assert!(w[0][&84].dirty.iter().all(|&d| !d));
        // A delete whose id stopped at "8": 84 or 87, whichever is gone.
        let gone: BTreeMap<u64, u64> = [(87, 200)].into_iter().collect();
        let d = Cut::of(" D 8").choices(&m, &gone);
        assert_eq!(d.iter().map(sizes).collect::<Vec<_>>(), vec![gone.clone()]);
        // A resize to a size that starts with "12".
        let grown: BTreeMap<u64, u64> = [(84, 123), (87, 200)].into_iter().collect();
        let z = Cut::of(" Z 84 12").choices(&m, &grown);
        assert!(z.iter().any(|c| sizes(c) == grown));
        let other: BTreeMap<u64, u64> = [(84, 210), (87, 200)].into_iter().collect();
        assert!(Cut::of(" Z 84 12")
            .choices(&m, &other)
            .iter()
            .all(|c| sizes(c) != other));
        // A create of a size that starts with "40": the new object.
        let made: BTreeMap<u64, u64> = [(84, 100), (87, 200), (90, 4096)].into_iter().collect();
        let c = Cut::of(" C 40").choices(&m, &made);
        assert_eq!(c.iter().filter(|c| sizes(c) == made).count(), 1);
        // The line stopped before its kind: anything one operation does.
        let any = Cut::of("").choices(&m, &made);
        assert!(any.iter().any(|c| sizes(c) == made));
        assert!(any.iter().any(|c| c[&84].dirty.iter().all(|&d| d)));
    }

    #[test]
    fn the_last_line_ending_an_operation_leaves_it_in_flight() {
        let mut r = Replay::default();
        r.line("B C 4096").unwrap();
        // "E 1" may be "E 12" cut short: the create stays in flight.
        r.last_line("E 1").unwrap();
        assert_eq!(r.flight, Some(Op::Create(4096)));
        assert!(r.model.is_empty());
        let mut r = Replay::default();
        r.last_line("B W 87 49").unwrap();
        assert_eq!(r.flight, None);
        assert_eq!(r.cut.as_ref().and_then(|c| c.kind), Some('W'));
    }
}
