"""CUDA memory with the emulated driver (tests/cuda-emu): device memory kept
in host memory behind pointers the CPU cannot dereference, async copies
run later on stream threads; or with the real driver on a GPU machine.

``test_cuda.py`` runs this file with pytest in a process of its own, with
``P2PDMA_CUDA_DRIVER`` naming the emulated ``libcuda.so.1`` (the driver is
chosen once per process), or, with ``P2PDMA_TEST_REAL_CUDA=1``, with the
driver the loader finds. Device memory comes from the driver through
ctypes; every check reads it back with ``cuMemcpyDtoH`` and compares with
the file's bytes.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os
import struct
import threading
import time

import pytest

import p2pdma
from cuda_helpers import KDLCUDA, CudaArray, DeviceBuffer, Driver, capsule_tensor

DRIVER = os.environ.get("P2PDMA_CUDA_DRIVER") or (
    "libcuda.so.1" if os.environ.get("P2PDMA_TEST_REAL_CUDA") == "1" else ""
)
if not DRIVER:
    pytest.skip("P2PDMA_CUDA_DRIVER names no driver: run by test_cuda.py", allow_module_level=True)

# 1 MiB + 3333 bytes: not a multiple of 4096, nor of the engine's chunks.
N = (1 << 20) + 3333


@pytest.fixture(scope="module")
def cu():
    return Driver(DRIVER)


@pytest.fixture
def dev(cu):
    b = DeviceBuffer(cu, N)
    yield b
    b.free()


def test_reads_into_the_cuda_array_interface(cu, dev, data_file):
    path, data = data_file
    cases = [(0, N, 0), (4097, 12345, 0), ((1 << 20) + 5, 3 * 4096 + 1, 777), (len(data) - 4000, 4000, N - 4000), (12, 1, 4095)]
    with p2pdma.File(path) as f:
        for file_offset, size, at in cases:
            assert f.read(dev.cai(), size, file_offset, buf_offset=at) == size
            assert dev.bytes(at, size) == data[file_offset : file_offset + size], (file_offset, size, at)
        # A whole buffer by default, and an interface at an offset.
        assert f.read(dev.cai(100, 5000), file_offset=3) == 5000
        assert dev.bytes(100, 5000) == data[3:5003]
    # Bytes outside what was read are untouched.
    fresh = DeviceBuffer(cu, 3 * 4096)
    with p2pdma.File(path) as f:
        f.read(fresh.cai(), 4096 + 10, 99, buf_offset=2000)
    got = fresh.bytes()
    assert got[:2000] == b"\x5a" * 2000 and got[2000 + 4106 :] == b"\x5a" * (3 * 4096 - 6106)
    assert got[2000:6106] == data[99 : 99 + 4106]
    fresh.free()


def test_reads_into_a_dlpack_tensor(dev, data_file):
    path, data = data_file
    t = dev.dlpack(offset=4096 + 7, n=200_000)
    with p2pdma.File(path) as f:
        assert f.read(t, file_offset=321) == 200_000
    assert dev.bytes(4096 + 7, 200_000) == data[321 : 321 + 200_000]
    # The producer was asked for the legacy default stream, and got its
    # tensor back once the read was done.
    assert t.streams == [1]
    assert t.deleted == 1


def test_background_reads_futures_batches_and_await(cu, dev, data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        fut = f.pread(dev.cai(), 300_001, 4096 * 3 + 17)
        assert fut.wait() == 300_001
        assert dev.bytes(0, 300_001) == data[4096 * 3 + 17 :][:300_001]

        pieces = [(dev.cai(i * 200_000, 150_000 + i), 1000 * i + i, 150_000 + i) for i in range(5)]
        assert f.pread_batch(pieces).wait() == [150_000 + i for i in range(5)]
        for i in range(5):
            assert dev.bytes(i * 200_000, 150_000 + i) == data[1001 * i : 1001 * i + 150_000 + i]

        t = dev.dlpack(offset=8192, n=65536 + 5)

        async def main():
            return await f.pread(t, file_offset=55)

        assert asyncio.run(main()) == 65536 + 5
        assert dev.bytes(8192, 65536 + 5) == data[55 : 55 + 65536 + 5]
    # The tensor goes back to its producer once the future is gone (the
    # engine's worker may hold the last reference for a moment).
    deadline = time.monotonic() + 10
    while t.deleted == 0 and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert t.deleted == 1


def test_reads_past_the_end_fail_as_for_host_memory(dev, data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        with pytest.raises(p2pdma.EndOfFileError):
            f.read(dev.cai(), 100, len(data) - 10)
        with pytest.raises(p2pdma.EndOfFileError):
            f.pread(dev.cai(), 5000, len(data) - 4096).wait()
        with pytest.raises(p2pdma.EndOfFileError):
            f.read(dev.dlpack(n=100), file_offset=len(data) + 4096)
        assert f.read(dev.cai(), 0, len(data) + 100) == 0
        # Up to the last byte is fine.
        assert f.read(dev.cai(), 10, len(data) - 10) == 10
    assert dev.bytes(0, 10) == data[-10:]


def test_writes_from_device_memory(cu, dev, tmp_path):
    payload = os.urandom(N)
    dev.write(payload)
    out = tmp_path / "out.bin"
    with p2pdma.File(out, "w") as g:
        assert g.write(dev.cai(readonly=True), file_offset=4096 + 1) == N
        assert g.pwrite(dev.dlpack(offset=10, n=50_000), file_offset=N + 8192).wait() == 50_000
        assert g.write(dev.cai(), 777, 2 * N, buf_offset=999) == 777
    got = out.read_bytes()
    assert len(got) == 2 * N + 777
    assert got[:4097] == b"\0" * 4097
    assert got[4097 : 4097 + N] == payload
    assert got[4097 + N : N + 8192] == b"\0" * (8192 - 4097)
    assert got[N + 8192 : N + 58192] == payload[10:50_010]
    assert got[N + 58192 : 2 * N] == b"\0" * (N - 58192)
    assert got[2 * N :] == payload[999 : 999 + 777]


def test_read_only_interfaces_are_written_from_but_not_read_into(dev, data_file, tmp_path):
    path, _ = data_file
    with p2pdma.File(path) as f:
        with pytest.raises(p2pdma.InvalidArgumentError, match="read-only"):
            f.read(dev.cai(readonly=True))
    assert dev.bytes(0, 4096) == b"\x5a" * 4096


def test_the_producers_stream_is_waited_for(cu, dev, tmp_path):
    """Copies queued on the producer's stream land before the engine reads
    the memory: the emulated driver runs them later."""
    payload = os.urandom(1 << 20)
    host = ctypes.c_void_p()
    cu.check(cu.lib.cuMemAllocHost_v2(ctypes.byref(host), len(payload)), "cuMemAllocHost")
    ctypes.memmove(host, payload, len(payload))
    stream = ctypes.c_void_p()
    cu.check(cu.lib.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    out = tmp_path / "ordered.bin"
    # A slow kernel stands first in line: the copy behind it lands late.
    slow = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: time.sleep(0.2))
    cu.lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

    def queue(s, data):
        cu.check(cu.lib.cuLaunchHostFunc(s, slow, None), "cuLaunchHostFunc")
        ctypes.memmove(host, data, len(data))
        cu.check(cu.lib.cuMemcpyHtoDAsync_v2(dev.ptr, host, len(data), s), "cuMemcpyHtoDAsync")

    try:
        # The interface names the stream.
        queue(stream, payload)
        with p2pdma.File(out, "w") as g:
            g.write(dev.cai(0, len(payload), stream=stream.value))
        assert out.read_bytes() == payload

        # DLPack: the producer orders its work before the legacy default
        # stream (stream=1), here by queueing it there.
        payload2 = os.urandom(len(payload))

        def on_export(s):
            assert s == 1
            queue(None, payload2)

        with p2pdma.File(out, "w") as g:
            g.write(dev.dlpack(n=len(payload2), on_export=on_export))
        assert out.read_bytes() == payload2
    finally:
        cu.check(cu.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
        cu.check(cu.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        cu.check(cu.lib.cuStreamDestroy_v2(stream), "cuStreamDestroy")
        cu.check(cu.lib.cuMemFreeHost(host), "cuMemFreeHost")


def test_copies_run_on_the_copy_engine_from_page_locked_slots(cu, dev, data_file):
    if not hasattr(cu.lib, "cuemuGetStats"):
        pytest.skip("the driver keeps no statistics (not the emulated one)")
    path, data = data_file
    before = cu.stats()
    with p2pdma.File(path) as f:
        f.read(dev.cai(), N, 1)
        g_path, reason = f.path_for(dev.cai())
    after = cu.stats()
    assert g_path == "bounce" and "CUDA" in reason
    assert dev.bytes() == data[1 : 1 + N]
    # Every byte went host-to-device by async copies out of page-locked
    # memory, none from pageable memory; the library never lacked a context.
    assert after["htod_async_bytes"] - before["htod_async_bytes"] == N
    assert after["htod_pageable_calls"] == before["htod_pageable_calls"]
    assert after["live_registered"] >= 1
    assert after["no_context"] == before["no_context"]


def test_threads_read_into_their_own_ranges(cu, data_file):
    path, data = data_file
    n, threads = 100_003, 8
    buf = DeviceBuffer(cu, n * threads)
    errors: list[BaseException] = []

    def work(i):
        try:
            with p2pdma.File(path) as f:
                for _ in range(3):
                    f.read(buf.cai(i * n, n), file_offset=i * 4099)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for i in range(threads):
        assert buf.bytes(i * n, n) == data[i * 4099 : i * 4099 + n], i
    buf.free()


def test_memory_on_cuda_round_trip(cu, data_file, tmp_path):
    path, data = data_file
    m = p2pdma.Memory.cuda(N)
    assert m.size == len(m) == N
    assert m.device == "cuda:0" and "CUDA device 0" in m.kind
    assert m.__dlpack_device__() == (KDLCUDA, 0)
    assert m.to_bytes() == b"\0" * N  # zeroed
    ptr = m.__cuda_array_interface__["data"][0]
    assert m.__cuda_array_interface__["shape"] == (N,)

    with p2pdma.File(path) as f:
        assert f.read(m, file_offset=5) == N
    assert m.to_bytes() == data[5 : 5 + N]
    assert cu.dtoh(ptr, N) == data[5 : 5 + N]

    # A view is a range on the device, and a target of its own.
    v = m.view(4096, 10_000)
    assert v.__dlpack_device__() == (KDLCUDA, 0)
    assert v.__cuda_array_interface__["data"][0] == ptr + 4096
    assert not hasattr(v, "__array_interface__")
    with p2pdma.File(path) as f:
        f.read(v, file_offset=2 << 20)
    assert m.to_bytes(4096, 10_000) == data[2 << 20 : (2 << 20) + 10_000]
    assert m.to_bytes(0, 4096) == data[5 : 5 + 4096]

    # DLPack exports the device address on kDLCUDA.
    for obj, at, n in ((m, 0, N), (v, 4096, 10_000)):
        capsule = obj.__dlpack__(stream=1)
        t = capsule_tensor(capsule)
        assert (t.device.device_type, t.device.device_id) == (KDLCUDA, 0)
        assert t.data + t.byte_offset == ptr + at and t.shape[0] == n
    with pytest.raises(ValueError):
        m.__dlpack__(stream=0)

    # Copies in and out, and to a file and back.
    m.write(b"hello, device", 3)
    assert m.to_bytes(0, 16) == data[5:8] + b"hello, device"
    out = tmp_path / "mem.bin"
    with p2pdma.File(out, "w") as g:
        assert g.write(m) == N
    with p2pdma.File(out) as g:
        back = bytearray(N)
        g.read(back)
    assert bytes(back) == m.to_bytes()

    # Memory to device memory lent by another producer, and back.
    other = DeviceBuffer(cu, 5000)
    assert m.read(other.cai(), offset=3) == 5000
    assert other.bytes() == m.to_bytes(3, 5000)
    other.write(b"\x01" * 5000)
    m.write(other.dlpack(), offset=N - 5000)
    assert m.to_bytes(N - 5000) == b"\x01" * 5000
    other.free()

    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.Memory.cuda(4096, 1000)  # no device 1000
    with pytest.raises(p2pdma.InvalidArgumentError):
        m.view(N - 10, 11)


def test_pointers_that_are_not_device_memory_are_refused(cu, dev, data_file):
    path, _ = data_file
    host = bytearray(8192)
    addr = ctypes.addressof((ctypes.c_char * 8192).from_buffer(host))
    with p2pdma.File(path) as f:
        with pytest.raises(p2pdma.InvalidArgumentError, match="not CUDA device memory"):
            f.read(CudaArray(addr, 8192))
        # A range reaching past its allocation.
        with pytest.raises(p2pdma.InvalidArgumentError):
            f.read(dev.cai(N - 100, 200))
    assert host == bytearray(8192)


def _saved_for_emulated_cuda(ps, arrays, tmp_path, monkeypatch):
    """`arrays` saved with the binding's safetensors module `ps`, whose
    loads to "cuda:0" then leave each tensor as the view of its CUDA memory
    (torch's CUDA stood in for): the file's path, its bytes, its header's
    length and its header."""
    path = tmp_path / "w.safetensors"
    ps.save_file(arrays, path)
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    monkeypatch.setattr(ps, "_cuda_ordinal", lambda device, index, framework: 0)
    monkeypatch.setattr(ps, "_cuda_tensor", lambda view: view)
    monkeypatch.setattr(ps, "_as_tensor", lambda view, e, dtype, framework: view)
    return path, raw, hlen, header


def test_safetensors_image_into_cuda_memory(cu, tmp_path, monkeypatch):
    """load_file(device="cuda:0") without torch's CUDA: the tensors are left
    as the views of the one allocation, and checked byte by byte."""
    np = pytest.importorskip("numpy")
    # torch itself names the dtypes of framework="pt"; only its CUDA is
    # stood in for.
    pytest.importorskip("torch")
    from p2pdma import safetensors as ps

    arrays = {
        "a": np.arange(1000, dtype=np.float32),
        "b": np.frombuffer(os.urandom(3 * 4099 * 2), dtype=np.int16).reshape(3, 4099),
        "c": np.frombuffer(os.urandom(8 * 77), dtype=np.float64),
    }
    path, raw, hlen, header = _saved_for_emulated_cuda(ps, arrays, tmp_path, monkeypatch)
    got = ps.load_file(path, "cuda:0")
    assert set(got) == set(arrays)
    for name, view in got.items():
        begin, end = header[name]["data_offsets"]
        assert view.__dlpack_device__() == (KDLCUDA, 0)
        assert view.size == end - begin
        ptr = view.__cuda_array_interface__["data"][0]
        assert cu.dtoh(ptr, end - begin) == raw[8 + hlen + begin : 8 + hlen + end], name
        # The image keeps each tensor at its file offset's place in a page.
        assert (ptr - (8 + hlen + begin)) % 4096 == 0


def test_kvikio_raw_calls_in_stream_order(cu, dev, tmp_path, data_file):
    """KvikIO's raw_write_async/raw_read_async (positional, as a KvikIO
    program calls them): the work queued on the stream before the call
    lands first, and the data has landed when the future is checked."""
    path, data = data_file
    n = 1 << 20
    payload = os.urandom(n)
    host = ctypes.c_void_p()
    cu.check(cu.lib.cuMemAllocHost_v2(ctypes.byref(host), n), "cuMemAllocHost")
    ctypes.memmove(host, payload, n)
    stream = ctypes.c_void_p()
    cu.check(cu.lib.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    slow = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: time.sleep(0.2))
    cu.lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    out = tmp_path / "raw.bin"
    try:
        cu.check(cu.lib.cuLaunchHostFunc(stream, slow, None), "cuLaunchHostFunc")
        cu.check(cu.lib.cuMemcpyHtoDAsync_v2(dev.ptr + 100, host, n, stream), "cuMemcpyHtoDAsync")
        with p2pdma.CuFile(out, "w") as g:
            fut = g.raw_write_async(dev.cai(), stream.value, n, 0, 100)
            assert fut.check_bytes_done() == n
            assert g.raw_write(dev.cai(), 4096, n, 100) == 4096
        assert out.read_bytes() == payload + payload[:4096]
        with p2pdma.CuFile(path, "r") as f:
            fut = f.raw_read_async(dev.cai(), stream.value, 5000, 77, 3)
            assert fut.check_bytes_done() == 5000
            assert dev.bytes(3, 5000) == data[77:5077]
            assert f.raw_read(dev.cai(), size=1000, file_offset=9, dev_offset=N - 1000) == 1000
            assert dev.bytes(N - 1000) == data[9:1009]
            # KvikIO's fourth positional argument of read is task_size.
            assert f.read(dev.cai(), 4096, 0, 4096) == 4096
            assert dev.bytes(0, 4096) == data[:4096]
            # The legacy default stream too.
            assert f.raw_read_async(buf=dev.cai(), raw_stream=0, size=10, file_offset=1).check_bytes_done() == 10
            assert dev.bytes(0, 10) == data[1:11]
    finally:
        cu.check(cu.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
        cu.check(cu.lib.cuStreamDestroy_v2(stream), "cuStreamDestroy")
        cu.check(cu.lib.cuMemFreeHost(host), "cuMemFreeHost")


def test_safetensors_safe_open_into_cuda_memory(cu, tmp_path, monkeypatch):
    """safe_open(device="cuda:0") reads each tensor on demand into CUDA
    memory, through load_file's path; without torch's CUDA the tensors are
    left as views of the memory, and checked byte by byte."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("torch")
    from p2pdma import safetensors as ps

    arrays = {
        "a": np.arange(1000, dtype=np.float32),
        "b": np.frombuffer(os.urandom(3 * 4099 * 2), dtype=np.int16).reshape(3, 4099),
    }
    path, raw, hlen, header = _saved_for_emulated_cuda(ps, arrays, tmp_path, monkeypatch)
    with ps.safe_open(path, framework="pt", device="cuda:0") as f:
        assert f.keys() == ["a", "b"]
        for name in ("b", "a"):
            view = f.get_tensor(name)
            begin, end = header[name]["data_offsets"]
            assert view.__dlpack_device__() == (KDLCUDA, 0)
            ptr = view.__cuda_array_interface__["data"][0]
            assert cu.dtoh(ptr, end - begin) == raw[8 + hlen + begin : 8 + hlen + end], name


def test_store_with_its_cache_in_gpu_memory(cu, dev, tmp_path):
    """A store whose page cache is GPU memory: chunks written from and
    read into device buffers, checked byte for byte; a hit is the GPU's own
    copy (the emulated driver counts no host bytes for it)."""
    chunk = 256 << 10
    blobs = [os.urandom(chunk) for _ in range(6)]
    frames = p2pdma.Memory.cuda(16 * (64 << 10))
    store = p2pdma.Store.format(tmp_path / "kv.store", 64, size=16 << 20, cache=frames)
    ids = []
    for b in blobs:
        i = store.create(chunk)
        dev.write(b)
        assert store.write(i, dev.cai(0, chunk)) == chunk
        ids.append(i)
    store.flush()
    for i, b in zip(ids, blobs):
        assert store.read(i, dev.cai(0, chunk)) == chunk
        assert dev.bytes(0, chunk) == b
    # The last chunks are cached now: reading one again moves no byte
    # through the host where the driver counts.
    if hasattr(cu.lib, "cuemuGetStats"):
        hits = store.cache_stats()["hits"]
        before = cu.stats()
        store.read(ids[-1], dev.cai(0, chunk))
        after = cu.stats()
        assert store.cache_stats()["hits"] == hits + chunk // (64 << 10)
        assert after["htod_async_bytes"] + after["htod_pageable_bytes"] == before["htod_async_bytes"] + before["htod_pageable_bytes"]
        assert after["dtoh_pageable_bytes"] == before["dtoh_pageable_bytes"]
        assert after["dtod_async_bytes"] - before["dtod_async_bytes"] == chunk
    assert dev.bytes(0, chunk) == blobs[-1]
    # Reopened without a cache, the bytes are on storage.
    del store
    gc.collect()
    plain = p2pdma.Store.open(tmp_path / "kv.store")
    assert sorted(s for _, s in plain.objects()) == [chunk] * len(blobs)
    for i, b in zip(ids, blobs):
        assert plain.read(i, dev.cai(0, chunk)) == chunk
        assert dev.bytes(0, chunk) == b
