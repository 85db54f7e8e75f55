"""The real-limiter benchmark: a ``--quick`` smoke run, and its virtual-time twin.

The smoke run (skipped when nginx is not installed: CI does not need it)
asserts no throttling quality -- a quick run's numbers mean nothing; it shows
that the servers start from their generated configurations, that every
client crawls every limiter, and that the servers' own logs are read back.
In virtual time, the oracle that knows each limit gets all of it from every
model, on asyncio and trio.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.real_limiters import LIMITERS, measure
from benchmarks.real_limiters_sweep import CASES, models
from benchmarks.real_limiters_virtual import run_virtual

REPO = Path(__file__).resolve().parent.parent

NGINX = shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_oracle_gets_every_model_limit_in_virtual_time(backend: str) -> None:
    # 10 s runs (the fixed minute: its 150 s, two and a half windows) keep this quick.
    limiters = [lim if lim.reach_window > 10.0 else replace(lim, seconds=10.0) for lim in LIMITERS]
    runs = run_virtual(limiters, backend=backend, clients={"oracle"})
    for limiter in limiters:
        case = measure(runs[limiter.name]["oracle"], limiter, limiter.seconds)
        assert case["share_second_half"] == pytest.approx(1.0, abs=0.01), limiter.name
        assert case["refused"] == 0, limiter.name
        assert case["reach_s"] == limiter.reach_window, limiter.name


def test_the_sweeps_oracle_is_never_refused_by_nginx() -> None:
    # nginx counts whole milliseconds: an oracle paced at 1.001 x 333.3 ms
    # sent 333 ms apart one time in three at rate=3r/s and was refused then,
    # and Adaptive read 140 % of it.
    cases = [
        (replace(limiter, seconds=10.0), model)
        for limiter, model in CASES
        if limiter.kind in ("limit_req", "burst")
    ]
    assert any(limiter.rate == 3.0 for limiter, _ in cases)
    runs = run_virtual([lim for lim, _ in cases], clients={"oracle"}, models=models(cases))
    for limiter, _ in cases:
        assert measure(runs[limiter.name]["oracle"], limiter, 10.0)["refused"] == 0, limiter.name


def test_the_sweeps_jitter_reaches_the_models() -> None:
    # The oracle paced at nginx's 10r/s without burst: every send accepted
    # straight, some refused behind 20 ms of jitter (they arrive closer than
    # the bucket's interval).
    (case,) = [case for case in CASES if case[0].name == "limit_req 10r/s latency 0.001"]
    limiter = replace(case[0], seconds=10.0)
    refused = {}
    for jitter in (0.0, 0.02):
        runs = run_virtual(
            [limiter], clients={"oracle"}, models=models([(limiter, case[1])], jitter=jitter)
        )
        refused[jitter] = measure(runs[limiter.name]["oracle"], limiter, 10.0)["refused"]
    assert refused[0.0] == 0
    assert refused[0.02] > 0


@pytest.mark.slow
@pytest.mark.skipif(not NGINX, reason="nginx is not installed")
def test_quick_run_crawls_every_limiter_and_reads_the_logs(tmp_path: Path) -> None:
    output = tmp_path / "real.json"
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.real_limiters", "--quick", "--output", str(output)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    result = json.loads(output.read_text(encoding="utf-8"))
    cases = result["data"]["cases"]
    skipped = {skip["name"] for skip in result["skipped"]}
    expected = {"nginx limit_req", "nginx burst nodelay", "nginx limit_conn"}
    assert expected <= set(cases)
    for name, per_client in cases.items():
        # The oracle is a plain httpx client: it always reaches every limiter,
        # and the server's own log shows its requests and some 2xx.
        oracle = per_client["oracle"]
        assert oracle["requests"] > 0, name
        assert oracle["ok"] > 0, name
        assert len(oracle["series"]) >= 1
    assert "HAProxy" in cases or "HAProxy" in skipped
    # The shared arm's three processes each report their view of every limiter.
    shared = "Adaptive x3 via Redis"
    if shared not in skipped:
        assert all(
            len(per_client[shared]["client"]["processes"]) == 3 for per_client in cases.values()
        )
    assert result["tables"][0]["rows"]
    figures = result["data"]["figures"]
    assert {figure["image"] for figure in figures} >= {
        "_static/benchmarks/real-nginx-limit-req.png"
    }
    assert "| limiter | client |" in process.stdout
