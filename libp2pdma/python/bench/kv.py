"""A KV-cache offload workload from Python, as a serving engine's cache
layer (LMCache, NIXL) drives one: fixed-size chunks of keys and values
saved to and loaded from ``p2pdma.Store`` by several consumer threads, each
into a buffer of its own (GPU memory with ``--cuda``), the store's page
cache holding a hot set of chunks.

For each hit-ratio knob (the share of loads that ask for a hot chunk), per
chunk: p50 and p99 load latency and throughput, with the hit ratio the
cache counted; beside them in the same run: the workload without a cache,
the cache in host memory (with ``--cuda``), and fio's random reads of one
chunk per job on the same file (the storage's limit). One operation in ten
is a save (the chunk's bytes written back); every eighth load is checked.

    python kv.py --dir /mnt/nvme --chunk 1M --chunks 256 --threads 4 [--cuda]

The default chunk, 1 MiB, is 256 tokens of one layer of a Llama-3-8B-class
model (8 KV heads of 128, keys and values, fp16).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

import p2pdma

PAGE = 64 << 10


def size_arg(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def pattern(k: int, n: int) -> np.ndarray:
    """Chunk ``k``'s bytes: 8-byte words mixing the word's index and ``k``."""
    j = np.arange(n // 8, dtype=np.uint64)
    return (j * np.uint64(0x2545F4914F6CDD1D) ^ np.uint64((k + 1) * 0x9E3779B97F4A7C15 % (1 << 64))).view(np.uint8)


class Buffers:
    """A consumer's chunk buffer: GPU memory (``p2pdma.Memory.cuda``) or a
    numpy array."""

    def __init__(self, chunk: int, cuda: bool):
        self.cuda = cuda
        self.buf = p2pdma.Memory.cuda(chunk) if cuda else np.empty(chunk, dtype=np.uint8)

    def put(self, data: np.ndarray) -> None:
        if self.cuda:
            self.buf.write(data)
        else:
            self.buf[:] = data

    def get(self) -> np.ndarray:
        if self.cuda:
            out = np.empty(len(self.buf), dtype=np.uint8)
            self.buf.read(out)
            return out
        return self.buf


def run(store, ids, hot, chunk, knob, threads, secs, cuda):
    before = store.cache_stats()
    stop = threading.Event()
    results: list = [None] * threads

    def consumer(t: int) -> None:
        rng = np.random.default_rng(7 + t)
        b = Buffers(chunk, cuda)
        lat, saves, n = [], 0, 0
        try:
            while not stop.is_set():
                n += 1
                k = int(rng.integers(0, hot)) if rng.random() < knob else int(rng.integers(hot, len(ids)))
                if n % 10 == 0:
                    b.put(pattern(k, chunk))
                    store.write(ids[k], b.buf)
                    saves += 1
                    continue
                t0 = time.perf_counter()
                store.read(ids[k], b.buf)
                lat.append((time.perf_counter() - t0) * 1e6)
                if n % 8 == 0 and not np.array_equal(b.get(), pattern(k, chunk)):
                    raise AssertionError(f"chunk {k} loaded wrong")
            results[t] = (lat, saves)
        except BaseException as e:  # noqa: BLE001 - reported below
            results[t] = e

    workers = [threading.Thread(target=consumer, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(secs)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    lat, saves = [], 0
    for r in results:
        if isinstance(r, BaseException):
            raise r
        lat += r[0]
        saves += r[1]
    lat.sort()
    after = store.cache_stats()
    hit = None
    if before is not None and after is not None:
        h, m = after["hits"] - before["hits"], after["misses"] - before["misses"]
        hit = h / max(h + m, 1)
    pct = lambda p: lat[round((len(lat) - 1) * p)] if lat else float("nan")  # noqa: E731
    return {
        "gib_s": (len(lat) + saves) * chunk / elapsed / (1 << 30),
        "p50_us": pct(0.5),
        "p99_us": pct(0.99),
        "hit_ratio": hit,
        "loads": len(lat),
        "saves": saves,
    }


def fio_random(path: str, size: int, chunk: int, threads: int, secs: float) -> float | None:
    if not shutil.which("fio"):
        return None
    out = subprocess.run(
        ["fio", "--name=kv", f"--filename={path}", "--rw=randread", f"--bs={chunk}", "--direct=1",
         "--ioengine=io_uring", "--iodepth=1", f"--numjobs={threads}", "--group_reporting",
         f"--size={size}", "--time_based", f"--runtime={int(secs * 1000)}ms", "--output-format=json"],
        capture_output=True, text=True,
    )
    if out.returncode != 0:
        # No limit to compare with (a filesystem without O_DIRECT, an old
        # fio): said, and the rest still runs.
        print(f"  fio failed ({out.returncode}): {out.stderr.strip()[:200]}")
        return None
    return json.loads(out.stdout)["jobs"][0]["read"]["bw_bytes"] / (1 << 30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a directory on the storage (O_DIRECT: not tmpfs)")
    ap.add_argument("--chunk", type=size_arg, default=1 << 20)
    ap.add_argument("--chunks", type=int, default=256)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--cuda", action="store_true", help="buffers and cache in CUDA device 0's memory")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.chunk % PAGE:
        ap.error("--chunk: a whole number of 64 KiB pages")
    n, chunk = max(a.chunks, 8), a.chunk
    hot = max(n // 4, 1)
    path = os.path.join(a.dir, "kv.store")
    data = n * chunk
    store = p2pdma.Store.format(path, n + 16, size=data + data // 8 + (8 << 20))
    ids = []
    fill = np.empty(chunk, dtype=np.uint8)
    for k in range(n):
        i = store.create(chunk)
        fill[:] = pattern(k, chunk)
        store.write(i, fill)
        ids.append(i)
    store.flush()
    del store
    rows = []
    limit = fio_random(path, data, chunk, a.threads, a.secs)
    plain = p2pdma.Store.open(path)
    rows.append(("no cache", None, run(plain, ids, hot, chunk, 0.0, a.threads, a.secs, a.cuda)))
    del plain
    frames = (hot + max(hot // 8, 1)) * chunk
    kinds = [("GPU memory", lambda: p2pdma.Memory.cuda(frames)), ("host memory", lambda: p2pdma.Memory.host(frames))] if a.cuda else [("host memory", lambda: p2pdma.Memory.host(frames))]
    for name, alloc in kinds:
        for knob in (0.0, 0.5, 0.9, 1.0):
            store = p2pdma.Store.open(path, cache=alloc())
            warm = Buffers(chunk, a.cuda)
            for i in ids[:hot]:
                store.read(i, warm.buf)
            rows.append((f"cache in {name}", knob, run(store, ids, hot, chunk, knob, a.threads, a.secs, a.cuda)))
            store.flush()
            del store
    where = "GPU memory (CUDA device 0)" if a.cuda else "host memory"
    print(f"kv (python): {n} chunks of {chunk >> 10} KiB, {a.threads} consumers, buffers in {where}, {a.secs} s per cell")
    if limit is not None:
        print(f"  the storage limit: fio, random reads of one chunk, {a.threads} jobs at depth 1: {limit:.3f} GiB/s")
    print(f"  {'':28} {'knob':>5} {'hits':>5} {'GiB/s':>8} {'p50 us':>9} {'p99 us':>9} {'/ fio':>6}")
    for name, knob, r in rows:
        vs = f"{r['gib_s'] / limit:6.3f}" if limit else "     -"
        k = f"{knob:.0%}" if knob is not None else "-"
        h = f"{r['hit_ratio']:.0%}" if r["hit_ratio"] is not None else "-"
        print(f"  {name:28} {k:>5} {h:>5} {r['gib_s']:8.3f} {r['p50_us']:9.1f} {r['p99_us']:9.1f} {vs}")
    print("  every eighth load was checked against the chunk's pattern")
    if a.json:
        print(json.dumps({"limit_gib_s": limit, "rows": [dict(r, contender=nm, knob=kb) for nm, kb, r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
