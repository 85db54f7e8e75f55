"""Tests for :class:`throttlekit.ScopePolicy`: defaults, normalization and validation."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throttlekit import Adaptive, ScopePolicy


def test_defaults() -> None:
    policy = ScopePolicy()
    assert policy.concurrency == 1
    assert policy.delay == 1.0
    assert policy.slot_delay == 0.0, "a policy limits only what it names"
    assert policy.jitter == (0.0, 0.0)
    assert policy.quota is None
    assert policy.window == 60.0
    assert policy.backoff is not None, "backoff is on by default"
    assert policy.autothrottle is None
    assert policy.rampup is None
    assert policy.controllers == ()


def test_an_adaptive_policy_without_a_delay_has_no_delay_ceiling() -> None:
    """``delay`` is Adaptive's ceiling: its default of 1 s held a scope of
    ``ScopePolicy(concurrency=16, adaptive=Adaptive())`` to 1 request/s."""
    adaptive = ScopePolicy(concurrency=16, adaptive=Adaptive())
    assert adaptive.delay == 0.0
    assert attrs.evolve(adaptive, adaptive=None).delay == 1.0, "not given: follows adaptive"
    assert attrs.evolve(ScopePolicy(), adaptive=Adaptive()).delay == 0.0
    assert ScopePolicy(delay=1.0, adaptive=Adaptive()).delay == 1.0, "given: kept"
    assert attrs.evolve(ScopePolicy(delay=1.0), adaptive=Adaptive()).delay == 1.0
    assert repr(adaptive.delay) == "0.0"
    assert ScopePolicy() == ScopePolicy(delay=1.0)


def test_an_adaptive_policy_without_a_delay_reaches_the_servers_rate() -> None:
    from throttlekit.testing import QuotaServer, burst, simulate

    server = QuotaServer(limit=10, window=1.0, sliding=True, retry_after=1)
    policy = ScopePolicy(concurrency=16, adaptive=Adaptive())
    trace = simulate(policy, server, burst("https://api.example/{i}", 1200), duration=60)
    assert trace.count(status=200) / 60 > 8.0  # was 1/s


def test_frozen_keyword_only_hashable_and_evolvable() -> None:
    policy = ScopePolicy(concurrency=4, delay=0.25)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        policy.delay = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        ScopePolicy(4)  # type: ignore[misc]
    assert ScopePolicy(concurrency=4, delay=0.25) == policy
    assert hash(ScopePolicy(concurrency=4, delay=0.25)) == hash(policy)
    assert {policy: "usable as a key"}[ScopePolicy(concurrency=4, delay=0.25)]
    slower = attrs.evolve(policy, delay=1.0)
    assert (slower.concurrency, slower.delay) == (4, 1.0)
    with pytest.raises(ValueError, match=r"^delay must be"):
        attrs.evolve(policy, delay=-1)


@pytest.mark.parametrize(
    ("jitter", "expected"),
    [
        (0, (0.0, 0.0)),
        (0.0, (0.0, 0.0)),
        (None, (0.0, 0.0)),
        (False, (0.0, 0.0)),
        (True, (-0.5, 0.5)),
        (0.5, (-0.5, 0.5)),
        (0.25, (-0.25, 0.25)),
        ((-0.1, 0.3), (-0.1, 0.3)),
        ([-0.1, 0.3], (-0.1, 0.3)),
        ((0.2, 0.2), (0.2, 0.2)),
        ((0, 2), (0.0, 2.0)),
        ((None, 0.5), (0.0, 0.5)),
    ],
)
def test_jitter_is_normalized_to_a_pair(jitter: Any, expected: tuple[float, float]) -> None:
    assert ScopePolicy(jitter=jitter).jitter == expected


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("concurrency", 0, ValueError, "concurrency must be >= 1 or None"),
        ("concurrency", -3, ValueError, "concurrency must be >= 1 or None"),
        ("concurrency", 1.5, TypeError, "concurrency must be an int"),
        ("concurrency", "2", TypeError, "concurrency must be an int"),
        ("concurrency", True, TypeError, "concurrency must be an int"),
        ("delay", -0.1, ValueError, "delay must be a finite number >= 0"),
        ("delay", math.inf, ValueError, "delay must be a finite number >= 0"),
        ("delay", math.nan, ValueError, "delay must be a finite number >= 0"),
        ("delay", "1", TypeError, "delay must be a number"),
        ("delay", None, TypeError, "delay must be a number"),
        ("delay", False, TypeError, "delay must be a number"),
        ("slot_delay", -1, ValueError, "slot_delay must be a finite number >= 0"),
        ("slot_delay", "0", TypeError, "slot_delay must be a number"),
        ("jitter", 1.0, ValueError, r"jitter must be in \[0, 1\)"),
        ("jitter", 1.5, ValueError, r"jitter must be in \[0, 1\)"),
        ("jitter", -0.1, ValueError, "jitter must be a finite number >= 0"),
        ("jitter", math.nan, ValueError, "jitter must be a finite number"),
        ("jitter", (0.5, 0.1), ValueError, "jitter pair .* needs -1 < low <= high"),
        ("jitter", (-1.0, 0.0), ValueError, "jitter pair .* needs -1 < low <= high"),
        ("jitter", (0.0, math.inf), ValueError, "jitter must be a finite number"),
        ("jitter", (True, 0.1), TypeError, "jitter pair must hold numbers"),
        ("jitter", ("a", 0.1), TypeError, "jitter must be a number"),
        ("jitter", (0.1, 0.2, 0.3), TypeError, "jitter must be a number, a .low, high. pair"),
        ("jitter", "0.5", TypeError, "jitter must be a number, a .low, high. pair"),
        ("quota", 0, ValueError, "quota must be a finite number > 0"),
        ("quota", -5, ValueError, "quota must be a finite number > 0"),
        ("quota", math.inf, ValueError, "quota must be a finite number > 0"),
        ("quota", "100", TypeError, "quota must be a number"),
        ("window", 0, ValueError, "window must be a finite number > 0"),
        ("window", None, TypeError, "window must be a number"),
        ("backoff", True, TypeError, "backoff"),
        ("autothrottle", "on", TypeError, "autothrottle"),
        ("rampup", 1, TypeError, "rampup"),
        ("ignore_robots_txt", "yes", TypeError, "ignore_robots_txt"),
        ("controllers", [42], TypeError, "must be callable"),
        ("controllers", 42, TypeError, "not iterable"),
    ],
)
def test_invalid_values_raise_naming_the_field(
    field: str, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ScopePolicy(**{field: value})


@settings(deadline=None, max_examples=200)
@given(
    concurrency=st.one_of(st.none(), st.integers(1, 10_000)),
    delay=st.floats(0, 1e6),
    slot_delay=st.integers(0, 3600),
    jitter=st.one_of(
        st.floats(0, 0.999),
        st.tuples(st.floats(-0.999, 5), st.floats(0, 5)).map(lambda p: (p[0], p[0] + p[1])),
    ),
    quota=st.one_of(st.none(), st.floats(1e-6, 1e9), st.integers(1, 10**9)),
    window=st.floats(1e-3, 1e7),
)
def test_every_valid_policy_is_accepted_and_stored_as_floats(
    concurrency: int | None,
    delay: float,
    slot_delay: int,
    jitter: Any,
    quota: float | None,
    window: float,
) -> None:
    policy = ScopePolicy(
        concurrency=concurrency,
        delay=delay,
        slot_delay=slot_delay,
        jitter=jitter,
        quota=quota,
        window=window,
    )
    assert policy.concurrency == concurrency
    assert policy.delay == delay
    assert policy.slot_delay == slot_delay
    low, high = policy.jitter
    assert -1.0 < low <= high
    assert all(type(bound) is float for bound in policy.jitter)
    assert policy.quota == quota
    assert policy.window == window
    assert attrs.evolve(policy) == policy
