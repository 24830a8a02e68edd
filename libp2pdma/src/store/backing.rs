//! What a store lives on: byte ranges moved between a device and memory,
//! and a flush that makes every returned write durable.

use std::sync::{Arc, Mutex};

use crate::{
    memory::{copy, DeviceMemory, MemRange, MemoryKind},
    queues::Issued,
    transfer::{
        End, Engine, HopKind, Report, Request, RouteOptions, StorageFile, Ticket, TransferPath,
    },
    Result,
};

/// The largest copy between memories moved in one chunk (a cache page).
const PAGE_COPY: usize = 2 << 20;

/// How long [`EngineBacking::claim`] waits for another holder of its range.
pub const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A read started by [`Backing::read_async`].
pub struct Started {
    /// Its ticket, to wait for it with.
    pub ticket: Ticket,
    /// The NVMe commands it submits, queue and identifier, as it submits
    /// them: where the library drives the controller (the queues path).
    pub commands: Option<Arc<Issued>>,
}

/// The device under a store.
pub trait Backing: Send + Sync {
    /// Its size in bytes.
    fn len(&self) -> u64;

    /// Whether it has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the bytes at `offset` into `range`.
    fn read(&self, offset: u64, range: MemRange<'_>) -> Result<()>;

    /// Writes the bytes of `range` to `offset`.
    fn write(&self, offset: u64, range: MemRange<'_>) -> Result<()>;

    /// Starts a read of `len` bytes at `offset` into memory the caller
    /// hands over, at `mem_offset`.
    fn read_async(
        &self,
        offset: u64,
        mem: Arc<dyn DeviceMemory>,
        mem_offset: usize,
        len: usize,
    ) -> Result<Started>;

    /// Makes every write that returned durable.
    fn flush(&self) -> Result<()>;

    /// Claims the device for one store at a time, waiting (a while) for
    /// the writes of an earlier holder that died to land first: a store
    /// that opened while a dead process's commit was still in flight could
    /// see it land over its own. Nothing to claim by default.
    fn claim(&self) -> Result<()> {
        Ok(())
    }

    /// Gives the claim back.
    fn unclaim(&self) {}

    /// Copies `len` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset`: a page from one accelerator's cache to another's. By
    /// the CPU ([`copy()`]) unless the backing knows a better way.
    fn copy(
        &self,
        src: &dyn DeviceMemory,
        src_offset: usize,
        dst: &dyn DeviceMemory,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        copy(src, src_offset, dst, dst_offset, len)
    }
}

/// A store on a file, block device or NVMe namespace, through the transfer
/// engine: every path the engine has (the queues path, P2P, NVMe commands,
/// bounce) and every memory.
pub struct EngineBacking {
    engine: Arc<Engine>,
    file: Arc<StorageFile>,
    /// The window of the file the store owns: its first byte and length.
    base: u64,
    len: u64,
    /// For each pair of memory kinds copied between, whether the engine's
    /// route is copies alone (the CPU's through host memory, or the GPUs').
    routes: Mutex<Vec<(MemoryKind, MemoryKind, bool)>>,
}

impl EngineBacking {
    /// `file` (opened for writing) moved by `engine`.
    pub fn new(engine: Arc<Engine>, file: Arc<StorageFile>) -> Self {
        let len = file.size();
        Self {
            engine,
            file,
            base: 0,
            len,
            routes: Mutex::default(),
        }
    }

    /// The `len` bytes of `file` from `offset` on (a partition of a
    /// namespace, say), 4 KiB aligned: the store never moves a byte
    /// outside them.
    pub fn region(
        engine: Arc<Engine>,
        file: Arc<StorageFile>,
        offset: u64,
        len: u64,
    ) -> Result<Self> {
        let fits = offset
            .checked_add(len)
            .is_some_and(|end| end <= file.size());
        if !fits || !offset.is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(crate::Error::InvalidArgument(format!(
                "a store region of {len} bytes at {offset} of {} ({} bytes; both multiples of 4 KiB)",
                file.path().display(),
                file.size()
            )));
        }
        Ok(Self {
            base: offset,
            len,
            ..Self::new(engine, file)
        })
    }

    /// Where `[offset, offset + len)` of the region lies in the file.
    fn at(&self, offset: u64, len: usize) -> Result<u64> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(self.base + offset),
            _ => Err(crate::Error::OutOfBounds {
                offset,
                len: len as u64,
                size: self.len,
            }),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The file.
    pub fn file(&self) -> &Arc<StorageFile> {
        &self.file
    }
}

impl Backing for EngineBacking {
    fn len(&self) -> u64 {
        self.len
    }

    /// Claims the store's range of the file ([`StorageFile::claim`]),
    /// waiting up to [`CLAIM_WAIT`] for another holder to let go: a
    /// process that has the store open, or one that died whose I/O is
    /// still in flight. `EBUSY` after that.
    fn claim(&self) -> Result<()> {
        let start = std::time::Instant::now();
        loop {
            match self.file.claim(self.base, self.len) {
                Err(e) if e.errno() == Some(rustix::io::Errno::AGAIN) => {
                    if start.elapsed() >= CLAIM_WAIT {
                        return Err(crate::Error::Io {
                            op: "opening the store (another open of it holds it: a process that has it open, or the I/O of one that died, still in flight)",
                            path: self.file.path().to_path_buf(),
                            offset: self.base,
                            len: self.len,
                            source: rustix::io::Errno::BUSY,
                            member: None,
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                r => return r,
            }
        }
    }

    fn unclaim(&self) {
        let _ = self.file.unclaim(self.base, self.len);
    }

    fn read(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        let at = self.at(offset, range.len())?;
        self.engine.read(&self.file, at, range).map(|_| ())
    }

    fn write(&self, offset: u64, range: MemRange<'_>) -> Result<()> {
        let at = self.at(offset, range.len())?;
        self.engine.write(&self.file, at, range).map(|_| ())
    }

    /// On the queues path, the namespace's own commands, on a thread of
    /// their own, each one's queue and identifier recorded as it is
    /// submitted; on the other paths, the engine's background transfer.
    fn read_async(
        &self,
        offset: u64,
        mem: Arc<dyn DeviceMemory>,
        mem_offset: usize,
        len: usize,
    ) -> Result<Started> {
        let at = self.at(offset, len)?;
        let queues = match self.file.queues_volume() {
            Some(ns)
                if self.engine.choose(&self.file, mem.as_ref())?.path == TransferPath::Queues =>
            {
                Some(ns.clone())
            }
            _ => None,
        };
        let Some(ns) = queues else {
            let ticket = self.engine.submit(Request {
                dir: crate::transfer::Direction::Read,
                file: self.file.clone(),
                file_offset: at,
                mem,
                mem_offset,
                len,
            });
            return Ok(Started {
                ticket,
                commands: None,
            });
        };
        let issued = Arc::new(Issued::default());
        let ticket = Ticket::new();
        let (t, i, engine) = (ticket.clone(), issued.clone(), self.engine.clone());
        std::thread::Builder::new()
            .name("p2pdma-prefetch".into())
            .spawn(move || {
                let start = std::time::Instant::now();
                let r = MemRange::new(mem.as_ref(), mem_offset, len)
                    .and_then(|range| ns.read_issuing(at, range, &i));
                if r.is_ok() {
                    let q = &engine.stats().queues;
                    q.record_ios(i.ids().len() as u64);
                    q.record_storage(start.elapsed());
                    q.record_transfer(len as u64, start.elapsed());
                }
                t.complete(r.map(|()| Report::new(len as u64, TransferPath::Queues)));
            })
            .map_err(|e| {
                crate::Error::sys("start a prefetch's thread")(
                    rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::AGAIN),
                )
            })?;
        Ok(Started {
            ticket,
            commands: Some(issued),
        })
    }

    fn flush(&self) -> Result<()> {
        self.file.sync()
    }

    /// Along the route the engine plans between the two memories (planned
    /// once per pair of kinds). A route of copies alone (by the CPU, or by
    /// the GPUs between GPU memories) moves a page by one [`copy()`],
    /// without the pipeline a long copy runs on.
    fn copy(
        &self,
        src: &dyn DeviceMemory,
        src_offset: usize,
        dst: &dyn DeviceMemory,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        let (sk, dk) = (src.kind(), dst.kind());
        let known = {
            let r = self.routes.lock().unwrap_or_else(|p| p.into_inner());
            r.iter()
                .find(|(s, d, _)| *s == sk && *d == dk)
                .map(|&(_, _, cpu)| cpu)
        };
        let routes = self.engine.routes();
        let plan = || {
            let from = End::Memory {
                mem: src,
                offset: src_offset,
            };
            let to = End::Memory {
                mem: dst,
                offset: dst_offset,
            };
            routes.plan(from, to)
        };
        let mut route = None;
        let cpu_only = match known {
            Some(c) => c,
            None => {
                let r = plan()?;
                let c = r
                    .hops()
                    .iter()
                    .all(|h| matches!(h.kind, HopKind::Copy | HopKind::GpuCopy));
                self.routes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((sk, dk, c));
                route = Some(r);
                c
            }
        };
        if cpu_only && len <= PAGE_COPY {
            return copy(src, src_offset, dst, dst_offset, len);
        }
        let route = match route {
            Some(r) => r,
            None => plan()?,
        };
        let opts = RouteOptions {
            chunk: Some(len),
            slots: Some(1),
            lanes: Some(1),
        };
        routes.copy(&route, len, &opts).map(|_| ())
    }
}
