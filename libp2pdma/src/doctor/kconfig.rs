//! The running kernel's configuration: `/proc/config.gz`, or the config
//! named after the release in `/boot`.

use std::{collections::BTreeMap, path::PathBuf};

/// Default root of the kernel configs named after releases.
pub const BOOT_ROOT: &str = "/boot";
/// Largest kernel config read (real ones are about 300 KiB).
pub(super) const MAX_KCONFIG: u64 = 16 << 20;

/// A kernel's build configuration (`CONFIG_*` lines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// Where it was read from.
    pub source: PathBuf,
    values: BTreeMap<String, String>,
}

impl KernelConfig {
    /// Parses the text of a kernel `.config`: `CONFIG_X=value` lines;
    /// `# CONFIG_X is not set` and absent options are unset.
    pub fn parse(source: impl Into<PathBuf>, text: &str) -> Self {
        let values = text
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let (k, v) = l.split_once('=')?;
                k.starts_with("CONFIG_")
                    .then(|| (k.to_string(), v.trim_matches('"').to_string()))
            })
            .collect();
        Self {
            source: source.into(),
            values,
        }
    }

    /// The value of option `name` (`CONFIG_...`), `None` when unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether option `name` is built in or a module.
    pub fn enabled(&self, name: &str) -> bool {
        matches!(self.get(name), Some("y" | "m"))
    }

    /// `CONFIG_X=y`, or `CONFIG_X is not set`.
    pub(super) fn describe(&self, name: &str) -> String {
        match self.get(name) {
            Some(v) => format!("{name}={v}"),
            None => format!("{name} is not set"),
        }
    }
}
