# shellcheck shell=sh
# The main job: load the module, ask the doctor whether the NVMe and the
# accelerator can talk by P2P, then read 4 MiB at an offset of the NVMe
# namespace into accelerator memory with the library's transfer engine (AUTO
# picks P2P here); the host then checks the bytes in the accelerator's
# backing file against the NVMe image.
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
p2pdma-ctl list
p2pdma-ctl doctor "$NVME" --dev 0
check_held p2p-read p2pdma-vmtest engine-read --nvme "$NVME" --offset $((8 * 1048576 + 4096)) --len $((4 * 1048576)) --expect-path p2p --hold
release_held
exit "$failures"
