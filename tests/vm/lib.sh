# shellcheck shell=sh
# Helpers for guest suites (busybox sh). Each check prints one
# "@@TEST name PASS" or "@@TEST name FAIL why" line for the host to count.

failures=0

# Kernel messages stay in the ring buffer (the host reads it, dumped at the
# end) and off the console, where an error the kernel prints while a check
# reports (an I/O a test makes fail, say) would split its "@@TEST" line.
# A panic still prints everything.
dmesg -n 1 2>/dev/null || true

# The rig's namespaces by NSID: 1 holds the raw image, 2 the ext4
# filesystem. The kernel names namespaces in the order its asynchronous scan
# finds them, so nvme0n1 is not always NSID 1.
ns_dev() {
	i=0
	while [ $i -lt 100 ]; do
		for d in /sys/block/nvme*; do
			[ "$(cat "$d/nsid" 2>/dev/null)" = "$1" ] && [ -b "/dev/${d##*/}" ] && echo "/dev/${d##*/}" && return 0
		done
		i=$((i + 1))
		sleep 0.1
	done
	echo "/dev/no-nvme-nsid-$1"
}
NVME=$(ns_dev 1)
FSDEV=$(ns_dev 2)
# The generic (NVMe command) nodes of those namespaces, for the suites.
# shellcheck disable=SC2034 # used by the suites that source this file
NVME_NG=/dev/ng${NVME#/dev/nvme}
# shellcheck disable=SC2034
FSDEV_NG=/dev/ng${FSDEV#/dev/nvme}
# The controller of namespace 1 (the kernel numbers controllers in the order
# its asynchronous probes get there).
# shellcheck disable=SC2034
NVME_CTRL=$(basename "$(readlink -f "/sys/block/${NVME#/dev/}/device")")

# The switch topology's other namespaces: NSID 3 is shared by two
# controllers of one subsystem (a native-multipath head), NSID 4 is
# formatted with 8 bytes of metadata (protection information) per block.
# mp_paths DEV: "path NAME (CONTROLLER at PCI)" for each path of a multipath
# head, one a line, as the library names them.
mp_paths() {
	for p in /sys/block/"${1#/dev/}"/multipath/*; do
		real=$(readlink -f "$p")
		ctrl=$(dirname "$real")
		echo "path ${p##*/} (${ctrl##*/} at $(basename "$(dirname "$(dirname "$ctrl")")"))"
	done
}

# The reason a path choice was made, from "Why: ..." in p2pdma-vmtest's
# output, or the path's reason in a doctor's JSON report.
why_of() { sed -n 's/.*Why: //p'; }
json_reason() { sed -n 's/.*"path":"[a-z0-9-]*","reason":"\([^"]*\)".*/\1/p'; }

# say TEXT: a line of the suite's story in words, which the host shows on
# the terminal (the demo tells one).
say() { echo "@@SAY $*"; }

# say_output CMD...: CMD's output, indented, as part of the story.
say_output() { "$@" 2>&1 | grep -v '^@@' | sed 's/^/@@SAY     /'; }

# Each verdict is followed by "@@TIME name SECONDS": the guest's seconds
# since the verdict before it, so a slow suite shows where its time goes.
clock_last=$(cut -d. -f1 /proc/uptime)
clock() {
	clock_now=$(cut -d. -f1 /proc/uptime)
	echo "@@TIME $1 $((clock_now - clock_last))"
	clock_last=$clock_now
}
pass() {
	echo "@@TEST $1 PASS"
	clock "$1"
}
fail() {
	echo "@@TEST $1 FAIL $2"
	clock "$1"
	failures=$((failures + 1))
}

# check NAME CMD...: passes when CMD succeeds.
check() {
	name=$1
	shift
	if out=$("$@" 2>&1); then
		[ -n "$out" ] && echo "$out"
		pass "$name"
	else
		check_rc=$?
		echo "$out"
		fail "$name" "'$*' exited $check_rc: $(echo "$out" | tail -n 1)"
	fi
}

# check_fails NAME CMD...: passes when CMD fails.
check_fails() {
	name=$1
	shift
	if out=$("$@" 2>&1); then
		echo "$out"
		fail "$name" "'$*' succeeded but should have failed"
	else
		echo "$out"
		pass "$name"
	fi
}

# check_refused NAME TEXT CMD...: passes when CMD fails with TEXT in what
# it prints (the reason it was refused).
check_refused() {
	name=$1 text=$2
	shift 2
	if out=$("$@" 2>&1); then
		echo "$out"
		fail "$name" "'$*' succeeded but should have been refused"
	else
		echo "$out"
		case $out in
		*"$text"*) pass "$name" ;;
		*) fail "$name" "'$*' failed without saying \"$text\": $(echo "$out" | tail -n 1)" ;;
		esac
	fi
}

# The first PCI device bound to the p2pdma driver.
accel_dev() {
	for d in /sys/bus/pci/drivers/p2pdma/0*; do
		[ -e "$d" ] && basename "$d" && return 0
	done
	return 1
}

# check_held NAME CMD...: runs CMD (which must end by printing "@@HELD" and
# then sleeping, to keep its device memory allocated) in the background and
# passes once it is held; fails if CMD exits first or does not get there in
# 120 s. release_held kills every held process.
held_pids=
check_held() {
	name=$1
	shift
	log=/tmp/held.$name
	"$@" >"$log" 2>&1 &
	pid=$!
	i=0
	while ! grep -q '^@@HELD' "$log"; do
		if ! kill -0 $pid 2>/dev/null || [ $i -ge 1200 ]; then
			cat "$log"
			fail "$name" "'$*' did not reach the held state: $(tail -n 1 "$log")"
			kill $pid 2>/dev/null
			return
		fi
		i=$((i + 1))
		sleep 0.1
	done
	grep -v '^@@HELD' "$log"
	held_pids="$held_pids $pid"
	pass "$name"
}

# held_output NAME: what the program that check_held NAME started printed.
held_output() { cat "/tmp/held.$1"; }

release_held() {
	for p in $held_pids; do kill "$p" 2>/dev/null; done
	for p in $held_pids; do wait "$p" 2>/dev/null; done
	held_pids=
}

# True on the debug kernel (KASAN, lockdep, kmemleak, DMA-API checks),
# which runs most checks two to five times as slowly, and random sequences
# of small system calls up to sixteen times: the suites run their longest
# userspace checks (random sequences, kill loops) shorter there, since the
# base kernel runs them whole and the debug one is there to watch the
# kernel's side, which a few cases already cover.
debug_kernel() { [ -e /sys/kernel/debug/kmemleak ]; }

# On kernels with kmemleak (the debug variant): scan twice, past the minimum
# object age, and fail on any report.
check_kmemleak() {
	k=/sys/kernel/debug/kmemleak
	[ -e $k ] || return 0
	echo scan >$k
	sleep 6
	echo scan >$k
	leaks=$(cat $k)
	if [ -z "$leaks" ]; then
		pass kmemleak-clean
	else
		echo "$leaks" | head -n 40
		fail kmemleak-clean "$(echo "$leaks" | grep -c 'unreferenced object') unreferenced object(s)"
	fi
}

# The rig's filesystem (ext4 on the NVMe's second namespace) at /mnt.
mount_rigfs() {
	mkdir -p /mnt
	check rigfs-mounts mount -t ext4 "$FSDEV" /mnt
}

# Unmounting writes everything back, so the host can read the image.
umount_rigfs() {
	check rigfs-unmounts umount /mnt
}
