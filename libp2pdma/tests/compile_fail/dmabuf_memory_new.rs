//! Any descriptor taken as a dma-buf whose memory peers may write.
#![forbid(unsafe_code)]

use p2pdma::memory::DmabufMemory;

fn main() {
    let fd = std::fs::File::open("/dev/zero").unwrap().into();
    let _ = DmabufMemory::new(fd, 4096);
}
