//! The copy stage's helper threads: a landed bounce chunk is copied into
//! device memory in pieces, one on the calling thread and the others on
//! helpers, when one core cannot copy as fast as storage delivers (like
//! KvikIO's task splitting).
//!
//! `CopyPool::write` lends the helpers the caller's source bytes and
//! memory and returns only once every piece is done, on errors and panics
//! too: the borrows it took outlive every use of them, which is what makes
//! handing raw pointers to other threads sound here.
#![allow(unsafe_code)]

use std::{
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        mpsc::{channel, Receiver, Sender},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
};

use crate::{memory::DeviceMemory, Error, Result};

/// The smallest piece worth a helper: below it, waking a thread costs about
/// as much as the copy.
pub(crate) const MIN_PIECE: usize = 256 << 10;
/// Helpers a pool starts at most.
const MAX_HELPERS: usize = 63;

/// One piece of a copy, lent to a helper.
struct Piece {
    /// The memory to copy into. Lent by [`CopyPool::write`]'s caller, whose
    /// borrow outlives the piece (see there); the lifetime is erased only to
    /// cross the channel.
    mem: *const (dyn DeviceMemory + 'static),
    /// Where in it.
    at: usize,
    /// The source bytes, lent the same way.
    src: *const u8,
    len: usize,
    /// Told when the piece is done.
    done: Arc<Latch>,
}

// SAFETY: The pointers are to a `Sync` memory (`DeviceMemory: Sync`) and to
// bytes only read while the lender waits; a piece is used by one thread.
unsafe impl Send for Piece {}

impl Piece {
    /// Copies the piece and tells its latch, whatever happens.
    fn run(self) {
        let r = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: The lender keeps `mem` and `src[..len]` borrowed until
            // the latch says every piece is done (`CopyPool::write`), and
            // only reads `src` meanwhile.
            let (mem, src) =
                unsafe { (&*self.mem, std::slice::from_raw_parts(self.src, self.len)) };
            mem.write_at(self.at, src)
        }));
        let r = r.unwrap_or_else(|p| {
            let what = crate::error::panic_message(p.as_ref()).unwrap_or_else(|| "a panic".into());
            Err(Error::Panicked(format!("copy helper: {what}")))
        });
        // The piece's pointers are not used past this point.
        self.done.finish(r);
    }
}

/// Counts the pieces of one copy still running and keeps the first error.
struct Latch {
    state: Mutex<(usize, Option<Error>)>,
    cv: Condvar,
}

impl Latch {
    fn new(pending: usize) -> Self {
        Self {
            state: Mutex::new((pending, None)),
            cv: Condvar::new(),
        }
    }

    fn finish(&self, r: Result<()>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 -= 1;
        if let (Err(e), None) = (r, &s.1) {
            s.1 = Some(e);
        }
        if s.0 == 0 {
            self.cv.notify_all();
        }
    }

    /// Waits until every piece is done.
    fn wait(&self) -> std::sync::MutexGuard<'_, (usize, Option<Error>)> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.0 > 0 {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s
    }
}

/// Waits for a latch when dropped: the lender cannot leave
/// [`CopyPool::write`], not even by unwinding, while a helper still uses
/// what it lent.
struct WaitOnDrop<'a>(&'a Latch);

impl Drop for WaitOnDrop<'_> {
    fn drop(&mut self) {
        drop(self.0.wait());
    }
}

struct Helpers {
    tx: Sender<Piece>,
    threads: Vec<JoinHandle<()>>,
    rx: Arc<Mutex<Receiver<Piece>>>,
}

/// Helper threads for the copy stage, started when first needed and kept
/// for the engine's life.
#[derive(Default)]
pub(crate) struct CopyPool {
    helpers: Mutex<Option<Helpers>>,
}

impl std::fmt::Debug for CopyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyPool").finish_non_exhaustive()
    }
}

impl CopyPool {
    /// A sender to at least `n` helpers (fewer if threads cannot be
    /// started); `None` when there are none.
    fn sender(&self, n: usize) -> Option<Sender<Piece>> {
        let mut h = self.helpers.lock().unwrap_or_else(|p| p.into_inner());
        let h = h.get_or_insert_with(|| {
            let (tx, rx) = channel::<Piece>();
            Helpers {
                tx,
                threads: Vec::new(),
                rx: Arc::new(Mutex::new(rx)),
            }
        });
        while h.threads.len() < n.min(MAX_HELPERS) {
            let rx = h.rx.clone();
            let t = std::thread::Builder::new()
                .name("p2pdma-copy".into())
                .spawn(move || loop {
                    let piece = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    match piece {
                        Ok(p) => p.run(),
                        Err(_) => return,
                    }
                });
            match t {
                Ok(t) => h.threads.push(t),
                Err(_) => break,
            }
        }
        (!h.threads.is_empty()).then(|| h.tx.clone())
    }

    /// Copies `src` into `mem` at `at` in up to `threads` pieces of at least
    /// [`MIN_PIECE`] bytes: the first on the calling thread, the others on
    /// helpers. Returns once every piece is done, with the first error.
    pub(crate) fn write(
        &self,
        mem: &dyn DeviceMemory,
        at: usize,
        src: &[u8],
        threads: usize,
    ) -> Result<()> {
        let n = threads.min(src.len() / MIN_PIECE).max(1);
        let tx = match n {
            1 => None,
            n => self.sender(n - 1),
        };
        let Some(tx) = tx else {
            return mem.write_at(at, src);
        };
        // Pieces of whole 4 KiB pages, the last one taking the rest.
        let piece = (src.len() / n).next_multiple_of(4096);
        let latch = Arc::new(Latch::new(src.len().div_ceil(piece) - 1));
        let guard = WaitOnDrop(&latch);
        let mem_ptr: *const (dyn DeviceMemory + '_) = mem;
        // SAFETY: Only the lifetime is erased (same pointer, same layout):
        // `guard` keeps this call from returning or unwinding before every
        // piece holding the pointer is done, and `mem` is borrowed for the
        // whole call.
        let mem_ptr = unsafe {
            std::mem::transmute::<*const (dyn DeviceMemory + '_), *const (dyn DeviceMemory + 'static)>(
                mem_ptr,
            )
        };
        for off in (piece..src.len()).step_by(piece) {
            let len = piece.min(src.len() - off);
            let p = Piece {
                mem: mem_ptr,
                at: at + off,
                // SAFETY: `off < src.len()`.
                src: unsafe { src.as_ptr().add(off) },
                len,
                done: latch.clone(),
            };
            // A helper gone (it cannot be: they live as long as the pool):
            // the piece runs here.
            if let Err(back) = tx.send(p) {
                back.0.run();
            }
        }
        let first = mem.write_at(at, &src[..piece.min(src.len())]);
        drop(guard);
        let helpers = latch.wait().1.take();
        match (first, helpers) {
            (Err(e), _) | (Ok(()), Some(e)) => Err(e),
            (Ok(()), None) => Ok(()),
        }
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        let h = self
            .helpers
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = h {
            // Closing the channel ends every helper's loop.
            drop(h.tx);
            for t in h.threads {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{HostMemory, MemoryKind};
    use proptest::prelude::*;

    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        (0..len as u64)
            .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed) >> 23) as u8)
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the length, offset and thread count, the memory holds
        /// exactly the source where it was copied, and nothing changed
        /// around it.
        #[test]
        fn pieces_land_where_they_belong(
            len in 0usize..(3 << 20),
            at in 0usize..8192,
            threads in 1usize..6,
            seed in any::<u64>(),
        ) {
            let size = (3 << 20) + 8192;
            let mem = HostMemory::new(size).unwrap();
            mem.write_at(0, &vec![0xEE; size]).unwrap();
            let src = bytes(len, seed);
            let pool = CopyPool::default();
            pool.write(&mem, at, &src, threads).unwrap();
            let mut got = vec![0u8; size];
            mem.read_at(0, &mut got).unwrap();
            prop_assert!(got[..at].iter().all(|&b| b == 0xEE));
            prop_assert!(got[at..at + len] == src[..]);
            prop_assert!(got[at + len..].iter().all(|&b| b == 0xEE));
        }
    }

    /// Memory whose copies fail (or panic) past a given offset.
    #[derive(Debug)]
    struct Failing {
        inner: HostMemory,
        bad_from: usize,
        panic: bool,
    }

    impl DeviceMemory for Failing {
        fn len(&self) -> usize {
            self.inner.len()
        }
        fn kind(&self) -> MemoryKind {
            MemoryKind::Host
        }
        fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
            if offset >= self.bad_from {
                if self.panic {
                    panic!("bad memory at {offset}");
                }
                return Err(Error::InvalidArgument(format!("bad memory at {offset}")));
            }
            self.inner.write_at(offset, src)
        }
        fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
            self.inner.read_at(offset, dst)
        }
    }

    #[test]
    fn a_helper_error_or_panic_is_the_copy_s_error_and_the_pool_goes_on() {
        let src = bytes(4 << 20, 7);
        let pool = CopyPool::default();
        for panic in [false, true] {
            let mem = Failing {
                inner: HostMemory::new(4 << 20).unwrap(),
                bad_from: 2 << 20,
                panic,
            };
            let e = pool.write(&mem, 0, &src, 4).unwrap_err();
            match (panic, &e) {
                (false, Error::InvalidArgument(m)) => assert!(m.contains("bad memory"), "{m}"),
                (true, Error::Panicked(m)) => assert!(m.contains("bad memory"), "{m}"),
                _ => panic!("unexpected error {e:?}"),
            }
            // The pieces before the bad offset landed.
            let mut got = vec![0u8; 2 << 20];
            mem.inner.read_at(0, &mut got).unwrap();
            assert!(got[..] == src[..2 << 20]);
        }
        // The pool still works after a helper's panic.
        let mem = HostMemory::new(4 << 20).unwrap();
        pool.write(&mem, 0, &src, 4).unwrap();
        let mut got = vec![0u8; 4 << 20];
        mem.read_at(0, &mut got).unwrap();
        assert!(got == src);
    }
}
