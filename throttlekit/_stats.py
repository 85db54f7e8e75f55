"""Frozen snapshots of a limiter's state."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from ._backoff import BackoffState

if TYPE_CHECKING:
    from ._ledger import ScopeLedger

__all__ = ["LimiterStatistics", "ScopeStatistics"]


@attrs.frozen(kw_only=True)
class ScopeStatistics:
    """One scope at one moment (times are on the limiter's clock).

    :param delay: the effective minimum seconds between sends now.
    :param concurrency: the effective concurrency now (``None`` = unlimited).
    :param in_flight: requests of this scope being sent now.
    :param waiting: requests waiting that need this scope.
    :param quota: the policy's quota per window (``None`` = no quota).
    :param quota_used: cost consumed in the current window.
    :param quota_left: cost still available in the window (``None`` = no quota).
    :param blocked_until: no send before this time (``-inf`` = not blocked).
    :param next_send_at: the earliest next send allowed by the delay.
    :param backoff_level: steps of backoff in force (0 = not backing off).
    :param last_signal: the last backoff signal (a status like ``"429"`` or an
        exception name), or ``None``.
    :param last_signal_at: when it arrived (``-inf`` = never).
    :param reason: why the delay is what it is, in words (``"policy"``,
        ``"backoff level 2 after 429"``, ``"autothrottle: latency 350 ms"``...).
    """

    name: str
    delay: float
    concurrency: int | None
    in_flight: int
    waiting: int
    quota: float | None
    quota_used: float
    quota_left: float | None
    blocked_until: float
    next_send_at: float
    backoff_level: int = 0
    last_signal: str | None = None
    last_signal_at: float = -math.inf
    reason: str = "policy"

    @classmethod
    def from_ledger(cls, ledger: ScopeLedger, now: float) -> ScopeStatistics:
        """Snapshot ``ledger`` at ``now``."""
        level, signal, signal_at = 0, None, -math.inf
        for controller in ledger.controllers:
            if isinstance(controller, BackoffState):
                level = controller.level
                signal, signal_at = controller.last_signal, controller.last_signal_at
        return cls(
            name=ledger.name,
            delay=ledger.delay,
            concurrency=ledger.concurrency,
            in_flight=ledger.in_flight,
            waiting=ledger.in_line,
            quota=ledger.policy.quota,
            quota_used=ledger.quota_used,
            quota_left=ledger.quota_left,
            blocked_until=ledger.blocked_until,
            next_send_at=ledger.next_send_at,
            backoff_level=level,
            last_signal=signal,
            last_signal_at=signal_at,
            reason=ledger.reason(now),
        )


@attrs.frozen(kw_only=True)
class LimiterStatistics:
    """The whole limiter at one moment.

    :param in_flight: requests holding a permit now.
    :param waiting: requests waiting for one.
    :param concurrency: the global cap (``None`` = unlimited).
    :param next_wake: when the limiter's timer fires next (``inf`` = not armed).
    :param scopes: per-scope statistics, by scope name.
    """

    in_flight: int
    waiting: int
    concurrency: int | None
    next_wake: float
    scopes: Mapping[str, ScopeStatistics]
