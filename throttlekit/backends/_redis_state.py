"""Controller state kept in Redis: the same Python controllers, run on the state read there.

Redis stores, per scope, the controllers' states (plain data, as JSON), a
version, and the effective limits they produce (:func:`~throttlekit._ledger.combine`);
the acquire script only reads those limits. When a send reaches the
controllers' ``due`` time, or feedback arrives, a process reads the stored
state, rebuilds the scope's controllers from its policy, restores their
states, runs ``on_send``/``on_feedback`` exactly as the in-memory ledger
does, and writes the result back if the version did not move meanwhile
(else it reruns them on the newer state: a step is never applied twice).

This module is sans-IO: it turns replies of the scripts into controllers and
controllers into script arguments; :mod:`throttlekit.backends.redis` does the
round trips. Times here are seconds on Redis's clock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .._backoff import BackoffState
from .._controller import ScopeSnapshot
from .._ledger import build_controllers, combine, describe, with_feedback_controllers
from .._stats import ScopeStatistics
from ._redis_scripts import STATE_VALUES, ScopeReading

if TYPE_CHECKING:
    from .._controller import Controller, Feedback
    from .._policy import ScopePolicy

__all__ = [
    "PolicyArgs",
    "StoredState",
    "Write",
    "feedback_write",
    "parse_states",
    "restore",
    "scope_statistics",
    "send_write",
]

logger = logging.getLogger("throttlekit.backends.redis")

INF = math.inf

#: Values per scope in the scripts' controller-state replies.
STATE_FIELDS = STATE_VALUES


def _num(value: float) -> str:
    """A number for the scripts (Lua reads no infinities: they become +-1e300)."""
    if value == INF:
        return "1e300"
    if value == -INF:
        return "-1e300"
    return repr(float(value))


def _kind(controller: object) -> str:
    cls = type(controller)
    return f"{cls.__module__}.{cls.__qualname__}"


def _name(factory: object) -> str:
    module = getattr(factory, "__module__", "?")
    return f"{module}.{getattr(factory, '__qualname__', type(factory).__qualname__)}"


def fingerprint(policy: ScopePolicy) -> str:
    """The same short text for equal policies in every process (their controllers too)."""
    values = []
    for field in attrs.fields(type(policy)):
        value = getattr(policy, field.name)
        if field.name == "controllers":
            value = [_name(factory) for factory in value]
        values.append((field.name, value))
    return hashlib.blake2b(repr(values).encode(), digest_size=8).hexdigest()


def _limits(fp: str, policy: ScopePolicy, controllers: Sequence[Controller]) -> str:
    """``fp,delay,conc,blk,jl,jh,due``: what ``controllers`` make of ``policy``."""
    delay, concurrency, blocked, (low, high) = combine(policy, controllers)
    due = min((controller.due for controller in controllers), default=INF)
    return ",".join(
        (fp, _num(delay), str(concurrency or 0), _num(blocked), _num(low), _num(high), _num(due))
    )


def _msgpack(values: Sequence[str]) -> bytes:
    """``[text, number, ...]`` as a MessagePack array (a str, then float64s)."""
    text = values[0].encode()
    if len(values) > 15 or len(text) > 31:
        raise ValueError("a packed policy is a short text and at most 14 numbers")
    numbers = b"".join(b"\xcb" + struct.pack(">d", float(value)) for value in values[1:])
    return bytes((0x90 | len(values), 0xA0 | len(text))) + text + numbers


@attrs.frozen
class PolicyArgs:
    """A policy as the scripts read it, computed once per policy object.

    :param policy: the policy.
    :param packed: ``fp,delay,conc,blk,jl,jh,due,slot,quota,window`` (seconds):
        the limits of fresh controllers, for a scope with no stored state.
    :param fp: its :func:`fingerprint`.
    :param controlled: whether the policy has controllers from the start
        (otherwise only a lazily added backoff may ever run).
    :param wire: ``packed`` as the scripts read it: a MessagePack array of
        the fingerprint and the numbers.
    :param encoded: ``wire`` as a RESP bulk string, ready for a command.
    :param booked: whether a release does bookkeeping with it (a slot delay
        or a quota); without feedback, a release needs the policy only then.
    """

    policy: ScopePolicy
    packed: str
    fp: str
    controlled: bool
    wire: bytes = b""
    encoded: bytes = b""
    booked: bool = True

    @classmethod
    def of(cls, policy: ScopePolicy) -> PolicyArgs:
        fp = fingerprint(policy)
        controllers = build_controllers(policy)
        quota = -1.0 if policy.quota is None else policy.quota
        packed = ",".join(
            (
                _limits(fp, policy, controllers),
                _num(policy.slot_delay),
                _num(quota),
                _num(policy.window),
            )
        )
        wire = _msgpack(packed.split(","))
        encoded = b"$%d\r\n%s\r\n" % (len(wire), wire)
        booked = policy.slot_delay > 0 or policy.quota is not None
        return cls(policy, packed, fp, bool(controllers), wire, encoded, booked)

    def wants(self, feedback: Feedback) -> int:
        """What a release must ask for: 2 = the controllers run, 1 = they run if stored."""
        if self.controlled or with_feedback_controllers(self.policy, (), feedback):
            return 2
        return 1


@attrs.frozen
class StoredState:
    """A scope's controller state as a script replied it."""

    index: int  # the scope's position in the request (0-based)
    in_flight: int
    version: int
    states: str
    delay: float
    concurrency: int | None
    fp: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_states(values: Sequence[Any]) -> list[StoredState]:
    """The controller states in a reply, :data:`STATE_FIELDS` values each."""
    found = []
    for at in range(0, len(values) - STATE_FIELDS + 1, STATE_FIELDS):
        index, in_flight, version, states, delay, concurrency, fp = values[at : at + STATE_FIELDS]
        found.append(
            StoredState(
                index=int(index) - 1,
                in_flight=int(in_flight),
                version=int(version),
                states=_text(states),
                delay=float(delay),
                concurrency=int(concurrency) or None,
                fp=_text(fp),
            )
        )
    return found


def restore(policy: ScopePolicy, states: str) -> tuple[Controller, ...]:
    """The controllers of ``policy`` with the ``states`` written by another run restored.

    States written by other controllers (another configuration) are ignored:
    the scope starts afresh with this policy's.
    """
    controllers = build_controllers(policy)
    if not states:
        return controllers
    saved = json.loads(states)
    if len(saved) == len(controllers) + 1 and policy.backoff is not None:
        # The backoff added on the first signal (with_feedback_controllers).
        controllers = (policy.backoff.controller(policy), *controllers)
    if [kind for kind, _ in saved] != [_kind(controller) for controller in controllers]:
        logger.debug("stored controller states %s do not fit this policy: starting afresh", saved)
        return build_controllers(policy)
    for controller, (_, state) in zip(controllers, saved, strict=True):
        controller.set_state(state)
    return controllers


def _encode(controllers: Sequence[Controller]) -> str:
    return json.dumps(
        [[_kind(controller), controller.get_state()] for controller in controllers],
        separators=(",", ":"),
    )


#: ``(version, limits, states)`` for a script: a version-checked write
#: (``limits == ""``: check the version only).
Write = tuple[str, str, str]


def _write(
    args: PolicyArgs, stored: StoredState, controllers: Sequence[Controller], before: str
) -> Write:
    states = _encode(controllers)
    if states == before and stored.fp == args.fp and stored.version:
        return (str(stored.version), "", "")  # nothing changed
    return (str(stored.version), _limits(args.fp, args.policy, controllers), states)


def _snapshot(scope: str, policy: ScopePolicy, stored: StoredState) -> ScopeSnapshot:
    return ScopeSnapshot(
        name=scope,
        policy=policy,
        delay=stored.delay,
        concurrency=stored.concurrency,
        in_flight=stored.in_flight,
        in_flight_exact=False,  # the count of leases, across processes
    )


def send_write(scope: str, args: PolicyArgs, stored: StoredState, now: float) -> Write | None:
    """Run the controllers' ``on_send`` for a send at ``now``; ``None`` if nothing changes."""
    controllers = restore(args.policy, stored.states)
    before = _encode(controllers) if stored.states else stored.states
    view = _snapshot(scope, args.policy, stored)
    for controller in controllers:
        if now >= controller.due:
            controller.on_send(view, now)
    write = _write(args, stored, controllers, before)
    return None if not write[1] else write


def feedback_write(
    scope: str,
    args: PolicyArgs,
    stored: StoredState,
    feedbacks: Sequence[tuple[Feedback, float]],
) -> Write:
    """Run the controllers' ``on_feedback`` on each ``(feedback, time)`` in turn.

    (Adding backoff on its first signal.) Several: feedback a process kept
    while other processes' writes moved the state (see ``Releases``).
    """
    controllers = restore(args.policy, stored.states)
    before = _encode(controllers) if stored.states else stored.states
    view = _snapshot(scope, args.policy, stored)
    for feedback, now in feedbacks:
        controllers = with_feedback_controllers(args.policy, controllers, feedback)
        for controller in controllers:
            controller.on_feedback(view, feedback, now)
    return _write(args, stored, controllers, before)


def scope_statistics(
    scope: str, policy: ScopePolicy, reading: ScopeReading, now: float, waiting: int
) -> ScopeStatistics:
    """A scope's statistics from a ``STATE`` reply, times on the limiter's clock ``now``."""
    redis_now = reading.now_ms / 1000.0
    (stored,) = parse_states(reading.controllers)
    controllers = restore(policy, stored.states)

    def local(seconds: float) -> float:
        return seconds if not math.isfinite(seconds) else now + seconds - redis_now

    level, signal, signal_at = 0, None, -INF
    for controller in controllers:
        if isinstance(controller, BackoffState):
            level, signal, signal_at = (
                controller.level,
                controller.last_signal,
                controller.last_signal_at,
            )
    blocked = reading.blocked_ms / 1000.0
    blocked_until = local(blocked) if blocked > 0 else -INF
    if blocked_until > now:
        reason = f"blocked by the server for {blocked_until - now:.3g} s more"
    else:
        reason = describe(policy, controllers, stored.delay)
    used = reading.quota_used
    quota = policy.quota
    next_send = reading.next_ms / 1000.0
    return ScopeStatistics(
        name=scope,
        delay=stored.delay,
        concurrency=stored.concurrency,
        in_flight=reading.in_flight,
        waiting=waiting,
        quota=quota,
        quota_used=used if quota is not None else 0.0,
        quota_left=None if quota is None else max(0.0, quota - used),
        blocked_until=blocked_until,
        next_send_at=local(next_send) if next_send > 0 else -INF,
        backoff_level=level,
        last_signal=signal,
        last_signal_at=local(signal_at),
        reason=reason,
    )
