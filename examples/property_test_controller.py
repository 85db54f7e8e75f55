"""Property-test a custom controller with throttlekit.testing and Hypothesis.

The controller under test, ``Cooldown``, promises: after any 5xx response,
the scope sends at most one request every ``slow_delay`` seconds for the
next ``cooldown`` seconds. Hypothesis draws policies, workloads and servers
(flaky ones included); each example is a full simulated crawl in virtual
time against the real Limiter.

Run it with ``pytest examples/property_test_controller.py``.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings

from throttlekit import BaseController, Feedback, ScopePolicy, ScopeView
from throttlekit.testing import assert_respects, simulate
from throttlekit.testing import strategies as tks

SLOW_DELAY = 2.0
COOLDOWN = 10.0


class Cooldown(BaseController):
    """Slow a scope down to ``slow_delay`` for ``cooldown`` seconds after a 5xx."""

    def __init__(self, policy: ScopePolicy) -> None:
        self.delay = 0.0  # no opinion until a 5xx arrives
        self.until = -math.inf

    def on_send(self, scope: ScopeView, now: float) -> bool:
        if self.delay and now >= self.until:
            self.delay = 0.0
            return True  # our limits changed: the scope recomputes its effective ones
        return False

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        if feedback.status is not None and feedback.status >= 500:
            self.delay = SLOW_DELAY
            self.until = now + COOLDOWN


@settings(max_examples=40, deadline=None)
@given(
    policy=tks.policies(jitter=False, backoff=False, controllers=[Cooldown]),
    requests=tks.traffic(hosts=["shop.test"]),
    server=tks.servers(),
)
def test_cooldown_controller(policy, requests, server):
    trace = simulate(policy, server, requests)
    # The built-in rules still hold with the controller attached...
    assert_respects(trace, policy)
    # ...and so does the controller's own promise.
    errors = [r.responded for r in trace.requests if r.status and r.status >= 500]
    for first, second in itertools.pairwise(trace.sends("shop.test")):
        if any(error < first.sent < error + COOLDOWN for error in errors):
            gap = second.sent - first.sent
            assert gap >= SLOW_DELAY - 1e-9, (
                f"#{first.index} at t={first.sent:g} and #{second.index} at "
                f"t={second.sent:g} are {gap:g} s apart during a cooldown"
            )
