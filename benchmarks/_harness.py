"""Building blocks shared by every suite: timing, results, targets and machine info.

A suite returns a :class:`SuiteResult`: tables of numbers, the DESIGN.md
targets it checks (each with PASS/MISS), the peers it skipped and why, free
notes and raw data. The runner prints it and writes it as JSON; the docs page
is generated from that JSON (``python -m benchmarks.report``).
"""

from __future__ import annotations

import datetime as _dt
import gc
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import throttlekit

__all__ = [
    "OpLoop",
    "RunConfig",
    "Skip",
    "Suite",
    "SuiteResult",
    "Table",
    "Target",
    "Timing",
    "fmt_ns",
    "fmt_ratio",
    "machine_info",
    "measure_loops",
]

#: Distributions whose versions are recorded with every run (throttlekit's own
#: comes from the package itself: its distribution is named throttlekit-http).
PACKAGES = (
    "anyio",
    "attrs",
    "aiolimiter",
    "limits",
    "pyrate-limiter",
    "requests",
    "requests-ratelimiter",
    "throttled-py",
    "trio",
)

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class RunConfig:
    """How hard a run works: ``quick`` is a smoke run that only proves the code works."""

    quick: bool = False
    #: Repeats per measurement (the median is reported).
    repeats: int = 7
    #: Wall seconds one repeat of one per-op measurement should last.
    repeat_seconds: float = 0.08
    #: Seconds of each run of the throttling-quality suite (``None``: its default).
    run_seconds: float | None = None

    @classmethod
    def make(cls, *, quick: bool, run_seconds: float | None = None) -> RunConfig:
        if quick:
            return cls(quick=True, repeats=3, repeat_seconds=0.01, run_seconds=run_seconds)
        return cls(run_seconds=run_seconds)


@dataclass
class Table:
    """A table of results: ``rows`` hold numbers or strings, one per column."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)

    def add(self, *row: Any) -> None:
        if len(row) != len(self.columns):
            raise ValueError(f"row {row!r} does not match columns {self.columns!r}")
        self.rows.append(list(row))


@dataclass
class Target:
    """A DESIGN.md target next to what was measured.

    ``passed`` is ``None`` when the measurement could not be made.
    """

    name: str
    target: str
    measured: str
    passed: bool | None

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "n/a"}[self.passed]


@dataclass
class Skip:
    """A peer or case that was not measured, and why."""

    name: str
    reason: str


@dataclass
class SuiteResult:
    """Everything one suite measured."""

    name: str
    title: str
    description: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    ran_at: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Suite:
    """A named group of benchmarks; ``run`` is synchronous and owns its event loops.

    A module that defines suites lists them in a module-level ``SUITES`` tuple and
    is named in :data:`benchmarks.runner.SUITE_MODULES`.
    """

    name: str
    summary: str
    run: Callable[[RunConfig], SuiteResult]


#: An async callable that performs its operation ``n`` times in a tight loop.
OpLoop = Callable[[int], Awaitable[None]]


def fmt_ns(value: float | None) -> str:
    """Nanoseconds as a short human string (``812 ns``, ``8.1 us``, ``1.20 ms``)."""
    if value is None:
        return "n/a"
    if value < 1_000:
        return f"{value:.0f} ns"
    if value < 1_000_000:
        return f"{value / 1_000:.2f} us"
    return f"{value / 1_000_000:.2f} ms"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


async def _time_loop(loop: OpLoop, n: int) -> float:
    """CPU nanoseconds per op of one repeat.

    Process CPU time, not wall time: on a machine shared with other work, time
    the process spends preempted is not charged to the limiter being measured.
    """
    start = time.process_time_ns()
    await loop(n)
    return (time.process_time_ns() - start) / n


@dataclass(frozen=True)
class Timing:
    """Per-op cost of one loop: median and minimum over the repeats, in nanoseconds."""

    median_ns: float
    min_ns: float
    ops_per_repeat: int
    samples_ns: list[float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def measure_loops(loops: dict[str, OpLoop], config: RunConfig) -> dict[str, Timing]:
    """Per-op CPU cost of each loop: warmup, calibration, then interleaved repeats.

    Every loop is calibrated so that one repeat takes about
    ``config.repeat_seconds`` of CPU; the repeats then run round-robin over the
    loops (so a burst of noise from other processes hits all of them alike)
    and the median is reported, with the minimum and all samples.
    """
    sizes: dict[str, int] = {}
    for name, loop in loops.items():
        await loop(200)  # warmup: caches, lazily created state
        per_op = await _time_loop(loop, 500)
        target = config.repeat_seconds * 1e9
        sizes[name] = max(200, min(1_000_000, int(target / max(per_op, 1.0))))
        await loop(sizes[name] // 4)
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(config.repeats):
        for name, loop in loops.items():
            gc.collect()
            samples[name].append(await _time_loop(loop, sizes[name]))
    return {
        name: Timing(
            median_ns=statistics.median(values),
            min_ns=min(values),
            ops_per_repeat=sizes[name],
            samples_ns=[round(v, 1) for v in values],
        )
        for name, values in samples.items()
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "throttlekit"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{out}{' (core modified)' if dirty else ''}"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, Python, package versions, date."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        usable = os.cpu_count() or 1
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        load = []
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "load_average": load,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(terse=True),
        "event_loop": "asyncio (default loop)",
        "packages": {
            "throttlekit": throttlekit.__version__,
            **{dist: _version(dist) for dist in PACKAGES},
        },
        "commit": _git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def render_text_table(table: Table) -> str:
    """A plain-text table for the terminal."""
    cells = [[str(c) for c in table.columns]] + [[_cell(c) for c in row] for row in table.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    lines = [table.title]
    for index, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def render_suite_text(result: SuiteResult) -> str:
    parts = [f"== {result.title} ({result.name}, {result.seconds:.1f} s) =="]
    for table in result.tables:
        parts.append(render_text_table(table))
    if result.targets:
        targets = Table("Targets (DESIGN.md)", ["what", "target", "measured", "verdict"])
        for target in result.targets:
            targets.add(target.name, target.target, target.measured, target.verdict)
        parts.append(render_text_table(targets))
    parts.extend(f"skipped {skip.name}: {skip.reason}" for skip in result.skipped)
    parts.extend(f"note: {note}" for note in result.notes)
    return "\n\n".join(parts)
