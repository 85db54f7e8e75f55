"""A leaky bucket without burst (nginx's ``limit_req``): the least spacing it accepts, searched."""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

from .._controller import SlotState
from ._sends import at_most

if TYPE_CHECKING:
    from ._sends import SendLog
    from ._tuning import Config

__all__ = ["Shown", "Spacing"]

INF = math.inf
#: The guard halves over ``spacing_narrow_over`` acceptances.
NARROW = 0.5


class Shown(enum.Enum):
    """What the answers judged last say of a leaky bucket without burst."""

    NOTHING = "nothing new"
    FOUND = "refused well sooner after an acceptance than every gap accepted"
    LOST = "refused at gaps it had accepted at the widest guard: a window, not a bucket"
    GUARDED = "refused at a gap it had accepted: paced further above the shortest accepted"


class Spacing(SlotState):
    """The spacing a leaky bucket without burst accepts: between the gaps it refused and accepted.

    Such a bucket accepts a request only at least its interval after the
    last one it accepted (a refused one does not count), so every gap it
    accepted is at least the interval and every gap it refused is less: the
    interval lies in ``(lo, hi]``. A rate that only counts requests reads
    this badly (a second that is speeding up undercounts, and a search that
    doubles the rate sends its first early request half an interval after
    the last). A window, or a bucket with burst, accepts a burst at gaps
    shorter than any it refuses. So a refusal whose gap is well short of
    the last gaps accepted, and shorter than any ever accepted, shows such
    a bucket (a limit that tells a wait is not searched so: each try would
    cost the wait); from then on the scope is paced at ``hi``
    (and a guard for the network and the server's clock), tries step down
    from ``hi`` a resolution at a time (or to the middle of the bounds, if
    nearer) until the bounds are that close, and after a hold the lower
    bound is widened to look for a rise.

    Answers are judged in the order sent, once every send before them has
    answered (a refusal comes back at once, an accepted request only after
    the server's work): until then a refusal's gap is not known.
    """

    __slots__ = (
        "config",
        "found",
        "guard",
        "hi",
        "hold",
        "judged_to",
        "last_ok",
        "least",
        "lo",
        "on",
        "patience",
        "pending",
        "probe_at",
        "recent",
        "rising",
        "run",
        "run_ok",
        "slowest",
        "step",
        "stepped",
        "try_at",
    )
    STATE = tuple(name for name in __slots__ if name != "config")

    def __init__(self, config: Config) -> None:
        tuning = config.tuning
        self.config = config
        self.on = False  # whether a leaky bucket without burst showed
        self.lo = 0.0  # the longest gap refused since the bounds were set (seconds)
        self.hi = INF  # the shortest gap accepted since
        self.found = INF  # the shortest gap accepted since the bucket showed (not moved up)
        self.guard = tuning.spacing_guard  # the share paced above ``hi``
        self.patience = 1  # how many times slower than at first the pace moves back down
        self.hold = config.hold  # seconds settled before looking for a rise
        self.try_at = INF  # no try below ``hi`` before this
        self.probe_at = INF  # when to look for a rise
        self.rising = False  # a look for a rise, not refused yet
        self.step = tuning.spacing_rise  # how far below ``hi`` it looks for a rise
        self.run = 0  # refusals at gaps it had accepted, since the last look for a rise
        self.run_ok = 0  # acceptances judged since the last of them
        self.pending: list[float] = []  # refusals (send instants) not judged yet
        self.stepped: list[float] = []  # those sent while searching up in a leaky bucket's steps
        self.judged_to = -INF  # the answers sent up to this instant are judged
        self.last_ok: float | None = None  # the last acceptance judged (send instant)
        self.recent: list[float] = []  # the last gaps between acceptances
        self.least = INF  # the shortest gap ever accepted (a burst's, if there was one)
        self.slowest = 0.0  # the longest recent latency of an acceptance (seconds)

    def __repr__(self) -> str:
        return f"<Spacing on={self.on} lo={self.lo:.4g} hi={self.hi:.4g}>"

    @property
    def pace(self) -> float:
        """The spacing held once settled: the guard above the shortest gap accepted."""
        return self.hi * (1.0 + self.guard)

    def refused(self, sent_at: float, now: float, *, stepped: bool = False) -> None:
        """A refusal of ``sent_at``: judged once what was sent before it has answered.

        ``stepped``: sent while the search up went in a leaky bucket's steps.
        """
        self.pending.append(sent_at)
        if stepped:
            self.stepped.append(sent_at)
        if self.on:
            self.try_at = max(self.try_at, now + self.config.tuning.spacing_settle)

    def answered(self, latency: float) -> None:
        """An acceptance took ``latency`` seconds: answers are judged so long after their send."""
        self.slowest = max(latency, self.config.tuning.spacing_slowest_decay * self.slowest)

    def judge(self, log: SendLog, now: float) -> Shown:
        """Judge the answers sent long enough ago that all sent before them have answered."""
        verdict = Shown.NOTHING
        pending = self.pending
        lag = self.config.tuning.spacing_lag * self.slowest
        for sent_at, ok in log.between(self.judged_to, now - lag):
            self.judged_to = sent_at
            if ok:
                self._accepted(sent_at)
            elif pending and sent_at in pending:
                pending.remove(sent_at)
                was, pace = self.on, self.pace
                self._refused(sent_at, now)
                if self.on != was:
                    verdict = Shown.FOUND if self.on else Shown.LOST
                elif self.on and self.pace > pace:
                    verdict = Shown.GUARDED
        self.pending = [sent_at for sent_at in pending if sent_at > self.judged_to]
        self.stepped = [sent_at for sent_at in self.stepped if sent_at > self.judged_to]
        return verdict

    def interval(self, now: float) -> float:
        """The spacing to send at now: a try between the bounds, or the shortest accepted."""
        tuning = self.config.tuning
        lo, hi = self.lo, self.hi
        # (A step refused sets lo to hi over the resolution: narrow, whatever the rounding.)
        narrow = at_most(hi, lo * (1.0 + tuning.spacing_resolution))
        if narrow and now >= self.probe_at:
            # Settled for a hold: look for a rise.
            self.lo = lo = hi / (1.0 + self.step)
            self.rising, narrow, self.run = True, False, 0
            self.probe_at = INF
        if not narrow and now >= self.try_at:
            # No further below the shortest gap accepted than the resolution:
            # a try accepted costs nothing and moves ``hi`` down, one refused
            # costs a refusal (halving (0.064, 0.126] s at nginx's 10 r/s cost
            # three; stepping down costs one, and five sends more).
            return max((lo + hi) / 2.0, hi / (1.0 + tuning.spacing_resolution))
        return self.pace

    def _accepted(self, sent_at: float) -> None:
        """An acceptance: its gap after the last one bounds the interval from above."""
        tuning = self.config.tuning
        last, self.last_ok = self.last_ok, sent_at
        if last is None:
            return
        gap = sent_at - last
        self.run_ok += 1
        self.recent = [*self.recent, gap][-tuning.spacing_fewest :]
        self.least = min(self.least, gap)
        if not self.on:
            return
        narrowed = self.guard * NARROW ** (1.0 / (tuning.spacing_narrow_over * self.patience))
        self.guard = max(tuning.spacing_guard, narrowed)
        if gap >= self.hi:
            self._back_down()
            return
        self.hi = self.found = gap
        near = self.lo * (1.0 + tuning.spacing_resolution)
        if gap * (1.0 + tuning.spacing_resolution) < self.lo or (self.rising and gap <= near):
            # Accepted well sooner than refused before, or as soon as a look
            # for a rise went: the limit rose. Look twice as far while accepted.
            self.step *= 2.0
            self.lo = gap / (1.0 + self.step)
            self.rising = True

    def _refused(self, sent_at: float, now: float) -> None:
        """A refusal: its gap after the last acceptance bounds the interval from below."""
        tuning = self.config.tuning
        if self.last_ok is None:
            return
        gap = sent_at - self.last_ok
        if not self.on:
            recent = self.recent
            if recent and gap >= min(recent):
                # Refused at a gap it had just accepted: no such bucket for
                # the gaps since (a bucket with burst spending it refuses at
                # gaps as long as and shorter than those).
                self.recent = []
                return
            apart = tuning.stepped_apart if sent_at in self.stepped else tuning.spacing_apart
            if (
                len(recent) < tuning.spacing_fewest
                or gap * apart > min(recent)
                or gap >= self.least  # a burst was accepted: a window, or a bucket with burst
            ):
                return
            self.on, self.lo, self.hi, self.run, self.run_ok = True, gap, min(recent), 0, 0
            self.found = self.hi
            self.guard, self.hold = tuning.spacing_guard, self._least_hold(self.hi)
            self.patience = 1
        elif gap >= self.hi * tuning.spacing_apart:
            # Refused this far past a gap it accepted: no leaky bucket of
            # that interval (a bucket with burst, whose burst went through
            # at short gaps, or a window; never taken for one again).
            self.on, self.least = False, 0.0
            return
        elif gap >= self.hi:
            if not self._at_accepted_gap(gap):
                return
        else:
            self.lo = max(self.lo, gap)
        if self.rising:
            self.hold = min(max(self.config.max_hold, self.hold), 2.0 * self.hold)
        self.rising, self.step = False, tuning.spacing_rise
        self.try_at = now + tuning.spacing_settle
        self.probe_at = now + self.hold

    def _at_accepted_gap(self, gap: float) -> bool:
        """A refusal no sooner than a gap accepted; whether it bounds the interval still.

        The network and the server's clock moved the sends (pace further
        above the shortest gap accepted), or the limit dropped. The guard
        doubles for those more often than the share kept (and narrows
        again per acceptance). Once it cannot double, the pace moves up a
        resolution (the shortest gap accepted can be the network's luck:
        nginx's millisecond clock at 100 r/s accepts 9.6 ms; moved up to the
        gap refused, three processes paced 128 ms at nginx's 10 r/s); a few
        there before it narrows are a window's or a bucket with burst's,
        whose burst lowered the shortest gap accepted (never taken for one
        again).
        """
        tuning = self.config.tuning
        before, after = self.hi * (1.0 + self.guard / 2.0), self.pace
        if gap < (before + after) / 2.0:
            # Nearer the pace before the guard last widened than the pace
            # after: sent before, for a refusal judged already.
            return False
        often = self.run_ok < tuning.spacing_widen_apart
        widest = 2.0 * self.guard > tuning.spacing_max_guard  # it cannot double
        close = self.run_ok < tuning.spacing_run_within
        self.run = self.run + 1 if widest and close else int(widest)
        self.run_ok = 0
        if self.run >= tuning.spacing_runs:
            self.on, self.least = False, 0.0
            return False
        if not often:
            # Refused again once moved back down: moved down half as fast from
            # now on (each such refusal costs more than the pace gains: a
            # sliding second of 10 behind 5 ms of jitter was refused every 100
            # acceptances so).
            self.patience = min(2 * self.patience, tuning.spacing_patience)
        if widest:
            self.hi *= 1.0 + tuning.spacing_resolution
        elif often:
            self.guard = min(tuning.spacing_max_guard, 2.0 * self.guard)
            self.patience = 1
        self.lo = self.hi / (1.0 + tuning.spacing_resolution)
        return True

    def _back_down(self) -> None:
        """After a quiet stretch, a pace moved up at the widest guard steps back toward ``found``.

        The sends' lateness on a loaded machine comes and goes: moved up at
        each refusal and never back (only a look for a rise, which every
        refusal put off, went below), nginx's 10 r/s was paced at 8/s for
        the last 9 s of a run. A step per ``spacing_widen_apart``
        acceptances without a refusal (times the patience: a step refused
        again waits twice as long) keeps such refusals that rare.
        """
        tuning = self.config.tuning
        apart = tuning.spacing_widen_apart * self.patience
        if self.hi <= self.found or not self.run_ok or self.run_ok % apart:
            return
        self.hi = max(self.found, self.hi / (1.0 + tuning.spacing_resolution))
        self.lo = self.hi / (1.0 + tuning.spacing_resolution)

    def _least_hold(self, interval: float) -> float:
        """A hold long enough that a refused look for a rise costs a small share of the sends."""
        return max(self.config.hold, interval / self.config.tuning.probe_cost)
