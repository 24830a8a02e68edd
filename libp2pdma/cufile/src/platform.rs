//! What cuFile says about the machine: the P2P modes of each filesystem or
//! device type (`cuFileDriverGetP2PFlags`/`SetP2PFlags`), a GPU's BAR1
//! size (`cuFileGetBARSizeInKB`) and the PCIe topology
//! (`cuFileExportPCIeTopology`).
//!
//! This library's P2P is the kernel's PCI P2PDMA, so NVMe (local and over
//! fabrics) reports `CU_FILE_P2P_FLAG_PCI_P2PDMA` from the open (unless
//! `CUFILE_PARAM_USE_PCIP2PDMA` was false or compatibility mode forced),
//! and the other types nothing. The BAR size is read from sysfs at the
//! GPU's PCI address, which the CUDA driver gives; the topology is the one
//! libp2pdma's discovery reads (`p2pdma::Topology`), written as JSON.

use std::{
    ffi::{c_char, c_int, CStr},
    fmt::Write as _,
    path::Path,
};

use libc::size_t;
use p2pdma::sys::cuda;

use crate::{
    abi::{dstatus, p2p, CUfileError},
    driver,
    errors::{guard, Fail, Res},
    params,
};

/// The P2P flags that may be set on this architecture: PCI P2PDMA on
/// x86_64 (and other non-Arm machines), chip to chip on aarch64.
pub const SETTABLE: u32 = if cfg!(target_arch = "aarch64") {
    1 << p2p::C2C
} else {
    1 << p2p::P2PDMA
};

fn target_type(status_flag: c_int) -> Res<usize> {
    usize::try_from(status_flag)
        .ok()
        .filter(|&t| t < dstatus::MAX_TARGET_TYPES as usize)
        .ok_or(Fail::INVALID)
}

/// The P2P flags of a filesystem or device type (a
/// `CUfileDriverStatusFlags_t`).
///
/// # Safety
/// `p2p_flags` is NULL or writable for an `int`.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetP2PFlags(
    status_flag: c_int,
    p2p_flags: *mut u32,
) -> CUfileError {
    guard(|| {
        driver::engine()?;
        let t = target_type(status_flag)?;
        if p2p_flags.is_null() {
            return Err(Fail::INVALID);
        }
        let v = params::lock().p2p[t];
        // SAFETY: Non-null, writable by the caller's contract.
        unsafe { p2p_flags.write_unaligned(v) };
        Ok(())
    })
}

/// Sets the P2P flags of a type: [`SETTABLE`] or 0 (NVIDIA's library
/// answers other flags with an error its header does not define; this one
/// says `CU_FILE_INVALID_VALUE`). The engine's path for transfers already
/// running does not change.
#[no_mangle]
pub extern "C" fn cuFileDriverSetP2PFlags(status_flag: c_int, p2p_flags: u32) -> CUfileError {
    guard(|| {
        driver::engine()?;
        let t = target_type(status_flag)?;
        if p2p_flags & !SETTABLE != 0 {
            return Err(Fail::INVALID);
        }
        params::lock().p2p[t] = p2p_flags;
        Ok(())
    })
}

/// The size of region `bar` of the PCI device at `pci` under `sys`, from
/// its `resource` file (one `start end flags` line per region).
pub fn bar_size(sys: &Path, pci: &str, bar: usize) -> Option<u64> {
    let text =
        std::fs::read_to_string(sys.join("bus/pci/devices").join(pci).join("resource")).ok()?;
    let line = text.lines().nth(bar)?;
    let mut f = line
        .split_whitespace()
        .map(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
    let (start, end) = (f.next()??, f.next()??);
    (end > start).then(|| end - start + 1)
}

/// The BAR1 size of GPU `gpuIndex` in KB: `CU_FILE_INVALID_VALUE` for
/// NULL or an index the CUDA driver does not have, and for a GPU whose
/// BAR1 sysfs does not show (an emulated one).
///
/// # Safety
/// `barSize` is NULL or writable for a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetBARSizeInKB(
    gpuIndex: c_int,
    barSize: *mut size_t,
) -> CUfileError {
    guard(|| {
        driver::engine()?;
        if barSize.is_null() || gpuIndex < 0 || !driver::cuda() {
            return Err(Fail::INVALID);
        }
        let n = cuda::device_count().map_err(Fail::from)?;
        if gpuIndex >= n {
            return Err(Fail::INVALID);
        }
        let pci = cuda::Context::primary(gpuIndex)
            .ok()
            .and_then(|c| c.pci().map(str::to_owned))
            .ok_or(Fail::INVALID)?;
        // NVIDIA GPUs map their memory through BAR1 (resource 1).
        let size = bar_size(Path::new("/sys"), &pci, 1).ok_or(Fail::INVALID)?;
        // SAFETY: Non-null, writable by the caller's contract.
        unsafe { barSize.write_unaligned((size >> 10) as size_t) };
        Ok(())
    })
}

/// Escapes `s` for a JSON string.
fn json(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The PCIe topology as JSON: every PCI function with its class and the
/// bridges above it, the GPUs the CUDA driver sees, and the NVMe block
/// devices with their controllers.
pub fn topology_json(sys: &Path) -> String {
    let mut out = String::from("{\n  \"pci_devices\": [");
    let dir = sys.join("bus/pci/devices");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for (i, name) in names.iter().enumerate() {
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(name).join(f))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        // The real path names the bridges on the way: /sys/devices/pci0000:00/0000:00:01.0/...
        let path = std::fs::canonicalize(dir.join(name))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let upstream: Vec<String> = path
            .split('/')
            .filter(|c| c.len() == 12 && c.as_bytes()[4] == b':' && c != name)
            .map(json)
            .collect();
        let _ = write!(
            out,
            "{}\n    {{\"address\": {}, \"class\": {}, \"vendor\": {}, \"device\": {}, \"upstream\": [{}]}}",
            if i == 0 { "" } else { "," },
            json(name),
            json(&read("class")),
            json(&read("vendor")),
            json(&read("device")),
            upstream.join(", ")
        );
    }
    out.push_str("\n  ],\n  \"gpus\": [");
    let gpus = if driver::cuda() {
        cuda::device_count().unwrap_or(0)
    } else {
        0
    };
    for g in 0..gpus {
        let pci = cuda::Context::primary(g)
            .ok()
            .and_then(|c| c.pci().map(str::to_owned))
            .unwrap_or_default();
        let _ = write!(
            out,
            "{}\n    {{\"index\": {g}, \"address\": {}}}",
            if g == 0 { "" } else { "," },
            json(&pci)
        );
    }
    out.push_str("\n  ],\n  \"nvme\": [");
    let mut blocks: Vec<String> = std::fs::read_dir(sys.join("block"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("nvme"))
                .collect()
        })
        .unwrap_or_default();
    blocks.sort();
    for (i, b) in blocks.iter().enumerate() {
        let dev = std::fs::canonicalize(sys.join("block").join(b).join("device"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = write!(
            out,
            "{}\n    {{\"block\": {}, \"device\": {}}}",
            if i == 0 { "" } else { "," },
            json(b),
            json(&dev)
        );
    }
    out.push_str("\n  ]\n}\n");
    out
}

/// Writes the PCIe topology, as JSON, to `filename`:
/// `CU_FILE_INVALID_VALUE` for NULL, an empty name or a file that cannot
/// be written.
///
/// # Safety
/// `filename` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cuFileExportPCIeTopology(filename: *const c_char) -> CUfileError {
    guard(|| {
        if filename.is_null() {
            return Err(Fail::INVALID);
        }
        // SAFETY: NUL-terminated by the caller's contract.
        let name = unsafe { CStr::from_ptr(filename) }
            .to_str()
            .map_err(|_| Fail::INVALID)?;
        if name.is_empty() {
            return Err(Fail::INVALID);
        }
        driver::engine()?;
        std::fs::write(name, topology_json(Path::new("/sys"))).map_err(|_| Fail::INVALID)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_sizes_come_from_the_resource_file() {
        let d = tempfile::tempdir().unwrap();
        let dev = d.path().join("bus/pci/devices/0000:01:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(
            dev.join("resource"),
            "0x00000000fb000000 0x00000000fbffffff 0x0000000000040200\n\
             0x0000038000000000 0x0000039fffffffff 0x000000000014220c\n\
             0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
        )
        .unwrap();
        assert_eq!(bar_size(d.path(), "0000:01:00.0", 0), Some(16 << 20));
        assert_eq!(bar_size(d.path(), "0000:01:00.0", 1), Some(128 << 30));
        assert_eq!(bar_size(d.path(), "0000:01:00.0", 2), None);
        assert_eq!(bar_size(d.path(), "0000:02:00.0", 1), None);
    }

    #[test]
    fn the_topology_is_json() {
        assert_eq!(json("a\"b\\\n"), "\"a\\\"b\\\\\\u000a\"");
        let d = tempfile::tempdir().unwrap();
        let t = topology_json(d.path());
        assert!(t.contains("\"pci_devices\": [\n  ]"), "{t}");
        assert!(t.contains("\"nvme\": ["), "{t}");
    }

    #[test]
    fn only_the_architectures_p2p_flag_can_be_set() {
        assert_eq!(SETTABLE.count_ones(), 1);
        assert_eq!(SETTABLE & (1 << p2p::NVFS | 1 << p2p::DMABUF), 0);
    }
}
