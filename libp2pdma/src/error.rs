//! Typed errors that keep the errno and say what was being done.

use std::path::PathBuf;

use rustix::io::Errno;

/// What can go wrong in libp2pdma.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel module's device node is missing or cannot be opened.
    #[error(
        "cannot open {path}: {source} (is the p2pdma module loaded, and are you in its group?)"
    )]
    Open {
        /// The device node.
        path: PathBuf,
        /// The errno.
        source: Errno,
    },
    /// An ioctl failed.
    #[error("{op} failed: {source}")]
    Ioctl {
        /// The ioctl's name.
        op: &'static str,
        /// The errno.
        source: Errno,
    },
    /// The kernel module speaks an ABI this library cannot use.
    #[error("kernel module ABI version {module} is not compatible with this library (ABI {library}, needs module >= {library_min})")]
    AbiMismatch {
        /// ABI of the loaded module.
        module: u32,
        /// ABI of this library.
        library: u32,
        /// Oldest module ABI this library accepts.
        library_min: u32,
    },
    /// Mapping device memory into this process failed.
    #[error("mmap of {len} bytes at offset {offset:#x} of the p2pdma device failed: {source}")]
    Mmap {
        /// The `mmap` offset.
        offset: u64,
        /// The length asked for.
        len: u64,
        /// The errno.
        source: Errno,
    },
    /// A copy or I/O range does not lie inside a mapping.
    #[error("range {offset:#x}+{len:#x} is outside the {size:#x}-byte mapping")]
    OutOfBounds {
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// Size of the mapping.
        size: u64,
    },
    /// Another system call failed.
    #[error("{op} failed: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The errno.
        source: Errno,
    },
    /// An argument cannot be used as given.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A transfer moved fewer bytes than asked for (for example, a read past
    /// the end of a file). Nothing partial is reported as success.
    #[error("short transfer: {what} moved {done} of {expected} bytes")]
    Short {
        /// What was being done.
        what: &'static str,
        /// Bytes asked for.
        expected: u64,
        /// Bytes moved.
        done: u64,
    },
    /// A read reaches past the end of the file: the file holds `size` bytes
    /// when the read starts, and the read asked for `len` at `offset`.
    #[error(
        "read of {len} bytes at offset {offset} of {path} reaches past its end ({size} bytes)"
    )]
    EndOfFile {
        /// The file.
        path: PathBuf,
        /// Start of the read.
        offset: u64,
        /// Its length.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// An I/O on storage failed.
    #[error("{op} of {len} bytes at offset {offset} of {path} failed: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Its offset.
        offset: u64,
        /// The I/O's length.
        len: u64,
        /// The errno.
        source: Errno,
    },
    /// The NVMe controller completed a command with an error status.
    #[error("{op} of {len} bytes at offset {offset} failed with NVMe status {status:#x}")]
    NvmeStatus {
        /// What was being done.
        op: &'static str,
        /// Byte offset in the namespace.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The NVMe status field (status code type and code).
        status: u32,
    },
    /// The code running an asynchronous transfer panicked (a `DeviceMemory`
    /// implementation, say); the transfer did not complete.
    #[error("the transfer panicked: {0}")]
    Panicked(String),
    /// The requested transfer path cannot serve this transfer.
    #[error("the {path} path cannot be used: {reason}")]
    PathUnavailable {
        /// The path asked for.
        path: &'static str,
        /// Why not.
        reason: String,
    },
}

impl Error {
    /// The errno behind the error, if there is one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Open { source, .. }
            | Error::Ioctl { source, .. }
            | Error::Mmap { source, .. }
            | Error::Sys { source, .. }
            | Error::Io { source, .. } => Some(*source),
            Error::NvmeStatus { .. } => Some(Errno::IO),
            Error::AbiMismatch { .. }
            | Error::OutOfBounds { .. }
            | Error::InvalidArgument(_)
            | Error::Short { .. }
            | Error::EndOfFile { .. }
            | Error::Panicked(_)
            | Error::PathUnavailable { .. } => None,
        }
    }

    pub(crate) fn ioctl(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Error::Ioctl { op, source }
    }

    pub(crate) fn sys(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Error::Sys { op, source }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_errors_name_the_ioctl_and_keep_the_errno() {
        let e = Error::ioctl("P2PDMA_IOC_ALLOC")(Errno::NOMEM);
        assert_eq!(e.errno(), Some(Errno::NOMEM));
        assert!(e.to_string().starts_with("P2PDMA_IOC_ALLOC failed"), "{e}");
        let e = Error::OutOfBounds {
            offset: 4096,
            len: 1,
            size: 4096,
        };
        assert_eq!(e.errno(), None);
        assert!(e.to_string().contains("0x1000+0x1"), "{e}");
    }
}
