"""What the HTTP client adapters share: holding a permit across calls, reading feedback."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from .. import scopes as _scopes
    from .._limiter import Limiter, Permit

__all__ = ["HeldPermit", "content_length", "missing_extra"]


def missing_extra(module: str, package: str, extra: str) -> ImportError:
    """The :class:`ImportError` an adapter raises when its framework is not installed."""
    return ImportError(
        f'{module} needs {package}, which is not installed: pip install "throttlekit-http[{extra}]"'
    )


def content_length(headers: Mapping[str, Any] | Any) -> int | None:
    """The response's ``Content-Length`` as an int, or ``None`` when absent or malformed."""
    try:
        value = headers.get("content-length")
    except AttributeError:
        return None
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    text = text.strip()
    return int(text) if text.isdigit() else None


class HeldPermit:
    """A permit taken outside an ``async with`` block and given back exactly once.

    Adapters acquire when a request is handed to them and release when the
    framework says the response is finished (closed, released, its body
    read), which is usually in another call. :meth:`release` is idempotent
    and shielded from cancellation, so a cancelled ``aclose()`` still gives
    the slot back.
    """

    __slots__ = ("_in_memory", "_released", "permit")

    def __init__(self, permit: Permit, limiter: Limiter) -> None:
        self.permit = permit
        self._released = False
        # The Limiter has no public accessor for its backend: an in-memory
        # permit releases synchronously, a shared backend's lease only with an
        # awaited round trip.
        self._in_memory = getattr(limiter, "_backend", None) is None

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<HeldPermit {state} {self.permit!r}>"

    @classmethod
    async def acquire(
        cls,
        limiter: Limiter,
        request: Any,
        *,
        priority: int = 0,
        scopes: _scopes.ScopesLike | None = None,
    ) -> HeldPermit:
        """Wait for a permit for ``request`` (cancellation while waiting takes nothing)."""
        permit = limiter.acquire(request, priority=priority, scopes=scopes)
        # A request the adapter holds (while its response streams) is no
        # ``async with`` block that later acquires of the task nest in.
        permit._encloses = False
        await permit.__aenter__()
        return cls(permit, limiter)

    @property
    def released(self) -> bool:
        """Whether the permit has been given back."""
        return self._released

    async def release(self) -> None:
        """Give the permit back (idempotent, not interruptible by cancellation)."""
        if self._released:
            return
        self._released = True
        with anyio.CancelScope(shield=True):
            await self.permit.__aexit__(None, None, None)

    def release_now(self) -> bool:
        """Give the permit back without awaiting, if the limiter allows it.

        Returns ``False`` (and keeps the permit) when the limiter uses a shared
        backend, whose release is a network round trip: use :meth:`release`.
        """
        if self._released:
            return True
        if not self._in_memory:
            return False
        self._released = True
        self.permit.release()
        return True
