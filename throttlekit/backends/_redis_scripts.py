"""The Lua scripts of the Redis backend, and the decoders of their replies.

The Lua lives in ``lua/*.lua`` beside this module (package data); each
script is ``base.lua`` (and ``common.lua``) followed by its own file, whose
header says what it takes and replies. Each reply is decoded here, by name,
into what the calling code reads (:func:`decode_acquire` ...).

The scripts do admission and bookkeeping, nothing else.

The controllers (backoff, AutoThrottle, rampup, custom ones) run in Python,
in the processes (:mod:`._redis_state`); Redis keeps what they produced and
the scripts only read it. Every script is atomic and reads Redis's own clock
(``TIME``), so the workers' clocks never matter; ``ARGV[1]`` may instead give
the time (tests drive the backend in virtual time that way; ``''`` = ``TIME``).
Times are milliseconds since the Unix epoch; ``next``/``last`` are stored with
``%.3f`` (Redis turns Lua numbers into strings with only 14 digits), values
the client sent are stored as it formatted them.

Keys of one scope (all share the hash tag ``{prefix:scope}``, so a scope is
Redis Cluster safe); ``KEYS`` holds six per scope, in this order, then the
tombstone of the call:

``L`` leases
    sorted set: lease id -> expiry time. Its size is the scope's in-flight
    count; expired leases (crashed workers) are dropped before every decision.
``S`` state
    hash. Bookkeeping: ``next`` (earliest next send), ``last`` (last send) and
    ``factor`` (its jitter factor), ``turn`` (the latest wake-up handed to a
    waiting worker). What the controllers produced (written only by a
    version check, see :data:`RELEASE` and :data:`SYNC`): ``ver``, ``ctl``
    (their states, JSON), ``fp`` (the fingerprint of the policy they ran
    with) and the effective limits ``delay``, ``conc`` (0 = unlimited),
    ``blk`` (blocked until), ``jl``/``jh`` (jitter) and ``due`` (the earliest
    time a send must run the controllers' ``on_send``).
``T`` slot times
    sorted set: lease id -> send time of free concurrency slots that sent
    before (for ``slot_delay``).
``Q`` quota log
    sorted set: lease id -> send time, for the quota window.
``C`` quota costs
    hash: lease id -> cost, and ``=`` -> the sum of the live costs.
``W`` waiters flag
    a string that exists while some worker waits for a release; releases
    publish the scope's name on the backend's channel only then.
``X:<lease id>`` tombstone
    set for a minute when a caller gives up on an acquire call whose reply it
    never saw; the call, should it still arrive, then grants nothing.

A scope's policy travels as one MessagePack array (``PolicyArgs.wire`` in
:mod:`._redis_state`; ``cmsgpack`` reads it in a fraction of the time text
takes to split): the fingerprint, then the limits its fresh controllers give
(used while the scope has no stored state), its slot delay, quota and window.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any, NamedTuple

__all__ = [
    "ACQUIRE",
    "KEYS_PER_SCOPE",
    "PLAIN_RELEASE",
    "RELEASE",
    "RENEW",
    "STATE",
    "STATE_VALUES",
    "SYNC",
    "Granted",
    "Refused",
    "Released",
    "ScopeReading",
    "Stale",
    "decode_acquire",
    "decode_release",
    "decode_released",
    "decode_state",
    "decode_sync",
]

#: Keys per scope in ``KEYS`` (leases, state, slots, quota log, quota costs, waiters).
KEYS_PER_SCOPE = 6
#: Values per controller state in a reply (``controller_state`` in ``common.lua``).
STATE_VALUES = 7


def _lua(*names: str) -> str:
    """The files ``lua/<name>.lua``, one after the other: one script."""
    folder = resources.files(__package__).joinpath("lua")
    return "\n".join(folder.joinpath(f"{name}.lua").read_text("utf-8") for name in names)


#: Take a lease on every scope at once (``acquire.lua``; :func:`decode_acquire`).
ACQUIRE = _lua("base", "common", "acquire")
#: Store the controllers' state after a send (``sync.lua``; :func:`decode_sync`).
SYNC = _lua("base", "common", "sync")
#: Hand a lease back with its feedback (``release.lua``; :func:`decode_release`).
RELEASE = _lua("base", "common", "release")
#: Hand back a lease without feedback, slot delay or quota (``plain_release.lua``;
#: :func:`decode_released`).
PLAIN_RELEASE = _lua("base", "plain_release")
#: Extend a lease (``renew.lua``): replies how many scopes still held it.
RENEW = _lua("base", "common", "renew")
#: Read one scope (``state.lua``; :func:`decode_state`).
STATE = _lua("base", "common", "state")


class Granted(NamedTuple):
    """``ACQUIRE`` granted: send after ``wait_ms`` (at ``send_at_ms``, Redis's clock).

    ``due``: the controller states (:data:`STATE_VALUES` each) of the scopes
    whose controllers must run ``on_send`` now; ``kept``: those of the
    scopes with stored state, or whose caller wants it (for the release).
    """

    wait_ms: float
    send_at_ms: float
    now_ms: float
    due: Sequence[Any]
    kept: Sequence[Any]


class Refused(NamedTuple):
    """``ACQUIRE`` refused, because of the scope at ``scope_index`` (0-based).

    ``reason``: 1 its concurrency is full, 2 time (delay, slot delay, quota,
    a server block), 3 the lease was handed back already, 4 the exact send
    time of a part had passed. ``turn``: the turn Redis gave (0: none).
    ``closed``: when that scope reopens (seconds from now, slot delays
    aside), why (cause 1 a server block, 2 its quota, 3 its delay) and its
    delay (seconds); None unless it waits for time.
    """

    wait_ms: float
    scope_index: int
    reason: int
    now_ms: float
    turn: Any
    closed: tuple[float, int, float] | None


def decode_acquire(reply: Any) -> Granted | Refused:
    """The reply of :data:`ACQUIRE`."""
    if type(reply) is bytes:  # a grant: one string (the cheapest reply to read)
        if b"\n" not in reply:
            wait, send_at, now = reply.split(b",")[1:4]
            return Granted(float(wait), float(send_at), float(now), (), ())
        values = reply.split(b"\n")
        due = int(values[4]) * STATE_VALUES
        return Granted(
            float(values[1]),
            float(values[2]),
            float(values[3]),
            values[5 : 5 + due],
            values[5 + due :],
        )
    closed = None
    if len(reply) > 8:
        closed = float(reply[6]) / 1000.0, int(reply[7]), float(reply[8])
    return Refused(
        float(reply[1]),
        int(reply[2]) - 1,
        int(reply[3]),
        float(reply[4]),
        reply[5] if len(reply) > 5 else 0.0,
        closed,
    )


class Released(NamedTuple):
    """``RELEASE`` or ``PLAIN_RELEASE`` released: ``found`` scopes still held the lease."""

    now_ms: float
    found: int


class Stale(NamedTuple):
    """``RELEASE`` stored no write: run the controllers on ``states`` and call again.

    ``found`` is ``None`` when it released nothing either; else it released
    the lease (a feedback that announces no limit), as :class:`Released` says.
    """

    now_ms: float
    states: Sequence[Any]
    found: int | None = None


def decode_released(reply: Any) -> Released:
    """The reply of :data:`PLAIN_RELEASE` (and of a :data:`RELEASE` that released)."""
    _, now, found = reply.split(b",")
    return Released(float(now), int(found))


def decode_release(reply: Any) -> Released | Stale:
    """The reply of :data:`RELEASE`."""
    if type(reply) is bytes:
        return decode_released(reply)
    if reply[0] == 2:  # (released at once: see the script)
        return Stale(float(reply[1]), reply[3:], int(reply[2]))
    return Stale(float(reply[1]), reply[2:])


def decode_sync(reply: Any) -> Sequence[Any]:
    """The reply of :data:`SYNC`: the states of the scopes whose version had moved."""
    return list(reply[1:])


class ScopeReading(NamedTuple):
    """The reply of :data:`STATE`: a scope as it is now (times in ms, Redis's clock)."""

    now_ms: float
    in_flight: int
    next_ms: float
    quota_used: float
    controllers: Sequence[Any]
    blocked_ms: float


def decode_state(reply: Any) -> ScopeReading:
    """The reply of :data:`STATE`."""
    return ScopeReading(
        float(reply[0]),
        int(reply[1]),
        float(reply[2]),
        float(reply[3]),
        reply[4 : 4 + STATE_VALUES],
        float(reply[4 + STATE_VALUES]),
    )
