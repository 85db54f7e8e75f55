"""Exceptions raised by throttlekit."""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "Overloaded",
    "ScopeStalled",
    "ThrottleTimeout",
    "ThrottlekitError",
    "WouldBlock",
]


class ThrottlekitError(Exception):
    """Base class of every exception that throttlekit raises on purpose."""


class WouldBlock(ThrottlekitError):
    """Raised by :meth:`Limiter.acquire_nowait` when a permit is not available now."""


class ThrottleTimeout(ThrottlekitError, TimeoutError):
    """Raised by :meth:`Limiter.acquire` when its ``timeout`` elapses before a grant.

    It is also a :class:`TimeoutError`, so ``except TimeoutError`` catches it.
    """


class Overloaded(ThrottlekitError):
    """Raised by :meth:`Limiter.acquire` when ``max_waiters`` requests already wait."""


class BackendUnavailable(ThrottlekitError):
    """Raised when a shared backend (e.g. Redis) cannot be reached and fails closed."""


class ScopeStalled(ThrottlekitError):
    """Raised by :meth:`Limiter.acquire` when a scope cannot send for longer than its ``max_stall``.

    A scope stalls when the server blocked it (``Retry-After``, a rate-limit
    reset) or its quota is used up until further than the policy's
    ``max_stall`` seconds from now: rather than wait that long, the request
    fails fast.

    :ivar scope: the scope that stalls.
    :ivar reason: why it cannot send, in words.
    :ivar reopens_at: when it could send again (limiter clock).
    :ivar wait: seconds from now until then.
    :ivar max_stall: the scope's ``max_stall``, which ``wait`` exceeds.
    """

    def __init__(
        self, scope: str, reason: str, reopens_at: float, wait: float, limit: float
    ) -> None:
        super().__init__(
            f"scope {scope!r} cannot send for {wait:.3g} s ({reason}), longer than its "
            f"max_stall of {limit:g} s; it reopens in {wait:.3g} s"
        )
        self.scope = scope
        self.reason = reason
        self.reopens_at = reopens_at
        self.wait = wait
        self.max_stall = limit
