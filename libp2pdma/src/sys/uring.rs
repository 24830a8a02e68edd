//! io_uring for the transfer engines: the one place that hands buffers to
//! the kernel for asynchronous I/O.
//!
//! A [`Session`] borrows a pooled ring, the bounce slots, the storage file
//! and (optionally) the accelerator memory for the length of one transfer.
//! Every submission is checked against those borrows, and dropping the
//! session waits for every I/O still in flight, so the kernel never touches a
//! buffer after the transfer that lent it has returned, on any path,
//! including errors and panics. Bounce slots cannot be read or written while
//! an I/O on them is in flight.
#![allow(unsafe_code)]

use std::{
    marker::PhantomData,
    os::fd::{AsRawFd, BorrowedFd},
    sync::Arc,
};

use io_uring::{opcode, types, IoUring};
use rustix::io::Errno;

use crate::{
    nvme::io,
    sys::{DmaTarget, HostBuffer},
    Error, Result,
};

/// A ring and its bounce slots, reused across transfers.
pub(crate) struct Context {
    ring: IoUring,
    /// The slots, back to back: slot `i` is `[i * chunk, (i + 1) * chunk)`.
    slots: Arc<HostBuffer>,
    /// The slots page-locked for device copy engines, by engine name: each
    /// guard undoes its pin when the context drops.
    pins: Vec<(&'static str, Box<dyn Send + Sync>)>,
    chunk: usize,
    depth: usize,
    pinned: bool,
    /// A ring of 128-byte submissions for NVMe commands, made by the first
    /// NVMe-command transfer that takes this context and kept with it.
    nvme: Option<NvmeRing>,
    /// A session's bookkeeping, lent to each session and given back empty:
    /// which slots have an I/O in flight, and the I/Os in flight.
    busy: Vec<bool>,
    inflight: Vec<Option<Pending>>,
}

/// A ring for NVMe passthrough commands: 128-byte submissions, 32-byte
/// completions.
pub(crate) type NvmeRing = IoUring<io_uring::squeue::Entry128, io_uring::cqueue::Entry32>;

/// Bounce slots beyond the I/O depth.
const SPARE_SLOTS: usize = 2;

impl Context {
    /// A ring with `depth` entries and `depth` slots of `chunk` bytes each
    /// (page multiples), locked in memory when the limits allow.
    pub(crate) fn new(depth: usize, chunk: usize) -> Result<Self> {
        let ring = IoUring::new(depth.next_power_of_two() as u32).map_err(|e| Error::Sys {
            op: "io_uring_setup",
            source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
        })?;
        // Spare slots beyond the I/O depth let the storage stage keep `depth`
        // reads in flight while the copy stage empties a landed slot. One
        // region holds them all, so that it can be backed by huge pages.
        let nslots = depth + SPARE_SLOTS;
        let bytes = chunk
            .checked_mul(nslots)
            .ok_or_else(|| Error::InvalidArgument("bounce ring too large".into()))?;
        let slots =
            Arc::new(HostBuffer::new(bytes).map_err(Error::sys("allocate the bounce slots"))?);
        // Register the slots with the ring: the kernel pins them once, here,
        // instead of on every I/O. Without the memlock limit for it, plain
        // reads and writes still work.
        let iovecs: Vec<libc::iovec> = (0..nslots)
            .map(|i| libc::iovec {
                // SAFETY: Slot `i` lies inside the region.
                iov_base: unsafe { slots.as_raw().add(i * chunk) }.cast(),
                iov_len: chunk,
            })
            .collect();
        // SAFETY: The iovecs describe the slots, which live as long as the
        // ring (both are owned by this context, and the ring is dropped
        // first, unregistering them).
        let pinned = unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        Ok(Self {
            ring,
            slots,
            pins: Vec::new(),
            chunk,
            depth,
            pinned,
            nvme: None,
            busy: vec![false; nslots],
            inflight: vec![None; nslots.next_power_of_two() * 4],
        })
    }

    /// Bytes per slot.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// Storage I/Os kept in flight.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// Whether the slots are registered (pinned) with the ring.
    pub(crate) fn pinned(&self) -> bool {
        self.pinned
    }

    /// The slots' memory, for a copy engine to page-lock.
    pub(crate) fn slot_memory(&self) -> Arc<HostBuffer> {
        self.slots.clone()
    }

    /// Whether the slots are page-locked for the copy engine `name`.
    pub(crate) fn pinned_for(&self, name: &str) -> bool {
        self.pins.iter().any(|(n, _)| *n == name)
    }

    /// Keeps `guard`, the slots' pin for the copy engine `name`, as long as
    /// the context.
    pub(crate) fn keep_pin(&mut self, name: &'static str, guard: Box<dyn Send + Sync>) {
        self.pins.push((name, guard));
    }

    /// The NVMe-command ring, `depth` entries, made on first use.
    pub(crate) fn nvme_ring(&mut self) -> Result<&mut NvmeRing> {
        if self.nvme.is_none() {
            let ring = NvmeRing::builder()
                .build(self.depth.next_power_of_two() as u32)
                .map_err(|e| Error::Sys {
                    op: "io_uring_setup (128-byte entries)",
                    source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
                })?;
            self.nvme = Some(ring);
        }
        self.nvme
            .as_mut()
            .ok_or_else(|| Error::InvalidArgument("no NVMe ring".into()))
    }
}

/// Where an I/O's data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buf {
    /// Bounce slot `i`, from its start.
    Slot(usize),
    /// The session's DMA target at this offset.
    Target(usize),
}

/// A finished I/O.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    /// The caller's tag.
    pub(crate) tag: u64,
    /// Bytes moved, or the error.
    pub(crate) res: std::result::Result<usize, Errno>,
}

/// A session's slots, reached from other threads: a pipeline's copy stage
/// empties or fills one slot while the session's I/Os use others. Which
/// thread may use which slot is the pipeline's to decide (`pipeline.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slots {
    /// The first slot's address (an integer, so the view moves between
    /// threads).
    base: usize,
    chunk: usize,
    count: usize,
}

impl Slots {
    /// How many slots there are.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    fn range(&self, i: usize, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if i < self.count && end <= self.chunk => {
                Ok((self.base + i * self.chunk + offset) as *mut u8)
            }
            _ => Err(Error::OutOfBounds {
                offset: (i * self.chunk + offset) as u64,
                len: len as u64,
                size: (self.count * self.chunk) as u64,
            }),
        }
    }

    /// Slot `i`'s bytes `[offset, offset + len)`.
    ///
    /// # Safety
    /// The session they came from is alive, no I/O is in flight on the
    /// slot, and nothing writes the range while the borrow lives.
    pub(crate) unsafe fn bytes(&self, i: usize, offset: usize, len: usize) -> Result<&[u8]> {
        let p = self.range(i, offset, len)?;
        // SAFETY: Inside the slot region (checked); the caller guarantees
        // it is alive and that no one writes the range meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// Slot `i`'s bytes `[offset, offset + len)`, for writing.
    ///
    /// # Safety
    /// The session they came from is alive, no I/O is in flight on the
    /// slot, and nothing else reads or writes the range while the borrow
    /// lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(
        &self,
        i: usize,
        offset: usize,
        len: usize,
    ) -> Result<&mut [u8]> {
        let p = self.range(i, offset, len)?;
        // SAFETY: As for `bytes`, with the caller's exclusive use.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }
}

/// One transfer's use of a [`Context`]; see the module documentation.
pub(crate) struct Session<'a> {
    ctx: &'a mut Context,
    fd: BorrowedFd<'a>,
    /// Offsets a resubmission may start at: the file's `O_DIRECT` block.
    align: u64,
    target: Option<DmaTarget>,
    busy: Vec<bool>,
    inflight: Vec<Option<Pending>>,
    ninflight: usize,
    _mem: PhantomData<&'a ()>,
}

/// What a completion leaves of an I/O.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Part of it moved: queue the rest.
    More,
    /// It is over: the bytes moved in all, or the error.
    Done(std::result::Result<usize, Errno>),
}

/// An I/O in flight, and how much of it earlier completions moved.
#[derive(Clone, Copy)]
struct Pending {
    tag: u64,
    buf: Buf,
    write: bool,
    /// The buffer's address (an integer, so contexts holding these move
    /// between threads).
    ptr: usize,
    offset: u64,
    len: usize,
    done: usize,
}

impl Pending {
    /// Counts a completion's result `r` (bytes, or a negative errno). An
    /// I/O that moved only part of its bytes goes on for the rest, as
    /// `pread`/`pwrite` callers loop; it ends short only when the storage
    /// moved nothing more (the end of a file) or the rest would start off
    /// the `align`-byte block that direct I/O needs.
    fn complete(&mut self, r: i32, align: u64) -> Step {
        if r < 0 {
            return Step::Done(Err(Errno::from_raw_os_error(-r)));
        }
        self.done += r as usize;
        let next = self.offset + self.done as u64;
        if r > 0 && self.done < self.len && next.is_multiple_of(align) {
            Step::More
        } else {
            Step::Done(Ok(self.done))
        }
    }
}

impl<'a> Session<'a> {
    /// Starts a session on `fd`, whose I/Os must start on multiples of
    /// `align` bytes (its `O_DIRECT` block); `target` is the memory direct I/O
    /// may use, borrowed (through `_mem`) for as long as the session lives.
    pub(crate) fn new<M: ?Sized>(
        ctx: &'a mut Context,
        fd: BorrowedFd<'a>,
        align: usize,
        target: Option<(DmaTarget, &'a M)>,
    ) -> Self {
        let busy = std::mem::take(&mut ctx.busy);
        let inflight = std::mem::take(&mut ctx.inflight);
        Self {
            ctx,
            fd,
            align: align.max(1) as u64,
            target: target.map(|(t, _)| t),
            busy,
            inflight,
            ninflight: 0,
            _mem: PhantomData,
        }
    }

    /// Bytes per slot.
    pub(crate) fn chunk(&self) -> usize {
        self.ctx.chunk
    }

    /// Storage I/Os to keep in flight.
    pub(crate) fn depth(&self) -> usize {
        self.ctx.depth
    }

    /// I/Os in flight.
    pub(crate) fn inflight(&self) -> usize {
        self.ninflight
    }

    /// The first free slot.
    pub(crate) fn free_slot(&self) -> Option<usize> {
        self.free_slot_except(&[])
    }

    /// The first free slot not in `skip` (slots whose data awaits a copy).
    pub(crate) fn free_slot_except(&self, skip: &[usize]) -> Option<usize> {
        (0..self.busy.len()).find(|&i| !self.busy[i] && !skip.contains(&i))
    }

    /// The slots, for copies on other threads while the session goes on.
    pub(crate) fn slots(&self) -> Slots {
        Slots {
            base: self.ctx.slots.as_raw() as usize,
            chunk: self.ctx.chunk,
            count: self.busy.len(),
        }
    }

    /// Runs `f` on free slot `i`'s bytes `[offset, offset + len)`.
    pub(crate) fn with_slot<R>(
        &mut self,
        i: usize,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        if self.busy.get(i) != Some(&false) {
            return Err(Error::InvalidArgument(format!(
                "bounce slot {i} busy or missing"
            )));
        }
        let chunk = self.ctx.chunk;
        match offset.checked_add(len) {
            Some(end) if end <= chunk => {}
            _ => {
                return Err(Error::OutOfBounds {
                    offset: offset as u64,
                    len: len as u64,
                    size: chunk as u64,
                })
            }
        }
        // SAFETY: The range lies inside slot `i` (checked above), which no
        // I/O uses (not busy) and nothing else refers to: the kernel only
        // touches slots with an I/O in flight, and `&mut self` keeps other
        // borrows of this slot out. Only the slot's own bytes are borrowed,
        // never the region, whose other slots the kernel may be filling.
        let range = unsafe {
            std::slice::from_raw_parts_mut(self.ctx.slots.as_raw().add(i * chunk + offset), len)
        };
        Ok(f(range))
    }

    fn buf_ptr(&self, buf: Buf, len: usize) -> Result<*mut u8> {
        let oob = |offset: usize, size: usize| Error::OutOfBounds {
            offset: offset as u64,
            len: len as u64,
            size: size as u64,
        };
        match buf {
            Buf::Slot(i) => {
                if i >= self.busy.len() || self.busy[i] {
                    return Err(Error::InvalidArgument(format!(
                        "bounce slot {i} busy or missing"
                    )));
                }
                if len > self.ctx.chunk {
                    return Err(oob(0, self.ctx.chunk));
                }
                // SAFETY: Slot `i` (checked above) lies inside the region.
                Ok(unsafe { self.ctx.slots.as_raw().add(i * self.ctx.chunk) })
            }
            Buf::Target(off) => {
                let t = self.target.ok_or_else(|| {
                    Error::InvalidArgument("no DMA target in this session".into())
                })?;
                match off.checked_add(len) {
                    // SAFETY: In bounds of the target mapping.
                    Some(end) if end <= t.len => Ok(unsafe { t.ptr.add(off) }),
                    _ => Err(oob(off, t.len)),
                }
            }
        }
    }

    fn push(
        &mut self,
        write: bool,
        buf: Buf,
        file_offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<()> {
        let p = self.pending(write, buf, file_offset, len, tag)?;
        let idx = self
            .inflight
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| Error::InvalidArgument("too many I/Os in flight".into()))?;
        self.queue(idx, &p)?;
        if let Buf::Slot(i) = buf {
            self.busy[i] = true;
        }
        self.inflight[idx] = Some(p);
        self.ninflight += 1;
        Ok(())
    }

    /// An I/O of `len` bytes between `file_offset` and `buf`, checked
    /// against the session's borrows, nothing of it moved yet.
    fn pending(
        &self,
        write: bool,
        buf: Buf,
        file_offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<Pending> {
        let ptr = self.buf_ptr(buf, len)?;
        u32::try_from(len).map_err(|_| Error::InvalidArgument("I/O over 4 GiB".into()))?;
        Ok(Pending {
            tag,
            buf,
            write,
            ptr: ptr as usize,
            offset: file_offset,
            len,
            done: 0,
        })
    }

    /// Queues what is left of `p` (all of it, the first time) as entry `idx`.
    fn queue(&mut self, idx: usize, p: &Pending) -> Result<()> {
        // SAFETY: `done < len`, and `ptr` is valid for `len` bytes.
        let ptr = unsafe { (p.ptr as *mut u8).add(p.done) };
        let (offset, len) = (p.offset + p.done as u64, (p.len - p.done) as u32);
        let fd = types::Fd(self.fd.as_raw_fd());
        let sqe = match (p.write, p.buf) {
            (false, Buf::Slot(i)) if self.ctx.pinned => {
                opcode::ReadFixed::new(fd, ptr, len, i as u16)
                    .offset(offset)
                    .build()
            }
            (true, Buf::Slot(i)) if self.ctx.pinned => {
                opcode::WriteFixed::new(fd, ptr, len, i as u16)
                    .offset(offset)
                    .build()
            }
            (false, _) => opcode::Read::new(fd, ptr, len).offset(offset).build(),
            (true, _) => opcode::Write::new(fd, ptr, len).offset(offset).build(),
        }
        .user_data(idx as u64);
        // SAFETY: The buffer is valid for `len` bytes (checked when the I/O
        // was first pushed) and stays so until the completion is reaped:
        // slots are marked busy and the target's memory is borrowed for the
        // session, whose drop waits for every I/O in flight. The fd is
        // borrowed for the session too.
        while unsafe { self.ctx.ring.submission().push(&sqe) }.is_err() {
            self.ctx.ring.submit().map_err(|e| Error::Sys {
                op: "io_uring_enter",
                source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
            })?;
        }
        Ok(())
    }

    /// Moves `len` bytes between `file_offset` and `buf` now, with
    /// `pread` (or `pwrite`, when `write`) on the session's descriptor: for
    /// a lone I/O a ring round trip buys nothing (and may cost a hand-off to
    /// a kernel worker thread). Partial transfers go on by the same rule as
    /// [`Session::wait`]. Returns the bytes moved, or the I/O's errno.
    pub(crate) fn io_now(
        &mut self,
        write: bool,
        buf: Buf,
        file_offset: u64,
        len: usize,
    ) -> Result<std::result::Result<usize, Errno>> {
        let mut p = self.pending(write, buf, file_offset, len, 0)?;
        loop {
            let (at, rest) = (p.offset + p.done as u64, p.len - p.done);
            // SAFETY: `[done, len)` of a free slot or of the borrowed target
            // (checked by `buf_ptr`; `&mut self` keeps the slot free); the
            // slices only carry the range to the kernel for this call.
            let r = unsafe {
                let start = (p.ptr as *mut u8).add(p.done);
                if write {
                    rustix::io::pwrite(self.fd, std::slice::from_raw_parts(start, rest), at)
                } else {
                    rustix::io::pread(
                        self.fd,
                        std::slice::from_raw_parts_mut(
                            start.cast::<std::mem::MaybeUninit<u8>>(),
                            rest,
                        ),
                        at,
                    )
                    .map(|(read, _)| read.len())
                }
            };
            let r = match r {
                Ok(n) => n as i32,
                Err(Errno::INTR) => continue,
                Err(e) => -e.raw_os_error(),
            };
            if let Step::Done(res) = p.complete(r, self.align) {
                return Ok(res);
            }
        }
    }

    /// Queues a read of `len` bytes at `file_offset` into `buf`.
    pub(crate) fn read(&mut self, buf: Buf, file_offset: u64, len: usize, tag: u64) -> Result<()> {
        self.push(false, buf, file_offset, len, tag)
    }

    /// Queues a write of `len` bytes from `buf` to `file_offset`.
    pub(crate) fn write(&mut self, buf: Buf, file_offset: u64, len: usize, tag: u64) -> Result<()> {
        self.push(true, buf, file_offset, len, tag)
    }

    /// Submits what is queued and waits until at least `min` I/Os (at most
    /// the number in flight) have completed; returns all that have.
    ///
    /// An I/O that moves only part of its bytes is resubmitted for the rest,
    /// as `pread`/`pwrite` callers loop, and completes once all have moved.
    /// It completes short only when the storage moved nothing more (the end
    /// of a file) or the rest would start off the file's block (direct I/O
    /// cannot ask for it).
    pub(crate) fn wait(&mut self, min: usize) -> Result<Vec<Completion>> {
        let min = min.min(self.ninflight);
        let mut done = Vec::new();
        loop {
            let want = if done.len() < min { 1 } else { 0 };
            submit_and_wait(&self.ctx.ring.submitter(), want)?;
            let cqes: Vec<(usize, i32)> = self
                .ctx
                .ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result()))
                .collect();
            for (idx, r) in cqes {
                let Some(mut p) = self.inflight.get_mut(idx).and_then(Option::take) else {
                    continue;
                };
                let res = match p.complete(r, self.align) {
                    Step::More => match self.queue(idx, &p) {
                        Ok(()) => {
                            self.inflight[idx] = Some(p);
                            continue;
                        }
                        // Not resubmitted: it ends here, with why.
                        Err(e) => Err(e.errno().unwrap_or(Errno::IO)),
                    },
                    Step::Done(res) => res,
                };
                if let Buf::Slot(i) = p.buf {
                    self.busy[i] = false;
                }
                self.ninflight -= 1;
                done.push(Completion { tag: p.tag, res });
            }
            if done.len() >= min {
                return Ok(done);
            }
        }
    }
}

/// Submits what is queued and waits for `want` completions, retrying when a
/// signal interrupts the wait.
fn submit_and_wait(submitter: &io_uring::Submitter<'_>, want: usize) -> Result<()> {
    loop {
        match submitter.submit_and_wait(want) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(Errno::INTR.raw_os_error()) => continue,
            Err(e) => {
                return Err(Error::Sys {
                    op: "io_uring_enter",
                    source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
                })
            }
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // Nothing may still write into borrowed memory once the session ends.
        while self.ninflight > 0 {
            if self.wait(self.ninflight).is_err() {
                // The ring is unusable; block until the kernel is done with
                // the buffers rather than return while it may still use them.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        // Nothing in flight: the bookkeeping goes back clean.
        self.busy.fill(false);
        self.ctx.busy = std::mem::take(&mut self.busy);
        self.ctx.inflight = std::mem::take(&mut self.inflight);
    }
}

/// `NVME_URING_CMD_IO`: `_IOWR('N', 0x80, struct nvme_uring_cmd)`.
const NVME_URING_CMD_IO: u32 = (3 << 30) | (72 << 16) | ((b'N' as u32) << 8) | 0x80;

/// `struct nvme_uring_cmd` (include/uapi/linux/nvme_ioctl.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NvmeUringCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    rsvd2: u32,
}

const _: () = assert!(std::mem::size_of::<NvmeUringCmd>() == 72);

/// An io_uring submission (128-byte entries) that sends an NVMe READ (or
/// WRITE) of `nlb` logical blocks at `slba` of namespace `nsid`, with `len`
/// bytes of data at user address `addr`, to the NVMe generic character
/// device `fd` (`IORING_OP_URING_CMD`, `NVME_URING_CMD_IO`). The caller
/// keeps the buffer alive and the fd open until it completes.
pub fn nvme_io_sqe(
    fd: std::os::fd::RawFd,
    write: bool,
    nsid: u32,
    slba: u64,
    nlb: u32,
    addr: u64,
    len: u32,
) -> io_uring::squeue::Entry128 {
    let cmd = NvmeUringCmd {
        opcode: if write { io::WRITE } else { io::READ },
        nsid,
        addr,
        data_len: len,
        cdw10: slba as u32,
        cdw11: (slba >> 32) as u32,
        cdw12: nlb.saturating_sub(1),
        ..Default::default()
    };
    let mut bytes = [0u8; 80];
    // SAFETY: `NvmeUringCmd` is 72 bytes of plain integers, copied into
    // the start of the 80-byte command area.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&cmd as *const NvmeUringCmd).cast::<u8>(),
            bytes.as_mut_ptr(),
            std::mem::size_of::<NvmeUringCmd>(),
        )
    };
    opcode::UringCmd80::new(types::Fd(fd), NVME_URING_CMD_IO)
        .cmd(bytes)
        .build()
}

/// How an NVMe command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NvmeResult {
    /// Success.
    Ok,
    /// The kernel refused or failed the command.
    Errno(Errno),
    /// The controller completed it with this NVMe status.
    Status(u32),
}

/// A ring of 128-byte submissions that carries NVMe read and write commands
/// built here to an NVMe generic character device (`/dev/ngXnY`), with data
/// buffers in a borrowed DMA target. Like [`Session`], dropping it waits for
/// every command in flight.
pub(crate) struct NvmeSession<'a> {
    ring: &'a mut NvmeRing,
    fd: BorrowedFd<'a>,
    nsid: u32,
    lba_shift: u32,
    target: DmaTarget,
    inflight: usize,
    _mem: PhantomData<&'a ()>,
}

impl<'a> NvmeSession<'a> {
    /// A session on `ring` (empty: no command in flight) for namespace
    /// `nsid` of the generic device `fd`, whose logical blocks are
    /// `1 << lba_shift` bytes, moving data to and from `target` (borrowed
    /// with `mem` for the session's life).
    pub(crate) fn new<M: ?Sized>(
        ring: &'a mut NvmeRing,
        fd: BorrowedFd<'a>,
        nsid: u32,
        lba_shift: u32,
        target: DmaTarget,
        _mem: &'a M,
    ) -> Self {
        Self {
            ring,
            fd,
            nsid,
            lba_shift,
            target,
            inflight: 0,
            _mem: PhantomData,
        }
    }

    /// Commands in flight.
    pub(crate) fn inflight(&self) -> usize {
        self.inflight
    }

    /// Queues a read (or write) of `len` bytes (whole logical blocks) at
    /// byte `offset` of the namespace, to (or from) `target_offset` of the
    /// DMA target.
    pub(crate) fn push(
        &mut self,
        write: bool,
        offset: u64,
        target_offset: usize,
        len: usize,
        tag: u64,
    ) -> Result<()> {
        let lba = 1u64 << self.lba_shift;
        if !offset.is_multiple_of(lba) || !(len as u64).is_multiple_of(lba) || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "NVMe command of {len} bytes at {offset} is not in whole {lba}-byte blocks"
            )));
        }
        let nlb = len as u64 >> self.lba_shift;
        if nlb > 1 << 16 {
            return Err(Error::InvalidArgument(
                "NVMe command over 65536 blocks".into(),
            ));
        }
        let ptr = match target_offset.checked_add(len) {
            // SAFETY: In bounds of the target mapping.
            Some(end) if end <= self.target.len => unsafe { self.target.ptr.add(target_offset) },
            _ => {
                return Err(Error::OutOfBounds {
                    offset: target_offset as u64,
                    len: len as u64,
                    size: self.target.len as u64,
                })
            }
        };
        let slba = offset >> self.lba_shift;
        let sqe = nvme_io_sqe(
            self.fd.as_raw_fd(),
            write,
            self.nsid,
            slba,
            nlb as u32,
            ptr as u64,
            len as u32,
        )
        .user_data(tag);
        // SAFETY: The data buffer is inside the target, borrowed for the
        // session, whose drop waits for every command in flight.
        while unsafe { self.ring.submission().push(&sqe) }.is_err() {
            self.ring.submit().map_err(|e| Error::Sys {
                op: "io_uring_enter",
                source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
            })?;
        }
        self.inflight += 1;
        Ok(())
    }

    /// Submits and waits for at least `min` completions; returns them as
    /// `(tag, result)`.
    pub(crate) fn wait(&mut self, min: usize) -> Result<Vec<(u64, NvmeResult)>> {
        submit_and_wait(&self.ring.submitter(), min.min(self.inflight))?;
        let mut done = Vec::new();
        for cqe in self.ring.completion() {
            self.inflight -= 1;
            let r = cqe.result();
            done.push((
                cqe.user_data(),
                match r {
                    0 => NvmeResult::Ok,
                    r if r < 0 => NvmeResult::Errno(Errno::from_raw_os_error(-r)),
                    r => NvmeResult::Status(r as u32),
                },
            ));
        }
        Ok(done)
    }
}

impl Drop for NvmeSession<'_> {
    fn drop(&mut self) {
        while self.inflight > 0 {
            if self.wait(self.inflight).is_err() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write, os::fd::AsFd, os::unix::net::UnixStream, thread, time::Duration};

    use super::*;

    /// A stream whose writer sends `pieces` bursts of 1000 bytes (burst i
    /// all `i`), a pause between them, then closes: every read of it is
    /// partial.
    fn slow_pipe(pieces: u8) -> (UnixStream, thread::JoinHandle<()>) {
        let (r, mut w) = UnixStream::pair().unwrap();
        let writer = thread::spawn(move || {
            for i in 0..pieces {
                w.write_all(&[i; 1000]).unwrap();
                thread::sleep(Duration::from_millis(30));
            }
        });
        (r, writer)
    }

    #[test]
    fn partial_completions_go_on_until_all_moved_the_end_or_an_error() {
        let io = |offset, len| Pending {
            tag: 1,
            buf: Buf::Slot(0),
            write: false,
            ptr: 0,
            offset,
            len,
            done: 0,
        };
        // 3 blocks in three partial completions.
        let mut p = io(4096, 3 * 4096);
        assert_eq!(p.complete(4096, 4096), Step::More);
        assert_eq!((p.offset + p.done as u64, p.len - p.done), (8192, 8192));
        assert_eq!(p.complete(4096, 4096), Step::More);
        assert_eq!(p.complete(4096, 4096), Step::Done(Ok(3 * 4096)));
        // The end of the file: a partial completion, then nothing.
        let mut p = io(0, 8192);
        assert_eq!(p.complete(4096, 4096), Step::More);
        assert_eq!(p.complete(0, 4096), Step::Done(Ok(4096)));
        // Mid-block: direct I/O cannot ask for the rest.
        let mut p = io(0, 8192);
        assert_eq!(p.complete(100, 4096), Step::Done(Ok(100)));
        // Buffered (any offset): goes on.
        let mut p = io(0, 8192);
        assert_eq!(p.complete(100, 1), Step::More);
        assert_eq!(p.complete(8092, 1), Step::Done(Ok(8192)));
        // An error after progress is the error.
        let mut p = io(0, 8192);
        assert_eq!(p.complete(4096, 4096), Step::More);
        assert_eq!(p.complete(-5, 4096), Step::Done(Err(Errno::IO)));
    }

    #[test]
    fn a_partial_read_off_the_block_completes_short() {
        let (r, writer) = slow_pipe(2);
        let mut ctx = Context::new(2, 64 << 10).unwrap();
        let mut s = Session::new(&mut ctx, r.as_fd(), 4096, None::<(DmaTarget, &())>);
        s.read(Buf::Slot(1), 0, 8000, 3).unwrap();
        let c = s.wait(1).unwrap();
        assert_eq!((c[0].tag, c[0].res), (3, Ok(1000)));
        drop(s);
        writer.join().unwrap();
    }
}
