"""Tests for :meth:`Limiter.from_settings`: Scrapy-style throttling settings."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest
from scrapy.settings import Settings

from throttlekit import AutoThrottle, Backoff, Limiter, Rampup, ScopePolicy

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
            r"THROTTLING_SCOPES\['a'\]\['delay'\]: delay must be a finite number >= 0",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"concurrency": 0}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]\['concurrency'\]: concurrency must be >= 1",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"concurrency": 1.5}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]\['concurrency'\] must be an int >= 1 or None",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"quota": "lots"}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]\['quota'\] must be a finite number > 0 or None",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"window": 0}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]\['window'\]: window must be",
        ),
        (
            {"THROTTLING_SCOPES": {"a": {"jitter": 2}}},
            ValueError,
            r"THROTTLING_SCOPES\['a'\]\['jitter'\]: jitter must be in",
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


# -- every invalid value is an error naming the setting and what it allows --------------------

#: Values no numeric option accepts: non-finite, too large for a float, wrong types.
NON_FINITE = [math.nan, math.inf, -math.inf, "nan", "inf", "-inf", "1e400", "NaN"]
HUGE = [10**400, -(10**400), str(10**400)]
WRONG_TYPE = [object(), [object()], {"x": 1}, b"1", (), Settings]


def _bad(*specific: Any, bool_ok: bool = False) -> list[Any]:
    return [*NON_FINITE, *HUGE, *WRONG_TYPE, *specific, *(() if bool_ok else (True, False))]


#: Every setting with values it must refuse (``None`` means "the default", so it is valid).
BAD_SETTINGS: dict[str, list[Any]] = {
    "CONCURRENT_REQUESTS": _bad(-1, 2.5, "many", "2.5"),
    "CONCURRENT_REQUESTS_PER_DOMAIN": _bad(0, -1, 1.5, "x", "0"),
    "THROTTLING_SCOPE_CONCURRENCY": _bad(0, -1, 1.5, "x", "0"),
    "THROTTLING_SCOPE_LIMIT": _bad(0, -1, 1.5, "x", "0"),
    "DOWNLOAD_DELAY": _bad(-1, -0.001, "slow", "-1"),
    "DOWNLOAD_DELAY_PER_SLOT": _bad(-1, "x"),
    "RANDOMIZE_DOWNLOAD_DELAY": _bad(
        1.5,
        -0.1,
        1.0,
        "sometimes",
        "1.5",
        [0.5, 0.1],
        [-1, 0],
        [0.1],
        [math.nan, 0.1],
        bool_ok=True,
    ),
    "THROTTLING_WINDOW": _bad(0, -1, "0"),
    "THROTTLING_MAX_STALL": _bad(0, -1, "0", "x"),
    "THROTTLING_SCOPES": [
        *WRONG_TYPE[:2],
        b"1",
        5,
        math.nan,
        ["a.example"],
        "not json",
        '"a string"',
        "[1, 2]",
        "1e400",
        {"": {}},
        {1: {}},
        {"a.example": 2},
        {"a.example": None},
        {"a.example": "fast"},
        True,
        False,
        0,
        [],
        "",
    ],
    "DOWNLOAD_SLOTS": [
        *WRONG_TYPE[:2],
        0,
        False,
        [],
        True,
        "not json",
        {"a.example": 2},
        {"a.example": {"speed": 1}},
        {"a.example": {"delay": -1}},
        {"a.example": {"concurrency": 0}},
        {"a.example": {"randomize_delay": "sometimes"}},
    ],
    "THROTTLING_ROBOTSTXT_MAX_DELAY": _bad(-1, "x"),
    "BACKOFF_HTTP_CODES": [
        *WRONG_TYPE[:1],
        5,
        429,
        math.nan,
        [42],
        [1000],
        [429.5],
        ["x"],
        [math.nan],
        [10**400],
        ["inf"],
        [True],
        "429,x",
    ],
    "BACKOFF_EXCEPTIONS": [*WRONG_TYPE[:2], 5, math.nan, ["nodots"], [5], "nodots", [None]],
    "BACKOFF_DELAY_FACTOR": _bad(1, 0.5, 0, -1, "x"),
    "BACKOFF_MIN_DELAY": _bad(0, -1, 1000, "x"),
    "BACKOFF_MAX_DELAY": _bad(0, -1, 0.5, "x"),
    "BACKOFF_JITTER": _bad(1.0, -0.5, [0.5, 0.1], "x", bool_ok=True),
    "BACKOFF_WINDOW": _bad(0, -1, "x"),
    "BACKOFF_CONCURRENCY_FACTOR": _bad(0, 1, 1.5, -1, "x"),
    "BACKOFF_ERROR_SHARE": _bad(1, 1.5, -0.1, "x"),
    "RAMPUP_BACKOFF_TARGET": _bad(-1, 1.5, [3, 1], [1, 2, 3], [1.5, 2], "many"),
    "AUTOTHROTTLE_ENABLED": [*NON_FINITE, *HUGE, *WRONG_TYPE, "sometimes", 2, -1],
    "AUTOTHROTTLE_START_DELAY": _bad(-1, "x"),
    "AUTOTHROTTLE_MAX_DELAY": _bad(0, -1, "x"),
    "AUTOTHROTTLE_TARGET_CONCURRENCY": _bad(0, -1, "x"),
    "AUTOTHROTTLE_DEBUG": [*NON_FINITE, *HUGE, *WRONG_TYPE, "sometimes", 2, -1],
    "THROTTLING_ADAPTIVE": [*NON_FINITE, *HUGE, *WRONG_TYPE, "sometimes", 2, "{bad json"],
}

_NUMBER = _bad
#: Every key of a THROTTLING_SCOPES entry with values it must refuse.
BAD_SCOPE_KEYS: dict[str, list[Any]] = {
    "concurrency": _NUMBER(0, -1, 1.5, "x"),
    "delay": _NUMBER(-1, None, "x"),
    "slot_delay": _NUMBER(-1, None),
    "delay_per_slot": _NUMBER(-1, None),
    "jitter": _NUMBER(1.5, [0.5, 0.1], "x", bool_ok=True),
    "quota": _NUMBER(0, -1, "x"),
    "window": _NUMBER(0, -1, None),
    "max_stall": _NUMBER(0, -1, "x"),
    "ignore_robots_txt": [*NON_FINITE, *HUGE, *WRONG_TYPE, "sometimes", 2, None],
    "backoff": [*NON_FINITE[:2], *HUGE[:1], *WRONG_TYPE, "yes", 5, [1], {"unknown": 1}],
    "rampup": ["yes", 5, [1], {"unknown": 1}, *WRONG_TYPE[:2]],
    "autothrottle": ["yes", 5, [1], {"unknown": 1}, *WRONG_TYPE[:2]],
    "adaptive": ["yes", 5, [1], {"unknown": 1}, *WRONG_TYPE[:2]],
    "manager": [
        *NON_FINITE,
        *HUGE,
        *WRONG_TYPE[:4],
        5,
        "nodots",
        "no_such_module_here.Thing",
        "math.no_such_name",
        "math.pi",
        [5],
        "builtins.len",
        "builtins.str",
        "collections.OrderedDict",
    ],
    "controllers": [5, "nodots", "math.pi", [None], *WRONG_TYPE[:2]],
}
#: Every key of the nested backoff / rampup / autothrottle dicts, with values they refuse.
BAD_CONTROLLER_KEYS: dict[str, dict[str, list[Any]]] = {
    "backoff": {
        "http_codes": BAD_SETTINGS["BACKOFF_HTTP_CODES"],
        "exceptions": BAD_SETTINGS["BACKOFF_EXCEPTIONS"],
        "delay_factor": BAD_SETTINGS["BACKOFF_DELAY_FACTOR"],
        "min_delay": _NUMBER(0, -1, 1000),
        "max_delay": _NUMBER(0, -1, 0.5),
        "jitter": BAD_SETTINGS["BACKOFF_JITTER"],
        "window": _NUMBER(0, -1),
        "concurrency_factor": BAD_SETTINGS["BACKOFF_CONCURRENCY_FACTOR"],
        "error_share": BAD_SETTINGS["BACKOFF_ERROR_SHARE"],
    },
    "rampup": {
        "target": BAD_SETTINGS["RAMPUP_BACKOFF_TARGET"],
        "window": _NUMBER(0, -1),
        "min_delay": _NUMBER(-1),
        "max_concurrency": _NUMBER(0, -1, 1.5),
        "concurrency_factor": _NUMBER(1, 0.5, 0, -1),
    },
    "autothrottle": {
        "start_delay": _NUMBER(-1),
        "max_delay": _NUMBER(0, -1),
        "target_concurrency": _NUMBER(0, -1),
        "debug": BAD_SETTINGS["AUTOTHROTTLE_DEBUG"],
    },
    "adaptive": {
        "start_rate": _NUMBER(0, -1),
        "headroom": _NUMBER(0, 1, -0.5),
        "hold": _NUMBER(0, -1, 100),
        "max_hold": _NUMBER(0, -1, 5),
        "overload_share": _NUMBER(0, 1),
        "overload_cut": _NUMBER(0, 1.5),
        "max_concurrency": _NUMBER(0, -1, 1.5),
    },
}


def _cases() -> list[Any]:
    cases = []
    for setting, values in BAD_SETTINGS.items():
        settings = {"AUTOTHROTTLE_ENABLED": True} if setting.startswith("AUTOTHROTTLE_") else {}
        for value in values:
            cases.append(
                pytest.param({**settings, setting: value}, setting, id=f"{setting}={value!r:.40}")
            )
    for key, values in BAD_SCOPE_KEYS.items():
        for value in values:
            name = f"THROTTLING_SCOPES['a.example']['{key}']"
            scopes = {"a.example": {key: value}}
            cases.append(
                pytest.param({"THROTTLING_SCOPES": scopes}, name, id=f"{name}={value!r:.40}")
            )
    for controller, keys in BAD_CONTROLLER_KEYS.items():
        for key, values in keys.items():
            for value in values:
                name = f"THROTTLING_SCOPES['a.example']['{controller}']"
                scopes = {"a.example": {controller: {key: value}}}
                cases.append(
                    pytest.param(
                        {"THROTTLING_SCOPES": scopes}, name, id=f"{name}[{key}]={value!r:.40}"
                    )
                )
    return cases


def test_the_table_covers_every_setting_and_key() -> None:
    from throttlekit._settings import (
        _ADAPTIVE_KEYS,
        _AUTOTHROTTLE_KEYS,
        _BACKOFF_KEYS,
        _CONTROLLER_KEYS,
        _POLICY_KEYS,
        _RAMPUP_KEYS,
        DEFAULT_SETTINGS,
    )

    assert set(BAD_SETTINGS) == set(DEFAULT_SETTINGS)
    assert set(BAD_SCOPE_KEYS) == {*_POLICY_KEYS, *_CONTROLLER_KEYS}
    assert set(BAD_CONTROLLER_KEYS["backoff"]) == set(_BACKOFF_KEYS)
    assert set(BAD_CONTROLLER_KEYS["rampup"]) == set(_RAMPUP_KEYS)
    assert set(BAD_CONTROLLER_KEYS["autothrottle"]) == set(_AUTOTHROTTLE_KEYS)
    assert set(BAD_CONTROLLER_KEYS["adaptive"]) == set(_ADAPTIVE_KEYS)


@pytest.mark.parametrize(("settings", "name"), _cases())
def test_every_invalid_value_names_the_setting_and_what_it_allows(
    settings: dict[str, Any], name: str
) -> None:
    with pytest.raises((ValueError, TypeError)) as error:
        Limiter.from_settings(settings)
    assert type(error.value) in (ValueError, TypeError), repr(error.value)
    message = str(error.value)
    assert name in message, message
    assert any(word in message for word in (" must ", " needs ", "unknown key")), message


def test_non_finite_and_huge_numbers_in_the_python_api_name_the_field() -> None:
    for value in (math.nan, math.inf, 10**400, -(10**400)):
        for field in ("delay", "slot_delay", "window", "quota", "jitter"):
            with pytest.raises(ValueError, match=rf"^{field}( pair)? must be"):
                ScopePolicy(**{field: value})
        for cls, field in (
            (Backoff, "delay_factor"),
            (Backoff, "max_delay"),
            (Backoff, "concurrency_factor"),
            (Backoff, "error_share"),
            (AutoThrottle, "target_concurrency"),
            (Rampup, "concurrency_factor"),
        ):
            with pytest.raises(ValueError, match=rf"^{field} must be"):
                cls(**{field: value})
    with pytest.raises(TypeError, match=r"^delay must be a number >= 0, got str '1'"):
        ScopePolicy(delay="1")  # type: ignore[arg-type]


# -- Scrapy's newer names, DOWNLOAD_SLOTS, misspelt names, Adaptive's ceiling -------------------


def test_scrapys_newer_names_mean_the_same() -> None:
    """``THROTTLING_SCOPE_CONCURRENCY`` replaces ``CONCURRENT_REQUESTS_PER_DOMAIN``;
    ``THROTTLING_SCOPE_LIMIT`` is the most scopes kept (``Limiter(max_scopes=...)``)."""
    from throttlekit._settings import limiter_options

    options = limiter_options({"THROTTLING_SCOPE_CONCURRENCY": 3, "THROTTLING_SCOPE_LIMIT": 7})
    assert (options["default"].concurrency, options["max_scopes"]) == (3, 7)
    assert limiter_options({})["max_scopes"] == 100_000
    both = {"CONCURRENT_REQUESTS_PER_DOMAIN": 2, "THROTTLING_SCOPE_CONCURRENCY": 5}
    assert Limiter.from_settings(both).default.concurrency == 5
    assert Limiter.from_settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 2}).default.concurrency == 2
    with pytest.raises(ValueError, match="THROTTLING_SCOPE_CONCURRENCY"):
        Limiter.from_settings({**both, "THROTTLING_SCOPE_CONCURRENCY": 0})


def test_download_slots_are_scopes_and_throttling_scopes_win() -> None:
    limiter = Limiter.from_settings(
        {
            "DOWNLOAD_SLOTS": {
                "a.test": {"concurrency": 3, "delay": 0.5, "randomize_delay": False},
                "b.test": {"delay": 2},
                "c.test": {"jitter": 0.25},  # Scrapy 2.19's magnitude
            },
            "THROTTLING_SCOPES": {"b.test": {"delay": 0.25, "quota": 10}},
        }
    )
    a, b = limiter.policy("a.test"), limiter.policy("b.test")
    assert (a.concurrency, a.delay, a.jitter) == (3, 0.5, (0.0, 0.0))
    assert (b.delay, b.quota) == (0.25, 10)
    assert limiter.policy("c.test").jitter == (-0.25, 0.25)
    with pytest.raises(ValueError, match=r"DOWNLOAD_SLOTS\['a'\]\['delay'\]"):
        Limiter.from_settings({"DOWNLOAD_SLOTS": {"a": {"delay": -1}}})


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("CONCURENT_REQUESTS", "CONCURRENT_REQUESTS"),
        ("DOWNLOAD_DELAY_PERSLOT", "DOWNLOAD_DELAY_PER_SLOT"),
        ("THROTLING_SCOPES", "THROTTLING_SCOPES"),
        ("BACKOFF_MAXDELAY", "BACKOFF_MAX_DELAY"),
    ],
)
def test_a_misspelt_setting_is_an_error_with_the_closest_name(name: str, closest: str) -> None:
    with pytest.raises(ValueError, match=rf"^unknown setting {name}: did you mean {closest}\?$"):
        Limiter.from_settings({name: 4})


def test_other_settings_are_not_taken_for_misspellings() -> None:
    Limiter.from_settings({"USER_AGENT": "x", "DOWNLOAD_TIMEOUT": 5, "CONCURRENT_ITEMS": 9})
    Limiter.from_settings({"CONCURRENT_REQUESTS_PER_IP": 2})  # Scrapy's, gone from newer ones


def test_under_adaptive_the_delays_not_given_are_zero() -> None:
    policy = Limiter.from_settings({"THROTTLING_ADAPTIVE": True}).default
    assert (policy.delay, policy.slot_delay) == (0.0, 0.0)
    given = {"THROTTLING_ADAPTIVE": True, "DOWNLOAD_DELAY": 0.5, "DOWNLOAD_DELAY_PER_SLOT": 2}
    policy = Limiter.from_settings(given).default
    assert (policy.delay, policy.slot_delay) == (0.5, 2.0)


def test_scrapys_own_defaults_are_not_taken_for_misspellings() -> None:
    """Scrapy's ``Settings`` hold every default of its version (2.13 still had
    ``CONCURRENT_REQUESTS_PER_IP``): only the names given are checked."""
    settings = Settings({"DOWNLOAD_DELAY": 0.5})
    settings.set("CONCURRENT_REQUESTS_PER_IPS", 1, priority="default")
    assert Limiter.from_settings(settings).default.delay == 0.5
    settings.set("CONCURENT_REQUESTS", 1, priority="project")
    with pytest.raises(ValueError, match="unknown setting CONCURENT_REQUESTS"):
        Limiter.from_settings(settings)


def test_a_scopes_adaptive_moves_the_delays_not_given() -> None:
    limiter = Limiter.from_settings(
        {
            "THROTTLING_SCOPES": {
                "api.test": {"adaptive": True},
                "slow.test": {"adaptive": True, "delay": 2},
            }
        }
    )
    assert limiter.default.delay == 1.0
    assert (limiter.policy("api.test").delay, limiter.policy("api.test").slot_delay) == (0, 0)
    assert limiter.policy("slow.test").delay == 2.0
    everywhere = {"THROTTLING_ADAPTIVE": True, "THROTTLING_SCOPES": {"a.test": {"adaptive": False}}}
    policy = Limiter.from_settings(everywhere).policy("a.test")
    assert (policy.delay, policy.slot_delay) == (1.0, 1.0)
    given = {**everywhere, "DOWNLOAD_DELAY": 0.5}
    assert Limiter.from_settings(given).policy("a.test").delay == 0.5
