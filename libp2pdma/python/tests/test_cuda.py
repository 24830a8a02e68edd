"""CUDA device memory as the memory of a transfer.

- Without a driver: every CUDA buffer (an object with
  ``__cuda_array_interface__``, a ``kDLCUDA`` DLPack tensor, ``Memory.cuda``)
  raises ``CudaUnavailableError`` before anything moves, and bad
  interfaces are refused before the driver is asked.
- With the emulated driver (tests/cuda-emu), or the real one where
  ``P2PDMA_TEST_REAL_CUDA=1``: ``cuda_emu_checks.py``, run by pytest in a
  process of its own (the driver is chosen once per process), one result
  here per check.
- With torch on a GPU: torch and CuPy tensors, byte for byte.
"""

from __future__ import annotations

import ast
import ctypes.util
import errno
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import p2pdma
from cuda_helpers import KDLCUDA, CudaArray, DLPackTensor

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parents[2]

try:
    import torch

    TORCH_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is in the test requirements
    torch = None
    TORCH_CUDA = False

# An address no host memory is at, standing for a device pointer.
FAKE = 0x7E00_0000_0000

# Whether a CUDA driver may be loaded in this process.
REAL_CUDA = os.environ.get("P2PDMA_TEST_REAL_CUDA") == "1"
DRIVER_HERE = REAL_CUDA or bool(os.environ.get("P2PDMA_CUDA_DRIVER")) or ctypes.util.find_library("cuda") is not None
no_driver = pytest.mark.skipif(DRIVER_HERE, reason="a CUDA driver is installed here (the no-driver case runs in a subprocess below)")


# --------------------------------------------------------------------------
# Without a driver


@no_driver
def test_cuda_memory_without_a_driver_is_refused_and_nothing_moves(data_file, tmp_path):
    path, _ = data_file
    out = tmp_path / "out.bin"
    cai = CudaArray(FAKE, 8192)
    dl = DLPackTensor(FAKE, 8192)
    with p2pdma.File(path) as f, p2pdma.File(out, "w") as g:
        for buf in (cai, dl):
            for call in (f.read, f.pread, g.write, g.pwrite, f.path_for):
                with pytest.raises(p2pdma.CudaUnavailableError) as e:
                    call(buf)
                assert "CUDA is not available" in str(e.value)
                assert e.value.errno == errno.ENODEV
                assert isinstance(e.value, (p2pdma.CudaError, p2pdma.Error, OSError))
        with pytest.raises(p2pdma.CudaUnavailableError):
            f.pread_batch([(bytearray(10), 0), (cai, 0)])
        with pytest.raises(p2pdma.CudaUnavailableError):
            p2pdma.copy(f, cai, 100)
        with pytest.raises(p2pdma.CudaUnavailableError):
            p2pdma.Memory.host(8192).read(dl)
    assert out.stat().st_size == 0
    # The DLPack tensor went back to its producer each time, asked for the
    # legacy default stream.
    assert dl.deleted == len(dl.streams) == 6 and set(dl.streams) == {1}


@no_driver
def test_cuda_allocation_without_a_driver_is_refused():
    with pytest.raises(p2pdma.CudaUnavailableError, match="CUDA is not available"):
        p2pdma.Memory.cuda(4096)


def test_no_driver_in_a_fresh_process_says_which_library(data_file):
    """The same, where P2PDMA_CUDA_DRIVER names a library that is not
    there (on every machine, a GPU's too)."""
    prog = (
        "import p2pdma, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from cuda_helpers import CudaArray\n"
        "try:\n"
        "    p2pdma.File(sys.argv[2]).read(CudaArray(0x7e0000000000, 64))\n"
        "except p2pdma.CudaUnavailableError as e:\n"
        "    print('refused:', e.strerror)\n"
    )
    env = dict(os.environ, P2PDMA_CUDA_DRIVER="/nonexistent/libcuda.so.1")
    r = subprocess.run([sys.executable, "-c", prog, str(HERE), str(data_file[0])], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused: CUDA is not available: cannot load the CUDA driver /nonexistent/libcuda.so.1" in r.stdout


def test_zero_bytes_of_cuda_memory_need_no_driver(data_file):
    with p2pdma.File(data_file[0]) as f:
        assert f.read(CudaArray(0, 0)) == 0
        assert f.pread(DLPackTensor(0, 0)).wait() == 0


@pytest.mark.parametrize(
    "over, error, match",
    [
        ({"strides": (2,)}, p2pdma.InvalidArgumentError, "not contiguous"),
        ({"shape": (64, 64), "strides": (1, 64)}, p2pdma.InvalidArgumentError, "not contiguous"),
        ({"shape": (64, 64), "typestr": "<f4", "strides": (512, 4)}, p2pdma.InvalidArgumentError, "not contiguous"),
        ({"data": (FAKE, True)}, p2pdma.InvalidArgumentError, "read-only"),
        ({"version": 1}, p2pdma.InvalidArgumentError, "version 1"),
        ({"typestr": "|O8"}, TypeError, "Python objects"),
        ({"typestr": "f4"}, p2pdma.InvalidArgumentError, "typestr"),
        ({"mask": object()}, p2pdma.InvalidArgumentError, "masked"),
        ({"stream": 0}, p2pdma.InvalidArgumentError, "stream 0"),
        ({"data": FAKE}, p2pdma.InvalidArgumentError, "data"),
        ({"shape": None}, p2pdma.InvalidArgumentError, "shape"),
    ],
)
def test_bad_interfaces_are_refused_before_the_driver_is_asked(data_file, over, error, match):
    with p2pdma.File(data_file[0]) as f:
        with pytest.raises(error, match=match):
            f.read(CudaArray(FAKE, 8192, **over))


def test_interfaces_that_are_not_dicts_or_lack_keys_are_refused(data_file):
    class NotADict:
        __cuda_array_interface__ = [1, 2]

    broken = CudaArray(FAKE, 10)
    del broken.interface["typestr"]
    with p2pdma.File(data_file[0]) as f:
        with pytest.raises(TypeError, match="not a dict"):
            f.read(NotADict())
        with pytest.raises(p2pdma.InvalidArgumentError, match='no "typestr"'):
            f.read(broken)


def test_contiguous_interfaces_of_several_shapes_are_taken_as_a_whole(data_file):
    """C-order strides, and strides of dimensions of 1, are contiguous: the
    refusal (if any) is the driver's, not the layout's."""
    expected = (p2pdma.InvalidArgumentError, p2pdma.CudaUnavailableError)
    with p2pdma.File(data_file[0]) as f:
        for over in (
            {"shape": (16, 8), "typestr": "<f4", "strides": (32, 4)},
            {"shape": (16, 1, 8), "typestr": "<i2", "strides": (16, 999, 2)},
            {"shape": (3, 0), "strides": (7, 3)},
        ):
            with pytest.raises(expected) as e:
                f.read(CudaArray(FAKE, 1, **over), 1)
            assert "contiguous" not in str(e.value)


@pytest.mark.skipif(torch is None or TORCH_CUDA, reason="torch is missing, or has CUDA here")
def test_safetensors_to_cuda_needs_torch_with_cuda(tmp_path):
    from p2pdma import safetensors as ps

    path = tmp_path / "m.safetensors"
    ps.save_file({"a": torch.zeros(2)}, path)
    for device in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(p2pdma.CudaUnavailableError, match="torch.cuda.is_available"):
            ps.load_file(path, device)
    with pytest.raises(p2pdma.InvalidArgumentError, match="framework='pt'"):
        ps.load_file(path, "cuda", framework="np")


# --------------------------------------------------------------------------
# With the emulated driver (or the real one)

CHECKS_FILE = HERE / "cuda_emu_checks.py"
CHECKS = (
    [
        n.name
        for n in ast.parse(CHECKS_FILE.read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]
    if CHECKS_FILE.exists()
    else []
)


def _emulated_driver() -> tuple[str | None, str]:
    """The emulated driver's path, or None and why not."""
    given = os.environ.get("P2PDMA_TEST_CUDA_EMU")
    if given is not None:
        if given and os.path.exists(given):
            return given, ""
        return None, f"the emulated CUDA driver could not be built (tools/rig/python.sh: P2PDMA_TEST_CUDA_EMU={given!r}; see cuda-emu-build.log)"
    try:
        r = subprocess.run(
            ["cargo", "run", "-q", "-p", "cuda-emu", "--bin", "cuda-emu-path"],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"cannot build the emulated CUDA driver (cargo run -p cuda-emu): {e}"
    lines = r.stdout.strip().splitlines()
    if r.returncode or not lines or not os.path.exists(lines[-1]):
        return None, "cannot build the emulated CUDA driver (cargo run -p cuda-emu): " + r.stderr.strip()[-500:]
    return lines[-1], ""


@pytest.fixture(scope="module")
def driver_results(tmp_path_factory):
    """Runs cuda_emu_checks.py against the emulated driver (the real one
    where P2PDMA_TEST_REAL_CUDA=1): each check's outcomes ("passed",
    "skipped: ...", "failed: ..."), and the output."""
    env = dict(os.environ)
    if not REAL_CUDA:
        path, why = _emulated_driver()
        if path is None:
            pytest.skip(why)
        env.update(P2PDMA_CUDA_DRIVER=path, CUEMU_MEM_MIB="512")
    report = tmp_path_factory.mktemp("checks") / "report.xml"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(CHECKS_FILE)],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=600,
    )
    output = r.stdout[-20000:] + r.stderr[-5000:]
    if r.returncode not in (0, 1) or not report.exists():
        pytest.fail(f"the checks' run ended with status {r.returncode}:\n{output}")
    outcomes: dict[str, list[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = f"failed: {child.get('message', '')}\n{child.text or ''}"
            elif child.tag == "skipped":
                outcome = f"skipped: {child.get('message', '')}"
        outcomes.setdefault(name, []).append(outcome)
    return outcomes, output


@pytest.mark.parametrize(
    "check",
    CHECKS or [pytest.param("none", marks=pytest.mark.skip(reason=f"{CHECKS_FILE.name} is not beside {pathlib.Path(__file__).name}"))],
)
def test_with_the_driver(driver_results, check):
    """One check of cuda_emu_checks.py (skipped, saying so, where that file
    is not beside this one)."""
    outcomes, output = driver_results
    got = outcomes.get(check)
    assert got, f"{check} did not run:\n{output}"
    failed = [o for o in got if o.startswith("failed")]
    assert not failed, "\n".join(failed)
    if all(o.startswith("skipped") for o in got):
        pytest.skip(got[0])


# --------------------------------------------------------------------------
# torch (and CuPy) on a GPU

gpu = pytest.mark.skipif(not TORCH_CUDA, reason="no CUDA device for torch here (torch.cuda.is_available() is False)")


@gpu
def test_reads_into_torch_cuda_tensors(data_file, tmp_path):
    path, data = data_file
    n = (1 << 20) + 4097
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    with p2pdma.File(path) as f:
        assert f.read(t, file_offset=123) == n
        want = torch.frombuffer(bytearray(data[123 : 123 + n]), dtype=torch.uint8).cuda()
        assert torch.equal(t, want)
        # A view at a storage offset, of another dtype, in the background.
        base = torch.zeros(100_000, dtype=torch.float32, device="cuda")
        view = base[1000:30_000]
        assert f.pread(view, file_offset=7).wait() == 29_000 * 4
        got = base.view(torch.uint8).cpu().numpy().tobytes()
        assert got[4000 : 4000 + 116_000] == data[7 : 7 + 116_000]
        assert got[:4000] == b"\0" * 4000 and got[120_000:] == b"\0" * (400_000 - 120_000)
        with pytest.raises(p2pdma.EndOfFileError):
            f.read(t, file_offset=len(data) - 10)
        with pytest.raises(p2pdma.InvalidArgumentError, match="contiguous"):
            f.read(base.view(100, 1000)[:, ::2])
    # Writes from GPU memory, right after the kernel that fills it was queued.
    src = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, device="cuda")
    out = tmp_path / "out.bin"
    with p2pdma.File(out, "w") as g:
        assert g.write(src) == 3 << 20
    assert out.read_bytes() == src.cpu().numpy().tobytes()


@gpu
def test_memory_cuda_is_a_torch_tensor_through_dlpack(data_file):
    path, data = data_file
    m = p2pdma.Memory.cuda(1 << 20)
    with p2pdma.File(path) as f:
        f.read(m, file_offset=99)
    t = torch.from_dlpack(m)
    assert t.is_cuda and t.shape == (1 << 20,)
    assert t.cpu().numpy().tobytes() == data[99 : 99 + (1 << 20)]
    v = torch.from_dlpack(m.view(4096, 100))
    assert torch.equal(v, t[4096:4196])
    del m
    assert int(t[0]) == data[99]  # the export keeps the memory alive


@gpu
def test_safetensors_load_to_cuda(tmp_path):
    st_torch = pytest.importorskip("safetensors.torch")
    from p2pdma import safetensors as ps

    g = torch.Generator().manual_seed(5)
    tensors = {
        "w": torch.randn(513, 77, generator=g),
        "b": torch.randn(77, generator=g).half(),
        "i": torch.randint(0, 1 << 30, (1001,), generator=g),
        "e": torch.zeros(0),
    }
    path = tmp_path / "m.safetensors"
    st_torch.save_file(tensors, path)
    got = ps.load_file(path, "cuda")
    want = st_torch.load_file(path)
    for k, w in want.items():
        assert got[k].is_cuda and got[k].dtype == w.dtype and got[k].shape == w.shape
        assert torch.equal(got[k].cpu(), w), k
    # And saved from the GPU, byte-identical to the CPU tensors' file.
    ours = tmp_path / "ours.safetensors"
    ps.save_file({k: v.cuda() for k, v in tensors.items()}, ours)
    assert ours.read_bytes() == path.read_bytes()


@gpu
def test_cupy_arrays(data_file):
    cupy = pytest.importorskip("cupy")
    path, data = data_file
    a = cupy.empty(300_001, dtype=cupy.uint8)
    with p2pdma.File(path) as f:
        f.read(a, file_offset=5)  # DLPack
        assert cupy.asnumpy(a).tobytes() == data[5:300_006]
        b = cupy.zeros(10_000, dtype=cupy.float32)
        f.read(CudaArray(0, 0, **b.__cuda_array_interface__), file_offset=11)  # the interface
        assert cupy.asnumpy(b).tobytes() == data[11:40_011]
    assert KDLCUDA == a.__dlpack_device__()[0]
