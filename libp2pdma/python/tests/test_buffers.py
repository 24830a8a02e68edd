"""Every kind of buffer as the memory of a transfer, and the ones refused."""

import array
import ctypes

import numpy as np
import pytest
import torch

import p2pdma


def kinds(n):
    """(name, buffer, bytes-of-buffer) for every writable kind."""
    ba = bytearray(n)
    yield "bytearray", ba, lambda: bytes(ba)
    big = bytearray(n + 64)
    mv = memoryview(big)[32 : 32 + n]
    yield "memoryview slice", mv, lambda: bytes(mv)
    for dt in (np.uint8, np.int16, np.float32, np.float64, np.complex128):
        item = np.dtype(dt).itemsize
        a = np.zeros(n // item, dtype=dt)
        yield f"numpy {np.dtype(dt).name}", a, (lambda a=a: a.tobytes())
    a2 = np.zeros((n // 64, 8), dtype=np.float64)
    yield "numpy 2-d", a2, lambda: a2.tobytes()
    arr = array.array("I", bytes(n))
    yield "array.array", arr, lambda: arr.tobytes()
    cbuf = (ctypes.c_char * n)()
    yield "ctypes", cbuf, lambda: bytes(cbuf)
    for dt in (torch.uint8, torch.float32, torch.bfloat16, torch.int64):
        item = torch.tensor([], dtype=dt).element_size()
        t = torch.zeros(n // item, dtype=dt)
        yield f"torch {dt}", t, (lambda t=t: t.view(torch.uint8).numpy().tobytes())
    m = p2pdma.Memory.host(n)
    yield "p2pdma.Memory", m, lambda: m.to_bytes()
    m2 = p2pdma.Memory.host(n + 8192)
    v = m2.view(4096, n)
    yield "p2pdma.MemoryView", v, lambda: m2.to_bytes(4096, n)


N = 64 * 1024


@pytest.mark.parametrize("name", [k[0] for k in kinds(N)])
def test_every_writable_kind_reads_and_writes(name, data_file, tmp_path):
    path, data = data_file
    _, buf, content = next(k for k in kinds(N) if k[0] == name)
    with p2pdma.File(path) as f:
        assert f.read(buf, file_offset=4097) == N
    assert content() == data[4097 : 4097 + N]
    out = tmp_path / "out.bin"
    with p2pdma.File(out, "w") as g:
        assert g.write(buf, file_offset=512) == N
    assert out.read_bytes() == b"\0" * 512 + data[4097 : 4097 + N]


def test_read_only_buffers_can_be_written_from_but_not_read_into(data_file, tmp_path):
    path, data = data_file
    ro_np = np.frombuffer(data[:8192], dtype=np.uint8)
    assert not ro_np.flags.writeable
    for ro in (data[:8192], memoryview(data)[:8192], ro_np):
        with p2pdma.File(path) as f:
            with pytest.raises(p2pdma.InvalidArgumentError, match="read-only"):
                f.read(ro)
            with pytest.raises(p2pdma.InvalidArgumentError, match="read-only"):
                f.pread(ro)
        out = tmp_path / "ro.bin"
        with p2pdma.File(out, "w") as g:
            assert g.write(ro) == 8192
        assert out.read_bytes() == data[:8192]


def test_non_contiguous_buffers_are_refused(data_file):
    path, _ = data_file
    a = np.zeros((64, 64), dtype=np.uint8)
    t = torch.zeros(64, 64, dtype=torch.uint8)
    with p2pdma.File(path) as f:
        with pytest.raises(p2pdma.InvalidArgumentError, match="contiguous"):
            f.read(a[:, ::2])
        with pytest.raises(p2pdma.InvalidArgumentError, match="contiguous"):
            f.read(t.t())
    assert not a.any() and not t.any()


def test_objects_that_are_not_memory_are_type_errors(data_file):
    path, _ = data_file
    with p2pdma.File(path) as f:
        for bad in (None, 42, "a string", [1, 2, 3], object()):
            with pytest.raises(TypeError):
                f.read(bad)
        with pytest.raises(TypeError, match="Python objects"):
            f.read(np.empty(10, dtype=object))


def test_sizes_and_offsets_outside_the_buffer_are_refused(data_file):
    path, _ = data_file
    buf = bytearray(b"\x11" * 100)
    with p2pdma.File(path) as f:
        with pytest.raises(p2pdma.InvalidArgumentError):
            f.read(buf, 101)
        with pytest.raises(p2pdma.InvalidArgumentError):
            f.read(buf, 10, buf_offset=95)
        with pytest.raises(p2pdma.InvalidArgumentError):
            f.read(buf, buf_offset=101)
        with pytest.raises(OverflowError):
            f.read(buf, -1)
        with pytest.raises(OverflowError):
            f.read(buf, file_offset=-5)
    assert buf == bytearray(b"\x11" * 100)


def test_memory_of_devices_it_cannot_reach_is_refused_before_export(data_file):
    asked = []

    class Elsewhere:
        def __init__(self, device):
            self.device = device

        def __dlpack_device__(self):
            return self.device

        def __dlpack__(self, **kw):
            asked.append(kw)
            raise BufferError("not here")

    with p2pdma.File(data_file[0]) as f:
        with pytest.raises(p2pdma.InvalidArgumentError, match="device type 10"):
            f.read(Elsewhere((10, 0)))  # ROCm
        with pytest.raises(p2pdma.InvalidArgumentError, match="managed"):
            f.read(Elsewhere((13, 0)))  # kDLCUDAManaged
    assert asked == []


def test_torch_views_and_subclasses_land_where_they_point(data_file):
    path, data = data_file
    base = torch.zeros(1000, dtype=torch.int32)
    view = base[100:200]  # a storage offset of 400 bytes
    param = torch.nn.Parameter(torch.zeros(64, dtype=torch.float64), requires_grad=False)
    with p2pdma.File(path) as f:
        assert f.read(view, file_offset=8) == 400
        assert f.read(param) == 512
        fut = f.pread(base[500:501], file_offset=12)
        assert fut.wait() == 4
    raw = base.numpy().tobytes()
    assert raw[400:800] == data[8:408]
    assert raw[2000:2004] == data[12:16]
    assert raw[:400] == b"\0" * 400 and raw[800:2000] == b"\0" * 1200 and raw[2004:] == b"\0" * (4000 - 2004)
    assert param.detach().numpy().tobytes() == data[:512]
    with p2pdma.File(path) as f:
        with pytest.raises(p2pdma.InvalidArgumentError, match="contiguous"):
            f.read(base[::2])
        empty = torch.zeros(0)
        assert f.read(empty) == 0
