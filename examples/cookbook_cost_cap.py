"""Cap what an API costs per minute, when each call costs a different amount.

Every call to ``api.toscrape.com`` also takes an *estimated* cost from the
``api-spend`` scope, whose quota is the budget per window. The API reports
what the call really cost in an ``X-Actual-Cost`` header; recording it with
``consumed=`` corrects the window, so the budget is spent on what was really
charged, not on the estimates.

The adapters record responses themselves and do not take ``consumed=``, so
this recipe holds the permit directly around a plain httpx client.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx

from throttlekit import Limiter, ScopePolicy
from throttlekit.scopes import ScopeCosts, add_scope, by_host, request_url

API = "api.toscrape.com"
SPEND = "api-spend"


def estimate_cost(url: str) -> float:
    """What a call will probably cost: browser rendering is the expensive part."""
    query = parse_qs(urlsplit(url).query)
    return 5.0 if query.get("render") == ["1"] else 1.0


def resolver(request: Any) -> ScopeCosts | str:
    host = by_host(request)
    if host != API:
        return host
    return add_scope(host, SPEND, estimate_cost(request_url(request)))


def build_limiter(budget: float = 100.0, window: float = 60.0) -> Limiter:
    return Limiter(
        resolver=resolver,
        scopes={
            API: ScopePolicy(concurrency=8, delay=0, slot_delay=0),
            SPEND: ScopePolicy(
                concurrency=None, delay=0, slot_delay=0, quota=budget, window=window
            ),
        },
    )


async def fetch_all(urls: list[str], limiter: Limiter) -> float:
    """Fetch ``urls`` within the budget; return what they cost in total."""
    spent = 0.0
    async with httpx.AsyncClient() as client:

        async def fetch(url: str) -> None:
            nonlocal spent
            async with limiter.acquire(url) as permit:
                response = await client.get(url)
                charged = response.headers.get("X-Actual-Cost")
                if charged is not None and SPEND in permit.scopes:
                    permit.record(response, consumed={SPEND: float(charged)})
                    spent += float(charged)
                else:
                    permit.record(response)

        async with anyio.create_task_group() as tg:
            for url in urls:
                tg.start_soon(fetch, url)
    return spent


URLS = [f"https://{API}/extract?url=https://books.toscrape.com/&render={n % 2}" for n in range(10)]

if __name__ == "__main__":
    print(anyio.run(fetch_all, URLS, build_limiter()))
