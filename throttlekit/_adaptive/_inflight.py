"""The detector of a limit on requests in flight (nginx's ``limit_conn``), not a rate limit."""

from __future__ import annotations

import enum
import math

from .._controller import SlotState
from ._sends import SendLog
from ._tuning import AdaptiveTuning

__all__ = ["InFlightLimit", "Verdict"]

#: Answers kept to count what was in flight when a refused request was
#: sent: its refusal comes back within a few ms, and few answer meanwhile.
ANSWERS_KEPT = 32


class Verdict(enum.Enum):
    """What a refusal says of a limit on requests in flight."""

    NOTHING = "no such limit shown"
    FOUND = "refused at one number in flight each time, at rates that differ"
    KNOWN = "refused at or above the limit found: sent before the cap took hold"
    DISPROVED = "refused below the limit found, or at its cap once it held: no such limit"

    @property
    def handled(self) -> bool:
        """Whether the refusal is that limit's, and needs nothing more."""
        return self in (Verdict.FOUND, Verdict.KNOWN)


class InFlightLimit(SlotState):
    """Refusals at one number in flight, at rates that differ, are a limit on requests in flight.

    A server that limits requests in flight refuses at the same count
    whatever the rate (which varies with its latency), and never accepts
    more at once than that count; a rate limit refuses at the same rate
    whatever the count. Refusals at one count are a limit in flight when
    their rates differ, or when no answer accepted since was sent with
    more in flight. A refusal at a lower count disproves it, unless the
    limit was read at a full cap: then it was only a bound.

    A refusal is counted with what was in flight when it was sent: those
    answered between its send and its refusal were in flight then (nginx's
    ``limit_conn 4`` before a 20 ms origin, at 200/s, read 3 at one refusal
    in five, and was taken for a limit of 3). That count reads high, never
    low: it also counts requests answered whose answers are not counted
    yet. With the cap full, those are others refused as each freed slot is
    refilled at once, so the reading is the cap, whatever the server's
    limit below it; a lower reading refines it. (A rate limit at a full
    cap refuses at no lower count: below the cap, the readings are real
    ones.) And those answered within the refusal's round trip may have
    left the server before it came (the same limit before a 100 ms origin
    read 4, 5 and 4 at three refusals in a row, in one process). So a
    refusal reads a range, from the count still in flight at its refusal
    up to that at its send; refusals whose ranges meet are at one count,
    the lowest of their counts at send.

    Where the count is not exact (a backend shared by processes counts its
    leases, among them ones granted but not yet sent and ones answered but
    not yet released), counts ``inflight_noise`` apart are one count, the
    limit is the lowest, and a refusal that much below the limit found
    lowers it rather than disproving it.

    A refusal with far more in flight than the rate accepted holds on
    average is no evidence either way (see :meth:`_burst`).
    """

    STATE = (
        "above",
        "answers",
        "bound",
        "capped",
        "count",
        "found",
        "found_at",
        "lowered",
        "refusals",
        "refuted",
    )
    __slots__ = (*STATE, "tuning")

    def __init__(self, tuning: AdaptiveTuning) -> None:
        self.tuning = tuning
        self.count: int | None = None  # the limit on requests in flight, once found
        self.found = 0  # the count it was found at (it may show one lower since)
        self.found_at = 0.0  # when the cap at ``count`` took hold
        self.capped = 0  # refusals at the cap of requests sent since
        self.lowered = False  # whether refusals at the cap lowered an inexact count found
        self.refuted = False  # whether refusals at a cap disproved a limit found
        self.bound = False  # whether it was read at a full cap (a bound only)
        # [in flight, rate, in flight still at the refusal] of the last refusals
        self.refusals: list[list[float]] = []
        # Whether an answer accepted since the first of those refusals had
        # more in flight than they had (a limit on requests in flight does
        # not accept more than it refuses at).
        self.above = False
        self.answers: list[list[float]] = []  # [sent at, answered at] of the last accepted

    def __repr__(self) -> str:
        return f"<InFlightLimit count={self.count}>"

    def accepted(self, sent_at: float, now: float, *, exact: bool = True) -> None:
        """An accepted answer, now, to the request sent at ``sent_at``.

        ``exact``: whether the count is exact (see the class).
        """
        refusals = self.refusals
        if refusals and self._at_send(sent_at) + 1 > refusals[-1][0] + self._noise(exact):
            self.above = True
        answers = self.answers
        answers.append([sent_at, now])
        del answers[:-ANSWERS_KEPT]

    def _at_send(self, sent_at: float) -> int:
        """Of the requests accepted, how many were in flight when ``sent_at`` was sent.

        (A refused one is not counted by the server: it refuses at once.)
        """
        return sum(1 for sent, answered in self.answers if sent < sent_at < answered)

    def refused(
        self,
        flying: int,
        sent_at: float,
        now: float,
        log: SendLog,
        *,
        cap: int | None = None,
        judge: bool = True,
        exact: bool = True,
        latency: float | None = None,
    ) -> Verdict:
        """A refusal, now, of a request sent at ``sent_at``, with ``flying`` others in flight now.

        ``cap`` is the concurrency in force (``None``: none). With ``judge``
        false it is only counted (an error that may be a random one: the
        caller judges once errors are many). ``exact``: whether the count
        is exact (see the class). ``latency``: the mean latency of accepted
        requests, if known (see :meth:`_burst`).
        """
        still = flying
        flying = self._at_send_of_refused(flying, sent_at, now, latency)
        tuning = self.tuning
        noise = self._noise(exact)
        if self.count is not None:
            return self._again(flying, sent_at, now, cap, exact=exact)
        if latency is not None and self._burst(flying - noise, sent_at, log, latency):
            return Verdict.NOTHING
        horizon = tuning.edge_horizon
        rate = log.measured(sent_at - horizon, sent_at, accepted=True) + flying
        refusals = self.refusals
        if refusals and not _meet([refusals[-1], [flying, rate, still]], noise):
            self.above = False
        refusals.append([flying, rate, still])
        del refusals[: -tuning.inflight_refusals]
        counts = [count for count, *_ in refusals]
        rates = [rate for _, rate, *_ in refusals]
        if (
            not judge
            or len(refusals) < tuning.inflight_refusals
            or not _meet(refusals, noise)
            or min(counts) < tuning.inflight_fewest
            or ((self.above or self.refuted) and max(rates) <= tuning.inflight_spread * min(rates))
        ):
            return Verdict.NOTHING
        self._found(int(min(counts)), cap, now)
        return Verdict.FOUND

    def _at_send_of_refused(
        self, flying: int, sent_at: float, now: float, latency: float | None
    ) -> int:
        """``flying`` in flight now, with those accepted since ``sent_at`` that were sent before.

        Only for a refusal answered sooner than an acceptance takes (``latency``):
        judged later, those in flight now were sent since.
        """
        if latency is None or now - sent_at >= latency:
            return flying
        return flying + self._at_send(sent_at)

    def _again(
        self, flying: int, sent_at: float, now: float, cap: int | None, *, exact: bool
    ) -> Verdict:
        """A refusal once the limit was found: below it, it disproves or refines it.

        At it, sent once the cap held, it counts against it: a limit on
        requests in flight capped at its count refuses no more (nginx's
        ``limit_conn 4``, capped at 4, refused none in the rest of a 40 s
        run), where a rate limit taken for one goes on refusing at the cap
        (a leaky bucket at 100/s, its sends up to 20 ms late, read 4, 4
        and 4 in flight, and held at 2 in flight refused 8 % of a run).
        Where the count is not exact, the cap is first lowered (see
        :meth:`_refused_at_cap`). Once so refuted, refusals at one count
        show a limit in flight only at rates that differ.
        """
        if flying < self.found - self._noise(exact):  # refused below the limit found
            if not self.bound or flying < self.tuning.inflight_fewest:
                self._disproved()
                return Verdict.DISPROVED
            self._found(flying, cap, now)  # it was a bound: this reads it lower
            return Verdict.FOUND
        assert self.count is not None
        if flying < self.count:  # a count read high: the cap let one too many through
            self.count, self.found_at, self.capped = flying, now, 0
            return Verdict.FOUND
        if sent_at > self.found_at:
            self.capped += 1
            if self.capped >= self.tuning.inflight_refusals:
                return self._refused_at_cap(now, exact=exact)
        return Verdict.KNOWN

    def _refused_at_cap(self, now: float, *, exact: bool) -> Verdict:
        """Refusals at the cap of requests sent once it held: a rate limit's, or a count read high.

        Where the count is exact, they disprove the limit. Where it is not,
        the count found may have read high by ``inflight_noise`` (three
        processes sharing nginx's ``limit_conn 4`` through Redis found 5 or
        6 from their leases, and about 50 refusals came at that cap in 6 s):
        the cap is lowered by that, once, and refusals at the lowered cap
        disprove it.
        """
        assert self.count is not None
        lower = self.count - self._noise(exact)
        if exact or self.lowered or lower < self.tuning.inflight_fewest:
            self._disproved()
            self.refuted = True
            return Verdict.DISPROVED
        self.count, self.found_at, self.capped, self.lowered = lower, now, 0, True
        return Verdict.FOUND

    def _disproved(self) -> None:
        """Not (only) a limit on requests in flight."""
        self.count, self.refusals = None, []

    def _burst(self, flying: int, sent_at: float, log: SendLog, latency: float) -> bool:
        """Whether ``flying`` in flight is far more than the rate accepted holds on average.

        A limit on requests in flight refuses only once it is full, and is
        full on average (the rate it accepts times its latency: Little's
        law). A rate limit's burst, of answers back within a millisecond or
        two, refuses with a few in flight that its rate never holds. (The
        rate counts those still in flight: their answers are not logged.)
        """
        oldest = log.oldest()
        if oldest == math.inf:
            return False
        start = max(sent_at - self.tuning.edge_horizon, oldest)
        rate = log.measured(start, sent_at, accepted=True, extra=flying)
        return flying > self.tuning.inflight_held * rate * latency

    def _found(self, count: int, cap: int | None, now: float) -> None:
        """``count`` is the limit: only a bound if read with the concurrency ``cap`` full."""
        self.count = self.found = count
        self.found_at, self.capped, self.lowered = now, 0, False
        self.bound = cap is not None and count + 1 >= cap

    def _noise(self, exact: bool) -> int:
        """How far apart counts of one limit may read."""
        return 0 if exact else self.tuning.inflight_noise

    def counts(self) -> str:
        """The counts in flight of the refusals that found the limit, for the log."""
        return "/".join(_reading(refusal) for refusal in self.refusals)

    def rates(self) -> str:
        """The rates of the refusals that found the limit, for the log."""
        return "/".join(f"{rate:.3g}" for _, rate, *_ in self.refusals)


def _meet(refusals: list[list[float]], noise: int) -> bool:
    """Whether refusals' ranges of counts in flight meet, ``noise`` apart at most.

    A refusal reads from its count still in flight at its refusal
    (:func:`_still`) up to its count at send.
    """
    lowest = min(count for count, *_ in refusals)
    return max(map(_still, refusals)) - lowest <= noise


def _reading(refusal: list[float]) -> str:
    """A refusal's count in flight, as a range where it reads one (``4-5``)."""
    count, still = int(refusal[0]), int(_still(refusal))
    return str(count) if still >= count else f"{still}-{count}"


def _still(refusal: list[float]) -> float:
    """A refusal's count still in flight at its refusal (a state kept by an older version
    has none: its count at send)."""
    return refusal[2] if len(refusal) > 2 else refusal[0]
