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
#define P2PDMA_ABI_VERSION 1
#define P2PDMA_ABI_MIN_COMPAT 1
#define P2PDMA_MAX_DEVICES 64

/* Accelerator BARs are registered as kernel P2PDMA memory. */
#define P2PDMA_CAP_BAR_P2PMEM (1ULL << 0)

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

/* Query the ABI version and capabilities. Never fails. */
#define P2PDMA_IOC_GET_VERSION _IOR(P2PDMA_IOCTL_MAGIC, 0x00, struct p2pdma_version)

/*
 * Describe the device at a stable index.
 * EINVAL: flags != 0 or index >= P2PDMA_MAX_DEVICES. ENODEV: no device there.
 */
#define P2PDMA_IOC_DEVICE_INFO _IOWR(P2PDMA_IOCTL_MAGIC, 0x01, struct p2pdma_device_info)

#endif /* P2PDMA_UAPI_H */
