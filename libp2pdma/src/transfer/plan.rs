//! The path rule: which way data moves between a storage file and
//! accelerator memory, decided as a pure function of a few facts. The
//! engine's AUTO decides with it, and the doctor reports the same decision.

use std::fmt;

use crate::{
    discovery::{Module, NvmePath},
    memory::peer::{MapType, P2pQuery, Peer},
};

/// How data moves between storage and accelerator memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferPath {
    /// The NVMe device DMAs straight into (or out of) the accelerator's
    /// memory through the block layer (`O_DIRECT` on P2P pages).
    P2p,
    /// NVMe commands built by the library and sent through the namespace's
    /// generic character device, with the accelerator's bus addresses.
    NvmeCmd,
    /// Staged through host memory: storage to host, host to accelerator.
    Bounce,
    /// NVMe commands this process puts in queues in accelerator memory, on
    /// a controller it drives through VFIO: no kernel in the I/O path.
    Queues,
}

impl TransferPath {
    /// `p2p`, `nvme-cmd`, `bounce`, `queues`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransferPath::P2p => "p2p",
            TransferPath::NvmeCmd => "nvme-cmd",
            TransferPath::Bounce => "bounce",
            TransferPath::Queues => "queues",
        }
    }
}

impl fmt::Display for TransferPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The data path chosen, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathChoice {
    /// The path.
    pub path: TransferPath,
    /// Why, in words.
    pub reason: String,
}

/// What [`choose_path`] decides on.
#[derive(Clone, Copy, Debug, Default)]
pub struct PathFacts<'a> {
    /// The p2pdma module's device node opened and speaks our ABI.
    pub module: bool,
    /// The accelerator is bound to the module.
    pub accelerator: bool,
    /// The storage is an NVMe namespace (or a partition or file on one).
    pub storage_nvme: bool,
    /// The kernel's answer to the P2P query between the two, if it was
    /// asked and answered.
    pub p2p: Option<&'a P2pQuery>,
    /// For a native-multipath namespace head: each of its paths with the
    /// kernel's answer for that path's controller (`None`: not asked or no
    /// answer). I/O may take any path, so P2P needs every one of them; `p2p`
    /// is then not used. Empty for other storage.
    pub paths: &'a [(NvmePath, Option<P2pQuery>)],
}

/// Why [`choose_path`] does not choose P2P.
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
}

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
pub fn p2p_refusal(facts: &PathFacts<'_>) -> Option<P2pRefusal> {
    p2p_decision(facts).err()
}

fn p2p_decision(facts: &PathFacts<'_>) -> std::result::Result<String, P2pRefusal> {
    if !facts.module {
        return Err(P2pRefusal::NoModule);
    }
    if !facts.accelerator {
        return Err(P2pRefusal::NoAccelerator);
    }
    if !facts.storage_nvme {
        return Err(P2pRefusal::NotNvme);
    }
    if facts.paths.is_empty() {
        let q = facts.p2p.ok_or(P2pRefusal::NoAnswer)?;
        return allowed(q).map_err(P2pRefusal::Kernel);
    }
    let mut how = Vec::new();
    for (path, q) in facts.paths {
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

/// Chooses the data path: [`TransferPath::P2p`] when the module, the accelerator
/// and NVMe storage are there and the kernel maps P2P between them by bus
/// address or through an allowed host bridge (for a multipath namespace,
/// between the accelerator and every path's controller); otherwise
/// [`TransferPath::Bounce`], with the first missing piece as the reason
/// ([`p2p_refusal`] has it as a value). [`TransferPath::NvmeCmd`] is never chosen
/// here: it is taken only when asked for.
pub fn choose_path(facts: &PathFacts<'_>) -> PathChoice {
    match p2p_decision(facts) {
        Ok(reason) => PathChoice {
            path: TransferPath::P2p,
            reason,
        },
        Err(why) => PathChoice {
            path: TransferPath::Bounce,
            reason: format!(
                "P2P not possible: {why}; the library will stage through host memory (bounce pipeline)"
            ),
        },
    }
}

/// Asks the kernel, for each path of a multipath namespace, whether its
/// controller reaches accelerator `index` (the facts [`PathFacts::paths`]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn query(map_type: MapType, distance: Option<u32>, reason: &str) -> P2pQuery {
        P2pQuery {
            map_type,
            distance,
            reason: reason.to_string(),
            peer: "0000:03:00.0".parse().unwrap(),
        }
    }

    fn facts(p2p: Option<&P2pQuery>) -> PathFacts<'_> {
        PathFacts {
            module: true,
            accelerator: true,
            storage_nvme: true,
            p2p,
            paths: &[],
        }
    }

    const TAIL: &str = "; the library will stage through host memory (bounce pipeline)";

    #[test]
    fn p2p_is_chosen_when_the_kernel_maps_by_bus_address_or_an_allowed_host_bridge() {
        let q = query(
            MapType::BusAddr,
            Some(4),
            "a and b share upstream bridge c: P2P by bus address",
        );
        let c = choose_path(&facts(Some(&q)));
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
        let c = choose_path(&facts(Some(&q)));
        assert_eq!(c.path, TransferPath::P2p);
        assert!(
            c.reason
                .starts_with("P2P through a host bridge the kernel allows (distance 6): they meet"),
            "{}",
            c.reason
        );
        let q = query(MapType::BusAddr, None, "x");
        assert!(choose_path(&facts(Some(&q)))
            .reason
            .contains("unknown distance"));
    }

    #[test]
    fn bounce_is_chosen_with_the_first_missing_piece() {
        let q = query(MapType::BusAddr, Some(4), "fine");
        let all = facts(Some(&q));
        let cases = [
            (
                PathFacts {
                    module: false,
                    ..all
                },
                "the p2pdma kernel module is not available",
            ),
            (
                PathFacts {
                    module: false,
                    accelerator: false,
                    storage_nvme: false,
                    p2p: None,
                    paths: &[],
                },
                "the p2pdma kernel module is not available",
            ),
            (
                PathFacts {
                    accelerator: false,
                    ..all
                },
                "the accelerator is not bound to the p2pdma module",
            ),
            (
                PathFacts {
                    accelerator: false,
                    storage_nvme: false,
                    ..all
                },
                "the accelerator is not bound",
            ),
            (
                PathFacts {
                    storage_nvme: false,
                    ..all
                },
                "the storage is not on an NVMe namespace",
            ),
            (PathFacts { p2p: None, ..all }, "the kernel did not answer"),
        ];
        for (f, want) in cases {
            let c = choose_path(&f);
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
        let why = "0000:03:00.0 and 0000:04:00.0 do not share an upstream bridge or whitelisted host bridge";
        let q = query(MapType::NotSupported, None, why);
        let c = choose_path(&facts(Some(&q)));
        assert_eq!(c.path, TransferPath::Bounce);
        assert_eq!(c.reason, format!("P2P not possible: {why}{TAIL}"));
        let q = query(MapType::NotSupported, None, "");
        assert_eq!(
            choose_path(&facts(Some(&q))).reason,
            format!("P2P not possible: the kernel answers not-supported{TAIL}")
        );
        let q = query(MapType::Unknown(9), Some(1), "");
        let c = choose_path(&facts(Some(&q)));
        assert_eq!(c.path, TransferPath::Bounce);
        assert!(
            c.reason.contains("the kernel answers unknown(9)"),
            "{}",
            c.reason
        );
        assert_eq!(
            choose_path(&PathFacts::default()).path,
            TransferPath::Bounce
        );
    }

    fn mp_path(name: &str, ctrl: &str, pci: &str) -> NvmePath {
        NvmePath {
            name: name.into(),
            controller: Some(ctrl.into()),
            pci: Some(pci.parse().unwrap()),
        }
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
        let mp = |paths| PathFacts {
            module: true,
            accelerator: true,
            storage_nvme: true,
            // The answer for one controller does not count for a multipath
            // namespace: only the paths' answers do.
            p2p: Some(&near),
            paths,
        };
        let both = [
            (a.clone(), Some(near.clone())),
            (b.clone(), Some(host.clone())),
        ];
        let c = choose_path(&mp(&both));
        assert_eq!(c.path, TransferPath::P2p);
        assert_eq!(
            c.reason,
            "P2P on every path of the multipath namespace, since I/O may take any of them; \
             path nvme1c1n1 (nvme1 at 0000:07:00.0): P2P by PCI bus address (distance 4): shared switch; \
             path nvme1c2n1 (nvme2 at 0000:08:00.0): P2P through a host bridge the kernel allows (distance 6): allowed host bridge"
        );
        assert_eq!(p2p_refusal(&mp(&both)), None);

        let one_far = [
            (a.clone(), Some(near.clone())),
            (b.clone(), Some(far.clone())),
        ];
        let c = choose_path(&mp(&one_far));
        assert_eq!(c.path, TransferPath::Bounce);
        assert_eq!(
            c.reason,
            format!(
                "P2P not possible: path nvme1c2n1 (nvme2 at 0000:08:00.0): do not share an upstream bridge \
                 (I/O to a multipath namespace may take any of its paths, so P2P needs every one){TAIL}"
            )
        );
        assert_eq!(
            p2p_refusal(&mp(&one_far)),
            Some(P2pRefusal::KernelOnPath(
                b.clone(),
                "do not share an upstream bridge".into()
            ))
        );

        let unasked = [(a.clone(), None), (b.clone(), Some(near.clone()))];
        assert_eq!(
            p2p_refusal(&mp(&unasked)),
            Some(P2pRefusal::NoAnswerOnPath(a.clone()))
        );
        assert_eq!(
            choose_path(&mp(&unasked)).reason,
            format!(
                "P2P not possible: the kernel did not answer whether path nvme1c1n1 (nvme1 at 0000:07:00.0) \
                 reaches the accelerator (I/O to a multipath namespace may take any of its paths, so P2P needs every one){TAIL}"
            )
        );
        // The pieces before the kernel's answer come first.
        let no_module = PathFacts {
            module: false,
            ..mp(&both)
        };
        assert_eq!(p2p_refusal(&no_module), Some(P2pRefusal::NoModule));
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
                PathFacts {
                    module: false,
                    ..facts(None)
                },
                P2pRefusal::NoModule,
            ),
            (
                PathFacts {
                    accelerator: false,
                    ..facts(None)
                },
                P2pRefusal::NoAccelerator,
            ),
            (
                PathFacts {
                    storage_nvme: false,
                    ..facts(None)
                },
                P2pRefusal::NotNvme,
            ),
        ];
        for (f, r) in cases {
            assert_eq!(p2p_refusal(&f).as_ref(), Some(&r));
            assert_eq!(
                choose_path(&f).reason,
                format!("P2P not possible: {r}{TAIL}")
            );
        }
        assert_eq!(P2pRefusal::Kernel("k".into()).to_string(), "k");
    }
}
