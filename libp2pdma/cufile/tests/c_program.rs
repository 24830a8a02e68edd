//! The library from C, as KvikIO loads it and as programs link to it.
//!
//! Builds `libcufile.so` (with a
//! `libcufile.so.0` link beside it), compiles `tests/c/cufile_test.c`
//! against `include/cufile.h` alone, and runs it with `LD_LIBRARY_PATH`
//! pointing at the library, once with host memory only and once with the
//! CUDA emulator (`tests/cuda-emu`) as the driver, moving data into and out
//! of device memory. The C program checks every byte against its own
//! reference and every error code; here its report is read.
//!
//! Beside it, `cufile-1.20-symbols.txt` lists the functions of cuFile
//! 1.20's header: each must be defined in the library (`nm -D`), and
//! `tests/c/link_all.c`, linked to all of them, must load and run.
//!
//! Cargo does not build a `cdylib` for its own integration tests, so the
//! first test to need it runs `cargo build -p p2pdma-cufile --lib` with
//! this test's profile, target and target directory (the outer cargo has
//! released its lock by then, and the build only relinks what changed).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// How long one run of the C program may take.
const TIMEOUT: Duration = Duration::from_secs(300);

fn workspace_root() -> PathBuf {
    Path::new(MANIFEST_DIR).join("../..")
}

/// Builds the shared library for this test's profile and target, once,
/// links `libcufile.so.0` to it, and returns the directory holding both.
fn library_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let profile_dir = p2pdma_tests::cargo::build_libs(
            &workspace_root(),
            "p2pdma-cufile",
            env!("P2PDMA_CUFILE_TARGET"),
        );
        let lib = profile_dir.join("libcufile.so");
        assert!(lib.is_file(), "{} was not built", lib.display());

        // The soname, which is what dlopen asks for.
        let link = profile_dir.join("libcufile.so.0");
        match std::fs::read_link(&link) {
            Ok(to) if to == Path::new("libcufile.so") => {}
            _ => {
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink("libcufile.so", &link).unwrap();
            }
        }
        profile_dir
    })
}

/// A scratch directory in the target directory, a real filesystem with
/// `O_DIRECT` (unlike tmpfs), removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("cufile-{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// Compiles the C program into `dir` against the header alone: it links
/// nothing of ours, it loads the library with dlopen.
fn compile(dir: &Path) -> PathBuf {
    let bin = dir.join("cufile_test");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&cc)
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-pthread", "-I",
        ])
        .arg(Path::new(MANIFEST_DIR).join("include"))
        .arg(Path::new(MANIFEST_DIR).join("tests/c/cufile_test.c"))
        .arg("-ldl")
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        output.status.success(),
        "{cc} failed on cufile_test.c:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    bin
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd` to its end, or kills it after [`TIMEOUT`].
fn run(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The pipes are drained by threads, so that a chatty child never
    // blocks on a full pipe while this waits.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let s = child.wait().unwrap();
            let out = Output {
                status: s,
                stdout: out.join().unwrap(),
                stderr: err.join().unwrap(),
            };
            panic!("cufile_test hung for {TIMEOUT:?}:\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The C program on a fresh scratch directory, with `env` set: its stdout,
/// after checking that it passed at least `min` checks and failed none.
fn run_program(name: &str, args: &[&Path], env: &[(&str, &Path)], min: usize) -> String {
    let dir = scratch(name);
    let bin = compile(dir.path());
    let lib_dir = library_dir();
    let search = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut p = lib_dir.as_os_str().to_owned();
            p.push(":");
            p.push(old);
            p
        }
        _ => lib_dir.as_os_str().to_owned(),
    };
    let mut cmd = Command::new(&bin);
    cmd.arg(dir.path())
        .args(args)
        .env("LD_LIBRARY_PATH", search)
        // Nothing learned is kept in the user's cache.
        .env("P2PDMA_CACHE_DIR", "off")
        // Every byte by the path, as cuFile's own GPUDirect reads do: the
        // program counts what the CUDA driver copied.
        .env("P2PDMA_PAGE_CACHE", "direct")
        .env_remove("P2PDMA_CUDA_DRIVER")
        .env_remove("P2PDMA_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run(cmd);
    let log = text(&out);
    assert!(out.status.success(), "cufile_test failed:\n{log}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!stdout.contains("\nFAIL "), "{log}");
    let summary = stdout
        .lines()
        .find_map(|l| l.strip_prefix("cufile: "))
        .unwrap_or_else(|| panic!("no summary line:\n{log}"));
    let (passed, failed) = summary
        .split_once(" passed, ")
        .and_then(|(p, f)| Some((p.parse::<usize>().ok()?, f.strip_suffix(" failed")?)))
        .unwrap_or_else(|| panic!("unreadable summary {summary:?}:\n{log}"));
    assert_eq!(failed, "0", "{log}");
    let oks = stdout.lines().filter(|l| l.starts_with("ok   ")).count();
    assert_eq!(oks, passed, "the summary counts every check:\n{log}");
    assert!(passed >= min, "only {passed} checks ran:\n{log}");
    stdout
}

/// The functions of cuFile 1.20's header.
fn functions_1_20() -> Vec<String> {
    let list =
        std::fs::read_to_string(Path::new(MANIFEST_DIR).join("tests/cufile-1.20-symbols.txt"))
            .unwrap();
    let names: Vec<String> = list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
        .collect();
    assert_eq!(names.len(), 50, "cuFile 1.20 declares 50 functions");
    names
}

#[test]
fn the_library_defines_every_function_of_cufile_1_20() {
    let lib = library_dir().join("libcufile.so");
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .unwrap_or_else(|e| panic!("running nm: {e}"));
    assert!(out.status.success(), "nm failed: {}", text(&out));
    let nm = String::from_utf8_lossy(&out.stdout);
    let defined: std::collections::HashSet<&str> = nm
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "T", name] => Some(name),
            _ => None,
        })
        .collect();
    let missing: Vec<String> = functions_1_20()
        .into_iter()
        .filter(|f| !defined.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "libcufile.so lacks {missing:?}");
}

#[test]
fn a_program_linked_to_every_function_loads_and_runs() {
    let src = Path::new(MANIFEST_DIR).join("tests/c/link_all.c");
    let code = std::fs::read_to_string(&src).unwrap();
    for f in functions_1_20() {
        assert!(
            code.contains(&format!("ENTRY({f}),")),
            "link_all.c does not link {f}"
        );
    }
    let dir = scratch("link");
    let bin = dir.path().join("link_all");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let lib_dir = library_dir();
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(Path::new(MANIFEST_DIR).join("include"))
        .arg(&src)
        .arg("-L")
        .arg(lib_dir)
        .args(["-lcufile", "-o"])
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} failed on link_all.c:\n{}",
        text(&out)
    );
    let mut cmd = Command::new(&bin);
    cmd.env("LD_LIBRARY_PATH", lib_dir);
    let out = run(cmd);
    assert!(out.status.success(), "link_all failed:\n{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "linked 50 entry points, version 1200"
    );
}

#[test]
fn c_program_moves_every_byte_through_host_memory() {
    let stdout = run_program("host", &[], &[], 400);
    // The parts that must have run, by the lines that say so.
    for line in [
        "ok   dlsym cuFileDriverClose_v2",
        "ok   dlsym cuFileDriverClose\n",
        "ok   across the end of the file: 20000 at 4205649 into +0: 1000 of 1000 bytes",
        "ok   at the end of the file: 4096 at 4206649 into +0: 0 of 0 bytes",
        "ok   16 mixed entries, all at once: 16 of 16 events",
        "ok   the file holds every write (pread)",
        "ok   the batch writes are in the file",
        "ok   it read before returning (100000 bytes)",
        "ok   the engine runs with the staged chunk, depth and threads",
        "ok   a size parameter once the driver is open: 5026",
        "ok   cuFileReadv: 3 buffers (registered, not, inside one) from 12345: 63295 of 63295 bytes",
        "ok   the file holds the gathered write",
        "ok   read bytes: 201000 of 201000",
        "ok   size histograms:",
        "ok   only the read after the start counted",
        "ok   NVMe: PCI P2PDMA",
        "ok   the topology is written as JSON",
    ] {
        assert!(stdout.contains(line), "missing {line:?}:\n{stdout}");
    }
    assert!(!stdout.contains("ok   device:"), "{stdout}");
}

#[test]
fn c_program_moves_every_byte_through_emulated_device_memory() {
    let emu = cuda_emu::library();
    let stdout = run_program(
        "cuda",
        &[Path::new("--cuda"), emu],
        &[("P2PDMA_CUDA_DRIVER", emu)],
        450,
    );
    let device = stdout
        .lines()
        .filter(|l| l.starts_with("ok   device: "))
        .count();
    assert!(device >= 30, "only {device} device checks:\n{stdout}");
    for line in [
        "ok   device: four threads without a CUDA context read 1 MiB each",
        "ok   device: the read used the parameters set on the stream before it",
        "ok   device: it wrote what the copy before it put in device memory",
        "ok   the emulated driver copied the reads into device memory (",
        "ok   no driver call lacked a current context (0 refused)",
        "ok   device: cuFileReadv into two device ranges: 75000 of 75000",
        "ok   device: GPU 0 counted the read (75000 bytes",
    ] {
        assert!(stdout.contains(line), "missing {line:?}:\n{stdout}");
    }
}

#[test]
fn without_compatibility_mode_device_memory_moves_by_p2p_or_not_at_all() {
    let emu = cuda_emu::library();
    let stdout = run_program(
        "no-compat",
        &[Path::new("--no-compat"), emu],
        &[("P2PDMA_CUDA_DRIVER", emu)],
        60,
    );
    for line in [
        "ok   the engine runs P2P only",
        "ok   device: a read P2P cannot serve fails (-5008), nothing lands",
        "ok   host memory still reads by direct I/O (1048576)",
    ] {
        assert!(stdout.contains(line), "missing {line:?}:\n{stdout}");
    }
}
