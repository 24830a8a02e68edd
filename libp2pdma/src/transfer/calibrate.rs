//! Calibration of a device's chunk geometry: storage throughput measured
//! on the file itself, for AUTO to learn from.

use std::time::Instant;

use super::{
    storage::StorageFile,
    tuning::geometry::{Learned, Plan, Sample},
};
use crate::{
    sys::uring::{Buf, Context, Session},
    Error, Result,
};

/// Storage throughput of reads of `file` in `ctx`'s geometry: `len` bytes
/// from `at` (block aligned), `depth` chunk reads in flight into bounce
/// slots, no copies; timed from the first submission to the last
/// completion.
pub(crate) fn measure(ctx: &mut Context, file: &StorageFile, at: u64, len: usize) -> Result<f64> {
    let chunk = ctx.chunk();
    let nchunks = len.div_ceil(chunk) as u64;
    let mut s = Session::new(
        ctx,
        file.fd()?,
        file.block_size(),
        None::<(crate::memory::DmaTarget, &())>,
    );
    let (mut next, mut done) = (0u64, 0u64);
    let start = Instant::now();
    while done < nchunks {
        while next < nchunks && s.inflight() < s.depth() {
            let Some(slot) = s.free_slot() else { break };
            let c0 = at + next * chunk as u64;
            let clen = chunk.min(len - (next as usize) * chunk);
            s.read(Buf::Slot(slot), c0, clen, next)?;
            next += 1;
        }
        for c in s.wait(1)? {
            let c0 = c.tag as usize * chunk;
            let want = chunk.min(len - c0);
            let n = c
                .res
                .map_err(|e| file.io_error("calibration read", at, len as u64, e))?;
            if n < want {
                return Err(Error::Short {
                    what: "calibration read",
                    expected: want as u64,
                    done: n as u64,
                });
            }
            done += 1;
        }
    }
    Ok(len as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

/// Times `plan`'s candidates (the facts' choice first) on `file` from
/// `at`, where `len` bytes can be read: two rounds of one sample per
/// candidate, each sample the next `plan.sample` bytes of the range
/// (wrapping around), the best of the rounds kept, no sample started after
/// `plan.budget`. Returns the choice ([`Plan::pick`]) and every result;
/// `None` when no candidate could be measured.
pub(crate) fn calibrate(
    file: &StorageFile,
    at: u64,
    len: usize,
    plan: &Plan,
) -> Option<(Learned, Vec<Sample>)> {
    let cands = &plan.candidates;
    let sample = plan.sample.min(len);
    let regions = (len / sample.max(1)).max(1);
    let mut ctxs: Vec<Option<Context>> = cands
        .iter()
        .map(|g| Context::new(g.depth, g.chunk).ok())
        .collect();
    let mut best = vec![0.0f64; cands.len()];
    let start = Instant::now();
    'rounds: for round in 0..2 {
        for (i, ctx) in ctxs.iter_mut().enumerate() {
            if start.elapsed() > plan.budget {
                break 'rounds;
            }
            let Some(ctx) = ctx else { continue };
            let region = ((round * cands.len() + i) % regions) as u64;
            match measure(ctx, file, at + region * sample as u64, sample) {
                Ok(r) => best[i] = best[i].max(r),
                Err(_) => return None,
            }
        }
    }
    let samples: Vec<Sample> = cands
        .iter()
        .zip(&best)
        .map(|(&geometry, &bytes_per_s)| Sample {
            geometry,
            bytes_per_s,
        })
        .collect();
    plan.pick(&samples).map(|l| (l, samples))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use crate::{
        discovery::{fake::TempDir, NvmePath, Transport},
        memory::{DeviceMemory, HostMemory},
        transfer::{
            tuning::geometry::{self, DeviceKey, Reach},
            Config, Engine, PageCache, PathPref, StorageFile,
        },
        MemRange,
    };

    const MIB: usize = 1 << 20;

    fn over_tcp() -> NvmePath {
        NvmePath {
            name: "nvme4c4n1".into(),
            controller: Some("nvme4".into()),
            pci: None,
            transport: Some(Box::new(Transport {
                kind: "tcp".into(),
                address: Some("traddr=10.0.2.2,trsvcid=4420".into()),
                subsysnqn: Some("nqn.2026-11.io.p2pdma:remote".into()),
                state: Some("live".into()),
            })),
        }
    }

    fn engine(cache: &std::path::Path) -> Engine {
        Engine::new(
            Config {
                path: PathPref::Bounce,
                page_cache: PageCache::Direct,
                cache_dir: Some(cache.to_path_buf()),
                ..Config::default()
            },
            None,
        )
    }

    #[test]
    fn a_namespace_over_a_network_calibrates_on_its_first_32_mib_read() {
        let dir = TempDir::new("calibrate-network");
        let path = dir.path().join("remote");
        let data: Vec<u8> = (0..40 * MIB)
            .map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8 ^ (i >> 12) as u8)
            .collect();
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        let key = DeviceKey::from_parts("259:7", "Linux", "remote-1").unwrap();
        let open = |network: bool| {
            let mut file = StorageFile::open(&path).unwrap();
            file.key = Some(key.clone());
            if network {
                file.fabric = Some(over_tcp());
            }
            file
        };
        let (local, remote) = (open(false), open(true));
        assert_eq!(
            (local.reach(), remote.reach()),
            (Reach::Local, Reach::Network)
        );
        let mem = HostMemory::new(32 * MIB).unwrap();
        let cache = dir.path().join("cache");
        let cache_file = geometry::Cache::in_dir(&cache);
        let read = |e: &Engine, file: &StorageFile, at: usize, len: usize| {
            e.read(file, at as u64, MemRange::new(&mem, 0, len).unwrap())
                .unwrap();
            let mut got = vec![0u8; len];
            mem.read_at(0, &mut got).unwrap();
            assert!(got == data[at..at + len], "bytes at {at}+{len}");
        };

        // A local device is not calibrated by a 32 MiB read.
        let e = engine(&cache);
        read(&e, &local, 0, 32 * MIB);
        assert_eq!(cache_file.lookup(&key), None);
        // Over a network, a read whose aligned part is under 32 MiB is not
        // either; one of 32 MiB is, and what it learned is kept.
        let e = engine(&cache);
        read(&e, &remote, 4096, 32 * MIB - 4096);
        assert_eq!(cache_file.lookup(&key), None);
        assert!(e.geometry(&remote, 32 * MIB).reason.contains("facts"));
        read(&e, &remote, 8 * MIB, 32 * MIB);
        let learned = cache_file.lookup(&key).expect("calibration was stored");
        let plan = geometry::plan(&remote.disk, Reach::Network, 32 * MIB).unwrap();
        assert!(plan.candidates.contains(&learned.geometry), "{learned:?}");
        assert!(learned.bytes_per_s > 0.0);
        let now = e.geometry(&remote, 32 * MIB);
        assert_eq!(now.geometry, learned.geometry);
        assert!(
            now.reason.contains("learned by calibration"),
            "{}",
            now.reason
        );
        // Another engine starts from it, and its reads land.
        let e2 = engine(&cache);
        assert_eq!(e2.geometry(&remote, 32 * MIB).geometry, learned.geometry);
        read(&e2, &remote, 0, 32 * MIB);
    }
}
