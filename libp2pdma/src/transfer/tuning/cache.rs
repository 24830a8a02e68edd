//! Where AUTO keeps what it learns about the machine between processes:
//! one directory (the `cache_dir` setting), a file per kind of knowledge
//! (`geometry` for chunk size and depth, `strided.json` for the strided
//! cost model's constants), each device recognised by a [`DeviceKey`].
//!
//! Files are replaced whole (`replace_file`): a reader sees the old file
//! or the new one, never half of one. Nothing here makes a transfer fail:
//! a cache that cannot be read or written only means learning again.

use std::{
    fmt,
    io::Write,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use crate::discovery::{DevNum, DiskFacts};

/// A `cache_dir` setting: `off` or `none` for no cache; `default` for
/// `$XDG_CACHE_HOME/p2pdma`, else `$HOME/.cache/p2pdma` (none when neither
/// is set); else a directory.
pub fn parse_cache_dir(v: &str) -> Option<PathBuf> {
    match v.trim() {
        "off" | "none" | "" => None,
        "default" => {
            let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
            var("XDG_CACHE_HOME")
                .map(|d| PathBuf::from(d).join("p2pdma"))
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/p2pdma")))
        }
        dir => Some(PathBuf::from(dir)),
    }
}

/// What a disk is recognised by: its device number, model and serial.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceKey {
    pub(crate) dev: DevNum,
    pub(crate) model: String,
    pub(crate) serial: String,
}

impl DeviceKey {
    /// The key of a disk with these facts; `None` without a device number.
    pub fn of(f: &DiskFacts) -> Option<Self> {
        Some(Self {
            dev: f.dev?,
            model: clean(f.model.as_deref()),
            serial: clean(f.serial.as_deref()),
        })
    }

    /// A key from its three parts as a cache file keeps them; `None` when
    /// the device number does not parse.
    pub(crate) fn from_parts(dev: &str, model: &str, serial: &str) -> Option<Self> {
        Some(Self {
            dev: DevNum::parse(dev)?,
            model: model.to_string(),
            serial: serial.to_string(),
        })
    }
}

/// A model or serial as a key keeps it: control characters (tabs,
/// newlines) made spaces, trimmed, `-` when empty or unknown.
fn clean(s: Option<&str>) -> String {
    let s: String = s
        .unwrap_or("")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match s.trim() {
        "" => "-".to_string(),
        t => t.to_string(),
    }
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, serial {})", self.dev, self.model, self.serial)
    }
}

/// A distinct name for each temporary file this process writes.
static TMP_SEQ: AtomicU32 = AtomicU32::new(0);

/// Replaces `file` with `text`: written under a temporary name in the same
/// directory (created if missing) and renamed over it, so that readers see
/// the old file or the new one, never half of one. The temporary is
/// removed when anything fails.
pub(crate) fn replace_file(file: &Path, text: &str) -> std::io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = file
        .file_name()
        .map_or_else(|| "cache".into(), |n| n.to_string_lossy());
    let tmp = dir.join(format!(
        ".{name}.{}-{}.tmp",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::fake::TempDir;

    #[test]
    fn cache_dir_settings() {
        assert_eq!(parse_cache_dir("off"), None);
        assert_eq!(parse_cache_dir(" none "), None);
        assert_eq!(parse_cache_dir("/x/y"), Some(PathBuf::from("/x/y")));
    }

    #[test]
    fn keys_are_cleaned() {
        let f = DiskFacts {
            dev: Some(DevNum {
                major: 259,
                minor: 3,
            }),
            model: Some(" Model\tX\n".into()),
            serial: None,
            ..DiskFacts::default()
        };
        let k = DeviceKey::of(&f).unwrap();
        assert_eq!((k.model.as_str(), k.serial.as_str()), ("Model X", "-"));
        assert_eq!(DeviceKey::from_parts("259:3", "Model X", "-"), Some(k));
        assert_eq!(DeviceKey::from_parts("x", "m", "s"), None);
        assert_eq!(DeviceKey::of(&DiskFacts::default()), None);
    }

    #[test]
    fn files_are_replaced_whole_and_leave_no_temporaries() {
        let dir = TempDir::new("cache-replace");
        let file = dir.path().join("sub/f");
        replace_file(&file, "one").unwrap();
        replace_file(&file, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "two");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"]);
        // A directory that cannot be made is an error, not a panic.
        assert!(replace_file(&file.join("below-a-file"), "x").is_err());
    }
}
