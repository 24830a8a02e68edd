//! `p2pdma-ctl`: exercises every ioctl of `/dev/p2pdma` and the library, and
//! runs the module's sanity suite.
#![deny(unsafe_code)]

mod bench;
mod calibrate;
mod child;
mod copy;
mod doctor;
mod proc;
mod sanity;
mod shape;
mod store;
mod util;

use std::{
    error::Error as StdError,
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    process::ExitCode,
};

use clap::{Args, Parser, Subcommand};
use p2pdma::{Accelerator, DmaMapping, HostBuffer, Module, PciAddress, Peer, Udmabuf};
use rustix::fs::{open, Mode, OFlags};
use serde_json::json;

use crate::util::{first_difference, parse_size, pattern};

#[derive(Parser)]
#[command(version, about = "Control and test tool for p2pdma")]
struct Cli {
    /// The module's device node.
    #[arg(long, global = true, default_value = p2pdma::discovery::DEVICE_NODE)]
    node: String,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show the kernel module's ABI version and capabilities (GET_VERSION).
    Version,
    /// List the accelerators bound to the module (DEVICE_INFO).
    List {
        /// Also list NVMe namespaces and P2P memory providers (sysfs).
        #[arg(long)]
        all: bool,
    },
    /// Describe a storage path as the library sees it: the namespace and
    /// controller behind it, the paths of a multipath namespace, or an md
    /// array's level, chunk size, state and members (slot, state, data
    /// offset, controller and PCI function).
    Describe {
        /// A file, a block device (/dev/nvme0n1, /dev/md0) or a partition;
        /// or a striped volume, `volume:CHUNK[@DATA_OFFSET]:MEMBER,...` (each
        /// member /dev/nvmeXnY, whose controller is taken from the nvme
        /// driver, or PCI/NSID of one already with vfio-pci).
        path: PathBuf,
    },
    /// Allocate accelerator memory (ALLOC), optionally map, fill and verify
    /// it, print it, and free it on exit.
    Alloc {
        /// Accelerator index.
        #[arg(long, default_value_t = 0)]
        dev: u32,
        /// Bytes (e.g. 4096, 64K, 2M).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Alignment of the bus address (0: a page).
        #[arg(long, value_parser = parse_size, default_value = "0")]
        align: u64,
        /// Map the allocation, write a pattern and read it back.
        #[arg(long)]
        verify: bool,
        /// After printing, print `@@HELD` and keep the allocation until
        /// killed.
        #[arg(long)]
        hold: bool,
    },
    /// Free an allocation handle (FREE). Handles belong to the open file, so
    /// from a fresh process this reports ENOENT: it probes the error path.
    Free {
        /// The handle.
        #[arg(long)]
        handle: u64,
    },
    /// Ask whether, and how, a peer can reach an accelerator's memory
    /// (P2P_QUERY).
    P2pQuery {
        /// Accelerator index.
        #[arg(long, default_value_t = 0)]
        dev: u32,
        #[command(flatten)]
        peer: PeerArgs,
    },
    /// Allocate memory, DMA-map it for a peer (DMA_MAP), print the
    /// segments, then unmap and free it.
    DmaMap {
        /// Accelerator index.
        #[arg(long, default_value_t = 0)]
        dev: u32,
        /// Bytes to allocate.
        #[arg(long, value_parser = parse_size, default_value = "1M")]
        size: u64,
        /// Alignment of the allocation's bus address (0: a page).
        #[arg(long, value_parser = parse_size, default_value = "0")]
        align: u64,
        /// Offset of the mapped range in the allocation.
        #[arg(long, value_parser = parse_size, default_value = "0")]
        offset: u64,
        /// Length of the mapped range (default: to the end).
        #[arg(long, value_parser = parse_size)]
        length: Option<u64>,
        #[command(flatten)]
        peer: PeerArgs,
    },
    /// Pin a page-aligned host buffer for a peer (PIN_USER), print the
    /// segments, then unmap it.
    PinUser {
        /// Bytes to pin.
        #[arg(long, value_parser = parse_size, default_value = "1M")]
        size: u64,
        #[command(flatten)]
        peer: PeerArgs,
    },
    /// Release a DMA mapping handle (UNMAP). Mappings belong to the open
    /// file, so from a fresh process this reports ENOENT: it probes the error
    /// path.
    Unmap {
        /// The mapping handle.
        #[arg(long)]
        map_handle: u64,
    },
    /// Make a udmabuf from a memfd, import it for a peer (DMABUF_IMPORT),
    /// print the segments, then unmap it.
    DmabufImport {
        /// Bytes of the udmabuf.
        #[arg(long, value_parser = parse_size, default_value = "1M")]
        size: u64,
        #[command(flatten)]
        peer: PeerArgs,
    },
    /// Read a range of a block device into a new allocation by the module's
    /// own block I/O (BLOCK_IO), compare it with a plain read of the range,
    /// print the throughput, then free it.
    BlockIo {
        /// Accelerator index.
        #[arg(long, default_value_t = 0)]
        dev: u32,
        /// The block device (e.g. /dev/nvme0n1).
        device: PathBuf,
        /// Byte offset on the device (a multiple of its logical block).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        offset: u64,
        /// Bytes (a multiple of its logical block).
        #[arg(long, default_value = "1M", value_parser = parse_size)]
        len: u64,
        /// Bytes per segment (one bio each).
        #[arg(long, default_value = "1M", value_parser = parse_size)]
        seg: u64,
        /// Segments in flight (0: the module's default).
        #[arg(long, default_value_t = 0)]
        depth: u32,
    },
    /// Check whether data can move between a storage path and an
    /// accelerator by P2P DMA, and why not (a report: exits 0 either way).
    Doctor(doctor::DoctorArgs),
    /// Run the module's sanity suite: one `ok`/`FAIL`/`skip` line per case
    /// and a `sanity: N passed, N failed, N skipped` summary.
    Sanity(sanity::SanityArgs),
    /// Benchmarks measured side by side and printed as ratios: the bounce
    /// pipeline vs the serial approach vs fio, small-copy latency, CPU per GiB.
    Bench(bench::BenchArgs),
    /// Copy a file or namespace into accelerator memory, or one file to
    /// another through it, with progress, throughput and the path used.
    Copy(copy::CopyArgs),
    /// Measure the strided cost model's constants (per-call cost, storage,
    /// copy and packing rates) for a storage target and a memory, and store
    /// them for AUTO (`--show` to see them, `--forget` to drop them).
    Calibrate(calibrate::CalibrateArgs),
    /// The object store: format, ls, put, get, stat, rm, flush.
    Store(store::StoreArgs),
    /// Helper processes of the sanity suite.
    #[command(name = "__child", hide = true)]
    Child {
        #[command(subcommand)]
        cmd: child::ChildCmd,
    },
}

/// The peer device of a query or mapping.
#[derive(Args)]
#[group(required = true, multiple = false)]
struct PeerArgs {
    /// The peer is the PCI function behind this block device (e.g.
    /// /dev/nvme0n1).
    #[arg(long)]
    peer_fd: Option<PathBuf>,
    /// The peer is this PCI function (dddd:bb:dd.f).
    #[arg(long)]
    peer_pci: Option<PciAddress>,
}

/// What a [`PeerArgs`] resolved to: the open block device, if any, must
/// outlive the [`Peer`] made from it.
enum PeerHold {
    Fd(OwnedFd),
    Pci(PciAddress),
}

impl PeerArgs {
    fn open(&self) -> Result<PeerHold, Box<dyn StdError>> {
        match (&self.peer_fd, self.peer_pci) {
            (Some(path), _) => {
                let fd = open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                Ok(PeerHold::Fd(fd))
            }
            (None, Some(pci)) => Ok(PeerHold::Pci(pci)),
            (None, None) => Err("give --peer-fd or --peer-pci".into()),
        }
    }
}

impl PeerHold {
    fn peer(&self) -> Peer<'_> {
        match self {
            PeerHold::Fd(fd) => Peer::Fd(fd.as_fd()),
            PeerHold::Pci(pci) => Peer::Pci(*pci),
        }
    }
}

fn mapping_json(m: &DmaMapping) -> serde_json::Value {
    json!({
        "map_handle": m.map_handle(),
        "map_type": m.map_type.to_string(),
        "length": m.length,
        "segs": m.segs.iter().map(|&(addr, len)| json!({"addr": addr, "len": len})).collect::<Vec<_>>(),
    })
}

fn print_mapping(json: bool, what: &str, m: &DmaMapping) {
    if json {
        println!("{}", json!({ "op": what, "mapping": mapping_json(m) }));
    } else {
        println!(
            "{what}: map handle {}, {}, {} bytes in {} segment(s)",
            m.map_handle(),
            m.map_type,
            m.length,
            m.segs.len()
        );
        for (i, &(addr, len)) in m.segs.iter().enumerate() {
            println!("  seg {i}: {addr:#x} + {len:#x}");
        }
    }
}

/// `block-io`: the range read by `BLOCK_IO`, checked against `pread`.
#[allow(clippy::too_many_arguments)]
fn block_io(
    module: &Module,
    json: bool,
    dev: u32,
    device: &std::path::Path,
    offset: u64,
    len: u64,
    seg: u64,
    depth: u32,
) -> Result<(), Box<dyn StdError>> {
    if len == 0 || seg == 0 {
        return Err("--len and --seg must not be 0".into());
    }
    let fd = open(device, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("cannot open {}: {e}", device.display()))?;
    let a = module.alloc(dev, len, 0)?;
    let map = a.map()?;
    let segs: Vec<p2pdma_abi::P2pdmaIoSeg> = (0..len)
        .step_by(seg as usize)
        .map(|at| p2pdma_abi::P2pdmaIoSeg {
            mem_offset: at,
            dev_offset: offset + at,
            len: seg.min(len - at),
        })
        .collect();
    let t = std::time::Instant::now();
    let mut moved = 0;
    for batch in segs.chunks(p2pdma_abi::P2PDMA_IO_MAX_SEGS as usize) {
        moved += a.block_io(&fd, false, batch, depth)?;
    }
    let took = t.elapsed();
    let mut got = vec![0u8; len as usize];
    map.read_at(0, &mut got)?;
    let mut want = vec![0u8; len as usize];
    let n = rustix::io::pread(&fd, &mut want, offset)?;
    let diff = if n == want.len() {
        first_difference(&want, &got)
    } else {
        Some(format!("pread gave {n} of {len} bytes"))
    };
    let gib_s = moved as f64 / (1u64 << 30) as f64 / took.as_secs_f64();
    if json {
        println!(
            "{}",
            json!({"op": "block-io", "bytes": moved, "segments": segs.len(),
                   "seconds": took.as_secs_f64(), "gib_s": gib_s, "match": diff.is_none()})
        );
    } else {
        println!(
            "block-io: {moved} bytes in {} segments, {:.3} s, {gib_s:.3} GiB/s; {}",
            segs.len(),
            took.as_secs_f64(),
            match &diff {
                None => "the memory matches a pread of the range".to_string(),
                Some(d) => format!("MISMATCH with a pread of the range: {d}"),
            }
        );
    }
    drop(map);
    a.free()?;
    match diff {
        None => Ok(()),
        Some(d) => Err(format!("the memory differs from the device: {d}").into()),
    }
}

fn print_done(json: bool, what: &str, handle: u64) {
    if json {
        println!("{}", json!({ "op": what, "handle": handle, "ok": true }));
    } else {
        println!("{what} {handle}: ok");
    }
}

/// Releases a DMA mapping and says so; a failure is an error of the
/// command.
fn unmap_and_report(module: &Module, json: bool, m: DmaMapping) -> Result<(), Box<dyn StdError>> {
    let handle = m.map_handle();
    module.unmap(m)?;
    print_done(json, "unmap", handle);
    Ok(())
}

fn run(cli: &Cli) -> Result<ExitCode, Box<dyn StdError>> {
    if let Cmd::Child { cmd } = &cli.cmd {
        return Ok(child::run(&cli.node, cmd));
    }
    if let Cmd::Sanity(args) = &cli.cmd {
        return Ok(sanity::run(&cli.node, cli.json, args));
    }
    if let Cmd::Doctor(args) = &cli.cmd {
        return Ok(doctor::run(&cli.node, cli.json, args));
    }
    if let Cmd::List { all: true } = &cli.cmd {
        return Ok(doctor::list_all(&cli.node, cli.json));
    }
    if let Cmd::Describe { path } = &cli.cmd {
        return doctor::describe(path, cli.json);
    }
    if let Cmd::Bench(args) = &cli.cmd {
        bench::run(args, cli.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Cmd::Copy(args) = &cli.cmd {
        copy::run(args, cli.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Cmd::Calibrate(args) = &cli.cmd {
        calibrate::run(args, cli.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Cmd::Store(args) = &cli.cmd {
        store::run(args, &cli.node, cli.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let module = Module::open_path(&cli.node)?;
    let json = cli.json;
    match &cli.cmd {
        Cmd::Version => {
            let v = module.version();
            if json {
                println!(
                    "{}",
                    json!({
                        "abi_version": v.abi_version,
                        "abi_min_compat": v.abi_min_compat,
                        "capabilities": v.capabilities,
                        "num_devices": v.num_devices,
                        "library_abi_version": p2pdma_abi::P2PDMA_ABI_VERSION,
                    })
                );
            } else {
                println!(
                    "module ABI {} (serves >= {}), library ABI {}, capabilities {:#x}, {} device(s)",
                    v.abi_version,
                    v.abi_min_compat,
                    p2pdma_abi::P2PDMA_ABI_VERSION,
                    v.capabilities,
                    v.num_devices
                );
            }
        }
        Cmd::List { .. } => {
            let accels = module.accelerators()?;
            if json {
                let list: Vec<_> = accels.iter().map(Accelerator::to_json).collect();
                println!("{}", serde_json::Value::Array(list));
            } else {
                for a in &accels {
                    println!(
                        "{}: {} [{:04x}:{:04x}] BAR {} {} MiB at bus {:#x}, P2P {} MiB ({} MiB free), NUMA {}",
                        a.index,
                        a.pci,
                        a.vendor,
                        a.device,
                        a.bar,
                        a.bar_size >> 20,
                        a.bar_bus_addr,
                        a.p2p_size >> 20,
                        a.p2p_available >> 20,
                        a.numa_node.map_or("-".to_string(), |n| n.to_string())
                    );
                }
                if accels.is_empty() {
                    println!("no accelerators bound to the p2pdma module");
                }
            }
        }
        Cmd::Alloc {
            dev,
            size,
            align,
            verify,
            hold,
        } => {
            let a = module.alloc(*dev, *size, *align)?;
            let mut verified = None;
            if *verify {
                let map = a.map()?;
                let len = map.len();
                let data = pattern(a.handle(), 0, len);
                map.write_at(0, &data)?;
                let mut back = vec![0u8; len];
                map.read_at(0, &mut back)?;
                if let Some(d) = first_difference(&data, &back) {
                    return Err(format!("allocation {} read back wrong: {d}", a.handle()).into());
                }
                verified = Some(len);
            }
            if json {
                println!(
                    "{}",
                    json!({
                        "dev": dev,
                        "handle": a.handle(),
                        "size": a.size(),
                        "mmap_offset": a.mmap_offset(),
                        "verified_bytes": verified,
                    })
                );
            } else {
                println!(
                    "allocation {}: {} bytes on device {dev}, mmap offset {:#x}{}",
                    a.handle(),
                    a.size(),
                    a.mmap_offset(),
                    verified.map_or(String::new(), |n| format!(
                        ", {n} bytes written and verified"
                    ))
                );
            }
            if *hold {
                println!("@@HELD");
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
            a.free()?;
        }
        Cmd::Free { handle } => {
            // SAFETY: The module file this command opened holds no
            // allocation: the number names nothing anyone uses, and the
            // module's answer (an error) is what the command shows.
            #[allow(unsafe_code)]
            unsafe { module.free(*handle) }?;
            print_done(json, "free", *handle);
        }
        Cmd::P2pQuery { dev, peer } => {
            let hold = peer.open()?;
            let q = module.p2p_query(*dev, hold.peer())?;
            if json {
                println!(
                    "{}",
                    json!({
                        "dev": dev,
                        "peer": q.peer.to_string(),
                        "map_type": q.map_type.to_string(),
                        "distance": q.distance,
                        "reason": q.reason,
                    })
                );
            } else {
                println!(
                    "device {dev} <- peer {}: {}, distance {}, {}",
                    q.peer,
                    q.map_type,
                    q.distance.map_or("-".to_string(), |d| d.to_string()),
                    q.reason
                );
            }
        }
        Cmd::DmaMap {
            dev,
            size,
            align,
            offset,
            length,
            peer,
        } => {
            let hold = peer.open()?;
            let a = module.alloc(*dev, *size, *align)?;
            let length = length.unwrap_or(a.size().saturating_sub(*offset));
            let m = module.dma_map(a.handle(), *offset, length, hold.peer())?;
            print_mapping(json, "dma-map", &m);
            unmap_and_report(&module, json, m)?;
            a.free()?;
        }
        Cmd::PinUser { size, peer } => {
            let hold = peer.open()?;
            let len = usize::try_from(*size).map_err(|_| "size too large")?;
            let buf = HostBuffer::new(len)
                .map_err(|e| format!("cannot map {size} bytes of host memory: {e}"))?;
            let m = module.pin_user(buf.addr(), *size, hold.peer())?;
            print_mapping(json, "pin-user", &m);
            unmap_and_report(&module, json, m)?;
        }
        Cmd::BlockIo {
            dev,
            device,
            offset,
            len,
            seg,
            depth,
        } => block_io(&module, json, *dev, device, *offset, *len, *seg, *depth)?,
        Cmd::Unmap { map_handle } => {
            // SAFETY: The module file this command opened holds no mapping:
            // the number names nothing a device uses, and the module's
            // answer (an error) is what the command shows.
            #[allow(unsafe_code)]
            unsafe { module.unmap_raw(*map_handle) }?;
            print_done(json, "unmap", *map_handle);
        }
        Cmd::DmabufImport { size, peer } => {
            let hold = peer.open()?;
            let buf = Udmabuf::create(*size)?;
            let m = module.dmabuf_import(buf.dmabuf(), hold.peer())?;
            print_mapping(json, "dmabuf-import", &m);
            unmap_and_report(&module, json, m)?;
        }
        // These were run before the module was opened.
        Cmd::Sanity(_)
        | Cmd::Child { .. }
        | Cmd::Bench(_)
        | Cmd::Doctor(_)
        | Cmd::Copy(_)
        | Cmd::Calibrate(_)
        | Cmd::Describe { .. }
        | Cmd::Store(_) => {}
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("p2pdma-ctl: {e}");
            ExitCode::FAILURE
        }
    }
}
