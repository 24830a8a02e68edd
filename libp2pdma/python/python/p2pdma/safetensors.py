"""safetensors files straight into the memory that will hold the weights.

A safetensors file is an 8-byte little-endian header length ``N``, ``N``
bytes of JSON (``{"name": {"dtype": "F32", "shape": [2, 3],
"data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}``,
padded with spaces), then the data section: every tensor's bytes, little
endian, at ``data_offsets`` counted from the end of the header.

``load_file`` works in three steps:

1. **Header.** It reads the length and the JSON with ``File.read`` into a
   ``bytearray`` and checks all of it before any tensor is touched: the
   length against the file's size, the JSON (one object, no repeated keys),
   every entry's dtype, shape and offsets (inside the data section, exactly
   ``numel * itemsize`` bytes, no two tensors overlapping), and
   ``__metadata__`` (strings to strings). A malformed file raises
   ``SafetensorError``, an ``InvalidArgumentError`` (so also a ``ValueError``
   and an ``OSError`` with errno ``EINVAL``) that names the file and what is
   wrong; a file that cannot be opened raises the binding's error (errno
   ``ENOENT`` for a missing file).

2. **One batched transfer.** It allocates the destination of every tensor
   and submits all the reads at once with ``File.pread_batch``: the engine
   sees the whole load and keeps its queues full. Pieces are at most 64
   MiB, so that progress moves steadily.

3. **Tensors over the bytes.** The destination bytes are reinterpreted in
   place, ``uint8 -> dtype -> shape``; nothing is copied after the read
   (the file is little-endian, as the hosts this library runs on are).

Where the bytes land depends on ``device``:

- ``"cpu"``: one ordinary CPU tensor (or numpy array) per tensor; the
  engine reads into it through host memory.
- ``"accel:N"``: one ``p2pdma.Memory.accelerator(size, index=N)`` holding
  an image of the data section: every tensor sits at its file offset's
  place modulo 4 KiB, so the reads (the section in 64 MiB pieces cut at
  block boundaries) move every block-aligned stretch by peer-to-peer DMA
  where the platform allows it, and only the section's two ends go
  through a bounce slot; a tensor is as aligned in memory as in the file. The
  returned tensors view that memory through its CPU mapping (DLPack
  ``kDLCPU``): to torch they are CPU tensors, but their storage is the
  accelerator's BAR, mapped write-combined, so CPU reads of them are slow
  (uncached) and writes stream. They keep the memory alive: it is freed
  when the last tensor viewing it is.
- ``"host"``: the same single-allocation layout in ``p2pdma.Memory.host``
  (the host-memory device), e.g. to exercise that path without an
  accelerator.
- ``"cuda"``, ``"cuda:N"``: the same single-allocation layout in
  ``p2pdma.Memory.cuda`` on CUDA device ``N`` (torch's current device for
  ``"cuda"``), and torch CUDA tensors over it (``torch.from_dlpack`` of
  views of that memory). The bytes come by the GPU's copy engine out of
  page-locked bounce slots, or by P2P where a library-driven namespace
  imports the GPU's dma-buf. Needs ``framework="pt"`` and torch with CUDA
  (``torch.cuda.is_available()``); ``CudaUnavailableError`` otherwise. The
  memory is the library's own allocation, not torch's caching allocator's:
  it is freed when the last tensor viewing it is.

``progress`` shows a ``tqdm`` bar in bytes on stderr, advanced as each entry
of the batch completes (waited for in order). By default it appears only
when stderr is a terminal and the load is at least 256 MiB.

``save_file`` writes the format with ``p2pdma.File.write``, laid out as the
``safetensors`` package lays it out (tensors by dtype alignment, largest
first, then by name; compact JSON padded with spaces to a multiple of 8),
so its output is byte-identical to ``safetensors.torch.save_file`` for the
same tensors, except where that package's own output is not deterministic
or not valid: see ``save_file``.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import sys
from collections.abc import Mapping
from typing import Any, Literal

from tqdm import tqdm  # type: ignore[import-untyped]

from . import File, Memory
from .errors import CudaUnavailableError, InvalidArgumentError

__all__ = [
    "SafetensorError",
    "load_file",
    "numpy_dtypes",
    "safe_open",
    "save_file",
    "torch_dtypes",
]


def _reference_error() -> tuple[type[Exception], ...]:
    """The ``safetensors`` package's ``SafetensorError``, where it is
    installed: a program that catches it catches ours."""
    try:
        from safetensors import SafetensorError as reference
    except ImportError:
        return ()
    return (reference,)


class SafetensorError(InvalidArgumentError, *_reference_error()):  # type: ignore[misc]
    """A safetensors file (or a dict of tensors to save, or an argument)
    that cannot be used: the message says which file and what is wrong; a
    malformed header is refused with the reason the ``safetensors``
    package gives. Where that package is installed, this is also its
    ``safetensors.SafetensorError``."""


#: Largest header the ``safetensors`` package accepts (100 MB).
MAX_HEADER_SIZE = 100_000_000

#: Largest single entry of the read batch; bigger tensors are split.
CHUNK = 64 << 20

#: A tensor's place in one ``Memory`` ("host", "accel:N") is its file
#: offset's modulo this, so block-aligned stretches go straight to memory.
BLOCK = 4096

#: Loads at least this big get a progress bar by default (on a terminal).
PROGRESS_THRESHOLD = 256 << 20

# Every dtype of the safetensors format: its size in bits, in the order of
# safetensors' ``Dtype`` enum (which the writer sorts by, largest first).
_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
_RANK = {name: i for i, name in enumerate(_BITS)}

# safetensors dtype -> torch dtype attribute (skipped where torch lacks it).
# F4 is torch's float4_e2m1fn_x2: two 4-bit values per element, so the
# torch shape has half the file's last dimension.
_TORCH_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
}

# safetensors dtype -> numpy dtype name (numpy has no bfloat16, float8, float4).
_NUMPY_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
}

_torch_types: dict[str, Any] | None = None


def _torch() -> Any:
    import torch

    return torch


def torch_dtypes() -> dict[str, Any]:
    """safetensors dtype -> torch dtype, for the dtypes this torch has."""
    global _torch_types
    if _torch_types is None:
        torch = _torch()
        _torch_types = {
            code: getattr(torch, name)
            for code, name in _TORCH_NAMES.items()
            if getattr(torch, name, None) is not None
        }
    return _torch_types


def numpy_dtypes() -> dict[str, Any]:
    """safetensors dtype -> numpy dtype."""
    import numpy as np

    return {code: np.dtype(name) for code, name in _NUMPY_NAMES.items()}


# --------------------------------------------------------------------------
# Header


class _Entry:
    """One tensor of the header."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: list[int], begin: int, end: int):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.begin = begin
        self.end = end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _fail(path: str, msg: str) -> SafetensorError:
    return SafetensorError(errno.EINVAL, msg, path)


def _refuse(path: str, reason: str, detail: str = "") -> SafetensorError:
    """The reference's refusal of a header, in its words (``reason`` is its
    ``SafeTensorError``'s text), with what is wrong in this file."""
    msg = f"Error while deserializing header: {reason}"
    return _fail(path, f"{msg} ({detail})" if detail else msg)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's members in order, repeated keys kept."""


#: serde_json's nesting limit, which the reference parses the header with:
#: an array or object nested deeper is refused.
_MAX_DEPTH = 127

_U64 = 1 << 64


def _int(text: str) -> Any:
    # serde_json reads -0 as a float, which no count or offset may be.
    n = int(text)
    return -0.0 if n == 0 and text.startswith("-") else n


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _json_value(text: str) -> Any:
    return json.loads(
        text, object_pairs_hook=_Pairs, parse_constant=_no_constant, parse_int=_int
    )


def _kind(v: Any) -> str:
    """What serde_json calls a value of this kind in its type errors."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f"string {json.dumps(v)}"
    return "map" if isinstance(v, _Pairs) else "sequence"


def _check_strings_and_depth(v: Any, depth: int = 0) -> str | None:
    """What serde_json refuses anywhere in a value Python's json reads: a
    string with a lone surrogate (not Unicode), nesting past its limit."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return f"the string {v!r} has a lone surrogate, which is not Unicode"
        return None
    if isinstance(v, list):
        if depth + 1 > _MAX_DEPTH:
            return f"recursion limit exceeded (nesting deeper than {_MAX_DEPTH})"
        for item in v:
            for x in item if isinstance(v, _Pairs) else (item,):
                bad = _check_strings_and_depth(x, depth + 1)
                if bad:
                    return bad
    return None


def _usize(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _U64


def _tensor_info(name: str, v: Any) -> tuple[Any, Any, Any]:
    """An entry as the reference's ``TensorInfo`` reads it: an object with
    ``dtype``, ``shape`` and ``data_offsets`` (other members ignored, none
    of those three twice), or the three in a list of three; raises
    ``ValueError`` with serde_json's kind of complaint otherwise."""
    where = f"tensor {name!r}"
    if isinstance(v, _Pairs):
        fields: dict[str, Any] = {}
        for k, x in v:
            if k in ("dtype", "shape", "data_offsets"):
                if k in fields:
                    raise ValueError(f"{where}: duplicate field `{k}`")
                fields[k] = x
        for k in ("dtype", "shape", "data_offsets"):
            if k not in fields:
                raise ValueError(f"{where}: missing field `{k}`")
        dtype, shape, offsets = fields["dtype"], fields["shape"], fields["data_offsets"]
    elif isinstance(v, list):
        if len(v) != 3:
            raise ValueError(f"{where}: invalid length {len(v)}, expected struct TensorInfo with 3 elements")
        dtype, shape, offsets = v
    else:
        raise ValueError(f"{where}: invalid type: {_kind(v)}, expected struct TensorInfo")
    if not isinstance(dtype, str):
        raise ValueError(f"{where}: dtype: invalid type: {_kind(dtype)}, expected a dtype name")
    if dtype not in _BITS:
        raise ValueError(f"{where}: unknown dtype {dtype!r} (unknown variant)")
    if not isinstance(shape, list) or isinstance(shape, _Pairs):
        raise ValueError(f"{where}: shape: invalid type: {_kind(shape)}, expected a sequence")
    for d in shape:
        if not _usize(d):
            raise ValueError(f"{where}: shape {shape!r}: invalid type: {_kind(d)}, expected usize")
    if not isinstance(offsets, list) or isinstance(offsets, _Pairs):
        raise ValueError(f"{where}: data_offsets: invalid type: {_kind(offsets)}, expected a tuple of size 2")
    if len(offsets) != 2:
        raise ValueError(f"{where}: data_offsets: invalid length {len(offsets)}, expected 2 elements")
    for o in offsets:
        if not _usize(o):
            raise ValueError(f"{where}: data_offsets {offsets!r}: invalid type: {_kind(o)}, expected usize")
    return dtype, shape, offsets


def _header_json(path: str, raw: bytes) -> tuple[dict[str, tuple[Any, Any, Any]], dict[str, str] | None]:
    """The header as the reference's JSON parsing reads it: tensors by name
    (a name given twice keeps its last entry, as a map does) and the
    metadata; raises its "invalid UTF-8" or "invalid JSON" refusal."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _refuse(path, "invalid UTF-8 in header", str(e)) from None
    try:
        header = _json_value(text)
    except (ValueError, RecursionError) as e:
        raise _refuse(path, "invalid JSON in header", str(e)) from None
    try:
        bad = _check_strings_and_depth(header)
        if bad:
            raise ValueError(bad)
        if not isinstance(header, _Pairs):
            raise ValueError(f"invalid type: {_kind(header)}, expected a map")
        metadata: dict[str, str] | None = None
        seen_metadata = False
        tensors: dict[str, tuple[Any, Any, Any]] = {}
        for name, v in header:
            if name == "__metadata__":
                if seen_metadata:
                    raise ValueError("duplicate field `__metadata__`")
                seen_metadata = True
                if v is None:
                    continue
                if not isinstance(v, _Pairs):
                    raise ValueError(f"__metadata__: invalid type: {_kind(v)}, expected a map")
                metadata = {}
                for k, x in v:
                    if not isinstance(x, str):
                        raise ValueError(f"__metadata__[{k!r}]: invalid type: {_kind(x)}, expected a string")
                    metadata[k] = x
                continue
            tensors.pop(name, None)
            tensors[name] = _tensor_info(name, v)
    except ValueError as e:
        raise _refuse(path, "invalid JSON in header", str(e)) from None
    return tensors, metadata


def _parse_header(
    path: str, raw: bytes, data_size: int
) -> tuple[list[_Entry], dict[str, str] | None]:
    """The entries of a header, in the order of their data, and its
    metadata. Refuses, with the reference's reason, every header the
    ``safetensors`` package refuses (``SafeTensors::read_metadata``): JSON
    it cannot read as tensors and metadata, then tensors that do not lie
    back to back from offset 0 (a gap, an overlap, an end before its
    begin: "invalid offset"), a shape whose size overflows, a size that is
    not whole bytes, offsets that do not hold the shape's bytes, and a
    data section the tensors do not cover exactly (trailing bytes:
    "incomplete metadata")."""
    tensors, metadata = _header_json(path, raw)
    # Sorted by offsets, as the reference sorts them (a stable sort).
    ordered = sorted(tensors.items(), key=lambda kv: (kv[1][2][0], kv[1][2][1]))
    entries: list[_Entry] = []
    start = 0
    for name, (dtype, shape, (begin, end)) in ordered:
        if begin != start or end < begin:
            what = "a gap" if begin > start else "an overlap" if begin < start else "its end before its begin"
            raise _refuse(
                path,
                f"invalid offset for tensor `{name}`",
                f"data_offsets [{begin}, {end}], where the tensors before it end at {start}: {what}",
            )
        start = end
        numel = 1
        for d in shape:
            numel *= d
            if numel >= _U64:
                raise _refuse(
                    path,
                    "overflow computing buffer size from shape and/or element type",
                    f"tensor {name!r}: shape {shape}",
                )
        bits = numel * _BITS[dtype]
        if bits >= _U64:
            raise _refuse(
                path,
                "overflow computing buffer size from shape and/or element type",
                f"tensor {name!r}: shape {shape} of {dtype}",
            )
        if bits % 8:
            raise _refuse(
                path,
                "The slice is slicing for subbytes dtypes, and the slice does not end "
                "up at a byte boundary, this is invalid.",
                f"tensor {name!r}: {numel} {dtype} elements are {bits} bits, not whole bytes",
            )
        if bits // 8 != end - begin:
            raise _refuse(
                path,
                "invalid shape, data type, or offset for tensor",
                f"tensor {name!r}: shape {shape} of {dtype} is {bits // 8} bytes, "
                f"but data_offsets [{begin}, {end}] hold {end - begin}",
            )
        entries.append(_Entry(name, dtype, list(shape), begin, end))
    if start != data_size:
        raise _refuse(
            path,
            "incomplete metadata, file not fully covered",
            f"the tensors end at {start} of a {data_size}-byte data section",
        )
    return entries, metadata


def _read_header(f: File, path: str) -> tuple[list[_Entry], dict[str, str] | None, int]:
    """The file's entries, metadata and where its data section starts."""
    size = f.size()
    if size < 8:
        raise _refuse(path, "header too small", f"the file is {size} bytes")
    head = bytearray(8)
    f.read(head, 8, 0)
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_SIZE:
        raise _refuse(path, "header too large", f"length {n}, over {MAX_HEADER_SIZE}")
    if 8 + n > size:
        raise _refuse(
            path, "invalid header length", f"length {n} reaches past the end of the {size}-byte file"
        )
    raw = bytearray(n)
    f.read(raw, n, 8)
    entries, metadata = _parse_header(path, bytes(raw), size - 8 - n)
    return entries, metadata, 8 + n


# --------------------------------------------------------------------------
# Loading


def _parse_device(device: str) -> tuple[Literal["cpu", "host", "accel", "cuda"], int | None]:
    """The kind of memory ``device`` names and its index (``None``: the
    current CUDA device)."""
    if device == "cpu":
        return "cpu", 0
    if device == "host":
        return "host", 0
    if device == "cuda":
        return "cuda", None
    if isinstance(device, str):
        accel, cuda = _index(device, "accel:"), _index(device, "cuda:")
        if accel is not None:
            return "accel", accel
        if cuda is not None:
            return "cuda", cuda
    raise SafetensorError(
        errno.EINVAL,
        f"device {device!r}: expected 'cpu', 'host', 'accel:N', 'cuda' or 'cuda:N'",
    )


def _index(device: str, prefix: str) -> int | None:
    """N of ``device`` if it is ``prefix`` then N in decimal digits."""
    if not device.startswith(prefix):
        return None
    n = device[len(prefix) :]
    return int(n) if n.isdigit() and n.isascii() else None


def _cuda_ordinal(device: str, index: int | None, framework: str) -> int:
    """The CUDA device a load into ``device`` goes to; raises unless torch
    with CUDA can hold the tensors."""
    if framework != "pt":
        raise SafetensorError(
            errno.EINVAL,
            f"device {device!r} gives torch CUDA tensors, and numpy arrays live on "
            "the CPU: use framework='pt'",
        )
    try:
        torch = _torch()
    except ImportError as e:
        raise CudaUnavailableError(
            errno.ENODEV, f"device {device!r} needs torch with CUDA, and torch cannot be imported ({e})"
        ) from None
    if not torch.cuda.is_available():
        raise CudaUnavailableError(
            errno.ENODEV,
            f"device {device!r} needs torch with CUDA: torch.cuda.is_available() is False "
            f"(torch {torch.__version__})",
        )
    return int(torch.cuda.current_device()) if index is None else index


def _cuda_tensor(view: Any) -> Any:
    """A torch CUDA ``uint8`` tensor over ``view``, a range of CUDA memory."""
    return _torch().from_dlpack(view)


def _want_progress(progress: bool | None, total: int) -> bool:
    if progress is not None:
        return bool(progress)
    try:
        tty = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and total >= PROGRESS_THRESHOLD


def _framework(framework: str) -> Literal["pt", "np"]:
    """``framework`` as ``"pt"`` or ``"np"`` (the ``safetensors``
    package's names for them included)."""
    if framework in ("pt", "torch", "pytorch"):
        return "pt"
    if framework in ("np", "numpy"):
        return "np"
    raise SafetensorError(
        errno.EINVAL,
        f"framework {framework!r}: p2pdma.safetensors gives torch tensors ('pt') "
        "or numpy arrays ('np')",
    )


def _dtype_table(path: str, entries: list[_Entry], framework: str) -> dict[str, Any]:
    if framework == "pt":
        table, what = torch_dtypes(), f"torch {_torch().__version__}"
    else:
        table, what = numpy_dtypes(), "numpy"
    for e in entries:
        if e.dtype not in table:
            raise _fail(path, f"tensor {e.name!r}: dtype {e.dtype} has no {what} equivalent")
    return table


def _as_tensor(raw: Any, e: _Entry, dtype: Any, framework: str) -> Any:
    """``raw`` (1-D uint8 of ``e.nbytes``) as the tensor ``e`` describes."""
    shape = list(e.shape)
    if framework == "pt" and e.dtype == "F4":
        shape[-1] //= 2  # two F4 values per float4_e2m1fn_x2 element
    return raw.view(dtype).reshape(shape)


def _check_f4(path: str, entries: list[_Entry], framework: str) -> None:
    if framework != "pt":
        return
    for e in entries:
        if e.dtype == "F4" and (not e.shape or e.shape[-1] % 2):
            raise _fail(
                path,
                f"tensor {e.name!r}: F4 shape {e.shape} needs an even last dimension "
                "(torch packs two F4 values per element)",
            )


def _pieces(buf_at: Any, nbytes: int, file_offset: int) -> list[tuple[Any, int, int]]:
    """Batch entries ``(buf, file_offset, size)`` for ``nbytes`` bytes,
    at most ``CHUNK`` each; ``buf_at(at, n)`` is the destination of ``n``
    bytes from ``at``."""
    return [
        (buf_at(at, min(CHUNK, nbytes - at)), file_offset + at, min(CHUNK, nbytes - at))
        for at in range(0, nbytes, CHUNK)
    ]


def _destinations(
    entries: list[_Entry], data_start: int, kind: str, index: int, framework: str
) -> tuple[list[Any], list[tuple[Any, int, int]]]:
    """Each entry's destination (1-D uint8, ``nbytes`` long) and the batch
    of reads that fills them."""
    from_dlpack: Any
    if kind == "cuda":
        torch = _torch()
        empty = lambda n: torch.empty(n, dtype=torch.uint8, device=f"cuda:{index}")  # noqa: E731
        from_dlpack = _cuda_tensor
    elif framework == "pt":
        torch = _torch()
        empty = lambda n: torch.empty(n, dtype=torch.uint8)  # noqa: E731
        from_dlpack = torch.from_dlpack
    else:
        import numpy as np

        empty = lambda n: np.empty(n, dtype=np.uint8)  # noqa: E731
        from_dlpack = np.from_dlpack

    raws: list[Any] = []
    batch: list[tuple[Any, int, int]] = []
    if kind == "cpu":
        # One CPU tensor per entry; pieces are slices of it.
        for e in entries:
            raw = empty(e.nbytes)
            raws.append(raw)
            batch += _pieces(lambda at, n: raw[at : at + n], e.nbytes, data_start + e.begin)
        return raws, batch

    # One Memory holding an image of the data section: every tensor at its
    # file offset's place modulo BLOCK, so the storage can DMA each
    # block-aligned stretch straight into it (P2P into accelerator memory)
    # and only the two ends of the section go through a bounce slot. The
    # pieces cover the section in CHUNK steps cut at block boundaries; the
    # tensors view the memory through its CPU mapping.
    live = [e for e in entries if e.nbytes]
    if not live:
        return [empty(0) for _ in entries], batch
    first = data_start + min(e.begin for e in live)
    last = data_start + max(e.end for e in live)
    phase = first % BLOCK
    mem_len = phase + (last - first)
    if kind == "host":
        mem = Memory.host(mem_len)
    elif kind == "cuda":
        mem = Memory.cuda(mem_len, index)
    else:
        mem = Memory.accelerator(mem_len, index=index)
    for e in entries:
        if e.nbytes == 0:
            raws.append(empty(0))
            continue
        raws.append(from_dlpack(mem.view(phase + data_start + e.begin - first, e.nbytes)))
    at = first
    while at < last:
        end = min(last, (at - at % BLOCK) + CHUNK)
        batch.append((mem.view(phase + at - first, end - at), at, end - at))
        at = end
    return raws, batch


def load_file(
    path: str | os.PathLike[str],
    device: str | int = "cpu",
    *,
    framework: Literal["pt", "torch", "pytorch", "np", "numpy"] = "pt",
    progress: bool | None = None,
) -> dict[str, Any]:
    """Loads every tensor of the safetensors file ``path``.

    ``device``: ``"cpu"`` (a CPU tensor each), ``"accel:N"`` (all in one
    allocation of accelerator ``N``'s memory, viewed through its CPU
    mapping: CPU tensors to torch that alias write-combined accelerator
    memory, slow to read from the CPU, and keep that memory alive),
    ``"host"`` (the same in the host-memory device), or ``"cuda"`` /
    ``"cuda:N"`` (all in one allocation of CUDA device memory, as torch
    CUDA tensors that keep it alive; needs ``framework="pt"`` and torch
    with CUDA, ``CudaUnavailableError`` otherwise). ``framework``:
    ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays; no bfloat16,
    float8 or float4). ``progress``: a tqdm bar in bytes; ``None`` shows one
    only on a terminal for loads of 256 MiB or more.

    Returns ``{name: tensor}`` in the order of the data section, bit-for-bit
    what ``safetensors.torch.load_file`` (or ``safetensors.numpy.load_file``)
    returns. Raises ``SafetensorError`` (an ``InvalidArgumentError``) for a
    malformed file, ``InvalidArgumentError`` for a bad argument or a dtype
    the framework lacks, and the binding's errors (``p2pdma.Error``,
    ``EndOfFileError``, ``ModuleError``, ...) for failed opens, allocations
    and transfers.
    """
    framework = _framework(framework)
    kind, index = _target(device, framework)
    path = os.fspath(path)
    with File(path, "r") as f:
        entries, _metadata, data_start = _read_header(f, path)
        tensors = _load(f, path, entries, data_start, (kind, index), framework, progress)
    return {e.name: t for e, t in zip(entries, tensors)}


def _target(device: str | int, framework: str) -> tuple[str, int]:
    """The kind of memory ``device`` names and its index (the CUDA device
    for ``"cuda"``); an int is a CUDA device, as in ``safetensors``."""
    if isinstance(device, str):
        name = device
    else:
        name = repr(device) if isinstance(device, bool) else f"cuda:{device}"
    kind, parsed = _parse_device(name)
    if kind == "cuda":
        return kind, _cuda_ordinal(name, parsed, framework)
    return kind, parsed or 0


def _load(
    f: File,
    path: str,
    entries: list[_Entry],
    data_start: int,
    target: tuple[str, int],
    framework: str,
    progress: bool | None = None,
) -> list[Any]:
    """The tensors ``entries`` describe, read from ``f`` into ``target``
    (``_target``) in one batched transfer."""
    table = _dtype_table(path, entries, framework)
    _check_f4(path, entries, framework)
    raws, batch = _destinations(entries, data_start, target[0], target[1], framework)
    if batch:
        pending = f.pread_batch(batch)
        total = sum(n for _, _, n in batch)
        if _want_progress(progress, total):
            _wait_with_progress(pending, total, path)
        else:
            pending.wait()
    return [_as_tensor(raw, e, table[e.dtype], framework) for e, raw in zip(entries, raws)]


def _wait_with_progress(pending: Any, total: int, path: str) -> None:
    """Waits for every future of ``pending`` in order, advancing a bar by
    each one's bytes; raises the first error once all have ended."""
    first: BaseException | None = None
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=os.path.basename(path),
        file=sys.stderr,
    ) as bar:
        for fut in pending.futures:
            try:
                fut.wait()
            except Exception as e:  # noqa: BLE001 - raised once all end
                if first is None:
                    first = e
                continue
            bar.update(fut.size)
    if first is not None:
        raise first


# --------------------------------------------------------------------------
# Opening lazily


class safe_open:  # noqa: N801 - the safetensors package's name
    """A safetensors file opened for reading tensors one at a time, as the
    ``safetensors`` package's ``safe_open``: ``keys()`` (sorted),
    ``offset_keys()`` (in the order of the data), ``metadata()``,
    ``get_tensor(name)``, ``get_tensors()``, ``get_slice(name)``, and a
    context manager that closes it.

    Opening reads and checks the header only, refusing every file the
    ``safetensors`` package refuses, with its reason; each tensor is read
    when asked for, through the engine, straight into ``device``'s
    memory, as ``load_file`` reads it: ``"cpu"``, ``"host"``,
    ``"accel:N"``, ``"cuda"``, ``"cuda:N"`` or ``N`` (CUDA device ``N``).
    ``framework``: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
    ``backend`` is accepted for the ``safetensors`` package's programs:
    either way the engine reads the bytes.
    """

    def __init__(
        self,
        filename: str | os.PathLike[str],
        framework: str,
        device: str | int = "cpu",
        *,
        backend: Literal["mmap", "pread"] = "mmap",
    ) -> None:
        if backend not in ("mmap", "pread"):
            raise SafetensorError(errno.EINVAL, f"backend {backend!r}: expected 'mmap' or 'pread'")
        self._framework = _framework(framework)
        if self._framework == "np" and (
            isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda"))
        ):
            raise SafetensorError(
                errno.EINVAL,
                f"device {device!r} is not supported for framework numpy: numpy arrays live "
                "on the CPU ('cpu', 'host', 'accel:N')",
            )
        self._target = _target(device, self._framework)
        path = os.fspath(filename)
        f = File(path, "r")
        try:
            entries, self._metadata, self._start = _read_header(f, path)
        except BaseException:
            f.close()
            raise
        self._file: File | None = f
        self._path = path
        self._entries = {e.name: e for e in entries}

    def _open(self) -> File:
        if self._file is None:
            raise SafetensorError("File is closed")
        return self._file

    def _entry(self, name: str) -> _Entry:
        self._open()
        e = self._entries.get(name)
        if e is None:
            raise SafetensorError(f"File does not contain tensor {name}")
        return e

    def _read(self, entries: list[_Entry], file: File | None = None) -> list[Any]:
        f = file if file is not None else self._open()
        return _load(f, self._path, entries, self._start, self._target, self._framework)

    def keys(self) -> list[str]:
        """The tensors' names, sorted."""
        self._open()
        return sorted(self._entries)

    def offset_keys(self) -> list[str]:
        """The tensors' names in the order of their data."""
        self._open()
        return list(self._entries)

    def metadata(self) -> dict[str, str] | None:
        """The header's ``__metadata__``, or ``None``."""
        self._open()
        return None if self._metadata is None else dict(self._metadata)

    def get_tensor(self, name: str) -> Any:
        """The tensor ``name``, read now into the device's memory."""
        return self._read([self._entry(name)])[0]

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor, in the order of their data, read in one batched
        transfer."""
        self._open()
        entries = list(self._entries.values())
        return {e.name: t for e, t in zip(entries, self._read(entries))}

    def get_slice(self, name: str) -> TensorSlice:
        """The tensor ``name`` to slice (``get_slice(name)[1:3, ::2]``):
        only the rows the first index selects are read."""
        return TensorSlice(self, self._entry(name))

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, _exc_type: Any, _exc_value: Any, _traceback: Any) -> None:
        # The file stays open for the slices taken from it, as the
        # package's mapping does, and closes with the last of them.
        self._file = None


class TensorSlice:
    """A tensor of a ``safe_open`` file, not read yet: the ``safetensors``
    package's ``PySafeSlice`` (``get_shape()``, ``get_dtype()``, and
    indexing, which reads what it selects). Indexing follows the
    framework's rules for ``"pt"`` (torch's), and for ``"np"`` the
    package's: ints, slices with a positive step and no negative bounds,
    one ellipsis."""

    def __init__(self, owner: safe_open, entry: _Entry) -> None:
        self._owner = owner
        self._file = owner._open()
        self._entry = entry

    def get_shape(self) -> list[int]:
        """The whole tensor's shape."""
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        """The whole tensor's dtype, as the file names it (``"F32"``)."""
        return self._entry.dtype

    def __getitem__(self, index: Any) -> Any:
        e = self._entry
        if self._owner._framework == "np":
            index = _np_index(index, e.shape)
        rows = _first_rows(index, e)
        if rows is None:
            part = e
        else:
            (lo, hi), index = rows
            row = (e.end - e.begin) // e.shape[0] if e.shape[0] else 0
            part = _Entry(e.name, e.dtype, [hi - lo, *e.shape[1:]], e.begin + lo * row, e.begin + hi * row)
        got = self._owner._read([part], self._file)[0][index]
        if self._owner._framework == "np":
            import numpy as np

            # An element is a 0-d array there, not a numpy scalar.
            got = np.asarray(got)
        return got


def _np_index(index: Any, shape: list[int]) -> tuple[Any, ...]:
    """``index`` as the ``safetensors`` package takes it for numpy arrays:
    ints (negative ones counted from the end, bools as ints), slices with a
    positive step, non-negative bounds and no bound past the dimension, one
    ellipsis, and an empty list for no rows; refused otherwise, as that
    package refuses it."""
    import numpy as np

    if isinstance(index, list):
        if index:
            raise SafetensorError("Non empty lists are not implemented")
        index = (slice(0, 0),)
    items = index if isinstance(index, tuple) else (index,)
    out: list[Any] = []
    for i, it in enumerate(items):
        if it is Ellipsis:
            if any(x is Ellipsis for x in out):
                raise SafetensorError("Only one ellipsis (...) is allowed in slice index")
            out.append(it)
        elif isinstance(it, (int, np.integer)):
            out.append(int(it))
        elif isinstance(it, slice):
            out.append(it)
        else:
            raise SafetensorError(
                f"Unsupported slice index at position {i}: expected slice, int, or ellipsis"
            )
    given = [x for x in out if x is not Ellipsis]
    if len(given) > len(shape):
        raise SafetensorError(
            f"Error during slicing {index!r} with shape {shape}: more slicing indexes "
            "than dimensions in tensor"
        )
    if Ellipsis in out:
        # An ellipsis stands for a whole slice of each dimension it covers,
        # and those are checked as slices there.
        at = out.index(Ellipsis)
        given = out[:at] + [slice(None)] * (len(shape) - len(given)) + out[at + 1 :]
    for d, x in enumerate(given):
        size = shape[d]
        if isinstance(x, int):
            at = x + size if x < 0 else x
            if at < 0:
                raise SafetensorError(f"Invalid index {x} for dimension {d} of size {size}")
            if at >= size:
                raise SafetensorError(
                    f"index {at} out of bounds for tensor dimension #{d} of size {size}"
                )
            continue
        if x.step is not None and (not isinstance(x.step, int) or x.step <= 0):
            raise SafetensorError(f"Slice step must be a positive integer, got {x.step}")
        for bound in (x.start, x.stop):
            if bound is not None and not isinstance(bound, (int, np.integer)):
                raise TypeError(f"slice bound {bound!r} is not an integer")
            if bound is not None and bound < 0:
                raise OverflowError("can't convert negative int to unsigned")
        start = 0 if x.start is None else x.start
        if start >= size:
            # So even a whole slice of an empty dimension is refused there.
            raise SafetensorError(f"index {start} out of bounds for tensor dimension #{d} of size {size}")
        if x.stop is not None and x.stop > size:
            raise SafetensorError(f"index {x.stop - 1} out of bounds for tensor dimension #{d} of size {size}")
        if x.start is not None and x.stop is not None and x.start > x.stop:
            raise SafetensorError(f"slice {x.start}:{x.stop} of dimension #{d} ends before it begins")
    return tuple(out)


def _first_rows(index: Any, e: _Entry) -> tuple[tuple[int, int], Any] | None:
    """The rows ``[lo, hi)`` of ``e``'s first dimension that ``index``
    selects, and ``index`` for a tensor of those rows only; ``None`` where
    the whole tensor is read (the first index is not a plain int or slice
    of a positive step, or rows are not whole bytes)."""
    import numpy as np

    if not e.shape or (e.end - e.begin) % max(e.shape[0], 1):
        return None
    items = index if isinstance(index, tuple) else (index,)
    if not items:
        return None
    first, rest = items[0], items[1:]
    size = e.shape[0]
    if isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)):
        at = int(first) + size if first < 0 else int(first)
        if not 0 <= at < size:
            return None
        return (at, at + 1), (0, *rest)
    if isinstance(first, slice):
        try:
            start, stop, step = first.indices(size)
        except (TypeError, ValueError):
            return None
        if step <= 0:
            return None
        picked = range(start, stop, step)
        if not picked:
            return (0, 0), (slice(0, 0), *rest)
        return (picked[0], picked[-1] + 1), (slice(0, None, step), *rest)
    return None


# --------------------------------------------------------------------------
# Saving


def _torch_codes() -> dict[Any, str]:
    return {dt: code for code, dt in torch_dtypes().items()}


def _prepare(name: str, value: Any) -> tuple[str, list[int], Any, int]:
    """``value`` as (dtype code, header shape, 1-D uint8 bytes, nbytes)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type not in ("cpu", "cuda"):
            raise SafetensorError(
                errno.EINVAL,
                f"tensor {name!r} is on {value.device}: save_file takes CPU and CUDA tensors "
                "(move it with .cpu() first)",
            )
        if value.layout != torch.strided:
            raise SafetensorError(errno.EINVAL, f"tensor {name!r} is not dense ({value.layout})")
        code = _torch_codes().get(value.dtype)
        if code is None:
            raise SafetensorError(errno.EINVAL, f"tensor {name!r}: dtype {value.dtype} has no safetensors equivalent")
        shape = list(value.shape)
        if code == "F4":
            if not shape:
                raise SafetensorError(
                    errno.EINVAL, f"tensor {name!r}: a 0-dim float4_e2m1fn_x2 tensor has no F4 shape"
                )
            shape[-1] *= 2
        t = value.detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else None
        return code, shape, raw, t.numel() * t.element_size()
    import numpy as np

    if not isinstance(value, np.ndarray):
        raise SafetensorError(
            errno.EINVAL,
            f"tensor {name!r}: a {type(value).__name__} is neither a torch tensor nor a numpy array",
        )
    codes = {dt: code for code, dt in numpy_dtypes().items()}
    code = codes.get(value.dtype.newbyteorder("="))
    if code is None:
        raise SafetensorError(errno.EINVAL, f"tensor {name!r}: dtype {value.dtype} has no safetensors equivalent")
    a = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    raw = a.reshape(-1).view(np.uint8) if a.size else None
    return code, list(value.shape), raw, a.nbytes


def _json(obj: Any) -> str:
    # serde_json's compact form: no spaces, UTF-8 kept, control characters
    # escaped as \n-style or lowercase \u00XX, as Python's encoder does.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def save_file(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Writes ``tensors`` (torch tensors on the CPU or a CUDA device, or
    numpy arrays, by name) to ``path`` in safetensors format, with optional
    string ``metadata``.

    Tensors are made contiguous first; CUDA tensors are written from GPU
    memory by the engine, with no copy to a CPU tensor first. Tensors on
    other devices, sparse tensors and dtypes safetensors lacks raise
    ``SafetensorError``.
    Tensors that share memory are each written in full (the ``safetensors``
    package refuses them).

    The file is byte-identical to ``safetensors.torch.save_file``'s for the
    same tensors and metadata, with two exceptions that come from that
    package: with more than one metadata entry it writes them in the order
    of a Rust ``HashMap`` (which changes from run to run), where this writes
    them in ``metadata``'s order; and for no tensors with ``metadata={}`` it
    writes invalid JSON, where this writes ``{"__metadata__":{}}``. Either
    way both packages read the file back the same.
    """
    path = os.fspath(path)
    if not isinstance(tensors, Mapping):
        raise SafetensorError(errno.EINVAL, f"tensors must be a dict of name to tensor, not a {type(tensors).__name__}")
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise SafetensorError(errno.EINVAL, "metadata must be a dict of strings to strings")

    items = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise SafetensorError(errno.EINVAL, f"tensor name {name!r} is not a string")
        if name == "__metadata__":
            raise SafetensorError(errno.EINVAL, "'__metadata__' cannot name a tensor")
        items.append((name, *_prepare(name, value)))
    # safetensors' order: dtype (by its enum, largest first), then name.
    items.sort(key=lambda it: (-_RANK[it[1]], it[0]))

    parts = []
    if metadata is not None:
        parts.append('"__metadata__":' + _json(dict(metadata)))
    offset = 0
    layout = []
    for name, code, shape, raw, nbytes in items:
        parts.append(
            _json(name)
            + ':{"dtype":'
            + _json(code)
            + ',"shape":'
            + _json(shape)
            + ',"data_offsets":'
            + _json([offset, offset + nbytes])
            + "}"
        )
        layout.append((raw, offset, nbytes))
        offset += nbytes
    try:
        header = ("{" + ",".join(parts) + "}").encode("utf-8")
    except UnicodeEncodeError as e:
        raise SafetensorError(errno.EINVAL, f"a name or metadata string is not valid Unicode ({e})") from None
    header += b" " * (-len(header) % 8)
    start = 8 + len(header)

    with File(path, "w") as f:
        f.write(bytearray(struct.pack("<Q", len(header)) + header), file_offset=0)
        for raw, at, nbytes in layout:
            if nbytes:
                f.write(raw, nbytes, start + at)
