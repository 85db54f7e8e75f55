"""The synchronous httpx transport against a real local HTTP server (tests/_server.py).

A real ``httpx.Client`` with ``httpx.HTTPTransport`` sends through the local
server used as an HTTP proxy, so URLs keep their virtual host names.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from _server import Hang, LocalServer, Reply, Script, Stream, describe

from throttlekit import Backoff, Limiter, ScopePolicy, SyncLimiter
from throttlekit.adapters.httpx import SyncThrottledTransport, sync_client, throttling

SLACK = 0.05
QUICK_BACKOFF = Backoff(min_delay=0.05, max_delay=2.0, jitter=0)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer() as running:
        yield running


def policy(**fields: Any) -> ScopePolicy:
    fields.setdefault("delay", 0.0)
    fields.setdefault("backoff", QUICK_BACKOFF)
    return ScopePolicy(**fields)


def client(limiter: SyncLimiter, server: LocalServer) -> httpx.Client:
    transport = SyncThrottledTransport(limiter, httpx.HTTPTransport(proxy=server.proxy_url))
    return httpx.Client(transport=transport, timeout=10)


def assert_idle(limiter: SyncLimiter) -> None:
    stats = limiter.statistics()
    assert stats.in_flight == 0, stats
    assert stats.waiting == 0, stats


def test_threads_sharing_a_client_keep_each_hosts_policy(server: LocalServer) -> None:
    server.route(behaviour=Reply(latency=0.03))
    policies = {"a.test": policy(concurrency=1, delay=0.1), "b.test": policy(concurrency=3)}
    limiter = SyncLimiter(scopes=policies, concurrency=None)
    urls = [f"http://{host}/{n}" for n in range(10) for host in policies]
    with client(limiter, server) as http, ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda url: http.get(url).status_code, urls))
    server.wait_idle()
    assert statuses == [200] * len(urls)
    assert server.max_in_flight("a.test") == 1, describe(server.hits("a.test"))
    assert min(server.gaps("a.test")) >= 0.1 - SLACK
    assert server.max_in_flight("b.test") <= 3
    assert_idle(limiter)


def test_a_429_with_retry_after_holds_the_host_back(server: LocalServer) -> None:
    server.route(
        "a.test", behaviour=Script(Reply(status=429, headers={"Retry-After": "1"}), Reply())
    )
    limiter = SyncLimiter(default=policy(concurrency=2))
    with client(limiter, server) as http:
        assert http.get("http://a.test/").status_code == 429
        assert http.get("http://a.test/").status_code == 200
    assert server.gaps("a.test")[0] >= 1.0 - SLACK
    assert_idle(limiter)


def test_streams_hold_their_permit_until_closed_and_errors_are_recorded(
    server: LocalServer,
) -> None:
    server.route("a.test", behaviour=Stream(chunks=3, interval=0.01))
    server.route("hang.test", behaviour=Hang())
    limiter = SyncLimiter(default=policy(concurrency=1))
    with client(limiter, server) as http:
        with http.stream("GET", "http://a.test/") as response:
            assert limiter.statistics().in_flight == 1
            assert len(response.read()) == 3 * 1024
        assert_idle(limiter)
        with pytest.raises(httpx.ReadTimeout):
            http.get("http://hang.test/", timeout=0.2)
    assert_idle(limiter)
    stats = limiter.scope_statistics("hang.test")
    assert stats is not None
    assert stats.backoff_level >= 1


def test_extensions_and_throttling_settings(server: LocalServer) -> None:
    server.route(behaviour=Reply())
    limiter = SyncLimiter(default=policy(concurrency=1), scopes={"api": policy(quota=5.0)})
    with client(limiter, server) as http:
        http.get("http://a.test/", extensions={"throttling_scopes": {"api": 2.0}})
        with throttling(scopes={"api": 1.0}):
            http.get("http://a.test/")
    api = limiter.scope_statistics("api")
    assert api is not None
    assert api.quota_used == 3.0


def test_sync_client_and_bad_arguments(server: LocalServer) -> None:
    server.route(behaviour=Reply())
    limiter = SyncLimiter(default=policy(concurrency=1))
    started = time.monotonic()
    with sync_client(limiter, proxy=server.proxy_url, trust_env=False) as http:
        assert http.get("http://a.test/").status_code == 200
    assert time.monotonic() - started < 5
    with pytest.raises(TypeError, match="SyncLimiter"):
        SyncThrottledTransport(Limiter())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="builds its own transport"):
        sync_client(limiter, transport=httpx.HTTPTransport())
