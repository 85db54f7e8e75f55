"""Exceptions raised by throttlekit."""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "Overloaded",
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
