//! A `DmaMemory` whose target is a `Vec` that safe code reads through
//! `&[u8]`: storage would write memory behind a shared reference.
#![forbid(unsafe_code)]

use p2pdma::memory::{DeviceMemory, DmaMemory, DmaTarget, MemoryKind};

#[derive(Debug)]
struct VecMemory(Vec<u8>);

impl DeviceMemory for VecMemory {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn write_at(&self, _offset: usize, _src: &[u8]) -> p2pdma::Result<()> {
        Ok(())
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> p2pdma::Result<()> {
        dst.copy_from_slice(&self.0[offset..offset + dst.len()]);
        Ok(())
    }
    fn dma(&self) -> Option<&dyn DmaMemory> {
        Some(self)
    }
}

impl DmaMemory for VecMemory {
    fn dma_target(&self) -> Option<DmaTarget> {
        Some(DmaTarget {
            ptr: self.0.as_ptr().cast_mut(),
            len: self.0.len(),
            p2p: false,
        })
    }
}

fn main() {}
