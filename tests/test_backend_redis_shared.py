"""The Redis backend runs the same controllers as the in-memory one, in many processes.

A property test drives the same random sequences of grants, feedback,
releases and time through the in-memory backend and through the Redis
backend (the scripts on virtual time), and requires the same decisions
after every step; worker processes then share one scope through Redis.

Timing checks of the multi-process tests
----------------------------------------
Grants are decided on Redis's clock, and each request carries its send time
(``X-Send-At``, Redis clock) to the test HTTP server, which records it with
the arrival time. The checks on those records are exact:

* never more requests at the server than the shared concurrency;
* send times never closer than the delay (2 us of tolerance: send times
  travel as milliseconds with three decimals);
* no request arrives before its send time: Redis's ``TIME`` and
  ``time.time()`` read the same wall clock on this host (10 us tolerance).

Gaps between *arrivals* are the send gaps minus how late the earlier request
left its worker (timer wake-up and scheduling of the worker process, tens of
milliseconds on a loaded 2-core machine), which no limiter controls; they are
checked through the exact checks above rather than a flaky timing tolerance.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any
from unittest.mock import patch

import anyio
import pytest
import redis.asyncio as aioredis
from _redis import RedisServer, backend_keys, free_port, read_line, worker_command
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import throttlekit
from throttlekit import (
    Adaptive,
    AutoThrottle,
    Backoff,
    BaseController,
    Feedback,
    Rampup,
    ScopePolicy,
)
from throttlekit._ledger import ScopeLedger
from throttlekit._scheduler import Scheduler, Ticket
from throttlekit.backends._redis_state import PolicyArgs
from throttlekit.backends.redis import RedisBackend
from throttlekit.headers import RateLimitInfo

pytestmark = pytest.mark.redis


@pytest.fixture
def anyio_backend() -> str:
    """The backend runs on asyncio only (redis.asyncio)."""
    return "asyncio"


def backoff_state(text: Any) -> dict[str, Any]:
    """The stored state of a scope's backoff (from its ``ctl`` field)."""
    for kind, state in json.loads(text):
        if kind.endswith("BackoffState"):
            return dict(state)
    raise LookupError("no backoff state stored")


# -- the same decisions in memory and in Redis ------------------------------------------


class Nudge(BaseController):
    """A custom controller: every third send toggles a delay; a 503 blocks and cuts concurrency."""

    def __init__(self, policy: ScopePolicy) -> None:
        self.sends = 0

    def on_send(self, scope: Any, now: float) -> bool | None:
        self.sends += 1
        if self.sends % 3:
            return None
        self.delay = 0.25 if self.delay == 0.0 else 0.0
        return True

    def on_feedback(self, scope: Any, feedback: Feedback, now: float) -> None:
        if feedback.status == 503:
            self.blocked_until = now + 5.0
            self.concurrency = max(1, scope.in_flight - 1)
            self.reason = "nudge: 503"


class FixedRandom(random.Random):
    """The same jitter draw on both sides (each draws when it needs to)."""

    def random(self) -> float:
        return 0.375


POLICIES = {
    "backoff": ScopePolicy(concurrency=3, delay=0.25, slot_delay=0.0, jitter=0.0),
    "backoff-quota-slots": ScopePolicy(
        concurrency=2,
        delay=0.0,
        slot_delay=1.0,
        quota=5.0,
        window=30.0,
        backoff=Backoff(max_delay=20.0, min_delay=2.0, window=30.0),
    ),
    "autothrottle": ScopePolicy(
        concurrency=2,
        delay=0.125,
        slot_delay=0.0,
        jitter=0.5,
        autothrottle=AutoThrottle(start_delay=0.5, max_delay=10.0),
    ),
    "rampup": ScopePolicy(
        concurrency=2, delay=1.0, slot_delay=0.0, rampup=Rampup(window=10.0, target=(1, 2))
    ),
    "custom": ScopePolicy(concurrency=3, delay=0.0, slot_delay=0.0, controllers=(Nudge,)),
    "adaptive": ScopePolicy(
        concurrency=4, delay=0.0, slot_delay=0.0, adaptive=Adaptive(start_rate=2.0, hold=5.0)
    ),
}

# Times are multiples of 1/64 s, exact in binary and in the scripts' milliseconds.
STEPS = [1 / 64, 0.25, 0.5, 1.0, 2.0, 10.0, 31.0, 61.0]
STATUSES = [200, 200, 200, 404, 429, 503]
INFOS = [
    None,
    None,
    RateLimitInfo(retry_after=0.5),
    RateLimitInfo(retry_after=1000.0),
    RateLimitInfo(remaining=0, reset=10.0, limit=100.0),
]
SCOPES = [("a",), ("b",), ("a", "b")]

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(SCOPES)),
        st.tuples(
            st.just("feedback"),
            st.integers(0, 5),
            st.sampled_from(STATUSES),
            st.sampled_from(INFOS),
            st.sampled_from([0.0625, 0.5, 3.0]),
        ),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("wait"), st.sampled_from(STEPS)),
    ),
    min_size=10,
    max_size=50,
)


async def _redis_limits(admin: Any, key: str, policy: ScopePolicy) -> Any:
    """The limits stored at ``key`` (a scope's state), or those of ``policy`` if none are."""
    values = await admin.hmget(key, ["ver", "delay", "conc", "blk", "jl", "jh"])
    if values[0] is None:  # nothing stored: the limits of the policy's fresh controllers
        values = PolicyArgs.of(policy).packed.split(",")[1:6]
    else:
        values = [value.decode() for value in values[1:]]
    delay, conc, blocked, low, high = (float(value) for value in values)
    return delay, int(conc) or None, -math.inf if blocked < -1e299 else blocked, (low, high)


_RUNS = itertools.count()


async def compare(
    url: str,
    policy: ScopePolicy,
    operations: list[Any],
    *,
    names: tuple[str, ...] = ("a", "b"),
    admin_client: Any = aioredis.Redis,
    prefix: str | None = None,
    **options: Any,
) -> None:
    """Run ``operations`` in memory and through Redis; the same grants and limits after each.

    ``names`` are the scopes whose limits are compared; ``options`` go to
    :meth:`RedisBackend.from_url`, and ``admin_client.from_url`` reads the keys.
    """
    if prefix is None:
        prefix = f"same-{next(_RUNS)}-{time.time_ns()}"  # (hypothesis seeds `random`)
    # The same counts in flight, read as a shared backend's: Adaptive reads
    # a backend's count of leases as not exact, and decides on it otherwise.
    with patch.object(ScopeLedger, "in_flight_exact", False):
        await _compare(url, policy, operations, names, admin_client, prefix, options)


async def _compare(
    url: str,
    policy: ScopePolicy,
    operations: list[Any],
    names: tuple[str, ...],
    admin_client: Any,
    prefix: str,
    options: dict[str, Any],
) -> None:
    now = 1_000_000.0
    core = Scheduler(default=policy, concurrency=None, rng=FixedRandom())
    backend = RedisBackend.from_url(
        url,
        prefix=prefix,
        reserve_ahead=0.0,
        lease_time=1e7,
        state_ttl=1e7,
        failure="fail_closed",
        **options,
    )
    limiter = throttlekit.Limiter(default=policy, backend=backend, concurrency=None)
    async with limiter.acquire(scopes="warm-up"):
        pass  # connected, scripts loaded
    backend._calls.clock = lambda: now
    backend._calls.rng = FixedRandom()
    admin = admin_client.from_url(url)
    held: list[tuple[Ticket, Any]] = []
    try:
        for step, operation in enumerate(operations):
            kind = operation[0]
            if kind == "wait":
                now += operation[1]
            elif kind == "acquire":
                costs = dict.fromkeys(operation[1], 1.0)
                ticket = core.make_ticket(costs, 0, now)
                granted = core.try_grant(ticket, now)
                try:
                    lease = await backend.acquire(costs, priority=0, timeout=0)
                except throttlekit.ThrottleTimeout:
                    lease = None
                assert granted == (lease is not None), (step, operation)
                if granted:
                    held.append((ticket, lease))
            elif held:
                ticket, lease = held.pop(operation[1] % len(held))
                if kind == "feedback":
                    _, _, status, info, latency = operation
                    feedback = Feedback(
                        status=status, rate_limit=info, latency=latency, sent_at=ticket.granted_at
                    )
                    core.feedback(ticket, feedback, now)
                    backend.record(lease, feedback, None)
                core.release(ticket, now)
                await backend.release(lease)
            for scope in names:
                ledger = core.scopes.get(scope)
                if ledger is None:
                    continue
                got = await _redis_limits(admin, backend.scope_keys(scope)[1], policy)
                want = (ledger.delay, ledger.concurrency, ledger.blocked_until, ledger.jitter)
                context = (step, operation, scope, got, want)
                assert got[0] == pytest.approx(want[0], rel=1e-12), context
                assert got[1] == want[1], context
                assert got[2] == pytest.approx(want[2], rel=1e-12), context
                assert got[3] == pytest.approx(want[3], rel=1e-12), context
        for _, lease in held:
            await backend.release(lease)
    finally:
        await admin.aclose()
        await backend.aclose()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_controllers_decide_alike_in_memory_and_in_redis(
    redis_server: RedisServer, name: str
) -> None:
    """Every built-in controller (Adaptive too) and a custom one: same grants and limits."""
    policy = POLICIES[name]

    @settings(
        max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(operations=OPERATIONS)
    def check(operations: list[Any]) -> None:
        asyncio.run(compare(redis_server.url, policy, operations))

    check()


# -- processes sharing one scope -------------------------------------------------------------


class ArrivalLog:
    """A local HTTP server that records every request's arrival (wall clock)."""

    def __init__(self, latency: float, fail_at: int) -> None:
        self.latency = latency
        self.fail_at = fail_at
        self.arrivals: list[dict[str, Any]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.failed_at = math.inf
        self.failed_worker = ""
        self.done = anyio.Event()  # set at the third arrival 0.9 s after the 429

    async def handle(self, request: web.Request) -> web.Response:
        arrived = time.time()
        if "X-Warmup" in request.headers:
            return web.Response(text="warm")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        index = len(self.arrivals)
        worker = request.headers["X-Worker"]
        self.arrivals.append(
            {"at": arrived, "worker": worker, "send_at": float(request.headers["X-Send-At"]) / 1000}
        )
        if sum(a["at"] > self.failed_at + 0.9 for a in self.arrivals) >= 3:
            self.done.set()
        try:
            await anyio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        if index == self.fail_at:
            self.failed_at = time.time()
            self.failed_worker = worker
            return web.Response(status=429, headers={"Retry-After": "1"})
        return web.Response(text="ok")


@pytest.mark.slow
@pytest.mark.anyio
async def test_four_processes_share_one_scope(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    await four_processes_share_one_scope(redis_server, admin, prefix)


async def four_processes_share_one_scope(server: Any, admin: Any, prefix: str) -> None:
    """Four worker processes share one scope through ``server`` (anything with a ``url``).

    ``admin`` reads the scope's keys (a cluster client for a cluster).
    """
    delay, concurrency, fail_at = 0.05, 3, 40
    log = ArrivalLog(latency=0.02, fail_at=fail_at)
    app = web.Application()
    app.router.add_get("/", log.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/"
    processes = []
    try:
        for number in range(4):
            command = worker_command(
                "crawl", server, prefix, "--url", url, "--name", f"w{number}",
                "--concurrency", str(concurrency), "--delay", str(delay), "--tasks", "3",
            )  # fmt: skip
            processes.append(await anyio.open_process(command))
        for process in processes:
            assert await read_line(process, 20.0) == "ready"
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send(b"go\n")
        with anyio.fail_after(30.0):
            await log.done.wait()
        # When the worker that got the 429 reported it (Redis clock).
        reported = backoff_state(await admin.hget(backend_keys(prefix, "shared")[1], "ctl"))[
            "last_signal_at"
        ]
    finally:
        for process in processes:
            if process.returncode is None:  # terminating an exited process raises
                process.terminate()
        for process in processes:
            await process.wait()
        await runner.cleanup()

    arrivals = log.arrivals
    lateness = sorted(a["at"] - a["send_at"] for a in arrivals)
    # Never more requests at the server than the shared concurrency.
    assert log.most_in_flight <= concurrency
    # No request arrived before its send time (Redis's TIME and time.time()
    # read the same wall clock; 10 us covers the send time's rounding).
    assert lateness[0] >= -1e-5, lateness[:3]
    # The send times, decided on Redis's clock, are never closer than the delay.
    # (Arrival gaps are these minus the earlier request's lateness, i.e. how
    # long its worker took from the send time to the server: not up to the
    # limiter, and on a loaded machine up to tens of milliseconds.)
    before = arrivals[: fail_at + 1]
    sends = sorted(a["send_at"] for a in before)
    assert min(b - a for a, b in itertools.pairwise(sends)) >= delay - 2e-6
    assert len({a["worker"] for a in before}) == 4  # every worker took part
    # One worker's 429 (Retry-After: 1, and backoff to a 1 s delay) slowed all
    # of them: after it was reported at `blocked_from`, nothing was sent until
    # the block ended except grants reserved before (at most reserve_ahead =
    # 0.05 s ahead), and later sends are a backed-off delay (1 s +- 10 %) apart.
    assert reported is not None
    blocked_from = float(reported)
    assert log.failed_at <= blocked_from < log.failed_at + 5.0
    after = sorted(a["send_at"] for a in arrivals if a["send_at"] > blocked_from + 0.05 + 1e-5)
    assert len(after) >= 3
    assert after[0] >= blocked_from + 1.0 - 1e-5, (blocked_from, after)
    assert all(b - a >= 0.9 - 2e-6 for a, b in itertools.pairwise(after)), after


def rampup_state(text: Any) -> dict[str, Any]:
    for kind, state in json.loads(text):
        if kind.endswith("RampupState"):
            return dict(state)
    raise LookupError("no rampup state stored")


@pytest.mark.slow
@pytest.mark.anyio
async def test_rampup_across_three_processes(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    """One rampup for the scope: every window of all three processes moves it one rung."""
    delay, concurrency, window, duration = 0.2, 2, 0.5, 3.0
    command = worker_command(
        "rampup", redis_server, prefix, "--tasks", "3", "--delay", str(delay),
        "--concurrency", str(concurrency), "--rampup-window", str(window),
        "--duration", str(duration),
    )  # fmt: skip
    outputs = await _together([command] * 3, duration)
    state = rampup_state(await admin.hget(backend_keys(prefix, "shared")[1], "ctl"))
    records = sorted((send, end) for output in outputs for send, end in output)
    assert all(outputs), "every process took part"
    sends = [send for send, _ in records]
    elapsed = sends[-1] - sends[0]
    # Each window without backoff signals made the shared scope one rung faster:
    # one rampup for all three processes, not one each (nor none, as before).
    assert 2 <= state["rung"] <= elapsed / window + 1, (state, elapsed)
    assert state["delay"] == pytest.approx(delay * 0.8 ** state["rung"])
    # Sends never closer than the fastest delay reached, and never more than
    # the concurrency in flight together (send to the end of the request).
    assert min(b - a for a, b in itertools.pairwise(sends)) >= state["delay"] - 2e-6
    assert _most_in_flight(records) <= concurrency
    later = [send for send in sends if send > sends[0] + elapsed / 2]
    assert len(later) / (sends[-1] - later[0]) > 1.2 / delay  # faster than the policy by then


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_release_wakes_two_processes_of_many_that_wait(
    redis_server: RedisServer, prefix: str
) -> None:
    """Six processes wait on one full scope: a release wakes the first two in line, not all six.

    Woken all at once, every process asked Redis for the one slot freed:
    about seven acquire calls per grant here (33 with 32 processes); woken
    two at a time, about three. A wake-up lost on its way would show as a
    scope held far below what its concurrency allows (each lost one idles a
    slot for the recheck, 1 s).
    """
    concurrency, hold, duration, workers = 2, 0.02, 3.0, 6
    command = worker_command(
        "bound", redis_server, prefix, "--tasks", "3", "--delay", "0",
        "--concurrency", str(concurrency), "--duration", str(duration),
    )  # fmt: skip
    outputs = await _together([command] * workers, duration)
    assert all(output["records"] for output in outputs), "every process took part"
    records = sorted(tuple(record) for output in outputs for record in output["records"])
    assert _most_in_flight(records) <= concurrency
    calls = sum(output["calls"] for output in outputs)
    grants = sum(output["grants"] for output in outputs)
    assert calls / grants < 4.5, (calls, grants)
    # The scope kept busy (allowed: concurrency / hold = 100/s; six processes
    # share two cores with Redis, so well below that, but no lost wake-ups).
    elapsed = records[-1][0] - records[0][0]
    assert len(records) / elapsed > 0.4 * concurrency / hold, (len(records), elapsed)


async def _together(commands: list[list[str]], duration: float) -> list[Any]:
    """Start a worker process per command, start them together, and read each one's JSON."""
    processes = []
    try:
        for command in commands:
            processes.append(await anyio.open_process(command))
        for process in processes:
            assert await read_line(process, 30.0) == "ready"
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send(b"go\n")
        return [json.loads(await read_line(process, duration + 30.0)) for process in processes]
    finally:
        for process in processes:
            if process.returncode is None:  # killing an exited process raises
                process.kill()
        for process in processes:
            await process.wait()


def _most_in_flight(records: Sequence[Sequence[float]]) -> int:
    """The most ``[send, end]`` intervals that overlap."""
    events = sorted([(send, 1) for send, _ in records] + [(end, -1) for _, end in records])
    level = most = 0
    for _, step in events:
        level += step
        most = max(most, level)
    return most
