"""The rate loop's phases, and which event moves it from which phase to which."""

from __future__ import annotations

import enum

__all__ = ["Event", "Phase", "next_phase"]


class Phase(str, enum.Enum):
    """Where the rate loop is (a ``str``, so that the state stays plain data)."""

    START = "start"  #: no limit met: the rate doubles while the scope uses it
    RECOVER = "recover"  #: climbing from a cut back to the target below the edge
    HOLD = "hold"  #: holding at the target for ``hold_for`` seconds
    PROBE = "probe"  #: rising slowly above the target to see whether the limit rose
    CLIMB = "climb"  #: a search up after a rise was refused at once: rising evenly
    MEASURE = "measure"  #: a slow server's refusal: waiting for its answers to count the edge
    STATED = "stated"  #: the server's headers count the quota; the rate loop stands aside
    CAPPED = "capped"  #: a limit on requests in flight: the rate loop stands aside
    SPACED = "spaced"  #: a leaky bucket without burst: paced at the spacing it accepts


class Event(enum.Enum):
    """What moves the rate loop: a refusal, an error, or time passing in a phase."""

    EDGE = "a refusal measured the edge"
    CLIMB = "a search up was refused about where the probe had proved"
    SLOW_REFUSAL = "a slow server refused: its answers will tell the edge"
    IN_FLIGHT_LIMIT = "refusals at one number in flight"
    SPACED = "refused well sooner after an acceptance than every gap accepted"
    QUOTA_STATED = "the headers count the quota"
    OVERLOAD = "overload errors"
    LONG_WINDOW = "closed for longer than it had been open"
    REOPENED = "open again after a short closure"
    NOT_A_LIMIT = "errors below every edge"
    RECOVERED = "back at the target"
    HELD = "held long enough"
    HELD_AFTER_OVERLOAD = "held after an overload with few errors"
    ROSE = "accepted well past the edge"


_ANY = frozenset(Phase)

#: Each event: the phases it may come in, and the phase it moves to.
TRANSITIONS: dict[Event, tuple[frozenset[Phase], Phase]] = {
    Event.EDGE: (_ANY, Phase.RECOVER),
    Event.CLIMB: (frozenset({Phase.START, Phase.MEASURE}), Phase.CLIMB),
    Event.SLOW_REFUSAL: (_ANY, Phase.MEASURE),
    Event.IN_FLIGHT_LIMIT: (_ANY, Phase.CAPPED),
    Event.SPACED: (_ANY, Phase.SPACED),
    Event.QUOTA_STATED: (_ANY, Phase.STATED),
    Event.OVERLOAD: (_ANY, Phase.HOLD),
    Event.LONG_WINDOW: (_ANY, Phase.RECOVER),
    Event.REOPENED: (_ANY, Phase.START),
    Event.NOT_A_LIMIT: (_ANY, Phase.START),
    Event.RECOVERED: (frozenset({Phase.RECOVER}), Phase.HOLD),
    Event.HELD: (frozenset({Phase.HOLD}), Phase.PROBE),
    Event.HELD_AFTER_OVERLOAD: (frozenset({Phase.HOLD}), Phase.START),
    Event.ROSE: (frozenset({Phase.PROBE, Phase.CLIMB}), Phase.START),
}


def next_phase(phase: Phase, event: Event) -> Phase:
    """The phase ``event`` moves the rate loop to from ``phase``.

    :raises RuntimeError: when ``event`` cannot come in ``phase`` (a bug).
    """
    allowed, to = TRANSITIONS[event]
    if phase not in allowed:
        raise RuntimeError(f"adaptive: {event.name} cannot come in phase {phase.value}")
    return to
