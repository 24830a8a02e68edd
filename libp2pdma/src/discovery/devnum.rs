//! Device numbers, as sysfs and mountinfo name them.

use std::fmt;

use rustix::fs::{major, minor};

use super::parse::parse_dec;

/// A device number, printed `major:minor` as sysfs names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl DevNum {
    /// Splits a raw `dev_t` (`st_dev`, `st_rdev`).
    pub fn from_raw(dev: u64) -> Self {
        Self {
            major: major(dev),
            minor: minor(dev),
        }
    }

    /// Parses `major:minor` (sysfs `dev` files, `/proc/self/mountinfo`).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, b) = s.trim().split_once(':')?;
        Some(Self {
            major: parse_dec(a)?,
            minor: parse_dec(b)?,
        })
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}
