//! How failures reach C: one [`Fail`] inside, three ways out.
//!
//! - Calls that return `CUfileError_t` return [`Fail::status`]: an OS error
//!   there has no errno to travel in, so it reads as
//!   `CU_FILE_IO_NOT_SUPPORTED`, `CU_FILE_PERMISSION_DENIED` or
//!   `CU_FILE_INTERNAL_ERROR` by its errno.
//! - `cuFileRead`/`cuFileWrite` return [`Fail::ssize`]: `-1` with `errno`
//!   set for OS and storage errors, `-CUfileOpError` for cuFile's own, as
//!   NVIDIA documents (never `-errno`: `IS_CUFILE_ERR` tells the two apart).
//! - Batch events and stream operations carry [`Fail::negated`] and
//!   [`Fail::stream_result`]: `ret` is `-errno` or `-CUfileOpError` in a
//!   `size_t`, and an async byte count is `-1` or `-CUfileOpError`.
//!
//! Every export runs inside one of the guards at the bottom, so that a
//! panic becomes `CU_FILE_INTERNAL_ERROR` instead of unwinding into C.

use std::panic::{catch_unwind, AssertUnwindSafe};

use p2pdma::Error;

use crate::abi::{op, CUfileError};

/// Why a call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    /// An OS or storage error, with its errno.
    Os(i32),
    /// A cuFile error (a `CUfileOpError` value), with the CUDA status when
    /// it is `CU_FILE_CUDA_DRIVER_ERROR`.
    Cufile {
        /// The `CUfileOpError`.
        err: u32,
        /// The `CUresult`, or 0.
        cu_err: i32,
    },
}

/// Result of the crate's inner functions.
pub type Res<T> = std::result::Result<T, Fail>;

impl Fail {
    /// The cuFile error `err`.
    pub const fn cu(err: u32) -> Self {
        Fail::Cufile { err, cu_err: 0 }
    }

    /// `CU_FILE_INVALID_VALUE`.
    pub const INVALID: Self = Self::cu(op::INVALID_VALUE);

    /// The `CUfileError_t` of a call that returns one.
    pub fn status(self) -> CUfileError {
        match self {
            Fail::Cufile { err, cu_err } => CUfileError { err, cu_err },
            Fail::Os(errno) => CUfileError::of(match errno {
                libc::EACCES | libc::EPERM | libc::EROFS => op::PERMISSION_DENIED,
                libc::EINVAL | libc::EOPNOTSUPP => op::IO_NOT_SUPPORTED,
                libc::EBADF => op::INVALID_VALUE,
                libc::EMFILE | libc::ENFILE => op::GETNEWFD_FAILED,
                _ => op::INTERNAL_ERROR,
            }),
        }
    }

    /// What `cuFileRead`/`cuFileWrite` return: `-1` with `errno` set, or
    /// `-CUfileOpError`.
    pub fn ssize(self) -> isize {
        match self {
            Fail::Os(errno) => {
                set_errno(errno);
                -1
            }
            Fail::Cufile { err, .. } => -(err as isize),
        }
    }

    /// The negated error of a batch event: `-errno` or `-CUfileOpError`.
    pub fn negated(self) -> isize {
        match self {
            Fail::Os(errno) => -(errno as isize),
            Fail::Cufile { err, .. } => -(err as isize),
        }
    }

    /// The byte count of a failed stream operation: `-1` for an OS error
    /// (no errno can reach the caller's thread), `-CUfileOpError` otherwise.
    pub fn stream_result(self) -> isize {
        match self {
            Fail::Os(_) => -1,
            Fail::Cufile { err, .. } => -(err as isize),
        }
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        if let Some(errno) = e.errno() {
            return Fail::Os(errno.raw_os_error());
        }
        match e {
            Error::InvalidArgument(_) | Error::OutOfBounds { .. } => Fail::INVALID,
            Error::Cuda { code, .. } => Fail::Cufile {
                err: op::CUDA_DRIVER_ERROR,
                // `u32::MAX` (a function the driver lacks) reads as -1.
                cu_err: code as i32,
            },
            Error::CudaUnavailable(_) => Fail::cu(op::CUDA_DRIVER_ERROR),
            // A read whose file shrank under it, a device that moved less
            // than asked: the storage failed the transfer.
            Error::EndOfFile { .. } | Error::Short { .. } => Fail::Os(libc::EIO),
            Error::PathUnavailable { .. } => Fail::cu(op::IO_NOT_SUPPORTED),
            Error::AbiMismatch { .. } => Fail::cu(op::DRIVER_VERSION_MISMATCH),
            _ => Fail::cu(op::INTERNAL_ERROR),
        }
    }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(errno: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno, valid
    // for the thread's life.
    unsafe { *libc::__errno_location() = errno };
}

/// Runs an export that returns `CUfileError_t`.
///
/// Every table the exports share is behind a lock that ignores poisoning,
/// and no export leaves one half-updated, so what a panic interrupted is
/// safe to use afterwards.
pub fn guard(f: impl FnOnce() -> Res<()>) -> CUfileError {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUfileError::SUCCESS,
        Ok(Err(fail)) => fail.status(),
        Err(_) => CUfileError::of(op::INTERNAL_ERROR),
    }
}

/// Runs an export that returns `ssize_t`.
pub fn guard_ssize(f: impl FnOnce() -> Res<usize>) -> isize {
    match catch_unwind(AssertUnwindSafe(f)) {
        // A transfer is at most `isize::MAX` bytes (checked on entry).
        Ok(Ok(n)) => n as isize,
        Ok(Err(fail)) => fail.ssize(),
        Err(_) => -(op::INTERNAL_ERROR as isize),
    }
}

/// Runs an export that returns nothing (or a plain value): a panic gives
/// `fallback`.
pub fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_errno_or_cufile_codes() {
        let io = Error::Io {
            op: "read",
            path: "/f".into(),
            offset: 0,
            len: 1,
            source: rustix_errno(libc::ENODATA),
            member: None,
        };
        assert_eq!(Fail::from(io), Fail::Os(libc::ENODATA));
        assert_eq!(
            Fail::from(Error::InvalidArgument("x".into())),
            Fail::INVALID
        );
        assert_eq!(
            Fail::from(Error::OutOfBounds {
                offset: 1,
                len: 2,
                size: 2
            }),
            Fail::INVALID
        );
        assert_eq!(
            Fail::from(Error::Cuda {
                op: "cuMemcpyDtoHAsync",
                code: 700,
                name: "CUDA_ERROR_ILLEGAL_ADDRESS".into()
            }),
            Fail::Cufile {
                err: op::CUDA_DRIVER_ERROR,
                cu_err: 700
            }
        );
        assert_eq!(
            Fail::from(Error::CudaUnavailable("none".into())),
            Fail::cu(op::CUDA_DRIVER_ERROR)
        );
        assert_eq!(
            Fail::from(Error::EndOfFile {
                path: "/f".into(),
                offset: 0,
                len: 2,
                size: 1
            }),
            Fail::Os(libc::EIO)
        );
        assert_eq!(
            Fail::from(Error::Panicked("boom".into())),
            Fail::cu(op::INTERNAL_ERROR)
        );
        assert_eq!(
            Fail::from(Error::PathUnavailable {
                path: "p2p",
                reason: "no".into()
            }),
            Fail::cu(op::IO_NOT_SUPPORTED)
        );
    }

    #[test]
    fn each_way_out_has_its_convention() {
        let os = Fail::Os(libc::EIO);
        assert_eq!(os.ssize(), -1);
        // SAFETY: The calling thread's errno.
        assert_eq!(unsafe { *libc::__errno_location() }, libc::EIO);
        assert_eq!(os.negated(), -(libc::EIO as isize));
        assert_eq!(os.stream_result(), -1);
        assert_eq!(os.status(), CUfileError::of(op::INTERNAL_ERROR));
        assert_eq!(
            Fail::Os(libc::EACCES).status(),
            CUfileError::of(op::PERMISSION_DENIED)
        );

        let cu = Fail::cu(op::HANDLE_NOT_REGISTERED);
        assert_eq!(cu.ssize(), -5027);
        assert_eq!(cu.negated(), -5027);
        assert_eq!(cu.stream_result(), -5027);
        assert_eq!(cu.status(), CUfileError::of(5027));
        let cuda = Fail::Cufile {
            err: op::CUDA_DRIVER_ERROR,
            cu_err: 1,
        };
        assert_eq!(
            cuda.status(),
            CUfileError {
                err: 5011,
                cu_err: 1
            }
        );
    }

    #[test]
    fn panics_never_leave_a_guard() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        assert_eq!(
            guard(|| panic!("boom")),
            CUfileError::of(op::INTERNAL_ERROR)
        );
        assert_eq!(guard_ssize(|| panic!("boom")), -5030);
        assert_eq!(guard_value(7, || panic!("boom")), 7);
        std::panic::set_hook(prev);
        assert_eq!(guard(|| Ok(())), CUfileError::SUCCESS);
        assert_eq!(guard_ssize(|| Ok(12)), 12);
    }

    fn rustix_errno(e: i32) -> rustix::io::Errno {
        rustix::io::Errno::from_raw_os_error(e)
    }
}
