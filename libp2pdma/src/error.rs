//! Typed errors that keep the errno and say what was being done.

use std::{fmt, path::PathBuf};

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
    #[error(
        "{op} of {len} bytes at offset {offset} of {path} failed: {source}{}",
        member.as_deref().map(|m| format!(" ({m})")).unwrap_or_default()
    )]
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
        /// On an md array: the member the error came from, and what it
        /// said, as far as the library could tell. On a multipath or
        /// fabrics namespace whose paths are all down: each, with its
        /// controller's state.
        member: Option<String>,
    },
    /// The NVMe controller completed a command with an error status
    /// ([`NvmeStatus`] reads it).
    #[error(
        "{op} of {len} bytes at offset {offset} failed: NVMe status {}",
        NvmeStatus::from_raw(*.status)
    )]
    NvmeStatus {
        /// What was being done.
        op: &'static str,
        /// Byte offset in the namespace.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The status field of the completion, as the kernel passes it to
        /// passthrough callers (see [`NvmeStatus`]).
        status: u32,
    },
    /// The code running an asynchronous transfer panicked (a `DeviceMemory`
    /// implementation, say); the transfer did not complete.
    #[error("the transfer panicked: {0}")]
    Panicked(String),
    /// An NVMe controller the library drives itself (the queues path)
    /// refused to be taken, timed out or failed. A failed controller is
    /// disabled, so that none of its DMA outlives the error.
    #[error("NVMe controller {pci}: {reason}")]
    Controller {
        /// Its PCI address.
        pci: String,
        /// What happened, in words.
        reason: String,
        /// `ETIMEDOUT` for a command that did not complete in time, `EBUSY`
        /// for a controller in use, `EIO` for one that failed.
        source: Errno,
    },
    /// A CUDA driver call failed.
    #[error("{op} failed: {name}")]
    Cuda {
        /// The driver function.
        op: &'static str,
        /// Its `CUresult` (`u32::MAX` when the driver lacks the function).
        code: u32,
        /// The status's name and text, as the driver gives them.
        name: String,
    },
    /// CUDA cannot be used in this process: no driver library, no device,
    /// or a driver too old.
    #[error("CUDA is not available: {0}")]
    CudaUnavailable(String),
    /// The requested transfer path cannot serve this transfer.
    #[error("the {path} path cannot be used: {reason}")]
    PathUnavailable {
        /// The path asked for.
        path: &'static str,
        /// Why not.
        reason: String,
    },
}

/// Refuses `len` bytes at `offset` that do not lie within the `size` bytes
/// of `what` (a namespace, a volume, an object) with [`Error::EndOfFile`].
pub(crate) fn check_within(what: &str, offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::EndOfFile {
            path: what.into(),
            offset,
            len,
            size,
        }),
    }
}

/// What a panic's payload says, when it is text.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> Option<String> {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
}

impl Error {
    /// The errno behind the error, if there is one. An NVMe status has the
    /// errno the kernel's block layer gives the same status
    /// ([`NvmeStatus::errno`]), so that a failure reads the same whichever
    /// path met it.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Open { source, .. }
            | Error::Ioctl { source, .. }
            | Error::Mmap { source, .. }
            | Error::Sys { source, .. }
            | Error::Io { source, .. }
            | Error::Controller { source, .. } => Some(*source),
            Error::NvmeStatus { status, .. } => Some(NvmeStatus::from_raw(*status).errno()),
            Error::AbiMismatch { .. }
            | Error::OutOfBounds { .. }
            | Error::InvalidArgument(_)
            | Error::Short { .. }
            | Error::EndOfFile { .. }
            | Error::Panicked(_)
            | Error::Cuda { .. }
            | Error::CudaUnavailable(_)
            | Error::PathUnavailable { .. } => None,
        }
    }

    /// The controller's status, when the error is one
    /// ([`Error::NvmeStatus`]).
    pub fn nvme_status(&self) -> Option<NvmeStatus> {
        match self {
            Error::NvmeStatus { status, .. } => Some(NvmeStatus::from_raw(*status)),
            _ => None,
        }
    }

    /// Whether redoing a transfer that failed with this error on the P2P or
    /// NVMe-command path can succeed on the bounce path (storage I/O into
    /// host memory, then CPU copies).
    ///
    /// Yes when the failure is the fast path's own: the path cannot serve the
    /// transfer ([`Error::PathUnavailable`]), the kernel refused the memory's
    /// P2P pages or the direct-I/O shape, or NVMe passthrough is not
    /// available; and for the few NVMe statuses that are about the data
    /// pointer rather than the medium ([`NvmeStatus::concerns_data_pointer`]).
    ///
    /// No for what the device or filesystem says about the data itself: a
    /// medium error, a failed device, a full or read-only filesystem, an
    /// error status from the controller, a short transfer or the end of the
    /// file. The bounce path would read or write the same range of the same
    /// device and fail the same way, a second time.
    ///
    /// The errnos, as the kernel returns them on these paths:
    ///
    /// | errno | fixable | where it comes from |
    /// |---|---|---|
    /// | `EREMOTEIO` | yes | pinning the pages of an `O_DIRECT` buffer refuses P2P pages when the queue does not take them (`try_grab_folio` without `FOLL_PCI_P2PDMA`); also a controller's LBA-range or namespace-not-ready status (`BLK_STS_TARGET`), which the bounce path then meets again |
    /// | `EINVAL` | yes | `O_DIRECT` alignment; the DMA mapping of P2P pages the controller cannot reach (`PCI_P2PDMA_MAP_NOT_SUPPORTED`, `BLK_STS_INVAL`); a passthrough buffer the request cannot take as is; an io_uring without 128-byte entries |
    /// | `EOPNOTSUPP` | yes | a file without `uring_cmd`, a ring without 128-byte entries, a filesystem without `FIEMAP` or direct I/O for this file |
    /// | `EACCES`, `EPERM` | yes | opening `/dev/ngXnY` without permission; a passthrough command the kernel does not allow this opener |
    /// | `ENOENT`, `ENXIO`, `ENODEV`, `ENOTTY` | yes | no generic device node, a namespace going away under its node, an unknown passthrough command; `ENODEV` is also an offline device (`BLK_STS_OFFLINE`), which the bounce path meets again at once |
    /// | `ENODATA` | no | a medium error (`BLK_STS_MEDIUM`: unrecovered read error, write fault, unwritten block) |
    /// | `EIO`, `EILSEQ`, `ETIMEDOUT`, `ENOLINK`, `EBADE`, `EINTR` | no | the device failed the I/O, protection information, a timeout, the transport, a reservation, a cancelled passthrough command |
    /// | `ENOSPC`, `EDQUOT`, `EFBIG`, `EROFS` | no | the filesystem or a limit refused the write |
    /// | `EFAULT` | no | the memory's mapping is gone (device unbound): the bounce path's CPU copies into it would fault |
    /// | `ENOMEM`, `EAGAIN`, `EBUSY`, others | no | not the fast path's doing |
    pub fn bounce_can_fix(&self) -> bool {
        match self {
            Error::PathUnavailable { .. } => true,
            Error::NvmeStatus { status, .. } => {
                NvmeStatus::from_raw(*status).concerns_data_pointer()
            }
            Error::Open { source, .. }
            | Error::Ioctl { source, .. }
            | Error::Mmap { source, .. }
            | Error::Sys { source, .. }
            | Error::Io { source, .. } => bounce_can_fix_errno(*source),
            Error::AbiMismatch { .. }
            | Error::OutOfBounds { .. }
            | Error::InvalidArgument(_)
            | Error::Short { .. }
            | Error::EndOfFile { .. }
            | Error::Controller { .. }
            | Error::Cuda { .. }
            | Error::CudaUnavailable(_)
            | Error::Panicked(_) => false,
        }
    }

    pub(crate) fn ioctl(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Error::Ioctl { op, source }
    }

    pub(crate) fn sys(op: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Error::Sys { op, source }
    }
}

/// Whether a fast-path failure with `errno` is the kernel refusing P2P pages,
/// the direct-I/O shape or passthrough (the table of
/// [`Error::bounce_can_fix`]).
fn bounce_can_fix_errno(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::REMOTEIO
            | Errno::INVAL
            | Errno::OPNOTSUPP
            | Errno::ACCESS
            | Errno::PERM
            | Errno::NOENT
            | Errno::NXIO
            | Errno::NODEV
            | Errno::NOTTY
    )
}

/// The status field of an NVMe completion, as the kernel hands it to
/// passthrough callers: the completion queue entry's status with the phase
/// tag shifted out. Bits 0-7 are the status code (SC), 8-10 the status code
/// type (SCT), 11-12 the command retry delay (CRD), 13 More, 14 Do Not Retry
/// (DNR).
///
/// It reads as the specification's name for the code and its numbers, e.g.
/// "Unrecovered Read Error (SCT 0x2, SC 0x81)".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NvmeStatus(u32);

impl NvmeStatus {
    /// Status Code Type: generic command status.
    pub const SCT_GENERIC: u8 = 0x0;
    /// Status Code Type: command specific status.
    pub const SCT_COMMAND_SPECIFIC: u8 = 0x1;
    /// Status Code Type: media and data integrity errors.
    pub const SCT_MEDIA: u8 = 0x2;
    /// Status Code Type: path related status.
    pub const SCT_PATH: u8 = 0x3;
    /// Status Code Type: vendor specific.
    pub const SCT_VENDOR: u8 = 0x7;

    /// The status as the kernel passes it (`NvmeResult::Status`,
    /// `Error::NvmeStatus::status`).
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    /// The raw value, as the kernel passed it.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// Status Code Type (bits 8-10).
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// Status Code (bits 0-7).
    pub const fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }

    /// Do Not Retry: the controller says the same command would fail again.
    pub const fn dnr(self) -> bool {
        self.0 & 0x4000 != 0
    }

    /// More: the controller has more to say in the Error Information log.
    pub const fn more(self) -> bool {
        self.0 & 0x2000 != 0
    }

    /// Command Retry Delay: which of the controller's retry delays applies
    /// (0: none).
    pub const fn crd(self) -> u8 {
        ((self.0 >> 11) & 0x3) as u8
    }

    /// SCT and SC together, as the kernel's `NVME_SC_*` constants spell them.
    const fn code(self) -> u16 {
        (self.0 & 0x7ff) as u16
    }

    /// The specification's name for the status, when this library knows it.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.code() {
            0x000 => "Successful Completion",
            0x001 => "Invalid Command Opcode",
            0x002 => "Invalid Field in Command",
            0x003 => "Command ID Conflict",
            0x004 => "Data Transfer Error",
            0x005 => "Commands Aborted due to Power Loss Notification",
            0x006 => "Internal Error",
            0x007 => "Command Abort Requested",
            0x008 => "Command Aborted due to SQ Deletion",
            0x00b => "Invalid Namespace or Format",
            0x00c => "Command Sequence Error",
            0x00d => "Invalid SGL Segment Descriptor",
            0x00e => "Invalid Number of SGL Descriptors",
            0x00f => "Data SGL Length Invalid",
            0x011 => "SGL Descriptor Type Invalid",
            0x012 => "Invalid Use of Controller Memory Buffer",
            0x013 => "PRP Offset Invalid",
            0x015 => "Operation Denied",
            0x016 => "SGL Offset Invalid",
            0x01e => "SGL Data Block Granularity Invalid",
            0x020 => "Namespace is Write Protected",
            0x021 => "Command Interrupted",
            0x022 => "Transient Transport Error",
            0x080 => "LBA Out of Range",
            0x081 => "Capacity Exceeded",
            0x082 => "Namespace Not Ready",
            0x083 => "Reservation Conflict",
            0x084 => "Format In Progress",
            0x180 => "Conflicting Attributes",
            0x181 => "Invalid Protection Information",
            0x182 => "Attempted Write to Read Only Range",
            0x183 => "Command Size Limit Exceeded",
            0x1b8 => "Zoned Boundary Error",
            0x1b9 => "Zone Is Full",
            0x1ba => "Zone Is Read Only",
            0x1bb => "Zone Is Offline",
            0x1bc => "Zone Invalid Write",
            0x1bd => "Too Many Active Zones",
            0x1be => "Too Many Open Zones",
            0x1bf => "Invalid Zone State Transition",
            0x280 => "Write Fault",
            0x281 => "Unrecovered Read Error",
            0x282 => "End-to-end Guard Check Error",
            0x283 => "End-to-end Application Tag Check Error",
            0x284 => "End-to-end Reference Tag Check Error",
            0x285 => "Compare Failure",
            0x286 => "Access Denied",
            0x287 => "Deallocated or Unwritten Logical Block",
            0x288 => "End-to-End Storage Tag Check Error",
            0x300 => "Internal Path Error",
            0x301 => "Asymmetric Access Persistent Loss",
            0x302 => "Asymmetric Access Inaccessible",
            0x303 => "Asymmetric Access Transition",
            0x360 => "Controller Pathing Error",
            0x370 => "Host Pathing Error",
            0x371 => "Command Aborted By Host",
            c if c >> 8 == Self::SCT_VENDOR as u16 => "Vendor Specific",
            _ => return None,
        })
    }

    /// Whether the status is a media or data integrity error (SCT 0x2).
    pub const fn is_media_error(self) -> bool {
        self.sct() == Self::SCT_MEDIA
    }

    /// Whether the controller failed to move the data to or from the
    /// command's data pointer, or refused the pointer's shape, rather than
    /// anything about the blocks: Data Transfer Error and the PRP, SGL and
    /// controller-memory-buffer codes. With accelerator memory as the data
    /// pointer that is the P2P route failing (a peer the controller's
    /// requests do not reach), which staging through host memory avoids.
    pub const fn concerns_data_pointer(self) -> bool {
        matches!(
            self.code(),
            0x004 | 0x00d | 0x00e | 0x00f | 0x011 | 0x012 | 0x013 | 0x016 | 0x01e
        )
    }

    /// The errno the kernel's block layer gives a request that completes
    /// with this status (`nvme_error_status`, then `blk_status_to_errno`):
    /// `ENODATA` for a medium error, `EILSEQ` for protection information,
    /// `ENOSPC`, `EREMOTEIO`, `EOPNOTSUPP`, `EBADE`, `ENOLINK`, and `EIO`
    /// for the rest.
    pub const fn errno(self) -> Errno {
        match self.code() {
            0x081 => Errno::NOSPC,
            0x080 | 0x021 | 0x082 => Errno::REMOTEIO,
            0x001 | 0x002 | 0x00b | 0x180 => Errno::OPNOTSUPP,
            0x280 | 0x281 | 0x285 | 0x286 | 0x287 | 0x182 => Errno::NODATA,
            0x282 | 0x283 | 0x284 | 0x181 => Errno::ILSEQ,
            0x083 => Errno::BADE,
            0x370 => Errno::NOLINK,
            0x1bd => Errno::OVERFLOW,
            0x1be => Errno::TOOMANYREFS,
            _ => Errno::IO,
        }
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name().unwrap_or("unknown status");
        write!(f, "{name} (SCT {:#x}, SC {:#x}", self.sct(), self.sc())?;
        if self.dnr() {
            f.write_str(", do not retry")?;
        }
        f.write_str(")")
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that `offset..offset + len` lies inside `size` bytes, as every
/// copy into or out of memory of that size must.
pub fn check_range(offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfBounds {
            offset: offset as u64,
            len: len as u64,
            size: size as u64,
        }),
    }
}

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

    fn io(source: Errno) -> Error {
        Error::Io {
            op: "P2P read",
            path: "/dev/nvme0n1".into(),
            offset: 4096,
            len: 4096,
            source,
            member: None,
        }
    }

    fn nvme(status: u32) -> Error {
        Error::NvmeStatus {
            op: "NVMe read",
            offset: 1 << 20,
            len: 65536,
            status,
        }
    }

    #[test]
    fn bounce_fixes_refused_p2p_and_passthrough_only() {
        let fixable = [
            Errno::REMOTEIO,
            Errno::INVAL,
            Errno::OPNOTSUPP,
            Errno::ACCESS,
            Errno::PERM,
            Errno::NOENT,
            Errno::NXIO,
            Errno::NODEV,
            Errno::NOTTY,
        ];
        let not_fixable = [
            Errno::NODATA,
            Errno::IO,
            Errno::ILSEQ,
            Errno::TIMEDOUT,
            Errno::NOLINK,
            Errno::BADE,
            Errno::INTR,
            Errno::NOSPC,
            Errno::DQUOT,
            Errno::FBIG,
            Errno::ROFS,
            Errno::FAULT,
            Errno::NOMEM,
            Errno::AGAIN,
            Errno::BUSY,
            Errno::BADF,
            Errno::CANCELED,
        ];
        for (errnos, want) in [(&fixable[..], true), (&not_fixable[..], false)] {
            for &errno in errnos {
                assert_eq!(io(errno).bounce_can_fix(), want, "Io {errno:?}");
                let sys = Error::sys("io_uring_setup (128-byte entries)")(errno);
                assert_eq!(sys.bounce_can_fix(), want, "Sys {errno:?}");
                let open = Error::Open {
                    path: "/dev/ng0n1".into(),
                    source: errno,
                };
                assert_eq!(open.bounce_can_fix(), want, "Open {errno:?}");
            }
        }

        let unavailable = Error::PathUnavailable {
            path: "nvme-cmd",
            reason: "not on an NVMe namespace".into(),
        };
        assert!(unavailable.bounce_can_fix());

        // Statuses about the blocks stay failures; those about the data
        // pointer (the route to the accelerator's memory) do not.
        for status in [
            0x281, 0x4281, 0x280, 0x287, 0x282, 0x080, 0x002, 0x006, 0x371,
        ] {
            assert!(!nvme(status).bounce_can_fix(), "status {status:#x}");
        }
        for status in [0x004, 0x4004, 0x00d, 0x00f, 0x012, 0x013, 0x016] {
            assert!(nvme(status).bounce_can_fix(), "status {status:#x}");
        }

        let short = Error::Short {
            what: "P2P read from storage",
            expected: 4096,
            done: 512,
        };
        let eof = Error::EndOfFile {
            path: "/data/f".into(),
            offset: 10,
            len: 20,
            size: 15,
        };
        let others = [
            short,
            eof,
            Error::InvalidArgument("x".into()),
            Error::OutOfBounds {
                offset: 0,
                len: 1,
                size: 0,
            },
            Error::Panicked("boom".into()),
            Error::AbiMismatch {
                module: 9,
                library: 1,
                library_min: 1,
            },
        ];
        for e in others {
            assert!(!e.bounce_can_fix(), "{e:?}");
        }
    }

    #[test]
    fn nvme_statuses_read_in_words_and_keep_their_value() {
        let s = NvmeStatus::from_raw(0x281);
        assert_eq!(s.to_string(), "Unrecovered Read Error (SCT 0x2, SC 0x81)");
        assert_eq!((s.sct(), s.sc(), s.raw()), (2, 0x81, 0x281));
        assert!(s.is_media_error() && !s.dnr() && !s.more() && s.crd() == 0);

        // Do Not Retry, More and a retry delay around a write fault.
        let s = NvmeStatus::from_raw(0x7a80);
        assert_eq!((s.sct(), s.sc(), s.crd()), (2, 0x80, 3));
        assert!(s.dnr() && s.more());
        assert_eq!(
            s.to_string(),
            "Write Fault (SCT 0x2, SC 0x80, do not retry)"
        );

        assert_eq!(
            NvmeStatus::from_raw(0x004).to_string(),
            "Data Transfer Error (SCT 0x0, SC 0x4)"
        );
        assert_eq!(
            NvmeStatus::from_raw(0x1b9).to_string(),
            "Zone Is Full (SCT 0x1, SC 0xb9)"
        );
        assert_eq!(
            NvmeStatus::from_raw(0x7c0).to_string(),
            "Vendor Specific (SCT 0x7, SC 0xc0)"
        );
        assert_eq!(
            NvmeStatus::from_raw(0x1ff).to_string(),
            "unknown status (SCT 0x1, SC 0xff)"
        );
        assert_eq!(NvmeStatus::from_raw(0x5ff).name(), None);

        let e = nvme(0x4281);
        assert_eq!(e.nvme_status().map(NvmeStatus::raw), Some(0x4281));
        assert_eq!(
            e.to_string(),
            "NVMe read of 65536 bytes at offset 1048576 failed: NVMe status \
             Unrecovered Read Error (SCT 0x2, SC 0x81, do not retry)"
        );
        assert_eq!(io(Errno::NODATA).nvme_status(), None);
    }

    #[test]
    fn nvme_statuses_have_the_block_layers_errno() {
        // drivers/nvme/host/core.c nvme_error_status, then the errno of
        // each blk_status_t (block/blk-core.c), so that a medium error is
        // ENODATA on the NVMe-command path as on the P2P and bounce paths.
        let table = [
            (0x281, Errno::NODATA),
            (0x4281, Errno::NODATA),
            (0x280, Errno::NODATA),
            (0x287, Errno::NODATA),
            (0x286, Errno::NODATA),
            (0x285, Errno::NODATA),
            (0x182, Errno::NODATA),
            (0x282, Errno::ILSEQ),
            (0x283, Errno::ILSEQ),
            (0x284, Errno::ILSEQ),
            (0x181, Errno::ILSEQ),
            (0x081, Errno::NOSPC),
            (0x080, Errno::REMOTEIO),
            (0x021, Errno::REMOTEIO),
            (0x082, Errno::REMOTEIO),
            (0x001, Errno::OPNOTSUPP),
            (0x002, Errno::OPNOTSUPP),
            (0x00b, Errno::OPNOTSUPP),
            (0x180, Errno::OPNOTSUPP),
            (0x083, Errno::BADE),
            (0x370, Errno::NOLINK),
            (0x1bd, Errno::OVERFLOW),
            (0x1be, Errno::TOOMANYREFS),
            (0x004, Errno::IO),
            (0x006, Errno::IO),
            (0x288, Errno::IO),
            (0x7c0, Errno::IO),
        ];
        for (status, errno) in table {
            assert_eq!(nvme(status).errno(), Some(errno), "status {status:#x}");
        }
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(0, 4096, 4096).is_ok());
        assert!(check_range(4096, 0, 4096).is_ok());
        assert!(check_range(4095, 1, 4096).is_ok());
        assert!(check_range(4095, 2, 4096).is_err());
        assert!(check_range(4097, 0, 4096).is_err());
        assert!(check_range(usize::MAX, 2, 4096).is_err());
        match check_range(1, usize::MAX, 10) {
            Err(Error::OutOfBounds { offset, len, size }) => {
                assert_eq!((offset, len, size), (1, usize::MAX as u64, 10))
            }
            other => panic!("{other:?}"),
        }
    }
}
