//! The raw layer's `UNMAP`, `FREE` and `BLOCK_IO` on raw handles.
#![forbid(unsafe_code)]

use p2pdma::{sys, Module};
use p2pdma_abi as abi;

fn main() {
    let module = Module::open().unwrap();
    let _ = sys::unmap(
        &module,
        abi::P2pdmaUnmap {
            map_handle: 7,
            ..Default::default()
        },
    );
    let _ = sys::free(
        &module,
        abi::P2pdmaFree {
            handle: 7,
            ..Default::default()
        },
    );
    let _ = sys::block_io_raw(
        &module,
        &mut abi::P2pdmaBlockIo {
            handle: 7,
            ..Default::default()
        },
    );
}
