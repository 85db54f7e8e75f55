"""Shared, additive fixtures for the throttlekit test suite.

Async tests use anyio's pytest plugin: mark them ``@pytest.mark.anyio`` and
they run once per value of the ``anyio_backend`` fixture below, i.e. on
asyncio and on trio (both in real time).

Virtual time
------------
Timing logic should run in virtual time. Ask for the ``"trio_virtual"``
backend, a trio loop driven by a fresh ``trio.testing.MockClock(autojump_threshold=0)``
per test: whenever every task is blocked, the clock jumps straight to the
next deadline, so ``await anyio.sleep(60)`` takes no real time and
``anyio.current_time()`` is exact (it starts at 0.0 in each test)::

    @pytest.mark.parametrize("anyio_backend", ["trio_virtual"], indirect=True)
    @pytest.mark.anyio
    async def test_something_slow() -> None: ...

or, for a whole module::

    @pytest.fixture
    def anyio_backend(trio_virtual: AnyioBackend) -> AnyioBackend:
        return trio_virtual

Indirect parametrization also accepts ``"asyncio"`` and ``"trio"``, so a test
may run on ``["asyncio", "trio_virtual"]``. The clock of a virtual-time test
is available inside it as ``trio.lowlevel.current_clock()``.
"""

from __future__ import annotations

import signal
import threading

import pytest
from _virtual import AnyioBackend, backend

#: The Redis backend's tests share a real redis-server fixture (``tests/_redis.py``).
pytest_plugins = ("_redis",)


@pytest.fixture(autouse=True)
def _default_sigint() -> None:
    """Each test starts with Python's own SIGINT handler.

    A library that installs its own (a crawler's shutdown handler, or an
    ignored SIGINT) and leaves it would change how the next test's main
    thread is interrupted, and a child process inherits an ignored SIGINT:
    the tests that interrupt a waiting thread or a CLI run depend on it.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def trio_virtual() -> AnyioBackend:
    """A trio backend on a fresh ``MockClock(autojump_threshold=0)`` (virtual time)."""
    return backend("trio_virtual")


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> AnyioBackend:
    """The async backend of ``@pytest.mark.anyio`` tests: asyncio and trio by default.

    Parametrize it indirectly with ``"asyncio"``, ``"trio"``,
    ``"asyncio_virtual"`` (asyncio on a ``VirtualEventLoop``) or
    ``"trio_virtual"`` (trio on a fresh autojumping ``MockClock``) to choose
    (see ``tests/_virtual.py``).
    """
    return backend(str(request.param))
