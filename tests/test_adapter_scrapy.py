"""throttlekit.adapters.scrapy: real Scrapy crawls of a local multi-host site.

Each crawl runs in a subprocess (``tests/scrapy_project/run_crawl.py``: a
``CrawlerProcess`` on the asyncio reactor) against the recording server of
``tests/_server.py``. Host names ``*.test`` resolve to 127.0.0.1 through a
custom ``TWISTED_DNS_RESOLVER``, so every host is its own Scrapy download slot
and its own throttlekit scope (``a.test:<port>``), exactly as real hosts would
be. Assertions read the server's records: arrival times and requests in
flight per host.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import scrapy
from _server import Hang, Hit, LocalServer, Reply, Script, describe
from scrapy import Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector

from throttlekit import Limiter, ScopePolicy, scopes
from throttlekit.adapters.scrapy import ThrottlingMiddleware, limiter_from_settings

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "scrapy_project" / "run_crawl.py"
MIDDLEWARE = {"throttlekit.adapters.scrapy.ThrottlingMiddleware": 950}
SCRAPY_2_14 = hasattr(scrapy.signals, "robots_parsed")  # added with Scrapy 2.14
#: The exception of a download timeout (Twisted's before Scrapy 2.14).
TIMEOUT_ERROR = (
    "scrapy.exceptions.DownloadTimeoutError"
    if SCRAPY_2_14
    else "twisted.internet.error.TimeoutError"
)

#: How much earlier than the limiter's spacing the server may see two
#: arrivals: the crawl's process and the server's thread are scheduled
#: independently, and a loaded 2-core machine delays a send or its time stamp
#: by up to ~70 ms (measured). The error does not add up over a run of
#: arrivals, so :func:`assert_spaced` also checks the whole run's length.
SLACK = 0.1

#: Settings that make throttling exact for the assertions: no jitter, no
#: per-slot delay unless a test asks for one.
EXACT = {
    "DOWNLOADER_MIDDLEWARES": MIDDLEWARE,
    "DOWNLOAD_DELAY_JITTER": 0,
    "DOWNLOAD_DELAY_PER_SLOT": 0,
}


@attrs.frozen
class Crawl:
    """What a crawl left behind: Scrapy's stats, the spider's outcomes, the log."""

    stats: dict[str, Any]
    outcomes: list[dict[str, Any]]
    log: str

    def statuses(self) -> list[int]:
        return sorted(outcome["status"] for outcome in self.outcomes if "status" in outcome)

    def failures(self) -> list[str]:
        return sorted(outcome["exception"] for outcome in self.outcomes if "exception" in outcome)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer() as running:
        running.route(behaviour=Reply(latency=0.05))
        yield running


def crawl(
    server: LocalServer,
    tmp_path: Path,
    settings: dict[str, Any],
    urls: list[str | dict[str, Any]],
    *,
    sweep_interval: float | None = None,
    without_robots_parsed: bool = False,
) -> Crawl:
    """Crawl ``urls`` (paths like ``"a.test/p1"``, or request dicts) in a subprocess."""
    requests = []
    for entry in urls:
        request = {"url": entry} if isinstance(entry, str) else dict(entry)
        request["url"] = f"http://{request['url'].replace('/', f':{server.port}/', 1)}"
        requests.append(request)
    plan: dict[str, Any] = {"settings": settings, "requests": requests}
    if sweep_interval is not None:
        plan["sweep_interval"] = sweep_interval
    if without_robots_parsed:
        plan["without_robots_parsed"] = True
    number = len(list(tmp_path.glob("plan-*.json")))
    plan_file = tmp_path / f"plan-{number}.json"
    result_file = tmp_path / f"result-{number}.json"
    plan_file.write_text(json.dumps(plan))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.run(
        [sys.executable, str(RUNNER), str(plan_file), str(result_file)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )
    (tmp_path / f"crawl-{number}.log").write_text(process.stderr)
    assert process.returncode == 0, process.stderr[-5000:]
    assert result_file.exists(), process.stderr[-5000:]
    result = json.loads(result_file.read_text())
    server.wait_idle()
    return Crawl(stats=result["stats"], outcomes=result["outcomes"], log=process.stderr)


def scope(server: LocalServer, host: str) -> str:
    """The throttlekit scope of a host of the local server (host plus its port)."""
    return f"{host}:{server.port}"


def arrivals(server: LocalServer, host: str, path: str | None = None) -> list[float]:
    return [hit.arrived for hit in server.hits(host, path)]


def table(hits: list[Hit]) -> str:
    return describe(sorted(hits, key=lambda hit: hit.arrived))


def assert_spaced(hits: list[Hit], delay: float) -> None:
    """The server saw ``hits`` at least ``delay`` apart (within the measuring error)."""
    times = sorted(hit.arrived for hit in hits)
    assert min(b - a for a, b in itertools.pairwise(times)) >= delay - SLACK, table(hits)
    assert times[-1] - times[0] >= (len(times) - 1) * delay - SLACK, table(hits)


# -- the documented settings -------------------------------------------------------------


def documented_settings(document: str) -> dict[str, Any]:
    """Run the ``# settings.py`` example of ``document`` and return the settings it defines."""
    text = (ROOT / document).read_text()
    blocks = re.findall(r"\.\. code-block:: python\n((?:\n|    .*\n)+)", text)
    example = next(block for block in blocks if "# settings.py" in block)
    namespace: dict[str, Any] = {}
    exec(
        compile("\n".join(line[4:] for line in example.splitlines()), document, "exec"),
        namespace,
    )
    return {name: value for name, value in namespace.items() if name.isupper()}


def test_readme_settings_are_those_of_the_docs() -> None:
    readme = documented_settings("README.rst")
    docs = documented_settings("docs/scrapy.rst")
    assert readme == {name: docs[name] for name in readme}


def test_documented_settings_throttle_each_host(server: LocalServer, tmp_path: Path) -> None:
    settings = documented_settings("docs/scrapy.rst")
    assert settings["DOWNLOADER_MIDDLEWARES"] == MIDDLEWARE
    per_host = settings["CONCURRENT_REQUESTS_PER_DOMAIN"]
    delay = settings["DOWNLOAD_DELAY"]
    result = crawl(
        server, tmp_path, settings, [f"{host}.test/{n}" for n in range(5) for host in "ab"]
    )
    assert result.statuses() == [200] * 10
    for host in ("a.test", "b.test"):
        hits = server.hits(host)
        assert server.max_in_flight(host) <= per_host, table(hits)
        # Scrapy's default DOWNLOAD_DELAY_JITTER (0.5) applies: x0.5 .. x1.5.
        assert_spaced(hits, 0.5 * delay)
    assert result.stats["throttlekit/request_count"] == 10
    assert result.stats["throttlekit/response_status_count/200"] == 10


# -- per-host throttling, seen by the server -----------------------------------------------


def test_per_host_limits_replace_scrapys_own(server: LocalServer, tmp_path: Path) -> None:
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0.25,
        "THROTTLING_SCOPES": {
            scope(server, "b.test"): {"concurrency": 3, "delay": 0},
            scope(server, "c.test"): {"concurrency": 2, "delay": 0.1, "slot_delay": 0.4},
            "shared-budget": {"concurrency": 1, "delay": 0},
        },
    }
    server.route("b.test", behaviour=Reply(latency=0.15))
    urls: list[str | dict[str, Any]] = [f"{host}.test/{n}" for n in range(5) for host in "abc"]
    # Two more hosts whose requests name their own scope in the meta.
    budget = {"throttling_scopes": "shared-budget"}
    urls += [{"url": f"{host}.test/{n}", "meta": budget} for n in range(2) for host in "de"]
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200] * 19

    # a.test: the default policy from CONCURRENT_REQUESTS_PER_DOMAIN / DOWNLOAD_DELAY.
    hits = server.hits("a.test")
    assert server.max_in_flight("a.test") == 1, table(hits)
    assert_spaced(hits, 0.25)

    # b.test: concurrency 3 and no delay although Scrapy's settings say 1 and
    # 0.25 s: Scrapy's download slot neither caps nor delays it (no stacking).
    hits = server.hits("b.test")
    assert server.max_in_flight("b.test") == 3, table(hits)
    assert min(server.gaps("b.test")) < 0.1, table(hits)

    # c.test: 2 slots, 0.1 s between any two sends, 0.4 s between sends of a slot.
    hits = server.hits("c.test")
    assert server.max_in_flight("c.test") <= 2, table(hits)
    assert_spaced(hits, 0.1)
    assert_spaced(hits[::2], 0.4)
    assert_spaced(hits[1::2], 0.4)

    # d.test and e.test share one scope of concurrency 1: one at a time.
    hits = sorted(server.hits("d.test") + server.hits("e.test"), key=lambda hit: hit.arrived)
    for earlier, later in itertools.pairwise(hits):
        assert earlier.finished is not None
        assert later.arrived >= earlier.finished, table(hits)

    stats = result.stats
    assert stats["throttlekit/request_count"] == 19
    assert stats["throttlekit/waited_requests"] >= 8
    assert stats["throttlekit/wait_time_total"] > 1.0
    assert stats["throttlekit/response_status_count/200"] == 19
    assert "throttlekit/backoff_signals" not in stats


# -- waiting requests and CONCURRENT_REQUESTS -------------------------------------------------

STARVATION_SETTINGS = {
    **EXACT,
    "CONCURRENT_REQUESTS": 4,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
    "DOWNLOAD_DELAY": 0,
}


def slow_and_fast(server: LocalServer) -> tuple[dict[str, Any], list[str | dict[str, Any]]]:
    """6 requests to a slow host (one every 0.4 s) scheduled before 10 to a fast one."""
    settings = {
        **STARVATION_SETTINGS,
        "THROTTLING_SCOPES": {scope(server, "a.test"): {"concurrency": 1, "delay": 0.4}},
    }
    slow: list[str | dict[str, Any]] = [{"url": f"a.test/{n}", "priority": 1} for n in range(6)]
    fast: list[str | dict[str, Any]] = [f"b.test/{n}" for n in range(10)]
    return settings, slow + fast


@pytest.mark.parametrize(
    "queue",
    ["scrapy.pqueues.ScrapyPriorityQueue", "scrapy.pqueues.DownloaderAwarePriorityQueue"],
)
def test_requests_waiting_on_a_slow_host_do_not_starve_others(
    server: LocalServer, tmp_path: Path, queue: str
) -> None:
    settings, urls = slow_and_fast(server)
    settings["SCHEDULER_PRIORITY_QUEUE"] = queue
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200] * 16
    slow, fast = arrivals(server, "a.test"), arrivals(server, "b.test")
    hits = server.hits()
    # The slow host sends one request every 0.4 s ...
    assert server.max_in_flight("a.test") == 1, table(hits)
    assert_spaced(server.hits("a.test"), 0.4)
    # ... while the fast host is served in full before its third request.
    assert max(fast) < slow[2], table(hits)
    assert server.max_in_flight("b.test") >= 2, table(hits)
    # The other slow-host requests were waiting for a permit meanwhile.
    assert result.stats["throttlekit/max_waiting"] >= 5


def test_without_waiting_room_slow_hosts_take_every_seat(
    server: LocalServer, tmp_path: Path
) -> None:
    """THROTTLING_MAX_WAITING = 0 is Scrapy's own accounting: the control experiment."""
    settings, urls = slow_and_fast(server)
    settings["SCHEDULER_PRIORITY_QUEUE"] = "scrapy.pqueues.ScrapyPriorityQueue"
    settings["THROTTLING_MAX_WAITING"] = 0
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200] * 16
    slow, fast = arrivals(server, "a.test"), arrivals(server, "b.test")
    # The 4 CONCURRENT_REQUESTS seats hold slow-host requests until the
    # scheduler has no more of them: the fast host waits behind the slow one.
    assert min(fast) > slow[2], table(server.hits())
    assert result.stats["throttlekit/max_waiting"] <= 4


# -- the HTTP cache -----------------------------------------------------------------------------


def test_cache_hits_do_not_wait(server: LocalServer, tmp_path: Path) -> None:
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0.2,
        "HTTPCACHE_ENABLED": True,
        "HTTPCACHE_DIR": str(tmp_path / "cache"),
    }
    urls: list[str | dict[str, Any]] = [f"a.test/{n}" for n in range(4)]
    first = crawl(server, tmp_path, settings, urls)
    assert first.statuses() == [200] * 4
    assert_spaced(server.hits("a.test"), 0.2)
    assert first.stats["throttlekit/request_count"] == 4
    assert first.stats["httpcache/miss"] == 4

    second = crawl(server, tmp_path, settings, urls)
    assert second.statuses() == [200] * 4
    assert len(server.hits()) == 4  # nothing new reached the server
    assert second.stats["httpcache/hit"] == 4
    assert not any(key.startswith("throttlekit/") for key in second.stats), second.stats
    times = sorted(outcome["at"] for outcome in second.outcomes)
    assert times[-1] - times[0] < 0.2, second.outcomes
    assert all("cached" in outcome["flags"] for outcome in second.outcomes)


# -- robots.txt Crawl-delay ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "robots_parsed",
    [
        pytest.param(True, id="robots_parsed-signal"),
        # As on a Scrapy without the signal (< 2.14): the middleware reads robots.txt.
        pytest.param(False, id="robotstxt-read-by-the-middleware"),
    ],
)
def test_robots_txt_crawl_delay_applies_to_its_host(
    server: LocalServer, tmp_path: Path, robots_parsed: bool
) -> None:
    if robots_parsed and not SCRAPY_2_14:
        pytest.skip(f"Scrapy {scrapy.__version__} has no robots_parsed signal")
    server.route("c.test", "/robots.txt", Reply(body=b"User-agent: *\nCrawl-delay: 0.4\n"))
    server.route("d.test", "/robots.txt", Reply(body=b"User-agent: *\nDisallow: /private\n"))
    # (No request to d.test/private: Scrapy 2.19 lets some through when they
    # arrive while robots.txt is being fetched; that is Scrapy's business.)
    settings = {
        **EXACT,
        "ROBOTSTXT_OBEY": True,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "DOWNLOAD_DELAY": 0,
    }
    urls = [f"{host}.test/{n}" for n in range(3) for host in "cd"]
    result = crawl(server, tmp_path, settings, urls, without_robots_parsed=not robots_parsed)
    assert result.statuses() == [200] * 6

    hits = server.hits("c.test")
    assert hits[0].path == "/robots.txt"
    assert server.max_in_flight("c.test") == 1, table(hits)
    # Every send after robots.txt is 0.4 s from the previous one.
    assert_spaced(hits, 0.4)

    hits = server.hits("d.test")
    assert server.max_in_flight("d.test") > 1, table(hits)
    assert result.stats["throttlekit/robotstxt_crawl_delay"] == 1


# -- feedback: Retry-After, backoff, timeouts -----------------------------------------------------


def test_retry_after_blocks_the_host(server: LocalServer, tmp_path: Path) -> None:
    server.route(
        "e.test",
        behaviour=Script(Reply(status=429, headers={"Retry-After": "1"}), then=Reply(latency=0.02)),
    )
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "DOWNLOAD_DELAY": 0,
        "BACKOFF_MIN_DELAY": 0.1,
        "BACKOFF_JITTER": 0,
    }
    result = crawl(server, tmp_path, settings, [f"e.test/{n}" for n in range(4)])
    # The 429 was retried by Scrapy's RetryMiddleware and then succeeded.
    assert result.statuses() == [200] * 4
    hits = server.hits("e.test")
    assert [hit.status for hit in hits].count(429) == 1, table(hits)
    rejected = next(hit for hit in hits if hit.status == 429)
    later = [hit.arrived for hit in hits if hit.arrived > rejected.arrived]
    # Nothing is sent for the second the server asked for (a request already
    # in flight when the 429 was sent may arrive right after it).
    assert all(t >= rejected.arrived + 1.0 - SLACK for t in later[1:]), table(hits)
    assert min(later[1:]) >= rejected.arrived + 1.0 - SLACK, table(hits)
    # Then backoff keeps at least its first step (0.1 s) between sends.
    assert_spaced([hit for hit in hits if hit.arrived >= min(later[1:])], 0.1)
    assert result.stats["throttlekit/backoff_signals"] == 1
    assert result.stats["throttlekit/response_status_count/429"] == 1


def test_a_429_body_that_states_the_wait_blocks_the_host(
    server: LocalServer, tmp_path: Path
) -> None:
    # Gemini's 429 has no Retry-After: its small JSON body says "retryDelay": "1s".
    # The middleware hands that body to the limiter, which blocks the host for it.
    body = {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "message": "You exceeded your current quota.",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}],
        }
    }
    refusal = Reply(
        status=429,
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json; charset=UTF-8"},
    )
    server.route("g.test", behaviour=Script(refusal, then=Reply(latency=0.02)))
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0,
        "BACKOFF_MIN_DELAY": 0.1,
        "BACKOFF_JITTER": 0,
    }
    result = crawl(server, tmp_path, settings, [f"g.test/{n}" for n in range(3)])
    assert result.statuses() == [200] * 3
    hits = server.hits("g.test")
    rejected = hits[0]
    assert rejected.status == 429, table(hits)
    assert hits[1].arrived >= rejected.arrived + 1.0 - SLACK, table(hits)


def test_timeouts_are_recorded_and_release_the_permit(server: LocalServer, tmp_path: Path) -> None:
    server.route("f.test", "/hang", Hang())
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0,
        "DOWNLOAD_TIMEOUT": 0.3,
        "RETRY_ENABLED": False,
        "BACKOFF_MIN_DELAY": 0.6,
        "BACKOFF_JITTER": 0,
    }
    urls: list[str | dict[str, Any]] = [{"url": "f.test/hang", "priority": 1}, "f.test/ok"]
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200]
    assert result.failures() == [TIMEOUT_ERROR]
    hits = server.hits("f.test")
    assert [hit.path for hit in hits] == ["/hang", "/ok"], table(hits)
    # The permit came back when the download timed out (concurrency 1), and
    # the timeout made the host back off: its first step, 0.6 s between sends
    # (more than the 0.3 s timeout, which alone would have allowed the send).
    assert hits[1].arrived - hits[0].arrived >= 0.6 - SLACK, table(hits)
    stats = result.stats
    assert stats[f"throttlekit/exception_count/{TIMEOUT_ERROR}"] == 1
    assert stats["throttlekit/backoff_signals"] == 1


# -- permits never leak ------------------------------------------------------------------------


def test_no_permit_leaks_past_later_middlewares(server: LocalServer, tmp_path: Path) -> None:
    settings = {
        **EXACT,
        "DOWNLOADER_MIDDLEWARES": {
            **MIDDLEWARE,
            "loopback.BounceMiddleware": 960,
            "loopback.IgnoreMiddleware": 970,
        },
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0,
    }
    urls: list[str | dict[str, Any]] = [
        {"url": "g.test/bounced", "meta": {"bounce": True}},
        {"url": "g.test/ignored", "meta": {"ignore": True}},
        "g.test/1",
        "g.test/2",
    ]
    result = crawl(server, tmp_path, settings, urls, sweep_interval=0.2)
    # The bounced request's permit was taken back when it left the downloader
    # (concurrency 1: nothing else could have been sent otherwise); the
    # ignored one released its permit in process_exception.
    assert sorted(hit.path for hit in server.hits("g.test")) == ["/1", "/2", "/bounced"]
    assert result.statuses() == [200] * 3
    assert result.failures() == ["scrapy.exceptions.IgnoreRequest"]
    assert result.stats["throttlekit/released_unfinished"] == 1
    assert "loopback.BounceMiddleware" in result.log
    assert "give ThrottlingMiddleware the highest order" in result.log


# -- AutoThrottle and configuration errors ------------------------------------------------------


def test_scrapys_newer_names_and_adaptive_in_a_crawl(server: LocalServer, tmp_path: Path) -> None:
    """``THROTTLING_SCOPE_CONCURRENCY`` is the ceiling under ``THROTTLING_ADAPTIVE``,
    whose delays not given are 0; the start-up line says so."""
    server.route("a.test", behaviour=Reply(latency=0.2))
    settings = {
        "DOWNLOADER_MIDDLEWARES": MIDDLEWARE,
        "DOWNLOAD_DELAY_JITTER": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "THROTTLING_SCOPE_CONCURRENCY": 3,
        "THROTTLING_ADAPTIVE": True,
    }
    result = crawl(server, tmp_path, settings, [f"a.test/{n}" for n in range(12)])
    assert result.statuses() == [200] * 12
    line = "per scope by default: concurrency 3, delay 0 s, slot delay 0 s, Adaptive"
    assert f"{line} (THROTTLING_ADAPTIVE) on: these are its ceiling" in result.log
    assert 1 < server.max_in_flight("a.test") <= 3


def test_autothrottle_settings_drive_throttlekits_controller(
    server: LocalServer, tmp_path: Path
) -> None:
    settings = {
        **EXACT,
        "AUTOTHROTTLE_ENABLED": True,
        "AUTOTHROTTLE_START_DELAY": 0.5,
        "AUTOTHROTTLE_MAX_DELAY": 2.0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "DOWNLOAD_DELAY": 0,
    }
    fixed = {"autothrottle_dont_adjust_delay": True}
    urls: list[str | dict[str, Any]] = [f"a.test/{n}" for n in range(3)]
    urls += [{"url": f"b.test/{n}", "meta": fixed} for n in range(3)]
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200] * 6
    assert "Scrapy's AutoThrottle extension has no effect" in result.log
    assert "per scope by default: concurrency 4, delay 0 s" in result.log
    assert "Adaptive (THROTTLING_ADAPTIVE) off" in result.log
    hits = server.hits()
    # throttlekit's AutoThrottle starts each scope at AUTOTHROTTLE_START_DELAY
    # and moves it halfway to the latency (0.05 s) with each response, as
    # Scrapy's does; DOWNLOAD_DELAY = 0 alone would send all three at once.
    gaps = server.gaps("a.test")
    assert gaps[0] >= (0.5 + 0.05) / 2 - SLACK, table(hits)
    assert gaps[1] < 0.45, table(hits)
    # autothrottle_dont_adjust_delay: the responses leave the delay alone.
    assert_spaced(server.hits("b.test"), 0.5)


def test_autothrottle_ignores_responses_that_were_not_timed(
    server: LocalServer, tmp_path: Path
) -> None:
    """As Scrapy's AutoThrottle: a response without download_latency (here made
    by a middleware after throttlekit's) does not move the delay."""
    settings = {
        **EXACT,
        "DOWNLOADER_MIDDLEWARES": {**MIDDLEWARE, "loopback.AnswerMiddleware": 960},
        "AUTOTHROTTLE_ENABLED": True,
        "AUTOTHROTTLE_START_DELAY": 0.6,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0,
    }
    answered = {"answer": True}
    urls: list[str | dict[str, Any]] = [
        {"url": f"a.test/answered{n}", "meta": answered, "priority": 1} for n in range(3)
    ]
    urls += ["a.test/0", "a.test/1"]
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200] * 5
    hits = server.hits("a.test")
    assert [hit.path for hit in hits] == ["/0", "/1"], table(hits)
    # Still 0.6 s after three untimed responses (timed from the grant they
    # would have halved it three times); the first real response (0.05 s)
    # takes it halfway down: 0.325 s.
    assert hits[1].arrived - hits[0].arrived >= 0.325 - SLACK, table(hits)


def test_a_reactor_without_asyncio_is_refused(server: LocalServer, tmp_path: Path) -> None:
    settings = {**EXACT, "TWISTED_REACTOR": "twisted.internet.selectreactor.SelectReactor"}
    result = crawl(server, tmp_path, settings, ["a.test/1"])
    assert "the crawl cannot start: throttlekit's Scrapy middleware needs asyncio" in result.log
    assert "Traceback" not in result.log
    assert not any(key.startswith("throttlekit/") for key in result.stats), result.stats
    assert server.hits() == []


# -- download_slot, dont_throttle, misspelt and bad settings ---------------------------------------


def test_download_slot_meta_is_the_requests_scope(server: LocalServer, tmp_path: Path) -> None:
    # The first request to c.test fails with a 500 that Scrapy retries; the
    # retry carries the download slot Scrapy's downloader gave the first
    # attempt, which must not move it out of its host's scope.
    server.route("c.test", "/0", Script(Reply(status=500), then=Reply()))
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "DOWNLOAD_DELAY": 0,
        "THROTTLING_SCOPES": {
            "shared": {"concurrency": 1, "delay": 0.3},
            scope(server, "c.test"): {"concurrency": 1, "delay": 0.4},
        },
    }
    shared = {"download_slot": "shared"}
    urls: list[str | dict[str, Any]] = [
        {"url": f"{host}.test/{n}", "meta": shared} for n in range(3) for host in "ab"
    ]
    urls += [f"c.test/{n}" for n in range(3)]
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200] * 9

    # a.test and b.test share the scope "shared": one at a time, 0.3 s apart.
    hits = sorted(server.hits("a.test") + server.hits("b.test"), key=lambda hit: hit.arrived)
    for earlier, later in itertools.pairwise(hits):
        assert earlier.finished is not None
        assert later.arrived >= earlier.finished, table(hits)
    assert_spaced(hits, 0.3)

    # c.test, retry included, stays in its host's scope: 0.4 s apart.
    hits = server.hits("c.test")
    assert [hit.status for hit in hits].count(500) == 1, table(hits)
    assert len(hits) == 4, table(hits)
    assert_spaced(hits, 0.4)


def test_dont_throttle_skips_scopes_but_not_concurrent_requests(
    server: LocalServer, tmp_path: Path
) -> None:
    server.route("a.test", behaviour=Reply(latency=0.2))
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS": 2,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 1.0,
    }
    free = {"dont_throttle": True}
    urls: list[str | dict[str, Any]] = [{"url": f"a.test/free{n}", "meta": free} for n in range(6)]
    urls += ["a.test/t0", "a.test/t1"]
    result = crawl(server, tmp_path, settings, urls)
    assert result.statuses() == [200] * 8
    hits = server.hits("a.test")
    free_hits = [hit for hit in hits if hit.path.startswith("/free")]
    # Six exempt requests in about three rounds of 0.2 s, not one a second ...
    assert max(h.arrived for h in free_hits) - min(h.arrived for h in free_hits) < 1.0, table(hits)
    # ... yet never more than CONCURRENT_REQUESTS = 2 in flight in all.
    assert server.max_in_flight("a.test") == 2, table(hits)
    # The throttled ones keep DOWNLOAD_DELAY between them.
    assert_spaced([hit for hit in hits if hit.path.startswith("/t")], 1.0)


BAD_SETTING_SPIDER = """
import scrapy


class Spider(scrapy.Spider):
    name = "bad-setting"
    custom_settings = {
        "DOWNLOADER_MIDDLEWARES": {"throttlekit.adapters.scrapy.ThrottlingMiddleware": 950},
        "TELNETCONSOLE_ENABLED": False,
    }

    async def start(self):
        yield scrapy.Request("http://127.0.0.1:9/never")
"""


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "DOWNLOAD_DELAY=-1",
            "invalid throttling settings: DOWNLOAD_DELAY: delay must be a finite number >= 0, "
            "got -1.0",
        ),
        (  # a misspelt name, as on the command line and in Limiter.from_settings
            "DOWNLOAD_DELAY_PERSLOT=0.5",
            "unknown setting DOWNLOAD_DELAY_PERSLOT: did you mean DOWNLOAD_DELAY_PER_SLOT?",
        ),
    ],
    ids=["bad-value", "misspelt"],
)
@pytest.mark.parametrize("nolog", [False, True], ids=["log", "nolog"])
def test_a_bad_setting_stops_the_crawl_with_one_line(
    tmp_path: Path, nolog: bool, setting: str, message: str
) -> None:
    spider = tmp_path / "spider.py"
    spider.write_text(BAD_SETTING_SPIDER)
    command = [sys.executable, "-m", "scrapy", "runspider", str(spider), "-s", setting]
    if nolog:
        command.append("--nolog")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=False
    )
    output = process.stdout + process.stderr
    if SCRAPY_2_14:  # (before, runspider exits with 0 when a crawl cannot start)
        assert process.returncode == 1, output
    assert "Traceback" not in output, output
    message = f"throttlekit: the crawl cannot start: {message}"
    if nolog:
        assert output.strip() == message
    else:
        lines = [line for line in output.splitlines() if "cannot start" in line]
        assert len(lines) == 1, output
        assert lines[0].endswith(f"[throttlekit.adapters.scrapy] CRITICAL: {message}"), output


# -- building the limiter from Scrapy settings (in process, no crawl) ---------------------------


def test_limiter_from_scrapy_settings() -> None:
    settings = Settings(
        {
            "CONCURRENT_REQUESTS": 32,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 3,
            "DOWNLOAD_DELAY": 0.5,
            "DOWNLOAD_DELAY_JITTER": 0.2,
            # as given on the command line: -s THROTTLING_SCOPES='{...}'
            "THROTTLING_SCOPES": '{"api.example": {"concurrency": 8, "delay": 0.1}}',
            "THROTTLING_RESOLVER": "throttlekit.scopes.by_registrable_domain",
            "BACKOFF_MAX_DELAY": 30,
        }
    )
    limiter = limiter_from_settings(settings)
    assert limiter.default.concurrency == 3
    assert limiter.default.delay == 0.5
    assert limiter.default.jitter == (-0.2, 0.2)
    assert limiter.default.backoff is not None
    assert limiter.default.backoff.max_delay == 30.0
    assert limiter.policy("api.example").concurrency == 8
    assert limiter.policy("api.example").delay == 0.1
    assert limiter.resolver is scopes.by_registrable_domain
    assert limiter.statistics().concurrency == 32


def test_scrapy_jitter_settings() -> None:
    assert limiter_from_settings(Settings()).default.jitter == (-0.5, 0.5)
    wide = Settings({"DOWNLOAD_DELAY_JITTER": 1.5})
    assert limiter_from_settings(wide).default.jitter == (-0.99, 1.5)
    # The deprecated RANDOMIZE_DOWNLOAD_DELAY wins when set at a higher priority.
    old = Settings({"RANDOMIZE_DOWNLOAD_DELAY": False})
    assert limiter_from_settings(old).default.jitter == (0.0, 0.0)
    with pytest.raises(ValueError, match="DOWNLOAD_DELAY_JITTER"):
        limiter_from_settings(Settings({"DOWNLOAD_DELAY_JITTER": "lots"}))


def test_scrapys_newer_names_and_download_slots() -> None:
    """``THROTTLING_SCOPE_CONCURRENCY`` replaces ``CONCURRENT_REQUESTS_PER_DOMAIN``
    (unless that is set at a higher priority), ``THROTTLING_SCOPE_LIMIT`` caps the
    scopes kept, and ``DOWNLOAD_SLOTS`` entries are scopes under ``THROTTLING_SCOPES``."""
    settings = Settings(
        {
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "THROTTLING_SCOPE_CONCURRENCY": 5,
            "THROTTLING_SCOPE_LIMIT": 1000,
            "DOWNLOAD_SLOTS": {"a.test": {"concurrency": 3, "delay": 0.5}, "b.test": {"delay": 2}},
            "THROTTLING_SCOPES": {"b.test": {"delay": 0.25}},
        }
    )
    limiter = limiter_from_settings(settings)
    assert limiter.default.concurrency == 5
    assert (limiter.policy("a.test").concurrency, limiter.policy("a.test").delay) == (3, 0.5)
    assert limiter.policy("b.test").delay == 0.25
    settings.set("CONCURRENT_REQUESTS_PER_DOMAIN", 4, priority="cmdline")
    assert limiter_from_settings(settings).default.concurrency == 4
    assert limiter_from_settings(Settings()).default.concurrency == 8  # Scrapy's default
    with pytest.raises(ValueError, match="THROTTLING_SCOPE_LIMIT"):
        limiter_from_settings(Settings({"THROTTLING_SCOPE_LIMIT": 0}))
    json_slots = Settings({"DOWNLOAD_SLOTS": '{"a.test": {"delay": 3}}'})
    assert limiter_from_settings(json_slots).policy("a.test").delay == 3.0


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"THROTTLING_RESOLVER": "throttlekit.scopes.nothing"}, ValueError, "THROTTLING_RESOLVER"),
        ({"THROTTLING_RESOLVER": 42}, TypeError, "THROTTLING_RESOLVER"),
        ({"THROTTLING_SCOPES": "{not json"}, ValueError, "THROTTLING_SCOPES"),
        ({"DOWNLOAD_DELAY": "soon"}, ValueError, "DOWNLOAD_DELAY"),
        ({"THROTTLING_SCOPES": {"a": {"speed": 1}}}, ValueError, "speed"),
    ],
)
def test_bad_settings_name_the_setting(
    settings: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        limiter_from_settings(Settings(settings))


def crawler_with(settings: dict[str, Any]) -> Crawler:
    crawler = Crawler(Spider, settings)
    crawler.stats = MemoryStatsCollector(crawler)
    return crawler


@pytest.mark.skipif(not SCRAPY_2_14, reason="in-process crawlers need Scrapy >= 2.14")
@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
@pytest.mark.anyio
async def test_middleware_configuration(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(NotConfigured):
        ThrottlingMiddleware.from_crawler(crawler_with({"THROTTLING_ENABLED": False}))
    with pytest.raises(ValueError, match="THROTTLING_MAX_WAITING"):
        ThrottlingMiddleware(crawler_with({"THROTTLING_MAX_WAITING": -1}))

    middleware = ThrottlingMiddleware(crawler_with({"CONCURRENT_REQUESTS": 8}))
    assert middleware.max_waiting == 32
    assert middleware.limiter.statistics().concurrency == 8

    shared = Limiter(default=ScopePolicy(concurrency=2))
    factory = f"{__name__}.shared_limiter"
    SHARED.append(shared)
    middleware = ThrottlingMiddleware(crawler_with({"THROTTLING_LIMITER": factory}))
    assert middleware.limiter is shared
    with pytest.raises(TypeError, match="THROTTLING_LIMITER"):
        ThrottlingMiddleware(crawler_with({"THROTTLING_LIMITER": lambda crawler: "limiter"}))

    with caplog.at_level(logging.WARNING, logger="throttlekit.adapters.scrapy"):
        middleware = ThrottlingMiddleware(
            crawler_with({"AUTOTHROTTLE_ENABLED": True, "DOWNLOAD_SLOTS": {"a.test": {"delay": 2}}})
        )
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "AUTOTHROTTLE_ENABLED" in messages
    assert middleware.limiter.policy("a.test").delay == 2.0  # DOWNLOAD_SLOTS: a scope


@pytest.mark.skipif(not SCRAPY_2_14, reason="in-process crawlers need Scrapy >= 2.14")
@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
@pytest.mark.anyio
async def test_start_up_errors_are_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.CRITICAL, logger="throttlekit.adapters.scrapy"):
        with pytest.raises(ValueError, match="THROTTLING_MAX_WAITING"):
            ThrottlingMiddleware.from_crawler(crawler_with({"THROTTLING_MAX_WAITING": -1}))
        with pytest.raises(ValueError, match="no Redis URL"):
            ThrottlingMiddleware.from_crawler(
                crawler_with({"THROTTLING_LIMITER": f"{__name__}.broken_limiter"})
            )
    own, project = (record.getMessage() for record in caplog.records)
    assert own == (
        "throttlekit: the crawl cannot start: THROTTLING_MAX_WAITING must be >= 0, got -1"
    )
    # An error of the project's code says where it was raised.
    assert project.startswith("throttlekit: the crawl cannot start: no Redis URL configured")
    assert f"(raised at {__file__}:" in project


def broken_limiter(crawler: Crawler) -> Limiter:
    """A THROTTLING_LIMITER factory that fails."""
    raise ValueError("no Redis URL configured")


SHARED: list[Limiter] = []


def shared_limiter(crawler: Crawler) -> Limiter:
    """A THROTTLING_LIMITER factory (the limiter a test put in SHARED)."""
    return SHARED[-1]


# -- optional dependency ----------------------------------------------------------------------

BLOCK_SCRAPY = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "scrapy" or name.startswith("scrapy."):
            raise ImportError(f"No module named {name!r} (blocked)")
        return None

sys.meta_path.insert(0, Block())
import throttlekit
assert "scrapy" not in sys.modules
try:
    import throttlekit.adapters.scrapy
except ImportError as exc:
    print(exc)
else:
    raise SystemExit("imported without scrapy")
"""


def test_import_without_scrapy_names_the_extra() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_SCRAPY], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "throttlekit-http[scrapy]"' in result.stdout


def test_closing_the_spider_drops_requests_still_waiting(
    server: LocalServer, tmp_path: Path
) -> None:
    """CLOSESPIDER_TIMEOUT ends the crawl on time: requests still waiting for
    their host's delay are dropped, not sent one per delay after the close."""
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 1.0,
        "CLOSESPIDER_TIMEOUT": 2,
    }
    started = time.monotonic()
    result = crawl(server, tmp_path, settings, [f"a.test/{n}" for n in range(30)])
    elapsed = time.monotonic() - started
    hits = server.hits("a.test")
    # About one request a second until the close at 2 s; without dropping the
    # waiters the crawl would take the full 30 s.
    assert len(hits) <= 5, table(hits)
    assert elapsed < 20, elapsed
    assert result.stats["throttlekit/dropped_on_close"] >= 20
    assert result.stats.get("finish_reason") == "closespider_timeout"


def test_requests_dropped_at_close_resume_with_jobdir(server: LocalServer, tmp_path: Path) -> None:
    """With JOBDIR, the requests dropped at close are saved and sent by the resumed job."""
    settings = {
        **EXACT,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0.5,
        "JOBDIR": str(tmp_path / "job"),
    }
    urls: list[str | dict[str, Any]] = [f"a.test/{n}" for n in range(12)]
    first = crawl(server, tmp_path, {**settings, "CLOSESPIDER_TIMEOUT": 1}, urls)
    sent_first = len(server.hits("a.test"))
    assert sent_first < 12
    assert first.stats["throttlekit/requeued_on_close"] >= 12 - sent_first - 1
    crawl(server, tmp_path, settings, [])  # the resumed job: only what JOBDIR kept
    paths = sorted(hit.path for hit in server.hits("a.test"))
    assert paths == sorted(f"/{n}" for n in range(12)), paths  # every page once: none lost


# -- a scope that stalls (max_stall) --------------------------------------------------------


@pytest.mark.parametrize("form", ["THROTTLING_MAX_STALL", "THROTTLING_SCOPES"])
def test_requests_of_a_stalled_host_are_dropped(
    server: LocalServer, tmp_path: Path, form: str
) -> None:
    """A host that answers 429 with Retry-After: 3600 is given up on at once:
    its waiting requests and the retry of the 429 are dropped with a stat, the
    other host is crawled as usual, and the crawl does not wait for the block."""
    block = Reply(status=429, headers={"Retry-After": "3600"}, latency=0.05)
    server.route("a.test", behaviour=Script(block, then=Reply(latency=0.05)))
    stall = {"THROTTLING_MAX_STALL": 5}
    if form == "THROTTLING_SCOPES":  # one scope only, as JSON text (as with -s)
        stall = {"THROTTLING_SCOPES": json.dumps({scope(server, "a.test"): {"max_stall": 5}})}
    settings = {
        **EXACT,
        **stall,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0.1,
    }
    started = time.monotonic()
    result = crawl(
        server, tmp_path, settings, [f"{host}.test/{n}" for n in range(6) for host in "ab"]
    )
    elapsed = time.monotonic() - started
    # Retry-After is capped at BACKOFF_MAX_DELAY (300 s): far beyond max_stall.
    assert elapsed < 20, elapsed
    hits = server.hits("a.test")
    assert [hit.status for hit in hits] == [429], table(hits)
    # b.test: every page, at its own pace.
    assert result.statuses() == [200] * 6
    assert_spaced(server.hits("b.test"), 0.1)
    # a.test: the five requests that waited behind the 429, and its retry.
    dropped = [o for o in result.outcomes if "exception" in o]
    assert [o["exception"] for o in dropped] == ["scrapy.exceptions.IgnoreRequest"] * 6
    assert all(f"a.test:{server.port}" in o["url"] for o in dropped)
    assert result.stats["throttlekit/dropped_on_stall"] == 6
    assert result.stats["throttlekit/stalled_scopes"] == 1
    assert result.stats["retry/count"] == 1
    assert result.stats.get("finish_reason") == "finished"
    lines = [line for line in result.log.splitlines() if "stalled:" in line]
    assert len(lines) == 1, lines
    assert f"scope a.test:{server.port} stalled: the server asked to wait" in lines[0]
    assert "cannot send for 300 s, longer than its max_stall of 5 s" in lines[0]


@pytest.mark.skipif(not SCRAPY_2_14, reason="in-process crawlers need Scrapy >= 2.14")
def test_a_stalled_scope_is_reported_once_per_stall(caplog: pytest.LogCaptureFixture) -> None:
    """The middleware in virtual time: each stall of a scope is one INFO line and
    one ``stalled_scopes``; every dropped request counts in ``dropped_on_stall``."""
    from scrapy.exceptions import IgnoreRequest
    from scrapy.http import Request, Response

    from throttlekit import ScopeStalled
    from throttlekit.testing import VirtualEventLoop

    settings = {
        "THROTTLING_MAX_STALL": 5,
        "DOWNLOAD_DELAY": 0,
        "DOWNLOAD_DELAY_PER_SLOT": 0,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    }
    blocked = {"Retry-After": "30"}

    async def main() -> None:
        middleware = ThrottlingMiddleware(crawler_with(settings))
        stats = middleware.stats

        async def send(url: str, status: int = 200, headers: Any = None) -> None:
            request = Request(url)
            await middleware.process_request(request)
            response = Response(url, status=status, headers=headers, request=request)
            await middleware.process_response(request, response)

        async def dropped(url: str) -> ScopeStalled:
            with pytest.raises(IgnoreRequest, match=r"a\.test' stalled") as caught:
                await middleware.process_request(Request(url))
            assert isinstance(caught.value.__cause__, ScopeStalled)
            return caught.value.__cause__

        await send("http://a.test/1", 429, blocked)
        first = await dropped("http://a.test/2")
        assert first.wait == pytest.approx(30.0)
        await dropped("http://a.test/3")
        await send("http://b.test/1")  # another scope: not affected
        assert stats.get_value("throttlekit/dropped_on_stall") == 2
        assert stats.get_value("throttlekit/stalled_scopes") == 1
        await asyncio.sleep(31.0)  # the scope reopens: requests go again
        await send("http://a.test/4", 429, blocked)
        await dropped("http://a.test/5")  # a new stall
        assert stats.get_value("throttlekit/dropped_on_stall") == 3
        assert stats.get_value("throttlekit/stalled_scopes") == 2
        assert stats.get_value("throttlekit/request_count") == 3
        assert middleware.limiter.statistics().in_flight == 0

    with caplog.at_level(logging.DEBUG, logger="throttlekit.adapters.scrapy"):
        loop = VirtualEventLoop()
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [message.split(":")[1] for message in infos] == [" scope a.test stalled"] * 2
    debugs = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("Dropped <GET http://a.test/" in message for message in debugs) == 3
