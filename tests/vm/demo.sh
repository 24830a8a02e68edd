# The main job: load the module and read 4 MiB at an offset of the NVMe
# namespace into accelerator memory by P2P DMA; the host then checks the bytes
# in the accelerator's backing file against the NVMe image.
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
p2pdma-ctl list
check_held p2p-read p2pdma-vmtest p2pmem-read --offset $((8 * 1048576 + 4096)) --len $((4 * 1048576)) --hold
release_held
exit $failures
