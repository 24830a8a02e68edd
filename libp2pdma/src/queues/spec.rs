//! The NVMe specification as the queues path needs it: controller
//! registers and how to reset and enable a controller through them,
//! submission and completion queue entries, PRP data pointers, and the
//! IDENTIFY fields used.

use std::{
    thread,
    time::{Duration, Instant},
};

use super::vfio::Bar;

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

/// The address of byte `offset` of a mapping made of `segs` (`(address,
/// length)` in order), if it is inside.
pub fn seg_addr(segs: &[(u64, u64)], offset: u64) -> Option<u64> {
    seg_run(segs, offset).map(|(a, _)| a)
}

/// The address of byte `offset` of a mapping made of `segs`, and how many
/// bytes from there on its segment holds.
pub fn seg_run(segs: &[(u64, u64)], offset: u64) -> Option<(u64, u64)> {
    // Invariant: `offset >= start`, or the previous segment held it.
    let mut start = 0u64;
    for &(addr, len) in segs {
        if offset - start < len {
            let into = offset - start;
            return Some((addr.checked_add(into)?, len - into));
        }
        start = start.checked_add(len)?;
    }
    None
}

/// The segments of a DMA mapping, searchable by offset: segments that
/// continue each other on the bus are merged, so a run is as long as the
/// device sees it contiguous.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Segments {
    /// `(address, length)` of each run, in order, none empty.
    runs: Vec<(u64, u64)>,
    /// The offset just past each run.
    ends: Vec<u64>,
}

impl Segments {
    /// From `(address, length)` segments in order; `None` when their
    /// lengths or addresses overflow.
    pub fn new(segs: &[(u64, u64)]) -> Option<Self> {
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(segs.len());
        let mut ends = Vec::with_capacity(segs.len());
        let mut end = 0u64;
        for &(addr, len) in segs.iter().filter(|s| s.1 > 0) {
            addr.checked_add(len)?;
            end = end.checked_add(len)?;
            match runs.last_mut() {
                Some(last) if last.0 + last.1 == addr => {
                    last.1 += len;
                    *ends.last_mut()? = end;
                }
                _ => {
                    runs.push((addr, len));
                    ends.push(end);
                }
            }
        }
        Some(Self { runs, ends })
    }

    /// Bytes covered.
    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether no byte is covered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device's address of byte `offset`, and how many bytes from there
    /// on are contiguous for the device.
    pub fn run(&self, offset: u64) -> Option<(u64, u64)> {
        let i = self.ends.partition_point(|&e| e <= offset);
        let &(addr, len) = self.runs.get(i)?;
        let into = offset - (self.ends[i] - len);
        Some((addr + into, len - into))
    }

    /// The device's address of the `len` bytes at `offset`, if they are all
    /// contiguous for the device.
    pub fn contiguous(&self, offset: u64, len: u64) -> Option<u64> {
        self.run(offset)
            .and_then(|(a, n)| (len > 0 && n >= len).then_some(a))
    }

    /// The data pointer of `len` bytes at `offset`: see [`data_ptr`].
    pub fn data_ptr(&self, offset: usize, len: usize) -> Result<DataPtr, String> {
        data_ptr(
            |o| {
                self.run(o as u64)
                    .map(|(a, n)| (a, usize::try_from(n).unwrap_or(usize::MAX)))
            },
            offset,
            len,
        )
    }
}

/// A transfer's data pointer: PRP1 (the first byte), and the page
/// addresses of the rest, which go to PRP2 (one) or a PRP list (more).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataPtr {
    /// The address of the first byte, dword aligned.
    pub prp1: u64,
    /// The addresses of the following memory pages, page aligned.
    pub pages: Vec<u64>,
}

impl DataPtr {
    /// The `(address, length)` ranges a controller moves for a transfer of
    /// `len` bytes through this pointer: the first up to the end of PRP1's
    /// memory page, then a page (or the rest) per entry.
    pub fn ranges(&self, len: usize) -> Vec<(u64, usize)> {
        let first = (PAGE - (self.prp1 as usize % PAGE)).min(len);
        let mut out = vec![(self.prp1, first)];
        let mut done = first;
        for &a in &self.pages {
            let n = PAGE.min(len - done);
            out.push((a, n));
            done += n;
        }
        out
    }
}

/// The data pointer for `len` bytes at `offset` of memory where `run(o)`
/// gives the device's address of byte `o` and how many bytes from there on
/// are contiguous for the device: the first entry runs to the end of its
/// memory page, every further one covers a whole page (or the rest).
/// Refuses memory where a page is not contiguous in the device's address
/// space, or does not start on a page boundary there.
pub fn data_ptr(
    run: impl Fn(usize) -> Option<(u64, usize)>,
    offset: usize,
    len: usize,
) -> Result<DataPtr, String> {
    if len == 0 {
        return Err("a transfer of 0 bytes".into());
    }
    // The device's address of the `n` bytes at `o`, which must be
    // contiguous for it.
    let chunk = |o: usize, n: usize| -> Result<u64, String> {
        match run(o) {
            None => Err(format!("byte {o} has no DMA address")),
            Some((a, have)) if have < n => Err(format!(
                "bytes {o}..{} are not contiguous for the device (only {have} from {a:#x} are)",
                o + n
            )),
            Some((a, _)) => Ok(a),
        }
    };
    let Some((prp1, _)) = run(offset) else {
        return Err(format!("byte {offset} has no DMA address"));
    };
    if prp1 % 4 != 0 {
        return Err(format!("PRP1 {prp1:#x} is not dword aligned"));
    }
    let first = (PAGE - (prp1 as usize % PAGE)).min(len);
    chunk(offset, first)?;
    let mut pages = Vec::new();
    let mut done = first;
    while done < len {
        let n = PAGE.min(len - done);
        let a = chunk(offset + done, n)?;
        if a % PAGE as u64 != 0 {
            return Err(format!(
                "byte {} starts a memory page at {a:#x}, not page aligned",
                offset + done
            ));
        }
        pages.push(a);
        done += n;
    }
    Ok(DataPtr { prp1, pages })
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

pub(crate) fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not done after {timeout:?}"));
        }
        thread::sleep(Duration::from_micros(200));
    }
}

/// The doorbell of queue `qid`: its submission queue's tail (`cq` false)
/// or its completion queue's head, for a doorbell stride of `stride` bytes.
pub fn doorbell(qid: u16, cq: bool, stride: usize) -> usize {
    reg::DOORBELLS + (2 * usize::from(qid) + usize::from(cq)) * stride
}

/// Resets the controller behind `bar` (`CC.EN` = 0), points it at admin
/// queues of `entries` entries at bus addresses `asq` and `acq`, and enables
/// it with 4 KiB pages and the NVM command set; waits for `CSTS.RDY` within
/// the time `CAP.TO` allows. Returns what `CAP` says. A controller that does
/// not become ready is left disabled, not pointing at the caller's memory.
pub fn enable(bar: &Bar, entries: u16, asq: u64, acq: u64) -> Result<Caps, String> {
    let caps = Caps::decode(bar.read64(reg::CAP)?);
    if !caps.nvm || caps.mps_min > PAGE {
        return Err(format!(
            "CAP: NVM command set {}, smallest page {} bytes",
            caps.nvm, caps.mps_min
        ));
    }
    if entries < 2 || u32::from(entries) > caps.mqes.min(4096) {
        return Err(format!(
            "an admin queue of {entries} entries (the controller takes 2 to {})",
            caps.mqes.min(4096)
        ));
    }
    disable(bar, caps.timeout)?;
    let n = u32::from(entries) - 1;
    bar.write32(reg::AQA, n << 16 | n)?;
    bar.write64(reg::ASQ, asq)?;
    bar.write64(reg::ACQ, acq)?;
    // IOCQES 16 bytes, IOSQES 64 bytes, MPS 4 KiB, NVM, enable.
    bar.write32(reg::CC, 4 << 20 | 6 << 16 | 1)?;
    if let Err(e) = wait_ready(bar, true, caps.timeout) {
        let _ = disable(bar, caps.timeout);
        return Err(e);
    }
    Ok(caps)
}

fn wait_ready(bar: &Bar, ready: bool, timeout: Duration) -> Result<(), String> {
    let what = if ready {
        "CSTS.RDY = 1"
    } else {
        "CSTS.RDY = 0"
    };
    wait_until(what, timeout, || {
        let csts = bar.read32(reg::CSTS)?;
        if csts == u32::MAX || (ready && csts & 2 != 0) {
            return Err(format!("{what}: CSTS {csts:#x} (controller fatal status)"));
        }
        Ok((csts & 1 != 0) == ready)
    })
}

/// Clears `CC.EN` and waits up to `timeout` for the controller to stop,
/// which deletes every queue and ends all its DMA. A controller still
/// becoming ready (`CC.EN` = 1, `CSTS.RDY` = 0) is first given `timeout`
/// to get there: the specification leaves clearing `CC.EN` before then
/// undefined.
pub fn disable(bar: &Bar, timeout: Duration) -> Result<(), String> {
    let cc = bar.read32(reg::CC)?;
    if cc & 1 != 0 {
        let csts = bar.read32(reg::CSTS)?;
        if csts != u32::MAX && csts & 3 == 0 {
            // Whether it got there or not, it is disabled next.
            let _ = wait_ready(bar, true, timeout);
        }
        bar.write32(reg::CC, cc & !1)?;
    }
    wait_ready(bar, false, timeout)
}

/// Normal shutdown (`CC.SHN` = 01, then `CSTS.SHST` = 10 within
/// `shutdown_time`, the controller's RTD3 entry latency where it gives
/// one), then disable within `ready_timeout`.
pub fn shutdown(bar: &Bar, shutdown_time: Duration, ready_timeout: Duration) -> Result<(), String> {
    let cc = bar.read32(reg::CC)?;
    bar.write32(reg::CC, (cc & !(3 << 14)) | 1 << 14)?;
    let shut = wait_until("CSTS.SHST = complete", shutdown_time, || {
        Ok((bar.read32(reg::CSTS)? >> 2) & 3 == 2)
    });
    // Disabled even when the shutdown did not complete.
    let disabled = disable(bar, ready_timeout);
    shut.and(disabled)
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
    /// From the 4 KiB IDENTIFY NAMESPACE data.
    pub fn decode(d: &[u8]) -> Result<Self, String> {
        if d.len() < 192 {
            return Err(format!("{} bytes of IDENTIFY NAMESPACE data", d.len()));
        }
        let nsze = u64::from_le_bytes(d[0..8].try_into().map_err(|_| "short")?);
        let f = usize::from(d[26] & 0xf);
        let lbaf = &d[128 + 4 * f..132 + 4 * f];
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
    fn segment_addresses_follow_the_segments() {
        let segs = [(0x10_0000, 0x2000), (0x50_0000, 0x1000), (0x9000, 0x3000)];
        assert_eq!(seg_addr(&segs, 0), Some(0x10_0000));
        assert_eq!(seg_addr(&segs, 0x1fff), Some(0x10_1fff));
        assert_eq!(seg_addr(&segs, 0x2000), Some(0x50_0000));
        assert_eq!(seg_addr(&segs, 0x3004), Some(0x9004));
        assert_eq!(seg_addr(&segs, 0x5fff), Some(0xbfff));
        assert_eq!(seg_addr(&segs, 0x6000), None);
        assert_eq!(seg_addr(&[], 0), None);
    }

    fn scattered(o: usize) -> Option<(u64, usize)> {
        // Page i of the buffer lies at 0x100000 * (i + 1), 24 pages in all.
        (o < 24 * PAGE).then(|| {
            (
                0x10_0000 * (o / PAGE + 1) as u64 + (o % PAGE) as u64,
                PAGE - o % PAGE,
            )
        })
    }

    #[test]
    fn segments_merge_runs_and_find_offsets() {
        let s = Segments::new(&[
            (0x10_0000, 0x1000),
            (0x10_1000, 0x1000),
            (0, 0),
            (0x50_0000, 0x800),
            (0x9000, 0x3000),
        ])
        .unwrap();
        assert_eq!(s.len(), 0x5800);
        assert_eq!(s.run(0), Some((0x10_0000, 0x2000)));
        assert_eq!(s.run(0x1fff), Some((0x10_1fff, 1)));
        assert_eq!(s.run(0x2000), Some((0x50_0000, 0x800)));
        assert_eq!(s.run(0x2804), Some((0x9004, 0x2ffc)));
        assert_eq!(s.run(0x5800), None);
        assert_eq!(s.contiguous(0x800, 0x1800), Some(0x10_0800));
        assert_eq!(s.contiguous(0x800, 0x1801), None);
        assert_eq!(s.contiguous(0, 0), None);
        assert!(Segments::new(&[(u64::MAX, 2)]).is_none());
        for o in 0..0x5800u64 {
            assert_eq!(
                s.run(o).map(|r| r.0),
                seg_addr(
                    &[(0x10_0000, 0x2000), (0x50_0000, 0x800), (0x9000, 0x3000)],
                    o
                )
            );
        }
    }

    #[test]
    fn a_page_whose_middle_lies_elsewhere_is_refused() {
        // The first and last bytes of the page are where a contiguous page
        // would have them; the bytes between are not.
        let s =
            Segments::new(&[(0x10_0000, 0x800), (0x70_0000, 0x400), (0x10_0c00, 0x400)]).unwrap();
        assert!(s.data_ptr(0, PAGE).unwrap_err().contains("contiguous"));
        assert!(s.data_ptr(0, 0x800).is_ok());
    }

    #[test]
    fn data_pointers_split_at_memory_pages() {
        // Inside one page: PRP1 only.
        let p = data_ptr(scattered, 0x200, 512).unwrap();
        assert_eq!(
            p,
            DataPtr {
                prp1: 0x10_0200,
                pages: vec![]
            }
        );
        // Across one page boundary: PRP1 and one page.
        let p = data_ptr(scattered, 0x200, PAGE).unwrap();
        assert_eq!(p.prp1, 0x10_0200);
        assert_eq!(p.pages, vec![0x20_0000]);
        // Many pages from a page-aligned start.
        let p = data_ptr(scattered, PAGE, 5 * PAGE + 1).unwrap();
        assert_eq!(p.prp1, 0x20_0000);
        assert_eq!(
            p.pages,
            vec![0x30_0000, 0x40_0000, 0x50_0000, 0x60_0000, 0x70_0000]
        );
        assert!(data_ptr(scattered, 2, 8).unwrap_err().contains("dword"));
        assert!(data_ptr(scattered, 23 * PAGE, 2 * PAGE).is_err());
        assert!(data_ptr(scattered, 0, 0).is_err());
    }

    #[test]
    fn a_page_split_for_the_device_is_refused() {
        // Byte 0x800 of each page jumps elsewhere.
        let split = |o: usize| {
            Some(if o % PAGE < 0x800 {
                (o as u64, 0x800 - o % PAGE)
            } else {
                (0x80_0000 + o as u64, PAGE - o % PAGE)
            })
        };
        assert!(data_ptr(split, 0, 0x1000)
            .unwrap_err()
            .contains("contiguous"));
        // A later page that is not page aligned for the device.
        let shifted = |o: usize| {
            Some(if o < PAGE {
                (o as u64, PAGE - o)
            } else {
                (0x10 + o as u64, 8 * PAGE)
            })
        };
        assert!(data_ptr(shifted, 0, 2 * PAGE)
            .unwrap_err()
            .contains("aligned"));
    }

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
        // Format 1 in use: 4 KiB blocks with 8 bytes of metadata.
        n[26] = 1;
        n[128 + 2] = 9;
        n[132..136].copy_from_slice(&[8, 0, 12, 0]);
        let ns = IdNs::decode(&n).unwrap();
        assert_eq!((ns.nsze, ns.block_size, ns.metadata), (131072, 4096, 8));
        n[134] = 3;
        assert!(IdNs::decode(&n).is_err());
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
