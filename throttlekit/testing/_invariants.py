"""Invariant checks: does a trace respect the policies it ran under?"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from typing import Literal

import attrs

from .._knock import Knock
from .._limiter import Limiter
from .._policy import ScopePolicy
from ..headers import parse as parse_headers
from ._trace import RequestRecord, Trace

__all__ = ["PolicyViolation", "Violation", "assert_respects", "check_respects"]

Rule = Literal["concurrency", "global-concurrency", "delay", "slot-delay", "quota", "retry-after"]

#: Absolute slack for float comparisons of virtual times (seconds).
_EPSILON = 1e-9


@attrs.frozen(kw_only=True)
class Violation:
    """One broken rule found in a trace.

    :param rule: ``"concurrency"``, ``"global-concurrency"``, ``"delay"``,
        ``"slot-delay"``, ``"quota"`` or ``"retry-after"``.
    :param scope: the scope (``None`` for the global cap).
    :param time: the virtual time of the offending send.
    :param requests: indexes (:attr:`RequestRecord.index`) of the requests involved,
        the offending one last.
    :param message: what happened, in words.
    """

    rule: Rule
    scope: str | None
    time: float
    requests: tuple[int, ...]
    message: str

    def __str__(self) -> str:
        return self.message


class PolicyViolation(AssertionError):
    """Raised by :func:`assert_respects`; ``violations`` lists every rule broken."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        shown = "\n".join(f"- {violation.message}" for violation in violations[:10])
        more = f"\n(and {len(violations) - 10} more)" if len(violations) > 10 else ""
        super().__init__(f"the trace breaks {len(violations)} rule(s):\n{shown}{more}")


PolicyLike = ScopePolicy | Mapping[str, ScopePolicy] | Limiter | None


def _t(value: float | None) -> str:
    return "never" if value is None else f"t={value:.6f}"


def _policy_lookup(trace: Trace, policy: PolicyLike) -> tuple[dict[str, ScopePolicy], int | None]:
    if policy is None:
        return dict(trace.policies), trace.concurrency
    if isinstance(policy, ScopePolicy):
        return {scope: policy for scope in trace.policies}, trace.concurrency
    if isinstance(policy, Limiter):
        return {scope: policy.policy(scope) for scope in trace.policies}, (
            policy.statistics().concurrency
        )
    if isinstance(policy, Mapping):
        policies = dict(trace.policies)
        for scope, value in policy.items():
            if not isinstance(value, ScopePolicy):
                raise TypeError(f"policy[{scope!r}] must be a ScopePolicy, got {value!r}")
            policies[scope] = value
        return policies, trace.concurrency
    raise TypeError(f"policy must be a ScopePolicy, a mapping of them or a Limiter, got {policy!r}")


def _lowest_jitter(policy: ScopePolicy) -> float:
    """The smallest delay factor the scope may apply (policy and backoff jitter)."""
    low = policy.jitter[0]
    backoff = getattr(policy, "backoff", None)
    backoff_jitter = getattr(backoff, "jitter", None)
    if backoff_jitter is not None:
        low = min(low, backoff_jitter[0])
    return 1.0 + low


def _concurrency(
    trace: Trace, scope: str, limit: int, violations: list[Violation], rule: Rule = "concurrency"
) -> None:
    in_flight: dict[int, RequestRecord] = {}
    for _, kind, record in trace.iter_events(scope):
        if kind == "send":
            in_flight[record.index] = record
            if len(in_flight) > limit:
                others = [other for other in in_flight.values() if other is not record]
                listed = ", ".join(f"#{other.index} sent at {_t(other.sent)}" for other in others)
                violations.append(
                    Violation(
                        rule=rule,
                        scope=scope,
                        time=record.sent or 0.0,
                        requests=(*(other.index for other in others), record.index),
                        message=(
                            f"scope {scope!r}: request #{record.index} was sent at "
                            f"{_t(record.sent)} while {len(others)} other(s) were in flight "
                            f"({listed}); its concurrency is {limit}"
                        ),
                    )
                )
                return
        elif kind == "release":
            in_flight.pop(record.index, None)


def _global_concurrency(trace: Trace, limit: int, violations: list[Violation]) -> None:
    events: list[tuple[int, int, RequestRecord]] = []
    for record in trace.requests:
        if record.sent_seq >= 0:
            events.append((record.sent_seq, 1, record))
        if record.released_seq >= 0:
            events.append((record.released_seq, -1, record))
    events.sort(key=lambda event: event[0])
    in_flight: dict[int, RequestRecord] = {}
    for _, change, record in events:
        if change < 0:
            in_flight.pop(record.index, None)
            continue
        in_flight[record.index] = record
        if len(in_flight) > limit:
            violations.append(
                Violation(
                    rule="global-concurrency",
                    scope=None,
                    time=record.sent or 0.0,
                    requests=tuple(in_flight),
                    message=(
                        f"request #{record.index} was sent at {_t(record.sent)} while "
                        f"{len(in_flight) - 1} other(s) were in flight; the limiter's global "
                        f"concurrency is {limit}"
                    ),
                )
            )
            return


def _delays(
    scope: str, policy: ScopePolicy, sends: list[RequestRecord], violations: list[Violation]
) -> None:
    if policy.delay <= 0:
        return
    factor = _lowest_jitter(policy)
    least = policy.delay * factor
    for previous, current in itertools.pairwise(sends):
        assert previous.sent is not None
        assert current.sent is not None
        gap = current.sent - previous.sent
        if gap < least - _EPSILON:
            jitter = f", at least {least:g} s with jitter" if factor != 1.0 else ""
            violations.append(
                Violation(
                    rule="delay",
                    scope=scope,
                    time=current.sent,
                    requests=(previous.index, current.index),
                    message=(
                        f"scope {scope!r}: requests #{previous.index} and #{current.index} "
                        f"were sent {gap:.6f} s apart ({_t(previous.sent)} and "
                        f"{_t(current.sent)}); the policy's delay is {policy.delay:g} s{jitter}"
                    ),
                )
            )
            return


def _slot_delays(
    scope: str, policy: ScopePolicy, sends: list[RequestRecord], violations: list[Violation]
) -> None:
    limit, spacing = policy.concurrency, policy.slot_delay
    if limit is None or spacing <= 0:
        return
    window: deque[RequestRecord] = deque()
    for record in sends:
        assert record.sent is not None
        while window and (window[0].sent or 0.0) <= record.sent - spacing + _EPSILON:
            window.popleft()
        window.append(record)
        if len(window) > limit:
            listed = ", ".join(f"#{other.index} at {_t(other.sent)}" for other in window)
            violations.append(
                Violation(
                    rule="slot-delay",
                    scope=scope,
                    time=record.sent,
                    requests=tuple(other.index for other in window),
                    message=(
                        f"scope {scope!r}: {len(window)} requests were sent less than "
                        f"{spacing:g} s apart ({listed}); with concurrency {limit} and "
                        f"slot_delay {spacing:g} s, at most {limit} may be sent in any "
                        f"{spacing:g} s"
                    ),
                )
            )
            return


def _quota(
    scope: str, policy: ScopePolicy, sends: list[RequestRecord], violations: list[Violation]
) -> None:
    quota, span = policy.quota, policy.window
    if quota is None:
        return
    window: deque[RequestRecord] = deque()
    used = 0.0
    for record in sends:
        assert record.sent is not None
        while window and (window[0].sent or 0.0) <= record.sent - span + _EPSILON:
            used -= window.popleft().scopes[scope]
        window.append(record)
        used += record.scopes[scope]
        if used > quota + 1e-9 * max(1.0, quota):
            listed = ", ".join(
                f"#{other.index} at {_t(other.sent)} (cost {other.scopes[scope]:g})"
                for other in list(window)[-5:]
            )
            violations.append(
                Violation(
                    rule="quota",
                    scope=scope,
                    time=record.sent,
                    requests=tuple(other.index for other in window),
                    message=(
                        f"scope {scope!r}: the {len(window)} requests sent in the {span:g} s "
                        f"up to {_t(record.sent)} cost {used:g} in total (last: {listed}); its "
                        f"quota is {quota:g} per {span:g} s"
                    ),
                )
            )
            return


def _retry_after(
    trace: Trace, scope: str, policy: ScopePolicy, violations: list[Violation]
) -> None:
    backoff = getattr(policy, "backoff", None)
    cap = float(getattr(backoff, "max_delay", 300.0))
    # A scope that knocks before a framework's late reset (Adaptive's do) is
    # not bound by that reset: only by the waits a refusal announces.
    knocks = getattr(backoff, "knock", False) or getattr(policy, "adaptive", None) is not None
    # Responses take effect for sends strictly after them: those at the very
    # instant of a response may have been granted before it arrived.
    recent: list[tuple[float, float, RequestRecord]] = []  # (responded, wait, record)
    until, wait, cause = -1.0, 0.0, None
    for _, kind, record in trace.iter_events(scope):
        if kind == "response" and record.headers and record.responded is not None:
            now = trace.wall(record.responded)
            info = parse_headers(record.headers, now=now, max_delay=cap, status=record.status)
            asked = info.wait()
            if knocks and info.retry_after is None and Knock.applies(info):
                asked = None
            if asked:
                recent.append((record.responded, asked, record))
        elif kind == "send" and record.sent is not None:
            sent = record.sent
            still_recent = []
            for responded, asked, response in recent:
                if responded + _EPSILON < sent:
                    if responded + asked > until:
                        until, wait, cause = responded + asked, asked, response
                else:
                    still_recent.append((responded, asked, response))
            recent = still_recent
            if cause is None or sent >= until - _EPSILON:
                continue
            responded = cause.responded or 0.0
            header = {
                name: value
                for name, value in cause.headers.items()
                if name.lower() in ("retry-after", "ratelimit", "ratelimit-reset")
                or name.lower().endswith("ratelimit-reset")
            }
            violations.append(
                Violation(
                    rule="retry-after",
                    scope=scope,
                    time=sent,
                    requests=(cause.index, record.index),
                    message=(
                        f"scope {scope!r}: request #{record.index} was sent at {_t(sent)}, "
                        f"{sent - responded:.6f} s after request #{cause.index}'s response at "
                        f"{_t(responded)} asked to wait {wait:g} s ({header}); nothing may be "
                        f"sent before {_t(until)}"
                    ),
                )
            )
            return


def check_respects(
    trace: Trace,
    policy: PolicyLike = None,
    *,
    retry_after: bool | None = None,
) -> list[Violation]:
    """Every rule of the policies that ``trace`` breaks (an empty list when it respects them).

    Checked per scope, over the requests that were sent:

    * **concurrency**: never more requests in flight (sent, not yet released)
      than the policy's ``concurrency``; and never more than the limiter's
      global cap in total;
    * **delay**: consecutive sends at least ``delay`` apart, times the lowest
      jitter factor of the policy or of its :class:`~throttlekit.Backoff`
      (controllers may only lengthen the delay);
    * **slot delay**: with ``concurrency`` *c* and ``slot_delay`` *s*, at
      most *c* sends in any *s* seconds (each slot sends at most once per *s*);
    * **quota**: the costs sent in any ``window`` seconds add up to at most
      ``quota``;
    * **Retry-After**: after a response whose ``Retry-After`` (or an
      exhausted ``RateLimit``) asks to wait *w* seconds, nothing is sent in
      the scope for *w* seconds (capped at the backoff's ``max_delay``).
      Sends at the very instant of the response are not counted (their order
      is ambiguous).

    :param trace: what :func:`~throttlekit.testing.simulate` recorded.
    :param policy: the rules to check: ``None`` = the policies the run used
        (:attr:`Trace.policies`); a :class:`~throttlekit.ScopePolicy` for
        every scope; ``{scope: policy}`` for some scopes (the others keep
        the run's); or a :class:`~throttlekit.Limiter` (its policies and
        global cap).
    :param retry_after: check the Retry-After rule; ``None`` = only for
        scopes whose policy has a ``backoff`` (the controller that honours it).
        A scope that knocks before a web framework's late ``X-RateLimit-Reset``
        (``Backoff(knock=True)``, or :class:`~throttlekit.Adaptive`'s scopes)
        is not held to such a reset when it is close at hand (it knocks before it).
    :returns: the violations, at most one per rule and scope (the first).
    """
    policies, global_cap = _policy_lookup(trace, policy)
    violations: list[Violation] = []
    if global_cap is not None:
        _global_concurrency(trace, global_cap, violations)
    for scope in sorted(policies):
        scope_policy = policies[scope]
        sends = trace.sends(scope)
        if not sends:
            continue
        if scope_policy.concurrency is not None:
            _concurrency(trace, scope, scope_policy.concurrency, violations)
        _delays(scope, scope_policy, sends, violations)
        _slot_delays(scope, scope_policy, sends, violations)
        _quota(scope, scope_policy, sends, violations)
        honours = getattr(scope_policy, "backoff", None) is not None
        if retry_after or (retry_after is None and honours):
            _retry_after(trace, scope, scope_policy, violations)
    return violations


def assert_respects(
    trace: Trace,
    policy: PolicyLike = None,
    *,
    retry_after: bool | None = None,
) -> None:
    """Fail with :class:`PolicyViolation` (an :class:`AssertionError`) if ``trace`` breaks a rule.

    Takes the same arguments as :func:`check_respects`; the message names
    the scope, the requests involved, their send times and the gap.

    Usage::

        trace = simulate(policy, QuotaServer(limit=5, retry_after=2), burst(url, 50))
        assert_respects(trace, policy)
    """
    violations = check_respects(trace, policy, retry_after=retry_after)
    if violations:
        raise PolicyViolation(violations)
