"""The Redis backend when Redis fails: restarts, SIGSTOP, SIGKILL, and crashed workers.

Each test has a redis-server of its own that it stops (SIGSTOP: connections
stay open but nothing is answered), resumes, kills (SIGKILL) and restarts.
What must hold whatever Redis does: ``acquire(timeout=...)`` returns within
its timeout plus 0.5 s; failing open, a process never exceeds a scope's
policy; failing closed, ``BackendUnavailable`` comes within
``command_timeout``; no other exception escapes, nothing hangs; a crashed
worker's slots come back when its leases expire.
"""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
import pytest
from _redis import NEEDS_VALKEY, RedisServer, fast, make_backend, read_line, worker_command

import throttlekit
from throttlekit import BackendUnavailable
from throttlekit.backends._redis_leases import LocalLease
from throttlekit.backends._redis_link import Deadlines

pytestmark = pytest.mark.redis


@pytest.fixture
def anyio_backend() -> str:
    """The backend runs on asyncio only (redis.asyncio)."""
    return "asyncio"


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


@pytest.mark.slow
@pytest.mark.anyio
async def test_killed_worker_slots_come_back_after_lease_time(
    redis_server: RedisServer, prefix: str
) -> None:
    lease_time = 1.0
    process = await anyio.open_process(
        worker_command("hold", redis_server, prefix, "--lease-time", str(lease_time), "--hold", "3")
    )
    try:
        line = await read_line(process, 20.0)
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


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["fail_open", "fail_closed"])
@pytest.mark.anyio
async def test_redis_stopped_then_killed_during_a_run(
    own_redis_server: RedisServer, prefix: str, failure: str
) -> None:
    """Six tasks on a scope of concurrency 3 while Redis hangs, comes back, dies and restarts."""
    server = own_redis_server
    concurrency, timeout = 3, 0.5
    backend = make_backend(server, prefix, failure=failure, reconnect_interval=0.2)
    limiter = throttlekit.Limiter(
        default=fast(concurrency=concurrency, delay=0.01), backend=backend, concurrency=None
    )
    phase = "up"
    in_flight = most = 0
    outcomes: list[tuple[str, str, float]] = []  # (phase at the start, outcome, seconds taken)

    async def task() -> None:
        nonlocal in_flight, most
        while phase != "done":
            began, started = phase, time.monotonic()
            try:
                async with limiter.acquire(scopes="s", timeout=timeout) as permit:
                    where = "local" if isinstance(permit._lease, LocalLease) else "redis"
                    outcomes.append((began, where, time.monotonic() - started))
                    in_flight += 1
                    most = max(most, in_flight)
                    try:
                        await anyio.sleep(0.03)
                        permit.record(status=200)
                    finally:
                        in_flight -= 1
            except throttlekit.ThrottleTimeout:
                outcomes.append((began, "timeout", time.monotonic() - started))
            except BackendUnavailable:
                outcomes.append((began, "unavailable", time.monotonic() - started))
                await anyio.sleep(0.05)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for _ in range(6):
                group.start_soon(task)
            for action, name, seconds in [
                (None, "up", 0.5),
                (server.pause, "stopped", 2.0),
                (server.resume, "resumed", 1.0),
                (server.kill, "killed", 1.0),
                (server.start, "restarted", 1.5),
            ]:
                if action is not None:
                    action()
                phase = name
                await anyio.sleep(seconds)
            phase = "done"
    seen = {(began, outcome) for began, outcome, _ in outcomes}
    slowest = max(seconds for _, _, seconds in outcomes)
    assert slowest <= timeout + 0.5, sorted(outcomes, key=lambda o: -o[2])[:5]
    assert most <= concurrency  # within this process, whatever Redis did
    for began in ("up", "resumed", "restarted"):
        assert (began, "redis") in seen, began  # shared throttling, and back after each outage
    if failure == "fail_open":
        assert ("stopped", "local") in seen
        assert ("killed", "local") in seen
        assert not any(outcome == "unavailable" for _, outcome, _ in outcomes)
    else:
        assert ("stopped", "unavailable") in seen
        assert ("killed", "unavailable") in seen
        assert not any(outcome == "local" for _, outcome, _ in outcomes)
    assert backend._calls.orphans == []  # grants whose reply was lost went back
    await backend.aclose()


@pytest.mark.parametrize(
    ("failure", "client_library"),
    [
        ("fail_open", "redis"),
        ("fail_closed", "redis"),
        pytest.param("fail_closed", "valkey", marks=NEEDS_VALKEY),
    ],
)
@pytest.mark.anyio
async def test_timeout_holds_while_redis_hangs(
    own_library_server: RedisServer,
    prefix: str,
    failure: str,
    client_library: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = make_backend(
        own_library_server, prefix, failure=failure, client_library=client_library
    )
    limiter = throttlekit.Limiter(default=fast(concurrency=3, delay=0.0), backend=backend)
    async with limiter.acquire(scopes="s"):
        pass  # connected, scripts loaded
    own_library_server.pause()
    messages: list[str] = []
    try:
        for timeout in (0.0, 0.3, 0.8, None):
            started = time.monotonic()
            with caplog.at_level(logging.WARNING):
                try:
                    async with limiter.acquire(scopes="s", timeout=timeout) as permit:
                        assert failure == "fail_open"
                        assert isinstance(permit._lease, LocalLease)
                except BackendUnavailable as exc:
                    messages.append(str(exc))
            bound = backend.command_timeout if timeout is None else timeout
            # A quarter second less than the 1 s command timeout a call that
            # ignored its own would wait (a loaded CI machine took 0.62 s at 0).
            assert time.monotonic() - started <= bound + 0.75, timeout
    finally:
        own_library_server.resume()
    if failure == "fail_closed":
        assert len(messages) == 4
        assert all("no reply in time" in message for message in messages)
    await backend.aclose()


@pytest.mark.anyio
async def test_round_trip_bounds_share_one_timer() -> None:
    deadlines = Deadlines()
    never = anyio.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await deadlines.bounded(never.wait(), 0.2)
    assert 0.15 <= time.monotonic() - started < 1.0

    async def reply_after(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "reply"

    results: dict[str, str] = {}

    async def call(name: str, bound: float) -> None:
        try:
            results[name] = await deadlines.bounded(reply_after(0.3), bound)
        except TimeoutError:
            results[name] = "timeout"

    # A shorter bound given after a longer one still ends its call in time.
    async with anyio.create_task_group() as group:
        group.start_soon(call, "long", 1.0)
        await anyio.sleep(0.01)
        group.start_soon(call, "short", 0.1)
    assert results == {"long": "reply", "short": "timeout"}
    # A cancellation from elsewhere stays a cancellation.
    with anyio.move_on_after(0.1) as scope:
        await deadlines.bounded(never.wait(), 5.0)
    assert scope.cancelled_caught
    assert "calls=0" in repr(deadlines)


def test_round_trip_bounds_hold_on_another_event_loop() -> None:
    deadlines = Deadlines()

    async def hang(seconds: float) -> None:
        await deadlines.bounded(asyncio.sleep(seconds), 0.2)

    asyncio.run(hang(0.0))  # its loop ends with the timer still set for later
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(hang(5.0))
    assert time.monotonic() - started < 1.0
