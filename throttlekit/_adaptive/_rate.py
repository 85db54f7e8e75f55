"""The rate loop's state: the edge a refusal measured, the target held below it, and the phase."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from .._controller import SlotState
from ._phase import Event, Phase, next_phase
from ._sends import at_most

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._controller import ScopeView
    from ._tuning import Config

__all__ = ["RateLoop"]

logger = logging.getLogger("throttlekit.adaptive")

INF = math.inf


class RateLoop(SlotState):
    """What the server's rate limit is believed to be, and where the scope's rate is relative to it.

    A refusal measures the *edge* (what the server accepted just before
    it); the rate then climbs back to a *target* ``margin`` below the edge,
    holds there for ``hold_for`` seconds and probes upward. It never moves
    by itself: the deciders (refusals, errors, time) call it.
    """

    __slots__ = (
        "blocked_until",
        "config",
        "cut_at",
        "edge",
        "edge_held",
        "failed_margin",
        "headers_short",
        "held_margin",
        "hold_for",
        "horizon",
        "leaky",
        "longest_reset",
        "margin",
        "moved_at",
        "phase",
        "phase_at",
        "rate",
        "reason",
        "refine_at",
        "refine_for",
        "refine_phase",
        "refine_wait",
        "resumed_at",
        "risen_firm",
        "risen_from",
        "risen_hold",
        "risen_to",
        "target",
    )
    STATE = tuple(name for name in __slots__ if name != "config")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.rate = config.start_rate  # requests per second (inf = no opinion)
        self.phase = Phase.START
        self.phase_at: float | None = None
        self.edge: float | None = None  # the last measured accepted rate at a throttle
        self.edge_held = False  # whether a second refusal confirmed it
        self.target = INF  # the rate held below the edge
        self.margin = config.headroom  # how far below the edge the target is
        self.held_margin = config.headroom  # the margin the last hold passed at unrefused
        self.failed_margin = 0.0  # the widest refused while holding below this edge
        self.hold_for = config.hold
        self.moved_at = -INF  # when the limit last dropped
        # The edge and hold before the limit last seemed to rise (whether that
        # edge was firm, not a long window's floor), until the search up that
        # followed found where it is; and the rate the probe then proved,
        # until a hold passes.
        self.risen_from: float | None = None
        self.risen_hold, self.risen_firm, self.risen_to = 0.0, False, 0.0
        self.horizon = config.tuning.edge_horizon  # the server's window, as far as shown
        self.cut_at = -INF  # requests sent before this are part of the last cut
        self.resumed_at = INF  # when sending resumed after the last pause (inf: not yet)
        self.blocked_until = -INF
        self.headers_short = False  # refused with quota left: the headers miss a limit
        self.leaky = False  # a search up was refused at once: a leaky bucket's sign
        self.longest_reset = 0.0  # the longest de-facto reset seen (its headers' scale)
        # When to measure the edge again, for a refusal sent at refine_for:
        # once the requests in flight then have answered (a slow server's).
        self.refine_at = INF
        self.refine_for = -INF
        self.refine_wait = 0.0
        self.refine_phase = Phase.START
        self.reason = f"adaptive: starting at {self.rate:g}/s"

    def __repr__(self) -> str:
        return f"<RateLoop {self.phase.value} rate={self.rate:.3g}/s edge={self.edge}>"

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self.phase, self.refine_phase = Phase(self.phase), Phase(self.refine_phase)

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state["phase"], state["refine_phase"] = self.phase.value, self.refine_phase.value
        return state

    def enter(self, event: Event, at: float, reason: str | None = None) -> None:
        """Move to the phase ``event`` leads to, from ``at``; say why when ``reason`` is given."""
        self.phase, self.phase_at = next_phase(self.phase, event), at
        if reason is not None:
            self.say(reason)

    def say(self, reason: str) -> None:
        """What Adaptive does now, and why (the scope's ``reason``)."""
        self.reason = f"adaptive: {reason}"

    def holding(self) -> bool:
        """Whether the rate is at (or climbing back to) the target below a known edge."""
        return self.phase in (Phase.RECOVER, Phase.HOLD)

    def long_window(self) -> bool:
        """Whether the server's window, as far as shown, is longer than the edge's horizon."""
        return self.horizon > self.config.tuning.edge_horizon

    def below_new_edge(self) -> bool:
        """Whether the rate is held below an edge that no second refusal has confirmed."""
        return self.holding() and not self.edge_held

    def block(self, until: float) -> None:
        """No send before ``until``."""
        self.blocked_until = max(self.blocked_until, until)

    def resumed(self) -> float:
        """When sending resumed after the last pause: a told wait's end, or a block set since."""
        return max(self.resumed_at, self.blocked_until)

    def echo(self, sent_at: float) -> bool:
        """Sent while the server's window still held the sends from before the last cut.

        Not once a search up or a probe began after the cut: its sends go
        past what the window held, and their refusals are its own.
        """
        phase_at = self.phase_at
        searching = self.phase in (Phase.START, Phase.CLIMB, Phase.PROBE)
        if searching and phase_at is not None and sent_at >= phase_at > self.cut_at:
            return False
        return sent_at - self.cut_at < self.horizon

    def overcounted(self, sent_at: float, now: float) -> bool:
        """Whether an echo of a new edge's cut may show the edge over-counted; then slow down.

        Sent below the edge after the window let go of what went out above
        it, and refused: a sliding window still holding a search's last
        sends, or a token bucket's stored burst counted as a rate. A restart
        step slower until the horizon ends, where the next refusal counts
        the edge again; after a rise from a firm edge, back at that edge.
        """
        edge, risen = self.edge, self.risen_from
        start = max(self.cut_at, self.blocked_until)
        if edge is None or not self.below_new_edge() or sent_at < start:
            return False
        if risen is not None and self.risen_firm:
            self.edge, self.edge_held, self.hold_for = risen, True, self.risen_hold
            self.risen_from = None
            self.target = risen * (1.0 - self.margin)
            self.rate = min(self.rate, self.target)
            reason = f"refused below the edge {edge:.3g}/s the rise had counted: a stored burst"
        else:
            tuning = self.config.tuning
            floor = edge * tuning.new_edge_restart ** (1 + tuning.overcount_steps)
            self.rate = max(min(self.rate, floor), self.rate * tuning.new_edge_restart)
            reason = f"refused below the edge {edge:.3g}/s: slower until it is counted again"
        self.enter(Event.EDGE, max(now, self.cut_at + self.horizon), reason)
        return True

    def near(self, edge: float, old: float) -> bool:
        """Whether ``edge`` confirms ``old``: within a request over the horizon (and a few %).

        A request more over the horizon, read back from the counts, is a
        hair off ``1 / horizon`` in floating point, either way (11 against 10
        over 10.2 s was a new edge).
        """
        tuning = self.config.tuning
        bound = max(tuning.near_share * old, min(1.0 / self.horizon, tuning.near_cap * old))
        return at_most(abs(edge - old), bound)

    def one_fewer(self, edge: float) -> float:
        """The margin that holds one request per horizon below ``edge``, with the headroom.

        A count of whole requests cannot tell a limit that much lower from
        the edge: HAProxy's period counter lets 11 through a sliding second
        at a limit of 10, and a count across a fixed window's boundary reads
        a request more.
        """
        count = edge * self.horizon
        if count <= 1.0:
            return self.config.tuning.max_margin
        return 1.0 - (1.0 - 1.0 / count) * (1.0 - self.config.headroom)

    def pause_for_excess(self, sent: float, edge: float, now: float, pause: float) -> None:
        """Block until the server's window has let go of what went out above the edge.

        A window longer than the horizon may count the refused send too (not
        counted, HAProxy's ``http_req_rate(20s)`` refused the next few: 74 %).
        """
        horizon = self.horizon
        excess = (sent - edge) * horizon
        excess += excess > 0 and self.long_window()
        if excess > 0:
            pause = max(pause, min(horizon, excess / edge))
        if pause:
            self.block(now + pause)

    def measure_later(self, sent: float, estimate: float, now: float, wait: float) -> None:
        """A slow server refused at ``sent`` per second: count the edge once its answers are in.

        Until then, no faster than the target held so far nor than ``estimate``.
        """
        self.pause_for_excess(sent, estimate, now, 0.0)
        self.rate = min(self.rate, self.target, estimate)
        self.enter(Event.SLOW_REFUSAL, now, f"throttled at {sent:.3g}/s, measuring the edge")
        self.resumed_at = max(now + wait, self.blocked_until)

    def stated_quota(
        self, scope: ScopeView, rate: float | None, pace: float | None, now: float
    ) -> None:
        """The server counts its quota in headers (remaining, reset): they pace the scope.

        The scope's backoff keeps no more in flight than remains and waits
        for the reset; the rate loop stands aside until a refusal the headers
        do not explain, pacing ``pace`` seconds apart (from
        :func:`~throttlekit._backoff.stated_pace`). ``rate``: the quota per
        second when the headers state its window.
        """
        reason = None
        if self.phase is not Phase.STATED or self.edge != rate:
            shown = "with no window stated" if rate is None else f"of {rate:.3g}/s"
            logger.debug("scope %s: the server counts a quota %s", scope.name, shown)
            reason = f"the server's headers count its quota ({shown})"
        self.edge = rate
        self.target = INF if rate is None else rate
        self.rate = INF if pace is None else 1.0 / pace
        self.enter(Event.QUOTA_STATED, now, reason)

    def cap(self, count: int, now: float) -> None:
        """A limit of ``count`` requests in flight was found: the rate loop stands aside."""
        self.rate = self.target = INF
        self.edge = None
        self.cut_at = now
        self.enter(
            Event.IN_FLIGHT_LIMIT,
            now,
            f"the server allows {count} in flight: a limit on requests in flight",
        )

    def spaced(self, interval: float, accepted: float, now: float) -> None:
        """A leaky bucket without burst: send ``interval`` apart (``accepted``: least it took)."""
        self.edge, self.edge_held = 1.0 / accepted, False
        self.rate = self.target = 1.0 / interval
        if self.phase is not Phase.SPACED:
            self.enter(
                Event.SPACED,
                now,
                f"refused sooner after an acceptance than every gap it accepted: a leaky bucket "
                f"without burst, accepting {self.edge:.3g}/s",
            )

    def overload(self, sent: float, got: float, now: float) -> None:
        """Cut for overload from the rate sent (``sent`` per second, 0 if unknown): hold lower.

        ``got``: the rate of those sends that got through; when it is a
        small share, the cut goes just below it
        (:attr:`~throttlekit.AdaptiveTuning.overload_got`).
        """
        config = self.config
        tuning = config.tuning
        base = min(self.rate, sent) if sent > 0 else self.rate
        rate = base * config.overload_cut
        if 0 < got < tuning.overload_got * sent:
            rate = min(rate, got * (1.0 - tuning.error_margin))
        self.rate = max(tuning.min_rate, rate)
        self.edge = None
        self.target = self.rate
        self.hold_for = config.hold
        self.cut_at = self.resumed_at = now
        self.enter(Event.OVERLOAD, now)

    def search_again(self, now: float, reason: str) -> None:
        """Forget the edge (a limit that moved, a server that was down): search up again."""
        self.edge, self.edge_held, self.risen_from, self.moved_at = None, False, None, -INF
        self.enter(Event.REOPENED, now, reason)
