//! Unbinding the accelerator while its memory is mapped here and in a
//! helper process, what each side sees afterwards, and binding it again.
//!
//! It also holds what every case that unbinds shares (`revoke`,
//! `revoke_race`, `blockio`): whether the device may be unbound now, an
//! unbind on its own thread, binding again, and cycles of both. It uses no
//! other group of cases.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicBool, Ordering::SeqCst},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use p2pdma::{sys, DeviceMapping, PciAddress};
use p2pdma_abi as abi;
use rustix::{io::Errno, process::getuid};

use super::{
    all, line_reader, skip, want_errno, write_verify, Ctx, Suite, Why, MIB, PAGE, R, SIGBUS,
};
use crate::proc::{self, Ended};

/// How long an unbind may take while mappings of the device exist.
pub(super) const UNBIND_DEADLINE: Duration = Duration::from_secs(20);

/// The driver's sysfs directory.
const DRIVER: &str = "/sys/bus/pci/drivers/p2pdma";

/// An unbind under way on its own thread.
pub(super) struct Unbinding {
    rx: mpsc::Receiver<std::io::Result<()>>,
}

impl Unbinding {
    /// Writes `pci` to the driver's `unbind` on a new thread, which sets
    /// `done` once the write has returned.
    pub(super) fn start(drv: &Path, pci: PciAddress, done: Arc<AtomicBool>) -> Self {
        let (tx, rx) = mpsc::channel();
        let (unbind, name) = (drv.join("unbind"), pci.to_string());
        thread::spawn(move || {
            let r = std::fs::write(unbind, name);
            done.store(true, SeqCst);
            let _ = tx.send(r);
        });
        Self { rx }
    }

    /// The unbind's result, if it returned within `limit`.
    pub(super) fn wait(&self, limit: Duration) -> Option<std::io::Result<()>> {
        self.rx.recv_timeout(limit).ok()
    }
}

impl Ctx {
    /// The driver directory, if this process may unbind the accelerator
    /// now: `Skip` without root, `Fail` if the device is not bound.
    pub(super) fn unbind_ready(&self) -> Result<PathBuf, Why> {
        if !getuid().is_root() {
            return Err(Why::Skip("needs root".into()));
        }
        let drv = PathBuf::from(DRIVER);
        if !drv.join("unbind").exists() {
            return Err(Why::Fail(format!("no {}/unbind", drv.display())));
        }
        match self.module.find_accelerator(self.accel.pci)? {
            Some(_) => Ok(drv),
            None => Err(Why::Fail(format!(
                "{} is not bound (an earlier case could not bind it again)",
                self.accel.pci
            ))),
        }
    }

    pub(super) fn unbind_rebind(&mut self, suite: &mut Suite) {
        const CASE: &str = "unbind-while-mapped";
        let drv = Path::new(DRIVER);
        if !getuid().is_root() {
            return suite.report(CASE, skip("needs root"));
        }
        if !drv.join("unbind").exists() {
            let why = format!("no {}", drv.join("unbind").display());
            return suite.report(CASE, Err(Why::Fail(why)));
        }
        let pci = self.accel.pci;
        let old_dev = self.dev;
        let old_size = self.accel.p2p_size;
        let unbound = {
            let (a, map) = match self.map_filled(old_dev, 71) {
                Ok(x) => x,
                Err(e) => return suite.report(CASE, Err(e)),
            };
            match self.unbind_while_mapped(suite, drv, pci, old_dev, a, map) {
                Ok(()) => true,
                Err(Why::Fail(e)) => {
                    suite.report(CASE, Err(Why::Fail(e)));
                    // Bind again only if the device did go away.
                    sys::device_info(&self.module, old_dev) == Err(Errno::NODEV)
                }
                Err(Why::Skip(e)) => {
                    suite.report(CASE, Err(Why::Skip(e)));
                    false
                }
            }
        };
        if unbound {
            self.rebind(suite, drv, pci, old_size);
        }
    }

    /// Allocates 1 MiB on `dev`, maps it and fills it with the pattern of
    /// `seed`.
    fn map_filled(
        &self,
        dev: u32,
        seed: u64,
    ) -> Result<(p2pdma::Allocation<'_>, DeviceMapping), Why> {
        let a = self.module.alloc(dev, MIB, 0)?;
        let map = a.map()?;
        write_verify(&map, seed)?;
        Ok((a, map))
    }

    /// Unbinds the device while this process and a helper have its memory
    /// mapped, then checks what each side sees. `Err` is a failure of the
    /// unbind itself; the checks after it report on their own.
    fn unbind_while_mapped(
        &self,
        suite: &mut Suite,
        drv: &Path,
        pci: PciAddress,
        old_dev: u32,
        a: p2pdma::Allocation<'_>,
        map: DeviceMapping,
    ) -> R {
        // A helper with a mapping of its own, to touch after the unbind.
        let mut child = self.spawn_child(
            &["touch-later".into(), "--dev".into(), old_dev.to_string()],
            Stdio::piped(),
        )?;
        let lines = line_reader(child.stdout.take().ok_or("no stdout pipe")?);
        match lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.starts_with("ready") => {}
            other => {
                let ended = proc::wait_child(&mut child, Duration::ZERO);
                fail!("the helper did not get ready ({other:?}); it {ended}");
            }
        }

        let (tx, rx) = mpsc::channel();
        let (unbind, name) = (drv.join("unbind"), pci.to_string());
        thread::spawn(move || {
            let _ = tx.send(std::fs::write(unbind, name));
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => suite.report("unbind-while-mapped", Ok(())),
            Ok(Err(e)) => {
                let _ = child.kill();
                let _ = child.wait();
                fail!("writing {pci} to unbind: {e}");
            }
            Err(_) => {
                // Release everything; the unbind may then finish.
                let _ = child.kill();
                let _ = child.wait();
                drop(map);
                drop(a);
                let late = rx.recv_timeout(Duration::from_secs(30)).is_ok();
                fail!(
                    "unbind did not return within 60 s while the memory was mapped ({})",
                    if late {
                        "it did once the memory was released"
                    } else {
                        "nor after the memory was released"
                    }
                );
            }
        }

        // The helper touches its mapping of the vanished device.
        let signalled = child
            .stdin
            .as_mut()
            .map(|s| writeln!(s, "go").and_then(|_| s.flush()).is_ok())
            .unwrap_or(false);
        let ended = proc::wait_child(&mut child, Duration::from_secs(30));
        let said: Vec<String> = lines.try_iter().collect();
        suite.report(
            "unbind-child-sigbus",
            if !signalled {
                Err(Why::Fail(format!("could not signal the helper; it {ended}")))
            } else if ended == Ended::Signaled(SIGBUS) {
                Ok(())
            } else {
                Err(Why::Fail(format!(
                    "touching a mapping of an unbound device: the helper {ended} ({}), expected SIGBUS",
                    said.join(" ")
                )))
            },
        );
        suite.report(
            "unbind-alloc-enodev",
            all(vec![
                want_errno(
                    "ALLOC on the unbound index",
                    self.raw_alloc(|_| {}),
                    Errno::NODEV,
                ),
                want_errno(
                    "DEVICE_INFO of the unbound index",
                    sys::device_info(&self.module, old_dev),
                    Errno::NODEV,
                ),
            ]),
        );
        let (flags, peer) = self.self_peer().to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer,
            handle: a.handle(),
            length: PAGE,
            ..Default::default()
        };
        let r = sys::dma_map(
            &self.module,
            &mut arg,
            &mut [abi::P2pdmaDmaSeg::default(); 4],
        );
        if r.is_ok() {
            let _ = self.unmap_raw(arg.map_handle);
        }
        suite.report(
            "unbind-dma-map-enodev",
            want_errno("DMA_MAP of the old handle", r, Errno::NODEV),
        );
        suite.report(
            "unbind-free-old-handle",
            a.free()
                .map_err(|e| Why::Fail(format!("FREE of the old handle: {e}"))),
        );
        drop(map);
        Ok(())
    }

    /// Binds `pci` to the driver again and waits up to 10 s for it to be
    /// back in DEVICE_INFO; from then on the cases use its (possibly new)
    /// index. Fails if it comes back with another amount of P2P memory.
    pub(super) fn bind_again(&mut self, drv: &Path, pci: PciAddress, old_size: u64) -> R {
        std::fs::write(drv.join("bind"), pci.to_string())
            .map_err(|e| format!("writing {pci} to bind: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let accel = loop {
            match self.module.find_accelerator(pci)? {
                Some(a) => break a,
                None if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                None => fail!("{pci} not back in DEVICE_INFO after 10 s"),
            }
        };
        self.dev = accel.index;
        self.accel = accel;
        ensure!(
            self.accel.p2p_size == old_size,
            "p2p_size {:#x} after rebinding, {old_size:#x} before",
            self.accel.p2p_size
        );
        Ok(())
    }

    /// Runs `cycle` up to `cycles` times on the device made ready to be
    /// unbound, binding it again after each: the verdicts, a failure
    /// prefixed with its cycle's number. It stops after a cycle that left
    /// the device bound, or when the device could not be made ready or
    /// bound again.
    pub(super) fn unbind_cycles(
        &mut self,
        cycles: u32,
        mut cycle: impl FnMut(&Self, &Path, PciAddress) -> (R, bool),
    ) -> Vec<R> {
        let mut results = Vec::new();
        for n in 1..=cycles {
            let drv = match self.unbind_ready() {
                Ok(d) => d,
                Err(e) => {
                    results.push(Err(e));
                    break;
                }
            };
            let (pci, old_size) = (self.accel.pci, self.accel.p2p_size);
            let (r, unbound) = cycle(self, &drv, pci);
            results.push(r.map_err(|e| match e {
                Why::Fail(m) => Why::Fail(format!("cycle {n}: {m}")),
                s => s,
            }));
            if !unbound {
                break;
            }
            if let Err(e) = self.bind_again(&drv, pci, old_size) {
                results.push(Err(e));
                break;
            }
        }
        results
    }

    fn rebind(&mut self, suite: &mut Suite, drv: &Path, pci: PciAddress, old_size: u64) {
        let r = self.bind_again(drv, pci, old_size);
        let back = matches!(self.module.find_accelerator(pci), Ok(Some(_)));
        suite.report("unbind-rebind", r);
        if !back {
            return;
        }
        suite.case("unbind-alloc-after-rebind", || self.alloc_after_rebind(72));
    }

    /// A fresh allocation on the rebound device works, holds data, and
    /// everything goes back.
    pub(super) fn alloc_after_rebind(&self, seed: u64) -> R {
        let a = self.module.alloc(self.dev, 2 * MIB, 0)?;
        let map = a.map()?;
        write_verify(&map, seed)?;
        drop(map);
        a.free()?;
        self.leak_check()
    }
}
