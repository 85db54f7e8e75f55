"""Backoff: slow a scope down when the server says it is overloaded."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from ._checks import below_one, check_number, normalize_jitter, positive
from ._controller import OUTCOMES, SlotState, remember_outcome
from ._knock import KNOCK_WITHIN, Knock, longest_reset, paced_by

if TYPE_CHECKING:
    from ._controller import Feedback, ScopeView
    from ._policy import ScopePolicy
    from .headers import RateLimitInfo

__all__ = [
    "DEFAULT_BACKOFF_EXCEPTIONS",
    "DEFAULT_BACKOFF_HTTP_CODES",
    "Backoff",
    "BackoffState",
    "low_remaining_pace",
    "stated_pace",
]

logger = logging.getLogger("throttlekit.backoff")

INF = math.inf

#: How unlikely errors must be, at the last quiet window's share, to step.
_UNLIKELY = 0.0001
_UNLIKELY_Z = 4.0  # about the same in a normal's deviations (the Poisson tail is longer)

#: HTTP statuses that mean "too fast" or "overloaded".
DEFAULT_BACKOFF_HTTP_CODES: frozenset[int] = frozenset(
    {429, 502, 503, 504, 520, 521, 522, 523, 524}
)

#: Exceptions that mean the server (or the path to it) is struggling: timeouts
#: and dropped connections of the standard library, httpx, aiohttp, requests
#: (and urllib3 beneath it), Twisted and Scrapy. Strings are import paths;
#: ones that cannot be imported are skipped.
DEFAULT_BACKOFF_EXCEPTIONS: tuple[str, ...] = (
    "builtins.TimeoutError",
    "builtins.ConnectionError",
    "asyncio.TimeoutError",
    "httpx.TimeoutException",
    "httpx.NetworkError",
    "httpx.RemoteProtocolError",
    "aiohttp.ServerTimeoutError",
    "aiohttp.ClientConnectionError",
    "aiohttp.ClientPayloadError",
    "requests.exceptions.Timeout",
    "requests.exceptions.ConnectionError",
    "requests.exceptions.ChunkedEncodingError",
    "urllib3.exceptions.TimeoutError",
    "urllib3.exceptions.ProtocolError",
    "twisted.internet.defer.TimeoutError",
    "twisted.internet.error.TimeoutError",
    "twisted.internet.error.TCPTimedOutError",
    "twisted.internet.error.ConnectionRefusedError",
    "twisted.internet.error.ConnectionLost",
    "twisted.web.client.ResponseFailed",
    "scrapy.exceptions.DownloadTimeoutError",
    "scrapy.exceptions.DownloadConnectionRefusedError",
    "scrapy.exceptions.DownloadFailedError",
    "scrapy.exceptions.ResponseDataLossError",
)

_RESOLVED: dict[str, type[BaseException]] = {}


def resolve_exception(spec: str | type[BaseException]) -> type[BaseException] | None:
    """An exception class from a class or an import path; ``None`` if not loaded.

    Import paths are looked up among the modules already imported, never
    imported here: an exception can only be an instance of a class whose
    module is loaded, and importing httpx or Twisted from inside an event
    loop on the first failure would block it. Misses are not cached, so a
    module imported later is found then.
    """
    if isinstance(spec, type):
        return spec
    found = _RESOLVED.get(spec)
    if found is not None:
        return found
    module_name, _, name = spec.rpartition(".")
    module = sys.modules.get(module_name)
    candidate = getattr(module, name, None) if module is not None else None
    if isinstance(candidate, type) and issubclass(candidate, BaseException):
        _RESOLVED[spec] = candidate
        return candidate
    return None


#: Below this many seconds, a reset (often whole seconds, rounded up) is too
#: coarse to pace by: a reset of "1" may mean 0.1 s. Below it, a framework's
#: late reset is knocked on instead (:data:`throttlekit._knock.KNOCK_WITHIN`).
MIN_PACE_RESET = KNOCK_WITHIN


#: Header families whose reset is when a token bucket is full again (OpenAI's
#: "until the rate limit resets to its initial state", Anthropic's "fully
#: replenished"), not the end of a window.
BUCKET_SOURCES = frozenset({"openai", "anthropic", "groq"})


def stated_pace(info: RateLimitInfo) -> float | None:
    """Seconds between sends that spread a server's stated quota over the time to its reset.

    ``None`` unless quota remains and the reset is at least
    :data:`MIN_PACE_RESET` seconds away. A token bucket's reset
    (:data:`BUCKET_SOURCES`) is the time it takes to refill what was spent,
    so its pace is the refill's: ``reset / (limit - remaining)``.
    """
    pace = info.pace()
    remaining, limit, reset = info.remaining, info.limit, info.reset
    if pace is None or remaining is None or reset is None or reset < MIN_PACE_RESET:
        return None
    if info.source in BUCKET_SOURCES and limit is not None and limit > remaining:
        return reset / (limit - remaining)
    return pace


def _left_at(feedback: Feedback, now: float) -> float | None:
    """When ``feedback``'s request left, as well as can be told: not before it did.

    Its ``sent_at`` is when it was granted (through Redis: the send time
    reserved on Redis's clock); a worker that resumed late sent it later,
    which its latency, measured from when it resumed, tells. A knock counts
    its lead from then: counted from the grant, a knock that left 10 ms late
    proved a lead 10 ms longer than it had, and three processes sharing a
    moving window through Redis knocked past the real reset (three of nine
    runs refused over 2 %, or reached 90 % late).
    """
    sent = feedback.sent_at
    if sent is None or feedback.latency is None:
        return sent
    return max(sent, now - feedback.latency)


def low_remaining_pace(info: RateLimitInfo) -> float | None:
    """The :func:`stated_pace` once little is left of the server's quota.

    ``None`` unless little is left: at most a fifth of the limit, or at most
    10 requests when the limit is unknown.
    """
    pace = stated_pace(info)
    remaining, limit = info.remaining, info.limit
    if pace is None or remaining is None:
        return None
    low = remaining <= 0.2 * limit if limit is not None else remaining <= 10
    return pace if low else None


def _codes(value: Iterable[int]) -> frozenset[int]:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"http_codes must be a collection of ints, got {value!r}")
    codes = set()
    for code in value:
        if isinstance(code, bool) or not isinstance(code, int) or not 100 <= code <= 999:
            raise ValueError(f"http_codes must hold HTTP status codes (100-999), got {code!r}")
        codes.add(code)
    return frozenset(codes)


def _exceptions(value: Iterable[Any]) -> tuple[str | type[BaseException], ...]:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"exceptions must be a collection of classes or paths, got {value!r}")
    result: list[str | type[BaseException]] = []
    for item in value:
        is_path = isinstance(item, str) and "." in item
        if is_path or (isinstance(item, type) and issubclass(item, BaseException)):
            result.append(item)
        else:
            raise TypeError(
                f"exceptions must hold exception classes or 'module.Class' paths, got {item!r}"
            )
    return tuple(result)


def _above_one(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_number(attribute.name, value, minimum=1.0, strict=True)


def _unlikely(errors: int, expected: float) -> bool:
    """Whether ``errors`` or more are unlikely (under 0.01 %) where ``expected`` were (Poisson)."""
    if expected > 50.0:  # the normal approximation (and no underflow of exp)
        return errors >= expected + _UNLIKELY_Z * math.sqrt(expected)
    term = total = math.exp(-expected)
    for k in range(1, errors):
        term *= expected / k
        total += term
    return 1.0 - total < _UNLIKELY


@attrs.frozen(kw_only=True)
class Backoff:
    """Error-driven slowdown of a scope (on by default in every :class:`ScopePolicy`).

    A *backoff signal* is a response whose status is in ``http_codes`` or a
    failure whose exception is an instance of one of ``exceptions``. A 429,
    or any response that asks to wait (``Retry-After``), always steps. Other
    errors (5xx, timeouts, dropped connections) step when no request sent
    since the last step up has gone through (a server failing every request is
    backed off from step after step), when they are at least
    ``error_share`` of the scope's last 40 outcomes, or when they come far
    more often than in the last window without a step (beyond a 1 in 10,000
    chance: a rate limit that answers 503, met or probed, while random
    errors come as often at any rate). So a few random errors among many
    successes cost about one step: they neither ratchet the delay up nor
    keep it from stepping back (they are still reported as the last
    signal). Each step multiplies the delay in force (the policy's,
    AutoThrottle's, a header's pace or this backoff's own) by
    ``delay_factor``; the first step goes to at least ``min_delay``, and no
    step above ``max_delay``.
    Signals from requests that were already in
    flight when the last step was taken count as that same step, so a burst
    of 429s from parallel requests is one step, not ten.

    When the delay is at ``max_delay`` and signals continue, the scope's
    concurrency is multiplied by ``concurrency_factor`` (never below 1).

    After ``window`` seconds without a signal that steps, the scope takes one
    step back toward its policy (concurrency first, then delay). Backoff remembers the
    largest delay that drew a signal and the smallest that stayed quiet for
    a whole window, and each step back goes halfway between them (or divides
    by ``delay_factor`` while no edge is known); a signal returns to the last
    quiet delay. So the delay settles just above the rate the server
    tolerates instead of ping-ponging between "too fast" and "backed off".
    After ten calm windows at the edge it forgets the edge and probes
    again, since servers change. ``min_delay`` bounds the first step only.

    A wait the response asks for blocks the scope until then, capped at
    ``max_delay``: ``Retry-After`` on the statuses HTTP defines it for (429,
    503, redirects, and 403; not a 200, see
    :func:`throttlekit.headers.retry_after_counts`), a wait stated in a
    small 429 body, or the reset of a spent ``RateLimit`` quota, all as
    :func:`throttlekit.headers.parse` reads them for every controller; a low
    ``remaining`` paces the rest of the window.

    :param http_codes: statuses that are signals. Default: 429, 502, 503, 504, 520-524.
    :param exceptions: exception classes or import paths that are signals.
        Default: timeouts and connection errors of the standard library,
        httpx, aiohttp and Twisted (see :data:`DEFAULT_BACKOFF_EXCEPTIONS`).
    :param delay_factor: multiplier per signal (> 1). Default 2.0.
    :param min_delay: the delay of the first backoff step at least (seconds, > 0). Default 1.0.
    :param max_delay: the delay cap, also the cap of any server-requested wait. Default 300.0.
    :param jitter: randomization of delays while backing off; replaces the
        policy's jitter then (0.1 = x0.9..x1.1; or a ``(low, high)`` pair). Default 0.1.
        It never takes a delay above ``max_delay``: near the cap it only shortens.
    :param window: quiet seconds before each step back. Default 60.0.
    :param concurrency_factor: concurrency multiplier when the delay is maxed
        (0 < f < 1). Default 0.5.
    :param error_share: the share of the last 40 outcomes at which 5xx
        statuses and exceptions step once a request has gone through since
        the last step up (fewer only if far more frequent than in the last
        quiet window; 0 <= s < 1); 0 makes each one step, as a 429 does.
        Default 0.25.
    :param headers_only: honour ``Retry-After``/``RateLimit`` headers but do not
        step the delay (used when :class:`Rampup` drives the scope).
    :param knock: when a web framework's ``X-RateLimit-*`` quota is spent and
        its reset is a few seconds away, send one request before that reset
        and learn how late the framework states it (they add up to a second);
        see :mod:`throttlekit._knock`. Default ``False``: the reset is waited
        for in full. :class:`Adaptive` turns it on for its scopes.

    Usage::

        ScopePolicy(backoff=Backoff(http_codes={429, 503}, max_delay=120.0))
        ScopePolicy(backoff=None)  # no backoff at all, not even Retry-After
    """

    http_codes: frozenset[int] = attrs.field(default=DEFAULT_BACKOFF_HTTP_CODES, converter=_codes)
    exceptions: tuple[str | type[BaseException], ...] = attrs.field(
        default=DEFAULT_BACKOFF_EXCEPTIONS, converter=_exceptions
    )
    delay_factor: float = attrs.field(default=2.0, validator=_above_one)
    min_delay: float = attrs.field(default=1.0, validator=positive)
    max_delay: float = attrs.field(default=300.0, validator=positive)
    jitter: tuple[float, float] = attrs.field(default=(-0.1, 0.1), converter=normalize_jitter)
    window: float = attrs.field(default=60.0, validator=positive)
    concurrency_factor: float = attrs.field(default=0.5, validator=positive)
    error_share: float = attrs.field(default=0.25, validator=below_one)
    headers_only: bool = False
    knock: bool = False

    def __attrs_post_init__(self) -> None:
        if self.min_delay > self.max_delay:
            raise ValueError(
                f"min_delay ({self.min_delay!r}) must not exceed max_delay ({self.max_delay!r})"
            )
        if self.concurrency_factor >= 1.0:
            raise ValueError(
                f"concurrency_factor must be in (0, 1), got {self.concurrency_factor!r}"
            )

    def exception_classes(self) -> tuple[type[BaseException], ...]:
        """The exception classes that are signals (import paths resolved, missing ones skipped)."""
        classes = (resolve_exception(spec) for spec in self.exceptions)
        return tuple(cls for cls in classes if cls is not None)

    def is_signal(self, feedback: Feedback) -> bool:
        """Whether ``feedback`` is a backoff signal."""
        if feedback.status is not None and feedback.status in self.http_codes:
            return True
        exception = feedback.exception
        return exception is not None and isinstance(exception, self.exception_classes())

    def controller(self, policy: ScopePolicy | None = None) -> BackoffState:
        """Make the per-scope state (the same for every policy)."""
        return BackoffState(self)


class BackoffState(SlotState):
    """The live backoff state of one scope (see :class:`Backoff`)."""

    __slots__ = (
        "_bad_delay",
        "_calm",
        "_cap",
        "_cap_next",
        "_cap_until",
        "_counted_from",
        "_cut_from",
        "_failed",
        "_forgot",
        "_good_delay",
        "_knock",
        "_outcomes",
        "_pace_delay",
        "_pace_until",
        "_quiet_share",
        "_sent",
        "_signal_at",
        "_step_at",
        "_through",
        "blocked_until",
        "config",
        "cut",
        "last_signal",
        "last_signal_at",
        "level",
        "reason",
        "step_delay",
    )

    STATE = tuple(name for name in __slots__ if name != "config")
    replaces_policy = False

    def __init__(self, config: Backoff) -> None:
        self.config = config
        self.level = 0
        self.step_delay = 0.0
        self.cut: int | None = None  # the concurrency cut at max delay
        # At most this many in flight until _cap_until: what the server said remains.
        self._cap: int | None = None
        self._cap_until = -INF
        self._cap_next: int | None = None  # the cap after the reset: the stated limit
        self.blocked_until = -INF
        self.last_signal: str | None = None
        self.last_signal_at = -INF
        self.reason = ""
        self._bad_delay = 0.0
        self._good_delay = INF
        self._calm = 0
        self._cut_from = 1
        self._forgot = False
        self._step_at = -INF
        self._signal_at = -INF  # the last signal that counted (random errors do not)
        self._pace_delay = 0.0
        self._pace_until = -INF
        self._knock = Knock().state()  # knocks before late resets (see throttlekit._knock)
        self._outcomes: list[int] = []  # the last OUTCOMES: 1 = a 5xx or exception, 0 = not
        self._through = False  # whether a request sent since the last step up went through
        # Outcomes and 5xx or exceptions of requests sent at the delay in
        # force, and the share of those at the last delay that stayed quiet.
        self._sent = self._failed = 0
        self._counted_from = -INF
        self._quiet_share: float | None = None  # none measured yet

    def __repr__(self) -> str:
        return (
            f"<BackoffState level={self.level} delay={self.delay:g} "
            f"concurrency={self.cut} blocked_until={self.blocked_until:g}>"
        )

    @property
    def jitter(self) -> tuple[float, float] | None:
        """The jitter to use instead of the policy's while backing off.

        Its upper end is cut so that the jittered delay never exceeds
        ``max_delay``: at the cap the delay only varies downwards.
        """
        if not self.level:
            return None
        low, high = self.config.jitter
        delay = self.delay
        if delay > 0.0 and delay * (1.0 + high) > self.config.max_delay:
            high = max(self.config.max_delay / delay - 1.0, -1.0)
            low = min(low, high)
        return low, high

    @property
    def active(self) -> bool:
        return self.level > 0 or self.cut is not None

    @property
    def concurrency(self) -> int | None:
        """The concurrency cut, or what the server said remains, whichever is smaller."""
        cut, cap = self.cut, self._cap
        if cap is None:
            return cut
        return cap if cut is None else min(cut, cap)

    @property
    def due(self) -> float:
        """When a send may step back (a quiet window ended) or end a header's pace or cap."""
        due = INF
        if self.active:
            due = max(self._signal_at, self._step_at) + self.config.window
        if self._pace_delay and self._pace_until < due:
            due = self._pace_until
        if self._cap is not None and -INF < self._cap_until < due:
            due = self._cap_until
        return due

    def on_send(self, scope: ScopeView, now: float) -> bool:
        changed = False
        if self.active and now - max(self._signal_at, self._step_at) >= self.config.window:
            self._step_back(scope, now)
            changed = True
        if self._pace_delay and now >= self._pace_until:
            self._pace_delay = 0.0
            self._pace_until = -INF
            changed = True
        if self._cap is not None and -INF < self._cap_until <= now:
            # A new window: at most its whole quota until a response says more.
            self._cap, self._cap_next, self._cap_until = self._cap_next, None, -INF
            changed = True
        return changed

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        config = self.config
        info = feedback.rate_limit
        status = feedback.status
        if config.knock:
            knock = Knock(self._knock)
            accepted = status is not None and status < 400
            if knock.answered(_left_at(feedback, now), now, accepted=accepted, info=info):
                self._cap, self._cap_until = None, -INF  # the window came back early: a new one
            if info is not None:
                knock.longest = longest_reset(info, knock.longest)
                info = paced_by(info, knock.longest)
                self._apply_headers(scope, info, knock.wait(info, now), now)
            self._knock = knock.state()
        elif info is not None:
            self._apply_headers(scope, info, info.wait(), now)
        if not config.is_signal(feedback):
            self._count(feedback, now, error=False)
            if self.active and now - max(self._signal_at, self._step_at) >= config.window:
                self._step_back(scope, now)
            return
        if status is not None and status in config.http_codes:
            self.last_signal = str(status)
        else:
            self.last_signal = type(feedback.exception).__name__
        self.last_signal_at = now
        if config.headers_only:
            return
        # A 429 or a wait the server asks for is meant; another error may be
        # random, and moves the scope only as one of many recent errors.
        if (
            status != 429
            and (info is None or info.wait() is None)
            and not self._count(feedback, now, error=True)
        ):
            return
        self._signal_at = now
        sent_at = feedback.sent_at
        if sent_at is not None and sent_at <= self._step_at:
            return  # in flight before the last step: part of that step
        self._step_up(scope, now)

    def _count(self, feedback: Feedback, now: float, *, error: bool) -> bool:
        """Count an outcome; whether an error among the recent ones should step.

        It should when nothing sent since the last step up has gone through
        (the step did not help: the server fails every request), when errors
        are at least ``error_share`` of the last 40 outcomes (a large share,
        at any rate), or when they come clearly more often than in the last
        quiet window (a limit met, or its refusals, which stop below its
        rate, while random errors come as often at any rate).
        """
        config = self.config
        if not config.error_share or config.headers_only:
            return True
        remember_outcome(self._outcomes, 1 if error else 0)
        if now - self._counted_from >= config.window:
            self._quiet(now)  # a window without a step: its errors are the usual share
        sent_at = feedback.sent_at
        if sent_at is None or sent_at > self._step_at:  # sent at the delay in force
            self._sent += 1
            if error:
                self._failed += 1
            else:
                self._through = True
        if not error:
            return True
        share = self._quiet_share
        return (
            not self._through
            or sum(self._outcomes) >= config.error_share * OUTCOMES
            or (share is not None and _unlikely(self._failed, self._sent * share))
        )

    def _quiet(self, now: float) -> None:
        """A window passed without a step: its share of errors is the usual one from now."""
        # Three errors more: a window of a few sends that had none does not
        # prove that errors never come (as the rule of three bounds a share
        # that showed none in n at 95 %: 3 / n).
        self._quiet_share = (self._failed + 3.0) / (self._sent + 3.0)
        self._sent = self._failed = 0
        self._counted_from = now

    # -- steps ---------------------------------------------------------------------

    def _step_up(self, scope: ScopeView, now: float) -> None:
        config = self.config
        old = self.step_delay
        # The delay that was enforced (policy, AutoThrottle, pacing, this backoff).
        in_force = max(old, scope.delay)
        if self.level and old >= config.max_delay:
            base = scope.concurrency if self.cut is None else self.cut
            if base is None:
                base = max(1, scope.in_flight)
            if self.cut is None:
                self._cut_from = base  # where stepping back ends the cut
            self.cut = max(1, int(base * config.concurrency_factor))
            self.reason = f"backoff: delay at max, concurrency cut to {self.cut}"
        else:
            # The delay in force drew a signal: remember it as too fast, and go
            # back to the last delay known to be quiet, or multiply.
            good = self._good_delay
            if not old:
                self._bad_delay = in_force
                stepped = max(config.min_delay, in_force * config.delay_factor)
            elif in_force < good < INF:
                self._bad_delay = max(self._bad_delay, in_force)
                stepped = good  # a probe below the last quiet delay failed: go back
            elif good < INF:
                # The last quiet delay drew a signal too: we sit right on the
                # edge (or it moved). Nudge up an eighth of a step and relearn
                # what is quiet, keeping the edge we knew.
                stepped = in_force * (1.0 + (config.delay_factor - 1.0) / 8.0)
                self._good_delay = INF
            else:
                self._bad_delay = max(self._bad_delay, in_force)
                stepped = in_force * config.delay_factor
            self.step_delay = min(config.max_delay, stepped)
            self.reason = f"backoff level {self.level + 1} after {self.last_signal}"
        self.level += 1
        self._calm = 0
        self._forgot = False
        self._step_at = now
        self._through = False
        self._sent = self._failed = 0
        self._counted_from = now
        logger.debug(
            "scope %s: backoff after %s, delay %.3f -> %.3f s, concurrency %s (level %d)",
            scope.name,
            self.last_signal,
            old,
            self.step_delay,
            self.cut,
            self.level,
        )

    def _step_back(self, scope: ScopeView, now: float) -> None:
        """A quiet window passed: move toward the policy, bisecting toward the known edge."""
        config = self.config
        old = self.step_delay
        self._step_at = now
        if self._counted_from < now:  # (not already, by the feedback that came with it)
            self._quiet(now)
        if self.cut is not None:
            raised = max(self.cut + 1, int(self.cut / config.concurrency_factor))
            if raised >= self._cut_from:
                self.cut = None
            else:
                self.cut = raised
            self.reason = f"backoff: quiet, concurrency raised to {self.cut}"
        else:
            self._good_delay = min(self._good_delay, old)
            floor = scope.policy.delay
            bad = self._bad_delay
            if bad > floor:
                target = (old + bad) / 2.0
                if old - target < 0.025 * old:
                    # Settled just above the edge: stay, and after a few calm
                    # windows forget the edge so that we probe again.
                    self._calm += 1
                    if self._calm >= 10:
                        # Forget half the edge the first time, all of it the second.
                        self._calm = 0
                        self._bad_delay = floor if self._forgot else bad / config.delay_factor
                        self._forgot = True
                    return
            else:
                target = old / config.delay_factor
            if target <= floor or target < 0.01:
                target = 0.0
            self.step_delay = target
            self.reason = f"backoff: quiet for {config.window:g} s, stepping back"
        self.level = max(1, self.level - 1)
        if not self.step_delay and self.cut is None:
            self.level = 0
            self._bad_delay = 0.0
            self._good_delay = INF
            self._calm = 0
            self.reason = ""
        logger.debug(
            "scope %s: quiet for %g s, backoff delay %.3f -> %.3f s, concurrency %s (level %d)",
            scope.name,
            config.window,
            old,
            self.step_delay,
            self.cut,
            self.level,
        )

    def _apply_headers(
        self, scope: ScopeView, info: RateLimitInfo, wait: float | None, now: float
    ) -> None:
        """Apply what the headers say: the ``wait`` they ask for, a pace, a cap in flight."""
        max_delay = self.config.max_delay
        if wait is not None and wait > 0:
            until = now + min(wait, max_delay)
            if until > self.blocked_until:
                self.blocked_until = until
                logger.debug(
                    "scope %s: server asks to wait %.3f s, blocked until %.3f",
                    scope.name,
                    min(wait, max_delay),
                    until,
                )
        pace = low_remaining_pace(info)
        if pace is not None:
            self._pace_delay = min(pace, max_delay)
            self._pace_until = now + min(info.reset or 0.0, max_delay)
        remaining, reset = info.remaining, info.reset
        if remaining is not None and reset == 0.0:
            # A reset already past when the answer came (an epoch rounded down,
            # a late answer, a server clock behind ours): what remained then
            # is all that is known until the next answer says more.
            self._cap, self._cap_next, self._cap_until = max(1, int(remaining)), None, -INF
        elif remaining is not None and reset is not None and reset > 0:
            # Never more in flight than the server said remains, until its
            # reset. Responses answered together arrive in any order, so within
            # one reset the smallest remaining counts.
            cap = max(1, int(remaining))
            if self.config.knock and Knock.near(info):
                # One request after the reset tells how much of the window is back.
                after: int | None = 1
            else:
                after = None if info.limit is None else max(1, int(info.limit))
            if now < self._cap_until and self._cap is not None:
                self._cap = min(self._cap, cap)
                if after is not None and self._cap_next is not None:
                    after = min(after, self._cap_next)
            else:
                self._cap, self._cap_until = cap, now + min(reset, max_delay)
            self._cap_next = after

    @property
    def delay(self) -> float:
        """The delay backoff asks for: its step delay, or the header pace if larger."""
        return max(self.step_delay, self._pace_delay)
