"""Redis backend: one throttling budget shared by many processes and machines.

Give a :class:`~throttlekit.Limiter` a :class:`RedisBackend` and every
process that uses the same Redis and ``prefix`` shares each scope's
concurrency, delays, quota and controllers (backoff, ``Retry-After`` blocks,
AutoThrottle, rampup, Adaptive, custom controllers)::

    backend = RedisBackend.from_url("redis://127.0.0.1:6379/0", prefix="myjob")
    limiter = Limiter(default=ScopePolicy(concurrency=3, delay=0.5), backend=backend)

Read top-down: this module (the Backend protocol, the fail-open fallback),
then ``_redis_line`` (this process's waiters), ``_redis_calls`` (the round
trips; ``_redis_releases`` renews and releases, ``_redis_args`` encodes the
arguments), ``_redis_across`` (a request across the slots of a cluster),
``_redis_scripts`` and ``lua/*.lua`` (the Lua: admission and bookkeeping,
and the decoders of its replies), ``_redis_state`` (the controllers, run in
Python on the state kept in Redis), ``_redis_leases`` (what is granted and
held), ``_redis_nodes`` (which server a call goes to, and Redis's health)
and ``_redis_link`` (the connections to one server); ``_redis_clients``
tells the two client libraries apart. Runs on asyncio, with redis-py
(``redis.asyncio``, ``pip install "throttlekit-http[redis]"``) or valkey-py
(``valkey.asyncio``, ``pip install "throttlekit-http[valkey]"``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio

from .._checks import check_number
from .._clock import now as _now
from .._errors import Overloaded, ThrottleTimeout
from .._ledger import scope_stalled
from .._stats import ScopeStatistics
from ._redis_calls import STATE, RedisBackendStatistics, ScriptCalls
from ._redis_clients import ERRORS, LIBRARIES, installed, library_of
from ._redis_leases import Holdings, LocalLease, RedisLease
from ._redis_line import WaiterLine
from ._redis_link import client_location, connect
from ._redis_nodes import Nodes, is_cluster
from ._redis_scripts import decode_state
from ._redis_state import scope_statistics

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    import valkey.asyncio as aiovalkey

    #: The clients a backend takes: redis-py's and valkey-py's, of one server or a cluster.
    Client = aioredis.Redis | aioredis.RedisCluster | aiovalkey.Valkey | aiovalkey.ValkeyCluster

    from .._controller import Feedback
    from .._limiter import Limiter
    from .._policy import ScopePolicy
    from .memory import MemoryBackend

__all__ = ["FailurePolicy", "RedisBackend", "RedisBackendStatistics"]

if not any(map(installed, LIBRARIES)):  # pragma: no cover - depends on the environment
    raise ImportError(
        "throttlekit.backends.redis needs redis-py or valkey-py: "
        'pip install "throttlekit-http[redis]" (or "throttlekit-http[valkey]")'
    )

logger = logging.getLogger(__name__)

#: What :meth:`RedisBackend.acquire` does when Redis cannot be reached (see ``failure``).
FailurePolicy = Literal["fail_open", "fail_closed"]

INF: Final = math.inf


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "RedisBackend runs on asyncio only (it is built on redis.asyncio or valkey.asyncio); "
            "use the in-memory limiter on trio"
        ) from None


def _remaining(deadline: float) -> float | None:
    return None if deadline == INF else max(0.0, deadline - _now())


class RedisBackend:
    """Share scope budgets through Redis so many processes throttle as one.

    Every process that uses the same Redis database and ``prefix`` shares, per
    scope: the concurrency (leases that expire, so a crashed worker's slots
    come back after ``lease_time``), the delay and slot delay between sends
    (with jitter), the quota window with costs (reconciled with the
    ``consumed`` costs given to :meth:`~throttlekit.Permit.record`), and the
    controllers: backoff (and ``Retry-After`` / ``RateLimit`` blocks),
    AutoThrottle, rampup, Adaptive and custom ``controllers`` run in Python in each
    process on the state stored in Redis, so one worker's 429 slows all of
    them. Each scope's policy comes from the limiter that asks
    (:meth:`Limiter.policy <throttlekit.Limiter.policy>`): configure the
    workers alike.

    An uncontended acquire is one round trip and a release one more, which
    it does not wait for unless it carries feedback for the controllers (see
    :doc:`/redis` for when the controllers add one, reserved grants, turns
    and wake-ups). The limiter's global ``concurrency`` cap stays per
    process. Runs on asyncio only; needs Redis >= 5.0, standalone, behind
    Sentinel (give it ``Sentinel(...).master_for(...)``) or a Redis Cluster
    (see :doc:`/redis`).

    :param client: a ``redis.asyncio.Redis`` client, or a
        ``redis.asyncio.cluster.RedisCluster`` one, or valkey-py's
        ``valkey.asyncio.Valkey`` or ``valkey.asyncio.cluster.ValkeyCluster``
        (not closed by :meth:`aclose` unless ``owns_client``). :meth:`from_url`
        builds one.
    :param prefix: the namespace of the keys: processes with the same prefix share
        budgets. No ``{`` or ``}``.
    :param lease_time: seconds a grant stays held without a release or
        :meth:`renew`; a crashed worker's slots come back after it.
    :param failure: what :meth:`acquire` does when Redis cannot be reached:
        ``"fail_open"`` throttles with the limiter's in-memory ledgers (same
        policies, within this process, counting the leases it still holds),
        logs a warning, and goes back to Redis when it answers again (tried at
        most every ``reconnect_interval``); ``"fail_closed"`` raises
        :class:`~throttlekit.BackendUnavailable`.
    :param reserve_ahead: seconds ahead of its send time a grant may be
        reserved (at a fast pace, several delays ahead); ``0`` grants only at
        the current instant.
    :param state_ttl: seconds a scope's learned state survives in Redis without
        any traffic (up to an eighth more). Live state (blocks, leases, quota
        windows) always lives as long as it matters.
    :param reconnect_interval: seconds between attempts to reach Redis again
        while failing open.
    :param release_timeout: seconds a release may take (it is shielded from
        cancellation); a release that times out is left to ``lease_time``.
    :param command_timeout: seconds one round trip may take before Redis counts
        as unavailable (default 1.0). A round trip also ends with the caller's
        ``acquire(timeout=...)``, but gets at least 0.4 s.
    :param seed: seed of the jitter's random numbers.
    :param owns_client: close ``client`` in :meth:`aclose`.
    :param location: how logs and the repr name the server (default: the
        client's host, port and database; never credentials).
    :param colocate: on a Redis Cluster, maps a scope to a group name whose
        hash tag its keys carry, so that a group's scopes live in one slot
        and a request for several of them is one atomic call (default: each
        scope its own slot; a request across slots is granted part by part,
        see :doc:`/redis`). Every process must map scopes alike.

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
        client: Client,
        *,
        prefix: str = "throttlekit",
        lease_time: float = 60.0,
        failure: FailurePolicy = "fail_open",
        reserve_ahead: float = 0.05,
        state_ttl: float = 3600.0,
        reconnect_interval: float = 1.0,
        release_timeout: float = 1.0,
        command_timeout: float = 1.0,
        seed: int | None = None,
        owns_client: bool = False,
        location: str | None = None,
        colocate: Callable[[str], str] | None = None,
        _to_cluster: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty str, got {prefix!r}")
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must not contain '{{' or '}}' (hash tags), got {prefix!r}")
        if failure not in ("fail_open", "fail_closed"):
            raise ValueError(f"failure must be 'fail_open' or 'fail_closed', got {failure!r}")
        if not is_cluster(client) and (
            not callable(getattr(client, "pubsub", None)) or not hasattr(client, "connection_pool")
        ):
            raise TypeError(
                "client must be a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster "
                f"client (or valkey-py's Valkey or ValkeyCluster), got {type(client)!r}"
            )
        library_of(client)  # (its error classes recognised from now on)
        if colocate is not None and not callable(colocate):
            raise TypeError(f"colocate must be a callable (scope -> group), got {colocate!r}")
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
        self.command_timeout = check_number(
            "command_timeout", command_timeout, minimum=0.0, strict=True
        )
        self._client = client
        self._owns_client = owns_client
        self._location = location if location is not None else client_location(client)
        self._link = Nodes(
            client,
            location=self._location,
            failure=failure,
            reconnect_interval=reconnect_interval,
            to_cluster=_to_cluster,
        )
        self._calls = ScriptCalls(
            self._link,
            prefix=prefix,
            colocate=colocate,
            lease_time=self.lease_time,
            reserve_ahead=self.reserve_ahead,
            state_ttl=self.state_ttl,
            release_timeout=self.release_timeout,
            command_timeout=self.command_timeout,
            seed=seed,
        )
        self._line = WaiterLine(
            self._link,
            self._calls.channel.decode(),
            self._calls.encoded.token,
            self._location,
            self.command_timeout,
        )
        self._holdings = Holdings()
        self._closed = False
        self._local: MemoryBackend | None = None
        self._local_grants = 0

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
        command_timeout: float = 1.0,
        seed: int | None = None,
        colocate: Callable[[str], str] | None = None,
        cluster: bool | None = None,
        client_library: Literal["redis", "valkey"] | None = None,
        **client_options: Any,
    ) -> RedisBackend:
        """Connect to ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``; ``valkey://``,
        ``valkeys://``).

        Credentials go in the URL (``redis://user:password@host:6379/0``) or in
        ``client_options`` (``password=...``); they never appear in reprs, logs
        or the backend's exceptions. TLS options (``ssl_ca_certs=...``) go in
        the URL query or ``client_options``. Unless given, the client gets a
        connect timeout of ``command_timeout``, no socket timeout and no
        retries of its own: the backend bounds each of its round trips itself
        (a socket timeout would only add a timer task to every call), so an
        outage is noticed within ``command_timeout``. The other
        keyword arguments are those of the constructor; the client is closed
        by :meth:`aclose`.

        ``cluster``: ``True`` makes a Redis Cluster client
        (``RedisCluster.from_url``), ``False`` a client of one server, and
        ``None`` (the default) a client of one server that becomes a cluster
        client of the same URL when the server is a cluster node (asked once,
        with ``INFO cluster``, before the first call; or its first ``MOVED``,
        ``ASK`` or ``TRYAGAIN`` reply where ``INFO`` is not permitted).

        ``client_library``: ``"redis"`` makes the client with redis-py,
        ``"valkey"`` with valkey-py (Valkey's fork of redis-py); ``None`` (the
        default) picks by the URL: valkey-py for ``valkey://`` and
        ``valkeys://``, redis-py for the others (or valkey-py when redis-py is
        not installed). Both talk to Redis and to Valkey servers alike.
        """
        client, location, to_cluster = connect(
            url, command_timeout, client_options, cluster, client_library
        )
        return cls(
            client,
            prefix=prefix,
            lease_time=lease_time,
            failure=failure,
            reserve_ahead=reserve_ahead,
            state_ttl=state_ttl,
            reconnect_interval=reconnect_interval,
            release_timeout=release_timeout,
            command_timeout=command_timeout,
            seed=seed,
            owns_client=True,
            location=location,
            colocate=colocate,
            _to_cluster=to_cluster,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("down" if self._link.down else "up")
        return (
            f"<RedisBackend {self._location} prefix={self.prefix!r} {self.failure} "
            f"lease_time={self.lease_time:g} waiting={self._line.waiting} {state}>"
        )

    @property
    def location(self) -> str:
        """Where Redis is, without credentials (for logs and reprs)."""
        return self._location

    @property
    def client(self) -> Client:
        """The ``redis.asyncio`` (or ``valkey.asyncio``) client given (or made by
        :meth:`from_url`)."""
        return self._client

    def statistics(self) -> RedisBackendStatistics:
        """A frozen snapshot of this backend's counters."""
        return self._calls.statistics(local_grants=self._local_grants, waiting=self._line.waiting)

    def scope_keys(self, scope: str) -> list[str]:
        """The Redis keys that hold ``scope`` (all with the hash tag ``{prefix:scope}``,
        or ``{prefix:group}`` with ``colocate``)."""
        return [key.decode() for key in self._calls.scope_keys(scope)]

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
        gated: bool = True,
    ) -> Any:
        """Wait until every scope in ``costs`` admits the request; return the lease.

        ``gated=False`` (a nested acquire) takes no slot of the process's global cap.

        Called by :meth:`Limiter.acquire <throttlekit.Limiter.acquire>`.

        :raises ThrottleTimeout: when ``timeout`` seconds pass first (whatever
            Redis does: a round trip never outlasts the timeout by more than
            0.4 s).
        :raises BackendUnavailable: when Redis is unreachable or does not answer
            within ``command_timeout`` and ``failure`` is ``"fail_closed"``.
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
        policies = []
        for scope, cost in costs.items():
            policy = local.policy(scope)
            if policy.quota is not None and cost > policy.quota:
                raise ValueError(
                    f"cost {cost!r} for scope {scope!r} exceeds its quota {policy.quota!r}; "
                    "it could never be sent"
                )
            policies.append(policy)
        deadline = INF if timeout is None else _now() + timeout
        return await self._acquire(local, dict(costs), policies, priority, deadline, gated)

    def record(self, lease: Any, feedback: Feedback, consumed: Mapping[str, float] | None) -> None:
        """Keep the feedback on the lease: the controllers get it with the release."""
        if isinstance(lease, LocalLease):
            self._bound().record(lease.ticket, feedback, consumed)
        else:
            lease.feedback, lease.consumed = feedback, consumed

    def release_nowait(self, lease: Any) -> bool:
        """Only a local (fail-open) lease can be given back without a round trip."""
        if isinstance(lease, LocalLease):
            if not lease.released:
                lease.released = True
                self._bound().release_nowait(lease.ticket)
                self._holdings.remove(lease.scopes, shared=False)
            return True
        return False

    async def release(self, lease: Any) -> None:
        """Hand ``lease`` back with the feedback of its request (shielded from cancellation)."""
        if isinstance(lease, LocalLease):
            self.release_nowait(lease)
            return
        if not isinstance(lease, RedisLease):
            raise TypeError(f"not a lease of this backend: {lease!r}")
        if lease.released:
            return
        lease.released = True
        calls = self._calls
        if lease.feedback is None and calls.releases.post(lease, lease.consumed):
            self._let_go(lease)  # (sent without waiting: nothing to shield)
            return
        try:
            with anyio.CancelScope(shield=True):
                if not await calls.releases.release(
                    lease, lease.feedback, lease.consumed, used=True
                ):
                    calls.orphans.append(lease)  # (its feedback is lost)
        finally:
            self._let_go(lease)

    async def aclose(self) -> None:
        """Drop the pub/sub connection and close the client if this backend made it.

        Releases sent without waiting for their replies are confirmed first,
        and feedback kept for a busy scope's next write is stored (for at
        most ``release_timeout``).
        """
        self._closed = True
        await self._line.drop_pubsub()
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.release_timeout):
            try:
                await self._calls.releases.store_kept(_now() + self.release_timeout)
            except Exception as exc:  # (what a busy scope's controllers did not hear)
                logger.debug("kept feedback could not be stored on closing: %r", exc)
            try:
                await self._link.settle()
            except Exception as exc:  # the leases lapse after lease_time
                logger.debug("releases could not be confirmed on closing: %r", exc)
        await self._link.aclose()
        if self._owns_client:
            await self._client.aclose()

    # -- leases --------------------------------------------------------------------

    async def renew(self, permit: Any, lease_time: float | None = None) -> bool:
        """Extend a held permit's lease to ``lease_time`` (default: the backend's) from now.

        Long requests call it (or use :meth:`keep_alive`) so that their slots
        are not taken back while they run. Returns whether every scope still
        held the lease (``False``: it had already expired or was released, or
        Redis did not answer). Grants of the local fallback need no renewal.
        """
        lease = getattr(permit, "_lease", permit)
        if isinstance(lease, LocalLease):
            return True
        if not isinstance(lease, RedisLease):
            raise TypeError(f"not a permit or lease of this backend: {permit!r}")
        if lease.released:
            return False
        seconds = self.lease_time if lease_time is None else lease_time
        seconds = check_number("lease_time", seconds, minimum=0.0, strict=True)
        try:
            return await self._calls.releases.renew(lease, seconds)
        except ERRORS.unavailable as exc:
            self._link.unavailable(exc, _now())
            return False

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
        calls = self._calls
        args = [calls.now_arg(), calls.args(policy).wire]
        reply = await calls.call(STATE, calls.scope_keys(scope), args, INF)
        waiting = self._line.waiting_on(scope)
        return scope_statistics(scope, policy, decode_state(reply), _now(), waiting)

    # -- internals: acquiring ------------------------------------------------------

    def _bound(self) -> MemoryBackend:
        local = self._local
        if local is None:
            raise RuntimeError("give this RedisBackend to a Limiter(backend=...) first")
        return local

    async def _acquire(
        self,
        local: MemoryBackend,
        costs: dict[str, float],
        policies: list[ScopePolicy],
        priority: int,
        deadline: float,
        gated: bool = True,
    ) -> Any:
        """Ask Redis, waiting in this process's line between attempts; fall back if it is away.

        ``policies`` are those of the scopes in ``costs``, in order.
        """
        line = self._line
        link = self._link
        if not link.down or link.may_try(_now()):
            if local.max_waiters is not None and line.waiting >= local.max_waiters:
                raise Overloaded(f"{line.waiting} requests are already waiting (max_waiters)")
            attempt = partial(self._attempt, local, costs, policies, priority, deadline, gated)
            try:
                lease = await line.wait_for_grant(costs, priority, attempt, deadline)
            except ERRORS.unavailable as exc:
                if isinstance(exc, ThrottleTimeout):
                    raise
                self._holdings.outage()
                self._link.unavailable(exc, _now())  # raises if failing closed
            else:
                return await self._until_send(lease)
        return await self._acquire_locally(local, costs, priority, deadline, gated)

    async def _attempt(
        self,
        local: MemoryBackend,
        costs: dict[str, float],
        policies: list[ScopePolicy],
        priority: int,
        deadline: float,
        gated: bool,
        turn: Any,
    ) -> RedisLease | tuple[int, float, bool, Any]:
        """One round trip, holding the per-process global cap and counted as held meanwhile."""
        gate = await local.acquire({}, priority=priority, timeout=_remaining(deadline), gated=gated)
        holdings = self._holdings
        unshared = holdings.unshared
        extra = [unshared.get(scope, 0) for scope in costs] if unshared else None
        # Counted as held while asked for, so that local grants (failing open,
        # in other tasks) count it too.
        epoch = holdings.epoch
        holdings.add(costs, shared=True)
        try:
            result = await self._calls.attempt(costs, policies, extra, gate, turn, deadline)
        except BaseException:
            local.release_nowait(gate)
            holdings.remove(costs, shared=epoch == holdings.epoch)
            raise
        if isinstance(result, RedisLease):
            result.epoch = epoch
            holdings.sent(costs, result.send_at)
            return result
        holdings.remove(costs, shared=epoch == holdings.epoch)
        local.release_nowait(gate)
        index, wait, full, turn, closed = result
        if closed is not None:
            reopens_in, cause, delay = closed
            now = _now()
            scope = list(costs)[index]
            stalled = scope_stalled(scope, policies[index], cause, delay, now + reopens_in, now)
            if stalled is not None:
                raise stalled
        return index, wait, full, turn

    async def _acquire_locally(
        self,
        local: MemoryBackend,
        costs: dict[str, float],
        priority: int,
        deadline: float,
        gated: bool = True,
    ) -> LocalLease:
        """Grant from the in-memory ledgers, counting the leases this process holds in Redis."""
        await self._holdings.claim(costs, local.policy, deadline)
        try:
            ticket = await local.acquire(
                costs, priority=priority, timeout=_remaining(deadline), gated=gated
            )
        except BaseException:
            self._holdings.remove(costs, shared=False)
            raise
        self._local_grants += 1
        return LocalLease(ticket)

    async def _until_send(self, lease: RedisLease) -> RedisLease:
        """Sleep until a reserved grant's send time; hand it back if cancelled."""
        now = _now()
        if lease.send_at <= now:
            lease.granted_at = now
            return lease
        try:
            await anyio.sleep_until(lease.send_at)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._hand_back(lease)
            raise
        lease.granted_at = _now()
        return lease

    # -- internals: releasing ------------------------------------------------------

    def _let_go(self, lease: RedisLease) -> None:
        self._bound().release_nowait(lease.gate)
        holdings = self._holdings
        holdings.remove(lease.scopes, shared=lease.epoch == holdings.epoch)

    async def _hand_back(self, lease: RedisLease) -> None:
        """Give back a grant that was never used (its quota too)."""
        lease.released = True
        try:
            if not await self._calls.releases.release(lease, None, None, used=False, quiet=True):
                self._calls.orphans.append(lease)
        finally:
            self._let_go(lease)
