//! The pipeline executor: a transfer cut into chunks that flow through a
//! chain of stages, every stage working on a different chunk at the same
//! time.
//!
//! Stage `i` moves a chunk from where stage `i - 1` left it to where stage
//! `i + 1` takes it: the first stage from the transfer's source, the last
//! into its destination, the others between rings of slots (staging memory
//! in host or device memory). Each stage runs on its own threads ("lanes"),
//! so with `k` stages and `n` chunks the transfer takes about the slowest
//! stage's whole time plus `(k - 1) / n` of it, instead of the sum of the
//! stages' times. With one chunk it is store-and-forward: each stage moves
//! everything, one after the other.
//!
//! Slots are handed from stage to stage through queues: a stage takes a
//! filled slot from the ring before it and a free slot of the ring after
//! it, moves the chunk, then frees the first and passes on the second. A
//! slot is only ever used by the one stage holding it. The first error
//! stops every stage; no chunk is started after it.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Condvar, Mutex,
    },
    time::{Duration, Instant},
};

use crate::{Error, Result};

/// A piece of the transfer: `len` bytes at `offset` from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// Its position in the transfer's chunk list.
    pub(crate) index: usize,
    /// Where it starts, in bytes from the transfer's start.
    pub(crate) offset: usize,
    /// Its length.
    pub(crate) len: usize,
}

/// Cuts `len` bytes into chunks of at most `size` bytes whose boundaries
/// fall on multiples of `size` counted from `skew` bytes before the
/// transfer's start (so that a chunk's storage offset is aligned when
/// `skew` is the start's misalignment). `size > 0`.
pub(crate) fn chunks(len: usize, size: usize, skew: usize) -> Vec<Chunk> {
    let skew = skew % size;
    let mut out = Vec::with_capacity(len.div_ceil(size) + 1);
    let mut at = 0;
    while at < len {
        let end = ((at + skew) / size + 1) * size - skew;
        let end = end.min(len);
        out.push(Chunk {
            index: out.len(),
            offset: at,
            len: end - at,
        });
        at = end;
    }
    out
}

/// One stage of a pipeline.
pub(crate) trait Stage: Sync {
    /// Moves `chunk` from slot `from` of the ring before this stage (`None`
    /// for the first stage: the transfer's source) to slot `to` of the ring
    /// after it (`None` for the last: the destination).
    fn run(&self, chunk: &Chunk, from: Option<usize>, to: Option<usize>) -> Result<()>;
}

/// A stage and how many chunks it works on at once.
pub(crate) struct Lanes<'a> {
    /// The stage.
    pub(crate) stage: &'a dyn Stage,
    /// Threads running it (at least 1).
    pub(crate) lanes: usize,
}

/// A stage that keeps several chunks moving at once on one thread (storage
/// I/O through a ring, say): it starts chunks and later says which
/// finished. It runs on the thread that calls [`execute`], so it may hold
/// what cannot move between threads.
pub(crate) trait Flow {
    /// Chunks it may have started and not finished.
    fn room(&self) -> usize;
    /// Starts moving `chunk` from `from` to `to` (as [`Stage::run`]).
    fn start(&mut self, chunk: &Chunk, from: Option<usize>, to: Option<usize>) -> Result<()>;
    /// Waits until at least one started chunk has finished; returns the
    /// finished chunks' indexes.
    fn finish(&mut self) -> Result<Vec<usize>>;
}

/// How a stage runs.
pub(crate) enum Driver<'a> {
    /// On threads of its own, a chunk per thread at a time.
    Lanes(Lanes<'a>),
    /// On the calling thread, many chunks at a time (at most one stage).
    Flow(&'a mut dyn Flow),
}

/// What a run of the pipeline took.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    /// Each stage's time spent moving chunks, summed over its lanes.
    pub(crate) busy: Vec<Duration>,
    /// From the first chunk's start to the last chunk's end.
    pub(crate) elapsed: Duration,
}

/// Runs `stages` over `chunks`; ring `i` (between stage `i` and `i + 1`)
/// has `slots[i]` slots (at least 1 each, `stages.len() - 1` rings).
pub(crate) fn execute(
    chunks: &[Chunk],
    stages: Vec<Driver<'_>>,
    slots: &[usize],
) -> Result<Outcome> {
    let k = stages.len();
    let flows = stages
        .iter()
        .filter(|d| matches!(d, Driver::Flow(_)))
        .count();
    let lanes_ok = stages.iter().all(|d| match d {
        Driver::Lanes(l) => l.lanes > 0,
        Driver::Flow(f) => f.room() > 0,
    });
    if k == 0 || slots.len() + 1 != k || slots.contains(&0) || !lanes_ok || flows > 1 {
        return Err(Error::InvalidArgument(format!(
            "a pipeline of {k} stages needs {} rings of at least one slot, a lane per stage and at most one flow",
            k.saturating_sub(1)
        )));
    }
    let start = Instant::now();
    if chunks.is_empty() {
        return Ok(Outcome {
            busy: vec![Duration::ZERO; k],
            elapsed: start.elapsed(),
        });
    }
    // inputs[i]: what stage i takes (chunk index, slot it is in).
    let inputs: Vec<Queue<(usize, Option<usize>)>> = (0..k).map(|_| Queue::default()).collect();
    let free: Vec<Queue<usize>> = slots.iter().map(|&n| Queue::filled(0..n)).collect();
    for c in chunks {
        inputs[0].push((c.index, None));
    }
    inputs[0].close();
    let mut flow = None;
    let mut lanes = Vec::with_capacity(k);
    for (i, d) in stages.into_iter().enumerate() {
        match d {
            Driver::Lanes(l) => lanes.push(Some(l)),
            Driver::Flow(f) => {
                flow = Some((i, f));
                lanes.push(None);
            }
        }
    }
    let run = Run {
        chunks,
        active: lanes
            .iter()
            .map(|l| AtomicUsize::new(l.as_ref().map_or(1, |l| l.lanes)))
            .collect(),
        stages: lanes,
        inputs,
        free,
        busy: (0..k).map(|_| AtomicU64::new(0)).collect(),
        error: Mutex::new(None),
    };
    std::thread::scope(|scope| {
        for (i, s) in run.stages.iter().enumerate() {
            let Some(s) = s else { continue };
            for _ in 0..s.lanes {
                let run = &run;
                scope.spawn(move || run.lane(i));
            }
        }
        if let Some((i, f)) = flow {
            run.flow(i, f);
        }
    });
    let error = run.error.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = error {
        return Err(e);
    }
    Ok(Outcome {
        busy: run
            .busy
            .iter()
            .map(|b| Duration::from_nanos(b.load(Ordering::Relaxed)))
            .collect(),
        elapsed: start.elapsed(),
    })
}

/// A pipeline's shared state while it runs.
struct Run<'a> {
    chunks: &'a [Chunk],
    /// The stages on lanes; `None` for the flow.
    stages: Vec<Option<Lanes<'a>>>,
    inputs: Vec<Queue<(usize, Option<usize>)>>,
    free: Vec<Queue<usize>>,
    busy: Vec<AtomicU64>,
    /// Lanes of each stage still running: the last to finish closes the
    /// next stage's input.
    active: Vec<AtomicUsize>,
    error: Mutex<Option<Error>>,
}

impl Run<'_> {
    /// One lane of stage `i`: takes chunks until its input is drained or
    /// the pipeline fails.
    fn lane(&self, i: usize) {
        let last = i + 1 == self.stages.len();
        while let Some((c, from)) = self.inputs[i].pop() {
            let to = match last {
                true => None,
                false => match self.free[i].pop() {
                    Some(slot) => Some(slot),
                    None => break,
                },
            };
            let chunk = &self.chunks[c];
            let Some(stage) = &self.stages[i] else { break };
            let t = Instant::now();
            let r = stage.stage.run(chunk, from, to);
            let nanos = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.busy[i].fetch_add(nanos, Ordering::Relaxed);
            if let Err(e) = r {
                self.fail(e);
                break;
            }
            if let Some(f) = from {
                self.free[i - 1].push(f);
            }
            if let Some(t) = to {
                self.inputs[i + 1].push((c, Some(t)));
            }
        }
        self.lane_done(i);
    }

    /// Ends a lane of stage `i`: the last one closes the next stage's
    /// input.
    fn lane_done(&self, i: usize) {
        if self.active[i].fetch_sub(1, Ordering::AcqRel) == 1 && i + 1 < self.stages.len() {
            self.inputs[i + 1].close();
        }
    }

    /// Stage `i` as a flow: starts chunks while it has room, a free slot
    /// and input (waiting for them only when nothing is in flight), then
    /// waits for one to finish and passes the finished ones on.
    fn flow(&self, i: usize, f: &mut dyn Flow) {
        let last = i + 1 == self.stages.len();
        // Started chunks: (index, from, to).
        let mut started: Vec<(usize, Option<usize>, Option<usize>)> = Vec::new();
        let mut ended = false;
        let mut since = Instant::now();
        loop {
            while !ended && started.len() < f.room() {
                let block = started.is_empty();
                let to = match last {
                    true => None,
                    false => match self.free[i].take(block) {
                        Take::Item(s) => Some(s),
                        Take::Empty => break,
                        Take::Ended => {
                            ended = true;
                            break;
                        }
                    },
                };
                let (c, from) = match self.inputs[i].take(block) {
                    Take::Item(item) => item,
                    other => {
                        if let Some(t) = to {
                            self.free[i].push(t);
                        }
                        ended = matches!(other, Take::Ended);
                        break;
                    }
                };
                if started.is_empty() {
                    since = Instant::now();
                }
                if let Err(e) = f.start(&self.chunks[c], from, to) {
                    self.fail(e);
                    return self.lane_done(i);
                }
                started.push((c, from, to));
            }
            if started.is_empty() || self.stopped() {
                break;
            }
            match f.finish() {
                Err(e) => {
                    self.fail(e);
                    break;
                }
                Ok(done) => {
                    for c in done {
                        let Some(at) = started.iter().position(|s| s.0 == c) else {
                            continue;
                        };
                        let (c, from, to) = started.swap_remove(at);
                        if let Some(fr) = from {
                            self.free[i - 1].push(fr);
                        }
                        if let Some(t) = to {
                            self.inputs[i + 1].push((c, Some(t)));
                        }
                    }
                    if started.is_empty() {
                        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        self.busy[i].fetch_add(nanos, Ordering::Relaxed);
                    }
                }
            }
        }
        self.lane_done(i);
    }

    /// Whether a stage failed.
    fn stopped(&self) -> bool {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Keeps the first error and stops every stage.
    fn fail(&self, e: Error) {
        let mut error = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if error.is_none() {
            *error = Some(e);
        }
        drop(error);
        for q in &self.inputs {
            q.stop();
        }
        for q in &self.free {
            q.stop();
        }
    }
}

/// A blocking FIFO between lanes. Closing it lets takers drain what is
/// left; stopping it ends every take at once.
struct Queue<T> {
    state: Mutex<QueueState<T>>,
    ready: Condvar,
}

/// What [`Queue::take`] found.
enum Take<T> {
    Item(T),
    /// Nothing now (only without waiting).
    Empty,
    /// Nothing ever again: stopped, or closed and drained.
    Ended,
}

struct QueueState<T> {
    items: VecDeque<T>,
    closed: bool,
    stopped: bool,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                closed: false,
                stopped: false,
            }),
            ready: Condvar::new(),
        }
    }
}

impl<T> Queue<T> {
    fn filled(items: impl IntoIterator<Item = T>) -> Self {
        let q = Self::default();
        q.lock().items.extend(items);
        q
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, item: T) {
        self.lock().items.push_back(item);
        self.ready.notify_one();
    }

    /// The next item; `None` once the queue is stopped, or closed and
    /// empty.
    fn pop(&self) -> Option<T> {
        match self.take(true) {
            Take::Item(item) => Some(item),
            _ => None,
        }
    }

    /// The next item, waiting for one when `block`.
    fn take(&self, block: bool) -> Take<T> {
        let mut s = self.lock();
        loop {
            if s.stopped {
                return Take::Ended;
            }
            if let Some(item) = s.items.pop_front() {
                return Take::Item(item);
            }
            if s.closed {
                return Take::Ended;
            }
            if !block {
                return Take::Empty;
            }
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    fn stop(&self) {
        self.lock().stopped = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn chunks_cover_the_transfer_on_aligned_boundaries() {
        let c = chunks(10_000, 4096, 100);
        let lens: Vec<usize> = c.iter().map(|c| c.len).collect();
        assert_eq!(lens, vec![3996, 4096, 1908]);
        assert!(chunks(0, 4096, 0).is_empty());
        assert_eq!(chunks(5, 4096, 0).len(), 1);
    }

    proptest! {
        #[test]
        fn chunks_tile_without_gaps(len in 0usize..100_000, size in 1usize..9000, skew in 0usize..20_000) {
            let c = chunks(len, size, skew);
            let mut at = 0;
            for (i, ch) in c.iter().enumerate() {
                prop_assert_eq!(ch.index, i);
                prop_assert_eq!(ch.offset, at);
                prop_assert!(ch.len > 0 && ch.len <= size);
                // Every boundary inside the transfer is aligned.
                if i + 1 < c.len() {
                    prop_assert_eq!((ch.offset + ch.len + skew) % size, 0);
                }
                at += ch.len;
            }
            prop_assert_eq!(at, len);
        }
    }

    /// A model of staged memory: the source's bytes, a ring per gap
    /// between stages, the destination; every stage copies and checks
    /// that no other lane holds its slots meanwhile.
    struct Model {
        src: Vec<u8>,
        rings: Vec<Vec<Mutex<Vec<u8>>>>,
        dst: Mutex<Vec<u8>>,
        held: Vec<Vec<AtomicBool>>,
        slot: usize,
        fail_at: Option<(usize, usize)>,
    }

    struct ModelStage<'a> {
        m: &'a Model,
        i: usize,
        k: usize,
    }

    impl Stage for ModelStage<'_> {
        fn run(&self, c: &Chunk, from: Option<usize>, to: Option<usize>) -> Result<()> {
            let m = self.m;
            if m.fail_at == Some((self.i, c.index)) {
                return Err(Error::InvalidArgument(format!(
                    "stage {} chunk {}",
                    self.i, c.index
                )));
            }
            let bytes: Vec<u8> = match (self.i, from) {
                (0, None) => m.src[c.offset..c.offset + c.len].to_vec(),
                (i, Some(s)) => {
                    assert!(m.held[i - 1][s].load(Ordering::SeqCst));
                    m.rings[i - 1][s].lock().unwrap()[..c.len].to_vec()
                }
                _ => panic!("stage {} got slot {from:?}", self.i),
            };
            std::thread::yield_now();
            match (self.i + 1 == self.k, to) {
                (true, None) => {
                    m.dst.lock().unwrap()[c.offset..c.offset + c.len].copy_from_slice(&bytes)
                }
                (false, Some(s)) => {
                    assert!(
                        !m.held[self.i][s].swap(true, Ordering::SeqCst),
                        "slot {s} taken twice"
                    );
                    m.rings[self.i][s].lock().unwrap()[..c.len].copy_from_slice(&bytes);
                }
                _ => panic!("stage {} got slot {to:?}", self.i),
            }
            if let Some(s) = from {
                assert!(m.held[self.i - 1][s].swap(false, Ordering::SeqCst));
            }
            Ok(())
        }
    }

    fn model(
        k: usize,
        len: usize,
        slot: usize,
        slots: usize,
        fail_at: Option<(usize, usize)>,
    ) -> Model {
        Model {
            src: (0..len).map(|i| (i * 7 + i / 251) as u8).collect(),
            rings: (1..k)
                .map(|_| (0..slots).map(|_| Mutex::new(vec![0; slot])).collect())
                .collect(),
            dst: Mutex::new(vec![0xEE; len]),
            held: (1..k)
                .map(|_| (0..slots).map(|_| AtomicBool::new(false)).collect())
                .collect(),
            slot,
            fail_at,
        }
    }

    /// A model stage run as a flow: chunks move when they finish, a
    /// pseudo-random number of them (at least one) at each `finish`, in
    /// any order.
    struct ModelFlow<'a> {
        stage: ModelStage<'a>,
        room: usize,
        started: Vec<(Chunk, Option<usize>, Option<usize>)>,
        seed: u64,
    }

    impl Flow for ModelFlow<'_> {
        fn room(&self) -> usize {
            self.room
        }

        fn start(&mut self, c: &Chunk, from: Option<usize>, to: Option<usize>) -> Result<()> {
            assert!(self.started.len() < self.room, "more started than room");
            self.started.push((*c, from, to));
            Ok(())
        }

        fn finish(&mut self) -> Result<Vec<usize>> {
            assert!(!self.started.is_empty(), "finish with nothing started");
            self.seed = self
                .seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = 1 + (self.seed >> 33) as usize % self.started.len();
            let mut done = Vec::new();
            for _ in 0..n {
                let at = (self.seed >> 40) as usize % self.started.len();
                let (c, from, to) = self.started.swap_remove(at);
                self.stage.run(&c, from, to)?;
                done.push(c.index);
            }
            Ok(done)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run_model(
        m: &Model,
        k: usize,
        lanes: &[usize],
        slots: usize,
        skew: usize,
        flow_at: Option<usize>,
        room: usize,
    ) -> Result<Outcome> {
        let cs = chunks(m.src.len(), m.slot, skew);
        let stages: Vec<ModelStage> = (0..k).map(|i| ModelStage { m, i, k }).collect();
        let mut flow = flow_at.map(|i| ModelFlow {
            stage: ModelStage { m, i, k },
            room,
            started: Vec::new(),
            seed: (m.src.len() * 31 + i) as u64,
        });
        let mut drivers: Vec<Driver> = stages
            .iter()
            .zip(lanes)
            .map(|(s, &n)| Driver::Lanes(Lanes { stage: s, lanes: n }))
            .collect();
        if let (Some(i), Some(f)) = (flow_at, flow.as_mut()) {
            drivers[i] = Driver::Flow(f);
        }
        execute(&cs, drivers, &vec![slots; k - 1])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_byte_arrives_through_any_pipeline(
            k in 1usize..5,
            len in 0usize..40_000,
            slot in 1usize..5000,
            slots in 1usize..4,
            lanes in proptest::collection::vec(1usize..4, 4),
            skew in 0usize..5000,
            flow_at in proptest::option::of(0usize..4),
            room in 1usize..6,
        ) {
            let flow_at = flow_at.map(|i| i % k);
            let m = model(k, len, slot, slots, None);
            let out = run_model(&m, k, &lanes[..k], slots, skew, flow_at, room).unwrap();
            prop_assert_eq!(out.busy.len(), k);
            prop_assert!(m.dst.lock().unwrap()[..] == m.src[..]);
            for ring in &m.held {
                prop_assert!(ring.iter().all(|h| !h.load(Ordering::SeqCst)));
            }
        }

        #[test]
        fn the_first_error_stops_the_pipeline(
            k in 1usize..5,
            stage in 0usize..4,
            chunk in 0usize..10,
            lanes in proptest::collection::vec(1usize..4, 4),
            flow_at in proptest::option::of(0usize..4),
            room in 1usize..6,
        ) {
            let stage = stage % k;
            let flow_at = flow_at.map(|i| i % k);
            let m = model(k, 10 * 1000, 1000, 2, Some((stage, chunk)));
            let e = run_model(&m, k, &lanes[..k], 2, 0, flow_at, room).unwrap_err();
            prop_assert_eq!(e.to_string(), Error::InvalidArgument(format!("stage {stage} chunk {chunk}")).to_string());
        }
    }

    #[test]
    fn a_bad_shape_is_refused() {
        let m = model(2, 10, 5, 1, None);
        let s = ModelStage { m: &m, i: 0, k: 2 };
        let lanes = |n| {
            Driver::Lanes(Lanes {
                stage: &s,
                lanes: n,
            })
        };
        assert!(execute(&chunks(10, 5, 0), vec![lanes(1)], &[1]).is_err());
        assert!(execute(&chunks(10, 5, 0), vec![], &[]).is_err());
        assert!(execute(&chunks(10, 5, 0), vec![lanes(0)], &[]).is_err());
        let mk = || ModelFlow {
            stage: ModelStage { m: &m, i: 0, k: 2 },
            room: 1,
            started: Vec::new(),
            seed: 1,
        };
        let (mut f, mut g) = (mk(), mk());
        assert!(execute(
            &chunks(10, 5, 0),
            vec![Driver::Flow(&mut f), Driver::Flow(&mut g)],
            &[1]
        )
        .is_err());
    }
}
