"""Who wakes when: the waiters of one limiter and its single timer, for either driver.

Sans-IO like the scheduler: every method takes ``now``. A waiter is a
:class:`~throttlekit._scheduler.Ticket` whose ``waker`` is the driver's
event (``anyio.Event`` or ``threading.Event``: anything with ``set()`` and
``is_set()``). One waiter at a time, the *timekeeper*, sleeps with a timeout
to the scheduler's next wake; the others sleep until their grant. So waiting
costs no CPU and nobody polls.
"""

from __future__ import annotations

import math
from collections import deque

from ._scheduler import WAITING, Scheduler, Ticket

__all__ = ["Waiters", "raise_if_stalled"]

INF = math.inf


class Waiters:
    """The sleeping waiters of one scheduler, and which of them holds the timer.

    :ivar timekeeper: the waiter that sleeps until the next wake (``None``: nobody).
    :ivar armed: the wake the timekeeper sleeps until (``-inf``: it re-reads it itself).
    """

    __slots__ = ("armed", "core", "sleepers", "timekeeper")

    def __init__(self, core: Scheduler) -> None:
        self.core = core
        self.timekeeper: Ticket | None = None
        self.armed = INF
        self.sleepers: deque[Ticket] = deque()

    def __repr__(self) -> str:
        return (
            f"<Waiters sleeping={len(self.sleepers)} timekeeper={self.timekeeper!r} "
            f"armed={self.armed:g}>"
        )

    def add(self, ticket: Ticket, now: float) -> None:
        """``ticket`` (queued, its ``waker`` set up) is about to sleep; the timer is seen to."""
        sleepers = self.sleepers
        if len(sleepers) > 2 * self.core.waiting + 16:  # drop waiters granted or gone meanwhile
            self.sleepers = sleepers = deque(t for t in sleepers if t.state == WAITING)
        sleepers.append(ticket)
        self.kick(now)

    def kick(self, now: float) -> None:
        """Grant what can be granted now and make sure one waiter holds the timer."""
        core = self.core
        for granted in core.dispatch(now):
            if granted is self.timekeeper:
                self.timekeeper = None
            granted.waker.set()
        if not core.waiting:
            self.timekeeper = None
            self.sleepers.clear()
            return
        wake = core.next_wake()
        keeper = self.timekeeper
        if keeper is not None and keeper.state == WAITING:
            if wake < self.armed:
                self.armed = wake
                keeper.waker.set()
            return
        self.timekeeper = None
        if wake == INF:
            return  # nothing time-based: a release will kick us
        sleepers = self.sleepers
        while sleepers:
            candidate = sleepers.popleft()
            if candidate.state == WAITING:
                self.timekeeper = candidate
                self.armed = -INF
                candidate.waker.set()
                return

    def arm(self, ticket: Ticket) -> float:
        """The deadline ``ticket`` sleeps until: the next wake if it keeps the timer, else inf."""
        if self.timekeeper is not ticket:
            return INF
        deadline = self.core.next_wake()
        self.armed = deadline
        return deadline

    def woke(self, ticket: Ticket, now: float) -> None:
        """``ticket`` woke still waiting; if it keeps the timer, dispatch and re-arm."""
        if self.timekeeper is ticket:
            self.armed = -INF  # it re-reads the next wake itself; no need to poke it
            self.kick(now)

    def abandon(self, ticket: Ticket, now: float) -> None:
        """The waiter of ``ticket`` is gone (cancelled, timed out): hand everything back."""
        self.core.cancel(ticket, now)
        if self.timekeeper is ticket:
            self.timekeeper = None
        self.kick(now)

    def wake_stalled(self, ticket: Ticket, now: float) -> None:
        """Wake the waiters of the scopes of ``ticket`` that now stall, to give up.

        Feedback (a ``Retry-After``) or a grant (the last of a quota) may have
        put a scope's reopening further ahead than its ``max_stall``: every
        waiter that needs such a scope (wherever it is queued) wakes, and
        raises :class:`~throttlekit.ScopeStalled` if it would stall too (see
        :func:`raise_if_stalled`). Whether a scope stalls is judged here for a
        request of ``ticket``'s cost, and again by each waiter for its own.
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
        for waiter in [*self.sleepers, self.timekeeper]:
            if (
                waiter is not None
                and waiter.state == WAITING
                and any(ledger in stalled for ledger in waiter.ledgers)
            ):
                waiter.waker.set()


def raise_if_stalled(ticket: Ticket, now: float) -> None:
    """Raise :class:`~throttlekit.ScopeStalled` if a scope of the waiting ``ticket`` stalls."""
    for ledger, cost in zip(ticket.ledgers, ticket.costs, strict=False):
        if ledger.policy.max_stall is not None:
            stalled = ledger.stalled(cost, now)
            if stalled is not None:
                raise stalled
