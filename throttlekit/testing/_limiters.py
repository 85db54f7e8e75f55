"""Models of deployed rate limiters, each following its own source's arithmetic.

:class:`NginxLimitReq` and :class:`NginxLimitConn` are nginx's ``limit_req``
and ``limit_conn``; :class:`HAProxyRate` is HAProxy's stick-table request
rate (``http_req_rate``) behind ``http-request deny``; :class:`FrameworkLimiter`
is a web framework's limiter on the ``limits`` library (Flask-Limiter,
slowapi), with its headers on every response. They are server models like
those of :mod:`throttlekit.testing`'s other sites: a frozen configuration
whose :meth:`start` makes a fresh responder per run.

nginx and HAProxy keep time in whole milliseconds; these models read virtual
time the same way, so hand-computed sequences from the servers' own integer
arithmetic hold exactly.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import attrs

from .._checks import (
    at_least_one,
    http_status,
    non_negative,
    non_negative_int,
    positive,
)
from .._clock import wall
from ._model import SimRequest, SimResponse
from ._servers import Responder, ServerModel, optional_server_model

__all__ = ["FrameworkLimiter", "HAProxyRate", "NginxLimitConn", "NginxLimitReq"]

#: nginx counts ``excess`` in thousandths of a request, and rates in thousandths per second.
_MILLI = 1000
#: Slack when turning virtual seconds into whole milliseconds, so 1.001 s is 1001 ms
#: although ``1.001 * 1000`` is 1000.999... in binary floating point.
_MS_SLACK = 1e-6


def _ms(now: float) -> int:
    """Virtual seconds as the whole milliseconds a server's clock shows."""
    return math.floor(now * 1000 + _MS_SLACK)


def _refusal_status(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # nginx accepts limit_req_status / limit_conn_status in 400-599 only.
    http_status(instance, attribute, value)
    assert isinstance(value, int)
    if value < 400:
        raise ValueError(f"{attribute.name} must be in 400-599 (as nginx allows), got {value!r}")


def _optional_whole_seconds(
    instance: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is not None:
        non_negative_int(instance, attribute, value)


class _ExcessBucket:
    """One ``limit_req`` zone node: ``excess`` (milli-requests) and ``last`` (ms) of one key."""

    __slots__ = ("burst", "excess", "last", "rate")

    def __init__(self, rate: int, burst: int) -> None:
        self.rate = rate  # milli-requests per second
        self.burst = burst  # milli-requests
        self.excess = 0
        self.last: int | None = None  # no node yet

    def admit(self, now: int) -> int | None:
        """The request's ``excess`` if accepted (state updated), else ``None`` (state unchanged)."""
        if self.last is None:
            excess = 0  # a new node starts empty
        else:
            elapsed = abs(now - self.last)
            excess = max(0, self.excess - self.rate * elapsed // 1000 + _MILLI)
        if excess > self.burst:
            return None
        self.excess, self.last = excess, now
        return excess

    def __repr__(self) -> str:
        return f"<_ExcessBucket excess={self.excess} last={self.last}>"


@attrs.frozen(kw_only=True)
class NginxLimitReq:
    """nginx's ``limit_req``: a leaky bucket on a millisecond clock, per key (one client here).

    As ``ngx_http_limit_req_module.c`` computes it: each key keeps
    ``excess`` in thousandths of a request and the millisecond ``last`` of the
    last *accepted* request. A request at ``now`` computes ``excess = max(0,
    excess - rate_milli * (now - last) / 1000 + 1000)`` (integer division,
    ``rate_milli`` = 1000 ``rate``); above 1000 ``burst`` it is refused
    with ``status`` and the state is left as it was; otherwise the state
    becomes ``(excess, now)``. Without ``burst`` any request sooner than
    ``1 / rate`` after the last accepted one is refused, whatever the count
    over a second.

    An accepted request with ``excess > 0`` is delayed by ``excess * 1000 /
    rate_milli`` milliseconds before nginx processes it (its latency grows by
    that), unless ``nodelay``: then it passes at once. nginx sends no
    ``Retry-After`` and no quota headers.

    :param rate: requests per second (``rate=10r/s`` is 10; ``30r/m`` is 0.5);
        nginx keeps it in thousandths, rounded down.
    :param burst: extra requests allowed above the rate (``burst=``).
    :param nodelay: pass the burst at once instead of spacing it out.
    :param status: the status of refusals (``limit_req_status``, 503 by default, 400-599).
    :param latency: seconds an accepted request takes at the origin (after any delay).
    :param reject_latency: seconds a refusal takes.
    :param size: the body size of accepted responses in bytes.

    Usage::

        NginxLimitReq(rate=10, status=429)  # limit_req_zone ... rate=10r/s; limit_req_status 429
        NginxLimitReq(rate=20, burst=10, nodelay=True)  # ... burst=10 nodelay, 503 beyond
    """

    rate: float = attrs.field(default=10.0, validator=positive)
    burst: int = attrs.field(default=0, validator=non_negative_int)
    nodelay: bool = False
    status: int = attrs.field(default=503, validator=_refusal_status)
    latency: float = attrs.field(default=0.05, validator=non_negative)
    reject_latency: float = attrs.field(default=0.001, validator=non_negative)
    size: int = attrs.field(default=10_000, validator=non_negative_int)

    @rate.validator
    def _check_milli_rate(self, attribute: attrs.Attribute[Any], value: float) -> None:
        if math.floor(value * _MILLI + _MS_SLACK) < 1:
            raise ValueError(f"rate must be at least 0.001 request per second, got {value!r}")

    @property
    def milli_rate(self) -> int:
        """The rate as nginx keeps it: thousandths of a request per second, rounded down."""
        return math.floor(self.rate * _MILLI + _MS_SLACK)

    def start(self, rng: random.Random) -> Responder:
        bucket = _ExcessBucket(self.milli_rate, self.burst * _MILLI)
        refused = SimResponse(status=self.status, latency=self.reject_latency)

        def respond(request: SimRequest, now: float) -> SimResponse:
            excess = bucket.admit(_ms(now))
            if excess is None:
                return refused
            delay_ms = 0 if self.nodelay else excess * 1000 // bucket.rate
            return SimResponse(status=200, latency=delay_ms / 1000 + self.latency, size=self.size)

        return respond


@attrs.frozen(kw_only=True)
class NginxLimitConn:
    """nginx's ``limit_conn``: at most ``limit`` requests of a key *in process* at once.

    As ``ngx_http_limit_conn_module.c`` counts them: a request is counted
    from the moment nginx handles it until it is finalized (its response sent),
    and one that finds ``limit`` already counted is refused at once with
    ``status``. Idle keep-alive connections are not counted, so this is a
    concurrency limit on requests, whatever their rate. No headers.

    :param limit: requests in process at once (``limit_conn zone N``).
    :param status: the status of refusals (``limit_conn_status``, 503 by default).
    :param latency: seconds an accepted request takes (when there is no ``origin``).
    :param origin: the server model behind nginx (its latency is how long a
        request stays counted); ``None`` = a 200 after ``latency``.
    :param reject_latency: seconds a refusal takes.
    :param size: the body size of accepted responses in bytes (without ``origin``).

    Usage::

        NginxLimitConn(limit=4, latency=0.1)  # limit_conn 4 before a 100 ms origin
    """

    limit: int = attrs.field(default=4, validator=at_least_one)
    status: int = attrs.field(default=503, validator=_refusal_status)
    latency: float = attrs.field(default=0.1, validator=non_negative)
    origin: ServerModel | None = attrs.field(default=None, validator=optional_server_model)
    reject_latency: float = attrs.field(default=0.001, validator=non_negative)
    size: int = attrs.field(default=10_000, validator=non_negative_int)

    def start(self, rng: random.Random) -> Responder:
        origin = (
            None if self.origin is None else self.origin.start(random.Random(rng.getrandbits(64)))
        )
        finishing: list[float] = []  # a min-heap: when each request in process is finalized
        refused = SimResponse(status=self.status, latency=self.reject_latency)
        served = SimResponse(status=200, latency=self.latency, size=self.size)

        def respond(request: SimRequest, now: float) -> SimResponse:
            while finishing and finishing[0] <= now:
                heapq.heappop(finishing)
            if len(finishing) >= self.limit:
                return refused
            response = served if origin is None else origin(request, now)
            heapq.heappush(finishing, now + response.latency)
            return response

        return respond


class _PeriodCounter:
    """HAProxy's ``struct freq_ctr`` over a period: this period's count and the last one's."""

    __slots__ = ("curr", "period", "prev", "tick")

    def __init__(self, period: int) -> None:
        self.period = period  # ms
        self.curr = self.prev = 0
        self.tick: int | None = None  # start of the current period (ms); None = a null area

    def update(self, now: int) -> None:
        """Count one event at ``now`` (ms), rotating the periods as ``update_freq_ctr_period``."""
        if self.tick is not None and now - self.tick < self.period:
            self.curr += 1
            return
        # HAProxy's clock is far past a fresh counter's tick 0, so a new entry
        # takes the "missed at least two periods" branch and starts at now.
        tick = now if self.tick is None else self.tick + self.period
        self.prev, self.curr = self.curr, 1
        if now - tick >= self.period:
            self.prev, tick = 0, now
        self.tick = tick & ~1  # the low bit is HAProxy's rotation lock

    def read(self, now: int) -> int:
        """The rate at ``now`` as ``read_freq_ctr_period``: ``curr + prev * remain / period``."""
        if self.tick is None:
            return 0
        curr, past = self.curr, self.prev
        remain = self.tick + self.period - now
        if remain < 0:
            remain += self.period
            past = curr if remain >= 0 else 0
            curr = 0
        if not curr and past <= 1:
            return past  # HAProxy's flapping correction at very low rates
        return (past * remain + curr * self.period) // self.period

    def __repr__(self) -> str:
        return f"<_PeriodCounter tick={self.tick} curr={self.curr} prev={self.prev}>"


@attrs.frozen(kw_only=True)
class HAProxyRate:
    """HAProxy's stick-table rate limit: ``http_req_rate(period)`` and ``deny`` above ``limit``.

    The recipe of HAProxy's documentation::

        stick-table type ip size 100k expire 30s store http_req_rate(1s)
        http-request track-sc0 src
        http-request deny deny_status 429 hdr Retry-After 1 if { sc_http_req_rate(0) gt 10 }

    ``track-sc0`` counts *every* request of the key, including those the
    ``deny`` rule then refuses. The counter (``freq_ctr.c``) keeps the count
    of the current period and of the previous one, and reads the rate as
    ``curr + prev * remain / period`` (integer division), where ``remain`` is
    the milliseconds left in the current period; the periods start at the
    key's first request and follow on from it, unless a whole period passes
    without a request (then the next one starts afresh). A request is refused
    when the rate read after counting it is above ``limit``: a client that
    keeps sending above the limit stays refused for as long as it does.

    :param limit: the threshold of ``gt``: at most this many per period pass.
    :param period: the period of ``http_req_rate`` in seconds (whole milliseconds).
    :param status: the ``deny_status`` of refusals.
    :param retry_after: the ``Retry-After`` of refusals in whole seconds; ``None`` = none.
    :param latency: seconds an accepted request takes at the backend.
    :param reject_latency: seconds a refusal takes.
    :param size: the body size of accepted responses in bytes.

    Usage::

        HAProxyRate(limit=10)  # deny 429 + "Retry-After: 1" above 10 per second
    """

    limit: int = attrs.field(default=10, validator=at_least_one)
    period: float = attrs.field(default=1.0, validator=positive)
    status: int = attrs.field(default=429, validator=http_status)
    retry_after: int | None = attrs.field(default=1, validator=_optional_whole_seconds)
    latency: float = attrs.field(default=0.05, validator=non_negative)
    reject_latency: float = attrs.field(default=0.001, validator=non_negative)
    size: int = attrs.field(default=10_000, validator=non_negative_int)

    @period.validator
    def _check_period_ms(self, attribute: attrs.Attribute[Any], value: float) -> None:
        if _ms(value) < 1:
            raise ValueError(f"period must be at least 0.001 s (one tick), got {value!r}")

    def start(self, rng: random.Random) -> Responder:
        counter = _PeriodCounter(_ms(self.period))
        headers = {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}
        refused = SimResponse(status=self.status, latency=self.reject_latency, headers=headers)
        served = SimResponse(status=200, latency=self.latency, size=self.size)

        def respond(request: SimRequest, now: float) -> SimResponse:
            ms = _ms(now)
            counter.update(ms)
            return refused if counter.read(ms) > self.limit else served

        return respond


class _MovingWindow:
    """``limits``' moving window: at most ``limit`` accepted requests in any ``window`` seconds."""

    __slots__ = ("accepted", "limit", "window")

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self.accepted: deque[float] = deque()  # times of accepted requests, oldest first

    def hit(self, now: float) -> bool:
        while self.accepted and self.accepted[0] < now - self.window:
            self.accepted.popleft()
        # acquire_entry: refused when the limit-th newest entry is not older than the window.
        if len(self.accepted) >= self.limit and self.accepted[-self.limit] >= now - self.window:
            return False
        self.accepted.append(now)
        return True

    def stats(self, now: float) -> tuple[float, int]:
        # get_moving_window counts entries strictly inside the window; reset = oldest + window.
        inside = [at for at in self.accepted if at > now - self.window]
        start = inside[0] if inside else now
        return start + self.window, self.limit - len(inside)


class _FixedWindow:
    """``limits``' fixed window on its memory (or Redis) storage: it opens at the first hit."""

    __slots__ = ("count", "expires", "limit", "window")

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self.count = 0
        self.expires: float | None = None

    def hit(self, now: float) -> bool:
        if self.expires is not None and self.expires <= now:
            self.count, self.expires = 0, None
        self.count += 1  # incr counts refused hits too
        if self.count == 1:
            self.expires = now + self.window
        return self.count <= self.limit

    def stats(self, now: float) -> tuple[float, int]:
        if self.expires is None or self.expires <= now:
            return now, self.limit
        return self.expires, max(0, self.limit - self.count)


class _SlidingCounter:
    """``limits``' sliding window counter: the previous window's count weighted by what is left."""

    __slots__ = ("counts", "limit", "window")

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self.counts: dict[int, int] = {}  # accepted per window index (windows from time 0)

    def _state(self, now: float) -> tuple[int, float, int, float]:
        """``(previous count, previous ttl, current count, current ttl)`` as the memory storage."""
        window = self.window
        # (Window indices round down: int() would take the first window, whose
        # "previous" index is -1, for itself, and count it twice.)
        previous = self.counts.get(math.floor((now - window) / window), 0)
        current = self.counts.get(math.floor(now / window), 0)
        previous_ttl = 0.0 if not previous else (1 - (((now - window) / window) % 1)) * window
        current_ttl = (1 - ((now / window) % 1)) * window + window
        return previous, previous_ttl, current, current_ttl

    def hit(self, now: float) -> bool:
        previous, previous_ttl, current, _ = self._state(now)
        if math.floor(previous * previous_ttl / self.window + current) + 1 > self.limit:
            return False
        index = math.floor(now / self.window)
        self.counts[index] = current + 1
        return True

    def stats(self, now: float) -> tuple[float, int]:
        previous, previous_ttl, current, current_ttl = self._state(now)
        weighted = previous * previous_ttl / self.window + current
        remaining = max(0, self.limit - math.floor(weighted))
        if not (previous or current):
            return now, remaining
        previous_in = previous_ttl % (self.window / previous) if previous else math.inf
        current_in = current_ttl % self.window if current else math.inf
        return now + min(previous_in, current_in), remaining


_Strategy = _MovingWindow | _FixedWindow | _SlidingCounter
_STRATEGIES: dict[str, Callable[[int, float], _Strategy]] = {
    "moving": _MovingWindow,
    "fixed": _FixedWindow,
    "sliding": _SlidingCounter,
}


@attrs.frozen(kw_only=True)
class FrameworkLimiter:
    """A web framework's limiter on the ``limits`` library, with its headers on every response.

    ``limit`` requests per ``window`` seconds with one of ``limits``'
    strategies: ``"moving"`` (at most ``limit`` accepted in any ``window``),
    ``"fixed"`` (a window that opens at the first request after the last one
    ended, as its memory and Redis storages do; refused requests count too) or
    ``"sliding"`` (the sliding window counter: the previous window's count
    weighted by the share of it still in the window, windows from time 0).
    Refused requests get ``status``.

    With ``headers`` (``RATELIMIT_HEADERS_ENABLED``), every response, 200s
    included, carries ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and
    ``X-RateLimit-Reset`` and also ``Retry-After``, as Flask-Limiter and
    slowapi send them: the reset is an *epoch* time on the wall clock
    ``reset_late`` seconds after the window's own reset (both frameworks add
    1 s), an integer with ``reset_format="int"`` (Flask-Limiter:
    ``int(reset + 1)``) or a float with ``"float"`` (slowapi: ``reset + 1``);
    ``Retry-After`` is the whole seconds from the answer to that stated reset,
    rounded down. With ``retry_after_on_every_response=False`` only refusals
    carry ``Retry-After`` (what the RFCs describe). The window's state is read
    when the request arrives.

    :param limit: requests allowed per window.
    :param window: the window in seconds.
    :param strategy: ``"moving"``, ``"fixed"`` or ``"sliding"``.
    :param headers: send the ``X-RateLimit-*`` and ``Retry-After`` headers.
    :param retry_after_on_every_response: ``Retry-After`` on 2xx too (as the frameworks).
    :param reset_late: seconds the stated reset is after the real one.
    :param reset_format: ``"int"`` or ``"float"`` epoch seconds.
    :param status: the status of refusals.
    :param latency: seconds an accepted request takes.
    :param reject_latency: seconds a refusal takes.
    :param size: the body size of accepted responses in bytes.
    :param clock: the wall clock the epoch resets are stated on (by default the
        simulation's, which runs with the virtual time: see ``wall_epoch`` of
        :func:`~throttlekit.testing.simulate`).

    Usage::

        FrameworkLimiter(limit=10, window=1.0)  # "10/second", moving window
        FrameworkLimiter(limit=60, window=60.0, strategy="fixed")  # "60/minute", fixed window
    """

    limit: int = attrs.field(default=10, validator=at_least_one)
    window: float = attrs.field(default=1.0, validator=positive)
    strategy: Literal["moving", "fixed", "sliding"] = attrs.field(
        default="moving", validator=attrs.validators.in_(tuple(_STRATEGIES))
    )
    headers: bool = True
    retry_after_on_every_response: bool = True
    reset_late: float = attrs.field(default=1.0, validator=non_negative)
    reset_format: Literal["int", "float"] = attrs.field(
        default="int", validator=attrs.validators.in_(("int", "float"))
    )
    status: int = attrs.field(default=429, validator=http_status)
    latency: float = attrs.field(default=0.05, validator=non_negative)
    reject_latency: float = attrs.field(default=0.005, validator=non_negative)
    size: int = attrs.field(default=10_000, validator=non_negative_int)
    clock: Callable[[], float] = attrs.field(default=wall, eq=False, repr=False)

    @property
    def rate(self) -> float:
        """Allowed requests per second on average."""
        return self.limit / self.window

    def start(self, rng: random.Random) -> Responder:
        window = _STRATEGIES[self.strategy](self.limit, self.window)

        def respond(request: SimRequest, now: float) -> SimResponse:
            accepted = window.hit(now)
            latency = self.latency if accepted else self.reject_latency
            reset, remaining = window.stats(now)
            headers = self._headers(reset - now, latency, remaining, refused=not accepted)
            if accepted:
                return SimResponse(status=200, latency=latency, headers=headers, size=self.size)
            return SimResponse(status=self.status, latency=latency, headers=headers)

        return respond

    def _headers(
        self, reset_in: float, latency: float, remaining: int, *, refused: bool
    ) -> dict[str, str]:
        """The headers of a request that arrived ``reset_in`` seconds before the window's reset.

        The stated reset is the wall clock's when the request arrived plus
        ``reset_in``: right however fast the clock runs against the
        simulation's. ``Retry-After`` counts from the answer, ``latency``
        later.
        """
        if not self.headers:
            return {}
        wall = self.clock()
        stated: float = wall + reset_in + self.reset_late
        if self.reset_format == "int":
            # (To the microsecond first: the sum of the clock and the time to
            # the reset can fall a hair below the whole second a server's own
            # reset time plus one would reach, and a second early.)
            stated = int(round(stated, 6))
        headers = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(stated),
        }
        if refused or self.retry_after_on_every_response:
            headers["Retry-After"] = str(int(stated - wall - latency))
        return headers
