//! An NVMe controller driven from user space one command at a time, for
//! the DMA checks: its queues and data in memory the caller hands over
//! together with the DMA address of every byte ([`DmaMem`]), so that each
//! kind of memory the module maps can be tried in each role. Polled, one
//! command at a time, each with a deadline; every completion's status is
//! checked. The specification's pieces (registers, entries, PRPs, IDENTIFY)
//! are the library's (`p2pdma::nvme`).

use std::{
    thread,
    time::{Duration, Instant},
};

pub use p2pdma::nvme::{
    admin, data_ptr, io, reg, seg_addr, seg_run, Caps, Command, Completion, DataPtr, IdCtrl, IdNs,
    PAGE,
};
use p2pdma::{nvme as spec, queues::registers, sys::vfio::Bar};

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
    fn dma_addr(&self, offset: usize) -> Option<u64> {
        self.dma_run(offset).map(|r| r.0)
    }
    /// The DMA address of the byte at `offset`, if mapped, and how many
    /// bytes from there on are contiguous for the device.
    fn dma_run(&self, offset: usize) -> Option<(u64, usize)>;
    /// Copies `src` to `offset`.
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), String>;
    /// Copies `dst.len()` bytes at `offset` into `dst`.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), String>;
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
            let p = data_ptr(|o| mem.dma_run(o), off, size)
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

impl<'a> Controller<'a> {
    /// Resets the controller (`CC.EN` = 0), points it at the admin queues
    /// of `admin` and enables it with 4 KiB pages and the NVM command set;
    /// waits for `CSTS.RDY` within the time `CAP.TO` allows.
    pub fn enable(
        bar: &'a Bar,
        admin: QueuePair<'a>,
        command_timeout: Duration,
    ) -> Result<Self, String> {
        if admin.qid != 0 {
            return Err(format!("queue {} is not an admin queue", admin.qid));
        }
        let caps = registers::enable(bar, admin.entries, admin.sq_addr(), admin.cq_addr())?;
        Ok(Self {
            bar,
            doorbell_stride: caps.doorbell_stride,
            ready_timeout: caps.timeout,
            command_timeout,
            admin,
            io: None,
            next_cid: 0,
        })
    }

    /// Clears `CC.EN` and waits for the controller to stop (which also
    /// deletes every queue).
    pub fn disable(&self) -> Result<(), String> {
        registers::disable(self.bar, self.ready_timeout)
    }

    /// Normal shutdown, then disable.
    pub fn shutdown(&self) -> Result<(), String> {
        registers::shutdown(self.bar, self.ready_timeout, self.ready_timeout)
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
        let db = |qid: u16, cq: bool| spec::doorbell(qid, cq, stride);
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
        let p = data_ptr(|o| buf.dma_run(o), offset, PAGE)?;
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
        let p = data_ptr(|o| data.dma_run(o), offset, len)?;
        let prp2 = match p.pages.len() {
            0 => 0,
            1 => p.pages[0],
            n if n <= PAGE / 8 => {
                let entries: Vec<u8> = p.pages.iter().flat_map(|a| a.to_le_bytes()).collect();
                list.write(list_offset, &entries)?;
                let l = data_ptr(|o| list.dma_run(o), list_offset, entries.len())?;
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
