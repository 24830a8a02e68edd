//! Typed errors that keep the errno and say what was being done.

use std::path::PathBuf;

/// What can go wrong in libp2pdma.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel module's device node is missing or cannot be opened.
    #[error("cannot open {path}: {source} (is the p2pdma module loaded, and are you in its group?)")]
    Open {
        /// The device node.
        path: PathBuf,
        /// The errno.
        source: rustix::io::Errno,
    },
    /// An ioctl on `/dev/p2pdma` failed.
    #[error("{op} failed: {source}")]
    Ioctl {
        /// The ioctl's name.
        op: &'static str,
        /// The errno.
        source: rustix::io::Errno,
    },
    /// The module speaks an ABI this library cannot use.
    #[error("kernel module ABI version {module} is not compatible with this library (ABI {library}, needs module >= {library_min})")]
    AbiMismatch {
        /// ABI of the loaded module.
        module: u32,
        /// ABI of this library.
        library: u32,
        /// Oldest module ABI this library accepts.
        library_min: u32,
    },
}

impl Error {
    /// The errno behind the error, if there is one.
    pub fn errno(&self) -> Option<rustix::io::Errno> {
        match self {
            Error::Open { source, .. } | Error::Ioctl { source, .. } => Some(*source),
            Error::AbiMismatch { .. } => None,
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
