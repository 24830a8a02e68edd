//! The P2P part of the rule: whether the kernel lets the storage's
//! controller (every one, for a multipath namespace) reach the memory.

use std::fmt;

use super::facts::Facts;
use crate::{
    discovery::{Module, NvmePath, Transport},
    memory::peer::{MapType, P2pQuery, Peer},
};

/// Why the rule does not choose P2P.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum P2pRefusal {
    /// The module's device node is missing or does not answer.
    NoModule,
    /// The accelerator is not the module's.
    NoAccelerator,
    /// The storage is not on an NVMe namespace.
    NotNvme,
    /// The kernel was not asked or did not answer.
    NoAnswer,
    /// The kernel does not map P2P between the two; its reason.
    Kernel(String),
    /// The kernel was not asked or did not answer for this path of a
    /// multipath namespace.
    NoAnswerOnPath(NvmePath),
    /// The kernel does not map P2P for this path of a multipath namespace;
    /// its reason.
    KernelOnPath(NvmePath, String),
    /// The md array's level takes no P2P pages; the array and its level.
    ArrayLevel(String, String),
    /// The md array has no member the kernel could be asked about.
    NoMembers(String),
    /// The kernel was not asked or did not answer for this member of an md
    /// array (the array named first).
    NoAnswerOnMember(String, NvmePath),
    /// The kernel does not map P2P for this member of an md array; its
    /// reason.
    KernelOnMember(String, NvmePath, String),
    /// The namespace's controller is reached over a fabric whose kernel
    /// driver takes no P2P pages; why.
    Fabric(NvmePath, String),
}

/// I/O to an array reaches its members.
pub(crate) const EVERY_MEMBER: &str =
    "I/O to an md array reaches its members, and a write to a mirror every leg, so P2P needs every one";

/// I/O to a multipath namespace may take any path.
pub(crate) const EVERY_PATH: &str =
    "I/O to a multipath namespace may take any of its paths, so P2P needs every one";

impl fmt::Display for P2pRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            P2pRefusal::NoModule => f.write_str(
                "the p2pdma kernel module is not available (not loaded, or /dev/p2pdma cannot be opened)",
            ),
            P2pRefusal::NoAccelerator => {
                f.write_str("the accelerator is not bound to the p2pdma module")
            }
            P2pRefusal::NotNvme => {
                f.write_str("the storage is not on an NVMe namespace, which P2P DMA needs")
            }
            P2pRefusal::NoAnswer => f.write_str(
                "the kernel did not answer whether the two devices can reach each other",
            ),
            P2pRefusal::Kernel(why) => f.write_str(why),
            P2pRefusal::NoAnswerOnPath(p) => write!(
                f,
                "the kernel did not answer whether path {p} reaches the accelerator ({EVERY_PATH})"
            ),
            P2pRefusal::KernelOnPath(p, why) => write!(f, "path {p}: {why} ({EVERY_PATH})"),
            P2pRefusal::ArrayLevel(name, level) => write!(
                f,
                "md array {name} is {level}: the kernel takes P2P pages only on raid0, raid1 and raid10 arrays whose members all take them"
            ),
            P2pRefusal::NoMembers(name) => write!(
                f,
                "md array {name} has no member in its layout that the kernel could be asked about"
            ),
            P2pRefusal::NoAnswerOnMember(name, p) => write!(
                f,
                "the kernel did not answer whether member {p} of md array {name} reaches the accelerator ({EVERY_MEMBER})"
            ),
            P2pRefusal::KernelOnMember(name, p, why) => {
                write!(f, "member {p} of md array {name}: {why} ({EVERY_MEMBER})")
            }
            P2pRefusal::Fabric(p, why) => write!(f, "{p}: {why}"),
        }
    }
}

/// Whether the kernel's answer allows P2P: `Ok` with how, or the refusal
/// in words.
pub(crate) fn allowed(q: &P2pQuery) -> std::result::Result<String, String> {
    let distance = q.distance.map_or_else(
        || "unknown distance".to_string(),
        |d| format!("distance {d}"),
    );
    match q.map_type {
        MapType::BusAddr => Ok(format!("P2P by PCI bus address ({distance}): {}", q.reason)),
        MapType::ThruHostBridge => Ok(format!(
            "P2P through a host bridge the kernel allows ({distance}): {}",
            q.reason
        )),
        MapType::NotSupported | MapType::Unknown(_) => Err(if q.reason.is_empty() {
            format!("the kernel answers {}", q.map_type)
        } else {
            q.reason.clone()
        }),
    }
}

/// Why P2P is not possible, the first missing piece; `None` when it is.
pub fn p2p_refusal(facts: &Facts) -> Option<P2pRefusal> {
    p2p_decision(facts).err()
}

pub(super) fn p2p_decision(facts: &Facts) -> std::result::Result<String, P2pRefusal> {
    if !facts.module {
        return Err(P2pRefusal::NoModule);
    }
    if !facts.accelerator {
        return Err(P2pRefusal::NoAccelerator);
    }
    if !facts.storage.nvme {
        return Err(P2pRefusal::NotNvme);
    }
    if let Some(a) = &facts.storage.array {
        return array_decision(facts, a);
    }
    if facts.paths.is_empty() {
        if let Some(p) = &facts.storage.fabric {
            if let Some(why) = fabric_refusal(p) {
                return Err(P2pRefusal::Fabric(p.clone(), why));
            }
        }
        let q = facts.p2p.as_ref().ok_or(P2pRefusal::NoAnswer)?;
        return allowed(q).map_err(P2pRefusal::Kernel);
    }
    let mut how = Vec::new();
    for (path, q) in &facts.paths {
        if let Some(why) = fabric_refusal(path) {
            return Err(P2pRefusal::KernelOnPath(path.clone(), why));
        }
        let q = q
            .as_ref()
            .ok_or_else(|| P2pRefusal::NoAnswerOnPath(path.clone()))?;
        let h = allowed(q).map_err(|why| P2pRefusal::KernelOnPath(path.clone(), why))?;
        how.push(format!("path {path}: {h}"));
    }
    Ok(format!(
        "P2P on every path of the multipath namespace, since I/O may take any of them; {}",
        how.join("; ")
    ))
}

/// P2P on an md array: its level takes P2P pages, and the kernel maps P2P
/// between the accelerator and every member's controller (every path of a
/// multipath member).
fn array_decision(
    facts: &Facts,
    a: &super::facts::ArrayFacts,
) -> std::result::Result<String, P2pRefusal> {
    if !a.level_takes_p2p() {
        return Err(P2pRefusal::ArrayLevel(a.name.clone(), a.level.clone()));
    }
    if facts.paths.is_empty() {
        return Err(P2pRefusal::NoMembers(a.name.clone()));
    }
    let mut how = Vec::new();
    for (path, q) in &facts.paths {
        if let Some(why) = fabric_refusal(path) {
            return Err(P2pRefusal::KernelOnMember(
                a.name.clone(),
                path.clone(),
                why,
            ));
        }
        let q = q
            .as_ref()
            .ok_or_else(|| P2pRefusal::NoAnswerOnMember(a.name.clone(), path.clone()))?;
        let h = allowed(q)
            .map_err(|why| P2pRefusal::KernelOnMember(a.name.clone(), path.clone(), why))?;
        how.push(format!("member {path}: {h}"));
    }
    Ok(format!(
        "P2P on every member of md array {} ({}), since its I/O reaches all of them; {}",
        a.name,
        a.level,
        how.join("; ")
    ))
}

/// Why no byte of the storage moves by P2P over the fabric that reaches it
/// (the namespace's controller, any path of a multipath namespace, any
/// member of an array): the first such path and its transport's reason.
pub(super) fn fabric_reason(facts: &Facts) -> Option<String> {
    let one = facts.storage.fabric.iter();
    let paths = facts.paths.iter().map(|(p, _)| p);
    one.chain(paths)
        .find_map(|p| fabric_refusal(p).map(|why| format!("{p}: {why}")))
}

/// Why a path over a fabric carries no P2P data, if it is over one: the
/// kernel is asked about PCI functions, and a fabric's controller has none.
fn fabric_refusal(path: &NvmePath) -> Option<String> {
    path.transport.as_deref().and_then(Transport::p2p_refusal)
}

/// Asks the kernel, for each path of a multipath namespace, whether its
/// controller reaches accelerator `index` (the facts [`Facts::paths`]
/// wants).
pub fn query_paths(
    module: &Module,
    index: u32,
    paths: &[NvmePath],
) -> Vec<(NvmePath, Option<P2pQuery>)> {
    paths
        .iter()
        .map(|p| {
            let q = p
                .pci
                .and_then(|pci| module.p2p_query(index, Peer::Pci(pci)).ok());
            (p.clone(), q)
        })
        .collect()
}
