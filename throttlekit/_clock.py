"""Reading the running async backend's clock cheaply."""

from __future__ import annotations

import time
from asyncio import _get_running_loop

import anyio

__all__ = ["now", "now_or_monotonic"]


def now() -> float:
    """The running backend's clock, as ``anyio.current_time()`` reads it, but cheaper.

    On asyncio that is the running loop's ``time()``; anyio's own lookup goes
    through sniffio on every call, which is most of the cost of an
    uncontended acquire, so the asyncio case is taken directly.
    """
    loop = _get_running_loop()
    if loop is not None:
        return loop.time()
    return anyio.current_time()


def now_or_monotonic() -> float:
    """The backend's clock, or the monotonic clock outside an event loop (statistics)."""
    try:
        return now()
    except Exception:
        return time.monotonic()
