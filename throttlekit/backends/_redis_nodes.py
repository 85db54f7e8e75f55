"""Where the Redis backend's calls go: one server, or the primaries of a Redis Cluster.

:class:`Nodes` carries every script call of a backend and keeps Redis's
health for the failure policy. On one server (standalone, or a primary
found through Sentinel) a call goes on that server's
:class:`~._redis_link.Link`. On a Redis Cluster, a call goes to the primary
that owns the slot of its keys (all the keys of one call share a hash tag):
a ``MOVED`` reply updates the slot's owner and sends the call there, an
``ASK`` reply (a slot being migrated) sends it once to the importing node
after ``ASKING``, and ``TRYAGAIN`` (the keys of a call split by a
migration) retries shortly. A node that does not answer makes the backend
fail open or closed as a whole, and the next call reads the slot table
again (a failover moves slots to a replica).

:class:`ClusterMap` is the one place that reads redis-py's cluster client
(its slot table and node settings); ``tests/test_backend_redis_cluster.py``
pins it to the supported redis-py versions.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any, Final

import anyio

from .._errors import BackendUnavailable
from ._redis_clients import ERRORS, library_of
from ._redis_link import Link, Script, Settle, describe_failure

__all__ = ["ClusterMap", "Nodes", "is_cluster"]

logger = logging.getLogger("throttlekit.backends.redis")

INF: Final = math.inf

#: Redirections (``MOVED``, ``ASK``) one call follows before it counts as
#: failed: a resharding step moves a slot once, a failover once more.
#: (``TRYAGAIN`` is retried until the caller's bound.)
_REDIRECTS: Final = 5
#: Seconds before a call whose keys a slot migration split (``TRYAGAIN``) is
#: retried: a migration moves a batch of keys in about a millisecond.
_TRY_AGAIN: Final = 0.02
#: Slots whose owners and keys whose slots are cached at most (then cleared).
_CACHED: Final = 16384


def _asks_last(manager: Any) -> bool:
    """Whether the nodes manager's ``initialize()`` takes the node to ask last (redis-py 7+)."""
    parameters = inspect.signature(manager.initialize).parameters
    return "last_failed_node_name" in parameters


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a cluster client (redis-py's ``RedisCluster``, ``ValkeyCluster``)."""
    return callable(getattr(client, "keyslot", None)) and hasattr(client, "nodes_manager")


class ClusterMap:
    """The slot table of a Redis Cluster, read through redis-py's ``RedisCluster``.

    (Or valkey-py's ``ValkeyCluster``, the same code under other names.) The
    only code of the backend that reads the cluster client's internals:
    ``initialize()``, ``keyslot()``, ``nodes_manager`` (``initialize()``,
    ``get_node_from_slot()``, ``nodes_cache``, ``startup_nodes``) and a
    node's ``host``, ``port``, ``server_type``, ``connection_class`` and
    ``connection_kwargs``.

    The client reads the table from the first of its nodes that answers,
    one after another, without a bound of its own: a node that hangs
    (stopped, or cut off) would hold every reading until the caller's bound,
    even once its replica serves its slots. So the node whose call failed,
    and the node asked first by a reading that did not end, are asked last.
    """

    __slots__ = ("_avoid", "_owners", "_read", "_reading", "_slots", "client", "library", "stale")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.library = library_of(client)
        self.stale = True  # the slot table must be read before the next call
        self._read = False
        self._reading = False  # a reading under way (or cut short by its caller's bound)
        self._avoid: str | None = None  # the node to ask last ("host:port")
        self._owners: dict[int, tuple[str, int]] = {}
        self._slots: dict[bytes, int] = {}

    def __repr__(self) -> str:
        return f"<ClusterMap slots={len(self._owners)} stale={self.stale}>"

    def slot(self, key: bytes) -> int:
        """The slot of ``key`` (its hash tag's)."""
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) > _CACHED:
                self._slots.clear()
            slot = self._slots[key] = int(self.client.keyslot(key))
        return slot

    def unreachable(self, host: str, port: int) -> None:
        """A call to the node at ``host:port`` failed: read the table again, asking it last."""
        self.stale = True
        self._avoid = f"{host}:{port}"

    async def refresh(self) -> None:
        """Read the slot table again (``CLUSTER SLOTS`` through the client)."""
        try:
            if self._read:
                await self._read_again()
            else:  # (the client's own first reading: its aclose() closes what it opened)
                await self.client.initialize()
                self._read = True
        except ERRORS.unclustered as exc:  # no node answered
            message = f"no cluster node answered ({exc})"
            raise self.library.exceptions.ConnectionError(message) from None
        self._owners.clear()
        self.stale = False

    async def _read_again(self) -> None:
        """``initialize()`` of the nodes manager, the node to avoid asked last."""
        manager = self.client.nodes_manager
        nodes: dict[str, Any] = manager.startup_nodes
        if self._reading and nodes:  # (the last reading did not end: its first node hangs?)
            first = next(iter(nodes))
            nodes[first] = nodes.pop(first)
        avoid = self._avoid
        if avoid in nodes:
            nodes[avoid] = nodes.pop(avoid)  # (to the end of the order they are asked in)
        self._reading = True
        if avoid is not None and _asks_last(manager):
            await manager.initialize(last_failed_node_name=avoid)  # (it shuffles the others)
        else:
            await manager.initialize()
        self._reading = False
        self._avoid = None

    def owner(self, key: bytes) -> tuple[str, int]:
        """The host and port of the primary that owns ``key``'s slot."""
        slot = self.slot(key)
        owner = self._owners.get(slot)
        if owner is None:
            try:
                node = self.client.nodes_manager.get_node_from_slot(slot)
            except ERRORS.unclustered as exc:  # (the slot has no owner now)
                self.stale = True
                raise self.library.exceptions.ConnectionError(str(exc)) from None
            owner = self._owners[slot] = (node.host, int(node.port))
        return owner

    def moved(self, slot: int, host: str, port: int) -> None:
        """A ``MOVED`` reply: ``slot`` is now served at ``host:port``."""
        self._owners[slot] = (host, int(port))

    def any_primary(self) -> tuple[str, int]:
        """Some primary (for the release channel: a cluster publishes to every node)."""
        for node in self.client.nodes_manager.nodes_cache.values():
            if node.server_type == "primary":
                return node.host, int(node.port)
        raise self.library.exceptions.ConnectionError("no primary known")

    def client_at(self, host: str, port: int) -> Any:
        """A client of the node at ``host:port``, with the cluster client's settings."""
        nodes = list(self.client.nodes_manager.nodes_cache.values())
        if not nodes:
            nodes = list(self.client.nodes_manager.startup_nodes.values())
        template = nodes[0]
        options = dict(template.connection_kwargs, host=host, port=port)
        library = self.library
        pool = library.pool_class(connection_class=template.connection_class, **options)
        return library.client_class(connection_pool=pool)


class Nodes:
    """The servers a backend calls, and whether they answer (for the failure policy).

    :param client: a ``redis.asyncio`` client of one server, or a cluster client.
    :param location: how messages name Redis (no credentials).
    :param failure: ``"fail_open"`` or ``"fail_closed"``.
    :param reconnect_interval: seconds between attempts while Redis is away (fail-open).
    :param to_cluster: makes a cluster client of the same URL, for a server
        that turns out to be a cluster node (``INFO cluster``, asked once
        before the first call, or its first ``MOVED``, ``ASK`` or
        ``TRYAGAIN`` reply); None: such a reply is an error.
    """

    def __init__(
        self,
        client: Any,
        *,
        location: str,
        failure: str,
        reconnect_interval: float,
        to_cluster: Callable[[], Any] | None = None,
    ) -> None:
        self.location = location
        self.failure = failure
        self.reconnect_interval = reconnect_interval
        self.down = False
        self.retry_at = -INF
        self.cluster: ClusterMap | None = None
        self.link: Link | None = None  # the one server's
        self._to_cluster = to_cluster
        #: Whether to ask the server if it is a cluster node before the first
        #: call (else a backend whose scopes all live on the node of its URL
        #: would never know, and could not follow that node's failover).
        self._probe = to_cluster is not None
        self._links: dict[tuple[str, int], Link] = {}  # a cluster's, by address
        self._owned: list[Any] = []  # clients made here, closed by aclose()
        self._retired: list[Link] = []  # the one server's, once it turned out a cluster node
        if is_cluster(client):
            self.cluster = ClusterMap(client)
        else:
            self.link = Link(client, location=location)

    def __repr__(self) -> str:
        state = "down" if self.down else "up"
        if self.cluster is None:
            return f"<Nodes {self.location} {state} {self.link!r}>"
        return f"<Nodes {self.location} cluster {state} links={len(self._links)}>"

    # -- calls ---------------------------------------------------------------------

    async def call(
        self, script: Script, command: bytes, key: bytes, *, later: Settle | None = None
    ) -> Any:
        """Run ``command`` on the server that holds ``key`` (see :meth:`Link.call`)."""
        link = self.link
        if link is not None and self._probe:
            await self._probe_cluster(link)
            link = self.link
        if link is not None:
            try:
                return await link.call(script, command, later=later)
            except (*ERRORS.ask, *ERRORS.try_again) as exc:  # (MOVED too)
                if self._to_cluster is None:
                    raise RuntimeError(
                        f"Redis at {self.location} is a Redis Cluster node: give RedisBackend "
                        "a redis.asyncio.cluster.RedisCluster client (valkey-py: ValkeyCluster), "
                        "or use RedisBackend.from_url"
                    ) from exc
                if self.link is link:  # (not already switched by another task's call)
                    self._become_cluster()
        return await self._cluster_call(script, command, key, later)

    def post(self, script: Script, command: bytes, key: bytes, later: Settle) -> bool:
        """Send ``command`` without waiting, if it can be (see :meth:`Link.post`)."""
        link = self.link
        if link is None:
            cluster = self.cluster
            if cluster is None or cluster.stale:
                return False
            try:
                link = self._links.get(cluster.owner(key))
            except ERRORS.connection:  # (no owner known: the call will say)
                return False
            if link is None:
                return False
        return link.post(script, command, later)

    async def _cluster_call(
        self, script: Script, command: bytes, key: bytes, later: Settle | None
    ) -> Any:
        """The call on the primary that owns ``key``'s slot, following redirections."""
        cluster = self.cluster
        assert cluster is not None
        asking: tuple[str, int] | None = None
        redirects = 0
        while redirects < _REDIRECTS:
            redirects += 1
            if cluster.stale:
                await cluster.refresh()
            address = asking or cluster.owner(key)
            link = self._link_at(address)
            try:
                return await link.call(script, command, later=later, asking=asking is not None)
            except ERRORS.moved as exc:  # (before AskError: a subclass of it)
                cluster.moved(exc.slot_id, exc.host, exc.port)
                asking = None
            except ERRORS.ask as exc:
                asking = (exc.host, int(exc.port))
            except ERRORS.try_again:
                # The slot is migrating and the call's keys are not all on one
                # node (a script's keys rarely all exist): try again until the
                # migration of the slot ends (the caller bounds the time).
                asking = None
                redirects = 0
                await anyio.sleep(_TRY_AGAIN)
            except ERRORS.unavailable:
                cluster.unreachable(*address)  # (a failover: the slot may be elsewhere now)
                raise
            except asyncio.CancelledError:
                # (A call cut short by its bound may have met a node that hangs:
                # the bound cancels it, and the caller sees a TimeoutError.)
                cluster.unreachable(*address)
                raise
        message = f"more than {_REDIRECTS} redirections for one call"
        raise cluster.library.exceptions.ClusterError(message)

    def _link_at(self, address: tuple[str, int]) -> Link:
        link = self._links.get(address)
        if link is None:
            assert self.cluster is not None
            client = self.cluster.client_at(*address)
            self._owned.append(client)
            host, port = address
            link = self._links[address] = Link(client, location=f"{host}:{port}")
        return link

    async def _probe_cluster(self, link: Link) -> None:
        """Ask the server whether it is a cluster node (once); call the cluster if so."""
        try:
            info = await link.client.info("cluster")
        except ERRORS.response:  # (INFO not permitted: a first MOVED reply will tell)
            info = {}
        self._probe = False
        if info.get("cluster_enabled") and self.link is link:
            self._become_cluster()

    def _become_cluster(self) -> None:
        """The server is a cluster node: call the cluster from now on."""
        assert self._to_cluster is not None
        assert self.link is not None
        client = self._to_cluster()
        self._owned.append(client)
        self._retired.append(self.link)
        self.link = None
        self.cluster = ClusterMap(client)
        logger.info("Redis at %s is a cluster node: calling the cluster", self.location)

    def pubsub(self) -> Any:
        """A pub/sub object for the release channel (any node of a cluster hears every release)."""
        if self.link is not None:
            return self.link.client.pubsub()
        assert self.cluster is not None
        return self._link_at(self.cluster.any_primary()).client.pubsub()

    async def settle(self) -> None:
        """Read every reply the kept connections owe (the caller bounds the time)."""
        for link in self._all():
            await link.settle()

    async def aclose(self) -> None:
        """Give the kept connections back and close the clients made here."""
        for link in self._all():
            await link.aclose()
        owned, self._owned = self._owned, []
        for client in owned:
            if is_cluster(client):
                await client.aclose()
            else:  # (a client made with a pool does not close it unless told)
                await client.aclose(close_connection_pool=True)

    def _all(self) -> list[Link]:
        one = [self.link] if self.link is not None else []
        return one + self._retired + list(self._links.values())

    # -- health --------------------------------------------------------------------

    def may_try(self, now: float) -> bool:
        """Whether to ask Redis now (always, unless failing open and waiting to retry)."""
        return not self.down or self.failure != "fail_open" or now >= self.retry_at

    def unavailable(self, exc: BaseException, now: float) -> None:
        """Redis did not answer: raise :class:`BackendUnavailable` if failing closed."""
        self.retry_at = now + self.reconnect_interval
        reason = describe_failure(exc)
        if self.failure == "fail_closed":
            self.down = True
            raise BackendUnavailable(
                f"Redis at {self.location} is unavailable ({reason}); failing closed"
            ) from exc
        if not self.down:
            self.down = True
            logger.warning(
                "Redis at %s is unavailable (%s); throttling with this process's in-memory "
                "ledgers until it is back (fail_open)",
                self.location,
                reason,
            )

    def answered(self) -> None:
        """Redis answered a call."""
        if self.down:
            self.down = False
            logger.info("Redis at %s is back; shared throttling resumed", self.location)
