//! `DMA_MAP` and `UNMAP`: mappings of accelerator memory for the accelerator
//! itself and for the NVMe, partial ranges, too few segments, the
//! arguments they refuse, and `FREE` of a mapped allocation.

use std::os::fd::AsFd;

use p2pdma::{sys, sys::HostBuffer, MapType, Peer};
use p2pdma_abi as abi;
use rustix::io::Errno;

use super::{all, want_errno, want_lib_errno, Ctx, Why, KIB, MIB, PAGE, R};

impl Ctx {
    pub(super) fn dma_map_self(&self) -> R {
        let a = self.module.alloc(self.dev, 2 * MIB, 2 * MIB)?;
        let m = self
            .module
            .dma_map(a.handle(), 0, a.size(), self.self_peer())?;
        let r = (|| {
            self.check_segs(&m, a.size(), true)?;
            ensure!(m.map_type == MapType::BusAddr, "map type {}", m.map_type);
            ensure!(
                m.segs[0].0 % (2 * MIB) == 0,
                "a 2 MiB-aligned allocation starts at bus address {:#x}",
                m.segs[0].0
            );
            Ok(())
        })();
        let u = self.module.unmap(m).map_err(Why::from);
        all(vec![r, u])
    }

    pub(super) fn dma_map_partial(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let full = self
            .module
            .dma_map(a.handle(), 0, a.size(), self.self_peer())?;
        let full_segs = full.segs.clone();
        self.module.unmap(full)?;
        let part = self
            .module
            .dma_map(a.handle(), 2 * PAGE, 4 * PAGE, self.self_peer())?;
        let r = (|| {
            self.check_segs(&part, 4 * PAGE, true)?;
            // Where offset 2 pages lies in the full mapping, however many
            // segments it has.
            let mut at = 2 * PAGE;
            let mut want = None;
            for &(addr, len) in &full_segs {
                if at < len {
                    want = Some(addr + at);
                    break;
                }
                at -= len;
            }
            let Some(want) = want else {
                fail!(
                    "the full mapping's segments {:x?} do not reach offset {:#x}",
                    full_segs,
                    2 * PAGE
                );
            };
            ensure!(
                part.segs[0].0 == want,
                "offset {:#x} maps at {:#x}, but the full mapping {:x?} has it at {want:#x}",
                2 * PAGE,
                part.segs[0].0,
                full_segs
            );
            Ok(())
        })();
        let u = self.module.unmap(part).map_err(Why::from);
        all(vec![r, u])
    }

    fn raw_dma_map(
        &self,
        handle: u64,
        f: impl FnOnce(&mut abi::P2pdmaDmaMap),
    ) -> (Result<(), Errno>, abi::P2pdmaDmaMap) {
        let (flags, peer) = self.self_peer().to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer,
            handle,
            length: 16 * KIB,
            ..Default::default()
        };
        f(&mut arg);
        let mut segs = [abi::P2pdmaDmaSeg::default(); 8];
        let r = sys::dma_map(&self.module, &mut arg, &mut segs);
        if r.is_ok() {
            let _ = self.unmap_raw(arg.map_handle);
        }
        (r, arg)
    }

    pub(super) fn dma_map_enospc(&self) -> R {
        let a = self.module.alloc(self.dev, 16 * KIB, 0)?;
        let (flags, peer) = self.self_peer().to_abi();
        let mut arg = abi::P2pdmaDmaMap {
            flags,
            peer,
            handle: a.handle(),
            length: a.size(),
            ..Default::default()
        };
        let r = sys::dma_map(&self.module, &mut arg, &mut []);
        self.want_enospc("DMA_MAP with max_segs 0", r, &arg)
    }

    pub(super) fn dma_map_bad_range(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let h = a.handle();
        let size = a.size();
        let case = |what: &str, offset: u64, length: u64| {
            want_errno(
                what,
                self.raw_dma_map(h, |m| {
                    m.offset = offset;
                    m.length = length;
                })
                .0,
                Errno::INVAL,
            )
        };
        all(vec![
            case("DMA_MAP at offset 1", 1, PAGE),
            case("DMA_MAP of 4097 bytes", 0, PAGE + 1),
            case("DMA_MAP of 0 bytes", 0, 0),
            case("DMA_MAP at the end", size, PAGE),
            case("DMA_MAP one page past the end", 0, size + PAGE),
            case(
                "DMA_MAP with offset+length overflowing",
                !(PAGE - 1),
                2 * PAGE,
            ),
        ])
    }

    pub(super) fn dma_map_bad_fields(&self) -> R {
        let a = self.module.alloc(self.dev, 16 * KIB, 0)?;
        let h = a.handle();
        all(vec![
            want_errno(
                "DMA_MAP with flags 0x80",
                self.raw_dma_map(h, |m| m.flags |= 0x80).0,
                Errno::INVAL,
            ),
            want_errno(
                "DMA_MAP with reserved[3] 1",
                self.raw_dma_map(h, |m| m.reserved[3] = 1).0,
                Errno::INVAL,
            ),
            want_errno(
                "DMA_MAP with pad0 1",
                self.raw_dma_map(h, |m| m.pad0 = 1).0,
                Errno::INVAL,
            ),
        ])
    }

    pub(super) fn dma_map_no_such_handle(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let freed = a.handle();
        a.free()?;
        all(vec![
            want_errno(
                "DMA_MAP of handle u64::MAX",
                self.raw_dma_map(u64::MAX, |m| m.length = PAGE).0,
                Errno::NOENT,
            ),
            want_errno(
                "DMA_MAP of a freed handle",
                self.raw_dma_map(freed, |m| m.length = PAGE).0,
                Errno::NOENT,
            ),
        ])
    }

    pub(super) fn dma_map_nvme(&self) -> R {
        let nvme = self.nvme()?;
        let p2p = self.nvme_p2p()?;
        let a = self.module.alloc(self.dev, MIB, 0)?;
        let r = self
            .module
            .dma_map(a.handle(), 0, a.size(), Peer::Fd(nvme.as_fd()));
        if !p2p {
            return want_lib_errno(
                "DMA_MAP for an NVMe that cannot reach the accelerator",
                r,
                Errno::REMOTEIO,
            );
        }
        let m = r?;
        let checks = (|| {
            self.check_segs(&m, a.size(), true)?;
            ensure!(m.map_type == MapType::BusAddr, "map type {}", m.map_type);
            let (lo, hi) = (
                self.accel.bar_bus_addr,
                self.accel.bar_bus_addr + self.accel.bar_size,
            );
            ensure!(
                (lo..hi).contains(&m.segs[0].0),
                "first segment at {:#x}, outside the BAR [{lo:#x}, {hi:#x})",
                m.segs[0].0
            );
            Ok(())
        })();
        let u = self.module.unmap(m).map_err(Why::from);
        all(vec![checks, u])
    }

    pub(super) fn free_while_dma_mapped(&self) -> R {
        let a = self.module.alloc(self.dev, 16 * KIB, 0)?;
        let m = self
            .module
            .dma_map(a.handle(), 0, a.size(), self.self_peer())?;
        let busy = want_errno(
            "FREE of a DMA-mapped allocation",
            self.free_raw(a.handle()),
            Errno::BUSY,
        );
        let unmap = self.module.unmap(m).map_err(Why::from);
        let free = a
            .free()
            .map_err(|e| Why::Fail(format!("FREE after UNMAP: {e}")));
        all(vec![busy, unmap, free])
    }

    pub(super) fn unmap_double(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let m = self
            .module
            .pin_user(buf.addr(), 64 * KIB, self.host_peer())?;
        let h = m.map_handle();
        self.module.unmap(m)?;
        want_errno("second UNMAP", self.unmap_raw(h), Errno::NOENT)
    }

    pub(super) fn unmap_never_issued(&self) -> R {
        want_errno(
            "UNMAP of handle u64::MAX",
            self.unmap_raw(u64::MAX),
            Errno::NOENT,
        )
    }

    pub(super) fn unmap_bad_args(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let m = self
            .module
            .pin_user(buf.addr(), 64 * KIB, self.host_peer())?;
        let good = abi::P2pdmaUnmap {
            map_handle: m.map_handle(),
            ..Default::default()
        };
        all(vec![
            want_errno(
                "UNMAP with flags 1",
                self.unmap_arg(abi::P2pdmaUnmap { flags: 1, ..good }),
                Errno::INVAL,
            ),
            want_errno(
                "UNMAP with reserved0 1",
                self.unmap_arg(abi::P2pdmaUnmap {
                    reserved0: 1,
                    ..good
                }),
                Errno::INVAL,
            ),
            want_errno(
                "UNMAP with reserved[0] 1",
                self.unmap_arg(abi::P2pdmaUnmap {
                    reserved: [1, 0],
                    ..good
                }),
                Errno::INVAL,
            ),
            self.module
                .unmap(m)
                .map_err(|e| Why::Fail(format!("UNMAP after the refused ones: {e}"))),
        ])
    }
}
