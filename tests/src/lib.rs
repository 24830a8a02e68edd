//! Shared pieces of the integration test programs.
#![deny(unsafe_code)]

pub mod cargo;
pub mod dmamem;
pub mod mdlayout;
pub mod nvme;

pub use p2pdma::sys::vfio;

/// The module's first accelerator (index order).
pub fn first_accelerator(module: &p2pdma::Module) -> Result<p2pdma::Accelerator, String> {
    module
        .accelerators()
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or_else(|| "no accelerator bound to p2pdma".to_string())
}

/// The rig's NVMe image content: 64-bit words from a splitmix64 stream keyed
/// by the word's index, so every aligned 8 bytes of the image are distinct
/// (for any practical size) and any misplaced or stale block is detected.
pub fn image_word(index: u64) -> u64 {
    let mut z = index.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the image bytes found at byte offset `offset` (8-aligned).
pub fn fill_image(offset: u64, buf: &mut [u8]) {
    assert_eq!(offset % 8, 0);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let w = image_word(offset / 8 + i as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// FNV-1a 64 of `data`, used to print short digests of what landed.
pub fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_words_do_not_repeat() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..(1 << 20) {
            assert!(seen.insert(image_word(i)), "word {i} repeats");
        }
    }

    #[test]
    fn fill_image_is_position_dependent() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill_image(0, &mut a);
        fill_image(4096, &mut b);
        assert_ne!(a, b);
        let mut c = vec![0u8; 8];
        fill_image(4096, &mut c);
        assert_eq!(c, b[..8]);
    }
}
