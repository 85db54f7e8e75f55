"""A limit for a whole site, and tighter limits for some of its subdomains.

Each request gets the scope of its registrable domain *and* of each
subdomain level (:func:`throttlekit.scopes.by_domain_hierarchy`), and is
sent only when all of them allow it. ``books.toscrape.com`` may have 24
requests in flight and ``quotes.toscrape.com`` 16, but never 40 together:
``toscrape.com`` caps them at 32.
"""

from __future__ import annotations

import anyio
import httpx

from throttlekit import Limiter, ScopePolicy
from throttlekit.adapters.httpx import ThrottledTransport
from throttlekit.scopes import by_domain_hierarchy


def build_limiter() -> Limiter:
    def at_most(concurrency: int) -> ScopePolicy:
        return ScopePolicy(concurrency=concurrency, delay=0, slot_delay=0)

    return Limiter(
        resolver=by_domain_hierarchy,
        scopes={
            "toscrape.com": at_most(32),
            "books.toscrape.com": at_most(24),
            "quotes.toscrape.com": at_most(16),
        },
        default=ScopePolicy(concurrency=4, delay=0.5),  # any other site
        concurrency=None,  # no global cap: the scopes above are the limits
    )


async def crawl(urls: list[str], limiter: Limiter) -> list[int]:
    limits = httpx.Limits(max_connections=64)  # let httpx keep up with 32 in flight
    transport = ThrottledTransport(limiter, httpx.AsyncHTTPTransport(limits=limits))
    statuses: list[int] = []
    async with httpx.AsyncClient(transport=transport) as client:

        async def fetch(url: str) -> None:
            statuses.append((await client.get(url)).status_code)

        async with anyio.create_task_group() as tg:
            for url in urls:
                tg.start_soon(fetch, url)
    return statuses


URLS = [
    *(f"https://books.toscrape.com/catalogue/page-{n}.html" for n in range(1, 51)),
    *(f"https://quotes.toscrape.com/page/{n}/" for n in range(1, 11)),
]

if __name__ == "__main__":
    print(anyio.run(crawl, URLS, build_limiter()))
