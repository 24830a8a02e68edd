# Shared settings for the build and VM scripts. Sourced, not executed.
# shellcheck shell=bash

set -Eeuo pipefail

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

# Run a long command with its output in a log file, printing a heartbeat with
# the elapsed time and the log's last line so progress stays visible.
run_logged() {
	local what=$1 logf=$2
	shift 2
	log "$what (log: $logf)"
	local start=$SECONDS
	"$@" >"$logf" 2>&1 &
	local pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		sleep 15
		kill -0 "$pid" 2>/dev/null || break
		printf '[p2pdma]   %s: %ds  %s\n' "$what" $((SECONDS - start)) \
			"$(tail -n 1 "$logf" 2>/dev/null | cut -c1-100)" >&2
	done
	if ! wait "$pid"; then
		tail -n 40 "$logf" >&2
		die "$what failed after $((SECONDS - start))s; full log in $logf"
	fi
	log "$what done in $((SECONDS - start))s"
}
