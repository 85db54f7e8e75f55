"""Reading the running async backend's clock, and its running task, cheaply."""

from __future__ import annotations

import time
from asyncio import BaseEventLoop, _get_running_loop
from asyncio import current_task as _asyncio_task
from asyncio import tasks as _asyncio_tasks
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from threading import get_ident
from typing import Any

import anyio

__all__ = [
    "current_loop",
    "current_task",
    "now",
    "now_or_monotonic",
    "simulated_wall",
    "tasks",
    "wall",
    "wall_ahead",
]

#: The epoch seconds a simulation's wall clock shows at its virtual time 0
#: (set by :func:`throttlekit.testing.simulate`), or ``None``: the real clock.
_wall_epoch: ContextVar[float | None] = ContextVar("throttlekit_wall_epoch", default=None)

_STOCK_TIME = BaseEventLoop.time

#: The task each asyncio loop is running, as asyncio keeps it (up to Python
#: 3.13; later versions keep it elsewhere and leave this empty, and
#: current_task() then asks asyncio).
tasks: Mapping[Any, Any] = getattr(_asyncio_tasks, "_current_tasks", {})


class _NoLoop:
    """Stands for "no loop found yet": running in no thread."""

    _thread_id = None


# The asyncio loop last found running and its clock, replaced as one tuple so
# that another thread's update is never seen half done. A loop runs in one
# thread at a time and a thread runs one loop at a time, so while that loop's
# ``_thread_id`` is the current thread, it is the running loop: checking that
# avoids ``_get_running_loop()``, which makes a getpid() system call per call
# on Python 3.11. (Before any loop is found, a stand-in whose thread is none.)
_running: tuple[Any, Callable[[], float]] = (_NoLoop(), time.monotonic)


def now() -> float:
    """The running backend's clock, as ``anyio.current_time()`` reads it, but cheaper.

    On asyncio that is the running loop's ``time()``: ``time.monotonic()``
    itself when the loop keeps asyncio's own clock, so virtual-time loops
    (which override ``time()``) still drive it. anyio's own lookup goes
    through sniffio on every call, which is most of the cost of an
    uncontended acquire, so the asyncio case is taken directly.
    """
    loop, clock = _running
    if loop._thread_id == get_ident():
        return clock()
    return _find_clock()


def _find_clock() -> float:
    global _running
    loop = _get_running_loop()
    if loop is None:
        return anyio.current_time()
    clock = time.monotonic if type(loop).time is _STOCK_TIME else loop.time
    if getattr(loop, "_thread_id", None) == get_ident():  # uvloop has none: not cached
        _running = (loop, clock)
    return clock()


def current_task() -> object:
    """The running task (asyncio or trio), to compare by identity; ``None`` outside one."""
    loop = _running[0]
    if loop._thread_id == get_ident():
        task = tasks.get(loop)
        if task is not None:
            return task
    try:
        return _asyncio_task()
    except RuntimeError:  # not on asyncio: trio, which is imported when it runs
        import trio

        return trio.lowlevel.current_task()


def current_loop() -> object:
    """The running event loop (asyncio), or the run's token (trio), to compare by identity."""
    loop = _get_running_loop()
    if loop is not None:
        return loop
    try:
        import trio

        return trio.lowlevel.current_trio_token()
    except (ImportError, RuntimeError):
        raise RuntimeError("no asyncio or trio event loop is running in this thread") from None


def wall() -> float:
    """The wall clock epoch resets are read against: :func:`time.time`, or a simulation's.

    In a simulation it runs with the virtual time from the epoch the
    simulation set, so a reset stated in epoch seconds moves on with it.
    """
    epoch = _wall_epoch.get()
    return time.time() if epoch is None else epoch + now()


def simulated_wall(epoch: float | None) -> None:
    """Make :func:`wall` show ``epoch`` at virtual time 0 in this context (``None``: real)."""
    _wall_epoch.set(epoch)


@contextmanager
def wall_ahead(seconds: float) -> Iterator[None]:
    """Within, a simulation's :func:`wall` reads ``seconds`` ahead of its virtual time.

    A server model answers a send that reaches it later than it left (behind
    :class:`~throttlekit.testing.Jittered`) at once, told the instant it
    arrives: its wall clock must read that instant too. The real clock is
    left alone.
    """
    epoch = _wall_epoch.get()
    if epoch is None:
        yield
        return
    token = _wall_epoch.set(epoch + seconds)
    try:
        yield
    finally:
        _wall_epoch.reset(token)


def now_or_monotonic() -> float:
    """The backend's clock, or the monotonic clock outside an event loop (statistics)."""
    try:
        return now()
    except Exception:
        return time.monotonic()
