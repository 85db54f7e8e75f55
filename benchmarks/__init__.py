"""throttlekit's benchmarks: ``python -m benchmarks`` (or ``nox -s benchmarks``).

Every suite runs in one process, side by side with the peers, prints a table
with the DESIGN.md targets marked PASS/MISS, and the run is written as JSON to
``benchmarks/results/latest.json``. ``python -m benchmarks.report`` turns that
JSON into the docs page ``docs/benchmarks.rst``.
"""
