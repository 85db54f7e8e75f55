"""max_stall: a scope that cannot send for longer than that fails fast (virtual time).

Every async test runs on asyncio (:class:`~throttlekit.testing.VirtualEventLoop`)
and on trio (``MockClock``), both in virtual time.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from _virtual import AnyioBackend, backend, until

import throttlekit
from throttlekit import ScopePolicy, ScopeStalled, ThrottlekitError


@pytest.fixture(params=["asyncio_virtual", "trio_virtual"])
def anyio_backend(request: pytest.FixtureRequest) -> AnyioBackend:
    """Virtual time on both backends."""
    return backend(str(request.param))


URL = "https://api.example/v1"
SCOPE = "api.example"


def limiter(**policy: object) -> throttlekit.Limiter:
    fields = {"concurrency": None, "delay": 0, "max_stall": 10.0, **policy}
    return throttlekit.Limiter(default=ScopePolicy(**fields))  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_long_server_block_fails_fast_naming_scope_reason_and_reopening() -> None:
    limits = limiter()
    async with limits.acquire(URL) as permit:
        permit.record(status=429, headers={"Retry-After": "3600"})
    start = anyio.current_time()
    with pytest.raises(ScopeStalled) as caught:
        async with limits.acquire(URL):
            pytest.fail("sent into a blocked scope")
    error = caught.value
    assert isinstance(error, ThrottlekitError)
    assert anyio.current_time() == start  # no waiting at all
    assert error.scope == SCOPE
    assert "server asked to wait" in error.reason
    # Retry-After is capped by the backoff's max_delay (300 s).
    assert error.wait == pytest.approx(300.0)
    assert error.reopens_at == pytest.approx(start + 300.0)
    assert error.max_stall == 10.0
    assert SCOPE in str(error)
    assert "max_stall of 10 s" in str(error)


@pytest.mark.anyio
async def test_a_short_block_is_waited_for() -> None:
    limits = limiter()
    async with limits.acquire(URL) as permit:
        permit.record(status=429, headers={"Retry-After": "5"})
    start = anyio.current_time()
    async with limits.acquire(URL):
        pass
    assert anyio.current_time() - start == pytest.approx(5.0, abs=0.01)


@pytest.mark.anyio
async def test_a_spent_quota_fails_fast_until_its_window_frees() -> None:
    limits = limiter(quota=2, window=60.0)
    for _ in range(2):
        async with limits.acquire(URL):
            pass
    with pytest.raises(ScopeStalled, match="quota of 2 per 60 s") as caught:
        async with limits.acquire(URL):
            pass
    assert caught.value.wait == pytest.approx(60.0)
    await anyio.sleep(50.5)  # 9.5 s left: within max_stall, so it waits
    start = anyio.current_time()
    async with limits.acquire(URL):
        pass
    assert anyio.current_time() - start == pytest.approx(9.5, abs=0.01)


@pytest.mark.anyio
async def test_only_scopes_with_max_stall_give_up() -> None:
    limits = throttlekit.Limiter(
        default=ScopePolicy(concurrency=None, delay=0),
        scopes={"budget": ScopePolicy(concurrency=None, delay=0, quota=1, window=30.0)},
    )
    async with limits.acquire(scopes={"budget": 1}):
        pass
    with anyio.fail_after(40):
        async with limits.acquire(scopes={"budget": 1}):
            pass  # no max_stall: it waited 30 s


@pytest.mark.anyio
async def test_a_full_scope_is_no_stall() -> None:
    limits = limiter(concurrency=1, max_stall=0.5)
    async with anyio.create_task_group() as tasks, limits.acquire(URL):
        tasks.start_soon(lambda: _acquire(limits))
        await anyio.sleep(2.0)
    # The waiter waited 2 s for a release: concurrency is not a stall.


async def _acquire(limits: throttlekit.Limiter) -> None:
    async with limits.acquire(URL):
        pass


def test_max_stall_is_validated() -> None:
    with pytest.raises(ValueError, match="max_stall"):
        ScopePolicy(max_stall=0)
    with pytest.raises((TypeError, ValueError), match="max_stall"):
        ScopePolicy(max_stall="10")  # type: ignore[arg-type]


def test_max_stall_from_settings() -> None:
    limits = throttlekit.Limiter.from_settings({"THROTTLING_SCOPES": {SCOPE: {"max_stall": 5}}})
    assert limits.policy(SCOPE).max_stall == 5.0
    assert limits.default.max_stall is None


# -- requests already waiting when the scope stalls ---------------------------------------------


def assert_idle(limits: throttlekit.Limiter) -> None:
    """Nothing held, nothing waiting: every slot and ticket came back."""
    stats = limits.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0), stats
    for name, scope in stats.scopes.items():
        assert (scope.in_flight, scope.waiting) == (0, 0), (name, scope)


async def _outcome(
    limits: throttlekit.Limiter, url: str, outcomes: list[tuple[str, float]], **kwargs: Any
) -> None:
    """Acquire ``url`` and note how it ended ("sent" or "stalled") and when."""
    try:
        async with limits.acquire(url, **kwargs):
            outcomes.append(("sent", anyio.current_time()))
    except ScopeStalled as error:
        same = error.scope == throttlekit.scopes.by_host(url)
        outcomes.append(("stalled" if same else f"stalled on {error.scope}", anyio.current_time()))


@pytest.mark.anyio
async def test_waiters_give_up_when_feedback_blocks_their_scope() -> None:
    limits = limiter(concurrency=1)
    other = "https://other.example/"
    outcomes: list[tuple[str, float]] = []
    others: list[tuple[str, float]] = []
    async with anyio.create_task_group() as tasks, limits.acquire(URL) as permit:
        holder = limits.acquire_nowait(other)
        for _ in range(5):
            tasks.start_soon(_outcome, limits, URL, outcomes)
            tasks.start_soon(_outcome, limits, other, others)
        await until(lambda: limits.statistics().waiting == 10)
        await anyio.sleep(1.0)
        permit.record(status=429, headers={"Retry-After": "3600"})
        # The waiters of the blocked scope wake and give up at once,
        # even though the 429's own permit still holds the scope.
        await until(lambda: len(outcomes) == 5)
        holder.release()
    assert outcomes == [("stalled", 1.0)] * 5
    # The other scope's waiters were not disturbed: sent one by one.
    assert [kind for kind, _ in others] == ["sent"] * 5
    assert_idle(limits)


@pytest.mark.anyio
async def test_waiters_queued_on_the_global_cap_or_another_scope_give_up_too() -> None:
    policy = ScopePolicy(concurrency=None, delay=0, max_stall=10.0)
    limits = throttlekit.Limiter(
        default=policy, scopes={"pool": ScopePolicy(concurrency=1, delay=0)}, concurrency=3
    )
    outcomes: list[tuple[str, float]] = []
    sent: list[tuple[str, float]] = []
    async with anyio.create_task_group() as tasks:
        blocker = limits.acquire_nowait(URL)
        holder = limits.acquire_nowait("https://other.example/")
        pool = limits.acquire_nowait(scopes="pool")
        for _ in range(3):  # queued on the global cap (full)
            tasks.start_soon(_outcome, limits, URL, outcomes)
        # Queued on the scope "pool" (full), and needing the blocked scope too.
        two = {"pool": 1.0, SCOPE: 1.0}

        async def both() -> None:
            try:
                async with limits.acquire(scopes=two):
                    outcomes.append(("sent", anyio.current_time()))
            except ScopeStalled:
                outcomes.append(("stalled", anyio.current_time()))

        tasks.start_soon(both)
        tasks.start_soon(_outcome, limits, "https://third.example/", sent)
        await until(lambda: limits.statistics().waiting == 5)
        blocker.record(status=503, headers={"Retry-After": "120"})
        await until(lambda: len(outcomes) == 4)
        assert outcomes == [("stalled", 0.0)] * 4
        blocker.release()  # the third scope's waiter goes now
        await until(lambda: len(sent) == 1)
        holder.release()
        pool.release()
    assert sent == [("sent", 0.0)]
    assert_idle(limits)


@pytest.mark.anyio
async def test_a_waiter_whose_block_is_short_keeps_waiting() -> None:
    limits = limiter(concurrency=1)
    outcomes: list[tuple[str, float]] = []
    async with anyio.create_task_group() as tasks, limits.acquire(URL) as permit:
        for _ in range(2):
            tasks.start_soon(_outcome, limits, URL, outcomes)
        await until(lambda: limits.statistics().waiting == 2)
        permit.record(status=429, headers={"Retry-After": "5"})
    # The first at the end of the block, the next after the backoff's delay (>= 1 s).
    assert [kind for kind, _ in outcomes] == ["sent", "sent"]
    assert outcomes[0][1] == pytest.approx(5.0)
    assert 5.9 < outcomes[1][1] < 10.0
    assert_idle(limits)


@pytest.mark.anyio
async def test_waiters_give_up_when_a_grant_spends_the_quota() -> None:
    limits = limiter(concurrency=1, quota=2, window=60.0)
    outcomes: list[tuple[str, float]] = []

    async def hold(seconds: float) -> None:
        async with limits.acquire(URL):
            outcomes.append(("sent", anyio.current_time()))
            await anyio.sleep(seconds)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(hold, 1.0)
        await until(lambda: limits.statistics().in_flight == 1)
        tasks.start_soon(hold, 1.0)
        await until(lambda: limits.statistics().waiting == 1)
        for _ in range(3):
            tasks.start_soon(_outcome, limits, URL, outcomes)
        await until(lambda: limits.statistics().waiting == 4)
    # The second send, at 1 s, spent the quota until 60 s: the others gave up then.
    assert outcomes == [("sent", 0.0), ("sent", 1.0)] + [("stalled", 1.0)] * 3
    assert_idle(limits)
    await anyio.sleep(60.0)
    async with limits.acquire(URL):
        pass


@pytest.mark.anyio
async def test_a_stalled_waiter_with_a_timeout_raises_scope_stalled() -> None:
    limits = limiter(concurrency=1)
    async with anyio.create_task_group() as tasks, limits.acquire(URL) as permit:
        caught: list[BaseException] = []

        async def wait() -> None:
            try:
                async with limits.acquire(URL, timeout=30.0):
                    pass
            except ThrottlekitError as error:
                caught.append(error)

        tasks.start_soon(wait)
        await until(lambda: limits.statistics().waiting == 1)
        permit.record(status=429, headers={"Retry-After": "600"})
        await until(lambda: bool(caught))
    assert type(caught[0]) is ScopeStalled
    assert anyio.current_time() == 0.0
    assert_idle(limits)


@pytest.mark.anyio
async def test_a_nested_waiter_gives_up_and_the_enclosing_permit_stays_held() -> None:
    limits = throttlekit.Limiter(
        default=ScopePolicy(concurrency=1, delay=0),
        scopes={"budget": ScopePolicy(concurrency=None, delay=0)},
    )
    limits.set_policy(SCOPE, ScopePolicy(concurrency=1, delay=0, max_stall=10.0))
    async with anyio.create_task_group() as tasks, limits.acquire(URL) as permit:
        caught: list[BaseException] = []

        async def nested() -> None:
            async with limits.acquire(scopes={"budget": 1}) as outer:
                try:
                    async with limits.acquire(URL):
                        pass
                except ScopeStalled as error:
                    caught.append(error)
                assert outer.scopes == {"budget": 1.0}

        tasks.start_soon(nested)
        await until(lambda: limits.statistics().waiting == 1)
        permit.record(status=429, headers={"Retry-After": "3600"})
        await until(lambda: bool(caught))
    assert_idle(limits)


@pytest.mark.anyio
async def test_a_request_for_a_full_blocked_scope_fails_at_once() -> None:
    limits = limiter(concurrency=1)
    with limits.acquire_nowait(URL) as permit:
        permit.record(status=429, headers={"Retry-After": "3600"})
        with pytest.raises(ScopeStalled):
            async with limits.acquire(URL):
                pass
    assert_idle(limits)


@pytest.mark.anyio
async def test_cancelling_waiters_of_a_stalling_scope_leaks_nothing() -> None:
    limits = limiter(concurrency=1)
    outcomes: list[tuple[str, float]] = []
    async with limits.acquire(URL) as permit:
        with anyio.CancelScope() as cancelled:
            async with anyio.create_task_group() as tasks:
                for _ in range(3):
                    tasks.start_soon(_outcome, limits, URL, outcomes)
                await until(lambda: limits.statistics().waiting == 3)
                # Block the scope and cancel in the same step: the woken
                # waiters see the cancellation or the stall, never a grant.
                permit.record(status=429, headers={"Retry-After": "3600"})
                cancelled.cancel()
    assert all(kind == "stalled" for kind, _ in outcomes)
    assert_idle(limits)
