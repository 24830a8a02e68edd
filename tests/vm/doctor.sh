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
has_json doctor-storage-controller "\"controller\":\"$NVME_CTRL\""
has_json doctor-storage-generic "\"generic_path\":\"$NVME_NG\""

# The queues path: with VFIO's no-IOMMU mode on, the library can take a
# controller from the nvme driver when asked; behind the IOMMU it cannot,
# and the check says why (type1 cannot map P2P pages).
if [ "$P2PDMA_TOPOLOGY" = iommu ]; then
	has_json doctor-queues-iommu-says-why '"detail":"[^"]*behind an IOMMU (group [0-9]*)[^"]*FOLL_PCI_P2PDMA[^"]*","name":"nvme queues","status":"skip"'
else
	has_json doctor-queues-can-take '"detail":"[^"]*(nvme, no IOMMU, VFIO no-IOMMU mode on)[^"]*can take [^"]* from the nvme driver when asked to[^"]*","name":"nvme queues","status":"ok"'
fi
if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	has_json doctor-chooses-p2p '"path":"p2p"'
	has_json doctor-p2p-check '"name":"p2p","status":"ok"'
	has_json doctor-p2p-by-bus-address '"map_type":"bus-addr"'

	# The multipath namespace: the doctor asks for both paths, chooses P2P
	# with the reason naming them, and agrees with the engine word for word.
	MP=$(ns_dev 3)
	mp1=$(mp_paths "$MP" | sed -n 1p) mp2=$(mp_paths "$MP" | sed -n 2p)
	json=$(p2pdma-ctl doctor "$MP" --dev 0 --json 2>&1)
	echo "$json"
	has_json doctor-mp-storage "\"detail\":\"$MP is disk ${MP#/dev/}, namespace 3, a multipath namespace with 2 paths: ${mp1#path }, ${mp2#path }; [^\"]*\",\"name\":\"storage\",\"status\":\"ok\""
	has_json doctor-mp-p2p-check "\"detail\":\"${MP#/dev/} is a multipath namespace with 2 paths, all asked [^\"]*: $mp1: kernel: [^\"]*(bus-addr, distance [0-9]*); $mp2: kernel: [^\"]*(bus-addr, distance [0-9]*)\",\"name\":\"p2p\",\"status\":\"ok\""
	has_json doctor-mp-chooses-p2p "\"path\":\"p2p\",\"reason\":\"P2P on every path of the multipath namespace, since I/O may take any of them; $mp1: P2P by PCI bus address"
	doctor_why=$(echo "$json" | json_reason)
	engine_why=$(p2pdma-vmtest engine-read --nvme "$MP" --offset 0 --len 4096 --expect-path p2p 2>&1 | why_of)
	# The engine's reason is the doctor's, then how it submits the I/O.
	case $engine_why in
	"$doctor_why" | "$doctor_why; "*) agrees=yes ;;
	*) agrees= ;;
	esac
	if [ -n "$doctor_why" ] && [ -n "$agrees" ]; then
		pass doctor-mp-agrees-with-engine
	else
		fail doctor-mp-agrees-with-engine "doctor: '$doctor_why'; engine: '$engine_why'"
	fi

	# The namespace with metadata: NVMe commands refused with the reason,
	# P2P chosen.
	MD=$(ns_dev 4)
	json=$(p2pdma-ctl doctor "$MD" --dev 0 --json 2>&1)
	echo "$json"
	has_json doctor-md-nvme-cmd-refused "\"detail\":\"NVMe commands through /dev/ng${MD#/dev/nvme} refused: ${MD#/dev/} is formatted with 8 bytes of metadata per block: the library's NVMe commands carry no metadata buffer [^\"]*\",\"name\":\"nvme passthrough\",\"status\":\"warn\""
	has_json doctor-md-chooses-p2p '"path":"p2p","reason":"P2P by PCI bus address'
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
has_json doctor-file-nvme-cmd '"detail":"[^"]*for a file (ext4), reads only (writes to files go by P2P or the bounce path): its extents are mapped to blocks with FIEMAP first","name":"nvme passthrough","status":"ok"'
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
*"$NVME: namespace 1 of $NVME_CTRL at "*"p2pmem providers:"*"driver p2pdma"*) pass list-all ;;
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
