"""Scrapy-style settings → the configuration of a :class:`Limiter`."""

from __future__ import annotations

import difflib
import importlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ._adaptive import Adaptive
from ._autothrottle import AutoThrottle
from ._backoff import DEFAULT_BACKOFF_EXCEPTIONS, DEFAULT_BACKOFF_HTTP_CODES, Backoff
from ._controller import Controller
from ._policy import ScopePolicy
from ._rampup import Rampup

__all__ = [
    "DEFAULT_SETTINGS",
    "check_setting_names",
    "limiter_options",
    "misspelt_settings",
    "read_bool",
    "read_float",
    "read_int",
]

#: Every setting :meth:`Limiter.from_settings` reads, with its default.
DEFAULT_SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
    "THROTTLING_SCOPE_CONCURRENCY": None,
    "THROTTLING_SCOPE_LIMIT": 100_000,
    "DOWNLOAD_DELAY": 1.0,
    "DOWNLOAD_DELAY_PER_SLOT": 1.0,
    "RANDOMIZE_DOWNLOAD_DELAY": True,
    "THROTTLING_WINDOW": 60.0,
    "THROTTLING_MAX_STALL": None,
    "THROTTLING_SCOPES": {},
    "DOWNLOAD_SLOTS": {},
    "THROTTLING_ROBOTSTXT_MAX_DELAY": 60.0,
    "BACKOFF_HTTP_CODES": sorted(DEFAULT_BACKOFF_HTTP_CODES),
    "BACKOFF_EXCEPTIONS": list(DEFAULT_BACKOFF_EXCEPTIONS),
    "BACKOFF_DELAY_FACTOR": 2.0,
    "BACKOFF_MIN_DELAY": 1.0,
    "BACKOFF_MAX_DELAY": 300.0,
    "BACKOFF_JITTER": 0.1,
    "BACKOFF_WINDOW": 60.0,
    "BACKOFF_CONCURRENCY_FACTOR": 0.5,
    "BACKOFF_ERROR_SHARE": 0.25,
    "RAMPUP_BACKOFF_TARGET": 1,
    "AUTOTHROTTLE_ENABLED": False,
    "AUTOTHROTTLE_START_DELAY": 5.0,
    "AUTOTHROTTLE_MAX_DELAY": 60.0,
    "AUTOTHROTTLE_TARGET_CONCURRENCY": 1.0,
    "AUTOTHROTTLE_DEBUG": False,
    "THROTTLING_ADAPTIVE": False,
}

#: Names throttlekit reads besides :data:`DEFAULT_SETTINGS`: the Scrapy
#: middleware's own settings and Scrapy's jitter setting.
OTHER_SETTINGS = frozenset(
    {
        "DOWNLOAD_DELAY_JITTER",
        "THROTTLING_ENABLED",
        "THROTTLING_LIMITER",
        "THROTTLING_MAX_WAITING",
        "THROTTLING_METRICS_ENABLED",
        "THROTTLING_METRICS_NAME",
        "THROTTLING_METRICS_PER_SCOPE",
        "THROTTLING_METRICS_SCOPE_GROUP",
        "THROTTLING_RESOLVER",
        "THROTTLING_ROBOTSTXT_OBEY",
    }
)
#: Scrapy's own names in those families that no Scrapy version at hand may list
#: (removed from newer ones) and that are no misspelling: not applied, not refused.
FORMER_SCRAPY_SETTINGS = frozenset({"CONCURRENT_REQUESTS_PER_IP"})
#: A setting whose name starts with one of these and that nothing reads is
#: most likely a misspelling of one that something does.
CHECKED_PREFIXES = (
    "CONCURRENT_REQUESTS",
    "DOWNLOAD_DELAY",
    "AUTOTHROTTLE_",
    "BACKOFF_",
    "RAMPUP_",
    "THROTTLING_",
)
#: So is any other name this close to a known one (difflib's ratio): one
#: letter dropped from ``CONCURRENT_REQUESTS`` is 0.97, while Scrapy's
#: ``DOWNLOAD_TIMEOUT`` against ``DOWNLOAD_DELAY`` is 0.73.
MISSPELT_RATIO = 0.85

_POLICY_KEYS = {
    "concurrency": "concurrency",
    "delay": "delay",
    "slot_delay": "slot_delay",
    "delay_per_slot": "slot_delay",
    "jitter": "jitter",
    "quota": "quota",
    "window": "window",
    "max_stall": "max_stall",
    "ignore_robots_txt": "ignore_robots_txt",
}
#: The setting behind each field of the default policy (for error messages).
_POLICY_SETTINGS = {
    "concurrency": "CONCURRENT_REQUESTS_PER_DOMAIN",
    "delay": "DOWNLOAD_DELAY",
    "slot_delay": "DOWNLOAD_DELAY_PER_SLOT",
    "jitter": "RANDOMIZE_DOWNLOAD_DELAY",
    "window": "THROTTLING_WINDOW",
    "max_stall": "THROTTLING_MAX_STALL",
}
_CONTROLLER_KEYS = ("backoff", "rampup", "autothrottle", "adaptive", "manager", "controllers")
_SECONDS = "a finite number of seconds"
#: What each option allows, for the errors of values that are not even numbers.
#: Keys: a setting, a policy key, or ``controller.key``; their validators check
#: the same ranges once the value is a number.
_ALLOWED = {
    "CONCURRENT_REQUESTS": "an int >= 0 (0 = unlimited)",
    "THROTTLING_SCOPE_LIMIT": "an int >= 1",
    "THROTTLING_ROBOTSTXT_MAX_DELAY": f"{_SECONDS} >= 0",
    "concurrency": "an int >= 1",
    "delay": f"{_SECONDS} >= 0",
    "slot_delay": f"{_SECONDS} >= 0",
    "quota": "a finite number > 0",
    "window": f"{_SECONDS} > 0",
    "max_stall": f"{_SECONDS} > 0",
    "jitter": "True, False, a fraction in [0, 1) or a [low, high] pair with -1 < low <= high",
    "target": "an int >= 0 or a [low, high] pair of ints",
    "http_codes": "a list of HTTP status codes (ints from 100 to 999)",
    "backoff.delay_factor": "a finite number > 1",
    "backoff.min_delay": f"{_SECONDS} > 0",
    "backoff.max_delay": f"{_SECONDS} > 0",
    "backoff.concurrency_factor": "a number in (0, 1)",
    "backoff.error_share": "a number in [0, 1)",
    "autothrottle.start_delay": f"{_SECONDS} >= 0",
    "autothrottle.max_delay": f"{_SECONDS} > 0",
    "autothrottle.target_concurrency": "a finite number > 0",
    "rampup.min_delay": f"{_SECONDS} >= 0",
    "rampup.max_concurrency": "an int >= 1",
    "rampup.concurrency_factor": "a finite number > 1",
    "adaptive.start_rate": "a finite number > 0 (requests per second)",
    "adaptive.headroom": "a number in (0, 1)",
    "adaptive.hold": f"{_SECONDS} > 0",
    "adaptive.max_hold": f"{_SECONDS} > 0",
    "adaptive.overload_share": "a number in (0, 1)",
    "adaptive.overload_cut": "a number in (0, 1)",
    "adaptive.max_concurrency": "an int >= 1",
}
_BACKOFF_KEYS = (
    "http_codes",
    "exceptions",
    "delay_factor",
    "min_delay",
    "max_delay",
    "jitter",
    "window",
    "concurrency_factor",
    "error_share",
)
_AUTOTHROTTLE_KEYS = ("start_delay", "max_delay", "target_concurrency", "debug")
_RAMPUP_KEYS = ("target", "window", "min_delay", "max_concurrency", "concurrency_factor")
_ADAPTIVE_KEYS = (
    "start_rate",
    "headroom",
    "hold",
    "max_hold",
    "overload_share",
    "overload_cut",
    "max_concurrency",
)


def misspelt_settings(names: Iterable[Any], known: Iterable[str] = ()) -> dict[str, str]:
    """The names that look like a throttling setting but that nothing reads, each
    with the closest known name.

    A name is suspect when it starts with one of :data:`CHECKED_PREFIXES`
    (``CONCURRENT_REQUESTS*``, ``DOWNLOAD_DELAY*``, ``AUTOTHROTTLE_*``,
    ``BACKOFF_*``, ``RAMPUP_*``, ``THROTTLING_*``) or is within
    :data:`MISSPELT_RATIO` of a name throttlekit reads; ``known`` adds names
    read by someone else (e.g. the crawler framework's own settings).
    """
    ours = sorted({*DEFAULT_SETTINGS, *OTHER_SETTINGS})
    readable = {*ours, *FORMER_SCRAPY_SETTINGS, *known}
    found = {}
    for name in names:
        if not isinstance(name, str) or name in readable:
            continue
        close = difflib.get_close_matches(name, ours, n=1, cutoff=MISSPELT_RATIO)
        if close or name.startswith(CHECKED_PREFIXES):
            found[name] = (close or difflib.get_close_matches(name, ours, n=1, cutoff=0.0))[0]
    return found


def _given_names(settings: Mapping[str, Any]) -> list[Any]:
    """The names ``settings`` were given: with Scrapy's ``Settings``, not the
    framework's own defaults (priority 0), which vary by Scrapy version."""
    priority = getattr(settings, "getpriority", None)
    if not callable(priority):
        return list(settings)
    return [name for name in settings if priority(name)]


def check_setting_names(names: Iterable[Any], known: Iterable[str] = ()) -> None:
    """Raise :class:`ValueError` naming each setting :func:`misspelt_settings` finds.

    A misspelt throttling setting would leave the crawl throttled otherwise
    than its author wrote, so it is an error, as on the command line.
    """
    found = misspelt_settings(names, known)
    if found:
        raise ValueError(
            "; ".join(
                f"unknown setting {name}: did you mean {close}?" for name, close in found.items()
            )
        )


def _get(settings: Mapping[str, Any], name: str) -> Any:
    value = settings.get(name)
    return DEFAULT_SETTINGS.get(name) if value is None else value


def _allowed(key: str, section: str = "") -> str:
    return _ALLOWED.get(f"{section}.{key}") or _ALLOWED.get(key) or "a finite number"


def _renamed(exc: Exception, name: str) -> Exception:
    """``exc`` as a plain ValueError/TypeError whose message starts with ``name``."""
    return (TypeError if isinstance(exc, TypeError) else ValueError)(f"{name}: {exc}")


def read_bool(value: Any, name: str) -> bool:
    """A setting as a bool, accepting Scrapy's string forms ("True", "0", ...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in {"true", "1", "yes", "on"}:
            return True
        if text in {"false", "0", "no", "off", ""}:
            return False
    raise ValueError(f"{name} must be a boolean (True/False, 1/0, yes/no, on/off), got {value!r}")


def read_float(value: Any, name: str, allowed: str = "a finite number") -> float:
    """A setting as a finite float (numbers or numeric strings).

    Not a number, ``nan``, infinities and numbers too large for a float raise
    :class:`TypeError`/:class:`ValueError` saying ``name`` must be ``allowed``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return number


def read_int(value: Any, name: str, allowed: str = "an integer") -> int:
    """A setting as an int (ints, or integral floats and strings); see :func:`read_float`."""
    number = read_float(value, name, allowed)
    if number != int(number):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(number)


def _read_list(value: Any, name: str) -> list[Any]:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"{name} must be a list, got {value!r}")


def _jitter(value: Any, name: str) -> Any:
    if type(value) is int and value in (0, 1):
        return bool(value)  # Scrapy's boolean convention, as for the strings "0" and "1"
    if isinstance(value, (list, tuple)):
        return tuple(read_float(item, name, _allowed("jitter")) for item in value)
    if isinstance(value, str):
        try:
            return read_bool(value, name)
        except ValueError:
            return read_float(value, name, _allowed("jitter"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return read_float(value, name, _allowed("jitter"))
    return value


def _max_stall(value: Any, name: str) -> float | None:
    """A ``max_stall`` setting: seconds, or ``None`` (wait as long as needed)."""
    if value is None:
        return None
    return read_float(value, name, f"{_allowed('max_stall')} or None (no limit)")


def _rampup_target(value: Any, name: str) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(read_int(item, name, _allowed("target")) for item in value)
    return read_int(value, name, _allowed("target"))


def _import(path: Any, name: str) -> Any:
    """A controller factory from an import path (or the callable itself)."""
    if not isinstance(path, str):
        if callable(path):
            return path
        raise TypeError(f"{name} must be an import path or a callable, got {path!r}")
    module, _, attribute = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except Exception as exc:  # whatever importing the module raised
        raise ValueError(
            f"{name} must be the import path of a controller factory; cannot import {path!r} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if not callable(found):
        raise TypeError(f"{name} must name a callable (a controller factory), got {path!r}")
    return found


def _convert(
    options: Mapping[str, Any],
    keys: tuple[str, ...],
    name: str,
    section: str,
    names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Type-convert the options of a nested dict (backoff/rampup/autothrottle).

    ``names`` gives the name of each key in errors (a setting's name);
    otherwise it is ``name[key]``.
    """
    if not isinstance(options, Mapping):
        raise TypeError(f"{name} must be a dict of {section} options, got {options!r}")
    result: dict[str, Any] = {}
    for key, value in options.items():
        if key not in keys:
            raise ValueError(f"{name} has unknown key {key!r}; known keys: {', '.join(keys)}")
        where = names[key] if names else f"{name}[{key!r}]"
        allowed = _allowed(key, section)
        if key == "http_codes":
            value = frozenset(read_int(code, where, allowed) for code in _read_list(value, where))
        elif key == "exceptions":
            value = tuple(_read_list(value, where))
        elif key == "jitter":
            value = _jitter(value, where)
        elif key == "target":
            value = _rampup_target(value, where)
        elif key == "debug":
            value = read_bool(value, where)
        elif key == "max_concurrency":
            value = read_int(value, where, allowed)
        else:
            value = read_float(value, where, allowed)
        result[key] = value
    return result


def _built(factory: Any, options: dict[str, Any], names: Mapping[str, str]) -> Any:
    """``factory(**options)``; an error names the setting of the field it is about."""
    try:
        return factory(**options)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        named = [names[key] for key in names if re.search(rf"\b{key}\b", message)]
        raise _renamed(exc, " / ".join(named or sorted(set(names.values())))) from None


def _default_backoff(settings: Mapping[str, Any]) -> Backoff:
    options = {
        "http_codes": _get(settings, "BACKOFF_HTTP_CODES"),
        "exceptions": _get(settings, "BACKOFF_EXCEPTIONS"),
        "delay_factor": _get(settings, "BACKOFF_DELAY_FACTOR"),
        "min_delay": _get(settings, "BACKOFF_MIN_DELAY"),
        "max_delay": _get(settings, "BACKOFF_MAX_DELAY"),
        "jitter": _get(settings, "BACKOFF_JITTER"),
        "window": _get(settings, "BACKOFF_WINDOW"),
        "concurrency_factor": _get(settings, "BACKOFF_CONCURRENCY_FACTOR"),
        "error_share": _get(settings, "BACKOFF_ERROR_SHARE"),
    }
    names = {key: f"BACKOFF_{key.upper()}" for key in options}
    backoff: Backoff = _built(
        Backoff, _convert(options, _BACKOFF_KEYS, "BACKOFF_*", "backoff", names), names
    )
    return backoff


def _default_autothrottle(settings: Mapping[str, Any]) -> AutoThrottle:
    options = {
        "start_delay": _get(settings, "AUTOTHROTTLE_START_DELAY"),
        "max_delay": _get(settings, "AUTOTHROTTLE_MAX_DELAY"),
        "target_concurrency": _get(settings, "AUTOTHROTTLE_TARGET_CONCURRENCY"),
        "debug": _get(settings, "AUTOTHROTTLE_DEBUG"),
    }
    names = {key: f"AUTOTHROTTLE_{key.upper()}" for key in options}
    converted = _convert(options, _AUTOTHROTTLE_KEYS, "AUTOTHROTTLE_*", "autothrottle", names)
    autothrottle: AutoThrottle = _built(AutoThrottle, converted, names)
    return autothrottle


def _adaptive_setting(value: Any) -> Adaptive | None:
    """``THROTTLING_ADAPTIVE``: off (``False``), ``True``, or a dict of options (or its JSON)."""
    name = "THROTTLING_ADAPTIVE"
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{name} must be a bool or a dict of options, got {value!r}") from None
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return Adaptive() if read_bool(value, name) else None
    changes = _convert(value, _ADAPTIVE_KEYS, name, "adaptive")
    adaptive: Adaptive = _built(Adaptive, changes, {key: f"{name}[{key!r}]" for key in changes})
    return adaptive


def _controller_option(
    key: str,
    value: Any,
    where: str,
    defaults: dict[str, Any],
) -> dict[str, Any]:
    """The ScopePolicy fields for one controller key of a THROTTLING_SCOPES entry."""
    if key in ("manager", "controllers"):
        items = value if isinstance(value, (list, tuple)) else [value]
        return {"controllers": tuple(_import(item, where) for item in items)}
    if value is None or value is False:
        return {key: None}
    base = defaults[key]
    if callable(base):
        base = defaults[key] = base()
    if value is True:
        return {key: base}
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be True, False or a dict, got {value!r}")
    keys = {
        "backoff": _BACKOFF_KEYS,
        "rampup": _RAMPUP_KEYS,
        "autothrottle": _AUTOTHROTTLE_KEYS,
        "adaptive": _ADAPTIVE_KEYS,
    }
    changes = _convert(value, keys[key], where, key)
    try:
        return {key: attrs.evolve(base, **changes)}
    except (TypeError, ValueError) as exc:
        raise _renamed(exc, where) from None


def limiter_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`Limiter` keyword arguments that ``settings`` describe.

    ``settings`` is any mapping (or Scrapy's ``Settings``); missing names take
    the defaults in :data:`DEFAULT_SETTINGS`. Invalid values raise
    :class:`ValueError`/:class:`TypeError` naming the setting, and so does a
    misspelt name (:func:`check_setting_names`). The ``AUTOTHROTTLE_*``
    values are checked only when AutoThrottle is enabled, globally or for
    a scope.
    """
    check_setting_names(_given_names(settings))
    backoff = _default_backoff(settings)
    autothrottle = None
    if read_bool(_get(settings, "AUTOTHROTTLE_ENABLED"), "AUTOTHROTTLE_ENABLED"):
        autothrottle = _default_autothrottle(settings)
    target = _rampup_target(_get(settings, "RAMPUP_BACKOFF_TARGET"), "RAMPUP_BACKOFF_TARGET")
    rampup = _built(Rampup, {"target": target}, {"target": "RAMPUP_BACKOFF_TARGET"})
    adaptive = _adaptive_setting(_get(settings, "THROTTLING_ADAPTIVE"))
    defaults: dict[str, Any] = {
        "backoff": backoff,
        "rampup": rampup,
        "adaptive": adaptive or Adaptive(),
        # Built (and checked) only if a scope enables it.
        "autothrottle": autothrottle or (lambda: _default_autothrottle(settings)),
    }
    default = _default_policy(settings, backoff, autothrottle, adaptive)
    allowed = _allowed("CONCURRENT_REQUESTS")
    cap = read_int(_get(settings, "CONCURRENT_REQUESTS"), "CONCURRENT_REQUESTS", allowed)
    if cap < 0:
        raise ValueError(f"CONCURRENT_REQUESTS must be {allowed}, got {cap!r}")
    return {
        "default": default,
        "scopes": _scope_policies(settings, default, defaults),
        "concurrency": cap if cap > 0 else None,
        "robotstxt_max_delay": _at_least(settings, "THROTTLING_ROBOTSTXT_MAX_DELAY", 0, read_float),
        "max_scopes": _at_least(settings, "THROTTLING_SCOPE_LIMIT", 1, read_int),
    }


def _at_least(
    settings: Mapping[str, Any], name: str, low: float, read: Callable[[Any, str, str], Any]
) -> Any:
    """The number setting ``name`` (read with ``read_int`` or ``read_float``), at least ``low``."""
    allowed = _allowed(name)
    value = read(_get(settings, name), name, allowed)
    if value < low:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


def _default_policy(
    settings: Mapping[str, Any],
    backoff: Backoff,
    autothrottle: AutoThrottle | None,
    adaptive: Adaptive | None,
) -> ScopePolicy:
    """The policy of every scope not named: ``CONCURRENT_REQUESTS_PER_DOMAIN`` (or
    ``THROTTLING_SCOPE_CONCURRENCY``, Scrapy's newer name, which wins when given),
    ``DOWNLOAD_DELAY``, ``DOWNLOAD_DELAY_PER_SLOT`` and the rest, with the
    default controllers; an error names the setting at fault."""
    concurrency_setting = "CONCURRENT_REQUESTS_PER_DOMAIN"
    if settings.get("THROTTLING_SCOPE_CONCURRENCY") is not None:
        concurrency_setting = "THROTTLING_SCOPE_CONCURRENCY"
    try:
        return ScopePolicy(
            concurrency=read_int(
                _get(settings, concurrency_setting), concurrency_setting, _allowed("concurrency")
            ),
            delay=_delay(settings, "DOWNLOAD_DELAY", adaptive),
            slot_delay=_delay(settings, "DOWNLOAD_DELAY_PER_SLOT", adaptive),
            jitter=_jitter(_get(settings, "RANDOMIZE_DOWNLOAD_DELAY"), "RANDOMIZE_DOWNLOAD_DELAY"),
            window=read_float(
                _get(settings, "THROTTLING_WINDOW"), "THROTTLING_WINDOW", _allowed("window")
            ),
            max_stall=_max_stall(_get(settings, "THROTTLING_MAX_STALL"), "THROTTLING_MAX_STALL"),
            backoff=backoff,
            autothrottle=autothrottle,
            adaptive=adaptive,
        )
    except (TypeError, ValueError) as exc:
        field = str(exc).split(" ", 1)[0]
        setting = concurrency_setting if field == "concurrency" else _POLICY_SETTINGS.get(field)
        where = "invalid throttling settings" + (f": {setting}" if setting else "")
        raise _renamed(exc, where) from None


def _delay(settings: Mapping[str, Any], name: str, adaptive: Adaptive | None) -> float:
    """``DOWNLOAD_DELAY`` or ``DOWNLOAD_DELAY_PER_SLOT``: under Adaptive, a delay not
    given is 0, as in :class:`ScopePolicy` (it is Adaptive's ceiling)."""
    if adaptive is not None and settings.get(name) is None:
        return 0.0
    field = "delay" if name == "DOWNLOAD_DELAY" else "slot_delay"
    return read_float(_get(settings, name), name, _allowed(field))


def _mapping_setting(settings: Mapping[str, Any], name: str) -> Mapping[Any, Any]:
    """A dict setting (or its JSON text, as given on a command line: ``-s NAME='{...}'``)."""
    value = settings.get(name)
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{name} must be a dict or its JSON text, got {value!r}") from None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of scope → dict, got {value!r}")
    return value


#: Scrapy's ``DOWNLOAD_SLOTS`` keys, as ``THROTTLING_SCOPES`` keys (``jitter``: the
#: magnitude, since Scrapy 2.19; ``randomize_delay``: the older boolean).
_SLOT_KEYS = {
    "concurrency": "concurrency",
    "delay": "delay",
    "jitter": "jitter",
    "randomize_delay": "jitter",
}


def _scope_entries(settings: Mapping[str, Any]) -> dict[str, list[tuple[str, str, Any]]]:
    """Each scope's ``(name in errors, THROTTLING_SCOPES key, value)`` items: those of
    Scrapy's ``DOWNLOAD_SLOTS`` first, then those of ``THROTTLING_SCOPES``, which win."""
    entries: dict[str, list[tuple[str, str, Any]]] = {}
    for setting in ("DOWNLOAD_SLOTS", "THROTTLING_SCOPES"):
        for scope, options in _mapping_setting(settings, setting).items():
            where = f"{setting}[{scope!r}]"
            if not isinstance(scope, str) or not scope.strip():
                raise ValueError(
                    f"{setting} keys must be scope names (non-empty str), got {scope!r}"
                )
            if not isinstance(options, Mapping):
                raise TypeError(f"{where} must be a dict of policy keys, got {options!r}")
            items = entries.setdefault(scope, [])
            for key, value in options.items():
                if setting == "DOWNLOAD_SLOTS":
                    if key not in _SLOT_KEYS:
                        known = ", ".join(_SLOT_KEYS)
                        raise ValueError(f"{where} has unknown key {key!r}; known keys: {known}")
                    items.append((f"{where}[{key!r}]", _SLOT_KEYS[key], value))
                else:
                    items.append((f"{where}[{key!r}]", key, value))
    return entries


def _scope_policies(
    settings: Mapping[str, Any], default: ScopePolicy, defaults: dict[str, Any]
) -> dict[str, ScopePolicy]:
    """The policy of each scope that ``THROTTLING_SCOPES`` or ``DOWNLOAD_SLOTS`` name."""
    policies: dict[str, ScopePolicy] = {}
    for scope, items in _scope_entries(settings).items():
        changes: dict[str, Any] = {}
        key_of: dict[str, str] = {}  # field → the name of the item that set it, for errors
        for name, key, value in items:
            if key in _CONTROLLER_KEYS:
                changes.update(_controller_option(key, value, name, defaults))
                key_of["controllers"] = name
                continue
            field = _POLICY_KEYS.get(key)
            if field is None:
                known = ", ".join(sorted({*_POLICY_KEYS, *_CONTROLLER_KEYS}))
                where = name.rpartition("[")[0]
                raise ValueError(f"{where} has unknown key {key!r}; known keys: {known}")
            changes[field] = _policy_value(field, value, name)
            key_of[field] = name
        if "adaptive" in changes and changes["adaptive"] != default.adaptive:
            # Delays the settings do not give follow the scope's Adaptive, as the default's.
            for field, setting in (
                ("delay", "DOWNLOAD_DELAY"),
                ("slot_delay", "DOWNLOAD_DELAY_PER_SLOT"),
            ):
                if field not in changes:
                    changes[field] = _delay(settings, setting, changes["adaptive"])
        try:
            policy = policies[scope] = attrs.evolve(default, **changes)
        except (TypeError, ValueError) as exc:
            setter = key_of.get(str(exc).split(" ", 1)[0])
            raise _renamed(exc, setter or f"THROTTLING_SCOPES[{scope!r}]") from None
        if "controllers" in changes:
            _check_controllers(policy, key_of["controllers"])
    return policies


def _policy_value(field: str, value: Any, name: str) -> Any:
    """The value of one policy key of a scope's entry, converted and checked."""
    if field == "jitter":
        return _jitter(value, name)
    if field == "ignore_robots_txt":
        return read_bool(value, name)
    if field in ("concurrency", "quota") and value is None:
        return None  # unlimited, no quota
    if field == "concurrency":
        return read_int(value, name, f"{_allowed(field)} or None (unlimited)")
    if field == "quota":
        return read_float(value, name, f"{_allowed(field)} or None (no quota)")
    if field == "max_stall":
        return _max_stall(value, name)
    return read_float(value, name, _allowed(field))


def _check_controllers(policy: ScopePolicy, name: str) -> None:
    """Make one controller with each factory of ``policy`` now, so that an import
    path of something else (``"builtins.len"``) fails here, not at the first request."""
    for factory in policy.controllers:
        try:
            controller = factory(policy)
        except Exception as exc:  # whatever a wrong callable raises
            raise TypeError(
                f"{name} must name a controller factory (a callable taking the ScopePolicy, "
                f"e.g. a Controller class); calling {factory!r} raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(controller, Controller):
            raise TypeError(
                f"{name} must name a controller factory; {factory!r} made {controller!r}, "
                "not a Controller (see throttlekit.BaseController)"
            )
