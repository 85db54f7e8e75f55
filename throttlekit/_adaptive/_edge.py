"""Placing a measured edge: confirm or replace the one known, and choose the hold below it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._phase import Event, Phase
from ._rate import RateLoop

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["set_edge"]

logger = logging.getLogger("throttlekit.adaptive")


def set_edge(
    loop: RateLoop,
    scope: ScopeView,
    edge: float,
    sent: float,
    wait: float,
    now: float,
    pause: float,
    phase: Phase,
    *,
    own: bool = False,
) -> bool:
    """A refusal in ``phase`` measured the server's ``edge``: hold below it, so long.

    ``sent``: the rate sent, ``wait``: told by the server, ``pause``: decided already, ``own``:
    the client's own pause explains it. Returns whether the edge is new (not a confirmation).
    """
    risen, proved = loop.risen_from, loop.risen_to
    if phase is Phase.START and risen is not None and (edge <= proved or loop.near(edge, proved)):
        _climb(loop, scope, sent, now, pause)
        return False
    held = not own and _held_long(loop, edge, phase, wait, now)
    edge, hold_for, confirmed = _confirm(loop, edge, wait, now, phase, own=own)
    loop.hold_for = _hold(loop, edge, hold_for, wait, now, confirmed=confirmed)
    loop.edge, loop.edge_held = edge, confirmed
    loop.target = edge * (1.0 - loop.margin)
    loop.pause_for_excess(sent, edge, now, pause)
    # A confirmed edge is known: resume at the target; a new one from below it.
    restart = loop.config.tuning.new_edge_restart
    loop.rate = loop.target if confirmed else min(loop.target, edge * restart)
    at, dropped = _resume(loop, now, wait, dropped=confirmed and held, own=confirmed and own)
    loop.enter(
        Event.EDGE,
        at,
        f"throttled at {sent:.3g}/s, edge {edge:.3g}/s{dropped} (a rate over "
        f"{loop.horizon:.3g} s), holding {loop.hold_for:g} s",
    )
    logger.debug(
        "scope %s: throttled at %.3f/s, edge %.3f/s (%s%s; a rate over %.3g s), rate -> %.3f/s, "
        "hold %g s",
        scope.name,
        sent,
        edge,
        "confirmed" if confirmed else "new",
        dropped,
        loop.horizon,
        loop.rate,
        loop.hold_for,
    )
    return not confirmed


def _resume(
    loop: RateLoop, now: float, wait: float, *, dropped: bool, own: bool
) -> tuple[float, str]:
    """When the climb to the target starts, and what the log adds if the limit ``dropped``.

    Resumed at the target, a limit that dropped to half refuses again within
    the window, and that refusal's wait is a second one: the scope resumes
    at ``drop_cut`` of it, held so from when the window has let go of the
    sends before the refusal, for ``drop_horizons``. A confirmation the
    client's ``own`` pause explains resumes at the target.
    """
    at = max(now, loop.blocked_until)
    if own:
        return at, ", after a pause of this process"
    if not dropped:
        return at, ""
    tuning = loop.config.tuning
    loop.rate = loop.target * tuning.drop_cut
    at = max(at, now + wait, now + loop.horizon) + tuning.drop_horizons * loop.horizon
    return at, ", held long: it may have dropped"


def _held_long(loop: RateLoop, edge: float, phase: Phase, wait: float, now: float) -> bool:
    """Whether a refusal (told ``wait``) counted the edge after it held ``drop_held`` horizons.

    Counted at the edge held below, unrefused for that long: the window held
    what the old limit let through. Not a count at the pace held (sends
    jostled, :func:`_jostled`), nor where the server's window is longer than
    the edges' horizon (it told a longer wait): such a window's count is not
    its limit, and two of its windows at half would cost minutes.
    """
    tuning = loop.config.tuning
    horizon, phase_at, old = loop.horizon, loop.phase_at, loop.edge
    return (
        phase is Phase.HOLD
        and old is not None
        and loop.near(edge, old)
        and phase_at is not None
        and not loop.long_window()
        and wait <= horizon
        and now - phase_at >= tuning.drop_held * horizon
    )


def _confirm(
    loop: RateLoop, edge: float, wait: float, now: float, phase: Phase, *, own: bool
) -> tuple[float, float, bool]:
    """Whether ``edge`` confirms the known one; the edge, and the hold it starts from.

    The count varies by a request with how sends cross the second's
    boundary: within that it confirms the edge, and the edge stays what the
    server has let through. An edge a search up found confirms none. A
    confirmation that the client's ``own`` pause explains widens no margin.
    """
    risen, proved = loop.risen_from, loop.risen_to
    old, hold_for = loop.edge, loop.hold_for
    if phase is Phase.CLIMB and risen is not None and loop.rate <= proved:
        # Refused climbing no faster than the probe had gone: what it proved
        # was a burst the server had stored: back at the old edge.
        edge, phase = risen, Phase.PROBE
    confirmed = stored = False
    if phase not in (Phase.START, Phase.CLIMB):
        loop.risen_from = None
        if risen is not None and loop.near(edge, risen):
            # Back at the edge from before the rise: the server had only
            # stored a burst (a token bucket refills while the rate is held
            # below it, and a probe drains it); the old edge is confirmed.
            old, hold_for, confirmed, stored = risen, loop.risen_hold, True, True
        else:
            confirmed = old is not None and (
                loop.near(edge, old) or _jostled(loop, edge, wait, phase)
            )
    if confirmed:
        assert old is not None
        edge = max(edge, old)
    if confirmed and not stored and not own and phase in (Phase.RECOVER, Phase.HOLD):
        loop.failed_margin = max(loop.failed_margin, loop.margin)
        loop.margin = _bisected(loop, _widened(loop, edge, wait))
    elif confirmed and not stored and phase is Phase.PROBE and loop.rate <= edge:
        # A probe refused before it passed the edge: the narrower margin it
        # began at does not hold; back to the one the hold before it held at
        # (each probe cost a refusal more, to widen it again while holding).
        loop.margin = max(loop.margin, loop.held_margin)
    elif confirmed and not stored and phase is Phase.PROBE:
        loop.margin = _bisected(loop, loop.margin)
    if not confirmed:
        loop.failed_margin = 0.0
    if old is not None and loop.edge_held and _dropped(loop, edge, old):
        loop.moved_at = now
    return edge, hold_for, confirmed


def _dropped(loop: RateLoop, edge: float, old: float) -> bool:
    """Whether ``edge``, below ``old`` that had held, says the limit dropped (and may rise back).

    Not when it is about what the last rise's probe proved, or above (the
    rise was a token bucket's stored burst, spent: the bucket refills while
    held below its rate, and a probe drains it). Taken for a drop, it made
    the holds short for a minute, each probe found the stored burst again
    and each search up fell back as far: a bucket of 5/s and 10 stored was
    refused 66 times in five minutes, 28 now. Not on a long window, whose
    edge a fixed window's turn counts high: clock-aligned 50 per 10 s went
    from 2.2 to 3.2 % refused with the slower probing.
    """
    proved = old if loop.long_window() else min(old, loop.risen_to or old)
    return edge < loop.config.tuning.moved * proved


def _jostled(loop: RateLoop, edge: float, wait: float, phase: Phase) -> bool:
    """Whether a refusal below an edge that held counted the pace held: sends jostled.

    Held below the edge, a refusal that counts about the rate held (less
    than the edge by more than a request) says that the sends reached the
    server less evenly than they left, not where its limit is: the edge
    kept is the highest count that confirmed it, and on a loaded machine
    arrivals move by tens of ms, so a count of 9 at a sliding 10/s (whose
    edge read 11) took the scope to 8/s for a minute. The margin widens.
    Only where the server's window is the horizon (a longer window's count
    is not its limit), and once past a request below the edge: a second
    such refusal is a new edge. Only at the target: a rate held lower for a
    limit that may have dropped is refused at about itself by that limit.
    """
    old = loop.edge
    return (
        phase in (Phase.RECOVER, Phase.HOLD)
        and loop.edge_held
        and old is not None
        and edge < old
        and wait <= loop.horizon
        and loop.margin <= loop.one_fewer(old)
        and loop.near(edge, loop.rate)
        and loop.near(loop.rate, loop.target)
    )


def _widened(loop: RateLoop, edge: float, wait: float) -> float:
    """The margin below a confirmed ``edge`` after a refusal (told ``wait``) while holding.

    The sends reach the server less evenly than they leave: the margin
    doubles (up to ``max_margin``), and narrows again per hold that passes
    without a refusal. Where the server's window is the horizon (it told no
    longer wait), one request per horizon below the edge
    (:meth:`RateLoop.one_fewer`) is a step of its own: a count of whole
    requests cannot tell that limit from the edge (HAProxy's period counter
    lets 11 through a sliding second at a limit of 10). From the headroom
    the margin stops there on its way up; from a margin already widened (a
    second refusal at the edge) it goes at least there, doubling if that is
    wider: doubling alone went from 8 % to 16 % below 11/s, 92 % of what
    HAProxy allows, after three refusals. A longer window's count is not
    its limit, and its refusals need the wider steps.
    """
    wider = 2.0 * loop.margin
    fewer = loop.one_fewer(edge)
    if wait <= loop.horizon and loop.margin < fewer:
        wider = max(wider, fewer) if loop.margin > loop.config.headroom else min(wider, fewer)
    return min(loop.config.tuning.max_margin, wider)


def _bisected(loop: RateLoop, margin: float) -> float:
    """``margin``, or halfway between the widest one refused while holding and one that held.

    A margin no wider than one a refusal found too narrow while holding is
    refused again; doubling from it overshoots the one that held: nginx's
    5 r/s ``burst=5 nodelay`` counts 6, and its scope went between 13 %
    (5.2/s, refused within seconds) and 26 % (4.4/s, 89 %) below it for
    five minutes. Halving the span per refusal ends within
    ``margin_resolution`` of the limit, at the margin that held. Not on a
    longer window, where each such refusal costs a window's wait, and whose
    count is not its limit (a fixed 20 per 10 s, read 2.16/s, went through
    6 % and 7 % refused to the 8 % that held: 20 refusals in five minutes,
    16 without).
    """
    failed, held = loop.failed_margin, loop.held_margin
    if loop.long_window() or not held > failed or failed < margin <= held:
        return margin  # no span between the two, or the margin within it
    if held - failed <= loop.config.tuning.margin_resolution:
        return max(held, margin)
    return (failed + held) / 2.0


def _climb(loop: RateLoop, scope: ScopeView, sent: float, now: float, pause: float) -> None:
    """The search up after a rise was refused no higher than the probe had proved.

    It doubles the rate, and a leaky bucket refuses its first early send
    while the second before it holds the old pace: the limit lies above
    what the probe proved. Climb on from there as a probe does.
    """
    proved = loop.risen_to
    loop.leaky = True
    loop.edge = proved
    loop.target = proved * (1.0 - loop.margin)
    loop.pause_for_excess(sent, proved, now, pause)
    loop.rate = loop.target
    loop.enter(
        Event.CLIMB,
        max(now, loop.blocked_until),
        f"throttled at {sent:.3g}/s as soon as it searched up: a leaky bucket, "
        f"climbing from {loop.target:.3g}/s",
    )
    logger.debug(
        "scope %s: throttled at %.3f/s searching up, about the %.3f/s proved: "
        "a leaky bucket, climbing",
        scope.name,
        sent,
        proved,
    )


def _hold(
    loop: RateLoop, edge: float, hold_for: float, wait: float, now: float, *, confirmed: bool
) -> float:
    """How long to hold below ``edge`` before probing.

    Longer per confirmation of the same edge, and long enough that a
    probe's cost (one server-imposed wait) stays small; but for a while
    after the limit moved, every ``moved_hold`` of ``hold`` seconds (it may
    move back), and no sooner than ``moved_sends`` sends apart. Never
    shorter than the server's window: a probe before the window has let go
    of the last one's sends would be judged by them. At most ``max_hold``,
    or a few windows of a long one, or ``max_hold`` sends at a slow edge
    (each failed probe costs a refusal: one per window, or per few sends).
    """
    config = loop.config
    tuning = config.tuning
    as_sends = config.max_hold * tuning.slow_edge / edge  # (seconds: max_hold sends)
    longest = max(config.max_hold, tuning.long_window_holds * loop.horizon, as_sends)
    if now - loop.moved_at <= config.max_hold:
        hold = max(tuning.moved_hold * config.hold, tuning.moved_sends / edge)
    else:
        hold = min(longest, hold_for * 2) if confirmed else config.hold
        hold = max(hold, wait / tuning.probe_cost)
    return min(longest, max(hold, loop.horizon))
