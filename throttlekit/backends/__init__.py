"""State backends: where a limiter's scopes live and who decides their grants.

Every :class:`~throttlekit.Limiter` has an in-memory backend
(:class:`~throttlekit.backends.memory.MemoryBackend`): its policies, global
cap and scope ledgers. A shared backend (for example
:class:`~throttlekit.backends.redis.RedisBackend`) replaces it as the one
that grants, so several processes share one budget; it is bound to the
limiter's in-memory backend once, and may use it (through its public
methods) for the global cap and as a fallback. The limiter picks its backend
once, at construction, and from then on only calls the :class:`Backend`
methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._controller import Feedback
    from .memory import MemoryBackend

__all__ = ["Backend", "Lease"]


class Lease(Protocol):
    """What a backend grants: the scopes taken and when."""

    @property
    def scopes(self) -> dict[str, float]:
        """The granted scopes and the cost taken from each."""
        ...

    @property
    def granted_at(self) -> float:
        """The limiter-clock time of the grant."""
        ...


class Backend(Protocol):
    """The seam between :class:`~throttlekit.Limiter` and the state it throttles with.

    A backend may also have a ``permit_type`` attribute: the
    :class:`~throttlekit.Permit` subclass its limiter hands out, for a fast
    path of its own (the in-memory backend's
    :class:`~throttlekit.backends.memory.MemoryPermit`). Without one the
    limiter hands out plain permits, which only call the methods below.
    """

    def bind(self, local: MemoryBackend) -> None:
        """Called once by the limiter with its in-memory backend (policies, global cap)."""

    def try_acquire(self, costs: Mapping[str, float], priority: int) -> Any:
        """A :class:`Lease` if ``costs`` can be granted now without waiting or I/O, else ``None``.

        A backend that cannot decide without a round trip returns ``None``.
        """

    async def acquire(
        self,
        costs: Mapping[str, float],
        *,
        priority: int,
        timeout: float | None,
        gated: bool = True,
    ) -> Any:
        """Wait for a grant of ``costs``; return a :class:`Lease`.

        Must hand everything back if cancelled, and raise
        :class:`~throttlekit.ThrottleTimeout` when ``timeout`` elapses.
        ``gated=False`` (a nested acquire, whose enclosing permit holds a
        slot of the global cap) takes no slot of the global cap.
        """

    def record(self, lease: Any, feedback: Feedback, consumed: Mapping[str, float] | None) -> None:
        """Feedback for the lease's request (applied now, or kept until the release)."""

    def release_nowait(self, lease: Any) -> bool:
        """Give the lease back without awaiting; ``False`` (nothing done) if that needs I/O."""
        ...

    async def release(self, lease: Any) -> None:
        """Give the lease back (idempotent; with the feedback recorded for it, if any)."""

    async def aclose(self) -> None:
        """Close connections."""
