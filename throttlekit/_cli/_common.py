"""What the commands share: errors and exit codes, TOML config files, settings, server specs."""

from __future__ import annotations

import difflib
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from .._limiter import Limiter
from .._settings import DEFAULT_SETTINGS
from ..testing import (
    BucketServer,
    CapacityServer,
    CDNServer,
    FixedServer,
    FlakyServer,
    QuotaServer,
    ServerModel,
    SoftBlockServer,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "SERVER_MODELS",
    "CLIError",
    "build_limiter",
    "describe_policy",
    "describe_server",
    "make_console",
    "parse_assignment",
    "parse_server",
    "read_toml",
    "split_config",
    "stderr",
]

#: Exit codes scripts can rely on.
EXIT_OK = 0
EXIT_FAILED = 1  # some work failed (fetch: some URLs; simulate --check: a rule broken)
EXIT_USAGE = 2  # bad flags, bad config file, missing optional extra

#: Server model names for ``--server``/``--site`` and ``[simulate.server]``.
SERVER_MODELS: dict[str, type[Any]] = {
    "fixed": FixedServer,
    "capacity": CapacityServer,
    "quota": QuotaServer,
    "bucket": BucketServer,
    "cdn": CDNServer,
    "soft-block": SoftBlockServer,
    "flaky": FlakyServer,
}

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


#: The widest the commands' prose lines get: an 80-column terminal shows them
#: unwrapped (tables and charts size themselves to the console).
TEXT_COLUMNS = 80


def print_wrapped(console: Console, text: str, indent: str = "", hang: str = "    ") -> None:
    """Print ``text`` wrapped at word boundaries to the console (80 columns at most),
    its first line indented by ``indent``, the others by ``hang``. A no-break
    space (``"20\xa0s"``) keeps its words on one line and prints as a space."""
    width = max(40, min(console.width, TEXT_COLUMNS))
    for line in textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=hang):
        console.print(line.replace("\xa0", " "), markup=False, highlight=False, soft_wrap=True)


def make_console() -> Console:
    """The console of a command's output: 100 columns when not a terminal (unless $COLUMNS)."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 100
    return console


class CLIError(Exception):
    """A problem to report in one line, then exit with ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML config file; any problem becomes a :class:`CLIError`."""
    try:
        with path.open("rb") as file:
            data: dict[str, Any] = tomllib.load(file)
            return data
    except FileNotFoundError:
        raise CLIError(f"config file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise CLIError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CLIError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def split_config(
    config: Mapping[str, Any],
    section: str,
    where: str,
    table_keys: Sequence[str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a config file into the throttling settings and the ``[section]`` table.

    Top-level keys are settings (the names :meth:`Limiter.from_settings`
    reads); unknown names are an error, with a suggestion. When ``table_keys``
    is given, keys of the ``[section]`` table outside it are an error too.
    """
    settings: dict[str, Any] = {}
    table: dict[str, Any] = {}
    known = sorted(DEFAULT_SETTINGS)
    for key, value in config.items():
        if key == section:
            if not isinstance(value, Mapping):
                raise CLIError(f"{where}: [{section}] must be a table")
            table = dict(value)
            for name in table:
                if table_keys is not None and name not in table_keys:
                    raise CLIError(
                        f"{where}: [{section}] has unknown key {name!r}; "
                        f"known: {', '.join(table_keys)}"
                    )
        elif key in DEFAULT_SETTINGS:
            settings[key] = value
        else:
            raise CLIError(
                f"{where}: unknown setting {key!r}{_suggest(key, known)}; the settings are "
                f"{', '.join(known)}, and the table [{section}]"
            )
    return settings, table


def parse_value(text: str) -> Any:
    """A command-line value: a TOML value (``0.5``, ``true``, ``[1, 2]``) or else a string."""
    try:
        parsed: dict[str, Any] = tomllib.loads(f"value = {text}")
        return parsed["value"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignment(text: str, option: str) -> tuple[str, Any]:
    """``KEY=VALUE`` → ``(KEY, value)``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise CLIError(f"{option} expects KEY=VALUE, got {text!r}")
    return key, parse_value(value.strip())


def build_limiter(settings: Mapping[str, Any], where: str, **kwargs: Any) -> Limiter:
    """:meth:`Limiter.from_settings`, with errors reported as :class:`CLIError`."""
    known = sorted(DEFAULT_SETTINGS)
    for key in settings:
        if key not in DEFAULT_SETTINGS:
            raise CLIError(f"{where}: unknown setting {key!r}{_suggest(key, known)}")
    try:
        return Limiter.from_settings(dict(settings), **kwargs)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"{where}: {exc}") from None


def make_server(name: str, params: Mapping[str, Any], where: str) -> ServerModel:
    """A server model from its name and parameters."""
    factory = SERVER_MODELS.get(name)
    if factory is None:
        known = list(SERVER_MODELS)
        raise CLIError(
            f"{where}: unknown server model {name!r}{_suggest(name, known)}; "
            f"known: {', '.join(known)}"
        )
    fields = [field.name for field in attrs.fields(factory) if field.init]
    for key in params:
        if key not in fields:
            raise CLIError(
                f"{where}: server {name!r} has no parameter {key!r}{_suggest(key, fields)}; "
                f"its parameters: {', '.join(fields)}"
            )
    try:
        model: ServerModel = factory(**params)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"{where}: server {name!r}: {exc}") from None
    return model


def parse_server(spec: str, where: str) -> ServerModel:
    """``NAME`` or ``NAME:key=value,key=value`` → a server model.

    Usage: ``quota:limit=5,window=1,retry_after=2``.
    """
    name, _, rest = spec.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, value = parse_assignment(item, where)
        params[key] = value
    return make_server(name.strip(), params, where)


def describe_policy(limiter: Limiter, scope: str) -> str:
    """The policy ``limiter`` applies to ``scope``, in one line."""
    policy = limiter.policy(scope)
    parts = [
        f"concurrency {policy.concurrency if policy.concurrency is not None else 'unlimited'}",
        f"delay {policy.delay:g} s",
        f"slot delay {policy.slot_delay:g} s",
    ]
    low, high = policy.jitter
    if low or high:
        parts.append(f"jitter x{1 + low:g}..x{1 + high:g}")
    if policy.quota is not None:
        parts.append(f"quota {policy.quota:g}/{policy.window:g} s")
    names = ("backoff", "autothrottle", "rampup", "adaptive")
    controllers = [name for name in names if getattr(policy, name, None) is not None]
    controllers += [getattr(factory, "__name__", repr(factory)) for factory in policy.controllers]
    parts.append("controllers: " + (", ".join(controllers) or "none"))
    return ", ".join(parts)


def describe_server(model: object) -> str:
    """A short description: the model's name and the parameters that differ from the defaults."""
    cls = type(model)
    names = {factory: name for name, factory in SERVER_MODELS.items()}
    if not attrs.has(cls):
        return repr(model)
    changed = []
    for field in attrs.fields(cls):
        value = getattr(model, field.name)
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        if field.init and value != default:
            shown = describe_server(value) if attrs.has(type(value)) else repr(value)
            changed.append(f"{field.name}={shown}")
    return f"{names.get(cls, cls.__name__)}({', '.join(changed)})"


def server_from_table(table: Mapping[str, Any], where: str) -> ServerModel:
    """A server model from a TOML table with a ``model`` key and its parameters."""
    if not isinstance(table, Mapping):
        raise CLIError(f"{where} must be a table with a 'model' key")
    params = dict(table)
    name = params.pop("model", None)
    if not isinstance(name, str):
        raise CLIError(f"{where} needs model = one of {', '.join(SERVER_MODELS)}")
    return make_server(name, params, where)
