"""The detector of closed servers and long windows: runs, knocks, and waits a server told."""

from __future__ import annotations

import math

from .._controller import SlotState
from ._tuning import AdaptiveTuning

__all__ = ["Closures"]

INF = math.inf


class Closures(SlotState):
    """What got through since sending began, since the last cut, and through the pauses since.

    A server that accepts nothing between two cuts is closed for now (a
    long window's limit spent, or a server down): the scope waits, longer
    each time, and knocks once after each wait. When it opens again, how
    long it stayed closed against how long it had been open tells a long
    window from a limit that moved.
    """

    __slots__ = (
        "closed_at",
        "cut_first",
        "echoes",
        "empty",
        "fixed",
        "max_wait",
        "ok_since_cut",
        "refused_run",
        "run_at",
        "run_ok",
        "told_wait",
        "tuning",
        "window_took",
    )
    STATE = tuple(name for name in __slots__ if name not in ("tuning", "max_wait"))

    def __init__(self, tuning: AdaptiveTuning, max_wait: float) -> None:
        self.tuning = tuning
        self.max_wait = max_wait
        self.empty = 0  # throttles in a row with nothing accepted in between
        self.run_at: float | None = None  # when sending last began or reopened after a closure
        self.run_ok = 0  # requests sent since then and accepted
        self.closed_at = -INF  # when the server last closed (refusing through pauses)
        self.echoes = False  # whether that closure's refusals were all echoes of its cut
        # Whether the server's window let go of a probe's sends only at its
        # end (a fixed window): counts over the horizon may hold two windows.
        self.fixed = False
        self.window_took = 0  # what the last long window read accepted
        self.ok_since_cut = 0  # accepted since the last cut
        self.refused_run = 0  # refused in a row since the last of them
        self.cut_first = False  # whether the last cut was the first limit a search up met
        # After a refusal that told to wait longer than the run had been open
        # (or the opening's, told a horizon or longer): [when the run began,
        # what it got accepted, when the wait ended, what it got accepted in
        # the horizon before the refusal].
        self.told_wait: list[float] | None = None

    def __repr__(self) -> str:
        return f"<Closures empty={self.empty} run_ok={self.run_ok}>"

    def begin(self, sent_at: float) -> None:
        """The first answer: the run began when its request was sent."""
        if self.run_at is None:
            self.run_at = sent_at

    def accepted(self, sent_at: float, cut_at: float) -> bool:
        """An accepted answer; returns whether it reopens a server closed through a pause.

        One knock refused is enough: a window longer than the horizon still
        held the run's sends when the pause ended (HAProxy's 6 per 2 s,
        refused a second after the opening's cut and accepted a second
        later, had been held for a minute at 0.63/s, the rate the refused
        knock left).
        """
        assert self.run_at is not None
        if sent_at >= self.run_at:
            self.run_ok += 1
        if sent_at > cut_at:
            self.ok_since_cut += 1
            self.refused_run = 0
            return self.empty > 0
        return False

    def closed_since(self, cut_at: float) -> bool:
        """Whether nothing was accepted since the cut at ``cut_at`` (the server may be closed)."""
        return cut_at > -INF and self.ok_since_cut == 0

    def cut(self) -> None:
        """A cut: count what gets through from now."""
        self.ok_since_cut = self.refused_run = 0

    def refused(self, runs: int) -> bool:
        """A refusal; whether it ends a run of ``runs`` since sends got through after the cut.

        Such a run is no echo of a long window's cut: the window had room
        after it and filled again, so the rate is above its limit (HAProxy,
        which counts refusals too, refused 2.03/s for 12 s as echoes of a cut
        at 2.0/s). Within a second of a cut, a run is what the sends in
        flight look like (three processes at nginx's burst: 2.5 % refused,
        1.1 % without the rule there): the caller asks on a long window only.
        """
        self.refused_run += 1
        return self.ok_since_cut > 0 and self.refused_run >= runs

    def restart(self) -> None:
        """A told wait proved a long window: count from a cut now, the server open."""
        self.ok_since_cut = self.empty = 0

    def close(self, cut_at: float, now: float, *, echo: bool = False) -> float:
        """Nothing accepted since the cut at ``cut_at``: how long to wait before knocking.

        ``echo``: the refusal was an echo of that cut (sent while the
        server's window still held the sends from before it).

        The wait doubles per knock; it moves to just after a round window
        since the run began (:attr:`~throttlekit.AdaptiveTuning.round_windows`),
        where most windows free up, when one is no later than
        ``round_stretch`` times it.
        """
        tuning = self.tuning
        if not self.empty:
            self.closed_at, self.echoes = cut_at, True
        self.echoes = self.echoes and echo
        self.empty += 1
        doubled = min(self.max_wait, tuning.closed_wait * 2.0**self.empty)
        if self.run_at is None:
            return doubled
        for window in tuning.round_windows:
            wait = self.run_at + window * (1.0 + tuning.round_margin) - now
            if wait >= tuning.closed_wait:
                return wait if wait <= tuning.round_stretch * doubled else doubled
        return doubled

    def open(self, *, first: bool = False) -> None:
        """The cut came with acceptances since the last: the server is open."""
        self.empty, self.cut_first = 0, first

    def long_window(self, sent_at: float) -> tuple[float, int] | None:
        """The server accepts again after a closure: its window and what one allowed, if long.

        If it closed at the first limit a search up met, or stayed closed
        longer than it had been open, its window is longer than the horizon:
        what it accepted from the start of the run (not counting this
        acceptance, which opens the next window) is what one window allows.
        ``None`` when it closed on a limit it had held, for less time (a
        limit that moved, or a server that was down). Either way a new run
        begins: a window read later is not counted from before this closure.
        """
        run_at, run_ok = self.run_at, self.run_ok
        assert run_at is not None
        self.empty = 0
        self.run_at, self.run_ok = sent_at, 1
        if not self.cut_first and sent_at - self.closed_at < self.closed_at - run_at:
            return None
        self.window_took = max(run_ok - 1, 1)
        return sent_at - run_at, self.window_took

    def within(self, window: float, sent_at: float) -> bool:
        """Whether an acceptance sent at ``sent_at`` ends a closure shorter than ``window``."""
        return sent_at - self.closed_at <= window

    def fixed_window(self, took: int) -> bool:
        """Whether a window that let go at the end of a closure took what the long one read did.

        Then it is a fixed window (it let go of them all at its end), and it
        is so from now (:attr:`fixed`). A window counted over another length
        (HAProxy's period counter, read from knocks it counted too) takes
        another count.
        """
        self.fixed = self.fixed or abs(took - self.window_took) <= max(
            1.0, self.tuning.fixed_share * self.window_took
        )
        return self.fixed

    def still_closed(self, in_flight: int) -> None:
        """A refusal: with nothing accepted since a told wait, the run goes on from before it.

        The wait did not end the server's window (an echo's refusal included).
        """
        told = self.told_wait
        if told is not None and not self.run_ok + in_flight:
            self.run_at, self.run_ok = told[0], int(told[1])
            self.told_wait = None

    def told(self, wait_end: float, in_flight: int, recent: int) -> None:
        """The server told a wait that may end within its window: remember the run.

        ``recent``: what it got accepted in the horizon before the refusal.
        """
        assert self.run_at is not None
        self.told_wait = [self.run_at, self.run_ok + in_flight, wait_end, recent + in_flight]
        self.run_at, self.run_ok = wait_end, 0
