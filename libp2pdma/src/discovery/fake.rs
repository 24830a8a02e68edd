//! A fake system in a temporary directory: sysfs, `/dev` and procfs trees
//! shaped like the kernel's, for the tests of the topology and the doctor.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use super::topology::Topology;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "p2pdma-test-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Where the fake PCI devices sit: a switch (upstream port 01:00.0,
/// downstream ports 02:00.0 and 02:01.0) below root port 00:01.0, with
/// the NVMe controller at 03:00.0 and the accelerator at 04:00.0;
/// a SATA controller at 05:00.0 below root port 00:02.0, and a second
/// accelerator at 06:00.0 below root port 00:03.0.
pub const RP1: &str = "devices/pci0000:00/0000:00:01.0";
pub const USP: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
pub const DSP0: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0";
pub const DSP1: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0";
pub const NVME: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0";
pub const ACCEL: &str = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0";
pub const RP2: &str = "devices/pci0000:00/0000:00:02.0";
pub const SATA: &str = "devices/pci0000:00/0000:00:02.0/0000:05:00.0";
pub const RP3: &str = "devices/pci0000:00/0000:00:03.0";
pub const ACCEL2: &str = "devices/pci0000:00/0000:00:03.0/0000:06:00.0";
pub const NS: &str =
    "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/nvme/nvme0/nvme0n1";

/// A fake machine.
pub struct FakeSys {
    pub tmp: TempDir,
}

impl FakeSys {
    /// An empty tree.
    pub fn empty() -> Self {
        let tmp = TempDir::new("sys");
        for d in ["sys", "dev", "proc/self", "proc/sys/kernel", "boot"] {
            fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        Self { tmp }
    }

    /// The machine described at [`RP1`], with NVMe namespace
    /// `nvme0n1` (partition `nvme0n1p1` at sector 2048), its generic
    /// device `ng0n1`, `sda` with `sda1`, `nvme2n1` and `nvme10n1`
    /// without PCI parents, and IOMMU groups 0 to 5.
    pub fn machine() -> Self {
        let f = Self::empty();
        f.pci(RP1, 0x8086, 0x29c4, 0x060400, Some(1));
        f.pci(USP, 0x10b5, 0x8747, 0x060400, Some(2));
        f.pci(DSP0, 0x10b5, 0x8747, 0x060400, Some(2));
        f.pci(DSP1, 0x10b5, 0x8747, 0x060400, Some(2));
        f.pci(NVME, 0x1b36, 0x0010, 0x010802, Some(2));
        f.pci(ACCEL, 0x1af4, 0x1110, 0x050000, Some(2));
        f.pci(RP2, 0x8086, 0x29c4, 0x060400, Some(3));
        f.pci(SATA, 0x8086, 0x2922, 0x010601, Some(4));
        f.pci(RP3, 0x8086, 0x29c4, 0x060400, Some(5));
        f.pci(ACCEL2, 0x1af4, 0x1110, 0x050000, Some(5));
        f.file("devices/pci0000:00/0000:00:00.0/vendor", "0x8086\n");
        for g in 0..6 {
            f.dir(&format!("kernel/iommu_groups/{g}/devices"));
            f.file(&format!("kernel/iommu_groups/{g}/type"), "DMA\n");
        }
        f.link(&format!("{ACCEL}/driver"), "bus/pci/drivers/p2pdma");
        f.link(&format!("{NVME}/driver"), "bus/pci/drivers/nvme");
        f.file(&format!("{ACCEL}/p2pmem/size"), "67108864\n");
        f.file(&format!("{ACCEL}/p2pmem/available"), "62914560\n");
        f.file(&format!("{ACCEL}/p2pmem/published"), "1\n");
        f.file(&format!("{ACCEL2}/p2pmem/size"), "1048576\n");
        f.file(&format!("{ACCEL2}/p2pmem/available"), "1048576\n");

        // The NVMe controller, its namespace, a partition and the
        // generic device.
        f.dir("class/nvme");
        f.dir("class/nvme-generic");
        f.dir("class/block");
        f.dir("class/mem");
        let ctrl = format!("{NVME}/nvme/nvme0");
        f.file(&format!("{ctrl}/dev"), "242:0\n");
        f.link(&format!("{ctrl}/subsystem"), "class/nvme");
        f.link("dev/char/242:0", &ctrl);
        f.disk(NS, "nvme0n1", "259:0", 512, 128, Some(1));
        let part = format!("{NS}/nvme0n1p1");
        f.file(&format!("{part}/partition"), "1\n");
        f.file(&format!("{part}/start"), "2048\n");
        f.file(&format!("{part}/size"), "204800\n");
        f.file(
            &format!("{part}/uevent"),
            "MAJOR=259\nMINOR=1\nDEVNAME=nvme0n1p1\n",
        );
        f.link("dev/block/259:1", &part);
        let ng = format!("{ctrl}/ng0n1");
        f.file(&format!("{ng}/dev"), "241:0\n");
        f.file(
            &format!("{ng}/uevent"),
            "MAJOR=241\nMINOR=0\nDEVNAME=ng0n1\n",
        );
        f.link(&format!("{ng}/subsystem"), "class/nvme-generic");
        f.link("class/nvme-generic/ng0n1", &ng);
        f.link("dev/char/241:0", &ng);

        // A SATA disk.
        let sda = format!("{SATA}/ata1/host0/target0:0:0/0:0:0:0/block/sda");
        f.disk(&sda, "sda", "8:0", 4096, 32767, None);
        let sda1 = format!("{sda}/sda1");
        f.file(&format!("{sda1}/partition"), "1\n");
        f.file(&format!("{sda1}/start"), "8\n");
        f.file(&format!("{sda1}/size"), "100\n");
        f.link("dev/block/8:1", &sda1);

        // Namespaces without PCI parents (fabrics), for the listing's
        // order, and a hidden multipath path device.
        f.disk(
            "devices/virtual/nvme-fabrics/ctl/nvme10/nvme10n1",
            "nvme10n1",
            "259:10",
            512,
            256,
            Some(1),
        );
        f.disk(
            "devices/virtual/nvme-fabrics/ctl/nvme2/nvme2n1",
            "nvme2n1",
            "259:2",
            512,
            256,
            Some(1),
        );
        f.disk(
            &format!("{ctrl}/nvme0c0n2"),
            "nvme0c0n2",
            "259:7",
            512,
            128,
            Some(2),
        );

        // /dev/null, a character device of another class.
        f.link("devices/virtual/mem/null/subsystem", "class/mem");
        f.link("dev/char/1:3", "devices/virtual/mem/null");

        f.root_file("proc/sys/kernel/osrelease", "7.3.0-test\n");
        f
    }

    pub fn root(&self) -> &Path {
        self.tmp.path()
    }

    pub fn sys(&self) -> PathBuf {
        self.root().join("sys")
    }

    pub fn topology(&self) -> Topology {
        Topology::with_roots(
            self.sys(),
            self.root().join("dev"),
            self.root().join("proc"),
        )
    }

    /// Creates directory `rel` of sysfs.
    pub fn dir(&self, rel: &str) {
        fs::create_dir_all(self.sys().join(rel)).unwrap();
    }

    /// Writes file `rel` of sysfs.
    pub fn file(&self, rel: &str, content: &str) {
        self.bytes(rel, content.as_bytes());
    }

    /// Writes file `rel` of sysfs.
    pub fn bytes(&self, rel: &str, content: &[u8]) {
        let p = self.sys().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    /// Writes file `rel` of the fake root (`dev/...`, `proc/...`).
    pub fn root_file(&self, rel: &str, content: &str) {
        let p = self.root().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    /// Makes sysfs symlink `rel` point at sysfs path `target`.
    pub fn link(&self, rel: &str, target: &str) {
        let l = self.sys().join(rel);
        fs::create_dir_all(l.parent().unwrap()).unwrap();
        let t = self.sys().join(target);
        fs::create_dir_all(&t).unwrap();
        let _ = fs::remove_file(&l);
        symlink(t, l).unwrap();
    }

    /// A PCI function at sysfs path `rel` (its last component is its
    /// address).
    pub fn pci(&self, rel: &str, vendor: u16, device: u16, class: u32, group: Option<u32>) {
        self.file(&format!("{rel}/vendor"), &format!("0x{vendor:04x}\n"));
        self.file(&format!("{rel}/device"), &format!("0x{device:04x}\n"));
        self.file(&format!("{rel}/class"), &format!("0x{class:06x}\n"));
        let name = rel.rsplit('/').next().unwrap();
        self.link(&format!("bus/pci/devices/{name}"), rel);
        if let Some(g) = group {
            self.link(
                &format!("{rel}/iommu_group"),
                &format!("kernel/iommu_groups/{g}"),
            );
        }
    }

    /// A whole disk at sysfs path `rel`, in `/sys/block` and
    /// `/sys/dev/block`.
    pub fn disk(&self, rel: &str, name: &str, dev: &str, lbs: u32, max_kb: u32, nsid: Option<u32>) {
        self.file(&format!("{rel}/dev"), &format!("{dev}\n"));
        let (maj, min) = dev.split_once(':').unwrap();
        self.file(
            &format!("{rel}/uevent"),
            &format!("MAJOR={maj}\nMINOR={min}\nDEVNAME={name}\nDEVTYPE=disk\n"),
        );
        self.file(
            &format!("{rel}/queue/logical_block_size"),
            &format!("{lbs}\n"),
        );
        self.file(
            &format!("{rel}/queue/max_hw_sectors_kb"),
            &format!("{max_kb}\n"),
        );
        if let Some(n) = nsid {
            self.file(&format!("{rel}/nsid"), &format!("{n}\n"));
        }
        self.link(&format!("{rel}/subsystem"), "class/block");
        self.link(&format!("block/{name}"), rel);
        self.link(&format!("dev/block/{dev}"), rel);
    }
}

/// An extended config space whose capability list is AER at 0x100,
/// then (when `acs` is given) ACS at 0x148 with that control register.
pub fn config_space(acs: Option<u16>) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    let next = if acs.is_some() { 0x148u32 } else { 0 };
    let aer = 0x0001 | (1 << 16) | (next << 20);
    c[0x100..0x104].copy_from_slice(&aer.to_le_bytes());
    if let Some(ctrl) = acs {
        let hdr = 0x000du32 | (1 << 16);
        c[0x148..0x14c].copy_from_slice(&hdr.to_le_bytes());
        c[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&ctrl.to_le_bytes());
    }
    c
}
