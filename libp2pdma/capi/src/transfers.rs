//! Transfers: reads and writes of a range between a file and a memory.

use std::ffi::c_int;

use p2pdma::{transfer::Report, MemRange};

use crate::{
    engine::p2pdma_path,
    error::{status, Failure},
    p2pdma_engine, p2pdma_file, p2pdma_mem, raw, transfer_handles,
};

/// What one transfer did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_report {
    /// Bytes moved: always the length asked for.
    pub bytes: u64,
    /// The path that moved them (a `P2PDMA_PATH_*` value).
    pub path: c_int,
    /// 1 when the P2P or NVMe-command path failed and the bounce path redid
    /// the transfer, else 0.
    pub retried: c_int,
}

impl From<Report> for p2pdma_report {
    fn from(r: Report) -> Self {
        Self {
            bytes: r.bytes,
            path: p2pdma_path::from(r.path) as c_int,
            retried: c_int::from(r.retried),
        }
    }
}

/// Which way a transfer moves data.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Read,
    Write,
}

/// The body of p2pdma_read() and p2pdma_write().
///
/// # Safety
///
/// As for p2pdma_read().
#[expect(clippy::too_many_arguments, reason = "the C signature of p2pdma_read")]
unsafe fn transfer(
    dir: Direction,
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    file_offset: u64,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    len: usize,
    report: *mut p2pdma_report,
) -> Result<c_int, Failure> {
    // SAFETY: The caller passes NULL or a writable report.
    let report = unsafe { raw::out_report(report, "report") }?;
    // SAFETY: The caller passes NULL or live handles.
    let (e, f, m) = unsafe { transfer_handles(engine, file, mem) }?;
    let range = MemRange::new(&*m.mem, mem_offset, len);
    let done = match dir {
        Direction::Read => range
            .and_then(|r| e.engine.read(&f.file, file_offset, r))
            .map_err(Failure::from_read)?,
        Direction::Write => range
            .and_then(|r| e.engine.write(&f.file, file_offset, r))
            .map_err(Failure::from)?,
    };
    if done.bytes != len as u64 {
        return Err(Failure::new(
            libc::EIO,
            format!("short transfer: moved {} of {len} bytes", done.bytes),
        ));
    }
    if let Some(out) = report {
        *out = p2pdma_report::from(done);
    }
    Ok(0)
}

/// Reads `len` bytes at `file_offset` of `file` into `mem` at `mem_offset`,
/// on the path p2pdma_path_choice() reports. Offsets and lengths need no
/// alignment. When `report` is not NULL, it receives what the transfer did.
///
/// Returns 0 once every byte has landed, or a negative errno, with `*report`
/// zeroed: -EINVAL for NULL handles or a range outside the memory,
/// `P2PDMA_ERR_EOF` when the range runs past the end of the file (nothing
/// partial is reported as success), -ENODATA for a medium error, -EIO and
/// others from storage. When an NVMe controller failed a command,
/// p2pdma_last_nvme_status() gives its status.
///
/// # Safety
///
/// `engine`, `file` and `mem` must be NULL or live handles; `report` must be
/// NULL or point to a writable `struct p2pdma_report`.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_read(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    file_offset: u64,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    len: usize,
    report: *mut p2pdma_report,
) -> c_int {
    status("p2pdma_read", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            transfer(
                Direction::Read,
                engine,
                file,
                file_offset,
                mem,
                mem_offset,
                len,
                report,
            )
        }
    })
}

/// Writes `len` bytes of `mem` at `mem_offset` to `file` at `file_offset`
/// (the file must be open for writing). Bytes outside the range are never
/// changed, and a regular file grows only to the end of the data written.
/// When `report` is not NULL, it receives what the transfer did.
///
/// Returns 0 once every byte is written, or a negative errno, with `*report`
/// zeroed: -EINVAL for NULL handles or a range outside the memory, -EBADF
/// when the file is read-only, -ENOSPC, -ENODATA for a medium error
/// (Write Fault), -EIO and others from storage. When an NVMe controller
/// failed a command, p2pdma_last_nvme_status() gives its status.
///
/// # Safety
///
/// `engine`, `file` and `mem` must be NULL or live handles; `report` must be
/// NULL or point to a writable `struct p2pdma_report`.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_write(
    engine: *const p2pdma_engine,
    file: *const p2pdma_file,
    file_offset: u64,
    mem: *const p2pdma_mem,
    mem_offset: usize,
    len: usize,
    report: *mut p2pdma_report,
) -> c_int {
    status("p2pdma_write", || {
        // SAFETY: Passed on from this function's contract.
        unsafe {
            transfer(
                Direction::Write,
                engine,
                file,
                file_offset,
                mem,
                mem_offset,
                len,
                report,
            )
        }
    })
}
