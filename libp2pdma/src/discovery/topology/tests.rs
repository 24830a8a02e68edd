use std::os::unix::net::UnixListener;

use super::*;
use crate::discovery::{fake::*, mounts::unescape_mount, pci::*, storage::NvmeCmdRefusal};

fn pci(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn whole_nvme_namespace_resolves_to_controller_and_pci_function() {
    let f = FakeSys::machine();
    let t = resolve_nvme0n1(&f);
    assert_eq!(t.kind, TargetKind::BlockDevice);
    assert_eq!(t.disk, "nvme0n1");
    assert_eq!(t.disk_path, f.root().join("dev/nvme0n1"));
    assert_eq!(t.partition, None);
    assert_eq!(t.partition_offset(), 0);
    assert_eq!(t.generic_path, Some(f.root().join("dev/ng0n1")));
    assert_eq!(t.nsid, Some(1));
    assert_eq!(t.logical_block_size, 512);
    assert_eq!(t.max_transfer_bytes, 128 * 1024);
    assert_eq!(t.controller.as_deref(), Some("nvme0"));
    assert_eq!(t.pci, Some(pci("0000:03:00.0")));
    assert!(t.is_nvme);
    assert!(t.slaves.is_empty());
    let j = t.to_json();
    assert_eq!(j["pci"], "0000:03:00.0");
    assert_eq!(j["kind"], "block");
}

#[test]
fn disk_facts_come_from_the_disk_and_its_controller() {
    let f = FakeSys::machine();
    let ctrl = format!("{NVME}/nvme/nvme0");
    f.file(&format!("{ctrl}/model"), "QEMU NVMe Ctrl   \n");
    f.file(&format!("{ctrl}/serial"), "deadbeef\n");
    f.link(&format!("{NS}/device"), &ctrl);
    f.file(&format!("{NS}/queue/max_sectors_kb"), "1280\n");
    f.file(&format!("{NS}/queue/nr_requests"), "1023\n");
    f.file(&format!("{NS}/queue/rotational"), "0\n");
    // A file on the partition: the whole disk's facts.
    let t = f
        .topology()
        .resolve_block(
            Path::new("/dev/nvme0n1p1"),
            DevNum {
                major: 259,
                minor: 1,
            },
            TargetKind::BlockDevice,
        )
        .unwrap();
    let d = &t.disk_facts;
    assert_eq!(
        d.dev,
        Some(DevNum {
            major: 259,
            minor: 0
        })
    );
    assert_eq!(d.model.as_deref(), Some("QEMU NVMe Ctrl"));
    assert_eq!(d.serial.as_deref(), Some("deadbeef"));
    assert_eq!(d.max_request_bytes, Some(1280 * 1024));
    assert_eq!(d.queue_requests, Some(1023));
    assert_eq!(d.rotational, Some(false));
    // A disk that says little: a virtio disk's serial is its own.
    let sda = format!("{SATA}/ata1/host0/target0:0:0/0:0:0:0/block/sda");
    f.file(&format!("{sda}/serial"), "overlayblk\n");
    f.file(&format!("{sda}/queue/nr_requests"), "lots\n");
    let t = f
        .topology()
        .resolve_block(
            Path::new("/dev/sda"),
            DevNum { major: 8, minor: 0 },
            TargetKind::BlockDevice,
        )
        .unwrap();
    assert_eq!(
        t.disk_facts,
        DiskFacts {
            dev: Some(DevNum { major: 8, minor: 0 }),
            serial: Some("overlayblk".into()),
            ..Default::default()
        }
    );
}

#[test]
fn partitions_lead_to_their_disk_and_carry_their_offset() {
    let f = FakeSys::machine();
    let t = f
        .topology()
        .resolve_block(
            Path::new("/dev/nvme0n1p1"),
            DevNum {
                major: 259,
                minor: 1,
            },
            TargetKind::BlockDevice,
        )
        .unwrap();
    assert_eq!(t.disk, "nvme0n1");
    let p = t.partition.clone().unwrap();
    assert_eq!(
        (p.name.as_str(), p.number, p.start, p.size),
        ("nvme0n1p1", 1, 2048 * 512, 204800 * 512)
    );
    assert_eq!(t.partition_offset(), 1048576);
    assert_eq!(t.pci, Some(pci("0000:03:00.0")));
}

#[test]
fn generic_char_devices_resolve_to_their_namespace() {
    let f = FakeSys::machine();
    let t = f
        .topology()
        .resolve_char(
            Path::new("/dev/ng0n1"),
            DevNum {
                major: 241,
                minor: 0,
            },
        )
        .unwrap();
    assert_eq!(t.kind, TargetKind::NvmeGeneric);
    assert_eq!(t.disk, "nvme0n1");
    assert_eq!(t.nsid, Some(1));
    assert_eq!(t.controller.as_deref(), Some("nvme0"));
}

#[test]
fn other_char_devices_are_refused_with_what_they_are() {
    let f = FakeSys::machine();
    let topo = f.topology();
    let e = topo
        .resolve_char(Path::new("/dev/null"), DevNum { major: 1, minor: 3 })
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not an NVMe generic device") && e.contains("mem"),
        "{e}"
    );
    let e = topo
        .resolve_char(
            Path::new("/dev/nvme0"),
            DevNum {
                major: 242,
                minor: 0,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("controller nvme0") && e.contains("/dev/nvme0n1"),
        "{e}"
    );
    let e = topo
        .resolve_char(Path::new("/dev/x"), DevNum { major: 9, minor: 9 })
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown to sysfs"), "{e}");
}

#[test]
fn sata_disks_are_not_nvme_but_have_a_pci_function() {
    let f = FakeSys::machine();
    let t = f
        .topology()
        .resolve_block(
            Path::new("/dev/sda1"),
            DevNum { major: 8, minor: 1 },
            TargetKind::BlockDevice,
        )
        .unwrap();
    assert_eq!(t.disk, "sda");
    assert!(!t.is_nvme);
    assert_eq!(t.controller, None);
    assert_eq!(t.generic_path, None);
    assert_eq!(t.nsid, None);
    assert_eq!(t.logical_block_size, 4096);
    assert_eq!(t.partition_offset(), 8 * 512);
    assert_eq!(t.pci, Some(pci("0000:05:00.0")));
}

#[test]
fn files_resolve_through_their_filesystem_device() {
    let f = FakeSys::machine();
    let file = f.root().join("data.bin");
    fs::write(&file, b"x").unwrap();
    let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
    f.link(&format!("dev/block/{dev}"), &format!("{NS}/nvme0n1p1"));
    let t = f.topology().resolve(&file).unwrap();
    assert_eq!(
        t.kind,
        TargetKind::File {
            fs_device: "nvme0n1p1".into(),
            fs_dev: dev
        }
    );
    assert_eq!(t.disk, "nvme0n1");
    assert_eq!(t.partition_offset(), 1048576);
    assert!(t.is_nvme);
    assert_eq!(t.to_json()["fs_device"]["name"], "nvme0n1p1");
}

#[test]
fn files_on_filesystems_without_a_block_device_say_which() {
    let f = FakeSys::machine();
    let file = f.root().join("data.bin");
    fs::write(&file, b"x").unwrap();
    let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
    f.root_file(
        "proc/self/mountinfo",
        &format!("22 1 {dev} / /mnt\\040x rw,relatime shared:1 - tmpfs tmpfs rw\n"),
    );
    let e = f.topology().resolve(&file).unwrap_err();
    assert!(matches!(e, TopologyError::NoBlockDevice { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("a tmpfs filesystem") && e.contains(&dev.to_string()),
        "{e}"
    );
    // Without a mount table it still says what is missing.
    fs::remove_file(f.root().join("proc/self/mountinfo")).unwrap();
    let e = f.topology().resolve(&file).unwrap_err().to_string();
    assert!(e.contains("without a block device"), "{e}");
}

#[test]
fn sockets_and_missing_paths_are_clear_errors() {
    let f = FakeSys::machine();
    let sock = f.root().join("sock");
    let _l = UnixListener::bind(&sock).unwrap();
    let e = f.topology().resolve(&sock).unwrap_err().to_string();
    assert!(e.ends_with("is a socket"), "{e}");
    let e = f
        .topology()
        .resolve(f.root().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("cannot stat"), "{e}");
}

#[test]
fn garbage_in_sysfs_is_a_parse_error_naming_the_file() {
    let f = FakeSys::machine();
    f.file(&format!("{NS}/queue/logical_block_size"), "lots\n");
    let e = try_resolve_nvme0n1(&f).unwrap_err();
    let TopologyError::Parse { path, value, .. } = &e else {
        panic!("{e}");
    };
    assert!(path.ends_with("queue/logical_block_size"));
    assert_eq!(value, "lots");
    fs::remove_file(f.sys().join(NS).join("queue/logical_block_size")).unwrap();
    let e = try_resolve_nvme0n1(&f).unwrap_err();
    assert!(matches!(e, TopologyError::Read { .. }), "{e}");
}

#[test]
fn multipath_namespaces_find_a_controller_through_their_paths() {
    let f = FakeSys::machine();
    let head = "devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n3";
    f.disk(head, "nvme0n3", "259:20", 512, 128, Some(3));
    let path = format!("{NVME}/nvme/nvme0/nvme0c0n3");
    f.dir(&path);
    f.link(&format!("{head}/multipath/nvme0c0n3"), &path);
    let t = resolve_disk(&f, "nvme0n3", 20);
    assert_eq!(t.controller.as_deref(), Some("nvme0"));
    assert_eq!(t.pci, Some(pci("0000:03:00.0")));
    assert_eq!(t.nsid, Some(3));
    // Its generic device is found by name when there is no class entry.
    assert_eq!(t.generic_path, None);
    f.root_file("dev/ng0n3", "");
    let t = resolve_disk(&f, "nvme0n3", 20);
    assert_eq!(t.generic_path, Some(f.root().join("dev/ng0n3")));
}

#[test]
fn multipath_heads_list_every_path_with_its_controller() {
    let f = FakeSys::machine();
    let nvme1 = "devices/pci0000:00/0000:00:04.0/0000:07:00.0";
    f.pci(
        "devices/pci0000:00/0000:00:04.0",
        0x8086,
        0x29c4,
        0x060400,
        Some(6),
    );
    f.pci(nvme1, 0x1b36, 0x0010, 0x010802, Some(6));
    let head = "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1";
    f.disk(head, "nvme1n1", "259:30", 512, 128, Some(3));
    // Listed out of order, and a third path whose controller is gone.
    for (name, dir) in [
        (
            "nvme1c10n1",
            "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1c10n1".to_string(),
        ),
        ("nvme1c2n1", format!("{nvme1}/nvme/nvme2/nvme1c2n1")),
        ("nvme1c1n1", format!("{NVME}/nvme/nvme1/nvme1c1n1")),
    ] {
        f.dir(&dir);
        f.link(&format!("{head}/multipath/{name}"), &dir);
    }
    let t = resolve_disk(&f, "nvme1n1", 30);
    let path = |name: &str, c: Option<&str>, p: Option<&str>| NvmePath {
        name: name.into(),
        controller: c.map(Into::into),
        pci: p.map(pci),
        transport: None,
    };
    let want = vec![
        path("nvme1c1n1", Some("nvme1"), Some("0000:03:00.0")),
        path("nvme1c2n1", Some("nvme2"), Some("0000:07:00.0")),
        path("nvme1c10n1", None, None),
    ];
    assert!(t.is_multipath() && t.is_nvme);
    assert_eq!(t.multipath, want);
    assert_eq!(t.io_paths(), want);
    assert_eq!(t.controller.as_deref(), Some("nvme1"));
    assert_eq!(
        want.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        [
            "nvme1c1n1 (nvme1 at 0000:03:00.0)",
            "nvme1c2n1 (nvme2 at 0000:07:00.0)",
            "nvme1c10n1 (no controller found)"
        ]
    );
    assert_eq!(
        t.to_json()["multipath"][1],
        serde_json::json!({"name": "nvme1c2n1", "controller": "nvme2", "pci": "0000:07:00.0", "transport": null})
    );

    // A namespace of one controller has one path, its own; other disks
    // none.
    let topo = f.topology();
    let ns = topo
        .resolve_char(
            Path::new("/dev/ng0n1"),
            DevNum {
                major: 241,
                minor: 0,
            },
        )
        .unwrap();
    assert!(!ns.is_multipath());
    assert_eq!(
        ns.io_paths(),
        vec![path("nvme0n1", Some("nvme0"), Some("0000:03:00.0"))]
    );
    let sda = topo
        .resolve_block(
            Path::new("/dev/sda"),
            DevNum { major: 8, minor: 0 },
            TargetKind::BlockDevice,
        )
        .unwrap();
    assert_eq!(sda.io_paths(), vec![]);
}

#[test]
fn namespaces_with_metadata_refuse_nvme_commands_with_the_reason() {
    let f = FakeSys::machine();
    let resolve = |f: &FakeSys| {
        f.topology()
            .resolve_block(
                Path::new("/dev/nvme0n1p1"),
                DevNum {
                    major: 259,
                    minor: 1,
                },
                TargetKind::BlockDevice,
            )
            .unwrap()
    };
    // No metadata: no refusal, whether the files say 0 and none or are
    // missing.
    assert_eq!(resolve(&f).nvme_cmd_refusal(), None);
    f.file(&format!("{NS}/metadata_bytes"), "0\n");
    f.file(&format!("{NS}/integrity/format"), "none\n");
    let t = resolve(&f);
    assert_eq!((t.metadata_bytes, t.integrity.as_deref()), (0, None));
    assert_eq!(t.nvme_cmd_refusal(), None);
    // A partition's namespace is its disk's.
    f.file(&format!("{NS}/metadata_bytes"), "8\n");
    let t = resolve(&f);
    assert_eq!(t.metadata_bytes, 8);
    assert_eq!(
        t.nvme_cmd_refusal().unwrap().to_string(),
        "nvme0n1 is formatted with 8 bytes of metadata per block: the library's NVMe commands carry no metadata buffer (P2P and bounce I/O go through the block layer, which handles the metadata)"
    );
    f.file(&format!("{NS}/integrity/format"), "T10-DIF-TYPE1-CRC\n");
    let r = resolve(&f).nvme_cmd_refusal().unwrap();
    assert_eq!(
        r,
        NvmeCmdRefusal::Metadata {
            disk: "nvme0n1".into(),
            bytes: 8,
            integrity: Some("T10-DIF-TYPE1-CRC".into())
        }
    );
    assert!(r
        .to_string()
        .starts_with("nvme0n1 is formatted with 8 bytes of metadata per block (integrity format T10-DIF-TYPE1-CRC): "));
    assert_eq!(
        resolve(&f).to_json()["nvme_cmd_refusal"],
        serde_json::json!(r.to_string())
    );
    f.file(&format!("{NS}/metadata_bytes"), "eight\n");
    let err = f
        .topology()
        .resolve_char(
            Path::new("/dev/ng0n1"),
            DevNum {
                major: 241,
                minor: 0,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metadata_bytes: \"eight\" is not a byte count"),
        "{err}"
    );
}

#[test]
fn namespaces_are_listed_in_natural_order_without_path_devices() {
    let f = FakeSys::machine();
    let list = f.topology().list_nvme_namespaces().unwrap();
    let names: Vec<&str> = list.iter().map(|t| t.disk.as_str()).collect();
    assert_eq!(names, ["nvme0n1", "nvme2n1", "nvme10n1"]);
    assert_eq!(list[0].path, f.root().join("dev/nvme0n1"));
    assert_eq!(list[1].pci, None);
    assert!(list.iter().all(|t| t.is_nvme));
    let none = FakeSys::empty().topology().list_nvme_namespaces().unwrap();
    assert!(none.is_empty());
}

#[test]
fn p2pmem_providers_are_listed_with_their_sizes() {
    let f = FakeSys::machine();
    let list = f.topology().list_p2pmem_providers().unwrap();
    assert_eq!(
        list,
        [
            P2pmemProvider {
                pci: pci("0000:04:00.0"),
                size: 64 << 20,
                available: 60 << 20,
                published: true,
                driver: Some("p2pdma".into()),
            },
            P2pmemProvider {
                pci: pci("0000:06:00.0"),
                size: 1 << 20,
                available: 1 << 20,
                published: false,
                driver: None,
            },
        ]
    );
    assert_eq!(list[0].to_json()["available"], 60 << 20);
    f.file(&format!("{ACCEL}/p2pmem/available"), "-1\n");
    let e = f
        .topology()
        .list_p2pmem_providers()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("p2pmem/available") && e.contains("\"-1\""),
        "{e}"
    );
}

#[test]
fn every_pci_function_is_listed_in_order() {
    let f = FakeSys::machine();
    let all = f.topology().pci_functions().unwrap();
    let names: Vec<String> = all.iter().map(|p| p.address.to_string()).collect();
    let mut want: Vec<String> = [RP1, USP, DSP0, DSP1, NVME, ACCEL, RP2, SATA, RP3, ACCEL2]
        .iter()
        .map(|p| p.rsplit('/').next().unwrap().to_string())
        .collect();
    want.sort();
    assert_eq!(names, want);
    let accel = all
        .iter()
        .find(|p| p.address == pci("0000:04:00.0"))
        .unwrap();
    assert_eq!(accel.upstream[0], pci("0000:02:01.0"));
    assert!(all.iter().filter(|p| p.is_bridge()).count() >= 6);
}

#[test]
fn pci_functions_know_what_is_above_them() {
    let f = FakeSys::machine();
    let topo = f.topology();
    let nvme = topo.pci_function(pci("0000:03:00.0")).unwrap();
    assert_eq!(
        nvme.upstream,
        [
            pci("0000:02:00.0"),
            pci("0000:01:00.0"),
            pci("0000:00:01.0")
        ]
    );
    assert_eq!(nvme.host_bridge.as_deref(), Some("pci0000:00"));
    assert_eq!(
        (nvme.vendor, nvme.device, nvme.class),
        (Some(0x1b36), Some(0x10), Some(0x010802))
    );
    assert_eq!(nvme.driver.as_deref(), Some("nvme"));
    assert_eq!(nvme.iommu_group, Some(2));
    assert!(!nvme.is_bridge());
    assert!(topo.pci_function(pci("0000:02:00.0")).unwrap().is_bridge());
    let accel = topo.pci_function(pci("0000:04:00.0")).unwrap();
    assert_eq!(common_upstream(&accel, &nvme), Some(pci("0000:01:00.0")));
    assert_eq!(
        acs_path(&accel, &nvme),
        [
            pci("0000:04:00.0"),
            pci("0000:02:01.0"),
            pci("0000:01:00.0"),
            pci("0000:03:00.0"),
            pci("0000:02:00.0"),
        ]
    );
    let far = topo.pci_function(pci("0000:06:00.0")).unwrap();
    assert_eq!(common_upstream(&far, &nvme), None);
    assert_eq!(
        acs_path(&far, &nvme),
        [pci("0000:06:00.0"), pci("0000:00:03.0")]
    );
    assert_eq!(common_upstream(&nvme, &nvme), Some(pci("0000:03:00.0")));
    assert_eq!(acs_path(&nvme, &nvme), [pci("0000:03:00.0")]);
    assert!(topo.pci_function(pci("0000:09:00.0")).is_err());
    assert_eq!(topo.iommu_groups().unwrap().len(), 6);
    assert_eq!(topo.iommu_group_type(2).as_deref(), Some("DMA"));
    assert!(FakeSys::empty()
        .topology()
        .iommu_groups()
        .unwrap()
        .is_empty());
}

#[test]
fn acs_control_is_found_by_walking_the_extended_capabilities() {
    let c = config_space(Some(PCI_ACS_SV | PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_UF));
    assert_eq!(find_ext_capability(&c, PCI_EXT_CAP_ID_ACS), Ok(Some(0x148)));
    assert_eq!(find_ext_capability(&c, 0x0001), Ok(Some(0x100)));
    assert_eq!(acs_control(&c), Ok(Some(0x1d)));
    assert_eq!(acs_bits(0x1d), "SV RR CR UF");
    assert_eq!(acs_bits(0), "none");
    assert_eq!(acs_control(&config_space(None)), Ok(None));
    // Only the header is readable without privileges.
    assert_eq!(acs_control(&c[..64]), Err(ConfigSpaceError::Short(64)));
    // Conventional PCI functions have no extended space, so no ACS.
    assert_eq!(acs_control(&c[..256]), Ok(None));
    // A capability list that loops ends.
    let mut l = vec![0u8; 4096];
    l[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
    assert_eq!(acs_control(&l), Ok(None));
    // One that points past the end ends too.
    let mut l = vec![0u8; 0x104];
    l[0x100..0x104].copy_from_slice(&(0x0001u32 | (0xffc << 20)).to_le_bytes());
    assert_eq!(acs_control(&l), Ok(None));
    // All ones (a device that is gone) has no capabilities.
    assert_eq!(acs_control(&[0xff; 4096]), Ok(None));
    // A capability cut off before its control register.
    let c = config_space(Some(PCI_ACS_RR));
    assert!(acs_control(&c[..0x14d]).is_err());
}

#[test]
fn pci_config_reads_what_sysfs_gives() {
    let f = FakeSys::machine();
    f.bytes(&format!("{DSP1}/config"), &config_space(Some(PCI_ACS_RR)));
    let c = f.topology().pci_config(pci("0000:02:01.0")).unwrap();
    assert_eq!(acs_control(&c), Ok(Some(PCI_ACS_RR)));
    assert!(f.topology().pci_config(pci("0000:02:00.0")).is_err());
}

#[test]
fn mountinfo_lines_parse() {
    let m = parse_mountinfo_line(
        "36 35 98:0 /mnt1 /mnt\\0402 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
    )
    .unwrap();
    assert_eq!(
        m.dev,
        DevNum {
            major: 98,
            minor: 0
        }
    );
    assert_eq!(m.mount_point, "/mnt 2");
    assert_eq!(m.fstype, "ext3");
    assert_eq!(m.source, "/dev/root");
    assert_eq!(parse_mountinfo_line("garbage"), None);
    assert_eq!(
        parse_mountinfo_line("1 2 x:y / / rw - ext4 /dev/a rw"),
        None
    );
    assert_eq!(unescape_mount("a\\"), "a\\");
    assert_eq!(unescape_mount("a\\99"), "a\\99");
    assert_eq!(unescape_mount("\\777"), "\\777");
}

#[test]
fn names_and_numbers_parse_strictly() {
    assert_eq!(
        DevNum::parse("259:1\n"),
        Some(DevNum {
            major: 259,
            minor: 1
        })
    );
    assert_eq!(DevNum::parse("259"), None);
    assert_eq!(DevNum::parse("-1:2"), None);
    assert_eq!(
        DevNum::from_raw(0x10300),
        DevNum {
            major: 259,
            minor: 0
        }
    );
    assert_eq!(parse_sysfs_pci("0000:03:00.0"), Some(pci("0000:03:00.0")));
    assert_eq!(parse_sysfs_pci("03:00.0"), None);
    assert_eq!(parse_sysfs_pci("pci0000:00"), None);
    assert!(is_nvme_namespace_name("nvme12n3"));
    assert!(!is_nvme_namespace_name("nvme0n1p1"));
    assert!(!is_nvme_namespace_name("nvme0c1n1"));
    assert!(!is_nvme_namespace_name("nvme0"));
    assert!(is_nvme_controller_name("nvme7"));
    assert!(!is_nvme_controller_name("nvme"));
    assert!(!is_nvme_controller_name("nvme-subsys0"));
    let mut v = vec!["nvme10n1", "nvme2n10", "nvme2n2", "nvme1n1", "sda"];
    v.sort_by(|a, b| natural_cmp(a, b));
    assert_eq!(v, ["nvme1n1", "nvme2n2", "nvme2n10", "nvme10n1", "sda"]);
    assert_eq!(parse_hex("0x060400\n"), Some(0x060400));
    assert_eq!(parse_hex("0x"), None);
    assert_eq!(parse_dec::<u32>(" 12\n"), Some(12));
    assert_eq!(parse_dec::<u32>("+12"), None);
    assert_eq!(parse_dec::<u32>("99999999999"), None);
}

/// An md array at `/sys/block/md0` (device 9:0) of level `level` over
/// `members`: (name, sysfs directory of the member's block device, slot,
/// state).
fn md_array(f: &FakeSys, level: &str, chunk: &str, members: &[(&str, &str, &str, &str)]) {
    let md0 = "devices/virtual/block/md0";
    f.disk(md0, "md0", "9:0", 512, 512, None);
    f.file(&format!("{md0}/md/level"), &format!("{level}\n"));
    f.file(&format!("{md0}/md/chunk_size"), &format!("{chunk}\n"));
    f.file(&format!("{md0}/md/raid_disks"), "2\n");
    f.file(&format!("{md0}/md/layout"), "258\n");
    f.file(&format!("{md0}/md/degraded"), "0\n");
    f.file(&format!("{md0}/md/array_state"), "clean\n");
    for (name, dir, slot, state) in members {
        f.file(&format!("{md0}/md/dev-{name}/slot"), &format!("{slot}\n"));
        f.file(&format!("{md0}/md/dev-{name}/state"), &format!("{state}\n"));
        f.file(&format!("{md0}/md/dev-{name}/offset"), "2048\n");
        f.link(&format!("{md0}/md/dev-{name}/block"), dir);
        f.link(&format!("{md0}/slaves/{name}"), dir);
    }
}

/// The fake machine's first namespace, `/dev/nvme0n1` (259:0).
fn resolve_nvme0n1(f: &FakeSys) -> StorageTarget {
    try_resolve_nvme0n1(f).unwrap()
}

/// What resolving the fake machine's first namespace gives.
fn try_resolve_nvme0n1(f: &FakeSys) -> Result<StorageTarget, TopologyError> {
    f.topology().resolve_block(
        Path::new("/dev/nvme0n1"),
        DevNum {
            major: 259,
            minor: 0,
        },
        TargetKind::BlockDevice,
    )
}

/// Whole disk `name` (device number 259:`minor`) of the fake machine.
fn resolve_disk(f: &FakeSys, name: &str, minor: u32) -> StorageTarget {
    f.topology()
        .resolve_block(
            &Path::new("/dev").join(name),
            DevNum { major: 259, minor },
            TargetKind::BlockDevice,
        )
        .unwrap()
}

fn resolve_md0(f: &FakeSys) -> StorageTarget {
    f.topology()
        .resolve_block(
            Path::new("/dev/md0"),
            DevNum { major: 9, minor: 0 },
            TargetKind::BlockDevice,
        )
        .unwrap()
}

#[test]
fn an_md_array_knows_its_level_chunk_and_members_down_to_their_controllers() {
    let f = FakeSys::machine();
    // A second controller on a root port of its own, its namespace a
    // member; a partition of the first namespace the other; a spare and a
    // failed member beside them.
    let rp = "devices/pci0000:00/0000:00:04.0";
    let nvme1 = format!("{rp}/0000:07:00.0");
    f.pci(rp, 0x8086, 0x29c4, 0x060400, Some(6));
    f.pci(&nvme1, 0x1b36, 0x0010, 0x010802, Some(6));
    let ns1 = format!("{nvme1}/nvme/nvme1/nvme1n1");
    f.disk(&ns1, "nvme1n1", "259:20", 512, 256, Some(1));
    let ns3 = format!("{nvme1}/nvme/nvme1/nvme1n3");
    f.disk(&ns3, "nvme1n3", "259:22", 512, 256, Some(3));
    let ns4 = format!("{nvme1}/nvme/nvme1/nvme1n4");
    f.disk(&ns4, "nvme1n4", "259:23", 512, 256, Some(4));
    let part = format!("{NS}/nvme0n1p1");
    md_array(
        &f,
        "raid0",
        "524288",
        &[
            ("nvme1n3", &ns3, "none", "spare"),
            ("nvme1n1", &ns1, "1", "in_sync"),
            ("nvme1n4", &ns4, "none", "faulty"),
            ("nvme0n1p1", &part, "0", "in_sync"),
        ],
    );
    let t = resolve_md0(&f);
    let md = t.md.as_ref().expect("md0 is an md array");
    assert_eq!(
        (
            md.level.as_str(),
            md.chunk_bytes,
            md.raid_disks,
            md.degraded
        ),
        ("raid0", 524288, Some(2), Some(0))
    );
    assert_eq!(md.state.as_deref(), Some("clean"));
    assert_eq!(md.layout, Some(258));
    assert_eq!(md.members[0].data_offset, Some(1 << 20));
    // In slot order, then the others by name.
    let names: Vec<_> = md.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["nvme0n1p1", "nvme1n1", "nvme1n3", "nvme1n4"]);
    let slots: Vec<_> = md.members.iter().map(|m| m.slot).collect();
    assert_eq!(slots, [Some(0), Some(1), None, None]);
    let active: Vec<_> = md.members.iter().map(|m| m.active()).collect();
    assert_eq!(active, [true, true, false, false]);
    assert_eq!(md.members[3].state, ["faulty"]);
    // Each member down to its controller and PCI function; the partition
    // with its start.
    let m0 = md.members[0].target.as_ref().unwrap();
    assert_eq!(
        (m0.disk.as_str(), m0.controller.as_deref(), m0.pci),
        ("nvme0n1", Some("nvme0"), Some(pci("0000:03:00.0")))
    );
    assert_eq!(m0.partition_offset(), 2048 * 512);
    let m1 = md.members[1].target.as_ref().unwrap();
    assert_eq!(
        (m1.controller.as_deref(), m1.pci),
        (Some("nvme1"), Some(pci("0000:07:00.0")))
    );
    // The array is NVMe storage, and I/O to it goes to the members in the
    // layout only.
    assert!(t.is_nvme && !t.is_multipath());
    assert_eq!(t.controller, None);
    let paths: Vec<_> = t.io_paths().iter().map(|p| p.to_string()).collect();
    assert_eq!(
        paths,
        [
            "nvme0n1 (nvme0 at 0000:03:00.0)",
            "nvme1n1 (nvme1 at 0000:07:00.0)"
        ]
    );
    assert_eq!(t.slaves, ["nvme0n1p1", "nvme1n1", "nvme1n3", "nvme1n4"]);
    let j = t.to_json();
    assert_eq!(j["md"]["level"], "raid0");
    assert_eq!(j["md"]["chunk_bytes"], 524288);
    assert_eq!(
        j["md"]["members"][1],
        serde_json::json!({
            "name": "nvme1n1", "slot": 1, "state": ["in_sync"], "data_offset": 1048576,
            "controller": "nvme1", "pci": "0000:07:00.0", "is_nvme": true,
        })
    );
}

#[test]
fn an_md_array_with_a_member_that_is_not_nvme_is_not_nvme_storage() {
    let f = FakeSys::machine();
    let sda = format!("{SATA}/ata1/host0/target0:0:0/0:0:0:0/block/sda");
    md_array(
        &f,
        "raid1",
        "0",
        &[
            ("nvme0n1", NS, "0", "in_sync"),
            ("sda", &sda, "1", "in_sync,write_mostly"),
        ],
    );
    let t = resolve_md0(&f);
    let md = t.md.as_ref().unwrap();
    assert_eq!((md.level.as_str(), md.chunk_bytes), ("raid1", 0));
    assert_eq!(md.members[1].state, ["in_sync", "write_mostly"]);
    assert!(!md.members[1].target.as_ref().unwrap().is_nvme);
    assert!(!t.is_nvme);
    // The NVMe member's path is still listed: what reaches the accelerator
    // and what does not is the path rule's to say.
    let paths: Vec<_> = t.io_paths().iter().map(|p| p.name.clone()).collect();
    assert_eq!(paths, ["nvme0n1"]);

    // Other disks are no arrays.
    let ns = resolve_nvme0n1(&f);
    assert_eq!(ns.md, None);
    assert!(ns.to_json()["md"].is_null());
}

/// A controller of the kernel's NVMe over Fabrics host, as it sits in
/// sysfs: under `nvme-fabrics/ctl`, in `/sys/class/nvme`, with its
/// transport's attributes.
fn fabrics_controller(f: &FakeSys, ctrl: &str, transport: &str, address: &str) -> String {
    let dir = format!("devices/virtual/nvme-fabrics/ctl/{ctrl}");
    f.file(&format!("{dir}/transport"), &format!("{transport}\n"));
    f.file(&format!("{dir}/address"), &format!("{address}\n"));
    f.file(&format!("{dir}/subsysnqn"), "nqn.2026-11.io.p2pdma:store\n");
    f.file(&format!("{dir}/state"), "live\n");
    f.link(&format!("class/nvme/{ctrl}"), &dir);
    dir
}

#[test]
fn fabrics_controllers_are_found_with_their_transport() {
    let f = FakeSys::machine();
    // A namespace of a TCP controller without multipath: under the
    // controller itself.
    let tcp = fabrics_controller(
        &f,
        "nvme4",
        "tcp",
        "traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15",
    );
    f.disk(
        &format!("{tcp}/nvme4n1"),
        "nvme4n1",
        "259:40",
        512,
        128,
        Some(1),
    );
    let t = resolve_disk(&f, "nvme4n1", 40);
    assert!(t.is_nvme && !t.is_multipath());
    assert_eq!((t.controller.as_deref(), t.pci), (Some("nvme4"), None));
    let tr = t.transport.clone().unwrap();
    assert_eq!(
        (
            tr.kind.as_str(),
            tr.subsysnqn.as_deref(),
            tr.state.as_deref()
        ),
        ("tcp", Some("nqn.2026-11.io.p2pdma:store"), Some("live"))
    );
    assert!(tr.is_fabric());
    assert_eq!(
        t.io_paths()[0].to_string(),
        "nvme4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15)"
    );
    assert_eq!(t.to_json()["transport"]["kind"], "tcp");
    assert_eq!(
        t.to_json()["transport"]["address"],
        "traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15"
    );

    // A multipath head over two TCP paths (two ports of one subsystem)
    // and a PCIe one: each path with its own transport.
    let second = fabrics_controller(&f, "nvme5", "tcp", "traddr=10.0.3.2,trsvcid=4421");
    f.file(&format!("{NVME}/nvme/nvme0/transport"), "pcie\n");
    f.link("class/nvme/nvme0", &format!("{NVME}/nvme/nvme0"));
    let head = "devices/virtual/nvme-subsystem/nvme-subsys4/nvme6n1";
    f.disk(head, "nvme6n1", "259:41", 512, 128, Some(1));
    for (name, dir) in [
        ("nvme6c4n1", format!("{tcp}/nvme6c4n1")),
        ("nvme6c5n1", format!("{second}/nvme6c5n1")),
        ("nvme6c0n1", format!("{NVME}/nvme/nvme0/nvme6c0n1")),
    ] {
        f.dir(&dir);
        f.link(&format!("{head}/multipath/{name}"), &dir);
    }
    let m = resolve_disk(&f, "nvme6n1", 41);
    let paths: Vec<(String, Option<String>)> = m
        .multipath
        .iter()
        .map(|p| (p.to_string(), p.transport.as_ref().map(|t| t.kind.clone())))
        .collect();
    assert_eq!(
        paths,
        [
            (
                "nvme6c0n1 (nvme0 at 0000:03:00.0)".to_string(),
                Some("pcie".to_string())
            ),
            (
                "nvme6c4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420,src_addr=10.0.2.15)"
                    .to_string(),
                Some("tcp".to_string())
            ),
            (
                "nvme6c5n1 (nvme5 over NVMe/TCP to traddr=10.0.3.2,trsvcid=4421)".to_string(),
                Some("tcp".to_string())
            ),
        ]
    );
    assert_eq!(
        m.to_json()["multipath"][2]["transport"]["address"],
        "traddr=10.0.3.2,trsvcid=4421"
    );
    // A controller sysfs says nothing of has no transport.
    assert_eq!(
        resolve_disk(&f, "nvme0n1", 0).transport.map(|t| t.kind),
        Some("pcie".to_string())
    );
}

#[test]
fn paths_all_down_are_named_with_their_states() {
    let f = FakeSys::machine();
    let a = fabrics_controller(&f, "nvme4", "tcp", "traddr=10.0.2.2,trsvcid=4420");
    let b = fabrics_controller(&f, "nvme5", "tcp", "traddr=10.0.2.2,trsvcid=4421");
    let head = "devices/virtual/nvme-subsystem/nvme-subsys4/nvme6n1";
    f.disk(head, "nvme6n1", "259:41", 512, 128, Some(21));
    for (name, dir) in [
        ("nvme6c4n1", format!("{a}/nvme6c4n1")),
        ("nvme6c5n1", format!("{b}/nvme6c5n1")),
    ] {
        f.dir(&dir);
        f.link(&format!("{head}/multipath/{name}"), &dir);
    }
    let topo = f.topology();
    let m = resolve_disk(&f, "nvme6n1", 41);
    let down = || crate::discovery::paths_down(&m.multipath, |c| topo.controller_state(c));
    // One path live: nothing to say.
    f.file(&format!("{b}/state"), "connecting\n");
    assert_eq!(down(), None);
    // Both down: each named, with its state; a controller gone says so.
    f.file(&format!("{a}/state"), "connecting\n");
    assert_eq!(
        down().unwrap(),
        "no path of the multipath namespace is live: nvme6c4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420) is connecting, nvme6c5n1 (nvme5 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4421) is connecting"
    );
    std::fs::remove_file(f.sys().join("class/nvme/nvme5")).unwrap();
    assert!(
        down().unwrap().ends_with("trsvcid=4421) is gone"),
        "{:?}",
        down()
    );
    // A namespace of one controller over a fabric.
    let one = [m.multipath[0].clone()];
    assert_eq!(
        crate::discovery::paths_down(&one, |c| topo.controller_state(c)).unwrap(),
        "its controller is not live: nvme6c4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420) is connecting"
    );
}
