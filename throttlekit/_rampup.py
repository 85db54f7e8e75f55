"""Rampup: probe for more throughput until the server pushes back, then settle."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import attrs

from ._checks import at_least_one, check_number, non_negative, positive
from ._controller import SlotState

if TYPE_CHECKING:
    from ._backoff import Backoff
    from ._controller import Feedback, ScopeView
    from ._policy import ScopePolicy

__all__ = ["Rampup", "RampupState"]

logger = logging.getLogger("throttlekit.rampup")

#: Each rung faster multiplies the delay by this (until ``min_delay``).
_DELAY_STEP = 0.8


def _target(value: Any) -> tuple[int, int]:
    if isinstance(value, bool):
        raise TypeError(f"target must be an int or a (low, high) pair, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"target must be >= 0, got {value!r}")
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        low, high = value
        if (
            isinstance(low, bool)
            or isinstance(high, bool)
            or not isinstance(low, int)
            or not isinstance(high, int)
        ):
            raise TypeError(f"target pair must hold ints, got {value!r}")
        if not 0 <= low <= high:
            raise ValueError(f"target pair needs 0 <= low <= high, got {value!r}")
        return (low, high)
    raise TypeError(f"target must be an int or a (low, high) pair, got {value!r}")


@attrs.frozen(kw_only=True)
class Rampup:
    """Find the fastest rate a server accepts, aiming at a few backoff signals per window.

    Meant for pay-per-request APIs (web scraping APIs and the like) where
    idle capacity is wasted money. The scope moves along a ladder of speeds:
    first the delay shrinks by a fifth per rung from the policy's down to
    ``min_delay``, then the concurrency grows by ``concurrency_factor`` up to
    ``max_concurrency``. At the end of each ``window`` it counts the backoff
    signals (the scope's :class:`Backoff` codes and exceptions):

    * fewer than ``target`` (or its low end): one rung faster;
    * more than ``target`` (or its high end): one rung slower, at once
      when the count passes ``3 * high + 2`` before the window ends;
    * within the target: stay.

    It remembers the fastest rung that was too fast and the fastest that was
    fine, and moves halfway between them, so it settles instead of
    oscillating; after three calm windows next to the rung that was too
    fast, it forgets that rung and probes again (servers change).
    ``Retry-After``/``RateLimit`` headers are still honoured, but the
    scope's backoff does not step the delay while rampup drives it.

    :param target: backoff signals wanted per window: an int, or a
        ``(low, high)`` range. Default 1 (Scrapy's ``RAMPUP_BACKOFF_TARGET``).
    :param window: seconds per evaluation window. Default 60.0.
    :param min_delay: the lowest delay rampup goes to. Default 0.0.
    :param max_concurrency: the highest concurrency rampup goes to. Default 256.
    :param concurrency_factor: concurrency growth per rung (> 1). Default 1.5.

    Usage::

        ScopePolicy(concurrency=4, delay=0.5, rampup=Rampup(target=(1, 3)))
    """

    target: tuple[int, int] = attrs.field(default=(1, 1), converter=_target)
    window: float = attrs.field(default=60.0, validator=positive)
    min_delay: float = attrs.field(default=0.0, validator=non_negative)
    max_concurrency: int = attrs.field(default=256, validator=at_least_one)
    concurrency_factor: float = attrs.field(default=1.5)

    @concurrency_factor.validator
    def _check_factor(self, attribute: attrs.Attribute[Any], value: object) -> None:
        check_number("concurrency_factor", value, minimum=1.0, strict=True)

    def controller(self, policy: ScopePolicy, backoff: Backoff) -> RampupState:
        """Make the per-scope state for a scope with ``policy``; ``backoff`` classifies signals."""
        return RampupState(self, policy, backoff)


class RampupState(SlotState):
    """The live rampup position of one scope."""

    __slots__ = (
        "_backoff",
        "_bad",
        "_calm",
        "_good",
        "_signals",
        "_window_start",
        "concurrency",
        "config",
        "delay",
        "reason",
        "rung",
    )

    STATE = tuple(name for name in __slots__ if name not in ("config", "_backoff"))
    #: The ledger uses this controller's delay and concurrency instead of the policy's.
    replaces_policy = True
    blocked_until = -math.inf
    jitter = None

    def __init__(self, config: Rampup, policy: ScopePolicy, backoff: Backoff) -> None:
        self.config = config
        self._backoff = backoff
        self.rung = 0
        self._good: int | None = None
        self._bad: int | None = None
        self._calm = 0
        self._signals = 0
        self._window_start: float | None = None
        self.delay, self.concurrency = self._speed(policy, 0)
        self.reason = "rampup: starting at the policy"

    def __repr__(self) -> str:
        return (
            f"<RampupState rung={self.rung} delay={self.delay:g} "
            f"concurrency={self.concurrency} good={self._good} bad={self._bad}>"
        )

    @property
    def due(self) -> float:
        """When a send ends the current window (and evaluates it)."""
        start = self._window_start
        return -math.inf if start is None else start + self.config.window

    def _speed(self, policy: ScopePolicy, rung: int) -> tuple[float, int | None]:
        """Delay and concurrency of ``rung`` (0 = the policy; negative = slower)."""
        config = self.config
        base_delay = policy.delay
        base_concurrency = policy.concurrency
        if rung <= 0:
            slower = max(base_delay, 0.05) * (2.0 ** (-rung)) if rung else base_delay
            return min(slower, 300.0), base_concurrency
        delay = base_delay
        steps = rung
        while steps and delay > config.min_delay:
            delay *= _DELAY_STEP
            if delay < max(config.min_delay, 0.001):
                delay = config.min_delay
            steps -= 1
        if base_concurrency is None:
            return delay, None
        concurrency = base_concurrency
        for _ in range(steps):
            concurrency = min(
                config.max_concurrency,
                max(concurrency + 1, math.ceil(concurrency * config.concurrency_factor)),
            )
        return delay, concurrency

    def on_send(self, scope: ScopeView, now: float) -> bool:
        return self._tick(scope, now)

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        self._tick(scope, now)
        if self._backoff.is_signal(feedback):
            self._signals += 1
            if self._signals > 3 * self.config.target[1] + 2:
                # Far past the target already: slow down now rather than
                # hammering the server for the rest of the window.
                self._evaluate(scope, now)

    def _tick(self, scope: ScopeView, now: float) -> bool:
        if self._window_start is None:
            self._window_start = now
            return False
        if now - self._window_start < self.config.window:
            return False
        self._evaluate(scope, now)
        return True

    def _evaluate(self, scope: ScopeView, now: float) -> None:
        policy = scope.policy
        low, high = self.config.target
        signals = self._signals
        rung = self.rung
        old = (self.delay, self.concurrency)
        if signals > high:
            self._bad = rung if self._bad is None else min(self._bad, rung)
            if self._good is not None and self._good >= rung:
                self._good = None
            target = rung - 1
            if self._good is not None and self._good < rung - 1:
                target = (rung + self._good) // 2
            self.rung = target
            self._calm = 0
        elif signals < low:
            self._good = rung if self._good is None else max(self._good, rung)
            target = rung + 1
            if self._bad is not None:
                if self._bad <= rung + 1:
                    target = rung
                    self._calm += 1
                    if self._calm >= 3:
                        self._bad += 1  # forget the edge: probe again
                        self._calm = 0
                else:
                    target = max(rung + 1, (rung + self._bad) // 2)
            if self._speed(policy, target) == self._speed(policy, rung) and target > rung:
                target = rung  # top of the ladder
            self.rung = target
        self.delay, self.concurrency = self._speed(policy, self.rung)
        self._signals = 0
        self._window_start = now
        self.reason = f"rampup rung {self.rung}: {signals} signals in the last window"
        if (self.delay, self.concurrency) != old:
            logger.debug(
                "scope %s: rampup %s signals/window, delay %.3f -> %.3f s, concurrency %s -> %s",
                scope.name,
                signals,
                old[0],
                self.delay,
                old[1],
                self.concurrency,
            )
