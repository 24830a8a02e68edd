# shellcheck shell=bash
# The fabrics suite's storage machine, for vm.sh (sourced): a second QEMU
# on the same kernel with an initramfs of its own (busybox, iproute2's rdma
# and tests/vm/fabrics-target.sh) and an NVMe controller of its own, which
# exports its namespaces with the kernel's NVMe over Fabrics target. The
# two machines share a network of their own: an e1000 NIC each, joined by
# QEMU's dgram netdev over two unix sockets in the run's directory, so
# nothing reaches the host's network, and the storage machine can stop and
# start again while the accelerator machine runs.
#
# Uses vm.sh's $out, $tree, $accel and $musl.
# shellcheck disable=SC2154

# fabric_setup: the NQNs and the host's DH-HMAC-CHAP secret (shared with
# the accelerator machine's suite in $ir/suite/fabric), the images, and the
# storage machine's initramfs.
fabric_setup() {
	local d="$out/target"
	mkdir -p "$d/initramfs"/{bin,proc,sys,dev,tmp,suite/fabric}
	local keys="$d/initramfs/suite/fabric"
	echo nqn.2026-11.io.p2pdma:remote >"$keys/subnqn"
	# The host's NQN and ID, and a 32-byte secret in the DHHC-1
	# representation (untransformed: "00"): base64 of the secret and its
	# CRC-32, little-endian.
	python3 - "$keys" <<'PY'
import base64, os, struct, sys, uuid, zlib
d = sys.argv[1]
u = uuid.uuid4()
open(f"{d}/hostnqn", "w").write(f"nqn.2014-08.org.nvmexpress:uuid:{u}\n")
open(f"{d}/hostid", "w").write(f"{u}\n")
k = os.urandom(32)
b = base64.b64encode(k + struct.pack("<I", zlib.crc32(k))).decode()
open(f"{d}/dhchap.key", "w").write(f"DHHC-1:00:{b}:\n")
PY
	cp /bin/busybox "$d/initramfs/bin/busybox"
	# iproute2's rdma, for the soft RoCE device the RDMA port needs.
	local rdma
	rdma=$(command -v rdma) || die "no rdma on the host (tools/rig/setup-host.sh installs iproute2)"
	mkdir -p "$d/initramfs/sbin"
	cp "$rdma" "$d/initramfs/sbin/rdma"
	with_libs "$d/initramfs" "$d/initramfs/sbin/rdma"
	cp "$P2PDMA_ROOT"/tests/vm/lib.sh "$P2PDMA_ROOT"/tests/vm/fabrics-target.sh \
		"$P2PDMA_ROOT"/tests/vm/fabrics-ctl.sh "$d/initramfs/suite/"
	cat >"$d/initramfs/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
export PATH=/bin
sh /suite/fabrics-target.sh
echo "@@TARGET-EXIT $?"
poweroff -f
INIT
	chmod +x "$d/initramfs/init"
	(cd "$d/initramfs" && find . | cpio -o -H newc --quiet | gzip -1) >"$d/initramfs.cpio.gz"
	# The remote namespace: the rig content from 1 GiB on, which no other
	# image holds; the store's namespace starts zeroed.
	"$musl/p2pdma-rigdata" make-image "$out/remote.img" 64 --pattern-offset $((1024 << 20))
	truncate -s 64M "$out/remote-store.img"
	fabric_starts=0
}

# The accelerator machine's side of the network, for its QEMU command line.
fabric_nic() {
	printf '%s\n' -netdev "dgram,id=fab,local.type=unix,local.path=$out/fabric-a.sock,remote.type=unix,remote.path=$out/fabric-t.sock" \
		-device "e1000,netdev=fab,mac=52:54:00:12:34:15"
}

# fabric_start: boots the storage machine in the background and waits until
# its target is configured (at most 180 s).
fabric_start() {
	local d="$out/target"
	fabric_starts=$((fabric_starts + 1))
	local con="$d/console-$fabric_starts.log"
	rm -f "$out/fabric-t.sock"
	qemu-system-x86_64 -machine "q35,accel=$accel" -cpu max -smp 1 -m 512M \
		-nodefaults -display none -no-reboot \
		-kernel "$tree/arch/x86/boot/bzImage" -initrd "$d/initramfs.cpio.gz" \
		-append "console=ttyS0 loglevel=4 panic=-1 oops=panic" \
		-drive "file=$out/remote.img,if=none,id=rem1,format=raw" \
		-drive "file=$out/remote-store.img,if=none,id=rem2,format=raw" \
		-device "nvme,id=nvme-remote,serial=p2pdma-remote" \
		-device "nvme-ns,drive=rem1,bus=nvme-remote,nsid=1" \
		-device "nvme-ns,drive=rem2,bus=nvme-remote,nsid=2" \
		-netdev "dgram,id=fab,local.type=unix,local.path=$out/fabric-t.sock,remote.type=unix,remote.path=$out/fabric-a.sock" \
		-device "e1000,netdev=fab,mac=52:54:00:12:34:02" \
		-serial "file:$con" >"$d/qemu-$fabric_starts.log" 2>&1 &
	local pid=$!
	echo "$pid" >"$d/qemu.pid"
	local waited=0
	until grep -q '@@TARGET-READY' "$con" 2>/dev/null; do
		if ! kill -0 "$pid" 2>/dev/null || ((waited >= 1800)); then
			log "the storage machine did not get ready (console: $con)"
			return 1
		fi
		sleep 0.1
		waited=$((waited + 1))
	done
	log "storage machine $fabric_starts ready ($((waited / 10)) s; console: $con)"
}

# fabric_stop: the storage machine's power cut (QEMU killed).
fabric_stop() {
	local f="$out/target/qemu.pid" pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	rm -f "$f"
	kill -9 "$pid" 2>/dev/null || true
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

# fabric_serve: until $out/target/done exists (the accelerator machine
# ended), carries out what the suite asks of the host on its console:
# "@@HOST target-stop" (the storage machine's power cut) and "@@HOST
# target-start"; the storage machine's starts are counted on from
# $fabric_starts.
fabric_serve() {
	local done=0 lines
	while [ ! -e "$out/target/done" ]; do
		lines=$( (tr -d '\r' <"$out/console.log") 2>/dev/null | grep '^@@HOST ' || true)
		local n
		n=$(grep -c . <<<"$lines" || true)
		while ((done < n)); do
			done=$((done + 1))
			case $(sed -n "${done}p" <<<"$lines") in
			"@@HOST target-stop") fabric_stop ;;
			"@@HOST target-start") fabric_start || true ;;
			esac
		done
		sleep 0.2
	done
}
