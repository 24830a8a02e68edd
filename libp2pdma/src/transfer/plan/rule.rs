//! The rule: facts in, a path and its reason out (or, for a path the caller
//! forces and the facts rule out, the reason it cannot be taken).

use super::{
    facts::{DrivenFacts, DrivenMember, Facts},
    p2p::{fabric_reason, p2p_decision, p2p_refusal},
    path::{P2pSubmit, PathChoice, PathPref, TransferPath},
};
use crate::{memory::MemoryKind, Error, Result};

/// The path transfers between the storage and the memory of `facts` take,
/// and why.
///
/// - A namespace of a controller this process drives is reached only by
///   [`TransferPath::Queues`] (AUTO chooses it; any other preference is
///   `Error::PathUnavailable`).
/// - AUTO chooses [`TransferPath::P2p`] when the memory is an accelerator's
///   from the module, the module and NVMe storage are there, and the kernel
///   maps P2P between them by bus address or through an allowed host bridge
///   (for a multipath namespace, between the accelerator and every path's
///   controller); otherwise [`TransferPath::Bounce`], with the first missing
///   piece as the reason ([`p2p_refusal`] has it as a
///   value). For host memory with a CPU mapping, AUTO chooses
///   [`TransferPath::Direct`]. AUTO never chooses [`TransferPath::NvmeCmd`].
/// - A forced path is taken when the memory and the storage allow it at
///   all, with AUTO's reason beside it; otherwise `Error::PathUnavailable`
///   with the reason.
/// - The reason for P2P says how its I/O is submitted: by the module's
///   block I/O (a block device, memory from a module with `BLOCK_IO`, unless
///   [`P2pSubmit::Odirect`]) or by `O_DIRECT` on the memory's mapping.
pub fn decide(facts: &Facts) -> Result<PathChoice> {
    let mut choice = match &facts.storage.driven {
        Some(driven) => queues(facts, driven)?,
        None => kernel_driven(facts)?,
    };
    if choice.path == TransferPath::P2p {
        choice.reason.push_str(submission(facts));
    }
    Ok(choice)
}

fn unavailable(path: &'static str, reason: String) -> Error {
    Error::PathUnavailable { path, reason }
}

/// A namespace this process drives.
fn queues(facts: &Facts, driven: &DrivenFacts) -> Result<PathChoice> {
    if !matches!(facts.pref, PathPref::Auto | PathPref::Queues) {
        return Err(unavailable(
            facts.pref.as_str(),
            format!(
                "{} is driven by this process, so only the queues path reaches it; give the controller back to the kernel for the other paths",
                driven.name
            ),
        ));
    }
    let hows: Vec<String> = driven
        .members
        .iter()
        .map(|member| member_data(facts, member))
        .collect();
    let how = match hows.as_slice() {
        [one] => one.clone(),
        [first, rest @ ..] if rest.iter().all(|h| h == first) => {
            format!("on each of its {} members, {first}", hows.len())
        }
        _ => driven
            .members
            .iter()
            .zip(&hows)
            .map(|(member, how)| format!("on member {}, {how}", member.name))
            .collect::<Vec<_>>()
            .join("; "),
    };
    Ok(PathChoice {
        path: TransferPath::Queues,
        reason: format!(
            "{} is driven by this process ({}): NVMe commands in queues in accelerator memory, no system call per I/O; data {how}; partial blocks through host staging",
            driven.name, driven.iommu
        ),
    })
}

/// How the data of a transfer with the driven namespace `member` moves.
fn member_data(facts: &Facts, member: &DrivenMember) -> String {
    let m = &facts.memory;
    match &m.kind {
        MemoryKind::Host if m.cpu_mapping => {
            "host memory pinned for the controller (PIN_USER)".to_string()
        }
        MemoryKind::ModuleBar { index, .. } if m.module_allocation => match &member.reach {
            Some(Ok(q)) => match q.distance {
                Some(d) => format!(
                    "accelerator {index}'s memory mapped for the controller (DMA_MAP), P2P distance {d}"
                ),
                None => format!(
                    "through host staging buffers: the kernel says {} cannot reach accelerator {index}'s memory by P2P ({})",
                    member.controller, q.reason
                ),
            },
            Some(Err(e)) => format!(
                "accelerator {index}'s memory mapped for the controller (DMA_MAP) where the module allows, host staging otherwise (P2P query: {e})"
            ),
            None => format!(
                "accelerator {index}'s memory mapped for the controller (DMA_MAP) where the module allows, host staging otherwise (P2P query not made)"
            ),
        },
        k @ (MemoryKind::Cuda { .. } | MemoryKind::Dmabuf) if m.dmabuf => format!(
            "{k} imported for the controller as a dma-buf (DMABUF_IMPORT) where the kernel allows, host staging otherwise"
        ),
        k => format!("through host staging buffers ({k} cannot be mapped for the controller)"),
    }
}

/// Storage the kernel drives.
fn kernel_driven(facts: &Facts) -> Result<PathChoice> {
    let auto = auto(facts);
    let kind = &facts.memory.kind;
    let fabric = fabric_reason(facts);
    match facts.pref {
        PathPref::Auto => Ok(auto),
        PathPref::Queues => Err(unavailable(
            "queues",
            format!(
                "{} is reached through the kernel; the queues path needs a namespace of a controller this process drives (queues::Controller::initialize, then StorageFile::namespace)",
                facts.storage.path.display()
            ),
        )),
        PathPref::Bounce => Ok(PathChoice {
            path: TransferPath::Bounce,
            reason: "bounce path forced by configuration".into(),
        }),
        // Accelerator memory and an array some member of which P2P cannot
        // reach: a P2P write fails on that leg, and md may hide it (the
        // mirrors diverge), so P2P is never forced onto one.
        PathPref::P2p
            if facts.storage.array.is_some()
                && matches!(kind, MemoryKind::ModuleBar { .. })
                && auto.path != TransferPath::P2p =>
        {
            Err(unavailable(
                "p2p",
                match p2p_refusal(facts) {
                    Some(why) => format!("{why}; P2P is not forced onto an md array that cannot take it on every member, where a write could land on some legs only"),
                    None => auto.reason,
                },
            ))
        }
        // A fabric whose driver takes no P2P pages fails every P2P I/O:
        // P2P is not forced onto it.
        PathPref::P2p if matches!(kind, MemoryKind::ModuleBar { .. }) && fabric.is_some() => {
            Err(unavailable(
                "p2p",
                format!(
                    "{}; P2P is not forced over a fabric whose driver takes no P2P pages",
                    fabric.as_deref().unwrap_or_default()
                ),
            ))
        }
        PathPref::P2p if facts.memory.cpu_mapping => Ok(PathChoice {
            path: TransferPath::P2p,
            reason: if auto.path == TransferPath::P2p {
                format!("P2P forced by configuration ({})", auto.reason)
            } else {
                format!("P2P forced by configuration, although: {}", auto.reason)
            },
        }),
        PathPref::P2p => Err(unavailable(
            "p2p",
            format!("{kind} has no CPU mapping storage could DMA into"),
        )),
        PathPref::NvmeCmd => nvme_cmd(facts, &auto),
    }
}

/// AUTO's choice for storage the kernel drives.
fn auto(facts: &Facts) -> PathChoice {
    let bounce = |reason: String| PathChoice {
        path: TransferPath::Bounce,
        reason,
    };
    match &facts.memory.kind {
        MemoryKind::Host if facts.memory.cpu_mapping => PathChoice {
            path: TransferPath::Direct,
            reason: "the memory is host memory (the host-memory device), which needs no P2P: the storage DMAs straight into it by O_DIRECT, no staging copy (the bounce pipeline where the file and memory addresses do not align together to the block)".into(),
        },
        MemoryKind::Host => bounce(
            "P2P not possible: the memory is the host-memory device, not accelerator memory; staging through host memory (bounce pipeline)".into(),
        ),
        MemoryKind::Dmabuf => bounce(
            "P2P by O_DIRECT not possible: dma-buf memory has no CPU mapping of P2P pages for the block layer (P2P into it runs on the queues path, which imports the dma-buf); staging through host memory (bounce pipeline)".into(),
        ),
        MemoryKind::Cuda { ordinal, .. } => bounce(format!(
            "P2P by O_DIRECT not possible: CUDA device {ordinal}'s memory has no CPU mapping of P2P pages for the block layer (P2P into it runs on the queues path, which imports its dma-buf); staging through host memory page-locked for CUDA, the GPU's copy engine moving each chunk (bounce pipeline)"
        )),
        MemoryKind::ModuleBar { .. } => match p2p_decision(facts) {
            Ok(reason) => PathChoice {
                path: TransferPath::P2p,
                reason,
            },
            Err(why) => bounce(format!(
                "P2P not possible: {why}; the library will stage through host memory (bounce pipeline)"
            )),
        },
    }
}

/// The library's own NVMe commands, asked for.
fn nvme_cmd(facts: &Facts, auto: &PathChoice) -> Result<PathChoice> {
    let s = &facts.storage;
    let path = s.path.display();
    let refuse = |reason: String| Err(unavailable("nvme-cmd", reason));
    let Some(ns) = &s.namespace else {
        let besides = s
            .other_filesystem
            .as_ref()
            .map(|r| format!("; besides, {r}"))
            .unwrap_or_default();
        return refuse(format!(
            "{path} is not on an NVMe namespace (NVMe commands address namespace blocks){besides}"
        ));
    };
    if let Some(why) = &s.nvme_cmd_refusal {
        return refuse(format!("{path}: {why}"));
    }
    let layout = match &s.filesystem {
        Some(Ok(fs)) => format!("; file extents mapped with FIEMAP ({fs})"),
        Some(Err(reason)) => return refuse(format!("{path}: {reason}")),
        None => String::new(),
    };
    let at = match s.dev_start {
        0 => String::new(),
        b => format!(", partition at byte {b}"),
    };
    if !facts.memory.cpu_mapping {
        return refuse(format!(
            "{} has no CPU mapping to give the controller",
            facts.memory.kind
        ));
    }
    if !matches!(facts.memory.kind, MemoryKind::Host) {
        if let Some(why) = fabric_reason(facts) {
            return refuse(format!(
                "the commands' data would move by P2P into {}, and {why}",
                facts.memory.kind
            ));
        }
    }
    Ok(PathChoice {
        path: TransferPath::NvmeCmd,
        reason: format!(
            "NVMe commands built by the library on {} (namespace {}{at}){layout}; {}",
            ns.generic.display(),
            ns.nsid,
            auto.reason
        ),
    })
}

/// Whether P2P I/O goes through the module's block I/O: a block device,
/// memory from a module that has it, unless the caller says `O_DIRECT`.
pub(crate) fn by_module(submit: P2pSubmit, is_file: bool, block_io: bool) -> bool {
    submit == P2pSubmit::Auto && !is_file && block_io
}

/// How P2P I/O is submitted, for the path's reason.
fn submission(facts: &Facts) -> &'static str {
    let s = &facts.storage;
    if by_module(facts.submit, s.is_file, facts.memory.block_io) {
        "; the module submits the block I/O on the memory's own pages (BLOCK_IO: nothing pinned per I/O)"
    } else if facts.submit == P2pSubmit::Odirect {
        "; O_DIRECT on the memory's mapping, as configured (pages pinned per I/O)"
    } else if s.is_file {
        "; O_DIRECT on the memory's mapping (a regular file: its filesystem's direct I/O pins the pages per I/O)"
    } else {
        "; O_DIRECT on the memory's mapping (pages pinned per I/O): the module's block I/O needs a module allocation and a module with BLOCK_IO"
    }
}
