"""Validation helpers shared by the configuration classes (attrs validators name the field)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs


def check_number(name: str, value: object, *, minimum: float, strict: bool = False) -> float:
    """``value`` as a finite float of at least ``minimum`` (above it if ``strict``).

    Raises TypeError/ValueError naming ``name`` and the allowed range otherwise
    (non-finite numbers and ints too large for a float included).
    """
    bound = "" if minimum == -math.inf else f" > {minimum:g}" if strict else f" >= {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number{bound}, got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return number


def non_negative(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_number(attribute.name, value, minimum=0.0)


def positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_number(attribute.name, value, minimum=0.0, strict=True)


def optional_non_negative(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_number(attribute.name, value, minimum=0.0)


def optional_positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        check_number(attribute.name, value, minimum=0.0, strict=True)


def below_one(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A number in [0, 1) (ValueError naming the field otherwise)."""
    _below_one(attribute.name, value, strict=False)


def above_zero_below_one(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A number in (0, 1) (ValueError naming the field otherwise)."""
    _below_one(attribute.name, value, strict=True)


def _below_one(name: str, value: object, *, strict: bool) -> None:
    if check_number(name, value, minimum=0.0, strict=strict) >= 1.0:
        raise ValueError(f"{name} must be in {'(' if strict else '['}0, 1), got {value!r}")


def at_least_one(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An int >= 1 (ValueError naming the field otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def non_negative_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An int >= 0 (ValueError naming the field otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


def http_status(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An HTTP status, an int in 100-599 (ValueError naming the field otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 599:
        raise ValueError(f"{attribute.name} must be an HTTP status (100-599), got {value!r}")


def concurrency_limit(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int >= 1 or None, got {value!r}")
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1 or None (unlimited), got {value!r}")


def normalize_jitter(value: object, *, name: str = "jitter") -> tuple[float, float]:
    """Turn a jitter setting into ``(low, high)`` offsets of the delay factor.

    ``0.5`` means the delay is multiplied by a factor drawn uniformly from
    ``[0.5, 1.5]``; a pair ``(-0.1, 0.3)`` means ``[0.9, 1.3]``; ``True`` means
    ``0.5`` and ``False``/``None`` mean no jitter (Scrapy's
    ``RANDOMIZE_DOWNLOAD_DELAY`` convention).
    """
    if value is None or value is False:
        return (0.0, 0.0)
    if value is True:
        return (-0.5, 0.5)
    if isinstance(value, (int, float)):
        factor = check_number(name, value, minimum=0.0)
        if factor >= 1.0:
            raise ValueError(f"{name} must be in [0, 1) (a fraction of the delay), got {value!r}")
        return (-factor, factor)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        low, high = value
        if isinstance(low, bool) or isinstance(high, bool):
            raise TypeError(f"{name} pair must hold numbers, got {value!r}")
        low = check_number(name, low, minimum=-math.inf) if low is not None else 0.0
        high = check_number(name, high, minimum=-math.inf) if high is not None else 0.0
        if not -1.0 < low <= high:
            raise ValueError(f"{name} pair (low, high) needs -1 < low <= high, got {value!r}")
        return (low, high)
    raise TypeError(f"{name} must be a number, a (low, high) pair, True or False, got {value!r}")
