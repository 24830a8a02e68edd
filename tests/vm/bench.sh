# shellcheck shell=sh
# Benchmarks in the VM (not tests): guest CPU time per GiB moved from the
# NVMe into accelerator memory on each path. Emulated device DMA runs in
# QEMU, outside the guest, so guest CPU time measures CPU involvement. Then
# small-copy latency into the accelerator's write-combined BAR mapping (TCG
# emulates the CPU, so these are the emulator's, not hardware, timings).
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
check bench-cpu p2pdma-ctl bench cpu --nvme "$NVME" --size 48M --reps 3
check bench-copy p2pdma-ctl bench copy
rmmod p2pdma
exit "$failures"
