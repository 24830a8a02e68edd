//! `/proc/self/mountinfo`: which filesystem is mounted where.

use super::devnum::DevNum;

/// One line of `/proc/self/mountinfo`, the fields the topology needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// The filesystem's device number.
    pub dev: DevNum,
    /// Where it is mounted.
    pub mount_point: String,
    /// Its type.
    pub fstype: String,
    /// Its source (a device node, or a name like `tmpfs`).
    pub source: String,
}

/// Parses one line of `/proc/self/mountinfo`; `None` for a malformed one.
pub fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let _id = l.next()?;
    let _parent = l.next()?;
    let dev = DevNum::parse(l.next()?)?;
    let _root = l.next()?;
    let mount_point = unescape_mount(l.next()?);
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape_mount(r.next()?);
    Some(MountInfo {
        dev,
        mount_point,
        fstype,
        source,
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
pub(super) fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
