//! Copy routines for write-combined device memory, chosen at run time by CPU
//! features (the gdrcopy approach).
//!
//! Writes into a WC mapping are fastest as full-line streaming stores
//! (`MOVNTDQ`/`VMOVNTDQ`) that fill write-combining buffers without reading
//! the destination; reads from WC (uncached) memory are fastest as streaming
//! loads (`MOVNTDQA`), which fetch a whole line where ordinary loads would
//! each cross the bus. Unaligned heads and tails are copied with ordinary
//! moves, and a store fence makes the writes globally visible before the
//! copy returns.
//!
//! Writes shorter than [`SMALL_STORE`] use ordinary stores and the fence:
//! stores to WC memory are write-combined whatever their kind, so for a few
//! lines the streaming loop only adds its set-up, and should the memory be
//! cached after all, streaming stores would evict each line they touch.
//!
//! This is one of the crate's two raw layers (with `sys`): the functions take
//! raw pointers because device memory is never exposed as Rust references.
#![allow(unsafe_code)]

use std::sync::OnceLock;

/// The instruction set a copy routine uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyIsa {
    /// 32-byte AVX streaming stores and loads.
    Avx2,
    /// 16-byte SSE streaming stores and SSE4.1 streaming loads.
    Sse41,
    /// 16-byte SSE2 streaming stores, ordinary loads.
    Sse2,
    /// Ordinary `memcpy`.
    Plain,
}

impl CopyIsa {
    /// The best routine this CPU supports (detected once).
    pub fn detect() -> Self {
        static ISA: OnceLock<CopyIsa> = OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2") {
                    return CopyIsa::Avx2;
                }
                if std::is_x86_feature_detected!("sse4.1") {
                    return CopyIsa::Sse41;
                }
                CopyIsa::Sse2
            }
            #[cfg(not(target_arch = "x86_64"))]
            CopyIsa::Plain
        })
    }

    /// Every routine this CPU can run, best first (for tests and benchmarks).
    pub fn available() -> Vec<Self> {
        let all = [CopyIsa::Avx2, CopyIsa::Sse41, CopyIsa::Sse2, CopyIsa::Plain];
        let best = all.iter().position(|&i| i == Self::detect()).unwrap_or(3);
        all[best..].to_vec()
    }
}

/// Copies `len` bytes from `src` into write-combined memory at `dst`.
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the
/// ranges must not overlap.
pub unsafe fn copy_to_wc(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: Forwarded from the caller.
    unsafe { copy_to_wc_with(CopyIsa::detect(), dst, src, len) }
}

/// Copies `len` bytes from write-combined memory at `src` into `dst`.
///
/// # Safety
///
/// As for [`copy_to_wc`].
pub unsafe fn copy_from_wc(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: Forwarded from the caller.
    unsafe { copy_from_wc_with(CopyIsa::detect(), dst, src, len) }
}

/// Makes this thread's earlier stores to write-combined memory visible to
/// devices and other cores before its later stores: `sfence` on x86-64
/// (write-combined stores are weakly ordered and buffered per core);
/// `dmb oshst` on AArch64 (stores to Normal non-cacheable memory, ordered
/// against later stores for every observer in the outer shareable domain,
/// devices included); a sequentially consistent fence elsewhere.
#[inline]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is part of SSE, which every x86-64 CPU has; it only
    // orders stores.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: A barrier instruction: no memory, register or flag changes.
    unsafe {
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Writes below this many bytes use ordinary stores (then the fence).
pub const SMALL_STORE: usize = 256;

/// [`copy_to_wc`] with a given routine.
///
/// # Safety
///
/// As for [`copy_to_wc`], and the CPU must support `isa`.
pub unsafe fn copy_to_wc_with(isa: CopyIsa, dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: Forwarded from the caller; each routine checks nothing more.
    unsafe {
        if len < SMALL_STORE && isa != CopyIsa::Plain {
            std::ptr::copy_nonoverlapping(src, dst, len);
            #[cfg(target_arch = "x86_64")]
            std::arch::x86_64::_mm_sfence();
            return;
        }
        match isa {
            #[cfg(target_arch = "x86_64")]
            CopyIsa::Avx2 => x86::store_avx2(dst, src, len),
            #[cfg(target_arch = "x86_64")]
            CopyIsa::Sse41 | CopyIsa::Sse2 => x86::store_sse2(dst, src, len),
            _ => std::ptr::copy_nonoverlapping(src, dst, len),
        }
    }
}

/// [`copy_from_wc`] with a given routine.
///
/// # Safety
///
/// As for [`copy_to_wc`], and the CPU must support `isa`.
pub unsafe fn copy_from_wc_with(isa: CopyIsa, dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: Forwarded from the caller.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            CopyIsa::Avx2 => x86::load_avx2(dst, src, len),
            #[cfg(target_arch = "x86_64")]
            CopyIsa::Sse41 => x86::load_sse41(dst, src, len),
            _ => std::ptr::copy_nonoverlapping(src, dst, len),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Bytes before `p` reaches an `align` boundary, at most `len`.
    fn head(p: usize, align: usize, len: usize) -> usize {
        ((align - p % align) % align).min(len)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn store_avx2(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: The caller guarantees both ranges; every access below stays
        // inside them, and `d` is 32-byte aligned for the streaming stores.
        unsafe {
            let h = head(dst as usize, 32, len);
            std::ptr::copy_nonoverlapping(src, dst, h);
            let (mut d, mut s, mut n) = (dst.add(h), src.add(h), len - h);
            while n >= 128 {
                let a = _mm256_loadu_si256(s.cast());
                let b = _mm256_loadu_si256(s.add(32).cast());
                let c = _mm256_loadu_si256(s.add(64).cast());
                let e = _mm256_loadu_si256(s.add(96).cast());
                _mm256_stream_si256(d.cast(), a);
                _mm256_stream_si256(d.add(32).cast(), b);
                _mm256_stream_si256(d.add(64).cast(), c);
                _mm256_stream_si256(d.add(96).cast(), e);
                (d, s, n) = (d.add(128), s.add(128), n - 128);
            }
            while n >= 32 {
                _mm256_stream_si256(d.cast(), _mm256_loadu_si256(s.cast()));
                (d, s, n) = (d.add(32), s.add(32), n - 32);
            }
            std::ptr::copy_nonoverlapping(s, d, n);
            _mm_sfence();
        }
    }

    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn store_sse2(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: As in `store_avx2`, with 16-byte alignment.
        unsafe {
            let h = head(dst as usize, 16, len);
            std::ptr::copy_nonoverlapping(src, dst, h);
            let (mut d, mut s, mut n) = (dst.add(h), src.add(h), len - h);
            while n >= 64 {
                let a = _mm_loadu_si128(s.cast());
                let b = _mm_loadu_si128(s.add(16).cast());
                let c = _mm_loadu_si128(s.add(32).cast());
                let e = _mm_loadu_si128(s.add(48).cast());
                _mm_stream_si128(d.cast(), a);
                _mm_stream_si128(d.add(16).cast(), b);
                _mm_stream_si128(d.add(32).cast(), c);
                _mm_stream_si128(d.add(48).cast(), e);
                (d, s, n) = (d.add(64), s.add(64), n - 64);
            }
            while n >= 16 {
                _mm_stream_si128(d.cast(), _mm_loadu_si128(s.cast()));
                (d, s, n) = (d.add(16), s.add(16), n - 16);
            }
            std::ptr::copy_nonoverlapping(s, d, n);
            _mm_sfence();
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn load_avx2(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: As in `store_avx2`, with `s` 32-byte aligned for the
        // streaming loads.
        unsafe {
            let h = head(src as usize, 32, len);
            std::ptr::copy_nonoverlapping(src, dst, h);
            let (mut d, mut s, mut n) = (dst.add(h), src.add(h), len - h);
            _mm_mfence();
            while n >= 128 {
                let a = _mm256_stream_load_si256(s.cast());
                let b = _mm256_stream_load_si256(s.add(32).cast());
                let c = _mm256_stream_load_si256(s.add(64).cast());
                let e = _mm256_stream_load_si256(s.add(96).cast());
                _mm256_storeu_si256(d.cast(), a);
                _mm256_storeu_si256(d.add(32).cast(), b);
                _mm256_storeu_si256(d.add(64).cast(), c);
                _mm256_storeu_si256(d.add(96).cast(), e);
                (d, s, n) = (d.add(128), s.add(128), n - 128);
            }
            while n >= 32 {
                _mm256_storeu_si256(d.cast(), _mm256_stream_load_si256(s.cast()));
                (d, s, n) = (d.add(32), s.add(32), n - 32);
            }
            std::ptr::copy_nonoverlapping(s, d, n);
        }
    }

    #[target_feature(enable = "sse4.1")]
    pub(super) unsafe fn load_sse41(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: As in `load_avx2`, with 16-byte alignment.
        unsafe {
            let h = head(src as usize, 16, len);
            std::ptr::copy_nonoverlapping(src, dst, h);
            let (mut d, mut s, mut n) = (dst.add(h), src.add(h), len - h);
            _mm_mfence();
            while n >= 64 {
                let a = _mm_stream_load_si128(s.cast_mut().cast());
                let b = _mm_stream_load_si128(s.add(16).cast_mut().cast());
                let c = _mm_stream_load_si128(s.add(32).cast_mut().cast());
                let e = _mm_stream_load_si128(s.add(48).cast_mut().cast());
                _mm_storeu_si128(d.cast(), a);
                _mm_storeu_si128(d.add(16).cast(), b);
                _mm_storeu_si128(d.add(32).cast(), c);
                _mm_storeu_si128(d.add(48).cast(), e);
                (d, s, n) = (d.add(64), s.add(64), n - 64);
            }
            while n >= 16 {
                _mm_storeu_si128(d.cast(), _mm_stream_load_si128(s.cast_mut().cast()));
                (d, s, n) = (d.add(16), s.add(16), n - 16);
            }
            std::ptr::copy_nonoverlapping(s, d, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
            .collect()
    }

    #[test]
    fn every_routine_copies_every_alignment_and_length() {
        for isa in CopyIsa::available() {
            for len in [
                0,
                1,
                15,
                16,
                31,
                32,
                63,
                64,
                127,
                128,
                129,
                255,
                256,
                257,
                4096,
                65536 + 7,
            ] {
                for (doff, soff) in [(0, 0), (1, 0), (0, 3), (7, 13), (31, 1)] {
                    let src = pattern(len + soff, len as u8);
                    let mut dst = vec![0xEEu8; len + doff + 8];
                    // SAFETY: Both buffers cover the ranges.
                    unsafe {
                        copy_to_wc_with(
                            isa,
                            dst.as_mut_ptr().add(doff),
                            src.as_ptr().add(soff),
                            len,
                        )
                    };
                    assert_eq!(
                        &dst[doff..doff + len],
                        &src[soff..],
                        "{isa:?} store {len} {doff}/{soff}"
                    );
                    assert!(
                        dst[..doff].iter().all(|&b| b == 0xEE),
                        "{isa:?} wrote before the range"
                    );
                    assert!(
                        dst[doff + len..].iter().all(|&b| b == 0xEE),
                        "{isa:?} wrote past the range"
                    );

                    let mut back = vec![0x11u8; len + soff + 8];
                    // SAFETY: Both buffers cover the ranges.
                    unsafe {
                        copy_from_wc_with(
                            isa,
                            back.as_mut_ptr().add(soff),
                            dst.as_ptr().add(doff),
                            len,
                        )
                    };
                    assert_eq!(
                        &back[soff..soff + len],
                        &src[soff..],
                        "{isa:?} load {len} {doff}/{soff}"
                    );
                    assert!(
                        back[soff + len..].iter().all(|&b| b == 0x11),
                        "{isa:?} load overran"
                    );
                }
            }
        }
    }
}
