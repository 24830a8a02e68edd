//! GPUs the CUDA driver sees, and the kernel driver behind them: read once
//! for the doctor and the tools. The CUDA driver is loaded at run time
//! ([`crate::sys::cuda`]); a machine without one has no GPUs here.

use std::path::PathBuf;

use super::{PciAddress, Topology};
use crate::sys::cuda;

/// One CUDA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDevice {
    /// Its ordinal.
    pub ordinal: i32,
    /// Its name.
    pub name: String,
    /// Its memory, in bytes.
    pub total_memory: u64,
    /// Its PCI address.
    pub pci: Option<PciAddress>,
    /// Whether it exports its memory as dma-bufs (what peers import).
    pub dma_buf: bool,
    /// Whether it supports GPUDirect RDMA.
    pub rdma: bool,
}

/// The CUDA driver and its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaFacts {
    /// The driver API version, 1000 × major + 10 × minor.
    pub driver_version: i32,
    /// The driver library, when one was named instead of the loader's.
    pub library: Option<PathBuf>,
    /// The kernel driver's own line (`/proc/driver/nvidia/version`), if
    /// there is one.
    pub kernel_driver: Option<String>,
    /// The devices, by ordinal.
    pub devices: Vec<CudaDevice>,
}

impl CudaFacts {
    /// Whether the kernel driver is NVIDIA's open kernel module, whose
    /// dma-buf exporter gives peers the GPU's memory.
    pub fn open_kernel_module(&self) -> bool {
        self.kernel_driver
            .as_deref()
            .is_some_and(|l| l.contains("Open Kernel Module"))
    }
}

/// The CUDA driver's facts, or why there are none (no driver library, no
/// device, a driver too old).
pub fn cuda(topology: &Topology) -> Result<CudaFacts, String> {
    let d = cuda::driver().map_err(|e| e.to_string())?;
    let n = cuda::device_count().map_err(|e| e.to_string())?;
    let devices = (0..n)
        .map(|i| {
            cuda::device_facts(i)
                .map(|f| CudaDevice {
                    ordinal: f.ordinal,
                    name: f.name,
                    total_memory: f.total_memory,
                    pci: f.pci.parse().ok(),
                    dma_buf: f.dma_buf,
                    rdma: f.rdma,
                })
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CudaFacts {
        driver_version: d.version,
        library: d.library.clone(),
        kernel_driver: kernel_driver(topology),
        devices,
    })
}

/// The first line of `/proc/driver/nvidia/version`, trimmed.
pub fn kernel_driver(topology: &Topology) -> Option<String> {
    let text = std::fs::read_to_string(topology.proc_root().join("driver/nvidia/version")).ok()?;
    let line = text.lines().next()?.split_whitespace().collect::<Vec<_>>();
    (!line.is_empty()).then(|| line.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_kernel_module_is_told_by_its_version_line() {
        let root = tempfile::tempdir().unwrap();
        let proc = root.path().join("proc");
        std::fs::create_dir_all(proc.join("driver/nvidia")).unwrap();
        std::fs::write(
            proc.join("driver/nvidia/version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)\nGCC version:  gcc 12\n",
        )
        .unwrap();
        let t = Topology::with_roots(root.path().join("sys"), root.path().join("dev"), &proc);
        let line = kernel_driver(&t).unwrap();
        assert!(
            line.starts_with("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64 580.159.04"),
            "{line}"
        );
        let facts = CudaFacts {
            driver_version: 13000,
            library: None,
            kernel_driver: Some(line),
            devices: Vec::new(),
        };
        assert!(facts.open_kernel_module());
        std::fs::remove_file(proc.join("driver/nvidia/version")).unwrap();
        assert_eq!(kernel_driver(&t), None);
    }
}
