/* SPDX-License-Identifier: GPL-2.0 */
/* The C glue of the p2pdma module (see helpers.c), called from the ffi/
 * modules. */
#ifndef P2PDMA_HELPERS_H
#define P2PDMA_HELPERS_H

#include <linux/mm_types.h>
#include <linux/pci.h>
#include <linux/types.h>

struct block_device;
struct dma_resv;
struct file;
struct pid;
struct scatterlist;

int p2pdma_helper_param_bar(void);
unsigned int p2pdma_helper_param_user_share(void);
const char *p2pdma_helper_param_id(unsigned int i);
u32 p2pdma_helper_bar_kind(struct pci_dev *pdev, int bar);
u64 p2pdma_helper_bar_bus_addr(struct pci_dev *pdev, int bar);
void p2pdma_helper_location(struct pci_dev *pdev, u32 *domain, u8 *bus, u8 *devfn);
int p2pdma_helper_numa_node(struct pci_dev *pdev);
unsigned int p2pdma_helper_max_seg_size(struct pci_dev *pdev);
u32 p2pdma_helper_current_uid(void);
struct pid *p2pdma_helper_current_tgid_get(void);
bool p2pdma_helper_is_current_tgid(struct pid *pid);
void *p2pdma_helper_alloc(struct pci_dev *pdev, size_t size);
void p2pdma_helper_put_pages(void *kaddr, size_t size);
struct page *p2pdma_helper_virt_to_page(void *kaddr);
void p2pdma_helper_vma_writecombine(struct vm_area_struct *vma);
bool p2pdma_helper_fatal_signal_pending(void);

/* What block I/O on a block device must respect. */
struct p2pdma_bdev_facts {
	bool readable;		/* opened for reading */
	bool writable;		/* opened for writing */
	bool read_only;		/* the device is read-only */
	bool p2pdma;		/* its driver maps P2P memory */
	bool swap;		/* an active swap device */
	bool sync;		/* O_DSYNC, O_SYNC or a sync inode */
	u32 logical_block_size;
	u32 dma_alignment;	/* a mask */
	u64 size;		/* bytes */
	u32 dev;		/* its device number */
};

struct block_device *p2pdma_helper_file_bdev(struct file *file);
struct block_device *p2pdma_helper_io_bdev(struct file *file, struct p2pdma_bdev_facts *f);
void p2pdma_helper_io_notify(struct file *file, bool write);
struct pci_dev *p2pdma_helper_upstream_bridge(struct pci_dev *pdev);
unsigned long p2pdma_helper_page_to_pfn(struct page *page);
struct page *p2pdma_helper_sg_page(struct scatterlist *sg);
struct scatterlist *p2pdma_helper_sg_next(struct scatterlist *sg);
bool p2pdma_helper_sg_is_bus_addr(struct scatterlist *sg);
unsigned long p2pdma_helper_memlock_limit(void);
struct mm_struct *p2pdma_helper_current_mm(void);
void p2pdma_helper_resv_assert_held(struct dma_resv *resv);

#endif /* P2PDMA_HELPERS_H */
