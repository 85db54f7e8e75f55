"""The async driver: the only part of throttlekit that awaits."""

from __future__ import annotations

import inspect
import logging
import math
import random
import time
from asyncio import _get_running_loop
from collections import deque
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from . import scopes as _scopes
from ._controller import Feedback
from ._errors import Overloaded, ThrottleTimeout, WouldBlock
from ._policy import ScopePolicy
from ._scheduler import CANCELLED, GRANTED, WAITING, Scheduler, Ticket
from ._stats import LimiterStatistics, ScopeStatistics

if TYPE_CHECKING:
    from .backends import Backend

__all__ = ["Limiter", "Permit"]

logger = logging.getLogger("throttlekit")


def _now() -> float:
    """The running backend's clock, as ``anyio.current_time()`` reads it, but cheaper.

    On asyncio that is the running loop's ``time()``; anyio's own lookup goes
    through sniffio on every call, which is most of the cost of an
    uncontended acquire, so the asyncio case is taken directly.
    """
    loop = _get_running_loop()
    if loop is not None:
        return loop.time()
    return anyio.current_time()


INF = math.inf

#: The longest wait read from rate-limit headers here (about 30 years): no cap
#: in practice, so that each scope's ``Backoff.max_delay`` is the cap that applies.
_HEADER_MAX_DELAY = 1e9


def _now_or_monotonic() -> float:
    """The backend's clock, or the monotonic clock outside an event loop (statistics)."""
    try:
        return _now()
    except Exception:
        return time.monotonic()


def _only(scopes: Iterable[str], granted: Mapping[str, float]) -> frozenset[str]:
    names = frozenset([scopes] if isinstance(scopes, str) else scopes)
    unknown = names - granted.keys()
    if unknown:
        raise ValueError(
            f"record(scopes=...) names scopes the permit does not hold: {sorted(unknown)}"
        )
    return names


def _status_of(response: Any) -> int | None:
    for attribute in ("status_code", "status"):
        value = getattr(response, attribute, None)
        if isinstance(value, int):
            return value
    return None


class Permit:
    """A request's right to be sent, from :meth:`Limiter.acquire`.

    Use it as ``async with limiter.acquire(url) as permit:``; leaving the block
    gives back the concurrency it holds, also on error and on cancellation.
    Inside the block, report how the request went with :meth:`record`.
    """

    __slots__ = (
        "_consumed",
        "_feedback",
        "_limiter",
        "_priority",
        "_request",
        "_scopes",
        "_ticket",
        "_timeout",
        "recorded",
    )

    def __init__(
        self,
        limiter: Limiter,
        request: Any,
        priority: int,
        timeout: float | None,
        scopes: _scopes.ScopesLike | None,
    ) -> None:
        self._limiter = limiter
        self._request = request
        self._priority = priority
        self._timeout = timeout
        self._scopes = scopes
        self._ticket: Any = None  # a Ticket, or a backend's lease
        self._feedback: Feedback | None = None
        self._consumed: Mapping[str, float] | None = None
        self.recorded = False

    def __repr__(self) -> str:
        return f"<Permit {self._ticket!r}>" if self._ticket else "<Permit (not acquired)>"

    @property
    def scopes(self) -> dict[str, float]:
        """The granted scopes and the cost taken from each."""
        if self._ticket is None:
            raise RuntimeError("the permit has not been acquired yet")
        return dict(self._ticket.scopes)

    @property
    def granted_at(self) -> float:
        """The limiter-clock time of the grant (the send time)."""
        if self._ticket is None:
            raise RuntimeError("the permit has not been acquired yet")
        return float(self._ticket.granted_at)

    @property
    def request(self) -> Any:
        """The request-like this permit was acquired for."""
        return self._request

    async def __aenter__(self) -> Permit:
        if self._ticket is not None:
            raise RuntimeError("a permit can be entered only once")
        limiter = self._limiter
        # Fast path, no await: a URL string, the default resolver, one scope with room.
        request = self._request
        if (
            self._scopes is None
            and type(request) is str
            and limiter.resolver is _scopes.by_host
            and limiter._backend is None
        ):
            loop = _get_running_loop()
            ticket = limiter._core.grant_one(
                _scopes.by_host(request),
                1.0,
                self._priority,
                loop.time() if loop is not None else anyio.current_time(),
            )
            if ticket is not None:
                self._ticket = ticket
                return self
        self._ticket = await limiter._acquire(request, self._priority, self._timeout, self._scopes)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        limiter = self._limiter
        ticket = self._ticket
        if limiter._backend is not None and ticket is not None:
            self._ticket = None
            await limiter._backend.release(ticket, self._feedback, self._consumed)
            return
        if ticket is not None and ticket.state == GRANTED:
            limiter._release(ticket)

    def __enter__(self) -> Permit:
        if self._ticket is None:
            raise RuntimeError(
                "use 'async with limiter.acquire(...)'; 'with' is for acquire_nowait()"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        """Give back the concurrency this permit holds (idempotent).

        With a shared backend the release is a network round trip: leave the
        ``async with`` block instead (this raises :class:`RuntimeError`).
        """
        ticket = self._ticket
        if ticket is None:
            return
        if self._limiter._backend is not None:
            raise RuntimeError("with a shared backend, release by leaving 'async with'")
        if ticket.state == GRANTED:
            self._limiter._release(ticket)

    def record(
        self,
        response: Any = None,
        *,
        status: int | None = None,
        headers: Any = None,
        exception: BaseException | None = None,
        latency: float | None = None,
        size: int | None = None,
        consumed: Mapping[str, float] | None = None,
        adjust_delay: bool | None = None,
        scopes: Iterable[str] | None = None,
    ) -> Feedback:
        """Report how the request went, so the scope's controllers can react.

        :param response: anything with ``.status``/``.status_code`` and ``.headers``
            (httpx, aiohttp, Scrapy responses); explicit arguments win over it.
        :param status: the HTTP status code.
        :param headers: the response headers (rate-limit headers are read from them).
        :param exception: the exception that ended the request (timeouts trigger backoff).
        :param latency: seconds from send to response headers; defaults to the
            time since the grant.
        :param size: the response body size in bytes, if known.
        :param consumed: the actual cost per scope, when it differs from the
            declared cost; the quota window is corrected by the difference.
        :param adjust_delay: ``False`` keeps latency controllers from learning
            from this response; by default it is ``False`` when the request's
            meta has ``autothrottle_dont_adjust_delay``.
        :param scopes: give the feedback to these of the permit's scopes only
            (e.g. an upstream status that concerns the target site's scope,
            not the scraping API's); default: all of them. ``consumed``
            applies regardless.
        :returns: the :class:`Feedback` that was recorded.
        """
        ticket = self._ticket
        if ticket is None:
            raise RuntimeError("record() needs an acquired permit")
        if response is not None:
            if status is None:
                status = _status_of(response)
            if headers is None:
                headers = getattr(response, "headers", None)
        if adjust_delay is None:
            meta = getattr(self._request, "meta", None) or getattr(
                self._request, "extensions", None
            )
            adjust_delay = not (
                isinstance(meta, Mapping) and meta.get("autothrottle_dont_adjust_delay")
            )
        if consumed:
            consumed = _scopes.as_scope_costs(consumed)
        limiter = self._limiter
        feedback = limiter._make_feedback(
            ticket.granted_at,
            status=status,
            headers=headers,
            exception=exception,
            latency=latency,
            size=size,
            adjust_delay=adjust_delay,
            scopes=None if scopes is None else _only(scopes, ticket.scopes),
        )
        if limiter._backend is not None:
            # A shared backend learns the feedback when the permit is released.
            self._feedback, self._consumed = feedback, consumed
        else:
            limiter._record(ticket, feedback, consumed)
        self.recorded = True
        return feedback


class Limiter:
    """Decides when each request may be sent, across scopes, on asyncio or trio.

    :param scopes: policies for named scopes (hosts, domains, endpoints, pools).
    :param default: the policy of every scope not named in ``scopes``.
    :param concurrency: the global cap on requests in flight; ``None`` = unlimited.
    :param resolver: maps a request-like to its scopes (sync or async); see
        :mod:`throttlekit.scopes`. Default: :func:`~throttlekit.scopes.by_host`.
    :param max_waiters: most requests waiting at once; one more raises
        :class:`Overloaded`. ``None`` = unlimited.
    :param max_scopes: most scopes kept in memory; the longest idle go first.
    :param max_idle: seconds an idle scope (nothing in flight or waiting) keeps
        its learned state before it may be evicted.
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
    """

    def __init__(
        self,
        *,
        scopes: Mapping[str, ScopePolicy] | None = None,
        default: ScopePolicy | None = None,
        concurrency: int | None = 16,
        resolver: _scopes.Resolver = _scopes.by_host,
        max_waiters: int | None = 100_000,
        max_scopes: int = 100_000,
        max_idle: float = 3600.0,
        seed: int | None = None,
        backend: Backend | None = None,
        robotstxt_max_delay: float = 60.0,
    ) -> None:
        scopes = dict(scopes or {})
        for name, policy in scopes.items():
            if not isinstance(name, str):
                raise TypeError(f"scopes keys must be str scope names, got {name!r}")
            if not isinstance(policy, ScopePolicy):
                raise TypeError(f"scopes[{name!r}] must be a ScopePolicy, got {policy!r}")
        if default is None:
            default = ScopePolicy()
        elif not isinstance(default, ScopePolicy):
            raise TypeError(f"default must be a ScopePolicy, got {default!r}")
        _check_limit("concurrency", concurrency)
        _check_limit("max_waiters", max_waiters)
        _check_limit("max_scopes", max_scopes, optional=False)
        if (
            isinstance(max_idle, bool)
            or not isinstance(max_idle, (int, float))
            or not (max_idle > 0)
        ):
            raise ValueError(f"max_idle must be a number of seconds > 0, got {max_idle!r}")
        if not callable(resolver):
            raise TypeError(f"resolver must be callable, got {resolver!r}")
        if (
            isinstance(robotstxt_max_delay, bool)
            or not isinstance(robotstxt_max_delay, (int, float))
            or not (robotstxt_max_delay >= 0)
        ):
            raise ValueError(
                f"robotstxt_max_delay must be a number of seconds >= 0, got {robotstxt_max_delay!r}"
            )
        self.robotstxt_max_delay = float(robotstxt_max_delay)
        self._crawl_delays: dict[str, float] = {}
        self._crawl_warned: set[str] = set()
        self.resolver = resolver
        self.max_waiters = max_waiters
        self._backend = backend
        self._core = Scheduler(
            policies=scopes,
            default=default,
            concurrency=concurrency,
            max_scopes=max_scopes,
            max_idle=float(max_idle),
            rng=random.Random(seed),
        )
        self._timekeeper: Ticket | None = None
        self._armed = INF
        self._sleepers: deque[Ticket] = deque()
        # What acquire() and acquire_nowait() return. Instrumentation
        # (throttlekit.otel) swaps in a subclass that records metrics, so a
        # limiter without it pays nothing for them.
        self._permit_type: type[Permit] = Permit

    def __repr__(self) -> str:
        core = self._core
        return (
            f"<Limiter in_flight={core.gate.in_flight}/{core.gate.limit} "
            f"waiting={core.waiting} scopes={len(core.scopes)} next_wake={core.next_wake():g}>"
        )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **kwargs: Any) -> Limiter:
        """Build a limiter from Scrapy-style settings (any mapping, or Scrapy's ``Settings``).

        Throttling: ``CONCURRENT_REQUESTS`` (the global cap, default 16; 0 =
        unlimited), ``CONCURRENT_REQUESTS_PER_DOMAIN`` (1), ``DOWNLOAD_DELAY``
        (1.0), ``DOWNLOAD_DELAY_PER_SLOT`` (1.0), ``RANDOMIZE_DOWNLOAD_DELAY``
        (True = jitter 0.5; a number or a ``[low, high]`` pair),
        ``THROTTLING_WINDOW`` (60.0), ``THROTTLING_ROBOTSTXT_MAX_DELAY`` (60.0).

        Controllers: ``BACKOFF_HTTP_CODES``, ``BACKOFF_EXCEPTIONS``,
        ``BACKOFF_DELAY_FACTOR`` (2.0), ``BACKOFF_MIN_DELAY`` (1.0),
        ``BACKOFF_MAX_DELAY`` (300.0), ``BACKOFF_JITTER`` (0.1),
        ``BACKOFF_WINDOW`` (60.0), ``BACKOFF_CONCURRENCY_FACTOR`` (0.5);
        ``AUTOTHROTTLE_ENABLED`` (False), ``AUTOTHROTTLE_START_DELAY`` (5.0),
        ``AUTOTHROTTLE_MAX_DELAY`` (60.0), ``AUTOTHROTTLE_TARGET_CONCURRENCY``
        (1.0, must be > 0), ``AUTOTHROTTLE_DEBUG`` (False);
        ``RAMPUP_BACKOFF_TARGET`` (1, or a ``[low, high]`` range).

        ``THROTTLING_SCOPES`` maps a scope to a dict overriding the defaults:
        ``concurrency``, ``delay``, ``slot_delay``, ``jitter``, ``quota``,
        ``window``, ``ignore_robots_txt``, and ``backoff`` / ``rampup`` /
        ``autothrottle`` (``True``, ``False`` or a dict of their fields), and
        ``manager`` (the import path of a controller factory). Other keyword
        arguments go to the constructor. Invalid values raise
        :class:`ValueError`/:class:`TypeError` naming the setting.
        """
        from ._settings import limiter_options

        options = limiter_options(settings)
        options.update(kwargs)
        return cls(**options)

    # -- public API ----------------------------------------------------------------

    @property
    def backend(self) -> Backend | None:
        """The shared state backend, or ``None`` for in-memory ledgers."""
        return self._backend

    @property
    def default(self) -> ScopePolicy:
        """The policy of scopes not configured explicitly."""
        return self._core.default

    @property
    def policies(self) -> Mapping[str, ScopePolicy]:
        """The explicitly configured scope policies."""
        return dict(self._core.policies)

    def policy(self, scope: str) -> ScopePolicy:
        """The policy that applies to ``scope``."""
        return self._core.policy_for(scope)

    def set_policy(self, scope: str, policy: ScopePolicy) -> None:
        """Configure ``scope`` with ``policy`` from now on (live counters are kept)."""
        if not isinstance(policy, ScopePolicy):
            raise TypeError(f"policy must be a ScopePolicy, got {policy!r}")
        self._core.set_policy(scope, policy)
        self._kick_if_running()

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
        """
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {priority!r}")
        if timeout is not None and not (timeout >= 0):
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        if request is None and scopes is None:
            raise TypeError("acquire() needs a request or scopes=")
        permit_type = self._permit_type  # a plain attribute load: cheaper than self._permit_type()
        return permit_type(self, request, priority, timeout, scopes)

    def acquire_nowait(
        self,
        request: Any = None,
        *,
        priority: int = 0,
        scopes: _scopes.ScopesLike | None = None,
    ) -> Permit:
        """Take a permit now or raise :class:`WouldBlock`; use as ``with``.

        The resolver must be synchronous here. Must be called from a running
        event loop (it reads the backend's clock).
        """
        if request is None and scopes is None:
            raise TypeError("acquire_nowait() needs a request or scopes=")
        if self._backend is not None:
            raise RuntimeError("acquire_nowait() is not available with a shared backend")
        costs = self._resolve(request, scopes)
        if type(costs) is not dict:
            if inspect.iscoroutine(costs):
                costs.close()
            raise RuntimeError("acquire_nowait() cannot use an async resolver; use acquire()")
        now = _now()
        ticket = self._core.make_ticket(costs, priority, now)
        if not self._core.try_grant(ticket, now):
            raise WouldBlock(f"no room now for {ticket.scopes}")
        permit = self._permit_type(self, request, priority, None, scopes)
        permit._ticket = ticket
        return permit

    def set_crawl_delay(self, scope: str, seconds: float) -> None:
        """Apply a robots.txt ``Crawl-Delay`` to ``scope``.

        The scope gets concurrency 1 and a delay of ``seconds``, capped at
        ``robotstxt_max_delay``. If the scope has an explicit policy (from
        ``scopes=``/``THROTTLING_SCOPES``) that differs, that policy is kept
        and a warning is logged once, unless the policy has
        ``ignore_robots_txt=True``. Negative, NaN or infinite values (a
        broken robots.txt) are ignored with a warning.
        """
        if not isinstance(scope, str):
            raise TypeError(f"scope must be a str, got {scope!r}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"seconds must be a number, got {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            logger.warning("ignoring invalid Crawl-Delay %r for scope %s", seconds, scope)
            return
        delay = min(float(seconds), self.robotstxt_max_delay)
        explicit = self._core.policies.get(scope)
        if explicit is not None and scope not in self._crawl_delays:
            differs = explicit.concurrency != 1 or explicit.delay != delay
            if differs and not explicit.ignore_robots_txt and scope not in self._crawl_warned:
                self._crawl_warned.add(scope)
                logger.warning(
                    "robots.txt asks for Crawl-Delay %s s on %s, but its configured policy "
                    "(concurrency %s, delay %s s) is kept; set ignore_robots_txt=True to "
                    "silence this warning",
                    delay,
                    scope,
                    explicit.concurrency,
                    explicit.delay,
                )
            return
        self._crawl_delays[scope] = delay
        policy = attrs.evolve(self._core.default, concurrency=1, delay=delay)
        logger.debug("scope %s: Crawl-Delay %s s from robots.txt", scope, delay)
        self._core.set_policy(scope, policy)
        self._kick_if_running()

    @property
    def crawl_delays(self) -> Mapping[str, float]:
        """The robots.txt Crawl-Delays applied so far, by scope."""
        return dict(self._crawl_delays)

    def statistics(self) -> LimiterStatistics:
        """A frozen snapshot of the limiter and every scope it currently tracks.

        It costs O(scopes); to watch one scope use :meth:`scope_statistics`.
        """
        now = _now_or_monotonic()
        core = self._core
        scopes = {}
        for ledger in core.iter_scopes():
            if ledger.policy.quota is not None:
                ledger.expire(now)
            scopes[ledger.name] = ScopeStatistics.from_ledger(ledger, now)
        return LimiterStatistics(
            in_flight=core.gate.in_flight,
            waiting=core.waiting,
            concurrency=core.gate.limit,
            next_wake=core.next_wake(),
            scopes=scopes,
        )

    def scope_statistics(self, scope: str) -> ScopeStatistics | None:
        """A frozen snapshot of one scope, or ``None`` if the limiter does not track it."""
        ledger = self._core.scopes.get(scope)
        if ledger is None:
            return None
        now = _now_or_monotonic()
        if ledger.policy.quota is not None:
            ledger.expire(now)
        return ScopeStatistics.from_ledger(ledger, now)

    # -- internals -----------------------------------------------------------------

    def _resolve(self, request: Any, scopes: _scopes.ScopesLike | None) -> Any:
        """The request's ``{scope: cost}``, or an awaitable of the resolver's result."""
        if scopes is not None:
            return _scopes.as_scope_costs(scopes)
        carried = _scopes.request_scopes(request)
        if carried is not None:
            return _scopes.as_scope_costs(carried)
        result = self.resolver(request)
        if type(result) is str:
            return {result: 1.0}
        if inspect.isawaitable(result):
            return result
        return _scopes.as_scope_costs(result)

    async def _acquire(
        self,
        request: Any,
        priority: int,
        timeout: float | None,  # noqa: ASYNC109 - the caller's acquire(timeout=)
        scopes: _scopes.ScopesLike | None,
    ) -> Any:
        costs = self._resolve(request, scopes)
        if type(costs) is not dict:
            costs = _scopes.as_scope_costs(await costs)
        if self._backend is not None:
            return await self._backend.acquire(self, costs, priority=priority, timeout=timeout)
        return await self._acquire_local(costs, priority, timeout)

    async def _acquire_local(
        self,
        costs: Mapping[str, float],
        priority: int,
        timeout: float | None,  # noqa: ASYNC109 - the caller's acquire(timeout=)
    ) -> Ticket:
        """Wait for a grant from the in-memory ledgers; return the granted ticket.

        Backends call it too: with no scopes (``costs={}``) it takes only the
        global cap, and it is the local fallback of a shared backend.
        """
        core = self._core
        now = _now()
        ticket = core.make_ticket(costs, priority, now)
        if core.try_grant(ticket, now):
            return ticket  # the fast path: no await, no yield to the event loop
        return await self._wait_for_grant(ticket, now, timeout)

    async def _wait_for_grant(
        self,
        ticket: Ticket,
        now: float,
        timeout: float | None,  # noqa: ASYNC109 - the caller's acquire(timeout=)
    ) -> Ticket:
        """The slow path: queue ``ticket`` and sleep until it is granted."""
        core = self._core
        if self.max_waiters is not None and core.waiting >= self.max_waiters:
            raise Overloaded(f"{core.waiting} requests are already waiting (max_waiters)")
        if core.enqueue(ticket, now):
            return ticket
        ticket.waker = anyio.Event()
        sleepers = self._sleepers
        if len(sleepers) > 2 * core.waiting + 16:  # drop waiters granted or gone meanwhile
            self._sleepers = sleepers = deque(t for t in sleepers if t.state == WAITING)
        sleepers.append(ticket)
        self._kick(now)
        try:
            if timeout is None:
                await self._wait(ticket)
            else:
                with anyio.fail_after(timeout):
                    await self._wait(ticket)
        except BaseException as exc:
            self._abandon(ticket)
            if isinstance(exc, TimeoutError) and ticket.state == CANCELLED:
                raise ThrottleTimeout(
                    f"no grant within {timeout} s for scopes {sorted(ticket.scopes)}"
                ) from None
            raise
        return ticket

    async def _wait(self, ticket: Ticket) -> None:
        while ticket.state == WAITING:
            event = ticket.waker
            if self._timekeeper is ticket:
                deadline = self._core.next_wake()
                self._armed = deadline
                with anyio.CancelScope(deadline=deadline):
                    await event.wait()
                if ticket.state != WAITING:
                    return
                if event.is_set():
                    ticket.waker = anyio.Event()
                self._armed = -INF  # we re-read the next wake ourselves; no need to poke us
                self._kick(_now())
            else:
                await event.wait()
                if ticket.state == WAITING:
                    ticket.waker = anyio.Event()

    def _abandon(self, ticket: Ticket) -> None:
        """The waiter of ``ticket`` is gone (cancelled or timed out): hand everything back."""
        self._core.cancel(ticket, _now())
        if self._timekeeper is ticket:
            self._timekeeper = None
        self._kick(_now())

    def _release(self, ticket: Ticket) -> None:
        now = _now()
        self._core.release(ticket, now)
        if self._core.pending:
            self._kick(now)

    def _make_feedback(self, granted_at: float, **fields: Any) -> Feedback:
        fields["sent_at"] = granted_at
        if fields["latency"] is None:
            fields["latency"] = max(0.0, _now() - granted_at)
        if fields["headers"]:
            from . import headers as _headers

            fields["rate_limit"] = _headers.parse(
                fields["headers"], now=time.time(), max_delay=_HEADER_MAX_DELAY
            )
        return Feedback(**fields)

    def _record(
        self, ticket: Ticket, feedback: Feedback, consumed: Mapping[str, float] | None
    ) -> None:
        now = _now()
        self._core.feedback(ticket, feedback, now, consumed)
        if self._core.pending:
            self._kick(now)

    def _kick_if_running(self) -> None:
        try:
            now = _now()
        except Exception:
            return
        self._kick(now)

    def _kick(self, now: float) -> None:
        """Grant what can be granted now and make sure one waiter holds the timer."""
        core = self._core
        for granted in core.dispatch(now):
            if granted is self._timekeeper:
                self._timekeeper = None
            granted.waker.set()
        if not core.waiting:
            self._timekeeper = None
            self._sleepers.clear()
            return
        wake = core.next_wake()
        keeper = self._timekeeper
        if keeper is not None and keeper.state == WAITING:
            if wake < self._armed:
                self._armed = wake
                keeper.waker.set()
            return
        self._timekeeper = None
        if wake == INF:
            return  # nothing time-based: a release will kick us
        sleepers = self._sleepers
        while sleepers:
            candidate = sleepers.popleft()
            if candidate.state == WAITING:
                self._timekeeper = candidate
                self._armed = -INF
                candidate.waker.set()
                return


def _check_limit(name: str, value: object, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {value!r}")
    if value < 1:
        raise ValueError(
            f"{name} must be >= 1{' or None (unlimited)' if optional else ''}, got {value!r}"
        )
