"""Throttle ``httpx2.AsyncClient``, the client the OpenAI and Anthropic SDKs send through.

httpx2 is the maintained fork of httpx (the same API under the module name
``httpx2``); the current ``openai`` and ``anthropic`` SDKs depend on it
instead of httpx. :class:`ThrottledTransport` here is the transport of
:mod:`throttlekit.adapters.httpx`, the same code, built on httpx2's classes;
it needs httpx2 only (``pip install "throttlekit-http[httpx2]"``).

Usage::

    import httpx2
    import throttlekit
    from throttlekit.adapters.httpx2 import ThrottledTransport

    limiter = throttlekit.Limiter(default=throttlekit.ScopePolicy(concurrency=2, delay=0.5))
    async with httpx2.AsyncClient(transport=ThrottledTransport(limiter)) as client:
        response = await client.get("https://example.com/")

With an SDK, give it the throttled client::

    http_client = httpx2.AsyncClient(transport=ThrottledTransport(limiter))
    sdk = openai.AsyncOpenAI(http_client=http_client)

Everything the httpx transport's documentation says holds here: the
``extensions`` and :func:`throttling` settings, the slot held until the
response is closed, ``budgets=`` and ``consumed=``, a 429's small body read
for the wait it states.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._limiter import Limiter
from .._sync import SyncLimiter
from ._common import ConsumedHook, missing_extra, throttling, token_usage
from ._transport import AsyncThrottling, Library, SyncThrottling, make_client, make_sync_client

try:
    import httpx2
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise missing_extra("throttlekit.adapters.httpx2", "httpx2", "httpx2") from exc

__all__ = [
    "SyncThrottledTransport",
    "ThrottledTransport",
    "client",
    "sync_client",
    "throttling",
    "token_usage",
]

#: httpx2, as the shared transport code sees it.
_LIBRARY = Library(httpx2)


class ThrottledTransport(AsyncThrottling, httpx2.AsyncBaseTransport):
    """An ``httpx2`` async transport that throttles every request through a limiter.

    The parameters and behaviour are those of
    :class:`throttlekit.adapters.httpx.ThrottledTransport`, with httpx2's
    classes: ``transport=None`` means a new ``httpx2.AsyncHTTPTransport()``.

    :param limiter: decides when each request may be sent.
    :param transport: the transport that sends, closed with this one.
    :param budgets: which scope tracks which budget the server reports, ``{budget: scope}``.
    :param consumed: ``consumed(response, body)`` gives the real cost per scope
        (e.g. :func:`token_usage`).

    Usage::

        transport = ThrottledTransport(limiter, consumed=token_usage("openai-tokens"))
        sdk = openai.AsyncOpenAI(http_client=httpx2.AsyncClient(transport=transport))
    """

    _library = _LIBRARY

    def __init__(
        self,
        limiter: Limiter,
        transport: httpx2.AsyncBaseTransport | None = None,
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
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` whose requests go through a :class:`ThrottledTransport`.

    The arguments are those of :func:`throttlekit.adapters.httpx.client`:
    ``verify``, ``cert``, ``http1``, ``http2``, ``limits`` and ``proxy``
    configure the inner ``httpx2.AsyncHTTPTransport``, the rest go to the client.

    Usage::

        async with throttlekit.adapters.httpx2.client(limiter, timeout=10) as client:
            response = await client.get("https://example.com/")
    """
    made: httpx2.AsyncClient = make_client(ThrottledTransport, limiter, budgets, consumed, kwargs)
    return made


class SyncThrottledTransport(SyncThrottling, httpx2.BaseTransport):
    """An ``httpx2`` transport for ``httpx2.Client`` (the SDKs' ``OpenAI``, ``Anthropic``).

    The parameters and behaviour are those of
    :class:`throttlekit.adapters.httpx.SyncThrottledTransport`, with httpx2's
    classes and a :class:`~throttlekit.SyncLimiter`: ``transport=None``
    means a new ``httpx2.HTTPTransport()``.

    :param limiter: decides when each request may be sent.
    :param transport: the transport that sends, closed with this one.
    :param budgets: which scope tracks which budget the server reports, ``{budget: scope}``.
    :param consumed: ``consumed(response, body)`` gives the real cost per scope.

    Usage::

        transport = SyncThrottledTransport(throttlekit.SyncLimiter())
        sdk = openai.OpenAI(http_client=httpx2.Client(transport=transport))
    """

    _library = _LIBRARY

    def __init__(
        self,
        limiter: SyncLimiter,
        transport: httpx2.BaseTransport | None = None,
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
) -> httpx2.Client:
    """An ``httpx2.Client`` whose requests go through a :class:`SyncThrottledTransport`.

    The arguments are those of :func:`throttlekit.adapters.httpx.sync_client`.

    Usage::

        with throttlekit.adapters.httpx2.sync_client(limiter, timeout=10) as client:
            response = client.get("https://example.com/")
    """
    made: httpx2.Client = make_sync_client(
        SyncThrottledTransport, limiter, budgets, consumed, kwargs
    )
    return made
