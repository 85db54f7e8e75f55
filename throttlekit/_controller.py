"""Feedback from responses and the protocol of per-scope controllers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from .headers import RateLimitInfo

__all__ = ["Controller", "Feedback"]


@attrs.frozen(kw_only=True)
class Feedback:
    """What one response (or failure) told us about a scope.

    Built by :meth:`Permit.record`; controllers read it.

    :param status: the HTTP status code, or ``None`` when no response arrived.
    :param headers: the response headers as the client gave them (any mapping).
    :param exception: the exception that ended the request, if any.
    :param latency: seconds from send to response headers.
    :param size: response body size in bytes, when known.
    :param rate_limit: the parsed rate-limit headers (:func:`throttlekit.headers.parse`).
    :param adjust_delay: ``False`` when the request asked latency-driven
        controllers not to learn from it (``autothrottle_dont_adjust_delay``).
    :param sent_at: when the request was sent (the grant time, limiter clock).
    :param scopes: the scopes this feedback is for; ``None`` means all the
        permit's scopes.
    """

    status: int | None = None
    headers: Mapping[str, Any] | Any = None
    exception: BaseException | None = None
    latency: float | None = None
    size: int | None = None
    rate_limit: RateLimitInfo | None = None
    adjust_delay: bool = True
    sent_at: float | None = None
    scopes: frozenset[str] | None = None


@runtime_checkable
class Controller(Protocol):
    """A per-scope feedback loop that moves the limits the ledger enforces.

    Controllers are synchronous and sans-IO: they are told the time, never
    read it. The ledger combines them: the effective delay is the largest
    ``delay`` any of them asks for (and at least the policy's), the effective
    concurrency the smallest ``concurrency`` (``None`` = no opinion), and the
    scope is closed until the latest ``blocked_until``.
    """

    @property
    def delay(self) -> float:
        """Minimum seconds between sends this controller asks for (0 = no opinion)."""
        ...

    @property
    def concurrency(self) -> int | None:
        """Most requests in flight this controller allows (``None`` = no opinion)."""
        ...

    @property
    def blocked_until(self) -> float:
        """No send before this time (``-inf`` = not blocked)."""
        ...

    def on_send(self, now: float) -> bool | None:
        """A request of this scope was sent at ``now``.

        Return ``True`` if the controller's limits changed (the ledger then
        recomputes the effective limits); ``None``/``False`` otherwise.
        """

    def on_feedback(self, feedback: Feedback, now: float) -> None:
        """A response or failure of this scope arrived at ``now``."""
