"""Listeners: a public hook on what a limiter does (wait, grant, release, feedback).

A limiter without listeners hands out its plain permits and pays nothing.
Adding one (:meth:`~throttlekit.Limiter.add_listener`) makes the limiter hand
out permits of a subclass that tells its listeners, for either driver; the
OpenTelemetry instrumentation (:mod:`throttlekit.otel`) is one such listener.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._clock import now as _now

if TYPE_CHECKING:
    from ._controller import Feedback
    from ._permit import Permit

__all__ = ["AsyncHeard", "LimiterListener", "SyncHeard", "heard_type"]


@runtime_checkable
class LimiterListener(Protocol):
    """What a limiter tells a listener added with ``add_listener()``.

    Every method is called in the task or thread that uses the permit, right
    after the event; with :class:`~throttlekit.SyncLimiter`, from many
    threads at once (guard your own state). A listener must not raise.

    Usage::

        class Counting:
            def __init__(self) -> None:
                self.granted_count = 0

            def on_wait(self, permit): ...
            def on_grant(self, permit, waited): self.granted_count += 1
            def on_fail(self, permit, exc, waited): ...
            def on_release(self, permit): ...
            def on_feedback(self, permit, feedback): ...

        limiter.add_listener(Counting())
    """

    def on_wait(self, permit: Permit) -> None:
        """``permit`` starts to wait for its grant (``acquire()`` was entered)."""

    def on_grant(self, permit: Permit, waited: float) -> None:
        """``permit`` was granted after ``waited`` seconds (0 for ``acquire_nowait()``)."""

    def on_fail(self, permit: Permit, exc: BaseException, waited: float) -> None:
        """``permit`` was not granted: ``exc`` (a timeout, an overload, a cancellation...)."""

    def on_release(self, permit: Permit) -> None:
        """``permit``, granted, has been given back."""

    def on_feedback(self, permit: Permit, feedback: Feedback) -> None:
        """Feedback was recorded on ``permit`` (:meth:`~throttlekit.Permit.record`)."""


class _Heard:
    """What the listened-to permits of both drivers share: counting grants and releases."""

    # No __slots__: its two fields start as these class attributes (a permit
    # has no __init__: the limiter sets its fields).
    _heard_started = False  # waiting was told (or a nowait grant was counted)
    _heard_held = False  # granted was told, released not yet
    _listeners: tuple[LimiterListener, ...] = ()  # set on the subclass made per limiter

    def _told_granted(self, waited: float) -> None:
        self._heard_held = True
        for listener in self._listeners:
            listener.on_grant(self, waited)  # type: ignore[arg-type]

    def _count_nowait(self) -> None:
        """A permit of ``acquire_nowait()`` is counted when it is first used."""
        if not self._heard_started and self._lease is not None:  # type: ignore[attr-defined]
            self._heard_started = True
            self._told_granted(0.0)

    def _done(self) -> None:
        if self._heard_held:
            self._heard_held = False
            for listener in self._listeners:
                listener.on_release(self)  # type: ignore[arg-type]

    def release(self) -> None:
        """Give back the concurrency this permit holds (idempotent)."""
        self._count_nowait()
        super().release()  # type: ignore[misc]
        self._done()

    def record(self, response: Any = None, **fields: Any) -> Feedback:
        """Report how the request went (see :meth:`Permit.record <throttlekit.Permit.record>`)."""
        feedback: Feedback = super().record(response, **fields)  # type: ignore[misc]
        for listener in self._listeners:
            listener.on_feedback(self, feedback)  # type: ignore[arg-type]
        return feedback


class AsyncHeard(_Heard):
    """The async driver's listened-to permit (mixed in before its permit type)."""

    async def __aenter__(self) -> Any:
        start = _now()
        self._heard_started = True
        for listener in self._listeners:
            listener.on_wait(self)  # type: ignore[arg-type]
        try:
            entered = await super().__aenter__()  # type: ignore[misc]
        except BaseException as exc:
            waited = max(0.0, _now() - start)
            for listener in self._listeners:
                listener.on_fail(self, exc, waited)  # type: ignore[arg-type]
            raise
        self._told_granted(max(0.0, self.granted_at - start))  # type: ignore[attr-defined]
        return entered

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)  # type: ignore[misc]
        finally:
            self._done()

    def __enter__(self) -> Any:
        entered = super().__enter__()  # type: ignore[misc]
        self._count_nowait()
        return entered


class SyncHeard(_Heard):
    """The sync driver's listened-to permit (mixed in before its permit type)."""

    def __enter__(self) -> Any:
        if self._lease is not None or self._shared is not None:  # type: ignore[attr-defined]
            entered = super().__enter__()  # type: ignore[misc]
            self._count_nowait()  # granted by acquire_nowait()
            return entered
        start = time.monotonic()
        self._heard_started = True
        for listener in self._listeners:
            listener.on_wait(self)  # type: ignore[arg-type]
        try:
            entered = super().__enter__()  # type: ignore[misc]
        except BaseException as exc:
            waited = max(0.0, time.monotonic() - start)
            for listener in self._listeners:
                listener.on_fail(self, exc, waited)  # type: ignore[arg-type]
            raise
        self._told_granted(max(0.0, self.granted_at - start))  # type: ignore[attr-defined]
        return entered

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            super().__exit__(exc_type, exc, tb)  # type: ignore[misc]
        finally:
            self._done()


def heard_type(
    mixin: type[_Heard], permit_type: type[Permit], listeners: tuple[LimiterListener, ...]
) -> type[Permit]:
    """``permit_type`` telling ``listeners`` (``mixin`` is the driver's :class:`AsyncHeard`
    or :class:`SyncHeard`)."""
    made: type[Permit] = type(
        f"Heard{permit_type.__name__}", (mixin, permit_type), {"_listeners": listeners}
    )
    return made
