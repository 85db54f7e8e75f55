"""The throttling-quality benchmark's parts: its metrics, its local sites, its figure.

The metrics are checked on hand-made records; the sites over real HTTP
(httpx against the aiohttp server thread) against what their models
promise; the whole suite end to end with ``--quick`` in a subprocess. No
speed is asserted: the numbers belong to the benchmark run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
# The benchmarks are not an installed package: import them from the checkout.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.figures import draw_figures, figure_rst  # noqa: E402
from benchmarks.quality import (  # noqa: E402
    BUDGET,
    CLIENTS,
    SITES,
    _plan_runs,
    _policy_checks,
    adaptive_available,
    allowed,
    allowed_rate,
    inside_waits,
    measure,
    reach_time,
)
from benchmarks.quality_clients import policy_from_plan, request_list  # noqa: E402
from benchmarks.quality_sites import SiteServer, announced_wait  # noqa: E402
from throttlekit import AutoThrottle, Backoff, ScopePolicy  # noqa: E402
from throttlekit.testing import (  # noqa: E402
    CapacityServer,
    FlakyServer,
    QuotaServer,
)

# -- metrics -----------------------------------------------------------------------------

QUOTA = QuotaServer(limit=10, window=1.0, sliding=True, retry_after=1)


def _steady(rate: float, start: float, end: float) -> list[float]:
    count = round((end - start) * rate)
    return [start + (index + 0.5) / rate for index in range(count)]


def test_allowed_follows_the_quota_changes() -> None:
    changing = QuotaServer(limit=10, window=2.0, changes=((10.0, 4), (20.0, 30)))
    assert allowed_rate(changing, 0.0) == 5.0
    assert allowed_rate(changing, 15.0) == 2.0
    assert allowed(changing, 0.0, 30.0) == pytest.approx(50 + 20 + 150)
    assert allowed(changing, 5.0, 12.0) == pytest.approx(25 + 4)
    assert allowed(CapacityServer(workers=4, service_time=0.05), 0.0, 2.0) == pytest.approx(160)
    flaky = FlakyServer(origin=CapacityServer(workers=5, service_time=0.1))
    assert allowed_rate(flaky, 0.0) == 50.0
    assert allowed(FlakyServer(), 0.0, 1.0) is None


def test_inside_waits_counts_sends_after_the_answer_within_its_wait() -> None:
    records = [
        (0.0, 0.05, 200, 0.0),
        (0.10, 0.101, 429, 1.0),  # Retry-After: 1 from 0.101 to 1.101
        (0.102, 0.103, 429, 1.0),  # in flight already (within the grace): not counted
        (0.5, 0.501, 429, 1.0),  # sent inside the wait: counted, and extends it to 1.501
        (1.2, 1.25, 200, 0.0),  # inside the extended wait
        (1.6, 1.65, 200, 0.0),  # after it
    ]
    assert inside_waits(records, start=0.0, end=10.0) == 2
    assert inside_waits(records, start=1.0, end=10.0) == 1
    # A longer grace: the send at 0.5 could not have known; the one at 1.2 could.
    assert inside_waits(records, start=0.0, end=10.0, grace=0.45) == 1
    assert inside_waits([(0.0, 0.1, 200, 0.0)] * 3, start=0.0, end=1.0) == 0


def test_reach_time_is_the_end_of_the_first_good_window() -> None:
    # 2/s for 10 s, then the full 10/s: the trailing 5 s reaches 9/s at 14.5 s.
    served = _steady(2.0, 0.0, 10.0) + _steady(10.0, 10.0, 30.0)
    assert reach_time(served, QUOTA, budget=30.0) == pytest.approx(14.5)
    assert reach_time(_steady(10.0, 0.0, 30.0), QUOTA, budget=30.0) == 5.0
    assert reach_time(_steady(5.0, 0.0, 30.0), QUOTA, budget=30.0) is None


def test_measure_counts_over_the_budget_from_the_first_arrival() -> None:
    t0 = 1000.0
    records = [(t0 + i * 0.1, t0 + i * 0.1 + 0.05, 200, 0.0) for i in range(100)]  # 10/s, 10 s
    records += [(t0 + i * 0.4 + 0.01, t0 + i * 0.4 + 0.012, 429, 1.0) for i in range(25)]
    records += [(t0 + 11.0, t0 + 11.1, 200, 0.0)]  # after the budget: not counted
    case = measure(records, model=QUOTA, budget=10.0, baseline_p95=0.025)
    assert case["ok"] == 100
    assert case["refused"] == 25
    assert case["requests"] == 125
    assert case["throughput"] == pytest.approx(10.0)
    assert case["share"] == pytest.approx(1.0)
    assert case["share_second_half"] == pytest.approx(1.0)
    assert (case["judged_over"], case["judged_share"]) == ("the second half", pytest.approx(1.0))
    assert case["refused_share"] == pytest.approx(25 / 125)
    # Every 429 announced 1 s: the later sends all land inside one.
    assert case["inside_waits"] > 90
    assert case["p95_ms"] == pytest.approx(50.0)
    assert case["p95_ratio"] == pytest.approx(2.0)
    assert case["reach_s"] == 5.0
    assert case["series"] == [10.0] * 10
    assert case["allowed_series"] == [10.0] * 10
    assert case["follow_s"] == []


def test_measure_follows_a_changing_quota() -> None:
    model = QuotaServer(limit=10, window=1.0, sliding=True, changes=((10.0, 5), (20.0, 15)))
    # Follows the drop at once, the rise 3 s late; a few 429s right after the drop.
    served = _steady(10.0, 0.0, 10.0) + _steady(5.0, 10.0, 20.0)
    served += _steady(5.0, 20.0, 23.0) + _steady(15.0, 23.0, 30.0)
    records = [(t, t + 0.05, 200, 0.0) for t in served]
    records += [(10.0 + i * 0.1, 10.0 + i * 0.1 + 0.001, 429, 1.0) for i in range(3)]
    case = measure(records, model=model, budget=30.0, start=0.0)
    # [22.75, 24.75) holds 1.25 + 26.25 = 27.5 >= 90 % of 30.
    assert case["follow_s"] == [pytest.approx(2.25), pytest.approx(4.75)]
    assert case["allowed_series"][:2] == [10.0, 10.0]
    assert case["allowed_series"][10] == 5.0
    assert case["allowed_series"][-1] == 15.0
    assert case["share"] == pytest.approx(len(served) / (100 + 50 + 150))


def test_measure_judges_a_long_window_over_the_whole_run() -> None:
    model = QuotaServer(limit=60, window=60.0, sliding=True, retry_after=None)
    records = [(i * 0.01, i * 0.01 + 0.05, 200, 0.0) for i in range(60)]  # a burst, then quiet
    case = measure(records, model=model, budget=60.0)
    assert case["share"] == pytest.approx(1.0)
    assert case["share_second_half"] == 0.0
    assert (case["judged_over"], case["judged_share"]) == ("the run", pytest.approx(1.0))


def test_measure_without_records_or_limit() -> None:
    empty = measure([], model=QUOTA, budget=5.0)
    assert (empty["throughput"], empty["share"], empty["refused_share"]) == (0.0, 0.0, None)
    assert empty["reach_s"] is None
    unlimited = measure([(0.0, 0.005, 200, 0.0)], model=FlakyServer(), budget=1.0)
    assert unlimited["share"] is None
    assert unlimited["reach_s"] is None
    assert unlimited["p95_ratio"] is None


def test_announced_wait_reads_the_forms_the_sites_send() -> None:
    assert announced_wait({"Retry-After": "1"}, now=0.0) == 1.0
    assert announced_wait({"RateLimit": '"default";r=0;t=1'}, now=0.0) == 1.0
    assert announced_wait({"RateLimit": '"default";r=3;t=1'}, now=0.0) == 0.0
    x = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000004.500"}
    assert announced_wait(x, now=1_700_000_000.0) == pytest.approx(4.5)
    assert announced_wait({**x, "X-RateLimit-Remaining": "1"}, now=1_700_000_000.0) == 0.0
    assert announced_wait({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "7"}, now=0) == 7
    assert announced_wait({"Retry-After": "2", **x}, now=1_700_000_000.0) == 2.0
    assert announced_wait({}, now=0.0) == 0.0


def test_request_list_interleaves_the_sites() -> None:
    sites = [{"url": "http://a", "count": 3}, {"url": "http://b", "count": 1}]
    assert list(request_list(sites)) == [
        "http://a/page/0",
        "http://b/page/0",
        "http://a/page/1",
        "http://a/page/2",
    ]


def test_every_site_kind_of_the_issue_is_there() -> None:
    assert [site.name for site in SITES] == [
        "quota",
        "fast-429",
        "header-quota",
        "x-ratelimit",
        "long-window",
        "changing",
        "503-limit",
        "capacity",
        "errors",
        "cdn",
    ]
    models = {site.name: site.model(60.0) for site in SITES}
    assert models["quota"].rate == 10.0  # type: ignore[attr-defined]
    assert models["fast-429"].retry_after is None  # type: ignore[attr-defined]
    assert models["503-limit"].status == 503  # type: ignore[attr-defined]
    assert models["changing"].changes == ((20.0, 5), (40.0, 15))  # type: ignore[attr-defined]
    assert allowed_rate(models["capacity"], 0.0) == 80.0
    assert allowed_rate(models["errors"], 0.0) == 50.0
    assert allowed_rate(models["cdn"], 0.0) is None
    assert {site.kind for site in SITES} == {"policy", "load", "errors", "unlimited"}


def test_the_long_window_runs_ten_windows_with_every_client_at_once(tmp_path: Path) -> None:
    budgets = {site.name: site.seconds or BUDGET for site in SITES}
    assert budgets["long-window"] == 10 * 60.0
    groups = _plan_runs(SITES, list(CLIENTS), budgets, False, tmp_path)
    long = [group for group in groups if any(run.budget != BUDGET for run in group)]
    assert len(long) == 1
    assert [run.client for run in long[0]] == list(CLIENTS)
    assert {(site.name, run.budget) for run in long[0] for site in run.sites} == {
        ("long-window", 600.0)
    }
    # Each client's group of policy sites leaves it out.
    assert all(
        "long-window" not in {site.name for site in run.sites}
        for group in groups
        if group is not long[0]
        for run in group
        if run.client.kind != "baseline"
    )


def test_clients_share_one_ceiling() -> None:
    """The httpx and Scrapy clients of a configuration build the same ScopePolicy.

    But for Scrapy's default jitter (``RANDOMIZE_DOWNLOAD_DELAY``), which the
    Scrapy clients keep, as Scrapy's own AutoThrottle client does.
    """
    scrapy_settings = pytest.importorskip("scrapy.settings")
    from throttlekit.adapters.scrapy import limiter_from_settings

    ceiling = {"concurrency": 16, "delay": 0.0, "slot_delay": 0.0}
    backoff = policy_from_plan({**ceiling, "autothrottle": {}})
    assert backoff == ScopePolicy(**ceiling, autothrottle=AutoThrottle(), backoff=Backoff())
    for family in ("backoff", "adaptive"):
        if family == "adaptive" and not adaptive_available():
            continue
        httpx_client, scrapy_client = (client for client in CLIENTS if client.family == family)
        expected = attrs.evolve(policy_from_plan(httpx_client.policy), jitter=0.5)
        settings = scrapy_settings.Settings(scrapy_client.settings)
        limiter = limiter_from_settings(settings)
        assert limiter.policy("127.0.0.1:8000") == expected, family


# -- the sites, over real HTTP ------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[SiteServer]:
    with SiteServer() as running:
        yield running


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_capacity_site_latency_grows_with_load(server: SiteServer) -> None:
    model = CapacityServer(workers=2, service_time=0.05)
    with server.serve(model, seed=7) as site:
        async with httpx.AsyncClient() as client, anyio.create_task_group() as group:
            for index in range(6):
                group.start_soon(client.get, f"{site.url}/page/{index}")
        records = sorted(site.records)
    assert [status for _, _, status, _ in records] == [200] * 6
    # Two workers, 50 ms each: the six answers come in three pairs.
    latencies = sorted(finished - arrived for arrived, finished, _, _ in records)
    for index, expected in enumerate([0.05, 0.05, 0.1, 0.1, 0.15, 0.15]):
        assert latencies[index] == pytest.approx(expected, abs=0.03)
    assert site.origin == records[0][0]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_quota_site_records_what_it_announced(server: SiteServer) -> None:
    model = QuotaServer(limit=3, window=5.0, latency=0.0, retry_after=1)
    with server.serve(model) as site:
        async with httpx.AsyncClient() as client:
            responses = [await client.get(f"{site.url}/page/{i}") for i in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    assert responses[3].headers["Retry-After"] == "1"
    assert [wait for *_, wait in site.records] == [0.0, 0.0, 0.0, 1.0, 1.0]
    epoch = QuotaServer(
        limit=1,
        window=10.0,
        retry_after=None,
        rate_limit_headers="x-ratelimit",
        reset_format="epoch",
        latency=0.0,
    )
    with server.serve(epoch) as site:
        async with httpx.AsyncClient() as client:
            first, second = [await client.get(f"{site.url}/") for _ in range(2)]
    assert (first.status_code, second.status_code) == (200, 429)
    assert "Retry-After" not in second.headers
    waits = [wait for *_, wait in site.records]
    assert waits[0] == pytest.approx(10.0, abs=0.1)  # remaining 0 after the first
    assert waits[1] == pytest.approx(10.0, abs=0.1)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_errors_site_answers_its_errors_at_once(server: SiteServer) -> None:
    model = FlakyServer(
        error_rate=0.5,
        error_statuses=(503,),
        error_latency=0.0,
        timeout_rate=0.0,
        origin=CapacityServer(workers=8, service_time=0.05),
    )
    with server.serve(model, seed=3) as site:
        async with httpx.AsyncClient() as client, anyio.create_task_group() as group:
            for index in range(16):
                group.start_soon(client.get, f"{site.url}/page/{index}")
        records = site.records
    statuses = [status for _, _, status, _ in records]
    assert 2 <= statuses.count(503) <= 14
    assert set(statuses) == {200, 503}
    for arrived, finished, status, _ in records:
        assert (finished - arrived < 0.03) if status == 503 else (finished - arrived >= 0.045)
    assert server.cpu_time() > 0


# -- the figure ---------------------------------------------------------------------------


def test_figure_is_drawn_and_referenced(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    figure = {
        "image": "_static/benchmarks/test.png",
        "alt": "a line",
        "caption": "Pages per second (the *dashed* line is the capacity).",
        "panels": [
            {
                "title": "one",
                "xlabel": "s",
                "ylabel": "pages/s",
                "lines": [{"label": "client", "x": [0, 1, 2], "y": [1, 3, 2]}],
                "hlines": [{"y": 2.5, "label": "capacity"}],
            }
        ],
    }
    document = {"suites": {"quality": {"data": {"figures": [figure]}}}}
    written = draw_figures(document, tmp_path)
    assert written == [tmp_path / "_static" / "benchmarks" / "test.png"]
    assert written[0].read_bytes().startswith(b"\x89PNG")
    assert draw_figures(document, tmp_path) == written  # redrawn in place
    lines = figure_rst(figure)
    assert lines[0] == ".. figure:: _static/benchmarks/test.png"
    assert "   :alt: a line" in lines
    assert "\\*dashed\\*" in "\n".join(lines)


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_measures_every_site_and_client(tmp_path: Path) -> None:
    output = tmp_path / "quick.json"
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            "quality",
            "--output",
            str(output),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    suite = json.loads(output.read_text(encoding="utf-8"))["suites"]["quality"]
    cases = suite["data"]["cases"]
    adaptive = adaptive_available()
    clients = {c.name for c in CLIENTS if adaptive or c.family != "adaptive"}
    assert set(cases) == {site.name for site in SITES}
    for site, per_client in cases.items():
        assert set(per_client) == clients, site
        for case in per_client.values():
            assert case["requests"] == case["ok"] + case["refused"]
            assert len(case["series"]) == 3
    baselines = suite["data"]["sites"]
    assert all(baselines[site.name]["baseline_p95_ms"] > 0 for site in SITES)
    skipped = {skip["name"]: skip["reason"] for skip in suite["skipped"]}
    if not adaptive:
        assert set(skipped) == {"Adaptive / httpx", "Adaptive / Scrapy"}
        assert all("not available" in reason for reason in skipped.values())
    # One PASS/MISS line per judged client and site with a target (not the CDN).
    assert len(suite["targets"]) == 2 * 9
    assert all(target["passed"] in (True, False) for target in suite["targets"])
    figures = suite["data"]["figures"]
    assert [figure["image"] for figure in figures] == [
        f"_static/benchmarks/quality-{site.name}.png" for site in SITES
    ]
    assert [len(figure["panels"][0]["lines"]) for figure in figures] == [len(clients) + 1] * 9 + [
        len(clients)
    ]
    page = tmp_path / "benchmarks.rst"
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.report", "--input", str(output), "--output", str(page)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    text = page.read_text(encoding="utf-8")
    assert ".. figure:: _static/benchmarks/quality-quota.png" in text
    assert "Scrapy AutoThrottle" in text
    if find_spec("matplotlib") is not None:
        assert (tmp_path / "_static" / "benchmarks" / "quality-changing.png").exists()


def test_tuning_entry_point_refuses_unknown_names() -> None:
    from benchmarks.quality import main

    with pytest.raises(SystemExit) as exited:
        main(["--sites", "quota,nope"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit):
        main(["--clients", "fast"])


@pytest.mark.slow
def test_tuning_entry_point_runs_part_of_the_suite(tmp_path: Path) -> None:
    output = tmp_path / "part.json"
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.quality",
            "--quick",
            "--sites",
            "quota,capacity",
            "--clients",
            "backoff",
            "--run-seconds",
            "2",
            "--output",
            str(output),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    suite = json.loads(output.read_text(encoding="utf-8"))
    assert set(suite["data"]["cases"]) == {"quota", "capacity"}
    assert {client for per in suite["data"]["cases"].values() for client in per} == {
        "Backoff+AutoThrottle / httpx",
        "Backoff+AutoThrottle / Scrapy",
    }
    assert set(suite["data"]["sites"]) == {"quota", "capacity"}
    assert all(len(case["series"]) == 2 for case in suite["data"]["cases"]["quota"].values())
    assert "PASS" in process.stdout or "MISS" in process.stdout


def _case(**fields: Any) -> dict[str, Any]:
    case = {
        "reach_s": 5.0,
        "judged_share": 0.93,
        "judged_over": "the second half",
        "share": 0.9,
        "share_second_half": 0.93,
        "refused_share": 0.01,
        "inside_waits": 0,
        "follow_s": [],
        "p95_ms": 50.0,
    }
    return {**case, **fields}


def test_a_whole_second_fixed_window_is_judged_against_the_burst_and_wait_ceiling() -> None:
    site = next(site for site in SITES if site.name == "header-quota")
    checks, target = _policy_checks(site, _case(judged_share=0.91))
    assert "90.5% of the allowed rate" in target  # 0.95 * 1 / (1 + 0.05)
    assert all(passed for _, passed in checks)
    checks, _ = _policy_checks(site, _case(judged_share=0.90))
    assert not checks[0][1]


def test_the_long_window_is_judged_by_its_refusals_and_the_changing_quota_by_its_follow_times() -> (
    None
):
    long = next(site for site in SITES if site.name == "long-window")
    checks, target = _policy_checks(long, _case(judged_share=0.5, refused_share=0.019))
    assert target.startswith("< 2% refused")
    assert all(passed for _, passed in checks)
    changing = next(site for site in SITES if site.name == "changing")
    checks, _ = _policy_checks(changing, _case(follow_s=[2.5, 14.0]))
    assert all(passed for _, passed in checks)
    checks, _ = _policy_checks(changing, _case(follow_s=[4.5, 14.0]))
    assert [passed for _, passed in checks] == [True, False, True, True]
    checks, _ = _policy_checks(changing, _case(follow_s=[2.0, None]))
    assert not checks[1][1]
