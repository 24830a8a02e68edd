//! The engine: the one object a user holds. It owns what transfers share
//! ([`Core`]), the worker threads of background transfers and the host
//! staging rings of routes, and hands each call to the feature that
//! serves it: single transfers to the core, background transfers to
//! [`asyncio`]. Strided transfers and routes are views of the engine
//! ([`Engine::strided`], [`Engine::routes`]), whose calls live beside
//! them ([`strided`](super::strided), [`route`](super::route)). The
//! features take the resources they need, never the engine.

use std::{fmt, sync::Arc};

use super::{
    asyncio::{self, Request, StridedRequest, Ticket},
    core::{Core, GeometryChoice, Handle, Report},
    exec::{rings::RingPool, workers::Workers},
    plan::PathChoice,
    route::Routes,
    stats::Stats,
    storage::StorageFile,
    strided::{Strided, StridedReport},
    tuning::config::Config,
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
        range: MemRange<'_>,
    ) -> Option<Report> {
        self.core.read_if_cached(file, file_offset, range)
    }

    /// Reads the bytes at `file_offset` into `range`.
    pub fn read(
        &self,
        file: &StorageFile,
        file_offset: u64,
        range: MemRange<'_>,
    ) -> Result<Report> {
        self.core
            .handle(file, range.mem())?
            .read(file_offset, range.offset(), range.len())
    }

    /// Writes the bytes of `range` to `file_offset`.
    pub fn write(
        &self,
        file: &StorageFile,
        file_offset: u64,
        range: MemRange<'_>,
    ) -> Result<Report> {
        self.core
            .handle(file, range.mem())?
            .write(file_offset, range.offset(), range.len())
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

    /// The strided transfers: runs of a file laid out by strides, and the
    /// cost model that chooses how they move.
    pub fn strided(&self) -> Strided<'_> {
        Strided::new(&self.core)
    }

    /// Routes: transfers between any two places as a chain of hops.
    pub fn routes(&self) -> Routes<'_> {
        Routes::new(&self.core, &self.rings)
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
    /// at once. Its ticket gives what [`Strided::read`] or
    /// [`Strided::write`] would have returned.
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
