"""Part of the ``sync`` suite: 32 threads crawl three local sites through one requests.Session.

The sites are the testing kit's :class:`~throttlekit.testing.FixedServer`
(20 ms answers) on three ports of ``127.0.0.1``, so each is its own scope.
Each has a policy (concurrency and delay), and a thread works for one site
(the threads are spread over them), so no site's slowness holds up another's
threads. throttlekit's :class:`~throttlekit.adapters.requests.ThrottledAdapter`
runs next to requests-ratelimiter's ``LimiterAdapter`` mounted per site at
the same rate (it has no concurrency limit, and its window admits a burst).
The numbers come from the sites' records.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from throttlekit import ScopePolicy, SyncLimiter
from throttlekit.testing import FixedServer

from ._harness import RunConfig, Skip, SuiteResult, Table, Target
from .quality_sites import Record, SiteServer

__all__ = ["crawl"]

THREADS = 32
LATENCY = 0.02
#: (concurrency, delay) of the three sites.
POLICIES = ((1, 0.1), (2, 0.02), (4, 0.01))


class _Grants:
    """A listener (the limiter's public hook) that keeps each scope's grant times."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: dict[str, list[float]] = {}

    def on_grant(self, permit: Any, waited: float) -> None:
        with self.lock:
            for scope in permit.scopes:
                self.times.setdefault(scope, []).append(permit.granted_at)

    def on_wait(self, permit: Any) -> None:
        pass

    def on_fail(self, permit: Any, exc: BaseException, waited: float) -> None:
        pass

    def on_release(self, permit: Any) -> None:
        pass

    def on_feedback(self, permit: Any, feedback: Any) -> None:
        pass


def _allowed(concurrency: int, delay: float) -> float:
    """Requests per second the policy allows against 20 ms answers."""
    by_delay = 1 / delay if delay else float("inf")
    return min(by_delay, concurrency / LATENCY)


def _most_at_once(records: list[Record]) -> int:
    events = sorted([(arrived, 1) for arrived, *_ in records] + [(f, -1) for _, f, *_ in records])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _session(kind: str, urls: list[str], grants: _Grants) -> Any:
    import requests

    session = requests.Session()
    session.trust_env = False
    if kind == "throttlekit":
        from throttlekit.adapters.requests import ThrottledAdapter

        scopes = {
            url.removeprefix("http://"): ScopePolicy(concurrency=c, delay=d, jitter=0.0)
            for url, (c, d) in zip(urls, POLICIES, strict=True)
        }
        limiter = SyncLimiter(scopes=scopes, concurrency=None)
        limiter.add_listener(grants)
        session.mount("http://", ThrottledAdapter(limiter))
    else:
        from requests_ratelimiter import LimiterAdapter

        for url, (concurrency, delay) in zip(urls, POLICIES, strict=True):
            session.mount(url, LimiterAdapter(per_second=_allowed(concurrency, delay)))
    return session


def _run(kind: str, seconds: float, result: SuiteResult, table: Table) -> bool:
    """Crawl for ``seconds``; add a row per site; whether every policy was kept."""
    kept = True
    with SiteServer() as server:
        sites = [server.serve(FixedServer(latency=LATENCY, size=2_000)) for _ in POLICIES]
        running = [site.__enter__() for site in sites]
        try:
            urls = [site.url for site in running]
            grants = _Grants()
            session = _session(kind, urls, grants)
            end = time.monotonic() + seconds

            def work(index: int) -> None:
                url = urls[index % len(urls)]
                for n in itertools.count():
                    if time.monotonic() >= end:
                        return
                    session.get(f"{url}/page/{index}/{n}", timeout=10)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            session.close()
        finally:
            for site in sites:
                site.__exit__(None, None, None)
    for site, (concurrency, delay) in zip(running, POLICIES, strict=True):
        records = sorted(site.records)
        arrivals = [record[0] for record in records]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else seconds
        rate = (len(records) - 1) / span if span > 0 else 0.0
        allowed = _allowed(concurrency, delay)
        most = _most_at_once(records)
        closest = min(gaps, default=0.0)
        granted = sorted(grants.times.get(site.url.removeprefix("http://"), []))
        spaced = min((b - a for a, b in itertools.pairwise(granted)), default=None)
        ok = most <= concurrency and (spaced is None or spaced >= delay - 1e-6)
        kept = kept and ok
        table.add(
            kind,
            f"concurrency {concurrency}, delay {delay * 1000:.0f} ms",
            f"{rate:.1f}/s",
            f"{100 * rate / allowed:.0f} %",
            most,
            "n/a" if spaced is None else f"{spaced * 1000:.1f} ms",
            f"{closest * 1000:.1f} ms",
        )
    return kept


def crawl(config: RunConfig, result: SuiteResult) -> None:
    """The crawl part of the ``sync`` suite."""
    seconds = 0.3 if config.quick else 5.0
    table = Table(
        f"{THREADS} threads crawl three local sites through one requests.Session ({seconds:g} s)",
        [
            "client",
            "site policy",
            "rate",
            "of allowed",
            "most at once",
            "closest grants",
            "closest arrivals",
        ],
    )
    kept = _run("throttlekit", seconds, result, table)
    try:
        __import__("requests_ratelimiter")
    except ImportError as exc:
        result.skipped.append(Skip("requests-ratelimiter crawl", str(exc)))
    else:
        if config.quick:  # a smoke run keeps to throttlekit's crawl
            result.skipped.append(Skip("requests-ratelimiter crawl", "not run in a quick run"))
        else:
            _run("requests-ratelimiter", seconds, result, table)
    result.tables.append(table)
    result.targets.append(
        Target(
            "sync crawl: every site's concurrency and delay kept",
            "most at once (site) <= concurrency, closest grants >= delay",
            "kept" if kept else "exceeded",
            kept,
        )
    )
    result.notes.append(
        "The crawl's rate is what each site saw from its first to its last request; "
        "'of allowed' divides it by what the policy allows against 20 ms answers "
        "(1/delay, or concurrency/latency when that is lower). requests-ratelimiter is "
        "given each site's allowed rate per second (burst 1): it has no concurrency "
        "limit and admits a window's requests at once. 'most at once' is what each site "
        "saw; 'closest grants' are the limiter's own send times (from a listener added "
        "with add_listener), 'closest arrivals' the site's: with 32 threads on the GIL of "
        "a busy 2-core machine, a granted thread may wait several ms for the GIL before "
        "its request leaves, so arrivals come closer together than the grants."
    )
