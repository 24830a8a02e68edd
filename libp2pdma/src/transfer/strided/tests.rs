use super::{
    cost::{tat_groups, tat_plan, Group, ReadCost, MIB_F},
    *,
};
use crate::Error;

#[test]
fn shape_numbers_and_runs() {
    // Columns 10..14 of a 100-byte-wide table of 3 rows, at 1000.
    let s = Shape::new(1010, 4, &[(100, 3)]).unwrap();
    assert_eq!(s.runs(), 3);
    assert_eq!(s.bytes(), 12);
    assert_eq!(s.bounds(), (1010, 1214));
    assert!((s.rho() - 12.0 / 204.0).abs() < 1e-12);
    let runs: Vec<_> = s.iter().map(|r| (r.file_offset, r.packed_offset)).collect();
    assert_eq!(runs, vec![(1010, 0), (1110, 4), (1210, 8)]);
    // Three dimensions, innermost first.
    let s = Shape::new(0, 2, &[(3, 2), (10, 2), (100, 2)]).unwrap();
    let offs: Vec<_> = s.iter().map(|r| r.file_offset).collect();
    assert_eq!(offs, vec![0, 3, 10, 13, 100, 103, 110, 113]);
    assert_eq!(s.bounds(), (0, 115));
    for (k, &o) in offs.iter().enumerate() {
        assert_eq!(s.first_ending_after(o), k as u64);
        assert_eq!(s.first_ending_after(o + 1), k as u64);
        assert_eq!(s.first_ending_after(o + 2), k as u64 + 1);
    }
    // No dimensions: one run; touching runs are fine.
    assert_eq!(Shape::new(5, 7, &[]).unwrap().bounds(), (5, 12));
    assert_eq!(Shape::new(0, 4, &[(4, 3)]).unwrap().rho(), 1.0);
    // A count of 1 ignores its stride.
    assert_eq!(Shape::new(0, 4, &[(0, 1)]).unwrap().runs(), 1);
}

#[test]
fn bad_shapes_are_errors() {
    type Bad = (u64, u64, &'static [(u64, u64)]);
    let bad: &[Bad] = &[
        (0, 0, &[]),
        (0, 4, &[(8, 0)]),
        (0, 4, &[(8, 2), (100, 0)]),
        (0, 1, &[(1, 1), (1, 1), (1, 1), (1, 1)]),
        // Overlapping runs, and overlapping rows of runs.
        (0, 8, &[(4, 2)]),
        (0, 4, &[(4, 3), (8, 2)]),
        (0, 4, &[(0, 2)]),
        // Overflows.
        (u64::MAX - 3, 4, &[]),
        (u64::MAX - 10, 4, &[(8, 2)]),
        (0, 1, &[(u64::MAX, 3)]),
        (0, 1, &[(1, u64::MAX), (u64::MAX, 2)]),
        (0, u64::MAX, &[(u64::MAX, 2)]),
    ];
    for &(base, run, dims) in bad {
        match Shape::new(base, run, dims) {
            Err(Error::InvalidArgument(why)) => assert!(why.starts_with("strided shape: ")),
            other => panic!("{base} {run} {dims:?}: {other:?}"),
        }
    }
}

#[test]
fn tat_groups_split_at_wide_gaps() {
    // Rows of 4 runs of 10 bytes, 20 apart; rows 1000 apart.
    let s = Shape::new(5, 10, &[(20, 4), (1000, 3)]).unwrap();
    let g = |start, end| Group { start, end };
    assert_eq!(tat_groups(&s, 9).len(), 12);
    assert_eq!(
        tat_groups(&s, 10),
        (0..3)
            .map(|r| g(5 + r * 1000, 75 + r * 1000))
            .collect::<Vec<_>>()
    );
    assert_eq!(tat_groups(&s, 930), vec![g(5, 2075)]);
    assert_eq!(tat_groups(&s, 929).len(), 3);
    assert_eq!(tat_groups(&s, 0).len(), 12);
    // Touching runs always go together.
    let s = Shape::new(0, 8, &[(8, 5)]).unwrap();
    assert_eq!(tat_groups(&s, 0), vec![g(0, 40)]);
}

#[test]
fn tat_reads_gaps_where_that_beats_more_reads() {
    use super::super::constants::Constants;
    let d = ReadCost::of_constants(&Constants::default());
    // The development host: 1 MiB reads on four threads stream at
    // about half the rate of one large read.
    let host = ReadCost {
        call_s: 100e-6,
        call_mib_s: 4.1e-3,
        storage_bps: 2.5 * (1u64 << 30) as f64,
    };
    let groups = |s: &Shape, k: &ReadCost| tat_plan(s, k, 4096).len();
    // 48 runs of 1 MiB, 1.33 MiB apart: one read with the gaps on the
    // host; 48 reads on four threads with the defaults' full rate.
    let mib = Shape::new(0, 1 << 20, &[(1_398_101, 48)]).unwrap();
    assert_eq!(groups(&mib, &host), 1);
    assert_eq!(groups(&mib, &d), 48);
    // Clusters of 8 runs of 4 KiB, 16 MiB apart: the clusters apart
    // (their gaps would cost far more than a call), each one read.
    let clusters = Shape::new(0, 4096, &[(8192, 8), (16 << 20, 8)]).unwrap();
    assert_eq!(groups(&clusters, &host), 8);
    assert_eq!(groups(&clusters, &d), 8);
    // Touching runs are always one read.
    let dense = Shape::new(0, 512, &[(512, 1000)]).unwrap();
    assert_eq!(groups(&dense, &host), 1);
    // One thread streams at s; four at what 1 MiB reads showed.
    assert_eq!(host.rate(1), host.storage_bps);
    let all = 4.0 * MIB_F / (4.1e-3 - 100e-6);
    assert!((host.rate(4) - all).abs() < 1.0);
    assert!(host.rate(2) < host.rate(1) && host.rate(2) > host.rate(4));
}

#[test]
fn plan_table() {
    const MIB: u64 = 1 << 20;
    let base = PlanFacts {
        bounding: 64 * MIB,
        interest: 32 * MIB,
        runs: 1024,
        sc_storage: 32 * MIB + 1024 * 4096,
        tat_storage: 64 * MIB,
        tat_calls: 1,
        rc_fits: true,
        direct: false,
        sc_aligned: true,
        rc_aligned: true,
        call_s: DEFAULT_CALL_S,
        call_mib_s: DEFAULT_CALL_MIB_S,
        storage_bps: DEFAULT_STORAGE_BPS,
        copy_bps: DEFAULT_COPY_BPS,
        pack_bps: DEFAULT_PACK_BPS,
        copy_call_s: DEFAULT_COPY_CALL_S,
    };
    let cases: &[(&str, PlanFacts, StridedMode)] = &[
        (
            "bounce, storage-bound: TaT ties RC and copies less",
            base,
            StridedMode::Tat,
        ),
        (
            "P2P, room for RC: one read, no CPU copy",
            PlanFacts {
                direct: true,
                ..base
            },
            StridedMode::Rc,
        ),
        (
            "P2P, packed layout: TaT's single call beats 1024 calls",
            PlanFacts {
                direct: true,
                rc_fits: false,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "bounce, slow copies: RC copies the whole volume, TaT only rho of it",
            PlanFacts {
                copy_bps: DEFAULT_STORAGE_BPS / 4.0,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "bounce, tiny rho: TaT's groups are the 4 runs, read as SC's, copies overlapped",
            PlanFacts {
                bounding: 1024 * MIB,
                interest: 4 * 4096,
                runs: 4,
                sc_storage: 4 * 4096,
                tat_storage: 4 * 4096,
                tat_calls: 4,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "tiny rho, P2P, packed: SC ties TaT and reads straight into the memory",
            PlanFacts {
                bounding: 1024 * MIB,
                interest: 4 * 4096,
                runs: 4,
                sc_storage: 4 * 4096,
                tat_storage: 4 * 4096,
                tat_calls: 4,
                direct: true,
                rc_fits: false,
                ..base
            },
            StridedMode::Sc,
        ),
        (
            "many small runs close together, packed: one bulk read, packed on the host",
            PlanFacts {
                bounding: 8 * MIB,
                interest: 4 * MIB,
                runs: 65536,
                sc_storage: 65536 * 4096,
                tat_storage: 8 * MIB,
                rc_fits: false,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "many small runs close together, strided layout: TaT's copy per run costs more than RC's gaps",
            PlanFacts {
                bounding: 8 * MIB,
                interest: 4 * MIB,
                runs: 65536,
                sc_storage: 65536 * 4096,
                tat_storage: 8 * MIB,
                ..base
            },
            StridedMode::Rc,
        ),
        (
            "bounce, packed, 4096 runs of 8 KiB: one read packed on the host",
            PlanFacts {
                runs: 4096,
                sc_storage: 32 * MIB,
                rc_fits: false,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "the same with packing 16 times slower than storage: SC needs no packing",
            PlanFacts {
                runs: 4096,
                sc_storage: 32 * MIB,
                rc_fits: false,
                pack_bps: DEFAULT_STORAGE_BPS / 16.0,
                ..base
            },
            StridedMode::Sc,
        ),
        (
            "48 runs of 1 MiB, 1 MiB reads streaming at half the rate of a large one: one read beats 12 a thread",
            PlanFacts {
                bounding: 64 * MIB,
                interest: 48 * MIB,
                runs: 48,
                sc_storage: 48 * MIB,
                tat_storage: 64 * MIB,
                tat_calls: 1,
                rc_fits: false,
                call_s: 150e-6,
                call_mib_s: 4.5e-3,
                storage_bps: 1.74 * (1u64 << 30) as f64,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "the same on P2P with room: RC, no copy",
            PlanFacts {
                bounding: 64 * MIB,
                interest: 48 * MIB,
                runs: 48,
                sc_storage: 48 * MIB,
                tat_storage: 64 * MIB,
                tat_calls: 1,
                direct: true,
                call_s: 150e-6,
                call_mib_s: 4.5e-3,
                storage_bps: 1.74 * (1u64 << 30) as f64,
                ..base
            },
            StridedMode::Rc,
        ),
        (
            "bounce, strided layout, rho 1: RC and TaT read the same; RC copies in chunks, TaT run by run",
            PlanFacts {
                interest: 64 * MIB,
                runs: 131072,
                sc_storage: 131072 * 4096,
                copy_call_s: 50e-9,
                ..base
            },
            StridedMode::Rc,
        ),
        (
            "bounce, 4 runs just under the split apart: SC reads 16 KiB, TaT 616 KiB",
            PlanFacts {
                bounding: 616 << 10,
                interest: 16 << 10,
                runs: 4,
                sc_storage: 16 << 10,
                tat_storage: 616 << 10,
                tat_calls: 1,
                rc_fits: false,
                ..base
            },
            StridedMode::Sc,
        ),
        (
            "the same with the runs off block alignment in memory: SC's reads go through host memory, TaT overlaps the copies",
            PlanFacts {
                bounding: 1024 * MIB,
                interest: 4 * 4096,
                runs: 4,
                sc_storage: 4 * 4096,
                tat_storage: 4 * 4096,
                tat_calls: 4,
                direct: true,
                rc_fits: false,
                sc_aligned: false,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "clusters of runs far apart: TaT's 8 grouped reads (2 a thread) beat SC's 64 (16 a thread)",
            PlanFacts {
                bounding: 1024 * MIB,
                interest: 64 * 4096,
                runs: 64,
                sc_storage: 64 * 4096,
                tat_storage: 8 * 8 * 4096,
                tat_calls: 8,
                rc_fits: false,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "one run, packed: TaT and SC read the same, TaT overlaps its copy",
            PlanFacts {
                bounding: MIB,
                interest: MIB,
                runs: 1,
                sc_storage: MIB,
                tat_storage: MIB,
                rc_fits: false,
                ..base
            },
            StridedMode::Tat,
        ),
        (
            "one run, strided layout: RC ties TaT with less CPU work (no copy per run)",
            PlanFacts {
                bounding: MIB,
                interest: MIB,
                runs: 1,
                sc_storage: MIB,
                tat_storage: MIB,
                ..base
            },
            StridedMode::Rc,
        ),
    ];
    for (what, facts, want) in cases {
        let (got, reason) = plan(facts);
        assert_eq!(got, *want, "{what}: {reason}");
        assert!(
            reason.starts_with(&format!("{want} by estimate")),
            "{reason}"
        );
        if !facts.rc_fits {
            assert!(reason.contains("RC does not fit"), "{reason}");
        }
    }
}
