#!/usr/bin/env bash
# What a machine with an NVIDIA GPU runs, built here.
#
#   tools/gpu.sh pack DIR   builds into DIR (glibc binaries, stripped): the
#                           CUDA backend's tests, the small-copy bench,
#                           p2pdma-ctl, libcufile.so.0 and its C tests, the
#                           Python wheel with KvikIO's and pytest's wheels, the
#                           binding's CUDA tests, and DIR/run.sh, which runs
#                           them there (docs/gpu.md)
#
# The GPU machine needs no compiler and no network: PyTorch and CuPy come
# from its own Python, everything else from DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

die() {
	echo "gpu.sh: $*" >&2
	exit 1
}

# The path of the test or example executable cargo built, from its JSON.
built() {
	python3 -c '
import json, sys
kind, name = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == name and kind in m["target"]["kind"]:
        print(m["executable"])
' "$1" "$2"
}

pack() {
	local out=$1
	mkdir -p "$out"/{bin,lib,wheels,tests}
	out=$(cd "$out" && pwd)
	cd "$root"
	cargo build --release --locked -p p2pdma-ctl
	install -m755 target/release/p2pdma-ctl "$out/bin/"
	# libcufile.so.0 as it ships: linked against glibc 2.17 (docs/decisions.md).
	tools/rig/release.sh libs "$out/lib"
	rm -f "$out/lib/libp2pdma.a"
	mv -f "$out/lib/libcufile.so" "$out/lib/libcufile.so.0"
	ln -sf libcufile.so.0 "$out/lib/libcufile.so"
	local exe
	exe=$(cargo test --release --locked -p libp2pdma --test cuda --no-run --message-format=json | built test cuda)
	[ -n "$exe" ] || die "no test executable for libp2pdma's cuda tests"
	install -m755 "$exe" "$out/bin/cuda-tests"
	exe=$(cargo build --release --locked -p libp2pdma --example gpu_small_copies --message-format=json |
		built example gpu_small_copies)
	[ -n "$exe" ] || die "no executable for the gpu_small_copies example"
	install -m755 "$exe" "$out/bin/gpu-small-copies"
	${CC:-cc} -O2 -Wall -Wextra -Werror -I libp2pdma/cufile/include \
		libp2pdma/cufile/tests/c/cufile_test.c -ldl -o "$out/bin/cufile-test"
	${CC:-cc} -O2 -Wall -Wextra -Werror -I libp2pdma/cufile/include \
		libp2pdma/cufile/tests/c/link_all.c -L "$out/lib" -lcufile -o "$out/bin/cufile-link-all"
	strip "$out"/bin/* "$out/lib/libcufile.so.0" "$out/lib/libp2pdma.so"
	tools/rig/python.sh wheel "$out/wheels"
	python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/wheels" \
		--python-version 3.11 --platform manylinux_2_28_x86_64 \
		kvikio-cu12==26.10.0 libkvikio-cu12==26.10.0 rapids-logger==0.3.0 cuda-pathfinder==1.9.1 \
		pytest iniconfig pluggy packaging pygments tqdm
	# numpy for KvikIO and the tests, for the Python the GPU machine has
	# (3.12 on the lent ones) and the rig's.
	local v
	for v in 3.11 3.12; do
		python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/wheels" \
			--python-version "$v" --platform manylinux_2_28_x86_64 numpy==2.4.6
	done
	cp libp2pdma/python/tests/{test_cuda.py,cuda_helpers.py,cuda_emu_checks.py,test_kvikio_client.py} "$out/tests/"
	[ -f libp2pdma/python/tests/conftest.py ] && cp libp2pdma/python/tests/conftest.py "$out/tests/"
	install -m755 tools/gpu/run.sh "$out/run.sh"
	cp libp2pdma/python/bench/{gpu.py,storage.py} "$out/"
	du -sh "$out"
}

case ${1:-} in
pack) pack "${2:?usage: gpu.sh pack DIR}" ;;
*) die "usage: gpu.sh pack DIR" ;;
esac
