"""One scope's Adaptive state: feeds each answer to the parts and combines what they decide."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from .._backoff import stated_pace
from .._knock import longest_reset, paced_by
from ._advance import advance
from ._overload import on_error
from ._parts import Parts
from ._response import SERVER_ERROR, Kind, classify, quota_spent
from ._spaced import judge_spacing
from ._throttle import on_throttle, refine
from ._window import keep_window, reopened

if TYPE_CHECKING:
    from .._controller import Feedback, ScopeView
    from ..headers import RateLimitInfo

__all__ = ["AdaptiveState"]

logger = logging.getLogger("throttlekit.adaptive")

INF = math.inf

#: The jitter of a scope paced at a measured limit: none.
_EVEN = (0.0, 0.0)


class AdaptiveState(Parts):
    """The live state of :class:`~throttlekit.Adaptive` for one scope (plain data by part).

    It feeds each answer to the parts in turn (the log, the detectors, the
    rate loop's deciders, the concurrency loop) and offers the scope what
    they decided: the rate as a delay, the concurrency loop's limit, the
    rate loop's block and reason.
    """

    __slots__ = ()
    replaces_policy = False
    due = INF  # it learns from feedback only (and so shares well through Redis)

    def __repr__(self) -> str:
        loop = self.rate_loop
        return (
            f"<AdaptiveState {loop.phase.value} rate={loop.rate:.3g}/s edge={loop.edge} "
            f"concurrency={self.concurrency}>"
        )

    @property
    def concurrency(self) -> int | None:
        """The limit on requests in flight: the concurrency loop's, plus those that hang."""
        return self.concurrency_loop.concurrency

    @property
    def jitter(self) -> tuple[float, float] | None:
        """No jitter while it paces a scope at a limit it measured (a limit counts even sends)."""
        loop = self.rate_loop
        return _EVEN if loop.edge is not None and loop.rate < INF else None

    @property
    def delay(self) -> float:
        """Seconds between sends for the current rate."""
        rate = self.rate_loop.rate
        return 0.0 if rate == INF else 1.0 / rate

    @property
    def blocked_until(self) -> float:
        """No send before this instant (a pause after a refusal, a closed server's wait)."""
        return self.rate_loop.blocked_until

    @property
    def reason(self) -> str:
        """What Adaptive does now, and why."""
        return self.rate_loop.reason

    def on_send(self, scope: ScopeView, now: float) -> None:
        return None

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        loop = self.rate_loop
        sent_at = feedback.sent_at if feedback.sent_at is not None else now
        if loop.phase_at is None:
            loop.phase_at = sent_at
        if self.closures.run_at is None:
            self.closures.begin(sent_at)
            loop.resumed_at = sent_at
        kind = classify(feedback)
        self.paused = feedback.paused
        info = feedback.rate_limit
        if info is not None:
            loop.longest_reset = longest_reset(info, loop.longest_reset)
            info = paced_by(info, loop.longest_reset)
        unexplained = self._read_quota(scope, feedback, info, kind, now)
        latency = self.concurrency_loop.latency or 0.0
        self.log.count(sent_at, accepted=kind is Kind.OK, horizon=loop.horizon, latency=latency)
        self.concurrency_loop.hang(
            kind is Kind.OVERLOAD and feedback.status is None,
            now - sent_at,
            now,
            errors_high=self.errors.errors_high(),
        )
        if kind is Kind.OK:
            self.inflight.accepted(sent_at, now, exact=scope.in_flight_exact)
            self.spacing.answered(now - sent_at)
            self._accepted(scope, sent_at, now)
        echo = loop.echo(sent_at)
        if not (kind is Kind.OVERLOAD and self.errors.errors_limit and echo):
            # (An echo of a limit's refusal counts with that refusal: the end
            # of a fixed window refuses a run of sends at once.)
            self.errors.remember(kind is Kind.OVERLOAD, fresh=not echo)
        if unexplained:
            wait = (info.retry_after if info is not None else None) or 0.0
            if sent_at > loop.cut_at:
                on_throttle(self, scope, sent_at, now, wait)
        elif kind is Kind.OVERLOAD:
            on_error(self, scope, feedback.status, sent_at, now)
        elif self._latency_sample(feedback):
            assert feedback.latency is not None
            self.concurrency_loop.sample(scope, feedback.latency, now, self._top(scope))
        if now >= loop.refine_at:
            refine(self, scope, now)
        judge_spacing(self, scope, now)
        advance(self, scope, now)
        if loop.long_window() and loop.holding():
            keep_window(loop, scope, self.log)

    def _read_quota(
        self,
        scope: ScopeView,
        feedback: Feedback,
        info: RateLimitInfo | None,
        kind: Kind,
        now: float,
    ) -> bool:
        """Read a quota the headers count; whether this is a refusal they do not explain.

        ``info`` is what of the headers paces the scope (a quota too coarse
        to pace by is set aside: :func:`~throttlekit._knock.paced_by`). A
        refusal with quota left (or none counted) is a limit the headers do
        not show: from then on the rate loop finds it.
        """
        loop = self.rate_loop
        remaining = info.remaining if info is not None else None
        counted = info is feedback.rate_limit  # (not set aside: its other budgets count too)
        unexplained = kind is Kind.THROTTLE and not quota_spent(feedback, remaining, counted)
        if unexplained:
            loop.headers_short = True
        elif (
            not loop.headers_short
            and info is not None
            and remaining is not None
            and info.reset is not None
        ):
            limit, window = info.limit, info.window
            rate = limit / window if limit and window else None
            near = info.reset <= self.config.tuning.stated_pace_within
            loop.stated_quota(scope, rate, stated_pace(info) if near else None, now)
        return unexplained

    def _accepted(self, scope: ScopeView, sent_at: float, now: float) -> None:
        """An accepted answer; after a closure, it tells a long window from a limit that moved."""
        if self.closures.accepted(sent_at, self.rate_loop.cut_at):
            reopened(self, scope, sent_at, now)

    @staticmethod
    def _latency_sample(feedback: Feedback) -> bool:
        """Whether the answer's latency measures the server's work (accepted, not an error)."""
        status = feedback.status
        return (
            feedback.latency is not None
            and status is not None
            and status < SERVER_ERROR
            and feedback.adjust_delay
        )

    def _top(self, scope: ScopeView) -> int:
        """The highest the concurrency loop may grow to: the policy's, or a limit found."""
        ceiling = scope.policy.concurrency
        top = ceiling if ceiling is not None else self.config.max_concurrency
        count = self.inflight.count
        return min(top, count) if count is not None else top
