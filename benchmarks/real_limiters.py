"""The real-limiter suite: Adaptive (in one process, and in three sharing its scope through
Redis), Backoff alone, an oracle that knows the limit and Scrapy's AutoThrottle against real
nginx, HAProxy, limits-library and express-rate-limit limiters, configured as their documentation
shows and counted from the servers' own access logs.

Rate limiters as deployed, configured as their own documentation shows, each
served by a child process on 127.0.0.1 with its own configuration in a
temporary directory (never a system service; see
:mod:`benchmarks.real_limiters_servers`):

* nginx ``limit_req rate=10r/s`` without burst, ``limit_req_status 429``;
* nginx ``limit_req rate=20r/s burst=10 nodelay``, the default 503;
* nginx ``limit_conn 4`` (503) in front of a 100 ms origin;
* HAProxy's stick-table recipe: ``http-request track-sc0 src`` into a table
  that stores ``http_req_rate(1s)``, ``deny`` 429 with ``Retry-After: 1`` when
  ``sc_http_req_rate(0) gt 10``;
* the ``limits`` library's moving window, 10 per second, with the headers
  slowapi sends on every response (``X-RateLimit-*``, ``Retry-After: 1``);
* the same moving window with the headers Flask-Limiter sends: its
  ``X-RateLimit-Reset`` an integer epoch (``int(reset + 1)``), so the stated
  reset is one to two seconds after the real one, by a share that changes
  from window to window;
* the ``limits`` library's fixed window, 60 per minute, opening at the first
  request, with the headers Flask-Limiter sends on every response
  (``Retry-After`` = the seconds left in the window);
* express-rate-limit (Node's most used limiter) with its defaults but for
  the numbers, ``rateLimit({windowMs: 5000, limit: 25})``: a fixed window
  from the first request, ``X-RateLimit-*`` on every response with the
  reset rounded up to a whole epoch second, ``Retry-After`` on refusals only.

Side by side, each client its own process against its own instance of each
limiter (the limiters key by client address, and every client here is
127.0.0.1): **Adaptive** (``ScopePolicy(concurrency=16, delay=0, slot_delay=0,
adaptive=Adaptive())`` behind the httpx transport, 64 senders), **Backoff**
alone (``concurrency=16, delay=0``), an **oracle** that sends evenly at the
known limit (or keeps the allowed number in flight), **Scrapy's
AutoThrottle** (a real Scrapy crawl) and **Adaptive x3 via Redis**: the
Adaptive client's policy in three processes, the 64 senders split among
them, one scope shared through a redis-server the suite starts
(:class:`~throttlekit.backends.redis.RedisBackend`), which should get what
one process gets. Every number is counted from the
servers' own access logs: the share of the allowed rate served over the
second half, the same against what the oracle got, the share refused over the
run, the time to 90 % of the allowed rate and the requests sent inside a wait
announced on a refusal.

Runs last 40 s, one limiter after the other with the five clients at once;
the fixed minute runs 150 s alongside them. ``--quick`` sends every client to
every limiter at once for a few seconds, to show the machinery works. nginx,
HAProxy and Node come from the system's packages, express and
express-rate-limit from npm: the suite installs them when it can and
otherwise says what it skipped.

Usage: ``python -m benchmarks.real_limiters [--quick] [--output FILE] [--plots DIR]
[--limiters NAME,...] [--clients NAME,...] [--keep DIR]``;
``python -m benchmarks --only real-limiters --output benchmarks/results/latest.json``
then ``python -m benchmarks.report`` puts it on the results page.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ._harness import RunConfig, Skip, Suite, SuiteResult, Table, Target
from .quality import CEILING, SCRAPY_CEILING, Client, adaptive_available, inside_waits
from .quality_sites import Record
from .real_limiters_servers import Instance, RealLimiter, Servers, ensure_servers, free_port

__all__ = [
    "CLIENTS",
    "LIMITERS",
    "SUITES",
    "main",
    "measure",
    "redis_server",
    "run_client",
    "run_real_limiters",
]

REPO = Path(__file__).resolve().parent.parent
#: Seconds of a run, of the fixed-minute run (two and a half windows) and of a quick run.
RUN_SECONDS = 40.0
LONG_RUN_SECONDS = 150.0
QUICK_SECONDS = 2.0
#: Seconds a client keeps crawling after its budget, so the counted span is whole
#: (a quick run counts whatever it got).
MARGIN = 2.0
QUICK_MARGIN = 0.5
#: Senders of the httpx clients.
WORKERS = 64
#: "Reached": a trailing window (5 s, or the limiter's own window) with this share served.
REACH_SHARE = 0.90
REACH_STEP = 0.25
#: The issue's targets, judged on Adaptive (in one process and shared by three).
TARGET_ORACLE_SHARE = 0.95
TARGET_REFUSED = 0.02
TARGETED = ("Adaptive", "Adaptive x3 via Redis")
#: Seconds the processes of a shared client may take to start before they are given up.
READY_TIMEOUT = 120.0

LIMITERS: tuple[RealLimiter, ...] = (
    RealLimiter(
        "nginx limit_req",
        "limit_req",
        "limit_req rate=10r/s (no burst), limit_req_status 429",
        10.0,
        {"rate": 10.0},
        RUN_SECONDS,
    ),
    RealLimiter(
        "nginx burst nodelay",
        "burst",
        "limit_req rate=20r/s burst=10 nodelay, the default 503",
        20.0,
        {"rate": 20.0},
        RUN_SECONDS,
    ),
    RealLimiter(
        "nginx limit_conn",
        "limit_conn",
        "limit_conn 4 (503) before a 100 ms origin",
        40.0,
        {"workers": 4},
        RUN_SECONDS,
    ),
    RealLimiter(
        "HAProxy",
        "haproxy",
        "stick table http_req_rate(1s), deny 429 + Retry-After: 1 when above 10",
        10.0,
        {"rate": 10.0},
        RUN_SECONDS,
    ),
    RealLimiter(
        "limits moving window",
        "moving",
        "10/second, slowapi's X-RateLimit-* and Retry-After: 1 on every response",
        10.0,
        {"rate": 10.0},
        RUN_SECONDS,
    ),
    RealLimiter(
        "Flask-Limiter moving window",
        "moving-int",
        "10/second, Flask-Limiter's X-RateLimit-* (an integer epoch reset) and Retry-After on "
        "every response",
        10.0,
        {"rate": 10.0},
        RUN_SECONDS,
    ),
    RealLimiter(
        "limits fixed minute",
        "fixed",
        "60/minute from the first request, Flask-Limiter's X-RateLimit-* and "
        "Retry-After (seconds left) on every response",
        1.0,
        {"rate": 1.0},
        LONG_RUN_SECONDS,
        reach_window=60.0,
        reach_by=120.0,
    ),
    RealLimiter(
        "express-rate-limit",
        "express",
        "rateLimit({windowMs: 5000, limit: 25}), its defaults otherwise: a window from the "
        "first request, X-RateLimit-* (the reset rounded up to a whole epoch second) on every "
        "response, Retry-After on refusals only",
        5.0,
        {"rate": 5.0},
        RUN_SECONDS,
    ),
)

CLIENTS: tuple[Client, ...] = (
    Client(
        "Adaptive",
        "httpx",
        "adaptive",
        "httpx.AsyncClient over ThrottledTransport, ScopePolicy(concurrency=16, delay=0, "
        "slot_delay=0, adaptive=Adaptive()); 64 tasks sending; no retries",
        policy={**CEILING, "adaptive": {}},
        needs=("httpx",),
    ),
    Client(
        "Backoff",
        "httpx",
        "backoff",
        "the same without Adaptive: ScopePolicy(concurrency=16, delay=0, slot_delay=0), "
        "its default Backoff on",
        policy=dict(CEILING),
        needs=("httpx",),
    ),
    Client(
        "oracle",
        "paced",
        "oracle",
        "a plain httpx.AsyncClient that knows the limit: evenly at the allowed rate "
        "(limit_conn: 4 in flight); no throttlekit, no retries",
        needs=("httpx",),
    ),
    Client(
        "Scrapy AutoThrottle",
        "scrapy",
        "scrapy",
        "Scrapy's AutoThrottle extension with its defaults; Scrapy's retries on (as by default)",
        settings={**SCRAPY_CEILING, "AUTOTHROTTLE_ENABLED": True},
        needs=("scrapy",),
    ),
    Client(
        "Adaptive x3 via Redis",
        "httpx",
        "adaptive",
        "the Adaptive client's policy in three processes started together, the 64 tasks "
        "split among them (22 + 21 + 21), its scope shared through one redis-server "
        "(RedisBackend, failing closed); each process's own global cap is 16",
        policy={**CEILING, "adaptive": {}},
        needs=("httpx", "redis"),
        processes=3,
    ),
)


# -- measuring ---------------------------------------------------------------------------


def reach_time(served: Sequence[float], limiter: RealLimiter, budget: float) -> float | None:
    """Seconds until a trailing ``reach_window`` first held 90 % of the allowed rate."""
    ordered = sorted(served)
    window = limiter.reach_window
    needed = REACH_SHARE * limiter.rate * window
    t = window
    while t <= budget + 1e-9:
        if bisect.bisect_left(ordered, t) - bisect.bisect_left(ordered, t - window) >= needed:
            return t
        t += REACH_STEP
    return None


def measure(records: Sequence[Record], limiter: RealLimiter, budget: float) -> dict[str, Any]:
    """The numbers of one (limiter, client) run from the server's records.

    Counted over the requests that arrived in ``[t0, t0 + budget)``, ``t0``
    the first arrival: 2xx per second and as a share of the allowed rate over
    the second half, the share refused (every other status), requests inside
    a wait announced on a refusal, the time to 90 % and the 2xx per second.
    """
    if not records:
        return {
            "requests": 0,
            "ok": 0,
            "refused": 0,
            "share_second_half": None,
            "refused_share": None,
            "inside_waits": 0,
            "reach_s": None,
            "series": [],
        }
    t0 = min(arrived for arrived, *_ in records)
    end = t0 + budget
    counted = [record for record in records if t0 <= record[0] < end]
    served = sorted(arrived - t0 for arrived, _, status, _ in counted if 200 <= status < 300)
    ok_second = sum(1 for t in served if t >= budget / 2)
    series = [0.0] * max(1, math.ceil(budget - 1e-9))
    for t in served:
        series[min(len(series) - 1, int(t))] += 1
    refused = len(counted) - len(served)
    return {
        "requests": len(counted),
        "ok": len(served),
        "refused": refused,
        "share_second_half": ok_second / (limiter.rate * budget / 2),
        "refused_share": refused / len(counted) if counted else None,
        "inside_waits": inside_waits(records, start=t0, end=end),
        "reach_s": reach_time(served, limiter, budget),
        "series": series,
    }


# -- running -----------------------------------------------------------------------------


def _plan(
    client: Client, instances: Sequence[Instance], budget: float, workers: int = WORKERS
) -> dict[str, Any]:
    return {
        "client": client.kind,
        "settings": client.settings,
        "policy": client.policy,
        "sites": [
            {"name": i.limiter.slug, "url": i.url, "count": 1_000_000, **i.limiter.oracle}
            for i in instances
        ],
        "budget": budget,
        "margin": QUICK_MARGIN if budget <= QUICK_SECONDS else MARGIN,
        "workers": workers,
        "sample_interval": 0.5,
    }


@dataclass
class _Started:
    """One client process: what it crawls, where its files are, and its start barrier."""

    process: subprocess.Popen[bytes]
    workdir: Path
    instances: Sequence[Instance]
    ready: Path | None = None
    go: Path | None = None


def _spawn(plan: dict[str, Any], workdir: Path) -> subprocess.Popen[bytes]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "benchmarks.quality_clients", str(workdir / "plan.json")]
    with (workdir / "log.txt").open("wb") as log:
        return subprocess.Popen(
            [*command, str(workdir / "result.json")],
            cwd=workdir,
            env={**os.environ, "PYTHONPATH": path},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _start_client(
    client: Client,
    instances: Sequence[Instance],
    budget: float,
    workdir: Path,
    redis_url: str | None = None,
) -> list[_Started]:
    """Start the process(es) of one client crawling ``instances``.

    A client of several processes shares its scopes through ``redis_url``
    (under a prefix of its own), its senders split among them; they start
    crawling together once :func:`_release` sees them all ready.
    """
    if client.processes == 1:
        plan = _plan(client, instances, budget)
        if client.family == "adaptive":
            plan["decisions"] = str(workdir / "decisions.log")
        return [_Started(_spawn(plan, workdir), workdir, instances)]
    if redis_url is None:
        raise RuntimeError(f"{client.name} needs a redis-server")
    go = workdir / "go"
    started = []
    for part in range(client.processes):
        workers = WORKERS // client.processes + (part < WORKERS % client.processes)
        plan = _plan(client, instances, budget, workers)
        own = workdir / f"p{part}"
        plan.update(
            redis={"url": redis_url, "prefix": f"real-limiters-{workdir.name}"},
            ready=str(own / "ready"),
            go=str(go),
            decisions=str(own / "decisions.log"),
        )
        started.append(_Started(_spawn(plan, own), own, instances, own / "ready", go))
    return started


def _release(started: Sequence[_Started]) -> None:
    """Let the processes of each shared client start together, once all of them are ready."""
    deadline = time.monotonic() + READY_TIMEOUT
    for one in started:
        while one.ready is not None and not one.ready.exists():
            if one.process.poll() is not None or time.monotonic() > deadline:
                break  # its log says why: _wait_clients raises with it
            time.sleep(0.02)
    for go in {one.go for one in started if one.go is not None}:
        go.touch()


def _view(result: dict[str, Any], instance: Instance) -> dict[str, Any]:
    """The client's view of one instance: final throttling state, one sample a second."""
    scope = f"127.0.0.1:{instance.port}"
    start = result.get("started") or 0.0
    samples: list[list[Any]] = []
    for sample in result.get("samples") or []:
        t = sample["t"] - start
        if sample.get("scope") in (scope, "127.0.0.1") and (not samples or t - samples[-1][0] >= 1):
            samples.append(
                [
                    round(t, 2),
                    round(sample["delay"], 4),
                    sample.get("concurrency"),
                    sample.get("in_flight"),
                    sample.get("reason"),
                ]
            )
    view = {
        "final": (result.get("scopes") or {}).get(scope),
        "samples": samples,
        "counts": result.get("counts"),
    }
    if "redis" in result:  # the Redis backend's round trips (a shared client)
        view["redis"] = result["redis"]
    return view


def _wait_clients(started: Sequence[_Started], budget: float) -> None:
    """Wait for the processes; each instance gets its client's view (per process if several)."""
    views: dict[int, list[dict[str, Any]]] = {}
    for one in started:
        try:
            code = one.process.wait(timeout=budget + 120)
        except subprocess.TimeoutExpired:
            one.process.kill()
            one.process.wait()
            code = None
        output = one.workdir / "result.json"
        if code != 0 or not output.exists():
            log = (one.workdir / "log.txt").read_text(encoding="utf-8", errors="replace")
            raise RuntimeError(f"client in {one.workdir} exited with {code}: {log[-3000:]}")
        result = json.loads(output.read_text(encoding="utf-8"))
        for instance in one.instances:
            views.setdefault(id(instance), []).append(_view(result, instance))
    for one in started:
        for instance in one.instances:
            seen = views[id(instance)]
            instance.view = seen[0] if len(seen) == 1 else {"processes": seen}


def _stop(started: Sequence[_Started]) -> None:
    """Stop, by PID, the client processes still running (after a failure)."""
    for one in started:
        if one.process.poll() is None:
            one.process.kill()
            one.process.wait()


def run_client(
    client: Client,
    instances: Sequence[Instance],
    budget: float,
    workdir: Path,
    redis_url: str | None = None,
) -> None:
    """Run ``client`` (all its processes, started together) against ``instances`` for
    ``budget`` seconds; each instance gets the client's view (per process if several).

    A client of several processes needs ``redis_url`` (:func:`redis_server`).
    """
    started = _start_client(client, instances, budget, workdir, redis_url)
    try:
        _release(started)
        _wait_clients(started, budget)
    finally:
        _stop(started)


def _run_full(
    instances: dict[tuple[str, str], Instance],
    limiters: Sequence[RealLimiter],
    clients: Sequence[Client],
    workdir: Path,
    redis_url: str | None,
) -> None:
    """Each limiter with the clients at once, one after the other; the long ones alongside."""
    long = [limiter for limiter in limiters if limiter.seconds > RUN_SECONDS]
    everything: list[_Started] = []

    def start(limiter: RealLimiter) -> list[_Started]:
        group = [
            one
            for n, c in enumerate(clients)
            for one in _start_client(
                c,
                [instances[limiter.name, c.name]],
                limiter.seconds,
                workdir / f"{limiter.slug}-{n}",
                redis_url,
            )
        ]
        everything.extend(group)
        _release(group)
        return group

    try:
        background = [one for limiter in long for one in start(limiter)]
        for limiter in limiters:
            if limiter not in long:
                _wait_clients(start(limiter), limiter.seconds)
        _wait_clients(background, LONG_RUN_SECONDS)
    finally:
        _stop(everything)


def _run_quick(
    instances: dict[tuple[str, str], Instance],
    clients: Sequence[Client],
    workdir: Path,
    redis_url: str | None,
) -> None:
    """Each client one process (or its own), crawling all of its instances at once, briefly."""
    started = [
        one
        for n, client in enumerate(clients)
        for one in _start_client(
            client,
            [i for (_, name), i in instances.items() if name == client.name],
            QUICK_SECONDS,
            workdir / f"quick-{n}",
            redis_url,
        )
    ]
    try:
        _release(started)
        _wait_clients(started, QUICK_SECONDS)
    finally:
        _stop(started)


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A redis-server on a free port of 127.0.0.1 for the run; its URL. Stopped by PID."""
    from .redis_scale import Servers as RedisServers

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    server = RedisServers(binary, 1, directory)
    try:
        yield server.url
    finally:
        server.stop()


def _select(names: Sequence[str] | None, known: Sequence[Any], what: str) -> list[Any]:
    """The items of ``known`` named (by name or slug) in ``names``; all of them without."""
    if not names:
        return list(known)
    wanted = {name.strip().lower() for name in names}
    chosen = [
        item
        for item in known
        if {item.name.lower(), getattr(item, "slug", item.name.lower())} & wanted
    ]
    unknown = (
        wanted
        - {item.name.lower() for item in chosen}
        - {getattr(item, "slug", "") for item in chosen}
    )
    if unknown:
        choices = ", ".join(repr(item.name) for item in known)
        raise ValueError(f"unknown {what} {sorted(unknown)}; choose among {choices}")
    return chosen


def _available(
    limiters: Sequence[RealLimiter], clients: Sequence[Client]
) -> tuple[list[RealLimiter], list[Client], list[Skip]]:
    reasons = ensure_servers({limiter.server for limiter in limiters})
    skipped: list[Skip] = []
    usable = []
    for limiter in limiters:
        reason = reasons.get(limiter.server)
        if reason is None:
            usable.append(limiter)
        else:
            skipped.append(Skip(limiter.name, reason))
    ready = []
    for client in clients:
        missing = [name for name in client.needs if find_spec(name) is None]
        if client.processes > 1 and shutil.which("redis-server") is None:
            missing.append("redis-server")
        if missing:
            skipped.append(Skip(client.name, f"not installed: {', '.join(missing)}"))
        elif client.family == "adaptive" and not adaptive_available():
            skipped.append(Skip(client.name, "this checkout has no throttlekit.Adaptive"))
        else:
            ready.append(client)
    return usable, ready, skipped


def run_real_limiters(
    config: RunConfig,
    *,
    limiters: Sequence[str] | None = None,
    clients: Sequence[str] | None = None,
    keep: Path | None = None,
) -> SuiteResult:
    """Run the suite (see the module doc) and build its tables, targets and figures.

    ``limiters`` and ``clients`` name (or slug) the ones to run, all without;
    the oracle always runs, as the others are measured against it. ``keep``:
    a directory to keep the run's files in (configurations, access logs, each
    client process's log, plan, result and Adaptive's decisions) instead of a
    temporary one.
    """
    started = time.monotonic()
    chosen = _select(clients, CLIENTS, "clients")
    if clients and not any(client.name == "oracle" for client in chosen):
        chosen.insert(0, next(client for client in CLIENTS if client.name == "oracle"))
    usable, ready, skipped = _available(_select(limiters, LIMITERS, "limiters"), chosen)
    load = os.getloadavg()
    cases: dict[str, dict[str, dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            workdir = keep
        else:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="throttlekit-real-"))
            )
        instances = {
            (limiter.name, client.name): Instance(
                limiter, client.name, free_port(), workdir / f"{limiter.slug}-{n}.log"
            )
            for limiter in usable
            for n, client in enumerate(ready)
        }
        if instances:
            redis_url = None
            if any(client.processes > 1 for client in ready):
                redis_url = stack.enter_context(redis_server(workdir / "redis"))
            with Servers(list(instances.values()), workdir / "servers"):
                if config.quick:
                    _run_quick(instances, ready, workdir, redis_url)
                else:
                    _run_full(instances, usable, ready, workdir, redis_url)
        for (name, client), instance in instances.items():
            budget = QUICK_SECONDS if config.quick else instance.limiter.seconds
            case = measure(instance.records, instance.limiter, budget)
            cases.setdefault(name, {})[client] = {**case, "client": instance.view}
    return _result(config, usable, ready, skipped, cases, load, time.monotonic() - started)


# -- reporting ---------------------------------------------------------------------------


def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value * 100:.{digits}f} %"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:g} s"


def _oracle_share(case: dict[str, Any], oracle: dict[str, Any] | None) -> float | None:
    mine, best = case.get("share_second_half"), (oracle or {}).get("share_second_half")
    return None if mine is None or not best else mine / best


def _target(
    limiter: RealLimiter, client: str, case: dict[str, Any], oracle: dict[str, Any] | None
) -> Target:
    ratio = _oracle_share(case, oracle)
    refused, reach = case.get("refused_share"), case.get("reach_s")
    checks = [
        (f"{_pct(ratio)} of the oracle", ratio is not None and ratio >= TARGET_ORACLE_SHARE),
        (f"{_pct(refused)} refused", refused is not None and refused < TARGET_REFUSED),
        (f"90 % at {_seconds(reach)}", reach is not None and reach <= limiter.reach_by),
        (f"{case.get('inside_waits', 0)} inside announced waits", not case.get("inside_waits")),
    ]
    missed = [text for text, passed in checks if not passed]
    measured = "; ".join(text for text, _ in checks)
    if missed:
        measured += " -- missed: " + "; ".join(missed)
    return Target(
        f"{limiter.name}: {client}",
        f">= 95 % of the oracle over the second half, < 2 % refused, 90 % within "
        f"{limiter.reach_by:g} s, none inside an announced wait",
        measured,
        not missed,
    )


def _table(limiters: Sequence[RealLimiter], cases: dict[str, dict[str, dict[str, Any]]]) -> Table:
    table = Table(
        "Real limiters: share of the allowed rate (second half), of the oracle, refused, "
        "time to 90 %, requests inside announced waits",
        [
            "limiter",
            "client",
            "allowed (2nd half)",
            "of oracle",
            "refused",
            "90 % at",
            "inside waits",
            "requests",
        ],
    )
    for limiter in limiters:
        per_client = cases.get(limiter.name, {})
        for client, case in per_client.items():
            table.add(
                limiter.name,
                client,
                _pct(case.get("share_second_half")),
                _pct(_oracle_share(case, per_client.get("oracle"))),
                _pct(case.get("refused_share")),
                _seconds(case.get("reach_s")),
                case.get("inside_waits", 0),
                case.get("requests", 0),
            )
    return table


def _figures(
    limiters: Sequence[RealLimiter], cases: dict[str, dict[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    figures = []
    for limiter in limiters:
        per_client = cases.get(limiter.name, {})
        if not per_client:
            continue
        lines = [
            {
                "label": client,
                "x": [i + 0.5 for i in range(len(case["series"]))],
                "y": case["series"],
            }
            for client, case in per_client.items()
        ]
        figures.append(
            {
                "image": f"_static/benchmarks/real-{limiter.slug}.png",
                "alt": f"The 200 responses per second of each client against {limiter.name}, "
                "with the allowed rate as a line.",
                "caption": f"{limiter.name} ({limiter.summary}): 2xx responses per second from "
                "the server's access log, per client; the line is the allowed rate.",
                "panels": [
                    {
                        "title": f"{limiter.name}: {limiter.summary}",
                        "xlabel": "seconds since the first request",
                        "ylabel": "2xx responses per second",
                        "lines": lines,
                        "hlines": [{"y": limiter.rate, "label": "allowed"}],
                    }
                ],
            }
        )
    return figures


def _result(
    config: RunConfig,
    limiters: Sequence[RealLimiter],
    clients: Sequence[Client],
    skipped: list[Skip],
    cases: dict[str, dict[str, dict[str, Any]]],
    load: tuple[float, float, float],
    seconds: float,
) -> SuiteResult:
    targets = [
        _target(limiter, client, per_client[client], per_client.get("oracle"))
        for limiter in limiters
        for per_client in [cases.get(limiter.name, {})]
        for client in TARGETED
        if client in per_client and not config.quick
    ]
    notes = [
        f"Load average when the suite started: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        f"on {os.cpu_count()} cores; the clients, the servers and whatever else runs on the "
        "machine share them, so a client's pace carries the machine's scheduling noise.",
        "Counted from the servers' own access logs (nginx: $msec and $request_time; HAProxy: "
        "the log date in ms and %Ta; the Python sites: their own log), over the requests that "
        "arrived within the run from the first one. HAProxy's deny sends Retry-After: 1; the "
        "Python sites log the Retry-After they sent; nginx announces no wait.",
        "The allowed rate of limit_conn is its limit over the origin's latency (4 / 0.1 s); "
        "the proxy and the client's own overhead keep even the oracle below it, so the "
        "targets compare Adaptive with what the oracle got in the same run.",
        *(f"{client.name}: {client.summary}" for client in clients),
    ]
    if config.quick:
        notes.insert(
            0,
            "A quick run: every client against every limiter at once for "
            f"{QUICK_SECONDS:g} s; the numbers mean nothing.",
        )
    configurations = Table(
        "The limiters as configured (each client gets its own instance)",
        ["limiter", "configuration", "allowed rate", "run"],
    )
    for limiter in limiters:
        configurations.add(
            limiter.name, limiter.summary, f"{limiter.rate:g}/s", f"{limiter.seconds:g} s"
        )
    return SuiteResult(
        name="real-limiters",
        title="Real rate limiters: nginx, HAProxy and the limits library",
        description=(__doc__ or "").split("\n\n")[0],
        tables=[_table(limiters, cases), configurations],
        targets=targets,
        skipped=skipped,
        notes=notes,
        data={
            "cases": cases,
            "figures": _figures(limiters, cases),
            "limiters": [limiter.name for limiter in limiters],
        },
        seconds=seconds,
    )


def run_virtual_suite(*, backend: str = "asyncio") -> SuiteResult:
    """The suite against the limiters' models in virtual time (:mod:`.real_limiters_virtual`)."""
    from .real_limiters_virtual import run_virtual

    started = time.monotonic()
    with_adaptive = adaptive_available()
    runs = run_virtual(LIMITERS, backend=backend, with_adaptive=with_adaptive)
    cases = {
        name: {
            client: measure(records, limiter, limiter.seconds)
            for client, records in runs[name].items()
        }
        for limiter in LIMITERS
        for name in [limiter.name]
    }
    clients = [c for c in CLIENTS if c.kind != "scrapy" and (with_adaptive or c.name != "Adaptive")]
    result = _result(
        RunConfig(), LIMITERS, clients, [], cases, os.getloadavg(), time.monotonic() - started
    )
    result.name, result.title = "real-limiters-virtual", result.title + " (virtual time)"
    result.notes = [
        f"Virtual time on {backend}: the models of throttlekit.testing, a backlog of requests "
        "queued at the start, the oracle a fixed delay of one interval 0.1 % over the limit's "
        "(limit_conn: 4 in flight) without Backoff; no machine noise, no Scrapy.",
    ]
    for figure in result.data["figures"]:
        figure["image"] = figure["image"].replace("real-", "real-virtual-")
    return result


def markdown(result: SuiteResult) -> str:
    """The suite's tables and targets as Markdown."""
    lines: list[str] = []
    for table in result.tables:
        lines += [
            f"**{table.title}**",
            "",
            "| " + " | ".join(table.columns) + " |",
            "|" + "---|" * len(table.columns),
        ]
        lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in table.rows]
        lines.append("")
    lines += [f"- {t.verdict} {t.name}: {t.measured}" for t in result.targets]
    lines += [f"- skipped {s.name}: {s.reason}" for s in result.skipped]
    lines += [f"- {note}" for note in result.notes]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.real_limiters``: run the suite, print Markdown, write JSON/plots."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.real_limiters",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds, all at once")
    parser.add_argument("--output", type=Path, help="write this suite's JSON here")
    parser.add_argument(
        "--plots", type=Path, metavar="DIR", help="draw the rate-over-time plots (PNG) under DIR"
    )
    parser.add_argument(
        "--virtual",
        action="store_true",
        help="run the clients against throttlekit.testing's models of the same limiters, "
        "in virtual time (seconds, deterministic; no servers, no Scrapy)",
    )
    parser.add_argument(
        "--backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="the event loop of a --virtual run",
    )
    parser.add_argument(
        "--limiters",
        type=lambda text: text.split(","),
        metavar="NAME,...",
        help="run only these limiters (names or slugs): "
        + ", ".join(limiter.slug for limiter in LIMITERS),
    )
    parser.add_argument(
        "--clients",
        type=lambda text: text.split(","),
        metavar="NAME,...",
        help="run only these clients (names; the oracle always runs): "
        + ", ".join(repr(c.name) for c in CLIENTS),
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep the run's files (logs, decisions) in DIR"
    )
    args = parser.parse_args(argv)
    if args.virtual:
        result = run_virtual_suite(backend=args.backend)
    else:
        result = run_real_limiters(
            RunConfig.make(quick=args.quick),
            limiters=args.limiters,
            clients=args.clients,
            keep=args.keep,
        )
    print(markdown(result))
    if args.output is not None:
        args.output.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    if args.plots is not None:
        from .figures import draw_figures

        draw_figures({"suites": {result.name: result.to_json()}}, args.plots)
    return 0


SUITES = (
    Suite(
        "real-limiters",
        "Adaptive, Backoff, an oracle and Scrapy AutoThrottle against nginx, HAProxy and limits",
        run_real_limiters,
    ),
)


if __name__ == "__main__":
    sys.exit(main())
