"""The exceptions p2pdma raises.

Every error of a transfer is an ``OSError`` (``p2pdma.Error``) that carries:

- ``errno`` and ``strerror``: the errno and the library's message;
- ``filename``: the file or namespace, where there is one;
- ``transfer_path`` and ``reason``: the path the engine took (or would take)
  between that file and that memory, and why ("bounce", "P2P not possible:
  ..."); ``None`` when no transfer was involved;
- ``nvme_status``: the controller's status, for ``NvmeError``.

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


__all__ = [
    "Error",
    "InvalidArgumentError",
    "EndOfFileError",
    "PathUnavailableError",
    "NvmeError",
    "ModuleError",
    "ControllerError",
]
