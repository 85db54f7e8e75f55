"""Test and explore throttling in virtual time: a simulator, server models and invariant checks.

:func:`simulate` runs a real :class:`~throttlekit.Limiter` against a
simulated server without sleeping, and returns a :class:`Trace` of every
request and of each scope's state over time. :func:`assert_respects` checks a
trace against the policy (concurrency, delays, quotas, ``Retry-After``), and
:mod:`throttlekit.testing.strategies` generates policies, workloads and
servers for `Hypothesis <https://hypothesis.readthedocs.io>`_, so a custom
controller or resolver can be property-tested in a few lines.

Usage::

    from throttlekit import ScopePolicy
    from throttlekit.testing import QuotaServer, assert_respects, burst, simulate

    trace = simulate(
        ScopePolicy(concurrency=2, delay=0.5, slot_delay=0),
        QuotaServer(limit=5, window=1.0, retry_after=2),
        burst("https://api.test/items/{i}", 50),
    )
    assert_respects(trace)
    print(trace.count(status=429), trace.throughput())
"""

from __future__ import annotations

from ._invariants import PolicyViolation, Violation, assert_respects, check_respects
from ._limiters import FrameworkLimiter, HAProxyRate, NginxLimitConn, NginxLimitReq
from ._loop import SimulationDeadlock, VirtualEventLoop
from ._model import SimRequest, SimResponse, burst, poisson, steady
from ._network import Jittered
from ._servers import (
    BucketServer,
    CapacityServer,
    CDNServer,
    FixedServer,
    FlakyServer,
    QuotaServer,
    Responder,
    ServerModel,
    Sites,
    SoftBlockServer,
)
from ._simulate import simulate
from ._trace import Bucket, Outcome, RequestRecord, Sample, Trace

__all__ = [
    "Bucket",
    "BucketServer",
    "CDNServer",
    "CapacityServer",
    "FixedServer",
    "FlakyServer",
    "FrameworkLimiter",
    "HAProxyRate",
    "Jittered",
    "NginxLimitConn",
    "NginxLimitReq",
    "Outcome",
    "PolicyViolation",
    "QuotaServer",
    "RequestRecord",
    "Responder",
    "Sample",
    "ServerModel",
    "SimRequest",
    "SimResponse",
    "SimulationDeadlock",
    "Sites",
    "SoftBlockServer",
    "Trace",
    "Violation",
    "VirtualEventLoop",
    "assert_respects",
    "burst",
    "check_respects",
    "poisson",
    "simulate",
    "steady",
]
