"""The Redis backend's round trips: the scripts called with their arguments, replies read.

:class:`ScriptCalls` turns a request into one ``ACQUIRE`` call (its
arguments encoded once per scope and policy and cached), a grant whose send
reached a controller's ``due`` time into a ``SYNC`` of the controllers'
``on_send``, and a release into a ``RELEASE`` call, preceded by one that
reads the controllers' state when its feedback needs them
(:mod:`._redis_state` runs them), or, without feedback and in scopes
without slot delay or quota, into a ``PLAIN_RELEASE`` (the lease sets
only), posted without waiting for its reply. Every call is bounded in time;
a grant whose reply was lost is handed back as soon as Redis answers again.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import anyio
import attrs

from .._clock import now as _now
from . import _redis_scripts as scripts
from ._redis_across import AcrossSlots
from ._redis_clients import ERRORS
from ._redis_leases import RedisLease
from ._redis_line import RELEASE_RECHECK
from ._redis_link import Deadlines, Script, Settle, bulk, bulk_of, describe_failure
from ._redis_nodes import Nodes
from ._redis_state import PolicyArgs, feedback_write, parse_states, send_write

if TYPE_CHECKING:
    from .._controller import Feedback
    from .._policy import ScopePolicy
    from .._scheduler import Ticket

__all__ = ["Closed", "RedisBackendStatistics", "ScriptCalls"]

logger = logging.getLogger("throttlekit.backends.redis")

INF: Final = math.inf
SUFFIXES: Final = ("L", "S", "T", "Q", "C", "W")
#: The least time a round trip gets, even when the caller's timeout is shorter (or 0).
GRACE: Final = 0.4
#: Tries of a version-checked write before the feedback is dropped (a busy scope).
_WRITE_TRIES: Final = 8
_ZERO: Final = b"0"
_ONE: Final = bulk(b"1.0")
_USED: Final = bulk(b"1")
_UNUSED: Final = bulk(b"0")
_NOT_WANTED: Final = bulk(b"0")
_WANTED: Final = bulk(b"1")
_AS_DECLARED: Final = bulk(b"-1")
_NO_WRITE: Final = bulk(b"") * 4
_NO_POLICY: Final = bulk(b"")

#: A release waits for its reply when its lease may lapse within this many
#: seconds (plus a tenth of ``lease_time``): the reply then says whether it had.
_SURE: Final = 1.0

#: When a scope that waits for time reopens, from now (seconds; slot delays
#: aside), why (a ``STALL_*`` cause of :func:`throttlekit._ledger.scope_stalled`)
#: and its delay then (seconds).
Closed = tuple[float, int, float]

ACQUIRE = Script(scripts.ACQUIRE)
SYNC = Script(scripts.SYNC)
RELEASE = Script(scripts.RELEASE)
PLAIN_RELEASE = Script(scripts.PLAIN_RELEASE)
RENEW = Script(scripts.RENEW)
STATE = Script(scripts.STATE)


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
    """

    acquire_calls: int
    grants: int
    release_calls: int
    local_grants: int
    waiting: int
    available: bool
    sync_calls: int = 0


def ms(seconds: float) -> bytes:
    """Seconds as the milliseconds the scripts read."""
    return repr(seconds * 1000.0).encode()


class ScriptCalls:
    """The scripts of one backend, called on its :class:`~._redis_nodes.Nodes`.

    ``colocate`` maps a scope to the group whose hash tag its keys carry
    (None: the scope's own), so that a Redis Cluster keeps a group's scopes
    in one slot.
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
        self.colocate = colocate
        self.lease_time = lease_time
        self.release_timeout = release_timeout
        self.command_timeout = command_timeout
        self.channel = f"{prefix}:released".encode()
        self.rng = random.Random(seed)
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(6).encode()
        self._settings = b"".join(
            bulk(ms(value)) for value in (lease_time, reserve_ahead, state_ttl, RELEASE_RECHECK)
        )
        self._ttl = ms(state_ttl)
        #: The release's arguments before the scopes' (after its clock, lease id, send time).
        self._channel = bulk(self.channel)
        self._release_base = self._channel + bulk(self._ttl)
        self._policy_args: dict[int, PolicyArgs] = {}
        #: Per scope: its keys, them encoded, its name encoded.
        self._keys: dict[str, tuple[list[bytes], bytes, bytes]] = {}
        #: Leases to hand back when Redis answers: grants whose reply was lost,
        #: releases that failed.
        self.orphans: list[RedisLease] = []
        self.acquire_calls = self.grants = self.release_calls = self.sync_calls = 0
        self.offset = -INF  # a lower bound of (Redis clock - limiter clock), seconds
        self._offset_at = 0.0
        #: Virtual time for the scripts (Redis-clock seconds), for tests; None = Redis's TIME.
        self.clock: Callable[[], float] | None = None
        self.round_trip = 0.0  # of the last acquire call, seconds
        self.across = AcrossSlots(self)

    def __repr__(self) -> str:
        return f"<ScriptCalls {self.prefix!r} orphans={len(self.orphans)}>"

    def statistics(self, *, local_grants: int, waiting: int) -> RedisBackendStatistics:
        return RedisBackendStatistics(
            acquire_calls=self.acquire_calls,
            grants=self.grants,
            release_calls=self.release_calls,
            sync_calls=self.sync_calls,
            local_grants=local_grants,
            waiting=waiting,
            available=not self.link.down,
        )

    # -- arguments -----------------------------------------------------------------

    def args(self, policy: ScopePolicy) -> PolicyArgs:
        """``policy`` as the scripts read it (cached per policy object)."""
        cached = self._policy_args.get(id(policy))
        if cached is not None and cached.policy is policy:
            return cached
        if len(self._policy_args) > 4096:
            self._policy_args.clear()
        args = self._policy_args[id(policy)] = PolicyArgs.of(policy)
        return args

    def scope_keys(self, scope: str) -> list[bytes]:
        """The keys of ``scope`` (cached)."""
        return self._scope(scope)[0]

    def _scope(self, scope: str) -> tuple[list[bytes], bytes, bytes]:
        """The keys of ``scope``, them and its name encoded for a command (cached)."""
        cached = self._keys.get(scope)
        if cached is None:
            if len(self._keys) > 4096:
                self._keys.clear()
            if self.colocate is None:
                tag = ("{" + self.prefix + ":" + scope + "}:").encode()
            else:
                group = self.colocate(scope)
                if not isinstance(group, str):
                    raise TypeError(f"colocate({scope!r}) must return a str, got {group!r}")
                tag = ("{" + self.prefix + ":" + group + "}:" + scope + ":").encode()
            keys = [tag + suffix.encode() for suffix in SUFFIXES]
            encoded = b"".join(map(bulk, keys))
            cached = self._keys[scope] = (keys, encoded, bulk(scope.encode()))
        return cached

    def now_arg(self) -> bytes:
        return b"" if self.clock is None else ms(self.clock())

    async def call(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Any], deadline: float
    ) -> Any:
        """One round trip, over after ``command_timeout`` or at ``deadline`` (at least 0.4 s).

        :raises TimeoutError: when it took longer (an ``OSError``: "unavailable").
        """
        key = keys[0] if keys else b""  # (a call without keys: any node)
        return await self._send(script, script.command(keys, args), key, deadline)

    async def _send(
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
            await self.hand_back_orphans(deadline)
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
        keys: list[bytes] = []
        encoded_keys = [b""]
        args = [bulk(self.now_arg()), bulk(lease_id), self._settings, bulk_of(turn), bulk(at)]
        packed = []
        rng = self.rng
        for index, (scope, cost) in enumerate(costs.items()):
            policy_args = self.args(policies[index])
            packed.append(policy_args)
            scope_keys, encoded, _ = self._scope(scope)
            keys += scope_keys
            encoded_keys.append(encoded)
            more = _ZERO if extra is None else b"%d" % extra[index]
            want = _WANTED if policy_args.controlled else _NOT_WANTED
            cost_arg = _ONE if cost == 1.0 else bulk_of(cost)
            args += (cost_arg, bulk_of(rng.random()), bulk(more), want, policy_args.encoded)
        tombstone = keys[0][:-1] + b"X:" + lease_id  # of a given-up call
        keys.append(tombstone)
        encoded_keys[0] = bulk(b"%d" % len(keys))
        encoded_keys.append(bulk(tombstone))
        lease = RedisLease(lease_id, costs, packed, keys, b"".join(encoded_keys), gate)
        # (number of keys, keys, clock, lease id, 4 settings, turn, at, 5 per scope)
        count = 1 + len(keys) + 8 + 5 * len(packed)
        command = ACQUIRE.frame(count, [lease.encoded_keys, *args])
        self.acquire_calls += 1
        before = _now()
        try:
            reply = await self._send(ACQUIRE, command, keys[0], deadline)
        except BaseException as exc:
            # The script may have run before the reply was lost: hand back the
            # lease it may hold, now (cancelled) or once Redis answers again.
            self.orphans.append(lease)
            if not isinstance(exc, ERRORS.unavailable):
                with anyio.CancelScope(shield=True):
                    await self.hand_back_orphans(INF, quiet=True)
            raise
        after = _now()
        self.round_trip = after - before
        decoded = scripts.decode_acquire(reply)
        wait = decoded.wait_ms / 1000.0
        if type(decoded) is scripts.Refused:
            self._sample_clock(decoded.now_ms, after)
            full = decoded.reason == 1
            return decoded.scope_index, wait, full, decoded.turn, decoded.closed
        assert type(decoded) is scripts.Granted
        self.grants += 1
        send_at_ms = decoded.send_at_ms
        self._sample_clock(send_at_ms - decoded.wait_ms, after)
        # Send at the reserved time on Redis's clock, as well as this process
        # can tell: never before it, and never later than a full round trip.
        lease.send_at_ms = send_at_ms
        lease.send_at = min(after + wait, max(before + wait, send_at_ms / 1000.0 - self.offset))
        lease.expires = before + wait + self.lease_time
        if decoded.kept or decoded.due:
            # The state of the controllers as of this grant: the release runs
            # them on its feedback without reading it again.
            lease.stored = {state.index: state for state in parse_states(decoded.kept)}
            if decoded.due:
                lease.due = decoded.due
        return lease

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
                if not await self.release(lease, None, None, used=False, quiet=True):
                    self.orphans.append(lease)
            raise

    def _slot_groups(self, costs: dict[str, float]) -> list[list[int]]:
        """The indices of ``costs``'s scopes by cluster slot, in the order of the slots."""
        cluster = self.link.cluster
        assert cluster is not None
        groups: dict[int, list[int]] = {}
        for index, scope in enumerate(costs):
            groups.setdefault(cluster.slot(self._scope(scope)[0][0]), []).append(index)
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
        for _ in range(_WRITE_TRIES):
            writes = {}
            for stored in pending:
                write = send_write(names[stored.index], policies[stored.index], stored, now)
                if write is not None:
                    writes[stored.index] = write
            if not writes:
                return
            args: list[Any] = [self.now_arg(), self._ttl]
            for index, policy in enumerate(policies):
                args += (policy.wire, *writes.get(index, ("", "", "")))
            self.sync_calls += 1
            try:
                reply = await self.call(SYNC, lease.keys, args, deadline)
            except ERRORS.unavailable as exc:
                logger.debug("could not store the controllers' state after a send: %r", exc)
                return  # the next send finds them still due
            pending = parse_states(scripts.decode_sync(reply))
            if not pending:
                return

    async def renew(self, lease: RedisLease, seconds: float) -> bool:
        """Extend ``lease`` to ``seconds`` from now; whether every scope still held it."""
        if lease.parts is not None:
            renewed = [await self.renew(part, seconds) for part in lease.parts]
            lease.expires = min(part.expires for part in lease.parts)
            return all(renewed)
        keys = lease.keys[0 : -1 : len(SUFFIXES)]
        started = _now()
        count = await self.call(RENEW, keys, [self.now_arg(), lease.id, ms(seconds)], INF)
        if int(count) != len(keys):
            return False
        lease.expires = max(lease.expires, started + seconds)
        return True

    # -- releasing -----------------------------------------------------------------

    async def hand_back_orphans(self, deadline: float, *, quiet: bool = False) -> None:
        """Hand back grants whose acquire reply was lost, and releases that failed.

        :raises TimeoutError: if Redis is still away (unless ``quiet``).
        """
        while self.orphans:
            lease = self.orphans.pop(0)
            used = lease.granted_at > -INF  # (a sent request keeps its quota)
            if not await self.release(lease, None, None, used=used, quiet=True, deadline=deadline):
                self.orphans.append(lease)
                if quiet:
                    return
                raise TimeoutError("Redis did not take back an abandoned grant")

    def _release_head(self, lease: RedisLease, used: bool) -> list[bytes]:
        """A release's arguments before the scopes': its keys, clock, lease id, send time, used."""
        return [
            lease.encoded_keys,
            bulk(self.now_arg()),
            bulk(lease.id),
            bulk_of(lease.send_at_ms),
            _USED if used else _UNUSED,
            self._release_base,
        ]

    def _release_scope(
        self,
        scope: str,
        policy_args: PolicyArgs,
        want: bytes,
        consumed: Mapping[str, float] | None,
    ) -> bytes:
        """A scope's arguments of a release but the controllers' write."""
        amount = _AS_DECLARED
        if consumed is not None and scope in consumed:
            amount = bulk_of(max(0.0, float(consumed[scope])))
        policy = policy_args.encoded
        if want is _NOT_WANTED and not policy_args.booked:
            policy = _NO_POLICY  # (the script has nothing to read it for)
        return self._scope(scope)[2] + amount + want + policy

    def post_release(self, lease: RedisLease, consumed: Mapping[str, float] | None) -> bool:
        """Release a sent request without feedback, without waiting; whether it was sent.

        Its reply can only say that it was released, unless its lease may
        lapse soon (then this returns ``False``, as when no kept connection
        can carry it without waiting: :meth:`release` it). The reply is read
        by the next call on the connection (:meth:`_settled`); had Redis not
        run it, the lease is handed back by the next acquire, or lapses after
        ``lease_time``.
        """
        if lease.parts is not None or _now() >= lease.expires - _SURE - 0.1 * self.lease_time:
            return False
        script, command = PLAIN_RELEASE, self._plain_release(lease)
        if command is None:
            script = RELEASE
            parts = self._release_head(lease, True)
            for scope, policy_args in zip(lease.scopes, lease.policies, strict=True):
                parts += (self._release_scope(scope, policy_args, _NOT_WANTED, consumed), _NO_WRITE)
            # (number of keys, keys, clock, lease id, send time, used, channel, ttl, 8 per scope)
            command = RELEASE.frame(1 + len(lease.keys) + 6 + 8 * len(lease.scopes), parts)
        if not self.link.post(script, command, lease.keys[0], partial(self._settled, lease)):
            return False
        self.release_calls += 1
        return True

    def _plain_release(self, lease: RedisLease) -> bytes | None:
        """The :data:`PLAIN_RELEASE` of a sent ``lease`` without feedback, if it applies.

        It does when no scope has a slot delay or quota (whose books a release
        keeps); ``None`` otherwise.
        """
        names = []
        for scope, policy_args in zip(lease.scopes, lease.policies, strict=True):
            if policy_args.booked:
                return None
            names.append(self._scope(scope)[2])
        # (number of keys, keys, clock, lease id, channel, a name per scope)
        count = 1 + len(lease.keys) + 3 + len(names)
        head = [lease.encoded_keys, bulk(self.now_arg()), bulk(lease.id), self._channel]
        return PLAIN_RELEASE.frame(count, head + names)

    async def release(
        self,
        lease: RedisLease,
        feedback: Feedback | None,
        consumed: Mapping[str, float] | None,
        *,
        used: bool,
        quiet: bool = False,
        deadline: float = INF,
    ) -> bool:
        """The release round trip(s), with the controllers' feedback; whether Redis answered.

        A release whose reply nobody needs now (no feedback for the
        controllers, and its lease far from lapsing, so that the reply can
        only say it was released) does not wait for it: it is sent on a kept
        connection whose next call reads it (:meth:`_settled`). Had Redis not
        run it, the lease is handed back by the next acquire, or lapses after
        ``lease_time``.
        """
        now = _now()
        deadline = min(deadline, now + self.release_timeout)
        if lease.parts is not None:  # (a grant across slots: each part on its node)
            released = True
            for part in lease.parts:
                if not await self.release(
                    part, feedback, consumed, used=used, quiet=quiet, deadline=deadline
                ):
                    released = False
            return released
        names = list(lease.scopes)
        packed = lease.policies
        if feedback is not None:
            feedback = attrs.evolve(feedback, sent_at=lease.send_at_ms / 1000.0)
        base = self._release_head(lease, used)
        fixed = []
        wanted = False
        writes: dict[int, bytes] = {}
        feedback_at = None  # the feedback's time, on Redis's clock
        for index, (scope, policy_args) in enumerate(zip(names, packed, strict=True)):
            want = _NOT_WANTED
            only = None if feedback is None else feedback.scopes
            if used and feedback is not None and (only is None or scope in only):
                want = bulk_of(str(policy_args.wants(feedback)))
                wanted = True
                stored = lease.stored.get(index) if lease.stored else None
                if stored is not None:
                    # The controllers' state came with the grant: run them on it
                    # now, and the write stands if it is still the scope's state.
                    if feedback_at is None:
                        feedback_at = self._redis_now(lease)
                    write = feedback_write(scope, policy_args, stored, feedback, feedback_at)
                    writes[index] = b"".join(map(bulk_of, (*write, b"%d" % stored.in_flight)))
            fixed.append(self._release_scope(scope, policy_args, want, consumed))
        later: Settle | None = None
        if not quiet and not wanted and now < lease.expires - _SURE - 0.1 * self.lease_time:
            later = partial(self._settled, lease)

        # (number of keys, keys, clock, lease id, send time, used, channel, ttl, 8 per scope)
        count = 1 + len(lease.keys) + 6 + 8 * len(names)
        plain = self._plain_release(lease) if used and not wanted else None
        try:
            for _ in range(_WRITE_TRIES):
                script, command = PLAIN_RELEASE, plain
                if command is None:
                    args = list(base)
                    for index, values in enumerate(fixed):
                        args += (values, writes.get(index, _NO_WRITE))
                    script, command = RELEASE, RELEASE.frame(count, args)
                self.release_calls += 1
                reply = await self._send(script, command, lease.keys[0], deadline, later)
                if reply is None:
                    return True  # sent; its reply is read by the next call
                decoded = scripts.decode_release(reply)
                if type(decoded) is scripts.Released:
                    break
                assert type(decoded) is scripts.Stale
                if feedback_at is None:
                    feedback_at = decoded.now_ms / 1000.0  # the first reading
                assert feedback is not None
                for stored in parse_states(decoded.states):
                    write = feedback_write(
                        names[stored.index], packed[stored.index], stored, feedback, feedback_at
                    )
                    writes[stored.index] = b"".join(map(bulk_of, (*write, b"")))
            else:
                logger.warning(
                    "scopes %s changed under %d tries to store feedback; it was dropped",
                    names,
                    _WRITE_TRIES,
                )
                # The lease is still held: hand it back without the feedback.
                args = list(base)
                for scope, policy_args in zip(names, packed, strict=True):
                    args += (self._release_scope(scope, policy_args, _NOT_WANTED, consumed),)
                    args.append(_NO_WRITE)
                self.release_calls += 1
                reply = await self._send(
                    RELEASE, RELEASE.frame(count, args), lease.keys[0], deadline, later
                )
                if reply is None:
                    return True
                decoded = scripts.decode_release(reply)
        except ERRORS.unavailable as exc:
            if not quiet:
                self._not_released(exc)
            return False
        if used and not quiet:  # (a lease handed back again may well be gone: no news)
            self._check_found(names, decoded)
        return True

    def _redis_now(self, lease: RedisLease) -> float:
        """Redis's clock now (seconds), as well as this process can tell: not later."""
        if self.clock is not None:
            return self.clock()
        return max(_now() + self.offset, lease.send_at_ms / 1000.0)

    def _settled(self, lease: RedisLease, reply: Any) -> None:
        """The reply of a release sent without waiting, read by a later call."""
        if type(reply) is bytes:  # released
            self._check_found(list(lease.scopes), scripts.decode_released(reply))
            return
        # Whether Redis ran it is unknown (or it did not: an error reply):
        # hand the lease back with the next acquire.
        if isinstance(reply, ERRORS.unavailable):
            self._not_released(reply)
        else:
            logger.debug("a release sent without waiting got %r", reply)
        self.orphans.append(lease)

    def _not_released(self, exc: BaseException) -> None:
        logger.warning(
            "could not release a lease on Redis at %s (%s); it is handed back when "
            "Redis answers again, or expires in %g s",
            self.link.location,
            describe_failure(exc),
            self.lease_time,
        )

    def _check_found(self, names: list[str], released: Any) -> None:
        """Warn if a released lease had lapsed in some of its scopes."""
        if released.found < len(names):
            logger.warning(
                "a lease on %s had expired before its release (held longer than "
                "lease_time=%g s, or Redis lost it): raise lease_time or use keep_alive()",
                sorted(names),
                self.lease_time,
            )
