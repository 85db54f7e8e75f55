"""Scrapy-style settings → a configured :class:`Limiter`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._policy import ScopePolicy

__all__ = ["DEFAULT_SETTINGS", "policies_from_settings", "read_bool", "read_float"]

#: The defaults of every setting :meth:`Limiter.from_settings` reads.
DEFAULT_SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    "DOWNLOAD_DELAY": 1.0,
    "DOWNLOAD_DELAY_PER_SLOT": 1.0,
    "RANDOMIZE_DOWNLOAD_DELAY": True,
    "THROTTLING_WINDOW": 60.0,
    "THROTTLING_SCOPES": {},
}

_SCOPE_KEYS = {
    "concurrency": "concurrency",
    "delay": "delay",
    "slot_delay": "slot_delay",
    "delay_per_slot": "slot_delay",
    "jitter": "jitter",
    "quota": "quota",
    "window": "window",
}

#: Extra per-scope keys of ``THROTTLING_SCOPES``, each turning a value into
#: ``ScopePolicy`` fields (filled in by the controllers).
SCOPE_KEY_HANDLERS: dict[str, Callable[[Any, Mapping[str, Any], str], dict[str, Any]]] = {}


def _get(settings: Mapping[str, Any], name: str) -> Any:
    value = settings.get(name)
    return DEFAULT_SETTINGS.get(name) if value is None else value


def read_bool(value: Any, name: str) -> bool:
    """A setting as a bool, accepting Scrapy's string forms ("True", "0", ...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"true", "1", "yes", "on"}:
        return True
    if isinstance(value, str) and value.strip().lower() in {"false", "0", "no", "off", ""}:
        return False
    raise ValueError(f"{name} must be a boolean, got {value!r}")


def read_float(value: Any, name: str) -> float:
    """A setting as a float (numbers or numeric strings)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def read_int(value: Any, name: str) -> int:
    """A setting as an int (ints or integral strings/floats)."""
    number = read_float(value, name)
    if number != int(number):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(number)


def _jitter(value: Any, name: str) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(read_float(item, name) for item in value)
    if isinstance(value, str):
        try:
            return read_bool(value, name)
        except ValueError:
            return read_float(value, name)
    return value


def policies_from_settings(
    settings: Mapping[str, Any],
) -> tuple[ScopePolicy, dict[str, ScopePolicy], int | None]:
    """The default policy, the per-scope policies and the global cap from settings."""
    try:
        default = ScopePolicy(
            concurrency=read_int(
                _get(settings, "CONCURRENT_REQUESTS_PER_DOMAIN"), "CONCURRENT_REQUESTS_PER_DOMAIN"
            ),
            delay=read_float(_get(settings, "DOWNLOAD_DELAY"), "DOWNLOAD_DELAY"),
            slot_delay=read_float(
                _get(settings, "DOWNLOAD_DELAY_PER_SLOT"), "DOWNLOAD_DELAY_PER_SLOT"
            ),
            jitter=_jitter(_get(settings, "RANDOMIZE_DOWNLOAD_DELAY"), "RANDOMIZE_DOWNLOAD_DELAY"),
            window=read_float(_get(settings, "THROTTLING_WINDOW"), "THROTTLING_WINDOW"),
        )
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"invalid throttling settings: {exc}") from None
    for handler_key, handler in SCOPE_KEY_HANDLERS.items():
        default = attrs.evolve(default, **handler(None, settings, handler_key))
    global_cap = _get(settings, "CONCURRENT_REQUESTS")
    concurrency = None if global_cap is None else read_int(global_cap, "CONCURRENT_REQUESTS")
    if concurrency is not None and concurrency <= 0:
        concurrency = None
    scopes_setting = _get(settings, "THROTTLING_SCOPES") or {}
    if not isinstance(scopes_setting, Mapping):
        raise TypeError(
            f"THROTTLING_SCOPES must be a mapping of scope → dict, got {scopes_setting!r}"
        )
    policies: dict[str, ScopePolicy] = {}
    for scope, options in scopes_setting.items():
        where = f"THROTTLING_SCOPES[{scope!r}]"
        if not isinstance(options, Mapping):
            raise TypeError(f"{where} must be a dict of policy keys, got {options!r}")
        changes: dict[str, Any] = {}
        for key, value in options.items():
            if key in SCOPE_KEY_HANDLERS:
                changes.update(SCOPE_KEY_HANDLERS[key](value, settings, f"{where}[{key!r}]"))
                continue
            field = _SCOPE_KEYS.get(key)
            if field is None:
                known = sorted({*_SCOPE_KEYS, *SCOPE_KEY_HANDLERS})
                raise ValueError(f"{where} has unknown key {key!r}; known keys: {', '.join(known)}")
            if field == "jitter":
                value = _jitter(value, f"{where}[{key!r}]")
            elif field == "concurrency" and value is not None:
                value = read_int(value, f"{where}[{key!r}]")
            elif value is not None:
                value = read_float(value, f"{where}[{key!r}]")
            changes[field] = value
        try:
            policies[str(scope)] = attrs.evolve(default, **changes)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
    return default, policies, concurrency
