"""The judge of overload errors: random ones, a struggling server's, or a rate limit's refusals."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from .._controller import SlotState, remember_outcome
from ._tuning import AdaptiveTuning

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["ErrorJudge"]

logger = logging.getLogger("throttlekit.adaptive")

INF = math.inf


class ErrorJudge(SlotState):
    """Tells random errors from overload and from a rate limit that answers with errors.

    Random errors come at any rate; a struggling server's grow with the
    rate; a rate limit's (nginx's ``limit_req`` answers 503 by default) come
    only above its edge. The judge counts recent outcomes (the overload
    share), whether errors stopped after a cut (then came back above it: a
    limit's), and while holding, whether a few errors are enough to widen
    the margin below the edge.
    """

    __slots__ = (
        "cut_random_at",
        "cut_share",
        "cut_tried",
        "errors_clean",
        "errors_limit",
        "fresh",
        "hold_cuts",
        "outcomes",
        "overload_share",
        "tuning",
        "widen_errors",
        "widen_from",
        "widen_off",
        "widen_share",
    )
    STATE = tuple(name for name in __slots__ if name not in ("tuning", "overload_share"))

    def __init__(self, tuning: AdaptiveTuning, overload_share: float) -> None:
        self.tuning = tuning
        self.overload_share = overload_share
        self.outcomes: list[int] = []  # 1 = overload, 0 = not; the last OUTCOMES
        # The first outcomes (up to ``recut_fewest``) of sends after the last
        # overload cut's echoes: the new rate's own (None: no cut yet).
        self.fresh: list[int] | None = None
        # Whether no overload error has come since the last overload cut (but
        # echoes of it), and whether such errors proved to be a rate limit's.
        self.errors_clean = False
        self.errors_limit = False
        self.hold_cuts = 0  # cuts for errors while holding since the last clean hold
        self.cut_share = 0.0  # the share of overload errors that cut (0: tried lower since)
        self.cut_tried = 0.0  # while a hold is tried lower: the rate held before (else 0)
        self.cut_random_at = -INF  # when errors last came below what got through
        # Errors while holding too few to cut on, counted since widen_from;
        # their share when they last widened the margin; whether held lower
        # they came as often (random ones: they widen it no more).
        self.widen_errors = 0
        self.widen_from = -INF
        self.widen_off = False
        self.widen_share = 0.0

    def __repr__(self) -> str:
        return f"<ErrorJudge {sum(self.outcomes)}/{len(self.outcomes)} overload>"

    def remember(self, overload: bool, *, fresh: bool = False) -> None:
        """One more outcome for the overload share (``fresh``: sent past a cut's echoes)."""
        remember_outcome(self.outcomes, 1 if overload else 0)
        if fresh and self.fresh is not None and len(self.fresh) < self.tuning.recut_fewest:
            self.fresh.append(1 if overload else 0)

    def cut_shallow(self) -> bool:
        """Whether the first answers past the last overload cut's echoes call for another cut.

        A limit that answers with errors refuses most sends of a rate cut
        too little (a leaky bucket at a few per second, its burst spent), where
        waiting for ``overload_fewest`` outcomes again costs seconds of refusals.
        """
        return self.fresh is not None and sum(self.fresh) >= self.tuning.recut_errors

    def share_below(self, share: float) -> bool:
        """Whether errors are under ``share`` of the recent outcomes."""
        outcomes = self.outcomes
        return sum(outcomes) < share * len(outcomes)

    def overloaded(self, *, opening: bool = False) -> bool:
        """Whether overload errors are the cutting share of enough recent outcomes.

        Or, in the ``opening`` search up, a run of them: a limit that
        answers with errors refuses most of a doubled rate's sends.
        """
        outcomes, fewest = self.outcomes, self.tuning.overload_fewest
        if len(outcomes) < fewest:
            return False
        share = self.overload_share
        run = sum(outcomes[-fewest:]) >= self.tuning.overload_run * share * fewest
        return (opening and run) or not self.share_below(share)

    def errors_high(self) -> bool:
        """Whether errors are too many for hung requests to be given their places back."""
        outcomes = self.outcomes
        share = self.tuning.hung_errors * self.overload_share
        return sum(outcomes) >= share * max(len(outcomes), 1)

    def new_edge(self) -> None:
        """Errors near the old edge say nothing of a new one."""
        self.widen_off, self.widen_share = False, 0.0
        self.widen_errors, self.widen_from = 0, -INF

    def probing(self) -> None:
        """A probe begins: the errors' share is measured anew, at the new rate."""
        self.hold_cuts = 0
        self.widen_share = 0.0

    def cut(self) -> None:
        """An overload cut: remember the share that cut, and watch whether errors stop."""
        outcomes = self.outcomes
        self.cut_share = sum(outcomes) / len(outcomes) if outcomes else 0.0
        self.cut_tried = 0.0
        self.outcomes, self.fresh = [], []
        self.errors_clean, self.errors_limit = True, False
        self.hold_cuts = 0

    def paired(self) -> bool:
        """Whether another error came among the last ``opening_pair`` outcomes (this one's too)."""
        return sum(self.outcomes[-self.tuning.opening_pair :]) >= 2

    def ended_run(self) -> bool:
        """Whether errors came only after a run of acceptances, enough of them and most since.

        A limit refuses once a search up passes its edge; random errors come
        anywhere, and seldom make most of the outcomes from the first of them
        (see ``opening_clean`` and ``opening_errors``).
        """
        outcomes, tuning = self.outcomes, self.tuning
        first = outcomes.index(1) if 1 in outcomes else len(outcomes)
        since = outcomes[first:]
        errors = sum(since)
        enough = errors >= tuning.opening_errors
        return first >= tuning.opening_clean and enough and 2 * errors >= len(since)

    def limit_found(self) -> None:
        """The errors so far were a limit's refusals: the overload share starts anew."""
        self.outcomes, self.fresh = [], None
        self.errors_limit = True

    def limit_refusal(self, *, echo: bool, status: int | None, searching: bool) -> bool:
        """Whether an error is a rate limit's refusal, as far as the errors so far show."""
        return (
            not echo
            and status is not None
            and (self.errors_limit or (self.errors_clean and searching))
        )

    def widened(
        self,
        scope: ScopeView,
        now: float,
        rate: float,
        fewer: float,
        margin: tuple[float, float],
    ) -> float | None:
        """An error while holding, too few of them to cut on: the new margin, if it widens.

        A 429 there would widen the margin (the edge may have read a stored
        burst, a request high), and so do these when a few come close
        together: at once to ``error_margin`` (or the edge's precision at a
        few per second, ``fewer``: the margin a request per horizon below
        it), since steps of a few errors each let the hold end first.
        Once held lower, a limit's refusals thin out and random errors come
        as often: then the margin is the headroom again and they widen it no
        more. ``margin`` is the margin now and the headroom. Errors that
        come so with the margin as wide already give it back unchanged:
        the caller holds no faster than what got through meanwhile.
        """
        tuning = self.tuning
        if self.widen_off:
            return None
        if now - self.widen_from > tuning.widen_span:
            self.widen_errors, self.widen_from = 0, now
        self.widen_errors += 1
        share = self.widen_errors / max(1.0, rate * (now - self.widen_from))
        if self.widen_errors < tuning.widen_fewest or share < tuning.widen_share:
            return None
        self.widen_errors, self.widen_from = 0, now
        if self.widen_share and share >= tuning.widen_random * self.widen_share:
            self.widen_off = True
            logger.debug("scope %s: errors as many held lower: random ones", scope.name)
            return margin[1]
        self.widen_share = share
        return max(margin[0], tuning.error_margin, fewer)
