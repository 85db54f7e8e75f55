"""The Redis backend against a real redis-server that these tests start themselves.

Grants, keys, round trips, quotas, shared controllers, waiting and
cancellation, credentials and TLS. The controllers against the in-memory
backend and several processes: ``test_backend_redis_shared.py``; Redis
failing: ``test_backend_redis_faults.py``.
"""

from __future__ import annotations

import importlib
import itertools
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import redis
import redis.asyncio as aioredis
from _redis import (
    CLIENT_LIBRARIES,
    NEEDS_VALKEY,
    PortTaken,
    RedisServer,
    backend_keys,
    client_errors,
    client_module,
    delay_cut_reaches_waiting_processes,
    fast,
    free_port,
    listens,
    make_backend,
)
from aiohttp import web
from redis.crc import key_slot

import throttlekit
from throttlekit import AutoThrottle, BackendUnavailable, ScopePolicy
from throttlekit.backends import _redis_args, _redis_scripts
from throttlekit.backends._redis_link import Wire, pack
from throttlekit.backends.redis import RedisBackend

pytestmark = pytest.mark.redis

DOCS = Path(__file__).resolve().parent.parent / "docs" / "redis.rst"


@pytest.fixture
def anyio_backend() -> str:
    """The backend runs on asyncio only (redis.asyncio)."""
    return "asyncio"


async def evalsha_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


# -- grants, round trips, keys ---------------------------------------------------------


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_one_round_trip_per_acquire_and_per_release(
    library_server: RedisServer, library_admin: aioredis.Redis, prefix: str, client_library: str
) -> None:
    warmup = make_backend(library_server, prefix, client_library=client_library)
    async with throttlekit.Limiter(default=fast(), backend=warmup).acquire(scopes="warmup"):
        pass  # loads the scripts (NOSCRIPT -> SCRIPT LOAD) once
    await warmup.aclose()  # (confirms its release, so that it is counted before the reset)
    await library_admin.config_resetstat()
    backend = make_backend(library_server, prefix, client_library=client_library)
    assert type(backend.client).__module__.startswith(client_library)
    limiter = throttlekit.Limiter(default=fast(concurrency=4, delay=0.0), backend=backend)
    for _ in range(10):
        async with limiter.acquire(scopes={"a": 1.0, "b": 2.0}) as permit:
            assert permit.scopes == {"a": 1.0, "b": 2.0}
            assert await evalsha_calls(library_admin) % 2 == 1  # the acquire, before its release
    # The last release may be sent without waiting for its reply: closing confirms it.
    await backend.aclose()
    assert await evalsha_calls(library_admin) == 20
    stats = await library_admin.info("commandstats")
    assert "cmdstat_eval" not in stats  # always by SHA, never the script text
    assert backend.statistics().acquire_calls == 10
    assert backend.statistics().release_calls == 10


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_scripts_reload_after_script_flush(
    library_server: RedisServer, library_admin: aioredis.Redis, prefix: str, client_library: str
) -> None:
    backend = make_backend(library_server, prefix, client_library=client_library)
    limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="s"):
        pass
    await library_admin.script_flush()
    async with limiter.acquire(scopes="s") as permit:
        assert permit.scopes == {"s": 1.0}
    await backend.aclose()


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_wire_reads_replies_with_redis_py_on_the_supported_versions(
    library_server: RedisServer, client_library: str
) -> None:
    """:class:`Wire`, the one place that reaches into a connection, on this redis-py
    (and valkey-py).

    Replies come from the library's own parser (hiredis or libvalkey when
    installed): the scripts' reply types, nested arrays with nils, and error
    replies as their classes; a closed connection raises ``ConnectionError``.
    """
    library = importlib.import_module(client_library)
    major, minor = (int(part) for part in library.__version__.split(".")[:2])
    supported = ((5, 0), (9, 0)) if client_library == "redis" else ((6, 0), (7, 0))
    assert supported[0] <= (major, minor) < supported[1], f"{library} is not supported"
    errors = client_errors(client_library)
    client = client_module(client_library).from_url(library_server.url)
    connection = await Wire.connection(client.connection_pool)
    try:
        assert Wire.writer(connection) is not None  # (connected by the pool)
        script = b"return {0, false, {'a', false}, 'x'}"
        command = pack(b"", 0, (b"EVAL", script, b"0"))
        await Wire.write(connection, command + pack(b"", 0, (b"EVALSHA", b"0" * 40, b"0")))
        assert await Wire.read(connection) == [0, None, [b"a", None], b"x"]
        with pytest.raises(errors.NoScriptError):
            await Wire.read(connection)
        await Wire.write(connection, pack(b"", 0, (b"PING",)))
        assert await Wire.read(connection) == b"PONG"
        await connection.disconnect()
        assert Wire.writer(connection) is None
        with pytest.raises(errors.ConnectionError):
            await Wire.read(connection)
    finally:
        await client.connection_pool.release(connection)
        await client.aclose()


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
    names = [key async for key in admin.scan_iter(match=f"{{{prefix}:*")]
    suffixes = {name.decode().rsplit(":", 1)[1] for name in names}
    assert {"S", "T", "Q", "C"} <= suffixes  # (T expires a second after the slot delay)

    # A waiter puts its process in the scope's line of processes (W): hold the
    # only slot and wait behind it (in another task: an acquire nested in a
    # permit of its own task shares it); the release takes it out of the line.
    async def wait_behind() -> None:
        with anyio.move_on_after(0.05):
            async with limiter.acquire(scopes="example.com"):
                pass

    async with limiter.acquire(scopes="example.com"), anyio.create_task_group() as tasks:
        tasks.start_soon(wait_behind)
        await anyio.sleep(0.02)
        lines = [key async for key in admin.scan_iter(match=f"{{{prefix}:*:W")]
        assert len(lines) == 1
        assert await admin.zcard(lines[0]) == 1
        names += lines
    assert await admin.get("sentinel") == b"still here"
    for name in names:
        ttl = await admin.pttl(name)
        assert ttl != -1, f"{name!r} has no expiry"  # (-2: expired meanwhile)
    await backend.aclose()


@pytest.mark.anyio
async def test_a_waiter_told_to_wait_for_time_leaves_the_line_of_processes(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    """A process told to wait for a slot stands in line; told to wait for time, it leaves.

    A release wakes the first two processes in line: one whose waiter
    sleeps until a delay's turn would take the wake-up and leave the slot
    idle. Here the slot frees by its lease's expiry (no release, so nobody
    takes the process out of the line), and the scope's delay is not due.
    """
    policy = fast(concurrency=1, delay=0.6)
    holder = make_backend(redis_server, prefix, lease_time=0.15)
    waiter = make_backend(redis_server, prefix)
    holding = throttlekit.Limiter(default=policy, backend=holder)
    waiting = throttlekit.Limiter(default=policy, backend=waiter)
    line = holder.scope_keys("example.com")[-1]
    assert line.endswith(":W")
    in_line: list[int] = []

    async def wait() -> None:
        async with waiting.acquire(scopes="example.com"):
            pass

    async with anyio.create_task_group() as tasks, holding.acquire(scopes="example.com"):
        tasks.start_soon(wait)
        await anyio.sleep(0.05)  # full: in line
        in_line.append(await admin.zcard(line))
        await anyio.sleep(0.25)  # expired (0.15 s): the slot is free, the delay (0.6 s) not due
        in_line.append(await admin.zcard(line))
    assert in_line == [1, 0]
    await holder.aclose()
    await waiter.aclose()


@pytest.mark.parametrize("cut_in", ["release", "send"])
@pytest.mark.anyio
async def test_processes_waiting_on_turns_hear_that_the_delay_was_cut(
    redis_server: RedisServer, prefix: str, cut_in: str
) -> None:
    """A delay that shortens reaches the processes that wait for their turns at once.

    Seven processes (backends) wait on a scope whose delay is 0.5 s: Redis
    hands them turns 0.5 s apart, up to 3.5 s ahead. Then a success cuts the
    delay to 0.01 s: stored by the release that carries it, or by the next
    send's ``on_send`` (``cut_in``). Sleeping to their old turns, the last
    of them waited 3 s more; told, each asks again at once.
    """
    backends = [make_backend(redis_server, prefix) for _ in range(8)]
    await delay_cut_reaches_waiting_processes(backends, cut_in)


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


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_two_backends_share_one_budget(
    library_server: RedisServer, prefix: str, client_library: str
) -> None:
    """Two backends, one of redis-py's client and one of ``client_library``'s."""
    first = make_backend(library_server, prefix)
    second = make_backend(library_server, prefix, client_library=client_library)
    policy = fast(concurrency=2, delay=0.0)
    one = throttlekit.Limiter(default=policy, backend=first)
    two = throttlekit.Limiter(default=policy, backend=second)
    async with one.acquire(scopes="api", timeout=0), two.acquire(scopes="api", timeout=0):
        # timeout=0: one attempt (a round trip) but no waiting.
        with pytest.raises(throttlekit.ThrottleTimeout):
            await enter_elsewhere(one.acquire(scopes="api", timeout=0))
        with pytest.raises(throttlekit.ThrottleTimeout):
            await enter_elsewhere(two.acquire(scopes="api", timeout=0.1))
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
        await enter_elsewhere(permit)
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
        await enter_elsewhere(permit)
    for permit in burst:
        permit.record(status=503)
        await permit.__aexit__(None, None, None)
    stats = await one.scope_statistics(first, "burst")
    assert stats.backoff_level == 1
    assert stats.last_signal == "503"
    await one.aclose()
    await two.aclose()


@pytest.mark.anyio
async def test_a_decision_run_again_on_a_newer_state_is_logged_once(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The controllers run on the state a grant brought; another process
    # wrote the scope meanwhile, so they run again on the newer one, and
    # only that run's write stands. Both runs were logged: three processes
    # against nginx read "edge 20/s", then "edge 21/s", for one refusal.
    one = make_backend(redis_server, prefix)
    two = make_backend(redis_server, prefix)
    policy = fast(concurrency=4, delay=0.05)
    first = throttlekit.Limiter(default=policy, backend=one)
    second = throttlekit.Limiter(default=policy, backend=two)
    caplog.set_level(logging.DEBUG, logger="throttlekit.backoff")
    async with first.acquire(scopes="site") as permit:
        permit.record(status=429)  # a step (and a stored state, which grants bring)
    early, late = first.acquire(scopes="site"), second.acquire(scopes="site")
    await enter_elsewhere(early)
    await enter_elsewhere(late)
    late.record(status=429)
    await late.__aexit__(None, None, None)  # a second step
    early.record(status=429)
    await early.__aexit__(None, None, None)  # in flight before it: the same step
    steps = [record.getMessage() for record in caplog.records]
    assert len(steps) == 2, steps  # (run on the grant's state, it read as a third)
    stats = await one.scope_statistics(first, "site")
    assert stats.backoff_level == 2
    await one.aclose()
    await two.aclose()


@pytest.mark.anyio
async def test_max_stall_gives_up_on_a_scope_blocked_through_redis(
    redis_server: RedisServer, prefix: str
) -> None:
    """A 429 one process records stalls the scope for the other: its new
    requests and those already waiting raise ScopeStalled, nothing stays held."""
    one = make_backend(redis_server, prefix)
    two = make_backend(redis_server, prefix)
    policy = fast(concurrency=1, delay=0.0, max_stall=5.0)
    first = throttlekit.Limiter(default=policy, backend=one)
    second = throttlekit.Limiter(default=policy, backend=two)
    caught: list[BaseException] = []

    async def wait() -> None:
        try:
            async with second.acquire(scopes="site"):
                pass
        except throttlekit.ScopeStalled as error:
            caught.append(error)

    started = anyio.current_time()
    async with anyio.create_task_group() as tasks, first.acquire(scopes="site") as permit:
        tasks.start_soon(wait)  # waits for the slot the permit holds
        await anyio.sleep(0.2)
        permit.record(status=429, headers={"Retry-After": "3600"})
    # Retry-After is capped at the backoff's max_delay (300 s).
    assert anyio.current_time() - started < 3.0
    error = caught[0]
    assert error.scope == "site"
    assert "server asked to wait" in error.reason
    assert error.wait == pytest.approx(300.0, abs=2.0)
    with pytest.raises(throttlekit.ScopeStalled, match="max_stall of 5 s"):
        async with second.acquire(scopes="site"):
            pass
    # A short block is waited for, and a spent quota stalls too.
    async with first.acquire(scopes="short") as permit:
        permit.record(status=429, headers={"Retry-After": "0.3"})
    async with second.acquire(scopes="short"):
        pass
    second.set_policy("daily", fast(concurrency=None, delay=0.0, quota=2, window=600, max_stall=5))
    for _ in range(2):
        async with second.acquire(scopes="daily"):
            pass
    with pytest.raises(throttlekit.ScopeStalled, match="quota of 2 per 600 s") as quota:
        async with second.acquire(scopes="daily"):
            pass
    assert quota.value.wait == pytest.approx(600.0, abs=2.0)
    assert two.statistics().waiting == 0
    stats = await two.scope_statistics(second, "site")
    assert stats.in_flight == 0
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


@pytest.mark.anyio
async def test_a_success_frees_its_slot_before_its_feedback_meets_the_newer_state(
    redis_server: RedisServer,
    admin: aioredis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another process's feedback moved the state during a request: its release calls again.

    A success without rate-limit headers frees the slot on the first call
    (the waiters of other processes need not wait for the second round
    trip); a refusal frees it only once its feedback is stored, so that no
    grant comes between the refusal and what it tells.
    """
    replies: list[Any] = []
    decode = _redis_scripts.decode_release

    def spy(reply: Any) -> Any:
        replies.append(decoded := decode(reply))
        return decoded

    monkeypatch.setattr(_redis_scripts, "decode_release", spy)
    policy = fast(concurrency=2, delay=0.0, autothrottle=AutoThrottle(start_delay=0.1))
    first, other = make_backend(redis_server, prefix), make_backend(redis_server, prefix)
    mine = throttlekit.Limiter(default=policy, backend=first, seed=1)
    theirs = throttlekit.Limiter(default=policy, backend=other, seed=2)
    leases = first.scope_keys("site")[0]
    for status, latency, freed_at_once in ((200, 0.2, 1), (429, 0.3, None)):
        replies.clear()
        async with mine.acquire(scopes="site") as permit:
            async with theirs.acquire(scopes="site") as elsewhere:
                elsewhere.record(status=200, latency=latency)  # (a newer state when it ends)
            permit.record(status=status, latency=latency)
        stale, released = replies[-2:]
        assert isinstance(stale, _redis_scripts.Stale)
        assert stale.found == freed_at_once
        assert isinstance(released, _redis_scripts.Released)
        assert await admin.zcard(leases) == 0
        if status == 200:  # (its write stood on the second call)
            assert (await first.scope_statistics(mine, "site")).delay == pytest.approx(latency)
    assert "expired" not in caplog.text  # (the first call found the lease)
    await first.aclose()
    await other.aclose()


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


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_cancellation_at_any_point_leaks_nothing(
    library_server: RedisServer, library_admin: aioredis.Redis, prefix: str, client_library: str
) -> None:
    """Cancel 80 requests at random moments: waiting, in a round trip, reserved, or sending."""
    backend = make_backend(library_server, prefix, client_library=client_library)
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
    assert backend._line.idle()
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
async def test_tasks_starting_together_leave_no_idle_turns_behind(
    redis_server: RedisServer, prefix: str
) -> None:
    # Tasks that start at once used to ask Redis before any of them stood in
    # line; each was handed a turn one delay after the last, so a task asking
    # later was told to wait behind turns already served early: the scope
    # stood idle for up to tasks x delay (4 s at 4/s with 16 tasks). The tasks
    # take the two scopes in turn, so that half of them first ask with the
    # other scope's line already formed.
    delay, tasks, seconds = 0.05, 30, 2.0
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=None, delay=delay), backend=backend)
    granted: dict[str, list[float]] = {"a": [], "b": []}

    scopes = itertools.cycle(granted)

    async def task() -> None:
        for scope in scopes:
            async with limiter.acquire(scopes=scope):
                granted[scope].append(time.monotonic())

    with anyio.move_on_after(seconds):
        async with anyio.create_task_group() as group:
            for _ in range(tasks):
                group.start_soon(task)
    await backend.aclose()
    for times in granted.values():
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert max(gaps) < 4 * delay, [round(gap, 3) for gap in gaps]
        assert len(times) >= 0.8 * seconds / delay


@pytest.mark.anyio
async def test_a_release_whose_feedback_keeps_meeting_newer_state_still_frees_its_slot(
    redis_server: RedisServer, prefix: str
) -> None:
    # Three Adaptive processes against a window that answers ten requests at
    # once: a release's feedback met a newer state on every try, was dropped,
    # and the release ended there with its lease still held. Concurrency 1
    # (Adaptive's while a stated quota is spent) then stood still for the
    # lease time, 60 s, in every process. Here another writer moves the
    # scope's state whenever this controller runs.
    state_key = backend_keys(prefix, "contended")[1]
    other_writer = redis.Redis.from_url(redis_server.url)

    class Contended(throttlekit.BaseController):
        def __init__(self, policy: ScopePolicy) -> None:
            self.runs = 0

        def on_feedback(self, scope: Any, feedback: Any, now: float) -> None:
            self.runs += 1
            other_writer.hincrby(state_key, "ver", 1)

    backend = make_backend(redis_server, prefix)
    policy = fast(concurrency=1, delay=0.0, controllers=(Contended,))
    limiter = throttlekit.Limiter(default=policy, backend=backend)
    try:
        async with limiter.acquire(scopes="contended") as permit:
            permit.record(status=200)
        assert other_writer.zcard(backend_keys(prefix, "contended")[0]) == 0
        with anyio.fail_after(2.0):
            async with limiter.acquire(scopes="contended"):
                pass
    finally:
        other_writer.close()
        await backend.aclose()


class Counting(throttlekit.BaseController):
    """Counts the feedback it hears (its count is the state shared through Redis)."""

    def __init__(self, policy: ScopePolicy) -> None:
        self.heard = 0

    def on_feedback(self, scope: Any, feedback: Any, now: float) -> None:
        self.heard += 1


@pytest.mark.anyio
async def test_feedback_of_many_writers_is_kept_not_dropped(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    # Four backends (as four processes) whose tasks release at once, each
    # with feedback for the scope's controllers: the writes meet each
    # other's newer state. Eight processes against a free local server lost
    # 44 % of their feedback so ("changed under 8 tries ... dropped").
    backends = [make_backend(redis_server, prefix) for _ in range(4)]
    policy = fast(concurrency=32, delay=0.0, controllers=(Counting,))
    limiters = [throttlekit.Limiter(default=policy, backend=backend) for backend in backends]
    rounds, tasks = 25, 6

    async def task(limiter: throttlekit.Limiter) -> None:
        for _ in range(rounds):
            async with limiter.acquire(scopes="busy") as permit:
                await anyio.sleep(0.005)  # (a request to a fast server)
                permit.record(status=200)

    async with anyio.create_task_group() as group:
        for limiter in limiters:
            for _ in range(tasks):
                group.start_soon(task, limiter)
    stats = [backend.statistics() for backend in backends]
    kept = sum(each.feedback_kept for each in stats)
    assert sum(each.feedback_dropped for each in stats) == 0
    state_key = backend_keys(prefix, "busy")[1]

    async def heard() -> int:
        (count,) = [state["heard"] for _, state in json.loads(await admin.hget(state_key, "ctl"))]
        return int(count)

    assert await heard() + kept == len(backends) * tasks * rounds, (await heard(), kept)
    for backend in backends:
        await backend.aclose()  # (stores what it kept)
    assert await heard() == len(backends) * tasks * rounds


@pytest.mark.anyio
async def test_renew_and_keep_alive(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make_backend(redis_server, prefix, lease_time=0.3)
    limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="long") as permit, backend.keep_alive(permit, interval=0.1):
        await anyio.sleep(0.7)  # more than twice the lease time
        with pytest.raises(throttlekit.ThrottleTimeout):
            await enter_elsewhere(limiter.acquire(scopes="long", timeout=0.1))
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


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_password_works_and_never_leaks(
    caplog: pytest.LogCaptureFixture, client_library: str
) -> None:
    secret = "s3cr3t-Pa55word"
    server = RedisServer(password=secret)
    server.start()
    library = {"client_library": client_library}
    errors = client_errors(client_library)
    try:
        backend = RedisBackend.from_url(server.url, prefix="auth", failure="fail_closed", **library)
        limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
        async with limiter.acquire(scopes="s") as permit:
            assert not _leaks(secret, repr(permit), repr(backend), repr(limiter))
        assert not _leaks(secret, repr(backend), backend.location)
        await backend.aclose()
        # A wrong password, then a server that is gone: clear errors, no secret.
        wrong = RedisBackend.from_url(
            server.url.replace(secret, "wrong-" + secret),
            prefix="auth",
            failure="fail_closed",
            **library,
        )
        with pytest.raises((BackendUnavailable, errors.AuthenticationError)) as failed:
            await throttlekit.Limiter(backend=wrong).acquire(scopes="s").__aenter__()
        await wrong.aclose()
        server.stop()
        with caplog.at_level(logging.DEBUG):
            for failure in ("fail_closed", "fail_open"):
                gone = RedisBackend.from_url(server.url, prefix="auth", failure=failure, **library)  # type: ignore[arg-type]
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
    port = free_port()
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


async def enter_elsewhere(permit: throttlekit.Permit) -> None:
    """Enter ``permit`` in another task: in a permit the same task holds, it would nest."""
    error: Exception | None = None

    async def enter() -> None:
        nonlocal error
        try:
            await permit.__aenter__()
        except Exception as exc:
            error = exc

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(enter)
    if error is not None:
        raise error


# -- releases that do not wait, feedback in one round trip -------------------------------


@pytest.mark.anyio
async def test_a_release_without_feedback_does_not_wait_and_frees_the_slot(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    first = make_backend(redis_server, prefix)
    other = make_backend(redis_server, prefix)
    policy = fast(concurrency=1, delay=0.0)
    limiter = throttlekit.Limiter(default=policy, backend=first)
    elsewhere = throttlekit.Limiter(default=policy, backend=other)
    async with limiter.acquire(scopes="warmup"):
        pass  # the scripts loaded: only then is a release sent without waiting
    async with limiter.acquire(scopes="s"):
        pass
    assert "owed=1" in repr(first._link)  # sent; its reply is read by the next call
    # Another process gets the slot at once (its call comes after the release).
    with anyio.fail_after(1.0):
        async with elsewhere.acquire(scopes="s", timeout=1.0) as permit:
            assert permit.scopes == {"s": 1.0}
    async with limiter.acquire(scopes="s"):
        assert "owed=0" in repr(first._link)  # this acquire read the reply first
    await first.aclose()  # confirms the last release before closing
    assert "owed=0" in repr(first._link)
    assert await admin.zcard(backend_keys(prefix, "s")[0]) == 0
    assert first._calls.orphans == []
    await other.aclose()


@pytest.mark.anyio
async def test_a_release_without_feedback_goes_out_with_the_next_call(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=2, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="warmup"):
        pass  # the scripts loaded: only then is a release sent without waiting
    await anyio.lowlevel.checkpoint()  # (that release written)
    (connection,) = backend._link.link._idle
    writer = connection._writer
    writes: list[int] = []
    write, writelines = writer.write, writer.writelines

    def counted_write(data: bytes) -> None:
        writes.append(data.count(b"EVALSHA"))
        write(data)

    def counted_writelines(data: list[bytes]) -> None:
        writes.append(sum(part.count(b"EVALSHA") for part in data))
        writelines(data)

    writer.write, writer.writelines = counted_write, counted_writelines
    await admin.config_resetstat()
    for _ in range(5):  # a release, then the next acquire in the same step
        async with limiter.acquire(scopes="s"):
            pass
    assert writes == [1, 2, 2, 2, 2]  # each acquire took the release before it along
    assert "owed=1" in repr(backend._link)
    await anyio.lowlevel.checkpoint()  # the end of the step: the last one goes out alone
    assert writes == [1, 2, 2, 2, 2, 1]
    await backend.aclose()
    assert await evalsha_calls(admin) == 10
    assert await admin.zcard(backend_keys(prefix, "s")[0]) == 0
    assert backend._calls.orphans == []


@pytest.mark.anyio
async def test_a_release_without_slot_delay_or_quota_reads_no_state(
    own_redis_server: RedisServer, prefix: str
) -> None:
    admin = own_redis_server.admin()
    backend = make_backend(own_redis_server, prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=2, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="warmup"):
        pass
    await backend._link.settle()
    await admin.config_resetstat()
    for _ in range(5):
        async with limiter.acquire(scopes="s"):
            pass
    await backend.aclose()  # (confirms the last release)
    calls = {name: stats["calls"] for name, stats in (await admin.info("commandstats")).items()}
    assert calls["cmdstat_evalsha"] == 10
    # The releases, and the grants taking the process out of the scope's line...
    assert calls["cmdstat_zrem"] == 10
    assert calls["cmdstat_hmget"] == 5  # ...read no state: only the acquires do
    assert "cmdstat_hget" not in calls
    assert await admin.zcard(backend_keys(prefix, "s")[0]) == 0
    # Their script reads no policy either: the general release script was never sent.
    plain, general = _redis_args.PLAIN_RELEASE.sha, _redis_args.RELEASE.sha
    assert await admin.script_exists(plain, general) == [True, False]
    await admin.aclose()


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_a_release_lost_with_its_connection_is_handed_back(
    own_library_server: RedisServer,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    client_library: str,
) -> None:
    backend = make_backend(
        own_library_server, prefix, failure="fail_closed", client_library=client_library
    )
    limiter = throttlekit.Limiter(default=fast(concurrency=1, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="warmup"):
        pass
    async with limiter.acquire(scopes="s"):
        own_library_server.pause()  # the release is sent, but nobody reads it
        await anyio.sleep(0.1)  # (the server stopped for sure)
    own_library_server.stop()  # SIGKILL while stopped: the release never ran
    own_library_server.start()
    with caplog.at_level(logging.WARNING, logger="throttlekit.backends.redis"):
        async with limiter.acquire(scopes="s", timeout=2.0) as permit:
            assert permit.scopes == {"s": 1.0}
            # The next call found the connection broken: the release is unconfirmed.
            assert len(backend._calls.orphans) == 1
        async with limiter.acquire(scopes="s", timeout=2.0):
            pass
    assert backend._calls.orphans == []  # handed back by that acquire
    assert "could not release" in caplog.text
    assert "had expired" not in caplog.text
    await backend.aclose()


@pytest.mark.anyio
async def test_feedback_for_the_controllers_takes_one_round_trip_with_the_release(
    redis_server: RedisServer, admin: aioredis.Redis, prefix: str
) -> None:
    policy = fast(concurrency=4, delay=0.0, autothrottle=AutoThrottle(start_delay=0.0))
    backend = make_backend(redis_server, prefix)
    limiter = throttlekit.Limiter(default=policy, backend=backend)
    async with limiter.acquire(scopes="s") as permit:
        permit.record(status=200, latency=0.4)  # stores the controllers' first state
    await admin.config_resetstat()
    acquire_calls = backend.statistics().acquire_calls
    for _ in range(5):
        async with limiter.acquire(scopes="s") as permit:
            permit.record(status=200, latency=0.4)
    stats = backend.statistics()
    assert stats.release_calls == 6  # one round trip each
    assert stats.sync_calls == 0
    # (Each acquire may take two: the first finds the delay AutoThrottle set.)
    assert await evalsha_calls(admin) == stats.acquire_calls - acquire_calls + 5
    # The writes took: AutoThrottle moved the shared delay toward latency / target.
    assert (await backend.scope_statistics(limiter, "s")).delay > 0.0
    # Another process's feedback in between moves the version: the release
    # then reads the newer state and runs the controllers again on it.
    other = make_backend(redis_server, prefix)
    elsewhere = throttlekit.Limiter(default=policy, backend=other)
    async with limiter.acquire(scopes="s") as permit:
        async with elsewhere.acquire(scopes="s") as theirs:
            theirs.record(status=200, latency=0.8)  # a new delay: a new version
        permit.record(status=200, latency=0.4)
    assert backend.statistics().release_calls == 8  # one more for this release
    await backend.aclose()
    await other.aclose()


@pytest.mark.parametrize(
    ("url", "client_library", "made_with"),
    [
        ("redis://127.0.0.1:6379/0", None, "redis"),
        ("unix:///tmp/redis.sock", None, "redis"),
        pytest.param("valkey://127.0.0.1:6379/0", None, "valkey", marks=NEEDS_VALKEY),
        pytest.param("valkeys://127.0.0.1:6380/0", None, "valkey", marks=NEEDS_VALKEY),
        pytest.param("redis://127.0.0.1:6379/0", "valkey", "valkey", marks=NEEDS_VALKEY),
    ],
)
@pytest.mark.anyio
async def test_from_url_picks_the_client_library(
    url: str, client_library: str | None, made_with: str
) -> None:
    """``valkey://`` URLs (or ``client_library="valkey"``) make valkey-py's client, the
    others redis-py's (no connection is made: clients connect on their first call)."""
    for cluster in (False,) if url.startswith("unix:") else (False, True):
        backend = RedisBackend.from_url(url, client_library=client_library, cluster=cluster)  # type: ignore[arg-type]
        try:
            assert type(backend.client).__module__.split(".")[0] == made_with
            name = "Cluster" if cluster else made_with.capitalize()
            assert type(backend.client).__name__.endswith(name)
        finally:
            await backend.aclose()


def test_from_url_rejects_an_unknown_client_library() -> None:
    with pytest.raises(ValueError, match="client_library"):
        RedisBackend.from_url("redis://127.0.0.1:6379/0", client_library="keydb")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client_library"):
        RedisBackend.from_url("redis://127.0.0.1:6379/0", client_library=3)  # type: ignore[arg-type]


# -- the test servers themselves --------------------------------------------------------------


def test_a_server_whose_port_was_taken_meanwhile_starts_on_another() -> None:
    """A port picked free but taken before the server started (by another test's
    server): the first start moves to a fresh port, where the old check (the
    port answers) took the other server for its own; a restart keeps its port
    and says it is taken."""
    first = RedisServer()
    first.start()
    picks = iter([first.port])
    second = RedisServer(pick_port=lambda: next(picks, 0) or free_port())
    third = RedisServer(pick_port=lambda: second.port)
    try:
        second.start()
        assert second.port != first.port
        assert second.process is not None
        assert listens(second.process.pid, second.port)
        second.stop()
        third.start()  # (on the port ``second`` had)
        with pytest.raises(PortTaken):
            second.start()
        assert third.port == second.port
    finally:
        for server in (first, second, third):
            server.stop()
