"""The parts of one scope's Adaptive state, and their state as nested plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._closure import Closures
from ._concurrency import ConcurrencyLoop
from ._errors import ErrorJudge
from ._inflight import InFlightLimit
from ._rate import RateLoop
from ._sends import SendLog
from ._spacing import Spacing

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._policy import ScopePolicy
    from ._tuning import Config

__all__ = ["Parts"]


class Parts:
    """One scope's Adaptive parts; their state is one dict per part (see ``PARTS``)."""

    __slots__ = (
        "closures",
        "concurrency_loop",
        "config",
        "errors",
        "inflight",
        "log",
        "paused",
        "rate_loop",
        "spacing",
    )
    PARTS = ("closures", "concurrency_loop", "errors", "inflight", "log", "rate_loop", "spacing")

    def __init__(self, config: Config, policy: ScopePolicy) -> None:
        tuning = config.tuning
        self.config = config
        self.log = SendLog(tuning)
        self.rate_loop = RateLoop(config)
        self.closures = Closures(tuning, config.max_hold)
        self.errors = ErrorJudge(tuning, config.overload_share)
        self.inflight = InFlightLimit(tuning)
        self.spacing = Spacing(config)
        self.concurrency_loop = ConcurrencyLoop(tuning, policy.concurrency)
        #: Of the answer being judged: this process's last long pause before
        #: its send (``Feedback.paused``); not state, so not in ``PARTS``.
        self.paused: tuple[float, float] | None = None

    def get_state(self) -> dict[str, Any]:
        """Each part's state, by part."""
        return {name: getattr(self, name).get_state() for name in self.PARTS}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore the parts' states written by :meth:`get_state`."""
        for name in self.PARTS:
            if name in state:
                getattr(self, name).set_state(state[name])
