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

import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from .._limiter import Limiter
from .._sync import SyncLimiter
from ._common import (
    ConsumedHook,
    SyncHeldPermit,
    body_too_large,
    check_budgets,
    is_json,
    json_body,
    missing_extra,
    throttling,
    token_usage,
)
from ._transport import TRANSPORT_OPTIONS, AsyncThrottling, Library, make_client

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

    _library = Library(httpx)

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


class SyncThrottledTransport(httpx.BaseTransport):
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

    def __init__(
        self,
        limiter: SyncLimiter,
        transport: httpx.BaseTransport | None = None,
        *,
        budgets: Mapping[str, str] | None = None,
        consumed: ConsumedHook | None = None,
    ) -> None:
        if not isinstance(limiter, SyncLimiter):
            raise TypeError(
                f"limiter must be a throttlekit.SyncLimiter (httpx.Client is synchronous), "
                f"got {limiter!r}"
            )
        if consumed is not None and not callable(consumed):
            raise TypeError(f"consumed must be callable or None, got {consumed!r}")
        if transport is None:
            transport = httpx.HTTPTransport()
        elif not isinstance(transport, httpx.BaseTransport):
            raise TypeError(f"transport must be an httpx.BaseTransport, got {transport!r}")
        self._limiter = limiter
        self._transport = transport
        self._budgets = check_budgets(budgets)
        self._consumed = consumed

    def __repr__(self) -> str:
        return f"<SyncThrottledTransport {self._limiter!r} over {self._transport!r}>"

    @property
    def limiter(self) -> SyncLimiter:
        """The limiter that throttles this transport's requests."""
        return self._limiter

    @property
    def transport(self) -> httpx.BaseTransport:
        """The wrapped transport that sends the requests."""
        return self._transport

    def __enter__(self) -> SyncThrottledTransport:
        self._transport.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._transport.__exit__(exc_type, exc_value, traceback)

    def close(self) -> None:
        """Close the inner transport."""
        self._transport.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Wait for a permit, send ``request`` through the inner transport, record how it went.

        The returned response's stream gives the permit back when it is closed.
        """
        held = SyncHeldPermit.acquire(self._limiter, request)
        try:
            try:
                response = self._transport.handle_request(request)
            except Exception as exc:
                held.failed(exc)
                raise
            latency = time.monotonic() - held.sent
            consumed = None
            if self._consumed is not None:
                body = None
                if is_json(response.headers) and not body_too_large(response.headers):
                    try:
                        body = json_body(response.read())
                    except Exception as exc:
                        held.body_failed(exc)
                        raise
                consumed = self._consumed(response, body)
            held.answered(
                response,
                status=response.status_code,
                headers=response.headers,
                latency=latency,
                consumed=consumed,
                budgets=self._budgets,
            )
            stream = response.stream
            if not isinstance(stream, httpx.SyncByteStream):
                raise TypeError(
                    f"the inner transport returned a response without a sync stream: {stream!r}"
                )
            response.stream = _SyncReleasingStream(stream, held)
        except BaseException:
            held.release()
            raise
        return response


class _SyncReleasingStream(httpx.SyncByteStream):
    """A response body that gives its permit back when it is closed; records a failure."""

    __slots__ = ("_held", "_stream")

    def __init__(self, stream: httpx.SyncByteStream, held: SyncHeldPermit) -> None:
        self._stream = stream
        self._held = held

    def __repr__(self) -> str:
        return f"<_SyncReleasingStream {self._held!r}>"

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except Exception as exc:
            self._held.body_failed(exc)
            raise

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._held.release()


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
    if "transport" in kwargs:
        raise TypeError(
            "sync_client() builds its own transport; pass "
            "SyncThrottledTransport(limiter, your_transport) to httpx.Client instead"
        )
    options = {name: kwargs.pop(name) for name in TRANSPORT_OPTIONS if name in kwargs}
    if "trust_env" in options:
        kwargs["trust_env"] = options["trust_env"]
    transport = SyncThrottledTransport(
        SyncLimiter() if limiter is None else limiter,
        httpx.HTTPTransport(**options),
        budgets=budgets,
        consumed=consumed,
    )
    return httpx.Client(transport=transport, **kwargs)
