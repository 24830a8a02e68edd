//! Where a file's bytes lie on its block device, for the NVMe-command path.
//!
//! `map` asks the filesystem with `FS_IOC_FIEMAP` (with
//! `FIEMAP_FLAG_SYNC`, so dirty page-cache data is written back and delayed
//! allocations are resolved first) and turns the answer into `Segment`s
//! that cover the asked range exactly: runs of bytes at a device offset, and
//! runs that read as zeros (holes and unwritten extents).
//!
//! Only ext4 and XFS are accepted (`Filesystem::of`): their FIEMAP
//! physical offsets are byte offsets on the block device and they overwrite
//! blocks in place. Btrfs reports addresses in its own logical space and
//! checksums and copies on write; others make no such promise. Anything the
//! filesystem marks as not plainly addressable (unknown location, delayed
//! allocation, encoded, encrypted, inline, packed tails, unaligned) is
//! refused, as is any block not aligned to the namespace's logical block.
//! Writes are held to more: they may only overwrite blocks the file owns
//! alone and has written, inside its size; holes, unwritten and shared
//! (reflinked) extents and ranges past the end are refused.
//!
//! Refusals are reason strings; the NVMe-command path turns them into
//! `Error::PathUnavailable`, which the engine retries on the bounce path.
//! The mapping math (`plan`) is a pure function, tested without a device.

use std::{fmt, os::fd::BorrowedFd};

use rustix::io::Errno;

use crate::sys::file::{self as raw, EXTENTS_PER_CALL};

/// A run of the file inside the mapped range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    /// `len` bytes at `file_offset` lie at byte `dev_offset` of the namespace.
    Mapped {
        /// Offset in the file.
        file_offset: u64,
        /// Byte offset on the NVMe namespace (partition start included).
        dev_offset: u64,
        /// Bytes.
        len: u64,
    },
    /// `len` bytes at `file_offset` read as zeros (a hole or an unwritten
    /// extent): nothing to read from the device.
    Zero {
        /// Offset in the file.
        file_offset: u64,
        /// Bytes.
        len: u64,
    },
}

#[cfg(test)]
impl Segment {
    /// Offset in the file.
    pub(crate) fn file_offset(&self) -> u64 {
        match *self {
            Segment::Mapped { file_offset, .. } | Segment::Zero { file_offset, .. } => file_offset,
        }
    }

    /// Bytes.
    pub(crate) fn len(&self) -> u64 {
        match *self {
            Segment::Mapped { len, .. } | Segment::Zero { len, .. } => len,
        }
    }
}

/// One extent as FIEMAP reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Offset in the file.
    pub(crate) logical: u64,
    /// Byte offset on the filesystem's block device.
    pub(crate) physical: u64,
    /// Bytes.
    pub(crate) len: u64,
    /// `FIEMAP_EXTENT_*`.
    pub(crate) flags: u32,
}

/// `FIEMAP_FLAG_SYNC`: write dirty data back before mapping.
const FIEMAP_FLAG_SYNC: u32 = 0x1;

/// `FIEMAP_EXTENT_*` (include/uapi/linux/fiemap.h).
const EXTENT_LAST: u32 = 0x1;
const EXTENT_UNKNOWN: u32 = 0x2;
const EXTENT_DELALLOC: u32 = 0x4;
const EXTENT_ENCODED: u32 = 0x8;
const EXTENT_DATA_ENCRYPTED: u32 = 0x80;
const EXTENT_NOT_ALIGNED: u32 = 0x100;
const EXTENT_DATA_INLINE: u32 = 0x200;
const EXTENT_DATA_TAIL: u32 = 0x400;
const EXTENT_UNWRITTEN: u32 = 0x800;
const EXTENT_MERGED: u32 = 0x1000;
const EXTENT_SHARED: u32 = 0x2000;

/// Flags that make an extent unusable for NVMe commands, and why; the
/// specific ones first (the kernel sets `UNKNOWN` with `DELALLOC`,
/// `ENCODED` with `DATA_ENCRYPTED`, `NOT_ALIGNED` with `DATA_INLINE` and
/// `DATA_TAIL`).
const REFUSED: &[(u32, &str)] = &[
    (
        EXTENT_DELALLOC,
        "not allocated yet (FIEMAP_EXTENT_DELALLOC)",
    ),
    (
        EXTENT_DATA_ENCRYPTED,
        "encrypted (FIEMAP_EXTENT_DATA_ENCRYPTED)",
    ),
    (
        EXTENT_DATA_INLINE,
        "stored inline with metadata (FIEMAP_EXTENT_DATA_INLINE)",
    ),
    (
        EXTENT_DATA_TAIL,
        "a tail packed with other files' (FIEMAP_EXTENT_DATA_TAIL)",
    ),
    (
        EXTENT_ENCODED,
        "encoded, e.g. compressed (FIEMAP_EXTENT_ENCODED)",
    ),
    (
        EXTENT_NOT_ALIGNED,
        "not block aligned (FIEMAP_EXTENT_NOT_ALIGNED)",
    ),
    (
        EXTENT_UNKNOWN,
        "at an unknown location (FIEMAP_EXTENT_UNKNOWN)",
    ),
];

/// Flags an extent may carry and still be used (with the rules of
/// [`classify`]).
const ALLOWED: u32 = EXTENT_LAST | EXTENT_UNWRITTEN | EXTENT_MERGED | EXTENT_SHARED;

/// What an extent's data is, for a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Written data at its physical offset.
    Data,
    /// Allocated but unwritten: reads as zeros.
    Unwritten,
}

/// Classifies an extent by its `FIEMAP_EXTENT_*` flags, for a read or (with
/// `write`) a write.
fn classify(flags: u32, write: bool) -> Result<Kind, String> {
    if let Some((_, why)) = REFUSED.iter().find(|(bit, _)| flags & bit != 0) {
        return Err(format!("it is {why}"));
    }
    if flags & !ALLOWED != 0 {
        return Err(format!(
            "it carries FIEMAP flags {:#x} this library does not know",
            flags & !ALLOWED
        ));
    }
    if write && flags & EXTENT_SHARED != 0 {
        return Err("it is shared with another file (FIEMAP_EXTENT_SHARED, a reflink): overwriting it in place would change the other file too".into());
    }
    if flags & EXTENT_UNWRITTEN != 0 {
        if write {
            return Err("it is allocated but unwritten (FIEMAP_EXTENT_UNWRITTEN): a write there must go through the filesystem, which marks it written".into());
        }
        return Ok(Kind::Unwritten);
    }
    Ok(Kind::Data)
}

/// Appends `s`, merging it into the last segment when they are contiguous
/// in the file and (for mapped runs) on the device.
fn push_merged(out: &mut Vec<Segment>, s: Segment) {
    match (out.last_mut(), s) {
        (
            Some(Segment::Mapped {
                file_offset: f,
                dev_offset: d,
                len: l,
            }),
            Segment::Mapped {
                file_offset,
                dev_offset,
                len,
            },
        ) if *f + *l == file_offset && *d + *l == dev_offset => *l += len,
        (
            Some(Segment::Zero {
                file_offset: f,
                len: l,
            }),
            Segment::Zero { file_offset, len },
        ) if *f + *l == file_offset => *l += len,
        _ => out.push(s),
    }
}

/// Where `[start, end)` of a file lies, from its extents (in file order):
/// clipped to the range, holes filled in, `dev_start` (the partition's
/// start on the namespace) added, contiguous runs merged. `eof` is the
/// file's size and `lba` the namespace's logical block size.
pub(crate) fn plan(
    extents: &[Extent],
    start: u64,
    end: u64,
    eof: u64,
    dev_start: u64,
    lba: u64,
    write: bool,
) -> Result<Vec<Segment>, String> {
    if start > end || lba == 0 || !lba.is_power_of_two() {
        return Err(format!("bad range [{start}, {end}) or block size {lba}"));
    }
    if write && end > eof {
        return Err(format!(
            "bytes [{start}, {end}) run past the end of the file ({eof} bytes): NVMe writes may only overwrite blocks the file already has"
        ));
    }
    let mut out = Vec::new();
    let mut at = start;
    let mut prev_end = 0u64;
    let hole = |out: &mut Vec<Segment>, from: u64, to: u64| {
        if write {
            return Err(format!(
                "bytes [{from}, {to}) are a hole: a write there must go through the filesystem, which allocates the blocks"
            ));
        }
        push_merged(
            out,
            Segment::Zero {
                file_offset: from,
                len: to - from,
            },
        );
        Ok(())
    };
    for e in extents {
        let e_end = e
            .logical
            .checked_add(e.len)
            .ok_or_else(|| format!("the extent at file offset {} overflows", e.logical))?;
        if e.logical < prev_end {
            return Err(format!(
                "FIEMAP gave overlapping or unordered extents (one at file offset {} after one ending at {prev_end})",
                e.logical
            ));
        }
        prev_end = e_end;
        let (s, t) = (e.logical.max(start), e_end.min(end));
        if s >= t {
            if e.logical >= end {
                break;
            }
            continue;
        }
        let refuse = |why: String| {
            format!(
                "the extent at file offset {} cannot be used: {why}",
                e.logical
            )
        };
        if s > at {
            hole(&mut out, at, s)?;
        }
        match classify(e.flags, write).map_err(refuse)? {
            Kind::Unwritten => push_merged(
                &mut out,
                Segment::Zero {
                    file_offset: s,
                    len: t - s,
                },
            ),
            Kind::Data => {
                let dev = (e.physical)
                    .checked_add(s - e.logical)
                    .and_then(|p| p.checked_add(dev_start))
                    .filter(|d| d.checked_add(t - s).is_some())
                    .ok_or_else(|| refuse("its device offset overflows".into()))?;
                if dev % lba != 0 || (t - s) % lba != 0 {
                    return Err(refuse(format!(
                        "bytes [{s}, {t}) lie at device byte {dev}, not in whole {lba}-byte logical blocks"
                    )));
                }
                push_merged(
                    &mut out,
                    Segment::Mapped {
                        file_offset: s,
                        dev_offset: dev,
                        len: t - s,
                    },
                );
            }
        }
        at = t;
    }
    if at < end {
        hole(&mut out, at, end)?;
    }
    Ok(out)
}

/// The one segment of `[start, end)` of a block device that starts at byte
/// `dev_start` of the namespace (0 for the whole namespace).
pub(crate) fn device_range(
    start: u64,
    end: u64,
    dev_start: u64,
    lba: u64,
) -> Result<Vec<Segment>, String> {
    let extent = Extent {
        logical: start,
        physical: start,
        len: end.saturating_sub(start),
        flags: 0,
    };
    plan(&[extent], start, end, end, dev_start, lba, false)
}

/// Writes back (and waits for) the dirty page-cache pages of `[offset,
/// offset + len)` of `fd`: what a block device's page cache holds that the
/// device does not have yet, which NVMe commands would not see (reads) or
/// would have written over them later (writes).
pub(crate) fn write_back(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
    raw::write_back(fd, offset, len)
}

/// A filesystem the NVMe-command path can address files on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Filesystem {
    /// ext4 (also serving ext2 and ext3).
    Ext4,
    /// XFS.
    Xfs,
}

impl fmt::Display for Filesystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Filesystem::Ext4 => "ext4",
            Filesystem::Xfs => "XFS",
        })
    }
}

const EXT4_SUPER_MAGIC: u32 = 0xEF53;
const XFS_SUPER_MAGIC: u32 = 0x5846_5342;
const BTRFS_SUPER_MAGIC: u32 = 0x9123_683E;
const TMPFS_MAGIC: u32 = 0x0102_1994;
const OVERLAYFS_SUPER_MAGIC: u32 = 0x794C_7630;
const F2FS_SUPER_MAGIC: u32 = 0xF2F5_2010;
const ZFS_SUPER_MAGIC: u32 = 0x2FC1_2FC1;
const BCACHEFS_SUPER_MAGIC: u32 = 0xCA45_1A4E;
const NFS_SUPER_MAGIC: u32 = 0x6969;

impl Filesystem {
    /// The filesystem of the open file `fd`, if the NVMe-command path can
    /// address files on it; otherwise why not.
    pub(crate) fn of(fd: BorrowedFd<'_>) -> Result<Self, String> {
        let st = rustix::fs::fstatfs(fd).map_err(|e| format!("fstatfs failed: {e}"))?;
        let magic = st.f_type as u32;
        let fs = match magic {
            EXT4_SUPER_MAGIC => Filesystem::Ext4,
            XFS_SUPER_MAGIC => Filesystem::Xfs,
            BTRFS_SUPER_MAGIC => {
                return Err("the file is on btrfs, whose FIEMAP offsets are addresses in its own logical space (not device offsets) and whose data is checksummed and copied on write, so NVMe commands can neither find nor overwrite it in place".into())
            }
            other => {
                let name = match other {
                    TMPFS_MAGIC => "tmpfs".to_string(),
                    OVERLAYFS_SUPER_MAGIC => "overlayfs".to_string(),
                    F2FS_SUPER_MAGIC => "f2fs".to_string(),
                    ZFS_SUPER_MAGIC => "ZFS".to_string(),
                    BCACHEFS_SUPER_MAGIC => "bcachefs".to_string(),
                    NFS_SUPER_MAGIC => "NFS".to_string(),
                    m => format!("a filesystem with magic {m:#x}"),
                };
                return Err(format!(
                    "the file is on {name}; only ext4 and XFS report FIEMAP offsets as device byte offsets and overwrite data in place"
                ));
            }
        };
        if fs == Filesystem::Ext4 {
            let st = rustix::fs::fstat(fd).map_err(|e| format!("fstat failed: {e}"))?;
            let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            if journals_data(&mounts, major, minor) {
                return Err("the ext4 filesystem is mounted with data=journal: data goes through the journal and is checkpointed in place later, which would undo NVMe writes and hide recent data from NVMe reads".into());
            }
        }
        Ok(fs)
    }
}

/// Whether `/proc/self/mountinfo` text shows the filesystem on device
/// `major:minor` mounted with `data=journal`.
fn journals_data(mountinfo: &str, major: u32, minor: u32) -> bool {
    let dev = format!("{major}:{minor}");
    mountinfo.lines().any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(sep) = f.iter().position(|&x| x == "-") else {
            return false;
        };
        f.get(2) == Some(&dev.as_str())
            && f.get(sep + 3)
                .is_some_and(|opts| opts.split(',').any(|o| o == "data=journal"))
    })
}

/// Inode flags (`FS_*_FL`) that rule a file out, and why.
const INODE_REFUSED: &[(u32, &str)] = &[
    (0x0000_4000, "has its data journalled (FS_JOURNAL_DATA_FL): the journal checkpoints old data over the blocks later"),
    (0x0000_0800, "is encrypted (FS_ENCRYPT_FL): the blocks hold ciphertext"),
    (0x1000_0000, "keeps its data inline in the inode (FS_INLINE_DATA_FL)"),
    (0x0010_0000, "is an fs-verity file (FS_VERITY_FL): its data must be verified by the filesystem as it is read"),
];

/// `FS_XFLAG_REALTIME`.
const XFLAG_REALTIME: u32 = 0x1;

/// Checks the file's own flags, which can change while it is open.
fn check_inode(fd: BorrowedFd<'_>, fs: Filesystem) -> Result<(), String> {
    match rustix::fs::ioctl_getflags(fd) {
        Ok(flags) => {
            if let Some((_, why)) = INODE_REFUSED
                .iter()
                .find(|(bit, _)| flags.bits() & bit != 0)
            {
                return Err(format!("the file {why}"));
            }
        }
        Err(Errno::NOTTY | Errno::OPNOTSUPP | Errno::INVAL) => {}
        Err(e) => return Err(format!("FS_IOC_GETFLAGS failed: {e}")),
    }
    if fs == Filesystem::Xfs {
        let xflags =
            raw::fsgetxattr_xflags(fd).map_err(|e| format!("FS_IOC_FSGETXATTR failed: {e}"))?;
        if xflags & XFLAG_REALTIME != 0 {
            return Err("the file is on XFS's realtime device (FS_XFLAG_REALTIME), whose offsets FIEMAP does not give as offsets on the data device".into());
        }
    }
    Ok(())
}

/// The file's extents that meet `[start, end)`, in file order, after the
/// filesystem wrote dirty data back (`sync`: `FIEMAP_FLAG_SYNC`). FIEMAP is
/// called until the range is covered or the file's last extent is seen.
pub(crate) fn fiemap(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    sync: bool,
) -> Result<Vec<Extent>, Errno> {
    let mut buf = Box::new(raw::FiemapBuf::default());
    let mut out = Vec::new();
    let mut at = start;
    let mut flags = if sync { FIEMAP_FLAG_SYNC } else { 0 };
    while at < end {
        buf.head.fm_start = at;
        buf.head.fm_length = end - at;
        buf.head.fm_flags = flags;
        buf.head.fm_mapped_extents = 0;
        raw::fiemap(fd, &mut buf)?;
        // The first call wrote everything back; the rest only map.
        flags = 0;
        let n = (buf.head.fm_mapped_extents as usize).min(EXTENTS_PER_CALL);
        if n == 0 {
            break;
        }
        for e in &buf.extents[..n] {
            out.push(Extent {
                logical: e.fe_logical,
                physical: e.fe_physical,
                len: e.fe_length,
                flags: e.fe_flags,
            });
        }
        let last = &buf.extents[n - 1];
        let last_end = last.fe_logical.saturating_add(last.fe_length);
        if last.fe_flags & EXTENT_LAST != 0 || last_end >= end {
            break;
        }
        if last_end <= at {
            // No progress: the filesystem answered nonsense.
            return Err(Errno::IO);
        }
        at = last_end;
    }
    Ok(out)
}

/// Where `[start, end)` of the regular file `fd` (on `fs`, whose block
/// device starts at byte `dev_start` of an NVMe namespace with `lba`-byte
/// logical blocks) lies on the namespace, for a read or (`write`) a write;
/// or why NVMe commands cannot move it.
pub(crate) fn map(
    fd: BorrowedFd<'_>,
    fs: Filesystem,
    start: u64,
    end: u64,
    dev_start: u64,
    lba: u64,
    write: bool,
) -> Result<Vec<Segment>, String> {
    check_inode(fd, fs)?;
    let extents = fiemap(fd, start, end, true).map_err(|e| match e {
        Errno::OPNOTSUPP | Errno::NOTTY => "the filesystem does not support FIEMAP".to_string(),
        e => format!("FS_IOC_FIEMAP failed: {e}"),
    })?;
    // The size after the sync: a write may only overwrite what is inside it.
    let eof = rustix::fs::fstat(fd)
        .map_err(|e| format!("fstat failed: {e}"))?
        .st_size as u64;
    plan(&extents, start, end, eof, dev_start, lba, write)
}

/// Whether the read just done through `segments` (the map of `[start,
/// end)` that [`map`] gave) read the file's own blocks: the file is mapped
/// again, without writing anything back, and must map the same. A
/// truncate, hole punch, defragmentation or reflink during the read changes
/// the map, and the blocks read may by then have been another file's.
pub(crate) fn still_mapped(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    dev_start: u64,
    lba: u64,
    segments: &[Segment],
) -> Result<(), String> {
    let extents =
        fiemap(fd, start, end, false).map_err(|e| format!("FS_IOC_FIEMAP failed: {e}"))?;
    let eof = rustix::fs::fstat(fd)
        .map_err(|e| format!("fstat failed: {e}"))?
        .st_size as u64;
    match plan(&extents, start, end, eof, dev_start, lba, false) {
        Ok(now) if now == segments => Ok(()),
        Ok(_) => Err("its extents changed while the commands ran (truncated, hole-punched, defragmented or reflinked?)".into()),
        Err(why) => Err(format!("its extents changed while the commands ran: {why}")),
    }
}

/// Pages of `[offset, offset + len)` of `fd` in the page cache.
pub(crate) fn resident_pages(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<usize, Errno> {
    raw::resident_pages(fd, offset, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: u64 = 4096;

    fn ext(logical: u64, physical: u64, len: u64, flags: u32) -> Extent {
        Extent {
            logical,
            physical,
            len,
            flags,
        }
    }

    fn mapped(file_offset: u64, dev_offset: u64, len: u64) -> Segment {
        Segment::Mapped {
            file_offset,
            dev_offset,
            len,
        }
    }

    fn zero(file_offset: u64, len: u64) -> Segment {
        Segment::Zero { file_offset, len }
    }

    #[test]
    fn flags_classify_for_reads_and_writes() {
        assert_eq!(classify(0, false), Ok(Kind::Data));
        assert_eq!(classify(EXTENT_LAST | EXTENT_MERGED, true), Ok(Kind::Data));
        assert_eq!(classify(EXTENT_UNWRITTEN, false), Ok(Kind::Unwritten));
        assert!(classify(EXTENT_UNWRITTEN, true)
            .unwrap_err()
            .contains("unwritten"));
        assert_eq!(classify(EXTENT_SHARED, false), Ok(Kind::Data));
        assert!(classify(EXTENT_SHARED, true)
            .unwrap_err()
            .contains("reflink"));
        for &(bit, name) in &[
            (EXTENT_UNKNOWN, "UNKNOWN"),
            (EXTENT_DELALLOC, "DELALLOC"),
            (EXTENT_ENCODED, "ENCODED"),
            (EXTENT_DATA_ENCRYPTED, "ENCRYPTED"),
            (EXTENT_NOT_ALIGNED, "NOT_ALIGNED"),
            (EXTENT_DATA_INLINE, "INLINE"),
            (EXTENT_DATA_TAIL, "TAIL"),
        ] {
            for write in [false, true] {
                let e = classify(bit | EXTENT_LAST, write).unwrap_err();
                assert!(e.contains(name), "{e}");
            }
        }
        // The combinations the kernel reports name the specific flag.
        for &(flags, name) in &[
            (EXTENT_DELALLOC | EXTENT_UNKNOWN, "DELALLOC"),
            (EXTENT_DATA_ENCRYPTED | EXTENT_ENCODED, "ENCRYPTED"),
            (EXTENT_DATA_INLINE | EXTENT_NOT_ALIGNED, "INLINE"),
            (EXTENT_DATA_TAIL | EXTENT_NOT_ALIGNED, "TAIL"),
        ] {
            let e = classify(flags, false).unwrap_err();
            assert!(e.contains(name), "{e}");
        }
        // A flag from a newer kernel is not guessed at.
        assert!(classify(0x40, false).unwrap_err().contains("0x40"));
    }

    #[test]
    fn extents_are_clipped_to_the_range_and_translated_by_the_partition_start() {
        let e = [ext(0, 1 << 20, 64 * L, EXTENT_LAST)];
        let p = plan(&e, 8 * L, 16 * L, 64 * L, 2048 * 512, 512, false).unwrap();
        assert_eq!(
            p,
            vec![mapped(8 * L, (1 << 20) + 8 * L + 2048 * 512, 8 * L)]
        );
        let p = plan(&e, 8 * L, 16 * L, 64 * L, 0, 512, true).unwrap();
        assert_eq!(p, vec![mapped(8 * L, (1 << 20) + 8 * L, 8 * L)]);
    }

    #[test]
    fn physically_contiguous_neighbours_merge_and_others_do_not() {
        let e = [
            ext(0, 100 * L, 4 * L, 0),
            ext(4 * L, 104 * L, 4 * L, 0),
            ext(8 * L, 300 * L, 4 * L, 0),
            ext(12 * L, 304 * L, 4 * L, EXTENT_LAST),
        ];
        let p = plan(&e, 0, 16 * L, 16 * L, 0, L, false).unwrap();
        assert_eq!(
            p,
            vec![mapped(0, 100 * L, 8 * L), mapped(8 * L, 300 * L, 8 * L)]
        );
        // Adjacent in the file, not on the device: two commands' worth.
        let e = [ext(0, 100 * L, 4 * L, 0), ext(4 * L, 50 * L, 4 * L, 0)];
        let p = plan(&e, 0, 8 * L, 8 * L, 0, L, false).unwrap();
        assert_eq!(
            p,
            vec![mapped(0, 100 * L, 4 * L), mapped(4 * L, 50 * L, 4 * L)]
        );
    }

    #[test]
    fn holes_and_unwritten_extents_read_as_zeros_and_refuse_writes() {
        // Hole, data, unwritten, data, hole at the end.
        let e = [
            ext(2 * L, 10 * L, 2 * L, 0),
            ext(4 * L, 12 * L, 2 * L, EXTENT_UNWRITTEN),
            ext(6 * L, 14 * L, 2 * L, EXTENT_LAST),
        ];
        let p = plan(&e, 0, 10 * L, 10 * L, 0, L, false).unwrap();
        assert_eq!(
            p,
            vec![
                zero(0, 2 * L),
                mapped(2 * L, 10 * L, 2 * L),
                zero(4 * L, 2 * L),
                mapped(6 * L, 14 * L, 2 * L),
                zero(8 * L, 2 * L),
            ]
        );
        // The segments cover the range exactly, in order.
        let mut at = 0;
        for s in &p {
            assert_eq!(s.file_offset(), at);
            at += s.len();
        }
        assert_eq!(at, 10 * L);
        assert!(plan(&e, 0, 10 * L, 10 * L, 0, L, true)
            .unwrap_err()
            .contains("hole"));
        assert!(plan(&e, 2 * L, 6 * L, 10 * L, 0, L, true)
            .unwrap_err()
            .contains("unwritten"));
        assert!(plan(&e, 6 * L, 8 * L, 10 * L, 0, L, true).is_ok());
        // A hole next to an unwritten extent is one zero run.
        let e = [ext(2 * L, 10 * L, 2 * L, EXTENT_UNWRITTEN | EXTENT_LAST)];
        assert_eq!(
            plan(&e, 0, 4 * L, 4 * L, 0, L, false).unwrap(),
            vec![zero(0, 4 * L)]
        );
        // No extents at all: one hole.
        assert_eq!(
            plan(&[], L, 3 * L, 4 * L, 0, L, false).unwrap(),
            vec![zero(L, 2 * L)]
        );
    }

    #[test]
    fn writes_refuse_shared_extents_and_the_end_of_the_file() {
        let e = [ext(0, 10 * L, 8 * L, EXTENT_SHARED | EXTENT_LAST)];
        assert!(plan(&e, 0, 4 * L, 8 * L, 0, L, false).is_ok());
        assert!(plan(&e, 0, 4 * L, 8 * L, 0, L, true)
            .unwrap_err()
            .contains("reflink"));
        // Blocks allocated past the size (preallocation) are not the file's
        // data: writing there would not grow the file.
        let e = [ext(0, 10 * L, 8 * L, EXTENT_LAST)];
        assert!(plan(&e, 0, 8 * L, 6 * L, 0, L, true)
            .unwrap_err()
            .contains("past the end"));
        assert!(plan(&e, 0, 6 * L, 6 * L, 0, L, true).is_ok());
    }

    #[test]
    fn misaligned_physical_offsets_and_bad_maps_are_refused() {
        let e = [ext(0, 10 * L + 512, 8 * L, EXTENT_LAST)];
        assert!(plan(&e, 0, 8 * L, 8 * L, 0, L, false)
            .unwrap_err()
            .contains("logical blocks"));
        assert!(plan(&e, 0, 8 * L, 8 * L, 0, 512, false).is_ok());
        // A partition start that is not block aligned for this namespace.
        let e = [ext(0, 10 * L, 8 * L, EXTENT_LAST)];
        assert!(plan(&e, 0, 8 * L, 8 * L, 512, L, false).is_err());
        // Overlapping or unordered extents.
        let e = [
            ext(0, 10 * L, 4 * L, 0),
            ext(2 * L, 20 * L, 4 * L, EXTENT_LAST),
        ];
        assert!(plan(&e, 0, 6 * L, 6 * L, 0, L, false)
            .unwrap_err()
            .contains("overlapping"));
        // Overflow.
        let e = [ext(0, u64::MAX - 2 * L + 1, 8 * L, EXTENT_LAST)];
        assert!(plan(&e, 0, 8 * L, 8 * L, 0, 1, false)
            .unwrap_err()
            .contains("overflows"));
        let e = [ext(0, u64::MAX - 8 * L + 1, 8 * L, EXTENT_LAST)];
        assert!(plan(&e, 0, 8 * L, 8 * L, 0, 1, false)
            .unwrap_err()
            .contains("overflows"));
        let e = [ext(0, 0, 8 * L, EXTENT_LAST)];
        assert!(plan(&e, 0, 8 * L, 8 * L, u64::MAX, 1, false)
            .unwrap_err()
            .contains("overflows"));
        let e = [ext(u64::MAX - L, 0, 8 * L, EXTENT_LAST)];
        assert!(plan(&e, 0, 8 * L, 8 * L, 0, L, false)
            .unwrap_err()
            .contains("overflows"));
        assert!(plan(&[], 8, 4, 8, 0, L, false).is_err());
    }

    #[test]
    fn extents_outside_the_range_are_ignored() {
        let e = [
            ext(0, 10 * L, 2 * L, 0),
            ext(2 * L, 40 * L, 2 * L, EXTENT_DELALLOC),
            ext(4 * L, 80 * L, 2 * L, 0),
            ext(6 * L, 0, 2 * L, EXTENT_UNKNOWN | EXTENT_LAST),
        ];
        // Only the extent at 4 L is in range; the unusable ones are not.
        assert_eq!(
            plan(&e, 4 * L, 6 * L, 8 * L, 0, L, true).unwrap(),
            vec![mapped(4 * L, 80 * L, 2 * L)]
        );
        assert!(plan(&e, 3 * L, 6 * L, 8 * L, 0, L, false)
            .unwrap_err()
            .contains("DELALLOC"));
    }

    #[test]
    fn a_block_device_range_is_one_segment() {
        assert_eq!(
            device_range(8 * L, 24 * L, 2048 * 512, 512).unwrap(),
            vec![mapped(8 * L, 8 * L + 2048 * 512, 16 * L)]
        );
        assert_eq!(
            device_range(8 * L, 24 * L, 0, L).unwrap(),
            vec![mapped(8 * L, 8 * L, 16 * L)]
        );
        assert!(device_range(8 * L, 24 * L, 512, L).is_err());
    }

    #[test]
    fn data_journal_mounts_are_found_by_device_number() {
        let text = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
30 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw,data=journal
31 1 259:2 / /data rw,relatime shared:2 master:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
";
        assert!(journals_data(text, 259, 1));
        assert!(!journals_data(text, 259, 2));
        assert!(!journals_data(text, 259, 3));
        assert!(!journals_data("garbage\n\n- - -", 259, 1));
    }

    /// Tests on real files, in a directory next to the test binary (under
    /// the build's target directory, a real filesystem, unlike a tmpfs
    /// `/tmp`).
    mod on_files {
        use super::*;
        use std::{
            fs::{File, OpenOptions},
            io::Write,
            os::{
                fd::AsFd,
                unix::fs::{FileExt, MetadataExt, OpenOptionsExt},
            },
            path::PathBuf,
        };

        /// A fresh path for `name`, unique to this run.
        fn temp(name: &str) -> PathBuf {
            let exe = std::env::current_exe().unwrap();
            let d = exe.parent().unwrap().join("fiemap-test");
            std::fs::create_dir_all(&d).unwrap();
            d.join(format!("{}-{name}", std::process::id()))
        }

        fn pattern(seed: u8, len: usize) -> Vec<u8> {
            (0..len)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
                .collect()
        }

        /// The file's extents over `[0, end)`, or `None` (with the reason
        /// printed) when its filesystem has no FIEMAP.
        fn extents_or_skip(f: &File, end: u64, test: &str) -> Option<Vec<Extent>> {
            match fiemap(f.as_fd(), 0, end, true) {
                Ok(e) => Some(e),
                Err(Errno::OPNOTSUPP | Errno::NOTTY) => {
                    let fs = rustix::fs::fstatfs(f).map(|s| s.f_type as u32).unwrap_or(0);
                    println!(
                        "{test}: skipped: FIEMAP is not supported here (filesystem magic {fs:#x})"
                    );
                    None
                }
                Err(e) => panic!("FIEMAP failed: {e}"),
            }
        }

        fn block_size(f: &File) -> u64 {
            f.metadata().unwrap().blksize().max(512)
        }

        /// Reads `len` bytes at `offset` of the block device holding `f`
        /// with `O_DIRECT`, when this process may (as root), to check that
        /// FIEMAP's offsets point at the file's data.
        fn device_bytes(f: &File, offset: u64, len: usize) -> Option<Vec<u8>> {
            let dev = f.metadata().ok()?.dev();
            let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
            let uevent =
                std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent")).ok()?;
            let name = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
            let bdev = OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                .open(format!("/dev/{name}"))
                .ok()?;
            let buf = crate::sys::HostBuffer::new(len).ok()?;
            if buf.pread_from(&bdev, offset, 0, len).ok()? != len {
                return None;
            }
            let mut out = vec![0u8; len];
            buf.read_raw(0, &mut out).ok()?;
            Some(out)
        }

        /// Checks that `segments` map all of `want` (the file's bytes from
        /// offset 0), in order, and that the device holds those bytes where
        /// they say (when the block device can be read).
        fn assert_on_device(f: &File, segments: &[Segment], want: &[u8], test: &str) {
            let mut at = 0;
            for s in segments {
                let Segment::Mapped {
                    file_offset,
                    dev_offset,
                    len,
                } = *s
                else {
                    panic!("{test}: {s:?} where every byte is written")
                };
                assert_eq!(file_offset, at);
                at += len;
                let range = file_offset as usize..(file_offset + len) as usize;
                match device_bytes(f, dev_offset, len as usize) {
                    Some(got) => assert!(
                        got == want[range],
                        "{test}: device bytes at {dev_offset} are not the file's at {file_offset}"
                    ),
                    None => println!(
                        "{test}: data on the device not checked (its block device is not readable here)"
                    ),
                }
            }
            assert_eq!(at, want.len() as u64);
        }

        #[test]
        fn a_written_file_maps_to_the_device_bytes_holding_its_data() {
            let path = temp("written.bin");
            let data = pattern(1, 1 << 20);
            let mut f = File::create(&path).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            let Some(extents) = extents_or_skip(&f, 1 << 20, "written file") else {
                return;
            };
            let lba = block_size(&f);
            let read = plan(&extents, 0, 1 << 20, 1 << 20, 0, lba, false).unwrap();
            let write = plan(&extents, 0, 1 << 20, 1 << 20, 0, lba, true).unwrap();
            assert_eq!(read, write);
            assert_on_device(&f, &read, &data, "written file");
            // Past the end, writes are refused.
            assert!(plan(&extents, 0, 2 << 20, 1 << 20, 0, lba, true)
                .unwrap_err()
                .contains("past the end"));
            // Through `map`, as the NVMe-command path calls it.
            if let Ok(fs) = Filesystem::of(f.as_fd()) {
                assert_eq!(map(f.as_fd(), fs, 0, 1 << 20, 0, lba, true).unwrap(), read);
            }
            drop(f);
            let _ = std::fs::remove_file(path);
        }

        #[test]
        fn a_map_no_longer_holds_after_a_hole_punch_or_truncate() {
            let path = temp("changed.bin");
            let mut f = File::options()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            f.write_all(&pattern(4, 1 << 20)).unwrap();
            f.sync_all().unwrap();
            let (Some(_), Ok(fs)) = (
                extents_or_skip(&f, 1 << 20, "changed map"),
                Filesystem::of(f.as_fd()),
            ) else {
                return;
            };
            let lba = block_size(&f);
            let segs = map(f.as_fd(), fs, 0, 1 << 20, 0, lba, false).unwrap();
            still_mapped(f.as_fd(), 0, 1 << 20, 0, lba, &segs).unwrap();
            rustix::fs::fallocate(
                &f,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                256 << 10,
                64 << 10,
            )
            .unwrap();
            let why = still_mapped(f.as_fd(), 0, 1 << 20, 0, lba, &segs).unwrap_err();
            assert!(why.contains("extents changed"), "{why}");
            let segs = map(f.as_fd(), fs, 0, 1 << 20, 0, lba, false).unwrap();
            f.set_len(512 << 10).unwrap();
            let why = still_mapped(f.as_fd(), 0, 1 << 20, 0, lba, &segs).unwrap_err();
            assert!(why.contains("extents changed"), "{why}");
            drop(f);
            let _ = std::fs::remove_file(path);
        }

        #[test]
        fn a_sparse_file_maps_its_hole_to_zeros() {
            let path = temp("sparse.bin");
            let f = File::create(&path).unwrap();
            f.write_all_at(&pattern(2, 64 << 10), 0).unwrap();
            f.set_len(1 << 20).unwrap();
            f.sync_all().unwrap();
            let Some(extents) = extents_or_skip(&f, 1 << 20, "sparse file") else {
                return;
            };
            let lba = block_size(&f);
            let p = plan(&extents, 0, 1 << 20, 1 << 20, 0, lba, false).unwrap();
            assert!(
                matches!(p[0], Segment::Mapped { file_offset: 0, .. }),
                "{p:?}"
            );
            let data: u64 = p
                .iter()
                .filter(|s| matches!(s, Segment::Mapped { .. }))
                .map(Segment::len)
                .sum();
            assert_eq!(data, 64 << 10, "{p:?}");
            assert_eq!(
                p.last(),
                Some(&zero(64 << 10, (1 << 20) - (64 << 10))),
                "{p:?}"
            );
            assert!(plan(&extents, 0, 1 << 20, 1 << 20, 0, lba, true)
                .unwrap_err()
                .contains("hole"));
            // The written part alone can be overwritten.
            assert!(plan(&extents, 0, 64 << 10, 1 << 20, 0, lba, true).is_ok());
            drop(f);
            let _ = std::fs::remove_file(path);
        }

        #[test]
        fn an_fallocated_range_reads_as_zeros_and_refuses_writes() {
            let path = temp("fallocated.bin");
            let f = File::create(&path).unwrap();
            match rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 1 << 20) {
                Ok(()) => {}
                Err(Errno::OPNOTSUPP) => {
                    println!("fallocated range: skipped: fallocate is not supported here");
                    return;
                }
                Err(e) => panic!("fallocate: {e}"),
            }
            let Some(extents) = extents_or_skip(&f, 1 << 20, "fallocated range") else {
                return;
            };
            if extents.iter().all(|e| e.flags & EXTENT_UNWRITTEN == 0) {
                // Filesystems without unwritten extents zero the blocks.
                println!("fallocated range: this filesystem reports no unwritten extents");
                return;
            }
            let lba = block_size(&f);
            let p = plan(&extents, 0, 1 << 20, 1 << 20, 0, lba, false).unwrap();
            assert_eq!(p, vec![zero(0, 1 << 20)]);
            assert!(plan(&extents, 0, 1 << 20, 1 << 20, 0, lba, true)
                .unwrap_err()
                .contains("unwritten"));
            drop(f);
            let _ = std::fs::remove_file(path);
        }

        #[test]
        fn dirty_buffered_writes_are_written_back_before_mapping() {
            let path = temp("dirty.bin");
            let f = File::create(&path).unwrap();
            match rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 1 << 20) {
                Ok(()) | Err(Errno::OPNOTSUPP) => {}
                Err(e) => panic!("fallocate: {e}"),
            }
            // Buffered writes, not synced: delayed allocation on ext4 and
            // XFS, dirty pages over unwritten blocks where fallocated.
            let data = pattern(3, 1 << 20);
            f.write_all_at(&data, 0).unwrap();
            let more = pattern(4, 256 << 10);
            f.write_all_at(&more, 1 << 20).unwrap();
            let size = (1 << 20) + (256 << 10);
            let lba = block_size(&f);
            // Without the sync, the filesystem may still be holding the
            // blocks back (delayed allocation): such a map is refused.
            match fiemap(f.as_fd(), 0, size, false) {
                Ok(before) if before.iter().any(|e| e.flags & EXTENT_DELALLOC != 0) => {
                    assert!(plan(&before, 0, size, size, 0, lba, false)
                        .unwrap_err()
                        .contains("DELALLOC"));
                }
                _ => println!("dirty buffered writes: no delayed allocation seen before the sync"),
            }
            let Some(extents) = extents_or_skip(&f, size, "dirty buffered writes") else {
                return;
            };
            let p = plan(&extents, 0, size, size, 0, lba, true).unwrap();
            let want: Vec<u8> = data.iter().chain(&more).copied().collect();
            assert_on_device(&f, &p, &want, "dirty buffered writes");
            drop(f);
            let _ = std::fs::remove_file(path);
        }

        #[test]
        fn many_extents_take_several_fiemap_calls() {
            // Every other block written: more extents than one call holds.
            let path = temp("fragmented.bin");
            let f = File::create(&path).unwrap();
            let n = (EXTENTS_PER_CALL as u64) * 2 + 7;
            let bs = block_size(&f).max(4096);
            for i in 0..n {
                f.write_all_at(&pattern(i as u8, bs as usize), 2 * i * bs)
                    .unwrap();
            }
            f.sync_all().unwrap();
            let size = (2 * n - 1) * bs;
            let Some(extents) = extents_or_skip(&f, size, "fragmented file") else {
                return;
            };
            assert!(extents.len() as u64 >= n, "{} extents", extents.len());
            let p = plan(&extents, 0, size, size, 0, bs, false).unwrap();
            let data: u64 = p
                .iter()
                .filter(|s| matches!(s, Segment::Mapped { .. }))
                .map(Segment::len)
                .sum();
            assert_eq!(data, n * bs);
            assert_eq!(p.iter().map(Segment::len).sum::<u64>(), size);
            drop(f);
            let _ = std::fs::remove_file(path);
        }

        #[test]
        fn the_filesystem_check_names_the_filesystem() {
            let path = temp("fs.bin");
            let f = File::create(&path).unwrap();
            let magic = rustix::fs::fstatfs(&f).unwrap().f_type as u32;
            match (magic, Filesystem::of(f.as_fd())) {
                (EXT4_SUPER_MAGIC, Ok(fs)) => assert_eq!(fs, Filesystem::Ext4),
                (XFS_SUPER_MAGIC, Ok(fs)) => assert_eq!(fs, Filesystem::Xfs),
                (EXT4_SUPER_MAGIC, Err(why)) => assert!(why.contains("data=journal"), "{why}"),
                (BTRFS_SUPER_MAGIC, Err(why)) => assert!(why.contains("btrfs"), "{why}"),
                (_, Err(why)) => assert!(why.contains("only ext4 and XFS"), "{why}"),
                (m, Ok(fs)) => panic!("{fs} accepted on a filesystem with magic {m:#x}"),
            }
            if let Ok(fs) = Filesystem::of(f.as_fd()) {
                assert!(check_inode(f.as_fd(), fs).is_ok());
            }
            drop(f);
            let _ = std::fs::remove_file(path);
        }
    }
}
