# shellcheck shell=sh
# md arrays as P2P storage (switch topology): arrays built with mdadm over
# the member controllers under the switch (NSIDs 10 to 13), one with the
# member on a root port outside it (NSID 14), where P2P does not reach, and
# one with a member that has a bad block (NSID 15). Reads and writes on
# every path and every array shape, each reported for the host, which
# checks them in each member's image (every leg of a mirror), so the
# striping and the mirroring are checked, not only the bytes the guest
# sees; the refusals with their reasons; a file system on an array.
# shellcheck source=lib.sh
. /suite/lib.sh

M=1048576
check module-loads insmod /lib/modules/p2pdma.ko

# The member namespaces, and the host's image of each.
M0=$(ns_dev 10) M1=$(ns_dev 11) M2=$(ns_dev 12) M3=$(ns_dev 13)
OUT=$(ns_dev 14) MBAD=$(ns_dev 15)
image_of() {
	case $(cat "/sys/block/${1#/dev/}/nsid") in
	10) echo m0.img ;; 11) echo m1.img ;; 12) echo m2.img ;; 13) echo m3.img ;;
	14) echo out.img ;; 15) echo mbad.img ;; *) echo unknown.img ;;
	esac
}

# md_layout ARRAY: the array's layout for the host's check, from sysfs:
# LEVEL,CHUNK,IMAGE:DATA_OFFSET,... with the members in slot order.
md_layout() {
	a=/sys/block/${1#/dev/}/md
	spec="$(cat "$a/level"),$(cat "$a/chunk_size")"
	n=$(cat "$a/raid_disks")
	s=0
	while [ $s -lt "$n" ]; do
		for d in "$a"/dev-*; do
			[ "$(cat "$d/slot")" = $s ] || continue
			spec="$spec,$(image_of "/dev/${d##*/dev-}"):$(($(cat "$d/offset") * 512))"
		done
		s=$((s + 1))
	done
	echo "$spec"
}

# mkarray NAME LEVEL CHUNK_KIB DATA_MIB SIZE_MIB DEV...: an md array
# without a resync (the suite reads back only what it wrote to a mirror),
# its data from DATA_MIB on each member. Every array has a window of its
# own on its members, so that what one array wrote is still in the images
# when the host checks it after the suite. CHUNK_KIB is - for raid1;
# SIZE_MIB (the bytes of each member used) is - for raid0, which uses the
# rest of its members (the suite stays within its window there).
mkarray() {
	name=$1 level=$2 chunk=$3 data=$4 size=$5
	shift 5
	set -- --level="$level" --raid-devices=$# --data-offset="${data}M" "$@"
	if [ "$chunk" != - ]; then set -- --chunk="$chunk" "$@"; fi
	if [ "$size" != - ]; then set -- --size="${size}M" "$@"; fi
	check "mdadm-create-$name-raid$level" mdadm --create "/dev/$name" --run --assume-clean --metadata=1.2 "$@"
}

stoparray() { check "mdadm-stop-$1" mdadm --stop "/dev/$1"; }

# The member's name as the library prints it: "nvme3n1 (nvme3 at PCI)".
member_name() {
	ctrl=$(basename "$(readlink -f "/sys/block/${1#/dev/}/device")")
	echo "${1#/dev/} ($ctrl at $(basename "$(readlink -f "/sys/class/nvme/$ctrl/device")"))"
}

every="since its I/O reaches all of them"

# RAID0 over two members, 64 KiB chunks: reads and writes on each path,
# unaligned ends included.
mkarray md0 0 64 2 - "$M0" "$M1"
L=$(md_layout /dev/md0)
echo "md0: $L"
check_held raid0x2-auto-read-p2p p2pdma-vmtest engine-read --nvme /dev/md0 --array-layout "$L" \
	--offset $((M + 3 * 4096 + 100)) --len $((2 * M + 12345)) --mem-offset 100 \
	--expect-path p2p --expect-reason "P2P on every member of md array md0 (raid0), $every" --hold
check_held raid0x2-bounce-read p2pdma-vmtest engine-read --nvme /dev/md0 --array-layout "$L" --path bounce \
	--offset $((5 * M + 512)) --len $((M + 7)) --expect-path bounce --hold
check raid0x2-auto-write-p2p p2pdma-vmtest engine-write --nvme /dev/md0 --array-layout "$L" \
	--offset $((8 * M + 300)) --len $((M + 1000)) --mem-offset 300 --pattern-offset $((5 * M + 8)) --expect-path p2p
check raid0x2-bounce-write p2pdma-vmtest engine-write --nvme /dev/md0 --array-layout "$L" --path bounce \
	--offset $((11 * M)) --len $((M + 4096)) --pattern-offset $((9 * M)) --expect-path bounce
stoparray md0

# RAID0 over four members, 128 KiB chunks.
mkarray md1 0 128 10 - "$M0" "$M1" "$M2" "$M3"
L=$(md_layout /dev/md1)
echo "md1: $L"
check_held raid0x4-auto-read-p2p p2pdma-vmtest engine-read --nvme /dev/md1 --array-layout "$L" \
	--offset $((3 * M + 4096)) --len $((3 * M + 333)) \
	--expect-path p2p --expect-reason "P2P on every member of md array md1 (raid0), $every" --hold
check raid0x4-auto-write-p2p p2pdma-vmtest engine-write --nvme /dev/md1 --array-layout "$L" \
	--offset $((20 * M + 4096)) --len $((2 * M + 512)) --pattern-offset $((13 * M)) --expect-path p2p
stoparray md1

# RAID1 over two members: a write lands on both legs (the host reads each
# back); the read returns it.
mkarray md2 1 - 18 8 "$M0" "$M1"
L=$(md_layout /dev/md2)
echo "md2: $L"
check raid1-auto-write-p2p p2pdma-vmtest engine-write --nvme /dev/md2 --array-layout "$L" \
	--offset $((2 * M + 512)) --len $((2 * M)) --mem-offset 512 --pattern-offset $((21 * M)) --expect-path p2p
check_held raid1-read-back p2pdma-vmtest engine-read --nvme /dev/md2 --array-layout "$L" \
	--offset $((2 * M + 512)) --len $((2 * M)) --mem-offset 512 --expect-path p2p --verify-buffered --hold
# Degraded: with one leg failed, the other serves the same bytes.
check raid1-fail-leg mdadm /dev/md2 --fail "$M0"
check_held raid1-degraded-read p2pdma-vmtest engine-read --nvme /dev/md2 --array-layout "$L" \
	--offset $((2 * M + 4096)) --len $((M + 100)) --expect-path p2p --hold
stoparray md2

# RAID10 over four members (two near copies), 64 KiB chunks.
mkarray md3 10 64 26 8 "$M0" "$M1" "$M2" "$M3"
L=$(md_layout /dev/md3)
echo "md3: $L"
# The command line describes the array: level, chunk, state, and each
# member in slot order with its data offset and controller.
out=$(p2pdma-ctl describe /dev/md3 2>&1)
echo "$out"
want_members=
for d in "$M0" "$M1" "$M2" "$M3"; do
	want_members="$want_members ${d#/dev/}"
done
got_members=$(echo "$out" | sed -n 's/^  slot [0-9]  \([a-z0-9]*\) (in_sync), data at 26 MiB: .*/\1/p' | tr '\n' ' ')
case $out in
*"/dev/md3: md array raid10, 64 KiB chunks, 4 members in its layout, clean"*)
	if [ " $got_members" = "$want_members " ]; then
		pass describe-raid10
	else
		fail describe-raid10 "members in slot order:$want_members; described: $got_members"
	fi
	;;
*) fail describe-raid10 "$(echo "$out" | head -n 1)" ;;
esac
check raid10-auto-write-p2p p2pdma-vmtest engine-write --nvme /dev/md3 --array-layout "$L" \
	--offset $((4 * M + 1000)) --len $((3 * M)) --mem-offset 1000 --pattern-offset $((31 * M + 16)) --expect-path p2p
# p2pdma-ctl copy from the array into accelerator memory, checked against
# a plain read of the array (of what was written: without a resync, the
# copies of other chunks differ).
check ctl-copy-from-raid10 p2pdma-ctl copy /dev/md3 accel:0 --offset $((4 * M + 4096)) --len $((2 * M)) --verify
check_held raid10-auto-read-p2p p2pdma-vmtest engine-read --nvme /dev/md3 --array-layout "$L" \
	--offset $((4 * M + 1000)) --len $((3 * M)) --mem-offset 1000 --expect-path p2p \
	--expect-reason "P2P on every member of md array md3 (raid10), $every" --hold
# Degraded: with one member failed, every chunk's other copy serves it.
check raid10-fail-member mdadm /dev/md3 --fail "$M1"
check_held raid10-degraded-read p2pdma-vmtest engine-read --nvme /dev/md3 --array-layout "$L" \
	--offset $((4 * M + 4096)) --len $((2 * M)) --mem-offset 4096 --expect-path p2p --hold
stoparray md3

# A mirror with a leg P2P cannot reach (the member outside the switch):
# AUTO reads and writes go through host memory and say which member; P2P
# asked for is refused with the same reason; a write lands on both legs.
mkarray md4 1 - 34 8 "$M2" "$OUT"
L=$(md_layout /dev/md4)
echo "md4: $L"
far="member $(member_name "$OUT") of md array md4"
check raid1-far-leg-auto-write-bounce p2pdma-vmtest engine-write --nvme /dev/md4 --array-layout "$L" \
	--offset $((3 * M)) --len $((M + 4096)) --pattern-offset $((41 * M)) --expect-path bounce --expect-reason "$far"
check_held raid1-far-leg-auto-read-bounce p2pdma-vmtest engine-read --nvme /dev/md4 --array-layout "$L" \
	--offset $((3 * M)) --len $((M + 4096)) --expect-path bounce --expect-reason "$far" --hold
# The doctor says the same.
out=$(p2pdma-ctl --json doctor /dev/md4 2>&1)
echo "$out"
case $out in
*'"path":"bounce","reason":"'*"$far"*) pass doctor-raid1-far-leg ;;
*) fail doctor-raid1-far-leg "the doctor's path does not name $far" ;;
esac
out=$(p2pdma-vmtest engine-write --nvme /dev/md4 --path p2p --offset $((6 * M)) --len $M --pattern-offset 0 --expect-path p2p 2>&1)
rc=$?
echo "$out"
case $rc:$out in
0:*) fail raid1-far-leg-p2p-write-refused "a P2P write to a mirror with an unreachable leg was done" ;;
*"$far"*) pass raid1-far-leg-p2p-write-refused ;;
*) fail raid1-far-leg-p2p-write-refused "$(echo "$out" | tail -n 1)" ;;
esac
stoparray md4

# Faults. A RAID0 with a member whose block at 60 MiB cannot be read: a
# read across it fails with the error, and is not redone on another path.
mkarray md6 0 64 56 - "$M3" "$MBAD"
# The array offset of the bad member's (slot 1) 60 MiB: its data area
# starts at the data offset; chunks alternate between the two members.
d=$((60 * M - $(cat /sys/block/md6/md/dev-"${MBAD#/dev/}"/offset) * 512))
row=$((d / (64 * 1024)))
bad_at=$(((row * 2 + 1) * 64 * 1024 + d % (64 * 1024)))
# The error names the member: found by its own read of the piece that
# failed, or, where the failed request was merged on the member with a
# neighbour's (the piece alone reads fine), as the member that holds it.
blamed="${MBAD#/dev/} (slot 1)"
check raid0-bad-member-read-fails p2pdma-vmtest engine-read --nvme /dev/md6 \
	--offset $((bad_at - 128 * 1024)) --len $((256 * 1024)) --expect-path p2p --expect-errno ENODATA \
	--expect-error "$blamed" --expect-error "md array md6"
check raid0-bad-member-bounce-read-fails p2pdma-vmtest engine-read --nvme /dev/md6 --path bounce \
	--offset $((bad_at - 128 * 1024)) --len $((256 * 1024)) --expect-path bounce --expect-errno ENODATA \
	--expect-error "$blamed" --expect-error "md array md6"
stoparray md6
# A RAID1 with that member as its first leg. The write lands on the other
# leg; the bad one fails it, and md records that (a bad block in the leg's
# log, or the leg out of the array), so the host checks the bytes on the
# good leg; the read returns them from there.
mkarray md7 1 - 56 8 "$MBAD" "$M3"
at=$((60 * M - $(cat /sys/block/md7/md/dev-"${MBAD#/dev/}"/offset) * 512 - 64 * 1024))
L="raid1,0,m3.img:$(($(cat /sys/block/md7/md/dev-"${M3#/dev/}"/offset) * 512))"
check raid1-bad-leg-write p2pdma-vmtest engine-write --nvme /dev/md7 --array-layout "$L" \
	--offset "$at" --len $((256 * 1024)) --pattern-offset $((61 * M)) --expect-path p2p
case $(cat /sys/block/md7/md/dev-"${MBAD#/dev/}"/state) in
*faulty* | *write_error*) pass raid1-bad-leg-recorded ;;
*) fail raid1-bad-leg-recorded "md shows nothing of the failed write: $(cat /sys/block/md7/md/dev-"${MBAD#/dev/}"/state)" ;;
esac
check_held raid1-bad-leg-read p2pdma-vmtest engine-read --nvme /dev/md7 --array-layout "$L" \
	--offset "$at" --len $((256 * 1024)) --expect-path p2p --hold
stoparray md7

# A file system on a RAID0 of four: a file read and written by P2P, and
# random transfers against a shadow file on every path.
mkarray md5 0 64 42 - "$M0" "$M1" "$M2" "$M3"
check mkfs-on-array mkfs.ext4 -q -F -b 4096 /dev/md5 40M
mkdir -p /mnt
check mount-array mount -t ext4 /dev/md5 /mnt
: >/mnt/f.bin
check array-file-write-p2p p2pdma-vmtest engine-write --nvme /mnt/f.bin --offset 0 --len $((3 * M + 100)) \
	--pattern-offset $((51 * M)) --expect-path p2p --verify-buffered
check array-file-read-p2p p2pdma-vmtest engine-read --nvme /mnt/f.bin --offset 4096 --len $((2 * M + 77)) \
	--expect-path p2p --verify-buffered
# The bindings on the array, each as its users load it: the Python
# binding, the C API (libp2pdma.so) and the cuFile library read the file
# and the array's device (past the file system, whose superblock on the
# device lags the kernel's copy while it is mounted), and write a file
# beside it.
for api in python capi cufile; do
	check "array-file-$api" /usr/bin/python3 /suite/arrays_checks.py --api $api --name file --target /mnt/f.bin \
		--write "/mnt/$api.bin"
	check "array-dev-$api" /usr/bin/python3 /suite/arrays_checks.py --api $api --name md5 --target /dev/md5 \
		--at $((48 * M + 4096))
done
mkdir -p /mnt/tests && cp /tests/libp2pdma-pwrite-model /mnt/tests/
# Shorter on the debug kernel (see debug_kernel): 24 sequences took 180 s
# there, 11 s on the base kernel.
cases=24
debug_kernel && cases=8
if out=$(env P2PDMA_MODEL_DIR=/mnt P2PDMA_MODEL_MEM=module P2PDMA_MODEL_PATHS=p2p,bounce PROPTEST_CASES=$cases \
	/mnt/tests/libp2pdma-pwrite-model --test-threads 1 2>&1); then
	echo "$out"
	case $out in
	*skipped* | *"not checked"*) fail array-file-pwrite-model "a test skipped" ;;
	*) pass array-file-pwrite-model ;;
	esac
else
	echo "$out"
	fail array-file-pwrite-model "$(echo "$out" | grep -m1 -e FAILED -e panicked)"
fi
rm -rf /mnt/tests
check umount-array umount /mnt
stoparray md5

# The library's own striped volumes over the member controllers, taken
# from the nvme driver (VFIO's no-IOMMU mode) and given back after each
# step: over two members (64 KiB chunks, data from 64 MiB on each) and
# over four (128 KiB chunks, from 80 MiB), each in a window of its own;
# then one over m2 and the member with the bad block (from 56 MiB), whose
# bad block lies in the volume's chunk 129.
pat() { echo $(((256 + 96 * $1) * M)); }
check_held volume2-data p2pdma-vmtest volume --step data --hold --chunk 65536 --data-offset $((64 * M)) \
	--window $((32 * M)) --write-pattern $((900 * M)) \
	--serials p2pdma-m0,p2pdma-m1 --nsids 10,11 --images m0.img,m1.img --pattern-offsets "$(pat 0),$(pat 1)"
check_held volume4-data p2pdma-vmtest volume --step data --hold --chunk 131072 --data-offset $((80 * M)) \
	--window $((64 * M)) --write-pattern $((950 * M)) \
	--serials p2pdma-m0,p2pdma-m1,p2pdma-m2,p2pdma-m3 --nsids 10,11,12,13 \
	--images m0.img,m1.img,m2.img,m3.img --pattern-offsets "$(pat 0),$(pat 1),$(pat 2),$(pat 3)"
check volume-bad-member p2pdma-vmtest volume --step bad-member --chunk 65536 --data-offset $((56 * M)) \
	--window $((8 * M)) --bad-offset $((129 * 65536)) \
	--serials p2pdma-m2,p2pdma-mbad --nsids 12,15 --images m2.img,mbad.img --pattern-offsets "$(pat 2),$((736 * M))"
# A member that stops answering (its bus mastering off) under running
# reads of a volume: the read fails within the command timeout, naming it.
check volume-member-stalls p2pdma-vmtest volume --step stall --chunk 65536 --data-offset $((64 * M)) \
	--window $((32 * M)) --serials p2pdma-m0,p2pdma-m1 --nsids 10,11 --images m0.img,m1.img \
	--pattern-offsets "$(pat 0),$(pat 1)"
# The command line on a volume path: copied into a file, whose bytes must
# be the members' where the layout puts them (the reference cut from the
# members' block devices while the kernel still has them); then, the
# controllers left with vfio-pci, described by PCI address and NSID.
M0=$(ns_dev 10) M1=$(ns_dev 11)
m0pci=$(basename "$(readlink -f "/sys/block/${M0#/dev/}/device/device")")
m1pci=$(basename "$(readlink -f "/sys/block/${M1#/dev/}/device/device")")
rm -f /tmp/vol.ref
i=0
while [ $i -lt 48 ]; do
	if [ $((i % 2)) = 0 ]; then dev=$M0; else dev=$M1; fi
	dd if="$dev" bs=65536 skip=$((1024 + i / 2)) count=1 2>/dev/null >>/tmp/vol.ref
	i=$((i + 1))
done
check volume-ctl-copy p2pdma-ctl copy "volume:64K@64M:$M0,$M1" /tmp/vol.out --len 3M --through host
check volume-ctl-copy-bytes cmp /tmp/vol.out /tmp/vol.ref
out=$(p2pdma-ctl describe "volume:64K@64M:$m0pci/10,$m1pci/11" 2>&1)
echo "$out"
case $out in
"striped volume (64 KiB chunks) over $m0pci namespace 10, $m1pci namespace 11: 64 MiB, 2 members, data from 64 MiB on each"*"into accelerator memory: queues: "*"data on each of its 2 members"*)
	pass volume-describe ;;
*) fail volume-describe "$(echo "$out" | head -n 1)" ;;
esac
out=$(p2pdma-ctl doctor "volume:64K@64M:$m0pci/10,$m1pci/11" 2>&1)
case $out in
*"2 members, data from 64 MiB on each"*"data on each of its 2 members, accelerator 0's memory mapped for the controller (DMA_MAP)"*)
	pass volume-doctor ;;
*) fail volume-doctor "$(echo "$out" | tail -n 1)" ;;
esac
# The Python binding and the C API on the same volume path.
for api in python capi; do
	check "volume-$api" /usr/bin/python3 /suite/arrays_checks.py --api $api --name volume --path queues \
		--target "volume:64K@64M:$m0pci/10,$m1pci/11" --ref /tmp/vol.ref
done
for bdf in "$m0pci" "$m1pci"; do
	echo >"/sys/bus/pci/devices/$bdf/driver_override"
	echo "$bdf" >/sys/bus/pci/drivers/vfio-pci/unbind
	echo "$bdf" >/sys/bus/pci/drivers_probe
done
rm -f /tmp/vol.out /tmp/vol.ref
# The controllers are the nvme driver's again, perhaps under other names.
M0=$(ns_dev 10) M1=$(ns_dev 11) M2=$(ns_dev 12) M3=$(ns_dev 13)

# A member removed under a running read of a mirror: the read neither
# hangs nor returns wrong bytes (the other leg serves them).
mkarray md8 1 - 52 10 "$M0" "$M1"
L=$(md_layout /dev/md8)
check raid1-remove-write p2pdma-vmtest engine-write --nvme /dev/md8 --array-layout "$L" --path bounce \
	--offset 0 --len $((8 * M)) --pattern-offset $((71 * M)) --expect-path bounce
m1pci=$(basename "$(readlink -f "/sys/block/${M1#/dev/}/device/device")")
timeout 300 p2pdma-vmtest engine-read --nvme /dev/md8 --array-layout "$L" --path p2p \
	--offset 0 --len $((8 * M)) --expect-path p2p --hold >/tmp/held.raid1-member-removed 2>&1 &
reader=$!
# The removal once the read is in flight on the array (its reads in
# /sys/block/md8/inflight), not before the reader has chosen its path.
until=$(($(date +%s) + 120)) i=0
while kill -0 $reader 2>/dev/null; do
	read -r inflight _ </sys/block/md8/inflight
	[ "$inflight" -gt 0 ] && break
	i=$((i + 1))
	if [ $((i % 200)) = 0 ] && [ "$(date +%s)" -gt $until ]; then break; fi
done
echo 1 >"/sys/bus/pci/devices/$m1pci/remove"
i=0
while ! grep -q '^@@HELD' /tmp/held.raid1-member-removed && kill -0 $reader 2>/dev/null && [ $i -lt 1500 ]; do
	sleep 0.2
	i=$((i + 1))
done
cat /tmp/held.raid1-member-removed
if grep -q '^@@HELD' /tmp/held.raid1-member-removed; then
	pass raid1-member-removed
	held_pids="$held_pids $reader"
else
	fail raid1-member-removed "the read under the removal did not finish with the bytes: $(tail -n 1 /tmp/held.raid1-member-removed)"
	kill $reader 2>/dev/null
fi
stoparray md8
# A RAID0 whose member is removed: a read fails with the error and names
# the member that is gone.
mkarray md9 0 64 52 - "$M2" "$M3"
m3pci=$(basename "$(readlink -f "/sys/block/${M3#/dev/}/device/device")")
echo 1 >"/sys/bus/pci/devices/$m3pci/remove"
check raid0-member-gone-read-fails timeout 300 p2pdma-vmtest engine-read --nvme /dev/md9 --path bounce \
	--offset 0 --len $((M)) --expect-path bounce --expect-errno EIO \
	--expect-error "member ${M3#/dev/} (slot 1) of md array md9: its device is gone"
stoparray md9

release_held
rmmod p2pdma
exit "$failures"
