// SPDX-License-Identifier: GPL-2.0
/*
 * C glue for the p2pdma module: only what Rust cannot do. Each function is
 * wrapped by a safe function in the ffi/ module of its facility; nothing
 * else in the module calls these, and nothing here calls into Rust (the
 * callbacks the kernel makes, vm_ops, the PCI bus notifier and the dma-buf
 * importer's invalidate_mappings, are built in Rust). What stays here, and
 * why:
 *
 * - The module parameters: module_param and module_param_array are
 *   macros (upstream's module! has no array parameters), and so is
 *   MODULE_IMPORT_NS, which the dma-buf calls need.
 * - Accessors for static inline functions and macros that the kernel's
 *   Rust helpers do not export: pci_resource_flags, pci_bus_address,
 *   pci_domain_nr, dev_to_node, dma_get_max_seg_size,
 *   pci_upstream_bridge, current (bindgen lays task_struct out wrongly
 *   here), current_uid, task_tgid, get_pid, rlimit,
 *   fatal_signal_pending, virt_to_page, pgprot_writecombine, S_ISBLK and
 *   file_inode, the block device limits, fsnotify_access/modify,
 *   page_to_pfn, sg_page, sg_next, sg_dma_is_bus_address and
 *   dma_resv_assert_held (lockdep).
 * - The P2P page allocation (p2pdma_helper_alloc, p2pdma_helper_put_pages):
 *   each step of it is a static inline on struct page (virt_to_page,
 *   page_pgmap, put_dev_pagemap, put_page); in Rust it would be the same
 *   calls through four more accessors.
 */

#include <linux/blkdev.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/fsnotify.h>
#include <linux/kernel.h>
#include <linux/memremap.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/scatterlist.h>
#include <linux/suspend.h>

#include "helpers.h"

MODULE_IMPORT_NS("DMA_BUF");

static char *ids[16];
static unsigned int num_ids;
module_param_array(ids, charp, &num_ids, 0444);
MODULE_PARM_DESC(ids,
	"Extra accelerator PCI IDs to bind, vendor:device in hex, comma separated (e.g. ids=10de:2330,1002:74a1)");

static int bar = -1;
module_param(bar, int, 0444);
MODULE_PARM_DESC(bar,
	"BAR to register as P2P memory (default -1: the largest 64-bit prefetchable memory BAR)");

static unsigned int user_share = 50;
module_param(user_share, uint, 0644);
MODULE_PARM_DESC(user_share,
	"Percent of each accelerator's P2P memory one user without CAP_SYS_ADMIN may hold (default 50)");

int p2pdma_helper_param_bar(void)
{
	return bar;
}

unsigned int p2pdma_helper_param_user_share(void)
{
	return min(READ_ONCE(user_share), 100U);
}

/* The @i-th ID of the ids= parameter, or NULL past the last. */
const char *p2pdma_helper_param_id(unsigned int i)
{
	return i < num_ids ? ids[i] : NULL;
}

/* What kind of BAR @bar is, as BAR_* bits (see ffi/pci.rs). */
u32 p2pdma_helper_bar_kind(struct pci_dev *pdev, int bar)
{
	unsigned long flags = pci_resource_flags(pdev, bar);
	u32 kind = 0;

	if (flags & IORESOURCE_MEM)
		kind |= 1;
	if (flags & IORESOURCE_MEM_64)
		kind |= 2;
	if (flags & IORESOURCE_PREFETCH)
		kind |= 4;
	return kind;
}

u64 p2pdma_helper_bar_bus_addr(struct pci_dev *pdev, int bar)
{
	return pci_bus_address(pdev, bar);
}

void p2pdma_helper_location(struct pci_dev *pdev, u32 *domain, u8 *bus, u8 *devfn)
{
	*domain = pci_domain_nr(pdev->bus);
	*bus = pdev->bus->number;
	*devfn = pdev->devfn;
}

int p2pdma_helper_numa_node(struct pci_dev *pdev)
{
	return dev_to_node(&pdev->dev);
}

unsigned int p2pdma_helper_max_seg_size(struct pci_dev *pdev)
{
	return dma_get_max_seg_size(&pdev->dev);
}

/* The caller's kernel uid, the same in every user namespace. */
u32 p2pdma_helper_current_uid(void)
{
	return __kuid_val(current_uid());
}

struct pid *p2pdma_helper_current_tgid_get(void)
{
	return get_pid(task_tgid(current));
}

bool p2pdma_helper_is_current_tgid(struct pid *pid)
{
	return task_tgid(current) == pid;
}

/*
 * P2P memory pages. The P2PDMA core returns a page to its pool when the
 * page's last reference goes (the pagemap's folio_free), dropping one
 * pagemap reference per page. An allocation therefore initialises each page
 * as a ZONE_DEVICE page with one reference (zone_device_page_init, which
 * also takes the page's pagemap reference) and drops the single pagemap
 * reference pci_alloc_p2pmem() took for the whole range: user mappings,
 * pins and the allocation then each hold their own page references, and
 * the memory returns to the pool when the last of them is gone.
 */
void *p2pdma_helper_alloc(struct pci_dev *pdev, size_t size)
{
	void *kaddr = pci_alloc_p2pmem(pdev, size);
	struct dev_pagemap *pgmap;
	size_t off;

	if (!kaddr)
		return NULL;
	pgmap = page_pgmap(virt_to_page(kaddr));
	for (off = 0; off < size; off += PAGE_SIZE) {
		struct page *page = virt_to_page(kaddr + off);

		zone_device_page_init(page, pgmap, 0);
		unlock_page(page);
	}
	put_dev_pagemap(pgmap);
	return kaddr;
}

/* Drops one reference on each page of [kaddr, kaddr + size). */
void p2pdma_helper_put_pages(void *kaddr, size_t size)
{
	size_t off;

	for (off = 0; off < size; off += PAGE_SIZE)
		put_page(virt_to_page(kaddr + off));
}

struct page *p2pdma_helper_virt_to_page(void *kaddr)
{
	return virt_to_page(kaddr);
}

/* Makes a user mapping write-combined (a macro on most architectures). */
void p2pdma_helper_vma_writecombine(struct vm_area_struct *vma)
{
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
}

/* The block device @file is, or NULL when it is not one. */
struct block_device *p2pdma_helper_file_bdev(struct file *file)
{
	return S_ISBLK(file_inode(file)->i_mode) ? file_bdev(file) : NULL;
}

bool p2pdma_helper_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

/*
 * The block device @file is, with what block I/O on it must respect; NULL
 * when it is not one.
 */
struct block_device *p2pdma_helper_io_bdev(struct file *file, struct p2pdma_bdev_facts *f)
{
	struct block_device *bdev;

	if (!S_ISBLK(file_inode(file)->i_mode))
		return NULL;
	bdev = file_bdev(file);
	f->readable = file->f_mode & FMODE_READ;
	f->writable = file->f_mode & FMODE_WRITE;
	f->read_only = bdev_read_only(bdev);
	f->p2pdma = blk_queue_pci_p2pdma(bdev_get_queue(bdev));
	f->swap = IS_SWAPFILE(file->f_mapping->host) && !is_hibernate_resume_dev(bdev->bd_dev);
	f->sync = (file->f_flags & O_DSYNC) || IS_SYNC(file->f_mapping->host);
	f->logical_block_size = bdev_logical_block_size(bdev);
	f->dma_alignment = bdev_dma_alignment(bdev);
	f->size = bdev_nr_bytes(bdev);
	f->dev = bdev->bd_dev;
	return bdev;
}

/* Tells inotify and fanotify that @file was read or written. */
void p2pdma_helper_io_notify(struct file *file, bool write)
{
	if (write)
		fsnotify_modify(file);
	else
		fsnotify_access(file);
}

/* The bridge directly upstream of @pdev (of its physical function), or NULL. */
struct pci_dev *p2pdma_helper_upstream_bridge(struct pci_dev *pdev)
{
	return pci_upstream_bridge(pdev);
}

/* The page frame number of @page. */
unsigned long p2pdma_helper_page_to_pfn(struct page *page)
{
	return page_to_pfn(page);
}

/* The page of @sg's CPU side (NULL for a table without pages). */
struct page *p2pdma_helper_sg_page(struct scatterlist *sg)
{
	return sg_page(sg);
}

/* The entry after @sg, or NULL after the last one. */
struct scatterlist *p2pdma_helper_sg_next(struct scatterlist *sg)
{
	return sg_next(sg);
}

/* Whether the DMA API mapped @sg by PCI bus address (P2P through a switch). */
bool p2pdma_helper_sg_is_bus_addr(struct scatterlist *sg)
{
	return sg_dma_is_bus_address(sg);
}

/* The caller's mm (NULL in a kernel thread). */
struct mm_struct *p2pdma_helper_current_mm(void)
{
	return current->mm;
}

/* The caller's RLIMIT_MEMLOCK, in bytes. */
unsigned long p2pdma_helper_memlock_limit(void)
{
	return rlimit(RLIMIT_MEMLOCK);
}

/* Asserts (with lockdep) that @resv is locked. */
void p2pdma_helper_resv_assert_held(struct dma_resv *resv)
{
	dma_resv_assert_held(resv);
}
