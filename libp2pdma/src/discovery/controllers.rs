//! NVMe controllers by what sysfs says of them: which has a serial number,
//! which block devices are its namespaces, and what uses them.

use std::{
    fs,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use super::{devnum::DevNum, mounts::parse_mountinfo_line};

fn pci_dev(bdf: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(bdf)
}

/// The PCI address of the NVMe controller whose serial number is `serial`,
/// while the kernel's nvme driver has it.
pub fn nvme_by_serial(serial: &str) -> Result<String, String> {
    let dir = fs::read_dir("/sys/class/nvme").map_err(|e| format!("/sys/class/nvme: {e}"))?;
    for entry in dir.flatten() {
        let p = entry.path();
        if fs::read_to_string(p.join("serial")).is_ok_and(|s| s.trim() == serial) {
            let dev = fs::canonicalize(p.join("device"))
                .map_err(|e| format!("{}/device: {e}", p.display()))?;
            return dev
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| format!("{} has no PCI device", p.display()));
        }
    }
    Err(format!(
        "no NVMe controller with serial {serial} in /sys/class/nvme"
    ))
}

/// The block devices of the controller's namespaces, and their
/// partitions (`nvme0n1`, `nvme0n1p1`, ...), while the nvme driver has it.
fn block_devices(bdf: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(ctrls) = fs::read_dir(pci_dev(bdf).join("nvme")) else {
        return out;
    };
    for c in ctrls.flatten() {
        let Ok(entries) = fs::read_dir(c.path()) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("nvme") || !Path::new("/sys/block").join(&name).exists() {
                continue;
            }
            if let Ok(parts) = fs::read_dir(Path::new("/sys/block").join(&name)) {
                for p in parts.flatten() {
                    let pn = p.file_name().to_string_lossy().into_owned();
                    if pn.starts_with(&name) {
                        out.push(pn);
                    }
                }
            }
            out.push(name);
        }
    }
    // Namespaces of a multipath head are block devices of the subsystem
    // (nvmeXcYnZ paths are hidden): their heads are listed by the
    // controller's `nvme` directory too, as nvmeXnY.
    out.sort();
    out.dedup();
    out
}

/// The device number of block device `name`.
fn dev_numbers(name: &str) -> Option<DevNum> {
    fs::read_to_string(Path::new("/sys/class/block").join(name).join("dev"))
        .ok()
        .and_then(|s| DevNum::parse(&s))
}

/// What uses the block devices of the controller: mounted filesystems,
/// swap, holders (device mapper, md), exclusive openers.
pub fn controller_users(bdf: &str) -> Vec<String> {
    let devs = block_devices(bdf);
    let mut used = Vec::new();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let swaps = fs::read_to_string("/proc/swaps").unwrap_or_default();
    for d in &devs {
        if let Some(mm) = dev_numbers(d) {
            for m in mountinfo.lines().filter_map(parse_mountinfo_line) {
                if m.dev == mm {
                    used.push(format!("/dev/{d} is mounted on {}", m.mount_point));
                }
            }
        }
        if swaps
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(&format!("/dev/{d}")))
        {
            used.push(format!("/dev/{d} is a swap device"));
        }
        if let Ok(h) = fs::read_dir(Path::new("/sys/class/block").join(d).join("holders")) {
            for h in h.flatten() {
                used.push(format!(
                    "/dev/{d} is held by {}",
                    h.file_name().to_string_lossy()
                ));
            }
        }
        // An exclusive opener (a filesystem in a namespace of another mount
        // namespace, a database on the raw device) makes O_EXCL fail.
        let node = Path::new("/dev").join(d);
        if node.exists() {
            if let Err(e) = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_EXCL)
                .open(&node)
            {
                if e.raw_os_error() == Some(libc::EBUSY) && !used.iter().any(|u| u.contains(d)) {
                    used.push(format!("/dev/{d} is open exclusively by another user"));
                }
            }
        }
    }
    used
}
