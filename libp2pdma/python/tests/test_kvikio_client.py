"""KvikIO as a client of libcufile.so.0 (libp2pdma/cufile), over the emulated CUDA driver.

KvikIO's wheels, with compatibility mode off, load this project's ``libcufile.so.0`` and
the emulated ``libcuda.so.1`` (tests/cuda-emu) and move data between a file and device
memory, page-locked host memory and pageable host memory; every byte is compared with
the file. KvikIO's own statistics must show its cuFile backend ("GDS") carrying the
device and page-locked transfers, and the library's statistics (``cuFileGetStatsL3``)
the same bytes, so the cuFile path was taken and not KvikIO's POSIX fallback. Pageable
host memory is KvikIO's POSIX path by its design (``FileHandle::pread`` never hands host
memory to cuFile), which the test checks too.

The scenario runs in a child process (this file run as a script), because the loaders'
choices (which ``libcufile.so.0``, which ``libcuda.so.1``) are made once per process.
``tools/rig/python.sh test`` sets ``P2PDMA_TEST_CUFILE`` (the directory of the built
``libcufile.so``) and ``P2PDMA_TEST_CUDA_EMU`` (the emulator). KvikIO is in
``tools/rig/python-requirements.txt``: without it, or without either library, the test
fails rather than skips.
"""

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MIB = 1 << 20
# Not a multiple of the page or of KvikIO's task size: the tail is unaligned.
SIZE = 9 * MIB + 12345

# Offsets in cuFile's statistics structures (cufile.h; pinned by the Rust layout test).
L1_READ_OPS_OK, L1_WRITE_OPS_OK, L1_READ_BYTES, L1_WRITE_BYTES = 0, 16, 96, 104
L3_NUM_GPUS, L3_PER_GPU, PER_GPU_SIZE = 1024, 1032, 248
GPU_READ_BYTES, GPU_TOTAL_READS, GPU_WRITES_BYTES, GPU_TOTAL_WRITES = 16, 48, 120, 152


def _libraries() -> tuple[Path, Path]:
    cufile = os.environ.get("P2PDMA_TEST_CUFILE", "")
    emu = os.environ.get("P2PDMA_TEST_CUDA_EMU", "")
    if not cufile or not (Path(cufile) / "libcufile.so.0").exists():
        pytest.fail(f"P2PDMA_TEST_CUFILE={cufile!r} holds no libcufile.so.0 (tools/rig/python.sh test builds it)")
    if not emu or not Path(emu).exists():
        pytest.fail(f"P2PDMA_TEST_CUDA_EMU={emu!r}: the emulated CUDA driver was not built")
    return Path(cufile), Path(emu)


def test_kvikio_is_installed():
    # A failure, not a skip: the requirements install it, so its absence is a broken
    # environment.
    import kvikio  # noqa: F401
    import kvikio.defaults

    assert kvikio.__version__


def test_kvikio_moves_every_byte_through_libcufile(tmp_path):
    cufile, emu = _libraries()
    lib = tmp_path / "lib"
    lib.mkdir()
    # One directory with both libraries under the names their consumers dlopen.
    (lib / "libcufile.so.0").symlink_to(cufile / "libcufile.so.0")
    (lib / "libcuda.so.1").symlink_to(emu)
    config = tmp_path / "cufile.json"
    config.write_text("{}\n")
    # KvikIO takes cuFile as unavailable without /run/udev (docs/gpu.md).
    try:
        os.makedirs("/run/udev", exist_ok=True)
    except OSError as e:
        pytest.fail(f"/run/udev is missing and cannot be made ({e}): KvikIO would not use cuFile")
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(SIZE))
    env = dict(
        os.environ,
        KVIKIO_COMPAT_MODE="OFF",
        KVIKIO_NTHREADS="4",
        KVIKIO_TASK_SIZE=str(MIB),
        CUFILE_ENV_PATH_JSON=str(config),
        LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":"),
        P2PDMA_CACHE_DIR="off",
        CUEMU_MEM_MIB="64",
    )
    env.pop("P2PDMA_PATH", None)
    env.pop("P2PDMA_CUDA_DRIVER", None)
    out = subprocess.run(
        [sys.executable, __file__, str(lib), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"the KvikIO child failed:\n{out.stdout}\n{out.stderr}"
    r = json.loads(out.stdout.strip().splitlines()[-1])

    # Which libraries answered.
    # (The maps name the files the links lead to.)
    assert r["cufile_loaded"] == [os.path.realpath(lib / "libcufile.so.0")], r["cufile_loaded"]
    assert r["libcuda_loaded"] == [os.path.realpath(lib / "libcuda.so.1")], r["libcuda_loaded"]
    assert r["compat_mode"] == 0 and not r["compat_preferred"]
    # What KvikIO asks the driver, answered by this library.
    assert r["driver"] == {"version": [1, 20], "is_gds_available": True, "major_version": 1,
                           "allow_compat_mode": True, "poll_mode": False}, r["driver"]

    # Every byte, each way.
    for case in ("device_read", "device_write", "pinned_raw_read", "pinned_raw_write",
                 "pageable_read", "pageable_write"):
        assert r[case] == {"bytes": SIZE, "same": True}, (case, r[case])

    # KvikIO's statistics: the device and page-locked transfers on its cuFile
    # backend, only the pageable ones on POSIX.
    gds, posix = r["kvikio"]["GDS"], r["kvikio"]["POSIX"]
    assert gds["num_errors"] == 0 and posix["num_errors"] == 0
    assert gds["bytes_transferred"] == 4 * SIZE, r["kvikio"]
    assert posix["bytes_transferred"] == 2 * SIZE, r["kvikio"]
    assert posix["num_ops"] == 2, r["kvikio"]

    # The library's statistics: the same bytes, the device's on GPU 0, and calls
    # at least one per KvikIO task.
    s = r["cufile_stats"]
    assert s["read_bytes"] == 2 * SIZE and s["write_bytes"] == 2 * SIZE, s
    assert s["read_ops"] >= SIZE // MIB + 1 and s["write_ops"] >= 2, s
    assert s["num_gpus"] == 1, s
    assert s["gpu0_read_bytes"] == SIZE and s["gpu0_writes_bytes"] == SIZE, s
    assert s["gpu0_reads"] >= SIZE // MIB and s["gpu0_writes"] >= 1, s


# ----------------------------------------------------------------------------- child


def _child(lib: Path, work: Path) -> dict:
    # KvikIO finds libcufile through cuda-pathfinder, which prefers a copy in
    # site-packages (NVIDIA's, from the nvidia-cufile wheel torch brings) unless a
    # library of that soname is loaded already: load ours first, as a program that
    # ships its own must (docs/gpu.md).
    cufile = ctypes.CDLL(str(lib / "libcufile.so.0"), mode=ctypes.RTLD_GLOBAL)
    cu = ctypes.CDLL(str(lib / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)

    class CUfileError(ctypes.Structure):
        _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]

    for name in ("cuFileSetStatsLevel", "cuFileGetStatsL3"):
        getattr(cufile, name).restype = CUfileError
    assert cufile.cuFileSetStatsLevel(3).err == 0

    import numpy as np

    import kvikio
    import kvikio.cufile_driver
    import kvikio.defaults

    def ck(rc, what):
        assert rc == 0, f"{what}: CUresult {rc}"

    ck(cu.cuInit(0), "cuInit")
    ctx = ctypes.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    class Cai:
        """Memory handed to KvikIO through the CUDA array interface."""

        def __init__(self, ptr: int, n: int):
            self.ptr, self.n = ptr, n
            self.__cuda_array_interface__ = {
                "shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None,
            }

    class Device(Cai):
        def __init__(self, n: int, fill: bytes | None = None):
            p = ctypes.c_uint64()
            ck(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
            super().__init__(p.value, n)
            if fill is not None:
                ck(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(self.ptr), fill, ctypes.c_size_t(n)), "cuMemcpyHtoD")

        def get(self) -> bytes:
            b = ctypes.create_string_buffer(self.n)
            ck(cu.cuMemcpyDtoH_v2(b, ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.n)), "cuMemcpyDtoH")
            return b.raw

    class Pinned(Cai):
        def __init__(self, n: int):
            p = ctypes.c_void_p()
            ck(cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 0), "cuMemHostAlloc")
            super().__init__(p.value, n)

        def get(self) -> bytes:
            return ctypes.string_at(self.ptr, self.n)

        def put(self, data: bytes) -> None:
            ctypes.memmove(self.ptr, data, len(data))

    src = work / "data.bin"
    want = src.read_bytes()
    n = len(want)
    rev = want[::-1]
    res: dict = {
        "compat_mode": int(kvikio.defaults.get("compat_mode")),
        "compat_preferred": bool(kvikio.defaults.is_compat_mode_preferred()),
    }
    drv = kvikio.cufile_driver
    res["driver"] = {"version": list(drv.libcufile_version())}
    res["driver"].update({k: drv.get(k) for k in ("is_gds_available", "major_version", "allow_compat_mode", "poll_mode")})
    mon = kvikio.SummaryMonitor()

    def same(case: str, moved: int, got: bytes, expect: bytes) -> None:
        res[case] = {"bytes": int(moved), "same": got == expect}

    d = Device(n)
    with kvikio.CuFile(src, "r") as f:
        same("device_read", f.read(d), d.get(), want)
    d2 = Device(n, rev)
    with kvikio.CuFile(work / "device.out", "w") as f:
        moved = f.write(d2)
    same("device_write", moved, (work / "device.out").read_bytes(), rev)

    p = Pinned(n)
    with kvikio.CuFile(src, "r") as f:
        same("pinned_raw_read", f.raw_read(p), p.get(), want)
    p.put(rev)
    with kvikio.CuFile(work / "pinned.out", "w") as f:
        moved = f.raw_write(p)
    same("pinned_raw_write", moved, (work / "pinned.out").read_bytes(), rev)

    h = np.empty(n, dtype=np.uint8)
    with kvikio.CuFile(src, "r") as f:
        same("pageable_read", f.read(h), h.tobytes(), want)
    h2 = np.frombuffer(rev, dtype=np.uint8).copy()
    with kvikio.CuFile(work / "pageable.out", "w") as f:
        moved = f.write(h2)
    same("pageable_write", moved, (work / "pageable.out").read_bytes(), rev)

    res["kvikio"] = {k: dict(v) for k, v in mon.get().by_backend.items()}

    raw = ctypes.create_string_buffer(5000)
    assert cufile.cuFileGetStatsL3(raw).err == 0

    def u64(off: int) -> int:
        return int.from_bytes(raw.raw[off:off + 8], "little")

    g0 = L3_PER_GPU
    res["cufile_stats"] = {
        "read_ops": u64(L1_READ_OPS_OK),
        "write_ops": u64(L1_WRITE_OPS_OK),
        "read_bytes": u64(L1_READ_BYTES),
        "write_bytes": u64(L1_WRITE_BYTES),
        "num_gpus": int.from_bytes(raw.raw[L3_NUM_GPUS:L3_NUM_GPUS + 4], "little"),
        "gpu0_read_bytes": u64(g0 + GPU_READ_BYTES),
        "gpu0_reads": u64(g0 + GPU_TOTAL_READS),
        "gpu0_writes_bytes": u64(g0 + GPU_WRITES_BYTES),
        "gpu0_writes": u64(g0 + GPU_TOTAL_WRITES),
    }
    maps = Path("/proc/self/maps").read_text().splitlines()
    paths = sorted({line.split()[-1] for line in maps if line.split()[-1].startswith("/")})
    res["cufile_loaded"] = [x for x in paths if Path(x).name.startswith("libcufile")]
    res["libcuda_loaded"] = [x for x in paths if Path(x).name.startswith("libcuda.so")]
    return res


if __name__ == "__main__":
    print(json.dumps(_child(Path(sys.argv[1]), Path(sys.argv[2]))))
