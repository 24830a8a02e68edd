//! `P2P_QUERY`: the NVMe peer named by fd and by PCI address, the
//! accelerator as its own peer, and the peers and arguments it refuses.

use std::os::fd::AsRawFd;

use p2pdma::{sys, MapType, P2pQuery, PciAddress, Peer};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};

use super::{all, want_errno, want_lib_errno, Ctx, ExpectP2p, Why, R};
use crate::util::errno_name;

/// The text the kernel gives when two devices cannot do P2P.
const NO_P2P_REASON: &str = "do not share an upstream bridge or whitelisted host bridge";

impl Ctx {
    pub(super) fn p2p_query_nvme(&mut self) -> R {
        let nvme = self.nvme()?;
        let mut raw = abi::P2pdmaP2pQuery {
            dev_index: self.dev,
            flags: abi::P2PDMA_PEER_FD,
            peer: abi::P2pdmaPeer {
                fd: nvme.as_raw_fd(),
                ..Default::default()
            },
            ..Default::default()
        };
        sys::p2p_query(&self.module, &mut raw)
            .map_err(|e| format!("P2P_QUERY: {}", errno_name(e)))?;
        let q = P2pQuery::from(&raw);
        self.nvme_query = Some(q.clone());
        let Some(pci) = self.nvme_pci else {
            fail!(
                "cannot find the PCI function of {} in sysfs",
                self.nvme_path
            );
        };
        ensure!(
            q.peer == pci,
            "the peer resolved to {}, but {} is {pci}",
            q.peer,
            self.nvme_path
        );
        ensure!(
            raw.pad1 == 0 && raw.reserved == [0; 4],
            "pad/reserved not zeroed: {raw:?}"
        );
        match q.map_type {
            MapType::BusAddr | MapType::ThruHostBridge => {
                ensure!(
                    raw.distance >= 0,
                    "{} with distance {}",
                    q.map_type,
                    raw.distance
                )
            }
            MapType::NotSupported => {
                ensure!(
                    raw.distance == -1,
                    "not-supported with distance {}",
                    raw.distance
                )
            }
            MapType::Unknown(t) => fail!("unknown map_type {t}"),
        }
        match self.expect {
            Some(ExpectP2p::Supported) => ensure!(
                q.map_type == MapType::BusAddr && raw.distance >= 0,
                "expected bus-addr with a distance, got {} distance {} ({})",
                q.map_type,
                raw.distance,
                q.reason
            ),
            Some(ExpectP2p::Unsupported) => ensure!(
                q.map_type == MapType::NotSupported && raw.distance == -1 && q.reason.contains(NO_P2P_REASON),
                "expected not-supported, distance -1 and a reason containing {NO_P2P_REASON:?}; got {} distance {} reason {:?}",
                q.map_type,
                raw.distance,
                q.reason
            ),
            None => {}
        }
        Ok(())
    }

    pub(super) fn p2p_query_pci(&self) -> R {
        self.nvme()?;
        let (Some(pci), Some(by_fd)) = (self.nvme_pci, &self.nvme_query) else {
            fail!(
                "no PCI address or fd answer for {} to compare with",
                self.nvme_path
            );
        };
        let q = self.module.p2p_query(self.dev, Peer::Pci(pci))?;
        ensure!(q.peer == pci, "peer {pci} echoed as {}", q.peer);
        ensure!(
            q.map_type == by_fd.map_type && q.distance == by_fd.distance,
            "by PCI address: {} distance {:?}; by fd: {} distance {:?}",
            q.map_type,
            q.distance,
            by_fd.map_type,
            by_fd.distance
        );
        Ok(())
    }

    pub(super) fn p2p_query_self(&self) -> R {
        let q = self.module.p2p_query(self.dev, self.self_peer())?;
        ensure!(
            q.map_type == MapType::BusAddr && q.distance.is_some(),
            "the accelerator as its own peer: {} distance {:?} ({})",
            q.map_type,
            q.distance,
            q.reason
        );
        ensure!(
            q.peer == self.accel.pci,
            "peer {} echoed as {}",
            self.accel.pci,
            q.peer
        );
        Ok(())
    }

    fn raw_query(&self, f: impl FnOnce(&mut abi::P2pdmaP2pQuery)) -> Result<(), Errno> {
        let (flags, peer) = self.self_peer().to_abi();
        let mut q = abi::P2pdmaP2pQuery {
            dev_index: self.dev,
            flags,
            peer,
            ..Default::default()
        };
        f(&mut q);
        sys::p2p_query(&self.module, &mut q)
    }

    pub(super) fn p2p_query_bad_peers(&self) -> R {
        let null = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("open /dev/null: {e}"))?;
        let closed = {
            let fd = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| format!("open /dev/null: {e}"))?;
            fd.as_raw_fd()
        };
        let by_fd = |fd: i32| {
            self.raw_query(|q| {
                q.flags = abi::P2PDMA_PEER_FD;
                q.peer = abi::P2pdmaPeer {
                    fd,
                    ..Default::default()
                };
            })
        };
        let nowhere: PciAddress = "0000:fe:1f.7".parse()?;
        all(vec![
            want_errno(
                "P2P_QUERY with /dev/null as the peer",
                by_fd(null.as_raw_fd()),
                Errno::NOTBLK,
            ),
            want_errno(
                "P2P_QUERY with a closed fd as the peer",
                by_fd(closed),
                Errno::BADF,
            ),
            want_lib_errno(
                "P2P_QUERY with peer 0000:fe:1f.7",
                self.module.p2p_query(self.dev, Peer::Pci(nowhere)),
                Errno::NODEV,
            ),
        ])
    }

    pub(super) fn p2p_query_bad_args(&self) -> R {
        let mut checks = vec![
            want_errno(
                "P2P_QUERY with flags 0x80",
                self.raw_query(|q| q.flags = 0x80),
                Errno::INVAL,
            ),
            want_errno(
                "P2P_QUERY with reserved[2] 1",
                self.raw_query(|q| q.reserved[2] = 1),
                Errno::INVAL,
            ),
            want_errno(
                "P2P_QUERY with peer.pad0 1",
                self.raw_query(|q| q.peer.pad0 = 1),
                Errno::INVAL,
            ),
        ];
        if let Some(slot) = self.free_slot() {
            checks.push(want_errno(
                &format!("P2P_QUERY of empty slot {slot}"),
                self.raw_query(|q| q.dev_index = slot),
                Errno::NODEV,
            ));
        }
        all(checks)
    }
}
