# shellcheck shell=sh
# NVMe over Fabrics from a second machine (switch topology): the storage
# machine (tools/rig/target.sh, tests/vm/fabrics-target.sh) exports its
# namespaces with the kernel's target over TCP on two ports and over RDMA
# (soft RoCE) on a third, to this machine's host NQN only, with
# DH-HMAC-CHAP. This machine connects with nvme-cli on both TCP ports
# (native multipath: one head, two paths), later over RDMA alone, checks
# that a host without the key is refused, and moves the remote namespace's
# bytes into accelerator memory and back, each checked here and on the
# host in the storage machine's image (remote.img).
# shellcheck source=lib.sh
. /suite/lib.sh

M=1048576
F=/suite/fabric
nqn=$(cat $F/subnqn)
hostnqn=$(cat $F/hostnqn)
hostid=$(cat $F/hostid)
key=$(cat $F/dhchap.key)
# A well-formed secret that is not the host's.
wrong_key=DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:

check module-loads insmod /lib/modules/p2pdma.ko
check network-up sh -c 'ip link set lo up && ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0'
# One request to the storage machine's target (see fabrics-ctl.sh).
target() { echo "$*" | nc -w 10 10.0.2.2 5000; }
reach() {
	i=0
	while [ "$i" -lt 60 ]; do
		[ "$(target ping 2>/dev/null)" = ok ] && return 0
		sleep 1
		i=$((i + 1))
	done
	return 1
}
if reach; then
	pass storage-machine-reachable
else
	fail storage-machine-reachable "no answer from 10.0.2.2 port 5000 in 60 s"
fi

connect() {
	port=$1
	shift
	nvme connect -t tcp -a 10.0.2.2 -s "$port" -n "$nqn" "$@"
}
# Refused: a host the subsystem does not allow (a host ID of its own, so
# that the target, not this kernel, refuses it), and the allowed host with
# a wrong secret.
intruder=00000000-0000-0000-0000-000000000001
if connect 4420 -q "nqn.2014-08.org.nvmexpress:uuid:$intruder" -I "$intruder" >/tmp/intruder.out 2>&1; then
	fail connect-refused-unknown-host "a host not in allowed_hosts connected: $(cat /tmp/intruder.out)"
else
	pass connect-refused-unknown-host
fi
if connect 4420 -q "$hostnqn" -I "$hostid" -S "$wrong_key" >/tmp/wrongkey.out 2>&1; then
	fail connect-refused-wrong-secret "the host connected with a wrong secret: $(cat /tmp/wrongkey.out)"
else
	pass connect-refused-wrong-secret
fi
# Keep-alive every 5 s, reconnects every 2 s, the controller given up
# after 300 s (the storage machine's restart below takes far less).
opts="-k 5 -c 2 -l 300"
# shellcheck disable=SC2086
check connect-port-4420 connect 4420 -q "$hostnqn" -I "$hostid" -S "$key" $opts
# shellcheck disable=SC2086
check connect-port-4421 connect 4421 -q "$hostnqn" -I "$hostid" -S "$key" $opts

# The remote namespaces: heads of the subsystem's namespaces 21 and 22.
remote_ns() {
	for s in /sys/class/nvme-subsystem/*; do
		[ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
		for d in "$s"/nvme*n*; do
			case ${d##*/} in *c*) continue ;; esac
			[ "$(cat "$d/nsid" 2>/dev/null)" = "$1" ] && echo "/dev/${d##*/}" && return 0
		done
	done
	return 1
}
# wait_ns NSID: the head of remote namespace NSID once its block device is
# there (at most 10 s after the connection).
wait_ns() {
	i=0
	until dev=$(remote_ns "$1") && [ -b "$dev" ] || [ $i -ge 100 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	echo "$dev"
}
R=$(wait_ns 21)
check remote-namespace test -b "$R"
r=${R#/dev/}
paths=$(find "/sys/block/$r/multipath/" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
if [ "$paths" = 2 ]; then pass remote-two-paths; else fail remote-two-paths "$r has $paths paths"; fi
for c in /sys/class/nvme/nvme*; do
	[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
	echo "@@NOTE ${c##*/}: $(cat "$c/transport") $(cat "$c/address") $(cat "$c/state")"
done

# The doctor names the transport, the target and the subsystem of each
# path, and says why no P2P.
p2pdma-ctl doctor "$R"
out=$(p2pdma-ctl --json doctor "$R" 2>&1)
case $out in
*'"address":"traddr=10.0.2.2,trsvcid=4420'*'"address":"traddr=10.0.2.2,trsvcid=4421'*)
	pass doctor-remote-paths ;;
*) fail doctor-remote-paths "$(echo "$out" | head -c 400)" ;;
esac
case $out in
*'"kind":"tcp"'*'"subsysnqn":"'"$nqn"'"'*) pass doctor-remote-transport ;;
*) fail doctor-remote-transport "$(echo "$out" | head -c 400)" ;;
esac
case $out in
*"NVMe/TCP carries the data through the network stack"*) pass doctor-remote-why-no-p2p ;;
*) fail doctor-remote-why-no-p2p "$(echo "$out" | head -c 400)" ;;
esac

# Reads into accelerator memory and writes from it: AUTO takes the bounce
# path and says why; every byte checked in the guest (a buffered read of
# the namespace) and on the host in remote.img.
check_held remote-read-auto p2pdma-vmtest engine-read --nvme "$R" --offset $((3 * M + 4096)) \
	--len $((2 * M + 77)) --expect-path bounce --expect-reason "NVMe/TCP carries the data" \
	--verify-buffered --image remote.img --hold
check remote-write-auto p2pdma-vmtest engine-write --nvme "$R" --offset $((40 * M)) \
	--len $((M + 4096)) --pattern-offset $((2000 * M)) --expect-path bounce --verify-buffered --image remote.img
check remote-ctl-copy p2pdma-ctl copy "$R" accel:0 --offset 4096 --len 4M --verify

# The remote namespace measured from this machine against fio on it:
# sequential reads into accelerator memory (fio's sweep for its best, the
# pipeline's sweep, AUTO), 4 KiB reads one at a time, and CPU per GiB.
# Both machines run on the host's CPUs, emulated: the ratios compare
# paths in this one guest, not hardware. Every contender's bytes checked.
# Before the failover below, whose read holds most of the accelerator's
# memory until the end.
# AUTO learns the remote namespace's chunk and depth on its first read of
# 32 MiB (a network's round trip, which sysfs does not give, sets what must
# be in flight), keeps them in its cache directory, and the bench's AUTO
# starts from them.
geo=$(mktemp -d)
out=$(P2PDMA_CACHE_DIR=$geo p2pdma-ctl copy "$R" accel:0 --len 32M --verify 2>&1)
echo "$out"
rdev=$(cat "/sys/block/${R#/dev/}/dev")
case $out in
*"geometry: "*"learned by calibration"*)
	if grep -q "^$rdev	" "$geo/geometry"; then
		pass remote-geometry-learned
	else
		fail remote-geometry-learned "no line for $rdev in $geo/geometry: $(cat "$geo/geometry" 2>&1)"
	fi ;;
*) fail remote-geometry-learned "$(echo "$out" | grep geometry)" ;;
esac
check bench-remote-storage env P2PDMA_CACHE_DIR="$geo" \
	p2pdma-ctl bench storage --file "$R" --accel --size 32M --reps 7
check bench-remote-small p2pdma-ctl bench small --file "$R" --size 32M --reps 1
check bench-remote-cpu p2pdma-ctl bench cpu --nvme "$R" --size 16M --reps 24

# A path lost under a running read: its port taken away on the target
# once the read has begun, the multipath head fails over to the other and
# the read completes, its bytes right; then the port comes back.
# One 64 KiB chunk in flight at a time: a read long enough to lose its
# path midway on any machine.
p2pdma-vmtest engine-read --nvme "$R" --offset $((8 * M)) --len $((48 * M)) --expect-path bounce \
	--setting chunk=64K --setting depth=1 --verify-buffered --image remote.img --hold >/tmp/held.failover 2>&1 &
reader=$!
i=0
until grep -q 'The engine chose' /tmp/held.failover || [ $i -ge 600 ]; do
	sleep 0.05
	i=$((i + 1))
done
port() {
	answer=$(target "port-$1" "$2")
	if [ "$answer" = ok ]; then pass "port-$2-$1"; else fail "port-$2-$1" "the target answered: $answer"; fi
}
port off 1
# The port went away under the read, not after it.
if grep -q '^Moved' /tmp/held.failover; then
	fail remote-read-running-at-path-loss "the read had ended before the port went away"
else
	pass remote-read-running-at-path-loss
fi
i=0
while ! grep -q '@@HELD' /tmp/held.failover && kill -0 $reader 2>/dev/null && [ $i -lt 1200 ]; do
	sleep 0.1
	i=$((i + 1))
done
cat /tmp/held.failover
if grep -q '@@HELD' /tmp/held.failover; then
	pass remote-read-fails-over
	held_pids="$held_pids $reader"
else
	fail remote-read-fails-over "$(tail -n 3 /tmp/held.failover)"
fi
port on 1
# The lost path comes back: its controller reconnects (every 2 s).
all_live() {
	i=0
	while [ $i -lt "${1:-600}" ]; do
		n=0 live=0
		for c in /sys/class/nvme/nvme*; do
			[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
			n=$((n + 1))
			[ "$(cat "$c/state")" = live ] && live=$((live + 1))
		done
		[ $n -gt 0 ] && [ $n = $live ] && return 0
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}
if all_live; then pass remote-path-back; else fail remote-path-back "a controller of $nqn is not live 60 s after its port came back"; fi

# NVMe commands the library builds, sent through the remote namespace's
# generic device (ng): into host memory they cross the network as the
# kernel's own reads do; into accelerator memory they would need P2P,
# which NVMe/TCP cannot carry: refused, with the transport's reason.
check remote-nvme-cmd-host p2pdma-ctl copy "$R" host --path nvme-cmd --offset 4096 --len 3M --verify
check_refused remote-nvme-cmd-accel-refused "NVMe/TCP carries the data" \
	p2pdma-ctl copy "$R" accel:0 --path nvme-cmd --offset 4096 --len 1M

# The storage machine's power cut under one process, which reads before,
# while it is gone (an error within the time the connection allows, I/O
# failing fast 5 s after a controller is lost) and once it is back (the
# same open file); the host cuts and restores it when the program asks on
# the console.
for c in /sys/class/nvme/nvme*; do
	[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] && echo 5 >"$c/fast_io_fail_tmo"
done
if p2pdma-vmtest outage --nvme "$R" --nqn "$nqn" --pattern-offset $((1024 * M)) --fail-within 60; then
	pass remote-storage-lost-and-back
else
	fail remote-storage-lost-and-back "see the lines above"
fi

# The object store on the remote namespace 22, updated until the storage
# machine's power is cut under it; once the machine is back, the store
# reopened here must have its superblock and every byte that was flushed,
# and the map of the last operation that returned (or of the one in
# flight).
S=$(remote_ns 22)
check remote-store-namespace test -b "$S"
# Flushes completed on the namespace's paths (field 16 of each path's
# stat): the power cut loses nothing the drive wrote, so it cannot tell a
# store that flushes from one that does not; these counters can.
flushes() {
	t=0
	for p in "/sys/block/${S#/dev/}/multipath/"*; do
		t=$((t + $(awk '{print $16 + 0}' "$p/stat")))
	done
	echo "$t"
}
flushed_before=$(flushes)
p2pdma-vmtest store-crash --child --path "$S" --seed 36 --prefix "@@RS " >/tmp/rstore.log 2>/tmp/rstore.err &
writer=$!
returned() { grep -c '^@@RS E' /tmp/rstore.log; }
i=0
until [ "$(returned)" -ge 150 ] || ! kill -0 $writer 2>/dev/null || [ $i -ge 1800 ]; do
	sleep 0.1
	i=$((i + 1))
done
echo "@@NOTE remote store: $(returned) operations returned before the power cut"
echo "@@HOST target-stop"
i=0
while kill -0 $writer 2>/dev/null && [ $i -lt 1200 ]; do
	sleep 0.1
	i=$((i + 1))
done
if kill -0 $writer 2>/dev/null; then
	kill -9 $writer
	fail remote-store-fails-at-power-cut "the store's process neither failed nor ended 120 s after the power cut"
elif wait $writer; then
	fail remote-store-fails-at-power-cut "the store's process ended well with its storage gone"
else
	pass remote-store-fails-at-power-cut
	echo "@@NOTE the store's process, after the power cut: $(tail -n 1 /tmp/rstore.err)"
fi
# Every create that returned made its object durable: a flush each, at
# least, reached the storage machine.
creates=$(awk '$2 == "B" {op = $3} $2 == "E" && $3 != "FULL" && op == "C" {n++} END {print n + 0}' /tmp/rstore.log)
flushed=$(($(flushes) - flushed_before))
echo "@@NOTE remote store: $creates creates returned, $flushed flushes completed on the remote namespace"
if [ "$creates" -gt 0 ] && [ "$flushed" -ge "$creates" ]; then
	pass remote-store-flushes-reach-the-storage
else
	fail remote-store-flushes-reach-the-storage "$creates creates returned, $flushed flushes completed"
fi
echo "@@HOST target-start"
if all_live 1800; then pass remote-store-storage-back; else fail remote-store-storage-back "a controller of $nqn is not live 180 s after the storage machine's start"; fi
echo 3 >/proc/sys/vm/drop_caches
check remote-store-after-power-cut p2pdma-vmtest store-crash --path "$S" --check-log /tmp/rstore.log --prefix "@@RS "

# An md array of a local namespace and the remote one (RAID0; mdadm
# --build writes no superblock): P2P for none of its reads and writes,
# with the remote member and its transport named; the bounce path moves
# the bytes, checked against the kernel's buffered reads here and in the
# members' images on the host.
check mixed-array mdadm --build /dev/md20 --level=0 --raid-devices=2 --chunk=64 "$NVME" "$R"
md=/sys/block/md20/md
layout="$(cat $md/level),$(cat $md/chunk_size),nvme.img:0,remote.img:0"
p2pdma-ctl doctor /dev/md20
check_held mixed-array-read p2pdma-vmtest engine-read --nvme /dev/md20 --offset $((M + 512)) --len $((3 * M + 4096)) \
	--expect-path bounce --expect-reason "of md array md20" --expect-reason "NVMe/TCP carries the data" \
	--verify-buffered --array-layout "$layout" --hold
# At 116 MiB of the array: 58 MiB of each member, past what the failover's
# held read of the remote namespace covers.
check mixed-array-write p2pdma-vmtest engine-write --nvme /dev/md20 --offset $((116 * M)) --len $((M + 8192)) \
	--pattern-offset $((3000 * M)) --expect-path bounce --expect-reason "NVMe/TCP carries the data" \
	--verify-buffered --array-layout "$layout"
check_refused mixed-array-p2p-refused "NVMe/TCP carries the data" \
	p2pdma-ctl copy /dev/md20 accel:0 --path p2p --len 1M
check mixed-array-stop mdadm --stop /dev/md20

check disconnect nvme disconnect -n "$nqn"

# Over RDMA: soft RoCE (rxe) on this machine's NIC too, and the
# subsystem's RDMA port. rxe's DMA is virtual (the CPU copies), so no byte
# moves by P2P: the doctor and AUTO say so, forced P2P is refused, and the
# bounce path's bytes are checked here and in remote.img on the host.
check rxe-device rdma link add rxe0 type rxe netdev eth0
check connect-rdma nvme connect -t rdma -a 10.0.2.2 -s 4422 -n "$nqn" -q "$hostnqn" -I "$hostid" -S "$key"
RR=$(wait_ns 21)
check rdma-namespace test -b "$RR"
out=$(p2pdma-ctl --json doctor "$RR" 2>&1)
case $out in
*'"kind":"rdma"'*'"address":"traddr=10.0.2.2,trsvcid=4422'*) pass doctor-rdma-transport ;;
*) fail doctor-rdma-transport "$(echo "$out" | head -c 400)" ;;
esac
check_held rdma-read-auto p2pdma-vmtest engine-read --nvme "$RR" --offset $((60 * M + 512)) --len $((M + 99)) \
	--expect-path bounce --expect-reason "never over soft RDMA" --verify-buffered --image remote.img --hold
check_refused rdma-p2p-refused "never over soft RDMA" p2pdma-ctl copy "$RR" accel:0 --path p2p --len 1M
check disconnect-rdma nvme disconnect -n "$nqn"

release_held
check module-unloads rmmod p2pdma
exit "$failures"
