"""Adaptive: find and hold the rate and concurrency a server allows, in small parts.

The parts, each in its own module:

* ``_config`` -- :class:`Adaptive`, the user's configuration; ``_tuning`` -- every inner constant;
* ``_response`` -- what an answer tells: a throttle, an overload error, a success;
* ``_sends`` -- the log of answered sends and the rates measured from it;
* ``_phase`` -- the rate loop's phases and the events that move it;
* ``_rate`` -- the rate loop's state (edge, target, margin, hold); ``_edge`` -- placing a new edge;
* ``_throttle`` -- deciding on a refusal; ``_overload`` -- deciding on an overload error;
* ``_paused`` -- whether the client's own pause explains a refusal (``throttlekit._pauses``);
* ``_advance`` -- moving the rate along its phase as time passes;
* ``_closure`` -- closed servers, knocks and long windows;
* ``_errors`` -- the judge of random, overload and limit errors;
* ``_inflight`` -- the detector of a limit on requests in flight;
* ``_spacing`` -- a leaky bucket without burst: the spacing it accepts, searched by gaps;
* ``_concurrency`` -- the concurrency loop (rounds, latency floor, hung requests);
* ``_parts`` and ``_state`` -- one scope's parts, fed and combined.
"""

from __future__ import annotations

from ._config import Adaptive
from ._state import AdaptiveState
from ._tuning import AdaptiveTuning

__all__ = ["Adaptive", "AdaptiveState", "AdaptiveTuning"]
