//! What can go wrong while reading the machine's topology.

use std::{io, path::PathBuf};

use super::devnum::DevNum;

/// What can go wrong while reading the topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The path cannot be looked at.
    #[error("cannot stat {path}: {source}")]
    Stat {
        /// The path given.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The path is of a kind that holds no storage this library can use.
    #[error("{path} is {what}")]
    Unsupported {
        /// The path given.
        path: PathBuf,
        /// What it is, in words.
        what: String,
    },
    /// The filesystem holding a file has no block device behind it.
    #[error("{path} is on {fs} (device {dev}), which has no block device behind it; give a file on a disk-backed filesystem or the device node itself")]
    NoBlockDevice {
        /// The path given.
        path: PathBuf,
        /// The filesystem's device number.
        dev: DevNum,
        /// The filesystem, in words (its type and source when known).
        fs: String,
    },
    /// A sysfs (or procfs) file or directory cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A sysfs file holds something other than what it should.
    #[error("{path}: {value:?} is not {expected}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it holds.
        value: String,
        /// What it should hold, in words.
        expected: &'static str,
    },
}

/// Result with [`TopologyError`].
pub type Result<T, E = TopologyError> = std::result::Result<T, E>;
