"""Latency-driven throttling alone ignores fast 429s; backoff slows down. Seen in virtual time.

An API allows 5 requests per second and answers 429 in 5 ms beyond that,
while real responses take 50 ms. AutoThrottle sets its delay from the
latency (50 ms, so 20 requests per second) and the fast 429s never raise it:
half of the requests are refused. The backoff controller reads the status
codes (and the Retry-After header) and slows the scope down instead.

Run it with ``python examples/simulate_fast_429.py``; five simulated minutes
take well under a second.
"""

from __future__ import annotations

from throttlekit import AutoThrottle, Backoff, ScopePolicy
from throttlekit.testing import QuotaServer, assert_respects, poisson, simulate

API = QuotaServer(limit=5, window=1.0, latency=0.05, reject_latency=0.005, retry_after=1)
WORKLOAD = poisson("https://api.test/items/{i}", rate=10.0, duration=300.0, seed=1)
LATENCY_ONLY = ScopePolicy(
    concurrency=4,
    delay=0.0,
    slot_delay=0.0,
    backoff=None,
    autothrottle=AutoThrottle(start_delay=1.0, target_concurrency=1.0),
)
WITH_BACKOFF = ScopePolicy(
    concurrency=4,
    delay=0.0,
    slot_delay=0.0,
    backoff=Backoff(min_delay=0.2, window=30.0),
    autothrottle=AutoThrottle(start_delay=1.0, target_concurrency=1.0),
)


def run(policy: ScopePolicy) -> dict[str, float]:
    """Simulate five minutes of traffic under ``policy``; summarize what the API saw."""
    trace = simulate(policy, API, WORKLOAD, duration=300.0)
    assert_respects(trace, policy)
    sent = len(trace.sends())
    return {
        "sent": sent,
        "refused": trace.count(status=429) / sent,
        "good_per_second": trace.throughput(),
        "mean_delay": trace.mean_delay(),
    }


def main() -> dict[str, dict[str, float]]:
    results = {"latency only": run(LATENCY_ONLY), "with backoff": run(WITH_BACKOFF)}
    for name, summary in results.items():
        print(
            f"{name:>12}: sent {summary['sent']:.0f}, refused {summary['refused']:.1%}, "
            f"{summary['good_per_second']:.2f} good responses/s, "
            f"mean delay {summary['mean_delay']:.3f} s"
        )
    return results


if __name__ == "__main__":
    main()
