"""The detector of a limit on requests in flight (nginx's ``limit_conn``), not a rate limit."""

from __future__ import annotations

import enum

from .._controller import SlotState
from ._sends import SendLog
from ._tuning import AdaptiveTuning

__all__ = ["InFlightLimit", "Verdict"]


class Verdict(enum.Enum):
    """What a refusal says of a limit on requests in flight."""

    NOTHING = "no such limit shown"
    FOUND = "refused at one number in flight each time, at rates that differ"
    KNOWN = "refused at or above the limit found: sent before the cap took hold"


class InFlightLimit(SlotState):
    """Refusals at one number in flight, at rates that differ, are a limit on requests in flight.

    A server that limits requests in flight refuses at the same count
    whatever the rate (which varies with its latency); a rate limit, at the
    same rate whatever the count. A refusal at a lower count disproves it.
    """

    __slots__ = ("count", "refusals", "tuning")
    STATE = ("count", "refusals")

    def __init__(self, tuning: AdaptiveTuning) -> None:
        self.tuning = tuning
        self.count: int | None = None  # the limit on requests in flight, once found
        self.refusals: list[list[float]] = []  # [in flight, rate] at the last refusals

    def __repr__(self) -> str:
        return f"<InFlightLimit count={self.count}>"

    def refused(self, flying: int, sent_at: float, log: SendLog) -> Verdict:
        """A refusal of a request sent at ``sent_at`` with ``flying`` others in flight."""
        tuning = self.tuning
        if self.count is not None:
            if flying < self.count:  # refused below the limit found: not (only) one
                self.count, self.refusals = None, []
                return Verdict.NOTHING
            return Verdict.KNOWN
        horizon = tuning.edge_horizon
        rate = log.measured(sent_at - horizon, sent_at, accepted=True) + flying
        refusals = self.refusals
        refusals.append([flying, rate])
        del refusals[: -tuning.inflight_refusals]
        counts = {count for count, _ in refusals}
        rates = [rate for _, rate in refusals]
        if (
            len(refusals) < tuning.inflight_refusals
            or len(counts) > 1
            or flying < tuning.inflight_fewest
            or max(rates) <= tuning.inflight_spread * min(rates)
        ):
            return Verdict.NOTHING
        self.count = flying
        return Verdict.FOUND

    def rates(self) -> str:
        """The rates of the refusals that found the limit, for the log."""
        return "/".join(f"{rate:.3g}" for _, rate in self.refusals)
