"""The throttling-quality suite's local sites: the testing kit's server models, served over HTTP.

Each site is a :mod:`throttlekit.testing` server model (:class:`QuotaServer`,
:class:`CapacityServer`, :class:`FlakyServer`, :class:`CDNServer`...), the
same models the virtual-time tests use, answering real HTTP requests on its
own port of ``127.0.0.1``. A request is answered by the model's responder at
its arrival, on a clock that starts at the site's first request (so fixed
windows and quota changes line up with the counted span), and the response
is sent after the latency the model gave it. Every run gets a fresh site
(fresh queues, quota windows and seeded random numbers), served by
:mod:`aiohttp` on an event loop in a background thread of the benchmark
process; the clients run in other processes.

Every request is recorded as :data:`Record`: ``(arrived, finished, status,
wait)`` on ``time.monotonic()``, the clock the client processes read too.
``wait`` is the wait the response announced (seconds from ``finished``): its
``Retry-After``, or the reset of a quota whose ``remaining`` it says is 0
(draft-10 ``RateLimit`` ``r=0``'s ``t``, ``X-RateLimit-Remaining: 0``'s
``X-RateLimit-Reset``, delta or epoch seconds); 0.0 when it announced none.
It is read from the headers the site sent, independently of throttlekit's
parser.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from aiohttp import web

from throttlekit.testing import ServerModel, SimRequest

__all__ = ["Record", "RunningSite", "SiteServer", "announced_wait"]

#: One request as the site saw it: arrival, when its answer was sent, status,
#: and the wait (seconds from the answer) it announced.
Record = tuple[float, float, int, float]

_R_PARAMETER = re.compile(r";\s*r\s*=\s*(\d+)")
_T_PARAMETER = re.compile(r";\s*t\s*=\s*(\d+)")


def announced_wait(headers: Mapping[str, str], *, now: float) -> float:
    """Seconds from now during which ``headers`` ask the client not to send.

    Understands the forms the sites send: ``Retry-After`` in whole seconds
    (it wins), a draft-10 ``RateLimit`` item with ``r=0`` (its ``t``) and
    ``X-RateLimit-Remaining: 0`` (its ``X-RateLimit-Reset``: epoch seconds
    above ``1e9``, relative to ``now`` on the wall clock, else delta seconds).
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    if "retry-after" in lowered:
        return float(lowered["retry-after"])
    waits = [0.0]
    field = lowered.get("ratelimit")
    if field is not None:
        remaining, reset = _R_PARAMETER.search(field), _T_PARAMETER.search(field)
        if remaining is not None and reset is not None and int(remaining.group(1)) == 0:
            waits.append(float(reset.group(1)))
    if lowered.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in lowered:
        reset_at = float(lowered["x-ratelimit-reset"])
        waits.append(reset_at - now if reset_at > 1e9 else reset_at)
    return max(waits)


class SiteServer:
    """Serves sites on ``127.0.0.1`` from an event loop in a background thread.

    Usage::

        with SiteServer() as server, server.serve(QuotaServer(), seed=1) as site:
            ...  # send requests to site.url
        site.records  # [(arrived, finished, status, wait), ...]
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SiteServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="quality-sites", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def __exit__(self, *exc_info: object) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        self._loop = self._thread = None

    def _call(self, coroutine: object) -> object:
        assert self._loop is not None, "use SiteServer as a context manager"
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)  # type: ignore[arg-type]

    @contextmanager
    def serve(self, model: ServerModel, *, seed: int = 0) -> Iterator[RunningSite]:
        """Serve a fresh instance of ``model`` on a new port for the duration of the block."""
        site = RunningSite(model, seed)
        self._call(site.start())
        try:
            yield site
        finally:
            self._call(site.stop())

    def cpu_time(self) -> float:
        """CPU seconds the server's thread has used so far."""

        async def read() -> float:
            return time.thread_time()

        value = self._call(read())
        assert isinstance(value, float)
        return value


class RunningSite:
    """One site being served: its URL and what it has recorded."""

    def __init__(self, model: ServerModel, seed: int) -> None:
        self.responder = model.start(random.Random(seed))
        self.records: list[Record] = []
        self.port = 0
        #: When its first request arrived (``time.monotonic()``): the model's time 0.
        self.origin: float | None = None
        self._runner: web.AppRunner | None = None
        self._bodies: dict[int, bytes] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _body(self, size: int) -> bytes:
        body = self._bodies.get(size)
        if body is None:
            body = self._bodies[size] = b"<!doctype html><p>" + b"x" * max(0, size - 18)
        return body

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        if self.origin is None:
            self.origin = arrived
        answer = self.responder(SimRequest(url=str(request.url)), arrived - self.origin)
        if answer.latency > 0 and math.isfinite(answer.latency):
            await asyncio.sleep(answer.latency)
        if answer.status is None:  # a simulated failure: drop the connection
            self.records.append((arrived, time.monotonic(), 0, 0.0))
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError(str(answer.exception))
        headers = dict(answer.headers)
        finished = time.monotonic()
        wait = announced_wait(headers, now=time.time())
        self.records.append((arrived, finished, answer.status, wait))
        return web.Response(
            status=answer.status,
            body=self._body(answer.size) if answer.status < 400 else b"",
            headers=headers,
            content_type="text/html",
        )
