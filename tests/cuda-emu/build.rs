//! Builds `cuda_emu.c` into `$OUT_DIR/libcuda.so.1` with the system C
//! compiler (`$CC`, else `cc`), plus a `libcuda.so` link beside it: cudarc
//! asks the loader for `libcuda.so` before `libcuda.so.1`, so a directory
//! put first on `LD_LIBRARY_PATH` must answer both names.

use std::{env, error::Error, fs, io, os::unix::fs::symlink, path::PathBuf, process::Command};

const SOURCE: &str = "cuda_emu.c";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let lib = out.join("libcuda.so.1");

    // `$CC` may carry arguments of its own ("ccache cc").
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut words = cc.split_whitespace();
    let program = words.next().ok_or("CC is empty")?;
    let status = Command::new(program)
        .args(words)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .args(["-shared", "-fPIC", "-O2", "-pthread", "-fvisibility=hidden"])
        .args(["-Wl,-soname,libcuda.so.1", "-Wl,-z,nodelete"])
        .arg(SOURCE)
        .arg("-o")
        .arg(&lib)
        .status()
        .map_err(|e| format!("cannot run the C compiler {cc:?}: {e}"))?;
    if !status.success() {
        return Err(format!("{cc} failed to build {SOURCE} ({status})").into());
    }

    let link = out.join("libcuda.so");
    match fs::remove_file(&link) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    symlink("libcuda.so.1", &link)?;
    Ok(())
}
