"""Whether the client's own pause, not the server, explains a refusal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._phase import Phase

if TYPE_CHECKING:
    from ._rate import RateLoop

__all__ = ["own_pause"]


def own_pause(loop: RateLoop, paused: tuple[float, float] | None) -> bool:
    """Whether this process's own pause (``Feedback.paused``) explains a refusal at a known edge.

    The sends granted before the pause left late, and reached the server
    closer to those after it: a window still holding them (up to a horizon
    after the pause) may count more than the pace held, and a leaky bucket
    sees a gap shorter than its interval. Only a pause longer than the gap
    the pace leaves below the edge can (an httpx client's full collection
    of 42-51 ms, 41.6 s into a run at 9.6/s against 10 per sliding second,
    was refused, and taken for a drop cost 19 requests).
    """
    edge = loop.edge
    if paused is None or edge is None or not (loop.holding() or loop.phase is Phase.SPACED):
        return False
    since, length = paused
    return since <= loop.horizon + length and length >= 1.0 / loop.rate - 1.0 / edge
