"""Simulated requests and responses, and traffic patterns made of them."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import attrs

from .._checks import (
    check_number,
    non_negative,
    optional_non_negative,
    optional_positive,
)
from ..scopes import ScopesLike

__all__ = ["SimRequest", "SimResponse", "burst", "poisson", "steady"]


def fraction(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    number = check_number(attribute.name, value, minimum=0.0)
    if number > 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1], got {value!r}")


def _int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, got {value!r}")


@attrs.frozen(kw_only=True)
class SimRequest:
    """One request of a simulated workload.

    It is request-like (it has ``.url`` and ``.meta``), so the limiter's
    resolver sees it exactly as it would see a real request.

    :param at: arrival time in virtual seconds (the simulation starts at 0.0):
        when the caller asks the limiter for a permit.
    :param url: the URL; the limiter's resolver maps it to scopes (by host by default).
    :param scopes: explicit scopes (a name, names, or ``{scope: cost}``) that
        replace the resolver's answer, as ``acquire(scopes=...)`` does.
        ``None`` = use the resolver.
    :param priority: higher is granted first among requests waiting on a scope.
    :param timeout: seconds the caller waits for a grant at most (then the
        request ends as ``"timeout"``); ``None`` waits as long as needed.
    :param cancel_after: the caller gives up this many seconds after arrival,
        whether the request is still waiting or already in flight (it ends as
        ``"cancelled"``); ``None`` = never.
    :param meta: request metadata the resolver and the limiter may read
        (``throttling_scopes``, ``autothrottle_dont_adjust_delay``).

    Usage::

        SimRequest(at=0.5, url="https://api.test/items", scopes={"api.test": 1, "key:k1": 5})
    """

    at: float = attrs.field(default=0.0, validator=non_negative)
    url: str = attrs.field(
        default="https://site.test/", validator=attrs.validators.instance_of(str)
    )
    scopes: ScopesLike | None = None
    priority: int = attrs.field(default=0, validator=_int)
    timeout: float | None = attrs.field(default=None, validator=optional_non_negative)
    cancel_after: float | None = attrs.field(default=None, validator=optional_positive)
    meta: Mapping[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.frozen(kw_only=True)
class SimResponse:
    """What a simulated server answers to one request.

    :param status: the HTTP status, or ``None`` when the request failed
        without a response (then ``exception`` says why).
    :param latency: virtual seconds from the send to the response headers (or
        to the failure).
    :param headers: the response headers.
    :param size: the body size in bytes.
    :param exception: the failure (e.g. :class:`TimeoutError`,
        :class:`ConnectionResetError`), or ``None``.
    :param blocked: ground truth only the simulation knows: this 200 is a
        soft-block page (a CAPTCHA, an empty result), not real content.
    """

    status: int | None = 200
    latency: float = attrs.field(default=0.0, validator=non_negative)
    headers: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    size: int = 0
    exception: BaseException | None = attrs.field(default=None, eq=False)
    blocked: bool = False


def _expand(url: str, index: int) -> str:
    return url.replace("{i}", str(index))


def burst(url: str, count: int, *, at: float = 0.0, **fields: Any) -> list[SimRequest]:
    """``count`` requests that all arrive at time ``at`` (a crawler's start queue).

    ``{i}`` in ``url`` is replaced by the request's index (0, 1, ...). Other
    keyword arguments are :class:`SimRequest` fields (``priority``,
    ``scopes``, ``timeout``, ``cancel_after``, ``meta``).

    Usage::

        burst("https://shop.test/item/{i}", 100)
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    return [SimRequest(at=at, url=_expand(url, i), **fields) for i in range(count)]


def steady(
    url: str,
    *,
    rate: float,
    count: int | None = None,
    duration: float | None = None,
    start: float = 0.0,
    **fields: Any,
) -> list[SimRequest]:
    """Requests arriving evenly, ``rate`` per second from ``start``.

    Give ``count`` (how many) or ``duration`` (arrivals in ``[start, start +
    duration)``), or both (whichever ends first). ``{i}`` in ``url`` is
    replaced by the index; other keyword arguments are :class:`SimRequest` fields.
    """
    rate = check_number("rate", rate, minimum=0.0, strict=True)
    if count is None and duration is None:
        raise ValueError("steady() needs count= or duration=")
    requests: list[SimRequest] = []
    index = 0
    while count is None or index < count:
        at = start + index / rate
        if duration is not None and at >= start + duration:
            break
        requests.append(SimRequest(at=at, url=_expand(url, index), **fields))
        index += 1
    return requests


def poisson(
    url: str,
    *,
    rate: float,
    duration: float,
    start: float = 0.0,
    seed: int | str = 0,
    **fields: Any,
) -> list[SimRequest]:
    """Requests arriving at random (a Poisson process), ``rate`` per second on average.

    Arrivals fall in ``[start, start + duration)``; the same ``seed`` gives
    the same arrivals. ``{i}`` in ``url`` is replaced by the index; other
    keyword arguments are :class:`SimRequest` fields.
    """
    rate = check_number("rate", rate, minimum=0.0, strict=True)
    duration = check_number("duration", duration, minimum=0.0)
    rng = random.Random(seed)
    requests: list[SimRequest] = []
    at = start
    while True:
        at += rng.expovariate(rate)
        if at >= start + duration:
            return requests
        requests.append(SimRequest(at=at, url=_expand(url, len(requests)), **fields))
