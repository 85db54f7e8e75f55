"""Scope policies: the configured limits of one throttling scope."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from ._controller import Controller

__all__ = ["ScopePolicy"]


def _check_number(name: str, value: object, *, minimum: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return number


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_number(attribute.name, value, minimum=0.0)


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_number(attribute.name, value, minimum=0.0, strict=True)


def _optional_positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _check_number(attribute.name, value, minimum=0.0, strict=True)


def _concurrency(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
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
        factor = _check_number(name, value, minimum=0.0)
        if factor >= 1.0:
            raise ValueError(f"{name} must be in [0, 1) (a fraction of the delay), got {value!r}")
        return (-factor, factor)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        low, high = value
        if isinstance(low, bool) or isinstance(high, bool):
            raise TypeError(f"{name} pair must hold numbers, got {value!r}")
        low = _check_number(name, low, minimum=-math.inf) if low is not None else 0.0
        high = _check_number(name, high, minimum=-math.inf) if high is not None else 0.0
        if not -1.0 < low <= high:
            raise ValueError(f"{name} pair (low, high) needs -1 < low <= high, got {value!r}")
        return (low, high)
    raise TypeError(f"{name} must be a number, a (low, high) pair, True or False, got {value!r}")


ControllerFactory = Callable[["ScopePolicy"], "Controller"]


@attrs.frozen(kw_only=True)
class ScopePolicy:
    """The configured limits of one throttling scope.

    A scope is anything throttled independently: a host, a registrable domain,
    an API endpoint, a cost pool. A request is sent only when every scope it
    maps to allows it (see :class:`Limiter`).

    :param concurrency: most requests of this scope in flight at once; ``None``
        means unlimited (only the limiter's global cap applies).
    :param delay: minimum seconds between any two sends in the scope (after
        jitter). ``0`` means no delay.
    :param slot_delay: minimum seconds between two sends in the same
        concurrency slot, measured send to send. Each of the ``concurrency``
        slots sends a request, waits for its response, then may send again
        once ``slot_delay`` has passed since its previous send. ``0`` disables it.
    :param jitter: randomizes each delay between sends: ``0.5`` multiplies it by
        a factor in ``[0.5, 1.5]``, a pair ``(-0.1, 0.3)`` by one in ``[0.9, 1.3]``.
        Stored normalized as a ``(low, high)`` pair. ``0`` means no jitter.
    :param quota: units of cost the scope may consume in any ``window``;
        ``None`` means no quota. Each request declares its cost (default 1.0).
    :param window: length of the quota window in seconds.
    :param controllers: factories called once per scope with this policy to
        make custom :class:`Controller` objects (feedback loops that move the
        effective delay, concurrency or blocked-until of the scope).

    Usage::

        api = ScopePolicy(concurrency=4, delay=0.25, slot_delay=0, quota=500, window=60)
        slower = attrs.evolve(api, delay=1.0)
    """

    concurrency: int | None = attrs.field(default=1, validator=_concurrency)
    delay: float = attrs.field(default=1.0, validator=_non_negative)
    slot_delay: float = attrs.field(default=1.0, validator=_non_negative)
    jitter: tuple[float, float] = attrs.field(default=(0.0, 0.0), converter=normalize_jitter)
    quota: float | None = attrs.field(default=None, validator=_optional_positive)
    window: float = attrs.field(default=60.0, validator=_positive)
    controllers: tuple[ControllerFactory, ...] = attrs.field(
        default=(),
        converter=tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.is_callable()),
    )
