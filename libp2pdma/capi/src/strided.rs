//! Strided transfers: runs of a file stepped through up to three
//! dimensions, moved at once or in the background with tickets.

use std::{
    ffi::{c_char, c_int},
    sync::Arc,
};

use p2pdma::{
    transfer::{strided::StridedReport, Layout, Shape, StridedMode, StridedRequest, Ticket},
    MemRange,
};

use crate::{
    error::{status, void, Failure},
    p2pdma_engine, p2pdma_file, p2pdma_mem, raw, transfer_handles,
    transfers::Direction,
};

/// One dimension of a strided shape: `count` steps of `stride` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_dim {
    /// Bytes between the starts of consecutive steps.
    pub stride: u64,
    /// Steps (at least 1).
    pub count: u64,
}

/// Where a strided read puts its runs in memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_layout {
    /// Back to back from the memory offset, in file order.
    P2PDMA_LAYOUT_PACKED = 0,
    /// Each run at the memory offset plus its distance from the first
    /// run's start: the memory mirrors the file's range.
    P2PDMA_LAYOUT_STRIDED = 1,
}

/// How a strided read moves its runs (see `docs/transfer.md`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_strided_mode {
    /// Chosen by the library's cost model; the reason says why.
    P2PDMA_STRIDED_AUTO = 0,
    /// One read of the whole range, gaps included (strided layout only).
    P2PDMA_STRIDED_RC = 1,
    /// One read per run.
    P2PDMA_STRIDED_SC = 2,
    /// The range through host memory, packed there, then copied.
    P2PDMA_STRIDED_TAT = 3,
}

/// What one strided read did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_strided_report {
    /// Bytes of interest moved: the runs' total.
    pub bytes: u64,
    /// Bytes read from storage, with each read's block rounding.
    pub storage_bytes: u64,
    /// Transfers issued.
    pub calls: u64,
    /// The mode that moved the runs (a `P2PDMA_STRIDED_*` value, never
    /// AUTO).
    pub mode: c_int,
    /// 1 when a transfer was redone on the bounce path, else 0.
    pub retried: c_int,
}

impl From<&StridedReport> for p2pdma_strided_report {
    fn from(r: &StridedReport) -> Self {
        let mode = match r.mode {
            StridedMode::Auto => p2pdma_strided_mode::P2PDMA_STRIDED_AUTO,
            StridedMode::Rc => p2pdma_strided_mode::P2PDMA_STRIDED_RC,
            StridedMode::Sc => p2pdma_strided_mode::P2PDMA_STRIDED_SC,
            StridedMode::Tat => p2pdma_strided_mode::P2PDMA_STRIDED_TAT,
        };
        Self {
            bytes: r.bytes,
            storage_bytes: r.storage_bytes,
            calls: r.calls,
            mode: mode as c_int,
            retried: c_int::from(r.retried),
        }
    }
}

/// The most dimensions a strided shape has.
pub const P2PDMA_MAX_DIMS: usize = 3;

/// Which way a strided transfer in a `struct p2pdma_strided_op` moves.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_direction {
    /// From the file into the memory.
    P2PDMA_DIR_READ = 0,
    /// From the memory into the file.
    P2PDMA_DIR_WRITE = 1,
}

/// One strided transfer, for p2pdma_submit_strided() and
/// p2pdma_submit_strided_batch(): the arguments of p2pdma_read_strided()
/// or p2pdma_write_strided() in a struct.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct p2pdma_strided_op {
    /// `P2PDMA_DIR_READ` or `P2PDMA_DIR_WRITE`.
    pub dir: c_int,
    /// The file (open for writing, to write).
    pub file: *const p2pdma_file,
    /// The first run's file offset.
    pub base: u64,
    /// Bytes per run.
    pub run: u64,
    /// The dimensions, innermost first; the first `ndims` are used.
    pub dims: [p2pdma_dim; P2PDMA_MAX_DIMS],
    /// How many dimensions (0 to `P2PDMA_MAX_DIMS`).
    pub ndims: usize,
    /// The memory.
    pub mem: *const p2pdma_mem,
    /// Offset in the memory where the layout starts.
    pub mem_offset: usize,
    /// A `P2PDMA_LAYOUT_*` value.
    pub layout: c_int,
    /// A `P2PDMA_STRIDED_*` value.
    pub mode: c_int,
}

/// A strided transfer running in the background, from
/// p2pdma_submit_strided(): ask whether it is done with
/// p2pdma_ticket_done(), wait for its result with p2pdma_ticket_wait(),
/// free it with p2pdma_ticket_free().
pub struct p2pdma_ticket {
    ticket: Ticket<StridedReport>,
    dir: Direction,
}

const _: () = {
    const fn thread_safe<T: Send + Sync>() {}
    thread_safe::<p2pdma_ticket>();
};

/// The shape, layout and mode of a strided call, checked.
fn strided_args(
    base: u64,
    run: u64,
    dims: &[p2pdma_dim],
    layout: c_int,
    mode: c_int,
) -> Result<(Shape, Layout, StridedMode), Failure> {
    let layout = match layout {
        l if l == p2pdma_layout::P2PDMA_LAYOUT_PACKED as c_int => Layout::Packed,
        l if l == p2pdma_layout::P2PDMA_LAYOUT_STRIDED as c_int => Layout::Strided,
        l => return Err(Failure::invalid(format!("unknown layout {l}"))),
    };
    let mode = match mode {
        0 => StridedMode::Auto,
        1 => StridedMode::Rc,
        2 => StridedMode::Sc,
        3 => StridedMode::Tat,
        m => return Err(Failure::invalid(format!("unknown strided mode {m}"))),
    };
    let dims: Vec<(u64, u64)> = dims.iter().map(|d| (d.stride, d.count)).collect();
    Ok((Shape::new(base, run, &dims)?, layout, mode))
}

/// Stores a strided transfer's outcome for C: the report and the reason
/// on success, the report zeroed on failure (reads' short transfers are
/// `P2PDMA_ERR_EOF`).
///
/// # Safety
///
/// `report` must be NULL or point to a writable `struct
/// p2pdma_strided_report`; `reason_buf` must be NULL or valid for writing
/// `reason_len` bytes.
unsafe fn strided_outcome(
    dir: Direction,
    done: p2pdma::Result<StridedReport>,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> Result<c_int, Failure> {
    // SAFETY: The caller passes NULL or a writable report.
    let report = unsafe { raw::out_report(report, "report") }?;
    let done = done.map_err(|e| match dir {
        Direction::Read => Failure::from_read(e),
        Direction::Write => Failure::from(e),
    })?;
    // SAFETY: The caller passes NULL or `reason_len` writable bytes.
    unsafe { raw::copy_str(&done.reason, reason_buf, reason_len) }?;
    if let Some(out) = report {
        *out = p2pdma_strided_report::from(&done);
    }
    Ok(0)
}

/// The body of p2pdma_read_strided() and p2pdma_write_strided().
///
/// # Safety
///
/// As for p2pdma_read_strided().
#[expect(
    clippy::too_many_arguments,
    reason = "the C signature of p2pdma_read_strided"
)]
unsafe fn strided(
    dir: Direction,
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    base: u64,
    run: u64,
    dims: *const p2pdma_dim,
    ndims: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    layout: c_int,
    mode: c_int,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> Result<c_int, Failure> {
    // SAFETY: The caller passes NULL or a writable report.
    unsafe { raw::out_report(report, "report") }?;
    // SAFETY: The caller passes NULL or live handles.
    let (e, f, m) = unsafe { transfer_handles(engine, file, mem) }?;
    // SAFETY: The caller passes NULL or `ndims` dimensions.
    let dims = unsafe { raw::structs(dims, ndims, "dims") }?;
    let (shape, layout, mode) = strided_args(base, run, dims, layout, mode)?;
    let strided = e.engine.strided();
    let done = MemRange::from_offset(&*m.mem, mem_offset).and_then(|range| match dir {
        Direction::Read => strided.read(&f.file, &shape, range, layout, mode),
        Direction::Write => strided.write(&f.file, &shape, range, layout, mode),
    });
    // SAFETY: Passed on from this function's contract.
    unsafe { strided_outcome(dir, done, report, reason_buf, reason_len) }
}

/// Reads runs of `run` bytes of `file`, the first at `base`, the others
/// found by stepping through `ndims` (at most 3) dimensions `dims`,
/// innermost first, into `mem` from `mem_offset`, laid out as `layout` (a
/// `P2PDMA_LAYOUT_*` value), moved as `mode` (a `P2PDMA_STRIDED_*` value)
/// says. A column range of a row-major table is `base` = its first byte,
/// `run` = its width, and one dimension `{row pitch, rows}`. When `report`
/// is not NULL it receives what the read did; when `reason_buf` is not NULL,
/// up to `reason_len` bytes of why that mode (NUL-terminated).
///
/// Returns 0 once every run has landed, or a negative errno, with
/// `*report` zeroed: -EINVAL for NULL handles, a bad shape (a zero run or
/// count, more than 3 dimensions, a stride below what it steps over,
/// overflow), an unknown layout or mode, RC with the packed layout, or
/// memory that cannot hold the layout; `P2PDMA_ERR_EOF` when a run lies
/// past the end of the file; -ENODATA, -EIO and others from storage.
/// Nothing is read before the arguments are checked.
///
/// # Safety
///
/// `engine`, `file` and `mem` must be NULL or live handles; `dims` must be
/// NULL or point to `ndims` `struct p2pdma_dim`; `report` must be NULL or
/// point to a writable `struct p2pdma_strided_report`; `reason_buf` must be
/// NULL or valid for writing `reason_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_read_strided(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    base: u64,
    run: u64,
    dims: *const p2pdma_dim,
    ndims: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    layout: c_int,
    mode: c_int,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_read_strided", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            strided(
                Direction::Read,
                engine,
                file,
                base,
                run,
                dims,
                ndims,
                mem,
                mem_offset,
                layout,
                mode,
                report,
                reason_buf,
                reason_len,
            )
        }
    })
}

/// Writes the runs of the shape (`base`, `run`, `dims`, as for
/// p2pdma_read_strided()) from `mem`, laid out as `layout` from
/// `mem_offset`, to `file` (open for writing). Exactly the runs' bytes of
/// the file change: writes are one per run (`P2PDMA_STRIDED_SC`; AUTO
/// means SC), and RC and TaT, which would write the gaps or need a
/// contiguous file side, are refused. When `report` is not NULL it
/// receives what the write did; `reason_buf` as for p2pdma_read_strided().
///
/// Returns 0 once every run is written, or a negative errno, with
/// `*report` zeroed: -EINVAL for NULL handles, a bad shape, an unknown
/// layout or mode, RC or TaT, or memory that does not hold the layout;
/// -EBADF when the file is read-only, -ENOSPC, -EIO and others from
/// storage. Nothing is written before the arguments are checked; after a
/// storage error, runs already written stay written.
///
/// # Safety
///
/// As for p2pdma_read_strided().
#[no_mangle]
pub unsafe extern "C" fn p2pdma_write_strided(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    base: u64,
    run: u64,
    dims: *const p2pdma_dim,
    ndims: usize,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    layout: c_int,
    mode: c_int,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_write_strided", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            strided(
                Direction::Write,
                engine,
                file,
                base,
                run,
                dims,
                ndims,
                mem,
                mem_offset,
                layout,
                mode,
                report,
                reason_buf,
                reason_len,
            )
        }
    })
}

/// `op` as a request for the engine, checked.
///
/// # Safety
///
/// `op.file` and `op.mem` must be NULL or live handles.
unsafe fn strided_request(op: &p2pdma_strided_op) -> Result<StridedRequest, Failure> {
    let dir = match op.dir {
        d if d == p2pdma_direction::P2PDMA_DIR_READ as c_int => Direction::Read,
        d if d == p2pdma_direction::P2PDMA_DIR_WRITE as c_int => Direction::Write,
        d => return Err(Failure::invalid(format!("unknown direction {d}"))),
    };
    if op.ndims > P2PDMA_MAX_DIMS {
        return Err(Failure::invalid(format!(
            "{} dimensions, at most {P2PDMA_MAX_DIMS}",
            op.ndims
        )));
    }
    // SAFETY: The caller passes NULL or live handles.
    let (f, m) = unsafe { (raw::handle(op.file, "file")?, raw::handle(op.mem, "mem")?) };
    let (shape, layout, mode) =
        strided_args(op.base, op.run, &op.dims[..op.ndims], op.layout, op.mode)?;
    Ok(StridedRequest {
        dir: match dir {
            Direction::Read => p2pdma::transfer::Direction::Read,
            Direction::Write => p2pdma::transfer::Direction::Write,
        },
        file: Arc::clone(&f.file),
        shape,
        mem: Arc::clone(&m.mem),
        mem_offset: op.mem_offset,
        layout,
        mode,
    })
}

fn direction_of(req: &StridedRequest) -> Direction {
    match req.dir {
        p2pdma::transfer::Direction::Read => Direction::Read,
        p2pdma::transfer::Direction::Write => Direction::Write,
    }
}

/// Starts the strided transfer `op` on the engine's worker threads and
/// returns at once, storing a ticket for it in `*out`. The transfer holds
/// its file and memory: they may be closed and freed while it runs, and
/// freeing the ticket does not stop it.
///
/// Returns 0, or a negative errno, with `*out` NULL and nothing started:
/// -EINVAL for NULL arguments, an unknown direction, layout or mode, or a
/// bad shape. What the transfer itself returns (everything
/// p2pdma_read_strided() and p2pdma_write_strided() return) comes from
/// p2pdma_ticket_wait().
///
/// # Safety
///
/// `engine` must be NULL or a live engine; `op` must be NULL or point to a
/// `struct p2pdma_strided_op` whose `file` and `mem` are NULL or live
/// handles; `out` must be NULL or point to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_submit_strided(
    engine: *const p2pdma_engine,
    op: *const p2pdma_strided_op,
    out: *mut *mut p2pdma_ticket,
) -> c_int {
    status("p2pdma_submit_strided", || {
        // SAFETY: The caller passes NULL or a writable pointer slot.
        let out = unsafe { raw::out_handle(out, "out") }?;
        // SAFETY: The caller passes NULL or a live engine and NULL or one
        // readable op.
        let (e, op) = unsafe { (raw::handle(engine, "engine")?, raw::handle(op, "op")?) };
        // SAFETY: The caller passes an op with NULL or live handles.
        let req = unsafe { strided_request(op) }?;
        let dir = direction_of(&req);
        *out = raw::into_handle(p2pdma_ticket {
            ticket: e.engine.submit_strided(req),
            dir,
        });
        Ok(0)
    })
}

/// Starts `n` strided transfers at once (they run in parallel on the
/// engine's worker threads) and stores a ticket for `ops[i]` in
/// `tickets[i]`. Every op is checked before any starts: one bad op fails
/// the call with nothing started.
///
/// Returns 0, or a negative errno, with every `tickets[i]` NULL: -EINVAL
/// for NULL arguments or a bad op (p2pdma_last_error() names it, as
/// `ops[i]`).
///
/// # Safety
///
/// `engine` must be NULL or a live engine; `ops` must be NULL or point to
/// `n` `struct p2pdma_strided_op` whose `file` and `mem` are NULL or live
/// handles; `tickets` must be NULL or point to `n` writable pointers.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_submit_strided_batch(
    engine: *const p2pdma_engine,
    ops: *const p2pdma_strided_op,
    n: usize,
    tickets: *mut *mut p2pdma_ticket,
) -> c_int {
    status("p2pdma_submit_strided_batch", || {
        // SAFETY: The caller passes NULL or `n` writable pointers.
        let out = unsafe { raw::out_handles(tickets, n, "tickets") }?;
        // SAFETY: The caller passes NULL or a live engine, and NULL or `n`
        // readable ops.
        let (e, ops) = unsafe { (raw::handle(engine, "engine")?, raw::structs(ops, n, "ops")?) };
        let reqs = ops
            .iter()
            .enumerate()
            // SAFETY: The caller passes ops with NULL or live handles.
            .map(|(i, op)| {
                unsafe { strided_request(op) }.map_err(|f| f.context(&format!("ops[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (slot, req) in out.iter_mut().zip(reqs) {
            let dir = direction_of(&req);
            *slot = raw::into_handle(p2pdma_ticket {
                ticket: e.engine.submit_strided(req),
                dir,
            });
        }
        Ok(0)
    })
}

/// Whether the ticket's transfer has finished: 1 when it has (its result
/// waits for p2pdma_ticket_wait(), which then returns at once), 0 while it
/// runs, -EINVAL when `ticket` is NULL.
///
/// # Safety
///
/// `ticket` must be NULL or a live ticket.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_ticket_done(ticket: *const p2pdma_ticket) -> c_int {
    status("p2pdma_ticket_done", || {
        // SAFETY: The caller passes NULL or a live ticket.
        let t = unsafe { raw::handle(ticket, "ticket") }?;
        Ok(c_int::from(t.ticket.is_done()))
    })
}

/// Waits until the ticket's transfer has finished and returns what
/// p2pdma_read_strided() or p2pdma_write_strided() would have returned,
/// storing the report and the reason the same way. The result is handed
/// out once: a second wait on the same ticket returns -EINVAL.
///
/// # Safety
///
/// `ticket` must be NULL or a live ticket; `report` must be NULL or point
/// to a writable `struct p2pdma_strided_report`; `reason_buf` must be NULL
/// or valid for writing `reason_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_ticket_wait(
    ticket: *const p2pdma_ticket,
    report: *mut p2pdma_strided_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_ticket_wait", || {
        // SAFETY: The caller passes NULL or a writable report.
        unsafe { raw::out_report(report, "report") }?;
        // SAFETY: The caller passes NULL or a live ticket.
        let t = unsafe { raw::handle(ticket, "ticket") }?;
        let done = t.ticket.wait();
        // SAFETY: Passed on from this function's contract.
        unsafe { strided_outcome(t.dir, done, report, reason_buf, reason_len) }
    })
}

/// Frees a ticket. A transfer still running goes on to the end in the
/// background (with its result dropped). NULL is ignored.
///
/// # Safety
///
/// `ticket` must be NULL or a ticket that is not freed yet and that no
/// other thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_ticket_free(ticket: *mut p2pdma_ticket) {
    // SAFETY: The caller passes NULL or a live ticket nobody else uses.
    void("p2pdma_ticket_free", || {
        drop(unsafe { raw::from_handle(ticket) })
    });
}

#[cfg(test)]
mod tests {
    use std::{ffi::CStr, os::unix::ffi::OsStrExt};

    use super::*;
    use crate::{
        engine::{p2pdma_engine_free, p2pdma_engine_new},
        error::ERR_EOF,
        files::{p2pdma_file_close, p2pdma_file_open},
        memory::{p2pdma_mem_free, p2pdma_mem_host_new, p2pdma_mem_read},
    };

    #[test]
    fn strided_reads_land_the_runs_and_refuse_bad_arguments() {
        // A file with O_DIRECT in the temporary directory; tmpfs has none.
        let dir = std::env::temp_dir().join(format!("capi-strided-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("table");
        let data: Vec<u8> = (0..64u32 << 10).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let cpath = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let (mut file, mut mem, mut engine) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        // SAFETY: Every pointer is a live handle, a writable slot or NULL
        // as each function allows; the handles are freed once at the end.
        unsafe {
            if p2pdma_file_open(cpath.as_ptr(), 0, &mut file) != 0 {
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!("skipped: no O_DIRECT in {}", dir.display());
                return;
            }
            assert_eq!(p2pdma_mem_host_new(8192, &mut mem), 0);
            let bounce = c"bounce";
            assert_eq!(
                p2pdma_engine_new(bounce.as_ptr(), 0, 0, std::ptr::null(), &mut engine),
                0
            );
            // Columns 100..130 of 8 rows of 1000 bytes: 240 bytes packed.
            let dims = [p2pdma_dim {
                stride: 1000,
                count: 8,
            }];
            let mut rep = p2pdma_strided_report::default();
            let mut reason = [0 as c_char; 128];
            let (rbuf, rlen) = (reason.as_mut_ptr(), reason.len());
            let read = |dims: *const p2pdma_dim, n, layout, mode, rep, off| {
                p2pdma_read_strided(
                    engine, file, 100, 30, dims, n, mem, off, layout, mode, rep, rbuf, rlen,
                )
            };
            let packed = p2pdma_layout::P2PDMA_LAYOUT_PACKED as c_int;
            let auto = p2pdma_strided_mode::P2PDMA_STRIDED_AUTO as c_int;
            assert_eq!(read(dims.as_ptr(), 1, packed, auto, &mut rep, 10), 0);
            assert_eq!((rep.bytes, rep.retried), (240, 0));
            assert_ne!(rep.mode, auto);
            let mut got = [0u8; 240];
            assert_eq!(p2pdma_mem_read(mem, 10, got.as_mut_ptr().cast(), 240), 0);
            for k in 0..8 {
                let f = 100 + k * 1000;
                assert_eq!(got[k * 30..k * 30 + 30], data[f..f + 30], "row {k}");
            }
            let said = CStr::from_ptr(reason.as_ptr()).to_str().unwrap();
            assert!(said.contains("by estimate"), "{said}");
            // Refused: NULL dims with a count, an unknown layout or mode,
            // RC packed, a zero count, no room; the report zeroed.
            let rc = p2pdma_strided_mode::P2PDMA_STRIDED_RC as c_int;
            let zero = [p2pdma_dim {
                stride: 1000,
                count: 0,
            }];
            for (d, layout, mode, off) in [
                (std::ptr::null(), packed, auto, 0),
                (dims.as_ptr(), 7, auto, 0),
                (dims.as_ptr(), packed, 9, 0),
                (dims.as_ptr(), packed, rc, 0),
                (zero.as_ptr(), packed, auto, 0),
                (dims.as_ptr(), packed, auto, 8000),
            ] {
                rep.bytes = 1;
                assert_eq!(read(d, 1, layout, mode, &mut rep, off), -libc::EINVAL);
                assert_eq!(rep, p2pdma_strided_report::default());
            }
            // Past the end of the file.
            let far = [p2pdma_dim {
                stride: 1 << 20,
                count: 2,
            }];
            assert_eq!(read(far.as_ptr(), 1, packed, auto, &mut rep, 0), ERR_EOF);
            p2pdma_engine_free(engine);
            p2pdma_mem_free(mem);
            p2pdma_file_close(file);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
