//! What every transfer shares: the configuration, pooled rings and bounce
//! buffers, the copy threads, what was learned of each device, and the
//! counters; the path choice and the single transfer every feature (strided
//! transfers, routes, calibration) is built from. The
//! [`Engine`](super::Engine) is the face over it.

use std::{
    collections::HashMap,
    fmt,
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Instant,
};

use super::{
    calibrate,
    exec::copypool,
    paths::{self, bounce, cached, nvme_cmd, p2p},
    plan::{
        self, DrivenFacts, DrivenMember, Facts, MemoryFacts, PageCache, PathChoice, Residency,
        Source, TransferPath,
    },
    stats::Stats,
    storage::{ChoiceKey, StorageFile},
    tuning::{
        config::Config,
        constants,
        geometry::{self, Geometry},
    },
    xfer::{self, CopyStage, Direction, Xfer},
};
use crate::{
    memory::{DeviceMemory, MemRange, MemoryKind},
    sys::uring::Context,
    transfer::Volume,
    Error, Module, Peer, Result,
};

/// What one transfer did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Bytes moved (always the length asked for).
    pub bytes: u64,
    /// The path that moved them.
    pub path: TransferPath,
    /// Whether the P2P path failed and the bounce path redid the transfer.
    pub retried: bool,
    /// When `retried`: what the first path said.
    pub retry_reason: Option<String>,
    /// Whether the bounce slots were registered (pinned once) with the ring;
    /// without the memlock limit for it, the kernel pins them per I/O.
    pub ring_pinned: bool,
    /// Threads the copy stage was set to when the transfer ended: 1 off the
    /// bounce path, for writes, or when one was enough. Pieces are at least
    /// 256 KiB, so smaller chunks are copied by fewer threads than this.
    pub copy_threads: usize,
    /// Bytes of a read copied out of the page cache rather than moved by
    /// `path` (see [`PageCache`]); `path` moved the rest.
    pub page_cache: u64,
}

impl Report {
    /// `bytes` moved by `path` alone: not retried, no bounce slots, one
    /// copy thread, nothing from the page cache.
    pub fn new(bytes: u64, path: TransferPath) -> Self {
        Self {
            bytes,
            path,
            retried: false,
            retry_reason: None,
            ring_pinned: false,
            copy_threads: 1,
            page_cache: 0,
        }
    }
}

/// A storage file paired with accelerator memory, with the path chosen for
/// transfers between them and the reason.
///
/// A handle is bound to its memory, so its calls name only the place in
/// it: `at` and `len`, the offset and length a [`MemRange`] of that memory
/// would take ([`MemRange::new`]), after the file offset as in every
/// transfer call.
pub struct Handle<'a> {
    core: &'a Core,
    file: &'a StorageFile,
    mem: &'a dyn DeviceMemory,
    choice: Arc<PathChoice>,
    page_cache: PageCache,
}

impl fmt::Debug for Handle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("file", &self.file.path)
            .field("mem", &self.mem.kind())
            .field("choice", &self.choice)
            .finish()
    }
}

impl Handle<'_> {
    /// The path transfers on this handle take.
    pub fn path(&self) -> TransferPath {
        self.choice.path
    }

    /// Why.
    pub fn reason(&self) -> &str {
        &self.choice.reason
    }

    /// The full choice.
    pub fn choice(&self) -> &PathChoice {
        &self.choice
    }

    /// The same handle, its reads using the page cache as `page_cache`
    /// says rather than as the engine's configuration does: the per-call
    /// choice.
    pub fn with_page_cache(self, page_cache: PageCache) -> Self {
        Self { page_cache, ..self }
    }

    /// Reads `len` bytes at `file_offset` into the memory at `at`;
    /// `Error::OutOfBounds` when they do not fit in it.
    pub fn read(&self, file_offset: u64, at: usize, len: usize) -> Result<Report> {
        self.transfer(Direction::Read, file_offset, at, len)
    }

    /// Writes `len` bytes of the memory at `at` to `file_offset`;
    /// `Error::OutOfBounds` when they do not fit in it.
    pub fn write(&self, file_offset: u64, at: usize, len: usize) -> Result<Report> {
        self.transfer(Direction::Write, file_offset, at, len)
    }

    fn transfer(&self, dir: Direction, file_offset: u64, at: usize, len: usize) -> Result<Report> {
        let range = MemRange::new(self.mem, at, len)?;
        let job = Job {
            dir,
            choice: &self.choice,
            file: self.file,
            file_offset,
            range,
        };
        self.core.run_as(self.page_cache, job)
    }
}

/// One transfer as the core runs it: which way, on which path, between
/// `file` at `file_offset` and `range`.
#[derive(Clone, Copy)]
pub(crate) struct Job<'a> {
    pub(crate) dir: Direction,
    pub(crate) choice: &'a PathChoice,
    pub(crate) file: &'a StorageFile,
    pub(crate) file_offset: u64,
    pub(crate) range: MemRange<'a>,
}

/// The resources transfers share. Thread-safe: each concurrent transfer
/// takes its own ring.
pub struct Core {
    pub(crate) config: Config,
    pub(crate) module: Option<Arc<Module>>,
    pub(crate) pool: Mutex<Vec<Context>>,
    pub(crate) stats: Stats,
    /// The copy stage's helper threads.
    pub(crate) copy: copypool::CopyPool,
    /// What AUTO knows of each storage device's geometry.
    pub(crate) devices: Mutex<HashMap<geometry::DeviceKey, Known>>,
    /// What the strided cost model knows of each device, memory and path.
    pub(crate) constants: Mutex<HashMap<constants::Key, constants::KnownConstants>>,
    /// Copy threads the last automatically sized bounce read ended with:
    /// the next one starts there.
    pub(crate) copy_threads_auto: AtomicUsize,
    /// The most copy threads automatic sizing uses: the cores this process
    /// may run on (read once: finding out reads cgroup files), at most
    /// [`MAX_AUTO_COPY_THREADS`].
    pub(crate) copy_threads_most: usize,
}

/// What AUTO knows of a device's geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Known {
    /// Learned by calibration, in this process or from the cache.
    Learned(geometry::Learned),
    /// Nothing yet: the facts' choice until a large read calibrates.
    Unknown,
    /// A calibration is running.
    Calibrating,
    /// Calibration failed: the facts' choice for this engine's life.
    Facts,
}

/// Device `key`'s entry in `devices`, read from the cache in `dir` when it
/// has none yet.
fn known_entry<'m>(
    devices: &'m mut HashMap<geometry::DeviceKey, Known>,
    dir: &Path,
    key: &geometry::DeviceKey,
) -> &'m mut Known {
    devices
        .entry(key.clone())
        .or_insert_with(|| match geometry::Cache::in_dir(dir).lookup(key) {
            Some(l) => Known::Learned(l),
            None => Known::Unknown,
        })
}

/// The chunk size and depth a transfer uses, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeometryChoice {
    /// Bytes per chunk and chunks in flight.
    pub geometry: Geometry,
    /// Where they come from, in words.
    pub reason: String,
}

/// Most threads the automatic copy stage uses.
const MAX_AUTO_COPY_THREADS: usize = 4;

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("config", &self.config)
            .finish()
    }
}

impl Core {
    /// An engine with `config`; `module` is used for P2P queries (AUTO
    /// without a module always chooses the bounce path).
    pub fn new(config: Config, module: Option<Arc<Module>>) -> Self {
        Self {
            config,
            module,
            pool: Mutex::new(Vec::new()),
            stats: Stats::default(),
            copy: copypool::CopyPool::default(),
            devices: Mutex::new(HashMap::new()),
            constants: Mutex::new(HashMap::new()),
            copy_threads_auto: AtomicUsize::new(1),
            copy_threads_most: std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(MAX_AUTO_COPY_THREADS),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Per-path counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Chooses the path for transfers between `file` and `mem`: the path
    /// rule ([`plan::decide`]) on the facts of the pair
    /// ([`Core::facts`]).
    ///
    /// [`PathPref::NvmeCmd`](super::PathPref::NvmeCmd) needs storage on an NVMe namespace
    /// ([`StorageFile::nvme_namespace`]): the namespace, a partition of it,
    /// or a regular file on ext4 or XFS there, whose extents each transfer
    /// maps with `FIEMAP`; anything else is `Error::PathUnavailable` with the
    /// reason. A transfer the path cannot serve after all (a hole or shared
    /// extent under a write, say) is retried on the bounce path.
    pub fn choose(&self, file: &StorageFile, mem: &dyn DeviceMemory) -> Result<PathChoice> {
        plan::decide(&self.facts(file, mem))
    }

    /// What the path rule decides on for `file` and `mem`: this engine's
    /// preference, the memory's and the storage's facts, and the kernel's
    /// answers for the pair (asked here, where the memory is an
    /// accelerator's from the module).
    pub fn facts(&self, file: &StorageFile, mem: &dyn DeviceMemory) -> Facts {
        let memory = MemoryFacts::of(mem);
        let mut storage = file.facts();
        storage.driven = file.queues.as_deref().map(|v| driven_facts(v, &memory));
        let (mut p2p, mut paths) = (None, Vec::new());
        if let (MemoryKind::ModuleBar { index, .. }, Some(m), true) =
            (&memory.kind, &self.module, file.is_nvme())
        {
            if let Some((_, members)) = &file.array {
                // An md array: every member's controller is asked.
                paths = plan::query_paths(m, *index, members);
            } else if file.multipath.is_empty() {
                p2p = file
                    .controller()
                    .and_then(|pci| m.p2p_query(*index, Peer::Pci(pci)).ok());
            } else {
                // A multipath namespace: every path's controller is asked.
                paths = plan::query_paths(m, *index, &file.multipath);
            }
        }
        Facts {
            pref: self.config.path,
            submit: self.config.p2p_submit,
            module: self.module.is_some(),
            // Memory from the module is of an accelerator bound to it.
            accelerator: matches!(memory.kind, MemoryKind::ModuleBar { .. }),
            memory,
            storage,
            p2p,
            paths,
        }
    }

    /// A handle for transfers between `file` and `mem`, with its path: the
    /// choice [`Core::choose`] makes, made once per file for each kind of
    /// memory and kept with the file, so small transfers do not pay for it.
    pub fn handle<'a>(
        &'a self,
        file: &'a StorageFile,
        mem: &'a dyn DeviceMemory,
    ) -> Result<Handle<'a>> {
        let key = ChoiceKey {
            pref: self.config.path,
            submit: self.config.p2p_submit,
            module: self.module.is_some(),
            mem: MemoryFacts::of(mem),
        };
        let choice = match file.cached_choice(&key) {
            Some(c) => c,
            None => {
                let c = Arc::new(self.choose(file, mem)?);
                file.cache_choice(key, c.clone());
                c
            }
        };
        Ok(Handle {
            core: self,
            file,
            mem,
            choice,
            page_cache: self.config.page_cache,
        })
    }

    /// The chunk size and depth a read of `len` bytes of `file` would use
    /// now, and why (without calibrating: see [`Core::prepare`]).
    pub fn geometry(&self, file: &StorageFile, len: usize) -> GeometryChoice {
        let (device, learned) = self.device_geometry(file);
        let why = Self::device_geometry_reason(file, learned);
        let (chunk, depth) = self.config.geometry(len, file.block, device);
        let reason = match (self.config.chunk, self.config.depth) {
            (Some(_), Some(_)) => "chunk and depth set by configuration".to_string(),
            (Some(_), None) => format!("chunk set by configuration, depth {why}"),
            (None, Some(_)) => format!("depth set by configuration, chunk {why}"),
            (None, None) if chunk < device.chunk => {
                format!("{why}; chunk reduced to a quarter of the {len}-byte transfer")
            }
            (None, None) => why,
        };
        GeometryChoice {
            geometry: Geometry { chunk, depth },
            reason,
        }
    }

    /// Gets ready for reads of `len` bytes of `file` at `file_offset`:
    /// calibrates the device if AUTO would on such a read, and sets up the
    /// ring and bounce slots for its geometry, so that the first transfer
    /// does not pay for them.
    pub fn prepare(&self, file: &StorageFile, file_offset: u64, len: usize) -> Result<()> {
        self.calibrate_if_due(file, file_offset, len);
        let (chunk, depth) = self
            .config
            .geometry(len, file.block, self.device_geometry(file).0);
        let ctx = self.context(chunk, depth)?;
        self.give_back(ctx);
        Ok(())
    }

    /// The device's geometry for AUTO, and what was learned for it, if
    /// anything.
    pub(crate) fn device_geometry(
        &self,
        file: &StorageFile,
    ) -> (Geometry, Option<geometry::Learned>) {
        let learned = match (&self.config.cache_dir, &file.key) {
            (Some(dir), Some(key)) => match self.known(dir, key) {
                Known::Learned(l) => Some(l),
                _ => None,
            },
            _ => None,
        };
        match learned {
            Some(l) => (l.geometry, Some(l)),
            None => (geometry::from_facts(&file.disk), None),
        }
    }

    /// Where [`Core::device_geometry`]'s choice comes from, in words.
    pub(crate) fn device_geometry_reason(
        file: &StorageFile,
        learned: Option<geometry::Learned>,
    ) -> String {
        if let Some(l) = learned {
            return format!(
                "learned by calibration ({:.2} GiB/s)",
                l.bytes_per_s / (1u64 << 30) as f64
            );
        }
        let d = &file.disk;
        let said = match (d.max_request_bytes, d.queue_requests) {
            (None, None) => "the storage says nothing, defaults".to_string(),
            (r, q) => format!(
                "largest request {}, queue of {}",
                r.map_or("unknown".into(), |b| format!("{} KiB", b >> 10)),
                q.map_or("unknown".into(), |n| n.to_string())
            ),
        };
        format!("from the storage's facts ({said})")
    }

    /// What is known of device `key`, reading the cache in `dir` the first
    /// time.
    pub(crate) fn known(&self, dir: &Path, key: &geometry::DeviceKey) -> Known {
        let mut d = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        *known_entry(&mut d, dir, key)
    }

    /// Calibrates `file`'s device when AUTO chooses both chunk and depth,
    /// learning is on, nothing is known of the device yet, and the
    /// block-aligned part of a read of `len` bytes at `file_offset` is
    /// inside the storage and large enough for [`geometry::plan`] (256 MiB,
    /// or 32 MiB over a network). The result
    /// goes to the cache; a failure leaves the facts' choice. Never fails.
    pub(crate) fn calibrate_if_due(&self, file: &StorageFile, file_offset: u64, len: usize) {
        let (Some(dir), Some(key), None, None) = (
            &self.config.cache_dir,
            &file.key,
            self.config.chunk,
            self.config.depth,
        ) else {
            return;
        };
        let bs = file.block as u64;
        let a0 = xfer::round_up(file_offset, bs);
        let a1 = match file_offset.checked_add(len as u64) {
            Some(end) => xfer::round_down(end, bs),
            None => return,
        };
        let range = usize::try_from(a1.saturating_sub(a0)).unwrap_or(usize::MAX);
        let reach = file.reach();
        if range < reach.min_read() {
            return;
        }
        {
            let mut d = self.devices.lock().unwrap_or_else(|p| p.into_inner());
            let k = known_entry(&mut d, dir, key);
            if !matches!(k, Known::Unknown) {
                return;
            }
            *k = Known::Calibrating;
        }
        // Only a range the storage holds: the read itself reports the end.
        let plan = geometry::plan(&file.disk, reach, range)
            .filter(|_| file.current_size().is_ok_and(|size| a1 <= size));
        let Some(plan) = plan else {
            self.devices
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), Known::Unknown);
            return;
        };
        let known = match calibrate::calibrate(file, a0, range, &plan) {
            Some((l, _)) => {
                // A cache that cannot be written only means calibrating
                // again in the next process.
                let _ = geometry::Cache::in_dir(dir).store(key, &l);
                Known::Learned(l)
            }
            None => Known::Facts,
        };
        self.devices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), known);
    }

    /// Copy threads a bounce read starts with, and the most it may use:
    /// as configured, or automatically (see `docs/transfer.md`).
    pub(crate) fn copy_threads(&self, chunk: usize) -> (usize, usize) {
        if let Some(n) = self.config.copy_threads {
            return (n, n);
        }
        let most = self.copy_threads_most;
        if most < 2 || chunk < 2 * copypool::MIN_PIECE {
            return (1, 1);
        }
        (
            self.copy_threads_auto
                .load(Ordering::Relaxed)
                .clamp(1, most),
            most,
        )
    }

    pub(crate) fn context(&self, chunk: usize, depth: usize) -> Result<Context> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = pool
            .iter()
            .position(|c| c.chunk() == chunk && c.depth() == depth)
        {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        Context::new(depth, chunk)
    }

    pub(crate) fn give_back(&self, ctx: Context) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < 8 {
            pool.push(ctx);
        }
    }

    /// Runs `job`, with reads using the page cache as the configuration
    /// says.
    pub(crate) fn run(&self, job: Job<'_>) -> Result<Report> {
        self.run_as(self.config.page_cache, job)
    }

    /// [`Core::run`], with reads using the page cache as `page_cache` says.
    pub(crate) fn run_as(&self, page_cache: PageCache, job: Job<'_>) -> Result<Report> {
        let Job {
            dir,
            choice,
            file,
            file_offset,
            range,
        } = job;
        let len = range.len();
        if file_offset.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument(
                "file offset + length overflows".into(),
            ));
        }
        // A read past the end of the file: refused up front where that costs
        // no system call (block devices) or where the path would not notice
        // (NVMe commands read blocks past a file's end as a hole, zeros);
        // the other paths find out from the storage's own short read, below.
        let eof = |size: u64| Error::EndOfFile {
            path: file.path.clone(),
            offset: file_offset,
            len: len as u64,
            size,
        };
        if dir == Direction::Read && (!file.is_file || choice.path == TransferPath::NvmeCmd) {
            let size = file.current_size()?;
            if file_offset + len as u64 > size {
                return Err(eof(size));
            }
        }
        if len == 0 {
            return Ok(Report::new(0, choice.path));
        }
        if let Some(v) = &file.queues {
            // Nothing else reaches the namespace: whatever the choice said.
            paths::queues::run(v, dir, file_offset, range, &self.stats.queues)?;
            return Ok(Report::new(len as u64, TransferPath::Queues));
        }
        if dir == Direction::Read && page_cache != PageCache::Direct && file.buffered.is_some() {
            return self.read_cached(page_cache, job);
        }
        self.device(job)
    }

    /// The read of `file` at `file_offset` into `range`, if it can be
    /// served now without blocking: a small read
    /// of a file whose recent reads were all cached ([`plan::ask_first`]),
    /// whose bytes the page cache holds. `None` otherwise, having moved
    /// nothing the caller relies on: the read is then the caller's to make
    /// ([`Handle::read`]), which reports any error.
    pub fn read_if_cached(
        &self,
        file: &StorageFile,
        file_offset: u64,
        range: MemRange<'_>,
    ) -> Option<Report> {
        let streak = &file.cached_streak;
        let len = range.len();
        if len == 0
            || file.queues.is_some()
            || file.buffered.is_none()
            || !plan::ask_first(self.config.page_cache, len, streak.load(Ordering::Relaxed))
            || file_offset.checked_add(len as u64).is_none()
        {
            return None;
        }
        let handle = self.handle(file, range.mem()).ok()?;
        let start = Instant::now();
        match cached::read(file, file_offset, range, true, None) {
            Ok(n) if n == len => {}
            _ => {
                streak.store(0, Ordering::Relaxed);
                return None;
            }
        }
        self.stats
            .page_cache
            .record_transfer(len as u64, start.elapsed());
        Some(Report {
            page_cache: len as u64,
            ..Report::new(len as u64, handle.path())
        })
    }

    /// A read that takes what the page cache holds from it (as
    /// [`plan::cache::split`] says) and the rest by `choice`'s path.
    fn read_cached(&self, pref: PageCache, job: Job<'_>) -> Result<Report> {
        let Job {
            choice,
            file,
            file_offset,
            range,
            ..
        } = job;
        let (mem, len) = (range.mem(), range.len());
        let start = Instant::now();
        let mut from_cache = 0usize;
        let streak = &file.cached_streak;
        if plan::ask_first(pref, len, streak.load(Ordering::Relaxed)) {
            from_cache = cached::read(file, file_offset, range, true, None)?;
            if from_cache == len {
                self.stats
                    .page_cache
                    .record_transfer(len as u64, start.elapsed());
                return Ok(Report {
                    page_cache: len as u64,
                    ..Report::new(len as u64, choice.path)
                });
            }
        }
        let rest = file_offset + from_cache as u64..file_offset + len as u64;
        let residency = match (pref, rest.is_empty()) {
            (PageCache::Auto, false) => cached::residency(file, &rest),
            _ => Residency::Unknown,
        };
        match (&residency, from_cache) {
            (Residency::All, 0) => {
                let _ = streak.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_add(1))
                });
            }
            _ => streak.store(0, Ordering::Relaxed),
        }
        let mut report = Report::new(len as u64, choice.path);
        // Memory without a CPU mapping takes the page cache's bytes through
        // the engine's slots, page-locked for its copy engine where it has
        // one, as the bounce path's copies do.
        let mut slots = None;
        let staged = mem.dma().and_then(|d| d.dma_target()).is_none();
        for (r, source) in plan::cache::split(pref, rest, &residency) {
            let part = range.sub((r.start - file_offset) as usize, (r.end - r.start) as usize)?;
            match source {
                Source::PageCache => {
                    if staged && slots.is_none() {
                        let (chunk, depth) =
                            self.config
                                .geometry(len, file.block, self.device_geometry(file).0);
                        let mut ctx = self.context(chunk, depth)?;
                        stage_for(&mut ctx, mem);
                        slots = Some(ctx);
                    }
                    let buf = slots.as_ref().map(|c| c.slot_memory());
                    cached::read(file, r.start, part, false, buf.as_ref())?;
                    from_cache += part.len();
                }
                Source::Device => {
                    let d = self.device(Job {
                        file_offset: r.start,
                        range: part,
                        ..job
                    })?;
                    report.path = d.path;
                    report.retried |= d.retried;
                    if d.retry_reason.is_some() {
                        report.retry_reason = d.retry_reason;
                    }
                    report.ring_pinned |= d.ring_pinned;
                    report.copy_threads = report.copy_threads.max(d.copy_threads);
                }
            }
        }
        if let Some(ctx) = slots {
            self.give_back(ctx);
        }
        if from_cache > 0 {
            self.stats
                .page_cache
                .record_transfer(from_cache as u64, start.elapsed());
        }
        report.page_cache = from_cache as u64;
        Ok(report)
    }

    /// `len` bytes (> 0) by `choice`'s path (or the bounce path, where the
    /// fast path cannot serve them).
    fn device(&self, job: Job<'_>) -> Result<Report> {
        let (dir, choice, file, file_offset) = (job.dir, job.choice, job.file, job.file_offset);
        let range = job.range;
        let (mem, len) = (range.mem(), range.len());
        let eof = |size: u64| Error::EndOfFile {
            path: file.path.clone(),
            offset: file_offset,
            len: len as u64,
            size,
        };
        if dir == Direction::Read {
            self.calibrate_if_due(file, file_offset, len);
        }
        let (chunk, depth) = self
            .config
            .geometry(len, file.block, self.device_geometry(file).0);
        let mut ctx = self.context(chunk, depth)?;
        stage_for(&mut ctx, mem);
        let ring_pinned = ctx.pinned();
        let (threads, most) = self.copy_threads(chunk);
        let threads = AtomicUsize::new(threads);
        let start = Instant::now();
        let xfer = |stats, path| Xfer {
            file,
            file_offset,
            range,
            stats,
            path,
            submit: self.config.p2p_submit,
            start,
            copy: CopyStage {
                pool: &self.copy,
                threads: &threads,
                auto_most: (self.config.copy_threads.is_none() && most > 1).then_some(most),
                busy: std::sync::atomic::AtomicU64::new(0),
            },
        };
        let bounce_path =
            |ctx: &mut _| bounce::run(ctx, dir, &xfer(&self.stats.bounce, TransferPath::Bounce));
        let (res, path, retry_reason) = match choice.path {
            TransferPath::Bounce => (bounce_path(&mut ctx), TransferPath::Bounce, None),
            // Host memory whose address does not align with the file
            // offset: direct I/O cannot take it, and nothing else can
            // change that, so the pipeline takes it at once.
            TransferPath::Direct
                if !xfer(&self.stats.direct, TransferPath::Direct).mapped_aligned() =>
            {
                (bounce_path(&mut ctx), TransferPath::Bounce, None)
            }
            fast @ (TransferPath::P2p | TransferPath::NvmeCmd | TransferPath::Direct) => {
                let s = self.stats.of(fast);
                let r = match fast {
                    TransferPath::NvmeCmd => nvme_cmd::run(&mut ctx, dir, &xfer(s, fast)),
                    _ => p2p::run(&mut ctx, dir, &xfer(s, fast)),
                };
                let stats = s;
                match r {
                    Ok(()) => (Ok(()), fast, None),
                    Err(e) if e.bounce_can_fix() => {
                        // The fast path could not serve the transfer (the
                        // kernel refused the P2P pages or the direct-I/O
                        // shape, passthrough is unavailable, the layout does
                        // not allow the path): redo the whole transfer
                        // through host memory. What the device said about
                        // the data itself (a medium error, say) is returned
                        // as it is, not read a second time.
                        stats.record_retry();
                        file.forget_choices();
                        (
                            bounce_path(&mut ctx),
                            TransferPath::Bounce,
                            Some(e.to_string()),
                        )
                    }
                    Err(e) => (Err(e), fast, None),
                }
            }
            TransferPath::Queues => (
                Err(Error::PathUnavailable {
                    path: "queues",
                    reason: format!(
                        "{} is not a namespace of a controller this process drives",
                        file.path.display()
                    ),
                }),
                TransferPath::Queues,
                None,
            ),
        };
        self.give_back(ctx);
        let copied = path == TransferPath::Bounce && dir == Direction::Read;
        if self.config.copy_threads.is_none() && copied {
            self.copy_threads_auto
                .store(threads.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if let (Err(Error::Short { .. }), Direction::Read, true) = (&res, dir, file.is_file) {
            let size = file.current_size()?;
            if file_offset + len as u64 > size {
                return Err(eof(size));
            }
        }
        res?;
        self.stats
            .of(path)
            .record_transfer(len as u64, start.elapsed());
        Ok(Report {
            bytes: len as u64,
            path,
            retried: retry_reason.is_some(),
            retry_reason,
            ring_pinned,
            copy_threads: if copied {
                threads.load(Ordering::Relaxed)
            } else {
                1
            },
            page_cache: 0,
        })
    }
}

/// Page-locks `ctx`'s slots for `mem`'s copy engine, once per context, when
/// it has one (a GPU's): its copies out of and into the slots then run by
/// DMA. Where the engine refuses (a locked-memory limit), copies still run,
/// through the driver's own staging.
fn stage_for(ctx: &mut Context, mem: &dyn DeviceMemory) {
    let Some(stager) = mem.stager() else {
        return;
    };
    if ctx.pinned_for(stager.name()) {
        return;
    }
    if let Ok(pin) = stager.pin(ctx.slot_memory()) {
        ctx.keep_pin(stager.name(), Box::new(pin));
    }
}

/// What the path rule needs of the namespace or volume `v`, which this
/// process drives, for memory `memory`: for memory allocated from the
/// module, whether the module lets each member's controller reach it by
/// P2P.
fn driven_facts(v: &Volume, memory: &MemoryFacts) -> DrivenFacts {
    let members = v
        .members()
        .iter()
        .map(|ns| {
            let ctrl = ns.controller();
            let reach = match memory.kind {
                MemoryKind::ModuleBar { index, .. } if memory.module_allocation => Some(
                    ns.module()
                        .p2p_query(index, Peer::Pci(ctrl.pci()))
                        .map_err(|e| e.to_string()),
                ),
                _ => None,
            };
            DrivenMember {
                name: ns.name(),
                controller: ctrl.pci(),
                reach,
            }
        })
        .collect();
    DrivenFacts {
        name: v.name().to_string(),
        iommu: v
            .members()
            .first()
            .map(|ns| ns.controller().iommu().describe())
            .unwrap_or_default(),
        members,
    }
}
