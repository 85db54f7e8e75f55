"""Throttle ``aiohttp.ClientSession`` with a client middleware (aiohttp >= 3.12).

:func:`middleware` makes a client middleware that, for every request aiohttp
sends -- each hop of a redirect chain and each retry on a dropped keep-alive
connection go through the middlewares again --

1. waits for a permit from the :class:`~throttlekit.Limiter` (the
   ``aiohttp.ClientRequest`` is the request-like: its URL gives the scopes);
2. sends it;
3. records the status, headers and latency (seconds from handing the request
   on until its response headers arrived, connection set-up included), or
   the exception that ended the request, which is then re-raised unchanged;
4. gives the concurrency slot back when aiohttp gives the connection back:
   when the body has been received completely, or the response is released
   or closed (``async with``, ``resp.release()``, ``resp.close()``) -- not
   when the headers arrive, so slow bodies count toward concurrency.
   Errors and cancellation before that give it back at once.

aiohttp requests have no per-request extensions, so per-request scopes and
priority are set with the :func:`throttling` context manager around the call
(a context variable: it follows the task, including redirects).

Usage::

    import aiohttp
    import throttlekit
    from throttlekit.adapters.aiohttp import middleware

    limiter = throttlekit.Limiter(default=throttlekit.ScopePolicy(concurrency=2, delay=0.5))
    async with aiohttp.ClientSession(middlewares=(middleware(limiter),)) as session:
        async with session.get("https://example.com/") as response:
            body = await response.read()

aiohttp runs on asyncio only, so this adapter does too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from .._limiter import Limiter
from ._common import (
    ConsumedHook,
    HeldPermit,
    check_budgets,
    content_length,
    missing_extra,
    options,
    read_for_feedback,
    throttling,
    token_usage,
)

try:
    from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise missing_extra("throttlekit.adapters.aiohttp", "aiohttp >= 3.12", "aiohttp") from exc

__all__ = ["ThrottlingMiddleware", "middleware", "throttling", "token_usage"]


class ThrottlingMiddleware:
    """An aiohttp client middleware that throttles each request through a limiter.

    Make one with :func:`middleware`; see the module documentation for what
    it does per request.

    :param limiter: decides when each request may be sent.
    :param budgets: which scope tracks which budget the server reports,
        ``{budget: scope}`` (e.g. ``{"tokens": "openai-tokens"}``); see
        :meth:`Permit.record <throttlekit.Permit.record>`.
    :param consumed: ``consumed(response, body)`` gives the real cost per
        scope (e.g. :func:`token_usage`). With it, a JSON response (up to
        8 MiB) is read in the middleware, ``body`` is its parsed document
        (``None`` for other responses), and the result reconciles the costs
        the request declared; ``None`` keeps them. Streamed (non-JSON)
        responses are not read and still hold their slot until released.

    Timeouts: aiohttp's ``ClientTimeout(total=...)`` runs around the
    middlewares, so time spent waiting for a permit counts toward it (and a
    request that times out while waiting is never sent nor recorded).
    ``sock_read``, ``sock_connect`` and a total timeout that fires while the
    response is read raise inside the request and are recorded as they are.
    A total timeout that fires while the connection is being set up
    cancels the request instead; the middleware tells the two apart with
    the request's timer and records a :class:`TimeoutError` before letting
    the cancellation through, so a server too busy to accept connections
    triggers backoff too.

    Usage::

        throttle = middleware(limiter)
        async with aiohttp.ClientSession(middlewares=(throttle,)) as session:
            ...
        print(throttle.limiter.statistics())
    """

    __slots__ = ("_background", "_budgets", "_consumed", "_limiter")

    def __init__(
        self,
        limiter: Limiter,
        *,
        budgets: Mapping[str, str] | None = None,
        consumed: ConsumedHook | None = None,
    ) -> None:
        if not isinstance(limiter, Limiter):
            raise TypeError(f"limiter must be a throttlekit.Limiter, got {limiter!r}")
        if consumed is not None and not callable(consumed):
            raise TypeError(f"consumed must be callable or None, got {consumed!r}")
        self._limiter = limiter
        self._budgets = check_budgets(budgets)
        self._consumed = consumed
        # Releases that a shared backend must await, started from aiohttp's
        # synchronous connection callbacks; kept referenced until they finish.
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<ThrottlingMiddleware {self._limiter!r}>"

    @property
    def limiter(self) -> Limiter:
        """The limiter that throttles this middleware's requests."""
        return self._limiter

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        settings = options()
        held = await HeldPermit.acquire(
            self._limiter, request, priority=settings.priority, scopes=settings.scopes
        )
        try:
            permit = held.permit
            sent = anyio.current_time()
            try:
                response = await handler(request)
            except Exception as exc:
                permit.record(
                    exception=exc,
                    latency=anyio.current_time() - sent,
                    adjust_delay=settings.adjust_delay,
                )
                raise
            except asyncio.CancelledError:
                if _total_timeout_expired(request):
                    permit.record(
                        exception=TimeoutError("aiohttp's total timeout expired"),
                        latency=anyio.current_time() - sent,
                        adjust_delay=settings.adjust_delay,
                    )
                raise
            latency = anyio.current_time() - sent
            consumed, body = await read_for_feedback(
                response, response.status, _reader(response), self._consumed, permit
            )
            permit.record(
                response,
                latency=latency,
                size=content_length(response.headers),
                adjust_delay=settings.adjust_delay,
                consumed=consumed,
                budgets=self._budgets,
                body=body,
            )
            connection = response.connection
        except BaseException:
            await held.release()
            raise
        if connection is None:
            # The body was complete with the headers: the connection is already
            # back in aiohttp's pool and nothing of this request is in flight.
            await held.release()
        else:
            connection.add_callback(_Releaser(self, held))
        return response

    def _release_later(self, held: HeldPermit) -> None:
        task = asyncio.get_running_loop().create_task(held.release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class _Releaser:
    """aiohttp calls this (synchronously) when the response's connection is released."""

    __slots__ = ("_held", "_middleware")

    def __init__(self, middleware: ThrottlingMiddleware, held: HeldPermit) -> None:
        self._middleware = middleware
        self._held = held

    def __call__(self) -> None:
        if not self._held.release_now():
            self._middleware._release_later(self._held)


def _reader(response: ClientResponse) -> Callable[[int | None], Awaitable[bytes | None]]:
    """``read(limit)`` for :func:`read_for_feedback`: aiohttp keeps what it read for the caller.

    aiohttp cannot give back part of a body, so a body of unstated length is
    read under a ``limit`` only when it has already arrived whole.
    """

    async def read(limit: int | None) -> bytes | None:
        if limit is not None and content_length(response.headers) is None:
            content = response.content
            if not content.is_eof() or content.total_bytes > limit:
                return None
        return await response.read()

    return read


def _total_timeout_expired(request: ClientRequest) -> bool:
    # aiohttp's total timeout cancels the task and turns the cancellation into
    # TimeoutError outside the middlewares; the request's timer knows whether
    # it fired. Not public API: if aiohttp changes it, this returns False and
    # such timeouts are simply not recorded.
    timer: Any = getattr(request, "_timer", None)
    return getattr(timer, "_cancelled", False) is True


def middleware(
    limiter: Limiter,
    *,
    budgets: Mapping[str, str] | None = None,
    consumed: ConsumedHook | None = None,
) -> ThrottlingMiddleware:
    """A client middleware for ``aiohttp.ClientSession(middlewares=...)`` that uses ``limiter``.

    :param limiter: decides when each request may be sent. One limiter can
        serve several sessions (and other clients) at once.
    :param budgets: ``{budget: scope}``, see :class:`ThrottlingMiddleware`.
    :param consumed: the real cost from the response, see :class:`ThrottlingMiddleware`.

    Usage::

        session = aiohttp.ClientSession(middlewares=(middleware(limiter),))

    Where it goes in ``middlewares`` matters when another middleware sends
    more than once (retries, auth refresh): put the throttling middleware
    last (closest to the network) to throttle every attempt, first to
    throttle each call once.
    """
    return ThrottlingMiddleware(limiter, budgets=budgets, consumed=consumed)
