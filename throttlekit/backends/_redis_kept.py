"""Feedback a Redis backend's process keeps for its next write of a scope's controllers.

Every release that brings feedback for a scope's shared controllers writes
their new state, checked against its version; processes whose writes meet
each other's would try again at once, and at tens of writes per second
among a few processes most met a newer state on every try. Kept here, a
process stores all it kept in one write (see ``Releases``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .._controller import Feedback
    from ._redis_leases import RedisLease

__all__ = ["KEPT_MOST", "KeptFeedback"]

logger = logging.getLogger("throttlekit.backends.redis")

#: The most feedback kept for one scope (the oldest beyond is dropped): with
#: 64, one of eight processes at 430 grants/s in all dropped some; a write
#: of this many runs the controllers this many times (Adaptive: a few ms).
KEPT_MOST: Final = 256


class KeptFeedback:
    """Feedback this process keeps, per scope, for its next release to store.

    One release of a scope at a time writes its controllers' state; a
    success released meanwhile leaves its feedback here for the next write
    (a refusal writes itself: others must hear it at once). Feedback whose
    write kept meeting a newer state comes back here too. The backend's
    ``aclose()`` stores what is kept; a process that ends without it loses
    it (a busy scope's controllers would otherwise not have heard it at all).
    """

    __slots__ = ("_kept", "dropped", "leases", "writing")

    def __init__(self) -> None:
        self._kept: dict[str, list[tuple[Feedback, float]]] = {}
        # per scope: the (released) lease whose release kept feedback last,
        # to store what is kept at close (see Releases.store_kept)
        self.leases: dict[str, RedisLease] = {}
        self.writing: set[str] = set()  # scopes a release of this process writes now
        self.dropped = 0  # feedback dropped beyond KEPT_MOST

    def __repr__(self) -> str:
        return f"<KeptFeedback scopes={len(self._kept)} dropped={self.dropped}>"

    def __len__(self) -> int:
        return sum(map(len, self._kept.values()))

    def take(self, scope: str) -> list[tuple[Feedback, float]]:
        return self._kept.pop(scope, [])

    def newest(self) -> tuple[str, RedisLease, Feedback] | None:
        """Of a scope with feedback kept: its name, the lease that kept it last, its newest
        feedback (taken: the older stay kept), or ``None``; the lease is forgotten."""
        while self.leases:
            scope, lease = self.leases.popitem()
            kept = self._kept.get(scope)
            if kept:
                feedback, _ = kept.pop()
                return scope, lease, feedback
        return None

    def add(self, scope: str, lease: RedisLease, feedback: Feedback, at: float) -> None:
        """Keep ``feedback`` (of ``lease``), newer than what is kept."""
        self.leases[scope] = lease
        self._bound(scope, [*self._kept.get(scope, ()), (feedback, at)])

    def put_back(
        self, scope: str, lease: RedisLease, feedbacks: list[tuple[Feedback, float]]
    ) -> None:
        """Keep ``feedbacks`` (taken earlier, the last ``lease``'s: older than what is kept)."""
        self.leases[scope] = lease
        self._bound(scope, [*feedbacks, *self._kept.get(scope, ())])

    def _bound(self, scope: str, kept: list[tuple[Feedback, float]]) -> None:
        if len(kept) > KEPT_MOST:
            self.dropped += len(kept) - KEPT_MOST
            logger.warning(
                "scope %s changed under every try to store feedback; %d kept, the oldest dropped",
                scope,
                KEPT_MOST,
            )
            del kept[:-KEPT_MOST]
        self._kept[scope] = kept
