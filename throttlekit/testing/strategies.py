"""Hypothesis strategies for policies, workloads and simulated servers.

Combine them with :func:`~throttlekit.testing.simulate` and
:func:`~throttlekit.testing.assert_respects` to property-test a policy, a
custom controller or a resolver::

    from hypothesis import given
    from throttlekit.testing import assert_respects, simulate, strategies as tks

    @given(tks.policies(), tks.traffic(), tks.servers())
    def test_policy_is_respected(policy, requests, server):
        assert_respects(simulate(policy, server, requests))

Numbers are drawn from small grids (delays in steps of 0.05 s, costs 0.5, 1
or 2) so that failing examples shrink to readable values. Every strategy
needs the ``hypothesis`` package (``pip install "throttlekit-http[testing]"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'throttlekit.testing.strategies needs hypothesis: pip install "throttlekit-http[testing]"'
    ) from exc

from .._backoff import Backoff
from .._controller import Controller
from .._limiter import Limiter
from .._policy import ScopePolicy
from ._model import SimRequest
from ._servers import (
    CapacityServer,
    CDNServer,
    FixedServer,
    FlakyServer,
    QuotaServer,
    ServerModel,
    Sites,
    SoftBlockServer,
)

__all__ = [
    "DEFAULT_HOSTS",
    "LimiterFactory",
    "backoffs",
    "limiters",
    "policies",
    "servers",
    "traffic",
]

#: The hosts :func:`traffic` and :func:`servers` use unless told otherwise.
DEFAULT_HOSTS: tuple[str, ...] = ("a.test", "b.test", "c.test")

#: The largest cost :func:`traffic` gives a request; :func:`policies` draws
#: quotas of at least this, so every request fits its quota.
MAX_COST = 2.0

ControllerFactory = Callable[[ScopePolicy], Controller]


def _grid(low: float, high: float, step: float) -> st.SearchStrategy[float]:
    """Multiples of ``step`` in ``[low, high]``; shrinks toward ``low``."""
    first, last = round(low / step), round(high / step)
    return st.integers(first, last).map(lambda n: round(n * step, 10))


def backoffs() -> st.SearchStrategy[Backoff]:
    """:class:`~throttlekit.Backoff` configurations with short windows and delays.

    Short enough that backoff and its step back both happen within a
    simulation of a minute or two.
    """
    return st.builds(
        Backoff,
        delay_factor=st.sampled_from([1.5, 2.0, 3.0]),
        min_delay=_grid(0.1, 2.0, 0.1),
        max_delay=_grid(2.0, 30.0, 1.0),
        jitter=st.sampled_from([0.0, 0.1, 0.2]),
        window=_grid(1.0, 20.0, 1.0),
    )


def policies(
    *,
    max_concurrency: int = 4,
    max_delay: float = 2.0,
    jitter: bool = True,
    quota: bool = True,
    unlimited: bool = True,
    backoff: bool | None = None,
    controllers: Sequence[ControllerFactory] = (),
) -> st.SearchStrategy[ScopePolicy]:
    """Scope policies: concurrency, delays, jitter, quotas and backoff.

    :param max_concurrency: the largest ``concurrency`` drawn.
    :param max_delay: the largest ``delay`` and ``slot_delay`` (seconds).
    :param jitter: sometimes draw a jitter (else always none).
    :param quota: sometimes draw a quota (at least 2 units per 1 to 10 s).
    :param unlimited: sometimes draw ``concurrency=None``.
    :param backoff: ``True`` always has a :class:`~throttlekit.Backoff`
        (from :func:`backoffs`), ``False`` never (``backoff=None``), ``None``
        either.
    :param controllers: custom controller factories attached to every policy
        (the thing under test).
    """
    concurrency: st.SearchStrategy[int | None] = st.integers(1, max_concurrency)
    if unlimited:
        concurrency = st.none() | concurrency
    jitters: st.SearchStrategy[Any] = st.just(0.0)
    if jitter:
        jitters = st.sampled_from([0.0, 0.1, 0.5, (-0.2, 0.3)])
    quotas: st.SearchStrategy[float | None] = st.none()
    if quota:
        quotas = st.none() | _grid(MAX_COST, 20.0, 1.0)
    fields: dict[str, st.SearchStrategy[Any]] = {
        "concurrency": concurrency,
        "delay": _grid(0.0, max_delay, 0.05),
        "slot_delay": _grid(0.0, max_delay, 0.05),
        "jitter": jitters,
        "quota": quotas,
        "window": _grid(1.0, 10.0, 0.5),
        "controllers": st.just(tuple(controllers)),
    }
    if backoff is None:
        fields["backoff"] = st.none() | backoffs()
    elif backoff:
        fields["backoff"] = backoffs()
    else:
        fields["backoff"] = st.none()
    return st.builds(ScopePolicy, **fields)


@st.composite
def _arrival_times(draw: st.DrawFn, count: int, duration: float) -> list[float]:
    """Arrival times following one of several patterns, sorted."""
    pattern = draw(st.sampled_from(["burst", "steady", "random", "waves"]))
    if pattern == "burst":
        at = draw(_grid(0.0, duration, 0.5))
        return [at] * count
    if pattern == "steady":
        gap = draw(_grid(0.05, max(0.05, duration / max(count, 1)), 0.05))
        return [round(index * gap, 10) for index in range(count)]
    if pattern == "waves":
        waves = draw(st.integers(2, 4))
        starts = sorted(draw(st.lists(_grid(0.0, duration, 0.5), min_size=waves, max_size=waves)))
        return sorted(starts[index % waves] for index in range(count))
    return sorted(draw(st.lists(_grid(0.0, duration, 0.05), min_size=count, max_size=count)))


@st.composite
def _traffic(
    draw: st.DrawFn,
    hosts: tuple[str, ...],
    min_requests: int,
    max_requests: int,
    duration: float,
    priorities: bool,
    cancellations: bool,
    timeouts: bool,
    costs: bool,
    shared_scopes: tuple[str, ...],
) -> list[SimRequest]:
    count = draw(st.integers(min_requests, max_requests))
    times = draw(_arrival_times(count, duration))
    requests = []
    for index, at in enumerate(times):
        host = draw(st.sampled_from(hosts))
        fields: dict[str, Any] = {"at": at, "url": f"https://{host}/page/{index}"}
        if priorities:
            fields["priority"] = draw(st.sampled_from([0, 0, 0, 1, -1]))
        if cancellations:
            fields["cancel_after"] = draw(st.none() | _grid(0.05, 10.0, 0.05))
        if timeouts:
            fields["timeout"] = draw(st.none() | _grid(0.0, 10.0, 0.5))
        if costs or shared_scopes:
            scopes: dict[str, float] = {host: draw(_costs()) if costs else 1.0}
            joins = draw(st.booleans()) if shared_scopes else False
            if joins:
                shared = draw(st.sampled_from(shared_scopes))
                scopes[shared] = draw(_costs()) if costs else 1.0
            fields["scopes"] = scopes
        requests.append(SimRequest(**fields))
    return requests


def _costs() -> st.SearchStrategy[float]:
    return st.sampled_from([1.0, 1.0, 0.5, MAX_COST])


def traffic(
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    min_requests: int = 1,
    max_requests: int = 30,
    duration: float = 10.0,
    priorities: bool = True,
    cancellations: bool = True,
    timeouts: bool = True,
    costs: bool = True,
    shared_scopes: Sequence[str] = ("shared-pool",),
) -> st.SearchStrategy[list[SimRequest]]:
    """Workloads: lists of :class:`~throttlekit.testing.SimRequest` sorted by arrival.

    Arrivals follow one pattern per example: a burst at one instant, a
    steady stream, waves of bursts, or random times within ``duration``.

    :param hosts: the hosts of the URLs (``https://<host>/page/<n>``).
    :param min_requests: fewest requests.
    :param max_requests: most requests.
    :param duration: arrivals fall in ``[0, duration]`` seconds.
    :param priorities: draw priorities -1, 0 or 1 (mostly 0).
    :param cancellations: sometimes give ``cancel_after`` (the caller gives up).
    :param timeouts: sometimes give an acquire ``timeout``.
    :param costs: give requests explicit scopes ``{host: cost}`` with costs
        0.5, 1 or 2 (at most :data:`MAX_COST`).
    :param shared_scopes: extra scope names a request may also belong to (a
        shared pool across hosts); ``()`` for none. With explicit scopes
        the limiter's resolver is bypassed (``costs=False, shared_scopes=()``
        keeps it in play).
    """
    hosts = tuple(hosts)
    if not hosts:
        raise ValueError("traffic() needs at least one host")
    if not 0 <= min_requests <= max_requests:
        raise ValueError(
            f"need 0 <= min_requests <= max_requests, got {min_requests}, {max_requests}"
        )
    return _traffic(
        hosts,
        min_requests,
        max_requests,
        duration,
        priorities,
        cancellations,
        timeouts,
        costs,
        tuple(shared_scopes),
    )


def _server() -> st.SearchStrategy[ServerModel]:
    latency = _grid(0.0, 1.0, 0.01)
    capacity = st.builds(
        CapacityServer,
        workers=st.integers(1, 4),
        service_time=_grid(0.01, 1.0, 0.01),
        jitter=st.sampled_from([0.0, 0.2]),
        exponential=st.booleans(),
        max_queue=st.none() | _grid(0.5, 5.0, 0.5),
    )
    quota = st.builds(
        QuotaServer,
        limit=st.integers(1, 10),
        window=_grid(0.5, 5.0, 0.5),
        sliding=st.booleans(),
        count_rejected=st.booleans(),
        latency=latency,
        retry_after=st.sampled_from(["reset", None, 1, 2, 5]),
        rate_limit_headers=st.sampled_from([None, "ietf", "legacy", "x-ratelimit"]),
        changes=st.sampled_from([(), ((2.0, 2),), ((1.0, 1), (3.0, 12))]),
    )
    return st.one_of(
        st.builds(FixedServer, latency=latency, status=st.sampled_from([200, 200, 404, 503])),
        capacity,
        quota,
        st.builds(CDNServer, hit_ratio=_grid(0.0, 1.0, 0.1), origin=capacity),
        st.builds(
            SoftBlockServer,
            limit=st.integers(1, 10),
            window=_grid(1.0, 10.0, 1.0),
            block_for=_grid(0.0, 30.0, 5.0),
            latency=latency,
        ),
        st.builds(
            FlakyServer,
            latency=latency,
            error_rate=_grid(0.0, 0.5, 0.1),
            timeout_rate=_grid(0.0, 0.2, 0.05),
            timeout=_grid(0.5, 10.0, 0.5),
            reset_rate=_grid(0.0, 0.2, 0.05),
            error_latency=st.none() | _grid(0.0, 0.01, 0.001),
            origin=st.none() | capacity,
        ),
    )


def servers(*, hosts: Sequence[str] | None = None) -> st.SearchStrategy[ServerModel]:
    """Simulated servers: fixed, capacity-bound, quota (429), CDN, soft-block and flaky.

    :param hosts: with host names, a :class:`~throttlekit.testing.Sites` giving
        each host its own drawn server; without, one server for every request.
    """
    if hosts is None:
        return _server()
    names = tuple(hosts)
    return st.fixed_dictionaries({host: _server() for host in names}).map(Sites)


@attrs.frozen(kw_only=True)
class LimiterFactory:
    """Makes a fresh :class:`~throttlekit.Limiter` on each call (what :func:`limiters` draws).

    Pass it to :func:`~throttlekit.testing.simulate` as is; its repr shows
    the drawn configuration when Hypothesis reports a failing example.
    """

    default: ScopePolicy
    scopes: Mapping[str, ScopePolicy] = attrs.field(factory=dict)
    concurrency: int | None = None
    seed: int = 0

    def __call__(self) -> Limiter:
        return Limiter(
            scopes=dict(self.scopes),
            default=self.default,
            concurrency=self.concurrency,
            seed=self.seed,
        )


def limiters(
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    policy: st.SearchStrategy[ScopePolicy] | None = None,
    max_concurrency: int = 8,
) -> st.SearchStrategy[LimiterFactory]:
    """Limiter configurations: a default policy, per-host policies and a global cap.

    :param hosts: hosts that may get their own policy.
    :param policy: the strategy for each policy (default: :func:`policies`).
    :param max_concurrency: the largest global cap drawn (``None`` is drawn too).
    """
    if policy is None:
        policy = policies()
    return st.builds(
        LimiterFactory,
        default=policy,
        scopes=st.dictionaries(st.sampled_from(tuple(hosts)), policy, max_size=len(hosts)),
        concurrency=st.none() | st.integers(1, max_concurrency),
        seed=st.integers(0, 2**16),
    )
