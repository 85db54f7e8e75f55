"""Every number Adaptive's parts decide with, named once with the reason for its value."""

from __future__ import annotations

import math
from typing import Protocol

import attrs

__all__ = ["AdaptiveTuning", "Config"]


class Config(Protocol):
    """What the parts read of the user's configuration (:class:`~throttlekit.Adaptive`)."""

    @property
    def start_rate(self) -> float: ...
    @property
    def headroom(self) -> float: ...
    @property
    def hold(self) -> float: ...
    @property
    def max_hold(self) -> float: ...
    @property
    def overload_share(self) -> float: ...
    @property
    def overload_cut(self) -> float: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def tuning(self) -> AdaptiveTuning: ...


@attrs.frozen(kw_only=True)
class AdaptiveTuning:
    """The inner constants of :class:`~throttlekit.Adaptive`, for tests and benchmarks to vary.

    The defaults are what the quality benchmark and the test sweep were
    measured with; the user-facing knobs (start rate, headroom, holds,
    overload share and cut) are fields of :class:`~throttlekit.Adaptive`.
    """

    # -- measuring rates -----------------------------------------------------------
    #: Seconds over which a refusal's edge is counted until the server shows a
    #: longer window: most quotas are per second.
    edge_horizon: float = 1.0
    #: Answered sends remembered: above 128/s one is under 1 % of a two-horizon count.
    sends_kept: int = 256
    #: Horizons of answered sends the log keeps back from the last acceptance
    #: (and two latencies): what a probe's edge is counted over. Kept back from
    #: the last send, a refusal a gap later took one away (2 r/s read 1/s).
    sends_horizons: float = 2.0
    #: Seconds over which the scope's own send rate is measured (no burst earned idle).
    send_rate_span: float = 1.0
    #: Fewest acceptances whose spacing gives a pace (two give one interval).
    pace_fewest: int = 3

    # -- the search up -------------------------------------------------------------
    #: Seconds between doublings of the rate while no limit has been met.
    start_doubling: float = 0.5
    #: The share of its rate a scope must use for the rate to double.
    start_used: float = 0.5

    # -- edges, holds and probes ---------------------------------------------------
    #: A new edge restarts below itself, at this share, and climbs to the target.
    new_edge_restart: float = 0.9
    #: A refusal below a new edge, a horizon or two after the one that set it,
    #: counts the edge between the two (a bucket refills at its rate whatever
    #: burst it had stored) if sending paused at most this share of that span.
    recount_pause: float = 0.25
    #: Refusals sent below a new edge within its horizon slow the rate a
    #: restart step each, at most this many steps: a token bucket's stored
    #: burst reads up to half again its rate over one second (nginx's 20 r/s
    #: ``burst=10`` reads 28), and random 503s there should not slow it further.
    overcount_steps: int = 2
    #: ...but once this many sends since sending resumed after the cut have answered and half
    #: were refused, no faster than those accepted came (a stored burst read as a rate: nginx's
    #: ``rate=20r/s burst=40 nodelay``: 27 refusals in 40 s, 10 with this).
    spent_fewest: int = 6
    #: ...or, of twice as many, this share (a bucket held a third above its rate;
    #: 50/s ``burst=50`` behind 5 ms of jitter: 58 refusals in 40 s, 16 with it).
    spent_share: float = 0.25
    #: ...and a hold over this many ``hold`` is cut to it: that pace is a rough count.
    spent_hold: float = 2.0
    #: Seconds over which the rate climbs from its restart to the target.
    recover_time: float = 2.0
    #: An edge within this share of the old one confirms it (boundaries are crossed unevenly)...
    near_share: float = 0.07
    #: ...or within a request over the horizon, at most this share of it.
    near_cap: float = 0.15
    #: An edge below this share of one that had held means the limit dropped.
    moved: float = 0.8
    #: Refused at the edge after this many horizons held below it unrefused, the
    #: limit may have dropped where the refusal cannot tell: resume at this share
    #: of the target for ``drop_horizons``, then climb back (a drop to half is
    #: followed in 2.75 s, not 4.25 s; a jostle costs two horizons of sends).
    drop_held: float = 5.0
    drop_cut: float = 0.5
    drop_horizons: float = 2.0
    #: A hold below a long window's edge may grow to this many of its windows
    #: (a failed probe costs a refusal: each window, 1.7 % of a minute's sends);
    #: a rise is then followed within five windows. ...Below an edge of this many
    #: per second, to ``max_hold`` of its sends (one each ``max_hold``: 6 % at 0.5 r/s).
    long_window_holds: float = 4.0
    slow_edge: float = 1.0
    #: Seconds: a quota the headers count whose reset is at most this far is
    #: spread evenly over its window (what a window of seconds or minutes sees
    #: best); a longer one, an hourly quota, is spent as it comes (the work is
    #: done sooner; a limit the headers do not show is found by the rate loop).
    stated_pace_within: float = 300.0
    #: Each step of a search up once a leaky bucket showed (a search refused at
    #: once): it refuses a doubled rate's first early send, so a quarter more.
    leaky_search: float = 1.25
    #: The widest the margin below the edge grows when refusals come while holding.
    max_margin: float = 0.5
    #: Margins closer than this to one refused while holding are not tried.
    margin_resolution: float = 0.02
    #: The share of the time a failed probe may cost (the server's wait after
    #: it): with the 2 % headroom and some unevenness, 95 % of the edge or more.
    probe_cost: float = 0.015
    #: A probe's rise per second held, linear and quadratic (slow near the edge, then faster).
    probe_linear: float = 0.002
    probe_quadratic: float = 0.004
    #: Seconds over which a probe counts acceptances (a long window's horizon if longer).
    probe_span: float = 2.0
    #: For ``max_hold`` after a limit that had held dropped, the hold is this
    #: share of ``hold`` (it may move back: the hold, a probe and a search up
    #: must fit in 15 s wherever a rise falls; with the whole hold, up to
    #: 18.5 s at 5/s with ``Retry-After: 1``, 13.75 s with half)...
    moved_hold: float = 0.5
    #: ...but at least this many sends at the edge (each failed probe costs a
    #: refusal: at 1/s, one in 25 sends for that minute, not one in 8).
    moved_sends: float = 25.0
    #: Acceptances this share above the edge, and at least ``risen_fewest``
    #: over the span, mean the limit rose.
    risen_share: float = 1.1
    risen_fewest: int = 5
    #: The slowest rate an estimate may give (requests per second).
    min_estimate: float = 0.01

    # -- a leaky bucket without burst ---------------------------------------------------
    #: A refusal (with no wait told) whose gap after the last acceptance is
    #: this many times shorter than the last gaps accepted is a leaky
    #: bucket's (a search up that doubles the rate refuses at half the gap it
    #: was accepted at; a window refuses at gaps as short as it accepts)...
    spacing_apart: float = 1.5
    #: ...or this many in a search in ``leaky_search`` steps (nginx's 2 r/s)...
    stepped_apart: float = 1.15
    #: ...when those were at least this many gaps (nginx's 5 r/s: two at 4/s).
    spacing_fewest: int = 2
    #: The search for its interval ends when the bounds are within this share
    #: (each try below the interval costs a refusal).
    spacing_resolution: float = 0.05
    #: Paced this share above the shortest gap accepted: the network and the
    #: server's millisecond clock move a send by a millisecond or two...
    spacing_guard: float = 0.02
    #: ...doubled per refusal at a gap that had been accepted, up to this...
    spacing_max_guard: float = 0.16
    #: ...when it came within this many acceptances of the last such refusal:
    #: rarer ones are a small share of the sends (nginx's 10 r/s, one process:
    #: one every 7 to 10 s took the guard to 16 %, 89 % of what it allows).
    spacing_widen_apart: int = 100
    #: The guard halves over this many acceptances, down to the least: where
    #: the network's noise stays, a refusal in about as many widens it again
    #: (halved per look for a rise, each look cost one more, at the guard).
    spacing_narrow_over: int = 400
    #: Refused again once moved back down, it moves down half as fast, down to this
    #: many times slower (each such refusal costs more than the pace gains).
    spacing_patience: int = 8
    #: Answers are judged this many of the longest recent latencies of acceptances
    #: after their send (a refusal comes back at once, acceptances later)...
    spacing_lag: float = 1.5
    #: ...which forgets this share per acceptance of the longest one before.
    spacing_slowest_decay: float = 0.95
    #: Seconds after a refusal before the next try below the shortest gap accepted.
    spacing_settle: float = 1.0
    #: A look for a rise widens the lower bound this share below the interval
    #: (a try there is refused once if the limit has not moved); the share
    #: doubles while the tries are accepted.
    spacing_rise: float = 0.05
    #: Refusals at gaps it had accepted once the guard cannot double, each
    #: within ``spacing_run_within`` acceptances of the last: a window, not a
    #: leaky bucket (one paced too fast refuses every few sends, nginx's 7 r/s
    #: burst=2 every 18; a loaded machine's lateness every 26 to 50).
    spacing_runs: int = 3
    spacing_run_within: int = 24

    # -- slow servers ----------------------------------------------------------------
    #: A latency above this share of the horizon makes a refusal's count wait
    #: for the answers of what was in flight.
    slow_latency: float = 0.5
    #: ...for this many latencies.
    refine_latencies: float = 1.5

    # -- closed servers --------------------------------------------------------------
    #: The first wait after a knock is refused (seconds); it doubles per knock.
    closed_wait: float = 0.5
    #: The windows limits are set in (seconds): a window that opens at its first request
    #: (``limits``' fixed windows, HAProxy's periods) or lets go of it after its length (a sliding
    #: one) frees up that long after the run began. A closed server is knocked on just after each
    #: of these since the run began, not after a doubled wait: knocks at 2.7, 3.7, 5.7, 9.7 and
    #: 17.7 s read a fixed 10 s window as 17.7 s long (57 % of its rate); skipping 20 s read 30
    #: per 20 s as 30.6 s long. (A knock at 3 s would cost every longer window a refusal.)
    round_windows: tuple[float, ...] = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300)
    #: ...that share of the window after it (a clock's or a network's
    #: difference; the window read is as much longer, its rate as much lower)...
    round_margin: float = 0.02
    #: ...if no later than this many doubled waits (a run begun long ago keeps to those; 2.5
    #: knocked at 7.1 s, 2.55 waits short of 10.2 s, a refusal more for every longer window).
    round_stretch: float = 2.6
    #: A window that let go at the end of a closure having taken the count the long window was
    #: read with, within this share (or a request), is a fixed one.
    fixed_share: float = 0.05
    #: Refusals in a row, once sends got through past a cut, that are no echoes of a long window's.
    echo_runs: int = 2

    # -- errors ----------------------------------------------------------------------
    #: Fewest outcomes before the overload share is judged.
    overload_fewest: int = 10
    #: In the opening search up, errors this many times the overload share among the last
    #: ``overload_fewest`` outcomes cut too (nginx's 503s: after 5 errors, not 10). Only there:
    #: random errors at 10 %, answered faster than acceptances, make such runs often.
    overload_run: float = 2.0
    #: In the opening search up, an error with another among the last this many outcomes (its own
    #: included) is shown to the leaky bucket's judge: a bucket refuses most of a doubled rate's
    #: sends, where random errors at 5 % come so paired once in about 100 outcomes (one alone, at
    #: the first send after a doubling, had the scope paced at half the rate).
    opening_pair: int = 3
    #: Errors in the opening past this many acceptances in a row, ``opening_errors`` of them and
    #: most outcomes since, are a limit's refusals, measured as a 429's (not once a share of 10
    #: outcomes: 5 refusals past a long clean run; bare-503 windows at 5-40/s made 391, now 301).
    #: Random errors at 10 % so placed took the scope to 1/s for 20 s one run in 10 before.
    opening_clean: int = 5
    opening_errors: int = 3
    #: Errors among the first ``recut_fewest`` answers past an overload cut's echoes that cut
    #: again at once, from what got through since: the cut was too shallow (nginx's 1 r/s
    #: ``burst=5 nodelay`` at 503: 8 refusals at 3.5/s before ``overload_fewest`` outcomes came).
    #: Random errors at the share that cut (25 %) make 3 of 4 one time in 20.
    recut_fewest: int = 4
    recut_errors: int = 3
    #: Seconds over which the send rate that an overload cut starts from is measured.
    overload_rate_span: float = 2.0
    #: When less than this share of those sends got through, the cut goes no higher than
    #: ``error_margin`` below what did: a limit lets through what it allows (cuts by
    #: ``overload_cut`` took nginx's 1 r/s at 503 through 3.5, 2.45, 1.7, 1.2 and 0.84/s: 37
    #: refusals in a minute). Random errors and a struggling server let more than half through.
    overload_got: float = 0.5
    #: The slowest rate an overload cut goes to (requests per second).
    min_rate: float = 0.05
    #: Accepted sends in a row after an overload cut that prove its errors came
    #: from the rate, not at random: a server failing 10 % of requests at any
    #: rate passes 40 in a row 1.5 times in 100 (5 %: 13 times).
    clean_proof: int = 40
    #: While holding below the edge of a limit that refuses with errors, the
    #: share of errors among the sends of the last two horizons above which
    #: they are its refusals (the edge is lower than measured), not random ones.
    hold_errors: float = 0.1
    #: Fewer errors widen the margin up to this (what random errors may cost
    #: while they look like a limit's refusals)...
    error_margin: float = 0.08
    #: ...when ``widen_fewest`` or more come within ``widen_span`` seconds and
    #: make ``widen_share`` of the sends or more.
    widen_fewest: int = 3
    widen_span: float = 10.0
    widen_share: float = 0.02
    #: Once they widened it, errors that come at this share of the one that
    #: did or more, held lower, are random ones (a limit's refusals thin out).
    widen_random: float = 0.8
    #: Cuts for such errors while holding, in a row, after which they are
    #: taken for random ones (a cut below a limit's edge stops its refusals).
    hold_cuts: int = 2
    #: A hold after an overload cut whose errors are below this share of the
    #: share that cut (the cut thinned them, as a limit's refusals thin) is
    #: tried lower, at the rate that got through.
    thinned: float = 0.5

    # -- a limit on requests in flight -------------------------------------------------
    #: Refusals at one count in flight that make it a concurrency limit...
    inflight_refusals: int = 3
    #: ...at rates whose highest is more than this times the lowest (or with
    #: no answer accepted at more in flight since)...
    inflight_spread: float = 1.25
    #: ...and a count of at least this many.
    inflight_fewest: int = 2
    #: Where the count in flight is not exact (a backend shared by processes
    #: counts leases), counts this far apart are one count.
    inflight_noise: int = 1
    #: A limit on requests in flight refuses with about that many in flight
    #: on average (Little's law: the rate accepted times the latency); a
    #: refusal at a count over this many times what they hold came in a
    #: burst at a rate limit (or counted leases not sent yet).
    inflight_held: float = 2.0

    # -- the concurrency loop ----------------------------------------------------------
    #: The concurrency limit at the start (Vegas slow start doubles it per round).
    start_concurrency: int = 2
    #: The weight of a new latency in the moving mean.
    latency_weight: float = 0.1
    #: Vegas thresholds: grow below this many requests queued at the server,
    #: shrink above the other.
    queue_low: float = 1.5
    queue_high: float = 4.0
    #: A queue far above the high threshold shrinks the limit by this factor
    #: (else by one).
    shrink: float = 0.9
    #: The latencies of one round: enough for a stable mean of varied service
    #: times, or, when they come slowly, at least the fewer ones of
    #: ``round_time`` seconds.
    round_size: int = 30
    round_fewest: int = 3
    round_time: float = 2.0
    #: The windowed minimum RTT keeps two epochs of this length (seconds).
    rtt_epoch: float = 30.0
    #: Latencies whose spread is this share of their mean or more are varied:
    #: the floor's noise is corrected for, and the thresholds stay.
    varied: float = 0.5
    #: The floor's correction counts at least this many rounds (two standard
    #: errors, at least: sqrt(2 ln e^2) = 2).
    few_rounds: float = math.exp(2.0)
    #: The correction raises the floor by at most this share of it: a few
    #: slow answers among many fast ones (a cache in front of an origin) vary
    #: the means so much that a larger one would hide the origin's queue.
    floor_correction: float = 0.5
    #: With steady latencies, the low threshold is at most this share of the
    #: requests being served (a server that serves few at once).
    few_low: float = 0.5
    #: A failure after this many seconds, and this many times the mean
    #: latency, hung: the server was not serving it.
    hung: float = 1.0
    hung_latencies: float = 4.0
    #: Hung requests give no places back while errors are this share of the
    #: overload share or more (a server so overloaded that requests time out
    #: in its queue is to be backed off).
    hung_errors: float = 0.5
