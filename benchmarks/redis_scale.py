"""The Redis backend at scale: many processes, one node against a 3-node cluster.

``python -m benchmarks.redis_scale [--processes 8 16 32] [--duration 4]``
starts its own redis-server on 127.0.0.1 and a 3-node Redis Cluster
(``--cluster-enabled yes``, slots split in three, ``CLUSTER MEET``), runs
worker processes against each (``TASKS`` tasks each), stops every server by
PID and prints one JSON document. Each worker records, per grant, its scope,
its send time (Redis's clock) and its release time (``time.time()``: the
same wall clock on one host). Two runs per deployment and process count:

``one scope``
    concurrency ``PACED_CONCURRENCY``, delay ``PACED_DELAY``, no jitter,
    each request held ``HOLD`` s: the aggregate rate of the send times
    against the policy's ``1 / delay``, the most requests in flight at once
    (from the [send, release] intervals) against the concurrency, and the
    smallest gap between two sends against the delay.
``bound``
    the one scope's concurrency, no delay, each request held ``BOUND_HOLD``
    s: every slot passes from process to process through Redis (a release,
    then another process's acquire), as against nginx's ``limit_conn``. The
    grants per second against what the concurrency allows (``concurrency /
    BOUND_HOLD``), and the acquire calls per grant: a release wakes the
    first two processes in the scope's line of waiting processes (it woke
    one waiter in every process, and all but one found the slot taken:
    about one call per process per grant).
``adaptive``
    one scope with Adaptive (concurrency ``ADAPTIVE_CONCURRENCY``, no
    delay), each request held ``HOLD`` s and answered 200, for
    ``ADAPTIVE_LONGER`` times as long: every release brings feedback for
    the scope's shared controller state, so the processes' writes meet
    each other's. The grants per second over the second half, the release
    calls per grant, and the share of feedback never stored (dropped, or
    still kept in a process after it closed its backend).
``1,000 scopes``
    each a scope of its own (concurrency 1, no delay), each task asking for
    a random one and releasing at once: the grants per second the
    deployment sustains (saturation: every task always asks), the most in
    flight in any scope, Redis's CPU time per grant summed over its nodes
    (``INFO cpu`` before and after) and per node, and the workers' CPU time
    per grant (the client's cost).

Then a worker holding ``concurrency`` leases of one scope is killed
(``SIGKILL``): the time until the scope's leases are free again, against
``KILL_LEASE_TIME``.

On a machine with fewer cores than processes, the processes share the
cores with each other and with Redis: grants per second then measure the
machine as much as Redis, and the CPU time per grant is the figure to
compare.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

#: Tasks per worker process ("many tasks each").
TASKS = 8
#: The one-scope policy: 50 sends per second, 4 at once at most (a delay that
#: a 2-core machine at load 10 to 30 can keep: its timers wake milliseconds late,
#: and a shorter delay measures them).
PACED_CONCURRENCY = 4
PACED_DELAY = 0.02
#: Seconds a request of the one-scope run is held (so concurrency matters too).
HOLD = 0.005
#: Seconds a request of the bound run is held: its concurrency, not a delay,
#: sets the rate (4 / 0.05 s = 80/s, about what nginx's limit_conn 4 before a
#: 100 ms origin lets three processes send in the real-limiter suite).
BOUND_HOLD = 0.05
#: The adaptive run's concurrency (the real-limiter suite's Adaptive policy).
ADAPTIVE_CONCURRENCY = 16
#: How much longer the adaptive run is than the others: Adaptive starts at
#: 4/s and, with 16 or 32 processes, searches up only after 4 to 6 s; its
#: second half is the measure.
ADAPTIVE_LONGER = 8 / 3
#: Scopes of the spread run.
SPREAD_SCOPES = 1000
#: Seconds a round trip may take (the backend's ``command_timeout``): well above
#: the default 1.0, since 32 processes on a 2-core machine wait seconds for a core.
COMMAND_TIMEOUT = 10.0
#: Lease time of the killed worker (s): its leases must be free again within it.
KILL_LEASE_TIME = 2.0
_RANGES = ((0, 5460), (5461, 10922), (10923, 16383))


def _free_port(limit: int = 55000) -> int:
    for _ in range(500):
        port = random.randrange(20000, limit)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


class Servers:
    """redis-server processes on 127.0.0.1: one, or three joined into a cluster."""

    def __init__(self, binary: str, count: int, directory: Path) -> None:
        self.ports = [_free_port() for _ in range(count)]
        self.cluster = count > 1
        self.processes = []
        for port in self.ports:
            options = [
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            if self.cluster:
                options += [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(directory / f"nodes-{port}.conf"),
                ]  # fmt: skip
            self.processes.append(
                subprocess.Popen([binary, *options], stdout=subprocess.DEVNULL, cwd=directory)
            )
        for port in self.ports:
            self._wait(port)
        if self.cluster:
            self._join()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    @staticmethod
    def _wait(port: int) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def _join(self) -> None:
        import redis

        clients = [redis.Redis(port=port) for port in self.ports]
        try:
            for client, (low, high) in zip(clients, _RANGES, strict=True):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
            for port in self.ports[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
            deadline = time.monotonic() + 20
            while not all(
                b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
                and len(client.execute_command("CLUSTER", "SLOTS")) == 3
                for client in clients
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not form")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    def cpu(self) -> list[float]:
        """Each node's CPU time so far (s, ``INFO cpu``: user + system)."""
        import redis

        spent = []
        for port in self.ports:
            client = redis.Redis(port=port)
            try:
                info = client.info("cpu")
            finally:
                client.close()
            spent.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
        return spent

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


# -- the worker process ------------------------------------------------------------------


def _policy(mode: str) -> Any:
    import throttlekit

    if mode in ("paced", "hold"):
        return throttlekit.ScopePolicy(
            concurrency=PACED_CONCURRENCY, delay=PACED_DELAY, slot_delay=0.0, jitter=0.0
        )
    if mode == "bound":
        return throttlekit.ScopePolicy(
            concurrency=PACED_CONCURRENCY, delay=0.0, slot_delay=0.0, jitter=0.0
        )
    if mode == "adaptive":
        return throttlekit.ScopePolicy(
            concurrency=ADAPTIVE_CONCURRENCY, delay=0.0, adaptive=throttlekit.Adaptive()
        )
    return throttlekit.ScopePolicy(concurrency=1, delay=0.0, slot_delay=0.0, jitter=0.0)


async def _work(args: argparse.Namespace) -> None:
    import throttlekit
    from throttlekit.backends.redis import RedisBackend

    backend = RedisBackend.from_url(
        args.url,
        prefix=args.prefix,
        failure="fail_closed",
        cluster=bool(args.cluster),
        lease_time=args.lease_time,
        command_timeout=COMMAND_TIMEOUT,
    )
    limiter = throttlekit.Limiter(default=_policy(args.mode), backend=backend, concurrency=None)
    async with limiter.acquire(scopes="warm-up"):
        pass
    print("ready", flush=True)
    start_at = float(await anyio.to_thread.run_sync(sys.stdin.readline))
    await anyio.sleep(max(0.0, start_at - time.time()))
    if args.mode == "hold":  # hold every slot of a scope until killed
        held = anyio.Event()
        count = 0

        async def hold() -> None:
            nonlocal count
            async with limiter.acquire(scopes="held"):
                count += 1
                if count == PACED_CONCURRENCY:
                    held.set()
                await anyio.sleep(3600)

        async with anyio.create_task_group() as group:
            for _ in range(PACED_CONCURRENCY):
                group.start_soon(hold)
            await held.wait()
            print("holding", flush=True)
    end = start_at + args.duration
    records: list[tuple[int, float, float]] = []
    cpu_before = time.process_time()
    rng = random.Random(os.getpid())

    unavailable = 0

    async def task() -> None:
        nonlocal unavailable
        while True:
            scope = rng.randrange(SPREAD_SCOPES) if args.mode == "spread" else 0
            with anyio.move_on_after(end - time.time()):
                try:
                    async with limiter.acquire(scopes=f"s{scope}") as permit:
                        send = permit._lease.send_at_ms / 1000.0
                        if args.mode != "spread":
                            await anyio.sleep(BOUND_HOLD if args.mode == "bound" else HOLD)
                        if args.mode == "adaptive":
                            permit.record(status=200)
                        records.append((scope, send, time.time()))
                except throttlekit.BackendUnavailable:
                    unavailable += 1  # (a round trip over COMMAND_TIMEOUT)
                continue
            return

    async with anyio.create_task_group() as group:
        for _ in range(TASKS):
            group.start_soon(task)
    cpu = time.process_time() - cpu_before
    await backend.aclose()  # (stores the feedback kept)
    stats = backend.statistics()
    output = {
        "records": records,
        "cpu": cpu,
        "calls": stats.acquire_calls - 1,  # (not the warm-up's)
        "release_calls": stats.release_calls - 1,
        "feedback_lost": stats.feedback_dropped + stats.feedback_kept,
        "unavailable": unavailable,
    }
    print(json.dumps(output), flush=True)


# -- the parent ------------------------------------------------------------------------------


def _worker(
    url: str, cluster: bool, prefix: str, mode: str, duration: float, lease_time: float = 60.0
) -> Any:
    command = [
        sys.executable, "-m", "benchmarks.redis_scale", "--worker",
        "--url", url, "--prefix", prefix, "--mode", mode,
        "--duration", str(duration), "--cluster", str(int(cluster)),
        "--lease-time", str(lease_time),
    ]  # fmt: skip
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=_ROOT
    )


_ROOT = Path(__file__).resolve().parent.parent


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = level = 0
    for _, step in events:
        level += step
        most = max(most, level)
    return most


def _run(servers: Servers, processes: int, mode: str, duration: float) -> dict[str, Any]:
    prefix = f"scale-{mode}-{processes}-{time.time_ns()}"
    workers = [
        _worker(servers.url, servers.cluster, prefix, mode, duration) for _ in range(processes)
    ]
    for worker in workers:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError("a worker did not start")
    start_at = time.time() + 0.5
    cpu_before = servers.cpu()
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(f"{start_at}\n")
        worker.stdin.flush()
    outputs = [json.loads(worker.communicate(timeout=duration + 120)[0]) for worker in workers]
    cpu_after = servers.cpu()
    records = [record for output in outputs for record in output["records"]]
    grants = len(records)
    by_scope: dict[int, list[tuple[float, float]]] = {}
    for scope, send, released in records:
        by_scope.setdefault(scope, []).append((send, released))
    redis_cpu = [after - before for before, after in zip(cpu_before, cpu_after, strict=True)]
    result: dict[str, Any] = {
        "processes": processes,
        "tasks": processes * TASKS,
        "grants": grants,
        "grants_per_s": grants / duration,
        "max_in_flight": max(_max_overlap(spans) for spans in by_scope.values()),
        "redis_cpu_us_per_grant": sum(redis_cpu) / grants * 1e6,
        "redis_cpu_s_per_node": [round(value, 3) for value in redis_cpu],
        "client_cpu_us_per_grant": sum(output["cpu"] for output in outputs) / grants * 1e6,
        "acquire_calls_per_grant": sum(output["calls"] for output in outputs) / grants,
        "unavailable": sum(output["unavailable"] for output in outputs),
    }
    if mode == "spread":
        result["concurrency"] = 1
        result["grants_per_s_per_node"] = grants / duration / len(servers.ports)
    elif mode == "adaptive":
        sends = sorted(send for _, send, _ in records)
        half = sends[0] + (sends[-1] - sends[0]) / 2
        result["second_half_per_s"] = sum(1 for send in sends if send >= half) / (sends[-1] - half)
        result["half_rate_at_s"] = _reached(sends, result["second_half_per_s"] / 2)
        result["concurrency"] = ADAPTIVE_CONCURRENCY
        result["release_calls_per_grant"] = sum(o["release_calls"] for o in outputs) / grants
        result["feedback_lost_share"] = sum(o["feedback_lost"] for o in outputs) / grants
    else:
        result.update(_one_scope(mode, sorted(send for send, _ in by_scope[0])))
    return result


def _one_scope(mode: str, sends: list[float]) -> dict[str, Any]:
    """The one scope's figures (``paced`` or ``bound``) from its send times, in order."""
    achieved = (len(sends) - 1) / (sends[-1] - sends[0])
    if mode == "bound":
        allowed = PACED_CONCURRENCY / BOUND_HOLD
        return {
            "concurrency": PACED_CONCURRENCY,
            "allowed_rate": allowed,
            "achieved_rate": achieved,
            "achieved_share": achieved / allowed,
        }
    policy_rate = 1.0 / PACED_DELAY
    return {
        "concurrency": PACED_CONCURRENCY,
        "policy_rate": policy_rate,
        "achieved_rate": achieved,
        "rate_error_pct": (achieved - policy_rate) / policy_rate * 100.0,
        "min_gap_over_delay": min(b - a for a, b in itertools.pairwise(sends)) / PACED_DELAY,
    }


def _killed(servers: Servers, lease_time: float = KILL_LEASE_TIME) -> dict[str, Any]:
    """A worker holding leases is killed: how long until they are free."""
    import redis

    prefix = f"scale-kill-{time.time_ns()}"
    worker = _worker(servers.url, servers.cluster, prefix, "hold", 0.0, lease_time)
    assert worker.stdout is not None
    assert worker.stdin is not None
    worker.stdout.readline()
    worker.stdin.write(f"{time.time()}\n")
    worker.stdin.flush()
    worker.stdout.readline()  # holding
    killed_at = time.time()
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    key = f"{{{prefix}:held}}:L"
    client: Any = (
        redis.RedisCluster(host="127.0.0.1", port=servers.ports[0])
        if servers.cluster
        else redis.Redis(port=servers.ports[0])
    )
    try:
        while client.zcount(key, f"({time.time() * 1000.0}", "+inf") > 0:
            time.sleep(0.01)
        back_after = time.time() - killed_at
    finally:
        client.close()
    return {
        "leases": PACED_CONCURRENCY,
        "lease_time": lease_time,
        "back_after_s": back_after,
        "within_lease_time": back_after <= lease_time + 0.05,
    }


def run(
    processes: list[int],
    duration: float,
    lease_time: float = KILL_LEASE_TIME,
    *,
    cluster: bool = True,
) -> dict[str, Any]:
    """Every run on one node, then on a 3-node cluster (see the module's docstring)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return {"skipped": "redis-server is not installed"}
    result: dict[str, Any] = {
        "cores": os.cpu_count(),
        "load_average_before": os.getloadavg()[0],
        "tasks_per_process": TASKS,
        "duration_s": duration,
        "runs": [],
    }
    deployments = (("one node", 1), ("3-node cluster", 3))
    for name, count in deployments if cluster else deployments[:1]:
        with tempfile.TemporaryDirectory() as directory:
            servers = Servers(binary, count, Path(directory))
            try:
                for number in processes:
                    for mode in ("paced", "bound", "adaptive", "spread"):
                        longer = ADAPTIVE_LONGER if mode == "adaptive" else 1.0
                        entry = _run(servers, number, mode, duration * longer)
                        entry.update(
                            deployment=name,
                            mode=mode,
                            scopes=SPREAD_SCOPES if mode == "spread" else 1,
                        )
                        result["runs"].append(entry)
                        print(json.dumps(entry), file=sys.stderr, flush=True)
                result.setdefault("killed", {})[name] = _killed(servers, lease_time)
            finally:
                servers.stop()
    result["load_average_after"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_scale", description=__doc__)
    parser.add_argument("--processes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per run")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lease-time", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_work(args))
        return 0
    print(json.dumps(run(args.processes, args.duration), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- as a suite of ``python -m benchmarks`` ------------------------------------------------


def run_suite(config: Any) -> Any:
    """The scale measurements as a :class:`~benchmarks._harness.SuiteResult`."""
    from ._harness import Skip, SuiteResult

    result = SuiteResult(
        name="redis-scale",
        title="Redis backend at scale: one node and a 3-node cluster",
        description=(
            f"8, 16 and 32 worker processes x {TASKS} tasks, started by the benchmark on "
            "127.0.0.1 against a redis-server and a 3-node Redis Cluster it starts: one scope "
            f"paced at concurrency {PACED_CONCURRENCY} and {1 / PACED_DELAY:g} sends/s (each "
            f"request held {HOLD * 1000:g} ms); the same scope bound by its concurrency alone "
            f"(each request held {BOUND_HOLD * 1000:g} ms: every slot passes through Redis from "
            f"process to process); one scope with Adaptive (concurrency "
            f"{ADAPTIVE_CONCURRENCY}, each request held {HOLD * 1000:g} ms and answered 200: "
            f"the processes' feedback writes meet); and {SPREAD_SCOPES:,} scopes of "
            "concurrency 1 asked at random by every task at once (saturation)"
        ),
    )
    # (Quick: a smoke run of every measure, on one node only.)
    measured = run([1], 0.3, 0.3, cluster=False) if config.quick else run([8, 16, 32], 6.0)
    if "skipped" in measured:
        result.skipped.append(Skip("redis-scale", measured["skipped"]))
        return result
    result.tables += _tables(measured)
    result.targets += _targets(measured)
    runs = measured["runs"]
    slow = sum(entry["unavailable"] for entry in runs)
    result.notes += [
        f"Round trips over {COMMAND_TIMEOUT:g} s (the workers' command_timeout; the "
        f"request then fails closed and the task asks again): {slow} in all runs.",
        f"The machine has {measured['cores']} cores, shared by the worker processes, the "
        "Redis servers and whatever else runs (load average "
        f"{measured['load_average_before']:.1f} before, {measured['load_average_after']:.1f} "
        "after): with more processes than cores, grants per second and the achieved rate "
        "measure how often a starved worker gets the CPU back, and the CPU time per grant "
        "(Redis's, summed over its nodes, and the workers') is the figure to compare.",
        "Every send time is Redis's (the grant's reserved send); a request is sent at it, "
        "never before. The smallest gap between sends of the paced scope is measured on "
        "those send times (1.0 = exactly the delay).",
        "On the cluster, the paced scope lives on one node; the 1,000 scopes spread over the "
        "three nodes (Redis CPU per node shows the split).",
        "The bound scope: a release wakes the first two processes in the scope's line of "
        "processes waiting for a slot (pub/sub), and them alone; the first to ask gets the "
        "slot, so about three acquire calls per grant whatever the processes (a call when "
        "full, one per process woken). Woken all at once, every waiting process asked for "
        "the one slot freed: 9, 17 and 33 calls per grant at 8, 16 and 32 processes, with "
        "1,254, 1,915 and 3,322 us of Redis CPU per grant on one node.",
        "The Adaptive scope: feedback not stored is feedback dropped, or still kept in a "
        "process for its next write after it closed its backend. Before feedback was kept, a write "
        "that met a newer state eight times was dropped: eight Adaptive processes against "
        "a fast local server lost 44 % of their feedback so, and sent 2.3 times fewer "
        "requests.",
    ]
    result.data = measured
    return result


def _tables(measured: dict[str, Any]) -> list[Any]:
    """The suite's tables: the paced scope, the bound scope, the 1,000 scopes, the kill."""
    from ._harness import Table

    paced = Table(
        f"one scope (policy: concurrency {PACED_CONCURRENCY}, {1 / PACED_DELAY:g} sends/s)",
        ["deployment", "processes", "achieved (sends/s)", "error %", "max in flight",
         "smallest gap / delay", "acquire calls per grant", "client CPU per grant (us)"],
    )  # fmt: skip
    bound = Table(
        f"one scope bound by its concurrency ({PACED_CONCURRENCY}, each request held "
        f"{BOUND_HOLD * 1000:g} ms: {PACED_CONCURRENCY / BOUND_HOLD:g}/s allowed)",
        ["deployment", "processes", "achieved (sends/s)", "share of allowed", "max in flight",
         "acquire calls per grant", "client CPU per grant (us)", "Redis CPU per grant (us)"],
    )  # fmt: skip
    spread = Table(
        f"{SPREAD_SCOPES:,} scopes at saturation",
        ["deployment", "processes", "grants/s", "grants/s per node", "max in flight",
         "Redis CPU per grant (us)", "Redis CPU per node (s)", "acquire calls per grant",
         "client CPU per grant (us)"],
    )  # fmt: skip
    adaptive = Table(
        f"one scope with Adaptive (concurrency {ADAPTIVE_CONCURRENCY}, each request held "
        f"{HOLD * 1000:g} ms, every answer a 200)",
        ["deployment", "processes", "grants/s, second half", "half that rate reached after",
         "feedback not stored",
         "release calls per grant", "client CPU per grant (us)", "Redis CPU per grant (us)"],
    )  # fmt: skip
    rows = {
        "paced": (paced, _paced_row),
        "bound": (bound, _bound_row),
        "adaptive": (adaptive, _adaptive_row),
        "spread": (spread, _spread_row),
    }
    for entry in measured["runs"]:
        table, row = rows[entry["mode"]]
        table.add(*row(entry))
    killed = Table(
        "a worker killed while it holds every slot of a scope",
        ["deployment", "leases", "lease_time (s)", "free again after (s)"],
    )
    for name, entry in measured["killed"].items():
        killed.add(name, entry["leases"], entry["lease_time"], round(entry["back_after_s"], 3))
    return [paced, bound, adaptive, spread, killed]


def _targets(measured: dict[str, Any]) -> list[Any]:
    """The suite's targets: the paced rate, never over the concurrency, the kill."""
    from ._harness import Target

    runs = measured["runs"]
    targets = []
    worst = max(abs(entry["rate_error_pct"]) for entry in runs if entry["mode"] == "paced")
    targets.append(
        Target(
            "Redis at scale: aggregate rate within 1 % of the policy, one scope",
            "<= 1 %",
            f"worst {worst:.1f} %",
            worst <= 1.0,
        )
    )
    most = max(entry["max_in_flight"] - entry["concurrency"] for entry in runs)
    targets.append(
        Target(
            "Redis at scale: in flight never above the policy", "0 over", f"{most} over", most <= 0
        )
    )
    targets.append(
        Target(
            "Redis at scale: a killed worker's leases back within lease_time",
            "<= lease_time",
            ", ".join(f"{entry['back_after_s']:.2f} s" for entry in measured["killed"].values()),
            all(entry["within_lease_time"] for entry in measured["killed"].values()),
        )
    )
    return targets


def _paced_row(entry: dict[str, Any]) -> list[Any]:
    return [
        entry["deployment"],
        entry["processes"],
        round(entry["achieved_rate"], 1),
        round(entry["rate_error_pct"], 1),
        f"{entry['max_in_flight']} / {entry['concurrency']}",
        round(entry["min_gap_over_delay"], 4),
        round(entry["acquire_calls_per_grant"], 2),
        round(entry["client_cpu_us_per_grant"]),
    ]


def _bound_row(entry: dict[str, Any]) -> list[Any]:
    return [
        entry["deployment"],
        entry["processes"],
        round(entry["achieved_rate"], 1),
        f"{entry['achieved_share']:.1%}",
        f"{entry['max_in_flight']} / {entry['concurrency']}",
        round(entry["acquire_calls_per_grant"], 2),
        round(entry["client_cpu_us_per_grant"]),
        round(entry["redis_cpu_us_per_grant"]),
    ]


def _reached(sends: list[float], rate: float) -> float | None:
    """Seconds from the first send until a second of ``sends`` first held ``rate`` of them."""
    first = 0
    for last, send in enumerate(sends):
        while sends[first] < send - 1.0:
            first += 1
        if last - first + 1 >= rate:
            return send - sends[0]
    return None


def _adaptive_row(entry: dict[str, Any]) -> list[Any]:
    reached = entry.get("half_rate_at_s")
    return [
        entry["deployment"],
        entry["processes"],
        round(entry["second_half_per_s"]),
        "never" if reached is None else f"{reached:.1f} s",
        f"{entry['feedback_lost_share']:.1%}",
        round(entry["release_calls_per_grant"], 2),
        round(entry["client_cpu_us_per_grant"]),
        round(entry["redis_cpu_us_per_grant"]),
    ]


def _spread_row(entry: dict[str, Any]) -> list[Any]:
    return [
        entry["deployment"],
        entry["processes"],
        round(entry["grants_per_s"]),
        round(entry["grants_per_s_per_node"]),
        f"{entry['max_in_flight']} / 1",
        round(entry["redis_cpu_us_per_grant"], 1),
        " / ".join(f"{value:.2f}" for value in entry["redis_cpu_s_per_node"]),
        round(entry["acquire_calls_per_grant"], 2),
        round(entry["client_cpu_us_per_grant"]),
    ]
