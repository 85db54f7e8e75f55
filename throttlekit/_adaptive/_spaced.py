"""Pacing by a leaky bucket's spacing once its judge has shown one, and leaving it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._parts import Parts
from ._phase import Phase
from ._spacing import Shown

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["judge_spacing"]

logger = logging.getLogger("throttlekit.adaptive")


def judge_spacing(parts: Parts, scope: ScopeView, now: float) -> None:
    """Judge the answers settled by now for a leaky bucket without burst; pace by it if shown."""
    loop, spacing = parts.rate_loop, parts.spacing
    spaced = loop.phase is Phase.SPACED
    if not spaced:
        spacing.on = False
    verdict = spacing.judge(parts.log, now)
    if verdict is Shown.LOST and spaced:
        logger.debug("scope %s: refused at gaps it had accepted: a window", scope.name)
        loop.search_again(now, "refused at gaps it had accepted: a window, searching up")
    elif spacing.on:
        if verdict is Shown.FOUND:
            logger.debug(
                "scope %s: refused well sooner after an acceptance than every gap accepted: "
                "a leaky bucket, its interval in (%.4f, %.4f] s",
                scope.name,
                spacing.lo,
                spacing.hi,
            )
        elif verdict is Shown.GUARDED:
            logger.debug(
                "scope %s: refused at a gap it had accepted: paced %s above %.4f s",
                scope.name,
                f"{spacing.guard:.0%}",
                spacing.hi,
            )
        loop.spaced(spacing.interval(now), spacing.hi, now)
