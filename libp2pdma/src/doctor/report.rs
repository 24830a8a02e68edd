//! The doctor's report: a check per fact and the path chosen, as text
//! (an aligned table) or JSON.

use std::{fmt, path::PathBuf};

use serde_json::json;

use crate::{
    discovery::{Accelerator, NvmePath, StorageTarget},
    memory::peer::P2pQuery,
    transfer::plan::PathChoice,
};

/// Width the text report wraps its details to.
pub(super) const TEXT_WIDTH: usize = 100;

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
    pub(super) fn new(name: &'static str, status: Status, detail: impl Into<String>) -> Self {
        Self {
            name,
            status,
            detail: detail.into(),
        }
    }
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
            "accelerator": self.accelerator.as_ref().map(Accelerator::to_json),
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
pub(super) fn wrap(text: &str, width: usize) -> Vec<String> {
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

/// A byte count in the largest binary unit that keeps it readable.
pub(super) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut v = n;
    while unit + 1 < UNITS.len() && v >= 1024 && v.is_multiple_of(1024) {
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
