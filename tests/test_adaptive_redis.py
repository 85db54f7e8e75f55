"""Adaptive through Redis: three processes share one scope and find the server's rate together."""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import anyio
import pytest
from _redis import RedisServer, free_port, read_line
from aiohttp import web

pytestmark = [pytest.mark.redis, pytest.mark.slow]

WORKER = Path(__file__).with_name("adaptive_worker.py")
LIMIT = 10  # requests per sliding second
RUN = 20.0  # seconds
WORKERS = 3


@pytest.fixture
def anyio_backend() -> str:
    """The Redis backend runs on asyncio only (redis.asyncio)."""
    return "asyncio"


class SlidingQuota:
    """An API allowing ``LIMIT`` requests per sliding second; 429 with ``Retry-After: 1`` beyond."""

    def __init__(self) -> None:
        self.served: deque[float] = deque()
        self.records: list[tuple[float, int, str]] = []  # (arrival, status, worker)

    async def handle(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        while self.served and self.served[0] <= now - 1.0:
            self.served.popleft()
        worker = request.headers.get("X-Worker", "")
        if len(self.served) >= LIMIT:
            self.records.append((now, 429, worker))
            return web.Response(status=429, headers={"Retry-After": "1"})
        self.served.append(now)
        self.records.append((now, 200, worker))
        await anyio.sleep(0.02)
        return web.Response(text="ok")


class InFlightCap:
    """nginx's ``limit_conn 4`` before a 100 ms origin: a 503 at once when 4 are being served."""

    limit = 4
    latency = 0.1

    def __init__(self) -> None:
        self.serving = 0
        self.records: list[tuple[float, int, str]] = []  # (arrival, status, worker)

    async def handle(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        worker = request.headers.get("X-Worker", "")
        if self.serving >= self.limit:
            self.records.append((now, 503, worker))
            return web.Response(status=503)
        self.serving += 1
        self.records.append((now, 200, worker))
        try:
            await anyio.sleep(self.latency)
        finally:
            self.serving -= 1
        return web.Response(text="ok")


async def _run_workers(
    redis_server: RedisServer,
    prefix: str,
    handle: Any,
    run: float,
    tasks: int = 4,
    logs: Path | None = None,
) -> None:
    """Serve ``handle`` while ``WORKERS`` processes send to it for ``run`` seconds.

    With ``logs``, each writes Adaptive's decisions to ``w<number>.log`` there.
    """
    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    processes = []
    try:
        for number in range(WORKERS):
            command = [
                sys.executable, str(WORKER), "--redis-url", redis_server.url, "--prefix", prefix,
                "--url", f"http://127.0.0.1:{port}/", "--name", f"w{number}",
                "--duration", str(run), "--tasks", str(tasks),
            ]  # fmt: skip
            if logs is not None:
                command += ["--log", str(logs / f"w{number}.log")]
            processes.append(await anyio.open_process(command))
        for process in processes:
            assert await read_line(process, 20.0) == "ready"
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send(b"go\n")
        for process in processes:
            assert await read_line(process, run + 30.0) == "done"
    finally:
        for process in processes:
            if process.returncode is None:  # terminating an exited process raises
                process.terminate()
        for process in processes:
            await process.wait()
        await runner.cleanup()


@pytest.mark.anyio
async def test_three_processes_find_the_rate_together(
    redis_server: RedisServer, prefix: str
) -> None:
    site = SlidingQuota()
    await _run_workers(redis_server, prefix, site.handle, RUN)

    records = site.records
    start = records[0][0]
    ok = [at - start for at, status, _ in records if status == 200]
    refused = sum(1 for _, status, _ in records if status == 429)
    workers = {worker for _, status, worker in records if status == 200}
    assert len(workers) == WORKERS  # all took part
    # One rate for the scope, not one each: three processes hold near the
    # server's limit together, as one process does (never 3x it, never far below).
    second_half = sum(1 for at in ok if RUN / 2 <= at < RUN) / (RUN / 2)
    timeline = [sum(1 for at in ok if s <= at < s + 1) for s in range(int(RUN))]
    refusals = [round(at - start, 1) for at, status, _ in records if status == 429]
    assert second_half >= 0.85 * LIMIT, (second_half, timeline, refusals)
    assert refused <= 0.04 * len(records), (refused, len(records))


@pytest.mark.anyio
async def test_three_processes_find_a_limit_on_requests_in_flight_together(
    redis_server: RedisServer, prefix: str, tmp_path: Path
) -> None:
    # The count in flight a refusal sees is the processes' leases, which
    # read one or two above what the server serves: the detector wanted one
    # count three times and reset on a lower one, and the scope was held as
    # a rate limit at 60-80 % of what the server allows.
    #
    # On a loaded machine, about one run in eight still misses (a clean CI
    # run once, and 2 of 13 runs beside other work): the opening's refusals
    # read counts too far apart to be one, its errors cut for overload, and
    # the errors at 21/s that followed were taken for a rate limit's, held at
    # 20/s until a look for a rise found the limit 20 s later. So a second
    # run must hold where the first missed: a regression misses both. The
    # first's figures and decisions are printed (``pytest -rP`` shows them).
    missed = await _in_flight_run(redis_server, f"{prefix}-a", tmp_path / "a")
    if missed is None:
        return
    print("first run missed:", *missed, sep="\n")
    again = await _in_flight_run(redis_server, f"{prefix}-b", tmp_path / "b")
    assert again is None, (missed, again)


async def _in_flight_run(redis_server: RedisServer, prefix: str, logs: Path) -> list[str] | None:
    """Three processes against :class:`InFlightCap` for 30 s: ``None``, or how they missed."""
    await anyio.Path(logs).mkdir()
    site = InFlightCap()
    run = 30.0
    await _run_workers(redis_server, prefix, site.handle, run, tasks=8, logs=logs)
    records = site.records
    start = records[0][0]
    ok = [at - start for at, status, _ in records if status == 200]
    allowed = site.limit / site.latency
    second_half = sum(1 for at in ok if run / 2 <= at < run) / (run / 2)
    timeline = [sum(1 for at in ok if s <= at < s + 1) for s in range(int(run))]
    refused = sum(1 for _, status, _ in records if status == 503)
    if second_half >= 0.85 * allowed and refused <= 0.03 * len(records):
        return None
    # (The site's clock is monotonic, the workers' logs the wall clock's.)
    decisions = _decisions(logs, time.time() - (time.monotonic() - start))
    figures = f"{second_half:.1f}/s in the second half, {refused} of {len(records)} refused"
    return [figures, f"accepted per second: {timeline}", *decisions]


def _decisions(logs: Path, start: float) -> list[str]:
    """The workers' decisions in time order, in seconds from ``start`` (wall clock)."""
    lines = []
    for path in sorted(logs.glob("w*.log")):
        for line in path.read_text().splitlines():
            at, _, text = line.partition(" ")
            lines.append((float(at), f"{float(at) - start:7.3f} {path.stem} {text}"))
    return [text for _, text in sorted(lines)]
