//! The pool under load: allocating until `ENOMEM`, twice, and threads
//! allocating, mapping and freeing at once.

use std::{collections::HashSet, thread};

use rustix::io::Errno;

use super::{Ctx, Why, KIB, MIB, PAGE, R};
use crate::util::{first_difference, pattern};

impl Ctx {
    pub(super) fn exhaustion(&self) -> R {
        let start = self.available()?;
        let limit = self.accel.p2p_size / MIB + 2;
        let round = |n: u32| -> Result<u64, Why> {
            let mut held = Vec::new();
            let err = loop {
                match self.module.alloc(self.dev, MIB, 0) {
                    Ok(a) => held.push(a),
                    Err(e) => break e,
                }
                if held.len() as u64 > limit {
                    fail!(
                        "round {n}: {} 1 MiB allocations from a {}-byte device and still no ENOMEM",
                        held.len(),
                        self.accel.p2p_size
                    );
                }
            };
            ensure!(
                err.errno() == Some(Errno::NOMEM),
                "round {n}: ALLOC ended with {err}, expected ENOMEM"
            );
            let left = self.available()?;
            ensure!(
                left < MIB,
                "round {n}: ENOMEM after {} allocations with {left} bytes still free",
                held.len()
            );
            ensure!(
                start.checked_sub(left) == Some(held.len() as u64 * MIB),
                "round {n}: {} allocations of 1 MiB took {} bytes",
                held.len(),
                start as i128 - left as i128
            );
            Ok(held.len() as u64)
        };
        let first = round(1)?;
        self.leak_check()?;
        let second = round(2)?;
        ensure!(
            first == second,
            "{first} allocations before ENOMEM, {second} after freeing them all"
        );
        ensure!(first >= 1, "not even one 1 MiB allocation");
        self.leak_check()
    }

    pub(super) fn threads(&self) -> R {
        const THREADS: u64 = 8;
        const ROUNDS: u64 = 50;
        let results: Vec<Result<Vec<u64>, String>> = thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    s.spawn(move || -> Result<Vec<u64>, String> {
                        let mut handles = Vec::new();
                        for i in 0..ROUNDS {
                            let size = (t + 1) * 4 * KIB + (i % 3) * PAGE;
                            let seed = (t << 32) | i;
                            let a = self
                                .module
                                .alloc(self.dev, size, 0)
                                .map_err(|e| format!("thread {t} round {i}: {e}"))?;
                            handles.push(a.handle());
                            let map = a.map().map_err(|e| format!("thread {t} round {i}: {e}"))?;
                            let data = pattern(seed, 0, map.len());
                            map.write_at(0, &data).map_err(|e| e.to_string())?;
                            let mut back = vec![0u8; map.len()];
                            map.read_at(0, &mut back).map_err(|e| e.to_string())?;
                            if let Some(d) = first_difference(&data, &back) {
                                return Err(format!("thread {t} round {i}: {d}"));
                            }
                            drop(map);
                            a.free().map_err(|e| format!("thread {t} round {i}: {e}"))?;
                        }
                        Ok(handles)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                .collect()
        });
        let mut seen = HashSet::new();
        for r in results {
            for h in r? {
                ensure!(seen.insert(h), "handle {h} was issued twice");
            }
        }
        ensure!(
            seen.len() as u64 == THREADS * ROUNDS,
            "{} handles",
            seen.len()
        );
        self.leak_check()
    }
}
