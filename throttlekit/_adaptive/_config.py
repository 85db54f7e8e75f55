"""The user's configuration of Adaptive."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .. import _pauses
from .._checks import above_zero_below_one, at_least_one, positive
from ._tuning import AdaptiveTuning

if TYPE_CHECKING:
    from .._policy import ScopePolicy
    from ._state import AdaptiveState

__all__ = ["Adaptive"]


@attrs.frozen(kw_only=True)
class Adaptive:
    """Find and hold what a server allows: its rate limit and its capacity.

    Give a scope a ceiling (``ScopePolicy(concurrency=16, delay=0, ...)``)
    and Adaptive finds how fast the server lets it go, without the refusals
    a fixed guess costs. Two loops, each driven by the signal it can trust:
    a **rate loop** that measures the *edge* of a rate limit from what the
    server accepted before a refusal (a 429, an error that tells a wait, or
    a 503 that proves to be a limit's), holds just below it and probes
    upward now and then; and a **concurrency loop** that keeps the requests
    in flight where latency shows no queue at the server. Random errors do
    not move it; a share of overload errors cuts both. When the server's
    headers count its quota, they pace the scope instead. The algorithm,
    its phases and what moves between them are described in the
    controllers page of the docs.

    The policy is the ceiling: the scope's delay is the larger of the
    policy's and Adaptive's, its concurrency the smaller. ``Retry-After``
    and rate-limit headers are honoured by the scope's :class:`Backoff`
    (which then only reads headers). While it paces a scope at a limit it
    measured, the policy's jitter is not applied.

    :param start_rate: requests per second at the start (> 0). Default 4.0.
    :param headroom: how far below the measured edge to hold, as a fraction
        (0 < h < 1). Default 0.02.
    :param hold: seconds to hold below a newly found edge before probing;
        doubled per confirmation of the same edge, up to ``max_hold``. Default 10.0.
    :param max_hold: the longest hold in seconds. Default 60.0.
    :param overload_share: the share of overload errors among the last 40
        outcomes (at least 10) that cuts rate and concurrency (0 < s < 1). Default 0.25.
    :param overload_cut: the factor of that cut (0 < f < 1). Default 0.7.
    :param max_concurrency: the highest concurrency it grows to when the
        policy sets none. Default 256.
    :param tuning: the inner constants (:class:`AdaptiveTuning`), each
        documented with the reason for its value; for tests and benchmarks.

    Usage::

        ScopePolicy(concurrency=16, delay=0, slot_delay=0, adaptive=Adaptive())
    """

    start_rate: float = attrs.field(default=4.0, validator=positive)
    headroom: float = attrs.field(default=0.02, validator=above_zero_below_one)
    hold: float = attrs.field(default=10.0, validator=positive)
    max_hold: float = attrs.field(default=60.0, validator=positive)
    overload_share: float = attrs.field(default=0.25, validator=above_zero_below_one)
    overload_cut: float = attrs.field(default=0.7, validator=above_zero_below_one)
    max_concurrency: int = attrs.field(default=256, validator=at_least_one)
    tuning: AdaptiveTuning = attrs.field(
        factory=AdaptiveTuning, validator=attrs.validators.instance_of(AdaptiveTuning)
    )

    def __attrs_post_init__(self) -> None:
        if self.hold > self.max_hold:
            raise ValueError(f"hold ({self.hold!r}) must not exceed max_hold ({self.max_hold!r})")
        _pauses.watch()  # (a refusal the client's own pause explains is not the server's)

    def controller(self, policy: ScopePolicy) -> AdaptiveState:
        """Make the per-scope state for a scope with ``policy``."""
        from ._state import AdaptiveState

        return AdaptiveState(self, policy)
