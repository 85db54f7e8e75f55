"""Property-test the custom controller of the scraping-API recipe.

``UpstreamBackoff`` (in ``cookbook_scraping_api.py``, next to this file)
promises: once the API has reported an upstream 429 or 5xx for a site, no
two requests to that site go out less than ``min_delay`` apart until the
site has been quiet for ``window`` seconds. Hypothesis draws policies,
workloads and servers (rate-limited, flaky, slow...); a scraping API model
relays each server's answer as a 200 with the site's status in a header;
every example is a whole crawl in virtual time against the real Limiter.

Run it with ``pytest examples/cookbook_property_test.py``.
"""

from __future__ import annotations

import itertools
import random

import attrs
from cookbook_scraping_api import UPSTREAM_STATUS, UpstreamBackoff, upstream_status
from hypothesis import given, settings

from throttlekit import ScopePolicy
from throttlekit.testing import Responder, ServerModel, SimRequest, SimResponse, simulate
from throttlekit.testing import strategies as tks

MIN_DELAY = 0.5
WINDOW = 5.0
SIGNALS = {429, 502, 503, 504}


@attrs.frozen
class ScrapingAPI:
    """A scraping API in front of ``site``: answers 200, with the site's status in a header."""

    site: ServerModel

    def start(self, rng: random.Random) -> Responder:
        fetch = self.site.start(rng)

        def relay(request: SimRequest, now: float) -> SimResponse:
            answer = fetch(request, now)
            status = 504 if answer.status is None else answer.status  # site unreachable
            return SimResponse(
                status=200,
                latency=answer.latency,
                headers={UPSTREAM_STATUS: str(status)},
                size=answer.size,
            )

        return relay


def upstream_backoff(policy: ScopePolicy) -> UpstreamBackoff:
    return UpstreamBackoff(policy, min_delay=MIN_DELAY, window=WINDOW)


@settings(max_examples=20, deadline=None)
@given(
    policy=tks.policies(jitter=False, backoff=False, controllers=[upstream_backoff]),
    requests=tks.traffic(hosts=["shop.test"], max_requests=25),
    site=tks.servers(),
)
def test_upstream_backoff_spaces_requests_after_a_signal(
    policy: ScopePolicy, requests: list[SimRequest], site: ServerModel
) -> None:
    trace = simulate(policy, ScrapingAPI(site), requests)
    signals = [
        record.responded
        for record in trace.requests
        if record.responded is not None and upstream_status(record.headers) in SIGNALS
    ]
    for first, second in itertools.pairwise(trace.sends("shop.test")):
        assert first.sent is not None
        assert second.sent is not None
        # A signal binds the sends after it; one that arrived at the very instant
        # of a grant may have been read just after it (the granted task then
        # records its send after the response), so only earlier instants count.
        recent = any(at < second.sent and second.sent - at < WINDOW for at in signals)
        if recent:
            gap = second.sent - first.sent
            assert gap >= MIN_DELAY - 1e-9, (
                f"requests #{first.index} and #{second.index} went out {gap:g} s apart "
                f"(at t={first.sent:g} and t={second.sent:g}) right after an upstream signal"
            )
