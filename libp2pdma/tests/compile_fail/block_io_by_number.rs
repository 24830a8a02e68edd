//! Block I/O into the allocation a raw handle names.
#![forbid(unsafe_code)]

use p2pdma::Module;

fn main() {
    let module = Module::open().unwrap();
    let nvme = std::fs::File::open("/dev/nvme0n1").unwrap();
    let _ = module.block_io(7, &nvme, false, &[], 0);
}
