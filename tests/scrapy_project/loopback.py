"""What a real Scrapy crawl of local virtual hosts needs (imported by ``run_crawl.py``).

* :class:`LoopbackResolver` resolves every ``*.test`` host name to 127.0.0.1,
  so ``http://a.test:<port>/`` and ``http://b.test:<port>/`` reach the same
  local server with different ``Host`` headers, and Scrapy gives them
  different download slots and throttlekit different scopes.
* :class:`PlanSpider` requests exactly the URLs of its plan and records what
  came back and when.
* :class:`BounceMiddleware` and :class:`IgnoreMiddleware` misbehave after the
  throttling middleware, to check that no permit leaks;
  :class:`AnswerMiddleware` answers requests without downloading them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import scrapy
from scrapy.exceptions import IgnoreRequest
from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer
from twisted.python.failure import Failure


class LoopbackResolver(CachingThreadedResolver):
    """Scrapy's default resolver, except that ``*.test`` names are 127.0.0.1."""

    def getHostByName(self, name: str, timeout: Any = ()) -> Any:
        if name.endswith(".test"):
            return defer.succeed("127.0.0.1")
        return super().getHostByName(name, timeout)


class PlanSpider(scrapy.Spider):
    """Requests the URLs of ``plan`` (dicts with url, priority, meta) and records the outcome."""

    name = "plan"

    def __init__(self, plan: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.outcomes: list[dict[str, Any]] = []

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for entry in self.plan:
            yield scrapy.Request(
                entry["url"],
                priority=entry.get("priority", 0),
                meta=dict(entry.get("meta", {})),
                dont_filter=True,
                callback=self.parse,
                errback=self.failed,
            )

    def parse(self, response: scrapy.http.Response) -> None:
        self.outcomes.append(
            {
                "url": response.url,
                "status": response.status,
                "flags": list(response.flags),
                "at": time.monotonic(),
            }
        )

    def failed(self, failure: Failure) -> None:
        request = getattr(failure, "request", None)
        self.outcomes.append(
            {
                "url": request.url if request is not None else None,
                "exception": f"{type(failure.value).__module__}.{type(failure.value).__name__}",
                "at": time.monotonic(),
            }
        )


class BounceMiddleware:
    """Answers a request that has ``meta["bounce"]`` with a new request (a copy without it).

    Ordered after the throttling middleware, that hands the download back to
    the engine without ``process_response``: the permit must not leak.
    """

    def process_request(
        self, request: scrapy.Request, spider: Any = None
    ) -> scrapy.Request | None:  # (Scrapy < 2.14 passes the spider)
        if request.meta.get("bounce"):
            meta = {key: value for key, value in request.meta.items() if key != "bounce"}
            return request.replace(meta=meta, dont_filter=True)
        return None


class IgnoreMiddleware:
    """Drops a request that has ``meta["ignore"]`` after the throttling middleware."""

    def process_request(self, request: scrapy.Request, spider: Any = None) -> None:
        if request.meta.get("ignore"):
            raise IgnoreRequest("ignored after throttling")


class AnswerMiddleware:
    """Answers a request that has ``meta["answer"]`` itself, without downloading it.

    Ordered after the throttling middleware, its responses were never timed
    (no ``download_latency``): AutoThrottle must not learn from them.
    """

    def process_request(self, request: scrapy.Request, spider: Any = None) -> Any:
        if request.meta.get("answer"):
            return scrapy.http.HtmlResponse(request.url, body=b"answered", request=request)
        return None
