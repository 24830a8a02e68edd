//! User mappings of an allocation: two of one allocation, the bounds of the
//! copy routines, and the `mmap` arguments the module refuses.

use p2pdma::sys::Sharing;
use rustix::io::Errno;

use super::{all, round_up, verify, want_errno, Ctx, Why, KIB, PAGE, R};
use crate::util::pattern;

impl Ctx {
    pub(super) fn alloc_map_twice(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let m1 = a.map()?;
        let m2 = a.map()?;
        ensure!(m1.as_ptr() != m2.as_ptr(), "two mappings at one address");
        m1.write_at(0, &pattern(21, 0, m1.len()))?;
        verify(&m2, 21, "second mapping after writing through the first")?;
        m2.write_at(0, &pattern(22, 0, m2.len()))?;
        verify(&m1, 22, "first mapping after writing through the second")
    }

    pub(super) fn mapping_bounds(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let m = a.map()?;
        let n = m.len();
        let oob = |r: p2pdma::Result<()>, what: &str| match r {
            Err(p2pdma::Error::OutOfBounds { .. }) => Ok(()),
            other => fail!("{what}: {other:?}, expected an out-of-bounds error"),
        };
        all(vec![
            oob(m.write_at(n, &[1]), "write one byte past the end"),
            oob(m.read_at(n - 1, &mut [0; 2]), "read across the end"),
            oob(m.read_at(usize::MAX, &mut [0; 1]), "read at usize::MAX"),
            m.write_at(n - 1, &[0x5a]).map_err(Why::from),
        ])?;
        let mut last = [0u8];
        m.read_at(n - 1, &mut last)?;
        ensure!(
            last[0] == 0x5a,
            "last byte reads {:#x} after writing 0x5a",
            last[0]
        );
        Ok(())
    }

    pub(super) fn mmap_bad(&self) -> [(&'static str, R); 3] {
        let a = match self.module.alloc(self.dev, 64 * KIB, 0) {
            Ok(a) => a,
            Err(e) => {
                let m = format!("ALLOC: {e}");
                return [
                    ("mmap-wrong-offset", Err(Why::Fail(m.clone()))),
                    ("mmap-private", Err(Why::Fail(m.clone()))),
                    ("mmap-too-long", Err(Why::Fail(m))),
                ];
            }
        };
        let len = a.size() as usize;
        let wrong = round_up(a.mmap_offset() + a.size() + (1 << 30), PAGE);
        [
            (
                "mmap-wrong-offset",
                want_errno(
                    &format!("mmap at offset {wrong:#x}, which no allocation has"),
                    self.map_raw(len, wrong, Sharing::Shared),
                    Errno::INVAL,
                ),
            ),
            (
                "mmap-private",
                want_errno(
                    "mmap with MAP_PRIVATE",
                    self.map_raw(len, a.mmap_offset(), Sharing::Private),
                    Errno::INVAL,
                ),
            ),
            (
                "mmap-too-long",
                want_errno(
                    "mmap one page longer than the allocation",
                    self.map_raw(len + PAGE as usize, a.mmap_offset(), Sharing::Shared),
                    Errno::INVAL,
                ),
            ),
        ]
    }
}
