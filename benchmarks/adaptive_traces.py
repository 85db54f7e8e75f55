"""Adaptive's behaviour as traces in virtual time, recorded and compared between commits.

A trace is what Adaptive decided and when, seen through the public
:class:`~throttlekit.Controller` protocol only, so that it means the same
whatever the code inside looks like: for every answer a scope's Adaptive
state was fed, the instant, the send instant and status it reports, and then
(when any of them changed) its delay, concurrency, ``blocked_until``, jitter
and ``reason``. The send instants of every answered request are in it, so
two runs that send differently differ in their traces.

The runs are the virtual-time tests of ``tests/test_adaptive.py`` (on
asyncio: trio shuffles tasks that wake at one instant, so its runs are not
repeatable) and the quality benchmark's site models, each crawled for a
minute (the long window for five) as the benchmark's Adaptive client does.

Usage::

    python -m benchmarks.adaptive_traces record OUT.json.gz
    python -m benchmarks.adaptive_traces compare OLD.json.gz NEW.json.gz
    python -m benchmarks.adaptive_traces against REV   # record REV and the work tree, compare

``compare`` prints, per run that differs, the first row that moved, and exits
1 when any run differs or is missing. ``against`` records ``REV`` in a
temporary git worktree with the same interpreter, then the work tree.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: The pytest selection recorded: Adaptive's virtual-time tests on asyncio
#: (hypothesis runs are random by design and are left out) and this module's
#: sites, but the one whose epoch resets are read on the wall clock (no two
#: of its runs are alike).
SELECTION = [
    "tests/test_adaptive.py",
    str(Path(__file__).relative_to(ROOT)),
    "-k",
    "not trio and not never_inside_a_wait",
    f"--deselect={Path(__file__).relative_to(ROOT)}::test_quality_site[x-ratelimit]",
]
#: Seconds each quality site is crawled for, unless the site says otherwise.
SITE_SECONDS = 60.0


class Recorder:
    """A pytest plugin: records every Adaptive state's decisions, per test."""

    def __init__(self) -> None:
        self.runs: dict[str, list[list[Any]]] = {}
        self._rows: list[list[Any]] | None = None
        self._states: dict[int, int] = {}
        self._keep: list[object] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        self._rows, self._states, self._keep = [], {}, []
        try:
            return (yield)
        finally:
            self.runs[item.nodeid] = self._rows
            self._rows, self._keep = None, []

    def pytest_sessionstart(self) -> None:
        """Wrap the feedback method of whatever class ``Adaptive.controller`` makes."""
        from throttlekit import Adaptive, ScopePolicy

        cls = type(Adaptive().controller(ScopePolicy()))
        original = cls.on_feedback
        recorder = self

        def on_feedback(state: Any, scope: Any, feedback: Any, now: float) -> None:
            original(state, scope, feedback, now)
            recorder.row(state, feedback, now)

        cls.on_feedback = on_feedback  # type: ignore[method-assign]

    def row(self, state: Any, feedback: Any, now: float) -> None:
        rows = self._rows
        if rows is None:
            return
        index = self._states.setdefault(id(state), len(self._states))
        if len(self._keep) < len(self._states):
            self._keep.append(state)  # (an id stays this state's while it lives)
        jitter = state.jitter
        decided = [
            repr(state.delay),
            state.concurrency,
            repr(state.blocked_until),
            None if jitter is None else [repr(x) for x in jitter],
            state.reason,
        ]
        last = next((row for row in reversed(rows) if row[0] == index and len(row) > 4), None)
        row: list[Any] = [index, repr(now), repr(feedback.sent_at), feedback.status]
        if last is None or last[4:] != decided:
            row.extend(decided)
        rows.append(row)


def test_quality_site(site_name: str) -> None:
    """Crawl one quality site model as the benchmark's Adaptive client does (recorded)."""
    from benchmarks.quality import SITES
    from throttlekit import Adaptive, ScopePolicy
    from throttlekit.testing import burst, simulate

    site = next(site for site in SITES if site.name == site_name)
    seconds = site.seconds or SITE_SECONDS
    policy = ScopePolicy(concurrency=16, delay=0, slot_delay=0, adaptive=Adaptive())
    simulate(policy, site.model(seconds), burst("https://site.test/{i}", 20000), duration=seconds)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "site_name" in metafunc.fixturenames:
        from benchmarks.quality import SITES

        metafunc.parametrize("site_name", [site.name for site in SITES])


def record(out: Path) -> int:
    """Run the selection with the recorder and write its traces to ``out``."""
    recorder = Recorder()
    code = pytest.main(
        ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-x", *SELECTION],
        plugins=[recorder],
    )
    with gzip.open(out, "wt") as file:
        json.dump(recorder.runs, file)
    import throttlekit

    print(f"{len(recorder.runs)} runs of {throttlekit.__file__} recorded to {out}")
    return int(code)


def compare(old_path: Path, new_path: Path) -> int:
    """Print the first row that moved in each run; 1 when any run differs or is missing."""
    with gzip.open(old_path, "rt") as file:
        old = json.load(file)
    with gzip.open(new_path, "rt") as file:
        new = json.load(file)
    moved = 0
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            print(f"{name}: only in {'new' if a is None else 'old'}")
            moved += 1
            continue
        if a == b:
            continue
        moved += 1
        pairs = enumerate(zip(a, b, strict=False))
        first = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
        print(f"{name}: {len(a)} -> {len(b)} rows, first difference at row {first}")
        print(f"    old: {a[first] if first < len(a) else '(end)'}")
        print(f"    new: {b[first] if first < len(b) else '(end)'}")
    print(f"{len(set(old) | set(new)) - moved} runs identical, {moved} differ or are missing")
    return 1 if moved else 0


def against(rev: str) -> int:
    """Record ``rev`` (in a temporary worktree) and the work tree, and compare them."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True)
        try:
            old, new = Path(tmp) / "old.json.gz", Path(tmp) / "new.json.gz"
            env = {**os.environ, "PYTHONPATH": str(tree)}
            command = [sys.executable, "-m", "benchmarks.adaptive_traces", "record"]
            subprocess.run([*command, str(old)], cwd=tree, env=env, check=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            subprocess.run([*command, str(new)], cwd=ROOT, env=env, check=True)
            return compare(old, new)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "record":
        return record(Path(argv[1]))
    if len(argv) == 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]))
    if len(argv) == 2 and argv[0] == "against":
        return against(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
