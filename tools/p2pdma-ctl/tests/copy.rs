//! `p2pdma-ctl copy SRC DST --through host`: DST is replaced whole, by a
//! rename, only when the copy is complete; a copy that fails, before or in
//! the middle, leaves DST as it was and no temporary file behind.

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use rustix::process::{kill_process, Pid, Signal};

const CTL: &str = env!("CARGO_BIN_EXE_p2pdma-ctl");

/// A fresh directory in the target directory (a filesystem with
/// `O_DIRECT`, unlike tmpfs), removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ctl-copy-{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// `len` bytes in which no 8-byte word repeats, so that a shifted or
/// dropped piece shows.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut z = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `p2pdma-ctl copy SRC DST --through host ARGS...`, run by `sh` after
/// `setup` (shell commands: a umask, a file size limit).
fn copy(setup: &str, src: &Path, dst: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("{setup}\nexec \"$@\""))
        .arg("sh")
        .arg(CTL)
        .arg("copy")
        .arg(src)
        .arg(dst)
        .args(["--through", "host", "--path", "auto"])
        .args(args)
        .env_remove("P2PDMA_CONFIG")
        .env_remove("P2PDMA_PATH")
        // Never the user's cache of learned geometry.
        .env("P2PDMA_CACHE_DIR", "off");
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_copy_replaces_dst_whole_by_a_rename() {
    let dir = scratch("replace");
    let (src, dst, old) = (
        dir.path().join("src"),
        dir.path().join("dst"),
        dir.path().join("old-dst"),
    );
    let data = pattern((3 << 20) + 12345, 1);
    fs::write(&src, &data).unwrap();
    // A longer DST with other bytes, mode 0640, and a second name for it.
    let before = pattern(5 << 20, 2);
    fs::write(&dst, &before).unwrap();
    fs::set_permissions(&dst, fs::Permissions::from_mode(0o640)).unwrap();
    fs::hard_link(&dst, &old).unwrap();

    let out = copy("", &src, &dst, &["--piece", "1M"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let got = fs::read(&dst).unwrap();
    assert_eq!(got.len(), data.len(), "DST keeps none of its old tail");
    assert!(got == data, "DST differs from SRC");
    let meta = fs::metadata(&dst).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    // A new file took DST's name: the old one is intact under its other
    // name, so nobody could have seen DST half written.
    assert_ne!(meta.ino(), fs::metadata(&old).unwrap().ino());
    assert!(fs::read(&old).unwrap() == before, "the old DST was written");
    assert_eq!(names(dir.path()), ["dst", "old-dst", "src"]);

    // A new DST gets 0666 less the umask.
    let fresh = dir.path().join("fresh");
    let out = copy("umask 027", &src, &fresh, &["--piece", "1M"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(fs::read(&fresh).unwrap() == data);
    let mode = fs::metadata(&fresh).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o640);
    assert_eq!(names(dir.path()), ["dst", "fresh", "old-dst", "src"]);
}

#[test]
fn a_symbolic_link_has_its_target_replaced() {
    let dir = scratch("link");
    let (src, target, link) = (
        dir.path().join("src"),
        dir.path().join("target"),
        dir.path().join("link"),
    );
    let data = pattern(100_000, 3);
    fs::write(&src, &data).unwrap();
    fs::write(&target, b"old").unwrap();
    std::os::unix::fs::symlink("target", &link).unwrap();

    let out = copy("", &src, &link, &[]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::read(&target).unwrap() == data);
    assert_eq!(names(dir.path()), ["link", "src", "target"]);
}

#[test]
fn a_copy_failing_mid_way_leaves_dst_as_it_was_and_no_temporary() {
    let dir = scratch("midway");
    let (src, dst, absent) = (
        dir.path().join("src"),
        dir.path().join("dst"),
        dir.path().join("absent"),
    );
    let data = pattern(4 << 20, 4);
    fs::write(&src, &data).unwrap();
    let before = pattern(10_000, 5);
    fs::write(&dst, &before).unwrap();

    // Files may grow to 1024 blocks (512 KiB or 1 MiB, as the shell counts
    // them): the first pieces land, then a write fails with EFBIG. SIGXFSZ
    // is ignored, so the write fails instead of killing the process.
    let limit = "trap '' XFSZ\nulimit -f 1024";
    for to in [&dst, &absent] {
        let out = copy(limit, &src, to, &["--piece", "128K"])
            .output()
            .unwrap();
        let log = text(&out);
        assert_eq!(out.status.code(), Some(1), "{log}");
        assert!(log.contains("File too large"), "{log}");
    }
    assert!(fs::read(&dst).unwrap() == before, "DST was changed");
    assert_eq!(names(dir.path()), ["dst", "src"]);
}

#[test]
fn a_source_truncated_mid_copy_leaves_no_dst_and_no_temporary() {
    let dir = scratch("truncated");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    fs::write(&src, pattern(32 << 20, 6)).unwrap();

    // Small pieces make the copy take thousands of transfers. As soon as
    // the temporary appears, the copy is stopped, its source cut short,
    // and the copy let go on into the end of the file.
    let mut child = copy("", &src, &dst, &["--piece", "4K"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = Pid::from_child(&child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if names(dir.path()).len() > 1 {
            kill_process(pid, Signal::STOP).unwrap();
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the copy ended before its temporary was seen"
        );
        assert!(Instant::now() < deadline, "no temporary appeared");
        thread::sleep(Duration::from_micros(200));
    }
    let during = names(dir.path());
    let temp = during.iter().find(|n| n.as_str() != "src").unwrap().clone();
    assert!(
        temp.starts_with(".dst.p2pdma-") && temp.ends_with(".tmp"),
        "{during:?}"
    );
    fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    kill_process(pid, Signal::CONT).unwrap();
    let out = child.wait_with_output().unwrap();
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("past its end"), "{log}");
    assert_eq!(names(dir.path()), ["src"]);
}

#[test]
fn a_copy_refused_up_front_touches_nothing() {
    let dir = scratch("refused");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    fs::write(&src, pattern(8192, 7)).unwrap();
    fs::write(&dst, b"keep").unwrap();
    let out = copy("", &src, &dst, &["--len", "8193"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(fs::read(&dst).unwrap(), b"keep");
    let out = copy("", &src, dir.path(), &[]).output().unwrap();
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("is a directory"), "{log}");
    assert_eq!(names(dir.path()), ["dst", "src"]);
}

/// The first bytes of a shape's runs (`base`, then `(stride, count)`
/// dimensions innermost first), by nested loops, in file order.
fn runs(base: usize, dims: &[(usize, usize)]) -> Vec<usize> {
    let mut offs = vec![base];
    for &(stride, count) in dims {
        offs = (0..count)
            .flat_map(|k| offs.iter().map(move |o| o + k * stride))
            .collect();
    }
    offs
}

#[test]
fn a_shape_copies_its_runs_in_every_mode_and_layout() {
    let dir = scratch("shape");
    let src = dir.path().join("src");
    let data = pattern(4 << 20, 11);
    fs::write(&src, &data).unwrap();
    let (base, run, dims) = (4097, 600, [(1000, 7), (300_000, 3)]);
    let spec = "base=4097,run=600,dims=1000x7,300000x3";
    let offs = runs(base, &dims);
    let (b0, b1) = (offs[0], offs[offs.len() - 1] + run);
    let packed: Vec<u8> = offs
        .iter()
        .flat_map(|&o| data[o..o + run].to_vec())
        .collect();
    for (layout, mode) in [
        ("packed", "auto"),
        ("packed", "sc"),
        ("packed", "tat"),
        ("strided", "auto"),
        ("strided", "sc"),
        ("strided", "tat"),
        ("strided", "rc"),
    ] {
        let dst = dir.path().join(format!("dst-{layout}-{mode}"));
        let out = copy(
            "",
            &src,
            &dst,
            &[
                "--shape", spec, "--layout", layout, "--mode", mode, "--verify",
            ],
        )
        .output()
        .unwrap();
        assert!(out.status.success(), "{layout} {mode}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("verify: 21 runs (12600 bytes) match"),
            "{}",
            text(&out)
        );
        let got = fs::read(&dst).unwrap();
        let chosen = String::from_utf8_lossy(&out.stdout)
            .split("mode ")
            .nth(1)
            .and_then(|t| t.split(',').next())
            .unwrap_or("")
            .to_string();
        if layout == "packed" {
            assert!(
                got == packed,
                "{layout} {mode}: DST is not the runs back to back"
            );
        } else {
            // The bounding range: the runs in place, the source's bytes
            // between them for RC, zeros otherwise.
            let mut want = if chosen == "rc" {
                data[b0..b1].to_vec()
            } else {
                vec![0u8; b1 - b0]
            };
            for &o in &offs {
                want[o - b0..o - b0 + run].copy_from_slice(&data[o..o + run]);
            }
            assert!(
                got == want,
                "{layout} {mode} (chose {chosen}): DST is not the bounding range"
            );
        }
    }
    // Bad shapes and combinations: an error, never a panic, and no DST.
    for args in [
        &["--shape", "run=0"][..],
        &["--shape", "base=1,dims=8x2"],
        &["--shape", "run=4,dims=8x2,8x2,8x2,8x2"],
        &["--shape", "run=4,dims=2x2"],
        &["--shape", "run=4,dims=1Mx100"],
        &["--shape", "run=4,colour=red"],
        &["--shape", "run=4", "--mode", "fast"],
        &["--shape", "run=4", "--layout", "diagonal"],
        &["--shape", "run=4", "--mode", "rc"],
    ] {
        let dst = dir.path().join("never");
        let out = copy("", &src, &dst, args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("p2pdma-ctl: ") || stderr.contains("\np2pdma-ctl: "),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!dst.exists(), "{args:?} left {}", dst.display());
    }
    assert!(
        names(dir.path()).iter().all(|n| !n.contains(".tmp")),
        "{:?}",
        names(dir.path())
    );
    let _ = fs::remove_dir_all(&dir);
}
