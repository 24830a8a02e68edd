//! The store against a reference model, on a model device that keeps
//! unflushed writes apart so that a crash can keep any of them, tear one,
//! or lose them all.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use proptest::prelude::*;

use super::{
    backing::{Backing, Started},
    cache::{PageCache, WritePolicy},
    layout::BLOCK,
    objects::Store,
};
use crate::{
    memory::{
        copy::tests::{Calls, Counted, Direct, Plain},
        DeviceMemory, HostMemory, MemRange,
    },
    transfer::{Report, Ticket, TransferPath},
    Error, Result,
};

/// A device in memory: what is durable, and the writes since the last
/// flush, which reads see but a crash may lose.
#[derive(Default)]
struct ModelDevice {
    durable: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
    /// Writes left before the process dies (`None`: it does not).
    writes_left: Option<usize>,
    dead: bool,
}

/// An asynchronous read not done yet: where it lands, and its ticket.
type Deferred = (u64, Arc<dyn DeviceMemory>, usize, usize, Ticket);

struct MemBacking(
    Mutex<ModelDevice>,
    std::sync::atomic::AtomicUsize,
    /// Asynchronous reads that wait for [`MemBacking::run_deferred`], so
    /// that everything else a caller does happens while they are in flight;
    /// and whether the next one waits.
    Mutex<(Vec<Deferred>, bool)>,
);

impl MemBacking {
    fn new(len: usize) -> Arc<Self> {
        Arc::new(Self(
            Mutex::new(ModelDevice {
                durable: vec![0; len],
                ..Default::default()
            }),
            Default::default(),
            Mutex::default(),
        ))
    }

    /// The next asynchronous read waits for [`MemBacking::run_deferred`].
    fn defer_next_read(&self) {
        self.2.lock().unwrap().1 = true;
    }

    /// Does the asynchronous reads waiting, on the device as it is now.
    fn run_deferred(&self) {
        let waiting = std::mem::take(&mut self.2.lock().unwrap().0);
        for (at, mem, mem_offset, len, t) in waiting {
            t.complete(
                MemRange::new(mem.as_ref(), mem_offset, len)
                    .and_then(|range| self.read(at, range))
                    .map(|()| report(len)),
            );
        }
    }

    /// Reads served so far.
    fn reads(&self) -> usize {
        self.1.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ModelDevice> {
        self.0.lock().unwrap()
    }

    /// Dies after `n` more writes (the last of them torn).
    fn die_after(&self, n: usize) {
        self.lock().writes_left = Some(n);
    }

    /// The device after a crash: the durable bytes and, in order, each
    /// unflushed write kept, dropped or torn, as `rng` draws.
    fn crash(&self, rng: &mut fastrand::Rng) -> Arc<Self> {
        let d = self.lock();
        let mut image = d.durable.clone();
        for (at, bytes) in &d.pending {
            let keep = match rng.u8(0..4) {
                0 => 0,
                1 => rng.usize(0..=bytes.len()),
                _ => bytes.len(),
            };
            image[*at as usize..*at as usize + keep].copy_from_slice(&bytes[..keep]);
        }
        Arc::new(Self(
            Mutex::new(ModelDevice {
                durable: image,
                ..Default::default()
            }),
            Default::default(),
            Mutex::default(),
        ))
    }

    fn view(d: &ModelDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut v = d.durable[offset as usize..offset as usize + len].to_vec();
        for (at, bytes) in &d.pending {
            let (a, b) = (
                *at.max(&offset),
                (at + bytes.len() as u64).min(offset + len as u64),
            );
            if a < b {
                v[(a - offset) as usize..(b - offset) as usize]
                    .copy_from_slice(&bytes[(a - at) as usize..(b - at) as usize]);
            }
        }
        v
    }
}

fn died() -> Error {
    Error::InvalidArgument("the model device died".into())
}

fn report(len: usize) -> Report {
    Report::new(len as u64, TransferPath::Bounce)
}

impl Backing for MemBacking {
    fn len(&self) -> u64 {
        self.lock().durable.len() as u64
    }

    fn read(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // Long enough for other threads to miss the same page meanwhile.
        std::thread::sleep(std::time::Duration::from_millis(1));
        let d = self.lock();
        if d.dead {
            return Err(died());
        }
        let view = Self::view(&d, offset, range.len());
        range.mem().write_at(range.offset(), &view)
    }

    fn write(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        let len = range.len();
        let mut bytes = vec![0u8; len];
        range.mem().read_at(range.offset(), &mut bytes)?;
        let mut d = self.lock();
        if d.dead {
            return Err(died());
        }
        if let Some(n) = d.writes_left.as_mut() {
            if *n == 0 {
                // The last write: half of it reaches the device.
                bytes.truncate(len / 2);
                d.pending.push((offset, bytes));
                d.dead = true;
                return Err(died());
            }
            *n -= 1;
        }
        d.pending.push((offset, bytes));
        Ok(())
    }

    fn read_async(
        &self,
        offset: u64,
        mem: Arc<dyn DeviceMemory>,
        mem_offset: usize,
        len: usize,
    ) -> Result<Started> {
        let t = Ticket::new();
        let mut waiting = self.2.lock().unwrap();
        if std::mem::take(&mut waiting.1) {
            waiting.0.push((offset, mem, mem_offset, len, t.clone()));
            return Ok(Started {
                ticket: t,
                commands: None,
            });
        }
        drop(waiting);
        t.complete(
            MemRange::new(mem.as_ref(), mem_offset, len)
                .and_then(|range| self.read(offset, range))
                .map(|()| report(len)),
        );
        Ok(Started {
            ticket: t,
            commands: None,
        })
    }

    fn flush(&self) -> Result<()> {
        let mut d = self.lock();
        if d.dead {
            return Err(died());
        }
        let pending = std::mem::take(&mut d.pending);
        for (at, bytes) in pending {
            d.durable[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }
}

/// One object of the reference model: its bytes, the bytes as of the last
/// point everything was durable, and which bytes were written since.
#[derive(Clone, Debug, PartialEq)]
struct Obj {
    data: Vec<u8>,
    flushed: Vec<u8>,
    dirty: Vec<bool>,
}

impl Obj {
    fn zeros(n: usize) -> Self {
        Self {
            data: vec![0; n],
            flushed: vec![0; n],
            dirty: vec![false; n],
        }
    }

    fn durable(&mut self) {
        self.flushed = self.data.clone();
        self.dirty = vec![false; self.data.len()];
    }
}

type Model = BTreeMap<u64, Obj>;

fn durable_all(m: &mut Model) {
    m.values_mut().for_each(Obj::durable);
}

#[derive(Clone, Debug)]
enum Op {
    Create(u64),
    Write(usize, u64, usize, u8),
    Read(usize, u64, usize),
    Prefetch(usize, u64, usize),
    Delete(usize),
    Resize(usize, u64),
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![0u64..64, 1u64..3 * BLOCK, 3 * BLOCK..20 * BLOCK];
    prop_oneof![
        2 => size.clone().prop_map(Op::Create),
        4 => (any::<usize>(), any::<u64>(), 0usize..3 * BLOCK as usize, any::<u8>()).prop_map(|(o, a, n, s)| Op::Write(o, a, n, s)),
        3 => (any::<usize>(), any::<u64>(), 0usize..3 * BLOCK as usize).prop_map(|(o, a, n)| Op::Read(o, a, n)),
        1 => (any::<usize>(), any::<u64>(), 0usize..2 * BLOCK as usize).prop_map(|(o, a, n)| Op::Prefetch(o, a, n)),
        1 => any::<usize>().prop_map(Op::Delete),
        1 => (any::<usize>(), size).prop_map(|(o, s)| Op::Resize(o, s)),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

/// The id the model's `k`-th object (in id order) has, if any.
fn pick(m: &Model, k: usize) -> Option<u64> {
    (!m.is_empty()).then(|| *m.keys().nth(k % m.len()).unwrap())
}

fn bytes_of(mem: &HostMemory, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    mem.read_at(0, &mut v).unwrap();
    v
}

/// Applies `op` to the store and the model; `Err` is the store's error for
/// an operation that had to succeed, or a mismatch.
fn apply(
    store: &mut Store,
    backing: &Arc<MemBacking>,
    m: &mut Model,
    op: &Op,
    cache: u8,
) -> std::result::Result<(), String> {
    // Which accelerator of the cache an operation runs on.
    let on = |k: usize| (k / 7) % store.accelerators();
    let fail = |what: &str, e: Error| format!("{what}: {e}");
    match *op {
        Op::Create(size) => {
            let id = store.pcreate(size).map_err(|e| fail("pcreate", e))?;
            if m.contains_key(&id) {
                return Err(format!("pcreate gave id {id}, which is taken"));
            }
            m.insert(id, Obj::zeros(size as usize));
            durable_all(m);
        }
        Op::Write(k, at, n, seed) => {
            let Some(id) = pick(m, k) else { return Ok(()) };
            let size = m[&id].data.len();
            let off = if size == 0 {
                0
            } else {
                at as usize % (size + 1)
            };
            let buf = HostMemory::new(n.max(1)).unwrap();
            let data: Vec<u8> = (0..n)
                .map(|i| seed.wrapping_add(i as u8).wrapping_mul(31))
                .collect();
            buf.write_at(0, &data).unwrap();
            if off + n <= size {
                // Written or not, these bytes are no longer known durable.
                let o = m.get_mut(&id).unwrap();
                o.dirty[off..off + n].iter_mut().for_each(|d| *d = true);
            }
            let r = store.pwrite_on(on(k), id, off as u64, MemRange::new(&buf, 0, n).unwrap());
            if off + n > size {
                return match r {
                    Err(Error::EndOfFile { .. }) => Ok(()),
                    other => Err(format!(
                        "pwrite past the end of {id} ({off}+{n} > {size}): {other:?}"
                    )),
                };
            }
            r.map_err(|e| fail("pwrite", e))?;
            m.get_mut(&id).unwrap().data[off..off + n].copy_from_slice(&data);
        }
        Op::Read(k, at, n) | Op::Prefetch(k, at, n) => {
            let Some(id) = pick(m, k) else { return Ok(()) };
            let size = m[&id].data.len();
            let off = at as usize % (size + 1);
            let buf = Arc::new(HostMemory::new(n.max(1)).unwrap());
            let r = match (op, k % 4) {
                (Op::Read(..), _) => store.pread_on(
                    on(k),
                    id,
                    off as u64,
                    MemRange::new(buf.as_ref(), 0, n).unwrap(),
                ),
                (_, 0 | 2) => store.pread_prefetch(id, off as u64, n).and_then(|p| {
                    store.consume_prefetch_pread(p, MemRange::new(buf.as_ref(), 0, n).unwrap())
                }),
                // Into the buffer itself, consumed there (no copy)...
                (_, 1) => store
                    .pread_prefetch_into(id, off as u64, n, buf.clone(), 0)
                    .and_then(|p| {
                        store.consume_prefetch_pread(p, MemRange::new(buf.as_ref(), 0, n).unwrap())
                    }),
                // ... or into another place, consumed into the buffer.
                _ => {
                    let other = Arc::new(HostMemory::new(n + 100).unwrap());
                    store
                        .pread_prefetch_into(id, off as u64, n, other, 100)
                        .and_then(|p| {
                            store.consume_prefetch_pread(
                                p,
                                MemRange::new(buf.as_ref(), 0, n).unwrap(),
                            )
                        })
                }
            };
            if off + n > size {
                return match r {
                    Err(Error::EndOfFile { .. }) => Ok(()),
                    other => Err(format!(
                        "read past the end of {id} ({off}+{n} > {size}): {other:?}"
                    )),
                };
            }
            r.map_err(|e| fail("read", e))?;
            if bytes_of(buf.as_ref(), n) != m[&id].data[off..off + n] {
                return Err(format!(
                    "object {id} bytes {off}..{} differ from the model",
                    off + n
                ));
            }
        }
        Op::Delete(k) => {
            let Some(id) = pick(m, k) else { return Ok(()) };
            store.delete(id).map_err(|e| fail("delete", e))?;
            m.remove(&id);
            durable_all(m);
            let buf = HostMemory::new(1).unwrap();
            if store
                .pread(id, 0, MemRange::new(&buf, 0, 0).unwrap())
                .is_ok()
            {
                return Err(format!("object {id} reads after its delete"));
            }
        }
        Op::Resize(k, size) => {
            let Some(id) = pick(m, k) else { return Ok(()) };
            store.resize(id, size).map_err(|e| fail("resize", e))?;
            let o = m.get_mut(&id).unwrap();
            o.data.resize(size as usize, 0);
            o.dirty.resize(size as usize, false);
            durable_all(m);
        }
        Op::Flush => {
            store.flush().map_err(|e| fail("flush", e))?;
            durable_all(m);
        }
        Op::Reopen => {
            // The old store is dropped first (a throwaway store stands in),
            // writing its dirty pages back as it goes.
            *store = Store::format(MemBacking::new(DEVICE), 1).map_err(|e| fail("format", e))?;
            *store = cached(
                Store::initialize(backing.clone()).map_err(|e| fail("initialize", e))?,
                cache,
            );
        }
    }
    Ok(())
}

/// Checks the whole store against the model: the same ids and sizes, the
/// same bytes.
fn same(store: &Store, m: &Model) -> std::result::Result<(), String> {
    let map: Vec<(u64, u64)> = store
        .get_object_map()
        .iter()
        .map(|o| (o.id, o.size))
        .collect();
    let want: Vec<(u64, u64)> = m.iter().map(|(id, o)| (*id, o.data.len() as u64)).collect();
    if map != want {
        return Err(format!("object map {map:?}, model {want:?}"));
    }
    for (id, o) in m {
        let buf = HostMemory::new(o.data.len().max(1)).unwrap();
        let on = *id as usize % store.accelerators();
        store
            .pread_on(on, *id, 0, MemRange::new(&buf, 0, o.data.len()).unwrap())
            .map_err(|e| e.to_string())?;
        if bytes_of(&buf, o.data.len()) != o.data {
            return Err(format!("object {id} differs from the model"));
        }
    }
    Ok(())
}

const DEVICE: usize = 96 * BLOCK as usize;

/// The store on `backing` with no cache (`cache` 0), a write-back cache (1)
/// or a write-through one (2) of four 4 KiB frames, or a cache shared by
/// three accelerators writing back (3) or two writing through (4), four
/// frames each: small enough that pages, dirty ones too, are evicted all
/// the time.
fn cached(store: Store, cache: u8) -> Store {
    let (policy, accels) = match cache {
        0 => return store,
        1 => (WritePolicy::WriteBack, 1),
        2 => (WritePolicy::WriteThrough, 1),
        3 => (WritePolicy::WriteBack, 3),
        _ => (WritePolicy::WriteThrough, 2),
    };
    let mems = (0..accels)
        .map(|_| Arc::new(HostMemory::new(4 * BLOCK as usize).unwrap()) as Arc<dyn DeviceMemory>)
        .collect();
    store.with_cache(PageCache::shared(mems, BLOCK as usize, policy).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 80, ..ProptestConfig::default() })]

    #[test]
    fn the_store_does_what_the_model_does(ops in prop::collection::vec(op(), 1..40), cache in 0u8..5) {
        let backing = MemBacking::new(DEVICE);
        let mut store = cached(Store::format(backing.clone(), 64).unwrap(), cache);
        let mut m = Model::new();
        for (i, o) in ops.iter().enumerate() {
            let full = matches!(o, Op::Create(_) | Op::Resize(..));
            match apply(&mut store, &backing, &mut m, o, cache) {
                Ok(()) => {}
                // The device is small: running out of room is an answer,
                // and it must change nothing.
                Err(e) if full && e.contains("no free run") => {}
                Err(e) => prop_assert!(false, "op {i} {o:?}: {e}"),
            }
        }
        prop_assert_eq!(same(&store, &m), Ok(()));
        // Closing the store writes its cache back.
        drop(store);
        let reopened = Store::initialize(backing.clone()).unwrap();
        prop_assert_eq!(same(&reopened, &m), Ok(()));
    }
}

/// The id a model uses for an object a `pcreate` in flight made: any id the
/// other objects do not have.
const NEW: u64 = u64::MAX;

/// Whether the store recovered after a crash holds what the model says was
/// durable: the objects of one of the acceptable maps (whose [`NEW`] stands
/// for the one id the store has that the rest of the map does not), and
/// every byte not written since it was last durable.
fn recovered(store: &Store, choices: &[Model]) -> std::result::Result<(), String> {
    let map: BTreeMap<u64, u64> = store
        .get_object_map()
        .iter()
        .map(|o| (o.id, o.size))
        .collect();
    let matches = |m: &Model| -> Option<Model> {
        let mut m = m.clone();
        if let Some(o) = m.remove(&NEW) {
            let new: Vec<u64> = map
                .keys()
                .filter(|id| !m.contains_key(id))
                .copied()
                .collect();
            if new.len() != 1 {
                return None;
            }
            m.insert(new[0], o);
        }
        let sizes: BTreeMap<u64, u64> =
            m.iter().map(|(id, o)| (*id, o.data.len() as u64)).collect();
        (sizes == map).then_some(m)
    };
    let m = choices
        .iter()
        .find_map(matches)
        .ok_or_else(|| format!("recovered map {map:?} is none of the committed ones"))?;
    for (id, o) in &m {
        let buf = HostMemory::new(o.data.len().max(1)).unwrap();
        store
            .pread(*id, 0, MemRange::new(&buf, 0, o.data.len()).unwrap())
            .map_err(|e| e.to_string())?;
        let got = bytes_of(&buf, o.data.len());
        if let Some(i) = (0..o.data.len()).find(|&i| !o.dirty[i] && got[i] != o.flushed[i]) {
            return Err(format!(
                "object {id} byte {i} is {:#x}, durable {:#x}",
                got[i], o.flushed[i]
            ));
        }
    }
    Ok(())
}

/// Random operations for a crash run: updates of every kind (`seed` odd),
/// or free space fragmented before grows (`seed` even): small objects
/// created, written and flushed, some deleted, then the others grown, so
/// that grows move objects into holes next to their own blocks.
fn crash_ops(seed: u64, rng: &mut fastrand::Rng) -> Vec<Op> {
    if seed % 2 == 1 {
        return (0..30)
            .map(|_| match rng.u8(0..10) {
                0..=1 => Op::Create(rng.u64(1..6 * BLOCK)),
                2..=5 => Op::Write(
                    rng.usize(..),
                    rng.u64(..),
                    rng.usize(1..2 * BLOCK as usize),
                    rng.u8(..),
                ),
                6 => Op::Delete(rng.usize(..)),
                7 => Op::Resize(rng.usize(..), rng.u64(1..8 * BLOCK)),
                _ => Op::Flush,
            })
            .collect();
    }
    let mut ops = Vec::new();
    for _ in 0..rng.usize(3..8) {
        ops.push(Op::Create(rng.u64(1..3 * BLOCK)));
        ops.push(Op::Write(
            rng.usize(..),
            0,
            rng.usize(1..3 * BLOCK as usize),
            rng.u8(..),
        ));
    }
    ops.push(Op::Flush);
    for _ in 0..rng.usize(1..4) {
        ops.push(Op::Delete(rng.usize(..)));
    }
    for _ in 0..rng.usize(2..6) {
        let k = rng.usize(..);
        ops.push(Op::Write(
            k,
            rng.u64(..),
            rng.usize(1..BLOCK as usize),
            rng.u8(..),
        ));
        if rng.bool() {
            ops.push(Op::Flush);
        }
        ops.push(Op::Resize(k, rng.u64(2 * BLOCK..7 * BLOCK)));
    }
    ops
}

/// Runs `ops` on a store (cache mode `cache`) whose device dies after
/// `die_after` writes; whether it died, and if so, checks the store
/// recovered from each of a few crashed images of the device.
fn crash_run(seed: u64, ops: &[Op], cache: u8, die_after: usize, rng: &mut fastrand::Rng) -> bool {
    let backing = MemBacking::new(DEVICE);
    let mut store = cached(Store::format(backing.clone(), 64).unwrap(), cache);
    backing.die_after(die_after);
    let mut m = Model::new();
    for o in ops {
        let before = m.clone();
        let Err(e) = apply(&mut store, &backing, &mut m, o, cache) else {
            continue;
        };
        if e.contains("no free run") {
            m = before;
            continue;
        }
        assert!(e.contains("died"), "seed {seed} op {o:?}: {e}");
        // The operation in flight may have taken effect or not.
        let mut after = m.clone();
        match *o {
            Op::Create(size) => {
                after.insert(NEW, Obj::zeros(size as usize));
            }
            Op::Delete(k) => {
                if let Some(id) = pick(&m, k) {
                    after.remove(&id);
                }
            }
            Op::Resize(k, size) => {
                if let Some(id) = pick(&m, k) {
                    let o = after.get_mut(&id).unwrap();
                    o.data.resize(size as usize, 0);
                    o.flushed.resize(size as usize, 0);
                    o.dirty.resize(size as usize, false);
                }
            }
            _ => {}
        }
        for _ in 0..3 {
            let crashed = backing.crash(rng);
            let again = Store::initialize(crashed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            if let Err(e) = recovered(&again, &[m.clone(), after.clone()]) {
                panic!("seed {seed}, die after {die_after} writes, crash in {o:?}: {e}");
            }
        }
        return true;
    }
    false
}

#[test]
fn a_crash_at_any_write_keeps_every_commit_and_flushed_byte() {
    let mut points = 0;
    for seed in 0..1200u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let ops = crash_ops(seed, &mut rng);
        let die = rng.usize(0..60);
        points += usize::from(crash_run(seed, &ops, (seed % 5) as u8, die, &mut rng));
    }
    assert!(points > 600, "only {points} runs crashed");
    println!("{points} crash points tried");
}

#[test]
fn a_crash_at_every_write_of_a_grow_that_moves_keeps_its_flushed_bytes() {
    // P and X of two blocks each, X written and flushed, then Y; P
    // deleted, X grown to four blocks: it moves, and a crash at any write
    // until its commit must leave X as it was.
    let ops = [
        Op::Create(2 * BLOCK),
        Op::Create(2 * BLOCK),
        Op::Write(1, 0, 2 * BLOCK as usize, 7),
        Op::Create(BLOCK),
        Op::Flush,
        Op::Delete(0),
        Op::Resize(0, 4 * BLOCK),
    ];
    let mut rng = fastrand::Rng::with_seed(1);
    let mut died = 0;
    for cache in 0..5 {
        for die in 0..40 {
            died += usize::from(crash_run(die as u64, &ops, cache, die, &mut rng));
        }
    }
    assert!(died > 50, "only {died} crashes");
}

/// One step of a sequence with prefetches held across other operations.
#[derive(Clone, Debug)]
enum Step {
    Op(Op),
    /// A prefetch of the `k`-th object's bytes at (a fraction of) `at`,
    /// kept in flight.
    Hold(usize, u64, usize, bool),
    /// The `k`-th prefetch held consumed (or dropped), its bytes checked.
    Consume(usize, bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => op().prop_filter("no reopen with reads in flight", |o| !matches!(o, Op::Reopen)).prop_map(Step::Op),
        2 => (any::<usize>(), any::<u64>(), 1usize..3 * BLOCK as usize, any::<bool>()).prop_map(|(k, a, n, into)| Step::Hold(k, a, n, into)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(k, consume)| Step::Consume(k, consume)),
    ]
}

/// A prefetch in flight: the object's bytes when it started, and which of
/// them were written since (a race of the caller's own, not checked).
struct Held {
    p: super::Prefetch,
    id: u64,
    want: Vec<u8>,
    raced: Vec<bool>,
    off: usize,
}

/// Runs `steps`; `Err` on a mismatch or an error where none is due.
fn run_holding(steps: &[Step], cache: u8) -> std::result::Result<(), String> {
    let backing = MemBacking::new(DEVICE);
    let mut store = cached(Store::format(backing.clone(), 64).unwrap(), cache);
    let mut m = Model::new();
    let mut held: Vec<Held> = Vec::new();
    let consume = |store: &Store, h: Held, consume: bool| -> std::result::Result<(), String> {
        backing.run_deferred();
        if !consume {
            drop(h.p);
            return Ok(());
        }
        let buf = HostMemory::new(h.want.len()).unwrap();
        store
            .consume_prefetch_pread(h.p, MemRange::new(&buf, 0, h.want.len()).unwrap())
            .map_err(|e| format!("consume: {e}"))?;
        let got = bytes_of(&buf, h.want.len());
        match (0..got.len()).find(|&i| !h.raced[i] && got[i] != h.want[i]) {
            Some(i) => Err(format!(
                "a prefetch of object {} at {} read byte {i} as {:#x}, not {:#x}",
                h.id, h.off, got[i], h.want[i]
            )),
            None => Ok(()),
        }
    };
    for (i, st) in steps.iter().enumerate() {
        match *st {
            Step::Op(ref o) => {
                if let Op::Write(k, at, n, _) = *o {
                    if let Some(id) = pick(&m, k) {
                        let size = m[&id].data.len();
                        let off = if size == 0 {
                            0
                        } else {
                            at as usize % (size + 1)
                        };
                        for h in held.iter_mut().filter(|h| h.id == id) {
                            for j in off.max(h.off)..(off + n).min(h.off + h.want.len()) {
                                h.raced[j - h.off] = true;
                            }
                        }
                    }
                }
                match apply(&mut store, &backing, &mut m, o, cache) {
                    Ok(()) => {}
                    Err(e) if e.contains("no free run") => {}
                    Err(e) => return Err(format!("step {i} {o:?}: {e}")),
                }
            }
            Step::Hold(k, at, n, into) => {
                let Some(id) = pick(&m, k) else { continue };
                let size = m[&id].data.len();
                let n = n.min(size);
                if n == 0 {
                    continue;
                }
                let off = at as usize % (size - n + 1);
                backing.defer_next_read();
                let p = if into {
                    let mem = Arc::new(HostMemory::new(n).unwrap());
                    store.pread_prefetch_into(id, off as u64, n, mem, 0)
                } else {
                    store.pread_prefetch(id, off as u64, n)
                }
                .map_err(|e| format!("step {i} prefetch: {e}"))?;
                held.push(Held {
                    p,
                    id,
                    want: m[&id].data[off..off + n].to_vec(),
                    raced: vec![false; n],
                    off,
                });
            }
            Step::Consume(k, c) => {
                if !held.is_empty() {
                    let h = held.swap_remove(k % held.len());
                    consume(&store, h, c).map_err(|e| format!("step {i}: {e}"))?;
                }
            }
        }
    }
    for h in held.drain(..) {
        consume(&store, h, true)?;
    }
    same(&store, &m)
}

/// Runs `f` on a thread of its own; an error if it has not returned after
/// a minute (a deadlock).
fn within_a_minute<F>(f: F) -> std::result::Result<(), String>
where
    F: FnOnce() -> std::result::Result<(), String> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or_else(|_| {
            Err("no answer in a minute: a store call waits for a held prefetch".into())
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// Prefetches held in flight across creates, writes, deletes, resizes
    /// and flushes of their object and others: no call waits for them, and
    /// each reads the bytes its object had when it started.
    #[test]
    fn a_prefetch_in_flight_reads_what_its_object_held_whatever_happens_meanwhile(
        steps in prop::collection::vec(step(), 1..50), cache in 0u8..5
    ) {
        prop_assert_eq!(within_a_minute(move || run_holding(&steps, cache)), Ok(()));
    }
}

#[test]
fn a_thread_holding_a_prefetch_and_another_deleting_and_resizing_never_wait_for_each_other() {
    let r = within_a_minute(|| {
        let backing = MemBacking::new(512 * BLOCK as usize);
        let store = Store::format(backing.clone(), 256).unwrap();
        let ids: Vec<u64> = (0..16).map(|_| store.pcreate(3 * BLOCK).unwrap()).collect();
        for &id in &ids {
            let buf = HostMemory::new(3 * BLOCK as usize).unwrap();
            buf.write_at(0, &vec![id as u8; 3 * BLOCK as usize])
                .unwrap();
            store
                .pwrite(id, 0, MemRange::new(&buf, 0, 3 * BLOCK as usize).unwrap())
                .unwrap();
        }
        let store = Arc::new(store);
        let bad = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            // Holders: a prefetch of an object, then other calls while it
            // is still held, then its bytes.
            for t in 0..4u64 {
                let (store, ids, bad) = (&store, &ids, &bad);
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(t);
                    let buf = HostMemory::new(BLOCK as usize).unwrap();
                    for _ in 0..300 {
                        let id = ids[rng.usize(..ids.len())];
                        let Ok(p) = store.pread_prefetch(id, 0, BLOCK as usize) else {
                            continue;
                        };
                        let other = ids[rng.usize(..ids.len())];
                        let _ = store.pread(other, 0, MemRange::new(&buf, 0, 100).unwrap());
                        let _ = store.pread_prefetch(other, 0, 10);
                        store
                            .consume_prefetch_pread(
                                p,
                                MemRange::new(&buf, 0, BLOCK as usize).unwrap(),
                            )
                            .unwrap();
                        if bytes_of(&buf, BLOCK as usize)
                            .iter()
                            .any(|&b| b != id as u8)
                        {
                            bad.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                });
            }
            // Deleters and resizers of the same objects, and creators that
            // zero the space they take.
            let (store, ids) = (&store, &ids);
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(99);
                for _ in 0..200 {
                    let id = ids[rng.usize(..ids.len())];
                    match rng.u8(0..3) {
                        0 => {
                            let _ = store.delete(id);
                        }
                        1 => {
                            let _ = store.resize(id, rng.u64(BLOCK..8 * BLOCK));
                        }
                        _ => {
                            let _ = store.pcreate(rng.u64(1..4 * BLOCK));
                        }
                    }
                }
            });
        });
        match bad.load(std::sync::atomic::Ordering::SeqCst) {
            0 => Ok(()),
            n => Err(format!(
                "{n} prefetches read bytes their object did not hold"
            )),
        }
    });
    assert_eq!(r, Ok(()));
}

#[test]
fn many_threads_see_only_their_objects_bytes() {
    for cache in 0..3 {
        threads_see_only_their_objects_bytes(cache);
    }
}

fn threads_see_only_their_objects_bytes(cache: u8) {
    let backing = MemBacking::new(512 * BLOCK as usize);
    let store = Arc::new(cached(Store::format(backing.clone(), 256).unwrap(), cache));
    let words =
        |id: u64, n: usize| -> Vec<u8> { (0..n / 8).flat_map(|_| id.to_le_bytes()).collect() };
    std::thread::scope(|s| {
        // Writers: each creates objects filled with their id in every word,
        // resizes and deletes them.
        for t in 0..4u64 {
            let store = store.clone();
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t);
                let mut mine: Vec<(u64, usize)> = Vec::new();
                for _ in 0..60 {
                    match rng.u8(0..4) {
                        0 | 1 => {
                            let n = 8 * rng.usize(1..2048);
                            let id = store.pcreate(n as u64).unwrap();
                            let buf = HostMemory::new(n).unwrap();
                            buf.write_at(0, &words(id, n)).unwrap();
                            store
                                .pwrite(id, 0, MemRange::new(&buf, 0, n).unwrap())
                                .unwrap();
                            mine.push((id, n));
                        }
                        2 if !mine.is_empty() => {
                            let (id, _) = mine.swap_remove(rng.usize(..mine.len()));
                            store.delete(id).unwrap();
                        }
                        _ if !mine.is_empty() => {
                            let k = rng.usize(..mine.len());
                            let (id, n) = mine[k];
                            let m = 8 * rng.usize(1..2048);
                            store.resize(id, m as u64).unwrap();
                            if m > n {
                                let buf = HostMemory::new(m - n).unwrap();
                                buf.write_at(0, &words(id, m - n)).unwrap();
                                store
                                    .pwrite(id, n as u64, MemRange::new(&buf, 0, m - n).unwrap())
                                    .unwrap();
                            }
                            mine[k].1 = m;
                        }
                        _ => {}
                    }
                }
            });
        }
        // Readers: any id, any range; what a read returns holds that id (or
        // zeros, before its writer filled it), never another object's.
        for t in 0..4u64 {
            let store = store.clone();
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(100 + t);
                let buf = HostMemory::new(16384).unwrap();
                for _ in 0..1500 {
                    let id = rng.u64(1..200);
                    let Ok(size) = store.size(id) else { continue };
                    let n = (8 * rng.u64(0..2048)).min(size & !7) as usize;
                    let r = if rng.bool() {
                        store.pread(id, 0, MemRange::new(&buf, 0, n).unwrap())
                    } else {
                        store.pread_prefetch(id, 0, n).and_then(|p| {
                            store.consume_prefetch_pread(p, MemRange::new(&buf, 0, n).unwrap())
                        })
                    };
                    if r.is_err() {
                        continue;
                    }
                    let got = bytes_of(&buf, n);
                    for w in got.chunks(8) {
                        let v = u64::from_le_bytes(w.try_into().unwrap());
                        assert!(v == 0 || v == id, "object {id} read a word of object {v}");
                    }
                }
            });
        }
    });
    let map = store.get_object_map();
    drop(store);
    let reopened = Store::initialize(backing).unwrap();
    assert_eq!(reopened.get_object_map(), map);
}

#[test]
fn concurrent_misses_on_a_page_read_it_once_and_hits_read_nothing() {
    let backing = MemBacking::new(64 * BLOCK as usize);
    let store = Store::format(backing.clone(), 8).unwrap();
    let id = store.pcreate(3 * BLOCK).unwrap();
    let data: Vec<u8> = (0..3 * BLOCK as usize).map(|i| (i * 7 + 1) as u8).collect();
    let mem = HostMemory::new(data.len()).unwrap();
    mem.write_at(0, &data).unwrap();
    store
        .pwrite(id, 0, MemRange::new(&mem, 0, data.len()).unwrap())
        .unwrap();
    let store = cached(store, 1);
    let before = backing.reads();
    let start = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        for t in 0..8usize {
            let (store, start, data) = (&store, &start, &data);
            s.spawn(move || {
                let buf = HostMemory::new(100).unwrap();
                start.wait();
                let at = BLOCK as usize + t * 100;
                store
                    .pread(id, at as u64, MemRange::new(&buf, 0, 100).unwrap())
                    .unwrap();
                assert_eq!(bytes_of(&buf, 100), data[at..at + 100]);
            });
        }
    });
    assert_eq!(
        backing.reads() - before,
        1,
        "eight threads missing one page read it once"
    );
    let buf = HostMemory::new(BLOCK as usize).unwrap();
    store
        .pread(id, BLOCK, MemRange::new(&buf, 0, BLOCK as usize).unwrap())
        .unwrap();
    assert_eq!(backing.reads() - before, 1, "a hit reads nothing");
    let s = store.cache_stats().unwrap();
    assert_eq!((s.misses, s.hits), (1, 8));
}

/// The copies `calls` made during `f`: `read_at`, `write_at`,
/// `read_at_raw` and `write_at_raw` calls of each memory, in order.
fn calls_during<const N: usize>(calls: [&Calls; N], f: impl FnOnce()) -> [[usize; 4]; N] {
    let before = calls.map(Calls::get);
    f();
    let after = calls.map(Calls::get);
    std::array::from_fn(|i| std::array::from_fn(|k| after[i][k] - before[i][k]))
}

#[test]
fn hits_writes_and_consumed_prefetches_copy_once_between_mapped_memories() {
    let backing = MemBacking::new(64 * BLOCK as usize);
    let frames = Arc::new(Counted::host(4 * BLOCK as usize));
    let cache = PageCache::new(frames.clone(), BLOCK as usize, WritePolicy::WriteBack).unwrap();
    let store = Store::format(backing, 8).unwrap().with_cache(cache);
    let n = 2 * BLOCK as usize;
    let id = store.pcreate(n as u64).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i * 13 + i / 509) as u8).collect();
    let mem = Counted::host(n);
    mem.inner.write_at(0, &data).unwrap();
    store
        .pwrite(id, 0, MemRange::new(&mem, 0, n).unwrap())
        .unwrap();
    let out = Counted::host(n);
    // A hit: frame to the caller's memory, both host memory, in one copy
    // between their mappings: neither memory copies through a buffer.
    let hit = calls_during([&frames.calls, &out.calls], || {
        store
            .pread(id, 0, MemRange::new(&out, 0, n).unwrap())
            .unwrap();
    });
    assert_eq!(store.cache_stats().unwrap().hits, 2);
    assert_eq!(hit, [[0; 4]; 2], "a hit went through a buffer");
    assert!(bytes_of(&out.inner, n) == data);
    // A write into cached pages: the caller's memory to the frames, the
    // same way.
    mem.inner.write_at(0, &[0xC3; 100]).unwrap();
    let write = calls_during([&mem.calls, &frames.calls], || {
        store
            .pwrite(id, 4000, MemRange::new(&mem, 0, 100).unwrap())
            .unwrap();
    });
    assert_eq!(write, [[0; 4]; 2], "a write went through a buffer");
    // A prefetch lands in host staging memory; consuming it copies once.
    let p = store.pread_prefetch(id, 0, n).unwrap();
    let consumed = calls_during([&out.calls], || {
        store
            .consume_prefetch_pread(p, MemRange::new(&out, 0, n).unwrap())
            .unwrap();
    });
    assert_eq!(
        consumed,
        [[0; 4]],
        "a prefetch was consumed through a buffer"
    );
    let mut want = data.clone();
    want[4000..4100].fill(0xC3);
    assert!(bytes_of(&out.inner, n) == want);
}

#[test]
fn a_hit_into_memory_without_a_mapping_is_its_own_single_copy() {
    let backing = MemBacking::new(64 * BLOCK as usize);
    let frames = Arc::new(HostMemory::new(4 * BLOCK as usize).unwrap());
    let cache = PageCache::new(frames, BLOCK as usize, WritePolicy::WriteBack).unwrap();
    let store = Store::format(backing, 8).unwrap().with_cache(cache);
    let n = 2 * BLOCK as usize;
    let id = store.pcreate(n as u64).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i * 5 + 3) as u8).collect();
    let mem = HostMemory::new(n).unwrap();
    mem.write_at(0, &data).unwrap();
    store
        .pwrite(id, 0, MemRange::new(&mem, 0, n).unwrap())
        .unwrap();
    let out = Direct(Plain::new(n));
    let hit = calls_during([&out.0.calls], || {
        store
            .pread(id, 0, MemRange::new(&out, 0, n).unwrap())
            .unwrap();
    });
    // One copy per page, straight out of the frame's mapping.
    assert_eq!(hit, [[0, 0, 0, 2]]);
    let mut back = vec![0u8; n];
    out.read_at(0, &mut back).unwrap();
    assert!(back == data);
}

/// A store with a write-back cache shared by `accels` accelerators of
/// `frames` 4 KiB frames each.
fn shared(backing: &Arc<MemBacking>, accels: usize, frames: usize) -> Store {
    let mems = (0..accels)
        .map(|_| {
            Arc::new(HostMemory::new(frames * BLOCK as usize).unwrap()) as Arc<dyn DeviceMemory>
        })
        .collect();
    Store::initialize(backing.clone())
        .unwrap()
        .with_cache(PageCache::shared(mems, BLOCK as usize, WritePolicy::WriteBack).unwrap())
}

#[test]
fn a_page_two_accelerators_hold_and_one_writes_is_what_the_other_reads_next() {
    let backing = MemBacking::new(64 * BLOCK as usize);
    let id = Store::format(backing.clone(), 8)
        .unwrap()
        .pcreate(2 * BLOCK)
        .unwrap();
    let store = shared(&backing, 2, 4);
    let old: Vec<u8> = (0..BLOCK as usize).map(|i| (i % 251) as u8).collect();
    let mem = HostMemory::new(BLOCK as usize).unwrap();
    mem.write_at(0, &old).unwrap();
    store
        .pwrite_on(0, id, 0, MemRange::new(&mem, 0, old.len()).unwrap())
        .unwrap();
    store.flush().unwrap();
    let c = store.cache().unwrap();
    assert_eq!(c.holders(id, 0), vec![0]);

    // Accelerator 1 misses and copies the page from accelerator 0.
    let reads = backing.reads();
    let out = HostMemory::new(BLOCK as usize).unwrap();
    store
        .pread_on(1, id, 0, MemRange::new(&out, 0, old.len()).unwrap())
        .unwrap();
    assert_eq!(bytes_of(&out, old.len()), old);
    assert_eq!(backing.reads(), reads, "filled from the other copy");
    assert_eq!(c.holders(id, 0), vec![0, 1]);
    assert_eq!(c.stats_on(1).unwrap().remote, 1);

    // Accelerator 0 writes: accelerator 1's copy is dropped, and its next
    // read is the new bytes, from accelerator 0's copy.
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    mem.write_at(0, &new[..100]).unwrap();
    store
        .pwrite_on(0, id, 0, MemRange::new(&mem, 0, 100).unwrap())
        .unwrap();
    assert_eq!(c.holders(id, 0), vec![0]);
    assert_eq!(c.stats().invalidations, 1);
    store
        .pread_on(1, id, 0, MemRange::new(&out, 0, old.len()).unwrap())
        .unwrap();
    let mut want = old.clone();
    want[..100].copy_from_slice(&new[..100]);
    assert_eq!(bytes_of(&out, old.len()), want);
    assert_eq!(backing.reads(), reads);
    assert_eq!(c.holders(id, 0), vec![0, 1]);

    // Accelerator 1 writes the whole page: accelerator 0's dirty copy is
    // dropped, its dirt carried by accelerator 1's, which a flush writes.
    mem.write_at(0, &new).unwrap();
    store
        .pwrite_on(1, id, 0, MemRange::new(&mem, 0, new.len()).unwrap())
        .unwrap();
    assert_eq!(c.holders(id, 0), vec![1]);
    store
        .pread_on(0, id, 0, MemRange::new(&out, 0, new.len()).unwrap())
        .unwrap();
    assert_eq!(bytes_of(&out, new.len()), new);
    store.flush().unwrap();
    drop(store);
    let plain = Store::initialize(backing.clone()).unwrap();
    plain
        .pread(id, 0, MemRange::new(&out, 0, new.len()).unwrap())
        .unwrap();
    assert_eq!(bytes_of(&out, new.len()), new, "durable after the flush");

    // Accelerators out of range are refused.
    let store = shared(&backing, 2, 4);
    assert!(matches!(
        store.pread_on(2, id, 0, MemRange::new(&out, 0, 1).unwrap()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        plain.pwrite_on(1, id, 0, MemRange::new(&out, 0, 1).unwrap()),
        Err(Error::InvalidArgument(_))
    ));
}

/// What each half of a page was last written with.
type Stamps = std::sync::RwLock<[u64; 2]>;

#[test]
fn a_write_on_one_accelerator_is_what_the_next_read_on_any_returns_under_many_threads() {
    const PAGES: usize = 16;
    const HALF: usize = BLOCK as usize / 2;
    let backing = MemBacking::new(128 * BLOCK as usize);
    let id = Store::format(backing.clone(), 8)
        .unwrap()
        .pcreate((PAGES * BLOCK as usize) as u64)
        .unwrap();
    // Three accelerators of four frames: twelve frames for sixteen pages,
    // so dirty pages are evicted all along.
    let store = shared(&backing, 3, 4);
    let stamps: Vec<Stamps> = (0..PAGES).map(|_| Default::default()).collect();
    let next = std::sync::atomic::AtomicU64::new(1);
    let working = std::sync::atomic::AtomicUsize::new(9);
    std::thread::scope(|s| {
        for t in 0..9usize {
            let (store, stamps, next, working) = (&store, &stamps, &next, &working);
            s.spawn(move || {
                // Counts the worker out even when it panics.
                struct Out<'a>(&'a std::sync::atomic::AtomicUsize);
                impl Drop for Out<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                let _out = Out(working);
                let accel = t % 3;
                let mut rng = fastrand::Rng::with_seed(t as u64);
                let buf = HostMemory::new(BLOCK as usize).unwrap();
                for _ in 0..600 {
                    let p = rng.usize(..PAGES);
                    let at = (p * BLOCK as usize) as u64;
                    if rng.u8(..3) == 0 {
                        // A write of one half or both, under the page's
                        // lock: no read of the page overlaps it.
                        let mut st = stamps[p].write().unwrap();
                        let v = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let halves = match rng.u8(..3) {
                            0 => 0..1,
                            1 => 1..2,
                            _ => 0..2,
                        };
                        let (from, n) = (halves.start * HALF, halves.len() * HALF);
                        let words: Vec<u8> = (0..n / 8).flat_map(|_| v.to_le_bytes()).collect();
                        buf.write_at(0, &words).unwrap();
                        store
                            .pwrite_on(
                                accel,
                                id,
                                at + from as u64,
                                MemRange::new(&buf, 0, n).unwrap(),
                            )
                            .unwrap();
                        halves.for_each(|h| st[h] = v);
                    } else {
                        // A read: every word is what the last write of its
                        // half left, whichever accelerator wrote it.
                        let st = stamps[p].read().unwrap();
                        store
                            .pread_on(
                                accel,
                                id,
                                at,
                                MemRange::new(&buf, 0, BLOCK as usize).unwrap(),
                            )
                            .unwrap();
                        let got = bytes_of(&buf, BLOCK as usize);
                        for (i, w) in got.chunks(8).enumerate() {
                            let v = u64::from_le_bytes(w.try_into().unwrap());
                            let want = st[i * 8 / HALF];
                            assert_eq!(
                                v, want,
                                "accelerator {accel} page {p} word {i}: {v}, last written {want}"
                            );
                        }
                    }
                }
            });
        }
        // Flushes meanwhile write dirty pages back under the readers.
        let (store, working) = (&store, &working);
        s.spawn(move || {
            while working.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                store.flush().unwrap();
                std::thread::yield_now();
            }
        });
    });
    let st = store.cache_stats().unwrap();
    assert!(st.remote > 0 && st.invalidations > 0, "{st:?}");
    store.flush().unwrap();
    drop(store);
    // On storage: every half as last written.
    let plain = Store::initialize(backing.clone()).unwrap();
    let buf = HostMemory::new(PAGES * BLOCK as usize).unwrap();
    plain
        .pread(
            id,
            0,
            MemRange::new(&buf, 0, PAGES * BLOCK as usize).unwrap(),
        )
        .unwrap();
    let got = bytes_of(&buf, PAGES * BLOCK as usize);
    for (p, s) in stamps.iter().enumerate() {
        let s = s.read().unwrap();
        for (i, w) in got[p * BLOCK as usize..(p + 1) * BLOCK as usize]
            .chunks(8)
            .enumerate()
        {
            let v = u64::from_le_bytes(w.try_into().unwrap());
            assert_eq!(v, s[i * 8 / HALF], "page {p} word {i} on storage");
        }
    }
}

/// A whole-page write that misses fills its frame with nothing before its
/// bytes land: a read of the page racing it on the same accelerator must
/// see the old bytes or the new ones, never the empty frame. Here the
/// writes rewrite the bytes the page already holds, so every read must see
/// exactly them.
#[test]
fn reads_racing_whole_page_writes_see_old_or_new_bytes_never_an_empty_frame() {
    let backing = MemBacking::new(64 * BLOCK as usize);
    let store = Store::format(backing.clone(), 8).unwrap();
    let pages = 4usize;
    let n = pages * BLOCK as usize;
    let id = store.pcreate(n as u64).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8 | 1).collect();
    let mem = HostMemory::new(n).unwrap();
    mem.write_at(0, &data).unwrap();
    store
        .pwrite(id, 0, MemRange::new(&mem, 0, n).unwrap())
        .unwrap();
    store.flush().unwrap();
    // Two frames for four pages: most writes and reads miss.
    let store = shared(&backing, 1, 2);
    let page = BLOCK as usize;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (store, data, stop) = (&store, &data, &stop);
        s.spawn(move || {
            let src = HostMemory::new(page).unwrap();
            for round in 0..3000usize {
                let p = round % pages;
                src.write_at(0, &data[p * page..(p + 1) * page]).unwrap();
                store
                    .pwrite(id, (p * page) as u64, MemRange::new(&src, 0, page).unwrap())
                    .unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        for t in 0..2usize {
            s.spawn(move || {
                let buf = HostMemory::new(page).unwrap();
                let mut round = t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = round % pages;
                    round += 1;
                    store
                        .pread(id, (p * page) as u64, MemRange::new(&buf, 0, page).unwrap())
                        .unwrap();
                    let got = bytes_of(&buf, page);
                    if let Some(i) = (0..page).find(|&i| got[i] != data[p * page + i]) {
                        panic!(
                            "page {p} byte {i}: {} read, {} written",
                            got[i],
                            data[p * page + i]
                        );
                    }
                }
            });
        }
    });
}
