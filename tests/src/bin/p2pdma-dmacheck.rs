//! A real device uses the DMA addresses the p2pdma module returns.
//!
//! `vfio`: the rig's spare NVMe controller is taken from the kernel's nvme
//! driver and driven from user space through VFIO's no-IOMMU mode, where
//! the device is handed bus addresses as they are. Its admin and I/O queues,
//! IDENTIFY data and PRP lists live in accelerator memory at the addresses
//! `DMA_MAP` returned; data moves between the namespace and accelerator
//! memory (`DMA_MAP`), host memory (`PIN_USER`) and a udmabuf
//! (`DMABUF_IMPORT`), and every byte is compared where the CPU sees it. What
//! is written is reported in `@@RESULT nvme-write` lines for the host to
//! find in the namespace's image. Then a page of the controller's BAR0,
//! exported by vfio-pci as a dma-buf (device memory, handed only to
//! importers that allow P2P and can be revoked), is imported for the
//! accelerator and for the controller itself, must be one segment at the
//! BAR's bus address, and is revoked by turning the controller's memory
//! decoding off; the controller must still answer once it is back on. The
//! controller goes back to nvme at the end.
//!
//! `agree`: `P2P_QUERY` and `DMA_MAP` must give the same answer for a peer:
//! `NOT_SUPPORTED` and `EREMOTEIO`, or the same map type. What the kernel
//! said is printed in `@@NOTE` lines.
//!
//! Prints `ok NAME` or `FAIL NAME: why` per check, other lines for the log,
//! and `dmacheck: N passed, N failed` last; exits non-zero on any failure.

use std::{
    fs::File,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    process::ExitCode,
    time::Duration,
};

use clap::{Parser, Subcommand};
use p2pdma::{sys, DmaMapping, HostBuffer, MapType, Module, PciAddress, Peer, Udmabuf};
use p2pdma_abi as abi;
use p2pdma_tests::{
    dmamem::{describe, segments_text, AccelMem, ImportedDmabuf, PinnedHost},
    fill_image, first_accelerator, fnv1a,
    nvme::{io, Controller, DmaMem, IdCtrl, IdNs, QueuePair, PAGE},
    vfio,
};
use rustix::{
    event::{eventfd, EventfdFlags},
    io::{read, Errno},
};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// P2P_QUERY and DMA_MAP agree for the controller with serial `serial`
    /// (by PCI address) and for the one behind `nvme` (by descriptor).
    Agree {
        #[arg(long)]
        serial: String,
        #[arg(long)]
        nvme: Option<String>,
        /// The map type the kernel must answer (bus-addr,
        /// thru-host-bridge, not-supported).
        #[arg(long, value_parser = parse_map_type)]
        expect_map_type: Option<MapType>,
    },
    /// Drive the controller with serial `serial` through VFIO (no IOMMU)
    /// with its queues and data at addresses the module returned.
    Vfio {
        #[arg(long)]
        serial: String,
        /// The host's image of its namespace, for the @@RESULT lines.
        #[arg(long)]
        image: String,
        /// The rig content's offset at the start of that image.
        #[arg(long)]
        image_pattern_offset: u64,
        #[arg(long, value_parser = parse_map_type)]
        expect_map_type: Option<MapType>,
        /// Leave out the import of vfio-pci's dma-buf export of the BAR.
        #[arg(long)]
        no_dmabuf_export: bool,
    },
}

fn parse_map_type(s: &str) -> Result<MapType, String> {
    match s {
        "bus-addr" => Ok(MapType::BusAddr),
        "thru-host-bridge" => Ok(MapType::ThruHostBridge),
        "not-supported" => Ok(MapType::NotSupported),
        _ => Err(format!(
            "{s}: not bus-addr, thru-host-bridge or not-supported"
        )),
    }
}

/// The checks' tally; each prints its line as it is recorded.
#[derive(Default)]
struct Checks {
    passed: u32,
    failed: u32,
}

impl Checks {
    fn record<T>(&mut self, name: &str, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => {
                println!("ok {name}");
                self.passed += 1;
                Some(v)
            }
            Err(e) => {
                println!("FAIL {name}: {e}");
                self.failed += 1;
                None
            }
        }
    }

    /// Records a check whose success has something to say first.
    fn note(&mut self, name: &str, r: Result<String, String>) -> bool {
        self.record(
            name,
            r.map(|s| {
                println!("  {name}: {s}");
            }),
        )
        .is_some()
    }
}

/// The contract between the two answers: `NOT_SUPPORTED` goes with
/// `EREMOTEIO`; a map type with a mapping of that type.
fn contract(query: MapType, map: Result<MapType, Option<Errno>>) -> Result<String, String> {
    match (query, map) {
        (MapType::NotSupported, Err(Some(Errno::REMOTEIO))) => {
            Ok("P2P_QUERY says not-supported and DMA_MAP refuses with EREMOTEIO".into())
        }
        (MapType::NotSupported, Ok(t)) => Err(format!(
            "P2P_QUERY says not-supported, but DMA_MAP mapped it ({t})"
        )),
        (MapType::NotSupported, Err(e)) => Err(format!(
            "P2P_QUERY says not-supported, DMA_MAP failed with {e:?}, not EREMOTEIO"
        )),
        (q @ (MapType::BusAddr | MapType::ThruHostBridge), Ok(t)) if t == q => {
            Ok(format!("P2P_QUERY and DMA_MAP both say {q}"))
        }
        (q @ (MapType::BusAddr | MapType::ThruHostBridge), Ok(t)) => {
            Err(format!("P2P_QUERY says {q}, DMA_MAP mapped it as {t}"))
        }
        (q @ (MapType::BusAddr | MapType::ThruHostBridge), Err(e)) => {
            Err(format!("P2P_QUERY says {q}, DMA_MAP failed with {e:?}"))
        }
        (q, _) => Err(format!("P2P_QUERY answered {q}")),
    }
}

fn agree(
    c: &mut Checks,
    serial: &str,
    nvme: Option<&str>,
    expect: Option<MapType>,
) -> Result<(), String> {
    let module = Module::open().map_err(|e| e.to_string())?;
    let accel = first_accelerator(&module)?;
    let bdf = p2pdma::discovery::nvme_by_serial(serial)?;
    let pci: PciAddress = bdf.parse().map_err(|e| format!("{bdf}: {e}"))?;
    let file = match nvme {
        Some(n) => Some(File::open(n).map_err(|e| format!("{n}: {e}"))?),
        None => None,
    };
    let mut peers = vec![(
        "spare-controller".to_string(),
        format!("controller {serial} at {bdf} (by PCI address)"),
        Peer::Pci(pci),
    )];
    if let (Some(f), Some(n)) = (&file, nvme) {
        peers.push((
            "nvme".into(),
            format!("{n} (by descriptor)"),
            Peer::Fd(f.as_fd()),
        ));
    }
    let size = 64 << 10;
    for (name, what, peer) in peers {
        let q = module
            .p2p_query(accel.index, peer)
            .map_err(|e| format!("P2P_QUERY for {what}: {e}"))?;
        let alloc = module
            .alloc(accel.index, size, 0)
            .map_err(|e| e.to_string())?;
        let map = module.dma_map(alloc.handle(), 0, size, peer);
        let map_text = match &map {
            Ok(m) => describe(m, size).unwrap_or_else(|e| e),
            Err(e) => format!("failed: {e}"),
        };
        println!(
            "@@NOTE kernel: accelerator {} and {what} (PCI {}): P2P_QUERY {} (distance {}): \"{}\"; DMA_MAP: {map_text}",
            accel.pci,
            q.peer,
            q.map_type,
            q.distance.map_or("none".into(), |d| d.to_string()),
            q.reason
        );
        let answer = match &map {
            Ok(m) => Ok(m.map_type),
            Err(e) => Err(e.errno()),
        };
        c.note(
            &format!("query-and-map-agree-{name}"),
            contract(q.map_type, answer),
        );
        if let Some(want) = expect {
            c.record(
                &format!("query-{name}-{want}"),
                if q.map_type == want {
                    Ok(())
                } else {
                    Err(format!("P2P_QUERY says {}: {}", q.map_type, q.reason))
                },
            );
        }
        if let Ok(m) = map {
            c.record(
                &format!("unmap-{name}"),
                module.unmap(m).map_err(|e| e.to_string()),
            );
        }
        c.record(
            &format!("free-{name}"),
            alloc.free().map_err(|e| e.to_string()),
        );
    }
    Ok(())
}

/// Where things go in the queue memory (offsets in its `DMA_MAP`ped
/// range, one page each).
mod qmem {
    pub const ADMIN_SQ: usize = 0;
    pub const ADMIN_CQ: usize = 0x1000;
    pub const IO_SQ: usize = 0x2000;
    pub const IO_CQ: usize = 0x3000;
    pub const ID_CTRL: usize = 0x4000;
    pub const ID_NS: usize = 0x5000;
    pub const NS_LIST: usize = 0x6000;
    pub const PRP_LIST: usize = 0x7000;
}

/// Entries in each queue.
const QUEUE_ENTRIES: u16 = 64;
/// How long one command may take (TCG is slow).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// The byte that fills memory before a READ into it.
const POISON: u8 = 0xC3;

/// The rig content at `pattern_offset` (a multiple of 8), `len` bytes.
fn pattern(pattern_offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_image(pattern_offset, &mut v);
    v
}

fn read_back(mem: &dyn DmaMem, offset: usize, len: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; len];
    mem.read(offset, &mut v)?;
    Ok(v)
}

/// Compares what landed with what had to.
fn same(expected: &[u8], got: &[u8], where_: &str) -> Result<String, String> {
    match expected.iter().zip(got).position(|(a, b)| a != b) {
        None if expected.len() == got.len() => Ok(format!(
            "{} bytes in {where_} match, fnv1a {:016x}",
            got.len(),
            fnv1a(got)
        )),
        None => Err(format!(
            "{} bytes expected, {} read",
            expected.len(),
            got.len()
        )),
        Some(i) => Err(format!(
            "{where_} differs at byte {i} of {}: expected {:02x?}, got {:02x?} ({} bytes differ)",
            got.len(),
            &expected[i..(i + 8).min(expected.len())],
            &got[i..(i + 8).min(got.len())],
            expected.iter().zip(got).filter(|(a, b)| a != b).count()
        )),
    }
}

/// The namespace being driven and the limits the transfers obey.
struct Ns {
    nsid: u32,
    block_size: usize,
    blocks: u64,
    max_transfer: usize,
}

/// One READ or WRITE on the I/O queue, its status checked.
struct Rw<'m> {
    opcode: u8,
    slba: u64,
    blocks: u32,
    data: &'m dyn DmaMem,
    offset: usize,
}

/// An [`Rw`], written short.
fn rw<'m>(opcode: u8, slba: u64, blocks: u32, data: &'m dyn DmaMem, offset: usize) -> Rw<'m> {
    Rw {
        opcode,
        slba,
        blocks,
        data,
        offset,
    }
}

fn run_rw(
    ctrl: &mut Controller<'_>,
    ns: &Ns,
    list: &dyn DmaMem,
    rw: &Rw<'_>,
) -> Result<String, String> {
    let len = rw.blocks as usize * ns.block_size;
    if len > ns.max_transfer {
        return Err(format!(
            "{len} bytes exceed the controller's {} per command",
            ns.max_transfer
        ));
    }
    let cmd = Controller::rw_command(
        rw.opcode,
        ns.nsid,
        rw.slba,
        rw.blocks,
        (rw.data, rw.offset, len),
        (list, qmem::PRP_LIST),
    )?;
    let name = if rw.opcode == io::READ {
        "READ"
    } else {
        "WRITE"
    };
    ctrl.io(&cmd)?.check(&format!(
        "{name} of {} blocks at LBA {}",
        rw.blocks, rw.slba
    ))?;
    let entries = len.div_ceil(PAGE);
    Ok(format!(
        "{name} {} blocks at LBA {}, data at offset {:#x}: PRP1 {:#x}, PRP2 {:#x}{}",
        rw.blocks,
        rw.slba,
        rw.offset,
        cmd.prp1,
        cmd.prp2,
        if entries > 2 {
            " (a PRP list, in accelerator memory)"
        } else {
            ""
        }
    ))
}

/// The VFIO side: the function opened through its no-IOMMU group, BAR0
/// mapped.
type VfioDevice = vfio::Function;

fn open_vfio(bdf: &str) -> Result<VfioDevice, String> {
    // SAFETY: This program gives the controller only the bus addresses of
    // memory it mapped for it and keeps until the controller is shut down:
    // its queues and buffers in accelerator memory, pinned host buffers and
    // a udmabuf, all reached through copies.
    #[allow(unsafe_code)]
    let f = unsafe { vfio::Function::open_noiommu(bdf) }?;
    println!(
        "  {bdf}: group {}, PCI_COMMAND {:#06x}, BAR0 mapped",
        f.node.display(),
        f.device.config_read16(vfio::PCI_COMMAND)?
    );
    Ok(f)
}

struct VfioArgs<'a> {
    serial: &'a str,
    image: &'a str,
    image_pattern_offset: u64,
    expect: Option<MapType>,
    dmabuf_export: bool,
}

fn vfio_run(c: &mut Checks, a: &VfioArgs<'_>) {
    let Some(bdf) = c.record(
        "spare-controller-found",
        p2pdma::discovery::nvme_by_serial(a.serial),
    ) else {
        return;
    };
    println!("  the controller with serial {} is {bdf}", a.serial);
    if c.record(
        "spare-controller-to-vfio-pci",
        vfio::bind_to(&bdf, "vfio-pci"),
    )
    .is_some()
    {
        drive(c, &bdf, a);
    }
    // Back to nvme, which must find the namespace again.
    let back = vfio::bind_default(&bdf).and_then(|d| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match p2pdma::discovery::nvme_by_serial(a.serial) {
                Ok(b) if b == bdf => return Ok(d),
                _ if std::time::Instant::now() >= deadline => {
                    return Err(format!(
                        "{bdf} is bound to {d}, but no nvme controller with serial {} came back",
                        a.serial
                    ))
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    });
    c.record(
        "spare-controller-back-to-nvme",
        back.and_then(|d| {
            if d == "nvme" {
                Ok(())
            } else {
                Err(format!("{bdf} went to {d}"))
            }
        }),
    );
}

/// Allocates `size` bytes of accelerator memory, poisons them, and
/// `DMA_MAP`s `len` bytes at `base` for `peer`, which must get the map
/// type `want` (P2P_QUERY's answer).
fn accel_mem<'m>(
    module: &'m Module,
    dev: u32,
    peer: Peer<'_>,
    want: MapType,
    name: &str,
    (size, base, len): (u64, u64, u64),
) -> Result<(p2pdma::Allocation<'m>, AccelMem), String> {
    let alloc = module.alloc(dev, size, 0).map_err(|e| e.to_string())?;
    let map = alloc.map().map_err(|e| e.to_string())?;
    map.write_at(0, &vec![POISON; size as usize])
        .map_err(|e| e.to_string())?;
    let dma = module
        .dma_map(alloc.handle(), base, len, peer)
        .map_err(|e| e.to_string())?;
    let text = describe(&dma, len)?;
    if dma.map_type != want {
        return Err(format!(
            "DMA_MAP says {}, P2P_QUERY said {want}",
            dma.map_type
        ));
    }
    println!("  {name}: {len:#x} bytes at {base:#x} of a {size:#x}-byte allocation: {text}");
    let base = base as usize;
    Ok((alloc, AccelMem { map, base, dma }))
}

/// Everything between taking the controller and giving it back; all it
/// holds (the module file, its allocations and mappings, the VFIO device)
/// is released when it returns, before the controller changes drivers.
fn drive(c: &mut Checks, bdf: &str, a: &VfioArgs<'_>) {
    let Some(dev) = c.record("vfio-noiommu-open", open_vfio(bdf)) else {
        return;
    };
    let Some(module) = c.record("module-opens", Module::open().map_err(|e| e.to_string())) else {
        return;
    };
    let Some(accel) = c.record("accelerator-found", first_accelerator(&module)) else {
        return;
    };
    let Some(pci) = c.record(
        "controller-pci-address",
        bdf.parse::<PciAddress>().map_err(|e| format!("{bdf}: {e}")),
    ) else {
        return;
    };
    let peer = Peer::Pci(pci);
    let Some(q) = c.record(
        "p2p-query-controller",
        module
            .p2p_query(accel.index, peer)
            .map_err(|e| e.to_string())
            .and_then(|q| match a.expect {
                Some(want) if q.map_type != want => Err(format!(
                    "P2P_QUERY says {}, expected {want}: {}",
                    q.map_type, q.reason
                )),
                _ => Ok(q),
            }),
    ) else {
        return;
    };
    println!(
        "  P2P_QUERY accelerator {} -> {bdf}: {} (distance {:?}): {}",
        accel.pci, q.map_type, q.distance, q.reason
    );

    // Accelerator memory, mapped for the controller away from the start of
    // each allocation: 56 KiB of queues, IDENTIFY data and PRP lists; 768
    // KiB of data.
    let want = q.map_type;
    let Some((qalloc, qm)) = c.record(
        "dma-map-queue-memory",
        accel_mem(
            &module,
            accel.index,
            peer,
            want,
            "queue memory",
            (64 << 10, 8 << 10, 56 << 10),
        ),
    ) else {
        return;
    };
    let Some((dalloc, dm)) = c.record(
        "dma-map-data-memory",
        accel_mem(
            &module,
            accel.index,
            peer,
            want,
            "data memory",
            (1 << 20, 64 << 10, 768 << 10),
        ),
    ) else {
        return;
    };
    let host = |name: &str| -> Result<PinnedHost, String> {
        let buf = HostBuffer::new(512 << 10).map_err(|e| e.to_string())?;
        let dma = module
            .pin_user(buf.addr(), buf.len() as u64, peer)
            .map_err(|e| e.to_string())?;
        println!("  {name}: {}", describe(&dma, buf.len() as u64)?);
        Ok(PinnedHost { buf, dma })
    };
    let Some(h1) = c.record("pin-user-host-buffer-1", host("host buffer 1")) else {
        return;
    };
    let Some(h2) = c.record("pin-user-host-buffer-2", host("host buffer 2")) else {
        return;
    };
    let Some(ub) = c.record(
        "dmabuf-import-udmabuf",
        Udmabuf::create(512 << 10)
            .map_err(|e| e.to_string())
            .and_then(|buf| {
                let dma = module
                    .dmabuf_import(buf.dmabuf(), peer)
                    .map_err(|e| e.to_string())?;
                println!("  udmabuf: {}", describe(&dma, buf.size())?);
                Ok(ImportedDmabuf { buf, dma })
            }),
    ) else {
        return;
    };

    // The controller, with its admin queues in accelerator memory.
    let Some(admin) = c.record(
        "admin-queues-in-accelerator-memory",
        QueuePair::new(0, 32, (&qm, qmem::ADMIN_SQ), (&qm, qmem::ADMIN_CQ)),
    ) else {
        return;
    };
    let Some(mut ctrl) = c.record(
        "nvme-enable",
        Controller::enable(&dev.bar, admin, COMMAND_TIMEOUT),
    ) else {
        return;
    };
    exercise(c, &mut ctrl, a, &qm, &dm, &h1, &h2, &ub);
    if a.dmabuf_export {
        vfio_dmabuf(c, &module, &accel, (bdf, pci), &dev.device);
    }
    // Memory decoding was off and on again: the controller still answers
    // on its admin queue.
    let id = ctrl
        .identify(1, 0, &qm, qmem::ID_CTRL)
        .and_then(|()| IdCtrl::decode(&read_back(&qm, qmem::ID_CTRL, PAGE)?))
        .and_then(|id| {
            if id.serial == a.serial {
                Ok(())
            } else {
                Err(format!("serial {:?}, expected {:?}", id.serial, a.serial))
            }
        });
    c.record("identify-controller-after-memory-decoding-restored", id);
    c.record("nvme-shutdown", ctrl.shutdown());

    // Unmapped in the module before the controller changes drivers.
    for (name, handle) in [
        ("queue-memory", qm.dma.map_handle()),
        ("data-memory", dm.dma.map_handle()),
        ("host-buffer-1", h1.dma.map_handle()),
        ("host-buffer-2", h2.dma.map_handle()),
        ("udmabuf", ub.dma.map_handle()),
    ] {
        // SAFETY: The controller, the only device given these addresses,
        // is shut down (above) and is given no command before it changes
        // drivers.
        #[allow(unsafe_code)]
        let unmapped = unsafe { module.unmap_raw(handle) };
        c.record(
            &format!("unmap-{name}"),
            unmapped.map_err(|e| e.to_string()),
        );
    }
    // Unmapped, the allocations can be freed (their mmaps stay valid
    // until they go too).
    for (name, alloc) in [("queue-memory", qalloc), ("data-memory", dalloc)] {
        c.record(
            &format!("free-{name}"),
            alloc.free().map_err(|e| e.to_string()),
        );
    }
}

/// The raw `HANDLE_STATE` of a handle of `module`'s file
/// (`P2PDMA_STATE_*`).
fn handle_state(module: &Module, handle: u64) -> Result<u32, String> {
    let mut arg = abi::P2pdmaHandleState {
        handle,
        ..Default::default()
    };
    sys::handle_state(module, &mut arg).map_err(|e| format!("HANDLE_STATE {handle}: {e}"))?;
    Ok(arg.state)
}

/// `Ok` when `handle` is in state `want`.
fn expect_state(module: &Module, handle: u64, want: u32) -> Result<(), String> {
    let name = |s| match s {
        abi::P2PDMA_STATE_LIVE => "LIVE".to_string(),
        abi::P2PDMA_STATE_REVOKED => "REVOKED".to_string(),
        abi::P2PDMA_STATE_REVOKING => "REVOKING".to_string(),
        s => format!("unknown ({s})"),
    };
    match handle_state(module, handle)? {
        s if s == want => Ok(()),
        s => Err(format!(
            "HANDLE_STATE of {handle} is {}, expected {}",
            name(s),
            name(want)
        )),
    }
}

/// Reads and resets the eventfd's counter: how many times it was
/// signalled since the last read (0 when never).
fn eventfd_count(efd: &OwnedFd) -> Result<u64, String> {
    let mut b = [0u8; 8];
    match read(efd, &mut b) {
        Ok(8) => Ok(u64::from_ne_bytes(b)),
        Ok(n) => Err(format!("eventfd read gave {n} bytes")),
        Err(Errno::AGAIN) => Ok(0),
        Err(e) => Err(format!("eventfd read: {e}")),
    }
}

/// `DMABUF_IMPORT` of a dma-buf of BAR memory for `peer`: one segment at
/// `addr`, the BAR range's bus address, of the range's `len`, and map type
/// 0 (the exporter maps dma-bufs). Returns the mapping and it in words; a
/// mapping that is not that is unmapped.
fn import_bar(
    module: &Module,
    dmabuf: BorrowedFd<'_>,
    peer: Peer<'_>,
    (addr, len): (u64, u64),
) -> Result<(DmaMapping, String), String> {
    let m = module
        .dmabuf_import(dmabuf, peer)
        .map_err(|e| e.to_string())?;
    let text = format!(
        "map type {}, {} bytes in {} segment(s): {}",
        m.map_type.as_raw(),
        m.length,
        m.segs.len(),
        segments_text(&m)
    );
    if m.segs != [(addr, len)] || m.length != len || m.map_type.as_raw() != 0 {
        let _ = module.unmap(m);
        return Err(format!(
            "expected map type 0 and one segment {addr:#x}+{len:#x}, got {text}"
        ));
    }
    Ok((m, text))
}

/// A page of the controller's BAR0 exported by vfio-pci as a dma-buf,
/// imported for a peer, revoked by the exporter when the controller's
/// memory decoding goes off, and exported and imported again once it is
/// back on. The controller's PCI_COMMAND is as before when this returns.
fn vfio_dmabuf(
    c: &mut Checks,
    module: &Module,
    accel: &p2pdma::Accelerator,
    (bdf, pci): (&str, PciAddress),
    device: &vfio::Device,
) {
    // BAR0 as the PCI core assigned it, read from sysfs rather than from
    // VFIO or the module. Here (x86, no IOMMU, no bus offset) its bus
    // address is its CPU address.
    let Some((bar0, bar0_size)) =
        c.record("controller-bar0-from-sysfs", vfio::bar_resource(bdf, 0))
    else {
        return;
    };
    // The second page when there is one, so the offset has to count.
    let offset = if bar0_size >= 2 * PAGE as u64 {
        PAGE as u64
    } else {
        0
    };
    let want = (bar0 + offset, PAGE as u64);
    println!(
        "  {bdf} BAR0: {bar0:#x}, {bar0_size:#x} bytes; exporting {:#x} bytes at offset {offset:#x}, bus address {:#x}",
        want.1, want.0
    );
    let Some(buf) = c.record(
        "vfio-dmabuf-export-bar0-page",
        device.export_dma_buf(0, &[(offset, want.1)]),
    ) else {
        return;
    };
    let for_accel = Peer::Pci(accel.pci);
    let for_ctrl = Peer::Pci(pci);

    // The accelerator (by PCI address) reaches the controller's BAR by
    // P2P: vfio-pci refuses an importer that does not allow it
    // (EOPNOTSUPP) or cannot be revoked.
    let mut live: Vec<(&str, DmaMapping)> = Vec::new();
    if let Some((m, text)) = c.record(
        "vfio-dmabuf-import-for-accelerator",
        import_bar(module, buf.as_fd(), for_accel, want),
    ) {
        println!(
            "  BAR0+{offset:#x} of {bdf} for accelerator {}: {text}",
            accel.pci
        );
        c.record(
            "vfio-dmabuf-import-for-accelerator-is-live",
            expect_state(module, m.map_handle(), abi::P2PDMA_STATE_LIVE),
        );
        live.push(("accelerator", m));
    }
    // The same dma-buf for the controller that exports it: the P2PDMA core
    // finds a device at distance 0 from itself, reached by bus address.
    if let Some((m, text)) = c.record(
        "vfio-dmabuf-import-for-the-exporting-controller",
        import_bar(module, buf.as_fd(), for_ctrl, want),
    ) {
        println!("@@NOTE kernel: BAR0+{offset:#x} of {bdf} (vfio-pci dma-buf) imported for {bdf} itself: {text}");
        live.push(("controller", m));
    }
    if live.is_empty() {
        return;
    }

    // Revocation: memory decoding off through the VFIO config region,
    // every other bit of PCI_COMMAND kept.
    let efd = c.record(
        "set-eventfd",
        eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| format!("eventfd: {e}"))
            .and_then(|efd| {
                let arg = abi::P2pdmaEventfd {
                    fd: efd.as_raw_fd(),
                    ..Default::default()
                };
                sys::set_eventfd(module, arg).map_err(|e| format!("SET_EVENTFD: {e}"))?;
                eventfd_count(&efd)?;
                Ok(efd)
            }),
    );
    let Some(cmd) = c.record("pci-command-read", device.config_read16(vfio::PCI_COMMAND)) else {
        return;
    };
    // vfio-pci revokes its dma-bufs before it turns memory decoding off,
    // and waits for the importers: the import for the accelerator (a
    // kernel driver's peer) is torn down at once; the one for the
    // controller (a peer this process drives) stands, REVOKING, until its
    // owner lets it go, having stopped the peer: here, this thread's unmap.
    let off = cmd & !vfio::PCI_COMMAND_MEMORY;
    let user_driven = live.iter().position(|(name, _)| *name == "controller");
    let (turned_off, waited) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let t0 = std::time::Instant::now();
            device
                .config_write16(vfio::PCI_COMMAND, off)
                .map(|()| t0.elapsed())
        });
        // The exporter goes through its importers in an order of its own:
        // the accelerator's import may be torn down before the wait or
        // after it. The controller's import was signalled when the wait
        // began.
        let mut seen = 0u64;
        if let Some(efd) = &efd {
            let deadline = std::time::Instant::now() + Duration::from_secs(8);
            while seen == 0 && std::time::Instant::now() < deadline {
                seen += eventfd_count(efd).unwrap_or(0);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let blocked = !writer.is_finished();
        if let Some(i) = user_driven {
            c.record(
                "revoking-vfio-dmabuf-import-for-controller-state",
                expect_state(module, live[i].1.map_handle(), abi::P2PDMA_STATE_REVOKING),
            );
            c.record(
                "revocation-waits-for-the-owner-of-the-controller's-import",
                if blocked {
                    Ok(())
                } else {
                    Err("the config write that revoked the import returned before its owner let it go".to_string())
                },
            );
            let (_, m) = live.remove(i);
            c.record(
                "unmap-revoking-import-for-controller",
                module.unmap(m).map_err(|e| e.to_string()),
            );
        }
        let r = writer
            .join()
            .unwrap_or_else(|_| Err("the config write panicked".into()));
        if let Some(efd) = &efd {
            // One signal per import, all before the config write returned
            // (vfio-pci revokes synchronously).
            let imports = live.len() as u64 + u64::from(user_driven.is_some());
            c.record(
                "revocation-signals-eventfd-once-per-import",
                eventfd_count(efd).and_then(|n| match n + seen {
                    0 => Err("the eventfd was not signalled".into()),
                    n if n == imports => {
                        println!("  eventfd counter {n}: {imports} import(s) revoked");
                        Ok(())
                    }
                    n => Err(format!(
                        "the eventfd counts {n}, {imports} import(s) were live"
                    )),
                }),
            );
        }
        (r.as_ref().map(|_| ()).map_err(Clone::clone), r.ok())
    });
    if let Some(t) = waited {
        println!("  PCI_COMMAND memory off returned after {t:?}");
    }
    let wrote = turned_off.is_ok();
    c.record(
        "pci-command-memory-off",
        turned_off
            .and_then(|()| device.config_read16(vfio::PCI_COMMAND))
            .and_then(|now| {
                if now == off {
                    Ok(())
                } else {
                    Err(format!("PCI_COMMAND reads {now:#06x}, {off:#06x} written"))
                }
            }),
    );
    if wrote {
        for (name, m) in &live {
            c.record(
                &format!("revoked-vfio-dmabuf-import-for-{name}-state-after"),
                expect_state(module, m.map_handle(), abi::P2PDMA_STATE_REVOKED),
            );
        }
        // The exporter refuses new attachments while revoked.
        c.record(
            "vfio-dmabuf-import-refused-while-memory-off",
            match module.dmabuf_import(buf.as_fd(), for_accel) {
                Err(e) if e.errno() == Some(Errno::NODEV) => Ok(()),
                Err(e) => Err(format!("{e}, expected ENODEV")),
                Ok(m) => {
                    let _ = module.unmap(m);
                    Err("imported while revoked".into())
                }
            },
        );
    }
    for (name, m) in live.drain(..) {
        c.record(
            &format!("unmap-vfio-dmabuf-import-for-{name}"),
            module.unmap(m).map_err(|e| e.to_string()),
        );
    }
    // Always back to what it was: the queues still in use need the BAR.
    c.record("pci-command-restored", set_command(device, cmd));

    // Memory decoding on again: a new export is live, and vfio-pci has
    // given the revoked one back too.
    let again = c.record(
        "vfio-dmabuf-export-again",
        device.export_dma_buf(0, &[(offset, want.1)]),
    );
    let mut imports = Vec::new();
    for (name, fd) in [("new", again.as_ref()), ("revoked", Some(&buf))] {
        let Some(fd) = fd else {
            continue;
        };
        if let Some((m, _)) = c.record(
            &format!("vfio-dmabuf-import-of-{name}-export-after-restore"),
            import_bar(module, fd.as_fd(), for_accel, want),
        ) {
            c.record(
                &format!("vfio-dmabuf-import-of-{name}-export-after-restore-is-live"),
                expect_state(module, m.map_handle(), abi::P2PDMA_STATE_LIVE),
            );
            imports.push((name, m));
        }
    }
    for (name, m) in imports {
        c.record(
            &format!("unmap-vfio-dmabuf-import-of-{name}-export"),
            module.unmap(m).map_err(|e| e.to_string()),
        );
    }
    if let Some(efd) = &efd {
        // Unmapping live imports and turning memory on revoke nothing.
        c.record(
            "eventfd-quiet-after-restore",
            eventfd_count(efd).and_then(|n| match n {
                0 => Ok(()),
                n => Err(format!("signalled {n} more time(s)")),
            }),
        );
        c.record(
            "set-eventfd-off",
            sys::set_eventfd(
                module,
                abi::P2pdmaEventfd {
                    fd: -1,
                    ..Default::default()
                },
            )
            .map_err(|e| format!("SET_EVENTFD -1: {e}")),
        );
    }
    if let Some(fd) = &again {
        owner_left_alone(c, module, device, (fd, for_ctrl, want), cmd);
    }
    // The dma-buf descriptors close here.
    drop(again);
    drop(buf);
}

/// Writes `cmd` to the device's PCI_COMMAND and checks that it reads back.
fn set_command(device: &vfio::Device, cmd: u16) -> Result<(), String> {
    device.config_write16(vfio::PCI_COMMAND, cmd)?;
    match device.config_read16(vfio::PCI_COMMAND)? {
        now if now == cmd => Ok(()),
        now => Err(format!("PCI_COMMAND reads {now:#06x}, {cmd:#06x} written")),
    }
}

/// An import for the controller whose owner never lets it go: the
/// revocation waits 10 s for it, then the module turns the controller's
/// bus mastering off and revokes the import. Here the controller exports
/// the memory itself, and the config write that revokes it writes its
/// bus mastering back on (the dma suite's revoke-dmabuf step sees it stay
/// off with another exporter). Memory decoding is turned back on
/// afterwards (`cmd`).
fn owner_left_alone(
    c: &mut Checks,
    module: &Module,
    device: &vfio::Device,
    (fd, peer, want): (&OwnedFd, Peer<'_>, (u64, u64)),
    cmd: u16,
) {
    let Some((m, _)) = c.record(
        "vfio-dmabuf-import-for-controller-left-alone",
        import_bar(module, fd.as_fd(), peer, want),
    ) else {
        return;
    };
    let t0 = std::time::Instant::now();
    let off = device.config_write16(vfio::PCI_COMMAND, cmd & !vfio::PCI_COMMAND_MEMORY);
    let took = t0.elapsed();
    println!("  PCI_COMMAND memory off, the import left alone: returned after {took:?}");
    c.record(
        "revocation-ends-after-10s-without-the-owner",
        off.and_then(|()| {
            if took >= Duration::from_millis(9_500) {
                Ok(())
            } else {
                Err(format!("returned after {took:?}, before the owner's 10 s"))
            }
        }),
    );
    c.record(
        "import-left-alone-revoked",
        expect_state(module, m.map_handle(), abi::P2PDMA_STATE_REVOKED),
    );
    c.record(
        "unmap-import-left-alone",
        module.unmap(m).map_err(|e| e.to_string()),
    );
    c.record(
        "pci-command-restored-after-the-wait",
        set_command(device, cmd),
    );
}

#[allow(clippy::too_many_arguments)]
fn exercise<'a>(
    c: &mut Checks,
    ctrl: &mut Controller<'a>,
    a: &VfioArgs<'_>,
    qm: &'a AccelMem,
    dm: &AccelMem,
    h1: &PinnedHost,
    h2: &PinnedHost,
    ub: &ImportedDmabuf,
) {
    // IDENTIFY into accelerator memory, read through the mmap.
    let id = ctrl
        .identify(1, 0, qm, qmem::ID_CTRL)
        .and_then(|()| IdCtrl::decode(&read_back(qm, qmem::ID_CTRL, PAGE)?))
        .and_then(|id| {
            if id.serial == a.serial {
                Ok(id)
            } else {
                Err(format!("serial {:?}, expected {:?}", id.serial, a.serial))
            }
        });
    let Some(id) = c.record("identify-controller", id) else {
        return;
    };
    println!(
        "  IDENTIFY CONTROLLER: model {:?}, serial {:?}, MDTS {}, {} namespaces",
        id.model, id.serial, id.mdts, id.nn
    );
    let nsid = ctrl
        .identify(2, 0, qm, qmem::NS_LIST)
        .and_then(|()| read_back(qm, qmem::NS_LIST, PAGE))
        .and_then(|l| {
            let ids: Vec<u32> = l
                .chunks(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .take_while(|&n| n != 0)
                .collect();
            // The first is the image's (NSID 7, vfio.img); others may
            // follow (NSID 8 has 4 KiB blocks, for the library's driver).
            match ids[..] {
                [n, ..] => Ok(n),
                _ => Err(format!("active namespaces {ids:?}, expected at least one")),
            }
        });
    let Some(nsid) = c.record("identify-active-namespaces", nsid) else {
        return;
    };
    let ns = ctrl
        .identify(0, nsid, qm, qmem::ID_NS)
        .and_then(|()| IdNs::decode(&read_back(qm, qmem::ID_NS, PAGE)?))
        .and_then(|n| {
            if n.metadata != 0 || n.nsze * u64::from(n.block_size) < 32 << 20 {
                Err(format!("{n:?}: expected no metadata and at least 32 MiB"))
            } else {
                Ok(n)
            }
        });
    let Some(idns) = c.record("identify-namespace", ns) else {
        return;
    };
    let ns = Ns {
        nsid,
        block_size: idns.block_size as usize,
        blocks: idns.nsze,
        max_transfer: if id.mdts == 0 {
            usize::MAX
        } else {
            PAGE << id.mdts
        },
    };
    println!(
        "  namespace {nsid}: {} blocks of {} bytes; at most {} bytes per command",
        ns.blocks, ns.block_size, ns.max_transfer
    );
    let Some(io) = c.record(
        "io-queues-in-accelerator-memory",
        QueuePair::new(1, QUEUE_ENTRIES, (qm, qmem::IO_SQ), (qm, qmem::IO_CQ)),
    ) else {
        return;
    };
    if c.record("create-io-queues", ctrl.create_io_queues(io))
        .is_none()
    {
        return;
    }
    data_checks(c, ctrl, a, &ns, qm, dm, h1, h2, ub);
    c.record("flush", ctrl.flush(nsid));
    // A READ past the end must fail with LBA Out of Range: the status is
    // really read, not assumed.
    let past_end = Controller::rw_command(
        io::READ,
        nsid,
        ns.blocks,
        1,
        (dm, 0, ns.block_size),
        (qm, qmem::PRP_LIST),
    )
    .and_then(|cmd| ctrl.io(&cmd))
    .and_then(|comp| match (comp.sct(), comp.sc()) {
        (0, 0x80) => Ok(()),
        _ => Err(format!(
            "a READ at LBA {} completed with SCT {:#x} SC {:#x}, not LBA Out of Range",
            ns.blocks,
            comp.sct(),
            comp.sc()
        )),
    });
    c.record("read-past-end-fails-with-lba-out-of-range", past_end);
    c.record("delete-io-queues", ctrl.delete_io_queues());
}

/// A READ into poisoned memory, compared byte for byte where the CPU sees
/// the memory.
fn read_check(
    ctrl: &mut Controller<'_>,
    ns: &Ns,
    list: &dyn DmaMem,
    rw: &Rw<'_>,
    expected: &[u8],
    where_: &str,
) -> Result<String, String> {
    rw.data.write(0, &vec![POISON; rw.data.len()])?;
    let text = run_rw(ctrl, ns, list, rw)?;
    let got = read_back(rw.data, rw.offset, rw.blocks as usize * ns.block_size)?;
    Ok(format!("{text}; {}", same(expected, &got, where_)?))
}

/// The data checks: each READ lands in poisoned memory and is compared
/// byte for byte where the CPU sees it; each WRITE is read back and
/// reported for the host.
#[allow(clippy::too_many_arguments)]
fn data_checks(
    c: &mut Checks,
    ctrl: &mut Controller<'_>,
    a: &VfioArgs<'_>,
    ns: &Ns,
    qm: &AccelMem,
    dm: &AccelMem,
    h1: &PinnedHost,
    h2: &PinnedHost,
    ub: &ImportedDmabuf,
) {
    let bs = ns.block_size;
    let image_at = |slba: u64| a.image_pattern_offset + slba * bs as u64;

    // The image's own content, never written: a long READ (a PRP list,
    // within the controller's largest transfer) and a two-page one (PRP2 a
    // page), at offsets inside pages.
    let (slba, blocks) = (2048, 200);
    let want = pattern(image_at(slba), blocks as usize * bs);
    c.note(
        "read-image-into-accelerator-memory-prp-list",
        read_check(
            ctrl,
            ns,
            qm,
            &rw(io::READ, slba, blocks, dm, 0x1200),
            &want,
            "accelerator memory",
        ),
    );
    let (slba, blocks) = (4097, 8);
    let want = pattern(image_at(slba), blocks as usize * bs);
    c.note(
        "read-image-into-accelerator-memory-prp2",
        read_check(
            ctrl,
            ns,
            qm,
            &rw(io::READ, slba, blocks, dm, 0x7_0200),
            &want,
            "accelerator memory",
        ),
    );

    // Three WRITEs of rig content (at a pattern offset no image starts
    // with), each from another kind of memory, each read back; the host
    // finds them in the image.
    let blocks = 250;
    let len = blocks as usize * bs;
    let reported = |slba: u64, p: u64| {
        println!(
            "@@RESULT nvme-write image={} nvme_offset={} pattern_offset={p} len={len}",
            a.image,
            slba * bs as u64
        );
    };
    let write =
        |ctrl: &mut Controller<'_>, src: &dyn DmaMem, offset: usize, slba: u64, data: &[u8]| {
            src.write(offset, data)?;
            run_rw(ctrl, ns, qm, &rw(io::WRITE, slba, blocks, src, offset))
        };

    // From pinned host memory; read into each kind of memory.
    let (slba, p) = (16384, 256 << 20);
    let data = pattern(p, len);
    if c.note(
        "write-from-pinned-host-memory",
        write(ctrl, h1, 0x800, slba, &data),
    ) {
        c.note(
            "read-written-into-accelerator-memory",
            read_check(
                ctrl,
                ns,
                qm,
                &rw(io::READ, slba, blocks, dm, 0x2_0400),
                &data,
                "accelerator memory",
            ),
        );
        c.note(
            "read-written-into-pinned-host-memory",
            read_check(
                ctrl,
                ns,
                qm,
                &rw(io::READ, slba, blocks, h2, 0x200),
                &data,
                "pinned host memory",
            ),
        );
        c.note(
            "read-written-into-udmabuf",
            read_check(
                ctrl,
                ns,
                qm,
                &rw(io::READ, slba, blocks, ub, 0x1040),
                &data,
                "the udmabuf's memfd",
            ),
        );
        reported(slba, p);
    }

    // From accelerator memory; read back into pinned host memory.
    let (slba, p) = (24576, 260 << 20);
    let data = pattern(p, len);
    if c.note(
        "write-from-accelerator-memory",
        write(ctrl, dm, 0x4_0600, slba, &data),
    ) {
        c.note(
            "read-accelerator-write-into-host-memory",
            read_check(
                ctrl,
                ns,
                qm,
                &rw(io::READ, slba, blocks, h2, 0),
                &data,
                "pinned host memory",
            ),
        );
        reported(slba, p);
    }

    // From the udmabuf; read back into accelerator memory.
    let (slba, p) = (32768, 264 << 20);
    let data = pattern(p, len);
    if c.note("write-from-udmabuf", write(ctrl, ub, 0x2000, slba, &data)) {
        c.note(
            "read-udmabuf-write-into-accelerator-memory",
            read_check(
                ctrl,
                ns,
                qm,
                &rw(io::READ, slba, blocks, dm, 0x6_0000),
                &data,
                "accelerator memory",
            ),
        );
        reported(slba, p);
    }
}

fn main() -> ExitCode {
    let mut c = Checks::default();
    match Cli::parse().cmd {
        Cmd::Agree {
            serial,
            nvme,
            expect_map_type,
        } => {
            if let Err(e) = agree(&mut c, &serial, nvme.as_deref(), expect_map_type) {
                c.record::<()>("agree-setup", Err(e));
            }
        }
        Cmd::Vfio {
            serial,
            image,
            image_pattern_offset,
            expect_map_type,
            no_dmabuf_export,
        } => vfio_run(
            &mut c,
            &VfioArgs {
                serial: &serial,
                image: &image,
                image_pattern_offset,
                expect: expect_map_type,
                dmabuf_export: !no_dmabuf_export,
            },
        ),
    }
    println!("dmacheck: {} passed, {} failed", c.passed, c.failed);
    if c.failed == 0 && c.passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_pairs_refusals_and_map_types() {
        let ns = MapType::NotSupported;
        assert!(contract(ns, Err(Some(Errno::REMOTEIO))).is_ok());
        assert!(contract(ns, Err(Some(Errno::INVAL))).is_err());
        assert!(contract(ns, Ok(MapType::BusAddr)).is_err());
        for t in [MapType::BusAddr, MapType::ThruHostBridge] {
            assert!(contract(t, Ok(t)).is_ok());
            assert!(contract(t, Err(Some(Errno::REMOTEIO))).is_err());
        }
        assert!(contract(MapType::BusAddr, Ok(MapType::ThruHostBridge)).is_err());
        assert!(contract(MapType::Unknown(9), Ok(MapType::Unknown(9))).is_err());
    }

    #[test]
    fn comparisons_name_the_first_difference() {
        assert!(same(&[1, 2, 3], &[1, 2, 3], "x")
            .unwrap()
            .contains("3 bytes"));
        let e = same(&[1, 2, 3], &[1, 9, 3], "x").unwrap_err();
        assert!(e.contains("byte 1"), "{e}");
        assert!(same(&[1, 2], &[1], "x").is_err());
    }
}
