"""Scope policies: the configured limits of one throttling scope."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ._adaptive import Adaptive
from ._autothrottle import AutoThrottle
from ._backoff import Backoff
from ._checks import concurrency_limit, non_negative, normalize_jitter, optional_positive, positive
from ._rampup import Rampup

if TYPE_CHECKING:
    from ._controller import Controller

__all__ = ["ScopePolicy"]


ControllerFactory = Callable[["ScopePolicy"], "Controller"]

#: The delay of a policy that does not set one: a polite second between sends,
#: or none under Adaptive, for which the delay is a ceiling (Adaptive finds the
#: rate; a 1 s ceiling would hold every scope to 1 request/s).
DEFAULT_DELAY, DEFAULT_ADAPTIVE_DELAY = 1.0, 0.0


class _DefaultDelay(float):
    """A delay the caller did not give: it follows ``adaptive`` (see ``ScopePolicy.delay``).

    It compares, hashes, prints and computes as the plain float it holds;
    only its type remembers that it was not given, so that ``attrs.evolve``
    turning Adaptive on or off moves it too.
    """

    __slots__ = ()


@attrs.frozen(kw_only=True)
class ScopePolicy:
    """The configured limits of one throttling scope.

    A scope is anything throttled independently: a host, a registrable domain,
    an API endpoint, a cost pool. A request is sent only when every scope it
    maps to allows it (see :class:`Limiter`).

    :param concurrency: most requests of this scope in flight at once; ``None``
        means unlimited (only the limiter's global cap applies).
    :param delay: minimum seconds between any two sends in the scope (after
        jitter). ``0`` means no delay. Default 1.0, or 0 when ``adaptive`` is
        set: the delay is then Adaptive's ceiling, and a ceiling of one second
        would hold the scope to one request a second whatever the server
        allows. Give it to set a ceiling (``delay=0.1``: at most 10 per second).
    :param slot_delay: minimum seconds between two sends in the same
        concurrency slot, measured send to send. Each of the ``concurrency``
        slots sends a request, waits for its response, then may send again
        once ``slot_delay`` has passed since its previous send. ``0`` (the
        default) disables it: a policy limits only what it names. (The
        Scrapy settings path keeps ``DOWNLOAD_DELAY_PER_SLOT``'s default, 1.0.)
    :param jitter: randomizes each delay between sends: ``0.5`` multiplies it by
        a factor in ``[0.5, 1.5]``, a pair ``(-0.1, 0.3)`` by one in ``[0.9, 1.3]``.
        Stored normalized as a ``(low, high)`` pair. ``0`` means no jitter.
    :param quota: units of cost the scope may consume in any ``window``;
        ``None`` means no quota. Each request declares its cost (default 1.0).
    :param window: length of the quota window in seconds.
    :param max_stall: seconds a request will wait for this scope to reopen at
        most: when the server blocked the scope (``Retry-After``, a rate-limit
        reset) or its quota is used up until further ahead than this,
        :meth:`Limiter.acquire` raises :class:`ScopeStalled` (naming the
        scope, the reason and when it reopens) instead of waiting. Requests
        already waiting for the scope raise it too, as soon as the feedback
        or the grant that stalls the scope is known (with the Redis backend:
        when they next ask Redis). A delay between sends longer than
        ``max_stall`` stalls the scope after each send, so keep it above the
        delays the scope may be given (robots.txt ``Crawl-delay``). A scope
        that is only full (its concurrency taken) does not stall: a release
        reopens it. ``None`` (the default) waits as long as needed.
    :param backoff: error-driven slowdown (429/5xx/timeouts, ``Retry-After``,
        ``RateLimit`` headers); on by default. ``None`` turns it off entirely.
    :param autothrottle: latency-driven delay (Scrapy's AutoThrottle); off by default.
    :param rampup: probe for more throughput until the server pushes back
        (pay-per-request APIs); off by default.
    :param adaptive: find and hold the rate and concurrency the server allows,
        with this policy as the ceiling (see :class:`Adaptive`); off by default.
        With it, the scope's ``backoff`` only honours ``Retry-After`` and
        rate-limit headers (knocking before a web framework's late reset,
        see :class:`Backoff`'s ``knock``): Adaptive does the slowing down.
    :param ignore_robots_txt: keep this explicit policy silently when robots.txt
        gives a different ``Crawl-Delay`` (otherwise a warning is logged once).
    :param controllers: factories called once per scope with this policy to
        make custom :class:`Controller` objects (feedback loops that move the
        effective delay, concurrency or blocked-until of the scope).

    Usage::

        api = ScopePolicy(concurrency=4, delay=0.25, quota=500, window=60)
        slower = attrs.evolve(api, delay=1.0)
    """

    concurrency: int | None = attrs.field(default=1, validator=concurrency_limit)
    delay: float = attrs.field(default=_DefaultDelay(DEFAULT_DELAY), validator=non_negative)
    slot_delay: float = attrs.field(default=0.0, validator=non_negative)
    jitter: tuple[float, float] = attrs.field(default=(0.0, 0.0), converter=normalize_jitter)
    quota: float | None = attrs.field(default=None, validator=optional_positive)
    window: float = attrs.field(default=60.0, validator=positive)
    max_stall: float | None = attrs.field(default=None, validator=optional_positive)
    backoff: Backoff | None = attrs.field(
        factory=Backoff, validator=attrs.validators.optional(attrs.validators.instance_of(Backoff))
    )
    autothrottle: AutoThrottle | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(AutoThrottle)),
    )
    rampup: Rampup | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Rampup))
    )
    adaptive: Adaptive | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Adaptive))
    )
    ignore_robots_txt: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )
    controllers: tuple[ControllerFactory, ...] = attrs.field(
        default=(),
        converter=tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.is_callable()),
    )

    def __attrs_post_init__(self) -> None:
        if type(self.delay) is _DefaultDelay:
            default = DEFAULT_DELAY if self.adaptive is None else DEFAULT_ADAPTIVE_DELAY
            object.__setattr__(self, "delay", _DefaultDelay(default))
