"""A worker process for the Redis backend's multi-process tests.

Modes:

``crawl``
    ``--tasks`` concurrent tasks send GET requests to ``--url`` through a
    limiter whose scope ``shared`` lives in Redis, until the process is
    terminated. Each task first opens its connection with one request marked
    ``X-Warmup``; then the worker prints ``ready`` and starts on a line on
    stdin. Each request carries ``X-Worker`` (the worker's name) and
    ``X-Send-At`` (the grant's send time on Redis's clock, ms since the
    epoch); responses are recorded on the permit (so a 429 and its
    ``Retry-After`` reach the shared state).
``hold``
    Takes ``--hold`` permits of scope ``shared``, prints ``held <send times>``
    and sleeps until killed (to test that a crashed worker's leases expire).
``rampup``
    The scope ``shared`` also has ``Rampup(window=--rampup-window)``; after
    ``ready`` and a line on stdin, ``--tasks`` tasks take permits for
    ``--duration`` seconds, hold each 10 ms and record a 200; then the worker
    prints a JSON list of ``[send time, end time]`` (seconds since the epoch).
``bound``
    As ``rampup`` without the rampup, each permit held 20 ms: then the worker
    prints ``{"records": [[send time, end time]...], "calls": acquire calls,
    "grants": grants}``.

The scope's policy is concurrency ``--concurrency``, delay ``--delay``, no
slot delay and no jitter, with the default backoff.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp
import anyio

import throttlekit
from throttlekit.backends.redis import RedisBackend


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("crawl", "hold", "rampup", "bound"))
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--url", default="")
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--hold", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--lease-time", type=float, default=10.0)
    parser.add_argument("--rampup-window", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=3.0)
    return parser.parse_args(argv)


def _limiter(args: argparse.Namespace) -> tuple[throttlekit.Limiter, RedisBackend]:
    backend = RedisBackend.from_url(
        args.redis_url, prefix=args.prefix, lease_time=args.lease_time, failure="fail_closed"
    )
    rampup = throttlekit.Rampup(window=args.rampup_window) if args.mode == "rampup" else None
    policy = throttlekit.ScopePolicy(
        concurrency=args.concurrency, delay=args.delay, slot_delay=0.0, jitter=0.0, rampup=rampup
    )
    limiter = throttlekit.Limiter(scopes={"shared": policy}, backend=backend, concurrency=None)
    return limiter, backend


async def _crawl(args: argparse.Namespace) -> None:
    limiter, backend = _limiter(args)

    async def task(session: aiohttp.ClientSession) -> None:
        while True:
            async with limiter.acquire(scopes="shared") as permit:
                lease: Any = permit._lease
                headers = {"X-Worker": args.name, "X-Send-At": f"{lease.send_at_ms:.3f}"}
                async with session.get(args.url, headers=headers) as response:
                    await response.read()
                    permit.record(status=response.status, headers=response.headers)

    async def warm_up(session: aiohttp.ClientSession) -> None:
        async with session.get(args.url, headers={"X-Warmup": "1"}) as response:
            await response.read()

    try:
        async with aiohttp.ClientSession() as session:
            # Open each task's keep-alive connection and load every code path
            # first, then start together when the test says "go".
            async with anyio.create_task_group() as group:
                for _ in range(args.tasks):
                    group.start_soon(warm_up, session)
            print("ready", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            async with anyio.create_task_group() as group:
                for _ in range(args.tasks):
                    group.start_soon(task, session)
    finally:
        await backend.aclose()


async def _hold(args: argparse.Namespace) -> None:
    limiter, _backend = _limiter(args)
    permits = [limiter.acquire(scopes="shared") for _ in range(args.hold)]
    sent = []
    for permit in permits:
        # Each in a task of its own: a second permit entered by the same task
        # would nest in the first and share its slot.
        await asyncio.create_task(permit.__aenter__())
        sent.append(f"{permit._lease.send_at_ms:.3f}")
    print("held", *sent, flush=True)
    await anyio.sleep_forever()


async def _rampup(args: argparse.Namespace) -> None:
    limiter, backend = _limiter(args)
    records = await _take(args, limiter, 0.01)
    await backend.aclose()
    print(json.dumps(records), flush=True)


async def _bound(args: argparse.Namespace) -> None:
    limiter, backend = _limiter(args)
    records = await _take(args, limiter, 0.02)
    stats = backend.statistics()
    await backend.aclose()
    # (Not counting the warm-up's call and grant.)
    output = {"records": records, "calls": stats.acquire_calls - 1, "grants": stats.grants - 1}
    print(json.dumps(output), flush=True)


async def _take(
    args: argparse.Namespace, limiter: throttlekit.Limiter, hold: float
) -> list[tuple[float, float]]:
    """After ``ready`` and a line on stdin, ``--tasks`` tasks take permits for ``--duration`` s.

    Each is held ``hold`` seconds and records a 200; returns ``[send, end]`` of each.
    """
    async with limiter.acquire(scopes="warm-up"):
        pass
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)
    end = time.time() + args.duration
    records: list[tuple[float, float]] = []

    async def task() -> None:
        while time.time() < end:
            async with limiter.acquire(scopes="shared") as permit:
                lease: Any = permit._lease
                await anyio.sleep(hold)
                permit.record(status=200)
                records.append((lease.send_at_ms / 1000.0, time.time()))

    async with anyio.create_task_group() as group:
        for _ in range(args.tasks):
            group.start_soon(task)
    return records


def main(argv: list[str] | None = None) -> None:
    args = _parse(sys.argv[1:] if argv is None else argv)
    modes = {"crawl": _crawl, "hold": _hold, "rampup": _rampup, "bound": _bound}
    asyncio.run(modes[args.mode](args))


if __name__ == "__main__":
    main()
