"""A local multi-host HTTP server that records every request, for end-to-end tests.

:class:`LocalServer` runs an :mod:`aiohttp.web` server on ``127.0.0.1`` (a free
port) in a background thread with its own asyncio loop, so it serves clients
on any event loop (asyncio, trio, Twisted/Scrapy) and in other processes.

**Virtual hosts.** Requests are told apart by host: the ``Host`` header of an
origin-form request, or the host of an absolute-form request (what a client
sends to a proxy). The easiest way to reach ``http://a.test/page`` is to use
the server as the client's HTTP proxy, so the URL (and the throttling scope
derived from it) keeps the real host name:

* httpx: ``httpx.AsyncHTTPTransport(proxy=server.proxy_url)``
* aiohttp: ``aiohttp.ClientSession(proxy=server.proxy_url)``
* Scrapy: ``request.meta["proxy"] = server.proxy_url`` (or the ``http_proxy``
  environment variable with ``HttpProxyMiddleware``)
* anything else: ``http://127.0.0.1:<port>/page`` with ``Host: a.test``.

**Behaviours.** :meth:`LocalServer.route` sets what a host/path answers;
lookups try ``(host, path)``, ``(host, "*")``, ``("*", path)``, ``("*", "*")``
and fall back to ``Reply()`` (200, ``b"ok"``). Built in:

* :class:`Reply` -- a fixed status, headers and body after a fixed ``latency``.
* :class:`Script` -- the n-th request gets the n-th behaviour, then ``then``
  (e.g. one 429 with ``Retry-After: 1``, then 200s).
* :class:`RateLimited` -- serves at most ``limit`` requests in any ``window``
  seconds; the others get 429 with ``Retry-After`` and/or ``RateLimit`` headers.
* :class:`Flaky` -- a seeded fraction of requests gets a 5xx.
* :class:`Stream` -- a chunked body sent slowly (``chunks`` x ``interval``).
* :class:`Hang` -- never answers (until the client disconnects or the server
  stops): for client timeouts.
* :class:`Redirect` -- a 3xx to ``location``.

Any object with ``async def respond(self, request, hit) -> web.StreamResponse``
is a behaviour too. Behaviours run on the server's thread, one loop, so their
state needs no locks.

**Records.** Every request becomes a :class:`Hit`: host, path, method, arrival
and finish time (``time.monotonic()``, see :meth:`LocalServer.clock`), the
number of requests of its host in flight when it arrived (itself included),
the status sent and whether the client went away first. A request is in
flight from arrival until its handler returns; for streamed bodies that is
after the last chunk, for others just before the bytes are written, i.e.
never after the client could have seen the end of the response.
:meth:`LocalServer.hits`, :meth:`LocalServer.gaps` and
:meth:`LocalServer.max_in_flight` read them from the test's thread.

Usage::

    with LocalServer() as server:
        server.route("a.test", behaviour=Reply(latency=0.05))
        server.route("b.test", "/api", RateLimited(limit=5, window=1.0))
        ...  # send requests through server.proxy_url
        assert server.max_in_flight("a.test") <= 2
        assert min(server.gaps("a.test")) >= 0.1
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs
from aiohttp import web

__all__ = [
    "Behaviour",
    "Flaky",
    "Hang",
    "Hit",
    "LocalServer",
    "RateLimited",
    "Redirect",
    "Reply",
    "Script",
    "Stream",
    "describe",
]

ANY = "*"


@attrs.define(kw_only=True)
class Hit:
    """One request the server received.

    :param host: the virtual host, lower-case, without the port.
    :param path: the request path (no query string).
    :param query: the query string (``""`` when none).
    :param method: the HTTP method.
    :param headers: the request headers.
    :param arrived: when the request's headers were parsed (:meth:`LocalServer.clock`).
    :param in_flight: requests of this host in flight at arrival, this one included.
    :param finished: when its handler returned; ``None`` while still running.
    :param status: the status sent (``None`` if the client left before).
    :param disconnected: the client closed the connection before the handler returned.
    """

    host: str
    path: str
    query: str
    method: str
    headers: Mapping[str, str]
    arrived: float
    in_flight: int
    finished: float | None = None
    status: int | None = None
    disconnected: bool = False


class Behaviour(Protocol):
    """What a route answers."""

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse: ...


@attrs.frozen(kw_only=True)
class Reply:
    """A fixed response after ``latency`` seconds (time to the response headers)."""

    status: int = 200
    body: bytes = b"ok"
    headers: Mapping[str, str] = attrs.field(factory=dict)
    latency: float = 0.0

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        return web.Response(status=self.status, body=self.body, headers=dict(self.headers))


class Script:
    """The n-th request (counted per route) gets ``behaviours[n]``, later ones ``then``.

    ``then`` defaults to the last behaviour given.
    """

    def __init__(self, *behaviours: Behaviour, then: Behaviour | None = None) -> None:
        if not behaviours:
            raise ValueError("Script needs at least one behaviour")
        self.behaviours = behaviours
        self.then = behaviours[-1] if then is None else then
        self.count = 0

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        index = self.count
        self.count += 1
        chosen = self.behaviours[index] if index < len(self.behaviours) else self.then
        return await chosen.respond(request, hit)


class RateLimited:
    """Serve at most ``limit`` requests in any ``window`` seconds; reject the rest with 429.

    Only served requests count toward the limit (a sliding window over this
    behaviour's own history: route it per host for per-host limits). A rejected
    request gets, depending on ``style``:

    * ``"retry-after"``: ``Retry-After: <seconds>``;
    * ``"ratelimit"``: IETF ``RateLimit-Policy: "default";q=<limit>;w=<window>``
      and ``RateLimit: "default";r=0;t=<seconds>``;
    * ``"x-ratelimit"``: ``X-RateLimit-Limit/Remaining/Reset`` (reset as a delta);
    * ``"both"``: ``Retry-After`` and the IETF headers;
    * ``"none"``: a bare 429.

    ``<seconds>`` is ``retry_after`` when given, else the whole seconds until
    the oldest served request leaves the window (at least 1). Served requests
    get ``inner``'s answer (default ``Reply()``) and, unless ``style`` is
    ``"none"`` or ``"retry-after"``, the matching remaining-quota headers.
    """

    STYLES = ("retry-after", "ratelimit", "x-ratelimit", "both", "none")

    def __init__(
        self,
        limit: int,
        window: float = 1.0,
        *,
        style: str = "retry-after",
        retry_after: int | None = None,
        inner: Behaviour | None = None,
    ) -> None:
        if style not in self.STYLES:
            raise ValueError(f"style must be one of {self.STYLES}, got {style!r}")
        self.limit = limit
        self.window = window
        self.style = style
        self.retry_after = retry_after
        self.inner: Behaviour = Reply() if inner is None else inner
        self.served: deque[float] = deque()
        self.rejected = 0

    def _headers(self, remaining: int, reset: int) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.style in ("ratelimit", "both"):
            headers["RateLimit-Policy"] = f'"default";q={self.limit};w={math.ceil(self.window)}'
            headers["RateLimit"] = f'"default";r={remaining};t={reset}'
        elif self.style == "x-ratelimit":
            headers["X-RateLimit-Limit"] = str(self.limit)
            headers["X-RateLimit-Remaining"] = str(remaining)
            headers["X-RateLimit-Reset"] = str(reset)
        return headers

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        now = time.monotonic()
        served = self.served
        while served and served[0] <= now - self.window:
            served.popleft()
        if len(served) >= self.limit:
            self.rejected += 1
            wait = served[0] + self.window - now
            seconds = self.retry_after if self.retry_after is not None else max(1, math.ceil(wait))
            headers = self._headers(0, seconds)
            if self.style in ("retry-after", "both"):
                headers["Retry-After"] = str(seconds)
            return web.Response(status=429, body=b"slow down", headers=headers)
        served.append(now)
        response = await self.inner.respond(request, hit)
        if self.style not in ("none", "retry-after") and not response.prepared:
            reset = max(1, math.ceil(served[0] + self.window - time.monotonic()))
            response.headers.update(self._headers(self.limit - len(served), reset))
        return response


class Flaky:
    """A seeded fraction ``probability`` of requests gets ``status``; the rest ``inner``."""

    def __init__(
        self,
        probability: float,
        *,
        status: int = 503,
        seed: int = 0,
        inner: Behaviour | None = None,
    ) -> None:
        self.probability = probability
        self.status = status
        self.inner: Behaviour = Reply() if inner is None else inner
        self.rng = random.Random(seed)

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        if self.rng.random() < self.probability:
            return web.Response(status=self.status, body=b"flaky")
        return await self.inner.respond(request, hit)


@attrs.frozen(kw_only=True)
class Stream:
    """A 200 with a chunked body: headers after ``latency``, then ``chunks`` chunks
    of ``chunk_size`` bytes, one every ``interval`` seconds."""

    chunks: int = 5
    interval: float = 0.05
    chunk_size: int = 1024
    latency: float = 0.0

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for index in range(self.chunks):
            if index:
                await asyncio.sleep(self.interval)
            await response.write(b"x" * self.chunk_size)
        await response.write_eof()
        return response


class Hang:
    """Never answer: wait until the client disconnects or the server stops (then 503)."""

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        await request.app[_STOPPING].wait()
        return web.Response(status=503, body=b"server stopping")


@attrs.frozen(kw_only=True)
class Redirect:
    """A ``status`` redirect to ``location`` (absolute, or a path on the same host)."""

    location: str
    status: int = 302
    latency: float = 0.0

    async def respond(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        return web.Response(status=self.status, headers={"Location": self.location})


_STOPPING = web.AppKey("stopping", asyncio.Event)


class LocalServer:
    """The recording multi-host server; see the module docstring.

    Use as a context manager (or call :meth:`start` / :meth:`stop`). Safe to
    configure and read from the test's thread while it serves.

    :param host: the address to listen on.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._routes: dict[tuple[str, str], Behaviour] = {}
        self._hits: list[Hit] = []
        self._in_flight: dict[str, int] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"<LocalServer {self.proxy_url} hits={len(self._hits)} routes={len(self._routes)}>"

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start serving; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("the server is already running")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # pragma: no cover - reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="LocalServer", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise RuntimeError("the local server failed to start") from failure[0]

    async def _serve(self) -> None:
        app = web.Application()
        self._stopping = asyncio.Event()
        app[_STOPPING] = self._stopping
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]

    def stop(self) -> None:
        """Stop serving (hanging requests end) and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shutdown() -> None:
            assert self._stopping is not None
            assert self._runner is not None
            self._stopping.set()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._loop = self._thread = None

    # -- configuration -------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        """``http://127.0.0.1:<port>``: use it as the client's HTTP proxy."""
        return f"http://{self.host}:{self.port}"

    def direct_url(self, path: str = "/") -> str:
        """A URL straight to the server (send it with a ``Host`` header to pick the host)."""
        return f"http://{self.host}:{self.port}{path}"

    def route(self, host: str = ANY, path: str = ANY, behaviour: Behaviour | None = None) -> None:
        """Answer requests to ``host`` (``"*"`` = any) and ``path`` (``"*"`` = any) with
        ``behaviour`` (default ``Reply()``)."""
        with self._lock:
            self._routes[(host.lower(), path)] = Reply() if behaviour is None else behaviour

    def reset(self) -> None:
        """Forget every route and record."""
        with self._lock:
            self._routes.clear()
            self._hits.clear()

    @staticmethod
    def clock() -> float:
        """The server's clock (``time.monotonic()``), the time base of every :class:`Hit`."""
        return time.monotonic()

    # -- records -------------------------------------------------------------------

    def hits(self, host: str | None = None, path: str | None = None) -> list[Hit]:
        """Copies of the requests received so far, in arrival order, optionally filtered."""
        with self._lock:
            found = [
                attrs.evolve(hit)
                for hit in self._hits
                if (host is None or hit.host == host) and (path is None or hit.path == path)
            ]
        return found

    def gaps(self, host: str, path: str | None = None) -> list[float]:
        """Seconds between consecutive arrivals at ``host`` (optionally one path)."""
        arrivals = [hit.arrived for hit in self.hits(host, path)]
        return [later - earlier for earlier, later in itertools.pairwise(arrivals)]

    def max_in_flight(self, host: str) -> int:
        """The most requests of ``host`` the server was handling at once."""
        return max((hit.in_flight for hit in self.hits(host)), default=0)

    def statuses(self, host: str | None = None) -> list[int | None]:
        """The statuses sent, in arrival order."""
        return [hit.status for hit in self.hits(host)]

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Block until no request is being handled (records are complete)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not any(self._in_flight.values()):
                    return
            time.sleep(0.005)
        raise TimeoutError(f"requests still in flight after {timeout} s: {self._in_flight}")

    # -- serving -------------------------------------------------------------------

    def _behaviour(self, host: str, path: str) -> Behaviour:
        routes = self._routes
        for key in ((host, path), (host, ANY), (ANY, path), (ANY, ANY)):
            found = routes.get(key)
            if found is not None:
                return found
        return _DEFAULT

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        host = (request.url.host or "").lower()
        with self._lock:
            count = self._in_flight.get(host, 0) + 1
            self._in_flight[host] = count
            hit = Hit(
                host=host,
                path=request.path,
                query=request.query_string,
                method=request.method,
                headers=dict(request.headers),
                arrived=time.monotonic(),
                in_flight=count,
            )
            self._hits.append(hit)
            behaviour = self._behaviour(host, request.path)
        try:
            response = await behaviour.respond(request, hit)
            hit.status = response.status
            return response
        except asyncio.CancelledError:
            hit.disconnected = True
            raise
        finally:
            with self._lock:
                hit.finished = time.monotonic()
                self._in_flight[host] -= 1


_DEFAULT = Reply()


def describe(hits: Iterable[Hit]) -> str:
    """A compact table of hits, for assertion messages."""
    rows = list(hits)
    if not rows:
        return "(no hits)"
    start = rows[0].arrived
    return "\n".join(
        f"{hit.arrived - start:7.3f}s {hit.host:10} {hit.path:16} in_flight={hit.in_flight} "
        f"status={hit.status} dur={(hit.finished or math.nan) - hit.arrived:.3f}"
        for hit in rows
    )
