"""The Redis backend against a local redis-server: cost per grant and shared rate.

``run(quick)`` starts its own ``redis-server`` on a free port of 127.0.0.1
(``--save '' --appendonly no``), measures, stops it and returns a dict:

``single``
    one process, one scope without delay, acquire + release one after the
    other, in rounds interleaved with as many ``PING`` calls of the same
    client (one round trip through redis-py, the floor of any client call):
    the acquire and the pair in multiples of a ``PING`` (medians of the
    per-round ratios, so the machine's load hits both alike), in wall time
    and in this process's CPU time (the client's own cost), the release alone
    (it does not wait for its reply: it goes out with the next acquire, which
    reads it), the floor of any script call (``EVALSHA`` of a script that only
    returns, sent the way the backend sends its scripts), round trips
    per acquire and per release (the backend's counts, and ``EVALSHA`` calls
    per pair counted by the server), Redis's own time per ``EVALSHA`` and per
    ``PING`` (``INFO commandstats``: the scripts' cost in the server), the
    Python function calls per pair (cProfile, so that a regression shows),
    and the in-memory limiter for comparison.
``with_controllers``
    the same pairs with AutoThrottle and every response recorded: the
    release then also runs the controllers on the state that came with the
    grant and writes the result with the release.
``concurrent``
    the same with 16 tasks at once (grants per second).
``multiprocess``
    4 worker processes x 3 tasks share one scope (concurrency 3, delay
    ``DELAY``, no jitter), each request held ``HOLD`` s, for ``duration`` s:
    the aggregate rate of the send times (Redis clock) against the policy's
    ``1 / DELAY``, the most leases held at once, and acquire round trips per
    grant (from the server's ``EVALSHA`` count minus the releases). Run with
    the default ``reserve_ahead`` and with ``reserve_ahead=0`` (grants only at
    the current instant) to show what reserving buys.
``targets``
    DESIGN.md's: rate within 1 % of the policy, concurrency never exceeded,
    one round trip per uncontended acquire, at most 1.5 PINGs per acquire.

``python -m benchmarks.redis_bench [--quick]`` prints the dict as JSON;
``--uncontended 5`` runs only ``single``, five times on one server, and
prints each run's PINGs per acquire and their median (the target's figure).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

import anyio
import attrs

import throttlekit
from throttlekit.backends._redis_link import Script
from throttlekit.backends.redis import RedisBackend

__all__ = ["DELAY", "HOLD", "run", "uncontended"]

#: The shared scope's delay in the multi-process run (policy rate 1 / DELAY).
DELAY = 0.02
#: How long each request holds its permit in the multi-process run.
HOLD = 0.005
#: The backend's ``reserve_ahead`` values compared (the default first).
RESERVE_AHEAD = (0.05, 0.0)
PROCESSES = 4
TASKS = 3
CONCURRENCY = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Server:
    def __init__(self, binary: str) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


async def _evalsha_calls(client: Any) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def _server_us(client: Any) -> dict[str, float]:
    """Redis's own time per call (us) of EVALSHA and PING, from INFO commandstats."""
    stats = await client.info("commandstats")
    return {
        name: float(stats.get(f"cmdstat_{name}", {}).get("usec_per_call", 0.0))
        for name in ("evalsha", "ping")
    }


def _policy() -> throttlekit.ScopePolicy:
    return throttlekit.ScopePolicy(concurrency=None, delay=0.0, slot_delay=0.0)


async def _pairs(
    limiter: throttlekit.Limiter, count: int, feedback: bool
) -> tuple[float, float, float, float, float]:
    """Seconds per acquire and per acquire+release, wall and process CPU, ``count`` in a row.

    Then the wall time of the release alone.
    """
    wall = cpu = release = 0.0
    started, started_cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        permit = limiter.acquire(scopes="s")
        before, before_cpu = time.perf_counter(), time.process_time()
        await permit.__aenter__()
        wall += time.perf_counter() - before
        cpu += time.process_time() - before_cpu
        if feedback:
            permit.record(status=200, latency=0.0)
        before = time.perf_counter()
        await permit.__aexit__(None, None, None)
        release += time.perf_counter() - before
    pair = (time.perf_counter() - started) / count
    pair_cpu = (time.process_time() - started_cpu) / count
    return wall / count, pair, cpu / count, pair_cpu, release / count


async def _calls_per_pair(limiter: throttlekit.Limiter, count: int) -> float:
    """Python function calls per uncontended acquire+release (cProfile), round trips included."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    await _pairs(limiter, count, False)
    profile.disable()
    stats: Any = pstats.Stats(profile)
    return float(stats.total_calls) / count


#: The floor of any script call: EVALSHA of a script that does nothing but
#: return a grant's reply, sent the way the backend sends its scripts.
_TRIVIAL = Script("return '1,0.000,1.000,1.000'")


async def _trivial_calls(backend: RedisBackend, count: int) -> float:
    """Seconds per call of the trivial script through the backend's own call path."""
    calls = backend._calls
    started = time.perf_counter()
    for _ in range(count):
        await calls.call(_TRIVIAL, [], [], float("inf"))
    return (time.perf_counter() - started) / count


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def _single(url: str, ops: int) -> dict[str, Any]:
    """Uncontended acquire+release against PINGs of the same client, interleaved in rounds."""
    backend = RedisBackend.from_url(url, prefix="bench-single")
    limiter = throttlekit.Limiter(default=_policy(), backend=backend, concurrency=None)
    controlled = RedisBackend.from_url(url, prefix="bench-controlled")
    with_controllers = throttlekit.Limiter(
        default=attrs.evolve(_policy(), autothrottle=throttlekit.AutoThrottle(start_delay=0.0)),
        backend=controlled,
        concurrency=None,
    )
    admin = backend.client
    for _ in range(50):  # warm up: scripts loaded, connections open
        await _pairs(limiter, 1, False)
        await _pairs(with_controllers, 1, True)
        await admin.ping()
        await _trivial_calls(backend, 1)
    rounds = 9
    each = max(1, ops // rounds)
    keys = (
        "acquire",
        "pair",
        "ping",
        "acquire_cpu",
        "pair_cpu",
        "release",
        "controlled_pair",
        "trivial",
    )
    samples: dict[str, list[float]] = {key: [] for key in (*keys, "evalsha_us", "ping_server_us")}
    evalsha = controlled_evalsha = 0
    for _ in range(rounds):
        await admin.config_resetstat()
        acquire, pair, acquire_cpu, pair_cpu, release = await _pairs(limiter, each, False)
        evalsha += await _evalsha_calls(admin)
        started, started_cpu = time.perf_counter(), time.process_time()
        for _ in range(each):
            await admin.ping()
        ping = (time.perf_counter() - started) / each
        ping_cpu = (time.process_time() - started_cpu) / each
        server = await _server_us(admin)
        trivial = await _trivial_calls(backend, each)
        await admin.config_resetstat()
        _, controlled_pair, _, _, _ = await _pairs(with_controllers, each, True)
        controlled_evalsha += await _evalsha_calls(admin)
        # Ratios within a round, so that the machine's load hits both alike.
        samples["acquire"].append(acquire / ping)
        samples["pair"].append(pair / ping)
        samples["ping"].append(ping)
        samples["acquire_cpu"].append(acquire_cpu / ping_cpu)
        samples["pair_cpu"].append(pair_cpu / ping_cpu)
        samples["release"].append(release / ping)
        samples["controlled_pair"].append(controlled_pair / ping)
        samples["trivial"].append(trivial / ping)
        samples["evalsha_us"].append(server["evalsha"])
        samples["ping_server_us"].append(server["ping"])
    calls_per_pair = await _calls_per_pair(limiter, max(100, each))
    ping_us = _median(samples["ping"]) * 1e6
    local = throttlekit.Limiter(default=_policy(), concurrency=None)
    started = time.perf_counter()
    for _ in range(ops):
        async with local.acquire(scopes="s"):
            pass
    in_memory = time.perf_counter() - started
    # 16 tasks at once on one scope.
    done = 0
    concurrent_ops = ops * 2

    async def worker() -> None:
        nonlocal done
        while done < concurrent_ops:
            done += 1
            async with limiter.acquire(scopes="c"):
                pass

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(16):
            group.start_soon(worker)
    concurrent = time.perf_counter() - started
    stats = backend.statistics()
    await backend.aclose()
    await controlled.aclose()
    total = rounds * each
    return {
        "single": {
            "ops": total,
            "rounds": rounds,
            "ping_us": ping_us,
            "pings_per_acquire": _median(samples["acquire"]),
            "pings_per_acquire_release": _median(samples["pair"]),
            "cpu_pings_per_acquire": _median(samples["acquire_cpu"]),
            "cpu_pings_per_acquire_release": _median(samples["pair_cpu"]),
            "us_per_acquire": _median(samples["acquire"]) * ping_us,
            "us_per_acquire_release": _median(samples["pair"]) * ping_us,
            "pings_per_release": _median(samples["release"]),
            "pings_per_trivial_script": _median(samples["trivial"]),
            "server_us_per_evalsha": _median(samples["evalsha_us"]),
            "server_us_per_ping": _median(samples["ping_server_us"]),
            "python_calls_per_acquire_release": calls_per_pair,
            "evalsha_per_acquire_release": evalsha / total,
            "acquire_round_trips": stats.acquire_calls / stats.grants,
            "release_round_trips": stats.release_calls / stats.grants,
            "in_memory_us_per_acquire_release": in_memory / ops * 1e6,
        },
        "with_controllers": {
            "policy": "AutoThrottle, every response recorded",
            "evalsha_per_acquire_release": controlled_evalsha / total,
            "pings_per_acquire_release": _median(samples["controlled_pair"]),
        },
        "concurrent": {
            "tasks": 16,
            "ops": done,
            "grants_per_s": done / concurrent,
        },
    }


def _worker_command(url: str, prefix: str, duration: float, reserve_ahead: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.redis_bench",
        "--worker",
        "--url",
        url,
        "--prefix",
        prefix,
        "--duration",
        str(duration),
        "--reserve-ahead",
        str(reserve_ahead),
    ]


def _multiprocess(url: str, duration: float, reserve_ahead: float) -> dict[str, Any]:
    import redis

    prefix = f"bench-mp-{reserve_ahead:g}-{time.time():.0f}"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    workers = [
        subprocess.Popen(
            _worker_command(url, prefix, duration, reserve_ahead),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=root,
            env=env,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    admin = redis.Redis.from_url(url)
    try:
        for worker in workers:
            assert worker.stdout is not None
            line = worker.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a benchmark worker failed to start: {line!r}")
        admin.config_resetstat()
        start_at = time.time() + 0.2
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(f"{start_at}\n")
            worker.stdin.flush()
        records: list[tuple[float, float]] = []
        calls = 0
        for worker in workers:
            output, _ = worker.communicate(timeout=duration + 30)
            result = json.loads(output.strip().splitlines()[-1])
            records.extend((send, end) for send, end in result["records"])
            calls += result["acquire_calls"]
        evalsha = int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        admin.close()
    sends = sorted(send for send, _ in records)
    events = sorted([(send, 1) for send, _ in records] + [(end, -1) for _, end in records])
    most = level = 0
    for _, step in events:
        level += step
        most = max(most, level)
    rate = (len(sends) - 1) / (sends[-1] - sends[0])
    policy = 1.0 / DELAY
    grants = len(records)
    return {
        "reserve_ahead": reserve_ahead,
        "processes": PROCESSES,
        "tasks_per_process": TASKS,
        "duration_s": duration,
        "grants": grants,
        "policy_rate": policy,
        "achieved_rate": rate,
        "rate_error_pct": (rate - policy) / policy * 100.0,
        "min_send_gap_ms": min(b - a for a, b in itertools.pairwise(sends)) * 1000,
        "max_in_flight": most,
        "concurrency": CONCURRENCY,
        # Every grant was released once; the rest of the EVALSHA calls are acquire
        # attempts (a few grants near the end were cancelled unsent).
        "acquire_calls_per_grant": (evalsha - grants) / grants,
        "client_acquire_calls_per_grant": calls / grants,
    }


def uncontended(runs: int, ops: int = 3000) -> dict[str, Any]:
    """Only the ``single`` part, ``runs`` times on one server: PINGs per acquire, and the median."""
    binary = shutil.which("redis-server")
    if binary is None:
        return {"skipped": "redis-server is not installed"}
    server = _Server(binary)
    try:
        singles = [asyncio.run(_single(server.url, ops))["single"] for _ in range(runs)]
    finally:
        server.stop()
    keys = ("pings_per_acquire", "pings_per_trivial_script", "cpu_pings_per_acquire", "ping_us")
    return {
        "runs": [{key: round(single[key], 3) for key in keys} for single in singles],
        "median_pings_per_acquire": _median([single["pings_per_acquire"] for single in singles]),
        "load_average": os.getloadavg()[0],
    }


def run(quick: bool) -> dict[str, Any]:
    """Measure the Redis backend; ``quick`` uses small sizes (a smoke run)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return {"skipped": "redis-server is not installed"}
    server = _Server(binary)
    try:
        version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        result: dict[str, Any] = {"redis_server": version}
        result.update(asyncio.run(_single(server.url, 135 if quick else 5000)))
        duration = 2.0 if quick else 10.0
        result["multiprocess"] = [
            _multiprocess(server.url, duration, reserve_ahead)
            for reserve_ahead in (RESERVE_AHEAD[:1] if quick else RESERVE_AHEAD)
        ]
    finally:
        server.stop()
    shared = result["multiprocess"][0]
    single = result["single"]
    result["targets"] = {
        "aggregate rate within 1 % of the policy": abs(shared["rate_error_pct"]) <= 1.0,
        "concurrency never exceeded": all(
            run["max_in_flight"] <= run["concurrency"] for run in result["multiprocess"]
        ),
        "one round trip per uncontended acquire": single["acquire_round_trips"] == 1.0,
        "at most 1.5 PINGs per uncontended acquire": single["pings_per_acquire"] <= 1.5,
    }
    return result


# -- the worker process ------------------------------------------------------------------


async def _work(args: argparse.Namespace) -> None:
    backend = RedisBackend.from_url(
        args.url, prefix=args.prefix, reserve_ahead=args.reserve_ahead, failure="fail_closed"
    )
    policy = throttlekit.ScopePolicy(
        concurrency=CONCURRENCY, delay=DELAY, slot_delay=0.0, jitter=0.0
    )
    limiter = throttlekit.Limiter(scopes={"bench": policy}, backend=backend, concurrency=None)
    async with limiter.acquire(scopes="warm-up"):
        pass
    print("ready", flush=True)
    start_at = float(await anyio.to_thread.run_sync(sys.stdin.readline))
    await anyio.sleep(max(0.0, start_at - time.time()))
    end = start_at + args.duration
    records: list[tuple[float, float]] = []

    async def task() -> None:
        while True:
            with anyio.move_on_after(end - time.time()):
                async with limiter.acquire(scopes="bench") as permit:
                    send = permit._lease.send_at_ms / 1000.0
                    await anyio.sleep(HOLD)
                    records.append((send, time.time()))
                continue
            return

    async with anyio.create_task_group() as group:
        for _ in range(TASKS):
            group.start_soon(task)
    calls = backend.statistics().acquire_calls - 1
    await backend.aclose()
    print(json.dumps({"records": records, "acquire_calls": calls}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument(
        "--uncontended", type=int, metavar="RUNS", help="only the uncontended runs, RUNS times"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=10.0, help=argparse.SUPPRESS)
    parser.add_argument("--reserve-ahead", type=float, default=0.05, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_work(args))
        return 0
    if args.uncontended:
        print(json.dumps(uncontended(args.uncontended), indent=2))
        return 0
    print(json.dumps(run(args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- as a suite of ``python -m benchmarks`` ------------------------------------------------


def run_suite(config: Any) -> Any:
    """The Redis measurements as a :class:`~benchmarks._harness.SuiteResult`."""
    from ._harness import Skip, SuiteResult, Table, Target

    result = SuiteResult(
        name="redis",
        title="Redis backend: one budget shared by processes",
        description=(
            "uncontended acquire+release against a local redis-server, in multiples of a "
            "PING of the same client measured in the same rounds (wall time), and 4 processes "
            "sharing one scope (concurrency 3, delay 0.02 s) for the aggregate rate vs the policy"
        ),
    )
    measured = run(quick=config.quick)
    if "skipped" in measured:
        result.skipped.append(Skip("redis", measured["skipped"]))
        return result
    single = measured["single"]
    table = Table("one process, one scope, uncontended", ["measure", "value"])
    table.add("redis-py PING round trip (us)", round(single["ping_us"], 1))
    table.add("acquire (PINGs, wall time)", round(single["pings_per_acquire"], 2))
    table.add("acquire+release (PINGs, wall time)", round(single["pings_per_acquire_release"], 2))
    table.add("acquire (PINGs, client CPU)", round(single["cpu_pings_per_acquire"], 2))
    table.add(
        "acquire+release (PINGs, client CPU)", round(single["cpu_pings_per_acquire_release"], 2)
    )
    table.add("release alone (PINGs, wall time)", round(single["pings_per_release"], 2))
    table.add(
        "floor: EVALSHA of a script that only returns (PINGs, wall time)",
        round(single["pings_per_trivial_script"], 2),
    )
    table.add("acquire+release (us/op)", round(single["us_per_acquire_release"], 1))
    table.add("Redis's own time per EVALSHA (us)", round(single["server_us_per_evalsha"], 1))
    table.add("Redis's own time per PING (us)", round(single["server_us_per_ping"], 2))
    table.add(
        "Python calls per acquire+release (cProfile)",
        round(single["python_calls_per_acquire_release"]),
    )
    table.add("round trips per acquire", round(single["acquire_round_trips"], 3))
    table.add("round trips per release", round(single["release_round_trips"], 3))
    table.add(
        "in-memory limiter, same loop (us/op)", round(single["in_memory_us_per_acquire_release"], 2)
    )
    controlled = measured["with_controllers"]
    table.add(
        "with AutoThrottle, feedback recorded: round trips per acquire+release",
        round(controlled["evalsha_per_acquire_release"], 2),
    )
    table.add(
        "with AutoThrottle, feedback recorded: acquire+release (PINGs)",
        round(controlled["pings_per_acquire_release"], 2),
    )
    table.add("16 tasks: grants/s", round(measured["concurrent"]["grants_per_s"]))
    result.tables.append(table)
    shared = Table(
        "4 processes, one scope",
        [
            "reserve_ahead (s)",
            "policy (req/s)",
            "achieved (req/s)",
            "error %",
            "max in flight",
            "acquire calls per grant",
        ],
    )
    for entry in measured["multiprocess"]:
        shared.add(
            entry["reserve_ahead"],
            entry["policy_rate"],
            round(entry["achieved_rate"], 3),
            round(entry["rate_error_pct"], 2),
            f"{entry['max_in_flight']} / {entry['concurrency']}",
            round(entry["acquire_calls_per_grant"], 2),
        )
    result.tables.append(shared)
    result.notes += [
        "An acquire is one EVALSHA round trip: the client's own work (building the call, "
        "reading the reply, the limiter around it), the round trip a PING also makes, and "
        "the script's time in Redis (Redis's own time per EVALSHA, against its time per PING).",
        "A release without feedback does not wait for its reply: it goes out in one write "
        "with the next call on its connection (here the next acquire), which reads its "
        "reply, so 'release alone' is the client's work to build it, and the release "
        "script's time in Redis lands in the next acquire's round trip.",
        "The floor is an EVALSHA of a script that only returns, sent as the backend sends "
        "its scripts: what is left of an acquire above it is the limiter and backend in "
        "this process and the two scripts' time in Redis.",
        "With AutoThrottle, the controllers' state comes with the grant and the release "
        "writes what they made of the feedback: two round trips per acquire+release.",
    ]
    first = measured["multiprocess"][0]
    targets = measured["targets"]
    result.targets.append(
        Target(
            "Redis: aggregate rate of 4 processes",
            "within 1 % of the policy",
            f"{first['rate_error_pct']:+.2f} %",
            targets["aggregate rate within 1 % of the policy"],
        )
    )
    result.targets.append(
        Target(
            "Redis: concurrency never exceeded",
            f"<= {first['concurrency']}",
            str(max(entry["max_in_flight"] for entry in measured["multiprocess"])),
            targets["concurrency never exceeded"],
        )
    )
    result.targets.append(
        Target(
            "Redis: round trips per uncontended acquire",
            "1",
            f"{single['acquire_round_trips']:g}",
            targets["one round trip per uncontended acquire"],
        )
    )
    result.targets.append(
        Target(
            "Redis: uncontended acquire in PINGs of the same client",
            "<= 1.5",
            f"{single['pings_per_acquire']:.2f} "
            f"(acquire+release {single['pings_per_acquire_release']:.2f})",
            targets["at most 1.5 PINGs per uncontended acquire"],
        )
    )
    result.data = measured
    return result


def _suites() -> tuple[Any, ...]:
    from ._harness import Suite
    from .redis_scale import run_suite as run_scale_suite

    return (
        Suite("redis", "the Redis backend: per-op cost and 4 processes sharing a scope", run_suite),
        Suite(
            "redis-scale",
            "the Redis backend at scale: 8-32 processes, one node and a 3-node cluster",
            run_scale_suite,
        ),
    )


SUITES = _suites()
