//! `p2pdma-ctl calibrate`: measures the strided cost model's constants for
//! a storage target and a memory, stores them in the cache (replacing what
//! was there), and says what strided transfers will use: the
//! configuration's values over the stored ones over the defaults.

use std::{path::PathBuf, sync::Arc};

use p2pdma::{
    memory::{DeviceMemory, HostMemory, ModuleMemory},
    transfer::{
        constants::{Partial, Resolved, Source, Store},
        Config, Engine, StorageFile,
    },
    Module,
};
use serde_json::json;

type Res<T> = Result<T, String>;

/// `calibrate` arguments.
#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    /// The storage: a file or block device (e.g. /dev/nvme0n1). Without
    /// it, only the constants of strided copies between host memory and
    /// the memory (copy and pack).
    pub target: Option<PathBuf>,
    /// Accelerator N's memory (from the p2pdma module) instead of the
    /// host-memory device.
    #[arg(long)]
    pub dev: Option<u32>,
    /// Path: auto, p2p, nvme-cmd or bounce (default: configuration);
    /// constants are kept per path.
    #[arg(long)]
    pub path: Option<String>,
    /// Print what is stored and what is in use; measure nothing.
    #[arg(long)]
    pub show: bool,
    /// Remove what is stored, so that the next strided transfer measures
    /// again.
    #[arg(long, conflicts_with = "show")]
    pub forget: bool,
}

/// The constants in the order of [`Partial`]'s fields, with their names
/// and units.
fn rows(p: &Partial) -> [(&'static str, Option<String>); 6] {
    let us = |v: Option<f64>| v.map(|v| format!("{:.3} µs", v * 1e6));
    let gib = |v: Option<f64>| v.map(|v| format!("{:.2} GiB/s", v / (1u64 << 30) as f64));
    [
        ("call (k)", us(p.call_s)),
        ("call MiB (k1)", us(p.call_mib_s)),
        ("storage (s)", gib(p.storage_bps)),
        ("copy (c)", gib(p.copy_bps)),
        ("pack (p)", gib(p.pack_bps)),
        ("copy call", us(p.copy_call_s)),
    ]
}

fn partial_json(p: &Partial) -> serde_json::Value {
    json!({
        "call_s": p.call_s,
        "storage_bps": p.storage_bps,
        "copy_bps": p.copy_bps,
        "pack_bps": p.pack_bps,
        "copy_call_s": p.copy_call_s,
        "call_mib_s": p.call_mib_s,
    })
}

/// Runs `calibrate`.
pub fn run(a: &CalibrateArgs, json_out: bool) -> Res<()> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(p) = &a.path {
        cfg.set("path", p).map_err(|e| e.to_string())?;
    }
    let (mem, module): (Box<dyn DeviceMemory>, Option<Arc<Module>>) = match a.dev {
        None => (
            Box::new(HostMemory::new(1 << 20).map_err(|e| e.to_string())?),
            None,
        ),
        Some(n) => {
            let module = Arc::new(Module::open().map_err(|e| e.to_string())?);
            let mem = ModuleMemory::alloc(module.clone(), n, 1 << 20, 0)
                .map_err(|e| format!("accelerator {n}: {e}"))?;
            (Box::new(mem), Some(module))
        }
    };
    let file = match &a.target {
        Some(t) => Some(StorageFile::open(t).map_err(|e| e.to_string())?),
        None => None,
    };
    let engine = Engine::new(cfg, module);
    let key = engine
        .strided()
        .key(file.as_ref(), mem.as_ref())
        .map_err(|e| e.to_string())?;
    let store = engine.config().cache_dir.as_ref().map(Store::in_dir);
    if a.forget {
        let Some(store) = &store else {
            return Err("no cache directory (cache_dir is off): nothing is stored".into());
        };
        let gone = store
            .forget(&key)
            .map_err(|e| format!("{}: {e}", store.path().display()))?;
        let said = if gone {
            "removed"
        } else {
            "nothing was stored"
        };
        if json_out {
            println!("{}", json!({"key": key.to_string(), "forgotten": gone}));
        } else {
            println!("calibrate {key}: {said} ({})", store.path().display());
        }
        return Ok(());
    }
    let (measured, failures, written) = if a.show {
        (None, Vec::new(), None)
    } else {
        let (_, m, written) = engine
            .strided()
            .calibrate(file.as_ref(), mem.as_ref())
            .map_err(|e| e.to_string())?;
        (Some(m.values), m.failures, written)
    };
    let stored = store.as_ref().map(|s| s.lookup(&key)).unwrap_or_default();
    let in_use = Resolved::from_layers(&[
        (
            Source::Config,
            Partial::from_config(&engine.config().strided),
        ),
        (Source::Stored, stored),
    ]);
    if json_out {
        println!(
            "{}",
            json!({
                "key": key.to_string(),
                "measured": measured.as_ref().map(partial_json),
                "failures": failures,
                "stored": partial_json(&stored),
                "store": store.as_ref().map(|s| s.path().display().to_string()),
                "written": written.is_some(),
                "in_use": in_use.describe(),
            })
        );
    } else {
        println!("calibrate {key}:");
        let shown = measured.unwrap_or(stored);
        for (name, v) in rows(&shown) {
            println!("  {name:14} {}", v.unwrap_or_else(|| "-".into()));
        }
        for f in &failures {
            println!("  not measured: {f}");
        }
        match (&written, &store, measured.is_some()) {
            (Some(p), _, _) => println!("stored in {}", p.display()),
            (None, Some(s), false) => println!("as stored in {}", s.path().display()),
            (None, Some(_), true) => println!("nothing measured, nothing stored"),
            (None, None, _) => println!("not stored: no cache directory (cache_dir is off)"),
        }
        println!("strided transfers use: {}", in_use.describe());
    }
    Ok(())
}
