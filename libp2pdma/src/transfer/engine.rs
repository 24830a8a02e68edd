//! The engine: the one object a user holds. It owns what transfers share
//! ([`Core`]), the worker threads of background transfers and the host
//! staging rings of routes, and hands each call to the feature that
//! serves it: single transfers to the core, strided transfers to
//! [`strided`], routes to [`route`],
//! background transfers to [`asyncio`]. The features take
//! the resources they need, never the engine.

use std::{fmt, path::PathBuf, sync::Arc};

use super::{
    asyncio::{self, Request, StridedRequest, Ticket},
    core::{Core, GeometryChoice, Handle, Report},
    exec::{rings::RingPool, workers::Workers},
    plan::{PathChoice, TransferPath},
    route::{self, End, Route, RouteOptions, RouteReport, Via},
    stats::Stats,
    storage::StorageFile,
    strided::{self, Layout, Shape, StridedMode, StridedReport},
    tuning::{
        config::Config,
        constants::{Effort, Key, Measurement, Resolved},
    },
};
use crate::{
    memory::{DeviceMemory, MemRange},
    Module, Result,
};

/// The transfer engine. Thread-safe: each concurrent transfer takes its own
/// ring.
pub struct Engine {
    core: Arc<Core>,
    workers: Arc<Workers<Core>>,
    rings: RingPool,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("config", self.core.config())
            .finish()
    }
}

impl Engine {
    /// An engine with `config`, and the module when accelerator memory is
    /// used (P2P queries and the module's block I/O need it).
    pub fn new(config: Config, module: Option<Arc<Module>>) -> Self {
        Self {
            core: Arc::new(Core::new(config, module)),
            workers: Arc::new(Workers::new()),
            rings: RingPool::default(),
        }
    }

    /// What the engine's transfers share.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        self.core.config()
    }

    /// Counters per path.
    pub fn stats(&self) -> &Stats {
        self.core.stats()
    }

    /// The path transfers between `file` and `mem` take, and why
    /// ([`Core::choose`]).
    pub fn choose(&self, file: &StorageFile, mem: &dyn DeviceMemory) -> Result<PathChoice> {
        self.core.choose(file, mem)
    }

    /// `file` and `mem` paired, with the path chosen once for every
    /// transfer between them ([`Core::handle`]).
    pub fn handle<'a>(
        &'a self,
        file: &'a StorageFile,
        mem: &'a dyn DeviceMemory,
    ) -> Result<Handle<'a>> {
        self.core.handle(file, mem)
    }

    /// The read [`Engine::read`] would make, if the page cache can serve
    /// it now without blocking (see [`Core::read_if_cached`]); `None`
    /// otherwise, the read then being the caller's to make. Lets a caller
    /// that must not block (an event loop, an interpreter holding its lock)
    /// skip the hand-off for data already in memory.
    pub fn read_if_cached(
        &self,
        file: &StorageFile,
        file_offset: u64,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        len: usize,
    ) -> Option<Report> {
        let range = MemRange::new(mem, mem_offset, len).ok()?;
        self.core.read_if_cached(file, file_offset, range)
    }

    /// Reads `len` bytes at `file_offset` into `mem` at `mem_offset`.
    pub fn read(
        &self,
        file: &StorageFile,
        file_offset: u64,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        len: usize,
    ) -> Result<Report> {
        self.core
            .handle(file, mem)?
            .read(file_offset, mem_offset, len)
    }

    /// Writes `len` bytes of `mem` at `mem_offset` to `file_offset`.
    pub fn write(
        &self,
        file: &StorageFile,
        file_offset: u64,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        len: usize,
    ) -> Result<Report> {
        self.core
            .handle(file, mem)?
            .write(file_offset, mem_offset, len)
    }

    /// The chunk size and depth a transfer of `len` bytes with `file`
    /// uses, and why ([`Core::geometry`]).
    pub fn geometry(&self, file: &StorageFile, len: usize) -> GeometryChoice {
        self.core.geometry(file, len)
    }

    /// Calibrates `file`'s geometry now, if it is due ([`Core::prepare`]).
    pub fn prepare(&self, file: &StorageFile, file_offset: u64, len: usize) -> Result<()> {
        self.core.prepare(file, file_offset, len)
    }

    /// Reads the runs of `shape` into `mem` ([`strided::read_strided`]).
    pub fn read_strided(
        &self,
        file: &StorageFile,
        shape: &Shape,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        strided::read_strided(&self.core, file, shape, mem, mem_offset, layout, mode)
    }

    /// Writes the runs of `shape` from `mem` ([`strided::write_strided`]).
    pub fn write_strided(
        &self,
        file: &StorageFile,
        shape: &Shape,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        strided::write_strided(&self.core, file, shape, mem, mem_offset, layout, mode)
    }

    /// Copies the runs of `shape` in host memory `src` into `mem`
    /// ([`strided::copy_strided_to_memory`]).
    pub fn copy_strided_to_memory(
        &self,
        src: &[u8],
        shape: &Shape,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        layout: Layout,
        mode: StridedMode,
    ) -> Result<StridedReport> {
        strided::copy_strided_to_memory(&self.core, src, shape, mem, mem_offset, layout, mode)
    }

    /// Copies the runs of `shape` out of `mem` into host memory `dst`
    /// ([`strided::copy_strided_from_memory`]).
    pub fn copy_strided_from_memory(
        &self,
        mem: &dyn DeviceMemory,
        mem_offset: usize,
        layout: Layout,
        shape: &Shape,
        dst: &mut [u8],
        mode: StridedMode,
    ) -> Result<StridedReport> {
        strided::copy_strided_from_memory(&self.core, mem, mem_offset, layout, shape, dst, mode)
    }

    /// Measures the strided cost model's constants
    /// ([`strided::measure_strided`]).
    pub fn measure_strided(
        &self,
        file: Option<&StorageFile>,
        mem: &dyn DeviceMemory,
        effort: Effort,
    ) -> Measurement {
        strided::measure_strided(&self.core, file, mem, effort)
    }

    /// The strided cost model's constants for `file`, `mem` and `path`
    /// ([`strided::strided_constants`]).
    pub fn strided_constants(
        &self,
        file: Option<&StorageFile>,
        mem: &dyn DeviceMemory,
        path: TransferPath,
    ) -> Resolved {
        strided::strided_constants(&self.core, file, mem, path)
    }

    /// What the constants for `file` and `mem` are kept under
    /// ([`strided::strided_key`]).
    pub fn strided_key(&self, file: Option<&StorageFile>, mem: &dyn DeviceMemory) -> Result<Key> {
        strided::strided_key(&self.core, file, mem)
    }

    /// Measures and stores the constants for `file` and `mem`
    /// ([`strided::calibrate_strided`]).
    pub fn calibrate_strided(
        &self,
        file: Option<&StorageFile>,
        mem: &dyn DeviceMemory,
    ) -> Result<(Key, Measurement, Option<PathBuf>)> {
        strided::calibrate_strided(&self.core, file, mem)
    }

    /// Plans a route from `src` to `dst` ([`route::route`]).
    pub fn route<'a>(&self, src: End<'a>, dst: End<'a>) -> Result<Route<'a>> {
        route::route(&self.core, src, dst)
    }

    /// Plans a route from `src` to `dst` through `via`
    /// ([`route::route_through`]).
    pub fn route_through<'a>(
        &self,
        src: End<'a>,
        via: &[Via<'a>],
        dst: End<'a>,
    ) -> Result<Route<'a>> {
        route::route_through(&self.core, src, via, dst)
    }

    /// Copies `len` bytes along `route` ([`route::copy`]).
    pub fn copy(&self, route: &Route<'_>, len: usize, opts: &RouteOptions) -> Result<RouteReport> {
        route::copy(&self.core, &self.rings, route, len, opts)
    }

    /// Submits a transfer to run in the background; returns at once.
    pub fn submit(&self, req: Request) -> Ticket {
        asyncio::submit(&self.core, &self.workers, req)
    }

    /// Submits a transfer that runs when its ticket is first waited for,
    /// on the waiting thread ([`Ticket::wait`], [`Ticket::wait_done`]), or
    /// is handed to the worker threads when it is first polled or asked
    /// whether it is done: a small read followed by a wait then costs no
    /// hand-off between threads (KvikIO runs small reads of host memory
    /// deferred, for the same reason). A read the page cache can serve at
    /// once is served here, as [`Engine::submit`] serves it. A ticket
    /// dropped before either never runs its transfer.
    pub fn submit_deferred(&self, req: Request) -> Ticket {
        asyncio::submit_deferred(&self.core, &self.workers, req)
    }

    /// Submits many transfers at once; they run in parallel on the pool.
    pub fn submit_batch(&self, reqs: impl IntoIterator<Item = Request>) -> Vec<Ticket> {
        reqs.into_iter().map(|r| self.submit(r)).collect()
    }

    /// Submits a strided read or write to run in the background; returns
    /// at once. Its ticket gives what [`Engine::read_strided`] or
    /// [`Engine::write_strided`] would have returned.
    pub fn submit_strided(&self, req: StridedRequest) -> Ticket<StridedReport> {
        asyncio::submit_strided(&self.core, &self.workers, req)
    }

    /// Submits many strided transfers at once; they run in parallel on the
    /// pool (each also spreading its own runs as it would alone).
    pub fn submit_strided_batch(
        &self,
        reqs: impl IntoIterator<Item = StridedRequest>,
    ) -> Vec<Ticket<StridedReport>> {
        reqs.into_iter().map(|r| self.submit_strided(r)).collect()
    }

    /// Waits for every ticket and returns the results in order.
    pub fn wait_all<T>(tickets: &[Ticket<T>]) -> Vec<Result<T>> {
        tickets.iter().map(Ticket::wait).collect()
    }
}
