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
    S(p2pdma_alloc)
    O(p2pdma_alloc, dev_index) O(p2pdma_alloc, flags) O(p2pdma_alloc, size)
    O(p2pdma_alloc, align) O(p2pdma_alloc, handle) O(p2pdma_alloc, mmap_offset)
    O(p2pdma_alloc, reserved)
    S(p2pdma_free)
    O(p2pdma_free, handle) O(p2pdma_free, flags) O(p2pdma_free, reserved0)
    O(p2pdma_free, reserved)
    S(p2pdma_peer)
    O(p2pdma_peer, fd) O(p2pdma_peer, domain) O(p2pdma_peer, bus)
    O(p2pdma_peer, devfn) O(p2pdma_peer, pad0)
    S(p2pdma_p2p_query)
    O(p2pdma_p2p_query, dev_index) O(p2pdma_p2p_query, flags)
    O(p2pdma_p2p_query, peer) O(p2pdma_p2p_query, map_type)
    O(p2pdma_p2p_query, distance) O(p2pdma_p2p_query, pad1)
    O(p2pdma_p2p_query, reason) O(p2pdma_p2p_query, reserved)
    S(p2pdma_dma_seg)
    O(p2pdma_dma_seg, addr) O(p2pdma_dma_seg, len)
    S(p2pdma_dma_map)
    O(p2pdma_dma_map, flags) O(p2pdma_dma_map, dmabuf_fd) O(p2pdma_dma_map, peer)
    O(p2pdma_dma_map, pad0) O(p2pdma_dma_map, handle) O(p2pdma_dma_map, user_va)
    O(p2pdma_dma_map, offset) O(p2pdma_dma_map, length) O(p2pdma_dma_map, segs_ptr)
    O(p2pdma_dma_map, max_segs) O(p2pdma_dma_map, num_segs)
    O(p2pdma_dma_map, map_handle) O(p2pdma_dma_map, map_type)
    O(p2pdma_dma_map, pad1) O(p2pdma_dma_map, reserved)
    S(p2pdma_unmap)
    O(p2pdma_unmap, map_handle) O(p2pdma_unmap, flags) O(p2pdma_unmap, reserved0)
    O(p2pdma_unmap, reserved)
    S(p2pdma_eventfd)
    O(p2pdma_eventfd, fd) O(p2pdma_eventfd, flags) O(p2pdma_eventfd, reserved)
    S(p2pdma_handle_state)
    O(p2pdma_handle_state, handle) O(p2pdma_handle_state, flags)
    O(p2pdma_handle_state, state) O(p2pdma_handle_state, reserved)
    V(P2PDMA_IOCTL_MAGIC) V(P2PDMA_ABI_VERSION) V(P2PDMA_ABI_MIN_COMPAT)
    V(P2PDMA_MAX_DEVICES) V(P2PDMA_CAP_BAR_P2PMEM) V(P2PDMA_CAP_ALLOC)
    V(P2PDMA_CAP_P2P_QUERY) V(P2PDMA_CAP_DMA_MAP) V(P2PDMA_CAP_DMABUF)
    V(P2PDMA_PEER_FD) V(P2PDMA_MAP_BUS_ADDR) V(P2PDMA_MAP_THRU_HOST_BRIDGE)
    V(P2PDMA_MAP_NOT_SUPPORTED) V(P2PDMA_REASON_LEN) V(P2PDMA_MAX_ALIGN)
    V(P2PDMA_IOC_GET_VERSION) V(P2PDMA_IOC_DEVICE_INFO) V(P2PDMA_IOC_ALLOC)
    V(P2PDMA_IOC_FREE) V(P2PDMA_IOC_P2P_QUERY) V(P2PDMA_IOC_DMA_MAP)
    V(P2PDMA_IOC_PIN_USER) V(P2PDMA_IOC_UNMAP) V(P2PDMA_IOC_DMABUF_IMPORT)
    V(P2PDMA_CAP_REVOKE) V(P2PDMA_CAP_MAP_DIRECTION) V(P2PDMA_MAP_PEER_READS)
    V(P2PDMA_MAP_PEER_WRITES) V(P2PDMA_MAX_PIN_OVERLAP) V(P2PDMA_STATE_LIVE)
    V(P2PDMA_STATE_REVOKED) V(P2PDMA_STATE_REVOKING) V(P2PDMA_IOC_SET_EVENTFD) V(P2PDMA_IOC_HANDLE_STATE)
    S(p2pdma_io_seg)
    O(p2pdma_io_seg, mem_offset) O(p2pdma_io_seg, dev_offset) O(p2pdma_io_seg, len)
    S(p2pdma_block_io)
    O(p2pdma_block_io, handle) O(p2pdma_block_io, fd) O(p2pdma_block_io, flags)
    O(p2pdma_block_io, segs_ptr) O(p2pdma_block_io, num_segs) O(p2pdma_block_io, depth)
    O(p2pdma_block_io, bytes) O(p2pdma_block_io, reserved)
    V(P2PDMA_CAP_BLOCK_IO) V(P2PDMA_IO_WRITE) V(P2PDMA_IO_MAX_SEGS) V(P2PDMA_IO_MAX_SEG_LEN)
    V(P2PDMA_IO_MAX_DEPTH) V(P2PDMA_IO_DEFAULT_DEPTH) V(P2PDMA_IOC_BLOCK_IO)
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
    s!(P2pdmaAlloc, "p2pdma_alloc");
    o!(P2pdmaAlloc, "p2pdma_alloc", dev_index flags size align handle mmap_offset reserved);
    s!(P2pdmaFree, "p2pdma_free");
    o!(P2pdmaFree, "p2pdma_free", handle flags reserved0 reserved);
    s!(P2pdmaPeer, "p2pdma_peer");
    o!(P2pdmaPeer, "p2pdma_peer", fd domain bus devfn pad0);
    s!(P2pdmaP2pQuery, "p2pdma_p2p_query");
    o!(P2pdmaP2pQuery, "p2pdma_p2p_query", dev_index flags peer map_type distance pad1 reason
        reserved);
    s!(P2pdmaDmaSeg, "p2pdma_dma_seg");
    o!(P2pdmaDmaSeg, "p2pdma_dma_seg", addr len);
    s!(P2pdmaDmaMap, "p2pdma_dma_map");
    o!(P2pdmaDmaMap, "p2pdma_dma_map", flags dmabuf_fd peer pad0 handle user_va offset length
        segs_ptr max_segs num_segs map_handle map_type pad1 reserved);
    s!(P2pdmaUnmap, "p2pdma_unmap");
    o!(P2pdmaUnmap, "p2pdma_unmap", map_handle flags reserved0 reserved);
    s!(P2pdmaEventfd, "p2pdma_eventfd");
    o!(P2pdmaEventfd, "p2pdma_eventfd", fd flags reserved);
    s!(P2pdmaHandleState, "p2pdma_handle_state");
    o!(P2pdmaHandleState, "p2pdma_handle_state", handle flags state reserved);
    v!(P2PDMA_IOCTL_MAGIC P2PDMA_ABI_VERSION P2PDMA_ABI_MIN_COMPAT P2PDMA_MAX_DEVICES
        P2PDMA_CAP_BAR_P2PMEM P2PDMA_CAP_ALLOC P2PDMA_CAP_P2P_QUERY P2PDMA_CAP_DMA_MAP
        P2PDMA_CAP_DMABUF P2PDMA_PEER_FD P2PDMA_MAP_BUS_ADDR P2PDMA_MAP_THRU_HOST_BRIDGE
        P2PDMA_MAP_NOT_SUPPORTED P2PDMA_REASON_LEN P2PDMA_MAX_ALIGN
        P2PDMA_IOC_GET_VERSION P2PDMA_IOC_DEVICE_INFO P2PDMA_IOC_ALLOC P2PDMA_IOC_FREE
        P2PDMA_IOC_P2P_QUERY P2PDMA_IOC_DMA_MAP P2PDMA_IOC_PIN_USER P2PDMA_IOC_UNMAP
        P2PDMA_IOC_DMABUF_IMPORT P2PDMA_CAP_REVOKE P2PDMA_CAP_MAP_DIRECTION
        P2PDMA_MAP_PEER_READS P2PDMA_MAP_PEER_WRITES P2PDMA_MAX_PIN_OVERLAP P2PDMA_STATE_LIVE
        P2PDMA_STATE_REVOKED P2PDMA_STATE_REVOKING P2PDMA_IOC_SET_EVENTFD P2PDMA_IOC_HANDLE_STATE);
    s!(P2pdmaIoSeg, "p2pdma_io_seg");
    o!(P2pdmaIoSeg, "p2pdma_io_seg", mem_offset dev_offset len);
    s!(P2pdmaBlockIo, "p2pdma_block_io");
    o!(P2pdmaBlockIo, "p2pdma_block_io", handle fd flags segs_ptr num_segs depth bytes reserved);
    v!(P2PDMA_CAP_BLOCK_IO P2PDMA_IO_WRITE P2PDMA_IO_MAX_SEGS P2PDMA_IO_MAX_SEG_LEN
        P2PDMA_IO_MAX_DEPTH P2PDMA_IO_DEFAULT_DEPTH P2PDMA_IOC_BLOCK_IO);
    assert_eq!(c, rust, "kmod/uapi.h and kmod/uapi.rs disagree");
}

#[test]
fn request_codes_are_pinned() {
    // Released request codes never change.
    assert_eq!(P2PDMA_IOC_GET_VERSION, 0x8038_BC00);
    assert_eq!(P2PDMA_IOC_DEVICE_INFO, 0xC058_BC01);
    assert_eq!(P2PDMA_IOC_ALLOC, 0xC048_BC02);
    assert_eq!(P2PDMA_IOC_FREE, 0x4020_BC03);
    assert_eq!(P2PDMA_IOC_P2P_QUERY, 0xC0C0_BC04);
    assert_eq!(P2PDMA_IOC_DMA_MAP, 0xC078_BC05);
    assert_eq!(P2PDMA_IOC_PIN_USER, 0xC078_BC06);
    assert_eq!(P2PDMA_IOC_UNMAP, 0x4020_BC07);
    assert_eq!(P2PDMA_IOC_DMABUF_IMPORT, 0xC078_BC08);
    assert_eq!(P2PDMA_IOC_SET_EVENTFD, 0x4018_BC09);
    assert_eq!(P2PDMA_IOC_HANDLE_STATE, 0xC020_BC0A);
    assert_eq!(P2PDMA_IOC_BLOCK_IO, 0xC048_BC0B);
}
