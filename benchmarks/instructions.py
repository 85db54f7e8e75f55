"""Instructions per operation of an uncontended case, counted under valgrind.

The timings of the overhead suite depend on the CPU: the same code runs at a
different ratio to ``asyncio.Semaphore`` on another processor, and a busy
machine adds noise. The number of instructions an operation executes depends
only on the code and the CPython build, so it shows a change in the fast path
exactly, and lets a run on one machine be compared with a run on another.

Each count runs one case of :mod:`benchmarks.peers` (or of another module
that runs its own cases so, as :mod:`benchmarks.sync_bench` does) in a
subprocess under valgrind's cachegrind (no cache simulation): once for ``small`` operations and
once for ``large``, after the same warmup; the difference divided by
``large - small`` is the count of one operation, start-up and warmup taken out.

``python -m benchmarks.instructions FACTORY N`` is that subprocess for
:mod:`benchmarks.peers`: it makes the case with the factory of that name and
runs its loop :data:`WARMUP` times, then N times.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import peers

__all__ = ["WARMUP", "count_instructions", "valgrind"]

_REPO = Path(__file__).resolve().parent.parent
#: Operations run before the counted ones, in both runs (imports, caches, the
#: first grants' slower paths).
WARMUP = 1_000
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def valgrind() -> str | None:
    """The valgrind executable, or ``None`` when it is not installed."""
    return shutil.which("valgrind")


def count_instructions(
    factory: str,
    small: int = 20_000,
    large: int = 120_000,
    *,
    module: str = "benchmarks.instructions",
) -> float:
    """Instructions per operation of the case made by ``peers.<factory>()``.

    ``module``: the module whose ``python -m MODULE FACTORY N`` runs the
    case instead (:mod:`benchmarks.sync_bench` for its own).

    :raises RuntimeError: when valgrind is not installed or the run fails.
    """
    if not 0 <= small < large:
        raise ValueError(f"need 0 <= small < large, got {small}, {large}")
    return (_total(module, factory, large) - _total(module, factory, small)) / (large - small)


def _total(module: str, factory: str, n: int) -> int:
    binary = valgrind()
    if binary is None:
        raise RuntimeError("valgrind is not installed")
    command = [
        binary,
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-m",
        module,
        factory,
        str(n),
    ]
    process = subprocess.run(command, cwd=_REPO, capture_output=True, text=True, check=False)
    found = _REFS.search(process.stderr)
    if process.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(command)} failed:\n{process.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


async def _run(factory: str, n: int) -> None:
    case = await getattr(peers, factory)()
    try:
        await case.loop(WARMUP)
        await case.loop(n)
    finally:
        if case.cleanup is not None:
            await case.cleanup()


if __name__ == "__main__":
    asyncio.run(_run(sys.argv[1], int(sys.argv[2])))
