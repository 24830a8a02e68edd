//! The strided cost model's constants for one storage device, memory and
//! path: read from the store, measured when unknown, and kept by the
//! engine.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use super::{
    pack::{measure_placement, shared},
    view::Strided,
};
use crate::{
    memory::{CudaMemory, DeviceMemory, HostMemory, MemoryKind, ModuleMemory},
    transfer::{
        calibrate::measure,
        core::Core,
        plan::TransferPath,
        storage::StorageFile,
        tuning::constants::{
            best_of, measure_copies, measure_pack, memory_name, Effort, Key, KnownConstants,
            Measurement, Partial, Resolved, Source, Store, MIB, SC_THREADS,
        },
        xfer::round_down,
    },
    Error, Result,
};

/// Memory of `mem`'s kind for measurements: host memory, or `len`
/// bytes of the same accelerator's memory from the module (less, down
/// to 1 MiB, when its BAR has not that much free).
pub(crate) fn scratch_like(
    core: &Core,
    mem: &dyn DeviceMemory,
    len: usize,
) -> Result<Box<dyn DeviceMemory>> {
    match mem.kind() {
        MemoryKind::Host | MemoryKind::Dmabuf => Ok(Box::new(HostMemory::new(len)?)),
        MemoryKind::Cuda { ordinal, .. } => Ok(Box::new(CudaMemory::alloc(ordinal, len)?)),
        MemoryKind::ModuleBar { index, .. } => {
            let module = match (&core.module, mem.dma().and_then(|d| d.module_allocation())) {
                (Some(m), _) => m.clone(),
                (None, Some((m, _))) => Arc::clone(m),
                (None, None) => {
                    return Err(Error::InvalidArgument(
                        "no module to allocate scratch accelerator memory from".into(),
                    ))
                }
            };
            let mut len = len;
            loop {
                match ModuleMemory::alloc(module.clone(), index, len as u64, 0) {
                    Ok(m) => return Ok(Box::new(m)),
                    Err(_) if len > MIB => len /= 2,
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

impl Strided<'_> {
    /// Measures the constants for strided transfers between `file` and
    /// memory of `mem`'s kind (for strided copies from host memory when
    /// `file` is `None`: the copy and pack constants only), with `effort`.
    /// `mem` itself is never written: the copies go into scratch memory of
    /// its kind. Each constant that cannot be measured is left out, with
    /// the reason.
    pub fn measure(
        &self,
        file: Option<&StorageFile>,
        mem: &dyn DeviceMemory,
        effort: Effort,
    ) -> Measurement {
        let core = self.core;
        let (storage_len, storage_rounds, calls, copy_len, _) = effort.sizes();
        let mut m = Measurement {
            values: Partial {
                pack_bps: Some(measure_pack(effort)),
                ..Partial::default()
            },
            failures: Vec::new(),
        };
        let scratch = match scratch_like(core, mem, copy_len) {
            Ok(s) => Some(s),
            Err(e) => {
                m.failures
                    .push(format!("no scratch memory of the same kind: {e}"));
                None
            }
        };
        if let Some(s) = &scratch {
            match measure_copies(s.as_ref(), effort) {
                Ok(bps) => {
                    m.values.copy_bps = Some(bps);
                    match measure_placement(s.as_ref(), bps, effort.sizes().4) {
                        Ok(q) => m.values.copy_call_s = Some(q),
                        Err(e) => m.failures.push(format!("placement: {e}")),
                    }
                }
                Err(e) => m.failures.push(format!("copies: {e}")),
            }
        }
        let Some(file) = file else {
            return m;
        };
        let bs = file.block as u64;
        let size = round_down(file.current_size().unwrap_or(file.size), bs);
        if size == 0 {
            m.failures
                .push("storage: the file holds less than one block".into());
            return m;
        }
        let len = (storage_len as u64).min(size) as usize;
        let storage = (|| {
            let (chunk, depth) =
                core.config
                    .geometry(len, file.block, core.device_geometry(file).0);
            let mut ctx = core.context(chunk, depth)?;
            let r = best_of(storage_rounds, || measure(&mut ctx, file, 0, len), false);
            core.give_back(ctx);
            r
        })();
        match storage {
            Ok(bps) => m.values.storage_bps = Some(bps),
            Err(e) => m.failures.push(format!("storage: {e}")),
        }
        let Some(scratch) = scratch else {
            return m;
        };
        let bs = file.block;
        match measure_calls(core, file, scratch.as_ref(), calls, size, bs) {
            Ok(k) => m.values.call_s = Some(k),
            Err(e) => m.failures.push(format!("calls: {e}")),
        }
        if size < MIB as u64 || scratch.len() < MIB {
            m.failures
                .push("1 MiB calls: the file or the scratch memory is under 1 MiB".into());
        } else {
            match measure_calls(core, file, scratch.as_ref(), calls / 4, size, MIB) {
                Ok(k1) => m.values.call_mib_s = Some(k1),
                Err(e) => m.failures.push(format!("1 MiB calls: {e}")),
            }
        }
        m
    }

    /// The constants for strided transfers between `file` (or host memory,
    /// when `None`) and `mem` on `path`, and where each came from: the
    /// configuration, else the cache, else a quick measurement (once per
    /// process and key, when the engine learns: a cache directory is set
    /// and the storage has a device key; stored), else the defaults.
    pub fn constants(
        &self,
        file: Option<&StorageFile>,
        mem: &dyn DeviceMemory,
        path: TransferPath,
    ) -> Resolved {
        let core = self.core;
        let config = Partial::from_config(&core.config.strided);
        let key = match file {
            Some(f) => f.key.clone().map(|k| Key {
                storage: Some((k, path)),
                memory: memory_name(&mem.kind()),
            }),
            None => Some(Key {
                storage: None,
                memory: memory_name(&mem.kind()),
            }),
        };
        let (Some(dir), Some(key)) = (&core.config.cache_dir, key) else {
            return Resolved::from_layers(&[(Source::Config, config)]);
        };
        let (known, source) = self.known_constants(dir, &key, file, mem);
        Resolved::from_layers(&[(Source::Config, config), (source, known)])
    }

    /// What is known for `key`: read from the store in `dir` the first
    /// time, else measured quickly (and stored) if nothing was; a
    /// measurement another thread is making leaves nothing known.
    fn known_constants(
        &self,
        dir: &Path,
        key: &Key,
        file: Option<&StorageFile>,
        mem: &dyn DeviceMemory,
    ) -> (Partial, Source) {
        let core = self.core;
        {
            let mut known = core.constants.lock().unwrap_or_else(|p| p.into_inner());
            let k = known.entry(key.clone()).or_insert_with(|| {
                let stored = Store::in_dir(dir).lookup(key);
                if stored.is_empty() {
                    KnownConstants::Unknown
                } else {
                    KnownConstants::Have(stored, Source::Stored)
                }
            });
            match k {
                KnownConstants::Have(p, s) => return (*p, *s),
                KnownConstants::Measuring => return (Partial::default(), Source::Default),
                KnownConstants::Unknown => *k = KnownConstants::Measuring,
            }
        }
        let m = self.measure(file, mem, Effort::Quick);
        if !m.values.is_empty() {
            // A cache that cannot be written only means measuring again
            // in the next process.
            let _ = Store::in_dir(dir).store(key, &m.values, "quick, at first strided use");
        }
        remember_measured(core, key, m.values);
        (m.values, Source::Measured)
    }

    /// The key the constants for `file` (or host memory, when `None`) and
    /// `mem` are kept under, on the path transfers between them take.
    /// Storage with no device number has none: an error.
    pub fn key(&self, file: Option<&StorageFile>, mem: &dyn DeviceMemory) -> Result<Key> {
        let memory = memory_name(&mem.kind());
        let Some(f) = file else {
            return Ok(Key {
                storage: None,
                memory,
            });
        };
        let dev = f.key.clone().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{} is on no block device with a device number: there is nothing to key its constants by",
            f.path().display()
        ))
    })?;
        Ok(Key {
            storage: Some((dev, self.core.handle(f, mem)?.path())),
            memory,
        })
    }

    /// Measures the constants for `file` (or host memory) and `mem`
    /// thoroughly, stores them in the cache (when the engine has a cache
    /// directory) replacing what was there, and makes this engine use them.
    /// Returns the key, what was measured and the store's file (if
    /// written).
    pub fn calibrate(
        &self,
        file: Option<&StorageFile>,
        mem: &dyn DeviceMemory,
    ) -> Result<(Key, Measurement, Option<PathBuf>)> {
        let core = self.core;
        let key = self.key(file, mem)?;
        let m = self.measure(file, mem, Effort::Full);
        let stored = match &core.config.cache_dir {
            Some(dir) if !m.values.is_empty() => {
                let store = Store::in_dir(dir);
                store
                    .store(&key, &m.values, "p2pdma-ctl calibrate")
                    .map_err(|e| Error::Io {
                        op: "write the strided constants",
                        path: store.path().to_path_buf(),
                        offset: 0,
                        len: 0,
                        source: rustix::io::Errno::from_io_error(&e)
                            .unwrap_or(rustix::io::Errno::IO),
                        member: None,
                    })?;
                Some(store.path().to_path_buf())
            }
            _ => None,
        };
        remember_measured(core, &key, m.values);
        Ok((key, m, stored))
    }
}

/// k (and k1): `n` reads of `len` bytes each (one block, or 1 MiB), at
/// block-aligned offsets spread over the first `size` bytes of `file`,
/// into `mem` on the pair's path, issued as SC issues its reads (on its
/// threads, each a share in order); the time a thread spends per read.
pub(crate) fn measure_calls(
    core: &Core,
    file: &StorageFile,
    mem: &dyn DeviceMemory,
    n: u64,
    size: u64,
    len: usize,
) -> Result<f64> {
    let handle = core.handle(file, mem)?;
    let bs = file.block as u64;
    let blocks = (size - len as u64) / bs + 1;
    let slots = (mem.len() / len).max(1) as u64;
    // Offsets a prime number of blocks apart, so that consecutive reads
    // are neither sequential nor in one place.
    let at = |i: u64| (i * 1031 % blocks) * bs;
    let read = |i: u64| handle.read(at(i), ((i % slots) as usize) * len, len);
    // One round untimed: each thread's first read sets up its ring and
    // bounce slots, which later reads find in the engine's pool.
    shared(SC_THREADS as u64, &read)?;
    let t = Instant::now();
    shared(n, &read)?;
    let per_thread = n.div_ceil(SC_THREADS.min(n as usize) as u64);
    Ok((t.elapsed().as_secs_f64() / per_thread as f64).max(1e-7))
}

/// Keeps `values`, measured for `key`, for the engine's life.
fn remember_measured(core: &Core, key: &Key, values: Partial) {
    core.constants
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.clone(), KnownConstants::Have(values, Source::Measured));
}
