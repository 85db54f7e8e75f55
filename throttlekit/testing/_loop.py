"""A virtual-time asyncio event loop: timers fire at once, in order, without sleeping."""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import math
import selectors
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    _Ts = TypeVarTuple("_Ts")

__all__ = ["SimulationDeadlock", "VirtualEventLoop"]

#: The tolerance asyncio uses to decide that a timer is due.
_RESOLUTION = time.get_clock_info("monotonic").resolution


class SimulationDeadlock(RuntimeError):
    """Nothing can happen any more, yet the simulation is not finished.

    Raised by :func:`~throttlekit.testing.simulate` when requests are still
    waiting although no timer and no other task will ever wake them (a lost
    wake-up), and by :class:`VirtualEventLoop` when it has nothing to run and
    no timer at all.
    """


class _VirtualSelector(selectors.DefaultSelector):
    """A selector that never blocks: a wait for a timer moves the virtual clock instead.

    Real file descriptors (the loop's self-pipe) are still polled without
    blocking, so ``call_soon_threadsafe`` keeps working.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        # (when, order, handle) of every timer scheduled through call_at: the
        # clock jumps exactly to the earliest one, so timer times are exact.
        self.timers: list[tuple[float, int, asyncio.TimerHandle]] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events:
            return events
        timers = self.timers
        while timers and (timers[0][2].cancelled() or timers[0][0] <= self.now):
            heapq.heappop(timers)
        if timeout is None:
            raise SimulationDeadlock(
                f"the event loop has nothing to run and no timer (virtual time {self.now:g})"
            )
        if timeout > 0:
            now = timers[0][0] if timers else self.now + timeout
            if now + _RESOLUTION <= now:
                # Past ~4e6 s a float cannot hold the loop's 1 ns resolution: step
                # one unit further, or asyncio would never see the timer as due.
                now = math.nextafter(now, math.inf)
            self.now = now
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock is virtual and jumps to the next timer when idle.

    ``loop.time()`` starts at 0.0. Whenever no callback is ready, the clock
    advances straight to the earliest scheduled timer, so ``await
    asyncio.sleep(3600)`` returns at once with ``loop.time()`` one hour
    later. Callbacks run in the same order as on a normal loop (FIFO), so a
    program that does no real I/O runs deterministically. When nothing is
    ready and no timer is scheduled, the loop raises :class:`SimulationDeadlock`
    instead of waiting forever.

    Real I/O still works but takes no virtual time: the loop is meant for
    simulations (see :func:`~throttlekit.testing.simulate`), not for talking
    to the network.

    Usage::

        loop = VirtualEventLoop()
        loop.run_until_complete(asyncio.sleep(60))  # returns immediately
        assert loop.time() == 60.0
        loop.close()

    or ``anyio.run(main, backend="asyncio", backend_options={"loop_factory":
    VirtualEventLoop})``.
    """

    def __init__(self) -> None:
        self._clock = _VirtualSelector()  # the selector keeps the virtual time
        super().__init__(self._clock)
        self._timer_order = itertools.count()

    def time(self) -> float:
        """The virtual time in seconds (starts at 0.0)."""
        return self._clock.now

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: Unpack[_Ts],
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        handle = super().call_at(when, callback, *args, context=context)
        heapq.heappush(self._clock.timers, (handle.when(), next(self._timer_order), handle))
        return handle

    def __repr__(self) -> str:
        return f"<VirtualEventLoop time={self.time():g} running={self.is_running()}>"
