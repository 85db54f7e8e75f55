"""Throttle the endpoints of one API separately, as if they were different sites.

Requests to ``api.toscrape.com`` get one scope per path
(:func:`throttlekit.scopes.by_endpoint`); everything else keeps one scope
per host. The fast endpoint allows 8 requests at a time, 0.02 s apart; the
slow one, one request every 0.5 s. They share nothing, so a queue on the slow
endpoint never holds back the fast one.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from throttlekit import Limiter, ScopePolicy
from throttlekit.adapters.httpx import ThrottledTransport
from throttlekit.scopes import by_endpoint, by_host

API = "api.toscrape.com"


def resolver(request: Any) -> str:
    host = by_host(request)
    return by_endpoint(request) if host == API else host


def build_limiter() -> Limiter:
    return Limiter(
        resolver=resolver,
        scopes={
            f"{API}/fast-endpoint": ScopePolicy(concurrency=8, delay=0.02, slot_delay=0),
            f"{API}/slow-endpoint": ScopePolicy(concurrency=1, delay=0.5, slot_delay=0),
        },
    )


async def call(urls: list[str], limiter: Limiter) -> list[int]:
    statuses: list[int] = []
    async with httpx.AsyncClient(transport=ThrottledTransport(limiter)) as client:

        async def fetch(url: str) -> None:
            statuses.append((await client.get(url)).status_code)

        async with anyio.create_task_group() as tg:
            for url in urls:
                tg.start_soon(fetch, url)
    return statuses


URLS = [
    *(f"https://{API}/slow-endpoint?page={n}" for n in range(3)),
    *(f"https://{API}/fast-endpoint?page={n}" for n in range(20)),
]

if __name__ == "__main__":
    print(anyio.run(call, URLS, build_limiter()))
