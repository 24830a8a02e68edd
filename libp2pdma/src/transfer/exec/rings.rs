//! Host memory for the staging rings of routes, kept between copies.

use std::sync::Mutex;

use crate::{
    memory::{DeviceMemory, HostMemory},
    Result,
};

/// Host memory for staging rings, kept between copies so that a copy does
/// not pay for mapping and faulting in fresh memory: at most
/// [`RingPool::KEEP`] buffers and [`RingPool::KEEP_BYTES`] in all.
#[derive(Default)]
pub struct RingPool {
    free: Mutex<Vec<HostMemory>>,
}

impl RingPool {
    /// The most buffers kept.
    pub const KEEP: usize = 8;
    /// The most bytes kept.
    pub const KEEP_BYTES: usize = 1 << 30;

    /// A buffer of at least `len` bytes, every page already faulted in.
    pub fn take(&self, len: usize) -> Result<HostMemory> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let fit = free
            .iter()
            .enumerate()
            .filter(|(_, m)| m.len() >= len)
            .min_by_key(|(_, m)| m.len())
            .map(|(i, _)| i);
        if let Some(i) = fit {
            return Ok(free.swap_remove(i));
        }
        drop(free);
        let m = HostMemory::new(len)?;
        m.prefault();
        Ok(m)
    }

    /// Keeps `m` for a later copy, dropping the largest buffers past the
    /// limits.
    pub fn give(&self, m: HostMemory) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.push(m);
        free.sort_by_key(|m| m.len());
        while free.len() > Self::KEEP
            || free.iter().map(|m| m.len()).sum::<usize>() > Self::KEEP_BYTES
        {
            free.pop();
        }
    }
}
