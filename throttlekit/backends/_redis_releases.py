"""The Redis backend's leases after their grant: renewed, and handed back with their feedback.

A release is one ``RELEASE`` call, preceded by one that reads the
controllers' state when its feedback needs them and the grant did not bring
it (:mod:`._redis_state` runs them), or, without feedback and in scopes
without slot delay or quota, a ``PLAIN_RELEASE`` (the lease sets only). A
release whose reply nobody needs now is posted without waiting for it; a
release that failed, and a grant whose acquire reply was lost, are handed
back as soon as Redis answers again (the orphans).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import attrs

from .._clock import now as _now
from .._controller import held_decisions, tell_decisions
from ..headers import RateLimitInfo
from . import _redis_scripts as scripts
from ._redis_args import (
    INF,
    NO_WRITE,
    NOT_WANTED,
    PLAIN_RELEASE,
    RELEASE,
    RENEW,
    SUFFIXES,
    UNUSED,
    USED,
    USED_EARLY,
    WRITE_TRIES,
    ms,
)
from ._redis_clients import ERRORS
from ._redis_kept import KeptFeedback
from ._redis_leases import RedisLease
from ._redis_link import Settle, bulk_of, describe_failure
from ._redis_state import PolicyArgs, Write, feedback_write, parse_states

if TYPE_CHECKING:
    from .._controller import Feedback
    from ._redis_calls import ScriptCalls

__all__ = ["Releases"]

logger = logging.getLogger("throttlekit.backends.redis")

#: What :meth:`Releases._send` returns when the feedback was not stored and
#: the lease is still held.
_NOT_STORED: Final = object()

#: Tries after which a success's write that keeps meeting a newer state is
#: kept for this process's next release of the scope (its slot is free by
#: then). Processes whose writes meet each other's each try again at once,
#: and at tens of writes per second among 8 processes on two cores most met
#: a newer state 8 times and were dropped; kept, a process stores all it kept
#: in one write, so that the writes grow fewer as they meet more.
KEEP_AFTER: Final = 2

#: What the headers of a response without rate-limit headers say.
_NO_HEADERS: Final = RateLimitInfo()

#: A release waits for its reply when its lease may lapse within this many
#: seconds (plus a tenth of ``lease_time``): the reply then says whether it had.
_SURE: Final = 1.0


def _announces_nothing(feedback: Feedback | None) -> bool:
    """Whether ``feedback`` is a success that announces no limit (no rate-limit headers).

    Its controllers' write may then land after the slot is free: nothing in
    it may stop the next grant (a refusal's or a stated quota's may).
    """
    if feedback is None or feedback.status is None or feedback.exception is not None:
        return False
    info = feedback.rate_limit
    return 200 <= feedback.status < 400 and (info is None or info == _NO_HEADERS)


class _Pending:
    """One release being prepared: each scope's arguments, the controllers' writes."""

    __slots__ = (
        "earlier",
        "feedback_at",
        "fixed",
        "from_grant",
        "told",
        "used",
        "wanted",
        "writes",
    )

    def __init__(self) -> None:
        self.used = USED  # USED, USED_EARLY or UNUSED (see RELEASE)
        self.fixed: list[bytes] = []  # per scope: its arguments but the write
        self.writes: dict[int, bytes] = {}  # per scope index: the controllers' write
        # per scope index: a write made on the state the grant brought, and the
        # leases in flight then (this one among them)
        self.from_grant: dict[int, tuple[Write, int]] = {}
        # per scope index: what the controllers logged making it (told if it stands)
        self.told: dict[int, list[logging.LogRecord]] = {}
        self.wanted = False  # whether the feedback goes to some scope's controllers
        self.feedback_at: float | None = None  # the feedback's time, on Redis's clock
        # per scope index wanting it: feedback kept from this process's earlier releases
        self.earlier: dict[int, list[tuple[Feedback, float]]] = {}

    def batch(self, index: int, feedback: Feedback) -> list[tuple[Feedback, float]]:
        """What scope ``index``'s controllers run on: what was kept, then ``feedback``."""
        assert self.feedback_at is not None
        return [*self.earlier.get(index, ()), (feedback, self.feedback_at)]


def _without_this_lease(pending: _Pending) -> None:
    """The lease was released before the writes stood: those made on the grant's state
    stand with one lease fewer in flight (else each is stale at the next try, and
    after :data:`KEEP_AFTER` tries the feedback is only kept: a new scope's first
    feedback, with a scope whose write came with the grant, was never stored).
    """
    for index, (write, in_flight) in pending.from_grant.items():
        pending.writes[index] = _encoded(write, b"%d" % max(in_flight - 1, 0))
    pending.from_grant.clear()


def _encoded(write: Write, in_flight: bytes) -> bytes:
    """A scope's write as RELEASE takes it: checked against ``in_flight`` leases ('' = not)."""
    return b"".join(map(bulk_of, (*write, in_flight)))


class Releases:
    """The renewals and releases of one backend, called through its
    :class:`~._redis_calls.ScriptCalls`."""

    __slots__ = ("args", "calls", "count", "kept")

    def __init__(self, calls: ScriptCalls) -> None:
        self.calls = calls
        self.args = calls.encoded
        self.count = 0  # release calls (round trips)
        self.kept = KeptFeedback()

    def __repr__(self) -> str:
        return f"<Releases calls={self.count}>"

    async def renew(self, lease: RedisLease, seconds: float) -> bool:
        """Extend ``lease`` to ``seconds`` from now; whether every scope still held it."""
        if lease.parts is not None:
            renewed = [await self.renew(part, seconds) for part in lease.parts]
            lease.expires = min(part.expires for part in lease.parts)
            return all(renewed)
        keys = lease.keys[0 : -1 : len(SUFFIXES)]
        started = _now()
        args = [self.calls.now_arg(), lease.id, ms(seconds)]
        count = await self.calls.call(RENEW, keys, args, INF)
        if int(count) != len(keys):
            return False
        lease.expires = max(lease.expires, started + seconds)
        return True

    async def hand_back_orphans(self, deadline: float, *, quiet: bool = False) -> None:
        """Hand back grants whose acquire reply was lost, and releases that failed.

        :raises TimeoutError: if Redis is still away (unless ``quiet``).
        """
        orphans = self.calls.orphans
        while orphans:
            lease = orphans.pop(0)
            used = lease.granted_at > -INF  # (a sent request keeps its quota)
            if not await self.release(lease, None, None, used=used, quiet=True, deadline=deadline):
                orphans.append(lease)
                if quiet:
                    return
                raise TimeoutError("Redis did not take back an abandoned grant")

    def _lapses_soon(self, lease: RedisLease, now: float) -> bool:
        """Whether ``lease`` may lapse soon: its release then waits for the reply."""
        return now >= lease.expires - _SURE - 0.1 * self.calls.lease_time

    def post(self, lease: RedisLease, consumed: Mapping[str, float] | None) -> bool:
        """Release a sent request without feedback, without waiting; whether it was sent.

        Its reply can only say that it was released, unless its lease may
        lapse soon (then this returns ``False``, as when no kept connection
        can carry it without waiting: :meth:`release` it). The reply is read
        by the next call on the connection (:meth:`_settled`); had Redis not
        run it, the lease is handed back by the next acquire, or lapses after
        ``lease_time``.
        """
        if lease.parts is not None or self._lapses_soon(lease, _now()):
            return False
        clock = self.calls.now_arg()
        script, command = PLAIN_RELEASE, self.args.plain_release(lease, clock)
        if command is None:
            script = RELEASE
            command = self.args.unwanted_release(lease, clock, USED, consumed)
        if not self.calls.link.post(script, command, lease.keys[0], partial(self._settled, lease)):
            return False
        self.count += 1
        return True

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
        deadline = min(deadline, now + self.calls.release_timeout)
        if lease.parts is not None:  # (a grant across slots: each part on its node)
            released = True
            for part in lease.parts:
                if not await self.release(
                    part, feedback, consumed, used=used, quiet=quiet, deadline=deadline
                ):
                    released = False
            return released
        if feedback is not None:
            feedback = attrs.evolve(feedback, sent_at=lease.send_at_ms / 1000.0)
        early = used and _announces_nothing(feedback)
        pending = self._prepare(lease, feedback, consumed, used, early)
        pending.used = USED_EARLY if early else USED if used else UNUSED
        later: Settle | None = None
        if not quiet and not pending.wanted and not self._lapses_soon(lease, now):
            later = partial(self._settled, lease)
        try:
            released = await self._send(lease, pending, feedback, deadline, later)
            if released is _NOT_STORED:  # (the lease is still held: hand it back without it)
                released = await self._without_feedback(lease, used, consumed, deadline, later)
        except ERRORS.unavailable as exc:
            if not quiet:
                self._not_released(exc)
            return False
        finally:
            names = list(lease.scopes)
            self.kept.writing.difference_update(names[index] for index in pending.earlier)
        if released is not None and used and not quiet:
            # (A lease handed back again may well be gone: no news.)
            self._check_found(list(lease.scopes), released)
        return True

    def _prepare(
        self,
        lease: RedisLease,
        feedback: Feedback | None,
        consumed: Mapping[str, float] | None,
        used: bool,
        early: bool,
    ) -> _Pending:
        """Each scope's arguments, and the controllers' writes where the grant brought
        their state (run on ``feedback`` now: the write stands if it still is the state).

        ``early``: the feedback announces no limit; where another release of
        this process writes the scope, it is kept for the next (:class:`KeptFeedback`).
        """
        pending = _Pending()
        only = None if feedback is None else feedback.scopes
        for index, (scope, policy_args) in enumerate(
            zip(lease.scopes, lease.policies, strict=True)
        ):
            want = NOT_WANTED
            if used and feedback is not None and (only is None or scope in only):
                if early and scope in self.kept.writing:
                    self.kept.add(scope, lease, feedback, self._redis_now(lease))
                else:
                    want = self._wanted(pending, lease, index, scope, policy_args, feedback)
            pending.fixed.append(self.args.release_scope(scope, policy_args, want, consumed))
        return pending

    def _wanted(
        self,
        pending: _Pending,
        lease: RedisLease,
        index: int,
        scope: str,
        policy_args: PolicyArgs,
        feedback: Feedback,
    ) -> bytes:
        """Scope ``index`` writes ``feedback`` and what this process kept: its ``want``.

        The write is made now where the grant brought the scope's state.
        """
        self.kept.writing.add(scope)
        pending.earlier[index] = earlier = self.kept.take(scope)
        pending.wanted = True
        stored = lease.stored.get(index) if lease.stored else None
        if stored is not None:
            if pending.feedback_at is None:
                pending.feedback_at = self._redis_now(lease)
            batch = pending.batch(index, feedback)
            with held_decisions() as pending.told[index]:
                write = feedback_write(scope, policy_args, stored, batch)
            pending.from_grant[index] = (write, stored.in_flight)
            pending.writes[index] = _encoded(write, b"%d" % stored.in_flight)
        wants = max(policy_args.wants(each) for each in [*(f for f, _ in earlier), feedback])
        return bulk_of(str(wants))

    async def _send(
        self,
        lease: RedisLease,
        pending: _Pending,
        feedback: Feedback | None,
        deadline: float,
        later: Settle | None,
    ) -> Any:
        """Send the release until the controllers' writes stand (or the tries run out).

        Returns what it released (:class:`~._redis_scripts.Released`), None
        when it was sent without waiting, or :data:`_NOT_STORED` when the
        feedback met a newer state on every try (nothing released yet). Feedback
        not stored is kept for the next release (:class:`KeptFeedback`): once
        the slot is free, after :data:`KEEP_AFTER` tries.
        """
        names = list(lease.scopes)
        clock = self.calls.now_arg()
        plain = None
        if pending.used is not UNUSED and not pending.wanted:
            plain = self.args.plain_release(lease, clock)
        freed: scripts.Released | None = None  # released before the writes stood
        for tries in range(1, WRITE_TRIES + 1):
            script, command = PLAIN_RELEASE, plain
            if command is None:
                scopes = [
                    values + pending.writes.get(index, NO_WRITE)
                    for index, values in enumerate(pending.fixed)
                ]
                script, command = RELEASE, self.args.release(lease, clock, pending.used, scopes)
            self.count += 1
            reply = await self.calls.send(script, command, lease.keys[0], deadline, later)
            if reply is None:
                return None  # sent; its reply is read by the next call
            decoded = scripts.decode_release(reply)
            if type(decoded) is scripts.Released:
                for index in sorted(pending.told):
                    tell_decisions(pending.told[index])
                return freed or decoded
            assert type(decoded) is scripts.Stale
            if decoded.found is not None and freed is None:
                freed = scripts.Released(decoded.now_ms, decoded.found)
                _without_this_lease(pending)
            if pending.feedback_at is None:
                pending.feedback_at = decoded.now_ms / 1000.0  # the first reading
            assert feedback is not None
            if freed is not None and tries >= KEEP_AFTER:
                break
            for stored in parse_states(decoded.states):
                index = stored.index
                pending.from_grant.pop(index, None)
                batch = pending.batch(index, feedback)
                with held_decisions() as pending.told[index]:
                    write = feedback_write(names[index], lease.policies[index], stored, batch)
                pending.writes[index] = _encoded(write, b"")
        assert feedback is not None
        for index in pending.earlier:
            self.kept.put_back(names[index], lease, pending.batch(index, feedback))
        return freed or _NOT_STORED

    async def store_kept(self, deadline: float) -> None:
        """Store the feedback kept (at close: else it is lost), each scope in one write.

        Sent as a release of the lease whose release kept it last: released
        already, it releases nothing, and the call stores only the writes.
        Writes that keep meeting a newer state (other processes closing too)
        try again until ``deadline``.

        :raises: what a call to Redis raises.
        """
        while _now() < deadline and (newest := self.kept.newest()) is not None:
            scope, lease, feedback = newest
            feedback = attrs.evolve(feedback, scopes=frozenset({scope}))
            pending = self._prepare(lease, feedback, None, True, False)
            pending.used = USED
            try:
                await self._send(lease, pending, feedback, deadline, None)
            finally:
                self.kept.writing.discard(scope)

    async def _without_feedback(
        self,
        lease: RedisLease,
        used: bool,
        consumed: Mapping[str, float] | None,
        deadline: float,
        later: Settle | None,
    ) -> Any:
        """Release ``lease`` without feedback (what it released, or None: see :meth:`_send`)."""
        clock = self.calls.now_arg()
        command = self.args.unwanted_release(lease, clock, USED if used else UNUSED, consumed)
        self.count += 1
        reply = await self.calls.send(RELEASE, command, lease.keys[0], deadline, later)
        if reply is None:
            return None
        released = scripts.decode_release(reply)
        return released if type(released) is scripts.Released else None

    def _redis_now(self, lease: RedisLease) -> float:
        """Redis's clock now (seconds), as well as this process can tell: not later."""
        clock = self.calls.clock
        if clock is not None:
            return clock()
        return max(_now() + self.calls.offset, lease.send_at_ms / 1000.0)

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
        self.calls.orphans.append(lease)

    def _not_released(self, exc: BaseException) -> None:
        logger.warning(
            "could not release a lease on Redis at %s (%s); it is handed back when "
            "Redis answers again, or expires in %g s",
            self.calls.link.location,
            describe_failure(exc),
            self.calls.lease_time,
        )

    def _check_found(self, names: list[str], released: Any) -> None:
        """Warn if a released lease had lapsed in some of its scopes."""
        if released.found < len(names):
            logger.warning(
                "a lease on %s had expired before its release (held longer than "
                "lease_time=%g s, or Redis lost it): raise lease_time or use keep_alive()",
                sorted(names),
                self.calls.lease_time,
            )
