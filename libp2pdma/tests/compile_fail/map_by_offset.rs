//! Mapping module memory by an `mmap` offset, then writing it: the offset
//! may name memory another owner (or a device) trusts.
#![forbid(unsafe_code)]

use p2pdma::Module;

fn main() {
    let module = Module::open().unwrap();
    let map = module.map(0, 4096).unwrap();
    map.write_at(0, &[0xff; 64]).unwrap();
}
