//! Small copies into and out of GPU memory, two ways side by side: the
//! CPU through the dma-buf's mapping (gdrcopy-style, write-combined
//! stores) and the driver's copies (`cuMemcpyHtoDAsync`/`DtoHAsync` on a
//! stream, then a wait). Prints the median time per copy for each size and
//! their ratio; the mapping's side is skipped, with the reason, where the
//! driver does not let its dma-buf be mapped.
//!
//! ```text
//! cargo run --release --example gpu_small_copies [-- ITERATIONS]
//! ```

use std::time::Instant;

use p2pdma::memory::{CudaMemory, DeviceMemory};

fn median_ns(iters: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_nanos() as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iters: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(2000);
    let mem = CudaMemory::alloc(0, 64 << 20)?;
    let map = mem.cpu_mapping();
    if let Err(e) = &map {
        println!("no CPU mapping of GPU memory here: {e}");
    }
    println!(
        "{:>8}  {:>12} {:>12} {:>8}  {:>12} {:>12} {:>8}",
        "bytes", "map write", "cuMemcpy", "ratio", "map read", "cuMemcpy", "ratio"
    );
    for size in [8usize, 64, 512, 4096, 16384, 65536] {
        let src: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        let mut dst = vec![0u8; size];
        let copy_w = median_ns(iters, || mem.write_at(4096, &src).unwrap());
        let copy_r = median_ns(iters, || mem.read_at(4096, &mut dst).unwrap());
        assert!(dst == src, "the driver's copies disagree at {size} bytes");
        let (map_w, map_r) = match &map {
            Ok(m) => {
                let w = median_ns(iters, || m.write_at(8192, &src).unwrap());
                let r = median_ns(iters, || m.read_at(8192, &mut dst).unwrap());
                assert!(dst == src, "the mapping's copies disagree at {size} bytes");
                let mut back = vec![0u8; size];
                mem.read_at(8192, &mut back)?;
                assert!(back == src, "the mapping's bytes are not the memory's");
                (Some(w), Some(r))
            }
            Err(_) => (None, None),
        };
        let cell = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.0} ns", v));
        let ratio = |a: Option<f64>, b: f64| a.map_or("-".into(), |a| format!("{:.2}x", b / a));
        println!(
            "{size:>8}  {:>12} {:>12} {:>8}  {:>12} {:>12} {:>8}",
            cell(map_w),
            format!("{copy_w:.0} ns"),
            ratio(map_w, copy_w),
            cell(map_r),
            format!("{copy_r:.0} ns"),
            ratio(map_r, copy_r),
        );
    }
    Ok(())
}
