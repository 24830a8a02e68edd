//! Revocation: when memory a controller was given is about to be taken
//! back, or vfio-pci asks for the controller, the controller is stopped
//! before anything it was given goes.
//!
//! The module tells the owners of a device's mappings when that device is
//! going (an eventfd on the controller's own module file, which holds its
//! queue memory, its pins and imports, and is also told when memory mapped
//! for the same controller through another file goes); vfio-pci signals its
//! request interrupt when the controller's driver is being unbound. A
//! thread of the controller waits for both. On either, the controller is
//! failed and stopped (disabled; where that fails, bus mastering off and a
//! reset), and only then is what it was given released: every mapping made
//! for it is unmapped, which lets the module finish an unbind that waits for
//! them, and the queue memory's CPU mapping is replaced with anonymous
//! memory, so that threads still polling the queues read zeros rather than
//! fault. On vfio-pci's request (or when the controller could not be
//! stopped) the VFIO device and its BAR mapping are given back as well:
//! vfio-pci resets the function when its file is released, and the unbind
//! goes on.

#![allow(unsafe_code)]

use std::{
    os::fd::{AsFd, OwnedFd},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use rustix::{
    event::{eventfd, poll, EventfdFlags, PollFd, PollFlags},
    io::Errno,
};

use super::qpair::Health;

/// How long a revocation waits for the commands the controller has before
/// it stops the controller anyway.
const DRAIN: Duration = Duration::from_secs(1);
use crate::{memory::ModuleMemory, sys::vfio, Module};

/// The mappings made for one controller object that still stand.
#[derive(Debug, Default)]
pub(crate) struct Made {
    list: Mutex<Vec<(Arc<Module>, u64)>>,
}

impl Made {
    /// Records mapping `handle` of `module`'s file.
    pub(crate) fn add(&self, module: &Arc<Module>, handle: u64) {
        self.list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((module.clone(), handle));
    }

    /// Forgets mapping `handle` (its owner unmaps it): whether it was
    /// still listed, that is, not unmapped by a revocation.
    pub(crate) fn remove(&self, handle: u64) -> bool {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|&(_, h)| h != handle);
        list.len() != before
    }

    /// Unmaps every mapping listed.
    ///
    /// # Safety
    ///
    /// The controller is stopped: no command of it moves data any more.
    unsafe fn unmap_all(&self) {
        let list = std::mem::take(&mut *self.list.lock().unwrap_or_else(|p| p.into_inner()));
        for (module, handle) in list {
            // SAFETY: The controller they were made for is stopped (the
            // caller's promise); their `Mapped`s refuse every later use
            // (the controller is failed, and another controller object
            // refuses them).
            let _ = unsafe { module.unmap_raw(handle) };
        }
    }
}

/// What a revocation stops and releases.
pub(crate) struct Revoker {
    pub(crate) bdf: String,
    pub(crate) health: Arc<Health>,
    pub(crate) bar: Arc<vfio::Bar>,
    pub(crate) device: Arc<vfio::Device>,
    /// The controller's own module file and its queue memory's mapping.
    pub(crate) module: Arc<Module>,
    pub(crate) queue_map: u64,
    pub(crate) queues: Arc<ModuleMemory>,
    pub(crate) made: Arc<Made>,
}

impl Revoker {
    /// Fails and stops the controller for `why`, then releases what it was
    /// given; gives the VFIO device back too when `give_back` (or when the
    /// controller could not be stopped: vfio-pci resets it on release).
    fn revoke(&self, why: &str, give_back: bool) {
        let why = format!("revoked: {why}");
        // New commands are refused, and those the controller has complete
        // first (their memory is still held): it is stopped with nothing
        // to abort.
        self.health.drain(&why, DRAIN);
        self.health.fail(why.clone());
        let stopped = self.health.stopped();
        // The mappings go before the device: its release may end its
        // driver's unbind, and nothing mapped for it is left then.
        if stopped {
            // SAFETY: The controller is stopped.
            unsafe { self.made.unmap_all() };
            // SAFETY: The queue memory's mapping, of the stopped controller.
            let _ = unsafe { self.module.unmap_raw(self.queue_map) };
            let _ = self.queues.mapping().let_go();
        }
        if give_back || !stopped {
            let _ = self.bar.let_go();
            let _ = self.device.let_go();
        }
        if !stopped {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "p2pdma: {why}, and the NVMe controller {} could not be stopped ({}); it was given back to vfio-pci, and its memory stays mapped until the process ends",
                self.bdf,
                self.health.failure().unwrap_or_default()
            );
        }
    }
}

/// The thread that waits for revocations; stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct Watch {
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Watches `revoker`'s module file and the VFIO device's request
    /// interrupt.
    pub(crate) fn start(revoker: Revoker) -> Result<Self, String> {
        let flags = EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK;
        let wake = Arc::new(eventfd(0, flags).map_err(|e| format!("eventfd: {e}"))?);
        let request = eventfd(0, flags).map_err(|e| format!("eventfd: {e}"))?;
        revoker.device.set_request(request.as_fd())?;
        let module = revoker
            .module
            .watch_revocations()
            .map_err(|e| e.to_string())?;
        let woken = wake.clone();
        let thread = std::thread::Builder::new()
            .name("p2pdma-revoke".into())
            .spawn(move || watch(&revoker, &module, &request, &woken))
            .map_err(|e| format!("a thread to watch revocations: {e}"))?;
        Ok(Self {
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads an eventfd's count; whether it was signalled.
fn drain(fd: &OwnedFd) -> bool {
    let mut buf = [0u8; 8];
    matches!(rustix::io::read(fd, &mut buf), Ok(8))
}

fn watch(revoker: &Revoker, module: &OwnedFd, request: &OwnedFd, wake: &OwnedFd) {
    loop {
        let mut fds = [
            PollFd::new(module, PollFlags::IN),
            PollFd::new(request, PollFlags::IN),
            PollFd::new(wake, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return,
        }
        if drain(wake) {
            return;
        }
        if drain(request) {
            revoker.revoke(
                "vfio-pci asks for the controller back (its driver is being unbound)",
                true,
            );
        }
        if drain(module) {
            revoker.revoke(
                "memory the controller was given is being taken back (its accelerator, the controller's driver, or a dma-buf's exporter is going)",
                false,
            );
        }
    }
}
