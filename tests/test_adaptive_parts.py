"""Adaptive's parts, each on its own, and the package's shape (sizes, literals, imports)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

import throttlekit
from throttlekit import Adaptive, AdaptiveTuning, Feedback, ScopePolicy, ScopeSnapshot
from throttlekit._adaptive._closure import Closures
from throttlekit._adaptive._concurrency import ConcurrencyLoop
from throttlekit._adaptive._edge import set_edge
from throttlekit._adaptive._errors import ErrorJudge
from throttlekit._adaptive._inflight import InFlightLimit, Verdict
from throttlekit._adaptive._parts import Parts
from throttlekit._adaptive._paused import own_pause
from throttlekit._adaptive._phase import Event, Phase, next_phase
from throttlekit._adaptive._rate import RateLoop
from throttlekit._adaptive._response import Kind, classify, quota_spent
from throttlekit._adaptive._sends import SendLog
from throttlekit._adaptive._spacing import Shown, Spacing
from throttlekit._adaptive._throttle import in_flight_limit, on_throttle
from throttlekit._adaptive._window import keep_window, long_window
from throttlekit.headers import RateLimitInfo

PACKAGE = Path(throttlekit.__file__).parent / "_adaptive"
TUNING = AdaptiveTuning()
POLICY = ScopePolicy(concurrency=16, delay=0, slot_delay=0, adaptive=Adaptive())


def _view(in_flight: int = 0, concurrency: int | None = 16) -> ScopeSnapshot:
    policy = ScopePolicy(concurrency=concurrency, delay=0, slot_delay=0)
    return ScopeSnapshot(
        name="api.test", policy=policy, delay=0.0, concurrency=concurrency, in_flight=in_flight
    )


# -- the package's shape ------------------------------------------------------------------


def _modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(PACKAGE.glob("*.py"))}


def test_every_class_function_and_module_is_a_size_a_reader_can_hold() -> None:
    too_big = []
    for name, tree in _modules().items():
        lines = max((node.end_lineno or 0) for node in tree.body) if tree.body else 0
        if lines > 400:
            too_big.append(f"module {name}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > (300 if isinstance(node, ast.ClassDef) else 50):
                    too_big.append(f"{name}.{node.name}: {size} lines")
    assert not too_big


def _module_level_constant(tree: ast.Module, node: ast.Constant) -> bool:
    return any(
        isinstance(statement, (ast.Assign, ast.AnnAssign))
        and any(child is node for child in ast.walk(statement))
        for statement in tree.body
    )


def test_no_unnamed_numbers_in_the_logic() -> None:
    """Every tunable is named in ``_tuning`` (or is a user's default in ``_config``)."""
    unnamed = []
    for name, tree in _modules().items():
        if name in ("_tuning", "_config"):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, (int, float))
                and not isinstance(node.value, bool)
                and node.value not in (0, 1, 2, 0.5)
                and not _module_level_constant(tree, node)
            ):
                unnamed.append(f"{name}:{node.lineno}: {node.value!r}")
    assert not unnamed


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (names for annotations, not imports)."""
    return {
        id(child)
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for child in ast.walk(node)
    }


def test_the_parts_import_no_one_in_a_circle() -> None:
    graph: dict[str, set[str]] = {}
    for name, tree in _modules().items():
        graph[name] = set()
        typing_only = _typing_only(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 1
                and node.module
                and id(node) not in typing_only
            ):
                graph[name].add(node.module)
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        if seen.get(module) == 1:
            raise AssertionError(" -> ".join([*path, module]))
        if seen.get(module) == 2:
            return
        seen[module] = 1
        for other in sorted(graph.get(module, ())):
            visit(other, [*path, module])
        seen[module] = 2

    for module in sorted(graph):
        visit(module, [])


# -- what a response tells -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retry_after", "kind"),
    [
        (429, None, Kind.THROTTLE),
        (503, 5.0, Kind.THROTTLE),
        (503, None, Kind.OVERLOAD),
        (524, None, Kind.OVERLOAD),
        (200, 1.0, Kind.OK),  # a wait on a success throttles nothing
        (404, None, Kind.OK),
    ],
)
def test_an_answer_is_classified_by_its_status_and_the_wait_it_tells(
    status: int, retry_after: float | None, kind: Kind
) -> None:
    info = RateLimitInfo(retry_after=retry_after) if retry_after is not None else None
    assert classify(Feedback(status=status, rate_limit=info)) is kind


def test_timeouts_are_overload_and_other_exceptions_say_nothing() -> None:
    assert classify(Feedback(exception=TimeoutError())) is Kind.OVERLOAD
    assert classify(Feedback(exception=ValueError())) is Kind.OTHER


def test_a_refusal_is_explained_by_any_budget_the_headers_show_spent() -> None:
    headers = {"x-ratelimit-remaining-requests": "5", "x-ratelimit-remaining-tokens": "0"}
    assert quota_spent(Feedback(status=429, headers=headers), remaining=5)
    assert not quota_spent(Feedback(status=429), remaining=5)
    assert quota_spent(Feedback(status=429), remaining=0)


# -- the log of sends ---------------------------------------------------------------------------


def _log(*sends: tuple[float, bool]) -> SendLog:
    log = SendLog(TUNING)
    for sent_at, accepted in sends:
        log.count(sent_at, accepted=accepted, horizon=1.0, latency=0.0)
    return log


def test_the_log_counts_exactly_and_keeps_two_horizons_back_from_the_last_acceptance() -> None:
    log = _log(*((i / 10, i % 5 != 4) for i in range(50)))  # the last, at 4.9, refused
    assert log.measured(3.9, 4.9, accepted=False) == pytest.approx(10.0)
    assert log.measured(3.9, 4.9, accepted=True) == pytest.approx(8.0)
    assert log.sends[0][0] >= 4.8 - 2.0 - 1e-9  # older than two horizons: forgotten
    assert log.sends[0][0] <= 4.8 - 2.0 + 0.1


def test_the_pace_up_to_the_last_acceptance_counts_two_whole_horizons() -> None:
    # nginx at 2 r/s, refused a gap after the last acceptance: the two
    # horizons up to that acceptance hold four, which a log that kept two
    # horizons back from the refusal had partly forgotten (1/s).
    log = _log(*((26.0 + i * 0.52, True) for i in range(8)), (30.1, False))
    assert log.paced(30.1, 1.0, 0.0) == pytest.approx(2.0)


def test_answers_out_of_send_order_are_logged_in_send_order() -> None:
    log = _log((1.0, True), (0.5, False), (0.8, True))
    assert [entry[0] for entry in log.sends] == [0.5, 0.8, 1.0]


def test_the_pace_of_even_acceptances_is_their_spacing_not_their_count() -> None:
    log = _log(*((i * 0.25, True) for i in range(5)))  # 5 in a second, 4/s apart
    assert log.pace(-0.1, 1.0, TUNING.pace_fewest) == pytest.approx(4.0)
    assert log.pace(-0.1, 0.3, TUNING.pace_fewest) == 0.0  # two: no pace


def test_the_last_gap_accepted_is_between_the_last_two_acceptances_before_a_send() -> None:
    # A probe at nginx's 0.5 r/s: accepted 2.4, 2.2 and 2.0 s apart, refused 1.8 s after.
    log = _log((0.0, True), (2.4, True), (4.6, True), (5.0, False), (6.6, True), (8.4, False))
    assert log.last_gap(8.4, least=2.0) == pytest.approx(1 / 2.0)
    assert log.last_gap(8.4, least=0.1) == 0.0  # a shorter gap accepted once: a stored burst
    between = _log((0.0, True), (1.0, False), (2.2, True), (3.0, False))
    assert between.last_gap(3.5, least=2.2) == pytest.approx(1 / 2.2)  # refusals: no acceptances
    assert _log((0.0, True), (5.0, False)).last_gap(6.0, least=1.0) == 0.0  # one: no gap


def test_the_log_keeps_the_acceptance_before_the_last_however_long_ago() -> None:
    log = _log((0.0, True), (5.0, True), (6.0, False))  # 0.2 r/s: five horizons apart
    assert log.last_gap(6.0, least=5.0) == pytest.approx(1 / 5.0)


def test_a_window_frees_when_its_oldest_acceptance_leaves() -> None:
    log = _log(*((i * 0.1, True) for i in range(10)))
    assert log.window_frees(in_flight=0, allowed=10, window=1.0) == pytest.approx(1.0)
    assert log.window_frees(in_flight=0, allowed=12, window=1.0) is None


def test_the_pause_after_a_long_windows_refusal_counts_the_refused_send_too() -> None:
    loop = RateLoop(Adaptive())
    loop.pause_for_excess(10.5, 10.0, 0.0, 0.0)  # a second's window: half a request over
    assert loop.blocked_until == pytest.approx(0.05)
    long_window(loop, _view(), 10.0, 20, 0.0)  # 20 per 10 s: HAProxy's may count refusals
    loop.pause_for_excess(2.1, 2.0, 0.0, 0.0)  # one over, and the refused one
    assert loop.blocked_until == pytest.approx(1.0)


def test_below_a_long_windows_edge_the_answer_just_logged_is_not_also_counted_in_flight() -> None:
    # The answer that moves the loop is in the log and still in flight when
    # the loop asks whether the window has room: counted twice, HAProxy's
    # 10 per 2 s (read over 2.25 s) was held to 11 sends in 2.44 s, 4.5/s.
    loop = RateLoop(Adaptive())
    long_window(loop, _view(), 2.0, 10, 0.0)  # 10 per 2 s: 5/s
    log = _log(*((i * 0.1, True) for i in range(10)))
    keep_window(loop, _view(in_flight=1), log)  # the answer of 0.9, logged already
    assert loop.blocked_until == pytest.approx(2.0)  # the 11th when the first leaves
    keep_window(loop, _view(in_flight=2), log)  # and one more truly in flight
    assert loop.blocked_until == pytest.approx(2.1)


# -- a leaky bucket without burst -------------------------------------------------------------


def _fed(answers: list[tuple[float, bool]]) -> tuple[Spacing, SendLog]:
    """A Spacing and its log fed ``answers`` (refusals told as they come)."""
    spacing, log = Spacing(Adaptive()), SendLog(TUNING)
    for sent_at, accepted in answers:
        log.count(sent_at, accepted=accepted, horizon=1.0, latency=0.0)
        if not accepted:
            spacing.refused(sent_at, sent_at)
    return spacing, log


def _spaced(answers: list[tuple[float, bool]], now: float) -> tuple[Spacing, Shown]:
    """A Spacing fed ``answers``, judged at ``now``."""
    spacing, log = _fed(answers)
    return spacing, spacing.judge(log, now)


def test_a_refusal_at_half_the_gaps_accepted_shows_a_leaky_bucket() -> None:
    # 8/s accepted, then the doubled rate's first send refused 1/16 s after.
    answers = [(i * 0.125, True) for i in range(6)] + [(0.6875, False)]
    spacing, shown = _spaced(answers, 1.0)
    assert shown is Shown.FOUND
    assert (spacing.lo, spacing.hi) == pytest.approx((0.0625, 0.125))
    assert spacing.interval(1.0) == pytest.approx(0.125 * (1 + TUNING.spacing_guard))
    # A settle after it was judged, a try below the shortest gap accepted:
    # a step of the resolution, not the middle of the bounds (0.09375 s),
    # which is refused where the interval is 0.1 s.
    step = 0.125 / (1 + TUNING.spacing_resolution)
    assert spacing.interval(1.0 + TUNING.spacing_settle) == pytest.approx(step)


def test_a_refusal_as_late_as_a_gap_just_accepted_shows_no_leaky_bucket_yet() -> None:
    # nginx's rate=20r/s burst=5 nodelay spending its burst: refused 47 ms
    # after an acceptance when 31 ms had been accepted, then 16 ms after
    # one. Taken for a bucket without burst paced at 31 ms, it cost five
    # refusals before it was given up.
    answers = [(i * 0.03125, True) for i in range(6)]
    answers += [(0.203, False), (0.21875, True), (0.2344, False)]
    assert _spaced(answers, 1.0)[1] is Shown.NOTHING
    # Without the first refusal, the second shows one.
    assert _spaced([*answers[:6], *answers[7:]], 1.0)[1] is Shown.FOUND


def test_tries_step_down_from_the_shortest_gap_accepted_to_the_middle_of_narrow_bounds() -> None:
    spacing, log = _fed([(i * 0.125, True) for i in range(6)] + [(0.6875, False)])
    assert spacing.judge(log, 1.0) is Shown.FOUND
    at, now = 0.6875, 1.0 + TUNING.spacing_settle
    for _ in range(4):  # each try accepted: the next steps down from it
        gap = spacing.interval(now)
        step = spacing.hi / (1 + TUNING.spacing_resolution)
        assert gap == pytest.approx(max((spacing.lo + spacing.hi) / 2, step))
        at = max(at + gap, now)
        log.count(at, accepted=True, horizon=1.0, latency=0.0)
        now = at + 0.01
        spacing.judge(log, now)
    assert spacing.hi < 0.125 / (1 + TUNING.spacing_resolution) ** 3
    at += spacing.interval(now)  # refused: the bounds are within the resolution
    log.count(at, accepted=False, horizon=1.0, latency=0.0)
    spacing.refused(at, at)
    spacing.judge(log, at)
    assert spacing.hi <= spacing.lo * (1 + TUNING.spacing_resolution)
    assert spacing.interval(at + TUNING.spacing_settle) == pytest.approx(
        spacing.hi * (1 + spacing.guard)
    )


def test_a_window_that_let_a_burst_through_is_not_a_leaky_bucket() -> None:
    # The same gaps, but a burst at 1/32 s apart was accepted first.
    burst = [(i / 32, True) for i in range(4)]
    answers = burst + [(0.2 + i * 0.125, True) for i in range(6)] + [(0.8875, False)]
    spacing, shown = _spaced(answers, 1.2)
    assert shown is Shown.NOTHING
    assert not spacing.on


def test_a_refusal_far_past_a_gap_accepted_is_no_leaky_bucket_at_once() -> None:
    # nginx at 2 r/s with burst=4: the burst went through at 1/8 s, and the
    # doubled rate's send 1/16 s after was refused, as a bucket of 8/s would
    # refuse it; the next refusal, a quarter of a second after an
    # acceptance, shows no such bucket (it took three, paced at 8/s, before).
    answers = [(0.0, True), (0.25, True), (0.5, True)]
    answers += [(0.5 + i * 0.125, True) for i in range(1, 5)] + [(1.0625, False)]
    spacing, log = _fed(answers)
    assert spacing.judge(log, 1.1) is Shown.FOUND
    assert spacing.hi == pytest.approx(0.125)
    log.count(1.25, accepted=False, horizon=1.0, latency=0.0)
    spacing.refused(1.25, 1.25)
    assert spacing.judge(log, 1.3) is Shown.LOST
    assert not spacing.on
    assert spacing.least == 0.0


def test_a_refusal_is_judged_only_once_what_was_sent_before_it_has_answered() -> None:
    spacing, log = Spacing(Adaptive()), SendLog(TUNING)
    for i in range(6):
        log.count(i * 0.125, accepted=True, horizon=1.0, latency=0.2)
        spacing.answered(0.2)
    spacing.refused(0.8125, 0.813)  # back at once; the send at 0.75 is still in flight
    log.count(0.8125, accepted=False, horizon=1.0, latency=0.2)
    assert spacing.judge(log, 0.813) is Shown.NOTHING
    log.count(0.75, accepted=True, horizon=1.0, latency=0.2)
    assert spacing.judge(log, 0.8125 + TUNING.spacing_lag * 0.2) is Shown.FOUND
    assert spacing.lo == pytest.approx(0.0625)  # after the send at 0.75, not 0.625


def test_refusals_at_gaps_it_had_accepted_are_a_window_for_good() -> None:
    spacing, log = _fed([(i * 0.125, True) for i in range(6)] + [(0.6875, False)])
    assert spacing.judge(log, 0.7) is Shown.FOUND
    shown: list[Shown] = []
    guards: list[float] = []
    at = 0.75
    while Shown.LOST not in shown and len(shown) < 10:
        at += 1.0
        log.count(at, accepted=True, horizon=1.0, latency=0.0)
        at += spacing.hi * (1 + TUNING.spacing_max_guard)  # past the widest guard, not far
        log.count(at, accepted=False, horizon=1.0, latency=0.0)
        spacing.refused(at, at)
        shown.append(spacing.judge(log, at))
        guards.append(spacing.guard)
    # The guard doubles to the widest first (2, 4, 8, 16 %), then a few more.
    assert shown[-1] is Shown.LOST
    assert len(shown) == 3 + TUNING.spacing_runs
    assert max(guards) == pytest.approx(TUNING.spacing_max_guard, rel=0.01)  # less a narrowing
    assert spacing.least == 0.0  # never taken for a leaky bucket again


def test_the_guard_narrows_per_acceptance_and_the_pace_moves_up_past_the_widest() -> None:
    # nginx's millisecond clock at 100 r/s accepted a gap of 9.6 ms: paced
    # at the widest guard above it, a refusal moves the pace up a step.
    spacing, log = _fed([(i * 0.125, True) for i in range(6)] + [(0.6875, False)])
    assert spacing.judge(log, 0.7) is Shown.FOUND
    spacing.guard = TUNING.spacing_max_guard
    at = 0.75
    for _ in range(TUNING.spacing_narrow_over):
        at += spacing.hi * (1 + spacing.guard)
        log.count(at, accepted=True, horizon=1.0, latency=0.0)
        spacing.judge(log, at)
    assert spacing.guard == pytest.approx(TUNING.spacing_max_guard / 2)
    spacing.guard = TUNING.spacing_max_guard
    hi = spacing.hi
    at += hi * (1 + TUNING.spacing_max_guard)
    log.count(at, accepted=False, horizon=1.0, latency=0.0)
    spacing.refused(at, at)
    assert spacing.judge(log, at) is Shown.GUARDED
    assert spacing.hi == pytest.approx(hi * (1 + TUNING.spacing_resolution))
    assert spacing.on


def _refused_apart(spacing: Spacing, log: SendLog, apart: int, rounds: int) -> list[Shown]:
    """Rounds of ``apart`` acceptances then a refusal, all at the widest guard's pace."""
    at, shown = 0.75, []
    for _ in range(rounds):
        for _ in range(apart):
            at += spacing.hi * (1 + TUNING.spacing_max_guard)
            log.count(at, accepted=True, horizon=1.0, latency=0.0)
            spacing.judge(log, at)
        at += spacing.hi * (1 + TUNING.spacing_max_guard)
        log.count(at, accepted=False, horizon=1.0, latency=0.0)
        spacing.refused(at, at)
        shown.append(spacing.judge(log, at))
    return shown


def test_refusals_at_gaps_it_had_accepted_far_apart_are_the_networks() -> None:
    # Three processes through Redis at nginx's 10 r/s: the network moves
    # a send closer to the last now and then; a window paced too fast
    # refuses every few sends.
    spacing, log = _fed([(i * 0.125, True) for i in range(6)] + [(0.6875, False)])
    assert spacing.judge(log, 0.7) is Shown.FOUND
    shown = _refused_apart(spacing, log, TUNING.spacing_widen_apart + 1, 2 * TUNING.spacing_runs)
    assert set(shown) == {Shown.NOTHING}
    assert spacing.on
    assert spacing.guard == TUNING.spacing_guard  # too rare to widen it


def test_refusals_at_the_widest_guard_are_no_leaky_buckets() -> None:
    # A bucket with burst, whose burst lowered the shortest gap accepted:
    # refused every 18 sends at the widest guard (nginx's 7 r/s, burst=2).
    spacing, log = _fed([(i * 0.125, True) for i in range(6)] + [(0.6875, False)])
    assert spacing.judge(log, 0.7) is Shown.FOUND
    spacing.guard = TUNING.spacing_max_guard
    shown = _refused_apart(spacing, log, 18, TUNING.spacing_runs)
    assert shown[-1] is Shown.LOST


def test_a_pace_moved_up_at_the_widest_guard_steps_back_after_a_quiet_stretch() -> None:
    # A loaded machine's late sends: refused at the widest guard now and
    # then, the pace moved up and, before, stayed up until a look for a
    # rise (which each refusal put off).
    spacing, log = _fed([(i * 0.125, True) for i in range(6)] + [(0.6875, False)])
    assert spacing.judge(log, 0.7) is Shown.FOUND
    found = spacing.hi
    spacing.guard = TUNING.spacing_max_guard
    assert _refused_apart(spacing, log, 30, 2) == [Shown.GUARDED, Shown.GUARDED]
    assert spacing.on  # refusals 30 sends apart are no window's
    assert spacing.hi == pytest.approx(found * (1 + TUNING.spacing_resolution) ** 2)
    at = log.sends[-1][0]
    for _ in range(3 * TUNING.spacing_widen_apart):
        at += spacing.hi * (1 + spacing.guard)
        log.count(at, accepted=True, horizon=1.0, latency=0.0)
        spacing.judge(log, at)
    assert spacing.hi == pytest.approx(found)  # a step per quiet stretch, no further
    assert spacing.hi <= spacing.lo * (1 + TUNING.spacing_resolution) * 1.000001


# -- the concurrency loop --------------------------------------------------------------------


def _rounds(loop: ConcurrencyLoop, latency: float, rounds: int, start: float = 0.0) -> float:
    now = start
    for _ in range(rounds):
        limit = loop.limit or 1
        for _ in range(max(TUNING.round_size, limit)):
            now += 0.01
            loop.sample(_view(in_flight=limit), latency, now, top=64)
    return now


def test_the_concurrency_loop_grows_while_latency_stays_at_its_floor() -> None:
    loop = ConcurrencyLoop(TUNING, ceiling=None)
    _rounds(loop, 0.05, 5)
    assert loop.limit == 2 * 2**5


def test_the_concurrency_loop_shrinks_when_latency_shows_a_queue() -> None:
    loop = ConcurrencyLoop(TUNING, ceiling=None)
    now = _rounds(loop, 0.05, 3)
    grown = loop.limit
    assert grown is not None
    _rounds(loop, 0.5, 3, start=now)  # ten times the floor: a queue of 90 % of the limit
    assert loop.limit is not None
    assert loop.limit < grown


def test_a_hung_failure_gives_its_place_back_for_as_long_as_it_hung() -> None:
    loop = ConcurrencyLoop(TUNING, ceiling=8)
    limit = loop.concurrency
    assert limit is not None
    loop.hang(True, 10.0, 10.0, errors_high=False)
    assert loop.concurrency == limit + 1
    loop.hang(False, 0.1, 19.0, errors_high=False)
    assert loop.concurrency == limit + 1
    loop.hang(False, 0.1, 20.5, errors_high=False)
    assert loop.concurrency == limit
    loop.hang(True, 10.0, 30.0, errors_high=True)  # an overloaded server's: none
    assert loop.concurrency == limit


# -- the detector of a limit on requests in flight ----------------------------------------------


def test_refusals_at_one_count_at_rates_apart_are_a_limit_in_flight() -> None:
    detector = InFlightLimit(TUNING)
    verdicts = []
    for sent_at, accepted in ((10.0, 10), (20.0, 20), (30.0, 30)):
        log = _log(*((sent_at - 1 + (i + 0.5) / accepted, True) for i in range(accepted)))
        verdicts.append(detector.refused(4, sent_at, sent_at, log))
    assert verdicts == [Verdict.NOTHING, Verdict.NOTHING, Verdict.FOUND]
    assert detector.count == 4
    assert detector.refused(5, 31.0, 31.0, _log()) is Verdict.KNOWN
    assert detector.refused(2, 32.0, 32.0, _log()) is Verdict.DISPROVED  # lower
    assert detector.count is None


def _accepted_together(detector: InFlightLimit, in_flight: int, at: float) -> None:
    """``in_flight`` requests sent a ms apart from ``at``, accepted in that order 0.1 s later."""
    for i in range(in_flight):
        detector.accepted(at + i / 1000, at + 0.1 + i / 1000)


def test_refusals_at_one_count_at_one_rate_are_a_rate_limit_if_more_were_accepted() -> None:
    detector = InFlightLimit(TUNING)
    for sent_at in (10.0, 20.0, 30.0):
        log = _log(*((sent_at - 1 + (i + 0.5) / 10, True) for i in range(10)))
        assert detector.refused(4, sent_at, sent_at, log) is Verdict.NOTHING
        _accepted_together(detector, 6, sent_at + 1)  # more in flight than it refused at


def test_refusals_at_one_count_when_never_more_were_accepted_are_a_limit_in_flight() -> None:
    detector = InFlightLimit(TUNING)
    verdicts = []
    for sent_at in (10.0, 20.0, 30.0):
        log = _log(*((sent_at - 1 + (i + 0.5) / 10, True) for i in range(10)))
        _accepted_together(detector, 4, sent_at - 2)
        verdicts.append(detector.refused(4, sent_at, sent_at, log))
    assert verdicts == [Verdict.NOTHING, Verdict.NOTHING, Verdict.FOUND]


def test_a_refusal_counts_what_was_in_flight_when_it_was_sent() -> None:
    # Four sent 5 ms apart before a 20 ms origin; the fifth, sent at 20 ms,
    # is refused and its refusal comes back at 21 ms, when the first has
    # answered: three in flight then, four when it was sent.
    def count(now: float) -> int | None:
        detector = InFlightLimit(TUNING)
        detector.accepted(0.0, 0.0205)
        for _ in range(3):
            detector.refused(3, 0.02, now, _log(), latency=0.02)
        return detector.count

    assert count(0.021) == 4
    assert count(0.5) == 3  # judged late: those in flight now were sent since


def test_counts_one_apart_are_one_limit_where_the_count_is_not_exact() -> None:
    # Through a shared backend, the count in flight is the processes' leases:
    # three refusals at one nginx limit_conn 4 read 5, 6 and 5. Exact counts
    # that far apart are no such limit (a leaky bucket refuses at any count).
    verdicts: dict[bool, list[Verdict]] = {}
    for exact in (True, False):
        detector = InFlightLimit(TUNING)
        verdicts[exact] = []
        for sent_at, accepted, flying in ((10.0, 10, 5), (20.0, 20, 6), (30.0, 30, 5)):
            log = _log(*((sent_at - 1 + (i + 0.5) / accepted, True) for i in range(accepted)))
            verdicts[exact].append(detector.refused(flying, sent_at, sent_at, log, exact=exact))
        if not exact:
            assert detector.count == 5  # the lowest
    assert verdicts[True] == [Verdict.NOTHING] * 3
    assert verdicts[False] == [Verdict.NOTHING, Verdict.NOTHING, Verdict.FOUND]


def test_a_count_read_high_by_an_answer_within_the_refusals_round_trip_is_one_count() -> None:
    # nginx's limit_conn 4 before a 100 ms origin, in one process: refusals
    # read 4, 5 and 4 in flight, the 5 counting an answer that came back
    # within the refused request's round trip (it may have left the server
    # before the refused one came). Taken for counts that differ, they were
    # read as a rate limit, held at 89 % of what the server allows.
    def verdicts(answered: float) -> tuple[list[Verdict], int | None]:
        detector = InFlightLimit(TUNING)
        found = []
        for sent_at, accepted in ((10.0, 40), (20.0, 50), (30.0, 60)):
            log = _log(*((sent_at - 1 + (i + 0.5) / accepted, True) for i in range(accepted)))
            if sent_at == 20.0:
                detector.accepted(19.9, sent_at + answered)
            found.append(detector.refused(4, sent_at, sent_at + 0.002, log, latency=0.1))
        return found, detector.count

    # Answered within the round trip: the count reads 4 or 5, as its neighbours.
    assert verdicts(0.001) == ([Verdict.NOTHING, Verdict.NOTHING, Verdict.FOUND], 4)
    # Still in flight at the refusal (counted in its 4 then): 4, 4 and 4.
    assert verdicts(0.003)[0][-1] is Verdict.FOUND
    # 4, 6 and 4 still in flight: no such limit.
    detector = InFlightLimit(TUNING)
    for sent_at, flying in ((10.0, 4), (20.0, 6), (30.0, 4)):
        last = detector.refused(flying, sent_at, sent_at + 0.002, _log(), latency=0.1)
    assert last is Verdict.NOTHING


def test_refusals_with_more_in_flight_than_the_rate_holds_are_a_burst_not_a_limit() -> None:
    # Three processes through Redis against nginx limit_req 20r/s burst=10:
    # the opening's refusals read 3, 3 and 3 leases at 31, 31 and 30/s. Those
    # answers come back in 2 ms, so 30/s holds 0.06 in flight on average: no
    # limit on requests in flight refuses there. Taken for one of 3, the scope
    # lost its rate and sent 22 refused requests in 80 ms. Behind a 100 ms
    # origin the same readings hold 3 on average: a limit in flight.
    verdicts: dict[float, list[Verdict]] = {}
    for latency in (0.002, 0.1):
        detector = InFlightLimit(TUNING)
        verdicts[latency] = []
        for sent_at in (2.40, 2.45, 2.50):
            log = _log(*((sent_at - 1 + (i + 0.5) / 30, True) for i in range(30)))
            verdict = detector.refused(3, sent_at, sent_at, log, exact=False, latency=latency)
            verdicts[latency].append(verdict)
    assert verdicts[0.002] == [Verdict.NOTHING] * 3
    assert verdicts[0.1] == [Verdict.NOTHING, Verdict.NOTHING, Verdict.FOUND]


@pytest.mark.parametrize("exact", [True, False])
def test_leases_a_shared_backend_granted_ahead_do_not_count_as_sent_before_a_refusal(
    exact: bool,
) -> None:
    # Three processes through Redis against nginx limit_req 20r/s burst=10
    # (503): the opening's refusal came back with three more leases than the
    # refused one, granted ahead of their sends or sent after it. Counted as
    # sent before it, they read the edge 31/s where one process read 28/s,
    # and the held rate sat a request above the bucket's: 2.3-2.6 % refused
    # against 1.3 % in one process. At 20/s answered in 2 ms, about none of
    # them were sent before it.
    parts = Parts(Adaptive(), POLICY)
    parts.closures.begin(0.0)
    for i in range(40):
        parts.log.count(i / 20, accepted=True, horizon=1.0, latency=0.002)
    parts.concurrency_loop.latency = 0.002
    parts.log.count(2.0, accepted=False, horizon=1.0, latency=0.002)
    view = ScopeSnapshot(
        name="api.test",
        policy=POLICY,
        delay=0.0,
        concurrency=16,
        in_flight=4,
        in_flight_exact=exact,
    )
    on_throttle(parts, view, 2.0, 2.002, 0.0)
    # (An exact count, in one process, is of requests sent: all three count.)
    assert parts.rate_loop.edge == (22.0 if exact else 19.0)


def _found_inexact(count: int) -> InFlightLimit:
    """A limit in flight of ``count``, read from inexact counts at rates that differ."""
    detector = InFlightLimit(TUNING)
    for sent_at, accepted in ((10.0, 10), (20.0, 20), (30.0, 30)):
        log = _log(*((sent_at - 1 + (i + 0.5) / accepted, True) for i in range(accepted)))
        detector.refused(count, sent_at, sent_at, log, exact=False)
    assert detector.count == count
    return detector


def test_a_refusal_just_below_an_inexact_limit_lowers_it() -> None:
    detector = _found_inexact(5)
    assert detector.refused(5, 31.0, 31.0, _log(), exact=False) is Verdict.KNOWN
    assert detector.refused(4, 32.0, 32.0, _log(), exact=False) is Verdict.FOUND  # one lower
    assert detector.count == 4
    assert detector.refused(4, 33.0, 33.0, _log(), exact=False) is Verdict.KNOWN
    assert detector.refused(3, 34.0, 34.0, _log(), exact=False) is Verdict.DISPROVED
    assert detector.count is None


def test_a_limit_in_flight_read_at_a_full_cap_is_a_bound_a_lower_reading_refines() -> None:
    # Through Redis, under load: nginx limit_conn 4 refused a burst at a cap
    # of 8 at 7, 7 and 7 leases (each freed slot refilled at once, by a send
    # refused in turn), then at 5. That 5 disproved the limit, and the scope
    # was held as a rate limit at 55 % of what the server allows.
    def found(cap: int) -> InFlightLimit:
        detector = InFlightLimit(TUNING)
        for sent_at in (3.30, 3.31, 3.32):
            detector.refused(7, sent_at, sent_at, _log(), cap=cap, exact=False)
        assert detector.count == 7
        return detector

    detector = found(cap=8)
    assert detector.refused(5, 3.40, 3.40, _log(), cap=7, exact=False) is Verdict.FOUND  # refined
    assert detector.count == 5
    assert detector.refused(4, 3.50, 3.50, _log(), cap=5, exact=False) is Verdict.FOUND  # one lower
    assert detector.refused(1, 3.60, 3.60, _log(), cap=4, exact=False) is Verdict.DISPROVED
    # Read below the cap, the limit was a real reading: a lower one disproves it.
    detector = found(cap=16)
    assert detector.refused(5, 3.40, 3.40, _log(), cap=7, exact=False) is Verdict.DISPROVED


def test_refusals_at_the_cap_once_it_held_disprove_a_limit_in_flight() -> None:
    # A leaky bucket at 100/s, its sends up to 20 ms late, read 4, 4 and 4
    # in flight at 47, 42 and 42/s: taken for a limit in flight, capped at
    # 4, it went on refusing there (nginx's limit_conn 4, so capped, refused
    # none in the rest of a 40 s run). Once refuted so, only rates that
    # differ show such a limit again.
    def found(*, exact: bool) -> InFlightLimit:
        detector = InFlightLimit(TUNING)
        for sent_at in (10.0, 10.1, 10.2):
            log = _log(*((sent_at - 1 + (i + 0.5) / 42, True) for i in range(42)))
            detector.refused(4, sent_at, sent_at, log, exact=exact)
        assert detector.count == 4
        return detector

    detector = found(exact=True)
    # Sent before the cap held: the limit's own refusals.
    assert detector.refused(4, 10.15, 10.25, _log()) is Verdict.KNOWN
    verdicts = [detector.refused(4, at, at, _log()) for at in (10.3, 10.4, 10.5)]
    assert verdicts == [Verdict.KNOWN, Verdict.KNOWN, Verdict.DISPROVED]
    assert detector.count is None
    for sent_at in (11.0, 11.1, 11.2):  # one count, one rate: no longer enough
        log = _log(*((sent_at - 1 + (i + 0.5) / 42, True) for i in range(42)))
        assert detector.refused(4, sent_at, sent_at, log) is Verdict.NOTHING
    log = _log(*((19.0 + (i + 0.5) / 20, True) for i in range(20)))
    assert detector.refused(4, 20.0, 20.0, log) is Verdict.FOUND  # at a rate that differs
    # A shared backend's counts may read high: there, refusals at the cap
    # lower it by one first, and refusals at the lowered cap disprove it.
    detector = found(exact=False)
    verdicts = [detector.refused(4, at, at, _log(), exact=False) for at in (10.3, 10.4, 10.5)]
    assert verdicts == [Verdict.KNOWN, Verdict.KNOWN, Verdict.FOUND]
    assert detector.count == 3
    assert detector.refused(3, 10.45, 10.6, _log(), exact=False) is Verdict.KNOWN  # sent before
    verdicts = [detector.refused(3, at, at, _log(), exact=False) for at in (10.7, 10.8, 10.9)]
    assert verdicts == [Verdict.KNOWN, Verdict.KNOWN, Verdict.DISPROVED]
    assert detector.count is None


def test_three_processes_sharing_nginx_limit_conn_lower_a_count_their_leases_read_high() -> None:
    # Through Redis, nginx's limit_conn 4 read 5, 5 and 5 leases in flight:
    # capped at 5, about 50 refusals came at that cap in 6 s.
    detector = _found_inexact(5)
    for at in (31.0, 31.1, 31.2):
        detector.refused(5, at, at, _log(), exact=False)
    assert detector.count == 4
    assert detector.refused(4, 31.1, 31.3, _log(), exact=False) is Verdict.KNOWN
    assert detector.count == 4


def test_the_log_of_a_limit_in_flight_refined_gives_the_count_it_read_high(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It repeated the three refusals that had found the old count, which
    # say nothing of the new one.
    parts = Parts(Adaptive(), POLICY)
    parts.inflight = _found_inexact(5)
    view = ScopeSnapshot(
        name="api.test", policy=POLICY, delay=0.0, concurrency=5, in_flight=4, in_flight_exact=False
    )
    with caplog.at_level("DEBUG", logger="throttlekit.adaptive"):
        verdict = in_flight_limit(parts, view, 4, 32.0, 32.0)
    assert verdict is Verdict.FOUND
    assert parts.inflight.count == 4
    assert caplog.messages == [
        "scope api.test: refused with 4 in flight, the 5 found reading high: "
        "a concurrency limit of 4"
    ]


def test_errors_are_only_counted_until_judged() -> None:
    detector = InFlightLimit(TUNING)
    for sent_at in (10.0, 20.0, 30.0):
        assert detector.refused(4, sent_at, sent_at, _log(), judge=False) is Verdict.NOTHING
    assert detector.refused(4, 31.0, 31.0, _log()) is Verdict.FOUND


# -- the judge of errors -----------------------------------------------------------------------


def test_overload_needs_its_share_of_enough_outcomes() -> None:
    judge = ErrorJudge(TUNING, overload_share=0.25)
    for _ in range(3):
        judge.remember(True)
    assert not judge.overloaded()  # three of three, but too few
    for _ in range(9):
        judge.remember(False)
    assert judge.overloaded()  # 3 of 12
    judge.remember(False)
    assert not judge.overloaded()  # 3 of 13


def test_a_run_of_errors_cuts_only_in_the_opening_search() -> None:
    # 5 of the last 10 answers, 5 of 30 in all: under the overload share,
    # but a limit's refusals once the opening search doubled past it.
    judge = ErrorJudge(TUNING, overload_share=0.25)
    for error in [False] * 20 + [False, True] * 5:
        judge.remember(error)
    assert judge.overloaded(opening=True)
    assert not judge.overloaded()
    judge.remember(False)
    judge.remember(False)
    assert not judge.overloaded(opening=True)  # 4 of the last 10


def test_errors_end_the_opening_only_after_a_clean_run_and_as_most_outcomes_since() -> None:
    def judge_of(outcomes: str) -> ErrorJudge:
        judge = ErrorJudge(TUNING, overload_share=0.25)
        for outcome in outcomes:
            judge.remember(outcome == "x")
        return judge

    assert judge_of("......." + "xxx").ended_run()  # a limit's refusals past the search
    assert judge_of("......" + "x.x.x").ended_run()  # a leaky bucket's, every other send
    assert not judge_of("...." + "xxx").ended_run()  # too short a clean run
    assert not judge_of("......" + "x..x..x").ended_run()  # scattered: random ones
    assert not judge_of("..........").ended_run()  # no error at all
    assert not judge_of("......" + "xx").ended_run()  # too few errors yet
    assert judge_of("." * 30 + "xxx").ended_run()  # a long run: three, not a share of them all


def test_only_errors_two_together_in_the_opening_are_shown_to_the_leaky_bucket_judge() -> None:
    judge = ErrorJudge(TUNING, overload_share=0.25)
    for outcome in "...x":
        judge.remember(outcome == "x")
    assert not judge.paired()
    judge.remember(False)
    judge.remember(True)
    assert judge.paired()  # two among the last three
    judge.remember(False)
    judge.remember(False)
    judge.remember(True)
    assert not judge.paired()


def test_a_cut_too_shallow_is_seen_in_the_first_answers_past_its_echoes() -> None:
    judge = ErrorJudge(TUNING, overload_share=0.25)
    for _ in range(3):
        judge.remember(True, fresh=True)
    assert not judge.cut_shallow()  # no cut yet: the opening's errors judge themselves
    judge.cut()
    for _ in range(5):
        judge.remember(True)  # echoes of what was sent before the cut
    assert not judge.cut_shallow()
    for outcome in (True, False, True):
        judge.remember(outcome, fresh=True)
    assert not judge.cut_shallow()
    judge.remember(True, fresh=True)
    assert judge.cut_shallow()  # three of the first four
    judge.cut()
    assert not judge.cut_shallow()


def test_a_few_errors_close_together_while_holding_widen_the_margin() -> None:
    judge = ErrorJudge(TUNING, overload_share=0.25)
    margins = [judge.widened(_view(), now, 10.0, 0.118, (0.02, 0.02)) for now in (1.0, 2.0, 3.0)]
    assert margins == [None, None, 0.118]  # at once to a request per second below the edge
    fast = ErrorJudge(TUNING, overload_share=0.25)
    margins = [fast.widened(_view(), now, 100.0, 0.03, (0.02, 0.02)) for now in (1.0, 1.1, 1.2)]
    assert margins == [None, None, TUNING.error_margin]  # or to error_margin


def test_errors_as_many_held_lower_are_random_and_reset_the_margin() -> None:
    judge = ErrorJudge(TUNING, overload_share=0.25)
    for now in (1.0, 2.0, 3.0):
        judge.widened(_view(), now, 10.0, 0.118, (0.02, 0.02))
    margins = [judge.widened(_view(), now, 9.6, 0.118, (0.04, 0.02)) for now in (3.5, 4.0, 4.5)]
    assert margins == [None, None, 0.02]
    assert judge.widen_off


# -- closed servers --------------------------------------------------------------------------


def test_a_closed_server_is_waited_for_longer_each_time_up_to_the_longest_hold() -> None:
    closures = Closures(TUNING, max_wait=60.0)
    assert [closures.close(5.0, 5.0) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert closures.closed_at == 5.0


def test_a_closure_is_of_echoes_only_while_every_refusal_in_it_was_one() -> None:
    closures = Closures(TUNING, max_wait=60.0)
    closures.close(5.0, 5.5, echo=True)
    closures.close(5.0, 6.5, echo=True)
    assert closures.echoes  # the cut's own sends, still in the window
    closures.close(5.0, 8.5)
    assert not closures.echoes  # a knock past them refused too: the limit moved
    closures.open()
    closures.close(9.0, 9.5, echo=True)
    assert closures.echoes  # a new closure counts afresh


def _knocked(count: int) -> tuple[Closures, list[float]]:
    """A fixed 10 s window spent in its first 1.7 s, knocked on ``count`` times."""
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    knocks, now = [], 1.7
    for _ in range(count):
        now += closures.close(1.7, now)
        knocks.append(round(now, 2))
    return closures, knocks


def test_a_closed_server_is_knocked_on_just_after_round_windows_since_the_run_began() -> None:
    # Knocks at 2.7, 5.1, 10.2 and 15.3 s (doubled waits knock at 2.7, 3.7,
    # 5.7, 9.7 and 17.7 s, and read it as 17.7 s long: 57 % of its rate). No
    # round window is skipped: knocks kept to the doubled pace went from
    # 15.3 to 30.6 s and read a fixed 30 per 20 s as 30.6 s long (75 % of
    # its rate in five minutes).
    assert _knocked(7)[1] == [2.7, 5.1, 10.2, 15.3, 20.4, 30.6, 61.2]
    # Past 5 s, none goes between round windows 2.55 doubled waits apart (a
    # knock at 7.1 s cost every longer window, 60 per minute too, a refusal).
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    closures.close(2.5, 3.5)
    assert closures.close(2.5, 5.1) == pytest.approx(5.1)
    # One accepted after a round knock reopens the server (after a doubled
    # wait, only once two knocks were refused).
    closures, _ = _knocked(4)
    assert closures.accepted(10.2, cut_at=1.7)
    # A run that began long ago keeps the doubled waits: its round windows
    # are too far apart to say where a window ends.
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    assert [closures.close(130.0, 130.0 + t) for t in (0.0, 1.0, 3.0)] == [1, 2, 4]


def test_a_closure_is_within_a_window_while_it_lasts_no_longer() -> None:
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    closures.close(57.3, 59.6)
    assert closures.within(20.4, 63.0)  # a fixed window a probe spent at 57.3 s
    assert not closures.within(20.4, 78.0)  # closed longer than the window


def test_refusals_in_a_row_after_sends_got_through_past_a_cut_are_no_echoes() -> None:
    # HAProxy counts refusals too: held at 2.03/s against 2.0/s, every
    # refusal within the 15.3 s horizon of the cut was taken for an echo of
    # it, and the scope sent on into the counter for 12 s, 24 refusals.
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    closures.cut()
    assert not closures.refused(2)  # an echo of the cut: nothing through since
    assert not closures.refused(2)
    closures.accepted(1.0, cut_at=0.5)
    assert not closures.refused(2)  # one refusal after sends got through: may be an echo
    assert closures.refused(2)  # a second in a row: the window filled again
    closures.cut()
    assert not closures.refused(2)  # counted afresh from the new cut


def test_a_window_that_lets_go_having_taken_what_the_long_window_read_is_a_fixed_one() -> None:
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    for sent_at in range(100):
        closures.accepted(sent_at / 40, cut_at=-math.inf)
    closures.close(2.5, 2.5)
    assert closures.long_window(61.2) == (61.2, 99)
    assert not closures.fixed_window(91)  # another count (HAProxy's period, read long)
    assert not closures.fixed
    assert closures.fixed_window(98)  # within a request or 5 %: a fixed window
    assert closures.fixed
    assert closures.fixed_window(70)  # and it stays one


def test_closed_longer_than_it_was_open_is_a_long_window() -> None:
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    for sent_at in range(30):
        closures.accepted(float(sent_at), cut_at=-math.inf)
    closures.close(10.0, 10.0)
    assert closures.long_window(50.0) == (50.0, 29)  # closed 40 s after 10 s open
    assert (closures.run_at, closures.run_ok) == (50.0, 1)


def test_closed_briefly_after_a_held_limit_is_not_a_long_window() -> None:
    closures = Closures(TUNING, max_wait=60.0)
    closures.begin(0.0)
    closures.close(40.0, 40.0)
    assert closures.long_window(45.0) is None
    # The search up after it is a new run: a window read at its first limit
    # counts from 45 s, not from when sending began (189 s for a 10 s window).
    assert (closures.run_at, closures.run_ok) == (45.0, 1)


# -- the rate loop ---------------------------------------------------------------------------


def test_phases_move_only_as_the_transitions_say() -> None:
    assert next_phase(Phase.HOLD, Event.HELD) is Phase.PROBE
    assert next_phase(Phase.PROBE, Event.EDGE) is Phase.RECOVER
    with pytest.raises(RuntimeError, match="HELD cannot come in phase start"):
        next_phase(Phase.START, Event.HELD)


def test_a_new_edge_restarts_below_it_and_a_confirmed_one_holds_longer() -> None:
    loop = RateLoop(Adaptive())
    assert set_edge(loop, _view(), 10.0, 14.0, 0.0, 5.0, 0.0, Phase.START)
    assert loop.phase is Phase.RECOVER
    assert loop.rate == pytest.approx(9.0)  # 0.9 of a new edge
    assert loop.target == pytest.approx(9.8)
    assert loop.hold_for == 10.0
    assert loop.blocked_until == pytest.approx(5.0 + 0.4)  # what went out above it drains
    assert not set_edge(loop, _view(), 10.3, 10.5, 0.0, 30.0, 0.0, Phase.PROBE)
    assert loop.hold_for == 20.0  # confirmed: twice as long
    assert loop.edge == pytest.approx(10.3)  # the higher of the two counts


def test_a_refusal_while_holding_at_the_edge_widens_the_margin() -> None:
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 10.0, 14.0, 0.0, 5.0, 0.0, Phase.START)
    set_edge(loop, _view(), 10.0, 10.0, 0.0, 8.0, 0.0, Phase.HOLD)
    assert loop.margin == pytest.approx(0.04)
    set_edge(loop, _view(), 10.0, 10.0, 0.0, 11.0, 0.0, Phase.HOLD)
    assert loop.margin == pytest.approx(0.118)  # 9/s with the headroom: a request below
    set_edge(loop, _view(), 10.0, 10.0, 0.0, 14.0, 0.0, Phase.HOLD)
    assert loop.margin == pytest.approx(0.236)  # past it, it doubles


def test_between_a_margin_refused_while_holding_and_one_that_held_the_margin_bisects() -> None:
    # nginx's 5 r/s burst=5 nodelay counts 6: held 13 % below it (5.2/s) it
    # refused within seconds, widened to 26 % (4.4/s) it held, and each
    # probe took it back to 13 %: 91.7 % of its rate for five minutes.
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 6.0, 8.0, 0.0, 5.0, 0.0, Phase.START)
    loop.margin = 0.13
    set_edge(loop, _view(), 6.0, 6.0, 0.0, 8.0, 0.0, Phase.HOLD)  # refused at 13 %
    assert loop.failed_margin == pytest.approx(0.13)
    assert loop.margin == pytest.approx(0.26)  # nothing held wider yet: doubled
    loop.held_margin, loop.margin = 0.26, 0.13  # held there; the probe starts at half
    loop.rate = 7.0
    set_edge(loop, _view(), 6.0, 7.0, 0.0, 30.0, 0.0, Phase.PROBE)  # refused past the edge
    assert loop.margin == pytest.approx(0.195)  # halfway, not the 13 % refused while holding
    set_edge(loop, _view(), 6.0, 6.0, 0.0, 33.0, 0.0, Phase.HOLD)  # refused there too
    assert loop.margin == pytest.approx(0.2275)  # halfway again, below the 26 % that held
    loop.held_margin = 0.2275
    loop.failed_margin = 0.22
    loop.margin = 0.11
    set_edge(loop, _view(), 6.0, 7.0, 0.0, 60.0, 0.0, Phase.PROBE)
    assert loop.margin == pytest.approx(0.2275)  # within margin_resolution: the one that held
    set_edge(loop, _view(), 9.0, 10.0, 0.0, 90.0, 0.0, Phase.START)  # a new edge
    assert loop.failed_margin == 0.0


def test_a_second_refusal_goes_to_one_request_per_second_below_unless_told_longer() -> None:
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 11.0, 14.0, 1.0, 5.0, 0.0, Phase.START)
    for now in (8.0, 11.0):  # HAProxy's refusals: told to wait the horizon
        set_edge(loop, _view(), 11.0, 11.0, 1.0, now, 0.0, Phase.HOLD)
    assert loop.target == pytest.approx(10.0 * 0.98)  # 4 %, then 10.9 %, not 8 % then 16 %
    fast = RateLoop(Adaptive())
    set_edge(fast, _view(), 100.0, 104.0, 1.0, 5.0, 0.0, Phase.START)
    set_edge(fast, _view(), 100.0, 100.0, 1.0, 8.0, 0.0, Phase.HOLD)
    assert fast.target == pytest.approx(99.0 * 0.98)  # a request is 1 %: it stops there
    set_edge(fast, _view(), 100.0, 100.0, 1.0, 11.0, 0.0, Phase.HOLD)
    assert fast.margin == pytest.approx(2 * (1 - 0.99 * 0.98))  # then doubles
    longer = RateLoop(Adaptive())
    set_edge(longer, _view(), 11.0, 14.0, 4.0, 5.0, 0.0, Phase.START)
    for now in (18.0, 31.0, 44.0):  # a longer window's: its count is not its limit
        set_edge(longer, _view(), 11.0, 11.0, 4.0, now, 0.0, Phase.HOLD)
    assert longer.margin == pytest.approx(0.16)


@pytest.mark.parametrize("horizon", [2.0, 3.0, 5.1, 10.2, 15.3, 30.6, 61.2])
def test_a_request_more_over_the_horizon_confirms_the_edge_whatever_the_rounding(
    horizon: float,
) -> None:
    # 11 against 10 over 10.2 s is a hair more than 1 / 10.2 apart in floating
    # point: it read as a new edge, and a fixed 10 per 10 s went to 0.79/s.
    loop = RateLoop(Adaptive())
    loop.horizon = horizon
    for count in range(7, 120):  # (below 7, a request is more than near_cap)
        assert loop.near((count + 1) / horizon, count / horizon)
        assert loop.near(count / horizon, (count + 1) / horizon)
        assert loop.near((count + 2) / horizon, count / horizon) is (count * 0.07 >= 2)


def test_a_refusal_counting_the_pace_held_below_an_edge_that_held_is_sends_jostled() -> None:
    # Three processes through Redis on a loaded machine, at a sliding 10/s
    # with Retry-After: 1: the edge read 10, then 11 twice (held at 9.8/s),
    # then 9: a new edge, and 8/s for a minute.
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 10.0, 11.0, 1.0, 2.0, 0.0, Phase.START)
    for now in (4.0, 6.0):
        set_edge(loop, _view(), 11.0, 11.0, 1.0, now, 0.0, Phase.HOLD)
    assert loop.edge_held
    assert loop.rate == pytest.approx(9.8)
    assert not set_edge(loop, _view(), 9.0, 10.0, 1.0, 12.0, 0.0, Phase.HOLD)  # confirmed
    assert loop.edge == 11.0
    assert loop.rate == pytest.approx(11.0 * (1 - 2 * 0.109), abs=0.01)  # the margin doubled
    # Counted well below the pace held, it is a new edge (a limit that moved).
    assert set_edge(loop, _view(), 7.0, 8.0, 1.0, 20.0, 0.0, Phase.HOLD)
    assert loop.edge == 7.0


def test_a_refusal_at_an_edge_held_long_resumes_at_half_for_two_horizons() -> None:
    # A sliding 10/s that drops to 5/s, Retry-After: 1: the refusal counts
    # the old limit's sends still in the window, so it cannot tell the new
    # limit; resumed at the target, the next refusal and its wait would come
    # within the window.
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 10.0, 11.0, 1.0, 2.0, 0.0, Phase.START)
    assert not set_edge(loop, _view(), 10.0, 10.0, 1.0, 20.0, 0.0, Phase.HOLD)
    assert loop.edge == 10.0
    assert loop.rate == pytest.approx(0.5 * loop.target)
    assert loop.phase is Phase.RECOVER
    assert loop.phase_at == pytest.approx(20.0 + 1.0 + 2.0)  # after the wait, two horizons
    assert "it may have dropped" in loop.reason
    # Refused there at about that rate: the new limit, not sends jostled.
    assert set_edge(loop, _view(), 5.0, 6.0, 1.0, 23.5, 0.0, Phase.RECOVER)
    assert loop.edge == 5.0


@pytest.mark.parametrize(
    ("edge", "wait", "now"),
    [
        (11.0, 1.0, 9.0),  # held three horizons: the margin's, as before
        (11.0, 4.0, 20.0),  # told a longer wait: a longer window's count
        (9.0, 1.0, 20.0),  # counted at the pace held, below the edge: sends jostled
    ],
)
def test_a_refusal_held_briefly_or_not_at_the_edge_resumes_at_the_target(
    edge: float, wait: float, now: float
) -> None:
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 10.0, 11.0, 1.0, 2.0, 0.0, Phase.START)
    for at in (4.0, 6.0):  # confirmed, the margin widened to a request below
        set_edge(loop, _view(), 11.0, 11.0, 1.0, at, 0.0, Phase.HOLD)
    assert loop.rate == pytest.approx(loop.target)
    set_edge(loop, _view(), edge, edge, wait, now, 0.0, Phase.HOLD)
    assert loop.rate == pytest.approx(loop.target)
    assert "dropped" not in loop.reason


def test_a_refusal_the_clients_own_pause_explains_is_no_drop_and_widens_no_margin() -> None:
    # An httpx client's full collection of 45 ms at 9.6/s against 10 per
    # sliding second: the sends before it left late, and the window that
    # still held them a second later refused one at the edge held long.
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 10.0, 11.0, 1.0, 2.0, 0.0, Phase.START)
    loop.rate = 9.6
    assert own_pause(loop, (0.5, 0.045))
    assert own_pause(loop, (1.04, 0.045))  # the window still held the late sends
    assert not own_pause(loop, (1.2, 0.045))  # a horizon on, they had left it
    assert not own_pause(loop, (0.5, 0.003))  # shorter than the 4 ms the pace leaves
    assert not own_pause(loop, None)
    margin = loop.margin
    assert not set_edge(loop, _view(), 10.0, 10.0, 1.0, 20.0, 0.0, Phase.HOLD, own=True)
    assert loop.rate == pytest.approx(loop.target)
    assert loop.margin == margin
    assert "after a pause of this process" in loop.reason
    # Without the pause, the same refusal widens the margin.
    set_edge(loop, _view(), 10.0, 10.0, 1.0, 21.0, 0.0, Phase.HOLD)
    assert loop.margin > margin


def test_no_edge_known_no_pause_explains_a_refusal() -> None:
    assert not own_pause(RateLoop(Adaptive()), (0.5, 0.045))


def test_a_refusal_after_a_pause_is_not_counted_from_the_cut_through_the_pause() -> None:
    # Three processes sharing a scope against Flask-Limiter's moving window
    # of 10/s: the cut's echoes, refused with nothing through since, paused
    # sending for a horizon; a refusal 1.9 s after the cut then counted its
    # edge from the cut, pause included (5.2/s), and the scope held half the
    # rate for 20 s, one run in three.
    parts = Parts(Adaptive(), POLICY)
    log, loop = parts.log, parts.rate_loop

    def answered(start: float, count: int) -> None:
        for i in range(count):
            log.count(start + i / 10, accepted=True, horizon=1.0, latency=0.001)
            parts.closures.accepted(start + i / 10, loop.cut_at)

    parts.closures.begin(0.0)
    answered(0.0, 20)
    log.count(2.0, accepted=False, horizon=1.0, latency=0.001)
    on_throttle(parts, _view(), 2.0, 2.001, 0.0)
    assert loop.edge == pytest.approx(10.0, abs=1.0)
    loop.block(loop.cut_at + 1.0)  # (as an echo of the cut does, the server closed)
    answered(3.01, 9)
    log.count(3.9, accepted=False, horizon=1.0, latency=0.001)
    on_throttle(parts, _view(), 3.9, 3.901, 0.0)
    assert loop.edge is not None
    assert loop.edge >= 8.0


@pytest.mark.parametrize("passed", [False, True])
def test_a_probe_refused_below_the_edge_goes_back_to_the_margin_that_held(passed: bool) -> None:
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 11.0, 14.0, 1.0, 5.0, 0.0, Phase.START)
    for now in (8.0, 11.0):
        set_edge(loop, _view(), 11.0, 11.0, 1.0, now, 0.0, Phase.HOLD)
    held = loop.margin
    # The hold passed unrefused: the probe begins at half the margin.
    loop.held_margin, loop.margin = held, held / 2
    loop.rate = 11.5 if passed else 11.0 * (1 - held / 2)
    set_edge(loop, _view(), 11.0, 11.0, 1.0, 80.0, 0.0, Phase.PROBE)
    # Refused past the edge, the probe says nothing of the margin below it.
    assert loop.margin == (held / 2 if passed else held)


def test_an_overload_cut_goes_below_what_got_through_when_most_sends_were_refused() -> None:
    loop = RateLoop(Adaptive())
    loop.rate = 16.0
    loop.overload(8.0, 1.0, 2.0)  # one in eight got through: a limit near 1/s
    assert loop.rate == pytest.approx(1.0 * (1 - TUNING.error_margin))
    loop.rate = 16.0
    loop.overload(8.0, 6.0, 2.0)  # random errors: the share cut, from the rate sent
    assert loop.rate == pytest.approx(8.0 * Adaptive().overload_cut)


def test_a_slow_edges_hold_grows_past_the_longest_to_as_many_sends() -> None:
    loop, at = RateLoop(Adaptive()), 5.0
    set_edge(loop, _view(), 0.5, 1.0, 0.0, at, 0.0, Phase.START)
    holds = []
    for _ in range(6):
        at += 200.0
        set_edge(loop, _view(), 0.5, 1.0, 0.0, at, 0.0, Phase.PROBE)
        holds.append(loop.hold_for)
    assert holds == [20.0, 40.0, 80.0, 120.0, 120.0, 120.0]  # 60 sends at 0.5/s
    set_edge(loop, _view(), 2.0, 4.0, 0.0, at + 200.0, 0.0, Phase.START)
    for _ in range(4):
        at += 200.0
        set_edge(loop, _view(), 2.0, 4.0, 0.0, at + 200.0, 0.0, Phase.PROBE)
    assert loop.hold_for == Adaptive().max_hold  # faster than one per second: max_hold


def test_a_told_wait_makes_the_hold_long_enough_that_a_probe_costs_little() -> None:
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 10.0, 14.0, 0.5, 5.0, 0.0, Phase.START)
    assert loop.hold_for == pytest.approx(0.5 / TUNING.probe_cost)


def test_echoes_of_a_cut_are_its_own_until_a_search_up_begins() -> None:
    loop = RateLoop(Adaptive())
    loop.cut_at = 10.0
    loop.enter(Event.EDGE, 10.0)
    assert loop.echo(10.5)
    assert not loop.echo(11.0)
    loop.enter(Event.REOPENED, 10.2)
    assert not loop.echo(10.5)


def test_a_probes_refusals_are_its_own_even_inside_a_long_horizon() -> None:
    # A horizon read too long (189 s for a fixed 10 per 10 s) once took a
    # probe's every refusal for an echo of the cut before it: the probe rose
    # from 1/s to 6/s, refused 60 times in 25 s.
    loop = RateLoop(Adaptive())
    loop.horizon, loop.cut_at = 189.0, 194.0
    loop.enter(Event.EDGE, 194.0)
    assert loop.echo(273.0)  # holding: the window may still hold the cut's sends
    loop.enter(Event.RECOVERED, 200.0)
    loop.enter(Event.HELD, 270.0)
    assert not loop.echo(273.0)


def test_refusals_below_a_new_edge_slow_the_rate_a_few_steps_until_it_is_counted_again() -> None:
    # Edge 28/s counted with a stored burst; the bucket refills at 20/s.
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 28.0, 29.0, 0.0, 5.0, 0.0, Phase.START)
    loop.cut_at = 5.0
    assert loop.rate == pytest.approx(25.2)
    assert not loop.overcounted(5.01, 5.02)  # sent before the pause for the excess ended
    rates = []
    for sent_at in (5.2, 5.4, 5.6, 5.8):
        assert loop.overcounted(sent_at, sent_at)
        rates.append(loop.rate)
    assert rates == pytest.approx([22.68, 20.412, 20.412, 20.412])  # at most two steps
    assert loop.edge == 28.0  # the next refusal counts it
    assert not loop.edge_held
    assert loop.phase_at == pytest.approx(6.0)  # no climb back before the horizon ends
    set_edge(loop, _view(), 28.0, 29.0, 0.0, 7.0, 0.0, Phase.HOLD)
    assert not loop.overcounted(7.5, 7.5)  # a confirmed edge: not over-counted


def test_a_refusal_below_the_edge_a_rise_counted_was_a_stored_burst() -> None:
    loop = RateLoop(Adaptive())
    set_edge(loop, _view(), 20.0, 21.0, 0.0, 5.0, 0.0, Phase.START)
    loop.risen_from, loop.risen_hold, loop.risen_to = 20.0, 20.0, 24.0
    loop.risen_firm = True  # counted over a second
    set_edge(loop, _view(), 27.0, 28.0, 0.0, 30.0, 0.0, Phase.START)
    loop.cut_at = 30.0
    assert loop.overcounted(30.3, 30.3)
    assert (loop.edge, loop.edge_held, loop.hold_for) == (20.0, True, 20.0)
    assert loop.risen_from is None
    assert loop.rate == pytest.approx(loop.target) == pytest.approx(19.6)


def test_a_refusal_below_the_edge_a_rise_from_a_long_windows_floor_counted_slows_down() -> None:
    # HAProxy's 20 per 10 s, read as 20 per 15.3 s off the opening's closure
    # (its knocks count): the rise from there was the real limit, and going
    # back to the floor held it at 65 % for a minute after every probe.
    loop = RateLoop(Adaptive())
    long_window(loop, _view(), 15.3, 20, 15.3)
    loop.risen_from, loop.risen_hold, loop.risen_to = loop.edge, 61.2, 1.5
    loop.risen_firm = False
    set_edge(loop, _view(), 1.83, 1.9, 0.0, 91.7, 0.0, Phase.START)
    loop.cut_at = 91.7
    assert loop.overcounted(95.9, 95.9)
    assert loop.edge == pytest.approx(1.83)  # kept: slower until it is counted again
    assert loop.rate < loop.target


def test_the_tuning_is_what_the_parts_use() -> None:
    loop = RateLoop(Adaptive(tuning=AdaptiveTuning(new_edge_restart=0.5)))
    set_edge(loop, _view(), 10.0, 14.0, 0.0, 5.0, 0.0, Phase.START)
    assert loop.rate == pytest.approx(5.0)
    with pytest.raises(TypeError, match="tuning"):
        Adaptive(tuning={"new_edge_restart": 0.5})  # type: ignore[arg-type]


def test_the_state_is_one_plain_dict_per_part() -> None:
    state = POLICY.adaptive.controller(POLICY)  # type: ignore[union-attr]
    view = _view(in_flight=1)
    for i in range(50):
        status = 429 if i == 40 else 200
        state.on_feedback(view, Feedback(status=status, latency=0.05, sent_at=i / 10), i / 10)
    plain = json.loads(json.dumps(state.get_state()))
    assert set(plain) == {
        "closures",
        "concurrency_loop",
        "errors",
        "inflight",
        "log",
        "rate_loop",
        "spacing",
    }
    assert plain["rate_loop"]["phase"] == "recover"
    copy = POLICY.adaptive.controller(POLICY)  # type: ignore[union-attr]
    copy.set_state(plain)
    assert copy.rate_loop.phase is Phase.RECOVER
    assert copy.get_state() == state.get_state()


def test_a_search_refused_at_once_marks_a_leaky_bucket_and_later_searches_rise_gently() -> None:
    loop = RateLoop(Adaptive())
    loop.risen_from, loop.risen_to = 7.0, 7.7
    set_edge(loop, _view(), 7.5, 9.0, 0.0, 20.0, 0.0, Phase.START)  # refused at once
    assert loop.phase is Phase.CLIMB
    assert loop.leaky
    assert "a leaky bucket" in loop.reason
    state = POLICY.adaptive.controller(POLICY)  # type: ignore[union-attr]
    state.rate_loop.leaky = True
    rate = state.rate_loop.rate
    for i in range(8):  # sent at its rate for 1.75 s: three steps of a search up
        state.on_feedback(_view(), Feedback(status=200, sent_at=i / rate), i / rate)
    assert state.rate_loop.rate == pytest.approx(rate * TUNING.leaky_search**3)  # not 8 x
