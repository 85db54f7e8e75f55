"""The sans-IO scheduler: which waiting request may be sent, and when to look again.

Every request waits on at most one thing at a time: the first scope (or the
global cap) that does not admit it. When that scope has room, the request moves
on to check its other scopes; it is granted only when all of them and the
global cap admit it at once. Nothing is held while waiting, so there is no
deadlock, and a request stuck on scope B never sits in scope A's queue.

Within one queue, requests are ordered by priority then arrival (FIFO). A
scope admits a request only if it has room for that request's cost *and* no
earlier request is queued on it, so a large request at the head of a scarce
quota is not overtaken by small ones.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, Final

from ._controller import Feedback
from ._ledger import UNLISTED, QuotaEntry, ScopeLedger
from ._policy import ScopePolicy

__all__ = ["GlobalGate", "Scheduler", "Ticket"]

INF: Final = math.inf

WAITING: Final = 0
GRANTED: Final = 1
RELEASED: Final = 2
CANCELLED: Final = 3
_STATE_NAMES: Final = ("waiting", "granted", "released", "cancelled")

_QueueEntry = tuple[int, int, "Ticket"]
#: Most ledgers one eviction sweep looks at (each is O(log n) in the idle heap).
_EVICT_LOOKS: Final = 8


class GlobalGate:
    """The limiter-wide concurrency cap, with its queue of waiters."""

    __slots__ = ("dirty", "in_flight", "limit", "queue")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_flight = 0
        self.queue: list[_QueueEntry] = []
        self.dirty = False

    def __repr__(self) -> str:
        return f"<GlobalGate in_flight={self.in_flight}/{self.limit} queued={len(self.queue)}>"


class Ticket:
    """One request's claim: waiting, then granted, then released.

    ``ledgers`` and ``costs`` are parallel tuples (one entry per scope).
    ``gated`` is ``False`` for a ticket that takes no slot of the global cap
    (a nested acquire, whose enclosing permit holds one).
    """

    __slots__ = (
        "costs",
        "gated",
        "granted_at",
        "ledgers",
        "priority",
        "queue",
        "quota_entries",
        "seq",
        "state",
        "waker",
    )

    def __init__(
        self,
        ledgers: tuple[ScopeLedger, ...],
        costs: tuple[float, ...],
        priority: int,
        seq: int,
        gated: bool = True,
    ) -> None:
        self.ledgers = ledgers
        self.costs = costs
        self.gated = gated
        self.priority = priority
        self.seq = seq
        self.state = WAITING
        self.queue: ScopeLedger | GlobalGate | None = None
        self.granted_at = -INF
        self.quota_entries: tuple[QuotaEntry | None, ...] = ()
        self.waker: Any = None  # the driver's wake-up handle (an event)

    def __repr__(self) -> str:
        scopes = ", ".join(ledger.name for ledger in self.ledgers)
        return (
            f"<Ticket #{self.seq} [{scopes}] priority={self.priority} {_STATE_NAMES[self.state]}>"
        )

    @property
    def scopes(self) -> dict[str, float]:
        return {ledger.name: cost for ledger, cost in zip(self.ledgers, self.costs, strict=False)}


def _before(first: Ticket, second: Ticket) -> bool:
    """Whether ``first`` goes before ``second``: higher priority, then earlier arrival."""
    return first.priority > second.priority or (
        first.priority == second.priority and first.seq < second.seq
    )


def _head(queue: list[_QueueEntry] | None, owner: object) -> Ticket | None:
    """The first live ticket in ``queue``, dropping cancelled entries."""
    while queue:
        ticket = queue[0][2]
        if ticket.state == WAITING and ticket.queue is owner:
            return ticket
        heapq.heappop(queue)
    return None


class Scheduler:
    """Decides which requests may be sent, given the time; never sleeps or reads a clock.

    :param policies: explicit policies by scope name.
    :param default: the policy of every other scope.
    :param concurrency: the global cap on requests in flight (``None`` = unlimited).
    :param max_scopes: most scopes kept; above it, the longest-idle scopes are evicted.
    :param max_idle: seconds after which an idle scope may be evicted (its learned
        state is lost then, so keep it well above ordinary gaps between requests).
    :param rng: the random source for jitter (seed it for reproducible runs).
    """

    def __init__(
        self,
        *,
        policies: Mapping[str, ScopePolicy] | None = None,
        default: ScopePolicy | None = None,
        concurrency: int | None = 16,
        max_scopes: int = 100_000,
        max_idle: float = 3600.0,
        rng: random.Random | None = None,
    ) -> None:
        self.policies: dict[str, ScopePolicy] = dict(policies or {})
        self.default = default if default is not None else ScopePolicy()
        self.gate = GlobalGate(concurrency)
        self.max_scopes = max_scopes
        self.max_idle = max_idle
        self.rng = rng if rng is not None else random.Random()
        self.scopes: dict[str, ScopeLedger] = {}
        self.waiting = 0
        self._idle: list[ScopeLedger] = []  # a heap of idle scopes (see _evict)
        #: Ledgers the eviction has looked at so far (an operation count, for tests).
        self.looked = 0
        self._timers: list[tuple[float, int, ScopeLedger]] = []
        self._dirty: deque[ScopeLedger | GlobalGate] = deque()
        self._seq = itertools.count()

    def __repr__(self) -> str:
        return (
            f"<Scheduler scopes={len(self.scopes)} in_flight={self.gate.in_flight}/"
            f"{self.gate.limit} waiting={self.waiting} next_wake={self.next_wake():g}>"
        )

    # -- scopes --------------------------------------------------------------------

    def policy_for(self, name: str) -> ScopePolicy:
        return self.policies.get(name, self.default)

    def set_policy(self, name: str, policy: ScopePolicy) -> None:
        """Give scope ``name`` a new policy; its live counters are kept."""
        self.policies[name] = policy
        ledger = self.scopes.get(name)
        if ledger is not None:
            ledger.set_policy(policy)
            self._mark(ledger)

    def _list(self, ledger: ScopeLedger, key: float) -> None:
        ledger.listed_at = key
        heapq.heappush(self._idle, ledger)

    def _settle(self, ledger: ScopeLedger) -> None:
        """List ``ledger`` among the idle scopes if it just became idle and is not listed."""
        if ledger.listed_at is UNLISTED and not (ledger.in_flight or ledger.in_line):
            self._list(ledger, ledger.evictable_at())

    def _evict(self, now: float, room: int) -> None:
        """Drop idle scopes unused for ``max_idle``, and make ``room`` for new scopes
        below ``max_scopes``, taking the scopes that could be forgotten earliest first.

        The idle scopes are a heap keyed by :meth:`ScopeLedger.evictable_at`
        when they were listed: a scope whose delay, quota window or server
        block still binds comes up only once that has run out (dropping it
        earlier would let its next request out early). A key that went stale
        (the scope was used or became busy since) is fixed when it reaches the
        top; at most ``_EVICT_LOOKS`` ledgers are looked at per call, so one new
        scope costs O(log n) even then (the cap catches up over the next calls).
        """
        heap = self._idle
        scopes = self.scopes
        limit = self.max_scopes - room
        horizon = now - self.max_idle
        for _ in range(_EVICT_LOOKS):
            if not heap:
                return
            ledger = heap[0]
            if ledger.listed_at > now:
                return  # every listed scope still binds (or was used since it was listed)
            self.looked += 1
            if ledger.in_flight or ledger.in_line:  # busy: relisted when idle again
                heapq.heappop(heap)
                ledger.listed_at = UNLISTED
                continue
            key = ledger.evictable_at()
            if key > ledger.listed_at:  # used since, or still bound: move it to its place
                ledger.listed_at = key
                heapq.heapreplace(heap, ledger)
                continue
            if len(scopes) <= limit and ledger.last_send > horizon:
                return  # under the cap, and the least recently used was used recently
            heapq.heappop(heap)
            ledger.listed_at = UNLISTED
            del scopes[ledger.name]
            # Never granted from again, even if a cache (the limiter's URL to
            # ledger map) still holds it: the fast path takes plain ledgers
            # only, and feedback makes no ledger plain (it adds controllers).
            ledger.plain = False

    def iter_scopes(self) -> Iterator[ScopeLedger]:
        return iter(self.scopes.values())

    # -- requests ------------------------------------------------------------------

    def make_ticket(
        self, costs: Mapping[str, float], priority: int, now: float, gated: bool = True
    ) -> Ticket:
        """Validate ``costs`` and build a ticket for them (not queued yet).

        New scopes get their ledgers here; they are listed among the idle
        scopes (eligible for eviction) when their first request is done.
        ``gated=False`` makes a ticket that takes no slot of the global cap.
        """
        scopes = self.scopes
        missing = 0
        for name, cost in costs.items():
            ledger = scopes.get(name)
            quota = (self.policy_for(name) if ledger is None else ledger.policy).quota
            if quota is not None and cost > quota:
                raise ValueError(
                    f"cost {cost!r} for scope {name!r} exceeds its quota {quota!r}; "
                    "it could never be sent"
                )
            if ledger is None:
                missing += 1
        if missing:
            # Before any ledger of this ticket is looked up, so none of them is evicted.
            self._evict(now, missing)
        ledgers = []
        for name in costs:
            ledger = scopes.get(name)
            if ledger is None:
                ledger = scopes[name] = ScopeLedger(name, self.policy_for(name))
            ledgers.append(ledger)
        return Ticket(tuple(ledgers), tuple(costs.values()), priority, next(self._seq), gated)

    def discard(self, ticket: Ticket) -> None:
        """Forget a ticket that was neither granted nor queued (its new scopes become idle)."""
        if ticket.state == WAITING and ticket.queue is None:
            ticket.state = CANCELLED
            for ledger in ticket.ledgers:
                self._settle(ledger)

    def try_grant(self, ticket: Ticket, now: float) -> bool:
        """Grant ``ticket`` now if every scope and the global cap admit it."""
        if self._blocker(ticket, now, None) is not None:
            return False
        self._grant(ticket, now, waiting=False)
        return True

    def enqueue(self, ticket: Ticket, now: float) -> bool:
        """Grant ``ticket`` now if possible, else queue it. Returns whether granted."""
        blocker = self._blocker(ticket, now, None)
        if blocker is None:
            self._grant(ticket, now, waiting=False)
            return True
        self.waiting += 1
        for ledger in ticket.ledgers:
            ledger.in_line += 1
        self._park(ticket, blocker)
        return False

    def cancel(self, ticket: Ticket, now: float) -> None:
        """Withdraw a waiting ticket, or hand back a grant that was never used."""
        if ticket.state == WAITING:
            ticket.state = CANCELLED
            self.waiting -= 1
            for ledger in ticket.ledgers:
                ledger.in_line -= 1
                self._settle(ledger)
            if ticket.queue is not None:
                self._mark(ticket.queue)
        elif ticket.state == GRANTED:
            for ledger, entry in zip(ticket.ledgers, ticket.quota_entries, strict=False):
                if entry is not None:
                    ledger.reconcile(entry, 0.0)
            self._release(ticket)
            ticket.state = CANCELLED

    def release(self, ticket: Ticket, now: float | None = None) -> bool:
        """The request of ``ticket`` is done: give back its concurrency.

        Needs no clock (``now`` is accepted for symmetry with the other calls):
        whatever this frees is granted by the next :meth:`dispatch`. Returns
        :attr:`pending`: whether that has work to do now.
        """
        if ticket.state == GRANTED:
            ticket.state = RELEASED
            self._release(ticket)
        return bool(self._dirty)

    def feedback(
        self,
        ticket: Ticket,
        feedback: Feedback,
        now: float,
        consumed: Mapping[str, float] | None = None,
    ) -> None:
        """Tell the scopes of ``ticket`` (or ``feedback.scopes`` of them) how its request went."""
        only = feedback.scopes
        for index, ledger in enumerate(ticket.ledgers):
            if consumed and ledger.name in consumed and index < len(ticket.quota_entries):
                entry = ticket.quota_entries[index]
                if entry is not None:
                    ledger.reconcile(entry, consumed[ledger.name])
            if only is not None and ledger.name not in only:
                continue
            ledger.on_feedback(feedback, now)
            if ledger.in_line:
                self._mark(ledger)

    # -- dispatch ------------------------------------------------------------------

    def dispatch(self, now: float) -> list[Ticket]:
        """Grant every request that may be sent at ``now``; return them."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, _, ledger = heapq.heappop(timers)
            if ledger.timer_at == at:
                ledger.timer_at = INF
                self._mark(ledger)
        granted: list[Ticket] = []
        dirty = self._dirty
        while dirty:
            owner = dirty.popleft()
            owner.dirty = False
            if isinstance(owner, GlobalGate):
                self._drain_gate(owner, now, granted)
            else:
                self._drain_scope(owner, now, granted)
        return granted

    @property
    def pending(self) -> bool:
        """Whether :meth:`dispatch` has work to do before the next timer."""
        return bool(self._dirty)

    def next_wake(self) -> float:
        """When :meth:`dispatch` should run next if nothing is released (``inf`` = never)."""
        timers = self._timers
        while timers:
            at, _, ledger = timers[0]
            if ledger.timer_at == at:
                return at
            heapq.heappop(timers)
        return INF

    # -- internals -----------------------------------------------------------------

    def _mark(self, owner: ScopeLedger | GlobalGate) -> None:
        if not owner.dirty:
            owner.dirty = True
            self._dirty.append(owner)

    def _arm(self, ledger: ScopeLedger, at: float) -> None:
        if at < ledger.timer_at:
            ledger.timer_at = at
            heapq.heappush(self._timers, (at, next(self._seq), ledger))

    def _blocker(
        self, ticket: Ticket, now: float, skip: ScopeLedger | None
    ) -> ScopeLedger | GlobalGate | None:
        """The first scope (or the global gate) that does not admit ``ticket`` now."""
        for ledger, cost in zip(ticket.ledgers, ticket.costs, strict=False):
            if ledger is skip:
                continue
            if ledger.queue:
                head = _head(ledger.queue, ledger)
                if head is not None and head is not ticket and _before(head, ticket):
                    return ledger
            if ledger.ready_at(cost, now) > now:
                return ledger
        gate = self.gate
        if gate.limit is not None and ticket.gated:
            if gate.in_flight >= gate.limit:
                return gate
            head = _head(gate.queue, gate)
            if head is not None and head is not ticket and _before(head, ticket):
                return gate
        return None

    def _park(self, ticket: Ticket, owner: ScopeLedger | GlobalGate) -> None:
        ticket.queue = owner
        if owner.queue is None:
            owner.queue = []
        heapq.heappush(owner.queue, (-ticket.priority, ticket.seq, ticket))
        self._mark(owner)

    def _grant(self, ticket: Ticket, now: float, *, waiting: bool = True) -> None:
        rng = self.rng
        entries = []
        for ledger, cost in zip(ticket.ledgers, ticket.costs, strict=False):
            entries.append(ledger.grant(cost, now, rng))
            if waiting:
                ledger.in_line -= 1
        if waiting:
            self.waiting -= 1
        ticket.quota_entries = tuple(entries)
        ticket.state = GRANTED
        ticket.queue = None
        ticket.granted_at = now
        if ticket.gated:
            self.gate.in_flight += 1

    def _release(self, ticket: Ticket) -> None:
        for ledger in ticket.ledgers:
            ledger.release(ticket.granted_at)
            if ledger.in_line:
                self._mark(ledger)
            elif not ledger.in_flight:
                self._settle(ledger)
        if ticket.gated:
            gate = self.gate
            gate.in_flight -= 1
            if gate.queue:
                self._mark(gate)

    def _drain_scope(self, ledger: ScopeLedger, now: float, granted: list[Ticket]) -> None:
        queue = ledger.queue
        gate = self.gate
        while True:
            ticket = _head(queue, ledger)
            if ticket is None:
                return
            assert queue is not None
            ledgers = ticket.ledgers
            single = len(ledgers) == 1
            cost = ticket.costs[0] if single else ticket.costs[ledgers.index(ledger)]
            ready = ledger.ready_at(cost, now)
            if ready > now:
                if ready < INF:
                    self._arm(ledger, ready)
                return
            # A one-scope ticket with no global cap has nothing else to ask.
            free = gate.limit is None or not ticket.gated
            blocker = None if single and free else self._blocker(ticket, now, ledger)
            heapq.heappop(queue)
            if blocker is None:
                self._grant(ticket, now)
                granted.append(ticket)
            else:
                self._park(ticket, blocker)

    def _drain_gate(self, gate: GlobalGate, now: float, granted: list[Ticket]) -> None:
        queue = gate.queue
        while gate.limit is None or gate.in_flight < gate.limit:
            ticket = _head(queue, gate)
            if ticket is None:
                return
            heapq.heappop(queue)
            blocker = self._blocker(ticket, now, None)
            if blocker is None:
                self._grant(ticket, now)
                granted.append(ticket)
            else:
                self._park(ticket, blocker)
