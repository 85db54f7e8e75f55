"""The Redis backend on a primary found through Sentinel, across a failover.

A real primary, its replica and one Sentinel (``redis-server --sentinel``)
run on free ports of 127.0.0.1, started by the test and stopped by PID.
The backend is given redis-py's ``Sentinel(...).master_for(...)`` client
(and valkey-py's);
after ``SENTINEL FAILOVER`` its next call finds the new primary (the old
one answers ``READONLY``, and a new connection asks Sentinel).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from _redis import (
    CLIENT_LIBRARIES,
    RedisServer,
    client_errors,
    client_module,
    fast,
    free_port,
    server_binary,
)
from test_backend_redis_cluster import held, refused

import throttlekit
from throttlekit.backends.redis import RedisBackend

pytestmark = pytest.mark.redis

SERVICE = "throttled"


@pytest.fixture
def anyio_backend() -> str:
    """The backend runs on asyncio only (redis.asyncio)."""
    return "asyncio"


class SentinelServers:
    """A primary, its replica and one Sentinel watching them (quorum 1)."""

    def __init__(self, directory: Path, binary: str | None = None) -> None:
        # (A full resync writes an RDB file: into the test's directory, not the cwd.)
        self.primary = RedisServer(
            "--dir", str(directory), "--repl-diskless-sync", "yes", binary=binary
        )
        self.replica = RedisServer(
            "--dir",
            str(directory),
            "--replicaof",
            "127.0.0.1",
            str(self.primary.port),
            binary=binary,
        )
        self.port = free_port()
        self.config = directory / "sentinel.conf"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.primary.binary is not None
        self.primary.start()
        self.replica.start()
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
        )
        self.process = subprocess.Popen(
            [self.primary.binary, str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
        self.replica.stop()
        self.primary.stop()


@pytest.fixture
def sentinel_servers(tmp_path: Path, client_library: str) -> Iterator[SentinelServers]:
    """Redis's servers for redis-py, Valkey's for valkey-py (see ``server_binary``)."""
    servers = SentinelServers(tmp_path, server_binary(client_library))
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


async def _until(check: object, within: float) -> None:
    deadline = time.monotonic() + within
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s")
        await anyio.sleep(0.1)


@pytest.mark.parametrize("client_library", CLIENT_LIBRARIES)
@pytest.mark.anyio
async def test_a_sentinel_client_follows_a_failover(
    sentinel_servers: SentinelServers, prefix: str, client_library: str
) -> None:
    sentinel_class = client_module(client_library).sentinel.Sentinel
    sentinel = sentinel_class([("127.0.0.1", sentinel_servers.port)], socket_timeout=1.0)
    response_error = client_errors(client_library).ResponseError
    not_found = client_module(client_library).sentinel.MasterNotFoundError
    watcher = sentinel.sentinels[0]

    async def replica_known() -> bool:
        try:
            replicas = await watcher.sentinel_slaves(SERVICE)
        except Exception:
            return False
        return any(
            "s_down" not in replica["flags"] and replica.get("master-link-status") == "ok"
            for replica in replicas
        )

    await _until(replica_known, 15.0)
    client = sentinel.master_for(SERVICE)
    backend = RedisBackend(client, prefix=prefix)
    assert backend.location == "sentinel://throttled/0"
    limiter = throttlekit.Limiter(
        default=fast(concurrency=2, delay=0.0), backend=backend, concurrency=None
    )
    try:
        first = await held(limiter, "api")

        async def failing_over() -> bool:
            try:
                await watcher.execute_command("SENTINEL", "FAILOVER", SERVICE)
            except response_error:  # NOGOODSLAVE: the replica's state is not fresh yet
                return False
            return True

        await _until(failing_over, 15.0)

        async def promoted() -> bool:
            try:
                _, port = await sentinel.discover_master(SERVICE)
            except not_found:  # (Valkey's Sentinel, while the failover is under way)
                return False
            return bool(port == sentinel_servers.replica.port)

        await _until(promoted, 20.0)
        second = await held(limiter, "api", within=5.0)
        assert await refused(limiter, "api")  # (the first lease came along)
        for permit in (first, second):
            await permit.__aexit__(None, None, None)
        assert not await refused(limiter, "api")
        stats = backend.statistics()
        assert stats.local_grants == 0
        assert stats.available
    finally:
        await backend.aclose()
        await client.aclose()
        for connection in sentinel.sentinels:
            await connection.aclose()
