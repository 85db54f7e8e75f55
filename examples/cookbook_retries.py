"""Retries with the libraries you already use, each attempt through the limiter.

throttlekit paces; retrying belongs to the client. Put the retry layer
*outside* the throttled one, so that every attempt waits for a permit: a
429's Retry-After blocks the scope, and the retry is sent when it reopens --
the wait is honoured once, whether or not the retry library waits too.
"""

from __future__ import annotations

import aiohttp
import aiohttp_retry
import httpx
import httpx_retries
import stamina

import throttlekit
from throttlekit.adapters.aiohttp import middleware
from throttlekit.adapters.httpx import ThrottledTransport


def build_limiter() -> throttlekit.Limiter:
    return throttlekit.Limiter(default=throttlekit.ScopePolicy(concurrency=2, delay=0.1))


async def with_httpx_retries(
    limiter: throttlekit.Limiter, url: str, transport: httpx.AsyncBaseTransport | None = None
) -> int:
    """httpx-retries: RetryTransport around ThrottledTransport."""
    retrying = httpx_retries.RetryTransport(
        transport=ThrottledTransport(limiter, transport),
        retry=httpx_retries.Retry(total=3, backoff_factor=0.1),
    )
    async with httpx.AsyncClient(transport=retrying) as client:
        response = await client.get(url)
    return response.status_code


async def with_stamina(
    limiter: throttlekit.Limiter, url: str, transport: httpx.AsyncBaseTransport | None = None
) -> int:
    """stamina (or tenacity): retry the call; the transport throttles each attempt."""
    async with httpx.AsyncClient(transport=ThrottledTransport(limiter, transport)) as client:

        @stamina.retry(on=httpx.HTTPStatusError, attempts=3, wait_initial=0.05)
        async def get() -> httpx.Response:
            response = await client.get(url)
            return response.raise_for_status()

        return (await get()).status_code


async def with_aiohttp_retry(
    limiter: throttlekit.Limiter, url: str, proxy: str | None = None
) -> int:
    """aiohttp-retry: RetryClient over a session with the throttling middleware."""
    session = aiohttp.ClientSession(middlewares=(middleware(limiter),), proxy=proxy)
    options = aiohttp_retry.ExponentialRetry(attempts=3, start_timeout=0.05, statuses={429})
    client = aiohttp_retry.RetryClient(client_session=session, retry_options=options)
    async with client, client.get(url) as response:
        return response.status
