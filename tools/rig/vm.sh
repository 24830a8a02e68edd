#!/usr/bin/env bash
# Boots the rig VM once and runs a guest suite in it, then runs the host-side
# checks of what landed in the emulated devices.
#
#   vm.sh [--topology switch|noswitch|iommu|iommu-switch] [--suite NAME]
#         [--timeout S] [--out DIR]
#
# The machine: q35 (TCG). Topology "switch": a PCIe switch (x3130 upstream,
# two xio3130 downstream ports) with the NVMe on one port and the
# accelerator stand-in (ivshmem-plain over a host file) on the other, so the
# kernel allows P2P; two more NVMe controllers of one NVMe subsystem on two
# more ports of the switch share a namespace (NSID 3, native multipath: the
# guest sees one namespace head with two paths), and the first controller
# has a namespace formatted with 8 bytes of metadata (protection
# information) per block (NSID 4). One more controller on its own port of
# the switch (serial p2pdma-vfio, NSID 7, image vfio.img, and NSID 8 with
# 4 KiB blocks, image vfio4k.img; its largest transfer, MDTS, is 128 KiB) is
# for the dma suite, which takes it from the kernel's nvme driver and drives
# it from user space through VFIO; the other suites find their namespaces
# by NSID and never pick it. One more controller, alone in an NVMe
# subsystem of its own (serial p2pdma-events, NSID 9, image events.img),
# lets a driver detach and attach its namespace (Namespace Attachment),
# which the controller announces with a Namespace Attribute Changed event.
# A second accelerator stand-in (64 MiB, accel1.bin) sits on
# a root port of its own, where P2P reaches neither the NVMe nor the first
# accelerator: routes between them go through host memory. In the dma suite
# a third (16 MiB, accel2.bin) sits on one more port of the switch. In the
# arrays and bench suites, md arrays' members: four controllers on four more
# ports of the switch (serials p2pdma-m0 to p2pdma-m3, NSIDs 10 to 13,
# images m0.img to m3.img), one with a bad block on one more port (serial
# p2pdma-mbad, NSID 15, mbad.img: reads of its byte 60 MiB fail), and one
# on a root port of its own, outside the switch, where P2P does not reach
# (serial p2pdma-out, NSID 14, out.img). Topology
# "noswitch": each device on its own root port,
# meeting only at the q35 host bridge, which the kernel refuses for P2P.
# Those two run with VFIO's no-IOMMU mode allowed. Topology "iommu": the
# switch topology behind an emulated Intel IOMMU (VT-d), turned on by the
# guest's command line, so every device DMA is translated (the same kernel,
# no other build); but the accelerator sits on its own root port, where the
# kernel refuses P2P, so the suites see it fall back to the bounce path
# through the IOMMU. Topology "iommu-switch" keeps the accelerator under the
# switch: the kernel then allows P2P by bus address (QEMU 7.2's switch ports
# have no ACS), but QEMU sends every device DMA through its IOMMU, also the
# P2P that a real switch routes directly, and the IOMMU faults it: the
# controller completes the command and the bytes never land. Only the dma
# suite's agreement check means anything there; it is not part of `test`.
#
# Prints one "PASS name" / "FAIL name: why" line per check and a closing
# "N passed, N failed" line; exits non-zero on any failure or timeout.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

topology=switch suite=smoke timeout=${P2PDMA_VM_TIMEOUT:-300} out=
while (($#)); do
	case $1 in
	--topology) topology=$2; shift 2 ;;
	--suite) suite=$2; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	*) die "unknown argument $1" ;;
	esac
done
case $topology in switch | noswitch | iommu | iommu-switch) ;; *) die "unknown topology $topology" ;; esac
suite_file="$P2PDMA_ROOT/tests/vm/$suite.sh"
[ -f "$suite_file" ] || die "no guest suite $suite_file"
out=${out:-$P2PDMA_ROOT/rig-out/$suite-$topology}

# The module is always (re)built against the kernel that boots, so a .ko
# left over from another kernel never gets loaded.
if [ -n "${P2PDMA_BUILT_TREE:-}" ]; then
	export P2PDMA_KERNEL_TREE=$P2PDMA_BUILT_TREE
fi
tree=$("$P2PDMA_ROOT/tools/rig/build.sh")
musl="$P2PDMA_ROOT/target/x86_64-unknown-linux-musl/release"
kofile="$P2PDMA_ROOT/kmod/p2pdma.ko"
[ -f "$kofile" ] || die "no $kofile; run tools/rig/build.sh"

rm -rf "$out"
mkdir -p "$out/initramfs"/{bin,sbin,proc,sys,dev,tmp,suite,lib/modules}
ir="$out/initramfs"

# The guest: busybox, the module, our programs and the suite.
cp /bin/busybox "$ir/bin/busybox"
cp "$kofile" "$ir/lib/modules/"
for b in p2pdma-ctl p2pdma-vmtest p2pdma-dmacheck; do
	cp "$musl/$b" "$ir/bin/"
	strip "$ir/bin/$b" 2>/dev/null || true
done
cp "$P2PDMA_ROOT"/tests/vm/lib.sh "$suite_file" "$ir/suite/"
# The Python suite carries an interpreter and the binding.
if [ "$suite" = python ]; then
	cp "$P2PDMA_ROOT"/tests/vm/python_checks.py "$ir/suite/"
	"$P2PDMA_ROOT/tools/rig/guest-python.sh" "$ir"
fi
# The arrays suite builds md arrays and file systems on them, and reads
# them through the Python binding, the C API and the cuFile library; the
# bench suite builds arrays too, and measures them against fio.
if [ "$suite" = arrays ]; then
	"$P2PDMA_ROOT/tools/rig/guest-tools.sh" "$ir"
	cp "$P2PDMA_ROOT"/tests/vm/arrays_checks.py "$ir/suite/"
	"$P2PDMA_ROOT/tools/rig/guest-python.sh" "$ir" libs
elif [ "$suite" = bench ]; then
	"$P2PDMA_ROOT/tools/rig/guest-tools.sh" "$ir" fio
fi
# The fabrics suite reaches the namespaces of a second machine, the storage
# machine (tools/rig/target.sh), over NVMe/TCP, with nvme-cli in the guest
# and fio to measure the remote namespace against; both machines get the
# NQNs and the host's secret.
if [ "$suite" = fabrics ]; then
	"$P2PDMA_ROOT/tools/rig/guest-tools.sh" "$ir" nvme fio
	# shellcheck source=target.sh
	source "$P2PDMA_ROOT/tools/rig/target.sh"
	fabric_setup
	cp -r "$out/target/initramfs/suite/fabric" "$ir/suite/"
fi
mkdir -p "$ir/tests"
for t in "$P2PDMA_ROOT"/target/guest-tests/*; do
	cp "$t" "$ir/tests/"
	strip "$ir/tests/$(basename "$t")" 2>/dev/null || true
done
cat >"$ir/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug
export P2PDMA_TOPOLOGY=$topology PATH=/bin:/sbin
# The boot log, then an empty ring buffer: what the kernel says from here on
# happens while the project's code runs.
echo "@@BOOTLOG-BEGIN"
dmesg -c
echo "@@BOOTLOG-END"
echo "@@BOOTED"
sh /suite/$suite.sh
echo "@@SUITE-EXIT \$?"
echo "@@DMESG-BEGIN"
dmesg
echo "@@DMESG-END"
# Buffered writes must reach the disk images the host checks afterwards.
sync
poweroff -f
INIT
chmod +x "$ir/init"
(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initramfs.cpio.gz"

# The devices: an NVMe namespace with non-repeating content, a second
# namespace holding an ext4 filesystem with files of that content (data.bin
# to read, rw.bin to overwrite: both fully written, no holes), and the file
# behind the accelerator's memory BAR, zero-filled, shared with the guest.
"$musl/p2pdma-rigdata" make-image "$out/nvme.img" 64
mkdir -p "$out/fsroot"
"$musl/p2pdma-rigdata" make-image "$out/fsroot/data.bin" 24
cp "$out/fsroot/data.bin" "$out/fsroot/rw.bin"
mkfs.ext4 -q -F -b 4096 -L p2pdma-rig -E root_owner=0:0 -d "$out/fsroot" "$out/fs.img" 128M >"$out/mkfs.log" 2>&1 ||
	die "mkfs.ext4 of the rig filesystem failed (log: $out/mkfs.log)"
truncate -s 64M "$out/accel.bin"
if [ "$topology" = switch ]; then
	truncate -s 64M "$out/accel1.bin"
	if [ "$suite" = dma ]; then truncate -s 16M "$out/accel2.bin"; fi
fi
# The shared namespace's image: the rig content from 64 MiB on, so that its
# bytes differ from nvme.img's at every offset. The metadata namespace's:
# the first 16 MiB of its data are the rig content (QEMU keeps the metadata
# after the data, at 8 bytes per 512-byte block).
"$musl/p2pdma-rigdata" make-image "$out/mp.img" 32 --pattern-offset $((64 << 20))
"$musl/p2pdma-rigdata" make-image "$out/md.img" 17
# The user-space-driven controller's namespace: the rig content from
# 128 MiB on, different from every other image.
# Its second namespace has 4 KiB blocks: the rig content from 192 MiB on.
# The controller whose namespace is detached and attached again (switch):
# the rig content from 224 MiB on.
if [ "$topology" = switch ]; then
	"$musl/p2pdma-rigdata" make-image "$out/events.img" 4 --pattern-offset $((224 << 20))
fi
if [ "$topology" != noswitch ]; then
	"$musl/p2pdma-rigdata" make-image "$out/vfio.img" 64 --pattern-offset $((128 << 20))
	"$musl/p2pdma-rigdata" make-image "$out/vfio4k.img" 16 --pattern-offset $((192 << 20))
fi
# The array members' namespaces (arrays and bench suites, switch), 96 MiB
# each: the rig content from 256 MiB on, each image's right after the one
# before, so that no two images hold the same bytes anywhere.
members=0
if [ "$topology" = switch ] && { [ "$suite" = arrays ] || [ "$suite" = bench ]; }; then
	members=1
	for i in 0 1 2 3; do
		"$musl/p2pdma-rigdata" make-image "$out/m$i.img" 96 --pattern-offset $(((256 + 96 * i) << 20))
	done
	"$musl/p2pdma-rigdata" make-image "$out/out.img" 96 --pattern-offset $((640 << 20))
	"$musl/p2pdma-rigdata" make-image "$out/mbad.img" 96 --pattern-offset $((736 << 20))
	cat >"$out/mbad-blkdebug.conf" <<'BLKDEBUG'
[inject-error]
event = "read_aio"
errno = "5"
sector = "122880"
BLKDEBUG
fi
# A namespace with a bad block: QEMU's blkdebug fails every read that
# touches byte 8 MiB (sector 16384) of bad.img, which the emulated controller
# completes with a medium error (Unrecovered Read Error, SCT 0x2 SC 0x81).
"$musl/p2pdma-rigdata" make-image "$out/bad.img" 16
cat >"$out/blkdebug.conf" <<'BLKDEBUG'
[inject-error]
event = "read_aio"
errno = "5"
sector = "16384"
BLKDEBUG

pcie=() iommu=()
# The guest's command line: VFIO's no-IOMMU mode is allowed (it does nothing
# until a device is bound to vfio-pci without an IOMMU); with the emulated
# IOMMU, translation is on for every device (no passthrough) and type1 VFIO
# accepts the missing interrupt remapping (intremap is off).
append="console=ttyS0 loglevel=4 panic=-1 oops=panic"
# The bench compares the queues path with io_uring on the nvme driver's
# polled queues too.
if [ "$suite" = bench ]; then
	append+=" nvme.poll_queues=2"
fi
if [ "$topology" != "${topology#iommu}" ]; then
	# QEMU wants the IOMMU before the PCI devices it translates for.
	iommu=(-device "intel-iommu,intremap=off")
	append+=" intel_iommu=on iommu=nopt vfio_iommu_type1.allow_unsafe_interrupts=1"
else
	append+=" vfio.enable_unsafe_noiommu_mode=1"
fi
if [ "$topology" != noswitch ]; then
	pcie=(-device "pcie-root-port,id=rp0,bus=pcie.0,chassis=1,slot=1"
		-device "x3130-upstream,id=up0,bus=rp0"
		-device "xio3130-downstream,id=dn0,bus=up0,chassis=2,slot=0"
		-device "xio3130-downstream,id=dn1,bus=up0,chassis=3,slot=0"
		-device "xio3130-downstream,id=dn2,bus=up0,chassis=4,slot=0"
		-device "xio3130-downstream,id=dn3,bus=up0,chassis=5,slot=0"
		-drive "file=$out/mp.img,if=none,id=nvmmp,format=raw"
		-device "nvme-subsys,id=mpsub,nqn=nqn.2026-11.io.p2pdma:rig-multipath"
		-device "nvme,id=nvme-mpa,serial=p2pdma-rig-mp,subsys=mpsub,bus=dn2"
		-device "nvme,id=nvme-mpb,serial=p2pdma-rig-mp,subsys=mpsub,bus=dn3"
		-device "nvme-ns,drive=nvmmp,bus=nvme-mpa,nsid=3,shared=on"
		-device "xio3130-downstream,id=dn4,bus=up0,chassis=6,slot=0"
		-drive "file=$out/vfio.img,if=none,id=nvmvfio,format=raw"
		-drive "file=$out/vfio4k.img,if=none,id=nvmvfio4k,format=raw"
		-device "nvme,id=nvme-vfio,serial=p2pdma-vfio,bus=dn4,mdts=5"
		-device "nvme-ns,drive=nvmvfio,bus=nvme-vfio,nsid=7"
		-device "nvme-ns,drive=nvmvfio4k,bus=nvme-vfio,nsid=8,logical_block_size=4096,physical_block_size=4096")
	nvme_bus=dn0 accel_bus=dn1
	if [ "$topology" = switch ]; then
		pcie+=(-device "xio3130-downstream,id=dn5,bus=up0,chassis=9,slot=0"
			-drive "file=$out/events.img,if=none,id=nvmevents,format=raw"
			-device "nvme-subsys,id=evsub,nqn=nqn.2026-11.io.p2pdma:rig-events"
			-device "nvme,id=nvme-events,serial=p2pdma-events,subsys=evsub,bus=dn5"
			-device "nvme-ns,drive=nvmevents,bus=nvme-events,nsid=9,shared=off")
		pcie+=(-device "pcie-root-port,id=rp2,bus=pcie.0,chassis=8,slot=3"
			-object "memory-backend-file,id=accmem1,share=on,mem-path=$out/accel1.bin,size=64M"
			-device "ivshmem-plain,memdev=accmem1,bus=rp2")
	fi
	if ((members)); then
		# Array members: four under the switch, one with a bad block under
		# it too, one on a root port outside it.
		for i in 0 1 2 3; do
			pcie+=(-device "xio3130-downstream,id=dn$((7 + i)),bus=up0,chassis=$((11 + i)),slot=0"
				-drive "file=$out/m$i.img,if=none,id=nvmm$i,format=raw"
				-device "nvme,id=nvme-m$i,serial=p2pdma-m$i,bus=dn$((7 + i))"
				-device "nvme-ns,drive=nvmm$i,bus=nvme-m$i,nsid=$((10 + i))")
		done
		pcie+=(-device "xio3130-downstream,id=dn11,bus=up0,chassis=15,slot=0"
			-drive "file=blkdebug:$out/mbad-blkdebug.conf:$out/mbad.img,if=none,id=nvmmbad,format=raw"
			-device "nvme,id=nvme-mbad,serial=p2pdma-mbad,bus=dn11"
			-device "nvme-ns,drive=nvmmbad,bus=nvme-mbad,nsid=15"
			-device "pcie-root-port,id=rp3,bus=pcie.0,chassis=16,slot=4"
			-drive "file=$out/out.img,if=none,id=nvmout,format=raw"
			-device "nvme,id=nvme-out,serial=p2pdma-out,bus=rp3"
			-device "nvme-ns,drive=nvmout,bus=nvme-out,nsid=14")
	fi
	if [ "$topology" = switch ] && [ "$suite" = dma ]; then
		# A third accelerator under the switch, for the dma suite alone,
		# which gives it to vfio-pci to export its BAR as a dma-buf.
		pcie+=(-device "xio3130-downstream,id=dn6,bus=up0,chassis=10,slot=0"
			-object "memory-backend-file,id=accmem2,share=on,mem-path=$out/accel2.bin,size=16M"
			-device "ivshmem-plain,memdev=accmem2,bus=dn6")
	fi
	if [ "$topology" = iommu ]; then
		pcie+=(-device "pcie-root-port,id=rp1,bus=pcie.0,chassis=7,slot=0")
		accel_bus=rp1
	fi
else
	pcie=(-device "pcie-root-port,id=rp0,bus=pcie.0,chassis=1,slot=1"
		-device "pcie-root-port,id=rp1,bus=pcie.0,chassis=2,slot=2")
	nvme_bus=rp0 accel_bus=rp1
fi

accel=tcg
if [ "${P2PDMA_KVM:-0}" = 1 ]; then
	# KVM hung right after "Booting from ROM" on these machines: opt-in only.
	accel=kvm
fi

# The machine, but for its console and command line.
machine=(-machine "q35,accel=$accel" -cpu max -smp 2 -m 1G
	-nodefaults -display none -no-reboot
	-kernel "$tree/arch/x86/boot/bzImage" -initrd "$out/initramfs.cpio.gz"
	"${iommu[@]}" "${pcie[@]}"
	-drive "file=$out/nvme.img,if=none,id=nvm,format=raw"
	-drive "file=$out/fs.img,if=none,id=nvmfs,format=raw"
	-device "nvme,id=nvme0,serial=p2pdma-rig,bus=$nvme_bus"
	-device "nvme-ns,drive=nvm,bus=nvme0,nsid=1"
	-device "nvme-ns,drive=nvmfs,bus=nvme0,nsid=2"
	-drive "file=$out/md.img,if=none,id=nvmmd,format=raw"
	-device "nvme-ns,drive=nvmmd,bus=nvme0,nsid=4,ms=8,pi=1,shared=off"
	-drive "file=blkdebug:$out/blkdebug.conf:$out/bad.img,if=none,id=nvmbad,format=raw"
	-device "nvme-ns,drive=nvmbad,bus=nvme0,nsid=5,shared=off"
	-drive "if=none,id=nvmslow,driver=null-co,size=64M,read-zeroes=on,throttling.bps-total=1048576"
	-device "nvme-ns,drive=nvmslow,bus=nvme0,nsid=6,shared=off"
	-object "memory-backend-file,id=accmem,share=on,mem-path=$out/accel.bin,size=64M"
	-device "ivshmem-plain,memdev=accmem,bus=$accel_bus")
if [ "$suite" = fabrics ]; then
	mapfile -t nic < <(fabric_nic)
	machine+=("${nic[@]}")
fi

# The power suite first cuts the machine's power (QEMU killed) in the middle
# of update-heavy runs of the object store, once per cut, each on a store
# file of its own; the guest prints each operation as it begins and returns.
# Then the suite's own boot reopens every store and checks it against the
# lines its run printed before the cut.
if [ "$suite" = power ]; then
	cuts=${P2PDMA_POWER_CUTS:-4} killed=0
	for ((c = 1; c <= cuts; c++)); do
		clog="$out/cut$c.log"
		log "power cut $c of $cuts: booting, then killing QEMU mid-update"
		qemu-system-x86_64 "${machine[@]}" -serial "file:$clog" \
			-append "$append rigpower.phase=write rigpower.cut=$c" >"$out/qemu-cut$c.log" 2>&1 &
		qpid=$!
		waited=0
		until tr -d '\r' <"$clog" 2>/dev/null | grep -q "^@@OP $c READY"; do
			if ! kill -0 "$qpid" 2>/dev/null || ((waited >= timeout)); then break; fi
			sleep 1
			waited=$((waited + 1))
		done
		# Some operations in: a random point of the run.
		sleep "$((1 + RANDOM % 5)).$((RANDOM % 10))"
		if kill -9 "$qpid" 2>/dev/null; then killed=$((killed + 1)); fi
		wait "$qpid" 2>/dev/null || true
		tr -d '\r' <"$clog" | grep "^@@OP $c " >"$ir/suite/power-$c.log" || true
		log "power cut $c: $(grep -c " B " "$ir/suite/power-$c.log" || true) operations begun before it"
	done
	echo "$killed" >"$ir/suite/power-cuts"
	(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initramfs.cpio.gz"
	append+=" rigpower.phase=check"
fi

target_ready=1
if [ "$suite" = fabrics ]; then
	fabric_start || target_ready=0
	fabric_serve &
	serve_pid=$!
fi
log "booting the VM (topology $topology, suite $suite, timeout ${timeout}s)"
start=$SECONDS
qrc=0
timeout -k 5 "$timeout" qemu-system-x86_64 "${machine[@]}" \
	-serial "file:$out/console.log" -append "$append" \
	>"$out/qemu.log" 2>&1 || qrc=$?
log "VM exited with $qrc after $((SECONDS - start))s; console: $out/console.log"
if [ "$suite" = fabrics ]; then
	touch "$out/target/done"
	wait "$serve_pid" || true
	fabric_stop
fi

# The checks.
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
con="$out/console.txt"
if [ -f "$out/console.log" ]; then
	tr -d '\r' <"$out/console.log" >"$con"
else
	: >"$con"
fi

# The demo tells what happened in words: the guest's story (its @@SAY
# lines: the doctor's report, the path the engine chose and why, the bytes
# moved), then the host's check of those bytes.
narrate=0
if [ "$suite" = demo ]; then narrate=1; fi
rel=${out#"$P2PDMA_ROOT"/}
story=()
narrate_read_check() {
	((narrate)) || return 0
	local line=$1 matched=$2 res=$3 len nvme_off bar_off
	len=$(kv len "$line") nvme_off=$(kv nvme_offset "$line") bar_off=$(kv bar_offset "$line")
	local where="The accelerator's memory (its BAR, from QEMU's ivshmem device) is the file
		$rel/accel.bin on the host, and the SSD's namespace is the image $rel/nvme.img."
	if ((matched)); then
		story+=("$where The $len bytes at offset $bar_off of accel.bin (where the guest's
			allocation lies in the BAR) equal the $len bytes at offset $nvme_off of nvme.img:
			the data went from the SSD into accelerator memory intact ($res).")
	else
		story+=("$where The $len bytes at offset $bar_off of accel.bin do NOT equal the
			$len bytes at offset $nvme_off of nvme.img: $res")
	fi
}

if ((qrc == 124 || qrc == 137)); then
	bad vm-finished "QEMU killed after ${timeout}s (hang); the console's last lines ($con):"
	tail -n 20 "$con" | sed 's/^/    /'
elif ! grep -q '^@@SUITE-EXIT' "$con"; then
	bad vm-finished "the guest did not finish the suite (QEMU rc $qrc); the console's last lines ($con):"
	tail -n 30 "$con" | sed 's/^/    /'
	if [ -s "$out/qemu.log" ]; then
		echo "    QEMU said ($out/qemu.log):"
		tail -n 10 "$out/qemu.log" | sed 's/^/    /'
	fi
else
	ok vm-finished
fi
if [ "$suite" = fabrics ]; then
	if ((target_ready)); then
		ok "storage-machine-ready"
	else
		bad storage-machine-ready "the storage machine's target did not come up; its console ($out/target/console-1.log):"
		tail -n 20 "$out/target/console-1.log" 2>/dev/null | tr -d '\r' | sed 's/^/    /'
	fi
fi

# Guest-side results.
while read -r _ name verdict why; do
	if [ "$verdict" = PASS ]; then ok "guest:$name"; else bad "guest:$name" "$why"; fi
done < <(grep '^@@TEST ' "$con" || true)
# What the guest recorded for the reader (what the kernel answered, say).
while IFS= read -r line; do
	echo "NOTE guest: ${line#@@NOTE }"
done < <(grep '^@@NOTE ' "$con" || true)

# Host-side checks of what the guest reported landing in the devices.
kv() { sed -nE "s/.* $1=([^ ]+).*/\1/p" <<<"$2"; }
while IFS= read -r line; do
	what=$(awk '{print $2}' <<<"$line")
	case $what in
	p2pmem-read | p2pmem-read-skipped)
		# Reads of the other namespaces name their image, and reads into
		# the second accelerator its memory's file.
		image=$(kv image "$line") mem=$(kv mem "$line")
		args=(--expected "$out/${image:-nvme.img}" --expected-offset "$(kv nvme_offset "$line")"
			--actual "$out/${mem:-accel.bin}" --actual-offset "$(kv bar_offset "$line")" --len "$(kv len "$line")")
		if res=$("$musl/p2pdma-rigdata" compare "${args[@]}"); then matched=1; else matched=0; fi
		if [ "$what" = p2pmem-read ]; then
			if ((matched)); then ok "host:$what ($res)"; else bad "host:$what" "$res"; fi
			narrate_read_check "$line" "$matched" "$res"
		elif ((matched)); then
			# The guest filled the memory but skipped the read: the check
			# must notice that nothing arrived.
			bad "host:$what" "compare matched although no data was read"
		else
			ok "host:$what (compare detects missing data)"
		fi
		;;
	nvme-write)
		# What the guest wrote through the NVMe must be in the image file
		# (nvme.img, or the one the line names).
		image=$(kv image "$line")
		if res=$("$musl/p2pdma-rigdata" compare-pattern --file "$out/${image:-nvme.img}" \
			--offset "$(kv nvme_offset "$line")" --pattern-offset "$(kv pattern_offset "$line")" \
			--len "$(kv len "$line")"); then
			ok "host:$what${image:+ $image} ($res)"
		else
			bad "host:$what" "${image:+$image: }$res"
		fi
		;;
	mem-pattern)
		# Rig content the guest left in an accelerator's memory must be in
		# its backing file (accel.bin, or the one the line names).
		mem=$(kv mem "$line")
		if res=$("$musl/p2pdma-rigdata" compare-pattern --file "$out/${mem:-accel.bin}" \
			--offset "$(kv bar_offset "$line")" --pattern-offset "$(kv pattern_offset "$line")" \
			--len "$(kv len "$line")"); then
			ok "host:$what ${mem:-accel.bin} ($res)"
		else
			bad "host:$what" "${mem:-accel.bin}: $res"
		fi
		;;
	file-read)
		# What the guest read from a file of the filesystem must be that
		# file's bytes, which the host put into the image.
		args=(--expected "$out/fsroot$(kv fsfile "$line")" --expected-offset "$(kv file_offset "$line")"
			--actual "$out/accel.bin" --actual-offset "$(kv bar_offset "$line")" --len "$(kv len "$line")")
		if res=$("$musl/p2pdma-rigdata" compare "${args[@]}"); then ok "host:$what ($res)"; else bad "host:$what" "$res"; fi
		;;
	file-write)
		# What the guest wrote into a file must be in the filesystem image,
		# read back with debugfs (no mount, no guest), at the size the guest saw.
		name=$(kv fsfile "$line") dump="$out/dump$(kv fsfile "$line" | tr / _)"
		rm -f "$dump"
		if ! debugfs -R "dump $name $dump" "$out/fs.img" >"$dump.log" 2>&1 || [ ! -f "$dump" ]; then
			bad "host:$what" "debugfs could not dump $name: $(tail -n 1 "$dump.log")"
		elif [ "$(stat -c %s "$dump")" != "$(kv size "$line")" ]; then
			bad "host:$what" "$name is $(stat -c %s "$dump") bytes in the image, the guest saw $(kv size "$line")"
		elif res=$("$musl/p2pdma-rigdata" compare-pattern --file "$dump" --offset "$(kv file_offset "$line")" \
			--pattern-offset "$(kv pattern_offset "$line")" --len "$(kv len "$line")"); then
			ok "host:$what $name ($res)"
		else
			bad "host:$what" "$name: $res"
		fi
		;;
	array-read)
		# What the guest read from an md array must be the array's bytes,
		# taken from its members' images where the array's layout puts them.
		mem=$(kv mem "$line")
		args=(--dir "$out" --layout "$(kv layout "$line")" --array-offset "$(kv array_offset "$line")"
			--actual "$out/${mem:-accel.bin}" --actual-offset "$(kv bar_offset "$line")"
			--len "$(kv len "$line")")
		if res=$("$musl/p2pdma-rigdata" array-compare "${args[@]}"); then ok "host:$what ($res)"; else bad "host:$what" "$res"; fi
		;;
	array-write)
		# What the guest wrote to an md array must be in every copy, on
		# every leg of a mirror, in the members' images.
		args=(--dir "$out" --layout "$(kv layout "$line")" --array-offset "$(kv array_offset "$line")"
			--pattern-offset "$(kv pattern_offset "$line")" --len "$(kv len "$line")")
		if res=$("$musl/p2pdma-rigdata" array-pattern "${args[@]}"); then ok "host:$what ($res)"; else bad "host:$what" "$res"; fi
		;;
	*) bad "host:$what" "unknown result kind" ;;
	esac
done < <(grep '^@@RESULT ' "$con" || true)

# From the end of boot on (the module loads, the suite runs), the kernel log
# must be free of warnings, oopses and leak reports. A report during boot,
# before any of the project's code exists in the guest, is shown but not
# counted: it is the kernel's (or the emulator's) own.
sed -n '/^@@DMESG-BEGIN/,/^@@DMESG-END/p' "$con" >"$out/dmesg.txt"
sed -n '1,/^@@BOOTLOG-END/p' "$con" >"$out/boot.txt"
sed -n '/^@@BOOTLOG-END/,$p' "$con" >"$out/run.txt"
reports='WARNING:|BUG:|Oops|general protection|Call Trace|KASAN:|suspected memory leak|UBSAN|rust_panic|panicked'
# The storage machine's kernel must not have warned either.
if [ "$suite" = fabrics ]; then
	for c in "$out"/target/console-*.log; do
		if tr -d '\r' <"$c" | grep -qE "$reports"; then
			bad storage-machine-kernel-log-clean "$c: $(tr -d '\r' <"$c" | grep -m3 -E "$reports")"
		else
			ok "storage-machine-kernel-log-clean (${c##*/})"
		fi
	done
fi
if ! grep -q '^@@BOOTLOG-END' "$con"; then
	bad kernel-log-clean "the guest never finished booting"
elif grep -qE "$reports" "$out/run.txt"; then
	bad kernel-log-clean "$(grep -m3 -E "$reports" "$out/run.txt")"
else
	ok kernel-log-clean
fi
if grep -qE "$reports" "$out/boot.txt"; then
	echo "NOTE boot-log: the kernel reported during boot, before the module or any test ran (see $out/boot.txt):"
	grep -m3 -E "$reports" "$out/boot.txt" | sed 's/^/    /'
fi

if ((narrate)); then
	echo
	if [ "$topology" = switch ]; then
		echo "The VM: the NVMe SSD and the accelerator sit under one PCIe switch, where the kernel allows P2P."
	else
		echo "The VM: the NVMe SSD and the accelerator meet only at the host bridge, which the kernel refuses for P2P."
	fi
	echo
	echo "In the VM:"
	if grep -q '^@@SAY' "$con"; then
		sed -n 's/^@@SAY \{0,1\}/  /p' "$con" | sed 's/ *$//'
	else
		echo "  the guest told nothing; its console is $rel/console.txt"
	fi
	echo
	echo "On the host:"
	if ((${#story[@]})); then
		for p in "${story[@]}"; do
			tr -s '\n\t ' ' ' <<<"$p" | fmt -w 76 | sed 's/^/  /'
		done
	else
		echo "  nothing to check: the guest reported no read"
	fi
	echo
fi
# A suite that passed keeps its logs; its disk images, the BARs' backing
# files and the initramfs (about 400 MiB a suite, 8 GiB over `test`) go, so
# that a whole run fits a small disk. A failed suite, the demo (whose story
# names the files) and P2PDMA_KEEP_IMAGES=1 keep everything.
if ((fail == 0 && narrate == 0)) && [ -z "${P2PDMA_KEEP_IMAGES:-}" ]; then
	rm -rf "$out/initramfs" "$out/fsroot" "$out/initramfs.cpio.gz" "$out"/*.img "$out"/*.bin \
		"$out/target/initramfs" "$out/target/initramfs.cpio.gz"
fi
echo "vm $suite/$topology: $pass passed, $fail failed"
((fail == 0)) || exit 1
