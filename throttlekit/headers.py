"""Read the rate-limit hints a server puts in its response headers.

:func:`parse` turns the headers of one HTTP response into a frozen
:class:`RateLimitInfo` with every delay in seconds from *now*. It is pure and
synchronous (sans-IO): it never reads a clock, the caller passes the current
wall-clock time as ``now`` (epoch seconds, what :func:`time.time` returns).

Header families
===============

``Retry-After`` (RFC 9110, section 10.2.3)
    Either delay-seconds (``120``; a decimal such as ``1.5`` is accepted too) or
    an HTTP-date in any of its three forms: IMF-fixdate
    (``Sun, 06 Nov 1994 08:49:37 GMT``), the obsolete RFC 850 form
    (``Sunday, 06-Nov-94 08:49:37 GMT``) and asctime
    (``Sun Nov  6 08:49:37 1994``). A date becomes a delay relative to the
    response's own ``Date`` header when that is present and valid (which cancels
    any clock skew between server and client), else relative to ``now``. A date
    in the past means "no wait" (``0.0``). The result is
    :attr:`RateLimitInfo.retry_after`.

IETF structured fields (``source="ietf"``)
    draft-ietf-httpapi-ratelimit-headers-10 defines two Structured Fields
    (RFC 9651) Lists. ``RateLimit-Policy: "default";q=100;w=60`` describes
    quota policies: the item is the policy name (a String or Token), ``q`` is
    the quota, ``w`` the window in seconds, ``qu`` the quota unit, ``pk`` a
    partition key (a Byte Sequence). ``RateLimit: "default";r=50;t=30`` gives
    the live state per policy: ``r`` units remaining, ``t`` seconds until the
    quota resets, ``pk``. When several policies are reported, the most
    restrictive one wins (smallest ``r``; ties go to the largest ``t``), and its
    quota and window come from the ``RateLimit-Policy`` item with the same name.
    Without a ``RateLimit`` field, the policy with the smallest quota per
    second is reported (limit and window only).

Older IETF drafts (``source="ietf-legacy"``)
    Separate ``RateLimit-Limit``, ``RateLimit-Remaining`` and
    ``RateLimit-Reset`` fields (reset in delta seconds; the limit may carry
    quota policies, as in ``100, 100;w=60``: the first number is the limit and
    the ``w`` of a matching policy is the window), and the combined dictionary
    form ``RateLimit: limit=100, remaining=50, reset=30``, recognised when a
    ``RateLimit`` value is not a valid draft-10 List.

De facto ``X-RateLimit-*`` (``source="x-ratelimit"``)
    ``X-RateLimit-Limit``, ``X-RateLimit-Remaining``, ``X-RateLimit-Reset``, the
    same with ``X-Rate-Limit-`` prefixes, and ``X-RateLimit-Reset-After``
    (delta seconds). A reset above ``1e12`` is an epoch time in milliseconds,
    above ``1e9`` an epoch time in seconds (both converted to a delay relative
    to ``now``; past times mean ``0.0``), anything else is delta seconds. An
    HTTP-date reset is converted relative to ``now`` as well.

Precedence and duplicates
=========================

``remaining``, ``reset``, ``limit`` and ``window`` all come from one family,
so that they describe the same window: the first of IETF structured,
ietf-legacy, x-ratelimit that reports ``remaining`` or ``reset``, or failing
that the first that reports a ``limit``. :attr:`RateLimitInfo.source` names
it. ``Retry-After`` is independent of the families and wins over them in
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
  ignored;
* every delay (:attr:`~RateLimitInfo.retry_after`, :attr:`~RateLimitInfo.reset`,
  and so what :meth:`~RateLimitInfo.wait` and :meth:`~RateLimitInfo.pace`
  return) is clamped to ``[0, max_delay]``;
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
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final, TypeAlias

import attrs
import http_sf

__all__ = ["EMPTY", "RateLimitInfo", "parse", "parse_retry_after"]

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

_SOURCES: Final = frozenset({"ietf", "ietf-legacy", "x-ratelimit"})

_RETRY_AFTER: Final = "retry-after"
_DATE: Final = "date"
_RATELIMIT: Final = "ratelimit"
_RATELIMIT_POLICY: Final = "ratelimit-policy"
_LEGACY_LIMIT: Final = "ratelimit-limit"
_LEGACY_REMAINING: Final = "ratelimit-remaining"
_LEGACY_RESET: Final = "ratelimit-reset"
_X_LIMIT: Final = ("x-ratelimit-limit", "x-rate-limit-limit")
_X_REMAINING: Final = ("x-ratelimit-remaining", "x-rate-limit-remaining")
_X_RESET: Final = ("x-ratelimit-reset", "x-rate-limit-reset")
_X_RESET_AFTER: Final = "x-ratelimit-reset-after"

_FIELD_NAMES: Final = frozenset(
    {
        _RETRY_AFTER,
        _DATE,
        _RATELIMIT,
        _RATELIMIT_POLICY,
        _LEGACY_LIMIT,
        _LEGACY_REMAINING,
        _LEGACY_RESET,
        *_X_LIMIT,
        *_X_REMAINING,
        *_X_RESET,
        _X_RESET_AFTER,
    }
)
_MAX_NAME_LENGTH: Final = max(len(name) for name in _FIELD_NAMES)
_OWS: Final = " \t"

_NUMBER: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH = "(" + "|".join(_MONTHS) + ")"
_DAY_NAME = "(?:mon|tue|wed|thu|fri|sat|sun)"
_LONG_DAY_NAME = "(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_TIME = "([0-9]{2}):([0-9]{2}):([0-9]{2})"
_DATE_FLAGS = re.IGNORECASE | re.ASCII
#: IMF-fixdate: ``Sun, 06 Nov 1994 08:49:37 GMT`` (groups: day, month, year, time).
_IMF_FIXDATE = re.compile(
    rf"{_DAY_NAME}, ([0-9]{{2}}) {_MONTH} ([0-9]{{4}}) {_TIME} (?:GMT|UTC)", _DATE_FLAGS
)
#: Obsolete RFC 850: ``Sunday, 06-Nov-94 08:49:37 GMT`` (groups: day, month, yy, time).
_RFC850_DATE = re.compile(
    rf"{_LONG_DAY_NAME}, ([0-9]{{2}})-{_MONTH}-([0-9]{{2}}) {_TIME} GMT", _DATE_FLAGS
)
#: asctime: ``Sun Nov  6 08:49:37 1994`` (groups: month, day, time, year).
_ASCTIME_DATE = re.compile(
    rf"{_DAY_NAME} {_MONTH} ( [0-9]|[0-9]{{2}}) {_TIME} ([0-9]{{4}})", _DATE_FLAGS
)

#: One member of a Structured Field List: quoted strings may hold commas.
_STRUCTURED_MEMBER = re.compile(r'(?:"(?:[^"\\]|\\.)*"|[^",])*', re.DOTALL)

_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


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


@attrs.frozen(kw_only=True)
class RateLimitInfo:
    """What one response's headers say about the client's rate limit.

    Every attribute is ``None`` when the server did not say (or said something
    that could not be understood). Delays are seconds from the moment passed as
    ``now`` to :func:`parse`, already clamped to ``[0, max_delay]``.

    :ivar retry_after: seconds to wait before the next request, from
        ``Retry-After``.
    :ivar reset: seconds until the current quota window resets.
    :ivar remaining: requests (or quota units) left in the current window,
        ``>= 0``.
    :ivar limit: the quota of the window, ``> 0``.
    :ivar window: the window length in seconds, when the server states it.
    :ivar policy: the name of the IETF quota policy that was reported.
    :ivar partition_key: the IETF partition key (``pk``) as text (the bytes of
        the Byte Sequence decoded as latin-1).
    :ivar source: the header family that produced ``remaining``, ``reset``,
        ``limit`` and ``window``: ``"ietf"``, ``"ietf-legacy"``,
        ``"x-ratelimit"``, or ``None`` when no family applied.

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

        This is ``reset / remaining``, but never more than :attr:`reset` (with
        less than one unit left, waiting for the reset is enough).

        :returns: seconds between requests, or ``None`` unless :attr:`remaining`
            is ``> 0`` and :attr:`reset` is known.
        """
        if self.remaining is None or self.reset is None or self.remaining <= 0:
            return None
        return min(self.reset, self.reset / self.remaining)


#: The result for a response without any rate-limit header: every attribute is ``None``.
EMPTY: Final = RateLimitInfo()


@attrs.frozen
class _Quota:
    """The quota state reported by one header family."""

    source: str
    remaining: float | None = None
    reset: float | None = None
    limit: float | None = None
    window: float | None = None
    policy: str | None = None
    partition_key: str | None = None


@attrs.frozen
class _PolicyItem:
    """One member of a draft-10 ``RateLimit`` or ``RateLimit-Policy`` List."""

    name: str
    params: Mapping[str, object]


def parse(headers: _Headers, *, now: float, max_delay: float = 300.0) -> RateLimitInfo:
    """Parse the rate-limit headers of one response.

    Header names are matched case-insensitively in any container, and values
    that are bytes are decoded as latin-1. See the module documentation for
    the formats, their precedence and the bounds applied to hostile input.
    Never raises because of a header's value.

    :param headers: the response headers: a mapping (``dict``,
        ``httpx.Headers``, multidict's ``CIMultiDict``/``CIMultiDictProxy``,
        Scrapy's ``Headers``, whose values may be lists of values), an iterable
        of ``(name, value)`` pairs, names and values being ``str`` or
        ``bytes``, or ``None``.
    :param now: the current wall-clock time in epoch seconds (``time.time()``);
        absolute times in the headers are converted relative to it.
    :param max_delay: the longest delay, in seconds, that will be reported;
        longer ones are clamped to it.
    :returns: the normalized information; :data:`EMPTY` when ``headers`` is
        ``None`` or holds no rate-limit header.
    :raises TypeError: if ``headers`` is not one of the accepted containers,
        a name or value is neither ``str`` nor ``bytes``, or ``now`` or
        ``max_delay`` is not a number.
    :raises ValueError: if ``now`` is not finite, or ``max_delay`` is not
        finite and ``> 0``.
    """
    _check_now(now)
    _check_max_delay(max_delay)
    now, max_delay = float(now), float(max_delay)
    fields = _collect(headers)
    if not fields:
        return EMPTY
    date = _earliest_date(fields.get(_DATE, ()), now)
    retry_after = _largest(
        _retry_after_delay(value, now=now, date=date, max_delay=max_delay)
        for value in fields.get(_RETRY_AFTER, ())
    )
    states, dictionary_lines = _structured_items(fields.get(_RATELIMIT, ()))
    policies, _ = _structured_items(fields.get(_RATELIMIT_POLICY, ()))
    quota = _choose_quota(
        (
            _ietf_quota(states, policies, max_delay),
            _legacy_quota(fields, dictionary_lines, max_delay),
            _x_ratelimit_quota(fields, now, max_delay),
        )
    )
    if retry_after is None and quota is None:
        return EMPTY
    if quota is None:
        return RateLimitInfo(retry_after=retry_after)
    return RateLimitInfo(
        retry_after=retry_after,
        reset=quota.reset,
        remaining=quota.remaining,
        limit=quota.limit,
        window=quota.window,
        policy=quota.policy,
        partition_key=quota.partition_key,
        source=quota.source,
    )


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


# Argument checks ------------------------------------------------------------


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
            if key.strip(_OWS).lower() == "w":
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


def _to_epoch(year: int, month: int, day: int, hour: int, minute: int, second: int) -> float | None:
    if hour > 23 or minute > 59 or second > 60:
        return None
    try:
        datetime.date(year, month, day)
    except ValueError:
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def _utc_year(now: float) -> int | None:
    try:
        return (_EPOCH + datetime.timedelta(seconds=now)).year
    except OverflowError:
        return None


def _http_date(text: str, now: float) -> float | None:
    """Parse an HTTP-date in any of its three forms into epoch seconds."""
    text = text.strip(_OWS)
    if len(text) > 40:
        return None
    match = _IMF_FIXDATE.fullmatch(text)
    if match is not None:
        day, month, year, hour, minute, second = match.groups()
        return _to_epoch(int(year), _month(month), int(day), int(hour), int(minute), int(second))
    match = _RFC850_DATE.fullmatch(text)
    if match is not None:
        day, month, two_digit_year, hour, minute, second = match.groups()
        year = _full_year(int(two_digit_year), now)
        return _to_epoch(year, _month(month), int(day), int(hour), int(minute), int(second))
    match = _ASCTIME_DATE.fullmatch(text)
    if match is not None:
        month, day, hour, minute, second, year = match.groups()
        return _to_epoch(int(year), _month(month), int(day), int(hour), int(minute), int(second))
    return None


def _month(name: str) -> int:
    return _MONTHS.index(name.lower()) + 1


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
) -> _Quota | None:
    """The draft-10 quota: the most restrictive ``RateLimit`` item and its policy."""
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

    best: tuple[tuple[float, float], _PolicyItem, float, float | None] | None = None
    for item in states:
        remaining = _structured_number(item.params.get("r"))
        if remaining is None:
            continue
        reset = _structured_number(item.params.get("t"))
        rank = (remaining, math.inf if reset is None else -reset)
        if best is None or rank < best[0]:
            best = (rank, item, remaining, reset)

    if best is None:
        if not policies:
            return None
        timed = [policy for policy in policies.values() if policy.window is not None]
        chosen = min(timed or policies.values(), key=_Policy.rate)
        return _Quota(
            "ietf",
            limit=chosen.quota,
            window=chosen.window,
            policy=chosen.name,
            partition_key=chosen.partition_key,
        )

    _, item, remaining, reset = best
    policy = policies.get(item.name)
    partition_key = _structured_text(item.params.get("pk"))
    if partition_key is None and policy is not None:
        partition_key = policy.partition_key
    return _Quota(
        "ietf",
        remaining=remaining,
        reset=None if reset is None else _clamp(reset, max_delay),
        limit=None if policy is None else policy.quota,
        window=None if policy is None else policy.window,
        policy=item.name,
        partition_key=partition_key,
    )


def _quota_from(
    source: str,
    remaining: Sequence[float],
    resets: Sequence[float],
    limits: Iterable[tuple[float, float | None] | None],
    max_delay: float,
) -> _Quota | None:
    """Combine repeated values the careful way: least remaining, latest reset."""
    limit, window = _smallest_limit(limits)
    if not remaining and not resets and limit is None:
        return None
    return _Quota(
        source,
        remaining=min(remaining) if remaining else None,
        reset=_clamp(max(resets), max_delay) if resets else None,
        limit=limit,
        window=window,
    )


def _legacy_quota(
    fields: Mapping[str, Sequence[str]], dictionary_lines: Sequence[str], max_delay: float
) -> _Quota | None:
    """The older drafts: ``RateLimit-Limit/-Remaining/-Reset`` and the dictionary form."""
    remaining = [
        number for value in fields.get(_LEGACY_REMAINING, ()) for number in _numbers(value)
    ]
    resets = [number for value in fields.get(_LEGACY_RESET, ()) for number in _numbers(value)]
    limits = [_limit_and_window(value) for value in fields.get(_LEGACY_LIMIT, ())]
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
    return _quota_from("ietf-legacy", remaining, resets, limits, max_delay)


def _x_reset(value: str, now: float) -> Iterator[float]:
    """Yield the delays of an ``X-RateLimit-Reset`` value (delta, epoch s or ms, or date)."""
    date = _http_date(value, now)
    if date is not None:
        yield date - now
        return
    for number in _numbers(value):
        if number > 1e12:
            yield number / 1000 - now
        elif number > 1e9:
            yield number - now
        else:
            yield number


def _x_ratelimit_quota(
    fields: Mapping[str, Sequence[str]], now: float, max_delay: float
) -> _Quota | None:
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
        for delay in _x_reset(value, now)
    ]
    resets.extend(number for value in fields.get(_X_RESET_AFTER, ()) for number in _numbers(value))
    limits = [_limit_and_window(value) for name in _X_LIMIT for value in fields.get(name, ())]
    return _quota_from("x-ratelimit", remaining, resets, limits, max_delay)


def _choose_quota(quotas: Iterable[_Quota | None]) -> _Quota | None:
    """The first family reporting remaining or reset, else the first with a limit."""
    present = [quota for quota in quotas if quota is not None]
    for quota in present:
        if quota.remaining is not None or quota.reset is not None:
            return quota
    for quota in present:
        if quota.limit is not None:
            return quota
    return None
