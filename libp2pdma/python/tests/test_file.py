"""Every call of p2pdma.File, against real files, bytes checked against what
Python's own file I/O wrote and reads."""

import errno
import os

import numpy as np
import pytest
import torch

import p2pdma


def test_read_fills_the_buffer_with_the_file(data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        buf = bytearray(len(data))
        assert f.read(buf) == len(data)
        assert bytes(buf) == data
        assert f.size() == len(data)
        assert f.path == path
        assert f.flags == "r"


@pytest.mark.parametrize("offset,size", [(0, 1), (1, 4095), (4096, 4096), (12345, 300000), (len(b"") + 7, 1 << 20)])
def test_read_at_offsets_with_sizes(data_file, offset, size):
    path, data = data_file
    with p2pdma.File(path) as f:
        buf = np.zeros(size + 100, dtype=np.uint8)
        assert f.read(buf, size, file_offset=offset, buf_offset=50) == size
        assert buf[:50].tobytes() == b"\0" * 50
        assert buf[50 : 50 + size].tobytes() == data[offset : offset + size]
        assert buf[50 + size :].tobytes() == b"\0" * 50


def test_a_zero_byte_read_moves_nothing(data_file):
    path, _ = data_file
    with p2pdma.File(path) as f:
        buf = bytearray(b"x" * 8)
        assert f.read(buf, 0, file_offset=len(_) + 100) == 0
        assert f.pread(buf, 0).wait() == 0
        assert buf == bytearray(b"x" * 8)


def test_write_has_pwrite_semantics(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"\xaa" * 10000)
    with p2pdma.File(path, "r+") as f:
        src = np.arange(3000, dtype=np.uint8)
        assert f.write(src, file_offset=5000) == 3000
        # Past the end: the file grows, the gap reads as zeros.
        assert f.write(b"tail", file_offset=20000) == 4
        f.sync()
    got = path.read_bytes()
    want = bytearray(b"\xaa" * 10000)
    want[5000:8000] = src.tobytes()
    want += b"\0" * (20000 - len(want)) + b"tail"
    assert got == bytes(want)


def test_w_creates_and_truncates_and_r_plus_keeps(tmp_path):
    path = tmp_path / "new.bin"
    with p2pdma.File(path, "w") as f:
        f.write(b"hello world")
    assert path.read_bytes() == b"hello world"
    with p2pdma.File(path, "r+") as f:
        f.write(b"HELLO", file_offset=0)
    assert path.read_bytes() == b"HELLO world"
    with p2pdma.File(path, "w") as f:
        assert f.size() == 0


def test_a_read_only_file_refuses_writes(data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        with pytest.raises(p2pdma.Error) as e:
            f.write(b"x" * 4096)
        assert e.value.errno in (errno.EBADF, errno.EINVAL, errno.EACCES, errno.EPERM)
        assert e.value.filename == str(path)
    assert path.read_bytes() == data


def test_pread_and_pwrite_futures(tmp_path, data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        bufs = [np.zeros(100000, dtype=np.uint8) for _ in range(8)]
        futs = [f.pread(b, file_offset=i * 100000) for i, b in enumerate(bufs)]
        assert [fu.size for fu in futs] == [100000] * 8
        assert [fu.get() for fu in futs] == [100000] * 8
        assert all(fu.done() for fu in futs)
        for i, b in enumerate(bufs):
            assert b.tobytes() == data[i * 100000 : (i + 1) * 100000]
        # A result is kept: asking again gives it again.
        assert futs[0].wait() == 100000
    out = tmp_path / "w.bin"
    with p2pdma.File(out, "w") as g:
        fu = g.pwrite(memoryview(data)[:65536], file_offset=4096)
        assert fu.wait(timeout=60) == 65536
    assert out.read_bytes() == b"\0" * 4096 + data[:65536]


def test_a_future_keeps_its_buffer_alive(data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        buf = bytearray(len(data))
        view = memoryview(buf)
        fut = f.pread(view)
        del view  # the future holds the buffer export
        assert fut.wait() == len(data)
        assert bytes(buf) == data


def test_errors_of_a_future_are_raised_by_wait(data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        fut = f.pread(bytearray(4096), file_offset=len(data) - 10)
        with pytest.raises(p2pdma.EndOfFileError) as e:
            fut.wait()
        assert e.value.errno == errno.ERANGE
        assert e.value.transfer_path == "direct"
        assert "host-memory" in e.value.reason or "host memory" in e.value.reason
        # The same error again, not another one.
        with pytest.raises(p2pdma.EndOfFileError):
            fut.get()


def test_read_past_the_end_raises_and_never_returns_short(data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        buf = bytearray(b"\x55" * 8192)
        with pytest.raises(p2pdma.EndOfFileError) as e:
            f.read(buf, 8192, file_offset=len(data) - 4096)
        assert isinstance(e.value, OSError)
        assert str(path) in str(e.value)


def test_batches(data_file, tmp_path):
    path, data = data_file
    with p2pdma.File(path) as f:
        bufs = [bytearray(n) for n in (1, 4096, 70000, 1 << 20)]
        offs = [0, 10, 4097, 2 << 20]
        batch = f.pread_batch([(b, o) for b, o in zip(bufs, offs)])
        assert len(batch) == 4
        assert batch.wait() == [len(b) for b in bufs]
        assert batch.done()
        for b, o in zip(bufs, offs):
            assert bytes(b) == data[o : o + len(b)]
        # Entries with sizes.
        big = bytearray(8192)
        assert f.pread_batch([(big, 100, 50)]).get() == [50]
        assert bytes(big[:50]) == data[100:150] and big[50:] == bytearray(8142)
    out = tmp_path / "b.bin"
    with p2pdma.File(out, "w") as g, p2pdma.File(path) as f:
        dst = bytearray(4096)
        b = p2pdma.submit_batch([(g, "w", data[:4096], 0), (g, "w", data[4096:8192], 4096), (f, "r", dst, 777)])
        assert b.wait() == [4096, 4096, 4096]
        assert bytes(dst) == data[777 : 777 + 4096]
    assert out.read_bytes() == data[:8192]


def test_a_bad_batch_entry_submits_nothing(tmp_path):
    out = tmp_path / "nothing.bin"
    with p2pdma.File(out, "w") as g:
        with pytest.raises(TypeError):
            p2pdma.submit_batch([(g, "w", b"abcd", 0), (g, "w", object(), 4)])
        with pytest.raises(ValueError):
            p2pdma.submit_batch([(g, "x", b"abcd", 0)])
    assert out.read_bytes() == b""


def test_strided_reads_and_writes(data_file, tmp_path):
    path, data = data_file
    # Columns 16..48 of a table of 1000 rows of 256 bytes at offset 4096.
    shape = p2pdma.Shape(4096 + 16, 32, [(256, 1000)])
    assert shape.runs == 1000 and shape.nbytes == 32000 and shape.run == 32
    assert shape.dims == [(256, 1000)]
    want = b"".join(data[4096 + 16 + 256 * r : 4096 + 48 + 256 * r] for r in range(1000))
    with p2pdma.File(path) as f:
        for mode in ("auto", "rc", "sc", "tat"):
            if mode == "rc":
                continue  # RC needs the strided layout
            buf = np.zeros(32000, dtype=np.uint8)
            rep = f.read_strided(buf, shape, mode=mode)
            assert rep["bytes"] == 32000
            assert buf.tobytes() == want, mode
        mirror = np.zeros(shape.bounding_len, dtype=np.uint8)
        rep = f.read_strided(mirror, shape, layout="strided", mode="rc")
        assert rep["mode"] == "rc"
        for r in range(1000):
            assert mirror[256 * r : 256 * r + 32].tobytes() == data[4096 + 16 + 256 * r : 4096 + 48 + 256 * r]
        with pytest.raises(p2pdma.InvalidArgumentError):
            f.read_strided(np.zeros(100, dtype=np.uint8), shape)
        with pytest.raises(ValueError):
            f.read_strided(np.zeros(32000, dtype=np.uint8), shape, layout="diagonal")
    out = tmp_path / "s.bin"
    out.write_bytes(b"\0" * (4096 + 256 * 1000))
    with p2pdma.File(out, "r+") as g:
        g.write_strided(np.frombuffer(want, dtype=np.uint8), shape)
    got = out.read_bytes()
    for r in range(1000):
        assert got[4096 + 16 + 256 * r : 4096 + 48 + 256 * r] == want[32 * r : 32 * r + 32]
        assert got[4096 + 256 * r : 4096 + 16 + 256 * r] == b"\0" * 16


def test_bad_shapes_are_refused():
    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.Shape(0, 0)
    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.Shape(0, 64, [(32, 2)])  # runs would overlap
    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.Shape(0, 1, [(1, 1)] * 4)
    with pytest.raises(OverflowError):
        p2pdma.Shape(-1, 1)


def test_path_for_says_the_path_and_why(data_file):
    path, _ = data_file
    with p2pdma.File(path) as f:
        p, why = f.path_for(bytearray(4096))
        assert p == "direct" and "host" in why
        p, why = f.path_for(p2pdma.Memory.host(4096))
        assert p == "direct"


def test_a_closed_file_refuses_calls_as_python_files_do(data_file):
    path, _ = data_file
    f = p2pdma.File(path)
    assert not f.closed
    fd = f.fileno()
    assert os.fstat(fd).st_size == len(_)
    f.close()
    assert f.closed
    f.close()  # twice is fine
    with pytest.raises(ValueError, match="closed file"):
        f.read(bytearray(10))
    with pytest.raises(ValueError):
        f.size()
    assert "closed" in repr(f)


def test_transfers_in_flight_outlive_close(data_file):
    path, data = data_file
    f = p2pdma.File(path)
    buf = bytearray(len(data))
    fut = f.pread(buf)
    f.close()
    assert fut.wait() == len(data)
    assert bytes(buf) == data


def test_cufile_is_file():
    assert p2pdma.CuFile is p2pdma.File


def test_fileno_is_the_open_file(data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        assert os.pread(f.fileno(), 0, 0) == b""


def test_batch_entries_are_tuples_or_lists_and_errors_name_the_field(data_file):
    path, data = data_file
    with p2pdma.File(path) as f:
        a, b = bytearray(10), bytearray(20)
        assert f.pread_batch([[a, 5], (b, 100, 20)]).wait() == [10, 20]
        assert bytes(a) == data[5:15] and bytes(b) == data[100:120]
        with pytest.raises(TypeError, match="batch entry 1: size"):
            f.pread_batch([(a, 0), (b, 0, "x")])
        with pytest.raises(OverflowError, match="batch entry 0: file_offset"):
            f.pread_batch([(a, -1, 4)])
        with pytest.raises(ValueError, match="batch entry 0 has 4 items"):
            f.pread_batch([(a, 0, 1, 2)])
        with pytest.raises(TypeError, match="batch entry 0"):
            f.pread_batch([a])
        with pytest.raises(TypeError, match="not a p2pdma.File"):
            p2pdma.submit_batch([("not a file", "r", a, 0)])
