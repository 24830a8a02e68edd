//! [`copy`] between every pair of memory kinds a host has, against a copy
//! of `Vec`s; and how many passes over the bytes it makes.

use std::{
    fmt, ptr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
};

use proptest::prelude::*;

use super::copy;
use crate::{
    error::check_range,
    memory::{BorrowedHost, DeviceMemory, DmaMemory, HostMemory, MemoryKind},
    sys::DmaTarget,
    Error, Result,
};

/// The copies a test memory was asked for.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    read_at: AtomicUsize,
    write_at: AtomicUsize,
    read_at_raw: AtomicUsize,
    write_at_raw: AtomicUsize,
}

impl Calls {
    /// `read_at`, `write_at`, `read_at_raw` and `write_at_raw` calls so far.
    pub(crate) fn get(&self) -> [usize; 4] {
        [
            &self.read_at,
            &self.write_at,
            &self.read_at_raw,
            &self.write_at_raw,
        ]
        .map(|c| c.load(Ordering::SeqCst))
    }

    fn count(c: &AtomicUsize) {
        c.fetch_add(1, Ordering::SeqCst);
    }
}

/// Memory in a `Vec`, with no CPU mapping, that leaves copies from and to
/// another memory's mapping to the trait's defaults (staged through a host
/// buffer): memory like a GPU's.
#[derive(Debug)]
pub(crate) struct Plain {
    bytes: Mutex<Vec<u8>>,
    pub(crate) calls: Calls,
}

impl Plain {
    pub(crate) fn new(len: usize) -> Self {
        Self {
            bytes: Mutex::new(vec![0; len]),
            calls: Calls::default(),
        }
    }
}

impl DeviceMemory for Plain {
    fn len(&self) -> usize {
        self.bytes.lock().unwrap().len()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Dmabuf
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        Calls::count(&self.calls.write_at);
        let mut b = self.bytes.lock().unwrap();
        check_range(offset, src.len(), b.len())?;
        b[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        Calls::count(&self.calls.read_at);
        let b = self.bytes.lock().unwrap();
        check_range(offset, dst.len(), b.len())?;
        dst.copy_from_slice(&b[offset..offset + dst.len()]);
        Ok(())
    }
}

/// [`Plain`] memory whose copies from and to another memory's mapping
/// are its own: one copy, as a dma-buf mapping's are.
#[derive(Debug)]
pub(crate) struct Direct(pub(crate) Plain);

impl DeviceMemory for Direct {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn kind(&self) -> MemoryKind {
        self.0.kind()
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.0.write_at(offset, src)
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.0.read_at(offset, dst)
    }

    #[allow(unsafe_code)]
    unsafe fn write_at_raw(&self, offset: usize, src: *const u8, len: usize) -> Result<()> {
        Calls::count(&self.0.calls.write_at_raw);
        let mut b = self.0.bytes.lock().unwrap();
        check_range(offset, len, b.len())?;
        // SAFETY: In bounds of the `Vec` (checked), which the lock makes
        // this call's; `src` is readable (the caller's promise) and cannot
        // be the `Vec`, which no mapping holds.
        unsafe { ptr::copy_nonoverlapping(src, b.as_mut_ptr().add(offset), len) };
        Ok(())
    }

    #[allow(unsafe_code)]
    unsafe fn read_at_raw(&self, offset: usize, dst: *mut u8, len: usize) -> Result<()> {
        Calls::count(&self.0.calls.read_at_raw);
        let b = self.0.bytes.lock().unwrap();
        check_range(offset, len, b.len())?;
        // SAFETY: As in `write_at_raw`, `dst` writable.
        unsafe { ptr::copy_nonoverlapping(b.as_ptr().add(offset), dst, len) };
        Ok(())
    }
}

/// Memory that counts the copies it is asked for and lends the CPU mapping
/// of the memory it wraps, which it may call PCI memory (`pci`): copies
/// from and to it then take the write-combined routines.
pub(crate) struct Counted<M> {
    pub(crate) inner: M,
    pci: bool,
    pub(crate) calls: Calls,
}

impl Counted<HostMemory> {
    /// `len` bytes of host memory, counted.
    pub(crate) fn host(len: usize) -> Self {
        Self {
            inner: HostMemory::new(len).unwrap(),
            pci: false,
            calls: Calls::default(),
        }
    }

    /// `len` bytes whose mapping calls itself PCI memory.
    fn pci(len: usize) -> Self {
        Self {
            pci: true,
            ..Self::host(len)
        }
    }
}

impl<M: DeviceMemory> fmt::Debug for Counted<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counted")
            .field("inner", &self.inner)
            .field("pci", &self.pci)
            .finish()
    }
}

impl<M: DeviceMemory> DeviceMemory for Counted<M> {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn kind(&self) -> MemoryKind {
        self.inner.kind()
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        Calls::count(&self.calls.write_at);
        self.inner.write_at(offset, src)
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        Calls::count(&self.calls.read_at);
        self.inner.read_at(offset, dst)
    }

    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

// SAFETY: The wrapped memory's own answer, which this value holds; only the
// kind of memory it claims may differ.
#[allow(unsafe_code)]
unsafe impl<M: DeviceMemory> DmaMemory for Counted<M> {
    fn dma_target(&self) -> Option<DmaTarget> {
        let t = self.inner.dma()?.dma_target()?;
        Some(DmaTarget { p2p: self.pci, ..t })
    }
}

/// A kind of memory a host has.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// The host-memory device (mapped).
    Host,
    /// A writable loan of a `Vec` (mapped).
    Loan,
    /// A read-only loan of a `Vec` (no mapping: copies its own raw ranges).
    ReadOnlyLoan,
    /// No mapping, raw ranges staged by the defaults.
    Plain,
    /// No mapping, raw ranges copied at once.
    Direct,
    /// Memory mapped for the CPU that calls itself PCI memory.
    Pci,
}

const KINDS: [Kind; 6] = [
    Kind::Host,
    Kind::Loan,
    Kind::ReadOnlyLoan,
    Kind::Plain,
    Kind::Direct,
    Kind::Pci,
];

/// Memory of `kind` holding `bytes`.
fn memory(kind: Kind, bytes: &[u8]) -> Box<dyn DeviceMemory> {
    let len = bytes.len();
    let lend = |writable: bool| {
        let mut v = bytes.to_vec();
        let ptr = v.as_mut_ptr();
        #[allow(unsafe_code)]
        // SAFETY: The loan keeps the `Vec`, whose heap buffer moving it
        // leaves in place, and nothing else uses it.
        let m = unsafe { BorrowedHost::new(ptr, len, writable, Box::new(v)) };
        Box::new(m) as Box<dyn DeviceMemory>
    };
    let m: Box<dyn DeviceMemory> = match kind {
        Kind::Host => Box::new(HostMemory::new(len).unwrap()),
        Kind::Loan => return lend(true),
        Kind::ReadOnlyLoan => return lend(false),
        Kind::Plain => Box::new(Plain::new(len)),
        Kind::Direct => Box::new(Direct(Plain::new(len))),
        Kind::Pci => Box::new(Counted::pci(len)),
    };
    m.write_at(0, bytes).unwrap();
    m
}

fn contents(m: &dyn DeviceMemory) -> Vec<u8> {
    let mut v = vec![0u8; m.len()];
    m.read_at(0, &mut v).unwrap();
    v
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 32) as u8
                ^ seed
        })
        .collect()
}

/// Where the reference says `copy` lands, or `None` when it must refuse.
fn reference(
    src: &[u8],
    src_offset: usize,
    dst: &[u8],
    dst_offset: usize,
    len: usize,
) -> Option<Vec<u8>> {
    let from = src.get(src_offset..src_offset.checked_add(len)?)?;
    let mut out = dst.to_vec();
    out.get_mut(dst_offset..dst_offset + len)?
        .copy_from_slice(from);
    Some(out)
}

/// A copy's offsets and length: mostly in range, sometimes past an end.
fn span(src_len: usize, dst_len: usize) -> impl Strategy<Value = (usize, usize, usize)> {
    (0..=src_len + 8, 0..=dst_len + 8).prop_flat_map(move |(s, d)| {
        let fits = src_len.saturating_sub(s).min(dst_len.saturating_sub(d));
        let len = prop_oneof![4 => 0..=fits, 1 => 0..=fits + 64, 1 => Just(usize::MAX - s.min(8))];
        (Just(s), Just(d), len)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Between two memories of any kinds: the bytes a `Vec` copy gives, or,
    /// out of range, an error and nothing changed on either side.
    #[test]
    fn copies_between_any_two_kinds_like_a_vec_copy(
        (s, d) in (0..KINDS.len(), 0..KINDS.len()),
        ((src_len, dst_len), (src_offset, dst_offset, len)) in (1..9000usize, 1..9000usize)
            .prop_flat_map(|(a, b)| (Just((a, b)), span(a, b))),
        seed in any::<u8>(),
    ) {
        let (sk, dk) = (KINDS[s], KINDS[d]);
        let (a, b) = (pattern(seed, src_len), pattern(seed ^ 0x5A, dst_len));
        let (src, dst) = (memory(sk, &a), memory(dk, &b));
        let r = copy(src.as_ref(), src_offset, dst.as_ref(), dst_offset, len);
        match reference(&a, src_offset, &b, dst_offset, len) {
            // A read-only loan takes no bytes, but refuses only when some
            // are to land.
            Some(_) if matches!(dk, Kind::ReadOnlyLoan) && len > 0 => {
                prop_assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
                prop_assert!(contents(dst.as_ref()) == b);
            }
            Some(want) => {
                prop_assert!(r.is_ok(), "{sk:?} to {dk:?}: {r:?}");
                prop_assert!(contents(dst.as_ref()) == want, "{sk:?} to {dk:?}");
            }
            None => {
                prop_assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{r:?}");
                prop_assert!(contents(dst.as_ref()) == b, "a refused copy wrote");
            }
        }
        prop_assert!(contents(src.as_ref()) == a, "the copy changed its source");
    }

    /// Within one memory, overlapping or not: the bytes `copy_within` gives.
    #[test]
    fn copies_within_one_memory_like_copy_within(
        k in 0..KINDS.len(),
        (mem_len, (src_offset, dst_offset, len)) in (1..9000usize)
            .prop_flat_map(|n| (Just(n), span(n, n))),
        seed in any::<u8>(),
    ) {
        let kind = KINDS[k];
        let a = pattern(seed, mem_len);
        let m = memory(kind, &a);
        let r = copy(m.as_ref(), src_offset, m.as_ref(), dst_offset, len);
        let fits = |o: usize| o.checked_add(len).is_some_and(|e| e <= mem_len);
        let mut want = a.clone();
        if !fits(src_offset) || !fits(dst_offset) {
            prop_assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{r:?}");
        } else if matches!(kind, Kind::ReadOnlyLoan) && len > 0 {
            prop_assert!(r.is_err());
        } else {
            prop_assert!(r.is_ok(), "{kind:?}: {r:?}");
            want.copy_within(src_offset..src_offset + len, dst_offset);
        }
        prop_assert!(contents(m.as_ref()) == want, "{kind:?}");
    }
}

#[test]
fn large_copies_go_in_pieces_and_overlapping_ones_in_the_safe_order() {
    let len = (9 << 20) + 5;
    let data = pattern(7, len + 3);
    // Neither side mapped: staged through a host buffer, in pieces.
    let src = memory(Kind::Plain, &data);
    let dst = Plain::new(len + 7);
    copy(src.as_ref(), 3, &dst, 7, len).unwrap();
    assert!(contents(&dst)[7..] == data[3..], "the copy differs");
    assert!(
        dst.calls.get()[1] >= 3,
        "not in pieces: {:?}",
        dst.calls.get()
    );
    // Shifted by less than a piece, both ways, within mapped and unmapped
    // memory.
    for kind in [Kind::Host, Kind::Plain, Kind::Pci] {
        for (from, to) in [(0, 4097), (4097, 0)] {
            let m = memory(kind, &data);
            copy(m.as_ref(), from, m.as_ref(), to, len - 4097).unwrap();
            let mut want = data.clone();
            want.copy_within(from..from + len - 4097, to);
            assert!(contents(m.as_ref()) == want, "{kind:?} {from} to {to}");
        }
    }
}

#[test]
fn a_copy_out_of_range_moves_nothing() {
    let src = HostMemory::new(9 << 20).unwrap();
    src.write_at(0, &pattern(1, 9 << 20)).unwrap();
    let small = memory(Kind::Direct, &[9u8; 5 << 20]);
    assert!(matches!(
        copy(&src, 0, small.as_ref(), 0, 6 << 20),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(contents(small.as_ref()).iter().all(|&b| b == 9));
    assert!(matches!(
        copy(&src, 9 << 20, small.as_ref(), 0, 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        copy(&src, 1, small.as_ref(), usize::MAX, 2),
        Err(Error::OutOfBounds { .. })
    ));
}

/// One memory of each kind whose copies are counted, as the source or the
/// destination of a copy of 1 MiB.
enum Side {
    Host(Counted<HostMemory>),
    Pci(Counted<HostMemory>),
    Plain(Plain),
    Direct(Direct),
}

impl Side {
    fn mem(&self) -> (&dyn DeviceMemory, &Calls) {
        match self {
            Side::Host(m) | Side::Pci(m) => (m, &m.calls),
            Side::Plain(m) => (m, &m.calls),
            Side::Direct(m) => (m, &m.0.calls),
        }
    }
}

#[test]
fn a_copy_is_one_pass_where_either_side_is_mapped() {
    let n = 1 << 20;
    let data = pattern(3, n);
    let host = || Side::Host(Counted::host(n));
    let pci = || Side::Pci(Counted::pci(n));
    let plain = || Side::Plain(Plain::new(n));
    let direct = || Side::Direct(Direct(Plain::new(n)));
    // The calls each side gets (`read_at`, `write_at`, `read_at_raw`,
    // `write_at_raw`): none between two mappings; the other memory's own
    // raw copy where one side is mapped; staged where neither is, or where
    // the source is PCI memory, which only its own streaming loads read.
    let cases = [
        (host(), host(), [0, 0, 0, 0], [0, 0, 0, 0]),
        (host(), pci(), [0, 0, 0, 0], [0, 0, 0, 0]),
        (pci(), pci(), [0, 0, 0, 0], [0, 0, 0, 0]),
        (host(), direct(), [0, 0, 0, 0], [0, 0, 0, 1]),
        (direct(), pci(), [0, 0, 1, 0], [0, 0, 0, 0]),
        (pci(), direct(), [1, 0, 0, 0], [0, 1, 0, 0]),
        (host(), plain(), [0, 0, 0, 0], [0, 1, 0, 0]),
        (plain(), direct(), [1, 0, 0, 0], [0, 1, 0, 0]),
    ];
    for (from, to, want_from, want_to) in cases {
        let ((src, src_calls), (dst, dst_calls)) = (from.mem(), to.mem());
        src.write_at(0, &data).unwrap();
        let before = (src_calls.get(), dst_calls.get());
        copy(src, 1, dst, 2, n - 2).unwrap();
        let sub = |a: [usize; 4], b: [usize; 4]| std::array::from_fn(|i| a[i] - b[i]);
        let calls: ([usize; 4], [usize; 4]) = (
            sub(src_calls.get(), before.0),
            sub(dst_calls.get(), before.1),
        );
        assert_eq!(calls, (want_from, want_to), "{src:?} to {dst:?}");
        assert!(contents(dst)[2..] == data[1..n - 1], "{src:?} to {dst:?}");
    }
}
