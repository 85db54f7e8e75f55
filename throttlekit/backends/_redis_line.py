"""The Redis backend's waiters in one process: their line per scope, and release wake-ups.

Within a process, the waiters of a scope queue by priority, then arrival,
and only the first of them asks Redis. A first-in-line waiter sleeps for
what Redis told it (a release, or a delay's turn) or until a wake-up for its
scope is published on the release channel (one pub/sub subscription per
backend, made at the first wait and read by one of the waiting tasks: no
background task), whichever comes first.

Across processes, a full scope keeps a line of the processes that wait for
a slot, by when each first asked (a token per backend; a waiter told to
wait for time leaves it): a release wakes the first two of them only, its
message ``"<scope> <token>,<token>"``. Woken all at once, every process
asked Redis for the one slot freed (33 calls per grant with 32 processes).
A wake-up that finds its first waiter between two calls is kept for it;
one that finds none (it left unserved) is lost, which is why two are
woken, and the waiters of other processes find the slot at their next
look, within :data:`RELEASE_RECHECK`.

A write that cuts a scope's delay publishes ``"<scope> *"``: the turns
handed out at the old delay are void, and every process's first waiter asks
again (see :meth:`WaiterLine._released`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import anyio

from .._clock import now as _now
from .._errors import ThrottleTimeout
from ._redis_clients import ERRORS

__all__ = ["POLL_WITHOUT_PUBSUB", "RELEASE_RECHECK", "Waiter", "WaiterLine"]

Lease = TypeVar("Lease")

logger = logging.getLogger("throttlekit.backends.redis")

#: Longest wait for a release before looking again (a safety net: releases
#: normally wake the first two processes in line through pub/sub at once; a
#: wake-up meant for a process that left unserved is lost, and the slot
#: waits this long at most).
RELEASE_RECHECK: Final = 1.0
#: How often a waiter looks again when pub/sub is not permitted (ACLs).
POLL_WITHOUT_PUBSUB: Final = 0.05
#: Longest sleep on a time-based wait (quota that cannot fit until released).
_MAX_WAIT: Final = 60.0
#: What woke a waiter while its call to Redis was under way (``Waiter.woken_asking``).
_SLOT: Final = "slot"
_TURNS_CUT: Final = "turns cut"


def _timeout(costs: Mapping[str, float]) -> ThrottleTimeout:
    return ThrottleTimeout(f"no grant before the timeout for scopes {sorted(costs)}")


class Waiter:
    """One acquire() waiting in this process."""

    __slots__ = ("asking", "event", "priority", "queue", "seq", "turn", "woken", "woken_asking")

    def __init__(self, priority: int, seq: int) -> None:
        self.priority = priority
        self.seq = seq
        self.queue: str | None = None  # the scope whose line it stands in
        self.event: anyio.Event | None = None  # made when it sleeps
        self.woken = False
        self.asking = False  # whether its call to Redis is under way
        self.woken_asking = ""  # what woke it meanwhile: "", _SLOT or _TURNS_CUT
        self.turn: bytes | float = 0.0  # the last turn Redis gave it (Redis clock, ms; 0 = none)

    def __repr__(self) -> str:
        return f"<Waiter #{self.seq} priority={self.priority} in line {self.queue!r}>"

    def before(self, other: Waiter) -> bool:
        return self.priority > other.priority or (
            self.priority == other.priority and self.seq < other.seq
        )


class WaiterLine:
    """The lines of this process's waiters, one per scope, and the pub/sub wake-ups."""

    def __init__(
        self, client: Any, channel: str, token: str, location: str, subscribe_timeout: float
    ) -> None:
        self._client = client
        self._channel = channel
        self._token = token
        self._location = location
        self._subscribe_timeout = subscribe_timeout
        self._seq = itertools.count()
        self._ties = itertools.count()
        self._queues: dict[str, list[tuple[int, int, int, Waiter]]] = {}
        self._release_waiters: dict[Waiter, None] = {}
        self._listener: Waiter | None = None
        self._pubsub: Any = None
        self._pubsub_denied = False
        self._pubsub_lock: anyio.Lock | None = None
        self.waiting = 0

    def __repr__(self) -> str:
        return f"<WaiterLine waiting={self.waiting} scopes={len(self._queues)}>"

    def waiting_on(self, scope: str) -> int:
        """This process's waiters in ``scope``'s line."""
        return sum(1 for entry in self._queues.get(scope, ()) if entry[3].queue == scope)

    def idle(self) -> bool:
        """Nobody stands in any line."""
        return not self._queues

    async def wait_for_grant(
        self,
        costs: Mapping[str, float],
        priority: int,
        attempt: Callable[[Any], Awaitable[Lease | tuple[int, float, bool, Any]]],
        deadline: float,
    ) -> Lease:
        """Call ``attempt(turn)`` until it grants, waiting in line and as Redis says between.

        ``attempt`` returns a lease, or ``(index of the blocking scope, seconds
        to wait, whether it waits for a release, the turn Redis gave)``.

        :raises ThrottleTimeout: at ``deadline``.
        """
        seq = next(self._seq)
        self.waiting += 1
        waiter = Waiter(priority, seq)
        try:
            while True:
                ahead = self.blocker(costs, waiter)
                if ahead is not None:
                    with anyio.move_on_after(deadline - _now()):
                        await self.wait_in_line(waiter, ahead)
                        continue
                    raise _timeout(costs)
                if waiter.queue is None:
                    # Stand in line while asking, so that those who come during the
                    # round trip queue behind instead of all asking at once (Redis
                    # would hand each a turn, one delay after the other, and turns
                    # served early would leave the scope idle for the next to ask).
                    self.join(waiter, next(iter(costs)))
                waiter.asking, waiter.woken_asking = True, ""
                try:
                    result = await attempt(waiter.turn)
                finally:
                    waiter.asking = False
                if not isinstance(result, tuple):
                    return result
                index, wait, full, waiter.turn = result
                scope = list(costs)[index]
                self.join(waiter, scope)
                woken = waiter.woken_asking
                if woken == _TURNS_CUT:
                    waiter.turn = 0.0  # (it may have been handed out at the old delay)
                if self.top(scope) is not waiter or woken == _TURNS_CUT or (full and woken):
                    continue  # (behind another, or a release came during the call)
                if self._pubsub is None and not self._pubsub_denied:
                    try:
                        await self.subscribe(deadline)
                    except ERRORS.unavailable:
                        pass  # waits on the timer below; the next attempt notices
                    else:
                        if full:
                            continue  # releases reach us from now on: look again first
                if full:
                    wait = min(wait, RELEASE_RECHECK if self._pubsub else POLL_WITHOUT_PUBSUB)
                wake = _now() + min(wait, _MAX_WAIT)
                waiter.woken = False
                await self.wait_as_top(waiter, min(wake, deadline))
                if wake > deadline and not waiter.woken:
                    raise _timeout(costs)  # (no release or cut turns came first)
        finally:
            self.waiting -= 1
            self.leave(waiter)  # the next in line may try at once

    # -- the lines -------------------------------------------------------------------

    def top(self, scope: str) -> Waiter | None:
        heap = self._queues.get(scope)
        while heap:
            waiter = heap[0][3]
            if waiter.queue == scope:
                return waiter
            heapq.heappop(heap)
        if heap is not None:
            del self._queues[scope]
        return None

    def blocker(self, costs: Mapping[str, float], waiter: Waiter) -> str | None:
        """A scope where another waiter of this process goes first."""
        for scope in costs:
            top = self.top(scope)
            if top is not None and top is not waiter and top.before(waiter):
                return scope
        return None

    def join(self, waiter: Waiter, scope: str) -> None:
        if waiter.queue == scope:
            return
        self.leave(waiter)
        waiter.queue = scope
        entry = (-waiter.priority, waiter.seq, next(self._ties), waiter)
        heapq.heappush(self._queues.setdefault(scope, []), entry)

    def leave(self, waiter: Waiter) -> None:
        scope = waiter.queue
        if scope is None:
            return
        was_top = self.top(scope) is waiter
        waiter.queue = None
        if was_top:
            top = self.top(scope)
            if top is not None:
                self._wake(top)

    @staticmethod
    def _wake(waiter: Waiter) -> None:
        waiter.woken = True
        if waiter.event is not None:
            waiter.event.set()

    async def wait_in_line(self, waiter: Waiter, scope: str) -> None:
        """Stand in ``scope``'s line until nobody of this process is ahead."""
        self.join(waiter, scope)
        while True:
            top = self.top(scope)
            if top is None or top is waiter:
                return
            waiter.woken = False
            waiter.event = event = anyio.Event()
            await event.wait()

    async def wait_as_top(self, waiter: Waiter, deadline: float) -> None:
        """First in line: sleep until ``deadline`` or a wake-up for its scope (see _released)."""
        waiter.woken = False
        self._release_waiters[waiter] = None
        try:
            while not waiter.woken:
                now = _now()
                if now >= deadline:
                    return
                if self._listener is None and self._pubsub is not None:
                    await self._listen(waiter, deadline)
                    continue
                waiter.event = event = anyio.Event()
                with anyio.move_on_after(deadline - now):
                    await event.wait()
        finally:
            self._release_waiters.pop(waiter, None)

    # -- pub/sub -----------------------------------------------------------------------

    async def subscribe(self, deadline: float) -> None:
        """Subscribe to the release channel (within ``deadline``; raises if Redis is away)."""
        if self._pubsub_lock is None:
            self._pubsub_lock = anyio.Lock()
        async with self._pubsub_lock:
            if self._pubsub is not None or self._pubsub_denied:
                return
            pubsub = self._client.pubsub()  # (the client, or the backend's Nodes)
            bound = min(self._subscribe_timeout, deadline - _now())
            try:
                with anyio.fail_after(max(0.0, bound)):
                    await pubsub.subscribe(self._channel)
                    while True:
                        message = await pubsub.get_message(timeout=self._subscribe_timeout)
                        if message is not None and message.get("type") in (
                            "subscribe",
                            b"subscribe",
                        ):
                            break
            except ERRORS.response as exc:
                await self._close_pubsub(pubsub)
                if isinstance(exc, ERRORS.unavailable):
                    raise
                self._pubsub_denied = True
                logger.warning(
                    "Redis at %s refused SUBSCRIBE (%s); waiters look again every %g s instead",
                    self._location,
                    type(exc).__name__,
                    POLL_WITHOUT_PUBSUB,
                )
                return
            except BaseException:
                await self._close_pubsub(pubsub)
                raise
            self._pubsub = pubsub

    async def _listen(self, waiter: Waiter, deadline: float) -> None:
        """Read releases for every waiter of this process until ours comes or time is up."""
        pubsub = self._pubsub
        self._listener = waiter
        try:
            while not waiter.woken:
                remaining = deadline - _now()
                if remaining <= 0:
                    return
                try:
                    with anyio.fail_after(remaining + 0.1):
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=remaining
                        )
                except ERRORS.unavailable:
                    await self.drop_pubsub()
                    return
                except RuntimeError:  # (closed under us)
                    await self.drop_pubsub()
                    return
                if message is not None and message.get("type") in ("message", b"message"):
                    self._released(message.get("data"))
        finally:
            self._listener = None
            for other in self._release_waiters:
                if other is not waiter:
                    if other.event is not None:
                        other.event.set()  # take over the listening
                    break

    def _released(self, data: Any) -> None:
        """A message on the release channel: wake this process's first waiter if it is for it.

        ``"<scope> <token>,<token>"``: a release freed a slot of ``scope`` for
        the processes named. Their first waiter may wait for time (a delay's
        turn) since Redis put the process in line: woken, it asks once more,
        where waiting on would leave the slot freed for it idle.

        ``"<scope> *"``: a write cut ``scope``'s delay, and with it the turns
        handed out one old delay apart (``cut_turns`` in ``common.lua``): every
        process's first waiter gives its turn up and asks again. Sixteen
        processes kept Adaptive's 4/s start about 4 s without this.
        """
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        scope, _, tokens = text.rpartition(" ")
        cut = tokens == "*"
        if not cut and self._token not in tokens.split(","):
            return
        top = self.top(scope)
        if top is None:
            return  # (left unserved: lost, see the module)
        if top.asking:
            # (It looks again when the call returns, if Redis tells it to wait
            # for a release, or whatever it tells after a cut.)
            if top.woken_asking != _TURNS_CUT:
                top.woken_asking = _TURNS_CUT if cut else _SLOT
            return
        if cut:
            top.turn = 0.0
        self._wake(top)

    async def drop_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await self._close_pubsub(pubsub)

    @staticmethod
    async def _close_pubsub(pubsub: Any) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            try:
                await pubsub.aclose()
            except Exception:  # pragma: no cover - best effort on a broken connection
                logger.debug("closing the pub/sub connection failed", exc_info=True)
