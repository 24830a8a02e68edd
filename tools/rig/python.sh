#!/usr/bin/env bash
# The Python binding's environment and tests.
#
#   python.sh env        prints the virtual environment's path, making it
#                        first if the cache has none for
#                        tools/rig/python-requirements.txt
#   python.sh test OUT   builds the binding into it (maturin), the emulated
#                        CUDA driver (tests/cuda-emu) and libcufile.so.0
#                        (libp2pdma/cufile, for KvikIO), runs pytest
#                        on libp2pdma/python/tests and writes one PASS/FAIL
#                        line per test to OUT
#   python.sh wheel DIR  builds the binding's release wheel into DIR
#                        (manylinux_2_17, linked by zig)
#   python.sh bench ...  builds the binding for release and runs
#                        libp2pdma/python/bench/bench.py with these arguments
#
# The environment lives in the cache, keyed by the Python version and the
# requirements' hash; only the newest one is kept (torch makes it large).
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

req=$P2PDMA_ROOT/tools/rig/python-requirements.txt
pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
key=$(sha256sum <"$req" | cut -c1-12)
venv=$P2PDMA_CACHE/python/venv-$pyver-$key

# Lines of the requirements marked "# no-deps" are installed in a second
# step without their dependencies.
install_env() {
	python3 -m venv "$venv"
	local pip=("$venv/bin/pip" install --no-cache-dir --disable-pip-version-check)
	"${pip[@]}" -r <(grep -v '#[[:space:]]*no-deps' "$req")
	local nodeps
	mapfile -t nodeps < <(sed -nE 's/^([^#[:space:]]+)[[:space:]]*#[[:space:]]*no-deps.*$/\1/p' "$req")
	[ "${#nodeps[@]}" -eq 0 ] || "${pip[@]}" --no-deps "${nodeps[@]}"
}

build_binding() {
	cd "$P2PDMA_ROOT/libp2pdma/python"
	VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH" maturin develop --locked "$@"
}

# The emulated CUDA driver's path (tests/cuda-emu), for tests/test_cuda.py.
cuda_emu_path() {
	cd "$P2PDMA_ROOT"
	cargo run -q --locked -p cuda-emu --bin cuda-emu-path
}

# The directory of libcufile.so (libp2pdma/cufile) with its soname beside it,
# for tests/test_kvikio_client.py.
cufile_dir() {
	cd "$P2PDMA_ROOT"
	local lib
	lib=$(cargo build -q --locked -p p2pdma-cufile --lib --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cufile":
        print(*[f for f in m["filenames"] if f.endswith(".so")])
')
	[ -f "$lib" ] || return 1
	ln -sfn libcufile.so "$(dirname "$lib")/libcufile.so.0"
	dirname "$lib"
}

build_wheel() {
	cd "$P2PDMA_ROOT/libp2pdma/python"
	# Linked by zig against glibc 2.17: a manylinux_2_17 (manylinux2014)
	# wheel (docs/decisions.md).
	PATH="$venv/bin:$PATH" maturin build --release --locked --zig \
		--compatibility manylinux_2_17 --out "$1"
}

make_env() {
	[ -f "$venv/.complete" ] && return
	rm -rf "$venv"
	mkdir -p "$P2PDMA_CACHE/python"
	run_logged "python $pyver environment: $(grep -v '^#' "$req" | sed 's/[[:space:]]*#.*//' | tr '\n' ' ')" \
		"$P2PDMA_CACHE/python/pip.log" install_env
	touch "$venv/.complete"
	local old
	for old in "$P2PDMA_CACHE"/python/venv-*; do
		[ "$old" = "$venv" ] || rm -rf "$old"
	done
}

case ${1:-} in
env)
	make_env
	echo "$venv"
	;;
test)
	out=${2:?usage: python.sh test OUT}
	make_env
	logs=$(dirname "$out")
	run_logged "building the Python binding (maturin develop)" "$logs/python-build.log" build_binding
	# An empty path tells the tests the emulated driver could not be built:
	# they skip, saying so, and the rest runs.
	if emu=$(cuda_emu_path 2>"$logs/cuda-emu-build.log"); then
		export P2PDMA_TEST_CUDA_EMU=$emu
	else
		log "the emulated CUDA driver could not be built (see $logs/cuda-emu-build.log)"
		export P2PDMA_TEST_CUDA_EMU=
	fi
	# Likewise the cuFile library: test_kvikio_client.py fails without it.
	if cufile=$(cufile_dir 2>"$logs/cufile-build.log"); then
		export P2PDMA_TEST_CUFILE=$cufile
	else
		log "libcufile.so could not be built (see $logs/cufile-build.log)"
		export P2PDMA_TEST_CUFILE=
	fi
	log "python tests: pytest libp2pdma/python/tests"
	rc=0
	(cd "$P2PDMA_ROOT/libp2pdma/python" &&
		"$venv/bin/python" -m pytest -q -rA -p no:cacheprovider tests) >"$logs/pytest.log" 2>&1 || rc=$?
	sed -nE 's/^PASSED (.*)$/PASS python:\1/p; s/^(FAILED|ERROR) (.*)$/FAIL python:\2/p' "$logs/pytest.log" >"$out"
	if [ "$rc" -ne 0 ] && ! grep -q '^FAIL ' "$out"; then
		echo "FAIL python:pytest exited with status $rc (see $logs/pytest.log)" >>"$out"
	fi
	tail -n 1 "$logs/pytest.log" >&2
	;;
wheel)
	dir=${2:?usage: python.sh wheel DIR}
	make_env
	mkdir -p "$dir"
	run_logged "building the Python binding's wheel (maturin build --release)" "$dir/build.log" \
		build_wheel "$dir"
	;;
bench)
	shift
	make_env
	mkdir -p "$P2PDMA_ROOT/rig-out"
	run_logged "building the Python binding for release (maturin develop --release)" \
		"$P2PDMA_ROOT/rig-out/python-build-release.log" build_binding --release
	"$venv/bin/python" "$P2PDMA_ROOT/libp2pdma/python/bench/bench.py" "$@"
	;;
*)
	die "usage: python.sh env | test OUT | bench [ARGS]"
	;;
esac
