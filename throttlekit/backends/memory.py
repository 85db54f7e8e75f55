"""The in-memory backend: the scope ledgers of one process, and its waiters.

Every :class:`~throttlekit.Limiter` has one: it holds the policies, the
global cap and each scope's ledger, grants from them, and keeps the waiters
asleep until their grant. A shared backend (Redis) is given it as its
local part (the global cap, and the fallback when the store is away).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Mapping
from threading import get_ident as _get_ident
from types import TracebackType

import anyio

from .. import _clock
from .._clock import current_task as _current_task
from .._clock import now as _now
from .._clock import now_or_monotonic
from .._controller import Feedback
from .._errors import Overloaded, ThrottleTimeout
from .._lane import FastLane
from .._ledger import ScopeLedger
from .._permit import Permit, held_permits
from .._policy import ScopePolicy
from .._scheduler import CANCELLED, GRANTED, RELEASED, WAITING, Scheduler, Ticket
from .._stats import LimiterStatistics, ScopeStatistics
from .._waiters import Waiters, raise_if_stalled
from ..scopes import by_host

__all__ = ["MemoryBackend", "MemoryPermit"]

INF = math.inf
_COST_ONE = (1.0,)
_NO_ENTRY = (None,)
_tasks = _clock.tasks
# The lease of a MemoryPermit granted on its fast path, and once released.
_FAST_GRANTED = object()
_FAST_RELEASED = object()


class _NoLoop:
    """All a future needs of its loop when it is made (its debug flag)."""

    @staticmethod
    def get_debug() -> bool:
        return False


# What MemoryPermit.__aexit__ returns for ``async with`` to await: a future
# already done, which completes at once on any loop (and under trio) and
# costs less than the coroutine an ``async def __aexit__`` would make per
# request (its release never waits).
_DONE: asyncio.Future[None] = asyncio.Future(loop=_NoLoop())  # type: ignore[arg-type]
_DONE.set_result(None)


class MemoryPermit(Permit):
    """The permit of a limiter whose scopes live in memory: the uncontended case inline.

    Its grant and release go through the limiter's
    :class:`~throttlekit._lane.FastLane` (a request of one existing plain
    scope of cost 1 with room now); anything else takes the general path of
    :class:`Permit`.

    Such a grant keeps only its ledger and time until something needs
    its :class:`~throttlekit._scheduler.Ticket` (feedback, nesting, the
    permit's scopes): most requests never do, and a ticket costs a fifth of
    the whole operation.
    """

    # A fast grant: its ledger and time; its lease is then _FAST_GRANTED, and
    # _FAST_RELEASED once given back.
    __slots__ = ("_ledger", "_sent_at")

    async def __aenter__(self) -> Permit:
        loop, clock = _clock._running
        if loop._thread_id == _get_ident():
            task = _tasks.get(loop)  # the running asyncio loop's task, read directly
            now = clock()
        else:
            task = None
        if task is None:  # trio, or an asyncio loop that _clock has not cached
            task = _current_task()
            now = _now()
            loop = _clock.current_loop()
        lane = self._lane
        holds = lane.holds
        if (
            self._lease is None
            and self._shared is None
            # A task that holds a permit of this limiter nests: general path.
            and (
                holds is None
                or (task not in holds if isinstance(holds, dict) else holds._task is not task)
            )
        ):
            ledger = lane.take(self._request, self._scopes, now, loop)
            if ledger is not None:
                self._ledger = ledger
                self._sent_at = now
                self._lease = _FAST_GRANTED
                if self._encloses:  # its task holds it (Permit._hold, inline)
                    self._task = task
                    if holds is None:
                        lane.holds = self
                    else:
                        held_permits(lane)[task] = self
                return self
        await super().__aenter__()
        self._remember()
        return self

    def _enter_nowait(self) -> None:
        loop, clock = _clock._running
        if loop._thread_id == _get_ident():
            now = clock()
        else:
            now = _now()
            loop = _clock.current_loop()
        # A permit of acquire_nowait() is fresh.
        ledger = self._lane.take(self._request, self._scopes, now, loop)
        if ledger is not None:
            self._ledger = ledger
            self._sent_at = now
            self._lease = _FAST_GRANTED
            return
        super()._enter_nowait()
        self._remember()

    def _took(self, ledger: ScopeLedger, now: float) -> None:
        """Granted by the fast lane: keep the ledger and time (the ticket is made if needed)."""
        self._ledger = ledger
        self._sent_at = now
        self._lease = _FAST_GRANTED

    def _remember(self) -> None:
        """After a grant on the general path: the URL's ledger, for the fast path."""
        lease = self._lease
        request = self._request
        if self._scopes is None and type(lease) is Ticket and type(request) is str:
            self._lane.remember(request, lease.ledgers[0])

    def _get_lease(self) -> Ticket | None:
        lease = self._lease
        if lease is _FAST_GRANTED:  # a fast grant: its ticket, from now on
            state = GRANTED
        elif lease is _FAST_RELEASED:
            state = RELEASED
        else:
            return lease  # type: ignore[no-any-return]
        ticket = Ticket((self._ledger,), _COST_ONE, self._priority, -1)
        ticket.state = state
        ticket.granted_at = self._sent_at
        ticket.quota_entries = _NO_ENTRY
        self._lease = ticket
        return ticket

    def __aexit__(  # type: ignore[override]
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[None]:
        task = self._task
        if task is not None:  # Permit._unhold, its usual cases inline
            self._task = None
            lane = self._lane
            if lane.holds is self:  # held alone: nothing nested in it
                lane.holds = None
            else:
                held = held_permits(lane)
                top = held.pop(task, None)
                if top is not self or self._outer is not None:
                    self._unheld(task, top)
                elif not held:
                    lane.holds = None
        if self._lease is _FAST_GRANTED and self._lane.give_back(self._ledger):
            self._lease = _FAST_RELEASED
            return _DONE
        MemoryPermit.release(self)  # not an override's: instrumentation counts its own
        return _DONE

    def release(self) -> None:
        """Give back the concurrency this permit holds (idempotent)."""
        lease = self._lease
        if lease is _FAST_GRANTED:
            if self._lane.give_back(self._ledger):
                self._lease = _FAST_RELEASED
                return
            self._get_lease()
        elif lease is _FAST_RELEASED:
            return
        Permit.release(self)


class MemoryBackend:
    """Grants from in-memory scope ledgers; waiters sleep on one event each.

    Made by the :class:`~throttlekit.Limiter` from its own arguments (see
    there). Waiting costs no CPU: every waiter sleeps on its own event and a
    single timer (held by one of the waiters, the *timekeeper*: see
    :class:`~throttlekit._waiters.Waiters`) wakes the backend when the next
    delay or quota window ends. Leases are
    :class:`~throttlekit._scheduler.Ticket` objects.

    It serves one event loop at a time (asyncio or trio): a request that would
    wait, from another loop or thread, while requests of the first are in
    flight or waiting raises :class:`RuntimeError` (its wake-ups could not
    reach it; threads use :class:`~throttlekit.SyncLimiter`).
    """

    def __init__(
        self,
        *,
        policies: Mapping[str, ScopePolicy],
        default: ScopePolicy,
        concurrency: int | None,
        max_waiters: int | None,
        max_scopes: int,
        max_idle: float,
        rng: random.Random,
    ) -> None:
        self.max_waiters = max_waiters
        self.core = Scheduler(
            policies=policies,
            default=default,
            concurrency=concurrency,
            max_scopes=max_scopes,
            max_idle=max_idle,
            rng=rng,
        )
        #: The uncontended grant and the URL cache (see FastLane).
        self.lane = FastLane(self.core, by_host)
        self.waiters = Waiters(self.core)

    def __repr__(self) -> str:
        core = self.core
        return (
            f"<{type(self).__name__} in_flight={core.gate.in_flight}/{core.gate.limit} "
            f"waiting={core.waiting} scopes={len(core.scopes)} next_wake={core.next_wake():g}>"
        )

    def now(self) -> float:
        """The clock of the grants: the running event loop's."""
        return _now()

    def stats_now(self) -> float:
        """The clock of statistics, which may be read outside an event loop."""
        return now_or_monotonic()

    # -- policies ------------------------------------------------------------------

    @property
    def default(self) -> ScopePolicy:
        """The policy of scopes not configured explicitly."""
        return self.core.default

    @property
    def policies(self) -> Mapping[str, ScopePolicy]:
        """The explicitly configured scope policies."""
        return dict(self.core.policies)

    def policy(self, scope: str) -> ScopePolicy:
        """The policy that applies to ``scope``."""
        return self.core.policy_for(scope)

    def set_policy(self, scope: str, policy: ScopePolicy) -> None:
        """Configure ``scope`` with ``policy`` from now on (live counters are kept)."""
        self.core.set_policy(scope, policy)
        try:
            now = self.now()
        except Exception:
            return  # outside an event loop: nobody waits
        self.waiters.kick(now)

    # -- the Backend protocol ------------------------------------------------------

    #: What the limiter's ``acquire()`` returns.
    permit_type: type[Permit] = MemoryPermit

    def bind(self, local: MemoryBackend) -> None:
        """The in-memory backend is its own local part."""

    def try_acquire(self, costs: Mapping[str, float], priority: int) -> Ticket | None:
        """Grant ``costs`` now if every scope and the global cap admit them, else ``None``."""
        now = self.now()
        self._claim()
        core = self.core
        ticket = core.make_ticket(costs, priority, now)
        if core.try_grant(ticket, now):
            return ticket
        core.discard(ticket)
        return None

    async def acquire(
        self,
        costs: Mapping[str, float],
        *,
        priority: int,
        timeout: float | None,  # noqa: ASYNC109 - the caller's acquire(timeout=)
        gated: bool = True,
    ) -> Ticket:
        """Wait for a grant of ``costs``; ``{}`` takes only the global cap.

        ``gated=False`` takes no slot of the global cap (a nested acquire).

        :raises ThrottleTimeout: when ``timeout`` seconds pass first.
        :raises Overloaded: when ``max_waiters`` requests are already waiting.
        :raises RuntimeError: when another event loop or thread uses the limiter.
        """
        now = _now()
        self._claim()
        ticket = self.enqueue(costs, priority, now, gated)
        if ticket.state != WAITING:
            return ticket  # no await, no yield to the event loop
        ticket.waker = anyio.Event()
        self.waiters.add(ticket, now)
        try:
            if timeout is None:
                await self._wait(ticket)
            else:
                with anyio.fail_after(timeout):
                    await self._wait(ticket)
        except BaseException as exc:
            self.waiters.abandon(ticket, _now())
            if isinstance(exc, TimeoutError) and ticket.state == CANCELLED:
                raise ThrottleTimeout(
                    f"no grant within {timeout} s for scopes {sorted(ticket.scopes)}"
                ) from None
            raise
        self.waiters.wake_stalled(ticket, _now())  # its grant may have spent a quota
        return ticket

    def enqueue(self, costs: Mapping[str, float], priority: int, now: float, gated: bool) -> Ticket:
        """A ticket for ``costs``: granted now, or queued (``WAITING``) for the caller to wait.

        :raises Overloaded: when ``max_waiters`` requests are already waiting.
        """
        core = self.core
        ticket = core.make_ticket(costs, priority, now, gated)
        if core.try_grant(ticket, now):
            return ticket
        if self.max_waiters is not None and core.waiting >= self.max_waiters:
            core.discard(ticket)
            raise Overloaded(f"{core.waiting} requests are already waiting (max_waiters)")
        core.enqueue(ticket, now)
        return ticket

    def record(
        self, lease: Ticket, feedback: Feedback, consumed: Mapping[str, float] | None
    ) -> None:
        """Give the feedback to the lease's scopes now (and reconcile ``consumed`` costs)."""
        now = self.now()
        self.core.feedback(lease, feedback, now, consumed)
        if self.core.pending:
            self.waiters.kick(now)
        self.waiters.wake_stalled(lease, now)

    def release_nowait(self, lease: Ticket) -> bool:
        """Give the lease back (idempotent); always done at once here, without a clock
        read unless a waiter may be granted."""
        if self.core.release(lease):
            self.waiters.kick(self.now())
        return True

    async def release(self, lease: Ticket) -> None:
        """Give the lease back (idempotent)."""
        self.release_nowait(lease)

    async def aclose(self) -> None:
        """Nothing to close."""

    # -- statistics ----------------------------------------------------------------

    def statistics(self) -> LimiterStatistics:
        """A frozen snapshot of the global cap and every scope (O(scopes))."""
        now = self.stats_now()
        core = self.core
        scopes = {}
        for ledger in core.iter_scopes():
            if ledger.policy.quota is not None:
                ledger.expire(now)
            scopes[ledger.name] = ScopeStatistics.from_ledger(ledger, now)
        return LimiterStatistics(
            in_flight=core.gate.in_flight,
            waiting=core.waiting,
            concurrency=core.gate.limit,
            next_wake=core.next_wake(),
            scopes=scopes,
        )

    def scope_statistics(self, scope: str) -> ScopeStatistics | None:
        """A frozen snapshot of one scope, or ``None`` if it is not tracked."""
        ledger = self.core.scopes.get(scope)
        if ledger is None:
            return None
        now = self.stats_now()
        if ledger.policy.quota is not None:
            ledger.expire(now)
        return ScopeStatistics.from_ledger(ledger, now)

    # -- waiting -------------------------------------------------------------------

    def _claim(self) -> None:
        """Bind the limiter to the running event loop, unless another one still uses it."""
        owner = _clock.current_loop()
        lane = self.lane
        if lane.owner is owner:
            return
        core = self.core
        if core.gate.in_flight or core.waiting:
            raise RuntimeError(
                "this throttlekit.Limiter is in use by another event loop or thread "
                f"({core.gate.in_flight} in flight, {core.waiting} waiting there), and its "
                "wake-ups cannot reach this one: a Limiter serves one event loop at a time. "
                "Share a throttlekit.SyncLimiter between threads, or give each event loop "
                "its own Limiter"
            )
        lane.owner = owner

    async def _wait(self, ticket: Ticket) -> None:
        waiters = self.waiters
        while ticket.state == WAITING:
            event = ticket.waker
            if waiters.timekeeper is ticket:
                with anyio.CancelScope(deadline=waiters.arm(ticket)):
                    await event.wait()
                if ticket.state != WAITING:
                    return
                if event.is_set():
                    ticket.waker = anyio.Event()
                waiters.woke(ticket, _now())
            else:
                await event.wait()
                if ticket.state == WAITING:
                    ticket.waker = anyio.Event()
            if ticket.state == WAITING:
                raise_if_stalled(ticket, _now())
