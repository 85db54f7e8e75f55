"""What a simulation recorded: every request, and every scope's state over time."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator, Mapping
from typing import Literal

import attrs

from .._policy import ScopePolicy
from .._stats import ScopeStatistics

__all__ = ["Bucket", "Outcome", "RequestRecord", "Sample", "Trace"]

#: How a simulated request ended.
#:
#: * ``"response"``: a response arrived (see ``status``);
#: * ``"error"``: the request failed without a response (see ``exception``);
#: * ``"timeout"``: no grant within the request's ``timeout``;
#: * ``"cancelled"``: the caller gave up (``cancel_after``) while waiting or in flight;
#: * ``"interrupted"``: the simulation ended while it was in flight;
#: * ``"unsent"``: the simulation ended before it was granted (or before it arrived).
Outcome = Literal["response", "error", "timeout", "cancelled", "interrupted", "unsent"]


@attrs.frozen(kw_only=True)
class RequestRecord:
    """One simulated request from arrival to release (times in virtual seconds).

    ``sent_seq``, ``response_seq`` and ``released_seq`` order events that
    happen at the same virtual instant: every event of a run has a unique,
    increasing sequence number.

    :param index: position of the request in the workload (sorted by arrival).
    :param url: the request's URL.
    :param scopes: the granted scopes and the cost taken from each (empty when
        never granted).
    :param priority: the request's priority.
    :param arrived: when it asked for a permit (``None``: after the simulation ended).
    :param sent: when it was granted and sent (``None``: never).
    :param responded: when its response or failure arrived (``None``: never).
    :param released: when it gave its concurrency back (``None``: never held any,
        or the simulation ended first).
    :param status: the response's status (``None`` without a response).
    :param exception: the failure's class name (``"TimeoutError"``), if any.
    :param latency: seconds from send to response.
    :param size: body size in bytes.
    :param headers: the response headers.
    :param blocked: the response was a soft-block page (ground truth).
    :param outcome: how the request ended (see :data:`Outcome`).
    """

    index: int
    url: str
    scopes: Mapping[str, float] = attrs.field(factory=dict, eq=False)
    priority: int = 0
    arrived: float | None = None
    sent: float | None = None
    responded: float | None = None
    released: float | None = None
    status: int | None = None
    exception: str | None = None
    latency: float | None = None
    size: int | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    blocked: bool = False
    outcome: Outcome = "unsent"
    sent_seq: int = -1
    response_seq: int = -1
    released_seq: int = -1

    @property
    def waited(self) -> float | None:
        """Seconds between arrival and send (``None`` if never sent)."""
        if self.sent is None or self.arrived is None:
            return None
        return self.sent - self.arrived

    @property
    def ok(self) -> bool:
        """A response with a status below 400 that is not a soft-block page."""
        return self.status is not None and self.status < 400 and not self.blocked


@attrs.frozen(kw_only=True)
class Sample:
    """One scope's statistics right after an event that touched it.

    :param time: the virtual time of the event.
    :param seq: the event's sequence number (see :class:`RequestRecord`).
    :param stats: the scope's :class:`~throttlekit.ScopeStatistics` then.
    """

    time: float
    seq: int
    stats: ScopeStatistics

    @property
    def delay(self) -> float:
        """The effective delay between sends."""
        return self.stats.delay

    @property
    def backoff_level(self) -> int:
        """Steps of backoff in force (0 = not backing off)."""
        return self.stats.backoff_level


@attrs.frozen(kw_only=True)
class Bucket:
    """A slice ``[start, end)`` of a run, for rate and error charts.

    :param sent: requests sent in the slice.
    :param ok: responses with status < 400 (soft blocks excluded).
    :param throttled: 429 responses.
    :param errors: 5xx responses and failures without a response.
    :param blocked: soft-block pages.
    :param delay: the effective delay at the end of the slice (the mean over
        scopes when several are charted; ``nan`` before the first sample).
    :param in_flight: most requests in flight at a sample in the slice.
    :param backoff_level: highest backoff level at the end of the slice.
    """

    start: float
    end: float
    sent: int
    ok: int
    throttled: int
    errors: int
    blocked: int
    delay: float
    in_flight: int
    backoff_level: int

    @property
    def rate(self) -> float:
        """Sends per second in the slice."""
        return self.sent / (self.end - self.start)


@attrs.frozen(kw_only=True)
class Trace:
    """Everything a :func:`~throttlekit.testing.simulate` run recorded.

    :param requests: one :class:`RequestRecord` per request, in workload order.
    :param samples: per scope, a :class:`Sample` after every event that touched it.
    :param policies: the policy of every scope that was used.
    :param concurrency: the limiter's global cap (``None`` = unlimited).
    :param duration: the virtual time at which the run ended.
    :param seed: the seed of the run.
    :param wall_epoch: the epoch seconds the run's wall clock showed at
        virtual time 0 (``None``: the real clock).

    Usage::

        trace = simulate(ScopePolicy(delay=1.0), FixedServer(), burst("https://a.test/", 5))
        [record.sent for record in trace.requests]  # [0.0, 1.0, 2.0, 3.0, 4.0]
    """

    requests: tuple[RequestRecord, ...]
    samples: Mapping[str, tuple[Sample, ...]]
    policies: Mapping[str, ScopePolicy]
    concurrency: int | None
    duration: float
    seed: int
    wall_epoch: float | None = None

    def wall(self, at: float) -> float:
        """The wall clock at virtual time ``at`` (the real one now when the run had none)."""
        return time.time() if self.wall_epoch is None else self.wall_epoch + at

    def __repr__(self) -> str:
        sent = sum(1 for record in self.requests if record.sent is not None)
        return (
            f"<Trace duration={self.duration:g} requests={len(self.requests)} sent={sent} "
            f"scopes={len(self.samples)}>"
        )

    @property
    def scopes(self) -> list[str]:
        """Every scope a request was granted on, sorted."""
        return sorted(self.policies)

    def sends(self, scope: str | None = None) -> list[RequestRecord]:
        """The requests that were sent (in ``scope``, if given), in send order."""
        sent = [
            record
            for record in self.requests
            if record.sent is not None and (scope is None or scope in record.scopes)
        ]
        sent.sort(key=lambda record: record.sent_seq)
        return sent

    def send_times(self, scope: str | None = None) -> list[float]:
        """The send times (in ``scope``, if given), in send order."""
        return [record.sent for record in self.sends(scope) if record.sent is not None]

    def count(
        self,
        *,
        status: int | None = None,
        outcome: Outcome | None = None,
        scope: str | None = None,
    ) -> int:
        """How many requests match every given filter."""
        return sum(
            1
            for record in self.requests
            if (status is None or record.status == status)
            and (outcome is None or record.outcome == outcome)
            and (scope is None or scope in record.scopes)
        )

    def throughput(
        self, scope: str | None = None, *, start: float = 0.0, end: float | None = None
    ) -> float:
        """Good responses (status < 400, no soft block) per second that arrived in ``[start, end)``.

        ``end`` defaults to the end of the run (responses at that very instant count).
        """
        end = self.duration if end is None else end
        if end <= start:
            return 0.0
        good = sum(
            1
            for record in self.requests
            if record.ok
            and record.responded is not None
            and start <= record.responded
            and (record.responded < end or record.responded == end == self.duration)
            and (scope is None or scope in record.scopes)
        )
        return good / (end - start)

    def _delay_steps(self, scope: str) -> tuple[list[float], list[float]]:
        samples = self.samples.get(scope, ())
        return [sample.time for sample in samples], [sample.delay for sample in samples]

    def mean_delay(self, scope: str | None = None) -> float:
        """The time-weighted mean effective delay, from the first sample to the end.

        With ``scope=None``, the mean over every scope. ``nan`` without samples.
        """
        scopes = [scope] if scope is not None else list(self.samples)
        means = []
        for name in scopes:
            times, delays = self._delay_steps(name)
            if not times:
                continue
            span = self.duration - times[0]
            if span <= 0:
                means.append(delays[-1])
                continue
            total = 0.0
            for index, value in enumerate(delays):
                until = times[index + 1] if index + 1 < len(times) else self.duration
                total += value * (until - times[index])
            means.append(total / span)
        return sum(means) / len(means) if means else math.nan

    def settle_time(self, scope: str | None = None, *, tolerance: float = 0.1) -> float:
        """When the effective delay stopped moving: from then on it stays within
        ``tolerance`` (a fraction) of its final value.

        ``0.0`` when it never left that band. With ``scope=None``, the latest over
        every scope.
        """
        scopes = [scope] if scope is not None else list(self.samples)
        settled = 0.0
        for name in scopes:
            times, delays = self._delay_steps(name)
            if not times:
                continue
            final = delays[-1]
            band = tolerance * max(abs(final), 1e-9)
            for index in range(len(delays) - 1, -1, -1):
                if abs(delays[index] - final) > band:
                    settled = max(settled, times[index + 1])
                    break
        return settled

    def timeline(self, bucket: float, scope: str | None = None) -> list[Bucket]:
        """The run cut into slices of ``bucket`` seconds (for charts).

        With ``scope=None``, requests of every scope count and the delay is the
        mean over scopes.
        """
        if not bucket > 0:
            raise ValueError(f"bucket must be > 0 seconds, got {bucket!r}")
        count = max(1, math.ceil(self.duration / bucket - 1e-9))
        sent = [0] * count
        ok = [0] * count
        throttled = [0] * count
        errors = [0] * count
        blocked = [0] * count

        def slot(time: float) -> int:
            return min(count - 1, max(0, int(time / bucket)))

        for record in self.requests:
            if scope is not None and scope not in record.scopes:
                continue
            if record.sent is not None:
                sent[slot(record.sent)] += 1
            if record.responded is None:
                continue
            index = slot(record.responded)
            if record.status == 429:
                throttled[index] += 1
            elif record.exception is not None or (
                record.status is not None and record.status >= 500
            ):
                errors[index] += 1
            elif record.blocked:
                blocked[index] += 1
            elif record.ok:
                ok[index] += 1
        scopes = [scope] if scope is not None else list(self.samples)
        series = [self.samples.get(name, ()) for name in scopes]
        series_times = [[sample.time for sample in samples] for samples in series]
        buckets = []
        for index in range(count):
            start, end = index * bucket, min(self.duration, (index + 1) * bucket)
            if end <= start:
                end = start + bucket
            delays, levels, in_flight = [], [], 0
            for samples, times in zip(series, series_times, strict=True):
                last = bisect.bisect_left(times, end) - 1
                if last >= 0:
                    delays.append(samples[last].delay)
                    levels.append(samples[last].backoff_level)
                first = bisect.bisect_left(times, start)
                for sample in samples[first : last + 1]:
                    in_flight = max(in_flight, sample.stats.in_flight)
            buckets.append(
                Bucket(
                    start=start,
                    end=end,
                    sent=sent[index],
                    ok=ok[index],
                    throttled=throttled[index],
                    errors=errors[index],
                    blocked=blocked[index],
                    delay=sum(delays) / len(delays) if delays else math.nan,
                    in_flight=in_flight,
                    backoff_level=max(levels, default=0),
                )
            )
        return buckets

    def iter_events(self, scope: str) -> Iterator[tuple[int, str, RequestRecord]]:
        """Sends, responses and releases of ``scope`` as ``(seq, kind, record)``, in order.

        ``kind`` is ``"send"``, ``"response"`` or ``"release"``.
        """
        events: list[tuple[int, str, RequestRecord]] = []
        for record in self.requests:
            if scope not in record.scopes:
                continue
            if record.sent_seq >= 0:
                events.append((record.sent_seq, "send", record))
            if record.response_seq >= 0:
                events.append((record.response_seq, "response", record))
            if record.released_seq >= 0:
                events.append((record.released_seq, "release", record))
        events.sort(key=lambda event: event[0])
        return iter(events)
