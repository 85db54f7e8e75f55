"""Tests for :mod:`throttlekit.headers`."""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterator
from email.utils import formatdate
from typing import Any

import attrs
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from scrapy.http import Headers as ScrapyHeaders

from throttlekit.headers import (
    EMPTY,
    RateLimitInfo,
    parse,
    parse_retry_after,
    retry_after_counts,
    wants_body,
)

#: Tue, 14 Nov 2023 22:13:20 GMT
NOW = 1_700_000_000.0
#: 1994-11-06 08:49:00 UTC, a moment before the RFC 9110 example dates.
NOW_1994 = 784_111_740.0
MAX_DELAY = 300.0


def http_date(offset: float) -> str:
    """The IMF-fixdate *offset* seconds after ``NOW``."""
    return formatdate(NOW + offset, usegmt=True)


#: The attributes every parse case compares (``interval`` and ``budgets`` only when given;
#: ``reset_step`` has its own test).
COMPARED = [
    name
    for name in attrs.fields_dict(RateLimitInfo)
    if name not in ("interval", "budgets", "reset_step")
]


def expect(**fields: object) -> dict[str, object]:
    """The compared attributes of a :class:`RateLimitInfo`: ``None`` unless given."""
    return {**dict.fromkeys(COMPARED), **fields}


def fields_of(info: RateLimitInfo, expected: dict[str, object]) -> dict[str, object]:
    """The attributes of ``info`` that ``expected`` describes; budgets by name."""
    actual = attrs.asdict(info, recurse=False)
    actual["budgets"] = tuple(budget.budget for budget in info.budgets)
    return {name: actual[name] for name in expected}


def ietf(**fields: object) -> dict[str, object]:
    """A draft-10 result: each ``RateLimit`` item is a budget named by its policy."""
    budget = fields["policy"] if "remaining" in fields else None
    return expect(source="ietf", budget=budget, **fields)


def legacy(**fields: object) -> dict[str, object]:
    return expect(source="ietf-legacy", **fields)


def x_ratelimit(**fields: object) -> dict[str, object]:
    return expect(source="x-ratelimit", **fields)


def many_items(count: int, restrictive_at: int) -> str:
    """A draft-10 ``RateLimit`` List where only item *restrictive_at* has ``r=0``."""
    value = ", ".join(f"p{i};r={0 if i == restrictive_at else 9}" for i in range(count))
    assert (len(value) <= 8192) == (count <= 600)
    return value


#: What a response without any usable rate-limit header gives.
EMPTY_FIELDS = expect()

PARSE_CASES = [
    # --- Retry-After -------------------------------------------------------
    pytest.param({"Retry-After": "120"}, expect(retry_after=120.0), id="retry-after-seconds"),
    pytest.param({"retry-after": "1.5"}, expect(retry_after=1.5), id="retry-after-decimal"),
    pytest.param({"RETRY-AFTER": "0"}, expect(retry_after=0.0), id="retry-after-zero"),
    pytest.param({"Retry-After": " 30 \t"}, expect(retry_after=30.0), id="retry-after-ows"),
    pytest.param(
        {"Retry-After": "99999999999"}, expect(retry_after=MAX_DELAY), id="retry-after-clamped"
    ),
    pytest.param(
        {"Retry-After": http_date(120)}, expect(retry_after=120.0), id="retry-after-imf-fixdate"
    ),
    pytest.param(
        {"Retry-After": "Tuesday, 14-Nov-23 22:14:20 GMT"},
        expect(retry_after=60.0),
        id="retry-after-rfc850",
    ),
    pytest.param(
        {"Retry-After": "Tue Nov 14 22:14:50 2023"},
        expect(retry_after=90.0),
        id="retry-after-asctime",
    ),
    pytest.param(
        {"Retry-After": http_date(-3600)}, expect(retry_after=0.0), id="retry-after-past-date"
    ),
    pytest.param(
        {"Retry-After": http_date(120), "Date": http_date(100)},
        expect(retry_after=20.0),
        id="retry-after-relative-to-date-header",
    ),
    pytest.param(
        {"Retry-After": http_date(120), "Date": "yesterday"},
        expect(retry_after=120.0),
        id="retry-after-invalid-date-header-uses-now",
    ),
    pytest.param(
        [("Retry-After", http_date(120)), ("Date", http_date(100)), ("Date", http_date(90))],
        expect(retry_after=30.0),
        id="retry-after-duplicate-date-headers-take-earliest",
    ),
    pytest.param(
        [("Retry-After", "5"), ("retry-after", "30"), ("RETRY-AFTER", "bogus")],
        expect(retry_after=30.0),
        id="retry-after-duplicates-take-largest",
    ),
    pytest.param({"Retry-After": "5, 30"}, expect(retry_after=30.0), id="retry-after-comma-joined"),
    # --- IETF draft-10 structured fields --------------------------------------
    pytest.param(
        {"RateLimit-Policy": '"default";q=100;w=60', "RateLimit": '"default";r=50;t=30'},
        ietf(remaining=50.0, reset=30.0, limit=100.0, window=60.0, policy="default"),
        id="ietf-single-policy",
    ),
    pytest.param(
        {
            "RateLimit-Policy": '"default";q=100;w=60, "daily";q=1000;w=86400',
            "RateLimit": '"default";r=50;t=30, "daily";r=10;t=3000',
        },
        ietf(remaining=10.0, reset=MAX_DELAY, limit=1000.0, window=86400.0, policy="daily"),
        id="ietf-most-restrictive-policy",
    ),
    pytest.param(
        {"RateLimit": '"a";r=0;t=10, "b";r=0;t=20, "c";r=0'},
        ietf(remaining=0.0, reset=20.0, policy="b"),
        id="ietf-tie-takes-largest-reset",
    ),
    pytest.param(
        {"RateLimit-Policy": "default;q=100;w=60", "RateLimit": "default;r=5;t=1"},
        ietf(remaining=5.0, reset=1.0, limit=100.0, window=60.0, policy="default"),
        id="ietf-token-keys",
    ),
    pytest.param(
        {"RateLimit": '"default";r=5;t=1;pk=:cHJvamVjdDEyMw==:'},
        ietf(remaining=5.0, reset=1.0, policy="default", partition_key="project123"),
        id="ietf-partition-key",
    ),
    pytest.param(
        {
            "RateLimit-Policy": '"default";q=100;qu="requests";pk=:dXNlcjE=:',
            "RateLimit": '"default";r=5',
        },
        ietf(remaining=5.0, limit=100.0, policy="default", partition_key="user1"),
        id="ietf-partition-key-from-policy",
    ),
    pytest.param(
        {"RateLimit-Policy": '"burst";q=100;w=60, "daily";q=1000;w=86400'},
        ietf(limit=1000.0, window=86400.0, policy="daily"),
        id="ietf-policy-alone-smallest-rate",
    ),
    pytest.param(
        {"RateLimit-Policy": '"other";q=100;w=60', "RateLimit": '"default";r=5;t=1'},
        ietf(remaining=5.0, reset=1.0, policy="default"),
        id="ietf-state-without-matching-policy",
    ),
    pytest.param(
        {"RateLimit": '"a";r=1.5;t=2.5'},
        ietf(remaining=1.5, reset=2.5, policy="a"),
        id="ietf-decimal-parameters",
    ),
    pytest.param({"RateLimit": '"a";t=5'}, EMPTY_FIELDS, id="ietf-without-r-ignored"),
    pytest.param({"RateLimit": '"a";r=-1;t=5'}, EMPTY_FIELDS, id="ietf-negative-r-ignored"),
    pytest.param({"RateLimit": '"a";r=?1;t=5'}, EMPTY_FIELDS, id="ietf-boolean-r-ignored"),
    pytest.param({"RateLimit": '("a" "b");r=1'}, EMPTY_FIELDS, id="ietf-inner-list-ignored"),
    pytest.param(
        {"RateLimit-Policy": '"default";q=100;w=60,,', "RateLimit": '"default";r=5;t=1'},
        ietf(remaining=5.0, reset=1.0, policy="default"),
        id="ietf-invalid-policy-ignored",
    ),
    pytest.param(
        [("RateLimit", '"a";r=5;t=1'), ("RateLimit", '"b";r=2;t=9'), ("RateLimit", "nonsense!")],
        ietf(remaining=2.0, reset=9.0, policy="b"),
        id="ietf-several-field-lines",
    ),
    # --- older IETF drafts ----------------------------------------------------
    pytest.param(
        {"RateLimit-Limit": "100", "RateLimit-Remaining": "50", "RateLimit-Reset": "30"},
        legacy(limit=100.0, remaining=50.0, reset=30.0),
        id="legacy-separate-fields",
    ),
    pytest.param(
        {"RateLimit-Limit": "100, 100;w=60", "RateLimit-Remaining": "0", "RateLimit-Reset": "7"},
        legacy(limit=100.0, window=60.0, remaining=0.0, reset=7.0),
        id="legacy-limit-with-policy",
    ),
    pytest.param(
        {"RateLimit": "limit=100, remaining=50, reset=30"},
        legacy(limit=100.0, remaining=50.0, reset=30.0),
        id="legacy-dictionary-form",
    ),
    pytest.param(
        [
            ("RateLimit-Remaining", "5"),
            ("ratelimit-remaining", "3"),
            ("RateLimit-Reset", "10"),
            ("RateLimit-Reset", "20"),
        ],
        legacy(remaining=3.0, reset=20.0),
        id="legacy-duplicates-most-restrictive",
    ),
    pytest.param(
        {"RateLimit-Reset": "1700000100"},
        legacy(reset=100.0),
        id="legacy-reset-unix-time",
    ),
    # --- de facto X-RateLimit -------------------------------------------------
    pytest.param(
        {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999", "X-RateLimit-Reset": "30"},
        x_ratelimit(limit=5000.0, remaining=4999.0, reset=30.0),
        id="x-delta-reset",
    ),
    pytest.param(
        {"X-RateLimit-Reset": "1700000100"}, x_ratelimit(reset=100.0), id="x-epoch-seconds"
    ),
    pytest.param(
        {"X-RateLimit-Reset": "1700000042500"}, x_ratelimit(reset=42.5), id="x-epoch-millis"
    ),
    pytest.param({"X-RateLimit-Reset": "1699990000"}, x_ratelimit(reset=0.0), id="x-epoch-past"),
    pytest.param(
        {"X-Rate-Limit-Limit": "15", "X-Rate-Limit-Remaining": "0", "X-Rate-Limit-Reset": "60"},
        x_ratelimit(limit=15.0, remaining=0.0, reset=60.0),
        id="x-rate-limit-prefix",
    ),
    pytest.param({"X-RateLimit-Reset-After": "12.5"}, x_ratelimit(reset=12.5), id="x-reset-after"),
    pytest.param(
        {"X-RateLimit-Reset": http_date(45)}, x_ratelimit(reset=45.0), id="x-reset-http-date"
    ),
    pytest.param(
        [
            ("X-RateLimit-Limit", "100"),
            ("X-RateLimit-Limit", "60"),
            ("X-RateLimit-Remaining", "10"),
            ("x-ratelimit-remaining", "4"),
            ("X-RateLimit-Reset", "5"),
            ("X-RateLimit-Reset", "50"),
        ],
        x_ratelimit(limit=60.0, remaining=4.0, reset=50.0),
        id="x-duplicates-most-restrictive",
    ),
    # --- precedence -------------------------------------------------------------
    pytest.param(
        {
            "RateLimit": '"default";r=1;t=2',
            "RateLimit-Remaining": "20",
            "X-RateLimit-Remaining": "30",
        },
        ietf(remaining=1.0, reset=2.0, policy="default"),
        id="precedence-ietf-first",
    ),
    pytest.param(
        {"RateLimit-Remaining": "20", "X-RateLimit-Remaining": "30", "X-RateLimit-Reset": "9"},
        legacy(remaining=20.0),
        id="precedence-legacy-over-x",
    ),
    pytest.param(
        {"RateLimit-Policy": '"default";q=100;w=60', "X-RateLimit-Remaining": "30"},
        x_ratelimit(remaining=30.0),
        id="precedence-live-state-over-policy-alone",
    ),
    pytest.param(
        {"RateLimit": "limit=10, remaining=1, reset=3", "X-RateLimit-Remaining": "30"},
        legacy(limit=10.0, remaining=1.0, reset=3.0),
        id="precedence-invalid-structured-falls-back-to-dictionary",
    ),
    pytest.param(
        {"Retry-After": "7", "RateLimit": '"default";r=0;t=30'},
        ietf(retry_after=7.0, remaining=0.0, reset=30.0, policy="default"),
        id="retry-after-alongside-ratelimit",
    ),
    # --- hostile input ----------------------------------------------------------
    pytest.param(None, EMPTY_FIELDS, id="none"),
    pytest.param({}, EMPTY_FIELDS, id="empty-mapping"),
    pytest.param({"Content-Type": "text/html"}, EMPTY_FIELDS, id="unrelated-headers"),
    pytest.param({"Retry-After": ""}, EMPTY_FIELDS, id="retry-after-empty"),
    pytest.param({"Retry-After": " \t "}, EMPTY_FIELDS, id="retry-after-whitespace"),
    pytest.param({"Retry-After": "-5"}, EMPTY_FIELDS, id="retry-after-negative"),
    pytest.param({"Retry-After": "1e400"}, EMPTY_FIELDS, id="retry-after-exponent"),
    pytest.param({"Retry-After": "nan"}, EMPTY_FIELDS, id="retry-after-nan"),
    pytest.param({"Retry-After": "inf"}, EMPTY_FIELDS, id="retry-after-inf"),
    pytest.param({"Retry-After": "1" * 21}, EMPTY_FIELDS, id="retry-after-too-many-digits"),
    pytest.param({"Retry-After": "\uff11\uff12"}, EMPTY_FIELDS, id="retry-after-fullwidth-digits"),
    pytest.param({"Retry-After": "1_000"}, EMPTY_FIELDS, id="retry-after-underscore"),
    pytest.param(
        {"Retry-After": "Fri, 31 Feb 2023 10:00:00 GMT"}, EMPTY_FIELDS, id="retry-after-bad-day"
    ),
    pytest.param(
        {"Retry-After": "Tue, 14 Nov 2023 25:00:00 GMT"}, EMPTY_FIELDS, id="retry-after-bad-hour"
    ),
    pytest.param(
        {"Retry-After": "Tue, 14 Nov 2023 23:15:20 +0100"},
        expect(retry_after=120.0),
        id="retry-after-numeric-zone",
    ),
    pytest.param({"Retry-After": "9" * 10_000_000}, EMPTY_FIELDS, id="retry-after-10-mb"),
    pytest.param(
        {"RateLimit": '"a";r=0;t=' + "9" * 10_000_000}, EMPTY_FIELDS, id="ratelimit-10-mb"
    ),
    pytest.param(
        {"RateLimit": many_items(10_000, restrictive_at=0)},
        EMPTY_FIELDS,
        id="ratelimit-10000-items-over-8-kib",
    ),
    pytest.param(
        {"RateLimit": many_items(600, restrictive_at=31)},
        ietf(remaining=0.0, policy="p31"),
        id="ratelimit-32nd-item-considered",
    ),
    pytest.param(
        {"RateLimit": many_items(600, restrictive_at=32)},
        ietf(remaining=9.0, policy="p0"),
        id="ratelimit-33rd-item-ignored",
    ),
    pytest.param(
        [("Retry-After", "1")] * 10_000 + [("Retry-After", "200")],
        expect(retry_after=1.0),
        id="retry-after-10000-fields-first-16-considered",
    ),
    pytest.param(
        [("Retry-After", "1")] * 15 + [("Retry-After", "200")],
        expect(retry_after=200.0),
        id="retry-after-16th-field-considered",
    ),
    pytest.param(
        {"X-RateLimit-Remaining": ", ".join(["9"] * 32 + ["0"])},
        x_ratelimit(remaining=9.0),
        id="x-33rd-list-member-ignored",
    ),
    pytest.param(
        [(b"Retry-After", b"\xff\xfe5"), (b"RateLimit", b'"\xe9";r=1'), (b"X-\xff", b"1")],
        EMPTY_FIELDS,
        id="non-ascii-bytes",
    ),
    pytest.param(
        {"RateLimit": "\u00e9t\u00e9;r=1", "X-RateLimit-Remaining": "\u0661"},
        EMPTY_FIELDS,
        id="non-ascii-text",
    ),
    pytest.param(
        {"RateLimit": '"a";r=1;t=2;' + ";".join(["x"] * 3000)},
        ietf(remaining=1.0, reset=2.0, policy="a"),
        id="ratelimit-thousands-of-parameters",
    ),
    pytest.param(
        {"RateLimit": '"unterminated;r=1', "RateLimit-Remaining": "4"},
        legacy(remaining=4.0),
        id="ratelimit-unterminated-string",
    ),
    pytest.param(
        {"RateLimit-Limit": "0", "X-RateLimit-Limit": "-1"}, EMPTY_FIELDS, id="zero-limit"
    ),
    pytest.param({"Retry-After-" + "x" * 5000: "5"}, EMPTY_FIELDS, id="long-header-name"),
]


@pytest.mark.parametrize(("headers", "expected"), PARSE_CASES)
def test_parse(headers: Any, expected: dict[str, object]) -> None:
    info = parse(headers, now=NOW, max_delay=MAX_DELAY)
    assert fields_of(info, expected) == expected


# --- vendor dialects, with the examples of their own documentation -----------------

#: 2025-10-25T11:59:30Z, half a minute before the Anthropic example's resets.
NOW_ANTHROPIC = 1_761_393_570.0
#: 30 s before the GitLab example's ``RateLimit-Reset: 1609844400``.
NOW_GITLAB = 1_609_844_370.0

OPENAI_EXAMPLE = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}
ANTHROPIC_EXAMPLE = {
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2025-10-25T12:00:00Z",
    "anthropic-ratelimit-tokens-limit": "50000",
    "anthropic-ratelimit-tokens-remaining": "49500",
    "anthropic-ratelimit-tokens-reset": "2025-10-25T12:01:00Z",
    "anthropic-ratelimit-input-tokens-limit": "40000",
    "anthropic-ratelimit-input-tokens-remaining": "39600",
    "anthropic-ratelimit-input-tokens-reset": "2025-10-25T12:01:00Z",
    "anthropic-ratelimit-output-tokens-limit": "8000",
    "anthropic-ratelimit-output-tokens-remaining": "0",
    "anthropic-ratelimit-output-tokens-reset": "2025-10-25T12:00:10.5Z",
}

VENDOR_CASES = [
    pytest.param(
        OPENAI_EXAMPLE,
        NOW,
        expect(
            source="openai",
            budget="requests",
            limit=60.0,
            remaining=59.0,
            reset=1.0,
            interval=1.0 / 59,
            budgets=("requests", "tokens"),
        ),
        id="openai-docs-example",
    ),
    pytest.param(
        {**OPENAI_EXAMPLE, "x-ratelimit-remaining-tokens": "0"},
        NOW,
        expect(
            source="openai",
            budget="tokens",
            limit=150000.0,
            remaining=0.0,
            reset=MAX_DELAY,
            budgets=("requests", "tokens"),
        ),
        id="openai-tokens-spent-are-the-most-restrictive",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1h2m3.5s"},
        NOW,
        expect(source="openai", budget="requests", remaining=0.0, reset=MAX_DELAY),
        id="openai-go-duration-hours",
    ),
    pytest.param(
        {"x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "20ms"},
        NOW,
        expect(source="openai", budget="tokens", remaining=10.0, reset=0.02, interval=0.002),
        id="openai-go-duration-milliseconds",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "2m59.56s"},
        NOW,
        expect(source="openai", budget="requests", remaining=5.0, reset=179.56, interval=35.912),
        id="openai-style-fractional-seconds",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "7.5"},
        NOW,
        expect(source="openai", budget="requests", remaining=3.0, reset=7.5, interval=2.5),
        id="openai-reset-plain-seconds",
    ),
    pytest.param({"retry-after-ms": "1500"}, NOW, expect(retry_after=1.5), id="retry-after-ms"),
    pytest.param(
        {"Retry-After": "2", "retry-after-ms": "1500"},
        NOW,
        expect(retry_after=1.5),
        id="retry-after-ms-wins-over-retry-after",
    ),
    pytest.param(
        {"Retry-After": "2", "retry-after-ms": "soon"},
        NOW,
        expect(retry_after=2.0),
        id="invalid-retry-after-ms-falls-back",
    ),
    pytest.param(
        {"retry-after-ms": "99999999999"},
        NOW,
        expect(retry_after=MAX_DELAY),
        id="retry-after-ms-clamped",
    ),
    pytest.param(
        {**ANTHROPIC_EXAMPLE, "retry-after": "10"},
        NOW_ANTHROPIC,
        expect(
            source="anthropic",
            budget="output-tokens",
            retry_after=10.0,
            limit=8000.0,
            remaining=0.0,
            reset=40.5,
            budgets=("requests", "tokens", "input-tokens", "output-tokens"),
        ),
        id="anthropic-docs-example",
    ),
    pytest.param(
        {
            "anthropic-ratelimit-requests-remaining": "1",
            "anthropic-ratelimit-requests-reset": "2025-10-25T13:59:40+02:00",
        },
        NOW_ANTHROPIC,
        expect(source="anthropic", budget="requests", remaining=1.0, reset=10.0, interval=10.0),
        id="anthropic-reset-with-offset",
    ),
    pytest.param(
        {
            "RateLimit-Limit": "60",
            "RateLimit-Name": "throttle_authenticated_web",
            "RateLimit-Observed": "67",
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": "1609844400",
            "RateLimit-ResetTime": "Tue, 05 Jan 2021 11:00:00 GMT",
            "Retry-After": "30",
        },
        NOW_GITLAB,
        legacy(retry_after=30.0, limit=60.0, remaining=0.0, reset=30.0),
        id="gitlab-docs-example",
    ),
    pytest.param(
        {"RateLimit-Limit": "60", "RateLimit-Observed": "45"},
        NOW_GITLAB,
        legacy(limit=60.0, remaining=15.0),
        id="gitlab-observed-gives-remaining",
    ),
    pytest.param(
        {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "4999",
            "x-ratelimit-used": "1",
            "x-ratelimit-reset": "1700003600",
            "x-ratelimit-resource": "core",
        },
        NOW,
        x_ratelimit(limit=5000.0, remaining=4999.0, reset=MAX_DELAY),
        id="github-docs-example",
    ),
    pytest.param(
        {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": "1470173023.123",
            "X-RateLimit-Reset-After": "1.123",
            "X-RateLimit-Bucket": "abcd1234",
        },
        1_470_173_022.0,
        x_ratelimit(limit=5.0, remaining=0.0, reset=1.123),
        id="discord-docs-example",
    ),
    pytest.param(
        {"X-Ratelimit-Used": "4", "X-Ratelimit-Remaining": "596.0", "X-Ratelimit-Reset": "540"},
        NOW,
        x_ratelimit(limit=600.0, remaining=596.0, reset=MAX_DELAY),
        id="reddit-used-gives-limit",
    ),
    pytest.param(
        {
            "x-rate-limit-limit": "900",
            "x-rate-limit-remaining": "0",
            "x-rate-limit-reset": "1700000060",
        },
        NOW,
        x_ratelimit(limit=900.0, remaining=0.0, reset=60.0),
        id="x-docs-example",
    ),
    pytest.param(
        {"X-Shopify-Shop-Api-Call-Limit": "40/40", "Retry-After": "2.0"},
        NOW,
        expect(retry_after=2.0),
        id="shopify-retry-after",
    ),
    pytest.param(
        {"Ratelimit": '"default";r=50;t=30', "Ratelimit-Policy": '"burst";q=100;w=60'},
        NOW,
        ietf(remaining=50.0, reset=30.0, policy="default"),
        id="cloudflare-ietf-example",
    ),
    pytest.param(
        {
            "X-RateLimit-Limit": "1200",
            "X-RateLimit-Remaining": "0",
            "Retry-After": "60",
            "X-RateLimit-Reset": http_date(60),
        },
        NOW,
        x_ratelimit(retry_after=60.0, limit=1200.0, remaining=0.0, reset=60.0),
        id="cloudflare-rfc1123-reset",
    ),
    pytest.param(
        {"Stripe-Rate-Limited-Reason": "global-rate"},
        NOW,
        EMPTY_FIELDS,
        id="stripe-says-nothing-to-parse",
    ),
    pytest.param(
        {
            "RateLimit-Policy": '"hour";q=1000;w=3600, "day";q=5000;w=86400',
            "RateLimit": '"day";r=100;t=36000',
        },
        NOW,
        ietf(
            remaining=100.0,
            reset=MAX_DELAY,
            interval=MAX_DELAY,
            limit=5000.0,
            window=86400.0,
            policy="day",
        ),
        id="ietf-draft-10-two-windows-pace-from-uncapped-reset",
    ),
    pytest.param(
        {
            "RateLimit-Policy": '"hour";q=1000;w=3600, "day";q=5000;w=86400',
            "RateLimit": '"hour";r=50;t=1800, "day";r=100;t=36000',
        },
        NOW,
        ietf(
            remaining=100.0,
            reset=MAX_DELAY,
            interval=MAX_DELAY,
            limit=5000.0,
            window=86400.0,
            policy="day",
            budgets=("hour", "day"),
        ),
        id="ietf-slowest-pace-is-the-most-restrictive",
    ),
]


#: Hostile values of each new header: ignored, clamped, never raising.
HOSTILE_VENDOR_CASES = [
    pytest.param({"retry-after-ms": "-5"}, expect(), id="retry-after-ms-negative"),
    pytest.param({"retry-after-ms": "1e9"}, expect(), id="retry-after-ms-exponent"),
    pytest.param({"retry-after-ms": "nan"}, expect(), id="retry-after-ms-nan"),
    pytest.param({"retry-after-ms": "9" * 21}, expect(), id="retry-after-ms-too-long"),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "9" * 19 + "h"},
        expect(source="openai", budget="requests", remaining=0.0, reset=MAX_DELAY),
        id="go-duration-huge-is-clamped",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1h" * 30},
        expect(source="openai", budget="requests", remaining=0.0),
        id="go-duration-too-long-ignored",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "-1s"},
        expect(source="openai", budget="requests", remaining=0.0),
        id="go-duration-negative-ignored",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1d"},
        expect(source="openai", budget="requests", remaining=0.0),
        id="go-duration-unknown-unit-ignored",
    ),
    pytest.param(
        {"x-ratelimit-remaining-tokens": "-3", "x-ratelimit-limit-tokens": "0"},
        expect(),
        id="openai-negative-and-zero-ignored",
    ),
    pytest.param(
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2025-13-45T25:61:61Z",
        },
        expect(source="anthropic", budget="requests", remaining=0.0),
        id="rfc3339-impossible-date-ignored",
    ),
    pytest.param(
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2025-10-25T12:00:00+99:99",
        },
        expect(source="anthropic", budget="requests", remaining=0.0),
        id="rfc3339-impossible-offset-ignored",
    ),
    pytest.param(
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z",
        },
        expect(source="anthropic", budget="requests", remaining=0.0, reset=MAX_DELAY),
        id="rfc3339-far-future-clamped",
    ),
    pytest.param(
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2025-10-25T12:00:00." + "0" * 21 + "Z",
        },
        expect(source="anthropic", budget="requests", remaining=0.0),
        id="rfc3339-too-long-ignored",
    ),
    pytest.param(
        {"RateLimit-Reset": "99999999999999999999", "RateLimit-Observed": "-1"},
        legacy(reset=MAX_DELAY),
        id="gitlab-huge-epoch-is-clamped-and-bad-observed-ignored",
    ),
    pytest.param(
        {"X-RateLimit-Used": "nan", "X-RateLimit-Remaining": "5"},
        x_ratelimit(remaining=5.0),
        id="x-used-invalid-ignored",
    ),
    pytest.param(
        [("x-ratelimit-remaining-requests", "5")] * 10_000,
        expect(source="openai", budget="requests", remaining=5.0),
        id="openai-10000-fields",
    ),
]


@pytest.mark.parametrize(("headers", "expected"), HOSTILE_VENDOR_CASES)
def test_hostile_vendor_values(headers: Any, expected: dict[str, object]) -> None:
    info = parse(headers, now=NOW_ANTHROPIC, max_delay=MAX_DELAY)
    assert fields_of(info, expected) == expected


@pytest.mark.parametrize(("headers", "now", "expected"), VENDOR_CASES)
def test_vendor_dialects(headers: dict[str, str], now: float, expected: dict[str, object]) -> None:
    info = parse(headers, now=now, max_delay=MAX_DELAY)
    actual = fields_of(info, expected)
    for name in ("reset", "interval"):
        if isinstance(actual.get(name), float):
            actual[name] = pytest.approx(actual[name])
    assert expected == actual


def test_draft_10_pace_is_computed_before_the_cap() -> None:
    headers = {
        "RateLimit-Policy": '"hour";q=1000;w=3600, "day";q=5000;w=86400',
        "RateLimit": '"day";r=100;t=36000',
    }
    info = parse(headers, now=NOW, max_delay=3600.0)
    assert (info.reset, info.pace()) == (3600.0, 360.0)  # one request per 360 s, not per 36 s


def test_budgets_keep_their_own_fields() -> None:
    info = parse(OPENAI_EXAMPLE, now=NOW, max_delay=3600.0)
    tokens = info.for_budget("tokens")
    assert tokens is not None
    assert (tokens.budget, tokens.limit, tokens.remaining, tokens.reset) == (
        "tokens",
        150000.0,
        149984.0,
        360.0,
    )
    assert tokens.pace() == pytest.approx(360.0 / 149984)
    assert info.for_budget("images") is None


# --- budgets reach the scope that tracks them ---------------------------------------

TOKENS_LOW = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "50",
    "x-ratelimit-reset-requests": "10s",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "3000",
    "x-ratelimit-reset-tokens": "6s",
    "retry-after-ms": "250",
}


def test_for_scopes_routes_each_budget() -> None:
    info = parse(TOKENS_LOW, now=NOW, max_delay=MAX_DELAY)
    views = info.for_scopes(
        {"api.openai.com": 1.0, "openai-tokens": 1000.0}, {"tokens": "openai-tokens"}
    )
    host, tokens = views["api.openai.com"], views["openai-tokens"]
    assert (host.budget, host.remaining, host.limit, host.retry_after) == (
        "requests",
        50.0,
        60.0,
        0.25,
    )
    assert [budget.budget for budget in host.budgets] == ["requests"]
    # 3000 tokens left are three requests of 1000 tokens, to spread over 6 s.
    assert (tokens.budget, tokens.remaining, tokens.limit, tokens.retry_after) == (
        "tokens",
        3.0,
        30.0,
        0.25,
    )
    assert tokens.pace() == pytest.approx(2.0)
    assert tokens.budgets == ()


def test_for_scopes_without_a_mapping_gives_everyone_everything() -> None:
    info = parse(TOKENS_LOW, now=NOW, max_delay=MAX_DELAY)
    assert info.for_scopes({"a": 1.0, "b": 5.0}, {}) == {"a": info, "b": info}


def test_for_scopes_when_the_budget_is_not_reported() -> None:
    info = parse({"Retry-After": "3"}, now=NOW)
    views = info.for_scopes({"host": 1.0, "tokens": 50.0}, {"tokens": "tokens"})
    assert views["tokens"] == RateLimitInfo(retry_after=3.0)
    assert views["host"] is info


@pytest.mark.parametrize(
    ("remaining", "cost", "expected_remaining", "expected_pace", "expected_wait"),
    [
        pytest.param(3000.0, 1000.0, 3.0, 2.0, None, id="three-left"),
        pytest.param(999.0, 1000.0, 0.0, None, 6.0, id="less-than-one-request-waits-for-reset"),
        pytest.param(3000.0, 1.0, 3000.0, 0.002, None, id="cost-one-unchanged"),
        pytest.param(3000.0, 0.0, 3000.0, 0.002, None, id="cost-zero-unchanged"),
        pytest.param(1.0, 0.5, 2.0, 3.0, None, id="fractional-cost"),
    ],
)
def test_per_request(
    remaining: float,
    cost: float,
    expected_remaining: float,
    expected_pace: float | None,
    expected_wait: float | None,
) -> None:
    info = RateLimitInfo(remaining=remaining, reset=6.0, limit=30000.0).per_request(cost)
    assert info.remaining == expected_remaining
    assert info.pace() == (None if expected_pace is None else pytest.approx(expected_pace))
    assert info.wait() == expected_wait


def test_excluding_every_budget_keeps_retry_after() -> None:
    info = parse(TOKENS_LOW, now=NOW)
    assert info.excluding({"requests", "tokens"}) == RateLimitInfo(retry_after=0.25)
    assert info.excluding({"images"}) is info


# --- containers ------------------------------------------------------------------

PAIRS = [
    ("Retry-After", "5"),
    ("retry-after", "30"),
    ("RateLimit-Policy", '"default";q=100;w=60'),
    ("ratelimit", '"default";r=0;t=12'),
    ("X-RateLimit-Remaining", "7"),
]
CONTAINER_EXPECTED = ietf(
    retry_after=30.0, remaining=0.0, reset=12.0, limit=100.0, window=60.0, policy="default"
)


class LookupOnly:
    """A headers object that only offers a case-insensitive ``get_list``."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    def get_list(self, name: str) -> list[str]:
        return [value for key, value in self._pairs if key.lower() == name.lower()]


def scrapy_headers(pairs: list[tuple[str, str]]) -> ScrapyHeaders:
    headers = ScrapyHeaders()
    for name, value in pairs:
        headers.appendlist(name, value)
    return headers


def as_dict_of_lists(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, value in pairs:
        grouped.setdefault(name.lower(), []).append(value)
    return grouped


def pair_iterator(pairs: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    return iter(pairs)


CONTAINERS: list[Any] = [
    pytest.param(list, id="list-of-str-pairs"),
    pytest.param(
        lambda pairs: [(n.encode("latin-1"), v.encode("latin-1")) for n, v in pairs],
        id="list-of-bytes-pairs",
    ),
    pytest.param(tuple, id="tuple-of-pairs"),
    pytest.param(pair_iterator, id="iterator-of-pairs"),
    pytest.param(dict, id="dict-mixed-case-keys"),
    pytest.param(as_dict_of_lists, id="dict-of-lists"),
    pytest.param(httpx.Headers, id="httpx-headers"),
    pytest.param(CIMultiDict, id="multidict-cimultidict"),
    pytest.param(lambda pairs: CIMultiDictProxy(CIMultiDict(pairs)), id="aiohttp-proxy"),
    pytest.param(scrapy_headers, id="scrapy-headers"),
    pytest.param(LookupOnly, id="lookup-only"),
]


@pytest.mark.parametrize("build", CONTAINERS)
def test_parse_accepts_every_container(build: Callable[[list[tuple[str, str]]], Any]) -> None:
    info = parse(build(PAIRS), now=NOW, max_delay=MAX_DELAY)
    assert fields_of(info, CONTAINER_EXPECTED) == CONTAINER_EXPECTED


def test_parse_returns_the_empty_singleton() -> None:
    assert parse(None, now=NOW) is EMPTY
    assert parse({"Server": "x"}, now=NOW) is EMPTY
    assert fields_of(EMPTY, expect(budgets=())) == expect(budgets=())


def test_max_delay_clamps_every_delay() -> None:
    info = parse({"Retry-After": "90", "RateLimit": '"default";r=0;t=120'}, now=NOW, max_delay=60)
    assert (info.retry_after, info.reset, info.wait()) == (60.0, 60.0, 60.0)


# --- parse_retry_after -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "now", "date", "expected"),
    [
        pytest.param("120", NOW, None, 120.0, id="seconds"),
        pytest.param(b"120", NOW, None, 120.0, id="seconds-bytes"),
        pytest.param("1.5", NOW, None, 1.5, id="decimal"),
        pytest.param("Sun, 06 Nov 1994 08:49:37 GMT", NOW_1994, None, 37.0, id="imf-fixdate"),
        pytest.param("Sunday, 06-Nov-94 08:49:37 GMT", NOW_1994, None, 37.0, id="rfc850"),
        pytest.param("Sun Nov  6 08:49:37 1994", NOW_1994, None, 37.0, id="asctime"),
        pytest.param("Sun Nov 06 08:49:37 1994", NOW_1994, None, 37.0, id="asctime-zero-pad"),
        pytest.param("sun, 06 nov 1994 08:49:37 gmt", NOW_1994, None, 37.0, id="lower-case"),
        pytest.param(
            "Sun, 06 Nov 1994 08:49:37 GMT",
            NOW,
            "Sun, 06 Nov 1994 08:49:30 GMT",
            7.0,
            id="relative-to-date",
        ),
        pytest.param(
            b"Sun, 06 Nov 1994 08:49:37 GMT",
            NOW,
            b"Sun Nov  6 08:49:30 1994",
            7.0,
            id="relative-to-asctime-date-bytes",
        ),
        pytest.param(
            "Sun, 06 Nov 1994 08:49:37 GMT", NOW, "Sun, 06 Nov 1994 08:50:00 GMT", 0.0, id="early"
        ),
        pytest.param("Sun, 06 Nov 1994 08:49:37 GMT", NOW, "garbage", 0.0, id="bad-date-uses-now"),
        pytest.param("Sunday, 06-Nov-94 08:49:37 GMT", NOW, None, 0.0, id="rfc850-94-is-1994"),
        pytest.param(
            "Thursday, 01-Jan-70 00:00:00 GMT", NOW, None, MAX_DELAY, id="rfc850-70-is-2070"
        ),
        pytest.param("Sun, 06 Nov 9999 08:49:37 GMT", NOW, None, MAX_DELAY, id="far-future"),
        pytest.param("Sun, 06 Nov 0000 08:49:37 GMT", NOW, None, 0.0, id="year-zero-is-past"),
        pytest.param("Sun, 6 Nov 1994 08:49:37 GMT", NOW_1994, None, 37.0, id="one-digit-day"),
        pytest.param("Sun, 06 Nov 1994 08:49:60 GMT", NOW_1994, None, None, id="second-60"),
        pytest.param("Sun, 06 Nov 1994 08:49:37", NOW_1994, None, 37.0, id="no-zone-is-utc"),
        pytest.param("Sun, 06 Nov 1994 08:49:37 GMT" + " " * 12, NOW_1994, None, 37.0, id="ows"),
        pytest.param(
            "Sun, 06 Nov 1994 08:49:37 GMT (x)" + "x" * 9, NOW_1994, None, None, id="long"
        ),
        pytest.param(
            "Thursday, 29-Feb-24 00:00:00 GMT", NOW, None, MAX_DELAY, id="rfc850-leap-day"
        ),
        pytest.param("Sun, 06 Foo 1994 08:49:37 GMT", NOW_1994, None, None, id="bad-month"),
        pytest.param("-1", NOW, None, None, id="negative"),
        pytest.param("+1", NOW, None, None, id="plus-sign"),
        pytest.param("1.", NOW, None, None, id="trailing-dot"),
        pytest.param("", NOW, None, None, id="empty"),
        pytest.param(b"\x00\xff", NOW, None, None, id="binary"),
        pytest.param("5" * 9000, NOW, None, None, id="over-8-kib"),
    ],
)
def test_parse_retry_after(
    value: str | bytes, now: float, date: str | bytes | None, expected: float | None
) -> None:
    assert parse_retry_after(value, now=now, date=date, max_delay=MAX_DELAY) == expected


# --- RateLimitInfo ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "wait", "pace"),
    [
        pytest.param(RateLimitInfo(), None, None, id="empty"),
        pytest.param(RateLimitInfo(retry_after=5.0), 5.0, None, id="retry-after"),
        pytest.param(
            RateLimitInfo(retry_after=5.0, remaining=0.0, reset=30.0),
            5.0,
            None,
            id="retry-after-wins-over-reset",
        ),
        pytest.param(RateLimitInfo(remaining=0.0, reset=30.0), 30.0, None, id="exhausted"),
        pytest.param(RateLimitInfo(remaining=0.0), None, None, id="exhausted-no-reset"),
        pytest.param(RateLimitInfo(remaining=10.0, reset=30.0), None, 3.0, id="pace"),
        pytest.param(RateLimitInfo(remaining=0.5, reset=30.0), None, 30.0, id="pace-below-one"),
        pytest.param(RateLimitInfo(remaining=10.0), None, None, id="pace-needs-reset"),
        pytest.param(RateLimitInfo(remaining=10.0, reset=0.0), None, 0.0, id="pace-reset-now"),
    ],
)
def test_wait_and_pace(info: RateLimitInfo, wait: float | None, pace: float | None) -> None:
    assert info.wait() == wait
    assert info.pace() == pace


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param({"retry_after": -1.0}, ValueError, id="negative-retry-after"),
        pytest.param({"reset": math.inf}, ValueError, id="infinite-reset"),
        pytest.param({"remaining": math.nan}, ValueError, id="nan-remaining"),
        pytest.param({"limit": 0.0}, ValueError, id="zero-limit"),
        pytest.param({"window": "60"}, TypeError, id="text-window"),
        pytest.param({"policy": 1}, TypeError, id="number-policy"),
        pytest.param({"source": "custom"}, ValueError, id="unknown-source"),
    ],
)
def test_ratelimitinfo_validates(fields: dict[str, Any], error: type[Exception]) -> None:
    name = next(iter(fields))
    with pytest.raises(error, match=name):
        RateLimitInfo(**fields)


def test_ratelimitinfo_is_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        EMPTY.reset = 1.0  # type: ignore[misc]


# --- programmer errors -----------------------------------------------------------


def call_parse(headers: Any = None, **kwargs: Any) -> object:
    """Call :func:`parse` with ``now=NOW`` unless given, and any argument types."""
    return parse(headers, **{"now": NOW, **kwargs})


def call_parse_retry_after(value: Any = "5", **kwargs: Any) -> object:
    """Call :func:`parse_retry_after` with ``now=NOW`` unless given."""
    return parse_retry_after(value, **{"now": NOW, **kwargs})


@pytest.mark.parametrize(
    ("call", "args", "error", "match"),
    [
        pytest.param(call_parse, {"max_delay": 0}, ValueError, "max_delay", id="zero-max-delay"),
        pytest.param(call_parse, {"max_delay": -1}, ValueError, "max_delay", id="negative"),
        pytest.param(call_parse, {"max_delay": math.nan}, ValueError, "max_delay", id="nan"),
        pytest.param(call_parse, {"max_delay": math.inf}, ValueError, "max_delay", id="inf"),
        pytest.param(call_parse, {"max_delay": "300"}, TypeError, "max_delay", id="text"),
        pytest.param(call_parse, {"now": math.nan}, ValueError, "now", id="nan-now"),
        pytest.param(call_parse, {"now": 10**400}, ValueError, "now", id="huge-int-now"),
        pytest.param(call_parse, {"now": True}, TypeError, "now", id="bool-now"),
        pytest.param(call_parse, {"headers": 42}, TypeError, "headers", id="int-headers"),
        pytest.param(call_parse, {"headers": "Retry-After: 5"}, TypeError, "headers", id="str"),
        pytest.param(call_parse, {"headers": [("a",)]}, TypeError, "pairs", id="not-pairs"),
        pytest.param(call_parse, {"headers": [(1, "5")]}, TypeError, "names", id="int-name"),
        pytest.param(
            call_parse, {"headers": {"Retry-After": 5}}, TypeError, "Retry-After", id="int-value"
        ),
        pytest.param(
            call_parse, {"headers": {"Retry-After": [5]}}, TypeError, "Retry-After", id="int-item"
        ),
        pytest.param(call_parse_retry_after, {"value": 5}, TypeError, "value", id="int-retry"),
        pytest.param(call_parse_retry_after, {"date": 5}, TypeError, "date", id="int-date"),
        pytest.param(
            call_parse_retry_after, {"max_delay": 0}, ValueError, "max_delay", id="retry-max"
        ),
    ],
)
def test_programmer_errors_raise(
    call: Callable[..., object], args: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call(**args)


# --- properties ------------------------------------------------------------------

HEADER_NAMES = st.sampled_from(
    [
        "Retry-After",
        "retry-after",
        "Date",
        "RateLimit",
        "RateLimit-Policy",
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "X-RateLimit-Reset-After",
        "X-Rate-Limit-Reset",
        "X-RateLimit-Used",
        "RateLimit-Observed",
        "Retry-After-Ms",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
        "x-groq-region",
        "Content-Type",
    ]
)
FRAGMENTS = st.sampled_from(
    [
        '"default"',
        "daily",
        ";r=",
        ";t=",
        ";q=",
        ";w=",
        ";pk=",
        ":cHJv:",
        ",",
        " ",
        "-",
        "0",
        "1",
        "9",
        ".5",
        "1700000000",
        "1700000000000",
        "99999999999999999999",
        "1e400",
        "nan",
        "=",
        "limit=",
        "remaining=",
        "reset=",
        http_date(30),
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
        "?1",
        "(",
        ")",
        '"',
        "\\",
        "@1700000000",
        '%"%ff"',
        "\u00e9",
        "\x00",
        "h",
        "m",
        "s",
        "ms",
        "\u00b5s",
        "ns",
        "1h2m3.5s",
        "6m0s",
        "2025-10-25T12:00:00Z",
        "T",
        "Z",
        "+02:00",
        ":",
        "99",
        "9999-12-31T23:59:59.999999999-23:59",
        "-1",
        ";window=",
        "limit=120, remaining=4, reset=55",
        "120;w=60",
    ]
)
HEADER_VALUES = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.lists(FRAGMENTS, max_size=14).map("".join),
    st.lists(FRAGMENTS, max_size=14).map(lambda parts: "".join(parts).encode("utf-8")),
)
MAX_DELAYS = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)
TIMES = st.floats(allow_nan=False, allow_infinity=False)


@settings(deadline=None)
@given(
    pairs=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=10),
    now=TIMES,
    max_delay=MAX_DELAYS,
    cost=st.floats(min_value=0.0, max_value=1e12),
)
def test_parse_never_raises_and_bounds_delays(
    pairs: list[tuple[str, str | bytes]], now: float, max_delay: float, cost: float
) -> None:
    info = parse(pairs, now=now, max_delay=max_delay)
    for part in (info, *info.budgets):
        for delay in (part.retry_after, part.reset, part.wait(), part.pace()):
            assert delay is None or 0.0 <= delay <= max_delay
        assert part.remaining is None or 0.0 <= part.remaining < math.inf
        assert part.limit is None or 0.0 < part.limit < math.inf
        assert part.window is None or 0.0 < part.window < math.inf
    names = [budget.budget for budget in info.budgets]
    assert len(names) == len(set(names)) <= 32
    views = info.for_scopes({"host": 1.0, "tokens": cost}, {"tokens": "tokens", "day": "host"})
    for view in views.values():
        for delay in (view.retry_after, view.reset, view.wait(), view.pace()):
            assert delay is None or 0.0 <= delay <= max_delay


@settings(deadline=None)
@given(
    value=st.one_of(HEADER_VALUES, st.text(), st.binary()),
    date=st.one_of(st.none(), HEADER_VALUES),
    now=TIMES,
    max_delay=MAX_DELAYS,
)
def test_parse_retry_after_never_raises(
    value: str | bytes, date: str | bytes | None, now: float, max_delay: float
) -> None:
    delay = parse_retry_after(value, now=now, date=date, max_delay=max_delay)
    assert delay is None or 0.0 <= delay <= max_delay


# --- dialects: Groq, Azure OpenAI, waits in a 429's body, every RateLimit draft -----------

GROQ = {
    "x-groq-region": "fra",
    "x-ratelimit-limit-requests": "14400",
    "x-ratelimit-limit-tokens": "18000",
    "x-ratelimit-remaining-requests": "14370",
    "x-ratelimit-remaining-tokens": "17997",
    "x-ratelimit-reset-requests": "2m59.56s",
    "x-ratelimit-reset-tokens": "7.66s",
}


def gemini_body(retry_delay: str | None = "46s", message: str = "Please retry in 46.5s.") -> dict:
    """A Gemini API 429 body (google.rpc.Status with RetryInfo), as its docs show it."""
    details: list[dict[str, Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{"quotaMetric": "generate_content_free_tier_requests"}],
        }
    ]
    if retry_delay is not None:
        details.append(
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}
        )
    return {
        "error": {
            "code": 429,
            "message": f"You exceeded your current quota. {message}",
            "status": "RESOURCE_EXHAUSTED",
            "details": details,
        }
    }


def as_json(document: object) -> bytes:
    import json

    return json.dumps(document).encode()


DIALECT_CASES = [
    # --- Groq: requests per day, tokens per minute ---------------------------------
    pytest.param(
        GROQ,
        {},
        expect(
            source="groq",
            budget="requests",
            limit=14400.0,
            remaining=14370.0,
            reset=179.56,
            window=86400.0,
            budgets=("requests", "tokens"),
        ),
        id="groq-docs-example",
    ),
    pytest.param(
        {key: value for key, value in GROQ.items() if key != "x-groq-region"},
        {},
        expect(
            source="openai",
            budget="requests",
            limit=14400.0,
            remaining=14370.0,
            reset=179.56,
            budgets=("requests", "tokens"),
        ),
        id="same-fields-without-groq-marker-are-openai",
    ),
    pytest.param(
        {
            "x-groq-region": "us",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "7.66s",
            "retry-after": "8",
        },
        {"status": 429},
        expect(
            source="groq",
            budget="tokens",
            remaining=0.0,
            reset=7.66,
            window=60.0,
            retry_after=8.0,
            budgets=("tokens",),
        ),
        id="groq-429-tokens-spent",
    ),
    # --- Azure OpenAI: -1 and 0 mean "not reported" --------------------------------
    pytest.param(
        {
            "x-ratelimit-limit-tokens": "-1",
            "x-ratelimit-remaining-tokens": "-1",
            "x-ratelimit-reset-tokens": "0",
        },
        {},
        expect(),
        id="azure-responses-api-minus-one",
    ),
    pytest.param(
        {
            "x-ratelimit-limit-tokens": "-1",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "0",
            "x-ratelimit-remaining-requests": "19",
        },
        {},
        expect(source="openai", budget="requests", remaining=19.0, budgets=("requests",)),
        id="azure-unreported-tokens-beside-requests",
    ),
    pytest.param(
        {"x-ratelimit-limit-requests": "0", "x-ratelimit-remaining-requests": "0"},
        {},
        expect(),
        id="azure-limit-zero-is-unknown",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "0s"},
        {},
        expect(source="openai", budget="requests", reset=0.0, budgets=("requests",)),
        id="azure-none-left-reset-now-is-not-spent",
    ),
    pytest.param(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"},
        {},
        expect(source="openai", budget="requests", remaining=0.0, reset=1.0, budgets=("requests",)),
        id="openai-spent-is-still-spent",
    ),
    # --- RateLimit drafts -----------------------------------------------------------
    pytest.param(
        {"RateLimit-Limit": "10, 10;window=1, 50;window=60", "RateLimit-Remaining": "3"},
        {},
        legacy(limit=10.0, window=1.0, remaining=3.0),
        id="draft-polli-00-window-param",
    ),
    pytest.param(
        {
            "RateLimit-Policy": "100;w=60",
            "RateLimit-Limit": "100",
            "RateLimit-Remaining": "99",
            "RateLimit-Reset": "60",
        },
        {},
        legacy(limit=100.0, window=60.0, remaining=99.0, reset=60.0),
        id="draft-6-express-rate-limit",
    ),
    pytest.param(
        {
            "RateLimit-Policy": "10;w=1, 100;w=60",
            "RateLimit-Limit": "100",
            "RateLimit-Remaining": "40",
            "RateLimit-Reset": "20",
        },
        {},
        legacy(limit=100.0, window=60.0, remaining=40.0, reset=20.0),
        id="draft-6-window-of-the-policy-that-is-the-limit",
    ),
    pytest.param(
        {"RateLimit-Policy": "120;w=60", "RateLimit": "limit=120, remaining=4, reset=55"},
        {},
        legacy(limit=120.0, window=60.0, remaining=4.0, reset=55.0),
        id="draft-7-issue-example",
    ),
    pytest.param(
        {"RateLimit-Policy": "100;w=60, 1000;w=3600"},
        {},
        legacy(limit=1000.0, window=3600.0),
        id="draft-7-policy-alone-slowest-rate",
    ),
    pytest.param(
        {"RateLimit-Policy": "120;w=60", "RateLimit": "limit=90, remaining=4, reset=55"},
        {},
        legacy(limit=90.0, remaining=4.0, reset=55.0),
        id="draft-7-no-policy-matches-the-limit",
    ),
    pytest.param(
        {
            "RateLimit-Policy": '"100-in-1min"; q=100; w=60; pk=:cHJvamVjdA==:',
            "RateLimit": '"100-in-1min"; r=99; t=60',
        },
        {},
        ietf(
            policy="100-in-1min",
            limit=100.0,
            window=60.0,
            remaining=99.0,
            reset=60.0,
            partition_key="project",
            budgets=("100-in-1min",),
        ),
        id="draft-8-express-rate-limit",
    ),
    pytest.param(
        {
            "RateLimit-Policy": '"default";q=100;qu="requests";w=10',
            "RateLimit": '"default";r=0;t=4',
        },
        {},
        ietf(
            policy="default",
            limit=100.0,
            window=10.0,
            remaining=0.0,
            reset=4.0,
            budgets=("default",),
        ),
        id="draft-10-11-quota-unit",
    ),
    # --- X-RateLimit-Reset in all its forms --------------------------------------------
    pytest.param({"X-RateLimit-Reset": "30"}, {}, x_ratelimit(reset=30.0), id="x-reset-delta"),
    pytest.param(
        {"X-RateLimit-Reset": "1700000030"}, {}, x_ratelimit(reset=30.0), id="x-reset-epoch"
    ),
    pytest.param(
        {"X-RateLimit-Reset": "1700000030.5"},
        {},
        x_ratelimit(reset=30.5),
        id="x-reset-epoch-float",
    ),
    pytest.param(
        {"X-RateLimit-Reset": "1700000030500"},
        {},
        x_ratelimit(reset=30.5),
        id="x-reset-epoch-ms",
    ),
    pytest.param(
        {"X-RateLimit-Reset": http_date(30)}, {}, x_ratelimit(reset=30.0), id="x-reset-http-date"
    ),
    pytest.param(
        {"X-RateLimit-Reset": "2023-11-14T22:13:50.5Z"},
        {},
        x_ratelimit(reset=30.5),
        id="x-reset-rfc3339",
    ),
    pytest.param(
        {"RateLimit-Reset": "2023-11-14T23:13:50+01:00"},
        {},
        legacy(reset=30.0),
        id="legacy-reset-rfc3339-offset",
    ),
    # --- Retry-After counts where HTTP defines it --------------------------------------
    pytest.param({"Retry-After": "1"}, {"status": 200}, expect(), id="retry-after-on-200-ignored"),
    pytest.param({"Retry-After": "1"}, {"status": 404}, expect(), id="retry-after-on-404-ignored"),
    pytest.param(
        {"Retry-After": "1", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "30"},
        {"status": 200},
        x_ratelimit(remaining=5.0, reset=30.0),
        id="retry-after-on-200-quota-kept",
    ),
    pytest.param(
        {"retry-after-ms": "1500"}, {"status": 200}, expect(), id="retry-after-ms-on-200-ignored"
    ),
    pytest.param(
        {"Retry-After": "1"}, {"status": 429}, expect(retry_after=1.0), id="retry-after-429"
    ),
    pytest.param(
        {"Retry-After": "1"}, {"status": 503}, expect(retry_after=1.0), id="retry-after-503"
    ),
    pytest.param(
        {"Retry-After": "1"}, {"status": 301}, expect(retry_after=1.0), id="retry-after-redirect"
    ),
    pytest.param(
        {"Retry-After": "60", "X-RateLimit-Remaining": "4999"},
        {"status": 403},
        x_ratelimit(retry_after=60.0, remaining=4999.0),
        id="retry-after-github-403",
    ),
    # --- a wait stated in a 429's body ----------------------------------------------
    pytest.param(
        None,
        {"status": 429, "body": as_json(gemini_body())},
        expect(retry_after=46.5),
        id="gemini-429-longest-of-retryinfo-and-message",
    ),
    pytest.param(
        {},
        {"status": 429, "body": as_json(gemini_body(message="Please retry in 8.941621227s."))},
        expect(retry_after=46.0),
        id="gemini-retryinfo-longer-than-message",
    ),
    pytest.param(
        {},
        {"status": 503, "body": as_json(gemini_body("2.5s", "Try later."))},
        expect(retry_after=2.5),
        id="gemini-503",
    ),
    pytest.param(
        {},
        {"status": 429, "body": as_json([gemini_body("3s", "")])},
        expect(retry_after=3.0),
        id="gemini-stream-endpoint-list",
    ),
    pytest.param(
        {}, {"status": 429, "body": gemini_body("4s", "")}, expect(retry_after=4.0), id="parsed"
    ),
    pytest.param(
        {},
        {"status": 429, "body": as_json(gemini_body()).decode()},
        expect(retry_after=46.5),
        id="gemini-body-as-text",
    ),
    pytest.param(
        {"Retry-After": "2"},
        {"status": 429, "body": as_json(gemini_body())},
        expect(retry_after=2.0),
        id="retry-after-header-wins-over-body",
    ),
    pytest.param(
        {}, {"status": 400, "body": as_json(gemini_body())}, expect(), id="body-on-400-ignored"
    ),
    pytest.param(
        {}, {"status": 200, "body": as_json(gemini_body())}, expect(), id="body-on-200-ignored"
    ),
    pytest.param({}, {"body": as_json(gemini_body())}, expect(), id="body-without-status-ignored"),
    pytest.param(
        {},
        {"status": 429, "body": as_json(gemini_body(message="x" * 20_000))},
        expect(),
        id="body-over-16-kib-ignored",
    ),
    pytest.param(
        {},
        {
            "status": 429,
            "body": as_json(
                {"error": {"message": "Rate limit reached. Please try again in 6m0s."}}
            ),
        },
        expect(retry_after=MAX_DELAY),
        id="openai-message-go-duration-clamped",
    ),
    pytest.param(
        {},
        {
            "status": 429,
            "body": as_json(
                {"error": {"message": "exceeded token rate limit. Please retry after 37 seconds."}}
            ),
        },
        expect(retry_after=37.0),
        id="azure-message-retry-after-seconds",
    ),
    pytest.param({}, {"status": 429, "body": b"<html>429</html>"}, expect(), id="html-body"),
    pytest.param({}, {"status": 429, "body": b"[" * 10_000}, expect(), id="deeply-nested"),
    pytest.param(
        {},
        {"status": 429, "body": as_json(gemini_body("-5s", "Please retry in -5s"))},
        expect(),
        id="negative-delays-ignored",
    ),
    pytest.param(
        {},
        {"status": 429, "body": as_json(gemini_body("1e9s", "Please retry in nan s"))},
        expect(),
        id="malformed-delays-ignored",
    ),
]


@pytest.mark.parametrize(("headers", "kwargs", "expected"), DIALECT_CASES)
def test_dialects(headers: Any, kwargs: dict[str, Any], expected: dict[str, object]) -> None:
    info = parse(headers, now=NOW, max_delay=MAX_DELAY, **kwargs)
    actual = fields_of(info, expected)
    for name in ("reset", "retry_after"):
        if isinstance(actual.get(name), float):
            actual[name] = pytest.approx(actual[name])
    assert expected == actual


def test_groq_budgets_keep_their_windows() -> None:
    info = parse(GROQ, now=NOW)
    requests, tokens = info.for_budget("requests"), info.for_budget("tokens")
    assert requests is not None
    assert tokens is not None
    assert (requests.window, requests.limit) == (86400.0, 14400.0)
    assert (tokens.window, tokens.limit, tokens.remaining) == (60.0, 18000.0, 17997.0)


@pytest.mark.parametrize(
    ("status", "counts"),
    [
        (None, True),
        (200, False),
        (204, False),
        (301, True),
        (307, True),
        (400, False),
        (403, True),
        (404, False),
        (429, True),
        (500, False),
        (502, False),
        (503, True),
    ],
)
def test_retry_after_counts(status: int | None, counts: bool) -> None:
    assert retry_after_counts(status) is counts


@pytest.mark.parametrize(
    ("status", "headers", "wanted"),
    [
        (429, {"Content-Type": "application/json; charset=UTF-8", "Content-Length": "512"}, True),
        (503, {"content-type": "application/problem+json", "content-length": "16384"}, True),
        (429, {"content-type": "application/json", "content-length": "16385"}, False),
        (429, {"content-type": "application/json"}, True),  # no length: read up to the limit
        (429, {"content-type": "text/event-stream", "content-length": "10"}, False),
        (429, {"content-type": "text/html", "content-length": "10"}, False),
        (429, {"content-length": "10"}, False),
        (200, {"content-type": "application/json", "content-length": "10"}, False),
        (400, {"content-type": "application/json", "content-length": "10"}, False),
        (None, {"content-type": "application/json", "content-length": "10"}, False),
        (429, {"content-type": "application/json", "content-length": "-1"}, False),
        (429, {"content-type": "application/json", "content-length": "9" * 40}, False),
        (429, httpx.Headers({"Content-Type": "application/json", "Content-Length": "9"}), True),
        (429, ScrapyHeaders({"Content-Type": "application/json", "Content-Length": "9"}), True),
        (429, CIMultiDict({"Content-Type": "application/json", "Content-Length": "9"}), True),
        (429, None, False),
    ],
)
def test_wants_body(status: int | None, headers: Any, wanted: bool) -> None:
    assert wants_body(status, headers) is wanted


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"status": "429"}, TypeError),
        ({"status": True}, TypeError),
        ({"status": 429.0}, TypeError),
        ({"body": 42}, TypeError),
        ({"body": object()}, TypeError),
    ],
)
def test_parse_checks_status_and_body(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=r"status|body"):
        parse({}, now=NOW, **kwargs)


# Generated cases: each dialect's rule holds for any values it may carry.

COUNTS = st.integers(min_value=1, max_value=10**9)
SECONDS = st.integers(min_value=0, max_value=10**6)
STATUSES = st.one_of(st.none(), st.integers(min_value=100, max_value=599))


def go_duration(milliseconds: int) -> str:
    minutes, rest = divmod(milliseconds, 60_000)
    return f"{minutes}m{rest / 1000:g}s" if minutes else f"{rest}ms"


@settings(deadline=None)
@given(
    limit_requests=COUNTS,
    limit_tokens=COUNTS,
    data=st.data(),
    reset_requests=st.integers(min_value=1, max_value=86_400_000),
    reset_tokens=st.integers(min_value=1, max_value=60_000),
    marker=st.booleans(),
)
def test_groq_generated(
    limit_requests: int,
    limit_tokens: int,
    data: st.DataObject,
    reset_requests: int,
    reset_tokens: int,
    marker: bool,
) -> None:
    left_requests = data.draw(st.integers(min_value=0, max_value=limit_requests))
    left_tokens = data.draw(st.integers(min_value=0, max_value=limit_tokens))
    headers = {
        "x-ratelimit-limit-requests": str(limit_requests),
        "x-ratelimit-remaining-requests": str(left_requests),
        "x-ratelimit-reset-requests": go_duration(reset_requests),
        "x-ratelimit-limit-tokens": str(limit_tokens),
        "x-ratelimit-remaining-tokens": str(left_tokens),
        "x-ratelimit-reset-tokens": go_duration(reset_tokens),
    }
    if marker:
        headers["X-Groq-Region"] = "gcp-europe-west4"
    info = parse(headers, now=NOW, max_delay=MAX_DELAY)
    requests, tokens = info.for_budget("requests"), info.for_budget("tokens")
    assert requests is not None
    assert tokens is not None
    assert info.source == ("groq" if marker else "openai")
    assert requests.window == (86400.0 if marker else None)
    assert tokens.window == (60.0 if marker else None)
    assert (requests.limit, requests.remaining) == (limit_requests, left_requests)
    assert (tokens.limit, tokens.remaining) == (limit_tokens, left_tokens)
    assert requests.reset == pytest.approx(min(reset_requests / 1000, MAX_DELAY))


@settings(deadline=None)
@given(
    limit=st.sampled_from(["-1", "0", None, "500"]),
    remaining=st.sampled_from(["-1", "0", None, "7"]),
    reset=st.sampled_from(["0", "0s", "0ms", None]),
    other=st.booleans(),
)
def test_azure_unreported_budgets_are_never_spent(
    limit: str | None, remaining: str | None, reset: str | None, other: bool
) -> None:
    headers = {
        name: value
        for name, value in (
            ("x-ratelimit-limit-tokens", limit),
            ("x-ratelimit-remaining-tokens", remaining),
            ("x-ratelimit-reset-tokens", reset),
        )
        if value is not None
    }
    if other:
        headers["x-ratelimit-remaining-requests"] = "3"
    info = parse(headers, now=NOW, max_delay=MAX_DELAY, status=200)
    tokens = info.for_budget("tokens")
    unreported = "-1" in (limit, remaining) or limit == "0"
    if unreported:
        assert tokens is None
    if tokens is not None:
        # "0 left, reset now" is not a spent budget, and nothing asks to wait.
        assert tokens.remaining != 0 or reset is None
        assert not tokens.wait()
    assert not info.wait()


@settings(deadline=None)
@given(
    seconds=st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False),
    in_message=st.booleans(),
    status=STATUSES,
    header=st.one_of(st.none(), SECONDS),
    wrap=st.booleans(),
    max_delay=st.floats(min_value=1.0, max_value=1e6),
)
def test_gemini_body_generated(
    seconds: Any,
    in_message: bool,
    status: int | None,
    header: int | None,
    wrap: bool,
    max_delay: float,
) -> None:
    text = f"{seconds.normalize():f}s"
    document: Any = (
        gemini_body(None, f"Please retry in {text}.") if in_message else gemini_body(text, "")
    )
    if wrap:
        document = [document]
    headers = {} if header is None else {"Retry-After": str(header)}
    info = parse(headers, now=NOW, max_delay=max_delay, status=status, body=as_json(document))
    if not retry_after_counts(status):
        assert info.retry_after is None
    elif header is not None:
        assert info.retry_after == min(header, max_delay)
    elif status in (429, 503):
        assert info.retry_after == pytest.approx(min(float(seconds), max_delay))
    else:
        assert info.retry_after is None


@settings(deadline=None)
@given(
    quota=COUNTS,
    window=st.integers(min_value=1, max_value=10**6),
    data=st.data(),
    reset=st.integers(min_value=0, max_value=10**4),
    draft=st.sampled_from(["00", "6", "7", "8", "10"]),
)
def test_every_draft_states_its_window(
    quota: int, window: int, data: st.DataObject, reset: int, draft: str
) -> None:
    remaining = data.draw(st.integers(min_value=0, max_value=quota))
    if draft == "00":
        headers = {
            "RateLimit-Limit": f"{quota}, {quota};window={window}",
            "RateLimit-Remaining": str(remaining),
            "RateLimit-Reset": str(reset),
        }
    elif draft == "6":
        headers = {
            "RateLimit-Policy": f"{quota};w={window}",
            "RateLimit-Limit": str(quota),
            "RateLimit-Remaining": str(remaining),
            "RateLimit-Reset": str(reset),
        }
    elif draft == "7":
        headers = {
            "RateLimit-Policy": f"{quota};w={window}",
            "RateLimit": f"limit={quota}, remaining={remaining}, reset={reset}",
        }
    else:
        headers = {
            "RateLimit-Policy": f'"p";q={quota};w={window}',
            "RateLimit": f'"p";r={remaining};t={reset}',
        }
    info = parse(headers, now=NOW, max_delay=MAX_DELAY)
    assert info.source == ("ietf" if draft in ("8", "10") else "ietf-legacy")
    assert (info.limit, info.window, info.remaining) == (quota, window, remaining)
    assert info.reset == min(reset, MAX_DELAY)


@settings(deadline=None)
@given(
    delay=st.floats(min_value=0.0, max_value=1e5),
    form=st.sampled_from(["delta", "epoch", "epoch-float", "epoch-ms", "rfc3339"]),
)
def test_x_ratelimit_reset_in_every_form(delay: float, form: str) -> None:
    if form == "rfc3339":
        moment = datetime.datetime.fromtimestamp(NOW + delay, datetime.timezone.utc)
        value = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        expected = moment.timestamp() - NOW
    elif form == "delta":
        value, expected = str(int(delay)), float(int(delay))
    elif form == "epoch":
        value, expected = str(int(NOW + delay)), float(int(NOW + delay) - NOW)
    elif form == "epoch-float":
        value, expected = f"{NOW + delay:.3f}", round(NOW + delay, 3) - NOW
    else:
        value, expected = str(int((NOW + delay) * 1000)), int((NOW + delay) * 1000) / 1000 - NOW
    info = parse({"X-RateLimit-Reset": value}, now=NOW, max_delay=1e6)
    assert info.reset == pytest.approx(max(0.0, expected), abs=1e-3)
    # How finely an epoch was stated: whole seconds (Flask-Limiter's integer
    # epoch) may be up to a second after the real reset.
    steps = {"epoch": 1.0, "epoch-float": 0.001, "epoch-ms": 0.001}
    assert info.reset_step == steps.get(form)


@settings(deadline=None)
@given(status=STATUSES, value=SECONDS)
def test_retry_after_counts_only_where_http_defines_it(status: int | None, value: int) -> None:
    info = parse({"Retry-After": str(value)}, now=NOW, max_delay=1e6, status=status)
    defined = status is None or status in (403, 429, 503) or 300 <= status < 400
    assert info.retry_after == (value if defined else None)


BODY_FRAGMENTS = st.sampled_from(
    [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        '"error"',
        '"details"',
        '"message"',
        '"@type"',
        '"type.googleapis.com/google.rpc.RetryInfo"',
        '"retryDelay"',
        '"46s"',
        '"0.5s"',
        '"-1s"',
        '"1e400s"',
        '"Please retry in 46s"',
        '"try again in 6m0s"',
        '"retry after 37 seconds"',
        "null",
        "1",
        "true",
        '"\\ud800"',
    ]
)
BODIES = st.one_of(
    st.none(),
    st.binary(max_size=60),
    st.text(max_size=60),
    st.lists(BODY_FRAGMENTS, max_size=30).map("".join),
    st.lists(BODY_FRAGMENTS, max_size=30).map(lambda parts: "".join(parts).encode()),
    st.recursive(
        st.one_of(st.none(), st.integers(), st.text(max_size=20)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
        ),
        max_leaves=12,
    ).filter(lambda value: isinstance(value, (dict, list))),
)


@settings(deadline=None)
@given(
    pairs=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6),
    status=STATUSES,
    body=BODIES,
    max_delay=MAX_DELAYS,
)
def test_parse_with_a_body_never_raises_and_bounds_delays(
    pairs: list[tuple[str, str | bytes]], status: int | None, body: Any, max_delay: float
) -> None:
    info = parse(pairs, now=NOW, max_delay=max_delay, status=status, body=body)
    for part in (info, *info.budgets):
        for delay in (part.retry_after, part.reset, part.wait(), part.pace()):
            assert delay is None or 0.0 <= delay <= max_delay
    if not retry_after_counts(status):
        assert info.retry_after is None


def test_per_request_with_a_cost_so_small_the_count_overflows() -> None:
    # Found by the fuzz above: 1 token left for requests of 5e-324 tokens is
    # more requests than a float holds; the count is unknown, not an error.
    info = parse({"anthropic-ratelimit-tokens-remaining": "1"}, now=0.0, max_delay=1.0)
    views = info.for_scopes({"tokens": 5e-324}, {"tokens": "tokens"})
    assert views["tokens"].remaining is None
    budget = info.for_budget("tokens")
    assert budget is not None
    assert budget.per_request(0.5).remaining == 2.0
