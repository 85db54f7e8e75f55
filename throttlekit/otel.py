"""OpenTelemetry metrics of what a limiter does: waits, grants, backoff signals, limits in force.

Install the extra (``pip install "throttlekit-http[otel]"``, which brings the
OpenTelemetry *API* only), set up the OpenTelemetry SDK and an exporter in
the application as usual, then instrument each limiter once::

    from throttlekit.otel import instrument

    metrics = instrument(limiter)  # uses the global meter provider

Nothing is recorded, and nothing is paid, for a limiter that is not
instrumented. An instrumented limiter hands out permits that record, per
request: the time it waited for its permit (a histogram, also of the waits
that ended in a timeout, an overload or a cancellation), the grant, the
backoff signals and the waits servers asked for in what :meth:`Permit.record
<throttlekit.Permit.record>` is told. The number of permits held and of
requests waiting, and each scope's effective delay and concurrency, are
observed when the metric reader collects.

Attributes are bounded by default: scopes are grouped (attribute
``throttlekit.scope.group``) by their policy, so a broad crawl of 100,000
hosts yields a handful of series, not 100,000. See :func:`instrument` for
``scope_group=`` and ``per_scope=True``, and the docs page *Metrics* for
the table of every metric.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio

from . import __version__
from ._backoff import Backoff
from ._base import BaseLimiter
from ._clock import now as _now
from ._errors import BackendUnavailable, Overloaded, ThrottleTimeout
from ._ledger import _DEFAULT_BACKOFF
from ._limiter import Limiter, Permit
from ._sync import SyncLimiter
from .adapters._common import missing_extra

try:
    from opentelemetry import metrics as _otel
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise missing_extra("throttlekit.otel", "opentelemetry-api", "otel") from exc

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

    from ._controller import Feedback
    from ._stats import ScopeStatistics

__all__ = ["LimiterMetrics", "instrument"]

logger = logging.getLogger("throttlekit.otel")

#: The group of scopes that have the limiter's default policy.
_DEFAULT_GROUP: Final = "default"
#: The group of scopes whose policy was set after instrumenting (robots.txt
#: ``Crawl-Delay``, :meth:`Limiter.set_policy <throttlekit.Limiter.set_policy>`).
_OTHER_GROUP: Final = "other"
#: The group of a request that was not granted and whose scopes cannot be told
#: without running its (async) resolver again.
_UNKNOWN_GROUP: Final = "unknown"

#: Histogram buckets of ``throttlekit.permit.wait_time`` (seconds).
_WAIT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
#: Histogram buckets of ``throttlekit.server.requested_wait`` (seconds).
_SERVER_WAIT_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

#: Most scopes whose shared state LimiterMetrics.watch_shared_state() reads.
_MAX_SHARED_SCOPES: Final = 1000

# Attribute names.
_GROUP: Final = "throttlekit.scope.group"
_OUTCOME: Final = "throttlekit.acquire.outcome"
_STATE: Final = "throttlekit.scope.state"
_LIMITER: Final = "throttlekit.limiter.name"
_ERROR_TYPE: Final = "error.type"


def instrument(
    limiter: Limiter | SyncLimiter,
    *,
    meter_provider: MeterProvider | None = None,
    name: str | None = None,
    scope_group: Callable[[str], str] | None = None,
    per_scope: bool = False,
) -> LimiterMetrics:
    """Record OpenTelemetry metrics of everything ``limiter`` does from now on.

    :param limiter: the limiter to instrument (once; permits it handed out
        before are not counted).
    :param meter_provider: where the instruments are created; default: the
        global one (``opentelemetry.metrics.set_meter_provider``), so set
        that up first.
    :param name: a ``throttlekit.limiter.name`` attribute on every metric,
        to tell several limiters of one process apart; default: none.
    :param scope_group: maps a scope name to the value of the
        ``throttlekit.scope.group`` attribute (e.g. the registrable domain,
        or ``"api"`` for every API key). Keep its results few: each distinct
        value is a series of every metric.
    :param per_scope: ``True`` uses every scope's name as its group: exact,
        per host, but one series per scope (only for a few known scopes).
    :returns: the :class:`LimiterMetrics`; :meth:`LimiterMetrics.close` stops.
    :raises RuntimeError: the limiter is already instrumented.

    By default a scope named in the limiter's ``scopes=`` (``THROTTLING_SCOPES``)
    is its own group, a scope with the default policy is in the group
    ``"default"``, and a scope whose policy was set later (a robots.txt
    ``Crawl-Delay``, ``set_policy()``) in the group ``"other"``.
    """
    return LimiterMetrics(
        limiter,
        meter_provider=meter_provider,
        name=name,
        scope_group=scope_group,
        per_scope=per_scope,
    )


class LimiterMetrics:
    """The metrics of one instrumented :class:`~throttlekit.Limiter` (see :func:`instrument`).

    It holds the live counts that the observable instruments report:
    ``grants`` (permits granted) and ``active`` (permits held), both by scope
    group, and ``waiting`` (requests in ``acquire()``); ``group_of`` maps a
    scope to its group. Usage::

        metrics = instrument(limiter, name="crawler")
        ...
        metrics.close()  # the limiter's new permits are not metered any more
    """

    def __init__(
        self,
        limiter: Limiter | SyncLimiter,
        *,
        meter_provider: MeterProvider | None = None,
        name: str | None = None,
        scope_group: Callable[[str], str] | None = None,
        per_scope: bool = False,
    ) -> None:
        if not isinstance(limiter, BaseLimiter):
            raise TypeError(
                f"limiter must be a throttlekit.Limiter or SyncLimiter, got {limiter!r}"
            )
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        if scope_group is not None and not callable(scope_group):
            raise TypeError(f"scope_group must be callable or None, got {scope_group!r}")
        if not isinstance(per_scope, bool):
            raise TypeError(f"per_scope must be a bool, got {per_scope!r}")
        if per_scope and scope_group is not None:
            raise ValueError("give scope_group or per_scope=True, not both")
        if any(isinstance(known, LimiterMetrics) for known in limiter.listeners):
            raise RuntimeError(f"{limiter!r} is already instrumented")
        self.name = name
        self._limiter = weakref.ref(limiter)
        self._base: dict[str, str] = {} if name is None else {_LIMITER: name}
        if per_scope:
            self.group_of: Callable[[str], str] = _same
        elif scope_group is not None:
            self.group_of = scope_group
        else:
            self.group_of = _policy_group(limiter)
        #: Permits granted, by group (read by an observable counter: cheap to count).
        self.grants: dict[str, int] = {}
        #: Permits held now, by group.
        self.active: dict[str, int] = {}
        #: Requests inside ``acquire()`` now (waiting for a permit).
        self.waiting = 0
        # The limiter's clock minus time.monotonic(), sampled on the loop at each
        # grant and feedback: what "now" is when a reader collects from its thread.
        self._offset = 0.0
        self._granted_attributes: dict[str, dict[str, str]] = {}
        # With a shared backend: the scopes this process was granted lately (most
        # recent last), and their shared state as watch_shared_state() last read it.
        self._shared = limiter.backend is not None
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._shared_state: dict[str, ScopeStatistics] = {}
        self.closed = False
        # The groups each held permit was counted in, and the permits waiting, by id.
        self._held: dict[int, tuple[str, ...]] = {}
        self._waiters: set[int] = set()
        # Listeners are called from every thread of a SyncLimiter.
        self._lock = threading.Lock()
        provider = meter_provider if meter_provider is not None else _otel.get_meter_provider()
        self._instruments = _Instruments.of(provider)
        self._instruments.add(self)
        limiter.add_listener(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        name = f" {self.name!r}" if self.name is not None else ""
        return (
            f"<LimiterMetrics{name} {state} grants={sum(self.grants.values())} "
            f"active={sum(self.active.values())} waiting={self.waiting}>"
        )

    @property
    def limiter(self) -> Limiter | SyncLimiter | None:
        """The instrumented limiter (``None`` once it has been garbage-collected)."""
        return self._limiter()

    def close(self) -> None:
        """Stop: the limiter's new permits are not metered, its gauges not reported."""
        if self.closed:
            return
        self.closed = True
        self._instruments.discard(self)
        limiter = self._limiter()
        if limiter is not None:
            limiter.remove_listener(self)

    async def watch_shared_state(self, interval: float = 15.0) -> None:
        """With a shared backend, keep the ``throttlekit.scope.*`` gauges on the shared state.

        A shared backend (Redis) keeps each scope's delay, concurrency and
        blocks where every process sees them, not in this process's memory.
        This coroutine reads them every ``interval`` seconds with the
        backend's ``scope_statistics()`` (one round trip per scope) for the
        scopes this process was granted lately (the 1,000 most recent), so
        that the gauges show what all processes see. Start it in a task of
        your own and cancel it to stop; it returns when :meth:`close` is called.
        A scope that cannot be read (the store is away) drops out of the
        gauges until it can.

        :param interval: seconds between two readings (> 0).
        :raises RuntimeError: the limiter has no shared backend.
        :raises TypeError: the backend cannot report a scope's shared state.
        :raises ValueError: ``interval`` is not a number of seconds > 0.
        """
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"interval must be a number of seconds, got {interval!r}")
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a finite number of seconds > 0, got {interval!r}")
        limiter = self._limiter()
        backend = None if limiter is None else limiter.backend
        if limiter is None or backend is None:
            raise RuntimeError("watch_shared_state() needs a limiter with a shared backend")
        read = getattr(backend, "scope_statistics", None)
        if read is None:
            raise TypeError(f"{backend!r} cannot report the shared state of a scope")
        while not self.closed:
            fresh: dict[str, ScopeStatistics] = {}
            for scope in list(self._recent):
                try:
                    fresh[scope] = await read(limiter, scope)
                except Exception as exc:
                    logger.debug("cannot read the shared state of %s: %r", scope, exc)
            self._shared_state = fresh
            await anyio.sleep(interval)

    # -- recording (on the event loop) ---------------------------------------------

    def _attributes(self, group: str, **extra: str) -> dict[str, str]:
        attributes = {**self._base, _GROUP: group}
        attributes.update(extra)
        return attributes

    def _groups(self, scopes: Iterable[str]) -> set[str]:
        group_of = self.group_of
        return {group_of(scope) for scope in scopes}

    # -- the listener (see throttlekit.LimiterListener) --------------------------------

    def on_wait(self, permit: Permit) -> None:
        """A request started to wait for its permit."""
        with self._lock:
            self.waiting += 1
            self._waiters.add(id(permit))

    def on_grant(self, permit: Permit, waited: float) -> None:
        """A permit was granted after ``waited`` seconds (a nowait one had not waited)."""
        with self._lock:
            if id(permit) in self._waiters:
                self._waiters.discard(id(permit))
                self.waiting -= 1
            groups = self._granted(permit, waited)
            if groups:
                self._held[id(permit)] = groups

    def on_fail(self, permit: Permit, exc: BaseException, waited: float) -> None:
        """A request was not granted (timeout, overload, cancellation...)."""
        with self._lock:
            self._waiters.discard(id(permit))
            self.waiting -= 1
            self._failed(permit, exc, waited)

    def on_release(self, permit: Permit) -> None:
        """A granted permit was given back."""
        with self._lock:
            groups = self._held.pop(id(permit), None)
            if groups is not None:
                self._released(groups)

    def on_feedback(self, permit: Permit, feedback: Feedback) -> None:
        """Feedback was recorded on a permit."""
        self._feedback(permit, feedback)

    def _granted(self, permit: Permit, waited: float) -> tuple[str, ...]:
        lease = permit._get_lease()
        if lease is None:
            return ()  # nested in a permit its task holds: it shares that one, granted nothing
        self._offset = lease.granted_at - time.monotonic()
        scopes = lease.scopes
        group_of = self.group_of
        if len(scopes) == 1:
            groups: tuple[str, ...] = (group_of(next(iter(scopes))),)
        else:
            groups = tuple({group_of(scope) for scope in scopes})
        if self._shared:
            recent = self._recent
            for scope in scopes:
                recent[scope] = None
                recent.move_to_end(scope)
            while len(recent) > _MAX_SHARED_SCOPES:
                recent.popitem(last=False)
        grants, active = self.grants, self.active
        record = self._instruments.wait_time.record
        cache = self._granted_attributes
        for group in groups:
            grants[group] = grants.get(group, 0) + 1
            active[group] = active.get(group, 0) + 1
            attributes = cache.get(group)
            if attributes is None:
                if len(cache) >= 4096:  # per_scope=True over many scopes: keep it bounded
                    cache.clear()
                attributes = cache[group] = self._attributes(group, **{_OUTCOME: "granted"})
            record(waited, attributes)
        return groups

    def _released(self, groups: tuple[str, ...]) -> None:
        active = self.active
        for group in groups:
            active[group] -= 1

    def _failed(self, permit: Permit, exc: BaseException, waited: float) -> None:
        if isinstance(exc, ThrottleTimeout):
            outcome, counter = "timeout", self._instruments.timeouts
        elif isinstance(exc, Overloaded):
            outcome, counter = "overloaded", self._instruments.overloads
        elif isinstance(exc, BackendUnavailable):
            outcome, counter = "unavailable", None
        elif not isinstance(exc, Exception):
            outcome, counter = "cancelled", None  # cancellation, KeyboardInterrupt...
        else:
            return  # a misuse or a resolver's error: not a throttling decision
        histogram = self._instruments.wait_time
        for group in self._groups(_requested_scopes(permit)) or {_UNKNOWN_GROUP}:
            attributes = self._attributes(group)
            if counter is not None:
                counter.add(1, attributes)
            attributes[_OUTCOME] = outcome
            histogram.record(waited, attributes)

    def _feedback(self, permit: Permit, feedback: Feedback) -> None:
        limiter = self._limiter()
        if limiter is None:
            return
        self._offset = _offset_of(limiter)
        scopes: Iterable[str] = feedback.scopes if feedback.scopes is not None else _fed(permit)
        info = feedback.rate_limit
        requested = None if info is None else info.wait()
        signalled: dict[str, str] = {}
        asked: set[str] = set()
        group_of = self.group_of
        for scope in scopes:
            group = group_of(scope)
            if requested is not None and requested > 0:
                asked.add(group)
            policy = limiter.policy(scope)
            backoff = policy.backoff
            if backoff is None and policy.rampup is not None:
                backoff = _DEFAULT_BACKOFF  # rampup counts signals by the default rule
            if backoff is not None and backoff.is_signal(feedback):
                signalled[group] = _signal_name(backoff, feedback)
        instruments = self._instruments
        for group, signal in signalled.items():
            instruments.signals.add(1, self._attributes(group, **{_ERROR_TYPE: signal}))
        for group in asked:
            assert requested is not None
            instruments.server_wait.record(requested, self._attributes(group))

    def _clock(self) -> float:
        """The limiter's clock; off the event loop (an exporter's thread), an estimate."""
        try:
            return _now()
        except Exception:
            return time.monotonic() + self._offset

    # -- observing (on the metric reader's thread) ---------------------------------

    def _observe_counts(self, counts: dict[str, int]) -> Iterator[Observation]:
        for group, value in list(counts.items()):
            yield _otel.Observation(value, self._attributes(group))

    def _observe_waiting(self) -> Iterator[Observation]:
        yield _otel.Observation(self.waiting, dict(self._base))

    def _observe_scopes(self) -> Iterator[tuple[str, Observation]]:
        """Per group: scopes by state, waiting requests, largest delay, least concurrency."""
        limiter = self._limiter()
        if limiter is None:
            return
        now = self._clock()
        group_of = self.group_of
        states: dict[tuple[str, str], int] = {}
        waiting: dict[str, int] = {}
        delay: dict[str, float] = {}
        concurrency: dict[str, int] = {}
        if self._shared:
            scopes: list[Any] = list(self._shared_state.values())
        else:
            scopes = _ledgers(limiter)
        for scope in scopes:
            group = group_of(scope.name)
            policy = limiter.policy(scope.name) if self._shared else scope.policy
            limit = scope.concurrency
            if scope.blocked_until > now:
                state = "blocked"
            elif scope.delay > policy.delay or (
                limit is not None and (policy.concurrency is None or limit < policy.concurrency)
            ):
                state = "slowed"
            else:
                state = "normal"
            states[group, state] = states.get((group, state), 0) + 1
            # (A ledger counts its waiting requests as in_line, statistics as waiting.)
            waiting[group] = waiting.get(group, 0) + (
                scope.waiting if self._shared else scope.in_line
            )
            delay[group] = max(delay.get(group, 0.0), scope.delay)
            if limit is not None:
                concurrency[group] = min(concurrency.get(group, limit), limit)
        for (group, state), count in states.items():
            yield "count", _otel.Observation(count, self._attributes(group, **{_STATE: state}))
        for group, value in waiting.items():
            yield "waiting", _otel.Observation(value, self._attributes(group))
        for group, seconds in delay.items():
            yield "delay", _otel.Observation(seconds, self._attributes(group))
        for group, value in concurrency.items():
            yield "concurrency", _otel.Observation(value, self._attributes(group))


class _Instruments:
    """One meter provider's instruments, shared by every limiter instrumented with it.

    An OpenTelemetry meter gives the same instrument for the same name, so
    the observable instruments' callbacks go over every registered
    :class:`LimiterMetrics` (held weakly: a limiter that is gone drops out).
    """

    _shared: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    @classmethod
    def of(cls, provider: MeterProvider) -> _Instruments:
        with cls._lock:
            instruments = cls._shared.get(provider)
            if instruments is None:
                instruments = cls._shared[provider] = cls(
                    provider.get_meter("throttlekit", __version__)
                )
            return instruments

    def __init__(self, meter: Meter) -> None:
        self._members: weakref.WeakSet[LimiterMetrics] = weakref.WeakSet()
        self._scope_cache: tuple[float, dict[str, list[Observation]]] = (-1.0, {})
        self.wait_time = meter.create_histogram(
            "throttlekit.permit.wait_time",
            unit="s",
            description="Time each acquire() waited for its permit (or until it gave up).",
            explicit_bucket_boundaries_advisory=_WAIT_BUCKETS,
        )
        self.timeouts = meter.create_counter(
            "throttlekit.permit.timeouts",
            unit="{timeout}",
            description="acquire() calls that ran out of time (ThrottleTimeout).",
        )
        self.overloads = meter.create_counter(
            "throttlekit.permit.overloads",
            unit="{request}",
            description="acquire() calls refused because max_waiters were waiting (Overloaded).",
        )
        self.signals = meter.create_counter(
            "throttlekit.backoff.signals",
            unit="{signal}",
            description="Responses and failures that a scope's backoff counts as a signal.",
        )
        self.server_wait = meter.create_histogram(
            "throttlekit.server.requested_wait",
            unit="s",
            description="Waits servers asked for (Retry-After, or a spent RateLimit's reset).",
            explicit_bucket_boundaries_advisory=_SERVER_WAIT_BUCKETS,
        )
        meter.create_observable_counter(
            "throttlekit.permit.grants",
            callbacks=[self._observe_grants],
            unit="{permit}",
            description="Permits granted.",
        )
        meter.create_observable_up_down_counter(
            "throttlekit.permit.active",
            callbacks=[self._observe_active],
            unit="{permit}",
            description="Permits held now (requests being sent).",
        )
        meter.create_observable_up_down_counter(
            "throttlekit.permit.waiting",
            callbacks=[self._observe_waiting],
            unit="{request}",
            description="Requests waiting in acquire() now.",
        )
        meter.create_observable_up_down_counter(
            "throttlekit.scope.count",
            callbacks=[self._scope_callback("count")],
            unit="{scope}",
            description="Scopes tracked, by state (blocked by a server, slowed, normal).",
        )
        meter.create_observable_up_down_counter(
            "throttlekit.scope.waiting",
            callbacks=[self._scope_callback("waiting")],
            unit="{request}",
            description="Requests waiting that need a scope of the group.",
        )
        meter.create_observable_gauge(
            "throttlekit.scope.delay",
            callbacks=[self._scope_callback("delay")],
            unit="s",
            description="The largest effective delay between sends among the group's scopes.",
        )
        meter.create_observable_gauge(
            "throttlekit.scope.concurrency",
            callbacks=[self._scope_callback("concurrency")],
            unit="{request}",
            description="The smallest effective concurrency among the group's scopes.",
        )

    def __repr__(self) -> str:
        return f"<_Instruments limiters={len(self._members)}>"

    def add(self, metrics: LimiterMetrics) -> None:
        with self._lock:
            self._members.add(metrics)

    def discard(self, metrics: LimiterMetrics) -> None:
        with self._lock:
            self._members.discard(metrics)

    def _live(self) -> list[LimiterMetrics]:
        with self._lock:
            return [metrics for metrics in self._members if metrics.limiter is not None]

    def _observe_grants(self, options: CallbackOptions) -> Iterator[Observation]:
        for metrics in self._live():
            yield from metrics._observe_counts(metrics.grants)

    def _observe_active(self, options: CallbackOptions) -> Iterator[Observation]:
        for metrics in self._live():
            yield from metrics._observe_counts(metrics.active)

    def _observe_waiting(self, options: CallbackOptions) -> Iterator[Observation]:
        for metrics in self._live():
            yield from metrics._observe_waiting()

    def _scope_callback(self, kind: str) -> Callable[[CallbackOptions], list[Observation]]:
        """One of the four per-scope instruments, all from a single pass over the scopes.

        The first of them to be called in a collection goes over every scope
        and keeps the other three's observations for the rest of it.
        """

        def callback(options: CallbackOptions) -> list[Observation]:
            with self._lock:
                taken, cache = self._scope_cache
                if kind not in cache or time.monotonic() - taken > 1.0:
                    # This collection has not gone over the scopes yet.
                    cache = {"count": [], "waiting": [], "delay": [], "concurrency": []}
                    for metrics in [m for m in self._members if m.limiter is not None]:
                        for name, observation in metrics._observe_scopes():
                            cache[name].append(observation)
                    self._scope_cache = (time.monotonic(), cache)
                return cache.pop(kind)

        return callback


def _same(scope: str) -> str:
    return scope


def _policy_group(limiter: BaseLimiter) -> Callable[[str], str]:
    """The default grouping: named scopes alone, the rest by default policy or not."""
    named = frozenset(limiter.policies) - frozenset(limiter.crawl_delays)
    default = limiter.default

    def group_of(scope: str) -> str:
        if scope in named:
            return scope
        policy = limiter.policy(scope)
        return _DEFAULT_GROUP if policy is default or policy == default else _OTHER_GROUP

    return group_of


def _signal_name(backoff: Backoff, feedback: Feedback) -> str:
    """The ``error.type`` of a signal: the status code, or the exception's qualified class."""
    status = feedback.status
    if status is not None and status in backoff.http_codes:
        return str(status)
    cls = type(feedback.exception)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _offset_of(limiter: BaseLimiter) -> float:
    """The limiter's clock minus ``time.monotonic()`` (a SyncLimiter's clock is that one)."""
    if isinstance(limiter, SyncLimiter):
        return 0.0
    return _now() - time.monotonic()


def _fed(permit: Permit) -> set[str]:
    """The scopes a permit's feedback reaches: its own, and those it shares with its holders."""
    names = set(permit.scopes)
    for _, shared in permit._shared or ():
        names |= shared
    return names


def _requested_scopes(permit: Permit) -> Iterable[str]:
    """The scopes a permit that was not granted asked for, when they can be told without I/O."""
    limiter = permit._limiter
    try:
        costs = limiter._resolve(permit._request, permit._scopes)
    except Exception:
        return ()
    if isinstance(costs, Mapping):
        return costs
    close = getattr(costs, "close", None)  # an async resolver's coroutine: not run twice
    if close is not None:
        close()
    return ()


def _ledgers(limiter: BaseLimiter) -> list[Any]:
    """The scopes the limiter keeps in memory.

    Read from another thread than the event loop's (the exporter's): the
    list is copied at once and the ledgers are only read.
    """
    return list(limiter._local.core.scopes.values())
