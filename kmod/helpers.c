// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers for the p2pdma module: the kernel facilities Rust cannot reach
 * (static inline functions, macros, module_param_array). Each is wrapped by
 * a safe function in ffi.rs; nothing else in the module calls these.
 */

#include <linux/blkdev.h>
#include <linux/capability.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/file.h>
#include <linux/kernel.h>
#include <linux/memremap.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/percpu-refcount.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

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

int p2pdma_helper_param_bar(void)
{
	return bar;
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

/* What kind of BAR @bar is, as P2PDMA_BAR_* bits (see ffi.rs). */
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

u64 p2pdma_helper_bar_len(struct pci_dev *pdev, int bar)
{
	return pci_resource_len(pdev, bar);
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

bool p2pdma_helper_capable_rawio(void)
{
	return capable(CAP_SYS_RAWIO);
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
 * P2P memory pages. The kernel's P2PDMA core returns a page to its pool when
 * the page's refcount drops to zero (p2pdma_folio_free), dropping one
 * reference on the pagemap per page. An allocation here therefore holds one
 * page reference and one pagemap reference per page, exactly like the pages
 * the core's own sysfs "allocate" file hands to user space: user mappings,
 * pins and the allocation each hold their own page references, and the
 * memory returns to the pool when the last of them is gone.
 */
void *p2pdma_helper_alloc(struct pci_dev *pdev, size_t size)
{
	void *kaddr = pci_alloc_p2pmem(pdev, size);
	struct percpu_ref *ref;
	size_t off;

	if (!kaddr)
		return NULL;
	ref = &page_pgmap(virt_to_page(kaddr))->ref;
	for (off = 0; off < size; off += PAGE_SIZE) {
		set_page_count(virt_to_page(kaddr + off), 1);
		percpu_ref_get(ref);
	}
	/* Drop the reference pci_alloc_p2pmem() took for the whole range. */
	percpu_ref_put(ref);
	return kaddr;
}

/* Drops the allocation's reference on each page of [kaddr, kaddr + size). */
void p2pdma_helper_put_pages(void *kaddr, size_t size)
{
	size_t off;

	for (off = 0; off < size; off += PAGE_SIZE)
		put_page(virt_to_page(kaddr + off));
}

u64 p2pdma_helper_virt_to_phys(void *kaddr)
{
	return page_to_phys(virt_to_page(kaddr)) + offset_in_page(kaddr);
}

unsigned long p2pdma_helper_vma_pgoff(struct vm_area_struct *vma)
{
	return vma->vm_pgoff;
}

bool p2pdma_helper_vma_shared(struct vm_area_struct *vma)
{
	return vma->vm_flags & VM_MAYSHARE;
}

/*
 * Maps @npages pages of P2P memory at @kaddr write-combined into @vma from
 * its start. On error the caller's mmap fails and the core unmaps whatever
 * was inserted.
 */
int p2pdma_helper_insert_pages(struct vm_area_struct *vma, void *kaddr, unsigned long npages)
{
	unsigned long i;
	int ret;

	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	for (i = 0; i < npages; i++) {
		ret = vm_insert_page(vma, vma->vm_start + i * PAGE_SIZE,
				     virt_to_page(kaddr + i * PAGE_SIZE));
		if (ret)
			return ret;
	}
	return 0;
}

struct address_space *p2pdma_helper_file_mapping(struct file *file)
{
	return file->f_mapping;
}

/* Removes every user mapping of [offset, offset + len) of @mapping. */
void p2pdma_helper_zap(struct address_space *mapping, u64 offset, u64 len)
{
	unmap_mapping_range(mapping, offset, len, 1);
}

/*
 * The PCI function behind an open block device: the first PCI device among
 * the block device's ancestors (for NVMe: namespace -> controller -> PCI
 * function). Returns it with a reference held, or NULL with *err set.
 */
struct pci_dev *p2pdma_helper_peer_from_fd(int fd, int *err)
{
	struct file *file = fget(fd);
	struct block_device *bdev;
	struct device *dev;
	struct pci_dev *pdev = NULL;

	if (!file) {
		*err = -EBADF;
		return NULL;
	}
	bdev = S_ISBLK(file_inode(file)->i_mode) ? file_bdev(file) : NULL;
	if (!bdev) {
		*err = -ENOTBLK;
		goto out;
	}
	for (dev = &bdev->bd_device; dev; dev = dev->parent) {
		if (dev_is_pci(dev)) {
			pdev = pci_dev_get(to_pci_dev(dev));
			break;
		}
	}
	if (!pdev)
		*err = -ENXIO;
out:
	fput(file);
	return pdev;
}

struct pci_dev *p2pdma_helper_peer_from_address(u32 domain, u8 bus, u8 devfn)
{
	return pci_get_domain_bus_and_slot(domain, bus, devfn);
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

int p2pdma_helper_distance(struct pci_dev *provider, struct pci_dev *client)
{
	struct device *dev = &client->dev;

	return pci_p2pdma_distance_many(provider, &dev, 1, false);
}

u64 p2pdma_helper_map_resource(struct pci_dev *peer, u64 phys, u64 len, int *err)
{
	dma_addr_t addr = dma_map_resource(&peer->dev, phys, len, DMA_BIDIRECTIONAL, 0);

	*err = dma_mapping_error(&peer->dev, addr) ? -EIO : 0;
	return addr;
}

void p2pdma_helper_unmap_resource(struct pci_dev *peer, u64 addr, u64 len)
{
	dma_unmap_resource(&peer->dev, addr, len, DMA_BIDIRECTIONAL, 0);
}

/*
 * A scatter-gather DMA mapping for a peer: pinned user pages, or an
 * attached dma-buf.
 */
struct p2pdma_sgmap {
	struct pci_dev *peer;
	struct sg_table sgt_own;	/* pinned pages */
	struct sg_table *sgt;
	struct page **pages;
	unsigned long npages;
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
};

struct p2pdma_sgmap *p2pdma_helper_pin_user(struct pci_dev *peer, u64 va, u64 len, int *err)
{
	struct p2pdma_sgmap *m;
	long pinned;
	int ret;

	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m) {
		*err = -ENOMEM;
		return NULL;
	}
	m->npages = len >> PAGE_SHIFT;
	m->pages = kvmalloc_array(m->npages, sizeof(*m->pages), GFP_KERNEL);
	if (!m->pages) {
		ret = -ENOMEM;
		goto free_m;
	}
	pinned = pin_user_pages_fast(va, m->npages, FOLL_WRITE | FOLL_LONGTERM, m->pages);
	if (pinned < 0) {
		ret = pinned;
		goto free_pages;
	}
	if (pinned != m->npages) {
		unpin_user_pages(m->pages, pinned);
		ret = -EFAULT;
		goto free_pages;
	}
	ret = sg_alloc_table_from_pages(&m->sgt_own, m->pages, m->npages, 0, len, GFP_KERNEL);
	if (ret)
		goto unpin;
	ret = dma_map_sgtable(&peer->dev, &m->sgt_own, DMA_BIDIRECTIONAL, 0);
	if (ret)
		goto free_table;
	m->sgt = &m->sgt_own;
	m->peer = pci_dev_get(peer);
	return m;

free_table:
	sg_free_table(&m->sgt_own);
unpin:
	unpin_user_pages(m->pages, m->npages);
free_pages:
	kvfree(m->pages);
free_m:
	kfree(m);
	*err = ret;
	return NULL;
}

struct p2pdma_sgmap *p2pdma_helper_dmabuf_import(struct pci_dev *peer, int fd, int *err)
{
	struct p2pdma_sgmap *m;
	struct sg_table *sgt;
	int ret;

	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m) {
		*err = -ENOMEM;
		return NULL;
	}
	m->dmabuf = dma_buf_get(fd);
	if (IS_ERR(m->dmabuf)) {
		ret = PTR_ERR(m->dmabuf) == -EINVAL ? -EBADF : PTR_ERR(m->dmabuf);
		goto free_m;
	}
	m->attach = dma_buf_attach(m->dmabuf, &peer->dev);
	if (IS_ERR(m->attach)) {
		ret = PTR_ERR(m->attach);
		goto put;
	}
	sgt = dma_buf_map_attachment_unlocked(m->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		goto detach;
	}
	m->sgt = sgt;
	m->peer = pci_dev_get(peer);
	return m;

detach:
	dma_buf_detach(m->dmabuf, m->attach);
put:
	dma_buf_put(m->dmabuf);
free_m:
	kfree(m);
	*err = ret;
	return NULL;
}

/* Total DMA length of @m. */
u64 p2pdma_helper_sgmap_len(struct p2pdma_sgmap *m)
{
	struct scatterlist *sg;
	u64 total = 0;
	unsigned int i;

	for_each_sgtable_dma_sg(m->sgt, sg, i)
		total += sg_dma_len(sg);
	return total;
}

/*
 * Writes the DMA segments of @m into @addrs/@lens (at most @max of them,
 * merging contiguous ones) and returns how many there are in all.
 */
unsigned int p2pdma_helper_sgmap_segs(struct p2pdma_sgmap *m, u64 *addrs, u64 *lens, unsigned int max)
{
	struct scatterlist *sg;
	unsigned int i, n = 0;

	for_each_sgtable_dma_sg(m->sgt, sg, i) {
		u64 a = sg_dma_address(sg), l = sg_dma_len(sg);

		if (n && n <= max && addrs[n - 1] + lens[n - 1] == a) {
			lens[n - 1] += l;
			continue;
		}
		if (n < max) {
			addrs[n] = a;
			lens[n] = l;
		}
		n++;
	}
	return n;
}

void p2pdma_helper_sgmap_release(struct p2pdma_sgmap *m)
{
	if (m->dmabuf) {
		dma_buf_unmap_attachment_unlocked(m->attach, m->sgt, DMA_BIDIRECTIONAL);
		dma_buf_detach(m->dmabuf, m->attach);
		dma_buf_put(m->dmabuf);
	} else {
		dma_unmap_sgtable(&m->peer->dev, m->sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(m->sgt);
		unpin_user_pages(m->pages, m->npages);
		kvfree(m->pages);
	}
	pci_dev_put(m->peer);
	kfree(m);
}
