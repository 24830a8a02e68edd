//! Reading sysfs and procfs attributes: small files, parsed.

use std::{fs, io, path::Path};

use super::{
    error::{Result, TopologyError},
    parse::parse_dec,
};

/// Largest sysfs attribute read; real ones are a few bytes.
const MAX_ATTR: u64 = 64 * 1024;

pub(super) fn read_small(path: &Path) -> Result<String> {
    let file = fs::File::open(path).map_err(|source| TopologyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut s = String::new();
    io::Read::read_to_string(&mut io::Read::take(file, MAX_ATTR), &mut s).map_err(|source| {
        TopologyError::Read {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(s)
}

/// A decimal sysfs attribute that must be there.
pub(super) fn read_parsed<T: std::str::FromStr>(path: &Path, expected: &'static str) -> Result<T> {
    let s = read_small(path)?;
    parse_dec(&s).ok_or_else(|| TopologyError::Parse {
        path: path.to_path_buf(),
        value: s.trim().to_string(),
        expected,
    })
}

/// A decimal sysfs attribute that may be missing.
pub(super) fn read_optional<T: std::str::FromStr>(
    path: &Path,
    expected: &'static str,
) -> Result<Option<T>> {
    match read_parsed(path, expected) {
        Ok(v) => Ok(Some(v)),
        Err(TopologyError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
