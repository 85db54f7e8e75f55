"""The synchronous driver: a thread-safe limiter whose waiters block their thread.

It shares everything with the async :class:`~throttlekit.Limiter` (the
scheduler, the ledgers and controllers, the fast lane, the waiters' timer,
feedback and statistics) but how it waits: one lock around each call into
that shared state, and a ``threading.Event`` per waiter, which sleeps until
its grant (or, for the one waiter holding the timer, until the next delay or
quota window ends).
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, NoReturn

from . import scopes as _scopes
from ._base import BaseLimiter, check_acquire
from ._controller import Feedback
from ._errors import ThrottleTimeout, WouldBlock
from ._listeners import SyncHeard
from ._permit import _holds_of
from ._scheduler import WAITING, Ticket
from ._stats import LimiterStatistics, ScopeStatistics
from ._waiters import raise_if_stalled
from .backends.memory import MemoryBackend, MemoryPermit

__all__ = ["SyncLimiter", "SyncPermit"]

INF = float("inf")
_monotonic = time.monotonic
_get_ident = threading.get_ident


class SyncPermit(MemoryPermit):
    """A request's right to be sent, from :meth:`SyncLimiter.acquire`; use it as ``with``.

    Leaving the ``with`` block gives back the concurrency it holds, also when
    the block raises. Inside the block, report how the request went with
    :meth:`~throttlekit.Permit.record`, as with the async limiter's permits.
    """

    # The limiter's lock (re-entrant), taken around every change of shared state.
    __slots__ = ("_lock",)

    _lock: threading.RLock

    def __enter__(self) -> SyncPermit:
        if self._lease is not None or self._shared is not None:
            return self  # granted by acquire_nowait()
        task = _get_ident()
        lane = self._lane
        with self._lock:
            holds = lane.holds
            # A thread that holds a permit of this limiter nests: general path.
            if holds is None or (
                task not in holds if isinstance(holds, dict) else holds._task is not task
            ):
                now = _monotonic()
                ledger = lane.take(self._request, self._scopes, now, None)
                if ledger is not None:
                    self._took(ledger, now)
                    if self._encloses:
                        self._hold(task)
                    return self
        self._enter_blocking(task)
        return self

    def _enter_blocking(self, task: int) -> None:
        """The general path: nest in the thread's held permits, or wait for a grant."""
        limiter = self._limiter
        costs = limiter._resolve(self._request, self._scopes)
        if type(costs) is not dict:
            _refuse_async(costs)
        backend = limiter._local
        assert isinstance(backend, SyncMemoryBackend)
        with self._lock:
            mine = _holds_of(self._lane, task)
            added = self._share(mine, costs) if mine else costs
            limiter._check_stall(added)
        if added or not mine:
            # A nested acquire takes no slot of the global cap: its enclosing permit holds one.
            self._lease = backend.acquire_blocking(
                added, priority=self._priority, timeout=self._timeout, gated=not mine
            )
        try:
            with self._lock:
                self._remember()
                if self._encloses:
                    self._hold(task)
        except BaseException:  # an interrupt right after the grant: give it back
            self.__exit__(None, None, None)
            raise

    def _enter_nowait(self) -> None:
        with self._lock:
            now = _monotonic()
            ledger = self._lane.take(self._request, self._scopes, now, None)
            if ledger is not None:
                self._took(ledger, now)
                return
        costs = self._limiter._resolve(self._request, self._scopes)
        if type(costs) is not dict:
            _refuse_async(costs)
        lease = self._limiter._local.try_acquire(costs, self._priority)
        if lease is None:
            raise WouldBlock(f"no room now for {costs}")
        with self._lock:
            self._lease = lease
            self._remember()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            if self._task is not None:
                self._unhold()
            MemoryPermit.release(self)

    def release(self) -> None:
        """Give back the concurrency this permit holds (idempotent)."""
        with self._lock:
            MemoryPermit.release(self)

    async def __aenter__(self) -> NoReturn:
        raise RuntimeError(
            "a SyncLimiter's permit is used with 'with', not 'async with'; "
            "async code uses throttlekit.Limiter"
        )


def _refuse_async(costs: Any) -> NoReturn:
    close = getattr(costs, "close", None)
    if close is not None:
        close()  # a coroutine never awaited would warn
    raise TypeError(
        "SyncLimiter needs a synchronous resolver; an async resolver needs throttlekit.Limiter"
    )


class SyncMemoryBackend(MemoryBackend):
    """The in-memory backend for threads: a lock around the shared state, blocking waits.

    The clock is ``time.monotonic()``. Every call that reads or changes the
    scheduler takes :attr:`lock`; a waiting thread sleeps on its own
    ``threading.Event`` with no lock held.
    """

    permit_type = SyncPermit

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Taken around every change of the ledgers, the scheduler and the waiters.
        self.lock = threading.RLock()

    def now(self) -> float:
        """The clock of the grants: ``time.monotonic()``."""
        return _monotonic()

    def stats_now(self) -> float:
        """The clock of statistics: ``time.monotonic()``."""
        return _monotonic()

    def _claim(self) -> None:
        """Threads share this backend: there is no event loop to bind to."""

    def set_policy(self, scope: str, policy: Any) -> None:
        with self.lock:
            super().set_policy(scope, policy)

    def try_acquire(self, costs: Any, priority: int) -> Ticket | None:
        with self.lock:
            return super().try_acquire(costs, priority)

    async def acquire(self, costs: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("a SyncLimiter waits with acquire_blocking(), not by awaiting")

    def record(self, lease: Ticket, feedback: Feedback, consumed: Any) -> None:
        with self.lock:
            super().record(lease, feedback, consumed)

    def release_nowait(self, lease: Ticket) -> bool:
        with self.lock:
            return super().release_nowait(lease)

    def statistics(self) -> LimiterStatistics:
        with self.lock:
            return super().statistics()

    def scope_statistics(self, scope: str) -> ScopeStatistics | None:
        with self.lock:
            return super().scope_statistics(scope)

    def acquire_blocking(
        self,
        costs: dict[str, float],
        *,
        priority: int,
        timeout: float | None,
        gated: bool = True,
    ) -> Ticket:
        """Block the thread until ``costs`` are granted; ``{}`` takes only the global cap.

        :raises ThrottleTimeout: when ``timeout`` seconds pass first.
        :raises Overloaded: when ``max_waiters`` requests are already waiting.

        Anything raised while it waits (a ``KeyboardInterrupt`` in the main
        thread) hands back everything before it propagates.
        """
        with self.lock:
            now = _monotonic()
            ticket = self.enqueue(costs, priority, now, gated)
            if ticket.state != WAITING:
                return ticket
            ticket.waker = threading.Event()
            self.waiters.add(ticket, now)
        try:
            self._block(ticket, None if timeout is None else now + timeout, timeout)
        except BaseException:
            with self.lock:
                self.waiters.abandon(ticket, _monotonic())
            raise
        with self.lock:
            self.waiters.wake_stalled(ticket, _monotonic())  # its grant may have spent a quota
        return ticket

    def _block(self, ticket: Ticket, deadline: float | None, timeout: float | None) -> None:
        """Sleep until ``ticket`` is granted; the timekeeper also until the next wake."""
        lock = self.lock
        waiters = self.waiters
        while True:
            with lock:
                if ticket.state != WAITING:
                    return
                now = _monotonic()
                if deadline is not None and now >= deadline:
                    raise ThrottleTimeout(
                        f"no grant within {timeout} s for scopes {sorted(ticket.scopes)}"
                    )
                raise_if_stalled(ticket, now)
                event = ticket.waker
                if event.is_set():
                    ticket.waker = event = threading.Event()
                until = waiters.arm(ticket)  # inf unless it keeps the timer
                keeper = waiters.timekeeper is ticket
            if deadline is not None and deadline < until:
                until = deadline
            event.wait(None if until == INF else max(0.0, until - now))
            if keeper:
                with lock:
                    if ticket.state == WAITING:
                        waiters.woke(ticket, _monotonic())


class SyncLimiter(BaseLimiter):
    """Decides when each request may be sent, across scopes, for threads.

    The synchronous, thread-safe twin of :class:`~throttlekit.Limiter`: the
    same arguments (see there), policies, scopes, resolvers (synchronous
    ones), quotas with costs, controllers, :meth:`from_settings` and
    statistics, and the same fairness (no head-of-line blocking across
    scopes, first come first served within a priority). Share one between
    all the threads of a process (``ThreadPoolExecutor`` workers, say).

    Usage::

        limiter = SyncLimiter(default=ScopePolicy(concurrency=2, delay=0.5))
        with limiter.acquire("https://example.com/page") as permit:
            response = session.get("https://example.com/page")
            permit.record(response)

    A waiting thread sleeps on its own event; one of them at a time also
    sleeps until the next delay or quota window ends, and wakes the others'
    grants. Nothing polls. A wait that times out, or is interrupted
    (``KeyboardInterrupt`` in the main thread), takes nothing; leaving the
    ``with`` block gives the permit back, also when the block raises.

    Not yet: a shared backend (``backend=``; the Redis backend is async-only).
    """

    _local_type = SyncMemoryBackend
    _shares_backends = False
    _heard = SyncHeard

    def __repr__(self) -> str:
        return f"<SyncLimiter {self._local!r}>"

    def acquire(
        self,
        request: Any = None,
        *,
        priority: int = 0,
        timeout: float | None = None,
        scopes: _scopes.ScopesLike | None = None,
    ) -> SyncPermit:
        """A permit for ``request``, which waits for its grant when entered: use as ``with``.

        :param request: a URL string or any object with ``.url`` (optionally
            ``.meta`` holding ``throttling_scopes``). May be ``None`` when
            ``scopes`` is given.
        :param priority: higher goes first among requests waiting on a scope.
        :param timeout: seconds to wait at most, then :class:`ThrottleTimeout`;
            ``None`` waits as long as needed.
        :param scopes: the request's scopes, overriding the resolver: a scope
            name, a set of names, or ``{scope: cost}``.
        :raises Overloaded: when ``max_waiters`` requests are already waiting.

        An acquire inside a ``with limiter.acquire(...)`` block of the same
        thread (directly or through an adapter) is *nested*: it takes no
        second slot of the global cap and only the scopes the enclosing
        permits do not hold.
        """
        if type(priority) is not int or timeout is not None or (request is None and scopes is None):
            check_acquire(request, priority, timeout, scopes)
        permit: SyncPermit = self._permit_type()  # type: ignore[assignment]
        permit._limiter = self
        permit._lane = self._lane
        permit._lock = self._local.lock  # type: ignore[attr-defined]
        permit._request = request
        permit._scopes = scopes
        permit._priority = priority
        permit._timeout = timeout
        permit._lease = None
        permit._shared = None
        permit._encloses = True
        permit._task = None
        permit._outer = None
        permit.recorded = False
        return permit

    def acquire_nowait(
        self,
        request: Any = None,
        *,
        priority: int = 0,
        scopes: _scopes.ScopesLike | None = None,
    ) -> SyncPermit:
        """Take a permit now or raise :class:`WouldBlock`; use as ``with``."""
        if request is None and scopes is None:
            raise TypeError("acquire_nowait() needs a request or scopes=")
        permit = self.acquire(request, priority=priority, scopes=scopes)
        permit._enter_nowait()
        return permit
