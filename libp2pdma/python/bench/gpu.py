"""Storage into GPU memory, measured side by side in one run, the file's
pages dropped before each large read.

1. A large file (4 GiB by default) into one CUDA tensor: ``p2pdma``
   (``File.read`` into the tensor), KvikIO in compat mode
   (``kvikio.CuFile.read``), and a plain Python read into host memory
   followed by ``tensor.copy_``; fio at its best on the same file is the
   storage's limit.
2. 4 KiB reads at random block-aligned offsets into GPU memory, per call:
   ``p2pdma`` against KvikIO (compat mode), twice: with the file's pages
   dropped before each run (what storage to GPU costs), and with the file
   in the page cache (what KvikIO's buffered reads then skip; ours are
   ``O_DIRECT`` and still reach the storage).

Goals: at least KvikIO's throughput, at most half its per-call time. Every
result is checked against the file's bytes before it is counted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

os.environ.setdefault("KVIKIO_COMPAT_MODE", "ON")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import p2pdma  # noqa: E402
from storage import drop_caches, fio_best  # noqa: E402


def make_file(path: str, size: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    rng = np.random.default_rng(1)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(256 << 20, left)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n


def best(fn, reps: int, path: str) -> float:
    times = []
    for _ in range(reps):
        drop_caches(path)
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def checked(t: torch.Tensor, expect: torch.Tensor, what: str) -> None:
    if not torch.equal(t, expect):
        raise SystemExit(f"{what}: the bytes in GPU memory differ from the file's")


def large(path: str, reps: int) -> dict:
    size = os.path.getsize(path)
    gib = size / (1 << 30)
    expect = torch.from_numpy(np.fromfile(path, dtype=np.uint8)).cuda()
    t = torch.empty(size, dtype=torch.uint8, device="cuda")
    r: dict = {"bytes": size, "dropped_with": drop_caches(path)}

    f = p2pdma.File(path)
    r["ours_gib_s"] = gib / best(lambda: f.read(t), reps, path)
    checked(t, expect, "p2pdma")

    t.zero_()
    host = bytearray(size)

    def plain():
        with open(path, "rb", buffering=0) as g:
            view = memoryview(host)
            done = 0
            while done < size:
                done += g.readinto(view[done:])
        t.copy_(torch.frombuffer(host, dtype=torch.uint8))

    r["read_copy_gib_s"] = gib / best(plain, reps, path)
    checked(t, expect, "read + copy_")

    try:
        import kvikio  # noqa: PLC0415

        t.zero_()
        with kvikio.CuFile(path, "r") as k:
            r["kvikio_gib_s"] = gib / best(lambda: k.read(t), reps, path)
        checked(t, expect, "kvikio")
    except Exception as e:  # noqa: BLE001
        r["kvikio_skipped"] = f"{type(e).__name__}: {e}"
    r["fio"] = fio_best(path)
    return r


def small(path: str, calls: int, reps: int, cold: bool) -> dict:
    size = os.path.getsize(path)
    rng = random.Random(2)
    offsets = [rng.randrange(0, size // 4096) * 4096 for _ in range(calls)]
    data = np.fromfile(path, dtype=np.uint8)
    t = torch.empty(4096, dtype=torch.uint8, device="cuda")
    r: dict = {"calls": calls, "cold": cold}
    if not cold:
        with open(path, "rb") as g:
            while g.read(256 << 20):
                pass

    def per_call(read) -> float:
        best_us = float("inf")
        for _ in range(reps):
            if cold:
                drop_caches(path)
            s = time.perf_counter()
            for o in offsets:
                read(o)
            torch.cuda.synchronize()
            best_us = min(best_us, (time.perf_counter() - s) / calls * 1e6)
        return best_us

    f = p2pdma.File(path)
    r["ours_us"] = per_call(lambda o: f.read(t, 4096, o))
    if not np.array_equal(t.cpu().numpy(), data[offsets[-1] : offsets[-1] + 4096]):
        raise SystemExit("p2pdma: a 4 KiB read differs from the file")
    try:
        import kvikio  # noqa: PLC0415

        with kvikio.CuFile(path, "r") as k:
            r["kvikio_us"] = per_call(lambda o: k.read(t, 4096, o))
        if not np.array_equal(t.cpu().numpy(), data[offsets[-1] : offsets[-1] + 4096]):
            raise SystemExit("kvikio: a 4 KiB read differs from the file")
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        r["kvikio_skipped"] = f"{type(e).__name__}: {e}"
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="where the test file goes")
    ap.add_argument("--size", type=int, default=4 << 30)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this bench runs on a GPU machine")
    path = os.path.join(a.dir, "gpu-bench.bin")
    make_file(path, a.size)
    r = {
        "large": large(path, a.reps),
        "small_cold": small(path, a.calls, a.reps, cold=True),
        "small_warm": small(path, a.calls, a.reps, cold=False),
    }
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    lg = r["large"]
    print(f"{lg['bytes'] >> 20} MiB into GPU memory, caches dropped ({lg['dropped_with']}), best of {a.reps}:")
    print(f"  p2pdma File.read           {lg['ours_gib_s']:6.2f} GiB/s")
    print(f"  read + tensor.copy_        {lg['read_copy_gib_s']:6.2f} GiB/s   "
          f"p2pdma/this {lg['ours_gib_s'] / lg['read_copy_gib_s']:.2f}x")
    if "kvikio_gib_s" in lg:
        print(f"  kvikio (compat)            {lg['kvikio_gib_s']:6.2f} GiB/s   "
              f"p2pdma/this {lg['ours_gib_s'] / lg['kvikio_gib_s']:.2f}x (goal >= 1)")
    else:
        print(f"  kvikio: {lg['kvikio_skipped']}")
    fio = lg["fio"]
    if "gib_s" in fio:
        print(f"  fio at its best ({fio['settings']}) {fio['gib_s']:.2f} GiB/s   "
              f"p2pdma/this {lg['ours_gib_s'] / fio['gib_s']:.2f}x")
    else:
        print(f"  fio: {fio['skipped']}")
    for key, how in (("small_cold", "pages dropped"), ("small_warm", "page cache warm")):
        sm = r[key]
        print(f"4 KiB random reads into GPU memory, {how}, {sm['calls']} calls, best of {a.reps}:")
        print(f"  p2pdma                     {sm['ours_us']:8.2f} us/call")
        if "kvikio_us" in sm:
            print(f"  kvikio (compat)            {sm['kvikio_us']:8.2f} us/call   "
                  f"p2pdma/this {sm['ours_us'] / sm['kvikio_us']:.2f}x (goal <= 0.5)")
        else:
            print(f"  kvikio: {sm['kvikio_skipped']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
