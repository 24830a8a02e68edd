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
#   run.sh kv [ARGS]     p2pdma-ctl bench kv --cuda: the KV-cache workload on
#                        the store, its cache in GPU memory against host
#                        memory and no cache, against fio (ARGS: --size,
#                        --bs, --threads, --secs)
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
			p2pdma kvikio-cu12 libkvikio-cu12 rapids-logger cuda-pathfinder numpy pytest iniconfig \
			pluggy packaging pygments tqdm || return 1
	fi
	echo "$v/bin/python"
}

# KvikIO with compat mode off, on top of this directory's libcufile.so.0:
# a file read into GPU memory (a CuPy array, a PyTorch tensor, or memory
# from the driver itself where the machine has neither) through cuFileRead,
# checked against the file's bytes.
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
import numpy as np, kvikio, kvikio.defaults
def cupy_memory():
    import cupy
    return lambda n: cupy.empty(n, dtype=cupy.uint8), cupy.asnumpy, cupy.asarray

def torch_memory():
    import torch
    return (lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"),
            lambda t: t.cpu().numpy(), lambda a: torch.from_numpy(a).cuda())

def driver_memory():
    cu = ctypes.CDLL("libcuda.so.1")
    def ok(r):
        assert r == 0, f"CUDA error {r}"
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cu.cuInit(0))
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0))
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    ok(cu.cuCtxSetCurrent(ctx))
    class Dev:
        def __init__(self, n):
            p = ctypes.c_uint64()
            ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)))
            self.n, self.ptr = n, p.value
            self.__cuda_array_interface__ = {
                "shape": (n,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}
    def to_host(d):
        a = np.empty(d.n, dtype=np.uint8)
        ok(cu.cuMemcpyDtoH_v2(a.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(d.ptr),
                              ctypes.c_size_t(d.n)))
        return a
    def to_gpu(a):
        d = Dev(a.size)
        ok(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(d.ptr), a.ctypes.data_as(ctypes.c_void_p),
                              ctypes.c_size_t(a.size)))
        return d
    return Dev, to_host, to_gpu

for kind in (cupy_memory, torch_memory, driver_memory):
    try:
        empty, to_host, to_gpu = kind()
        break
    except ImportError:
        pass
path = sys.argv[1]
data = np.random.default_rng(7).integers(0, 256, (64 << 20) + 4099, dtype=np.uint8)
data.tofile(path)
buf = empty(data.size)
with kvikio.CuFile(path, "r") as f:
    n = f.read(buf)
assert n == data.size, (n, data.size)
assert (to_host(buf) == data).all(), "bytes differ"
out = to_gpu(data[::-1].copy())
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
	step cufile-host env LD_LIBRARY_PATH="$here/lib" CUFILE_TEST_GPUS="$(nvidia-smi -L | grep -c '^GPU')" \
		"$here/bin/cufile-test" "$work/cufile"
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
kv)
	shift
	"$here/bin/p2pdma-ctl" bench kv --cuda --file "$work/kv.store" "$@"
	;;
*)
	echo "usage: run.sh check | bench [ARGS] | kv [ARGS]" >&2
	exit 2
	;;
esac
