//! Mappings made while the accelerator is being unbound: threads loop
//! `DMA_MAP`/`UNMAP` of allocations (for the NVMe, or the accelerator
//! itself where P2P with the NVMe is refused), `PIN_USER` and
//! `DMABUF_IMPORT` for the accelerator as the peer, across unbind and bind
//! cycles. Once an unbind has returned, every `DMA_MAP` mapping of the
//! device's memory must be revoked (a live one maps memory that went back
//! to the device, and its allocation's `FREE` would get `EBUSY` for good);
//! pins and imports made for the device while it went must be revoked or
//! refused, which the debug kernel's DMA-API checks see (a mapping that
//! outlives the driver is reported when the driver is released).

use std::{
    collections::VecDeque,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use p2pdma::{HostBuffer, PciAddress};
use p2pdma_abi as abi;
use rustix::io::Errno;

use super::{
    all, all_or_skip, ename,
    unbind::{Unbinding, UNBIND_DEADLINE},
    Ctx, Suite, Why, KIB, R,
};

/// Unbind and bind cycles.
const CYCLES: u32 = 8;

/// Mappings a worker keeps at once; fewer than a page's pin bound.
const KEEP: usize = 3;

/// What a worker maps.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    DmaMap,
    Pin,
    Import,
}

/// What the workers of one cycle saw.
#[derive(Default)]
struct Log {
    stop: AtomicBool,
    made: AtomicU64,
    refused: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Log {
    fn note(&self, what: String) {
        if let Ok(mut e) = self.errors.lock() {
            if e.len() < 5 {
                e.push(what);
            }
        }
    }
}

impl Ctx {
    /// See the module's documentation.
    pub(super) fn unbind_map_race(&mut self, suite: &mut Suite) {
        let mut totals = (0u64, 0u64);
        let mut results = self.unbind_cycles(CYCLES, |ctx, drv, pci| {
            let (r, unbound, made, refused) = ctx.map_race_cycle(drv, pci);
            totals.0 += made;
            totals.1 += refused;
            (r, unbound)
        });
        if totals.0 == 0 {
            results.push(Err(Why::Fail("no mapping was ever made".into())));
        }
        println!(
            "unbind-map-race: {} mappings made, {} refused while the device went",
            totals.0, totals.1
        );
        suite.report("unbind-map-race", all_or_skip(results));
        suite.case("unbind-map-race-leak", || self.leak_check());
    }

    /// One cycle: the verdict, whether the device ended up unbound, and
    /// how many mappings were made and refused.
    fn map_race_cycle(&self, drv: &Path, pci: PciAddress) -> (R, bool, u64, u64) {
        const LEN: u64 = 64 * KIB;
        let kinds = [
            Kind::DmaMap,
            Kind::DmaMap,
            Kind::DmaMap,
            Kind::Pin,
            Kind::Import,
        ];
        let p2p = matches!(self.nvme_p2p(), Ok(true));
        let map_peer = match (&self.nvme, p2p) {
            (Some(_), true) => self.host_peer(),
            _ => self.self_peer(),
        };
        let mut allocs = Vec::new();
        for _ in 0..kinds.len() {
            match self.module.alloc(self.dev, LEN, 0) {
                Ok(a) => allocs.push(a),
                Err(e) => return (Err(e.into()), false, 0, 0),
            }
        }
        let hosts: Vec<HostBuffer> = match (0..kinds.len())
            .map(|_| HostBuffer::new(LEN as usize))
            .collect::<Result<_, _>>()
        {
            Ok(h) => h,
            Err(e) => return (Err(Why::Fail(format!("host buffer: {e}"))), false, 0, 0),
        };
        let buf = match self.udmabuf(LEN) {
            Ok(b) => b,
            Err(e) => return (Err(e), false, 0, 0),
        };
        let log = Log::default();
        let unbound = Arc::new(AtomicBool::new(false));
        let held: Vec<Mutex<VecDeque<u64>>> =
            kinds.iter().map(|_| Mutex::new(VecDeque::new())).collect();
        let mut verdict = Vec::new();
        let mut gone = true;
        thread::scope(|s| {
            for (w, &kind) in kinds.iter().enumerate() {
                let (log, held, a, host, buf) = (&log, &held[w], &allocs[w], &hosts[w], &buf);
                let peer = if kind == Kind::DmaMap {
                    map_peer
                } else {
                    self.self_peer()
                };
                s.spawn(move || {
                    while !log.stop.load(SeqCst) {
                        let r = match kind {
                            Kind::DmaMap => self.module.dma_map(a.handle(), 0, LEN, peer),
                            Kind::Pin => self.module.pin_user(host.addr(), LEN, peer),
                            Kind::Import => self.module.dmabuf_import(buf.dmabuf(), peer),
                        };
                        match r {
                            Ok(m) => {
                                log.made.fetch_add(1, SeqCst);
                                let old = held.lock().ok().and_then(|mut h| {
                                    h.push_back(m.map_handle());
                                    (h.len() > KEEP).then(|| h.pop_front()).flatten()
                                });
                                if let Some(old) = old {
                                    if let Err(e) = self.unmap_raw(old) {
                                        log.note(format!("UNMAP of mapping {old}: {}", ename(e)));
                                    }
                                }
                            }
                            // The allocation was revoked, or the device is
                            // going.
                            Err(e) if e.errno() == Some(Errno::NODEV) => {
                                log.refused.fetch_add(1, SeqCst);
                                thread::sleep(Duration::from_millis(1));
                            }
                            Err(e) => {
                                log.note(format!("worker {w}: {e}"));
                                thread::sleep(Duration::from_millis(1));
                            }
                        }
                    }
                });
            }
            thread::sleep(Duration::from_millis(50));
            let unbinding = Unbinding::start(drv, pci, unbound.clone());
            match unbinding.wait(UNBIND_DEADLINE) {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    verdict.push(Err(Why::Fail(format!("writing {pci} to unbind: {e}"))));
                    gone = false;
                }
                None => {
                    log.stop.store(true, SeqCst);
                    verdict.push(Err(Why::Fail(format!(
                        "unbind did not return within {} s",
                        UNBIND_DEADLINE.as_secs()
                    ))));
                    gone = unbinding.wait(Duration::from_secs(30)).is_some();
                }
            }
            log.stop.store(true, SeqCst);
        });
        let (made, refused) = (log.made.load(SeqCst), log.refused.load(SeqCst));
        // Every mapping of the device's memory that is left must have been
        // revoked with it.
        let mut live = Vec::new();
        for (w, h) in held.iter().enumerate() {
            let handles: Vec<u64> = h
                .lock()
                .map(|h| h.iter().copied().collect())
                .unwrap_or_default();
            for m in handles {
                if gone && kinds[w] == Kind::DmaMap {
                    let mut arg = abi::P2pdmaHandleState {
                        handle: m,
                        ..Default::default()
                    };
                    match p2pdma::sys::handle_state(&self.module, &mut arg) {
                        Ok(()) if arg.state == abi::P2PDMA_STATE_REVOKED => {}
                        Ok(()) => live.push(format!(
                            "DMA_MAP mapping {m} of allocation {} is LIVE",
                            allocs[w].handle()
                        )),
                        Err(e) => verdict.push(Err(Why::Fail(format!(
                            "HANDLE_STATE of mapping {m}: {}",
                            ename(e)
                        )))),
                    }
                }
                if let Err(e) = self.unmap_raw(m) {
                    verdict.push(Err(Why::Fail(format!(
                        "UNMAP of mapping {m}: {}",
                        ename(e)
                    ))));
                }
            }
        }
        if !live.is_empty() {
            verdict.push(Err(Why::Fail(format!(
                "after the unbind returned: {}",
                live.join("; ")
            ))));
        }
        if let Ok(e) = log.errors.lock() {
            if !e.is_empty() {
                verdict.push(Err(Why::Fail(e.join("; "))));
            }
        }
        // Every mapping is gone now: each FREE releases its handle.
        for a in allocs {
            let h = a.handle();
            if gone {
                verdict.push(
                    a.free()
                        .map_err(|e| Why::Fail(format!("FREE of allocation {h}: {e}"))),
                );
            }
        }
        drop(hosts);
        (all(verdict), gone, made, refused)
    }
}
