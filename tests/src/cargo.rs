//! Building a workspace package's own libraries from its integration
//! tests: cargo does not build a `cdylib` or `staticlib`-only library for
//! a package's tests, so the first test to need one runs `cargo build -p
//! PACKAGE --lib` with the test's profile, target and target directory
//! (the outer cargo has released its lock by then, and the build only
//! relinks what changed).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// Builds `package`'s libraries for the calling test's profile and target
/// (`triple`, the target the test was built for) from the workspace at
/// `root`, and returns the directory they are in (the test's profile
/// directory).
pub fn build_libs(root: &Path, package: &str, triple: &str) -> PathBuf {
    // The test runs from <target-dir>/[<triple>/]<profile-dir>/deps/.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test runs from <profile>/deps")
        .to_path_buf();
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a profile directory with a UTF-8 name")
        .to_owned();
    let above = profile_dir.parent().expect("a target directory");
    let explicit_target = above.file_name().is_some_and(|n| n == triple);
    let target_dir = if explicit_target {
        above.parent().expect("a target directory above the triple")
    } else {
        above
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--locked", "-p", package, "--lib"])
        .env("CARGO_TARGET_DIR", target_dir);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    if explicit_target {
        cmd.args(["--target", triple]);
    }
    let out = cmd.output().expect("running cargo");
    assert!(
        out.status.success(),
        "building {package}'s libraries failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    profile_dir
}
