"""What the HTTP client adapters share: holding a permit across calls, reading feedback."""

from __future__ import annotations

import contextvars
import json
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from .. import scopes as _scopes
from ..headers import MAX_WAIT_BODY, wants_body

if TYPE_CHECKING:
    from .._controller import Feedback
    from .._limiter import Limiter, Permit
    from .._sync import SyncLimiter, SyncPermit

__all__ = [
    "ConsumedHook",
    "HeldPermit",
    "SyncHeldPermit",
    "body_too_large",
    "check_budgets",
    "content_length",
    "is_json",
    "json_body",
    "missing_extra",
    "options",
    "read_for_feedback",
    "throttling",
    "token_usage",
]

#: A JSON body longer than this (by its ``Content-Length``) is not read for a consumed hook.
MAX_JSON_BODY = 8 * 1024 * 1024

#: ``consumed(response, body)``: the real cost per scope of a request, from its
#: response and, for a JSON response, its parsed body (else ``None``); ``None``
#: keeps the declared costs.
ConsumedHook = Callable[[Any, Any], "Mapping[str, float] | None"]


def missing_extra(module: str, package: str, extra: str) -> ImportError:
    """The :class:`ImportError` an adapter raises when its framework is not installed."""
    return ImportError(
        f'{module} needs {package}, which is not installed: pip install "throttlekit-http[{extra}]"'
    )


def content_length(headers: Mapping[str, Any] | Any) -> int | None:
    """The response's ``Content-Length`` as an int, or ``None`` when absent or malformed."""
    try:
        value = headers.get("content-length")
    except AttributeError:
        return None
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    text = text.strip()
    return int(text) if text.isdigit() else None


class HeldPermit:
    """A permit taken outside an ``async with`` block and given back exactly once.

    Adapters acquire when a request is handed to them and release when the
    framework says the response is finished (closed, released, its body
    read), which is usually in another call. :meth:`release` is idempotent
    and shielded from cancellation, so a cancelled ``aclose()`` still gives
    the slot back.
    """

    __slots__ = ("_in_memory", "_released", "permit")

    def __init__(self, permit: Permit, limiter: Limiter) -> None:
        self.permit = permit
        self._released = False
        # An in-memory permit releases synchronously, a shared backend's lease
        # only with an awaited round trip.
        self._in_memory = limiter.backend is None

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<HeldPermit {state} {self.permit!r}>"

    @classmethod
    async def acquire(
        cls,
        limiter: Limiter,
        request: Any,
        *,
        priority: int = 0,
        scopes: _scopes.ScopesLike | None = None,
    ) -> HeldPermit:
        """Wait for a permit for ``request`` (cancellation while waiting takes nothing)."""
        permit = limiter.acquire(request, priority=priority, scopes=scopes)
        # A request the adapter holds (while its response streams) is no
        # ``async with`` block that later acquires of the task nest in.
        permit._encloses = False
        await permit.__aenter__()
        return cls(permit, limiter)

    @property
    def released(self) -> bool:
        """Whether the permit has been given back."""
        return self._released

    async def release(self) -> None:
        """Give the permit back (idempotent, not interruptible by cancellation)."""
        if self._released:
            return
        self._released = True
        with anyio.CancelScope(shield=True):
            await self.permit.__aexit__(None, None, None)

    def release_now(self) -> bool:
        """Give the permit back without awaiting, if the limiter allows it.

        Returns ``False`` (and keeps the permit) when the limiter uses a shared
        backend, whose release is a network round trip: use :meth:`release`.
        """
        if self._released:
            return True
        if not self._in_memory:
            return False
        self._released = True
        self.permit.release()
        return True


#: Request extensions that the limiter reads from a request-like besides its URL.
_CARRIED = frozenset({"throttling_scopes", "autothrottle_dont_adjust_delay"})


class SyncHeldPermit:
    """A :class:`~throttlekit.SyncLimiter` permit held across calls, given back exactly once.

    The synchronous adapters (requests, ``httpx.Client``) acquire when a
    request is handed to them and release when its response is finished,
    usually in another call; :meth:`release` is idempotent and thread-safe.
    Everything here is independent of the HTTP library.
    """

    __slots__ = ("_lock", "_released", "permit", "sent")

    def __init__(self, permit: SyncPermit) -> None:
        self.permit = permit
        self._released = False
        self._lock = threading.Lock()
        #: When the request was handed to the library that sends it (``time.monotonic()``).
        self.sent = time.monotonic()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<SyncHeldPermit {state} {self.permit!r}>"

    @classmethod
    def acquire(cls, limiter: SyncLimiter, request: Any) -> SyncHeldPermit:
        """Wait for a permit for ``request``, with the :func:`throttling` settings in force."""
        settings = options()
        extensions = getattr(request, "extensions", None) or {}
        priority = extensions.get("throttling_priority", settings.priority)
        scopes = None if "throttling_scopes" in extensions else settings.scopes
        like = request
        if limiter.resolver is _scopes.by_host and not _CARRIED.intersection(extensions):
            # The URL alone decides: as a string it takes the limiter's fast lane.
            like = str(request.url)
        permit = limiter.acquire(like, priority=priority, scopes=scopes)
        # A request the adapter holds (while its response streams) is no
        # ``with`` block that later acquires of the thread nest in.
        permit._encloses = False
        permit.__enter__()
        return cls(permit)

    @property
    def released(self) -> bool:
        """Whether the permit has been given back."""
        return self._released

    def failed(self, exc: BaseException) -> Feedback:
        """Record ``exc``, which ended the request before a response, and its latency."""
        return self.permit.record(
            exception=exc,
            latency=time.monotonic() - self.sent,
            adjust_delay=options().adjust_delay,
        )

    def answered(
        self,
        response: Any,
        *,
        status: int,
        headers: Any,
        latency: float,
        consumed: Mapping[str, float] | None = None,
        budgets: Mapping[str, str] | None = None,
    ) -> Feedback:
        """Record a response: its status, headers, latency and size (``Content-Length``)."""
        return self.permit.record(
            response,
            status=status,
            headers=headers,
            latency=latency,
            size=content_length(headers),
            adjust_delay=options().adjust_delay,
            consumed=consumed,
            budgets=budgets,
        )

    def body_failed(self, exc: BaseException) -> None:
        """Record a failure while the body is read (after the status was recorded)."""
        if not self._released:
            self.permit.record(exception=exc, adjust_delay=False)

    def release(self) -> None:
        """Give the permit back (idempotent)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self.permit.release()


@attrs.frozen
class _Options:
    scopes: _scopes.ScopeCosts | None = None
    priority: int = 0
    adjust_delay: bool | None = None


_NO_OPTIONS = _Options()
_OPTIONS: contextvars.ContextVar[_Options] = contextvars.ContextVar(
    "throttlekit_adapter_options", default=_NO_OPTIONS
)


@contextmanager
def throttling(
    *,
    scopes: _scopes.ScopesLike | None = None,
    priority: int | None = None,
    adjust_delay: bool | None = None,
) -> Iterator[None]:
    """Set the scopes and priority of the requests sent inside the ``with`` block.

    :param scopes: the scopes instead of the limiter's resolver: a scope
        name, a set of names or ``{scope: cost}``. ``None`` keeps the
        enclosing block's (by default: use the resolver).
    :param priority: higher is granted first among waiters of a scope;
        ``None`` keeps the enclosing block's (by default 0).
    :param adjust_delay: ``False`` keeps latency-driven controllers
        (AutoThrottle) from learning from these responses; ``None`` keeps the
        enclosing block's.

    The settings live in a :class:`contextvars.ContextVar`: they apply to
    requests made by this task inside the block, every redirect hop
    included, and to tasks started inside it (which copy the context). Both
    the aiohttp middleware and the httpx transport read them (for httpx, a
    request's own ``extensions`` win), so they also reach the requests an
    SDK built on httpx sends for you.

    Usage::

        with throttling(scopes={"api.example.com": 1, "api-budget": 5.0}, priority=10):
            async with session.post("https://api.example.com/search", json=query) as r:
                ...
    """
    current = _OPTIONS.get()
    if scopes is not None:
        scopes = _scopes.as_scope_costs(scopes)
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise TypeError(f"priority must be an int, got {priority!r}")
    if adjust_delay is not None and not isinstance(adjust_delay, bool):
        raise TypeError(f"adjust_delay must be a bool or None, got {adjust_delay!r}")
    token = _OPTIONS.set(
        _Options(
            scopes=current.scopes if scopes is None else scopes,
            priority=current.priority if priority is None else priority,
            adjust_delay=current.adjust_delay if adjust_delay is None else adjust_delay,
        )
    )
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def check_budgets(budgets: Mapping[str, str] | None) -> dict[str, str] | None:
    """Validate an adapter's ``budgets=`` (``{budget: scope}``)."""
    if budgets is None:
        return None
    if not isinstance(budgets, Mapping):
        raise TypeError(f"budgets must be a mapping of budget names to scopes, got {budgets!r}")
    for name, scope in budgets.items():
        if not isinstance(name, str) or not isinstance(scope, str):
            raise TypeError(
                f"budgets must map str budget names to str scopes, got {name!r}: {scope!r}"
            )
    return dict(budgets) or None


def options() -> _Options:
    """The :func:`throttling` settings in force for the running task."""
    return _OPTIONS.get()


def is_json(headers: Any) -> bool:
    """Whether the ``Content-Type`` says JSON (``application/json`` or ``*/*+json``)."""
    try:
        value = headers.get("content-type")
    except AttributeError:
        return False
    if not value:
        return False
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    kind = text.partition(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def json_body(raw: bytes) -> Any:
    """The parsed JSON document of ``raw``, or ``None`` when it is not valid JSON."""
    try:
        return json.loads(raw)
    except ValueError:  # also UnicodeDecodeError
        return None


def body_too_large(headers: Any) -> bool:
    """Whether a response is too large to read for a consumed hook (by ``Content-Length``)."""
    length = content_length(headers)
    return length is not None and length > MAX_JSON_BODY


async def read_for_feedback(
    response: Any,
    status: int,
    read: Callable[[int | None], Awaitable[bytes | None]],
    consumed: ConsumedHook | None,
    permit: Permit,
) -> tuple[Mapping[str, float] | None, bytes | None]:
    """Read a response's body where feedback needs it, in an adapter.

    A JSON body (up to :data:`MAX_JSON_BODY`) is read for a ``consumed``
    hook, and a 429 or 503 body that may state its wait
    (:func:`throttlekit.headers.wants_body`) to be recorded, at most
    :data:`~throttlekit.headers.MAX_WAIT_BODY` bytes of it; other bodies
    (streams) are not read. ``read(limit)`` reads the body (decoded) so that
    the client can read it again, or gives ``None``: the whole body with
    ``limit=None``, else only a body of at most ``limit`` bytes. A failure
    to read is recorded, then raised.

    :returns: the hook's result (``None`` without a hook) and the body to
        record with :meth:`Permit.record <throttlekit.Permit.record>` (or ``None``).
    """
    headers = response.headers
    for_hook = consumed is not None and is_json(headers) and not body_too_large(headers)
    for_wait = wants_body(status, headers)
    raw = None
    if for_hook or for_wait:
        try:
            raw = await read(None if for_hook else MAX_WAIT_BODY)
        except Exception as exc:
            permit.record(exception=exc, adjust_delay=False)
            raise
    costs = None
    if consumed is not None:
        costs = consumed(response, json_body(raw) if for_hook and raw else None)
    return costs, raw if for_wait and raw is not None and len(raw) <= MAX_WAIT_BODY else None


def token_usage(scope: str) -> Callable[[Any, Any], dict[str, float] | None]:
    """A consumed hook: the tokens an LLM API's JSON response reports, as the cost of ``scope``.

    Reads the body's ``usage`` object: ``total_tokens`` (OpenAI chat
    completions and responses), else ``input_tokens + output_tokens``
    (Anthropic messages), else ``prompt_tokens + completion_tokens``. A
    response without usage (an error, a stream) keeps the declared cost.

    Usage::

        transport = ThrottledTransport(limiter, consumed=token_usage("openai-tokens"))
    """
    if not isinstance(scope, str):
        raise TypeError(f"scope must be a str, got {scope!r}")

    def consumed(response: Any, body: Any) -> dict[str, float] | None:
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        tokens = _count(usage, "total_tokens")
        if tokens is None:
            parts = [_count(usage, "input_tokens"), _count(usage, "output_tokens")]
            if None in parts:
                parts = [_count(usage, "prompt_tokens"), _count(usage, "completion_tokens")]
            if None in parts:
                return None
            tokens = sum(part for part in parts if part is not None)
        return {scope: tokens}

    return consumed


def _count(usage: Mapping[str, Any], key: str) -> float | None:
    value = usage.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None
