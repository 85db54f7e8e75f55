"""Adaptive: find and hold the rate and concurrency a server allows."""

from __future__ import annotations

import bisect
import logging
import math
from typing import TYPE_CHECKING

import attrs

from ._backoff import DEFAULT_BACKOFF_EXCEPTIONS, Backoff
from ._checks import above_zero_below_one, at_least_one, positive
from ._controller import SlotState, remember_outcome
from .headers import parse

if TYPE_CHECKING:
    from ._controller import Feedback, ScopeView
    from ._policy import ScopePolicy

__all__ = ["Adaptive", "AdaptiveState"]

logger = logging.getLogger("throttlekit.adaptive")

INF = math.inf

#: Statuses that mean "overloaded" when they carry no ``Retry-After``.
_OVERLOAD_CODES = frozenset({500, 502, 503, 504, 520, 521, 522, 523, 524})
#: The horizon (seconds) over which a throttle's edge is measured, until the
#: server shows a longer window.
_EDGE_HORIZON = 1.0
#: Answered sends remembered (``[sent_at, accepted]``): the last two horizons, at most
#: this many (above 128/s a request is under 1 % of the count; the state stays small).
_SENDS = 256
#: Vegas thresholds: grow below this many requests queued at the server, shrink above the other.
_QUEUE_LOW = 1.5
_QUEUE_HIGH = 4.0
#: The share of the time a failed probe may cost (the server's wait after it):
#: with the 2 % headroom and some unevenness, 95 % of the edge or more.
_PROBE_COST = 0.015
#: An edge below this share of the last one means the limit dropped.
_MOVED = 0.8
#: Accepted sends in a row after an overload cut that prove its errors came
#: from the rate, not at random: a server failing 10 % of requests at any rate
#: passes 40 in a row 1.5 times in 100 (5 %: 13 times).
_CLEAN_PROOF = 40
#: The widest the margin below the edge grows when refusals come while holding.
_MAX_MARGIN = 0.5
#: While holding below the edge of a limit that refuses with errors, the
#: share of errors among the sends of the last two horizons above which they
#: are its refusals (the edge is lower than measured), not random ones.
_HOLD_ERRORS = 0.1
#: Fewer errors widen the margin up to this (what random errors may cost
#: while they look like a limit's refusals), when three or more come within
#: ``_WIDEN_SPAN`` seconds and make ``_WIDEN_SHARE`` of the sends or more.
_ERROR_MARGIN = 0.08
_WIDEN_SPAN = 10.0
_WIDEN_SHARE = 0.02
#: Once they widened it, errors that come at this share of the one that did
#: or more, held lower, are random ones (a limit's refusals thin out there).
_WIDEN_RANDOM = 0.8
#: Cuts for such errors while holding, in a row, after which they are taken
#: for random ones (a cut below a limit's edge stops its refusals).
_HOLD_CUTS = 2
#: A hold after an overload cut whose errors are below this share of the
#: share that cut (the cut thinned them, as a limit's refusals thin) is tried
#: lower, at the rate that got through.
_THINNED = 0.5
#: The latencies of one round: enough for a stable mean of varied service times, or,
#: when they come slowly, at least the fewer ones of ``_ROUND_TIME`` seconds.
_ROUND = 30
_ROUND_FEWEST = 3
_ROUND_TIME = 2.0
#: The windowed minimum RTT keeps two epochs of this length.
_RTT_EPOCH = 30.0
#: Fewest rounds the floor's correction counts (two standard errors, at least).
_FEW_ROUNDS = math.exp(2.0)
#: A failure after this many seconds, and this many times the mean latency,
#: hung: the server was not serving it.
_HUNG = 1.0
_HUNG_LATENCIES = 4.0

#: The jitter of a scope paced at a measured limit: none.
_EVEN = (0.0, 0.0)


@attrs.frozen(kw_only=True)
class Adaptive:
    """Find and hold what a server allows: its rate limit and its capacity.

    Give a scope a ceiling (``ScopePolicy(concurrency=16, delay=0, ...)``) and
    Adaptive finds how fast the server lets it go, without the refusals a
    fixed guess costs. Two loops, each driven by the signal it can trust:

    * **Rate** (policy limits: 429s, ``Retry-After``). It starts slowly
      (``start_rate`` per second, doubling every half second while the scope
      uses it) instead of bursting into an unknown quota. On a throttle (a
      429, or any response with ``Retry-After``) it measures the *edge*: how
      many requests the server accepted in the second before the refused
      one (for a probe's refusal, also up to the last accepted send: a
      leaky bucket refuses a request that comes a little early). It pauses
      until the server's window has drained what was sent above the edge,
      resumes just below it and holds ``headroom`` below it
      for a while (longer each time the same edge is confirmed, and long
      enough that a probe's cost stays small), then probes upward, slowly at
      first; once the server accepts well past the old edge (by the pace
      of the acceptances, which at a few per second is finer than their
      count) the limit rose and it searches upward as at the start. If that
      search is refused at once (a leaky bucket refuses the first early
      send), it climbs on from what the probe proved; if that search or
      climb ends back at the old edge, the server had stored a burst, as a
      token bucket does, and the old edge is confirmed. A refusal while holding means
      the limit dropped (the edge is measured again at once, and for the
      next ``max_hold`` seconds it probes every ``hold`` seconds, as a limit
      that moved may move back), or, if the
      edge has not moved, that sends reach the server unevenly (the margin
      below the edge doubles, up to half). Refusals of requests sent within
      a second of the last cut (within its window, on a long one) are
      echoes of it, but one sent after the first second while nothing got
      through since the cut is a knock, as when the server closes. A server
      that stays closed through pauses longer than it was open (or at all,
      when it closed at the first limit the search up met), or tells a wait
      that long and then lets the run's sends go one by one, has a long
      window: the rate
      becomes what got through over the time it took to reopen, and edges
      are counted over that window from then on (and while holding, a
      send waits until the window has room, as counted from its own
      sends). The rate
      never exceeds twice the measured send rate, so an idle scope does not
      earn a burst. When the server counts its quota in headers (remaining
      and reset), they pace the scope and the rate loop stands aside, until
      a refusal comes with quota left (a limit the headers do not show).
      Refusals at one number in flight, at rates that differ, are a limit
      on requests in flight: it keeps below that number instead.
    * **Concurrency** (capacity: latency grows with load). It compares the
      mean latency of each round of responses (30, or those of two seconds
      when they come slowly, at least 3) with the lowest
      recent round mean (plus sqrt(2 ln n) standard errors of the round's
      mean for the n rounds it is the lowest of, at least two, up to half
      that mean, when latencies vary widely: the lowest of n noisy means is
      that far below what a round takes) and estimates the
      requests queued at the server
      (``limit * (1 - lowest / mean)``): it grows the limit while the queue
      is under 1.5 requests and shrinks it above 4, never growing while the
      scope does not use what it has. For a server that serves only a few
      at once (steady latencies), the thresholds shrink with it. Requests
      that hang (failures after far longer than the latency, as client
      timeouts of dropped requests) take no place of that limit: one more
      is allowed per such failure, for as long as it hung (not while errors
      are an eighth of the outcomes or more).

    Random errors do not move it: only when overload errors (5xx without
    ``Retry-After``, timeouts, dropped connections) are at least
    ``overload_share`` of the last 40 outcomes (and at least 10 of them) does
    it cut rate and concurrency by ``overload_cut``. If nothing is accepted
    between two cuts, the server is closed (a long window's limit spent, or
    a server down): it waits, longer each time, and knocks once after each
    wait, as after 429s. A server that closes on an edge it had held and
    opens again sooner than it had been open (a ban lifted, a server back)
    is searched up again as at the start: the knocks measured nothing. If
    after such a cut the
    sends pass without an overload error (40 accepted, or the hold) and
    they come back once the rate climbs past it, they are a rate limit's
    refusals (nginx's ``limit_req`` answers 503 by default), treated as
    429s from then on (the echoes of one count with it, not toward the
    overload share), until cutting below each edge they measure leaves as
    many (random errors, then: the search starts over). If the cut ended
    above such a limit, its errors go on but thin (under half the share
    that cut): the hold is tried again below what got through, where a
    limit's stop (an error there: random ones, back to the rate held, and
    no such try for ``max_hold`` seconds). While holding, such
    errors count as refusals only at a tenth of the sends; fewer (three or
    more within 10 s, at least 2 % of the sends) widen the margin as a 429
    would, up to 8 % (or a request's worth at a few per second), unless
    held lower they come as often (random ones, which then widen it no more
    until a new edge).

    The policy is the ceiling: the scope's delay is the larger of the
    policy's and Adaptive's, its concurrency the smaller. ``Retry-After`` and
    rate-limit headers are honoured by the scope's :class:`Backoff` (which
    then only reads headers: Adaptive does the stepping). While it paces a
    scope at a limit it measured, the policy's jitter is not applied: the
    sends are evenly spaced, as a limit counts them.

    :param start_rate: requests per second at the start (> 0). Default 4.0.
    :param headroom: how far below the measured edge to hold, as a fraction
        (0 < h < 1). Default 0.02.
    :param hold: seconds to hold below a newly found edge before probing;
        doubled per confirmation of the same edge, up to ``max_hold``. Default 10.0.
    :param max_hold: the longest hold in seconds. Default 60.0.
    :param overload_share: the share of overload errors among recent outcomes
        that cuts rate and concurrency (0 < s < 1). Default 0.25.
    :param overload_cut: the factor of that cut (0 < f < 1). Default 0.7.
    :param max_concurrency: the highest concurrency it grows to when the
        policy sets none. Default 256.

    Usage::

        ScopePolicy(concurrency=16, delay=0, slot_delay=0, adaptive=Adaptive())
    """

    start_rate: float = attrs.field(default=4.0, validator=positive)
    headroom: float = attrs.field(default=0.02, validator=above_zero_below_one)
    hold: float = attrs.field(default=10.0, validator=positive)
    max_hold: float = attrs.field(default=60.0, validator=positive)
    overload_share: float = attrs.field(default=0.25, validator=above_zero_below_one)
    overload_cut: float = attrs.field(default=0.7, validator=above_zero_below_one)
    max_concurrency: int = attrs.field(default=256, validator=at_least_one)

    def __attrs_post_init__(self) -> None:
        if self.hold > self.max_hold:
            raise ValueError(f"hold ({self.hold!r}) must not exceed max_hold ({self.max_hold!r})")

    def controller(self, policy: ScopePolicy) -> AdaptiveState:
        """Make the per-scope state for a scope with ``policy``."""
        return AdaptiveState(self, policy)


def _quota_spent(feedback: Feedback, remaining: float | None) -> bool:
    """Whether the response says a quota is used up (which explains a refusal).

    The scope's own view (``remaining``) leaves out the budgets other scopes
    track (a token budget routed to its own scope, say), so when it has quota
    left every budget the headers report is looked at.
    """
    if remaining is not None and remaining <= 0:
        return True
    if feedback.headers is None:
        return False
    info = parse(feedback.headers, now=0.0)  # (``now`` only places dated resets)
    return any(budget.remaining == 0 for budget in (info, *info.budgets))


#: Classifies timeouts and dropped connections (the default backoff's exceptions) as overload.
_BACKOFF_FOR_EXCEPTIONS = Backoff(exceptions=DEFAULT_BACKOFF_EXCEPTIONS)


class AdaptiveState(SlotState):
    """The live state of :class:`Adaptive` for one scope (plain data, see ``STATE``)."""

    __slots__ = (
        "blocked_until",
        "closed_at",
        "concurrency_edge",
        "config",
        "cut_at",
        "cut_first",
        "cut_random_at",
        "cut_share",
        "cut_tried",
        "edge",
        "edge_held",
        "empty",
        "errors_clean",
        "errors_limit",
        "headers_short",
        "hold_cuts",
        "hold_for",
        "horizon",
        "hung",
        "hung_for",
        "latency",
        "limit",
        "limit_growing",
        "margin",
        "moved_at",
        "ok_since_cut",
        "outcomes",
        "phase",
        "phase_at",
        "rate",
        "reason",
        "refine_at",
        "refine_for",
        "refine_phase",
        "refine_wait",
        "refusals",
        "resumed_at",
        "risen_from",
        "risen_hold",
        "risen_to",
        "round",
        "round_at",
        "round_busy",
        "rtt_epoch",
        "rtt_min",
        "rtt_min_at",
        "rtt_prev",
        "rtt_prev_at",
        "rtt_prev_rounds",
        "rtt_rounds",
        "run_at",
        "run_ok",
        "sends",
        "target",
        "told_wait",
        "widen_errors",
        "widen_from",
        "widen_off",
        "widen_share",
    )

    STATE = tuple(name for name in __slots__ if name != "config")
    replaces_policy = False
    due = INF  # it learns from feedback only (and so shares well through Redis)

    def __init__(self, config: Adaptive, policy: ScopePolicy) -> None:
        self.config = config
        self.rate = config.start_rate  # requests per second (inf = no opinion)
        self.phase = "start"  # start, recover, hold, probe, climb; measure; stated; capped
        self.phase_at: float | None = None
        self.edge: float | None = None  # the last measured accepted rate at a throttle
        self.edge_held = False  # whether a second refusal confirmed it
        self.target = INF  # the rate held below the edge
        self.margin = config.headroom  # how far below the edge the target is
        # Errors while holding too few to cut on, counted since widen_from;
        # their share when they last widened the margin; whether held lower
        # they came as often (random ones: they widen it no more).
        self.widen_errors = 0
        self.widen_from = -INF
        self.widen_off = False
        self.widen_share = 0.0
        self.hold_for = config.hold
        self.moved_at = -INF  # when the limit last dropped
        # The edge and hold before the limit last seemed to rise, and the
        # rate the probe then proved, until the search up that followed has
        # found where it is now.
        self.risen_from: float | None = None
        self.risen_hold = 0.0
        self.risen_to = 0.0
        self.horizon = _EDGE_HORIZON  # the server's window, as far as it has shown it
        self.cut_at = -INF  # requests sent before this are part of the last cut
        self.cut_first = False  # whether that cut was the first limit a search up met
        self.cut_share = 0.0  # the share of overload errors that cut (0: tried lower since)
        self.cut_tried = 0.0  # while a hold is tried lower: the rate held before (else 0)
        self.cut_random_at = -INF  # when errors last came below what got through
        self.ok_since_cut = 0
        self.empty = 0  # throttles in a row with nothing accepted in between
        self.run_at: float | None = None  # when sending last began or reopened after a closure
        self.run_ok = 0  # requests sent since then and accepted
        self.closed_at = -INF  # when the server last closed (refusing through pauses)
        # After a refusal that told to wait longer than the run had been open:
        # [when the run began, what it got accepted, when the wait ended].
        self.told_wait: list[float] | None = None
        self.resumed_at = INF  # when sending resumed after the last pause (inf: not yet sent)
        self.blocked_until = -INF
        self.headers_short = False  # refused with quota left: the headers miss a limit
        # [sent_at, accepted (1 or 0)] of answered sends, oldest first.
        self.sends: list[list[float]] = []  # [sent_at, 1 or 0]
        self.outcomes: list[int] = []  # 1 = overload, 0 = not; the last OUTCOMES
        # Whether no overload error has come since the last overload cut (but
        # echoes of it), and whether such errors proved to be a rate limit's.
        self.errors_clean = False
        self.errors_limit = False
        self.hold_cuts = 0  # cuts for errors while holding since the last clean hold
        self.latency: float | None = None  # the moving mean latency of accepted requests
        # When to measure the edge again, for a refusal sent at refine_for: once
        # the requests in flight then have answered (a slow server's).
        self.refine_at = INF
        self.refine_for = -INF
        self.refine_wait = 0.0
        self.refine_phase = "start"
        ceiling = policy.concurrency
        # The concurrency loop's limit on requests the server is serving; a
        # request that hung (failed after far longer than the latency) is
        # not, until its failure: the arrival times of the failures of the
        # last hung_for seconds (as many hang now, by Little's law).
        self.limit: int | None = min(2, ceiling) if ceiling is not None else 2
        self.hung: list[float] = []
        self.hung_for = 0.0
        self.concurrency_edge: int | None = None  # a limit on requests in flight, once found
        self.refusals: list[list[float]] = []  # [in flight, rate] at the last refusals
        self.limit_growing = True  # Vegas slow start: double per round
        self.round: list[float] = []  # latencies of the current round
        self.round_at = -INF  # when the current round began
        self.round_busy = False  # whether the scope used at least half its limit this round
        # The lowest round mean latency of this epoch and of the last, and the
        # concurrency limit each was measured at.
        self.rtt_min = self.rtt_min_at = INF
        self.rtt_prev = self.rtt_prev_at = INF
        self.rtt_epoch = -INF
        # How many round means each of those two is the lowest of.
        self.rtt_rounds = self.rtt_prev_rounds = 0
        self.reason = f"adaptive: starting at {self.rate:g}/s"

    def __repr__(self) -> str:
        return (
            f"<AdaptiveState {self.phase} rate={self.rate:.3g}/s edge={self.edge} "
            f"concurrency={self.concurrency}>"
        )

    @property
    def concurrency(self) -> int | None:
        """The limit on requests in flight: the loop's, plus those that hang."""
        limit = self.limit
        return limit + len(self.hung) if limit is not None else None

    @property
    def jitter(self) -> tuple[float, float] | None:
        """No jitter while it paces a scope at a limit it measured; else the policy's.

        A limit counts the sends of each second (or their spacing), so the
        policy's jitter (Scrapy's ``RANDOMIZE_DOWNLOAD_DELAY``) would send
        some of them closer than the limit allows: the refusals that follow
        widen the margin, and a quota of 5/s was held at 3.4/s.
        """
        return _EVEN if self.edge is not None and self.rate < INF else None

    @property
    def delay(self) -> float:
        """Seconds between sends for the current rate."""
        rate = self.rate
        return 0.0 if rate == INF else 1.0 / rate

    def on_send(self, scope: ScopeView, now: float) -> None:
        return None

    # -- feedback ------------------------------------------------------------------

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        sent_at = feedback.sent_at if feedback.sent_at is not None else now
        if self.phase_at is None:
            self.phase_at = sent_at
        if self.run_at is None:
            self.run_at = self.resumed_at = sent_at
        info = feedback.rate_limit
        kind = self._classify(feedback)
        remaining = info.remaining if info is not None else None
        # A refusal with quota left (or none counted) is a limit the headers
        # do not show: from then on the rate loop finds it.
        unexplained = kind == "throttle" and not _quota_spent(feedback, remaining)
        if unexplained:
            self.headers_short = True
        elif (
            not self.headers_short
            and info is not None
            and remaining is not None
            and info.reset is not None
        ):
            limit, window = info.limit, info.window
            self._stated_quota(scope, limit / window if limit and window else None, now)
        self._count(sent_at, accepted=kind == "ok")
        self._hang(kind == "overload" and feedback.status is None, now - sent_at, now)
        if kind == "ok" and sent_at >= self.run_at:
            self.run_ok += 1
        if kind == "ok" and sent_at > self.cut_at:
            self.ok_since_cut += 1
            if self.empty >= 2:
                self._reopened(scope, sent_at, now)
        if not (kind == "overload" and self.errors_limit and self._echo(sent_at)):
            # (An echo of a limit's refusal counts with that refusal: the
            # end of a fixed window refuses a run of sends at once.)
            remember_outcome(self.outcomes, 1 if kind == "overload" else 0)
        if unexplained:
            wait = (info.retry_after if info is not None else None) or 0.0
            if sent_at > self.cut_at:
                self._on_throttle(scope, sent_at, now, wait)
        elif kind == "overload":
            self._on_error(scope, feedback, sent_at, now)
        elif (
            feedback.latency is not None
            and feedback.status is not None
            and feedback.status < 500
            and feedback.adjust_delay
        ):
            self._latency_sample(scope, feedback.latency, now)
        if now >= self.refine_at:
            self._refine(scope, now)
        self._advance(scope, now)
        if self.horizon > _EDGE_HORIZON and self.phase in ("recover", "hold"):
            self._keep_window(scope)

    @staticmethod
    def _classify(feedback: Feedback) -> str:
        status = feedback.status
        info = feedback.rate_limit
        if status == 429 or (
            status is not None and status >= 400 and info is not None and info.retry_after
        ):
            return "throttle"
        if status is None:
            exception = feedback.exception
            if exception is not None and isinstance(
                exception, _BACKOFF_FOR_EXCEPTIONS.exception_classes()
            ):
                return "overload"
            return "other"
        if status in _OVERLOAD_CODES:
            return "overload"
        return "ok"

    def _hang(self, failed: bool, elapsed: float, now: float) -> None:
        """Count the requests in flight that hang, from the failures that hung.

        A request that fails after far longer than the latency (a client
        timeout of a request the server dropped) held a place in flight that
        the server did not serve, as TCP counts a segment past its timeout
        out of the pipe: as many such places are taken now as hung failures
        came in the last span they hung for, and the concurrency loop's limit
        counts without them. Not while errors are a large share: a server so
        overloaded that requests time out in its queue is to be backed off.
        """
        hung = self.hung
        if failed and elapsed >= max(_HUNG, _HUNG_LATENCIES * (self.latency or 0.0)):
            hung.append(now)
            self.hung_for = elapsed
        if hung:
            outcomes = self.outcomes
            if sum(outcomes) >= 0.5 * self.config.overload_share * max(len(outcomes), 1):
                hung.clear()
            else:
                since = now - self.hung_for
                while hung and hung[0] <= since:
                    del hung[0]

    # -- measured rates ------------------------------------------------------------

    def _count(self, sent_at: float, *, accepted: bool) -> None:
        sends = self.sends
        entry = [sent_at, 1 if accepted else 0]
        if not sends or sent_at >= sends[-1][0]:
            sends.append(entry)
        else:  # answers arrive out of send order
            bisect.insort(sends, entry)
        horizon = sends[-1][0] - 2 * self.horizon - 2 * (self.latency or 0.0)
        drop = max(bisect.bisect_left(sends, [horizon]), len(sends) - _SENDS)
        if drop:
            del sends[:drop]

    def _measured(self, start: float, end: float, *, accepted: bool, extra: int = 0) -> float:
        """Sends (or acceptances) per second, sent after ``start`` up to ``end``.

        ``extra`` adds requests not answered yet (in flight). The count is
        exact, so a refusal on a sliding one-second window reads as the
        server's limit; if the log was cut short (over ``_SENDS`` in two
        horizons) the rate is taken over the span it covers.
        """
        sends = self.sends
        first = bisect.bisect_right(sends, [start, INF])
        last = bisect.bisect_right(sends, [end, INF])
        if first == 0 and len(sends) == _SENDS and sends[0][0] > start:
            start = sends[0][0]
        span = end - start
        if span <= 0:
            return 0.0
        total = sum(entry[1] for entry in sends[first:last]) if accepted else last - first
        return (total + extra) / span

    def _paced(self, sent_at: float) -> float:
        """Acceptances per second in the horizon up to the last accepted send before ``sent_at``.

        A probe climbs slowly, so the server refuses it just past its limit.
        A window then holds the limit's count in the horizon before the
        refused send; a leaky bucket (nginx's ``limit_req`` without burst)
        refuses as soon as two sends come closer than its interval, when
        that horizon holds a request less, but the one ending at the last
        accepted send holds them all.
        """
        sends = self.sends
        last = bisect.bisect_left(sends, [sent_at])
        while last and not sends[last - 1][1]:
            last -= 1
        if not last:
            return 0.0
        end = sends[last - 1][0]
        horizon = self.horizon
        if end - 2 * horizon < self.resumed_at:
            return 0.0
        # Over two horizons too, in whole requests: a fixed window's turn can
        # fall inside either.
        return (
            math.floor(
                min(
                    self._measured(end - horizon, end, accepted=True),
                    self._measured(end - 2 * horizon, end, accepted=True),
                )
                * horizon
            )
            / horizon
        )

    def _pace(self, start: float, end: float) -> float:
        """The pace of the acceptances sent after ``start`` up to ``end`` (0 for fewer than 3).

        ``n`` evenly spaced acceptances span ``n - 1`` intervals, so their
        count over a span reads up to one more than their pace, and up to
        one less when the span ends just before the next: at a few per
        second, a tenth either way.
        """
        sends = self.sends
        accepted = [
            entry[0]
            for entry in sends[
                bisect.bisect_right(sends, [start, INF]) : bisect.bisect_right(sends, [end, INF])
            ]
            if entry[1]
        ]
        if len(accepted) < 3:
            return 0.0
        return (len(accepted) - 1) / (accepted[-1] - accepted[0])

    def _echo(self, sent_at: float) -> bool:
        """Sent while the server's window still held the sends from before the last cut.

        Not once a search up began after the cut: its sends go past what
        the window held, and their refusals are its own.
        """
        phase_at = self.phase_at
        searching = self.phase in ("start", "climb")
        if searching and phase_at is not None and sent_at >= phase_at > self.cut_at:
            return False
        return sent_at - self.cut_at < self.horizon

    def _overloaded(self) -> bool:
        outcomes = self.outcomes
        return len(outcomes) >= 10 and sum(outcomes) >= self.config.overload_share * len(outcomes)

    # -- the rate loop -------------------------------------------------------------

    def _on_throttle(self, scope: ScopeView, sent_at: float, now: float, wait: float) -> None:
        config = self.config
        closed = self._closed_since_cut()
        horizon = self.horizon
        if self._echo(sent_at):
            # An echo measures nothing. If nothing got through since the
            # cut, give it a second before sending again.
            if closed and sent_at >= self.cut_at + _EDGE_HORIZON:
                # Sent after that second, refused: a knock, as when the
                # server closes (a fixed window spent before its end does
                # not let go of sends as the window counted from them would).
                self.blocked_until = max(self.blocked_until, now + self._close())
            elif closed:
                self.blocked_until = max(self.blocked_until, self.cut_at + _EDGE_HORIZON)
            return
        # What the server accepted in the second before the refused send:
        # those that answered, and (about) those still in flight. On a
        # sliding one-second window that count is the server's limit; on a
        # longer window it is more, and the refusals that follow say so.
        flying = max(0, scope.in_flight - 1)  # not counting the refused request itself
        if self._concurrency_limit(scope, flying, sent_at, now):
            return
        told = self.told_wait
        if told is not None and not self.run_ok + flying:
            # Still closed after the wait it told: knock until it opens (see
            # _reopened), the run counted from where it was.
            self.told_wait = None
            self.run_at, self.run_ok = told[0], int(told[1])
        elif told is not None:
            # The first refusal after a told wait longer than the run had
            # been open, the server open again: if the run since has not got
            # half as far, its window lets go of the last run's sends one by
            # one (300 per sliding minute, sent in a few seconds), and the
            # last run and its wait were one window, as when knocks find it
            # closed (see _reopened). If it has, a fixed window reopened
            # whole: refused at its end, told to wait until the next.
            self.told_wait = None
            began, accepted, reopened_at = told
            if self.run_ok + flying < accepted / 2:
                self.cut_at, self.ok_since_cut, self.empty = now, 0, 0
                self._long_window(scope, reopened_at - began, accepted, now)
                self.resumed_at = max(now + wait, self.blocked_until)
                return
        run_at = self.run_at
        assert run_at is not None
        if wait > horizon and wait > sent_at - run_at and self.run_ok > 1:
            self.told_wait = [run_at, self.run_ok + flying, now + wait]
            self.run_at, self.run_ok = now + wait, 0
        latency = self.latency
        slow = flying > 0 and latency is not None and latency > horizon / 2
        if slow:
            # Those in flight left over the last ``latency`` seconds: about
            # this share of them within the horizon, until they answer.
            assert latency is not None
            flying = round(flying * min(1.0, horizon / latency))
        sent = self._measured(sent_at - horizon, sent_at, accepted=False, extra=flying)
        edge = self._measured(sent_at - horizon, sent_at, accepted=True, extra=flying)
        if (
            not slow
            and self.phase in ("recover", "hold")
            and sent_at - 2 * horizon >= self.resumed_at
        ):
            # Two seconds of sending without a pause: on fixed windows the
            # last second can hold the end of one window and the start of
            # the next (up to twice the limit); the two seconds' mean cannot.
            edge = min(
                edge, self._measured(sent_at - 2 * horizon, sent_at, accepted=True, extra=flying)
            )
        elif not slow and self.phase == "probe":
            edge = max(edge, self._paced(sent_at))
        elif not slow and self.phase == "climb":
            # Climbing evenly after a search was refused at once (a leaky
            # bucket's sign): the pace it was accepted at is the finer count.
            edge = max(edge, self._paced(sent_at), self._pace(sent_at - horizon, sent_at))
        pause = 0.0
        self.cut_at = now
        self.ok_since_cut = 0
        if closed:
            pause = self._close()
            edge = min(edge, (self.edge or edge) * config.overload_cut)
        else:
            self.empty = 0
            self.cut_first = self.phase == "start" and self.risen_from is None
            if slow:
                # The count waits for the answers of what was in flight
                # (see _refine); until then, no faster than the target held
                # so far nor than the estimate.
                assert latency is not None
                self.refine_at = now + 1.5 * latency
                self.refine_for, self.refine_wait, self.refine_phase = sent_at, wait, self.phase
                estimate = max(edge, 0.01)
                self._pause_for_excess(sent, estimate, now, 0.0)
                self.rate = min(self.rate, self.target, estimate)
                self.phase, self.phase_at = "measure", now
                self.resumed_at = max(now + wait, self.blocked_until)
                self.reason = f"adaptive: throttled at {sent:.3g}/s, measuring the edge"
                return
        if edge <= 0:
            edge = max(min(self.rate, sent) * config.overload_cut, 0.01)
        self._set_edge(scope, edge, sent, wait, now, pause, self.phase)
        self.resumed_at = max(now + wait, self.blocked_until)

    def _closed_since_cut(self) -> bool:
        """Whether nothing was accepted since the last cut (the server may be closed)."""
        return self.cut_at > -INF and self.ok_since_cut == 0

    def _close(self) -> float:
        """Nothing accepted since the last cut: the server is closed for now.

        Wait, longer each time, and knock once after each wait, rather than
        send on into it. Returns the wait.
        """
        if not self.empty:
            self.closed_at = self.cut_at
        self.empty += 1
        return min(self.config.max_hold, 0.5 * 2.0**self.empty)

    def _concurrency_limit(self, scope: ScopeView, flying: int, sent_at: float, now: float) -> bool:
        """Whether refusals come at a number in flight, not at a rate: then cap that number.

        A server that limits requests in flight refuses at the same count
        whatever the rate (which varies with its latency); a rate limit, at
        the same rate whatever the count. Three refusals at one count of two
        or more, at rates more than 25 % apart, make it a concurrency limit:
        Adaptive keeps below that count and the rate loop stands aside. A
        refusal at a lower count disproves it. Returns ``True`` when the
        refusal is handled.
        """
        limit = self.concurrency_edge
        if limit is not None:
            if flying < limit:  # refused below the limit found: not (only) a concurrency limit
                self.concurrency_edge, self.refusals = None, []
                return False
            self.cut_at = now
            return True  # sent before the cap took hold
        rate = self._measured(sent_at - _EDGE_HORIZON, sent_at, accepted=True) + flying
        refusals = self.refusals
        refusals.append([flying, rate])
        del refusals[:-3]
        counts = {count for count, _ in refusals}
        rates = [rate for _, rate in refusals]
        if len(refusals) < 3 or len(counts) > 1 or flying < 2 or max(rates) <= 1.25 * min(rates):
            return False
        self.concurrency_edge = flying
        self.limit = min(self.limit or flying, flying)
        self.rate = self.target = INF
        self.edge = None
        self.phase, self.phase_at = "capped", now
        self.cut_at = now
        self.reason = f"adaptive: the server allows {flying} in flight"
        logger.debug(
            "scope %s: refused at %d in flight each time, at %s/s: a concurrency limit",
            scope.name,
            flying,
            "/".join(f"{rate:.3g}" for rate in rates),
        )
        return True

    def _keep_window(self, scope: ScopeView) -> None:
        """Below the edge of a long window, send only as it lets go of earlier sends.

        The rate alone keeps a sliding window at its limit for a whole window
        after a probe went above it (the window still holds the probe's sends,
        and new ones replace them only as fast as they leave): each send that
        comes before one has left is refused. So while recovering and holding,
        a send waits until the window (as counted from the sends of the last
        one, those in flight included) has room for it.
        """
        edge = self.edge
        if edge is None:
            return
        horizon = self.horizon
        sends = self.sends
        if not sends:
            return
        start = sends[-1][0] - horizon
        if len(sends) == _SENDS and sends[0][0] > start:
            return  # the log does not reach back a whole window: no count
        first = bisect.bisect_right(sends, [start, INF])
        accepted = [entry[0] for entry in sends[first:] if entry[1]]
        over = len(accepted) + scope.in_flight - math.floor(edge * horizon) + 1
        if over > 0 and accepted:
            leaves = accepted[min(over, len(accepted)) - 1] + horizon
            self.blocked_until = max(self.blocked_until, leaves)

    def _pause_for_excess(self, sent: float, edge: float, now: float, pause: float) -> None:
        """Block until the server's window has let go of what went out above the edge."""
        horizon = self.horizon
        excess = (sent - edge) * horizon
        if excess > 0:
            pause = max(pause, min(horizon, excess / edge))
        if pause:
            self.blocked_until = max(self.blocked_until, now + pause)

    def _set_edge(
        self,
        scope: ScopeView,
        edge: float,
        sent: float,
        wait: float,
        now: float,
        pause: float,
        phase: str,
    ) -> None:
        """A throttle in ``phase`` measured the server's ``edge``: hold below it, so long."""
        config = self.config
        old = self.edge
        risen, proved, hold_for = self.risen_from, self.risen_to, self.hold_for
        if phase == "start" and risen is not None and (edge <= proved or self._near(edge, proved)):
            # The search up after a rise doubles the rate, and a leaky
            # bucket (nginx's ``limit_req`` without burst) refuses its first
            # early send, when the second before it holds the old pace: it
            # measured no more than the probe had proved (within a request).
            # The limit lies above that: climb on from there as a probe
            # does, its refusal still a search's.
            self.edge = proved
            self.target = proved * (1.0 - self.margin)
            self._pause_for_excess(sent, proved, now, pause)
            self.rate = self.target
            self.phase, self.phase_at = "climb", max(now, self.blocked_until)
            self.reason = f"adaptive: throttled at {sent:.3g}/s, climbing from {self.target:.3g}/s"
            logger.debug(
                "scope %s: throttled at %.3f/s searching up, about the %.3f/s proved: climbing",
                scope.name,
                sent,
                proved,
            )
            return
        # The count varies by a request with how sends cross the second's
        # boundary on their way: within that (and 7 %) it confirms the edge,
        # and the edge stays what the server has let through. An edge that a
        # search up found confirms none: the server had accepted past the old.
        if phase == "climb" and risen is not None and self.rate <= proved:
            # Refused climbing no faster than the probe had gone: what it
            # proved was a burst the server had stored (a token bucket
            # refills while the rate is held below it): back at the old edge.
            edge, phase = risen, "probe"
        confirmed = stored = False
        if phase not in ("start", "climb"):
            self.risen_from = None
            if risen is not None and self._near(edge, risen):
                # Back at the edge from before the rise: the server had only
                # stored a burst (a token bucket refills while the rate is
                # held below it, and a probe drains it), and the old edge is
                # confirmed.
                old, hold_for, confirmed, stored = risen, self.risen_hold, True, True
            else:
                confirmed = old is not None and self._near(edge, old)
        if confirmed:
            assert old is not None
            edge = max(edge, old)
        if confirmed and not stored and phase in ("recover", "hold"):
            # Refused while holding below an edge that has not moved: the
            # sends reach the server less evenly than they leave (a busy
            # client or network). Hold further below; it narrows again per
            # hold that passes without a refusal.
            self.margin = min(_MAX_MARGIN, 2.0 * self.margin)
        if old is not None and self.edge_held and edge < _MOVED * old:
            self.moved_at = now  # a limit that had held dropped
        if now - self.moved_at <= config.max_hold:
            # A limit that moved may move back: for a while, probe every
            # ``hold`` seconds (each failed probe costs the server's wait).
            hold = config.hold
        else:
            # Longer per confirmation of the same edge, and long enough
            # that a probe's cost (one server-imposed wait) stays small.
            hold = min(config.max_hold, hold_for * 2) if confirmed else config.hold
            hold = max(hold, wait / _PROBE_COST)
        # No shorter than the server's window: a probe before the window has
        # let go of the last one's sends would be judged by them.
        self.hold_for = min(config.max_hold, max(hold, self.horizon))
        self.edge, self.edge_held = edge, confirmed
        if not confirmed:  # errors near the old edge say nothing of this one
            self.widen_off, self.widen_share = False, 0.0
            self.widen_errors, self.widen_from = 0, -INF
        self.target = edge * (1.0 - self.margin)
        self._pause_for_excess(sent, edge, now, pause)
        # A confirmed edge is known: resume at the target; a new one from below it.
        self.rate = self.target if confirmed else min(self.target, edge * 0.9)
        self.phase = "recover"
        self.phase_at = max(now, self.blocked_until)
        self.reason = (
            f"adaptive: throttled at {sent:.3g}/s, edge {edge:.3g}/s, holding {self.hold_for:g} s"
        )
        logger.debug(
            "scope %s: throttled at %.3f/s, edge %.3f/s (%s), rate -> %.3f/s, hold %g s",
            scope.name,
            sent,
            edge,
            "confirmed" if confirmed else "new",
            self.rate,
            self.hold_for,
        )

    def _near(self, edge: float, old: float) -> bool:
        """Whether ``edge`` confirms ``old``: within a request over the horizon (and 7 %)."""
        return abs(edge - old) <= max(0.07 * old, min(1.0 / self.horizon, 0.15 * old))

    def _refine(self, scope: ScopeView, now: float) -> None:
        """Count the edge of the last throttle, now that what was in flight then has answered."""
        self.refine_at = INF
        sent_at = self.refine_for
        horizon = self.horizon
        edge = self._measured(sent_at - horizon, sent_at, accepted=True)
        if edge <= 0:
            return
        sent = self._measured(sent_at - horizon, sent_at, accepted=False)
        self._set_edge(scope, edge, sent, self.refine_wait, now, 0.0, self.refine_phase)

    def _reopened(self, scope: ScopeView, sent_at: float, now: float) -> None:
        """The server accepts again after refusing through two or more pauses.

        If it closed at the first limit a search up met, or stayed closed
        longer than it had been open, its window is longer than the horizon:
        what it accepted from the start of the run to now is what one window
        allows, so the run's average rate is the edge, held for about a
        window before probing. Else (it closed on an edge it had held, and
        for less time) it searches up again as at the start.
        """
        assert self.run_at is not None
        self.empty = 0
        if not self.cut_first and sent_at - self.closed_at < self.closed_at - self.run_at:
            # Closed for less time than it had been open, after a limit was
            # known: a limit that moved or a server that was down, not a long
            # window. (A search up fills a sliding window with sends that
            # come faster and faster, so the window lets go of the first,
            # sparse ones sooner than the run took.) The knocks measured
            # nothing, as nothing got through (nor did they see the limit
            # move): search up from the rate they left, as at the start, and
            # the next refusal measures the edge.
            self.phase, self.phase_at = "start", now
            self.edge, self.edge_held, self.risen_from, self.moved_at = None, False, None, -INF
            self.reason = f"adaptive: open again, searching up from {self.rate:.3g}/s"
            logger.debug("scope %s: open again after a closure: searching up", scope.name)
            return
        # Not counting this acceptance: it opens the next window.
        self._long_window(scope, sent_at - self.run_at, max(self.run_ok - 1, 1), now)
        self.run_at, self.run_ok = sent_at, 1

    def _long_window(self, scope: ScopeView, window: float, accepted: float, now: float) -> None:
        """The server closed for longer than it had been open: its window is ``window``.

        What it accepted from the start of the run is what one window
        allows, so the run's average rate is the edge, held for about a
        window before probing.
        """
        edge = accepted / window
        self.edge, self.edge_held = edge, False
        self.target = edge * (1.0 - self.margin)
        self.rate = min(self.target, edge * 0.9)
        self.hold_for = min(self.config.max_hold, max(self.config.hold, window))
        # Edges are counted, probes judged and echoes told over that window.
        self.horizon = window
        self.phase, self.phase_at = "recover", now
        self.reason = (
            f"adaptive: closed for a long window, edge {edge:.3g}/s, holding {self.hold_for:g} s"
        )
        logger.debug(
            "scope %s: closed for a long window of %.1f s: %.3f/s over it", scope.name, window, edge
        )

    def _stated_quota(self, scope: ScopeView, rate: float | None, now: float) -> None:
        """The server counts its quota in headers (remaining, reset): they pace the scope.

        The scope's backoff keeps no more in flight than remains and waits
        for the reset when nothing does; the rate loop stands aside (it would
        only add waits that headers rounded to whole seconds make costly)
        until a refusal comes that the headers do not explain. ``rate`` is
        the quota per second when the headers state its window.
        """
        if self.phase != "stated" or self.edge != rate:
            shown = "with no window stated" if rate is None else f"of {rate:.3g}/s"
            logger.debug("scope %s: the server counts a quota %s", scope.name, shown)
            self.reason = f"adaptive: the server's headers count its quota ({shown})"
        self.edge = rate
        self.target = INF if rate is None else rate
        self.rate = INF
        self.phase, self.phase_at = "stated", now

    def _on_error(self, scope: ScopeView, feedback: Feedback, sent_at: float, now: float) -> None:
        """An overload error: a limit's refusal, or one of a share that may cut.

        A rate limit that answers with errors (nginx's ``limit_req`` answers
        503 by default) refuses nothing below its edge, where random errors
        and a struggling server take a share at any rate. So when a hold
        after an overload cut has passed without an overload error, an error
        that comes once the rate climbs past it (probing, or searching up)
        is that limit's refusal, as a 429 would be: the rate loop measures
        the edge and holds below it, and from then on every error is a
        refusal, until enough of them come to cut for overload as before
        (which starts the test again). While holding below its edge, an error
        is its refusal only if errors are a tenth of the sends or more (a
        random one comes at any rate); when cuts below each lower edge leave
        as large a share, they were random all along: the scope forgets the
        edge and searches up again, counting them toward the overload share.
        """
        echo = self._echo(sent_at)
        holding = self.phase in ("recover", "hold")
        limit = (
            not echo
            and feedback.status is not None
            and (
                self.errors_limit
                or (self.errors_clean and self.phase in ("start", "probe", "climb"))
            )
        )
        if limit and holding and not self._hold_errors(sent_at):
            self._widen(scope, now)
        elif limit:
            self.hold_cuts += holding
            if self.hold_cuts > _HOLD_CUTS:
                # Each cut below a lower edge left as large a share of
                # errors: they come at any rate, not from a limit, whose
                # edges were not. Search up again, counting them as random.
                logger.debug("scope %s: errors below every edge: not a rate limit", scope.name)
                self.errors_limit = False
                self.edge, self.target = None, INF
                self.phase, self.phase_at = "start", now
            else:
                if not self.errors_limit:
                    logger.debug(
                        "scope %s: errors only above the rate held: a rate limit", scope.name
                    )
                self.errors_limit = True
                if not self._overloaded():
                    self._on_throttle(scope, sent_at, now, 0.0)
                    return
        if not echo:
            self.errors_clean = False
            if self.cut_tried:  # errors below what got through: random ones
                # Back to the rate held, at the end of its hold.
                self.rate = self.target = self.cut_tried
                self.cut_tried, self.cut_random_at = 0.0, now
                self.phase_at = now - self.hold_for
                logger.debug("scope %s: errors below what got through: random ones", scope.name)
        if self._overloaded() or (self.empty and not echo):
            # (Closed: a knock after the pause was refused too.)
            self._cut_for_overload(scope, now)

    def _widen(self, scope: ScopeView, now: float) -> None:
        """An error while holding, too few of them to tell a refusal from a random one.

        A 429 there would widen the margin (the edge may have read a stored
        burst, a request high), and so do these when a few come close
        together, up to :data:`_ERROR_MARGIN` (or the edge's precision, a
        request over the horizon, at a few per second). Once held lower, a
        limit's refusals thin out, random errors come as often: then the
        margin is the headroom again and they widen it no more, until a new
        edge.
        """
        if self.widen_off or self.edge is None:
            return
        if now - self.widen_from > _WIDEN_SPAN:
            self.widen_errors, self.widen_from = 0, now
        self.widen_errors += 1
        share = self.widen_errors / max(1.0, self.rate * (now - self.widen_from))
        if self.widen_errors < 3 or share < _WIDEN_SHARE:
            return
        self.widen_errors, self.widen_from = 0, now
        if self.widen_share and share >= _WIDEN_RANDOM * self.widen_share:
            self.widen_off, self.margin = True, self.config.headroom
            logger.debug("scope %s: errors as many held lower: random ones", scope.name)
        elif self.margin < (widest := max(_ERROR_MARGIN, 1.0 / (self.edge * self.horizon))):
            # (At a few per second, the edge's count is a request coarse.)
            self.widen_share, self.margin = share, min(widest, 2.0 * self.margin)
        else:
            return
        self.target = self.rate = self.edge * (1.0 - self.margin)
        logger.debug("scope %s: errors while holding: rate -> %.3f/s", scope.name, self.rate)

    def _hold_errors(self, sent_at: float) -> bool:
        """Whether errors are a large enough share of the sends while holding to be a limit's."""
        span = 2.0 * self.horizon
        sent = self._measured(sent_at - span, sent_at, accepted=False)
        accepted = self._measured(sent_at - span, sent_at, accepted=True)
        return sent - accepted >= _HOLD_ERRORS * sent

    def _cut_for_overload(self, scope: ScopeView, now: float) -> None:
        config = self.config
        closed = self._closed_since_cut()
        sent = self._measured(now - 2.0, now, accepted=False)
        old_rate, old_limit = self.rate, self.limit
        base = min(self.rate, sent) if sent > 0 else self.rate
        self.rate = max(0.05, base * config.overload_cut)
        self.edge = None
        self.target = self.rate
        self.phase = "hold"
        self.phase_at = now
        self.hold_for = config.hold
        self.cut_at = self.resumed_at = now
        self.ok_since_cut = 0
        if closed:  # (a long window's limit spent, or a server down)
            self.blocked_until = max(self.blocked_until, now + self._close())
        else:
            self.empty, self.cut_first = 0, False
        limit = self.limit if self.limit is not None else max(1, scope.in_flight)
        self.limit = max(1, int(limit * config.overload_cut))
        self.limit_growing = False
        outcomes = self.outcomes
        self.cut_share = sum(outcomes) / len(outcomes) if outcomes else 0.0
        self.cut_tried = 0.0
        self.outcomes = []
        self.errors_clean, self.errors_limit = True, False
        self.hold_cuts = 0
        self.reason = f"adaptive: overloaded, rate {self.rate:.3g}/s, concurrency {self.limit}"
        logger.debug(
            "scope %s: overload errors, rate %.3f -> %.3f/s, concurrency %s -> %s",
            scope.name,
            old_rate,
            self.rate,
            old_limit,
            self.limit,
        )

    def _advance(self, scope: ScopeView, now: float) -> None:
        """Move the rate along its phase: slow start, recovery, hold, probe."""
        phase_at = self.phase_at if self.phase_at is not None else now
        elapsed = now - phase_at
        sent = self._measured(now - 1.0, now, accepted=False)
        ceiling = max(2.0 * sent, self.config.start_rate)  # no burst earned while idle
        if self.phase in ("stated", "measure", "capped"):
            return
        if self.phase == "start":
            if elapsed >= 0.5:
                if sent >= 0.5 * self.rate:  # the scope uses its rate: double it
                    self.rate = min(self.rate * 2.0, ceiling * 2.0)
                    self.reason = f"adaptive: no limit met yet, up to {self.rate:.3g}/s"
                self.phase_at = now
            return
        target = self.target
        if self.phase == "recover":
            if elapsed < 0:
                return
            # From the restart rate up to the target within two seconds.
            self.rate = min(target, self.rate + (target - self.rate) * min(1.0, elapsed / 2.0))
            if self.rate >= target or elapsed >= 2.0:
                self.rate = target
                self.phase, self.phase_at = "hold", now
            return
        if self.phase == "hold":
            outcomes = self.outcomes
            if (
                self.edge is None
                and elapsed >= self.hold_for
                and not self.errors_clean
                and outcomes
                and sum(outcomes) < _THINNED * self.cut_share * len(outcomes)
                and now - self.cut_random_at >= self.config.max_hold
            ):
                # Held after a cut for overload, the errors thinned. A rate
                # limit (or a full server) lets about as many through at any
                # rate above it, so its refusals thin as the rate is cut,
                # and stop below what got through; random errors keep their
                # share (and may have thinned only from a share that came by
                # chance). Try below what got through: an error there means
                # random ones (back to the rate held, at once, and no such
                # try for max_hold seconds: each may pass clean by chance);
                # none, a limit, whose edge the clean hold then finds.
                got = self.ok_since_cut / max(elapsed, 1.0)
                self.cut_tried, self.cut_share = self.rate, 0.0
                self.rate = self.target = max(0.05, got * (1.0 - _ERROR_MARGIN))
                self.phase_at = self.cut_at = now
                self.ok_since_cut, self.errors_clean = 0, True
                self.reason = f"adaptive: trying {self.rate:.3g}/s, below what got through"
                logger.debug(
                    "scope %s: errors thinned by the cut, %.3f/s got through: trying %.3f/s",
                    scope.name,
                    got,
                    self.rate,
                )
                return
            if self.edge is None and (
                (self.errors_clean and self.ok_since_cut >= _CLEAN_PROOF)
                or (
                    elapsed >= self.hold_for
                    and sum(outcomes) < self.config.overload_share * len(outcomes)
                )
            ):
                # Held after a cut for overload, with no limit known, and the
                # errors since (if any) a smaller share than cut: search upward
                # as at the start (errors there count toward the overload
                # share, or, after a clean hold, find a limit). Sends that were
                # all accepted prove enough before the hold ends. A larger
                # share probes up slowly, as after a limit.
                self.phase, self.phase_at = "start", now
                self.cut_tried = 0.0
                self.reason = f"adaptive: searching up from {target:.3g}/s after an overload"
                logger.debug(
                    "scope %s: %d accepted since the overload cut (%s): searching up",
                    scope.name,
                    self.ok_since_cut,
                    "all" if self.errors_clean else "with errors",
                )
                return
            if elapsed >= self.hold_for:
                self.phase, self.phase_at = "probe", now
                self.hold_cuts = 0
                self.margin = max(self.config.headroom, self.margin / 2.0)
                self.widen_share = 0.0  # the errors' share is measured anew, at the new rate
                self.reason = f"adaptive: probing above {target:.3g}/s"
            return
        # probe: slow near the known edge, faster away from it (a convex climb)
        edge = self.edge
        span = max(2.0, self.horizon)  # a long window accepts a burst until it fills
        accepted = self._measured(now - span, now, accepted=True)
        if edge is not None and accepted > 1.1 * edge:
            # No more than their pace, which at a few per second is the finer
            # count (the pace alone would read a burst as a rate). Looked at
            # only when the count passes: it is never above it.
            accepted = min(accepted, self._pace(now - span, now) or accepted)
        if edge is not None and accepted > 1.1 * edge and accepted * span >= 5:
            # The server accepts well past the old edge (a tenth more, and
            # five requests or more over the span): the limit rose. Search
            # upward as at the start.
            self.phase, self.phase_at = "start", now
            self.risen_from, self.risen_hold = edge, self.hold_for
            self.risen_to = accepted
            self.reason = f"adaptive: the limit rose past {edge:.3g}/s, up to {self.rate:.3g}/s"
            logger.debug("scope %s: accepted past the edge %.3f/s: searching up", scope.name, edge)
            return
        if now - self.moved_at <= self.config.max_hold:
            elapsed *= 2.0  # a limit that just moved: climb faster
        probe = target * (1.0 + 0.002 * elapsed + 0.004 * elapsed * elapsed)
        self.rate = min(probe, max(ceiling, target))

    # -- the concurrency loop ------------------------------------------------------

    def _latency_sample(self, scope: ScopeView, latency: float, now: float) -> None:
        if not math.isfinite(latency) or latency < 0:
            return
        mean = self.latency
        self.latency = latency if mean is None else mean + 0.1 * (latency - mean)
        if now - self.rtt_epoch >= _RTT_EPOCH:
            # The epoch's floor replaces the older one unless every round of
            # it had more in flight than that one's: then its latencies may
            # be the scope's own queue (a floor risen so would let the limit
            # grow on and on); the older floor stays until a round at a
            # limit no higher measures again (the limit shrinks to it when
            # the server has really slowed down).
            if self.rtt_min == INF or self.rtt_min_at <= self.rtt_prev_at:
                self.rtt_prev, self.rtt_prev_at = self.rtt_min, self.rtt_min_at
                self.rtt_prev_rounds = self.rtt_rounds
            self.rtt_min, self.rtt_min_at, self.rtt_epoch = INF, INF, now
            self.rtt_rounds = 0
        limit = self.limit
        if limit is None:
            return
        if scope.in_flight - len(self.hung) >= limit / 2:
            self.round_busy = True
        if not self.round:
            self.round_at = now
        self.round.append(latency)
        size = len(self.round)
        if size < max(_ROUND_FEWEST, limit) or (
            size < max(_ROUND, limit) and now - self.round_at < _ROUND_TIME
        ):
            return
        median = sum(self.round) / len(self.round)  # the round's mean latency
        spread = math.sqrt(sum((x - median) ** 2 for x in self.round) / len(self.round))
        busy = self.round_busy
        self.round, self.round_busy = [], False
        # The baseline is the lowest round median of the last epochs, not the
        # lowest single latency: with varied service times (an exponential
        # has its minimum near 0) one lucky answer would read as a queue.
        self.rtt_rounds += 1
        if median < self.rtt_min:
            self.rtt_min, self.rtt_min_at = median, limit
        floor = min(self.rtt_min, self.rtt_prev)
        if median <= 0 or floor == INF:
            return
        if spread >= 0.5 * median:
            # Varied service times (an exponential's round means vary by a
            # fifth over 30): the floor, the lowest of n round means, lies
            # about sqrt(2 ln n) standard errors of one below what a round
            # takes (three for the 300 rounds of two epochs at 150 answers a
            # second), and read as a queue it held a server of 16 workers at
            # 10 or so, and one of 64 spiralled down to 20: a lower limit
            # makes more, smaller rounds, whose lowest lies lower still.
            # At most half the floor: a few slow answers among many fast ones
            # (a cache in front of an origin) vary the means so much that the
            # correction would hide the origin's queue.
            rounds = max(self.rtt_rounds + self.rtt_prev_rounds, _FEW_ROUNDS)
            error = math.sqrt(2.0 * math.log(rounds)) * spread / math.sqrt(size)
            floor = min(median, floor + min(error, 0.5 * floor))
        queue = limit * (1.0 - floor / median)
        ceiling = scope.policy.concurrency
        top = ceiling if ceiling is not None else self.config.max_concurrency
        if self.concurrency_edge is not None:
            top = min(top, self.concurrency_edge)
        old = limit
        low, high = _QUEUE_LOW, _QUEUE_HIGH
        if spread < 0.5 * median:
            # Steady latencies (so a trustworthy floor): the thresholds shrink
            # for a server that serves few at once (its limit less the
            # queue), where a queue of four is five times its latency. Widely
            # varied ones (a cache in front of a slow origin) keep them.
            serving = limit - queue
            low, high = min(low, 0.5 * serving), min(high, max(1.0, serving))
        if queue > high:
            self.limit_growing = False
            limit = max(1, limit - 1 if queue < 2 * high else int(limit * 0.9))
        elif queue < low and busy:
            limit = min(top, limit * 2 if self.limit_growing else limit + 1)
        elif queue >= low:
            self.limit_growing = False
        self.limit = limit
        if limit != old:
            logger.debug(
                "scope %s: latency %.3f s over %.3f s minimum (queue %.2f), concurrency %s -> %s",
                scope.name,
                median,
                floor,
                queue,
                old,
                limit,
            )
