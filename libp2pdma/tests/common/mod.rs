//! What the integration tests share.
#![allow(dead_code)]

use p2pdma::{
    backend::{DeviceMemory, HostMemory},
    transfer::{Config, Engine, PathPref},
};

/// Position-dependent bytes: any misplaced or stale block shows.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
            (x >> 29) as u8 ^ (x >> 7) as u8
        })
        .collect()
}

/// An engine with `path`, and the chunk and depth when given.
pub fn engine(path: PathPref, chunk: Option<usize>, depth: Option<usize>) -> Engine {
    Engine::new(
        Config {
            path,
            chunk,
            depth,
            ..Config::default()
        },
        None,
    )
}

/// `len` bytes of `m` at `off`.
pub fn mem_bytes(m: &HostMemory, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    m.read_at(off, &mut v).unwrap();
    v
}
