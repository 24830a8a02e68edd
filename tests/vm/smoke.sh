# shellcheck shell=sh
# The foundation suite: the module loads, binds the accelerator, registers its
# BAR as P2P memory and answers its ioctls; on the switch topology an
# O_DIRECT read from the NVMe lands in that memory (the host checks the bytes),
# and on the no-switch topology the kernel refuses it.
# shellcheck source=lib.sh
. /suite/lib.sh

check module-loads insmod /lib/modules/p2pdma.ko
check device-node test -c /dev/p2pdma
if dev=$(accel_dev); then
	pass accelerator-bound
else
	fail accelerator-bound "no device bound to the p2pdma driver"
fi
check bar-is-p2pmem test "$(cat "/sys/bus/pci/devices/$dev/p2pmem/size" 2>/dev/null || echo 0)" -gt 0
check p2pmem-published grep -qx 1 "/sys/bus/pci/devices/$dev/p2pmem/published"
check ctl-version p2pdma-ctl version
list=$(p2pdma-ctl list --json)
echo "$list"
case $list in
*"\"pci\":\"$dev\""*'"vendor":"1af4"'*) pass ctl-list-shows-accelerator ;;
*) fail ctl-list-shows-accelerator "list --json: $list" ;;
esac

# 1 MiB at an unaligned-to-MiB, 4 KiB-aligned offset of the namespace.
offset=$((3 * 1048576 + 5 * 4096))
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	check_held p2p-read p2pdma-vmtest p2pmem-read --nvme "$NVME" --offset $offset --len 1048576 --hold
	check_held p2p-read-module-memory p2pdma-vmtest module-read --nvme "$NVME" --offset $((offset + 2 * 1048576)) --len 2097152 --hold
	check_held p2p-read-skipped p2pdma-vmtest p2pmem-read --nvme "$NVME" --offset $((offset + 1048576)) --len 65536 --skip-read --hold
else
	check_fails p2p-read-refused p2pdma-vmtest p2pmem-read --nvme "$NVME" --offset $offset --len 1048576
	check_fails p2p-read-module-memory-refused p2pdma-vmtest module-read --nvme "$NVME" --offset $offset --len 1048576
	if dmesg | grep -q 'do not share an upstream bridge or whitelisted host bridge'; then
		pass p2p-refusal-reason-logged
	else
		fail p2p-refusal-reason-logged "no P2PDMA refusal in the kernel log"
	fi
fi

release_held
check module-unloads rmmod p2pdma
check device-node-gone test ! -e /dev/p2pdma
exit "$failures"
