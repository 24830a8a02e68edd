//! Peers beyond the plain NVMe: a native-multipath namespace head, and
//! every PCI function of the machine, each held to what `P2P_QUERY` says.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use p2pdma::{sys, MapType, P2pQuery, PciAddress, Peer, Topology};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use super::{all, ename, skip, want_lib_errno, Ctx, ExpectP2p, Why, KIB, MIB, R};

/// The controllers under a multipath head: each path's name and the PCI
/// function of its controller.
fn multipath_controllers(head: &str) -> Result<Vec<(String, PciAddress)>, String> {
    let t = Topology::new().resolve(head).map_err(|e| e.to_string())?;
    t.multipath
        .into_iter()
        .map(|p| match p.pci {
            Some(pci) => Ok((p.name, pci)),
            None => Err(format!("no PCI function above {}", p.name)),
        })
        .collect()
}

/// Every PCI function of the machine that is not a bridge.
fn pci_endpoints() -> Vec<PciAddress> {
    Topology::new()
        .pci_functions()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.class.is_some_and(|c| c >> 16 != 0x06))
        .map(|f| f.address)
        .collect()
}

/// A peer to test, with the descriptor it borrows.
enum PeerSpec {
    Fd(OwnedFd),
    Pci(PciAddress),
}

impl PeerSpec {
    fn peer(&self) -> Peer<'_> {
        match self {
            PeerSpec::Fd(fd) => Peer::Fd(fd.as_fd()),
            PeerSpec::Pci(p) => Peer::Pci(*p),
        }
    }
}

impl Ctx {
    /// `--nvme-multipath`, opened: `Skip` without it.
    fn multipath(&self) -> Result<(String, OwnedFd), Why> {
        let Some(path) = self.nvme_multipath.clone() else {
            return Err(Why::Skip("no --nvme-multipath namespace head given".into()));
        };
        let fd = open(
            path.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Why::Fail(format!("open {path}: {}", ename(e))))?;
        Ok((path, fd))
    }

    /// `P2P_QUERY` with the multipath head's descriptor as the peer: it
    /// must answer (the head has no PCI function of its own; its paths'
    /// controllers do), with the answer each controller gets.
    pub(super) fn p2p_query_multipath(&self) -> R {
        let (path, fd) = self.multipath()?;
        let ctrls = multipath_controllers(&path)?;
        ensure!(
            ctrls.len() >= 2,
            "{path} has {} path(s): {ctrls:?}",
            ctrls.len()
        );
        let mut raw = abi::P2pdmaP2pQuery {
            dev_index: self.dev,
            flags: abi::P2PDMA_PEER_FD,
            peer: abi::P2pdmaPeer {
                fd: fd.as_raw_fd(),
                ..Default::default()
            },
            ..Default::default()
        };
        sys::p2p_query(&self.module, &mut raw)
            .map_err(|e| format!("P2P_QUERY with the multipath head {path}: {}", ename(e)))?;
        let q = P2pQuery::from(&raw);
        ensure!(
            !matches!(q.map_type, MapType::Unknown(_)),
            "P2P_QUERY of {path}: unknown map_type {}",
            raw.map_type
        );
        ensure!(
            ctrls.iter().any(|(_, p)| *p == q.peer),
            "{path} resolved to {}, none of its controllers {ctrls:?}",
            q.peer
        );
        if self.expect == Some(ExpectP2p::Supported) {
            ensure!(
                q.map_type == MapType::BusAddr,
                "{path} (under the accelerator's switch): {} ({})",
                q.map_type,
                q.reason
            );
        }
        for (name, pci) in &ctrls {
            let c = self.module.p2p_query(self.dev, Peer::Pci(*pci))?;
            ensure!(
                c.map_type == q.map_type,
                "the head {path}: {}; its path {name} (controller {pci}): {}",
                q.map_type,
                c.map_type
            );
        }
        Ok(())
    }

    /// `DMA_MAP` for the multipath head: with P2P, it succeeds with the
    /// segments that mapping for each controller by PCI address gives;
    /// without, `EREMOTEIO`.
    pub(super) fn dma_map_multipath(&self) -> R {
        let (path, fd) = self.multipath()?;
        let ctrls = multipath_controllers(&path)?;
        let q = self
            .module
            .p2p_query(self.dev, Peer::Fd(fd.as_fd()))
            .map_err(|e| format!("P2P_QUERY with {path}: {e}"))?;
        let a = self.module.alloc(self.dev, MIB, 0)?;
        let r = self
            .module
            .dma_map(a.handle(), 0, a.size(), Peer::Fd(fd.as_fd()));
        if q.map_type == MapType::NotSupported {
            if let Ok(m) = &r {
                let _ = self.unmap_raw(m.map_handle());
            }
            return want_lib_errno(
                &format!("DMA_MAP for {path}, which P2P_QUERY says cannot reach the accelerator"),
                r,
                Errno::REMOTEIO,
            );
        }
        let m = r.map_err(|e| format!("DMA_MAP for the multipath head {path}: {e}"))?;
        let mut checks = vec![
            self.check_segs(&m, a.size(), q.map_type == MapType::BusAddr),
            if m.map_type == q.map_type {
                Ok(())
            } else {
                Err(Why::Fail(format!(
                    "DMA_MAP for {path}: {}, P2P_QUERY: {}",
                    m.map_type, q.map_type
                )))
            },
        ];
        for (name, pci) in &ctrls {
            match self
                .module
                .dma_map(a.handle(), 0, a.size(), Peer::Pci(*pci))
            {
                Ok(c) => {
                    if c.segs != m.segs {
                        checks.push(Err(Why::Fail(format!(
                            "for the head {path}: {:x?}; for its path {name} (controller {pci}): {:x?}",
                            m.segs, c.segs
                        ))));
                    }
                    checks.push(self.module.unmap(c).map_err(Why::from));
                }
                Err(e) => checks.push(Err(Why::Fail(format!(
                    "DMA_MAP for controller {pci} of {name}: {e}"
                )))),
            }
        }
        checks.push(self.module.unmap(m).map_err(Why::from));
        all(checks)
    }

    /// For every peer this machine has (the accelerator itself, the NVMe by
    /// descriptor and by address, the multipath head and its controllers,
    /// every other PCI function that is not a bridge): where `P2P_QUERY`
    /// says P2P is not supported, `DMA_MAP` fails with `EREMOTEIO`;
    /// elsewhere it succeeds with the map type `P2P_QUERY` gave.
    pub(super) fn dma_map_agrees_with_query(&self) -> R {
        let mut peers: Vec<(String, PeerSpec)> = vec![(
            "the accelerator itself".into(),
            PeerSpec::Pci(self.accel.pci),
        )];
        if let Some(fd) = &self.nvme {
            if let Ok(fd) = fd.try_clone() {
                peers.push((self.nvme_path.clone(), PeerSpec::Fd(fd)));
            }
        }
        match self.multipath() {
            Ok((path, fd)) => {
                peers.push((format!("{path} (multipath head)"), PeerSpec::Fd(fd)));
                for (name, pci) in multipath_controllers(&path)? {
                    peers.push((format!("{pci} (controller of {name})"), PeerSpec::Pci(pci)));
                }
            }
            Err(Why::Skip(_)) => {}
            Err(e) => return Err(e),
        }
        for pci in pci_endpoints() {
            let listed = peers
                .iter()
                .any(|(_, p)| matches!(p, PeerSpec::Pci(q) if *q == pci));
            if !listed {
                peers.push((pci.to_string(), PeerSpec::Pci(pci)));
            }
        }
        if peers.len() < 2 {
            return skip("no peer besides the accelerator itself");
        }
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let checks = peers
            .iter()
            .map(|(name, spec)| -> R {
                let peer = spec.peer();
                let q = self
                    .module
                    .p2p_query(self.dev, peer)
                    .map_err(|e| format!("P2P_QUERY for {name}: {e}"))?;
                let r = self.module.dma_map(a.handle(), 0, a.size(), peer);
                if let Ok(m) = &r {
                    let _ = self.unmap_raw(m.map_handle());
                }
                match (q.map_type, r) {
                    (MapType::NotSupported, r) => want_lib_errno(
                        &format!("DMA_MAP for {name}, which P2P_QUERY says cannot do P2P"),
                        r,
                        Errno::REMOTEIO,
                    ),
                    (t, Ok(m)) if m.map_type == t => Ok(()),
                    (t, Ok(m)) => {
                        fail!("{name}: P2P_QUERY says {t}, DMA_MAP mapped {}", m.map_type)
                    }
                    (t, Err(e)) => fail!("{name}: P2P_QUERY says {t}, DMA_MAP failed: {e}"),
                }
            })
            .collect();
        all(checks)
    }
}
