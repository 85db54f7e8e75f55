"""The throttling-quality benchmark's parts: its metrics, its local sites, its figure.

The metrics are checked on hand-made records; the sites over real HTTP
(httpx against the aiohttp server thread) against what their models
promise; the whole suite end to end with ``--quick`` in a subprocess. No
speed is asserted: the numbers belong to the benchmark run.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import anyio
import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
# The benchmarks are not an installed package: import them from the checkout.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.figures import draw_figures, figure_rst  # noqa: E402
from benchmarks.quality import (  # noqa: E402
    SITES,
    measure,
    moving_throughput,
    settle_time,
)
from benchmarks.quality_clients import request_list  # noqa: E402
from benchmarks.quality_sites import (  # noqa: E402
    CapacitySite,
    FixedSite,
    QuotaSite,
    SiteServer,
)

# -- metrics -----------------------------------------------------------------------------


def _steady(rate: float, start: float, end: float) -> list[float]:
    count = round((end - start) * rate)
    return [start + (index + 0.5) / rate for index in range(count)]


def test_moving_throughput_is_trailing_and_starts_from_zero() -> None:
    done = _steady(10.0, 0.0, 20.0)
    points = moving_throughput(done, duration=20.0, window=10.0, step=0.5)
    assert points[0] == (0.5, pytest.approx(10.0))
    assert points[-1] == (20.0, pytest.approx(10.0))
    assert len(points) == 40
    # A jump from 2/s to 10/s at t=5 s: the trailing window lags behind it.
    done = _steady(2.0, 0.0, 5.0) + _steady(10.0, 5.0, 25.0)
    points = dict(moving_throughput(done, duration=25.0, window=10.0, step=0.5))
    assert points[10.0] == pytest.approx((10 + 50) / 10.0)
    assert points[15.0] == pytest.approx(10.0)


def test_settle_time() -> None:
    steady = moving_throughput(_steady(10.0, 0.0, 25.0), duration=25.0)
    assert settle_time(steady) == 1.0
    stepped = moving_throughput(_steady(2.0, 0.0, 5.0) + _steady(10.0, 5.0, 25.0), duration=25.0)
    # Within 10 % of 10/s once 9 of the last 10 s ran at 10/s.
    assert settle_time(stepped) == pytest.approx(14.0, abs=0.5)
    # Still climbing at the end: never held the band for 5 s.
    climbing = [(t / 2, t / 2) for t in range(1, 51)]
    assert settle_time(climbing) is None
    assert settle_time([]) is None


def test_measure_counts_over_the_budget_from_the_first_arrival() -> None:
    t0 = 1000.0
    records = [(t0 + i * 0.1, t0 + i * 0.1 + 0.05, 200) for i in range(100)]  # 10 s of 10/s
    records += [(t0 + i * 0.1 + 0.01, t0 + i * 0.1 + 0.012, 429) for i in range(25)]
    records += [(t0 + 11.0, t0 + 11.1, 200)]  # after the budget: not counted
    records += [(t0 + 5.0, t0 + 5.5, 503)]
    case = measure(records, budget=10.0, capacity=20.0)
    assert case["ok"] == 100
    assert case["status_429"] == 25
    assert case["other"] == 1
    assert case["responses"] == 126
    assert case["throughput"] == pytest.approx(10.0)
    assert case["share"] == pytest.approx(0.5)
    assert case["share_429"] == pytest.approx(25 / 126)
    assert case["p95_ms"] == pytest.approx(50.0)
    assert case["series"] == [10.0] * 10
    assert case["final_throughput"] == pytest.approx(10.0)
    assert case["final_share"] == pytest.approx(0.5)


def test_measure_without_capacity_or_records() -> None:
    case = measure([(0.0, 0.005, 200)], budget=1.0, capacity=None)
    assert case["share"] is None
    assert case["throughput"] == 1.0
    empty = measure([], budget=5.0, capacity=10.0)
    assert (empty["throughput"], empty["share"], empty["share_429"]) == (0.0, 0.0, None)


def test_request_list_interleaves_the_sites() -> None:
    sites = [{"url": "http://a", "count": 3}, {"url": "http://b", "count": 1}]
    assert list(request_list(sites)) == [
        "http://a/page/0",
        "http://b/page/0",
        "http://a/page/1",
        "http://a/page/2",
    ]


def test_every_limited_site_states_its_capacity() -> None:
    for site in SITES:
        model = site.model
        if isinstance(model, (CapacitySite, QuotaSite)):
            assert site.capacity == pytest.approx(model.capacity)
        else:
            assert site.capacity is None


# -- the sites, over real HTTP ------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[SiteServer]:
    with SiteServer() as running:
        yield running


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_capacity_site_is_a_fifo_queue_of_workers(server: SiteServer) -> None:
    model = CapacitySite(workers=2, service_time=0.05)
    with server.serve(model, seed=7) as site:
        async with httpx.AsyncClient() as client, anyio.create_task_group() as group:
            for index in range(10):
                group.start_soon(client.get, f"{site.url}/page/{index}")
        records = sorted(site.records)
    assert [status for *_, status in records] == [200] * 10
    # Replay the M/M/2 schedule with the site's own random service times:
    # first come first served, each request starts when a worker frees up.
    rng = random.Random(7)
    free = [records[0][0]] * 2
    for arrived, finished, _ in records:
        start = max(arrived, min(free))
        done = start + rng.expovariate(1 / 0.05)
        free[free.index(min(free))] = done
        assert finished == pytest.approx(done, abs=0.04)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_quota_site_refuses_beyond_its_limit(server: SiteServer) -> None:
    with server.serve(QuotaSite(limit=3, window=5.0, latency=0.0, retry_after=1)) as site:
        async with httpx.AsyncClient() as client:
            responses = [await client.get(f"{site.url}/page/{i}") for i in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    assert responses[3].headers["Retry-After"] == "1"
    assert "Retry-After" not in responses[0].headers
    with server.serve(QuotaSite(limit=1, latency=0.0, retry_after=None)) as site:
        async with httpx.AsyncClient() as client:
            first, second = [await client.get(f"{site.url}/") for _ in range(2)]
    assert (first.status_code, second.status_code) == (200, 429)
    assert "Retry-After" not in second.headers


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_fixed_site_answers_everyone_after_its_latency(server: SiteServer) -> None:
    with server.serve(FixedSite(latency=0.05)) as site:
        async with httpx.AsyncClient() as client, anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon(client.get, f"{site.url}/page/{index}")
        records = site.records
    assert len(records) == 20
    assert all(0.045 <= finished - arrived < 0.5 for arrived, finished, _ in records)
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
        timeout=60,
        check=False,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    suite = json.loads(output.read_text(encoding="utf-8"))["suites"]["quality"]
    cases = suite["data"]["cases"]
    clients = {"Scrapy + AutoThrottle", "Scrapy + throttlekit", "httpx + throttlekit"}
    assert set(cases) == {site.name for site in SITES}
    for site, per_client in cases.items():
        assert set(per_client) == clients, site
        for case in per_client.values():
            assert case["responses"] >= case["ok"] + case["status_429"]
            assert len(case["series"]) == 2
    # One target per throttlekit client and limited site, AutoThrottle alongside.
    assert len(suite["targets"]) == 2 * 3
    assert all("Scrapy AutoThrottle" in target["measured"] for target in suite["targets"])
    (figure,) = suite["data"]["figures"]
    assert [len(panel["lines"]) for panel in figure["panels"]] == [3, 3, 3, 3]
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
    assert ".. figure:: _static/benchmarks/quality-throughput.png" in text
    assert "Scrapy + AutoThrottle" in text
    if find_spec("matplotlib") is not None:
        assert (tmp_path / "_static" / "benchmarks" / "quality-throughput.png").exists()
