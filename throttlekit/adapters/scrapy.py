"""Throttle a Scrapy crawl with throttlekit: a downloader middleware.

Enable it in ``settings.py`` (Scrapy >= 2.13 with its default asyncio reactor)::

    DOWNLOADER_MIDDLEWARES = {"throttlekit.adapters.scrapy.ThrottlingMiddleware": 950}
    TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"

Order 950 puts it after ``HttpCacheMiddleware`` (900), so cache hits never
wait, and last, so nothing else runs between the grant and the download.

What it does, per request that reaches the downloader:

1. ``process_request`` awaits a permit from a :class:`~throttlekit.Limiter`
   built from the crawl's settings (:func:`limiter_from_settings`). The
   Scrapy ``Request`` is the request-like: its URL gives the scopes (the host
   by default); ``request.meta["throttling_scopes"]`` overrides them, so does
   a ``download_slot`` set by the spider or a plugin (not one Scrapy's
   downloader gave an earlier attempt); ``dont_throttle`` exempts the request
   from every scope (not from ``CONCURRENT_REQUESTS``); ``request.priority``
   orders the waiters of a scope.
2. The permit is held while the request is downloaded. ``process_response``
   records the status, headers (``Retry-After``, ``RateLimit``...), latency
   (Scrapy's ``download_latency`` meta: time to the response headers) and
   body size; ``process_exception`` records the exception (timeouts and
   dropped connections trigger backoff). Then the permit is released.
   As in Scrapy's AutoThrottle, latency controllers learn only from a
   response with ``download_latency`` and a download slot, whose request does
   not set ``autothrottle_dont_adjust_delay`` to True.
3. Scrapy's own per-slot delay and concurrency are neutralised: each
   download slot gets delay 0 and a concurrency that never binds when a
   request enters it, so ``DOWNLOAD_DELAY``, ``CONCURRENT_REQUESTS_PER_DOMAIN``
   and ``DOWNLOAD_SLOTS`` (read as scopes) are applied once, by throttlekit,
   not twice.

**Where requests wait, and CONCURRENT_REQUESTS.** Scrapy runs the downloader
middlewares *before* a request enters its download slot, and counts every
request inside the downloader -- including one awaiting a permit here --
against ``CONCURRENT_REQUESTS``. Left alone, requests waiting on one slow
scope would take every seat and starve the other scopes. So:

* throttlekit enforces ``CONCURRENT_REQUESTS`` as the cap on requests being
  *downloaded* (its global cap), and the middleware raises the downloader's
  own limit to ``CONCURRENT_REQUESTS + THROTTLING_MAX_WAITING``: up to that
  many more requests may wait for a permit without taking the seat of a
  request that could be sent now;
* a waiting request counts as active in its Scrapy download slot, as a
  request queued behind Scrapy's own ``DOWNLOAD_DELAY`` would, so the default
  ``DownloaderAwarePriorityQueue`` hands out requests of less busy hosts first.

**Crawl-Delay.** With ``ROBOTSTXT_OBEY`` (and ``THROTTLING_ROBOTSTXT_OBEY``,
default True), the ``Crawl-delay`` of each parsed robots.txt is applied with
:meth:`~throttlekit.Limiter.set_crawl_delay` to the scope of its host: on
Scrapy's ``robots_parsed`` signal, or, on a Scrapy without it (< 2.14), by
parsing the robots.txt response as it passes through.

**Settings** are checked when the crawler starts: a bad value stops it with
one log line naming the setting, and so does a misspelt name (with the
closest known one).

**AutoThrottle.** Scrapy's AutoThrottle extension adjusts the very slot delay
this middleware neutralises, so with both enabled it has no effect; a
warning says so. ``AUTOTHROTTLE_ENABLED`` and the other ``AUTOTHROTTLE_*``
settings switch on throttlekit's own :class:`~throttlekit.AutoThrottle`
controller instead, per scope.

**Stats** (in Scrapy's stats collector, ``throttlekit/`` prefix):
``request_count`` (permits granted), ``waited_requests`` (requests that
waited 1 ms or more), ``wait_time_total`` and ``wait_time_max`` (seconds),
``max_waiting`` (most requests waiting at once), ``backoff_signals``
(responses or failures that a scope's backoff counts as a signal),
``response_status_count/<status>``, ``exception_count/<exception>``,
``robotstxt_crawl_delay`` (scopes that got a Crawl-Delay),
``released_unfinished`` (permits given back for requests that left the
downloader without passing through this middleware again),
``dropped_on_close`` and ``requeued_on_close`` (see :doc:`/scrapy`), and
``dropped_on_stall`` and ``stalled_scopes`` (below).

**Stalled scopes.** With ``THROTTLING_MAX_STALL`` (or ``"max_stall"`` in a
``THROTTLING_SCOPES`` entry), a request whose scope cannot send for longer
than that (a long ``Retry-After``, a spent quota) raises
:class:`~throttlekit.ScopeStalled` instead of waiting, also once it waits;
the middleware drops it with Scrapy's ``IgnoreRequest`` (whose
``__cause__`` is the ``ScopeStalled``), counts it in
``dropped_on_stall``, and logs one INFO line per stall of a scope (counted in
``stalled_scopes``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import sys
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

import anyio

from .. import scopes as _scopes
from .._errors import ScopeStalled
from .._limiter import Limiter
from .._policy import ScopePolicy
from .._settings import DEFAULT_SETTINGS, check_setting_names
from ..headers import wants_body
from ._common import HeldPermit, missing_extra

try:
    from scrapy import signals
    from scrapy.exceptions import IgnoreRequest, NotConfigured
    from scrapy.http import Request, Response
    from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings, default_settings
    from scrapy.utils.misc import load_object
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise missing_extra("throttlekit.adapters.scrapy", "Scrapy >= 2.13.4", "scrapy") from exc

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from .._controller import Feedback

__all__ = ["ThrottlingMiddleware", "limiter_from_settings"]

logger = logging.getLogger(__name__)

#: The concurrency given to Scrapy's download slots: never the binding limit.
UNLIMITED_SLOT_CONCURRENCY = 1 << 30
#: A request that waited at least this long (seconds) counts in ``waited_requests``.
WAITED_THRESHOLD = 0.001
#: Seconds between checks for permits of requests that left the downloader unseen.
SWEEP_INTERVAL = 5.0
#: How often (seconds) waiting requests check whether the engine is closing the spider.
CLOSE_CHECK_INTERVAL = 0.5
#: The request meta key that exempts a request from scope throttling.
DONT_THROTTLE = "dont_throttle"
#: The scope of requests with ``dont_throttle``: no limit, no controller.
UNTHROTTLED_SCOPE = "(not throttled)"
#: Meta key: the download slot Scrapy's downloader gave an earlier attempt of a
#: request (a retry or redirect copies the meta), as opposed to a slot set by the
#: user or a plugin, which is the request's scope.
_ASSIGNED_SLOT = "_throttlekit_assigned_slot"
#: Scrapy's signal with each parsed robots.txt (Scrapy >= 2.14); without it the
#: middleware parses the robots.txt responses that pass through it.
ROBOTS_PARSED_SIGNAL = getattr(signals, "robots_parsed", None)
#: The throttlekit-family names Scrapy itself reads (not misspellings).
_SCRAPY_SETTINGS = frozenset(name for name in dir(default_settings) if name.isupper())


def limiter_from_settings(settings: BaseSettings) -> Limiter:
    """Build the :class:`~throttlekit.Limiter` that Scrapy ``settings`` describe.

    Everything :meth:`Limiter.from_settings <throttlekit.Limiter.from_settings>`
    reads, with Scrapy's forms understood: ``THROTTLING_SCOPES`` may be a JSON
    string (as given with ``-s``), and Scrapy's ``DOWNLOAD_DELAY_JITTER``
    (the magnitude of the random variation, e.g. ``0.5`` for x0.5..x1.5)
    applies unless ``RANDOMIZE_DOWNLOAD_DELAY`` is set at a higher priority,
    and ``THROTTLING_SCOPE_CONCURRENCY`` (the newer name) wins over
    ``CONCURRENT_REQUESTS_PER_DOMAIN`` unless that is set at a higher priority.
    Note that Scrapy's defaults apply where a setting is not given:
    ``CONCURRENT_REQUESTS = 16``, ``CONCURRENT_REQUESTS_PER_DOMAIN = 8``,
    ``DOWNLOAD_DELAY = 0``; ``DOWNLOAD_DELAY_PER_SLOT`` is not a Scrapy
    setting and defaults to throttlekit's 1.0.

    ``THROTTLING_RESOLVER`` (an import path or a callable, e.g.
    ``"throttlekit.scopes.by_registrable_domain"``) picks the scope resolver;
    the default is :func:`throttlekit.scopes.by_host`.

    :raises ValueError: a setting has an invalid value (the message names it).
    :raises TypeError: a setting has the wrong type.
    """
    values = {name: settings.get(name) for name in DEFAULT_SETTINGS}
    values["THROTTLING_SCOPES"] = _scopes_setting(settings)
    values["DOWNLOAD_SLOTS"] = _slots_setting(settings)
    if _priority(settings, "CONCURRENT_REQUESTS_PER_DOMAIN") > _priority(
        settings, "THROTTLING_SCOPE_CONCURRENCY"
    ):
        values["THROTTLING_SCOPE_CONCURRENCY"] = None  # the older name, set later, wins
    jitter = _jitter_setting(settings)
    if jitter is not None:
        values["RANDOMIZE_DOWNLOAD_DELAY"] = jitter
    resolver = settings.get("THROTTLING_RESOLVER")
    options: dict[str, Any] = {}
    if resolver is not None:
        if isinstance(resolver, str):
            try:
                resolver = load_object(resolver)
            except (ImportError, NameError, AttributeError, ValueError) as exc:
                raise ValueError(
                    f"THROTTLING_RESOLVER: cannot import {resolver!r}: {exc}"
                ) from None
        if not callable(resolver):
            raise TypeError(f"THROTTLING_RESOLVER must be a callable, got {resolver!r}")
        options["resolver"] = resolver
    return Limiter.from_settings(values, **options)


def _scopes_setting(settings: BaseSettings, name: str = "THROTTLING_SCOPES") -> Any:
    value = settings.get(name)
    if isinstance(value, str):
        try:
            return settings.getdict(name)
        except ValueError as exc:
            raise ValueError(f"{name} is not a valid JSON object: {exc}") from None
    return value


def _slots_setting(settings: BaseSettings) -> Any:
    """Scrapy's ``DOWNLOAD_SLOTS`` as a plain dict (Scrapy keeps dict settings as
    ``BaseSettings``), or the value as it is when it is not a dict, for the error."""
    value = settings.get("DOWNLOAD_SLOTS")
    if isinstance(value, BaseSettings):
        return value.copy_to_dict()
    if isinstance(value, str):
        return _scopes_setting(settings, "DOWNLOAD_SLOTS")
    return value


def _priority(settings: BaseSettings, name: str) -> int:
    return settings.getpriority(name) or 0


def _jitter_setting(settings: BaseSettings) -> Any:
    """The jitter in throttlekit's form, from Scrapy's DOWNLOAD_DELAY_JITTER if it applies."""
    if settings.get("DOWNLOAD_DELAY_JITTER") is None:
        return None  # a Scrapy without it: RANDOMIZE_DOWNLOAD_DELAY as is
    randomize = _priority(settings, "RANDOMIZE_DOWNLOAD_DELAY")
    if randomize > SETTINGS_PRIORITIES["default"] and randomize > _priority(
        settings, "DOWNLOAD_DELAY_JITTER"
    ):
        return None
    try:
        magnitude = settings.getfloat("DOWNLOAD_DELAY_JITTER")
    except ValueError:
        raise ValueError(
            f"DOWNLOAD_DELAY_JITTER must be a number, got {settings.get('DOWNLOAD_DELAY_JITTER')!r}"
        ) from None
    if not (math.isfinite(magnitude) and magnitude >= 0):
        raise ValueError(f"DOWNLOAD_DELAY_JITTER must be a number >= 0, got {magnitude!r}")
    if magnitude >= 1.0:
        # Scrapy floors x(1 - magnitude) at 0; throttlekit's factors stay above 0.
        return (-0.99, magnitude)
    return magnitude


def _instrument(limiter: Limiter, settings: BaseSettings) -> None:
    """Record OpenTelemetry metrics of ``limiter`` as the ``THROTTLING_METRICS_*`` settings say."""
    from ..otel import instrument

    group = settings.get("THROTTLING_METRICS_SCOPE_GROUP")
    if isinstance(group, str):
        try:
            group = load_object(group)
        except (ImportError, NameError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"THROTTLING_METRICS_SCOPE_GROUP: cannot import {group!r}: {exc}"
            ) from None
    try:
        instrument(
            limiter,
            name=settings.get("THROTTLING_METRICS_NAME"),
            per_scope=settings.getbool("THROTTLING_METRICS_PER_SCOPE"),
            scope_group=group,
        )
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"THROTTLING_METRICS_*: {exc}") from None


def _asyncio_available() -> bool:
    try:
        from scrapy.utils.asyncio import is_asyncio_available
    except ImportError:  # pragma: no cover - Scrapy < 2.14
        from scrapy.utils.reactor import is_asyncio_reactor_installed

        return bool(is_asyncio_reactor_installed())
    return bool(is_asyncio_available())


def _max_waiting(settings: BaseSettings, concurrent_requests: int) -> int:
    value = settings.get("THROTTLING_MAX_WAITING")
    if value is None:
        return 4 * max(concurrent_requests, 1)
    try:
        number = settings.getint("THROTTLING_MAX_WAITING")
    except ValueError:
        raise ValueError(f"THROTTLING_MAX_WAITING must be an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"THROTTLING_MAX_WAITING must be >= 0, got {value!r}")
    return number


class ThrottlingMiddleware:
    """A Scrapy downloader middleware that makes each request wait for a throttlekit permit.

    Settings (besides those of :func:`limiter_from_settings`):

    * ``THROTTLING_ENABLED`` (default ``True``): ``False`` disables the middleware.
    * ``THROTTLING_MAX_WAITING`` (default ``4 * CONCURRENT_REQUESTS``): how
      many requests may wait for a permit inside the downloader on top of the
      ``CONCURRENT_REQUESTS`` being downloaded. ``0`` keeps Scrapy's own
      accounting, where waiting requests take ``CONCURRENT_REQUESTS`` seats.
      Ignored when ``CONCURRENT_REQUESTS`` is 0 (unlimited).
    * ``THROTTLING_ROBOTSTXT_OBEY`` (default ``True``): with ``ROBOTSTXT_OBEY``,
      apply robots.txt ``Crawl-delay`` to the host's scope.
    * ``THROTTLING_LIMITER``: an import path of (or) a callable taking the
      crawler and returning the :class:`~throttlekit.Limiter` to use, e.g. one
      with a shared Redis backend; the ``THROTTLING_*``/``BACKOFF_*``... settings
      are then not read.
    * ``THROTTLING_METRICS_ENABLED`` (default ``False``): record OpenTelemetry
      metrics of the limiter (:func:`throttlekit.otel.instrument`, on the global
      meter provider), with ``THROTTLING_METRICS_PER_SCOPE``,
      ``THROTTLING_METRICS_SCOPE_GROUP`` (an import path) and
      ``THROTTLING_METRICS_NAME`` as its ``per_scope``, ``scope_group`` and
      ``name``.

    :param crawler: the running crawler.
    :param limiter: the limiter to use; default: from ``THROTTLING_LIMITER`` or
        :func:`limiter_from_settings`.
    :raises RuntimeError: Scrapy is not running on asyncio (the asyncio reactor).

    Usage (``settings.py``)::

        DOWNLOADER_MIDDLEWARES = {"throttlekit.adapters.scrapy.ThrottlingMiddleware": 950}
        CONCURRENT_REQUESTS_PER_DOMAIN = 2
        DOWNLOAD_DELAY = 0.5
        THROTTLING_SCOPES = {"api.example.com": {"concurrency": 8, "delay": 0.1}}

    The middleware's :attr:`limiter` is the live limiter: its
    :meth:`~throttlekit.Limiter.statistics` show every scope's state.
    """

    def __init__(self, crawler: Crawler, limiter: Limiter | None = None) -> None:
        settings = crawler.settings
        if not settings.getbool("THROTTLING_ENABLED", True):
            raise NotConfigured("THROTTLING_ENABLED is off")
        check_setting_names(settings, _SCRAPY_SETTINGS)
        if not _asyncio_available():
            raise RuntimeError(
                "throttlekit's Scrapy middleware needs asyncio: set TWISTED_REACTOR = "
                '"twisted.internet.asyncioreactor.AsyncioSelectorReactor"'
            )
        if limiter is None:
            factory = settings.get("THROTTLING_LIMITER")
            if factory is None:
                limiter = limiter_from_settings(settings)
            else:
                if isinstance(factory, str):
                    factory = load_object(factory)
                limiter = factory(crawler)
                if not isinstance(limiter, Limiter):
                    raise TypeError(
                        f"THROTTLING_LIMITER must return a throttlekit.Limiter, got {limiter!r}"
                    )
        if UNTHROTTLED_SCOPE not in limiter.policies:
            limiter.set_policy(UNTHROTTLED_SCOPE, _UNTHROTTLED)
        if settings.getbool("THROTTLING_METRICS_ENABLED"):
            _instrument(limiter, settings)
        self.crawler = crawler
        #: The live :class:`~throttlekit.Limiter`.
        self.limiter: Limiter = limiter
        self.stats = crawler.stats
        self.concurrent_requests = max(0, settings.getint("CONCURRENT_REQUESTS"))
        self.max_waiting = _max_waiting(settings, self.concurrent_requests)
        self.obey_crawl_delay = settings.getbool("ROBOTSTXT_OBEY") and settings.getbool(
            "THROTTLING_ROBOTSTXT_OBEY", True
        )
        self._robots_user_agent: str | None = settings.get("ROBOTSTXT_USER_AGENT")
        self._default_user_agent: str = settings.get("USER_AGENT") or "Scrapy"
        self._held: dict[Request, HeldPermit] = {}
        self._waiting: dict[str, set[Request]] = {}  # by Scrapy download slot key
        self._waiting_count = 0
        self._wait_total = 0.0
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._wait_scopes: set[anyio.CancelScope] = set()
        # Scopes whose requests are dropped (ScopeStalled), with when they reopen.
        self._stalled_scopes: dict[str, float] = {}
        self._close_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

        connect = crawler.signals.connect
        connect(self._spider_opened, signal=signals.spider_opened)
        connect(self._spider_closed, signal=signals.spider_closed)
        connect(self._request_reached_downloader, signal=signals.request_reached_downloader)
        robots_parsed = ROBOTS_PARSED_SIGNAL
        self._parse_robots = self.obey_crawl_delay and robots_parsed is None
        if self.obey_crawl_delay and robots_parsed is not None:
            connect(self._robots_parsed, signal=robots_parsed)

        if settings.getbool("AUTOTHROTTLE_ENABLED"):
            logger.warning(
                "AUTOTHROTTLE_ENABLED: Scrapy's AutoThrottle extension has no effect while "
                "throttlekit's ThrottlingMiddleware is enabled (it adjusts the download slot "
                "delays that the middleware sets to 0); throttlekit's own AutoThrottle "
                "controller applies the AUTOTHROTTLE_* settings to every scope instead. "
                'Disable the extension with EXTENSIONS = {"scrapy.extensions.throttle.'
                'AutoThrottle": None} to silence its debug output.'
            )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ThrottlingMiddleware:
        """Scrapy's factory: build the middleware (and its limiter) for ``crawler``.

        A bad setting stops the crawl before it starts with one error line
        naming it (also with ``--nolog``), instead of Scrapy's traceback of
        the same error.
        """
        try:
            return cls(crawler)
        except (ValueError, TypeError, RuntimeError) as exc:
            _report_start_failure(crawler, exc)
            raise

    def __repr__(self) -> str:
        return (
            f"<ThrottlingMiddleware held={len(self._held)} waiting={self._waiting_count} "
            f"limiter={self.limiter!r}>"
        )

    # -- downloader middleware methods ---------------------------------------------

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        """Wait until ``request`` may be sent, then hold its permit until it comes back.

        :raises IgnoreRequest: the request is dropped: its scope stalled (its
            ``max_stall``, see :doc:`/scrapy`), or the engine closed the spider
            while it waited.
        """
        stale = self._held.pop(request, None)
        if stale is not None:
            # The same Request object is back without its previous download
            # having come through process_response/process_exception.
            await self._release_unfinished(stale)
        scopes = _meta_scopes(request.meta)
        downloader = self._downloader()
        key = None
        if downloader is not None:
            key = downloader.get_slot_key(request)
            if scopes is None:
                request.meta[_ASSIGNED_SLOT] = key
            self._wait_in_slot(downloader, key, request)
        stats = self.stats
        self._waiting_count += 1
        start = anyio.current_time()
        wait = anyio.CancelScope()
        self._wait_scopes.add(wait)
        self._arm_close_watch()
        stalled = None
        try:
            with wait:
                held = await HeldPermit.acquire(
                    self.limiter, request, priority=request.priority, scopes=scopes
                )
        except ScopeStalled as exc:
            stalled = exc
        finally:
            self._wait_scopes.discard(wait)
            waited = anyio.current_time() - start
            if waited >= WAITED_THRESHOLD:
                # Counted as a waiter leaves: the peak is seen by its first leaver.
                stats.max_value("throttlekit/max_waiting", self._waiting_count)
            self._waiting_count -= 1
            if downloader is not None and key is not None:
                self._leave_slot(downloader, key, request)
        if stalled is not None:
            self._drop_stalled(request, stalled)
        if wait.cancelled_caught:
            stats.inc_value("throttlekit/dropped_on_close")
            self._requeue_for_resume(request)
            raise IgnoreRequest("throttlekit: the spider is closing; not sent")
        self._held[request] = held
        stats.inc_value("throttlekit/request_count")
        if waited >= WAITED_THRESHOLD:
            self._wait_total += waited
            stats.inc_value("throttlekit/waited_requests")
            stats.set_value("throttlekit/wait_time_total", self._wait_total)
            stats.max_value("throttlekit/wait_time_max", waited)
        self._arm_sweep()

    async def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        """Record how ``request`` went and release its permit."""
        held = self._held.pop(request, None)
        if held is not None:
            try:
                feedback = held.permit.record(
                    response,
                    status=response.status,
                    headers=response.headers,
                    latency=request.meta.get("download_latency"),
                    size=len(response.body),
                    adjust_delay=self._adjusts_delay(request),
                    # A 429's small JSON body may state the wait (Gemini).
                    body=response.body if wants_body(response.status, response.headers) else None,
                )
                self._count_backoff_signal(held, feedback)
                self.stats.inc_value(f"throttlekit/response_status_count/{response.status}")
            finally:
                await held.release()
        if self._parse_robots and _is_robots_txt(request):
            await self._apply_crawl_delay(self._read_robots_txt(response), request)
        return response

    async def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> None:
        """Record the failure of ``request`` (unless it was ignored) and release its permit."""
        held = self._held.pop(request, None)
        if held is not None:
            try:
                if not isinstance(exception, IgnoreRequest):
                    feedback = held.permit.record(exception=exception)
                    self._count_backoff_signal(held, feedback)
                    name = f"{type(exception).__module__}.{type(exception).__qualname__}"
                    self.stats.inc_value(f"throttlekit/exception_count/{name}")
            finally:
                await held.release()

    # -- bookkeeping ---------------------------------------------------------------

    def _adjusts_delay(self, request: Request) -> bool:
        """Scrapy's AutoThrottle rule: learn from a response only if it was timed
        (``download_latency`` in the meta) in a download slot, and its request
        did not set ``autothrottle_dont_adjust_delay`` to True."""
        meta = request.meta
        if meta.get("download_latency") is None:
            return False
        if meta.get("autothrottle_dont_adjust_delay", False) is True:
            return False
        key = meta.get("download_slot")
        if key is None:
            return False
        downloader = self._downloader()
        return downloader is None or key in downloader.slots

    def _downloader(self) -> Any:
        engine = _late(self.crawler, "engine")
        return None if engine is None else engine.downloader

    def _wait_in_slot(self, downloader: Any, key: str, request: Request) -> None:
        """Count a waiting request as active in its download slot (for the scheduler)."""
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = set()
        waiting.add(request)
        slot = downloader.slots.get(key)
        if slot is not None:
            slot.active.add(request)

    def _leave_slot(self, downloader: Any, key: str, request: Request) -> None:
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.discard(request)
            if not waiting:
                del self._waiting[key]
        slot = downloader.slots.get(key)
        if slot is not None:
            # The downloader adds it again when the request enters the slot.
            slot.active.discard(request)

    def _drop_stalled(self, request: Request, stalled: ScopeStalled) -> NoReturn:
        """Drop a request whose scope stalls (see ``max_stall``): count it, say so once
        per stall of the scope, and raise :class:`IgnoreRequest` (the errback gets it)."""
        stats = self.stats
        stats.inc_value("throttlekit/dropped_on_stall")
        scope = stalled.scope
        now = anyio.current_time()
        known = self._stalled_scopes
        reopens_at = known.get(scope)
        if reopens_at is None or reopens_at <= now:  # a new stall of this scope
            for name in [name for name, at in known.items() if at <= now]:
                del known[name]
            stats.inc_value("throttlekit/stalled_scopes")
            logger.info(
                "throttlekit: scope %(scope)s stalled: %(reason)s; it cannot send for "
                "%(wait).0f s, longer than its max_stall of %(max_stall)g s: its requests "
                "are dropped until it reopens",
                {
                    "scope": scope,
                    "wait": stalled.wait,
                    "reason": stalled.reason,
                    "max_stall": stalled.max_stall,
                },
                extra={"spider": _late(self.crawler, "spider")},
            )
        if reopens_at is None or stalled.reopens_at > reopens_at:
            known[scope] = stalled.reopens_at
        logger.debug(
            "Dropped %(request)s: its scope %(scope)s stalled",
            {"request": request, "scope": scope},
            extra={"spider": _late(self.crawler, "spider")},
        )
        raise IgnoreRequest(f"throttlekit: scope {scope!r} stalled; not sent") from stalled

    def _count_backoff_signal(self, held: HeldPermit, feedback: Feedback) -> None:
        limiter = self.limiter
        for scope in held.permit.scopes:
            backoff = limiter.policy(scope).backoff
            if backoff is not None and backoff.is_signal(feedback):
                self.stats.inc_value("throttlekit/backoff_signals")
                return

    async def _release_unfinished(self, held: HeldPermit) -> None:
        self.stats.inc_value("throttlekit/released_unfinished")
        await held.release()

    def _arm_close_watch(self) -> None:
        if self._close_handle is None and self._wait_scopes:
            loop = asyncio.get_running_loop()
            self._close_handle = loop.call_later(CLOSE_CHECK_INTERVAL, self._check_closing)

    def _check_closing(self) -> None:
        """Drop the requests still waiting for a permit once the engine closes the spider.

        Scrapy waits for every request in the downloader before it closes a
        spider, so without this a ``CLOSESPIDER_TIMEOUT`` or a graceful stop
        would go on sending throttled requests for as long as they wait.
        """
        self._close_handle = None
        if self._engine_closing():
            for scope in list(self._wait_scopes):
                scope.cancel()
            return
        self._arm_close_watch()

    def _requeue_for_resume(self, request: Request) -> None:
        """With ``JOBDIR``, put a request dropped at close back in the scheduler.

        The scheduler is still open while the engine waits for the downloader,
        and it saves its queue in ``JOBDIR`` when it closes, so a resumed job
        sends the request then instead of losing it.
        """
        if not self.crawler.settings.get("JOBDIR"):
            return
        engine = _late(self.crawler, "engine")
        scheduler = getattr(getattr(engine, "_slot", None), "scheduler", None)
        if scheduler is None:
            return
        try:
            queued = scheduler.enqueue_request(request.replace(dont_filter=True))
        except Exception:
            logger.warning("could not requeue %s for the resumed job", request, exc_info=True)
            return
        if queued:
            self.stats.inc_value("throttlekit/requeued_on_close")

    def _engine_closing(self) -> bool:
        engine = _late(self.crawler, "engine")
        if engine is None:
            return False
        if not getattr(engine, "running", True):
            return True
        slot = getattr(engine, "_slot", None)
        return slot is not None and getattr(slot, "closing", None) is not None

    def _arm_sweep(self) -> None:
        if self._sweep_handle is None and self._held:
            loop = asyncio.get_running_loop()
            self._sweep_handle = loop.call_later(SWEEP_INTERVAL, self._sweep)

    def _sweep(self) -> None:
        """Release permits of requests that left the downloader without coming back here.

        That happens when a middleware ordered after this one answers with a
        new ``Request`` (Scrapy then skips ``process_response``), so it is rare;
        the check costs one set lookup per held permit every few seconds.
        """
        self._sweep_handle = None
        downloader = self._downloader()
        if downloader is None:
            return
        active = downloader.active
        for request in [request for request in self._held if request not in active]:
            held = self._held.pop(request)
            task = asyncio.ensure_future(self._release_unfinished(held))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._arm_sweep()

    # -- signals -------------------------------------------------------------------

    def _request_reached_downloader(self, request: Request) -> None:
        """Neutralise the request's download slot before Scrapy looks at its delay."""
        downloader = self._downloader()
        if downloader is None:
            return
        key = request.meta.get(downloader.DOWNLOAD_SLOT)
        slot = downloader.slots.get(key)
        if slot is None or not isinstance(key, str):
            return
        slot.delay = 0.0
        slot.concurrency = UNLIMITED_SLOT_CONCURRENCY
        waiting = self._waiting.get(key)
        if waiting:
            slot.active.update(waiting)

    def _spider_opened(self) -> None:
        downloader = self._downloader()
        if downloader is None:  # pragma: no cover - Scrapy always has one by now
            return
        if self.concurrent_requests:
            downloader.total_concurrency = self.concurrent_requests + self.max_waiting
        default = self.limiter.default
        logger.info(
            "throttlekit: at most %s requests downloading at once, %s more may wait for a "
            "permit (THROTTLING_MAX_WAITING); per scope by default: concurrency %s, "
            "delay %g s, slot delay %g s, Adaptive (THROTTLING_ADAPTIVE) %s",
            self.concurrent_requests or "unlimited",
            self.max_waiting if self.concurrent_requests else "any number",
            default.concurrency,
            default.delay,
            default.slot_delay,
            "on: these are its ceiling" if default.adaptive is not None else "off",
        )
        after = _middlewares_after(self, downloader.middleware.middlewares)
        if after:
            logger.warning(
                "downloader middlewares ordered after throttlekit's ThrottlingMiddleware run "
                "while a permit is held and can bypass its release: %s; give "
                "ThrottlingMiddleware the highest order in DOWNLOADER_MIDDLEWARES",
                ", ".join(after),
            )

    async def _spider_closed(self) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        if self._close_handle is not None:
            self._close_handle.cancel()
            self._close_handle = None
        held, self._held = list(self._held.values()), {}
        for permit in held:
            await self._release_unfinished(permit)
        for task in list(self._tasks):
            await task

    async def _robots_parsed(self, robotparser: Any, request: Request) -> None:
        """Apply the Crawl-delay of a robots.txt that Scrapy parsed (``robots_parsed``)."""
        await self._apply_crawl_delay(robotparser.crawl_delay, request)

    def _read_robots_txt(self, response: Response) -> Any:
        """The ``crawl_delay(user_agent)`` of a robots.txt response, for a Scrapy
        without the ``robots_parsed`` signal: from the ``ROBOTSTXT_PARSER`` if it
        has one, else from Protego (Scrapy's default parser)."""
        try:
            parser = load_object(self.crawler.settings.get("ROBOTSTXT_PARSER")).from_crawler(
                self.crawler, response.body
            )
            crawl_delay = getattr(parser, "crawl_delay", None)
            if callable(crawl_delay):
                return crawl_delay
            from protego import Protego
            from scrapy.robotstxt import decode_robotstxt

            return Protego.parse(decode_robotstxt(response.body, None)).crawl_delay
        except Exception:  # a parser failing must not stop the crawl
            logger.exception("cannot parse robots.txt of %s", response.url)
            return None

    async def _apply_crawl_delay(self, crawl_delay: Any, request: Request) -> None:
        """Apply the Crawl-delay of a freshly parsed robots.txt to its host's scope."""
        if crawl_delay is None:
            return
        user_agent: Any = self._robots_user_agent or request.headers.get(
            b"User-Agent", self._default_user_agent
        )
        try:
            delay = crawl_delay(user_agent)
        except Exception:  # a third-party parser failing must not stop the crawl
            logger.exception("cannot read Crawl-delay from robots.txt of %s", request.url)
            return
        if delay is None:
            return
        scopes = await self._host_scopes(request)
        for scope in scopes:
            self.limiter.set_crawl_delay(scope, float(delay))
            self.stats.inc_value("throttlekit/robotstxt_crawl_delay")

    async def _host_scopes(self, request: Request) -> list[str]:
        """The scopes a robots.txt applies to: the host's own scope when the
        resolver gives it, else every scope the resolver gives for the request
        (its ``throttling_scopes`` meta is not a host's scope and is ignored)."""
        result = self.limiter.resolver(request)
        if inspect.isawaitable(result):
            result = await result
        scopes = _scopes.as_scope_costs(result)
        host = _scopes.by_host(request)
        return [host] if host in scopes else list(scopes)


def _late(crawler: Crawler, name: str) -> Any:
    """The crawler's ``engine`` or ``spider``, or ``None`` before the crawl starts
    (Scrapy >= 2.19 raises :class:`RuntimeError` then, older ones give ``None``)."""
    try:
        return getattr(crawler, name, None)
    except RuntimeError:
        return None


def _middlewares_after(middleware: object, middlewares: Iterable[Any]) -> list[str]:
    """Names of the middlewares after ``middleware`` that have request/response hooks."""
    found = False
    names = []
    hooks = ("process_request", "process_response", "process_exception")
    for candidate in middlewares:
        if candidate is middleware:
            found = True
        elif found and any(callable(getattr(candidate, hook, None)) for hook in hooks):
            cls = type(candidate)
            names.append(f"{cls.__module__}.{cls.__qualname__}")
    return names


_UNTHROTTLED = ScopePolicy(
    concurrency=None, delay=0.0, slot_delay=0.0, backoff=None, ignore_robots_txt=True
)


def _meta_scopes(meta: Any) -> Any:
    """The scopes a request's meta asks for instead of its URL's, or ``None``.

    ``throttling_scopes`` is read by the limiter itself; ``dont_throttle``
    gives the unlimited :data:`UNTHROTTLED_SCOPE`; a ``download_slot`` set by
    the user or a plugin (not one Scrapy's downloader gave an earlier
    attempt) is the request's scope.
    """
    if meta.get("throttling_scopes") is not None:
        return None
    if meta.get(DONT_THROTTLE):
        return UNTHROTTLED_SCOPE
    slot = meta.get("download_slot")
    if slot is None or slot == meta.get(_ASSIGNED_SLOT):
        return None
    return str(slot)


def _is_robots_txt(request: Request) -> bool:
    """Whether ``request`` is Scrapy's robots.txt request (RobotsTxtMiddleware's)."""
    if not request.meta.get("dont_obey_robotstxt"):
        return False
    try:
        return urlsplit(request.url).path == "/robots.txt"
    except ValueError:
        return False


#: Where throttlekit's own modules are (errors raised there name the setting).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Exceptions already reported in one line by :func:`_report_start_failure`.
_REPORTED: list[BaseException] = []


def _report_start_failure(crawler: Crawler, exc: BaseException) -> None:
    """Say in one line why the crawl cannot start, and keep Scrapy from adding
    the traceback of the same error (asyncio's "Task exception was never
    retrieved", Twisted's "Unhandled error in Deferred")."""
    message = f"throttlekit: the crawl cannot start: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and not frames[-1].filename.startswith(_PACKAGE_DIR):
        # Raised by the project's code (a THROTTLING_LIMITER factory...): say where.
        message += f" (raised at {frames[-1].filename}:{frames[-1].lineno})"
    logger.critical(message)
    if not crawler.settings.getbool("LOG_ENABLED", True) and logger.hasHandlers():
        # --nolog: Scrapy's handlers print nothing (without any handler,
        # logging's last resort has printed the line already).
        print(message, file=sys.stderr)
    _REPORTED.append(exc)
    del _REPORTED[:-8]  # a process starts few crawls; keep the latest
    for name in ("asyncio", "twisted"):
        target = logging.getLogger(name)
        if _drop_reported not in target.filters:
            target.addFilter(_drop_reported)


def _drop_reported(record: logging.LogRecord) -> bool:
    """A logging filter: drop reports of an error :func:`_report_start_failure` reported."""
    if not _REPORTED:
        return True
    error = record.exc_info[1] if record.exc_info else None
    seen = 0
    while error is not None and seen < 10:
        if any(error is reported for reported in _REPORTED):
            return False
        error = error.__cause__ or error.__context__
        seen += 1
    text = record.getMessage()
    return not any(str(reported) in text for reported in _REPORTED)
