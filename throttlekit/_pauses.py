"""This process's own long pauses: garbage collections that held every thread.

A pause delays the sends granted just before it, so they reach the server
closer to the ones after it than they left: a limit counted over a window
can then refuse a send that a steady pace would have got through, up to a
window after the pause. Adaptive asks, of such a refusal, whether the
client's pause explains it (see ``Feedback.paused``), and then neither
widens its margin nor takes it for a limit that dropped. A full collection
of a large heap takes tens of milliseconds (40-50 ms in an httpx client
that had run a minute), more than the few ms a pace just below a limit
leaves between sends.

Watched once an :class:`~throttlekit.Adaptive` is configured: the garbage
collector then calls :func:`_on_collect` at the start and the end of each
collection. Times are on the limiter's clock where it runs (a simulation's
virtual clock stands still during one, so no pause is seen there).
"""

from __future__ import annotations

import gc
from typing import Any

from ._clock import now_or_monotonic

__all__ = ["last_before", "left_by", "watch"]

#: The shortest pause kept, in seconds: a young generation's collection
#: takes well under a millisecond, and a pace just below a limit leaves a
#: few ms between sends (9.6/s against 10/s: 4 ms).
LONG_PAUSE = 0.005

#: How soon after its grant a request is sent, at most: a pause that began
#: later found it gone (the task it wakes runs within the event loop's turn).
SEND_LAG = 0.005

#: How many recent pauses are kept: a refusal asks about the last second or two.
KEPT = 16

# (ended at, seconds long), oldest first. A tuple, replaced whole: a collection
# can start at any allocation, in any thread, even while a reader walks it.
_pauses: tuple[tuple[float, float], ...] = ()
_started = 0.0


def _on_collect(phase: str, info: dict[str, Any]) -> None:
    global _pauses, _started
    if not info["generation"]:  # (the youngest's are far shorter than a long pause)
        return
    if phase == "start":
        _started = now_or_monotonic()
        return
    ended = now_or_monotonic()
    if ended - _started >= LONG_PAUSE:
        _pauses = (*_pauses[1 - KEPT :], (ended, ended - _started))


def watch() -> None:
    """Start keeping this process's long pauses (once; later calls do nothing)."""
    if _on_collect not in gc.callbacks:
        gc.callbacks.append(_on_collect)


def last_before(at: float) -> tuple[float, float] | None:
    """The last long pause that ended by ``at``: (seconds from its end to ``at``, its length)."""
    for ended, length in reversed(_pauses):
        if ended <= at:
            return at - ended, length
    return None


def left_by(granted: float) -> float:
    """When a send granted at ``granted`` had left, at the latest.

    The end of a long pause that began within ``SEND_LAG`` of the grant (the
    send waited for it), else ``granted``.
    """
    for ended, length in reversed(_pauses):
        if ended <= granted:
            break
        if ended - length <= granted + SEND_LAG:
            return ended
    return granted
