//! `p2pdma-ctl`: exercises every ioctl of `/dev/p2pdma` and the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use p2pdma::{Accelerator, Module};
use serde_json::json;

#[derive(Parser)]
#[command(version, about = "Control and test tool for p2pdma")]
struct Cli {
    /// The module's device node.
    #[arg(long, global = true, default_value = p2pdma::device::DEVICE_NODE)]
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
    List,
}

fn accel_json(a: &Accelerator) -> serde_json::Value {
    json!({
        "index": a.index,
        "pci": a.pci.to_string(),
        "vendor": format!("{:04x}", a.vendor),
        "device": format!("{:04x}", a.device),
        "bar": a.bar,
        "bar_size": a.bar_size,
        "bar_bus_addr": a.bar_bus_addr,
        "p2p_size": a.p2p_size,
        "p2p_available": a.p2p_available,
        "numa_node": a.numa_node,
    })
}

fn run(cli: &Cli) -> p2pdma::Result<()> {
    let module = Module::open_path(&cli.node)?;
    match cli.cmd {
        Cmd::Version => {
            let v = module.version();
            if cli.json {
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
        Cmd::List => {
            let accels = module.accelerators()?;
            if cli.json {
                let list: Vec<_> = accels.iter().map(accel_json).collect();
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
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("p2pdma-ctl: {e}");
            ExitCode::FAILURE
        }
    }
}
