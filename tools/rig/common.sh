# Shared settings for the build and VM scripts. Sourced, not executed.
# shellcheck shell=bash

set -Eeuo pipefail
# Command substitutions stop at a failing command too (bash clears -e in
# them otherwise).
shopt -s inherit_errexit

# shellcheck disable=SC2034 # used by the scripts that source this file
P2PDMA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
P2PDMA_CACHE=${P2PDMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/p2pdma}
KERNEL_SERIES=${KERNEL_SERIES:-7.3}
LLVM_SUFFIX=${LLVM_SUFFIX:--19}
export LIBCLANG_PATH=${LIBCLANG_PATH:-/usr/lib/llvm${LLVM_SUFFIX}/lib}
export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p "$P2PDMA_CACHE"

log() { printf '\033[1m[p2pdma]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[p2pdma] error:\033[0m %s\n' "$*" >&2; exit 1; }

# No step fails silently: a command that stops a script under set -e says
# what it was and where (set -E carries this into functions and subshells).
on_error() {
	local rc=$?
	printf '\033[1;31m[p2pdma] error:\033[0m "%s" failed with status %d (%s line %d)\n' \
		"$BASH_COMMAND" "$rc" "${BASH_SOURCE[1]:-$0}" "${BASH_LINENO[0]}" >&2
}
trap on_error ERR

# run_logged WHAT LOG CMD...: runs a long command (or a function) with its
# output in LOG, printing a heartbeat every 15 s with the elapsed time and the
# log's last line so progress stays visible. If it fails, the end of LOG is
# shown and the script stops with an error naming WHAT and LOG.
run_logged() {
	local what=$1 logf=$2
	shift 2
	log "$what (log: $logf)"
	local start=$SECONDS
	"$@" >"$logf" 2>&1 &
	local pid=$!
	heartbeat "$what" "$logf" "$start" &
	local beat=$! rc=0
	wait "$pid" || rc=$?
	kill "$beat" 2>/dev/null || true
	wait "$beat" 2>/dev/null || true
	if ((rc != 0)); then
		tail -n 40 "$logf" >&2
		die "$what failed (status $rc) after $((SECONDS - start))s; full log in $logf"
	fi
	log "$what done in $((SECONDS - start))s"
}

heartbeat() {
	while sleep 15 >/dev/null 2>&1; do
		printf '[p2pdma]   %s: %ds  %s\n' "$1" $((SECONDS - $3)) \
			"$(tail -n 1 "$2" 2>/dev/null | cut -c1-100)" >&2
	done
}

# step WHAT LOG CMD...: a short command with its output added to LOG. If it
# fails, the end of LOG is shown and the script stops with an error naming
# WHAT and LOG.
step() {
	local what=$1 logf=$2 rc=0
	shift 2
	"$@" >>"$logf" 2>&1 || rc=$?
	if ((rc != 0)); then
		tail -n 20 "$logf" >&2
		die "$what failed (status $rc); full log in $logf"
	fi
}

# The Debian mirror is the one this machine's apt already uses.
debian_mirror() {
	if [ -n "${P2PDMA_DEBIAN_MIRROR:-}" ]; then echo "$P2PDMA_DEBIAN_MIRROR"; return; fi
	local m
	m=$(awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ {print u; exit}' \
		/etc/apt/sources.list.d/*.sources 2>/dev/null || true)
	[ -n "$m" ] || m=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' \
		/etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
	[ -n "$m" ] || die "cannot find a Debian mirror in /etc/apt; set P2PDMA_DEBIAN_MIRROR"
	echo "${m%/}"
}

# with_libs DIR PROGRAM...: the loader and the libraries the programs
# (already copied under DIR, an initramfs) link against, at the host's paths
# under DIR.
with_libs() {
	local dir=$1 lib
	shift
	for lib in $(ldd "$@" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib64/{print $1}' | sort -u); do
		mkdir -p "$dir$(dirname "$lib")"
		cp -L "$lib" "$dir$lib"
	done
}
