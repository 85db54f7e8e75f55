"""Adaptive: its targets on every kind of server, in virtual time, and its invariants."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from throttlekit import Adaptive, Feedback, Limiter, ScopePolicy, ScopeSnapshot
from throttlekit._ledger import ScopeLedger
from throttlekit.headers import RateLimitInfo, parse
from throttlekit.testing import (
    BucketServer,
    CapacityServer,
    CDNServer,
    FlakyServer,
    FrameworkLimiter,
    HAProxyRate,
    Jittered,
    NginxLimitConn,
    NginxLimitReq,
    QuotaServer,
    Responder,
    ServerModel,
    SimRequest,
    SimResponse,
    Trace,
    assert_respects,
    burst,
    simulate,
)

URL = "https://api.test/{i}"
CEILING = ScopePolicy(concurrency=16, delay=0, slot_delay=0, adaptive=Adaptive())
BACKENDS = ["asyncio", "trio"]


def _ok_rate(trace: Trace, start: float, end: float) -> float:
    """Successful requests per second among those sent in ``[start, end)``."""
    ok = sum(
        1
        for r in trace.requests
        if r.status == 200 and r.sent is not None and start <= r.sent < end
    )
    return ok / (end - start)


def _late_share(trace: Trace, status: int) -> float:
    """The share of ``status`` among the requests sent over the second half (from 60 s)."""
    late = [r for r in trace.requests if r.sent is not None and r.sent >= 60]
    return sum(1 for r in late if r.status == status) / len(late)


def _refused(trace: Trace) -> float:
    """The share of sends refused, with a 429 or (nginx's default) a 503."""
    sent = [r for r in trace.requests if r.sent is not None]
    return sum(1 for r in sent if r.status in (429, 503)) / max(1, len(sent))


def _p95_latency(trace: Trace, start: float) -> float:
    """The 95th percentile latency of the successful requests sent from ``start`` on."""
    late = sorted(
        r.responded - r.sent
        for r in trace.requests
        if r.status == 200 and r.sent is not None and r.sent >= start
    )
    return late[int(0.95 * len(late))]


def _time_to(trace: Trace, rate: float, *, span: float = 5.0) -> float:
    """The first time at which the successful rate over the next ``span`` reaches ``rate``."""
    for start in range(int(trace.duration - span) + 1):
        if _ok_rate(trace, start, start + span) >= rate:
            return float(start)
    return math.inf


def _random_503s(error_rate: float, origin: ServerModel, **extra: Any) -> FlakyServer:
    """``origin`` behind random 503s (``error_rate`` of requests), nothing else failing."""
    return FlakyServer(
        latency=0.05,
        error_rate=error_rate,
        error_statuses=(503,),
        timeout_rate=0.0,
        reset_rate=0.0,
        origin=origin,
        **extra,
    )


def _run(
    server: ServerModel,
    duration: float,
    backend: str,
    policy: ScopePolicy = CEILING,
    *,
    seed: int = 0,
) -> Trace:
    return simulate(policy, server, burst(URL, 8000), duration=duration, seed=seed, backend=backend)  # type: ignore[arg-type]


def _bare_503_window(limit: int, *, sliding: bool, latency: float) -> QuotaServer:
    """``limit`` per second, refused with a 503 in 1 ms that tells no wait (nginx's default)."""
    return QuotaServer(
        limit=limit,
        window=1.0,
        sliding=sliding,
        status=503,
        retry_after=None,
        latency=latency,
        reject_latency=0.001,
    )


# -- policy limits --------------------------------------------------------------------


@attrs.frozen
class HourlyHeaders:
    """``server``, with X-RateLimit headers of an hourly quota of 5,000 on every answer."""

    server: ServerModel

    def start(self, rng: random.Random) -> Responder:
        respond = self.server.start(rng)
        used = 0

        def answer(request: SimRequest, now: float) -> SimResponse:
            nonlocal used
            used += 1
            response = respond(request, now)
            headers = {
                **response.headers,
                "X-RateLimit-Limit": "5000",
                "X-RateLimit-Remaining": str(max(0, 5000 - used)),
                "X-RateLimit-Reset": str(math.ceil(3600 - now)),
            }
            return attrs.evolve(response, headers=headers)

        return answer


#: site: (server, allowed rate, the share of it required over the second half).
POLICY_SITES: dict[str, tuple[ServerModel, float, float]] = {
    "sliding quota, Retry-After: 1": (
        QuotaServer(limit=10, window=1.0, sliding=True, retry_after=1, latency=0.05),
        10.0,
        0.95,
    ),
    "bare fast 429": (
        QuotaServer(
            limit=20, window=1.0, sliding=True, retry_after=None, latency=0.02, reject_latency=0.001
        ),
        20.0,
        0.95,
    ),
    "fixed window, draft-10 headers": (
        QuotaServer(
            limit=10, window=1.0, retry_after=None, rate_limit_headers="ietf", latency=0.05
        ),
        10.0,
        # A MISS of the 95 % target: the reset is given in whole seconds, so
        # the wait for a sub-second reset is up to a second too long.
        0.92,
    ),
    "x-ratelimit": (
        QuotaServer(
            limit=60, window=10.0, retry_after=None, rate_limit_headers="x-ratelimit", latency=0.05
        ),
        6.0,
        0.95,
    ),
    # A window of seconds, bare 429s: learned from how long the server stays
    # closed after the first burst, then counted over (it was counted over a
    # second: 85 % with 10 % refused, a probe read as a rise every hold).
    "50 per sliding 10 s, bare 429": (
        QuotaServer(
            limit=50,
            window=10.0,
            sliding=True,
            retry_after=None,
            latency=0.05,
            reject_latency=0.001,
        ),
        5.0,
        0.95,
    ),
    # Headers that count the quota without saying its window: they pace the
    # scope alone (the rate loop's own pace spread each window's sends until
    # the last answer's whole-second reset skipped the next window: 75 %).
    "fixed window, RateLimit-Limit/-Remaining/-Reset": (
        QuotaServer(
            limit=10, window=1.0, retry_after=None, rate_limit_headers="legacy", latency=0.05
        ),
        10.0,
        0.92,
    ),
    "fixed window, X-RateLimit, whole-second reset": (
        QuotaServer(
            limit=10, window=1.0, retry_after=None, rate_limit_headers="x-ratelimit", latency=0.05
        ),
        10.0,
        0.92,
    ),
    # An hourly quota in the headers, and a per-second limit they do not
    # show: its refusals come with quota left, and the rate loop finds it.
    "a limit the headers do not show": (
        HourlyHeaders(QuotaServer(limit=5, window=1.0, sliding=True, retry_after=1, latency=0.05)),
        5.0,
        0.95,
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("site", sorted(POLICY_SITES))
def test_policy_limits_are_used_without_refusals(site: str, backend: str) -> None:
    server, allowed, share = POLICY_SITES[site]
    trace = _run(server, 120.0, backend)
    # Over the whole run (slow start included) and over its second half,
    # which holds a probe above the edge and what it costs.
    assert _ok_rate(trace, 0, 120) >= (share - 0.02) * allowed
    assert _ok_rate(trace, 60, 120) >= share * allowed
    assert _refused(trace) < 0.02
    assert _time_to(trace, 0.9 * allowed) <= 15.0
    assert_respects(trace, CEILING, retry_after=True)  # never inside an announced wait


@attrs.frozen
class OpenAIRequests:
    """A token bucket of ``per_minute`` requests, with OpenAI's request headers.

    ``x-ratelimit-reset-requests`` is the time until the bucket is full again;
    beyond it, 429 with ``retry-after`` (whole seconds until one request fits).
    Answers take ``latency`` seconds, from half to one and a half times that.
    """

    per_minute: int
    latency: float

    def start(self, rng: random.Random) -> Responder:
        rate = self.per_minute / 60.0
        tokens, then = float(self.per_minute), 0.0

        def answer(request: SimRequest, now: float) -> SimResponse:
            nonlocal tokens, then
            tokens, then = min(self.per_minute, tokens + (now - then) * rate), now
            accepted = tokens >= 1.0
            tokens -= accepted
            headers = {
                "x-ratelimit-limit-requests": str(self.per_minute),
                "x-ratelimit-remaining-requests": str(int(tokens)),
                "x-ratelimit-reset-requests": f"{(self.per_minute - tokens) / rate:.3f}s",
            }
            if accepted:
                latency = self.latency * rng.uniform(0.5, 1.5)
                return SimResponse(status=200, latency=latency, headers=headers)
            headers["retry-after"] = str(math.ceil((1.0 - tokens) / rate))
            return SimResponse(status=429, latency=0.05, headers=headers)

        return answer


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_bucket_api_is_used_at_its_refill_rate(backend: str) -> None:
    # 60 requests a minute, answers in about 2 s: the headers count the quota,
    # and a nearly spent bucket is paced at its refill (1/s), not as if its
    # reset (when the bucket is full again) ended a window (one per 19 s).
    trace = _run(OpenAIRequests(per_minute=60, latency=2.0), 300.0, backend)
    assert _ok_rate(trace, 150, 300) >= 0.95 * 1.0
    assert _refused(trace) < 0.02
    assert_respects(trace, CEILING, retry_after=True)


@attrs.frozen
class InFlightLimit:
    """Refuses (a bare ``status`` in 1 ms) when ``limit`` requests are being served.

    Answers take ``latency`` seconds, give or take ``spread`` of that, so the
    rate it allows varies while the number in flight does not.
    """

    limit: int
    latency: float
    status: int = 429
    spread: float = 0.5

    def start(self, rng: random.Random) -> Responder:
        ends: list[float] = []

        def answer(request: SimRequest, now: float) -> SimResponse:
            ends[:] = [end for end in ends if end > now]
            if len(ends) >= self.limit:
                return SimResponse(status=self.status, latency=0.001)
            latency = self.latency * rng.uniform(1 - self.spread, 1 + self.spread)
            ends.append(now + latency)
            return SimResponse(status=200, latency=latency)

        return answer


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_limit_on_requests_in_flight_is_found_and_kept(backend: str) -> None:
    # 4 in flight, answers in about 0.5 s: 8/s on average. Read as a rate
    # limit, the edge moved with the latencies and the margin grew (65 %).
    trace = _run(InFlightLimit(limit=4, latency=0.5), 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.95 * 8.0
    late = [r for r in trace.requests if r.sent is not None and r.sent >= 60]
    assert not any(r.status == 429 for r in late)
    assert _refused(trace) < 0.02


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spread", [0.0, 0.3])
def test_nginx_limit_conn_answering_503_at_once_is_found_within_seconds(
    spread: float, backend: str
) -> None:
    # 4 in process before a 100 ms origin: 40/s. Its 503s were taken for a
    # rate limit's, then for overload: 90 % only after 42 s, 70-89 % after.
    trace = _run(InFlightLimit(limit=4, latency=0.1, status=503, spread=spread), 60.0, backend)
    assert _ok_rate(trace, 30, 60) >= 0.95 * 40.0
    assert _time_to(trace, 0.9 * 40.0) <= 15.0
    sent = [r for r in trace.requests if r.sent is not None]
    assert sum(1 for r in sent if r.status == 503) < 0.02 * len(sent)


#: Real limiters' models, as their sources count (``throttlekit.testing``):
#: the model, its allowed rate, the run and the span the 90 % is counted over.
REAL_LIMITERS: dict[str, tuple[ServerModel, float, float, float]] = {
    # nginx's limit_req without burst: a request at least 1/rate after the
    # last one accepted, or refused (a refused one does not count).
    "nginx limit_req 10r/s": (NginxLimitReq(rate=10, status=429, latency=0.001), 10.0, 40.0, 5.0),
    "nginx limit_req 50r/s, 200 ms origin": (
        NginxLimitReq(rate=50, status=429, latency=0.2),
        50.0,
        40.0,
        5.0,
    ),
    # nginx's limit_req with a stored burst: a second's count reads it as a
    # rate (28/s at 20 r/s with burst=10); at its default 503 too.
    "nginx limit_req 20r/s burst=10 nodelay, 503": (
        NginxLimitReq(rate=20, burst=10, nodelay=True, latency=0.001),
        20.0,
        40.0,
        5.0,
    ),
    # At its default 503 and a rate past the opening's doubling: its 503s
    # took an overload cut and a search from no edge (90 % at 30 s).
    "nginx limit_req 100r/s, 503, 50 ms": (
        NginxLimitReq(rate=100, latency=0.05),
        100.0,
        40.0,
        5.0,
    ),
    "nginx limit_req 20r/s burst=10 nodelay, 429": (
        NginxLimitReq(rate=20, burst=10, nodelay=True, status=429, latency=0.001),
        20.0,
        40.0,
        5.0,
    ),
    # nginx's limit_conn: requests in process at once. Before a 20 ms origin
    # one request in five answered between a refused send and its refusal:
    # counted when the refusal came back, 3 in flight read as the limit
    # (75 % of what it allows).
    "nginx limit_conn 4 before a 20 ms origin": (
        NginxLimitConn(limit=4, latency=0.02),
        200.0,
        40.0,
        5.0,
    ),
    # A counter over the last period that counts refused requests too.
    "HAProxy http_req_rate(1s) above 10": (HAProxyRate(limit=10, latency=0.001), 10.0, 40.0, 5.0),
    "HAProxy above 5, 20 ms": (HAProxyRate(limit=5, latency=0.02), 5.0, 40.0, 5.0),
    "HAProxy above 50": (HAProxyRate(limit=50, latency=0.001), 50.0, 40.0, 5.0),
    # slowapi: a moving window with X-RateLimit-* (its reset a second late)
    # and Retry-After on every response, 200s included.
    "limits moving window 10/s, headers on every response": (
        FrameworkLimiter(limit=10, window=1.0, reset_format="float", latency=0.001),
        10.0,
        40.0,
        5.0,
    ),
    # Flask-Limiter's headers on a window of a second: its reset an integer
    # epoch, one to two seconds after the real one by a share that changes
    # every window. Obeyed, they paced a moving window at 55-60 % (and let
    # every sender go once a reset was past: 35 % refused with the wall
    # clock running); set aside, the rate loop paces it.
    "Flask-Limiter moving window 10/s, integer epoch resets": (
        FrameworkLimiter(limit=10, window=1.0, latency=0.001),
        10.0,
        40.0,
        5.0,
    ),
    "Flask-Limiter moving window 5/s, 50 ms": (
        FrameworkLimiter(limit=5, window=1.0, latency=0.05),
        5.0,
        40.0,
        5.0,
    ),
    "Flask-Limiter fixed second 10, 50 ms": (
        FrameworkLimiter(limit=10, window=1.0, strategy="fixed", latency=0.05),
        10.0,
        40.0,
        5.0,
    ),
    # Flask-Limiter: a fixed minute from the first request, its reset in
    # whole seconds a second late; 90 % within its second window.
    "limits fixed minute 60, headers on every response": (
        FrameworkLimiter(limit=60, window=60.0, strategy="fixed", latency=0.001),
        1.0,
        150.0,
        60.0,
    ),
    "limits fixed minute 120, 50 ms": (
        FrameworkLimiter(limit=120, window=60.0, strategy="fixed", latency=0.05),
        2.0,
        150.0,
        60.0,
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("limiter", sorted(REAL_LIMITERS))
def test_real_limiters_models_are_used_to_the_target(limiter: str, backend: str) -> None:
    # The target: 95 % of the allowed rate over the second half,
    # under 2 % refused, 90 % within 15 s (a minute's window: its second),
    # and nothing sent inside a wait a refusal announced.
    server, allowed, duration, span = REAL_LIMITERS[limiter]
    trace = _run(server, duration, backend)
    assert _ok_rate(trace, duration / 2, duration) >= 0.95 * allowed
    assert _refused(trace) < 0.02
    assert _time_to(trace, 0.9 * allowed, span=span) + span <= (15.0 if span < 60 else 2 * span)
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(3))
def test_a_late_reset_knocked_on_through_a_jittery_network_keeps_its_lead(
    seed: int, backend: str
) -> None:
    # slowapi's moving window of 10/s, its reset stated a second late, behind
    # a path that delays each send by up to 20 ms. The knock's lead, found
    # within a few ms of a refused one, was refused now and then by the
    # delay alone, and halved: the quota was waited for 1.5 s per window
    # until the refusals allowed a search again (83 % over the second half,
    # and on a real machine 86 % of the oracle). It backs off 50 ms instead.
    server = Jittered(
        server=FrameworkLimiter(limit=10, window=1.0, reset_format="float", latency=0.002),
        jitter=0.02,
    )
    trace = _run(server, 61.0, backend, seed=seed)
    assert _ok_rate(trace, 30, 60) >= 0.95 * 10
    assert _refused(trace) < 0.02
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(6))
def test_a_fixed_second_told_to_wait_after_an_opening_of_several_windows_is_not_one_window(
    seed: int, backend: str
) -> None:
    # Flask-Limiter's default fixed window, 30 a second, its Retry-After
    # whole seconds, behind a path that delays each send by up to 5 ms. The
    # opening ran 2.5 s (several windows) before its first refusal told a
    # wait of 1 s; the window after it came back whole, 30 sends, which was
    # under half of the whole opening's 65: "the run and its wait were one
    # window of 3.5 s", held at 17/s (79 to 86 % over the second half at
    # three seeds in six). Half of what the last horizon before the refusal
    # got is the measure.
    server = Jittered(
        server=FrameworkLimiter(limit=30, window=1.0, strategy="fixed", latency=0.002), jitter=0.005
    )
    trace = _run(server, 41.0, backend, seed=seed)
    assert _ok_rate(trace, 20, 40) >= 0.95 * 30
    assert _refused(trace) < 0.02
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("rate", "jitter", "seed"), [(20, 0.0, 0), (50, 0.005, 2), (100, 0.005, 1)]
)
def test_a_token_bucket_held_a_third_above_its_rate_after_its_burst_is_slowed_at_once(
    rate: int, jitter: float, seed: int, backend: str
) -> None:
    # nginx's rate=R burst=R nodelay (a Go rate.Limiter(R, R)), 429. A burst
    # refilled while paused read as an edge well above R; held a third
    # above R, the bucket refused a quarter of the sends, where the rule for
    # a stored burst spent asked for half: the rate came down a restart step
    # per refusal until the horizon ended (20/s: 20 refusals in 40 s, 10 now;
    # 50/s behind 5 ms of jitter: 58, 16 now; 100/s: 47, 20 now).
    bucket = NginxLimitReq(rate=rate, burst=rate, nodelay=True, status=429, latency=0.02)
    server = Jittered(server=bucket, jitter=jitter) if jitter else bucket
    trace = _run(server, 41.0, backend, seed=seed)
    assert _ok_rate(trace, 20, 40) >= 0.95 * rate
    assert _refused(trace) < 0.015


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(2))
def test_a_leaky_bucket_paced_through_a_jittery_network_is_refused_less_as_time_goes_on(
    seed: int, backend: str
) -> None:
    # nginx's limit_req rate=20r/s without burst (503), behind a path that
    # delays each send by up to 5 ms. The pace is guarded above the
    # shortest gap accepted, and moved back down (the guard narrowed, a pace
    # moved up stepped back) every hundred acceptances or so; each time the
    # jitter had it refused again: 51 and 61 refusals in five minutes, about
    # one every 5 s to the end. Refused again once moved back down, it moves
    # down half as fast from then on.
    server = Jittered(server=NginxLimitReq(rate=20, status=503, latency=0.02), jitter=0.005)
    trace = _run(server, 301.0, backend, seed=seed)
    ceiling = 1.0 / (1.0 / 20 + 0.005)  # a send may arrive up to 5 ms late
    assert _ok_rate(trace, 150, 300) >= 0.95 * ceiling
    assert _refused(trace) < 0.0075


#: HAProxy's period counter over more than a second: (limit, period, Retry-After).
HAPROXY_PERIODS = [(10, 2.0, 1), (10, 2.0, None), (6, 2.0, 1), (6, 2.0, None), (15, 3.0, None)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("limit", "period", "retry_after"), HAPROXY_PERIODS)
def test_haproxy_periods_longer_than_a_second_are_held_near_their_rate(
    limit: int, period: float, retry_after: int | None, backend: str
) -> None:
    # A period of 2 or 3 s still holds the opening's sends when a told wait
    # of a second ends, and when a knock goes: the second after the wait,
    # counted as an edge, held 10 per 2 s at 2/s for a minute (38 %), and a
    # knock refused once held 6 per 2 s at 0.63/s (23 %); at a bare 429
    # its refusals after a look for a rise were read as a leaky bucket's,
    # then as a window's, and the scope fell back to the edge before (55 %).
    # Short of the 95 %: the window is read from when the server
    # reopened, which the knocks find late, and HAProxy counts them too; at
    # 3/s one refusal is over 1 % of the run. Holding a window once counted
    # the answer that asked twice (79-92 % then, 77-87 % before); 6 per 2 s
    # at a bare 429 then costs six refusals of about 120 sends, one more.
    # The window read off the knocks is a floor, probed after one window,
    # not after ``hold`` (10 s): 89-98 %, where 15 per 3 s got 80 %.
    server = HAProxyRate(limit=limit, period=period, retry_after=retry_after, latency=0.001)
    trace = _run(server, 40.0, backend)
    assert _ok_rate(trace, 20, 40) >= 0.87 * limit / period
    assert _refused(trace) < 0.055
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("server", "rate"),
    [
        (HAProxyRate(limit=20, period=10.0, retry_after=None, latency=0.02), 2.0),
        (QuotaServer(limit=30, window=10.0, retry_after=None, latency=0.05), 3.0),
    ],
    ids=["haproxy-20-per-10s", "fixed-30-per-10s"],
)
def test_a_windows_echoes_of_a_refused_probe_leave_the_edge_it_measured(
    server: ServerModel, rate: float, backend: str
) -> None:
    # A probe refused by a window of 10 s at a bare 429: the window still
    # holds the probe's sends (HAProxy's counts the refused ones too), so
    # the scope closes for a few seconds. Reopened, it searched up again
    # from no edge, was refused at once and measured a lower edge: HAProxy
    # was refused 48 times in five minutes (8.9 %) and held at 83 % over
    # the second half, the fixed window 43 times (4.9 %) at 92.7 %. The
    # edge the probe measured stands now: 23 (4.2 %) at 94.3 %, and 17
    # (1.9 %) at 98.2 %.
    trace = _run(server, 300.0, backend)
    assert _ok_rate(trace, 150, 300) >= 0.93 * rate
    assert _refused(trace) < 0.05


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("limit", "period"), [(30, 20.0), (20, 10.0)])
def test_after_a_probe_refused_by_haproxys_long_period_the_pause_counts_the_refusal_too(
    limit: int, period: float, backend: str
) -> None:
    # HAProxy's period counter counts the refused send too: paused only for
    # what went out above the edge, the scope sent into a counter one over,
    # and the next few sends were refused, each counted in turn. 30 per 20 s
    # at a bare 429: 74.2 % of its rate over the second half of five
    # minutes, 28 refusals (7.6 %); now 95.1 % and 12. 20 per 10 s: 94.3 %
    # and 25 (4.5 %); now 96.0 % and 13 (2.4 %).
    server = HAProxyRate(limit=limit, period=period, retry_after=None, latency=0.05)
    trace = _run(server, 300.0, backend)
    assert _ok_rate(trace, 150, 300) >= 0.93 * limit / period
    assert _refused(trace) < 0.035


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_buckets_stored_burst_spent_is_no_drop_of_the_limit(backend: str) -> None:
    # Held below 5/s, a bucket of 10 refills; a probe drains it, reads as a
    # rise, and the search up falls back to 5/s. Taken for a limit that
    # dropped (from the 10/s the burst counted), that made the holds short
    # for a minute, and every probe found the refilled burst again: 66
    # refusals in five minutes (4.2 %), 28 (1.8 %) now.
    server = BucketServer(rate=5.0, capacity=10, retry_after=None, latency=0.05)
    trace = _run(server, 300.0, backend)
    assert _ok_rate(trace, 150, 300) >= 0.95 * 5.0
    assert _refused(trace) < 0.025


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rise_from_a_long_windows_floor_is_not_taken_back_for_a_stored_burst(
    backend: str,
) -> None:
    # HAProxy's blog recipe, http_req_rate(10s) above 20, with a told wait of
    # a second: the opening's knocks count too, so its closure reads 20 per
    # 15.3 s (65 %). Every probe rose to the real 2/s, was refused, and the
    # refusal after its echoes took that rise for a token bucket's stored
    # burst: back at the floor for a minute, 70.3 % over the second half of
    # five minutes, 20 refusals (4.7 %). Now 94.7 %, 10 refusals (1.9 %).
    trace = _run(HAProxyRate(limit=20, period=10.0, retry_after=1), 300.0, backend)
    assert _ok_rate(trace, 150, 300) >= 0.9 * 2.0
    assert _refused(trace) < 0.03


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_search_up_after_a_short_closure_reads_no_window_from_before_it(backend: str) -> None:
    # A fixed 10 per 10 s from the first request, no headers: a search up
    # after a short closure, refused at its first limit, read a window from
    # when sending began (189 s), and took the refusals of a probe inside
    # so long a horizon for echoes: the probe rose from 1/s to 6/s, refused
    # 60 times in the last 25 s of five minutes (74 in all, 20.3 %). Now a
    # run begins at each reopening: 10.2 s read again, 15 refusals (5.0 %).
    # (90.7 % and 16 since the pause after a long window's refusal counts
    # the refused send too, 96.0 % and 12 before: a probe's edge read a
    # request high is refused again within a horizon of that longer pause,
    # which the count then holds: 0.875/s, not 0.98/s.)
    server = FrameworkLimiter(limit=10, window=10.0, strategy="fixed", headers=False)
    trace = _run(server, 300.0, backend)
    assert _ok_rate(trace, 150, 300) >= 0.9 * 1.0
    assert _refused(trace) < 0.07


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("limit", "window", "seconds"), [(30, 20.0, 300.0), (100, 60.0, 600.0)])
def test_a_fixed_window_without_headers_is_probed_by_whole_windows(
    limit: int, window: float, seconds: float, backend: str
) -> None:
    # Fixed windows from the first request, no headers (Flask-Limiter's
    # defaults). 30 per 20 s: knocks went from 15.3 s to 30.6 s and read the
    # window 30.6 s long. Read right, a probe's count over the window held
    # the end of the window before too (the first one "rose" to 2.6/s at
    # 100 per 60 s), and its closure to the window's end was taken for a
    # limit that moved: 75.1 % and 24 refusals, 76.8 % and 25. A window that
    # lets go having taken what the long window read is now known fixed,
    # its probes confirm the edge, and only a whole window above it is a
    # rise: 95.6 % and 13 (2.9 %), 94.8 % and 17 (1.7 %).
    server = FrameworkLimiter(limit=limit, window=window, strategy="fixed", headers=False)
    trace = _run(server, seconds, backend)
    assert _ok_rate(trace, seconds / 2, seconds) >= 0.93 * limit / window
    assert _refused(trace) < 0.035


@pytest.mark.parametrize("backend", BACKENDS)
def test_haproxys_period_read_long_is_not_taken_for_a_fixed_window(backend: str) -> None:
    # 10 per 10 s at a bare 429, read as 15.3 s from knocks HAProxy counts
    # too. After two refusals confirmed 1.05/s, a closure's window took 10
    # over 15.3 s by chance at 1/s, what the long window was read with: it
    # was taken for a fixed window, and its edge for 0.65/s (76.7 % over
    # the second half of five minutes, 19 refusals). A confirmed edge is
    # not re-read so: 96.0 %, 17 (the opening's knocks at 1/s cost 11).
    trace = _run(HAProxyRate(limit=10, period=10.0, retry_after=None, latency=0.05), 300.0, backend)
    assert _ok_rate(trace, 150, 300) >= 0.93 * 1.0
    assert _refused(trace) < 0.07


@pytest.mark.parametrize("backend", BACKENDS)
def test_nginx_503s_in_the_opening_show_its_leaky_bucket(backend: str) -> None:
    # 5 r/s without burst, at nginx's default 503: the opening's errors came
    # to the leaky bucket's judge only as overload, so the scope cut to
    # 3.5/s, held, and searched up from no edge (90 % at 19 s).
    trace = _run(NginxLimitReq(rate=5, latency=0.05), 40.0, backend)
    assert _ok_rate(trace, 20, 40) >= 0.95 * 5
    assert _time_to(trace, 0.9 * 5) + 5.0 <= 15.0
    assert _refused(trace) < 0.03


@pytest.mark.parametrize("backend", BACKENDS)
def test_nginx_documentation_example_at_503_is_measured_as_a_429_would_be(backend: str) -> None:
    # nginx's own example: rate=1r/s burst=5 nodelay, refusing with 503. Its
    # errors after the opening's burst were an overload cut, a second cut
    # 3 s later and a search up from no edge: 14 refusals in 40 s. At 429
    # the same server costs 4; at 503, measured from the first error, 6.
    trace = _run(NginxLimitReq(rate=1, burst=5, nodelay=True, latency=0.01), 40.0, backend)
    sent = [r for r in trace.requests if r.sent is not None]
    assert sum(1 for r in sent if r.status == 503) <= 9
    assert _ok_rate(trace, 20, 40) >= 0.95 * 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_opening_burst_into_an_unknown_quota(backend: str) -> None:
    server = QuotaServer(limit=10, window=1.0, sliding=True, retry_after=1, latency=0.05)
    trace = _run(server, 5.0, backend)
    first_second = [r for r in trace.requests if r.sent is not None and r.sent < 1.0]
    assert len(first_second) <= 8  # 4/s doubling every half second, not 16 at once


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_quota_that_drops_and_rises_is_followed(backend: str) -> None:
    server = QuotaServer(
        limit=20,
        window=1.0,
        sliding=True,
        retry_after=None,
        latency=0.02,
        reject_latency=0.001,
        changes=((30.0, 10), (60.0, 30)),
    )
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 35, 60) >= 0.9 * 10  # within 5 s of the drop
    assert _ok_rate(trace, 31, 60) <= 10.5
    assert _time_to(trace, 0.9 * 30, span=5.0) <= 60 + 40  # the rise is found by probing
    assert _refused(trace) < 0.03


def _followed(trace: Trace, at: float, rate: float) -> float:
    """Seconds after ``at`` until two seconds end with 90 % of ``rate`` served and none refused."""
    sent = sorted((r.sent, r.status) for r in trace.requests if r.sent is not None)
    end = at + 2.0
    while end <= trace.duration:
        window = [status for t, status in sent if end - 2.0 <= t < end]
        if window.count(200) >= 0.9 * 2 * rate and all(status == 200 for status in window):
            return end - at
        end += 0.25
    return math.inf


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("limit", "latency"), [(10, 0.05), (50, 0.05), (10, 0.2)])
def test_a_quota_that_drops_to_half_is_followed_within_3_s(
    limit: int, latency: float, backend: str
) -> None:
    # The quality suite's changing quota, at other rates and latencies: the
    # first refusal cannot tell the new limit (the window still holds what
    # the old one let through); resumed at the rate held, a second refusal
    # and its wait came within the window (4.25 s).
    server = QuotaServer(
        limit=limit,
        window=1.0,
        sliding=True,
        retry_after=1,
        latency=latency,
        reject_latency=0.001,
        changes=((20.0, limit // 2),),
    )
    trace = _run(server, 30.0, backend)
    assert _followed(trace, 20.0, limit / 2) <= 3.0
    assert _refused(trace) < 0.02
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rise", [38.0, 40.0, 50.0])
def test_after_a_drop_a_rise_is_followed_within_15_s_wherever_it_falls(
    rise: float, backend: str
) -> None:
    # With Retry-After: 1 each failed probe costs a second, so a steady edge
    # is probed about once a minute (a rise was found past 100 s); after a
    # drop (a limit that moved may move back) every half ``hold`` for a
    # minute, climbing faster. A rise is followed after a hold, a probe and
    # a search up: with the whole 10 s hold, one that came just after a
    # failed probe took 16 to 19 s; with half of it, 8 to 14 s.
    server = QuotaServer(
        limit=10,
        window=1.0,
        sliding=True,
        retry_after=1,
        latency=0.05,
        reject_latency=0.001,
        changes=((20.0, 5), (rise, 15)),
    )
    trace = _run(server, rise + 25.0, backend)
    assert _ok_rate(trace, 25, rise) >= 0.85 * 5  # the probes' price while the limit stays
    assert _time_to(trace, 0.9 * 15, span=2.0) + 2.0 - rise <= 15.0
    assert _refused(trace) < 0.02
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_long_window_is_learned_from_how_long_the_server_stays_closed(backend: str) -> None:
    # 60 per sliding minute, bare 429s: the first window is spent before the
    # first refusal says anything, and the server then stays closed for a
    # minute. Adaptive waits it out with few knocks (doubling pauses), then
    # paces at what one window allowed instead of bursting again.
    server = QuotaServer(
        limit=60, window=60.0, sliding=True, retry_after=None, latency=0.05, reject_latency=0.001
    )
    trace = _run(server, 300.0, backend)
    first = [r for r in trace.requests if r.sent is not None and r.sent < 60]
    assert sum(1 for r in first if r.status == 429) <= 10
    assert _ok_rate(trace, 70, 300) >= 0.95 * 1.0
    late = [r for r in trace.requests if r.sent is not None and r.sent >= 70]
    # A probe above the edge costs one refusal; then the scope sends only as
    # the window lets go of the probe's sends (by the rate alone it refused
    # once in about ten seconds for a whole window: 2.7 % refused).
    assert sum(1 for r in late if r.status == 429) / len(late) < 0.015


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_long_window_met_by_the_search_up_is_learned_though_it_reopens_soon(
    backend: str,
) -> None:
    # 100 per sliding 10 s, "Retry-After: 1" whatever the wait: the search up
    # spends the window in 5 s, mostly in its last second, and the window
    # lets go of its first, sparse sends after another 5 s: closed for less
    # time than it had been open. That was taken for a limit that moved, and
    # the scope was held at what its knocks measured: 24 % of the limit.
    server = QuotaServer(
        limit=100, window=10.0, sliding=True, retry_after=1, latency=0.2, reject_latency=0.001
    )
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.93 * 10.0
    assert _refused(trace) < 0.02
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fixed_long_window_spent_early_is_knocked_at_not_sent_into(backend: str) -> None:
    # 100 per fixed 10 s, bare 429s. A probe that spends a window before its
    # end closes the server until the next one; the scope sent on into it at
    # its rate, every refusal taken for an echo of the probe's (the window
    # counted from its own sends let them go): 8.4 % of requests refused.
    server = QuotaServer(
        limit=100, window=10.0, retry_after=None, latency=0.05, reject_latency=0.001
    )
    trace = _run(server, 120.0, backend)
    assert _refused(trace) < 0.02
    assert _ok_rate(trace, 60, 120) >= 0.85 * 10.0
    assert_respects(trace, CEILING, retry_after=True)


@attrs.frozen
class Banned:
    """``server``, refusing every request with a bare ``status`` from ``start`` for ``length`` s."""

    server: ServerModel
    start_at: float
    length: float
    status: int = 429

    def start(self, rng: random.Random) -> Responder:
        respond = self.server.start(rng)

        def answer(request: SimRequest, now: float) -> SimResponse:
            if self.start_at <= now < self.start_at + self.length:
                return SimResponse(status=self.status, latency=0.001)
            return respond(request, now)

        return answer


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("length", [5.0, 20.0])
def test_after_a_ban_the_edge_is_searched_for_again(length: float, backend: str) -> None:
    # 10 per sliding second held for 50 s, then every request refused for a
    # while (a temporary ban, a server down). The knocks through the ban
    # measure nothing; once it lifts, the scope searches up and finds the
    # edge again. It was held at what the knocks had measured and crept
    # back: after 5 s banned, 1, 4, 5, 16, 75, 88 requests per 10 s; after
    # 20 s, 3 per 10 s for the rest of the run.
    quota = QuotaServer(limit=10, window=1.0, sliding=True, retry_after=1, latency=0.05)
    trace = _run(Banned(quota, 50.0, length), 120.0, backend)
    lifted = 50.0 + length
    # Knocks come after pauses doubling from 1 s, so the lift is seen by
    # twice the ban's length at most; ten seconds later the edge is held.
    back = 50.0 + 2 * length + 10.0
    assert _ok_rate(trace, back, 120) >= 0.93 * 10.0
    outside = [r for r in trace.requests if r.sent is not None and not 50 <= r.sent < lifted]
    assert sum(1 for r in outside if r.status == 429) / len(outside) < 0.02
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("limit", "window"), [(300, 60.0), (100, 10.0)])
def test_a_long_window_that_tells_its_wait_is_paced_at_what_one_window_allowed(
    limit: int, window: float, backend: str
) -> None:
    # N per sliding window, 429 with a Retry-After until a send leaves it:
    # the first window is spent in seconds and the server says to wait most
    # of it. After the wait the window lets go of the first run's sends one
    # by one; held at what the last second got through, the scope ran at
    # 77 % (300 per minute) and 84 % (100 per 10 s) of the limit.
    server = QuotaServer(
        limit=limit,
        window=window,
        sliding=True,
        retry_after="reset",
        latency=0.05,
        reject_latency=0.001,
    )
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.93 * limit / window
    assert _refused(trace) < 0.01
    assert_respects(trace, CEILING, retry_after=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("latency", [2.0, 5.0])
def test_a_slow_api_is_measured_once_its_answers_are_in(latency: float, backend: str) -> None:
    # An LLM-style API: 3 requests per sliding second, answers in seconds,
    # bare 429s in 1 ms. At a refusal most of the second's requests are
    # still in flight; the edge is counted when they have answered.
    server = QuotaServer(
        limit=3, window=1.0, sliding=True, retry_after=None, latency=latency, reject_latency=0.001
    )
    policy = ScopePolicy(concurrency=32, delay=0, slot_delay=0, adaptive=Adaptive())
    trace = _run(server, 150.0, backend, policy)
    assert _ok_rate(trace, 30, 130) >= 0.94 * 3
    assert _refused(trace) < 0.02
    assert_respects(trace, policy)


def test_refusals_while_holding_widen_the_margin_below_the_edge() -> None:
    # Sends that reach the server less evenly than they leave are refused
    # below the edge: the margin doubles (up to half), the second time to one
    # request per second below the edge, and halves again after a hold that
    # passes without a refusal.
    policy = ScopePolicy(
        concurrency=16, delay=0, slot_delay=0, adaptive=Adaptive(hold=5, max_hold=5)
    )
    ledger = ScopeLedger("api.test", policy)
    adaptive = ledger.controllers[0]
    now = 0.0

    def send(status: int) -> None:
        nonlocal now
        now += 0.1
        ledger.on_feedback(Feedback(status=status, latency=0.001, sent_at=now), now + 0.001)

    for _ in range(30):  # slow start up to 10/s
        send(200)
    send(429)
    edge = adaptive.rate_loop.edge
    assert edge is not None
    margins = []
    for _ in range(4):
        for _ in range(20):
            send(200)
        send(429)  # refused while holding
        margins.append(adaptive.rate_loop.margin)
    # Each confirms the edge (10/s, within a request of the first count):
    # the second goes to 9/s with the 2 % headroom, a margin of 11.8 %.
    assert margins == pytest.approx([0.04, 0.118, 0.236, 0.472])
    assert adaptive.rate_loop.target == pytest.approx(adaptive.rate_loop.edge * 0.528)
    for _ in range(60):  # a whole hold without a refusal
        send(200)
    assert adaptive.rate_loop.margin == pytest.approx(0.236)


#: Limits beyond the benchmark's sites, each kind at another size, window, wait
#: or latency: (server, allowed rate, the share of it required over the
#: second half of 120 s, the share of requests that may be refused). The
#: floors are what Adaptive does today less a few points, so a change that
#: helps one kind of site at another's cost shows. Some are known weak (the
#: comments say why); the numbers before this session's fixes are noted.
SWEEP: dict[str, tuple[ServerModel, float, float, float]] = {
    "2 per sliding second, bare 429, 200 ms": (
        QuotaServer(limit=2, window=1.0, sliding=True, retry_after=None, latency=0.2),
        2.0,
        0.9,
        0.03,
    ),
    "50 per sliding second, Retry-After, 200 ms": (
        QuotaServer(limit=50, window=1.0, sliding=True, latency=0.2, reject_latency=0.001),
        50.0,
        0.93,
        0.01,
    ),
    "20 per sliding 5 s, bare 429, 200 ms (was 62 %, 6.7 % refused)": (
        QuotaServer(
            limit=20, window=5.0, sliding=True, retry_after=None, latency=0.2, reject_latency=0.001
        ),
        4.0,
        0.88,
        0.03,
    ),
    # Weak: the one-second horizon overstates a 5 s window's rate.
    "20 per sliding 5 s, Retry-After until a send leaves it": (
        QuotaServer(limit=20, window=5.0, sliding=True, latency=0.02, reject_latency=0.001),
        4.0,
        0.78,
        0.035,
    ),
    # Weak: a fixed window's one-second count at a refusal is up to twice its limit.
    "10 per fixed second, bare 429": (
        QuotaServer(limit=10, window=1.0, retry_after=None, latency=0.05, reject_latency=0.001),
        10.0,
        0.7,
        0.03,
    ),
    "10 per fixed 2 s, draft-10 headers, 200 ms": (
        QuotaServer(
            limit=10,
            window=2.0,
            retry_after=None,
            rate_limit_headers="ietf",
            latency=0.2,
            reject_latency=0.001,
        ),
        5.0,
        0.95,
        0.0,
    ),
    # At most w / (w + latency) = 83 %: a window's last answer announces a
    # whole second from when it leaves the server.
    "10 per fixed second, draft-10 headers, 200 ms": (
        QuotaServer(
            limit=10,
            window=1.0,
            retry_after=None,
            rate_limit_headers="ietf",
            latency=0.2,
            reject_latency=0.001,
        ),
        10.0,
        0.8,
        0.0,
    ),
    # Weak: each refusal costs a whole second's wait where a tenth would do.
    "leaky bucket of 10/s, Retry-After in whole seconds": (
        BucketServer(rate=10.0, retry_after="reset", latency=0.05, reject_latency=0.001),
        10.0,
        0.72,
        0.02,
    ),
    "token bucket of 10/s holding 20, bare 429": (
        BucketServer(rate=10.0, capacity=20, latency=0.05, reject_latency=0.001),
        10.0,
        0.93,
        0.035,
    ),
}


@pytest.mark.parametrize("site", sorted(SWEEP))
def test_sites_beyond_the_benchmark_are_used_without_refusals(site: str) -> None:
    # asyncio only: the trio runs of the sites above cover the other backend.
    server, rate, share, refused = SWEEP[site]
    trace = simulate(
        CEILING, server, burst(URL, int(rate * 120 * 1.3) + 50), duration=120.0, backend="asyncio"
    )
    assert _ok_rate(trace, 60, 120) >= share * rate
    sent = [r for r in trace.requests if r.sent is not None]
    assert sum(1 for r in sent if r.status != 200) / len(sent) <= refused
    assert_respects(trace, CEILING, retry_after=True)


# -- load, errors, overload -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_bound_server_near_capacity_without_queueing(backend: str) -> None:
    server = CapacityServer(workers=4, service_time=0.05)  # 80/s; 50 ms one at a time
    trace = _run(server, 30.0, backend)
    assert _ok_rate(trace, 10, 30) >= 0.9 * 80
    latencies = sorted(r.responded - r.sent for r in trace.requests if r.status == 200)
    p95 = latencies[int(0.95 * len(latencies))]
    assert p95 <= 2 * 0.05


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_large_server_with_varied_service_times_is_used_to_its_capacity(backend: str) -> None:
    # 16 workers, exponential service times of 100 ms (160/s), ceiling 64.
    # Round means of 30 such latencies vary by a fifth, and the lowest of
    # an epoch's, taken for the latency without a queue, read every round
    # as a queue of a quarter of the limit: it held about 12 in flight, 49 %
    # of the capacity.
    server = CapacityServer(workers=16, service_time=0.1, exponential=True)
    policy = ScopePolicy(concurrency=64, delay=0, slot_delay=0, adaptive=Adaptive())
    trace = _run(server, 40.0, backend, policy)  # (the 8,000 requests last 50 s)
    assert _ok_rate(trace, 10, 40) >= 0.9 * 160
    # One request at a time, the p95 of an exponential is three means.
    assert _p95_latency(trace, 10) <= 2 * 3 * 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_very_large_server_with_varied_service_times_stays_used(backend: str) -> None:
    # 64 workers, exponential service times of 200 ms (320/s), ceiling 256.
    # The floor is the lowest of an epoch's round means, and a lower limit
    # makes more, smaller rounds, whose lowest lies lower still: the queue
    # read from it cut the limit from 55 to 21 over a minute (35 % of the
    # capacity over the second half) while no request ever queued.
    server = CapacityServer(workers=64, service_time=0.2, exponential=True)
    policy = ScopePolicy(concurrency=256, delay=0, slot_delay=0, adaptive=Adaptive())
    trace = simulate(policy, server, burst(URL, 20_000), duration=50.0, backend=backend)  # type: ignore[arg-type]
    assert _ok_rate(trace, 25, 50) >= 0.9 * 320
    assert _p95_latency(trace, 25) <= 2 * 3 * 0.2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("workers", "service_time"), [(1, 0.05), (2, 1.0)])
def test_a_server_that_serves_few_at_once_is_not_queued_at(
    workers: int, service_time: float, backend: str
) -> None:
    # A queue of four (the threshold for a large server) at a one-worker
    # server is five times its latency: it was 4x at one worker, 2.75x at two.
    server = CapacityServer(workers=workers, service_time=service_time)
    duration = 60.0 if service_time < 0.5 else 120.0
    trace = _run(server, duration, backend)
    capacity = workers / service_time
    assert _ok_rate(trace, duration / 2, duration) >= 0.9 * capacity
    assert _p95_latency(trace, duration / 2) <= 2 * service_time + 1e-9


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_that_never_limits_is_used_up_to_the_ceiling(backend: str) -> None:
    # A CDN answering every page in 50 ms however many are in flight: the
    # policy's ceiling (16 in flight, so 320/s) is the only limit, reached
    # within seconds (the rate doubles each half second while it is used).
    trace = _run(CDNServer(hit_ratio=1.0, hit_latency=0.05), 20.0, backend)
    ceiling = 16 / 0.05
    assert _ok_rate(trace, 10, 20) >= 0.9 * ceiling
    assert _time_to(trace, 0.9 * ceiling, span=2.0) <= 6.0
    assert _refused(trace) == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_errors_cost_little(backend: str) -> None:
    def site(error_rate: float) -> FlakyServer:
        return _random_503s(error_rate, CapacityServer(workers=4, service_time=0.05))

    policy = attrs.evolve(CEILING, concurrency=8)
    clean = _run(site(0.0), 30.0, backend, policy)
    flaky = _run(site(0.05), 30.0, backend, policy)
    sent = sum(1 for r in flaky.requests if r.sent is not None and r.sent >= 10)
    clean_sent = sum(1 for r in clean.requests if r.sent is not None and r.sent >= 10)
    assert sent >= 0.9 * clean_sent


def test_a_minute_window_with_bare_429s_is_probed_every_few_windows_and_its_rise_followed() -> None:
    """60 per sliding minute: under 2 % refused over ten windows, a rise followed within five.

    Probing every ``max_hold`` (a window) cost one refusal per window (2.5 %).
    """
    server = QuotaServer(
        limit=60, window=60.0, sliding=True, retry_after=None, changes=((600.0, 120),)
    )
    trace = _run(server, 900.0, "asyncio")
    first = [r for r in trace.requests if r.sent is not None and r.sent < 600.0]
    refused = sum(1 for r in first if r.status == 429)
    assert refused < 0.02 * len(first), refused
    followed = next(
        (start for start in range(600, 900) if _ok_rate(trace, start, start + 60) >= 0.9 * 2),
        None,
    )
    assert followed is not None
    assert followed <= 600 + 4 * 60, followed


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("limit", "window", "seconds"), [(60, 60.0, 300.0), (30, 10.0, 120.0)])
def test_a_long_window_answering_503_is_waited_out_not_knocked_at(
    limit: int, window: float, seconds: float, backend: str
) -> None:
    # N per sliding window, 503 beyond: once the window is spent, nothing is
    # accepted until it slides. Cut after cut at a lower rate kept sending
    # into the closed window (47 % and 19 % of the requests refused); waiting,
    # longer each time, and knocking once after each wait, as after 429s,
    # does not. (The search up after the window reopens was once blind to
    # its own refusals, taken for echoes of the cut over the long window.)
    server = QuotaServer(
        limit=limit, window=window, sliding=True, status=503, retry_after=None, latency=0.05
    )
    trace = _run(server, seconds, backend)
    answered = [r for r in trace.requests if r.status is not None]
    refused = sum(r.status == 503 for r in answered)
    assert refused <= 0.1 * len(answered)
    assert _ok_rate(trace, seconds / 2, seconds) >= 0.85 * limit / window


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sliding", [True, False])
def test_a_rate_limit_that_answers_503_is_held_below_like_a_429(
    sliding: bool, backend: str
) -> None:
    # nginx's limit_req answers 503 by default, with no Retry-After: read as
    # overload, the scope cut and climbed back over and over (92 %, 6 % refused).
    server = QuotaServer(
        limit=10, window=1.0, sliding=sliding, status=503, retry_after=None, latency=0.05
    )
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.95 * 10
    sent = [r for r in trace.requests if r.sent is not None]
    assert sum(1 for r in sent if r.status == 503) / len(sent) < 0.02
    # The first errors cut as overload; the sends after the cut, all
    # accepted, say it was not (90 % by 25 s when a 10 s hold had to pass).
    assert _time_to(trace, 0.9 * 10) + 5.0 <= 15.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("limit", [20, 40])
def test_errors_past_an_edge_measured_once_a_limit_in_flight_was_disproved_are_its_refusals(
    limit: int, backend: str
) -> None:
    # A sliding window answering 503, 200 ms per page: at 20/s the opening
    # holds 4 in flight and was taken for a limit in flight, which a refusal
    # below it disproved, measuring the edge as a rate limit's. The probe
    # past that edge after the hold was then refused 22 times in a row (35
    # in the minute, 51 at 40/s), its 503s weighed as random errors until
    # their share cut for overload.
    trace = _run(_bare_503_window(limit, sliding=True, latency=0.2), 60.0, backend)
    late = [r for r in trace.requests if r.sent is not None and r.sent >= 10]
    assert sum(1 for r in late if r.status == 503) <= 6
    assert _ok_rate(trace, 30, 60) >= 0.95 * limit


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("sliding", "latency"), [(True, 0.05), (False, 0.02), (False, 0.05)])
def test_a_bare_503_limit_ends_the_opening_after_three_refusals_as_a_429s_after_one(
    sliding: bool, latency: float, backend: str
) -> None:
    # 20/s answering a bare 503: the opening's errors were taken for a
    # limit's once they were a quarter of at least 10 outcomes; past a long
    # clean run that took 5 refusals, and on a fixed window, with more in
    # flight, an overload cut, a closure and a search up from nothing: 38
    # to 40 refusals in a minute. A bare 429 there costs 2.
    trace = _run(_bare_503_window(20, sliding=sliding, latency=latency), 60.0, backend)
    opening = [r for r in trace.requests if r.sent is not None and r.sent < 10]
    assert sum(1 for r in opening if r.status == 503) <= 5
    assert _ok_rate(trace, 30, 60) >= 0.95 * 20


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("rate", [5.0, 10.0])
def test_a_leaky_bucket_without_burst_is_held_at_its_interval(
    rate: float, status: int, backend: str
) -> None:
    # nginx's limit_req with no burst refuses any request sooner than 1/rate
    # after the last one: the second before a refusal holds a request less
    # than the limit, so each search found one more (edges 6, 7, 8, 9, each
    # taken for a confirmation that doubled the hold): 88 % at 120 s. At
    # 5/s a probe read a rise before it reached the limit, and the search up
    # was refused at its first early send, read as the old pace: 58 %.
    server = BucketServer(rate=rate, status=status, latency=0.05, reject_latency=0.001)
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.95 * rate
    sent = [r for r in trace.requests if r.sent is not None]
    late = [r for r in sent if r.sent >= 60]
    assert sum(1 for r in late if r.status == status) / len(late) < 0.02
    # The first errors of a 503 limit cut as overload: at 5/s they are 2.7 %
    # of the run's requests.
    assert sum(1 for r in sent if r.status == status) / len(sent) < (0.02 if rate >= 10 else 0.03)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slow_leaky_bucket_is_held_at_its_rate_not_half_of_it(backend: str) -> None:
    # nginx's limit_req at 2 r/s: a probe's edge, counted over the two
    # horizons up to its last acceptance, read 1/s when the log kept only
    # two horizons back from the refusal a gap later (48 % of what it allows).
    trace = _run(NginxLimitReq(rate=2, status=429, latency=0.001), 60.0, backend)
    assert _ok_rate(trace, 30, 60) >= 0.9 * 2
    assert _refused(trace) < 0.04


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_leaky_bucket_slower_than_one_per_horizon_is_held_by_its_gaps(backend: str) -> None:
    # nginx's limit_req at 30r/m (0.5 r/s): a second holds one request or
    # none, so each probe's count read 0.42/s, "confirmed" at every probe
    # (80 % of the rate). The probe's last gap accepted reads 0.497/s.
    trace = _run(NginxLimitReq(rate=0.5, status=429, latency=0.05), 240.0, backend)
    assert _ok_rate(trace, 120, 240) >= 0.9 * 0.5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rate", [2.0, 3.0])
def test_a_leaky_bucket_that_refuses_the_second_request_is_not_held_at_one_per_second(
    rate: float, backend: str
) -> None:
    # nginx at 2 or 3 r/s refuses the opening's second request, sent 0.25 s
    # after the first: one acceptance in a second read as an edge of 1/s,
    # held for 10 s and probed up slowly (3 r/s: 63 % of it over the second
    # half of 40 s). The search goes on in a leaky bucket's steps instead.
    trace = _run(NginxLimitReq(rate=rate, status=429, latency=0.05), 40.0, backend)
    assert _ok_rate(trace, 20, 40) >= 0.85 * rate
    assert _refused(trace) < 0.05


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rate", [2.0, 4.0, 5.0])
def test_a_leaky_bucket_of_a_few_per_second_is_found_in_the_opening(
    rate: float, backend: str
) -> None:
    # nginx at 4 or 5 r/s refuses the first send of the opening's doubling
    # after two gaps accepted at 4/s, and the third gap the judge asked for
    # never came: the second's count (3/s) was held for 20 s (89 % of 5 r/s
    # over the second half). At 2 r/s the search in a leaky bucket's steps
    # shortens each gap by a quarter, short of the half the judge asked for:
    # counted over a second that was speeding up, 1.56/s (92.5 %).
    trace = _run(NginxLimitReq(rate=rate, status=429, latency=0.05), 40.0, backend)
    assert _ok_rate(trace, 20, 40) >= 0.94 * rate
    assert _ok_rate(trace, 12, 20) >= 0.9 * rate
    assert _refused(trace) < 0.05


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slow_limit_answering_503_is_cut_to_what_gets_through(backend: str) -> None:
    # nginx's limit_req at 1 r/s with its default 503: each overload cut
    # took 0.7 of the rate and its own run of errors (16, 3.5, 2.45, 1.7,
    # 1.2, 0.84/s), 43 % of the sends refused; a cut goes just below what
    # got through when most sends were refused.
    trace = _run(NginxLimitReq(rate=1, latency=0.05), 60.0, backend)
    assert _ok_rate(trace, 30, 60) >= 0.9 * 1
    assert _refused(trace) < 0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stored_burst_spent_after_a_long_hold_is_not_held_at_a_rough_count(
    backend: str,
) -> None:
    # A token bucket of 50/s and 50 stored (a Go or Traefik limiter's
    # rate=50, burst=50): the pauses after the cuts refill the burst, and
    # the edge of 100/s was confirmed twice (a hold of 40 s). Three of six
    # sends after the third cut were refused: no faster than 40.9/s, what
    # the three accepted in 73 ms read, held for the 40 s (82 % of it).
    trace = _run(
        NginxLimitReq(rate=50, burst=50, nodelay=True, status=429, latency=0.02), 40.0, backend
    )
    assert _ok_rate(trace, 20, 40) >= 0.9 * 50
    assert _refused(trace) < 0.02


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_small_stored_burst_is_not_taken_for_a_higher_limit(backend: str) -> None:
    # nginx's limit_req with burst=5 answering 503: held below 10/s it
    # stores a few requests, which a probe spends (a rise); the search up is
    # refused at once, and the climb from what the probe proved is refused at
    # no faster pace: that was the stored burst, and the edge stays 10/s
    # (read as 11/s, the errors of holding above it were too few to cut on).
    server = BucketServer(rate=10.0, capacity=6, status=503, latency=0.05, reject_latency=0.001)
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.95 * 10
    assert _late_share(trace, 503) < 0.015


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("rate", "capacity", "refused"),
    [
        (7.0, 3, 0.02),
        (10.0, 3, 0.02),
        (40.0, 6, 0.02),
        (1.0, 3, 0.04),
        (7.0, 6, 0.04),
        (20.0, 5, 0.01),
    ],
)
def test_nginx_burst_limits_answering_503_are_held_below_their_rate(
    backend: str, rate: float, capacity: int, refused: float
) -> None:
    # nginx's limit_req with burst=2 or 5 answering 503.
    # At 7, 10 and 40/s a probe that spends the stored requests confirms the
    # edge a request high, and held just above the rate one send in 13 is
    # refused, too few errors to tell from random ones (5.2 %, 7.3 % and
    # 5.1 % refused over the second half). As a 429 there would, they widen
    # the margin a little (at 7/s, a request's worth: the count of a second
    # is that coarse).
    # At 1r/s with burst=2, or 7r/s with burst=5, the cuts for overload
    # ended a tenth or a fifth above the rate, where the errors were too few
    # to cut again but never stopped, so they never proved a limit; the hold
    # ended, the search went up into them again, round after round (34 % and
    # 14.8 % refused). Below what got through they stop, and the limit is
    # found (at 1/s each probe's refusal is one in 30 sends).
    # At 20/s with burst=4, the margin widened by errors while holding still
    # held above the rate, where one send in 20 was refused for the rest of
    # the hold (1.2 %). Between its refusals a bucket lets through its rate,
    # and the scope now holds no faster than what got through: the second
    # half holds one or two looks for a rise, five refusals each (0.4 to 0.9 %).
    server = BucketServer(
        rate=rate, capacity=capacity, status=503, latency=0.05, reject_latency=0.001
    )
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.95 * rate
    assert _late_share(trace, 503) < refused


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fixed_windows_run_of_503_refusals_is_one_refusal_not_an_overload(
    backend: str,
) -> None:
    # 50 per fixed second answering 503: the end of each window refuses a
    # run of sends at once. Once its errors were known to be a limit's, the
    # echoes of one refusal still counted toward the overload share, ten of
    # them cut for overload, and the test began again every three seconds
    # (80 % of the limit, 14 % refused over the second half).
    trace = _run(_bare_503_window(50, sliding=False, latency=0.05), 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.95 * 50
    assert _late_share(trace, 503) < 0.01


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_policys_jitter_does_not_space_sends_at_a_measured_limit(backend: str) -> None:
    # Scrapy's RANDOMIZE_DOWNLOAD_DELAY (on by default) jittered Adaptive's
    # pace too: some sends came closer than the limit allows, and the margin
    # widened on the refusals (5/s held at 3.4/s).
    server = QuotaServer(limit=5, window=1.0, sliding=True, retry_after=1, latency=0.05)
    policy = ScopePolicy(concurrency=16, delay=0, slot_delay=0, jitter=0.5, adaptive=Adaptive())
    trace = _run(server, 120.0, backend, policy)
    assert _ok_rate(trace, 60, 120) >= 0.95 * 5
    assert _refused(trace) < 0.02


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_buckets_stored_burst_confirms_the_edge_it_left(backend: str) -> None:
    # 8/s with 40 stored: held just below 8/s the bucket refills, a probe
    # drains it and reads as a rise, and the search up ends back at 8/s.
    # That edge was taken as new each time (a 10 s hold, 3.6 % refused over
    # the second half); it confirms the edge from before the rise.
    server = BucketServer(rate=8.0, capacity=40, latency=0.05, reject_latency=0.001)
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.95 * 8
    assert _late_share(trace, 429) < 0.03


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_random_errors_taken_for_a_limit_are_found_out(seed: int, backend: str) -> None:
    # One random error in ten, in front of 50/s: an early burst of them can
    # cut as overload, a clean run after it can pass for a limit's, and then
    # every error cut a lower edge (down to 2/s, seed 1). Errors that go on
    # below each edge are random: the scope searches up again.
    def site(error_rate: float) -> FlakyServer:
        return _random_503s(
            error_rate,
            CapacityServer(workers=5, service_time=0.1, exponential=True),
            error_latency=0.001,
        )

    def second_half(error_rate: float) -> float:
        trace = simulate(
            CEILING,
            site(error_rate),
            burst(URL, 8000),
            duration=60.0,
            seed=seed,
            backend=backend,  # type: ignore[arg-type]
        )
        return _ok_rate(trace, 30, 60)

    assert second_half(0.1) >= 0.85 * second_half(0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_requests_that_hang_do_not_take_the_capacity_s_places(backend: str) -> None:
    # 2 % of requests hang until the client's 10 s timeout, never reaching the
    # server: about ten places in flight at 50/s. Counted in the concurrency
    # loop's limit, they left the server a few (60 % of its capacity).
    server = FlakyServer(
        error_rate=0.0,
        timeout_rate=0.02,
        timeout=10.0,
        origin=CapacityServer(workers=5, service_time=0.1, exponential=True),
    )
    trace = _run(server, 120.0, backend)
    assert _ok_rate(trace, 60, 120) >= 0.8 * 50 * 0.98


def test_a_hung_request_s_place_is_given_back_for_as_long_as_it_hung() -> None:
    policy = ScopePolicy(concurrency=16, delay=0, slot_delay=0, adaptive=Adaptive())
    ledger = ScopeLedger("api.test", policy)
    state = ledger.controllers[0]
    for second in range(20):  # answers in 50 ms
        now = float(second)
        ledger.on_feedback(Feedback(status=200, latency=0.05, sent_at=now - 0.05), now)
    limit = state.concurrency
    ledger.on_feedback(Feedback(exception=TimeoutError(), sent_at=10.0), 20.0)
    assert state.concurrency == limit + 1  # one more hangs now, by Little's law
    ledger.on_feedback(Feedback(status=200, latency=0.05, sent_at=29.0), 29.05)
    assert state.concurrency == limit + 1
    ledger.on_feedback(Feedback(status=200, latency=0.05, sent_at=30.0), 30.05)
    assert state.concurrency == limit  # ten seconds on: gone
    ledger.on_feedback(Feedback(exception=TimeoutError(), sent_at=30.5), 30.6)
    assert state.concurrency == limit  # a quick failure did not hang


@pytest.mark.parametrize("backend", BACKENDS)
def test_sustained_overload_backs_off_hard(backend: str) -> None:
    server = FlakyServer(
        latency=0.05, error_rate=0.5, error_statuses=(503,), timeout_rate=0.0, reset_rate=0.0
    )
    trace = _run(server, 30.0, backend)
    late = [r for r in trace.requests if r.sent is not None and r.sent >= 20]
    assert len(late) / 10 < 5  # from hundreds per second to a trickle


@attrs.frozen
class FailsFrom:
    """``server`` until ``at`` seconds, then a 503 for every other request."""

    server: ServerModel
    at: float

    def start(self, rng: random.Random) -> Responder:
        respond = self.server.start(rng)
        count = 0

        def answer(request: SimRequest, now: float) -> SimResponse:
            nonlocal count
            if now < self.at:
                return respond(request, now)
            count += 1
            return SimResponse(status=503 if count % 2 else 200, latency=0.05)

        return answer


@pytest.mark.parametrize("backend", BACKENDS)
def test_overload_after_a_long_window_is_cut_at_once(backend: str) -> None:
    # A throttle's echoes are told over the horizon, a minute here: errors
    # sent within it must still count toward the overload share.
    long_window = QuotaServer(
        limit=60, window=60.0, sliding=True, retry_after=None, latency=0.05, reject_latency=0.001
    )
    # The failures start just after a probe's refusal (about 149 s).
    trace = _run(FailsFrom(long_window, at=150.0), 210.0, backend)
    late = [r for r in trace.requests if r.sent is not None and r.sent >= 180]
    # About one a second until then; cut within 20 s or so and again after
    # (16 in the last 30 s; 30 when the errors were taken for echoes).
    assert len(late) < 22, len(late)


# -- invariants (hypothesis) --------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limit=st.integers(2, 30),
    window=st.sampled_from([1.0, 2.0, 10.0]),
    headers=st.sampled_from([None, "ietf", "legacy", "x-ratelimit"]),
    retry_after=st.sampled_from([None, 1, "reset"]),
    concurrency=st.integers(1, 16),
    delay=st.sampled_from([0.0, 0.05, 0.2]),
)
def test_never_inside_a_wait_never_above_the_ceiling_never_more_than_remains(
    limit: int,
    window: float,
    headers: Any,
    retry_after: Any,
    concurrency: int,
    delay: float,
) -> None:
    server = QuotaServer(
        limit=limit,
        window=window,
        retry_after=retry_after,
        rate_limit_headers=headers,
        latency=0.05,
    )
    policy = ScopePolicy(concurrency=concurrency, delay=delay, slot_delay=0, adaptive=Adaptive())
    trace = simulate(policy, server, burst(URL, 300), duration=30.0)
    # The policy is a hard ceiling (concurrency, delay), and no send falls
    # inside a Retry-After the server announced.
    assert_respects(trace, policy, retry_after=True)
    if headers is not None:
        _assert_never_more_in_flight_than_remains(trace)


def _assert_never_more_in_flight_than_remains(trace: Trace) -> None:
    """Replay the run: no send while as many requests are in flight as the server said remain."""
    events = []
    for record in trace.requests:
        if record.sent is not None:
            events.append((record.sent_seq, "send", record))
        if record.responded is not None:
            events.append((record.response_seq, "response", record))
    in_flight = 0
    cap, cap_until = math.inf, -math.inf
    for _, kind, record in sorted(events, key=lambda event: event[0]):
        if kind == "response":
            in_flight -= 1
            info = parse(record.headers, now=0.0)
            if info.remaining is not None and info.reset:
                assert record.responded is not None
                cap, cap_until = max(1, int(info.remaining)), record.responded + info.reset
            continue
        assert record.sent is not None
        if record.sent < cap_until:
            assert in_flight < cap, f"sent at {record.sent} with {in_flight} in flight, {cap} left"
        in_flight += 1


# -- state, settings, statistics -----------------------------------------------------------


def test_state_is_plain_data_and_round_trips_through_json() -> None:
    policy = CEILING
    ledger = ScopeLedger("api.test", policy)
    adaptive = ledger.controllers[0]
    now = 0.0
    for i in range(200):
        now += 0.05
        status = 429 if i % 37 == 36 else 200
        ledger.in_flight = 1
        ledger.on_feedback(Feedback(status=status, latency=0.05, sent_at=now - 0.05), now)
    state = json.loads(json.dumps(adaptive.get_state()))
    copy = policy.adaptive.controller(policy)  # type: ignore[union-attr]
    copy.set_state(state)
    assert copy.get_state() == adaptive.get_state()
    view = ScopeSnapshot(name="api.test", policy=policy, delay=0.1, concurrency=4, in_flight=1)
    for controller in (adaptive, copy):
        controller.on_feedback(view, Feedback(status=429, latency=0.01, sent_at=now), now + 0.01)
    assert copy.get_state() == adaptive.get_state()


def test_statistics_say_what_adaptive_does() -> None:
    limiter = Limiter(default=CEILING, concurrency=None)
    simulate(limiter, POLICY_SITES["bare fast 429"][0], burst(URL, 500), duration=20.0)
    statistics = limiter.scope_statistics("api.test")
    assert statistics is not None
    assert "edge" in statistics.reason, statistics.reason
    assert statistics.delay > 0


def test_settings_enable_adaptive() -> None:
    limiter = Limiter.from_settings(
        {
            "THROTTLING_ADAPTIVE": {"start_rate": 2, "max_hold": 30},
            "THROTTLING_SCOPES": {"api.test": {"adaptive": False}, "b.test": {"adaptive": True}},
        }
    )
    assert limiter.default.adaptive == Adaptive(start_rate=2.0, max_hold=30.0)
    assert limiter.policy("api.test").adaptive is None
    assert limiter.policy("b.test").adaptive == limiter.default.adaptive
    assert Limiter.from_settings({"THROTTLING_ADAPTIVE": "true"}).default.adaptive == Adaptive()
    assert Limiter.from_settings({}).default.adaptive is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"start_rate": 0}, "start_rate"),
        ({"headroom": 1.0}, "headroom"),
        ({"hold": math.inf}, "hold"),
        ({"hold": 90.0}, "max_hold"),
        ({"overload_share": -0.1}, "overload_share"),
        ({"overload_cut": 1.5}, "overload_cut"),
        ({"max_concurrency": 0}, "max_concurrency"),
    ],
)
def test_invalid_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises((ValueError, TypeError), match=field):
        Adaptive(**options)
    with pytest.raises((ValueError, TypeError), match="THROTTLING_ADAPTIVE"):
        Limiter.from_settings({"THROTTLING_ADAPTIVE": options})


def test_backoff_only_reads_headers_under_adaptive() -> None:
    ledger = ScopeLedger("api.test", CEILING)
    names = [type(c).__name__ for c in ledger.controllers]
    assert names == ["AdaptiveState", "BackoffState"]
    assert ledger.controllers[1].config.headers_only
    info = RateLimitInfo(retry_after=3.0)
    ledger.on_feedback(Feedback(status=429, rate_limit=info, sent_at=0.0), 0.0)
    assert ledger.blocked_until >= 3.0  # Retry-After honoured
    backoff = ledger.controllers[1]
    assert (backoff.level, backoff.step_delay) == (0, 0.0)  # Adaptive does the slowing down


@pytest.mark.parametrize(("tokens_left", "rate_loop"), [(0, False), (400, True)])
def test_a_refusal_only_a_budget_of_another_scope_explains_keeps_the_headers(
    tokens_left: int, rate_loop: bool
) -> None:
    # Requests and tokens routed to their own scopes: the requests scope sees
    # only its budget, with quota left. A 429 that the spent token budget
    # explains leaves it to its headers; with tokens left too, the headers
    # miss a limit and its rate loop takes over.
    headers = {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "50",
        "x-ratelimit-reset-requests": "30s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": str(tokens_left),
        "x-ratelimit-reset-tokens": "20s",
    }
    view = parse(headers, now=1_700_000_000.0).excluding({"tokens"})
    ledger = ScopeLedger("api.test", CEILING)
    adaptive = ledger.controllers[0]
    ok = Feedback(status=200, headers=headers, rate_limit=view, sent_at=0.0)
    ledger.on_feedback(ok, 0.1)
    assert adaptive.rate_loop.phase == "stated"
    refused = Feedback(status=429, headers=headers, rate_limit=view, sent_at=0.2)
    ledger.on_feedback(refused, 0.2)
    assert adaptive.rate_loop.headers_short is rate_loop
    assert (adaptive.rate_loop.phase != "stated") is rate_loop


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_burst_refilled_while_paused_is_spent_at_what_gets_through(backend: str) -> None:
    # nginx's limit_req at 5 r/s with burst=5 nodelay: the burst it refilled
    # during the pause after the first cut read 10/s again and confirmed
    # that edge; held at 9.6/s every other send was refused until a horizon
    # had passed (12 refused in 40 s). Half or more of the sends since the
    # cut refused now hold the scope no faster than those that got through.
    trace = _run(
        NginxLimitReq(rate=5, burst=5, nodelay=True, status=429, latency=0.05), 40.0, backend
    )
    assert _ok_rate(trace, 20, 40) >= 0.95 * 5
    assert _refused(trace) < 0.05


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_look_for_a_rise_that_spends_a_stored_burst_again_costs_one_refusal(
    backend: str,
) -> None:
    # The same bucket: held below its rate it refills its burst, and the
    # look for a rise after the hold spent it, confirmed 10/s again, and at
    # 9.6/s four sends were refused before the scope went back to what got
    # through. A confirmed edge that counted a stored burst is now held as
    # far below it as what got through: the look costs its own refusal.
    trace = _run(
        NginxLimitReq(rate=5, burst=5, nodelay=True, status=429, latency=0.05), 40.0, backend
    )
    late = [r for r in trace.requests if r.sent is not None and r.sent >= 10.0 and r.status]
    assert sum(r.status == 429 for r in late) <= 2
    assert _ok_rate(trace, 10, 40) >= 0.95 * 5
