//! Batches: `cuFileBatchIOSetUp` makes a batch of up to `nr` entries,
//! `cuFileBatchIOSubmit` checks every entry and then hands each to the
//! engine in the background ([`Engine::submit`](p2pdma::Engine::submit)),
//! `cuFileBatchIOGetStatus` returns the entries that completed, each once.
//!
//! Reads stop at the end of the file as `cuFileRead` does: their length is
//! cut to the file's size when they are submitted, and a read at or after
//! the end completes at once with 0 bytes.
//!
//! The engine cannot stop a transfer it has started, so
//! `cuFileBatchIOCancel` waits for every submitted entry to end, after
//! which none touches its buffer; their events then say how each ended.
//! `cuFileBatchIODestroy` waits the same way.

use std::{
    collections::{HashMap, VecDeque},
    ffi::{c_uint, c_void},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use p2pdma::{Direction, Request, Ticket};

use crate::{
    abi::{
        op, status, CUfileError, CUfileIOEvents, CUfileIOParams, BATCH_MODE, OPCODE_READ,
        OPCODE_WRITE,
    },
    buffers, driver,
    errors::{guard, guard_value, Fail, Res},
    io, stats,
};

/// How long `cuFileBatchIOGetStatus` sleeps on one transfer before it
/// looks at the others again.
const SLICE: Duration = Duration::from_millis(2);

/// One submitted entry.
enum State {
    /// Running in the engine; the bytes it moves on success.
    Running(Ticket, usize),
    /// Ended: its status and `ret`.
    Ended(u32, isize),
}

struct Entry {
    cookie: usize,
    state: State,
    /// Whether it writes (for the statistics).
    write: bool,
    /// When it was submitted.
    since: Instant,
}

impl Entry {
    /// Whether it has ended, moving a finished transfer's result in.
    fn settle(&mut self) -> bool {
        let State::Running(ticket, len) = &self.state else {
            return true;
        };
        let Some(result) = ticket.poll() else {
            return false;
        };
        let len = *len;
        let took = self.since.elapsed();
        self.state = match result {
            Ok(_) => {
                stats::batch_entry(self.write, true, len as u64, took);
                State::Ended(status::COMPLETE, len as isize)
            }
            Err(e) => {
                stats::batch_entry(self.write, false, 0, took);
                State::Ended(status::FAILED, Fail::from(e).negated())
            }
        };
        true
    }
}

struct Batch {
    capacity: usize,
    /// Submitted and not yet returned by GetStatus, in submission order.
    entries: VecDeque<Entry>,
}

static BATCHES: RwLock<Option<HashMap<usize, Arc<Mutex<Batch>>>>> = RwLock::new(None);
static LAST: Mutex<usize> = Mutex::new(0);

fn lookup(id: *mut c_void) -> Res<Arc<Mutex<Batch>>> {
    let b = BATCHES.read().unwrap_or_else(|p| p.into_inner());
    b.as_ref()
        .and_then(|m| m.get(&(id as usize)))
        .cloned()
        .ok_or(Fail::INVALID)
}

fn lock(b: &Mutex<Batch>) -> std::sync::MutexGuard<'_, Batch> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for every running entry of `b` to end.
fn drain(b: &Mutex<Batch>) {
    let running: Vec<Ticket> = lock(b)
        .entries
        .iter()
        .filter_map(|e| match &e.state {
            State::Running(t, _) => Some(t.clone()),
            State::Ended(..) => None,
        })
        .collect();
    for t in running {
        t.wait_done(None);
    }
}

/// What one checked entry will do.
struct Checked {
    cookie: usize,
    write: bool,
    /// The request, or `None` for a read at or after the end of the file.
    request: Option<Request>,
}

/// Checks one entry and makes its request.
///
/// # Safety
/// The entry's buffer is valid until the entry ends.
unsafe fn check(p: &CUfileIOParams) -> Res<Checked> {
    if p.mode != BATCH_MODE {
        return Err(Fail::INVALID);
    }
    let dir = match p.opcode {
        OPCODE_READ => Direction::Read,
        OPCODE_WRITE => Direction::Write,
        _ => return Err(Fail::INVALID),
    };
    let b = &p.u;
    let (entry, file_offset) = io::check(p.fh, b.buf_base, b.size, b.file_offset, b.buf_offset)?;
    let cookie = p.cookie as usize;
    let len = match dir {
        Direction::Read => {
            let size = entry.file.current_size().map_err(Fail::from)?;
            io::clamp(size, file_offset, b.size)
        }
        Direction::Write => b.size,
    };
    if len == 0 {
        return Ok(Checked {
            cookie,
            write: matches!(dir, Direction::Write),
            request: None,
        });
    }
    let read = matches!(dir, Direction::Read);
    // SAFETY: The caller's.
    let (mem, mem_offset) = unsafe { buffers::resolve(b.buf_base, b.buf_offset, b.size, read) }?;
    Ok(Checked {
        cookie,
        write: matches!(dir, Direction::Write),
        request: Some(Request {
            dir,
            file: entry.file.clone(),
            file_offset,
            mem,
            mem_offset,
            len,
        }),
    })
}

/// Makes a batch of up to `nr` entries (1 to the properties'
/// `max_batch_io_size`) and writes its handle to `batch_idp`.
///
/// # Safety
/// `batch_idp` is NULL or writable for a handle.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSetUp(
    batch_idp: *mut *mut c_void,
    nr: c_uint,
) -> CUfileError {
    let status = guard(|| {
        if batch_idp.is_null() || nr == 0 || nr > driver::max_batch() {
            return Err(Fail::INVALID);
        }
        driver::engine()?;
        let id = {
            let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
            *last += 1;
            *last
        };
        let batch = Batch {
            capacity: nr as usize,
            entries: VecDeque::new(),
        };
        BATCHES
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(id, Arc::new(Mutex::new(batch)));
        // SAFETY: Non-null and writable by the caller's contract.
        unsafe { batch_idp.write_unaligned(id as *mut c_void) };
        Ok(())
    });
    stats::call(stats::Call::BatchSetup, status.err == op::SUCCESS);
    status
}

/// Submits `nr` entries: all are checked first (mode `CUFILE_BATCH`,
/// opcode, registered handle, buffer and offsets), and none starts unless
/// all pass. `flags` must be 0, `nr` at most what the batch was set up
/// for; `CU_FILE_BATCH_FULL` when the entries not yet returned by
/// GetStatus and these would be more than that.
///
/// # Safety
/// `iocbp` is NULL or readable for `nr` entries, whose buffers stay valid
/// until the entries end.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSubmit(
    batch_idp: *mut c_void,
    nr: c_uint,
    iocbp: *mut CUfileIOParams,
    flags: c_uint,
) -> CUfileError {
    let start = Instant::now();
    let mut asked = (0u64, 0u64);
    let status = guard(|| {
        let batch = lookup(batch_idp)?;
        let nr = nr as usize;
        if iocbp.is_null() || flags != 0 || nr == 0 || nr > lock(&batch).capacity {
            return Err(Fail::INVALID);
        }
        let engine = driver::engine()?;
        let mut checked = Vec::with_capacity(nr);
        for i in 0..nr {
            // SAFETY: In the caller's array of `nr`; read unaligned, as C
            // may hand any address.
            let p = unsafe { iocbp.add(i).read_unaligned() };
            // SAFETY: The caller's.
            checked.push(unsafe { check(&p) }?);
        }
        let mut b = lock(&batch);
        if b.entries.len() + nr > b.capacity {
            return Err(Fail::cu(op::BATCH_FULL));
        }
        for c in checked {
            let state = match c.request {
                Some(req) => {
                    let len = req.len;
                    if c.write {
                        asked.1 += len as u64;
                    } else {
                        asked.0 += len as u64;
                    }
                    State::Running(engine.submit(req), len)
                }
                None => State::Ended(status::COMPLETE, 0),
            };
            b.entries.push_back(Entry {
                cookie: c.cookie,
                state,
                write: c.write,
                since: start,
            });
        }
        Ok(())
    });
    let ok = status.err == op::SUCCESS;
    stats::batch_submit(
        ok,
        if ok { nr as u64 } else { 0 },
        asked.0,
        asked.1,
        start.elapsed(),
    );
    status
}

/// The timeout as a duration: `None` waits for ever.
fn timeout_of(t: *const libc::timespec) -> Res<Option<Duration>> {
    if t.is_null() {
        return Ok(None);
    }
    // SAFETY: Non-null and readable by the caller's contract.
    let t = unsafe { t.read_unaligned() };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(Fail::INVALID);
    }
    Ok(Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32)))
}

/// Returns up to `*nr` entries that ended, each once, in the order they
/// were submitted, waiting until at least `min_nr` have ended (or as many
/// as are outstanding, if fewer) or `timeout` passes (NULL: no limit);
/// `*nr` becomes the number returned. An event's `ret` is the bytes moved
/// for `CUFILE_COMPLETE`, and for `CUFILE_FAILED` the negated error:
/// `-errno` for storage and system errors, `-CUfileOpError` for cuFile's.
///
/// # Safety
/// `nr` is NULL or points to a readable and writable `unsigned`; `iocbp`
/// is writable for `*nr` events; `timeout` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOGetStatus(
    batch_idp: *mut c_void,
    min_nr: c_uint,
    nr: *mut c_uint,
    iocbp: *mut CUfileIOEvents,
    timeout: *mut libc::timespec,
) -> CUfileError {
    guard(|| {
        let batch = lookup(batch_idp)?;
        if nr.is_null() {
            return Err(Fail::INVALID);
        }
        // SAFETY: Non-null and readable by the caller's contract.
        let max = unsafe { nr.read_unaligned() } as usize;
        if min_nr as usize > max || (max > 0 && iocbp.is_null()) {
            return Err(Fail::INVALID);
        }
        let deadline = timeout_of(timeout)?.map(|t| Instant::now() + t);
        loop {
            let mut b = lock(&batch);
            let want = (min_nr as usize).min(b.entries.len());
            let mut ended = 0;
            let mut first_running = None;
            for e in b.entries.iter_mut() {
                if e.settle() {
                    ended += 1;
                } else if first_running.is_none() {
                    if let State::Running(t, _) = &e.state {
                        first_running = Some(t.clone());
                    }
                }
            }
            let late = deadline.is_some_and(|d| Instant::now() >= d);
            if ended >= want || late {
                let mut out = 0;
                let mut keep = VecDeque::with_capacity(b.entries.len());
                for e in b.entries.drain(..) {
                    match e.state {
                        State::Ended(st, ret) if out < max => {
                            let ev = CUfileIOEvents {
                                cookie: e.cookie as *mut c_void,
                                status: st,
                                ret: ret as usize,
                            };
                            // SAFETY: `out` < `*nr`, the caller's array's
                            // length.
                            unsafe { iocbp.add(out).write_unaligned(ev) };
                            out += 1;
                        }
                        _ => keep.push_back(e),
                    }
                }
                b.entries = keep;
                // SAFETY: As for the read above.
                unsafe { nr.write_unaligned(out as c_uint) };
                return Ok(());
            }
            drop(b);
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
                None => SLICE,
            };
            if let Some(t) = first_running {
                t.wait_done(Some(slice));
            }
        }
    })
}

/// Cancels the batch's entries, as far as the engine allows: it waits for
/// every running entry to end (none can be stopped once started); their
/// events stay for GetStatus and say how each ended.
#[no_mangle]
pub extern "C" fn cuFileBatchIOCancel(batch_idp: *mut c_void) -> CUfileError {
    let status = guard(|| {
        let batch = lookup(batch_idp)?;
        drain(&batch);
        Ok(())
    });
    stats::call(stats::Call::BatchCancel, status.err == op::SUCCESS);
    status
}

/// Frees the batch, after waiting for its running entries to end. An
/// unknown handle is ignored.
#[no_mangle]
pub extern "C" fn cuFileBatchIODestroy(batch_idp: *mut c_void) {
    guard_value((), || {
        let gone = BATCHES
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&(batch_idp as usize)));
        stats::call(stats::Call::BatchDestroy, gone.is_some());
        if let Some(b) = gone {
            drain(&b);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_checked() {
        assert_eq!(timeout_of(std::ptr::null()), Ok(None));
        let t = |s, ns| libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        };
        assert_eq!(timeout_of(&t(1, 500)), Ok(Some(Duration::new(1, 500))));
        assert_eq!(timeout_of(&t(-1, 0)), Err(Fail::INVALID));
        assert_eq!(timeout_of(&t(0, 1_000_000_000)), Err(Fail::INVALID));
    }

    #[test]
    fn batch_handles_are_looked_up() {
        let mut id = std::ptr::null_mut();
        // SAFETY: Out-pointers to locals.
        unsafe {
            assert_eq!(cuFileBatchIOSetUp(&mut id, 0).err, op::INVALID_VALUE);
            assert_eq!(
                cuFileBatchIOSetUp(&mut id, driver::max_batch() + 1).err,
                op::INVALID_VALUE
            );
            assert_eq!(
                cuFileBatchIOSetUp(std::ptr::null_mut(), 1).err,
                op::INVALID_VALUE
            );
            assert_eq!(cuFileBatchIOSetUp(&mut id, 4), CUfileError::SUCCESS);
            let mut nr = 4;
            let mut ev = [CUfileIOEvents {
                cookie: std::ptr::null_mut(),
                status: 0,
                ret: 0,
            }; 4];
            let mut zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            assert_eq!(
                cuFileBatchIOGetStatus(id, 0, &mut nr, ev.as_mut_ptr(), &mut zero),
                CUfileError::SUCCESS
            );
            assert_eq!(nr, 0);
            // Waiting for more than is outstanding does not hang.
            nr = 4;
            assert_eq!(
                cuFileBatchIOGetStatus(id, 4, &mut nr, ev.as_mut_ptr(), std::ptr::null_mut()),
                CUfileError::SUCCESS
            );
            assert_eq!(nr, 0);
            nr = 1;
            assert_eq!(
                cuFileBatchIOGetStatus(id, 2, &mut nr, ev.as_mut_ptr(), &mut zero).err,
                op::INVALID_VALUE
            );
            assert_eq!(cuFileBatchIOCancel(id), CUfileError::SUCCESS);
            cuFileBatchIODestroy(id);
            assert_eq!(cuFileBatchIOCancel(id).err, op::INVALID_VALUE);
        }
    }
}
