"""The Python binding measured side by side with the library and with the
usual ways of doing the same thing, in one run.

1. Per-call cost of a 4 KiB read of cached data: the binding
   (``File.read`` and ``File.pread(...).get()``), the same reads from a Rust
   loop over the same engine (``rust_read_loop``), and ``os.preadv`` into
   a numpy array on a buffered descriptor; the engine serves them from the
   page cache, so what is left is the cost of the call.
2. The same 4 KiB reads cold (the file's pages dropped first; each read is
   direct I/O, which caches nothing), against ``os.preadv`` on an
   ``O_DIRECT`` descriptor: the storage's latency plus the call.
3. A large read: the binding against the Rust loop, into the same memory,
   the file's pages dropped before each run; and the same read of the
   cached file against ``readinto`` on a buffered file.
3. Model weights: ``p2pdma.safetensors.load_file`` against
   ``safetensors.torch.load_file`` followed by a copy into the same kind of
   memory, caches dropped before each run.
4. fio at its best on the same file (sequential direct reads, io_uring,
   deep queue): the storage's limit beside the figures above.
5. KvikIO in compat mode on the same reads, where it imports.

Times are the best of ``--reps`` runs. Run through ``tools/rig/python.sh
bench`` (a release build of the binding).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

from storage import drop_caches, fio_best

import p2pdma
from p2pdma import _p2pdma
from p2pdma import safetensors as p2st


def best(fn, reps: int, before=None) -> float:
    times = []
    for _ in range(reps):
        if before:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def make_file(path: str, size: int) -> None:
    chunk = 64 << 20
    rng = np.random.default_rng(1)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n


def small_reads(path: str, calls: int, reps: int, cold: bool) -> dict:
    """4 KiB reads at random aligned offsets: of cached data against
    ``os.preadv`` on a buffered descriptor, or (``cold``) of data the page
    cache does not hold against ``os.preadv`` with ``O_DIRECT``."""
    size = os.path.getsize(path)
    rng = random.Random(2)
    offsets = [rng.randrange(0, size // 4096) * 4096 for _ in range(calls)]
    buf = np.zeros(4096, dtype=np.uint8)
    # Warm the page cache, or empty it; warm the engine either way.
    if cold:
        drop_caches(path)
    else:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass
    aligned = p2pdma.Memory.host(4096)
    direct_buf = np.from_dlpack(aligned)
    with p2pdma.File(path) as f:
        for o in offsets[:100]:
            f.read(buf, 4096, o)

        def py():
            read = f.read
            for o in offsets:
                read(buf, 4096, o)

        def py_future():
            pread = f.pread
            for o in offsets:
                pread(buf, 4096, o).get()

        # Python and Rust alternate, so that both see the same machine.
        t_py, t_fut, t_rust = [], [], []
        for _ in range(reps):
            t_py.append(best(py, 1))
            t_fut.append(best(py_future, 1))
            t_rust.append(_p2pdma.rust_read_loop(f, buf, 4096, offsets))
        t_py, t_fut, t_rust = min(t_py), min(t_fut), min(t_rust)
    flags = os.O_RDONLY | (os.O_DIRECT if cold else 0)
    target = direct_buf if cold else buf
    fd = os.open(path, flags)
    try:

        def preadv():
            for o in offsets:
                os.preadv(fd, [target], o)

        t_os = best(preadv, reps)
    finally:
        os.close(fd)
    us = lambda t: t / calls * 1e6  # noqa: E731
    return {
        "calls": calls,
        "cold": cold,
        "python_us": us(t_py),
        "python_future_us": us(t_fut),
        "rust_us": us(t_rust),
        "preadv_us": us(t_os),
        "python_over_rust": t_py / t_rust,
        "python_over_preadv": t_py / t_os,
        "python_future_over_preadv": t_fut / t_os,
        "rust_over_preadv": t_rust / t_os,
    }


def warm_large_read(path: str, reps: int) -> dict:
    """The whole file, cached, into host memory: ``File.read`` against
    ``readinto`` on a buffered file into a numpy array of the same size."""
    size = os.path.getsize(path)
    mem = p2pdma.Memory.host(size)
    arr = np.empty(size, dtype=np.uint8)
    with open(path, "rb", buffering=0) as plain:
        plain.readinto(arr)
        with p2pdma.File(path) as f:
            ours, theirs = [], []
            for _ in range(reps):
                t = time.perf_counter()
                f.read(mem)
                ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                plain.seek(0)
                n = plain.readinto(arr)
                theirs.append(time.perf_counter() - t)
                assert n == size
    if not np.array_equal(np.from_dlpack(mem), arr):
        raise SystemExit("the cached read into memory differs from readinto's bytes")
    gib = size / (1 << 30)
    return {
        "bytes": size,
        "python_gib_s": gib / min(ours),
        "readinto_gib_s": gib / min(theirs),
        "python_over_readinto_throughput": min(theirs) / min(ours),
    }


def large_read(path: str, reps: int) -> dict:
    size = os.path.getsize(path)
    mem = p2pdma.Memory.host(size)
    drop = lambda: drop_caches(path)  # noqa: E731
    with p2pdma.File(path) as f:
        t_py = best(lambda: f.read(mem), reps, drop)
        t_rust = best(lambda: _p2pdma.rust_read_loop(f, mem, size, [0]), reps, drop)
    gib = size / (1 << 30)
    return {
        "bytes": size,
        "python_gib_s": gib / t_py,
        "rust_gib_s": gib / t_rust,
        "python_over_rust_throughput": t_rust / t_py,
        "dropped_with": drop_caches(path),
    }


def weights(dirpath: str, size: int, reps: int) -> dict:
    import safetensors.torch as st
    import torch

    # About 1 GiB of float16/bfloat16/float32 tensors of a few shapes.
    tensors = {}
    total, i = 0, 0
    g = torch.Generator().manual_seed(3)
    while total < size:
        n = min(16 << 20, size - total) // 4
        dt = (torch.float32, torch.float16, torch.bfloat16)[i % 3]
        tensors[f"layer{i}.weight"] = torch.randint(0, 255, (n * 4,), dtype=torch.uint8, generator=g).view(dt)
        total += n * 4
        i += 1
    path = os.path.join(dirpath, "model.safetensors")
    st.save_file(tensors, path)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    drop = lambda: drop_caches(path)  # noqa: E731

    def ours():
        out = p2st.load_file(path, device="host", progress=False)
        assert len(out) == len(tensors)

    def theirs_and_copy():
        out = st.load_file(path)
        mem = p2pdma.Memory.host(nbytes + 64 * len(out))
        at = 0
        for t in out.values():
            at += mem.write(t.view(torch.uint8).reshape(-1), at)

    def theirs_cpu():
        st.load_file(path)

    def ours_cpu():
        p2st.load_file(path, device="cpu", progress=False)

    t_ours = best(ours, reps, drop)
    t_theirs = best(theirs_and_copy, reps, drop)
    t_ours_cpu = best(ours_cpu, reps, drop)
    t_theirs_cpu = best(theirs_cpu, reps, drop)
    gib = nbytes / (1 << 30)
    return {
        "bytes": nbytes,
        "tensors": len(tensors),
        "ours_into_memory_gib_s": gib / t_ours,
        "safetensors_plus_copy_gib_s": gib / t_theirs,
        "ours_over_safetensors_plus_copy": t_theirs / t_ours,
        "ours_cpu_gib_s": gib / t_ours_cpu,
        "safetensors_cpu_gib_s": gib / t_theirs_cpu,
        "ours_cpu_over_safetensors_cpu": t_theirs_cpu / t_ours_cpu,
    }


def kvikio_reads(path: str, calls: int) -> dict:
    try:
        os.environ.setdefault("KVIKIO_COMPAT_MODE", "ON")
        import kvikio  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"kvikio does not import here: {type(e).__name__}: {e}"}
    size = os.path.getsize(path)
    rng = random.Random(2)
    offsets = [rng.randrange(0, size // 4096) * 4096 for _ in range(calls)]
    buf = np.zeros(4096, dtype=np.uint8)
    try:
        with kvikio.CuFile(path, "r") as f:
            t = time.perf_counter()
            for o in offsets:
                f.read(buf, 4096, o)
            small = (time.perf_counter() - t) / calls * 1e6
            big = np.empty(size, dtype=np.uint8)
            drop_caches(path)
            t = time.perf_counter()
            f.read(big)
            large = size / (1 << 30) / (time.perf_counter() - t)
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"kvikio failed here: {type(e).__name__}: {e}"}
    return {"small_read_us": small, "large_read_gib_s": large}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="where the test files go (default: a temporary directory)")
    ap.add_argument("--size", type=int, default=1 << 30, help="bytes of the large file and of the weights")
    ap.add_argument("--calls", type=int, default=20000, help="4 KiB reads per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="p2pdma-bench-")
    try:
        path = os.path.join(d, "data.bin")
        make_file(path, a.size)
        r = {
            "small_reads": small_reads(path, a.calls, a.reps, cold=False),
            "small_cold": small_reads(path, a.calls, a.reps, cold=True),
            "large_read": large_read(path, a.reps),
            "warm_large_read": warm_large_read(path, a.reps),
            "fio": fio_best(path),
            "weights": weights(d, a.size, a.reps),
            "kvikio": kvikio_reads(path, a.calls),
        }
    finally:
        if not a.dir:
            shutil.rmtree(d, ignore_errors=True)
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    s, c, l, wl = r["small_reads"], r["small_cold"], r["large_read"], r["warm_large_read"]
    w, fio, kv = r["weights"], r["fio"], r["kvikio"]
    print(f"4 KiB reads, page cache warm, {s['calls']} calls, best of {a.reps}:")
    print(f"  python File.read          {s['python_us']:8.2f} us/call   /preadv {s['python_over_preadv']:6.3f}x (goal <= 1.2)")
    print(f"  python File.pread().get() {s['python_future_us']:8.2f} us/call   /preadv {s['python_future_over_preadv']:6.3f}x")
    print(f"  rust engine.read          {s['rust_us']:8.2f} us/call   /preadv {s['rust_over_preadv']:6.3f}x (goal <= 1.2)")
    print(f"  os.preadv into numpy      {s['preadv_us']:8.2f} us/call (buffered descriptor)")
    print(f"4 KiB reads, cold (pages dropped, direct I/O), {c['calls']} calls, best of {a.reps}:")
    print(f"  python File.read          {c['python_us']:8.2f} us/call   /preadv {c['python_over_preadv']:6.3f}x (goal <= 1.2)")
    print(f"  python File.pread().get() {c['python_future_us']:8.2f} us/call   /preadv {c['python_future_over_preadv']:6.3f}x (goal <= 1.2)")
    print(f"  rust engine.read          {c['rust_us']:8.2f} us/call   /preadv {c['rust_over_preadv']:6.3f}x")
    print(f"  os.preadv, O_DIRECT       {c['preadv_us']:8.2f} us/call (the storage's latency)")
    print(f"large read, {l['bytes'] >> 20} MiB, caches dropped ({l['dropped_with']}):")
    print(f"  python {l['python_gib_s']:.2f} GiB/s, rust {l['rust_gib_s']:.2f} GiB/s, "
          f"python/rust throughput {l['python_over_rust_throughput']:.3f} (goal >= 0.97)")
    print(f"large read, {wl['bytes'] >> 20} MiB, cached, into host memory:")
    print(f"  python File.read {wl['python_gib_s']:.2f} GiB/s, readinto {wl['readinto_gib_s']:.2f} GiB/s, "
          f"throughput ratio {wl['python_over_readinto_throughput']:.3f} (goal >= 0.9)")
    if "gib_s" in fio:
        print(f"  fio at its best ({fio['settings']}): {fio['gib_s']:.2f} GiB/s")
    else:
        print(f"  fio: {fio['skipped']}")
    print(f"weights, {w['tensors']} tensors, {w['bytes'] >> 20} MiB, caches dropped:")
    print(f"  p2pdma load_file into memory       {w['ours_into_memory_gib_s']:.2f} GiB/s")
    print(f"  safetensors load_file + copy       {w['safetensors_plus_copy_gib_s']:.2f} GiB/s")
    print(f"  ratio                              {w['ours_over_safetensors_plus_copy']:.2f}x")
    print(f"  to CPU tensors: p2pdma {w['ours_cpu_gib_s']:.2f} GiB/s, safetensors "
          f"{w['safetensors_cpu_gib_s']:.2f} GiB/s, ratio {w['ours_cpu_over_safetensors_cpu']:.2f}x")
    if "skipped" in kv:
        print(f"kvikio: {kv['skipped']}")
    else:
        print(f"kvikio (compat mode): 4 KiB {kv['small_read_us']:.2f} us/call, large {kv['large_read_gib_s']:.2f} GiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
