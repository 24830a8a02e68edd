"""Threads and asyncio: many transfers at once, bytes checked, and a random
sequence of calls held to pread/pwrite semantics against a model."""

import asyncio
import os
import random
import threading

import numpy as np
import pytest

import p2pdma


def test_many_threads_read_and_write_one_file(tmp_path):
    size = 4 << 20
    data = os.urandom(size)
    path = tmp_path / "t.bin"
    path.write_bytes(data)
    out = tmp_path / "o.bin"
    out.write_bytes(b"\0" * size)
    errors = []
    piece = size // 16

    def worker(i):
        try:
            rng = random.Random(i)
            with p2pdma.File(path) as f, p2pdma.File(out, "r+") as g:
                for _ in range(20):
                    off = rng.randrange(0, size - 70000)
                    n = rng.randrange(1, 70000)
                    buf = np.zeros(n, dtype=np.uint8)
                    assert f.read(buf, file_offset=off) == n
                    assert buf.tobytes() == data[off : off + n]
                # Each thread owns one sixteenth of the output file.
                g.write(memoryview(data)[i * piece : (i + 1) * piece], file_offset=i * piece)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert out.read_bytes() == data


def test_the_gil_is_released_during_io(tmp_path):
    """A thread spinning in Python keeps running while another waits on a
    large transfer."""
    data = os.urandom(32 << 20)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    ticks = 0
    stop = threading.Event()

    def spin():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        buf = bytearray(len(data))
        with p2pdma.File(path) as f:
            before = ticks
            for _ in range(3):
                f.read(buf)
            during = ticks - before
    finally:
        stop.set()
        t.join()
    assert bytes(buf) == data
    assert during > 0


def test_await_a_read(data_file):
    path, data = data_file

    async def main():
        with p2pdma.File(path) as f:
            bufs = [bytearray(50000) for _ in range(20)]
            n = await asyncio.gather(*(f.pread(b, file_offset=i * 50000) for i, b in enumerate(bufs)))
            assert n == [50000] * 20
            for i, b in enumerate(bufs):
                assert bytes(b) == data[i * 50000 : (i + 1) * 50000]
            one = bytearray(10)
            assert await f.pread(one, file_offset=5) == 10
            assert bytes(one) == data[5:15]
            batch = f.pread_batch([(bytearray(100), 0), (bytearray(200), 1000)])
            assert await batch == [100, 200]

    asyncio.run(main())


def test_await_raises_the_transfers_error(data_file):
    path, data = data_file

    async def main():
        with p2pdma.File(path) as f:
            with pytest.raises(p2pdma.EndOfFileError):
                await f.pread(bytearray(100), file_offset=len(data))
            batch = f.pread_batch([(bytearray(100), 0), (bytearray(100), len(data) - 1)])
            with pytest.raises(p2pdma.EndOfFileError):
                await batch

    asyncio.run(main())


def test_await_a_finished_future_and_await_twice(data_file):
    path, data = data_file

    async def main():
        with p2pdma.File(path) as f:
            buf = bytearray(4096)
            fut = f.pread(buf)
            fut.wait()
            assert await fut == 4096
            fut2 = f.pread(bytearray(1 << 20))
            a, b = await asyncio.gather(fut2, fut2)
            assert a == b == 1 << 20

    asyncio.run(main())


def test_awaiters_on_many_loops_in_threads(data_file):
    path, data = data_file
    results = []

    def run():
        async def main():
            with p2pdma.File(path) as f:
                buf = bytearray(1 << 20)
                n = await f.pread(buf, file_offset=1234)
                results.append(n == 1 << 20 and bytes(buf) == data[1234 : 1234 + (1 << 20)])

        asyncio.run(main())

    ts = [threading.Thread(target=run) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == [True] * 8


@pytest.mark.parametrize("seed", range(6))
def test_random_calls_keep_pread_pwrite_semantics(tmp_path, seed):
    """Random reads, writes, background transfers and batches on one file,
    with several buffer kinds, each step checked against a model of the
    file's bytes; reads past the end must raise and change nothing."""
    rng = random.Random(seed)
    path = tmp_path / "model.bin"
    model = bytearray(os.urandom(rng.randrange(0, 300000)))
    path.write_bytes(model)

    def make(n):
        kind = rng.randrange(4)
        if kind == 0:
            b = bytearray(n)
            return b, lambda: bytes(b)
        if kind == 1:
            a = np.zeros(n, dtype=np.uint8)
            return a, lambda: a.tobytes()
        if kind == 2:
            m = p2pdma.Memory.host(max(n, 1))
            return m.view(0, n) if n else bytearray(0), (lambda: m.to_bytes(0, n))
        import torch

        t = torch.zeros(n, dtype=torch.uint8)
        return t, lambda: t.numpy().tobytes()

    with p2pdma.File(path, "r+") as f:
        for _ in range(60):
            op = rng.randrange(5)
            off = rng.randrange(0, len(model) + 20000)
            n = rng.choice([0, 1, 511, 512, 4096, rng.randrange(1, 100000)])
            if op in (0, 1):
                buf, content = make(n)
                before = content()
                if n and off + n > len(model):
                    with pytest.raises(p2pdma.EndOfFileError):
                        (f.read(buf, n, off) if op == 0 else f.pread(buf, n, off).wait())
                    # What the buffer holds after a failed read is
                    # unspecified (what arrived before the end was found),
                    # but never more than the file had.
                    got_bytes = content()
                    tail = max(len(model) - off, 0)
                    assert got_bytes[tail:] == before[tail:]
                else:
                    got = f.read(buf, n, off) if op == 0 else f.pread(buf, n, off).wait()
                    assert got == n
                    assert content() == bytes(model[off : off + n])
            elif op in (2, 3):
                src = os.urandom(n)
                got = f.write(src, n, off) if op == 2 else f.pwrite(src, n, off).wait()
                assert got == n
                if n:
                    if off > len(model):
                        model.extend(b"\0" * (off - len(model)))
                    model[off : off + n] = src
            else:
                entries = []
                for _ in range(rng.randrange(1, 5)):
                    o = rng.randrange(0, max(len(model), 1))
                    k = rng.randrange(0, max(len(model) - o, 0) + 1)
                    b = bytearray(k)
                    entries.append((b, o))
                assert f.pread_batch(entries).wait() == [len(b) for b, _ in entries]
                for b, o in entries:
                    assert bytes(b) == bytes(model[o : o + len(b)])
            assert f.size() == len(model)
    assert path.read_bytes() == bytes(model)


def _in_child(fn) -> int:
    """Runs ``fn`` in a forked child; its exit status (1 on an exception,
    124 if it does not finish in 60 s)."""
    import signal

    pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 124
    return os.WEXITSTATUS(status)


def test_background_transfers_work_after_fork(data_file):
    """The parent's worker threads are not in a forked child (a DataLoader
    worker): the default engine is made again there, and an engine of the
    parent's says so instead of hanging."""
    path, data = data_file
    mine = p2pdma.Engine()
    with p2pdma.File(path) as f:
        f.pread(bytearray(4096)).wait()  # the default engine's workers run

    def child():
        with p2pdma.File(path) as g:
            buf = bytearray(100000)
            assert g.pread(buf, file_offset=77).wait(timeout=30) == 100000
            assert bytes(buf) == data[77 : 77 + 100000]
            assert p2pdma.default_engine() is p2pdma.default_engine()
        with p2pdma.File(path, engine=mine) as h:
            with pytest.raises(p2pdma.InvalidArgumentError, match="fork"):
                h.pread(bytearray(10))
            with pytest.raises(p2pdma.InvalidArgumentError, match="fork"):
                h.read(bytearray(10))

    assert _in_child(child) == 0
    # The parent's engines still work.
    with p2pdma.File(path, engine=mine) as h:
        buf = bytearray(10)
        assert h.pread(buf).wait() == 10 and bytes(buf) == data[:10]


def test_a_wait_can_be_interrupted():
    """A long wait still lets a signal through (Ctrl-C): eight 256 MiB reads
    in 64 KiB chunks, one at a time, interrupted 50 ms in."""
    import signal

    fired = []

    def handler(signum, frame):
        fired.append(signum)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, handler)
    try:
        import tempfile

        with tempfile.NamedTemporaryFile() as tmp:
            tmp.write(os.urandom(256 << 20))
            tmp.flush()
            with p2pdma.File(tmp.name, engine=p2pdma.Engine(path="bounce", chunk=65536, depth=1)) as f:
                m = p2pdma.Memory.host(256 << 20)
                futs = [f.pread(m) for _ in range(8)]
                signal.setitimer(signal.ITIMER_REAL, 0.05)
                with pytest.raises(KeyboardInterrupt):
                    for fu in futs:
                        fu.wait()
                for fu in futs:
                    fu.wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert fired
