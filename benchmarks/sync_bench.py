"""The synchronous driver: SyncLimiter and the requests adapter, next to the sync peers.

Three parts, one suite (``sync``):

* uncontended acquire+release in one thread (CPU time per operation, and
  instructions under valgrind) against a bare ``threading.Semaphore`` and
  pyrate-limiter's blocking ``try_acquire``; and per request through a
  requests adapter (throttlekit's ``ThrottledAdapter`` and
  requests-ratelimiter's ``LimiterAdapter``), both over an inner adapter that
  answers at once without the network, so what is left is the throttling;
* 64 threads acquiring and releasing on one scope and on 64 scopes;
* a crawl of three local sites (distinct ports, so distinct scopes) by 32
  threads sharing one ``requests.Session``: the rate each site got, as a share
  of what its policy allows, and the most requests it saw at once.

Every factory returns a :class:`SyncCase` whose ``loop(n)`` performs ``n``
operations; ``python -m benchmarks.sync_bench <factory> N`` runs one so,
for :func:`benchmarks.instructions.count_instructions` to count under
valgrind.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from throttlekit import ScopePolicy, SyncLimiter

from ._harness import RunConfig, Skip, Suite, SuiteResult, Table, Target, fmt_ns, fmt_ratio
from ._harness import measure_loops as _measure_async
from .instructions import WARMUP, count_instructions, valgrind
from .peers import HOST, HUGE_RATE, URL, PeerMissing

__all__ = ["SUITES", "SyncCase"]

FREE = ScopePolicy(concurrency=None, delay=0)
THREADS = 64
#: The module whose ``python -m`` runs one of its cases for valgrind (:func:`_run_case`).
_MODULE = "benchmarks.sync_bench"


@dataclass
class SyncCase:
    """One measured loop in the calling thread."""

    label: str
    config: str
    loop: Callable[[int], None]
    cleanup: Callable[[], None] | None = None
    notes: list[str] = field(default_factory=list)


def _require(module: str, dist: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise PeerMissing(f"{dist} is not installed ({exc}); pip install {dist}") from exc


# -- uncontended cases (one thread) -------------------------------------------------------


def sync_threading_semaphore() -> SyncCase:
    semaphore = threading.Semaphore(HUGE_RATE)

    def loop(n: int) -> None:
        for _ in range(n):
            with semaphore:
                pass

    return SyncCase("threading.Semaphore", "with Semaphore(10**9)", loop)


def sync_throttlekit_url() -> SyncCase:
    limiter = SyncLimiter(concurrency=None, default=FREE)

    def loop(n: int) -> None:
        for _ in range(n):
            with limiter.acquire(URL):
                pass

    return SyncCase("SyncLimiter", "with SyncLimiter(...).acquire(url), no delay", loop)


def sync_throttlekit_scopes() -> SyncCase:
    limiter = SyncLimiter(concurrency=None, default=FREE)

    def loop(n: int) -> None:
        for _ in range(n):
            with limiter.acquire(scopes=HOST):
                pass

    return SyncCase("SyncLimiter, acquire(scopes=host)", "with acquire(scopes=host)", loop)


def sync_throttlekit_nowait() -> SyncCase:
    limiter = SyncLimiter(concurrency=None, default=FREE)

    def loop(n: int) -> None:
        for _ in range(n):
            with limiter.acquire_nowait(URL):
                pass

    return SyncCase("SyncLimiter, acquire_nowait", "with acquire_nowait(url)", loop)


def sync_pyrate_limiter() -> SyncCase:
    _require("pyrate_limiter", "pyrate-limiter")
    from pyrate_limiter import Duration, InMemoryBucket, Limiter, Rate

    limiter = Limiter(InMemoryBucket([Rate(HUGE_RATE, Duration.SECOND)]))

    def loop(n: int) -> None:
        for _ in range(n):
            if not limiter.try_acquire(HOST, blocking=True):
                raise AssertionError("pyrate-limiter refused under a huge rate")

    return SyncCase(
        "pyrate-limiter",
        "Limiter(InMemoryBucket([Rate(10**9, SECOND)])).try_acquire(key, blocking=True)",
        loop,
        limiter.close,
    )


def _answered() -> Any:
    """An adapter that answers every request at once, without the network."""
    from requests import PreparedRequest, Response
    from requests.adapters import BaseAdapter
    from requests.structures import CaseInsensitiveDict

    class Answered(BaseAdapter):
        def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
            response = Response()
            response.status_code = 200
            response.headers = CaseInsensitiveDict({"Content-Length": "2"})
            response._content = b"ok"
            response.request = request
            response.url = request.url or ""
            return response

        def close(self) -> None:
            pass

    return Answered


def _prepared() -> Any:
    import requests

    return requests.Request("GET", URL).prepare()


def sync_throttlekit_adapter() -> SyncCase:
    _require("requests", "requests")
    from throttlekit.adapters.requests import ThrottledAdapter

    adapter = ThrottledAdapter(SyncLimiter(concurrency=None, default=FREE), _answered()())
    request = _prepared()

    def loop(n: int) -> None:
        for _ in range(n):
            adapter.send(request)

    return SyncCase(
        "throttlekit ThrottledAdapter",
        "ThrottledAdapter(SyncLimiter(...), answered).send(request): acquire, record, release",
        loop,
    )


def sync_requests_ratelimiter() -> SyncCase:
    _require("requests_ratelimiter", "requests-ratelimiter")
    from requests_ratelimiter import LimiterMixin

    class Limited(LimiterMixin, _answered()):  # type: ignore[misc]
        pass

    adapter = Limited(per_second=HUGE_RATE)
    request = _prepared()

    def loop(n: int) -> None:
        for _ in range(n):
            adapter.send(request)

    return SyncCase(
        "requests-ratelimiter",
        "LimiterAdapter(per_second=10**9) over the same answered adapter: .send(request)",
        loop,
        adapter.close,
    )


LIMITER_CASES = (
    sync_threading_semaphore,
    sync_throttlekit_url,
    sync_throttlekit_scopes,
    sync_throttlekit_nowait,
    sync_pyrate_limiter,
)
ADAPTER_CASES = (sync_throttlekit_adapter, sync_requests_ratelimiter)
#: The cases whose instructions per operation are counted.
_COUNTED = ("threading.Semaphore", "SyncLimiter", "pyrate-limiter")


def _cases(
    factories: tuple[Callable[[], SyncCase], ...], result: SuiteResult
) -> tuple[list[SyncCase], dict[str, str]]:
    cases, factory_of = [], {}
    for factory in factories:
        try:
            case = factory()
            case.loop(10)
        except (PeerMissing, Exception) as exc:
            result.skipped.append(Skip(factory.__name__.removeprefix("sync_"), str(exc)))
            continue
        cases.append(case)
        factory_of[case.label] = factory.__name__
    return cases, factory_of


def _measure(cases: list[SyncCase], config: RunConfig) -> dict[str, Any]:
    """CPU time per operation of each case (the harness's interleaved repeats)."""

    def wrap(loop: Callable[[int], None]) -> Callable[[int], Any]:
        async def run(n: int) -> None:
            loop(n)

        return run

    loops = {case.label: wrap(case.loop) for case in cases}
    return asyncio.run(_measure_async(loops, config))


def _uncontended(config: RunConfig, result: SuiteResult) -> None:
    cases, factory_of = _cases(LIMITER_CASES, result)
    timings = _measure(cases, config)
    reference = timings["threading.Semaphore"].median_ns
    table = Table(
        "Uncontended acquire+release in one thread, one key, never waits",
        ["limiter", "median", "min", "vs threading.Semaphore"],
    )
    for case in cases:
        timing = timings[case.label]
        table.add(
            case.label,
            fmt_ns(timing.median_ns),
            fmt_ns(timing.min_ns),
            fmt_ratio(timing.median_ns / reference),
        )
    result.tables.append(table)
    adapters, _ = _cases(ADAPTER_CASES, result)
    per_request = _measure(adapters, config)
    table = Table(
        "Per request through a requests adapter, without the network",
        ["adapter", "median", "min", "vs threading.Semaphore"],
    )
    for case in adapters:
        timing = per_request[case.label]
        table.add(
            case.label,
            fmt_ns(timing.median_ns),
            fmt_ns(timing.min_ns),
            fmt_ratio(timing.median_ns / reference),
        )
    result.tables.append(table)
    configs = Table("How each is configured and called", ["case", "configuration"])
    for case in [*cases, *adapters]:
        configs.add(case.label, case.config)
        if case.cleanup is not None:
            case.cleanup()
    result.tables.append(configs)
    result.data["per_op"] = {label: t.to_json() for label, t in {**timings, **per_request}.items()}
    counts = _instructions(config, result, factory_of)
    ours = timings.get("SyncLimiter")
    pyrate = timings.get("pyrate-limiter")
    if ours is not None:
        ratio = ours.median_ns / reference
        measured = f"{fmt_ns(ours.median_ns)} = {fmt_ratio(ratio)}"
        if counts.get("threading.Semaphore") and counts.get("SyncLimiter"):
            measured += f" ({counts['SyncLimiter'] / counts['threading.Semaphore']:.2f}x instr.)"
        result.targets.append(
            Target("sync uncontended acquire(url)+release", "<= 2.00x threading.Semaphore",
                   measured, ratio <= 2.0)
        )  # fmt: skip
        result.targets.append(
            Target(
                "sync uncontended acquire(url)+release vs pyrate-limiter",
                "below pyrate-limiter's blocking try_acquire",
                f"{fmt_ns(ours.median_ns)} vs {fmt_ns(pyrate.median_ns if pyrate else None)}",
                None if pyrate is None else ours.median_ns < pyrate.median_ns,
            )
        )
    result.notes.append(
        "A threading.Semaphore is pure Python over a lock and a condition; SyncLimiter "
        "takes its lock once to grant and once to release, and in between does what the "
        "async fast path does (the same FastLane): find the URL's scope, read the clock, "
        "check concurrency, delay and the global cap, and note the permit held by the "
        "thread for nested acquires. The adapter rows also build and record feedback "
        "(status, headers, latency) per request; requests-ratelimiter records none."
    )


def _instructions(
    config: RunConfig, result: SuiteResult, factory_of: dict[str, str]
) -> dict[str, float]:
    if config.quick or valgrind() is None:
        result.skipped.append(Skip("sync instructions/op", "quick run or no valgrind"))
        return {}
    counts = {
        label: count_instructions(factory_of[label], module=_MODULE)
        for label in _COUNTED
        if label in factory_of
    }
    reference = counts.get("threading.Semaphore")
    table = Table(
        "Instructions per operation (valgrind cachegrind), one thread",
        ["limiter", "instructions/op", "vs threading.Semaphore"],
    )
    for label, count in counts.items():
        table.add(label, f"{count:,.0f}", fmt_ratio(count / reference if reference else None))
    result.tables.append(table)
    result.data["instructions_per_op"] = counts
    return counts


# -- 64 threads ------------------------------------------------------------------------------


def _threads(op: Callable[[int], None], per_thread: int) -> tuple[float, float]:
    """Run ``op(thread_index)`` ``per_thread`` times in each of 64 threads: (ops/s, CPU/op)."""
    start = threading.Barrier(THREADS + 1)

    def work(index: int) -> None:
        start.wait()
        for _ in range(per_thread):
            op(index)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    cpu = time.process_time()
    wall = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    ops = THREADS * per_thread
    return ops / wall, cpu / ops * 1e9


def _contended(config: RunConfig, result: SuiteResult) -> None:
    per_thread = 20 if config.quick else 3_000
    one = SyncLimiter(concurrency=None, default=ScopePolicy(concurrency=8, delay=0))
    many = SyncLimiter(concurrency=None, default=ScopePolicy(concurrency=1, delay=0))
    shared = threading.Semaphore(8)
    own = [threading.Semaphore(1) for _ in range(THREADS)]
    urls = [f"https://host-{index}.example/page" for index in range(THREADS)]

    def limiter_one(index: int) -> None:
        with one.acquire(URL):
            pass

    def limiter_many(index: int) -> None:
        with many.acquire(urls[index]):
            pass

    def semaphore_one(index: int) -> None:
        with shared:
            pass

    def semaphore_many(index: int) -> None:
        with own[index]:
            pass

    table = Table(
        f"{THREADS} threads acquiring and releasing, never waiting on a delay",
        ["case", "ops/s", "CPU per op", "CPU vs threading.Semaphore"],
    )
    data = {}
    for name, ours, theirs in (
        ("one scope, concurrency 8", limiter_one, semaphore_one),
        (f"{THREADS} scopes, concurrency 1 each", limiter_many, semaphore_many),
    ):
        rate, cpu = _threads(ours, per_thread)
        ref_rate, ref_cpu = _threads(theirs, per_thread)
        table.add(f"threading.Semaphore, {name}", f"{ref_rate:,.0f}", fmt_ns(ref_cpu), "1.00x")
        table.add(f"SyncLimiter, {name}", f"{rate:,.0f}", fmt_ns(cpu), fmt_ratio(cpu / ref_cpu))
        data[name] = {"ops_per_s": rate, "cpu_ns": cpu, "semaphore_cpu_ns": ref_cpu}
    for limiter in (one, many):
        stats = limiter.statistics()
        assert stats.in_flight == 0, stats
        assert stats.waiting == 0, stats
    result.tables.append(table)
    result.data["threads"] = data
    result.notes.append(
        f"{THREADS} threads each run {per_thread:,} acquire+release pairs at once (a barrier "
        "starts them together); the GIL runs one at a time, so this measures the lock's "
        "hand-offs and the waiters' wake-ups (one scope: 8 slots for 64 threads, so most "
        "acquires wait for a release) rather than parallel work."
    )


SUITES = (
    Suite(
        "sync",
        "SyncLimiter and the requests adapter: uncontended, 64 threads, a local crawl",
        lambda config: run_sync(config),
    ),
)


def run_sync(config: RunConfig) -> SuiteResult:
    from .sync_crawl import crawl

    result = SuiteResult(
        "sync",
        "Synchronous driver (threads)",
        "SyncLimiter and throttlekit.adapters.requests next to threading.Semaphore, "
        "pyrate-limiter (blocking try_acquire) and requests-ratelimiter: the uncontended "
        "cost in one thread, 64 threads on one scope and on many, and a crawl of three "
        "local sites by 32 threads sharing a requests.Session.",
    )
    started = time.perf_counter()
    _uncontended(config, result)
    _contended(config, result)
    crawl(config, result)
    result.seconds = time.perf_counter() - started
    return result


def _run_case(factory: str, n: int) -> None:
    """``python -m benchmarks.sync_bench FACTORY N``: a case, its loop run ``WARMUP`` then N times.

    The subprocess :func:`~benchmarks.instructions.count_instructions` counts.
    """
    case = globals()[factory]()
    try:
        case.loop(WARMUP)
        case.loop(n)
    finally:
        if case.cleanup is not None:
            case.cleanup()


if __name__ == "__main__":
    _run_case(sys.argv[1], int(sys.argv[2]))
