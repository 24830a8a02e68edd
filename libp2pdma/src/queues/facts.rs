//! What a controller's commands are checked against: its active
//! namespaces and their formats, read with IDENTIFY through the one page
//! of the controller's memory that takes admin data.
//!
//! The page holds one command's data at a time: a command is submitted and
//! its data copied out before the next command that uses the page is
//! submitted. Rescans run one at a time, and one publishes what it found
//! only if no rescan that started after it has published already, so the
//! namespaces published never go back to an older state. A submission
//! scope takes the namespaces published when it opens and checks its
//! commands against them alone; a command for a namespace that a later
//! rescan found changed is refused.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex, RwLock,
};

use crate::nvme::{IdNs, PAGE};

/// A namespace of the controller, from IDENTIFY NAMESPACE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace id.
    pub nsid: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Metadata bytes per block (namespaces with metadata are not served).
    pub metadata: u16,
}

impl NamespaceInfo {
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// The active namespaces as one rescan found them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    /// The rescan's place in the order rescans started (0: none yet).
    pub(crate) generation: u64,
    /// Namespace changes the controller had announced when it started.
    pub(crate) changes: u64,
    pub(crate) namespaces: Arc<[NamespaceInfo]>,
}

impl Snapshot {
    /// Namespace `nsid`, if it was active.
    pub(crate) fn get(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }
}

/// A reason a rescan failed, or the error of the IDENTIFY it ran.
#[derive(Debug)]
pub(crate) enum RescanError<E> {
    Identify(E),
    Decode { nsid: u32, why: String },
}

/// The namespaces of one controller, and the page their IDENTIFY data
/// passes through.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Held from the submission of a command with data in the page until
    /// the data is copied out.
    page: Mutex<()>,
    /// Held through a rescan: the number of rescans started.
    rescans: Mutex<u64>,
    published: RwLock<Snapshot>,
    /// The published generation and changes, read without the lock.
    generation: AtomicU64,
    changes: AtomicU64,
    /// Namespace changes the controller announced.
    announced: AtomicU64,
}

impl Facts {
    /// Runs `f`, which moves data through the page and copies it out, while
    /// no other command uses the page.
    pub(crate) fn with_page<T>(&self, f: impl FnOnce() -> T) -> T {
        let _page = self.page.lock().unwrap_or_else(|p| p.into_inner());
        f()
    }

    /// The namespaces published last.
    pub(crate) fn current(&self) -> Snapshot {
        self.published
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The generation published last.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records a namespace change the controller announced: until a rescan
    /// that starts afterwards publishes, [`Facts::stale`] says so.
    pub(crate) fn announce(&self) {
        self.announced.fetch_add(1, Ordering::AcqRel);
    }

    /// Namespace changes announced so far.
    pub(crate) fn announced(&self) -> u64 {
        self.announced.load(Ordering::Acquire)
    }

    /// Whether the controller announced a change that no published rescan
    /// has seen.
    pub(crate) fn stale(&self) -> bool {
        self.changes.load(Ordering::Acquire) < self.announced()
    }

    /// Reads the active namespaces and their formats with `identify(cns,
    /// nsid, out)` (each call runs one IDENTIFY and copies its page to
    /// `out`, see [`Facts::with_page`]) and publishes them, unless a
    /// rescan that started later has published already. Returns what is
    /// published afterwards.
    pub(crate) fn rescan<E>(
        &self,
        identify: impl FnMut(u8, u32, &mut [u8]) -> Result<(), E>,
    ) -> Result<Snapshot, RescanError<E>> {
        self.scan(false, identify)
    }

    /// [`Facts::rescan`] if the namespaces are [stale](Facts::stale) once
    /// no other rescan runs; what is published otherwise.
    pub(crate) fn rescan_stale<E>(
        &self,
        identify: impl FnMut(u8, u32, &mut [u8]) -> Result<(), E>,
    ) -> Result<Snapshot, RescanError<E>> {
        self.scan(true, identify)
    }

    fn scan<E>(
        &self,
        only_stale: bool,
        mut identify: impl FnMut(u8, u32, &mut [u8]) -> Result<(), E>,
    ) -> Result<Snapshot, RescanError<E>> {
        let mut started = self.rescans.lock().unwrap_or_else(|p| p.into_inner());
        if only_stale && !self.stale() {
            return Ok(self.current());
        }
        *started += 1;
        let generation = *started;
        let changes = self.announced();
        let mut page = vec![0u8; PAGE];
        identify(2, 0, &mut page).map_err(RescanError::Identify)?;
        let nsids: Vec<u32> = page
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .take_while(|&n| n != 0)
            .collect();
        let mut found = Vec::with_capacity(nsids.len());
        for nsid in nsids {
            page.fill(0);
            identify(0, nsid, &mut page).map_err(RescanError::Identify)?;
            let ns = IdNs::decode(&page).map_err(|why| RescanError::Decode { nsid, why })?;
            found.push(NamespaceInfo {
                nsid,
                blocks: ns.nsze,
                block_size: ns.block_size,
                metadata: ns.metadata,
            });
        }
        let mut published = self.published.write().unwrap_or_else(|p| p.into_inner());
        if generation > published.generation {
            *published = Snapshot {
                generation,
                changes,
                namespaces: Arc::from(found),
            };
            self.changes.store(changes, Ordering::Release);
            self.generation.store(generation, Ordering::Release);
        }
        Ok(published.clone())
    }
}

#[cfg(test)]
mod tests {
    //! Rescans racing each other and a controller whose namespaces change
    //! under them, the page a model of the controller's memory that its
    //! IDENTIFY data lands in: every published namespace must be one the
    //! controller had, with its own format, never another's, and the last
    //! published must be the controller's final state.

    use std::{
        sync::atomic::AtomicBool,
        thread,
        time::{Duration, Instant},
    };

    use proptest::prelude::*;

    use super::*;

    /// The controller: namespace `nsid` at version `v` has `nsid * 1000 +
    /// v` blocks of `512 << (nsid + v) % 4` bytes.
    struct Model {
        versions: Vec<AtomicU64>,
        /// The memory IDENTIFY writes to.
        page: Mutex<Vec<u8>>,
    }

    impl Model {
        fn new(namespaces: usize) -> Self {
            Self {
                versions: (0..namespaces).map(|_| AtomicU64::new(0)).collect(),
                page: Mutex::new(vec![0u8; PAGE]),
            }
        }

        fn info(nsid: u32, v: u64) -> NamespaceInfo {
            NamespaceInfo {
                nsid,
                blocks: u64::from(nsid) * 1000 + v,
                block_size: 512 << ((u64::from(nsid) + v) % 4),
                metadata: 0,
            }
        }

        /// The controller's side of IDENTIFY: the data lands in the page.
        fn dma(&self, cns: u8, nsid: u32) {
            let mut d = vec![0u8; PAGE];
            if cns == 2 {
                for (i, n) in (1..=self.versions.len() as u32).enumerate() {
                    d[4 * i..4 * i + 4].copy_from_slice(&n.to_le_bytes());
                }
            } else if let Some(v) = (nsid as usize)
                .checked_sub(1)
                .and_then(|k| self.versions.get(k))
            {
                let v = v.load(Ordering::Acquire);
                let ns = Self::info(nsid, v);
                d[0..8].copy_from_slice(&ns.blocks.to_le_bytes());
                d[25] = 3;
                // Format (nsid + v) % 4 of four, 512 bytes to 4 KiB.
                d[26] = ((u64::from(nsid) + v) % 4) as u8;
                for f in 0..4 {
                    d[128 + 4 * f + 2] = 9 + f as u8;
                }
            }
            *self.page.lock().unwrap() = d;
        }

        fn copy_out(&self, out: &mut [u8]) {
            out.copy_from_slice(&self.page.lock().unwrap());
        }
    }

    /// Several rescanning threads (users' rescans and the event path's)
    /// while `changes` namespace changes happen, each announced.
    fn race(namespaces: usize, rescanners: usize, changes: usize, seed: u64) {
        let model = Model::new(namespaces);
        let facts = Facts::default();
        let done = AtomicBool::new(false);
        let identify = |salt: u64| {
            let (model, facts) = (&model, &facts);
            let mut n = seed ^ salt;
            move |cns: u8, nsid: u32, out: &mut [u8]| -> Result<(), String> {
                facts.with_page(|| {
                    model.dma(cns, nsid);
                    n = n.wrapping_mul(6364136223846793005).wrapping_add(1);
                    // Time between the data landing and its copy: another
                    // command's data may land meanwhile, unless the page
                    // is held.
                    if n >> 62 == 0 {
                        thread::sleep(Duration::from_micros(n >> 54 & 0xff));
                    } else {
                        thread::yield_now();
                    }
                    model.copy_out(out);
                });
                Ok(())
            }
        };
        thread::scope(|s| {
            for r in 0..rescanners {
                let (facts, done) = (&facts, &done);
                let mut identify = identify(r as u64 + 1);
                s.spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        let _ = facts.rescan(&mut identify);
                    }
                });
            }
            let (facts, model, done) = (&facts, &model, &done);
            let watcher = s.spawn(move || -> Result<(), String> {
                let mut last = 0;
                while !done.load(Ordering::Acquire) {
                    let snap = facts.current();
                    if snap.generation < last {
                        return Err(format!(
                            "published generation went back from {last} to {}",
                            snap.generation
                        ));
                    }
                    last = snap.generation;
                    for ns in snap.namespaces.iter() {
                        let v = ns.blocks.wrapping_sub(u64::from(ns.nsid) * 1000);
                        if v > changes as u64 || *ns != Model::info(ns.nsid, v) {
                            return Err(format!(
                                "published {ns:?}, which the controller never had"
                            ));
                        }
                    }
                    thread::yield_now();
                }
                Ok(())
            });
            let mut event_identify = identify(0);
            let mut n = seed;
            let events = (0..changes).try_for_each(|_| {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let k = (n >> 33) as usize % namespaces;
                model.versions[k].fetch_add(1, Ordering::AcqRel);
                facts.announce();
                match facts.rescan(&mut event_identify) {
                    Err(RescanError::Decode { nsid, why }) => {
                        Err(format!("a rescan read namespace {nsid}'s data as: {why}"))
                    }
                    _ => Ok(()),
                }
            });
            let deadline = Instant::now() + Duration::from_millis(20);
            while events.is_ok() && Instant::now() < deadline {
                thread::yield_now();
            }
            done.store(true, Ordering::Release);
            let watched = watcher.join().unwrap();
            events.and(watched).unwrap();
        });
        assert!(!facts.stale(), "every change was rescanned");
        let last = facts.current();
        for (k, v) in model.versions.iter().enumerate() {
            let want = Model::info(k as u32 + 1, v.load(Ordering::Acquire));
            assert_eq!(
                last.get(k as u32 + 1),
                Some(&want),
                "the last published namespaces are the controller's final ones"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
        #[test]
        fn rescans_publish_only_what_the_controller_had_and_end_on_its_last_state(
            namespaces in 1usize..5,
            rescanners in 1usize..4,
            changes in 1usize..40,
            seed in any::<u64>(),
        ) {
            race(namespaces, rescanners, changes, seed);
        }
    }

    #[test]
    fn an_announced_change_is_stale_until_a_rescan_started_after_it_publishes() {
        let model = Model::new(2);
        let facts = Facts::default();
        let mut identify = |cns: u8, nsid: u32, out: &mut [u8]| -> Result<(), String> {
            model.dma(cns, nsid);
            model.copy_out(out);
            Ok(())
        };
        facts.rescan(&mut identify).unwrap();
        assert!(!facts.stale());
        facts.announce();
        assert!(facts.stale());
        let failing = |_: u8, _: u32, _: &mut [u8]| -> Result<(), String> { Err("no".into()) };
        assert!(facts.rescan(failing).is_err());
        assert!(facts.stale(), "a failed rescan leaves the change unseen");
        facts.rescan(&mut identify).unwrap();
        assert!(!facts.stale());
    }
}
