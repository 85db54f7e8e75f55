"""Local HTTP sites that behave like real ones, for the throttling-quality suite.

Each run gets a fresh site on its own port of ``127.0.0.1`` (so its state --
queues, quota windows, random numbers -- starts clean and every client meets
the same site), served by :mod:`aiohttp` on an event loop in a background
thread of the benchmark process. The clients run in other processes, so the
site has a core of its own on a 2-core machine.

The models (see :data:`SITES` in :mod:`benchmarks.quality` for the numbers):

* :class:`CapacitySite` -- ``workers`` workers serve requests first come,
  first served, each taking an exponentially distributed time (mean
  ``service_time``): an M/M/c queue. Its capacity is ``workers /
  service_time`` requests per second; push harder and requests queue, so
  latency grows with load, as on a real server.
* :class:`QuotaSite` -- at most ``limit`` requests in any sliding ``window``;
  the others are refused with 429 after ``reject_latency`` (with
  ``Retry-After`` when ``retry_after`` is set). One model gives both the
  quota site (Retry-After: 1) and the fast-429 site (a 2 ms 429 without
  Retry-After, 200 ms pages).
* :class:`FixedSite` -- every request answered after the same latency: the
  CDN-fast site.

Every request is recorded as ``(arrived, finished, status)`` on
``time.monotonic()``, the clock the client processes read too.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

__all__ = [
    "CapacitySite",
    "FixedSite",
    "QuotaSite",
    "Record",
    "Responder",
    "SiteModel",
    "SiteServer",
]

#: One request as the site saw it: arrival, when its answer was ready, status.
Record = tuple[float, float, int]

#: A page body of a realistic small size (Scrapy and httpx read it all).
PAGE = b"<!doctype html><title>page</title>" + b"<p>throttlekit benchmark page</p>" * 30
REFUSAL = b"<!doctype html><title>429</title><p>Too many requests</p>"


class Responder(Protocol):
    """The live state of one site for one run: answers a request."""

    async def respond(self) -> tuple[int, dict[str, str], bytes]: ...


class SiteModel(Protocol):
    """A site's configuration; ``start`` makes the live state for one run."""

    def start(self, seed: int) -> Responder: ...


@dataclass(frozen=True)
class FixedSite:
    """Every request gets a 200 after ``latency`` seconds, however many arrive at once."""

    latency: float = 0.005

    def start(self, seed: int) -> Responder:
        return _Fixed(self.latency)


class _Fixed:
    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def respond(self) -> tuple[int, dict[str, str], bytes]:
        await asyncio.sleep(self.latency)
        return 200, {}, PAGE


@dataclass(frozen=True)
class CapacitySite:
    """An M/M/c server: ``workers`` workers, exponential service times of mean ``service_time``.

    Requests beyond the free workers wait in line, first come first served.
    """

    workers: int = 4
    service_time: float = 0.05

    @property
    def capacity(self) -> float:
        """Requests per second the site can serve at most."""
        return self.workers / self.service_time

    def start(self, seed: int) -> Responder:
        return _Capacity(self, random.Random(seed))


class _Capacity:
    def __init__(self, config: CapacitySite, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.free = config.workers
        self.queue: deque[asyncio.Future[None]] = deque()

    async def respond(self) -> tuple[int, dict[str, str], bytes]:
        if self.free and not self.queue:
            self.free -= 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self.queue.append(waiter)
            try:
                await waiter  # a worker is handed over by _release()
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # handed a worker while being cancelled: pass it on
                else:
                    self.queue.remove(waiter)
                raise
        try:
            await asyncio.sleep(self.rng.expovariate(1.0 / self.config.service_time))
        finally:
            self._release()
        return 200, {}, PAGE

    def _release(self) -> None:
        while self.queue:
            waiter = self.queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


@dataclass(frozen=True)
class QuotaSite:
    """At most ``limit`` requests served in any sliding ``window`` seconds; 429 beyond.

    :param limit: requests served per window.
    :param window: seconds.
    :param latency: seconds a served request takes.
    :param reject_latency: seconds a 429 takes.
    :param retry_after: the ``Retry-After`` value (whole seconds) of every 429;
        ``None`` sends none.
    """

    limit: int = 10
    window: float = 1.0
    latency: float = 0.05
    reject_latency: float = 0.001
    retry_after: int | None = 1

    @property
    def capacity(self) -> float:
        """Requests per second the site serves at most, on average."""
        return self.limit / self.window

    def start(self, seed: int) -> Responder:
        return _Quota(self)


class _Quota:
    def __init__(self, config: QuotaSite) -> None:
        self.config = config
        self.served: deque[float] = deque()
        headers = {"Retry-After": str(config.retry_after)} if config.retry_after else {}
        self.refusal_headers = headers

    async def respond(self) -> tuple[int, dict[str, str], bytes]:
        config = self.config
        now = time.monotonic()
        served = self.served
        while served and served[0] <= now - config.window:
            served.popleft()
        if len(served) >= config.limit:
            if config.reject_latency:
                await asyncio.sleep(config.reject_latency)
            return 429, dict(self.refusal_headers), REFUSAL
        served.append(now)
        await asyncio.sleep(config.latency)
        return 200, {}, PAGE


class SiteServer:
    """Serves sites on ``127.0.0.1`` from an event loop in a background thread.

    Usage::

        with SiteServer() as server, server.serve(QuotaSite(), seed=1) as site:
            ...  # send requests to site.url
        site.records  # [(arrived, finished, status), ...]
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
    def serve(self, model: SiteModel, *, seed: int = 0) -> Iterator[RunningSite]:
        """Serve a fresh instance of ``model`` on a new port for the duration of the block."""
        site = RunningSite(model.start(seed))
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

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.records: list[Record] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

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

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        status, headers, body = await self.responder.respond()
        self.records.append((arrived, time.monotonic(), status))
        return web.Response(status=status, body=body, headers=headers, content_type="text/html")
