//! `bench strided`: a grid of strided reads, volumes (2 MiB, 64 MiB,
//! 1 GiB) by rho (25 to 100 %) by run length (512 B to 1 MiB), each cell
//! read by SC and TaT (packed), RC (strided layout) and AUTO in both
//! layouts, interleaved, with each one's time and device space and AUTO's
//! ratio to the best it could have chosen; every result checked against
//! the file.

use std::{fs::File, os::unix::fs::FileExt, path::PathBuf, time::Instant};

use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    transfer::{Config, Engine, Layout, Shape, StorageFile, StridedMode},
    MemRange,
};
use serde_json::{json, Value};

use super::common::{ensure_file, median, BenchArgs, Res};

/// One contender of a `strided` cell: a mode and the layout it reads into.
struct StridedContender {
    name: &'static str,
    mode: StridedMode,
    layout: Layout,
}

const STRIDED_CONTENDERS: [StridedContender; 5] = [
    StridedContender {
        name: "SC",
        mode: StridedMode::Sc,
        layout: Layout::Packed,
    },
    StridedContender {
        name: "TaT",
        mode: StridedMode::Tat,
        layout: Layout::Packed,
    },
    StridedContender {
        name: "RC",
        mode: StridedMode::Rc,
        layout: Layout::Strided,
    },
    StridedContender {
        name: "AUTO packed",
        mode: StridedMode::Auto,
        layout: Layout::Packed,
    },
    StridedContender {
        name: "AUTO strided",
        mode: StridedMode::Auto,
        layout: Layout::Strided,
    },
];

/// The shape of a `strided` cell: runs of `run` bytes, `run / rho` apart
/// (touching at rho 1), as many as fit in `volume` bytes from `base`;
/// `None` when fewer than two fit.
fn cell_shape(base: u64, volume: u64, run: u64, rho: f64) -> Option<Shape> {
    let stride = ((run as f64 / rho).round() as u64).max(run);
    let n = (volume.checked_sub(run)? / stride) + 1;
    if n < 2 {
        return None;
    }
    Shape::new(base, run, &[(stride, n)]).ok()
}

/// Checks the memory after a strided read of `shape` into `layout` from
/// offset 0 against the file's bytes `data`: every run where the layout
/// puts it, and for RC the gaps too.
fn check_strided(
    mem: &dyn DeviceMemory,
    shape: &Shape,
    layout: Layout,
    rc: bool,
    data: &[u8],
    got: &mut Vec<u8>,
) -> Res<()> {
    let (b0, b1) = shape.bounds();
    let len = match layout {
        Layout::Packed => shape.bytes(),
        Layout::Strided => b1 - b0,
    } as usize;
    got.resize(len, 0);
    mem.read_at(0, got).map_err(|e| e.to_string())?;
    if rc {
        return match got[..] == data[b0 as usize..b1 as usize] {
            true => Ok(()),
            false => Err("RC's range differs from the file".into()),
        };
    }
    let run = shape.run_len() as usize;
    for r in shape.iter() {
        let at = match layout {
            Layout::Packed => r.packed_offset,
            Layout::Strided => r.file_offset - b0,
        } as usize;
        let f = r.file_offset as usize;
        if got[at..at + run] != data[f..f + run] {
            return Err(format!("wrong data for the run at file offset {f}"));
        }
    }
    Ok(())
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n => format!("{n} B"),
    }
}

/// A time for the table: ms with three significant digits.
fn ms(t: f64) -> String {
    let m = t * 1e3;
    match m {
        m if m >= 100.0 => format!("{m:.0}"),
        m if m >= 10.0 => format!("{m:.1}"),
        m => format!("{m:.2}"),
    }
}

/// `strided`: the grid of volumes, rho and run lengths, each cell read by
/// SC and TaT (packed), RC (strided layout) and AUTO in both layouts,
/// `reps` rounds interleaved (`reps_large` for volumes of 256 MiB and
/// more), medians, every result checked against the file.
pub(super) fn strided(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let path = a
        .file
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/tmp/p2pdma-strided.dat"));
    let volumes = a
        .volumes
        .iter()
        .map(|v| crate::util::parse_size(v))
        .collect::<Res<Vec<u64>>>()?;
    let runs = a
        .runs
        .iter()
        .map(|v| crate::util::parse_size(v))
        .collect::<Res<Vec<u64>>>()?;
    let rhos: Vec<f64> = a
        .rhos
        .iter()
        .map(|r| match r.parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(p / 100.0),
            _ => Err(format!("--rhos: {r:?} is not a percentage in (0, 100]")),
        })
        .collect::<Res<_>>()?;
    let base = 1u64 << 20;
    let top = volumes.iter().copied().max().ok_or("--volumes is empty")?;
    let size = base + top + (1 << 20);
    ensure_file(&path, size)?;
    let file = StorageFile::open(&path)
        .map_err(|e| format!("{e} (the file must be on a filesystem with O_DIRECT)"))?;
    let mut data = vec![0u8; size as usize];
    File::open(&path)
        .and_then(|f| f.read_exact_at(&mut data, 0))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mem = HostMemory::new(top as usize).map_err(|e| e.to_string())?;
    mem.write_at(0, &vec![0u8; top as usize])
        .map_err(|e| e.to_string())?;
    let engine = Engine::new(Config::from_env().map_err(|e| e.to_string())?, None);
    // Outside the timings: the device's geometry (calibrated on the first
    // large read), the strided constants, the rings and slots.
    engine
        .prepare(&file, base, top as usize)
        .map_err(|e| e.to_string())?;
    if a.calibrate {
        engine
            .strided()
            .calibrate(Some(&file), &mem)
            .map_err(|e| e.to_string())?;
    }
    let handle_path = engine
        .handle(&file, &mem)
        .map_err(|e| e.to_string())?
        .path();
    let constants = engine.strided().constants(Some(&file), &mem, handle_path);
    println!(
        "strided: {} on the {handle_path} path into the host-memory device; {}",
        path.display(),
        constants.describe()
    );
    println!(
        "| Volume | Run | rho | Runs | SC (I) | TaT (I) | RC (V) | AUTO packed (I) | AUTO strided (V) | AUTO packed / best SC, TaT (its mode's) | AUTO strided / best (its mode's) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    let mut got = Vec::new();
    let abbrev = |m: StridedMode| match m {
        StridedMode::Sc => "SC",
        StridedMode::Tat => "TaT",
        StridedMode::Rc => "RC",
        StridedMode::Auto => "AUTO",
    };
    for &volume in &volumes {
        // Small volumes take milliseconds: more rounds, up to 50, so that
        // their medians are as steady as the larger ones'.
        let reps = if volume >= 256 << 20 {
            a.reps_large.max(1)
        } else {
            let scale = ((64u64 << 20) / volume.max(1)).max(1) as usize;
            (a.reps.max(1) * scale).min(50).max(a.reps.max(1))
        };
        for &run in &runs {
            for &rho in &rhos {
                let Some(shape) = cell_shape(base, volume, run, rho) else {
                    println!(
                        "| {} | {} | {:.0} % | - | fewer than two runs fit | | | | | | |",
                        human(volume),
                        human(run),
                        rho * 100.0
                    );
                    continue;
                };
                let mut times = vec![Vec::new(); STRIDED_CONTENDERS.len()];
                let mut chose = [None, None];
                // Each round starts with the next contender, so that none
                // always follows the same one.
                for rep in 0..reps {
                    let k = STRIDED_CONTENDERS.len();
                    for i in (0..k).map(|j| (j + rep) % k) {
                        let c = &STRIDED_CONTENDERS[i];
                        // A failure, with the cell and the contender.
                        let failed = |e: &dyn std::fmt::Display| {
                            format!(
                                "{} {} rho {rho}, {}: {e}",
                                human(volume),
                                human(run),
                                c.name
                            )
                        };
                        let t = Instant::now();
                        let r = engine
                            .strided()
                            .read(&file, &shape, MemRange::whole(&mem), c.layout, c.mode)
                            .map_err(|e| failed(&e))?;
                        times[i].push(t.elapsed().as_secs_f64());
                        check_strided(
                            &mem,
                            &shape,
                            c.layout,
                            r.mode == StridedMode::Rc,
                            &data,
                            &mut got,
                        )
                        .map_err(|e| failed(&e))?;
                        if c.mode == StridedMode::Auto {
                            chose[i - 3] = Some(r);
                        }
                    }
                }
                let med: Vec<f64> = times.into_iter().map(median).collect();
                let best = med[..3].iter().copied().fold(f64::INFINITY, f64::min);
                let best_packed = med[0].min(med[1]);
                let [Some(ap), Some(as_)] = chose else {
                    return Err("no AUTO run".into());
                };
                // The median of the column of the mode AUTO chose: how good
                // the choice is, apart from how its own runs went.
                let column = |m: StridedMode| match m {
                    StridedMode::Sc => med[0],
                    StridedMode::Tat => med[1],
                    StridedMode::Rc | StridedMode::Auto => med[2],
                };
                println!(
                    "| {} | {} | {:.0} % | {} | {} | {} | {} | {} ({}) | {} ({}) | {:.2} ({:.2}) | {:.2} ({:.2}) |",
                    human(shape.bounding_len()),
                    human(run),
                    shape.rho() * 100.0,
                    shape.runs(),
                    ms(med[0]),
                    ms(med[1]),
                    ms(med[2]),
                    ms(med[3]),
                    abbrev(ap.mode),
                    ms(med[4]),
                    abbrev(as_.mode),
                    med[3] / best_packed,
                    column(ap.mode) / best_packed,
                    med[4] / best,
                    column(as_.mode) / best,
                );
                rows.push(json!({
                    "volume": shape.bounding_len(),
                    "run": run,
                    "rho": shape.rho(),
                    "runs": shape.runs(),
                    "interest": shape.bytes(),
                    "reps": reps,
                    "sc_s": med[0],
                    "tat_s": med[1],
                    "rc_s": med[2],
                    "auto_packed_s": med[3],
                    "auto_packed_mode": ap.mode.to_string(),
                    "auto_packed_reason": ap.reason,
                    "auto_strided_s": med[4],
                    "auto_strided_mode": as_.mode.to_string(),
                    "auto_strided_reason": as_.reason,
                    "space": {"sc": shape.bytes(), "tat": shape.bytes(), "rc": shape.bounding_len(),
                              "auto_packed": shape.bytes(), "auto_strided": shape.bounding_len()},
                }));
            }
        }
    }
    json_out["strided"] = json!({ "constants": constants.describe(), "cells": rows });
    Ok(())
}
