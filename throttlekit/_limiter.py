"""The async driver: the only part of throttlekit that awaits."""

from __future__ import annotations

from typing import Any

from . import scopes as _scopes
from ._base import BaseLimiter, check_acquire
from ._permit import Permit

__all__ = ["Limiter", "Permit"]


class Limiter(BaseLimiter):
    """Decides when each request may be sent, across scopes, on asyncio or trio.

    :param scopes: policies for named scopes (hosts, domains, endpoints, pools).
    :param default: the policy of every scope not named in ``scopes``.
    :param concurrency: the global cap on requests in flight; ``None`` = unlimited.
    :param resolver: maps a request-like to its scopes (sync or async); see
        :mod:`throttlekit.scopes`. Default: :func:`~throttlekit.scopes.by_host`.
    :param max_waiters: most requests waiting at once; one more raises
        :class:`Overloaded`. ``None`` = unlimited.
    :param max_scopes: most scopes kept in memory; above it, the idle scope that
        could be forgotten earliest goes first. A scope whose delay, quota window
        or server block still runs is kept until it has run out (forgetting it
        would let its next request out early), so while every scope is bound
        the limiter holds more than ``max_scopes`` for that long.
    :param max_idle: seconds after its last send that an idle scope (nothing in
        flight or waiting) keeps its learned state before it may be evicted.
    :param seed: seed for the jitter's random numbers (for reproducible runs).
    :param robotstxt_max_delay: the cap on robots.txt Crawl-Delay (seconds).
    :param backend: a shared state backend (e.g.
        :class:`throttlekit.backends.redis.RedisBackend`) that decides grants
        instead of the in-memory ledgers, so several processes share one budget.

    Usage::

        limiter = Limiter(default=ScopePolicy(concurrency=2, delay=0.5))
        async with limiter.acquire("https://example.com/page") as permit:
            response = await client.get("https://example.com/page")
            permit.record(response)

    Time is read from the running async backend (``anyio.current_time()``), so
    virtual clocks drive it in tests. Waiting costs no CPU: every waiter sleeps
    on its own event and a single timer (held by one of the waiters) wakes the
    limiter when the next delay or quota window ends.

    A limiter serves one event loop at a time: used from another loop or
    thread while requests of the first are in flight or waiting, it raises
    :class:`RuntimeError` (share a :class:`~throttlekit.SyncLimiter` between
    threads instead).
    """

    def __repr__(self) -> str:
        return f"<Limiter {self._backend!r}>"

    def acquire(
        self,
        request: Any = None,
        *,
        priority: int = 0,
        timeout: float | None = None,
        scopes: _scopes.ScopesLike | None = None,
    ) -> Permit:
        """Wait until ``request`` may be sent; use as ``async with``.

        :param request: a URL string or any object with ``.url`` (optionally
            ``.meta``/``.extensions`` holding ``throttling_scopes``). May be
            ``None`` when ``scopes`` is given.
        :param priority: higher goes first among requests waiting on a scope.
        :param timeout: seconds to wait at most, then :class:`ThrottleTimeout`;
            ``None`` waits as long as needed.
        :param scopes: the request's scopes, overriding the resolver: a scope
            name, a set of names, or ``{scope: cost}``.
        :raises Overloaded: when ``max_waiters`` requests are already waiting.

        An acquire inside an ``async with limiter.acquire(...)`` block of the
        same task (directly or through an adapter) is *nested*: it takes no
        second slot of the global cap and only the scopes the enclosing
        permits do not hold, so it never deadlocks on them; feedback recorded
        on it reaches the shared scopes too. Tasks started inside the block
        are not nested.
        """
        if type(priority) is not int or timeout is not None or (request is None and scopes is None):
            check_acquire(request, priority, timeout, scopes)
        # Its fields are set here, not by an __init__: a permit per request is
        # the hot path (see Permit for what each field means).
        permit: Permit = self._permit_type()
        permit._limiter = self
        permit._lane = self._lane
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
    ) -> Permit:
        """Take a permit now or raise :class:`WouldBlock`; use as ``with``.

        The resolver must be synchronous here. Must be called from a running
        event loop (it reads the backend's clock). A shared backend cannot
        grant without a round trip, so with one this always raises
        :class:`WouldBlock`.
        """
        if request is None and scopes is None:
            raise TypeError("acquire_nowait() needs a request or scopes=")
        permit = self.acquire(request, priority=priority, scopes=scopes)
        permit._enter_nowait()
        return permit
