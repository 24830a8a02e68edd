//! Reads a whole file into accelerator memory: the engine picks P2P DMA
//! where the kernel allows it and the host bounce pipeline otherwise, and
//! says why.
//!
//! `cargo run --example read_file -- PATH`

mod common;

use p2pdma::{Config, Engine, StorageFile};

fn main() -> p2pdma::Result<()> {
    let path = std::env::args().nth(1).expect("usage: read_file PATH");
    let file = StorageFile::open(&path)?;
    let len = usize::try_from(file.size()).expect("the file fits in memory");
    let (mem, module) = common::memory(len.max(1))?;
    let engine = Engine::new(Config::from_env()?, module);
    let handle = engine.handle(&file, mem.as_ref())?;
    let report = handle.read(0, 0, len)?;
    println!(
        "read {} bytes by {}: {}",
        report.bytes,
        report.path,
        handle.reason()
    );
    println!("fnv1a {:016x}", common::fnv1a(mem.as_ref(), 0, len)?);
    Ok(())
}
