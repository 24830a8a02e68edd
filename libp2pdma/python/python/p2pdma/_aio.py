"""Glue between p2pdma's futures and asyncio (used by ``Future.__await__``)."""

from __future__ import annotations

import asyncio


def complete(aio: asyncio.Future, future) -> None:
    """Runs on the event loop once ``future``'s transfer has ended: hands its
    result (or error) to the asyncio future awaiting it."""
    if aio.done():
        return
    try:
        aio.set_result(future.wait())
    except BaseException as e:  # noqa: BLE001 - the awaiter gets every error
        aio.set_exception(e)


async def gather(futures) -> list[int]:
    """Awaits every future of a batch; raises the first entry's error after
    all have ended."""
    results = await asyncio.gather(*futures, return_exceptions=True)
    counts: list[int] = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        counts.append(r)
    return counts
