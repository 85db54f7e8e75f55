"""Feedback from responses and the protocol of per-scope controllers."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from ._policy import ScopePolicy
    from .headers import RateLimitInfo

__all__ = [
    "BaseController",
    "Controller",
    "Feedback",
    "ScopeSnapshot",
    "ScopeView",
    "held_decisions",
    "tell_decisions",
]

#: Outcomes remembered for the built-in controllers' error shares (Adaptive's
#: overload share, Backoff's ``error_share``).
OUTCOMES = 40


#: The loggers the built-in controllers tell their decisions on.
DECISION_LOGGERS = (
    "throttlekit.adaptive",
    "throttlekit.autothrottle",
    "throttlekit.backoff",
    "throttlekit.rampup",
)

_held: ContextVar[list[logging.LogRecord] | None] = ContextVar(
    "throttlekit_held_decisions", default=None
)


class _Hold(logging.Filter):
    """Keeps a decision's record back while :func:`held_decisions` holds them."""

    def filter(self, record: logging.LogRecord) -> bool:
        held = _held.get()
        if held is None:
            return True
        held.append(record)
        return False


_HOLD = _Hold()
for _name in DECISION_LOGGERS:
    logging.getLogger(_name).addFilter(_HOLD)


@contextmanager
def held_decisions() -> Iterator[list[logging.LogRecord]]:
    """Within, the controllers' log records are kept in the list given, not emitted.

    A shared backend runs the controllers on the state a grant brought, and
    again on a newer one if another process wrote it meanwhile: only the run
    whose write stands decided anything (:func:`tell_decisions`), and two
    runs told ("edge 20/s", then "edge 21/s") read as two decisions.
    """
    records: list[logging.LogRecord] = []
    token = _held.set(records)
    try:
        yield records
    finally:
        _held.reset(token)


def tell_decisions(records: Sequence[logging.LogRecord]) -> None:
    """Emit the records :func:`held_decisions` kept, on their own loggers."""
    for record in records:
        logging.getLogger(record.name).handle(record)


def remember_outcome(outcomes: list[int], outcome: int) -> None:
    """Append ``outcome`` (1 = an error, 0 = not), keeping the last :data:`OUTCOMES`."""
    outcomes.append(outcome)
    if len(outcomes) > OUTCOMES:
        del outcomes[0]


@attrs.frozen(kw_only=True)
class Feedback:
    """What one response (or failure) told us about a scope.

    Built by :meth:`Permit.record`; controllers read it.

    :param status: the HTTP status code, or ``None`` when no response arrived.
    :param headers: the response headers as the client gave them (any mapping).
    :param exception: the exception that ended the request, if any.
    :param latency: seconds from send to response headers.
    :param size: response body size in bytes, when known.
    :param rate_limit: the parsed rate-limit headers (:func:`throttlekit.headers.parse`).
    :param adjust_delay: ``False`` when the request asked latency-driven
        controllers not to learn from it (``autothrottle_dont_adjust_delay``).
    :param sent_at: when the request was sent (the grant time, limiter clock).
    :param scopes: the scopes this feedback is for; ``None`` means all the
        permit's scopes.
    :param paused: this process's last long pause (a garbage collection of
        5 ms or more) before the send, as ``(seconds from its end to the
        send, its length)``; ``None`` if none is known. Kept once an
        :class:`Adaptive` is configured: a pause delays the sends granted
        before it, and a limit may refuse one sent up to a window after it.
    """

    status: int | None = None
    headers: Mapping[str, Any] | Any = None
    exception: BaseException | None = None
    latency: float | None = None
    size: int | None = None
    rate_limit: RateLimitInfo | None = None
    adjust_delay: bool = True
    sent_at: float | None = None
    scopes: frozenset[str] | None = None
    paused: tuple[float, float] | None = None


class ScopeView(Protocol):
    """What a controller may read of its scope: a read-only view, passed on every call.

    Controllers never keep it: the in-memory ledger passes itself, a shared
    backend passes a :class:`ScopeSnapshot` of the state it read.
    """

    @property
    def name(self) -> str:
        """The scope's name."""
        ...

    @property
    def policy(self) -> ScopePolicy:
        """The scope's configured policy."""
        ...

    @property
    def delay(self) -> float:
        """The effective delay between sends in force now."""
        ...

    @property
    def concurrency(self) -> int | None:
        """The effective concurrency in force now (``None`` = unlimited)."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests of the scope in flight now."""
        ...

    @property
    def in_flight_exact(self) -> bool:
        """Whether :attr:`in_flight` counts exactly the requests in flight.

        A backend shared by processes counts its leases instead, among them
        ones granted but not yet sent and ones answered but not yet released.
        """
        ...


@attrs.frozen(kw_only=True)
class ScopeSnapshot:
    """A :class:`ScopeView` made of plain values (what a shared backend read from its store)."""

    name: str
    policy: ScopePolicy
    delay: float
    concurrency: int | None
    in_flight: int
    in_flight_exact: bool = True


@runtime_checkable
class Controller(Protocol):
    """A per-scope feedback loop that moves the limits the ledger enforces.

    Controllers are synchronous and pure: they are told the time and given a
    read-only :class:`ScopeView` of their scope on every call, never read a
    clock, and keep no reference to the scope. Their state is plain data
    (:meth:`get_state`/:meth:`set_state`), so a shared backend can keep it in
    its store and run the same code in every process.

    The scope combines its controllers: the base delay and concurrency are
    the policy's (or those of the controller with ``replaces_policy``); the
    effective delay is the largest ``delay`` any of them asks for, the
    effective concurrency the smallest ``concurrency`` (``None`` = no
    opinion), and the scope is closed until the latest ``blocked_until``.
    Subclass :class:`BaseController` to get the defaults.
    """

    @property
    def delay(self) -> float:
        """Minimum seconds between sends this controller asks for (0 = no opinion)."""
        ...

    @property
    def concurrency(self) -> int | None:
        """Most requests in flight this controller allows (``None`` = no opinion)."""
        ...

    @property
    def blocked_until(self) -> float:
        """No send before this time (``-inf`` = not blocked)."""
        ...

    @property
    def jitter(self) -> tuple[float, float] | None:
        """A ``(low, high)`` jitter that replaces the policy's while not ``None``."""
        ...

    @property
    def replaces_policy(self) -> bool:
        """``True`` if ``delay``/``concurrency`` replace the policy's as the base (rampup)."""
        ...

    @property
    def reason(self) -> str:
        """Why the controller asks for its delay, in words (``""`` = no opinion)."""
        ...

    @property
    def due(self) -> float:
        """The earliest time at which :meth:`on_send` may change something.

        ``-inf`` = call it on every send; ``inf`` = never.
        """
        ...

    def on_send(self, scope: ScopeView, now: float) -> bool | None:
        """A request of the scope was sent at ``now`` (called only once ``now >= due``).

        Return ``True`` if the controller's limits changed (the scope then
        recomputes its effective limits); ``None``/``False`` otherwise.
        """

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        """A response or failure of the scope arrived at ``now``."""

    def get_state(self) -> dict[str, Any]:
        """The controller's state as plain data (numbers, strings, None, lists, dicts)."""
        ...

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state written by :meth:`get_state` (of a controller of the same config)."""


_PLAIN = (type(None), bool, int, float, str)


def _is_plain(value: object) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


class BaseController:
    """A convenient base for custom controllers: no opinion until told otherwise.

    Set ``delay``, ``concurrency`` or ``blocked_until`` on the instance to ask
    for limits; override :meth:`on_send` and :meth:`on_feedback`. The state
    written by :meth:`get_state` is every instance attribute holding plain
    data (``None``, bool, int, float, str, and lists, tuples or dicts of
    them); other attributes (a policy, a config object) count as
    configuration and are not saved, so a shared backend rebuilds them by
    calling the factory.

    Usage::

        class Cooldown(BaseController):
            def __init__(self, policy):
                self.delay = 0.0

            def on_feedback(self, scope, feedback, now):
                if feedback.status == 503:
                    self.blocked_until = now + 30.0
    """

    delay: float = 0.0
    concurrency: int | None = None
    blocked_until: float = -math.inf
    jitter: tuple[float, float] | None = None
    replaces_policy: bool = False
    reason: str = ""
    due: float = -math.inf

    def on_send(self, scope: ScopeView, now: float) -> bool | None:
        """A request was sent; return ``True`` if the limits changed."""
        return None

    def on_feedback(self, scope: ScopeView, feedback: Feedback, now: float) -> None:
        """A response or failure arrived."""

    def get_state(self) -> dict[str, Any]:
        """Every instance attribute that holds plain data."""
        return {name: value for name, value in vars(self).items() if _is_plain(value)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Set the attributes written by :meth:`get_state`."""
        for name, value in state.items():
            setattr(self, name, value)


class SlotState:
    """For built-in controllers with ``__slots__``: their state is the slots named in ``STATE``."""

    __slots__ = ()

    STATE: tuple[str, ...] = ()

    def get_state(self) -> dict[str, Any]:
        """The slots named in ``STATE``, as plain data."""
        return {name: getattr(self, name) for name in self.STATE}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore the slots named in ``STATE``."""
        for name in self.STATE:
            if name in state:
                setattr(self, name, state[name])
