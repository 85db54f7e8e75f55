"""Helpers of the async tests: backends by name (virtual time included) and waiting without time.

``backend(name)`` turns a name into what anyio's ``anyio_backend`` fixture
returns: ``"asyncio"`` and ``"trio"`` run in real time; ``"asyncio_virtual"``
(asyncio on :class:`~throttlekit.testing.VirtualEventLoop`) and
``"trio_virtual"`` (trio on a fresh ``MockClock(autojump_threshold=0)``) in
virtual time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.lowlevel
import trio.testing

from throttlekit.testing import VirtualEventLoop

#: What ``anyio_backend`` returns: a backend name, or ``(name, options)``.
AnyioBackend = str | tuple[str, dict[str, Any]]

BACKENDS = ("asyncio", "trio", "asyncio_virtual", "trio_virtual")


def backend(name: str) -> AnyioBackend:
    """The ``anyio_backend`` value of the backend called ``name`` (see :data:`BACKENDS`)."""
    if name == "trio_virtual":
        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})
    if name == "asyncio_virtual":
        return ("asyncio", {"loop_factory": VirtualEventLoop})
    if name not in BACKENDS:
        raise ValueError(f"unknown anyio_backend {name!r}; use one of {BACKENDS}")
    return name


async def until(condition: Callable[[], bool], *, limit: int = 10_000) -> None:
    """Let other tasks run until ``condition()`` holds (without moving virtual time)."""
    for _ in range(limit):
        if condition():
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError("condition never became true")
