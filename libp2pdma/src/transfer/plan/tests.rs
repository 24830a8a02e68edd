//! The rule's reasons, word for word where users read them, and a table
//! test of every preference over random facts against a reference written
//! as a truth table.

use proptest::prelude::*;

use super::*;
use crate::{
    discovery::{NvmePath, Transport},
    memory::{
        peer::{MapType, P2pQuery},
        MemoryKind,
    },
    Error, PciAddress,
};

fn query(map_type: MapType, distance: Option<u32>, reason: &str) -> P2pQuery {
    P2pQuery {
        map_type,
        distance,
        reason: reason.to_string(),
        peer: "0000:03:00.0".parse().unwrap(),
    }
}

fn bar() -> MemoryFacts {
    MemoryFacts {
        kind: MemoryKind::ModuleBar {
            index: 0,
            pci: "0000:05:00.0".parse().unwrap(),
        },
        cpu_mapping: true,
        module_allocation: true,
        block_io: false,
        dmabuf: false,
    }
}

/// AUTO with everything P2P needs but the kernel's answer, `p2p`.
fn facts(p2p: Option<&P2pQuery>) -> Facts {
    Facts {
        pref: PathPref::Auto,
        submit: P2pSubmit::Auto,
        module: true,
        accelerator: true,
        memory: bar(),
        storage: StorageFacts {
            path: "/dev/nvme0n1".into(),
            nvme: true,
            ..StorageFacts::default()
        },
        p2p: p2p.cloned(),
        paths: Vec::new(),
    }
}

const TAIL: &str = "; the library will stage through host memory (bounce pipeline)";
const ODIRECT: &str = "; O_DIRECT on the memory's mapping (pages pinned per I/O): the module's block I/O needs a module allocation and a module with BLOCK_IO";

/// The choice, and the reason without how P2P is submitted (checked on
/// its own in [`p2p_says_how_its_io_is_submitted`]).
fn choose(f: &Facts) -> PathChoice {
    let mut c = decide(f).unwrap();
    if c.path == TransferPath::P2p {
        c.reason = c.reason.strip_suffix(ODIRECT).unwrap().to_string();
    }
    c
}

#[test]
fn p2p_is_chosen_when_the_kernel_maps_by_bus_address_or_an_allowed_host_bridge() {
    let q = query(
        MapType::BusAddr,
        Some(4),
        "a and b share upstream bridge c: P2P by bus address",
    );
    let c = choose(&facts(Some(&q)));
    assert_eq!(c.path, TransferPath::P2p);
    assert_eq!(
        c.reason,
        "P2P by PCI bus address (distance 4): a and b share upstream bridge c: P2P by bus address"
    );
    let q = query(
        MapType::ThruHostBridge,
        Some(6),
        "they meet at an allowed host bridge",
    );
    let c = choose(&facts(Some(&q)));
    assert_eq!(c.path, TransferPath::P2p);
    assert!(
        c.reason
            .starts_with("P2P through a host bridge the kernel allows (distance 6): they meet"),
        "{}",
        c.reason
    );
    let q = query(MapType::BusAddr, None, "x");
    assert!(choose(&facts(Some(&q))).reason.contains("unknown distance"));
}

#[test]
fn bounce_is_chosen_with_the_first_missing_piece() {
    let q = query(MapType::BusAddr, Some(4), "fine");
    let all = facts(Some(&q));
    let with = |f: &dyn Fn(&mut Facts)| {
        let mut x = all.clone();
        f(&mut x);
        x
    };
    let cases = [
        (
            with(&|f| f.module = false),
            "the p2pdma kernel module is not available",
        ),
        (
            with(&|f| {
                f.module = false;
                f.accelerator = false;
                f.storage.nvme = false;
                f.p2p = None;
            }),
            "the p2pdma kernel module is not available",
        ),
        (
            with(&|f| f.accelerator = false),
            "the accelerator is not bound to the p2pdma module",
        ),
        (
            with(&|f| {
                f.accelerator = false;
                f.storage.nvme = false;
            }),
            "the accelerator is not bound",
        ),
        (
            with(&|f| f.storage.nvme = false),
            "the storage is not on an NVMe namespace",
        ),
        (with(&|f| f.p2p = None), "the kernel did not answer"),
    ];
    for (f, want) in cases {
        let c = choose(&f);
        assert_eq!(c.path, TransferPath::Bounce, "{f:?}");
        assert!(
            c.reason.starts_with(&format!("P2P not possible: {want}")),
            "{f:?}: {}",
            c.reason
        );
        assert!(c.reason.ends_with(TAIL), "{}", c.reason);
    }
}

#[test]
fn bounce_quotes_the_kernels_refusal() {
    let why =
        "0000:03:00.0 and 0000:04:00.0 do not share an upstream bridge or whitelisted host bridge";
    let q = query(MapType::NotSupported, None, why);
    let c = choose(&facts(Some(&q)));
    assert_eq!(c.path, TransferPath::Bounce);
    assert_eq!(c.reason, format!("P2P not possible: {why}{TAIL}"));
    let q = query(MapType::NotSupported, None, "");
    assert_eq!(
        choose(&facts(Some(&q))).reason,
        format!("P2P not possible: the kernel answers not-supported{TAIL}")
    );
    let q = query(MapType::Unknown(9), Some(1), "");
    let c = choose(&facts(Some(&q)));
    assert_eq!(c.path, TransferPath::Bounce);
    assert!(
        c.reason.contains("the kernel answers unknown(9)"),
        "{}",
        c.reason
    );
}

fn mp_path(name: &str, ctrl: &str, pci: &str) -> NvmePath {
    NvmePath {
        name: name.into(),
        controller: Some(ctrl.into()),
        pci: Some(pci.parse().unwrap()),
        transport: None,
    }
}

/// A transport of `kind` to the rig's storage machine.
fn transport(kind: &str) -> Transport {
    Transport {
        kind: kind.into(),
        address: (kind != "pcie").then(|| "traddr=10.0.2.2,trsvcid=4420".into()),
        subsysnqn: Some("nqn.2026-11.io.p2pdma:store".into()),
        state: Some("live".into()),
    }
}

/// A path of a fabrics controller, which has no PCI function.
fn fabric_path(name: &str, ctrl: &str, kind: &str) -> NvmePath {
    NvmePath {
        name: name.into(),
        controller: Some(ctrl.into()),
        pci: None,
        transport: Some(Box::new(transport(kind))),
    }
}

#[test]
fn a_namespace_over_a_fabric_gets_no_p2p_and_says_why() {
    let tcp = fabric_path("nvme4n1", "nvme4", "tcp");
    let mut f = facts(None);
    f.storage.fabric = Some(tcp);
    let c = decide(&f).unwrap();
    assert_eq!(c.path, TransferPath::Bounce);
    assert!(
        c.reason.starts_with(
            "P2P not possible: nvme4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420): NVMe/TCP carries the data through the network stack"
        ),
        "{}",
        c.reason
    );
    // Under a multipath head: one path over TCP refuses P2P for all, a
    // PCIe path beside it whatever the kernel says of that one.
    let mut m = facts(None);
    m.paths = vec![
        (
            mp_path("nvme1c1n1", "nvme1", "0000:07:00.0"),
            Some(query(MapType::BusAddr, Some(4), "same switch")),
        ),
        (fabric_path("nvme1c4n1", "nvme4", "tcp"), None),
    ];
    let c = decide(&m).unwrap();
    assert_eq!(c.path, TransferPath::Bounce);
    assert!(
        c.reason.contains("path nvme1c4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420): NVMe/TCP carries"),
        "{}",
        c.reason
    );
    // RDMA says what it needs; PCIe is left to the kernel's answer.
    f.storage.fabric = Some(fabric_path("nvme5n1", "nvme5", "rdma"));
    let c = decide(&f).unwrap();
    assert!(
        c.reason.contains("never over soft RDMA (rxe, siw"),
        "{}",
        c.reason
    );
    f.storage.fabric = Some(NvmePath {
        transport: Some(Box::new(transport("pcie"))),
        ..mp_path("nvme0n1", "nvme0", "0000:03:00.0")
    });
    f.p2p = Some(query(MapType::BusAddr, Some(4), "same switch"));
    assert_eq!(decide(&f).unwrap().path, TransferPath::P2p);
}

#[test]
fn nothing_forces_p2p_data_over_a_fabric() {
    let mut f = facts(None);
    f.storage.fabric = Some(fabric_path("nvme4n1", "nvme4", "tcp"));
    f.storage.namespace = Some(NamespaceFacts {
        generic: "/dev/ng4n1".into(),
        nsid: 21,
    });
    // Forced P2P, and NVMe commands with accelerator memory for their
    // data: both refused with the transport's reason.
    for (pref, name) in [(PathPref::P2p, "p2p"), (PathPref::NvmeCmd, "nvme-cmd")] {
        f.pref = pref;
        match decide(&f) {
            Err(Error::PathUnavailable { path, reason }) => {
                assert_eq!(path, name);
                assert!(
                    reason.contains("nvme4n1 (nvme4 over NVMe/TCP to traddr=10.0.2.2,trsvcid=4420): NVMe/TCP carries the data"),
                    "{reason}"
                );
            }
            r => panic!("{name} over NVMe/TCP: {r:?}"),
        }
    }
    // NVMe commands into host memory cross the network as any read does.
    f.memory.kind = MemoryKind::Host;
    assert_eq!(decide(&f).unwrap().path, TransferPath::NvmeCmd);
}

#[test]
fn a_multipath_namespace_gets_p2p_only_when_every_path_allows_it() {
    let a = mp_path("nvme1c1n1", "nvme1", "0000:07:00.0");
    let b = mp_path("nvme1c2n1", "nvme2", "0000:08:00.0");
    let near = query(MapType::BusAddr, Some(4), "shared switch");
    let host = query(MapType::ThruHostBridge, Some(6), "allowed host bridge");
    let far = query(
        MapType::NotSupported,
        None,
        "do not share an upstream bridge",
    );
    // The answer for one controller does not count for a multipath
    // namespace: only the paths' answers do.
    let mp = |paths: Vec<(NvmePath, Option<P2pQuery>)>| Facts {
        paths,
        ..facts(Some(&near))
    };
    let both = mp(vec![
        (a.clone(), Some(near.clone())),
        (b.clone(), Some(host.clone())),
    ]);
    let c = choose(&both);
    assert_eq!(c.path, TransferPath::P2p);
    assert_eq!(
        c.reason,
        "P2P on every path of the multipath namespace, since I/O may take any of them; \
         path nvme1c1n1 (nvme1 at 0000:07:00.0): P2P by PCI bus address (distance 4): shared switch; \
         path nvme1c2n1 (nvme2 at 0000:08:00.0): P2P through a host bridge the kernel allows (distance 6): allowed host bridge"
    );
    assert_eq!(p2p_refusal(&both), None);

    let one_far = mp(vec![
        (a.clone(), Some(near.clone())),
        (b.clone(), Some(far.clone())),
    ]);
    let c = choose(&one_far);
    assert_eq!(c.path, TransferPath::Bounce);
    assert_eq!(
        c.reason,
        format!(
            "P2P not possible: path nvme1c2n1 (nvme2 at 0000:08:00.0): do not share an upstream bridge \
             (I/O to a multipath namespace may take any of its paths, so P2P needs every one){TAIL}"
        )
    );
    assert_eq!(
        p2p_refusal(&one_far),
        Some(P2pRefusal::KernelOnPath(
            b.clone(),
            "do not share an upstream bridge".into()
        ))
    );

    let unasked = mp(vec![(a.clone(), None), (b.clone(), Some(near.clone()))]);
    assert_eq!(
        p2p_refusal(&unasked),
        Some(P2pRefusal::NoAnswerOnPath(a.clone()))
    );
    assert_eq!(
        choose(&unasked).reason,
        format!(
            "P2P not possible: the kernel did not answer whether path nvme1c1n1 (nvme1 at 0000:07:00.0) \
             reaches the accelerator (I/O to a multipath namespace may take any of its paths, so P2P needs every one){TAIL}"
        )
    );
    // The pieces before the kernel's answer come first.
    let no_module = Facts {
        module: false,
        ..both
    };
    assert_eq!(p2p_refusal(&no_module), Some(P2pRefusal::NoModule));
}

#[test]
fn an_md_array_gets_p2p_only_on_a_level_that_takes_it_and_when_every_member_reaches() {
    let a = mp_path("nvme1n1", "nvme1", "0000:07:00.0");
    let b = mp_path("nvme2n1", "nvme2", "0000:08:00.0");
    let near = query(MapType::BusAddr, Some(4), "shared switch");
    let far = query(
        MapType::NotSupported,
        None,
        "do not share an upstream bridge",
    );
    let array = |level: &str, paths: Vec<(NvmePath, Option<P2pQuery>)>| {
        let mut f = Facts {
            paths,
            // The array's own answer (it has no controller) never counts.
            ..facts(Some(&near))
        };
        f.storage.path = "/dev/md0".into();
        f.storage.array = Some(ArrayFacts {
            name: "md0".into(),
            level: level.into(),
        });
        f
    };
    let both = || {
        vec![
            (a.clone(), Some(near.clone())),
            (b.clone(), Some(near.clone())),
        ]
    };
    for level in ["raid0", "raid1", "raid10"] {
        let c = choose(&array(level, both()));
        assert_eq!(c.path, TransferPath::P2p, "{level}");
        assert_eq!(
            c.reason,
            format!(
                "P2P on every member of md array md0 ({level}), since its I/O reaches all of them; \
                 member nvme1n1 (nvme1 at 0000:07:00.0): P2P by PCI bus address (distance 4): shared switch; \
                 member nvme2n1 (nvme2 at 0000:08:00.0): P2P by PCI bus address (distance 4): shared switch"
            )
        );
    }
    // A level the kernel gives no P2P pages to, whatever the members.
    let raid5 = array("raid5", both());
    assert_eq!(
        p2p_refusal(&raid5),
        Some(P2pRefusal::ArrayLevel("md0".into(), "raid5".into()))
    );
    assert_eq!(
        choose(&raid5).reason,
        format!(
            "P2P not possible: md array md0 is raid5: the kernel takes P2P pages only on raid0, raid1 and raid10 arrays whose members all take them{TAIL}"
        )
    );
    // One member out of reach: refused for reads and writes alike (a
    // mirror's write goes to every leg), naming the member.
    let one_far = array(
        "raid1",
        vec![
            (a.clone(), Some(near.clone())),
            (b.clone(), Some(far.clone())),
        ],
    );
    assert_eq!(
        p2p_refusal(&one_far),
        Some(P2pRefusal::KernelOnMember(
            "md0".into(),
            b.clone(),
            "do not share an upstream bridge".into()
        ))
    );
    assert_eq!(
        choose(&one_far).reason,
        format!(
            "P2P not possible: member nvme2n1 (nvme2 at 0000:08:00.0) of md array md0: do not share an upstream bridge \
             (I/O to an md array reaches its members, and a write to a mirror every leg, so P2P needs every one){TAIL}"
        )
    );
    let unasked = array(
        "raid0",
        vec![(a.clone(), None), (b.clone(), Some(near.clone()))],
    );
    assert_eq!(
        p2p_refusal(&unasked),
        Some(P2pRefusal::NoAnswerOnMember("md0".into(), a.clone()))
    );
    // No member to ask: no P2P, even with an answer for the array itself.
    let empty = array("raid0", Vec::new());
    assert_eq!(
        p2p_refusal(&empty),
        Some(P2pRefusal::NoMembers("md0".into()))
    );
    // P2P is never forced onto such an array: a write could land on some
    // legs only.
    let forced = Facts {
        pref: PathPref::P2p,
        ..array(
            "raid1",
            vec![
                (a.clone(), Some(near.clone())),
                (b.clone(), Some(far.clone())),
            ],
        )
    };
    match decide(&forced) {
        Err(Error::PathUnavailable {
            path: "p2p",
            reason,
        }) => assert!(
            reason.starts_with(
                "member nvme2n1 (nvme2 at 0000:08:00.0) of md array md0: do not share"
            ) && reason.ends_with("where a write could land on some legs only"),
            "{reason}"
        ),
        other => panic!("forced P2P onto the array: {other:?}"),
    }
    let forced_ok = Facts {
        pref: PathPref::P2p,
        ..array("raid10", both())
    };
    assert_eq!(decide(&forced_ok).unwrap().path, TransferPath::P2p);
}

#[test]
fn refusals_are_values_with_the_reason_as_their_text() {
    let q = query(MapType::NotSupported, None, "no common bridge");
    assert_eq!(
        p2p_refusal(&facts(Some(&q))),
        Some(P2pRefusal::Kernel("no common bridge".into()))
    );
    assert_eq!(p2p_refusal(&facts(None)), Some(P2pRefusal::NoAnswer));
    let ok = query(MapType::BusAddr, Some(2), "fine");
    assert_eq!(p2p_refusal(&facts(Some(&ok))), None);
    let cases = [
        (
            Facts {
                module: false,
                ..facts(None)
            },
            P2pRefusal::NoModule,
        ),
        (
            Facts {
                accelerator: false,
                ..facts(None)
            },
            P2pRefusal::NoAccelerator,
        ),
    ];
    for (f, r) in cases {
        assert_eq!(p2p_refusal(&f).as_ref(), Some(&r));
        assert_eq!(choose(&f).reason, format!("P2P not possible: {r}{TAIL}"));
    }
    let mut f = facts(None);
    f.storage.nvme = false;
    assert_eq!(p2p_refusal(&f), Some(P2pRefusal::NotNvme));
    assert_eq!(P2pRefusal::Kernel("k".into()).to_string(), "k");
}

#[test]
fn p2p_says_how_its_io_is_submitted() {
    let q = query(MapType::BusAddr, Some(2), "fine");
    let reason = |submit, is_file, block_io| {
        let mut f = facts(Some(&q));
        f.submit = submit;
        f.storage.is_file = is_file;
        f.memory.block_io = block_io;
        decide(&f).unwrap().reason
    };
    assert!(reason(P2pSubmit::Auto, false, true).ends_with(
        "; the module submits the block I/O on the memory's own pages (BLOCK_IO: nothing pinned per I/O)"
    ));
    assert!(reason(P2pSubmit::Odirect, false, true)
        .ends_with("; O_DIRECT on the memory's mapping, as configured (pages pinned per I/O)"));
    assert!(reason(P2pSubmit::Auto, true, true).ends_with(
        "; O_DIRECT on the memory's mapping (a regular file: its filesystem's direct I/O pins the pages per I/O)"
    ));
    assert!(reason(P2pSubmit::Auto, false, false).ends_with(ODIRECT));
}

#[test]
fn other_memory_is_staged_with_its_own_reason() {
    let mut f = facts(Some(&query(MapType::BusAddr, Some(2), "fine")));
    f.memory.kind = MemoryKind::Host;
    let c = choose(&f);
    assert_eq!(c.path, TransferPath::Direct);
    assert_eq!(
        c.reason,
        "the memory is host memory (the host-memory device), which needs no P2P: the storage DMAs straight into it by O_DIRECT, no staging copy (the bounce pipeline where the file and memory addresses do not align together to the block)"
    );
    f.memory.cpu_mapping = false;
    assert_eq!(
        choose(&f).reason,
        "P2P not possible: the memory is the host-memory device, not accelerator memory; staging through host memory (bounce pipeline)"
    );
    f.memory.cpu_mapping = true;
    f.memory.kind = MemoryKind::Cuda {
        ordinal: 1,
        pci: None,
    };
    let c = choose(&f);
    assert_eq!(c.path, TransferPath::Bounce);
    assert!(
        c.reason
            .starts_with("P2P by O_DIRECT not possible: CUDA device 1's memory"),
        "{}",
        c.reason
    );
    f.memory.kind = MemoryKind::Dmabuf;
    assert!(choose(&f)
        .reason
        .contains("dma-buf memory has no CPU mapping"));
}

#[test]
fn forced_paths_say_why_they_cannot_be_taken() {
    let unavailable = |f: &Facts| match decide(f) {
        Err(Error::PathUnavailable { path, reason }) => (path, reason),
        other => panic!("{other:?}"),
    };
    let mut f = facts(None);
    f.pref = PathPref::NvmeCmd;
    f.storage.nvme = false;
    f.storage.path = "/mnt/btrfs/x".into();
    f.storage.other_filesystem = Some("btrfs files are on no block device of their own".into());
    assert_eq!(
        unavailable(&f),
        (
            "nvme-cmd",
            "/mnt/btrfs/x is not on an NVMe namespace (NVMe commands address namespace blocks); besides, btrfs files are on no block device of their own".into()
        )
    );
    f.storage.namespace = Some(NamespaceFacts {
        generic: "/dev/ng0n1".into(),
        nsid: 1,
    });
    f.storage.dev_start = 1 << 20;
    f.storage.filesystem = Some(Ok("XFS".into()));
    let c = decide(&f).unwrap();
    assert_eq!(c.path, TransferPath::NvmeCmd);
    assert!(
        c.reason.starts_with(
            "NVMe commands built by the library on /dev/ng0n1 (namespace 1, partition at byte 1048576); file extents mapped with FIEMAP (XFS); P2P not possible:"
        ),
        "{}",
        c.reason
    );
    f.memory.cpu_mapping = false;
    assert_eq!(
        unavailable(&f).1,
        "accelerator 0 (0000:05:00.0) BAR memory has no CPU mapping to give the controller"
    );
    f.pref = PathPref::P2p;
    assert_eq!(
        unavailable(&f),
        (
            "p2p",
            "accelerator 0 (0000:05:00.0) BAR memory has no CPU mapping storage could DMA into"
                .into()
        )
    );
    f.pref = PathPref::Queues;
    assert!(unavailable(&f)
        .1
        .starts_with("/mnt/btrfs/x is reached through the kernel;"));
    f.storage.driven = Some(DrivenFacts {
        name: "0000:03:00.0 n1".into(),
        iommu: "no IOMMU".into(),
        members: vec![member(
            "0000:03:00.0 n1",
            Some(Ok(query(MapType::BusAddr, Some(4), "switch"))),
        )],
    });
    f.memory.cpu_mapping = true;
    assert_eq!(
        decide(&f).unwrap().reason,
        "0000:03:00.0 n1 is driven by this process (no IOMMU): NVMe commands in queues in accelerator memory, no system call per I/O; data accelerator 0's memory mapped for the controller (DMA_MAP), P2P distance 4; partial blocks through host staging"
    );
    f.pref = PathPref::Bounce;
    assert_eq!(
        unavailable(&f),
        (
            "bounce",
            "0000:03:00.0 n1 is driven by this process, so only the queues path reaches it; give the controller back to the kernel for the other paths".into()
        )
    );
    // A striped volume: each member's reach, said once when all agree.
    f.pref = PathPref::Auto;
    let far = query(MapType::NotSupported, None, "behind the host bridge");
    let near = || Some(Ok(query(MapType::BusAddr, Some(4), "switch")));
    f.storage.driven = Some(DrivenFacts {
        name: "striped volume".into(),
        iommu: "no IOMMU".into(),
        members: vec![member("a n1", near()), member("b n1", near())],
    });
    assert!(decide(&f).unwrap().reason.contains(
        "data on each of its 2 members, accelerator 0's memory mapped for the controller (DMA_MAP), P2P distance 4;"
    ));
    f.storage.driven.as_mut().unwrap().members[1].reach = Some(Ok(far));
    let reason = decide(&f).unwrap().reason;
    assert!(
        reason.contains("on member a n1, accelerator 0's memory mapped for the controller (DMA_MAP), P2P distance 4; on member b n1, through host staging buffers: the kernel says 0000:03:00.0 cannot reach"),
        "{reason}"
    );
}

fn member(name: &str, reach: Option<Result<P2pQuery, String>>) -> DrivenMember {
    DrivenMember {
        name: name.into(),
        controller: "0000:03:00.0".parse().unwrap(),
        reach,
    }
}

// The table: every preference over random facts, against a reference
// written as a truth table.

fn answer() -> impl Strategy<Value = Option<P2pQuery>> {
    prop_oneof![
        Just(None),
        Just(Some(query(MapType::BusAddr, Some(4), "switch"))),
        Just(Some(query(MapType::ThruHostBridge, Some(6), "host bridge"))),
        Just(Some(query(MapType::NotSupported, None, "no bridge"))),
        Just(Some(query(MapType::Unknown(7), None, ""))),
    ]
}

fn memory() -> impl Strategy<Value = MemoryFacts> {
    let kind = prop_oneof![
        Just(MemoryKind::Host),
        Just(MemoryKind::Dmabuf),
        Just(MemoryKind::Cuda {
            ordinal: 0,
            pci: None
        }),
        Just(bar().kind),
    ];
    (kind, any::<[bool; 4]>()).prop_map(|(kind, b)| MemoryFacts {
        kind,
        cpu_mapping: b[0],
        module_allocation: b[1],
        block_io: b[2],
        dmabuf: b[3],
    })
}

fn driven() -> impl Strategy<Value = Option<DrivenFacts>> {
    let reach = prop_oneof![
        Just(None),
        answer().prop_map(|q| q.map(Ok)),
        Just(Some(Err("ENOTTY".to_string()))),
    ];
    prop_oneof![
        2 => Just(None),
        1 => proptest::collection::vec(reach, 1..4).prop_map(|reaches| Some(DrivenFacts {
            name: "0000:03:00.0 n1".into(),
            iommu: "no IOMMU".into(),
            members: reaches.into_iter().map(|r| member("0000:03:00.0 n1", r)).collect(),
        })),
    ]
}

fn storage() -> impl Strategy<Value = StorageFacts> {
    let fs = prop_oneof![
        Just(None),
        Just(Some(Ok("ext4".to_string()))),
        Just(Some(Err("btrfs: no FIEMAP".to_string()))),
    ];
    let array = prop_oneof![
        1 => Just(None),
        1 => prop_oneof![Just("raid0"), Just("raid1"), Just("raid10"), Just("raid5"), Just("linear")]
            .prop_map(|level| Some(ArrayFacts {
                name: "md0".into(),
                level: level.into(),
            })),
    ];
    (
        driven(),
        any::<[bool; 5]>(),
        prop_oneof![Just(0u64), Just(1u64 << 20)],
        fs,
        array,
    )
        .prop_flat_map(|t| (Just(t), fabric()))
        .prop_map(
            |((driven, b, dev_start, filesystem, array), fabric)| StorageFacts {
                path: "/data/x".into(),
                driven,
                is_file: b[0],
                nvme: b[1],
                namespace: b[2].then(|| NamespaceFacts {
                    generic: "/dev/ng0n1".into(),
                    nsid: 3,
                }),
                nvme_cmd_refusal: b[3].then(|| "metadata per block".to_string()),
                dev_start,
                filesystem,
                other_filesystem: b[4].then(|| "tmpfs".to_string()),
                array,
                fabric,
            },
        )
}

/// A namespace's one controller, over PCIe or a fabric, or none said.
fn fabric() -> impl Strategy<Value = Option<NvmePath>> {
    prop_oneof![
        2 => Just(None),
        1 => transports().prop_map(|t| t.map(|t| NvmePath {
            name: "nvme4n1".into(),
            controller: Some("nvme4".into()),
            pci: None,
            transport: Some(Box::new(t)),
        })),
    ]
}

/// A controller's transport, when sysfs says.
fn transports() -> impl Strategy<Value = Option<Transport>> {
    prop_oneof![
        Just(None),
        Just(Some(transport("pcie"))),
        Just(Some(transport("tcp"))),
        Just(Some(transport("rdma"))),
    ]
}

fn paths() -> impl Strategy<Value = Vec<(NvmePath, Option<P2pQuery>)>> {
    let path = |i: u8, transport: Option<Transport>| NvmePath {
        transport: transport.clone().map(Box::new),
        name: format!("nvme1c{i}n1"),
        controller: Some(format!("nvme{i}")),
        pci: Some(PciAddress {
            domain: 0,
            bus: i,
            device: 0,
            function: 0,
        })
        .filter(|_| !transport.as_ref().is_some_and(Transport::is_fabric)),
    };
    prop_oneof![
        1 => Just(Vec::new()),
        1 => proptest::collection::vec((answer(), transports()), 1..4).prop_map(move |qs| {
            qs.into_iter()
                .enumerate()
                .map(|(i, (q, t))| (path(i as u8 + 1, t), q))
                .collect()
        }),
    ]
}

fn pref() -> impl Strategy<Value = PathPref> {
    prop_oneof![
        Just(PathPref::Auto),
        Just(PathPref::P2p),
        Just(PathPref::NvmeCmd),
        Just(PathPref::Bounce),
        Just(PathPref::Queues),
    ]
}

prop_compose! {
    fn any_facts()(
        pref in pref(),
        odirect in any::<bool>(),
        module in any::<bool>(),
        accelerator in any::<bool>(),
        memory in memory(),
        storage in storage(),
        p2p in answer(),
        paths in paths(),
    ) -> Facts {
        Facts {
            pref,
            submit: if odirect { P2pSubmit::Odirect } else { P2pSubmit::Auto },
            module,
            accelerator,
            memory,
            storage,
            p2p,
            paths,
        }
    }
}

/// The rule as a truth table: the path, or the path asked for that cannot
/// be taken.
fn reference(f: &Facts) -> std::result::Result<TransferPath, &'static str> {
    use PathPref as P;
    use TransferPath as T;
    let maps = |q: &Option<P2pQuery>| {
        q.as_ref()
            .is_some_and(|q| matches!(q.map_type, MapType::BusAddr | MapType::ThruHostBridge))
    };
    // A controller over a fabric moves no data by P2P, whatever else.
    let fabric = |p: &NvmePath| p.transport.as_ref().is_some_and(|t| t.kind != "pcie");
    let every = !f.paths.is_empty() && f.paths.iter().all(|(p, q)| !fabric(p) && maps(q));
    let kernel = match &f.storage.array {
        // An array: a level that takes P2P pages, and every member reaches.
        Some(a) => matches!(a.level.as_str(), "raid0" | "raid1" | "raid10") && every,
        None if f.paths.is_empty() => {
            maps(&f.p2p) && !f.storage.fabric.as_ref().is_some_and(fabric)
        }
        None => every,
    };
    let bar = matches!(f.memory.kind, MemoryKind::ModuleBar { .. });
    let over_fabric =
        f.storage.fabric.as_ref().is_some_and(fabric) || f.paths.iter().any(|(p, _)| fabric(p));
    let p2p = bar && f.module && f.accelerator && f.storage.nvme && kernel;
    let s = &f.storage;
    let nvme_cmd = s.namespace.is_some()
        && s.nvme_cmd_refusal.is_none()
        && !matches!(s.filesystem, Some(Err(_)))
        && f.memory.cpu_mapping
        && (matches!(f.memory.kind, MemoryKind::Host) || !over_fabric);
    let cpu = f.memory.cpu_mapping;
    let host = matches!(f.memory.kind, MemoryKind::Host);
    match (s.driven.is_some(), f.pref, p2p, cpu, nvme_cmd) {
        (true, P::Auto | P::Queues, ..) => Ok(T::Queues),
        (true, p, ..) => Err(p.as_str()),
        (false, P::Auto, true, ..) => Ok(T::P2p),
        (false, P::Auto, false, true, _) if host => Ok(T::Direct),
        (false, P::Auto, false, ..) => Ok(T::Bounce),
        (false, P::Queues, ..) => Err("queues"),
        (false, P::Bounce, ..) => Ok(T::Bounce),
        (false, P::P2p, false, ..) if f.storage.array.is_some() && bar => Err("p2p"),
        (false, P::P2p, ..) if over_fabric && bar => Err("p2p"),
        (false, P::P2p, _, true, _) => Ok(T::P2p),
        (false, P::P2p, _, false, _) => Err("p2p"),
        (false, P::NvmeCmd, .., true) => Ok(T::NvmeCmd),
        (false, P::NvmeCmd, .., false) => Err("nvme-cmd"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn every_preference_over_any_facts_follows_the_table(f in any_facts()) {
        let got = decide(&f);
        match (reference(&f), &got) {
            (Ok(want), Ok(c)) => prop_assert_eq!(c.path, want, "{:?}: {}", f, c.reason),
            (Err(want), Err(Error::PathUnavailable { path, reason })) => {
                prop_assert_eq!(*path, want);
                prop_assert!(!reason.is_empty());
            }
            (want, got) => prop_assert!(false, "{:?}: want {:?}, got {:?}", f, want, got),
        }
        let Ok(c) = got else { return Ok(()) };
        // The reason says what the choice rests on.
        match c.path {
            TransferPath::P2p => {
                let module = f.submit == P2pSubmit::Auto
                    && !f.storage.is_file
                    && f.memory.block_io;
                prop_assert_eq!(c.reason.contains("(BLOCK_IO: nothing pinned per I/O)"), module);
                prop_assert_eq!(
                    c.reason.starts_with("P2P forced by configuration"),
                    f.pref == PathPref::P2p
                );
            }
            TransferPath::Bounce if f.pref == PathPref::Auto => {
                if let (MemoryKind::ModuleBar { .. }, Some(why)) =
                    (&f.memory.kind, p2p_refusal(&f))
                {
                    let want = format!("P2P not possible: {why};");
                    prop_assert!(c.reason.starts_with(&want), "{}", c.reason);
                }
            }
            TransferPath::Bounce => {
                prop_assert_eq!(c.reason.as_str(), "bounce path forced by configuration")
            }
            TransferPath::Direct => {
                prop_assert!(c.reason.contains("straight into it by O_DIRECT"), "{}", c.reason);
                prop_assert_eq!(f.pref, PathPref::Auto);
            }
            TransferPath::NvmeCmd => {
                prop_assert!(c.reason.contains("/dev/ng0n1 (namespace 3"));
                prop_assert_eq!(
                    c.reason.contains("partition at byte 1048576"),
                    f.storage.dev_start != 0
                );
                prop_assert_eq!(
                    c.reason.contains("FIEMAP (ext4)"),
                    f.storage.filesystem.is_some()
                );
            }
            TransferPath::Queues => {
                let m = &f.memory;
                let mapped = matches!(m.kind, MemoryKind::ModuleBar { .. })
                    && m.module_allocation
                    && f.storage.driven.as_ref().is_some_and(|d| {
                        d.members.iter().any(|x| {
                            matches!(x.reach.as_ref(), Some(Ok(q)) if q.distance.is_some())
                        })
                    });
                prop_assert_eq!(c.reason.contains("(DMA_MAP), P2P distance"), mapped);
                prop_assert!(c.reason.starts_with("0000:03:00.0 n1 is driven by this process"));
            }
        }
        // The same facts, the same answer.
        prop_assert_eq!(decide(&f.clone()).ok(), Some(c));
    }
}
