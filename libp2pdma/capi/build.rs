//! Generates the C header from the crate's source with cbindgen, into
//! `$OUT_DIR/p2pdma.h`. The committed `include/p2pdma.h` is checked against
//! it by `tests/header.rs`; `P2PDMA_UPDATE_HEADER=1 cargo test -p
//! p2pdma-capi --test header` refreshes it.

use std::{env, path::PathBuf};

fn main() {
    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");

    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("reading cbindgen.toml: {e}"));
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("generating the C header: {e}"))
        .write_to_file(out.join("p2pdma.h"));

    // The C tests build this crate's libraries for the same target as
    // themselves.
    let target = env::var("TARGET").expect("cargo sets TARGET");
    println!("cargo:rustc-env=P2PDMA_CAPI_TARGET={target}");

    // The shared library carries the ABI's major version as its soname, as
    // `install.sh` installs it.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libp2pdma.so.0");
}
