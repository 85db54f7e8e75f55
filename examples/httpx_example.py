"""Throttle httpx: a polite multi-host crawl, an API with a shared budget, a streamed download.

Run it as ``python examples/httpx_example.py``: it crawls a few pages of
example.com, example.org and example.net from a local stand-in for the web
(``local_web.py``, no network needed) and prints when each host's requests
arrived. Every function takes an optional ``proxy``, which is how it reaches
that stand-in (and how the test suite runs it against its own local server).
"""

from __future__ import annotations

import anyio
import httpx

import throttlekit
import throttlekit.adapters.httpx
from throttlekit.adapters.httpx import ThrottledTransport


async def crawl(urls: list[str], *, proxy: str | None = None) -> dict[str, int]:
    """Fetch ``urls``: at most 2 requests per host at a time, sends 0.25 s apart per host."""
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=2, delay=0.25, slot_delay=0),
    )
    transport = ThrottledTransport(limiter, httpx.AsyncHTTPTransport(proxy=proxy, retries=1))
    statuses: dict[str, int] = {}

    async with httpx.AsyncClient(transport=transport, timeout=10) as client:

        async def fetch(url: str) -> None:
            response = await client.get(url)
            statuses[url] = response.status_code

        async with anyio.create_task_group() as tg:
            for url in urls:
                tg.start_soon(fetch, url)
    return statuses


async def search_api(queries: list[str], *, proxy: str | None = None) -> list[int]:
    """Call an API whose hosts share one budget; urgent queries jump the queue."""
    limiter = throttlekit.Limiter(
        scopes={"search-budget": throttlekit.ScopePolicy(concurrency=1, delay=0.05, slot_delay=0)},
    )
    transport = ThrottledTransport(limiter, httpx.AsyncHTTPTransport(proxy=proxy))
    statuses: list[int] = []

    async with httpx.AsyncClient(transport=transport) as client:

        async def search(region: str, query: str, urgent: bool) -> None:
            response = await client.get(
                f"http://{region}.search.example/q",
                params={"q": query},
                extensions={
                    "throttling_scopes": "search-budget",  # instead of the host
                    "throttling_priority": 10 if urgent else 0,
                },
            )
            statuses.append(response.status_code)

        async with anyio.create_task_group() as tg:
            for number, query in enumerate(queries):
                region = ("eu", "us")[number % 2]
                tg.start_soon(search, region, query, number == len(queries) - 1)
    return statuses


async def download(url: str, *, proxy: str | None = None) -> int:
    """Stream a large body; the host's slot stays taken until the response is closed."""
    limiter = throttlekit.Limiter(default=throttlekit.ScopePolicy(concurrency=1, delay=0.5))
    size = 0
    async with (
        throttlekit.adapters.httpx.client(limiter, proxy=proxy) as client,
        client.stream("GET", url) as response,
    ):
        async for chunk in response.aiter_bytes():
            size += len(chunk)
    return size


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
    anyio.run(main)
