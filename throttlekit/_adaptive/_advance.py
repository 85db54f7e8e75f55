"""Moving the rate along its phase as time passes: search up, recover, hold, probe."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._parts import Parts
from ._phase import Event, Phase

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["advance"]

logger = logging.getLogger("throttlekit.adaptive")

#: Phases in which the rate loop stands aside (or waits for answers).
_ASIDE = (Phase.STATED, Phase.MEASURE, Phase.CAPPED, Phase.SPACED)


def advance(parts: Parts, scope: ScopeView, now: float) -> None:
    """Move the rate along its phase at ``now``."""
    loop = parts.rate_loop
    tuning = parts.config.tuning
    elapsed = now - (loop.phase_at if loop.phase_at is not None else now)
    span = tuning.send_rate_span
    sent = parts.log.measured(now - span, now, accepted=False)
    ceiling = max(2.0 * sent, parts.config.start_rate)  # no burst earned while idle
    phase = loop.phase
    if phase in _ASIDE:
        return
    if phase is Phase.START:
        if elapsed >= tuning.start_doubling:
            if sent >= tuning.start_used * loop.rate:  # the scope uses its rate: raise it
                step = tuning.leaky_search if loop.leaky else 2.0
                loop.rate = min(loop.rate * step, ceiling * 2.0)
                loop.say(f"no limit met yet, up to {loop.rate:.3g}/s")
            loop.phase_at = now
    elif phase is Phase.RECOVER:
        _recover(parts, elapsed, now)
    elif phase is Phase.HOLD:
        if not _after_overload(parts, scope, elapsed, now) and elapsed >= loop.hold_for:
            loop.enter(Event.HELD, now, f"probing above {loop.target:.3g}/s")
            if loop.risen_from is None:
                loop.risen_to = 0.0  # a hold passed since the last rise: forgotten
            loop.held_margin = loop.margin
            loop.margin = max(parts.config.headroom, loop.margin / 2.0)
            parts.errors.probing()
    else:
        _probe(parts, scope, elapsed, now, ceiling)


def _recover(parts: Parts, elapsed: float, now: float) -> None:
    """From the restart rate up to the target within ``recover_time`` seconds."""
    loop = parts.rate_loop
    if elapsed < 0:
        return
    target = loop.target
    time = parts.config.tuning.recover_time
    loop.rate = min(target, loop.rate + (target - loop.rate) * min(1.0, elapsed / time))
    if loop.rate >= target or elapsed >= time:
        loop.rate = target
        loop.enter(Event.RECOVERED, now)


def _after_overload(parts: Parts, scope: ScopeView, elapsed: float, now: float) -> bool:
    """Held after a cut for overload, with no edge known: try lower or search up; whether it did."""
    loop, errors, closures = parts.rate_loop, parts.errors, parts.closures
    config = parts.config
    if loop.edge is not None:
        return False
    held = elapsed >= loop.hold_for
    if (
        held
        and not errors.errors_clean
        and errors.outcomes
        and errors.share_below(config.tuning.thinned * errors.cut_share)
        and now - errors.cut_random_at >= config.max_hold
    ):
        _try_lower(parts, scope, elapsed, now)
        return True
    clean = errors.errors_clean and closures.ok_since_cut >= config.tuning.clean_proof
    if clean or (held and errors.share_below(config.overload_share)):
        # The errors since the cut (if any) a smaller share than cut: search
        # up as at the start (errors there count toward the overload share,
        # or, after a clean hold, find a limit). A larger share probes up.
        target = loop.target
        loop.enter(
            Event.HELD_AFTER_OVERLOAD, now, f"searching up from {target:.3g}/s after an overload"
        )
        errors.cut_tried = 0.0
        logger.debug(
            "scope %s: %d accepted since the overload cut (%s): searching up",
            scope.name,
            closures.ok_since_cut,
            "all" if errors.errors_clean else "with errors",
        )
        return True
    return False


def _try_lower(parts: Parts, scope: ScopeView, elapsed: float, now: float) -> None:
    """The cut thinned the errors: try below what got through.

    A rate limit (or a full server) lets about as many through at any rate
    above it, so its refusals thin as the rate is cut and stop below what
    got through; random errors keep their share. An error there means
    random ones (back to the rate held, and no such try for ``max_hold``
    seconds); none, a limit, whose edge the clean hold then finds.
    """
    loop, errors, closures = parts.rate_loop, parts.errors, parts.closures
    got = closures.ok_since_cut / max(elapsed, 1.0)
    errors.cut_tried, errors.cut_share = loop.rate, 0.0
    loop.rate = loop.target = max(
        parts.config.tuning.min_rate, got * (1.0 - parts.config.tuning.error_margin)
    )
    loop.phase_at = loop.cut_at = now
    closures.cut()
    errors.errors_clean = True
    loop.say(f"trying {loop.rate:.3g}/s, below what got through")
    logger.debug(
        "scope %s: errors thinned by the cut, %.3f/s got through: trying %.3f/s",
        scope.name,
        got,
        loop.rate,
    )


def _probe(parts: Parts, scope: ScopeView, elapsed: float, now: float, ceiling: float) -> None:
    """Probe above the target: slow near the known edge, faster away from it (a convex climb)."""
    loop, log = parts.rate_loop, parts.log
    tuning = parts.config.tuning
    edge = loop.edge
    span = max(tuning.probe_span, loop.horizon)  # a long window accepts a burst until it fills
    accepted = log.measured(now - span, now, accepted=True)
    # A fixed window's count over the horizon holds the end of the window
    # before too: one opened in the probe takes it above the edge until it
    # fills (100 per 60 s "rose" to 2.6/s). Only a probe above it for a
    # whole horizon unrefused shows a rise there.
    shown = elapsed >= loop.horizon or not parts.closures.fixed
    rising = shown and edge is not None and accepted > tuning.risen_share * edge
    if rising:
        # No more than their pace, which at a few per second is the finer
        # count (the pace alone would read a burst as a rate).
        accepted = min(accepted, log.pace(now - span, now, tuning.pace_fewest) or accepted)
    if (
        rising
        and edge is not None
        and accepted > tuning.risen_share * edge
        and accepted * span >= tuning.risen_fewest
    ):
        # The server accepts well past the old edge: the limit rose. Search up as at the start.
        loop.risen_from, loop.risen_hold = edge, loop.hold_for
        # An edge read off a long window's closure and never confirmed is a
        # floor: HAProxy's 20 per 10 s, whose knocks count too, reads 20 per
        # 15.3 s. A refusal below the rise from it is not a stored burst.
        loop.risen_firm = loop.edge_held or not loop.long_window()
        loop.risen_to = accepted
        loop.enter(Event.ROSE, now, f"the limit rose past {edge:.3g}/s, up to {loop.rate:.3g}/s")
        logger.debug("scope %s: accepted past the edge %.3f/s: searching up", scope.name, edge)
        return
    if now - loop.moved_at <= parts.config.max_hold:
        elapsed *= 2.0  # a limit that just moved: climb faster
    target = loop.target
    probe = target * (
        1.0 + tuning.probe_linear * elapsed + tuning.probe_quadratic * elapsed * elapsed
    )
    loop.rate = min(probe, max(ceiling, target))
