//! `unmap_raw` takes a number, and is `unsafe`.
#![forbid(unsafe_code)]

use p2pdma::Module;

fn main() {
    let module = Module::open().unwrap();
    let _ = module.unmap_raw(7);
}
