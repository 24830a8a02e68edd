// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers for the p2pdma module: the kernel facilities Rust cannot reach
 * (static inline functions, macros, module_param_array). Each is wrapped by
 * a safe function in ffi.rs; nothing else in the module calls these.
 */

#include <linux/device.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/pci.h>

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
