"""A local HTTP server playing simulated sites, and an httpx client timing its sends.

:class:`LocalSites` serves several sites on one port of 127.0.0.1, told apart
by the ``Host`` header; each site answers as a :mod:`throttlekit.testing`
server model (latency, status, headers, size, hangs), in real time. Clients
reach ``http://<site>/...`` by using the server as their HTTP proxy, so URLs
and throttling scopes keep the site names.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections import Counter
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
from aiohttp import web

from ..testing import Responder, ServerModel, SimRequest

__all__ = ["SENT_AT", "LocalSites", "Stopwatch"]

#: ``request.extensions`` key: when the request left the limiter for the network.
SENT_AT = "throttlekit.cli.sent_at"
#: ``request.extensions`` key: when its response headers arrived.
HEADERS_AT = "throttlekit.cli.headers_at"


class SiteRecord:
    """What one local site saw: arrivals, most requests at once, statuses sent."""

    __slots__ = ("arrivals", "in_flight", "max_in_flight", "statuses")

    def __init__(self) -> None:
        self.arrivals = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.statuses: Counter[int] = Counter()


class LocalSites:
    """Serve simulated sites on ``127.0.0.1``; use as ``async with`` (asyncio only).

    :param sites: server models by host name.
    :param seed: seeds the models' random numbers.
    """

    def __init__(self, sites: Mapping[str, ServerModel], *, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.sites = dict(sites)
        self._responders: dict[str, Responder] = {
            host.lower(): model.start(random.Random(rng.getrandbits(64)))
            for host, model in sorted(self.sites.items())
        }
        self.records = {host: SiteRecord() for host in self._responders}
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def proxy_url(self) -> str:
        """The URL to give clients as their HTTP proxy."""
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> LocalSites:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.1
        )
        await self._runner.setup()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        await web.SockSite(self._runner, listener).start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        host = (request.host or "").rpartition(":")[0] or (request.host or "")
        host = host.lower()
        responder = self._responders.get(host)
        if responder is None:
            return web.Response(status=404, text=f"no site {host!r} here\n")
        record = self.records[host]
        record.arrivals += 1
        record.in_flight += 1
        record.max_in_flight = max(record.max_in_flight, record.in_flight)
        try:
            answer = responder(SimRequest(url=str(request.url)), asyncio.get_running_loop().time())
            await asyncio.sleep(answer.latency)
            if answer.exception is not None or answer.status is None:
                # A hang (the client has given up by now) or a dropped connection.
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=504)  # never delivered: the connection is gone
            record.statuses[answer.status] += 1
            body = b"blocked" if answer.blocked else b"x" * answer.size
            return web.Response(status=answer.status, headers=dict(answer.headers), body=body)
        finally:
            record.in_flight -= 1


class Stopwatch(httpx.AsyncBaseTransport):
    """Wraps the transport that really sends and notes when it did, in ``request.extensions``.

    Put it *inside* the throttled transport, so :data:`SENT_AT` is the moment
    the limiter let the request go and :data:`HEADERS_AT` when the response
    headers arrived.
    """

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.extensions[SENT_AT] = anyio.current_time()
        response = await self._transport.handle_async_request(request)
        request.extensions[HEADERS_AT] = anyio.current_time()
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()
