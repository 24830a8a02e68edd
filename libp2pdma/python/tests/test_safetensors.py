"""p2pdma.safetensors against the safetensors package: loads bit-identical
to safetensors' own, saves byte-identical files, refuses malformed files
with SafetensorError, reads in one batch, and reports progress in bytes."""

from __future__ import annotations

import errno
import json
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
st_numpy = pytest.importorskip("safetensors.numpy")

import p2pdma  # noqa: E402
from p2pdma import safetensors as ps  # noqa: E402

TORCH_DTYPES = ps.torch_dtypes()
NUMPY_DTYPES = ps.numpy_dtypes()
# The shapes every dtype is tried with: 0-dim, empty, odd sizes, several dims.
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 3), (1, 1, 13), (4, 3, 2)]


def _shapes_for(code: str) -> list[tuple[int, ...]]:
    # torch's float4_e2m1fn_x2 has no 0-dim F4 form (half a byte).
    return [s for s in SHAPES if not (code == "F4" and s == ())]


def _random(dtype, shape, gen) -> "torch.Tensor":
    """Random bits as `dtype` (NaNs, infinities and all)."""
    numel = 1
    for d in shape:
        numel *= d
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (numel * size,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        raw = raw & 1  # safetensors only round-trips 0 and 1 as bool
    return raw.view(dtype).reshape(shape)


def _bits(t) -> "torch.Tensor":
    return t.contiguous().reshape(-1).view(torch.uint8)


def _assert_same_torch(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert isinstance(g, torch.Tensor), k
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        assert torch.equal(_bits(g), _bits(w)), k


def _assert_same_numpy(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert isinstance(g, np.ndarray), k
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        assert g.tobytes() == w.tobytes(), k


def _craft(header, data: bytes = b"", *, length: int | None = None, raw: bytes | None = None) -> bytes:
    """A safetensors file by hand: `header` as JSON (or `raw` header
    bytes), padded like safetensors pads it, with `length` in place of the
    true header length when given."""
    h = raw if raw is not None else json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + data


@pytest.fixture
def gen():
    g = torch.Generator()
    g.manual_seed(1234)
    return g


# --------------------------------------------------------------------------
# The dtype table


def test_dtype_table_covers_safetensors():
    # Every dtype safetensors.torch can save with this torch is in the map.
    for code in ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64",
                 "F16", "BF16", "F32", "F64", "C64", "F8_E5M2", "F8_E4M3"]:
        assert code in TORCH_DTYPES, code
    for dt in TORCH_DTYPES.values():
        t = torch.zeros(8, dtype=torch.uint8).view(dt)
        b = st_torch.save({"t": t})
        hdr = json.loads(b[8 : 8 + struct.unpack("<Q", b[:8])[0]])
        assert TORCH_DTYPES[hdr["t"]["dtype"]] == dt
    assert TORCH_DTYPES["F8_E4M3"] == torch.float8_e4m3fn
    if hasattr(torch, "float8_e8m0fnu"):
        assert TORCH_DTYPES["F8_E8M0"] == torch.float8_e8m0fnu


# --------------------------------------------------------------------------
# Loading against safetensors


@pytest.mark.parametrize("device", ["cpu", "host"])
@pytest.mark.parametrize("code", sorted(TORCH_DTYPES))
def test_load_every_dtype(tmp_path, gen, code, device):
    dtype = TORCH_DTYPES[code]
    tensors = {f"t{i}": _random(dtype, s, gen) for i, s in enumerate(_shapes_for(code))}
    path = tmp_path / "m.safetensors"
    st_torch.save_file(tensors, path)
    got = ps.load_file(path, device)
    want = st_torch.load_file(path)
    _assert_same_torch(got, want)
    _assert_same_torch(got, tensors)


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_load_mixed_file(tmp_path, gen, device):
    tensors = {}
    for code, dtype in TORCH_DTYPES.items():
        for i, s in enumerate(_shapes_for(code)):
            tensors[f"{code}.{i}"] = _random(dtype, s, gen)
    tensors["big"] = _random(torch.float32, ((3 << 18) + 5,), gen)  # 3 MiB + 20 bytes
    path = tmp_path / "mixed.safetensors"
    st_torch.save_file(tensors, path, metadata={"format": "pt"})
    got = ps.load_file(path, device)
    _assert_same_torch(got, st_torch.load_file(path))
    # Nonempty tensors come back in the order of the data section.
    nonempty = [k for k, v in st_torch.load_file(path).items() if v.numel()]
    assert [k for k, v in got.items() if v.numel()] == nonempty


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_load_splits_big_tensors(tmp_path, gen, device, monkeypatch):
    # With 4 KiB pieces every tensor above it is split; any piece that lands
    # one byte off shows up as a mismatch.
    monkeypatch.setattr(ps, "CHUNK", 4096)
    tensors = {
        "a": _random(torch.float16, (3, 4097), gen),
        "b": _random(torch.uint8, (12289,), gen),
        "c": _random(torch.float64, (512,), gen),  # exactly one piece
        "d": _random(torch.int32, (), gen),
    }
    path = tmp_path / "split.safetensors"
    st_torch.save_file(tensors, path)
    _assert_same_torch(ps.load_file(path, device), tensors)


def test_load_64mib(tmp_path, gen):
    # Over the real 64 MiB piece size, so the batch splits it.
    assert ps.CHUNK == 64 << 20
    n = (64 << 20) + 12345
    tensors = {
        "huge": torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen),
        "tail": _random(torch.bfloat16, (5, 3), gen),
    }
    path = tmp_path / "huge.safetensors"
    st_torch.save_file(tensors, path)
    del tensors
    want = st_torch.load_file(path)
    for device in ["cpu", "host"]:
        got = ps.load_file(path, device)
        _assert_same_torch(got, want)
        del got


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_load_numpy(tmp_path, gen, device):
    tensors = {}
    for code in NUMPY_DTYPES:
        for i, s in enumerate(SHAPES):
            tensors[f"{code}.{i}"] = _random(TORCH_DTYPES[code], s, gen).numpy()
    path = tmp_path / "np.safetensors"
    st_numpy.save_file(tensors, path)
    got = ps.load_file(path, device, framework="np")
    _assert_same_numpy(got, st_numpy.load_file(path))


@pytest.mark.parametrize("code", sorted(set(TORCH_DTYPES) - set(NUMPY_DTYPES)))
def test_load_numpy_refuses_dtypes_it_lacks(tmp_path, gen, code):
    path = tmp_path / "x.safetensors"
    shape = (4,)
    st_torch.save_file({"ok": torch.zeros(3), "x": _random(TORCH_DTYPES[code], shape, gen)}, path)
    with pytest.raises(p2pdma.InvalidArgumentError, match=code):
        ps.load_file(path, framework="np")


def test_host_tensors_mirror_the_files_layout_in_one_memory(tmp_path, gen):
    """One allocation holds an image of the data section: each tensor sits
    at its file offset's place modulo 4 KiB (so the storage can DMA the
    block-aligned stretches straight into it), back to back as in the file."""
    import json
    import struct

    tensors = {f"t{i}": _random(torch.float32, (i * 3 + 1,), gen) for i in range(6)}
    tensors["empty"] = torch.empty(0, 4)
    path = tmp_path / "h.safetensors"
    st_torch.save_file(tensors, path)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    got = ps.load_file(path, "host")
    first = min(got[k].data_ptr() - (8 + n + header[k]["data_offsets"][0]) for k in got if got[k].numel())
    for k, t in got.items():
        if not t.numel():
            continue
        file_offset = 8 + n + header[k]["data_offsets"][0]
        assert (t.data_ptr() - file_offset) % ps.BLOCK == first % ps.BLOCK
        assert t.data_ptr() - file_offset == first  # the image: one shift for all
    # The tensors keep the memory alive after the dict is gone.
    keep = got["t5"]
    del got
    import gc

    gc.collect()
    assert torch.equal(_bits(keep), _bits(tensors["t5"]))


def test_load_file_of_no_tensors(tmp_path):
    path = tmp_path / "none.safetensors"
    st_torch.save_file({}, path)
    for device in ["cpu", "host"]:
        assert ps.load_file(path, device) == {}
    path.write_bytes(_craft({"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}}))
    for device in ["cpu", "host"]:
        got = ps.load_file(path, device)
        assert got["e"].shape == (0, 3) and got["e"].dtype == torch.float32


class _CountingFile:
    """p2pdma.File, counting the batched reads and their entries."""

    batches: list[list[tuple]] = []

    def __init__(self, path, flags="r"):
        self._f = p2pdma.File(path, flags)

    def pread_batch(self, entries):
        entries = list(entries)
        type(self).batches.append(entries)
        return self._f.pread_batch(entries)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_one_batched_transfer(tmp_path, gen, device, monkeypatch):
    monkeypatch.setattr(ps, "File", _CountingFile)
    monkeypatch.setattr(_CountingFile, "batches", [])
    monkeypatch.setattr(ps, "CHUNK", 1 << 16)
    tensors = {f"w{i}": _random(torch.float32, (i, 1000), gen) for i in range(10)}
    path = tmp_path / "b.safetensors"
    st_torch.save_file(tensors, path)
    _assert_same_torch(ps.load_file(path, device), tensors)
    assert len(_CountingFile.batches) == 1
    entries = _CountingFile.batches[0]
    data = sum(t.numel() * 4 for t in tensors.values())
    assert sum(e[2] for e in entries) == data
    assert all(0 < e[2] <= 1 << 16 for e in entries)
    if device == "cpu":
        # Each tensor in pieces of its own.
        assert len(entries) == sum(-(-t.numel() * 4 // (1 << 16)) for t in tensors.values())
    else:
        # The data section in one sweep: back to back, cut at block
        # boundaries, each piece at its file offset's place in the memory.
        offsets = [e[1] for e in entries]
        assert offsets == sorted(offsets)
        for a, b in zip(entries, entries[1:]):
            assert a[1] + a[2] == b[1]
            assert b[1] % ps.BLOCK == 0
        assert len(entries) == -(-(entries[0][1] % ps.BLOCK + data) // (1 << 16))


def _accelerator_available() -> bool:
    try:
        p2pdma.Memory.accelerator(4096)
    except Exception:  # noqa: BLE001 - no module, no device: skip
        return False
    return True


@pytest.mark.skipif(not _accelerator_available(), reason="no accelerator memory (p2pdma module not loaded)")
def test_load_accelerator(tmp_path, gen):
    tensors = {}
    for code, dtype in TORCH_DTYPES.items():
        for i, s in enumerate(_shapes_for(code)):
            tensors[f"{code}.{i}"] = _random(dtype, s, gen)
    tensors["big"] = _random(torch.bfloat16, ((1 << 20) + 3,), gen)
    path = tmp_path / "a.safetensors"
    st_torch.save_file(tensors, path)
    got = ps.load_file(path, "accel:0")
    _assert_same_torch(got, st_torch.load_file(path))
    assert all(t.data_ptr() % t.element_size() == 0 for t in got.values() if t.numel())
    np_tensors = {k: v.numpy() for k, v in tensors.items() if k.split(".")[0] in NUMPY_DTYPES}
    np_path = tmp_path / "a-np.safetensors"
    st_numpy.save_file(np_tensors, np_path)
    _assert_same_numpy(ps.load_file(np_path, "accel:0", framework="np"), st_numpy.load_file(np_path))


# --------------------------------------------------------------------------
# Arguments and errors


@pytest.mark.parametrize(
    "device",
    ["accel", "accel:", "accel:x", "accel:-1", "gpu:0", "CPU", "", "cuda:", "cuda:x", "cuda:-1", "CUDA", "cuda0"],
)
def test_bad_device(tmp_path, device):
    path = tmp_path / "m.safetensors"
    st_torch.save_file({"a": torch.zeros(2)}, path)
    with pytest.raises(p2pdma.InvalidArgumentError):
        ps.load_file(path, device)


def test_bad_framework(tmp_path):
    path = tmp_path / "m.safetensors"
    st_torch.save_file({"a": torch.zeros(2)}, path)
    with pytest.raises(p2pdma.InvalidArgumentError):
        ps.load_file(path, framework="tf")


def test_missing_file(tmp_path):
    with pytest.raises(p2pdma.Error) as info:
        ps.load_file(tmp_path / "nope.safetensors")
    assert info.value.errno == errno.ENOENT


def _valid_file() -> bytes:
    return st_torch.save({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.int16)})


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


MALFORMED = {
    "empty file": b"",
    "shorter than the length": b"\x10\x00\x00",
    "truncated in the header": _valid_file()[:20],
    "truncated in the data": _valid_file()[:-3],
    "header length beyond the file": _craft({"a": _entry()}, b"\0" * 8, length=4096),
    "header length huge": _craft({"a": _entry()}, b"\0" * 8, length=1 << 63),
    "header length zero": _craft({}, b"", length=0),
    "not JSON": _craft(None, b"\0" * 8, raw=b"{not json at all"),
    "not UTF-8": _craft(None, b"", raw=b'{"\xff\xfe":1}'),
    "JSON list": _craft([1, 2, 3]),
    "JSON string": _craft("hello"),
    "duplicate key, the last one wrong": _craft(None, b"\0" * 8, raw=b'{"a":' + json.dumps(_entry()).encode() + b',"a":' + json.dumps(_entry(offsets=(0, 4))).encode() + b"}"),
    "entry not an object": _craft({"a": [1, 2]}),
    "missing dtype": _craft({"a": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
    "missing shape": _craft({"a": {"dtype": "F32", "data_offsets": [0, 8]}}, b"\0" * 8),
    "missing data_offsets": _craft({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
    "unknown dtype": _craft({"a": _entry(dtype="F128")}, b"\0" * 8),
    "dtype not a string": _craft({"a": _entry(dtype=7)}, b"\0" * 8),
    "dtype torch lacks": _craft({"a": _entry(dtype="F6_E2M3", shape=(4,), offsets=(0, 3))}, b"\0" * 3),
    "negative dim": _craft({"a": _entry(shape=(-2,))}, b"\0" * 8),
    "float dim": _craft({"a": _entry(shape=(2.0,))}, b"\0" * 8),
    "bool dim": _craft({"a": _entry(shape=(True, 2))}, b"\0" * 8),
    "shape not a list": _craft({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}}, b"\0" * 8),
    "offsets out of bounds": _craft({"a": _entry(offsets=(0, 16))}, b"\0" * 8),
    "offsets begin past end": _craft({"a": _entry(offsets=(8, 0))}, b"\0" * 8),
    "offsets of three": _craft({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}}, b"\0" * 8),
    "offsets negative": _craft({"a": _entry(offsets=(-8, 0))}, b"\0" * 8),
    "wrong size for shape": _craft({"a": _entry(shape=(3,))}, b"\0" * 8),
    "wrong size for dtype": _craft({"a": _entry(dtype="F64")}, b"\0" * 8),
    "overlapping tensors": _craft({"a": _entry(offsets=(0, 8)), "b": _entry(offsets=(4, 12))}, b"\0" * 12),
    "metadata not strings": _craft({"__metadata__": {"k": 1}, "a": _entry()}, b"\0" * 8),
    "metadata not an object": _craft({"__metadata__": "x", "a": _entry()}, b"\0" * 8),
    "F4 in half bytes": _craft({"a": _entry(dtype="F4", shape=(3,), offsets=(0, 1))}, b"\0" * 1),
    "F4 odd last dim": _craft({"a": _entry(dtype="F4", shape=(2, 3), offsets=(0, 3))}, b"\0" * 3),
    "NaN in header": _craft(None, b"\0" * 8, raw=b'{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,8]}}'),
}


@pytest.mark.parametrize("device", ["cpu", "host"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed(tmp_path, case, device):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(MALFORMED[case])
    # The file really is malformed: safetensors refuses it too.
    with pytest.raises(Exception):
        st_torch.load_file(path)
    with pytest.raises(ps.SafetensorError) as info:
        ps.load_file(path, device)
    e = info.value
    assert isinstance(e, p2pdma.InvalidArgumentError) and isinstance(e, ValueError)
    assert e.errno == errno.EINVAL
    assert e.filename == str(path)
    assert e.strerror


def test_malformed_messages(tmp_path):
    # The safetensors package's reason, then what is wrong in this file.
    path = tmp_path / "bad.safetensors"
    cases = {
        "unknown dtype": "invalid JSON in header .*unknown dtype 'F128'",
        "offsets out of bounds": "invalid shape, data type, or offset for tensor .*hold 16",
        "wrong size for shape": "invalid shape, data type, or offset for tensor .*12 bytes",
        "header length beyond the file": "invalid header length .*length 4096",
        "not JSON": "invalid JSON in header",
        "overlapping tensors": "invalid offset for tensor `b` .*an overlap",
        "dtype torch lacks": "F6_E2M3",
    }
    for case, words in cases.items():
        path.write_bytes(MALFORMED[case])
        with pytest.raises(ps.SafetensorError, match=words):
            ps.load_file(path)


def test_gaps_and_trailing_bytes_are_refused(tmp_path):
    # Offsets that leave a gap, and bytes after the last tensor: the
    # safetensors package refuses both, and so does this.
    data = bytes(range(40))
    path = tmp_path / "gaps.safetensors"
    for header, data, words in [
        ({"b": _entry("U8", (4,), (20, 24)), "a": _entry("I16", (2,), (4, 8))}, data, "invalid offset for tensor `a`"),
        ({"a": _entry("U8", (4,), (0, 4))}, data[:5], "incomplete metadata"),
    ]:
        path.write_bytes(_craft(header, data))
        with pytest.raises(Exception, match=words):
            st_torch.load_file(path)
        with pytest.raises(ps.SafetensorError, match=words):
            ps.load_file(path)


# --------------------------------------------------------------------------
# Progress


class _Bars:
    made: list = []


def _recording_tqdm():
    from tqdm import tqdm

    class Recording(tqdm):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.updates = []
            _Bars.made.append(self)

        def update(self, n=1):
            self.updates.append(n)
            return super().update(n)

    return Recording


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_progress_counts_bytes(tmp_path, gen, device, monkeypatch, capsys):
    monkeypatch.setattr(ps, "tqdm", _recording_tqdm())
    monkeypatch.setattr(_Bars, "made", [])
    monkeypatch.setattr(ps, "CHUNK", 1 << 16)
    tensors = {"a": _random(torch.float32, (100_000,), gen), "b": _random(torch.int8, (7,), gen), "c": torch.empty(0)}
    path = tmp_path / "p.safetensors"
    st_torch.save_file(tensors, path)
    got = ps.load_file(path, device, progress=True)
    _assert_same_torch(got, tensors)
    assert len(_Bars.made) == 1
    bar = _Bars.made[0]
    assert bar.n == bar.total == 400_007
    if device == "cpu":
        assert len(bar.updates) == 8  # 400,000 bytes in 64 KiB pieces, and 7
    else:
        # The data section in one sweep of 64 KiB steps cut at block
        # boundaries: the first piece is short by the section's place in
        # its block.
        start = 8 + int.from_bytes(path.read_bytes()[:8], "little")
        assert len(bar.updates) == -(-(start % ps.BLOCK + 400_007) // (1 << 16))
        assert bar.updates[0] == (1 << 16) - start % ps.BLOCK
    assert "p.safetensors" in capsys.readouterr().err


def test_progress_off(tmp_path, gen, monkeypatch):
    monkeypatch.setattr(ps, "tqdm", _recording_tqdm())
    monkeypatch.setattr(_Bars, "made", [])
    path = tmp_path / "p.safetensors"
    st_torch.save_file({"a": _random(torch.float32, (1000,), gen)}, path)
    ps.load_file(path, progress=False)
    ps.load_file(path)  # small, and stderr is no terminal under pytest
    assert _Bars.made == []


# --------------------------------------------------------------------------
# Saving


def _all_dtype_tensors(gen) -> dict:
    tensors = {}
    for code, dtype in TORCH_DTYPES.items():
        for i, s in enumerate(_shapes_for(code)):
            tensors[f"{code.lower()}.{i}"] = _random(dtype, s, gen)
    # Names that need escaping, and sort by bytes rather than by dtype.
    tensors['quote " back \\ slash'] = _random(torch.float32, (3,), gen)
    tensors["ctrl \n\t\x01\x1f\x7f"] = _random(torch.float32, (2,), gen)
    tensors["ünïcödé ✓ 𝔘"] = _random(torch.float32, (1,), gen)
    tensors["A"] = _random(torch.float32, (5,), gen)
    tensors["a"] = _random(torch.float32, (5,), gen)
    return tensors


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {"k \" \n ✓": "v \t ü"}])
def test_save_byte_identical(tmp_path, gen, metadata):
    tensors = _all_dtype_tensors(gen)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    ps.save_file(tensors, ours, metadata=metadata)
    st_torch.save_file(tensors, theirs, metadata=metadata)
    assert ours.read_bytes() == theirs.read_bytes()
    _assert_same_torch(st_torch.load_file(ours), tensors)
    _assert_same_torch(ps.load_file(ours), tensors)


def test_save_empty_and_small(tmp_path):
    for tensors in [{}, {"x": torch.zeros(0)}, {"s": torch.tensor(3.5)}, {"b": torch.tensor([True, False])}]:
        for metadata in [None, {"a": "b"}]:
            ours, theirs = tmp_path / "o", tmp_path / "t"
            ps.save_file(tensors, ours, metadata)
            st_torch.save_file(tensors, theirs, metadata)
            assert ours.read_bytes() == theirs.read_bytes(), (tensors, metadata)


def test_save_many_metadata_entries(tmp_path, gen):
    # safetensors writes several metadata entries in a Rust HashMap's
    # (random) order; the rest of the file is the same.
    tensors = {"w": _random(torch.float16, (4, 4), gen), "b": _random(torch.float32, (4,), gen)}
    metadata = {"format": "pt", "z": "1", "a": "2", "m": "3"}
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ps.save_file(tensors, ours, metadata)
    st_torch.save_file(tensors, theirs, metadata)
    o, t = ours.read_bytes(), theirs.read_bytes()
    assert len(o) == len(t) and o[:8] == t[:8]
    n = struct.unpack("<Q", o[:8])[0]
    assert json.loads(o[8 : 8 + n]) == json.loads(t[8 : 8 + n])
    assert o[8 + n :] == t[8 + n :]
    with st_torch.safe_open(ours, "pt") as f:
        assert f.metadata() == metadata


def test_save_numpy_byte_identical(tmp_path, gen):
    arrays = {}
    for code in NUMPY_DTYPES:
        for i, s in enumerate(SHAPES):
            arrays[f"{code}.{i}"] = _random(TORCH_DTYPES[code], s, gen).numpy()
    arrays["big-endian"] = np.arange(5, dtype=">i4")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ps.save_file(arrays, ours, {"format": "np"})
    st_numpy.save_file(arrays, theirs, {"format": "np"})
    assert ours.read_bytes() == theirs.read_bytes()
    _assert_same_numpy(ps.load_file(ours, framework="np"), st_numpy.load_file(theirs))


def test_save_makes_tensors_contiguous(tmp_path, gen):
    base = _random(torch.float32, (6, 8), gen)
    tensors = {"t": base.t(), "s": base[::2, 1::3], "e": base.expand(2, 6, 8)[1]}
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ps.save_file(tensors, ours)
    st_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, theirs)
    assert ours.read_bytes() == theirs.read_bytes()


def test_save_parameters(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    params = dict(model.named_parameters())
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ps.save_file(params, ours)
    st_torch.save_file(params, theirs)
    assert ours.read_bytes() == theirs.read_bytes()


def test_save_overwrites_a_longer_file(tmp_path):
    path = tmp_path / "o"
    path.write_bytes(b"\xff" * 100_000)
    ps.save_file({"a": torch.ones(3)}, path)
    assert path.read_bytes() == st_torch.save({"a": torch.ones(3)})


@pytest.mark.parametrize(
    "tensors, metadata",
    [
        ({"m": torch.empty(3, device="meta")}, None),
        ({"s": torch.eye(3).to_sparse()}, None),
        ({"c": torch.zeros(2, dtype=torch.complex128)}, None),
        ({"l": [1, 2, 3]}, None),
        ({3: torch.zeros(1)}, None),
        ({"__metadata__": torch.zeros(1)}, None),
        ({"a": torch.zeros(1)}, {"k": 1}),
        ({"a": torch.zeros(1)}, "format=pt"),
        ({"o": np.array([object()])}, None),
    ],
)
def test_save_refuses(tmp_path, tensors, metadata):
    path = tmp_path / "never"
    with pytest.raises(p2pdma.InvalidArgumentError):
        ps.save_file(tensors, path, metadata)
    assert not path.exists()
