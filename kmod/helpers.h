/* SPDX-License-Identifier: GPL-2.0 */
/* The C helpers of the p2pdma module, called from ffi.rs. */
#ifndef P2PDMA_HELPERS_H
#define P2PDMA_HELPERS_H

#include <linux/mm_types.h>
#include <linux/pci.h>
#include <linux/types.h>

struct p2pdma_sgmap;
struct pid;

int p2pdma_helper_param_bar(void);
int p2pdma_helper_add_param_ids(const char *drv_name);
u32 p2pdma_helper_bar_kind(struct pci_dev *pdev, int bar);
u64 p2pdma_helper_bar_len(struct pci_dev *pdev, int bar);
u64 p2pdma_helper_bar_bus_addr(struct pci_dev *pdev, int bar);
void p2pdma_helper_location(struct pci_dev *pdev, u32 *domain, u8 *bus, u8 *devfn);
int p2pdma_helper_numa_node(struct pci_dev *pdev);
bool p2pdma_helper_capable_rawio(void);
struct pid *p2pdma_helper_current_tgid_get(void);
bool p2pdma_helper_is_current_tgid(struct pid *pid);
void p2pdma_helper_put_pid(struct pid *pid);
void *p2pdma_helper_alloc(struct pci_dev *pdev, size_t size);
void p2pdma_helper_put_pages(void *kaddr, size_t size);
u64 p2pdma_helper_virt_to_phys(void *kaddr);
unsigned long p2pdma_helper_vma_pgoff(struct vm_area_struct *vma);
bool p2pdma_helper_vma_shared(struct vm_area_struct *vma);
int p2pdma_helper_insert_pages(struct vm_area_struct *vma, void *kaddr, unsigned long npages);
struct address_space *p2pdma_helper_file_mapping(struct file *file);
void p2pdma_helper_zap(struct address_space *mapping, u64 offset, u64 len);
struct pci_dev *p2pdma_helper_peer_from_fd(int fd, int *err);
struct pci_dev *p2pdma_helper_peer_from_address(u32 domain, u8 bus, u8 devfn);
struct pci_dev *p2pdma_helper_common_upstream(struct pci_dev *a, struct pci_dev *b);
int p2pdma_helper_distance(struct pci_dev *provider, struct pci_dev *client);
u64 p2pdma_helper_map_resource(struct pci_dev *peer, u64 phys, u64 len, int *err);
void p2pdma_helper_unmap_resource(struct pci_dev *peer, u64 addr, u64 len);
struct p2pdma_sgmap *p2pdma_helper_pin_user(struct pci_dev *peer, u64 va, u64 len, int *err);
struct p2pdma_sgmap *p2pdma_helper_dmabuf_import(struct pci_dev *peer, int fd, int *err);
u64 p2pdma_helper_sgmap_len(struct p2pdma_sgmap *m);
unsigned int p2pdma_helper_sgmap_segs(struct p2pdma_sgmap *m, u64 *addrs, u64 *lens, unsigned int max);
void p2pdma_helper_sgmap_release(struct p2pdma_sgmap *m);

#endif /* P2PDMA_HELPERS_H */
