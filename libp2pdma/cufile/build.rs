//! The shared library answers to NVIDIA's soname, `libcufile.so.0`, which
//! is the name KvikIO and other consumers `dlopen`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcufile.so.0");
    // The C program's test builds this crate's shared library for the same
    // target as itself.
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    println!("cargo:rustc-env=P2PDMA_CUFILE_TARGET={target}");
}
