//! `bench storage`: the storage limit first (fio, io_uring, `O_DIRECT`,
//! swept over block size, depth, fixed buffers and huge pages on the same
//! file) and the bounce pipeline's best chunk and depth (a smaller sweep);
//! then, interleaved, fio at the limit's settings and at the bench's, the
//! pipeline at the bench's, the limit's and its own best settings, the
//! engine as AUTO configures it, and the serial approach (`O_DIRECT` reads
//! of the whole range into one host buffer, then one copy), all reading
//! sequentially into the host-memory device (or, with `--accel`,
//! accelerator memory), as ratios to the limit; every contender's data is
//! checked against the file.

use std::{
    fs::File,
    os::unix::fs::{FileExt, OpenOptionsExt},
    sync::Arc,
    time::Instant,
};

use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{Config, Engine, PathPref, StorageFile},
    MemRange, Module,
};
use serde_json::{json, Value};

use super::{
    common::{drop_cached, ensure_file, gib_s, median, BenchArgs, Res},
    fio::{fio, fio_limit, FioSettings},
};

fn engine(path: PathPref, bs: u64, depth: usize, module: Option<Arc<Module>>) -> Engine {
    Engine::new(
        Config {
            path,
            chunk: Some(bs as usize),
            depth: Some(depth),
            ..Config::default()
        },
        module,
    )
}

/// Bytes a serial read asks for at a time: large enough that the kernel
/// keeps many requests in flight for it, as a plain program's big `pread`s
/// would.
const SERIAL_PIECE: usize = 16 << 20;

/// The serial approach, as a straightforward program would do it: the
/// whole range into one host buffer (`buf`, page aligned) by `O_DIRECT`
/// `pread`s of [`SERIAL_PIECE`] bytes, then one copy into device memory.
fn serial(direct: &File, buf: &mut [u8], dst: &dyn DeviceMemory) -> Res<()> {
    let mut pos = 0;
    while pos < buf.len() {
        let n = SERIAL_PIECE.min(buf.len() - pos);
        match direct.read_at(&mut buf[pos..pos + n], pos as u64) {
            Ok(0) => return Err(format!("serial read: end of file at {pos}")),
            Ok(got) => pos += got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("serial read at {pos}: {e}")),
        }
    }
    dst.write_at(0, buf).map_err(|e| e.to_string())
}

/// Fills device memory with a byte that the file does not hold in whole
/// MiBs, so that a contender that wrote nothing fails the check.
fn poison(dst: &dyn DeviceMemory) -> Res<()> {
    let junk = vec![0xA5u8; 1 << 20];
    for off in (0..dst.len()).step_by(junk.len()) {
        let n = junk.len().min(dst.len() - off);
        dst.write_at(off, &junk[..n]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Compares device memory with the file's bytes, read without the library.
fn verify(dst: &dyn DeviceMemory, want: &[u8], who: &str) -> Res<()> {
    let mut got = vec![0u8; 1 << 20];
    for off in (0..want.len()).step_by(got.len()) {
        let n = got.len().min(want.len() - off);
        dst.read_at(off, &mut got[..n]).map_err(|e| e.to_string())?;
        if got[..n] != want[off..off + n] {
            return Err(format!(
                "{who}: the data differs from the file at offset {off}"
            ));
        }
    }
    Ok(())
}

/// One contender of the storage bench.
enum Contender {
    /// fio at these settings.
    Fio(FioSettings),
    /// The engine.
    Engine(Box<Engine>),
    /// Read everything into a host buffer, then copy once.
    Serial,
}

pub(super) fn storage(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let path = a
        .file
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("p2pdma-bench.dat"));
    ensure_file(&path, a.size)?;
    let file = StorageFile::open(&path)
        .map_err(|e| format!("{e} (the file must be on a filesystem with O_DIRECT)"))?;
    let len = a.size as usize;
    // The destination: the host-memory device, or accelerator 0's memory.
    let module = match a.accel {
        true => Some(Arc::new(Module::open().map_err(|e| {
            format!("--accel: {e} (the p2pdma module must be loaded)")
        })?)),
        false => None,
    };
    let dst: Box<dyn DeviceMemory> = match &module {
        Some(m) => {
            let index = m
                .accelerators()
                .map_err(|e| e.to_string())?
                .first()
                .ok_or("--accel: no accelerator bound to the module")?
                .index;
            Box::new(
                ModuleMemory::alloc(m.clone(), index, a.size, 0)
                    .map_err(|e| format!("--accel: {} bytes of accelerator memory: {e}", a.size))?,
            )
        }
        None => Box::new(HostMemory::new(len).map_err(|e| e.to_string())?),
    };
    let dst = dst.as_ref();
    let range = MemRange::new(dst, 0, len).map_err(|e| e.to_string())?;
    // The file's bytes, read without the library, to check every contender.
    let mut want = vec![0u8; len];
    File::open(&path)
        .and_then(|f| f.read_exact_at(&mut want, 0))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // Every contender reads the storage: nothing of the file stays in the
    // page cache (direct reads put nothing there), so AUTO, which takes
    // what is cached from there, reads the device like the others.
    drop_cached(&path)?;
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut serial_buf = vec![0u8; len + 4096];
    let align = serial_buf.as_ptr().align_offset(4096);
    let serial_buf = &mut serial_buf[align..align + len];

    // The limit first: fio at its best on this file.
    let (limit, sweep) = fio_limit(&path, a.size)?;
    // The engine's own best: a sweep of the bounce pipeline, one read each.
    let mut engine_sweep = Vec::new();
    for chunk in [1u64 << 20, 2 << 20, 4 << 20] {
        for depth in [4, 8, 16] {
            let e = engine(PathPref::Bounce, chunk, depth, None);
            e.read(&file, 0, range).map_err(|e| e.to_string())?;
            let t = Instant::now();
            e.read(&file, 0, range).map_err(|e| e.to_string())?;
            engine_sweep.push(((chunk, depth), gib_s(a.size, t.elapsed())));
        }
    }
    engine_sweep.sort_by(|x, y| y.1.total_cmp(&x.1));
    let (best_bs, best_depth) = engine_sweep[0].0;
    // AUTO as `copy` runs it: the configuration, the environment and the
    // geometry learned for the device (calibrated on first use).
    let auto_cfg = Config::from_env().map_err(|e| e.to_string())?;
    let auto = Engine::new(auto_cfg, module.clone());
    auto.prepare(&file, 0, len).map_err(|e| e.to_string())?;
    let auto_geometry = auto.geometry(&file, len);
    let auto_path = auto.choose(&file, dst).map_err(|e| e.to_string())?;

    let same = FioSettings {
        bs: a.bs,
        depth: a.depth,
        fixedbufs: false,
        huge: true,
    };
    let contenders: Vec<(String, &str, Contender)> = vec![
        (
            "fio at the limit's settings".into(),
            "fio_limit",
            Contender::Fio(limit),
        ),
        (
            format!("fio at bs {} KiB, depth {}", a.bs >> 10, a.depth),
            "fio_same_settings",
            Contender::Fio(same),
        ),
        (
            format!("pipeline, bs {} KiB, depth {}", a.bs >> 10, a.depth),
            "pipeline",
            Contender::Engine(Box::new(engine(PathPref::Bounce, a.bs, a.depth, None))),
        ),
        (
            format!(
                "pipeline at the limit's {} KiB x {}",
                limit.bs >> 10,
                limit.depth
            ),
            "pipeline_at_limit",
            Contender::Engine(Box::new(engine(
                PathPref::Bounce,
                limit.bs,
                limit.depth,
                None,
            ))),
        ),
        (
            format!(
                "pipeline at its best {} KiB x {}",
                best_bs >> 10,
                best_depth
            ),
            "pipeline_best",
            Contender::Engine(Box::new(engine(
                PathPref::Bounce,
                best_bs,
                best_depth,
                None,
            ))),
        ),
        (
            format!(
                "engine AUTO, {} KiB x {} ({})",
                auto_geometry.geometry.chunk >> 10,
                auto_geometry.geometry.depth,
                auto_path.path
            ),
            "engine_auto",
            Contender::Engine(Box::new(auto)),
        ),
        (
            "serial (read all, then one copy)".into(),
            "serial",
            Contender::Serial,
        ),
    ];
    let run = |c: &Contender, serial_buf: &mut [u8]| -> Res<(f64, usize)> {
        let t = Instant::now();
        let threads = match c {
            Contender::Fio(st) => return Ok((fio(&path, a.size, *st)?, 0)),
            Contender::Engine(e) => {
                e.read(&file, 0, range)
                    .map_err(|e| e.to_string())?
                    .copy_threads
            }
            Contender::Serial => {
                serial(&direct, serial_buf, dst)?;
                1
            }
        };
        Ok((gib_s(a.size, t.elapsed()), threads))
    };
    // A first, untimed run of every contender that moves data into the
    // memory: it sets up rings and slots, faults the memory in, and its
    // result is checked against the file.
    for (name, _, c) in &contenders {
        if !matches!(c, Contender::Fio(_)) {
            poison(dst)?;
            run(c, serial_buf)?;
            verify(dst, &want, name)?;
        }
    }
    // Interleaved repetitions, each in an order of its own (shuffled, the
    // same in every run of the bench), so that no contender always runs
    // first, last, or right after the same other: what one run leaves
    // behind (the target's state, the network's) falls on all alike.
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    let mut threads = vec![0usize; contenders.len()];
    let mut rng = fastrand::Rng::with_seed(0x5EED);
    for _ in 0..a.reps.max(1) {
        let mut order: Vec<usize> = (0..contenders.len()).collect();
        rng.shuffle(&mut order);
        for i in order {
            let (x, t) = run(&contenders[i].2, serial_buf)?;
            results[i].push(x);
            threads[i] = threads[i].max(t);
        }
    }
    // The engine's data once more, after the timed runs.
    for (name, _, c) in &contenders {
        if matches!(c, Contender::Engine(_)) {
            poison(dst)?;
            run(c, serial_buf)?;
            verify(dst, &want, name)?;
        }
    }
    println!(
        "storage: sequential read of {} MiB into {}, {} reps interleaved, file {}",
        a.size >> 20,
        dst.kind(),
        a.reps,
        path.display()
    );
    println!(
        "  the storage limit: fio (io_uring, O_DIRECT, same file) at its best of {} settings: {limit}",
        sweep.len()
    );
    let mut ranked = sweep.clone();
    ranked.sort_by(|x, y| y.1.total_cmp(&x.1));
    for (st, x) in ranked.iter().take(3) {
        println!("    fio sweep:      {x:8.3} GiB/s  {st}");
    }
    for ((bs, depth), x) in engine_sweep.iter().take(3) {
        println!(
            "    pipeline sweep: {x:8.3} GiB/s  chunk {} KiB, depth {depth}",
            bs >> 10
        );
    }
    println!(
        "  engine AUTO: {} KiB x {}, {}; path {}: {}",
        auto_geometry.geometry.chunk >> 10,
        auto_geometry.geometry.depth,
        auto_geometry.reason,
        auto_path.path,
        auto_path.reason
    );
    println!("  every engine run's data and the serial run's were checked against the file");
    println!(
        "  GiB/s                                          median     best    worst  copy threads"
    );
    for ((name, _, _), (v, t)) in contenders.iter().zip(results.iter().zip(&threads)) {
        let (lo, hi) = spread(v);
        let t = match t {
            0 => String::new(),
            t => t.to_string(),
        };
        println!(
            "  {name:45} {:8.3} {hi:8.3} {lo:8.3}  {t}",
            median(v.to_vec())
        );
    }
    let f = &results[0];
    let (fm, fb, fw) = (median(f.clone()), spread(f).1, spread(f).0);
    println!("  ratio to the limit                             median     best    worst   paired");
    let mut r = json!({
        "bytes": a.size,
        "memory": dst.kind().to_string(),
        "limit": {
            "bs": limit.bs, "depth": limit.depth, "fixedbufs": limit.fixedbufs,
            "huge_pages": limit.huge, "gib_s": fm, "best_gib_s": fb, "worst_gib_s": fw,
        },
        "sweep": ranked.iter().map(|(st, x)| json!({
            "bs": st.bs, "depth": st.depth, "fixedbufs": st.fixedbufs,
            "huge_pages": st.huge, "gib_s": x,
        })).collect::<Vec<_>>(),
        "pipeline_sweep": engine_sweep.iter().map(|((bs, depth), x)| json!({
            "chunk": bs, "depth": depth, "gib_s": x,
        })).collect::<Vec<_>>(),
        "engine_auto_geometry": {
            "chunk": auto_geometry.geometry.chunk,
            "depth": auto_geometry.geometry.depth,
            "reason": auto_geometry.reason,
            "path": auto_path.path.to_string(),
        },
    });
    for (((name, key, _), v), t) in contenders.iter().zip(&results).zip(&threads).skip(1) {
        let (lo, hi) = spread(v);
        let (m, b, w) = (median(v.to_vec()) / fm, hi / fb, lo / fw);
        let p = paired(v, f);
        println!("  {name:45} {m:8.3} {b:8.3} {w:8.3} {p:8.3}");
        r[*key] = json!({
            "label": name, "gib_s": median(v.to_vec()), "best_gib_s": hi, "worst_gib_s": lo,
            "vs_limit": m, "vs_limit_best": b, "vs_limit_worst": w, "vs_limit_paired": p,
            "runs": v,
        });
        if *t > 0 {
            r[*key]["copy_threads"] = json!(t);
        }
    }
    json_out["storage"] = r;
    Ok(())
}

/// The median of `v`'s runs each divided by the limit's run of the same
/// repetition (`limit`): the two ran a few seconds apart, so a machine
/// that slows down and speeds up over minutes moves both.
fn paired(v: &[f64], limit: &[f64]) -> f64 {
    median(v.iter().zip(limit).map(|(x, l)| x / l).collect())
}

/// The lowest and highest of `v` (not empty).
fn spread(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}
