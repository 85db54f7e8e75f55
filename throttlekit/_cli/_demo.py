"""``throttlekit demo``: crawl four local sites with different behaviours, live."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from .._adaptive import Adaptive
from .._limiter import Limiter
from .._policy import ScopePolicy
from ..testing import CapacityServer, FixedServer, FlakyServer, QuotaServer, ServerModel
from ._common import (
    CLIError,
    build_limiter,
    describe_policy,
    make_console,
    print_wrapped,
    read_toml,
    split_config,
)

if TYPE_CHECKING:
    import httpx

    from ._local import LocalSites

# httpx, aiohttp and the adapter are imported when the demo runs, so that other
# commands start fast.

__all__ = ["DEMO_SITES", "demo_command", "demo_limiter"]

#: The demo's sites: host → (what it does, its server model).
DEMO_SITES: dict[str, tuple[str, ServerModel]] = {
    "fast.test": ("answers every request in 10 ms", FixedServer(latency=0.01, size=2_000)),
    "slow.test": (
        "has 2 workers of 250 ms each, so its latency grows with load",
        CapacityServer(workers=2, service_time=0.25, jitter=0.2, size=20_000),
    ),
    "quota.test": (
        "allows 5 requests per second and answers 429 with Retry-After beyond",
        QuotaServer(limit=5, window=1.0, latency=0.05),
    ),
    "flaky.test": (
        "answers 5 % of requests with a random 503 and lets 2 % hang until the client times out",
        FlakyServer(
            latency=0.08, error_rate=0.05, error_statuses=(503,), timeout_rate=0.02, timeout=3.0
        ),
    ),
}

CLIENT_TIMEOUT = 2.0
WORKERS_PER_SITE = 8
#: What the words of Adaptive's reasons mean, said once under the report.
ADAPTIVE_WORDS = (
    "(Adaptive's words: 'throttled at' is the rate it was sending when the site "
    "refused; 'edge' is the rate the site accepted in the second before that "
    "refusal, its measured limit, which Adaptive holds just below; 'holding' is "
    "how long it keeps below the edge before it probes for more (longer each "
    "time the same edge is confirmed).)"
)


def demo_limiter(seed: int = 0) -> Limiter:
    """The demo's policy: Adaptive under a ceiling of 8 at a time per site, no fixed delay."""
    default = ScopePolicy(concurrency=8, delay=0.0, slot_delay=0.0, adaptive=Adaptive())
    return Limiter(default=default, concurrency=32, seed=seed)


class _SiteStats:
    __slots__ = ("errors", "latencies", "ok", "statuses", "timeouts")

    def __init__(self) -> None:
        self.ok = 0
        self.statuses: Counter[int] = Counter()
        self.timeouts = 0
        self.errors = 0
        self.latencies: list[float] = []


class _Crawl:
    def __init__(self, limiter: Limiter, hosts: list[str]) -> None:
        self.limiter = limiter
        self.hosts = hosts
        self.stats = {host: _SiteStats() for host in hosts}
        self.started = 0.0
        self.peak_backoff = dict.fromkeys(hosts, 0)

    async def worker(self, client: httpx.AsyncClient, host: str, first: int) -> None:
        import httpx

        from ._local import SENT_AT

        stats = self.stats[host]
        page = first
        while True:
            page += WORKERS_PER_SITE
            try:
                response = await client.get(f"http://{host}/page/{page}")
            except httpx.TimeoutException:
                stats.timeouts += 1
                continue
            except httpx.HTTPError:
                stats.errors += 1
                continue
            stats.statuses[response.status_code] += 1
            if response.status_code < 400:
                stats.ok += 1
            sent_at = response.request.extensions.get(SENT_AT)
            if sent_at is not None:
                stats.latencies.append(anyio.current_time() - sent_at)

    def table(self, now: float, title: str) -> Table:
        elapsed = max(now - self.started, 1e-9)
        scopes = self.limiter.statistics().scopes
        table = Table(title=title, title_justify="left", box=None, pad_edge=False, padding=(0, 1))
        for name, justify in (
            ("site", "left"),
            ("in flight", "right"),
            ("delay", "right"),
            ("backoff", "right"),
            ("ok", "right"),
            ("ok/s", "right"),
            ("429", "right"),
            ("5xx", "right"),
            ("failed", "right"),
            ("latency", "right"),
        ):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for host in self.hosts:
            stats = self.stats[host]
            scope = scopes.get(host)
            level = scope.backoff_level if scope is not None else 0
            self.peak_backoff[host] = max(self.peak_backoff[host], level)
            server_errors = sum(n for status, n in stats.statuses.items() if status >= 500)
            latency = statistics.median(stats.latencies[-200:]) if stats.latencies else None
            table.add_row(
                host,
                str(scope.in_flight) if scope is not None else "0",
                f"{scope.delay:.2f} s" if scope is not None else "-",
                str(level),
                str(stats.ok),
                f"{stats.ok / elapsed:.1f}",
                str(stats.statuses[429]),
                str(server_errors),
                str(stats.timeouts + stats.errors),
                f"{latency * 1000:.0f} ms" if latency is not None else "-",
            )
        return table


def _signals(stats: _SiteStats) -> str:
    """The backoff signals a site sent, e.g. ``4 x 429`` or ``3 x 503 and 1 timeout``."""
    parts = [
        f"{count} x {status}"
        for status, count in sorted(stats.statuses.items())
        if status == 429 or status >= 500
    ]
    if stats.timeouts:
        parts.append(f"{stats.timeouts} timeout{'s' if stats.timeouts > 1 else ''}")
    return " and ".join(parts)


def _explanation(crawl: _Crawl, host: str, behaviour: str) -> str:
    """What the limiter did on ``host`` and why, in one sentence."""
    stats = crawl.stats[host]
    scope = crawl.limiter.statistics().scopes.get(host)
    policy = crawl.limiter.policy(host)
    delay = scope.delay if scope is not None else policy.delay
    signals = _signals(stats)
    peak = crawl.peak_backoff[host]
    if policy.adaptive is not None:
        concurrency = scope.concurrency if scope is not None else policy.concurrency
        reason = scope.reason if scope is not None else ""
        if reason.startswith("adaptive: "):
            reason = reason[len("adaptive: ") :]
        if not reason or reason.startswith("no limit"):
            did = f"Adaptive met no rate limit and keeps {concurrency} at a time, as latency allows"
        else:
            did = f"Adaptive holds {1 / delay:.1f} requests/s, {concurrency} at a time ({reason})"
        if signals:
            did += f" after {signals}"
    elif peak and signals:
        did = f"backed off after {signals} (backoff level up to {peak}, delay now {delay:.2f} s)"
    elif signals:
        did = f"got {signals}, too few to slow down for"
    elif policy.autothrottle is not None and delay > policy.delay:
        latency = statistics.median(stats.latencies[-200:]) if stats.latencies else 0.0
        did = (
            f"AutoThrottle spaced requests {delay:.2f} s apart, following the latency "
            f"({latency * 1000:.0f} ms)"
        )
    else:
        limit = "unlimited" if policy.concurrency is None else str(policy.concurrency)
        did = f"never had to slow down beyond the policy ({limit} at a time, {delay:g} s apart)"
    return f"{did}: this site {behaviour}."


def _plural(count: int, noun: str) -> str:
    """``1 request``, ``2 requests``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _report(crawl: _Crawl, sites: LocalSites, elapsed: float) -> list[tuple[str, str]]:
    """The report's paragraphs, each with the indent of its lines."""
    paragraphs = []
    for host in crawl.hosts:
        stats = crawl.stats[host]
        record = sites.records[host]
        answered = sum(stats.statuses.values())
        throttled = stats.statuses[429]
        server_errors = sum(n for status, n in stats.statuses.items() if status >= 500)
        line = (
            f"{host}: {stats.ok} ok ({stats.ok / elapsed:.1f}/s), the site saw at most "
            f"{_plural(record.max_in_flight, 'request')} at once"
        )
        if throttled:
            line += f"; {throttled} x 429 ({throttled / max(answered, 1):.0%} of responses)"
        if server_errors or stats.timeouts:
            line += f"; {server_errors} x 5xx and {_plural(stats.timeouts, 'timeout')}"
        paragraphs.append(("", line))
        paragraphs.append(("  ", _explanation(crawl, host, DEMO_SITES[host][0])))
    if any(" edge " in text for _, text in paragraphs):
        paragraphs.append(("", ADAPTIVE_WORDS))
    return paragraphs


async def _run_demo(limiter: Limiter, duration: float, seed: int, console: Console) -> None:
    import httpx

    from ..adapters.httpx import ThrottledTransport
    from ._local import LocalSites, Stopwatch

    hosts = list(DEMO_SITES)
    crawl = _Crawl(limiter, hosts)
    models = {host: model for host, (_, model) in DEMO_SITES.items()}
    async with LocalSites(models, seed=seed) as sites:
        print_wrapped(
            console,
            f"{WORKERS_PER_SITE} workers per site crawl for {duration:g}\xa0s through httpx + "
            f"throttlekit the local sites on {sites.proxy_url} (the crawler's HTTP proxy):",
            hang="  ",
        )
        for host, (behaviour, _) in DEMO_SITES.items():
            print_wrapped(console, f"{host} {behaviour}", "  ")
            policy = describe_policy(limiter, host)
            print_wrapped(console, f"throttlekit applies: {policy}", "    ", "      ")
        inner = Stopwatch(httpx.AsyncHTTPTransport(proxy=sites.proxy_url))
        transport = ThrottledTransport(limiter, inner)
        async with httpx.AsyncClient(
            transport=transport, timeout=CLIENT_TIMEOUT, trust_env=False
        ) as client:
            crawl.started = anyio.current_time()
            live = console.is_terminal
            with (
                Live(
                    crawl.table(crawl.started, "crawling..."),
                    console=console,
                    refresh_per_second=4,
                    transient=True,
                )
                if live
                else _Nothing() as display
            ):
                async with anyio.create_task_group() as tasks:
                    for host in hosts:
                        for first in range(WORKERS_PER_SITE):
                            tasks.start_soon(crawl.worker, client, host, first)
                    deadline = crawl.started + duration
                    while (now := anyio.current_time()) < deadline:
                        await anyio.sleep(min(0.25, deadline - now))
                        title = f"crawling... {now - crawl.started:4.1f} / {duration:g} s"
                        table = crawl.table(anyio.current_time(), title)
                        if live:
                            display.update(table)
                    tasks.cancel_scope.cancel()
        elapsed = anyio.current_time() - crawl.started
        console.print()
        console.print(crawl.table(anyio.current_time(), f"after {elapsed:.1f} s:"))
        console.print()
        for indent, text in _report(crawl, sites, elapsed):
            print_wrapped(console, text, indent)


class _Nothing:
    def __enter__(self) -> _Nothing:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    def update(self, renderable: Any) -> None:
        return None


def demo_command(
    duration: Annotated[
        float,
        typer.Option(help="Seconds to crawl.", min=0.5, max=3600.0),
    ] = 20.0,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="TOML file of throttling settings (e.g. DOWNLOAD_DELAY) to use instead of "
            "the demo's policy.",
            dir_okay=False,
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sites' random behaviour.")] = 0,
) -> None:
    """Crawl four local sites (fast, slow, 429 quota, flaky) and watch throttlekit adapt.

    Everything runs on this machine: a local server on 127.0.0.1 plays the
    sites, and an httpx client throttled by throttlekit crawls them through it.
    A live table shows, per site, the requests in flight, the current delay,
    the backoff level and the 429s, 5xx and timeouts; a report follows.
    """
    if config is not None:
        settings, _ = split_config(read_toml(config), "demo", str(config))
        limiter = build_limiter(settings, str(config), seed=seed)
    else:
        limiter = demo_limiter(seed)
    console = make_console()
    if not DEMO_SITES:  # pragma: no cover - a constant
        raise CLIError("no demo sites")
    started = time.perf_counter()
    asyncio.run(_run_demo(limiter, duration, seed, console))
    console.print(f"done in {time.perf_counter() - started:.1f} s")
