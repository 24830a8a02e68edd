//! The ioctl interface itself: `GET_VERSION` and `DEVICE_INFO` against
//! what sysfs and the other calls say, and the dispatch refusing unknown
//! request codes, arguments of the wrong size and bad pointers.

use p2pdma::sys::{self, InvalidPointer};
use p2pdma_abi as abi;
use rustix::{io::Errno, ioctl::opcode};

use super::{all, p2pmem_path, read_sysfs_u64, want_errno, Ctx, Why, PAGE, R};
use crate::util::errno_name;

impl Ctx {
    pub(super) fn version(&self) -> R {
        let v = sys::get_version(&self.module)
            .map_err(|e| format!("GET_VERSION: {}", errno_name(e)))?;
        let caps = abi::P2PDMA_CAP_BAR_P2PMEM
            | abi::P2PDMA_CAP_ALLOC
            | abi::P2PDMA_CAP_P2P_QUERY
            | abi::P2PDMA_CAP_DMA_MAP
            | abi::P2PDMA_CAP_DMABUF
            | abi::P2PDMA_CAP_REVOKE
            | abi::P2PDMA_CAP_MAP_DIRECTION;
        let n = self.module.accelerators()?.len();
        ensure!(
            v.abi_version == abi::P2PDMA_ABI_VERSION,
            "ABI version {}, expected {}",
            v.abi_version,
            abi::P2PDMA_ABI_VERSION
        );
        ensure!(
            v.abi_min_compat <= v.abi_version,
            "abi_min_compat {} > abi_version {}",
            v.abi_min_compat,
            v.abi_version
        );
        ensure!(
            v.capabilities & caps == caps,
            "capabilities {:#x} lack {:#x}",
            v.capabilities,
            caps & !v.capabilities
        );
        ensure!(
            v.num_devices as usize == n,
            "num_devices {} but DEVICE_INFO finds {n}",
            v.num_devices
        );
        ensure!(
            v.reserved0 == 0 && v.reserved == [0; 4],
            "reserved fields not zeroed: {v:?}"
        );
        Ok(())
    }

    pub(super) fn device_info(&self) -> R {
        let i = sys::device_info(&self.module, self.dev)
            .map_err(|e| format!("DEVICE_INFO: {}", errno_name(e)))?;
        ensure!(
            i.index == self.dev,
            "index {} for device {}",
            i.index,
            self.dev
        );
        ensure!(
            i.flags == 0 && i.pad0 == 0 && i.reserved == [0; 4],
            "flags/pad/reserved not zeroed: {i:?}"
        );
        ensure!(
            i.p2p_size > 0 && i.p2p_size <= i.bar_size,
            "p2p_size {:#x} for a {:#x}-byte BAR",
            i.p2p_size,
            i.bar_size
        );
        ensure!(
            i.bar_bus_addr % PAGE == 0,
            "BAR bus address {:#x} not page aligned",
            i.bar_bus_addr
        );
        let size = read_sysfs_u64(&p2pmem_path(self.accel.pci, "size"))?;
        ensure!(
            size == i.p2p_size,
            "p2p_size {:#x}, but p2pmem/size is {size:#x}",
            i.p2p_size
        );
        ensure!(
            i.p2p_available <= i.p2p_size,
            "p2p_available {:#x} > p2p_size {:#x}",
            i.p2p_available,
            i.p2p_size
        );
        Ok(())
    }

    pub(super) fn device_info_bad_args(&self) -> R {
        let with = |f: &dyn Fn(&mut abi::P2pdmaDeviceInfo)| {
            let mut i = abi::P2pdmaDeviceInfo {
                index: self.dev,
                ..Default::default()
            };
            f(&mut i);
            sys::device_info_raw(&self.module, &mut i)
        };
        all(vec![
            want_errno(
                "DEVICE_INFO with flags 1",
                with(&|i| i.flags = 1),
                Errno::INVAL,
            ),
            want_errno(
                "DEVICE_INFO with reserved[0] 1",
                with(&|i| i.reserved[0] = 1),
                Errno::INVAL,
            ),
            want_errno(
                "DEVICE_INFO of index 64",
                sys::device_info(&self.module, 64),
                Errno::INVAL,
            ),
            want_errno(
                "DEVICE_INFO of index u32::MAX",
                sys::device_info(&self.module, u32::MAX),
                Errno::INVAL,
            ),
        ])
    }

    pub(super) fn ioctl_unknown(&self) -> R {
        let codes = [
            (
                "_IOWR(0xBC, 0x7f, P2pdmaAlloc)",
                opcode::read_write::<abi::P2pdmaAlloc>(0xBC, 0x7f),
            ),
            ("_IO(0xBC, 0x09)", opcode::none(0xBC, 0x09)),
            ("UDMABUF_CREATE", opcode::write::<[u64; 3]>(b'u', 0x42)),
        ];
        self.want_codes_refused(&codes, InvalidPointer::Null, Errno::NOTTY, |name| {
            name.to_string()
        })
    }

    pub(super) fn ioctl_wrong_size(&self) -> R {
        let codes = [
            (
                "ALLOC with a 64-byte argument",
                opcode::read_write::<[u8; 64]>(0xBC, 0x02),
            ),
            (
                "DEVICE_INFO with a 96-byte argument",
                opcode::read_write::<[u8; 96]>(0xBC, 0x01),
            ),
            (
                "FREE as _IOWR",
                opcode::read_write::<abi::P2pdmaFree>(0xBC, 0x03),
            ),
        ];
        self.want_codes_refused(&codes, InvalidPointer::Null, Errno::NOTTY, |name| {
            name.to_string()
        })
    }

    pub(super) fn ioctl_bad_pointer(&self, pointer: InvalidPointer) -> R {
        let codes = [
            ("GET_VERSION", abi::P2PDMA_IOC_GET_VERSION),
            ("DEVICE_INFO", abi::P2PDMA_IOC_DEVICE_INFO),
            ("ALLOC", abi::P2PDMA_IOC_ALLOC),
            ("FREE", abi::P2PDMA_IOC_FREE),
            ("P2P_QUERY", abi::P2PDMA_IOC_P2P_QUERY),
            ("DMA_MAP", abi::P2PDMA_IOC_DMA_MAP),
            ("PIN_USER", abi::P2PDMA_IOC_PIN_USER),
            ("UNMAP", abi::P2PDMA_IOC_UNMAP),
            ("DMABUF_IMPORT", abi::P2PDMA_IOC_DMABUF_IMPORT),
        ];
        self.want_codes_refused(&codes, pointer, Errno::FAULT, |name| {
            format!("{name} with a {pointer:?} argument")
        })
    }

    /// Sends each request code of `codes` with a `pointer` argument and
    /// checks that every one fails with `want`; `what` names the call of a
    /// code in the messages.
    fn want_codes_refused(
        &self,
        codes: &[(&str, u32)],
        pointer: InvalidPointer,
        want: Errno,
        what: impl Fn(&str) -> String,
    ) -> R {
        all(codes
            .iter()
            .map(|&(name, code)| {
                want_errno(
                    &what(name),
                    sys::ioctl_invalid_pointer(&self.module, code, pointer),
                    want,
                )
            })
            .collect())
    }
}
