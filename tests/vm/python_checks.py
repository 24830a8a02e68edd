"""The Python binding in the guest: reads from the NVMe namespace into
accelerator memory on the P2P path, every kind of call, bytes checked here
against the namespace read with plain os.pread, and reported for the host,
which checks them again in the BAR's backing file.

Prints one "@@TEST name PASS|FAIL why" line per check; when every check
passed, "@@RESULT p2pmem-read ..." lines for the host and "@@HELD", then
sleeps so the memory stays allocated while the suite finishes.
"""

import argparse
import asyncio
import ctypes
import os
import re
import sys
import time

import p2pdma

failures = 0
results = []


def check(name, ok, why=""):
    global failures
    if ok:
        print(f"@@TEST python-{name} PASS", flush=True)
    else:
        failures += 1
        print(f"@@TEST python-{name} FAIL {why}", flush=True)


def phys_of(addr):
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // 4096 * 8)
        entry = int.from_bytes(f.read(8), "little")
    if not entry & (1 << 63):
        raise RuntimeError("page not present in pagemap")
    return (entry & ((1 << 55) - 1)) * 4096 + addr % 4096


def bar_of(pci, phys):
    """The BAR of ``pci`` that holds ``phys``, and the offset in it."""
    with open(f"/sys/bus/pci/devices/{pci}/resource") as f:
        for i, line in enumerate(f):
            start, end, _ = (int(x, 16) for x in line.split())
            if start <= phys <= end and end:
                return i, phys - start
    raise RuntimeError(f"{phys:#x} is in no BAR of {pci}")


def weights(fsdir):
    """Model weights into accelerator memory: a safetensors file written by
    the binding on the ext4, loaded with device="accel:0" by P2P, each
    array checked against the file parsed with plain Python."""
    import json
    import struct

    import numpy as np
    from p2pdma import safetensors

    rng = np.random.default_rng(5)
    arrays = {
        "embed": rng.standard_normal((512, 256)).astype(np.float32),
        "bias": rng.standard_normal(1000).astype(np.float16),
        "ids": rng.integers(-(2**40), 2**40, (64, 3), dtype=np.int64),
        "mask": rng.integers(0, 2, 777).astype(bool),
        "scalar": np.array(3.5, dtype=np.float64),
    }
    path = os.path.join(fsdir, "model.safetensors")
    safetensors.save_file(arrays, path, metadata={"format": "np"})
    # Cold: what the page cache holds of the file (the partial blocks the
    # save wrote through it) is dropped, so every byte comes by P2P.
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    before = {k: v["bytes"] for k, v in p2pdma.stats().items()}
    loaded = safetensors.load_file(path, device="accel:0", framework="np")
    after = {k: v["bytes"] for k, v in p2pdma.stats().items()}
    moved = after["p2p"] - before["p2p"]
    with p2pdma.File(path) as f:
        taken = f.path_for(p2pdma.Memory.accelerator(4096, index=0))
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    types = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "BOOL": np.bool_, "F64": np.float64}
    ok = set(loaded) == set(arrays)
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        want = np.frombuffer(data[b:e], dtype=types[h["dtype"]]).reshape(h["shape"])
        got = loaded.get(name)
        ok = ok and got is not None and got.dtype == want.dtype and got.shape == want.shape
        ok = ok and got.tobytes() == want.tobytes() == arrays[name].tobytes()
    check("safetensors-accel-bytes", ok, "an array differs from the file")
    total = sum(x.nbytes for x in arrays.values())
    check(
        "safetensors-accel-by-p2p",
        moved == total,
        f"the p2p path moved {moved} of {total} bytes; by path: "
        f"{ {k: after[k] - before[k] for k in after} }; path_for: {taken}",
    )
    # Warm: the file read through the page cache, every tensor byte is
    # copied from there into the accelerator's memory, and lands the same.
    with open(path, "rb") as f:
        f.read()
    before = {k: v["bytes"] for k, v in p2pdma.stats().items()}
    warm = safetensors.load_file(path, device="accel:0", framework="np")
    after = {k: v["bytes"] for k, v in p2pdma.stats().items()}
    cached = after["page-cache"] - before["page-cache"]
    same = set(warm) == set(arrays) and all(warm[k].tobytes() == arrays[k].tobytes() for k in arrays)
    check("safetensors-accel-warm-bytes", same, "a tensor read from the page cache differs")
    # Every byte the load reads, the header's too, from the page cache.
    size = os.path.getsize(path)
    check(
        "safetensors-accel-warm-from-page-cache",
        cached == size and after["p2p"] == before["p2p"],
        f"{cached} of the file's {size} bytes from the page cache; by path: "
        f"{ {k: after[k] - before[k] for k in after} }",
    )
    del loaded, warm
    os.unlink(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvme", required=True)
    ap.add_argument("--fsdir", required=True, help="a directory on a filesystem of the NVMe")
    a = ap.parse_args()

    mem = p2pdma.Memory.accelerator(8 << 20, index=0)
    m = re.search(r"\(([0-9a-f:.]+)\)", mem.kind)
    pci = m.group(1)
    check("memory-is-accelerator", mem.device == "accel:0" and mem.__dlpack_device__() == (12, 0), mem.kind)
    base = mem.view().__array_interface__["data"][0]
    ref = os.open(a.nvme, os.O_RDONLY)

    def expect(offset, n):
        return os.pread(ref, n, offset)

    def landed(name, mem_offset, nvme_offset, n):
        got = mem.to_bytes(mem_offset, n)
        check(name, got == expect(nvme_offset, n), f"{n} bytes at {mem_offset} differ from the namespace at {nvme_offset}")
        bar, bar_offset = bar_of(pci, phys_of(base + mem_offset))
        results.append(f"@@RESULT p2pmem-read pci={pci} bar={bar} nvme_offset={nvme_offset} bar_offset={bar_offset} len={n}")

    f = p2pdma.File(a.nvme)
    path, why = f.path_for(mem)
    check("auto-chooses-p2p", path == "p2p", f"{path}: {why}")
    before = p2pdma.stats()["p2p"]["bytes"]

    # A blocking read.
    off = 3 * 1048576 + 5 * 4096
    check("read", f.read(mem, 1048576, file_offset=off) == 1048576)
    landed("read-bytes", 0, off, 1048576)

    # A future.
    fut = f.pread(mem, 524288, file_offset=off + 2 * 1048576, buf_offset=1048576)
    check("pread-future", fut.wait(timeout=120) == 524288)
    landed("pread-bytes", 1048576, off + 2 * 1048576, 524288)

    # A batch into views of the memory.
    entries = [(mem.view(2 * 1048576 + i * 131072, 65536), 7 * 1048576 + i * 200704) for i in range(4)]
    check("pread-batch", f.pread_batch(entries).wait() == [65536] * 4)
    for i in range(4):
        landed(f"batch-bytes-{i}", 2 * 1048576 + i * 131072, 7 * 1048576 + i * 200704, 65536)

    # Awaited from asyncio.
    async def awaited():
        return await f.pread(mem.view(3 * 1048576, 262144), file_offset=9 * 1048576)

    check("await", asyncio.run(awaited()) == 262144)
    landed("await-bytes", 3 * 1048576, 9 * 1048576, 262144)

    moved = p2pdma.stats()["p2p"]["bytes"] - before
    check("p2p-counted", moved == 1048576 + 524288 + 4 * 65536 + 262144, f"the p2p path counted {moved} bytes")

    # The CPU mapping, through ctypes at the view's address: the same bytes.
    view = mem.view(0, 4096)
    cpu = bytes((ctypes.c_char * 4096).from_address(view.__array_interface__["data"][0]))
    check("cpu-view", cpu == expect(off, 4096), "the CPU mapping disagrees with the namespace")

    # A read past the end of the namespace: an error, never short.
    size = f.size()
    try:
        f.read(mem, 8192, file_offset=size - 4096)
        check("end-of-namespace", False, "a read past the end succeeded")
    except p2pdma.EndOfFileError as e:
        check("end-of-namespace", e.errno == 34 and e.filename == a.nvme, str(e))

    # Accelerator memory to a file of the filesystem and back.
    path = os.path.join(a.fsdir, "python-p2p.bin")
    with p2pdma.File(path, "w") as g:
        check("write-file", g.write(mem, 1048576) == 1048576)
        g.sync()
    with open(path, "rb") as h:
        check("write-file-bytes", h.read() == mem.to_bytes(0, 1048576), "the file differs from the memory")
    back = p2pdma.Memory.accelerator(1048576, index=0)
    with p2pdma.File(path) as g:
        check("read-file", g.read(back) == 1048576)
    check("read-file-bytes", back.to_bytes() == mem.to_bytes(0, 1048576), "the read-back differs")
    os.unlink(path)

    weights(a.fsdir)

    doctor = p2pdma.doctor(a.nvme)
    check("doctor", doctor["path"] == "p2p", f"{doctor['path']}: {doctor['reason']}")

    f.close()
    os.close(ref)
    if failures:
        return 1
    for r in results:
        print(r, flush=True)
    print("@@HELD", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
