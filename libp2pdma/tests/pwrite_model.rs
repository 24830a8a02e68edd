//! Random sequences of transfers against a reference model: every write must
//! behave like `pwrite(2)` and every read like `pread(2)` on the same file,
//! whatever the path, the alignment, the handle used or what other handles
//! and processes did to the file in between.
//!
//! The model is a shadow file changed with plain `pwrite`/`set_len`. Each
//! case opens several handles on one file, so handles opened before the file
//! grew or shrank are used after; it mixes aligned and unaligned writes and
//! reads, appends and truncates through another descriptor (standing in for
//! another process), and bursts of concurrent writes to disjoint ranges that
//! share edge blocks, from threads and from the asynchronous batch API.
//! After every step the whole file is compared with the shadow.
//!
//! Where it runs (environment):
//! - `P2PDMA_MODEL_DIR`: the directory for the files (default: the target's
//!   temporary directory). The VM rig points it at ext4 on NVMe.
//! - `P2PDMA_MODEL_MEM=module`: use the p2pdma module's BAR memory
//!   (accelerator 0) instead of the host-memory device.
//! - `P2PDMA_MODEL_PATHS`: the paths to test, comma separated (default
//!   `bounce,p2p`, the ones every host has).
//! - `PROPTEST_CASES`: cases per path and page-cache use (default 48).
//!
//! Each path runs with reads taking what the page cache holds
//! (`PageCache::Auto`) and without (`PageCache::Direct`); steps warm and
//! drop parts of the page cache, and the file is compared through
//! `O_DIRECT`, which leaves the page cache as the steps left it.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::FileExt,
    path::Path,
    sync::Arc,
};

mod common;

use common::{model_dir, pattern, runner};
use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{Config, Direction, Engine, PageCache, PathPref, Request, StorageFile},
    Error, MemRange, Module,
};
use proptest::prelude::*;

const BLOCK: u64 = 4096;
/// Files stay below this, so cases are quick and edges are frequent.
const SPAN: u64 = 20 * BLOCK;
/// Largest single transfer.
const MAX_LEN: usize = 7 * BLOCK as usize;
const HANDLES: usize = 3;
/// The device memory: a region per concurrent writer, plus room.
const MEM: usize = 8 * MAX_LEN;

#[derive(Clone, Debug)]
enum Op {
    /// Write `len` bytes of pattern `seed` at `off` through handle `h`, from
    /// memory offset `moff`.
    Write {
        h: usize,
        off: u64,
        len: usize,
        moff: usize,
        seed: u64,
    },
    /// Read `len` bytes at `off` through handle `h` into memory at `moff`.
    Read {
        h: usize,
        off: u64,
        len: usize,
        moff: usize,
    },
    /// Another descriptor appends `len` bytes.
    Append { len: usize, seed: u64 },
    /// Another descriptor truncates (or extends) the file to `size`.
    Truncate { size: u64 },
    /// Another descriptor reads `len` bytes at `off` through the page
    /// cache, which then holds them.
    Warm { off: u64, len: usize },
    /// The page cache lets go of what it holds of `len` bytes at `off`
    /// (`POSIX_FADV_DONTNEED`).
    Forget { off: u64, len: usize },
    /// Disjoint, adjacent writes starting at `off`, one per piece length,
    /// all at once: from threads (`batch` false) or one async batch.
    Concurrent {
        off: u64,
        pieces: Vec<usize>,
        seed: u64,
        batch: bool,
    },
}

/// Offsets near block boundaries more often than not.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..SPAN / BLOCK).prop_map(|b| b * BLOCK),
        (1..SPAN / BLOCK, 1..8u64).prop_map(|(b, d)| b * BLOCK - d),
        (0..SPAN / BLOCK, 1..8u64).prop_map(|(b, d)| b * BLOCK + d),
        0..SPAN,
    ]
}

fn length() -> impl Strategy<Value = usize> {
    prop_oneof![
        (1..=MAX_LEN / BLOCK as usize).prop_map(|b| b * BLOCK as usize),
        1..64usize,
        1..=MAX_LEN,
    ]
}

/// Memory offsets: often congruent to the file offset modulo the block
/// (what direct I/O needs), sometimes not (the path must cope).
fn mem_offset(off: u64) -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => (0..4usize).prop_map(move |b| b * BLOCK as usize + (off % BLOCK) as usize),
        1 => 0..BLOCK as usize,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..HANDLES, offset(), length(), any::<u64>())
            .prop_flat_map(|(h, off, len, seed)| (mem_offset(off), Just((h, off, len, seed))))
            .prop_map(|(moff, (h, off, len, seed))| Op::Write { h, off, len, moff, seed }),
        4 => (0..HANDLES, offset(), length())
            .prop_flat_map(|(h, off, len)| (mem_offset(off), Just((h, off, len))))
            .prop_map(|(moff, (h, off, len))| Op::Read { h, off, len, moff }),
        1 => (1..3 * BLOCK as usize, any::<u64>()).prop_map(|(len, seed)| Op::Append { len, seed }),
        1 => offset().prop_map(|size| Op::Truncate { size }),
        2 => (offset(), length()).prop_map(|(off, len)| Op::Warm { off, len }),
        2 => (offset(), length()).prop_map(|(off, len)| Op::Forget { off, len }),
        2 => (
            offset(),
            prop::collection::vec(prop_oneof![1..200usize, 1..2 * BLOCK as usize], 2..6),
            any::<u64>(),
            any::<bool>(),
        )
            .prop_map(|(off, pieces, seed, batch)| Op::Concurrent { off, pieces, seed, batch }),
    ]
}

struct Rig {
    dir: tempfile::TempDir,
    module: Option<Arc<Module>>,
}

impl Rig {
    fn new() -> Self {
        let dir = model_dir("pwrite-model");
        let module = match std::env::var("P2PDMA_MODEL_MEM").as_deref() {
            Ok("module") => Some(Arc::new(Module::open().expect("open the p2pdma module"))),
            Ok("host") | Err(_) => None,
            Ok(other) => panic!("P2PDMA_MODEL_MEM={other}: want module or host"),
        };
        Self { dir, module }
    }

    fn memory(&self) -> Arc<dyn DeviceMemory> {
        match &self.module {
            Some(m) => Arc::new(ModuleMemory::alloc(m.clone(), 0, MEM as u64, 0).unwrap()),
            None => Arc::new(HostMemory::new(MEM).unwrap()),
        }
    }
}

fn paths() -> Vec<PathPref> {
    std::env::var("P2PDMA_MODEL_PATHS")
        .unwrap_or_else(|_| "bounce,p2p".into())
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect()
}

fn file_bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// The file's bytes read with `O_DIRECT`, which leaves the page cache as
/// the steps left it.
fn file_bytes_direct(p: &Path) -> Vec<u8> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(p)
        .unwrap();
    let size = f.metadata().unwrap().len() as usize;
    let cap = size.div_ceil(BLOCK as usize) * BLOCK as usize;
    let mut v = vec![0u8; cap + BLOCK as usize];
    let at = v.as_ptr().align_offset(BLOCK as usize);
    let buf = &mut v[at..at + cap];
    let mut done = 0;
    while done < cap {
        match f.read_at(&mut buf[done..], done as u64).unwrap() {
            0 => break,
            n => done += n,
        }
    }
    buf[..size].to_vec()
}

/// Runs `ops` on a new file through `engine`, checking every step against
/// the shadow file.
fn run_case(
    rig: &Rig,
    engine: &Arc<Engine>,
    mem: &Arc<dyn DeviceMemory>,
    case: u64,
    initial: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let real = rig.dir.path().join(format!("real-{case}.bin"));
    let shadow_path = rig.dir.path().join(format!("shadow-{case}.bin"));
    let start = pattern(case, 0, initial);
    std::fs::write(&real, &start).unwrap();
    std::fs::write(&shadow_path, &start).unwrap();
    let shadow = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&shadow_path)
        .unwrap();
    let other = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&real)
        .unwrap();
    let handles: Vec<Arc<StorageFile>> = (0..HANDLES)
        .map(|_| Arc::new(StorageFile::open_rw(&real).unwrap()))
        .collect();
    let result = (|| {
        for (i, op) in ops.iter().enumerate() {
            step(engine, mem, &handles, &other, &shadow, op)
                .map_err(|e| TestCaseError::fail(format!("step {i} {op:?}: {e}")))?;
            let (got, want) = (file_bytes_direct(&real), file_bytes(&shadow_path));
            if got != want {
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                return Err(TestCaseError::fail(format!(
                    "after step {i} {op:?}: file is {} bytes, model {}; first differing byte {first:?}",
                    got.len(),
                    want.len()
                )));
            }
        }
        Ok(())
    })();
    drop(handles);
    let _ = std::fs::remove_file(&real);
    let _ = std::fs::remove_file(&shadow_path);
    result
}

fn step(
    engine: &Arc<Engine>,
    mem: &Arc<dyn DeviceMemory>,
    handles: &[Arc<StorageFile>],
    other: &File,
    shadow: &File,
    op: &Op,
) -> Result<(), String> {
    match *op {
        Op::Write {
            h,
            off,
            len,
            moff,
            seed,
        } => {
            let data = pattern(seed, off, len);
            mem.write_at(moff, &data).map_err(|e| e.to_string())?;
            let r = engine
                .write(
                    &handles[h],
                    off,
                    MemRange::new(mem.as_ref(), moff, len).unwrap(),
                )
                .map_err(|e| format!("write failed: {e}"))?;
            if r.bytes != len as u64 {
                return Err(format!("write reported {} bytes", r.bytes));
            }
            shadow.write_all_at(&data, off).unwrap();
        }
        Op::Read { h, off, len, moff } => {
            mem.write_at(moff, &vec![0xA5; len]).unwrap();
            let size = shadow.metadata().unwrap().len();
            let r = engine.read(
                &handles[h],
                off,
                MemRange::new(mem.as_ref(), moff, len).unwrap(),
            );
            if off + len as u64 > size {
                return match r {
                    Err(Error::EndOfFile { size: s, .. }) if s == size => Ok(()),
                    other => Err(format!(
                        "read past the end ({size} bytes) gave {other:?}, not EndOfFile"
                    )),
                };
            }
            r.map_err(|e| format!("read failed: {e}"))?;
            let mut want = vec![0u8; len];
            shadow.read_exact_at(&mut want, off).unwrap();
            let mut got = vec![0u8; len];
            mem.read_at(moff, &mut got).unwrap();
            if got != want {
                let first = got.iter().zip(&want).position(|(a, b)| a != b);
                return Err(format!("read bytes differ from the model at {first:?}"));
            }
        }
        Op::Append { len, seed } => {
            let end = other.metadata().unwrap().len();
            let data = pattern(seed, end, len);
            other.write_all_at(&data, end).unwrap();
            shadow.write_all_at(&data, end).unwrap();
        }
        Op::Truncate { size } => {
            other.set_len(size).unwrap();
            shadow.set_len(size).unwrap();
        }
        Op::Warm { off, len } => {
            let mut buf = vec![0u8; len];
            let _ = other.read_at(&mut buf, off).unwrap();
        }
        Op::Forget { off, len } => {
            // Dirty pages stay: written back first.
            other.sync_data().unwrap();
            rustix::fs::fadvise(
                other,
                off,
                std::num::NonZeroU64::new(len as u64),
                rustix::fs::Advice::DontNeed,
            )
            .unwrap();
        }
        Op::Concurrent {
            off,
            ref pieces,
            seed,
            batch,
        } => {
            // Piece i goes from its own memory region, through its own handle.
            let mut at = off;
            let mut reqs = Vec::new();
            for (i, &len) in pieces.iter().enumerate() {
                let moff = i * MAX_LEN + (at % BLOCK) as usize;
                let data = pattern(seed, at, len);
                mem.write_at(moff, &data).unwrap();
                shadow.write_all_at(&data, at).unwrap();
                reqs.push(Request {
                    dir: Direction::Write,
                    file: handles[i % handles.len()].clone(),
                    file_offset: at,
                    mem: mem.clone(),
                    mem_offset: moff,
                    len,
                });
                at += len as u64;
            }
            let results: Vec<_> = if batch {
                let tickets = engine.submit_batch(reqs);
                Engine::wait_all(&tickets)
            } else {
                std::thread::scope(|s| {
                    let threads: Vec<_> = reqs
                        .iter()
                        .map(|r| {
                            s.spawn(move || {
                                engine.write(
                                    &r.file,
                                    r.file_offset,
                                    MemRange::new(r.mem.as_ref(), r.mem_offset, r.len).unwrap(),
                                )
                            })
                        })
                        .collect();
                    threads.into_iter().map(|t| t.join().unwrap()).collect()
                })
            };
            for r in results {
                r.map_err(|e| format!("concurrent write failed: {e}"))?;
            }
        }
    }
    Ok(())
}

fn check_path(pref: PathPref, page_cache: PageCache) {
    let rig = Rig::new();
    let mem = rig.memory();
    let engine = Arc::new(Engine::new(
        Config {
            path: pref,
            page_cache,
            // Small chunks: multi-chunk transfers at these sizes.
            chunk: Some(2 * BLOCK as usize),
            depth: Some(3),
            ..Config::default()
        },
        rig.module.clone(),
    ));
    let mut runner = runner(48);
    let case = std::sync::atomic::AtomicU64::new(0);
    let strategy = (0..3 * BLOCK as usize, prop::collection::vec(op(), 1..20));
    let result = runner.run(&strategy, |(initial, ops)| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        run_case(&rig, &engine, &mem, case, initial, &ops)
    });
    let _ = std::fs::remove_dir_all(&rig.dir);
    if let Err(e) = result {
        panic!("{pref} path, page cache {page_cache}: {e}");
    }
    eprintln!(
        "{pref} path, page cache {page_cache}: {} random sequences matched the pwrite/pread model",
        runner.config().cases
    );
}

#[test]
fn transfers_behave_like_pread_and_pwrite_on_every_path() {
    for pref in paths() {
        for page_cache in [PageCache::Auto, PageCache::Direct] {
            check_path(pref, page_cache);
        }
    }
}
