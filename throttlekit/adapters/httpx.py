"""Throttle ``httpx.AsyncClient`` with a transport that wraps any other transport.

:class:`ThrottledTransport` sits between the client and the transport that
really sends (``httpx.AsyncHTTPTransport()`` by default). For every request,
including each hop of a redirect chain, it

1. waits for a permit from the :class:`~throttlekit.Limiter` (the
   ``httpx.Request`` is the request-like: its URL gives the scopes, and
   ``request.extensions["throttling_scopes"]`` overrides them;
   ``request.extensions["throttling_priority"]`` sets the priority);
2. sends it through the inner transport;
3. records the status, headers and latency (seconds from handing the request
   to the inner transport until its response headers arrived, connection
   set-up included), or the exception that ended the request, which is then
   re-raised unchanged;
4. gives the concurrency slot back when the response is **closed** -- after
   the body has been read (``client.get()`` does that for you) or when a
   streamed response is closed -- so streamed bodies count toward
   concurrency. Errors and cancellation before that give it back at once.

Usage::

    import httpx
    import throttlekit
    from throttlekit.adapters.httpx import ThrottledTransport

    limiter = throttlekit.Limiter(default=throttlekit.ScopePolicy(concurrency=2, delay=0.5))
    async with httpx.AsyncClient(transport=ThrottledTransport(limiter)) as client:
        response = await client.get("https://example.com/")

For the synchronous ``httpx.Client``, :class:`SyncThrottledTransport` does
the same with a :class:`~throttlekit.SyncLimiter` (one client may be shared
by many threads); :func:`sync_client` builds such a client. The same
transport for httpx2 (the fork that the OpenAI and Anthropic SDKs send
through) is :mod:`throttlekit.adapters.httpx2`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._limiter import Limiter
from .._sync import SyncLimiter
from ._common import ConsumedHook, missing_extra, throttling, token_usage
from ._transport import AsyncThrottling, Library, SyncThrottling, make_client, make_sync_client

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise missing_extra("throttlekit.adapters.httpx", "httpx", "httpx") from exc

__all__ = [
    "SyncThrottledTransport",
    "ThrottledTransport",
    "client",
    "sync_client",
    "throttling",
    "token_usage",
]


#: httpx, as the shared transport code sees it.
_LIBRARY = Library(httpx)


class ThrottledTransport(AsyncThrottling, httpx.AsyncBaseTransport):
    """An ``httpx`` async transport that throttles every request through a limiter.

    :param limiter: decides when each request may be sent.
    :param transport: the transport that sends; ``None`` means a new
        ``httpx.AsyncHTTPTransport()``. It is closed with this one.
    :param budgets: which scope tracks which budget the server reports,
        ``{budget: scope}`` (e.g. ``{"tokens": "openai-tokens"}``): a low
        token budget then slows that scope only (see
        :meth:`Permit.record <throttlekit.Permit.record>`).
    :param consumed: ``consumed(response, body)`` gives the real cost per
        scope (e.g. :func:`token_usage`). With it, a JSON response (up to
        8 MiB) is read in the transport, ``body`` is its parsed document
        (``None`` for other responses), and the result reconciles the costs
        the request declared; ``None`` keeps them. Other responses (streams)
        are not read and still hold their slot until closed.

    Per request, through ``extensions`` (or, for requests an SDK sends for
    you, the :func:`throttling` context manager; extensions win):

    * ``"throttling_scopes"``: the request's scopes instead of the limiter's
      resolver (a scope name, a set of names or ``{scope: cost}``);
    * ``"throttling_priority"``: an int, higher is granted first (default 0);
    * ``"autothrottle_dont_adjust_delay"``: ``True`` keeps latency-driven
      controllers from learning from this response.

    Redirects reuse the request's extensions, so each hop is throttled with
    the same scopes override and priority.

    The slot is held until the response is closed. ``client.get()`` and
    friends read the body and close it for you; with ``client.stream()`` or
    ``client.send(..., stream=True)`` close the response (``async with`` or
    ``await response.aclose()``), as httpx asks anyway -- an unclosed
    response keeps its slot.

    A 429 or 503 with a small JSON body (up to 16 KiB; a body of unstated
    length is read that far, and a longer one given back whole) is read in
    the transport, for the wait it may state (Gemini's ``RetryInfo``; see
    :func:`throttlekit.headers.wants_body`).

    Exceptions from the limiter (:class:`~throttlekit.Overloaded`) and from
    the inner transport propagate unchanged; the latter are recorded first,
    so timeouts and connection errors feed the scope's backoff. A failure
    while the body streams (after the status was recorded) is recorded too,
    without a latency sample.

    Usage::

        transport = ThrottledTransport(limiter, httpx.AsyncHTTPTransport(http2=True, retries=1))
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(url, extensions={"throttling_scopes": {"api-budget": 2.0}})
    """

    _library = _LIBRARY

    def __init__(
        self,
        limiter: Limiter,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        budgets: Mapping[str, str] | None = None,
        consumed: ConsumedHook | None = None,
    ) -> None:
        super().__init__(limiter, transport, budgets=budgets, consumed=consumed)


def client(
    limiter: Limiter | None = None,
    *,
    budgets: Mapping[str, str] | None = None,
    consumed: ConsumedHook | None = None,
    **kwargs: Any,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose requests go through a :class:`ThrottledTransport`.

    :param limiter: the limiter to use; ``None`` makes a new
        :class:`~throttlekit.Limiter` with its defaults (one request at a time
        per host, 1 s apart).
    :param budgets: ``{budget: scope}``, see :class:`ThrottledTransport`.
    :param consumed: the real cost from the response, see :class:`ThrottledTransport`.
    :param kwargs: passed to ``httpx.AsyncClient``, except ``verify``, ``cert``,
        ``http1``, ``http2``, ``limits`` and ``proxy``, which configure the inner
        ``httpx.AsyncHTTPTransport`` (``trust_env`` goes to both). ``transport``
        is not accepted: wrap your own in :class:`ThrottledTransport` instead.

    httpx ignores the proxy environment variables when a transport is given;
    pass ``proxy=`` explicitly. Transports in ``mounts=`` are used as given
    (wrap them in :class:`ThrottledTransport` to throttle them too).

    Usage::

        async with throttlekit.adapters.httpx.client(limiter, http2=True, timeout=10) as client:
            response = await client.get("https://example.com/")
    """
    made: httpx.AsyncClient = make_client(ThrottledTransport, limiter, budgets, consumed, kwargs)
    return made


# -- the synchronous client ------------------------------------------------------------


class SyncThrottledTransport(SyncThrottling, httpx.BaseTransport):
    """An ``httpx`` transport for ``httpx.Client`` that throttles every request.

    The synchronous twin of :class:`ThrottledTransport`, with a
    :class:`~throttlekit.SyncLimiter`: the same per-request ``extensions``
    and :func:`throttling` settings, the same recording, and the slot held
    until the response is closed. One client (and limiter) may be shared by
    many threads.

    :param limiter: decides when each request may be sent.
    :param transport: the transport that sends; ``None`` means a new
        ``httpx.HTTPTransport()``. It is closed with this one.
    :param budgets: ``{budget: scope}``, see :class:`ThrottledTransport`.
    :param consumed: the real cost from the response, see :class:`ThrottledTransport`.

    Usage::

        transport = SyncThrottledTransport(limiter, httpx.HTTPTransport(retries=1))
        with httpx.Client(transport=transport) as client:
            client.get(url)
    """

    _library = _LIBRARY

    def __init__(
        self,
        limiter: SyncLimiter,
        transport: httpx.BaseTransport | None = None,
        *,
        budgets: Mapping[str, str] | None = None,
        consumed: ConsumedHook | None = None,
    ) -> None:
        super().__init__(limiter, transport, budgets=budgets, consumed=consumed)


def sync_client(
    limiter: SyncLimiter | None = None,
    *,
    budgets: Mapping[str, str] | None = None,
    consumed: ConsumedHook | None = None,
    **kwargs: Any,
) -> httpx.Client:
    """An ``httpx.Client`` whose requests go through a :class:`SyncThrottledTransport`.

    The synchronous twin of :func:`client` (the same keyword arguments; the
    inner transport is an ``httpx.HTTPTransport``); ``None`` makes a new
    :class:`~throttlekit.SyncLimiter` with its defaults.

    Usage::

        with throttlekit.adapters.httpx.sync_client(limiter, timeout=10) as client:
            response = client.get("https://example.com/")
    """
    made: httpx.Client = make_sync_client(
        SyncThrottledTransport, limiter, budgets, consumed, kwargs
    )
    return made
