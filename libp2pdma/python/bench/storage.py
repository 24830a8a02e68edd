"""What the benches share about the storage under them: dropping a file's
cached pages before a run, and fio at its best on the same file (the
storage's limit beside the figures measured). Standard library only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess


def drop_caches(path: str) -> str:
    """Drops the file's pages from the page cache: every cache where
    permitted (root), else the file's own (``POSIX_FADV_DONTNEED``)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise"


def fio_best(path: str) -> dict:
    """fio's best sequential direct read of the file over a few settings
    (block size, queue depth, jobs), caches dropped before each."""
    if not shutil.which("fio"):
        return {"skipped": "fio is not installed"}
    results = []
    for bs, depth, jobs in (("1M", 32, 1), ("4M", 64, 1), ("16M", 16, 1), ("1M", 16, 4), ("8M", 32, 2)):
        drop_caches(path)
        out = subprocess.run(
            ["fio", "--name=seq", f"--filename={path}", "--rw=read", f"--bs={bs}", "--direct=1",
             "--ioengine=io_uring", f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
             "--output-format=json"],
            capture_output=True, text=True, check=True,
        )
        job = json.loads(out.stdout)["jobs"][0]["read"]
        results.append((job["bw_bytes"] / (1 << 30), f"{bs} direct io_uring depth {depth} x{jobs} jobs"))
    gib_s, settings = max(results)
    return {"gib_s": gib_s, "settings": settings}
