"""Tests for :meth:`Limiter.from_settings`: Scrapy-style throttling settings."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from scrapy.settings import Settings

from throttlekit import Limiter, ScopePolicy

virtual = pytest.mark.parametrize("anyio_backend", ["trio_virtual"], indirect=True)


def test_defaults_are_the_seed_defaults() -> None:
    limiter = Limiter.from_settings({})
    policy = limiter.default
    assert policy.concurrency == 1  # CONCURRENT_REQUESTS_PER_DOMAIN
    assert policy.delay == 1.0  # DOWNLOAD_DELAY
    assert policy.slot_delay == 1.0  # DOWNLOAD_DELAY_PER_SLOT
    assert policy.jitter == (-0.5, 0.5)  # RANDOMIZE_DOWNLOAD_DELAY = True
    assert policy.window == 60.0  # THROTTLING_WINDOW
    assert policy.quota is None
    assert limiter.statistics().concurrency == 16  # CONCURRENT_REQUESTS
    assert limiter.policies == {}


def test_values_of_none_take_the_defaults() -> None:
    limiter = Limiter.from_settings({"DOWNLOAD_DELAY": None, "THROTTLING_SCOPES": None})
    assert limiter.default.delay == 1.0
    assert limiter.policies == {}


def test_every_throttling_setting_is_read() -> None:
    limiter = Limiter.from_settings(
        {
            "CONCURRENT_REQUESTS": 32,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
            "DOWNLOAD_DELAY": 0.25,
            "DOWNLOAD_DELAY_PER_SLOT": 2,
            "RANDOMIZE_DOWNLOAD_DELAY": False,
            "THROTTLING_WINDOW": 30,
        }
    )
    policy = limiter.default
    assert (policy.concurrency, policy.delay, policy.slot_delay) == (4, 0.25, 2.0)
    assert (policy.jitter, policy.window) == ((0.0, 0.0), 30.0)
    assert limiter.statistics().concurrency == 32


def test_string_values_from_the_command_line() -> None:
    limiter = Limiter.from_settings(
        {
            "CONCURRENT_REQUESTS": "8",
            "CONCURRENT_REQUESTS_PER_DOMAIN": "2",
            "DOWNLOAD_DELAY": "0.5",
            "DOWNLOAD_DELAY_PER_SLOT": "0",
            "RANDOMIZE_DOWNLOAD_DELAY": "False",
            "THROTTLING_WINDOW": "10.5",
        }
    )
    policy = limiter.default
    assert (policy.concurrency, policy.delay, policy.slot_delay) == (2, 0.5, 0.0)
    assert (policy.jitter, policy.window) == ((0.0, 0.0), 10.5)
    assert limiter.statistics().concurrency == 8


def test_scrapy_settings_object() -> None:
    """A Scrapy ``Settings`` works as is; Scrapy's own defaults then apply."""
    settings = Settings({"DOWNLOAD_DELAY": 0.2, "CONCURRENT_REQUESTS": 4})
    settings.set("THROTTLING_SCOPES", {"quotes.toscrape.com": {"concurrency": 16, "delay": 0}})
    limiter = Limiter.from_settings(settings)
    assert limiter.default.delay == 0.2
    assert limiter.default.concurrency == settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
    assert limiter.statistics().concurrency == 4
    quotes = limiter.policy("quotes.toscrape.com")
    assert (quotes.concurrency, quotes.delay) == (16, 0.0)


@pytest.mark.parametrize("value", [0, "0"])
def test_zero_global_cap_means_unlimited(value: Any) -> None:
    assert Limiter.from_settings({"CONCURRENT_REQUESTS": value}).statistics().concurrency is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, (-0.5, 0.5)),
        (False, (0.0, 0.0)),
        (1, (-0.5, 0.5)),  # Scrapy reads 1 and 0 as booleans here
        (0, (0.0, 0.0)),
        (0.2, (-0.2, 0.2)),
        ([0.1, 0.3], (0.1, 0.3)),
        ((-0.2, 0.4), (-0.2, 0.4)),
        (["-0.2", "0.4"], (-0.2, 0.4)),
        ("True", (-0.5, 0.5)),
        ("true", (-0.5, 0.5)),
        ("1", (-0.5, 0.5)),
        ("False", (0.0, 0.0)),
        ("0", (0.0, 0.0)),
        ("0.3", (-0.3, 0.3)),
        (None, (-0.5, 0.5)),  # unset: the default, True
    ],
)
def test_randomize_download_delay(value: Any, expected: tuple[float, float]) -> None:
    assert Limiter.from_settings({"RANDOMIZE_DOWNLOAD_DELAY": value}).default.jitter == expected


@pytest.mark.parametrize(
    ("settings", "error", "names"),
    [
        ({"CONCURRENT_REQUESTS": 2.5}, ValueError, "CONCURRENT_REQUESTS"),
        ({"CONCURRENT_REQUESTS": "many"}, ValueError, "CONCURRENT_REQUESTS"),
        ({"CONCURRENT_REQUESTS_PER_DOMAIN": 0}, ValueError, "CONCURRENT_REQUESTS_PER_DOMAIN"),
        ({"CONCURRENT_REQUESTS_PER_DOMAIN": "x"}, ValueError, "CONCURRENT_REQUESTS_PER_DOMAIN"),
        ({"DOWNLOAD_DELAY": -1}, ValueError, "DOWNLOAD_DELAY"),
        ({"DOWNLOAD_DELAY": "slow"}, ValueError, "DOWNLOAD_DELAY"),
        ({"DOWNLOAD_DELAY": True}, TypeError, "DOWNLOAD_DELAY"),
        ({"DOWNLOAD_DELAY": float("inf")}, ValueError, "DOWNLOAD_DELAY"),
        ({"DOWNLOAD_DELAY_PER_SLOT": -0.5}, ValueError, "DOWNLOAD_DELAY_PER_SLOT"),
        ({"RANDOMIZE_DOWNLOAD_DELAY": 1.5}, ValueError, "RANDOMIZE_DOWNLOAD_DELAY"),
        ({"RANDOMIZE_DOWNLOAD_DELAY": "sometimes"}, ValueError, "RANDOMIZE_DOWNLOAD_DELAY"),
        ({"RANDOMIZE_DOWNLOAD_DELAY": [0.5, 0.1]}, ValueError, "RANDOMIZE_DOWNLOAD_DELAY"),
        ({"THROTTLING_WINDOW": 0}, ValueError, "THROTTLING_WINDOW"),
        ({"THROTTLING_SCOPES": ["a.example"]}, TypeError, "THROTTLING_SCOPES"),
        ({"THROTTLING_SCOPES": {"a": 2}}, TypeError, r"THROTTLING_SCOPES\['a'\]"),
        (
            {"THROTTLING_SCOPES": {"a": {"speed": 2}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\] has unknown key 'speed'; known keys: .*concurrency",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"delay": -1}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]: delay must be",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"concurrency": 0}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]: concurrency must be >= 1",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"concurrency": 1.5}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]\['concurrency'\] must be an integer",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"quota": "lots"}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]\['quota'\] must be a number",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"window": 0}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]: window must be",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"jitter": 2}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]: jitter must be in",
        ),
    ],
)
def test_errors_name_the_setting(
    settings: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        Limiter.from_settings(settings)


def test_throttling_scopes() -> None:
    limiter = Limiter.from_settings(
        {
            "DOWNLOAD_DELAY": 2.0,
            "RANDOMIZE_DOWNLOAD_DELAY": False,
            "THROTTLING_WINDOW": 10,
            "THROTTLING_SCOPES": {
                "quotes.toscrape.com": {"concurrency": 16, "delay": 0.0},
                "api.example.com": {
                    "concurrency": None,
                    "quota": 100,
                    "window": 3600,
                    "jitter": [0, 0.5],
                    "slot_delay": 0,
                },
                "old-name.example": {"delay_per_slot": "3"},
                "bare.example": {},
            },
        }
    )
    quotes = limiter.policy("quotes.toscrape.com")
    assert (quotes.concurrency, quotes.delay, quotes.slot_delay) == (16, 0.0, 1.0)
    assert (quotes.jitter, quotes.window) == ((0.0, 0.0), 10.0)  # the rest from the defaults
    api = limiter.policy("api.example.com")
    assert (api.concurrency, api.quota, api.window, api.jitter) == (None, 100.0, 3600.0, (0, 0.5))
    assert api.delay == 2.0
    assert api.slot_delay == 0.0
    assert limiter.policy("old-name.example").slot_delay == 3.0
    assert limiter.policy("bare.example") == limiter.default
    assert limiter.policy("unlisted.example") == limiter.default
    assert set(limiter.policies) == {
        "quotes.toscrape.com",
        "api.example.com",
        "old-name.example",
        "bare.example",
    }


def test_keyword_arguments_override_the_settings() -> None:
    limiter = Limiter.from_settings(
        {"CONCURRENT_REQUESTS": 4}, concurrency=None, max_waiters=7, seed=3
    )
    assert limiter.statistics().concurrency is None
    assert limiter.max_waiters == 7
    default = ScopePolicy(delay=0)
    assert Limiter.from_settings({}, default=default).default is default


async def _send_times(limiter: Limiter, count: int, response_time: float) -> list[float]:
    times: list[float] = []

    async def request() -> None:
        async with limiter.acquire("https://example.com/page") as permit:
            times.append(permit.granted_at)
            await anyio.sleep(response_time)

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(request)
    return times


@virtual
@pytest.mark.anyio
async def test_seed_example_two_slots_and_a_per_slot_delay() -> None:
    """2 slots, DOWNLOAD_DELAY 0.3, DOWNLOAD_DELAY_PER_SLOT 1.0: sends at 0.0, 0.3 and 1.0."""
    settings = {
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "DOWNLOAD_DELAY": 0.3,
        "DOWNLOAD_DELAY_PER_SLOT": 1.0,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
    }
    times = await _send_times(Limiter.from_settings(settings), 3, response_time=0.1)
    assert times == pytest.approx([0.0, 0.3, 1.0])
    # With slow responses, the third request also waits for a slot to be free.
    start = anyio.current_time() + 100
    await anyio.sleep_until(start)
    times = await _send_times(Limiter.from_settings(settings), 3, response_time=1.5)
    assert [t - start for t in times] == pytest.approx([0.0, 0.3, 1.5])


@virtual
@pytest.mark.anyio
async def test_delay_longer_than_responses_makes_concurrency_one() -> None:
    limiter = Limiter.from_settings(
        {
            "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
            "DOWNLOAD_DELAY": 1.0,
            "DOWNLOAD_DELAY_PER_SLOT": 0,
            "RANDOMIZE_DOWNLOAD_DELAY": False,
        }
    )
    times = await _send_times(limiter, 5, response_time=0.2)
    assert times == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])


@virtual
@pytest.mark.anyio
async def test_concurrent_requests_caps_the_per_domain_concurrency() -> None:
    limiter = Limiter.from_settings(
        {
            "CONCURRENT_REQUESTS": 2,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
            "DOWNLOAD_DELAY": 0,
            "DOWNLOAD_DELAY_PER_SLOT": 0,
        }
    )
    times = await _send_times(limiter, 6, response_time=1.0)
    assert times == pytest.approx([0.0, 0.0, 1.0, 1.0, 2.0, 2.0])


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"CONCURRENT_REQUESTS": -1}, "CONCURRENT_REQUESTS"),
        ({"THROTTLING_ROBOTSTXT_MAX_DELAY": -1}, "THROTTLING_ROBOTSTXT_MAX_DELAY"),
    ],
)
def test_negative_limits_name_the_setting(settings: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Limiter.from_settings(settings)


def test_throttling_scopes_as_json_text() -> None:
    limiter = Limiter.from_settings({"THROTTLING_SCOPES": '{"api.test": {"concurrency": 4}}'})
    assert limiter.policy("api.test").concurrency == 4
    with pytest.raises(ValueError, match="THROTTLING_SCOPES"):
        Limiter.from_settings({"THROTTLING_SCOPES": "{not json"})
