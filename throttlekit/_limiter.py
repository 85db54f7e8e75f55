"""The async driver: the only part of throttlekit that awaits."""

from __future__ import annotations

import inspect
import logging
import math
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from . import scopes as _scopes
from ._checks import check_number
from ._clock import now as _now
from ._controller import Feedback
from ._permit import Permit
from ._policy import ScopePolicy
from ._stats import LimiterStatistics, ScopeStatistics
from .backends.memory import MemoryBackend

if TYPE_CHECKING:
    from .backends import Backend

__all__ = ["Limiter", "Permit"]

logger = logging.getLogger("throttlekit")

_by_host = _scopes.by_host
#: Most URL strings whose scope (host) a limiter remembers: more than the
#: default ``max_scopes``, so a round-robin over that many hosts stays cached.
_HOSTS_MAX = 131_072

#: The longest wait read from rate-limit headers here (about 30 years): no cap
#: in practice, so that each scope's ``Backoff.max_delay`` is the cap that applies.
_HEADER_MAX_DELAY = 1e9


class Limiter:
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
        self.robotstxt_max_delay = check_number(
            "robotstxt_max_delay", robotstxt_max_delay, minimum=0.0
        )
        self._crawl_delays: dict[str, float] = {}
        self._crawl_warned: set[str] = set()
        self._resolver = resolver
        self.max_waiters = max_waiters
        self._local = local = MemoryBackend(
            policies=scopes,
            default=default,
            concurrency=concurrency,
            max_waiters=max_waiters,
            max_scopes=max_scopes,
            max_idle=float(max_idle),
            rng=random.Random(seed),
        )
        # The backend is chosen once: the in-memory one, or a shared one bound to it.
        self._backend: Backend = local if backend is None else backend
        self._backend.bind(local)
        # What acquire() and acquire_nowait() return: the backend's permit
        # type (the in-memory one grants on a fast path of its own), or the
        # general Permit. Instrumentation (throttlekit.otel) swaps in a
        # subclass that records metrics, so a limiter without it pays nothing.
        self._permit_type: type[Permit] = getattr(self._backend, "permit_type", Permit)
        # The permits held in ``async with`` blocks (for nested acquires): None,
        # the only one held, or the innermost one of each task by task (see
        # _permit._held_permits).
        self._holds: Permit | dict[object, Permit] | None = None
        # The scope of each URL string seen lately, with the default resolver:
        # its name, or (once granted in memory) its ledger, for the fast path.
        self._hosts: dict[str, Any] = {}
        # What the fast path of MemoryPermit reads, one attribute away: the
        # in-memory scope ledgers by name, and the global cap.
        self._ledgers = local.core.scopes
        self._gate = local.core.gate

    def __repr__(self) -> str:
        return f"<Limiter {self._backend!r}>"

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **kwargs: Any) -> Limiter:
        """Build a limiter from Scrapy-style settings (any mapping, or Scrapy's ``Settings``).

        Throttling: ``CONCURRENT_REQUESTS`` (the global cap, default 16; 0 =
        unlimited), ``CONCURRENT_REQUESTS_PER_DOMAIN`` (1; or its newer name
        ``THROTTLING_SCOPE_CONCURRENCY``, which wins), ``DOWNLOAD_DELAY``
        (1.0), ``DOWNLOAD_DELAY_PER_SLOT`` (1.0; both 0 when not given under
        ``THROTTLING_ADAPTIVE``), ``RANDOMIZE_DOWNLOAD_DELAY``
        (True = jitter 0.5; a number or a ``[low, high]`` pair),
        ``THROTTLING_WINDOW`` (60.0), ``THROTTLING_MAX_STALL`` (None),
        ``THROTTLING_ROBOTSTXT_MAX_DELAY`` (60.0), ``THROTTLING_SCOPE_LIMIT``
        (100000, the constructor's ``max_scopes``), ``THROTTLING_ADAPTIVE``
        (False; True or a dict of :class:`Adaptive` options).

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
        ``window``, ``max_stall``, ``ignore_robots_txt``, and ``backoff`` / ``rampup`` /
        ``autothrottle`` / ``adaptive`` (``True``, ``False`` or a dict of their
        fields), and ``manager`` (the import path of a controller factory,
        tried once here). Scrapy's ``DOWNLOAD_SLOTS`` entries (``concurrency``,
        ``delay``, ``jitter`` or ``randomize_delay``) are scopes too, under
        ``THROTTLING_SCOPES``'s keys. Other keyword arguments go to the
        constructor. Invalid values raise :class:`ValueError`/:class:`TypeError`
        naming the setting; so does a misspelt name, with the closest one.
        """
        from ._settings import limiter_options

        options = limiter_options(settings)
        options.update(kwargs)
        return cls(**options)

    # -- public API ----------------------------------------------------------------

    @property
    def resolver(self) -> _scopes.Resolver:
        """Maps a request-like to its scopes (see :mod:`throttlekit.scopes`); settable."""
        return self._resolver

    @resolver.setter
    def resolver(self, resolver: _scopes.Resolver) -> None:
        if not callable(resolver):
            raise TypeError(f"resolver must be callable, got {resolver!r}")
        self._resolver = resolver
        self._hosts.clear()  # the scopes of URLs the old resolver gave

    @property
    def backend(self) -> Backend | None:
        """The shared state backend, or ``None`` for in-memory ledgers."""
        return None if self._backend is self._local else self._backend

    @property
    def default(self) -> ScopePolicy:
        """The policy of scopes not configured explicitly."""
        return self._local.default

    @property
    def policies(self) -> Mapping[str, ScopePolicy]:
        """The explicitly configured scope policies."""
        return self._local.policies

    def policy(self, scope: str) -> ScopePolicy:
        """The policy that applies to ``scope``."""
        return self._local.policy(scope)

    def set_policy(self, scope: str, policy: ScopePolicy) -> None:
        """Configure ``scope`` with ``policy`` from now on (live counters are kept)."""
        if not isinstance(policy, ScopePolicy):
            raise TypeError(f"policy must be a ScopePolicy, got {policy!r}")
        self._local.set_policy(scope, policy)

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
            _check_acquire(request, priority, timeout, scopes)
        # Its fields are set here, not by an __init__: a permit per request is
        # the hot path (see Permit for what each field means).
        permit: Permit = self._permit_type()
        permit._limiter = self
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
        explicit = self._local.core.policies.get(scope)
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
        policy = attrs.evolve(self._local.default, concurrency=1, delay=delay)
        logger.debug("scope %s: Crawl-Delay %s s from robots.txt", scope, delay)
        self._local.set_policy(scope, policy)

    @property
    def crawl_delays(self) -> Mapping[str, float]:
        """The robots.txt Crawl-Delays applied so far, by scope."""
        return dict(self._crawl_delays)

    def statistics(self) -> LimiterStatistics:
        """A frozen snapshot of the limiter and every scope it tracks in this process.

        It costs O(scopes); to watch one scope use :meth:`scope_statistics`.
        """
        return self._local.statistics()

    def scope_statistics(self, scope: str) -> ScopeStatistics | None:
        """A frozen snapshot of one scope, or ``None`` if the limiter does not track it."""
        return self._local.scope_statistics(scope)

    # -- internals -----------------------------------------------------------------

    def _host_of(self, url: str) -> str:
        """``by_host(url)``, remembered (bounded: cleared when full)."""
        host = self._hosts.get(url)
        if type(host) is not str:
            if host is not None:  # the scope's ledger, once granted in memory
                return host.name  # type: ignore[no-any-return]
            host = _by_host(url)
            hosts = self._hosts
            if len(hosts) >= _HOSTS_MAX:
                hosts.clear()
            hosts[url] = host
        return host

    def _resolve(self, request: Any, scopes: _scopes.ScopesLike | None) -> Any:
        """The request's ``{scope: cost}``, or an awaitable of the resolver's result."""
        if scopes is not None:
            return _scopes.as_scope_costs(scopes)
        resolver = self._resolver
        if resolver is _by_host and type(request) is str:
            # Remembered: the fast path of the in-memory backend looks URLs up there.
            return {self._host_of(request): 1.0}
        carried = _scopes.request_scopes(request)
        if carried is not None:
            return _scopes.as_scope_costs(carried)
        result = resolver(request)
        if type(result) is str:
            return {result: 1.0}
        if inspect.isawaitable(result):
            return result
        return _scopes.as_scope_costs(result)

    def _check_stall(self, costs: Mapping[str, float]) -> None:
        """Raise :class:`ScopeStalled` if a scope with ``max_stall`` reopens later than that."""
        scopes = self._local.core.scopes
        now = None
        for name, cost in costs.items():
            ledger = scopes.get(name)
            if ledger is None or ledger.policy.max_stall is None:
                continue
            if now is None:
                now = _now()
            stalled = ledger.stalled(cost, now)
            if stalled is not None:
                raise stalled

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


def _check_acquire(request: Any, priority: object, timeout: object, scopes: object) -> None:
    """Raise if ``acquire()``'s arguments are wrong (the caller has seen they may be)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {priority!r}")
    if timeout is not None and not (timeout >= 0):  # type: ignore[operator]
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    if request is None and scopes is None:
        raise TypeError("acquire() needs a request or scopes=")


def _check_limit(name: str, value: object, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {value!r}")
    if value < 1:
        raise ValueError(
            f"{name} must be >= 1{' or None (unlimited)' if optional else ''}, got {value!r}"
        )
