"""The example scripts run as shown, with no network, and print what they demonstrate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize(
    "script", ["httpx_example.py", "aiohttp_example.py", "requests_example.py"]
)
def test_client_example_runs_offline_and_shows_the_spacing(script: str) -> None:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        environment.pop(name, None)
    result = subprocess.run(
        [sys.executable, script],
        cwd=EXAMPLES,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "12 pages, statuses [200]" in out, out
    for host in ("example.com", "example.org", "example.net"):
        match = re.search(rf"^{re.escape(host)}: requests arrived at (.+) s$", out, re.M)
        assert match, out
        times = [float(value) for value in match.group(1).split(", ")]
        # 4 pages, 0.25 s apart: the last arrives about 0.75 s after the first.
        assert len(times) == 4
        assert times[-1] >= 0.75 - 0.1, out
