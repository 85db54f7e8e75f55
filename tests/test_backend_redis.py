"""The Redis backend against a real redis-server that these tests start themselves.

Each server runs on a free port with ``--save '' --appendonly no`` and is
stopped afterwards. Without a ``redis-server`` binary the tests skip, unless
the ``CI`` environment variable is set: then they fail.

Timing checks and their tolerances
----------------------------------
Grants are decided on Redis's clock, and each request carries its send time
(``X-Send-At``, Redis clock) to the test HTTP server, which records it with
the arrival time. The checks on those records are exact:

* never more requests at the server than the shared concurrency;
* send times never closer than the delay (2 us of tolerance: send times
  travel as milliseconds with three decimals);
* no request arrives before its send time: Redis's ``TIME`` and
  ``time.time()`` read the same wall clock on this host (10 us tolerance for
  the same rounding).

Gaps between *arrivals* are the send gaps minus how late the earlier request
left its worker (timer wake-up and scheduling of the worker process, at most
a few milliseconds on an idle machine but tens on a loaded 2-core one), which
no limiter controls; they are therefore checked through the two exact checks
above rather than against a timing tolerance that would make the test flaky.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio as aioredis
from aiohttp import web
from anyio.streams.text import TextReceiveStream
from redis.crc import key_slot

import throttlekit
from throttlekit import AutoThrottle, BackendUnavailable, Backoff, Feedback, ScopePolicy
from throttlekit._ledger import ScopeLedger
from throttlekit.backends import _redis_scripts as scripts
from throttlekit.backends.redis import RedisBackend, _feedback_args, _policy_args
from throttlekit.headers import RateLimitInfo

pytestmark = pytest.mark.redis

REDIS_SERVER = shutil.which("redis-server")
WORKER = Path(__file__).with_name("redis_worker.py")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "redis.rst"


@pytest.fixture
def anyio_backend() -> str:
    """The backend runs on asyncio only (redis.asyncio)."""
    return "asyncio"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server process on a free port of 127.0.0.1, restartable on that port."""

    def __init__(self, *options: str, password: str | None = None, tls: bool = False) -> None:
        if REDIS_SERVER is None:
            reason = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
            if os.environ.get("CI"):
                pytest.fail(f"{reason}; it is required in CI")
            pytest.skip(reason)
        self.port = _free_port()
        self.password = password
        self.tls = tls
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        port_options = ["--port", "0", "--tls-port", str(self.port)] if self.tls else []
        if not self.tls:
            port_options = ["--port", str(self.port)]
        command = [
            REDIS_SERVER,
            *port_options,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *self.options,
        ]
        if self.password:
            command += ["--requirepass", self.password]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.process.stdout.read().decode() if self.process.stdout else ""
                raise RuntimeError(f"redis-server exited: {output[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start within 10 s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            if self.process.stdout:
                self.process.stdout.close()
            self.process = None

    def admin(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=self.port, password=self.password)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A server of the test's own, which it may stop and restart."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return f"t{random.randrange(10**9)}-{request.node.name[:40]}".replace("[", "_").replace("]", "")


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = redis_server.admin()
    yield client
    await client.aclose()


def backend_keys(prefix: str, scope: str) -> list[str]:
    """The keys of ``scope``: leases, state, slots, quota log, quota costs, waiters."""
    return [f"{{{prefix}:{scope}}}:{suffix}" for suffix in "LSTQCW"]


def make_backend(server: RedisServer, prefix: str, **options: Any) -> RedisBackend:
    return RedisBackend.from_url(server.url, prefix=prefix, **options)


def fast(**fields: Any) -> ScopePolicy:
    """A policy without slot delay or jitter unless given."""
    fields.setdefault("slot_delay", 0.0)
    return ScopePolicy(**fields)


async def evalsha_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


# -- grants, round trips, keys ---------------------------------------------------------


@pytest.mark.anyio
async def test_one_round_trip_per_acquire_and_per_release(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=4, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="warmup"):
        pass  # loads the scripts (NOSCRIPT -> SCRIPT LOAD) once
    await admin.config_resetstat()
    for _ in range(10):
        async with limiter.acquire(scopes={"a": 1.0, "b": 2.0}) as permit:
            assert permit.scopes == {"a": 1.0, "b": 2.0}
            assert await evalsha_calls(admin) % 2 == 1  # the acquire, before its release
    assert await evalsha_calls(admin) == 20
    stats = await admin.info("commandstats")
    assert "cmdstat_eval" not in stats  # always by SHA, never the script text
    assert backend.statistics().acquire_calls == 11
    assert backend.statistics().release_calls == 11
    await backend.aclose()


@pytest.mark.anyio
async def test_scripts_reload_after_script_flush(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="s"):
        pass
    await admin.script_flush()
    async with limiter.acquire(scopes="s") as permit:
        assert permit.scopes == {"s": 1.0}
    await backend.aclose()


@pytest.mark.anyio
async def test_keys_share_a_hash_tag_and_all_expire(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    scopes = ["example.com", "a}b{c", "ключ", "x'); redis.call('FLUSHALL') --"]
    policy = fast(concurrency=1, delay=0.01, slot_delay=0.01, quota=100.0, window=30.0)
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=policy, backend=backend)
    await admin.set("sentinel", "still here")
    for scope in scopes:
        async with limiter.acquire(scopes=scope) as permit:
            permit.record(status=429, headers={"Retry-After": "0.1"})
        keys = backend.scope_keys(scope)
        assert len({key_slot(key.encode()) for key in keys}) == 1  # one Cluster slot
    # A waiter sets the waiters flag: hold the only slot and wait behind it.
    async with limiter.acquire(scopes="example.com"):
        with anyio.move_on_after(0.05):
            async with limiter.acquire(scopes="example.com"):
                pass
    assert await admin.get("sentinel") == b"still here"
    names = [key async for key in admin.scan_iter(match=f"{{{prefix}:*")]
    suffixes = {name.decode().rsplit(":", 1)[1] for name in names}
    assert {"S", "T", "Q", "C", "W"} <= suffixes
    for name in names:
        ttl = await admin.pttl(name)
        assert ttl > 0, f"{name!r} has no expiry"
    await backend.aclose()


@pytest.mark.anyio
async def test_concurrency_and_delay_within_one_process(
    redis_server: RedisServer, prefix: str
) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=2, delay=0.02), backend=backend)
    sends: list[float] = []
    in_flight = 0
    most = 0

    async def one() -> None:
        nonlocal in_flight, most
        async with limiter.acquire(scopes="s") as permit:
            sends.append(permit._lease.send_at_ms)
            in_flight += 1
            most = max(most, in_flight)
            await anyio.sleep(0.03)
            in_flight -= 1

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        for _ in range(20):
            group.start_soon(one)
    elapsed = time.monotonic() - started
    sends.sort()
    assert most <= 2
    assert min(b - a for a, b in itertools.pairwise(sends)) >= 20.0 - 0.002
    assert elapsed < 5.0  # (the rate itself is measured in benchmarks/)
    await backend.aclose()


@pytest.mark.anyio
async def test_two_backends_share_one_budget(redis_server: RedisServer, prefix: str) -> None:
    first = make_backend(redis_server, prefix)
    second = make_backend(redis_server, prefix)
    policy = fast(concurrency=2, delay=0.0)
    one = throttlekit.Limiter(default=policy, backend=first)
    two = throttlekit.Limiter(default=policy, backend=second)
    async with one.acquire(scopes="api", timeout=0), two.acquire(scopes="api", timeout=0):
        # timeout=0: one attempt (a round trip) but no waiting.
        with pytest.raises(throttlekit.ThrottleTimeout):
            await one.acquire(scopes="api", timeout=0).__aenter__()
        with pytest.raises(throttlekit.ThrottleTimeout):
            await two.acquire(scopes="api", timeout=0.1).__aenter__()
        stats = await first.scope_statistics(one, "api")
        assert stats.in_flight == 2
        assert stats.concurrency == 2
    # A release in one process wakes a waiter of the other through pub/sub.
    granted = anyio.Event()
    woken_after = math.inf

    async def waiter() -> None:
        nonlocal woken_after
        started = anyio.current_time()
        async with two.acquire(scopes="api"):
            woken_after = anyio.current_time() - started
            granted.set()

    held = [one.acquire(scopes="api"), one.acquire(scopes="api")]
    for permit in held:
        await permit.__aenter__()
    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.sleep(0.2)
        assert not granted.is_set()
        await held[0].__aexit__(None, None, None)
        with anyio.fail_after(1.0):
            await granted.wait()
    await held[1].__aexit__(None, None, None)
    assert 0.2 <= woken_after < 0.5  # woken by the release, not by a timer (5 s)
    await first.aclose()
    await second.aclose()


@pytest.mark.anyio
async def test_quota_costs_and_reconciliation(redis_server: RedisServer, prefix: str) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(
        default=fast(concurrency=None, delay=0.0, quota=3.0, window=0.4), backend=backend
    )
    async with limiter.acquire(scopes={"q": 2.0}) as permit:
        permit.record(status=200, consumed={"q": 0.5})  # it cost less than declared
    async with limiter.acquire(scopes={"q": 2.0}):
        pass
    stats = await backend.scope_statistics(limiter, "q")
    assert stats.quota_used == pytest.approx(2.5)
    assert stats.quota_left == pytest.approx(0.5)
    started = anyio.current_time()
    async with limiter.acquire(scopes={"q": 1.0}):
        waited = anyio.current_time() - started
    assert 0.3 <= waited < 0.7  # until the first send left the window
    with pytest.raises(ValueError, match="exceeds its quota"):
        await limiter.acquire(scopes={"q": 4.0}).__aenter__()
    await backend.aclose()


@pytest.mark.anyio
async def test_slot_delay_is_shared(redis_server: RedisServer, prefix: str) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(
        default=ScopePolicy(concurrency=2, delay=0.0, slot_delay=0.2), backend=backend
    )
    sends = []
    for _ in range(4):
        async with limiter.acquire(scopes="slots") as permit:
            sends.append(permit._lease.send_at_ms)
    # Two slots: the third send reuses the first slot 0.2 s after its send.
    assert sends[1] - sends[0] < 50
    assert sends[2] - sends[0] >= 200 - 0.002
    assert sends[3] - sends[1] >= 200 - 0.002
    await backend.aclose()


@pytest.mark.anyio
async def test_backoff_and_retry_after_are_shared(redis_server: RedisServer, prefix: str) -> None:
    one = make_backend(redis_server, prefix)
    two = make_backend(redis_server, prefix)
    policy = fast(concurrency=4, delay=0.05)
    first = throttlekit.Limiter(default=policy, backend=one)
    second = throttlekit.Limiter(default=policy, backend=two)
    async with first.acquire(scopes="site") as permit:
        permit.record(status=429, headers={"Retry-After": "0.5"})
    stats = await two.scope_statistics(second, "site")
    assert stats.backoff_level == 1
    assert stats.last_signal == "429"
    assert stats.delay == pytest.approx(1.0)  # max(min_delay 1.0, 0.05 x 2)
    assert stats.blocked_until - anyio.current_time() == pytest.approx(0.5, abs=0.1)
    assert "blocked" in stats.reason
    started = anyio.current_time()
    async with second.acquire(scopes="site") as permit:
        assert anyio.current_time() - started >= 0.4
    # Requests that were in flight before a step count as that same step.
    burst = [
        first.acquire(scopes="burst"),
        second.acquire(scopes="burst"),
        first.acquire(scopes="burst"),
    ]
    for permit in burst:
        await permit.__aenter__()
    for permit in burst:
        permit.record(status=503)
        await permit.__aexit__(None, None, None)
    stats = await one.scope_statistics(first, "burst")
    assert stats.backoff_level == 1
    assert stats.last_signal == "503"
    await one.aclose()
    await two.aclose()


@pytest.mark.anyio
async def test_feedback_for_some_scopes_only(redis_server: RedisServer, prefix: str) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=4, delay=0.0), backend=backend)
    async with limiter.acquire(scopes={"api": 1.0, "site": 1.0}) as permit:
        permit.record(status=503, scopes={"site"})  # the site failed, not the API
    assert (await backend.scope_statistics(limiter, "site")).backoff_level == 1
    assert (await backend.scope_statistics(limiter, "api")).backoff_level == 0
    await backend.aclose()


@pytest.mark.anyio
async def test_autothrottle_delay_is_shared(redis_server: RedisServer, prefix: str) -> None:
    backend = make_backend(redis_server, prefix)
    policy = fast(concurrency=4, delay=0.0, autothrottle=AutoThrottle(start_delay=0.1))
    limiter = throttlekit.Limiter(default=policy, backend=backend, seed=1)
    async with limiter.acquire(scopes="slow") as permit:
        permit.record(status=200, latency=0.5)
    stats = await backend.scope_statistics(limiter, "slow")
    assert stats.delay == pytest.approx(0.5)  # max(target 0.5, (0.1 + 0.5) / 2)
    async with limiter.acquire(scopes="slow") as permit:
        permit.record(status=200, latency=0.1)
    stats = await backend.scope_statistics(limiter, "slow")
    assert stats.delay == pytest.approx(0.3)
    await backend.aclose()


# -- the controllers in Lua against the in-memory ones ---------------------------------

_HARNESS = r"""
local p = read_policy(1)
local st = load_state(KEYS[1], p)
local out = {}
local i = 20
while i <= #ARGV do
  local now = tonumber(ARGV[i + 1])
  if ARGV[i] == 'send' then
    on_send(st, p, now)
    i = i + 2
  else
    local fb = {signal = tonumber(ARGV[i + 2]), name = ARGV[i + 3], sent = tonumber(ARGV[i + 4]),
                hwait = tonumber(ARGV[i + 5]), pace = tonumber(ARGV[i + 6]),
                pacefor = tonumber(ARGV[i + 7]), latency = tonumber(ARGV[i + 8]),
                status = tonumber(ARGV[i + 9]), adjust = tonumber(ARGV[i + 10])}
    on_feedback(st, p, now, fb, tonumber(ARGV[i + 11]))
    i = i + 12
  end
  local delay, conc, _, _, blk = effective(st, p)
  out[#out + 1] = {g(delay), conc, st.level, g(blk)}
end
return out
"""


def _random_events(rng: random.Random, count: int) -> list[tuple[str, float, Feedback | None]]:
    now = 1000.0
    last_send = now
    events: list[tuple[str, float, Feedback | None]] = []
    for _ in range(count):
        now += rng.choice([0.01, 0.5, 2.0, 30.0, 61.0, 200.0])
        if rng.random() < 0.3:
            events.append(("send", now, None))
            last_send = now
            continue
        status = rng.choice([200, 200, 200, 429, 503, 404])
        info = None
        if rng.random() < 0.2:
            info = RateLimitInfo(retry_after=rng.choice([0.5, 5.0, 1000.0]))
        elif rng.random() < 0.2:
            info = RateLimitInfo(remaining=rng.choice([0, 1, 50]), reset=10.0, limit=100.0)
        sent = rng.choice([last_send, now - 0.1])
        latency = rng.choice([0.05, 0.4, 3.0])
        events.append(
            (
                "feedback",
                now,
                Feedback(status=status, rate_limit=info, latency=latency, sent_at=sent),
            )
        )
    return events


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "policy",
    [
        ScopePolicy(concurrency=4, delay=0.25, jitter=0.0),
        ScopePolicy(concurrency=8, delay=0.0, backoff=Backoff(max_delay=20.0, min_delay=2.0)),
        ScopePolicy(concurrency=2, delay=0.5, autothrottle=AutoThrottle(start_delay=1.0)),
        ScopePolicy(concurrency=3, delay=0.1, backoff=Backoff(delay_factor=1.5, window=10.0)),
    ],
    ids=["default-backoff", "capped-backoff", "autothrottle", "gentle-backoff"],
)
@pytest.mark.anyio
async def test_lua_controllers_match_the_in_memory_ones(
    admin: aioredis.Redis, prefix: str, seed: int, policy: ScopePolicy
) -> None:
    """The same events through throttlekit's controllers and through the Lua port."""
    ledger = ScopeLedger("scope", policy)
    events = _random_events(random.Random(seed), 120)
    args: list[Any] = list(_policy_args(policy))
    expected = []
    for kind, now, feedback in events:
        if kind == "send":
            args += ["send", now * 1000]
            for controller in ledger.controllers:
                if now >= controller.due:
                    controller.on_send(ledger, now)
        else:
            assert feedback is not None
            backoff = policy.backoff
            signal = 1 if backoff is not None and backoff.is_signal(feedback) else 0
            hwait, pace, pace_for, latency, status, adjust, name = _feedback_args(feedback)
            assert feedback.sent_at is not None
            args += ["feedback", now * 1000, signal, name, feedback.sent_at * 1000]
            args += [hwait, pace, pace_for, latency, status, adjust, ledger.in_flight]
            ledger.on_feedback(feedback, now)
        ledger.refresh()
        blocked = ledger.blocked_until
        expected.append(
            (
                ledger.delay * 1000,
                ledger.concurrency,
                _level(ledger),
                blocked * 1000 if blocked > 0 else 0,
            )
        )
    source = scripts.COMMON + scripts.CONTROLLERS + _HARNESS
    replies = await admin.eval(source, 1, f"{{{prefix}}}:S", *args)
    assert len(replies) == len(expected)
    for index, (reply, want) in enumerate(zip(replies, expected, strict=True)):
        got = (float(reply[0]), int(reply[1]) or None, int(reply[2]), float(reply[3]))
        context = f"event {index}: {events[index]}"
        assert got[0] == pytest.approx(want[0], rel=1e-9, abs=1e-6), context
        assert got[1] == want[1], context
        assert got[2] == want[2], context
        assert got[3] == pytest.approx(want[3], abs=0.002), context


def _level(ledger: ScopeLedger) -> int:
    for controller in ledger.controllers:
        level = getattr(controller, "level", None)
        if level is not None:
            return int(level)
    return 0


# -- waiting, cancellation, timeouts ---------------------------------------------------


@pytest.mark.anyio
async def test_cancelled_waiters_and_reservations_give_everything_back(
    redis_server: RedisServer, prefix: str
) -> None:
    backend = make_backend(redis_server, prefix, reserve_ahead=1.0)
    limiter = throttlekit.Limiter(
        default=fast(concurrency=2, delay=0.5, quota=10.0, window=60.0), backend=backend
    )
    async with limiter.acquire(scopes="c"):
        pass
    # The next grant is reserved 0.5 s ahead: cancel it while it sleeps.
    with anyio.move_on_after(0.1) as scope:
        async with limiter.acquire(scopes={"c": 3.0}):
            pytest.fail("the reserved grant should still be sleeping")
    assert scope.cancelled_caught
    assert backend.statistics().grants == 2  # it was granted, then handed back
    stats = await backend.scope_statistics(limiter, "c")
    assert stats.in_flight == 0
    assert stats.quota_used == pytest.approx(1.0)  # the reserved 3.0 was refunded
    # A waiter that times out leaves nothing behind either.
    with pytest.raises(throttlekit.ThrottleTimeout):
        async with limiter.acquire(scopes="c", timeout=0.05):
            pass
    stats = await backend.scope_statistics(limiter, "c")
    assert stats.in_flight == 0
    assert stats.waiting == 0
    assert backend.statistics().waiting == 0
    await backend.aclose()


@pytest.mark.anyio
async def test_cancellation_at_any_point_leaks_nothing(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    """Cancel 80 requests at random moments: waiting, in a round trip, reserved, or sending."""
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(
        default=fast(concurrency=3, delay=0.004, quota=1000.0, window=60.0), backend=backend
    )
    rng = random.Random(11)
    sent = 0

    async def one(after: float) -> None:
        nonlocal sent
        with anyio.move_on_after(after):
            async with limiter.acquire(scopes="x"):
                sent += 1
                await anyio.sleep(0.005)

    async with anyio.create_task_group() as group:
        for _ in range(80):
            group.start_soon(one, rng.uniform(0.0, 0.15))
    stats = await backend.scope_statistics(limiter, "x")
    assert 0 < sent < 80
    assert stats.in_flight == 0  # no lease left behind
    assert stats.quota_used == pytest.approx(sent)  # only what was sent is counted
    assert backend.statistics().waiting == 0
    assert backend._queues == {}
    await backend.aclose()


@pytest.mark.anyio
async def test_local_line_keeps_priority_and_order(redis_server: RedisServer, prefix: str) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
    order: list[str] = []

    async def request(name: str, priority: int) -> None:
        async with limiter.acquire(scopes="line", priority=priority):
            order.append(name)
            await anyio.sleep(0.01)

    holder = limiter.acquire(scopes="line")
    await holder.__aenter__()
    async with anyio.create_task_group() as group:
        for name, priority in [("low1", 0), ("low2", 0), ("high", 5), ("low3", 0)]:
            group.start_soon(request, name, priority)
            await anyio.sleep(0.02)
        await holder.__aexit__(None, None, None)
    assert order == ["high", "low1", "low2", "low3"]
    await backend.aclose()


@pytest.mark.anyio
async def test_renew_and_keep_alive(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make_backend(redis_server, prefix, lease_time=0.3)
    limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="long") as permit, backend.keep_alive(permit, interval=0.1):
        await anyio.sleep(0.7)  # more than twice the lease time
        with pytest.raises(throttlekit.ThrottleTimeout):
            await limiter.acquire(scopes="long", timeout=0.1).__aenter__()
    assert "had expired" not in caplog.text
    # Without renewal the lease lapses, and the release says so.
    with caplog.at_level(logging.WARNING, logger="throttlekit.backends.redis"):
        async with limiter.acquire(scopes="long") as permit:
            await anyio.sleep(0.4)
            assert not await backend.renew(permit)
    assert "had expired before its release" in caplog.text
    await backend.aclose()


@pytest.mark.anyio
async def test_validation_names_the_field(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="prefix"):
        RedisBackend.from_url(redis_server.url, prefix="a{b}")
    with pytest.raises(ValueError, match="failure"):
        RedisBackend.from_url(redis_server.url, failure="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease_time"):
        RedisBackend.from_url(redis_server.url, lease_time=0)
    with pytest.raises(TypeError, match="client"):
        RedisBackend(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid Redis URL") as info:
        RedisBackend.from_url("redis://:hunter2@127.0.0.1:6379/0?socket_timeout=abc")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.anyio
async def test_trio_gets_a_clear_error(redis_server: RedisServer, prefix: str) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(backend=backend)
    with pytest.raises(RuntimeError, match="asyncio only"):
        await limiter.acquire(scopes="s").__aenter__()


# -- credentials and TLS ----------------------------------------------------------------


def _leaks(secret: str, *texts: str) -> list[str]:
    return [text for text in texts if secret in text]


@pytest.mark.anyio
async def test_password_works_and_never_leaks(caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cr3t-Pa55word"
    server = RedisServer(password=secret)
    server.start()
    try:
        backend = RedisBackend.from_url(server.url, prefix="auth", failure="fail_closed")
        limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
        async with limiter.acquire(scopes="s") as permit:
            assert not _leaks(secret, repr(permit), repr(backend), repr(limiter))
        assert not _leaks(secret, repr(backend), backend.location)
        await backend.aclose()
        # A wrong password, then a server that is gone: clear errors, no secret.
        wrong = RedisBackend.from_url(
            server.url.replace(secret, "wrong-" + secret), prefix="auth", failure="fail_closed"
        )
        with pytest.raises((BackendUnavailable, redis.exceptions.AuthenticationError)) as failed:
            await throttlekit.Limiter(backend=wrong).acquire(scopes="s").__aenter__()
        await wrong.aclose()
        server.stop()
        with caplog.at_level(logging.DEBUG):
            for failure in ("fail_closed", "fail_open"):
                gone = RedisBackend.from_url(server.url, prefix="auth", failure=failure)  # type: ignore[arg-type]
                limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=gone)
                if failure == "fail_closed":
                    with pytest.raises(BackendUnavailable) as unreachable:
                        await limiter.acquire(scopes="s").__aenter__()
                    message = str(unreachable.value)
                    assert "unavailable" in message
                    assert "127.0.0.1" in message
                    texts = "".join(traceback.format_exception(unreachable.value))
                else:
                    async with limiter.acquire(scopes="s"):
                        pass
                    texts = repr(gone)
                assert not _leaks(secret, texts, repr(gone))
                await gone.aclose()
        assert "unavailable" in caplog.text
        assert not _leaks(secret, caplog.text, "".join(traceback.format_exception(failed.value)))
    finally:
        server.stop()


def _make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate authority")
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = ["-days", "1"]
    commands = [
        [openssl, "req", "-x509", *ec, "-keyout", ca_key, "-out", ca_cert, "-subj", "/CN=ca", *run],
        [openssl, "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        [openssl, "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-extfile", extensions, *run],
    ]  # fmt: skip
    for command in commands:
        subprocess.run([str(part) for part in command], check=True, capture_output=True)
    return ca_cert, cert, key


@pytest.mark.anyio
async def test_tls_url_with_password(tmp_path: Path) -> None:
    ca_cert, cert, key = _make_certificates(tmp_path)
    secret = "tls-Secret-42"
    server = RedisServer(
        "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
        str(ca_cert), "--tls-auth-clients", "no", password=secret, tls=True,
    )  # fmt: skip
    try:
        server.start()
    except RuntimeError as exc:
        if os.environ.get("CI") or "tls" not in str(exc).lower():
            raise
        pytest.skip(f"this redis-server has no TLS support: {exc}")
    try:
        url = f"{server.url}?ssl_ca_certs={ca_cert}"
        backend = RedisBackend.from_url(url, prefix="tls", failure="fail_closed")
        assert backend.location.startswith("rediss://***@127.0.0.1:")
        limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
        async with limiter.acquire(scopes="s") as permit:
            assert permit.scopes == {"s": 1.0}
        assert backend.statistics().grants == 1
        assert secret not in repr(backend)
        await backend.aclose()
    finally:
        server.stop()


# -- faults ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_restart_mid_run_fail_open_and_fail_closed(
    own_redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = own_redis_server
    policy = fast(concurrency=2, delay=0.01)
    opened = make_backend(server, prefix, failure="fail_open", reconnect_interval=0.1)
    closed = make_backend(server, prefix, failure="fail_closed")
    open_limiter = throttlekit.Limiter(default=policy, backend=opened)
    closed_limiter = throttlekit.Limiter(default=policy, backend=closed)
    done = {"open": 0, "closed": 0}
    errors: list[BaseException] = []
    phase = "before"
    during = {"open": 0, "closed": 0}

    async def loop(name: str, limiter: throttlekit.Limiter) -> None:
        while phase != "finished":
            started = phase  # the server is already gone when this is "down"
            try:
                async with limiter.acquire(scopes="r"):
                    await anyio.sleep(0.005)
            except BackendUnavailable as exc:
                errors.append(exc)
                await anyio.sleep(0.02)
                continue
            done[name] += 1
            if started == "down" and phase == "down":  # begun and ended while Redis was down
                during[name] += 1

    with caplog.at_level(logging.INFO, logger="throttlekit.backends.redis"):
        async with anyio.create_task_group() as group:
            group.start_soon(loop, "open", open_limiter)
            group.start_soon(loop, "closed", closed_limiter)
            await anyio.sleep(0.3)
            assert done["open"] > 5
            assert done["closed"] > 5
            server.stop()
            phase = "down"
            await anyio.sleep(0.4)
            server.start()
            phase = "back"
            marks = dict(done)
            await anyio.sleep(0.6)
            phase = "finished"
    assert during["open"] > 5  # kept going on the local ledgers
    assert during["closed"] == 0  # raised instead
    assert errors
    assert all("unavailable" in str(error) and "failing closed" in str(error) for error in errors)
    assert done["open"] > marks["open"] + 5  # both recovered
    assert done["closed"] > marks["closed"] + 5
    assert opened.statistics().local_grants >= during["open"]
    assert opened.statistics().available
    assert "throttling with this process's in-memory ledgers" in caplog.text
    assert "is back" in caplog.text
    await opened.aclose()
    await closed.aclose()


async def _read_line(process: anyio.abc.Process, within: float) -> str:
    assert process.stdout is not None
    buffer = ""
    with anyio.fail_after(within):
        async for chunk in TextReceiveStream(process.stdout):
            buffer += chunk
            if "\n" in buffer:
                return buffer.split("\n", 1)[0]
    return buffer


def _worker_command(mode: str, server: RedisServer, prefix: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(WORKER),
        mode,
        "--redis-url",
        server.url,
        "--prefix",
        prefix,
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.anyio
async def test_killed_worker_slots_come_back_after_lease_time(
    redis_server: RedisServer, prefix: str
) -> None:
    lease_time = 1.0
    process = await anyio.open_process(
        _worker_command(
            "hold", redis_server, prefix, "--lease-time", str(lease_time), "--hold", "3"
        )
    )
    try:
        line = await _read_line(process, 20.0)
        assert line.startswith("held"), line
        held = [float(value) for value in line.split()[1:]]
    finally:
        process.kill()  # SIGKILL: no release, no cleanup
        await process.wait()
    backend = make_backend(redis_server, prefix, failure="fail_closed")
    policy = fast(concurrency=3, delay=0.05, jitter=0.0)
    limiter = throttlekit.Limiter(scopes={"shared": policy}, backend=backend)
    with pytest.raises(throttlekit.ThrottleTimeout):
        await limiter.acquire(scopes="shared", timeout=0.1).__aenter__()
    started = time.monotonic()
    async with limiter.acquire(scopes="shared", timeout=lease_time + 2.0) as permit:
        waited = time.monotonic() - started
        send_at = permit._lease.send_at_ms
    assert send_at >= min(held) + lease_time * 1000 - 0.002  # not before the lease expired
    assert waited < lease_time + 0.5  # woken at the expiry, not by a 5 s recheck
    await backend.aclose()


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
    delay, concurrency, fail_at = 0.05, 3, 40
    log = ArrivalLog(latency=0.02, fail_at=fail_at)
    app = web.Application()
    app.router.add_get("/", log.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/"
    processes = []
    try:
        for number in range(4):
            command = _worker_command(
                "crawl", redis_server, prefix, "--url", url, "--name", f"w{number}",
                "--concurrency", str(concurrency), "--delay", str(delay), "--tasks", "3",
            )  # fmt: skip
            processes.append(await anyio.open_process(command))
        for process in processes:
            assert await _read_line(process, 20.0) == "ready"
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send(b"go\n")
        with anyio.fail_after(30.0):
            await log.done.wait()
        # When the worker that got the 429 reported it (Redis clock, ms).
        reported = await admin.hget(backend_keys(prefix, "shared")[1], "lsat")
    finally:
        for process in processes:
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
    blocked_from = float(reported) / 1000
    assert log.failed_at <= blocked_from < log.failed_at + 5.0
    after = sorted(a["send_at"] for a in arrivals if a["send_at"] > blocked_from + 0.05 + 1e-5)
    assert len(after) >= 3
    assert after[0] >= blocked_from + 1.0 - 1e-5, (blocked_from, after)
    assert all(b - a >= 0.9 - 2e-6 for a, b in itertools.pairwise(after)), after


# -- the documented example -------------------------------------------------------------


@pytest.mark.anyio
async def test_docs_example_runs(redis_server: RedisServer, prefix: str) -> None:
    text = DOCS.read_text()
    blocks = re.findall(
        r"\.\. code-block:: python\n\s*:name: redis-example\n\n((?:    .*\n|\n)+)", text
    )
    assert blocks, "docs/redis.rst lost its tested example"
    source = textwrap.dedent(blocks[0])
    hits: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        hits.append(time.monotonic())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        namespace: dict[str, Any] = {}
        exec(compile(source, str(DOCS), "exec"), namespace)
        urls = [f"http://127.0.0.1:{port}/page/{number}" for number in range(6)]
        statuses = await namespace["crawl"](urls, redis_server.url, prefix)
    finally:
        await runner.cleanup()
    assert statuses == [200] * 6
    assert len(hits) == 6
