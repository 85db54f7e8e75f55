"""A listener that keeps when each permit was granted, per scope: spacing seen by the sender.

The limiter spaces its grants exactly; a loaded machine delays some requests
on their way to the local server, so gaps measured at the server can come
out tens of milliseconds short of the spacing the limiter kept. Tests that
check a delay measure it here, where the sends leave.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from typing import Any

from throttlekit import LimiterListener


class Grants(LimiterListener):
    """The limiter-clock grant times of every permit, per scope granted."""

    def __init__(self) -> None:
        self.at: defaultdict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()  # the synchronous driver calls from many threads

    def on_grant(self, permit: Any, waited: float) -> None:
        with self._lock:
            for scope in permit.scopes:
                self.at[scope].append(permit.granted_at)

    def gaps(self, scope: str) -> list[float]:
        """The gaps between consecutive grants of ``scope``, in grant order."""
        times = sorted(self.at[scope])
        return [b - a for a, b in itertools.pairwise(times)]
