"""throttlekit: per-scope, server-aware throttling for HTTP clients and crawlers.

On asyncio and trio with :class:`Limiter`, and in threads with :class:`SyncLimiter`.

Quick start::

    import throttlekit

    limiter = throttlekit.Limiter(default=throttlekit.ScopePolicy(concurrency=2, delay=0.5))

    async with limiter.acquire("https://example.com/page") as permit:
        response = await client.get("https://example.com/page")
        permit.record(response)
"""

from __future__ import annotations

from ._adaptive import Adaptive, AdaptiveTuning
from ._autothrottle import AutoThrottle
from ._backoff import Backoff
from ._controller import BaseController, Controller, Feedback, ScopeSnapshot, ScopeView
from ._errors import (
    BackendUnavailable,
    Overloaded,
    ScopeStalled,
    ThrottlekitError,
    ThrottleTimeout,
    WouldBlock,
)
from ._limiter import Limiter, Permit
from ._listeners import LimiterListener
from ._policy import ScopePolicy
from ._rampup import Rampup
from ._stats import LimiterStatistics, ScopeStatistics
from ._sync import SyncLimiter, SyncPermit

__all__ = [
    "Adaptive",
    "AdaptiveTuning",
    "AutoThrottle",
    "BackendUnavailable",
    "Backoff",
    "BaseController",
    "Controller",
    "Feedback",
    "Limiter",
    "LimiterListener",
    "LimiterStatistics",
    "Overloaded",
    "Permit",
    "Rampup",
    "ScopePolicy",
    "ScopeSnapshot",
    "ScopeStalled",
    "ScopeStatistics",
    "ScopeView",
    "SyncLimiter",
    "SyncPermit",
    "ThrottleTimeout",
    "ThrottlekitError",
    "WouldBlock",
]

__version__ = "0.1.0"
