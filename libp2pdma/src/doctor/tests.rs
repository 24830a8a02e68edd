use std::{fs, io::Write, os::unix::fs::MetadataExt};

use flate2::{write::GzEncoder, Compression};

use rustix::io::Errno;
use std::os::fd::AsFd;

use super::{
    checks::{kernel_config_check, p2p_memory_check},
    report::{bytes, wrap, TEXT_WIDTH},
    *,
};
use crate::discovery::{
    fake::{config_space, FakeSys, ACCEL, DSP0, DSP1, NS, NVME, USP},
    pci::{PCI_ACS_RR, PCI_ACS_SV},
    DevNum,
};
use crate::{discovery::DEVICE_NODE, transfer::plan::TransferPath, Accelerator, Error, PciAddress};

#[test]
fn kernel_configs_parse() {
    let c = KernelConfig::parse(
        "/x",
        "#\n# comment\nCONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\n# CONFIG_IO_URING is not set\nCONFIG_FOO=m\nCONFIG_NAME=\"a=b\"\nNOT_CONFIG=y\n",
    );
    assert!(c.enabled("CONFIG_PCI_P2PDMA"));
    assert!(c.enabled("CONFIG_FOO"));
    assert!(!c.enabled("CONFIG_IO_URING"));
    assert_eq!(c.get("CONFIG_IO_URING"), None);
    assert_eq!(c.get("CONFIG_NAME"), Some("a=b"));
    assert_eq!(c.get("NOT_CONFIG"), None);
    assert_eq!(c.describe("CONFIG_IO_URING"), "CONFIG_IO_URING is not set");
    assert_eq!(c.describe("CONFIG_FOO"), "CONFIG_FOO=m");
}

fn doctor(f: &FakeSys) -> Doctor {
    Doctor::new()
        .topology(f.topology())
        .node(f.root().join("dev/p2pdma"))
        .boot_root(f.root().join("boot"))
}

#[test]
fn kernel_config_comes_from_proc_config_gz_then_boot() {
    let f = FakeSys::empty();
    f.root_file("proc/sys/kernel/osrelease", "7.3.0-test\n");
    let d = doctor(&f);
    let e = d.kernel_config().unwrap_err();
    assert!(
        e.contains("config.gz") && e.contains("config-7.3.0-test"),
        "{e}"
    );
    let check = kernel_config_check(&d.kernel_config());
    assert_eq!(check.status, Status::Skip);

    f.root_file(
        "boot/config-7.3.0-test",
        "CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\n# CONFIG_IO_URING is not set\n",
    );
    let c = d.kernel_config().unwrap();
    assert_eq!(c.source, f.root().join("boot/config-7.3.0-test"));
    let check = kernel_config_check(&Ok(c));
    assert_eq!(check.status, Status::Warn);
    assert!(
        check
            .detail
            .starts_with("CONFIG_PCI_P2PDMA=y, CONFIG_ZONE_DEVICE=y, CONFIG_IO_URING is not set ("),
        "{}",
        check.detail
    );

    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(b"CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\nCONFIG_IO_URING=y\n")
        .unwrap();
    fs::write(f.root().join("proc/config.gz"), gz.finish().unwrap()).unwrap();
    let c = d.kernel_config().unwrap();
    assert_eq!(c.source, f.root().join("proc/config.gz"));
    assert_eq!(kernel_config_check(&Ok(c)).status, Status::Ok);

    fs::write(f.root().join("proc/config.gz"), b"not gzip").unwrap();
    let e = d.kernel_config().unwrap_err();
    assert!(
        e.starts_with("cannot read") && e.contains("config.gz"),
        "{e}"
    );

    let c = KernelConfig::parse("/k", "CONFIG_ZONE_DEVICE=y\n");
    let check = kernel_config_check(&Ok(c));
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.detail.contains("CONFIG_PCI_P2PDMA is not set"),
        "{}",
        check.detail
    );
}

/// The fake machine with a real file whose filesystem is partition
/// `nvme0n1p1`, or `sda1` when `nvme` is false.
fn machine_with_file(nvme: bool) -> (FakeSys, std::path::PathBuf) {
    let f = FakeSys::machine();
    let file = f.root().join("data.bin");
    fs::write(&file, b"x").unwrap();
    let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
    let target = if nvme {
        format!("{NS}/nvme0n1p1")
    } else {
        format!(
            "{}/ata1/host0/target0:0:0/0:0:0:0/block/sda/sda1",
            crate::discovery::fake::SATA
        )
    };
    f.link(&format!("dev/block/{dev}"), &target);
    (f, file)
}

#[test]
fn the_queues_check_says_which_controller_the_library_can_drive_and_why_not() {
    let f = FakeSys::machine();
    let nvme = crate::discovery::fake::NVME.rsplit('/').next().unwrap();
    let queues = |f: &FakeSys| {
        doctor(f)
            .run(None, AccelSelect::Auto)
            .check("nvme queues")
            .cloned()
            .unwrap()
    };
    // IOMMU groups and an IOMMU: translated, refused with the reason.
    f.dir("class/iommu/dmar0");
    let c = queues(&f);
    assert_eq!(c.status, Status::Skip, "{}", c.detail);
    assert!(
        c.detail
            .contains(&format!("{nvme} (nvme, behind an IOMMU (group 2))")),
        "{}",
        c.detail
    );
    assert!(c.detail.contains("FOLL_PCI_P2PDMA"), "{}", c.detail);
    // No IOMMU, no-IOMMU mode off: how to turn it on.
    fs::remove_dir_all(f.root().join("sys/class/iommu")).unwrap();
    let c = queues(&f);
    assert_eq!(c.status, Status::Skip, "{}", c.detail);
    assert!(
        c.detail.contains("enable_unsafe_noiommu_mode=1"),
        "{}",
        c.detail
    );
    // No-IOMMU mode on: the nvme driver's controller can be taken when
    // asked, one bound to vfio-pci can be driven now.
    f.file("module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
    let c = queues(&f);
    assert_eq!(c.status, Status::Ok, "{}", c.detail);
    assert!(c.detail.contains("InitOptions::unbind"), "{}", c.detail);
    f.link(
        &format!("{}/driver", crate::discovery::fake::NVME),
        "bus/pci/drivers/vfio-pci",
    );
    let c = queues(&f);
    assert_eq!(c.status, Status::Ok, "{}", c.detail);
    assert!(
        c.detail.contains(&format!("can drive {nvme} itself")),
        "{}",
        c.detail
    );
    // No NVMe controller at all.
    let c = queues(&FakeSys::empty());
    assert_eq!(
        (c.status, c.detail.as_str()),
        (Status::Skip, "no NVMe controller")
    );
}

#[test]
fn without_the_module_the_doctor_still_examines_storage_and_pci() {
    let (f, file) = machine_with_file(true);
    let accel: PciAddress = "0000:04:00.0".parse().unwrap();
    let r = doctor(&f).run(Some(&file), AccelSelect::Pci(accel));
    let names: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        [
            "kernel config",
            "kernel module",
            "device node",
            "accelerator",
            "p2p memory",
            "storage",
            "p2p",
            "iommu",
            "acs",
            "nvme passthrough",
            "nvme queues",
            "gpu memory",
            "page cache"
        ]
    );
    let get = |n: &str| r.check(n).unwrap().clone();
    assert_eq!(get("kernel config").status, Status::Skip);
    let m = get("kernel module");
    assert_eq!(m.status, Status::Fail);
    assert!(m.detail.contains("not loaded"), "{}", m.detail);
    let n = get("device node");
    assert_eq!(n.status, Status::Fail);
    assert!(
        n.detail
            .ends_with("does not exist: the p2pdma module is not loaded"),
        "{}",
        n.detail
    );
    let a = get("accelerator");
    assert_eq!(a.status, Status::Skip);
    assert!(
        a.detail.contains("0000:04:00.0 is used for the PCI checks"),
        "{}",
        a.detail
    );
    assert_eq!(get("p2p memory").status, Status::Skip);
    let s = get("storage");
    assert_eq!(s.status, Status::Ok, "{}", s.detail);
    assert!(
        s.detail.contains("lives on partition nvme0n1p1 of disk nvme0n1, namespace 1 of nvme0 at 0000:03:00.0; 512-byte blocks, at most 128 KiB a command; the partition starts at byte 1048576"),
        "{}",
        s.detail
    );
    assert_eq!(get("p2p").status, Status::Skip);
    let i = get("iommu");
    assert_eq!(i.status, Status::Ok, "{}", i.detail);
    assert_eq!(
        i.detail,
        "IOMMU on (6 groups); accelerator 0000:04:00.0 in group 2, DMA, NVMe 0000:03:00.0 in group 2, DMA: one group, so nothing isolates them from each other"
    );
    // No config space in the fake tree.
    assert_eq!(get("acs").status, Status::Skip);
    // The generic device node does not exist.
    let p = get("nvme passthrough");
    assert_eq!(p.status, Status::Warn);
    assert!(p.detail.starts_with("cannot open"), "{}", p.detail);
    assert_eq!(r.nvme_cmd, None);

    assert_eq!(r.path.path, TransferPath::Bounce);
    assert!(
        r.path.reason.contains("kernel module is not available"),
        "{}",
        r.path.reason
    );
    assert!(r.storage.as_ref().is_some_and(|t| t.is_nvme));
    assert!(r.accelerator.is_none() && r.p2p.is_none());
}

#[test]
fn a_namespace_with_metadata_is_reported_unfit_for_nvme_commands() {
    let (f, file) = machine_with_file(true);
    f.file(&format!("{NS}/metadata_bytes"), "8\n");
    f.root_file("dev/ng0n1", "");
    let accel: PciAddress = "0000:04:00.0".parse().unwrap();
    let r = doctor(&f).run(Some(&file), AccelSelect::Pci(accel));
    let p = r.check("nvme passthrough").unwrap();
    assert_eq!(p.status, Status::Warn);
    assert_eq!(
        p.detail,
        format!(
            "NVMe commands through {} refused: nvme0n1 is formatted with 8 bytes of metadata per block: \
             the library's NVMe commands carry no metadata buffer (P2P and bounce I/O go through the block layer, which handles the metadata)",
            f.root().join("dev/ng0n1").display()
        )
    );
    assert_eq!(r.nvme_cmd, None);
    // Storage and the P2P decision are not affected.
    assert_eq!(r.check("storage").unwrap().status, Status::Ok);
    assert_eq!(r.to_json()["storage"]["metadata_bytes"], 8);
}

#[test]
fn a_multipath_namespace_is_reported_with_every_path() {
    let f = FakeSys::machine();
    let head = "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1";
    f.disk(head, "nvme1n1", "259:30", 512, 128, Some(3));
    let nvme2 = format!("{ACCEL}/nvme/nvme2/nvme1c2n1");
    for (name, dir) in [
        ("nvme1c1n1", format!("{NVME}/nvme/nvme1/nvme1c1n1")),
        ("nvme1c2n1", nvme2),
    ] {
        f.dir(&dir);
        f.link(&format!("{head}/multipath/{name}"), &dir);
    }
    let file = f.root().join("mp.bin");
    fs::write(&file, b"x").unwrap();
    let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
    f.link(&format!("dev/block/{dev}"), head);
    let accel: PciAddress = "0000:04:00.0".parse().unwrap();
    let r = doctor(&f).run(Some(&file), AccelSelect::Pci(accel));
    let s = r.check("storage").unwrap();
    assert_eq!(s.status, Status::Ok, "{}", s.detail);
    assert!(
        s.detail.contains(
            "lives on disk nvme1n1, namespace 3, a multipath namespace with 2 paths: \
             nvme1c1n1 (nvme1 at 0000:03:00.0), nvme1c2n1 (nvme2 at 0000:04:00.0); 512-byte blocks"
        ),
        "{}",
        s.detail
    );
    let t = r.storage.as_ref().unwrap();
    assert_eq!(t.multipath.len(), 2);
    assert_eq!(
        r.to_json()["storage"]["multipath"][1]["controller"],
        "nvme2"
    );
}

#[test]
fn acs_redirect_on_the_path_is_reported_with_the_boot_parameter() {
    let (f, file) = machine_with_file(true);
    for dev in [ACCEL, USP, DSP0, NVME] {
        f.bytes(&format!("{dev}/config"), &config_space(None));
    }
    f.bytes(
        &format!("{DSP1}/config"),
        &config_space(Some(PCI_ACS_SV | PCI_ACS_RR)),
    );
    let accel = AccelSelect::Pci("0000:04:00.0".parse().unwrap());
    let r = doctor(&f).run(Some(&file), accel);
    let acs = r.check("acs").unwrap();
    assert_eq!(acs.status, Status::Warn);
    assert!(acs.detail.contains("(0000:02:01.0 RR)"), "{}", acs.detail);
    assert!(
        acs.detail.ends_with("pci=disable_acs_redir=0000:02:01.0"),
        "{}",
        acs.detail
    );

    f.bytes(&format!("{DSP1}/config"), &config_space(Some(PCI_ACS_SV)));
    let r = doctor(&f).run(Some(&file), accel);
    let acs = r.check("acs").unwrap();
    assert_eq!(acs.status, Status::Ok);
    assert_eq!(
        acs.detail,
        "no ACS redirect between them (0000:04:00.0 no ACS, 0000:02:01.0 ACS SV, 0000:01:00.0 no ACS, 0000:03:00.0 no ACS, 0000:02:00.0 no ACS)"
    );

    // Unprivileged readers get the first 64 bytes only.
    f.bytes(&format!("{USP}/config"), &config_space(None)[..64]);
    let r = doctor(&f).run(Some(&file), accel);
    let acs = r.check("acs").unwrap();
    assert_eq!(acs.status, Status::Skip);
    assert!(
        acs.detail
            .contains("0000:01:00.0 (64 bytes readable): reading it needs root"),
        "{}",
        acs.detail
    );
}

#[test]
fn devices_that_meet_only_at_a_host_bridge_get_the_allowlist_warning() {
    let (f, file) = machine_with_file(true);
    let accel = AccelSelect::Pci("0000:06:00.0".parse().unwrap());
    let r = doctor(&f).run(Some(&file), accel);
    let i = r.check("iommu").unwrap();
    assert_eq!(i.status, Status::Warn);
    assert!(
        i.detail.contains("group 5") && i.detail.contains("allowlist"),
        "{}",
        i.detail
    );
    for dev in [
        "devices/pci0000:00/0000:00:03.0/0000:06:00.0",
        "devices/pci0000:00/0000:00:03.0",
    ] {
        f.bytes(&format!("{dev}/config"), &config_space(Some(PCI_ACS_RR)));
    }
    let r = doctor(&f).run(Some(&file), accel);
    let acs = r.check("acs").unwrap();
    assert_eq!(acs.status, Status::Ok);
    assert!(
        acs.detail
            .starts_with("the devices share no upstream bridge"),
        "{}",
        acs.detail
    );

    // Without IOMMU groups there is nothing to warn about.
    fs::remove_dir_all(f.sys().join("kernel/iommu_groups")).unwrap();
    let r = doctor(&f).run(Some(&file), accel);
    let i = r.check("iommu").unwrap();
    assert_eq!(i.status, Status::Ok);
    assert!(i.detail.starts_with("no IOMMU groups"), "{}", i.detail);
}

#[test]
fn a_loaded_module_without_its_node_and_a_usable_generic_device_are_told_apart() {
    let (f, file) = machine_with_file(true);
    f.dir("module/p2pdma");
    f.root_file("dev/ng0n1", "");
    f.root_file(
        "boot/config-7.3.0-test",
        "CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\nCONFIG_IO_URING=y\n",
    );
    let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
    assert_eq!(r.check("kernel config").unwrap().status, Status::Ok);
    assert_eq!(r.check("kernel module").unwrap().status, Status::Ok);
    let n = r.check("device node").unwrap();
    assert_eq!(n.status, Status::Fail);
    assert!(
        n.detail
            .contains("does not exist although the module is loaded"),
        "{}",
        n.detail
    );
    assert_eq!(
        r.check("accelerator").unwrap().detail,
        "needs the module's device node"
    );
    let p = r.check("nvme passthrough").unwrap();
    // The file is real, on whatever filesystem holds the temporary
    // directory: NVMe commands can address it only on ext4 or XFS.
    let fd = fs::File::open(&file).unwrap();
    match crate::transfer::exec::extents::Filesystem::of(fd.as_fd()) {
        Ok(kind) => {
            assert_eq!(p.status, Status::Ok, "{}", p.detail);
            assert!(
                p.detail.ends_with(&format!(
                    "for a file ({kind}), reads only (writes to files go by P2P or the bounce path): its extents are mapped to blocks with FIEMAP first"
                )),
                "{}",
                p.detail
            );
            assert_eq!(r.nvme_cmd, Some(f.root().join("dev/ng0n1")));
        }
        Err(why) => {
            assert_eq!(p.status, Status::Warn, "{}", p.detail);
            assert!(p.detail.ends_with(&why), "{}", p.detail);
            assert_eq!(r.nvme_cmd, None);
        }
    }
    // The doctor never picks the NVMe command path itself.
    assert_eq!(r.path.path, TransferPath::Bounce);

    // Without io_uring the generic device is of no use.
    f.root_file(
        "boot/config-7.3.0-test",
        "CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\n",
    );
    let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
    assert_eq!(r.check("nvme passthrough").unwrap().status, Status::Warn);
    assert_eq!(r.nvme_cmd, None);
}

#[test]
fn a_node_that_is_not_the_module_is_a_failed_version_ioctl() {
    let (f, file) = machine_with_file(true);
    f.root_file("dev/p2pdma", "");
    let r = doctor(&f).run(Some(&file), AccelSelect::Index(0));
    let n = r.check("device node").unwrap();
    assert_eq!(n.status, Status::Fail);
    assert!(
        n.detail.starts_with("P2PDMA_IOC_GET_VERSION failed"),
        "{}",
        n.detail
    );
    // It answered an open, so the module check does not claim it is
    // missing... but it did not answer as the module either.
    assert_eq!(r.check("kernel module").unwrap().status, Status::Fail);
}

#[test]
fn node_errors_say_what_to_do() {
    let f = FakeSys::empty();
    let d = doctor(&f);
    let denied = Err(Error::Open {
        path: "/dev/p2pdma".into(),
        source: Errno::ACCESS,
    });
    let c = d.node_check(true, &denied);
    assert!(
        c.detail.contains("permission denied") && c.detail.contains("p2pdma group"),
        "{}",
        c.detail
    );
    let abi = Err(Error::AbiMismatch {
        module: 9,
        library: 1,
        library_min: 1,
    });
    let c = d.node_check(true, &abi);
    assert!(
        c.detail
            .starts_with("ABI mismatch: kernel module ABI version 9"),
        "{}",
        c.detail
    );
    assert_eq!(c.status, Status::Fail);
}

#[test]
fn non_nvme_storage_fails_the_storage_check() {
    let (f, file) = machine_with_file(false);
    let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
    let s = r.check("storage").unwrap();
    assert_eq!(s.status, Status::Fail);
    assert!(
        s.detail.ends_with(
            "lives on partition sda1 of disk sda, not an NVMe namespace: P2P DMA needs NVMe"
        ),
        "{}",
        s.detail
    );
    assert_eq!(r.check("nvme passthrough").unwrap().status, Status::Skip);
    let r = doctor(&f).run(None, AccelSelect::Auto);
    assert_eq!(r.check("storage").unwrap().detail, "no storage path given");
    let r = doctor(&f).run(Some(&f.root().join("missing")), AccelSelect::Auto);
    let s = r.check("storage").unwrap();
    assert_eq!(s.status, Status::Fail);
    assert!(s.detail.starts_with("cannot stat"), "{}", s.detail);
}

#[test]
fn p2p_memory_is_judged_by_what_is_free() {
    let a = Accelerator {
        index: 0,
        pci: "0000:04:00.0".parse().unwrap(),
        vendor: 0x1af4,
        device: 0x1110,
        bar: 2,
        bar_size: 64 << 20,
        bar_bus_addr: 0xfe00_0000,
        p2p_size: 64 << 20,
        p2p_available: 60 << 20,
        numa_node: None,
    };
    let c = p2p_memory_check(Some(&a));
    assert_eq!(c.status, Status::Ok);
    assert_eq!(
        c.detail,
        "60 MiB of 64 MiB free (BAR 2, 64 MiB, bus address 0xfe000000)"
    );
    let low = Accelerator {
        p2p_available: 1 << 20,
        ..a.clone()
    };
    assert_eq!(p2p_memory_check(Some(&low)).status, Status::Warn);
    let none = Accelerator {
        p2p_available: 0,
        ..a.clone()
    };
    assert!(p2p_memory_check(Some(&none)).detail.contains("all in use"));
    let unregistered = Accelerator {
        p2p_size: 0,
        p2p_available: 0,
        ..a
    };
    assert_eq!(p2p_memory_check(Some(&unregistered)).status, Status::Fail);
    assert_eq!(p2p_memory_check(None).status, Status::Skip);
}

#[test]
fn the_text_report_is_an_aligned_table() {
    let (f, file) = machine_with_file(true);
    let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
    let text = r.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("CHECK             STATUS  DETAIL"),
        "{text}"
    );
    let col = lines[0].find("DETAIL").unwrap();
    for c in &r.checks {
        let row = lines
            .iter()
            .find(|l| l.starts_with(&format!("{:w$}  ", c.name, w = col - 10)))
            .unwrap();
        assert_eq!(row.find(&c.status.to_string()), Some(col - 8), "{row}");
        let first = wrap(&c.detail, TEXT_WIDTH - col)[0].clone();
        assert_eq!(&row[col..], first, "{row}");
    }
    for l in &lines {
        assert!(
            l.chars().count() <= TEXT_WIDTH || !l.contains(' '),
            "too long: {l}"
        );
    }
    // Continuation lines start under the details.
    assert!(
        lines
            .iter()
            .any(|l| l.len() > col && l[..col].trim().is_empty()),
        "{text}"
    );
    assert!(
        text.contains("\npath: bounce\n      P2P not possible:"),
        "{text}"
    );
    assert!(text.contains("nvme commands: not possible"), "{text}");
}

#[test]
fn the_json_report_has_the_path_and_every_check() {
    let (f, file) = machine_with_file(true);
    let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
    let j = r.to_json();
    assert_eq!(j["path"], "bounce");
    assert_eq!(j["reason"], r.path.reason);
    assert_eq!(j["checks"].as_array().unwrap().len(), r.checks.len());
    assert_eq!(j["checks"][1]["name"], "kernel module");
    assert_eq!(j["checks"][1]["status"], "fail");
    assert_eq!(j["storage"]["disk"], "nvme0n1");
    assert_eq!(j["nvme_cmd"]["possible"], false);
    assert!(j["accelerator"].is_null() && j["p2p"].is_null());
    let compact = j.to_string();
    assert!(compact.contains("\"path\":\"bounce\""), "{compact}");
}

#[test]
fn text_wraps_at_spaces_and_sizes_read_well() {
    assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
    assert_eq!(wrap("", 6), [""]);
    assert_eq!(wrap("abcdefghij k", 4), ["abcdefghij", "k"]);
    assert_eq!(bytes(0), "0 B");
    assert_eq!(bytes(4096), "4 KiB");
    assert_eq!(bytes(64 << 20), "64 MiB");
    assert_eq!(bytes(1536 << 20), "1.5 GiB");
    assert_eq!(bytes(1000), "1000 B");
    assert_eq!(bytes(u64::MAX), "16777216.0 TiB");
}

#[test]
fn the_doctor_on_this_host_reports_bounce_without_the_module() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let r = Doctor::new().run(Some(&manifest), AccelSelect::Auto);
    let _ = r.to_string();
    let _ = r.to_json();
    assert_eq!(r.checks.len(), 13);
    // A kernel of 6.5 or later answers cachestat on the file.
    let pc = r.check("page cache").unwrap();
    match pc.status {
        Status::Ok => assert!(
            pc.detail.starts_with("cachestat answers ("),
            "{}",
            pc.detail
        ),
        _ => assert!(pc.detail.contains("no cachestat"), "{}", pc.detail),
    }
    if !crate::sys::cuda::library_present() {
        assert_eq!(r.check("gpu memory").unwrap().status, Status::Skip);
    }
    if !std::path::Path::new(DEVICE_NODE).exists() {
        assert_eq!(r.path.path, TransferPath::Bounce);
        assert!(r.path.reason.contains("module"), "{}", r.path.reason);
        assert_eq!(r.check("device node").unwrap().status, Status::Fail);
    }
    // Odd arguments are checks, not panics.
    for p in ["/", "/dev/null", "/proc/self/status", "/nonexistent"] {
        let r = Doctor::new().run(Some(std::path::Path::new(p)), AccelSelect::Index(u32::MAX));
        assert_eq!(r.path.path, TransferPath::Bounce);
    }
}

#[test]
fn gpu_memory_says_what_p2p_into_it_needs() {
    use super::checks::gpu_memory_check;
    use crate::discovery::{CudaDevice, CudaFacts};
    let kc = KernelConfig::parse("/boot/config", "CONFIG_PCI_P2PDMA=y\n");
    let no_p2p = KernelConfig::parse("/boot/config", "# CONFIG_PCI_P2PDMA is not set\n");
    let facts = |dma_buf: bool, open: bool| CudaFacts {
        driver_version: 13000,
        library: None,
        kernel_driver: Some(if open {
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64 580.159.04".into()
        } else {
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module 580.159.04".into()
        }),
        devices: vec![CudaDevice {
            ordinal: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            total_memory: 80 << 30,
            pci: "0000:00:06.0".parse().ok(),
            dma_buf,
            rdma: true,
        }],
    };
    let c = gpu_memory_check(&Ok(facts(true, true)), true, Some(&kc), None);
    assert_eq!(c.status, Status::Ok, "{}", c.detail);
    assert!(c.detail.contains("CUDA driver 13.0"), "{}", c.detail);
    assert!(
        c.detail
            .contains("GPU 0 NVIDIA H100 80GB HBM3 (0000:00:06.0), 80 GiB, dma-buf export yes"),
        "{}",
        c.detail
    );
    assert!(c.detail.contains("imports its dma-buf"), "{}", c.detail);
    // Given storage, the path rule's own choice for each GPU's memory.
    let bar = crate::transfer::plan::Facts {
        pref: crate::PathPref::Auto,
        submit: crate::transfer::P2pSubmit::Auto,
        module: true,
        accelerator: true,
        memory: crate::transfer::plan::MemoryFacts {
            kind: crate::memory::MemoryKind::Host,
            cpu_mapping: true,
            module_allocation: false,
            block_io: false,
            dmabuf: false,
        },
        storage: crate::transfer::plan::StorageFacts {
            nvme: true,
            ..Default::default()
        },
        p2p: None,
        paths: Vec::new(),
    };
    let auto = |d: &CudaDevice| super::checks::gpu_choice(&bar, d);
    let c = gpu_memory_check(&Ok(facts(true, true)), true, Some(&kc), Some(&auto));
    assert!(
        c.detail.contains(
            "; GPU 0 with the storage given: bounce (P2P by O_DIRECT not possible: CUDA device 0's memory has no CPU mapping"
        ),
        "{}",
        c.detail
    );
    for (f, module, k, says) in [
        (facts(false, true), true, Some(&kc), "exports dma-bufs"),
        (facts(true, false), true, Some(&kc), "open kernel module"),
        (facts(true, true), false, Some(&kc), "p2pdma module"),
        (facts(true, true), true, Some(&no_p2p), "CONFIG_PCI_P2PDMA"),
        (facts(true, true), true, None, "kernel config"),
    ] {
        let c = gpu_memory_check(&Ok(f), module, k, None);
        assert_eq!(c.status, Status::Warn, "{}", c.detail);
        assert!(c.detail.contains(says), "{says}: {}", c.detail);
        assert!(c.detail.contains("bounce path"), "{}", c.detail);
    }
    let c = gpu_memory_check(
        &Err("CUDA is not available: no driver".into()),
        true,
        Some(&kc),
        None,
    );
    assert_eq!(c.status, Status::Skip);
    assert!(c.detail.contains("no driver"), "{}", c.detail);
}

#[test]
fn a_namespace_over_nvme_tcp_is_reported_with_its_transport_and_why_no_p2p() {
    let f = FakeSys::machine();
    let ctl = "devices/virtual/nvme-fabrics/ctl/nvme4";
    for (attr, value) in [
        ("transport", "tcp"),
        ("address", "traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15"),
        ("subsysnqn", "nqn.2026-11.io.p2pdma:store"),
        ("state", "live"),
    ] {
        f.file(&format!("{ctl}/{attr}"), &format!("{value}\n"));
    }
    f.link("class/nvme/nvme4", ctl);
    let ns = format!("{ctl}/nvme4n1");
    f.disk(&ns, "nvme4n1", "259:40", 512, 128, Some(1));
    let file = f.root().join("remote.bin");
    fs::write(&file, b"x").unwrap();
    let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
    f.link(&format!("dev/block/{dev}"), &ns);
    let accel: PciAddress = "0000:04:00.0".parse().unwrap();
    let r = doctor(&f).run(Some(&file), AccelSelect::Pci(accel));
    let s = r.check("storage").unwrap();
    assert!(
        s.detail.contains(
            "lives on disk nvme4n1, namespace 1 of nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15, subsystem nqn.2026-11.io.p2pdma:store (live); 512-byte blocks"
        ),
        "{}",
        s.detail
    );
    assert_eq!(
        r.to_json()["storage"]["transport"]["subsysnqn"],
        "nqn.2026-11.io.p2pdma:store"
    );
    // Without the module the verdict is bounce whatever the storage; the
    // rule's own reason for the fabric is in the plan tests.
    assert_eq!(r.path.path, crate::transfer::TransferPath::Bounce);
}
