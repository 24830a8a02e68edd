//! Failures as C sees them: a negative errno returned, and a message kept
//! per thread for `p2pdma_last_error`.

use std::{
    any::Any,
    cell::RefCell,
    ffi::{c_char, c_int, CString},
    panic::{self, AssertUnwindSafe},
};

use p2pdma::Error;

use crate::ERR_INTERNAL;

/// A failed call: the negative errno it returns and what went wrong.
#[derive(Debug)]
pub(crate) struct Failure {
    code: c_int,
    message: String,
}

impl Failure {
    /// A failure with errno `errno` (positive) and `message`.
    pub(crate) fn new(errno: c_int, message: impl Into<String>) -> Self {
        Self {
            code: -errno.abs(),
            message: message.into(),
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

    /// A library error, with a transfer's short read reported as `-ENODATA`
    /// (the range runs past the end of the file) and any other short
    /// transfer as `-EIO`.
    pub(crate) fn from_read(e: Error) -> Self {
        match e {
            Error::Short { .. } | Error::EndOfFile { .. } => {
                Self::new(libc::ENODATA, e.to_string())
            }
            e => Self::from(e),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let errno = match (e.errno(), &e) {
            (Some(errno), _) => errno.raw_os_error(),
            (None, Error::AbiMismatch { .. }) => libc::EPROTO,
            (None, Error::OutOfBounds { .. } | Error::InvalidArgument(_)) => libc::EINVAL,
            (None, Error::PathUnavailable { .. }) => libc::EOPNOTSUPP,
            (None, _) => libc::EIO,
        };
        Self::new(errno, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(func: &str, message: &str) {
    let text = format!("{func}: {message}").replace('\0', "\\0");
    let text = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// The calling thread's last failure message (empty before the first).
/// The pointer stays valid until the thread's next failure or its exit.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
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
            set_last_error(func, &failure.message);
            fail(failure.code)
        }
        Err(payload) => {
            set_last_error(
                func,
                &format!("internal error: {}", panic_message(&*payload)),
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
        // SAFETY: `last_error` returns the thread-local message, a valid
        // NUL-terminated string until this thread's next failure.
        unsafe { CStr::from_ptr(last_error()) }
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
            what: "read past the end of the file",
            expected: 10,
            done: 3,
        };
        let f = Failure::from_read(e);
        assert_eq!(f.code, -libc::ENODATA);
        assert!(f.message.contains("short"), "{}", f.message);
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
