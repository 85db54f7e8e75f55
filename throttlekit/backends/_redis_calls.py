"""The Redis backend's round trips: the scripts called with their arguments, replies read.

:class:`ScriptCalls` turns a request into one ``ACQUIRE`` call (its
arguments encoded once per scope and policy and cached: :mod:`._redis_args`),
and a grant whose send reached a controller's ``due`` time into a ``SYNC``
of the controllers' ``on_send``; its :class:`~._redis_releases.Releases`
make the releases. Every call is bounded in time; a grant whose reply was
lost is handed back as soon as Redis answers again.
"""

from __future__ import annotations

import itertools
import logging
import random
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import anyio
import attrs

from .._clock import now as _now
from .._controller import held_decisions, tell_decisions
from . import _redis_scripts as scripts
from ._redis_across import AcrossSlots
from ._redis_args import (
    ACQUIRE,
    INF,
    NOT_WANTED,
    ONE,
    STATE,
    SYNC,
    WANTED,
    WRITE_TRIES,
    ZERO,
    CallArgs,
    ms,
)
from ._redis_clients import ERRORS
from ._redis_leases import RedisLease
from ._redis_link import Deadlines, Script, Settle, bulk, bulk_of
from ._redis_nodes import Nodes
from ._redis_releases import Releases
from ._redis_state import PolicyArgs, parse_states, send_write

if TYPE_CHECKING:
    from .._policy import ScopePolicy
    from .._scheduler import Ticket

__all__ = ["STATE", "Closed", "RedisBackendStatistics", "ScriptCalls"]

logger = logging.getLogger("throttlekit.backends.redis")

#: The least time a round trip gets, even when the caller's timeout is shorter (or 0).
GRACE: Final = 0.4

#: When a scope that waits for time reopens, from now (seconds; slot delays
#: aside), why (a ``STALL_*`` cause of :func:`throttlekit._ledger.scope_stalled`)
#: and its delay then (seconds).
Closed = tuple[float, int, float]


@attrs.frozen(kw_only=True)
class RedisBackendStatistics:
    """What one :class:`RedisBackend` has done so far (this process only).

    :param acquire_calls: acquire script calls (round trips), granted or not.
    :param grants: leases granted by Redis.
    :param release_calls: release script calls (round trips).
    :param sync_calls: calls that stored the controllers' state after a send.
    :param local_grants: grants made by the local ledgers while Redis was down.
    :param waiting: acquire() calls waiting now.
    :param available: whether the last contact with Redis worked.
    :param feedback_kept: feedback kept now for the next release to store
        (another release of this process was writing its scope, or its
        write kept meeting other processes' newer state).
    :param feedback_dropped: feedback dropped, kept too long to store.
    """

    acquire_calls: int
    grants: int
    release_calls: int
    local_grants: int
    waiting: int
    available: bool
    sync_calls: int = 0
    feedback_kept: int = 0
    feedback_dropped: int = 0


class ScriptCalls:
    """The scripts of one backend, called on its :class:`~._redis_nodes.Nodes`.

    ``colocate`` maps a scope to the group whose hash tag its keys carry
    (None: the scope's own), so that a Redis Cluster keeps a group's scopes
    in one slot. The releases are :attr:`releases`'.
    """

    def __init__(
        self,
        link: Nodes,
        *,
        prefix: str,
        colocate: Callable[[str], str] | None = None,
        lease_time: float,
        reserve_ahead: float,
        state_ttl: float,
        release_timeout: float,
        command_timeout: float,
        seed: int | None,
    ) -> None:
        self.link = link
        self.deadlines = Deadlines()
        self.prefix = prefix
        self.lease_time = lease_time
        self.release_timeout = release_timeout
        self.command_timeout = command_timeout
        self.encoded = CallArgs(
            prefix=prefix,
            colocate=colocate,
            lease_time=lease_time,
            reserve_ahead=reserve_ahead,
            state_ttl=state_ttl,
        )
        self.channel = self.encoded.channel
        self.rng = random.Random(seed)
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(6).encode()
        #: Leases to hand back when Redis answers: grants whose reply was lost,
        #: releases that failed.
        self.orphans: list[RedisLease] = []
        self.acquire_calls = self.grants = self.sync_calls = 0
        self.offset = -INF  # a lower bound of (Redis clock - limiter clock), seconds
        self._offset_at = 0.0
        #: Virtual time for the scripts (Redis-clock seconds), for tests; None = Redis's TIME.
        self.clock: Callable[[], float] | None = None
        self.round_trip = 0.0  # of the last acquire call, seconds
        self.across = AcrossSlots(self)
        self.releases = Releases(self)

    def __repr__(self) -> str:
        return f"<ScriptCalls {self.prefix!r} orphans={len(self.orphans)}>"

    def statistics(self, *, local_grants: int, waiting: int) -> RedisBackendStatistics:
        return RedisBackendStatistics(
            acquire_calls=self.acquire_calls,
            grants=self.grants,
            release_calls=self.releases.count,
            sync_calls=self.sync_calls,
            local_grants=local_grants,
            waiting=waiting,
            available=not self.link.down,
            feedback_kept=len(self.releases.kept),
            feedback_dropped=self.releases.kept.dropped,
        )

    # -- arguments -----------------------------------------------------------------

    def args(self, policy: ScopePolicy) -> PolicyArgs:
        """``policy`` as the scripts read it (cached per policy object)."""
        return self.encoded.policy(policy)

    def scope_keys(self, scope: str) -> list[bytes]:
        """The keys of ``scope`` (cached)."""
        return self.encoded.scope(scope)[0]

    def now_arg(self) -> bytes:
        return b"" if self.clock is None else ms(self.clock())

    async def call(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Any], deadline: float
    ) -> Any:
        """One round trip, over after ``command_timeout`` or at ``deadline`` (at least 0.4 s).

        :raises TimeoutError: when it took longer (an ``OSError``: "unavailable").
        """
        key = keys[0] if keys else b""  # (a call without keys: any node)
        return await self.send(script, script.command(keys, args), key, deadline)

    async def send(
        self,
        script: Script,
        command: bytes,
        key: bytes,
        deadline: float,
        later: Settle | None = None,
    ) -> Any:
        """:meth:`call` with the command encoded already.

        With ``later``, the reply may be left to the next call (see
        :meth:`Link.call <._redis_link.Link.call>`): then ``None`` is returned.
        """
        bound = self.command_timeout
        if deadline != INF:
            bound = min(bound, max(deadline - _now(), GRACE))
        call = self.link.call(script, command, key, later=later)
        reply = await self.deadlines.bounded(call, bound)
        if reply is not None:  # (a call sent without waiting proves nothing)
            self.link.answered()
        return reply

    # -- acquiring -----------------------------------------------------------------

    async def attempt(
        self,
        costs: dict[str, float],
        policies: list[ScopePolicy],
        extra: list[int] | None,
        gate: Ticket,
        turn: Any,
        deadline: float,
    ) -> RedisLease | tuple[int, float, bool, Any, Closed | None]:
        """One acquire round trip: a lease, or why not.

        Not granted: ``(index of the blocking scope, seconds to wait, whether its
        concurrency is full, the turn Redis gave, when and why that scope
        reopens if it waits for time: a :data:`Closed`, else None)``. The lease keeps ``gate``;
        if the call fails, the caller gives ``gate`` back. ``extra`` counts,
        per scope, leases this process holds that Redis may not count.
        """
        if self.orphans:
            await self.releases.hand_back_orphans(deadline)
        lease_id = b"%s%x" % (self._id_prefix, next(self._ids))
        if self.link.cluster is not None and len(costs) > 1:
            groups = self._slot_groups(costs)
            if len(groups) > 1:
                return await self.across.attempt(
                    costs, policies, extra, gate, turn, deadline, lease_id, groups
                )
        result = await self.ask(lease_id, costs, policies, extra, gate, turn, deadline)
        if type(result) is RedisLease and result.due is not None:
            await self.run_due(result, deadline)
        return result

    async def ask(
        self,
        lease_id: bytes,
        costs: dict[str, float],
        policies: list[ScopePolicy],
        extra: list[int] | None,
        gate: Ticket,
        turn: Any,
        deadline: float,
        at: bytes = b"",
    ) -> RedisLease | tuple[int, float, bool, Any, Closed | None]:
        """One ``ACQUIRE`` call of scopes that share a slot (see :meth:`attempt`).

        ``at``: the exact send time of a part of a request across slots
        (see :data:`ACQUIRE`). A grant whose controllers must run ``on_send``
        keeps their states in ``due``: :meth:`run_due` runs them.
        """
        settings = self.encoded.settings
        if deadline != INF:
            settings = self.encoded.settings_within(deadline - _now())
        lease, command = self._acquire_command(
            lease_id, costs, policies, extra, gate, turn, at, settings
        )
        self.acquire_calls += 1
        before = _now()
        try:
            reply = await self.send(ACQUIRE, command, lease.keys[0], deadline)
        except BaseException as exc:
            # The script may have run before the reply was lost: hand back the
            # lease it may hold, now (cancelled) or once Redis answers again.
            self.orphans.append(lease)
            if not isinstance(exc, ERRORS.unavailable):
                with anyio.CancelScope(shield=True):
                    await self.releases.hand_back_orphans(INF, quiet=True)
            raise
        after = _now()
        self.round_trip = after - before
        decoded = scripts.decode_acquire(reply)
        if type(decoded) is scripts.Refused:
            self._sample_clock(decoded.now_ms, after)
            full = decoded.reason == 1
            wait = decoded.wait_ms / 1000.0
            return decoded.scope_index, wait, full, decoded.turn, decoded.closed
        assert type(decoded) is scripts.Granted
        self._granted(lease, decoded, before, after)
        return lease

    def _acquire_command(
        self,
        lease_id: bytes,
        costs: dict[str, float],
        policies: list[ScopePolicy],
        extra: list[int] | None,
        gate: Ticket,
        turn: Any,
        at: bytes,
        settings: bytes,
    ) -> tuple[RedisLease, bytes]:
        """The lease an ``ACQUIRE`` call would grant, and the call (see :meth:`ask`)."""
        keys: list[bytes] = []
        encoded_keys = [b""]
        now = bulk(self.now_arg())
        args = [now, bulk(lease_id), settings, bulk_of(turn), bulk(at)]
        packed = []
        rng = self.rng
        for index, (scope, cost) in enumerate(costs.items()):
            policy_args = self.encoded.policy(policies[index])
            packed.append(policy_args)
            scope_keys, encoded, _ = self.encoded.scope(scope)
            keys += scope_keys
            encoded_keys.append(encoded)
            more = ZERO if extra is None else b"%d" % extra[index]
            want = WANTED if policy_args.controlled else NOT_WANTED
            cost_arg = ONE if cost == 1.0 else bulk_of(cost)
            args += (cost_arg, bulk_of(rng.random()), bulk(more), want, policy_args.encoded)
        tombstone = keys[0][:-1] + b"X:" + lease_id  # of a given-up call
        keys.append(tombstone)
        encoded_keys[0] = bulk(b"%d" % len(keys))
        encoded_keys.append(bulk(tombstone))
        lease = RedisLease(lease_id, costs, packed, keys, b"".join(encoded_keys), gate)
        # (number of keys, keys, clock, lease id, 5 settings, turn, at, 5 per scope)
        count = 1 + len(keys) + 9 + 5 * len(packed)
        return lease, ACQUIRE.frame(count, [lease.encoded_keys, *args])

    def _granted(
        self, lease: RedisLease, granted: scripts.Granted, before: float, after: float
    ) -> None:
        """Fill in ``lease`` from Redis's grant (the call went out ``before``, back ``after``)."""
        self.grants += 1
        wait = granted.wait_ms / 1000.0
        send_at_ms = granted.send_at_ms
        self._sample_clock(send_at_ms - granted.wait_ms, after)
        # Send at the reserved time on Redis's clock, as well as this process
        # can tell: never before it, and never later than a full round trip.
        lease.send_at_ms = send_at_ms
        lease.send_at = min(after + wait, max(before + wait, send_at_ms / 1000.0 - self.offset))
        lease.expires = before + wait + self.lease_time
        if granted.kept or granted.due:
            # The state of the controllers as of this grant: the release runs
            # them on its feedback without reading it again.
            lease.stored = {state.index: state for state in parse_states(granted.kept)}
            if granted.due:
                lease.due = granted.due

    async def run_due(self, lease: RedisLease, deadline: float) -> None:
        """Run the controllers' ``on_send`` that ``lease``'s grant reached (of each part).

        If that fails, the lease is handed back (its send never happens).
        """
        try:
            for part in lease.parts or (lease,):
                if part.due is not None:
                    await self._run_on_send(part, part.policies, part.due, deadline)
                    part.due = None
        except BaseException:
            with anyio.CancelScope(shield=True):
                if not await self.releases.release(lease, None, None, used=False, quiet=True):
                    self.orphans.append(lease)
            raise

    def _slot_groups(self, costs: dict[str, float]) -> list[list[int]]:
        """The indices of ``costs``'s scopes by cluster slot, in the order of the slots."""
        cluster = self.link.cluster
        assert cluster is not None
        groups: dict[int, list[int]] = {}
        for index, scope in enumerate(costs):
            groups.setdefault(cluster.slot(self.encoded.scope(scope)[0][0]), []).append(index)
        return [groups[slot] for slot in sorted(groups)]

    def _sample_clock(self, redis_now_ms: float, after: float) -> None:
        """Keep a lower bound of (Redis clock - limiter clock), tightest over recent calls.

        Redis read its clock before ``after``, so each call gives a lower bound;
        the best one (the fastest round trip) wins, and old bounds are loosened
        by 1 ms per second so that clock drift cannot make it wrong.
        """
        bound = redis_now_ms / 1000.0 - after
        loosened = self.offset - 0.001 * (after - self._offset_at)
        self.offset = max(bound, loosened)
        self._offset_at = after

    async def _run_on_send(
        self, lease: RedisLease, policies: list[PolicyArgs], states: Sequence[Any], deadline: float
    ) -> None:
        """The send reached a controller's ``due`` time: run ``on_send`` and store the result."""
        names = list(lease.scopes)
        now = lease.send_at_ms / 1000.0
        pending = parse_states(states)
        for _ in range(WRITE_TRIES):
            writes, told = {}, {}
            for stored in pending:
                with held_decisions() as told[stored.index]:
                    write = send_write(names[stored.index], policies[stored.index], stored, now)
                if write is not None:
                    writes[stored.index] = write
            if not writes:
                return
            args: list[Any] = [self.now_arg(), self.encoded.ttl, self.channel]
            for index, policy in enumerate(policies):
                args += (names[index], policy.wire, *writes.get(index, ("", "", "")))
            self.sync_calls += 1
            try:
                reply = await self.call(SYNC, lease.keys, args, deadline)
            except ERRORS.unavailable as exc:
                logger.debug("could not store the controllers' state after a send: %r", exc)
                return  # the next send finds them still due
            pending = parse_states(scripts.decode_sync(reply))
            stale = {stored.index for stored in pending}
            for index in sorted(writes.keys() - stale):  # (the writes that stood)
                tell_decisions(told[index])
            if not pending:
                return
