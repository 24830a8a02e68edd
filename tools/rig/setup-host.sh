#!/usr/bin/env bash
# Installs what the kernel build, the module build and the VM rig need on a
# Debian bookworm machine with rustup. Idempotent: a second run only checks.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

PKGS=(
	make gcc libc6-dev git xz-utils cpio bc flex bison libelf-dev libssl-dev
	"clang${LLVM_SUFFIX}" "lld${LLVM_SUFFIX}" "llvm${LLVM_SUFFIX}" "libclang${LLVM_SUFFIX}-dev"
	qemu-system-x86 busybox-static fio nvme-cli iproute2 python3 python3-venv pkg-config e2fsprogs shellcheck
)

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
	SUDO=
	[ "$(id -u)" = 0 ] || SUDO=sudo
	run_logged "apt-get update" "$P2PDMA_CACHE/apt-update.log" $SUDO apt-get update
	run_logged "installing ${missing[*]}" "$P2PDMA_CACHE/apt-install.log" \
		env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

command -v rustup >/dev/null || die "rustup is required (https://rustup.rs)"
# The kernel builds core from rust-src with the host's default toolchain;
# the test command checks formatting and lints (rustfmt, clippy); the test
# binaries that go into the VM are linked statically against musl.
components=$(rustup component list --installed)
for c in rust-src rustfmt clippy; do
	grep -q "^$c" <<<"$components" || rustup component add "$c"
done
targets=$(rustup target list --installed)
grep -qx x86_64-unknown-linux-musl <<<"$targets" || rustup target add x86_64-unknown-linux-musl

if ! command -v bindgen >/dev/null; then
	run_logged "cargo install bindgen-cli" "$P2PDMA_CACHE/bindgen-install.log" \
		cargo install --locked bindgen-cli
fi
log "host toolchain ready: $(rustc --version), bindgen $(bindgen --version | awk '{print $2}'), clang$LLVM_SUFFIX"
