//! The bound on overlapping mappings counts pages, not files or buffers:
//! the same pages reached through several module files, several udmabufs
//! of one memfd, and one allocation mapped again and again, carry at most
//! `P2PDMA_MAX_PIN_OVERLAP` mappings a peer may write (the DMA API's
//! debugging warns past 1 + 7 mappings of a cacheline, whatever the
//! device), and mappings the peer only reads are not counted.

use std::os::fd::AsFd;

use p2pdma::{sys::HostBuffer, DmaMapping, Module, PeerAccess};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use super::{all, want_lib_errno, Ctx, Why, KIB, PAGE, R};

impl Ctx {
    /// A second open file of the module, owned by this process.
    fn second_file(&self) -> Result<Module, Why> {
        Module::open_path(&self.node).map_err(|e| Why::Fail(format!("second open: {e}")))
    }

    /// `max` mappings made by `make` (the `i`-th through the file `i % 2`)
    /// succeed, the next gets `ETOOMANYREFS`; releasing one makes room for
    /// one more. Everything made is released.
    fn bound_holds(
        &self,
        what: &str,
        files: [&Module; 2],
        make: impl Fn(&Module, usize) -> p2pdma::Result<DmaMapping>,
    ) -> R {
        let max = abi::P2PDMA_MAX_PIN_OVERLAP as usize;
        let mut held = Vec::new();
        let mut checks = Vec::new();
        for i in 0..max {
            match make(files[i % 2], i) {
                Ok(h) => held.push((i % 2, h)),
                Err(e) => checks.push(Err(Why::Fail(format!("{what} {} of {max}: {e}", i + 1)))),
            }
        }
        let over = match make(files[max % 2], max) {
            Ok(m) => {
                let h = m.map_handle();
                held.push((max % 2, m));
                Ok(h)
            }
            Err(e) => Err(e),
        };
        checks.push(want_lib_errno(
            &format!("{what} {} (over {max})", max + 1),
            over,
            Errno::TOOMANYREFS,
        ));
        if !held.is_empty() {
            let (f, m) = held.remove(0);
            checks.push(files[f].unmap(m).map_err(Why::from));
            match make(files[max % 2], max + 1) {
                Ok(h) => held.push((max % 2, h)),
                Err(e) => checks.push(Err(Why::Fail(format!("{what} after releasing one: {e}")))),
            }
        }
        for (f, m) in held {
            let h = m.map_handle();
            if let Err(e) = files[f].unmap(m) {
                checks.push(Err(Why::Fail(format!("UNMAP of {h}: {e}"))));
            }
        }
        all(checks)
    }

    /// Two udmabufs of one memfd, imported in turn through two files: they
    /// share their pages, so the bound holds over both buffers and both
    /// files (one file and one buffer alone would allow it each time).
    pub(super) fn overlap_shared_memfd(&self) -> R {
        let first = self.udmabuf(64 * KIB)?;
        let dev = open(
            p2pdma::memory::udmabuf::UDMABUF_NODE,
            OFlags::RDWR | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("open {}: {e}", p2pdma::memory::udmabuf::UDMABUF_NODE))?;
        let second = p2pdma::sys::udmabuf_create(&dev, first.memfd(), 0, 64 * KIB)
            .map_err(|e| format!("UDMABUF_CREATE of the same memfd: {e}"))?;
        let other = self.second_file()?;
        let peer = self.host_peer();
        self.bound_holds(
            "DMABUF_IMPORT of a udmabuf of one memfd",
            [&self.module, &other],
            |m, i| {
                let buf = if i % 4 < 2 {
                    first.dmabuf()
                } else {
                    second.as_fd()
                };
                m.dmabuf_import(buf, peer)
            },
        )
    }

    /// One page pinned through two files: the bound holds over both.
    pub(super) fn overlap_pin_files(&self) -> R {
        let buf = HostBuffer::new(PAGE as usize).map_err(|e| format!("host buffer: {e}"))?;
        buf.fill(0x3c);
        let other = self.second_file()?;
        let peer = self.host_peer();
        self.bound_holds("PIN_USER of one page", [&self.module, &other], |m, _| {
            m.pin_user(buf.addr(), PAGE, peer)
        })
    }

    /// One page of an allocation `DMA_MAP`ped again and again for the
    /// accelerator itself: the DMA API tracks P2P pages too, bus addresses
    /// included, so the bound holds; mappings the peer only reads are not
    /// counted and pass it.
    pub(super) fn overlap_dma_map(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let peer = self.self_peer();
        let bound = self.bound_holds(
            "DMA_MAP of one page",
            [&self.module, &self.module],
            |m, _| m.dma_map(a.handle(), 0, PAGE, peer),
        );
        let n = abi::P2PDMA_MAX_PIN_OVERLAP as usize + 3;
        let mut reads = Vec::new();
        let mut checks = vec![bound];
        for i in 0..n {
            match self
                .module
                .dma_map_access(a.handle(), 0, PAGE, peer, PeerAccess::ReadOnly)
            {
                Ok(m) => reads.push(m),
                Err(e) => {
                    checks.push(Err(Why::Fail(format!(
                        "DMA_MAP {} of {n} for a peer that only reads: {e}",
                        i + 1
                    ))));
                    break;
                }
            }
        }
        for m in reads {
            checks.push(self.module.unmap(m).map_err(Why::from));
        }
        all(checks)
    }
}
