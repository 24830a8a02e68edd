# Helpers for guest suites (busybox sh). Each check prints one
# "@@TEST name PASS" or "@@TEST name FAIL why" line for the host to count.

failures=0

pass() { echo "@@TEST $1 PASS"; }
fail() {
	echo "@@TEST $1 FAIL $2"
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
		echo "$out"
		fail "$name" "'$*' exited $?: $(echo "$out" | tail -n 1)"
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

# The first PCI device bound to the p2pdma driver.
accel_dev() {
	for d in /sys/bus/pci/drivers/p2pdma/0*; do
		[ -e "$d" ] && basename "$d" && return 0
	done
	return 1
}
