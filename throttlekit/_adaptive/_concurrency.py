"""The concurrency loop: how many requests the server serves at once without queueing them."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from .._controller import SlotState
from ._tuning import AdaptiveTuning

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["ConcurrencyLoop"]

logger = logging.getLogger("throttlekit.adaptive")

INF = math.inf


class ConcurrencyLoop(SlotState):
    """Vegas on round mean latencies against a windowed floor; places given back for hung requests.

    It compares the mean latency of each round of answers with the lowest
    recent round mean and estimates the requests queued at the server
    (``limit * (1 - floor / mean)``): the limit grows while that queue is
    small and shrinks when it is large, never growing while the scope does
    not use what it has. Requests that hang (failures after far longer than
    the latency) take no place of that limit for as long as they hung.
    """

    __slots__ = (
        "hung",
        "hung_for",
        "latency",
        "limit",
        "limit_growing",
        "round",
        "round_at",
        "round_busy",
        "rtt_epoch",
        "rtt_min",
        "rtt_min_at",
        "rtt_prev",
        "rtt_prev_at",
        "rtt_prev_rounds",
        "rtt_rounds",
        "tuning",
    )
    STATE = tuple(name for name in __slots__ if name != "tuning")

    def __init__(self, tuning: AdaptiveTuning, ceiling: int | None) -> None:
        self.tuning = tuning
        start = tuning.start_concurrency
        self.limit: int | None = min(start, ceiling) if ceiling is not None else start
        self.limit_growing = True  # Vegas slow start: double per round
        self.latency: float | None = None  # the moving mean latency of accepted requests
        # The arrival times of the hung failures of the last hung_for seconds
        # (as many hang now, by Little's law).
        self.hung: list[float] = []
        self.hung_for = 0.0
        self.round: list[float] = []  # latencies of the current round
        self.round_at = -INF  # when the current round began
        self.round_busy = False  # whether the scope used at least half its limit this round
        # The lowest round mean latency of this epoch and of the last, the
        # limit each was measured at, and how many round means each is the lowest of.
        self.rtt_min = self.rtt_min_at = INF
        self.rtt_prev = self.rtt_prev_at = INF
        self.rtt_epoch = -INF
        self.rtt_rounds = self.rtt_prev_rounds = 0

    def __repr__(self) -> str:
        return f"<ConcurrencyLoop limit={self.limit} hung={len(self.hung)}>"

    @property
    def concurrency(self) -> int | None:
        """The limit on requests in flight: the loop's, plus those that hang."""
        limit = self.limit
        return limit + len(self.hung) if limit is not None else None

    def hang(self, failed: bool, elapsed: float, now: float, *, errors_high: bool) -> None:
        """Count the requests in flight that hang, from the failures that hung.

        A request that fails after far longer than the latency (a client
        timeout of a request the server dropped) held a place the server did
        not serve, as TCP counts a segment past its timeout out of the pipe.
        Not while errors are high (``errors_high``): a server so overloaded
        that requests time out in its queue is to be backed off.
        """
        tuning = self.tuning
        hung = self.hung
        if failed and elapsed >= max(tuning.hung, tuning.hung_latencies * (self.latency or 0.0)):
            hung.append(now)
            self.hung_for = elapsed
        if hung:
            if errors_high:
                hung.clear()
            else:
                since = now - self.hung_for
                while hung and hung[0] <= since:
                    del hung[0]

    def cut(self, factor: float, in_flight: int) -> None:
        """Overload: the limit times ``factor``, and no more slow start."""
        limit = self.limit if self.limit is not None else max(1, in_flight)
        self.limit = max(1, int(limit * factor))
        self.limit_growing = False

    def cap(self, count: int) -> None:
        """A limit on requests in flight was found at ``count``: keep below it."""
        self.limit = min(self.limit or count, count)

    def sample(self, scope: ScopeView, latency: float, now: float, top: int) -> None:
        """An accepted answer's latency; ``top`` is the highest the limit may grow to."""
        if not math.isfinite(latency) or latency < 0:
            return
        mean = self.latency
        self.latency = (
            latency if mean is None else mean + self.tuning.latency_weight * (latency - mean)
        )
        if now - self.rtt_epoch >= self.tuning.rtt_epoch:
            self._next_epoch(now)
        limit = self.limit
        if limit is None:
            return
        if scope.in_flight - len(self.hung) >= limit / 2:
            self.round_busy = True
        if not self.round:
            self.round_at = now
        self.round.append(latency)
        size = len(self.round)
        tuning = self.tuning
        if size < max(tuning.round_fewest, limit) or (
            size < max(tuning.round_size, limit) and now - self.round_at < tuning.round_time
        ):
            return
        self._end_round(scope, limit, top)

    def _next_epoch(self, now: float) -> None:
        """Start an epoch of the floor.

        The epoch's floor replaces the older one unless every round of it
        had more in flight than that one's: then its latencies may be the
        scope's own queue (a floor risen so would let the limit grow on and
        on); the older floor stays until a round at a limit no higher
        measures again (the limit shrinks to it when the server has really
        slowed down).
        """
        if self.rtt_min == INF or self.rtt_min_at <= self.rtt_prev_at:
            self.rtt_prev, self.rtt_prev_at = self.rtt_min, self.rtt_min_at
            self.rtt_prev_rounds = self.rtt_rounds
        self.rtt_min, self.rtt_min_at, self.rtt_epoch = INF, INF, now
        self.rtt_rounds = 0

    def _end_round(self, scope: ScopeView, limit: int, top: int) -> None:
        """A round is complete: estimate the queue at the server and move the limit."""
        latencies = self.round
        size = len(latencies)
        mean = sum(latencies) / size
        spread = math.sqrt(sum((x - mean) ** 2 for x in latencies) / size)
        busy = self.round_busy
        self.round, self.round_busy = [], False
        self.rtt_rounds += 1
        if mean < self.rtt_min:
            self.rtt_min, self.rtt_min_at = mean, limit
        floor = min(self.rtt_min, self.rtt_prev)
        if mean <= 0 or floor == INF:
            return
        varied = spread >= self.tuning.varied * mean
        if varied:
            floor = self._corrected(floor, mean, spread, size)
        queue = limit * (1.0 - floor / mean)
        self.limit = self._resized(limit, queue, top, busy=busy, varied=varied)
        if self.limit != limit:
            logger.debug(
                "scope %s: latency %.3f s over %.3f s minimum (queue %.2f), concurrency %s -> %s",
                scope.name,
                mean,
                floor,
                queue,
                limit,
                self.limit,
            )

    def _corrected(self, floor: float, mean: float, spread: float, size: int) -> float:
        """The floor raised by the noise of the lowest of many round means (varied latencies).

        The lowest of ``n`` round means lies about sqrt(2 ln n) standard
        errors of one below what a round takes; read as a queue, that holds
        the limit low, and a lower limit makes more, smaller rounds, whose
        lowest lies lower still. At most ``floor_correction`` of the floor.
        """
        tuning = self.tuning
        rounds = max(self.rtt_rounds + self.rtt_prev_rounds, tuning.few_rounds)
        error = math.sqrt(2.0 * math.log(rounds)) * spread / math.sqrt(size)
        return min(mean, floor + min(error, tuning.floor_correction * floor))

    def _resized(self, limit: int, queue: float, top: int, *, busy: bool, varied: bool) -> int:
        """The limit after a round whose queue was ``queue``."""
        tuning = self.tuning
        low, high = tuning.queue_low, tuning.queue_high
        if not varied:
            # Steady latencies (a trustworthy floor): the thresholds shrink
            # for a server that serves few at once, where a queue of four is
            # five times its latency.
            serving = limit - queue
            low, high = min(low, tuning.few_low * serving), min(high, max(1.0, serving))
        if queue > high:
            self.limit_growing = False
            return max(1, limit - 1 if queue < 2 * high else int(limit * tuning.shrink))
        if queue < low and busy:
            return min(top, limit * 2 if self.limit_growing else limit + 1)
        if queue >= low:
            self.limit_growing = False
        return limit
