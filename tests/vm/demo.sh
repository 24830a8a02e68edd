# shellcheck shell=sh
# The main job: load the module, ask the doctor whether the NVMe and the
# accelerator can talk by P2P, then read 4 MiB at an offset of the NVMe
# namespace into accelerator memory with the library's transfer engine (AUTO
# picks P2P here); the host then checks the bytes in the accelerator's
# backing file against the NVMe image. The story is told in @@SAY lines,
# which the host prints.
# shellcheck source=lib.sh
. /suite/lib.sh

M=1048576
offset=$((8 * M + 4096))

check module-loads insmod /lib/modules/p2pdma.ko
say "The p2pdma module is loaded; the accelerators it drives (p2pdma-ctl list):"
say_output p2pdma-ctl list
say ""
say "The doctor's report: can $NVME (namespace 1 of the emulated NVMe SSD) and"
say "accelerator 0 move data by P2P DMA, and if not, why? (p2pdma-ctl doctor $NVME --dev 0)"
say_output p2pdma-ctl doctor "$NVME" --dev 0
say ""
say "The library's transfer engine now reads 4 MiB at offset $offset of $NVME"
say "into accelerator 0's memory, leaving the choice of path to AUTO:"
check_held p2p-read p2pdma-vmtest engine-read --nvme "$NVME" --offset $offset --len $((4 * M)) --expect-path p2p --hold
say_output held_output p2p-read
release_held
exit "$failures"
