"""Budgets the server reports (requests, tokens) reach the scope that tracks each one."""

from __future__ import annotations

import pytest

import throttlekit

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio_virtual"], indirect=True),
]

FREE = throttlekit.ScopePolicy(concurrency=None, delay=0, slot_delay=0)
HOST = "api.example.com"
TOKENS = "example-tokens"

#: OpenAI-style headers: requests are plentiful, two 1000-token requests are left, and
#: the token bucket is full again in 6 s (28 requests' worth refill in 6 s).
TOKENS_LOW = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "50",
    "x-ratelimit-reset-requests": "10s",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "2000",
    "x-ratelimit-reset-tokens": "6s",
}
#: The other way round: requests nearly spent, tokens plentiful.
REQUESTS_LOW = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "2",
    "x-ratelimit-reset-requests": "8s",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "29000",
    "x-ratelimit-reset-tokens": "1s",
}


def delays(limiter: throttlekit.Limiter) -> dict[str, float]:
    stats = limiter.statistics().scopes
    return {name: stats[name].delay for name in (HOST, TOKENS)}


async def record_once(headers: dict[str, str], budgets: dict[str, str] | None) -> dict[str, float]:
    limiter = throttlekit.Limiter(default=FREE)
    async with limiter.acquire(scopes={HOST: 1, TOKENS: 1000}) as permit:
        permit.record(status=200, headers=headers, budgets=budgets)
    return delays(limiter)


async def test_low_tokens_slow_the_token_scope_only() -> None:
    found = await record_once(TOKENS_LOW, {"tokens": TOKENS})
    # Two requests of 1000 tokens left: paced at the refill, 28 requests' worth in 6 s.
    assert found == {HOST: 0.0, TOKENS: pytest.approx(6 / 28)}


async def test_low_requests_slow_the_request_scope_only() -> None:
    found = await record_once(REQUESTS_LOW, {"tokens": TOKENS})
    assert found == {HOST: pytest.approx(8 / 58), TOKENS: 0.0}  # 58 refill in 8 s


async def test_without_a_mapping_every_scope_sees_the_most_restrictive_budget() -> None:
    found = await record_once(REQUESTS_LOW, None)
    assert found == {HOST: pytest.approx(8 / 58), TOKENS: pytest.approx(8 / 58)}


async def test_spent_tokens_block_the_token_scope_until_their_reset() -> None:
    limiter = throttlekit.Limiter(default=FREE)
    spent = {**TOKENS_LOW, "x-ratelimit-remaining-tokens": "400"}
    async with limiter.acquire(scopes={HOST: 1, TOKENS: 1000}) as permit:
        permit.record(status=200, headers=spent, budgets={"tokens": TOKENS})
        granted = permit.granted_at
    stats = limiter.statistics().scopes
    assert stats[TOKENS].blocked_until == pytest.approx(granted + 6.0, abs=0.1)
    assert stats[HOST].blocked_until == -float("inf")
    # A request that needs only the host scope is not held back.
    with limiter.acquire_nowait(scopes={HOST: 1}):
        pass


async def test_consumed_is_reconciled_once_with_budgets() -> None:
    limiter = throttlekit.Limiter(
        default=FREE, scopes={TOKENS: throttlekit.ScopePolicy(concurrency=None, quota=10_000)}
    )
    async with limiter.acquire(scopes={HOST: 1, TOKENS: 1000}) as permit:
        permit.record(
            status=200, headers=TOKENS_LOW, budgets={"tokens": TOKENS}, consumed={TOKENS: 250}
        )
    assert limiter.statistics().scopes[TOKENS].quota_used == 250.0


async def test_budgets_with_record_scopes_only_reach_those_scopes() -> None:
    limiter = throttlekit.Limiter(default=FREE)
    async with limiter.acquire(scopes={HOST: 1, TOKENS: 1000}) as permit:
        permit.record(status=200, headers=TOKENS_LOW, budgets={"tokens": TOKENS}, scopes=[HOST])
    assert delays(limiter) == {HOST: 0.0, TOKENS: 0.0}
