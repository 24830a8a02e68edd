//! An NVMe controller driven from user space: its registers through a BAR
//! mapping, its queues and data in memory the caller hands over together
//! with the DMA address of every byte ([`DmaMem`]). Polled, one command at a
//! time, each with a deadline; every completion's status is checked.
//!
//! Only what the DMA checks need: reset and enable, IDENTIFY, I/O queue
//! creation and deletion (physically contiguous, interrupts off), READ,
//! WRITE and FLUSH with PRP1, PRP2 and one PRP list page.

use std::{
    thread,
    time::{Duration, Instant},
};

use crate::vfio::Bar;

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

/// Memory a device reaches by DMA: copies for the CPU, and the device's
/// address of each byte.
pub trait DmaMem {
    /// Bytes reachable.
    fn len(&self) -> usize;
    /// Whether no byte is reachable.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The DMA address of the byte at `offset`, if mapped.
    fn dma_addr(&self, offset: usize) -> Option<u64>;
    /// Copies `src` to `offset`.
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), String>;
    /// Copies `dst.len()` bytes at `offset` into `dst`.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), String>;
}

/// The address of byte `offset` of a mapping made of `segs` (`(address,
/// length)` in order), if it is inside.
pub fn seg_addr(segs: &[(u64, u64)], offset: u64) -> Option<u64> {
    // Invariant: `offset >= start`, or the previous segment held it.
    let mut start = 0u64;
    for &(addr, len) in segs {
        if offset - start < len {
            return addr.checked_add(offset - start);
        }
        start = start.checked_add(len)?;
    }
    None
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

/// The data pointer for `len` bytes at `offset` of memory whose addresses
/// `addr_of` gives: the first entry runs to the end of its memory page,
/// every further one covers a whole page (or the rest). Refuses memory
/// where a page is not contiguous in the device's address space.
pub fn data_ptr(
    addr_of: impl Fn(usize) -> Option<u64>,
    offset: usize,
    len: usize,
) -> Result<DataPtr, String> {
    if len == 0 {
        return Err("a transfer of 0 bytes".into());
    }
    let addr = |o: usize| addr_of(o).ok_or_else(|| format!("byte {o} has no DMA address"));
    let prp1 = addr(offset)?;
    if prp1 % 4 != 0 {
        return Err(format!("PRP1 {prp1:#x} is not dword aligned"));
    }
    // Each chunk must be contiguous: its last byte where its first says.
    let chunk = |o: usize, a: u64, n: usize| -> Result<(), String> {
        let last = addr(o + n - 1)?;
        if last != a + n as u64 - 1 {
            return Err(format!(
                "bytes {o}..{} are not contiguous for the device ({a:#x}.., last at {last:#x})",
                o + n
            ));
        }
        Ok(())
    };
    let first = (PAGE - (prp1 as usize % PAGE)).min(len);
    chunk(offset, prp1, first)?;
    let mut pages = Vec::new();
    let mut done = first;
    while done < len {
        let a = addr(offset + done)?;
        if a % PAGE as u64 != 0 {
            return Err(format!(
                "byte {} starts a memory page at {a:#x}, not page aligned",
                offset + done
            ));
        }
        let n = PAGE.min(len - done);
        chunk(offset + done, a, n)?;
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

/// A submission and completion queue pair in [`DmaMem`] memory.
pub struct QueuePair<'a> {
    qid: u16,
    entries: u16,
    sq: &'a dyn DmaMem,
    sq_offset: usize,
    cq: &'a dyn DmaMem,
    cq_offset: usize,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
}

impl<'a> QueuePair<'a> {
    /// Queue pair `qid` of `entries` entries, its submission queue at
    /// `sq_offset` of `sq` and its completion queue at `cq_offset` of `cq`
    /// (each page aligned and contiguous for the device). The completion
    /// queue is zeroed here, so that no stale phase tag reads as new.
    pub fn new(
        qid: u16,
        entries: u16,
        (sq, sq_offset): (&'a dyn DmaMem, usize),
        (cq, cq_offset): (&'a dyn DmaMem, usize),
    ) -> Result<Self, String> {
        if entries < 2 {
            return Err(format!("queue {qid}: {entries} entries"));
        }
        for (what, mem, off, size) in [
            ("submission", sq, sq_offset, 64 * usize::from(entries)),
            ("completion", cq, cq_offset, 16 * usize::from(entries)),
        ] {
            let p = data_ptr(|o| mem.dma_addr(o), off, size)
                .map_err(|e| format!("queue {qid}'s {what} queue: {e}"))?;
            let contiguous = p
                .pages
                .iter()
                .enumerate()
                .all(|(i, &a)| a == p.prp1 + ((i + 1) * PAGE) as u64);
            if p.prp1 % PAGE as u64 != 0 || !contiguous {
                return Err(format!(
                    "queue {qid}'s {what} queue at {:#x} is not page aligned and contiguous",
                    p.prp1
                ));
            }
        }
        cq.write(cq_offset, &vec![0u8; 16 * usize::from(entries)])?;
        Ok(Self {
            qid,
            entries,
            sq,
            sq_offset,
            cq,
            cq_offset,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
        })
    }

    /// The submission queue's DMA address.
    pub fn sq_addr(&self) -> u64 {
        self.sq.dma_addr(self.sq_offset).unwrap_or(0)
    }

    /// The completion queue's DMA address.
    pub fn cq_addr(&self) -> u64 {
        self.cq.dma_addr(self.cq_offset).unwrap_or(0)
    }

    /// Entries in each queue.
    pub fn entries(&self) -> u16 {
        self.entries
    }
}

/// A controller being driven, with its admin queue pair and (once created)
/// one I/O queue pair.
pub struct Controller<'a> {
    bar: &'a Bar,
    doorbell_stride: usize,
    ready_timeout: Duration,
    command_timeout: Duration,
    admin: QueuePair<'a>,
    io: Option<QueuePair<'a>>,
    next_cid: u16,
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

fn wait_until(
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

impl<'a> Controller<'a> {
    /// Resets the controller (`CC.EN` = 0), points it at the admin queues
    /// of `admin` and enables it with 4 KiB pages and the NVM command set;
    /// waits for `CSTS.RDY` within the time `CAP.TO` allows.
    pub fn enable(
        bar: &'a Bar,
        admin: QueuePair<'a>,
        command_timeout: Duration,
    ) -> Result<Self, String> {
        let caps = Caps::decode(bar.read64(reg::CAP)?);
        if !caps.nvm || caps.mps_min > PAGE {
            return Err(format!(
                "CAP: NVM command set {}, smallest page {} bytes",
                caps.nvm, caps.mps_min
            ));
        }
        if u32::from(admin.entries) > caps.mqes || admin.qid != 0 {
            return Err(format!(
                "admin queue {} of {} entries (the controller takes {})",
                admin.qid, admin.entries, caps.mqes
            ));
        }
        let ctrl = Self {
            bar,
            doorbell_stride: caps.doorbell_stride,
            ready_timeout: caps.timeout,
            command_timeout,
            admin,
            io: None,
            next_cid: 0,
        };
        ctrl.disable()?;
        let n = u32::from(ctrl.admin.entries) - 1;
        bar.write32(reg::AQA, n << 16 | n)?;
        bar.write64(reg::ASQ, ctrl.admin.sq_addr())?;
        bar.write64(reg::ACQ, ctrl.admin.cq_addr())?;
        // IOCQES 16 bytes, IOSQES 64 bytes, MPS 4 KiB, NVM, enable.
        bar.write32(reg::CC, 4 << 20 | 6 << 16 | 1)?;
        if let Err(e) = ctrl.wait_ready(true) {
            // Not left pointing at memory the caller will free.
            let _ = ctrl.disable();
            return Err(e);
        }
        Ok(ctrl)
    }

    fn wait_ready(&self, ready: bool) -> Result<(), String> {
        let what = if ready {
            "CSTS.RDY = 1"
        } else {
            "CSTS.RDY = 0"
        };
        wait_until(what, self.ready_timeout, || {
            let csts = self.bar.read32(reg::CSTS)?;
            if csts == u32::MAX || (ready && csts & 2 != 0) {
                return Err(format!("{what}: CSTS {csts:#x} (controller fatal status)"));
            }
            Ok((csts & 1 != 0) == ready)
        })
    }

    /// Clears `CC.EN` and waits for the controller to stop (which also
    /// deletes every queue).
    pub fn disable(&self) -> Result<(), String> {
        let cc = self.bar.read32(reg::CC)?;
        if cc & 1 != 0 {
            self.bar.write32(reg::CC, cc & !1)?;
        }
        self.wait_ready(false)
    }

    /// Normal shutdown (`CC.SHN` = 01, then `CSTS.SHST` = 10), then disable.
    pub fn shutdown(&self) -> Result<(), String> {
        let cc = self.bar.read32(reg::CC)?;
        self.bar.write32(reg::CC, (cc & !(3 << 14)) | 1 << 14)?;
        let shut = wait_until("CSTS.SHST = complete", self.ready_timeout, || {
            Ok((self.bar.read32(reg::CSTS)? >> 2) & 3 == 2)
        });
        // Disabled even when the shutdown did not complete.
        let disabled = self.disable();
        shut.and(disabled)
    }

    /// Submits `cmd` on the admin queue (`io` false) or the I/O queue and
    /// polls for its completion until the deadline. Checks that the
    /// completion answers this command; its status is the caller's.
    pub fn submit(&mut self, io: bool, cmd: &Command) -> Result<Completion, String> {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        let timeout = self.command_timeout;
        let (bar, stride) = (self.bar, self.doorbell_stride);
        let q = if io {
            self.io.as_mut().ok_or("no I/O queue")?
        } else {
            &mut self.admin
        };
        // Queue y's submission tail doorbell, then its completion head one.
        let db =
            |qid: u16, cq: bool| reg::DOORBELLS + (2 * usize::from(qid) + usize::from(cq)) * stride;
        q.sq.write(q.sq_offset + 64 * usize::from(q.sq_tail), &cmd.encode(cid))?;
        q.sq_tail = (q.sq_tail + 1) % q.entries;
        bar.write32(db(q.qid, false), u32::from(q.sq_tail))?;
        let slot = q.cq_offset + 16 * usize::from(q.cq_head);
        let mut e = [0u8; 16];
        let deadline = Instant::now() + timeout;
        loop {
            q.cq.read(slot, &mut e)?;
            if Completion::decode(&e).phase == q.phase {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "opcode {:#04x} (cid {cid}) on queue {}: no completion after {timeout:?} (CSTS {:#x})",
                    cmd.opcode,
                    q.qid,
                    bar.read32(reg::CSTS)?
                ));
            }
            thread::sleep(Duration::from_micros(100));
        }
        // Read the entry again now that its phase tag is there: the rest of
        // it was written no later than the tag.
        q.cq.read(slot, &mut e)?;
        let c = Completion::decode(&e);
        q.cq_head += 1;
        if q.cq_head == q.entries {
            q.cq_head = 0;
            q.phase = !q.phase;
        }
        bar.write32(db(q.qid, true), u32::from(q.cq_head))?;
        if c.cid != cid || c.sqid != q.qid {
            return Err(format!(
                "opcode {:#04x}: the completion is for cid {} of queue {}, not cid {cid} of queue {}",
                cmd.opcode, c.cid, c.sqid, q.qid
            ));
        }
        Ok(c)
    }

    /// IDENTIFY with `cns` for `nsid`, into the page at `offset` of `buf`.
    pub fn identify(
        &mut self,
        cns: u8,
        nsid: u32,
        buf: &dyn DmaMem,
        offset: usize,
    ) -> Result<(), String> {
        let p = data_ptr(|o| buf.dma_addr(o), offset, PAGE)?;
        let cmd = Command {
            opcode: admin::IDENTIFY,
            nsid,
            prp1: p.prp1,
            prp2: p.pages.first().copied().unwrap_or(0),
            cdw: [u32::from(cns), 0, 0, 0, 0, 0],
        };
        self.submit(false, &cmd)?
            .check(&format!("IDENTIFY CNS {cns} NSID {nsid}"))
    }

    /// Creates I/O queue pair `io` (queue id >= 1): its completion queue
    /// first (physically contiguous, interrupts off), then its submission
    /// queue.
    pub fn create_io_queues(&mut self, io: QueuePair<'a>) -> Result<(), String> {
        if self.io.is_some() || io.qid == 0 {
            return Err(format!("I/O queue {} cannot be created", io.qid));
        }
        let size_qid = u32::from(io.entries - 1) << 16 | u32::from(io.qid);
        let cq = Command {
            opcode: admin::CREATE_IO_CQ,
            prp1: io.cq_addr(),
            // PC = 1, IEN = 0, interrupt vector 0.
            cdw: [size_qid, 1, 0, 0, 0, 0],
            ..Default::default()
        };
        self.submit(false, &cq)?.check("CREATE IO CQ")?;
        let sq = Command {
            opcode: admin::CREATE_IO_SQ,
            prp1: io.sq_addr(),
            // PC = 1, the completion queue of the same id.
            cdw: [size_qid, u32::from(io.qid) << 16 | 1, 0, 0, 0, 0],
            ..Default::default()
        };
        self.submit(false, &sq)?.check("CREATE IO SQ")?;
        self.io = Some(io);
        Ok(())
    }

    /// Deletes the I/O queue pair: submission queue, then completion queue.
    pub fn delete_io_queues(&mut self) -> Result<(), String> {
        let qid = self.io.as_ref().ok_or("no I/O queue")?.qid;
        let sq = Command {
            opcode: admin::DELETE_IO_SQ,
            cdw: [u32::from(qid), 0, 0, 0, 0, 0],
            ..Default::default()
        };
        self.submit(false, &sq)?.check("DELETE IO SQ")?;
        let cq = Command {
            opcode: admin::DELETE_IO_CQ,
            ..sq
        };
        self.submit(false, &cq)?.check("DELETE IO CQ")?;
        self.io = None;
        Ok(())
    }

    /// Builds the command for a READ or WRITE of `blocks` logical blocks at
    /// `slba` with `len` bytes of data at `offset` of `data`; a PRP list,
    /// when needed, goes in the page at `list_offset` of `list`.
    #[allow(clippy::too_many_arguments)]
    pub fn rw_command(
        opcode: u8,
        nsid: u32,
        slba: u64,
        blocks: u32,
        (data, offset, len): (&dyn DmaMem, usize, usize),
        (list, list_offset): (&dyn DmaMem, usize),
    ) -> Result<Command, String> {
        if blocks == 0 || blocks > 0x1_0000 {
            return Err(format!("{blocks} blocks in one command"));
        }
        let p = data_ptr(|o| data.dma_addr(o), offset, len)?;
        let prp2 = match p.pages.len() {
            0 => 0,
            1 => p.pages[0],
            n if n <= PAGE / 8 => {
                let entries: Vec<u8> = p.pages.iter().flat_map(|a| a.to_le_bytes()).collect();
                list.write(list_offset, &entries)?;
                let l = data_ptr(|o| list.dma_addr(o), list_offset, entries.len())?;
                if l.prp1 % PAGE as u64 != 0 || !l.pages.is_empty() {
                    return Err(format!("the PRP list at {:#x} is not one page", l.prp1));
                }
                l.prp1
            }
            n => return Err(format!("{n} PRP entries do not fit one list page")),
        };
        Ok(Command {
            opcode,
            nsid,
            prp1: p.prp1,
            prp2,
            cdw: [slba as u32, (slba >> 32) as u32, blocks - 1, 0, 0, 0],
        })
    }

    /// Runs `cmd` on the I/O queue; returns its completion (status not
    /// checked).
    pub fn io(&mut self, cmd: &Command) -> Result<Completion, String> {
        self.submit(true, cmd)
    }

    /// FLUSH of namespace `nsid`.
    pub fn flush(&mut self, nsid: u32) -> Result<(), String> {
        let cmd = Command {
            opcode: io::FLUSH,
            nsid,
            ..Default::default()
        };
        self.submit(true, &cmd)?.check("FLUSH")
    }
}

/// The fields of IDENTIFY CONTROLLER that the checks use.
#[derive(Clone, Debug, PartialEq, Eq)]
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

    fn scattered(o: usize) -> Option<u64> {
        // Page i of the buffer lies at 0x100000 * (i + 1), 24 pages in all.
        (o < 24 * PAGE).then(|| 0x10_0000 * (o / PAGE + 1) as u64 + (o % PAGE) as u64)
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
                o as u64
            } else {
                0x80_0000 + o as u64
            })
        };
        assert!(data_ptr(split, 0, 0x1000)
            .unwrap_err()
            .contains("contiguous"));
        // A later page that is not page aligned for the device.
        let shifted = |o: usize| Some(if o < PAGE { o as u64 } else { 0x10 + o as u64 });
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
        let c = IdCtrl::decode(&d).unwrap();
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
