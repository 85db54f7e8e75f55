"""Throttle aiohttp: a polite multi-host crawl, and an API with a shared budget.

Run it as ``python examples/aiohttp_example.py``: it crawls a few pages of
example.com, example.org and example.net from a local stand-in for the web
(``local_web.py``, no network needed) and prints when each host's requests
arrived. Every function takes an optional ``proxy``, which is how it reaches
that stand-in (and how the test suite runs it against its own local server).
"""

from __future__ import annotations

import asyncio

import aiohttp

import throttlekit
from throttlekit.adapters.aiohttp import middleware, throttling


async def crawl(urls: list[str], *, proxy: str | None = None) -> dict[str, int]:
    """Fetch ``urls``: at most 2 requests per host at a time, sends 0.25 s apart per host."""
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=2, delay=0.25, slot_delay=0),
    )
    statuses: dict[str, int] = {}

    async with aiohttp.ClientSession(proxy=proxy, middlewares=(middleware(limiter),)) as session:

        async def fetch(url: str) -> None:
            async with session.get(url) as response:
                await response.read()
                statuses[url] = response.status

        await asyncio.gather(*(fetch(url) for url in urls))
    return statuses


async def search_api(queries: list[str], *, proxy: str | None = None) -> list[int]:
    """Call an API whose hosts share one budget; urgent queries jump the queue."""
    limiter = throttlekit.Limiter(
        scopes={"search-budget": throttlekit.ScopePolicy(concurrency=1, delay=0.05, slot_delay=0)},
    )
    statuses: list[int] = []

    async with aiohttp.ClientSession(proxy=proxy, middlewares=(middleware(limiter),)) as session:

        async def search(region: str, query: str, urgent: bool) -> None:
            with throttling(scopes="search-budget", priority=10 if urgent else 0):
                url = f"http://{region}.search.example/q"
                async with session.get(url, params={"q": query}) as response:
                    await response.read()
                    statuses.append(response.status)

        await asyncio.gather(
            *(
                search(("eu", "us")[number % 2], query, number == len(queries) - 1)
                for number, query in enumerate(queries)
            )
        )
    return statuses


async def main() -> None:
    from local_web import LocalWeb

    with LocalWeb() as web:  # answers http:// URLs of any host, locally
        hosts = ("example.com", "example.org", "example.net")
        urls = [f"http://{host}/page/{n}" for host in hosts for n in range(4)]
        statuses = await crawl(urls, proxy=web.proxy)
        print(f"{len(statuses)} pages, statuses {sorted(set(statuses.values()))}")
        print("2 at a time per host, sends 0.25 s apart per host, hosts in parallel:")
        print(web.report())


if __name__ == "__main__":
    asyncio.run(main())
