//! The C API from C: builds `examples/copy.c` and `tests/c/errors.c`
//! against the committed header and this crate's static library, runs them
//! on files in the target directory, and checks the bytes that came out.
//!
//! The first test to need the static library builds it
//! ([`p2pdma_tests::cargo::build_libs`]).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// What the static library needs from the system: the `Libs.private` of
/// `p2pdma.pc.in` (what `rustc --print native-static-libs` lists), so that
/// linking the tests checks the pkg-config file too.
fn native_libs() -> Vec<String> {
    let pc = include_str!("../p2pdma.pc.in");
    let line = pc
        .lines()
        .find_map(|l| l.strip_prefix("Libs.private:"))
        .expect("p2pdma.pc.in has Libs.private");
    line.split_whitespace().map(str::to_owned).collect()
}

fn workspace_root() -> PathBuf {
    Path::new(MANIFEST_DIR).join("../..")
}

/// Builds the static library for this test's profile and target, once, and
/// returns its path.
fn static_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let profile_dir = p2pdma_tests::cargo::build_libs(
            &workspace_root(),
            "p2pdma-capi",
            env!("P2PDMA_CAPI_TARGET"),
        );
        let lib = profile_dir.join("libp2pdma.a");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
}

/// A scratch directory in the target directory, a real filesystem with
/// `O_DIRECT` (unlike tmpfs), removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("capi-{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Compiles C sources into `out` against the header and the static library.
fn compile(sources: &[&str], out: &Path) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&cc)
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-pthread", "-I",
        ])
        .arg(Path::new(MANIFEST_DIR).join("include"))
        .args(sources.iter().map(|s| Path::new(MANIFEST_DIR).join(s)))
        .arg(static_lib())
        .args(native_libs())
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        output.status.success(),
        "{cc} failed on {sources:?}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `len` bytes in which no 8-byte word repeats: each is a hash of its index
/// and `seed`, so that a shifted, dropped or duplicated block shows.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut z = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // splitmix64.
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs the example on a file of `len` bytes landing at `mem_offset`, and
/// checks that it passed and that its output file equals the input.
fn copy_through_memory(bin: &Path, dir: &Path, len: usize, mem_offset: Option<usize>) -> String {
    let src = dir.join(format!("src-{len}"));
    let dst = dir.join(format!("dst-{len}"));
    let data = pattern(len, len as u64);
    std::fs::write(&src, &data).unwrap();
    let _ = std::fs::remove_file(&dst);

    let mut cmd = Command::new(bin);
    cmd.arg(&src).arg(&dst);
    if let Some(off) = mem_offset {
        cmd.arg(off.to_string());
    }
    let out = cmd.output().unwrap();
    let log = text(&out);
    assert!(out.status.success(), "copy failed:\n{log}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains("\npath: "),
        "no path choice printed:\n{log}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("reason: ") && l.len() > 20),
        "no reason printed:\n{log}"
    );
    assert!(
        stdout.contains(&format!("read: {len} bytes on the ")),
        "no read report:\n{log}"
    );
    assert!(
        stdout.contains(&format!("write: {len} bytes on the ")),
        "no write report:\n{log}"
    );

    let written = std::fs::read(&dst).unwrap();
    assert_eq!(
        written.len(),
        data.len(),
        "{} has the wrong length:\n{log}",
        dst.display()
    );
    if let Some(i) = written.iter().zip(&data).position(|(a, b)| a != b) {
        panic!(
            "{} differs from the source at byte {i}:\n{log}",
            dst.display()
        );
    }
    stdout
}

#[test]
fn copy_example_moves_every_byte() {
    let dir = scratch("copy");
    let bin = dir.path().join("copy");
    compile(&["examples/copy.c"], &bin);

    // Several chunks with a ragged tail, landing at an unaligned offset.
    let stdout = copy_through_memory(&bin, dir.path(), (3 << 20) + 12345, None);
    assert!(stdout.contains("verified: memory against SRC"), "{stdout}");
    assert!(stdout.contains("verified: DST against SRC"), "{stdout}");
    // Without the module, the memory is host memory: AUTO reads into it
    // directly, and says why.
    if !Path::new("/dev/p2pdma").exists() {
        assert!(stdout.contains("path: direct\n"), "{stdout}");
        assert!(stdout.contains("host-memory device"), "{stdout}");
    }
    // Smaller than a block, and at other offsets.
    copy_through_memory(&bin, dir.path(), 100, Some(1));
    copy_through_memory(&bin, dir.path(), 4096 * 3, Some(4095));
    copy_through_memory(&bin, dir.path(), 65537, Some(0));
}

#[test]
fn copy_example_refuses_bad_input() {
    let dir = scratch("refuse");
    let bin = dir.path().join("copy");
    compile(&["examples/copy.c"], &bin);

    let missing = Command::new(&bin)
        .arg(dir.path().join("missing"))
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("p2pdma_file_open(SRC) failed") && stderr.contains("missing"),
        "{stderr}"
    );

    let usage = Command::new(&bin).output().unwrap();
    assert_eq!(usage.status.code(), Some(2), "{}", text(&usage));
}

#[test]
fn c_callers_get_errors_not_crashes() {
    let dir = scratch("errors");
    let bin = dir.path().join("errors");
    compile(&["tests/c/errors.c"], &bin);
    let file = dir.path().join("data");
    std::fs::write(&file, pattern((1 << 20) + 777, 42)).unwrap();

    let out = Command::new(&bin).arg(&file).output().unwrap();
    let log = text(&out);
    assert!(out.status.success(), "errors failed:\n{log}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("FAIL"), "{log}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 60,
        "too few checks ran:\n{log}"
    );
    assert!(stdout.contains("errors: 0 failed"), "{log}");
}

#[test]
fn c_strided_transfers_move_the_runs() {
    let dir = scratch("strided");
    let bin = dir.path().join("strided");
    compile(&["tests/c/strided.c"], &bin);
    let (src, rw) = (dir.path().join("src"), dir.path().join("rw"));
    let data = pattern(4 << 20, 7);
    std::fs::write(&src, &data).unwrap();
    std::fs::write(&rw, &data).unwrap();

    let out = Command::new(&bin).arg(&src).arg(&rw).output().unwrap();
    let log = text(&out);
    assert!(out.status.success(), "strided failed:\n{log}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("FAIL"), "{log}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 50,
        "too few checks ran:\n{log}"
    );
    assert!(stdout.contains("strided: 0 failed"), "{log}");
    // What the C program wrote, checked here too: the file differs from
    // the source exactly in the runs written.
    let written = std::fs::read(&rw).unwrap();
    let changed: Vec<usize> = (0..data.len()).filter(|&i| written[i] != data[i]).collect();
    let runs = |base: usize, run: usize, stride: usize, n: usize| {
        (0..n).flat_map(move |k| base + k * stride..base + k * stride + run)
    };
    let may: std::collections::HashSet<usize> = runs((1 << 20) + 333, 700, 5000, 40)
        .chain(runs(3 << 20, 512, 2048, 16))
        .collect();
    assert!(changed.len() > 20_000, "{} bytes changed", changed.len());
    assert!(
        changed.iter().all(|i| may.contains(i)),
        "a byte outside the runs changed"
    );
}

#[test]
fn c_routes_move_every_byte() {
    let dir = scratch("route");
    let bin = dir.path().join("route");
    compile(&["tests/c/route.c"], &bin);
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    std::fs::write(&src, pattern(4 << 20, 11)).unwrap();
    std::fs::write(&dst, pattern(4 << 20, 12)).unwrap();

    let out = Command::new(&bin).arg(&src).arg(&dst).output().unwrap();
    let log = text(&out);
    assert!(out.status.success(), "route failed:\n{log}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("FAIL"), "{log}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 25,
        "too few checks ran:\n{log}"
    );
    assert!(stdout.contains("route: 0 failed"), "{log}");
}

#[test]
fn c_store_objects_survive_a_reopen() {
    let dir = scratch("store");
    let bin = dir.path().join("store");
    compile(&["tests/c/store.c"], &bin);
    let dev = dir.path().join("store.img");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let out = Command::new(&bin)
        .arg(&dev)
        .env("P2PDMA_CACHE_DIR", "off")
        .output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "store failed:\n{log}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("FAIL"), "{log}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 35,
        "too few checks ran:\n{log}"
    );
    assert!(stdout.contains("store: 0 failed"), "{log}");
}
