"""A PyTorch data loader that reads its samples with p2pdma.

    python dataloader.py                           # writes a small dataset first
    python dataloader.py --samples 2048 --batch 128
    python dataloader.py --path data.bin --shape 3,224,224

The file holds fixed-size records back to back, each a float32 sample of
``--shape`` followed by its int64 label (little-endian, no padding): what
``numpy.ndarray.tofile`` writes for the structured dtype ``[("x", "<f4",
shape), ("y", "<i8")]``.

It reads one epoch, in one shuffled order, three ways:

- a map-style ``Dataset`` whose ``__getitem__`` reads a sample with
  ``p2pdma.File.read`` into a freshly allocated tensor, under a
  ``torch.utils.data.DataLoader`` with ``num_workers=0``;
- the same under ``num_workers=2`` (``--workers``): each worker process opens
  the file itself, on first use;
- ``PrefetchingLoader``: every batch is one ``File.pread_batch`` straight into
  the batch's tensors, and the next batch's reads are in flight while the
  current batch is used.

Every batch is checked against numpy's reading of the file
(``numpy.memmap``). Prints samples/s for each way, the bytes the bounce path
moved, and ``checks: passed`` (or what failed; the exit status is then 1).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

import p2pdma

Batch = tuple[torch.Tensor, torch.Tensor]


def record_dtype(shape: Sequence[int]) -> np.dtype[np.void]:
    """One record of the file: a float32 sample of ``shape``, then an int64
    label."""
    return np.dtype([("x", "<f4", tuple(shape)), ("y", "<i8")])


def write_dataset(path: str, samples: int, shape: Sequence[int], seed: int = 0) -> None:
    """Writes ``samples`` records of random normal samples and labels in
    ``[0, 1000)`` to ``path``."""
    rng = np.random.default_rng(seed)
    records = np.empty(samples, dtype=record_dtype(shape))
    records["x"] = rng.standard_normal((samples, *shape), dtype=np.float32)
    records["y"] = rng.integers(0, 1000, samples, dtype=np.int64)
    records.tofile(path)


class RecordFile(Dataset[Batch]):
    """Fixed-size samples stored back to back in one file: item ``i`` is
    ``(sample, label)``, a float32 tensor of ``shape`` and a 0-d int64
    tensor, read by ``p2pdma.File.read``.

    The ``p2pdma.File`` is opened on first use in each process and never
    pickled, so the dataset can go to ``DataLoader`` worker processes
    (forked or spawned): each worker opens the file for itself.
    """

    def __init__(self, path: str | os.PathLike[str], shape: Sequence[int]) -> None:
        self.path = os.fspath(path)
        self.shape = tuple(int(d) for d in shape)
        self.sample_bytes = 4 * math.prod(self.shape)
        self.record_bytes = self.sample_bytes + 8
        size = os.path.getsize(self.path)
        if size % self.record_bytes:
            raise ValueError(
                f"{self.path}: {size} bytes is not a whole number of "
                f"{self.record_bytes}-byte records of shape {self.shape}"
            )
        self.records = size // self.record_bytes
        self._file: p2pdma.File | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.records

    def file(self) -> p2pdma.File:
        """The file, opened by this process on first use."""
        if self._file is None or self._pid != os.getpid():
            self._file = p2pdma.File(self.path)
            self._pid = os.getpid()
        return self._file

    def close(self) -> None:
        """Closes this process's file (it is opened again on next use)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict[str, object]:
        # An open File cannot be pickled; a worker opens its own.
        state = self.__dict__.copy()
        state["_file"] = None
        state["_pid"] = -1
        return state

    def offset(self, index: int) -> int:
        """Where record ``index`` starts in the file."""
        if not 0 <= index < self.records:
            raise IndexError(f"record {index} of {self.records}")
        return index * self.record_bytes

    def __getitem__(self, index: int) -> Batch:
        if index < 0:
            index += self.records
        at = self.offset(index)
        sample = torch.empty(self.shape, dtype=torch.float32)
        label = torch.empty((), dtype=torch.int64)
        f = self.file()
        f.read(sample, file_offset=at)
        f.read(label, file_offset=at + self.sample_bytes)
        return sample, label


class PrefetchingLoader:
    """Batches of a ``RecordFile``, each read by one ``File.pread_batch``
    straight into the batch's tensors, with the next batch's reads in flight
    while the current one is used.

    For each batch of indices (from ``sampler``, default: in order), every
    sample and label is an entry ``(tensor, file_offset)`` of one batch of
    reads. Batch ``k + 1`` is submitted before batch ``k`` is waited for and
    yielded, so storage works while the caller computes. Each batch gets
    tensors of its own: a batch stays valid after the loop moves on.
    """

    def __init__(
        self,
        dataset: RecordFile,
        batch_size: int,
        sampler: Iterable[int] | None = None,
        drop_last: bool = False,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler: Iterable[int] = range(len(dataset)) if sampler is None else sampler
        self.drop_last = drop_last

    def batches(self) -> BatchSampler:
        """The batches of indices, in the order they are read."""
        return BatchSampler(self.sampler, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        return len(self.batches())

    def _submit(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, p2pdma.BatchFuture]:
        """Allocates a batch's tensors and submits all its reads."""
        ds = self.dataset
        samples = torch.empty((len(indices), *ds.shape), dtype=torch.float32)
        labels = torch.empty(len(indices), dtype=torch.int64)
        entries: list[tuple[torch.Tensor, int]] = []
        for j, i in enumerate(indices):
            at = ds.offset(i)
            entries.append((samples[j], at))
            entries.append((labels[j], at + ds.sample_bytes))
        return samples, labels, ds.file().pread_batch(entries)

    def __iter__(self) -> Iterator[Batch]:
        batches = iter(self.batches())
        first = next(batches, None)
        if first is None:
            return
        pending: tuple[torch.Tensor, torch.Tensor, p2pdma.BatchFuture] | None = self._submit(first)
        try:
            while pending is not None:
                following = next(batches, None)
                upcoming = None if following is None else self._submit(following)
                samples, labels, reads = pending
                pending = upcoming
                reads.wait()
                yield samples, labels
        finally:
            # Stopped early: let the reads in flight end before going.
            if pending is not None:
                with contextlib.suppress(OSError):
                    pending[2].wait()


class Checker:
    """Compares batches with numpy's reading of the file, in the order the
    indices were asked for."""

    def __init__(self, dataset: RecordFile) -> None:
        self.reference = np.memmap(dataset.path, dtype=record_dtype(dataset.shape), mode="r")
        self.failures: list[str] = []

    def check(self, mode: str, order: Sequence[int], batches: Iterable[Batch]) -> int:
        """Checks every batch of ``batches`` (the samples of ``order``, in
        that order); returns the samples seen."""
        seen = 0
        for samples, labels in batches:
            indices = np.asarray(order[seen : seen + len(labels)])
            want: npt.NDArray[np.void] = self.reference[indices]
            got_x = samples.numpy().view(np.uint32)
            want_x = np.ascontiguousarray(want["x"]).view(np.uint32)
            if got_x.shape != want_x.shape or not np.array_equal(got_x, want_x):
                self.failures.append(f"{mode}: samples {seen}..{seen + len(labels)} differ")
            if not np.array_equal(labels.numpy(), want["y"]):
                self.failures.append(f"{mode}: labels {seen}..{seen + len(labels)} differ")
            seen += len(labels)
        if seen != len(order):
            self.failures.append(f"{mode}: {seen} samples, expected {len(order)}")
        return seen


def epoch(
    mode: str,
    batches: Iterable[Batch],
    order: Sequence[int],
    checker: Checker | None,
    in_process: bool = True,
) -> None:
    """Iterates one epoch, timed, checking it if asked; prints the rate and,
    where the reads happen ``in_process``, the bytes each path moved
    (worker processes count theirs in their own engines)."""
    before = p2pdma.stats()
    start = time.perf_counter()
    if checker is not None:
        n = checker.check(mode, order, batches)
    else:
        n = sum(len(labels) for _, labels in batches)
    seconds = time.perf_counter() - start
    after = p2pdma.stats()
    moved = ", ".join(
        f"{k} {after[k]['bytes'] - before[k]['bytes']} B"
        for k in after
        if after[k]["bytes"] != before[k]["bytes"]
    )
    where = (moved or "nothing moved") if in_process else "read in the worker processes"
    print(f"{mode:<28} {n} samples in {seconds:.3f} s: {n / max(seconds, 1e-9):9.0f} samples/s ({where})")


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3,32,32"`` as ``(3, 32, 32)``."""
    try:
        shape = tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: expected e.g. 3,32,32") from None
    if not shape or min(shape) <= 0:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: dimensions must be positive")
    return shape


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--path", help="a file of records (default: write a small dataset)")
    parser.add_argument(
        "--samples",
        type=int,
        help="samples to write (default 512), or, with --path, to read (default all)",
    )
    parser.add_argument("--shape", type=parse_shape, default=(3, 32, 32), help="sample shape (default 3,32,32)")
    parser.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the second run (default 2)")
    parser.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare every sample with numpy's reading of the file (default on)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the order (default 0)")
    args = parser.parse_args()
    if args.batch <= 0 or (args.samples is not None and args.samples <= 0):
        parser.error("--batch and --samples must be positive")

    with tempfile.TemporaryDirectory() as tmp:
        path = args.path
        if path is None:
            path = os.path.join(tmp, "records.bin")
            write_dataset(path, args.samples or 512, args.shape, args.seed)
        try:
            dataset = RecordFile(path, args.shape)
        except (OSError, ValueError) as e:
            print(f"dataloader: {e}", file=sys.stderr)
            return 1
        samples = len(dataset) if args.samples is None else min(args.samples, len(dataset))
        generator = torch.Generator().manual_seed(args.seed)
        order: list[int] = torch.randperm(len(dataset), generator=generator)[:samples].tolist()
        checker = Checker(dataset) if args.check else None
        shape = "x".join(map(str, dataset.shape))

        print(f"file:    {path}")
        print(f"samples: {samples} of {len(dataset)}, {shape} float32 + int64 label ({dataset.record_bytes} B each)")
        print(f"batch:   {args.batch}")
        try:
            for workers in (0, args.workers):
                loader = DataLoader(dataset, batch_size=args.batch, sampler=order, num_workers=workers)
                epoch(f"DataLoader (workers={workers})", loader, order, checker, workers == 0)
            epoch("prefetch (pread_batch)", PrefetchingLoader(dataset, args.batch, order), order, checker)
        except p2pdma.Error as e:
            print(f"dataloader: {e}", file=sys.stderr)
            return 1
        finally:
            dataset.close()

        moved = ", ".join(f"{k} {v['bytes']} B" for k, v in p2pdma.stats().items() if v["bytes"])
        print(f"moved:   {moved or 'nothing'} in this process, by path")
        if checker is None:
            print("checks:  skipped (--no-check)")
            return 0
        for failure in checker.failures:
            print(f"FAILED:  {failure}", file=sys.stderr)
        if checker.failures:
            print(f"checks:  FAILED ({len(checker.failures)} problems)")
            return 1
        print(f"checks:  passed ({samples} samples x 3 loaders identical to numpy.memmap)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
