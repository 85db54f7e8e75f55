"""throttlekit.adapters.httpx against a real local HTTP server (tests/_server.py).

Every request goes through a real ``httpx.AsyncHTTPTransport`` to the local
server, used as an HTTP proxy so that URLs keep their virtual host names
(``http://a.test/...``). Assertions are made on the server's records:
arrival times, requests in flight per host at arrival, disconnects.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest
from _grants import Grants
from _server import Hang, LocalServer, RateLimited, Redirect, Reply, Script, Stream, describe

from throttlekit import Backoff, Limiter, ScopePolicy
from throttlekit.adapters.httpx import ThrottledTransport, client

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
def server() -> Iterator[LocalServer]:
    with LocalServer() as running:
        yield running


def policy(**fields: Any) -> ScopePolicy:
    """A policy with no delays unless given, and quick backoff."""
    fields.setdefault("delay", 0.0)
    fields.setdefault("slot_delay", 0.0)
    fields.setdefault("backoff", QUICK_BACKOFF)
    return ScopePolicy(**fields)


def transport(limiter: Limiter, server: LocalServer) -> ThrottledTransport:
    return ThrottledTransport(limiter, httpx.AsyncHTTPTransport(proxy=server.proxy_url))


async def eventually(predicate: Callable[[], bool], within: float = 2.0) -> None:
    """Wait until ``predicate()`` holds (it reads state of the server's thread)."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - no event to wait on across threads
            await anyio.sleep(0.005)


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
    statuses: list[int] = []
    async with httpx.AsyncClient(transport=transport(limiter, server)) as http:

        async def fetch(url: str) -> None:
            statuses.append((await http.get(url)).status_code)

        # Open the 6 pooled connections to the proxy first (2 per host), so
        # the gaps the server sees are not skewed by connection setup.
        async with anyio.create_task_group() as tg:
            for n in range(6):
                tg.start_soon(fetch, f"http://warm-up-{n}.test/")
        server.wait_idle()
        server.reset()
        server.route(behaviour=Reply(latency=0.3))
        statuses.clear()
        started = LocalServer.clock()
        async with anyio.create_task_group() as tg:
            for url in urls:
                tg.start_soon(fetch, url)
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


async def test_per_request_scopes_and_priority(server: LocalServer) -> None:
    server.route(behaviour=Reply(latency=0.02))
    server.route("a.test", "/first", Reply(latency=0.3))
    limiter = Limiter(scopes={"budget": policy(concurrency=1)})
    order: list[str] = []
    async with httpx.AsyncClient(transport=transport(limiter, server)) as http:

        async def fetch(host: str, name: str, priority: int) -> None:
            extensions = {"throttling_scopes": "budget", "throttling_priority": priority}
            await http.get(f"http://{host}/{name}", extensions=extensions)
            order.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(fetch, "a.test", "first", 0)
            await eventually(lambda: len(server.hits()) == 1)
            for number in range(3):
                tg.start_soon(fetch, ("a.test", "b.test")[number % 2], f"low{number}", 0)
                await eventually(lambda n=number: limiter.statistics().waiting == n + 1)
            tg.start_soon(fetch, "b.test", "urgent", 5)
    server.wait_idle()
    hits = server.hits()
    # Two hosts, one shared scope: never two requests at once across hosts.
    for earlier, later in itertools.pairwise(hits):
        assert earlier.finished is not None
        assert later.arrived >= earlier.finished, describe(hits)
    assert [hit.path for hit in hits] == ["/first", "/urgent", "/low0", "/low1", "/low2"]
    assert set(limiter.statistics().scopes) == {"budget"}


async def test_redirects_are_throttled_per_hop(server: LocalServer) -> None:
    server.route("a.test", "/start", Redirect(location="/middle"))
    server.route("a.test", "/middle", Redirect(location="http://b.test/end"))
    limiter = Limiter(default=policy(concurrency=1, delay=0.2))
    async with httpx.AsyncClient(
        transport=transport(limiter, server), follow_redirects=True
    ) as http:
        response = await http.get("http://a.test/start")
    assert response.status_code == 200
    assert [str(r.url) for r in response.history] == ["http://a.test/start", "http://a.test/middle"]
    assert [(hit.host, hit.path) for hit in server.hits()] == [
        ("a.test", "/start"),
        ("a.test", "/middle"),
        ("b.test", "/end"),
    ]
    assert server.gaps("a.test")[0] >= 0.2 - SLACK
    assert set(limiter.statistics().scopes) == {"a.test", "b.test"}
    assert_idle(limiter)


# -- the slot is held until the response is closed, and never longer -------------------


async def test_streamed_response_holds_the_slot_until_closed(server: LocalServer) -> None:
    server.route("a.test", "/big", Stream(chunks=20, interval=0.05))
    limiter = Limiter(default=policy(concurrency=1))
    async with (
        httpx.AsyncClient(transport=transport(limiter, server)) as http,
        anyio.create_task_group() as tg,
    ):
        big = await http.send(http.build_request("GET", "http://a.test/big"), stream=True)
        assert big.status_code == 200  # the headers are here, the body is on its way
        tg.start_soon(http.get, "http://a.test/small")
        await eventually(lambda: limiter.statistics().waiting == 1)
        await anyio.sleep(0.15)
        assert [hit.path for hit in server.hits("a.test")] == ["/big"]
        assert limiter.statistics().in_flight == 1
        closed_at = LocalServer.clock()
        await big.aclose()
        # closing the response let /small go out
    server.wait_idle()
    big_hit, small_hit = server.hits("a.test")
    assert big_hit.disconnected  # closed before the 20 chunks were sent
    assert small_hit.arrived >= closed_at
    assert small_hit.in_flight == 1
    assert_idle(limiter)


async def test_body_read_completes_before_release(server: LocalServer) -> None:
    server.route("a.test", "/big", Stream(chunks=4, interval=0.05))
    limiter = Limiter(default=policy(concurrency=1))
    async with (
        httpx.AsyncClient(transport=transport(limiter, server)) as http,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(http.get, "http://a.test/big")
        await eventually(lambda: len(server.hits()) == 1)
        tg.start_soon(http.get, "http://a.test/small")
    server.wait_idle()
    big_hit, small_hit = server.hits("a.test")
    assert big_hit.finished is not None
    assert small_hit.arrived >= big_hit.finished
    assert not big_hit.disconnected
    assert_idle(limiter)


async def test_cancelled_request_leaves_no_slot_held(server: LocalServer) -> None:
    server.route("a.test", "/hang", Hang())
    limiter = Limiter(default=policy(concurrency=1))
    async with httpx.AsyncClient(transport=transport(limiter, server)) as http:
        async with anyio.create_task_group() as tg:
            tg.start_soon(http.get, "http://a.test/hang")
            await eventually(lambda: len(server.hits()) == 1)
            assert limiter.statistics().in_flight == 1
            tg.cancel_scope.cancel()
        assert_idle(limiter)
        with anyio.fail_after(1):
            response = await http.get("http://a.test/next")
    assert response.status_code == 200
    await eventually(lambda: server.hits("a.test", "/hang")[0].disconnected)
    scope = limiter.statistics().scopes["a.test"]
    assert scope.backoff_level == 0  # a cancellation is not a server signal
    assert_idle(limiter)


async def test_client_timeout_is_recorded_and_frees_the_slot(server: LocalServer) -> None:
    server.route("a.test", "/hang", Hang())
    limiter = Limiter(default=policy(concurrency=1))
    async with httpx.AsyncClient(transport=transport(limiter, server), timeout=0.1) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("http://a.test/hang")
        assert_idle(limiter)
        scope = limiter.statistics().scopes["a.test"]
        assert scope.last_signal == "ReadTimeout"
        assert scope.backoff_level == 1
        with anyio.fail_after(1):
            response = await http.get("http://a.test/next")
    assert response.status_code == 200
    assert_idle(limiter)


async def test_timeout_while_the_body_streams_is_recorded(server: LocalServer) -> None:
    server.route("a.test", "/slow", Stream(chunks=3, interval=0.5))
    limiter = Limiter(default=policy(concurrency=1))
    async with httpx.AsyncClient(transport=transport(limiter, server), timeout=0.1) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get("http://a.test/slow")
    assert_idle(limiter)
    assert limiter.statistics().scopes["a.test"].last_signal == "ReadTimeout"


async def test_connection_error_propagates_unchanged_and_is_recorded() -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    limiter = Limiter(default=policy(concurrency=1))
    async with httpx.AsyncClient(transport=ThrottledTransport(limiter)) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")
    assert_idle(limiter)
    assert limiter.statistics().scopes[f"127.0.0.1:{port}"].last_signal == "ConnectError"


# -- server push-back (the Backoff controller) ----------------------------------------


async def test_retry_after_blocks_the_host(server: LocalServer) -> None:
    server.route(
        "a.test", behaviour=Script(Reply(status=429, headers={"Retry-After": "1"}), Reply())
    )
    limiter = Limiter(default=policy(concurrency=2))
    async with httpx.AsyncClient(transport=transport(limiter, server)) as http:
        first = await http.get("http://a.test/0")
        assert first.status_code == 429
        async with anyio.create_task_group() as tg:
            for number in range(1, 4):
                tg.start_soon(http.get, f"http://a.test/{number}")
            tg.start_soon(http.get, "http://b.test/other")
    server.wait_idle()
    rejected, *later = server.hits("a.test")
    assert rejected.status == 429
    assert rejected.finished is not None
    assert len(later) == 3
    assert min(hit.arrived for hit in later) >= rejected.finished + 1.0 - SLACK, describe(
        server.hits()
    )
    # other hosts are not blocked
    other = server.hits("b.test")[0]
    assert other.arrived - rejected.finished < 0.5
    assert_idle(limiter)


@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
async def test_a_429_burst_slows_the_client_down(server: LocalServer) -> None:
    async def burst(backoff: Backoff | None, host: str) -> list[int | None]:
        server.route(host, behaviour=RateLimited(limit=3, window=0.3, style="none"))
        limiter = Limiter(default=policy(concurrency=3, backoff=backoff))
        async with (
            httpx.AsyncClient(transport=transport(limiter, server)) as http,
            anyio.create_task_group() as tg,
        ):
            for number in range(15):
                tg.start_soon(http.get, f"http://{host}/{number}")
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


# -- configuration, client(), closing ---------------------------------------------------


async def test_client_helper_routes_transport_options(server: LocalServer) -> None:
    limiter = Limiter(default=policy(concurrency=1, delay=0.2))
    async with client(limiter, proxy=server.proxy_url, http2=False, timeout=5) as http:
        # Open the pooled connection to the proxy first, so the gap the server
        # sees between the two a.test requests is not skewed by connection setup.
        await http.get("http://warm-up.test/")
        responses = [await http.get("http://a.test/x") for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 200]
    assert server.gaps("a.test")[0] >= 0.2 - SLACK
    with pytest.raises(TypeError, match="builds its own transport"):
        client(limiter, transport=httpx.AsyncHTTPTransport())


async def test_aclose_and_context_forward_to_the_inner_transport() -> None:
    class Inner(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.events: list[str] = []

        async def __aenter__(self) -> Inner:
            self.events.append("enter")
            return self

        async def __aexit__(self, *args: object) -> None:
            self.events.append("exit")

        async def aclose(self) -> None:
            self.events.append("aclose")

    inner = Inner()
    throttled = ThrottledTransport(Limiter(), inner)
    async with httpx.AsyncClient(transport=throttled):
        pass
    await throttled.aclose()
    assert inner.events == ["enter", "exit", "aclose"]
    assert "ThrottledTransport" in repr(throttled)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="limiter"):
        ThrottledTransport(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transport"):
        ThrottledTransport(Limiter(), httpx.HTTPTransport())  # type: ignore[arg-type]


async def test_bad_priority_extension_raises(server: LocalServer) -> None:
    async with httpx.AsyncClient(transport=transport(Limiter(), server)) as http:
        with pytest.raises(TypeError, match="priority"):
            await http.get("http://a.test/", extensions={"throttling_priority": "high"})
    assert server.hits() == []


# -- the documented examples -------------------------------------------------------------


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_example_crawl(server: LocalServer) -> None:
    example = load_example("httpx_example")
    server.route(behaviour=Reply(latency=0.3))
    urls = [f"http://{host}.test/{n}" for host in "abc" for n in range(3)]
    statuses = await example.crawl(urls, proxy=server.proxy_url)
    assert statuses == dict.fromkeys(urls, 200)
    for host in ("a.test", "b.test", "c.test"):
        assert server.max_in_flight(host) == 2
        assert min(server.gaps(host)) >= 0.25 - SLACK


async def test_example_search_api(server: LocalServer) -> None:
    example = load_example("httpx_example")
    server.route(behaviour=Reply(latency=0.02))
    statuses = await example.search_api(["a", "b", "c", "d"], proxy=server.proxy_url)
    assert statuses == [200] * 4
    hits = server.hits()
    # "d" is urgent: it goes first or right after the one that took the free slot
    assert [hit.query for hit in hits].index("q=d") <= 1, describe(hits)
    assert {hit.host for hit in hits} == {"eu.search.example", "us.search.example"}
    for earlier, later in itertools.pairwise(hits):  # one at a time across both hosts
        assert earlier.finished is not None
        assert later.arrived >= earlier.finished, describe(hits)


async def test_example_download(server: LocalServer) -> None:
    example = load_example("httpx_example")
    server.route("files.test", behaviour=Stream(chunks=3, interval=0.01, chunk_size=1000))
    assert await example.download("http://files.test/big", proxy=server.proxy_url) == 3000


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


@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
async def test_import_without_httpx_names_the_extra() -> None:
    code = BLOCK_IMPORT.format(blocked="httpx", module="throttlekit.adapters.httpx")
    result = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
        )
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "throttlekit-http[httpx]"' in result.stdout


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
    shown = readme_example("throttlekit.adapters.httpx")
    source = (ROOT / "examples" / "httpx_example.py").read_text()
    imports, function = shown.split("\n\n", 1)
    function, call = function.rsplit("\n\n", 1)  # the README also calls it
    assert imported_names(imports) <= imported_names(source)
    assert function in source
    assert "crawl" in call
    assert "print(" in call
