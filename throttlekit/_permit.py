"""What ``acquire()`` hands out: a permit, backend-agnostic (the general path).

A backend may hand out a subclass with a fast path of its own (the
in-memory backend does: see :class:`throttlekit.backends.memory.MemoryPermit`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from . import scopes as _scopes
from ._clock import current_task as _current_task
from ._controller import Feedback
from ._errors import WouldBlock

if TYPE_CHECKING:
    from ._base import BaseLimiter
    from ._lane import FastLane
    from .scopes import ScopesLike

__all__ = ["Permit", "held_permits"]


def held_permits(lane: FastLane) -> dict[object, Permit]:
    """The innermost permit each task holds in ``with`` blocks of the lane's limiter.

    The lane keeps them in ``lane.holds``: ``None`` while none is held,
    the permit itself while one alone is (the fast path tests and sets that
    one field on every uncontended acquire, which costs less than a dict
    insert and pop), else this dict, made here as soon as anything needs it,
    and dropped when it empties (see :meth:`Permit._unheld`).
    """
    holds = lane.holds
    if isinstance(holds, dict):
        return holds
    held: dict[object, Permit] = {}
    if holds is not None:
        held[holds._task] = holds
    lane.holds = held
    return held


def _holds_of(lane: FastLane, task: object) -> list[Permit]:
    """The permits of the lane's limiter that ``task`` holds in ``with`` blocks, outermost first."""
    holds = lane.holds
    hold: Permit | None
    if isinstance(holds, dict):
        hold = holds.get(task)
    else:
        hold = holds if holds is not None and holds._task is task else None
    found = []
    while hold is not None:
        if hold._task is not None:
            found.append(hold)
        hold = hold._outer
    found.reverse()
    return found


def _only(scopes: Iterable[str], granted: Mapping[str, float]) -> frozenset[str]:
    names = frozenset([scopes] if isinstance(scopes, str) else scopes)
    unknown = names - granted.keys()
    if unknown:
        raise ValueError(
            f"record(scopes=...) names scopes the permit does not hold: {sorted(unknown)}"
        )
    return names


def _status_of(response: Any) -> int | None:
    for attribute in ("status_code", "status"):
        value = getattr(response, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _check_feedback(status: object, exception: object, latency: object, size: object) -> None:
    """``record()``'s arguments, checked: misuse is a TypeError/ValueError, never ignored."""
    if status is not None:
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"status must be an int HTTP status code, got {status!r}")
        if not 100 <= status <= 999:
            raise ValueError(f"status must be an HTTP status code (100-999), got {status!r}")
    if exception is not None and not isinstance(exception, BaseException):
        raise TypeError(f"exception must be an exception instance, got {exception!r}")
    if latency is not None:
        if isinstance(latency, bool) or not isinstance(latency, (int, float)):
            raise TypeError(f"latency must be a number of seconds, got {latency!r}")
        if not (math.isfinite(latency) and latency >= 0):
            raise ValueError(f"latency must be a finite number of seconds >= 0, got {latency!r}")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int number of bytes, got {size!r}")
        if size < 0:
            raise ValueError(f"size must be >= 0 bytes, got {size!r}")


class Permit:
    """A request's right to be sent, from :meth:`Limiter.acquire`.

    Use it as ``async with limiter.acquire(url) as permit:``; leaving the block
    gives back the concurrency it holds, also on error and on cancellation.
    Inside the block, report how the request went with :meth:`record`.
    """

    __slots__ = (
        "_encloses",
        "_lane",
        "_lease",
        "_limiter",
        "_outer",
        "_priority",
        "_request",
        "_scopes",
        "_shared",
        "_task",
        "_timeout",
        "recorded",
    )

    # Made by Limiter.acquire(), which calls the class (it has no __init__)
    # and sets every field itself: a permit per request is the hot path.
    _limiter: BaseLimiter
    # The limiter's uncontended grant, and where held permits are kept.
    _lane: FastLane
    _request: Any
    _scopes: ScopesLike | None
    _priority: int
    _timeout: float | None
    # The backend's lease, None before the grant. A backend's permit type
    # may keep something cheaper there until a lease is needed: read what
    # it holds with _get_lease(), and only test this for None.
    _lease: Any
    # Nested in permits this task holds: (permit, the scopes shared with it).
    _shared: tuple[tuple[Permit, frozenset[str]], ...] | None
    # Whether acquires inside its ``async with`` block nest in it (adapters
    # turn it off for the requests they send).
    _encloses: bool
    # While held in ``async with``: the task holding it, and the permit of
    # the same limiter that task held when it entered this one.
    _task: object
    _outer: Permit | None
    # Whether record() has been called.
    recorded: bool

    def __repr__(self) -> str:
        lease = self._get_lease()
        return f"<Permit {lease!r}>" if lease else "<Permit (not acquired)>"

    @property
    def scopes(self) -> dict[str, float]:
        """The granted scopes and the cost taken from each.

        A permit nested in one that its task holds lists only the scopes it
        added (see :meth:`Limiter.acquire`).
        """
        if self._lease is None:
            if self._shared is not None:
                return {}
            raise RuntimeError("the permit has not been acquired yet")
        return dict(self._get_lease().scopes)

    @property
    def granted_at(self) -> float:
        """The limiter-clock time of the grant (the send time)."""
        if self._lease is None:
            if self._shared:
                return self._shared[0][0].granted_at
            raise RuntimeError("the permit has not been acquired yet")
        return float(self._get_lease().granted_at)

    @property
    def request(self) -> Any:
        """The request-like this permit was acquired for."""
        return self._request

    async def __aenter__(self) -> Permit:
        if self._lease is not None or self._shared is not None:
            raise RuntimeError("a permit can be entered only once")
        limiter = self._limiter
        task = _current_task()
        mine = _holds_of(self._lane, task)
        if mine:
            await self._enter_nested(mine)
        else:
            costs = limiter._resolve(self._request, self._scopes)
            if type(costs) is not dict:
                costs = _scopes.as_scope_costs(await costs)
            limiter._check_stall(costs)
            self._lease = await limiter._backend.acquire(
                costs, priority=self._priority, timeout=self._timeout
            )
        if self._encloses:
            self._hold(task)
        return self

    def _enter_nowait(self) -> None:
        """Take the permit now (for ``acquire_nowait()``) or raise :class:`WouldBlock`."""
        limiter = self._limiter
        costs = limiter._resolve(self._request, self._scopes)
        if type(costs) is not dict:
            if inspect.iscoroutine(costs):
                costs.close()
            raise RuntimeError("acquire_nowait() cannot use an async resolver; use acquire()")
        lease = limiter._backend.try_acquire(costs, self._priority)
        if lease is None:
            raise WouldBlock(f"no room now for {costs}")
        self._lease = lease

    def _get_lease(self) -> Any:
        """The backend's lease (``None`` before the grant)."""
        return self._lease

    def _hold(self, task: object) -> None:
        """Held by ``task`` in ``async with``: its acquires on this limiter nest in it."""
        held = held_permits(self._lane)
        self._outer = held.get(task)
        self._task = task
        held[task] = self

    def _unhold(self) -> None:
        """The ``async with`` block is left: acquires of its task no longer nest in it."""
        task = self._task
        self._task = None
        self._unheld(task, held_permits(self._lane).pop(task, None))

    def _unheld(self, task: object, top: Permit | None) -> None:
        """The rest of :meth:`_unhold` once ``top``, the task's innermost hold, is popped."""
        lane = self._lane
        held = held_permits(lane)
        if top is self:
            outer = self._outer
            while outer is not None and outer._task is None:
                outer = outer._outer
            if outer is not None:
                held[task] = outer
            self._outer = None
        elif top is not None:  # left before a permit entered inside it: that one stays
            held[task] = top
        if not held:  # nothing held any more: the fast path's test is one field again
            lane.holds = None

    def _held_scopes(self) -> set[str]:
        """The scopes this permit holds: its own and those it shares with enclosing ones."""
        names = {name for _, shared in self._shared or () for name in shared}
        if self._lease is not None:
            names.update(self._get_lease().scopes)
        return names

    async def _enter_nested(self, holds: list[Permit]) -> None:
        """Acquire only the scopes that ``holds`` (permits of this task) lack."""
        limiter = self._limiter
        costs = limiter._resolve(self._request, self._scopes)
        if type(costs) is not dict:
            costs = _scopes.as_scope_costs(await costs)
        added = self._share(holds, costs)
        if added:
            limiter._check_stall(added)
            # The enclosing permit holds a slot of the global cap: take none.
            self._lease = await limiter._backend.acquire(
                added, priority=self._priority, timeout=self._timeout, gated=False
            )

    def _share(self, holds: list[Permit], costs: Mapping[str, float]) -> dict[str, float]:
        """Share the scopes of ``costs`` that ``holds`` hold; return the others, to acquire."""
        owner: dict[str, Permit] = {}
        for hold in holds:
            for name in hold._held_scopes():
                owner.setdefault(name, hold)
        self._shared = tuple(
            (hold, names)
            for hold in holds
            if (names := frozenset(name for name in costs if owner.get(name) is hold))
        )
        return {name: cost for name, cost in costs.items() if name not in owner}

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._unhold()
        lease = self._get_lease()
        if lease is not None:
            backend = self._limiter._backend
            if not backend.release_nowait(lease):
                await backend.release(lease)

    def __enter__(self) -> Permit:
        if self._lease is None:
            raise RuntimeError(
                "use 'async with limiter.acquire(...)'; 'with' is for acquire_nowait()"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        """Give back the concurrency this permit holds (idempotent).

        With a shared backend the release is a network round trip: leave the
        ``async with`` block instead (this raises :class:`RuntimeError`).
        """
        lease = self._get_lease()
        if lease is not None and not self._limiter._backend.release_nowait(lease):
            raise RuntimeError("with a shared backend, release by leaving 'async with'")

    def record(
        self,
        response: Any = None,
        *,
        status: int | None = None,
        headers: Any = None,
        exception: BaseException | None = None,
        latency: float | None = None,
        size: int | None = None,
        consumed: Mapping[str, float] | None = None,
        adjust_delay: bool | None = None,
        scopes: Iterable[str] | None = None,
        budgets: Mapping[str, str] | None = None,
        body: bytes | str | dict[str, Any] | list[Any] | None = None,
    ) -> Feedback:
        """Report how the request went, so the scope's controllers can react.

        :param response: anything with ``.status``/``.status_code`` and ``.headers``
            (httpx, aiohttp, Scrapy responses); explicit arguments win over it.
        :param status: the HTTP status code.
        :param headers: the response headers (rate-limit headers are read from them).
        :param exception: the exception that ended the request (timeouts trigger backoff).
        :param latency: seconds from send to response headers; defaults to the
            time since the grant.
        :param size: the response body size in bytes, if known.
        :param consumed: the actual cost per scope, when it differs from the
            declared cost; the quota window is corrected by the difference.
        :param adjust_delay: ``False`` keeps latency controllers from learning
            from this response; by default it is ``False`` when the request's
            meta has ``autothrottle_dont_adjust_delay``.
        :param scopes: give the feedback to these of the permit's scopes only
            (e.g. an upstream status that concerns the target site's scope,
            not the scraping API's); default: all of them. ``consumed``
            applies regardless.
        :param budgets: which of the permit's scopes tracks which budget the
            server reports, ``{budget: scope}`` (e.g. ``{"tokens":
            "openai-tokens"}``): that scope learns only its budget, counted in
            requests of its cost, and the other scopes learn the rest (see
            :meth:`throttlekit.headers.RateLimitInfo.for_scopes`). In memory
            only: the Redis backend keeps the last record of a permit, which
            is the one for the scopes that track no named budget.
        :param body: the body of a 429 or 503 response, when it is small
            (:func:`throttlekit.headers.wants_body`): a wait it states
            (Gemini's ``RetryInfo``) counts as a ``Retry-After``. Ignored
            for other statuses; not kept.
        :returns: the :class:`Feedback` that was recorded.
        """
        lease = self._get_lease()
        if lease is None and self._shared is None:
            raise RuntimeError("record() needs an acquired permit")
        if response is not None:
            if status is None:
                status = _status_of(response)
            if headers is None:
                headers = getattr(response, "headers", None)
        _check_feedback(status, exception, latency, size)
        if adjust_delay is None:
            meta = getattr(self._request, "meta", None) or getattr(
                self._request, "extensions", None
            )
            adjust_delay = not (
                isinstance(meta, Mapping) and meta.get("autothrottle_dont_adjust_delay")
            )
        if consumed:
            consumed = _scopes.as_scope_costs(consumed)
        limiter = self._limiter
        own = {} if lease is None else lease.scopes
        shared = self._shared or ()
        if scopes is not None:
            scopes = _only(scopes, {**own, **{name: 0.0 for _, names in shared for name in names}})
        feedback = limiter._make_feedback(
            self.granted_at,
            status=status,
            headers=headers,
            exception=exception,
            latency=latency,
            size=size,
            adjust_delay=adjust_delay,
            scopes=scopes,
            body=body,
        )
        if lease is not None:
            own_scopes = None if scopes is None else scopes & own.keys()
            self._record_on(lease, own, own_scopes, feedback, consumed, budgets)
        for hold, names in shared:
            # The response also concerns the scopes the enclosing permit holds for us.
            outer = hold._get_lease()
            if outer is not None and hold._task is not None:
                names = names if scopes is None else names & scopes
                costs = {name: outer.scopes[name] for name in names if name in outer.scopes}
                self._record_on(outer, costs, frozenset(costs), feedback, None, budgets)
        self.recorded = True
        return feedback

    def _record_on(
        self,
        lease: Any,
        costs: Mapping[str, float],
        scopes: frozenset[str] | None,
        feedback: Feedback,
        consumed: Mapping[str, float] | None,
        budgets: Mapping[str, str] | None,
    ) -> None:
        """Give ``feedback`` to ``scopes`` (``None``: all) of ``lease``, each its budget."""
        backend = self._limiter._backend
        if scopes is not None:
            feedback = attrs.evolve(feedback, scopes=scopes)
        info = feedback.rate_limit
        if not budgets or info is None:
            backend.record(lease, feedback, consumed)
            return
        # Each scope learns the budget it tracks: one record per distinct view,
        # the view of the scopes tracking no named budget last, with ``consumed``.
        rest = info.excluding(budgets.keys())
        groups: dict[Any, set[str]] = {rest: set()}
        for scope, view in info.for_scopes(costs, budgets).items():
            if scopes is None or scope in scopes:
                groups.setdefault(view, set()).add(scope)
        parts = [*list(groups.items())[1:], (rest, groups[rest])]
        for index, (view, group) in enumerate(parts):
            part = attrs.evolve(feedback, rate_limit=view, scopes=frozenset(group))
            last = index == len(parts) - 1
            backend.record(lease, part, consumed if last else None)
