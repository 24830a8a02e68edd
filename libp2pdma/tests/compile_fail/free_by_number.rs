//! Freeing the allocation a raw handle names, under its owner.
#![forbid(unsafe_code)]

use p2pdma::Module;

fn main() {
    let module = Module::open().unwrap();
    let _ = module.free(7);
}
