"""throttlekit.adapters.aiohttp against a real local HTTP server (tests/_server.py).

Every request goes through a real ``aiohttp.ClientSession`` to the local
server, used as an HTTP proxy so that URLs keep their virtual host names
(``http://a.test/...``). Assertions are made on the server's records:
arrival times, requests in flight per host at arrival, disconnects.
aiohttp runs on asyncio only.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import itertools
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from _grants import Grants
from _server import Hang, LocalServer, RateLimited, Redirect, Reply, Script, Stream, describe

from throttlekit import Backoff, Limiter, ScopePolicy
from throttlekit.adapters import aiohttp as adapter
from throttlekit.adapters.aiohttp import ThrottlingMiddleware, middleware, throttling

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent

#: How much closer than the limiter's grant spacing two arrivals may be seen
#: by the server: the time from grant to arrival varies by a few ms, more for
#: a request that opens a new connection on a busy machine.
SLACK = 0.05

#: Backoff that reacts within the time of a test: a small first step (its cap
#: also caps Retry-After waits, so it stays above the 1 s the tests ask for).
QUICK_BACKOFF = Backoff(min_delay=0.05, max_delay=2.0, jitter=0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer() as running:
        yield running


def policy(**fields: Any) -> ScopePolicy:
    """A policy with no delays unless given, and quick backoff."""
    fields.setdefault("delay", 0.0)
    fields.setdefault("slot_delay", 0.0)
    fields.setdefault("backoff", QUICK_BACKOFF)
    return ScopePolicy(**fields)


@asynccontextmanager
async def session(
    limiter: Limiter, server: LocalServer, **kwargs: Any
) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        proxy=server.proxy_url, middlewares=(middleware(limiter),), **kwargs
    ) as http:
        yield http


async def get(http: aiohttp.ClientSession, url: str, **kwargs: Any) -> int:
    """GET ``url``, read the body, return the status."""
    async with http.get(url, **kwargs) as response:
        await response.read()
        return response.status


async def eventually(predicate: Callable[[], bool], within: float = 2.0) -> None:
    """Wait until ``predicate()`` holds (it reads state of the server's thread)."""

    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110 - no event to wait on across threads
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), within)


def assert_idle(limiter: Limiter) -> None:
    stats = limiter.statistics()
    assert stats.in_flight == 0, stats
    assert stats.waiting == 0, stats


# -- throttling seen from the server -------------------------------------------------


async def test_per_host_concurrency_and_delay(server: LocalServer) -> None:
    server.route(behaviour=Reply(latency=0.3))
    limiter = Limiter(default=policy(concurrency=2, delay=0.2))
    grants = Grants()
    limiter.add_listener(grants)
    hosts = ("a.test", "b.test", "c.test")
    urls = [f"http://{hosts[n % 3]}/page/{n}" for n in range(20)]
    async with session(limiter, server) as http:
        started = LocalServer.clock()
        statuses = await asyncio.gather(*(get(http, url) for url in urls))
    server.wait_idle()
    assert statuses == [200] * 20
    for host in hosts:
        hits = server.hits(host)
        assert len(hits) in (6, 7)
        assert server.max_in_flight(host) == 2, describe(hits)
        # The delay, where the sends leave (at the server, on a loaded machine,
        # a request that arrived late once made the next gap 0.1475 s).
        assert min(grants.gaps(host)) >= 0.2 - 1e-6, grants.gaps(host)
        # No head-of-line blocking: every host starts at once.
        assert hits[0].arrived - started < 0.2 - SLACK, describe(server.hits())
    assert_idle(limiter)


async def test_throttling_sets_scopes_and_priority(server: LocalServer) -> None:
    server.route(behaviour=Reply(latency=0.02))
    server.route("a.test", "/first", Reply(latency=0.3))
    limiter = Limiter(scopes={"budget": policy(concurrency=1)})
    async with session(limiter, server) as http:

        async def fetch(host: str, name: str, priority: int) -> None:
            with throttling(scopes="budget", priority=priority):
                await get(http, f"http://{host}/{name}")

        tasks = [asyncio.create_task(fetch("a.test", "first", 0))]
        await eventually(lambda: len(server.hits()) == 1)
        for number in range(3):
            tasks.append(
                asyncio.create_task(fetch(("a.test", "b.test")[number % 2], f"low{number}", 0))
            )
            await eventually(lambda n=number: limiter.statistics().waiting == n + 1)
        tasks.append(asyncio.create_task(fetch("b.test", "urgent", 5)))
        await asyncio.gather(*tasks)
        # outside the block, the resolver decides again
        await get(http, "http://c.test/alone")
    server.wait_idle()
    hits = server.hits()
    for earlier, later in itertools.pairwise(hits[:5]):
        assert earlier.finished is not None
        assert later.arrived >= earlier.finished, describe(hits)
    assert [hit.path for hit in hits] == ["/first", "/urgent", "/low0", "/low1", "/low2", "/alone"]
    assert set(limiter.statistics().scopes) == {"budget", "c.test"}
    assert_idle(limiter)


async def test_throttling_blocks_nest_and_validate() -> None:
    with throttling(scopes={"api": 2.0}):
        with throttling(priority=3):
            options = adapter.options()
            assert options.scopes == {"api": 2.0}
            assert options.priority == 3
        assert adapter.options().priority == 0
    assert adapter.options().scopes is None
    with pytest.raises(TypeError, match="priority"), throttling(priority="high"):  # type: ignore[arg-type]
        pass
    with pytest.raises(ValueError, match="cost"), throttling(scopes={"api": -1}):
        pass
    with pytest.raises(TypeError, match="adjust_delay"), throttling(adjust_delay=1):  # type: ignore[arg-type]
        pass


async def test_redirects_are_throttled_per_hop(server: LocalServer) -> None:
    server.route("a.test", "/start", Redirect(location="/middle"))
    server.route("a.test", "/middle", Redirect(location="http://b.test/end"))
    limiter = Limiter(default=policy(concurrency=1, delay=0.2))
    async with session(limiter, server) as http, http.get("http://a.test/start") as response:
        assert response.status == 200
        assert [str(r.url) for r in response.history] == [
            "http://a.test/start",
            "http://a.test/middle",
        ]
        await response.read()
    assert [(hit.host, hit.path) for hit in server.hits()] == [
        ("a.test", "/start"),
        ("a.test", "/middle"),
        ("b.test", "/end"),
    ]
    # /middle had to wait for /start's slot (concurrency 1) and the delay
    assert server.gaps("a.test")[0] >= 0.2 - SLACK
    assert set(limiter.statistics().scopes) == {"a.test", "b.test"}
    assert_idle(limiter)


# -- the slot is held until the response is released, and never longer -----------------


async def test_unread_streamed_response_holds_the_slot_until_released(
    server: LocalServer,
) -> None:
    server.route("a.test", "/big", Stream(chunks=20, interval=0.05))
    limiter = Limiter(default=policy(concurrency=1))
    async with session(limiter, server) as http:
        async with http.get("http://a.test/big") as big:
            assert big.status == 200  # the headers are here, the body is on its way
            await big.content.readexactly(1024)
            small = asyncio.create_task(get(http, "http://a.test/small"))
            await eventually(lambda: limiter.statistics().waiting == 1)
            await asyncio.sleep(0.15)
            assert [hit.path for hit in server.hits("a.test")] == ["/big"]
            assert limiter.statistics().in_flight == 1
            released_at = LocalServer.clock()
        # leaving the block released the response: /small went out
        assert await small == 200
    server.wait_idle()
    big_hit, small_hit = server.hits("a.test")
    assert big_hit.disconnected  # released before the 20 chunks were sent
    assert small_hit.arrived >= released_at
    assert_idle(limiter)


async def test_a_fully_received_body_frees_the_slot(server: LocalServer) -> None:
    server.route("a.test", "/big", Stream(chunks=4, interval=0.05))
    limiter = Limiter(default=policy(concurrency=1))
    async with session(limiter, server) as http:
        big = asyncio.create_task(get(http, "http://a.test/big"))
        await eventually(lambda: len(server.hits()) == 1)
        # not released by the caller: the body's end gives the connection back
        async with http.get("http://a.test/small") as response:
            assert response.status == 200
            await eventually(lambda: limiter.statistics().in_flight == 0)
        assert await big == 200
    server.wait_idle()
    big_hit, small_hit = server.hits("a.test")
    assert big_hit.finished is not None
    assert small_hit.arrived >= big_hit.finished
    assert not big_hit.disconnected
    assert_idle(limiter)


async def test_cancelled_request_leaves_no_slot_held(server: LocalServer) -> None:
    server.route("a.test", "/hang", Hang())
    limiter = Limiter(default=policy(concurrency=1))
    async with session(limiter, server) as http:
        hanging = asyncio.create_task(get(http, "http://a.test/hang"))
        await eventually(lambda: len(server.hits()) == 1)
        assert limiter.statistics().in_flight == 1
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        assert_idle(limiter)
        assert await asyncio.wait_for(get(http, "http://a.test/next"), 1) == 200
    await eventually(lambda: server.hits("a.test", "/hang")[0].disconnected)
    assert limiter.statistics().scopes["a.test"].backoff_level == 0
    assert_idle(limiter)


async def test_sock_read_timeout_is_recorded_and_frees_the_slot(server: LocalServer) -> None:
    server.route("a.test", "/hang", Hang())
    limiter = Limiter(default=policy(concurrency=1))
    async with session(limiter, server, timeout=aiohttp.ClientTimeout(sock_read=0.1)) as http:
        with pytest.raises(aiohttp.SocketTimeoutError):
            await get(http, "http://a.test/hang")
        assert_idle(limiter)
        scope = limiter.statistics().scopes["a.test"]
        assert scope.last_signal == "SocketTimeoutError"
        assert scope.backoff_level == 1
        assert await asyncio.wait_for(get(http, "http://a.test/next"), 1) == 200
    assert_idle(limiter)


async def test_total_timeout_is_recorded_and_frees_the_slot(server: LocalServer) -> None:
    server.route("a.test", "/hang", Hang())
    limiter = Limiter(default=policy(concurrency=1))
    async with session(limiter, server, timeout=aiohttp.ClientTimeout(total=0.1)) as http:
        with pytest.raises(TimeoutError):
            await get(http, "http://a.test/hang")
        assert_idle(limiter)
        scope = limiter.statistics().scopes["a.test"]
        assert scope.last_signal == "TimeoutError"
        assert scope.backoff_level == 1
        assert await asyncio.wait_for(get(http, "http://a.test/next"), 1) == 200
    assert_idle(limiter)


async def test_total_timeout_while_connecting_is_recorded() -> None:
    # A listener whose accept queue is full: new connections hang in SYN-SENT,
    # so aiohttp's total timeout fires during connection set-up, where it
    # cancels the request task instead of raising inside it.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
            limiter = Limiter(default=policy(concurrency=1))
            async with aiohttp.ClientSession(
                middlewares=(middleware(limiter),), timeout=aiohttp.ClientTimeout(total=0.2)
            ) as http:
                with pytest.raises(TimeoutError):
                    await get(http, f"http://127.0.0.1:{port}/")
        finally:
            for filler in fillers:
                filler.close()
    assert_idle(limiter)
    assert limiter.statistics().scopes[f"127.0.0.1:{port}"].last_signal == "TimeoutError"


async def test_total_timeout_while_waiting_for_a_permit(server: LocalServer) -> None:
    server.route("a.test", "/slow", Reply(latency=0.4))
    limiter = Limiter(default=policy(concurrency=1))
    async with session(limiter, server) as http:
        slow = asyncio.create_task(get(http, "http://a.test/slow"))
        await eventually(lambda: len(server.hits()) == 1)
        with pytest.raises(TimeoutError):
            await get(http, "http://a.test/queued", timeout=aiohttp.ClientTimeout(total=0.1))
        assert limiter.statistics().waiting == 0
        assert await slow == 200
    assert [hit.path for hit in server.hits()] == ["/slow"]  # the queued one never went out
    assert limiter.statistics().scopes["a.test"].backoff_level == 0  # nothing was sent
    assert_idle(limiter)


async def test_connection_error_propagates_unchanged_and_is_recorded() -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    limiter = Limiter(default=policy(concurrency=1))
    async with aiohttp.ClientSession(middlewares=(middleware(limiter),)) as http:
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(http, f"http://127.0.0.1:{port}/")
    assert_idle(limiter)
    assert limiter.statistics().scopes[f"127.0.0.1:{port}"].last_signal == "ClientConnectorError"


# -- server push-back (the Backoff controller) ----------------------------------------


async def test_retry_after_blocks_the_host(server: LocalServer) -> None:
    too_fast = Reply(status=429, headers={"Retry-After": "1"})
    server.route("a.test", behaviour=Script(too_fast, Reply()))
    limiter = Limiter(default=policy(concurrency=2))
    async with session(limiter, server) as http:
        assert await get(http, "http://a.test/0") == 429
        await asyncio.gather(
            *(get(http, f"http://a.test/{number}") for number in range(1, 4)),
            get(http, "http://b.test/other"),
        )
    server.wait_idle()
    rejected, *later = server.hits("a.test")
    assert rejected.status == 429
    assert rejected.finished is not None
    assert len(later) == 3
    assert min(hit.arrived for hit in later) >= rejected.finished + 1.0 - SLACK, describe(
        server.hits()
    )
    # other hosts are not blocked
    assert server.hits("b.test")[0].arrived - rejected.finished < 0.5
    assert_idle(limiter)


async def test_a_429_burst_slows_the_client_down(server: LocalServer) -> None:
    async def burst(backoff: Backoff | None, host: str) -> list[int | None]:
        server.route(host, behaviour=RateLimited(limit=3, window=0.3, style="none"))
        limiter = Limiter(default=policy(concurrency=3, backoff=backoff))
        async with session(limiter, server) as http:
            await asyncio.gather(*(get(http, f"http://{host}/{n}") for n in range(15)))
        server.wait_idle()
        return server.statuses(host)

    blind = await burst(None, "blind.test")
    polite = await burst(QUICK_BACKOFF, "polite.test")
    assert blind.count(429) >= 10  # the server allows 3 per 0.3 s
    assert polite.count(429) < blind.count(429), describe(server.hits("polite.test"))
    # Backoff stepped the delay up (0.05 s, then doubling) until the 429s
    # stopped: the client ends up sending well below the server's 10/s.
    settled = server.gaps("polite.test")[-5:]
    assert min(settled) >= 2 * QUICK_BACKOFF.min_delay - SLACK / 2, describe(
        server.hits("polite.test")
    )


# -- a shared backend: the release after a response is a round trip -------------------


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A throwaway redis-server on a free port of 127.0.0.1."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.mark.redis
async def test_shared_backend_release_after_the_body(server: LocalServer, redis_url: str) -> None:
    redis_backend = pytest.importorskip("throttlekit.backends.redis")
    backend = redis_backend.RedisBackend.from_url(redis_url, prefix="adapter-test")
    limiter = Limiter(default=policy(concurrency=1), backend=backend)
    server.route("a.test", "/big", Stream(chunks=4, interval=0.05))
    try:
        async with session(limiter, server) as http:
            # The body's end is seen in aiohttp's synchronous connection
            # callback; the middleware finishes the release in a task.
            big = asyncio.create_task(get(http, "http://a.test/big"))
            await eventually(lambda: len(server.hits()) == 1)
            assert await asyncio.wait_for(get(http, "http://a.test/small"), 5) == 200
            assert await big == 200
    finally:
        await backend.aclose()
    server.wait_idle()
    big_hit, small_hit = server.hits("a.test")
    assert big_hit.finished is not None
    assert small_hit.arrived >= big_hit.finished
    assert backend.statistics().release_calls == 2


# -- configuration -----------------------------------------------------------------------


def test_middleware_needs_a_limiter() -> None:
    with pytest.raises(TypeError, match="limiter"):
        middleware(None)  # type: ignore[arg-type]
    limiter = Limiter()
    made = middleware(limiter)
    assert isinstance(made, ThrottlingMiddleware)
    assert made.limiter is limiter
    assert "ThrottlingMiddleware" in repr(made)


# -- the documented examples -------------------------------------------------------------


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_example_crawl(server: LocalServer) -> None:
    example = load_example("aiohttp_example")
    server.route(behaviour=Reply(latency=0.3))
    urls = [f"http://{host}.test/{n}" for host in "abc" for n in range(3)]
    statuses = await example.crawl(urls, proxy=server.proxy_url)
    assert statuses == dict.fromkeys(urls, 200)
    for host in ("a.test", "b.test", "c.test"):
        assert server.max_in_flight(host) == 2
        assert min(server.gaps(host)) >= 0.25 - SLACK


async def test_example_search_api(server: LocalServer) -> None:
    example = load_example("aiohttp_example")
    server.route(behaviour=Reply(latency=0.02))
    statuses = await example.search_api(["a", "b", "c", "d"], proxy=server.proxy_url)
    assert statuses == [200] * 4
    hits = server.hits()
    assert [hit.query for hit in hits] == ["q=a", "q=d", "q=b", "q=c"]  # "d" is urgent
    assert {hit.host for hit in hits} == {"eu.search.example", "us.search.example"}
    for earlier, later in itertools.pairwise(hits):  # one at a time across both hosts
        assert earlier.finished is not None
        assert later.arrived >= earlier.finished, describe(hits)


# -- optional dependency ----------------------------------------------------------------

BLOCK_IMPORT = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == {blocked!r} or name.startswith({blocked!r} + "."):
            raise ImportError(f"No module named {{name!r}} (blocked)")
        return None

sys.meta_path.insert(0, Block())
import throttlekit
assert {blocked!r} not in sys.modules, "import throttlekit imported {blocked}"
try:
    import {module}
except ImportError as exc:
    print(exc)
else:
    raise SystemExit("{module} imported without {blocked}")
"""


def test_import_without_aiohttp_names_the_extra() -> None:
    code = BLOCK_IMPORT.format(blocked="aiohttp", module="throttlekit.adapters.aiohttp")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "throttlekit-http[aiohttp]"' in result.stdout


def readme_example(marker: str) -> str:
    """The README's python block that contains ``marker``, unindented."""
    text = (ROOT / "README.rst").read_text()
    blocks = re.findall(r"\.\. code-block:: python\n((?:\n|    .*\n)+)", text)
    block = next(block for block in blocks if marker in block)
    return "\n".join(line[4:] for line in block.strip("\n").splitlines()) + "\n"


def imported_names(code: str) -> set[tuple[str, str]]:
    """``(module, name)`` for every name the top-level imports of ``code`` bind."""
    names = set()
    for node in ast.parse(code).body:
        if isinstance(node, ast.Import):
            names |= {(alias.name, "") for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {(node.module or "", alias.name) for alias in node.names}
    return names


def test_readme_shows_the_tested_example() -> None:
    shown = readme_example("throttlekit.adapters.aiohttp")
    source = (ROOT / "examples" / "aiohttp_example.py").read_text()
    imports, function = shown.split("\n\n", 1)
    function, call = function.rsplit("\n\n", 1)  # the README also calls it
    assert imported_names(imports) <= imported_names(source)
    assert function in source
    assert "crawl" in call
    assert "print(" in call


async def test_an_in_memory_permit_is_released_at_once() -> None:
    """aiohttp releases a connection synchronously: an in-memory permit goes back then."""
    from throttlekit.adapters._common import HeldPermit

    limiter = Limiter(default=ScopePolicy(concurrency=1, delay=0))
    held = await HeldPermit.acquire(limiter, "https://a.example/")
    assert limiter.statistics().in_flight == 1
    assert held.release_now()
    assert held.released
    assert limiter.statistics().in_flight == 0
