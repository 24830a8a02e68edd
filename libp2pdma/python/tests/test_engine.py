"""Engines, their settings and counters, routes, and the doctor."""

import errno
import os

import numpy as np
import pytest

import p2pdma


def test_the_default_engine_is_one_and_counts(data_file):
    path, data = data_file
    e = p2pdma.default_engine()
    assert e is p2pdma.default_engine()
    moved = lambda s: s["direct"]["bytes"] + s["bounce"]["bytes"] + s["page-cache"]["bytes"]  # noqa: E731
    before = p2pdma.stats()
    with p2pdma.File(path) as f:
        f.read(bytearray(100000), file_offset=7)
    after = p2pdma.stats()
    # The file was just written: the page cache serves what it holds.
    assert moved(after) - moved(before) == 100000
    assert set(p2pdma.stats()) == {"p2p", "nvme-cmd", "bounce", "queues", "direct", "page-cache"}


def test_reads_take_cached_data_from_the_page_cache_unless_told(data_file):
    path, data = data_file
    with open(path, "rb") as warm:
        warm.read()
    for setting, cached in (("auto", True), ("direct", False), ("buffered", True)):
        e = p2pdma.Engine(page_cache=setting)
        assert e.page_cache == setting
        buf = np.zeros(1 << 20, dtype=np.uint8)
        with p2pdma.File(path, engine=e) as f:
            f.read(buf, file_offset=11)
        assert buf.tobytes() == data[11 : 11 + (1 << 20)]
        s = e.stats()
        assert s["page-cache"]["bytes"] == ((1 << 20) if cached else 0), setting
        # From the device: directly into the array where its address
        # aligns with the file offset, else through the bounce pipeline.
        device = s["direct"]["bytes"] + s["bounce"]["bytes"]
        assert device == (0 if cached else (1 << 20)), setting
    with pytest.raises(p2pdma.InvalidArgumentError, match="page-cache use"):
        p2pdma.Engine(page_cache="sometimes")


def test_an_engine_of_its_own_with_settings(data_file):
    path, data = data_file
    e = p2pdma.Engine(path="bounce", page_cache="direct", chunk=65536, depth=4)
    assert e.path == "bounce"
    with p2pdma.File(path, engine=e) as f:
        buf = np.zeros(1 << 20, dtype=np.uint8)
        f.read(buf, file_offset=3)
    assert buf.tobytes() == data[3 : 3 + (1 << 20)]
    s = e.stats()["bounce"]
    assert s["bytes"] == 1 << 20
    assert s["ios"] >= 16  # 64 KiB chunks
    assert e.stats()["p2p"]["bytes"] == 0


def test_bad_settings_are_refused():
    with pytest.raises(p2pdma.InvalidArgumentError, match="unknown setting"):
        p2pdma.Engine(colour="blue")
    with pytest.raises(p2pdma.InvalidArgumentError, match="unknown path"):
        p2pdma.Engine(path="teleport")
    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.Engine(chunk=1)


def test_a_path_that_cannot_serve_says_why(data_file):
    path, data = data_file
    e = p2pdma.Engine(path="queues")
    with p2pdma.File(path, engine=e) as f:
        with pytest.raises(p2pdma.PathUnavailableError) as exc:
            f.read(bytearray(4096))
        assert exc.value.errno == errno.EOPNOTSUPP
        assert "queues" in str(exc.value)
    e = p2pdma.Engine(path="nvme-cmd")
    with p2pdma.File(path, engine=e) as f:
        with pytest.raises(p2pdma.PathUnavailableError, match="NVMe"):
            f.read(bytearray(4096))


def test_missing_and_forbidden_paths_carry_their_errno(tmp_path):
    with pytest.raises(p2pdma.Error) as e:
        p2pdma.File(tmp_path / "missing.bin")
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(tmp_path / "missing.bin")
    assert isinstance(e.value, OSError)
    with pytest.raises(p2pdma.Error) as e:
        p2pdma.File(tmp_path)
    assert e.value.errno in (errno.EISDIR, errno.EINVAL)
    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.File(tmp_path / "x", flags="rw")


def test_routes_and_copies(data_file, tmp_path):
    path, data = data_file
    m = p2pdma.Memory.host(1 << 20)
    with p2pdma.File(path) as f:
        r = p2pdma.route(f, m)
        assert r["hops"] and r["reason"]
        rep = p2pdma.copy(f, m, 1 << 20, src_offset=100)
        assert rep["bytes"] == 1 << 20
    assert m.to_bytes() == data[100 : 100 + (1 << 20)]
    m2 = p2pdma.Memory.host(1 << 20)
    p2pdma.copy(m, m2, 4096, src_offset=10, dst_offset=20)
    assert m2.to_bytes(20, 4096) == data[110 : 110 + 4096]
    out = tmp_path / "copy.bin"
    out.write_bytes(b"")
    with p2pdma.File(out, "r+") as g:
        p2pdma.copy(m, g, 8192)
    assert out.read_bytes() == data[100 : 100 + 8192]


def test_the_doctor_reports_as_a_dict(data_file):
    path, _ = data_file
    r = p2pdma.doctor(str(path))
    assert isinstance(r, dict)
    assert r["checks"] and all({"name", "status", "detail"} <= set(c) for c in r["checks"])
    assert r["path"] in ("p2p", "nvme-cmd", "bounce", "queues", "direct")
    assert r["reason"]
    with pytest.raises(p2pdma.InvalidArgumentError):
        p2pdma.doctor(accel="not-a-pci-address")


def test_none_leaves_a_setting_as_it_is(monkeypatch):
    monkeypatch.setenv("P2PDMA_PATH", "bounce")
    e = p2pdma.Engine(path=None, cache_dir=None, chunk=None)
    assert e.path == "bounce"
    assert p2pdma.Engine(path="auto").path == "auto"


def test_routes_and_copies_with_an_engine_of_their_own(data_file):
    path, data = data_file
    e = p2pdma.Engine(path="bounce")
    m = p2pdma.Memory.host(1 << 16)
    with p2pdma.File(path) as f:
        assert p2pdma.route(f, m, engine=e)["reason"]
        assert p2pdma.copy(f, m, 1 << 16, src_offset=5, engine=e)["bytes"] == 1 << 16
    assert m.to_bytes() == data[5 : 5 + (1 << 16)]
