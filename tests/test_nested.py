"""Acquires nested in a permit that the same task holds: no second global slot, no deadlock."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

import throttlekit

pytestmark = pytest.mark.anyio

FREE = throttlekit.ScopePolicy(concurrency=None, delay=0, slot_delay=0)
HOST = "api.example.com"
URL = f"https://{HOST}/v1/chat/completions"

both_backends = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"], indirect=True)
virtual = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio_virtual"], indirect=True)


@both_backends
async def test_budget_around_a_host_acquire_with_the_global_cap_saturated() -> None:
    # 50 tasks, a global cap of 16: each outer permit holds a slot while its
    # inner acquire (the transport's, in real use) needs the host scope.
    limiter = throttlekit.Limiter(default=FREE, concurrency=16)
    peak = 0
    done = 0

    async def call() -> None:
        nonlocal peak, done
        async with limiter.acquire(scopes={"budget": 1}):
            await anyio.lowlevel.checkpoint()
            async with limiter.acquire(URL) as inner:
                assert inner.scopes == {HOST: 1.0}
                peak = max(peak, limiter.statistics().in_flight)
                await anyio.sleep(0.001)
        done += 1

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(50):
                group.start_soon(call)
    assert done == 50
    assert peak <= 16
    assert limiter.statistics().in_flight == 0


@both_backends
async def test_nested_acquire_of_held_scopes_takes_nothing() -> None:
    policy = throttlekit.ScopePolicy(concurrency=1, delay=60.0)
    limiter = throttlekit.Limiter(default=policy, concurrency=1)
    with anyio.fail_after(5):
        async with limiter.acquire(URL) as outer, limiter.acquire(URL) as inner:
            # Neither the scope's concurrency of 1, nor its 60 s delay, nor the
            # global cap of 1 stands in the way: the outer permit holds them.
            assert outer.scopes == {HOST: 1.0}
            assert inner.scopes == {}
            assert inner.granted_at == outer.granted_at
            assert limiter.statistics().in_flight == 1
    assert limiter.statistics().in_flight == 0


@both_backends
async def test_only_the_scopes_not_held_are_added() -> None:
    tight = throttlekit.ScopePolicy(concurrency=1, delay=0, slot_delay=0)
    limiter = throttlekit.Limiter(default=FREE, scopes={"tokens": tight}, concurrency=1)
    async with limiter.acquire(scopes={HOST: 1, "budget": 1}):
        async with limiter.acquire(scopes={HOST: 1, "tokens": 500}) as inner:
            assert inner.scopes == {"tokens": 500.0}
            stats = limiter.statistics()
            assert (stats.in_flight, stats.scopes["tokens"].in_flight) == (1, 1)
            assert stats.scopes[HOST].in_flight == 1
        assert limiter.statistics().scopes["tokens"].in_flight == 0
    assert limiter.statistics().in_flight == 0


@virtual
async def test_added_scopes_keep_their_limits() -> None:
    # Two outer permits nest an acquire of a scope with concurrency 1: the
    # second waits for the first inner permit, not for the outer ones.
    tight = throttlekit.ScopePolicy(concurrency=1, delay=0, slot_delay=0)
    limiter = throttlekit.Limiter(default=FREE, scopes={"tokens": tight})
    inside: list[float] = []

    async def call(name: str) -> None:
        async with limiter.acquire(scopes={name: 1}), limiter.acquire(scopes={"tokens": 1}):
            inside.append(anyio.current_time())
            await anyio.sleep(1.0)

    start = anyio.current_time()
    async with anyio.create_task_group() as group:
        group.start_soon(call, "a")
        group.start_soon(call, "b")
    assert [at - start for at in sorted(inside)] == pytest.approx([0.0, 1.0], abs=0.05)


@both_backends
async def test_tasks_started_inside_a_permit_are_not_nested() -> None:
    # A child task copies the context but is another task: it needs its own slot.
    limiter = throttlekit.Limiter(default=FREE, concurrency=1)
    order: list[str] = []

    async def child() -> None:
        async with limiter.acquire(scopes={"other": 1}):
            order.append("child")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group, limiter.acquire(scopes={"budget": 1}):
            group.start_soon(child)
            await anyio.sleep(0.05)
            order.append("parent")
    assert order == ["parent", "child"]


@both_backends
async def test_feedback_on_a_shared_scope_reaches_the_enclosing_permit() -> None:
    limiter = throttlekit.Limiter(default=FREE)
    async with limiter.acquire(URL), limiter.acquire(URL) as inner:
        inner.record(status=429, headers={"Retry-After": "30"})
    stats = limiter.statistics().scopes[HOST]
    assert stats.last_signal == "429"
    assert stats.blocked_until > anyio.current_time() + 20


@both_backends
async def test_after_the_block_acquires_are_not_nested() -> None:
    limiter = throttlekit.Limiter(default=FREE, concurrency=1)
    async with limiter.acquire(scopes={"budget": 1}):
        pass
    with limiter.acquire_nowait(scopes={"budget": 1}), pytest.raises(throttlekit.WouldBlock):
        # The first block is over: this one holds the only global slot.
        limiter.acquire_nowait(scopes={"other": 1})


@both_backends
async def test_nested_acquire_on_another_limiter_is_independent() -> None:
    first = throttlekit.Limiter(default=FREE, concurrency=1)
    second = throttlekit.Limiter(default=FREE, concurrency=1)
    async with first.acquire(URL), second.acquire(URL) as inner:
        assert inner.scopes == {HOST: 1.0}
        assert second.statistics().in_flight == 1


@both_backends
async def test_permits_granted_on_the_fast_path_nest_like_any_other() -> None:
    # Once the scope exists, acquires of it take the in-memory fast path, which
    # keeps a permit held alone outside the per-task table: nesting, another
    # task's acquire and leaving in any order must behave as on the general path.
    limiter = throttlekit.Limiter(default=FREE)
    async with limiter.acquire(URL):
        pass  # the scope exists from now on
    inside: dict[str, dict[str, float]] = {}

    async def other_task() -> None:
        async with limiter.acquire(URL) as other:
            inside["other"] = other.scopes
            async with limiter.acquire(URL) as nested:
                inside["other nested"] = nested.scopes

    async with limiter.acquire(URL) as outer:
        async with limiter.acquire(URL) as inner:
            assert (outer.scopes, inner.scopes) == ({HOST: 1.0}, {})
            assert limiter.statistics().in_flight == 1
        async with anyio.create_task_group() as group:
            group.start_soon(other_task)
        assert inside == {"other": {HOST: 1.0}, "other nested": {}}
        async with limiter.acquire(URL) as again:  # still nested after all that
            assert again.scopes == {}
        # Left out of order: the outer block first, then the one entered inside it.
        late = limiter.acquire(URL)
        await late.__aenter__()
        assert late.scopes == {}
    assert limiter.statistics().in_flight == 0
    await late.__aexit__(None, None, None)
    async with limiter.acquire(URL) as after:  # nothing is held: not nested
        assert after.scopes == {HOST: 1.0}
    assert limiter.statistics().in_flight == 0
    assert limiter._lane.holds is None


@both_backends
async def test_many_tasks_nesting_at_random_with_cancellations_leave_nothing_held() -> None:
    # 60 tasks, each entering permits nested up to three deep on two hosts (the
    # fast path and the general path alike, as held permits come and go), some
    # cancelled at a random point: an acquire inside a block of its own task
    # always nests (it takes no scope the block holds), and once all are done
    # nothing is in flight and nothing is held.
    import random

    rng = random.Random(7)
    limiter = throttlekit.Limiter(
        default=throttlekit.ScopePolicy(concurrency=3, delay=0, slot_delay=0), concurrency=8
    )
    urls = [f"https://h{i}.example.com/page" for i in range(2)]
    wrong: list[str] = []

    async def nest(depth: int, held: set[str], first: int) -> None:
        # Hosts in one order only (h0 before h1), as with locks: a task holding
        # h1 that waits for h0 while another holds h0 and waits for h1 would
        # deadlock on any limiter.
        index = rng.randrange(first, len(urls))
        url = urls[index]
        async with limiter.acquire(url) as permit:
            host = url.split("/")[2]
            if host in held and permit.scopes:
                wrong.append(f"{host} held, yet taken again: {permit.scopes}")
            for _ in range(rng.randrange(3)):
                await anyio.lowlevel.checkpoint()
            if depth < 3 and rng.random() < 0.6:
                await nest(depth + 1, held | {host}, index)

    async def task() -> None:
        for _ in range(20):
            with anyio.CancelScope() as scope:
                if rng.random() < 0.3:
                    scope.deadline = anyio.current_time() + rng.random() * 0.002
                await nest(1, set(), 0)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for _ in range(60):
                group.start_soon(task)
    assert wrong == []
    assert limiter.statistics().in_flight == 0
    assert limiter._lane.holds is None
