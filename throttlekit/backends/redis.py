"""Redis backend: one throttling budget shared by many processes and machines.

Give a :class:`~throttlekit.Limiter` a :class:`RedisBackend` and every
process that uses the same Redis and ``prefix`` shares each scope's
concurrency, delays, quota and learned controller state (backoff,
``Retry-After`` blocks, AutoThrottle delay)::

    backend = RedisBackend.from_url("redis://127.0.0.1:6379/0", prefix="myjob")
    limiter = Limiter(default=ScopePolicy(concurrency=3, delay=0.5), backend=backend)

Decisions are made atomically inside Redis by Lua scripts that read Redis's
own clock (``TIME``), so the workers' clocks never matter. Each acquire
attempt is one round trip (``EVALSHA``), each release one more. The backend
runs on asyncio (it is built on ``redis.asyncio``); install it with
``pip install "throttlekit-http[redis]"``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import random
import secrets
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import attrs

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'throttlekit.backends.redis needs redis-py: pip install "throttlekit-http[redis]"'
    ) from exc

from .._backoff import low_remaining_pace
from .._checks import check_number
from .._errors import BackendUnavailable, Overloaded, ThrottleTimeout
from .._stats import ScopeStatistics
from . import _redis_scripts as scripts

if TYPE_CHECKING:
    from .._controller import Feedback
    from .._limiter import Limiter
    from .._policy import ScopePolicy
    from .._scheduler import Ticket
    from .memory import MemoryBackend

__all__ = ["FailurePolicy", "RedisBackend", "RedisBackendStatistics"]

logger = logging.getLogger(__name__)

#: What :meth:`RedisBackend.acquire` does when Redis cannot be reached (see ``failure``).
FailurePolicy = Literal["fail_open", "fail_closed"]

INF: Final = math.inf

#: Errors that mean "Redis cannot be reached (or cannot take writes) now".
_UNAVAILABLE: Final = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    OSError,
)

_SUFFIXES: Final = ("L", "S", "T", "Q", "C", "W")

#: Longest wait for a release before looking again (a safety net: releases
#: normally wake waiters through pub/sub at once).
_RELEASE_RECHECK: Final = 5.0
#: How often a waiter looks again when pub/sub is not permitted (ACLs).
_POLL_WITHOUT_PUBSUB: Final = 0.05
#: Longest sleep on a time-based wait (quota that cannot fit until released).
_MAX_WAIT: Final = 60.0


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "RedisBackend runs on asyncio only (it is built on redis.asyncio); "
            "use the in-memory limiter on trio"
        ) from None


def _redact_url(url: str) -> str:
    """``url`` without credentials or query: ``rediss://***@host:6380/0``."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<invalid Redis URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    if parts.username or parts.password or "@" in parts.netloc:
        netloc = f"***@{netloc}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _client_location(client: Any) -> str:
    """Where ``client`` connects, from its pool's settings (never its credentials)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host = kwargs.get("host", "?")
    port = kwargs.get("port", "?")
    db = kwargs.get("db", 0)
    connection_class = getattr(pool, "connection_class", None)
    scheme = "rediss" if "SSL" in getattr(connection_class, "__name__", "") else "redis"
    return f"{scheme}://{host}:{port}/{db}"


def _remaining(deadline: float) -> float | None:
    return None if deadline == INF else max(0.0, deadline - anyio.current_time())


def _timeout(costs: Mapping[str, float]) -> ThrottleTimeout:
    return ThrottleTimeout(f"no grant before the timeout for scopes {sorted(costs)}")


def _policy_args(policy: ScopePolicy) -> tuple[float, ...]:
    """A policy as the :data:`~._redis_scripts.POLICY_FIELDS` numbers the scripts read."""
    low, high = policy.jitter
    backoff = policy.backoff
    if backoff is None:
        backoff_args: tuple[float, ...] = (0, 2.0, 0.0, 0.0, 60_000.0, 0.5, 0.0, 0.0)
    else:
        blow, bhigh = backoff.jitter
        backoff_args = (
            2 if backoff.headers_only else 1,
            backoff.delay_factor,
            backoff.min_delay * 1000.0,
            backoff.max_delay * 1000.0,
            backoff.window * 1000.0,
            backoff.concurrency_factor,
            blow,
            bhigh,
        )
    auto = policy.autothrottle
    if auto is None:
        auto_args: tuple[float, ...] = (0, 0.0, 0.0, 1.0)
    else:
        auto_args = (1, auto.start_delay * 1000.0, auto.max_delay * 1000.0, auto.target_concurrency)
    args = (
        policy.concurrency or 0,
        policy.delay * 1000.0,
        policy.slot_delay * 1000.0,
        low,
        high,
        -1.0 if policy.quota is None else policy.quota,
        policy.window * 1000.0,
        *backoff_args,
        *auto_args,
    )
    assert len(args) == scripts.POLICY_FIELDS
    return args


def _feedback_args(feedback: Feedback | None) -> list[float | str]:
    """Header wait, pace, pace-for, latency (ms), status, adjust, signal name."""
    hwait = pace = -1.0
    pace_for = 0.0
    latency = -1.0
    status = 0
    adjust = 0
    name = ""
    if feedback is not None:
        info = feedback.rate_limit
        if info is not None:
            wait = info.wait()
            if wait is not None and wait > 0:
                hwait = wait * 1000.0
            # The same rule as the in-memory backoff.
            interval = low_remaining_pace(info)
            if interval is not None:
                pace = interval * 1000.0
                pace_for = (info.reset or 0.0) * 1000.0
        if feedback.latency is not None and math.isfinite(feedback.latency):
            latency = max(0.0, feedback.latency) * 1000.0
        status = feedback.status or 0
        adjust = 1 if feedback.adjust_delay else 0
        if feedback.status is None and feedback.exception is not None:
            name = type(feedback.exception).__name__
        elif feedback.status is not None:
            name = str(feedback.status)
    return [hwait, pace, pace_for, latency, status, adjust, name]


class _Waiter:
    """One acquire() waiting in this process."""

    __slots__ = ("event", "priority", "queue", "seq", "turn", "woken")

    def __init__(self, priority: int, seq: int) -> None:
        self.priority = priority
        self.seq = seq
        self.queue: str | None = None  # the local scope queue it stands in
        self.event = anyio.Event()
        self.woken = False
        self.turn = 0.0  # the last turn Redis gave it (Redis clock, ms; 0 = none)

    def before(self, other: _Waiter) -> bool:
        return self.priority > other.priority or (
            self.priority == other.priority and self.seq < other.seq
        )


class _RedisLease:
    """A grant from Redis: the lease id held in every scope's lease set."""

    __slots__ = (
        "backend",
        "consumed",
        "feedback",
        "gate",
        "granted_at",
        "id",
        "keys",
        "local",
        "released",
        "scopes",
        "send_at",
        "send_at_ms",
    )

    def __init__(
        self,
        backend: RedisBackend,
        local: MemoryBackend,
        lease_id: str,
        scopes: dict[str, float],
        keys: list[str],
        gate: Ticket,
        send_at_ms: float,
        send_at: float,
    ) -> None:
        self.backend = backend
        self.local = local
        self.id = lease_id
        self.scopes = scopes
        self.keys = keys
        self.gate = gate
        self.send_at_ms = send_at_ms
        self.send_at = send_at
        self.granted_at = -INF
        self.released = False
        self.feedback: Feedback | None = None
        self.consumed: Mapping[str, float] | None = None

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<RedisLease {self.id} {sorted(self.scopes)} {state}>"


class _LocalLease:
    """A grant from the limiter's in-memory ledgers while Redis is unreachable."""

    __slots__ = ("local", "ticket")

    def __init__(self, local: MemoryBackend, ticket: Ticket) -> None:
        self.local = local
        self.ticket = ticket

    def __repr__(self) -> str:
        return f"<LocalLease {self.ticket!r}>"

    @property
    def scopes(self) -> dict[str, float]:
        return self.ticket.scopes

    @property
    def granted_at(self) -> float:
        return self.ticket.granted_at


@attrs.frozen(kw_only=True)
class RedisBackendStatistics:
    """What one :class:`RedisBackend` has done so far (this process only).

    :param acquire_calls: acquire script calls (round trips), granted or not.
    :param grants: leases granted by Redis.
    :param release_calls: release script calls (round trips).
    :param local_grants: grants made by the local ledgers while Redis was down.
    :param waiting: acquire() calls waiting now.
    :param available: whether the last contact with Redis worked.
    """

    acquire_calls: int
    grants: int
    release_calls: int
    local_grants: int
    waiting: int
    available: bool


class RedisBackend:
    """Share scope budgets through Redis so many processes throttle as one.

    Every process that uses the same Redis database and ``prefix`` shares, per
    scope: the concurrency (leases that expire, so a crashed worker's slots
    come back after ``lease_time``), the delay and slot delay between sends
    (with jitter), the quota window with costs (reconciled with the
    ``consumed`` costs given to :meth:`~throttlekit.Permit.record`), and the
    controllers' learned state: the backoff level and delay, the ``Retry-After``
    / ``RateLimit`` block and the AutoThrottle delay. One worker's 429 slows
    all of them. Each scope's policy comes from the limiter that asks
    (:meth:`Limiter.policy <throttlekit.Limiter.policy>`), so configure the
    workers alike. Custom ``controllers`` and ``rampup`` run only in the local
    fallback (a warning is logged once per scope).

    Decisions run inside Redis in Lua scripts, on Redis's clock: one round trip
    per acquire attempt and one per release. A grant may be *reserved* up to
    ``reserve_ahead`` seconds (and less than one delay) before its send time;
    the worker then sleeps until that time, so round trips and wake-up latency
    do not stretch the delays (the aggregate rate matches the policy). Workers
    waiting for a delay get turns one delay apart and wake one after the other;
    workers waiting for a slot are woken by a release (one pub/sub
    subscription per backend, read by one of the waiters: no background task)
    or when the earliest lease expires. Within a process, waiters of a scope
    queue by priority, then arrival; across processes the order is best effort
    (turns go round, but priorities are not compared between processes).

    The limiter's global ``concurrency`` cap stays per process. The backend
    runs on asyncio only (``redis.asyncio``), needs Redis >= 5.0, and is safe
    for Redis Cluster for single-scope requests (all keys of a scope share the
    hash tag ``{prefix:scope}``); a request with several scopes needs them on
    one node (standalone Redis, Sentinel, or scopes whose tags map to one slot).

    :param client: a ``redis.asyncio.Redis`` client (not closed by :meth:`aclose`
        unless ``owns_client``). :meth:`from_url` builds one.
    :param prefix: the namespace of the keys: processes with the same prefix share
        budgets. No ``{`` or ``}``.
    :param lease_time: seconds a grant stays held without a release or
        :meth:`renew`; a crashed worker's slots come back after it. Keep it
        above your longest request (or renew with :meth:`keep_alive`).
    :param failure: what :meth:`acquire` does when Redis cannot be reached:
        ``"fail_open"`` throttles with the limiter's in-memory ledgers (same
        policies, this process only), logs a warning, and goes back to Redis
        when it answers again (tried at most every ``reconnect_interval``);
        ``"fail_closed"`` raises :class:`~throttlekit.BackendUnavailable`.
    :param reserve_ahead: seconds ahead of its send time a grant may be
        reserved (never a whole delay: at most one reserved grant per scope
        waits for its send); ``0`` grants only at the current instant, and
        then each grant is late by a round trip plus the wake-up latency, which
        slows the aggregate rate.
    :param state_ttl: seconds a scope's learned state (backoff, AutoThrottle)
        survives in Redis without any traffic. Live state (blocks, leases,
        quota windows) always lives as long as it matters.
    :param reconnect_interval: seconds between attempts to reach Redis again
        while failing open.
    :param release_timeout: seconds a release may take (it is shielded from
        cancellation); a release that times out is left to ``lease_time``.
    :param seed: seed of the jitter's random numbers.
    :param owns_client: close ``client`` in :meth:`aclose`.
    :param location: how logs and the repr name the server (default: the
        client's host, port and database; never credentials).

    Usage::

        backend = RedisBackend.from_url(
            "rediss://:secret@redis.internal:6380/0", prefix="crawl-42", lease_time=120
        )
        limiter = Limiter(default=ScopePolicy(concurrency=2, delay=1.0), backend=backend)
        async with limiter.acquire(url) as permit:
            response = await client.get(url)
            permit.record(response)
        await backend.aclose()
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = "throttlekit",
        lease_time: float = 60.0,
        failure: FailurePolicy = "fail_open",
        reserve_ahead: float = 0.05,
        state_ttl: float = 3600.0,
        reconnect_interval: float = 1.0,
        release_timeout: float = 1.0,
        seed: int | None = None,
        owns_client: bool = False,
        location: str | None = None,
    ) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty str, got {prefix!r}")
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must not contain '{{' or '}}' (hash tags), got {prefix!r}")
        if failure not in ("fail_open", "fail_closed"):
            raise ValueError(f"failure must be 'fail_open' or 'fail_closed', got {failure!r}")
        if not callable(getattr(client, "register_script", None)):
            raise TypeError(f"client must be a redis.asyncio.Redis client, got {type(client)!r}")
        self.prefix = prefix
        self.lease_time = check_number("lease_time", lease_time, minimum=0.0, strict=True)
        self.failure: FailurePolicy = failure
        self.reserve_ahead = check_number("reserve_ahead", reserve_ahead, minimum=0, strict=False)
        self.state_ttl = check_number("state_ttl", state_ttl, minimum=0.0, strict=True)
        self.reconnect_interval = check_number(
            "reconnect_interval", reconnect_interval, minimum=0.0, strict=False
        )
        self.release_timeout = check_number(
            "release_timeout", release_timeout, minimum=0.0, strict=True
        )
        self._client = client
        self._owns_client = owns_client
        self._location = location if location is not None else _client_location(client)
        self._channel = f"{prefix}:released"
        self._acquire_script = client.register_script(scripts.ACQUIRE)
        self._release_script = client.register_script(scripts.RELEASE)
        self._renew_script = client.register_script(scripts.RENEW)
        self._state_script = client.register_script(scripts.STATE)
        self._rng = random.Random(seed)
        self._seq = itertools.count()
        self._ties = itertools.count()
        self._queues: dict[str, list[tuple[int, int, int, _Waiter]]] = {}
        self._release_waiters: dict[_Waiter, None] = {}
        self._listener: _Waiter | None = None
        self._pubsub: Any = None
        self._pubsub_denied = False
        self._pubsub_lock: anyio.Lock | None = None
        self._waiting = 0
        self._down = False
        self._retry_at = -INF
        self._closed = False
        self._local: MemoryBackend | None = None
        self._policy_cache: dict[int, tuple[ScopePolicy, tuple[float, ...]]] = {}
        self._warned: set[str] = set()
        self._acquire_calls = 0
        self._grants = 0
        self._release_calls = 0
        self._local_grants = 0
        self._offset = -INF  # a lower bound of (Redis clock - limiter clock), seconds
        self._offset_at = 0.0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "throttlekit",
        lease_time: float = 60.0,
        failure: FailurePolicy = "fail_open",
        reserve_ahead: float = 0.05,
        state_ttl: float = 3600.0,
        reconnect_interval: float = 1.0,
        release_timeout: float = 1.0,
        seed: int | None = None,
        **client_options: Any,
    ) -> RedisBackend:
        """Connect to ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``).

        Credentials go in the URL (``redis://user:password@host:6379/0``) or in
        ``client_options`` (``password=...``); they never appear in reprs, logs
        or the backend's exceptions. TLS options (``ssl_ca_certs=...``) go in
        the URL query or ``client_options``. Unless given, the client gets
        short timeouts (connect 2 s, socket 5 s) and one quick retry, so an
        outage is noticed at once. The other keyword arguments are those of
        the constructor; the client is closed by :meth:`aclose`.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        location = _redact_url(url)
        client_options.setdefault("socket_connect_timeout", 2.0)
        client_options.setdefault("socket_timeout", 5.0)
        client_options.setdefault("retry", Retry(ExponentialBackoff(cap=0.05, base=0.01), 1))
        try:
            client = aioredis.from_url(url, **client_options)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"invalid Redis URL {location}: {exc}") from None
        return cls(
            client,
            prefix=prefix,
            lease_time=lease_time,
            failure=failure,
            reserve_ahead=reserve_ahead,
            state_ttl=state_ttl,
            reconnect_interval=reconnect_interval,
            release_timeout=release_timeout,
            seed=seed,
            owns_client=True,
            location=location,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("down" if self._down else "up")
        return (
            f"<RedisBackend {self._location} prefix={self.prefix!r} {self.failure} "
            f"lease_time={self.lease_time:g} waiting={self._waiting} {state}>"
        )

    @property
    def location(self) -> str:
        """Where Redis is, without credentials (for logs and reprs)."""
        return self._location

    @property
    def client(self) -> aioredis.Redis:
        """The ``redis.asyncio`` client in use."""
        return self._client

    def statistics(self) -> RedisBackendStatistics:
        """A frozen snapshot of this backend's counters."""
        return RedisBackendStatistics(
            acquire_calls=self._acquire_calls,
            grants=self._grants,
            release_calls=self._release_calls,
            local_grants=self._local_grants,
            waiting=self._waiting,
            available=not self._down,
        )

    def scope_keys(self, scope: str) -> list[str]:
        """The Redis keys that hold ``scope`` (all with the hash tag ``{prefix:scope}``)."""
        tag = "{" + self.prefix + ":" + scope + "}:"
        return [tag + suffix for suffix in _SUFFIXES]

    # -- the Backend protocol ------------------------------------------------------

    def bind(self, local: MemoryBackend) -> None:
        """Serve the limiter whose in-memory backend is ``local`` (one limiter per backend)."""
        if self._local is not None and self._local is not local:
            raise RuntimeError("this RedisBackend already serves another Limiter; make one each")
        self._local = local

    def try_acquire(self, costs: Mapping[str, float], priority: int) -> None:
        """Redis decides every grant with a round trip: never a grant without waiting."""
        return None

    async def acquire(
        self,
        costs: Mapping[str, float],
        *,
        priority: int,
        timeout: float | None,  # noqa: ASYNC109 - the Backend protocol's timeout
    ) -> Any:
        """Wait until every scope in ``costs`` admits the request; return the lease.

        Called by :meth:`Limiter.acquire <throttlekit.Limiter.acquire>`.

        :raises ThrottleTimeout: when ``timeout`` seconds pass first.
        :raises BackendUnavailable: when Redis is unreachable and ``failure`` is
            ``"fail_closed"``.
        :raises Overloaded: when the limiter's ``max_waiters`` already wait here.
        """
        _require_asyncio()
        local = self._local
        if local is None:
            raise RuntimeError("give this RedisBackend to a Limiter(backend=...) first")
        if self._closed:
            raise RuntimeError("this RedisBackend is closed")
        if not costs:
            raise ValueError("a request needs at least one scope")
        for scope, cost in costs.items():
            policy = local.policy(scope)
            if policy.quota is not None and cost > policy.quota:
                raise ValueError(
                    f"cost {cost!r} for scope {scope!r} exceeds its quota {policy.quota!r}; "
                    "it could never be sent"
                )
        deadline = INF if timeout is None else anyio.current_time() + timeout
        return await self._acquire(local, dict(costs), priority, deadline)

    def record(self, lease: Any, feedback: Feedback, consumed: Mapping[str, float] | None) -> None:
        """Keep the feedback on the lease: Redis learns it with the release."""
        if isinstance(lease, _LocalLease):
            lease.local.record(lease.ticket, feedback, consumed)
        else:
            lease.feedback, lease.consumed = feedback, consumed

    def release_nowait(self, lease: Any) -> bool:
        """Only a local (fail-open) lease can be given back without a round trip."""
        if isinstance(lease, _LocalLease):
            return lease.local.release_nowait(lease.ticket)
        return False

    async def release(self, lease: Any) -> None:
        """Hand ``lease`` back with the feedback of its request (shielded from cancellation)."""
        if isinstance(lease, _LocalLease):
            lease.local.release_nowait(lease.ticket)
            return
        if not isinstance(lease, _RedisLease):
            raise TypeError(f"not a lease of this backend: {lease!r}")
        if lease.released:
            return
        lease.released = True
        try:
            with anyio.CancelScope(shield=True):
                await self._release(lease, lease.feedback, lease.consumed, used=True)
        finally:
            lease.local.release_nowait(lease.gate)

    async def aclose(self) -> None:
        """Drop the pub/sub connection and close the client if this backend made it."""
        self._closed = True
        await self._drop_pubsub()
        if self._owns_client:
            await self._client.aclose()

    # -- leases --------------------------------------------------------------------

    async def renew(self, permit: Any, lease_time: float | None = None) -> bool:
        """Extend a held permit's lease to ``lease_time`` (default: the backend's) from now.

        Long requests call it (or use :meth:`keep_alive`) so that their slots
        are not taken back while they run. Returns whether every scope still
        held the lease (``False``: it had already expired or was released).
        Grants made by the local fallback need no renewal (``True``).
        """
        lease = getattr(permit, "_lease", permit)
        if isinstance(lease, _LocalLease):
            return True
        if not isinstance(lease, _RedisLease):
            raise TypeError(f"not a permit or lease of this backend: {permit!r}")
        if lease.released:
            return False
        seconds = self.lease_time if lease_time is None else lease_time
        seconds = check_number("lease_time", seconds, minimum=0.0, strict=True)
        keys = lease.keys[0 : -1 : len(_SUFFIXES)]
        try:
            count = await self._renew_script(keys=keys, args=[lease.id, seconds * 1000.0])
        except _UNAVAILABLE as exc:
            self._unavailable(exc, raising=self.failure == "fail_closed")
            return False
        return int(count) == len(keys)

    @asynccontextmanager
    async def keep_alive(
        self, permit: Any, *, interval: float | None = None
    ) -> AsyncIterator[None]:
        """Renew ``permit``'s lease every ``interval`` seconds while the block runs.

        The renewals run in a task of their own, started here and stopped when
        the block ends (the only task the backend ever starts, and only here).
        ``interval`` defaults to a third of ``lease_time``::

            async with limiter.acquire(url) as permit, backend.keep_alive(permit):
                response = await client.get(url)  # may take longer than lease_time
        """
        every = self.lease_time / 3.0 if interval is None else interval
        every = check_number("interval", every, minimum=0.0, strict=True)

        async def renew_forever() -> None:
            while True:
                await anyio.sleep(every)
                await self.renew(permit)

        async with anyio.create_task_group() as group:
            group.start_soon(renew_forever)
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    # -- state ---------------------------------------------------------------------

    async def scope_statistics(self, limiter: Limiter, scope: str) -> ScopeStatistics:
        """The shared state of ``scope`` now, as all processes see it.

        Times are converted to this process's limiter clock. ``waiting`` counts
        this process's waiters only.
        """
        policy = limiter.policy(scope)
        reply = await self._state_script(
            keys=self.scope_keys(scope), args=self._policy(scope, policy)
        )
        now = anyio.current_time()
        redis_now = float(reply[0])

        def local(ms: Any) -> float:
            value = float(ms)
            return -INF if value <= 0 else now + (value - redis_now) / 1000.0

        concurrency = int(reply[3]) or None
        used = float(reply[9])
        quota = policy.quota
        blocked_until = local(reply[4])
        signal = reply[7].decode() if isinstance(reply[7], bytes) else str(reply[7])
        level = int(reply[6])
        delay = float(reply[2]) / 1000.0
        if blocked_until > now:
            reason = f"blocked by the server for {blocked_until - now:.3g} s more"
        elif level:
            reason = f"backoff level {level} after {signal}"
        else:
            reason = "policy" if delay <= policy.delay else "autothrottle or the server's pace"
        return ScopeStatistics(
            name=scope,
            delay=delay,
            concurrency=concurrency,
            in_flight=int(reply[1]),
            waiting=sum(1 for entry in self._queues.get(scope, ()) if entry[3].queue == scope),
            quota=quota,
            quota_used=used if quota is not None else 0.0,
            quota_left=None if quota is None else max(0.0, quota - used),
            blocked_until=blocked_until,
            next_send_at=local(reply[5]),
            backoff_level=level,
            last_signal=signal or None,
            last_signal_at=local(reply[8]),
            reason=reason,
        )

    # -- internals: acquiring ------------------------------------------------------

    def _policy(self, scope: str, policy: ScopePolicy) -> tuple[float, ...]:
        cached = self._policy_cache.get(id(policy))
        if cached is not None and cached[0] is policy:
            return cached[1]
        if (policy.rampup is not None or policy.controllers) and scope not in self._warned:
            self._warned.add(scope)
            logger.warning(
                "scope %s: rampup and custom controllers are not shared through Redis; "
                "they run only while throttling locally",
                scope,
            )
        if len(self._policy_cache) > 4096:
            self._policy_cache.clear()
        args = _policy_args(policy)
        self._policy_cache[id(policy)] = (policy, args)
        return args

    async def _acquire(
        self, local: MemoryBackend, costs: dict[str, float], priority: int, deadline: float
    ) -> Any:
        """Attempt, then wait as Redis says, until a grant; ``deadline`` bounds the waits."""
        if self._down and self.failure == "fail_open" and anyio.current_time() < self._retry_at:
            return await self._acquire_locally(local, costs, priority, deadline)
        if local.max_waiters is not None and self._waiting >= local.max_waiters:
            raise Overloaded(f"{self._waiting} requests are already waiting (max_waiters)")
        waiter = _Waiter(priority, next(self._seq))
        self._waiting += 1
        try:
            while True:
                ahead = self._local_blocker(costs, waiter)
                if ahead is not None:
                    with anyio.move_on_after(deadline - anyio.current_time()):
                        await self._wait_in_line(waiter, ahead)
                        continue
                    raise _timeout(costs)
                try:
                    result = await self._attempt(local, costs, waiter, deadline)
                except _UNAVAILABLE as exc:
                    self._unavailable(exc, raising=self.failure == "fail_closed")
                    self._leave(waiter)
                    return await self._acquire_locally(local, costs, priority, deadline)
                if isinstance(result, _RedisLease):
                    self._leave(waiter)  # the next in line may try at once
                    return await self._until_send(result)
                scope, wait, full = result
                self._join(waiter, scope)
                if self._top(scope) is not waiter:
                    continue
                if full and self._pubsub is None and not self._pubsub_denied:
                    try:
                        await self._subscribe()
                    except _UNAVAILABLE:
                        pass  # waits on the timer below; the next attempt notices
                    else:
                        continue  # releases reach us from now on: look again first
                if full:
                    wait = min(wait, _RELEASE_RECHECK if self._pubsub else _POLL_WITHOUT_PUBSUB)
                wake = anyio.current_time() + min(wait, _MAX_WAIT)
                if wake > deadline:
                    # No grant before the deadline unless a release comes first.
                    waiter.woken = False
                    if full:
                        await self._wait_as_top(waiter, deadline, full)
                    else:
                        await anyio.sleep_until(deadline)
                    if not waiter.woken:
                        raise _timeout(costs)
                else:
                    await self._wait_as_top(waiter, wake, full)
        finally:
            self._waiting -= 1
            self._leave(waiter)

    async def _acquire_locally(
        self, local: MemoryBackend, costs: dict[str, float], priority: int, deadline: float
    ) -> _LocalLease:
        ticket = await local.acquire(costs, priority=priority, timeout=_remaining(deadline))
        self._local_grants += 1
        return _LocalLease(local, ticket)

    async def _attempt(
        self,
        local: MemoryBackend,
        costs: dict[str, float],
        waiter: _Waiter,
        deadline: float,
    ) -> _RedisLease | tuple[str, float, bool]:
        """One acquire round trip: a lease, or (blocking scope, seconds to wait, full?)."""
        # The per-process global cap, held from the grant to the release.
        gate = await local.acquire({}, priority=waiter.priority, timeout=_remaining(deadline))
        lease_id = secrets.token_hex(8)
        keys: list[str] = []
        args: list[Any] = [
            lease_id,
            self.lease_time * 1000.0,
            self.reserve_ahead * 1000.0,
            self.state_ttl * 1000.0,
            _RELEASE_RECHECK * 1000.0,
            len(costs),
            waiter.turn,
        ]
        rng = self._rng
        for scope, cost in costs.items():
            keys.extend(self.scope_keys(scope))
            args.append(cost)
            args.append(rng.random())
            args.extend(self._policy(scope, local.policy(scope)))
        keys.append(keys[0][:-1] + "X:" + lease_id)  # the tombstone of a given-up call
        self._acquire_calls += 1
        before = anyio.current_time()
        try:
            reply = await self._acquire_script(keys=keys, args=args)
        except BaseException:
            local.release_nowait(gate)
            # The script may have run before the reply was lost: hand back the
            # lease it may hold (idempotent), shielded and bounded.
            lease = _RedisLease(self, local, lease_id, dict(costs), keys, gate, 0.0, 0.0)
            with anyio.CancelScope(shield=True):
                await self._release(lease, None, None, used=False, quiet=True)
            raise
        after = anyio.current_time()
        self._back_up()
        wait = float(reply[1]) / 1000.0
        if int(reply[0]) != 1:
            local.release_nowait(gate)
            self._sample_clock(float(reply[4]), after)
            waiter.turn = float(reply[5]) if len(reply) > 5 else 0.0
            return list(costs)[int(reply[2]) - 1], wait, int(reply[3]) == 1
        self._grants += 1
        send_at_ms = float(reply[2])
        self._sample_clock(send_at_ms - wait * 1000.0, after)
        # Send at the reserved time on Redis's clock, as well as this process
        # can tell: never before it, and never later than a full round trip.
        send_at = min(after + wait, max(before + wait, send_at_ms / 1000.0 - self._offset))
        return _RedisLease(self, local, lease_id, dict(costs), keys, gate, send_at_ms, send_at)

    def _sample_clock(self, redis_now_ms: float, after: float) -> None:
        """Keep a lower bound of (Redis clock - limiter clock), tightest over recent calls.

        Redis read its clock before ``after``, so each call gives a lower bound;
        the best one (the fastest round trip) wins, and old bounds are loosened
        by 1 ms per second so that clock drift cannot make it wrong.
        """
        bound = redis_now_ms / 1000.0 - after
        loosened = self._offset - 0.001 * (after - self._offset_at)
        self._offset = max(bound, loosened)
        self._offset_at = after

    async def _until_send(self, lease: _RedisLease) -> _RedisLease:
        """Sleep until a reserved grant's send time; hand it back if cancelled."""
        if lease.send_at > anyio.current_time():
            try:
                await anyio.sleep_until(lease.send_at)
            except BaseException:
                lease.released = True
                try:
                    with anyio.CancelScope(shield=True):
                        await self._release(lease, None, None, used=False)
                finally:
                    lease.local.release_nowait(lease.gate)
                raise
        lease.granted_at = anyio.current_time()
        return lease

    async def _release(
        self,
        lease: _RedisLease,
        feedback: Feedback | None,
        consumed: Mapping[str, float] | None,
        *,
        used: bool,
        quiet: bool = False,
    ) -> None:
        local = lease.local
        args: list[Any] = [lease.id, lease.send_at_ms, 1 if used else 0]
        args.extend(_feedback_args(feedback if used else None))
        args.extend((self._channel, self.state_ttl * 1000.0, len(lease.scopes)))
        for scope in lease.scopes:
            policy = local.policy(scope)
            backoff = policy.backoff
            actual = -1.0
            if consumed is not None and scope in consumed:
                actual = max(0.0, float(consumed[scope]))
            signal = 0  # -1: no feedback for this scope (record(scopes=...) left it out)
            if feedback is None or (feedback.scopes is not None and scope not in feedback.scopes):
                signal = -1
            elif backoff is not None and backoff.is_signal(feedback):
                signal = 1
            args.append(scope)
            args.append(actual)
            args.append(signal)
            args.extend(self._policy(scope, policy))
        self._release_calls += 1
        found: Any = None
        try:
            with anyio.move_on_after(self.release_timeout):
                found = await self._release_script(keys=lease.keys, args=args)
        except _UNAVAILABLE as exc:
            if not quiet:
                logger.warning(
                    "could not release a lease on Redis at %s (%s); it expires in %g s",
                    self._location,
                    type(exc).__name__,
                    self.lease_time,
                )
            return
        if found is None:
            if not quiet:
                logger.warning(
                    "releasing a lease on Redis at %s took over %g s; it expires in %g s",
                    self._location,
                    self.release_timeout,
                    self.lease_time,
                )
            return
        if used and int(found) < len(lease.scopes):
            logger.warning(
                "a lease on %s had expired before its release (held longer than "
                "lease_time=%g s, or Redis lost it): raise lease_time or use keep_alive()",
                sorted(lease.scopes),
                self.lease_time,
            )

    # -- internals: Redis health ---------------------------------------------------

    def _unavailable(self, exc: BaseException, *, raising: bool) -> None:
        self._retry_at = anyio.current_time() + self.reconnect_interval
        if raising:
            self._down = True
            raise BackendUnavailable(
                f"Redis at {self._location} is unavailable ({type(exc).__name__}); failing closed"
            ) from exc
        if not self._down:
            self._down = True
            logger.warning(
                "Redis at %s is unavailable (%s); throttling with this process's in-memory "
                "ledgers until it is back (fail_open)",
                self._location,
                type(exc).__name__,
            )

    def _back_up(self) -> None:
        if self._down:
            self._down = False
            logger.info("Redis at %s is back; shared throttling resumed", self._location)

    # -- internals: the local line -------------------------------------------------

    def _top(self, scope: str) -> _Waiter | None:
        heap = self._queues.get(scope)
        while heap:
            waiter = heap[0][3]
            if waiter.queue == scope:
                return waiter
            heapq.heappop(heap)
        if heap is not None:
            del self._queues[scope]
        return None

    def _local_blocker(self, costs: Mapping[str, float], waiter: _Waiter) -> str | None:
        """A scope where another waiter of this process goes first."""
        for scope in costs:
            top = self._top(scope)
            if top is not None and top is not waiter and top.before(waiter):
                return scope
        return None

    def _join(self, waiter: _Waiter, scope: str) -> None:
        if waiter.queue == scope:
            return
        self._leave(waiter)
        waiter.queue = scope
        entry = (-waiter.priority, waiter.seq, next(self._ties), waiter)
        heapq.heappush(self._queues.setdefault(scope, []), entry)

    def _leave(self, waiter: _Waiter) -> None:
        scope = waiter.queue
        if scope is None:
            return
        was_top = self._top(scope) is waiter
        waiter.queue = None
        if was_top:
            top = self._top(scope)
            if top is not None:
                self._wake(top)

    @staticmethod
    def _wake(waiter: _Waiter) -> None:
        waiter.woken = True
        waiter.event.set()

    async def _wait_in_line(self, waiter: _Waiter, scope: str) -> None:
        """Stand in ``scope``'s line until nobody of this process is ahead."""
        self._join(waiter, scope)
        while True:
            top = self._top(scope)
            if top is None or top is waiter:
                return
            waiter.woken = False
            waiter.event = anyio.Event()
            await waiter.event.wait()

    async def _wait_as_top(self, waiter: _Waiter, deadline: float, on_release: bool) -> None:
        """First in line: sleep until ``deadline`` or (``on_release``) a release of its scope."""
        waiter.woken = False
        if on_release:
            self._release_waiters[waiter] = None
        try:
            while not waiter.woken:
                now = anyio.current_time()
                if now >= deadline:
                    return
                if on_release and self._listener is None and self._pubsub is not None:
                    await self._listen(waiter, deadline)
                    continue
                waiter.event = anyio.Event()
                with anyio.move_on_after(deadline - now):
                    await waiter.event.wait()
        finally:
            self._release_waiters.pop(waiter, None)

    # -- internals: pub/sub --------------------------------------------------------

    async def _subscribe(self) -> None:
        if self._pubsub_lock is None:
            self._pubsub_lock = anyio.Lock()
        async with self._pubsub_lock:
            if self._pubsub is not None or self._pubsub_denied:
                return
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                with anyio.fail_after(self.release_timeout + 2.0):
                    while True:
                        message = await pubsub.get_message(timeout=self.release_timeout + 2.0)
                        if message is not None and message.get("type") in (
                            "subscribe",
                            b"subscribe",
                        ):
                            break
            except redis_errors.ResponseError as exc:
                await self._close_pubsub(pubsub)
                self._pubsub_denied = True
                logger.warning(
                    "Redis at %s refused SUBSCRIBE (%s); waiters look again every %g s instead",
                    self._location,
                    type(exc).__name__,
                    _POLL_WITHOUT_PUBSUB,
                )
                return
            except BaseException:
                await self._close_pubsub(pubsub)
                raise
            self._pubsub = pubsub

    async def _listen(self, waiter: _Waiter, deadline: float) -> None:
        """Read releases for every waiter of this process until ours comes or time is up."""
        pubsub = self._pubsub
        self._listener = waiter
        try:
            while not waiter.woken:
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    return
                try:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=remaining
                    )
                except (*_UNAVAILABLE, RuntimeError):  # RuntimeError: closed under us
                    await self._drop_pubsub()
                    return
                if message is not None and message.get("type") in ("message", b"message"):
                    data = message.get("data")
                    scope = (
                        data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
                    )
                    top = self._top(scope)
                    if top is not None and top in self._release_waiters:
                        self._wake(top)
        finally:
            self._listener = None
            for other in self._release_waiters:
                if other is not waiter:
                    other.event.set()  # take over the listening
                    break

    async def _drop_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await self._close_pubsub(pubsub)

    @staticmethod
    async def _close_pubsub(pubsub: Any) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            try:
                await pubsub.aclose()
            except Exception:  # pragma: no cover - best effort on a broken connection
                logger.debug("closing the pub/sub connection failed", exc_info=True)
