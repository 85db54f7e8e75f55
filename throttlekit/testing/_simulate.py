"""The simulator: a real Limiter against a simulated server, in virtual time."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import anyio

from .. import _clock
from .._checks import check_number
from .._errors import ThrottleTimeout
from .._limiter import Limiter
from .._policy import ScopePolicy
from .._stats import ScopeStatistics
from ._loop import SimulationDeadlock, VirtualEventLoop
from ._model import SimRequest, SimResponse
from ._servers import Responder, ServerModel, Sites
from ._trace import Outcome, RequestRecord, Sample, Trace

__all__ = ["WALL_EPOCH", "simulate"]

#: The wall clock's epoch at a simulation's virtual time 0 (2026-01-01 UTC):
#: fixed, so that whole-second epoch resets round the same way in every run.
WALL_EPOCH = 1_767_225_600.0

#: Without a duration, a run still waiting at this virtual time is deadlocked.
_HORIZON = 1e9

LimiterLike = Limiter | ScopePolicy | Callable[[], Limiter]


class _Pending:
    """The mutable record of one request while the simulation runs."""

    __slots__ = (
        "arrived",
        "blocked",
        "exception",
        "headers",
        "latency",
        "outcome",
        "released",
        "released_seq",
        "request",
        "responded",
        "response_seq",
        "scopes",
        "sent",
        "sent_seq",
        "size",
        "status",
    )

    def __init__(self, request: SimRequest) -> None:
        self.request = request
        self.scopes: dict[str, float] = {}
        self.arrived: float | None = None
        self.sent: float | None = None
        self.responded: float | None = None
        self.released: float | None = None
        self.status: int | None = None
        self.exception: str | None = None
        self.latency: float | None = None
        self.size: int | None = None
        self.headers: Mapping[str, str] = {}
        self.blocked = False
        self.outcome: Outcome = "unsent"
        self.sent_seq = self.response_seq = self.released_seq = -1

    def freeze(self, index: int) -> RequestRecord:
        request = self.request
        return RequestRecord(
            index=index,
            url=request.url,
            scopes=self.scopes,
            priority=request.priority,
            arrived=self.arrived,
            sent=self.sent,
            responded=self.responded,
            released=self.released,
            status=self.status,
            exception=self.exception,
            latency=self.latency,
            size=self.size,
            headers=self.headers,
            blocked=self.blocked,
            outcome=self.outcome,
            sent_seq=self.sent_seq,
            response_seq=self.response_seq,
            released_seq=self.released_seq,
        )


class _Run:
    """One simulation run: feeds the requests, records events and samples."""

    def __init__(
        self,
        limiter: Limiter,
        responder: Responder,
        requests: list[SimRequest],
        duration: float | None,
        wall_epoch: float | None,
    ) -> None:
        self.wall_epoch = wall_epoch
        self.limiter = limiter
        self.responder = responder
        self.pending = [_Pending(request) for request in requests]
        self.duration = duration
        self.samples: dict[str, list[Sample]] = {}
        self.seq = itertools.count()
        self.finished = False
        self.unfinished = len(requests)
        self.all_done: anyio.Event | None = None
        self.end = 0.0

    def event(self, scopes: Iterable[str], now: float) -> int:
        """Number an event and sample the scopes it touched."""
        seq = next(self.seq)
        for name in scopes:
            scope_stats = scope_statistics(self.limiter, name, now)
            if scope_stats is not None:
                self.samples.setdefault(name, []).append(
                    Sample(time=now, seq=seq, stats=scope_stats)
                )
        return seq

    async def main(self) -> None:
        _clock.simulated_wall(self.wall_epoch)  # (the tasks started below inherit it)
        self.all_done = anyio.Event()
        if not self.pending:
            self.all_done.set()
        end = self.duration if self.duration is not None else _HORIZON
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self.feed, tasks)
            with anyio.CancelScope(deadline=end):
                await self.all_done.wait()
                if self.duration is not None:
                    await anyio.sleep_until(self.duration)
            self.finished = True
            self.end = anyio.current_time()
            tasks.cancel_scope.cancel()
        if self.duration is None and self.unfinished:
            stuck = [index for index, state in enumerate(self.pending) if state.sent is None]
            raise SimulationDeadlock(
                f"{self.unfinished} request(s) never finished although nothing could wake "
                f"them (requests {stuck[:10]} were never granted); the limiter lost a wake-up "
                f"or a scope stays blocked forever"
            )

    async def feed(self, tasks: anyio.abc.TaskGroup) -> None:
        for index, state in enumerate(self.pending):
            at = state.request.at
            if at > anyio.current_time():
                await anyio.sleep_until(at)
            tasks.start_soon(self.one, index, state)

    async def one(self, index: int, state: _Pending) -> None:
        request = state.request
        state.arrived = anyio.current_time()
        deadline = (
            math.inf if request.cancel_after is None else state.arrived + request.cancel_after
        )
        try:
            with anyio.CancelScope(deadline=deadline) as cancel_scope:
                try:
                    await self.send(state)
                except ThrottleTimeout:
                    state.outcome = "timeout"
            if cancel_scope.cancelled_caught:
                state.outcome = "cancelled"
        finally:
            if not self.finished:
                self.unfinished -= 1
                if not self.unfinished and self.all_done is not None:
                    self.all_done.set()
            elif state.sent is not None and state.responded is None:
                state.outcome = "interrupted"

    async def send(self, state: _Pending) -> None:
        request = state.request
        permit = self.limiter.acquire(
            request, priority=request.priority, timeout=request.timeout, scopes=request.scopes
        )
        try:
            async with permit:
                state.sent = now = permit.granted_at
                state.scopes = permit.scopes
                state.sent_seq = self.event(state.scopes, now)
                response: SimResponse = self.responder(request, now)
                await anyio.sleep(response.latency)
                now = anyio.current_time()
                state.responded = now
                state.status = response.status
                state.latency = response.latency
                state.size = response.size
                state.headers = dict(response.headers)
                state.blocked = response.blocked
                if response.exception is not None:
                    state.exception = type(response.exception).__name__
                    state.outcome = "error"
                else:
                    state.outcome = "response"
                permit.record(
                    status=response.status,
                    headers=state.headers or None,
                    exception=response.exception,
                    latency=response.latency,
                    size=response.size,
                )
                state.response_seq = self.event(state.scopes, now)
        finally:
            if state.sent is not None and not self.finished:
                now = anyio.current_time()
                state.released = now
                state.released_seq = self.event(state.scopes, now)


def scope_statistics(limiter: Limiter, name: str, now: float) -> ScopeStatistics | None:
    """What ``limiter.statistics().scopes[name]`` would say, without snapshotting every scope.

    A simulation samples the scopes of each event; building the statistics of
    every scope each time would make runs with many scopes quadratic.
    """
    return limiter.scope_statistics(name)


def _make_limiter(limiter: LimiterLike, seed: int) -> Limiter:
    if isinstance(limiter, Limiter):
        made = limiter
    elif isinstance(limiter, ScopePolicy):
        made = Limiter(default=limiter, concurrency=None, seed=seed)
    elif callable(limiter):
        made = limiter()
        if not isinstance(made, Limiter):
            raise TypeError(f"the limiter factory must return a Limiter, got {made!r}")
    else:
        raise TypeError(
            f"limiter must be a Limiter, a ScopePolicy or a factory of Limiters, got {limiter!r}"
        )
    stats = made.statistics()
    if (
        stats.in_flight
        or stats.waiting
        or any(scope.next_send_at > -math.inf for scope in stats.scopes.values())
    ):
        raise ValueError(
            "the limiter has already been used (its clock differs from the simulation's); "
            "pass a fresh Limiter, or a factory that makes one per run"
        )
    return made


def _make_server(server: ServerModel | Mapping[str, ServerModel]) -> ServerModel:
    if isinstance(server, Mapping):
        return Sites(server)
    if not isinstance(server, ServerModel):
        raise TypeError(
            f"server must be a server model (with start()) or a mapping, got {server!r}"
        )
    return server


def simulate(
    limiter: LimiterLike,
    server: ServerModel | Mapping[str, ServerModel],
    requests: Iterable[SimRequest],
    *,
    duration: float | None = None,
    seed: int = 0,
    backend: Literal["asyncio", "trio"] = "asyncio",
    wall_epoch: float | None = WALL_EPOCH,
) -> Trace:
    """Run requests through a real :class:`~throttlekit.Limiter` against a simulated server.

    Nothing sleeps: the run happens in virtual time, starting at 0.0, so an
    hour of crawling takes a fraction of a second. Each request arrives at its
    ``at``, waits for a permit exactly as application code would (``async
    with limiter.acquire(...)``), is answered by the server model, and its
    response is recorded on the permit (status, headers, latency, exception),
    so the scope's controllers (backoff, AutoThrottle, yours) react as they
    would in production.

    :param limiter: the :class:`~throttlekit.Limiter` to test (it must be
        fresh: its clock restarts at 0), a zero-argument factory returning one
        (for repeated runs, e.g. in property tests), or a
        :class:`~throttlekit.ScopePolicy`, which becomes the default policy of
        a limiter without a global cap.
    :param server: a server model (see :class:`FixedServer`,
        :class:`QuotaServer`...), or ``{host: model}`` for several sites.
    :param requests: the workload (see :func:`burst`, :func:`steady`,
        :func:`poisson`); taken in order of arrival time.
    :param duration: end the run at this virtual time; requests still waiting
        end as ``"unsent"``, those in flight as ``"interrupted"``. ``None``
        runs until every request is done.
    :param seed: seeds the server's random numbers and, for a policy, the
        limiter's jitter. The same inputs and seed give the same trace.
    :param backend: ``"asyncio"`` (the default) runs on a virtual-time
        asyncio loop and is deterministic. ``"trio"`` runs on trio with
        ``MockClock(autojump_threshold=0)``: same timing rules, but trio
        shuffles the order of tasks that wake at the same instant.
    :param wall_epoch: the wall clock (what epoch resets in headers are read
        against, and what the models state them on) shows this many epoch
        seconds at virtual time 0 and runs with the virtual time, so a
        whole-second epoch is rounded at every phase in turn, as with a real
        server. ``None`` keeps the real :func:`time.time`, nearly frozen over
        a run that takes a fraction of a second.
    :returns: the :class:`Trace` of the run.
    :raises SimulationDeadlock: when ``duration`` is ``None`` and requests
        wait with nothing left that could wake them.
    :raises RuntimeError: when called from inside a running event loop (it
        runs its own; call it from synchronous code or a worker thread).

    Usage::

        trace = simulate(
            ScopePolicy(concurrency=1, delay=1.0, slot_delay=0),
            QuotaServer(limit=5, window=1.0),
            burst("https://api.test/{i}", 20),
        )
        assert_respects(trace)
    """
    if duration is not None and not (isinstance(duration, (int, float)) and duration > 0):
        raise ValueError(f"duration must be a number of seconds > 0 or None, got {duration!r}")
    if backend not in ("asyncio", "trio"):
        raise ValueError(f"backend must be 'asyncio' or 'trio', got {backend!r}")
    try:
        anyio.current_time()
    except RuntimeError:
        pass  # no event loop runs in this thread: good
    else:
        raise RuntimeError(
            "simulate() runs its own event loop; call it from synchronous code "
            "(or from a worker thread: await anyio.to_thread.run_sync(...))"
        )
    workload = list(requests)
    for request in workload:
        if not isinstance(request, SimRequest):
            raise TypeError(f"requests must be SimRequest objects, got {request!r}")
    workload.sort(key=lambda request: request.at)
    made = _make_limiter(limiter, seed)
    responder = _make_server(server).start(random.Random(seed))
    if wall_epoch is not None:
        check_number("wall_epoch", wall_epoch, minimum=0.0)
    run = _Run(made, responder, workload, duration, wall_epoch)
    options: dict[str, Any]
    if backend == "trio":
        try:
            from trio.testing import MockClock
        except ImportError:
            raise ImportError(
                'simulate(backend="trio") needs trio: pip install "throttlekit-http[testing]"'
            ) from None
        options = {"clock": MockClock(autojump_threshold=0)}
    else:
        options = {"loop_factory": VirtualEventLoop}
    anyio.run(run.main, backend=backend, backend_options=options)
    scopes = sorted({name for state in run.pending for name in state.scopes})
    return Trace(
        requests=tuple(state.freeze(index) for index, state in enumerate(run.pending)),
        samples={name: tuple(run.samples.get(name, ())) for name in scopes},
        policies={name: made.policy(name) for name in scopes},
        concurrency=made.statistics().concurrency,
        duration=run.end,
        seed=seed,
        wall_epoch=wall_epoch,
    )
