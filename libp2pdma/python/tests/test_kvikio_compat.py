"""p2pdma.CuFile as a program written for KvikIO sees it.

Each test is such a program: it calls KvikIO's documented API (positional
and keyword), with only the import changed, and checks the bytes against the
file read with os.pread, or the file against what numpy wrote. What KvikIO
defines is taken from its source, release 26.10: python/kvikio/kvikio/
cufile.py (the CuFile class) and cpp/src/file_utils.cpp
(open_fd_parse_flags: how flags become open(2) flags).
"""

import errno
import fcntl
import inspect
import os
import pickle
import shutil
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import p2pdma
import p2pdma.errors
from p2pdma import CuFile

P = inspect.Parameter
E = P.empty

# KvikIO 26.10, python/kvikio/kvikio/cufile.py, class CuFile: every public
# method's parameters after self, as (name, default); E: no default.
KVIKIO_CUFILE = {
    "__init__": [("file", E), ("flags", "r")],
    "close": [],
    "fileno": [],
    "open_flags": [],
    "__enter__": [],
    "__exit__": [("exc_type", E), ("exc_val", E), ("exc_tb", E)],
    "pread": [("buf", E), ("size", None), ("file_offset", 0), ("task_size", None)],
    "pwrite": [("buf", E), ("size", None), ("file_offset", 0), ("task_size", None)],
    "read": [("buf", E), ("size", None), ("file_offset", 0), ("task_size", None)],
    "write": [("buf", E), ("size", None), ("file_offset", 0), ("task_size", None)],
    "raw_read_async": [("buf", E), ("raw_stream", E), ("size", None), ("file_offset", 0), ("dev_offset", 0)],
    "raw_write_async": [("buf", E), ("raw_stream", E), ("size", None), ("file_offset", 0), ("dev_offset", 0)],
    "raw_read": [("buf", E), ("size", None), ("file_offset", 0), ("dev_offset", 0)],
    "raw_write": [("buf", E), ("size", None), ("file_offset", 0), ("dev_offset", 0)],
    "is_direct_io_supported": [],
}


def signature_of(name):
    if name == "__init__":
        return list(inspect.signature(CuFile).parameters.values())
    params = list(inspect.signature(getattr(CuFile, name)).parameters.values())
    assert params and params[0].name == "self", f"{name}: {params}"
    return params[1:]


@pytest.mark.parametrize("name", sorted(KVIKIO_CUFILE))
def test_every_method_has_kvikios_parameters_first_and_ours_keyword_only(name):
    params = signature_of(name)
    want = KVIKIO_CUFILE[name]
    got = [(p.name, p.default) for p in params[: len(want)]]
    assert got == want, f"CuFile.{name}: {params} does not begin with KvikIO's {want}"
    for p in params[: len(want)]:
        assert p.kind == P.POSITIONAL_OR_KEYWORD, f"CuFile.{name}: {p} must be positional or keyword"
    for p in params[len(want) :]:
        assert p.kind == P.KEYWORD_ONLY, f"CuFile.{name}: {p} is ours, so keyword-only"


def test_closed_is_a_property():
    assert isinstance(inspect.getattr_static(CuFile, "closed"), property) or not callable(
        inspect.getattr_static(CuFile, "closed")
    )


@pytest.fixture
def file64k(tmp_path):
    data = os.urandom(1 << 16)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data


# --- reads and writes, positional and keyword --------------------------------


def test_the_fourth_positional_argument_is_task_size(file64k):
    path, data = file64k
    with CuFile(path, "r") as f:
        a = np.zeros(8192, dtype=np.uint8)
        assert f.read(a, 4096, 0, 4096) == 4096
        assert a[:4096].tobytes() == data[:4096]
        assert not a[4096:].any()
        b = np.zeros(8192, dtype=np.uint8)
        assert f.pread(b, 4096, 100, 512).get() == 4096
        assert b[:4096].tobytes() == data[100:4196]
        assert not b[4096:].any()


def test_keywords_as_kvikio_names_them(file64k):
    path, data = file64k
    with CuFile(file=path, flags="r") as f:
        a = np.zeros(1000, dtype=np.uint8)
        assert f.read(buf=a, size=300, file_offset=7, task_size=64) == 300
        assert a[:300].tobytes() == data[7:307]
        assert not a[300:].any()
        a[:] = 0
        assert f.pread(buf=a, size=None, file_offset=11, task_size=None).get() == 1000
        assert a.tobytes() == data[11:1011]
        a[:] = 0
        assert f.read(a) == 1000
        assert a.tobytes() == data[:1000]


def test_writes_take_the_start_of_the_buffer(tmp_path):
    path = tmp_path / "out.bin"
    b = np.frombuffer(os.urandom(8192), dtype=np.uint8)
    with CuFile(path, "w") as f:
        assert f.write(b, 4096, 0, 4096) == 4096
        assert f.pwrite(b, 1000, 4096, 100).get() == 1000
        assert f.write(buf=b, size=10, file_offset=5096, task_size=1) == 10
    assert path.read_bytes() == b[:4096].tobytes() + b[:1000].tobytes() + b[:10].tobytes()


def test_raw_read_and_raw_write_use_dev_offset(file64k, tmp_path):
    path, data = file64k
    with CuFile(path, "r") as f:
        a = np.zeros(1000, dtype=np.uint8)
        assert f.raw_read(a, 100, 5, 200) == 100
        assert not a[:200].any() and not a[300:].any()
        assert a[200:300].tobytes() == data[5:105]
        a[:] = 0
        assert f.raw_read(buf=a, size=50, file_offset=9, dev_offset=950) == 50
        assert a[950:].tobytes() == data[9:59]
    out = tmp_path / "raw.bin"
    src = np.frombuffer(os.urandom(1000), dtype=np.uint8)
    with CuFile(out, "w") as g:
        assert g.raw_write(src, 100, 0, 900) == 100
        assert g.raw_write(buf=src, size=20, file_offset=100, dev_offset=3) == 20
    assert out.read_bytes() == src[900:].tobytes() + src[3:23].tobytes()


def test_a_negative_task_size_is_refused_as_kvikio_refuses_it(file64k):
    # KvikIO converts task_size to size_t: a negative one raises OverflowError.
    path, _ = file64k
    with CuFile(path) as f:
        with pytest.raises(OverflowError):
            f.read(bytearray(10), 10, 0, -1)


def test_size_past_the_buffer_is_a_value_error_as_in_kvikio(file64k):
    path, _ = file64k
    with CuFile(path) as f:
        with pytest.raises(ValueError):
            f.read(bytearray(10), 11)


def test_the_async_raw_calls_take_device_memory_only_as_in_kvikio(file64k):
    # KvikIO: "does not support host memory" (ValueError). With CUDA memory
    # they are checked against the emulated driver (cuda_emu_checks.py).
    path, _ = file64k
    with CuFile(path) as f:
        with pytest.raises(ValueError):
            f.raw_read_async(bytearray(10), 0)
        with pytest.raises(ValueError):
            f.raw_write_async(bytearray(10), 0, 10, 0, 0)


# --- the descriptor, the flags and the open modes ----------------------------


def test_fileno_is_an_ordinary_descriptor(file64k):
    path, data = file64k
    with CuFile(path) as f:
        fd = f.fileno()
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT == 0
        assert os.pread(fd, 100, 3) == data[3:103]
        assert os.fstat(fd).st_size == len(data)
        assert f.open_flags() == fcntl.fcntl(fd, fcntl.F_GETFL)
        assert f.is_direct_io_supported() is True


def fdinfo_flags(fd):
    """The flags /proc/self/fdinfo shows for fd (octal, as the kernel has
    them)."""
    with open(f"/proc/self/fdinfo/{fd}") as info:
        for line in info:
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    raise AssertionError("no flags in fdinfo")


# flags -> (access mode, creates, truncates), per open_fd_parse_flags.
MODES = {
    "r": (os.O_RDONLY, False, False),
    "r+": (os.O_RDWR, False, False),
    "w": (os.O_WRONLY, True, True),
    "w+": (os.O_RDWR, True, True),
    "rb": (os.O_RDONLY, False, False),
    "r+b": (os.O_RDWR, False, False),
    "wb": (os.O_WRONLY, True, True),
    "w+b": (os.O_RDWR, True, True),
}


@pytest.mark.parametrize("flags", sorted(MODES))
def test_open_modes_mean_what_they_mean_in_kvikio(tmp_path, flags):
    access, creates, truncates = MODES[flags]
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 5000)
    with CuFile(path, flags) as f:
        fd = f.fileno()
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == access
        assert fdinfo_flags(fd) & os.O_ACCMODE == access
        assert fdinfo_flags(fd) & os.O_DIRECT == 0
        assert f.open_flags() & os.O_ACCMODE == access
        assert fdinfo_flags(fd) & os.O_CLOEXEC
    assert path.stat().st_size == (0 if truncates else 5000)
    missing = tmp_path / "missing.bin"
    if creates:
        old = os.umask(0o022)
        try:
            CuFile(missing, flags).close()
        finally:
            os.umask(old)
        assert stat.S_IMODE(missing.stat().st_mode) == 0o644
    else:
        with pytest.raises(FileNotFoundError):
            CuFile(missing, flags)


@pytest.mark.parametrize("flags", ["a", "a+", "", "x", "+r", "rw", "rb+", "wr"])
def test_flags_kvikio_refuses_are_refused(tmp_path, flags):
    path = tmp_path / "f.bin"
    path.write_bytes(b"keep")
    with pytest.raises(ValueError):
        CuFile(path, flags)
    assert path.read_bytes() == b"keep"


def test_a_file_opened_w_takes_writes_and_refuses_reads(tmp_path):
    path = tmp_path / "w.bin"
    with CuFile(path, "w") as f:
        src = np.frombuffer(os.urandom(10000), dtype=np.uint8)
        assert f.write(src, 10000, 0) == 10000
        with pytest.raises(OSError) as e:
            f.read(bytearray(100), 100, 0)
        assert e.value.errno == errno.EBADF
    assert path.read_bytes() == src.tobytes()


def checked(code):
    """Runs `code` in a Python process whose permissions are checked: tests
    may run as root, whose capabilities bypass file modes, so a root test
    runs it without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (setpriv)."""
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file modes do not bite")
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_write_only_file_opens_w_for_someone_who_may_only_write(tmp_path):
    path = tmp_path / "w-only.bin"
    path.write_bytes(b"old contents")
    path.chmod(0o200)
    data = os.urandom(5000)
    checked(
        f"""
        import os, p2pdma
        try:
            open({str(path)!r}, "rb")
        except PermissionError:
            pass
        else:
            raise AssertionError("the file can be read: the check means nothing")
        with p2pdma.CuFile({str(path)!r}, "w") as f:
            assert f.write({data!r}) == {len(data)}
        try:
            p2pdma.CuFile({str(path)!r}, "r")
        except PermissionError as e:
            assert e.errno == 13 and isinstance(e, RuntimeError), e
        else:
            raise AssertionError("opened a write-only file for reading")
        """
    )
    path.chmod(0o600)
    assert path.read_bytes() == data


# --- errors -------------------------------------------------------------------


def test_a_missing_file_is_file_not_found_and_what_kvikio_raises(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError) as e:
        CuFile(missing)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    assert isinstance(e.value, p2pdma.Error)
    assert isinstance(e.value, p2pdma.errors.Error)
    # KvikIO raises RuntimeError (its C++ exceptions, through Cython).
    assert isinstance(e.value, RuntimeError)
    try:
        CuFile(missing)
    except RuntimeError:
        pass


def test_errors_with_built_in_classes(tmp_path):
    with pytest.raises(IsADirectoryError):
        CuFile(tmp_path, "r")
    with pytest.raises(IsADirectoryError):
        CuFile(tmp_path, "w")
    f = tmp_path / "plain"
    f.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        CuFile(f / "below")


def test_permission_denied_is_permission_error(tmp_path):
    path = tmp_path / "secret.bin"
    path.write_bytes(b"secret")
    path.chmod(0)
    checked(
        f"""
        import p2pdma
        for flags in ("r", "r+", "w"):
            try:
                p2pdma.CuFile({str(path)!r}, flags)
            except PermissionError as e:
                assert e.errno == 13 and isinstance(e, p2pdma.Error) and isinstance(e, RuntimeError), e
                assert e.filename == {str(path)!r}, e.filename
            else:
                raise AssertionError(flags + " opened a file nobody may touch")
        """
    )
    path.chmod(0o600)
    assert path.read_bytes() == b"secret"


CLASSES = [c for c in (getattr(p2pdma.errors, n) for n in p2pdma.errors.__all__) if issubclass(c, p2pdma.Error)]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_takes_the_built_in_class_of_its_errno(cls):
    for number in sorted(errno.errorcode):
        e = cls(number, os.strerror(number), "some/file")
        builtin = type(OSError(number, "x"))
        assert isinstance(e, builtin), (cls, errno.errorcode[number], type(e).__mro__)
        assert isinstance(e, cls) and isinstance(e, p2pdma.Error) and isinstance(e, RuntimeError)
        assert type(e).__name__ == cls.__name__
        assert (e.errno, e.strerror, e.filename) == (number, os.strerror(number), "some/file")
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and back.args == e.args and back.filename == e.filename
    assert isinstance(p2pdma.errors.InvalidArgumentError(errno.EINVAL, "x"), ValueError)


def test_a_read_past_the_end_raises_what_kvikio_raises(file64k):
    # KvikIO: "POSIX error on pread: EOF", a RuntimeError.
    path, data = file64k
    with CuFile(path) as f:
        buf = bytearray(100)
        with pytest.raises(RuntimeError):
            f.read(buf, 100, len(data) - 50)
        with pytest.raises(RuntimeError):
            f.pread(buf, 100, len(data) + 1).get()
        with pytest.raises(p2pdma.EndOfFileError):
            f.read(buf, 100, len(data) - 50)


def test_a_closed_file_raises_what_python_and_kvikio_raise(file64k):
    path, _ = file64k
    f = CuFile(path)
    f.close()
    assert f.closed
    for call in (lambda: f.read(bytearray(1)), lambda: f.pwrite(b"x"), f.fileno, f.open_flags, lambda: f.raw_read(bytearray(1))):
        with pytest.raises(ValueError, match="closed file"):
            call()
        with pytest.raises(RuntimeError):
            call()
