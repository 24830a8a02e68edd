//! A `DeviceMemory` that hands out the DMA side of memory it does not
//! keep: the transfer would write memory freed on return.
#![forbid(unsafe_code)]

use p2pdma::memory::{DeviceMemory, DmaMemory, HostMemory, MemoryKind};

#[derive(Debug)]
struct Forgetful;

impl DeviceMemory for Forgetful {
    fn len(&self) -> usize {
        4096
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn write_at(&self, _offset: usize, _src: &[u8]) -> p2pdma::Result<()> {
        Ok(())
    }
    fn read_at(&self, _offset: usize, _dst: &mut [u8]) -> p2pdma::Result<()> {
        Ok(())
    }
    fn dma(&self) -> Option<&dyn DmaMemory> {
        let scratch = HostMemory::new(4096).ok()?;
        Some(&scratch)
    }
}

fn main() {}
