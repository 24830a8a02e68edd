"""p2pdma: files and NVMe namespaces into accelerator memory by peer-to-peer
DMA, from Python.

The shape is KvikIO's, so that switching takes little change::

    import numpy as np
    import p2pdma

    with p2pdma.File("/data/shard-0") as f:
        a = np.empty(1 << 20, dtype=np.uint8)
        f.read(a)                        # blocks, returns the bytes read
        fut = f.pread(a, file_offset=4096)
        fut.get()                        # or fut.wait(), or `await fut`

    mem = p2pdma.Memory.accelerator(64 << 20)   # accelerator memory
    with p2pdma.File("/dev/nvme0n1") as f:
        f.read(mem)                      # by P2P where the kernel allows it
        print(f.path_for(mem))           # the path, and why

    t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    with p2pdma.File("/data/shard-0") as f:
        f.read(t)                        # straight into GPU memory

Buffers are anything with the buffer protocol (``bytearray``, ``memoryview``,
numpy arrays), anything with DLPack whose memory the CPU addresses (torch CPU
tensors), CUDA device memory (torch and CuPy GPU tensors, through DLPack or
``__cuda_array_interface__``), and ``p2pdma.Memory`` (accelerator memory,
CUDA memory, or the host-memory device where there is no accelerator).
Errors are ``OSError`` subclasses (``p2pdma.errors``).
``p2pdma.safetensors.load_file`` loads model weights straight into the
target memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import errors
from ._p2pdma import (
    BatchFuture,
    Engine,
    File,
    Future,
    Memory,
    MemoryView,
    Shape,
    Store,
    StreamFuture,
    __version__,
    copy,
    default_engine,
    doctor,
    route,
    submit_batch,
)
from .errors import (
    ClosedFileError,
    ControllerError,
    CudaError,
    CudaUnavailableError,
    EndOfFileError,
    Error,
    InvalidArgumentError,
    ModuleError,
    NvmeError,
    PathUnavailableError,
)

if TYPE_CHECKING:
    from ._p2pdma import EngineStats

#: KvikIO's name for a file opened for transfers.
CuFile = File


def stats() -> EngineStats:
    """What each path of the default engine has moved: ``{"p2p": {...},
    "nvme-cmd": {...}, "bounce": {...}, "queues": {...}, "direct": {...},
    "page-cache": {...}}``."""
    return default_engine().stats()


__all__ = [
    "BatchFuture",
    "ClosedFileError",
    "ControllerError",
    "CuFile",
    "CudaError",
    "CudaUnavailableError",
    "EndOfFileError",
    "Engine",
    "Error",
    "File",
    "Future",
    "InvalidArgumentError",
    "Memory",
    "MemoryView",
    "ModuleError",
    "NvmeError",
    "PathUnavailableError",
    "Shape",
    "Store",
    "StreamFuture",
    "__version__",
    "copy",
    "default_engine",
    "doctor",
    "errors",
    "route",
    "stats",
    "submit_batch",
]
