"""The uncontended acquire+release loop of every limiter, each used the way its docs show.

Every factory is called inside the running event loop and returns a
:class:`Case`: an async loop performing ``n`` operations on one key (a host),
configured so that it never has to wait, and a cleanup callback. A peer that
is not installed raises :class:`PeerMissing` with the reason, and the suite
reports it as skipped instead of failing.

The loops are written out one by one (no shared ``await op()`` helper) so the
measured cost is the limiter's, not that of an extra coroutine per operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from throttlekit import Limiter, ScopePolicy

from ._harness import OpLoop

__all__ = ["OTEL_LABEL", "PEERS", "THROTTLEKIT_CASES", "Case", "PeerMissing"]

HOST = "example.com"
URL = "https://example.com/catalogue/page-1.html"
#: Far above any rate one process reaches, so the rate limiters never wait.
HUGE_RATE = 1_000_000_000


class PeerMissing(Exception):
    """A peer library is not installed (or not usable) here."""


@dataclass
class Case:
    """One measured loop: what it is, how it is configured, how to clean up."""

    label: str
    config: str
    loop: OpLoop
    cleanup: Callable[[], Awaitable[None]] | None = None
    reference: bool = False
    notes: list[str] = field(default_factory=list)


def _require(module: str, dist: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise PeerMissing(f"{dist} is not installed ({exc}); pip install {dist}") from exc


# -- references ---------------------------------------------------------------------


async def asyncio_semaphore() -> Case:
    semaphore = asyncio.Semaphore(HUGE_RATE)

    async def loop(n: int) -> None:
        for _ in range(n):
            async with semaphore:
                pass

    return Case("asyncio.Semaphore", "async with Semaphore(10**9)", loop, reference=True)


async def anyio_capacity_limiter() -> Case:
    import anyio

    limiter = anyio.CapacityLimiter(HUGE_RATE)

    async def loop(n: int) -> None:
        for _ in range(n):
            async with limiter:
                pass

    return Case(
        "anyio.CapacityLimiter",
        "async with CapacityLimiter(10**9)",
        loop,
        notes=["anyio.CapacityLimiter yields to the event loop on every acquire (a checkpoint)."],
    )


# -- peers --------------------------------------------------------------------------


async def aiolimiter_case() -> Case:
    _require("aiolimiter", "aiolimiter")
    from aiolimiter import AsyncLimiter

    limiter = AsyncLimiter(HUGE_RATE, 1.0)

    async def loop(n: int) -> None:
        for _ in range(n):
            async with limiter:
                pass

    return Case("aiolimiter", "async with AsyncLimiter(10**9, 1.0)", loop)


async def limits_case() -> Case:
    _require("limits", "limits")
    from limits import RateLimitItemPerSecond
    from limits.aio.storage import MemoryStorage
    from limits.aio.strategies import MovingWindowRateLimiter

    storage = MemoryStorage()
    strategy = MovingWindowRateLimiter(storage)
    item = RateLimitItemPerSecond(HUGE_RATE)

    async def loop(n: int) -> None:
        for _ in range(n):
            if not await strategy.hit(item, HOST):
                raise AssertionError("limits refused a hit under a huge rate")

    async def cleanup() -> None:
        await storage.reset()
        timer = getattr(storage, "timer", None)
        if timer is not None and not timer.done():
            timer.cancel()

    return Case(
        "limits",
        "MovingWindowRateLimiter(aio MemoryStorage).hit(10**9/second, host)",
        loop,
        cleanup,
        notes=[
            "limits' moving window keeps one entry per hit for the window (1 s here) and "
            "inserts at the front of a list, so its cost grows with the hit rate."
        ],
    )


async def pyrate_limiter_case() -> Case:
    _require("pyrate_limiter", "pyrate-limiter")
    from pyrate_limiter import BucketAsyncWrapper, Duration, InMemoryBucket, Limiter, Rate

    limiter = Limiter(BucketAsyncWrapper(InMemoryBucket([Rate(HUGE_RATE, Duration.SECOND)])))

    async def loop(n: int) -> None:
        for _ in range(n):
            if not await limiter.try_acquire_async(HOST):
                raise AssertionError("pyrate-limiter refused under a huge rate")

    async def cleanup() -> None:
        limiter.close()

    return Case(
        "pyrate-limiter",
        "Limiter(BucketAsyncWrapper(InMemoryBucket([Rate(10**9, SECOND)]))).try_acquire_async",
        loop,
        cleanup,
    )


async def throttled_py_case() -> Case:
    _require("throttled.asyncio", "throttled-py")
    from throttled.asyncio import MemoryStore, Throttled, per_sec

    throttle = Throttled(quota=per_sec(HUGE_RATE), store=MemoryStore())

    async def loop(n: int) -> None:
        for _ in range(n):
            result = await throttle.limit(HOST)
            if result.limited:
                raise AssertionError("throttled-py limited under a huge rate")

    return Case(
        "throttled-py",
        "await Throttled(quota=per_sec(10**9), store=MemoryStore()).limit(host) (token bucket)",
        loop,
    )


# -- throttlekit --------------------------------------------------------------------


def _throttlekit_limiter(*, explicit: bool) -> Limiter:
    policy = ScopePolicy(concurrency=None, delay=0, slot_delay=0)
    if explicit:
        return Limiter(concurrency=None, default=policy, scopes={HOST: policy})
    return Limiter(concurrency=None, default=policy)


async def throttlekit_url() -> Case:
    acquire = _throttlekit_limiter(explicit=False).acquire

    async def loop(n: int) -> None:
        for _ in range(n):
            async with acquire(URL):
                pass

    return Case(
        "throttlekit",
        "async with limiter.acquire(url); default=ScopePolicy(concurrency=None, delay=0, "
        "slot_delay=0), Limiter(concurrency=None)",
        loop,
    )


async def throttlekit_policy_for_host() -> Case:
    acquire = _throttlekit_limiter(explicit=True).acquire

    async def loop(n: int) -> None:
        for _ in range(n):
            async with acquire(URL):
                pass

    return Case(
        "throttlekit, scopes={host: policy}",
        "as above, with the host's policy configured explicitly in Limiter(scopes=...)",
        loop,
    )


async def throttlekit_explicit_scopes() -> Case:
    acquire = _throttlekit_limiter(explicit=False).acquire

    async def loop(n: int) -> None:
        for _ in range(n):
            async with acquire(scopes=HOST):
                pass

    return Case(
        "throttlekit, acquire(scopes=host)",
        "async with limiter.acquire(scopes=host): no URL, no resolver",
        loop,
    )


async def throttlekit_distinct_urls() -> Case:
    acquire = _throttlekit_limiter(explicit=False).acquire
    # More URLs than the limiter remembers (131,072), so each is new to it, as in a crawl.
    urls = [f"https://{HOST}/catalogue/page-{i}.html?sort=price&p={i}" for i in range(200_000)]

    count = len(urls)
    position = [0]  # each call goes on where the last one stopped

    async def loop(n: int) -> None:
        start = position[0]
        position[0] = start + n
        for i in range(start, start + n):
            async with acquire(urls[i % count]):
                pass

    return Case(
        "throttlekit, distinct URLs",
        "acquire(url) round-robin over 200,000 URLs of one host, more than the limiter "
        "remembers (131,072): each URL is new to it, as in a crawl",
        loop,
    )


async def throttlekit_nowait() -> Case:
    acquire_nowait = _throttlekit_limiter(explicit=False).acquire_nowait

    async def loop(n: int) -> None:
        for _ in range(n):
            with acquire_nowait(URL):
                pass

    return Case(
        "throttlekit, acquire_nowait",
        "with limiter.acquire_nowait(url): the synchronous path",
        loop,
    )


async def throttlekit_otel() -> Case:
    _require("opentelemetry.sdk.metrics", "opentelemetry-sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from throttlekit.otel import instrument

    limiter = _throttlekit_limiter(explicit=False)
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instrument(limiter, meter_provider=provider)
    acquire = limiter.acquire

    async def loop(n: int) -> None:
        for _ in range(n):
            async with acquire(URL):
                pass

    async def cleanup() -> None:
        provider.shutdown()

    return Case(
        OTEL_LABEL,
        "as 'throttlekit', instrumented with throttlekit.otel.instrument(limiter) on an "
        "OpenTelemetry SDK MeterProvider (in-memory reader): a wait-time histogram record "
        "and two counts per acquire",
        loop,
        cleanup,
    )


#: The label of the instrumented case (the overhead suite compares it with "throttlekit").
OTEL_LABEL = "throttlekit + OpenTelemetry metrics"

#: The peers in the order they are reported; the first is the reference.
PEERS: tuple[Callable[[], Awaitable[Case]], ...] = (
    asyncio_semaphore,
    anyio_capacity_limiter,
    aiolimiter_case,
    limits_case,
    pyrate_limiter_case,
    throttled_py_case,
)
THROTTLEKIT_CASES: tuple[Callable[[], Awaitable[Case]], ...] = (
    throttlekit_url,
    throttlekit_policy_for_host,
    throttlekit_explicit_scopes,
    throttlekit_distinct_urls,
    throttlekit_nowait,
    throttlekit_otel,
)
