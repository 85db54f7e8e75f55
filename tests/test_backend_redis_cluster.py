"""The Redis backend on a real 3-node Redis Cluster started by the tests.

Every script call goes to the primary that owns its scope's slot, following
``MOVED`` and ``ASK`` while a slot migrates; a request's scopes must share a
slot (``colocate``), and then are granted atomically as on one server. The
same property test as the standalone backend's
(:func:`test_backend_redis_shared.compare`) runs with scopes on two nodes.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from _redis import (
    CLIENT_LIBRARIES,
    RedisClusterServers,
    client_module,
    delay_cut_reaches_waiting_processes,
    fast,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio.cluster import RedisCluster
from test_backend_redis import enter_elsewhere
from test_backend_redis_shared import (
    POLICIES,
    STATUSES,
    STEPS,
    compare,
    four_processes_share_one_scope,
)

import throttlekit
from throttlekit import BackendUnavailable
from throttlekit.backends._redis_leases import LocalLease
from throttlekit.backends._redis_nodes import ClusterMap
from throttlekit.backends.redis import RedisBackend

pytestmark = pytest.mark.redis

RUNS = itertools.count()
DOCS = Path(__file__).resolve().parent.parent / "docs" / "redis.rst"


@pytest.fixture
def anyio_backend() -> str:
    """The backend runs on asyncio only (redis.asyncio)."""
    return "asyncio"


def spread(cluster: RedisClusterServers, prefix: str, count: int) -> list[str]:
    """``count`` scope names per node whose keys (``{prefix:scope}``) live on that node."""
    found: dict[int, list[str]] = {0: [], 1: [], 2: []}
    index = 0
    while min(map(len, found.values())) < count:
        scope = f"s{index}"
        node = found[cluster.owner(f"{prefix}:{scope}")]
        if len(node) < count:
            node.append(scope)
        index += 1
    return [scope for node in found.values() for scope in node]


def groups_on_two_nodes(cluster: RedisClusterServers, prefix: str) -> tuple[str, str]:
    """Two group names whose hash tags live on different nodes."""
    first = "g0"
    for index in range(1, 100):
        other = f"g{index}"
        if cluster.owner(f"{prefix}:{other}") != cluster.owner(f"{prefix}:{first}"):
            return first, other
    raise AssertionError("no two groups on different nodes")  # pragma: no cover


async def held(limiter: throttlekit.Limiter, *scopes: str, within: float = 1.0) -> Any:
    """A permit for ``scopes`` entered in a task of its own (in this task it would nest)."""
    permit = limiter.acquire(scopes=dict.fromkeys(scopes, 1.0), timeout=within)
    await enter_elsewhere(permit)
    return permit


async def refused(limiter: throttlekit.Limiter, *scopes: str) -> bool:
    """Whether an acquire of ``scopes`` (one attempt, no waiting) is refused."""
    try:
        permit = await held(limiter, *scopes, within=0.0)
    except throttlekit.ThrottleTimeout:
        return True
    await permit.__aexit__(None, None, None)
    return False


async def keys_on(cluster: RedisClusterServers, index: int, pattern: str) -> list[bytes]:
    client = cluster.nodes[index].admin()
    try:
        return sorted(await client.keys(pattern))
    finally:
        await client.aclose()


# -- routing ------------------------------------------------------------------------------


def cluster_client(client_library: str, url: str) -> Any:
    """A cluster client of ``url``: redis-py's ``RedisCluster`` or valkey-py's ``ValkeyCluster``."""
    module = client_module(client_library)
    return getattr(module.cluster, f"{client_library.capitalize()}Cluster").from_url(url)


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_from_url_on_a_cluster_node_routes_every_scope_to_its_node(
    library_cluster: RedisClusterServers, prefix: str, client_library: str
) -> None:
    """The issue's first failure: a cluster node's URL, scopes on every node."""
    scopes = spread(library_cluster, prefix, 2)
    backend = RedisBackend.from_url(
        library_cluster.url, prefix=prefix, failure="fail_closed", client_library=client_library
    )
    limiter = throttlekit.Limiter(
        default=fast(concurrency=1, delay=0.0), backend=backend, concurrency=None
    )
    try:
        for scope in scopes:
            async with limiter.acquire(scopes=scope):
                assert await backend.scope_statistics(limiter, scope) is not None
        stats = backend.statistics()
        assert stats.grants == len(scopes)
        assert stats.local_grants == 0
        assert "cluster" in repr(backend._link)
    finally:
        await backend.aclose()
    for index in range(3):
        want = sorted(
            f"{{{prefix}:{scope}}}:S".encode()
            for scope in scopes
            if library_cluster.owner(f"{prefix}:{scope}") == index
        )
        assert await keys_on(library_cluster, index, f"{{{prefix}:*}}:S") == want


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_a_cluster_client_shares_one_budget_across_backends(
    library_cluster: RedisClusterServers, prefix: str, client_library: str
) -> None:
    """The issue's second failure: ``RedisBackend(RedisCluster(...))``; two backends, one budget
    (one of them on ``client_library``'s cluster client)."""
    scopes = spread(library_cluster, prefix, 1)
    clients = [
        RedisCluster.from_url(library_cluster.nodes[1].url),
        cluster_client(client_library, library_cluster.nodes[2].url),
    ]
    backends = [RedisBackend(client, prefix=prefix, failure="fail_closed") for client in clients]
    limiters = [
        throttlekit.Limiter(
            default=fast(concurrency=2, delay=0.0), backend=backend, concurrency=None
        )
        for backend in backends
    ]
    try:
        for scope in scopes:
            permits = [await held(limiter, scope) for limiter in limiters]
            assert await refused(limiters[0], scope)
            assert await refused(limiters[1], scope)
            await permits[0].__aexit__(None, None, None)
            assert not await refused(limiters[1], scope)  # the slot came back
            await permits[1].__aexit__(None, None, None)
        # A release on any node wakes a waiter of the other backend through pub/sub
        # (the backend listens on one node; a cluster publishes to all of them).
        for scope in scopes:
            full = [await held(limiters[0], scope) for _ in range(2)]
            woken_after = math.inf

            async def wait(scope: str = scope) -> None:
                nonlocal woken_after
                started = anyio.current_time()
                await (await held(limiters[1], scope, within=5.0)).__aexit__(None, None, None)
                woken_after = anyio.current_time() - started

            async with anyio.create_task_group() as group:
                group.start_soon(wait)
                await anyio.sleep(0.2)
                await full[0].__aexit__(None, None, None)
            await full[1].__aexit__(None, None, None)
            assert 0.2 <= woken_after < 0.5  # (by the release, not by a timer: 5 s)
    finally:
        for backend in backends:
            await backend.aclose()
        for client in clients:
            await client.aclose()


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_a_client_of_one_node_gets_a_clear_error(
    library_cluster: RedisClusterServers, prefix: str, client_library: str
) -> None:
    """A plain client of a cluster node, given by the caller: it cannot be turned into
    a cluster client, so a scope on another node raises an error that says what to do."""
    scope = spread(library_cluster, prefix, 1)[1]  # (on the second node)
    client = client_module(client_library).from_url(library_cluster.nodes[0].url)
    backend = RedisBackend(client, prefix=prefix)
    limiter = throttlekit.Limiter(default=fast(concurrency=1), backend=backend, concurrency=None)
    try:
        with pytest.raises(RuntimeError, match="RedisCluster client"):
            await held(limiter, scope)
    finally:
        await backend.aclose()
        await client.aclose()


@pytest.mark.anyio
async def test_a_request_across_nodes_takes_all_or_nothing(
    redis_cluster: RedisClusterServers, prefix: str
) -> None:
    """Scopes on two nodes: granted together at one send time, or not at all, and a
    refusal leaves the scope that had room as it was (its delay unspent)."""
    a, b = (scope for scope in spread(redis_cluster, prefix, 1)[:2])
    backend = RedisBackend.from_url(redis_cluster.url, prefix=prefix, cluster=True)
    limiter = throttlekit.Limiter(
        default=fast(concurrency=1, delay=0.5), backend=backend, concurrency=None
    )
    try:
        both = await held(limiter, a, b)
        assert await refused(limiter, a)
        assert await refused(limiter, b)
        await both.__aexit__(None, None, None)
        admin = RedisCluster.from_url(redis_cluster.url)
        try:  # (one send time, on both nodes)
            sends = [await admin.hget(backend.scope_keys(scope)[1], "last") for scope in (a, b)]
        finally:
            await admin.aclose()
        assert sends[0] is not None
        assert sends[0] == sends[1]
        await anyio.sleep(0.5)

        only_b = await held(limiter, b)
        assert await refused(limiter, a, b)  # (b is full: a's part is handed back)
        before = backend.statistics()
        await (await held(limiter, a, within=0.0)).__aexit__(
            None, None, None
        )  # (a's delay unspent)
        assert backend.statistics().grants == before.grants + 1
        await only_b.__aexit__(None, None, None)
        assert backend.statistics().local_grants == 0
    finally:
        await backend.aclose()


@pytest.mark.anyio
async def test_colocate_keeps_a_group_in_one_slot(
    redis_cluster: RedisClusterServers, prefix: str
) -> None:
    """``colocate``: a group's scopes share a hash tag, so one call grants them atomically."""
    a, b = (scope for scope in spread(redis_cluster, prefix, 1)[:2])
    grouped = RedisBackend.from_url(
        redis_cluster.url, prefix=prefix, cluster=True, colocate=lambda scope: "site"
    )
    limiter = throttlekit.Limiter(
        default=fast(concurrency=1, delay=0.0), backend=grouped, concurrency=None
    )
    try:
        permit = await held(limiter, a, b)
        assert grouped.statistics().acquire_calls == 1
        assert await refused(limiter, b)
        assert await refused(limiter, a)
        await permit.__aexit__(None, None, None)
        assert not await refused(limiter, b)
        assert grouped.scope_keys(a)[0] == f"{{{prefix}:site}}:{a}:L"
    finally:
        await grouped.aclose()
    with pytest.raises(TypeError, match="colocate"):
        RedisBackend.from_url(redis_cluster.url, colocate="site")  # type: ignore[arg-type]


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_cluster_map_reads_the_supported_redis_py(
    library_cluster: RedisClusterServers, prefix: str, client_library: str
) -> None:
    """The one class that reads redis-py's cluster internals, on this redis-py (and valkey-py)."""
    if client_library == "redis":
        major = int(redis.__version__.split(".")[0])
        assert 5 <= major <= 8, f"redis-py {redis.__version__} is not a version ClusterMap supports"
    else:
        import valkey

        major = int(valkey.__version__.split(".")[0])
        assert major == 6, f"valkey-py {valkey.__version__} is not a version ClusterMap supports"
    client = cluster_client(client_library, library_cluster.url)
    try:
        cluster = ClusterMap(client)
        await cluster.refresh()
        for scope in spread(library_cluster, prefix, 2):
            key = f"{{{prefix}:{scope}}}:L".encode()
            host, port = cluster.owner(key)
            assert port == library_cluster.nodes[library_cluster.owner(f"{prefix}:{scope}")].port
            assert host == "127.0.0.1"
            node = cluster.client_at(host, port)
            try:
                assert await node.ping()
            finally:
                await node.aclose(close_connection_pool=True)
        assert cluster.any_primary()[1] in {node.port for node in library_cluster.nodes}
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_docs_cluster_example_runs(redis_cluster: RedisClusterServers, prefix: str) -> None:
    """The Redis page's cluster example: a site's scopes in one slot, one call per request."""
    text = DOCS.read_text()
    blocks = re.findall(
        r"\.\. code-block:: python\n\s*:name: redis-cluster-example\n\n((?:    .*\n|\n)+)",
        text,
    )
    assert blocks, "docs/redis.rst lost its tested cluster example"
    namespace: dict[str, Any] = {}
    exec(compile(textwrap.dedent(blocks[0]), str(DOCS), "exec"), namespace)
    limiter, backend = namespace["cluster_limiter"](redis_cluster.url, prefix)
    try:
        scopes = {"api.example.com": 1.0, "example.com": 1.0}
        async with limiter.acquire(scopes=scopes):
            pass
        assert backend.statistics().acquire_calls == 1
        assert backend.scope_keys("api.example.com")[0].startswith(f"{{{prefix}:example.com}}")
    finally:
        await backend.aclose()


# -- a slot that moves ---------------------------------------------------------------------


async def _migrate(
    cluster: RedisClusterServers, key: str, target: int, *, finish: bool, split: bool = False
) -> None:
    """Move ``key``'s slot and its keys to node ``target``.

    ``finish=False`` stops before the nodes are told the slot's new owner:
    the source answers ``ASK`` for the keys it no longer has. ``split``
    leaves the scope's state on the source (its calls get ``TRYAGAIN``);
    ``finish=True`` moves what is left and ends the migration.
    """
    from redis.crc import key_slot

    slot = key_slot(key.encode())
    source = cluster.owner(key)
    admins = [node.admin() for node in cluster.nodes]
    try:
        ids = [await admin.execute_command("CLUSTER", "MYID") for admin in admins]
        await admins[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        await admins[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        keys = await admins[source].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if split:
            keys = [k for k in keys if not k.endswith(b":S")]
        if keys:
            await admins[source].execute_command(
                "MIGRATE", "127.0.0.1", cluster.nodes[target].port, "", 0, 5000, "KEYS", *keys
            )
        if finish:
            for admin in admins:
                await admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    finally:
        for admin in admins:
            await admin.aclose()


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.parametrize("split", [False, True], ids=["ask", "tryagain"])
@pytest.mark.anyio
async def test_calls_wait_for_a_slot_that_moves_and_follow_it(
    library_cluster: RedisClusterServers, prefix: str, split: bool, client_library: str
) -> None:
    """A migrating slot: ``ASK`` (its keys moved) or ``TRYAGAIN`` (split between the
    nodes) until it ends, then ``MOVED``; the budget holds, no grant is local."""
    scope = spread(library_cluster, prefix, 1)[0]
    backend = RedisBackend.from_url(
        library_cluster.url, prefix=prefix, failure="fail_closed", client_library=client_library
    )
    limiter = throttlekit.Limiter(
        default=fast(concurrency=2, delay=0.0), backend=backend, concurrency=None
    )
    tag = f"{prefix}:{scope}"
    source = library_cluster.owner(tag)
    target = (source + 1) % 3
    try:
        first = await held(limiter, scope)
        await _migrate(library_cluster, tag, target, finish=False, split=split)
        async with anyio.create_task_group() as group:
            group.start_soon(_finish_later, library_cluster, tag, target)
            started = anyio.current_time()
            second = await held(limiter, scope)
            assert anyio.current_time() - started >= 0.2  # (once the migration ended)
        assert await refused(limiter, scope)
        for permit in (first, second):
            await permit.__aexit__(None, None, None)
        both = [await held(limiter, scope), await held(limiter, scope)]
        assert await refused(limiter, scope)
        for permit in both:
            await permit.__aexit__(None, None, None)
        assert backend.statistics().local_grants == 0
    finally:
        await backend.aclose()
    assert await keys_on(library_cluster, source, f"{{{tag}}}:*") == []
    assert f"{{{tag}}}:S".encode() in await keys_on(library_cluster, target, f"{{{tag}}}:*")


async def _finish_later(cluster: RedisClusterServers, key: str, target: int) -> None:
    await anyio.sleep(0.2)
    await _migrate(cluster, key, target, finish=True)


# -- a node that stops answering --------------------------------------------------------------


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_a_stopped_node_costs_at_most_the_timeout_and_fails_open(
    library_cluster: RedisClusterServers, prefix: str, client_library: str
) -> None:
    """A node that hangs (SIGSTOP): failing closed raises, failing open grants locally,
    both within ``command_timeout``; once it answers, each backend is back on Redis
    (the closed one hands back the grant its lost call may have made)."""
    scopes = spread(library_cluster, prefix, 2)
    stopped = library_cluster.nodes[2]
    closed_scope, opened_scope = scopes[4:]  # (on the node that stops)
    library = {"client_library": client_library}
    closed = RedisBackend.from_url(
        library_cluster.url, prefix=prefix, failure="fail_closed", command_timeout=0.5, **library
    )
    opened = RedisBackend.from_url(
        library_cluster.url, prefix=prefix, command_timeout=0.5, reconnect_interval=0.2, **library
    )
    limiters = [
        throttlekit.Limiter(
            default=fast(concurrency=1, delay=0.0), backend=backend, concurrency=None
        )
        for backend in (closed, opened)
    ]
    try:
        for limiter in limiters:  # (connected and scripts loaded on every node)
            for name in scopes:
                async with limiter.acquire(scopes=name):
                    pass
        stopped.pause()
        try:
            started = anyio.current_time()
            with pytest.raises(BackendUnavailable):
                await held(limiters[0], closed_scope, within=5.0)
            assert anyio.current_time() - started < 1.5  # (command_timeout, not 5 s)
            started = anyio.current_time()
            permit = await held(limiters[1], opened_scope, within=5.0)  # the local ledgers'
            assert anyio.current_time() - started < 1.5
            assert opened.statistics().local_grants == 1
            await permit.__aexit__(None, None, None)
        finally:
            stopped.resume()
        admin = stopped.admin()
        try:
            with anyio.fail_after(5.0):
                assert await admin.ping()
        finally:
            await admin.aclose()
        await anyio.sleep(0.3)
        for backend, limiter, scope in zip(
            (closed, opened), limiters, (closed_scope, opened_scope), strict=True
        ):
            grants = backend.statistics().grants
            await (await held(limiter, scope, within=2.0)).__aexit__(None, None, None)
            assert backend.statistics().grants == grants + 1  # (Redis again)
            assert backend.statistics().available
    finally:
        for backend in (closed, opened):
            await backend.aclose()


# -- processes sharing one scope through the cluster --------------------------------------


@pytest.mark.slow
@pytest.mark.anyio
async def test_four_processes_share_one_scope_on_a_cluster(
    redis_cluster: RedisClusterServers, prefix: str
) -> None:
    """The standalone backend's four-process test, the workers given a cluster node's URL:
    concurrency and delay exact, a 429 in one worker slows all of them."""
    admin = RedisCluster.from_url(redis_cluster.url)
    try:
        await four_processes_share_one_scope(redis_cluster, admin, prefix)
    finally:
        await admin.aclose()


@pytest.mark.parametrize("cut_in", ["release", "send"])
@pytest.mark.anyio
async def test_processes_waiting_on_turns_hear_that_the_delay_was_cut_on_a_cluster(
    redis_cluster: RedisClusterServers, prefix: str, cut_in: str
) -> None:
    """The wake-up a cut delay publishes reaches backends of every node (pub/sub is
    cluster-wide): seven waiting on turns 0.5 s apart, through the three nodes."""
    nodes = itertools.cycle(redis_cluster.nodes)
    clients = [RedisCluster.from_url(next(nodes).url) for _ in range(8)]
    try:
        backends = [RedisBackend(client, prefix=prefix) for client in clients]
        await delay_cut_reaches_waiting_processes(backends, cut_in)
    finally:
        for client in clients:
            await client.aclose()  # (a backend leaves the client it was given open)


# -- the same decisions in memory and on the cluster ------------------------------------------


@pytest.mark.parametrize("name", ["backoff-quota-slots", "autothrottle", "custom"])
def test_controllers_decide_alike_in_memory_and_on_a_cluster(
    redis_cluster: RedisClusterServers, name: str
) -> None:
    """Single- and multi-scope requests on two nodes: the standalone backend's property test.

    Scopes ``a`` and ``c`` share one group, ``b`` and ``d`` another on a
    different node; requests ask for one scope, for scopes of one group (one
    atomic call), or for scopes of both (one part per node, handed back when
    a part is refused).
    """
    policy = POLICIES[name]
    operations = st.lists(
        st.one_of(
            st.tuples(
                st.just("acquire"),
                st.sampled_from(
                    [("a",), ("b",), ("c",), ("a", "c"), ("b", "d"), ("a", "b"), ("d", "c", "b")]
                ),
            ),
            st.tuples(
                st.just("feedback"),
                st.integers(0, 5),
                st.sampled_from(STATUSES),
                st.just(None),
                st.sampled_from([0.0625, 0.5, 3.0]),
            ),
            st.tuples(st.just("release"), st.integers(0, 5)),
            st.tuples(st.just("wait"), st.sampled_from(STEPS)),
        ),
        min_size=10,
        max_size=40,
    )

    @settings(
        max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(operations=operations)
    # A new scope's first feedback, in one release with a scope whose write
    # came with the grant, released early (a success without headers): that
    # write met one lease fewer in flight at every try, and after two the
    # feedback was only kept, never stored (AutoThrottle: 0.5 s, not 0.28 s).
    @example(
        operations=[
            ("acquire", ("b",)),
            ("acquire", ("a",)),
            ("acquire", ("a",)),
            ("feedback", 0, 429, None, 0.0625),
            ("wait", 61.0),
            ("feedback", 0, 200, None, 0.0625),
            ("acquire", ("b", "d")),
            ("feedback", 0, 200, None, 0.0625),
            ("wait", 1.0),
            ("acquire", ("c",)),
        ]
    )
    def check(operations: list[Any]) -> None:
        prefix = f"same-{next(RUNS)}-{time.time_ns()}"
        first, second = groups_on_two_nodes(redis_cluster, prefix)
        groups = {"a": first, "c": first, "b": second, "d": second}
        asyncio.run(
            compare(
                redis_cluster.url,
                policy,
                operations,
                names=("a", "b", "c", "d"),
                admin_client=RedisCluster,
                prefix=prefix,
                cluster=True,
                colocate=lambda scope: groups.get(scope, scope),
            )
        )

    check()


# -- a primary that dies: its replica takes over ------------------------------------------------


def _role(server: Any) -> str:
    try:
        return str(redis.Redis(port=server.port).info("replication")["role"])
    except redis.exceptions.ConnectionError:
        return "gone"


@pytest.mark.parametrize(
    ("victim", "how"),
    [(2, "killed"), (0, "hung")],
    ids=["killed", "the-url's-node-hung"],
)
@pytest.mark.anyio
async def test_a_primary_that_dies_fails_over_to_its_replica(
    tmp_path: Path, prefix: str, victim: int, how: str
) -> None:
    """A primary killed by PID (or hung by SIGSTOP: the node of the backend's URL):
    until its replica is promoted, every call on its slots ends within the caller's
    bound, failing closed raises and failing open grants locally; then both backends
    are back on Redis, on the promoted replica."""
    cluster = RedisClusterServers(tmp_path, replicas=(victim,), node_timeout=1000)
    cluster.start()
    try:
        scope = spread(cluster, prefix, 1)[victim]  # (on the primary that dies)
        closed = RedisBackend.from_url(cluster.url, prefix=prefix, failure="fail_closed")
        opened = RedisBackend.from_url(cluster.url, prefix=prefix, reconnect_interval=0.1)
        limiters = {
            backend: throttlekit.Limiter(
                default=fast(concurrency=4, delay=0.0), backend=backend, concurrency=None
            )
            for backend in (closed, opened)
        }
        try:
            for limiter in limiters.values():
                async with limiter.acquire(scopes=scope):
                    pass  # (connected to the primary, scripts loaded there)
            if how == "killed":
                cluster.nodes[victim].kill()
            else:
                cluster.nodes[victim].pause()
            seen: dict[tuple[str, str], int] = {}
            slowest = 0.0
            deadline = time.monotonic() + 20.0
            while _role(cluster.replicas[0]) != "master":
                assert time.monotonic() < deadline, "the replica was not promoted"
                for backend, limiter in limiters.items():
                    outcome, took = await _one_call(limiter, scope, within=0.4)
                    slowest = max(slowest, took)
                    seen[backend.failure, outcome] = seen.get((backend.failure, outcome), 0) + 1
                await anyio.sleep(0.05)
            assert slowest <= 0.4 + 0.3, seen  # (the caller's timeout, not a socket's)
            # (Killed: a refused connection, tens of calls; hung: each call takes
            # its whole bound, a few calls before the replica is promoted.)
            assert seen.get(("fail_closed", "unavailable"), 0) >= 1, seen
            assert seen.get(("fail_open", "local"), 0) >= 1, seen
            assert ("fail_closed", "local") not in seen
            assert ("fail_open", "unavailable") not in seen
            for backend, limiter in limiters.items():  # (on Redis again, within seconds)
                grants = backend.statistics().grants
                with anyio.fail_after(5.0):
                    while backend.statistics().grants == grants:
                        await _one_call(limiter, scope, within=0.4)
                        await anyio.sleep(0.05)
                assert backend.statistics().available
            promoted = cluster.replicas[0].port
            assert await keys_on_port(promoted, f"{{{prefix}:{scope}}}:*")
        finally:
            for backend in limiters:
                await backend.aclose()
    finally:
        cluster.stop()


async def _one_call(limiter: throttlekit.Limiter, scope: str, within: float) -> tuple[str, float]:
    """One acquire and release: where it was granted (or why not), and how long it took."""
    started = time.monotonic()
    try:
        async with limiter.acquire(scopes=scope, timeout=within) as permit:
            outcome = "local" if isinstance(permit._lease, LocalLease) else "redis"
    except BackendUnavailable:
        outcome = "unavailable"
    except throttlekit.ThrottleTimeout:
        outcome = "timeout"
    return outcome, time.monotonic() - started


async def keys_on_port(port: int, pattern: str) -> list[bytes]:
    client = redis.asyncio.Redis(port=port)
    try:
        return sorted(await client.keys(pattern))
    finally:
        await client.aclose()
