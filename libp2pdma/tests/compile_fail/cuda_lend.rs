//! Lending a host `Vec`'s address as CUDA device memory.
#![forbid(unsafe_code)]

use p2pdma::memory::CudaMemory;

fn main() {
    let v = vec![0u8; 4096];
    let _ = CudaMemory::lend(v.as_ptr() as u64, v.len(), ());
}
