"""Smoke test of the real-limiter benchmark: ``--quick`` against real nginx, HAProxy and limits.

Skipped when nginx is not installed (CI does not need it). No throttling
quality is asserted here: a quick run's numbers mean nothing; it shows that
the servers start from their generated configurations, that every client
crawls every limiter, and that the servers' own logs are read back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
        reason="nginx is not installed",
    ),
]


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
    assert result["tables"][0]["rows"]
    figures = result["data"]["figures"]
    assert {figure["image"] for figure in figures} >= {
        "_static/benchmarks/real-nginx-limit-req.png"
    }
    assert "| limiter | client |" in process.stdout
