"""End-to-end tests of the async :class:`~throttlekit.Limiter` on asyncio and trio.

Timing-heavy tests run on trio in virtual time (``MockClock(autojump_threshold=0)``,
see ``conftest.py``) and, with small real delays, on asyncio. Every check of
the rules works on the send times the limiter reports (``permit.granted_at``),
which are exact readings of the clock the limiter decides on.
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import httpx
import pytest
from _virtual import until

import throttlekit
from throttlekit import (
    Limiter,
    Overloaded,
    ScopePolicy,
    ThrottlekitError,
    ThrottleTimeout,
    WouldBlock,
)
from throttlekit._scheduler import Ticket
from throttlekit.scopes import FALLBACK_SCOPE

pytestmark = pytest.mark.anyio

INF = math.inf
EPS = 1e-9
#: No delays at all: only concurrency limits apply.
FREE = ScopePolicy(concurrency=None, delay=0, slot_delay=0)
ONE = ScopePolicy(concurrency=1, delay=0, slot_delay=0)

virtual_and_asyncio = pytest.mark.parametrize(
    "anyio_backend", ["asyncio", "trio_virtual"], indirect=True
)
virtual = pytest.mark.parametrize("anyio_backend", ["trio_virtual"], indirect=True)


def assert_idle(limiter: Limiter) -> None:
    """Nothing held, nothing waiting: in the limiter and in every scope."""
    stats = limiter.statistics()
    assert stats.in_flight == 0
    assert stats.waiting == 0
    for scope in stats.scopes.values():
        assert scope.in_flight == 0, scope
        assert scope.waiting == 0, scope


def live_tickets() -> int:
    gc.collect()
    return sum(isinstance(obj, Ticket) for obj in gc.get_objects())


# -- checking a recorded run -------------------------------------------------------------------


@attrs.define
class Send:
    """One request as the test saw it: its scopes, grant time and release time."""

    scopes: dict[str, float]
    granted_at: float
    released_at: float = INF


def check_sends(policy: ScopePolicy, sends: Iterable[Send], scope: str) -> None:
    """Check one scope's sends against its policy (invariant 2).

    Releases at the same instant as a grant count first, so the check is exact
    for the concurrency and slot rules and never stricter than the limiter.
    """
    events: list[tuple[float, int, int, Send]] = []
    for index, send in enumerate(sends):
        events.append((send.granted_at, 1, index, send))
        if send.released_at < INF:
            events.append((send.released_at, 0, index, send))
    events.sort(key=lambda event: event[:3])
    in_flight = 0
    free_slots: list[float] = []  # last send of each free slot that has sent
    grants: list[Send] = []
    low = policy.jitter[0]
    for at, kind, _, send in events:
        if kind == 0:
            in_flight -= 1
            free_slots.append(send.granted_at)
            continue
        where = f"scope {scope!r} send at {at}"
        if policy.concurrency is not None:
            assert in_flight < policy.concurrency, f"{where}: concurrency exceeded"
            if policy.slot_delay and len(free_slots) >= policy.concurrency - in_flight:
                oldest = min(free_slots)
                assert oldest + policy.slot_delay <= at + EPS, f"{where}: slot reused too soon"
                free_slots.remove(oldest)
        if grants:
            gap = at - grants[-1].granted_at
            assert gap >= policy.delay * (1 + low) - EPS, f"{where}: {gap} s after the last one"
        if policy.quota is not None:
            used = (
                sum(g.scopes[scope] for g in grants if g.granted_at + policy.window > at)
                + send.scopes[scope]
            )
            assert used <= policy.quota + 1e-6, f"{where}: quota exceeded ({used})"
        grants.append(send)
        in_flight += 1


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    events = sorted([(end, 0) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    live = peak = 0
    for _, kind in events:
        live += 1 if kind else -1
        peak = max(peak, live)
    return peak


# -- many tasks, many scopes -------------------------------------------------------------------


def make_policies(rng: random.Random, count: int) -> dict[str, ScopePolicy]:
    policies = {}
    for index in range(count):
        policies[f"s{index}.example"] = ScopePolicy(
            concurrency=rng.choice([1, 2, 3, None]),
            delay=rng.choice([0.0, 0.002, 0.005, 0.01]),
            slot_delay=rng.choice([0.0, 0.01, 0.03]),
            jitter=rng.choice([0.0, 0.5, (-0.2, 0.3)]),
            quota=rng.choice([None, None, 6.0]),
            window=0.1,
        )
    return policies


@virtual_and_asyncio
async def test_two_thousand_tasks_over_fifty_scopes_keep_every_rule() -> None:
    rng = random.Random(20240601)
    policies = make_policies(rng, 50)
    names = sorted(policies)
    cap = 24
    limiter = Limiter(scopes=policies, default=FREE, concurrency=cap, seed=7)
    sends: list[Send] = []
    live: dict[str, int] = defaultdict(int)
    peak_global = 0
    outcomes: dict[str, int] = defaultdict(int)

    async def request(scopes: dict[str, float], hold: float, patience: float | None) -> None:
        nonlocal peak_global
        host = next(iter(scopes))
        kwargs: dict[str, Any] = {"priority": rng.choice([0, 0, 1])}
        if len(scopes) > 1 or scopes[host] != 1.0:
            kwargs["scopes"] = scopes
        with anyio.CancelScope() as scope:
            if patience is not None:
                scope.deadline = anyio.current_time() + patience
            async with limiter.acquire(f"https://{host}/page", **kwargs) as permit:
                assert permit.scopes == scopes
                send = Send(scopes, permit.granted_at)
                sends.append(send)
                for name in scopes:
                    live[name] += 1
                    limit = policies[name].concurrency
                    assert limit is None or live[name] <= limit
                live["(global)"] += 1
                peak_global = max(peak_global, live["(global)"])
                try:
                    await anyio.sleep(hold)
                finally:
                    send.released_at = anyio.current_time()
                    live["(global)"] -= 1
                    for name in scopes:
                        live[name] -= 1
        outcomes["cancelled" if scope.cancelled_caught else "sent"] += 1

    async with anyio.create_task_group() as tg:
        for _ in range(2000):
            first = rng.choice(names)
            scopes = {first: 1.0}
            if rng.random() < 0.2:
                scopes[rng.choice(names)] = rng.choice([0.5, 1.0, 2.0])
            patience = rng.choice([0.0, 0.01, 0.05, 0.2]) if rng.random() < 0.1 else None
            tg.start_soon(request, scopes, rng.choice([0.0, 0.001, 0.004, 0.01]), patience)

    assert outcomes["sent"] + outcomes["cancelled"] == 2000
    assert outcomes["cancelled"] > 0
    assert peak_global <= cap
    assert max_overlap((s.granted_at, s.released_at) for s in sends) <= cap
    for name in names:
        check_sends(policies[name], [s for s in sends if name in s.scopes], name)
    assert_idle(limiter)
    sends.clear()
    assert live_tickets() == 0, "the limiter keeps tickets of finished requests"


# -- timeouts, cancellation --------------------------------------------------------------------


@virtual_and_asyncio
async def test_timeout_raises_throttle_timeout_and_leaks_nothing() -> None:
    limiter = Limiter(default=ScopePolicy(concurrency=1, delay=0.2, slot_delay=0))
    # Held by acquire_nowait: an acquire nested in an ``async with`` permit of
    # the same task would share its scope instead of waiting.
    with limiter.acquire_nowait("https://a.example/"):
        with pytest.raises(ThrottleTimeout, match=r"no grant within 0\.05 s") as caught:
            async with limiter.acquire("https://a.example/", timeout=0.05):
                pytest.fail("granted while the only slot is held")
        assert isinstance(caught.value, TimeoutError)
        assert isinstance(caught.value, ThrottlekitError)
        with pytest.raises(ThrottleTimeout):
            async with limiter.acquire("https://a.example/", timeout=0):
                pass
        assert limiter.statistics().waiting == 0
        assert limiter.statistics().in_flight == 1
    start = anyio.current_time()
    async with limiter.acquire("https://a.example/", timeout=1.0) as permit:
        assert permit.granted_at >= start
    assert_idle(limiter)


@virtual
async def test_timeout_is_measured_on_the_limiter_clock() -> None:
    limiter = Limiter(default=ScopePolicy(concurrency=None, delay=10.0, slot_delay=0))
    async with limiter.acquire("https://a.example/"):
        pass
    with pytest.raises(ThrottleTimeout):
        async with limiter.acquire("https://a.example/", timeout=9.999):
            pass
    assert anyio.current_time() == pytest.approx(9.999)
    async with limiter.acquire("https://a.example/", timeout=0.002) as permit:
        assert permit.granted_at == pytest.approx(10.0)


@virtual_and_asyncio
async def test_cancel_while_waiting_and_while_holding() -> None:
    limiter = Limiter(default=ONE)
    holder = limiter.acquire_nowait("https://a.example/")
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(_hold, limiter, "https://a.example/", 1.0)
            await until(lambda: limiter.statistics().waiting == 5)
            scope.cancel()
    assert limiter.statistics().waiting == 0
    holder.release()
    assert_idle(limiter)
    # While holding: the block's exit gives the slot back.
    with anyio.move_on_after(0.01):
        async with limiter.acquire("https://a.example/"):
            await anyio.sleep(5)
    assert_idle(limiter)


async def _hold(limiter: Limiter, url: str, seconds: float, **kwargs: Any) -> None:
    async with limiter.acquire(url, **kwargs):
        await anyio.sleep(seconds)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio", "trio_virtual"], indirect=True)
async def test_cancel_right_after_a_release_granted_the_waiters() -> None:
    """Waiters granted by a release but cancelled before they run hand their grants on."""
    limiter = Limiter(default=ScopePolicy(concurrency=3, delay=0, slot_delay=0), concurrency=None)
    done: list[str] = []
    entered: list[int] = []

    async def patient() -> None:
        async with limiter.acquire("https://a.example/", priority=-1):
            done.append("patient")

    async def eager(index: int) -> None:
        async with limiter.acquire("https://a.example/"):
            entered.append(index)
            await anyio.sleep(1.0)

    async with anyio.create_task_group() as outer:
        holders = [limiter.acquire_nowait("https://a.example/") for _ in range(3)]
        outer.start_soon(patient)
        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(eager, index)
            await until(lambda: limiter.statistics().waiting == 5)
            for permit in holders:
                permit.release()  # grants three of the four waiters (not yet running)
            assert limiter.statistics().in_flight == 3
            tg.cancel_scope.cancel()
        # Whatever the backend does with the cancelled grants, the slots come back
        # and the low-priority waiter outside the cancelled group is served.
    # anyio lets a waiter that was already granted resume; its block sees the
    # cancellation at its first checkpoint and gives the slot back.
    assert len(entered) <= 3
    assert done == ["patient"]
    assert_idle(limiter)


@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
async def test_native_asyncio_cancel_after_grant_refunds_the_grant() -> None:
    """``task.cancel()`` between grant and resumption: the grant, quota included, goes back."""
    policy = ScopePolicy(concurrency=1, delay=0, slot_delay=0, quota=2.0, window=600)
    limiter = Limiter(default=policy)
    entered: list[int] = []

    async def request(index: int) -> None:
        async with limiter.acquire("https://a.example/"):
            entered.append(index)

    holder = limiter.acquire_nowait("https://a.example/")
    tasks = [asyncio.create_task(request(index)) for index in range(2)]
    await until(lambda: limiter.statistics().waiting == 2)
    holder.release()  # grants tasks[0], which has not resumed yet
    assert limiter.statistics().scopes["a.example"].quota_used == 2.0
    tasks[0].cancel()
    with anyio.fail_after(5):  # without the refund, tasks[1] would wait for the window
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1] is None
    assert entered == [1]
    assert limiter.statistics().scopes["a.example"].quota_used == 2.0  # holder + tasks[1]
    assert_idle(limiter)


@virtual
async def test_cancellation_at_every_checkpoint() -> None:
    """Cancel one request after 0, 1, 2, ... checkpoints; nothing ever leaks."""
    limiter = Limiter(default=ScopePolicy(concurrency=1, delay=0.5, slot_delay=0.7))
    for steps in range(40):
        cancel_at = anyio.current_time() + steps * 0.05
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(_hold, limiter, "https://a.example/", 0.1)
            with anyio.CancelScope(deadline=cancel_at):
                async with limiter.acquire("https://a.example/"):
                    await anyio.sleep(0.3)
        assert_idle(limiter)


# -- acquire_nowait, max_waiters, fast path ----------------------------------------------------


async def test_acquire_nowait_and_would_block() -> None:
    limiter = Limiter(default=ScopePolicy(concurrency=2, delay=0, slot_delay=0))
    with limiter.acquire_nowait("https://a.example/") as first:
        assert first.scopes == {"a.example": 1.0}
        with limiter.acquire_nowait("https://a.example/"):
            with pytest.raises(WouldBlock) as caught:
                limiter.acquire_nowait("https://a.example/")
            assert isinstance(caught.value, ThrottlekitError)
            with limiter.acquire_nowait("https://b.example/"):  # another scope is free
                pass
        with limiter.acquire_nowait("https://a.example/"):
            pass
    assert_idle(limiter)

    async def async_resolver(request: Any) -> str:
        return "x"

    with pytest.raises(RuntimeError, match="async resolver"):
        Limiter(resolver=async_resolver).acquire_nowait("https://a.example/")
    with pytest.raises(RuntimeError, match="async with"), limiter.acquire("https://a.example/"):
        pass


async def test_max_waiters_raises_overloaded() -> None:
    limiter = Limiter(default=ONE, max_waiters=2)
    async with anyio.create_task_group() as tg:
        holder = limiter.acquire_nowait("https://a.example/")
        for _ in range(2):
            tg.start_soon(_hold, limiter, "https://a.example/", 0)
        await until(lambda: limiter.statistics().waiting == 2)
        with pytest.raises(Overloaded) as caught:
            async with limiter.acquire("https://a.example/"):
                pass
        assert isinstance(caught.value, ThrottlekitError)
        # Requests that need not wait are not refused.
        async with limiter.acquire("https://b.example/"):
            pass
        assert limiter.statistics().waiting == 2
        holder.release()
    assert_idle(limiter)
    async with limiter.acquire("https://a.example/"):
        pass


async def test_uncontended_acquire_does_not_yield() -> None:
    """The fast path never reaches the event loop: another ready task never runs meanwhile."""

    async def resolve(request: Any) -> dict[str, float]:
        return {"async-a": 1.0, "async-b": 2.0}

    limiter = Limiter(default=FREE, concurrency=None)
    async_limiter = Limiter(default=FREE, concurrency=None, resolver=resolve)

    class Request:
        url = "https://obj.example/x"
        meta = {"throttling_scopes": {"meta-scope": 1.0, "other": 0.5}}

    ran: list[bool] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _mark(ran))
        for index in range(200):
            async with limiter.acquire(f"https://host{index % 7}.example/") as permit:
                permit.record(status=200)
            async with limiter.acquire(Request()):
                pass
            async with limiter.acquire(scopes={"x", "y"}):
                pass
            async with async_limiter.acquire("https://a.example/"):
                pass
            with limiter.acquire_nowait("https://n.example/"):
                pass
        assert ran == [], "acquire() yielded to the event loop on the uncontended path"
        # Each iteration above would have yielded several times if the path were slow;
        # a few checkpoints are enough for the observer to run (trio shuffles its batches).
        await until(lambda: ran == [True], limit=20)
    assert_idle(limiter)


async def _mark(ran: list[bool]) -> None:
    ran.append(True)


async def test_a_fast_path_permit_answers_like_any_other() -> None:
    """A grant of the in-memory fast path keeps no ticket until one is needed: its
    scopes, grant time, feedback, release and nesting behave as on the general path."""
    limiter = Limiter(default=ScopePolicy(concurrency=1, delay=0, slot_delay=0))
    url = "https://fast.example/"
    async with limiter.acquire(url):  # the general path: the scope and its URL are new
        pass
    async with limiter.acquire(url) as permit:
        assert type(permit._lease) is not Ticket  # the fast path took it: no ticket yet
        assert permit.scopes == {"fast.example": 1.0}
        assert permit.granted_at <= anyio.current_time()
        assert "fast.example" in repr(permit)
        with pytest.raises(WouldBlock):  # concurrency 1: the permit holds it
            limiter.acquire_nowait(url)
        permit.release()
        permit.release()  # idempotent
        with limiter.acquire_nowait(url):  # given back
            pass
    assert permit.scopes == {"fast.example": 1.0}  # still answers after the block
    assert_idle(limiter)
    async with limiter.acquire(url) as permit:
        permit.record(status=429, headers={"Retry-After": "30"})  # a ticket from now on
    stats = limiter.scope_statistics("fast.example")
    assert stats is not None
    assert stats.in_flight == 0
    assert stats.blocked_until > anyio.current_time() + 20
    other = "https://other.example/"
    async with limiter.acquire(other):
        pass
    async with limiter.acquire(other) as outer, limiter.acquire(other) as inner:
        assert (outer.scopes, inner.scopes) == ({"other.example": 1.0}, {})
    assert_idle(limiter)


async def test_a_new_url_of_a_known_scope_takes_the_fast_path() -> None:
    """A URL not seen before is granted on the fast path when its host's scope
    exists (a crawl sends each URL once); with another resolver it is not."""
    limiter = Limiter(default=ONE, concurrency=None)
    async with limiter.acquire("https://known.example/a"):  # the general path: a new scope
        pass
    async with limiter.acquire("https://known.example/b") as permit:
        assert type(permit._lease) is not Ticket  # found by its host: no ticket
        with pytest.raises(WouldBlock):  # the scope's concurrency of 1 binds every URL
            limiter.acquire_nowait("https://known.example/c")
    with limiter.acquire_nowait("https://known.example/d") as permit:
        assert type(permit._lease) is not Ticket
    assert permit.scopes == {"known.example": 1.0}
    with pytest.raises(ValueError, match="not an absolute URL"):
        async with limiter.acquire("known.example/e"):
            pass
    assert_idle(limiter)

    by_path = Limiter(default=ONE, concurrency=None, resolver=lambda url: "one-scope")
    async with by_path.acquire("https://known.example/a"):
        pass
    async with by_path.acquire("https://known.example/b") as permit:
        assert type(permit._lease) is Ticket  # its resolver decides: the general path
    assert_idle(by_path)


async def test_a_urls_remembered_ledger_is_not_granted_from_once_evicted() -> None:
    """The fast path finds a URL's ledger in the limiter's URL cache; once the
    scope is evicted (and even if a late record() reaches that ledger), the URL
    is granted from the scope's new ledger, whose limits bind."""
    limiter = Limiter(default=ONE, concurrency=None, max_scopes=2)
    first, second = "https://a.example/1", "https://a.example/2"
    async with limiter.acquire(first):  # the general path: remembers the ledger
        pass
    async with limiter.acquire(first) as late:  # the fast path, on that ledger
        pass
    for host in ("b", "c", "d"):
        async with limiter.acquire(f"https://{host}.example/"):
            pass
    assert limiter.scope_statistics("a.example") is None  # evicted
    late.record(status=503)  # feedback that reaches the evicted ledger
    async with limiter.acquire(second):  # a new ledger for a.example, held
        with pytest.raises(WouldBlock):  # its concurrency of 1 binds the first URL too
            limiter.acquire_nowait(first)
    async with limiter.acquire(first) as permit:
        assert permit.scopes == {"a.example": 1.0}
        assert limiter.statistics().scopes["a.example"].in_flight == 1
    assert_idle(limiter)


async def test_setting_the_resolver_forgets_the_hosts_of_urls() -> None:
    limiter = Limiter(default=FREE)
    url = "https://a.example/x"
    async with limiter.acquire(url) as permit:
        assert permit.scopes == {"a.example": 1.0}
    limiter.resolver = lambda request: "everything"
    async with limiter.acquire(url) as permit:
        assert permit.scopes == {"everything": 1.0}
    with limiter.acquire_nowait(url) as permit:
        assert permit.scopes == {"everything": 1.0}
    with pytest.raises(TypeError, match="resolver must be callable"):
        limiter.resolver = "by host"  # type: ignore[assignment]


@virtual
async def test_priorities_then_fifo() -> None:
    limiter = Limiter(default=ONE)
    order: list[tuple[int, int]] = []

    async def request(priority: int, index: int) -> None:
        async with limiter.acquire("https://a.example/", priority=priority):
            order.append((priority, index))
            await anyio.sleep(0.1)

    holder = limiter.acquire_nowait("https://a.example/")
    async with anyio.create_task_group() as tg:
        for index, priority in enumerate([0, 5, 1, 5, 3, 0, -2, 3]):
            tg.start_soon(request, priority, index)
            await until(lambda n=index + 1: limiter.statistics().waiting == n)
        holder.release()
    assert order == [(5, 1), (5, 3), (3, 4), (3, 7), (1, 2), (0, 0), (0, 5), (-2, 6)]


@virtual
async def test_waiting_wakes_only_for_grants() -> None:
    """One timer for the whole limiter: the core is consulted about once per grant."""
    limiter = Limiter(default=ScopePolicy(concurrency=None, delay=1.0, slot_delay=0))
    calls = 0
    dispatch = limiter._local.core.dispatch

    def counting(now: float) -> list[Ticket]:
        nonlocal calls
        calls += 1
        return dispatch(now)

    limiter._local.core.dispatch = counting  # type: ignore[method-assign]
    times: list[float] = []

    async def request() -> None:
        async with limiter.acquire("https://a.example/") as permit:
            times.append(permit.granted_at)

    async with anyio.create_task_group() as tg:
        for _ in range(200):
            tg.start_soon(request)
    assert times == [float(second) for second in range(200)]
    assert calls <= 3 * 200, f"{calls} dispatches for 200 grants"


# -- resolvers and request-likes ---------------------------------------------------------------


@attrs.define
class MetaRequest:
    url: str
    meta: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.define
class ExtensionsRequest:
    url: str
    extensions: Mapping[str, Any] = attrs.field(factory=dict)


@pytest.mark.parametrize(
    ("request_like", "expected"),
    [
        ("https://Books.ToScrape.com/x", {"books.toscrape.com": 1.0}),
        (MetaRequest("https://a.example/"), {"a.example": 1.0}),
        (MetaRequest("https://a.example/", {"throttling_scopes": "api"}), {"api": 1.0}),
        (
            MetaRequest("https://a.example/", {"throttling_scopes": {"api", "key-1"}}),
            {"api": 1.0, "key-1": 1.0},
        ),
        (
            ExtensionsRequest("https://a.example/", {"throttling_scopes": {"api": 2.5, "b": 0}}),
            {"api": 2.5, "b": 0.0},
        ),
        (
            httpx.Request("GET", "https://h.example:8443/x", extensions={"throttling_scopes": "k"}),
            {"k": 1.0},
        ),
        (httpx.Request("GET", "https://h.example:8443/x"), {"h.example:8443": 1.0}),
        ("file:///etc/hosts", {FALLBACK_SCOPE: 1.0}),
        ("https://münchen.example/", {"xn--mnchen-3ya.example": 1.0}),
    ],
)
async def test_request_likes_resolve_to_scopes(
    request_like: Any, expected: dict[str, float]
) -> None:
    limiter = Limiter(default=FREE)
    async with limiter.acquire(request_like) as permit:
        assert permit.scopes == expected
        assert permit.request is request_like
    assert_idle(limiter)


@pytest.mark.parametrize("url", ["example.com/path", "not a url", "", "https://a.example:99999/"])
async def test_acquire_rejects_what_is_not_a_url_with_a_host(url: str) -> None:
    limiter = Limiter(default=FREE)
    with pytest.raises(ValueError, match=re.escape(repr(url))):
        async with limiter.acquire(url):
            pass
    with pytest.raises(ValueError, match=re.escape(repr(url))):
        limiter.acquire_nowait(url)
    assert_idle(limiter)


async def test_scopes_argument_overrides_the_resolver() -> None:
    limiter = Limiter(default=FREE)
    request = MetaRequest("https://a.example/", {"throttling_scopes": "meta"})
    async with limiter.acquire(request, scopes={"explicit": 3}) as permit:
        assert permit.scopes == {"explicit": 3.0}
    async with limiter.acquire(scopes="only") as permit:
        assert permit.scopes == {"only": 1.0}
    async with limiter.acquire(scopes=["x", "y"]) as permit:
        assert permit.scopes == {"x": 1.0, "y": 1.0}


async def test_async_resolver() -> None:
    calls: list[str] = []

    async def resolver(request: Any) -> Mapping[str, float]:
        await anyio.lowlevel.checkpoint()
        calls.append(str(request))
        return {"pool": 2.0, throttlekit.scopes.by_host(request): 1.0}

    limiter = Limiter(default=FREE, resolver=resolver)
    async with limiter.acquire("https://a.example/x") as permit:
        assert permit.scopes == {"pool": 2.0, "a.example": 1.0}
    # Requests that carry their own scopes skip the resolver.
    async with limiter.acquire(MetaRequest("https://a.example/", {"throttling_scopes": "m"})):
        pass
    assert calls == ["https://a.example/x"]


class ResolverError(Exception):
    pass


def _raising(request: Any) -> str:
    raise ResolverError(request)


async def _raising_async(request: Any) -> str:
    await anyio.lowlevel.checkpoint()
    raise ResolverError(request)


@pytest.mark.parametrize(
    ("resolver", "error"),
    [
        (_raising, ResolverError),
        (_raising_async, ResolverError),
        (lambda request: 42, TypeError),
        (lambda request: {b"bytes": 1.0}, TypeError),
        (lambda request: b"bytes", TypeError),
        (lambda request: {"neg": -1.0}, ValueError),
        (lambda request: {"nan": math.nan}, ValueError),
        (lambda request: [], ValueError),
        (lambda request: {"big": 11.0}, ValueError),
    ],
)
async def test_resolver_errors_reach_the_caller_and_leak_nothing(
    resolver: Callable[[Any], Any], error: type[Exception]
) -> None:
    limiter = Limiter(default=ScopePolicy(concurrency=1, quota=10.0), resolver=resolver)
    holder = limiter.acquire_nowait(scopes="held")
    with pytest.raises(error):
        async with limiter.acquire("https://a.example/"):
            pytest.fail("the block must not run")
    stats = limiter.statistics()
    assert stats.in_flight == 1
    assert stats.waiting == 0
    holder.release()
    assert_idle(limiter)
    async with limiter.acquire(scopes="still-works"):
        pass


@pytest.mark.parametrize(
    ("scopes", "error", "match"),
    [
        ({1: 1.0}, TypeError, "scope names must be str"),
        ([1], TypeError, "scope names must be str"),
        ({"a": -1}, ValueError, "must be finite and >= 0"),
        ({"a": "1"}, TypeError, "must be a number"),
        ({"a": True}, TypeError, "must be a number"),
        ({"quota": 6.0}, ValueError, "exceeds its quota 5.0"),
        (set(), ValueError, "at least one scope"),
        (b"raw", TypeError, "not bytes"),
        (42, TypeError, "scopes must be"),
    ],
)
async def test_bad_scopes_are_rejected(scopes: Any, error: type[Exception], match: str) -> None:
    limiter = Limiter(scopes={"quota": ScopePolicy(quota=5.0)}, default=FREE)
    with pytest.raises(error, match=match):
        async with limiter.acquire(scopes=scopes):
            pass
    with pytest.raises(error, match=match):
        limiter.acquire_nowait(scopes=scopes)
    assert_idle(limiter)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"scopes": {"a": {}}}, TypeError, r"scopes\['a'\] must be a ScopePolicy"),
        ({"scopes": {1: ScopePolicy()}}, TypeError, "scopes keys must be str"),
        ({"default": {"delay": 1}}, TypeError, "default must be a ScopePolicy"),
        ({"concurrency": 0}, ValueError, "concurrency must be >= 1"),
        ({"concurrency": 2.5}, TypeError, "concurrency must be an int"),
        ({"max_waiters": -1}, ValueError, "max_waiters"),
        ({"max_scopes": None}, TypeError, "max_scopes"),
        ({"max_idle": 0}, ValueError, "max_idle"),
        ({"resolver": "by_host"}, TypeError, "resolver must be callable"),
        ({"robotstxt_max_delay": -1}, ValueError, "robotstxt_max_delay must be a finite number"),
        ({"robotstxt_max_delay": math.inf}, ValueError, "robotstxt_max_delay must be a finite"),
        ({"robotstxt_max_delay": "60"}, TypeError, "robotstxt_max_delay must be a number >= 0"),
    ],
)
def test_bad_limiter_arguments_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Limiter(**kwargs)


async def test_bad_acquire_arguments() -> None:
    limiter = Limiter()
    with pytest.raises(TypeError, match="priority must be an int"):
        limiter.acquire("https://a.example/", priority="high")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="priority must be an int"):
        limiter.acquire("https://a.example/", priority=True)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        limiter.acquire("https://a.example/", timeout=-1)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        limiter.acquire("https://a.example/", timeout=math.nan)
    with pytest.raises(TypeError, match="needs a request or scopes"):
        limiter.acquire()
    with pytest.raises(TypeError, match="needs a request or scopes"):
        limiter.acquire_nowait()
    with pytest.raises(TypeError, match=r"must be a URL string or have a \.url"):
        async with limiter.acquire(object()):
            pass
    assert_idle(limiter)


async def test_permit_misuse() -> None:
    limiter = Limiter(default=FREE)
    permit = limiter.acquire("https://a.example/")
    assert "not acquired" in repr(permit)
    for attempt in (lambda: permit.scopes, lambda: permit.granted_at, permit.record):
        with pytest.raises(RuntimeError):
            attempt()
    async with permit:
        assert "a.example" in repr(permit)
        with pytest.raises(RuntimeError, match="only once"):
            async with permit:
                pass
    permit.release()  # idempotent after the block
    assert_idle(limiter)


# -- feedback and statistics -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"status": "200"}, TypeError, r"status must be an int HTTP status code, got '200'"),
        ({"status": 200.0}, TypeError, "status must be an int"),
        ({"status": True}, TypeError, "status must be an int"),
        ({"status": 42}, ValueError, r"status must be an HTTP status code \(100-999\), got 42"),
        ({"exception": TimeoutError}, TypeError, "exception must be an exception instance"),
        ({"exception": "timeout"}, TypeError, "exception must be an exception instance"),
        ({"latency": "0.5"}, TypeError, "latency must be a number"),
        ({"latency": -1.0}, ValueError, "latency must be a finite number of seconds >= 0"),
        ({"latency": math.nan}, ValueError, "latency must be a finite number"),
        ({"latency": math.inf}, ValueError, "latency must be a finite number"),
        ({"size": 1.5}, TypeError, "size must be an int"),
        ({"size": -1}, ValueError, "size must be >= 0"),
    ],
)
async def test_record_rejects_bad_feedback(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    limiter = Limiter(default=FREE)
    async with limiter.acquire("https://a.example/") as permit:
        with pytest.raises(error, match=match):
            permit.record(**kwargs)
        assert not permit.recorded
        permit.record(status=200, latency=0.5, size=10, exception=TimeoutError())
    assert_idle(limiter)


@virtual
async def test_record_latency_and_consumed_quota() -> None:
    limiter = Limiter(
        scopes={"api": ScopePolicy(concurrency=None, delay=0, slot_delay=0, quota=10.0)}
    )
    async with limiter.acquire(scopes={"api": 4.0}) as permit:
        await anyio.sleep(0.25)
        feedback = permit.record(status=200)
        assert feedback.latency == pytest.approx(0.25)
        assert feedback.status == 200
        assert permit.recorded
        explicit = permit.record(httpx.Response(503), latency=1.5, consumed={"api": 1.0})
        assert explicit.status == 503
        assert explicit.latency == 1.5
    scope = limiter.statistics().scopes["api"]
    assert scope.quota_used == 1.0
    assert scope.quota_left == 9.0
    await anyio.sleep(60)
    assert limiter.statistics().scopes["api"].quota_used == 0.0


@virtual
async def test_an_explicit_policy_means_what_it_says() -> None:
    """``concurrency=8, delay=0``: 40 tasks of 10 ms take 50 ms (no hidden slot delay)."""
    limiter = Limiter(default=ScopePolicy(concurrency=8, delay=0))

    async def task() -> None:
        async with limiter.acquire("https://a.example/"):
            await anyio.sleep(0.01)

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(40):
            tg.start_soon(task)
    assert anyio.current_time() - start == pytest.approx(0.05)


@virtual
@pytest.mark.parametrize(("retry_after", "waited"), [("500", 500.0), ("3600", 600.0)])
async def test_retry_after_is_capped_by_backoff_max_delay_only(
    retry_after: str, waited: float
) -> None:
    """``Backoff.max_delay`` is the cap of a server-requested wait, whatever its size."""
    policy = ScopePolicy(concurrency=1, delay=0, backoff=throttlekit.Backoff(max_delay=600.0))
    limiter = Limiter(default=policy)
    async with limiter.acquire("https://a.example/") as permit:
        permit.record(status=429, headers={"Retry-After": retry_after})
    start = anyio.current_time()
    async with limiter.acquire("https://a.example/") as permit:
        assert permit.granted_at - start == pytest.approx(waited)


async def test_statistics_snapshot() -> None:
    limiter = Limiter(
        scopes={"api": ScopePolicy(concurrency=2, delay=0.5, quota=3.0)}, concurrency=8
    )
    async with limiter.acquire(scopes={"api": 2.0}):
        stats = limiter.statistics()
        assert stats.in_flight == 1
        assert stats.concurrency == 8
        api = stats.scopes["api"]
        assert (api.in_flight, api.concurrency, api.delay) == (1, 2, 0.5)
        assert (api.quota, api.quota_used, api.quota_left) == (3.0, 2.0, 1.0)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            stats.in_flight = 0  # type: ignore[misc]
    assert "in_flight=0/8" in repr(limiter)
    assert_idle(limiter)


@virtual
async def test_contended_waiters_leave_no_tickets_behind() -> None:
    """Waiters that never needed the timer must not stay referenced (memory is bounded)."""
    limiter = Limiter(default=ONE)
    async with anyio.create_task_group() as tg:
        for _ in range(500):
            tg.start_soon(_hold, limiter, "https://a.example/", 0)
    assert_idle(limiter)
    assert live_tickets() == 0


@virtual
async def test_set_policy_applies_to_waiting_requests_at_once() -> None:
    limiter = Limiter(default=ONE)
    grants: list[float] = []

    async def request() -> None:
        async with limiter.acquire("https://a.example/") as permit:
            grants.append(permit.granted_at)
            await anyio.sleep(10)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(request)
        await anyio.sleep(1)
        assert grants == [0.0]
        limiter.set_policy("a.example", ScopePolicy(concurrency=3, delay=0, slot_delay=0))
        await until(lambda: len(grants) == 3)
        assert grants == [0.0, 1.0, 1.0], "raising concurrency grants waiters without a release"
        assert limiter.policy("a.example").concurrency == 3
        assert "a.example" in limiter.policies
        with pytest.raises(TypeError, match="must be a ScopePolicy"):
            limiter.set_policy("a.example", {"concurrency": 3})  # type: ignore[arg-type]
    assert grants[3] == 10.0
    assert_idle(limiter)


def test_the_fast_path_calls_only_the_fast_lane() -> None:
    """An operation count, not a timing: on asyncio, an uncontended acquire+release
    of a known scope runs acquire(), __aenter__ and __aexit__, and the shared fast
    lane's take and give_back (its one owner, for both drivers), and no other
    Python function."""
    limiter = Limiter(concurrency=None, default=FREE)
    url = "https://calls.example/page"
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_qualname)

    async def run() -> None:
        async with limiter.acquire(url):  # the general path: the scope is new
            pass
        for request, scopes in ((url, None), ("https://calls.example/other", None)):
            async with limiter.acquire(request, scopes=scopes):
                pass  # a known URL, then a new URL of the known scope
        sys.setprofile(profile)
        try:
            async with limiter.acquire(url):
                pass
            async with limiter.acquire(scopes="calls.example"):
                pass
            with limiter.acquire_nowait(url):
                pass
        finally:
            sys.setprofile(None)

    asyncio.run(run())
    assert calls == [
        "Limiter.acquire",
        "MemoryPermit.__aenter__",
        "FastLane.take",
        "MemoryPermit.__aexit__",
        "FastLane.give_back",
        "Limiter.acquire",
        "MemoryPermit.__aenter__",
        "FastLane.take",
        "MemoryPermit.__aexit__",
        "FastLane.give_back",
        "Limiter.acquire_nowait",
        "Limiter.acquire",
        "MemoryPermit._enter_nowait",
        "FastLane.take",
        "Permit.__enter__",
        "Permit.__exit__",
        "MemoryPermit.release",
        "FastLane.give_back",
    ]


def test_the_fast_path_reads_the_clock_of_the_loop_that_runs_it() -> None:
    """The clock of the loop found running last is kept for the fast path; a
    virtual-time loop run afterwards in the same thread still gets its own clock."""
    from throttlekit.testing import VirtualEventLoop

    limiter = Limiter(concurrency=None, default=ScopePolicy(concurrency=None, delay=0))

    async def send_twice(url: str) -> list[float]:
        granted = []
        for _ in range(2):  # the second one takes the fast path (the scope exists)
            async with limiter.acquire(url) as permit:
                granted.append(permit.granted_at)
            await asyncio.sleep(1.0)
        return granted

    real = asyncio.run(send_twice("https://real.example/"))
    assert real[1] - real[0] >= 1.0
    loop = VirtualEventLoop()
    try:
        assert loop.run_until_complete(send_twice("https://virtual.example/")) == [0.0, 1.0]
    finally:
        loop.close()
    assert asyncio.run(send_twice("https://real.example/"))[0] > real[1]
