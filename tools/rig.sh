#!/usr/bin/env bash
# The project's front door.
#
#   tools/rig.sh demo    install what is missing, build the kernel (cached),
#                        the module and the tools, boot the VM and read a
#                        region of the NVMe into accelerator memory by P2P,
#                        verifying on the host the bytes that landed
#   tools/rig.sh test    every test: the rig scripts' logic (stubbed, seconds)
#                        and shellcheck, host tests, then the VM suites on
#                        the switch and no-switch topologies, the dma and
#                        arrays suites, and the suites that must agree with
#                        an IOMMU on the iommu topology
#   tools/rig.sh setup | build | vm [vm.sh args]
#
# Environment: P2PDMA_CACHE (default ~/.cache/p2pdma), P2PDMA_KERNEL_TREE (use
# a built tree), P2PDMA_KVARIANT=debug, P2PDMA_KVM=1 (opt-in, may hang).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=rig/common.sh
source "$here/rig/common.sh"

cmd=${1:-demo}
shift || true
case $cmd in
setup) "$here/rig/setup-host.sh" ;;
build)
	"$here/rig/setup-host.sh"
	"$here/rig/build.sh" >/dev/null
	;;
vm)
	"$here/rig/setup-host.sh"
	"$here/rig/vm.sh" "$@"
	;;
demo)
	"$here/rig/setup-host.sh"
	"$here/rig/vm.sh" --suite demo --topology switch "$@"
	;;
test)
	start=$SECONDS
	total_pass=0 total_fail=0
	count() {
		local p f
		p=$(grep -cE '^PASS ' "$1" || true)
		f=$(grep -cE '^FAIL ' "$1" || true)
		total_pass=$((total_pass + p)) total_fail=$((total_fail + f))
	}
	results="$P2PDMA_ROOT/rig-out/test-results"
	mkdir -p "$results"
	log "$(df -h --output=avail "$P2PDMA_ROOT" | tail -n 1 | tr -d ' ') free on the disk (a cold run needs about 25 GiB: kernels, Python, builds)"

	# First, in seconds: the rig scripts' own logic against an empty
	# temporary cache, with the downloads and builds stubbed.
	log "rig logic: tests/rig/cold-logic.sh (stubbed steps, temporary cache)"
	"$P2PDMA_ROOT/tests/rig/cold-logic.sh" 2>&1 | tee "$results/cold-logic.txt" || true
	count "$results/cold-logic.txt"

	"$here/rig/setup-host.sh"
	log "shellcheck over the scripts in tools/ and tests/"
	mapfile -t scripts < <(cd "$P2PDMA_ROOT" && find tools tests -name '*.sh' | sort)
	if ! command -v shellcheck >/dev/null; then
		echo "FAIL host:shellcheck: shellcheck is not installed" >"$results/shellcheck.txt"
	elif (cd "$P2PDMA_ROOT" && shellcheck -x "${scripts[@]}" >"$results/shellcheck.log" 2>&1); then
		echo "PASS host:shellcheck (${#scripts[@]} scripts)" >"$results/shellcheck.txt"
	else
		echo "FAIL host:shellcheck: $(grep -c '^In ' "$results/shellcheck.log" || true) finding(s), see $results/shellcheck.log" >"$results/shellcheck.txt"
		head -n 40 "$results/shellcheck.log"
	fi
	cat "$results/shellcheck.txt"
	count "$results/shellcheck.txt"

	log "host tests: cargo test --workspace"
	if (cd "$P2PDMA_ROOT" && cargo test --workspace --locked 2>&1 | tee "$results/cargo-test.log"); then
		echo "PASS host:cargo-test" >"$results/host.txt"
	else
		echo "FAIL host:cargo-test" >"$results/host.txt"
	fi
	grep -hE '^test result:' "$results/cargo-test.log" || true
	log "host checks: rustfmt, clippy and rustdoc"
	if (cd "$P2PDMA_ROOT" && cargo fmt --all --check >"$results/rustfmt.log" 2>&1); then
		echo "PASS host:rustfmt" >>"$results/host.txt"
	else
		echo "FAIL host:rustfmt: $(grep -c '^Diff in' "$results/rustfmt.log" || true) hunks differ (cargo fmt --all)" >>"$results/host.txt"
	fi
	if (cd "$P2PDMA_ROOT" && cargo clippy --workspace --all-targets --locked -- -D warnings >"$results/clippy.log" 2>&1); then
		echo "PASS host:clippy" >>"$results/host.txt"
	else
		echo "FAIL host:clippy: $(grep -m1 -E '^(error|warning)' "$results/clippy.log" || true)" >>"$results/host.txt"
	fi
	if (cd "$P2PDMA_ROOT" && RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked >"$results/rustdoc.log" 2>&1); then
		echo "PASS host:rustdoc" >>"$results/host.txt"
	else
		echo "FAIL host:rustdoc: $(grep -m1 -E '^(error|warning)' "$results/rustdoc.log" || true)" >>"$results/host.txt"
	fi
	cat "$results/host.txt"
	count "$results/host.txt"
	# The Python binding against real files, in a virtual environment kept
	# in the cache (numpy, torch, safetensors, pytest).
	"$here/rig/python.sh" test "$results/python.txt" || echo "FAIL python:setup (see above)" >>"$results/python.txt"
	count "$results/python.txt"
	# The shipped shared libraries and wheel, built as they ship (zig, glibc
	# 2.17): the glibc versions they need, at most NVIDIA's libcufile's.
	"$here/rig/release.sh" test "$results/release.txt" || echo "FAIL release:setup (see above)" >>"$results/release.txt"
	count "$results/release.txt"

	# A build that fails is a failed check (its error is above), and the
	# suites that needed it do not run.
	if tree=$("$here/rig/build.sh"); then
		for suite in smoke module engine doctor; do
			for topo in switch noswitch; do
				P2PDMA_BUILT_TREE=$tree "$here/rig/vm.sh" --suite $suite --topology "$topo" \
					2>&1 | tee "$results/vm-$suite-$topo.txt" || true
				count "$results/vm-$suite-$topo.txt"
			done
		done
		# A device uses the DMA addresses the module returns: the dma suite
		# drives the rig's spare NVMe controller from user space (VFIO,
		# no IOMMU) with its queues and data in accelerator memory.
		P2PDMA_BUILT_TREE=$tree "$here/rig/vm.sh" --suite dma --topology switch \
			2>&1 | tee "$results/vm-dma-switch.txt" || true
		count "$results/vm-dma-switch.txt"
		# md arrays over the member controllers under the switch (and one
		# outside it), checked in every member's image.
		P2PDMA_BUILT_TREE=$tree "$here/rig/vm.sh" --suite arrays --topology switch \
			2>&1 | tee "$results/vm-arrays-switch.txt" || true
		count "$results/vm-arrays-switch.txt"
		# The object store across power cuts: QEMU killed mid-update, the
		# stores reopened by the next boot and checked.
		P2PDMA_BUILT_TREE=$tree "$here/rig/vm.sh" --suite power --topology switch \
			2>&1 | tee "$results/vm-power-switch.txt" || true
		count "$results/vm-power-switch.txt"
		# The Python binding in the guest: Debian's interpreter and the
		# binding's wheel in the initramfs, reads into accelerator memory by
		# P2P checked in the guest and in the BAR's backing file.
		P2PDMA_BUILT_TREE=$tree "$here/rig/vm.sh" --suite python --topology switch \
			2>&1 | tee "$results/vm-python-switch.txt" || true
		count "$results/vm-python-switch.txt"
		# A second machine's namespaces over NVMe/TCP (nvmet, DH-HMAC-CHAP,
		# two ports under native multipath), and a path lost mid-read.
		P2PDMA_BUILT_TREE=$tree P2PDMA_VM_TIMEOUT=600 "$here/rig/vm.sh" --suite fabrics --topology switch \
			2>&1 | tee "$results/vm-fabrics-switch.txt" || true
		count "$results/vm-fabrics-switch.txt"
		# The switch behind an emulated IOMMU, chosen on the guest's command
		# line, with the accelerator on its own root port (tools/rig/vm.sh
		# says why): the kernel refuses P2P there, so the module, engine
		# and doctor suites keep their no-switch expectations with every
		# DMA translated, and the dma suite checks that P2P_QUERY and
		# DMA_MAP agree.
		for suite in module engine doctor dma; do
			P2PDMA_BUILT_TREE=$tree P2PDMA_VM_TIMEOUT=600 "$here/rig/vm.sh" --suite $suite --topology iommu \
				2>&1 | tee "$results/vm-$suite-iommu.txt" || true
			count "$results/vm-$suite-iommu.txt"
		done
	else
		echo "FAIL build: the base kernel, the module or the programs (see above); no VM suite ran" | tee "$results/build.txt"
		count "$results/build.txt"
	fi
	# The module, engine, dma and arrays suites again on the debug kernel: KASAN,
	# lockdep, kmemleak and DMA-API debugging watch the module (and the
	# addresses it hands to a device) while the suite runs.
	if dtree=$(P2PDMA_KVARIANT=debug "$here/rig/build.sh"); then
		for suite in module engine dma arrays; do
			P2PDMA_BUILT_TREE=$dtree P2PDMA_VM_TIMEOUT=600 "$here/rig/vm.sh" --suite $suite --topology switch \
				--out "$P2PDMA_ROOT/rig-out/$suite-switch-debug" 2>&1 | tee "$results/vm-$suite-debug.txt" || true
			count "$results/vm-$suite-debug.txt"
		done
	else
		echo "FAIL build-debug: the debug kernel or the module (see above); the debug suites did not run" | tee "$results/build-debug.txt"
		count "$results/build-debug.txt"
	fi
	log "all tests done in $((SECONDS - start))s; $(df -h --output=avail "$P2PDMA_ROOT" | tail -n 1 | tr -d ' ') left on the disk"
	echo "p2pdma: $total_pass passed, $total_fail failed"
	((total_fail == 0)) || exit 1
	;;
*) die "unknown command $cmd (demo, test, setup, build, vm)" ;;
esac
