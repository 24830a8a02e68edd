//! The doctor: whether data between a storage path and an accelerator can
//! move by P2P DMA on this machine, and if not, why, in the manner of
//! `gdscheck -p`.
//!
//! [`Doctor::run`] makes a [`Report`]: one [`Check`] per fact (kernel
//! config, module, device node, accelerator, its P2P memory, the storage,
//! the kernel's P2P answer, IOMMU, ACS, NVMe passthrough) and the data path
//! the library would take. [`choose_path`] is the same decision as a pure
//! function of a few [`PathFacts`], for the transfer engine.

use std::{
    collections::BTreeMap,
    fmt,
    fs::File,
    io::Read,
    os::fd::AsFd,
    path::{Path as FsPath, PathBuf},
};

use flate2::read::GzDecoder;
use rustix::{
    fs::{open, Mode, OFlags},
    io::Errno,
};
use serde_json::json;

use crate::{
    discovery::DEVICE_NODE,
    queues::claim::{IommuMode, NVME_CLASS},
    discovery::{
        acs_bits, acs_control, acs_path, common_upstream, NvmePath, PciFunction, StorageTarget,
        TargetKind, Topology, pci::PCI_ACS_REDIRECT,
    },
    Accelerator, Error, MapType, Module, P2pQuery, PciAddress, Peer,
};

/// Default root of the kernel configs named after releases.
pub const BOOT_ROOT: &str = "/boot";
/// Largest kernel config read (real ones are about 300 KiB).
const MAX_KCONFIG: u64 = 16 << 20;
/// Below this much free P2P memory the doctor warns.
const LOW_P2P_MEMORY: u64 = 4 << 20;
/// Width the text report wraps its details to.
const TEXT_WIDTH: usize = 100;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// As it should be.
    Ok,
    /// Works, but worth knowing (it may cost speed or need action later).
    Warn,
    /// Stands in the way of P2P.
    Fail,
    /// Not checked: a prerequisite is missing, or it cannot be read.
    Skip,
}

impl Status {
    /// `ok`, `warn`, `fail`, `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        })
    }
}

/// One fact the doctor looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// How it came out.
    pub status: Status,
    /// What was found, in words.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, status: Status, detail: impl Into<String>) -> Self {
        Self {
            name,
            status,
            detail: detail.into(),
        }
    }
}

/// How data moves between storage and accelerator memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
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

impl Path {
    /// `p2p`, `nvme-cmd`, `bounce`, `queues`.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::P2p => "p2p",
            Path::NvmeCmd => "nvme-cmd",
            Path::Bounce => "bounce",
            Path::Queues => "queues",
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The data path chosen, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathChoice {
    /// The path.
    pub path: Path,
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
const EVERY_PATH: &str =
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
fn allowed(q: &P2pQuery) -> std::result::Result<String, String> {
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

/// Chooses the data path: [`Path::P2p`] when the module, the accelerator
/// and NVMe storage are there and the kernel maps P2P between them by bus
/// address or through an allowed host bridge (for a multipath namespace,
/// between the accelerator and every path's controller); otherwise
/// [`Path::Bounce`], with the first missing piece as the reason
/// ([`p2p_refusal`] has it as a value). [`Path::NvmeCmd`] is never chosen
/// here: it is taken only when asked for.
pub fn choose_path(facts: &PathFacts<'_>) -> PathChoice {
    match p2p_decision(facts) {
        Ok(reason) => PathChoice {
            path: Path::P2p,
            reason,
        },
        Err(why) => PathChoice {
            path: Path::Bounce,
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

/// Which accelerator the doctor looks at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccelSelect {
    /// The first one bound to the module.
    #[default]
    Auto,
    /// The one at this index of the module.
    Index(u32),
    /// The one at this PCI address.
    Pci(PciAddress),
}

/// What the doctor found.
#[derive(Clone, Debug)]
pub struct Report {
    /// Every check, in the order made.
    pub checks: Vec<Check>,
    /// The data path the library would take.
    pub path: PathChoice,
    /// The NVMe generic device, when the NVMe command path would be
    /// possible (it is never chosen without being asked for).
    pub nvme_cmd: Option<PathBuf>,
    /// The storage, if it resolved.
    pub storage: Option<StorageTarget>,
    /// The accelerator, if the module has it.
    pub accelerator: Option<Accelerator>,
    /// The kernel's P2P answer, if it was asked.
    pub p2p: Option<P2pQuery>,
    /// For a multipath namespace: each path and the kernel's answer for
    /// its controller.
    pub p2p_paths: Vec<(NvmePath, Option<P2pQuery>)>,
}

impl Report {
    /// The check named `name`.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The report as JSON (for `--json`).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "checks": self.checks.iter().map(|c| json!({
                "name": c.name,
                "status": c.status.as_str(),
                "detail": c.detail,
            })).collect::<Vec<_>>(),
            "path": self.path.path.as_str(),
            "reason": self.path.reason,
            "nvme_cmd": {
                "possible": self.nvme_cmd.is_some(),
                "device": self.nvme_cmd.as_ref().map(|p| p.display().to_string()),
            },
            "storage": self.storage.as_ref().map(StorageTarget::to_json),
            "accelerator": self.accelerator.as_ref().map(|a| json!({
                "index": a.index,
                "pci": a.pci.to_string(),
                "vendor": format!("{:04x}", a.vendor),
                "device": format!("{:04x}", a.device),
                "bar": a.bar,
                "bar_size": a.bar_size,
                "p2p_size": a.p2p_size,
                "p2p_available": a.p2p_available,
            })),
            "p2p": self.p2p.as_ref().map(query_json),
            "p2p_paths": self.p2p_paths.iter().map(|(p, q)| json!({
                "path": p.name,
                "controller": p.controller,
                "pci": p.pci.map(|a| a.to_string()),
                "p2p": q.as_ref().map(query_json),
            })).collect::<Vec<_>>(),
        })
    }
}

fn query_json(q: &P2pQuery) -> serde_json::Value {
    json!({
        "peer": q.peer.to_string(),
        "map_type": q.map_type.to_string(),
        "distance": q.distance,
        "reason": q.reason,
    })
}

impl fmt::Display for Report {
    /// An aligned table, one check a row, details wrapped, then the path.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name_w = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .chain(["CHECK".len()])
            .max()
            .unwrap_or(0);
        let status_w = "STATUS".len();
        let indent = name_w + status_w + 4;
        let detail_w = TEXT_WIDTH.saturating_sub(indent).max(30);
        writeln!(f, "{:name_w$}  {:status_w$}  DETAIL", "CHECK", "STATUS")?;
        for c in &self.checks {
            let lines = wrap(&c.detail, detail_w);
            let mut lines = lines.iter();
            let first = lines.next().map_or("", |s| s.as_str());
            writeln!(
                f,
                "{:name_w$}  {:status_w$}  {first}",
                c.name,
                c.status.to_string()
            )?;
            for l in lines {
                writeln!(f, "{:indent$}{l}", "")?;
            }
        }
        writeln!(f)?;
        let label = "path: ";
        let lines = wrap(
            &self.path.reason,
            TEXT_WIDTH.saturating_sub(label.len() + 10),
        );
        writeln!(f, "{label}{}", self.path.path)?;
        for l in &lines {
            writeln!(f, "{:w$}{l}", "", w = label.len())?;
        }
        match &self.nvme_cmd {
            Some(dev) => writeln!(
                f,
                "nvme commands: possible through {} (used only when asked for)",
                dev.display()
            ),
            None => writeln!(f, "nvme commands: not possible (see nvme passthrough)"),
        }
    }
}

/// Splits `text` into lines of at most `width` characters at spaces (a
/// longer word gets a line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

/// A kernel's build configuration (`CONFIG_*` lines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// Where it was read from.
    pub source: PathBuf,
    values: BTreeMap<String, String>,
}

impl KernelConfig {
    /// Parses the text of a kernel `.config`: `CONFIG_X=value` lines;
    /// `# CONFIG_X is not set` and absent options are unset.
    pub fn parse(source: impl Into<PathBuf>, text: &str) -> Self {
        let values = text
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let (k, v) = l.split_once('=')?;
                k.starts_with("CONFIG_")
                    .then(|| (k.to_string(), v.trim_matches('"').to_string()))
            })
            .collect();
        Self {
            source: source.into(),
            values,
        }
    }

    /// The value of option `name` (`CONFIG_...`), `None` when unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Whether option `name` is built in or a module.
    pub fn enabled(&self, name: &str) -> bool {
        matches!(self.get(name), Some("y" | "m"))
    }

    /// `CONFIG_X=y`, or `CONFIG_X is not set`.
    fn describe(&self, name: &str) -> String {
        match self.get(name) {
            Some(v) => format!("{name}={v}"),
            None => format!("{name} is not set"),
        }
    }
}

/// The doctor, with the places it reads from.
#[derive(Clone, Debug)]
pub struct Doctor {
    topology: Topology,
    node: PathBuf,
    boot: PathBuf,
}

impl Default for Doctor {
    fn default() -> Self {
        Self::new()
    }
}

impl Doctor {
    /// A doctor for the running system.
    pub fn new() -> Self {
        Self {
            topology: Topology::new(),
            node: PathBuf::from(DEVICE_NODE),
            boot: PathBuf::from(BOOT_ROOT),
        }
    }

    /// Reads sysfs, `/dev` and procfs through `topology`.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Opens the module at `node` instead of [`DEVICE_NODE`].
    pub fn node(mut self, node: impl Into<PathBuf>) -> Self {
        self.node = node.into();
        self
    }

    /// Looks for `config-<release>` in `boot` instead of [`BOOT_ROOT`].
    pub fn boot_root(mut self, boot: impl Into<PathBuf>) -> Self {
        self.boot = boot.into();
        self
    }

    /// The kernel's config: `/proc/config.gz` if the kernel has it, else
    /// `/boot/config-<release>`. The error says where it looked.
    pub fn kernel_config(&self) -> Result<KernelConfig, String> {
        let gz = self.topology.proc_root().join("config.gz");
        if gz.exists() {
            let mut text = String::new();
            return File::open(&gz)
                .and_then(|f| {
                    GzDecoder::new(f)
                        .take(MAX_KCONFIG)
                        .read_to_string(&mut text)
                })
                .map(|_| KernelConfig::parse(&gz, &text))
                .map_err(|e| format!("cannot read {}: {e}", gz.display()));
        }
        let release_path = self.topology.proc_root().join("sys/kernel/osrelease");
        let release = std::fs::read_to_string(&release_path)
            .map(|r| r.trim().to_string())
            .map_err(|e| {
                format!(
                    "no {} and cannot read {}: {e}",
                    gz.display(),
                    release_path.display()
                )
            })?;
        let boot = self.boot.join(format!("config-{release}"));
        let mut text = String::new();
        match File::open(&boot).and_then(|f| f.take(MAX_KCONFIG).read_to_string(&mut text)) {
            Ok(_) => Ok(KernelConfig::parse(&boot, &text)),
            Err(e) => Err(format!(
                "no {} (CONFIG_IKCONFIG_PROC) and no {}: {e}",
                gz.display(),
                boot.display()
            )),
        }
    }

    /// Examines the path from `storage` (a file, a block device or an NVMe
    /// generic device; `None` to look at the machine only) to the
    /// accelerator chosen by `accel`. It never fails: what cannot be found
    /// or read is a check that says so.
    pub fn run(&self, storage: Option<&FsPath>, accel: AccelSelect) -> Report {
        let mut checks = Vec::new();

        let kconfig = self.kernel_config();
        checks.push(kernel_config_check(&kconfig));
        let io_uring = kconfig.as_ref().ok().map(|c| c.enabled("CONFIG_IO_URING"));

        let loaded = self.topology.sys_root().join("module/p2pdma").exists();
        let module = Module::open_path(&self.node);
        checks.push(self.module_check(loaded, &module));
        checks.push(self.node_check(loaded, &module));
        let module = module.ok();

        let (accelerator, accel_check) = self.accelerator(module.as_ref(), accel);
        checks.push(accel_check);
        checks.push(p2p_memory_check(accelerator.as_ref()));
        let accel_pci = accelerator.as_ref().map(|a| a.pci).or(match accel {
            AccelSelect::Pci(p) => Some(p),
            _ => None,
        });

        let target = storage.map(|p| self.topology.resolve(p));
        checks.push(storage_check(storage, &target));
        let target = target.and_then(Result::ok);
        let storage_nvme = target.as_ref().is_some_and(|t| t.is_nvme);

        let (p2p, p2p_paths, p2p_check) = self.p2p(
            module.as_ref(),
            accelerator.as_ref(),
            target.as_ref().filter(|t| t.is_nvme),
        );
        checks.push(p2p_check);

        let accel_fn = accel_pci.and_then(|a| self.topology.pci_function(a).ok());
        let storage_fn = target
            .as_ref()
            .and_then(|t| t.pci)
            .and_then(|a| self.topology.pci_function(a).ok());
        checks.push(self.iommu_check(accel_fn.as_ref(), storage_fn.as_ref(), p2p.as_ref()));
        checks.push(self.acs_check(accel_fn.as_ref(), storage_fn.as_ref()));

        let (nvme_cmd, passthrough) = nvme_passthrough_check(target.as_ref(), io_uring);
        checks.push(passthrough);
        checks.push(self.queues_check());

        let path = choose_path(&PathFacts {
            module: module.is_some(),
            accelerator: accelerator.is_some(),
            storage_nvme,
            p2p: p2p.as_ref(),
            paths: &p2p_paths,
        });
        Report {
            checks,
            path,
            nvme_cmd,
            storage: target,
            accelerator,
            p2p,
            p2p_paths,
        }
    }

    /// Whether the library could drive an NVMe controller itself (the
    /// queues path): each controller, its driver and how its DMA would be
    /// translated. Never a failure: the path is taken only for a
    /// controller the caller hands to the library.
    fn queues_check(&self) -> Check {
        const NAME: &str = "nvme queues";
        let dir = self.topology.sys_root().join("bus/pci/devices");
        let mut ctrls: Vec<(PciFunction, IommuMode)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<PciAddress>().ok())
            .filter_map(|a| self.topology.pci_function(a).ok())
            .filter(|f| f.class == Some(NVME_CLASS))
            .map(|f| {
                let mode = IommuMode::of_in(
                    self.topology.sys_root(),
                    self.topology.dev_root(),
                    &f.address.to_string(),
                );
                (f, mode)
            })
            .collect();
        ctrls.sort_by_key(|(f, _)| f.address.to_string());
        if ctrls.is_empty() {
            return Check::new(NAME, Status::Skip, "no NVMe controller");
        }
        let list = ctrls
            .iter()
            .map(|(f, m)| {
                format!(
                    "{} ({}, {})",
                    f.address,
                    f.driver.as_deref().unwrap_or("no driver"),
                    m.short()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let usable = |d: &str| {
            ctrls
                .iter()
                .filter(|(f, m)| *m == IommuMode::NoIommu && f.driver.as_deref() == Some(d))
                .map(|(f, _)| f.address.to_string())
                .collect::<Vec<_>>()
        };
        let (vfio, nvme) = (usable("vfio-pci"), usable("nvme"));
        if !vfio.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                format!(
                    "{list}: the library can drive {} itself, queues in accelerator memory (queues::Controller::initialize, then StorageFile::namespace)",
                    vfio.join(", ")
                ),
            );
        }
        if !nvme.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                format!(
                    "{list}: the library can take {} from the nvme driver when asked to (InitOptions::unbind), once no filesystem uses its namespaces, and drive it itself",
                    nvme.join(", ")
                ),
            );
        }
        // None can be driven: why, for the first one.
        let why = ctrls
            .iter()
            .find(|(_, m)| *m != IommuMode::NoIommu)
            .map(|(_, m)| m.describe())
            .unwrap_or_else(|| "no controller is bound to nvme or vfio-pci".into());
        Check::new(
            NAME,
            Status::Skip,
            format!("{list}: the queues path cannot drive them: {why}"),
        )
    }

    fn module_check(&self, loaded: bool, module: &Result<Module, Error>) -> Check {
        const NAME: &str = "kernel module";
        let sys = self.topology.sys_root().join("module/p2pdma");
        if loaded {
            return Check::new(
                NAME,
                Status::Ok,
                format!("p2pdma is loaded ({})", sys.display()),
            );
        }
        if module.is_ok() {
            return Check::new(
                NAME,
                Status::Ok,
                format!(
                    "p2pdma answers on {} (no {} to show it loaded)",
                    self.node.display(),
                    sys.display()
                ),
            );
        }
        Check::new(
            NAME,
            Status::Fail,
            format!(
                "the p2pdma kernel module is not loaded (no {}): load it with `modprobe p2pdma` or `insmod p2pdma.ko`",
                sys.display()
            ),
        )
    }

    fn node_check(&self, loaded: bool, module: &Result<Module, Error>) -> Check {
        const NAME: &str = "device node";
        let node = self.node.display();
        let e = match module {
            Ok(m) => {
                let v = m.version();
                return Check::new(
                    NAME,
                    Status::Ok,
                    format!(
                        "{node} is open: module ABI {} (serves >= {}), library ABI {}, {} device(s)",
                        v.abi_version,
                        v.abi_min_compat,
                        p2pdma_abi::P2PDMA_ABI_VERSION,
                        v.num_devices
                    ),
                );
            }
            Err(e) => e,
        };
        let detail = match (e, e.errno()) {
            (Error::AbiMismatch { .. }, _) => {
                format!("ABI mismatch: {e}; load the p2pdma module built with this library")
            }
            (_, Some(Errno::NOENT)) if loaded => format!(
                "{node} does not exist although the module is loaded: is devtmpfs mounted on /dev, or did udev remove the node?"
            ),
            (_, Some(Errno::NOENT)) => {
                format!("{node} does not exist: the p2pdma module is not loaded")
            }
            (_, Some(Errno::ACCESS | Errno::PERM)) => format!(
                "{node}: permission denied; add the user to the p2pdma group (`groupadd --system p2pdma`; udev/60-p2pdma.rules gives the node to that group, mode 0660) and log in again, or run as root"
            ),
            _ => e.to_string(),
        };
        Check::new(NAME, Status::Fail, detail)
    }

    fn accelerator(
        &self,
        module: Option<&Module>,
        select: AccelSelect,
    ) -> (Option<Accelerator>, Check) {
        const NAME: &str = "accelerator";
        let Some(module) = module else {
            let detail = match select {
                AccelSelect::Pci(p) => {
                    format!("needs the module's device node; {p} is used for the PCI checks below")
                }
                _ => "needs the module's device node".to_string(),
            };
            return (None, Check::new(NAME, Status::Skip, detail));
        };
        let found = match select {
            AccelSelect::Auto => module.accelerators().map(|v| v.into_iter().next()),
            AccelSelect::Index(i) => match module.accelerator(i) {
                Ok(a) => Ok(Some(a)),
                Err(e) if e.errno() == Some(Errno::NODEV) => Ok(None),
                Err(e) => Err(e),
            },
            AccelSelect::Pci(p) => module.find_accelerator(p),
        };
        match found {
            Ok(Some(a)) => {
                let how = match select {
                    AccelSelect::Auto => ", the first one bound",
                    _ => "",
                };
                let detail = format!(
                    "{} at {} [{:04x}:{:04x}]{how}, BAR {} of {}",
                    a.index,
                    a.pci,
                    a.vendor,
                    a.device,
                    a.bar,
                    bytes(a.bar_size)
                );
                (Some(a), Check::new(NAME, Status::Ok, detail))
            }
            Ok(None) => {
                let bound = module
                    .accelerators()
                    .map(|v| {
                        if v.is_empty() {
                            "none is bound".to_string()
                        } else {
                            let l: Vec<String> = v
                                .iter()
                                .map(|a| format!("{} ({})", a.index, a.pci))
                                .collect();
                            format!("bound: {}", l.join(", "))
                        }
                    })
                    .unwrap_or_else(|e| format!("listing them failed: {e}"));
                let detail = match select {
                    AccelSelect::Auto => "no accelerator is bound to the p2pdma module: give the module its vendor:device with ids=, or bind it through /sys/bus/pci/drivers/p2pdma/bind (see udev/61-p2pdma-bind.rules)".to_string(),
                    AccelSelect::Index(i) => format!("no accelerator at index {i} of the p2pdma module; {bound}"),
                    AccelSelect::Pci(p) => {
                        let driver = self
                            .topology
                            .pci_function(p)
                            .map(|f| match f.driver {
                                Some(d) => format!(" (it is bound to driver {d})"),
                                None => " (it is bound to no driver)".to_string(),
                            })
                            .unwrap_or_else(|_| " (no such PCI device)".to_string());
                        format!("{p} is not bound to the p2pdma module{driver}; {bound}")
                    }
                };
                (None, Check::new(NAME, Status::Fail, detail))
            }
            Err(e) => (None, Check::new(NAME, Status::Fail, e.to_string())),
        }
    }

    /// Asks the kernel whether the storage's controller (for a multipath
    /// namespace, each path's) can reach the accelerator's memory.
    #[allow(clippy::type_complexity)]
    fn p2p(
        &self,
        module: Option<&Module>,
        accel: Option<&Accelerator>,
        nvme: Option<&StorageTarget>,
    ) -> (Option<P2pQuery>, Vec<(NvmePath, Option<P2pQuery>)>, Check) {
        const NAME: &str = "p2p";
        let (Some(module), Some(accel), Some(t)) = (module, accel, nvme) else {
            return (
                None,
                Vec::new(),
                Check::new(
                    NAME,
                    Status::Skip,
                    "needs the module, an accelerator and NVMe storage",
                ),
            );
        };
        if t.is_multipath() {
            let paths = query_paths(module, accel.index, &t.multipath);
            let mut ok = true;
            let each: Vec<String> = paths
                .iter()
                .map(|(p, q)| match q {
                    Some(q) => {
                        ok &= allowed(q).is_ok();
                        let distance = q.distance.map_or("-".to_string(), |d| d.to_string());
                        format!(
                            "path {p}: kernel: {} ({}, distance {distance})",
                            q.reason, q.map_type
                        )
                    }
                    None => {
                        ok = false;
                        format!("path {p}: no answer from the kernel")
                    }
                })
                .collect();
            let status = if ok { Status::Ok } else { Status::Fail };
            let detail = format!(
                "{} is a multipath namespace with {} paths, all asked ({EVERY_PATH}): {}",
                t.disk,
                paths.len(),
                each.join("; ")
            );
            return (None, paths, Check::new(NAME, status, detail));
        }
        let answer = match t.pci {
            Some(pci) => module.p2p_query(accel.index, Peer::Pci(pci)),
            None => match open(&t.disk_path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
                Ok(fd) => module.p2p_query(accel.index, Peer::Fd(fd.as_fd())),
                Err(e) => {
                    return (
                        None,
                        Vec::new(),
                        Check::new(
                            NAME,
                            Status::Fail,
                            format!(
                                "{} has no PCI function in sysfs, and opening {} to ask through it failed: {e}",
                                t.disk,
                                t.disk_path.display()
                            ),
                        ),
                    )
                }
            },
        };
        match answer {
            Ok(q) => {
                let distance = q.distance.map_or("-".to_string(), |d| d.to_string());
                let status = match q.map_type {
                    MapType::BusAddr | MapType::ThruHostBridge => Status::Ok,
                    MapType::NotSupported | MapType::Unknown(_) => Status::Fail,
                };
                let detail = format!("kernel: {} ({}, distance {distance})", q.reason, q.map_type);
                (Some(q), Vec::new(), Check::new(NAME, status, detail))
            }
            Err(e) => (
                None,
                Vec::new(),
                Check::new(NAME, Status::Fail, e.to_string()),
            ),
        }
    }

    fn iommu_check(
        &self,
        accel: Option<&PciFunction>,
        storage: Option<&PciFunction>,
        p2p: Option<&P2pQuery>,
    ) -> Check {
        const NAME: &str = "iommu";
        let groups = match self.topology.iommu_groups() {
            Ok(g) => g,
            Err(e) => return Check::new(NAME, Status::Skip, e.to_string()),
        };
        if groups.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                "no IOMMU groups: the IOMMU is off or absent, and DMA addresses are not translated",
            );
        }
        let group = |f: Option<&PciFunction>, what: &str| -> Option<String> {
            let f = f?;
            Some(match f.iommu_group {
                Some(g) => {
                    let ty = self
                        .topology
                        .iommu_group_type(g)
                        .map_or(String::new(), |t| format!(", {t}"));
                    format!("{what} {} in group {g}{ty}", f.address)
                }
                None => format!("{what} {} in no group", f.address),
            })
        };
        let mut detail = format!("IOMMU on ({} groups)", groups.len());
        let parts: Vec<String> = [group(accel, "accelerator"), group(storage, "NVMe")]
            .into_iter()
            .flatten()
            .collect();
        if !parts.is_empty() {
            detail.push_str("; ");
            detail.push_str(&parts.join(", "));
        }
        let mut status = Status::Ok;
        if let (Some(a), Some(s)) = (accel, storage) {
            if a.iommu_group.is_some() && a.iommu_group == s.iommu_group {
                detail.push_str(": one group, so nothing isolates them from each other");
            }
            if common_upstream(a, s).is_none() {
                let allowed = p2p.is_some_and(|q| q.map_type == MapType::ThruHostBridge);
                if allowed {
                    detail.push_str(
                        "; they meet only at a host bridge, which the kernel allows for P2P",
                    );
                } else {
                    status = Status::Warn;
                    detail.push_str(
                        "; they meet only at a host bridge, so P2P needs that bridge on the kernel's allowlist (some Intel Xeon root complexes, AMD Zen and later), or the two under one PCIe switch",
                    );
                }
            }
        }
        Check::new(NAME, status, detail)
    }

    fn acs_check(&self, accel: Option<&PciFunction>, storage: Option<&PciFunction>) -> Check {
        const NAME: &str = "acs";
        let (Some(a), Some(s)) = (accel, storage) else {
            return Check::new(
                NAME,
                Status::Skip,
                "needs the PCI functions of both the accelerator and the NVMe controller",
            );
        };
        let common = common_upstream(a, s);
        let path = acs_path(a, s);
        let mut seen = Vec::new();
        let mut redirecting = Vec::new();
        for f in &path {
            let config = match self.topology.pci_config(*f) {
                Ok(c) => c,
                Err(e) => return Check::new(NAME, Status::Skip, e.to_string()),
            };
            match acs_control(&config) {
                Err(_) => {
                    return Check::new(
                        NAME,
                        Status::Skip,
                        format!(
                            "cannot read the extended config space of {f} ({} bytes readable): reading it needs root",
                            config.len()
                        ),
                    )
                }
                Ok(None) => seen.push(format!("{f} no ACS")),
                Ok(Some(ctrl)) => {
                    seen.push(format!("{f} ACS {}", acs_bits(ctrl)));
                    if ctrl & PCI_ACS_REDIRECT != 0 {
                        redirecting.push((*f, ctrl));
                    }
                }
            }
        }
        let list = seen.join(", ");
        if common.is_none() {
            return Check::new(
                NAME,
                Status::Ok,
                format!("the devices share no upstream bridge, so their P2P goes through a host bridge whatever ACS says ({list})"),
            );
        }
        if redirecting.is_empty() {
            return Check::new(
                NAME,
                Status::Ok,
                format!("no ACS redirect between them ({list})"),
            );
        }
        let names: Vec<String> = redirecting.iter().map(|(f, _)| f.to_string()).collect();
        let bits: Vec<String> = redirecting
            .iter()
            .map(|(f, c)| format!("{f} {}", acs_bits(c & PCI_ACS_REDIRECT)))
            .collect();
        Check::new(
            NAME,
            Status::Warn,
            format!(
                "ACS redirects P2P requests to the root complex ({}), so the kernel treats the path as through a host bridge; to turn it off, boot with pci=disable_acs_redir={}",
                bits.join(", "),
                names.join(";")
            ),
        )
    }
}

fn kernel_config_check(kconfig: &Result<KernelConfig, String>) -> Check {
    const NAME: &str = "kernel config";
    let c = match kconfig {
        Ok(c) => c,
        Err(why) => return Check::new(NAME, Status::Skip, format!("{why}; cannot tell")),
    };
    let opts = ["CONFIG_PCI_P2PDMA", "CONFIG_ZONE_DEVICE", "CONFIG_IO_URING"];
    let described: Vec<String> = opts.iter().map(|o| c.describe(o)).collect();
    let mut detail = format!("{} ({})", described.join(", "), c.source.display());
    let status = if !c.enabled("CONFIG_PCI_P2PDMA") || !c.enabled("CONFIG_ZONE_DEVICE") {
        detail.push_str(": this kernel cannot do P2P DMA (it needs CONFIG_PCI_P2PDMA=y, which needs CONFIG_ZONE_DEVICE)");
        Status::Fail
    } else if !c.enabled("CONFIG_IO_URING") {
        detail.push_str(": no io_uring, so no NVMe passthrough commands");
        Status::Warn
    } else {
        Status::Ok
    };
    Check::new(NAME, status, detail)
}

fn p2p_memory_check(accel: Option<&Accelerator>) -> Check {
    const NAME: &str = "p2p memory";
    let Some(a) = accel else {
        return Check::new(NAME, Status::Skip, "needs an accelerator");
    };
    let of = format!(
        "{} of {} free (BAR {}, {}, bus address {:#x})",
        bytes(a.p2p_available),
        bytes(a.p2p_size),
        a.bar,
        bytes(a.bar_size),
        a.bar_bus_addr
    );
    if a.p2p_size == 0 {
        Check::new(
            NAME,
            Status::Fail,
            format!("nothing of BAR {} is registered as P2P memory", a.bar),
        )
    } else if a.p2p_available == 0 {
        Check::new(
            NAME,
            Status::Warn,
            format!("{of}: all in use, so allocations fail until some are freed"),
        )
    } else if a.p2p_available < LOW_P2P_MEMORY {
        Check::new(
            NAME,
            Status::Warn,
            format!("{of}: little left for transfer buffers"),
        )
    } else {
        Check::new(NAME, Status::Ok, of)
    }
}

fn storage_check(
    given: Option<&FsPath>,
    target: &Option<Result<StorageTarget, crate::discovery::TopologyError>>,
) -> Check {
    const NAME: &str = "storage";
    let (Some(given), Some(target)) = (given, target) else {
        return Check::new(NAME, Status::Skip, "no storage path given");
    };
    let t = match target {
        Ok(t) => t,
        Err(e) => return Check::new(NAME, Status::Fail, e.to_string()),
    };
    let on = match (&t.kind, &t.partition) {
        (TargetKind::File { .. }, Some(p)) => {
            format!("lives on partition {} of disk {}", p.name, t.disk)
        }
        (TargetKind::File { .. }, None) => format!("lives on disk {}", t.disk),
        (TargetKind::BlockDevice, Some(p)) => format!("is partition {} of disk {}", p.name, t.disk),
        (TargetKind::BlockDevice, None) => format!("is disk {}", t.disk),
        (TargetKind::NvmeGeneric, _) => format!("is the generic device of disk {}", t.disk),
    };
    if !t.is_nvme {
        let under = if t.slaves.is_empty() {
            String::new()
        } else {
            format!(" (built on {})", t.slaves.join(", "))
        };
        return Check::new(
            NAME,
            Status::Fail,
            format!(
                "{} {on}{under}, not an NVMe namespace: P2P DMA needs NVMe",
                given.display()
            ),
        );
    }
    let mut detail = format!("{} {on}", given.display());
    if let Some(nsid) = t.nsid {
        detail.push_str(&format!(", namespace {nsid}"));
    }
    let pci = if t.is_multipath() {
        let paths: Vec<String> = t.multipath.iter().map(|p| p.to_string()).collect();
        detail.push_str(&format!(
            ", a multipath namespace with {} paths: {}",
            paths.len(),
            paths.join(", ")
        ));
        let all = t.multipath.iter().all(|p| p.pci.is_some());
        if !all {
            detail.push_str("; a path without a PCI function (NVMe over fabrics?)");
        }
        all
    } else {
        if let Some(c) = &t.controller {
            detail.push_str(&format!(" of {c}"));
        }
        match t.pci {
            Some(p) => detail.push_str(&format!(" at {p}")),
            None => detail.push_str(", with no PCI function in sysfs (NVMe over fabrics?)"),
        }
        t.pci.is_some()
    };
    detail.push_str(&format!(
        "; {}-byte blocks, at most {} a command",
        t.logical_block_size,
        bytes(t.max_transfer_bytes)
    ));
    if let Some(p) = &t.partition {
        detail.push_str(&format!("; the partition starts at byte {}", p.start));
    }
    let status = if pci { Status::Ok } else { Status::Warn };
    Check::new(NAME, status, detail)
}

/// Whether NVMe commands through the generic device would work: the device
/// exists and can be opened, and the kernel has io_uring.
fn nvme_passthrough_check(
    target: Option<&StorageTarget>,
    io_uring: Option<bool>,
) -> (Option<PathBuf>, Check) {
    const NAME: &str = "nvme passthrough";
    let Some(t) = target.filter(|t| t.is_nvme) else {
        return (None, Check::new(NAME, Status::Skip, "needs NVMe storage"));
    };
    let Some(ng) = &t.generic_path else {
        return (
            None,
            Check::new(
                NAME,
                Status::Skip,
                format!(
                    "no NVMe generic character device for {} (kernels before 5.13 have none)",
                    t.disk
                ),
            ),
        );
    };
    if let Some(why) = t.nvme_cmd_refusal() {
        return (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!("NVMe commands through {} refused: {why}", ng.display()),
            ),
        );
    }
    match open(ng, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(_) if io_uring == Some(false) => (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!(
                    "{} opens, but the kernel has no io_uring, which NVMe passthrough needs",
                    ng.display()
                ),
            ),
        ),
        Ok(_) => {
            // For a file, the filesystem must be one whose extents NVMe
            // commands can address (the engine's own rule).
            let file = match t.kind {
                TargetKind::File { .. } => match std::fs::File::open(&t.path) {
                    Ok(f) => crate::transfer::extents::Filesystem::of(f.as_fd()).map(|fs| {
                        format!("; for a file ({fs}), reads only (writes to files go by P2P or the bounce path): its extents are mapped to blocks with FIEMAP first")
                    }),
                    Err(_) => Ok("; for a file, reads only: its extents are mapped to blocks first".into()),
                },
                _ => Ok(String::new()),
            };
            match file {
                Ok(file) => (
                    Some(ng.clone()),
                    Check::new(
                        NAME,
                        Status::Ok,
                        format!(
                            "{} opens: NVMe commands through io_uring passthrough are possible, used only when asked for{file}",
                            ng.display()
                        ),
                    ),
                ),
                Err(why) => (
                    None,
                    Check::new(
                        NAME,
                        Status::Warn,
                        format!(
                            "{} opens, but NVMe commands cannot address {}: {why}",
                            ng.display(),
                            t.path.display()
                        ),
                    ),
                ),
            }
        }
        Err(e @ (Errno::ACCESS | Errno::PERM)) => (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!(
                    "{} exists but cannot be opened ({e}): NVMe passthrough needs read access to it (root, or a udev rule for the nvme-generic class)",
                    ng.display()
                ),
            ),
        ),
        Err(e) => (
            None,
            Check::new(
                NAME,
                Status::Warn,
                format!("cannot open {}: {e}", ng.display()),
            ),
        ),
    }
}

/// A byte count in the largest binary unit that keeps it readable.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut v = n;
    while unit + 1 < UNITS.len() && v >= 1024 && v % 1024 == 0 {
        v /= 1024;
        unit += 1;
    }
    if unit + 1 < UNITS.len() && v >= 1024 {
        let mut f = v as f64;
        while unit + 1 < UNITS.len() && f >= 1024.0 {
            f /= 1024.0;
            unit += 1;
        }
        return format!("{f:.1} {}", UNITS[unit]);
    }
    format!("{v} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use std::{fs, io::Write, os::unix::fs::MetadataExt};

    use flate2::{write::GzEncoder, Compression};

    use super::*;
    use crate::discovery::{
        fake::{config_space, FakeSys, ACCEL, DSP0, DSP1, NS, NVME, USP},
        pci::{PCI_ACS_RR, PCI_ACS_SV},
        DevNum,
    };

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
        assert_eq!(c.path, Path::P2p);
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
        assert_eq!(c.path, Path::P2p);
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
            assert_eq!(c.path, Path::Bounce, "{f:?}");
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
        assert_eq!(c.path, Path::Bounce);
        assert_eq!(c.reason, format!("P2P not possible: {why}{TAIL}"));
        let q = query(MapType::NotSupported, None, "");
        assert_eq!(
            choose_path(&facts(Some(&q))).reason,
            format!("P2P not possible: the kernel answers not-supported{TAIL}")
        );
        let q = query(MapType::Unknown(9), Some(1), "");
        let c = choose_path(&facts(Some(&q)));
        assert_eq!(c.path, Path::Bounce);
        assert!(
            c.reason.contains("the kernel answers unknown(9)"),
            "{}",
            c.reason
        );
        assert_eq!(choose_path(&PathFacts::default()).path, Path::Bounce);
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
        assert_eq!(c.path, Path::P2p);
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
        assert_eq!(c.path, Path::Bounce);
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

    #[test]
    fn kernel_configs_parse() {
        let c = KernelConfig::parse(
            "/x",
            "#\n# comment\nCONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\n# CONFIG_IO_URING is not set\nCONFIG_FOO=m\nCONFIG_NAME=\"a=b\"\nNOT_CONFIG=y\n",
        );
        assert!(c.enabled("CONFIG_PCI_P2PDMA"));
        assert!(c.enabled("CONFIG_FOO"));
        assert!(!c.enabled("CONFIG_IO_URING"));
        assert_eq!(c.get("CONFIG_IO_URING"), None);
        assert_eq!(c.get("CONFIG_NAME"), Some("a=b"));
        assert_eq!(c.get("NOT_CONFIG"), None);
        assert_eq!(c.describe("CONFIG_IO_URING"), "CONFIG_IO_URING is not set");
        assert_eq!(c.describe("CONFIG_FOO"), "CONFIG_FOO=m");
    }

    fn doctor(f: &FakeSys) -> Doctor {
        Doctor::new()
            .topology(f.topology())
            .node(f.root().join("dev/p2pdma"))
            .boot_root(f.root().join("boot"))
    }

    #[test]
    fn kernel_config_comes_from_proc_config_gz_then_boot() {
        let f = FakeSys::empty();
        f.root_file("proc/sys/kernel/osrelease", "7.3.0-test\n");
        let d = doctor(&f);
        let e = d.kernel_config().unwrap_err();
        assert!(
            e.contains("config.gz") && e.contains("config-7.3.0-test"),
            "{e}"
        );
        let check = kernel_config_check(&d.kernel_config());
        assert_eq!(check.status, Status::Skip);

        f.root_file(
            "boot/config-7.3.0-test",
            "CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\n# CONFIG_IO_URING is not set\n",
        );
        let c = d.kernel_config().unwrap();
        assert_eq!(c.source, f.root().join("boot/config-7.3.0-test"));
        let check = kernel_config_check(&Ok(c));
        assert_eq!(check.status, Status::Warn);
        assert!(
            check.detail.starts_with(
                "CONFIG_PCI_P2PDMA=y, CONFIG_ZONE_DEVICE=y, CONFIG_IO_URING is not set ("
            ),
            "{}",
            check.detail
        );

        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(b"CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\nCONFIG_IO_URING=y\n")
            .unwrap();
        fs::write(f.root().join("proc/config.gz"), gz.finish().unwrap()).unwrap();
        let c = d.kernel_config().unwrap();
        assert_eq!(c.source, f.root().join("proc/config.gz"));
        assert_eq!(kernel_config_check(&Ok(c)).status, Status::Ok);

        fs::write(f.root().join("proc/config.gz"), b"not gzip").unwrap();
        let e = d.kernel_config().unwrap_err();
        assert!(
            e.starts_with("cannot read") && e.contains("config.gz"),
            "{e}"
        );

        let c = KernelConfig::parse("/k", "CONFIG_ZONE_DEVICE=y\n");
        let check = kernel_config_check(&Ok(c));
        assert_eq!(check.status, Status::Fail);
        assert!(
            check.detail.contains("CONFIG_PCI_P2PDMA is not set"),
            "{}",
            check.detail
        );
    }

    /// The fake machine with a real file whose filesystem is partition
    /// `nvme0n1p1`, or `sda1` when `nvme` is false.
    fn machine_with_file(nvme: bool) -> (FakeSys, std::path::PathBuf) {
        let f = FakeSys::machine();
        let file = f.root().join("data.bin");
        fs::write(&file, b"x").unwrap();
        let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
        let target = if nvme {
            format!("{NS}/nvme0n1p1")
        } else {
            format!(
                "{}/ata1/host0/target0:0:0/0:0:0:0/block/sda/sda1",
                crate::discovery::fake::SATA
            )
        };
        f.link(&format!("dev/block/{dev}"), &target);
        (f, file)
    }

    #[test]
    fn the_queues_check_says_which_controller_the_library_can_drive_and_why_not() {
        let f = FakeSys::machine();
        let nvme = crate::discovery::fake::NVME.rsplit('/').next().unwrap();
        let queues = |f: &FakeSys| {
            doctor(f)
                .run(None, AccelSelect::Auto)
                .check("nvme queues")
                .cloned()
                .unwrap()
        };
        // IOMMU groups and an IOMMU: translated, refused with the reason.
        f.dir("class/iommu/dmar0");
        let c = queues(&f);
        assert_eq!(c.status, Status::Skip, "{}", c.detail);
        assert!(
            c.detail
                .contains(&format!("{nvme} (nvme, behind an IOMMU (group 2))")),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("FOLL_PCI_P2PDMA"), "{}", c.detail);
        // No IOMMU, no-IOMMU mode off: how to turn it on.
        fs::remove_dir_all(f.root().join("sys/class/iommu")).unwrap();
        let c = queues(&f);
        assert_eq!(c.status, Status::Skip, "{}", c.detail);
        assert!(
            c.detail.contains("enable_unsafe_noiommu_mode=1"),
            "{}",
            c.detail
        );
        // No-IOMMU mode on: the nvme driver's controller can be taken when
        // asked, one bound to vfio-pci can be driven now.
        f.file("module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
        let c = queues(&f);
        assert_eq!(c.status, Status::Ok, "{}", c.detail);
        assert!(c.detail.contains("InitOptions::unbind"), "{}", c.detail);
        f.link(
            &format!("{}/driver", crate::discovery::fake::NVME),
            "bus/pci/drivers/vfio-pci",
        );
        let c = queues(&f);
        assert_eq!(c.status, Status::Ok, "{}", c.detail);
        assert!(
            c.detail.contains(&format!("can drive {nvme} itself")),
            "{}",
            c.detail
        );
        // No NVMe controller at all.
        let c = queues(&FakeSys::empty());
        assert_eq!(
            (c.status, c.detail.as_str()),
            (Status::Skip, "no NVMe controller")
        );
    }

    #[test]
    fn without_the_module_the_doctor_still_examines_storage_and_pci() {
        let (f, file) = machine_with_file(true);
        let accel: PciAddress = "0000:04:00.0".parse().unwrap();
        let r = doctor(&f).run(Some(&file), AccelSelect::Pci(accel));
        let names: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "kernel config",
                "kernel module",
                "device node",
                "accelerator",
                "p2p memory",
                "storage",
                "p2p",
                "iommu",
                "acs",
                "nvme passthrough",
                "nvme queues"
            ]
        );
        let get = |n: &str| r.check(n).unwrap().clone();
        assert_eq!(get("kernel config").status, Status::Skip);
        let m = get("kernel module");
        assert_eq!(m.status, Status::Fail);
        assert!(m.detail.contains("not loaded"), "{}", m.detail);
        let n = get("device node");
        assert_eq!(n.status, Status::Fail);
        assert!(
            n.detail
                .ends_with("does not exist: the p2pdma module is not loaded"),
            "{}",
            n.detail
        );
        let a = get("accelerator");
        assert_eq!(a.status, Status::Skip);
        assert!(
            a.detail.contains("0000:04:00.0 is used for the PCI checks"),
            "{}",
            a.detail
        );
        assert_eq!(get("p2p memory").status, Status::Skip);
        let s = get("storage");
        assert_eq!(s.status, Status::Ok, "{}", s.detail);
        assert!(
            s.detail.contains("lives on partition nvme0n1p1 of disk nvme0n1, namespace 1 of nvme0 at 0000:03:00.0; 512-byte blocks, at most 128 KiB a command; the partition starts at byte 1048576"),
            "{}",
            s.detail
        );
        assert_eq!(get("p2p").status, Status::Skip);
        let i = get("iommu");
        assert_eq!(i.status, Status::Ok, "{}", i.detail);
        assert_eq!(
            i.detail,
            "IOMMU on (6 groups); accelerator 0000:04:00.0 in group 2, DMA, NVMe 0000:03:00.0 in group 2, DMA: one group, so nothing isolates them from each other"
        );
        // No config space in the fake tree.
        assert_eq!(get("acs").status, Status::Skip);
        // The generic device node does not exist.
        let p = get("nvme passthrough");
        assert_eq!(p.status, Status::Warn);
        assert!(p.detail.starts_with("cannot open"), "{}", p.detail);
        assert_eq!(r.nvme_cmd, None);

        assert_eq!(r.path.path, Path::Bounce);
        assert!(
            r.path.reason.contains("kernel module is not available"),
            "{}",
            r.path.reason
        );
        assert!(r.storage.as_ref().is_some_and(|t| t.is_nvme));
        assert!(r.accelerator.is_none() && r.p2p.is_none());
    }

    #[test]
    fn a_namespace_with_metadata_is_reported_unfit_for_nvme_commands() {
        let (f, file) = machine_with_file(true);
        f.file(&format!("{NS}/metadata_bytes"), "8\n");
        f.root_file("dev/ng0n1", "");
        let accel: PciAddress = "0000:04:00.0".parse().unwrap();
        let r = doctor(&f).run(Some(&file), AccelSelect::Pci(accel));
        let p = r.check("nvme passthrough").unwrap();
        assert_eq!(p.status, Status::Warn);
        assert_eq!(
            p.detail,
            format!(
                "NVMe commands through {} refused: nvme0n1 is formatted with 8 bytes of metadata per block: \
                 the library's NVMe commands carry no metadata buffer (P2P and bounce I/O go through the block layer, which handles the metadata)",
                f.root().join("dev/ng0n1").display()
            )
        );
        assert_eq!(r.nvme_cmd, None);
        // Storage and the P2P decision are not affected.
        assert_eq!(r.check("storage").unwrap().status, Status::Ok);
        assert_eq!(r.to_json()["storage"]["metadata_bytes"], 8);
    }

    #[test]
    fn a_multipath_namespace_is_reported_with_every_path() {
        let f = FakeSys::machine();
        let head = "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1";
        f.disk(head, "nvme1n1", "259:30", 512, 128, Some(3));
        let nvme2 = format!("{ACCEL}/nvme/nvme2/nvme1c2n1");
        for (name, dir) in [
            ("nvme1c1n1", format!("{NVME}/nvme/nvme1/nvme1c1n1")),
            ("nvme1c2n1", nvme2),
        ] {
            f.dir(&dir);
            f.link(&format!("{head}/multipath/{name}"), &dir);
        }
        let file = f.root().join("mp.bin");
        fs::write(&file, b"x").unwrap();
        let dev = DevNum::from_raw(fs::metadata(&file).unwrap().dev());
        f.link(&format!("dev/block/{dev}"), head);
        let accel: PciAddress = "0000:04:00.0".parse().unwrap();
        let r = doctor(&f).run(Some(&file), AccelSelect::Pci(accel));
        let s = r.check("storage").unwrap();
        assert_eq!(s.status, Status::Ok, "{}", s.detail);
        assert!(
            s.detail.contains("lives on disk nvme1n1, namespace 3, a multipath namespace with 2 paths: \
                 nvme1c1n1 (nvme1 at 0000:03:00.0), nvme1c2n1 (nvme2 at 0000:04:00.0); 512-byte blocks"),
            "{}",
            s.detail
        );
        let t = r.storage.as_ref().unwrap();
        assert_eq!(t.multipath.len(), 2);
        assert_eq!(
            r.to_json()["storage"]["multipath"][1]["controller"],
            "nvme2"
        );
    }

    #[test]
    fn acs_redirect_on_the_path_is_reported_with_the_boot_parameter() {
        let (f, file) = machine_with_file(true);
        for dev in [ACCEL, USP, DSP0, NVME] {
            f.bytes(&format!("{dev}/config"), &config_space(None));
        }
        f.bytes(
            &format!("{DSP1}/config"),
            &config_space(Some(PCI_ACS_SV | PCI_ACS_RR)),
        );
        let accel = AccelSelect::Pci("0000:04:00.0".parse().unwrap());
        let r = doctor(&f).run(Some(&file), accel);
        let acs = r.check("acs").unwrap();
        assert_eq!(acs.status, Status::Warn);
        assert!(acs.detail.contains("(0000:02:01.0 RR)"), "{}", acs.detail);
        assert!(
            acs.detail.ends_with("pci=disable_acs_redir=0000:02:01.0"),
            "{}",
            acs.detail
        );

        f.bytes(&format!("{DSP1}/config"), &config_space(Some(PCI_ACS_SV)));
        let r = doctor(&f).run(Some(&file), accel);
        let acs = r.check("acs").unwrap();
        assert_eq!(acs.status, Status::Ok);
        assert_eq!(
            acs.detail,
            "no ACS redirect between them (0000:04:00.0 no ACS, 0000:02:01.0 ACS SV, 0000:01:00.0 no ACS, 0000:03:00.0 no ACS, 0000:02:00.0 no ACS)"
        );

        // Unprivileged readers get the first 64 bytes only.
        f.bytes(&format!("{USP}/config"), &config_space(None)[..64]);
        let r = doctor(&f).run(Some(&file), accel);
        let acs = r.check("acs").unwrap();
        assert_eq!(acs.status, Status::Skip);
        assert!(
            acs.detail
                .contains("0000:01:00.0 (64 bytes readable): reading it needs root"),
            "{}",
            acs.detail
        );
    }

    #[test]
    fn devices_that_meet_only_at_a_host_bridge_get_the_allowlist_warning() {
        let (f, file) = machine_with_file(true);
        let accel = AccelSelect::Pci("0000:06:00.0".parse().unwrap());
        let r = doctor(&f).run(Some(&file), accel);
        let i = r.check("iommu").unwrap();
        assert_eq!(i.status, Status::Warn);
        assert!(
            i.detail.contains("group 5") && i.detail.contains("allowlist"),
            "{}",
            i.detail
        );
        for dev in [
            "devices/pci0000:00/0000:00:03.0/0000:06:00.0",
            "devices/pci0000:00/0000:00:03.0",
        ] {
            f.bytes(&format!("{dev}/config"), &config_space(Some(PCI_ACS_RR)));
        }
        let r = doctor(&f).run(Some(&file), accel);
        let acs = r.check("acs").unwrap();
        assert_eq!(acs.status, Status::Ok);
        assert!(
            acs.detail
                .starts_with("the devices share no upstream bridge"),
            "{}",
            acs.detail
        );

        // Without IOMMU groups there is nothing to warn about.
        fs::remove_dir_all(f.sys().join("kernel/iommu_groups")).unwrap();
        let r = doctor(&f).run(Some(&file), accel);
        let i = r.check("iommu").unwrap();
        assert_eq!(i.status, Status::Ok);
        assert!(i.detail.starts_with("no IOMMU groups"), "{}", i.detail);
    }

    #[test]
    fn a_loaded_module_without_its_node_and_a_usable_generic_device_are_told_apart() {
        let (f, file) = machine_with_file(true);
        f.dir("module/p2pdma");
        f.root_file("dev/ng0n1", "");
        f.root_file(
            "boot/config-7.3.0-test",
            "CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\nCONFIG_IO_URING=y\n",
        );
        let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
        assert_eq!(r.check("kernel config").unwrap().status, Status::Ok);
        assert_eq!(r.check("kernel module").unwrap().status, Status::Ok);
        let n = r.check("device node").unwrap();
        assert_eq!(n.status, Status::Fail);
        assert!(
            n.detail
                .contains("does not exist although the module is loaded"),
            "{}",
            n.detail
        );
        assert_eq!(
            r.check("accelerator").unwrap().detail,
            "needs the module's device node"
        );
        let p = r.check("nvme passthrough").unwrap();
        // The file is real, on whatever filesystem holds the temporary
        // directory: NVMe commands can address it only on ext4 or XFS.
        let fd = fs::File::open(&file).unwrap();
        match crate::transfer::extents::Filesystem::of(fd.as_fd()) {
            Ok(kind) => {
                assert_eq!(p.status, Status::Ok, "{}", p.detail);
                assert!(
                    p.detail.ends_with(&format!(
                        "for a file ({kind}), reads only (writes to files go by P2P or the bounce path): its extents are mapped to blocks with FIEMAP first"
                    )),
                    "{}",
                    p.detail
                );
                assert_eq!(r.nvme_cmd, Some(f.root().join("dev/ng0n1")));
            }
            Err(why) => {
                assert_eq!(p.status, Status::Warn, "{}", p.detail);
                assert!(p.detail.ends_with(&why), "{}", p.detail);
                assert_eq!(r.nvme_cmd, None);
            }
        }
        // The doctor never picks the NVMe command path itself.
        assert_eq!(r.path.path, Path::Bounce);

        // Without io_uring the generic device is of no use.
        f.root_file(
            "boot/config-7.3.0-test",
            "CONFIG_PCI_P2PDMA=y\nCONFIG_ZONE_DEVICE=y\n",
        );
        let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
        assert_eq!(r.check("nvme passthrough").unwrap().status, Status::Warn);
        assert_eq!(r.nvme_cmd, None);
    }

    #[test]
    fn a_node_that_is_not_the_module_is_a_failed_version_ioctl() {
        let (f, file) = machine_with_file(true);
        f.root_file("dev/p2pdma", "");
        let r = doctor(&f).run(Some(&file), AccelSelect::Index(0));
        let n = r.check("device node").unwrap();
        assert_eq!(n.status, Status::Fail);
        assert!(
            n.detail.starts_with("P2PDMA_IOC_GET_VERSION failed"),
            "{}",
            n.detail
        );
        // It answered an open, so the module check does not claim it is
        // missing... but it did not answer as the module either.
        assert_eq!(r.check("kernel module").unwrap().status, Status::Fail);
    }

    #[test]
    fn node_errors_say_what_to_do() {
        let f = FakeSys::empty();
        let d = doctor(&f);
        let denied = Err(Error::Open {
            path: "/dev/p2pdma".into(),
            source: Errno::ACCESS,
        });
        let c = d.node_check(true, &denied);
        assert!(
            c.detail.contains("permission denied") && c.detail.contains("p2pdma group"),
            "{}",
            c.detail
        );
        let abi = Err(Error::AbiMismatch {
            module: 9,
            library: 1,
            library_min: 1,
        });
        let c = d.node_check(true, &abi);
        assert!(
            c.detail
                .starts_with("ABI mismatch: kernel module ABI version 9"),
            "{}",
            c.detail
        );
        assert_eq!(c.status, Status::Fail);
    }

    #[test]
    fn non_nvme_storage_fails_the_storage_check() {
        let (f, file) = machine_with_file(false);
        let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
        let s = r.check("storage").unwrap();
        assert_eq!(s.status, Status::Fail);
        assert!(
            s.detail.ends_with(
                "lives on partition sda1 of disk sda, not an NVMe namespace: P2P DMA needs NVMe"
            ),
            "{}",
            s.detail
        );
        assert_eq!(r.check("nvme passthrough").unwrap().status, Status::Skip);
        let r = doctor(&f).run(None, AccelSelect::Auto);
        assert_eq!(r.check("storage").unwrap().detail, "no storage path given");
        let r = doctor(&f).run(Some(&f.root().join("missing")), AccelSelect::Auto);
        let s = r.check("storage").unwrap();
        assert_eq!(s.status, Status::Fail);
        assert!(s.detail.starts_with("cannot stat"), "{}", s.detail);
    }

    #[test]
    fn p2p_memory_is_judged_by_what_is_free() {
        let a = Accelerator {
            index: 0,
            pci: "0000:04:00.0".parse().unwrap(),
            vendor: 0x1af4,
            device: 0x1110,
            bar: 2,
            bar_size: 64 << 20,
            bar_bus_addr: 0xfe00_0000,
            p2p_size: 64 << 20,
            p2p_available: 60 << 20,
            numa_node: None,
        };
        let c = p2p_memory_check(Some(&a));
        assert_eq!(c.status, Status::Ok);
        assert_eq!(
            c.detail,
            "60 MiB of 64 MiB free (BAR 2, 64 MiB, bus address 0xfe000000)"
        );
        let low = Accelerator {
            p2p_available: 1 << 20,
            ..a.clone()
        };
        assert_eq!(p2p_memory_check(Some(&low)).status, Status::Warn);
        let none = Accelerator {
            p2p_available: 0,
            ..a.clone()
        };
        assert!(p2p_memory_check(Some(&none)).detail.contains("all in use"));
        let unregistered = Accelerator {
            p2p_size: 0,
            p2p_available: 0,
            ..a
        };
        assert_eq!(p2p_memory_check(Some(&unregistered)).status, Status::Fail);
        assert_eq!(p2p_memory_check(None).status, Status::Skip);
    }

    #[test]
    fn the_text_report_is_an_aligned_table() {
        let (f, file) = machine_with_file(true);
        let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
        let text = r.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("CHECK             STATUS  DETAIL"),
            "{text}"
        );
        let col = lines[0].find("DETAIL").unwrap();
        for c in &r.checks {
            let row = lines
                .iter()
                .find(|l| l.starts_with(&format!("{:w$}  ", c.name, w = col - 10)))
                .unwrap();
            assert_eq!(row.find(&c.status.to_string()), Some(col - 8), "{row}");
            let first = wrap(&c.detail, TEXT_WIDTH - col)[0].clone();
            assert_eq!(&row[col..], first, "{row}");
        }
        for l in &lines {
            assert!(
                l.chars().count() <= TEXT_WIDTH || !l.contains(' '),
                "too long: {l}"
            );
        }
        // Continuation lines start under the details.
        assert!(
            lines
                .iter()
                .any(|l| l.len() > col && l[..col].trim().is_empty()),
            "{text}"
        );
        assert!(
            text.contains("\npath: bounce\n      P2P not possible:"),
            "{text}"
        );
        assert!(text.contains("nvme commands: not possible"), "{text}");
    }

    #[test]
    fn the_json_report_has_the_path_and_every_check() {
        let (f, file) = machine_with_file(true);
        let r = doctor(&f).run(Some(&file), AccelSelect::Auto);
        let j = r.to_json();
        assert_eq!(j["path"], "bounce");
        assert_eq!(j["reason"], r.path.reason);
        assert_eq!(j["checks"].as_array().unwrap().len(), r.checks.len());
        assert_eq!(j["checks"][1]["name"], "kernel module");
        assert_eq!(j["checks"][1]["status"], "fail");
        assert_eq!(j["storage"]["disk"], "nvme0n1");
        assert_eq!(j["nvme_cmd"]["possible"], false);
        assert!(j["accelerator"].is_null() && j["p2p"].is_null());
        let compact = j.to_string();
        assert!(compact.contains("\"path\":\"bounce\""), "{compact}");
    }

    #[test]
    fn text_wraps_at_spaces_and_sizes_read_well() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("", 6), [""]);
        assert_eq!(wrap("abcdefghij k", 4), ["abcdefghij", "k"]);
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(64 << 20), "64 MiB");
        assert_eq!(bytes(1536 << 20), "1.5 GiB");
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(bytes(u64::MAX), "16777216.0 TiB");
    }

    #[test]
    fn the_doctor_on_this_host_reports_bounce_without_the_module() {
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let r = Doctor::new().run(Some(&manifest), AccelSelect::Auto);
        let _ = r.to_string();
        let _ = r.to_json();
        assert_eq!(r.checks.len(), 11);
        if !std::path::Path::new(DEVICE_NODE).exists() {
            assert_eq!(r.path.path, Path::Bounce);
            assert!(r.path.reason.contains("module"), "{}", r.path.reason);
            assert_eq!(r.check("device node").unwrap().status, Status::Fail);
        }
        // Odd arguments are checks, not panics.
        for p in ["/", "/dev/null", "/proc/self/status", "/nonexistent"] {
            let r = Doctor::new().run(Some(std::path::Path::new(p)), AccelSelect::Index(u32::MAX));
            assert_eq!(r.path.path, Path::Bounce);
        }
    }
}
