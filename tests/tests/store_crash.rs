//! The object store killed with SIGKILL mid-update on the host: the
//! `store-crash` run of the VM suites with the cache and buffers in host
//! memory and the store on a file of the host, each store reopened and
//! checked against what had returned (`docs/store.md`).
//!
//! Each run takes a slice of seeds: `P2PDMA_CRASH_RUNS` processes (60 by
//! default) from seed `P2PDMA_CRASH_SEED`, by default one that changes
//! every hour, so that runs over time cover many slices. A failure names
//! its seed.

use std::process::Command;

const VMTEST: &str = env!("CARGO_BIN_EXE_p2pdma-vmtest");

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn a_store_killed_mid_update_keeps_every_commit_and_flushed_byte() {
    let runs = env_u64("P2PDMA_CRASH_RUNS").unwrap_or(60);
    let seed = env_u64("P2PDMA_CRASH_SEED").unwrap_or_else(|| {
        let hours = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 3600);
        (hours % 100_000) * 10_000 + 1
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.bin");
    println!("P2PDMA_CRASH_SEED={seed} P2PDMA_CRASH_RUNS={runs}");
    let out = Command::new(VMTEST)
        .args(["store-crash", "--memory", "host"])
        .arg("--path")
        .arg(&path)
        .args(["--runs", &runs.to_string(), "--seed", &seed.to_string()])
        .env("P2PDMA_CACHE_DIR", "off")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "seeds {seed}..{}: {text}",
        seed + runs
    );
    assert!(
        text.contains(&format!("{runs} processes killed mid-update")),
        "{text}"
    );
    println!("{text}");
}
