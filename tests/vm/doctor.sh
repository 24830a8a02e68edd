# shellcheck shell=sh
# The doctor suite: `p2pdma-ctl doctor` on the VM's NVMe namespace and
# accelerator finds the module, the accelerator and NVMe storage, and chooses
# P2P on the switch topology; on the no-switch topology it chooses the bounce
# pipeline and quotes the kernel's refusal. After unloading, the missing
# module is the reason.
# shellcheck source=lib.sh
. /suite/lib.sh

# has_json NAME PATTERN: passes when the last report matches PATTERN (grep).
has_json() {
	if echo "$json" | grep -q -- "$2"; then
		pass "$1"
	else
		fail "$1" "no match for '$2' in the report"
	fi
}

check module-loads insmod /lib/modules/p2pdma.ko

json=$(p2pdma-ctl doctor "$NVME" --dev 0 --json 2>&1)
rc=$?
echo "$json"
if [ $rc -eq 0 ]; then
	pass doctor-exits-0
else
	fail doctor-exits-0 "p2pdma-ctl doctor exited $rc"
fi
has_json doctor-kernel-config '"detail":"CONFIG_PCI_P2PDMA=y[^"]*/proc/config.gz)","name":"kernel config","status":"ok"'
has_json doctor-device-node '"name":"device node","status":"ok"'
has_json doctor-accelerator '"name":"accelerator","status":"ok"'
has_json doctor-p2p-memory '"name":"p2p memory","status":"ok"'
has_json doctor-storage-is-nvme '"name":"storage","status":"ok"'
has_json doctor-storage-controller '"controller":"nvme0"'
has_json doctor-storage-generic "\"generic_path\":\"$NVME_NG\""

if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	has_json doctor-chooses-p2p '"path":"p2p"'
	has_json doctor-p2p-check '"name":"p2p","status":"ok"'
	has_json doctor-p2p-by-bus-address '"map_type":"bus-addr"'
else
	has_json doctor-chooses-bounce '"path":"bounce"'
	has_json doctor-p2p-check-fails '"name":"p2p","status":"fail"'
	has_json doctor-quotes-kernel-reason '"reason":"P2P not possible: [^"]*do not share an upstream bridge or whitelisted host bridge'
fi

# A file on the ext4 filesystem of the second namespace: the same storage
# facts, through the filesystem to its namespace.
mount_rigfs
json=$(p2pdma-ctl doctor /mnt/data.bin --dev 0 --json 2>&1)
echo "$json"
has_json doctor-file-storage-is-nvme '"name":"storage","status":"ok"'
has_json doctor-file-generic "\"generic_path\":\"$FSDEV_NG\""
has_json doctor-file-nvme-cmd '"detail":"[^"]*for a file (ext4), its extents are mapped to blocks with FIEMAP first","name":"nvme passthrough","status":"ok"'
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	has_json doctor-file-chooses-p2p '"path":"p2p"'
else
	has_json doctor-file-chooses-bounce '"path":"bounce"'
fi
umount_rigfs

# The text report: a table, then the path.
text=$(p2pdma-ctl doctor "$NVME" --dev 0 2>&1)
echo "$text"
case $text in
"CHECK "*"path: "*) pass doctor-text-report ;;
*) fail doctor-text-report "no table and path in the text report" ;;
esac

# A partition-less namespace listed with the accelerator as a P2P memory
# provider.
list=$(p2pdma-ctl list --all 2>&1)
echo "$list"
case $list in
*"$NVME: namespace 1 of nvme0 at "*"p2pmem providers:"*"driver p2pdma"*) pass list-all ;;
*) fail list-all "namespace or provider missing from list --all" ;;
esac

check module-unloads rmmod p2pdma

json=$(p2pdma-ctl doctor "$NVME" --json 2>&1)
rc=$?
echo "$json"
if [ $rc -eq 0 ]; then
	pass doctor-without-module-exits-0
else
	fail doctor-without-module-exits-0 "p2pdma-ctl doctor exited $rc"
fi
has_json doctor-without-module-bounces '"path":"bounce"'
has_json doctor-without-module-says-so '"reason":"P2P not possible: the p2pdma kernel module is not available'
exit "$failures"
