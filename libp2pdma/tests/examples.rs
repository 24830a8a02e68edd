//! The programs in `examples/` run against a real file and land its bytes:
//! each prints an FNV-1a of the memory it filled, checked here against the
//! bytes the file holds. `cargo test` builds the examples before it runs
//! this test.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// FNV-1a of `bytes`, computed here and not by the library.
fn fnv1a(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("fnv1a {h:016x}")
}

/// The example `name`, built by `cargo test` beside this test's directory.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples");
    let bin = dir.join(name);
    let built = std::fs::metadata(&bin).and_then(|m| m.modified());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let newest = [src.join(format!("{name}.rs")), src.join("common/mod.rs")]
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).unwrap())
        .max()
        .unwrap();
    assert!(
        built.is_ok_and(|b| b >= newest),
        "{} is missing or older than its source: run `cargo test -p libp2pdma`, which builds the examples",
        bin.display()
    );
    bin
}

/// Runs example `name` with `args`, with no configuration file and no
/// cache; its output.
fn run(name: &str, args: &[&str]) -> String {
    let dir = tempfile_dir();
    let config = dir.join("config");
    std::fs::write(&config, "").unwrap();
    let out = Command::new(example(name))
        .args(args)
        .env("P2PDMA_CONFIG", &config)
        .env("P2PDMA_CACHE_DIR", "off")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "p2pdma-examples-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file of `len` pattern bytes; its path and contents.
fn data_file(name: &str, len: usize) -> (PathBuf, Vec<u8>) {
    let bytes = common::pattern(0x5eed, 0, len);
    let path = tempfile_dir().join(name);
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

#[test]
fn read_file_lands_the_whole_file() {
    let (path, bytes) = data_file("whole", 3 << 20 | 123);
    let out = run("read_file", &[path.to_str().unwrap()]);
    assert!(
        out.contains(&format!("read {} bytes by ", bytes.len())),
        "{out}"
    );
    assert!(out.contains(&fnv1a(&bytes)), "{out}");
}

#[test]
fn strided_read_packs_one_column() {
    let (row, width, offset, rows) = (4096usize, 48usize, 1000usize, 300usize);
    let (path, bytes) = data_file("table", offset + row * rows);
    let column: Vec<u8> = (0..rows)
        .flat_map(|r| bytes[offset + r * row..][..width].to_vec())
        .collect();
    let args = [offset, width, row, rows].map(|n| n.to_string());
    let mut all = vec![path.to_str().unwrap()];
    all.extend(args.iter().map(String::as_str));
    let out = run("strided_read", &all);
    assert!(out.contains(&format!("read {rows} runs by ")), "{out}");
    assert!(out.contains(&fnv1a(&column)), "{out}");
}

#[test]
fn async_batch_lands_every_piece() {
    let (path, bytes) = data_file("batch", 5 << 20 | 4001);
    let out = run("async_batch", &[path.to_str().unwrap(), "262144"]);
    let pieces = bytes.len().div_ceil(262_144);
    assert!(
        out.contains(&format!("read {pieces} pieces, {} bytes", bytes.len())),
        "{out}"
    );
    assert!(out.contains(&fnv1a(&bytes)), "{out}");
}
