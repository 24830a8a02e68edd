#!/usr/bin/env bash
# Builds everything the VM needs: the kernel (cached), the module against it,
# and the statically linked userspace programs. Prints the kernel tree path.
source "$(dirname "$0")/common.sh"

tree=$("$P2PDMA_ROOT/tools/rig/kernel.sh")

log "building the module against $tree"
start=$SECONDS
make -C "$tree" LLVM="$LLVM_SUFFIX" M="$P2PDMA_ROOT" modules >"$P2PDMA_CACHE/module-build.log" 2>&1 || {
	cat "$P2PDMA_CACHE/module-build.log" >&2
	die "module build failed"
}
grep -E 'warning|error' "$P2PDMA_CACHE/module-build.log" >&2 || true
log "module built in $((SECONDS - start))s: kmod/p2pdma.ko"

log "building the static userspace programs (musl)"
(cd "$P2PDMA_ROOT" && cargo build --quiet --release --locked --target x86_64-unknown-linux-musl \
	-p p2pdma-ctl -p p2pdma-tests) || die "userspace build failed"
echo "$tree"
