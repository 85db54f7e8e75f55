"""Scrapy's own AutoThrottle test cases, ported, run three ways each.

The cases are those of Scrapy's AutoThrottle test module: the enabled
switch, the target-concurrency check, the start, min and max delay
definitions, the adjustment table and its limits, the bad-response rule,
the skip rules and the debug line. Each runs

* ``middleware``: through :class:`ThrottlingMiddleware`, built by Scrapy's
  downloader of a real ``Crawler`` (``scrapy.utils.test.get_crawler``), the
  request and response passing through ``process_request`` and
  ``process_response`` as the downloader would pass them;
* ``scrapy-settings``: through :meth:`Limiter.from_settings` with Scrapy's
  ``Settings``, feedback given with :meth:`Permit.record`;
* ``dict``: through :meth:`Limiter.from_settings` with a plain dict.

Where throttlekit deliberately differs, one line says so:

* DIFFERENCE (default DOWNLOAD_DELAY): a plain dict without it has the seed's 1.0, not 0.
* DIFFERENCE (bad target concurrency): <= 0 raises naming it; Scrapy disables the extension.
* DIFFERENCE (logger): the debug line's logger is throttlekit.autothrottle.
* DIFFERENCE (debug "conc"): the scope's requests in flight, not the slot's transfers.
* DIFFERENCE (no latency, outside Scrapy): Permit.record times the response from the grant.
* DIFFERENCE (no download slot, outside Scrapy): the Limiter has none; a timed response adjusts.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import scrapy
from scrapy import Request
from scrapy.core.downloader import Slot
from scrapy.http import Response
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from test_adapter_scrapy import ROOT, documented_settings

from throttlekit import Limiter
from throttlekit.adapters.scrapy import ThrottlingMiddleware

URL = "https://example.com"
#: Scrapy's defaults, as its AutoThrottle tests import them.
START_DELAY, MAX_DELAY, SCRAPY_DOWNLOAD_DELAY = 5.0, 60.0, 0.0
#: Before Scrapy 2.14 a crawler cannot be built without an installed reactor
#: (the real crawls of test_adapter_scrapy cover the middleware there).
IN_PROCESS = pytest.mark.skipif(
    scrapy.version_info < (2, 14), reason="in-process crawlers need Scrapy >= 2.14"
)
MIDDLEWARE_WAY = pytest.param("middleware", marks=IN_PROCESS)
WAYS = (MIDDLEWARE_WAY, "scrapy-settings", "dict")
UNSET = object()

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Scrapy runs on asyncio


def _slot() -> Slot:
    """A real download slot, for Scrapy versions before and after ``jitter``."""
    if "jitter" in inspect.signature(Slot).parameters:
        return Slot(1, 0.0, jitter=0.0)
    return Slot(1, 0.0, False)


@contextlib.asynccontextmanager
async def middleware_of(
    settings: dict[str, Any], slots: tuple[str, ...] = ()
) -> AsyncIterator[ThrottlingMiddleware]:
    """The middleware a real crawler's downloader builds; ``slots`` exist in the downloader."""
    crawler = get_crawler(
        settings_dict={
            "DOWNLOADER_MIDDLEWARES": {"throttlekit.adapters.scrapy.ThrottlingMiddleware": 950},
            "DOWNLOAD_HANDLERS": {"http": None, "https": None},  # no download here
            **settings,
        }
    )
    crawler.engine = crawler._create_engine()
    downloader = crawler.engine.downloader
    for key in slots:
        downloader.slots[key] = _slot()
    middleware = crawler.get_downloader_middleware(ThrottlingMiddleware)
    assert middleware is not None
    try:
        yield middleware
    finally:
        await middleware._spider_closed()
        downloader.close()


def limiter_of(way: str, settings: dict[str, Any]) -> Limiter:
    """The limiter the ``scrapy-settings`` or ``dict`` way builds from ``settings``."""
    if way == "scrapy-settings":
        return Limiter.from_settings(Settings(settings))
    return Limiter.from_settings(dict(settings))


def enabled(settings: dict[str, Any]) -> dict[str, Any]:
    """As Scrapy's tests' ``get_crawler``: AutoThrottle on."""
    return {"AUTOTHROTTLE_ENABLED": True, **settings}


async def respond(
    way: str,
    settings: dict[str, Any],
    meta: dict[str, Any],
    *,
    status: int = 200,
    body: bytes = b"",
    slots: tuple[str, ...] = ("foo",),
) -> tuple[float, float]:
    """The scope's delay before and after one response to a request with ``meta``."""
    request = Request(URL, meta=dict(meta))
    response = Response(URL, status=status, body=body, request=request)
    if way == "middleware":
        async with middleware_of(settings, slots) as middleware:
            await middleware.process_request(request)
            scope = request.meta.get("download_slot") or "example.com"
            before = middleware.limiter.scope_statistics(scope)
            await middleware.process_response(request, response)
            after = middleware.limiter.scope_statistics(scope)
    else:
        limiter = limiter_of(way, settings)
        async with limiter.acquire(request) as permit:
            before = limiter.scope_statistics("example.com")
            permit.record(response, latency=meta.get("download_latency"), size=len(body))
            after = limiter.scope_statistics("example.com")
    assert before is not None
    assert after is not None
    return before.delay, after.delay


async def start_delay(way: str, settings: dict[str, Any]) -> float:
    """The delay of a new scope: AutoThrottle's start delay."""
    before, _ = await respond(way, settings, {"autothrottle_dont_adjust_delay": True})
    return before


# -- enabling, and the target-concurrency check -----------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("value", "expected"), [(UNSET, False), (False, False), (True, True)])
async def test_enabled(way: str, value: object, expected: bool) -> None:
    settings = {} if value is UNSET else {"AUTOTHROTTLE_ENABLED": value}
    if way == "middleware":
        async with middleware_of(settings) as middleware:
            autothrottle = middleware.limiter.default.autothrottle
    else:
        autothrottle = limiter_of(way, settings).default.autothrottle
    assert (autothrottle is not None) is expected


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("value", [0.0, -1.0])
async def test_target_concurrency_invalid(way: str, value: float) -> None:
    settings = enabled({"AUTOTHROTTLE_TARGET_CONCURRENCY": value})
    # DIFFERENCE (bad target concurrency): an error naming the setting, not a disabled extension.
    if way == "middleware":
        with pytest.raises(ValueError, match="AUTOTHROTTLE_TARGET_CONCURRENCY"):
            await middleware_of(settings).__aenter__()
    else:
        with pytest.raises(ValueError, match="AUTOTHROTTLE_TARGET_CONCURRENCY"):
            limiter_of(way, settings)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("value", [0.0, -1.0, "lots"])
async def test_autothrottle_settings_are_not_read_when_disabled(way: str, value: object) -> None:
    """Scrapy builds no extension when AutoThrottle is off, so it reads none of its settings."""
    settings = {"AUTOTHROTTLE_ENABLED": False, "AUTOTHROTTLE_TARGET_CONCURRENCY": value}
    if way == "middleware":
        async with middleware_of(settings) as middleware:
            assert middleware.limiter.default.autothrottle is None
    else:
        assert limiter_of(way, settings).default.autothrottle is None


# -- the min, max and start delay -------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("setting", "expected"), [(UNSET, SCRAPY_DOWNLOAD_DELAY), (1.0, 1.0)])
async def test_min_delay_definition(way: str, setting: object, expected: float) -> None:
    settings = enabled({} if setting is UNSET else {"DOWNLOAD_DELAY": setting})
    if way == "dict" and setting is UNSET:
        expected = 1.0  # DIFFERENCE (default DOWNLOAD_DELAY): the seed's 1.0.
    if way == "middleware":
        async with middleware_of(settings) as middleware:
            assert middleware.limiter.default.delay == expected
    else:
        assert limiter_of(way, settings).default.delay == expected


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("value", "expected"), [(UNSET, MAX_DELAY), (1.0, 1.0)])
async def test_max_delay_definition(way: str, value: object, expected: float) -> None:
    settings = enabled({} if value is UNSET else {"AUTOTHROTTLE_MAX_DELAY": value})
    if way == "middleware":
        async with middleware_of(settings) as middleware:
            autothrottle = middleware.limiter.default.autothrottle
    else:
        autothrottle = limiter_of(way, settings).default.autothrottle
    assert autothrottle is not None
    assert autothrottle.max_delay == expected


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    ("min_setting", "start_setting", "expected"),
    [
        (UNSET, UNSET, START_DELAY),
        (START_DELAY - 1.0, UNSET, START_DELAY),
        (START_DELAY + 1.0, UNSET, START_DELAY + 1.0),
        (UNSET, START_DELAY - 1.0, START_DELAY - 1.0),
        (UNSET, START_DELAY + 1.0, START_DELAY + 1.0),
        (START_DELAY + 2.0, START_DELAY + 1.0, START_DELAY + 2.0),
        (START_DELAY + 1.0, START_DELAY + 2.0, START_DELAY + 2.0),
    ],
)
async def test_start_delay_definition(
    way: str, min_setting: object, start_setting: object, expected: float
) -> None:
    settings: dict[str, Any] = {}
    if min_setting is not UNSET:
        settings["DOWNLOAD_DELAY"] = min_setting
    if start_setting is not UNSET:
        settings["AUTOTHROTTLE_START_DELAY"] = start_setting
    assert await start_delay(way, enabled(settings)) == expected


# -- which responses adjust the delay ---------------------------------------------------------

SCRAPY_SKIPPED = [
    ({}, None),
    ({"download_latency": 1.0}, None),
    ({"download_slot": "foo"}, None),
    ({"download_slot": "foo"}, "foo"),
    ({"download_latency": 1.0, "download_slot": "foo"}, None),
    (
        {"download_latency": 1.0, "download_slot": "foo", "autothrottle_dont_adjust_delay": True},
        "foo",
    ),
]


@IN_PROCESS
@pytest.mark.parametrize(("meta", "slot"), SCRAPY_SKIPPED)
async def test_skipped_through_the_middleware(meta: dict[str, Any], slot: str | None) -> None:
    slots = () if slot is None else (slot,)
    before, after = await respond("middleware", enabled({}), meta, slots=slots)
    assert before == after == START_DELAY


@pytest.mark.parametrize("way", ["scrapy-settings", "dict"])
@pytest.mark.parametrize(("meta", "slot"), SCRAPY_SKIPPED)
async def test_skipped_outside_scrapy(way: str, meta: dict[str, Any], slot: str | None) -> None:
    before, after = await respond(way, enabled({}), meta)
    assert before == START_DELAY
    if meta.get("autothrottle_dont_adjust_delay"):
        assert after == START_DELAY
    elif "download_latency" not in meta:
        # DIFFERENCE (no latency, outside Scrapy): timed from the grant (~0 s): halfway down.
        assert after == pytest.approx(START_DELAY / 2, abs=0.05)
    else:
        # DIFFERENCE (no download slot, outside Scrapy): latency 1.0 adjusts.
        assert after == 3.0


#: Every combination of the meta keys (and of the slot being in the downloader).
COMBINATIONS = list(
    itertools.product(
        [None, 1.0],  # download_latency
        ["absent", "unknown", "present"],  # download_slot: none / not in the downloader / in it
        [None, True, False, 1],  # autothrottle_dont_adjust_delay (only True skips, as in Scrapy)
    )
)


@IN_PROCESS
@pytest.mark.parametrize(("latency", "slot", "dont_adjust"), COMBINATIONS)
async def test_skip_rules_for_every_combination(
    latency: float | None, slot: str, dont_adjust: object
) -> None:
    meta: dict[str, Any] = {}
    if latency is not None:
        meta["download_latency"] = latency
    if slot != "absent":
        meta["download_slot"] = "foo"
    if dont_adjust is not None:
        meta["autothrottle_dont_adjust_delay"] = dont_adjust
    slots = ("foo",) if slot == "present" else ()
    _, after = await respond("middleware", enabled({}), meta, slots=slots)
    adjusts = latency is not None and slot == "present" and dont_adjust is not True
    assert after == (3.0 if adjusts else START_DELAY)


# -- the adjustment ---------------------------------------------------------------------------


def timed(latency: float) -> dict[str, Any]:
    return {"download_latency": latency, "download_slot": "foo"}


#: The dict way states Scrapy's DOWNLOAD_DELAY = 0 (its own default is the seed's 1.0).
MIN_ZERO = {"DOWNLOAD_DELAY": 0.0}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    ("download_latency", "target_concurrency", "slot_delay", "expected"),
    [
        (2.0, 2.0, 1.0, 1.0),
        (1.0, 2.0, 1.0, 0.75),
        (4.0, 2.0, 1.0, 2.0),
        (2.0, 1.0, 1.0, 2.0),
        (2.0, 4.0, 1.0, 0.75),
        (2.0, 2.0, 0.5, 1.0),
        (2.0, 2.0, 2.0, 1.5),
    ],
)
async def test_adjustment(
    way: str, download_latency: float, target_concurrency: float, slot_delay: float, expected: float
) -> None:
    settings = enabled(
        {
            **MIN_ZERO,
            "AUTOTHROTTLE_TARGET_CONCURRENCY": target_concurrency,
            "AUTOTHROTTLE_START_DELAY": slot_delay,
        }
    )
    before, after = await respond(way, settings, timed(download_latency))
    assert before == slot_delay
    assert after == expected


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    ("min_delay", "max_delay", "expected"), [(0.5, 2.0, 1.0), (0.25, 0.5, 0.5), (2.0, 4.0, 2.0)]
)
async def test_adjustment_limits(
    way: str, min_delay: float, max_delay: float, expected: float
) -> None:
    # Without the limits, latency 2.0 at target concurrency 2.0 from 1.0 gives 1.0.
    settings = enabled(
        {
            "AUTOTHROTTLE_MAX_DELAY": max_delay,
            "AUTOTHROTTLE_TARGET_CONCURRENCY": 2.0,
            "AUTOTHROTTLE_START_DELAY": 1.0,
            "DOWNLOAD_DELAY": min_delay,
        }
    )
    _, after = await respond(way, settings, timed(2.0))
    assert after == expected


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    ("download_latency", "target_concurrency", "slot_delay", "expected"),
    [
        (2.0, 2.0, 1.0, 1.0),
        (1.0, 2.0, 1.0, 1.0),  # 0.75 for a 200: a bad response never lowers the delay
        (4.0, 2.0, 1.0, 2.0),
    ],
)
async def test_adjustment_bad_response(
    way: str, download_latency: float, target_concurrency: float, slot_delay: float, expected: float
) -> None:
    settings = enabled(
        {
            **MIN_ZERO,
            "AUTOTHROTTLE_TARGET_CONCURRENCY": target_concurrency,
            "AUTOTHROTTLE_START_DELAY": slot_delay,
        }
    )
    _, after = await respond(way, settings, timed(download_latency), status=400)
    assert after == expected


# -- the debug line ---------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
async def test_debug(way: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = enabled({**MIN_ZERO, "AUTOTHROTTLE_DEBUG": True, "AUTOTHROTTLE_START_DELAY": 2.0})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="throttlekit.autothrottle"):
        await respond(way, settings, timed(1.0), body=b"foo")
    # The middleware's scope is the request's download_slot; the Limiter's, its host.
    slot = "foo" if way == "middleware" else "example.com"
    line = f"slot: {slot} | conc: 1 | delay: 1500 ms (-500) | latency: 1000 ms | size:     3 bytes"
    records = [record for record in caplog.record_tuples if record[0] == "throttlekit.autothrottle"]
    assert records == [
        (
            "throttlekit.autothrottle",  # DIFFERENCE (logger)
            logging.INFO,
            line,  # DIFFERENCE (debug "conc"): 1, the request in flight.
        )
    ]


@pytest.mark.parametrize("way", WAYS)
async def test_debug_disabled(way: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="throttlekit.autothrottle"):
        await respond(way, enabled({**MIN_ZERO, "AUTOTHROTTLE_START_DELAY": 2.0}), timed(1.0))
    assert [r for r in caplog.record_tuples if r[0] == "throttlekit.autothrottle"] == []


# -- the migration page -----------------------------------------------------------------------


def test_the_migration_page_lists_the_differences_asserted_here() -> None:
    assert __doc__ is not None
    asserted = re.findall(r"DIFFERENCE \(([^)]+)\)", __doc__)
    page = (ROOT / "docs" / "migrating.rst").read_text()
    listed = re.findall(r"^\* \*\*(.+?)\*\*:", page, re.MULTILINE)
    assert asserted
    assert sorted(listed) == sorted(asserted)


@IN_PROCESS
async def test_the_migration_example_keeps_scrapys_numbers() -> None:
    settings = documented_settings("docs/migrating.rst")
    assert settings["AUTOTHROTTLE_ENABLED"] is True
    minimum, start = settings["DOWNLOAD_DELAY"], settings["AUTOTHROTTLE_START_DELAY"]
    target_concurrency = settings["AUTOTHROTTLE_TARGET_CONCURRENCY"]
    before, after = await respond("middleware", settings, timed(0.5))
    # Scrapy's rules, stated on their own: start at max(min, start); move to
    # the mean of the old delay and latency / target, never below that target.
    assert before == max(minimum, start)
    target = 0.5 / target_concurrency
    assert after == min(
        max(minimum, max(target, (before + target) / 2)), settings["AUTOTHROTTLE_MAX_DELAY"]
    )
