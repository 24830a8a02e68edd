//! Compiles `kmod/uapi.h` with the system C compiler and checks that every
//! size, offset, constant and request code it yields equals the Rust ABI.

use std::{collections::BTreeMap, mem::offset_of, process::Command};

use p2pdma_abi::*;

const PROBE: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include "uapi.h"
#define S(t) printf("sizeof %s %zu\n", #t, sizeof(struct t));
#define O(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(struct t, f));
#define V(c) printf("value %s %llu\n", #c, (unsigned long long)(c));
int main(void) {
    S(p2pdma_version)
    O(p2pdma_version, abi_version) O(p2pdma_version, abi_min_compat)
    O(p2pdma_version, capabilities) O(p2pdma_version, num_devices)
    O(p2pdma_version, reserved0) O(p2pdma_version, reserved)
    S(p2pdma_device_info)
    O(p2pdma_device_info, index) O(p2pdma_device_info, flags)
    O(p2pdma_device_info, domain) O(p2pdma_device_info, bus)
    O(p2pdma_device_info, devfn) O(p2pdma_device_info, bar)
    O(p2pdma_device_info, pad0) O(p2pdma_device_info, vendor)
    O(p2pdma_device_info, device) O(p2pdma_device_info, numa_node)
    O(p2pdma_device_info, bar_size) O(p2pdma_device_info, bar_bus_addr)
    O(p2pdma_device_info, p2p_size) O(p2pdma_device_info, p2p_available)
    O(p2pdma_device_info, reserved)
    V(P2PDMA_IOCTL_MAGIC) V(P2PDMA_ABI_VERSION) V(P2PDMA_ABI_MIN_COMPAT)
    V(P2PDMA_MAX_DEVICES) V(P2PDMA_CAP_BAR_P2PMEM)
    V(P2PDMA_IOC_GET_VERSION) V(P2PDMA_IOC_DEVICE_INFO)
    return 0;
}
"#;

fn c_facts() -> BTreeMap<String, u64> {
    let dir = std::env::temp_dir().join(format!("p2pdma-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let bin = dir.join("probe");
    std::fs::write(&src, PROBE).unwrap();
    let header_dir = std::path::Path::new(C_HEADER).parent().unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(header_dir)
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(st.success(), "uapi.h does not compile");
    let out = Command::new(&bin).output().unwrap();
    assert!(out.status.success());
    std::fs::remove_dir_all(&dir).ok();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            let (_, k, v) = (w.next().unwrap(), w.next().unwrap(), w.next().unwrap());
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn c_header_matches_rust_abi() {
    let c = c_facts();
    let mut rust: BTreeMap<String, u64> = BTreeMap::new();
    macro_rules! s {
        ($t:ty, $n:literal) => {
            rust.insert($n.into(), size_of::<$t>() as u64);
        };
    }
    macro_rules! o {
        ($t:ty, $n:literal, $($f:ident)*) => {
            $(rust.insert(format!("{}.{}", $n, stringify!($f)), offset_of!($t, $f) as u64);)*
        };
    }
    macro_rules! v {
        ($($c:ident)*) => {
            $(rust.insert(stringify!($c).into(), $c as u64);)*
        };
    }
    s!(P2pdmaVersion, "p2pdma_version");
    o!(P2pdmaVersion, "p2pdma_version", abi_version abi_min_compat capabilities num_devices reserved0 reserved);
    s!(P2pdmaDeviceInfo, "p2pdma_device_info");
    o!(P2pdmaDeviceInfo, "p2pdma_device_info", index flags domain bus devfn bar pad0 vendor device
        numa_node bar_size bar_bus_addr p2p_size p2p_available reserved);
    v!(P2PDMA_IOCTL_MAGIC P2PDMA_ABI_VERSION P2PDMA_ABI_MIN_COMPAT P2PDMA_MAX_DEVICES
        P2PDMA_CAP_BAR_P2PMEM P2PDMA_IOC_GET_VERSION P2PDMA_IOC_DEVICE_INFO);
    assert_eq!(c, rust, "kmod/uapi.h and kmod/uapi.rs disagree");
}

#[test]
fn request_codes_are_pinned() {
    // Released request codes never change.
    assert_eq!(P2PDMA_IOC_GET_VERSION, 0x8038_BC00);
    assert_eq!(P2PDMA_IOC_DEVICE_INFO, 0xC058_BC01);
}
