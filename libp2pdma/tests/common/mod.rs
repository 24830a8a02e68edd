//! What the integration tests share.
#![allow(dead_code)]

use std::path::PathBuf;

use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    transfer::{Config, Engine, PageCache, PathPref},
};
use proptest::test_runner::{Config as ProptestConfig, TestRunner};

/// Position-dependent bytes: any misplaced or stale block shows.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
            (x >> 29) as u8 ^ (x >> 7) as u8
        })
        .collect()
}

/// An engine with `path`, and the chunk and depth when given, whose reads
/// move every byte by the path (`PageCache::Direct`): the tests that use it
/// check the paths, and `page_cache.rs` checks reads from the page cache.
pub fn engine(path: PathPref, chunk: Option<usize>, depth: Option<usize>) -> Engine {
    Engine::new(
        Config {
            path,
            chunk,
            depth,
            page_cache: PageCache::Direct,
            ..Config::default()
        },
        None,
    )
}

/// `len` bytes of `m` at `off`.
pub fn mem_bytes(m: &HostMemory, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    m.read_at(off, &mut v).unwrap();
    v
}

/// A directory for one test's files, `NAME-…`, removed with everything in
/// it when dropped: in `$P2PDMA_MODEL_DIR` (the VM rig points it at ext4 on
/// NVMe), else in the target's temporary directory (which must allow
/// `O_DIRECT`).
pub fn model_dir(name: &str) -> tempfile::TempDir {
    let base = std::env::var_os("P2PDMA_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir_in(base)
        .unwrap()
}

/// A directory for one test's files in the target's temporary directory
/// (a filesystem with `O_DIRECT`, unlike tmpfs), removed when dropped.
pub fn scratch_dir(name: &str) -> tempfile::TempDir {
    // Made where it is missing: the VM's guest runs these tests too.
    std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
    tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// A proptest runner for `$PROPTEST_CASES` cases (`default` without it),
/// keeping no file of failures.
pub fn runner(default: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default);
    TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}
