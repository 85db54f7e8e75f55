"""The async driver: the only part of throttlekit that awaits."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from . import scopes as _scopes
from ._checks import check_number
from ._clock import now as _now
from ._controller import Feedback
from ._errors import WouldBlock
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


#: The permits held in ``async with`` blocks by the running task (and, copied
#: with the context, by the tasks it starts: those are told apart by ``task``).
_HOLDS: ContextVar[tuple[Permit, ...]] = ContextVar("throttlekit_holds", default=())


def _current_task() -> object:
    """The running task (asyncio or trio), compared by identity."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # not on asyncio: trio, which is imported when it runs
        import trio

        return trio.lowlevel.current_task()


def _holds_of(limiter: Limiter, holds: tuple[Permit, ...]) -> list[Permit]:
    """The permits of ``limiter`` among ``holds`` that the running task holds."""
    if not holds:
        return []
    task = _current_task()
    return [
        hold
        for hold in holds
        if hold._token is not None and hold._limiter is limiter and hold._task is task
    ]


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


def _check_feedback(status: object, exception: object, latency: object, size: object) -> None:
    """``record()``'s arguments, checked: misuse is a TypeError/ValueError, never ignored."""
    if status is not None:
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"status must be an int HTTP status code, got {status!r}")
        if not 100 <= status <= 999:
            raise ValueError(f"status must be an HTTP status code (100-999), got {status!r}")
    if exception is not None and not isinstance(exception, BaseException):
        raise TypeError(f"exception must be an exception instance, got {exception!r}")
    if latency is not None:
        if isinstance(latency, bool) or not isinstance(latency, (int, float)):
            raise TypeError(f"latency must be a number of seconds, got {latency!r}")
        if not (math.isfinite(latency) and latency >= 0):
            raise ValueError(f"latency must be a finite number of seconds >= 0, got {latency!r}")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int number of bytes, got {size!r}")
        if size < 0:
            raise ValueError(f"size must be >= 0 bytes, got {size!r}")


class Permit:
    """A request's right to be sent, from :meth:`Limiter.acquire`.

    Use it as ``async with limiter.acquire(url) as permit:``; leaving the block
    gives back the concurrency it holds, also on error and on cancellation.
    Inside the block, report how the request went with :meth:`record`.
    """

    __slots__ = (
        "_encloses",
        "_lease",
        "_limiter",
        "_priority",
        "_request",
        "_scopes",
        "_shared",
        "_task",
        "_timeout",
        "_token",
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
        self._lease: Any = None  # the backend's lease
        # Nested in permits this task holds: (permit, the scopes shared with it).
        self._shared: tuple[tuple[Permit, frozenset[str]], ...] | None = None
        # Whether acquires inside its ``async with`` block nest in it (adapters
        # turn it off for the requests they send).
        self._encloses = True
        # While held in ``async with``: the task, and the token that entered it in _HOLDS.
        self._task: object = None
        self._token: Token[tuple[Permit, ...]] | None = None
        self.recorded = False

    def __repr__(self) -> str:
        return f"<Permit {self._lease!r}>" if self._lease else "<Permit (not acquired)>"

    @property
    def scopes(self) -> dict[str, float]:
        """The granted scopes and the cost taken from each.

        A permit nested in one that its task holds lists only the scopes it
        added (see :meth:`Limiter.acquire`).
        """
        if self._lease is None:
            if self._shared is not None:
                return {}
            raise RuntimeError("the permit has not been acquired yet")
        return dict(self._lease.scopes)

    @property
    def granted_at(self) -> float:
        """The limiter-clock time of the grant (the send time)."""
        if self._lease is None:
            if self._shared:
                return self._shared[0][0].granted_at
            raise RuntimeError("the permit has not been acquired yet")
        return float(self._lease.granted_at)

    @property
    def request(self) -> Any:
        """The request-like this permit was acquired for."""
        return self._request

    async def __aenter__(self) -> Permit:
        holds = _HOLDS.get()
        if not self._enter_now(holds):
            await self._enter_later(holds)
        if self._encloses:
            # Acquires nested in this block (same task, same limiter) share its scopes.
            self._task = _current_task()
            self._token = _HOLDS.set((*holds, self))
        return self

    def _enter_now(self, holds: tuple[Permit, ...]) -> bool:
        """The fast path, no await: a URL string, the default resolver, one scope with room."""
        if self._lease is not None or self._shared is not None:
            raise RuntimeError("a permit can be entered only once")
        limiter = self._limiter
        request = self._request
        # Fast path, no await: one scope of cost 1 that has room now
        # (limiter._one_scope, inline: a URL with the default resolver, or scopes="name").
        scopes = self._scopes
        if holds:
            scope = None  # maybe nested: the slow path looks
        elif scopes is None:
            if type(request) is str and limiter.resolver is _by_host:
                scope = limiter._hosts.get(request) or limiter._host_of(request)
            else:
                scope = None
        else:
            scope = scopes if type(scopes) is str else None
        if scope is not None:
            lease = limiter._try_one(scope, self._priority)
            if lease is not None:
                self._lease = lease
                return True
        return False

    async def _enter_later(self, holds: tuple[Permit, ...]) -> None:
        """Acquire; a permit nested in ones its task holds takes only the scopes they lack."""
        limiter = self._limiter
        mine = _holds_of(limiter, holds)
        if mine:
            await self._enter_nested(mine)
            return
        costs = limiter._resolve(self._request, self._scopes)
        if type(costs) is not dict:
            costs = _scopes.as_scope_costs(await costs)
        limiter._check_stall(costs)
        self._lease = await limiter._backend.acquire(
            costs, priority=self._priority, timeout=self._timeout
        )

    def _held_scopes(self) -> set[str]:
        """The scopes this permit holds: its own and those it shares with enclosing ones."""
        names = {name for _, shared in self._shared or () for name in shared}
        if self._lease is not None:
            names.update(self._lease.scopes)
        return names

    async def _enter_nested(self, holds: list[Permit]) -> None:
        limiter = self._limiter
        costs = limiter._resolve(self._request, self._scopes)
        if type(costs) is not dict:
            costs = _scopes.as_scope_costs(await costs)
        owner: dict[str, Permit] = {}
        for hold in holds:
            for name in hold._held_scopes():
                owner.setdefault(name, hold)
        self._shared = tuple(
            (hold, names)
            for hold in holds
            if (names := frozenset(name for name in costs if owner.get(name) is hold))
        )
        added = {name: cost for name, cost in costs.items() if name not in owner}
        if added:
            limiter._check_stall(added)
            # The enclosing permit holds a slot of the global cap: take none.
            self._lease = await limiter._backend.acquire(
                added, priority=self._priority, timeout=self._timeout, gated=False
            )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token = self._token
        if token is not None:
            self._token = self._task = None
            try:  # noqa: SIM105 - contextlib.suppress costs more on this path
                _HOLDS.reset(token)
            except ValueError:  # left in another context than it was entered in
                pass
        lease = self._lease
        if lease is not None:
            backend = self._limiter._backend
            if not backend.release_nowait(lease):
                await backend.release(lease)

    def __enter__(self) -> Permit:
        if self._lease is None:
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
        lease = self._lease
        if lease is not None and not self._limiter._backend.release_nowait(lease):
            raise RuntimeError("with a shared backend, release by leaving 'async with'")

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
        budgets: Mapping[str, str] | None = None,
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
        :param budgets: which of the permit's scopes tracks which budget the
            server reports, ``{budget: scope}`` (e.g. ``{"tokens":
            "openai-tokens"}``): that scope learns only its budget, counted in
            requests of its cost, and the other scopes learn the rest (see
            :meth:`throttlekit.headers.RateLimitInfo.for_scopes`). In memory
            only: the Redis backend keeps the last record of a permit, which
            is the one for the scopes that track no named budget.
        :returns: the :class:`Feedback` that was recorded.
        """
        lease = self._lease
        if lease is None and self._shared is None:
            raise RuntimeError("record() needs an acquired permit")
        if response is not None:
            if status is None:
                status = _status_of(response)
            if headers is None:
                headers = getattr(response, "headers", None)
        _check_feedback(status, exception, latency, size)
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
        own = {} if lease is None else lease.scopes
        shared = self._shared or ()
        if scopes is not None:
            scopes = _only(scopes, {**own, **{name: 0.0 for _, names in shared for name in names}})
        feedback = limiter._make_feedback(
            self.granted_at,
            status=status,
            headers=headers,
            exception=exception,
            latency=latency,
            size=size,
            adjust_delay=adjust_delay,
            scopes=scopes,
        )
        if lease is not None:
            own_scopes = None if scopes is None else scopes & own.keys()
            self._record_on(lease, own, own_scopes, feedback, consumed, budgets)
        for hold, names in shared:
            # The response also concerns the scopes the enclosing permit holds for us.
            outer = hold._lease
            if outer is not None and hold._token is not None:
                names = names if scopes is None else names & scopes
                costs = {name: outer.scopes[name] for name in names if name in outer.scopes}
                self._record_on(outer, costs, frozenset(costs), feedback, None, budgets)
        self.recorded = True
        return feedback

    def _record_on(
        self,
        lease: Any,
        costs: Mapping[str, float],
        scopes: frozenset[str] | None,
        feedback: Feedback,
        consumed: Mapping[str, float] | None,
        budgets: Mapping[str, str] | None,
    ) -> None:
        """Give ``feedback`` to ``scopes`` (``None``: all) of ``lease``, each its budget."""
        backend = self._limiter._backend
        if scopes is not None:
            feedback = attrs.evolve(feedback, scopes=scopes)
        info = feedback.rate_limit
        if not budgets or info is None:
            backend.record(lease, feedback, consumed)
            return
        # Each scope learns the budget it tracks: one record per distinct view,
        # the view of the scopes tracking no named budget last, with ``consumed``.
        rest = info.excluding(budgets.keys())
        groups: dict[Any, set[str]] = {rest: set()}
        for scope, view in info.for_scopes(costs, budgets).items():
            if scopes is None or scope in scopes:
                groups.setdefault(view, set()).add(scope)
        parts = [*list(groups.items())[1:], (rest, groups[rest])]
        for index, (view, group) in enumerate(parts):
            part = attrs.evolve(feedback, rate_limit=view, scopes=frozenset(group))
            last = index == len(parts) - 1
            backend.record(lease, part, consumed if last else None)


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
        self.resolver = resolver
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
        # What acquire() and acquire_nowait() return. Instrumentation
        # (throttlekit.otel) swaps in a subclass that records metrics, so a
        # limiter without it pays nothing for them.
        self._permit_type: type[Permit] = Permit
        # The scope of each URL string seen lately, with the default resolver.
        self._hosts: dict[str, str] = {}
        # The backend's fast path of one scope, if it has one (chosen once).
        self._try_one: Callable[[str, int], Any] = getattr(
            self._backend, "try_acquire_one", _no_fast_path
        )

    def __repr__(self) -> str:
        return f"<Limiter {self._backend!r}>"

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **kwargs: Any) -> Limiter:
        """Build a limiter from Scrapy-style settings (any mapping, or Scrapy's ``Settings``).

        Throttling: ``CONCURRENT_REQUESTS`` (the global cap, default 16; 0 =
        unlimited), ``CONCURRENT_REQUESTS_PER_DOMAIN`` (1), ``DOWNLOAD_DELAY``
        (1.0), ``DOWNLOAD_DELAY_PER_SLOT`` (1.0), ``RANDOMIZE_DOWNLOAD_DELAY``
        (True = jitter 0.5; a number or a ``[low, high]`` pair),
        ``THROTTLING_WINDOW`` (60.0), ``THROTTLING_MAX_STALL`` (None),
        ``THROTTLING_ROBOTSTXT_MAX_DELAY`` (60.0).

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
        if type(priority) is not int and (
            isinstance(priority, bool) or not isinstance(priority, int)
        ):
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
        event loop (it reads the backend's clock). A shared backend cannot
        grant without a round trip, so with one this always raises
        :class:`WouldBlock`.
        """
        if request is None and scopes is None:
            raise TypeError("acquire_nowait() needs a request or scopes=")
        scope = self._one_scope(request, scopes)
        lease = None if scope is None else self._try_one(scope, priority)
        if lease is None:
            costs = self._resolve(request, scopes)
            if type(costs) is not dict:
                if inspect.iscoroutine(costs):
                    costs.close()
                raise RuntimeError("acquire_nowait() cannot use an async resolver; use acquire()")
            lease = self._backend.try_acquire(costs, priority)
            if lease is None:
                raise WouldBlock(f"no room now for {costs}")
        permit = self._permit_type(self, request, priority, None, scopes)
        permit._lease = lease
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

    def _one_scope(self, request: Any, scopes: _scopes.ScopesLike | None) -> str | None:
        """The scope of a request of one scope of cost 1 whose name is cheap to know,
        else ``None``: a URL string with the default resolver, or ``scopes="name"``."""
        if scopes is None:
            if type(request) is str and self.resolver is _by_host:
                return self._hosts.get(request) or self._host_of(request)
            return None
        return scopes if type(scopes) is str else None

    def _host_of(self, url: str) -> str:
        """``by_host(url)``, remembered for the fast path (bounded: cleared when full)."""
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
        carried = _scopes.request_scopes(request)
        if carried is not None:
            return _scopes.as_scope_costs(carried)
        result = self.resolver(request)
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


def _no_fast_path(scope: str, priority: int) -> None:
    """The fast path of a backend that has none: always take the general path."""
    return None


def _check_limit(name: str, value: object, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {value!r}")
    if value < 1:
        raise ValueError(
            f"{name} must be >= 1{' or None (unlimited)' if optional else ''}, got {value!r}"
        )
