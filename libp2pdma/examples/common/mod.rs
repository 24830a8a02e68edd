//! What the examples share: memory on the first accelerator the p2pdma
//! module has bound, or host memory where there is none, and a checksum of
//! what landed in it.

use std::sync::Arc;

use p2pdma::{DeviceMemory, HostMemory, Module, ModuleMemory};

/// Memory for transfers, and the module it came from (none for host memory).
pub type Memory = (Arc<dyn DeviceMemory>, Option<Arc<Module>>);

/// `len` bytes of accelerator memory and the module it came from, or host
/// memory (and no module) on a machine without one.
pub fn memory(len: usize) -> p2pdma::Result<Memory> {
    if let Ok(module) = Module::open() {
        let module = Arc::new(module);
        if let Some(accel) = module.accelerators()?.first() {
            let mem = ModuleMemory::alloc(module.clone(), accel.index, len as u64, 0)?;
            return Ok((Arc::new(mem), Some(module)));
        }
    }
    Ok((Arc::new(HostMemory::new(len)?), None))
}

/// FNV-1a over `len` bytes of `mem` from `offset`, read back by the CPU.
pub fn fnv1a(mem: &dyn DeviceMemory, offset: usize, len: usize) -> p2pdma::Result<u64> {
    let mut bytes = vec![0u8; len];
    mem.read_at(offset, &mut bytes)?;
    Ok(bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }))
}
