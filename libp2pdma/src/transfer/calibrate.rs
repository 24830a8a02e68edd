//! Calibration of a device's chunk geometry: storage throughput measured
//! on the file itself, for AUTO to learn from.

use std::time::Instant;

use super::{
    storage::StorageFile,
    tuning::geometry::{pick, Geometry, Learned, Sample, BUDGET, SAMPLE},
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

/// Times `cands` (the facts' choice first) on `file` from `at`, where
/// `len` bytes can be read: two rounds of one 64 MiB sample per candidate,
/// each sample the next 64 MiB of the range (wrapping around), the best of
/// the rounds kept. Returns the choice (see [`pick`]) and every result;
/// `None` when no candidate could be measured.
pub(crate) fn calibrate(
    file: &StorageFile,
    at: u64,
    len: usize,
    cands: &[Geometry],
) -> Option<(Learned, Vec<Sample>)> {
    let regions = (len / SAMPLE).max(1);
    let mut ctxs: Vec<Option<Context>> = cands
        .iter()
        .map(|g| Context::new(g.depth, g.chunk).ok())
        .collect();
    let mut best = vec![0.0f64; cands.len()];
    let start = Instant::now();
    'rounds: for round in 0..2 {
        for (i, ctx) in ctxs.iter_mut().enumerate() {
            if start.elapsed() > BUDGET {
                break 'rounds;
            }
            let Some(ctx) = ctx else { continue };
            let region = ((round * cands.len() + i) % regions) as u64;
            match measure(ctx, file, at + region * SAMPLE as u64, SAMPLE.min(len)) {
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
    pick(&samples).map(|l| (l, samples))
}
