"""Simulated servers: what a site answers, and how fast, as a function of the load it sees.

A server model is a frozen configuration; :meth:`ServerModel.start` makes a
fresh responder for one simulation run, with its own state (queues, quota
counters) and its own seeded random numbers, so the same seed gives the same
answers. A responder is called once per request, at its send time, and
returns a :class:`SimResponse` whose ``latency`` the simulator waits in
virtual time.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

import attrs

from .._checks import (
    check_number,
    non_negative,
    optional_non_negative,
    optional_positive,
    positive,
)
from .._clock import wall
from ._model import SimRequest, SimResponse, fraction

__all__ = [
    "BucketServer",
    "CDNServer",
    "CapacityServer",
    "FixedServer",
    "FlakyServer",
    "QuotaServer",
    "Responder",
    "ServerModel",
    "Sites",
    "SoftBlockServer",
    "optional_server_model",
    "server_model",
]

#: Answers one request sent at ``now`` (virtual seconds).
Responder = Callable[[SimRequest, float], SimResponse]


@runtime_checkable
class ServerModel(Protocol):
    """A simulated server: anything with ``start(rng) -> responder``.

    Write your own by returning a function ``(request, now) -> SimResponse``
    that keeps whatever state it needs in a closure or an object::

        @attrs.frozen
        class Teapot:
            def start(self, rng):
                return lambda request, now: SimResponse(status=418, latency=0.01)
    """

    def start(self, rng: random.Random) -> Responder:
        """A fresh responder for one run, drawing its randomness from ``rng``."""
        ...


def server_model(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: ``value`` is a server model."""
    if not isinstance(value, ServerModel):
        raise TypeError(f"{attribute.name} must be a server model (with start()), got {value!r}")


def optional_server_model(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: ``value`` is a server model or ``None``."""
    if value is not None and not isinstance(value, ServerModel):
        raise TypeError(
            f"{attribute.name} must be a server model (with start()) or None, got {value!r}"
        )


def _jittered(rng: random.Random, value: float, jitter: float) -> float:
    if not jitter or not value:
        return value
    return value * (1.0 + rng.uniform(-jitter, jitter))


def _status(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 599:
        raise ValueError(f"{attribute.name} must be an HTTP status (100-599), got {value!r}")


def _statuses(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, tuple) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty tuple of statuses, got {value!r}")
    for status in value:
        _status(instance, attribute, status)


def _as_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _count(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _as_changes(value: Iterable[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    try:
        return tuple((at, limit) for at, limit in value)
    except (TypeError, ValueError):
        raise TypeError(f"changes must be (time, limit) pairs, got {value!r}") from None


def _changes(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    assert isinstance(value, tuple)
    previous = -math.inf
    for at, limit in value:
        number = check_number(f"{attribute.name} times", at, minimum=0.0)
        if number <= previous:
            raise ValueError(f"{attribute.name} times must increase, got {value!r}")
        previous = number
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"{attribute.name} limits must be ints >= 1, got {value!r}")


def _size(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0 (bytes), got {value!r}")


def _check_retry_after(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None or value == "reset":
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{attribute.name} must be 'reset', a number or None, got {value!r}")
    non_negative(instance, attribute, value)


def _add_retry_after(headers: dict[str, str], setting: object, wait: float) -> None:
    """A refusal's ``Retry-After`` for a model's ``retry_after`` setting, ``wait`` s from now."""
    if setting == "reset":
        headers["Retry-After"] = str(max(1, math.ceil(wait - 1e-9)))
    elif setting is not None:
        headers["Retry-After"] = f"{setting:g}"


@attrs.frozen(kw_only=True)
class FixedServer:
    """Always the same answer after the same latency, whatever the load.

    The reference point for hand-computable checks: send times depend only on
    the policy.

    :param latency: seconds from send to response.
    :param status: the status of every response.
    :param headers: the headers of every response.
    :param size: the body size in bytes.

    Usage::

        FixedServer(latency=0.1)
    """

    latency: float = attrs.field(default=0.05, validator=non_negative)
    status: int = attrs.field(default=200, validator=_status)
    headers: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    size: int = attrs.field(default=10_000, validator=_size)

    def start(self, rng: random.Random) -> Responder:
        response = SimResponse(
            status=self.status, latency=self.latency, headers=dict(self.headers), size=self.size
        )
        return lambda request, now: response


@attrs.frozen(kw_only=True)
class CapacityServer:
    """A server with a fixed number of workers: latency grows with load.

    Requests are served first come, first served by ``workers`` workers, each
    taking ``service_time`` seconds (± ``jitter`` as a fraction). A request
    that finds every worker busy queues, so its latency is its queueing time
    plus its service time: send faster than ``workers / service_time``
    requests per second and latency climbs without bound. With ``max_queue``
    set, a request that would queue longer than that is refused at once with
    ``overload_status`` (load shedding).

    :param workers: requests served in parallel.
    :param service_time: seconds one request takes once a worker picks it up.
    :param jitter: each service time is multiplied by a factor in ``[1 -
        jitter, 1 + jitter]``.
    :param exponential: draw each service time from an exponential
        distribution of mean ``service_time`` instead (``jitter`` is then
        unused): an M/M/c queue, whose latency varies as a real server's does.
    :param max_queue: most seconds a request may queue before it is refused;
        ``None`` = never refused.
    :param overload_status: the status of refused requests (503 by default).
    :param overload_latency: seconds a refusal takes.
    :param size: the body size of served responses in bytes.

    Usage::

        CapacityServer(workers=4, service_time=0.2)  # 20 requests/s at most
        CapacityServer(workers=4, service_time=0.05, exponential=True)  # M/M/4, 80/s
    """

    workers: int = attrs.field(default=4, validator=_count)
    service_time: float = attrs.field(default=0.1, validator=non_negative)
    jitter: float = attrs.field(default=0.0, validator=fraction)
    exponential: bool = False
    max_queue: float | None = attrs.field(default=None, validator=optional_positive)
    overload_status: int = attrs.field(default=503, validator=_status)
    overload_latency: float = attrs.field(default=0.005, validator=non_negative)
    size: int = attrs.field(default=10_000, validator=_size)

    @property
    def capacity(self) -> float:
        """Requests per second the server can serve at most (``inf`` when instant)."""
        return math.inf if not self.service_time else self.workers / self.service_time

    def start(self, rng: random.Random) -> Responder:
        free_at = [0.0] * self.workers  # a min-heap: when each worker becomes free

        def respond(request: SimRequest, now: float) -> SimResponse:
            start = max(now, free_at[0])
            if self.max_queue is not None and start - now > self.max_queue:
                return SimResponse(status=self.overload_status, latency=self.overload_latency)
            if self.exponential and self.service_time:
                done = start + rng.expovariate(1.0 / self.service_time)
            else:
                done = start + _jittered(rng, self.service_time, self.jitter)
            heapq.heapreplace(free_at, done)
            return SimResponse(status=200, latency=done - now, size=self.size)

        return respond


RateLimitHeaders = Literal["ietf", "legacy", "x-ratelimit"]


@attrs.frozen(kw_only=True)
class QuotaServer:
    """An API that allows ``limit`` requests per ``window`` and answers 429 beyond.

    With ``sliding=False`` (the default) windows are fixed: ``[0, window)``,
    ``[window, 2 window)``... With ``sliding=True`` a request is allowed when
    fewer than ``limit`` requests were allowed in the ``window`` seconds before it.

    Refused requests get ``status`` (429) fast, after ``reject_latency``,
    with a ``Retry-After`` header: ``"reset"`` (the default) gives the whole
    seconds until a request would be allowed again, a number gives that
    number every time, ``None`` sends no ``Retry-After`` (a bare 429). With
    ``rate_limit_headers`` every response also says how much quota is left,
    in one of three header families: ``"ietf"`` (draft-10 ``RateLimit`` and
    ``RateLimit-Policy`` structured fields, with ``t`` and ``w`` in whole
    seconds), ``"legacy"`` (``RateLimit-Limit/Remaining/Reset``) or
    ``"x-ratelimit"`` (``X-RateLimit-*``). Resets are counted from the send
    time: whole seconds, rounded up (as real servers round them), except
    ``X-RateLimit-Reset`` with ``reset_format="epoch"``: then it is the time
    of the reset in epoch seconds on the wall clock (the simulation's, read
    when the request is answered, the clock the limiter reads epoch resets
    against), with millisecond precision.

    ``changes`` makes the quota change during the run: ``((20.0, 5), (40.0,
    15))`` allows ``limit`` requests per window until virtual second 20, 5
    from then on, and 15 from second 40 (the requests already counted in the
    window stay counted).

    :param limit: requests allowed per window (from time 0).
    :param window: the window length in seconds.
    :param sliding: use a sliding window instead of fixed ones.
    :param count_rejected: refused requests use up quota too (a strict API
        that punishes clients who ignore the 429s).
    :param latency: seconds an allowed request takes.
    :param reject_latency: seconds a refusal takes.
    :param retry_after: ``"reset"``, a fixed number of seconds, or ``None``.
    :param rate_limit_headers: ``"ietf"``, ``"legacy"``, ``"x-ratelimit"`` or ``None``.
    :param reset_format: ``"delta"`` (seconds) or ``"epoch"`` (epoch seconds;
        only with ``rate_limit_headers="x-ratelimit"``).
    :param changes: ``(time, limit)`` pairs, times increasing: the limit from
        that virtual time on.
    :param status: the status of refusals.
    :param size: the body size of allowed responses in bytes.

    Usage::

        QuotaServer(limit=5, window=1.0, retry_after=2)  # 5 req/s, "Retry-After: 2" beyond
        QuotaServer(limit=60, window=10.0, rate_limit_headers="x-ratelimit", reset_format="epoch")
        QuotaServer(limit=10, sliding=True, retry_after=1, changes=((20.0, 5), (40.0, 15)))
    """

    limit: int = attrs.field(default=5, validator=_count)
    window: float = attrs.field(default=1.0, validator=positive)
    sliding: bool = False
    count_rejected: bool = False
    latency: float = attrs.field(default=0.05, validator=non_negative)
    reject_latency: float = attrs.field(default=0.005, validator=non_negative)
    retry_after: float | Literal["reset"] | None = attrs.field(
        default="reset", validator=_check_retry_after
    )
    rate_limit_headers: RateLimitHeaders | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(
            attrs.validators.in_(("ietf", "legacy", "x-ratelimit"))
        ),
    )
    reset_format: Literal["delta", "epoch"] = attrs.field(
        default="delta", validator=attrs.validators.in_(("delta", "epoch"))
    )
    changes: tuple[tuple[float, int], ...] = attrs.field(
        default=(), converter=_as_changes, validator=_changes
    )
    status: int = attrs.field(default=429, validator=_status)
    size: int = attrs.field(default=10_000, validator=_size)

    @reset_format.validator
    def _check_reset_format(self, attribute: attrs.Attribute[Any], value: object) -> None:
        if value == "epoch" and self.rate_limit_headers != "x-ratelimit":
            raise ValueError(
                "reset_format='epoch' needs rate_limit_headers='x-ratelimit', "
                f"got rate_limit_headers={self.rate_limit_headers!r}"
            )

    @property
    def rate(self) -> float:
        """Allowed requests per second on average (at time 0)."""
        return self.limit / self.window

    def limit_at(self, now: float) -> int:
        """The requests allowed per window at virtual time ``now`` (after ``changes``)."""
        limit = self.limit
        for at, changed in self.changes:
            if at > now:
                break
            limit = changed
        return limit

    def rate_at(self, now: float) -> float:
        """Allowed requests per second at virtual time ``now``."""
        return self.limit_at(now) / self.window

    def start(self, rng: random.Random) -> Responder:
        allowed: deque[float] = deque()  # sliding: times of counted requests
        state = {"index": -1, "used": 0}  # fixed: current window and its count

        def used_and_reset(now: float, limit: int) -> tuple[int, float]:
            """Requests counted in the current window, and seconds until one more fits."""
            if self.sliding:
                while allowed and allowed[0] + self.window <= now:
                    allowed.popleft()
                used = len(allowed)
                if used < limit:
                    reset = allowed[0] + self.window - now if allowed else self.window
                else:
                    reset = allowed[used - limit] + self.window - now
                return used, max(0.0, reset)
            index = math.floor(now / self.window)
            if index != state["index"]:
                state["index"], state["used"] = index, 0
            return state["used"], (index + 1) * self.window - now

        def count(now: float) -> None:
            if self.sliding:
                allowed.append(now)
            else:
                state["used"] += 1

        def headers(limit: int, remaining: int, reset: float) -> dict[str, str]:
            whole = str(max(1, math.ceil(reset - 1e-9)))
            if self.rate_limit_headers == "ietf":
                return {
                    "RateLimit-Policy": f'"default";q={limit};w={math.ceil(self.window)}',
                    "RateLimit": f'"default";r={remaining};t={whole}',
                }
            if self.rate_limit_headers == "legacy":
                return {
                    "RateLimit-Limit": str(limit),
                    "RateLimit-Remaining": str(remaining),
                    "RateLimit-Reset": whole,
                }
            if self.rate_limit_headers == "x-ratelimit":
                if self.reset_format == "epoch":
                    whole = f"{wall() + reset:.3f}"
                return {
                    "X-RateLimit-Limit": str(limit),
                    "X-RateLimit-Remaining": str(remaining),
                    "X-RateLimit-Reset": whole,
                }
            return {}

        def respond(request: SimRequest, now: float) -> SimResponse:
            limit = self.limit_at(now)
            used, reset = used_and_reset(now, limit)
            if used < limit:
                count(now)
                used, reset = used_and_reset(now, limit)
                return SimResponse(
                    status=200,
                    latency=self.latency,
                    headers=headers(limit, max(0, limit - used), reset),
                    size=self.size,
                )
            if self.count_rejected:
                count(now)
            extra = headers(limit, 0, reset)
            _add_retry_after(extra, self.retry_after, reset)
            return SimResponse(status=self.status, latency=self.reject_latency, headers=extra)

        return respond


@attrs.frozen(kw_only=True)
class BucketServer:
    """An API that keeps its rate limit as a bucket: ``rate`` per second, ``capacity`` at once.

    A token bucket that holds ``capacity`` tokens, full at the start and
    refilled at ``rate`` per second; each allowed request takes one, and a
    request that finds less than one is refused. This is also nginx's
    ``limit_req`` (a leaky bucket, ``nodelay``): its ``burst=N`` is a
    capacity of ``N + 1``, and its default (no burst, ``capacity=1``)
    refuses any request that comes sooner than ``1 / rate`` seconds after
    the last one allowed, whatever the count over a second.

    Refused requests get ``status`` (429; nginx answers 503 by default)
    after ``reject_latency``, with a ``Retry-After`` header: ``"reset"``
    gives the whole seconds until a token is back (rounded up), a number
    gives that number every time, ``None`` (the default, as nginx) sends none.

    :param rate: tokens refilled per second (> 0).
    :param capacity: the most tokens the bucket holds (an int >= 1).
    :param latency: seconds an allowed request takes.
    :param reject_latency: seconds a refusal takes.
    :param retry_after: ``"reset"``, a fixed number of seconds, or ``None``.
    :param status: the status of refusals.
    :param size: the body size of allowed responses in bytes.

    Usage::

        BucketServer(rate=10.0, status=503)  # nginx: limit_req rate=10r/s, no burst
        BucketServer(rate=5.0, capacity=20, retry_after=1)  # a token bucket of 20
    """

    rate: float = attrs.field(default=10.0, validator=positive)
    capacity: int = attrs.field(default=1, validator=_count)
    latency: float = attrs.field(default=0.05, validator=non_negative)
    reject_latency: float = attrs.field(default=0.005, validator=non_negative)
    retry_after: float | Literal["reset"] | None = attrs.field(
        default=None, validator=_check_retry_after
    )
    status: int = attrs.field(default=429, validator=_status)
    size: int = attrs.field(default=10_000, validator=_size)

    def start(self, rng: random.Random) -> Responder:
        state = {"tokens": float(self.capacity), "at": 0.0}

        def respond(request: SimRequest, now: float) -> SimResponse:
            tokens = min(self.capacity, state["tokens"] + (now - state["at"]) * self.rate)
            state["at"] = now
            if tokens >= 1.0 - 1e-9:
                state["tokens"] = max(0.0, tokens - 1.0)
                return SimResponse(status=200, latency=self.latency, size=self.size)
            state["tokens"] = tokens
            headers: dict[str, str] = {}
            _add_retry_after(headers, self.retry_after, (1.0 - tokens) / self.rate)
            return SimResponse(status=self.status, latency=self.reject_latency, headers=headers)

        return respond


@attrs.frozen(kw_only=True)
class CDNServer:
    """A CDN edge: cache hits come back fast; misses go to the origin behind it.

    Latency-driven throttling (AutoThrottle) sees the fast hits and speeds
    up, while the origin only sees the misses.

    :param hit_ratio: fraction of requests served from the cache.
    :param hit_latency: seconds a cache hit takes.
    :param origin: the server behind the CDN (a :class:`CapacityServer` by default).
    :param size: the body size of cache hits in bytes.

    Usage::

        CDNServer(hit_ratio=0.9, origin=CapacityServer(workers=2, service_time=0.5))
    """

    hit_ratio: float = attrs.field(default=0.9, validator=fraction)
    hit_latency: float = attrs.field(default=0.003, validator=non_negative)
    origin: ServerModel = attrs.field(factory=CapacityServer)
    size: int = attrs.field(default=10_000, validator=_size)

    def start(self, rng: random.Random) -> Responder:
        origin = self.origin.start(random.Random(rng.getrandbits(64)))
        hit = SimResponse(status=200, latency=self.hit_latency, size=self.size)

        def respond(request: SimRequest, now: float) -> SimResponse:
            if rng.random() < self.hit_ratio:
                return hit
            return origin(request, now)

        return respond


@attrs.frozen(kw_only=True)
class SoftBlockServer:
    """A site that silently blocks: past a rate, it serves fast 200s with no content.

    Up to ``limit`` requests per sliding ``window`` get real pages (``latency``,
    ``size`` bytes). A request beyond that starts a block lasting
    ``block_for`` seconds (every request during the block extends it): blocked
    responses are 200s after ``block_latency`` with a ``block_size`` body and
    :attr:`SimResponse.blocked` set, which only the simulation can see. This
    is the case status- and latency-driven throttling cannot detect.

    :param limit: requests per window before the block.
    :param window: the sliding window in seconds.
    :param block_for: seconds the block lasts after the last request that hit it.
    :param latency: seconds a real page takes.
    :param block_latency: seconds a block page takes.
    :param size: bytes of a real page.
    :param block_size: bytes of a block page.
    """

    limit: int = attrs.field(default=10, validator=_count)
    window: float = attrs.field(default=10.0, validator=positive)
    block_for: float = attrs.field(default=60.0, validator=non_negative)
    latency: float = attrs.field(default=0.2, validator=non_negative)
    block_latency: float = attrs.field(default=0.01, validator=non_negative)
    size: int = attrs.field(default=20_000, validator=_size)
    block_size: int = attrs.field(default=512, validator=_size)

    def start(self, rng: random.Random) -> Responder:
        recent: deque[float] = deque()
        blocked_until = [-math.inf]

        def respond(request: SimRequest, now: float) -> SimResponse:
            while recent and recent[0] + self.window <= now:
                recent.popleft()
            if now < blocked_until[0] or len(recent) >= self.limit:
                blocked_until[0] = now + self.block_for
                return SimResponse(
                    status=200, latency=self.block_latency, size=self.block_size, blocked=True
                )
            recent.append(now)
            return SimResponse(status=200, latency=self.latency, size=self.size)

        return respond


@attrs.frozen(kw_only=True)
class FlakyServer:
    """A server that fails now and then: 5xx errors, timeouts and dropped connections.

    Each request independently (from the seeded random numbers) times out
    with probability ``timeout_rate`` (a :class:`TimeoutError` after
    ``timeout`` seconds, as a client timeout would report it), else has its
    connection reset with probability ``reset_rate`` (a
    :class:`ConnectionResetError` after ``latency``), else gets one of
    ``error_statuses`` with probability ``error_rate`` (after
    ``error_latency``), else a 200.

    With an ``origin`` the 200s come from that server model instead (a
    :class:`CapacityServer` gives random errors in front of a server whose
    latency grows with load); the failures never reach it.

    :param latency: seconds of a normal response (± ``jitter`` as a fraction).
    :param jitter: randomization of ``latency``.
    :param error_rate: probability of a 5xx.
    :param error_statuses: the statuses of errors, picked uniformly.
    :param error_latency: seconds an error takes; ``None`` = like a normal
        response (``latency`` ± ``jitter``).
    :param timeout_rate: probability of a timeout.
    :param timeout: seconds until the client gives up on a hanging request.
    :param reset_rate: probability of a dropped connection.
    :param origin: the server of the successful requests; ``None`` = a 200
        after ``latency``.
    :param size: bytes of a normal response.

    Usage::

        FlakyServer(error_rate=0.1, timeout_rate=0.02, timeout=10.0)
        # 50 requests/s at most, 5 % immediate 503s in front:
        FlakyServer(
            error_rate=0.05, error_statuses=(503,), error_latency=0.001, timeout_rate=0.0,
            origin=CapacityServer(workers=10, service_time=0.2),
        )
    """

    latency: float = attrs.field(default=0.1, validator=non_negative)
    jitter: float = attrs.field(default=0.0, validator=fraction)
    error_rate: float = attrs.field(default=0.1, validator=fraction)
    error_statuses: tuple[int, ...] = attrs.field(
        default=(500, 502, 503), converter=_as_tuple, validator=_statuses
    )
    error_latency: float | None = attrs.field(default=None, validator=optional_non_negative)
    timeout_rate: float = attrs.field(default=0.02, validator=fraction)
    timeout: float = attrs.field(default=10.0, validator=non_negative)
    reset_rate: float = attrs.field(default=0.0, validator=fraction)
    origin: ServerModel | None = attrs.field(default=None, validator=optional_server_model)
    size: int = attrs.field(default=10_000, validator=_size)

    def start(self, rng: random.Random) -> Responder:
        origin = (
            None if self.origin is None else self.origin.start(random.Random(rng.getrandbits(64)))
        )

        def respond(request: SimRequest, now: float) -> SimResponse:
            draw = rng.random()
            if draw < self.timeout_rate:
                return SimResponse(
                    status=None,
                    latency=self.timeout,
                    exception=TimeoutError(f"simulated timeout after {self.timeout:g} s"),
                )
            draw -= self.timeout_rate
            latency = _jittered(rng, self.latency, self.jitter)
            if draw < self.reset_rate:
                return SimResponse(
                    status=None,
                    latency=latency,
                    exception=ConnectionResetError("simulated connection reset"),
                )
            draw -= self.reset_rate
            if draw < self.error_rate:
                if self.error_latency is not None:
                    latency = self.error_latency
                return SimResponse(status=rng.choice(self.error_statuses), latency=latency)
            if origin is not None:
                return origin(request, now)
            return SimResponse(status=200, latency=latency, size=self.size)

        return respond


def _host_of(url: str) -> tuple[str, str]:
    """``(host, host:port)`` of ``url``, lower-cased (empty strings when it has none)."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        return "", ""
    return host, f"{host}:{port}" if port is not None else host


def _sites(value: Mapping[str, ServerModel]) -> dict[str, ServerModel]:
    sites = {}
    for host, model in dict(value).items():
        if not isinstance(host, str) or not host:
            raise TypeError(f"sites keys must be host names, got {host!r}")
        if not isinstance(model, ServerModel):
            raise TypeError(f"sites[{host!r}] must be a server model (with start()), got {model!r}")
        sites[host.lower()] = model
    return sites


@attrs.frozen
class Sites:
    """Several simulated sites, told apart by the host of each request's URL.

    A request goes to the site named by its ``host:port`` or, failing that,
    its ``host``; other hosts go to ``default``, or fail with a
    :class:`ConnectionRefusedError` (no latency) when there is none.

    :param sites: server models by host name.
    :param default: the server of every other host (``None`` = refuse).

    Usage::

        Sites({"api.test": QuotaServer(limit=5), "cdn.test": CDNServer()})
    """

    sites: Mapping[str, ServerModel] = attrs.field(converter=_sites)
    default: ServerModel | None = attrs.field(default=None, kw_only=True)

    def start(self, rng: random.Random) -> Responder:
        # Each site draws from its own generator, seeded in a fixed order, so
        # adding traffic to one site never changes the answers of another.
        responders = {
            host: self.sites[host].start(random.Random(rng.getrandbits(64)))
            for host in sorted(self.sites)
        }
        fallback = (
            self.default.start(random.Random(rng.getrandbits(64)))
            if self.default is not None
            else None
        )

        def respond(request: SimRequest, now: float) -> SimResponse:
            host, netloc = _host_of(request.url)
            responder = responders.get(netloc) or responders.get(host) or fallback
            if responder is None:
                return SimResponse(
                    status=None,
                    exception=ConnectionRefusedError(f"no simulated site for {netloc or '?'}"),
                )
            return responder(request, now)

        return respond
