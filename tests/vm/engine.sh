# The library's transfer engine against the real module and NVMe driver:
# AUTO picks P2P on the switch topology and the bounce pipeline (with the
# kernel's reason) on the no-switch one; forced paths, unaligned heads and
# tails, writes with read-modify-write, and P2P failures retried on the
# bounce path. The host checks every byte in the BAR's backing file and in
# the NVMe image.
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
M=1048576
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	check_held auto-read-p2p p2pdma-vmtest engine-read --offset $((16 * M)) --len $((4 * M)) --expect-path p2p --hold
	check_held auto-read-p2p-unaligned p2pdma-vmtest engine-read --offset $((20 * M + 12345)) --len $((M + 777)) --mem-offset 57 --expect-path p2p --hold
	check_held forced-bounce-read p2pdma-vmtest engine-read --path bounce --offset $((24 * M + 4096)) --len $((2 * M)) --expect-path bounce --hold
	check_held p2p-misaligned-retried p2pdma-vmtest engine-read --path p2p --offset $((26 * M)) --len $((M / 2)) --mem-offset 100 --expect-path bounce --expect-retry --hold
	check_held nvme-cmd-read p2pdma-vmtest engine-read --path nvme-cmd --offset $((28 * M)) --len $((3 * M)) --expect-path nvme-cmd --hold
	check_held nvme-cmd-read-unaligned p2pdma-vmtest engine-read --path nvme-cmd --offset $((32 * M + 999)) --len $((M + 5)) --mem-offset 999 --expect-path nvme-cmd --hold
	check nvme-cmd-write p2pdma-vmtest engine-write --path nvme-cmd --offset $((52 * M + 512)) --len $((M + 4096)) --mem-offset 512 --pattern-offset $((13 * M)) --expect-path nvme-cmd
	check auto-write-p2p p2pdma-vmtest engine-write --offset $((40 * M + 300)) --len $((M + 1000)) --mem-offset 300 --pattern-offset $((5 * M + 8)) --expect-path p2p
	check forced-bounce-write p2pdma-vmtest engine-write --path bounce --offset $((48 * M)) --len $((2 * M)) --pattern-offset $((9 * M)) --expect-path bounce
else
	check_held auto-read-bounce p2pdma-vmtest engine-read --offset $((16 * M)) --len $((4 * M)) --expect-path bounce --hold
	check_held forced-p2p-refused-retried p2pdma-vmtest engine-read --path p2p --offset $((24 * M)) --len $M --expect-path bounce --expect-retry --hold
	check_held nvme-cmd-refused-retried p2pdma-vmtest engine-read --path nvme-cmd --offset $((28 * M)) --len $M --expect-path bounce --expect-retry --hold
	check auto-write-bounce p2pdma-vmtest engine-write --offset $((40 * M + 300)) --len $((M + 1000)) --mem-offset 300 --pattern-offset $((5 * M + 8)) --expect-path bounce
	out=$(p2pdma-vmtest engine-read --offset 0 --len 4096 --expect-path bounce 2>&1)
	case $out in
	*"do not share an upstream bridge or whitelisted host bridge"*) pass auto-reason-is-the-kernels ;;
	*) fail auto-reason-is-the-kernels "$out" ;;
	esac
fi
check ctl-copy-verify p2pdma-ctl copy /dev/nvme0n1 accel --offset $((8 * M + 4096)) --len $((16 * M)) --verify
release_held
check module-unloads rmmod p2pdma
exit $failures
