//! A range of a memory: the memory side of a transfer, as one value.

use std::fmt;

use super::DeviceMemory;
use crate::{error::check_range, Result};

/// `len` bytes of `mem` from byte `offset`, inside it (checked when made).
#[derive(Clone, Copy)]
pub struct MemRange<'a> {
    mem: &'a dyn DeviceMemory,
    offset: usize,
    len: usize,
}

impl fmt::Debug for MemRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemRange")
            .field("mem", &self.mem.kind())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl<'a> MemRange<'a> {
    /// `len` bytes of `mem` at `offset`; `Error::OutOfBounds` when they do
    /// not fit in it.
    pub fn new(mem: &'a dyn DeviceMemory, offset: usize, len: usize) -> Result<Self> {
        check_range(offset, len, mem.len())?;
        Ok(Self { mem, offset, len })
    }

    /// The bytes of `mem` from `offset` to its end; `Error::OutOfBounds`
    /// when `offset` is past it.
    pub fn from_offset(mem: &'a dyn DeviceMemory, offset: usize) -> Result<Self> {
        Self::new(mem, offset, mem.len().saturating_sub(offset))
    }

    /// All of `mem`.
    pub fn whole(mem: &'a dyn DeviceMemory) -> Self {
        Self {
            mem,
            offset: 0,
            len: mem.len(),
        }
    }

    /// The memory.
    pub fn mem(&self) -> &'a dyn DeviceMemory {
        self.mem
    }

    /// Where the range starts in the memory.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes from byte `at` of this range; `Error::OutOfBounds`
    /// outside it.
    pub fn sub(&self, at: usize, len: usize) -> Result<Self> {
        check_range(at, len, self.len)?;
        Ok(Self {
            mem: self.mem,
            offset: self.offset + at,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{memory::HostMemory, Error};

    #[test]
    fn ranges_stay_inside_their_memory() {
        let m = HostMemory::new(8192).unwrap();
        let r = MemRange::new(&m, 100, 4000).unwrap();
        assert_eq!((r.offset(), r.len(), r.is_empty()), (100, 4000, false));
        let s = r.sub(1000, 3000).unwrap();
        assert_eq!((s.offset(), s.len()), (1100, 3000));
        assert!(matches!(r.sub(1001, 3000), Err(Error::OutOfBounds { .. })));
        assert!(matches!(
            r.sub(usize::MAX, 2),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            MemRange::new(&m, 8000, 193),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(MemRange::new(&m, 8192, 0).unwrap().is_empty());
        assert_eq!(MemRange::whole(&m).len(), 8192);
        let t = MemRange::from_offset(&m, 8000).unwrap();
        assert_eq!((t.offset(), t.len()), (8000, 192));
        assert!(MemRange::from_offset(&m, 8192).unwrap().is_empty());
        assert!(matches!(
            MemRange::from_offset(&m, 8193),
            Err(Error::OutOfBounds { .. })
        ));
    }
}
