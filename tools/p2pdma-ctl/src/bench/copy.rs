//! `bench copy`: small copies into a shared mapping with the library's
//! copy routines (and into accelerator memory, with the module) vs one
//! `pwrite(2)` per copy.

use std::{fs::File, os::unix::fs::FileExt, sync::Arc, time::Instant};

use p2pdma::{
    memory::{DeviceMemory, ModuleMemory},
    Module,
};
use serde_json::{json, Value};

use super::common::{median, Res};

pub(super) fn copy(json_out: &mut Value) -> Res<()> {
    // A shared mapping of a memfd: write-back memory, copied into with the
    // library's routine for it (memcpy), and, for reference, with the
    // write-combining routine device memory gets; accelerator memory from
    // the module when there is one (its WC BAR mapping); vs one pwrite(2)
    // per copy into the memfd.
    use p2pdma::sys::{Caching, RawMapping, Sharing};
    let fd = rustix::fs::memfd_create("p2pdma-bench", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| e.to_string())?;
    let size = 1usize << 20;
    rustix::fs::ftruncate(&fd, size as u64).map_err(|e| e.to_string())?;
    // SAFETY: A memfd of this bench's own, reached through these two
    // mappings' copies and `pwrite` only.
    #[allow(unsafe_code)]
    let (wb, wc_on_wb) = unsafe {
        (
            RawMapping::map_with(&fd, size, 0, Sharing::Shared, Caching::WriteBack),
            RawMapping::map_with(&fd, size, 0, Sharing::Shared, Caching::WriteCombined),
        )
    };
    let (wb, wc_on_wb) = (
        wb.map_err(|e| e.to_string())?,
        wc_on_wb.map_err(|e| e.to_string())?,
    );
    let bar = Module::open().ok().and_then(|m| {
        let m = Arc::new(m);
        let index = m.accelerators().ok()?.first()?.index;
        ModuleMemory::alloc(m, index, size as u64, 0).ok()
    });
    let file = File::from(fd);
    println!("copy: latency per copy into a mapping vs one pwrite(2) per copy (median of 5 runs)");
    println!("  mapped: the library's routine for the memory (write-back: memcpy; write-combined: streaming stores)");
    let mut rows = Vec::new();
    for n in [64usize, 4096, 65536] {
        let src = vec![0x5Au8; n];
        let iters = (50_000_000 / n).clamp(1000, 200_000);
        let at = |i: usize| (i * n) % (size - n + 1) / 64 * 64;
        let time = |f: &dyn Fn(usize) -> Res<()>| -> Res<f64> {
            let t = Instant::now();
            for i in 0..iters {
                f(at(i))?;
            }
            Ok(t.elapsed().as_nanos() as f64 / iters as f64)
        };
        let (mut mapped, mut wc, mut sys, mut dev) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..5 {
            mapped.push(time(&|o| wb.write_at(o, &src).map_err(|e| e.to_string()))?);
            wc.push(time(&|o| {
                wc_on_wb.write_at(o, &src).map_err(|e| e.to_string())
            })?);
            sys.push(time(&|o| {
                file.write_at(&src, o as u64)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })?);
            if let Some(b) = &bar {
                dev.push(time(&|o| b.write_at(o, &src).map_err(|e| e.to_string()))?);
            }
        }
        let (mapped, wc, sys) = (median(mapped), median(wc), median(sys));
        print!(
            "  {n:6} B  mapped {mapped:9.1} ns  pwrite {sys:9.1} ns  pwrite/mapped {:6.2}  (WC routine on write-back memory {wc:9.1} ns)",
            sys / mapped
        );
        let mut row = json!({"bytes": n, "mapped_ns": mapped, "pwrite_ns": sys, "pwrite_vs_mapped": sys / mapped, "wc_routine_on_wb_ns": wc});
        if !dev.is_empty() {
            let dev = median(dev);
            print!(
                "  accelerator BAR (WC) {dev:9.1} ns  pwrite/BAR {:6.2}",
                sys / dev
            );
            row["accel_bar_ns"] = json!(dev);
            row["pwrite_vs_accel_bar"] = json!(sys / dev);
        }
        println!();
        rows.push(row);
    }
    json_out["copy"] = json!(rows);
    Ok(())
}
