/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The /dev/p2pdma ioctl ABI for C callers.
 *
 * uapi.rs is the source of truth; p2pdma-abi's tests compile this header
 * and compare every size, offset and request code with it.
 *
 * Every ioctl returns 0 on success and -1 with errno set on failure. Input
 * "flags" and "reserved" fields must be zero (EINVAL otherwise). A request
 * code the module does not know gives ENOTTY; a bad user pointer gives EFAULT.
 */
#ifndef P2PDMA_UAPI_H
#define P2PDMA_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define P2PDMA_IOCTL_MAGIC 0xBC
#define P2PDMA_ABI_VERSION 3
#define P2PDMA_ABI_MIN_COMPAT 1
#define P2PDMA_MAX_DEVICES 64

/* Capabilities (p2pdma_version.capabilities). */
#define P2PDMA_CAP_BAR_P2PMEM (1ULL << 0)	/* BARs are kernel P2PDMA memory */
#define P2PDMA_CAP_ALLOC (1ULL << 1)		/* ALLOC, FREE, mmap */
#define P2PDMA_CAP_P2P_QUERY (1ULL << 2)	/* P2P_QUERY */
#define P2PDMA_CAP_DMA_MAP (1ULL << 3)		/* DMA_MAP, PIN_USER, UNMAP */
#define P2PDMA_CAP_DMABUF (1ULL << 4)		/* DMABUF_IMPORT */
#define P2PDMA_CAP_REVOKE (1ULL << 5)		/* SET_EVENTFD, HANDLE_STATE */
#define P2PDMA_CAP_MAP_DIRECTION (1ULL << 6)	/* P2PDMA_MAP_PEER_READS/WRITES */
#define P2PDMA_CAP_BLOCK_IO (1ULL << 7)		/* BLOCK_IO */

/* The peer is the block device behind peer.fd, not a PCI address. */
#define P2PDMA_PEER_FD (1U << 0)

/*
 * Mapping direction (DMA_MAP, PIN_USER, DMABUF_IMPORT flags): the peer only
 * reads the memory (PIN_USER then pins read-only), or only writes it.
 * Neither or both: it does both.
 */
#define P2PDMA_MAP_PEER_READS (1U << 1)
#define P2PDMA_MAP_PEER_WRITES (1U << 2)

/*
 * Most live mappings made by the module (DMA_MAP, PIN_USER, DMABUF_IMPORT,
 * one per peer) that a peer may write and that cover one page, over all
 * files, processes and dma-bufs (the DMA API bounds overlapping mappings of
 * a cacheline). Mappings with P2PDMA_MAP_PEER_READS are not counted.
 */
#define P2PDMA_MAX_PIN_OVERLAP 4

/* p2pdma_handle_state.state values. */
#define P2PDMA_STATE_LIVE 1
#define P2PDMA_STATE_REVOKED 2
#define P2PDMA_STATE_REVOKING 3	/* stands while a device it depends on goes: stop the peer, then UNMAP */

/* map_type values. */
#define P2PDMA_MAP_BUS_ADDR 1		/* by bus address through a common switch */
#define P2PDMA_MAP_THRU_HOST_BRIDGE 2	/* through an allowed host bridge */
#define P2PDMA_MAP_NOT_SUPPORTED 3	/* the kernel refuses P2P between them */

#define P2PDMA_REASON_LEN 128
#define P2PDMA_MAX_ALIGN (1ULL << 30)

/* Output of P2PDMA_IOC_GET_VERSION. */
struct p2pdma_version {
	__u32 abi_version;	/* ABI of the running module */
	__u32 abi_min_compat;	/* oldest ABI it still serves */
	__u64 capabilities;	/* P2PDMA_CAP_* */
	__u32 num_devices;	/* accelerators bound now */
	__u32 reserved0;
	__u64 reserved[4];
};

/* In/out argument of P2PDMA_IOC_DEVICE_INFO. */
struct p2pdma_device_info {
	__u32 index;		/* in: stable device index */
	__u32 flags;		/* in: must be zero */
	__u32 domain;		/* PCI domain */
	__u8 bus;		/* PCI bus */
	__u8 devfn;		/* (device << 3) | function */
	__u8 bar;		/* BAR registered as P2P memory */
	__u8 pad0;
	__u16 vendor;
	__u16 device;
	__s32 numa_node;	/* -1 when unknown */
	__u64 bar_size;		/* bytes */
	__u64 bar_bus_addr;	/* PCI bus address of the BAR */
	__u64 p2p_size;		/* bytes registered as P2P memory */
	__u64 p2p_available;	/* bytes not allocated through the module */
	__u64 reserved[4];
};

/* In/out argument of P2PDMA_IOC_ALLOC. */
struct p2pdma_alloc {
	__u32 dev_index;	/* in: accelerator index */
	__u32 flags;		/* in: zero */
	__u64 size;		/* in: bytes (> 0); out: bytes allocated (page multiple) */
	__u64 align;		/* in: 0 (page) or a power of two <= P2PDMA_MAX_ALIGN */
	__u64 handle;		/* out: unique for the life of the module */
	__u64 mmap_offset;	/* out: mmap(2) offset that maps the allocation */
	__u64 reserved[4];	/* in: zero */
};

/* Argument of P2PDMA_IOC_FREE. */
struct p2pdma_free {
	__u64 handle;
	__u32 flags;		/* zero */
	__u32 reserved0;
	__u64 reserved[2];
};

/* A peer device: an open block device (P2PDMA_PEER_FD) or a PCI address. */
struct p2pdma_peer {
	__s32 fd;
	__u32 domain;
	__u8 bus;
	__u8 devfn;
	__u16 pad0;
};

/* In/out argument of P2PDMA_IOC_P2P_QUERY. */
struct p2pdma_p2p_query {
	__u32 dev_index;	/* in */
	__u32 flags;		/* in: P2PDMA_PEER_FD or 0 */
	struct p2pdma_peer peer;	/* in; out: the PCI function it resolved to */
	__u32 map_type;		/* out: P2PDMA_MAP_* */
	__s32 distance;		/* out: -1 when not supported */
	__u32 pad1;
	char reason[P2PDMA_REASON_LEN];	/* out: NUL-terminated */
	__u64 reserved[4];	/* in: zero */
};

/* One DMA segment as the peer sees it. */
struct p2pdma_dma_seg {
	__u64 addr;
	__u64 len;
};

/* In/out argument of P2PDMA_IOC_DMA_MAP, _PIN_USER and _DMABUF_IMPORT. */
struct p2pdma_dma_map {
	__u32 flags;		/* in: P2PDMA_PEER_FD or 0 */
	__s32 dmabuf_fd;	/* in: DMABUF_IMPORT only */
	struct p2pdma_peer peer;	/* in */
	__u32 pad0;
	__u64 handle;		/* in: allocation (DMA_MAP only) */
	__u64 user_va;		/* in: user buffer (PIN_USER only) */
	__u64 offset;		/* in: into the allocation (DMA_MAP only) */
	__u64 length;		/* in: bytes (DMA_MAP, PIN_USER); out: bytes mapped */
	__u64 segs_ptr;		/* in: struct p2pdma_dma_seg[max_segs] */
	__u32 max_segs;		/* in */
	__u32 num_segs;		/* out: written, or needed with ENOSPC */
	__u64 map_handle;	/* out: for P2PDMA_IOC_UNMAP */
	__u32 map_type;		/* out: P2PDMA_MAP_*; 0 for host memory and dma-bufs */
	__u32 pad1;
	__u64 reserved[4];	/* in: zero */
};

/* Argument of P2PDMA_IOC_UNMAP. */
struct p2pdma_unmap {
	__u64 map_handle;
	__u32 flags;		/* zero */
	__u32 reserved0;
	__u64 reserved[2];
};

/* Argument of P2PDMA_IOC_SET_EVENTFD. */
struct p2pdma_eventfd {
	__s32 fd;		/* an eventfd, or -1 to stop */
	__u32 flags;		/* zero */
	__u64 reserved[2];
};

/* In/out argument of P2PDMA_IOC_HANDLE_STATE. */
struct p2pdma_handle_state {
	__u64 handle;		/* in: allocation or mapping handle */
	__u32 flags;		/* in: zero */
	__u32 state;		/* out: P2PDMA_STATE_* */
	__u64 reserved[2];
};

/* BLOCK_IO. */
#define P2PDMA_IO_WRITE (1U << 0)	/* allocation to device */
#define P2PDMA_IO_MAX_SEGS 4096
#define P2PDMA_IO_MAX_SEG_LEN (1ULL << 30)
#define P2PDMA_IO_MAX_DEPTH 256
#define P2PDMA_IO_DEFAULT_DEPTH 32

/* One segment of BLOCK_IO. */
struct p2pdma_io_seg {
	__u64 mem_offset;	/* in the allocation; device DMA alignment */
	__u64 dev_offset;	/* on the block device; logical block multiple */
	__u64 len;		/* logical block multiple, <= P2PDMA_IO_MAX_SEG_LEN */
};

/* In/out argument of P2PDMA_IOC_BLOCK_IO. */
struct p2pdma_block_io {
	__u64 handle;		/* in: the allocation */
	__s32 fd;		/* in: an open block device */
	__u32 flags;		/* in: P2PDMA_IO_WRITE or 0 */
	__u64 segs_ptr;		/* in: struct p2pdma_io_seg[num_segs] */
	__u32 num_segs;		/* in: 1..P2PDMA_IO_MAX_SEGS */
	__u32 depth;		/* in: segments in flight (0: default) */
	__u64 bytes;		/* in: zero; out: bytes moved */
	__u64 reserved[4];
};

/* Query the ABI version and capabilities. Never fails. */
#define P2PDMA_IOC_GET_VERSION _IOR(P2PDMA_IOCTL_MAGIC, 0x00, struct p2pdma_version)

/*
 * Describe the device at a stable index.
 * EINVAL: flags != 0 or index >= P2PDMA_MAX_DEVICES. ENODEV: no device there.
 */
#define P2PDMA_IOC_DEVICE_INFO _IOWR(P2PDMA_IOCTL_MAGIC, 0x01, struct p2pdma_device_info)

/*
 * Allocate accelerator memory owned by this open file; mmap(2) it with
 * MAP_SHARED at mmap_offset (write-combined; only the opening process may
 * map; not inherited by fork). Closing the file frees everything.
 * The memory reads as zeros.
 * EINVAL: non-zero flags/reserved, size 0 or too large, bad align.
 * ENODEV: no such device, or it was unbound. ENOMEM: no P2P memory left.
 * EDQUOT: without CAP_SYS_ADMIN, the user would hold more than the
 * module's user_share percent of the device's memory.
 */
#define P2PDMA_IOC_ALLOC _IOWR(P2PDMA_IOCTL_MAGIC, 0x02, struct p2pdma_alloc)

/*
 * Free an allocation; existing user mappings stay valid until unmapped, and
 * the memory returns to the device when the last one goes.
 * EINVAL: non-zero flags/reserved. ENOENT: no such handle in this file.
 * EBUSY: a DMA_MAP mapping of it still exists.
 */
#define P2PDMA_IOC_FREE _IOW(P2PDMA_IOCTL_MAGIC, 0x03, struct p2pdma_free)

/*
 * Whether and how a peer can reach an accelerator's memory by P2P DMA.
 * EINVAL: non-zero flags/pad/reserved. ENODEV: no such accelerator or
 * peer PCI function. EBADF: bad peer fd. ENOTBLK: peer fd is not a block
 * device. ENXIO: the peer has no PCI function. EOPNOTSUPP: an md array
 * whose members are on more PCI functions than the module resolves. An md
 * array's answer is its worst member's.
 */
#define P2PDMA_IOC_P2P_QUERY _IOWR(P2PDMA_IOCTL_MAGIC, 0x04, struct p2pdma_p2p_query)

/*
 * DMA-map [offset, offset + length) of an allocation for a peer, by the
 * kernel's DMA API (P2PDMA rules, ACS, IOMMU). Needs CAP_SYS_RAWIO (EPERM).
 * EINVAL: unknown flags, non-zero fields, range not page aligned, empty or
 * outside the allocation. ENOENT: no such allocation. EREMOTEIO: the kernel
 * does not allow P2P between them. EXDEV: the controllers of a multipath
 * device need different addresses. ENOSPC: max_segs too small (num_segs
 * says how many). ENODEV: the allocation was revoked, or a device it
 * depends on is being unbound. EOPNOTSUPP: the peer is a bridge.
 * ETOOMANYREFS: a page of the range already carries P2PDMA_MAX_PIN_OVERLAP
 * mappings. Peer errors as for P2P_QUERY.
 */
#define P2PDMA_IOC_DMA_MAP _IOWR(P2PDMA_IOCTL_MAGIC, 0x05, struct p2pdma_dma_map)

/*
 * Pin a host user buffer and DMA-map it for a peer. Needs CAP_SYS_RAWIO.
 * Counts against RLIMIT_MEMLOCK (pinned_vm) without CAP_IPC_LOCK.
 * EINVAL: user_va/length not page aligned, length 0 or over 1 GiB,
 * non-zero fields. EFAULT: buffer not mapped, or read-only without
 * P2PDMA_MAP_PEER_READS. ENOMEM: over RLIMIT_MEMLOCK. ETOOMANYREFS: a page
 * already carries P2PDMA_MAX_PIN_OVERLAP mappings. ENOSPC, peer
 * errors, and those of DMA_MAP for the peer (ENODEV, EOPNOTSUPP).
 */
#define P2PDMA_IOC_PIN_USER _IOWR(P2PDMA_IOCTL_MAGIC, 0x06, struct p2pdma_dma_map)

/*
 * Release a mapping from DMA_MAP, PIN_USER or DMABUF_IMPORT.
 * EINVAL: non-zero fields. ENOENT: no such mapping in this file.
 */
#define P2PDMA_IOC_UNMAP _IOW(P2PDMA_IOCTL_MAGIC, 0x07, struct p2pdma_unmap)

/*
 * Import a dma-buf for a peer: a dynamic, peer-to-peer attachment, pinned
 * while imported; revoked if the exporter moves it anyway. Returns the
 * peer's addresses. Needs CAP_SYS_RAWIO. EBADF: not a dma-buf. EMSGSIZE:
 * the buffer is larger than the peer's longest DMA segment. ETOOMANYREFS:
 * a page of the buffer already carries P2PDMA_MAX_PIN_OVERLAP mappings (the
 * buffer that many imports, where its exporter gives no pages).
 * EINVAL, ENOSPC, ENOMEM, peer errors and those of DMA_MAP for the peer
 * (ENODEV, EOPNOTSUPP), and the exporter's errors.
 */
#define P2PDMA_IOC_DMABUF_IMPORT _IOWR(P2PDMA_IOCTL_MAGIC, 0x08, struct p2pdma_dma_map)

/*
 * Signal an eventfd each time an allocation or mapping of this file is
 * revoked (its accelerator or peer unbound, or a dma-buf withdrawn); fd -1
 * stops it. The opening process only. EBADF: not an eventfd.
 */
#define P2PDMA_IOC_SET_EVENTFD _IOW(P2PDMA_IOCTL_MAGIC, 0x09, struct p2pdma_eventfd)

/*
 * Whether a handle of this file is live or revoked. ENOENT: no such handle.
 */
#define P2PDMA_IOC_HANDLE_STATE _IOWR(P2PDMA_IOCTL_MAGIC, 0x0a, struct p2pdma_handle_state)

/*
 * Read a block device into an allocation of this file (or, with
 * P2PDMA_IO_WRITE, write it from one): the module builds the bios on the
 * allocation's own pages (nothing pinned per I/O), up to depth segments in
 * flight, and returns when all have ended. The page cache of the ranges is
 * written back first (and dropped, for writes), as O_DIRECT does. The
 * opening process only.
 * EINVAL: fields, alignment, ranges. ENOENT: no such allocation. ENODEV:
 * revoked. EBADF: fd not open for that direction. ENOTBLK. EPERM: read-only
 * device. ETXTBSY: writing an active swap device. EACCES, EPERM: a security module refuses the read or write. EOPNOTSUPP: the driver cannot DMA to P2P memory. EREMOTEIO: the
 * kernel does not allow P2P between them. EBUSY: page cache in use. EINTR:
 * fatal signal. Device errors (EIO, ...).
 */
#define P2PDMA_IOC_BLOCK_IO _IOWR(P2PDMA_IOCTL_MAGIC, 0x0b, struct p2pdma_block_io)

#endif /* P2PDMA_UAPI_H */
