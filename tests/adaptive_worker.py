"""A worker process for the multi-process Adaptive test: one scope shared through Redis.

``--tasks`` tasks send GET requests to ``--url`` through a limiter whose scope
``shared`` (``ScopePolicy(concurrency=16, delay=0, adaptive=Adaptive())``)
lives in Redis, recording every response on its permit. The worker prints
``ready``, starts on a line on stdin, runs for ``--duration`` seconds and
prints ``done``. With ``--log FILE`` Adaptive's decisions (its DEBUG log)
go to that file, each line after the wall-clock time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import aiohttp
import anyio

import throttlekit
from throttlekit.backends.redis import RedisBackend


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--log", help="write Adaptive's decisions to this file")
    args = parser.parse_args(argv)
    if args.log:
        handler = logging.FileHandler(args.log)
        handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))
        decisions = logging.getLogger("throttlekit.adaptive")
        decisions.addHandler(handler)
        decisions.setLevel(logging.DEBUG)
    backend = RedisBackend.from_url(args.redis_url, prefix=args.prefix, failure="fail_closed")
    policy = throttlekit.ScopePolicy(concurrency=16, delay=0, adaptive=throttlekit.Adaptive())
    limiter = throttlekit.Limiter(scopes={"shared": policy}, backend=backend, concurrency=None)

    async def task(session: aiohttp.ClientSession) -> None:
        while True:
            async with limiter.acquire(scopes="shared") as permit:
                headers = {"X-Worker": args.name}
                async with session.get(args.url, headers=headers) as response:
                    await response.read()
                    permit.record(response)

    async with aiohttp.ClientSession() as session:
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        with anyio.move_on_after(args.duration):
            async with anyio.create_task_group() as group:
                for _ in range(args.tasks):
                    group.start_soon(task, session)
    await backend.aclose()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
