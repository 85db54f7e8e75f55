"""What the Redis backend grants, and what this process holds (for failing open).

A :class:`RedisLease` is a lease id held in every scope's lease set in
Redis; a :class:`LocalLease` is a grant of the limiter's in-memory ledgers
while Redis is away. :class:`Holdings` counts both per scope, so that a
process failing open keeps each scope's policy within itself: the leases it
still holds in Redis count against the local grants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._clock import now as _now
from .._errors import ThrottleTimeout

if TYPE_CHECKING:
    from .._controller import Feedback
    from .._policy import ScopePolicy
    from .._scheduler import Ticket
    from ._redis_state import PolicyArgs, StoredState

__all__ = ["Holdings", "LocalLease", "RedisLease"]

INF = math.inf


class RedisLease:
    """A grant from Redis: the lease id held in every scope's lease set."""

    __slots__ = (
        "consumed",
        "due",
        "encoded_keys",
        "epoch",
        "expires",
        "feedback",
        "gate",
        "granted_at",
        "id",
        "keys",
        "parts",
        "policies",
        "released",
        "scopes",
        "send_at",
        "send_at_ms",
        "stored",
    )

    def __init__(
        self,
        lease_id: bytes,
        scopes: dict[str, float],
        policies: list[PolicyArgs],
        keys: list[bytes],
        encoded_keys: bytes,
        gate: Ticket,
    ) -> None:
        self.id = lease_id
        self.scopes = scopes
        self.policies = policies  # of the scopes, in order, at the grant
        self.keys = keys
        self.encoded_keys = encoded_keys  # the number of keys and the keys, RESP-encoded
        self.gate = gate  # the per-process global cap, held from grant to release
        self.send_at_ms = 0.0  # on Redis's clock
        self.send_at = 0.0  # on the limiter's clock
        self.granted_at = -INF
        self.expires = -INF  # when the lease lapses at the earliest, on the limiter's clock
        self.released = False
        self.epoch = 0  # Holdings.epoch at the grant
        self.feedback: Feedback | None = None
        self.consumed: Mapping[str, float] | None = None
        #: The controllers' state per scope index, as of the grant (for the feedback).
        self.stored: dict[int, StoredState] | None = None
        #: The states whose ``on_send`` the grant reached (the reply's), until run.
        self.due: Sequence[Any] | None = None
        #: A grant across cluster slots: one lease per slot (same id, one send time).
        self.parts: list[RedisLease] | None = None

    @classmethod
    def across(
        cls, lease_id: bytes, scopes: dict[str, float], parts: list[RedisLease], gate: Ticket
    ) -> RedisLease:
        """The lease of a request across slots, made of its ``parts``' leases."""
        lease = cls(lease_id, scopes, [], [], b"", gate)
        lease.parts = parts
        lease.send_at_ms = parts[0].send_at_ms
        lease.send_at = max(part.send_at for part in parts)
        lease.expires = min(part.expires for part in parts)
        return lease

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<RedisLease {self.id.decode()} {sorted(self.scopes)} {state}>"


class LocalLease:
    """A grant from the limiter's in-memory ledgers while Redis is unreachable."""

    __slots__ = ("released", "ticket")

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.released = False

    def __repr__(self) -> str:
        return f"<LocalLease {self.ticket!r}>"

    @property
    def scopes(self) -> dict[str, float]:
        return self.ticket.scopes

    @property
    def granted_at(self) -> float:
        return self.ticket.granted_at


class Holdings:
    """The leases this process holds per scope, from Redis and from the local fallback.

    Leases Redis may not count are *unshared*: local grants, and Redis leases
    held when Redis went away (a restarted Redis has lost them). Acquire calls
    tell Redis how many a scope has, so that a process coming back from an
    outage does not exceed the scope's concurrency either.
    """

    __slots__ = ("_changed", "_last_send", "epoch", "held", "unshared")

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self.unshared: dict[str, int] = {}
        self.epoch = 0  # outages so far: a Redis lease of an older epoch is unshared
        self._last_send: dict[str, float] = {}
        self._changed: anyio.Event | None = None

    def __repr__(self) -> str:
        return f"<Holdings {self.held} unshared={self.unshared}>"

    def outage(self) -> None:
        """Redis went away: from now on it may not count any lease held now."""
        if self.unshared != self.held:
            self.epoch += 1
            self.unshared = dict(self.held)

    def add(self, scopes: Iterable[str], *, shared: bool) -> None:
        held, unshared = self.held, self.unshared
        for scope in scopes:
            held[scope] = held.get(scope, 0) + 1
            if not shared:
                unshared[scope] = unshared.get(scope, 0) + 1

    def sent(self, scopes: Iterable[str], at: float) -> None:
        """A lease held in ``scopes`` sends at ``at`` (the local fallback keeps the delay)."""
        last = self._last_send
        for scope in scopes:
            if at > last.get(scope, -INF):
                last[scope] = at

    def remove(self, scopes: Iterable[str], *, shared: bool) -> None:
        for scope in scopes:
            _decrement(self.held, scope)
            if not shared:
                _decrement(self.unshared, scope)
            if scope not in self.held:
                self._last_send.pop(scope, None)
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _room(self, costs: Mapping[str, float], policy: Callable[[str], ScopePolicy]) -> bool:
        for scope in costs:
            limit = policy(scope).concurrency
            if limit is not None and self.held.get(scope, 0) >= limit:
                return False
        return True

    async def claim(
        self,
        costs: Mapping[str, float],
        policy: Callable[[str], ScopePolicy],
        deadline: float,
    ) -> None:
        """Wait until this process holds less than each scope's concurrency, then count one more.

        Also waits out each scope's delay after the last send of a lease still
        held (the local ledgers do not know about sends granted by Redis).
        """
        while not self._room(costs, policy):
            if self._changed is None:
                self._changed = anyio.Event()
            event = self._changed
            with anyio.move_on_after(deadline - _now()):
                await event.wait()
                continue
            raise ThrottleTimeout(f"no grant before the timeout for scopes {sorted(costs)}")
        ready = max(
            (self._last_send.get(scope, -INF) + policy(scope).delay for scope in costs),
            default=-INF,
        )
        self.add(costs, shared=False)
        if ready > _now():
            try:
                if ready > deadline:
                    await anyio.sleep_until(deadline)
                    raise ThrottleTimeout(f"no grant before the timeout for scopes {sorted(costs)}")
                await anyio.sleep_until(ready)
            except BaseException:
                self.remove(costs, shared=False)
                raise


def _decrement(counts: dict[str, int], scope: str) -> None:
    count = counts.get(scope, 0) - 1
    if count > 0:
        counts[scope] = count
    else:
        counts.pop(scope, None)
