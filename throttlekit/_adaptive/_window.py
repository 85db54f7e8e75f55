"""Long windows: read one when a closed server opens again, hold within it, keep to its room."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._parts import Parts
from ._phase import Event
from ._sends import SendLog, at_most, others_in_flight, whole

if TYPE_CHECKING:
    from .._controller import ScopeView
    from ._rate import RateLoop

__all__ = ["keep_window", "long_window", "reopened"]

logger = logging.getLogger("throttlekit.adaptive")


def reopened(parts: Parts, scope: ScopeView, sent_at: float, now: float) -> None:
    """A server closed through a pause accepts again: a long window, one held, or a move.

    Closed for longer than it had been open (or at the first limit a search
    up met), the run read the window. Closed only by the echoes of the last
    cut (a window that counts refusals too, HAProxy's, still held the
    probe's sends and then the echoes), or for less than the long window
    known (a fixed window a probe spent early frees up at its end), the
    edge that cut measured stands, or what the window that let go took.
    Otherwise a limit moved or a server was down: search up again.
    """
    loop, closures = parts.rate_loop, parts.closures
    window = closures.long_window(sent_at)
    if window is not None:
        long_window(loop, scope, *window, now)
        return
    long = loop.long_window()
    within = long and closures.within(loop.horizon, sent_at)
    if loop.holding() and (closures.echoes or within):
        if not (within and _fixed_window(parts, scope, sent_at, now)):
            loop.say("open again within the window the cut measured: holding below its edge")
            logger.debug("scope %s: open again within the cut's window: holding", scope.name)
        return
    # The knocks measured nothing: search up from the rate they left.
    loop.search_again(now, f"open again, searching up from {loop.rate:.3g}/s")
    logger.debug("scope %s: open again after a closure: searching up", scope.name)


def _fixed_window(parts: Parts, scope: ScopeView, sent_at: float, now: float) -> bool:
    """Whether the window that let go of the cut's sends at ``sent_at`` was a fixed one.

    A fixed window's count over the horizon at a probe's refusal holds the
    end of the window before too (100 per 60 s read 2.4/s, not 1.67/s).
    The window that ends now began a horizon ago: if it took, from then to
    the cut, what the long window was read with, it is a fixed window
    (:meth:`Closures.fixed_window`), and that is its edge, confirmed. Not
    below an edge a second refusal confirmed: HAProxy's 10 per 10 s, read
    15.3 s long from knocks it counted, took 10 in that span by chance at
    1/s, and was held at 65 % for a minute.
    """
    loop, closures = parts.rate_loop, parts.closures
    horizon, edge = loop.horizon, loop.edge
    if edge is None or loop.edge_held:
        return False
    took = len(parts.log.accepted_between(sent_at - horizon, closures.closed_at))
    if at_most(edge * horizon, took) or not closures.fixed_window(took):
        return False
    long_window(loop, scope, horizon, closures.window_took, now, held=True)
    return True


def long_window(
    loop: RateLoop,
    scope: ScopeView,
    window: float,
    accepted: float,
    now: float,
    *,
    held: bool = False,
) -> None:
    """The server's window is ``window`` seconds, in which it accepted ``accepted``.

    The average rate over it is the edge (``held``: confirmed); edges are
    counted, probes judged and echoes told over it. A confirmed edge is
    held for a window before probing, and at least ``hold``; one read off
    the knocks is a floor (the window ended before the knock that found it
    open), probed after one window: held for ``hold``, HAProxy's 15 per
    3 s, read 5.1 s long, sent at 80 % of its rate until well past 20 s.
    """
    config = loop.config
    edge = accepted / window
    loop.edge, loop.edge_held = edge, held
    loop.target = edge * (1.0 - loop.margin)
    loop.rate = min(loop.target, edge * config.tuning.new_edge_restart)
    loop.hold_for = min(config.max_hold, max(config.hold, window) if held else window)
    loop.horizon = window
    loop.enter(
        Event.LONG_WINDOW,
        now,
        f"closed for a long window: a window of {window:.3g} s, edge {edge:.3g}/s, "
        f"holding {loop.hold_for:g} s",
    )
    logger.debug(
        "scope %s: closed for a long window of %.1f s: %.3f/s over it", scope.name, window, edge
    )


def keep_window(loop: RateLoop, scope: ScopeView, log: SendLog) -> None:
    """Below the edge of a long window, send only as it lets go of earlier sends.

    The rate alone keeps a sliding window at its limit for a whole window
    after a probe went above it (new sends replace the probe's only as
    fast as they leave): so while recovering and holding, a send waits
    until the window (the acceptances of the last one, and the others in
    flight: the answer that asks is in the log already) has room.
    """
    edge, horizon = loop.edge, loop.horizon
    if edge is None:
        return
    frees = log.window_frees(others_in_flight(scope), whole(edge * horizon), horizon)
    if frees is not None:
        loop.block(frees)
