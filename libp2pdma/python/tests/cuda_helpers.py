"""CUDA memory for the tests without torch or CuPy: the driver through
ctypes, device allocations, and two small producers of them, one with
``__cuda_array_interface__`` and one with a hand-built DLPack tensor.

Imported by ``test_cuda.py`` and ``cuda_emu_checks.py`` (not a test module).
"""

from __future__ import annotations

import ctypes
from typing import Any

KDLCPU = 1
KDLCUDA = 2


# --------------------------------------------------------------------------
# DLPack, by hand (dlpack.h, the legacy DLManagedTensor ABI)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


class DLPackTensor:
    """A one-dimensional tensor of ``n`` items of ``bits`` bits at ``ptr``
    (+ ``byte_offset``) on DLPack device ``device``, exported as a legacy
    ``"dltensor"`` capsule. ``streams`` records the ``stream`` argument of
    each ``__dlpack__`` call, ``deleted`` counts the deleter's calls (the
    consumer handing the tensor back), ``on_export`` runs before each
    export (a producer ordering its work for the consumer's stream)."""

    def __init__(
        self,
        ptr: int,
        n: int,
        *,
        device: tuple[int, int] = (KDLCUDA, 0),
        byte_offset: int = 0,
        bits: int = 8,
        strides: list[int] | None = None,
        on_export: Any = None,
    ):
        self.ptr, self.n, self.device = ptr, n, device
        self.byte_offset, self.bits, self.strides = byte_offset, bits, strides
        self.on_export = on_export
        self.streams: list[Any] = []
        self.deleted = 0
        self._alive: list[Any] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        if self.on_export is not None:
            self.on_export(stream)
        shape = (ctypes.c_int64 * 1)(self.n)
        strides = (ctypes.c_int64 * 1)(*self.strides) if self.strides else None
        m = DLManagedTensor()
        m.dl_tensor.data = self.ptr
        m.dl_tensor.device = DLDevice(*self.device)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = DLDataType(1, self.bits, 1)  # kDLUInt
        m.dl_tensor.shape = shape
        m.dl_tensor.strides = strides
        m.dl_tensor.byte_offset = self.byte_offset

        def deleter(_p):
            self.deleted += 1

        m.deleter = DELETER(deleter)
        self._alive.append((m, shape, strides, m.deleter))
        return _capsule_new(ctypes.addressof(m), b"dltensor", None)


def capsule_tensor(capsule: Any) -> DLTensor:
    """The DLTensor a (legacy or versioned) DLPack capsule holds."""
    name = _capsule_name(capsule)
    p = _capsule_pointer(capsule, name)
    if name == b"dltensor_versioned":
        # DLManagedTensorVersioned: version (2 x u32), manager_ctx, deleter,
        # flags (u64), then the DLTensor.
        return DLTensor.from_address(p + 8 + 8 + 8 + 8)
    return DLTensor.from_address(p)


# --------------------------------------------------------------------------
# __cuda_array_interface__


class CudaArray:
    """An object that has only ``__cuda_array_interface__`` (as numba's
    device arrays): ``n`` bytes at ``ptr``, or the dict given."""

    def __init__(self, ptr: int, n: int, *, readonly: bool = False, stream: int | None = None, **over: Any):
        self.interface: dict[str, Any] = {
            "shape": (n,),
            "typestr": "|u1",
            "data": (ptr, readonly),
            "version": 3,
            "strides": None,
            "stream": stream,
        }
        self.interface.update(over)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.interface


# --------------------------------------------------------------------------
# The driver, through ctypes


class Driver:
    """The CUDA driver library at ``path`` (the emulated one), with a context
    current on the thread that made this object."""

    def __init__(self, path: str):
        self.lib = lib = ctypes.CDLL(path)
        P, S, V = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p
        for name, args in {
            "cuInit": [ctypes.c_uint],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(V), ctypes.c_int],
            "cuCtxSetCurrent": [V],
            "cuMemAlloc_v2": [ctypes.POINTER(P), S],
            "cuMemFree_v2": [P],
            "cuMemcpyHtoD_v2": [P, V, S],
            "cuMemcpyDtoH_v2": [V, P, S],
            "cuMemcpyHtoDAsync_v2": [P, V, S, V],
            "cuMemAllocHost_v2": [ctypes.POINTER(V), S],
            "cuMemFreeHost": [V],
            "cuStreamCreate": [ctypes.POINTER(V), ctypes.c_uint],
            "cuStreamDestroy_v2": [V],
            "cuStreamSynchronize": [V],
            "cuCtxSynchronize": [],
        }.items():
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = ctypes.c_int
        self.check(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.current()

    @staticmethod
    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUresult {rc}")

    def current(self) -> None:
        """Makes the context current on the calling thread."""
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def alloc(self, n: int) -> int:
        p = ctypes.c_ulonglong()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), n), "cuMemAlloc")
        return p.value

    def free(self, ptr: int) -> None:
        self.check(self.lib.cuMemFree_v2(ptr), "cuMemFree")

    def htod(self, ptr: int, data: bytes) -> None:
        self.check(self.lib.cuMemcpyHtoD_v2(ptr, data, len(data)), "cuMemcpyHtoD")

    def dtoh(self, ptr: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        if n:
            self.check(self.lib.cuMemcpyDtoH_v2(buf, ptr, n), "cuMemcpyDtoH")
        return buf.raw

    def stats(self) -> dict[str, int]:
        """``cuemuGetStats`` as a dict (the emulated driver only)."""
        names = ["size"]
        for d in ("htod", "dtoh", "dtod"):
            names += [f"{d}_{k}" for k in ("sync_calls", "sync_bytes", "async_calls", "async_bytes", "pageable_calls", "pageable_bytes")]
        names += ["host_alloc", "host_register", "host_unregister", "live_device_allocs", "live_registered", "dmabuf_exports", "no_context"]
        names += [f"peer_{k}" for k in ("sync_calls", "sync_bytes", "async_calls", "async_bytes", "pageable_calls", "pageable_bytes")]
        names += ["peer_enables"]
        raw = (ctypes.c_uint64 * len(names))()
        raw[0] = ctypes.sizeof(raw)
        rc = self.lib.cuemuGetStats(raw)
        assert raw[0] == ctypes.sizeof(raw), "struct cuemu_stats changed: update cuda_helpers.Driver.stats"
        self.check(rc, "cuemuGetStats")
        return dict(zip(names, raw))


class DeviceBuffer:
    """``n`` bytes of device memory from the driver, filled with ``fill``."""

    def __init__(self, driver: Driver, n: int, fill: int = 0x5A):
        self.driver, self.n = driver, n
        self.ptr = driver.alloc(n)
        driver.htod(self.ptr, bytes([fill]) * n)

    def bytes(self, offset: int = 0, n: int | None = None) -> bytes:
        return self.driver.dtoh(self.ptr + offset, self.n - offset if n is None else n)

    def write(self, data: bytes, offset: int = 0) -> None:
        self.driver.htod(self.ptr + offset, data)

    def cai(self, offset: int = 0, n: int | None = None, **kw: Any) -> CudaArray:
        return CudaArray(self.ptr + offset, self.n - offset if n is None else n, **kw)

    def dlpack(self, offset: int = 0, n: int | None = None, **kw: Any) -> DLPackTensor:
        return DLPackTensor(self.ptr, self.n - offset if n is None else n, byte_offset=offset, **kw)

    def free(self) -> None:
        self.driver.free(self.ptr)
