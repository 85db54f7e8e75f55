"""AutoThrottle: Scrapy's latency-driven delay, as a per-scope controller."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import attrs

from ._checks import non_negative, positive
from ._controller import SlotState

if TYPE_CHECKING:
    from ._controller import Feedback, ScopeView
    from ._policy import ScopePolicy

__all__ = ["AutoThrottle", "AutoThrottleState", "autothrottle_delay"]

logger = logging.getLogger("throttlekit.autothrottle")


def autothrottle_delay(
    old: float,
    latency: float,
    status: int,
    *,
    target_concurrency: float,
    min_delay: float,
    max_delay: float,
) -> float:
    """The next delay after a response, by Scrapy's AutoThrottle rules.

    The target is ``latency / target_concurrency``; the new delay is the mean
    of the old delay and the target, but never below the target; it is
    clamped to ``[min_delay, max_delay]``; and a non-200 response may only
    raise the delay, never lower it.
    """
    target = latency / target_concurrency
    new = max(target, (old + target) / 2.0)
    new = min(max(min_delay, new), max_delay)
    if status != 200 and new <= old:
        return old
    return new


@attrs.frozen(kw_only=True)
class AutoThrottle:
    """Latency-driven delay, number for number as Scrapy's AutoThrottle extension.

    A scope starts at ``max(policy delay, start_delay)``. After each response
    the delay moves toward ``latency / target_concurrency`` (see
    :func:`autothrottle_delay`), never below the policy delay nor above
    ``max_delay``. Responses recorded with ``adjust_delay=False`` (Scrapy's
    ``autothrottle_dont_adjust_delay`` meta) and failures without a response
    are ignored. It composes with :class:`Backoff`: the scope's delay is the
    larger of the two, so a server answering fast 429s slows the crawl down
    instead of speeding it up.

    :param start_delay: the initial delay in seconds. Default 5.0.
    :param max_delay: the highest delay in seconds. Default 60.0.
    :param target_concurrency: requests the scope should have in flight on
        average (> 0). Default 1.0.
    :param debug: log every adjustment at INFO (Scrapy's ``AUTOTHROTTLE_DEBUG``).

    Usage::

        ScopePolicy(delay=0.0, autothrottle=AutoThrottle(target_concurrency=2.0))
    """

    start_delay: float = attrs.field(default=5.0, validator=non_negative)
    max_delay: float = attrs.field(default=60.0, validator=positive)
    target_concurrency: float = attrs.field(default=1.0, validator=positive)
    debug: bool = False

    def controller(self, policy: ScopePolicy) -> AutoThrottleState:
        """Make the per-scope state for a scope with ``policy``."""
        return AutoThrottleState(self, policy)


class AutoThrottleState(SlotState):
    """The live AutoThrottle delay of one scope."""

    __slots__ = ("config", "delay", "latency", "reason")

    STATE = ("delay", "latency", "reason")
    concurrency = None
    blocked_until = -math.inf
    jitter = None
    replaces_policy = False
    due = math.inf  # sends change nothing

    def __init__(self, config: AutoThrottle, policy: ScopePolicy) -> None:
        self.config = config
        self.delay = max(policy.delay, config.start_delay)
        self.latency: float | None = None
        self.reason = f"autothrottle start delay {self.delay:g} s"

    def __repr__(self) -> str:
        return f"<AutoThrottleState delay={self.delay:g} latency={self.latency}>"

    def on_send(self, scope: ScopeView, now: float) -> None:
        return None

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        latency = feedback.latency
        status = feedback.status
        if latency is None or status is None or not feedback.adjust_delay:
            return
        if not math.isfinite(latency) or latency < 0:
            return
        config = self.config
        old = self.delay
        self.delay = autothrottle_delay(
            old,
            latency,
            status,
            target_concurrency=config.target_concurrency,
            min_delay=scope.policy.delay,
            max_delay=config.max_delay,
        )
        self.latency = latency
        self.reason = f"autothrottle: latency {latency * 1000:.0f} ms"
        if self.delay != old:
            logger.debug(
                "scope %s: autothrottle delay %.3f -> %.3f s (latency %.3f s, status %s)",
                scope.name,
                old,
                self.delay,
                latency,
                status,
            )
        if config.debug:
            logger.info(
                "slot: %(slot)s | conc:%(concurrency)2d | "
                "delay:%(delay)5d ms (%(delaydiff)+d) | "
                "latency:%(latency)5d ms | size:%(size)6d bytes",
                {
                    "slot": scope.name,
                    # Scrapy's "conc" counts the answered request among the slot's
                    # transfers; a response recorded after its permit's release
                    # (the limiter driven directly) is no longer in in_flight.
                    "concurrency": max(scope.in_flight, 1),
                    "delay": self.delay * 1000,
                    "delaydiff": (self.delay - old) * 1000,
                    "latency": latency * 1000,
                    "size": feedback.size or 0,
                },
            )
