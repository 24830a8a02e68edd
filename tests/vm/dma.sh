# shellcheck shell=sh
# The dma suite: a real device uses the DMA addresses the module returns.
#
# On the switch topology, p2pdma-dmacheck takes the rig's spare NVMe
# controller (serial p2pdma-vfio) from the nvme driver and drives it from
# user space through VFIO's no-IOMMU mode: queues, IDENTIFY data and PRP
# lists in accelerator memory (DMA_MAP), data to and from accelerator
# memory, pinned host memory (PIN_USER) and a udmabuf (DMABUF_IMPORT), every
# byte compared in the guest; the host then finds what was written in
# vfio.img. Then vfio-pci exports a page of the controller's BAR0 as a
# dma-buf (device memory, for importers that allow P2P and can be revoked):
# DMABUF_IMPORT for the accelerator and for the controller itself must give
# the BAR's bus address, and turning the controller's memory decoding off
# must revoke the imports (eventfd, HANDLE_STATE) until it is back on.
# Before that, and alone on the iommu topologies (where no-IOMMU
# VFIO is not available), P2P_QUERY and DMA_MAP must agree for the spare
# controller and for the rig's NVMe: NOT_SUPPORTED with EREMOTEIO, or the
# same map type. What the kernel answered is printed as @@NOTE lines.
# shellcheck source=lib.sh
. /suite/lib.sh

SERIAL=p2pdma-vfio

# dmacheck ARGS...: runs p2pdma-dmacheck, one check per "ok"/"FAIL" line,
# then checks its exit status and that its summary agrees with the lines.
dmacheck() {
	name=dmacheck-$1
	log=/tmp/$name.log
	run=
	timeout 5 true 2>/dev/null && run="timeout 300"
	$run p2pdma-dmacheck "$@" >"$log" 2>&1
	rc=$?
	oks=0 fails=0
	while IFS= read -r line; do
		case $line in
		"ok "*)
			pass "$1:${line#ok }"
			oks=$((oks + 1))
			;;
		"FAIL "*)
			rest=${line#FAIL }
			fail "$1:${rest%%: *}" "${rest#*: }"
			fails=$((fails + 1))
			;;
		*) echo "$line" ;;
		esac
	done <"$log"
	if [ $rc -eq 0 ]; then
		pass "$name-exit"
	else
		fail "$name-exit" "p2pdma-dmacheck $1 exited $rc: $(tail -n 1 "$log")"
	fi
	case $(tail -n 1 "$log") in
	"dmacheck: $oks passed, $fails failed") pass "$name-summary" ;;
	*) fail "$name-summary" "last line '$(tail -n 1 "$log")', with $oks ok and $fails FAIL lines" ;;
	esac
}

case $P2PDMA_TOPOLOGY in
switch | iommu | iommu-switch) ;;
*)
	fail dma-topology "the dma suite needs the spare controller of the switch or iommu topology, not $P2PDMA_TOPOLOGY"
	exit "$failures"
	;;
esac

check module-loads insmod /lib/modules/p2pdma.ko
# The other suites' namespace 1 is still the rig's controller's (the serial
# is padded with spaces to 20 characters).
check nsid-1-is-the-rig-controller grep -q '^p2pdma-rig *$' "/sys/class/nvme/$NVME_CTRL/serial"

if [ "$P2PDMA_TOPOLOGY" = switch ]; then
	dmacheck agree --serial $SERIAL --nvme "$NVME" --expect-map-type bus-addr
	# vfio.img holds the rig content from 128 MiB on (see tools/rig/vm.sh).
	# Linux 7.3 leaks the scatterlist of every mapping of a vfio-pci
	# dma-buf (dma_buf_phys_vec_to_sgt sets orig_nents to 0, so
	# dma_buf_free_sgt's sg_free_table frees nothing): with kmemleak (the
	# debug kernel) those imports are left out, or every run would report it.
	export_dmabuf=
	debug_kernel && export_dmabuf=--no-dmabuf-export
	# shellcheck disable=SC2086
	dmacheck vfio --serial $SERIAL --image vfio.img --image-pattern-offset $((128 << 20)) --expect-map-type bus-addr $export_dmabuf
	# Revocation with reads in flight: vfio-pci unbound from the
	# controller, then the accelerator holding its queues and data; each
	# unbind waits until the library has stopped the controller, and
	# nothing it was given changes afterwards (canaries in host and
	# accelerator memory, the BAR read through sysfs). Then the module
	# alone: a mapping for a controller whose device is still held stands
	# until vfio-pci's remove is over, and an accelerator's unbind waits
	# for the owner's unmap. Here, where no other suite's data waits in
	# the BAR for the host: the accelerator's unbind gives its memory back.
	# An imported dma-buf invalidated by its exporter with reads in flight:
	# vfio-pci exports the rig's third accelerator's BAR (this suite's
	# alone), the controller reads into it, and turning the accelerator's
	# memory decoding off revokes the import; vfio-pci waits until the
	# library has stopped the controller, and the bytes written after it
	# returned stay (the host checks accel2.bin). Not with kmemleak, for
	# the exporter's leak above.
	if [ -z "$export_dmabuf" ]; then
		check queues-revoke-dmabuf p2pdma-vmtest queues --step revoke-dmabuf --serial $SERIAL
	fi
	check queues-revoke-peer p2pdma-vmtest queues --step revoke-peer --serial $SERIAL
	check queues-revoke-accelerator p2pdma-vmtest queues --step revoke-accel --serial $SERIAL
	# The owner lets hundreds of mappings for the controller go (UNMAP,
	# and the close of a module file) as it releases the device to
	# vfio-pci's unbind: none may outlive the unbind (the debug kernel's
	# DMA-API checks count one that does).
	check queues-unmap-race p2pdma-vmtest queues --step unmap-race --serial $SERIAL
	# No-IOMMU VFIO taints the kernel; anything else in the log is checked
	# by the host.
	dmesg | grep -i -e vfio -e taint | tail -n 5
else
	dmacheck agree --serial $SERIAL --nvme "$NVME"
fi

check module-unloads rmmod p2pdma
check_kmemleak
exit "$failures"
