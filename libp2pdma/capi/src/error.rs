//! Failures as C sees them: the library's own return codes, a negative
//! errno returned, and a message and an NVMe status kept per thread for
//! `p2pdma_last_error` and `p2pdma_last_nvme_status`, which live here too.

use std::{
    any::Any,
    cell::RefCell,
    ffi::{c_char, c_int, CString},
    panic::{self, AssertUnwindSafe},
};

use p2pdma::Error;

/// The library's own return codes, beside negative errnos.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_error_code {
    /// A read reaches past the end of the file: the file is shorter than
    /// `file_offset + len` when the read runs (or became shorter while it
    /// ran). Equal to `-ERANGE`, which no storage I/O returns, so it is never
    /// confused with a medium error (`-ENODATA`) or another device error.
    /// Nothing partial is reported as success.
    P2PDMA_ERR_EOF = -34,
    /// The library hit an internal error (a bug) and caught it before it
    /// reached the caller; equal to `-ENOTRECOVERABLE`. The handles passed
    /// to that call remain valid, and p2pdma_last_error() says what
    /// happened.
    P2PDMA_ERR_INTERNAL = -131,
}

/// [`p2pdma_error_code::P2PDMA_ERR_EOF`] as a return value.
pub(crate) const ERR_EOF: c_int = p2pdma_error_code::P2PDMA_ERR_EOF as c_int;
const _: () = assert!(ERR_EOF == -libc::ERANGE);

/// [`p2pdma_error_code::P2PDMA_ERR_INTERNAL`] as a return value.
pub(crate) const ERR_INTERNAL: c_int = p2pdma_error_code::P2PDMA_ERR_INTERNAL as c_int;
const _: () = assert!(ERR_INTERNAL == -libc::ENOTRECOVERABLE);

/// A failed call: the negative errno it returns, what went wrong, and the
/// controller's NVMe status when it failed a command (else 0).
#[derive(Debug)]
pub(crate) struct Failure {
    code: c_int,
    message: String,
    nvme_status: u32,
}

impl Failure {
    /// A failure with errno `errno` (positive) and `message`.
    pub(crate) fn new(errno: c_int, message: impl Into<String>) -> Self {
        Self {
            code: -errno.abs(),
            message: message.into(),
            nvme_status: 0,
        }
    }

    /// An argument that cannot be used (`-EINVAL`).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(libc::EINVAL, message)
    }

    /// A NULL pointer where an object was needed (`-EINVAL`).
    pub(crate) fn null(arg: &str) -> Self {
        Self::invalid(format!("`{arg}` is NULL"))
    }

    /// The same failure, its message prefixed with `what` (`ops[2]: ...`).
    pub(crate) fn context(self, what: &str) -> Self {
        Self {
            message: format!("{what}: {}", self.message),
            ..self
        }
    }

    /// A library error from a read: a short read is the storage ending
    /// before the range did, so it is `P2PDMA_ERR_EOF` like a read that
    /// starts past the end (a short write stays `-EIO`).
    pub(crate) fn from_read(e: Error) -> Self {
        match e {
            Error::Short { .. } => Self::new(-ERR_EOF, e.to_string()),
            e => Self::from(e),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let errno = match (e.errno(), &e) {
            (Some(errno), _) => errno.raw_os_error(),
            (None, Error::EndOfFile { .. }) => -ERR_EOF,
            (None, Error::AbiMismatch { .. }) => libc::EPROTO,
            (None, Error::OutOfBounds { .. } | Error::InvalidArgument(_)) => libc::EINVAL,
            (None, Error::PathUnavailable { .. }) => libc::EOPNOTSUPP,
            (None, Error::CudaUnavailable(_)) => libc::ENODEV,
            (None, _) => libc::EIO,
        };
        Self {
            nvme_status: e.nvme_status().map_or(0, |s| s.raw()),
            ..Self::new(errno, e.to_string())
        }
    }
}

/// What the calling thread's last failure left for C to ask about.
#[derive(Default)]
struct Last {
    message: CString,
    nvme_status: u32,
}

thread_local! {
    static LAST: RefCell<Last> = RefCell::new(Last::default());
}

fn set_last(func: &str, message: &str, nvme_status: u32) {
    let text = format!("{func}: {message}").replace('\0', "\\0");
    let message = CString::new(text).unwrap_or_default();
    LAST.with(|last| {
        *last.borrow_mut() = Last {
            message,
            nvme_status,
        }
    });
}

/// The message of the calling thread's last failure, NUL-terminated; an
/// empty string before the first. Successful calls leave it unchanged. The
/// string belongs to the library and stays valid until the thread's next
/// failing call or its exit.
#[no_mangle]
pub extern "C" fn p2pdma_last_error() -> *const c_char {
    LAST.with(|last| last.borrow().message.as_ptr())
}

/// The NVMe status of the calling thread's last failure, when an NVMe
/// controller failed a command of that call (the NVMe-command path); 0 when
/// the last failure was anything else, and before the first. Successful
/// calls leave it unchanged, as they leave p2pdma_last_error().
///
/// The call itself returned the errno the kernel's block layer gives the
/// same status, so a failure reads the same on every path: -ENODATA for a
/// medium error (Write Fault, Unrecovered Read Error, Deallocated or
/// Unwritten Logical Block...), -EILSEQ for end-to-end protection errors,
/// -EIO for most others. p2pdma_last_error() names the status in words,
/// e.g. "Unrecovered Read Error (SCT 0x2, SC 0x81)".
///
/// The value is the status field of the completion queue entry without its
/// phase tag, as the kernel passes it: Status Code `status & 0xff`, Status
/// Code Type `(status >> 8) & 0x7`, Command Retry Delay
/// `(status >> 11) & 0x3`, More `status & 0x2000`, Do Not Retry
/// `status & 0x4000`. An Unrecovered Read Error is `(status & 0x7ff) ==
/// 0x281`.
#[no_mangle]
pub extern "C" fn p2pdma_last_nvme_status() -> u32 {
    LAST.with(|last| last.borrow().nvme_status)
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic")
}

/// Runs the body of entry point `func`. A failure becomes its negative
/// errno (`fail` turns it into the return type) and the thread's last error;
/// a panic is caught before it reaches C and becomes
/// `P2PDMA_ERR_INTERNAL`.
pub(crate) fn call<T>(
    func: &str,
    fail: impl FnOnce(c_int) -> T,
    body: impl FnOnce() -> Result<T, Failure>,
) -> T {
    // The body's state is not used again after a panic: the objects it
    // touched are the caller's handles, whose Rust types keep their
    // invariants across a panic (their locks recover from poisoning).
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(failure)) => {
            set_last(func, &failure.message, failure.nvme_status);
            fail(failure.code)
        }
        Err(payload) => {
            set_last(
                func,
                &format!("internal error: {}", panic_message(&*payload)),
                0,
            );
            fail(ERR_INTERNAL)
        }
    }
}

/// [`call`] for entry points that return a status as `int`.
pub(crate) fn status(func: &str, body: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    call(func, |code| code, body)
}

/// Runs the body of an entry point that returns nothing (the `free` and
/// `close` functions), catching a panic before it reaches C.
pub(crate) fn void(func: &str, body: impl FnOnce()) {
    call(
        func,
        |_| (),
        || {
            body();
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    fn last() -> String {
        // SAFETY: `p2pdma_last_error` returns the thread-local message, a
        // valid NUL-terminated string until this thread's next failure.
        unsafe { CStr::from_ptr(p2pdma_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn errors_keep_their_errno_and_message() {
        assert_eq!(last(), "");
        let rc = status("f", || Err(Failure::null("out")));
        assert_eq!(rc, -libc::EINVAL);
        assert_eq!(last(), "f: `out` is NULL");

        let e = Error::Short {
            what: "read from storage",
            expected: 10,
            done: 3,
        };
        let f = Failure::from_read(e);
        assert_eq!(f.code, ERR_EOF);
        assert_eq!(f.code, -libc::ERANGE);
        assert!(f.message.contains("short"), "{}", f.message);
        let f = Failure::from_read(Error::EndOfFile {
            path: "/data/f".into(),
            offset: 10,
            len: 20,
            size: 15,
        });
        assert_eq!(f.code, ERR_EOF);
        assert!(f.message.contains("past its end"), "{}", f.message);
        let f = Failure::from(Error::Short {
            what: "write to storage",
            expected: 10,
            done: 3,
        });
        assert_eq!(f.code, -libc::EIO);
        let f = Failure::from(Error::Sys {
            op: "mmap",
            source: rustix::io::Errno::NOMEM,
        });
        assert_eq!(f.code, -libc::ENOMEM);
        let f = Failure::from(Error::PathUnavailable {
            path: "nvme-cmd",
            reason: "not yet".into(),
        });
        assert_eq!(f.code, -libc::EOPNOTSUPP);
    }

    #[test]
    fn a_medium_error_is_not_the_end_of_the_file() {
        let eof = Failure::from_read(Error::EndOfFile {
            path: "/data/f".into(),
            offset: 0,
            len: 4096,
            size: 100,
        });
        let io = |source| Error::Io {
            op: "P2P read",
            path: "/dev/nvme0n1".into(),
            offset: 0,
            len: 4096,
            source,
            member: None,
        };
        let medium = Failure::from_read(io(rustix::io::Errno::NODATA));
        assert_eq!(medium.code, -libc::ENODATA);
        assert_ne!(eof.code, medium.code);
        for errno in [
            rustix::io::Errno::IO,
            rustix::io::Errno::NODATA,
            rustix::io::Errno::ILSEQ,
            rustix::io::Errno::REMOTEIO,
            rustix::io::Errno::OPNOTSUPP,
            rustix::io::Errno::NOLINK,
            rustix::io::Errno::NOSPC,
            rustix::io::Errno::TIMEDOUT,
        ] {
            let f = Failure::from_read(io(errno));
            assert_eq!(f.code, -errno.raw_os_error());
            assert_ne!(f.code, eof.code, "{errno:?}");
            assert_eq!(f.nvme_status, 0);
        }
    }

    #[test]
    fn an_nvme_status_reaches_c_with_the_block_layers_errno() {
        let nvme = |status| Error::NvmeStatus {
            op: "NVMe read",
            offset: 8192,
            len: 4096,
            status,
        };
        // An unrecovered read error is a medium error, as on the P2P path.
        let rc = status("p2pdma_read", || Err(Failure::from_read(nvme(0x4281))));
        assert_eq!(rc, -libc::ENODATA);
        assert_eq!(p2pdma_last_nvme_status(), 0x4281);
        assert!(
            last().contains("Unrecovered Read Error (SCT 0x2, SC 0x81, do not retry)"),
            "{}",
            last()
        );
        // Most others are EIO; the status is still there.
        let rc = status("p2pdma_write", || Err(Failure::from(nvme(0x006))));
        assert_eq!(rc, -libc::EIO);
        assert_eq!(p2pdma_last_nvme_status(), 0x006);
        assert!(
            last().contains("Internal Error (SCT 0x0, SC 0x6)"),
            "{}",
            last()
        );
        // A later failure without a status clears it; a success leaves it.
        let rc = status("p2pdma_read", || Err(Failure::invalid("x")));
        assert_eq!(rc, -libc::EINVAL);
        assert_eq!(p2pdma_last_nvme_status(), 0);
        let _ = status("p2pdma_read", || Err(Failure::from(nvme(0x280))));
        assert_eq!(status("p2pdma_read", || Ok(0)), 0);
        assert_eq!(p2pdma_last_nvme_status(), 0x280);
        let rc = status("g", || panic!("boom"));
        assert_eq!(rc, ERR_INTERNAL);
        assert_eq!(p2pdma_last_nvme_status(), 0);
    }

    #[test]
    fn cuda_errors_say_whether_cuda_is_there() {
        let rc = status("p2pdma_read", || {
            Err(Failure::from(Error::CudaUnavailable("no driver".into())))
        });
        assert_eq!(rc, -libc::ENODEV);
        assert!(
            last().contains("CUDA is not available: no driver"),
            "{}",
            last()
        );
        let rc = status("p2pdma_read", || {
            Err(Failure::from(Error::Cuda {
                op: "cuMemcpyHtoDAsync",
                code: 700,
                name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            }))
        });
        assert_eq!(rc, -libc::EIO);
        assert!(last().contains("cuMemcpyHtoDAsync"), "{}", last());
    }

    #[test]
    fn panics_become_an_internal_error() {
        let rc = status("g", || panic!("boom"));
        assert_eq!(rc, ERR_INTERNAL);
        assert_eq!(last(), "g: internal error: boom");
        let rc = call("h", i64::from, || {
            Err(Failure::new(libc::ENOENT, "gone\0here"))
        });
        assert_eq!(rc, -i64::from(libc::ENOENT));
        assert_eq!(last(), "h: gone\\0here");
    }

    #[test]
    fn messages_are_per_thread() {
        let _ = status("main", || Err(Failure::invalid("x")));
        let other = std::thread::spawn(last).join().unwrap();
        assert_eq!(other, "");
        assert_eq!(last(), "main: x");
    }
}
