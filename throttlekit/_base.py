"""What both drivers share: configuration, scopes, statistics and feedback.

:class:`BaseLimiter` is everything of a limiter but how it waits: the
async :class:`~throttlekit.Limiter` awaits, the
:class:`~throttlekit.SyncLimiter` blocks its thread. Both grant through
the same in-memory backend, sans-IO scheduler and fast lane.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from . import _clock, _pauses
from . import scopes as _scopes
from ._checks import check_number
from ._controller import Feedback
from ._listeners import AsyncHeard, LimiterListener, SyncHeard, heard_type
from ._permit import Permit
from ._policy import ScopePolicy
from ._stats import LimiterStatistics, ScopeStatistics
from .backends.memory import MemoryBackend

if TYPE_CHECKING:
    from .backends import Backend

__all__ = ["BaseLimiter", "check_acquire"]

logger = logging.getLogger("throttlekit")

_by_host = _scopes.by_host
_L = TypeVar("_L", bound="BaseLimiter")

#: The longest wait read from rate-limit headers here (about 30 years): no cap
#: in practice, so that each scope's ``Backoff.max_delay`` is the cap that applies.
_HEADER_MAX_DELAY = 1e9


class BaseLimiter:
    """The part of a limiter that does not wait: see :class:`~throttlekit.Limiter`.

    Subclasses say how they wait; they choose their in-memory backend with
    ``_local_type`` (its clock, and whether it takes a lock).
    """

    #: The in-memory backend class of this driver.
    _local_type: ClassVar[type[MemoryBackend]] = MemoryBackend
    #: Whether a shared backend (``backend=``) can serve this driver.
    _shares_backends: ClassVar[bool] = True
    #: What this driver's permits mix in to tell listeners.
    _heard: ClassVar[type[AsyncHeard] | type[SyncHeard]] = AsyncHeard

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
        if backend is not None and not self._shares_backends:
            raise TypeError(
                f"{type(self).__name__} has no shared backend yet (the Redis backend is "
                f"async-only); got backend={backend!r}"
            )
        self.robotstxt_max_delay = check_number(
            "robotstxt_max_delay", robotstxt_max_delay, minimum=0.0
        )
        self._crawl_delays: dict[str, float] = {}
        self._crawl_warned: set[str] = set()
        self._resolver = resolver
        self.max_waiters = max_waiters
        self._local = local = self._local_type(
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
        self._plain_permit_type = self._permit_type
        self._listeners: tuple[LimiterListener, ...] = ()
        # The uncontended grant, the URLs' scopes and the held permits.
        self._lane = local.lane
        local.lane.set_resolver(resolver)

    @classmethod
    def from_settings(cls: type[_L], settings: Mapping[str, Any], **kwargs: Any) -> _L:
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
        self._lane.set_resolver(resolver)  # forgets the scopes of URLs the old one gave

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
    def listeners(self) -> tuple[LimiterListener, ...]:
        """The listeners added with :meth:`add_listener`, in order."""
        return self._listeners

    def add_listener(self, listener: LimiterListener) -> None:
        """Tell ``listener`` what every permit handed out from now on does.

        ``listener`` has the methods of :class:`~throttlekit.LimiterListener`
        (wait, grant, failure, release, feedback). A limiter without
        listeners pays nothing for them; with some, each permit calls them.

        :raises TypeError: ``listener`` lacks one of the methods.
        :raises ValueError: ``listener`` was added already.
        """
        if not isinstance(listener, LimiterListener):
            raise TypeError(
                f"listener must have the methods of throttlekit.LimiterListener, got {listener!r}"
            )
        if any(listener is known for known in self._listeners):
            raise ValueError(f"{listener!r} is already a listener of this limiter")
        self._set_listeners((*self._listeners, listener))

    def remove_listener(self, listener: LimiterListener) -> None:
        """Stop telling ``listener`` (permits handed out already still do); no-op if unknown."""
        self._set_listeners(tuple(known for known in self._listeners if known is not listener))

    def _set_listeners(self, listeners: tuple[LimiterListener, ...]) -> None:
        self._listeners = listeners
        plain = self._plain_permit_type
        self._permit_type = heard_type(self._heard, plain, listeners) if listeners else plain

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

    def _resolve(self, request: Any, scopes: _scopes.ScopesLike | None) -> Any:
        """The request's ``{scope: cost}``, or an awaitable of the resolver's result."""
        if scopes is not None:
            return _scopes.as_scope_costs(scopes)
        resolver = self._resolver
        if resolver is _by_host and type(request) is str:
            # Remembered: the fast path of the in-memory backend looks URLs up there.
            return {self._lane.host_of(request): 1.0}
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
                now = self._local.now()
            stalled = ledger.stalled(cost, now)
            if stalled is not None:
                raise stalled

    def _make_feedback(self, granted_at: float, **fields: Any) -> Feedback:
        fields["sent_at"] = granted_at
        fields["paused"] = _pauses.last_before(granted_at)
        if fields["latency"] is None:
            fields["latency"] = max(0.0, self._local.now() - granted_at)
        body = fields.pop("body", None)
        if fields["headers"] or body is not None:
            from . import headers as _headers

            # The one reading of a response that every controller shares
            # (Retry-After only on the statuses that define it, a wait in a 429's body).
            fields["rate_limit"] = _headers.parse(
                fields["headers"],
                now=_clock.wall(),
                max_delay=_HEADER_MAX_DELAY,
                status=fields["status"],
                body=body,
            )
        return Feedback(**fields)


def check_acquire(request: Any, priority: object, timeout: object, scopes: object) -> None:
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
