//! The paths, the caller's preference among them, and a choice with its
//! reason.

use std::{fmt, str::FromStr};

use crate::{Error, Result};

/// How data moves between storage and accelerator memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferPath {
    /// The NVMe device DMAs straight into (or out of) the accelerator's
    /// memory through the block layer (`O_DIRECT` on P2P pages).
    P2p,
    /// NVMe commands built by the library and sent through the namespace's
    /// generic character device, with the accelerator's bus addresses.
    NvmeCmd,
    /// Staged through host memory: storage to host, host to accelerator.
    Bounce,
    /// NVMe commands this process puts in queues in accelerator memory, on
    /// a controller it drives through VFIO: no kernel in the I/O path.
    Queues,
    /// The storage DMAs straight into (or out of) host memory by `O_DIRECT`
    /// through io_uring, with no staging copy: how host memory is read and
    /// written, where P2P has no meaning. The bounce pipeline takes a
    /// transfer whose file and memory addresses do not align together to
    /// the block.
    Direct,
}

impl TransferPath {
    /// `p2p`, `nvme-cmd`, `bounce`, `queues`, `direct`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransferPath::P2p => "p2p",
            TransferPath::NvmeCmd => "nvme-cmd",
            TransferPath::Bounce => "bounce",
            TransferPath::Queues => "queues",
            TransferPath::Direct => "direct",
        }
    }
}

impl fmt::Display for TransferPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The data path chosen, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathChoice {
    /// The path.
    pub path: TransferPath,
    /// Why, in words.
    pub reason: String,
}

/// Which path transfers take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PathPref {
    /// P2P where possible, the bounce pipeline otherwise, with the reason.
    #[default]
    Auto,
    /// Always P2P (`O_DIRECT` into the accelerator's mapping).
    P2p,
    /// NVMe commands built by the library (io_uring passthrough).
    NvmeCmd,
    /// Always the bounce pipeline.
    Bounce,
    /// The queues path: only a namespace of a controller this process
    /// drives ([`crate::transfer::StorageFile::namespace`]), which AUTO puts on it too.
    Queues,
}

impl PathPref {
    /// `auto`, `p2p`, `nvme-cmd`, `bounce`, `queues`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::P2p => "p2p",
            Self::NvmeCmd => "nvme-cmd",
            Self::Bounce => "bounce",
            Self::Queues => "queues",
        }
    }
}

impl FromStr for PathPref {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "p2p" => Ok(Self::P2p),
            "nvme-cmd" | "nvme_cmd" | "nvmecmd" => Ok(Self::NvmeCmd),
            "bounce" => Ok(Self::Bounce),
            "queues" => Ok(Self::Queues),
            other => Err(Error::InvalidArgument(format!(
                "unknown path '{other}' (auto, p2p, nvme-cmd, bounce, queues)"
            ))),
        }
    }
}

impl fmt::Display for PathPref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the P2P path submits block I/O.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum P2pSubmit {
    /// The module's block I/O where it can (a block device, memory from the
    /// module), `O_DIRECT` on the memory's mapping otherwise.
    #[default]
    Auto,
    /// Always `O_DIRECT` on the memory's mapping: the kernel pins the
    /// mapping's pages for every I/O.
    Odirect,
}

impl FromStr for P2pSubmit {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "odirect" | "o_direct" => Ok(Self::Odirect),
            other => Err(Error::InvalidArgument(format!(
                "unknown P2P submission '{other}' (auto, odirect)"
            ))),
        }
    }
}

impl fmt::Display for P2pSubmit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Odirect => "odirect",
        })
    }
}
