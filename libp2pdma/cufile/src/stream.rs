//! Stream-ordered reads and writes: `cuFileReadAsync`/`cuFileWriteAsync`
//! queue the transfer on a CUDA stream, after the work queued before it and
//! before the work queued after it. The size and offsets are read when the
//! stream reaches the transfer, and the bytes moved (or `-1` for a storage
//! error, or `-CUfileOpError`) are written to `*bytes_p` then.
//!
//! How: a host function on the stream (`cuLaunchHostFunc`). A host
//! function must not call CUDA, and moving data into or out of device
//! memory does, so the host function hands the transfer to a worker thread
//! of this library and blocks until it is done: the stream goes on only
//! after the transfer, which is what orders it. The driver's thread that
//! runs host functions is held for the transfer's length, so host
//! functions on other streams of the process wait meanwhile; transfers on
//! one stream never overlap.
//!
//! CUDA asks host functions not to wait for CUDA work that is not ordered
//! before them. This one waits for the engine's copies, which run on the
//! memory's own non-blocking streams: they wait for no other stream and no
//! host function, so the wait ends. A host function that only released a
//! waiting stream (`cuStreamWaitValue32` on a flag the worker sets) would
//! keep to the letter of the rule; `p2pdma::sys::cuda` has no such call
//! yet.
//!
//! A NULL stream makes the call synchronous: the transfer runs before the
//! call returns. Without a CUDA driver only the NULL stream can be used;
//! any other is `CU_FILE_ASYNC_NOT_SUPPORTED`.

use std::{
    collections::{HashMap, VecDeque},
    ffi::{c_uint, c_void},
    sync::{Arc, Condvar, Mutex, OnceLock},
};

use libc::off_t;
use p2pdma::{sys::cuda, Direction};

use crate::{
    abi::{op, stream_flags, CUfileError},
    buffers::{self, Place},
    driver,
    errors::{guard, Fail, Res},
    io,
};

/// A queued stream transfer: what C passed, read when the stream reaches
/// it.
struct Op {
    dir: Direction,
    fh: usize,
    buf: usize,
    size_p: usize,
    file_offset_p: usize,
    buf_offset_p: usize,
    bytes_p: usize,
}

impl Op {
    /// Reads the parameters, moves the data and writes the result.
    ///
    /// # Safety
    /// The pointers C passed are valid now (the stream has reached the
    /// transfer, and they must stay valid until then).
    unsafe fn run(&self) {
        let result = {
            // SAFETY: The caller's (checked non-null at submission).
            let (size, file_offset, buf_offset) = unsafe {
                (
                    (self.size_p as *const usize).read_unaligned(),
                    (self.file_offset_p as *const off_t).read_unaligned(),
                    (self.buf_offset_p as *const off_t).read_unaligned(),
                )
            };
            io::counted(self.dir, size, || {
                // SAFETY: The caller's, as for the synchronous calls.
                unsafe {
                    io::transfer(
                        self.dir,
                        self.fh as *mut c_void,
                        self.buf as *const c_void,
                        size,
                        file_offset,
                        buf_offset,
                    )
                }
            })
        };
        let bytes = match result {
            Ok(n) => n as isize,
            Err(f) => f.stream_result(),
        };
        // SAFETY: The caller's (checked non-null at submission).
        unsafe { (self.bytes_p as *mut isize).write_unaligned(bytes) };
    }
}

/// Set by the worker when the transfer is done.
type Done = Arc<(Mutex<bool>, Condvar)>;

/// Workers that run transfers for host functions.
struct Pool {
    queue: Mutex<PoolState>,
    ready: Condvar,
}

struct PoolState {
    jobs: VecDeque<(Box<Op>, Done)>,
    idle: usize,
    threads: usize,
}

/// Most worker threads: one per stream whose host function waits, up to
/// this; more wait their turn.
const MAX_WORKERS: usize = 16;

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        queue: Mutex::new(PoolState {
            jobs: VecDeque::new(),
            idle: 0,
            threads: 0,
        }),
        ready: Condvar::new(),
    })
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `op`, starting a worker when none is idle; `false` when no
    /// worker exists or can be started.
    fn queue(&'static self, op: Box<Op>, done: Done) -> bool {
        let mut q = self.lock();
        if q.idle == 0 && q.threads < MAX_WORKERS {
            let started = std::thread::Builder::new()
                .name("cufile-stream".into())
                .spawn(move || self.work());
            if started.is_ok() {
                q.threads += 1;
            }
        }
        if q.threads == 0 {
            return false;
        }
        q.jobs.push_back((op, done));
        self.ready.notify_one();
        true
    }

    fn work(&self) {
        loop {
            let (op, done) = {
                let mut q = self.lock();
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    q.idle += 1;
                    q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
                    q.idle -= 1;
                }
            };
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: The stream has reached the transfer: its host
                // function waits for `done`.
                unsafe { op.run() }
            }));
            if ran.is_err() {
                // SAFETY: As in `run`.
                unsafe {
                    (op.bytes_p as *mut isize).write_unaligned(-(op::INTERNAL_ERROR as isize))
                };
            }
            // Everything of the transfer's (the handle, a memory object
            // that talks to CUDA when dropped) goes here, not in the host
            // function.
            drop(op);
            let (flag, cv) = &*done;
            *flag.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cv.notify_all();
        }
    }
}

/// The host function: hands the transfer to a worker and waits for it.
/// Calls no CUDA function.
unsafe extern "C" fn host_func(data: *mut c_void) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `data` is the `Box<Op>` `submit` leaked for this call,
        // taken back once.
        let op = unsafe { Box::from_raw(data.cast::<Op>()) };
        let bytes_p = op.bytes_p;
        let done: Done = Arc::new((Mutex::new(false), Condvar::new()));
        if !pool().queue(op, done.clone()) {
            // SAFETY: As in `Op::run`.
            unsafe { (bytes_p as *mut isize).write_unaligned(-(op::INTERNAL_ERROR as isize)) };
            return;
        }
        let (flag, cv) = &*done;
        let mut f = flag.lock().unwrap_or_else(|p| p.into_inner());
        while !*f {
            f = cv.wait(f).unwrap_or_else(|p| p.into_inner());
        }
    }));
}

/// Queues `op` on `stream`, or runs it now for the NULL stream.
///
/// # Safety
/// As for `cuFileReadAsync`.
unsafe fn submit(op: Op, stream: *mut c_void) -> Res<()> {
    if op.size_p == 0 || op.file_offset_p == 0 || op.buf_offset_p == 0 || op.bytes_p == 0 {
        return Err(Fail::INVALID);
    }
    io::check(op.fh as *mut c_void, op.buf as *const c_void, 0, 0, 0)?;
    if stream.is_null() {
        // SAFETY: The caller's; the NULL stream is "now".
        unsafe { op.run() };
        return Ok(());
    }
    if !driver::cuda() {
        return Err(Fail::cu(op::ASYNC_NOT_SUPPORTED));
    }
    // The host function is queued in the buffer's device's context (the
    // first device's for host memory): the stream must be one of its.
    let ordinal = match buffers::classify(op.buf)? {
        Place::Device { ordinal } => ordinal,
        Place::Host => 0,
    };
    let ctx = cuda::Context::primary(ordinal).map_err(Fail::from)?;
    let entered = ctx.enter().map_err(Fail::from)?;
    let data = Box::into_raw(Box::new(op)).cast::<c_void>();
    // SAFETY: `stream` is the caller's live stream; `data` stays valid
    // until `host_func` takes it back.
    let queued = unsafe { cuda::launch_host_func(&entered, stream, host_func, data) };
    if let Err(e) = queued {
        // SAFETY: Not queued, so still ours.
        drop(unsafe { Box::from_raw(data.cast::<Op>()) });
        return Err(e.into());
    }
    Ok(())
}

/// Queues a read on `stream`: when the stream reaches it, `*size_p` bytes
/// at `*file_offset_p` of the file land at `bufPtr_base + *bufPtr_offset_p`
/// and `*bytes_read_p` becomes the bytes read (fewer at the end of the
/// file), `-1` for a storage error or `-CUfileOpError`. A NULL stream
/// reads before returning.
///
/// # Safety
/// Every pointer stays valid until the stream has run the read; the
/// buffer holds the bytes.
#[no_mangle]
pub unsafe extern "C" fn cuFileReadAsync(
    fh: *mut c_void,
    bufPtr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut off_t,
    bufPtr_offset_p: *mut off_t,
    bytes_read_p: *mut isize,
    stream: *mut c_void,
) -> CUfileError {
    guard(|| {
        let op = Op {
            dir: Direction::Read,
            fh: fh as usize,
            buf: bufPtr_base as usize,
            size_p: size_p as usize,
            file_offset_p: file_offset_p as usize,
            buf_offset_p: bufPtr_offset_p as usize,
            bytes_p: bytes_read_p as usize,
        };
        // SAFETY: The caller's.
        unsafe { submit(op, stream) }
    })
}

/// Queues a write on `stream`, as [`cuFileReadAsync`] queues a read;
/// `*bytes_written_p` becomes `*size_p` or the error.
///
/// # Safety
/// As for [`cuFileReadAsync`].
#[no_mangle]
pub unsafe extern "C" fn cuFileWriteAsync(
    fh: *mut c_void,
    bufPtr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut off_t,
    bufPtr_offset_p: *mut off_t,
    bytes_written_p: *mut isize,
    stream: *mut c_void,
) -> CUfileError {
    guard(|| {
        let op = Op {
            dir: Direction::Write,
            fh: fh as usize,
            buf: bufPtr_base as usize,
            size_p: size_p as usize,
            file_offset_p: file_offset_p as usize,
            buf_offset_p: bufPtr_offset_p as usize,
            bytes_p: bytes_written_p as usize,
        };
        // SAFETY: The caller's.
        unsafe { submit(op, stream) }
    })
}

static STREAMS: Mutex<Option<HashMap<usize, c_uint>>> = Mutex::new(None);

/// Registers a stream with `CU_FILE_STREAM_*` flags. The flags promise
/// that parameters do not change; this library reads them at execution
/// time in any case, so they change nothing. `CU_FILE_INVALID_VALUE` for
/// unknown flags, `CU_FILE_ASYNC_NOT_SUPPORTED` for a stream other than
/// NULL without a CUDA driver.
#[no_mangle]
pub extern "C" fn cuFileStreamRegister(stream: *mut c_void, flags: c_uint) -> CUfileError {
    guard(|| {
        if flags & !stream_flags::ALL != 0 {
            return Err(Fail::INVALID);
        }
        if !stream.is_null() && !driver::cuda() {
            return Err(Fail::cu(op::ASYNC_NOT_SUPPORTED));
        }
        STREAMS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(stream as usize, flags);
        Ok(())
    })
}

/// Forgets a registered stream; `CU_FILE_INVALID_VALUE` for one that is
/// not registered.
#[no_mangle]
pub extern "C" fn cuFileStreamDeregister(stream: *mut c_void) -> CUfileError {
    guard(|| {
        STREAMS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&(stream as usize)))
            .map(drop)
            .ok_or(Fail::INVALID)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_register_with_known_flags_only() {
        let null = std::ptr::null_mut();
        assert_eq!(cuFileStreamRegister(null, 16).err, op::INVALID_VALUE);
        assert_eq!(cuFileStreamRegister(null, 15), CUfileError::SUCCESS);
        assert_eq!(cuFileStreamDeregister(null), CUfileError::SUCCESS);
        assert_eq!(cuFileStreamDeregister(null).err, op::INVALID_VALUE);
        if !driver::cuda() {
            assert_eq!(
                cuFileStreamRegister(0x10 as *mut c_void, 0).err,
                op::ASYNC_NOT_SUPPORTED
            );
        }
    }
}
