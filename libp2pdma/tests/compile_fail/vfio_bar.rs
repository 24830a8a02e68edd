//! A controller's registers in safe hands: it could be pointed at any
//! memory of the machine.
#![forbid(unsafe_code)]

use p2pdma::sys::vfio;

fn main() {
    let f = vfio::Function::open_noiommu("0000:01:00.0").unwrap();
    f.bar.write64(0x28, 0x1000).unwrap();
}
