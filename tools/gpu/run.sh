#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU, what `tools/gpu.sh pack` built into
# this directory, against the machine's own CUDA driver.
#
#   run.sh check         the doctor, the CUDA backend's tests, the cuFile
#                        library's C tests on host and GPU memory, KvikIO on
#                        top of the cuFile library (and the rig's KvikIO
#                        client test), the binding's CUDA tests,
#                        and the small-copy bench; one PASS/FAIL line each
#   run.sh bench [ARGS]  gpu.py (libp2pdma/python/bench): a large file into GPU memory and 4 KiB
#                        random reads, ours against KvikIO (compat mode),
#                        a plain read plus a copy, and fio
#
# Scratch files go to $P2PDMA_GPU_DIR (default: a directory under /var/tmp).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${P2PDMA_GPU_DIR:-/var/tmp/p2pdma-gpu}
mkdir -p "$work"
failures=0

step() {
	local name=$1
	shift
	echo "== $name: $*"
	if "$@"; then
		echo "PASS $name"
	else
		echo "FAIL $name (exit $?)"
		failures=$((failures + 1))
	fi
}

venv() {
	local v=$work/venv
	if [ ! -x "$v/bin/python" ]; then
		python3 -m venv --system-site-packages "$v" || return 1
		"$v/bin/pip" install --quiet --no-index --no-deps --find-links "$here/wheels" \
			p2pdma kvikio-cu12 libkvikio-cu12 rapids-logger pytest iniconfig pluggy packaging || return 1
	fi
	echo "$v/bin/python"
}

# KvikIO with compat mode off, on top of this directory's libcufile.so.0:
# a file read into a CuPy array through cuFileRead, checked against the
# file's bytes.
kvikio_on_ours() {
	local py=$1
	mkdir -p /run/udev 2>/dev/null
	echo '{}' >"$work/cufile.json"
	CUFILE_ENV_PATH_JSON=$work/cufile.json KVIKIO_COMPAT_MODE=off \
		LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$py" - "$work/kvikio.bin" <<'PY'
import ctypes, os, sys
# cuda-pathfinder (KvikIO's loader) prefers a libcufile of NVIDIA's from
# site-packages unless one of that soname is loaded: load ours first.
ctypes.CDLL(os.environ["LD_LIBRARY_PATH"].split(":")[0] + "/libcufile.so.0", mode=ctypes.RTLD_GLOBAL)
import cupy, numpy as np, kvikio, kvikio.defaults
path = sys.argv[1]
data = np.random.default_rng(7).integers(0, 256, (64 << 20) + 4099, dtype=np.uint8)
data.tofile(path)
buf = cupy.empty(data.size, dtype=cupy.uint8)
with kvikio.CuFile(path, "r") as f:
    n = f.read(buf)
assert n == data.size, (n, data.size)
assert (cupy.asnumpy(buf) == data).all(), "bytes differ"
out = cupy.asarray(data[::-1].copy())
with kvikio.CuFile(path + ".w", "w") as f:
    assert f.write(out) == data.size
assert (np.fromfile(path + ".w", dtype=np.uint8) == data[::-1]).all(), "written bytes differ"
# Compat mode off: KvikIO raises where cuFile is unavailable, so the reads
# above went through a cuFile library: this one.
maps = open("/proc/self/maps").read()
assert os.environ["LD_LIBRARY_PATH"].split(":")[0] + "/libcufile.so.0" in maps, "another libcufile"
print(f"KvikIO over libcufile.so.0: {data.size} bytes read and written, checked")
PY
}

check() {
	step nvidia-smi nvidia-smi -L
	echo "== doctor"
	"$here/bin/p2pdma-ctl" doctor | tee "$work/doctor.txt"
	step doctor-sees-the-gpu grep -q "gpu memory.*CUDA driver" "$work/doctor.txt"
	step cuda-tests env P2PDMA_CUDA_REAL=1 "$here/bin/cuda-tests" --test-threads=1
	mkdir -p "$work/cufile"
	step cufile-host env LD_LIBRARY_PATH="$here/lib" "$here/bin/cufile-test" "$work/cufile"
	step cufile-gpu env LD_LIBRARY_PATH="$here/lib" "$here/bin/cufile-test" "$work/cufile" --cuda libcuda.so.1
	mkdir -p "$work/cufile-nc"
	step cufile-no-compat env LD_LIBRARY_PATH="$here/lib" "$here/bin/cufile-test" "$work/cufile-nc" --no-compat libcuda.so.1
	step cufile-link-all env LD_LIBRARY_PATH="$here/lib" "$here/bin/cufile-link-all"
	step small-copies "$here/bin/gpu-small-copies"
	local py
	if py=$(venv); then
		step kvikio-on-libcufile kvikio_on_ours "$py"
		# The rig's KvikIO client test, with the machine's driver for the
		# emulated one (its scratch files on a disk that takes O_DIRECT).
		step kvikio-client-test env P2PDMA_TEST_CUFILE="$here/lib" \
			P2PDMA_TEST_CUDA_EMU="$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')" \
			"$py" -m pytest -q -p no:cacheprovider --basetemp="$work/pytest" "$here/tests/test_kvikio_client.py"
		step python-cuda-tests env P2PDMA_TEST_REAL_CUDA=1 "$py" -m pytest -q -rs "$here/tests/test_cuda.py"
	else
		echo "FAIL python-environment"
		failures=$((failures + 1))
	fi
	echo "gpu check: $failures failed"
	return "$failures"
}

case ${1:-} in
check) check ;;
bench)
	shift
	py=$(venv) || exit 1
	"$py" "$here/gpu.py" --dir "$work" "$@"
	;;
*)
	echo "usage: run.sh check | bench [ARGS]" >&2
	exit 2
	;;
esac
