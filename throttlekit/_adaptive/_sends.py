"""The log of answered sends, and the rates measured from it."""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

from .._controller import SlotState
from ._tuning import AdaptiveTuning

if TYPE_CHECKING:
    from .._controller import ScopeView

__all__ = ["SendLog", "at_most", "others_in_flight", "whole"]

INF = math.inf

#: Spans taken back from an instant (``end - (end - horizon)``) are a hair
#: off the horizon in floating point, so a count over one can read a hair
#: short of the whole requests it holds (2 over 1.0000000000000018 s).
_HAIR = 1e-9


def whole(count: float) -> int:
    """The whole requests in ``count``, one a hair short included."""
    return math.floor(count + _HAIR)


def at_most(value: float, bound: float) -> bool:
    """``value <= bound``, a hair over included (rates read from counts over a horizon)."""
    return value <= bound * (1.0 + _HAIR)


def others_in_flight(scope: ScopeView) -> int:
    """The scope's requests in flight besides the one whose answer is being judged.

    That answer is counted in flight until it has been judged.
    """
    return max(0, scope.in_flight - 1)


class SendLog(SlotState):
    """The answered sends of the last few horizons, ``[sent_at, 1 if accepted else 0]``, in order.

    Every rate the rate loop reasons with is counted here, exactly: a
    refusal on a sliding one-second window then reads as the server's limit.
    """

    __slots__ = ("horizons", "kept", "sends")
    STATE = ("sends",)

    def __init__(self, tuning: AdaptiveTuning) -> None:
        self.kept = tuning.sends_kept
        self.horizons = tuning.sends_horizons
        self.sends: list[list[float]] = []

    def __repr__(self) -> str:
        return f"<SendLog {len(self.sends)} sends>"

    def count(self, sent_at: float, *, accepted: bool, horizon: float, latency: float) -> None:
        """Log an answered send; forget those older than ``sends_horizons`` and two latencies."""
        sends = self.sends
        entry = [sent_at, 1 if accepted else 0]
        if not sends or sent_at >= sends[-1][0]:
            sends.append(entry)
        else:  # answers arrive out of send order
            bisect.insort(sends, entry)
        last = self._accepted_up_to(len(sends))
        # Back from the last acceptance: a refusal a gap later must not take
        # away what the two horizons up to it hold (see :meth:`paced`), nor
        # the acceptance before it (see :meth:`last_gap`).
        newest = sends[last - 1][0] if last else sends[-1][0]
        oldest = newest - self.horizons * horizon - 2 * latency
        before = self._accepted_up_to(last - 1) if last else 0
        if before:
            oldest = min(oldest, sends[before - 1][0])
        drop = max(bisect.bisect_left(sends, [oldest]), len(sends) - self.kept)
        if drop:
            del sends[:drop]

    def _accepted_up_to(self, end: int) -> int:
        """One past the index of the last acceptance before index ``end`` (0: none)."""
        sends = self.sends
        while end and not sends[end - 1][1]:
            end -= 1
        return end

    def full(self) -> bool:
        """Whether the log is cut short by its size (not by age)."""
        return len(self.sends) == self.kept

    def measured(self, start: float, end: float, *, accepted: bool, extra: int = 0) -> float:
        """Sends (or acceptances) per second, sent after ``start`` up to ``end``.

        ``extra`` adds requests not answered yet (in flight). If the log was
        cut short by its size, the rate is taken over the span it covers.
        """
        sends = self.sends
        first = bisect.bisect_right(sends, [start, INF])
        last = bisect.bisect_right(sends, [end, INF])
        if first == 0 and self.full() and sends[0][0] > start:
            start = sends[0][0]
        span = end - start
        if span <= 0:
            return 0.0
        total = sum(entry[1] for entry in sends[first:last]) if accepted else last - first
        return (total + extra) / span

    def accepted_between(self, start: float, end: float) -> list[float]:
        """The send instants of the acceptances sent after ``start`` up to ``end``."""
        return [entry[0] for entry in self.between(start, end) if entry[1]]

    def paced(self, sent_at: float, horizon: float, since: float) -> float:
        """Acceptances per second in the horizon up to the last accepted send before ``sent_at``.

        A probe climbs slowly, so the server refuses it just past its limit.
        A window then holds the limit's count in the horizon before the
        refused send; a leaky bucket (nginx's ``limit_req`` without burst)
        refuses as soon as two sends come closer than its interval, when
        that horizon holds a request less, but the one ending at the last
        accepted send holds them all. Counted in whole requests over one
        horizon and over two (a fixed window's turn can fall inside either);
        0 when the log does not reach back two horizons after ``since``.
        """
        sends = self.sends
        last = self._accepted_up_to(bisect.bisect_left(sends, [sent_at]))
        if not last:
            return 0.0
        end = sends[last - 1][0]
        if end - 2 * horizon < since:
            return 0.0
        one = self.measured(end - horizon, end, accepted=True)
        two = self.measured(end - 2 * horizon, end, accepted=True)
        return whole(min(one, two) * horizon) / horizon

    def pace(self, start: float, end: float, fewest: int) -> float:
        """The pace of the acceptances sent after ``start`` up to ``end`` (0: under ``fewest``).

        ``n`` evenly spaced acceptances span ``n - 1`` intervals, so their
        count over a span reads up to one more than their pace, and up to
        one less when the span ends just before the next: at a few per
        second, a tenth either way.
        """
        accepted = self.accepted_between(start, end)
        if len(accepted) < fewest:
            return 0.0
        return (len(accepted) - 1) / (accepted[-1] - accepted[0])

    def last_gap(self, before: float, least: float) -> float:
        """Per second, the gap between the last two acceptances sent before ``before``.

        0 when there are not two, or when a gap shorter than ``least`` was
        ever accepted (a bucket's stored burst lets a probe's gaps through
        well below its interval). A probe climbs, so its last gap accepted
        is its shortest: at a few requests per horizon, where a count over
        it cannot tell 0.42/s from nginx's 0.5 r/s (held there at every
        probe: 80 %), the finest bound on the limit the probe then passed.
        """
        sends = self.sends
        end = self._accepted_up_to(bisect.bisect_left(sends, [before]))
        start = self._accepted_up_to(end - 1) if end else 0
        if not start:
            return 0.0
        gap = sends[end - 1][0] - sends[start - 1][0]
        return 1.0 / gap if at_most(gap, least) else 0.0

    def oldest(self) -> float:
        """The send instant of the oldest send the log holds (``inf``: none).

        No count of the log reaches back further.
        """
        return self.sends[0][0] if self.sends else INF

    def first_refused(self) -> float | None:
        """The send instant of the oldest refusal the log holds (``None``: none)."""
        return next((entry[0] for entry in self.sends if not entry[1]), None)

    def between(self, start: float, end: float) -> list[list[float]]:
        """The sends after ``start`` up to ``end`` (``[sent_at, 1 if accepted else 0]``)."""
        sends = self.sends
        first = bisect.bisect_right(sends, [start, INF])
        return sends[first : bisect.bisect_right(sends, [end, INF])]

    def window_frees(self, in_flight: int, allowed: int, window: float) -> float | None:
        """When a window of ``window`` seconds that lets ``allowed`` through has room for one more.

        Counted from the acceptances of the last window and ``in_flight``;
        ``None`` when it has room now or the log does not reach back a window.
        """
        sends = self.sends
        if not sends:
            return None
        start = sends[-1][0] - window
        if self.full() and sends[0][0] > start:
            return None  # the log does not reach back a whole window: no count
        accepted = self.accepted_between(start, INF)
        over = len(accepted) + in_flight - allowed + 1
        if over > 0 and accepted:
            return accepted[min(over, len(accepted)) - 1] + window
        return None
