"""Read the rate-limit hints a server puts in its response headers.

:func:`parse` turns the headers of one HTTP response into a frozen
:class:`RateLimitInfo` with every delay in seconds from *now*. It is pure and
synchronous (sans-IO): it never reads a clock, the caller passes the current
wall-clock time as ``now`` (epoch seconds, what :func:`time.time` returns).

Header families
===============

``Retry-After`` (RFC 9110, section 10.2.3) and ``Retry-After-Ms``
    ``Retry-After`` is either delay-seconds (``120``; a decimal such as
    ``1.5`` is accepted too) or an HTTP-date in any of its three forms:
    IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``), the obsolete RFC 850 form
    (``Sunday, 06-Nov-94 08:49:37 GMT``, its two-digit year read as RFC 9110
    asks) and asctime (``Sun Nov  6 08:49:37 1994``), parsed leniently by
    :func:`email.utils.parsedate_to_datetime`. A date becomes a delay relative
    to the response's own ``Date`` header when that is present and valid
    (which cancels any clock skew between server and client), else relative
    to ``now``. A date in the past means "no wait" (``0.0``).
    ``Retry-After-Ms`` (sent by OpenAI and Azure OpenAI) gives the same delay
    in milliseconds; when valid it wins over ``Retry-After``, as the vendors'
    own SDKs do. The result is :attr:`RateLimitInfo.retry_after`.

IETF structured fields (``source="ietf"``)
    draft-ietf-httpapi-ratelimit-headers-8 and later (up to 11) define two Structured Fields
    (RFC 9651) Lists. ``RateLimit-Policy: "default";q=100;w=60`` describes
    quota policies: the item is the policy name (a String or Token), ``q`` is
    the quota, ``w`` the window in seconds, ``qu`` the quota unit, ``pk`` a
    partition key (a Byte Sequence). ``RateLimit: "default";r=50;t=30`` gives
    the live state per policy: ``r`` units remaining, ``t`` seconds until the
    quota resets, ``pk``. Each reported policy is a budget (see below), whose
    quota and window come from the ``RateLimit-Policy`` item with the same
    name. Without a ``RateLimit`` field, the policy with the smallest quota
    per second is reported (limit and window only).

Older IETF drafts (``source="ietf-legacy"``)
    Separate ``RateLimit-Limit``, ``RateLimit-Remaining`` and
    ``RateLimit-Reset`` fields (drafts up to 6; the limit may carry quota
    policies, as in ``100, 100;w=60``, or ``100, 100;window=60`` in the
    first drafts: the first number is the limit and the ``w`` of a
    matching policy is the window), and the combined dictionary form
    ``RateLimit: limit=100, remaining=50, reset=30`` (draft 7), recognised
    when a ``RateLimit`` value is not a valid draft-10 List. Drafts 6 and 7
    state the policies in a ``RateLimit-Policy`` of numbers
    (``120;w=60, 1000;w=3600``): the window is the ``w`` of the policy
    whose quota is the limit, and without a limit the policy with the
    smallest quota per second gives both. The reset is read like
    an ``X-RateLimit-Reset`` (GitLab sends a Unix time there). GitLab's
    ``RateLimit-Observed`` (units used) gives the remaining units when
    ``RateLimit-Remaining`` is missing.

De facto ``X-RateLimit-*`` (``source="x-ratelimit"``)
    ``X-RateLimit-Limit``, ``X-RateLimit-Remaining``, ``X-RateLimit-Reset``, the
    same with ``X-Rate-Limit-`` prefixes (X), ``X-RateLimit-Reset-After``
    (delta seconds, Discord) and ``X-RateLimit-Used`` (GitHub, Reddit: the
    remaining units are ``limit - used`` when not given, the limit is
    ``remaining + used`` when not given). A reset above ``1e12`` is an epoch
    time in milliseconds, above ``1e9`` an epoch time in seconds, whole or
    decimal (GitHub, X, Discord; both converted to a delay relative to ``now``; past times mean
    ``0.0``), anything else is delta seconds (Reddit). An HTTP-date reset
    (Cloudflare) or an RFC 3339 one (``2025-01-01T00:01:00Z``) is converted
    relative to ``now`` as well.

OpenAI (``source="openai"``)
    ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, as sent by
    OpenAI, Azure OpenAI and the APIs that copy them: two budgets,
    ``"requests"`` and ``"tokens"``. A reset is a Go duration (``1s``,
    ``6m0s``, ``20ms``, ``1h2m3.5s``) or plain seconds. Azure OpenAI sends
    ``-1`` (and a reset of ``0``) for a budget it does not report: a budget
    whose limit or remaining is negative, or whose limit is ``0``, is
    unknown (not reported at all), and ``remaining: 0`` with a reset of
    ``0`` is unknown too, not spent.

Groq (``source="groq"``)
    The same fields, recognised by Groq's ``x-groq-region``: the requests
    budget is per **day** (``window=86400``) and the tokens budget per
    minute (``window=60``).

Anthropic (``source="anthropic"``)
    ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}``:
    four budgets, each reset an RFC 3339 time (``2025-01-01T00:01:00Z``)
    converted relative to ``now``.

A wait stated in the body (``body=``, on a 429 or 503 only)
    Google's Gemini API sends no rate-limit header: its 429 carries the wait
    in a small JSON body, as ``RetryInfo`` (``"retryDelay": "46s"`` among the
    ``error.details``) and in the message (``"Please retry in 46.2s."``).
    Given the body of a 429 or 503 (at most :data:`MAX_WAIT_BODY` long), the
    longest wait it states this way (also ``"try again in 20s"``, OpenAI,
    and ``"retry after 37 seconds"``, Azure) becomes the
    :attr:`~RateLimitInfo.retry_after` of a response without
    ``Retry-After``/``Retry-After-Ms``. :func:`wants_body` says when an
    adapter should pass the body.

Which statuses ``Retry-After`` counts on
    HTTP defines ``Retry-After`` for 503, 429 and redirects (RFC 9110,
    section 10.2.3; RFC 6585), and GitHub and others send it with a 403 that
    means "too fast". Given the response's ``status=``, :func:`parse` reads
    ``Retry-After``/``Retry-After-Ms`` on those statuses only
    (:func:`retry_after_counts`): a framework that sends it on every
    response, 200s included, does not block the scope while it answers.

Budgets
=======

A server may report several quotas at once: requests and tokens (OpenAI,
Anthropic), an hourly and a daily policy (IETF). Each one is a *budget*: a
:class:`RateLimitInfo` of its own in :attr:`RateLimitInfo.budgets`, named by
:attr:`~RateLimitInfo.budget` (``"requests"``, ``"tokens"``, or the IETF
policy name). The top-level ``remaining``, ``reset``, ``limit`` and ``window``
are those of the most restrictive budget: an exhausted one first (the latest
reset among them), else the one with the longest :meth:`~RateLimitInfo.pace`,
else the fewest remaining. :meth:`RateLimitInfo.for_scopes` hands each
throttling scope the budget it tracks, so a nearly spent token budget slows
the scope that counts tokens and not the one that counts requests.

Precedence and duplicates
=========================

``remaining``, ``reset``, ``limit`` and ``window`` all come from one family,
so that they describe the same window: the first of Anthropic, OpenAI (or Groq), IETF
structured, ietf-legacy, x-ratelimit that reports ``remaining`` or ``reset``,
or failing that the first that reports a ``limit``. :attr:`RateLimitInfo.source`
names it. ``Retry-After`` is independent of the families and wins over them in
:meth:`RateLimitInfo.wait`.

A header name may occur several times (or carry a comma-separated list that a
proxy merged). The result is deterministic and errs on the careful side: the
largest valid ``Retry-After``, the smallest remaining, the largest reset and
the smallest limit.

Hostile input
=============

A misbehaving server must not crash the client, stall it, or make parsing
expensive, so:

* no header value ever makes :func:`parse` raise; a value that cannot be
  understood is ignored. Only a wrong argument type (a programmer error)
  raises :class:`TypeError`, and bad ``now``/``max_delay`` raise
  :class:`ValueError`;
* negative numbers, NaN, infinities and numbers longer than 20 characters are
  ignored; dates and durations longer than 40 characters are ignored;
* every delay (:attr:`~RateLimitInfo.retry_after`, :attr:`~RateLimitInfo.reset`,
  and so what :meth:`~RateLimitInfo.wait` and :meth:`~RateLimitInfo.pace`
  return) is clamped to ``[0, max_delay]``; the pace is computed from the
  reset *before* that clamp, so a long window keeps its slow pace;
* the work is bounded whatever the server sends: a header value longer than
  8 KiB is ignored; at most 16 values per header name are considered; at most
  32 members of a list (or members of a legacy dictionary, or parameters of a
  legacy item) are read, the field lines of one Structured Field List counting
  together; and at most 8 KiB of text per header name is handed to the
  Structured Fields parser. A header name longer than any this module reads
  is skipped without being decoded or lower-cased.

Example::

    >>> info = parse({"RateLimit": '"default";r=0;t=12'}, now=1_700_000_000.0)
    >>> info.remaining, info.reset, info.source, info.wait()
    (0.0, 12.0, 'ietf', 12.0)
    >>> info = parse(
    ...     {"x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "1s",
    ...      "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"},
    ...     now=1_700_000_000.0,
    ... )
    >>> info.budget, info.wait(), info.for_budget("requests").remaining
    ('tokens', 300.0, 59.0)
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final, TypeAlias

import attrs
import http_sf

__all__ = [
    "EMPTY",
    "MAX_WAIT_BODY",
    "RateLimitInfo",
    "parse",
    "parse_retry_after",
    "retry_after_counts",
    "wants_body",
]

_Headers: TypeAlias = Mapping[Any, Any] | Iterable[tuple[str | bytes, str | bytes]] | None

#: A header value longer than this (in characters or bytes) is ignored.
_MAX_VALUE_LENGTH: Final = 8192
#: At most this many values are considered per header name.
_MAX_VALUES_PER_NAME: Final = 16
#: At most this many members (or parameters) of a list are considered; the field
#: lines of one Structured Field List count together.
_MAX_MEMBERS: Final = 32
#: At most this much Structured Field text is parsed per header name.
_MAX_STRUCTURED_LENGTH: Final = 8192
#: A number written with more characters than this is ignored.
_MAX_NUMBER_LENGTH: Final = 20
#: A date or a duration written with more characters than this is ignored.
_MAX_DATE_LENGTH: Final = 40

_SOURCES: Final = frozenset({"anthropic", "groq", "ietf", "ietf-legacy", "openai", "x-ratelimit"})

#: Statuses besides the redirects (3xx) on which ``Retry-After`` asks to wait:
#: 429 and 503 as HTTP defines it, 403 as GitHub's secondary limits send it.
_RETRY_AFTER_STATUSES: Final = frozenset({403, 429, 503})
#: Statuses whose small JSON body may state the wait (Gemini's 429).
_WAIT_BODY_STATUSES: Final = frozenset({429, 503})
#: A body longer than this (in bytes or characters) is not read for a wait.
MAX_WAIT_BODY: Final = 16 * 1024
#: At most this much of an error message is searched for a wait.
_MAX_MESSAGE_LENGTH: Final = 2048
#: At most this many documents of a JSON array body are looked at.
_MAX_BODY_DOCUMENTS: Final = 4

_RETRY_AFTER: Final = "retry-after"
_RETRY_AFTER_MS: Final = "retry-after-ms"
_DATE: Final = "date"
_RATELIMIT: Final = "ratelimit"
_RATELIMIT_POLICY: Final = "ratelimit-policy"
_LEGACY_LIMIT: Final = "ratelimit-limit"
_LEGACY_REMAINING: Final = "ratelimit-remaining"
_LEGACY_RESET: Final = "ratelimit-reset"
_LEGACY_OBSERVED: Final = "ratelimit-observed"
_X_LIMIT: Final = ("x-ratelimit-limit", "x-rate-limit-limit")
_X_REMAINING: Final = ("x-ratelimit-remaining", "x-rate-limit-remaining")
_X_RESET: Final = ("x-ratelimit-reset", "x-rate-limit-reset")
_X_RESET_AFTER: Final = "x-ratelimit-reset-after"
_X_USED: Final = "x-ratelimit-used"
#: Sent by Groq only: its x-ratelimit-*-requests budget is per day.
_GROQ_MARKER: Final = "x-groq-region"
#: Groq's budgets' windows: requests per day, tokens per minute.
_GROQ_WINDOWS: Final = {"requests": 86_400.0, "tokens": 60.0}


def _budget_fields(template: str, budget: str) -> tuple[str, str, str]:
    """The (limit, remaining, reset) field names of one budget."""
    limit, remaining, reset = (
        template.format(kind=kind, budget=budget) for kind in ("limit", "remaining", "reset")
    )
    return limit, remaining, reset


#: Budget name -> the (limit, remaining, reset) header names that report it.
_OPENAI_BUDGETS: Final = {
    budget: _budget_fields("x-ratelimit-{kind}-{budget}", budget)
    for budget in ("requests", "tokens")
}
_ANTHROPIC_BUDGETS: Final = {
    budget: _budget_fields("anthropic-ratelimit-{budget}-{kind}", budget)
    for budget in ("requests", "tokens", "input-tokens", "output-tokens")
}

_FIELD_NAMES: Final = frozenset(
    {
        _RETRY_AFTER,
        _RETRY_AFTER_MS,
        _DATE,
        _RATELIMIT,
        _RATELIMIT_POLICY,
        _LEGACY_LIMIT,
        _LEGACY_REMAINING,
        _LEGACY_RESET,
        _LEGACY_OBSERVED,
        *_X_LIMIT,
        *_X_REMAINING,
        *_X_RESET,
        _X_RESET_AFTER,
        _X_USED,
        _GROQ_MARKER,
        *(name for names in _OPENAI_BUDGETS.values() for name in names),
        *(name for names in _ANTHROPIC_BUDGETS.values() for name in names),
    }
)
_MAX_NAME_LENGTH: Final = max(len(name) for name in _FIELD_NAMES)
_OWS: Final = " \t"

_NUMBER: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")
#: A negative number: Azure OpenAI's "not reported" (``-1``).
_NEGATIVE: Final = re.compile(r"-[0-9]+(?:\.[0-9]+)?")
#: A google.protobuf.Duration in JSON: ``"46s"``, ``"8.941621227s"``.
_PROTO_DURATION: Final = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)s")
#: A wait stated in an error message: ``Please retry in 46.2s``, ``try again in 6m0s``.
_MESSAGE_RETRY_IN: Final = re.compile(
    r"(?:retry|try again) in ((?:[0-9]+(?:\.[0-9]+)?(?:h|ms|m|s|us|µs|μs|ns))+)", re.IGNORECASE
)
#: ``retry after 37 seconds`` (Azure OpenAI).
_MESSAGE_RETRY_AFTER: Final = re.compile(
    r"retry after ([0-9]+(?:\.[0-9]+)?) seconds?", re.IGNORECASE
)
#: A Go duration (``time.Duration.String()``): ``1h2m3.5s``, ``6m0s``, ``20ms``.
_GO_DURATION: Final = re.compile(r"(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:h|m|s|ms|us|µs|μs|ns))+")
_GO_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ms|us|µs|μs|ns|h|m|s)")
_GO_UNITS: Final = {
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ns": 1e-9,
}
#: An RFC 3339 date-time: ``2025-01-01T00:01:00Z``, ``2025-01-01T00:01:00.5+01:00``.
_RFC3339: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))",
    re.ASCII,
)
#: The date part of an RFC 850 date, ``06-Nov-94``, whose year has two digits.
_RFC850_DAY: Final = re.compile(r"[0-9]{1,2}-[A-Za-z]{3}-([0-9]{2})", re.ASCII)

#: One member of a Structured Field List: quoted strings may hold commas.
_STRUCTURED_MEMBER = re.compile(r'(?:"(?:[^"\\]|\\.)*"|[^",])*', re.DOTALL)

_UTC: Final = datetime.timezone.utc
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=_UTC)


def _check_delay(
    instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is None:
        return
    _check_number(attribute.name, value)
    if not (_is_finite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be None or a finite number >= 0, got {value!r}")


def _check_positive(
    instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is None:
        return
    _check_number(attribute.name, value)
    if not (_is_finite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be None or a finite number > 0, got {value!r}")


def _check_text(
    instance: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be None or a str, got {type(value).__name__}")


def _check_source(
    instance: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None and value not in _SOURCES:
        allowed = ", ".join(repr(source) for source in sorted(_SOURCES))
        raise ValueError(f"{attribute.name} must be None or one of {allowed}, got {value!r}")


def _check_budgets(
    instance: object, attribute: attrs.Attribute[tuple[Any, ...]], value: tuple[Any, ...]
) -> None:
    for budget in value:
        if not isinstance(budget, RateLimitInfo) or budget.budget is None:
            raise TypeError(
                f"{attribute.name} must hold RateLimitInfo objects with a budget name, "
                f"got {budget!r}"
            )


def _as_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value)


def _spread(remaining: float | None, reset: float | None) -> float | None:
    """``reset / remaining`` but never more than ``reset``; ``None`` unless both are known."""
    if remaining is None or reset is None or remaining <= 0:
        return None
    return min(reset, reset / remaining)


def _default_interval(info: RateLimitInfo) -> float | None:
    return _spread(info.remaining, info.reset)


def _rank(info: RateLimitInfo) -> tuple[int, float, float]:
    """Sort key: the most restrictive budget first (see the module documentation)."""
    reset = info.reset or 0.0
    if info.remaining == 0:
        return (0, -reset, 0.0)
    remaining = math.inf if info.remaining is None else info.remaining
    return (1, -(info.interval or 0.0), remaining)


@attrs.frozen(kw_only=True)
class RateLimitInfo:
    """What one response's headers say about the client's rate limit.

    Every attribute is ``None`` when the server did not say (or said something
    that could not be understood). Delays are seconds from the moment passed as
    ``now`` to :func:`parse`, already clamped to ``[0, max_delay]``.

    :ivar retry_after: seconds to wait before the next request, from
        ``Retry-After-Ms`` or ``Retry-After`` (on the statuses that define
        it, when the status is known), else from a 429's body.
    :ivar reset: seconds until the current quota window resets.
    :ivar remaining: requests (or quota units) left in the current window,
        ``>= 0``.
    :ivar limit: the quota of the window, ``> 0``.
    :ivar window: the window length in seconds, when the server states it.
    :ivar policy: the name of the IETF quota policy that was reported.
    :ivar partition_key: the IETF partition key (``pk``) as text (the bytes of
        the Byte Sequence decoded as latin-1).
    :ivar source: the header family that produced ``remaining``, ``reset``,
        ``limit`` and ``window``: ``"anthropic"``, ``"groq"``, ``"ietf"``,
        ``"ietf-legacy"``, ``"openai"``, ``"x-ratelimit"``, or ``None`` when
        no family applied.
    :ivar interval: seconds between sends that spread the remaining units
        until the reset (see :meth:`pace`). :func:`parse` computes it from
        the reset before clamping; by default it is derived from
        :attr:`reset` and :attr:`remaining`.
    :ivar budget: the name of the budget these fields describe (``"requests"``,
        ``"tokens"``, an IETF policy name), ``None`` for a family without
        named budgets.
    :ivar budgets: every named budget the response reported, each a
        :class:`RateLimitInfo` with its :attr:`budget` set; empty for the
        families that report a single unnamed quota.
    :ivar reset_step: the resolution of a reset stated as an epoch time, for
        the ``X-RateLimit-*`` family: ``1.0`` for whole seconds (an integer
        epoch such as Flask-Limiter's, up to a second after the real reset by
        a share that changes with the moment), ``0.001`` for epoch
        milliseconds, ``10**-d`` for ``d`` decimals; ``None`` for a delay in
        seconds or a date.

    Example::

        >>> info = RateLimitInfo(remaining=0, reset=30.0, source="x-ratelimit")
        >>> info.wait()
        30.0
    """

    retry_after: float | None = attrs.field(default=None, validator=_check_delay)
    reset: float | None = attrs.field(default=None, validator=_check_delay)
    remaining: float | None = attrs.field(default=None, validator=_check_delay)
    limit: float | None = attrs.field(default=None, validator=_check_positive)
    window: float | None = attrs.field(default=None, validator=_check_positive)
    policy: str | None = attrs.field(default=None, validator=_check_text)
    partition_key: str | None = attrs.field(default=None, validator=_check_text)
    source: str | None = attrs.field(default=None, validator=_check_source)
    interval: float | None = attrs.field(
        default=attrs.Factory(_default_interval, takes_self=True), validator=_check_delay
    )
    budget: str | None = attrs.field(default=None, validator=_check_text)
    budgets: tuple[RateLimitInfo, ...] = attrs.field(
        default=(), converter=_as_tuple, validator=_check_budgets
    )
    reset_step: float | None = attrs.field(default=None, validator=_check_delay)

    def wait(self) -> float | None:
        """Return the minimum wait, in seconds, that the server asks for now.

        ``Retry-After`` wins when present; otherwise, when the quota is used up
        (``remaining == 0``), the time until it resets.

        :returns: :attr:`retry_after` if set, else :attr:`reset` when
            :attr:`remaining` is ``0``, else ``None`` (no wait requested).
        """
        if self.retry_after is not None:
            return self.retry_after
        if self.remaining == 0 and self.reset is not None:
            return self.reset
        return None

    def pace(self) -> float | None:
        """Return a send interval that spreads the remaining quota over the window.

        This is ``reset / remaining``, but never more than the reset (with
        less than one unit left, waiting for the reset is enough): the
        :attr:`interval`. From :func:`parse` it is computed with the reset the
        server sent, then clamped to ``max_delay``, so ``r=100;t=36000`` paces
        one request per 360 s (or ``max_delay``), not per ``max_delay / 100``.

        :returns: seconds between requests, or ``None`` unless :attr:`remaining`
            is ``> 0`` and the reset is known.
        """
        return self.interval

    def for_budget(self, name: str) -> RateLimitInfo | None:
        """The budget called ``name``, with this response's :attr:`retry_after`.

        :returns: ``None`` when the response did not report that budget.
        """
        for budget in self.budgets:
            if budget.budget == name:
                return attrs.evolve(budget, retry_after=self.retry_after)
        return None

    def excluding(self, names: Collection[str]) -> RateLimitInfo:
        """This information without the budgets called ``names``.

        The top-level fields become those of the most restrictive budget left
        (only :attr:`retry_after` when none is left). Information without
        named budgets is returned unchanged.
        """
        if not self.budgets or not any(budget.budget in names for budget in self.budgets):
            return self
        left = tuple(budget for budget in self.budgets if budget.budget not in names)
        if not left:
            return RateLimitInfo(retry_after=self.retry_after)
        return _with_budgets(left, self.retry_after)

    def per_request(self, cost: float) -> RateLimitInfo:
        """This budget counted in requests that each take ``cost`` units.

        A token budget reports tokens, but a scope paces requests: with
        ``remaining=2000`` tokens and requests of ``cost=1000``, two requests
        are left. Less than one request's worth left counts as ``0`` (wait
        for the reset). ``cost <= 0`` or ``1`` returns the information as it is;
        a cost so small that the count of requests overflows leaves it unknown.
        """
        if cost <= 0 or cost == 1:
            return self
        remaining = None if self.remaining is None else _finite(self.remaining / cost)
        limit = None if self.limit is None else _finite(self.limit / cost)
        if remaining is None or self.interval is None or self.reset is None:
            interval = self.interval
        else:
            # reset / remaining grows by the cost, and stays within the reset.
            interval = min(self.reset, self.interval * cost)
        if remaining is not None and remaining < 1:
            remaining, interval = 0.0, None
        return attrs.evolve(self, remaining=remaining, limit=limit, interval=interval, budgets=())

    def for_scopes(
        self, costs: Mapping[str, float], budgets: Mapping[str, str]
    ) -> dict[str, RateLimitInfo]:
        """What each of a request's scopes should learn from this response.

        :param costs: the request's ``{scope: cost}``.
        :param budgets: which scope tracks which budget, ``{budget: scope}``,
            e.g. ``{"tokens": "openai-tokens"}``.
        :returns: ``{scope: info}``. A scope named in ``budgets`` gets its
            budget counted in requests of its cost (:meth:`per_request`), or
            only :attr:`retry_after` when the response did not report that
            budget; every other scope gets the information without the
            budgets named in ``budgets`` (:meth:`excluding`), so a nearly
            spent token budget does not slow the scope that counts requests.
        """
        tracked = {scope: budget for budget, scope in budgets.items()}
        rest = self.excluding(budgets.keys())
        views: dict[str, RateLimitInfo] = {}
        for scope, cost in costs.items():
            name = tracked.get(scope)
            if name is None:
                views[scope] = rest
                continue
            budget = self.for_budget(name)
            if budget is None:
                views[scope] = RateLimitInfo(retry_after=self.retry_after)
            else:
                views[scope] = budget.per_request(cost)
        return views


def _finite(number: float) -> float | None:
    """``number``, or ``None`` when it overflowed to infinity."""
    return number if math.isfinite(number) else None


def _with_budgets(budgets: Sequence[RateLimitInfo], retry_after: float | None) -> RateLimitInfo:
    """The information whose top-level fields are the most restrictive of ``budgets``."""
    top = min(budgets, key=_rank)
    return attrs.evolve(top, retry_after=retry_after, budgets=tuple(budgets))


#: The result for a response without any rate-limit header: every attribute is ``None``.
EMPTY: Final = RateLimitInfo()


@attrs.frozen
class _PolicyItem:
    """One member of a draft-10 ``RateLimit`` or ``RateLimit-Policy`` List."""

    name: str
    params: Mapping[str, object]


def parse(
    headers: _Headers,
    *,
    now: float,
    max_delay: float = 300.0,
    status: int | None = None,
    body: bytes | str | dict[str, Any] | list[Any] | None = None,
) -> RateLimitInfo:
    """Parse the rate-limit headers of one response.

    Header names are matched case-insensitively in any container, and values
    that are bytes are decoded as latin-1. See the module documentation for
    the formats, their precedence and the bounds applied to hostile input.
    Never raises because of a header's value or the body's content.

    :param headers: the response headers: a mapping (``dict``,
        ``httpx.Headers``, multidict's ``CIMultiDict``/``CIMultiDictProxy``,
        Scrapy's ``Headers``, whose values may be lists of values), an iterable
        of ``(name, value)`` pairs, names and values being ``str`` or
        ``bytes``, or ``None``.
    :param now: the current wall-clock time in epoch seconds (``time.time()``);
        absolute times in the headers are converted relative to it.
    :param max_delay: the longest delay, in seconds, that will be reported;
        longer ones are clamped to it.
    :param status: the response's HTTP status, when known: ``Retry-After``
        and ``Retry-After-Ms`` then count only where HTTP defines them
        (:func:`retry_after_counts`). ``None`` reads them whatever the status.
    :param body: the body of a 429 or 503 response (at most
        :data:`MAX_WAIT_BODY` long, as bytes, text or its parsed JSON), for
        a wait it states (Gemini's ``RetryInfo``); ignored with any other
        ``status``, and when ``Retry-After`` is present. See
        :func:`wants_body`.
    :returns: the normalized information; :data:`EMPTY` when ``headers`` is
        ``None`` or holds no rate-limit header (and the body states no wait).
    :raises TypeError: if ``headers`` is not one of the accepted containers,
        a name or value is neither ``str`` nor ``bytes``, ``now`` or
        ``max_delay`` is not a number, ``status`` is not an int or ``None``,
        or ``body`` is none of the accepted types.
    :raises ValueError: if ``now`` is not finite, or ``max_delay`` is not
        finite and ``> 0``.
    """
    _check_now(now)
    _check_max_delay(max_delay)
    _check_status(status)
    _check_body(body)
    now, max_delay = float(now), float(max_delay)
    fields = _collect(headers)
    body_wait = None
    if body is not None and status in _WAIT_BODY_STATUSES:
        body_wait = _body_wait(body, max_delay)
    if not fields and body_wait is None:
        return EMPTY
    retry_after = None
    if retry_after_counts(status):
        retry_after = _header_retry_after(fields, now, max_delay)
        if retry_after is None:
            retry_after = body_wait
    quota = _families_quota(fields, now, max_delay)
    if retry_after is None and quota is None:
        return EMPTY
    if quota is None:
        return RateLimitInfo(retry_after=retry_after)
    return attrs.evolve(quota, retry_after=retry_after)


def _families_quota(
    fields: Mapping[str, Sequence[str]], now: float, max_delay: float
) -> RateLimitInfo | None:
    """The quota of the first header family that reports one (see the module documentation)."""
    states, dictionary_lines = _structured_items(fields.get(_RATELIMIT, ()))
    policies, _ = _structured_items(fields.get(_RATELIMIT_POLICY, ()))
    groq = _GROQ_MARKER in fields
    return _choose_quota(
        (
            _budget_family("anthropic", _ANTHROPIC_BUDGETS, fields, _rfc3339_delay, now, max_delay),
            _budget_family(
                "groq" if groq else "openai",
                _OPENAI_BUDGETS,
                fields,
                _duration_delay,
                now,
                max_delay,
                _GROQ_WINDOWS if groq else None,
            ),
            _ietf_quota(states, policies, max_delay),
            _legacy_quota(fields, dictionary_lines, now, max_delay),
            _x_ratelimit_quota(fields, now, max_delay),
        )
    )


def retry_after_counts(status: int | None) -> bool:
    """Whether ``Retry-After`` on a response with this status asks the client to wait.

    HTTP defines it for 503 (Service Unavailable), 429 (Too Many Requests)
    and the redirects (3xx); GitHub and others send it with a 403 that
    means "too fast". On any other status (a 200, a 404) it is ignored:
    some frameworks send it on every response. ``None`` (status unknown)
    counts.

    :raises TypeError: if ``status`` is neither an int nor ``None``.
    """
    _check_status(status)
    return status is None or status in _RETRY_AFTER_STATUSES or 300 <= status < 400


def wants_body(status: int | None, headers: Any) -> bool:
    """Whether an adapter should read this response's body and pass it to :func:`parse`.

    Only a 429 or 503 whose ``Content-Type`` is JSON may state its wait in
    the body (never another status, nor a stream of events), and only a
    small one: a ``Content-Length`` above :data:`MAX_WAIT_BODY` says no. A
    body of unstated length (Gemini's 429 comes chunked and gzipped) says
    yes, and the adapter reads at most :data:`MAX_WAIT_BODY` bytes of it,
    passing nothing (and leaving the body whole for the client) when there
    are more.

    :param headers: the response headers: a mapping or any headers object
        with ``.get`` (values ``str`` or ``bytes``).
    """
    if status not in _WAIT_BODY_STATUSES:
        return False
    kind = _header_value(headers, "content-type")
    if kind is None:
        return False
    kind = kind.partition(";")[0].strip(_OWS).lower()
    if kind != "application/json" and not kind.endswith("+json"):
        return False
    length = _header_value(headers, "content-length")
    if length is None:
        return True
    length = length.strip(_OWS)
    return length.isdigit() and len(length) <= _MAX_NUMBER_LENGTH and int(length) <= MAX_WAIT_BODY


def parse_retry_after(
    value: str | bytes,
    *,
    now: float,
    date: str | bytes | None = None,
    max_delay: float = 300.0,
) -> float | None:
    """Parse one ``Retry-After`` value into a delay in seconds.

    :param value: delay-seconds (``"120"``, or a decimal such as ``"1.5"``) or
        an HTTP-date (IMF-fixdate, RFC 850 or asctime form); bytes are decoded
        as latin-1.
    :param now: the current wall-clock time in epoch seconds; a date is
        relative to it unless ``date`` is valid.
    :param date: the response's ``Date`` header, if any. When it is a valid
        HTTP-date, a date ``value`` is converted to ``value - date``.
    :param max_delay: the longest delay that will be returned.
    :returns: the delay in ``[0, max_delay]`` (``0.0`` for a date in the
        past), or ``None`` when ``value`` is empty, negative, not a number or
        date, too long, or otherwise invalid.
    :raises TypeError: if ``value`` or ``date`` is neither ``str`` nor
        ``bytes`` (``date`` may be ``None``), or ``now``/``max_delay`` is not a
        number.
    :raises ValueError: if ``now`` is not finite, or ``max_delay`` is not
        finite and ``> 0``.
    """
    _check_now(now)
    _check_max_delay(max_delay)
    now, max_delay = float(now), float(max_delay)
    text = _argument_text("value", value)
    date_text = None if date is None else _argument_text("date", date)
    if text is None:
        return None
    date_epoch = None if date_text is None else _http_date(date_text, now)
    return _retry_after_delay(text, now=now, date=date_epoch, max_delay=max_delay)


def _header_retry_after(
    fields: Mapping[str, Sequence[str]], now: float, max_delay: float
) -> float | None:
    """The wait of ``Retry-After-Ms`` (which wins when valid), else of ``Retry-After``."""
    retry_after = _largest(
        _clamp(milliseconds / 1000.0, max_delay)
        for value in fields.get(_RETRY_AFTER_MS, ())
        for milliseconds in (_number(value),)
        if milliseconds is not None
    )
    if retry_after is None:
        date = _earliest_date(fields.get(_DATE, ()), now)
        retry_after = _largest(
            _retry_after_delay(value, now=now, date=date, max_delay=max_delay)
            for value in fields.get(_RETRY_AFTER, ())
        )
    return retry_after


def _header_value(headers: Any, name: str) -> str | None:
    """One header's value as text from any container with ``.get``, ``None`` if absent."""
    getter = getattr(headers, "get", None)
    if not callable(getter):
        return None
    for key in (name, name.title()):
        value = getter(key)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if isinstance(value, (bytes, bytearray)):
            return bytes(value[:_MAX_VALUE_LENGTH]).decode("latin-1")
        if isinstance(value, str):
            return value[:_MAX_VALUE_LENGTH]
    return None


# Waits stated in a body ------------------------------------------------------


def _body_wait(body: object, max_delay: float) -> float | None:
    """The longest wait a 429's JSON body states (Gemini, OpenAI, Azure), clamped."""
    waits: list[float | None] = []
    for error in _body_errors(body):
        details = error.get("details")
        if isinstance(details, list):
            for detail in details[:_MAX_MEMBERS]:
                if not isinstance(detail, dict):
                    continue
                kind = detail.get("@type")
                if isinstance(kind, str) and kind.endswith("google.rpc.RetryInfo"):
                    waits.append(_proto_duration(detail.get("retryDelay")))
        message = error.get("message")
        if isinstance(message, str):
            text = message[:_MAX_MESSAGE_LENGTH]
            for match in _MESSAGE_RETRY_IN.finditer(text):
                waits.append(_duration_delay(match.group(1), 0.0))
            waits.extend(_number(match.group(1)) for match in _MESSAGE_RETRY_AFTER.finditer(text))
    wait = _largest(waits)
    return None if wait is None else _clamp(wait, max_delay)


def _body_errors(body: object) -> list[dict[str, Any]]:
    """The ``error`` objects of a body: ``{"error": {...}}`` or a list of them (Gemini streams)."""
    document: object = body
    if isinstance(body, (bytes, bytearray, str)):
        if len(body) > MAX_WAIT_BODY:
            return []
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
            return []
    items = document[:_MAX_BODY_DOCUMENTS] if isinstance(document, list) else [document]
    return [
        item["error"]
        for item in items
        if isinstance(item, dict) and isinstance(item.get("error"), dict)
    ]


def _proto_duration(value: object) -> float | None:
    """A google.protobuf.Duration as JSON (``"46s"``, ``"0.5s"``) in seconds."""
    if not isinstance(value, str) or len(value) > _MAX_NUMBER_LENGTH + 1:
        return None
    match = _PROTO_DURATION.fullmatch(value.strip(_OWS))
    return None if match is None else float(match.group(1))


# Argument checks ------------------------------------------------------------


def _check_status(status: object) -> None:
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
        raise TypeError(f"status must be an int or None, got {type(status).__name__}")


def _check_body(body: object) -> None:
    if body is not None and not isinstance(body, (bytes, bytearray, str, dict, list)):
        raise TypeError(
            "body must be bytes, str, a parsed JSON document (dict or list) or None, "
            f"got {type(body).__name__}"
        )


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")


def _is_finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _check_now(now: float) -> None:
    _check_number("now", now)
    if not _is_finite(now):
        raise ValueError(f"now must be a finite number of epoch seconds, got {now!r}")


def _check_max_delay(max_delay: float) -> None:
    _check_number("max_delay", max_delay)
    if not (_is_finite(max_delay) and max_delay > 0):
        raise ValueError(f"max_delay must be a finite number > 0, got {max_delay!r}")


def _argument_text(name: str, value: object) -> str | None:
    """Return a ``parse_retry_after`` argument as text, ``None`` if too long."""
    if isinstance(value, (bytes, bytearray)):
        return None if len(value) > _MAX_VALUE_LENGTH else bytes(value).decode("latin-1")
    if isinstance(value, str):
        return None if len(value) > _MAX_VALUE_LENGTH else value
    raise TypeError(f"{name} must be str or bytes, got {type(value).__name__}")


# Collecting the fields ------------------------------------------------------


def _collect(headers: object) -> dict[str, list[str]]:
    """Gather the values of the rate-limit fields, keyed by lower-case name.

    Keeps the container's order, considers at most ``_MAX_VALUES_PER_NAME``
    values per name and drops values longer than ``_MAX_VALUE_LENGTH``.
    """
    fields: dict[str, list[str]] = {}
    considered: dict[str, int] = {}
    for name, value in _pairs(headers):
        key = _field_name(name)
        if key is None:
            continue
        for raw in _field_values(name, value):
            count = considered.get(key, 0)
            if count >= _MAX_VALUES_PER_NAME:
                break
            considered[key] = count + 1
            if len(raw) > _MAX_VALUE_LENGTH:
                continue
            text = raw if isinstance(raw, str) else bytes(raw).decode("latin-1")
            fields.setdefault(key, []).append(text)
    return fields


def _pairs(headers: object) -> Iterable[tuple[object, object]]:
    """Iterate over ``(name, value)`` pairs of any supported container."""
    if headers is None:
        return ()
    if isinstance(headers, (str, bytes, bytearray)):
        raise TypeError(_headers_type_message(headers))
    # multi_items first: httpx.Headers.items() joins repeated fields with ", ".
    # multidict's items() yields every pair; Scrapy's yields lists of values.
    for method_name in ("multi_items", "items"):
        method = getattr(headers, method_name, None)
        if callable(method):
            return _unpacked(method())
    for method_name in ("get_list", "getall", "getlist"):
        lookup = getattr(headers, method_name, None)
        if callable(lookup):
            return _looked_up(lookup)
    if isinstance(headers, Iterable):
        return _unpacked(headers)
    raise TypeError(_headers_type_message(headers))


def _headers_type_message(headers: object) -> str:
    return (
        "headers must be a mapping, a headers object, an iterable of (name, value) "
        f"pairs or None, got {type(headers).__name__}"
    )


def _unpacked(pairs: Iterable[Any]) -> Iterator[tuple[object, object]]:
    for pair in pairs:
        try:
            name, value = pair
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"headers must yield (name, value) pairs, got {type(pair).__name__}"
            ) from exc
        yield name, value


def _looked_up(lookup: Callable[[str], object]) -> Iterator[tuple[object, object]]:
    """Pairs from a container that only offers case-insensitive lookups by name."""
    for name in sorted(_FIELD_NAMES):
        try:
            values = lookup(name)
        except KeyError:
            continue
        yield name, values


def _field_name(name: object) -> str | None:
    """Return the lower-case name if it is one this module reads, else ``None``."""
    if isinstance(name, str):
        text = name
    elif isinstance(name, (bytes, bytearray)):
        if len(name) > _MAX_NAME_LENGTH:
            return None
        text = bytes(name).decode("latin-1")
    else:
        raise TypeError(f"header names must be str or bytes, got {type(name).__name__}")
    if len(text) > _MAX_NAME_LENGTH:
        return None
    text = text.lower()
    return text if text in _FIELD_NAMES else None


def _field_values(name: object, value: object) -> Sequence[str | bytes | bytearray]:
    """Return the values one container entry holds (Scrapy keeps a list)."""
    if isinstance(value, (str, bytes, bytearray)):
        return (value,)
    if isinstance(value, (list, tuple)):
        values = value[:_MAX_VALUES_PER_NAME]
        for item in values:
            if not isinstance(item, (str, bytes, bytearray)):
                raise TypeError(
                    f"the values of header {name!r} must be str or bytes, got {type(item).__name__}"
                )
        return values
    raise TypeError(
        f"the value of header {name!r} must be str or bytes, got {type(value).__name__}"
    )


# Small parsers ---------------------------------------------------------------


# Small parsers ---------------------------------------------------------------


def _clamp(delay: float, max_delay: float) -> float:
    return min(max(delay, 0.0), max_delay)


def _largest(values: Iterable[float | None]) -> float | None:
    found = [value for value in values if value is not None]
    return max(found) if found else None


def _smallest(values: Iterable[float | None]) -> float | None:
    found = [value for value in values if value is not None]
    return min(found) if found else None


def _number(text: str) -> float | None:
    """Parse a non-negative decimal number, ``None`` if invalid or too long."""
    text = text.strip(_OWS)
    if not text or len(text) > _MAX_NUMBER_LENGTH or _NUMBER.fullmatch(text) is None:
        return None
    return float(text)


def _members(text: str) -> list[str]:
    """Split a comma-separated list, keeping at most ``_MAX_MEMBERS`` members."""
    return text.split(",", _MAX_MEMBERS)[:_MAX_MEMBERS]


def _number_and_window(text: str) -> tuple[float | None, float | None]:
    """Parse ``100`` or ``100;w=60`` into the number and the ``w`` parameter."""
    number_text, _, params_text = text.partition(";")
    window = None
    if params_text:
        for param in params_text.split(";", _MAX_MEMBERS)[:_MAX_MEMBERS]:
            key, _, param_value = param.partition("=")
            if key.strip(_OWS).lower() in ("w", "window"):  # "window" in the first drafts
                window = _number(param_value)
                if window == 0:
                    window = None
                break
    return _number(number_text), window


def _limit_and_window(text: str) -> tuple[float, float | None] | None:
    """Parse a limit such as ``100`` or ``100, 100;w=60, 1000;w=3600``.

    The first number is the limit; the window is the ``w`` of the first member
    whose quota equals that limit.
    """
    members = _members(text)
    limit, window = _number_and_window(members[0])
    if limit is None or limit <= 0:
        return None
    if window is None:
        for member in members[1:]:
            quota, member_window = _number_and_window(member)
            if quota == limit and member_window is not None:
                window = member_window
                break
    return limit, window


def _numbers(text: str) -> Iterator[float]:
    """Yield the numbers of a comma-separated list, ignoring parameters."""
    for member in _members(text):
        number, _ = _number_and_window(member)
        if number is not None:
            yield number


def _smallest_limit(
    limits: Iterable[tuple[float, float | None] | None],
) -> tuple[float | None, float | None]:
    found = [limit for limit in limits if limit is not None]
    if not found:
        return None, None
    return min(found, key=lambda limit: limit[0])


def _utc_year(now: float) -> int | None:
    try:
        return (_EPOCH + datetime.timedelta(seconds=now)).year
    except OverflowError:
        return None


def _http_date(text: str, now: float) -> float | None:
    """Parse an HTTP-date in any of its three forms into epoch seconds.

    :func:`email.utils.parsedate_to_datetime` reads all three (and is lenient
    about the rest, as RFC 9110 encourages); a two-digit RFC 850 year is then
    placed as RFC 9110 asks, relative to ``now``. A date without a zone is UTC.
    """
    text = text.strip(_OWS)
    if not text or len(text) > _MAX_DATE_LENGTH:
        return None
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except Exception:  # the standard library's parser fed hostile input: "invalid"
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_UTC)
    short_year = _RFC850_DAY.search(text)
    if short_year is not None:
        year = _full_year(int(short_year.group(1)), now)
        try:
            moment = moment.replace(year=year)
        except ValueError:  # 29 February of a year that has none
            return None
    return (moment - _EPOCH).total_seconds()


def _full_year(two_digit_year: int, now: float) -> int:
    """Expand an RFC 850 two-digit year as RFC 9110 asks.

    A year that would be more than 50 years in the future is taken as the most
    recent past year with the same last two digits; the year is otherwise the
    one nearest to ``now``.
    """
    current = _utc_year(now)
    if current is None:
        return (1900 if two_digit_year >= 70 else 2000) + two_digit_year
    year = current - current % 100 + two_digit_year
    if year > current + 50:
        year -= 100
    elif year <= current - 50:
        year += 100
    return year


def _earliest_date(values: Iterable[str], now: float) -> float | None:
    """The earliest valid ``Date`` (which gives the longest Retry-After)."""
    return _smallest(_http_date(value, now) for value in values)


def _retry_after_delay(
    text: str, *, now: float, date: float | None, max_delay: float
) -> float | None:
    """Parse one ``Retry-After`` value; see :func:`parse_retry_after`."""
    text = text.strip(_OWS)
    if not text:
        return None
    seconds = _number(text)
    if seconds is not None:
        return _clamp(seconds, max_delay)
    retry_at = _http_date(text, now)
    if retry_at is not None:
        return _clamp(retry_at - (now if date is None else date), max_delay)
    if "," in text:
        # Repeated fields that a proxy joined with commas: "120, 60".
        seconds = _largest(_number(member) for member in _members(text))
        if seconds is not None:
            return _clamp(seconds, max_delay)
    return None


def _reset_delays(value: str, now: float) -> Iterator[float]:
    """Yield the delays of a reset value: delta seconds, epoch seconds or ms, or a date.

    A date is an HTTP-date or an RFC 3339 time. The delays are not clamped
    (a past time gives a negative delay).
    """
    date = _http_date(value, now)
    if date is not None:
        yield date - now
        return
    moment = _rfc3339_delay(value, now)
    if moment is not None:
        yield moment
        return
    for number in _numbers(value):
        if number > 1e12:
            yield number / 1000 - now
        elif number > 1e9:
            yield number - now
        else:
            yield number


def _duration_delay(value: str, now: float) -> float | None:
    """A Go duration (``6m0s``, ``20ms``, ``1h2m3.5s``) or plain seconds, in seconds."""
    text = value.strip(_OWS)
    if len(text) > _MAX_DATE_LENGTH:
        return None
    seconds = _number(text)
    if seconds is not None:
        return seconds
    if _GO_DURATION.fullmatch(text) is None:
        return None
    return sum(float(number) * _GO_UNITS[unit] for number, unit in _GO_PART.findall(text))


def _rfc3339_delay(value: str, now: float) -> float | None:
    """An RFC 3339 date-time (``2025-01-01T00:01:00Z``) as seconds from ``now``."""
    text = value.strip(_OWS)
    if len(text) > _MAX_DATE_LENGTH:
        return None
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, sign, zone_h, zone_m = match.groups()
    try:
        moment = datetime.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=_UTC
        )
    except ValueError:
        return None
    epoch = (moment - _EPOCH).total_seconds() + (float(fraction) if fraction else 0.0)
    if sign is not None:
        offset = int(zone_h) * 3600 + int(zone_m) * 60
        if int(zone_h) > 23 or int(zone_m) > 59:
            return None
        epoch -= offset if sign == "+" else -offset
    return epoch - now


# Header families -------------------------------------------------------------


def _first_members(text: str, count: int) -> str:
    """Cut a Structured Field List after its first *count* members.

    Commas inside quoted strings do not separate members. Text that does not
    split cleanly is returned whole (it will fail to parse anyway).
    """
    position = 0
    for _ in range(count):
        match = _STRUCTURED_MEMBER.match(text, position)
        end = len(text) if match is None else match.end()
        if end >= len(text) or text[end] != ",":
            return text
        position = end + 1
    return text[: max(position - 1, 0)]


def _parse_structured_list(text: str) -> list[object] | None:
    """Parse a Structured Field List with http_sf, ``None`` if it is invalid."""
    if not text.isascii():
        return None
    try:
        parsed = http_sf.parse(text.encode("ascii"), tltype="list")
    except Exception:  # a third-party parser fed hostile input: any failure means "invalid"
        return None
    return list(parsed) if isinstance(parsed, list) else None


def _structured_items(values: Sequence[str]) -> tuple[list[_PolicyItem], list[str]]:
    """Parse the field lines of a draft-10 List (``RateLimit``, ``RateLimit-Policy``).

    :returns: the members whose value is a String or Token (at most
        ``_MAX_MEMBERS`` over all lines), and the lines that are not valid
        Lists (for the legacy dictionary fallback).
    """
    items: list[_PolicyItem] = []
    invalid: list[str] = []
    budget = _MAX_STRUCTURED_LENGTH
    for value in values:
        if len(items) >= _MAX_MEMBERS:
            break
        text = _first_members(value.strip(_OWS), _MAX_MEMBERS - len(items))
        if len(text) > budget:
            continue
        budget -= len(text)
        parsed = _parse_structured_list(text)
        if parsed is None:
            invalid.append(value)
            continue
        for member in parsed[: _MAX_MEMBERS - len(items)]:
            item = _policy_item(member)
            if item is not None:
                items.append(item)
    return items, invalid


def _policy_item(member: object) -> _PolicyItem | None:
    if not (isinstance(member, tuple) and len(member) == 2):
        return None
    value, params = member
    if not isinstance(value, (str, http_sf.Token)) or not isinstance(params, dict):
        return None
    return _PolicyItem(str(value), params)


def _structured_number(value: object) -> float | None:
    """A non-negative finite Integer or Decimal parameter, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _structured_text(value: object) -> str | None:
    """A Byte Sequence (decoded as latin-1), String or Token parameter as text."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, (str, http_sf.Token)):
        return str(value)
    return None


@attrs.frozen
class _Policy:
    """A quota policy from ``RateLimit-Policy``."""

    name: str
    quota: float
    window: float | None
    partition_key: str | None

    def rate(self) -> float:
        """Quota per second, or the bare quota when the window is unknown."""
        return self.quota if self.window is None else self.quota / self.window


def _ietf_quota(
    states: Sequence[_PolicyItem], policy_items: Sequence[_PolicyItem], max_delay: float
) -> RateLimitInfo | None:
    """The draft-10 quota: one budget per ``RateLimit`` item, with its policy."""
    policies: dict[str, _Policy] = {}
    for item in policy_items:
        quota = _structured_number(item.params.get("q"))
        if quota is None or quota <= 0:
            continue
        window = _structured_number(item.params.get("w")) or None
        known = policies.get(item.name)
        if known is None or quota < known.quota:
            partition_key = _structured_text(item.params.get("pk"))
            policies[item.name] = _Policy(item.name, quota, window, partition_key)

    budgets: dict[str, RateLimitInfo] = {}
    for item in states:
        remaining = _structured_number(item.params.get("r"))
        if remaining is None:
            continue
        reset = _structured_number(item.params.get("t"))
        policy = policies.get(item.name)
        partition_key = _structured_text(item.params.get("pk"))
        if partition_key is None and policy is not None:
            partition_key = policy.partition_key
        budget = RateLimitInfo(
            remaining=remaining,
            reset=None if reset is None else _clamp(reset, max_delay),
            interval=_interval(remaining, reset, max_delay),
            limit=None if policy is None else policy.quota,
            window=None if policy is None else policy.window,
            policy=item.name,
            partition_key=partition_key,
            source="ietf",
            budget=item.name,
        )
        known_budget = budgets.get(item.name)
        if known_budget is None or _rank(budget) < _rank(known_budget):
            budgets[item.name] = budget
    if budgets:
        return _with_budgets(tuple(budgets.values()), None)
    if not policies:
        return None
    timed = [policy for policy in policies.values() if policy.window is not None]
    chosen = min(timed or policies.values(), key=_Policy.rate)
    return RateLimitInfo(
        limit=chosen.quota,
        window=chosen.window,
        policy=chosen.name,
        partition_key=chosen.partition_key,
        source="ietf",
    )


def _interval(remaining: float | None, reset: float | None, max_delay: float) -> float | None:
    """The pace from the reset the server sent, clamped only then."""
    interval = _spread(remaining, None if reset is None else max(reset, 0.0))
    return None if interval is None else _clamp(interval, max_delay)


def _quota(
    source: str,
    remaining: Sequence[float],
    resets: Sequence[float],
    limits: Iterable[tuple[float, float | None] | None],
    used: Sequence[float],
    max_delay: float,
    budget: str | None = None,
) -> RateLimitInfo | None:
    """Combine repeated values the careful way: least remaining, latest reset, smallest limit.

    ``used`` (units spent) completes what is missing: the remaining units as
    ``limit - used``, or the limit as ``remaining + used``.
    """
    limit, window = _smallest_limit(limits)
    left = min(remaining) if remaining else None
    spent = max(used) if used else None
    if spent is not None:
        if left is None and limit is not None:
            left = max(0.0, limit - spent)
        elif limit is None and left is not None and left + spent > 0:
            limit = left + spent
    if left is None and not resets and limit is None:
        return None
    reset = max(resets) if resets else None
    return RateLimitInfo(
        remaining=left,
        reset=None if reset is None else _clamp(reset, max_delay),
        interval=_interval(left, reset, max_delay),
        limit=limit,
        window=window,
        source=source,
        budget=budget,
    )


def _legacy_quota(
    fields: Mapping[str, Sequence[str]],
    dictionary_lines: Sequence[str],
    now: float,
    max_delay: float,
) -> RateLimitInfo | None:
    """The older drafts: ``RateLimit-Limit/-Remaining/-Reset`` and the dictionary form."""
    remaining = [
        number for value in fields.get(_LEGACY_REMAINING, ()) for number in _numbers(value)
    ]
    resets = [
        delay for value in fields.get(_LEGACY_RESET, ()) for delay in _reset_delays(value, now)
    ]
    limits = [_limit_and_window(value) for value in fields.get(_LEGACY_LIMIT, ())]
    used = [number for value in fields.get(_LEGACY_OBSERVED, ()) for number in _numbers(value)]
    policies = [
        policy for value in fields.get(_RATELIMIT_POLICY, ()) for policy in _number_policies(value)
    ]
    for line in dictionary_lines:
        for member in _members(line):
            key, separator, value = member.partition("=")
            if not separator:
                continue
            key = key.strip(_OWS).lower()
            if key == "limit":
                limits.append(_limit_and_window(value))
                continue
            number, _ = _number_and_window(value)
            if number is None:
                continue
            if key == "remaining":
                remaining.append(number)
            elif key == "reset":
                resets.append(number)
    quota = _quota("ietf-legacy", remaining, resets, limits, used, max_delay)
    return _with_policy_window(quota, policies)


def _number_policies(text: str) -> list[tuple[float, float]]:
    """The quota policies of a draft-6/7 ``RateLimit-Policy``: ``120;w=60, 1000;w=3600``."""
    policies = []
    for member in _members(text):
        quota, window = _number_and_window(member)
        if quota is not None and quota > 0 and window is not None:
            policies.append((quota, window))
    return policies


def _with_policy_window(
    quota: RateLimitInfo | None, policies: Sequence[tuple[float, float]]
) -> RateLimitInfo | None:
    """Complete a legacy quota with its ``RateLimit-Policy``.

    The window is that of the policy whose quota is the limit; without a
    limit, the policy with the smallest quota per second gives both.
    """
    if not policies:
        return quota
    if quota is None or quota.limit is None:
        limit, window = min(policies, key=lambda policy: policy[0] / policy[1])
        if quota is None:
            return RateLimitInfo(limit=limit, window=window, source="ietf-legacy")
        return attrs.evolve(quota, limit=limit, window=window)
    if quota.window is None:
        for limit, window in policies:
            if limit == quota.limit:
                return attrs.evolve(quota, window=window)
    return quota


def _x_ratelimit_quota(
    fields: Mapping[str, Sequence[str]], now: float, max_delay: float
) -> RateLimitInfo | None:
    """The de facto ``X-RateLimit-*`` and ``X-Rate-Limit-*`` fields."""
    remaining = [
        number
        for name in _X_REMAINING
        for value in fields.get(name, ())
        for number in _numbers(value)
    ]
    resets = [
        delay
        for name in _X_RESET
        for value in fields.get(name, ())
        for delay in _reset_delays(value, now)
    ]
    resets.extend(number for value in fields.get(_X_RESET_AFTER, ()) for number in _numbers(value))
    limits = [_limit_and_window(value) for name in _X_LIMIT for value in fields.get(name, ())]
    used = [number for value in fields.get(_X_USED, ()) for number in _numbers(value)]
    quota = _quota("x-ratelimit", remaining, resets, limits, used, max_delay)
    # (Only X-RateLimit-Reset may be an epoch; -Reset-After is always a delay.)
    steps = [
        _number_step(member)
        for name in _X_RESET
        for value in fields.get(name, ())
        for member in _members(value)
    ]
    known = [step for step in steps if step is not None]
    if quota is None or quota.reset is None or not known:
        return quota
    return attrs.evolve(quota, reset_step=max(known))


def _number_step(text: str) -> float | None:
    """The resolution of an epoch time: ``1.0`` for ``1700000000``, ``0.01`` for ``…000.25``.

    An integer above 1e12 is epoch milliseconds (``0.001``). A delay in
    seconds, or text that is not a plain number (a date), gives ``None``:
    only an epoch is rounded against the wall clock, so that how late it is
    changes with the moment it was stated.
    """
    number_text = text.partition(";")[0].strip(_OWS)
    number = _number(number_text)
    if number is None or number <= 1e9:
        return None
    _, point, decimals = number_text.partition(".")
    if point:
        return 10.0 ** -len(decimals) if decimals else 1.0
    return 0.001 if number > 1e12 else 1.0


def _budget_family(
    source: str,
    names: Mapping[str, tuple[str, str, str]],
    fields: Mapping[str, Sequence[str]],
    reset_delay: Callable[[str, float], float | None],
    now: float,
    max_delay: float,
    windows: Mapping[str, float] | None = None,
) -> RateLimitInfo | None:
    """A family that reports named budgets in ``{limit, remaining, reset}`` fields each.

    ``windows`` gives the window of each budget (Groq's), which the fields
    do not state.
    """
    budgets = []
    for budget, (limit_name, remaining_name, reset_name) in names.items():
        limit_values = fields.get(limit_name, ())
        remaining_values = fields.get(remaining_name, ())
        if _unreported(limit_values, remaining_values):
            continue
        remaining = [number for value in remaining_values for number in _numbers(value)]
        resets = [
            delay
            for value in fields.get(reset_name, ())
            for delay in (reset_delay(value, now),)
            if delay is not None
        ]
        if resets and max(resets) == 0 and remaining and min(remaining) == 0:
            remaining = []  # "none left, reset now" (Azure): nothing is known to be spent
        window = None if windows is None else windows.get(budget)
        limits = [
            None if limit is None else (limit[0], window or limit[1])
            for limit in map(_limit_and_window, limit_values)
        ]
        quota = _quota(source, remaining, resets, limits, (), max_delay, budget)
        if quota is not None:
            if window is not None and quota.window is None:
                quota = attrs.evolve(quota, window=window)
            budgets.append(quota)
    return _with_budgets(budgets, None) if budgets else None


def _unreported(limits: Sequence[str], remaining: Sequence[str]) -> bool:
    """Whether a budget's fields say it is not reported: Azure OpenAI's ``-1``, or a limit of 0."""
    if any(_NEGATIVE.fullmatch(value.strip(_OWS)) for value in (*limits, *remaining)):
        return True
    return any(_number(value) == 0 for value in limits)


def _choose_quota(quotas: Iterable[RateLimitInfo | None]) -> RateLimitInfo | None:
    """The first family reporting remaining or reset, else the first with a limit."""
    present = [quota for quota in quotas if quota is not None]
    for quota in present:
        if quota.remaining is not None or quota.reset is not None:
            return quota
    for quota in present:
        if quota.limit is not None:
            return quota
    return None
