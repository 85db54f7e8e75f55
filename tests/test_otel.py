"""OpenTelemetry metrics (``throttlekit.otel``) with the real SDK and its in-memory reader.

Each test runs a real :class:`~throttlekit.Limiter` in virtual time, on
asyncio (:class:`~throttlekit.testing.VirtualEventLoop`) and on trio
(``MockClock``), notes what the limiter did (grant times, outcomes), then
reads the metrics through ``InMemoryMetricReader`` and requires the same
numbers.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _server import LocalServer, Reply
from _virtual import AnyioBackend, backend
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from throttlekit import (
    Backoff,
    Limiter,
    Overloaded,
    Permit,
    Rampup,
    ScopePolicy,
    ThrottleTimeout,
)
from throttlekit.otel import _WAIT_BUCKETS as WAIT_BUCKETS
from throttlekit.otel import LimiterMetrics, instrument
from throttlekit.testing import FlakyServer, QuotaServer, burst, simulate

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "scrapy_project" / "run_crawl.py"

GROUP = "throttlekit.scope.group"
OUTCOME = "throttlekit.acquire.outcome"
#: Exact timing: no jitter anywhere, backoff included.
EXACT_BACKOFF = Backoff(jitter=0.0)


def policy(**fields: Any) -> ScopePolicy:
    fields.setdefault("jitter", 0.0)
    fields.setdefault("slot_delay", 0.0)
    fields.setdefault("backoff", EXACT_BACKOFF)
    return ScopePolicy(**fields)


@pytest.fixture(params=["asyncio_virtual", "trio_virtual"])
def anyio_backend(request: pytest.FixtureRequest) -> AnyioBackend:
    """Virtual time on both backends (or, parametrized indirectly, ``"asyncio"``/``"trio"``)."""
    return backend(str(request.param))


class Metrics:
    """A real SDK meter provider with an in-memory reader, and ways to read it."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def instrument(self, limiter: Limiter, **options: Any) -> LimiterMetrics:
        return instrument(limiter, meter_provider=self.provider, **options)

    def points(self) -> dict[str, list[Any]]:
        """Every data point of one collection, by metric name."""
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                assert scope.scope.name == "throttlekit"
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def values(self, name: str, points: dict[str, list[Any]] | None = None) -> dict[Any, Any]:
        """``{frozenset(attributes): value}`` of a counter or gauge."""
        points = self.points() if points is None else points
        return {frozenset(p.attributes.items()): p.value for p in points.get(name, [])}

    def histogram(self, name: str, points: dict[str, list[Any]] | None = None) -> dict[Any, Any]:
        points = self.points() if points is None else points
        return {frozenset(p.attributes.items()): p for p in points.get(name, [])}

    def shutdown(self) -> None:
        self.provider.shutdown()


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    found = Metrics()
    yield found
    found.shutdown()


def attrs_(**attributes: str) -> frozenset[tuple[str, str]]:
    return frozenset({GROUP: "default", **attributes}.items())


def group(name: str, **attributes: str) -> frozenset[tuple[str, str]]:
    return frozenset({GROUP: name, **attributes}.items())


def bucket_counts(waits: list[float]) -> list[int]:
    counts = [0] * (len(WAIT_BUCKETS) + 1)
    for wait in waits:
        index = next((i for i, bound in enumerate(WAIT_BUCKETS) if wait <= bound), -1)
        counts[index] += 1
    return counts


async def settle() -> None:
    for _ in range(50):
        await anyio.lowlevel.checkpoint()


# -- waits, grants, gauges -------------------------------------------------------------


async def test_waits_grants_and_gauges_match_the_run(metrics: Metrics) -> None:
    limiter = Limiter(default=policy(concurrency=2, delay=0.5), concurrency=None)
    metrics.instrument(limiter)
    starts: list[float] = []
    grants: list[float] = []

    async def request(i: int, hold: float) -> None:
        start = anyio.current_time()
        async with limiter.acquire(f"https://shop.test/item/{i}") as permit:
            starts.append(start)
            grants.append(permit.granted_at)
            await anyio.sleep(hold)

    async with anyio.create_task_group() as tasks:
        for i in range(6):
            tasks.start_soon(request, i, 2.0)
        await anyio.sleep(0.75)  # grants at 0 and 0.5; 4 wait for a free slot
        points = metrics.points()
        assert metrics.values("throttlekit.permit.active", points) == {attrs_(): 2}
        assert metrics.values("throttlekit.permit.waiting", points) == {frozenset(): 4}
        assert metrics.values("throttlekit.scope.waiting", points) == {attrs_(): 4}
        assert metrics.values("throttlekit.permit.grants", points) == {attrs_(): 2}
        assert metrics.values("throttlekit.scope.delay", points) == {attrs_(): 0.5}
        assert metrics.values("throttlekit.scope.concurrency", points) == {attrs_(): 2}
        assert metrics.values("throttlekit.scope.count", points) == {
            attrs_(**{"throttlekit.scope.state": "normal"}): 1
        }
    waits = [grant - start for start, grant in zip(starts, grants, strict=True)]
    assert sorted(waits) == pytest.approx([0.0, 0.5, 2.0, 2.5, 4.0, 4.5])
    points = metrics.points()
    histogram = metrics.histogram("throttlekit.permit.wait_time", points)
    point = histogram[attrs_(**{OUTCOME: "granted"})]
    assert point.count == 6
    assert point.sum == pytest.approx(sum(waits))
    assert point.max == pytest.approx(max(waits))
    assert list(point.bucket_counts) == bucket_counts(waits)
    assert list(point.explicit_bounds) == list(WAIT_BUCKETS)
    assert metrics.values("throttlekit.permit.grants", points) == {attrs_(): 6}
    assert metrics.values("throttlekit.permit.active", points) == {attrs_(): 0}
    assert metrics.values("throttlekit.permit.waiting", points) == {frozenset(): 0}
    assert metrics.values("throttlekit.scope.waiting", points) == {attrs_(): 0}


async def test_groups_default_named_other_and_per_scope(metrics: Metrics) -> None:
    limiter = Limiter(
        scopes={"api.test": policy(concurrency=4, delay=0.0)},
        default=policy(concurrency=1, delay=1.0),
        concurrency=None,
    )
    metrics.instrument(limiter, name="crawler")
    limiter.set_crawl_delay("slow.test", 3.0)
    for url in ("https://api.test/a", "https://a.test/", "https://b.test/", "https://slow.test/"):
        async with limiter.acquire(url):
            pass
    async with limiter.acquire(scopes={"api.test": 1.0, "a.test": 1.0}):
        pass  # one permit in two groups: counted once in each
    points = metrics.points()
    name = {"throttlekit.limiter.name": "crawler"}
    assert metrics.values("throttlekit.permit.grants", points) == {
        group("api.test", **name): 2,
        group("default", **name): 3,
        group("other", **name): 1,
    }
    assert metrics.values("throttlekit.scope.delay", points) == {
        group("api.test", **name): 0.0,
        group("default", **name): 1.0,
        group("other", **name): 3.0,
    }
    assert metrics.values("throttlekit.scope.concurrency", points) == {
        group("api.test", **name): 4,
        group("default", **name): 1,
        group("other", **name): 1,
    }

    per_scope = Metrics()
    try:
        other = Limiter(default=policy(concurrency=1, delay=0.0))
        per_scope.instrument(other, per_scope=True)
        for url in ("https://a.test/", "https://b.test/", "https://b.test/x"):
            async with other.acquire(url):
                pass
        assert per_scope.values("throttlekit.permit.grants") == {
            group("a.test"): 1,
            group("b.test"): 2,
        }
    finally:
        per_scope.shutdown()

    custom = Metrics()
    try:
        third = Limiter(default=policy(concurrency=1, delay=0.0))
        custom.instrument(third, scope_group=lambda scope: scope.rpartition(".")[2])
        for url in ("https://a.test/", "https://b.example/", "https://c.test/"):
            async with third.acquire(url):
                pass
        assert custom.values("throttlekit.permit.grants") == {group("test"): 2, group("example"): 1}
    finally:
        custom.shutdown()


# -- backoff signals and server waits --------------------------------------------------


async def test_signals_server_waits_and_blocked_scopes(metrics: Metrics) -> None:
    limiter = Limiter(default=policy(concurrency=1, delay=0.0), concurrency=None)
    metrics.instrument(limiter)
    url = "https://api.test/v1"
    async with limiter.acquire(url) as permit:
        permit.record(status=429, headers={"Retry-After": "7"})
    points = metrics.points()
    assert metrics.values("throttlekit.backoff.signals", points) == {
        attrs_(**{"error.type": "429"}): 1
    }
    requested = metrics.histogram("throttlekit.server.requested_wait", points)[attrs_()]
    assert (requested.count, requested.sum) == (1, 7.0)
    stats = limiter.scope_statistics("api.test")
    assert stats is not None
    assert stats.blocked_until == pytest.approx(7.0)
    assert metrics.values("throttlekit.scope.count", points) == {
        attrs_(**{"throttlekit.scope.state": "blocked"}): 1
    }
    assert metrics.values("throttlekit.scope.delay", points) == {attrs_(): stats.delay}
    assert stats.delay == EXACT_BACKOFF.min_delay

    start = anyio.current_time()
    async with limiter.acquire(url) as permit:
        assert permit.granted_at - start == pytest.approx(7.0)  # the server's wait
        permit.record(exception=TimeoutError("read timed out"))
    async with limiter.acquire(url) as permit:
        permit.record(status=200)  # not a signal
    async with limiter.acquire(url) as permit:
        permit.record(exception=ValueError("not a signal"))
    points = metrics.points()
    assert metrics.values("throttlekit.backoff.signals", points) == {
        attrs_(**{"error.type": "429"}): 1,
        attrs_(**{"error.type": "TimeoutError"}): 1,
    }
    histogram = metrics.histogram("throttlekit.permit.wait_time", points)
    granted = histogram[attrs_(**{OUTCOME: "granted"})]
    assert granted.count == 4
    # After the 429 the delay is 1 s, after the timeout 2 s: the waits of the run.
    assert granted.sum == pytest.approx(7.0 + 2.0 + 2.0)
    assert metrics.values("throttlekit.scope.count", points) == {
        attrs_(**{"throttlekit.scope.state": "slowed"}): 1
    }


async def test_record_for_some_scopes_and_rampup_signals(metrics: Metrics) -> None:
    limiter = Limiter(
        scopes={"upstream": policy(concurrency=None, delay=0.0, backoff=None)},
        default=policy(concurrency=1, delay=0.0),
        concurrency=None,
    )
    metrics.instrument(limiter)
    async with limiter.acquire(scopes={"upstream": 1.0, "site.test": 1.0}) as permit:
        permit.record(status=503, scopes=["site.test"])
    async with limiter.acquire(scopes={"upstream": 1.0, "site.test": 1.0}) as permit:
        permit.record(status=503)  # upstream has no backoff: a signal for site.test only
    assert metrics.values("throttlekit.backoff.signals") == {attrs_(**{"error.type": "503"}): 2}

    rampup = Metrics()
    try:
        probing = Limiter(default=policy(concurrency=1, delay=0.0, backoff=None, rampup=Rampup()))
        rampup.instrument(probing)
        async with probing.acquire("https://api.test/") as permit:
            permit.record(status=429)  # rampup counts signals by the default Backoff's rule
        assert rampup.values("throttlekit.backoff.signals") == {attrs_(**{"error.type": "429"}): 1}
    finally:
        rampup.shutdown()


# -- timeouts, overloads, cancellation -------------------------------------------------


async def test_timeouts_overloads_and_cancellations(metrics: Metrics) -> None:
    limiter = Limiter(default=policy(concurrency=1, delay=0.0), concurrency=None, max_waiters=1)
    metrics.instrument(limiter)
    url = "https://one.test/"
    outcomes: list[str] = []

    async def waiter(seconds: float) -> None:
        try:
            async with limiter.acquire(url, timeout=seconds):
                outcomes.append("granted")
        except ThrottleTimeout:
            outcomes.append("timeout")

    # Held with acquire_nowait: acquires nested in an ``async with`` permit of
    # the same task would share it instead of waiting.
    with limiter.acquire_nowait(url):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(waiter, 1.5)
            await settle()
            with pytest.raises(Overloaded):
                async with limiter.acquire(url):
                    pass
            await anyio.sleep(2.0)
        assert outcomes == ["timeout"]
        with anyio.move_on_after(0.25):
            async with limiter.acquire(url):
                pass  # never granted: cancelled after 0.25 s
    points = metrics.points()
    assert metrics.values("throttlekit.permit.timeouts", points) == {attrs_(): 1}
    assert metrics.values("throttlekit.permit.overloads", points) == {attrs_(): 1}
    histogram = metrics.histogram("throttlekit.permit.wait_time", points)
    assert {key: (p.count, p.sum) for key, p in histogram.items()} == {
        attrs_(**{OUTCOME: "granted"}): (1, 0.0),
        attrs_(**{OUTCOME: "timeout"}): (1, pytest.approx(1.5)),
        attrs_(**{OUTCOME: "overloaded"}): (1, 0.0),
        attrs_(**{OUTCOME: "cancelled"}): (1, pytest.approx(0.25)),
    }
    assert metrics.values("throttlekit.permit.grants", points) == {attrs_(): 1}
    assert metrics.values("throttlekit.permit.active", points) == {attrs_(): 0}
    assert metrics.values("throttlekit.permit.waiting", points) == {frozenset(): 0}


async def test_a_request_of_an_async_resolver_that_times_out_is_counted(metrics: Metrics) -> None:
    async def resolver(request: Any) -> str:
        await anyio.lowlevel.checkpoint()
        return "api.test"

    limiter = Limiter(default=policy(concurrency=1, delay=0.0), resolver=resolver)
    metrics.instrument(limiter)

    async def hold() -> None:
        async with limiter.acquire("https://api.test/a"):
            await anyio.sleep(1.0)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(hold)
        await settle()
        with pytest.raises(ThrottleTimeout):
            async with limiter.acquire("https://api.test/b", timeout=0.5):
                pass
    points = metrics.points()
    # Its scopes would take running the resolver again: it counts in the group "unknown".
    assert metrics.values("throttlekit.permit.timeouts", points) == {group("unknown"): 1}
    assert metrics.values("throttlekit.permit.grants", points) == {attrs_(): 1}


async def test_nested_acquires_share_and_their_feedback_counts(metrics: Metrics) -> None:
    """An acquire nested in a permit of the same task shares it: no second grant."""
    limiter = Limiter(default=policy(concurrency=1, delay=0.0), concurrency=None)
    metrics.instrument(limiter)
    async with limiter.acquire(scopes="budget") as outer:
        async with limiter.acquire(scopes="budget") as inner:
            assert inner.scopes == {}
            inner.record(status=503)  # reaches the shared scope
        async with limiter.acquire(scopes={"budget": 1.0, "site.test": 1.0}):
            pass  # only site.test is granted anew
        outer.record(status=200)
    points = metrics.points()
    assert metrics.values("throttlekit.permit.grants", points) == {attrs_(): 2}
    assert metrics.values("throttlekit.permit.active", points) == {attrs_(): 0}
    assert metrics.values("throttlekit.backoff.signals", points) == {
        attrs_(**{"error.type": "503"}): 1
    }
    assert (
        metrics.histogram("throttlekit.permit.wait_time", points)[
            attrs_(**{OUTCOME: "granted"})
        ].count
        == 2
    )


# -- acquire_nowait, release(), closing ------------------------------------------------


async def test_acquire_nowait_and_sync_release_are_counted(metrics: Metrics) -> None:
    limiter = Limiter(default=policy(concurrency=2, delay=0.0), concurrency=None)
    metrics.instrument(limiter)
    with limiter.acquire_nowait("https://a.test/"):
        assert metrics.values("throttlekit.permit.active") == {attrs_(): 1}
    permit = limiter.acquire_nowait("https://a.test/")
    permit.release()
    permit.release()  # idempotent
    async with limiter.acquire("https://a.test/") as held:
        held.release()  # released early, then the block ends
    points = metrics.points()
    assert metrics.values("throttlekit.permit.grants", points) == {attrs_(): 3}
    assert metrics.values("throttlekit.permit.active", points) == {attrs_(): 0}
    assert (
        metrics.histogram("throttlekit.permit.wait_time", points)[
            attrs_(**{OUTCOME: "granted"})
        ].count
        == 3
    )


async def test_close_restores_the_plain_permit(metrics: Metrics) -> None:
    limiter = Limiter(default=policy(concurrency=2, delay=0.0))
    plain = type(limiter.acquire("https://a.test/"))  # not instrumented: the backend's permits
    assert issubclass(plain, Permit)
    assert not hasattr(plain, "_metrics")
    found = metrics.instrument(limiter)
    assert "grants=0" in repr(found)
    with pytest.raises(RuntimeError, match="already instrumented"):
        metrics.instrument(limiter)
    async with limiter.acquire("https://a.test/") as permit:
        assert isinstance(permit, Permit)
        assert type(permit) is not plain
    found.close()
    found.close()
    assert type(limiter.acquire("https://a.test/")) is plain
    async with limiter.acquire("https://a.test/"):
        pass
    assert "closed" in repr(found)
    assert metrics.values("throttlekit.permit.grants") == {}  # a closed limiter reports nothing
    metrics.instrument(limiter)  # may be instrumented again


async def test_several_limiters_share_the_instruments(metrics: Metrics) -> None:
    first = Limiter(default=policy(concurrency=1, delay=0.0))
    second = Limiter(default=policy(concurrency=1, delay=0.0))
    metrics.instrument(first, name="first")
    metrics.instrument(second, name="second")
    for limiter, count in ((first, 1), (second, 2)):
        for _ in range(count):
            async with limiter.acquire("https://a.test/"):
                pass
    assert metrics.values("throttlekit.permit.grants") == {
        attrs_(**{"throttlekit.limiter.name": "first"}): 1,
        attrs_(**{"throttlekit.limiter.name": "second"}): 2,
    }
    del first
    import gc

    gc.collect()
    assert set(metrics.values("throttlekit.permit.grants")) == {
        attrs_(**{"throttlekit.limiter.name": "second"})
    }


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"], indirect=True)
async def test_collecting_from_another_thread_while_the_loop_runs(metrics: Metrics) -> None:
    """An exporter collects on its own thread (Prometheus, periodic readers); real time."""
    limiter = Limiter(default=policy(concurrency=None, delay=0.0), concurrency=None)
    metrics.instrument(limiter)
    errors: list[BaseException] = []
    stop = threading.Event()

    def collect() -> None:
        try:
            while not stop.is_set():
                metrics.points()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=collect)
    thread.start()
    try:
        for i in range(3000):  # new scopes while the thread reads them
            async with limiter.acquire(f"https://h{i}.test/") as permit:
                permit.record(status=200)
            if i % 100 == 0:
                await anyio.lowlevel.checkpoint()
    finally:
        stop.set()
        await anyio.to_thread.run_sync(thread.join)
    assert not errors
    assert metrics.values("throttlekit.permit.grants") == {attrs_(): 3000}
    assert metrics.values("throttlekit.scope.count") == {
        attrs_(**{"throttlekit.scope.state": "normal"}): 3000
    }


# -- configuration errors --------------------------------------------------------------


def test_bad_arguments_raise_naming_them(metrics: Metrics) -> None:
    limiter = Limiter()
    with pytest.raises(TypeError, match="limiter"):
        metrics.instrument("not a limiter")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        metrics.instrument(limiter, name=3)
    with pytest.raises(TypeError, match="scope_group"):
        metrics.instrument(limiter, scope_group="by host")
    with pytest.raises(TypeError, match="per_scope"):
        metrics.instrument(limiter, per_scope="yes")
    with pytest.raises(ValueError, match="not both"):
        metrics.instrument(limiter, per_scope=True, scope_group=str)
    assert not hasattr(type(limiter.acquire("https://a.test/")), "_metrics")  # not instrumented


def test_wait_buckets_are_increasing() -> None:
    assert list(WAIT_BUCKETS) == sorted(set(WAIT_BUCKETS))
    assert all(math.isfinite(bound) and bound > 0 for bound in WAIT_BUCKETS)


# -- the Scrapy middleware: a real crawl in a subprocess -------------------------------


def test_scrapy_middleware_enables_metrics_from_a_setting(tmp_path: Path) -> None:
    """THROTTLING_METRICS_ENABLED instruments the crawl's limiter on the global provider."""
    pytest.importorskip("scrapy")
    with LocalServer() as server:
        server.route(behaviour=Reply(latency=0.02))
        server.route("b.test", behaviour=Reply(status=429, headers={"Retry-After": "1"}))
        named = f"b.test:{server.port}"
        settings = {
            "DOWNLOADER_MIDDLEWARES": {"throttlekit.adapters.scrapy.ThrottlingMiddleware": 950},
            "DOWNLOAD_DELAY": 0.2,
            "DOWNLOAD_DELAY_JITTER": 0,
            "DOWNLOAD_DELAY_PER_SLOT": 0,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "RETRY_ENABLED": False,
            "THROTTLING_SCOPES": {named: {"delay": 0.1}},
            "THROTTLING_METRICS_ENABLED": True,
            "THROTTLING_METRICS_NAME": "crawl",
        }
        urls = [f"a.test/p{i}" for i in range(3)] + ["b.test/limited"]
        requests = [{"url": f"http://{url.replace('/', f':{server.port}/', 1)}"} for url in urls]
        plan = tmp_path / "plan.json"
        result = tmp_path / "result.json"
        plan.write_text(json.dumps({"settings": settings, "requests": requests, "otel": True}))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        process = subprocess.run(
            [sys.executable, str(RUNNER), str(plan), str(result)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
            check=False,
        )
        assert process.returncode == 0, process.stderr[-5000:]
        assert "unknown setting" not in process.stderr  # THROTTLING_METRICS_* are known
        server.wait_idle()
    found: dict[tuple[str, frozenset[Any]], Any] = {}
    for name, attributes, value in json.loads(result.read_text())["metrics"]:
        assert attributes.pop("throttlekit.limiter.name") == "crawl"
        found[name, frozenset(attributes.items())] = value
    stats = json.loads(result.read_text())["stats"]
    assert stats["throttlekit/request_count"] == 4
    assert found["throttlekit.permit.grants", group("default")] == 3
    assert found["throttlekit.permit.grants", group(named)] == 1
    count, total = found["throttlekit.permit.wait_time", group("default", **{OUTCOME: "granted"})]
    assert count == 3
    assert total >= 0.2 + 0.4 - 0.05  # the first waits for nothing, then 0.2 s apart
    assert found["throttlekit.backoff.signals", group(named, **{"error.type": "429"})] == 1
    assert found["throttlekit.server.requested_wait", group(named)] == [1, 1.0]
    assert found["throttlekit.permit.active", group("default")] == 0
    assert found["throttlekit.permit.waiting", frozenset()] == 0


# -- the Redis backend: the same permit metrics through the backend seam ---------------


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
async def test_redis_backend_permits_are_metered(metrics: Metrics) -> None:
    pytest.importorskip("redis")
    from test_backend_redis import RedisServer

    from throttlekit.backends.redis import RedisBackend

    server = RedisServer()
    server.start()
    try:
        backend = RedisBackend.from_url(server.url, prefix="otel")
        limiter = Limiter(default=policy(concurrency=1, delay=0.2), backend=backend)
        metrics.instrument(limiter)
        waits: list[float] = []

        async def request() -> None:
            start = anyio.current_time()
            async with limiter.acquire("https://api.test/v1") as permit:
                waits.append(permit.granted_at - start)
                permit.record(status=429 if len(waits) == 1 else 200)

        async with anyio.create_task_group() as tasks:
            for _ in range(3):
                tasks.start_soon(request)
        await backend.aclose()
    finally:
        server.stop()
    points = metrics.points()
    assert metrics.values("throttlekit.permit.grants", points) == {attrs_(): 3}
    granted = metrics.histogram("throttlekit.permit.wait_time", points)[
        attrs_(**{OUTCOME: "granted"})
    ]
    assert granted.count == 3
    assert granted.sum == pytest.approx(sum(waits), abs=1e-3)  # two reads of the clock
    assert metrics.values("throttlekit.backoff.signals", points) == {
        attrs_(**{"error.type": "429"}): 1
    }
    assert metrics.values("throttlekit.permit.active", points) == {attrs_(): 0}
    assert metrics.values("throttlekit.permit.waiting", points) == {frozenset(): 0}


@pytest.mark.redis
@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
async def test_redis_scope_gauges_show_the_shared_state(metrics: Metrics) -> None:
    """One process's 429 blocks the scope for all: another process's gauges show it."""
    pytest.importorskip("redis")
    from test_backend_redis import RedisServer

    from throttlekit.backends.redis import RedisBackend

    server = RedisServer()
    server.start()
    url = "https://api.test/v1"
    try:
        first = RedisBackend.from_url(server.url, prefix="shared")
        second = RedisBackend.from_url(server.url, prefix="shared")
        one = Limiter(default=policy(concurrency=3, delay=0.0), backend=first)
        other = Limiter(default=policy(concurrency=3, delay=0.0), backend=second)
        watched = metrics.instrument(other, name="other")
        async with other.acquire(url):
            pass  # the other process uses the scope too
        assert metrics.values("throttlekit.scope.count") == {}  # not read yet
        async with one.acquire(url) as permit:
            permit.record(status=429, headers={"Retry-After": "30"})
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watched.watch_shared_state, 0.05)
            await anyio.sleep(0.2)
            points = metrics.points()
            tasks.cancel_scope.cancel()
        with pytest.raises(RuntimeError, match="shared backend"):
            await metrics.instrument(Limiter()).watch_shared_state()
        with pytest.raises(ValueError, match="interval"):
            await watched.watch_shared_state(0)
        await first.aclose()
        await second.aclose()
    finally:
        server.stop()
    name = {"throttlekit.limiter.name": "other"}
    assert metrics.values("throttlekit.scope.count", points) == {
        attrs_(**name, **{"throttlekit.scope.state": "blocked"}): 1
    }
    assert metrics.values("throttlekit.scope.delay", points) == {
        attrs_(**name): EXACT_BACKOFF.min_delay  # the backoff step the first process took
    }
    assert metrics.values("throttlekit.scope.concurrency", points) == {attrs_(**name): 3}


# -- a whole simulated crawl: the metrics equal its trace ------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_metrics_equal_the_trace_of_a_simulated_crawl(metrics: Metrics, backend: str) -> None:
    """Waits, grants, timeouts, cancellations, signals and server waits, request by request."""
    limiter = Limiter(
        scopes={"api.test": policy(concurrency=2, delay=0.1)},
        default=policy(concurrency=1, delay=0.5),
        concurrency=None,
        seed=3,
    )
    metrics.instrument(limiter)
    servers = {
        "api.test": QuotaServer(limit=5, window=1.0, retry_after=2),
        "shop.test": FlakyServer(
            latency=0.2, error_rate=0.2, timeout_rate=0.3, timeout=1.0, reset_rate=0.1
        ),
    }
    requests = [
        *burst("https://api.test/items/{i}", 40),
        *burst("https://shop.test/p/{i}", 15, at=0.5),
        *burst("https://shop.test/late/{i}", 5, at=1.0, timeout=2.0),
        *burst("https://shop.test/gone/{i}", 5, at=1.0, cancel_after=3.0),
    ]
    trace = simulate(limiter, servers, requests, seed=11, backend=backend)
    groups = {"api.test": "api.test", "shop.test": "default"}

    def group_of(record: Any) -> str:
        return groups[record.url.split("/")[2]]

    waits: dict[tuple[str, str], list[float]] = {}
    signals: dict[tuple[str, str], int] = {}
    asked: dict[str, list[float]] = {}
    for record in trace.requests:
        assert record.arrived is not None
        outcome = {"timeout": "timeout", "cancelled": "cancelled"}.get(record.outcome, "granted")
        end = (
            record.sent
            if outcome == "granted"
            else record.arrived + (2.0 if outcome == "timeout" else 3.0)
        )
        assert end is not None
        waits.setdefault((group_of(record), outcome), []).append(end - record.arrived)
        name = str(record.status) if record.status in EXACT_BACKOFF.http_codes else None
        if record.exception in ("TimeoutError", "ConnectionResetError"):
            name = record.exception
        if name is not None:
            key = (group_of(record), name)
            signals[key] = signals.get(key, 0) + 1
        if "Retry-After" in (record.headers or {}):
            asked.setdefault(group_of(record), []).append(float(record.headers["Retry-After"]))
    assert {outcome for _, outcome in waits} == {"granted", "timeout", "cancelled"}
    assert ("default", "TimeoutError") in signals
    assert ("api.test", "429") in signals

    points = metrics.points()
    histogram = metrics.histogram("throttlekit.permit.wait_time", points)
    assert {key: (point.count, pytest.approx(point.sum)) for key, point in histogram.items()} == {
        group(name, **{OUTCOME: outcome}): (len(values), sum(values))
        for (name, outcome), values in waits.items()
    }
    assert metrics.values("throttlekit.permit.grants", points) == {
        group(name): len(values)
        for (name, outcome), values in waits.items()
        if outcome == "granted"
    }
    assert metrics.values("throttlekit.permit.timeouts", points) == {
        group("default"): len(waits["default", "timeout"])
    }
    assert metrics.values("throttlekit.backoff.signals", points) == {
        group(name, **{"error.type": signal}): count for (name, signal), count in signals.items()
    }
    requested = metrics.histogram("throttlekit.server.requested_wait", points)
    assert {key: (p.count, p.sum) for key, p in requested.items()} == {
        group(name): (len(values), sum(values)) for name, values in asked.items()
    }
    assert set(metrics.values("throttlekit.permit.active", points).values()) == {0}
    assert metrics.values("throttlekit.permit.waiting", points) == {frozenset(): 0}
