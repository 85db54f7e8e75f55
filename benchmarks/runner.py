"""Command line of the benchmarks: pick suites, run them, print tables, write JSON.

Suites live in the modules of :data:`SUITE_MODULES`; each module has a
``SUITES`` tuple of :class:`~benchmarks._harness.Suite`. A new suite (for
example the throttling-quality suite) plugs in by adding its module here.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._harness import RunConfig, Suite, machine_info, render_suite_text

__all__ = ["DEFAULT_OUTPUT", "SCHEMA", "SUITE_MODULES", "all_suites", "main"]

#: Modules that define suites, in the order they run.
SUITE_MODULES = (
    "benchmarks.overhead",
    "benchmarks.quality",
    "benchmarks.real_limiters",
    "benchmarks.redis_bench",
    "benchmarks.sync_bench",
)
#: Where a full run writes its results (the docs page is generated from it).
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "latest.json"
#: Version of the JSON layout, bumped when it changes incompatibly.
SCHEMA = 1
COMMAND = "python -m benchmarks"


def all_suites() -> dict[str, Suite]:
    suites: dict[str, Suite] = {}
    for module_name in SUITE_MODULES:
        module = importlib.import_module(module_name)
        for suite in module.SUITES:
            if suite.name in suites:
                raise RuntimeError(f"two suites are named {suite.name!r}")
            suites[suite.name] = suite
    return suites


def _parse(argv: Sequence[str] | None, names: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Run throttlekit's benchmarks side by side with the peers.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke run with small sizes (numbers are not meaningful); "
        "writes no results unless --output is given",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        default=[],
        help=f"run only this suite (repeatable or comma-separated): {', '.join(names)}",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"write the JSON results here (default for a full run: {DEFAULT_OUTPUT.name} "
        "in benchmarks/results/); with --only, the other suites' results already in "
        "the file are kept",
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=None,
        metavar="S",
        help="seconds of each run of the quality suite (default 60, or 3 with --quick)",
    )
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    return parser.parse_args(argv)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    return data


def _write(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    suites = all_suites()
    args = _parse(argv, list(suites))
    if args.list:
        for suite in suites.values():
            print(f"{suite.name:12s} {suite.summary}")
        return 0
    selected = [name.strip() for item in args.only for name in item.split(",") if name.strip()]
    unknown = [name for name in selected if name not in suites]
    if unknown:
        print(
            f"unknown suite(s): {', '.join(unknown)}; choose from {', '.join(suites)}",
            file=sys.stderr,
        )
        return 2
    names = selected or list(suites)
    if args.run_seconds is not None and not args.run_seconds > 0:
        print(f"--run-seconds must be > 0, got {args.run_seconds}", file=sys.stderr)
        return 2
    config = RunConfig.make(quick=args.quick, run_seconds=args.run_seconds)
    output: Path | None = args.output
    if output is None and not args.quick:
        output = DEFAULT_OUTPUT

    machine = machine_info()
    print(
        f"throttlekit benchmarks{' (quick smoke run)' if args.quick else ''}: "
        f"{machine['cpu']}, {machine['usable_cores']} cores, {machine['python']}, "
        f"load {machine['load_average']}",
        flush=True,
    )
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for name in names:
        print(f"\nrunning {name}...", flush=True)
        began = time.perf_counter()
        result = suites[name].run(config)
        result.seconds = round(time.perf_counter() - began, 2)
        result.ran_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        results[name] = result.to_json()
        print(render_suite_text(result), flush=True)
    total = time.perf_counter() - started
    print(f"\nall done in {total:.1f} s", flush=True)

    if output is not None:
        document: dict[str, Any] = {
            "schema": SCHEMA,
            "command": COMMAND,
            "quick": args.quick,
            "machine": machine,
            "seconds": round(total, 2),
            "suites": {},
        }
        previous = _load(output) if selected else None
        if previous is not None and previous.get("quick") == args.quick:
            document["suites"] = previous.get("suites", {})
            document["partial_runs"] = [*previous.get("partial_runs", []), names]
        # Keep the suites in their canonical order.
        merged = {**document["suites"], **results}
        document["suites"] = {name: merged[name] for name in suites if name in merged}
        _write(output, document)
        print(f"results written to {output}", flush=True)
    return 0
