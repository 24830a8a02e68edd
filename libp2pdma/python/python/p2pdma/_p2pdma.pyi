"""Type stubs for ``p2pdma._p2pdma``, the Rust (PyO3) binding of libp2pdma.

The Python package (``p2pdma``) re-exports these classes and adds what is
plain Python (safetensors, the progress bar). The data flows:

- buffers: a Python object (buffer protocol, DLPack, the CUDA array
  interface, or a ``Memory``) becomes the engine's memory, kept alive while
  a transfer uses it;
- ``File``: a file or namespace and its transfers, KvikIO's ``CuFile``
  shape; ``Future``/``BatchFuture``: transfers in flight;
- ``Engine``: the engine, its counters, routes and the doctor;
- errors: the library's errors as ``OSError`` subclasses
  (``p2pdma.errors``).

Every class is final (none can be subclassed) and immutable from Python.

The aliases (``Buffer``, ``StrPath``, ...), the ``TypedDict`` shapes of the
dicts the binding returns, ``SupportsDLPack`` and
``SupportsCudaArrayInterface`` exist only for type checkers: import them
under ``if typing.TYPE_CHECKING:``.
"""

import os
import sys
from collections.abc import Generator, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, TypeAlias, TypedDict, final, type_check_only

from typing_extensions import CapsuleType, Self, Unpack

if sys.version_info >= (3, 12):
    from collections.abc import Buffer as _BufferProtocol
else:
    from typing_extensions import Buffer as _BufferProtocol

__all__ = [
    "__version__",
    "Engine",
    "File",
    "Future",
    "BatchFuture",
    "Memory",
    "MemoryView",
    "Shape",
    "Store",
    "StreamFuture",
    "default_engine",
    "doctor",
    "submit_batch",
    "route",
    "copy",
    "rust_read_loop",
]

__version__: str

# ---------------------------------------------------------------------------
# Memory a transfer can use.

@type_check_only
class SupportsDLPack(Protocol):
    """An object that exports its memory through DLPack (``__dlpack__``):
    torch tensors, numpy arrays, CuPy arrays, and anything else that speaks
    it. Memory the CPU addresses (``kDLCPU``, ``kDLCUDAHost``) and CUDA
    device memory (``kDLCUDA``) are accepted at run time; CUDA managed
    memory (``kDLCUDAManaged``) and other devices are refused. Where the
    object has ``__dlpack_device__``, the device is checked before the
    tensor is asked for; for ``kDLCUDA`` the producer is asked to order its
    work before the legacy default stream (``stream=1``), which is waited
    for. The tensor must be contiguous (and writable to be read into)."""

    def __dlpack__(self, /) -> Any: ...

@type_check_only
class SupportsCudaArrayInterface(Protocol):
    """An object that describes CUDA device memory with
    ``__cuda_array_interface__`` (versions 2 and 3: CuPy, numba, PyCUDA):
    contiguous (``strides`` ``None`` or C order), not masked, not read-only
    to be read into. A ``stream`` it names is waited for before the
    memory is used."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...

Buffer: TypeAlias = (
    _BufferProtocol | SupportsDLPack | SupportsCudaArrayInterface | Memory | MemoryView
)
"""Memory a transfer moves data into or out of, in order of preference: a
``Memory`` or ``MemoryView`` (the engine sees the memory itself, so P2P is
possible); an object with the buffer protocol (``bytearray``,
``memoryview``, numpy arrays), C-contiguous, holding no Python objects; an
object with DLPack whose memory the CPU addresses (torch CPU tensors) or
that lives on a CUDA device (torch and CuPy GPU tensors); an object with
``__cuda_array_interface__`` (numba). CUDA memory needs the CUDA driver
(``CudaUnavailableError`` otherwise), which the binding asks what the
pointer is: host memory passed off as device memory is refused."""

StrPath: TypeAlias = str | os.PathLike[str]
"""A path: a ``str`` or an ``os.PathLike`` giving one (``bytes`` paths are
refused)."""

TransferPathName: TypeAlias = Literal["p2p", "nvme-cmd", "bounce", "queues", "direct"]
"""A data path the engine moves bytes on."""

PathSetting: TypeAlias = Literal["auto", "p2p", "nvme-cmd", "bounce", "queues"]
"""The engine's ``path`` setting."""

Layout: TypeAlias = Literal["packed", "strided"]
"""Where a strided transfer puts the runs in memory: back to back
(``"packed"``) or mirroring the file (``"strided"``)."""

StridedMode: TypeAlias = Literal["auto", "rc", "sc", "tat"]
"""How a strided transfer moves the runs: chosen by estimate (``"auto"``),
redundant copy of the bounding range (``"rc"``, strided layout only),
selective copy, one I/O per run (``"sc"``), or transfer after transform
through host memory (``"tat"``)."""

Direction: TypeAlias = Literal["r", "w"]
"""A batch entry's direction: read from the file (``"r"``) or write to it
(``"w"``)."""

# ---------------------------------------------------------------------------
# The dicts the binding returns.

@type_check_only
class PathStats(TypedDict):
    """What one path has moved since its engine was made."""

    bytes: int
    """Bytes moved."""
    transfers: int
    """Transfers (calls) served."""
    ios: int
    """I/Os issued to storage."""
    module_ios: int
    """I/Os submitted through the p2pdma module."""
    retries: int
    """Transfers redone (on the bounce path)."""
    storage_seconds: float
    """Seconds spent in storage I/O."""
    copy_seconds: float
    """Seconds spent copying between host memory and the target."""
    total_seconds: float
    """Seconds from the start to the end of the transfers."""

EngineStats = TypedDict(
    "EngineStats",
    {
        "p2p": PathStats,
        "nvme-cmd": PathStats,
        "bounce": PathStats,
        "queues": PathStats,
        "direct": PathStats,
        "page-cache": PathStats,
    },
)
"""What each path of an engine has moved, and what reads copied out of the
page cache (``page-cache``): ``Engine.stats()``."""

@type_check_only
class RouteInfo(TypedDict):
    """The route between two ends: ``Engine.route()``."""

    hops: list[str]
    """The hops, in words, in order."""
    reason: str
    """Why this route."""

@type_check_only
class CopyReport(TypedDict):
    """What ``Engine.copy()`` did."""

    bytes: int
    """Bytes moved (always the size asked for)."""
    hops: list[str]
    """The hops, in words, in order."""
    chunk: int
    """The chunk size used, in bytes."""
    chunks: int
    """The number of chunks."""
    seconds: float
    """The whole copy's time."""

@type_check_only
class StridedReport(TypedDict):
    """What ``File.read_strided()`` or ``File.write_strided()`` did."""

    mode: Literal["rc", "sc", "tat"]
    """The mode that moved the runs."""
    reason: str
    """Why that mode (AUTO's estimate, or that it was asked for)."""
    bytes: int
    """Bytes of interest moved."""
    storage_bytes: int
    """Bytes read from storage, with the block rounding of each read; for
    writes, the bytes written."""
    calls: int
    """Engine transfers issued."""
    paths: list[TransferPathName]
    """The paths the transfers took, each once, in the order first seen."""
    retried: bool
    """Whether a transfer was redone on the bounce path."""

@type_check_only
class EngineSettings(TypedDict, total=False):
    """The settings ``Engine(**settings)`` takes (each is passed on as
    ``str(value)``, as in a ``P2PDMA_CONFIG`` file); an unknown key or a bad
    value raises ``InvalidArgumentError``."""

    path: PathSetting | Literal["nvme_cmd", "nvmecmd"]
    """auto, p2p, nvme-cmd, bounce or queues."""
    chunk: int | str
    """Bytes per I/O, 4 KiB to 64 MiB (``65536``, ``"64K"``, ``"2M"``)."""
    depth: int | str
    """I/Os in flight, 1 to 256."""
    page_cache: Literal["auto", "direct", "buffered", "off", "on", "bypass"]
    """Whether reads take what the page cache holds from it (``"auto"``),
    move every byte by the path (``"direct"``) or read everything through
    the page cache (``"buffered"``)."""
    p2p_submit: Literal["auto", "odirect", "o_direct"]
    """How P2P I/O is submitted: the module's block I/O where it can
    (``"auto"``), or always ``O_DIRECT`` on the memory's mapping."""
    copy_threads: int | str
    """Copy threads, 1 to 64, or ``"auto"``."""
    cache_dir: str | os.PathLike[str]
    """Where learned geometry is cached: a directory, ``"default"``, or
    ``"off"``/``"none"``."""
    strided_call: str
    """Per-call cost of a strided I/O (``"85us"``) or ``"auto"``."""
    strided_storage_rate: int | str
    """Storage bytes per second (``"2G"``, ``"800M/s"``) or ``"auto"``."""
    strided_copy_rate: int | str
    """Copy bytes per second or ``"auto"``."""
    strided_pack_rate: int | str
    """Pack bytes per second or ``"auto"``."""
    strided_copy_call: str
    """Per-call cost of a copy or ``"auto"``."""
    strided_call_mib: str
    """Cost of a call per MiB or ``"auto"``."""

@type_check_only
class DoctorCheck(TypedDict):
    """One fact the doctor looked at."""

    name: str
    """What was checked."""
    status: Literal["ok", "warn", "fail", "skip"]
    """How it came out."""
    detail: str
    """What was found, in words."""

@type_check_only
class DoctorNvmeCmd(TypedDict):
    """Whether the NVMe command path is possible (it is never chosen without
    being asked for)."""

    possible: bool
    device: str | None
    """The NVMe generic device it would use."""

@type_check_only
class DoctorFsDevice(TypedDict):
    """The device a file's file system lives on."""

    name: str
    dev: str

@type_check_only
class DoctorPartition(TypedDict):
    """A partition of a disk."""

    name: str
    """Its block device name (e.g. ``nvme0n1p2``)."""
    number: int
    """Its number on the disk."""
    start: int
    """Where it starts on the disk, in bytes."""
    size: int
    """Its size in bytes."""

@type_check_only
class DoctorTransport(TypedDict):
    """How an NVMe controller reaches its subsystem."""

    kind: str
    """``pcie``, ``tcp``, ``rdma``, ``fc`` or ``loop``."""
    address: str | None
    """Over a fabric, the target's address as the kernel prints it
    (``traddr=10.0.2.2,trsvcid=4420``)."""
    subsysnqn: str | None
    """The NVMe subsystem's NQN."""
    state: str | None
    """The controller's state (``live``, ``connecting``, ...)."""

@type_check_only
class DoctorNvmePath(TypedDict):
    """One path of a multipath NVMe namespace."""

    name: str
    """The path's device name (e.g. ``nvme0c1n1``)."""
    controller: str | None
    """The NVMe controller (e.g. ``nvme1``)."""
    pci: str | None
    """The controller's PCI function."""
    transport: DoctorTransport | None
    """How the controller reaches the subsystem, when sysfs says."""

@type_check_only
class DoctorStorage(TypedDict):
    """The storage behind the path given to the doctor."""

    given: str
    kind: Literal["file", "block", "nvme-generic"]
    fs_device: DoctorFsDevice | None
    disk: str
    disk_path: str
    partition: DoctorPartition | None
    generic_path: str | None
    nsid: int | None
    logical_block_size: int
    max_transfer_bytes: int
    controller: str | None
    pci: str | None
    transport: DoctorTransport | None
    is_nvme: bool
    slaves: list[str]
    multipath: list[DoctorNvmePath]
    metadata_bytes: int
    integrity: str | None
    nvme_cmd_refusal: str | None

@type_check_only
class DoctorAccelerator(TypedDict):
    """The accelerator, as the module registered it."""

    index: int
    pci: str
    vendor: str
    """PCI vendor ID, four hex digits."""
    device: str
    """PCI device ID, four hex digits."""
    bar: int
    """The BAR registered as P2P memory."""
    bar_size: int
    bar_bus_addr: int
    p2p_size: int
    """Bytes registered as P2P memory."""
    p2p_available: int
    """Bytes still free."""
    numa_node: int | None

@type_check_only
class DoctorP2pQuery(TypedDict):
    """The kernel's answer to whether a peer can reach the memory by P2P."""

    peer: str
    """The PCI function the peer resolved to."""
    map_type: str
    """How the peer would reach the memory."""
    distance: int | None
    """The kernel's P2P distance; ``None`` when P2P is not supported."""
    reason: str
    """Why, in the kernel's words."""

@type_check_only
class DoctorP2pPath(DoctorNvmePath):
    """A multipath namespace's path and the kernel's answer for its
    controller."""

    p2p: DoctorP2pQuery | None

@type_check_only
class DoctorReport(TypedDict):
    """The doctor's report: ``doctor()``."""

    checks: list[DoctorCheck]
    """Every check, in the order made."""
    path: TransferPathName
    """The data path AUTO would take."""
    reason: str
    """Why."""
    nvme_cmd: DoctorNvmeCmd
    storage: DoctorStorage | None
    """The storage, if it resolved."""
    accelerator: DoctorAccelerator | None
    """The accelerator, if the module has it."""
    p2p: DoctorP2pQuery | None
    """The kernel's P2P answer, if it was asked."""
    p2p_paths: list[DoctorP2pPath]
    """For a multipath namespace: each path and the kernel's answer."""

# ---------------------------------------------------------------------------
# Batch entries.

ReadEntry: TypeAlias = tuple[Buffer, int] | tuple[Buffer, int, int | None]
"""A ``File.pread_batch`` entry: ``(buf, file_offset)`` or
``(buf, file_offset, size)`` (a tuple; ``size`` ``None``: the whole
buffer)."""

BatchEntry: TypeAlias = (
    tuple[File, Direction, Buffer, int] | tuple[File, Direction, Buffer, int, int | None]
)
"""A ``submit_batch`` entry: ``(file, "r" or "w", buf, file_offset[, size])``
(a tuple or a list)."""

# ---------------------------------------------------------------------------
# Classes.

@final
class Engine:
    """The transfer engine: picks the path for each file and memory, moves
    the bytes, counts what each path did."""

    def __new__(cls, **settings: Unpack[EngineSettings]) -> Self:
        """An engine with these settings over the environment's (``path``:
        auto, p2p, nvme-cmd, bounce or queues; ``page_cache``: auto, direct
        or buffered; ``chunk``: bytes per I/O; ``depth``: I/Os in flight;
        ``copy_threads``; and the other keys of ``P2PDMA_CONFIG`` files)."""

    @property
    def path(self) -> PathSetting:
        """The path setting: auto, p2p, nvme-cmd, bounce or queues."""

    @property
    def page_cache(self) -> Literal["auto", "direct", "buffered"]:
        """Whether reads take what the page cache holds from it: auto, direct
        or buffered."""

    @property
    def has_module(self) -> bool:
        """Whether the p2pdma module is open (accelerator memory and P2P need
        it)."""

    def stats(self) -> EngineStats:
        """What each path has moved since the engine was made: a dict of
        ``p2p``, ``nvme-cmd``, ``bounce``, ``queues``, ``direct`` (host
        memory, read and written by ``O_DIRECT`` with no staging copy),
        each with ``bytes``,
        ``transfers``, ``ios``, ``module_ios``, ``retries`` and seconds
        spent; and ``page-cache``, the bytes reads copied out of the page
        cache."""

@final
class File:
    """A file or block device (an NVMe namespace, a partition) opened for
    transfers.

    Reads and writes have ``pread``/``pwrite`` semantics: they move every
    byte asked for or raise, and a read past the end of the file raises
    ``EndOfFileError`` instead of returning a short count. A ``File`` cannot
    be pickled: open it again in another process."""

    def __new__(cls, file: StrPath, flags: str = "r", *, engine: Engine | None = None) -> Self:
        """Opens ``file`` (a path to a file, or to a block device such as an
        NVMe namespace or a partition) as KvikIO's ``CuFile(file, flags)``
        does: ``flags`` ``"r"``, ``"r+"``, ``"w"`` (create or truncate,
        write only) or ``"w+"``. ``engine``: the engine to use (the default
        engine when omitted)."""

    def read(
        self,
        buf: Buffer,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
        *,
        buf_offset: int = 0,
    ) -> int:
        """Reads ``size`` bytes (the rest of ``buf`` when omitted) at
        ``file_offset`` into ``buf`` (at ``buf_offset``); returns the bytes
        read, always ``size``. ``task_size`` is accepted for KvikIO's
        programs: the engine cuts transfers itself (``Engine(chunk=...)``)."""

    def write(
        self,
        buf: Buffer,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
        *,
        buf_offset: int = 0,
    ) -> int:
        """Writes ``size`` bytes of ``buf`` (from ``buf_offset``) at
        ``file_offset``; returns the bytes written, always ``size``."""

    def pread(
        self,
        buf: Buffer,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
        *,
        buf_offset: int = 0,
    ) -> Future:
        """``read`` in the background: returns a ``Future`` (``wait()``,
        ``get()``, ``done()``, or ``await`` it)."""

    def pwrite(
        self,
        buf: Buffer,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
        *,
        buf_offset: int = 0,
    ) -> Future:
        """``write`` in the background: returns a ``Future``."""

    def raw_read(
        self,
        buf: Buffer,
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> int:
        """KvikIO's ``raw_read``: ``size`` bytes at ``file_offset`` into
        ``buf`` at ``dev_offset``, in one call; returns the bytes read."""

    def raw_write(
        self,
        buf: Buffer,
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> int:
        """KvikIO's ``raw_write``: ``size`` bytes of ``buf`` from
        ``dev_offset`` at ``file_offset``; returns the bytes written."""

    def raw_read_async(
        self,
        buf: Buffer,
        raw_stream: int,
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> StreamFuture:
        """KvikIO's ``raw_read_async``: the read in the order of
        ``raw_stream`` (a ``CUstream`` of ``buf``'s device, 0 the legacy
        default stream): the stream's queued work is waited for, then the
        data is read, and it has landed when the call returns. CUDA memory
        only, as in KvikIO."""

    def raw_write_async(
        self,
        buf: Buffer,
        raw_stream: int,
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> StreamFuture:
        """KvikIO's ``raw_write_async``: the write in the order of
        ``raw_stream``, as ``raw_read_async``."""

    def pread_batch(self, entries: Iterable[ReadEntry]) -> BatchFuture:
        """Many reads at once: ``entries`` is a list of ``(buf,
        file_offset)`` or ``(buf, file_offset, size)``; returns a
        ``BatchFuture``. Every entry is checked before any is submitted."""

    def read_strided(
        self,
        buf: Buffer,
        shape: Shape,
        layout: Layout = "packed",
        mode: StridedMode = "auto",
        buf_offset: int = 0,
    ) -> StridedReport:
        """Reads the runs of ``shape`` (a ``Shape``) into ``buf`` from
        ``buf_offset``: back to back (``layout="packed"``) or mirroring the
        file (``"strided"``); ``mode``: auto, rc, sc or tat. Returns what it
        did."""

    def write_strided(
        self,
        buf: Buffer,
        shape: Shape,
        layout: Layout = "packed",
        mode: StridedMode = "auto",
        buf_offset: int = 0,
    ) -> StridedReport:
        """Writes ``buf``'s runs to the places ``shape`` names."""

    def path_for(self, buf: Buffer) -> tuple[TransferPathName, str]:
        """The path the engine takes between this file and ``buf``, and why:
        ``(path, reason)``."""

    def size(self) -> int:
        """The file's size in bytes now."""

    def fileno(self) -> int:
        """The file's descriptor, opened with the flags given and without
        ``O_DIRECT``, as KvikIO's: ``os.pread`` and the like work on it."""

    def open_flags(self) -> int:
        """The flags of ``fileno()``'s descriptor (``fcntl(F_GETFL)``, see
        ``open(2)``)."""

    def is_direct_io_supported(self) -> bool:
        """Whether transfers with this file can use direct I/O."""

    def sync(self) -> None:
        """Flushes written data to stable storage (``fdatasync``, or NVMe
        Flush)."""

    @property
    def path(self) -> Path:
        """The path it was opened with."""

    @property
    def flags(self) -> str:
        """The flags it was opened with."""

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""

    def close(self) -> None:
        """Closes the file. Transfers in flight keep it open until they
        end."""

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None: ...

@final
class StreamFuture:
    """KvikIO's ``IOFutureStream``: what ``raw_read_async`` and
    ``raw_write_async`` return. Made by the binding only."""

    def check_bytes_done(self) -> int:
        """The bytes moved (the transfer has ended, in the stream's
        order)."""

@final
class Future:
    """A transfer in flight (``File.pread``, ``File.pwrite``). It keeps the
    memory and the file its transfer uses until the transfer ends, even if
    Python lets go of them. Awaiting it does not take a thread. Made by the
    binding only; it has no constructor."""

    def done(self) -> bool:
        """Whether the transfer has ended."""

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the transfer (at most ``timeout`` seconds) and returns
        the bytes moved, or raises its error; ``TimeoutError`` if it is
        still running at the deadline."""

    def get(self) -> int:
        """KvikIO's name for ``wait()``."""

    @property
    def size(self) -> int:
        """The bytes the transfer moves when it succeeds."""

    def __await__(self) -> Generator[Any, None, int]:
        """Awaits the transfer from a running asyncio event loop; gives the
        bytes moved, or raises its error."""

@final
class BatchFuture:
    """Several transfers in flight (``File.pread_batch``,
    ``submit_batch``). Made by the binding only; it has no constructor."""

    @property
    def futures(self) -> list[Future]:
        """The futures, one per entry, in order."""

    def done(self) -> bool:
        """Whether every transfer has ended."""

    def wait(self) -> list[int]:
        """Waits for every transfer and returns their byte counts in order;
        raises the first entry's error (in entry order) after all have
        ended, so no buffer is still being written when it is raised."""

    def get(self) -> list[int]:
        """KvikIO's name for ``wait()``."""

    def __len__(self) -> int: ...
    def __await__(self) -> Generator[Any, None, list[int]]:
        """Awaits every transfer from a running asyncio event loop; gives
        their byte counts in order, or raises the first entry's error after
        all have ended."""

@type_check_only
class CacheStats(TypedDict):
    """A store's page cache counters (``Store.cache_stats``)."""

    hits: int
    misses: int
    remote: int
    invalidations: int
    frames: int
    cached: int
    dirty: int

@final
class Store:
    """Objects on a file or block device, read and written by id
    (``docs/store.md``), with a page cache in a ``Memory`` (host,
    accelerator or GPU memory) when one is given. Reads and writes move
    every byte asked for or raise; a range past an object's end raises and
    moves nothing. One ``Store`` per file at a time."""

    @staticmethod
    def format(
        path: StrPath,
        max_objects: int = 1024,
        *,
        size: int | None = None,
        cache: Memory | Sequence[Memory] | None = None,
        page: int = 65536,
        write_through: bool = False,
        engine: Engine | None = None,
    ) -> Store:
        """Formats ``path`` (a file or a block device) as an empty store
        for up to ``max_objects`` objects. With ``size``, a file is created
        if missing and made at least ``size`` bytes long. With ``cache``,
        a ``Memory`` whose whole length holds the page cache's frames of
        ``page`` bytes (a power of two from 4 KiB to 2 MiB), written back
        on ``flush`` (or through, with ``write_through``); or a sequence of
        ``Memory``, one per accelerator, for a cache they share (a miss on
        one is filled from another's copy, GPU to GPU, where one holds the
        page)."""

    @staticmethod
    def open(
        path: StrPath,
        *,
        cache: Memory | Sequence[Memory] | None = None,
        page: int = 65536,
        write_through: bool = False,
        engine: Engine | None = None,
    ) -> Store:
        """Opens the store on ``path`` (see ``format`` for the cache)."""

    def create(self, size: int) -> int:
        """A new object of ``size`` bytes (zeros); its id."""

    def delete(self, id: int) -> None:
        """Deletes object ``id``."""

    def size(self, id: int) -> int:
        """Object ``id``'s size in bytes."""

    def objects(self) -> list[tuple[int, int]]:
        """Every object, as ``(id, size)`` pairs."""

    def read(self, id: int, buf: Buffer, offset: int = 0, size: int | None = None, *, buf_offset: int = 0) -> int:
        """Reads object ``id`` from ``offset`` into ``buf``, ``size`` bytes
        (default: the buffer's length from ``buf_offset``); returns the
        bytes read."""

    def write(self, id: int, buf: Buffer, offset: int = 0, size: int | None = None, *, buf_offset: int = 0) -> int:
        """Writes ``buf`` to object ``id`` at ``offset``; returns the bytes
        written. Durable after the next ``flush``."""

    def flush(self) -> None:
        """Makes every write that returned durable."""

    def cache_stats(self) -> CacheStats | None:
        """The page cache's counters, or ``None`` without a cache."""

@final
class Memory:
    """Accelerator memory, CUDA device memory, or the host-memory device.

    It says where it lives through DLPack: the host-memory device is
    ``kDLCPU``; accelerator BAR memory is ``kDLExtDev`` with the
    accelerator's index; CUDA memory is ``kDLCUDA`` with the device's
    ordinal (``torch.from_dlpack(mem)`` is a CUDA tensor), and has
    ``__cuda_array_interface__``. Where the CPU can map the memory,
    ``view()`` gives a ``MemoryView`` that is ``kDLCPU``; a view of CUDA
    memory is a range on the device. Made by ``Memory.host``,
    ``Memory.accelerator`` or ``Memory.cuda``; it has no constructor."""

    @staticmethod
    def host(size: int) -> Memory:
        """``size`` bytes of zeroed, page-aligned host memory standing in for
        an accelerator (the host-memory device)."""

    @staticmethod
    def accelerator(size: int, index: int = 0, align: int = 0) -> Memory:
        """``size`` bytes of accelerator ``index``'s memory from the p2pdma
        module, its bus address aligned to ``align`` (0: a page). The bytes
        are zeroed."""

    @staticmethod
    def cuda(size: int, ordinal: int = 0) -> Memory:
        """``size`` bytes of zeroed device memory on CUDA device ``ordinal``
        (``cuMemAlloc`` in the device's primary context, the one torch and
        CuPy use). Raises ``CudaUnavailableError`` where there is no CUDA
        driver or device."""

    @property
    def size(self) -> int:
        """Size in bytes."""

    def __len__(self) -> int: ...
    @property
    def kind(self) -> str:
        """What the memory is, in words."""

    @property
    def device(self) -> str:
        """``"cpu"`` for the host-memory device, ``"accel:N"`` for
        accelerator N, ``"cuda:N"`` for CUDA device N."""

    def write(self, buf: Buffer, offset: int = 0) -> int:
        """Copies ``buf`` (any buffer or tensor, on the CPU or a CUDA device)
        into the memory at ``offset``."""

    def read(self, buf: Buffer, offset: int = 0) -> int:
        """Copies the memory at ``offset`` into ``buf``, filling it."""

    def to_bytes(self, offset: int = 0, size: int | None = None) -> bytes:
        """``size`` bytes from ``offset`` as ``bytes`` (a copy)."""

    def view(self, offset: int = 0, size: int | None = None) -> MemoryView:
        """A view of ``size`` bytes from ``offset``: through the CPU mapping,
        for numpy and torch (``numpy.from_dlpack(mem.view())``), where reads
        and writes are CPU loads and stores on the memory; for CUDA memory,
        a range on the device (``torch.from_dlpack(mem.view(...))`` is a
        CUDA tensor). Also a target for transfers, like the memory
        itself."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA memory as a one-dimensional ``uint8`` array of the CUDA array
        interface (CuPy, numba); other memory has none
        (``AttributeError``)."""

    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        """The whole memory as a one-dimensional ``uint8`` DLPack tensor on
        its own device (see ``__dlpack_device__``)."""

@final
class MemoryView:
    """A range of a ``Memory``: seen through its CPU mapping (``kDLCPU``),
    or on the device for CUDA memory (``kDLCUDA``). Made by
    ``Memory.view``; it has no constructor."""

    @property
    def size(self) -> int:
        """Size in bytes."""

    def __len__(self) -> int: ...
    @property
    def offset(self) -> int:
        """The viewed memory's offset."""

    @property
    def write_combined(self) -> bool:
        """Whether the mapping is write-combined (accelerator BAR memory):
        CPU stores stream, CPU loads are uncached and slow."""

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """The view as numpy's array interface (a ``uint8`` vector at its CPU
        address), for consumers that take that instead of DLPack, and for
        tools that need the address (ctypes, ``/proc/self/pagemap``). A
        view of CUDA memory has none (``AttributeError``)."""
        ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """A view of CUDA memory as a one-dimensional ``uint8`` array of the
        CUDA array interface (CuPy, numba, and for the device address);
        views through the CPU mapping have none (``AttributeError``)."""
        ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        """The range as a one-dimensional ``uint8`` DLPack tensor: on the
        CPU, or on the CUDA device for a view of CUDA memory."""

@final
class Shape:
    """Runs of ``run`` bytes, the first at ``base``, the others found by
    stepping through ``dims``: ``(stride, count)`` pairs, innermost first,
    at most three. A column range of a row-major table is
    ``Shape(table_offset + first column byte, width, [(row_pitch,
    rows)])``."""

    def __new__(cls, base: int, run: int, dims: Sequence[tuple[int, int]] = ...) -> Self: ...
    @property
    def base(self) -> int:
        """The first run's file offset."""

    @property
    def run(self) -> int:
        """Bytes per run."""

    @property
    def dims(self) -> list[tuple[int, int]]:
        """The dimensions, ``(stride, count)``, innermost first."""

    @property
    def runs(self) -> int:
        """Number of runs."""

    @property
    def nbytes(self) -> int:
        """Bytes of interest (runs times run length): what a packed layout
        needs."""

    @property
    def bounding_len(self) -> int:
        """Bytes from the first run's start to the last run's end: what a
        strided layout needs."""

    def runs_list(self) -> list[tuple[int, int]]:
        """Each run's ``(file_offset, length)``, in file order."""

# ---------------------------------------------------------------------------
# Functions.

def route(
    src: File | Buffer,
    dst: File | Buffer,
    src_offset: int = 0,
    dst_offset: int = 0,
    engine: Engine | None = None,
) -> RouteInfo:
    """The route from ``src`` to ``dst`` (each a ``File``, a ``Memory`` or a
    buffer) that ``engine`` (the default engine when omitted) would take:
    ``{"hops": [...], "reason": ...}``."""

def copy(
    src: File | Buffer,
    dst: File | Buffer,
    size: int,
    src_offset: int = 0,
    dst_offset: int = 0,
    chunk: int | None = None,
    engine: Engine | None = None,
) -> CopyReport:
    """Copies ``size`` bytes from ``src`` to ``dst`` along the route
    (storage to memory, memory to storage, memory to memory, storage to
    storage), stages overlapped, with ``engine`` (the default engine when
    omitted). Returns what it did."""

def default_engine() -> Engine:
    """The engine ``File``s use when given none, made from the environment
    on first use."""

def doctor(storage: StrPath | None = None, accel: int | str | None = None) -> DoctorReport:
    """The doctor's report on this machine, for ``storage`` (a file or block
    device, optional) and accelerator ``accel`` (an index or a PCI address;
    the first when omitted), as a dict: every check with its status and
    detail, the path AUTO would take and why."""

def submit_batch(entries: Iterable[BatchEntry]) -> BatchFuture:
    """Transfers across files at once: ``entries`` is a list of ``(file, "r"
    or "w", buf, file_offset[, size])``; returns a ``BatchFuture``. Every
    entry is checked before any is submitted."""

def rust_read_loop(file: File, buf: Buffer, size: int, offsets: Sequence[int]) -> float:
    """Reads ``size`` bytes into ``buf`` from each offset of ``offsets`` in
    turn, with the engine of ``file``, from a Rust loop; returns the seconds
    taken."""
