"""Knocks before a late reset: how early a de-facto stated reset really frees the quota.

Web frameworks' limiters state ``X-RateLimit-Reset`` after the window
really frees up (Flask-Limiter and slowapi add a second), so a client that
waits for it on a one-second window loses half of each window. The draft
RateLimit fields' reset is the server's word and is obeyed; a de-facto
reset close at hand is tested instead: the scope sends one request (a knock)
that much before it, and learns from the answer how far ahead of the stated
reset the quota comes back.

The lead is searched upward from the largest lead a knock proved
(``good``, accepted) in steps that double while knocks are accepted; once
one is refused (``bad``; its ``Retry-After`` is then honoured in full), by
halving the leads still unknown. No lead at or above a refused one is tried
again, so a server that states its resets honestly costs a few refusals
once, and the knock then stays at a lead every answer allowed. That lead
lies within the search's resolution of one refused, so the network's
jitter refuses it now and then: the first such refusal backs it off by
:data:`KNOCK_DRIFT`, and only a second before a knock at the lead kept is
accepted again (the server now states its resets less late) halves it.

A reset stated as an integer epoch (Flask-Limiter's) is up to a second
later than the real one, by a share that changes with the moment it was
stated: no lead fits it. Where every reset a scope has seen is a few such
steps away (a window of a second or two), it is too coarse to pace by, and
the headers' quota is set aside (:func:`coarse`): the answers' refusals then
teach Adaptive's rate loop, as if the server sent no quota at all. Before a
longer window it is knocked on within that second (:func:`rounded_up`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .headers import RateLimitInfo

__all__ = [
    "COARSE_STEPS",
    "DE_FACTO_SOURCES",
    "KNOCK_FIRST",
    "KNOCK_FREE_REFUSALS",
    "KNOCK_REFUSALS",
    "KNOCK_RESOLUTION",
    "KNOCK_WITHIN",
    "Knock",
    "coarse",
    "longest_reset",
    "paced_by",
]

INF = math.inf

#: Header families whose reset is a convention of the frameworks, not the
#: RateLimit draft's ``t`` (which a client obeys as the server's word).
DE_FACTO_SOURCES = frozenset({"x-ratelimit"})
#: A de-facto reset stated in steps (whole seconds) is too coarse to pace by
#: while the longest reset the scope has seen is under this many steps: its
#: rounding then costs a third or more of each window (a one-second window
#: stated in whole seconds: waits of one to two seconds), where the rate loop
#: paces within a few percent of the limit. Longer windows are paced by their
#: resets (a fixed window is best spent at its start, then waited out); at 4
#: steps a 3 s window's longest reset fell on either side of it, and the
#: scope switched between the two readings (18 % of the oracle).
COARSE_STEPS = 3.0
#: Knock only before resets at most this many seconds away. Below it a reset
#: (often whole seconds, rounded up, or a second late) is too coarse to pace
#: by; above it a scope is paced over the window (``MIN_PACE_RESET``, the same
#: line), where a second late costs little of it.
KNOCK_WITHIN = 5.0
#: The resolution of a reset stated in whole epoch seconds (:func:`rounded_up`).
WHOLE_SECOND = 1.0
#: How much shorter the lead kept before a rounded reset gets per window spent,
#: and how far a lead accepted before backs off when the network's jitter
#: refuses it (seconds): more than the network's jitter on one host, and a
#: small share of any window a knock applies to.
KNOCK_DRIFT = 0.05
#: The first knock's lead, as a share of the stated wait: it wins a quarter
#: and risks one refusal; each accepted knock doubles the step.
KNOCK_FIRST = 1.0 / 4.0
#: The search for the lead ends when the leads still unknown span less than
#: this share of the stated wait (six halvings: under 2 % of a one-second window).
KNOCK_RESOLUTION = 1.0 / 64.0
#: Knocks that may be refused (above every lead accepted) are tried while the
#: refused ones stay under KNOCK_FREE_REFUSALS plus this share of the answers:
#: half of the 2 % of refusals a scope may cost.
KNOCK_REFUSALS = 0.01
#: The refused knocks a search may cost before it is held to that share: a
#: lead is found in a few knocks, and a second refusal halves what is unknown.
KNOCK_FREE_REFUSALS = 2.0


def longest_reset(info: RateLimitInfo, longest: float) -> float:
    """The longest de-facto reset seen, ``longest`` until now, with ``info``'s."""
    if info.reset is None or info.source not in DE_FACTO_SOURCES:
        return longest
    return max(longest, info.reset)


def rounded_up(info: RateLimitInfo) -> float:
    """The step of a de-facto reset stated in whole epoch seconds; 0.0 for any other.

    Rounded up to the next whole second (express-rate-limit's ``Math.ceil``
    of its window's end), it is later than the real one by less than that
    step, at whatever pace the scope spent the quota: before a window that
    comes back whole (not a moving window, which lets go of one request at
    a time, each late by another share), a knock within the step wins that
    share of each window, and no lead beyond it can. A fixed window that
    opens at its first request opens at the knock, so its next reset is
    late by about the lead that knock had: the same lead again
    lands on the real reset give or take the network's jitter (refused one
    time in two), so an accepted lead is kept, a little shorter each window
    spent (:data:`KNOCK_DRIFT`), and searched again once worn to nothing.
    """
    step = info.reset_step
    return step if step is not None and step >= WHOLE_SECOND else 0.0


def _whole(info: RateLimitInfo) -> bool:
    """Whether at least half of ``info``'s quota remains (a window that came back whole)."""
    remaining, limit = info.remaining, info.limit
    return remaining is not None and limit is not None and 2 * remaining >= limit


def coarse(info: RateLimitInfo, longest: float) -> bool:
    """Whether ``info``'s quota is too coarse to pace by (see :data:`COARSE_STEPS`).

    ``longest`` is the longest de-facto reset the scope has seen, ``info``'s
    included (:func:`longest_reset`).
    """
    step = info.reset_step
    return step is not None and info.source in DE_FACTO_SOURCES and longest < COARSE_STEPS * step


def paced_by(info: RateLimitInfo, longest: float) -> RateLimitInfo:
    """What of ``info`` paces the scope: all of it, or only its ``Retry-After`` when coarse."""
    if not coarse(info, longest):
        return info
    return type(info)(retry_after=info.retry_after)


class Knock:
    """What the knocks before one scope's late resets have shown (plain data).

    ``good`` is the largest lead accepted, ``bad`` the smallest refused,
    ``step`` how far above ``good`` the next knock goes (0: not begun),
    ``lead`` the lead of the knock under way, sent at or after ``at``;
    ``answers`` counts the scope's answers, ``refused`` its refused knocks;
    ``opened`` is when the quota was last seen back after it was spent
    (``spent`` 1 since it was spent, 0 once back), ``whole`` 1 when at
    least half of it came back then (a window that resets whole, not one
    that lets go of a request at a time); ``longest`` is the longest
    de-facto reset seen (:func:`longest_reset`); ``backed`` is 1 once a
    refusal backed ``good`` off, until a knock at it is accepted again.
    """

    #: The fields in the order of the plain state, and their values before any answer.
    FIELDS = (
        "good",
        "bad",
        "step",
        "lead",
        "at",
        "answers",
        "refused",
        "opened",
        "spent",
        "longest",
        "whole",
        "backed",
    )
    FRESH = (0.0, INF, 0.0, 0.0, INF, 0.0, 0.0, INF, 1.0, 0.0, 0.0, 0.0)  # opened: not seen yet

    __slots__ = FIELDS
    good: float
    bad: float
    step: float
    lead: float
    at: float
    answers: float
    refused: float
    opened: float
    spent: float
    longest: float
    whole: float
    backed: float

    def __init__(self, state: list[float] | None = None) -> None:
        # (A state written by an older version, shared through Redis, lacks
        # the fields added since: they start fresh.)
        values = [*(state or ()), *self.FRESH[len(state or ()) :]]
        for name, value in zip(self.FIELDS, values, strict=True):
            setattr(self, name, value)

    def state(self) -> list[float]:
        """The knock's state as plain data (a scope's state shares through Redis)."""
        return [getattr(self, name) for name in self.FIELDS]

    def wait(self, info: RateLimitInfo, now: float) -> float | None:
        """The wait the answer asks for: its :meth:`~RateLimitInfo.wait`, less a lead learned.

        Only a spent quota whose de-facto reset is at most
        :data:`KNOCK_WITHIN` seconds away is knocked on early; a refusal's
        own ``Retry-After`` is always waited in full, and after a refusal
        the knock keeps to a lead already accepted. A lead not yet accepted
        is tried only where the wait is longer than the quota took to spend
        since it was last back: there the reset, not the sending, sets the
        pace, and a late one costs much of it (a scope paced over its window
        meets a spent quota just before its reset, and would win little).
        A reset rounded up to whole epoch seconds (:func:`rounded_up`) is
        late whatever the pace: it is knocked on within its step, and a lead
        accepted there is kept rather than searched past.
        """
        reset = info.reset
        if info.remaining is not None and info.remaining > 0 and self.spent:
            self.opened, self.spent, self.whole = now, 0.0, float(_whole(info))
        if not self.applies(info):
            return info.wait()
        assert reset is not None
        step = rounded_up(info) if self.whole else 0.0
        if step and not self.spent:
            self.good = max(0.0, self.good - KNOCK_DRIFT)  # (once per window spent)
        self.spent = 1.0
        top = min(self.bad, reset, step or INF)
        if (
            info.retry_after is not None
            or (step and self.good)
            or (reset <= now - self.opened and not step)
            or top - self.good <= reset * KNOCK_RESOLUTION
            or self.refused + 1.0 > KNOCK_FREE_REFUSALS + self.answers * KNOCK_REFUSALS
        ):
            self.lead = min(self.good, top)
        else:
            self.step = self.step or reset * KNOCK_FIRST
            self.lead = min(self.good + self.step, (self.good + top) / 2.0)
        wait = max(info.retry_after or 0.0, reset - self.lead)
        self.at = now + wait
        return wait

    @staticmethod
    def applies(info: RateLimitInfo) -> bool:
        """Whether ``info`` is a spent quota with a de-facto reset close enough to knock before."""
        return info.remaining == 0 and Knock.near(info)

    @staticmethod
    def near(info: RateLimitInfo) -> bool:
        """Whether ``info``'s reset is a de-facto one at most :data:`KNOCK_WITHIN` seconds away.

        Whether all of the quota comes back then is not known (a moving window
        lets go of one request at a time): one request after it tells.
        """
        reset = info.reset
        return reset is not None and reset <= KNOCK_WITHIN and info.source in DE_FACTO_SOURCES

    def answered(
        self, sent_at: float | None, now: float, *, accepted: bool, info: RateLimitInfo | None
    ) -> bool:
        """Learn from an answer (``info``: its quota); whether it was a knock's, accepted.

        The first answer to a request sent at or after the knock's instant is
        the knock's; it counts with the lead it was sent with (a knock held
        back by the scope's other limits was sent with less). After a refused
        knock, the first request sent once its wait is over knocks again,
        without a lead: how much of the window is back is not known until it
        answers. An accepted knock says whether the window came back whole.
        """
        self.answers += 1.0
        if sent_at is None or sent_at < self.at:
            return False
        lead = max(0.0, self.lead - (sent_at - self.at))  # the lead it was sent with
        self.at = INF
        if accepted:
            self.whole = float(info is not None and _whole(info))
            if lead and lead >= self.good:
                self.backed = 0.0
            if lead > self.good and (self.whole or info is None or not rounded_up(info)):
                # (Before a rounded reset, only a window that came back whole
                # keeps the lead: a moving window's next reset is late by another share.)
                self.good, self.step = lead, 2.0 * self.step
            return True
        if lead > 0.0:
            self.bad, self.refused = lead, self.refused + 1.0
            if self.good >= lead:
                # A lead that was accepted is not now: the network's jitter
                # at a lead found that close to a refused one (back off a
                # little), or, refused again, resets stated less late now
                # (search below it). Halved at once, a slowapi window of
                # 10/s was waited out for 1.5 s of each second's quota until
                # the refusals allowed a search again: 10 s at two thirds.
                self.good = lead / 2.0 if self.backed else max(0.0, lead - KNOCK_DRIFT)
                self.backed = 1.0
            self.step = (self.bad - self.good) / 2.0
        self.lead, self.at = 0.0, now
        return False
