"""Share one politeness budget between crawler processes through Redis.

Start this script in as many processes (or machines) as you like, all with
the same Redis URL and prefix: together they send at most 2 requests at a
time to each host, 0.25 s apart, and a 429 that one of them gets slows all
of them down. Needs ``pip install "throttlekit-http[redis]"`` and a Redis server.

    python examples/cookbook_redis.py redis://127.0.0.1:6379/0 0 2   # worker 0 of 2
    python examples/cookbook_redis.py redis://127.0.0.1:6379/0 1 2   # worker 1 of 2
"""

from __future__ import annotations

import sys

import anyio
import httpx

from throttlekit import Limiter, ScopePolicy
from throttlekit.adapters.httpx import ThrottledTransport
from throttlekit.backends.redis import RedisBackend


async def worker(urls: list[str], redis_url: str, prefix: str = "books-crawl") -> list[int]:
    """Fetch ``urls`` under the budget that every worker with this ``prefix`` shares."""
    backend = RedisBackend.from_url(redis_url, prefix=prefix)
    limiter = Limiter(default=ScopePolicy(concurrency=2, delay=0.25, slot_delay=0), backend=backend)
    statuses: list[int] = []
    try:
        async with httpx.AsyncClient(transport=ThrottledTransport(limiter)) as client:

            async def fetch(url: str) -> None:
                statuses.append((await client.get(url)).status_code)

            async with anyio.create_task_group() as tg:
                for url in urls:
                    tg.start_soon(fetch, url)
    finally:
        await backend.aclose()
    return statuses


def my_share(index: int, workers: int) -> list[str]:
    """This worker's part of the crawl (in real life, a shared queue hands out URLs)."""
    pages = [f"https://books.toscrape.com/catalogue/page-{n}.html" for n in range(1, 21)]
    return pages[index::workers]


if __name__ == "__main__":
    redis_url, index, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(anyio.run(worker, my_share(index, workers), redis_url))
