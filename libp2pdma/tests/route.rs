//! Routes against a reference: random routes of one to four hops (storage,
//! the host-memory device, and two memories that present themselves as
//! accelerators with no CPU mapping, so the planner must stage through host
//! memory), random unaligned offsets and lengths, chunk sizes, ring slots
//! and lanes per hop. Every byte of the destination is compared: the
//! source's bytes in the range, the poison (or the file's old bytes)
//! everywhere else. Then the refusals: bad places, short sources, memory
//! too small, each a clear error.
//!
//! Environment: `P2PDMA_MODEL_DIR` (where the files go; default the
//! target's temporary directory, which must allow `O_DIRECT`, so not tmpfs)
//! and `PROPTEST_CASES` (default 40).

use std::{os::unix::fs::FileExt, sync::Mutex};

mod common;

use common::{model_dir, pattern, runner};
use p2pdma::{
    memory::{DeviceMemory, HostMemory, MemRange, MemoryKind},
    transfer::{
        Config, End, Engine, HopKind, PathPref, RouteOptions, StorageFile, TransferPath, Via,
    },
    Error, PciAddress,
};
use proptest::prelude::*;

const FILE_LEN: usize = 6 << 20;
const MEM_LEN: usize = 4 << 20;
const POISON: u8 = 0xA5;

/// Memory that calls itself accelerator `index`'s, with no CPU mapping:
/// storage cannot reach it directly, and two of them only through host
/// memory.
#[derive(Debug)]
struct Accel {
    index: u32,
    bytes: Mutex<Vec<u8>>,
}

impl Accel {
    fn new(index: u32, len: usize) -> Self {
        Self {
            index,
            bytes: Mutex::new(vec![POISON; len]),
        }
    }

    fn get(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }
}

impl DeviceMemory for Accel {
    fn len(&self) -> usize {
        self.bytes.lock().unwrap().len()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::ModuleBar {
            index: self.index,
            pci: PciAddress::from_devfn(0, 0x10 + self.index as u8, 0),
        }
    }

    fn write_at(&self, offset: usize, src: &[u8]) -> p2pdma::Result<()> {
        let mut b = self.bytes.lock().unwrap();
        match b.get_mut(offset..offset + src.len()) {
            Some(d) => {
                d.copy_from_slice(src);
                Ok(())
            }
            None => Err(Error::OutOfBounds {
                offset: offset as u64,
                len: src.len() as u64,
                size: b.len() as u64,
            }),
        }
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> p2pdma::Result<()> {
        let b = self.bytes.lock().unwrap();
        match b.get(offset..offset + dst.len()) {
            Some(s) => {
                dst.copy_from_slice(s);
                Ok(())
            }
            None => Err(Error::OutOfBounds {
                offset: offset as u64,
                len: dst.len() as u64,
                size: b.len() as u64,
            }),
        }
    }
}

/// The routes tried: (name, hops expected).
const ROUTES: [(&str, usize); 9] = [
    ("file -> host-memory device", 1),
    ("file -> accel 0 (auto: through host)", 2),
    // Storage cannot reach these accelerators: host memory first.
    ("file -> (host ->) accel 0 staging -> host -> accel 1", 4),
    ("accel 0 -> accel 1 (auto: through host)", 2),
    ("host-memory device -> file", 1),
    ("accel 0 -> file (auto: through host)", 2),
    ("accel 0 -> host -> accel 1 staging -> file", 4),
    ("file -> file (auto: through host)", 2),
    (
        "file -> host -> host-memory staging -> host -> host-memory device",
        4,
    ),
];

#[derive(Clone, Debug)]
struct Case {
    route: usize,
    src_off: usize,
    dst_off: usize,
    len: usize,
    chunk: Option<usize>,
    slots: usize,
    lanes: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..ROUTES.len(),
        prop_oneof![0..8usize, 0..20_000usize],
        prop_oneof![0..8usize, 0..20_000usize],
        prop_oneof![0..5000usize, 0..(3usize << 20)],
        prop_oneof![Just(None), (1usize..300_000).prop_map(Some)],
        1..4usize,
        1..4usize,
    )
        .prop_map(|(route, src_off, dst_off, len, chunk, slots, lanes)| Case {
            route,
            src_off,
            dst_off,
            len,
            chunk,
            slots,
            lanes,
        })
}

/// Where the case's destination is, to compare afterwards.
enum Dst<'a> {
    Host(&'a HostMemory),
    Accel(&'a Accel),
    File(&'a std::path::Path),
}

fn run_case(engine: &Engine, dir: &std::path::Path, c: &Case) -> Result<(), TestCaseError> {
    let src_path = dir.join("src");
    let dst_path = dir.join("dst");
    let src_data = pattern(1, 0, FILE_LEN);
    let old_dst = pattern(2, 0, FILE_LEN);
    std::fs::write(&src_path, &src_data).unwrap();
    std::fs::write(&dst_path, &old_dst).unwrap();
    let src_file = StorageFile::open(&src_path).unwrap();
    let dst_file = StorageFile::open_rw(&dst_path).unwrap();
    let host_src = HostMemory::new(MEM_LEN).unwrap();
    let mem_data = pattern(3, 0, MEM_LEN);
    host_src.write_at(0, &mem_data).unwrap();
    let host_dst = HostMemory::new(MEM_LEN).unwrap();
    host_dst.write_at(0, &vec![POISON; MEM_LEN]).unwrap();
    let staging_host = HostMemory::new(2 << 20).unwrap();
    let a0 = Accel::new(0, MEM_LEN);
    a0.write_at(0, &mem_data).unwrap();
    let a1 = Accel::new(1, MEM_LEN);
    let a0_staging = Accel::new(0, 2 << 20);
    let a1_staging = Accel::new(1, 2 << 20);

    let fsrc = End::Storage {
        file: &src_file,
        offset: c.src_off as u64,
    };
    let fdst = End::Storage {
        file: &dst_file,
        offset: c.dst_off as u64,
    };
    let mem = |m: &'static str| -> End<'_> {
        match m {
            "host-src" => End::Memory {
                mem: &host_src,
                offset: c.src_off,
            },
            "host-dst" => End::Memory {
                mem: &host_dst,
                offset: c.dst_off,
            },
            "a0" => End::Memory {
                mem: &a0,
                offset: c.src_off,
            },
            _ => End::Memory {
                mem: &a1,
                offset: c.dst_off,
            },
        }
    };
    let stage = |m: &'static str| -> Via<'_> {
        let mem: &dyn DeviceMemory = match m {
            "a0" => &a0_staging,
            "a1" => &a1_staging,
            _ => &staging_host,
        };
        Via::Memory(MemRange::from_offset(mem, 123).unwrap())
    };
    // Staging holds at least one slot of the chunk plus 4 KiB.
    let chunk = c.chunk.map(|n| n.min(900 << 10));
    let (route, src, dst) = match c.route {
        0 => (
            engine.routes().plan(fsrc, mem("host-dst")),
            &src_data,
            Dst::Host(&host_dst),
        ),
        1 => (
            engine.routes().plan(fsrc, mem("a1")),
            &src_data,
            Dst::Accel(&a1),
        ),
        2 => (
            engine
                .routes()
                .plan_through(fsrc, &[stage("a0"), Via::Host], mem("a1")),
            &src_data,
            Dst::Accel(&a1),
        ),
        3 => (
            engine.routes().plan(mem("a0"), mem("a1")),
            &mem_data,
            Dst::Accel(&a1),
        ),
        4 => (
            engine.routes().plan(mem("host-src"), fdst),
            &mem_data,
            Dst::File(&dst_path),
        ),
        5 => (
            engine.routes().plan(mem("a0"), fdst),
            &mem_data,
            Dst::File(&dst_path),
        ),
        6 => (
            engine
                .routes()
                .plan_through(mem("a0"), &[Via::Host, stage("a1")], fdst),
            &mem_data,
            Dst::File(&dst_path),
        ),
        7 => (
            engine.routes().plan(fsrc, fdst),
            &src_data,
            Dst::File(&dst_path),
        ),
        _ => (
            engine.routes().plan_through(
                fsrc,
                &[Via::Host, stage("host"), Via::Host],
                mem("host-dst"),
            ),
            &src_data,
            Dst::Host(&host_dst),
        ),
    };
    let route = route.map_err(|e| TestCaseError::fail(format!("{c:?}: plan: {e}")))?;
    prop_assert_eq!(route.len(), ROUTES[c.route].1, "{:?}: {:?}", c, route);
    let opts = RouteOptions {
        chunk,
        slots: Some(c.slots),
        lanes: Some(c.lanes),
    };
    let rep = engine
        .routes()
        .copy(&route, c.len, &opts)
        .map_err(|e| TestCaseError::fail(format!("{c:?} {route:?}: {e}")))?;
    prop_assert_eq!(rep.bytes, c.len as u64);
    prop_assert_eq!(rep.busy.len(), route.len());
    let want_src = &src[c.src_off..c.src_off + c.len];
    let (have, mut want) = match dst {
        Dst::Host(m) => {
            let mut v = vec![0; MEM_LEN];
            m.read_at(0, &mut v).unwrap();
            (v, vec![POISON; MEM_LEN])
        }
        Dst::Accel(a) => (a.get(), vec![POISON; MEM_LEN]),
        Dst::File(p) => (std::fs::read(p).unwrap(), old_dst.clone()),
    };
    want[c.dst_off..c.dst_off + c.len].copy_from_slice(want_src);
    prop_assert_eq!(have.len(), want.len());
    if let Some(i) = (0..want.len()).find(|&i| have[i] != want[i]) {
        return Err(TestCaseError::fail(format!(
            "{c:?} {route:?}: first wrong byte at destination offset {i}: {:#x}, want {:#x}",
            have[i], want[i]
        )));
    }
    Ok(())
}

#[test]
fn routes_move_every_byte_where_it_belongs() {
    let dir = model_dir("route");
    let engine = Engine::new(
        Config {
            path: PathPref::Auto,
            ..Config::default()
        },
        None,
    );
    runner(40)
        .run(&case(), |c| run_case(&engine, dir.path(), &c))
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_planner_explains_its_hops() {
    let dir = model_dir("route-plan");
    let path = dir.path().join("f");
    std::fs::File::create(&path)
        .unwrap()
        .write_all_at(&[1; 8192], 0)
        .unwrap();
    let file = StorageFile::open(&path).unwrap();
    let engine = Engine::new(Config::default(), None);
    let (a0, a1) = (Accel::new(0, 8192), Accel::new(1, 8192));
    let host = HostMemory::new(8192).unwrap();
    let fe = End::Storage {
        file: &file,
        offset: 0,
    };
    let e0 = End::Memory {
        mem: &a0,
        offset: 0,
    };
    let e1 = End::Memory {
        mem: &a1,
        offset: 0,
    };
    let eh = End::Memory {
        mem: &host,
        offset: 0,
    };

    let r = engine.routes().plan(e0, e1).unwrap();
    let kinds: Vec<HopKind> = r.hops().iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HopKind::Copy, HopKind::Copy]);
    assert!(
        r.reason()
            .starts_with("accelerator 0 to accelerator 1 through host memory: "),
        "{}",
        r.reason()
    );
    assert_eq!(r.hops()[0].to, "host memory");

    let r = engine.routes().plan(fe, e0).unwrap();
    let kinds: Vec<HopKind> = r.hops().iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HopKind::Read(TransferPath::Direct), HopKind::Copy]);
    assert!(
        r.reason().contains("through host memory: "),
        "{}",
        r.reason()
    );

    let r = engine.routes().plan(e0, fe).unwrap();
    let kinds: Vec<HopKind> = r.hops().iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [HopKind::Copy, HopKind::Write(TransferPath::Direct)]);

    let r = engine.routes().plan(fe, eh).unwrap();
    assert_eq!(r.len(), 1);
    let r = engine.routes().plan(eh, e1).unwrap();
    assert_eq!(r.hops()[0].kind, HopKind::Copy);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The error's words; panics if `r` succeeded.
fn msg<T>(r: p2pdma::Result<T>) -> String {
    match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_routes_are_refused_and_touch_nothing() {
    let dir = model_dir("route-bad");
    let path = dir.path().join("f");
    let data = pattern(9, 0, 1 << 20);
    std::fs::write(&path, &data).unwrap();
    let file = StorageFile::open_rw(&path).unwrap();
    let engine = Engine::new(Config::default(), None);
    let (a0, a1) = (Accel::new(0, 1 << 20), Accel::new(1, 1 << 20));
    let fe = End::Storage {
        file: &file,
        offset: 0,
    };
    let e0 = End::Memory {
        mem: &a0,
        offset: 0,
    };
    let e1 = End::Memory {
        mem: &a1,
        offset: 0,
    };

    // Two accelerators with nothing between them.
    let m = msg(engine.routes().plan_through(e0, &[], e1));
    assert!(m.contains("route through host memory"), "{m}");
    // Storage to storage directly.
    let m = msg(engine.routes().plan_through(fe, &[], fe));
    assert!(m.contains("storage to storage"), "{m}");
    // Staging outside its memory: no range of it to stage in.
    let m = msg(MemRange::new(&a0, 1 << 20, 1));
    assert!(m.contains("outside the"), "{m}");
    // Staging too small for one chunk slot.
    let r = engine
        .routes()
        .plan_through(
            fe,
            &[Via::Memory(MemRange::new(&a0, 0, 8192).unwrap()), Via::Host],
            e1,
        )
        .unwrap();
    let opts = RouteOptions {
        chunk: Some(64 << 10),
        ..RouteOptions::default()
    };
    let m = msg(engine.routes().copy(&r, 128 << 10, &opts));
    assert!(m.contains("not one chunk slot"), "{m}");
    assert!(a1.get().iter().all(|&b| b == POISON));
    // A zero chunk, zero slots or lanes.
    let r = engine.routes().plan(fe, e1).unwrap();
    for o in [
        RouteOptions {
            chunk: Some(0),
            ..RouteOptions::default()
        },
        RouteOptions {
            slots: Some(0),
            ..RouteOptions::default()
        },
        RouteOptions {
            lanes: Some(0),
            ..RouteOptions::default()
        },
    ] {
        msg(engine.routes().copy(&r, 4096, &o));
    }
    // A destination too small: refused before any byte moves.
    let small = End::Memory {
        mem: &a1,
        offset: (1 << 20) - 100,
    };
    let r = engine.routes().plan(fe, small).unwrap();
    let m = msg(engine.routes().copy(&r, 4096, &RouteOptions::default()));
    assert!(m.contains("outside the"), "{m}");
    assert!(a1.get().iter().all(|&b| b == POISON));
    // A source shorter than the copy: an error, never success.
    let late = End::Storage {
        file: &file,
        offset: (1 << 20) - 5000,
    };
    let r = engine.routes().plan(late, e1).unwrap();
    msg(engine.routes().copy(&r, 64 << 10, &RouteOptions::default()));
    // The file was never written.
    assert_eq!(std::fs::read(&path).unwrap(), data);
    std::fs::remove_dir_all(&dir).unwrap();
}
