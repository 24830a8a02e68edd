//! Reads one column of a table stored row after row: `ROWS` runs of
//! `WIDTH` bytes, one every `ROW` bytes from `OFFSET`, packed side by side
//! in accelerator memory. The engine's cost model picks one read of the
//! whole range, one read per run, or reads through host memory that pack
//! the runs as they land.
//!
//! `cargo run --example strided_read -- PATH OFFSET WIDTH ROW ROWS`

mod common;

use p2pdma::{Config, Engine, Layout, MemRange, Shape, StorageFile, StridedMode};

fn main() -> p2pdma::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, offset, width, row, rows] = args.as_slice() else {
        panic!("usage: strided_read PATH OFFSET WIDTH ROW ROWS");
    };
    let num = |s: &String| s.parse::<u64>().expect("a number");
    let shape = Shape::new(num(offset), num(width), &[(num(row), num(rows))])?;
    let file = StorageFile::open(path)?;
    let len = shape.bytes() as usize;
    let (mem, module) = common::memory(len.max(1))?;
    let engine = Engine::new(Config::from_env()?, module);
    let report = engine.strided().read(
        &file,
        &shape,
        MemRange::whole(mem.as_ref()),
        Layout::Packed,
        StridedMode::Auto,
    )?;
    println!(
        "read {} runs by {}: {}",
        shape.runs(),
        report.mode,
        report.reason
    );
    println!("fnv1a {:016x}", common::fnv1a(mem.as_ref(), 0, len)?);
    Ok(())
}
