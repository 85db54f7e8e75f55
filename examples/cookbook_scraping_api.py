"""Throttle a web scraping API and, through it, each site it fetches for you.

A request like ``https://api.scraper.example/?url=https://books.toscrape.com/``
belongs to two scopes: the API's own (``api.scraper.example``: how hard we
may push the API) and the target site's (``books.toscrape.com``: how hard the
API may push the site on our behalf).

The API answers 200 when it could reach the site, and puts the site's own
status in an ``X-Upstream-Status-Code`` header. :meth:`Permit.record` hands
the same feedback to every scope of a request, so each scope's controllers
pick the signal meant for them:

* the API scope keeps the built-in :class:`~throttlekit.Backoff`, which reads
  the API's status (its own 429s and 503s) and its ``Retry-After``;
* the target-site scopes have no built-in backoff but an
  :class:`UpstreamBackoff`, which reads only the upstream status header.

So a site that rate-limits the API slows down requests for that site only,
and an overloaded API slows down everything that goes through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx

from throttlekit import BaseController, Feedback, Limiter, ScopePolicy, ScopeView
from throttlekit.adapters.httpx import ThrottledTransport
from throttlekit.scopes import ScopeCosts, add_scope, by_host, request_url

API = "api.scraper.example"
UPSTREAM_STATUS = "X-Upstream-Status-Code"
OVERLOADED = frozenset({429, 502, 503, 504, 520, 521, 522, 523, 524})


def resolver(request: Any) -> ScopeCosts | str:
    """The host's scope, plus the target site's scope for API requests."""
    host = by_host(request)
    if host != API:
        return host
    target = parse_qs(urlsplit(request_url(request)).query).get("url")
    return add_scope(host, by_host(target[0])) if target else host


def upstream_status(headers: Mapping[str, Any] | Any) -> int | None:
    """The target site's status from the API's response headers, if it says."""
    try:
        value = headers.get(UPSTREAM_STATUS)
    except AttributeError:  # no headers (the request failed)
        return None
    if isinstance(value, bytes):  # Scrapy's headers are bytes
        value = value.decode("latin-1")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class UpstreamBackoff(BaseController):
    """Exponential backoff of a target-site scope, driven by the upstream status header.

    Each upstream 429/5xx doubles the scope's delay (starting at
    ``min_delay``, at most ``max_delay``); while it backs off, responses to
    requests that were already in flight at the last increase count as that
    same increase.
    After ``window`` quiet seconds the delay halves, and below ``min_delay``
    it goes back to the policy's.
    """

    def __init__(
        self,
        policy: ScopePolicy,
        *,
        min_delay: float = 1.0,
        max_delay: float = 300.0,
        window: float = 60.0,
    ) -> None:
        self.min_delay, self.max_delay, self.window = min_delay, max_delay, window
        self.delay = 0.0  # seconds between sends asked for; 0 = no opinion
        self.last_signal = -math.inf  # when the last upstream 429/5xx arrived
        self.raised_at = -math.inf  # when the delay was last increased
        self.moved_at = -math.inf  # when the delay last changed

    def on_send(self, scope: ScopeView, now: float) -> bool:
        if self.delay and now - max(self.last_signal, self.moved_at) >= self.window:
            halved = self.delay / 2
            self.delay = halved if halved >= self.min_delay else 0.0
            self.moved_at = now
            return True  # the delay changed: the scope recomputes its limits
        return False

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        if upstream_status(feedback.headers) not in OVERLOADED:
            return
        self.last_signal = now
        sent_at = feedback.sent_at
        if self.delay and sent_at is not None and sent_at <= self.raised_at:
            return  # in flight before the last increase: part of that one
        self.delay = min(self.max_delay, max(self.min_delay, 2 * self.delay))
        self.raised_at = self.moved_at = now


def build_limiter(*, min_delay: float = 1.0, window: float = 60.0) -> Limiter:
    def upstream_backoff(policy: ScopePolicy) -> UpstreamBackoff:
        return UpstreamBackoff(policy, min_delay=min_delay, window=window)

    return Limiter(
        resolver=resolver,
        scopes={API: ScopePolicy(concurrency=50, delay=0, slot_delay=0)},  # Backoff() on
        # Every target site: 4 requests at a time through the API, no fixed delay,
        # slowed down only by what the site answered the API.
        default=ScopePolicy(
            concurrency=4, delay=0, slot_delay=0, backoff=None, controllers=[upstream_backoff]
        ),
        concurrency=None,
    )


async def scrape(targets: list[str], limiter: Limiter) -> dict[str, int | None]:
    """Fetch each target URL through the API; return the upstream status of each."""
    results: dict[str, int | None] = {}
    async with httpx.AsyncClient(transport=ThrottledTransport(limiter)) as client:

        async def fetch(target: str) -> None:
            response = await client.get(f"https://{API}/", params={"url": target})
            results[target] = upstream_status(response.headers)

        async with anyio.create_task_group() as tg:
            for target in targets:
                tg.start_soon(fetch, target)
    return results


TARGETS = [f"https://books.toscrape.com/catalogue/page-{n}.html" for n in range(1, 6)]

if __name__ == "__main__":
    print(anyio.run(scrape, TARGETS, build_limiter()))
