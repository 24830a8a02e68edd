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

An error is also what Python and KvikIO would raise for the same failure:

- its errno picks the built-in ``OSError`` subclass, as ``OSError(errno,
  ...)`` itself does: a missing file is a ``FileNotFoundError``, a denied
  open a ``PermissionError``, a directory an ``IsADirectoryError``, and so
  on. The instance's class is derived from both (``Error`` and
  ``FileNotFoundError``, say), so ``except p2pdma.Error`` and ``except
  FileNotFoundError`` both catch it; it keeps its class's name.
- every ``Error`` is a ``RuntimeError``, which is what KvikIO raises for a
  failed open, read or write (its C++ exceptions arrive in Python as
  ``RuntimeError``), and an ``InvalidArgumentError`` a ``ValueError``, as
  KvikIO's argument errors are.
"""

from __future__ import annotations

from typing import Any


class Error(OSError, RuntimeError):
    """A p2pdma operation failed."""

    transfer_path: str | None = None
    reason: str | None = None
    nvme_status: str | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Error:
        # OSError(errno, ...) returns the built-in subclass for errno; a
        # subclass of OSError is left as it is, so this does the same for
        # ours.
        if len(args) >= 2 and isinstance(args[0], int):
            cls = _with_errno(cls, args[0])
        return super().__new__(cls, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError's (with the filename), naming the class pickle can find:
        # the one made for an errno is made again from the errno.
        reduced = super().__reduce__()
        assert isinstance(reduced, tuple)
        made, args, *rest = reduced
        return (type(self).__dict__.get("_errno_of", made), args, *rest)


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


class ClosedFileError(ValueError, RuntimeError):
    """An operation on a closed file: a ``ValueError``, as Python's files
    raise, and a ``RuntimeError``, as KvikIO's closed files raise."""


_BY_ERRNO: dict[tuple[type[Error], int], type[Error]] = {}


def _with_errno(cls: type[Error], number: int) -> type[Error]:
    """``cls``, or the class derived from ``cls`` and the built-in
    ``OSError`` subclass for errno ``number`` (``FileNotFoundError`` for
    ``ENOENT``), made once per pair."""
    if "_errno_of" in cls.__dict__:
        cls = cls.__dict__["_errno_of"]
    builtin = type(OSError(number, ""))
    if builtin is OSError or issubclass(cls, builtin):
        return cls
    key = (cls, number)
    made = _BY_ERRNO.get(key)
    if made is None:
        made = type(
            cls.__name__,
            (cls, builtin),
            {
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__,
                "_errno_of": cls,
            },
        )
        _BY_ERRNO[key] = made
    return made


__all__ = [
    "ClosedFileError",
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
