//! `DMABUF_IMPORT` of a udmabuf and of fds that are no dma-buf, and imports
//! within the DMA API's rules: a bridge is no peer, an exporter's segments
//! must fit the peer's segment limit, and one buffer carries a bounded
//! number of imports, as a user page carries a bounded number of pins.

use std::os::fd::AsFd;

use p2pdma::{PciAddress, Peer, Topology};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use super::{all, want_errno, want_lib_errno, Ctx, Why, KIB, MIB, R};

/// The PCI functions of the machine with their class code and whether a
/// driver has them, by address.
fn pci_functions() -> Vec<(PciAddress, u32, bool)> {
    Topology::new()
        .pci_functions()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| Some((f.address, f.class?, f.driver.is_some())))
        .collect()
}

impl Ctx {
    pub(super) fn dmabuf_import(&self) -> R {
        let buf = self.udmabuf(MIB)?;
        let m = self.module.dmabuf_import(buf.dmabuf(), self.host_peer())?;
        let checks = self.check_segs(&m, MIB, false);
        let h = m.map_handle();
        let u = self.module.unmap(m).map_err(Why::from);
        let again = want_errno(
            "second UNMAP of the import",
            self.unmap_raw(h),
            Errno::NOENT,
        );
        all(vec![checks, u, again])
    }

    pub(super) fn dmabuf_import_not_dmabuf(&self) -> R {
        let buf = self.udmabuf(64 * KIB)?;
        let null = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("open /dev/null: {e}"))?;
        let import = |fd| {
            let r = self.module.dmabuf_import(fd, self.host_peer());
            if let Ok(m) = &r {
                let _ = self.unmap_raw(m.map_handle());
            }
            r
        };
        all(vec![
            want_lib_errno(
                "DMABUF_IMPORT of the memfd",
                import(buf.memfd()),
                Errno::BADF,
            ),
            want_lib_errno(
                "DMABUF_IMPORT of /dev/null",
                import(null.as_fd()),
                Errno::BADF,
            ),
        ])
    }

    /// Imports `buf` for `peer`; what it maps by mistake is unmapped again.
    fn import_once(&self, buf: &p2pdma::Udmabuf, peer: Peer<'_>) -> p2pdma::Result<()> {
        let m = self.module.dmabuf_import(buf.dmabuf(), peer)?;
        let _ = self.module.unmap(m);
        Ok(())
    }

    /// A PCI-to-PCI bridge (a switch or root port) masters no DMA of its
    /// own: `DMABUF_IMPORT`, `DMA_MAP` and `PIN_USER` for it get
    /// `EOPNOTSUPP`, however large the buffer.
    pub(super) fn dmabuf_bridge_peer(&self) -> R {
        let Some((bridge, _, _)) = pci_functions()
            .into_iter()
            .find(|&(_, class, _)| class >> 8 == 0x0604)
        else {
            return super::skip("no PCI-to-PCI bridge in this machine");
        };
        let peer = Peer::Pci(bridge);
        let buf = self.udmabuf(256 * KIB)?;
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let host =
            p2pdma::HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let dma_map = self.module.dma_map(a.handle(), 0, 64 * KIB, peer);
        if let Ok(m) = &dma_map {
            let _ = self.unmap_raw(m.map_handle());
        }
        let pin = self.module.pin_user(host.addr(), 64 * KIB, peer);
        if let Ok(m) = &pin {
            let _ = self.unmap_raw(m.map_handle());
        }
        all(vec![
            want_lib_errno(
                &format!("DMABUF_IMPORT of 256 KiB for bridge {bridge}"),
                self.import_once(&buf, peer),
                Errno::OPNOTSUPP,
            ),
            want_lib_errno(
                &format!("DMA_MAP for bridge {bridge}"),
                dma_map.map(|_| ()),
                Errno::OPNOTSUPP,
            ),
            want_lib_errno(
                &format!("PIN_USER for bridge {bridge}"),
                pin.map(|_| ()),
                Errno::OPNOTSUPP,
            ),
        ])
    }

    /// A function with no driver keeps the PCI core's 64 KiB segment
    /// limit, and an exporter may hand it longer segments (udmabuf merges
    /// contiguous pages): a 4 MiB buffer is refused with `EMSGSIZE` before
    /// the exporter maps it, a 64 KiB one (no segment can be longer) is
    /// imported.
    pub(super) fn dmabuf_seg_limit(&self) -> R {
        let Some((peer, class, _)) = pci_functions()
            .into_iter()
            .find(|&(pci, class, bound)| !bound && class >> 16 != 0x06 && pci != self.accel.pci)
        else {
            return super::skip("no PCI function without a driver that is not a bridge");
        };
        let small = self.udmabuf(64 * KIB)?;
        let big = self.udmabuf(4 * MIB)?;
        let p = Peer::Pci(peer);
        all(vec![
            want_lib_errno(
                &format!("DMABUF_IMPORT of 4 MiB for {peer} (class {class:06x}, no driver)"),
                self.import_once(&big, p),
                Errno::MSGSIZE,
            ),
            self.import_once(&small, p).map_err(|e| {
                Why::Fail(format!(
                    "DMABUF_IMPORT of 64 KiB for {peer} (class {class:06x}, no driver): {e}"
                ))
            }),
        ])
    }

    /// One dma-buf imported again and again for one peer: the DMA API
    /// tracks at most 7 overlapping mappings of a cacheline, so after
    /// `P2PDMA_MAX_PIN_OVERLAP` live imports of it the next gets
    /// `ETOOMANYREFS`; another buffer still imports, and releasing one
    /// import makes room for one more.
    pub(super) fn dmabuf_overlap(&self) -> R {
        let max = abi::P2PDMA_MAX_PIN_OVERLAP as usize;
        let buf = self.udmabuf(64 * KIB)?;
        let other = self.udmabuf(64 * KIB)?;
        let peer = self.host_peer();
        let mut held = Vec::new();
        let mut checks = Vec::new();
        for i in 0..max {
            match self.module.dmabuf_import(buf.dmabuf(), peer) {
                Ok(m) => held.push(m.map_handle()),
                Err(e) => checks.push(Err(Why::Fail(format!("import {} of {max}: {e}", i + 1)))),
            }
        }
        let over = self.module.dmabuf_import(buf.dmabuf(), peer);
        let over_handle = over.as_ref().ok().map(|m| m.map_handle());
        checks.push(want_lib_errno(
            &format!("import {} of one dma-buf", max + 1),
            over.map(|_| ()),
            Errno::TOOMANYREFS,
        ));
        checks.push(
            self.import_once(&other, peer)
                .map_err(|e| Why::Fail(format!("import of a second dma-buf: {e}"))),
        );
        if let Some(h) = held.pop() {
            checks.push(
                self.unmap_raw(h)
                    .map_err(|e| Why::Fail(format!("UNMAP: {e}"))),
            );
            match self.module.dmabuf_import(buf.dmabuf(), peer) {
                Ok(m) => held.push(m.map_handle()),
                Err(e) => checks.push(Err(Why::Fail(format!("import after releasing one: {e}")))),
            }
        }
        for h in held.into_iter().chain(over_handle) {
            if let Err(e) = self.unmap_raw(h) {
                checks.push(Err(Why::Fail(format!("UNMAP of import {h}: {e}"))));
            }
        }
        all(checks)
    }
}
