"""Frozen snapshots of a limiter's state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

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

    @classmethod
    def from_ledger(cls, ledger: ScopeLedger) -> ScopeStatistics:
        return cls(
            name=ledger.name,
            delay=ledger.delay,
            concurrency=ledger.concurrency,
            in_flight=ledger.in_flight,
            waiting=ledger.waiting,
            quota=ledger.policy.quota,
            quota_used=ledger.quota_used,
            quota_left=ledger.quota_left,
            blocked_until=ledger.blocked_until,
            next_send_at=ledger.next_send_at,
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
