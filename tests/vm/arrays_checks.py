"""Arrays and volumes through the bindings, in the guest: the Python
binding, the C API (libp2pdma.so) and the cuFile library (libcufile.so.0),
each loaded the way its users load it, read a target (a file on an md
array, an array's block device, or a library volume's ``volume:`` path)
and write a file on an array. Every result is checked against a reference
the library does not produce: the target read with plain ``os.pread``, or,
for a volume, its bytes cut from the member devices with ``dd`` before the
library took them.

Prints one "@@TEST arrays-NAME PASS|FAIL why" line per check and exits 1
when one failed. One API per process: a volume's controllers are this
process's while it runs.
"""

import argparse
import ctypes
import os
import sys

failures = 0
MIB = 1 << 20


def check(name, ok, why=""):
    global failures
    if ok:
        print(f"@@TEST arrays-{name} PASS", flush=True)
    else:
        failures += 1
        print(f"@@TEST arrays-{name} FAIL {why}", flush=True)


def ranges(at, size):
    """(offset, length) pairs in bytes ``at`` to ``size``: aligned, off
    every boundary, and the last bytes."""
    return [
        (at, MIB),
        (at + 3 * 4096 + 17, MIB + 333),
        (size - 65536 - 5, 65536 + 5),
    ]


def reference(a):
    fd = os.open(a.ref or a.target, os.O_RDONLY)
    try:
        size = a.ref_len or os.fstat(fd).st_size or os.lseek(fd, 0, os.SEEK_END)
        return fd, size
    except OSError:
        os.close(fd)
        raise


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def python_api(a, ref, size):
    import p2pdma

    mem = p2pdma.Memory.accelerator(4 * MIB, index=0)
    with p2pdma.File(a.target) as f:
        path, why = f.path_for(mem)
        check(f"{a.name}-python-path", path == a.path, f"{path}: {why}")
        for i, (off, n) in enumerate(ranges(a.at, size)):
            got = f.read(mem, n, file_offset=off, buf_offset=4096 + i)
            want = os.pread(ref, n, off)
            same = got == n and mem.to_bytes(4096 + i, n) == want
            check(f"{a.name}-python-read-{i}", same, f"{n} bytes at {off}: first difference at {first_diff(mem.to_bytes(4096 + i, n), want)}")
    if a.write:
        n = MIB + 4096 + 7
        with p2pdma.File(a.write, "w") as g:
            check(f"{a.name}-python-write", g.write(mem, n, file_offset=4096) == n)
            g.sync()
        with open(a.write, "rb") as h:
            back = h.read()
        want = bytes(4096) + mem.to_bytes(0, n)
        check(f"{a.name}-python-write-bytes", back == want, f"the file differs at {first_diff(back, want)}")
        os.unlink(a.write)


class Report(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint64), ("path", ctypes.c_int), ("retried", ctypes.c_int)]


def capi(a, ref, size):
    lib = ctypes.CDLL(a.capi)
    lib.p2pdma_last_error.restype = ctypes.c_char_p
    vp = ctypes.c_void_p

    def ok(rc, what):
        if rc < 0:
            raise RuntimeError(f"{what}: {rc} ({lib.p2pdma_last_error()})")
        return rc

    module, mem, engine, file = vp(), vp(), vp(), vp()
    ok(lib.p2pdma_module_open(ctypes.byref(module)), "p2pdma_module_open")
    index = ctypes.c_uint32()
    ok(lib.p2pdma_module_accelerator_index(module, ctypes.c_size_t(0), ctypes.byref(index)), "p2pdma_module_accelerator_index")
    ok(lib.p2pdma_mem_module_alloc(module, index, ctypes.c_uint64(4 * MIB), ctypes.c_uint64(0), ctypes.byref(mem)), "p2pdma_mem_module_alloc")
    ok(lib.p2pdma_engine_new(b"auto", ctypes.c_size_t(0), ctypes.c_size_t(0), module, ctypes.byref(engine)), "p2pdma_engine_new")
    ok(lib.p2pdma_file_open(a.target.encode(), 0, ctypes.byref(file)), f"p2pdma_file_open({a.target})")
    why = ctypes.create_string_buffer(512)
    path = lib.p2pdma_path_choice(engine, file, mem, why, ctypes.c_size_t(len(why)))
    want_path = {"p2p": 1, "bounce": 2, "nvme-cmd": 3, "queues": 4}[a.path]
    check(f"{a.name}-capi-path", path == want_path, f"{path}: {why.value.decode(errors='replace')}")
    buf = ctypes.create_string_buffer(2 * MIB)
    for i, (off, n) in enumerate(ranges(a.at, size)):
        rep = Report()
        rc = lib.p2pdma_read(engine, file, ctypes.c_uint64(off), mem, ctypes.c_size_t(8192 + i), ctypes.c_size_t(n), ctypes.byref(rep))
        ok(rc, f"p2pdma_read of {n} bytes at {off}")
        ok(lib.p2pdma_mem_read(mem, ctypes.c_size_t(8192 + i), buf, ctypes.c_size_t(n)), "p2pdma_mem_read")
        want = os.pread(ref, n, off)
        check(f"{a.name}-capi-read-{i}", rep.bytes == n and rep.path == want_path and not rep.retried and buf.raw[:n] == want,
              f"{rep.bytes} bytes on path {rep.path} (retried {rep.retried}); first difference at {first_diff(buf.raw[:n], want)}")
    lib.p2pdma_file_close(file)
    if a.write:
        n = MIB + 9
        open(a.write, "wb").close()
        wfile = vp()
        ok(lib.p2pdma_file_open(a.write.encode(), 1, ctypes.byref(wfile)), f"p2pdma_file_open({a.write}, writable)")
        rep = Report()
        ok(lib.p2pdma_write(engine, wfile, ctypes.c_uint64(5), mem, ctypes.c_size_t(8192), ctypes.c_size_t(n), ctypes.byref(rep)), "p2pdma_write")
        lib.p2pdma_file_close(wfile)
        ok(lib.p2pdma_mem_read(mem, ctypes.c_size_t(8192), buf, ctypes.c_size_t(n)), "p2pdma_mem_read")
        with open(a.write, "rb") as h:
            back = h.read()
        want = bytes(5) + buf.raw[:n]
        check(f"{a.name}-capi-write-bytes", rep.bytes == n and back == want, f"the file differs at {first_diff(back, want)}")
        os.unlink(a.write)
    lib.p2pdma_engine_free(engine)
    lib.p2pdma_mem_free(mem)
    lib.p2pdma_module_close(module)


class CUfileError(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


class CUfileDescr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("fd", ctypes.c_void_p), ("fs_ops", ctypes.c_void_p)]


def cufile(a, ref, size):
    lib = ctypes.CDLL(a.cufile)
    for f in ("cuFileDriverOpen", "cuFileHandleRegister", "cuFileDriverClose"):
        getattr(lib, f).restype = CUfileError
    lib.cuFileRead.restype = ctypes.c_ssize_t
    lib.cuFileWrite.restype = ctypes.c_ssize_t
    args = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64]
    lib.cuFileRead.argtypes = args
    lib.cuFileWrite.argtypes = args

    def register(fd):
        fh = ctypes.c_void_p()
        d = CUfileDescr(type=1, fd=fd)
        e = lib.cuFileHandleRegister(ctypes.byref(fh), ctypes.byref(d))
        if e.err != 0:
            raise RuntimeError(f"cuFileHandleRegister: {e.err}")
        return fh

    e = lib.cuFileDriverOpen()
    check(f"{a.name}-cufile-open", e.err == 0, f"cuFileDriverOpen: {e.err}")
    fd = os.open(a.target, os.O_RDONLY | os.O_DIRECT)
    fh = register(fd)
    buf = ctypes.create_string_buffer(2 * MIB)
    for i, (off, n) in enumerate(ranges(a.at, size)):
        got = lib.cuFileRead(fh, buf, n, off, 64 + i)
        want = os.pread(ref, n, off)
        check(f"{a.name}-cufile-read-{i}", got == n and buf.raw[64 + i:64 + i + n] == want,
              f"{got} of {n} bytes at {off}; first difference at {first_diff(buf.raw[64 + i:64 + i + n], want)}")
    lib.cuFileHandleDeregister(fh)
    os.close(fd)
    if a.write:
        n = MIB + 4096
        wfd = os.open(a.write, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        wh = register(wfd)
        got = lib.cuFileWrite(wh, buf, n, 4096, 64)
        lib.cuFileHandleDeregister(wh)
        os.close(wfd)
        with open(a.write, "rb") as h:
            back = h.read()
        want = bytes(4096) + buf.raw[64:64 + n]
        check(f"{a.name}-cufile-write-bytes", got == n and back == want, f"{got} of {n} bytes; the file differs at {first_diff(back, want)}")
        os.unlink(a.write)
    lib.cuFileDriverClose()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", required=True, choices=["python", "capi", "cufile"])
    ap.add_argument("--name", required=True, help="the checks' prefix")
    ap.add_argument("--target", required=True, help="a file, a block device or a volume: path")
    ap.add_argument("--path", default="p2p", help="the path AUTO must choose into accelerator memory")
    ap.add_argument("--at", type=int, default=0, help="where the reads start")
    ap.add_argument("--ref", help="the target's bytes from offset 0 (default: the target)")
    ap.add_argument("--ref-len", type=int, help="how many bytes of the reference to read from")
    ap.add_argument("--write", help="a new file on an array to write and read back")
    ap.add_argument("--capi", default="/usr/lib/p2pdma/libp2pdma.so")
    ap.add_argument("--cufile", default="/usr/lib/p2pdma/libcufile.so.0")
    a = ap.parse_args()
    ref, size = reference(a)
    try:
        {"python": python_api, "capi": capi, "cufile": cufile}[a.api](a, ref, size)
    except Exception as e:  # noqa: BLE001 - every failure is a check's
        check(f"{a.name}-{a.api}", False, f"{type(e).__name__}: {e}")
    os.close(ref)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
