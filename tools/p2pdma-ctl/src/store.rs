//! `p2pdma-ctl store`: the object store from the shell. Format a device (or
//! a file), list its objects, put a file in as an object, get one out, show
//! one, remove one, flush.

use std::{
    fs::File,
    io::{Read, Write},
    path::PathBuf,
    sync::Arc,
};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use p2pdma::{
    store::{EngineBacking, Store},
    transfer::{Config, Engine, StorageFile},
    DeviceMemory, HostMemory, MemRange, Module,
};
use serde_json::json;

type Res<T> = Result<T, String>;

/// Bytes moved per call on puts and gets.
const CHUNK: usize = 4 << 20;

#[derive(Args)]
pub struct StoreArgs {
    /// The store's device: an NVMe namespace or partition, or a file.
    #[arg(long)]
    device: PathBuf,
    #[command(subcommand)]
    cmd: StoreCmd,
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Make an empty store (what was on the device is gone).
    Format {
        /// The most objects its map holds.
        #[arg(long, default_value_t = 4096)]
        max_objects: u64,
    },
    /// List the objects: id, first block, size.
    Ls,
    /// Store a file as a new object; prints its id.
    Put {
        /// The file to store.
        file: PathBuf,
    },
    /// Write object `id` to a file.
    Get {
        /// The object.
        id: u64,
        /// The file to write (created or truncated).
        file: PathBuf,
    },
    /// Show one object and the store's free space.
    Stat {
        /// The object.
        id: u64,
    },
    /// Delete an object.
    Rm {
        /// The object.
        id: u64,
    },
    /// Make every write durable.
    Flush,
}

fn open(a: &StoreArgs, node: &str, format: Option<u64>) -> Res<Store> {
    let module = Module::open_path(node).ok().map(Arc::new);
    let engine = Arc::new(Engine::new(
        Config::from_env().map_err(|e| e.to_string())?,
        module,
    ));
    let file = Arc::new(
        StorageFile::open_rw(&a.device).map_err(|e| format!("{}: {e}", a.device.display()))?,
    );
    let backing = Arc::new(EngineBacking::new(engine, file));
    match format {
        Some(n) => Store::format(backing, n),
        None => Store::initialize(backing),
    }
    .map_err(|e| format!("{}: {e}", a.device.display()))
}

fn progress(len: u64, json: bool) -> ProgressBar {
    if json || len < 64 << 20 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

pub fn run(a: &StoreArgs, node: &str, json_out: bool) -> Res<()> {
    let err = |e: p2pdma::Error| e.to_string();
    match &a.cmd {
        StoreCmd::Format { max_objects } => {
            let s = open(a, node, Some(*max_objects))?;
            if json_out {
                println!(
                    "{}",
                    json!({"op": "format", "free_bytes": s.free_bytes(), "max_objects": max_objects})
                );
            } else {
                println!(
                    "formatted {}: {} bytes free, room for {max_objects} objects",
                    a.device.display(),
                    s.free_bytes()
                );
            }
        }
        StoreCmd::Ls => {
            let s = open(a, node, None)?;
            let map = s.get_object_map();
            if json_out {
                let list: Vec<_> = map
                    .iter()
                    .map(|o| json!({"id": o.id, "start_block": o.start_block, "size": o.size}))
                    .collect();
                println!("{}", json!({"objects": list, "free_bytes": s.free_bytes()}));
            } else {
                println!("{:>8} {:>12} {:>14}", "id", "start block", "size");
                for o in &map {
                    println!("{:>8} {:>12} {:>14}", o.id, o.start_block, o.size);
                }
            }
        }
        StoreCmd::Put { file } => {
            let s = open(a, node, None)?;
            let mut f = File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
            let len = f.metadata().map_err(|e| e.to_string())?.len();
            let id = s.pcreate(len).map_err(err)?;
            let buf = HostMemory::new(CHUNK).map_err(err)?;
            let mut bytes = vec![0u8; CHUNK];
            let pb = progress(len, json_out);
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(CHUNK as u64) as usize;
                f.read_exact(&mut bytes[..n])
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                buf.write_at(0, &bytes[..n]).map_err(err)?;
                MemRange::new(&buf, 0, n)
                    .and_then(|range| s.pwrite(id, at, range))
                    .map_err(err)?;
                at += n as u64;
                pb.set_position(at);
            }
            s.flush().map_err(err)?;
            pb.finish_and_clear();
            if json_out {
                println!("{}", json!({"op": "put", "id": id, "size": len}));
            } else {
                println!("put {}: object {id}, {len} bytes", file.display());
            }
        }
        StoreCmd::Get { id, file } => {
            let s = open(a, node, None)?;
            let len = s.size(*id).map_err(err)?;
            let mut f = File::create(file).map_err(|e| format!("{}: {e}", file.display()))?;
            let buf = HostMemory::new(CHUNK).map_err(err)?;
            let mut bytes = vec![0u8; CHUNK];
            let pb = progress(len, json_out);
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(CHUNK as u64) as usize;
                MemRange::new(&buf, 0, n)
                    .and_then(|range| s.pread(*id, at, range))
                    .map_err(err)?;
                buf.read_at(0, &mut bytes[..n]).map_err(err)?;
                f.write_all(&bytes[..n])
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                at += n as u64;
                pb.set_position(at);
            }
            f.sync_all()
                .map_err(|e| format!("{}: {e}", file.display()))?;
            pb.finish_and_clear();
            if json_out {
                println!("{}", json!({"op": "get", "id": id, "size": len}));
            } else {
                println!("got object {id}: {len} bytes into {}", file.display());
            }
        }
        StoreCmd::Stat { id } => {
            let s = open(a, node, None)?;
            let o = s
                .get_object_map()
                .into_iter()
                .find(|o| o.id == *id)
                .ok_or_else(|| format!("no object {id} in the store"))?;
            if json_out {
                println!(
                    "{}",
                    json!({"id": o.id, "start_block": o.start_block, "size": o.size, "free_bytes": s.free_bytes(), "generation": s.generation()})
                );
            } else {
                println!(
                    "object {}: {} bytes from block {}; the store has {} bytes free (generation {})",
                    o.id,
                    o.size,
                    o.start_block,
                    s.free_bytes(),
                    s.generation()
                );
            }
        }
        StoreCmd::Rm { id } => {
            let s = open(a, node, None)?;
            s.delete(*id).map_err(err)?;
            if json_out {
                println!("{}", json!({"op": "rm", "id": id}));
            } else {
                println!("removed object {id}");
            }
        }
        StoreCmd::Flush => {
            let s = open(a, node, None)?;
            s.flush().map_err(err)?;
            if json_out {
                println!("{}", json!({"op": "flush"}));
            } else {
                println!("flushed");
            }
        }
    }
    Ok(())
}
