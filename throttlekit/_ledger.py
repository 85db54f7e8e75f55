"""The live state of one throttling scope (sans-IO)."""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from . import _pauses
from ._backoff import Backoff, BackoffState
from ._errors import ScopeStalled
from ._policy import ScopePolicy

_DEFAULT_BACKOFF = Backoff()

if TYPE_CHECKING:
    from ._controller import Controller, Feedback

__all__ = [
    "STALL_BLOCKED",
    "STALL_DELAY",
    "STALL_QUOTA",
    "EffectiveLimits",
    "QuotaEntry",
    "ScopeLedger",
    "build_controllers",
    "combine",
    "describe",
    "scope_stalled",
    "with_feedback_controllers",
]

INF = math.inf
# One object for every ledger's "never" (a new float per ledger would be one more
# object to read from memory per acquire when many scopes take turns).
NEVER = -INF
# A ledger's listed_at when it is not in the scheduler's heap of idle scopes: this
# very object, tested by identity (reading a listed ledger's own key, a float
# elsewhere in memory, would be one more miss per release when many scopes take turns).
UNLISTED = INF
_EPSILON = 1e-9
_NO_JITTER = (0.0, 0.0)


def build_controllers(policy: ScopePolicy) -> tuple[Controller, ...]:
    """The controllers a policy asks for, in order: rampup, adaptive, backoff, AutoThrottle, custom.

    Plain backoff (without rampup) is left out: it does nothing until the first
    signal or rate-limit header, so :func:`with_feedback_controllers` adds it
    then. That keeps idle scopes small and the grant path short.
    """
    controllers: list[Controller] = []
    backoff = policy.backoff
    if policy.rampup is not None:
        controllers.append(policy.rampup.controller(policy, backoff or _DEFAULT_BACKOFF))
    if policy.adaptive is not None:
        controllers.append(policy.adaptive.controller(policy))
    if backoff is not None and (policy.rampup is not None or policy.adaptive is not None):
        # Rampup or Adaptive steps the scope; backoff only honours the headers.
        knock = policy.adaptive is not None  # Adaptive learns how late a framework's reset is
        controllers.append(attrs.evolve(backoff, headers_only=True, knock=knock).controller(policy))
    if policy.autothrottle is not None:
        controllers.append(policy.autothrottle.controller(policy))
    controllers.extend(factory(policy) for factory in policy.controllers)
    return tuple(controllers)


def with_feedback_controllers(
    policy: ScopePolicy, controllers: tuple[Controller, ...], feedback: Feedback
) -> tuple[Controller, ...]:
    """``controllers``, with the policy's backoff added on the first feedback that needs it."""
    backoff = policy.backoff
    if backoff is None or policy.rampup is not None or policy.adaptive is not None:
        return controllers
    info = feedback.rate_limit
    asks_to_wait = info is not None and (info.wait() is not None or info.pace() is not None)
    if not (asks_to_wait or backoff.is_signal(feedback)):
        return controllers
    if any(isinstance(controller, BackoffState) for controller in controllers):
        return controllers
    return (backoff.controller(policy), *controllers)


#: ``(delay, concurrency, blocked_until, jitter)`` in force for a scope.
EffectiveLimits = tuple[float, "int | None", float, "tuple[float, float]"]


def combine(policy: ScopePolicy, controllers: Sequence[Controller]) -> EffectiveLimits:
    """The effective ``(delay, concurrency, blocked_until, jitter)`` of a scope.

    A controller with ``replaces_policy`` (rampup) sets the base delay and
    concurrency instead of the policy; then the effective delay is the
    largest any controller asks for, the concurrency the smallest (at least
    1), the scope is blocked until the latest ``blocked_until``, and the
    last controller with a ``jitter`` replaces the policy's.
    """
    delay = policy.delay
    concurrency = policy.concurrency
    blocked = NEVER
    jitter = policy.jitter
    for controller in controllers:
        if controller.replaces_policy:
            delay = controller.delay
            concurrency = controller.concurrency
    for controller in controllers:
        override = controller.jitter
        if override is not None:
            jitter = override
        if controller.delay > delay:
            delay = controller.delay
        limit = controller.concurrency
        if limit is not None:
            concurrency = limit if concurrency is None else min(concurrency, limit)
        if controller.blocked_until > blocked:
            blocked = controller.blocked_until
    if concurrency is not None:
        concurrency = max(1, concurrency)
    return delay, concurrency, blocked, jitter


def describe(policy: ScopePolicy, controllers: Sequence[Controller], delay: float) -> str:
    """Why a scope's effective delay is ``delay``, in words (the last controller that sets it)."""
    best = ""
    for controller in controllers:
        if controller.delay >= delay and controller.delay > 0:
            best = controller.reason or type(controller).__name__
    if best:
        return best
    return "policy" if delay else "policy (no delay)"


#: Why a scope cannot send for a while: a server block, its quota, its delay.
STALL_BLOCKED, STALL_QUOTA, STALL_DELAY = 1, 2, 3


def scope_stalled(
    name: str, policy: ScopePolicy, cause: int, delay: float, reopens_at: float, now: float
) -> ScopeStalled | None:
    """The :class:`ScopeStalled` error of scope ``name`` if it reopens (at
    ``reopens_at``, because of ``cause``) later than its policy's ``max_stall``."""
    limit = policy.max_stall
    if limit is None or reopens_at - now <= limit:
        return None
    if cause == STALL_BLOCKED:
        reason = "the server asked to wait (Retry-After or a rate-limit reset)"
    elif cause == STALL_QUOTA:
        reason = f"its quota of {policy.quota:g} per {policy.window:g} s is used up"
    else:
        reason = f"its delay between sends is {delay:g} s"
    return ScopeStalled(name, reason, reopens_at, reopens_at - now, limit)


class QuotaEntry:
    """One send's share of a quota window: when it was sent and what it cost."""

    __slots__ = ("alive", "cost", "sent_at")

    def __init__(self, sent_at: float, cost: float) -> None:
        self.sent_at = sent_at
        self.cost = cost
        self.alive = True

    def __repr__(self) -> str:
        return f"QuotaEntry(sent_at={self.sent_at!r}, cost={self.cost!r}, alive={self.alive})"


class ScopeLedger:
    """A scope's live state: what is in flight, when it last sent, what its quota holds.

    The ledger is synchronous: every method takes the current time ``now``.
    The effective limits (``delay``, ``concurrency``, ``blocked_until``) start
    from the policy and are moved by the scope's controllers; :meth:`refresh`
    recomputes them after feedback.
    """

    # CPython lays slots out in alphabetical order: the fields the fast path reads
    # (concurrency to plain) lie in the object's first 120 bytes, two cache
    # lines as a rule, so a scope that is cold in the CPU caches costs few misses.
    # A new field named within that range lengthens the fast path's reach.
    __slots__ = (
        "blocked_until",
        "concurrency",
        "controllers",
        "delay",
        "dirty",
        "factor",
        "in_flight",
        "in_line",
        "jitter",
        "listed_at",
        "name",
        "next_send_at",
        "plain",
        "policy",
        "queue",
        "quota_log",
        "quota_used",
        "slot_times",
        "timer_at",
    )

    #: The ledger counts its own requests in flight (see :class:`ScopeView`).
    in_flight_exact = True

    def __init__(self, name: str, policy: ScopePolicy) -> None:
        self.name = name
        self.policy = policy
        self.in_flight = 0
        # Requests waiting that need this scope (queued here or on another of
        # their scopes): the fast path grants and releases only while it is 0.
        self.in_line = 0
        self.next_send_at = NEVER
        self.factor = 1.0  # the jitter factor drawn at the last send
        # Send times of free concurrency slots that have been used (a min-heap);
        # free slots beyond these have never sent and are ready at once.
        self.slot_times: list[float] | None = None
        self.quota_log: deque[QuotaEntry] | None = None
        self.quota_used = 0.0
        # Waiters currently blocked on this scope: a heap of (-priority, seq, ticket).
        self.queue: list[tuple[int, int, Any]] | None = None  # (-priority, seq, Ticket)
        self.timer_at = INF
        self.dirty = False
        # Its key in the scheduler's heap of idle scopes (see evictable_at), or
        # UNLISTED when it is not listed there. A listed ledger that became busy,
        # or was used again, is re-examined lazily when it reaches the heap's top.
        self.listed_at = UNLISTED
        self.controllers = build_controllers(policy)
        self.delay = policy.delay
        self.jitter = policy.jitter
        self.concurrency = policy.concurrency
        self.blocked_until = NEVER
        if self.controllers:
            self.refresh()
        else:
            self._update_plain()

    def __repr__(self) -> str:
        return (
            f"<ScopeLedger {self.name!r} in_flight={self.in_flight}/{self.concurrency} "
            f"in_line={self.in_line} delay={self.delay:g} next_send_at={self.next_send_at:g} "
            f"quota_used={self.quota_used:g}/{self.policy.quota}>"
        )

    def __lt__(self, other: ScopeLedger) -> bool:
        """Order in the scheduler's heap of idle scopes: by ``listed_at``."""
        return self.listed_at < other.listed_at

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing waiting."""
        return not (self.in_flight or self.in_line)

    def evictable_at(self) -> float:
        """When forgetting this scope stops mattering: its last send, delay, quota window,
        slot delays and server block have all run out (``-inf`` if it never sent).

        An idle scope evicted before then would come back as a fresh ledger and
        could send early.
        """
        at = self.next_send_at
        if self.blocked_until > at:
            at = self.blocked_until
        log = self.quota_log
        if log:
            end = log[-1].sent_at + self.policy.window
            if end > at:
                at = end
        slots = self.slot_times
        if slots:
            end = max(slots) + self.policy.slot_delay
            if end > at:
                at = end
        return at

    @property
    def last_send(self) -> float:
        """When the scope last sent (``-inf`` if never): its next send time less the delay."""
        return self.next_send_at - self.delay * self.factor

    def refresh(self) -> None:
        """Recompute the effective limits from the policy and controllers (:func:`combine`)."""
        delay, self.concurrency, self.blocked_until, self.jitter = combine(
            self.policy, self.controllers
        )
        if delay != self.delay and self.next_send_at > -INF:
            # A new delay applies from the last send, with the jitter drawn then.
            self.next_send_at += (delay - self.delay) * self.factor
        self.delay = delay
        self._update_plain()

    def _update_plain(self) -> None:
        """Whether only concurrency and delay bind it (the fast path applies).

        A server block comes from controllers, so a scope without them is never
        blocked; the last condition says so where the fast path relies on it
        (it does not look at ``blocked_until``).
        """
        policy = self.policy
        self.plain = (
            not self.controllers
            and policy.quota is None
            and not policy.slot_delay
            and self.jitter == _NO_JITTER
            and self.blocked_until == NEVER
        )

    def on_feedback(self, feedback: Feedback, now: float) -> None:
        """Pass a response's feedback to the controllers (creating backoff on its first use)."""
        controllers = with_feedback_controllers(self.policy, self.controllers, feedback)
        if controllers:
            self.controllers = controllers
            for controller in controllers:
                controller.on_feedback(self, feedback, now)
            self.refresh()

    def set_policy(self, policy: ScopePolicy) -> None:
        """Switch to ``policy``; controllers are rebuilt only if their configuration changed."""
        old = self.policy
        self.policy = policy
        if (old.backoff, old.autothrottle, old.rampup, old.adaptive, old.controllers) != (
            policy.backoff,
            policy.autothrottle,
            policy.rampup,
            policy.adaptive,
            policy.controllers,
        ):
            self.controllers = build_controllers(policy)
        self.refresh()

    def reason(self, now: float) -> str:
        """Why the scope's effective delay (or block) is what it is, in words."""
        if self.blocked_until > now:
            return f"blocked by the server for {self.blocked_until - now:.3g} s more"
        return describe(self.policy, self.controllers, self.delay)

    # -- admission -----------------------------------------------------------------

    def ready_at(self, cost: float, now: float) -> float:
        """Earliest time this scope could send a request of ``cost``.

        ``inf`` means not before a release (concurrency is full); a value
        ``<= now`` means it could send now.
        """
        concurrency = self.concurrency
        if concurrency is not None and self.in_flight >= concurrency:
            return INF
        ready = self._paced_at()
        if self.blocked_until > ready:
            ready = self.blocked_until
        slots = self.slot_times
        if slots and concurrency is not None and len(slots) >= concurrency - self.in_flight:
            slot_ready = slots[0] + self.policy.slot_delay
            if slot_ready > ready:
                ready = slot_ready
        if self.policy.quota is not None and cost > 0.0:
            quota_ready = self._quota_ready(cost, now)
            if quota_ready > ready:
                ready = quota_ready
        return ready

    def reopens_at(self, cost: float, now: float) -> float:
        """When the scope could send a request of ``cost`` again as far as time goes.

        Its delay, a server block and its quota count; concurrency (freed by
        a release at any moment) and slot delays do not, unlike :meth:`ready_at`.
        """
        ready = self._paced_at()
        if self.blocked_until > ready:
            ready = self.blocked_until
        if self.policy.quota is not None and cost > 0.0:
            quota_ready = self._quota_ready(cost, now)
            if quota_ready > ready:
                ready = quota_ready
        return ready

    def _paced_at(self) -> float:
        """When the delay lets the next request go: from the last send, or, where a pause
        of this process held that send, from the pause's end (:func:`_pauses.left_by`).

        A controlled scope paces a server's limit: sent bunched with the next
        one, the held send can be refused a window later (see ``Feedback.paused``).
        """
        at = self.next_send_at
        if self.controllers and self.delay and at > -INF:
            last = self.last_send
            at += _pauses.left_by(last) - last
        return at

    def stalled(self, cost: float, now: float) -> ScopeStalled | None:
        """The :class:`ScopeStalled` error of a request of ``cost`` that would wait for
        this scope to reopen longer than its policy's ``max_stall``, else ``None``."""
        limit = self.policy.max_stall
        if limit is None:
            return None
        ready = self.reopens_at(cost, now)
        if ready - now <= limit:
            return None
        if self.blocked_until >= ready:
            cause = STALL_BLOCKED
        elif self.policy.quota is not None and self.next_send_at < ready:
            cause = STALL_QUOTA
        else:
            cause = STALL_DELAY
        return scope_stalled(self.name, self.policy, cause, self.delay, ready, now)

    def expire(self, now: float) -> None:
        """Drop quota entries whose window has passed."""
        log = self.quota_log
        if not log:
            return
        window = self.policy.window
        while log and log[0].sent_at + window <= now:
            entry = log.popleft()
            entry.alive = False
            self.quota_used -= entry.cost
        if not log:
            self.quota_used = 0.0

    def _quota_ready(self, cost: float, now: float) -> float:
        quota = self.policy.quota
        assert quota is not None
        self.expire(now)
        excess = self.quota_used + cost - quota
        if excess <= _EPSILON:
            return -INF
        freed = 0.0
        window = self.policy.window
        for entry in self.quota_log or ():
            freed += entry.cost
            if freed >= excess - _EPSILON:
                return entry.sent_at + window
        return INF

    # -- state changes -------------------------------------------------------------

    def grant(self, cost: float, now: float, rng: random.Random) -> QuotaEntry | None:
        """Take one concurrency slot, the delay and ``cost`` of quota at ``now``."""
        self.in_flight += 1
        low, high = self.jitter
        if low != high:
            self.factor = 1.0 + rng.uniform(low, high)
        elif low:
            self.factor = 1.0 + low
        else:
            self.factor = 1.0  # the shared constant: no new float per send
        self.next_send_at = now + self.delay * self.factor
        slots = self.slot_times
        if (
            slots
            and self.concurrency is not None
            and len(slots) >= self.concurrency - (self.in_flight - 1)
        ):
            heapq.heappop(slots)
        changed = False
        for controller in self.controllers:
            if now >= controller.due and controller.on_send(self, now):
                changed = True
        if changed:
            self.refresh()
        if self.policy.quota is None:
            return None
        entry = QuotaEntry(now, cost)
        if self.quota_log is None:
            self.quota_log = deque()
        self.quota_log.append(entry)
        self.quota_used += cost
        return entry

    def release(self, sent_at: float) -> None:
        """Give back a concurrency slot whose request was sent at ``sent_at``."""
        self.in_flight -= 1
        if self.policy.slot_delay > 0.0 and self.concurrency is not None:
            slots = self.slot_times
            if slots is None:
                slots = self.slot_times = []
            heapq.heappush(slots, sent_at)
            free = max(0, self.concurrency - self.in_flight)
            while len(slots) > free:
                heapq.heappop(slots)

    def reconcile(self, entry: QuotaEntry, actual: float) -> None:
        """Correct a send's quota usage to what it really cost."""
        if entry.alive:
            self.quota_used += actual - entry.cost
        entry.cost = actual

    @property
    def quota_left(self) -> float | None:
        quota = self.policy.quota
        return None if quota is None else max(0.0, quota - self.quota_used)
