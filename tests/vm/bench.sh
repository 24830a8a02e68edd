# shellcheck shell=sh
# Benchmarks in the VM (not tests): guest CPU time per GiB moved from the
# NVMe into accelerator memory on each path. Emulated device DMA runs in
# QEMU, outside the guest, so guest CPU time measures CPU involvement. Then
# small-copy latency into the accelerator's write-combined BAR mapping, and
# small random reads through the engine against pread (TCG emulates the CPU,
# so these are the emulator's, not hardware, timings).
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
check bench-cpu p2pdma-ctl bench cpu --nvme "$NVME" --size 48M --reps 36
check bench-copy p2pdma-ctl bench copy
# 4 KiB random reads of the NVMe namespace into BAR memory: the engine (AUTO
# picks P2P here) against pread with O_DIRECT plus a copy.
check bench-small p2pdma-ctl bench small --file "$NVME" --size 48M --reps 2
rmmod p2pdma
exit "$failures"
