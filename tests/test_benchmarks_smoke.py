"""Smoke tests of the benchmarks, so their code cannot rot.

``python -m benchmarks --quick`` runs every suite with small sizes in a
subprocess (peers that are not installed are skipped with a reason), writes
JSON, and ``python -m benchmarks.report`` turns it into a valid page. No speed
is asserted here: numbers belong to the benchmarks themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SUITES = {
    "uncontended",
    "scopes",
    "contended",
    "cap",
    "quality",
    "real-limiters",
    "redis",
    "redis-scale",
    "sync",
}

pytestmark = pytest.mark.slow


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _check_rst(text: str) -> None:
    docutils_core = pytest.importorskip("docutils.core")
    docutils_core.publish_doctree(
        text, settings_overrides={"halt_level": 2, "report_level": 2, "warning_stream": False}
    )


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    output = tmp_path_factory.mktemp("benchmarks") / "quick.json"
    process = _run("benchmarks", "--quick", "--output", str(output), timeout=150)
    assert process.returncode == 0, process.stdout + process.stderr
    return json.loads(output.read_text(encoding="utf-8")), process.stdout, output


def test_quick_run_writes_every_suite(quick: tuple[dict[str, Any], str, Path]) -> None:
    document, stdout, _ = quick
    assert document["schema"] == 1
    assert document["quick"] is True
    assert set(document["suites"]) == SUITES
    machine = document["machine"]
    assert machine["cores"] >= 1
    assert machine["python"].startswith(("CPython", "PyPy"))
    assert machine["packages"]["throttlekit"]
    for suite in document["suites"].values():
        assert suite["tables"], suite["name"]
        assert all(table["rows"] for table in suite["tables"])
        for target in suite["targets"]:
            assert target["passed"] in (True, False, None)
    # The table and the verdicts were printed.
    assert "vs asyncio.Semaphore" in stdout
    assert "PASS" in stdout or "MISS" in stdout


def test_quick_run_measures_the_references_and_throttlekit(
    quick: tuple[dict[str, Any], str, Path],
) -> None:
    document, _, _ = quick
    per_op = document["suites"]["uncontended"]["data"]["per_op"]
    for label in ("asyncio.Semaphore", "anyio.CapacityLimiter", "throttlekit"):
        assert per_op[label]["median_ns"] > 0
        assert per_op[label]["ratio_vs_semaphore"] > 0
    skipped = {skip["name"] for skip in document["suites"]["uncontended"]["skipped"]}
    for label in ("aiolimiter", "limits", "pyrate-limiter", "throttled-py"):
        # Every peer is either measured or skipped with a reason, never silently missing.
        assert (label in per_op) != (label in skipped), label
    memory = document["suites"]["scopes"]["data"]["memory"]
    assert all(v["bytes_per_scope"] > 0 for per in memory.values() for v in per.values())
    sync = document["suites"]["sync"]
    for label in ("threading.Semaphore", "SyncLimiter", "throttlekit ThrottledAdapter"):
        assert sync["data"]["per_op"][label]["median_ns"] > 0
    skipped = {skip["name"] for skip in sync["skipped"]}
    for label, factory in (
        ("pyrate-limiter", "pyrate_limiter"),
        ("requests-ratelimiter", "requests_ratelimiter"),
    ):
        assert (label in sync["data"]["per_op"]) != (factory in skipped), label
    assert set(sync["data"]["threads"]) == {
        "one scope, concurrency 8",
        "64 scopes, concurrency 1 each",
    }


def test_virtual_clock_run_serves_everything_at_the_allowed_rate(
    quick: tuple[dict[str, Any], str, Path],
) -> None:
    virtual = quick[0]["suites"]["contended"]["data"]["virtual"]
    # Virtual time is exact: every scope sends at exactly one request per delay.
    assert virtual["rate_share_min"] == pytest.approx(1.0)
    # ... and finishes no later than the last send plus the longest service time.
    assert virtual["virtual_makespan_s"] <= virtual["ideal_makespan_s"] + 1e-9
    assert 0 < virtual["scheduler_per_grant_ns"] <= virtual["cpu_per_grant_ns"]


def test_report_renders_a_valid_page(
    quick: tuple[dict[str, Any], str, Path], tmp_path: Path
) -> None:
    _, _, results = quick
    page = tmp_path / "benchmarks.rst"
    process = _run("benchmarks.report", "--input", str(results), "--output", str(page))
    assert process.returncode == 0, process.stderr
    text = page.read_text(encoding="utf-8")
    assert "Where throttlekit falls short" in text
    assert "asyncio.Semaphore" in text
    assert "--quick" in text  # a quick run is flagged as such
    _check_rst(text)


def test_committed_page_matches_committed_results(tmp_path: Path) -> None:
    results = REPO / "benchmarks" / "results" / "latest.json"
    committed = REPO / "docs" / "benchmarks.rst"
    if not results.exists():
        pytest.skip("no committed benchmark results yet")
    page = tmp_path / "benchmarks.rst"
    process = _run("benchmarks.report", "--input", str(results), "--output", str(page))
    assert process.returncode == 0, process.stderr
    assert committed.read_text(encoding="utf-8") == page.read_text(encoding="utf-8"), (
        "docs/benchmarks.rst is stale: run 'python -m benchmarks.report'"
    )
    _check_rst(page.read_text(encoding="utf-8"))


def test_unknown_suite_is_refused() -> None:
    process = _run("benchmarks", "--only", "nope")
    assert process.returncode == 2
    assert "unknown suite(s): nope" in process.stderr
    listing = _run("benchmarks", "--list")
    assert listing.returncode == 0
    assert {line.split()[0] for line in listing.stdout.splitlines()} == SUITES


def test_quick_run_measures_a_new_scope_at_the_cap_and_calls_per_op(
    quick: tuple[dict[str, Any], str, Path],
) -> None:
    document, _, _ = quick
    per_op = document["suites"]["uncontended"]["data"]["per_op"]
    assert per_op["throttlekit"]["calls_per_op"] > 0
    assert per_op["asyncio.Semaphore"]["calls_per_op"] > 0
    cap = document["suites"]["cap"]["data"]
    bound = cap["throttlekit, 10 s delay"]
    assert bound["per_new_scope_ns"] > 0
    # Every old scope is inside its delay: none may be forgotten, the new ones are kept.
    assert bound["scopes_after"] > bound["max_scopes"]
    assert (
        cap["throttlekit, no delay"]["scopes_after"] == cap["throttlekit, no delay"]["max_scopes"]
    )


def test_instructions_per_operation_are_counted_under_valgrind() -> None:
    instructions = pytest.importorskip("benchmarks.instructions")
    if instructions.valgrind() is None:
        pytest.skip("valgrind is not installed")
    semaphore = instructions.count_instructions("asyncio_semaphore", 0, 2_000)
    ours = instructions.count_instructions("throttlekit_url", 0, 2_000)
    # An uncontended acquire+release runs thousands of instructions, and
    # throttlekit's more than a bare Semaphore's (its start-up is taken out).
    assert 1_000 < semaphore < ours < 100_000
    with pytest.raises(ValueError, match="small < large"):
        instructions.count_instructions("asyncio_semaphore", 10, 10)
