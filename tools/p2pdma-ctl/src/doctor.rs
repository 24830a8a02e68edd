//! `p2pdma-ctl doctor` (can this machine move data between a storage path
//! and an accelerator by P2P, and if not, why), `p2pdma-ctl list --all`
//! (accelerators, NVMe namespaces and P2P memory providers) and
//! `p2pdma-ctl describe` (what is behind a storage path: a namespace, the
//! paths of a multipath one, an md array's layout and members).

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use p2pdma::{
    discovery::{P2pmemProvider, StorageTarget, Topology},
    doctor::AccelSelect,
    memory::ModuleMemory,
    transfer::{Config, Engine, StorageFile, Volume, VolumeSpec},
    Accelerator, Doctor, Module, PciAddress,
};
use serde_json::json;

/// Arguments of `doctor`.
#[derive(Args)]
pub struct DoctorArgs {
    /// The storage: a file or directory, a block device (/dev/nvme0n1,
    /// partitions too, md arrays), an NVMe generic device (/dev/ng0n1), or
    /// a striped volume (`volume:CHUNK[@DATA_OFFSET]:MEMBER,...`, whose
    /// controllers it takes, as `describe` does).
    pub path: Option<PathBuf>,
    /// The accelerator by the module's index (default: the first bound).
    #[arg(long, conflicts_with = "accel_pci")]
    pub dev: Option<u32>,
    /// The accelerator by PCI address (dddd:bb:dd.f).
    #[arg(long)]
    pub accel_pci: Option<PciAddress>,
}

/// Prints the doctor's report. It is a report: it exits 0 whatever it
/// finds.
pub fn run(node: &str, json: bool, args: &DoctorArgs) -> ExitCode {
    let select = match (args.dev, args.accel_pci) {
        (Some(i), _) => AccelSelect::Index(i),
        (None, Some(p)) => AccelSelect::Pci(p),
        (None, None) => AccelSelect::Auto,
    };
    let volume = args
        .path
        .as_deref()
        .and_then(|p| p.to_str())
        .and_then(VolumeSpec::parse);
    if let Some(spec) = volume {
        // A volume the library drives: its members, and what the path rule
        // says of each member's controller and the accelerator's memory.
        let r = spec
            .map_err(Box::<dyn std::error::Error>::from)
            .and_then(|s| describe_volume(&s, json));
        if let Err(e) = r {
            println!("the volume cannot be opened: {e}");
        }
        return ExitCode::SUCCESS;
    }
    let report = Doctor::new().node(node).run(args.path.as_deref(), select);
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    ExitCode::SUCCESS
}

fn bytes_mib(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

fn namespace_line(t: &StorageTarget) -> String {
    let mut s = t.disk_path.display().to_string();
    if let Some(nsid) = t.nsid {
        s.push_str(&format!(": namespace {nsid}"));
    } else {
        s.push(':');
    }
    if let Some(c) = &t.controller {
        s.push_str(&format!(" of {c}"));
    }
    match t.pci {
        Some(p) => s.push_str(&format!(" at {p}")),
        None => s.push_str(", no PCI function"),
    }
    s.push_str(&format!(
        ", {}-byte blocks, max transfer {}",
        t.logical_block_size,
        bytes_mib(t.max_transfer_bytes)
    ));
    if let Some(g) = &t.generic_path {
        s.push_str(&format!(", generic {}", g.display()));
    }
    s
}

/// `describe PATH`: the storage behind `path` as discovery resolves it,
/// or the striped volume a `volume:` path names.
pub fn describe(
    path: &std::path::Path,
    json: bool,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if let Some(spec) = path.to_str().and_then(VolumeSpec::parse) {
        return describe_volume(&spec?, json);
    }
    let t = Topology::new()
        .resolve(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if json {
        println!("{}", t.to_json());
        return Ok(ExitCode::SUCCESS);
    }
    if t.disk_path != path {
        println!("{} is on {}", path.display(), t.disk_path.display());
    }
    match &t.md {
        None => println!("{}", namespace_line(&t)),
        Some(md) => {
            let chunk = match md.chunk_bytes {
                0 => String::new(),
                c => format!(", {} chunks", bytes_mib(c)),
            };
            println!(
                "{}: md array {}{chunk}, {} member{} in its layout, {}{}",
                t.disk_path.display(),
                if md.level.is_empty() {
                    "(not assembled)"
                } else {
                    &md.level
                },
                md.raid_disks.unwrap_or(0),
                if md.raid_disks == Some(1) { "" } else { "s" },
                md.state.as_deref().unwrap_or("state unknown"),
                match md.degraded {
                    Some(d) if d > 0 => format!(", degraded ({d} missing)"),
                    _ => String::new(),
                }
            );
            for m in &md.members {
                let slot = m.slot.map_or("spare".to_string(), |s| format!("slot {s}"));
                let data = m
                    .data_offset
                    .map(|o| format!(", data at {}", bytes_mib(o)))
                    .unwrap_or_default();
                let under = match &m.target {
                    Some(t) => format!(": {}", namespace_line(t)),
                    None => ": its device is gone".to_string(),
                };
                println!("  {slot}  {} ({}){data}{under}", m.name, m.state.join(","));
            }
        }
    }
    for p in &t.multipath {
        println!("  path {p}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A striped volume: its controllers taken (from the nvme driver for
/// members named by block device), its layout, each member, and how the
/// queues path would move its data into the first accelerator's memory.
fn describe_volume(spec: &VolumeSpec, json: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let module = std::sync::Arc::new(Module::open()?);
    let v = std::sync::Arc::new(Volume::open(spec, module.clone())?);
    let file = StorageFile::volume(v.clone());
    let members: Vec<_> = v
        .members()
        .iter()
        .enumerate()
        .map(|(slot, m)| {
            json!({
                "slot": slot,
                "namespace": m.name(),
                "controller": m.controller().pci().to_string(),
                "nsid": m.info().nsid,
                "bytes": m.size(),
                "block_size": m.info().block_size,
            })
        })
        .collect();
    let reason = match module.accelerators()?.first() {
        Some(a) => {
            let mem = ModuleMemory::alloc(module.clone(), a.index, 4096, 0)?;
            let engine = Engine::new(Config::default(), Some(module.clone()));
            let c = engine.choose(&file, &mem)?;
            Some(format!("{}: {}", c.path, c.reason))
        }
        None => None,
    };
    if json {
        println!(
            "{}",
            json!({
                "volume": v.name(),
                "chunk": v.chunk(),
                "data_offset": v.data_offset(),
                "bytes": v.size(),
                "members": members,
                "into_accelerator": reason,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: {}, {} member{}, data from {} on each",
        v.name(),
        bytes_mib(v.size()),
        v.members().len(),
        if v.members().len() == 1 { "" } else { "s" },
        bytes_mib(v.data_offset())
    );
    for m in v.members().iter().enumerate() {
        println!(
            "  slot {}  {} ({}, {}-byte blocks)",
            m.0,
            m.1.name(),
            bytes_mib(m.1.size()),
            m.1.info().block_size
        );
    }
    if let Some(r) = reason {
        println!("  into accelerator memory: {r}");
    }
    Ok(ExitCode::SUCCESS)
}

fn provider_line(p: &P2pmemProvider) -> String {
    format!(
        "{}: {} ({} free), {}, driver {}",
        p.pci,
        bytes_mib(p.size),
        bytes_mib(p.available),
        if p.published {
            "published"
        } else {
            "not published"
        },
        p.driver.as_deref().unwrap_or("none")
    )
}

/// `list --all`: the module's accelerators (or why there are none), every
/// NVMe namespace and every P2P memory provider. A missing module is
/// shown, not an error; unreadable sysfs is.
pub fn list_all(node: &str, json: bool) -> ExitCode {
    let topo = Topology::new();
    let accels = Module::open_path(node).and_then(|m| m.accelerators());
    let namespaces = topo.list_nvme_namespaces();
    let providers = topo.list_p2pmem_providers();
    let failed = namespaces.is_err() || providers.is_err();
    if json {
        let (list, err) = match &accels {
            Ok(v) => (
                Some(v.iter().map(Accelerator::to_json).collect::<Vec<_>>()),
                None,
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        println!(
            "{}",
            json!({
                "accelerators": list,
                "module_error": err,
                "nvme_namespaces": namespaces.as_ref().map(|v| v.iter().map(StorageTarget::to_json).collect::<Vec<_>>()).unwrap_or_default(),
                "nvme_error": namespaces.as_ref().err().map(|e| e.to_string()),
                "p2pmem_providers": providers.as_ref().map(|v| v.iter().map(P2pmemProvider::to_json).collect::<Vec<_>>()).unwrap_or_default(),
                "p2pmem_error": providers.as_ref().err().map(|e| e.to_string()),
            })
        );
    } else {
        println!("accelerators (p2pdma module):");
        match &accels {
            Ok(v) if v.is_empty() => println!("  none bound"),
            Ok(v) => {
                for a in v {
                    println!(
                        "  {}: {} [{:04x}:{:04x}] BAR {} {}, P2P {} ({} free)",
                        a.index,
                        a.pci,
                        a.vendor,
                        a.device,
                        a.bar,
                        bytes_mib(a.bar_size),
                        bytes_mib(a.p2p_size),
                        bytes_mib(a.p2p_available)
                    );
                }
            }
            Err(e) => println!("  {e}"),
        }
        println!("nvme namespaces:");
        match &namespaces {
            Ok(v) if v.is_empty() => println!("  none"),
            Ok(v) => v.iter().for_each(|t| println!("  {}", namespace_line(t))),
            Err(e) => println!("  {e}"),
        }
        println!("p2pmem providers:");
        match &providers {
            Ok(v) if v.is_empty() => println!("  none"),
            Ok(v) => v.iter().for_each(|p| println!("  {}", provider_line(p))),
            Err(e) => println!("  {e}"),
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
