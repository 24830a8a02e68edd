"""The exceptions p2pdma raises.

Every error of a transfer is an ``OSError`` (``p2pdma.Error``) that carries:

- ``errno`` and ``strerror``: the errno and the library's message;
- ``filename``: the file or namespace, where there is one;
- ``transfer_path`` and ``reason``: the path the engine took (or would take)
  between that file and that memory, and why ("bounce", "P2P not possible:
  ..."); ``None`` when no transfer was involved;
- ``nvme_status``: the controller's status, for ``NvmeError``;
- ``cuda_call`` and ``cuda_code``: the driver function and its ``CUresult``,
  for ``CudaError``.

Bad arguments are ``InvalidArgumentError``, which is also a ``ValueError``;
objects that are not memory at all raise ``TypeError``.
"""

from __future__ import annotations


class Error(OSError):
    """A p2pdma operation failed."""

    transfer_path: str | None = None
    reason: str | None = None
    nvme_status: str | None = None


class InvalidArgumentError(Error, ValueError):
    """An argument cannot be used: a range outside a buffer or memory, a
    read-only buffer to read into, a bad setting (errno EINVAL)."""


class EndOfFileError(Error):
    """A read reaches past the end of the file (errno ERANGE). Nothing is
    returned short: the read either moves every byte or raises this."""


class PathUnavailableError(Error):
    """The transfer path asked for cannot serve this file and memory (errno
    EOPNOTSUPP); ``reason`` says why."""


class NvmeError(Error):
    """The NVMe controller completed a command with an error status; the
    errno is the one the kernel's block layer gives the same status."""


class ModuleError(Error):
    """The p2pdma kernel module is not loaded, cannot be opened, or speaks
    another ABI."""


class ControllerError(Error):
    """An NVMe controller this process drives failed, timed out or is in
    use."""


class CudaError(Error):
    """A CUDA driver call failed: ``cuda_call`` names the function and
    ``cuda_code`` is its ``CUresult`` (``None`` when the driver lacks the
    function); the message has the status's name and text. errno is
    ``ENOMEM`` for ``CUDA_ERROR_OUT_OF_MEMORY``, ``EIO`` otherwise."""

    cuda_call: str | None = None
    cuda_code: int | None = None


class CudaUnavailableError(CudaError):
    """CUDA cannot be used in this process (errno ``ENODEV``): no driver
    library (``libcuda.so.1``, or the one ``P2PDMA_CUDA_DRIVER`` names), no
    device, or a driver older than 11.7. Raised for CUDA memory (a GPU
    tensor, ``Memory.cuda``) before anything is moved."""


__all__ = [
    "Error",
    "InvalidArgumentError",
    "EndOfFileError",
    "PathUnavailableError",
    "NvmeError",
    "ModuleError",
    "ControllerError",
    "CudaError",
    "CudaUnavailableError",
]
