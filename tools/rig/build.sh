#!/usr/bin/env bash
# Builds everything the VM needs: the kernel (cached), the module against it,
# and the statically linked userspace programs. Prints the kernel tree path.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

tree=$("$P2PDMA_ROOT/tools/rig/kernel.sh")

log "building the module against $tree"
start=$SECONDS
make -C "$tree" LLVM="$LLVM_SUFFIX" M="$P2PDMA_ROOT" modules >"$P2PDMA_CACHE/module-build.log" 2>&1 || {
	cat "$P2PDMA_CACHE/module-build.log" >&2
	die "module build failed (log: $P2PDMA_CACHE/module-build.log)"
}
grep -E 'warning|error' "$P2PDMA_CACHE/module-build.log" >&2 || true
log "module built in $((SECONDS - start))s: kmod/p2pdma.ko"

log "building the static userspace programs (musl)"
(cd "$P2PDMA_ROOT" && cargo build --quiet --release --locked --target x86_64-unknown-linux-musl \
	-p p2pdma-ctl -p p2pdma-tests) || die "cargo build of p2pdma-ctl and p2pdma-tests (musl) failed; its errors are above"
# The library's tests that need a real NVMe namespace with a filesystem run
# in the guest too: its unit tests (the FIEMAP mapping, checked against the
# raw device) and the NVMe-command tests on files.
guest_json="$P2PDMA_CACHE/guest-tests.json"
(cd "$P2PDMA_ROOT" && cargo test --quiet --release --locked --target x86_64-unknown-linux-musl \
	-p libp2pdma --no-run --message-format=json) >"$guest_json" ||
	die "cargo test --no-run of the library's tests for the guest (musl) failed; its errors are above, its messages in $guest_json"
python3 - "$guest_json" "$P2PDMA_ROOT/target/guest-tests" <<'PY' || die "the guest test binaries are not among cargo's artifacts ($guest_json)"
import json, os, shutil, sys
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
want = {
    ("lib", "p2pdma"): "libp2pdma-unit",
    ("test", "nvme_files"): "libp2pdma-nvme-files",
    ("test", "pwrite_model"): "libp2pdma-pwrite-model",
}
found = set()
for line in open(src):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    key = (m["target"]["kind"][0], m["target"]["name"])
    if key in want:
        shutil.copy(m["executable"], os.path.join(out, want[key]))
        found.add(key)
missing = [want[k] for k in want if k not in found]
if missing:
    sys.exit("missing test binaries: " + ", ".join(missing))
PY
echo "$tree"
