"""This process's own long pauses reach the feedback of the sends after them (real collections)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import pytest
from _virtual import AnyioBackend

import throttlekit
from throttlekit import Adaptive, Feedback, ScopePolicy

URL = "https://api.example/v1"


@pytest.fixture(scope="module")
def large_heap() -> Iterator[list[object]]:
    """Enough objects that a full collection takes tens of milliseconds."""
    heap: list[object] = [([], {}) for _ in range(600_000)]
    yield heap
    heap.clear()


@contextmanager
def _only_our_collections() -> Iterator[None]:
    """No automatic collection: under a whole suite's heap one may start at any grant."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _adaptive_limiter() -> throttlekit.Limiter:
    """A limiter whose default scope Adaptive paces (its opening delay: 0.25 s)."""
    return throttlekit.Limiter(default=ScopePolicy(concurrency=None, delay=0, adaptive=Adaptive()))


async def _collect_around_a_send() -> tuple[float, Feedback]:
    """A full collection before a grant and one while its request is in flight."""
    Adaptive()  # configuring Adaptive starts keeping them
    limiter = throttlekit.Limiter(default=ScopePolicy(concurrency=None, delay=0))
    with _only_our_collections():
        start = anyio.current_time()
        gc.collect()
        taken = anyio.current_time() - start
        async with limiter.acquire(URL) as permit:
            gc.collect()  # sent before it: not this send's pause
            return taken, permit.record(status=429)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"], indirect=True)
@pytest.mark.anyio
async def test_a_full_collection_before_a_send_is_in_its_feedback(
    anyio_backend: AnyioBackend, large_heap: list[object]
) -> None:
    taken, feedback = await _collect_around_a_send()
    assert feedback.paused is not None
    since, length = feedback.paused
    assert 0.005 <= length <= taken + 0.001
    assert 0.0 <= since < 0.5  # the one before the send, not the one after it


@pytest.mark.parametrize("anyio_backend", ["asyncio_virtual", "trio_virtual"], indirect=True)
@pytest.mark.anyio
async def test_in_virtual_time_no_pause_is_seen(
    anyio_backend: AnyioBackend, large_heap: list[object]
) -> None:
    taken, feedback = await _collect_around_a_send()
    assert taken == 0.0  # the virtual clock stands still through a collection
    assert feedback.paused is None


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"], indirect=True)
@pytest.mark.anyio
async def test_a_send_a_collection_held_paces_the_next_from_its_end(
    anyio_backend: AnyioBackend, large_heap: list[object]
) -> None:
    # Granted before the collection and sent after it, the send would go out
    # bunched with the next one: the delay runs from the collection's end.
    limiter = _adaptive_limiter()
    with _only_our_collections():
        async with limiter.acquire(URL):
            gc.collect()  # began just after the grant: the send waited for it
            ended = anyio.current_time()
        scope = limiter.scope_statistics("api.example")
        assert scope is not None
        assert scope.delay > 0.1  # Adaptive's opening pace
        async with limiter.acquire(URL):
            granted = anyio.current_time()
    assert granted >= ended + scope.delay - 0.002


@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
@pytest.mark.anyio
async def test_a_collection_well_after_a_grant_does_not_move_the_next(
    anyio_backend: AnyioBackend, large_heap: list[object]
) -> None:
    limiter = _adaptive_limiter()
    with _only_our_collections():
        async with limiter.acquire(URL):
            granted = anyio.current_time()
        await anyio.sleep(0.05)  # the send had left
        gc.collect()
        collected = anyio.current_time()
        scope = limiter.scope_statistics("api.example")
        assert scope is not None
        async with limiter.acquire(URL):
            again = anyio.current_time()
    # (Paced from the collection's end, it would wait a whole delay after it.)
    assert again <= max(granted + scope.delay, collected) + 0.1
