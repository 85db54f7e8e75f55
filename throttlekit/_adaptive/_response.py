"""What a response tells Adaptive: a throttle, an overload error, a success, or nothing."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from .._backoff import DEFAULT_BACKOFF_EXCEPTIONS, Backoff
from ..headers import parse

if TYPE_CHECKING:
    from .._controller import Feedback

__all__ = ["Kind", "classify", "quota_spent"]

#: The refusal of a rate limit (RFC 6585).
TOO_MANY_REQUESTS = 429
#: The lowest status of a client error, and of a server error.
CLIENT_ERROR, SERVER_ERROR = 400, 500
#: Statuses that mean "overloaded" when they carry no ``Retry-After``.
OVERLOAD_CODES = frozenset({500, 502, 503, 504, 520, 521, 522, 523, 524})

#: Classifies timeouts and dropped connections (the default backoff's exceptions) as overload.
_BACKOFF_FOR_EXCEPTIONS = Backoff(exceptions=DEFAULT_BACKOFF_EXCEPTIONS)


class Kind(enum.Enum):
    """The kind of an answer, as the rate and concurrency loops see it."""

    THROTTLE = "throttle"  #: a 429, or an error that tells a wait
    OVERLOAD = "overload"  #: a 5xx without a wait, a timeout, a dropped connection
    OK = "ok"  #: any other status: accepted
    OTHER = "other"  #: an exception that says nothing of the server


def classify(feedback: Feedback) -> Kind:
    """The kind of the answer ``feedback`` reports."""
    status = feedback.status
    info = feedback.rate_limit
    if status == TOO_MANY_REQUESTS or (
        status is not None and status >= CLIENT_ERROR and info is not None and info.retry_after
    ):
        return Kind.THROTTLE
    if status is None:
        exception = feedback.exception
        if exception is not None and isinstance(
            exception, _BACKOFF_FOR_EXCEPTIONS.exception_classes()
        ):
            return Kind.OVERLOAD
        return Kind.OTHER
    if status in OVERLOAD_CODES:
        return Kind.OVERLOAD
    return Kind.OK


def quota_spent(feedback: Feedback, remaining: float | None, budgets: bool = True) -> bool:
    """Whether the response says a quota is used up (which explains a refusal).

    The scope's own view (``remaining``) leaves out the budgets other scopes
    track (a token budget routed to its own scope, say), so when it has quota
    left every budget the headers report is looked at (unless ``budgets`` is
    false: the scope set the headers' quota aside).
    """
    if remaining is not None and remaining <= 0:
        return True
    if not budgets or feedback.headers is None:
        return False
    # (``now`` only places dated resets; one reading of the answer, as every controller's)
    info = parse(feedback.headers, now=0.0, status=feedback.status)
    return any(budget.remaining == 0 for budget in (info, *info.budgets))
