//! `bench cpu`: CPU time per GiB moved from an NVMe namespace into
//! accelerator memory, per path (needs the module; meant for the VM rig,
//! where the emulated devices' DMA runs outside the guest); beside them, fio
//! reading the same range at the same block size and depth into host
//! memory, where fio is installed.

use std::{fs::File, os::unix::fs::FileExt, sync::Arc, time::Instant};

use p2pdma::{
    memory::{DeviceMemory, ModuleMemory},
    transfer::{Config, Engine, P2pSubmit, PageCache, PathPref, StorageFile},
    MemRange, Module,
};
use serde_json::{json, Value};

use super::{
    common::{cpu_time, first_accelerator, idle_time, median, BenchArgs, Res},
    fio::{self, FioSettings},
};

/// One way of moving the data, for `cpu`.
struct CpuCase {
    name: &'static str,
    pref: PathPref,
    submit: P2pSubmit,
}

pub(super) fn cpu(a: &BenchArgs, json_out: &mut Value) -> Res<()> {
    let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
    let accel = first_accelerator(&module)?;
    let file = StorageFile::open(&a.nvme).map_err(|e| e.to_string())?;
    let len =
        (a.size.min(file.size()) as usize).min(accel.p2p_available as usize / 2) / 4096 * 4096;
    let mem = ModuleMemory::alloc(module.clone(), accel.index, len as u64, 0)
        .map_err(|e| e.to_string())?;
    let range = MemRange::new(&mem, 0, len).map_err(|e| e.to_string())?;
    let reps = a.reps.max(1);
    println!(
        "cpu: CPU time per GiB read from {} into accelerator {} memory, {} MiB x {reps} transfers per path in 3 interleaved rounds, bs {} KiB, depth {}",
        a.nvme.display(),
        accel.pci,
        len >> 20,
        a.bs >> 10,
        a.depth
    );
    let cases = [
        CpuCase {
            name: "p2p, module block I/O",
            pref: PathPref::P2p,
            submit: P2pSubmit::Auto,
        },
        CpuCase {
            name: "p2p, O_DIRECT (pins per I/O)",
            pref: PathPref::P2p,
            submit: P2pSubmit::Odirect,
        },
        CpuCase {
            name: "nvme-cmd",
            pref: PathPref::NvmeCmd,
            submit: P2pSubmit::Auto,
        },
        CpuCase {
            name: "bounce",
            pref: PathPref::Bounce,
            submit: P2pSubmit::Auto,
        },
    ];
    let engines: Vec<Engine> = cases
        .iter()
        .map(|c| {
            Engine::new(
                Config {
                    path: c.pref,
                    chunk: Some(a.bs as usize),
                    depth: Some(a.depth),
                    p2p_submit: c.submit,
                    // The device paths themselves: the bytes were just read
                    // through the page cache (the reference), which AUTO
                    // would copy from instead.
                    page_cache: PageCache::Direct,
                    ..Config::default()
                },
                Some(module.clone()),
            )
        })
        .collect();
    // What every path must land: the memory is poisoned before each
    // path's first transfer and compared after it.
    let mut want = vec![0u8; len];
    File::open(&a.nvme)
        .and_then(|f| f.read_exact_at(&mut want, 0))
        .map_err(|e| format!("{}: {e}", a.nvme.display()))?;
    let gib = len as f64 / (1u64 << 30) as f64;
    // Each case runs a block of transfers in turn, several rounds: a block
    // is long enough for the idle clock's 10 ms units. Per case and round:
    // process CPU s/GiB, machine CPU s/GiB, GiB/s.
    const ROUNDS: usize = 3;
    let per_round = reps.div_ceil(ROUNDS);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut runs: Vec<[Vec<f64>; 3]> = cases.iter().map(|_| Default::default()).collect();
    let mut ran_as = vec![String::new(); cases.len()];
    // Paths the storage does not have (NVMe commands on an md array, say)
    // are left out, with the reason.
    let mut absent: Vec<Option<String>> = vec![None; cases.len()];
    let with_fio = fio::have_fio();
    let mut fio_runs: [Vec<f64>; 3] = Default::default();
    for round in 0..ROUNDS {
        if with_fio {
            let r = fio_round(a, len as u64, per_round, cpus)?;
            (0..3).for_each(|k| fio_runs[k].push(r[k]));
        }
        for (i, e) in engines.iter().enumerate() {
            if absent[i].is_some() {
                continue;
            }
            if round == 0 {
                // The data each path lands must be the namespace's.
                let poison = vec![0xA5u8; 1 << 20];
                for off in (0..len).step_by(poison.len()) {
                    let n = poison.len().min(len - off);
                    mem.write_at(off, &poison[..n]).map_err(|e| e.to_string())?;
                }
                let report = match e.read(&file, 0, range) {
                    Err(p2pdma::Error::PathUnavailable { reason, .. }) => {
                        absent[i] = Some(reason);
                        continue;
                    }
                    r => r.map_err(|e| e.to_string())?,
                };
                let mut got = vec![0u8; len];
                mem.read_at(0, &mut got).map_err(|e| e.to_string())?;
                if let Some(at) = got.iter().zip(&want).position(|(g, w)| g != w) {
                    return Err(format!(
                        "{}: the memory differs from the namespace at byte {at}",
                        cases[i].name
                    ));
                }
                let st = e.stats().of(report.path).snapshot();
                ran_as[i] = format!(
                    "{}{}",
                    report.path,
                    if st.module_ios > 0 {
                        ", module I/O"
                    } else {
                        ""
                    }
                );
            }
            let (c0, i0, t0) = (cpu_time(), idle_time()?, Instant::now());
            for _ in 0..per_round {
                e.read(&file, 0, range).map_err(|e| e.to_string())?;
            }
            let wall = t0.elapsed();
            let (idle, cpu) = (idle_time()?.saturating_sub(i0), cpu_time() - c0);
            let busy = (wall.as_secs_f64() * cpus - idle.as_secs_f64()).max(0.0);
            let moved = gib * per_round as f64;
            runs[i][0].push(cpu.as_secs_f64() / moved);
            runs[i][1].push(busy / moved);
            runs[i][2].push(moved / wall.as_secs_f64());
        }
    }
    println!(
        "  {ROUNDS} rounds of {per_round}          process CPU s/GiB  machine CPU s/GiB     GiB/s   ran as"
    );
    let mut rows = serde_json::Map::new();
    let med: Vec<[f64; 3]> = runs
        .iter()
        .map(|r| {
            [
                median(r[0].clone()),
                median(r[1].clone()),
                median(r[2].clone()),
            ]
        })
        .collect();
    for (i, c) in cases.iter().enumerate() {
        if let Some(why) = &absent[i] {
            println!("  {:30} not available: {why}", c.name);
            rows.insert(c.name.to_string(), json!({ "not_available": why }));
            continue;
        }
        let [p, m, g] = med[i];
        println!("  {:30} {p:15.3} {m:18.3} {g:9.3}   {}", c.name, ran_as[i]);
        rows.insert(
            c.name.to_string(),
            json!({
                "process_cpu_s_per_gib": p, "machine_cpu_s_per_gib": m, "gib_s": g,
                "ran_as": ran_as[i], "rounds": runs[i],
            }),
        );
    }
    let fio_med = fio_runs.clone().map(median);
    if with_fio {
        let [p, m, g] = fio_med;
        println!(
            "  {:30} {p:15.3} {m:18.3} {g:9.3}   io_uring, O_DIRECT, into host memory",
            "fio"
        );
        rows.insert(
            "fio".into(),
            json!({
                "process_cpu_s_per_gib": p, "machine_cpu_s_per_gib": m, "gib_s": g,
                "rounds": fio_runs,
            }),
        );
    }
    let bounce = med[cases.len() - 1];
    println!("  ratio to bounce (machine CPU, process CPU); the goal is <= 0.5");
    for (i, c) in cases.iter().enumerate().take(cases.len() - 1) {
        if absent[i].is_some() {
            continue;
        }
        let r = |k: usize| {
            if bounce[k] > 0.0 {
                med[i][k] / bounce[k]
            } else {
                f64::NAN
            }
        };
        println!("  {:30} {:7.2} {:7.2}", c.name, r(1), r(0));
    }
    if with_fio {
        println!("  ratio to fio (machine CPU, process CPU)");
        for (i, c) in cases.iter().enumerate() {
            if absent[i].is_some() {
                continue;
            }
            let r = |k: usize| med[i][k] / fio_med[k];
            println!("  {:30} {:7.2} {:7.2}", c.name, r(1), r(0));
        }
    }
    json_out["cpu"] = Value::Object(rows);
    Ok(())
}

/// One round of fio: `len` bytes of the namespace read `times` over at the
/// bench's block size and depth (huge-page buffers, as the engine's bounce
/// slots are); process CPU s/GiB (fio's, from its resource usage), machine
/// CPU s/GiB, GiB/s.
fn fio_round(a: &BenchArgs, len: u64, times: usize, cpus: f64) -> Res<[f64; 3]> {
    use nix::sys::resource::{getrusage, UsageWho};
    let settings = FioSettings {
        bs: a.bs,
        depth: a.depth,
        fixedbufs: false,
        huge: true,
    };
    let mut cmd = fio::sequential(&[a.nvme.as_path()], len, settings);
    cmd.arg(format!("--loops={times}"));
    let children = || -> Res<f64> {
        let u = getrusage(UsageWho::RUSAGE_CHILDREN).map_err(|e| format!("getrusage: {e}"))?;
        let t = |v: nix::sys::time::TimeVal| v.tv_sec() as f64 + v.tv_usec() as f64 / 1e6;
        Ok(t(u.user_time()) + t(u.system_time()))
    };
    let (c0, i0, t0) = (children()?, idle_time()?, Instant::now());
    fio::run(&mut cmd)?;
    let wall = t0.elapsed();
    let (idle, cpu) = (idle_time()?.saturating_sub(i0), children()? - c0);
    let busy = (wall.as_secs_f64() * cpus - idle.as_secs_f64()).max(0.0);
    let moved = len as f64 * times as f64 / (1u64 << 30) as f64;
    Ok([cpu / moved, busy / moved, moved / wall.as_secs_f64()])
}
