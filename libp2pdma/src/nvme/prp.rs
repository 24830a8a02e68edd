//! PRP data pointers (NVMe base specification, 4.1.1): the bus addresses
//! of a mapping as segments, and the pages a transfer's data pointer names.

use super::spec::PAGE;

/// The address of byte `offset` of a mapping made of `segs` (`(address,
/// length)` in order), if it is inside.
pub fn seg_addr(segs: &[(u64, u64)], offset: u64) -> Option<u64> {
    seg_run(segs, offset).map(|(a, _)| a)
}

/// The address of byte `offset` of a mapping made of `segs`, and how many
/// bytes from there on its segment holds.
pub fn seg_run(segs: &[(u64, u64)], offset: u64) -> Option<(u64, u64)> {
    // Invariant: `offset >= start`, or the previous segment held it.
    let mut start = 0u64;
    for &(addr, len) in segs {
        if offset - start < len {
            let into = offset - start;
            return Some((addr.checked_add(into)?, len - into));
        }
        start = start.checked_add(len)?;
    }
    None
}

/// The segments of a DMA mapping, searchable by offset: segments that
/// continue each other on the bus are merged, so a run is as long as the
/// device sees it contiguous.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Segments {
    /// `(address, length)` of each run, in order, none empty.
    runs: Vec<(u64, u64)>,
    /// The offset just past each run.
    ends: Vec<u64>,
}

impl Segments {
    /// From `(address, length)` segments in order; `None` when their
    /// lengths or addresses overflow.
    pub fn new(segs: &[(u64, u64)]) -> Option<Self> {
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(segs.len());
        let mut ends = Vec::with_capacity(segs.len());
        let mut end = 0u64;
        for &(addr, len) in segs.iter().filter(|s| s.1 > 0) {
            addr.checked_add(len)?;
            end = end.checked_add(len)?;
            match runs.last_mut() {
                Some(last) if last.0 + last.1 == addr => {
                    last.1 += len;
                    *ends.last_mut()? = end;
                }
                _ => {
                    runs.push((addr, len));
                    ends.push(end);
                }
            }
        }
        Some(Self { runs, ends })
    }

    /// Bytes covered.
    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether no byte is covered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device's address of byte `offset`, and how many bytes from there
    /// on are contiguous for the device.
    pub fn run(&self, offset: u64) -> Option<(u64, u64)> {
        let i = self.ends.partition_point(|&e| e <= offset);
        let &(addr, len) = self.runs.get(i)?;
        let into = offset - (self.ends[i] - len);
        Some((addr + into, len - into))
    }

    /// The device's address of the `len` bytes at `offset`, if they are all
    /// contiguous for the device.
    pub fn contiguous(&self, offset: u64, len: u64) -> Option<u64> {
        self.run(offset)
            .and_then(|(a, n)| (len > 0 && n >= len).then_some(a))
    }

    /// The data pointer of `len` bytes at `offset`: see [`data_ptr`].
    pub fn data_ptr(&self, offset: usize, len: usize) -> Result<DataPtr, String> {
        data_ptr(
            |o| {
                self.run(o as u64)
                    .map(|(a, n)| (a, usize::try_from(n).unwrap_or(usize::MAX)))
            },
            offset,
            len,
        )
    }
}

/// A transfer's data pointer: PRP1 (the first byte), and the page
/// addresses of the rest, which go to PRP2 (one) or a PRP list (more).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataPtr {
    /// The address of the first byte, dword aligned.
    pub prp1: u64,
    /// The addresses of the following memory pages, page aligned.
    pub pages: Vec<u64>,
}

impl DataPtr {
    /// The `(address, length)` ranges a controller moves for a transfer of
    /// `len` bytes through this pointer: the first up to the end of PRP1's
    /// memory page, then a page (or the rest) per entry.
    pub fn ranges(&self, len: usize) -> Vec<(u64, usize)> {
        let first = (PAGE - (self.prp1 as usize % PAGE)).min(len);
        let mut out = vec![(self.prp1, first)];
        let mut done = first;
        for &a in &self.pages {
            let n = PAGE.min(len - done);
            out.push((a, n));
            done += n;
        }
        out
    }
}

/// The data pointer for `len` bytes at `offset` of memory where `run(o)`
/// gives the device's address of byte `o` and how many bytes from there on
/// are contiguous for the device: the first entry runs to the end of its
/// memory page, every further one covers a whole page (or the rest).
/// Refuses memory where a page is not contiguous in the device's address
/// space, or does not start on a page boundary there.
pub fn data_ptr(
    run: impl Fn(usize) -> Option<(u64, usize)>,
    offset: usize,
    len: usize,
) -> Result<DataPtr, String> {
    if len == 0 {
        return Err("a transfer of 0 bytes".into());
    }
    // The device's address of the `n` bytes at `o`, which must be
    // contiguous for it.
    let chunk = |o: usize, n: usize| -> Result<u64, String> {
        match run(o) {
            None => Err(format!("byte {o} has no DMA address")),
            Some((a, have)) if have < n => Err(format!(
                "bytes {o}..{} are not contiguous for the device (only {have} from {a:#x} are)",
                o + n
            )),
            Some((a, _)) => Ok(a),
        }
    };
    let Some((prp1, _)) = run(offset) else {
        return Err(format!("byte {offset} has no DMA address"));
    };
    if prp1 % 4 != 0 {
        return Err(format!("PRP1 {prp1:#x} is not dword aligned"));
    }
    let first = (PAGE - (prp1 as usize % PAGE)).min(len);
    chunk(offset, first)?;
    let mut pages = Vec::new();
    let mut done = first;
    while done < len {
        let n = PAGE.min(len - done);
        let a = chunk(offset + done, n)?;
        if a % PAGE as u64 != 0 {
            return Err(format!(
                "byte {} starts a memory page at {a:#x}, not page aligned",
                offset + done
            ));
        }
        pages.push(a);
        done += n;
    }
    Ok(DataPtr { prp1, pages })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_addresses_follow_the_segments() {
        let segs = [(0x10_0000, 0x2000), (0x50_0000, 0x1000), (0x9000, 0x3000)];
        assert_eq!(seg_addr(&segs, 0), Some(0x10_0000));
        assert_eq!(seg_addr(&segs, 0x1fff), Some(0x10_1fff));
        assert_eq!(seg_addr(&segs, 0x2000), Some(0x50_0000));
        assert_eq!(seg_addr(&segs, 0x3004), Some(0x9004));
        assert_eq!(seg_addr(&segs, 0x5fff), Some(0xbfff));
        assert_eq!(seg_addr(&segs, 0x6000), None);
        assert_eq!(seg_addr(&[], 0), None);
    }

    fn scattered(o: usize) -> Option<(u64, usize)> {
        // Page i of the buffer lies at 0x100000 * (i + 1), 24 pages in all.
        (o < 24 * PAGE).then(|| {
            (
                0x10_0000 * (o / PAGE + 1) as u64 + (o % PAGE) as u64,
                PAGE - o % PAGE,
            )
        })
    }

    #[test]
    fn segments_merge_runs_and_find_offsets() {
        let s = Segments::new(&[
            (0x10_0000, 0x1000),
            (0x10_1000, 0x1000),
            (0, 0),
            (0x50_0000, 0x800),
            (0x9000, 0x3000),
        ])
        .unwrap();
        assert_eq!(s.len(), 0x5800);
        assert_eq!(s.run(0), Some((0x10_0000, 0x2000)));
        assert_eq!(s.run(0x1fff), Some((0x10_1fff, 1)));
        assert_eq!(s.run(0x2000), Some((0x50_0000, 0x800)));
        assert_eq!(s.run(0x2804), Some((0x9004, 0x2ffc)));
        assert_eq!(s.run(0x5800), None);
        assert_eq!(s.contiguous(0x800, 0x1800), Some(0x10_0800));
        assert_eq!(s.contiguous(0x800, 0x1801), None);
        assert_eq!(s.contiguous(0, 0), None);
        assert!(Segments::new(&[(u64::MAX, 2)]).is_none());
        for o in 0..0x5800u64 {
            assert_eq!(
                s.run(o).map(|r| r.0),
                seg_addr(
                    &[(0x10_0000, 0x2000), (0x50_0000, 0x800), (0x9000, 0x3000)],
                    o
                )
            );
        }
    }

    #[test]
    fn a_page_whose_middle_lies_elsewhere_is_refused() {
        // The first and last bytes of the page are where a contiguous page
        // would have them; the bytes between are not.
        let s =
            Segments::new(&[(0x10_0000, 0x800), (0x70_0000, 0x400), (0x10_0c00, 0x400)]).unwrap();
        assert!(s.data_ptr(0, PAGE).unwrap_err().contains("contiguous"));
        assert!(s.data_ptr(0, 0x800).is_ok());
    }

    #[test]
    fn data_pointers_split_at_memory_pages() {
        // Inside one page: PRP1 only.
        let p = data_ptr(scattered, 0x200, 512).unwrap();
        assert_eq!(
            p,
            DataPtr {
                prp1: 0x10_0200,
                pages: vec![]
            }
        );
        // Across one page boundary: PRP1 and one page.
        let p = data_ptr(scattered, 0x200, PAGE).unwrap();
        assert_eq!(p.prp1, 0x10_0200);
        assert_eq!(p.pages, vec![0x20_0000]);
        // Many pages from a page-aligned start.
        let p = data_ptr(scattered, PAGE, 5 * PAGE + 1).unwrap();
        assert_eq!(p.prp1, 0x20_0000);
        assert_eq!(
            p.pages,
            vec![0x30_0000, 0x40_0000, 0x50_0000, 0x60_0000, 0x70_0000]
        );
        assert!(data_ptr(scattered, 2, 8).unwrap_err().contains("dword"));
        assert!(data_ptr(scattered, 23 * PAGE, 2 * PAGE).is_err());
        assert!(data_ptr(scattered, 0, 0).is_err());
    }

    #[test]
    fn a_page_split_for_the_device_is_refused() {
        // Byte 0x800 of each page jumps elsewhere.
        let split = |o: usize| {
            Some(if o % PAGE < 0x800 {
                (o as u64, 0x800 - o % PAGE)
            } else {
                (0x80_0000 + o as u64, PAGE - o % PAGE)
            })
        };
        assert!(data_ptr(split, 0, 0x1000)
            .unwrap_err()
            .contains("contiguous"));
        // A later page that is not page aligned for the device.
        let shifted = |o: usize| {
            Some(if o < PAGE {
                (o as u64, PAGE - o)
            } else {
                (0x10 + o as u64, 8 * PAGE)
            })
        };
        assert!(data_ptr(shifted, 0, 2 * PAGE)
            .unwrap_err()
            .contains("aligned"));
    }
}
