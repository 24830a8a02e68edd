//! The same through the raw layer: `mmap` of the module's file at any
//! offset.
#![forbid(unsafe_code)]

use p2pdma::{
    sys::{RawMapping, Sharing},
    Module,
};

fn main() {
    let module = Module::open().unwrap();
    let map = RawMapping::map(&module, 4096, 0, Sharing::Shared).unwrap();
    map.write_at(0, &[0xff; 64]).unwrap();
}
