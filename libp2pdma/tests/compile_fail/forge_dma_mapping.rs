//! Forging the owner of a mapping from a number.
#![forbid(unsafe_code)]

use p2pdma::{DmaMapping, MapType};

fn main() {
    let _ = DmaMapping {
        map_handle: 7,
        map_type: MapType::BusAddr,
        length: 4096,
        segs: Vec::new(),
    };
}
