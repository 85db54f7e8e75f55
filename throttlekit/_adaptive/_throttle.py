"""Deciding on a refusal: an echo, a knock, a limit on requests in flight, or an edge to measure."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from ._edge import set_edge
from ._inflight import Verdict
from ._parts import Parts
from ._paused import own_pause
from ._phase import Phase
from ._sends import others_in_flight, whole
from ._window import long_window

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["in_flight_limit", "on_throttle", "refine"]

logger = logging.getLogger("throttlekit.adaptive")


def on_throttle(
    parts: Parts, scope: ScopeView, sent_at: float, now: float, wait: float, *, error: bool = False
) -> None:
    """A refusal of a request sent at ``sent_at`` (the server told to wait ``wait`` seconds).

    ``error``: an overload error taken for a limit's refusal. A random one
    cannot be told from it, so it never counts an edge between refusals.
    """
    loop, closures = parts.rate_loop, parts.closures
    closed = closures.closed_since(loop.cut_at)
    flying = others_in_flight(scope)  # (about) accepted before the refusal, not answered yet
    closures.still_closed(flying)
    long = loop.long_window()
    past_echoes = closures.refused(parts.config.tuning.echo_runs) and long
    if loop.phase is Phase.SPACED:
        if _note_gap(parts, sent_at, now, wait):
            # The leaky bucket's (not an echo, nor a limit on requests in flight).
            loop.cut_at = sent_at
            return
    elif loop.echo(sent_at) and not past_echoes:
        _echo(parts, scope, sent_at, now, wait, closed=closed)
        return
    if in_flight_limit(parts, scope, flying, sent_at, now).handled:
        return
    _note_gap(parts, sent_at, now, wait)
    if _told_wait(parts, scope, flying, sent_at, now, wait) or _second_refused(
        parts, scope, flying, sent_at, now, wait
    ):
        return
    flying, slow = _flying_in_horizon(parts, scope, flying, sent_at)
    sent, edge = _measure(parts, sent_at, flying, slow=slow, recount=not error)
    pause, loop.cut_at = 0.0, now
    closures.cut()
    if closed:
        pause = closures.close(loop.cut_at, now)
        edge = min(edge, (loop.edge or edge) * parts.config.overload_cut)
    else:
        closures.open(first=loop.phase is Phase.START and loop.risen_from is None)
        if slow:
            _measure_later(parts, sent_at, sent, edge, now, wait)
            return
    config = parts.config
    if edge <= 0:
        edge = max(min(loop.rate, sent) * config.overload_cut, config.tuning.min_estimate)
    own = own_pause(loop, parts.paused)
    if set_edge(loop, scope, edge, sent, wait, now, pause, loop.phase, own=own):
        parts.errors.new_edge()
    if pause:  # (closed: the knock goes when the pause ends, not later at the rate cut)
        loop.rate = max(loop.rate, 1.0 / pause)
    loop.resumed_at = max(now + wait, loop.blocked_until)


def _measure_later(
    parts: Parts, sent_at: float, sent: float, edge: float, now: float, wait: float
) -> None:
    """A slow server's refusal: its edge is counted once what was in flight has answered."""
    loop, tuning = parts.rate_loop, parts.config.tuning
    latency = parts.concurrency_loop.latency
    assert latency is not None
    loop.refine_at = now + tuning.refine_latencies * latency
    loop.refine_for, loop.refine_wait, loop.refine_phase = sent_at, wait, loop.phase
    loop.measure_later(sent, max(edge, tuning.min_estimate), now, wait)


def _second_refused(
    parts: Parts, scope: ScopeView, flying: int, sent_at: float, now: float, wait: float
) -> bool:
    """Whether the refusal is of the opening's second request; then search on slower.

    Refused before a horizon of sending, with one request accepted in it,
    and no wait told: a window of one per horizon, or a leaky bucket whose
    interval is longer than the opening's first gap (nginx's ``rate=3r/s``
    refuses a request sent 0.25 s after the first). One per horizon is the
    count, but it is not a bucket's rate, and held as an edge it kept nginx
    at 2 or 3 r/s near 1/s for half a minute. The search goes on from below
    it in a leaky bucket's steps, and the next refusal, with a horizon of
    sending before it, counts the edge (a window of one costs that refusal).
    """
    loop, log = parts.rate_loop, parts.log
    run_at, horizon = parts.closures.run_at, loop.horizon
    if (
        wait
        or loop.leaky
        or loop.phase is not Phase.START
        or loop.edge is not None
        or run_at is None
        or sent_at - run_at >= horizon
    ):
        return False
    if len(log.accepted_between(sent_at - horizon, sent_at)) + flying != 1:
        return False
    loop.leaky = True
    loop.rate = parts.config.tuning.new_edge_restart / horizon
    loop.phase_at = loop.cut_at = now
    loop.say(f"refused after one request: searching up slower, from {loop.rate:.3g}/s")
    logger.debug(
        "scope %s: refused after one request, %.3f s into sending: searching up slower from %.3f/s",
        scope.name,
        sent_at - run_at,
        loop.rate,
    )
    return True


def _flying_in_horizon(
    parts: Parts, scope: ScopeView, flying: int, sent_at: float
) -> tuple[int, bool]:
    """Of ``flying`` requests in flight, about how many were sent within the horizon; slow?

    A slow server's were sent over the last ``latency`` seconds: about this
    share of them within the horizon, until they answer. A shared backend
    counts leases, grants reserved ahead of their send among them: of
    those, only what the pace before the refusal puts in flight over a
    latency (Little's law) were sent before it.
    """
    latency, horizon = parts.concurrency_loop.latency, parts.rate_loop.horizon
    if latency is None or not flying:
        return flying, False
    if latency > parts.config.tuning.slow_latency * horizon:
        return round(flying * min(1.0, horizon / latency)), True
    if not scope.in_flight_exact:
        pace = len(parts.log.between(sent_at - horizon, sent_at)) / horizon
        flying = min(flying, round(pace * latency))
    return flying, False


def refine(parts: Parts, scope: ScopeView, now: float) -> None:
    """Count the edge of a slow server's refusal, now that what was in flight then has answered."""
    loop, log = parts.rate_loop, parts.log
    loop.refine_at = math.inf
    sent_at = loop.refine_for
    horizon = loop.horizon
    edge = log.measured(sent_at - horizon, sent_at, accepted=True)
    if edge <= 0:
        return
    sent = log.measured(sent_at - horizon, sent_at, accepted=False)
    if set_edge(loop, scope, edge, sent, loop.refine_wait, now, 0.0, loop.refine_phase):
        parts.errors.new_edge()


def _note_gap(parts: Parts, sent_at: float, now: float, wait: float) -> bool:
    """Give a refusal to the leaky bucket's judge (see :func:`judge_spacing`); whether it was.

    Not one that tells a wait: such a limit is waited out, not searched at
    every gap. Nor one once a window longer than the horizon was shown: a
    leaky bucket never closes for one, and a period counter's refusals after
    a look for a rise come at gaps it accepts (HAProxy's 6 per 2 s, read as
    a leaky bucket, then as a window, fell back to the edge from before).
    """
    loop = parts.rate_loop
    if wait or loop.long_window():
        return False
    if not own_pause(loop, parts.paused):  # (a gap the client's own pause shortened)
        parts.spacing.refused(sent_at, now, stepped=loop.leaky and loop.phase is Phase.START)
    return True


def overcounted(parts: Parts, scope: ScopeView, sent_at: float, now: float) -> None:
    """An echo sent after its cut's pause: a new edge over-counted, or a stored burst spent.

    See :meth:`RateLoop.overcounted`. Below any edge, new or confirmed: once
    ``spent_fewest`` sends since sending resumed have answered and at least
    half were refused (or ``spent_share`` of twice as many), no faster than
    those accepted came. A bucket whose stored burst is spent lets through
    what it refills, and held above its rate refuses a share that grows
    with how far (every other send at twice); a window refuses every send
    until it frees up, and then none. A confirmed edge that counted such a
    burst is held as far below it as what got through (nginx's ``rate=5r/s
    burst=5 nodelay`` confirmed 10/s again at each look for a rise, held
    at 9.6/s, and four sends were refused before this rule came back).
    """
    loop = parts.rate_loop
    if loop.overcounted(sent_at, now):
        logger.debug("scope %s: %s", scope.name, loop.reason.removeprefix("adaptive: "))
    # (Counted from when sending resumed: a wait told or decided sends nothing.)
    start = max(loop.cut_at, loop.blocked_until)
    if not loop.holding() or sent_at < start:
        return
    sends = parts.log.between(start, sent_at)
    got, tuning = sum(entry[1] for entry in sends), parts.config.tuning
    share = 0.5 if len(sends) < 2 * tuning.spent_fewest else tuning.spent_share
    if not got or len(sends) < tuning.spent_fewest or got > (1.0 - share) * len(sends):
        return
    rate = got / (sent_at - start)
    if rate < loop.rate:
        loop.rate = rate
        if loop.edge is not None and loop.edge_held:
            # A confirmed edge counted a stored burst: held as far below it.
            loop.margin = max(loop.margin, 1.0 - rate / loop.edge)
            loop.target = rate
            # Counted over a few sends, that pace is rough: a hold doubled by
            # the confirmations is cut back (a token bucket of 50/s and 50
            # stored read 40.9/s from three acceptances in 73 ms, and the
            # hold of 40 s held it there).
            loop.hold_for = min(loop.hold_for, parts.config.tuning.spent_hold * parts.config.hold)
        logger.debug(
            "scope %s: %d of %d sends since the cut refused: a stored burst spent, "
            "no faster than the %.3f/s that got through",
            scope.name,
            len(sends) - got,
            len(sends),
            rate,
        )


def _echo(
    parts: Parts, scope: ScopeView, sent_at: float, now: float, wait: float, *, closed: bool
) -> None:
    """An echo of the last cut measures no edge; if nothing got through since, wait a horizon.

    Its gap after the last acceptance tells the leaky bucket's judge all the same.

    One sent after that horizon and refused is a knock, as when the server
    closes (a fixed window spent before its end does not let go of sends as
    the window counted from them would). While open, one sent after the
    pause for the excess may show a new edge over-counted.
    """
    loop = parts.rate_loop
    horizon = parts.config.tuning.edge_horizon
    _note_gap(parts, sent_at, now, wait)
    if closed and sent_at >= loop.cut_at + horizon:
        loop.block(now + parts.closures.close(loop.cut_at, now, echo=True))
    elif closed:
        loop.block(loop.cut_at + horizon)
    else:
        overcounted(parts, scope, sent_at, now)


def in_flight_limit(
    parts: Parts, scope: ScopeView, flying: int, sent_at: float, now: float, *, judge: bool = True
) -> Verdict:
    """What the refusal says of a limit on requests in flight; handled if it is that limit's.

    With ``judge`` false it is only counted (see :meth:`InFlightLimit.refused`).
    A limit disproved leaves the refusal to be measured as a rate limit's.
    """
    inflight = parts.inflight
    exact = scope.in_flight_exact
    cap = scope.concurrency
    latency = parts.concurrency_loop.latency
    before = inflight.count
    verdict = inflight.refused(
        flying, sent_at, now, parts.log, cap=cap, judge=judge, exact=exact, latency=latency
    )
    if verdict is Verdict.DISPROVED:
        logger.debug(
            "scope %s: refused with %d still in flight, below the limit found or at its cap: "
            "no limit on requests in flight",
            scope.name,
            flying,
        )
        if parts.rate_loop.phase is Phase.CAPPED:  # no cut to echo: the refusal measures an edge
            parts.rate_loop.cut_at = -math.inf
    if verdict is Verdict.KNOWN:
        parts.rate_loop.cut_at = now
    if verdict is not Verdict.FOUND:
        return verdict
    count = inflight.count
    assert count is not None
    parts.concurrency_loop.cap(count)
    parts.rate_loop.cap(count, now)
    if before is None:
        how = f"at {inflight.counts()} in flight, at {inflight.rates()}/s"
    else:  # (refined: the counts that found it say nothing of the new count)
        how = f"with {flying} in flight, the {before} found reading high"
    logger.debug("scope %s: refused %s: a concurrency limit of %d", scope.name, how, count)
    return verdict


def _told_wait(
    parts: Parts, scope: ScopeView, flying: int, sent_at: float, now: float, wait: float
) -> bool:
    """Weigh a wait the server told against the run; whether that settles the refusal.

    The first refusal after a told wait longer than the run had been open,
    or after the opening's first refusal told one at least a horizon long
    (with nothing accepted since, the server is still closed, and
    :meth:`Closures.still_closed` carried the run on already): if the run
    since has not got half as far as the last one did in its last horizon,
    its window lets go of the last run's sends one by one, and the last run
    and its wait were one window. If it has, a fixed window reopened whole.
    (HAProxy's ``http_req_rate(2s)`` tells ``Retry-After: 1``: its period
    still held most of the opening's sends when the wait ended, and the two
    accepted then, counted over a second mostly spent waiting, read as an
    edge of 2/s at a limit of 5/s. Against half of the whole run, a fixed
    second of 30 whose opening had run through several windows, 65 sent,
    came back whole with 30 and read as one window of 3.5 s.)
    """
    loop, closures = parts.rate_loop, parts.closures
    told = closures.told_wait
    closures.told_wait = None
    if told is not None:
        began, accepted, reopened_at, *last = told  # (a state shared by an older version: 3)
        if closures.run_ok + flying < (last[0] if last else accepted) / 2:
            loop.cut_at = now
            closures.restart()
            long_window(loop, scope, reopened_at - began, accepted, now)
            loop.resumed_at = max(now + wait, loop.blocked_until)
            return True
    run_at = closures.run_at
    assert run_at is not None
    longer = wait > loop.horizon and wait > sent_at - run_at
    opening = wait >= loop.horizon and loop.edge is None and loop.phase is Phase.START
    if (longer or opening) and closures.run_ok > 1:
        recent = len(parts.log.accepted_between(sent_at - loop.horizon, sent_at))
        closures.told(now + wait, flying, recent)
    return False


def _measure(
    parts: Parts, sent_at: float, flying: int, *, slow: bool, recount: bool
) -> tuple[float, float]:
    """The rate sent and the edge a refusal of ``sent_at`` measures, ``flying`` still in flight.

    On a sliding one-second window the count is the server's limit; on a
    longer window it is more, and the refusals that follow say so.
    """
    loop, log = parts.rate_loop, parts.log
    horizon = loop.horizon
    sent = log.measured(sent_at - horizon, sent_at, accepted=False, extra=flying)
    edge = log.measured(sent_at - horizon, sent_at, accepted=True, extra=flying)
    if slow:
        return sent, edge
    if recount and _recount(parts, sent_at):
        # Refused again below a new edge, a horizon or two of sending after
        # the refusal that set it: a bucket refused both when empty, and what
        # it let through between them is what it refilled (a count over one
        # horizon would read the rest of a stored burst as a rate).
        edge = min(edge, log.measured(loop.cut_at, sent_at, accepted=True))
    # (Climbing back from a possible drop, sending at the climb's rate.)
    climbing = (
        loop.phase_at if loop.phase is Phase.RECOVER and loop.phase_at is not None else -math.inf
    )
    if loop.holding() and sent_at - 2 * horizon >= max(loop.resumed(), climbing):
        # Two horizons of sending without a pause: on fixed windows the last
        # one can hold the end of one window and the start of the next (up
        # to twice the limit); the two's mean cannot. (Not once a drop's
        # halved rate is one of them: that horizon sent less than allowed.)
        two = log.measured(sent_at - 2 * horizon, sent_at, accepted=True, extra=flying)
        edge = min(edge, two)
    elif loop.phase is Phase.PROBE and loop.edge is not None and parts.closures.fixed:
        # A fixed window's probe refused before it showed a rise (a horizon
        # above the edge) confirms the edge: its count over the horizon holds
        # the end of the window before (100 per 60 s read 2.4/s).
        edge = min(edge, loop.edge)
    elif loop.phase is Phase.PROBE:
        edge = max(edge, log.paced(sent_at, horizon, loop.resumed_at))
        if loop.edge is not None and whole(loop.edge * horizon) < parts.config.tuning.pace_fewest:
            edge = max(edge, log.last_gap(sent_at, parts.spacing.least))  # (a count cannot)
    elif loop.phase is Phase.CLIMB or (loop.phase is Phase.START and loop.leaky):
        # Climbing evenly after a search was refused at once (a leaky
        # bucket's sign), or searching up in a leaky bucket's steps: the
        # pace it was accepted at is the finer count (over two horizons
        # there: a search's few per second are two or three in one).
        fewest = parts.config.tuning.pace_fewest
        paced = log.paced(sent_at, horizon, loop.resumed_at)
        span = horizon if loop.phase is Phase.CLIMB else 2 * horizon
        edge = max(edge, paced, log.pace(sent_at - span, sent_at, fewest))
    return sent, edge


def _recount(parts: Parts, sent_at: float) -> bool:
    """Whether a refusal below a new edge is counted from the refusal that set it.

    Only a horizon or two after it, with sending paused for at most
    ``recount_pause`` of that span: after a longer pause (a told wait, or
    the block the cut's echoes set) the count holds less than the server's
    limit (three processes against Flask-Limiter's moving window of 10/s
    counted 5.2/s through such a block, and held half the rate for 20 s).
    """
    loop = parts.rate_loop
    horizon, span = loop.horizon, sent_at - loop.cut_at
    if not loop.below_new_edge() or not horizon <= span <= 2 * horizon:
        return False
    return loop.resumed() - loop.cut_at <= parts.config.tuning.recount_pause * span
