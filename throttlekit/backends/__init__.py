"""Shared state backends: one throttling budget for many processes.

A backend replaces the limiter's in-memory ledgers. The limiter resolves a
request's scopes, then awaits :meth:`Backend.acquire`; the permit hands the
lease back (with the feedback recorded on it) through :meth:`Backend.release`
when its ``async with`` block ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._controller import Feedback
    from .._limiter import Limiter

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
    """The seam between :class:`~throttlekit.Limiter` and a shared state store."""

    async def acquire(
        self,
        limiter: Limiter,
        costs: dict[str, float],
        *,
        priority: int,
        timeout: float | None,
    ) -> Any:
        """Wait for a grant of ``costs``; return a :class:`Lease`.

        Must hand everything back if cancelled, and raise
        :class:`~throttlekit.ThrottleTimeout` when ``timeout`` elapses.
        """
        ...

    async def release(
        self, lease: Any, feedback: Feedback | None, consumed: Mapping[str, float] | None
    ) -> None:
        """Give the lease back, with the feedback recorded for it (if any)."""
        ...

    async def aclose(self) -> None:
        """Close connections."""
        ...
