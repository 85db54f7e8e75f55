"""Models of deployed rate limiters in throttlekit.testing, against their own source's arithmetic.

Every expected sequence below is worked out by hand from the server's source:
``ngx_http_limit_req_module.c`` (excess in milli-requests on a millisecond
clock), ``ngx_http_limit_conn_module.c``, HAProxy's ``freq_ctr.c``
(``update_freq_ctr_period`` and ``read_freq_ctr_period``) and the ``limits``
library's strategies as Flask-Limiter and slowapi state them in headers.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throttlekit import ScopePolicy
from throttlekit.testing import (
    FixedServer,
    FrameworkLimiter,
    HAProxyRate,
    NginxLimitConn,
    NginxLimitReq,
    SimRequest,
    simulate,
    steady,
)

WALL = 1_700_000_000.0


#: The virtual time of the request being answered (the wall clock runs with it).
_NOW = [0.0]


def wall() -> float:
    return WALL + _NOW[0]


def respond(model: Any, *times: float) -> list[Any]:
    responder = model.start(random.Random(1))
    answers = []
    for now in times:
        _NOW[0] = now
        answers.append(responder(SimRequest(url="https://a.test/"), now))
    return answers


def statuses(model: Any, *times: float) -> list[int | None]:
    return [response.status for response in respond(model, *times)]


def test_limit_req_without_burst_spaces_accepted_requests_by_one_over_rate() -> None:
    # rate=10r/s is 10000 milli: excess = excess - 10000 * ms / 1000 + 1000.
    # At 199 ms after the last accepted one, 10000 * 99 / 1000 = 990 < 1000: refused.
    model = NginxLimitReq(rate=10, status=429)
    answers = respond(model, 0.0, 0.05, 0.1, 0.15, 0.199, 0.2)
    assert [r.status for r in answers] == [200, 429, 200, 429, 429, 200]
    # A refusal leaves the state alone: 0.2 counts from 0.1, not from 0.199.
    assert answers[1].headers == {}
    assert answers[1].latency == 0.001
    assert answers[0].latency == 0.05


def test_limit_req_rounds_as_nginx_integer_arithmetic() -> None:
    # 3r/s: 3000 * 333 / 1000 = 999, one milli-request short; 3000 * 334 / 1000 = 1002.
    assert statuses(NginxLimitReq(rate=3), 0.0, 0.333, 0.334) == [200, 503, 200]
    # 30r/m is 500 milli per second: 1999 ms drains 999.
    assert NginxLimitReq(rate=0.5).milli_rate == 500
    assert statuses(NginxLimitReq(rate=0.5), 0.0, 1.999, 2.0) == [200, 503, 200]


def test_limit_req_burst_nodelay_passes_burst_plus_one_then_one_per_interval() -> None:
    model = NginxLimitReq(rate=20, burst=10, nodelay=True)
    opening = respond(model, *[0.0] * 12, 0.05, 0.05, 0.1)
    # Excess 0, 1000, ... 10000 pass (11 requests); 11000 > 10000 is refused.
    assert [r.status for r in opening] == [200] * 11 + [503, 200, 503, 200]
    assert {r.latency for r in opening if r.status == 200} == {0.05}


def test_limit_req_burst_without_nodelay_delays_the_excess() -> None:
    # Excess 0, 1000, 2000 at 10r/s: delayed 0, 100 and 200 ms; 3000 > burst 2000.
    model = NginxLimitReq(rate=10, burst=2, latency=0.0)
    answers = respond(model, 0.0, 0.0, 0.0, 0.0)
    assert [r.status for r in answers] == [200, 200, 200, 503]
    assert [r.latency for r in answers[:3]] == [0.0, 0.1, 0.2]
    # 150 ms later: 2000 - 1500 + 1000 = 1500 milli, delayed 150 ms.
    later = respond(model, 0.0, 0.0, 0.0, 0.15)
    assert later[3].latency == pytest.approx(0.15)


@settings(max_examples=60, deadline=None)
@given(
    rate=st.integers(min_value=1, max_value=50),
    gaps=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=60),
)
def test_limit_req_without_burst_accepts_exactly_the_spaced_requests(
    rate: int, gaps: list[int]
) -> None:
    # Whole milliseconds: accepted iff at least ceil(1000 / rate) ms after the last accepted.
    spacing = -(-1000 // rate)
    times, now = [], 0
    for gap in gaps:
        now += gap
        times.append(now)
    answers = statuses(NginxLimitReq(rate=rate), *[t / 1000 for t in times])
    last: int | None = None
    for at, status in zip(times, answers, strict=True):
        expected = last is None or at - last >= spacing
        assert (status == 200) == expected
        if expected:
            last = at


def test_limit_conn_counts_requests_in_process() -> None:
    model = NginxLimitConn(limit=2, latency=0.1)
    answers = respond(model, 0.0, 0.0, 0.0, 0.1, 0.15, 0.15, 0.2)
    # Two in process until 0.1 (finished at 0.1), then one from 0.1 to 0.2.
    assert [r.status for r in answers] == [200, 200, 503, 200, 200, 503, 200]
    assert answers[2].latency == 0.001
    behind = NginxLimitConn(limit=1, origin=FixedServer(latency=0.3), status=429)
    assert statuses(behind, 0.0, 0.29, 0.3) == [200, 429, 200]


def test_haproxy_counts_refused_requests_and_weights_the_previous_period() -> None:
    model = HAProxyRate(limit=3)
    answers = respond(model, 0.0, 0.1, 0.2, 0.3, 0.9, 1.0, 1.5, 1.7, 2.999, 10.0)
    # 0-0.9: curr 1..5, rates 1, 2, 3, 4 (> 3), 5. At 1.0 the period rotates:
    # prev 5, curr 1, remain 1000: rate 6. At 1.5: (5 * 500 + 2 * 1000) / 1000 = 4.
    # At 1.7: (5 * 300 + 3000) / 1000 = 4. At 2.999 it rotates again (prev 3,
    # remain 1 ms): rate 1. At 10.0, two periods were missed: it starts afresh.
    assert [r.status for r in answers] == [200, 200, 200, 429, 429, 429, 429, 429, 200, 200]
    assert answers[3].headers == {"Retry-After": "1"}
    assert answers[0].headers == {}
    bare = HAProxyRate(limit=1, retry_after=None, status=403)
    assert [r.headers for r in respond(bare, 0.0, 0.1)] == [{}, {}]
    assert statuses(bare, 0.0, 0.1) == [200, 403]


def test_haproxy_keeps_refusing_a_client_that_keeps_sending() -> None:
    # 20/s against 10 per second: every refused request still counts, so the
    # rate read stays near 20 and nearly everything after the first second is refused.
    times = [i / 20 for i in range(200)]
    answers = statuses(HAProxyRate(limit=10), *times)
    assert answers[:10] == [200] * 10
    assert answers[40:].count(200) == 0


def test_framework_moving_window_headers_on_every_response() -> None:
    model = FrameworkLimiter(limit=2, window=1.0, latency=0.0, reject_latency=0.0, clock=wall)
    answers = respond(model, 0.0, 0.25, 0.5, 1.0, 1.125, 1.25)
    # acquire_entry refuses when the limit-th newest is not older than the
    # window (0.0 >= 1.0 - 1.0 at 1.0); the stats count strictly inside it.
    assert [r.status for r in answers] == [200, 200, 429, 429, 200, 429]
    first = answers[0].headers
    assert first == {
        "X-RateLimit-Limit": "2",
        "X-RateLimit-Remaining": "1",
        "X-RateLimit-Reset": str(int(WALL) + 2),  # int(reset + 1): reset at 1.0
        "Retry-After": "2",
    }
    assert answers[1].headers["Retry-After"] == "1"  # int(WALL + 2 - (WALL + 0.25))
    assert answers[3].headers["X-RateLimit-Remaining"] == "1"  # refused all the same
    # The oldest inside is 0.25: the reset at 1.25, stated at 2.25, rounded down.
    assert answers[3].headers["X-RateLimit-Reset"] == str(int(WALL) + 2)


def test_framework_reset_formats_and_answer_time() -> None:
    slowapi = FrameworkLimiter(limit=1, latency=0.25, reset_format="float", clock=wall)
    answer = respond(slowapi, 0.0)[0]
    # Reset at 1.0 (the clock shows WALL when the request arrives): stated
    # a second late; Retry-After counts from the answer, 0.25 s later.
    assert answer.headers["X-RateLimit-Reset"] == str(WALL + 2.0)
    assert answer.headers["Retry-After"] == "1"
    exact = FrameworkLimiter(limit=1, latency=0.25, reset_late=0.0, clock=wall)
    assert respond(exact, 0.0)[0].headers["X-RateLimit-Reset"] == str(int(WALL) + 1)
    rfc = FrameworkLimiter(limit=1, retry_after_on_every_response=False, clock=wall)
    ok, refused = respond(rfc, 0.0, 0.5)
    assert "Retry-After" not in ok.headers
    assert refused.headers["Retry-After"] == "1"
    assert respond(FrameworkLimiter(limit=1, headers=False), 0.0, 0.5)[1].headers == {}


def test_framework_fixed_window_opens_at_the_first_request() -> None:
    model = FrameworkLimiter(
        limit=2, window=60.0, strategy="fixed", latency=0.0, reject_latency=0.0, clock=wall
    )
    answers = respond(model, 5.0, 10.0, 20.0, 64.5, 65.0, 70.0)
    assert [r.status for r in answers] == [200, 200, 429, 429, 200, 200]
    assert [r.headers["Retry-After"] for r in answers] == ["61", "56", "46", "1", "61", "56"]
    assert [r.headers["X-RateLimit-Remaining"] for r in answers] == ["1", "0", "0", "0", "1", "0"]
    assert answers[4].headers["X-RateLimit-Reset"] == str(int(WALL) + 126)  # opened at 65 s


def test_framework_sliding_window_counter_weights_the_previous_window() -> None:
    model = FrameworkLimiter(limit=4, window=1.0, strategy="sliding", clock=wall)
    times = (0.0, 0.25, 0.5, 0.75, 0.875, 1.25, 1.5, 1.5, 1.75)
    # At 1.25: 4 * 0.75 + 0 = 3 -> one more fits; 1.5: 4 * 0.5 + 1 = 3; then
    # 4 * 0.5 + 2 = 4 is full; 1.75: 4 * 0.25 + 2 = 3.
    assert statuses(model, *times) == [200, 200, 200, 200, 429, 200, 200, 429, 200]
    assert respond(model, *times)[5].headers["X-RateLimit-Remaining"] == "0"


def test_a_client_paced_at_the_limit_is_never_refused() -> None:
    policy = ScopePolicy(concurrency=4, delay=0.1, slot_delay=0)
    for model in (NginxLimitReq(rate=10), FrameworkLimiter(limit=10, window=1.0)):
        trace = simulate(policy, model, steady("https://a.test/{i}", rate=20, count=60))
        assert trace.count(status=200) == 60, model


def test_haproxy_refuses_a_client_paced_exactly_at_the_limit() -> None:
    # Every 100 ms against "gt 10": once the previous period holds 10, the rate
    # read at k * 100 ms into a period is 10 * (1000 - 100 k) / 1000 + (k + 1) = 11.
    exact = statuses(HAProxyRate(limit=10), *[i / 10 for i in range(100)])
    assert exact == [200] * 10 + [429] * 90
    # A hair slower, the weighted count stays at 10 and nothing is refused.
    slower = statuses(HAProxyRate(limit=10), *[i / 9.99 for i in range(100)])
    assert slower == [200] * 100


def test_limiter_models_check_their_fields() -> None:
    with pytest.raises(ValueError, match="status"):
        NginxLimitReq(status=302)
    with pytest.raises(ValueError, match="rate"):
        NginxLimitReq(rate=0.0001)
    with pytest.raises(ValueError, match="burst"):
        NginxLimitReq(burst=-1)
    with pytest.raises(ValueError, match="limit"):
        NginxLimitConn(limit=0)
    with pytest.raises(TypeError, match="origin"):
        NginxLimitConn(origin=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="period"):
        HAProxyRate(period=0.0001)
    with pytest.raises(ValueError, match="retry_after"):
        HAProxyRate(retry_after=-1)
    with pytest.raises(ValueError, match="strategy"):
        FrameworkLimiter(strategy="token")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reset_format"):
        FrameworkLimiter(reset_format="epoch")  # type: ignore[arg-type]
    assert FrameworkLimiter(limit=60, window=60.0).rate == 1.0
