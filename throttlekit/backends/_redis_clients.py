"""The client libraries the Redis backend runs on: redis-py, and Valkey's fork of it.

``valkey`` (valkey-py) has redis-py's API under other names (``Valkey``,
``ValkeyCluster``) and raises exceptions of its own classes
(``valkey.exceptions.MovedError`` is not ``redis.exceptions.MovedError``).
:class:`Library` is one of them, loaded the first time a client of it is
given (a library that is not installed is never imported); :data:`ERRORS`
holds the error classes the backend recognises, of every library loaded so
far, as tuples for ``except`` clauses (read when an exception is matched, so
a library loaded later counts at once).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
from typing import Any, Final

__all__ = [
    "ERRORS",
    "LIBRARIES",
    "Errors",
    "Library",
    "installed",
    "library",
    "library_for_url",
    "library_of",
]

#: The client libraries, by the name of their top-level package.
LIBRARIES: Final = ("redis", "valkey")

#: URL schemes that name Valkey (valkey-py also takes ``redis://`` URLs).
_VALKEY_SCHEMES: Final = ("valkey", "valkeys")

#: Exception classes of the client libraries (their attributes vary: typed loosely).
ErrorClasses = tuple[type[Any], ...]


def _wants_command_name(get_connection: Any) -> bool:
    parameter = inspect.signature(get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


class Library:
    """One client library (``redis`` or ``valkey``): its modules and classes the backend uses.

    :param name: the top-level package, ``"redis"`` or ``"valkey"``.
    :raises ImportError: when it is not installed (with the extra to install).
    """

    __slots__ = (
        "_retry",
        "client_class",
        "cluster_class",
        "cluster_errors",
        "exceptions",
        "name",
        "named_connections",
        "pool_class",
        "unclustered",
    )

    def __init__(self, name: str) -> None:
        if name not in LIBRARIES:
            raise ValueError(f"client_library must be one of {LIBRARIES}, got {name!r}")
        try:
            client = importlib.import_module(f"{name}.asyncio")
            cluster = importlib.import_module(f"{name}.asyncio.cluster")
            retry = importlib.import_module(f"{name}.asyncio.retry")
            backoff = importlib.import_module(f"{name}.backoff")
            self.exceptions: Any = importlib.import_module(f"{name}.exceptions")
        except ImportError as exc:
            raise ImportError(
                f"RedisBackend with {name} clients needs {name}: "
                f'pip install "throttlekit-http[{name}]"'
            ) from exc
        title = name.capitalize()  # (Redis, RedisCluster; Valkey, ValkeyCluster)
        self.name = name
        self.client_class: Any = getattr(client, title)
        self.cluster_class: Any = getattr(cluster, f"{title}Cluster")
        self.pool_class: Any = client.ConnectionPool
        #: The error raised when no cluster node answers (``RedisClusterException``).
        self.unclustered: type[BaseException] = getattr(self.exceptions, f"{title}ClusterException")
        self._retry: Any = (retry.Retry, backoff.NoBackoff)
        #: Whether the pool's ``get_connection`` wants a command name (redis-py
        #: before 5.3, valkey-py 6; later redis-py warns when given one).
        self.named_connections = _wants_command_name(self.pool_class.get_connection)
        errors = self.exceptions
        #: Cluster error replies by their first word (for a parser that gives a
        #: plain ``ResponseError``: redis-py before 5.1 off a cluster client).
        self.cluster_errors: dict[str, type[Exception]] = {
            "MOVED": errors.MovedError,
            "ASK": errors.AskError,
            "TRYAGAIN": errors.TryAgainError,
            "CLUSTERDOWN": errors.ClusterDownError,
            "MASTERDOWN": errors.MasterDownError,
        }

    def __repr__(self) -> str:
        return f"<Library {self.name}>"

    def no_retry(self) -> Any:
        """A ``retry=`` that retries nothing (the backend bounds each round trip itself)."""
        retry, no_backoff = self._retry
        return retry(no_backoff(), 0)

    def cluster_error(self, exc: Exception) -> Exception:
        """``exc`` (a plain ``ResponseError``) as the class of the cluster error it is, if one."""
        message = str(exc)
        word, _, rest = message.partition(" ")
        kind = self.cluster_errors.get(word)
        if kind is None:
            return exc
        # (MOVED and ASK parse "slot host:port"; the others keep the whole message.)
        return kind(rest if word in ("MOVED", "ASK") else message)


class Errors:
    """The error classes the backend recognises, of every client library loaded so far.

    Each attribute is a tuple for an ``except`` clause; :meth:`adopt` adds a
    library's classes (once).
    """

    __slots__ = (
        "ask",
        "connection",
        "moved",
        "no_script",
        "reconnect",
        "response",
        "try_again",
        "unavailable",
        "unclustered",
    )

    def __init__(self) -> None:
        self.moved: ErrorClasses = ()
        self.ask: ErrorClasses = ()  # (MOVED's class is a subclass: match it first)
        self.try_again: ErrorClasses = ()
        self.no_script: ErrorClasses = ()
        #: Any error reply (the connection is still in step after it).
        self.response: ErrorClasses = ()
        #: The connection broke.
        self.connection: ErrorClasses = ()
        #: A new connection may succeed: broken, or ``READONLY`` (a primary
        #: that became a replica; Sentinel's pool finds the new primary).
        self.reconnect: ErrorClasses = ()
        self.unclustered: ErrorClasses = ()
        #: Redis cannot be reached, or cannot take writes, now: ``TimeoutError``,
        #: an ``OSError``, ``asyncio.TimeoutError`` (a round trip over its bound),
        #: and the libraries' connection, timeout, ``READONLY`` and cluster errors
        #: (``CLUSTERDOWN``, ``MASTERDOWN``: a cluster failing over).
        self.unavailable: ErrorClasses = (OSError, TimeoutError, asyncio.TimeoutError)

    def __repr__(self) -> str:
        return f"<Errors of {len(self.moved)} client libraries>"

    def adopt(self, library: Library) -> None:
        """Recognise ``library``'s error classes too."""
        errors = library.exceptions
        if errors.MovedError in self.moved:
            return
        self.moved += (errors.MovedError,)
        self.ask += (errors.AskError,)
        self.try_again += (errors.TryAgainError,)
        self.no_script += (errors.NoScriptError,)
        self.response += (errors.ResponseError,)
        self.connection += (errors.ConnectionError,)
        self.reconnect += (errors.ConnectionError, errors.ReadOnlyError)
        self.unclustered += (library.unclustered,)
        self.unavailable += (
            errors.ConnectionError,
            errors.TimeoutError,
            errors.ReadOnlyError,
            errors.ClusterError,
        )


#: The error classes of the client libraries loaded (see :class:`Errors`).
ERRORS: Final = Errors()

_LOADED: dict[str, Library] = {}


def library(name: str) -> Library:
    """The client library ``name`` (``"redis"`` or ``"valkey"``), loaded once.

    :raises ImportError: when it is not installed.
    """
    found = _LOADED.get(name)
    if found is None:
        found = _LOADED[name] = Library(name)
        ERRORS.adopt(found)
    return found


def library_of(client: Any) -> Library:
    """The library of ``client`` (a client, pool, connection or exception, or its class).

    Found by the package its class (or the first of its bases) comes from;
    redis-py for a class of neither.
    """
    kind = client if isinstance(client, type) else type(client)
    for base in kind.__mro__:
        root = base.__module__.partition(".")[0]
        if root in LIBRARIES:
            return library(root)
    return library("redis")


def installed(name: str) -> bool:
    """Whether the client library ``name`` is installed (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # (an import hook that refuses it)
        return False


def library_for_url(url: str, name: str | None) -> Library:
    """The library a client of ``url`` is made with (see ``RedisBackend.from_url``).

    ``name`` given: that one. Else ``valkey://`` and ``valkeys://`` URLs take
    valkey-py; the others redis-py, or valkey-py when only it is installed.
    """
    if name is None:
        scheme = url.partition("://")[0].lower() if isinstance(url, str) else ""
        if scheme in _VALKEY_SCHEMES or (not installed("redis") and installed("valkey")):
            name = "valkey"
        else:
            name = "redis"
    return library(name)
