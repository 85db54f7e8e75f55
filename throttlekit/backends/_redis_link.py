"""The Redis backend's connection to one server: script calls and their time bounds.

Every round trip of the backend is one ``EVALSHA`` sent here on a
connection kept by the backend (taken from the client's pool once, reused
without the pool's bookkeeping), with its arguments already encoded, its
reply read by redis-py's parser (:class:`Wire` is the one place that
reaches into a connection), and bounded in time by the caller: a Redis
that hangs (stopped, or a network that drops packets) costs a caller at
most the bound it gave, never the socket timeouts of the client.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import anyio

from ._redis_clients import ERRORS, library_for_url, library_of

__all__ = [
    "Deadlines",
    "Link",
    "Script",
    "Settle",
    "Wire",
    "bulk",
    "bulk_of",
    "client_location",
    "connect",
    "describe_failure",
    "pack",
    "read_reply",
    "redact_url",
]

logger = logging.getLogger("throttlekit.backends.redis")

INF: Final = math.inf

T = TypeVar("T")


def describe_failure(exc: BaseException) -> str:
    """Why a round trip failed, in words (never the server's address or credentials)."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "no reply in time"
    return type(exc).__name__


#: Connections kept for reuse; more concurrent calls borrow from the pool.
_KEEP: Final = 16
#: Replies a kept connection may owe (calls sent without waiting) before a
#: call on it waits for them all.
_OWED: Final = 32

#: What receives the reply of a call sent without waiting: the reply, or the
#: exception that stood for it (an error reply, the connection lost, a cancel).
Settle = Callable[[Any], None]


def redact_url(url: str) -> str:
    """``url`` without credentials or query: ``rediss://***@host:6380/0``."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<invalid Redis URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    if parts.username or parts.password or "@" in parts.netloc:
        netloc = f"***@{netloc}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def connect(
    url: str,
    command_timeout: float,
    options: dict[str, Any],
    cluster: bool | None = None,
    client_library: str | None = None,
) -> tuple[Any, str, Callable[[], Any] | None]:
    """A client for ``url``, where it connects, and how to make a cluster client of it.

    ``cluster``: True makes a cluster client, False a client of one server,
    None one server that becomes a cluster client on its first ``MOVED``
    reply (the third value makes that client). ``client_library``:
    ``"redis"``, ``"valkey"``, or None (by the URL's scheme). See
    ``RedisBackend.from_url``.
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    if cluster not in (None, True, False):
        raise TypeError(f"cluster must be True, False or None, got {cluster!r}")
    if client_library is not None and not isinstance(client_library, str):
        raise TypeError(f"client_library must be a str or None, got {client_library!r}")
    location = redact_url(url)
    library = library_for_url(url, client_library)
    options.setdefault("socket_connect_timeout", command_timeout)
    options.setdefault("socket_timeout", None)  # each round trip is bounded by the backend
    options.setdefault("retry", library.no_retry())

    def to_cluster() -> Any:
        return library.cluster_class.from_url(url, **options)

    try:
        if cluster:
            return to_cluster(), location, None
        client = library.client_class.from_url(url, **options)
        return client, location, None if cluster is False else to_cluster
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"invalid Redis URL {location}: {exc}") from None


def client_location(client: Any) -> str:
    """Where ``client`` connects, from its pool's settings (never its credentials)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    service = getattr(pool, "service_name", None)
    if isinstance(service, str):  # (a Sentinel-managed primary)
        return f"sentinel://{service}/{kwargs.get('db', 0)}"
    host = kwargs.get("host", "?")
    port = kwargs.get("port", "?")
    db = kwargs.get("db", 0)
    connection_class = getattr(pool, "connection_class", None)
    scheme = "rediss" if "SSL" in getattr(connection_class, "__name__", "") else "redis"
    return f"{scheme}://{host}:{port}/{db}"


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def bulk_of(value: Any) -> bytes:
    """One RESP bulk string of bytes, a str, or a number (its ``repr``)."""
    if type(value) is not bytes:
        value = (value if isinstance(value, str) else repr(value)).encode()
    return b"$%d\r\n%s\r\n" % (len(value), value)


def pack(head: bytes, count: int, parts: Sequence[Any]) -> bytes:
    """A RESP command: ``head`` (``count`` bulk strings already packed), then ``parts``.

    The scripts' arguments are bytes already (keys and policies are encoded
    once per scope and policy); this is a fraction of redis-py's general
    ``pack_command``, which is much of the client's cost per round trip.
    """
    return b"".join([b"*%d\r\n" % (count + len(parts)), head, *map(bulk_of, parts)])


class Wire:
    """The few things the backend does to a redis-py connection that redis-py has no call for.

    The one place that reads a connection's private attributes, pinned by
    ``tests/test_backend_redis.py`` to the redis-py versions the ``redis``
    extra accepts (``nox -s redis_py`` runs the Redis tests on the oldest and
    the newest) and to valkey-py's (the ``valkey`` extra): a posted call is
    written on the connection's stream writer without awaiting (``_writer``:
    at the end of an event-loop step, where nothing can be awaited), which
    also tells whether the connection is open. Replies are read by the
    client library's own parser (``read_response``: ``hiredis``, or
    ``libvalkey`` for valkey-py, when installed), which raises an error reply
    as its exception class (``NoScriptError``, ``MovedError``...).
    """

    __slots__ = ()

    @staticmethod
    async def connection(pool: Any) -> Any:
        """A connection from ``pool`` (a ``redis.asyncio`` or ``valkey.asyncio`` pool)."""
        if library_of(pool).named_connections:
            return await pool.get_connection("EVALSHA")
        return await pool.get_connection()

    @staticmethod
    async def read(connection: Any) -> Any:
        """One reply (bytes, ints, lists, None), read by the connection's parser.

        :raises redis.exceptions.ResponseError: for an error reply (valkey-py's
            class on its connections).
        :raises redis.exceptions.ConnectionError: when the connection broke.
        """
        try:
            return await connection.read_response(disable_decoding=True, disconnect_on_error=False)
        except ERRORS.response as exc:
            if type(exc).__name__ == "ResponseError":  # (a parser without cluster errors)
                raise library_of(exc).cluster_error(exc) from None
            raise

    @staticmethod
    def writer(connection: Any) -> asyncio.StreamWriter | None:
        """The connection's stream writer, or None while it is not connected."""
        writer: asyncio.StreamWriter | None = connection._writer
        return writer

    @staticmethod
    async def write(connection: Any, data: bytes) -> None:
        """Write ``data`` on ``connection`` (connecting it first if it is not)."""
        writer = connection._writer
        if writer is None:
            await connection.send_packed_command(data, check_health=False)
        else:
            writer.write(data)  # (small commands, each followed by a read: no drain)


read_reply = Wire.read


async def _read_all(connection: Any, count: int) -> list[Any]:
    """The next ``count`` replies on ``connection``, an error reply as its exception."""
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await read_reply(connection))
        except ERRORS.response as exc:
            replies.append(exc)
    return replies


def _last(replies: list[Any]) -> Any:
    """The last of ``replies``, once each was read; the first error reply is raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies[-1]


class Deadlines:
    """The time bounds of round trips, kept by one timer for them all.

    ``asyncio.timeout`` schedules and cancels a timer per round trip, which
    costs the event loop about as much as the rest of an uncontended call's
    client work. Here a call only notes its deadline; one timer, set for the
    earliest, cancels the calls that outlast theirs, and each of those raises
    ``TimeoutError`` as under ``asyncio.timeout`` (a cancellation from
    elsewhere stays a cancellation). While calls end in time, the timer is
    moved only when a call's deadline comes before it, and goes off once per
    ``command_timeout`` at most.
    """

    __slots__ = ("_at", "_calls", "_loop", "_timer")

    def __init__(self) -> None:
        #: The calls under way: ``[deadline, task, expired]`` by ``id``.
        self._calls: dict[int, list[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's
        self._timer: asyncio.TimerHandle | None = None
        self._at = INF  # when the timer goes off

    def __repr__(self) -> str:
        return f"<Deadlines calls={len(self._calls)} timer at {self._at:g}>"

    async def bounded(self, call: Awaitable[T], seconds: float) -> T:
        """Await ``call``, cancelled after ``seconds``.

        :raises TimeoutError: when ``seconds`` passed first.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # (another event loop: the last one's timer went with it)
            self._loop, self._timer, self._at, self._calls = loop, None, INF, {}
        task = asyncio.current_task(loop)
        assert task is not None
        deadline = loop.time() + seconds
        entry = [deadline, task, False]
        key = id(entry)
        self._calls[key] = entry
        if deadline < self._at:
            self._arm(loop, deadline)
        cancelling = _cancelling(task)
        try:
            return await call
        except asyncio.CancelledError:
            if entry[2] and _uncancel(task) <= cancelling:
                raise TimeoutError("no reply in time") from None
            raise
        finally:
            self._calls.pop(key, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._expire, loop)
        self._at = at

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the calls past their deadline; set the timer for the next one."""
        self._timer, self._at = None, INF
        now = loop.time()
        earliest = INF
        for entry in self._calls.values():
            deadline, task, expired = entry
            if deadline <= now:
                if not expired:
                    entry[2] = True
                    task.cancel()
            elif deadline < earliest:
                earliest = deadline
        if earliest < INF:
            self._arm(loop, earliest)


if sys.version_info >= (3, 11):

    def _cancelling(task: asyncio.Task[Any]) -> int:
        return task.cancelling()

    def _uncancel(task: asyncio.Task[Any]) -> int:
        return task.uncancel()

else:  # pragma: no cover - no cancellation counts: a cancel that came with ours is lost

    def _cancelling(task: asyncio.Task[Any]) -> int:
        return 0

    def _uncancel(task: asyncio.Task[Any]) -> int:
        return 0


class Script:
    """A Lua script sent by its SHA1 (loaded on first use, and again after ``SCRIPT FLUSH``)."""

    __slots__ = ("head", "sha", "source")

    def __init__(self, source: str) -> None:
        import hashlib

        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()
        self.head = bulk_of(b"EVALSHA") + bulk_of(self.sha)

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        """The ``EVALSHA`` of this script with ``keys`` and ``args``."""
        return pack(self.head, 2, (b"%d" % len(keys), *keys, *args))

    def frame(self, count: int, encoded: Sequence[bytes]) -> bytes:
        """The ``EVALSHA`` of ``count`` arguments already encoded (:func:`bulk`).

        ``encoded`` starts with the number of keys; a part may hold several
        arguments (a scope's keys, encoded once and kept).
        """
        return b"".join([b"*%d\r\n" % (count + 2), self.head, *encoded])

    def __repr__(self) -> str:
        return f"<Script {self.sha[:8].decode()}>"


def _fail(owed: list[Settle], exc: BaseException) -> None:
    """The replies of ``owed`` will never be read: each call gets ``exc``."""
    while owed:
        owed.pop(0)(exc)


#: The ``ASKING`` command: the next call on the connection may use a slot
#: that a Redis Cluster node is importing (an ``ASK`` redirection).
ASKING: Final = b"*1\r\n$6\r\nASKING\r\n"


class Link:
    """Script calls on kept connections of one Redis server (the caller bounds their time).

    :param client: the ``redis.asyncio`` (or ``valkey.asyncio``) client whose
        pool gives the connections.
    :param location: how messages name the server (no credentials).
    """

    def __init__(self, client: Any, *, location: str) -> None:
        self.client = client
        self.location = location
        #: The client library's errors (for the ones this class raises).
        self._errors = library_of(client).exceptions
        self._idle: list[Any] = []
        #: Per kept connection, the calls sent on it whose replies are still to read.
        self._owed: dict[Any, list[Settle]] = {}
        #: The scripts Redis is known to hold (only those are sent without waiting).
        self._loaded: set[bytes] = set()
        #: Kept connections found closed, to give back to the pool.
        self._closed: list[Any] = []
        #: Per kept connection, calls posted (:meth:`post`) but not written yet.
        self._corked: dict[Any, list[bytes]] = {}
        self._flush_scheduled = False

    def __repr__(self) -> str:
        owed = sum(map(len, self._owed.values()))
        return f"<Link {self.location} idle={len(self._idle)} owed={owed}>"

    # -- calls ---------------------------------------------------------------------

    async def call(
        self,
        script: Script,
        command: bytes,
        *,
        later: Settle | None = None,
        asking: bool = False,
    ) -> Any:
        """Run ``command`` (a call of ``script``); the caller bounds the time.

        A kept connection that Redis closed meanwhile (a restart) is replaced
        once; every script may run twice safely (a lease id is granted or
        released once).

        With ``later``, the call may be sent without waiting for its reply
        (then ``None`` is returned): the connection is kept, and the next
        call on it reads the reply first and hands it to ``later`` (or the
        exception that stands for it). Redis runs the calls of a connection
        in order, so that next call sees what this one did. When no kept
        connection can carry it, the call waits and returns its reply as
        usual. A failed or cancelled call drops its connection, and the calls
        whose replies it owed get the exception; an error reply (such as a
        cluster's ``MOVED``) is raised and leaves the connection in use.
        ``asking`` sends ``ASKING`` first (and waits for the reply).
        """
        if asking:
            later = None
        for attempt in (0, 1):
            connection = self._kept()
            kept = connection is not None
            if connection is None:
                connection = await self._connection()
            owed = self._owed.pop(connection, None)
            corked = self._corked.pop(connection, None)
            ask = ASKING if asking else b""
            try:
                # (One write for the calls posted meanwhile and this one.)
                data = b"".join([*(corked or ()), ask, command]) if corked or asking else command
                await Wire.write(connection, data)
                if (
                    later is not None
                    and script.sha in self._loaded
                    and len(self._idle) < _KEEP
                    and len(owed or ()) < _OWED
                ):
                    owed = owed or []
                    owed.append(later)
                    self._owed[connection] = owed
                    self._idle.append(connection)
                    return None
                if owed:
                    await self._settle(connection, owed)
                try:
                    if asking:
                        reply = _last(await _read_all(connection, 2))
                    else:
                        reply = await read_reply(connection)
                except ERRORS.no_script:
                    self._loaded.clear()  # (SCRIPT FLUSH, or a new server)
                    load = pack(b"", 0, (b"SCRIPT", b"LOAD", script.source))
                    await Wire.write(connection, load + ask + command)
                    reply = _last(await _read_all(connection, 3 if asking else 2))
            except ERRORS.reconnect as exc:
                # (READONLY: a primary that became a replica; a new connection
                # finds the new primary through Sentinel.)
                await self._drop(connection, owed, exc)
                if kept and not attempt:
                    continue
                raise
            except ERRORS.response:
                await self._keep(connection)  # (the reply was read whole: still in step)
                raise
            except BaseException as exc:
                await self._drop(connection, owed, exc)
                raise
            self._loaded.add(script.sha)
            await self._keep(connection)
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    async def _keep(self, connection: Any) -> None:
        """Keep ``connection`` for the next call, or give it back to the pool."""
        if len(self._idle) < _KEEP:
            self._idle.append(connection)
        else:
            await self.client.connection_pool.release(connection)

    def post(self, script: Script, command: bytes, later: Settle) -> bool:
        """Send ``command`` without waiting for its reply, if a kept connection can carry it.

        Nothing is awaited: the command is written at the end of this step of
        the event loop, in one write with any call made on the same connection
        meanwhile (a release followed by the next acquire costs one write and
        one wake-up of Redis, not two). The next call on the connection reads
        the reply first and hands it to ``later``, as :meth:`call` does.
        Returns ``False`` (nothing sent) when no kept connection is free, the
        script may not be loaded in Redis, or the connection owes too many
        replies: then :meth:`call` it.
        """
        if script.sha not in self._loaded:
            return False
        connection = self._kept()
        if connection is None:
            return False
        self._idle.append(connection)  # (still the one the next call takes)
        owed = self._owed.setdefault(connection, [])
        if len(owed) >= _OWED or Wire.writer(connection) is None:
            if not owed:
                del self._owed[connection]
            return False
        self._corked.setdefault(connection, []).append(command)
        owed.append(later)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return True

    def _flush(self) -> None:
        """Write the posted calls that no later call took along."""
        self._flush_scheduled = False
        corked, self._corked = self._corked, {}
        for connection, commands in corked.items():
            writer = Wire.writer(connection)
            if writer is None or not connection.is_connected:
                continue  # (the next call finds it closed: its calls fail there)
            try:
                writer.write(b"".join(commands))
            except Exception as exc:  # a broken transport: the calls fail now
                if connection in self._idle:
                    self._idle.remove(connection)
                self._closed.append(connection)
                _fail(self._owed.pop(connection, []), exc)

    async def _settle(self, connection: Any, owed: list[Settle]) -> None:
        """Read the replies ``connection`` owes, oldest first, and hand each to its call."""
        while owed:
            try:
                reply = await read_reply(connection)
            except ERRORS.response as exc:  # an error reply: still in step
                if isinstance(exc, ERRORS.no_script):
                    self._loaded.clear()
                reply = exc
            owed.pop(0)(reply)

    def _kept(self) -> Any:
        """A kept connection that is still open, or ``None``."""
        idle = self._idle
        while idle:
            connection = idle.pop()
            if connection.is_connected:
                return connection
            owed = self._owed.pop(connection, None)
            self._corked.pop(connection, None)
            if owed:
                _fail(owed, self._errors.ConnectionError("the connection was closed"))
            self._closed.append(connection)
        return None

    async def _connection(self) -> Any:
        """A connection from the client's pool (giving back the kept ones found closed)."""
        pool: Any = self.client.connection_pool
        closed, self._closed = self._closed, []
        for connection in closed:
            await pool.release(connection)
        return await Wire.connection(pool)

    async def _drop(self, connection: Any, owed: list[Settle] | None, exc: BaseException) -> None:
        """A call failed or was cancelled: its connection may hold a late reply; close it.

        The calls whose replies it owed get ``exc``: whether Redis ran them is unknown.
        """
        self._corked.pop(connection, None)
        if owed:
            _fail(owed, exc)
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            try:
                await connection.disconnect(nowait=True)
            finally:
                await self.client.connection_pool.release(connection)

    async def settle(self) -> None:
        """Read every reply the kept connections owe (the caller bounds the time)."""
        self._flush()
        while self._owed:
            connection, owed = self._owed.popitem()
            self._idle.remove(connection)  # (nobody else reads it meanwhile)
            try:
                await self._settle(connection, owed)
            except BaseException as exc:
                await self._drop(connection, owed, exc)
                raise
            self._idle.append(connection)

    async def aclose(self) -> None:
        """Give the kept connections back to the client's pool (once they owe nothing)."""
        self._flush()
        idle, self._idle = self._idle + self._closed, []
        self._closed = []
        for connection in idle:
            owed = self._owed.pop(connection, None)
            if owed:
                await self._drop(connection, owed, self._errors.ConnectionError("closed"))
            else:
                await self.client.connection_pool.release(connection)
