"""max_stall: a scope that cannot send for longer than that fails fast (virtual time)."""

from __future__ import annotations

import anyio
import pytest

import throttlekit
from throttlekit import ScopePolicy, ScopeStalled, ThrottlekitError

virtual = pytest.mark.parametrize("anyio_backend", ["trio_virtual"], indirect=True)

URL = "https://api.example/v1"
SCOPE = "api.example"


def limiter(**policy: object) -> throttlekit.Limiter:
    fields = {"concurrency": None, "delay": 0, "max_stall": 10.0, **policy}
    return throttlekit.Limiter(default=ScopePolicy(**fields))  # type: ignore[arg-type]


@virtual
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
    assert SCOPE in str(error)
    assert "max_stall of 10 s" in str(error)


@virtual
@pytest.mark.anyio
async def test_a_short_block_is_waited_for() -> None:
    limits = limiter()
    async with limits.acquire(URL) as permit:
        permit.record(status=429, headers={"Retry-After": "5"})
    start = anyio.current_time()
    async with limits.acquire(URL):
        pass
    assert anyio.current_time() - start == pytest.approx(5.0, abs=0.01)


@virtual
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


@virtual
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


@virtual
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
