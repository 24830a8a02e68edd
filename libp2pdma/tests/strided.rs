//! Strided reads against a reference computed by plain indexing: random
//! shapes (one to three dimensions, runs of 1 byte to 64 KiB, unaligned
//! offsets, gaps from none to 1 MiB), both layouts, every mode and AUTO, on the
//! bounce and P2P paths, into poisoned memory. Every byte of the memory is
//! compared: the runs' bytes where the layout puts them, the file's bytes in
//! the gaps for RC (which reads them), and the poison everywhere else.
//! Strided writes the same way (SC only): the whole file compared after
//! each with the runs replaced by plain indexing. Strided copies between a
//! host buffer and memory, both ways, every byte of the side written
//! compared. Batches of strided reads and writes submitted at once, and
//! one awaited as a future, likewise.
//!
//! Environment: `P2PDMA_MODEL_DIR` (where the file goes; default the
//! target's temporary directory, which must allow `O_DIRECT`, so not tmpfs)
//! and `PROPTEST_CASES` (default 48 for reads, 32 for writes).

use std::{os::unix::fs::FileExt, sync::Arc};

mod common;

use common::{mem_bytes, model_dir, pattern, runner};
use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    transfer::{
        Config, Direction, Engine, Layout, PathPref, Shape, StorageFile, StridedMode,
        StridedRequest,
    },
    Error, MemRange,
};
use proptest::prelude::*;

/// Room for the largest shape (about 8.5 MiB) at the largest base.
const FILE_LEN: usize = 12 << 20;
const SEED: u64 = 0x5712_1DED;
const POISON: u8 = 0xA5;

#[derive(Clone, Debug)]
struct Case {
    base: u64,
    run: u64,
    /// (count, gap after the inner extent), innermost first.
    dims: Vec<(u64, u64)>,
    layout: Layout,
    mode: StridedMode,
    mem_offset: usize,
    engine: usize,
}

fn case() -> impl Strategy<Value = Case> {
    let run = prop_oneof![1..64u64, 64..4096u64, 4096..=65536u64];
    fn gap() -> BoxedStrategy<u64> {
        prop_oneof![Just(0u64), 1..512u64, 512..16384u64].boxed()
    }
    // The outermost dimension's gaps may be wide, past the default threshold
    // where TaT splits its read (a call's worth of storage bytes, 200 KiB).
    fn wide() -> BoxedStrategy<u64> {
        prop_oneof![3 => gap(), 1 => (256u64 << 10)..(1u64 << 20)].boxed()
    }
    let dims = (1..=3usize).prop_flat_map(move |n| {
        let max = [8u64, 4, 2];
        (0..n)
            .map(|i| (1..=max[i], if i + 1 == n { wide() } else { gap() }))
            .collect::<Vec<_>>()
    });
    (
        0..3 * 4096u64,
        run,
        dims,
        prop_oneof![Just(Layout::Packed), Just(Layout::Strided)],
        prop_oneof![
            Just(StridedMode::Auto),
            Just(StridedMode::Rc),
            Just(StridedMode::Sc),
            Just(StridedMode::Tat)
        ],
        0..5000usize,
        0..3usize,
    )
        .prop_map(|(base, run, dims, layout, mode, mem_offset, engine)| Case {
            base,
            run,
            dims,
            layout,
            mode,
            mem_offset,
            engine,
        })
}

/// The shape's `(stride, count)` list: each stride the inner extent plus
/// the case's gap.
fn strides(c: &Case) -> Vec<(u64, u64)> {
    let mut extent = c.run;
    c.dims
        .iter()
        .map(|&(count, gap)| {
            let stride = extent + gap;
            extent += (count - 1) * stride;
            (stride, count)
        })
        .collect()
}

/// The runs' file offsets, by nested loops, outermost first.
fn reference_runs(c: &Case) -> Vec<u64> {
    let s = strides(c);
    let get = |i: usize| s.get(i).copied().unwrap_or((0, 1));
    let (d0, d1, d2) = (get(0), get(1), get(2));
    let mut v = Vec::new();
    for k in 0..d2.1 {
        for j in 0..d1.1 {
            for i in 0..d0.1 {
                v.push(c.base + k * d2.0 + j * d1.0 + i * d0.0);
            }
        }
    }
    v
}

fn run_case(
    engines: &[Engine],
    file: &StorageFile,
    data: &[u8],
    c: &Case,
) -> Result<(), TestCaseError> {
    let shape = Shape::new(c.base, c.run, &strides(c))
        .map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
    let runs = reference_runs(c);
    let run = c.run as usize;
    let (b0, b1) = (runs[0], runs[runs.len() - 1] + c.run);
    prop_assert_eq!(shape.bounds(), (b0, b1));
    prop_assert_eq!(shape.runs(), runs.len() as u64);
    let iter: Vec<u64> = shape.iter().map(|r| r.file_offset).collect();
    prop_assert_eq!(&iter, &runs);
    let room = match c.layout {
        Layout::Packed => runs.len() * run,
        Layout::Strided => (b1 - b0) as usize,
    };
    let size = c.mem_offset + room + 4096;
    let mem = HostMemory::new(size).unwrap();
    mem.write_at(0, &vec![POISON; size]).unwrap();
    let mut want = vec![POISON; size];

    let got = engines[c.engine].strided().read(
        file,
        &shape,
        MemRange::from_offset(&mem, c.mem_offset).unwrap(),
        c.layout,
        c.mode,
    );
    if c.mode == StridedMode::Rc && c.layout == Layout::Packed {
        prop_assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
        prop_assert!(mem_bytes(&mem, 0, size) == want, "RC refused but wrote");
        return Ok(());
    }
    let rep = got.map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
    prop_assert!(c.mode == StridedMode::Auto || rep.mode == c.mode);
    prop_assert_ne!(rep.mode, StridedMode::Auto);
    prop_assert_eq!(rep.bytes, (runs.len() * run) as u64);
    if rep.mode == StridedMode::Rc {
        prop_assert_eq!(c.layout, Layout::Strided);
        let (b0, b1) = (b0 as usize, b1 as usize);
        want[c.mem_offset..c.mem_offset + b1 - b0].copy_from_slice(&data[b0..b1]);
    }
    for (k, &f) in runs.iter().enumerate() {
        let at = c.mem_offset
            + match c.layout {
                Layout::Packed => k * run,
                Layout::Strided => (f - b0) as usize,
            };
        let f = f as usize;
        want[at..at + run].copy_from_slice(&data[f..f + run]);
    }
    let have = mem_bytes(&mem, 0, size);
    if let Some(i) = (0..size).find(|&i| have[i] != want[i]) {
        return Err(TestCaseError::fail(format!(
            "{c:?} ({}: {}): first wrong byte at memory offset {i}: {:#x}, want {:#x}",
            rep.mode, rep.reason, have[i], want[i]
        )));
    }
    Ok(())
}

#[test]
fn strided_reads_match_plain_indexing() {
    let dir = model_dir("strided");
    let path = dir.path().join("table");
    let data = pattern(SEED, 0, FILE_LEN);
    std::fs::File::create(&path)
        .unwrap()
        .write_all_at(&data, 0)
        .unwrap();
    let file = StorageFile::open(&path).unwrap();
    let engine = |path, chunk, copy_threads| {
        Engine::new(
            Config {
                path,
                chunk,
                depth: Some(3),
                copy_threads,
                ..Config::default()
            },
            None,
        )
    };
    let engines = [
        // Small chunks: TaT's bounding range spans many of them.
        engine(PathPref::Bounce, Some(64 << 10), None),
        // Large chunks copied by four threads at once.
        engine(PathPref::Bounce, Some(1 << 20), Some(4)),
        // O_DIRECT into the memory's mapping; unaligned runs retried.
        engine(PathPref::P2p, Some(64 << 10), None),
    ];
    let mut runner = runner(48);
    let result = runner.run(&case(), |c| run_case(&engines, &file, &data, &c));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Writes `c`'s runs from memory filled with another pattern into the file
/// (which holds `data`), compares the whole file with `data` with the runs
/// replaced by plain indexing, and puts `data` back.
fn write_case(
    engines: &[Engine],
    file: &StorageFile,
    raw: &std::fs::File,
    data: &[u8],
    c: &Case,
) -> Result<(), TestCaseError> {
    let shape = Shape::new(c.base, c.run, &strides(c))
        .map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
    let runs = reference_runs(c);
    let run = c.run as usize;
    let (b0, b1) = (runs[0], runs[runs.len() - 1] + c.run);
    let room = match c.layout {
        Layout::Packed => runs.len() * run,
        Layout::Strided => (b1 - b0) as usize,
    };
    let size = c.mem_offset + room + 4096;
    let mem = HostMemory::new(size).unwrap();
    let src = pattern(!SEED, 0, size);
    mem.write_at(0, &src).unwrap();
    let got = engines[c.engine].strided().write(
        file,
        &shape,
        MemRange::from_offset(&mem, c.mem_offset).unwrap(),
        c.layout,
        c.mode,
    );
    let mut want = data.to_vec();
    if matches!(c.mode, StridedMode::Rc | StridedMode::Tat) {
        prop_assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
    } else {
        let rep = got.map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
        prop_assert_eq!(rep.mode, StridedMode::Sc);
        prop_assert_eq!(rep.calls, runs.len() as u64);
        for (k, &f) in runs.iter().enumerate() {
            let at = c.mem_offset
                + match c.layout {
                    Layout::Packed => k * run,
                    Layout::Strided => (f - b0) as usize,
                };
            let f = f as usize;
            want[f..f + run].copy_from_slice(&src[at..at + run]);
        }
    }
    let mut have = vec![0u8; data.len()];
    raw.read_exact_at(&mut have, 0).unwrap();
    let wrong = (0..have.len()).find(|&i| have[i] != want[i]);
    raw.write_all_at(&data[b0 as usize..b1 as usize], b0)
        .unwrap();
    if let Some(i) = wrong {
        return Err(TestCaseError::fail(format!(
            "{c:?}: first wrong byte at file offset {i}: {:#x}, want {:#x}",
            have[i], want[i]
        )));
    }
    Ok(())
}

#[test]
fn strided_writes_match_plain_indexing() {
    let dir = model_dir("strided-w");
    let path = dir.path().join("table");
    let data = pattern(SEED, 0, FILE_LEN);
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    raw.write_all_at(&data, 0).unwrap();
    let file = StorageFile::open_rw(&path).unwrap();
    let engine = |path| {
        Engine::new(
            Config {
                path,
                chunk: Some(64 << 10),
                depth: Some(3),
                ..Config::default()
            },
            None,
        )
    };
    let engines = [
        engine(PathPref::Bounce),
        engine(PathPref::Bounce),
        engine(PathPref::P2p),
    ];
    let mut runner = runner(32);
    let result = runner.run(&case(), |c| write_case(&engines, &file, &raw, &data, &c));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn strided_reads_check_bounds_before_any_io() {
    let dir = common::scratch_dir("strided-bounds");
    let path = dir.path().join("f");
    std::fs::write(&path, pattern(SEED, 0, 1 << 20)).unwrap();
    let file = StorageFile::open(&path).unwrap();
    let engine = Engine::new(Config::default(), None);
    // 16 runs of 100 bytes, 4096 apart: 1600 packed, 61540 strided.
    let shape = Shape::new(10, 100, &[(4096, 16)]).unwrap();
    let mem = HostMemory::new(8192).unwrap();
    mem.write_at(0, &[POISON; 8192]).unwrap();
    for mode in [
        StridedMode::Auto,
        StridedMode::Sc,
        StridedMode::Tat,
        StridedMode::Rc,
    ] {
        let r = engine
            .strided()
            .read(&file, &shape, MemRange::whole(&mem), Layout::Strided, mode);
        assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{mode}: {r:?}");
        let r = engine.strided().read(
            &file,
            &shape,
            MemRange::from_offset(&mem, 6600).unwrap(),
            Layout::Packed,
            mode,
        );
        assert!(
            matches!(
                r,
                Err(Error::OutOfBounds { .. } | Error::InvalidArgument(_))
            ),
            "{mode}: {r:?}"
        );
    }
    // A start past the memory's end is refused as the range is made.
    let r = MemRange::from_offset(&mem, usize::MAX);
    assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{r:?}");
    assert_eq!(mem_bytes(&mem, 0, 8192), vec![POISON; 8192]);
    // Past the end of the file: an error, never partial success.
    let past = Shape::new((1 << 20) - 150, 100, &[(100, 2)]).unwrap();
    let big = HostMemory::new(1 << 16).unwrap();
    for mode in [StridedMode::Sc, StridedMode::Tat, StridedMode::Rc] {
        let r = engine
            .strided()
            .read(&file, &past, MemRange::whole(&big), Layout::Strided, mode);
        assert!(matches!(r, Err(Error::EndOfFile { .. })), "{mode}: {r:?}");
    }
    // The packed layout fits; the runs land back to back.
    let r = engine
        .strided()
        .read(
            &file,
            &shape,
            MemRange::from_offset(&mem, 6592).unwrap(),
            Layout::Packed,
            StridedMode::Auto,
        )
        .unwrap();
    assert_eq!((r.bytes, r.mode == StridedMode::Rc), (1600, false));
    let data = pattern(SEED, 0, 1 << 20);
    let got = mem_bytes(&mem, 6592, 1600);
    for k in 0..16 {
        let f = 10 + k * 4096;
        assert_eq!(got[k * 100..k * 100 + 100], data[f..f + 100], "run {k}");
    }
    // Runs 300 KiB apart: TaT reads each on its own, not the gaps.
    let far = Shape::new(10, 100, &[(300 << 10, 3)]).unwrap();
    let r = engine
        .strided()
        .read(
            &file,
            &far,
            MemRange::whole(&mem),
            Layout::Packed,
            StridedMode::Tat,
        )
        .unwrap();
    assert_eq!((r.calls, r.storage_bytes), (3, 3 * 4096), "{r:?}");
    let got = mem_bytes(&mem, 0, 300);
    for k in 0..3 {
        let f = 10 + k * (300 << 10);
        assert_eq!(got[k * 100..k * 100 + 100], data[f..f + 100], "run {k}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Copies `c`'s runs between a host buffer and memory, one way or the
/// other, and compares every byte of the side written with plain
/// indexing: into the memory, the poison but for the runs (and RC's gaps,
/// the buffer's bytes there); out of it, the buffer's poison but for the
/// runs, whatever the mode.
fn host_copy_case(engine: &Engine, c: &Case, to_memory: bool) -> Result<(), TestCaseError> {
    let shape = Shape::new(c.base, c.run, &strides(c))
        .map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
    let runs = reference_runs(c);
    let run = c.run as usize;
    let (b0, b1) = (runs[0] as usize, runs[runs.len() - 1] as usize + run);
    let room = match c.layout {
        Layout::Packed => runs.len() * run,
        Layout::Strided => b1 - b0,
    };
    let at = |k: usize, f: usize| {
        c.mem_offset
            + match c.layout {
                Layout::Packed => k * run,
                Layout::Strided => f - b0,
            }
    };
    let size = c.mem_offset + room + 4096;
    let mem = HostMemory::new(size).unwrap();
    let refused = matches!(
        (c.mode, c.layout),
        (StridedMode::Rc, Layout::Packed) | (StridedMode::Tat, Layout::Strided)
    );
    let (got, have, want) = if to_memory {
        let src = pattern(SEED, 0, b1 + 77);
        mem.write_at(0, &vec![POISON; size]).unwrap();
        let got = engine.strided().copy_to_memory(
            &src,
            &shape,
            MemRange::from_offset(&mem, c.mem_offset).unwrap(),
            c.layout,
            c.mode,
        );
        let mut want = vec![POISON; size];
        if matches!(&got, Ok(r) if r.mode == StridedMode::Rc) {
            want[c.mem_offset..c.mem_offset + b1 - b0].copy_from_slice(&src[b0..b1]);
        }
        if !refused {
            for (k, &f) in runs.iter().enumerate() {
                let (f, m) = (f as usize, at(k, f as usize));
                want[m..m + run].copy_from_slice(&src[f..f + run]);
            }
        }
        (got, mem_bytes(&mem, 0, size), want)
    } else {
        let contents = pattern(!SEED, 0, size);
        mem.write_at(0, &contents).unwrap();
        let mut dst = vec![POISON; b1 + 77];
        let got = engine.strided().copy_from_memory(
            &mut dst,
            &shape,
            MemRange::from_offset(&mem, c.mem_offset).unwrap(),
            c.layout,
            c.mode,
        );
        let mut want = vec![POISON; b1 + 77];
        if !refused {
            for (k, &f) in runs.iter().enumerate() {
                let (f, m) = (f as usize, at(k, f as usize));
                want[f..f + run].copy_from_slice(&contents[m..m + run]);
            }
        }
        (got, dst, want)
    };
    if refused {
        prop_assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
    } else {
        let rep = got.map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
        prop_assert!(c.mode == StridedMode::Auto || rep.mode == c.mode);
        prop_assert_eq!(rep.bytes, (runs.len() * run) as u64);
        prop_assert_eq!(rep.storage_bytes, 0);
    }
    if let Some(i) = (0..want.len()).find(|&i| have[i] != want[i]) {
        return Err(TestCaseError::fail(format!(
            "{c:?}, {}: first wrong byte at offset {i}: {:#x}, want {:#x}",
            if to_memory {
                "into memory"
            } else {
                "out of memory"
            },
            have[i],
            want[i]
        )));
    }
    Ok(())
}

#[test]
fn host_copies_match_plain_indexing() {
    let engine = Engine::new(Config::default(), None);
    let mut runner = runner(96);
    let result = runner.run(&(case(), any::<bool>()), |(c, to_memory)| {
        host_copy_case(&engine, &c, to_memory)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn host_copies_check_bounds_before_copying() {
    let engine = Engine::new(Config::default(), None);
    // 16 runs of 100 bytes, 4096 apart: 1600 packed, 61540 strided.
    let shape = Shape::new(10, 100, &[(4096, 16)]).unwrap();
    let mem = HostMemory::new(8192).unwrap();
    mem.write_at(0, &[POISON; 8192]).unwrap();
    let src = pattern(SEED, 0, 1 << 16);
    for mode in [StridedMode::Auto, StridedMode::Sc, StridedMode::Tat] {
        // A buffer shorter than the bounding range, memory without room.
        let r = engine.strided().copy_to_memory(
            &src[..61549],
            &shape,
            MemRange::whole(&mem),
            Layout::Packed,
            mode,
        );
        assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{mode}: {r:?}");
        let r = engine.strided().copy_to_memory(
            &src,
            &shape,
            MemRange::from_offset(&mem, 6600).unwrap(),
            Layout::Packed,
            mode,
        );
        assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{mode}: {r:?}");
        let mut dst = vec![POISON; 61549];
        let r = engine.strided().copy_from_memory(
            &mut dst,
            &shape,
            MemRange::whole(&mem),
            Layout::Packed,
            mode,
        );
        assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{mode}: {r:?}");
        assert_eq!(dst, vec![POISON; 61549]);
    }
    assert_eq!(mem_bytes(&mem, 0, 8192), vec![POISON; 8192]);
}

/// Reads for a batch: each case's shape into its own poisoned memory.
fn batch_case(
    engine: &Arc<Engine>,
    file: &Arc<StorageFile>,
    data: &[u8],
    cases: &[Case],
) -> Result<(), TestCaseError> {
    let mut reqs = Vec::new();
    let mut mems = Vec::new();
    for c in cases {
        let shape = Shape::new(c.base, c.run, &strides(c)).unwrap();
        let room = match c.layout {
            Layout::Packed => shape.bytes(),
            Layout::Strided => shape.bounding_len(),
        } as usize;
        let mem = Arc::new(HostMemory::new(c.mem_offset + room + 4096).unwrap());
        mem.write_at(0, &vec![POISON; mem.len()]).unwrap();
        mems.push(mem.clone());
        reqs.push(StridedRequest {
            dir: Direction::Read,
            file: file.clone(),
            shape,
            mem,
            mem_offset: c.mem_offset,
            layout: c.layout,
            mode: c.mode,
        });
    }
    let tickets = engine.submit_strided_batch(reqs.clone());
    for ((c, r), (req, mem)) in Engine::wait_all(&tickets)
        .into_iter()
        .enumerate()
        .zip(reqs.iter().zip(&mems))
    {
        let c = &cases[c];
        if c.mode == StridedMode::Rc && c.layout == Layout::Packed {
            prop_assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
            continue;
        }
        let rep = r.map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
        let (b0, b1) = req.shape.bounds();
        let mut want = vec![POISON; mem.len()];
        if rep.mode == StridedMode::Rc {
            want[c.mem_offset..c.mem_offset + (b1 - b0) as usize]
                .copy_from_slice(&data[b0 as usize..b1 as usize]);
        }
        for (k, &f) in reference_runs(c).iter().enumerate() {
            let at = c.mem_offset
                + match c.layout {
                    Layout::Packed => k * c.run as usize,
                    Layout::Strided => (f - b0) as usize,
                };
            want[at..at + c.run as usize].copy_from_slice(&data[f as usize..(f + c.run) as usize]);
        }
        prop_assert!(mem_bytes(mem, 0, mem.len()) == want, "{c:?}: wrong bytes");
    }
    // A ticket's result is handed out once.
    for t in &tickets {
        prop_assert!(matches!(t.poll(), Some(Err(Error::InvalidArgument(_)))));
    }
    Ok(())
}

#[test]
fn strided_batches_match_plain_indexing() {
    let dir = model_dir("strided-batch");
    let path = dir.path().join("table");
    let data = pattern(SEED, 0, FILE_LEN);
    std::fs::File::create(&path)
        .unwrap()
        .write_all_at(&data, 0)
        .unwrap();
    let file = Arc::new(StorageFile::open(&path).unwrap());
    let engine = Arc::new(Engine::new(
        Config {
            path: PathPref::Bounce,
            chunk: Some(64 << 10),
            depth: Some(3),
            ..Config::default()
        },
        None,
    ));
    let mut runner = runner(12);
    let result = runner.run(&prop::collection::vec(case(), 1..6), |cases| {
        batch_case(&engine, &file, &data, &cases)
    });
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn strided_writes_submitted_land_and_leave_the_gaps() {
    let dir = model_dir("strided-submit-w");
    let path = dir.path().join("table");
    let data = pattern(SEED, 0, 8 << 20);
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    raw.write_all_at(&data, 0).unwrap();
    let file = Arc::new(StorageFile::open_rw(&path).unwrap());
    let engine = Arc::new(Engine::new(Config::default(), None));
    let mut want = data.clone();
    // Four writes in disjoint 2 MiB regions, both layouts, with a read
    // batched beside them and one request refused.
    let shapes = [
        Shape::new(123, 500, &[(4096, 100)]).unwrap(),
        Shape::new((2 << 20) + 7, 8192, &[(10000, 4), (65536, 3)]).unwrap(),
        Shape::new(4 << 20, 1, &[(3, 50), (1000, 8), (100_000, 2)]).unwrap(),
        Shape::new((6 << 20) + 4095, 65536, &[(131072, 8)]).unwrap(),
    ];
    let mut reqs = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let layout = if i % 2 == 0 {
            Layout::Packed
        } else {
            Layout::Strided
        };
        let (b0, b1) = shape.bounds();
        let len = (b1 - b0) as usize;
        let src = pattern(i as u64, 0, len);
        let mem = Arc::new(HostMemory::new(len).unwrap());
        mem.write_at(0, &src).unwrap();
        for r in shape.iter() {
            let at = match layout {
                Layout::Packed => r.packed_offset,
                Layout::Strided => r.file_offset - b0,
            } as usize;
            let f = r.file_offset as usize;
            let n = shape.run_len() as usize;
            want[f..f + n].copy_from_slice(&src[at..at + n]);
        }
        reqs.push(StridedRequest {
            dir: Direction::Write,
            file: file.clone(),
            shape: shape.clone(),
            mem,
            mem_offset: 0,
            layout,
            mode: if i == 0 {
                StridedMode::Auto
            } else {
                StridedMode::Sc
            },
        });
    }
    let mut refused = reqs[0].clone();
    refused.mode = StridedMode::Tat;
    reqs.push(refused);
    let tickets = engine.submit_strided_batch(reqs);
    let results = Engine::wait_all(&tickets);
    for (i, r) in results.iter().enumerate().take(4) {
        let r = r.as_ref().unwrap();
        assert_eq!((r.mode, r.calls), (StridedMode::Sc, shapes[i].runs()));
    }
    assert!(matches!(results[4], Err(Error::InvalidArgument(_))));
    let mut have = vec![0u8; data.len()];
    raw.read_exact_at(&mut have, 0).unwrap();
    let wrong = (0..have.len()).find(|&i| have[i] != want[i]);
    assert_eq!(wrong, None, "first wrong byte of the file");
    // One submitted read, awaited as a future on this thread.
    let mem = Arc::new(HostMemory::new(1 << 20).unwrap());
    let ticket = engine.submit_strided(StridedRequest {
        dir: Direction::Read,
        file: file.clone(),
        shape: shapes[0].clone(),
        mem: mem.clone(),
        mem_offset: 0,
        layout: Layout::Packed,
        mode: StridedMode::Tat,
    });
    let r = block_on(ticket).unwrap();
    assert_eq!(r.mode, StridedMode::Tat);
    for run in shapes[0].iter() {
        let (f, p) = (run.file_offset as usize, run.packed_offset as usize);
        assert_eq!(mem_bytes(&mem, p, 500), want[f..f + 500], "run at {f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls `fut` on this thread until it is ready, parking between polls.
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
