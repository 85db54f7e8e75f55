"""throttlekit.adapters.requests against a real local HTTP server (tests/_server.py).

A real ``requests.Session`` sends every request through the local server used
as an HTTP proxy, so URLs keep their virtual host names (``http://a.test/``)
and each host is its own scope. Assertions are made on the server's records.
"""

from __future__ import annotations

import importlib.util
import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest
import requests
from _server import Hang, LocalServer, RateLimited, Reply, Script, Stream, describe
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from throttlekit import Adaptive, Backoff, Limiter, ScopePolicy, SyncLimiter
from throttlekit.adapters.httpx import ThrottledTransport
from throttlekit.adapters.requests import ThrottledAdapter, session, throttling

#: How much closer than the limiter's grant spacing two arrivals may be seen
#: by the server (the time from grant to arrival varies by a few ms).
SLACK = 0.05
ROOT = Path(__file__).resolve().parent.parent
QUICK_BACKOFF = Backoff(min_delay=0.05, max_delay=2.0, jitter=0)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer() as running:
        yield running


def policy(**fields: Any) -> ScopePolicy:
    fields.setdefault("delay", 0.0)
    fields.setdefault("backoff", QUICK_BACKOFF)
    return ScopePolicy(**fields)


def through(server: LocalServer, adapter: ThrottledAdapter) -> requests.Session:
    """A session that sends through ``adapter`` to the local server as its proxy."""
    http = requests.Session()
    http.trust_env = False
    http.proxies = {"http": server.proxy_url}
    http.mount("http://", adapter)
    return http


def assert_idle(limiter: SyncLimiter) -> None:
    stats = limiter.statistics()
    assert stats.in_flight == 0, stats
    assert stats.waiting == 0, stats


def test_32_threads_over_three_hosts_keep_each_hosts_policy(server: LocalServer) -> None:
    server.route(behaviour=Reply(latency=0.03))
    policies = {
        "a.test": policy(concurrency=1, delay=0.1),
        "b.test": policy(concurrency=3, delay=0.02),
        "c.test": policy(concurrency=2, delay=0.0),
    }
    limiter = SyncLimiter(scopes=policies, concurrency=None)
    http = through(server, ThrottledAdapter(limiter))
    urls = [f"http://{host}/page/{n}" for n in range(12) for host in policies]
    with ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(lambda url: http.get(url, timeout=10).status_code, urls))
    server.wait_idle()
    assert statuses == [200] * len(urls)
    for host, rule in policies.items():
        hits = server.hits(host)
        assert len(hits) == 12
        assert rule.concurrency is not None
        assert server.max_in_flight(host) <= rule.concurrency, describe(hits)
        if rule.delay:
            assert min(server.gaps(host)) >= rule.delay - SLACK, describe(hits)
    assert server.max_in_flight("c.test") == 2  # the loose host is not held back by the others
    assert_idle(limiter)


def test_retries_wait_out_retry_after_through_the_limiter(server: LocalServer) -> None:
    server.route(
        "a.test", behaviour=Script(Reply(status=429, headers={"Retry-After": "1"}), Reply())
    )
    limiter = SyncLimiter(default=policy(concurrency=4))
    retries = Retry(total=3, status_forcelist=[429], backoff_factor=0)
    http = through(server, ThrottledAdapter(limiter, retries=retries))
    response = http.get("http://a.test/", timeout=10)
    assert response.status_code == 200
    assert [hit.status for hit in server.hits("a.test")] == [429, 200]
    assert server.gaps("a.test")[0] >= 1.0 - SLACK
    stats = limiter.scope_statistics("a.test")
    assert stats is not None
    assert stats.last_signal == "429"
    assert_idle(limiter)


def test_a_429_holds_back_every_thread_of_its_host(server: LocalServer) -> None:
    server.route(
        "a.test", behaviour=Script(Reply(status=429, headers={"Retry-After": "1"}), Reply())
    )
    server.route("b.test", behaviour=Reply())
    limiter = SyncLimiter(default=policy(concurrency=4))
    http = through(server, ThrottledAdapter(limiter))
    assert http.get("http://a.test/first", timeout=10).status_code == 429
    refused = server.hits("a.test")[0].arrived
    started = time.monotonic()
    assert http.get("http://b.test/", timeout=10).status_code == 200  # another host: at once
    assert time.monotonic() - started < 0.5
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: http.get(f"http://a.test/{n}", timeout=10), range(8)))
    later = [hit.arrived for hit in server.hits("a.test")[1:]]
    assert len(later) == 8
    assert min(later) >= refused + 1.0 - SLACK
    assert_idle(limiter)


def test_exhausted_retries_raise_retry_error(server: LocalServer) -> None:
    server.route("a.test", behaviour=Reply(status=503))
    limiter = SyncLimiter(default=policy(concurrency=1))
    retries = Retry(total=1, status_forcelist=[503], backoff_factor=0)
    http = through(server, ThrottledAdapter(limiter, retries=retries))
    with pytest.raises(requests.exceptions.RetryError):
        http.get("http://a.test/", timeout=10)
    assert len(server.hits("a.test")) == 2
    quiet = through(
        server,
        ThrottledAdapter(
            limiter, retries=Retry(total=1, status_forcelist=[503], raise_on_status=False)
        ),
    )
    assert quiet.get("http://a.test/", timeout=10).status_code == 503
    assert_idle(limiter)


def test_an_exception_is_recorded_and_the_permit_given_back(server: LocalServer) -> None:
    server.route("a.test", behaviour=Hang())
    limiter = SyncLimiter(default=policy(concurrency=1))
    http = through(server, ThrottledAdapter(limiter))
    with pytest.raises(requests.exceptions.ReadTimeout):
        http.get("http://a.test/", timeout=0.2)
    assert_idle(limiter)
    stats = limiter.scope_statistics("a.test")
    assert stats is not None
    assert stats.backoff_level >= 1, stats


def test_a_streamed_response_holds_its_permit_until_closed(server: LocalServer) -> None:
    server.route("a.test", behaviour=Stream(chunks=3, interval=0.01))
    limiter = SyncLimiter(default=policy(concurrency=1))
    http = through(server, ThrottledAdapter(limiter))
    with http.get("http://a.test/", stream=True, timeout=10) as response:
        assert limiter.statistics().in_flight == 1
        assert len(response.content) == 3 * 1024
    assert_idle(limiter)
    assert len(http.get("http://a.test/", timeout=10).content) == 3 * 1024  # read, released
    assert_idle(limiter)


def test_composes_with_a_users_adapter_and_throttling_settings(server: LocalServer) -> None:
    server.route(behaviour=Reply())

    class Counting(HTTPAdapter):
        sent = 0

        def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
            Counting.sent += 1
            return super().send(request, *args, **kwargs)

    limiter = SyncLimiter(
        default=policy(concurrency=1), scopes={"api": policy(quota=2.0, window=60)}
    )
    adapter = ThrottledAdapter(limiter, Counting(max_retries=Retry(connect=2)))
    http = through(server, adapter)
    with throttling(scopes={"a.test": 1, "api": 1}):
        http.get("http://a.test/", timeout=10)
    assert Counting.sent == 1
    api = limiter.scope_statistics("api")
    assert api is not None
    assert api.quota_used == 1.0
    assert repr(adapter).startswith("<ThrottledAdapter")
    adapter.close()


def test_session_helper_and_bad_arguments() -> None:
    limiter = SyncLimiter()
    made = session(limiter)
    assert isinstance(made.get_adapter("https://example.com/"), ThrottledAdapter)
    with pytest.raises(TypeError, match="SyncLimiter"):
        ThrottledAdapter(Limiter())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retries"):
        ThrottledAdapter(limiter, retries=3)  # type: ignore[arg-type]


def test_many_threads_share_one_session_without_leaks(server: LocalServer) -> None:
    server.route(behaviour=Reply())
    server.route("bad.test", behaviour=Hang())
    limiter = SyncLimiter(default=policy(concurrency=2), concurrency=8)
    http = through(server, ThrottledAdapter(limiter))
    errors = []
    lock = threading.Lock()

    def fetch(n: int) -> None:
        host = "bad.test" if n % 8 == 0 else f"h{n % 5}.test"
        try:
            http.get(f"http://{host}/{n}", timeout=0.3)
        except requests.RequestException as exc:
            with lock:
                errors.append(exc)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(fetch, range(64)))
    assert len(errors) == 8
    assert_idle(limiter)


def test_adaptive_through_requests_takes_the_share_the_async_client_takes(
    server: LocalServer,
) -> None:
    """Adaptive on a local quota of 10 requests a second, from 16 threads sharing a
    session and from 16 tasks of an httpx.AsyncClient at the same time: over the
    second half of 6 s, the threads get as many answers through as the tasks."""
    run = 6.0
    rule = ScopePolicy(concurrency=8, delay=0, adaptive=Adaptive())
    for host in ("sync.test", "async.test"):
        server.route(host, behaviour=RateLimited(limit=10, window=1.0))
    start = time.monotonic()
    end = start + run
    limiter = SyncLimiter(default=rule, concurrency=None)
    http = through(server, ThrottledAdapter(limiter))

    def thread(worker: int) -> None:
        for n in itertools.count():
            if time.monotonic() >= end:
                return
            http.get(f"http://sync.test/{worker}/{n}", timeout=10)

    async def tasks() -> None:
        transport = ThrottledTransport(
            Limiter(default=rule, concurrency=None),
            httpx.AsyncHTTPTransport(proxy=server.proxy_url),
        )
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:

            async def task(worker: int) -> None:
                for n in itertools.count():
                    if time.monotonic() >= end:
                        return
                    await client.get(f"http://async.test/{worker}/{n}")

            async with anyio.create_task_group() as group:
                for worker in range(16):
                    group.start_soon(task, worker)

    loop = threading.Thread(target=anyio.run, args=(tasks,))
    loop.start()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(thread, range(16)))
    loop.join(30)
    server.wait_idle()

    def late(host: str, status: int) -> int:
        hits = server.hits(host)
        return sum(1 for hit in hits if hit.arrived >= start + run / 2 and hit.status == status)

    assert late("sync.test", 200) >= 0.9 * late("async.test", 200)
    assert late("sync.test", 200) >= 0.9 * 10 * run / 2
    assert late("sync.test", 429) <= 0.05 * late("sync.test", 200)
    assert_idle(limiter)


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` under a private name (no ``sys.path`` change)."""
    spec = importlib.util.spec_from_file_location(
        f"_example_{name}", ROOT / "examples" / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_crawl_and_search_api(server: LocalServer) -> None:
    server.route(behaviour=Reply(latency=0.02))
    example = load_example("requests_example")
    urls = [f"http://{host}.test/page/{n}" for host in ("a", "b") for n in range(4)]
    assert example.crawl(urls, proxy=server.proxy_url) == dict.fromkeys(urls, 200)
    for host in ("a.test", "b.test"):
        assert server.max_in_flight(host) <= 2
        assert min(server.gaps(host)) >= 0.25 - SLACK
    server.reset()
    server.route(behaviour=Reply())
    assert example.search_api(["x", "y", "z"], proxy=server.proxy_url) == [200] * 3
    arrivals = sorted(hit.arrived for hit in server.hits())
    assert min(b - a for a, b in itertools.pairwise(arrivals)) >= 0.05 - SLACK
