"""Property tests of the sans-IO core: :class:`~throttlekit._scheduler.Scheduler` and its ledgers.

Everything here runs in virtual time: a small discrete-event loop feeds the
scheduler arrivals, releases and cancellations at exact instants, calls
``dispatch(now)`` and sleeps until ``next_wake()``. An independent model of
each scope (in flight, send times, slots, quota window) checks every grant
against the rules of DESIGN.md (invariants 1-5 and 7).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from throttlekit import BaseController, Feedback, ScopePolicy, ScopeView
from throttlekit._scheduler import CANCELLED, GRANTED, RELEASED, WAITING, Scheduler, Ticket

INF = math.inf
#: Tolerance for sums and differences of floats that the core computed another way.
EPS = 1e-9
QUOTA_EPS = 1e-6
SCOPES = ("a", "b", "c", "d", "e")  # "e" has no explicit policy: it uses the default

FAST = settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])


# -- strategies ------------------------------------------------------------------------------


@st.composite
def jitters(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["none", "factor", "pair"]))
    if kind == "none":
        return 0.0
    if kind == "factor":
        return draw(st.sampled_from([0.1, 0.5, 0.9]))
    low = draw(st.sampled_from([-0.9, -0.5, -0.1, 0.0, 0.3]))
    return (low, low + draw(st.sampled_from([0.0, 0.2, 1.0])))


@st.composite
def policies(draw: st.DrawFn) -> ScopePolicy:
    quota = draw(st.one_of(st.none(), st.sampled_from([1.0, 2.0, 3.5, 5.0])))
    return ScopePolicy(
        concurrency=draw(st.one_of(st.none(), st.integers(1, 4))),
        delay=draw(st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.7])),
        slot_delay=draw(st.sampled_from([0.0, 0.1, 0.3, 1.0])),
        jitter=draw(jitters()),
        quota=quota,
        window=draw(st.sampled_from([0.5, 1.0, 2.5])),
    )


@attrs.define
class Request:
    """One generated request: when it arrives, what it needs, and what happens to it."""

    arrival: float
    costs: dict[str, float]
    priority: int
    hold: float
    #: "send" (held ``hold`` s then released), "unused" (granted, then cancelled
    #: after ``hold`` s without being sent) or "abandon" (its waiter goes away
    #: ``patience`` s after arrival if not granted by then).
    fate: str
    patience: float


@st.composite
def traffic(draw: st.DrawFn, quotas: Mapping[str, float | None]) -> list[Request]:
    requests = []
    for _ in range(draw(st.integers(1, 28))):
        names = draw(st.lists(st.sampled_from(SCOPES), min_size=1, max_size=3, unique=True))
        costs = {}
        for name in names:
            cost = draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.0]))
            quota = quotas[name]
            costs[name] = cost if quota is None else min(cost, quota)
        requests.append(
            Request(
                arrival=draw(st.integers(0, 40)) * 0.05,
                costs=costs,
                priority=draw(st.sampled_from([0, 0, 0, 1, 2])),
                hold=draw(st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.5])),
                fate=draw(st.sampled_from(["send", "send", "send", "unused", "abandon"])),
                patience=draw(st.sampled_from([0.0, 0.1, 0.3, 1.0])),
            )
        )
    return requests


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    explicit = {name: draw(policies()) for name in SCOPES[:-1]}
    default = draw(policies())
    quotas = {name: explicit.get(name, default).quota for name in SCOPES}
    return {
        "policies": explicit,
        "default": default,
        "cap": draw(st.one_of(st.none(), st.integers(1, 5))),
        "requests": draw(traffic(quotas)),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "dispatch_each_event": draw(st.booleans()),
    }


# -- the model -------------------------------------------------------------------------------


class ScopeModel:
    """What the rules allow for one scope, rebuilt from observed grants and releases.

    Slots: a scope with concurrency ``n`` has ``n`` slots; each send takes a
    free slot whose previous send is at least ``slot_delay`` ago (or one that
    never sent). Any such slot stays usable forever after, so which one is
    taken does not matter; the model takes a never-used one first, else the
    one that sent longest ago. A granted request that is cancelled unused
    still marks its slot (the core does not refund slot or delay time).
    """

    def __init__(self, name: str, policy: ScopePolicy) -> None:
        self.name = name
        self.policy = policy
        self.in_flight = 0
        self.last_grant = -INF
        self.next_send = -INF  # observed from the ledger after each (jittered) grant
        self.free_slots: list[float] = []  # last-send times of free, used slots
        self.quota_log: list[list[float]] = []  # [sent_at, cost]; cost 0 once refunded
        self.grants: list[float] = []

    def quota_in_window(self, now: float) -> float:
        window = self.policy.window
        return sum(cost for sent_at, cost in self.quota_log if sent_at + window > now)

    def slot_ready(self, now: float) -> bool:
        policy = self.policy
        if policy.concurrency is None or policy.slot_delay <= 0.0:
            return True
        if len(self.free_slots) < policy.concurrency - self.in_flight:
            return True  # a slot that never sent
        return min(self.free_slots) + policy.slot_delay <= now

    def clearly_ready(self, cost: float, now: float) -> bool:
        """Whether the rules certainly let a request of ``cost`` through now."""
        policy = self.policy
        if policy.concurrency is not None and self.in_flight >= policy.concurrency:
            return False
        if now < self.next_send or not self.slot_ready(now):
            return False
        if policy.quota is not None and cost > 0.0:
            return self.quota_in_window(now) + cost <= policy.quota - QUOTA_EPS
        return True

    def check_grant(self, cost: float, now: float, where: str) -> None:
        policy = self.policy
        if policy.concurrency is not None:
            assert self.in_flight < policy.concurrency, f"{where}: concurrency exceeded"
        low, _high = policy.jitter
        min_gap = policy.delay * (1.0 + low)
        assert now - self.last_grant >= min_gap - EPS, (
            f"{where}: sends {self.last_grant} and {now} closer than {min_gap}"
        )
        assert now >= self.next_send - EPS, f"{where}: sent before next_send {self.next_send}"
        assert self.slot_ready(now), f"{where}: no slot free since slot_delay ({self.free_slots})"
        if policy.quota is not None and cost > 0.0:
            used = self.quota_in_window(now)
            assert used + cost <= policy.quota + QUOTA_EPS, (
                f"{where}: quota {policy.quota} exceeded ({used} + {cost}) in window"
            )

    def take(self, cost: float, now: float, next_send_at: float) -> list[float]:
        policy = self.policy
        low, high = policy.jitter
        if policy.delay > 0.0:
            drawn = next_send_at - now
            assert policy.delay * (1.0 + low) - EPS <= drawn <= policy.delay * (1.0 + high) + EPS
        self.next_send = next_send_at
        self.last_grant = now
        self.grants.append(now)
        if (
            policy.concurrency is not None
            and policy.slot_delay > 0.0
            and len(self.free_slots) >= policy.concurrency - self.in_flight
        ):
            self.free_slots.remove(min(self.free_slots))
        self.in_flight += 1
        entry = [now, cost]
        if policy.quota is not None:
            self.quota_log.append(entry)
        return entry

    def give_back(self, granted_at: float) -> None:
        self.in_flight -= 1
        if self.policy.concurrency is not None and self.policy.slot_delay > 0.0:
            self.free_slots.append(granted_at)


@attrs.define(eq=False)
class Tracked:
    """A request in flight through the simulation."""

    request: Request
    ticket: Ticket
    #: Positions in the sequence of everything that happened (enqueues, grants, cancels).
    enqueued: int
    granted: int | None = None
    abandoned: int | None = None
    quota_entries: list[list[float]] = attrs.field(factory=list)


class Simulation:
    """A discrete-event driver of one :class:`Scheduler`, checking every step."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        self.policies: dict[str, ScopePolicy] = scenario["policies"]
        self.default: ScopePolicy = scenario["default"]
        self.cap: int | None = scenario["cap"]
        self.requests: list[Request] = scenario["requests"]
        self.dispatch_each_event: bool = scenario["dispatch_each_event"]
        self.core = Scheduler(
            policies=self.policies,
            default=self.default,
            concurrency=self.cap,
            rng=random.Random(scenario["seed"]),
        )
        self.models = {
            name: ScopeModel(name, self.policies.get(name, self.default)) for name in SCOPES
        }
        self.now = 0.0
        self.happened = itertools.count()
        self.in_flight = 0
        self.tracked: list[Tracked] = []
        self.events: list[tuple[float, int, str, Tracked | int]] = []
        self.counter = itertools.count()

    def schedule(self, at: float, kind: str, what: Tracked | int) -> None:
        heapq.heappush(self.events, (at, next(self.counter), kind, what))

    # -- reacting to the core --------------------------------------------------------------

    def on_grant(self, item: Tracked) -> None:
        ticket, now = item.ticket, self.now
        where = f"t={now} {ticket!r}"
        assert ticket.state == GRANTED
        assert ticket.granted_at == now
        if self.cap is not None:
            assert self.in_flight < self.cap, f"{where}: global cap {self.cap} exceeded"
        for name, cost in item.request.costs.items():
            self.models[name].check_grant(cost, now, f"{where} scope {name!r}")
        for name, cost in item.request.costs.items():
            ledger = self.core.scopes[name]
            item.quota_entries.append(self.models[name].take(cost, now, ledger.next_send_at))
        self.in_flight += 1
        item.granted = next(self.happened)
        if item.request.fate == "unused":
            self.schedule(now + item.request.hold, "cancel-unused", item)
        else:
            self.schedule(now + item.request.hold, "release", item)

    def give_back(self, item: Tracked, *, refund: bool) -> None:
        for name, entry in zip(item.request.costs, item.quota_entries, strict=True):
            self.models[name].give_back(item.ticket.granted_at)
            if refund:
                entry[1] = 0.0
        self.in_flight -= 1

    def dispatch(self) -> None:
        for ticket in self.core.dispatch(self.now):
            self.on_grant(self.by_ticket[id(ticket)])
        self.check_after_dispatch()

    # -- checks ----------------------------------------------------------------------------

    def waiting(self) -> list[Tracked]:
        return [item for item in self.tracked if item.ticket.state == WAITING]

    def check_counters(self) -> None:
        core = self.core
        waiting = self.waiting()
        assert core.gate.in_flight == self.in_flight
        assert core.waiting == len(waiting)
        for name, model in self.models.items():
            ledger = core.scopes.get(name)
            if ledger is None:
                assert model.in_flight == 0
                continue
            # Invariant 1: a waiting request holds nothing; a granted one holds all its scopes.
            assert ledger.in_flight == model.in_flight, name
            assert ledger.in_line == sum(name in item.request.costs for item in waiting), name

    def check_after_dispatch(self) -> None:
        core, now = self.core, self.now
        assert not core.pending
        wake = core.next_wake()
        assert wake > now, f"next_wake() {wake} is not after now {now} right after dispatch"
        self.check_counters()
        if self.cap is not None and self.in_flight >= self.cap:
            return
        # Invariant 3 (no head-of-line blocking): a request waits only if one of its
        # scopes is not ready for it, or an earlier request is waiting for one of them.
        waiting = self.waiting()
        for item in waiting:
            costs = item.request.costs
            if not all(self.models[n].clearly_ready(c, now) for n, c in costs.items()):
                continue
            held_by = [
                other
                for other in waiting
                if _before(other.ticket, item.ticket)
                and any(
                    name in costs and not self.models[name].clearly_ready(cost, now)
                    for name, cost in other.request.costs.items()
                )
            ]
            assert held_by, (
                f"t={now}: {item.ticket!r} waits although every scope and the global cap "
                "admit it and no earlier request waits for them"
            )

    def check_order(self) -> None:
        """Invariant 4: among requests for one scope only, precedence decides grant order."""
        single: dict[str, list[Tracked]] = {}
        for item in self.tracked:
            if len(item.request.costs) == 1:
                single.setdefault(next(iter(item.request.costs)), []).append(item)
        for items in single.values():
            for first, second in itertools.permutations(items, 2):
                if second.granted is None or not _before(first.ticket, second.ticket):
                    continue
                if first.enqueued > second.granted:
                    continue  # ``first`` arrived after ``second`` was granted
                if first.abandoned is not None and first.abandoned < second.granted:
                    continue  # ``first`` was withdrawn before
                assert first.granted is not None, f"{first.ticket!r} was never granted"
                assert first.granted < second.granted, (
                    f"{second.ticket!r} granted before {first.ticket!r}, which precedes it"
                )

    def check_end(self) -> None:
        """Invariant 5 and liveness: everything granted or withdrawn, nothing leaked."""
        core = self.core
        for item in self.tracked:
            assert item.ticket.state in (RELEASED, CANCELLED), item.ticket
            if item.abandoned is None:
                assert item.granted is not None, f"{item.ticket!r} was never granted"
        assert core.gate.in_flight == 0
        assert core.waiting == 0
        assert core.next_wake() == INF
        for ledger in core.scopes.values():
            assert ledger.in_flight == 0, ledger
            assert ledger.in_line == 0, ledger
            assert not ledger.queue, f"{ledger!r} still queues {ledger.queue}"
            assert ledger.idle, ledger
        assert not core.gate.queue
        self.check_order()

    # -- the event loop --------------------------------------------------------------------

    def run(self) -> None:
        self.by_ticket: dict[int, Tracked] = {}
        for index, request in enumerate(self.requests):
            self.schedule(request.arrival, "arrive", index)
        for _ in range(2_000):  # settled runs need < 150 steps (at most 28 requests)
            wake = self.core.next_wake()
            at = self.events[0][0] if self.events else INF
            if at == INF and wake == INF:
                break
            self.now = now = min(at, wake)
            while self.events and self.events[0][0] == now:
                _, _, kind, what = heapq.heappop(self.events)
                self.handle(kind, what)
                if self.dispatch_each_event:
                    self.dispatch()
            self.dispatch()
        else:  # pragma: no cover - a livelock
            pytest.fail("the simulation did not settle")
        self.check_end()

    def handle(self, kind: str, what: Tracked | int) -> None:
        core, now = self.core, self.now
        if kind == "arrive":
            assert isinstance(what, int)
            request = self.requests[what]
            ticket = core.make_ticket(request.costs, request.priority, now)
            item = Tracked(request, ticket, next(self.happened))
            self.tracked.append(item)
            self.by_ticket[id(ticket)] = item
            if request.fate == "abandon":
                self.schedule(now + request.patience, "abandon", item)
            if core.enqueue(ticket, now):
                self.on_grant(item)
            return
        assert isinstance(what, Tracked)
        ticket = what.ticket
        if kind == "release":
            core.release(ticket, now)
            assert ticket.state == RELEASED
            self.give_back(what, refund=False)
        elif kind == "cancel-unused":
            core.cancel(ticket, now)
            assert ticket.state == CANCELLED
            self.give_back(what, refund=True)
        elif kind == "abandon" and ticket.state == WAITING:
            core.cancel(ticket, now)
            assert ticket.state == CANCELLED
            what.abandoned = next(self.happened)
        self.check_counters()


def _before(first: Ticket, second: Ticket) -> bool:
    return (first.priority, -first.seq) > (second.priority, -second.seq)


# -- property tests ----------------------------------------------------------------------------


@FAST
@given(scenarios())
def test_generated_traffic_keeps_every_invariant(scenario: dict[str, Any]) -> None:
    note(repr(scenario))
    Simulation(scenario).run()


@settings(deadline=None, max_examples=60)
@given(
    policy=policies(),
    arrivals=st.lists(st.integers(0, 20), min_size=1, max_size=30),
    seed=st.integers(0, 2**32 - 1),
)
def test_one_scope_sends_in_arrival_order(
    policy: ScopePolicy, arrivals: list[int], seed: int
) -> None:
    """Equal-priority requests for a single scope are granted first come, first served."""
    requests = [Request(t * 0.1, {"a": 1.0}, 0, 0.2, "send", 0.0) for t in sorted(arrivals)]
    scenario = {
        "policies": {"a": policy},
        "default": ScopePolicy(),
        "cap": None,
        "requests": requests,
        "seed": seed,
        "dispatch_each_event": False,
    }
    simulation = Simulation(scenario)
    simulation.run()
    order = sorted(simulation.tracked, key=lambda item: item.granted or 0)
    assert [item.ticket.seq for item in order] == sorted(item.ticket.seq for item in order)


# -- targeted examples -------------------------------------------------------------------------


def test_seed_example_per_slot_delay() -> None:
    """2 slots, 0.3 s between sends, 1.0 s per slot: 3 quick requests go at 0.0, 0.3, 1.0."""
    core = Scheduler(default=ScopePolicy(concurrency=2, delay=0.3, slot_delay=1.0))
    tickets = [core.make_ticket({"example.com": 1.0}, 0, 0.0) for _ in range(3)]
    sends: dict[int, float] = {}
    now = 0.0
    for ticket in tickets:
        if core.enqueue(ticket, now):
            sends[ticket.seq] = now
    while len(sends) < 3:
        for ticket in core.dispatch(now):
            sends[ticket.seq] = now
        for ticket in tickets:  # every response takes 0.1 s
            if ticket.state == GRANTED and now >= ticket.granted_at + 0.1:
                core.release(ticket, now)
        now = min([core.next_wake()] + [t.granted_at + 0.1 for t in tickets if t.state == GRANTED])
    assert [round(sends[t.seq], 9) for t in tickets] == [0.0, 0.3, 1.0]


def test_multi_scope_request_takes_everything_at_once() -> None:
    core = Scheduler(
        policies={"busy": ScopePolicy(concurrency=1, delay=0, slot_delay=0)},
        default=ScopePolicy(concurrency=1, delay=0, slot_delay=0),
        concurrency=None,
    )
    holder = core.make_ticket({"busy": 1.0}, 0, 0.0)
    assert core.enqueue(holder, 0.0)
    both = core.make_ticket({"free": 1.0, "busy": 1.0}, 0, 0.0)
    assert not core.enqueue(both, 0.0)
    assert core.dispatch(0.0) == []
    # Waiting on "busy" holds nothing of "free": a request for "free" alone goes at once.
    assert core.scopes["free"].in_flight == 0
    alone = core.make_ticket({"free": 1.0}, 0, 0.0)
    assert core.enqueue(alone, 0.0)
    core.release(alone, 1.0)
    core.release(holder, 1.0)
    assert core.dispatch(1.0) == [both]
    assert core.scopes["free"].in_flight == core.scopes["busy"].in_flight == 1


def test_no_head_of_line_blocking_across_scopes() -> None:
    core = Scheduler(default=ScopePolicy(concurrency=1, delay=10.0, slot_delay=0), concurrency=4)
    assert core.enqueue(core.make_ticket({"b": 1.0}, 0, 0.0), 0.0)
    stuck = core.make_ticket({"a": 1.0, "b": 1.0}, 5, 0.0)  # high priority, needs b too
    assert not core.enqueue(stuck, 0.0)
    core.dispatch(0.0)
    quick = core.make_ticket({"a": 1.0}, 0, 0.0)
    assert core.enqueue(quick, 0.0), "a request for 'a' alone must not wait behind one stuck on 'b'"


def test_large_quota_request_is_not_starved_by_small_ones() -> None:
    core = Scheduler(
        default=ScopePolicy(concurrency=None, delay=0, slot_delay=0, quota=4.0, window=10.0),
        concurrency=None,
    )
    assert core.enqueue(core.make_ticket({"api": 3.0}, 0, 0.0), 0.0)
    big = core.make_ticket({"api": 3.0}, 0, 1.0)
    assert not core.enqueue(big, 1.0)
    small = core.make_ticket({"api": 1.0}, 0, 2.0)
    assert not core.enqueue(small, 2.0), "1 unit is left, but the big request is first in line"
    assert core.dispatch(2.0) == []
    assert core.next_wake() == 10.0
    assert core.dispatch(10.0) == [big, small]


def test_higher_priority_passes_a_lower_one_waiting_for_quota() -> None:
    core = Scheduler(
        default=ScopePolicy(concurrency=None, delay=0, slot_delay=0, quota=3.0, window=10.0),
        concurrency=None,
    )
    assert core.enqueue(core.make_ticket({"api": 2.0}, 0, 0.0), 0.0)
    big = core.make_ticket({"api": 2.0}, 0, 1.0)
    assert not core.enqueue(big, 1.0)
    core.dispatch(1.0)
    urgent = core.make_ticket({"api": 1.0}, 5, 2.0)
    assert core.enqueue(urgent, 2.0), "the queued request is behind it in priority"
    ordinary = core.make_ticket({"api": 0.5}, 0, 2.0)
    assert not core.enqueue(ordinary, 2.0), "equal priority: the big request is first in line"


def test_higher_priority_goes_first() -> None:
    core = Scheduler(default=ScopePolicy(concurrency=1, delay=0, slot_delay=0))
    holder = core.make_ticket({"s": 1.0}, 0, 0.0)
    assert core.enqueue(holder, 0.0)
    low = core.make_ticket({"s": 1.0}, 0, 0.0)
    high = core.make_ticket({"s": 1.0}, 3, 0.0)
    assert not core.enqueue(low, 0.0)
    assert not core.enqueue(high, 0.0)
    core.release(holder, 1.0)
    assert core.dispatch(1.0) == [high]
    core.release(high, 2.0)
    assert core.dispatch(2.0) == [low]


def test_cancelling_an_unused_grant_refunds_quota_and_concurrency() -> None:
    core = Scheduler(
        default=ScopePolicy(concurrency=1, delay=0, slot_delay=0, quota=2.0, window=100.0),
        concurrency=1,
    )
    granted = core.make_ticket({"api": 2.0}, 0, 0.0)
    assert core.enqueue(granted, 0.0)
    waiter = core.make_ticket({"api": 2.0}, 0, 0.0)
    assert not core.enqueue(waiter, 0.0)
    ledger = core.scopes["api"]
    assert (ledger.in_flight, ledger.quota_used, core.gate.in_flight) == (1, 2.0, 1)
    core.cancel(granted, 1.0)  # granted, but the request was never sent
    assert granted.state == CANCELLED
    assert (ledger.in_flight, ledger.quota_used, core.gate.in_flight) == (0, 0.0, 0)
    assert core.dispatch(1.0) == [waiter], "the refunded quota and slot go to the next waiter"
    core.cancel(waiter, 2.0)
    core.cancel(waiter, 2.0)  # idempotent
    core.release(waiter, 2.0)  # and no effect once cancelled
    assert (ledger.in_flight, ledger.quota_used, core.gate.in_flight) == (0, 0.0, 0)


def test_release_keeps_quota_but_frees_concurrency() -> None:
    core = Scheduler(default=ScopePolicy(concurrency=1, delay=0, slot_delay=0, quota=2.0))
    ticket = core.make_ticket({"api": 1.5}, 0, 0.0)
    assert core.enqueue(ticket, 0.0)
    core.release(ticket, 1.0)
    core.release(ticket, 1.0)
    ledger = core.scopes["api"]
    assert (ledger.in_flight, ledger.quota_used, ledger.quota_left) == (0, 1.5, 0.5)


def test_cost_above_quota_is_rejected() -> None:
    core = Scheduler(default=ScopePolicy(quota=5.0))
    with pytest.raises(ValueError, match=r"cost 6\.0 for scope 'api' exceeds its quota 5\.0"):
        core.make_ticket({"api": 6.0}, 0, 0.0)
    assert core.waiting == 0
    assert core.gate.in_flight == 0


def test_next_wake_is_the_single_timer_for_all_scopes() -> None:
    core = Scheduler(default=ScopePolicy(concurrency=None, delay=2.0, slot_delay=0))
    for scope in ("x", "y"):
        assert core.enqueue(core.make_ticket({scope: 1.0}, 0, 0.0), 0.0)
    assert core.next_wake() == INF, "no waiter, no timer"
    core.enqueue(core.make_ticket({"x": 1.0}, 0, 0.5), 0.5)
    core.enqueue(core.make_ticket({"y": 1.0}, 0, 0.5), 0.5)
    assert core.dispatch(0.5) == []
    assert core.next_wake() == 2.0
    assert len(core.dispatch(2.0)) == 2
    assert core.next_wake() == INF


# -- eviction (invariant 7) --------------------------------------------------------------------


def _use(core: Scheduler, scope: str, now: float) -> Ticket:
    ticket = core.make_ticket({scope: 1.0}, 0, now)
    assert core.enqueue(ticket, now)
    return ticket


def _idle_core(**kwargs: Any) -> Scheduler:
    return Scheduler(default=ScopePolicy(concurrency=1, delay=5.0, slot_delay=0), **kwargs)


def test_scopes_idle_longer_than_max_idle_are_evicted() -> None:
    core = _idle_core(max_idle=100.0)
    core.release(_use(core, "old", 0.0), 1.0)
    core.release(_use(core, "recent", 50.0), 51.0)
    _use(core, "new", 101.5)  # eviction runs when a scope is created
    assert set(core.scopes) == {"recent", "new"}


def test_scopes_above_max_scopes_are_evicted_longest_idle_first() -> None:
    core = _idle_core(max_scopes=2)
    for index, scope in enumerate(("first", "second", "third")):  # 10 s apart: delays ran out
        core.release(_use(core, scope, 10.0 * index), 10.0 * index + 0.5)
    assert set(core.scopes) == {"second", "third"}


def test_scopes_whose_delay_still_binds_are_not_evicted() -> None:
    """Above max_scopes, a scope whose delay has not run out is spared: a fresh
    ledger would let its next request out early."""
    core = _idle_core(max_scopes=2)
    for index, scope in enumerate(("first", "second", "third")):  # 1 s apart, delay 5 s
        core.release(_use(core, scope, float(index)), index + 0.5)
    assert set(core.scopes) == {"first", "second", "third"}
    again = core.make_ticket({"first": 1.0}, 0, 3.0)
    assert not core.try_grant(again, 3.0)  # still 5 s after its send at 0


def test_busy_scopes_are_never_evicted() -> None:
    core = _idle_core(max_scopes=1, max_idle=1.0)
    held = _use(core, "held", 0.0)  # granted at once, on the fast path
    waiter = core.make_ticket({"queued": 1.0}, 0, 0.0)
    assert core.enqueue(waiter, 0.0)
    waiter2 = core.make_ticket({"queued": 1.0}, 0, 0.0)
    assert not core.enqueue(waiter2, 0.0)
    for index in range(5):
        core.release(_use(core, f"passing-{index}", 10.0 + index), 10.5 + index)
    assert {"held", "queued"} <= set(core.scopes)
    assert core.scopes["held"] is held.ledgers[0]
    # The scope still enforces its concurrency: a second request waits.
    again = core.make_ticket({"held": 1.0}, 0, 20.0)
    assert not core.enqueue(again, 20.0)
    core.release(held, 21.0)
    assert core.dispatch(21.0) == [again]


def test_scope_idle_less_than_max_idle_keeps_its_state() -> None:
    core = _idle_core(max_idle=100.0, max_scopes=10)
    core.release(_use(core, "kept", 0.0), 1.0)
    ledger = core.scopes["kept"]
    ledger.delay = 42.0  # learned state (what a controller would have moved)
    for index in range(5):
        core.release(_use(core, f"other-{index}", 2.0 + index), 2.5 + index)
    assert core.scopes["kept"] is ledger
    assert ledger.delay == 42.0
    # Its delay still applies after the gap: the next send waits for it.
    follow = core.make_ticket({"kept": 1.0}, 0, 3.0)
    assert not core.enqueue(follow, 3.0)
    core.dispatch(3.0)
    assert core.next_wake() == 5.0


def test_eviction_does_not_forget_an_open_quota_window() -> None:
    core = Scheduler(
        default=ScopePolicy(concurrency=1, delay=0, slot_delay=0, quota=1.0, window=86_400.0),
        max_idle=3600.0,
    )
    core.release(_use(core, "daily-api", 0.0), 1.0)
    _use(core, "other", 4000.0)  # creating a scope runs the eviction sweep
    ticket = core.make_ticket({"daily-api": 1.0}, 0, 4000.0)
    assert not core.enqueue(ticket, 4000.0), "the day's quota of 1 request is already used"


def _fill_bound(core: Scheduler, count: int, now: float) -> None:
    for index in range(count):
        core.release(_use(core, f"old-{index}", now), now)


def test_a_new_scope_at_the_cap_looks_at_few_ledgers_while_every_scope_still_binds() -> None:
    """The idle scopes are a heap keyed by when they may be forgotten: at the cap,
    with every old scope inside its 10 s delay, a new scope looks at one ledger
    (the heap's top) instead of going round all of them, and evicts none."""
    count = 2_000
    core = Scheduler(default=ScopePolicy(concurrency=1, delay=10.0, slot_delay=0), max_scopes=count)
    _fill_bound(core, count, 0.0)
    looked = core.looked
    for index in range(500):
        core.release(_use(core, f"new-{index}", 1.0), 1.0)
    assert core.looked - looked <= 500, "one look per new scope"
    assert len(core.scopes) == count + 500, "no old scope could be forgotten yet"
    # Once their delays have run out, new scopes bring the count back to the cap,
    # the scopes that could be forgotten earliest going first.
    for index in range(200):
        core.release(_use(core, f"later-{index}", 20.0), 20.0)
    assert len(core.scopes) <= count + 500
    looked = core.looked
    for index in range(2_000):
        core.release(_use(core, f"last-{index}", 30.0 + index), 30.0 + index)
    assert len(core.scopes) == count
    assert core.looked - looked <= 8 * 2_000
    assert "old-0" not in core.scopes
    assert "last-1999" in core.scopes


def test_eviction_work_per_new_scope_is_bounded_when_every_key_is_stale() -> None:
    """Scopes used again after they were listed have stale heap keys; fixing them is
    spread over the next new scopes (at most 8 looks each), never a sweep of all."""
    count = 1_000
    core = Scheduler(default=ScopePolicy(concurrency=1, delay=1.0, slot_delay=0), max_scopes=count)
    _fill_bound(core, count, 0.0)
    for index in range(count):  # every scope used again: every listed key is stale now
        core.release(_use(core, f"old-{index}", 5.0), 5.0)
    for index in range(100):
        looked = core.looked
        core.release(_use(core, f"new-{index}", 10.0), 10.0)
        assert core.looked - looked <= 8
    assert all(ledger.in_flight == 0 for ledger in core.scopes.values())


# -- stateful test ---------------------------------------------------------------------------


class StepController(BaseController):
    """A custom controller: each 429 doubles the delay and caps concurrency at 1; 200 resets."""

    def __init__(self, policy: ScopePolicy) -> None:
        self.sends = 0

    def on_send(self, scope: ScopeView, now: float) -> None:
        self.sends += 1

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        if feedback.status == 429:
            self.delay = max(0.1, self.delay * 2)
            self.concurrency = 1
            self.blocked_until = now + 0.2
        elif feedback.status == 200:
            self.delay, self.concurrency = 0.0, None


class SchedulerMachine(RuleBasedStateMachine):
    """Random interleavings of every Scheduler operation; the counters must always add up."""

    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.all: list[Ticket] = []
        self.costs: dict[int, dict[str, float]] = {}  # live quota charge per ticket and scope
        self.core = Scheduler()

    @initialize(
        explicit=st.dictionaries(st.sampled_from(SCOPES[:3]), policies(), max_size=3),
        default=policies(),
        controlled=st.booleans(),
        cap=st.one_of(st.none(), st.integers(1, 4)),
        max_scopes=st.integers(1, 6),
        max_idle=st.sampled_from([0.5, 3.0, 3600.0]),
        seed=st.integers(0, 1000),
    )
    def setup(
        self,
        explicit: dict[str, ScopePolicy],
        default: ScopePolicy,
        controlled: bool,
        cap: int | None,
        max_scopes: int,
        max_idle: float,
        seed: int,
    ) -> None:
        if controlled:
            explicit = {
                k: attrs.evolve(p, controllers=[StepController]) for k, p in explicit.items()
            }
        self.core = Scheduler(
            policies=explicit,
            default=default,
            concurrency=cap,
            max_scopes=max_scopes,
            max_idle=max_idle,
            rng=random.Random(seed),
        )

    def _live(self, *states: int) -> list[Ticket]:
        return [ticket for ticket in self.all if ticket.state in states]

    @rule(
        target=tickets,
        names=st.lists(st.sampled_from(SCOPES), min_size=1, max_size=3, unique=True),
        cost=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
        priority=st.integers(0, 2),
    )
    def enqueue(self, names: list[str], cost: float, priority: int) -> Ticket:
        core = self.core
        costs = {}
        for name in names:
            quota = core.policy_for(name).quota
            costs[name] = cost if quota is None else min(cost, quota)
        ticket = core.make_ticket(costs, priority, self.now)
        core.enqueue(ticket, self.now)
        self.all.append(ticket)
        self.costs[ticket.seq] = dict(costs)
        return ticket

    @rule()
    def dispatch(self) -> None:
        core = self.core
        for ticket in core.dispatch(self.now):
            assert ticket.state == GRANTED
            assert ticket.granted_at == self.now
            for ledger in ticket.ledgers:
                # A controller may lower concurrency below what is in flight, but
                # nothing is granted then until the scope is back under it.
                if ledger.concurrency is not None:
                    assert ledger.in_flight <= ledger.concurrency, ledger
                assert ledger.blocked_until <= self.now, ledger
        if core.gate.limit is not None:
            assert core.gate.in_flight <= core.gate.limit
        assert not core.pending
        assert core.next_wake() > self.now

    @rule(seconds=st.sampled_from([0.01, 0.1, 0.5, 1.0, 4.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def advance_to_next_wake(self) -> None:
        wake = self.core.next_wake()
        if wake < INF:
            self.now = max(self.now, wake)

    @rule(ticket=tickets)
    def release(self, ticket: Ticket) -> None:
        self.core.release(ticket, self.now)

    @rule(ticket=consumes(tickets))
    def cancel(self, ticket: Ticket) -> None:
        state = ticket.state
        self.core.cancel(ticket, self.now)
        if state == GRANTED:
            self.costs[ticket.seq] = dict.fromkeys(self.costs[ticket.seq], 0.0)
        if state in (WAITING, GRANTED):
            assert ticket.state == CANCELLED

    @precondition(lambda self: bool(self._live(GRANTED, RELEASED)))
    @rule(
        data=st.data(),
        status=st.sampled_from([200, 429, None]),
        consumed=st.sampled_from([None, 0.0, 0.25, 1.0, 3.0]),
    )
    def feedback(self, data: st.DataObject, status: int | None, consumed: float | None) -> None:
        ticket = data.draw(st.sampled_from(self._live(GRANTED, RELEASED)))
        actual = None if consumed is None else dict.fromkeys(ticket.scopes, consumed)
        self.core.feedback(ticket, Feedback(status=status, latency=0.1), self.now, actual)
        if actual is not None:
            for ledger in ticket.ledgers:
                # A reconciled cost only counts while the send is still inside its window.
                if ticket.granted_at + ledger.policy.window > self.now:
                    self.costs[ticket.seq][ledger.name] = consumed  # type: ignore[assignment]

    @invariant()
    def counters_add_up(self) -> None:
        core = self.core
        granted = self._live(GRANTED)
        waiting = self._live(WAITING)
        assert core.gate.in_flight == len(granted)
        assert core.waiting == len(waiting)
        if core.gate.limit is not None:
            assert core.gate.in_flight <= core.gate.limit
        for ticket in granted + waiting:
            for ledger in ticket.ledgers:
                # A busy scope is never evicted, so there is only one ledger per scope.
                assert core.scopes.get(ledger.name) is ledger, f"busy {ledger!r} was evicted"
        for name, ledger in core.scopes.items():
            assert ledger.in_flight == sum(ledger in t.ledgers for t in granted), name
            assert ledger.in_line == sum(ledger in t.ledgers for t in waiting), name
            assert ledger.idle == (ledger.in_flight == 0 and ledger.in_line == 0), name
            if ledger.policy.quota is not None:
                ledger.expire(self.now)
                live = sum(
                    self.costs[t.seq][name]
                    for t in self.all
                    if ledger in t.ledgers
                    and t.granted_at + ledger.policy.window > self.now
                    and t.state != WAITING
                )
                assert ledger.quota_used == pytest.approx(live, abs=QUOTA_EPS), name

    def teardown(self) -> None:
        """Liveness: with every grant released, every waiter is granted in the end."""
        core = self.core
        for _ in range(10_000):
            for ticket in self._live(GRANTED):
                core.release(ticket, self.now)
            core.dispatch(self.now)
            if not core.waiting and not self._live(GRANTED):
                break
            wake = core.next_wake()
            if wake < INF:
                self.now = max(self.now, wake)
        assert core.waiting == 0
        assert core.gate.in_flight == 0
        for ledger in core.scopes.values():
            assert ledger.in_flight == ledger.in_line == 0


SchedulerMachine.TestCase.settings = settings(
    deadline=None, max_examples=250, stateful_step_count=40
)
test_scheduler_state_machine = SchedulerMachine.TestCase
