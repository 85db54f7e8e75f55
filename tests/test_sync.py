"""The synchronous driver (SyncLimiter) with many real threads.

Times are the limiter's own (``permit.granted_at``, ``time.monotonic()``), so
the invariants are checked exactly; the runs are short (delays of a few ms)
but use 64 threads, as a crawler's thread pool would.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from throttlekit import (
    Backoff,
    Limiter,
    Overloaded,
    ScopePolicy,
    ScopeStalled,
    SyncLimiter,
    SyncPermit,
    ThrottleTimeout,
    WouldBlock,
)

FREE = ScopePolicy(concurrency=None, delay=0)
THREADS = 64


def assert_idle(limiter: SyncLimiter) -> None:
    """Nothing in flight or waiting, in the limiter and in every scope."""
    stats = limiter.statistics()
    assert stats.in_flight == 0, stats
    assert stats.waiting == 0, stats
    for scope in stats.scopes.values():
        assert scope.in_flight == 0, scope
        assert scope.waiting == 0, scope


def wait_until(predicate: Any, within: float = 5.0) -> None:
    """Wait until ``predicate()`` holds (it reads state another thread changes)."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


@contextmanager
def held_elsewhere(limiter: SyncLimiter, scopes: Any) -> Iterator[None]:
    """Hold a permit for ``scopes`` in another thread for the ``with`` block
    (one thread's own acquires would nest in a permit it holds)."""
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with limiter.acquire(scopes=scopes):
            holding.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(5)
    try:
        yield
    finally:
        done.set()
        thread.join(5)


class Watch:
    """What the threads saw, per scope: grants (time, cost) and the most in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = defaultdict(int)
        self.most: dict[str, int] = defaultdict(int)
        self.grants: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def enter(self, permit: SyncPermit) -> None:
        with self.lock:
            for scope, cost in permit.scopes.items():
                self.in_flight[scope] += 1
                self.most[scope] = max(self.most[scope], self.in_flight[scope])
                self.grants[scope].append((permit.granted_at, cost))

    def leave(self, permit: SyncPermit) -> None:
        with self.lock:
            for scope in permit.scopes:
                self.in_flight[scope] -= 1


# -- the basics ------------------------------------------------------------------------


def test_acquire_and_release_with_and_without_waiting() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0.05), concurrency=None)
    with limiter.acquire("https://a.example/1") as first:
        assert first.scopes == {"a.example": 1.0}
        with pytest.raises(WouldBlock):
            limiter.acquire_nowait("https://a.example/2")
    with limiter.acquire("https://a.example/2") as second:
        assert second.granted_at - first.granted_at >= 0.05
    assert_idle(limiter)
    assert "SyncLimiter" in repr(limiter)


def test_acquire_nowait_grants_and_releases_on_exit() -> None:
    limiter = SyncLimiter(default=FREE)
    with limiter.acquire_nowait(scopes="a") as permit:
        assert permit.scopes == {"a": 1.0}
        assert limiter.statistics().in_flight == 1
    assert_idle(limiter)
    with pytest.raises(TypeError, match="needs a request or scopes"):
        limiter.acquire_nowait()


def test_timeout_takes_nothing() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0), concurrency=None)
    with held_elsewhere(limiter, "a"):
        started = time.monotonic()
        with pytest.raises(ThrottleTimeout), limiter.acquire(scopes="a", timeout=0.05):
            pass
        assert time.monotonic() - started >= 0.05
        assert limiter.statistics().waiting == 0
    assert_idle(limiter)


def test_a_block_that_raises_gives_the_permit_back() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0), concurrency=None)
    for _ in range(3):
        with pytest.raises(ValueError, match="boom"), limiter.acquire(scopes="a"):
            raise ValueError("boom")
    assert_idle(limiter)


def test_misuse_is_reported() -> None:
    limiter = SyncLimiter()
    with pytest.raises(TypeError, match="shared backend"):
        SyncLimiter(backend=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        limiter.acquire("https://a.example/", timeout=-1)

    async def resolver(request: Any) -> str:
        return "a"

    with (
        pytest.raises(TypeError, match="synchronous resolver"),
        SyncLimiter(resolver=resolver).acquire("https://a.example/"),
    ):
        pass

    async def main() -> None:
        async with limiter.acquire("https://a.example/"):  # type: ignore[attr-defined]
            pass

    with pytest.raises(RuntimeError, match="not 'async with'"):
        anyio.run(main)
    assert_idle(limiter)


def test_from_settings_makes_a_sync_limiter() -> None:
    limiter = SyncLimiter.from_settings(
        {"CONCURRENT_REQUESTS": 4, "THROTTLING_SCOPES": {"api": {"concurrency": 2, "delay": 0}}}
    )
    assert isinstance(limiter, SyncLimiter)
    assert limiter.policy("api").concurrency == 2
    assert limiter.statistics().concurrency == 4


def test_nested_acquire_in_one_thread_does_not_deadlock() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0), concurrency=1)
    with limiter.acquire("https://a.example/") as outer:
        with limiter.acquire("https://a.example/", timeout=1.0) as inner:
            assert inner.scopes == {}  # shares the enclosing permit's scope
            inner.record(status=200)
        with limiter.acquire(scopes={"a.example": 1, "pool": 1}, timeout=1.0) as both:
            assert both.scopes == {"pool": 1.0}
        assert outer.scopes == {"a.example": 1.0}
    assert_idle(limiter)


# -- fairness ------------------------------------------------------------------------


def _start_waiting(limiter: SyncLimiter, jobs: list[Any]) -> list[threading.Thread]:
    """Start one thread per job, each queued (in this order) before the next starts."""
    threads = []
    for number, job in enumerate(jobs, start=1):
        thread = threading.Thread(target=job)
        thread.start()
        wait_until(lambda number=number: limiter.statistics().waiting == number)
        threads.append(thread)
    return threads


def test_fifo_within_a_priority_and_higher_priority_first() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0), concurrency=None)
    order: list[str] = []

    def job(name: str, priority: int) -> Any:
        def run() -> None:
            with limiter.acquire(scopes="a", priority=priority):
                order.append(name)

        return run

    with held_elsewhere(limiter, "a"):
        threads = _start_waiting(
            limiter,
            [job("first", 0), job("second", 0), job("urgent", 5), job("third", 0)],
        )
    for thread in threads:
        thread.join(5)
    assert order == ["urgent", "first", "second", "third"]
    assert_idle(limiter)


def test_no_head_of_line_blocking_across_scopes() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0), concurrency=None)
    done = threading.Event()

    def blocked() -> None:
        with limiter.acquire(scopes={"b": 1, "a": 1}):
            done.set()

    with held_elsewhere(limiter, "b"):
        threads = _start_waiting(limiter, [blocked] * 8)
        # "a" is free: a request for it alone is granted at once, past the queue on "b".
        with limiter.acquire(scopes="a", timeout=0.5) as permit:
            assert permit.scopes == {"a": 1.0}
    for thread in threads:
        thread.join(5)
    assert done.is_set()
    assert_idle(limiter)


def test_overloaded_when_max_waiters_wait() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0), max_waiters=1)

    def wait() -> None:
        with limiter.acquire(scopes="a"):
            pass

    with held_elsewhere(limiter, "a"):
        threads = _start_waiting(limiter, [wait])
        with pytest.raises(Overloaded), limiter.acquire(scopes="a"):
            pass
    threads[0].join(5)
    assert_idle(limiter)


# -- many threads, by property -------------------------------------------------------

SCOPES = ("a", "b", "c")


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    policies = {
        name: ScopePolicy(
            concurrency=draw(st.integers(1, 4)),
            delay=draw(st.sampled_from([0.0, 0.001, 0.003])),
            quota=draw(st.sampled_from([None, 20.0])),
            window=0.05,
        )
        for name in SCOPES
    }
    requests = draw(
        st.lists(
            st.tuples(
                st.dictionaries(st.sampled_from(SCOPES), st.sampled_from([1.0, 2.0]), min_size=1),
                st.sampled_from([None, None, 0.0, 0.005]),  # timeout
                st.booleans(),  # the block raises
                st.integers(0, 2),  # priority
            ),
            min_size=THREADS,
            max_size=2 * THREADS,
        )
    )
    return {"policies": policies, "requests": requests, "cap": draw(st.sampled_from([None, 8]))}


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(run=runs())
def test_64_threads_never_exceed_concurrency_delay_or_quota(run: dict[str, Any]) -> None:
    policies = run["policies"]
    limiter = SyncLimiter(scopes=policies, concurrency=run["cap"])
    watch = Watch()
    total = {"in_flight": 0, "most": 0}

    def send(request: tuple[dict[str, float], float | None, bool, int]) -> str:
        costs, timeout, raises, priority = request
        try:
            with limiter.acquire(scopes=costs, timeout=timeout, priority=priority) as permit:
                watch.enter(permit)
                with watch.lock:
                    total["in_flight"] += 1
                    total["most"] = max(total["most"], total["in_flight"])
                time.sleep(0.001)
                with watch.lock:
                    total["in_flight"] -= 1
                watch.leave(permit)
                if raises:
                    raise KeyError("the block failed")
        except ThrottleTimeout:
            return "timeout"
        except KeyError:
            return "raised"
        return "sent"

    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(send, run["requests"]))
    assert outcomes.count("sent") + outcomes.count("raised") >= 1
    if run["cap"] is not None:
        assert total["most"] <= run["cap"]
    for name, policy in policies.items():
        assert watch.most[name] <= policy.concurrency
        grants = sorted(watch.grants[name])
        times = [at for at, _ in grants]
        for earlier, later in itertools.pairwise(times):
            assert later - earlier >= policy.delay - 1e-9
        for index, (at, _) in enumerate(grants):
            in_window = sum(cost for when, cost in grants[index:] if when < at + policy.window)
            assert in_window <= policy.quota + 1e-9 if policy.quota else True
    assert_idle(limiter)


# -- controllers ---------------------------------------------------------------------


def test_retry_after_holds_every_thread_back() -> None:
    backoff = Backoff(min_delay=0.05, max_delay=2.0, jitter=0)
    limiter = SyncLimiter(default=ScopePolicy(concurrency=4, delay=0, backoff=backoff))
    with limiter.acquire("https://a.example/") as permit:
        refused_at = time.monotonic()
        permit.record(status=429, headers={"Retry-After": "1"})
    granted: list[float] = []

    def send() -> None:
        with limiter.acquire("https://a.example/", timeout=5) as permit:
            granted.append(permit.granted_at)

    with ThreadPoolExecutor(8) as pool:
        for _ in range(8):
            pool.submit(send)
    assert len(granted) == 8
    assert min(granted) >= refused_at + 1.0 - 0.01
    stats = limiter.scope_statistics("a.example")
    assert stats is not None
    assert stats.last_signal == "429"
    assert_idle(limiter)


def test_a_stalled_scope_fails_fast() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=4, delay=0, max_stall=0.5))
    with limiter.acquire("https://a.example/") as permit:
        permit.record(status=429, headers={"Retry-After": "30"})
    with pytest.raises(ScopeStalled), limiter.acquire("https://a.example/"):
        pass
    assert_idle(limiter)


# -- interrupts and the async limiter used from the wrong place ---------------------


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread"
)
def test_keyboard_interrupt_while_waiting_takes_nothing() -> None:
    limiter = SyncLimiter(default=ScopePolicy(concurrency=1, delay=0), concurrency=None)
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with limiter.acquire(scopes="a"):
            holding.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt), limiter.acquire(scopes="a"):
            pass
    finally:
        release.set()
        holder.join(5)
        timer.join()
    assert_idle(limiter)
    with limiter.acquire(scopes="a", timeout=1):  # the scope is free again
        pass


def test_an_async_limiter_shared_by_threads_says_so_and_never_hangs() -> None:
    """Four threads, each running its own event loop, share one async Limiter: those
    that would wait on it raise a RuntimeError naming the SyncLimiter."""
    limiter = Limiter(default=ScopePolicy(concurrency=1, delay=0.05))
    errors: list[str] = []

    def worker() -> None:
        async def main() -> None:
            for _ in range(3):
                async with limiter.acquire("https://a.example/"):
                    await anyio.sleep(0.05)

        try:
            anyio.run(main)
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert errors
    assert all("SyncLimiter" in error for error in errors)


def test_an_async_limiter_moves_to_a_new_event_loop_once_idle() -> None:
    limiter = Limiter(default=ScopePolicy(concurrency=1, delay=0))

    async def main() -> None:
        for _ in range(2):
            async with limiter.acquire("https://a.example/"):
                pass

    for _ in range(3):
        anyio.run(main)
    thread = threading.Thread(target=anyio.run, args=(main,))
    thread.start()
    thread.join(5)
    assert limiter.statistics().in_flight == 0


# -- listeners and metrics, for both drivers -------------------------------------------


class Told:
    """A listener that writes down what it is told (from many threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[str] = []

    def _add(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def on_wait(self, permit: Any) -> None:
        self._add("wait")

    def on_grant(self, permit: Any, waited: float) -> None:
        self._add("grant")

    def on_fail(self, permit: Any, exc: BaseException, waited: float) -> None:
        self._add(f"fail:{type(exc).__name__}")

    def on_release(self, permit: Any) -> None:
        self._add("release")

    def on_feedback(self, permit: Any, feedback: Any) -> None:
        self._add(f"feedback:{feedback.status}")


def test_listeners_hear_both_drivers_alike() -> None:
    heard: dict[str, list[str]] = {}
    for driver in (SyncLimiter, Limiter):
        limiter = driver(default=ScopePolicy(concurrency=1, delay=0), concurrency=None)
        told = Told()
        limiter.add_listener(told)
        with pytest.raises(ValueError, match="already"):
            limiter.add_listener(told)
        if isinstance(limiter, SyncLimiter):
            with limiter.acquire(scopes="a") as permit:
                permit.record(status=200)
            with limiter.acquire_nowait(scopes="a"):
                pass
            with held_elsewhere(limiter, "a"), pytest.raises(ThrottleTimeout):
                limiter.acquire(scopes="a", timeout=0.01).__enter__()
        else:

            async def main(limiter: Limiter = limiter) -> None:
                async with limiter.acquire(scopes="a") as permit:
                    permit.record(status=200)
                with limiter.acquire_nowait(scopes="a"):
                    pass
                holding, done = anyio.Event(), anyio.Event()

                async def hold() -> None:
                    async with limiter.acquire(scopes="a"):
                        holding.set()
                        await done.wait()

                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(hold)
                    await holding.wait()
                    with pytest.raises(ThrottleTimeout):
                        await limiter.acquire(scopes="a", timeout=0.01).__aenter__()
                    done.set()

            anyio.run(main)
        limiter.remove_listener(told)
        assert limiter.listeners == ()
        heard[driver.__name__] = told.events
    assert heard["SyncLimiter"] == [
        "wait", "grant", "feedback:200", "release",  # acquire
        "grant", "release",  # acquire_nowait
        "wait", "grant",  # held elsewhere
        "wait", "fail:ThrottleTimeout",  # timed out meanwhile
        "release",
    ]  # fmt: skip
    assert heard["Limiter"] == heard["SyncLimiter"]
    with pytest.raises(TypeError, match="LimiterListener"):
        SyncLimiter().add_listener(object())  # type: ignore[arg-type]


def test_otel_metrics_of_a_sync_limiter_from_many_threads() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from throttlekit.otel import instrument

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    quick = Backoff(min_delay=0.001, max_delay=0.005, jitter=0)
    limiter = SyncLimiter(default=ScopePolicy(concurrency=2, delay=0, backoff=quick))
    metrics = instrument(limiter, meter_provider=provider)
    with pytest.raises(RuntimeError, match="already instrumented"):
        instrument(limiter, meter_provider=provider)

    def send(n: int) -> None:
        with limiter.acquire(f"https://a.example/{n}") as permit:
            time.sleep(0.002)
            permit.record(status=429 if n % 8 == 0 else 200)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(send, range(200)))
    data = reader.get_metrics_data()
    values: dict[str, int] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if hasattr(point, "value"):
                        values[metric.name] = values.get(metric.name, 0) + int(point.value)
    assert values["throttlekit.permit.grants"] == 200
    assert values["throttlekit.permit.active"] == 0
    assert values["throttlekit.permit.waiting"] == 0
    assert values["throttlekit.backoff.signals"] == 25
    assert metrics.waiting == 0
    metrics.close()
    assert limiter.listeners == ()
    provider.shutdown()
    assert_idle(limiter)
