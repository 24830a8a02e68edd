//! The safe path to DMA, under `forbid(unsafe_code)`: memory allocated
//! from the module (or host memory, or memory that lends its DMA side from
//! memory it owns), mapped for a controller this process drives, given to
//! a command as a payload; block I/O on an allocation the caller owns; a
//! mapping released by handing it back. Compiled and linked here; `main`
//! does not call it, which would take a module and a spare controller.
#![forbid(unsafe_code)]

use std::{fs::File, sync::Arc};

use p2pdma::{
    memory::{DeviceMemory, DmaMemory, HostMemory, MemoryKind, PeerAccess},
    queues::{Controller, InitOptions, IoCommand},
    Module, ModuleMemory, PciAddress, Peer,
};

/// Host memory whose copies are counted, lending the DMA side of the
/// memory it owns.
#[derive(Debug)]
struct Counted {
    inner: HostMemory,
    copies: std::sync::atomic::AtomicU64,
}

impl DeviceMemory for Counted {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn kind(&self) -> MemoryKind {
        self.inner.kind()
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> p2pdma::Result<()> {
        self.copies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.write_at(offset, src)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> p2pdma::Result<()> {
        self.inner.read_at(offset, dst)
    }
    fn dma(&self) -> Option<&dyn DmaMemory> {
        self.inner.dma()
    }
}

fn read_blocks(module: Arc<Module>, pci: PciAddress, nvme: &File) -> p2pdma::Result<()> {
    let ctrl = Controller::initialize(module.clone(), pci, &InitOptions::default())?;
    let mem = ModuleMemory::alloc(module.clone(), 0, 1 << 20, 0)?;
    let host = Counted {
        inner: HostMemory::new(1 << 20)?,
        copies: Default::default(),
    };
    let into_accel = ctrl.map(&mem, 0, 4096, PeerAccess::WriteOnly)?;
    let into_host = ctrl.map(&host, 0, 4096, PeerAccess::WriteOnly)?;
    ctrl.scope(|s| -> p2pdma::Result<()> {
        let a = IoCommand::read(1, 0, 8, into_accel.payload(0, 4096)?);
        let h = IoCommand::read(1, 8, 8, into_host.payload(0, 4096)?);
        let (a, h) = (s.submit(0, &a)?, s.submit(0, &h)?);
        a.wait()?;
        h.wait()?;
        Ok(())
    })?;
    let seg = p2pdma_abi::P2pdmaIoSeg {
        mem_offset: 0,
        dev_offset: 0,
        len: 4096,
    };
    mem.block_io(nvme, false, &[seg], 1)?;
    let alloc = module.alloc(0, 4096, 0)?;
    alloc.block_io(nvme, false, &[seg], 1)?;
    alloc.map()?.write_at(0, &[0xa5; 64])?;
    let mapping = module.dma_map(alloc.handle(), 0, 4096, Peer::Pci(pci))?;
    module.unmap(mapping)?;
    alloc.free()
}

fn main() {
    let _ = read_blocks;
}
