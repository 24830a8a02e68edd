// SPDX-License-Identifier: GPL-2.0
/*
 * C glue for the p2pdma module: the kernel facilities Rust cannot reach
 * (static inline functions, macros, module_param_array, operation tables
 * that call back into Rust). Each is wrapped by a safe function in ffi.rs;
 * nothing else in the module calls these. Decisions live in the Rust code.
 */

#include <linux/blkdev.h>
#include <linux/capability.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/eventfd.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/fsnotify.h>
#include <linux/kernel.h>
#include <linux/memremap.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
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

/* Parse the ids= parameter and add each ID to the PCI driver @drv_name. */
int p2pdma_helper_add_param_ids(const char *drv_name)
{
	struct device_driver *drv;
	unsigned int i;

	if (!num_ids)
		return 0;
	drv = driver_find(drv_name, &pci_bus_type);
	if (!drv)
		return -ENODEV;
	for (i = 0; i < num_ids; i++) {
		unsigned int vendor, device;
		char tail;
		int ret;

		if (sscanf(ids[i], "%x:%x%c", &vendor, &device, &tail) != 2 ||
		    vendor > 0xffff || device > 0xffff) {
			pr_err("p2pdma: ids=%s: expected vendor:device in hex\n", ids[i]);
			return -EINVAL;
		}
		ret = pci_add_dynid(to_pci_driver(drv), vendor, device, PCI_ANY_ID,
				    PCI_ANY_ID, 0, 0, 0);
		if (ret && ret != -EEXIST)
			return ret;
	}
	return 0;
}

/* What kind of BAR @bar is, as BAR_* bits (see ffi.rs). */
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

bool p2pdma_helper_capable(int cap)
{
	return capable(cap);
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

void p2pdma_helper_put_pid(struct pid *pid)
{
	put_pid(pid);
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

/* The lowest PCI bridge that is upstream of both @a and @b, or NULL. */
struct pci_dev *p2pdma_helper_common_upstream(struct pci_dev *a, struct pci_dev *b)
{
	struct pci_dev *x, *y;

	for (x = pci_upstream_bridge(a); x; x = pci_upstream_bridge(x))
		for (y = pci_upstream_bridge(b); y; y = pci_upstream_bridge(y))
			if (x == y)
				return x;
	return NULL;
}

/*
 * A scatter-gather DMA mapping for a peer: P2P pages of an allocation,
 * pinned user pages, or an imported dma-buf.
 */
struct p2pdma_sgmap {
	struct pci_dev *peer;
	enum dma_data_direction dir;
	struct sg_table sgt_own;	/* P2P pages, pinned pages */
	struct sg_table *sgt;		/* NULL once a dma-buf was revoked */
	struct page **pages;		/* pinned pages */
	unsigned long npages;
	struct mm_struct *mm;		/* charged with npages of pinned_vm */
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	void *notify;			/* passed to p2pdma_dmabuf_revoked() */
	bool pinned, revoked;
};

static struct p2pdma_sgmap *sgmap_new(struct pci_dev *peer, enum dma_data_direction dir)
{
	struct p2pdma_sgmap *m = kzalloc(sizeof(*m), GFP_KERNEL);

	if (m) {
		m->peer = pci_dev_get(peer);
		m->dir = dir;
	}
	return m;
}

/*
 * Builds a table of @npages pages, segments no longer than the peer
 * accepts, and maps it for the peer through the DMA API, which applies the
 * P2PDMA rules to P2P pages (bus address, host bridge, or -EREMOTEIO).
 */
static int sgmap_map_pages(struct p2pdma_sgmap *m, struct page **pages,
			   unsigned long npages)
{
	int ret;

	ret = sg_alloc_table_from_pages_segment(&m->sgt_own, pages, npages, 0,
						npages << PAGE_SHIFT,
						dma_get_max_seg_size(&m->peer->dev),
						GFP_KERNEL);
	if (ret)
		return ret;
	ret = dma_map_sgtable(&m->peer->dev, &m->sgt_own, m->dir, 0);
	if (ret) {
		sg_free_table(&m->sgt_own);
		return ret;
	}
	m->sgt = &m->sgt_own;
	return 0;
}

struct p2pdma_sgmap *p2pdma_helper_map_p2p(struct pci_dev *peer, void *kaddr, u64 len,
					   int dir, int *err)
{
	unsigned long i, npages = len >> PAGE_SHIFT;
	struct p2pdma_sgmap *m = sgmap_new(peer, dir);
	struct page **pages;
	int ret = -ENOMEM;

	if (!m)
		goto fail;
	pages = kvmalloc_array(npages, sizeof(*pages), GFP_KERNEL);
	if (!pages)
		goto free_m;
	for (i = 0; i < npages; i++)
		pages[i] = virt_to_page(kaddr + (i << PAGE_SHIFT));
	ret = sgmap_map_pages(m, pages, npages);
	kvfree(pages);
	if (!ret)
		return m;
free_m:
	pci_dev_put(m->peer);
	kfree(m);
fail:
	*err = ret;
	return NULL;
}

/* Whether the DMA API mapped @m by PCI bus address (P2P through a switch). */
bool p2pdma_helper_sgmap_is_bus_addr(struct p2pdma_sgmap *m)
{
	return m->sgt && m->sgt->nents && sg_dma_is_bus_address(m->sgt->sgl);
}

/*
 * Charges @npages to the caller's pinned_vm against RLIMIT_MEMLOCK, as
 * RDMA does for pinned memory, unless it has CAP_IPC_LOCK.
 */
static int charge_pinned(struct p2pdma_sgmap *m, unsigned long npages)
{
	unsigned long limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	u64 now = atomic64_add_return(npages, &current->mm->pinned_vm);

	if (now > limit && !capable(CAP_IPC_LOCK)) {
		atomic64_sub(npages, &current->mm->pinned_vm);
		return -ENOMEM;
	}
	m->mm = current->mm;
	mmgrab(m->mm);
	return 0;
}

static void uncharge_pinned(struct p2pdma_sgmap *m)
{
	if (m->mm) {
		atomic64_sub(m->npages, &m->mm->pinned_vm);
		mmdrop(m->mm);
	}
}

struct p2pdma_sgmap *p2pdma_helper_pin_user(struct pci_dev *peer, u64 va, u64 len,
					    int dir, int *err)
{
	unsigned int gup = FOLL_LONGTERM | (dir == DMA_TO_DEVICE ? 0 : FOLL_WRITE);
	struct p2pdma_sgmap *m = sgmap_new(peer, dir);
	long pinned;
	int ret = -ENOMEM;

	if (!m)
		goto fail;
	m->npages = len >> PAGE_SHIFT;
	ret = charge_pinned(m, m->npages);
	if (ret)
		goto free_m;
	m->pages = kvmalloc_array(m->npages, sizeof(*m->pages), GFP_KERNEL);
	if (!m->pages) {
		ret = -ENOMEM;
		goto uncharge;
	}
	pinned = pin_user_pages_fast(va, m->npages, gup, m->pages);
	if (pinned < 0) {
		ret = pinned;
		goto free_pages;
	}
	if (pinned != m->npages) {
		unpin_user_pages(m->pages, pinned);
		ret = -EFAULT;
		goto free_pages;
	}
	ret = sgmap_map_pages(m, m->pages, m->npages);
	if (!ret)
		return m;
	unpin_user_pages(m->pages, m->npages);
free_pages:
	kvfree(m->pages);
uncharge:
	uncharge_pinned(m);
free_m:
	pci_dev_put(m->peer);
	kfree(m);
fail:
	*err = ret;
	return NULL;
}

/*
 * A dma-buf import is a dynamic attachment that allows peer-to-peer and is
 * pinned while imported, like RDMA's pinned revocable dma-buf memory. If the
 * exporter invalidates it anyway (e.g. its device is reset or unbound), the
 * mapping is torn down under the reservation lock and the owner told.
 */
static void dmabuf_revoke_locked(struct p2pdma_sgmap *m)
{
	dma_resv_assert_held(m->dmabuf->resv);
	if (m->sgt) {
		dma_buf_unmap_attachment(m->attach, m->sgt, m->dir);
		m->sgt = NULL;
	}
	if (m->pinned) {
		dma_buf_unpin(m->attach);
		m->pinned = false;
	}
}

static void p2pdma_invalidate_mappings(struct dma_buf_attachment *attach)
{
	struct p2pdma_sgmap *m = attach->importer_priv;

	/*
	 * Only a mapped table can be revoked: an invalidation between attach
	 * and map (the import maps afterwards, under the same lock) leaves
	 * nothing to tear down, and must not keep the real one from running.
	 */
	if (m->revoked || !m->sgt)
		return;
	dmabuf_revoke_locked(m);
	WRITE_ONCE(m->revoked, true);
	p2pdma_dmabuf_revoked(m->notify);
}

static const struct dma_buf_attach_ops p2pdma_importer_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = p2pdma_invalidate_mappings,
};

struct p2pdma_sgmap *p2pdma_helper_dmabuf_import(struct pci_dev *peer, struct dma_buf *buf,
						 int dir, void *notify, int *err)
{
	struct p2pdma_sgmap *m = sgmap_new(peer, dir);
	struct sg_table *sgt;
	long wait;
	int ret = -ENOMEM;

	if (!m)
		goto fail;
	m->notify = notify;
	get_dma_buf(buf);
	m->dmabuf = buf;
	m->attach = dma_buf_dynamic_attach(m->dmabuf, &peer->dev, &p2pdma_importer_ops, m);
	if (IS_ERR(m->attach)) {
		ret = PTR_ERR(m->attach);
		goto put;
	}
	dma_resv_lock(m->dmabuf->resv, NULL);
	ret = dma_buf_pin(m->attach);
	if (ret)
		goto unlock;
	m->pinned = true;
	sgt = dma_buf_map_attachment(m->attach, dir);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		goto unpin;
	}
	m->sgt = sgt;
	/* Wait for the exporter's pending moves before handing out addresses. */
	wait = dma_resv_wait_timeout(m->dmabuf->resv, DMA_RESV_USAGE_KERNEL, false,
				     MAX_SCHEDULE_TIMEOUT);
	if (wait < 0) {
		ret = wait;
		goto unpin;
	}
	dma_resv_unlock(m->dmabuf->resv);
	return m;

unpin:
	dmabuf_revoke_locked(m);
unlock:
	dma_resv_unlock(m->dmabuf->resv);
	dma_buf_detach(m->dmabuf, m->attach);
put:
	dma_buf_put(m->dmabuf);
	pci_dev_put(m->peer);
	kfree(m);
fail:
	*err = ret;
	return NULL;
}

/*
 * The mapped table, or NULL if a dma-buf was revoked. The caller keeps it
 * from being revoked meanwhile: p2pdma_helper_sgmap_lock() for dma-bufs.
 */
struct sg_table *p2pdma_helper_sgmap_table(struct p2pdma_sgmap *m)
{
	return m->sgt;
}

void *p2pdma_helper_sgmap_notify(struct p2pdma_sgmap *m)
{
	return m->notify;
}

void p2pdma_helper_sgmap_lock(struct p2pdma_sgmap *m)
{
	if (m->dmabuf)
		dma_resv_lock(m->dmabuf->resv, NULL);
}

void p2pdma_helper_sgmap_unlock(struct p2pdma_sgmap *m)
{
	if (m->dmabuf)
		dma_resv_unlock(m->dmabuf->resv);
}

void p2pdma_helper_sgmap_release(struct p2pdma_sgmap *m)
{
	if (m->dmabuf) {
		dma_resv_lock(m->dmabuf->resv, NULL);
		dmabuf_revoke_locked(m);
		dma_resv_unlock(m->dmabuf->resv);
		dma_buf_detach(m->dmabuf, m->attach);
		dma_buf_put(m->dmabuf);
	} else {
		dma_unmap_sgtable(&m->peer->dev, m->sgt, m->dir, 0);
		sg_free_table(m->sgt);
		if (m->pages) {
			/* The peer may have written the pages: keep the data. */
			unpin_user_pages_dirty_lock(m->pages, m->npages, m->dir != DMA_TO_DEVICE);
			kvfree(m->pages);
			uncharge_pinned(m);
		}
	}
	pci_dev_put(m->peer);
	kfree(m);
}

/* eventfds, for revocation notices. */
struct eventfd_ctx *p2pdma_helper_eventfd_get(int fd, int *err)
{
	struct eventfd_ctx *ctx = eventfd_ctx_fdget(fd);

	if (IS_ERR(ctx)) {
		*err = PTR_ERR(ctx) == -EINVAL ? -EBADF : PTR_ERR(ctx);
		return NULL;
	}
	return ctx;
}

void p2pdma_helper_eventfd_signal(struct eventfd_ctx *ctx)
{
	eventfd_signal(ctx);
}

void p2pdma_helper_eventfd_put(struct eventfd_ctx *ctx)
{
	eventfd_ctx_put(ctx);
}
