"""Controllers: Backoff, rate-limit headers in the loop, AutoThrottle, Rampup, quotas, Crawl-Delay.

The closed-loop tests run the real :class:`throttlekit.Limiter` on trio's
virtual clock against small simulated servers, so minutes of traffic take
well under a second and every time is exact.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections import deque
from typing import Any

import anyio
import attrs
import pytest

import throttlekit
from throttlekit import (
    AutoThrottle,
    Backoff,
    BaseController,
    Feedback,
    Limiter,
    Rampup,
    ScopePolicy,
    ScopeView,
)
from throttlekit._autothrottle import autothrottle_delay
from throttlekit._backoff import low_remaining_pace
from throttlekit._knock import KNOCK_DRIFT, Knock
from throttlekit._ledger import ScopeLedger
from throttlekit.headers import parse

URL = "https://api.test/items"
SCOPE = "api.test"


@pytest.fixture
def anyio_backend(trio_virtual: Any) -> Any:
    return trio_virtual


# -- simulated servers -----------------------------------------------------------


class QuotaServer:
    """Accepts ``rate`` requests per sliding second; above it answers 429 with Retry-After."""

    def __init__(self, rate: int, retry_after: float = 2.0, latency: float = 0.05) -> None:
        self.rate = rate
        self.retry_after = retry_after
        self.latency = latency
        self.accepted: deque[float] = deque()

    def handle(self, now: float, in_flight: int) -> tuple[int, dict[str, str], float]:
        while self.accepted and self.accepted[0] <= now - 1.0:
            self.accepted.popleft()
        if len(self.accepted) >= self.rate:
            return 429, {"Retry-After": f"{self.retry_after:g}"}, self.latency
        self.accepted.append(now)
        return 200, {}, self.latency


class LoadServer:
    """Latency grows with the requests in flight: ``base * (1 + in_flight)``."""

    def __init__(self, base: float = 0.2) -> None:
        self.base = base

    def handle(self, now: float, in_flight: int) -> tuple[int, dict[str, str], float]:
        return 200, {}, self.base * (1 + in_flight)


class FastErrorServer:
    """Above ``rate`` requests per sliding second answers 429 fast; 200s are slow."""

    def __init__(self, rate: int = 2, ok_latency: float = 0.5, error_latency: float = 0.005):
        self.rate = rate
        self.ok_latency = ok_latency
        self.error_latency = error_latency
        self.accepted: deque[float] = deque()

    def handle(self, now: float, in_flight: int) -> tuple[int, dict[str, str], float]:
        while self.accepted and self.accepted[0] <= now - 1.0:
            self.accepted.popleft()
        if len(self.accepted) >= self.rate:
            return 429, {}, self.error_latency
        self.accepted.append(now)
        return 200, {}, self.ok_latency


@attrs.define
class Exchange:
    sent: float
    received: float
    status: int
    headers: dict[str, str]


async def crawl(
    limiter: Limiter, server: Any, *, duration: float, workers: int, url: str = URL
) -> list[Exchange]:
    """Workers send requests through ``limiter`` to ``server`` for ``duration`` seconds.

    Times in the log are relative to the start of the crawl.
    """
    log: list[Exchange] = []
    in_flight = 0
    start = anyio.current_time()

    async def worker() -> None:
        nonlocal in_flight
        while anyio.current_time() - start < duration:
            async with limiter.acquire(url) as permit:
                sent = anyio.current_time() - start
                if sent >= duration:
                    return
                status, headers, latency = server.handle(sent, in_flight)
                in_flight += 1
                try:
                    await anyio.sleep(latency)
                finally:
                    in_flight -= 1
                permit.record(status=status, headers=headers)
                log.append(Exchange(sent, anyio.current_time() - start, status, headers))

    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)
    return log


# -- AutoThrottle: number for number with Scrapy -----------------------------------

# (old delay, latency, target concurrency, min delay, max delay, status) -> new delay
AUTOTHROTTLE_CASES = [
    (5.0, 1.0, 1.0, 0.0, 60.0, 200, 3.0),  # mean of old and target
    (1.0, 3.0, 1.0, 0.0, 60.0, 200, 3.0),  # never below the target
    (5.0, 1.0, 2.0, 0.0, 60.0, 200, 2.75),  # target = latency / N
    (5.0, 1.0, 0.5, 0.0, 60.0, 200, 3.5),  # N < 1 is more conservative
    (50.0, 100.0, 1.0, 0.0, 60.0, 200, 60.0),  # clamped to max
    (0.2, 0.1, 1.0, 1.0, 60.0, 200, 1.0),  # clamped to min (DOWNLOAD_DELAY)
    (0.0, 0.0, 1.0, 0.0, 60.0, 200, 0.0),
    (5.0, 1.0, 1.0, 0.0, 60.0, 500, 5.0),  # non-200 may not lower it
    (5.0, 1.0, 1.0, 0.0, 60.0, 429, 5.0),
    (1.0, 3.0, 1.0, 0.0, 60.0, 503, 3.0),  # ...but may raise it
    (3.0, 3.0, 1.0, 0.0, 60.0, 404, 3.0),  # equal: unchanged
    (2.0, 1.0, 1.0, 0.0, 1.5, 200, 1.5),  # max below old
    (10.0, 30.0, 3.0, 0.0, 60.0, 200, 10.0),  # target == old
    (0.5, 0.25, 1.0, 0.3, 60.0, 301, 0.5),  # redirect: clamp to min would lower: kept
    (4.0, 0.4, 4.0, 0.0, 60.0, 200, 2.05),
]


@pytest.mark.parametrize(
    ("old", "latency", "target", "minimum", "maximum", "status", "expected"), AUTOTHROTTLE_CASES
)
def test_autothrottle_delay_rules(
    old: float,
    latency: float,
    target: float,
    minimum: float,
    maximum: float,
    status: int,
    expected: float,
) -> None:
    new = autothrottle_delay(
        old, latency, status, target_concurrency=target, min_delay=minimum, max_delay=maximum
    )
    assert new == pytest.approx(expected)


@pytest.mark.parametrize(
    ("old", "latency", "target", "minimum", "maximum", "status", "expected"), AUTOTHROTTLE_CASES
)
def test_autothrottle_matches_scrapy(
    old: float,
    latency: float,
    target: float,
    minimum: float,
    maximum: float,
    status: int,
    expected: float,
) -> None:
    """Scrapy's own extension, fed the same numbers, computes the same delay."""
    scrapy_throttle = pytest.importorskip("scrapy.extensions.throttle")
    from scrapy.http import Response

    extension = object.__new__(scrapy_throttle.AutoThrottle)
    extension.target_concurrency = target
    extension.mindelay = minimum
    extension.maxdelay = maximum

    class Slot:
        delay = old

    slot = Slot()
    extension._adjust_delay(slot, latency, Response("https://a.test/", status=status))
    ours = autothrottle_delay(
        old, latency, status, target_concurrency=target, min_delay=minimum, max_delay=maximum
    )
    assert ours == pytest.approx(slot.delay)


@pytest.mark.parametrize(
    ("policy_delay", "start_delay", "expected"),
    [(0.0, 5.0, 5.0), (10.0, 5.0, 10.0), (1.0, 0.0, 1.0), (0.0, 0.0, 0.0)],
)
def test_autothrottle_start_delay(policy_delay: float, start_delay: float, expected: float) -> None:
    policy = ScopePolicy(delay=policy_delay, autothrottle=AutoThrottle(start_delay=start_delay))
    ledger = ScopeLedger("a.test", policy)
    assert ledger.delay == expected


def test_autothrottle_debug_line_and_dont_adjust(caplog: pytest.LogCaptureFixture) -> None:
    policy = ScopePolicy(delay=0.0, autothrottle=AutoThrottle(debug=True), backoff=None)
    ledger = ScopeLedger("example.com", policy)
    ledger.in_flight = 1
    state = ledger.controllers[0]
    with caplog.at_level(logging.INFO, logger="throttlekit.autothrottle"):
        state.on_feedback(ledger, Feedback(status=200, latency=1.0, size=1234), 0.0)
    assert caplog.messages == [
        "slot: example.com | conc: 1 | delay: 3000 ms (-2000) | "
        "latency: 1000 ms | size:  1234 bytes"
    ]
    state.on_feedback(ledger, Feedback(status=200, latency=0.1, adjust_delay=False), 1.0)
    assert state.delay == 3.0  # autothrottle_dont_adjust_delay: ignored
    state.on_feedback(ledger, Feedback(exception=TimeoutError()), 2.0)
    assert state.delay == 3.0  # no response, no latency: ignored


@pytest.mark.anyio
async def test_autothrottle_debug_conc_counts_the_answered_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As Scrapy's ``conc`` (the slot's transfers, the answered one included),
    also when the limiter is driven directly and the response is recorded
    after the permit was given back."""
    policy = ScopePolicy(
        concurrency=4, delay=0.0, autothrottle=AutoThrottle(debug=True, start_delay=0.0)
    )
    limiter = Limiter(default=policy)

    async def fetch(hold: float) -> None:
        async with limiter.acquire(URL) as permit:
            await anyio.sleep(hold)
            permit.record(status=200, latency=0.1)

    with caplog.at_level(logging.INFO, logger="throttlekit.autothrottle"):
        async with anyio.create_task_group() as tg:
            for hold in (1.0, 2.0, 3.0):
                tg.start_soon(fetch, hold)
        async with limiter.acquire(URL) as permit:
            pass
        permit.record(status=200, latency=0.1)
    concs = [re.search(r"conc: *(\d+)", message).group(1) for message in caplog.messages]
    assert concs == ["3", "2", "1", "1"]


def test_autothrottle_settings() -> None:
    limiter = Limiter.from_settings(
        {
            "AUTOTHROTTLE_ENABLED": True,
            "AUTOTHROTTLE_START_DELAY": 2.0,
            "AUTOTHROTTLE_MAX_DELAY": 30.0,
            "AUTOTHROTTLE_TARGET_CONCURRENCY": 2.0,
            "DOWNLOAD_DELAY": 0.5,
        }
    )
    assert limiter.default.autothrottle == AutoThrottle(
        start_delay=2.0, max_delay=30.0, target_concurrency=2.0
    )
    with pytest.raises(ValueError, match="AUTOTHROTTLE_TARGET_CONCURRENCY"):
        Limiter.from_settings(
            {"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_TARGET_CONCURRENCY": 0.0}
        )


# -- Backoff unit behaviour -------------------------------------------------------


def _backoff_ledger(**backoff: Any) -> ScopeLedger:
    """A ledger with its backoff state created up front (normally the first signal does it)."""
    ledger = ScopeLedger(SCOPE, ScopePolicy(concurrency=4, delay=0.0, backoff=Backoff(**backoff)))
    assert ledger.controllers == ()  # lazy: nothing until a signal or rate-limit header
    ledger.on_feedback(Feedback(status=200, rate_limit=_info(retry_after=0.0)), -1.0)
    assert len(ledger.controllers) == 1
    return ledger


def test_backoff_burst_from_in_flight_requests_is_one_step() -> None:
    ledger = _backoff_ledger()
    for _ in range(10):  # ten parallel requests, all sent at t=0, all 429
        ledger.controllers[0].on_feedback(ledger, Feedback(status=429, sent_at=0.0), 0.5)
    ledger.refresh()
    assert ledger.delay == 1.0  # min_delay: one step, not 2 ** 10
    ledger.controllers[0].on_feedback(ledger, Feedback(status=429, sent_at=1.0), 1.5)
    ledger.refresh()
    assert ledger.delay == 2.0  # a request sent after the step is a new signal


@pytest.mark.parametrize("status", [429, 502, 503, 504, 520, 521, 522, 523, 524])
def test_backoff_default_codes(status: int) -> None:
    assert Backoff().is_signal(Feedback(status=status))


@pytest.mark.parametrize("status", [200, 301, 404, 500, 501])
def test_backoff_not_signals(status: int) -> None:
    assert not Backoff().is_signal(Feedback(status=status))


def test_backoff_exceptions() -> None:
    httpx = pytest.importorskip("httpx")
    aiohttp = pytest.importorskip("aiohttp")
    backoff = Backoff()
    assert backoff.is_signal(Feedback(exception=TimeoutError()))
    assert backoff.is_signal(Feedback(exception=ConnectionResetError()))
    assert backoff.is_signal(Feedback(exception=httpx.ReadTimeout("slow")))
    assert backoff.is_signal(Feedback(exception=httpx.ConnectError("refused")))
    assert backoff.is_signal(Feedback(exception=aiohttp.ServerTimeoutError()))
    assert not backoff.is_signal(Feedback(exception=ValueError("parse error")))
    custom = Backoff(exceptions=["builtins.KeyError", "no.such.Module"], http_codes=[418])
    assert custom.is_signal(Feedback(exception=KeyError("x")))
    assert custom.is_signal(Feedback(status=418))
    assert not custom.is_signal(Feedback(status=429))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"delay_factor": 1.0}, "delay_factor"),
        ({"min_delay": -1}, "min_delay"),
        ({"min_delay": 0}, "min_delay"),
        ({"max_delay": 0}, "max_delay"),
        ({"min_delay": 10, "max_delay": 5}, "min_delay"),
        ({"concurrency_factor": 1.5}, "concurrency_factor"),
        ({"window": math.nan}, "window"),
        ({"http_codes": [42]}, "http_codes"),
        ({"exceptions": [42]}, "exceptions"),
        ({"jitter": 2.0}, "jitter"),
    ],
)
def test_backoff_invalid_config(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises((ValueError, TypeError), match=field):
        Backoff(**kwargs)


def test_backoff_concurrency_shrinks_at_max_delay_and_recovers() -> None:
    # Each 503 steps (error_share=0): the helper's first response went through.
    ledger = _backoff_ledger(max_delay=4.0, window=10.0, error_share=0.0)
    state = ledger.controllers[0]
    now = 0.0
    for _ in range(3):  # 1 -> 2 -> 4 (max)
        now += 1.0
        state.on_feedback(ledger, Feedback(status=503, sent_at=now), now + 0.1)
    ledger.refresh()
    assert (ledger.delay, ledger.concurrency) == (4.0, 4)
    now += 1.0
    state.on_feedback(ledger, Feedback(status=503, sent_at=now), now + 0.1)
    ledger.refresh()
    assert (ledger.delay, ledger.concurrency) == (4.0, 2)
    now += 1.0
    state.on_feedback(ledger, Feedback(status=503, sent_at=now), now + 0.1)
    ledger.refresh()
    assert ledger.concurrency == 1
    # Quiet windows: concurrency comes back first, then the delay steps down,
    # pausing just above the delay that drew the last signals (2 s), then on.
    delays = []
    for _ in range(40):
        now += 10.0
        state.on_send(ledger, now)
        ledger.refresh()
        delays.append(ledger.delay)
    assert ledger.concurrency == 4
    assert delays == sorted(delays, reverse=True)
    assert 2.0 < delays[8] < 2.2  # settled near the edge for a while
    assert delays[-1] == 0.0
    assert state.level == 0


def test_retry_after_blocks_and_is_capped() -> None:
    ledger = _backoff_ledger(max_delay=30.0)
    state = ledger.controllers[0]
    state.on_feedback(ledger, Feedback(status=429, rate_limit=_info(retry_after=7.0)), 100.0)
    ledger.refresh()
    assert ledger.blocked_until == 107.0
    assert ledger.ready_at(1.0, 100.0) == 107.0
    state.on_feedback(ledger, Feedback(status=429, rate_limit=_info(retry_after=3600.0)), 101.0)
    ledger.refresh()
    assert ledger.blocked_until == 131.0  # capped at max_delay


def test_remaining_zero_blocks_until_reset_and_low_remaining_paces() -> None:
    ledger = _backoff_ledger()
    state = ledger.controllers[0]
    state.on_feedback(ledger, Feedback(status=200, rate_limit=_info(remaining=0, reset=12.0)), 50.0)
    ledger.refresh()
    assert ledger.blocked_until == 62.0
    ledger = _backoff_ledger()
    state = ledger.controllers[0]
    state.on_feedback(
        ledger, Feedback(status=200, rate_limit=_info(remaining=5, limit=100, reset=10.0)), 0.0
    )
    ledger.refresh()
    assert ledger.delay == 2.0  # 5 requests left for 10 s: one every 2 s
    state.on_send(ledger, 10.5)  # the window reset
    ledger.refresh()
    assert ledger.delay == 0.0


def test_a_token_buckets_low_remaining_is_paced_at_its_refill() -> None:
    # OpenAI's reset is when the bucket is full again: 55 of 60 requests
    # spent refill in 55 s, one a second; the 5 left are not spread over 55 s.
    ledger = _backoff_ledger()
    state = ledger.controllers[0]
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-reset-requests": "55s",
    }
    info = parse(headers, now=1_700_000_000.0)
    state.on_feedback(ledger, Feedback(status=200, rate_limit=info), 0.0)
    ledger.refresh()
    assert ledger.delay == pytest.approx(1.0)
    # The same numbers from a window's reset spread what is left over it.
    assert low_remaining_pace(_info(remaining=5, limit=60, reset=55.0, interval=11.0)) == 11.0


def _info(**fields: Any) -> Any:
    from throttlekit.headers import RateLimitInfo

    return RateLimitInfo(**fields)


def test_statistics_explain_backoff(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        limiter = Limiter(default=ScopePolicy(concurrency=2, delay=0.0))
        with caplog.at_level(logging.DEBUG, logger="throttlekit"):
            async with limiter.acquire(URL) as permit:
                permit.record(status=429)
        stats = limiter.statistics().scopes[SCOPE]
        assert stats.backoff_level == 1
        assert stats.last_signal == "429"
        assert stats.delay == 1.0
        assert stats.reason == "backoff level 1 after 429"
        assert any("backoff after 429, delay 0.000 -> 1.000 s" in m for m in caplog.messages)

    anyio.run(main)


# -- closed loop: the limiter against simulated servers -----------------------------


@pytest.mark.anyio
async def test_retry_after_server_settles_just_below_its_rate() -> None:
    """429 + Retry-After: 2 above 5 req/s: nothing is sent inside a Retry-After
    window, and the steady rate settles within 10 % below 5 req/s."""
    limiter = Limiter(default=ScopePolicy(concurrency=8, delay=0.0, slot_delay=0.0), seed=1)
    log = await crawl(limiter, QuotaServer(rate=5), duration=1500.0, workers=8)
    rejected = [x for x in log if x.status == 429]
    assert rejected, "the server never pushed back: the test proves nothing"
    sends = sorted(x.sent for x in log)
    for error in rejected:
        inside = [t for t in sends if error.received < t < error.received + 2.0]
        assert not inside, f"sent at {inside[:3]} inside Retry-After from {error.received}"
    late = [x for x in log if x.sent >= 1200.0 and x.status == 200]
    rate = len(late) / 300.0
    assert 4.5 <= rate <= 5.0, f"steady rate {rate:.2f} req/s"
    late_errors = [x for x in rejected if x.sent >= 1200.0]
    assert len(late_errors) <= 5


@pytest.mark.anyio
async def test_autothrottle_follows_latency_that_grows_with_load() -> None:
    policy = ScopePolicy(concurrency=8, delay=0.0, slot_delay=0.0, autothrottle=AutoThrottle())
    limiter = Limiter(default=policy, seed=2)
    log = await crawl(limiter, LoadServer(base=0.2), duration=300.0, workers=8)
    late = [x for x in log if x.sent >= 200.0]
    # In steady state about one request is in flight (target concurrency 1):
    busy = sum(x.received - x.sent for x in late)
    assert busy / 100.0 == pytest.approx(1.0, abs=0.35)
    stats = limiter.statistics().scopes[SCOPE]
    assert stats.reason.startswith("autothrottle")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_random_503s_cost_a_default_scope_one_step_not_its_rate(backend: str) -> None:
    """5 % random 503s in front of a 40/s capacity: 0.1's backoff stepped on
    each and never saw a quiet window (a trickle for good); now the first
    costs a step that the quiet windows take back, and the scope runs at
    the capacity again."""
    from throttlekit.testing import CapacityServer, FlakyServer, burst, simulate

    server = FlakyServer(
        latency=0.05,
        error_rate=0.05,
        error_statuses=(503,),
        timeout_rate=0.0,
        reset_rate=0.0,
        origin=CapacityServer(workers=2, service_time=0.05),
    )

    def late_rate(share: float) -> float:
        policy = ScopePolicy(
            concurrency=4, delay=0, slot_delay=0, backoff=Backoff(window=10.0, error_share=share)
        )
        trace = simulate(policy, server, burst(URL, 12000), duration=240.0, backend=backend)
        late = [r for r in trace.requests if r.status == 200 and (r.sent or 0) >= 180]
        return len(late) / 60.0

    assert late_rate(0.25) >= 0.8 * 40 * 0.95
    assert late_rate(0.0) < 5.0  # 0.1's rule, the ratchet


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_limit_answering_503_to_a_few_requests_is_still_backed_off_from(backend: str) -> None:
    """nginx's limit_req at 12/s under a policy of 14/s refuses one request
    in seven with a 503: too few to be a large share, but many more than
    where the scope was quiet, so they step (taken for random ones, 20 % of
    the requests were refused for good)."""
    from throttlekit.testing import QuotaServer, burst, simulate

    server = QuotaServer(
        limit=12, window=1.0, sliding=True, status=503, retry_after=None, latency=0.05
    )
    policy = ScopePolicy(concurrency=4, delay=1 / 14, slot_delay=0, jitter=0)
    trace = simulate(policy, server, burst(URL, 5000), duration=600.0, backend=backend)
    late = [r for r in trace.requests if r.status is not None and (r.sent or 0) >= 300]
    refused = sum(r.status == 503 for r in late)
    assert late
    assert refused < 0.01 * len(late)


async def _fast_429_run(policy: ScopePolicy) -> tuple[int, int]:
    limiter = Limiter(default=policy, seed=3)
    log = await crawl(limiter, FastErrorServer(rate=1), duration=600.0, workers=8)
    late = [x for x in log if x.sent >= 300.0]
    return sum(x.status == 429 for x in late), sum(x.status == 200 for x in late)


@pytest.mark.anyio
async def test_fast_429s_slow_throttlekit_down_where_autothrottle_speeds_up() -> None:
    """A server allowing 1 req/s that answers 429 in 5 ms and 200 in 0.5 s:
    AutoThrottle alone settles on the 200s' latency and keeps sending twice
    what the server accepts (its fast errors may not lower the delay, but
    nothing raises it either); with backoff on (the default) the crawl slows
    to what the server accepts."""
    base = ScopePolicy(concurrency=8, delay=0.0, slot_delay=0.0, autothrottle=AutoThrottle())
    errors_alone, ok_alone = await _fast_429_run(attrs.evolve(base, backoff=None))
    errors_ours, ok_ours = await _fast_429_run(base)
    assert errors_alone >= 0.4 * (errors_alone + ok_alone), (errors_alone, ok_alone)
    assert errors_ours <= 0.05 * (errors_ours + ok_ours), (errors_ours, ok_ours)
    assert ok_ours >= 0.8 * 300  # still useful throughput (the server allows 1/s)


@pytest.mark.anyio
async def test_rampup_settles_against_fixed_capacity() -> None:
    policy = ScopePolicy(
        concurrency=1, delay=1.0, slot_delay=0.0, rampup=Rampup(target=1, window=30.0)
    )
    limiter = Limiter(default=policy, seed=4)
    rungs: list[int] = []

    async def watch() -> None:
        while anyio.current_time() < 3000.0:
            await anyio.sleep(30.0)
            state = limiter._local.core.scopes[SCOPE].controllers[0]
            rungs.append(state.rung)

    log: list[Exchange] = []

    async def run() -> None:
        log.extend(
            await crawl(limiter, QuotaServer(rate=10, retry_after=1.0), duration=3000.0, workers=16)
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        tg.start_soon(watch)
    tail = rungs[-40:]
    assert max(tail) - min(tail) <= 2, rungs  # settled, no endless swing
    late = [x for x in log if x.sent >= 1800.0]
    ok = sum(x.status == 200 for x in late) / 1200.0
    errors = sum(x.status == 429 for x in late)
    assert ok >= 0.8 * 10, ok  # close to the server's capacity
    assert errors <= 0.02 * ok * 1200.0, errors  # < 2 % 429s


# -- quotas -------------------------------------------------------------------


@pytest.mark.anyio
async def test_cost_capped_api_reconciles_actual_cost() -> None:
    """The seed's cost-capped API: estimate a cost up front, report the real one."""
    limiter = Limiter(
        scopes={"cost": ScopePolicy(concurrency=None, delay=0, slot_delay=0, quota=100.0)},
        default=ScopePolicy(concurrency=None, delay=0, slot_delay=0),
    )

    def resolver(request: str) -> dict[str, float]:
        return throttlekit.scopes.add_scope(throttlekit.scopes.by_host(request), "cost", 10.0)

    limiter.resolver = resolver
    async with limiter.acquire(URL) as permit:
        assert permit.scopes == {SCOPE: 1.0, "cost": 10.0}
        permit.record(status=200, consumed={"cost": 25.0})
    stats = limiter.statistics().scopes["cost"]
    assert stats.quota_used == 25.0
    assert stats.quota_left == 75.0
    sends = []
    for _ in range(8):
        async with limiter.acquire(URL):
            sends.append(anyio.current_time())
    # 25 + 7 * 10 = 95 fits; the 8th (105) waits for the window to roll.
    assert sends[:7] == [sends[0]] * 7
    assert sends[7] == pytest.approx(60.0)


# -- Crawl-Delay ----------------------------------------------------------------


def test_crawl_delay(caplog: pytest.LogCaptureFixture) -> None:
    explicit = ScopePolicy(concurrency=8, delay=0.1)
    quiet = ScopePolicy(concurrency=8, delay=0.1, ignore_robots_txt=True)
    limiter = Limiter(scopes={"mine.test": explicit, "quiet.test": quiet})
    limiter.set_crawl_delay("a.test", 5.0)
    assert (limiter.policy("a.test").concurrency, limiter.policy("a.test").delay) == (1, 5.0)
    limiter.set_crawl_delay("b.test", 600.0)
    assert limiter.policy("b.test").delay == 60.0  # THROTTLING_ROBOTSTXT_MAX_DELAY
    limiter.set_crawl_delay("a.test", 2.0)  # robots.txt changed: follow it
    assert limiter.policy("a.test").delay == 2.0
    with caplog.at_level(logging.WARNING, logger="throttlekit"):
        limiter.set_crawl_delay("mine.test", 5.0)
        limiter.set_crawl_delay("mine.test", 5.0)
        limiter.set_crawl_delay("quiet.test", 5.0)
        limiter.set_crawl_delay("c.test", -1.0)
        limiter.set_crawl_delay("d.test", math.nan)
    assert limiter.policy("mine.test") is explicit
    warnings = [m for m in caplog.messages if "Crawl-Delay 5.0 s on mine.test" in m]
    assert len(warnings) == 1
    assert not any("quiet.test" in m for m in caplog.messages)
    assert sum("ignoring invalid Crawl-Delay" in m for m in caplog.messages) == 2
    assert limiter.policy("c.test") == limiter.default
    with pytest.raises(TypeError, match="seconds"):
        limiter.set_crawl_delay("a.test", "5")  # type: ignore[arg-type]
    small = Limiter.from_settings({"THROTTLING_ROBOTSTXT_MAX_DELAY": 3})
    small.set_crawl_delay("a.test", 10)
    assert small.policy("a.test").delay == 3.0


# -- settings and custom controllers ------------------------------------------------


class HalfSpeed(BaseController):
    """A custom controller: doubles the policy delay after any 5xx."""

    def __init__(self, policy: ScopePolicy) -> None:
        self.policy = policy
        self.delay = 0.0

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        if feedback.status is not None and feedback.status >= 500:
            self.delay = max(self.delay, self.policy.delay * 2)


def test_settings_controller_keys() -> None:
    limiter = Limiter.from_settings(
        {
            "BACKOFF_MAX_DELAY": 120,
            "BACKOFF_HTTP_CODES": [429, 503],
            "RAMPUP_BACKOFF_TARGET": [1, 3],
            "THROTTLING_SCOPES": {
                "api.test": {"rampup": True, "backoff": {"max_delay": 30, "jitter": [0, 0.2]}},
                "nobackoff.test": {"backoff": False},
                "custom.test": {"manager": f"{__name__}.HalfSpeed", "delay": 0.5},
            },
        }
    )
    assert limiter.default.backoff is not None
    assert limiter.default.backoff.max_delay == 120.0
    assert limiter.default.backoff.http_codes == frozenset({429, 503})
    api = limiter.policy("api.test")
    assert api.rampup == Rampup(target=(1, 3))
    assert api.backoff is not None
    assert (api.backoff.max_delay, api.backoff.jitter) == (30.0, (0.0, 0.2))
    assert limiter.policy("nobackoff.test").backoff is None
    assert limiter.policy("custom.test").controllers == (HalfSpeed,)
    with pytest.raises(ValueError, match=r"THROTTLING_SCOPES\['x'\]\['backoff'\].*unknown key"):
        Limiter.from_settings({"THROTTLING_SCOPES": {"x": {"backoff": {"nope": 1}}}})
    with pytest.raises(ValueError, match=r"BACKOFF_DELAY_FACTOR|delay_factor"):
        Limiter.from_settings({"BACKOFF_DELAY_FACTOR": 0.5})
    with pytest.raises(ValueError, match="cannot import"):
        Limiter.from_settings({"THROTTLING_SCOPES": {"x": {"manager": "no.such.Thing"}}})


@pytest.mark.anyio
async def test_custom_controller_moves_the_delay() -> None:
    policy = ScopePolicy(delay=0.5, slot_delay=0, controllers=(HalfSpeed,), backoff=None)
    limiter = Limiter(default=policy)
    sends = []
    for status in (200, 500, 200, 200):
        async with limiter.acquire(URL) as permit:
            sends.append(anyio.current_time())
            permit.record(status=status)
    gaps = [b - a for a, b in itertools.pairwise(sends)]
    assert gaps == pytest.approx([0.5, 1.0, 1.0])  # the new delay counts from the 500


@pytest.mark.anyio
async def test_feedback_for_some_scopes_only() -> None:
    """A scraping API's upstream status concerns the target site, not the API."""
    fast = ScopePolicy(concurrency=None, delay=0.0, slot_delay=0.0)
    limiter = Limiter(default=fast)
    async with limiter.acquire(scopes={"api.test": 1.0, "target.test": 1.0}) as permit:
        permit.record(status=200)  # the API answered fine...
        permit.record(status=429, scopes={"target.test"})  # ...the target site did not
        with pytest.raises(ValueError, match="does not hold"):
            permit.record(status=429, scopes=["other.test"])
    stats = limiter.statistics().scopes
    assert stats["target.test"].backoff_level == 1
    assert stats["api.test"].backoff_level == 0
    assert stats["api.test"].delay == 0.0


@pytest.mark.anyio
async def test_rampup_slows_down_within_the_window_when_far_past_the_target() -> None:
    policy = ScopePolicy(concurrency=1, delay=0.0, slot_delay=0.0, rampup=Rampup(window=60.0))
    limiter = Limiter(default=policy)
    for _ in range(6):
        async with limiter.acquire(URL) as permit:
            permit.record(status=429)
    state = limiter._local.core.scopes[SCOPE].controllers[0]
    assert state.rung == -1  # stepped down after 6 signals, long before the window ended
    assert limiter.statistics().scopes[SCOPE].delay > 0.0


def _levels(statuses: Any, **backoff: Any) -> list[int]:
    """A default scope's backoff level after each of ``statuses``, one request a second."""
    ledger = ScopeLedger(SCOPE, ScopePolicy(concurrency=4, delay=0.0, backoff=Backoff(**backoff)))
    levels = []
    for second, status in enumerate(statuses, start=1):
        now = float(second)
        feedback = Feedback(status=status, sent_at=now)
        if status == "timeout":
            feedback = Feedback(exception=TimeoutError(), sent_at=now)
        ledger.on_feedback(feedback, now + 0.1)
        levels.append(ledger.controllers[0].level if ledger.controllers else 0)
    return levels


def test_backoff_random_errors_among_successes_do_not_ratchet() -> None:
    one_in_twenty = [503 if second % 20 == 7 else 200 for second in range(400)]
    levels = _levels(one_in_twenty, window=10.0)
    assert levels[7] == 1  # the first error steps: nothing had gone through before it
    assert max(levels) <= 2  # the next ones are few among successes: no ratchet
    assert levels[-1] == 0  # and they do not keep the quiet windows from stepping back
    assert _levels(one_in_twenty, window=10.0, error_share=0.0)[-1] >= 5  # 0.1: each steps


def test_backoff_a_server_failing_every_request_or_a_large_share_is_backed_off_from() -> None:
    # Nothing gets through: every error steps, timeouts alike.
    assert _levels([200, 503, 503, 503, "timeout"]) == [0, 1, 2, 3, 4]
    # One in three fails among successes: a quarter of the last 40, and on.
    one_in_three = [503 if second % 3 == 0 else 200 for second in range(60)]
    assert _levels(one_in_three)[-1] >= 3
    # A 429 among successes is meant: it always steps.
    assert _levels([429 if second % 20 == 7 else 200 for second in range(40)])[-1] == 2


def test_concurrency_cut_ends_for_an_unlimited_policy() -> None:
    """A scope with no concurrency limit gets its cut lifted once quiet again."""
    ledger = ScopeLedger(
        SCOPE, ScopePolicy(concurrency=None, delay=0.0, backoff=Backoff(max_delay=2.0, window=10.0))
    )
    ledger.in_flight = 8
    now = 0.0
    for _ in range(4):  # 1 -> 2 (max), then cuts: 8 -> 4 -> 2
        now += 1.0
        ledger.on_feedback(Feedback(status=503, sent_at=now), now + 0.1)
    state = ledger.controllers[0]
    assert state.concurrency == 2
    ledger.in_flight = 0
    for _ in range(40):
        now += 10.0
        state.on_send(ledger, now)
        ledger.refresh()
    assert ledger.concurrency is None
    assert state.level == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_backoff_jitter_never_takes_a_gap_above_max_delay(backend: str) -> None:
    """Endless 429s with ``Backoff(max_delay=10, jitter=0.1)`` once gave 11 s gaps:
    ``max_delay`` is a cap, so at the cap the jitter only shortens the delay."""
    from throttlekit.testing import FixedServer, burst, simulate

    policy = ScopePolicy(
        concurrency=1, delay=0, backoff=Backoff(max_delay=10.0, jitter=0.1, window=1000.0)
    )
    trace = simulate(
        policy,
        FixedServer(status=429, latency=0.0),
        burst(URL, 200),
        duration=600.0,
        backend=backend,
        seed=1,
    )
    # (All arrive at t=0: trio starts their tasks in an order of its choosing.)
    sent = sorted(r.sent for r in trace.requests if r.sent is not None)
    gaps = [later - earlier for earlier, later in itertools.pairwise(sent)]
    assert len(gaps) > 40
    assert max(gaps) <= 10.0 + 1e-9
    assert min(gaps[-20:]) < 9.9  # still jittered (downwards) at the cap


# -- one reading of a response: every controller agrees on Retry-After ----------------------

POLICIES_THAT_READ_HEADERS = {
    "backoff": throttlekit.ScopePolicy(concurrency=None, delay=0),
    "headers-only": throttlekit.ScopePolicy(
        concurrency=None, delay=0, backoff=throttlekit.Backoff(headers_only=True)
    ),
    "adaptive": throttlekit.ScopePolicy(concurrency=16, delay=0, adaptive=throttlekit.Adaptive()),
    "rampup": throttlekit.ScopePolicy(concurrency=None, delay=0, rampup=throttlekit.Rampup()),
}


@pytest.mark.parametrize("policy", list(POLICIES_THAT_READ_HEADERS))
@pytest.mark.parametrize(
    ("status", "blocks"),
    [
        (200, False),
        (204, False),
        (404, False),
        (500, False),
        (429, True),
        (503, True),
        (403, True),
        (301, True),
    ],
)
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_retry_after_counts_where_http_defines_it_for_every_controller(
    policy: str, status: int, blocks: bool
) -> None:
    # Frameworks that send Retry-After on every response (200s included) must
    # not block the scope; on a 429, 503, redirect or 403 it blocks it, the
    # same whichever controller runs the scope (they read one parse).
    limiter = throttlekit.Limiter(default=POLICIES_THAT_READ_HEADERS[policy])
    async with limiter.acquire("https://a.test/") as permit:
        feedback = permit.record(status=status, headers={"Retry-After": "30"})
    assert (feedback.rate_limit is not None and feedback.rate_limit.retry_after == 30.0) is blocks
    stats = limiter.scope_statistics("a.test")
    assert stats is not None
    now = anyio.current_time()
    assert (stats.blocked_until > now + 25) is blocks, stats
    if not blocks:
        with anyio.fail_after(1):
            async with limiter.acquire("https://a.test/"):
                pass


def _spent(reset: float, *, source: str = "x-ratelimit", **fields: Any) -> Any:
    return _info(remaining=0, limit=10, reset=reset, source=source, **fields)


def test_a_knock_goes_before_a_frameworks_reset_close_at_hand_and_learns_its_lead() -> None:
    ledger = _backoff_ledger(knock=True)
    state = ledger.controllers[0]
    # A spent X-RateLimit quota 2 s from its reset: the first knock goes a
    # quarter of the wait early (0.5 s), with one request in flight.
    state.on_feedback(ledger, Feedback(status=200, sent_at=0.0, rate_limit=_spent(2.0)), 0.0)
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(1.5)
    assert ledger.concurrency == 1
    # Accepted: the window came back that early; the next knock doubles the step.
    fresh = _info(remaining=9, limit=10, reset=2.0, source="x-ratelimit")
    state.on_feedback(ledger, Feedback(status=200, sent_at=1.5, rate_limit=fresh), 1.51)
    state.on_feedback(ledger, Feedback(status=200, sent_at=2.0, rate_limit=_spent(2.0)), 2.0)
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(2.0 + 2.0 - 1.25)  # halfway to the reset
    # Refused: that lead is never tried again, and the refusal's own wait is
    # honoured in full; the knock after it keeps to the lead accepted.
    refusal = _spent(1.9, retry_after=1.0)
    state.on_feedback(ledger, Feedback(status=429, sent_at=2.75, rate_limit=refusal), 2.76)
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(2.76 + 1.9 - 0.5)
    state.on_feedback(ledger, Feedback(status=200, sent_at=4.2, rate_limit=fresh), 4.21)
    state.on_feedback(ledger, Feedback(status=200, sent_at=6.0, rate_limit=_spent(2.0)), 6.0)
    ledger.refresh()
    # Between the lead accepted (0.5) and the one refused (1.25).
    assert ledger.blocked_until == pytest.approx(6.0 + 2.0 - 0.875)


def test_a_knock_that_left_late_counts_the_lead_it_left_with() -> None:
    # Through Redis a request's sent_at is the send time its grant reserved;
    # a worker that resumed 0.1 s late sent it 0.1 s closer to the reset, as
    # its latency (counted from when it resumed) tells. Counted from the
    # grant, the lead proved was 0.1 s longer than the one the knock had.
    ledger = _backoff_ledger(knock=True)
    state = ledger.controllers[0]
    state.on_feedback(ledger, Feedback(status=200, sent_at=0.0, rate_limit=_spent(2.0)), 0.0)
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(1.5)  # a lead of 0.5 s
    fresh = _info(remaining=9, limit=10, reset=2.0, source="x-ratelimit")
    late = Feedback(status=200, sent_at=1.5, latency=0.01, rate_limit=fresh)
    state.on_feedback(ledger, late, 1.61)  # (it left at 1.6)
    state.on_feedback(ledger, Feedback(status=200, sent_at=2.0, rate_limit=_spent(2.0)), 2.0)
    ledger.refresh()
    # The next lead: halfway from the 0.4 s proved to the reset (0.5 s proved: 2.75).
    assert ledger.blocked_until == pytest.approx(2.0 + 2.0 - 1.2)


@pytest.mark.parametrize(
    ("knock", "info", "until"),
    [
        (False, _spent(2.0), 2.0),  # Backoff alone obeys the reset
        (True, _spent(8.0), 8.0),  # a window of seconds is paced over, not knocked on
        (True, _spent(2.0, source="ietf"), 2.0),  # the draft's reset is the server's word
        # A refusal's Retry-After in full, and its reset less a lead accepted (none yet).
        (True, _spent(2.0, retry_after=1.5), 2.0),
        (True, _spent(1.0, retry_after=1.5), 1.5),
    ],
)
def test_resets_that_are_not_knocked_on(knock: bool, info: Any, until: float) -> None:
    ledger = _backoff_ledger(knock=knock)
    ledger.controllers[0].on_feedback(
        ledger, Feedback(status=429, sent_at=0.0, rate_limit=info), 0.0
    )
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(until)


def test_refused_knocks_stay_within_their_share_of_the_answers() -> None:
    # A server that states its resets honestly refuses every knock: after
    # the first two, a knock that may be refused waits for a hundred answers.
    ledger = _backoff_ledger(knock=True)
    state = ledger.controllers[0]
    now, refused, answers = 0.0, 0, 1
    for _ in range(100):
        state.on_feedback(ledger, Feedback(status=200, sent_at=now, rate_limit=_spent(1.0)), now)
        ledger.refresh()
        knock_at = max(ledger.blocked_until, now)
        if knock_at < now + 1.0:  # sent before the reset: refused
            refused += 1
            refusal = _spent(now + 1.0 - knock_at, retry_after=now + 1.0 - knock_at)
            state.on_feedback(
                ledger, Feedback(status=429, sent_at=knock_at, rate_limit=refusal), knock_at
            )
        now += 1.0
        fresh = _info(remaining=9, limit=10, reset=1.0, source="x-ratelimit")
        state.on_feedback(ledger, Feedback(status=200, sent_at=now, rate_limit=fresh), now)
        answers += 2 + (knock_at < now)
    assert 2 <= refused <= 2 + 0.01 * answers < 5


@pytest.mark.parametrize("knock", [False, True])
def test_a_reset_already_past_holds_in_flight_to_what_remained(knock: bool) -> None:
    # An epoch reset rounded down (Flask-Limiter's int(reset + 1)) is often
    # past when the answer comes: what remained then is all that is known, so
    # the scope keeps that many in flight (at least one) until the next
    # answer, instead of letting every sender go at once.
    ledger = _backoff_ledger(knock=knock)
    state = ledger.controllers[0]
    past = _info(remaining=1, limit=10, reset=0.0, source="x-ratelimit")
    state.on_feedback(ledger, Feedback(status=200, sent_at=0.0, rate_limit=past), 0.05)
    state.on_send(ledger, 0.06)
    ledger.refresh()
    assert ledger.concurrency == 1  # (the policy's 4 before)
    fresh = _info(remaining=3, limit=10, reset=0.9, source="x-ratelimit")
    state.on_feedback(ledger, Feedback(status=200, sent_at=0.06, rate_limit=fresh), 0.1)
    ledger.refresh()
    assert ledger.concurrency == 3


def test_a_quota_whose_resets_are_a_second_or_two_in_whole_seconds_is_set_aside() -> None:
    # Flask-Limiter's moving window of 10/s states its reset as an integer
    # epoch: one to two seconds away, late by a share that changes every
    # window. No lead fits; the knock's scope keeps only Retry-After (the
    # rate loop paces), while a minute's window in whole seconds is obeyed.
    for reset, blocked in ((1.6, False), (30.0, True)):
        ledger = _backoff_ledger(knock=True)
        state = ledger.controllers[0]
        spent = _spent(reset, reset_step=1.0)
        state.on_feedback(ledger, Feedback(status=200, sent_at=0.0, rate_limit=spent), 0.0)
        ledger.refresh()
        assert (ledger.blocked_until > 0.0) is blocked, reset
        assert (ledger.concurrency == 1) is blocked
    ledger = _backoff_ledger(knock=True)
    state = ledger.controllers[0]
    refusal = _spent(1.6, reset_step=1.0, retry_after=1.0)
    state.on_feedback(ledger, Feedback(status=429, sent_at=0.0, rate_limit=refusal), 0.0)
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(1.0)  # a refusal's own wait still counts


@pytest.mark.parametrize("step", [1.0, 0.001])
def test_a_reset_rounded_up_to_whole_seconds_is_knocked_on_with_the_lead_kept(step: float) -> None:
    # express-rate-limit's default headers: X-RateLimit-Reset is the window's
    # end rounded up to a whole epoch second, and Retry-After comes only with
    # refusals. A scope that paced the quota for 6 s meets it spent 4.8 s
    # from that reset: where the reset is rounded up, the knock goes within
    # the step (half of it first) however long the quota took to spend; a
    # reset in epoch milliseconds is the server's own, and waited for.
    ledger = _backoff_ledger(knock=True)
    state = ledger.controllers[0]

    def spent_at(now: float) -> float:
        fresh = _info(remaining=49, limit=50, reset=10.0, source="x-ratelimit", reset_step=step)
        state.on_feedback(ledger, Feedback(status=200, sent_at=now, rate_limit=fresh), now)
        spent = _spent(4.8, reset_step=step)
        state.on_feedback(ledger, Feedback(status=200, sent_at=now + 6, rate_limit=spent), now + 6)
        ledger.refresh()
        return ledger.blocked_until - (now + 6 + 4.8)

    if step < 1.0:
        assert spent_at(0.0) == pytest.approx(0.0)
        return
    assert spent_at(0.0) == pytest.approx(-0.5)
    # Accepted: the window opened at the knock, so its next reset is late by
    # about that lead; the lead is kept, shorter by KNOCK_DRIFT per window.
    assert spent_at(10.3) == pytest.approx(-0.5 + KNOCK_DRIFT)
    assert spent_at(20.65) == pytest.approx(-0.5 + 2 * KNOCK_DRIFT)


def test_a_rounded_reset_of_a_window_back_a_request_at_a_time_keeps_no_lead() -> None:
    # A moving window lets go of one request at a time, each stated late by
    # another share of the second: a knock that got in, its answer showing
    # the quota spent again, teaches no lead for the next one.
    ledger = _backoff_ledger(knock=True)
    state = ledger.controllers[0]
    whole = _info(remaining=29, limit=30, reset=60.0, source="x-ratelimit", reset_step=1.0)
    state.on_feedback(ledger, Feedback(status=200, sent_at=0.0, rate_limit=whole), 0.0)
    spent = _spent(2.0, reset_step=1.0)
    state.on_feedback(ledger, Feedback(status=200, sent_at=6.0, rate_limit=spent), 6.0)
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(8.0 - 0.5)  # the first knock, within the step
    state.on_feedback(ledger, Feedback(status=200, sent_at=7.5, rate_limit=spent), 7.5)
    ledger.refresh()
    assert ledger.blocked_until == pytest.approx(9.5)  # the next reset is waited for


def test_a_kept_lead_refused_once_backs_off_a_little_and_refused_again_halves() -> None:
    # The search ends within a few ms of a refused lead, so a network's
    # jitter refuses the lead kept now and then: it backs off KNOCK_DRIFT.
    # Refused again before a knock at it is accepted, the server states its
    # resets less late now: the lead halves, as a search below it.
    knock = Knock()
    knock.good, knock.bad = 0.99, 1.0

    def answer(lead: float, at: float, *, accepted: bool) -> None:
        knock.lead, knock.at = lead, at
        assert knock.answered(at, at + 0.01, accepted=accepted, info=None) is accepted

    answer(0.99, 10.0, accepted=False)
    assert knock.good == pytest.approx(0.99 - KNOCK_DRIFT)
    answer(knock.good, 20.0, accepted=False)
    assert knock.good == pytest.approx((0.99 - KNOCK_DRIFT) / 2)
    answer(knock.good, 30.0, accepted=True)  # the lead kept holds again
    kept = knock.good
    answer(kept, 40.0, accepted=False)
    assert knock.good == pytest.approx(kept - KNOCK_DRIFT)


def test_a_knock_state_written_before_a_field_was_added_is_read() -> None:
    # A scope shared through Redis by processes of an older version: the
    # fields added since start fresh instead of failing every answer.
    older = Knock().state()[:9]
    assert Knock(older).state() == Knock().state()
