"""The object store from Python: objects written and read by id against a
model of their bytes, with and without a page cache, across reopening;
bad ids and ranges raise and move nothing."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

import p2pdma

PAGE = 64 << 10


@pytest.mark.parametrize("cached", [False, True])
def test_objects_match_a_model_across_reopening(tmp_path, cached):
    path = tmp_path / "store"
    cache = p2pdma.Memory.host(8 * PAGE) if cached else None
    store = p2pdma.Store.format(path, 32, size=16 << 20, cache=cache)
    rng = random.Random(5)
    model: dict[int, bytearray] = {}
    for size in (1, 4095, PAGE, 3 * PAGE + 17, 200_000):
        i = store.create(size)
        assert store.size(i) == size
        model[i] = bytearray(size)
    for _ in range(300):
        i = rng.choice(list(model))
        size = len(model[i])
        at = rng.randrange(size)
        n = rng.randrange(1, size - at + 1)
        if rng.random() < 0.5:
            data = os.urandom(n)
            assert store.write(i, data, at) == n
            model[i][at : at + n] = data
        else:
            buf = np.zeros(n + 3, dtype=np.uint8)
            assert store.read(i, buf, at, n, buf_offset=3) == n
            assert buf[3:].tobytes() == bytes(model[i][at : at + n])
    if cached:
        s = store.cache_stats()
        assert s["hits"] > 0 and s["misses"] > 0 and s["frames"] == 8
    else:
        assert store.cache_stats() is None
    store.flush()
    del store
    again = p2pdma.Store.open(path)
    assert sorted(again.objects()) == sorted((i, len(b)) for i, b in model.items())
    for i, b in model.items():
        out = bytearray(len(b))
        assert again.read(i, out) == len(b)
        assert out == b


def test_bad_ids_and_ranges_raise_and_move_nothing(tmp_path):
    store = p2pdma.Store.format(tmp_path / "store", 8, size=4 << 20, cache=p2pdma.Memory.host(4 * PAGE))
    i = store.create(10_000)
    store.write(i, b"\x07" * 10_000)
    buf = bytearray(b"\xee" * 20_000)
    with pytest.raises(p2pdma.Error) as e:
        store.read(i, buf, 5_000)
    assert isinstance(e.value, OSError) and "object" in str(e.value)
    assert buf == bytearray(b"\xee" * 20_000)
    with pytest.raises(p2pdma.Error):
        store.read(i + 1000, bytearray(10))
    with pytest.raises(p2pdma.Error):
        store.write(i, b"x" * 20, 9_990)
    out = bytearray(10_000)
    store.read(i, out)
    assert out == b"\x07" * 10_000
    store.delete(i)
    with pytest.raises(p2pdma.Error):
        store.size(i)
    with pytest.raises(p2pdma.Error):
        p2pdma.Store.format(tmp_path / "other", 8, size=4 << 20, cache=p2pdma.Memory.host(4096))


def test_the_kv_bench_runs_and_checks_its_loads(tmp_path, capsys):
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location("kv_bench", pathlib.Path(__file__).parents[1] / "bench" / "kv.py")
    kv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kv)
    assert kv.main(["--dir", str(tmp_path), "--chunks", "16", "--chunk", "128K", "--threads", "2", "--secs", "0.3"]) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if l.strip().startswith(("no cache", "cache in"))]
    assert len(rows) == 5, out
    # With every load asking for a hot chunk after warming, the cache
    # counted hits only.
    assert rows[-1].split()[5] == "100%", out


def test_a_cache_shared_by_several_memories(tmp_path):
    mems = [p2pdma.Memory.host(4 * PAGE), p2pdma.Memory.host(6 * PAGE)]
    store = p2pdma.Store.format(tmp_path / "store", 8, size=8 << 20, cache=mems)
    assert store.cache_stats()["frames"] == 10
    i = store.create(3 * PAGE)
    data = os.urandom(3 * PAGE)
    store.write(i, data)
    out = bytearray(3 * PAGE)
    store.read(i, out)
    assert out == data
    with pytest.raises(p2pdma.Error, match="cache"):
        p2pdma.Store.open(tmp_path / "store", cache=[mems[0], "not memory"])
    with pytest.raises(p2pdma.Error, match="cache"):
        p2pdma.Store.open(tmp_path / "store", cache=42)
