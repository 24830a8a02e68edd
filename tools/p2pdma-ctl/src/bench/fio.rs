//! The fio driver: one sequential read of a file by fio with io_uring and
//! `O_DIRECT` at given settings, and the sweep that finds the storage
//! limit.

use std::{path::Path, process::Command};

use serde_json::Value;

use super::common::Res;

/// How fio reads: block size, depth, registered (fixed) buffers, and
/// whether its buffers are in huge pages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct FioSettings {
    pub(super) bs: u64,
    pub(super) depth: usize,
    pub(super) fixedbufs: bool,
    pub(super) huge: bool,
}

impl std::fmt::Display for FioSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bs {} KiB, depth {}{}{}",
            self.bs >> 10,
            self.depth,
            if self.fixedbufs {
                ", fixed buffers"
            } else {
                ""
            },
            if self.huge {
                ", huge-page buffers"
            } else {
                ", 4 KiB-page buffers"
            }
        )
    }
}

/// The storage limit: fio swept over block sizes, depths, fixed buffers
/// and huge pages on the same file; the fastest settings and every result.
pub(super) fn fio_limit(path: &Path, size: u64) -> Res<(FioSettings, Vec<(FioSettings, f64)>)> {
    let mut results = Vec::new();
    let mut last_err = None;
    for bs in [1 << 20, 4 << 20] {
        for depth in [8, 16, 32] {
            for fixedbufs in [false, true] {
                for huge in [false, true] {
                    let st = FioSettings {
                        bs,
                        depth,
                        fixedbufs,
                        huge,
                    };
                    match fio(path, size, st) {
                        Ok(x) => results.push((st, x)),
                        Err(e) => last_err = Some(e),
                    }
                }
            }
        }
    }
    let best = results
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|&(st, _)| st)
        .ok_or_else(|| last_err.unwrap_or_else(|| "fio gave no result".into()))?;
    Ok((best, results))
}

/// fio's sequential read throughput in GiB/s.
///
/// With `huge`, fio's buffers are in transparent huge pages (glibc's
/// `glibc.malloc.hugetlb=1` tunable makes its large `malloc`s ask for them),
/// as the engine's bounce slots are: physically contiguous buffers make each
/// request one DMA segment, which is worth a good part of the throughput on
/// devices with few segments per request.
pub(super) fn fio(path: &Path, size: u64, s: FioSettings) -> Res<f64> {
    fio_parallel(&[path], size, s)
}

/// fio reading every one of `paths` at once, a job each, at settings `s`
/// (see [`fio`]): their summed sequential read throughput in GiB/s.
pub(super) fn fio_parallel(paths: &[&Path], size: u64, s: FioSettings) -> Res<f64> {
    bandwidth(&run(&mut sequential(paths, size, s))?)
}

/// The command of [`fio_parallel`], to run as it is or with more options.
pub(super) fn sequential(paths: &[&Path], size: u64, s: FioSettings) -> Command {
    let mut cmd = Command::new("fio");
    if s.huge {
        cmd.env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1");
    }
    cmd.args([
        "--rw=read",
        "--ioengine=io_uring",
        "--direct=1",
        "--group_reporting",
        "--output-format=json",
    ])
    .arg(format!("--bs={}", s.bs))
    .arg(format!("--iodepth={}", s.depth))
    .arg(format!("--size={size}"))
    .args(s.fixedbufs.then_some("--fixedbufs=1"));
    for (i, p) in paths.iter().enumerate() {
        cmd.arg(format!("--name=member{i}"))
            .arg(format!("--filename={}", p.display()));
    }
    cmd
}

/// Whether fio can be run here.
pub(super) fn have_fio() -> bool {
    Command::new("fio").arg("--version").output().is_ok()
}

/// Runs a fio command with JSON output; its report.
pub(super) fn run(cmd: &mut Command) -> Res<Value> {
    let out = cmd.output().map_err(|e| format!("cannot run fio: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("fio output: {e}"))
}

/// The read throughput of a fio report, in GiB/s.
pub(super) fn bandwidth(v: &Value) -> Res<f64> {
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .ok_or("fio output has no read bandwidth")?;
    Ok(bw / (1u64 << 30) as f64)
}

/// Latency of single reads as fio measures it, in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub(super) struct Latency {
    pub(super) mean: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
}

/// fio's 4 KiB random reads one at a time (`psync`, `O_DIRECT`, depth 1,
/// into host memory) over the first `size` bytes of `path`, `ios` of
/// them: the latency of each, from submission to completion.
pub(super) fn fio_latency(path: &Path, size: u64, ios: usize) -> Res<Latency> {
    let v = run(Command::new("fio")
        .args([
            "--name=latency",
            "--rw=randread",
            "--bs=4096",
            "--iodepth=1",
            "--ioengine=psync",
            "--direct=1",
            "--lat_percentiles=1",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--size={size}"))
        .arg(format!("--io_size={}", ios as u64 * 4096)))?;
    let lat = &v["jobs"][0]["read"]["lat_ns"];
    let get = |x: &Value, what: &str| {
        x.as_f64()
            .ok_or_else(|| format!("fio output has no read latency {what}"))
    };
    Ok(Latency {
        mean: get(&lat["mean"], "mean")?,
        p50: get(&lat["percentile"]["50.000000"], "median")?,
        p99: get(&lat["percentile"]["99.000000"], "99th percentile")?,
    })
}
