"""p2pdma.Memory: the host-memory device here (accelerator memory in the VM),
its copies, and DLPack that tells where it lives."""

import os

import numpy as np
import pytest
import torch

import p2pdma


def test_host_memory_is_zeroed_and_sized():
    m = p2pdma.Memory.host(10000)
    assert m.size == len(m) == 10000
    assert m.device == "cpu"
    assert "host" in m.kind
    assert m.to_bytes() == b"\0" * 10000


def test_copies_in_and_out():
    m = p2pdma.Memory.host(1 << 20)
    src = os.urandom(300000)
    assert m.write(src, offset=12345) == 300000
    out = bytearray(300000)
    assert m.read(out, offset=12345) == 300000
    assert bytes(out) == src
    assert m.to_bytes(12345, 300000) == src
    t = torch.zeros(1000, dtype=torch.int32)
    m.read(t, offset=12345)
    assert t.numpy().tobytes() == src[:4000]
    with pytest.raises(p2pdma.InvalidArgumentError):
        m.write(src, offset=(1 << 20) - 10)
    with pytest.raises(p2pdma.InvalidArgumentError):
        m.read(bytearray(10), offset=1 << 20)
    with pytest.raises(p2pdma.InvalidArgumentError):
        m.read(b"read-only")


def test_zero_sized_memory_is_refused():
    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.Memory.host(0)


def test_dlpack_of_host_memory_is_cpu_and_aliases():
    m = p2pdma.Memory.host(4096)
    assert m.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(m)
    assert a.dtype == np.uint8 and a.shape == (4096,)
    a[10:14] = [1, 2, 3, 4]
    assert m.to_bytes(10, 4) == b"\x01\x02\x03\x04"
    t = torch.from_dlpack(m)
    t[0] = 9
    assert m.to_bytes(0, 1) == b"\x09"
    # The export keeps the memory alive after the object is gone.
    del m
    assert int(t[0]) == 9 and a[13] == 4


def test_views_are_cpu_ranges_and_transfer_targets(data_file):
    path, data = data_file
    m = p2pdma.Memory.host(1 << 20)
    v = m.view(8192, 65536)
    assert v.size == len(v) == 65536 and v.offset == 8192
    assert v.__dlpack_device__() == (1, 0)
    assert not v.write_combined
    with p2pdma.File(path) as f:
        f.read(v, file_offset=100)
    assert m.to_bytes(8192, 65536) == data[100 : 100 + 65536]
    assert m.to_bytes(0, 8192) == b"\0" * 8192
    assert np.from_dlpack(v).tobytes() == data[100 : 100 + 65536]
    with pytest.raises(p2pdma.InvalidArgumentError):
        m.view(1 << 20, 1)
    with pytest.raises(p2pdma.InvalidArgumentError):
        m.view((1 << 20) - 10, 11)


def test_accelerator_memory_needs_the_module():
    try:
        m = p2pdma.Memory.accelerator(1 << 20)
    except p2pdma.ModuleError as e:
        assert e.errno is not None
        assert "p2pdma" in str(e)
        return
    assert m.device.startswith("accel:")
    assert m.__dlpack_device__()[0] == 12  # kDLExtDev: not host memory
    assert np.from_dlpack(m.view()).shape == (1 << 20,)


def test_a_views_array_interface_is_its_address():
    m = p2pdma.Memory.host(8192)
    m.write(b"abc", offset=4100)
    v = m.view(4096, 16)
    ai = v.__array_interface__
    assert ai["shape"] == (16,) and ai["typestr"] == "|u1" and ai["version"] == 3
    a = np.asarray(v)  # through the array interface
    assert a[4:7].tobytes() == b"abc"
    assert ai["data"][0] == np.from_dlpack(v).ctypes.data
