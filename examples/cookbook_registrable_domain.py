"""Throttle all the subdomains of a site together: one scope per registrable domain.

``books.toscrape.com`` and ``quotes.toscrape.com`` share the scope
``toscrape.com``, so together they get 2 requests at a time, 0.25 s apart.
"""

from __future__ import annotations

import anyio
import httpx

from throttlekit import Limiter, ScopePolicy
from throttlekit.adapters.httpx import ThrottledTransport
from throttlekit.scopes import by_registrable_domain


def build_limiter() -> Limiter:
    return Limiter(
        resolver=by_registrable_domain,
        default=ScopePolicy(concurrency=2, delay=0.25, slot_delay=0),
    )


async def crawl(urls: list[str], limiter: Limiter) -> dict[str, int]:
    """Fetch ``urls`` concurrently; the limiter decides when each one goes out."""
    statuses: dict[str, int] = {}
    async with httpx.AsyncClient(transport=ThrottledTransport(limiter)) as client:

        async def fetch(url: str) -> None:
            statuses[url] = (await client.get(url)).status_code

        async with anyio.create_task_group() as tg:
            for url in urls:
                tg.start_soon(fetch, url)
    return statuses


URLS = [
    *(f"https://books.toscrape.com/catalogue/page-{n}.html" for n in range(1, 4)),
    *(f"https://quotes.toscrape.com/page/{n}/" for n in range(1, 4)),
]

if __name__ == "__main__":
    print(anyio.run(crawl, URLS, build_limiter()))
