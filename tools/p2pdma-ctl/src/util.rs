//! Small helpers shared by the subcommands and the sanity suite.

use rustix::io::Errno;

/// Parses a byte count: decimal or `0x` hexadecimal, with an optional
/// binary suffix `K`, `M` or `G` (`KiB`, `MiB`, `GiB` also accepted).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, shift) = [
        ("kib", 10),
        ("mib", 20),
        ("gib", 30),
        ("k", 10),
        ("m", 20),
        ("g", 30),
    ]
    .iter()
    .find_map(|&(suf, sh)| lower.strip_suffix(suf).map(|n| (n.to_string(), sh)))
    .unwrap_or((lower.clone(), 0));
    let value = if let Some(hex) = num.strip_prefix("0x") {
        u64::from_str_radix(hex, 16)
    } else {
        num.parse::<u64>()
    }
    .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 0x1000, 64K, 2M, 1G)"))?;
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} does not fit in 64 bits"))
}

/// The symbolic name of an errno (`EINVAL`), or `errno N` for one this tool
/// does not name.
pub fn errno_name(e: Errno) -> String {
    let name = match e {
        Errno::PERM => "EPERM",
        Errno::NOENT => "ENOENT",
        Errno::SRCH => "ESRCH",
        Errno::INTR => "EINTR",
        Errno::IO => "EIO",
        Errno::NXIO => "ENXIO",
        Errno::BADF => "EBADF",
        Errno::AGAIN => "EAGAIN",
        Errno::NOMEM => "ENOMEM",
        Errno::ACCESS => "EACCES",
        Errno::FAULT => "EFAULT",
        Errno::NOTBLK => "ENOTBLK",
        Errno::BUSY => "EBUSY",
        Errno::EXIST => "EEXIST",
        Errno::NODEV => "ENODEV",
        Errno::INVAL => "EINVAL",
        Errno::NOTTY => "ENOTTY",
        Errno::NOSPC => "ENOSPC",
        Errno::RANGE => "ERANGE",
        Errno::NOSYS => "ENOSYS",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::OVERFLOW => "EOVERFLOW",
        Errno::REMOTEIO => "EREMOTEIO",
        Errno::TIMEDOUT => "ETIMEDOUT",
        _ => return format!("errno {}", e.raw_os_error()),
    };
    name.to_string()
}

/// One 8-byte word of the test pattern: a function of a seed and the word's
/// position, so misplaced, stale or foreign data is detected.
fn pattern_word(seed: u64, word: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0xD6E8_FEB8_6659_FD93)
        .wrapping_add(word)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` pattern bytes as found at byte `offset` of a buffer filled with
/// seed `seed`.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut pos = offset;
    while out.len() < len {
        let word = pattern_word(seed, pos / 8).to_le_bytes();
        let start = (pos % 8) as usize;
        let take = (8 - start).min(len - out.len());
        out.extend_from_slice(&word[start..start + take]);
        pos += take as u64;
    }
    out
}

/// Where two buffers first differ, described for a failure message.
pub fn first_difference(expected: &[u8], actual: &[u8]) -> Option<String> {
    if expected.len() != actual.len() {
        return Some(format!(
            "{} bytes expected, {} found",
            expected.len(),
            actual.len()
        ));
    }
    let i = expected.iter().zip(actual).position(|(a, b)| a != b)?;
    let bad = expected.iter().zip(actual).filter(|(a, b)| a != b).count();
    Some(format!(
        "byte {i:#x} is {:#04x}, expected {:#04x} ({bad} of {} bytes differ)",
        actual[i],
        expected[i],
        expected.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("0x2M"), Ok(2 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn errnos_have_names() {
        assert_eq!(errno_name(Errno::INVAL), "EINVAL");
        assert_eq!(errno_name(Errno::REMOTEIO), "EREMOTEIO");
        assert_eq!(errno_name(Errno::from_raw_os_error(200)), "errno 200");
    }

    #[test]
    fn the_pattern_depends_on_position_and_seed() {
        let a = pattern(1, 0, 8192);
        assert_eq!(pattern(1, 4096, 4096), a[4096..]);
        assert_eq!(pattern(1, 4093, 11), a[4093..4104]);
        assert_ne!(a[..4096], a[4096..]);
        assert_ne!(pattern(2, 0, 8192), a);
        // No short period: every aligned 8-byte word differs.
        let mut words: Vec<&[u8]> = a.chunks(8).collect();
        words.sort();
        words.dedup();
        assert_eq!(words.len(), 1024);
    }

    #[test]
    fn differences_are_located() {
        assert_eq!(first_difference(b"abc", b"abc"), None);
        let d = first_difference(b"abcd", b"abXY").unwrap();
        assert!(
            d.starts_with("byte 0x2 is 0x58, expected 0x63 (2 of 4"),
            "{d}"
        );
        assert!(first_difference(b"a", b"ab").is_some());
    }
}
