//! Reads a file as a batch of background transfers, the way a data loader
//! fetches the samples of a batch: every piece is submitted at once, the
//! engine's workers run them in parallel, and the loader waits for all.
//!
//! `cargo run --example async_batch -- PATH PIECE`

mod common;

use std::sync::Arc;

use p2pdma::{Config, Direction, Engine, Request, StorageFile};

fn main() -> p2pdma::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, piece] = args.as_slice() else {
        panic!("usage: async_batch PATH PIECE");
    };
    let piece: usize = piece.parse().expect("a size in bytes");
    let file = Arc::new(StorageFile::open(path)?);
    let len = usize::try_from(file.size()).expect("the file fits in memory");
    let (mem, module) = common::memory(len.max(1))?;
    let engine = Arc::new(Engine::new(Config::from_env()?, module));
    let requests = (0..len).step_by(piece.max(1)).map(|at| Request {
        dir: Direction::Read,
        file: file.clone(),
        file_offset: at as u64,
        mem: mem.clone(),
        mem_offset: at,
        len: piece.min(len - at),
    });
    let tickets = engine.submit_batch(requests);
    for r in Engine::wait_all(&tickets) {
        r?;
    }
    println!("read {} pieces, {len} bytes", tickets.len());
    println!("fnv1a {:016x}", common::fnv1a(mem.as_ref(), 0, len)?);
    Ok(())
}
