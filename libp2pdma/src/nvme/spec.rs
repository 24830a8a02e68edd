//! The NVMe specification as this library uses it: controller register
//! offsets, admin and I/O opcodes, submission and completion queue entries,
//! the capabilities register and the IDENTIFY fields used.

use std::time::Duration;

/// The memory page size the controller is set up with (`CC.MPS` = 0).
pub const PAGE: usize = 4096;

/// Controller registers (offsets in BAR0).
pub mod reg {
    /// Controller Capabilities.
    pub const CAP: usize = 0x00;
    /// Version.
    pub const VS: usize = 0x08;
    /// Controller Configuration.
    pub const CC: usize = 0x14;
    /// Controller Status.
    pub const CSTS: usize = 0x1c;
    /// Admin Queue Attributes.
    pub const AQA: usize = 0x24;
    /// Admin Submission Queue base address.
    pub const ASQ: usize = 0x28;
    /// Admin Completion Queue base address.
    pub const ACQ: usize = 0x30;
    /// First doorbell.
    pub const DOORBELLS: usize = 0x1000;
}

/// Admin opcodes.
pub mod admin {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Asynchronous Event Request: completes only when the controller has
    /// an event to report.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Firmware Commit.
    pub const FIRMWARE_COMMIT: u8 = 0x10;
    /// Device Self-test.
    pub const DEVICE_SELF_TEST: u8 = 0x14;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Namespace Management.
    pub const NAMESPACE_MANAGEMENT: u8 = 0x0d;
    /// Firmware Image Download.
    pub const FIRMWARE_DOWNLOAD: u8 = 0x11;
    /// Namespace Attachment.
    pub const NAMESPACE_ATTACHMENT: u8 = 0x15;
    /// Doorbell Buffer Config: memory the controller keeps using.
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
    /// Format NVM.
    pub const FORMAT_NVM: u8 = 0x80;
    /// Security Send.
    pub const SECURITY_SEND: u8 = 0x81;
    /// Security Receive.
    pub const SECURITY_RECEIVE: u8 = 0x82;
    /// Sanitize.
    pub const SANITIZE: u8 = 0x84;
    /// Feature Identifier of Number of Queues.
    pub const FEATURE_NUM_QUEUES: u32 = 0x07;
    /// Feature Identifier of Asynchronous Event Configuration.
    pub const FEATURE_ASYNC_EVENT_CONFIG: u32 = 0x0b;
    /// Feature Identifier of the Host Memory Buffer: host memory the
    /// controller keeps using.
    pub const FEATURE_HOST_MEMORY_BUFFER: u32 = 0x0d;
    /// The Changed Namespace List log page, whose reading clears the
    /// Namespace Attribute Changed event unless the read retains it.
    pub const LOG_CHANGED_NAMESPACES: u32 = 0x04;
}

/// NVM command set opcodes.
pub mod io {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
}

/// A submission queue entry's fields (the CID is set at submission).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Command {
    /// Opcode.
    pub opcode: u8,
    /// Namespace.
    pub nsid: u32,
    /// PRP entry 1.
    pub prp1: u64,
    /// PRP entry 2.
    pub prp2: u64,
    /// Command dwords 10 to 15.
    pub cdw: [u32; 6],
}

impl Command {
    /// The 64-byte entry with command identifier `cid`.
    pub fn encode(&self, cid: u16) -> [u8; 64] {
        let mut e = [0u8; 64];
        e[0..4].copy_from_slice(&(u32::from(self.opcode) | u32::from(cid) << 16).to_le_bytes());
        e[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        e[24..32].copy_from_slice(&self.prp1.to_le_bytes());
        e[32..40].copy_from_slice(&self.prp2.to_le_bytes());
        for (i, d) in self.cdw.iter().enumerate() {
            e[40 + 4 * i..44 + 4 * i].copy_from_slice(&d.to_le_bytes());
        }
        e
    }
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// Command specific result (dword 0).
    pub result: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue the command came from.
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// The phase tag.
    pub phase: bool,
    /// Status field: bits 7:0 Status Code, 10:8 Status Code Type, 13 More,
    /// 14 Do Not Retry.
    pub status: u16,
}

impl Completion {
    /// Decodes a 16-byte entry.
    pub fn decode(e: &[u8; 16]) -> Self {
        let dw =
            |i: usize| u32::from_le_bytes([e[4 * i], e[4 * i + 1], e[4 * i + 2], e[4 * i + 3]]);
        let (dw2, dw3) = (dw(2), dw(3));
        Self {
            result: dw(0),
            sqhd: dw2 as u16,
            sqid: (dw2 >> 16) as u16,
            cid: dw3 as u16,
            phase: dw3 & (1 << 16) != 0,
            status: (dw3 >> 17) as u16,
        }
    }

    /// Status Code Type.
    pub fn sct(&self) -> u8 {
        ((self.status >> 8) & 7) as u8
    }

    /// Status Code.
    pub fn sc(&self) -> u8 {
        self.status as u8
    }

    /// `Ok` when the command succeeded, else the status in words.
    pub fn check(&self, what: &str) -> Result<(), String> {
        if self.sct() == 0 && self.sc() == 0 {
            Ok(())
        } else {
            Err(format!(
                "{what}: completed with status SCT {:#x} SC {:#x} (status field {:#06x})",
                self.sct(),
                self.sc(),
                self.status
            ))
        }
    }
}

/// What `CAP` says, decoded.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Maximum Queue Entries Supported (1-based).
    pub mqes: u32,
    /// Doorbell stride in bytes.
    pub doorbell_stride: usize,
    /// Worst-case time to become ready.
    pub timeout: Duration,
    /// Whether the NVM command set is supported.
    pub nvm: bool,
    /// Smallest memory page size, in bytes.
    pub mps_min: usize,
}

impl Caps {
    /// From the `CAP` register.
    pub fn decode(cap: u64) -> Self {
        Self {
            mqes: (cap & 0xffff) as u32 + 1,
            doorbell_stride: 4 << ((cap >> 32) & 0xf),
            timeout: Duration::from_millis(500 * ((cap >> 24) & 0xff).max(1)),
            nvm: cap & (1 << 37) != 0,
            mps_min: 4096 << ((cap >> 48) & 0xf),
        }
    }
}

/// The doorbell of queue `qid`: its submission queue's tail (`cq` false)
/// or its completion queue's head, for a doorbell stride of `stride` bytes.
pub fn doorbell(qid: u16, cq: bool, stride: usize) -> usize {
    reg::DOORBELLS + (2 * usize::from(qid) + usize::from(cq)) * stride
}

/// The fields of IDENTIFY CONTROLLER that the checks use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdCtrl {
    /// Serial number, trimmed.
    pub serial: String,
    /// Model number, trimmed.
    pub model: String,
    /// Maximum Data Transfer Size, a power of two of the smallest page
    /// (0: no limit).
    pub mdts: u8,
    /// Number of namespaces.
    pub nn: u32,
    /// RTD3 Entry Latency: how long a normal shutdown may take, in
    /// microseconds (0: not reported).
    pub rtd3e: u32,
    /// Controller ID.
    pub cntlid: u16,
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities: bit 1
    /// says the subsystem may hold more than one controller.
    pub cmic: u8,
    /// Optional Asynchronous Events Supported: bit 8 is the Namespace
    /// Attribute Notices.
    pub oaes: u32,
}

impl IdCtrl {
    /// Whether the subsystem may have controllers besides this one, through
    /// which namespaces can change.
    pub fn multi_controller(&self) -> bool {
        self.cmic & 2 != 0
    }

    /// Whether the controller reports Namespace Attribute Changed events.
    pub fn namespace_notices(&self) -> bool {
        self.oaes & 1 << 8 != 0
    }
}

impl IdCtrl {
    /// From the 4 KiB IDENTIFY CONTROLLER data.
    pub fn decode(d: &[u8]) -> Result<Self, String> {
        if d.len() < 520 {
            return Err(format!("{} bytes of IDENTIFY CONTROLLER data", d.len()));
        }
        let text = |r: std::ops::Range<usize>| String::from_utf8_lossy(&d[r]).trim().to_string();
        Ok(Self {
            serial: text(4..24),
            model: text(24..64),
            mdts: d[77],
            nn: u32::from_le_bytes([d[516], d[517], d[518], d[519]]),
            rtd3e: u32::from_le_bytes([d[88], d[89], d[90], d[91]]),
            cntlid: u16::from_le_bytes([d[78], d[79]]),
            cmic: d[76],
            oaes: u32::from_le_bytes([d[92], d[93], d[94], d[95]]),
        })
    }
}

/// The fields of IDENTIFY NAMESPACE that the checks use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdNs {
    /// Size in logical blocks.
    pub nsze: u64,
    /// Logical block size in bytes, of the format in use.
    pub block_size: u32,
    /// Metadata bytes per block, of the format in use.
    pub metadata: u16,
}

impl IdNs {
    /// From the IDENTIFY NAMESPACE data. The format in use is FLBAS bits
    /// 3:0, with bits 6:5 above them where a namespace has more than 16
    /// formats; it must be one of the NLBAF + 1 the namespace has, and the
    /// data must hold its descriptor.
    pub fn decode(d: &[u8]) -> Result<Self, String> {
        if d.len() < 132 {
            return Err(format!("{} bytes of IDENTIFY NAMESPACE data", d.len()));
        }
        let nsze = u64::from_le_bytes(d[0..8].try_into().map_err(|_| "short")?);
        let (nlbaf, flbas) = (usize::from(d[25]), d[26]);
        let f = usize::from(flbas & 0xf) | usize::from((flbas >> 5) & 0x3) << 4;
        if f > nlbaf {
            return Err(format!(
                "LBA format {f} in use (FLBAS {flbas:#04x}), but the namespace has {} formats",
                nlbaf + 1
            ));
        }
        let lbaf = d.get(128 + 4 * f..132 + 4 * f).ok_or_else(|| {
            format!(
                "{} bytes of IDENTIFY NAMESPACE data do not hold LBA format {f}",
                d.len()
            )
        })?;
        let lbads = lbaf[2];
        if !(9..=16).contains(&lbads) {
            return Err(format!("LBA format {f}: LBADS {lbads}"));
        }
        Ok(Self {
            nsze,
            block_size: 1 << lbads,
            metadata: u16::from_le_bytes([lbaf[0], lbaf[1]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_completions_have_the_spec_layout() {
        let c = Command {
            opcode: io::READ,
            nsid: 7,
            prp1: 0x1122_3344_5566_7788,
            prp2: 0x99aa_bbcc_ddee_f000,
            cdw: [0x10, 0x20, 0x30, 0, 0, 0x60],
        };
        let e = c.encode(0xbeef);
        assert_eq!(&e[0..4], &[0x02, 0, 0xef, 0xbe]);
        assert_eq!(&e[4..8], &7u32.to_le_bytes());
        assert_eq!(&e[24..32], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&e[32..40], &0x99aa_bbcc_ddee_f000u64.to_le_bytes());
        assert_eq!(&e[40..44], &0x10u32.to_le_bytes());
        assert_eq!(&e[48..52], &0x30u32.to_le_bytes());
        assert_eq!(&e[60..64], &0x60u32.to_le_bytes());

        let mut raw = [0u8; 16];
        raw[0..4].copy_from_slice(&5u32.to_le_bytes());
        raw[8..12].copy_from_slice(&(3u32 << 16 | 9).to_le_bytes());
        // CID 0x42, phase 1, SCT 0 SC 0x80 (LBA out of range), DNR.
        let dw3: u32 = 0x42 | 1 << 16 | (0x80 | 1 << 14) << 17;
        raw[12..16].copy_from_slice(&dw3.to_le_bytes());
        let c = Completion::decode(&raw);
        assert_eq!(
            (c.result, c.sqhd, c.sqid, c.cid, c.phase),
            (5, 9, 3, 0x42, true)
        );
        assert_eq!((c.sct(), c.sc()), (0, 0x80));
        assert!(c.check("READ").unwrap_err().contains("SC 0x80"));
        assert!(Completion::default().check("x").is_ok());
    }

    #[test]
    fn identify_data_is_decoded() {
        let mut d = vec![0u8; PAGE];
        d[4..24].copy_from_slice(b"p2pdma-vfio         ");
        d[24..64].copy_from_slice(&[b' '; 40]);
        d[24..38].copy_from_slice(b"QEMU NVMe Ctrl");
        d[77] = 7;
        d[516..520].copy_from_slice(&256u32.to_le_bytes());
        d[88..92].copy_from_slice(&8_000_000u32.to_le_bytes());
        let c = IdCtrl::decode(&d).unwrap();
        assert_eq!(c.rtd3e, 8_000_000);
        d[78..80].copy_from_slice(&0x41u16.to_le_bytes());
        assert_eq!(IdCtrl::decode(&d).unwrap().cntlid, 0x41);
        assert_eq!(
            (c.serial.as_str(), c.model.as_str()),
            ("p2pdma-vfio", "QEMU NVMe Ctrl")
        );
        assert_eq!((c.mdts, c.nn), (7, 256));
        assert!(IdCtrl::decode(&d[..100]).is_err());

        let mut n = vec![0u8; PAGE];
        n[0..8].copy_from_slice(&131072u64.to_le_bytes());
        // Format 1 of 2 in use: 4 KiB blocks with 8 bytes of metadata.
        n[25] = 1;
        n[26] = 1;
        n[128 + 2] = 9;
        n[132..136].copy_from_slice(&[8, 0, 12, 0]);
        let ns = IdNs::decode(&n).unwrap();
        assert_eq!((ns.nsze, ns.block_size, ns.metadata), (131072, 4096, 8));
        n[134] = 3;
        assert!(IdNs::decode(&n).is_err());
        // One format only: format 1 is not there.
        n[134] = 12;
        n[25] = 0;
        assert!(IdNs::decode(&n).is_err());
    }

    proptest::proptest! {
        /// Any number of formats, any one in use (FLBAS bits 3:0 and 6:5,
        /// with bit 4 and 7 set at random): the descriptor decoded is the
        /// one in use, and a format past NLBAF, or one the data does not
        /// hold, is an error.
        #[test]
        fn the_format_in_use_is_the_whole_index(
            nlbaf in 0usize..64,
            f in 0usize..64,
            extended in proptest::bool::ANY,
            bit7 in proptest::bool::ANY,
            formats in proptest::collection::vec((0u16..64, 9u8..=16), 64),
            len in proptest::sample::select(vec![PAGE, 384, 200]),
        ) {
            let mut n = vec![0u8; PAGE];
            n[0..8].copy_from_slice(&1000u64.to_le_bytes());
            n[25] = nlbaf as u8;
            n[26] = (f & 0xf) as u8 | ((f >> 4) as u8) << 5 | u8::from(extended) << 4 | u8::from(bit7) << 7;
            for (i, (ms, lbads)) in formats.iter().enumerate() {
                n[128 + 4 * i..130 + 4 * i].copy_from_slice(&ms.to_le_bytes());
                n[130 + 4 * i] = *lbads;
            }
            let got = IdNs::decode(&n[..len]);
            if f > nlbaf || 132 + 4 * f > len {
                proptest::prop_assert!(got.is_err(), "format {f} of {} decoded: {got:?}", nlbaf + 1);
            } else {
                let (ms, lbads) = formats[f];
                proptest::prop_assert_eq!(got, Ok(IdNs { nsze: 1000, block_size: 1 << lbads, metadata: ms }));
            }
        }
    }

    #[test]
    fn caps_decode() {
        // QEMU's: MQES 2047, CQR, TO 15, DSTRD 0, NVM, MPSMIN 0, MPSMAX 4.
        let c = Caps::decode(0x0040_0020_0f01_07ff);
        assert_eq!(c.mqes, 2048);
        assert_eq!(c.doorbell_stride, 4);
        assert_eq!(c.timeout, Duration::from_millis(7500));
        assert!(c.nvm);
        assert_eq!(c.mps_min, 4096);
    }
}
