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
from collections import deque
from collections.abc import Awaitable, Mapping
from threading import get_ident as _get_ident
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from .. import _clock
from .._clock import current_task as _current_task
from .._clock import now as _now
from .._clock import now_or_monotonic
from .._controller import Feedback
from .._errors import Overloaded, ThrottleTimeout
from .._ledger import UNLISTED, ScopeLedger
from .._permit import Permit, _held_permits
from .._policy import ScopePolicy
from .._scheduler import CANCELLED, GRANTED, RELEASED, WAITING, Scheduler, Ticket
from .._stats import LimiterStatistics, ScopeStatistics
from ..scopes import by_host

if TYPE_CHECKING:
    from .._limiter import Limiter

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


def _ledger_of_new_url(limiter: Limiter, url: str) -> ScopeLedger | None:
    """The ledger of the scope of a URL the limiter does not remember yet, if that
    scope exists (the default resolver's host); remembered from now on."""
    if limiter._resolver is not by_host:
        return None
    ledger = limiter._ledgers.get(limiter._host_of(url))
    if ledger is not None:
        limiter._hosts[url] = ledger
    return ledger


class MemoryPermit(Permit):
    """The permit of a limiter whose scopes live in memory: the uncontended case inline.

    A request of one existing scope of cost 1 (``scopes="name"``, or a URL
    string with the default resolver: the limiter remembers the ledger of
    recent URLs, and finds a new URL's by its host), on a *plain* scope (no
    controller, quota, slot delay or jitter in force), with room now in that
    scope and the global cap and no request waiting for either, is granted right
    here, and given back the same way. Anything else takes the general path
    of :class:`Permit`.

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
        limiter = self._limiter
        # The grant (as in _enter_nowait: keep them alike), inline: a call
        # would cost a tenth of the operation.
        if self._lease is None and self._shared is None:
            scopes = self._scopes
            if scopes is None:
                request = self._request
                if type(request) is str:
                    ledger = limiter._hosts.get(request)
                    if ledger is None:
                        ledger = _ledger_of_new_url(limiter, request)
                else:
                    ledger = None
            elif type(scopes) is str:
                ledger = limiter._ledgers.get(scopes)
            else:
                ledger = None
            if type(ledger) is ScopeLedger and ledger.plain and not ledger.in_line:
                gate = limiter._gate
                limit = gate.limit
                concurrency = ledger.concurrency
                holds = limiter._holds
                if (
                    (limit is None or (gate.in_flight < limit and not gate.queue))
                    and (concurrency is None or ledger.in_flight < concurrency)
                    and ledger.next_send_at <= now
                    # A task that holds a permit of this limiter nests: general path.
                    and (
                        holds is None
                        or (
                            task not in holds
                            if isinstance(holds, dict)
                            else holds._task is not task
                        )
                    )
                ):
                    ledger.in_flight += 1
                    ledger.factor = 1.0
                    delay = ledger.delay
                    ledger.next_send_at = now + delay if delay else now
                    gate.in_flight += 1
                    self._ledger = ledger
                    self._sent_at = now
                    self._lease = _FAST_GRANTED
                    if self._encloses:  # its task holds it (Permit._hold, inline)
                        self._task = task
                        if holds is None:
                            limiter._holds = self
                        else:
                            _held_permits(limiter)[task] = self
                    return self
        await super().__aenter__()
        self._remember()
        return self

    def _enter_nowait(self) -> None:
        loop, clock = _clock._running
        now = clock() if loop._thread_id == _get_ident() else _now()
        # The grant of __aenter__ (the same lines: keep them alike), then the
        # general path's try_acquire. A permit of acquire_nowait() is fresh.
        limiter = self._limiter
        scopes = self._scopes
        if scopes is None:
            request = self._request
            if type(request) is str:
                ledger = limiter._hosts.get(request)
                if ledger is None:
                    ledger = _ledger_of_new_url(limiter, request)
            else:
                ledger = None
        elif type(scopes) is str:
            ledger = limiter._ledgers.get(scopes)
        else:
            ledger = None
        if type(ledger) is ScopeLedger and ledger.plain and not ledger.in_line:
            gate = limiter._gate
            limit = gate.limit
            concurrency = ledger.concurrency
            if (
                (limit is None or (gate.in_flight < limit and not gate.queue))
                and (concurrency is None or ledger.in_flight < concurrency)
                and ledger.next_send_at <= now
            ):
                ledger.in_flight += 1
                ledger.factor = 1.0
                delay = ledger.delay
                ledger.next_send_at = now + delay if delay else now
                gate.in_flight += 1
                self._ledger = ledger
                self._sent_at = now
                self._lease = _FAST_GRANTED
                return
        super()._enter_nowait()
        self._remember()

    def _remember(self) -> None:
        """After a grant on the general path: the URL's ledger, for the fast path."""
        lease = self._lease
        request = self._request
        if self._scopes is None and type(lease) is Ticket and type(request) is str:
            hosts = self._limiter._hosts
            if request in hosts:  # resolved by the default resolver: one scope, cost 1
                hosts[request] = lease.ledgers[0]

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
        limiter = self._limiter
        task = self._task
        if task is not None:  # Permit._unhold, its usual cases inline
            self._task = None
            if limiter._holds is self:  # held alone: nothing nested in it
                limiter._holds = None
            else:
                held = _held_permits(limiter)
                top = held.pop(task, None)
                if top is not self or self._outer is not None:
                    self._unheld(task, top)
                elif not held:
                    limiter._holds = None
        if self._lease is _FAST_GRANTED:  # release's fast case, inline
            ledger = self._ledger
            gate = limiter._gate
            if (
                ledger.plain
                and not ledger.in_line
                and not gate.queue
                # (the listing first: a scope once idle stays listed while used again)
                and (ledger.listed_at is not UNLISTED or ledger.in_flight > 1)
            ):
                ledger.in_flight -= 1
                gate.in_flight -= 1
                self._lease = _FAST_RELEASED
                return _DONE
        MemoryPermit.release(self)  # not an override's: instrumentation counts its own
        return _DONE

    def release(self) -> None:
        """Give back the concurrency this permit holds (idempotent)."""
        lease = self._lease
        if lease is _FAST_GRANTED:
            ledger = self._ledger
            gate = self._limiter._gate
            # Inline when it frees nothing anybody waits for and the scope
            # stays listed among the idle ones (else Scheduler.release does it).
            if (
                ledger.plain
                and not ledger.in_line
                and not gate.queue
                # (the listing first: a scope once idle stays listed while used again)
                and (ledger.listed_at is not UNLISTED or ledger.in_flight > 1)
            ):
                ledger.in_flight -= 1
                gate.in_flight -= 1
                self._lease = _FAST_RELEASED
                return
            lease = self._get_lease()
        elif lease is _FAST_RELEASED:
            return
        if lease is not None:
            self._limiter._local.release_nowait(lease)


class MemoryBackend:
    """Grants from in-memory scope ledgers; waiters sleep on one event each.

    Made by the :class:`~throttlekit.Limiter` from its own arguments (see
    there). Waiting costs no CPU: every waiter sleeps on its own event and a
    single timer (held by one of the waiters, the *timekeeper*) wakes the
    backend when the next delay or quota window ends. Leases are
    :class:`~throttlekit._scheduler.Ticket` objects.
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
        self._timekeeper: Ticket | None = None
        self._armed = INF
        self._sleepers: deque[Ticket] = deque()

    def __repr__(self) -> str:
        core = self.core
        return (
            f"<MemoryBackend in_flight={core.gate.in_flight}/{core.gate.limit} "
            f"waiting={core.waiting} scopes={len(core.scopes)} next_wake={core.next_wake():g}>"
        )

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
            now = _now()
        except Exception:
            return  # outside an event loop: nobody waits
        self._kick(now)

    # -- the Backend protocol ------------------------------------------------------

    #: What the limiter's ``acquire()`` returns.
    permit_type = MemoryPermit

    def bind(self, local: MemoryBackend) -> None:
        """The in-memory backend is its own local part."""

    def try_acquire(self, costs: Mapping[str, float], priority: int) -> Ticket | None:
        """Grant ``costs`` now if every scope and the global cap admit them, else ``None``."""
        now = _now()
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
        """
        core = self.core
        now = _now()
        ticket = core.make_ticket(costs, priority, now, gated)
        if core.try_grant(ticket, now):
            return ticket  # no await, no yield to the event loop
        if self.max_waiters is not None and core.waiting >= self.max_waiters:
            core.discard(ticket)
            raise Overloaded(f"{core.waiting} requests are already waiting (max_waiters)")
        if core.enqueue(ticket, now):
            return ticket
        ticket.waker = anyio.Event()
        sleepers = self._sleepers
        if len(sleepers) > 2 * core.waiting + 16:  # drop waiters granted or gone meanwhile
            self._sleepers = sleepers = deque(t for t in sleepers if t.state == WAITING)
        sleepers.append(ticket)
        self._kick(now)
        try:
            if timeout is None:
                await self._wait(ticket)
            else:
                with anyio.fail_after(timeout):
                    await self._wait(ticket)
        except BaseException as exc:
            self._abandon(ticket)
            if isinstance(exc, TimeoutError) and ticket.state == CANCELLED:
                raise ThrottleTimeout(
                    f"no grant within {timeout} s for scopes {sorted(ticket.scopes)}"
                ) from None
            raise
        self._wake_stalled(ticket, _now())  # its grant may have spent a quota
        return ticket

    def record(
        self, lease: Ticket, feedback: Feedback, consumed: Mapping[str, float] | None
    ) -> None:
        """Give the feedback to the lease's scopes now (and reconcile ``consumed`` costs)."""
        now = _now()
        self.core.feedback(lease, feedback, now, consumed)
        if self.core.pending:
            self._kick(now)
        self._wake_stalled(lease, now)

    def release_nowait(self, lease: Ticket) -> bool:
        """Give the lease back (idempotent); always done at once here, without a clock
        read unless a waiter may be granted."""
        if self.core.release(lease):
            self._kick(_now())
        return True

    async def release(self, lease: Ticket) -> None:
        """Give the lease back (idempotent)."""
        self.release_nowait(lease)

    async def aclose(self) -> None:
        """Nothing to close."""

    # -- statistics ----------------------------------------------------------------

    def statistics(self) -> LimiterStatistics:
        """A frozen snapshot of the global cap and every scope (O(scopes))."""
        now = now_or_monotonic()
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
        now = now_or_monotonic()
        if ledger.policy.quota is not None:
            ledger.expire(now)
        return ScopeStatistics.from_ledger(ledger, now)

    # -- waiting -------------------------------------------------------------------

    async def _wait(self, ticket: Ticket) -> None:
        while ticket.state == WAITING:
            event = ticket.waker
            if self._timekeeper is ticket:
                deadline = self.core.next_wake()
                self._armed = deadline
                with anyio.CancelScope(deadline=deadline):
                    await event.wait()
                if ticket.state != WAITING:
                    return
                if event.is_set():
                    ticket.waker = anyio.Event()
                self._armed = -INF  # we re-read the next wake ourselves; no need to poke us
                self._kick(_now())
            else:
                await event.wait()
                if ticket.state == WAITING:
                    ticket.waker = anyio.Event()
            if ticket.state == WAITING:
                _raise_if_stalled(ticket, _now())

    def _wake_stalled(self, ticket: Ticket, now: float) -> None:
        """Wake the waiters of the scopes of ``ticket`` that now stall, to give up.

        Feedback (a ``Retry-After``) or a grant (the last of a quota) may have
        put a scope's reopening further ahead than its ``max_stall``: every
        waiter that needs such a scope (wherever it is queued) wakes, and
        raises :class:`~throttlekit.ScopeStalled` if it would stall too (see
        :meth:`_wait`). Whether a scope stalls is judged here for a request
        of ``ticket``'s cost, and again by each waiter for its own.
        """
        stalled = [
            ledger
            for ledger, cost in zip(ticket.ledgers, ticket.costs, strict=False)
            if ledger.in_line
            and ledger.policy.max_stall is not None
            and ledger.stalled(cost, now) is not None
        ]
        if not stalled:
            return
        # Every waiting ticket is among the sleepers, or is the timekeeper.
        waiters = [*self._sleepers, self._timekeeper]
        for waiter in waiters:
            if (
                waiter is not None
                and waiter.state == WAITING
                and any(ledger in stalled for ledger in waiter.ledgers)
            ):
                waiter.waker.set()

    def _abandon(self, ticket: Ticket) -> None:
        """The waiter of ``ticket`` is gone (cancelled or timed out): hand everything back."""
        self.core.cancel(ticket, _now())
        if self._timekeeper is ticket:
            self._timekeeper = None
        self._kick(_now())

    def _kick(self, now: float) -> None:
        """Grant what can be granted now and make sure one waiter holds the timer."""
        core = self.core
        for granted in core.dispatch(now):
            if granted is self._timekeeper:
                self._timekeeper = None
            granted.waker.set()
        if not core.waiting:
            self._timekeeper = None
            self._sleepers.clear()
            return
        wake = core.next_wake()
        keeper = self._timekeeper
        if keeper is not None and keeper.state == WAITING:
            if wake < self._armed:
                self._armed = wake
                keeper.waker.set()
            return
        self._timekeeper = None
        if wake == INF:
            return  # nothing time-based: a release will kick us
        sleepers = self._sleepers
        while sleepers:
            candidate = sleepers.popleft()
            if candidate.state == WAITING:
                self._timekeeper = candidate
                self._armed = -INF
                candidate.waker.set()
                return


def _raise_if_stalled(ticket: Ticket, now: float) -> None:
    """Raise :class:`~throttlekit.ScopeStalled` if a scope of the waiting ``ticket`` stalls."""
    for ledger, cost in zip(ticket.ledgers, ticket.costs, strict=False):
        if ledger.policy.max_stall is not None:
            stalled = ledger.stalled(cost, now)
            if stalled is not None:
                raise stalled
