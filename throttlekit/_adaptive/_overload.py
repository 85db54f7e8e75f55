"""Deciding on an overload error: widen the margin, take it for a limit's refusal, or cut."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from ._inflight import Verdict
from ._parts import Parts
from ._paused import own_pause
from ._phase import Event, Phase
from ._sends import others_in_flight
from ._throttle import in_flight_limit, on_throttle

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["cut_for_overload", "on_error"]

logger = logging.getLogger("throttlekit.adaptive")

INF = math.inf

#: The phases in which the rate goes past what it held (an error there may be a limit's).
_ABOVE = (Phase.START, Phase.PROBE, Phase.CLIMB)


def on_error(
    parts: Parts, scope: ScopeView, status: int | None, sent_at: float, now: float
) -> None:
    """An overload error: a rate limit's refusal, or one of a share that may cut.

    A rate limit that answers with errors refuses nothing below its edge,
    where random errors and a struggling server take a share at any rate.
    So once a hold after an overload cut passed without one, an error that
    comes as the rate climbs past it is that limit's refusal, as a 429
    would be; while holding below its edge, only if errors are a tenth of
    the sends. When cuts below each lower edge leave as large a share, they
    were random all along: the scope forgets the edge and searches again.
    """
    loop, errors = parts.rate_loop, parts.errors
    if status is not None and _limit_shown(parts, scope, sent_at, now):
        return
    echo = loop.echo(sent_at)
    if echo and status is not None and errors.errors_limit:
        # An echo of a limit's refusal, as a 429's: the server closed, or the
        # new edge over-counted.
        on_throttle(parts, scope, sent_at, now, 0.0, error=True)
        return
    if _judged_a_limit(parts, scope, status, sent_at, now, echo=echo):
        return
    if not echo:
        errors.errors_clean = False
        if errors.cut_tried:
            _random_below(parts, scope, now)
    opening = loop.phase is Phase.START and loop.cut_at == -INF and _in_send_order(parts, scope)
    if opening and status is not None and _ended_opening(parts, scope, sent_at, now):
        return
    if errors.cut_shallow():
        cut_for_overload(parts, scope, now, since_cut=True)
    elif errors.overloaded(opening=opening) or (parts.closures.empty and not echo):
        # (Closed: a knock after the pause was refused too.)
        cut_for_overload(parts, scope, now)


def _judged_a_limit(
    parts: Parts, scope: ScopeView, status: int | None, sent_at: float, now: float, *, echo: bool
) -> bool:
    """Weigh an error as a limit's refusal, as far as the errors so far show; whether handled.

    While holding, too few of them only widen the margin; more are the
    limit's refusals, until cuts below each lower edge leave as many.
    """
    loop, errors = parts.rate_loop, parts.errors
    holding = loop.holding()
    limit = errors.limit_refusal(echo=echo, status=status, searching=loop.phase in _ABOVE)
    if not limit:
        return False
    if holding and not _hold_errors(parts, sent_at):
        if not own_pause(loop, parts.paused):  # (the client's own pause: no margin wider)
            _widen(parts, scope, sent_at, now)
        return False
    errors.hold_cuts += holding
    if errors.hold_cuts > parts.config.tuning.hold_cuts:
        logger.debug("scope %s: errors below every edge: not a rate limit", scope.name)
        errors.errors_limit = False
        loop.edge, loop.target = None, INF
        loop.enter(Event.NOT_A_LIMIT, now)
        return False
    if not errors.errors_limit:
        logger.debug("scope %s: errors only above the rate held: a rate limit", scope.name)
    errors.errors_limit = True
    if errors.overloaded():
        return False
    on_throttle(parts, scope, sent_at, now, 0.0, error=True)
    return True


def _ended_opening(parts: Parts, scope: ScopeView, sent_at: float, now: float) -> bool:
    """Whether errors in the opening search up are a limit's refusals; then they are measured.

    Past a run of acceptances, enough of them and most answers since are
    taken for a limit's, its edge measured before the first of them as a
    429's would be (random ones held lower still come: then they are found
    out). Until then, two together go to the leaky bucket's judge (a bucket
    refuses most of a doubled rate's sends, where random errors seldom come
    so); not the one that ends the opening: its edge is measured, and a gap
    read off the opening's last sends had a sliding 5/s paced at 8/s.
    """
    errors = parts.errors
    if not errors.ended_run():
        if errors.paired():
            parts.spacing.refused(sent_at, now)
        return False
    logger.debug("scope %s: errors ended the opening: a rate limit", scope.name)
    errors.limit_found()
    first = parts.log.first_refused()
    on_throttle(parts, scope, sent_at if first is None else first, now, 0.0, error=True)
    return True


def _limit_shown(parts: Parts, scope: ScopeView, sent_at: float, now: float) -> bool:
    """Whether an error is a limit's refusal the scope knows the kind of; then it is handled.

    Paced by a leaky bucket's spacing, it is that bucket's refusal, judged
    by its gap (random errors at gaps it accepted soon show it was not
    one). Many errors, each at one number in flight, are a limit on
    requests in flight that answers with errors (nginx's ``limit_conn``
    answers 503).
    """
    if parts.rate_loop.phase is Phase.SPACED:
        on_throttle(parts, scope, sent_at, now, 0.0)
        return True
    flying = others_in_flight(scope)
    verdict = in_flight_limit(parts, scope, flying, sent_at, now, judge=parts.errors.overloaded())
    if verdict is Verdict.DISPROVED:  # a rate limit's refusal, then: its edge is measured
        parts.errors.limit_found()  # (and its errors above that edge are its refusals)
        on_throttle(parts, scope, sent_at, now, 0.0, error=True)
        return True
    return verdict.handled


def cut_for_overload(
    parts: Parts, scope: ScopeView, now: float, *, since_cut: bool = False
) -> None:
    """Overload errors (or a knock refused): cut rate and concurrency, and hold.

    The rates cut from are measured over the last ``overload_rate_span``
    seconds, or (``since_cut``: a cut too shallow) over the time since it.
    """
    config = parts.config
    loop, closures, concurrency = parts.rate_loop, parts.closures, parts.concurrency_loop
    closed = closures.closed_since(loop.cut_at)
    span = config.tuning.overload_rate_span
    if since_cut:
        span = min(span, now - loop.cut_at)
    sent = parts.log.measured(now - span, now, accepted=False)
    got = parts.log.measured(now - span, now, accepted=True)
    old_rate, old_limit = loop.rate, concurrency.limit
    loop.overload(sent, got, now)
    closures.cut()
    if closed:  # (a long window's limit spent, or a server down)
        loop.block(now + closures.close(loop.cut_at, now))
    else:
        closures.open()
    concurrency.cut(config.overload_cut, scope.in_flight)
    parts.errors.cut()
    loop.say(f"overloaded, rate {loop.rate:.3g}/s, concurrency {concurrency.limit}")
    logger.debug(
        "scope %s: overload errors, rate %.3f -> %.3f/s, concurrency %s -> %s",
        scope.name,
        old_rate,
        loop.rate,
        old_limit,
        concurrency.limit,
    )


def _random_below(parts: Parts, scope: ScopeView, now: float) -> None:
    """Errors below what got through are random ones: back to the rate held, at its hold's end."""
    loop, errors = parts.rate_loop, parts.errors
    loop.rate = loop.target = errors.cut_tried
    errors.cut_tried, errors.cut_random_at = 0.0, now
    loop.phase_at = now - loop.hold_for
    logger.debug("scope %s: errors below what got through: random ones", scope.name)


def _in_send_order(parts: Parts, scope: ScopeView) -> bool:
    """Whether the last answers came about in the order sent (few in flight to overtake).

    Else errors answered at once overtake slow acceptances, and a run of
    them among the last answers says little.
    """
    return 2 * scope.in_flight < parts.config.tuning.overload_fewest


def _hold_errors(parts: Parts, sent_at: float) -> bool:
    """Whether errors are a large enough share of the sends while holding to be a limit's."""
    log = parts.log
    span = 2.0 * parts.rate_loop.horizon
    sent = log.measured(sent_at - span, sent_at, accepted=False)
    accepted = log.measured(sent_at - span, sent_at, accepted=True)
    return sent - accepted >= parts.config.tuning.hold_errors * sent


def _widen(parts: Parts, scope: ScopeView, sent_at: float, now: float) -> None:
    """An error while holding, too few to tell a refusal from a random one: maybe widen.

    Errors enough to widen the margin also hold the rate no faster than
    what got through since the first of them. An edge that counted a
    token bucket's stored burst holds above the bucket's rate, and the
    bucket then lets through exactly its rate between its refusals; random
    errors come as often once held so, and then the margin is the headroom
    again (:meth:`ErrorJudge.widened`).
    """
    loop, errors, log = parts.rate_loop, parts.errors, parts.log
    edge = loop.edge
    if edge is None:
        return
    # (Counted from the first of those errors, within what the log holds.)
    since = max(errors.widen_from, loop.resumed(), log.oldest())
    headroom = parts.config.headroom
    margin = errors.widened(scope, now, loop.rate, loop.one_fewer(edge), (loop.margin, headroom))
    if margin is None:
        return
    loop.margin = margin
    loop.target = edge * (1.0 - margin)
    if margin > headroom and sent_at - since >= loop.horizon:
        got = log.measured(since, sent_at, accepted=True)
        loop.target = min(loop.target, max(got, parts.config.tuning.min_estimate))
    # (A rate still climbing back below the edge is not raised by a margin.)
    loop.rate = min(loop.rate, loop.target)
    logger.debug("scope %s: errors while holding: rate -> %.3f/s", scope.name, loop.rate)
