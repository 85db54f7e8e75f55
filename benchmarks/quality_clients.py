"""The crawling clients of the throttling-quality suite, one run per process.

Usage: ``python -m benchmarks.quality_clients plan.json result.json``

``plan.json`` says which client to run and against what:

* ``client``: ``"scrapy"`` (a real Scrapy crawl on the asyncio reactor, with
  whatever settings the plan gives: Scrapy's AutoThrottle, or throttlekit's
  middleware), ``"httpx"`` (``httpx.AsyncClient`` over throttlekit's
  :class:`~throttlekit.adapters.httpx.ThrottledTransport`, the limiter's
  default policy built from ``policy``), ``"paced"`` (a plain
  ``httpx.AsyncClient`` sending evenly at each site's ``rate`` per second, or
  keeping its ``workers`` requests in flight: the oracle that knows the
  limit) or ``"baseline"`` (a plain
  ``httpx.AsyncClient`` sending one request at a time, no throttling: the
  sites' latency unloaded);
* ``settings`` (Scrapy): Scrapy settings;
* ``policy`` (httpx): the :class:`~throttlekit.ScopePolicy` keywords, where a
  controller (``backoff``, ``autothrottle``, ``adaptive``...) is given as the
  dict of its own keywords: ``{"concurrency": 16, "autothrottle": {}}`` is
  ``ScopePolicy(concurrency=16, autothrottle=AutoThrottle())``;
* ``sites``: ``[{"name", "url", "count"}]``; the request list is
  ``<url>/page/<i>`` for ``i < count``, the sites interleaved;
* ``budget`` and ``margin``: the client crawls for ``budget + margin``
  seconds once its crawl starts (the suite counts what the site saw in
  the ``budget`` seconds after the first request reached it);
* ``workers`` (httpx): tasks sending requests; ``sample_interval``: seconds
  between samples of the throttling state (delay per site);
* ``redis`` (httpx): ``{"url", "prefix"}``: the limiter keeps its scopes in
  that Redis (:class:`~throttlekit.backends.redis.RedisBackend`, failing
  closed), shared with every process given the same ones; the samples and
  the final state are then the shared state read from Redis;
* ``ready`` and ``go`` (httpx): paths; once set up, the client creates
  ``ready`` and starts crawling when ``go`` exists (so that several
  processes start together);
* ``decisions`` (httpx): a path where throttlekit's DEBUG log (the
  controllers' decisions, with their reasons) goes, each line stamped with
  the epoch time;
* ``samples`` (baseline): the 200 responses per site after which it stops;
  ``settle`` (baseline): seconds to wait before the first request, while
  the other clients started with it load their modules.

``result.json`` gets the client's own view: when it started and stopped,
its CPU time while crawling, responses per status, the throttling state
sampled over time, Scrapy's stats or the limiter's final statistics. The
suite's numbers come from the site's records, not from here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["CONTROLLERS", "main", "policy_from_plan", "request_list"]

#: The ScopePolicy fields that hold a controller, and the throttlekit class of each.
CONTROLLERS = {
    "backoff": "Backoff",
    "autothrottle": "AutoThrottle",
    "rampup": "Rampup",
    "adaptive": "Adaptive",
}

#: Requests Scrapy's scheduler holds at most, waiting to enter the downloader.
BACKLOG = 200


def request_list(sites: list[dict[str, Any]]) -> Iterator[str]:
    """The URLs of a plan: ``<url>/page/<i>``, one site after the other for each ``i``."""
    longest = max((site["count"] for site in sites), default=0)
    for index in range(longest):
        for site in sites:
            if index < site["count"]:
                yield f"{site['url']}/page/{index}"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def policy_from_plan(spec: dict[str, Any]) -> Any:
    """The :class:`~throttlekit.ScopePolicy` of a plan's ``policy`` (see the module doc)."""
    import throttlekit

    fields = dict(spec)
    for name, class_name in CONTROLLERS.items():
        options = fields.get(name)
        if isinstance(options, dict):
            fields[name] = getattr(throttlekit, class_name)(**options)
    return throttlekit.ScopePolicy(**fields)


def _sample(now: float, name: str, scope: Any) -> dict[str, Any]:
    """One sample of a throttlekit scope's state."""
    return {
        "t": now,
        "scope": name,
        "delay": scope.delay,
        "concurrency": scope.concurrency,
        "in_flight": scope.in_flight,
        "backoff_level": getattr(scope, "backoff_level", None),
        "reason": getattr(scope, "reason", None),
    }


# -- Scrapy ------------------------------------------------------------------------------


def run_scrapy(plan: dict[str, Any], output: Path) -> None:
    """Crawl, write the result to ``output`` and end the process at the budget.

    The end is abrupt (``os._exit``) on purpose: Scrapy's graceful close
    first waits for every request already in the downloader, including those
    waiting for a throttling permit, which can take minutes on a backed-off
    site. The site's records, not the client's, are what the suite measures.
    """
    import scrapy
    from scrapy import signals
    from scrapy.crawler import CrawlerProcess

    budget = float(plan["budget"])
    margin = float(plan.get("margin", 2.0))
    interval = float(plan.get("sample_interval", 0.5))
    settings: dict[str, Any] = {
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        **plan["settings"],
    }
    # Scrapy >= 2.19 would start a remote-control web server in every crawl.
    settings["EXTENSIONS"] = {
        "scrapy.extensions.remote_control.RemoteControl": None,
        **settings.get("EXTENSIONS", {}),
    }
    counts: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    started: list[float] = []
    cpu_at_start: list[float] = []

    class QualitySpider(scrapy.Spider):
        name = "quality"

        async def start(self) -> Any:
            # Scrapy reads start() eagerly into its scheduler; keep only a
            # backlog there, as a crawl that discovers its URLs as it goes
            # would, instead of building every request up front.
            started.append(time.monotonic())
            cpu_at_start.append(time.process_time())
            scheduler: Any = self.crawler.engine.scheduler
            for url in request_list(plan["sites"]):
                while len(scheduler) >= BACKLOG:  # noqa: ASYNC110 - no event to wait on
                    await asyncio.sleep(0.01)
                yield scrapy.Request(
                    url, dont_filter=True, callback=self.parse, errback=self.failed
                )

        def parse(self, response: Any) -> None:
            counts[str(response.status)] += 1

        def failed(self, failure: Any) -> None:
            response = getattr(failure.value, "response", None)
            if response is not None:
                counts[str(response.status)] += 1
            else:
                counts[type(failure.value).__name__] += 1

    process = CrawlerProcess(settings)
    crawler = process.create_crawler(QualitySpider)

    found: list[Any] = []

    def throttling_middleware() -> Any:
        """throttlekit's middleware in this crawl, or None (Scrapy's own throttling)."""
        module = sys.modules.get("throttlekit.adapters.scrapy")
        if module is None:
            return None
        for middleware in crawler.engine.downloader.middleware.middlewares:
            if isinstance(middleware, module.ThrottlingMiddleware):
                return middleware
        return None

    def sample() -> None:
        if crawler.engine is None:
            return
        now = time.monotonic()
        middleware = found[0]
        if middleware is not None:
            for name, scope in middleware.limiter.statistics().scopes.items():
                samples.append(_sample(now, name, scope))
        else:
            for key, slot in crawler.engine.downloader.slots.items():
                samples.append(
                    {
                        "t": now,
                        "scope": key,
                        "delay": slot.delay,
                        "concurrency": slot.concurrency,
                        "in_flight": len(slot.transferring),
                    }
                )

    samplers: list[Any] = []

    def opened() -> None:
        # Imported here: importing it before CrawlerProcess would install the
        # default reactor instead of the asyncio one.
        from twisted.internet import reactor as installed
        from twisted.internet import task

        reactor: Any = installed
        found.append(throttling_middleware())
        sampler = task.LoopingCall(sample)
        sampler.start(interval, now=False)
        samplers.append(sampler)
        reactor.callLater(budget + margin, stop)

    def stop() -> None:
        sample()
        stats = crawler.stats.get_stats() if crawler.stats else {}
        _finish(
            output,
            {
                "started": started[0] if started else None,
                "stopped": time.monotonic(),
                "counts": dict(counts),
                "samples": samples,
                "cpu": time.process_time() - (cpu_at_start[0] if cpu_at_start else 0.0),
                "stats": {
                    key: value if isinstance(value, (int, float, str)) else str(value)
                    for key, value in stats.items()
                },
            },
        )

    crawler.signals.connect(opened, signal=signals.spider_opened)
    process.crawl(crawler)
    process.start()
    # Only reached when the crawl ended before the budget (e.g. it failed).
    print("the crawl ended before its budget", file=sys.stderr)
    sys.exit(1)


def _finish(output: Path, result: dict[str, Any]) -> None:
    """Write ``result`` and end the process at once (see :func:`run_scrapy`)."""
    output.write_text(json.dumps(result), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- httpx -------------------------------------------------------------------------------


def _log_decisions(path: str) -> None:
    """Send throttlekit's DEBUG log to ``path``, each line stamped with the epoch time."""
    import logging

    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(created).3f %(name)s %(message)s"))
    logger = logging.getLogger("throttlekit")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)


async def _start_together(plan: dict[str, Any]) -> None:
    """Say ``ready`` and wait for ``go`` (see the module doc); at once without them."""
    import anyio

    if plan.get("ready"):
        await anyio.Path(plan["ready"]).touch()
    go = plan.get("go")
    # Another process's file: there is no event to wait on.
    while go and not await anyio.Path(go).exists():  # noqa: ASYNC110
        await anyio.sleep(0.01)


def _final(scope: Any) -> dict[str, Any]:
    return {
        "delay": scope.delay,
        "concurrency": scope.concurrency,
        "backoff_level": getattr(scope, "backoff_level", None),
        "last_signal": getattr(scope, "last_signal", None),
        "blocked_until": _finite(scope.blocked_until),
        "reason": getattr(scope, "reason", None),
    }


class _States:
    """The scopes' states: this process's, or with ``backend`` the shared ones read from Redis."""

    def __init__(self, limiter: Any, backend: Any, plan: dict[str, Any]) -> None:
        from throttlekit.scopes import by_host

        self.limiter = limiter
        self.backend = backend
        self.names = sorted({by_host(site["url"]) for site in plan["sites"]})

    async def read(self) -> dict[str, Any]:
        if self.backend is None:
            return dict(self.limiter.statistics().scopes)
        return {
            name: await self.backend.scope_statistics(self.limiter, name) for name in self.names
        }


def run_httpx(plan: dict[str, Any]) -> dict[str, Any]:
    import anyio
    import attrs
    import httpx

    from throttlekit import Limiter
    from throttlekit.adapters.httpx import ThrottledTransport

    budget = float(plan["budget"])
    margin = float(plan.get("margin", 2.0))
    interval = float(plan.get("sample_interval", 0.5))
    stopped: list[float] = []
    workers = int(plan.get("workers", 64))
    policy = policy_from_plan(plan["policy"])
    backend = None
    if plan.get("redis"):
        from throttlekit.backends.redis import RedisBackend

        redis = plan["redis"]
        backend = RedisBackend.from_url(redis["url"], prefix=redis["prefix"], failure="fail_closed")
    if plan.get("decisions"):
        _log_decisions(plan["decisions"])
    limiter = Limiter(default=policy, concurrency=policy.concurrency, backend=backend)
    states = _States(limiter, backend, plan)
    counts: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    started: list[float] = []
    cpu_at_start: list[float] = []
    scopes: dict[str, Any] = {}
    calls: dict[str, Any] = {}  # the Redis backend's counters

    async def crawl() -> None:
        urls = request_list(plan["sites"])
        inner = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        )
        transport = ThrottledTransport(limiter, inner)
        async with httpx.AsyncClient(transport=transport, timeout=60.0) as client:

            async def worker() -> None:
                for url in urls:
                    try:
                        response = await client.get(url)
                    except httpx.HTTPError as exc:
                        counts[type(exc).__name__] += 1
                    else:
                        counts[str(response.status_code)] += 1

            async def sampler() -> None:
                while True:
                    await anyio.sleep(interval)
                    now = time.monotonic()
                    for name, scope in (await states.read()).items():
                        samples.append(_sample(now, name, scope))

            await _start_together(plan)
            started.append(time.monotonic())
            cpu_at_start.append(time.process_time())
            with anyio.move_on_after(budget + margin):
                async with anyio.create_task_group() as group:
                    group.start_soon(sampler)
                    for _ in range(workers):
                        group.start_soon(worker)
            stopped.append(time.monotonic())
        scopes.update({name: _final(scope) for name, scope in (await states.read()).items()})
        if backend is not None:
            calls.update(attrs.asdict(backend.statistics()))
            await backend.aclose()

    anyio.run(crawl)
    return {
        "started": started[0] if started else None,
        "stopped": stopped[0] if stopped else None,
        "counts": dict(counts),
        "samples": samples,
        "cpu": time.process_time() - (cpu_at_start[0] if cpu_at_start else 0.0),
        "scopes": scopes,
        **({"redis": calls} if calls else {}),
    }


# -- paced -------------------------------------------------------------------------------


def run_paced(plan: dict[str, Any]) -> dict[str, Any]:
    """A client that knows each site's limit: sends evenly at its ``rate``, or keeps ``workers``.

    Each site of the plan may give its own ``rate`` or ``workers`` (else the
    plan's). With a rate, request ``i`` to the site starts ``i / rate``
    seconds after the first (but never sooner than ``1 / rate`` after the one
    before), whatever the answers; without one, ``workers``
    tasks send one request after the other. No throttlekit, no retries: the
    oracle of the real-limiter benchmark.
    """
    import anyio
    import httpx

    budget = float(plan["budget"])
    margin = float(plan.get("margin", 2.0))
    counts: Counter[str] = Counter()
    started: list[float] = []
    cpu_at_start: list[float] = []

    async def crawl() -> None:
        async with httpx.AsyncClient(
            timeout=60.0, limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)
        ) as client:

            async def fetch(url: str) -> None:
                try:
                    response = await client.get(url)
                except httpx.HTTPError as exc:
                    counts[type(exc).__name__] += 1
                else:
                    counts[str(response.status_code)] += 1

            async def worker(urls: Iterator[str]) -> None:
                for url in urls:
                    await fetch(url)

            async def paced(site: dict[str, Any], group: Any) -> None:
                urls = request_list([{**site, "count": 1_000_000_000}])
                rate = site.get("rate", plan.get("rate"))
                if rate is None:
                    for _ in range(int(site.get("workers", plan.get("workers", 1)))):
                        group.start_soon(worker, urls)
                    return
                interval = 1.0 / float(rate)
                first = anyio.current_time()
                last = first - interval
                for index, url in enumerate(urls):
                    # On schedule, but never sooner than an interval after the last
                    # send: a stall of the event loop is not caught up with a burst.
                    await anyio.sleep_until(max(first + index * interval, last + interval))
                    last = anyio.current_time()
                    group.start_soon(fetch, url)

            started.append(time.monotonic())
            cpu_at_start.append(time.process_time())
            with anyio.move_on_after(budget + margin):
                async with anyio.create_task_group() as group:
                    for site in plan["sites"]:
                        group.start_soon(paced, site, group)

    anyio.run(crawl)
    return {
        "started": started[0] if started else None,
        "stopped": time.monotonic(),
        "counts": dict(counts),
        "cpu": time.process_time() - (cpu_at_start[0] if cpu_at_start else 0.0),
    }


# -- baseline ----------------------------------------------------------------------------


def run_baseline(plan: dict[str, Any]) -> dict[str, Any]:
    """One request at a time, site after site, until each gave ``samples`` 200s or the budget.

    After a refusal the site is left alone for a moment (``pause``), so that a
    spent quota is not hammered with refused requests while it refills.
    """
    import anyio
    import httpx

    budget = float(plan["budget"])
    samples = int(plan.get("samples", 100))
    pause = float(plan.get("pause", 0.2))
    settle = float(plan.get("settle", 0.0))
    counts: Counter[str] = Counter()
    started = time.monotonic()

    async def crawl() -> None:
        await anyio.sleep(settle)
        ok = {site["url"]: 0 for site in plan["sites"]}
        resting: dict[str, float] = {}
        async with httpx.AsyncClient(timeout=30.0) as client:
            with anyio.move_on_after(budget):
                index = 0
                while any(done < samples for done in ok.values()):
                    now = time.monotonic()
                    for url, done in ok.items():
                        if done >= samples or resting.get(url, 0.0) > now:
                            continue
                        response = await client.get(f"{url}/page/{index}")
                        counts[str(response.status_code)] += 1
                        if response.status_code == 200:
                            ok[url] += 1
                        else:
                            resting[url] = time.monotonic() + pause
                    index += 1
                    if all(
                        done >= samples or resting.get(url, 0.0) > time.monotonic()
                        for url, done in ok.items()
                    ):
                        await anyio.sleep(0.01)

    anyio.run(crawl)
    return {"started": started, "stopped": time.monotonic(), "counts": dict(counts)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m benchmarks.quality_clients plan.json result.json", file=sys.stderr)
        return 2
    plan = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    client = plan["client"]
    if client == "scrapy":
        run_scrapy(plan, Path(args[1]))  # writes the result and exits
        return 1
    if client == "httpx":
        result = run_httpx(plan)
    elif client == "baseline":
        result = run_baseline(plan)
    elif client == "paced":
        result = run_paced(plan)
    else:
        print(f"unknown client {client!r}", file=sys.stderr)
        return 2
    Path(args[1]).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
