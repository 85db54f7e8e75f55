"""The real-limiter suite in virtual time: the same limiters as :mod:`throttlekit.testing` models.

Each limiter of :data:`benchmarks.real_limiters.LIMITERS` has a model that
follows its source's arithmetic (:class:`~throttlekit.testing.NginxLimitReq`,
:class:`~throttlekit.testing.NginxLimitConn`,
:class:`~throttlekit.testing.HAProxyRate`,
:class:`~throttlekit.testing.FrameworkLimiter`); the clients are the same
policies (Adaptive, Backoff alone, and an oracle: a fixed delay of one
interval, 0.1 % over the limit's, or the allowed number in flight, without
Backoff) run by
:func:`~throttlekit.testing.simulate` on a backlog of requests, and the
numbers are counted as the real suite counts them, from what the server saw.
Free of the machine's scheduling noise, a whole run takes seconds: the
instrument to tune an algorithm with before confirming on the real servers.
It is deterministic but for the framework limiters' epoch resets, which are
stated on the wall clock and rounded down (as Flask-Limiter does), so where
the rounding falls varies from run to run.

Usage: ``python -m benchmarks.real_limiters --virtual [--backend trio]``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from throttlekit import ScopePolicy
from throttlekit.testing import (
    FrameworkLimiter,
    HAProxyRate,
    NginxLimitConn,
    NginxLimitReq,
    ServerModel,
    Trace,
    burst,
    simulate,
)

from .quality_sites import Record
from .real_limiters_servers import ORIGIN_DELAY, RealLimiter

__all__ = ["MODELS", "policies", "records_of", "run_virtual"]

#: Latency of an accepted request at the static-file / ``http-request return`` servers.
STATIC_LATENCY = 0.001
#: The oracle's interval over the limit's: exactly at the limit, HAProxy's counter (which
#: counts the request itself) and a moving window's inclusive edge refuse evenly paced
#: requests; the real oracle's timing noise puts it that far below the limit anyway.
ORACLE_SLACK = 1.001
#: Limiters counted by nginx's ``limit_req``, in whole milliseconds: paced at
#: 333.7 ms, ``rate=3r/s`` refuses the sends 333 ms apart (one in three), so
#: their oracle's interval is the whole milliseconds the rate needs, and
#: this much more (a send time's float error never loses nginx a millisecond).
NGINX_KINDS = ("limit_req", "burst")
NGINX_SLACK_MS = 0.02
#: The backlog of requests queued at the start, per allowed request of the run.
BACKLOG_FACTOR = 3

MODELS: dict[str, ServerModel] = {
    "limit_req": NginxLimitReq(rate=10, status=429, latency=STATIC_LATENCY),
    "burst": NginxLimitReq(rate=20, burst=10, nodelay=True, latency=STATIC_LATENCY),
    "limit_conn": NginxLimitConn(limit=4, latency=ORIGIN_DELAY),
    "haproxy": HAProxyRate(limit=10, latency=STATIC_LATENCY),
    "moving": FrameworkLimiter(limit=10, window=1.0, reset_format="float", latency=STATIC_LATENCY),
    "moving-int": FrameworkLimiter(limit=10, window=1.0, latency=STATIC_LATENCY),
    "fixed": FrameworkLimiter(limit=60, window=60.0, strategy="fixed", latency=STATIC_LATENCY),
    # express-rate-limit's reset is Math.ceil of the window's end: the model's int(reset + 1)
    # but when the end falls on a whole second; its Retry-After comes with refusals only.
    "express": FrameworkLimiter(
        limit=25,
        window=5.0,
        strategy="fixed",
        retry_after_on_every_response=False,
        latency=STATIC_LATENCY,
    ),
}


def policies(limiter: RealLimiter, *, with_adaptive: bool) -> dict[str, ScopePolicy]:
    """The clients' policies for ``limiter``: Adaptive (when available), Backoff, oracle."""
    from throttlekit import Adaptive

    ceiling: dict[str, Any] = {"concurrency": 16, "delay": 0.0, "slot_delay": 0.0}
    found = {"Backoff": ScopePolicy(**ceiling)}
    if with_adaptive:
        found = {"Adaptive": ScopePolicy(**ceiling, adaptive=Adaptive()), **found}
    rate = limiter.oracle.get("rate")
    if rate is None:
        oracle = ScopePolicy(
            concurrency=int(limiter.oracle["workers"]), delay=0.0, slot_delay=0.0, backoff=None
        )
    else:
        interval = ORACLE_SLACK / rate
        if limiter.kind in NGINX_KINDS:
            interval = (math.ceil(1000 / rate - 1e-9) + NGINX_SLACK_MS) / 1000
        oracle = ScopePolicy(concurrency=16, delay=interval, slot_delay=0.0, backoff=None)
    return {**found, "oracle": oracle}


def _wait(headers: Any) -> float:
    try:
        return float(headers.get("Retry-After", 0.0))
    except ValueError:
        return 0.0


def records_of(trace: Trace) -> list[Record]:
    """What the server saw: ``(sent, answered, status, announced wait of a refusal)``."""
    return [
        (
            record.sent,
            record.responded,
            record.status,
            _wait(record.headers) if record.status >= 400 else 0.0,
        )
        for record in trace.requests
        if record.sent is not None and record.responded is not None and record.status is not None
    ]


def run_virtual(
    limiters: Sequence[RealLimiter],
    *,
    backend: str = "asyncio",
    with_adaptive: bool = True,
    clients: Collection[str] | None = None,
    models: Mapping[str, ServerModel] | None = None,
) -> dict[str, dict[str, list[Record]]]:
    """``{limiter: {client: records}}`` of one virtual run of each limiter and client.

    ``clients`` names the clients to run (``None``: all of :func:`policies`);
    ``models`` gives a limiter (by name) another model than :data:`MODELS`' of its kind.
    """
    results: dict[str, dict[str, list[Record]]] = {}
    for limiter in limiters:
        model = (models or {}).get(limiter.name) or MODELS[limiter.kind]
        backlog = int(BACKLOG_FACTOR * limiter.rate * limiter.seconds) + 100
        for client, policy in policies(limiter, with_adaptive=with_adaptive).items():
            if clients is not None and client not in clients:
                continue
            trace = simulate(
                policy,
                model,
                burst("https://site.test/page/{i}", backlog),
                duration=limiter.seconds + 1.0,
                backend="trio" if backend == "trio" else "asyncio",
            )
            results.setdefault(limiter.name, {})[client] = records_of(trace)
    return results
